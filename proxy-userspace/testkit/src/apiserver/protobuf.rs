//! The test server's protobuf encoding, as kube-apiserver answers a client
//! that asks for `application/vnd.kubernetes.protobuf`: Services,
//! EndpointSlices and Statuses written from the JSON the server holds, by
//! the field numbers of k8s.io/api's `generated.proto` (written out here
//! apart from the agent's decoder, so that each is checked against the real
//! captures on its own: tests/apiserver_protocol.rs). Every field the JSON
//! holds is written (managedFields, targetRefs and all), so a protobuf list
//! is as large as a real server's; a JSON field not listed here is left
//! out.
//!
//! A body is `k8s\0` and a `runtime.Unknown` (typeMeta, raw); a watch
//! stream is frames of a 4-byte big-endian length and a `WatchEvent`.
use serde_json::Value;

use super::Kind;

/// The media type, as `Content-Type`.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";
/// A watch stream's `Content-Type`.
pub const WATCH_MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf;stream=watch";

const MAGIC: &[u8; 4] = b"k8s\0";

/// How a JSON value is written.
#[derive(Clone, Copy)]
enum Ty {
    Str,
    Int,
    Bool,
    Msg(&'static [Field]),
    /// `map<string, string>`: entries of key (1) and value (2).
    Map,
    /// `meta.v1.Time`: seconds (1) from an RFC 3339 string.
    Time,
    /// `FieldsV1`: the JSON itself as bytes (1).
    FieldsV1,
    /// `IntOrString`: type (1), intVal (2) or strVal (3).
    IntOrString,
}

/// A JSON key, its field number, its type (an array: the field repeated).
type Field = (&'static str, u32, Ty);

const OWNER_REFERENCE: &[Field] = &[
    ("kind", 1, Ty::Str),
    ("name", 3, Ty::Str),
    ("uid", 4, Ty::Str),
    ("apiVersion", 5, Ty::Str),
    ("controller", 6, Ty::Bool),
    ("blockOwnerDeletion", 7, Ty::Bool),
];

const MANAGED_FIELDS_ENTRY: &[Field] = &[
    ("manager", 1, Ty::Str),
    ("operation", 2, Ty::Str),
    ("apiVersion", 3, Ty::Str),
    ("time", 4, Ty::Time),
    ("fieldsType", 6, Ty::Str),
    ("fieldsV1", 7, Ty::FieldsV1),
    ("subresource", 8, Ty::Str),
];

const OBJECT_META: &[Field] = &[
    ("name", 1, Ty::Str),
    ("generateName", 2, Ty::Str),
    ("namespace", 3, Ty::Str),
    ("selfLink", 4, Ty::Str),
    ("uid", 5, Ty::Str),
    ("resourceVersion", 6, Ty::Str),
    ("generation", 7, Ty::Int),
    ("creationTimestamp", 8, Ty::Time),
    ("deletionTimestamp", 9, Ty::Time),
    ("deletionGracePeriodSeconds", 10, Ty::Int),
    ("labels", 11, Ty::Map),
    ("annotations", 12, Ty::Map),
    ("ownerReferences", 13, Ty::Msg(OWNER_REFERENCE)),
    ("finalizers", 14, Ty::Str),
    ("managedFields", 17, Ty::Msg(MANAGED_FIELDS_ENTRY)),
];

const SERVICE_PORT: &[Field] = &[
    ("name", 1, Ty::Str),
    ("protocol", 2, Ty::Str),
    ("port", 3, Ty::Int),
    ("targetPort", 4, Ty::IntOrString),
    ("nodePort", 5, Ty::Int),
    ("appProtocol", 6, Ty::Str),
];

const CLIENT_IP_CONFIG: &[Field] = &[("timeoutSeconds", 1, Ty::Int)];
const SESSION_AFFINITY_CONFIG: &[Field] = &[("clientIP", 1, Ty::Msg(CLIENT_IP_CONFIG))];

const SERVICE_SPEC: &[Field] = &[
    ("ports", 1, Ty::Msg(SERVICE_PORT)),
    ("selector", 2, Ty::Map),
    ("clusterIP", 3, Ty::Str),
    ("type", 4, Ty::Str),
    ("externalIPs", 5, Ty::Str),
    ("sessionAffinity", 7, Ty::Str),
    ("loadBalancerIP", 8, Ty::Str),
    ("loadBalancerSourceRanges", 9, Ty::Str),
    ("externalName", 10, Ty::Str),
    ("externalTrafficPolicy", 11, Ty::Str),
    ("healthCheckNodePort", 12, Ty::Int),
    ("publishNotReadyAddresses", 13, Ty::Bool),
    ("sessionAffinityConfig", 14, Ty::Msg(SESSION_AFFINITY_CONFIG)),
    ("ipFamilyPolicy", 17, Ty::Str),
    ("clusterIPs", 18, Ty::Str),
    ("ipFamilies", 19, Ty::Str),
    ("allocateLoadBalancerNodePorts", 20, Ty::Bool),
    ("loadBalancerClass", 21, Ty::Str),
    ("internalTrafficPolicy", 22, Ty::Str),
    ("trafficDistribution", 23, Ty::Str),
];

const LOAD_BALANCER_INGRESS: &[Field] = &[("ip", 1, Ty::Str), ("hostname", 2, Ty::Str), ("ipMode", 3, Ty::Str)];
const LOAD_BALANCER_STATUS: &[Field] = &[("ingress", 1, Ty::Msg(LOAD_BALANCER_INGRESS))];
const SERVICE_STATUS: &[Field] = &[("loadBalancer", 1, Ty::Msg(LOAD_BALANCER_STATUS))];

const SERVICE: &[Field] = &[
    ("metadata", 1, Ty::Msg(OBJECT_META)),
    ("spec", 2, Ty::Msg(SERVICE_SPEC)),
    ("status", 3, Ty::Msg(SERVICE_STATUS)),
];

const ENDPOINT_CONDITIONS: &[Field] = &[("ready", 1, Ty::Bool), ("serving", 2, Ty::Bool), ("terminating", 3, Ty::Bool)];
const OBJECT_REFERENCE: &[Field] = &[
    ("kind", 1, Ty::Str),
    ("namespace", 2, Ty::Str),
    ("name", 3, Ty::Str),
    ("uid", 4, Ty::Str),
    ("apiVersion", 5, Ty::Str),
    ("resourceVersion", 6, Ty::Str),
    ("fieldPath", 7, Ty::Str),
];
const NAMED: &[Field] = &[("name", 1, Ty::Str)];
const ENDPOINT_HINTS: &[Field] = &[("forZones", 1, Ty::Msg(NAMED)), ("forNodes", 2, Ty::Msg(NAMED))];
const ENDPOINT: &[Field] = &[
    ("addresses", 1, Ty::Str),
    ("conditions", 2, Ty::Msg(ENDPOINT_CONDITIONS)),
    ("hostname", 3, Ty::Str),
    ("targetRef", 4, Ty::Msg(OBJECT_REFERENCE)),
    ("deprecatedTopology", 5, Ty::Map),
    ("nodeName", 6, Ty::Str),
    ("zone", 7, Ty::Str),
    ("hints", 8, Ty::Msg(ENDPOINT_HINTS)),
];
const ENDPOINT_PORT: &[Field] =
    &[("name", 1, Ty::Str), ("protocol", 2, Ty::Str), ("port", 3, Ty::Int), ("appProtocol", 4, Ty::Str)];

const ENDPOINT_SLICE: &[Field] = &[
    ("metadata", 1, Ty::Msg(OBJECT_META)),
    ("endpoints", 2, Ty::Msg(ENDPOINT)),
    ("ports", 3, Ty::Msg(ENDPOINT_PORT)),
    ("addressType", 4, Ty::Str),
];

const LIST_META: &[Field] =
    &[("resourceVersion", 2, Ty::Str), ("continue", 3, Ty::Str), ("remainingItemCount", 4, Ty::Int)];

const STATUS: &[Field] = &[
    ("metadata", 1, Ty::Msg(LIST_META)),
    ("status", 2, Ty::Str),
    ("message", 3, Ty::Str),
    ("reason", 4, Ty::Str),
    ("code", 6, Ty::Int),
];

/// Whether the test server encodes `kind` in protobuf (the others are
/// answered in JSON, which every client accepts besides).
#[must_use]
pub fn speaks(kind: Kind) -> bool {
    matches!(kind, Kind::Service | Kind::EndpointSlice)
}

fn schema(kind: Kind) -> &'static [Field] {
    match kind {
        Kind::Service => SERVICE,
        Kind::EndpointSlice => ENDPOINT_SLICE,
        _ => &[],
    }
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push(u8::try_from(v & 0x7f).unwrap_or_default() | 0x80);
        v >>= 7;
    }
    out.push(u8::try_from(v).unwrap_or_default());
}

fn key(tag: u32, wire: u8, out: &mut Vec<u8>) {
    varint((u64::from(tag) << 3) | u64::from(wire), out);
}

fn len_delimited(tag: u32, bytes: &[u8], out: &mut Vec<u8>) {
    key(tag, 2, out);
    varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

fn int(tag: u32, v: i64, out: &mut Vec<u8>) {
    key(tag, 0, out);
    #[expect(clippy::cast_sign_loss, reason = "protobuf writes a negative int as its two's complement")]
    varint(v as u64, out);
}

/// `value` as the message `fields` describe.
fn message(fields: &[Field], value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    for &(name, tag, ty) in fields {
        match value.get(name) {
            None | Some(Value::Null) => {}
            Some(Value::Array(items)) => items.iter().for_each(|item| one(tag, ty, item, &mut out)),
            Some(v) => one(tag, ty, v, &mut out),
        }
    }
    out
}

fn one(tag: u32, ty: Ty, v: &Value, out: &mut Vec<u8>) {
    match ty {
        Ty::Str => len_delimited(tag, v.as_str().unwrap_or_default().as_bytes(), out),
        Ty::Int => int(tag, v.as_i64().unwrap_or_default(), out),
        Ty::Bool => int(tag, i64::from(v.as_bool().unwrap_or_default()), out),
        Ty::Msg(fields) => len_delimited(tag, &message(fields, v), out),
        Ty::Map => {
            for (k, val) in v.as_object().into_iter().flatten() {
                let mut entry = Vec::new();
                len_delimited(1, k.as_bytes(), &mut entry);
                len_delimited(2, val.as_str().unwrap_or_default().as_bytes(), &mut entry);
                len_delimited(tag, &entry, out);
            }
        }
        Ty::Time => {
            let mut time = Vec::new();
            int(1, v.as_str().map_or(0, unix_seconds), &mut time);
            len_delimited(tag, &time, out);
        }
        Ty::FieldsV1 => {
            let mut raw = Vec::new();
            len_delimited(1, v.to_string().as_bytes(), &mut raw);
            len_delimited(tag, &raw, out);
        }
        Ty::IntOrString => {
            let mut ios = Vec::new();
            if let Some(n) = v.as_i64() {
                int(1, 0, &mut ios);
                int(2, n, &mut ios);
            } else {
                int(1, 1, &mut ios);
                len_delimited(3, v.as_str().unwrap_or_default().as_bytes(), &mut ios);
            }
            len_delimited(tag, &ios, out);
        }
    }
}

/// Seconds since the epoch of `YYYY-MM-DDTHH:MM:SSZ` (0 if it is not).
fn unix_seconds(text: &str) -> i64 {
    let num = |range: std::ops::Range<usize>| text.get(range).and_then(|s| s.parse::<i64>().ok());
    let parts = (num(0..4), num(5..7), num(8..10), num(11..13), num(14..16), num(17..19));
    let (Some(y), Some(m), Some(d), Some(hh), Some(mm), Some(ss)) = parts else { return 0 };
    // Days from the civil date (H. Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    days * 86_400 + hh * 3600 + mm * 60 + ss
}

/// A list item: the object without kind and apiVersion.
#[must_use]
pub fn item(kind: Kind, object: &Value) -> Vec<u8> {
    message(schema(kind), object)
}

/// A body: `k8s\0`, then `runtime.Unknown` with the type and `raw`.
fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
    let mut type_meta = Vec::new();
    len_delimited(1, api_version.as_bytes(), &mut type_meta);
    len_delimited(2, kind.as_bytes(), &mut type_meta);
    let mut out = MAGIC.to_vec();
    len_delimited(1, &type_meta, &mut out);
    len_delimited(2, raw, &mut out);
    len_delimited(3, b"", &mut out);
    len_delimited(4, b"", &mut out);
    out
}

/// What goes before and after a list's items (each written as
/// [`list_item`] writes it) when `lens` are their lengths, under
/// `metadata` (a JSON ListMeta): together the `Unknown` envelope around
/// the `*List` message, so a list can be sent as it is written, as
/// kube-apiserver streams a large one, without the whole body in memory.
#[must_use]
pub fn list_frame(kind: Kind, metadata: &Value, lens: impl Iterator<Item = usize>) -> (Vec<u8>, Vec<u8>) {
    let mut meta = Vec::new();
    len_delimited(1, &message(LIST_META, metadata), &mut meta);
    let raw_len = meta.len() + lens.map(|n| 1 + varint_len(n as u64) + n).sum::<usize>();
    let mut type_meta = Vec::new();
    len_delimited(1, kind.api_version().as_bytes(), &mut type_meta);
    len_delimited(2, format!("{}List", kind.name()).as_bytes(), &mut type_meta);
    let mut head = MAGIC.to_vec();
    len_delimited(1, &type_meta, &mut head);
    key(2, 2, &mut head);
    varint(raw_len as u64, &mut head);
    head.extend_from_slice(&meta);
    let mut tail = Vec::new();
    len_delimited(3, b"", &mut tail);
    len_delimited(4, b"", &mut tail);
    (head, tail)
}

/// One item of a list body (as `item` made it), appended to `out`.
pub fn list_item(item: &[u8], out: &mut Vec<u8>) {
    len_delimited(2, item, out);
}

fn varint_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

/// An object alone (a watch event's).
fn object(kind: Kind, object: &Value) -> Vec<u8> {
    envelope(kind.api_version(), kind.name(), &item(kind, object))
}

/// A Status body (an error answer), from its JSON.
#[must_use]
pub fn status(status: &Value) -> Vec<u8> {
    envelope("v1", "Status", &message(STATUS, status))
}

/// One frame of a watch stream: `change` of `object` (a Status for
/// `ERROR`).
#[must_use]
pub fn watch_frame(kind: Kind, change: &str, value: &Value) -> Vec<u8> {
    let raw = if change == "ERROR" { status(value) } else { object(kind, value) };
    let mut extension = Vec::new();
    len_delimited(1, &raw, &mut extension);
    let mut event = Vec::new();
    len_delimited(1, change.as_bytes(), &mut event);
    len_delimited(2, &extension, &mut event);
    let mut frame = u32::try_from(event.len()).unwrap_or(u32::MAX).to_be_bytes().to_vec();
    frame.extend_from_slice(&event);
    frame
}

#[cfg(test)]
mod tests {
    #[test]
    fn timestamps_are_seconds_since_the_epoch() {
        assert_eq!(super::unix_seconds("1970-01-01T00:00:00Z"), 0);
        assert_eq!(super::unix_seconds("2026-11-22T00:00:00Z"), 1_795_305_600);
        assert_eq!(super::unix_seconds("2000-03-01T01:02:03Z"), 951_872_523);
    }

    /// The frame a streamed list is sent in holds the same bytes as the
    /// list's one message: the `Unknown` envelope around a `*List` of the
    /// items, whatever their sizes (lengths of one to three varint bytes).
    #[test]
    fn a_streamed_list_is_the_list_message() {
        use super::{Kind, LIST_META, envelope, len_delimited, list_frame, list_item, message};
        let metadata = serde_json::json!({"resourceVersion": "42", "continue": "42:3"});
        let items: Vec<Vec<u8>> = [0usize, 1, 127, 128, 300, 16_383, 16_384, 70_000]
            .iter()
            .map(|&n| (0..n).map(|i| u8::try_from(i % 251).unwrap_or_default()).collect())
            .collect();
        for kind in [Kind::Service, Kind::EndpointSlice] {
            let mut raw = Vec::new();
            len_delimited(1, &message(LIST_META, &metadata), &mut raw);
            for item in &items {
                len_delimited(2, item, &mut raw);
            }
            let whole = envelope(kind.api_version(), &format!("{}List", kind.name()), &raw);
            let (mut streamed, tail) = list_frame(kind, &metadata, items.iter().map(Vec::len));
            for item in &items {
                list_item(item, &mut streamed);
            }
            streamed.extend_from_slice(&tail);
            assert_eq!(streamed, whole, "{kind:?}");
        }
    }
}
