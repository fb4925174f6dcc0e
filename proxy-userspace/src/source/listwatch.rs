//! Lists and watches of Services and EndpointSlices as client-go's
//! reflectors (kube-proxy's) ask for them, in protobuf when the API server
//! speaks it (`super::protobuf`), else JSON (`super::lean`):
//!
//! - the first list asks for `resourceVersion=0`: kube-apiserver serves it
//!   from its watch cache, in one response (it ignores `limit` there), not
//!   as a quorum read from etcd page by page. The response is decoded as it
//!   arrives, on a thread of its own, so a list of any size holds one item's
//!   bytes and a few decoded objects beside the store;
//! - a relist after the watch position expired (410 Gone) asks for the
//!   watch cache too, at no older than the last resourceVersion seen
//!   (`resourceVersionMatch=NotOlderThan`), so a relist from a lagging API
//!   server never goes back in time; only if that fails (410, or "too large
//!   resource version") does it fall back to a quorum list from etcd, in
//!   pages of `QUORUM_PAGE_SIZE`, as client-go does;
//! - the watch resumes from the last resourceVersion seen (bookmarks keep
//!   it fresh), as before.
//!
//! The stream yields kube-runtime's `watcher::Event`s and `watcher::Error`s
//! as its watcher does, so the store, the retry schedule (`super::retry`)
//! and the watch tasks (`super::kube`) are the same for both. Every byte
//! of a response body is counted (`ApiBytes`).
use std::{
    io::{self, Read},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use bytes::{Buf as _, Bytes, BytesMut};
use futures::Stream;
use http_body_util::BodyExt as _;
use kube::{
    Client,
    api::{ListParams, VersionMatch, WatchParams},
    client::Body,
    runtime::watcher::{self, Event},
};
use tokio::sync::mpsc;

use super::protobuf::{self, Decode, DecodeError, Listed, Watched};

/// Objects per page of a quorum list (client-go's reflector asks for 500).
/// A list from the watch cache comes whole whatever the limit says.
pub const QUORUM_PAGE_SIZE: u32 = 500;

/// How long a watch request lasts before it is made again (kube-runtime's
/// default; the client's read timeout is longer).
const WATCH_TIMEOUT_SECONDS: u32 = 290;

/// Decoded list items held ready ahead of the store (see `super::kube`'s
/// `AHEAD`).
const ITEMS_AHEAD: usize = 100;

/// Body chunks held between the connection and the decoding thread.
const CHUNKS_AHEAD: usize = 8;

/// Which encoding the agent asks the API server for (kube-proxy's
/// `--kube-api-content-type`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ContentType {
    /// Protobuf, or JSON when the server answers with it.
    #[default]
    Protobuf,
    /// JSON.
    Json,
}

impl ContentType {
    /// The `Accept` header: client-go's, JSON as the fallback.
    const fn accept(self) -> &'static str {
        match self {
            Self::Protobuf => "application/vnd.kubernetes.protobuf, application/json",
            Self::Json => "application/json",
        }
    }
}

/// Bytes of the API server's list and watch bodies for Services and
/// EndpointSlices, by the encoding it answered in.
#[derive(Debug, Default)]
pub struct ApiBytes {
    /// Bytes of lists in protobuf.
    pub list_protobuf: AtomicU64,
    /// Bytes of lists in JSON.
    pub list_json: AtomicU64,
    /// Bytes of watches in protobuf.
    pub watch_protobuf: AtomicU64,
    pub(crate) watch_json: AtomicU64,
}

impl ApiBytes {
    fn counter(&self, list: bool, protobuf: bool) -> &AtomicU64 {
        match (list, protobuf) {
            (true, true) => &self.list_protobuf,
            (true, false) => &self.list_json,
            (false, true) => &self.watch_protobuf,
            (false, false) => &self.watch_json,
        }
    }
}

/// Where a list is read from.
#[derive(Clone, Debug, PartialEq, Eq)]
enum ListFrom {
    /// The watch cache, as it is (`resourceVersion=0`): the first list.
    Cache,
    /// The watch cache, at no older than this resourceVersion: a relist.
    NotOlderThan(String),
    /// etcd, at its latest (no resourceVersion), in pages.
    Quorum,
}

/// One list or watch of a kind of object.
pub struct ListWatch {
    client: Client,
    /// The collection's path (`/api/v1/services`).
    url: String,
    label_selector: Option<String>,
    content_type: ContentType,
    bytes: Arc<ApiBytes>,
}

enum Phase<K> {
    /// A list to start (`Init` once its first page is answered).
    List(ListFrom),
    /// A further page of it to ask for.
    Page { from: ListFrom, continue_token: Option<String>, version: Option<String> },
    /// A page coming in.
    Listing {
        from: ListFrom,
        items: mpsc::Receiver<Result<Listed<K>, DecodeError>>,
        continue_token: Option<String>,
        version: Option<String>,
    },
    /// A watch to start from a resourceVersion.
    Watch(String),
    /// A watch's events coming in.
    Watching { version: String, body: Body, buf: BytesMut, protobuf: bool },
}

impl ListWatch {
    /// A list and watch of one kind of object through `client`.
    #[must_use]
    pub fn new(
        client: Client,
        url: &str,
        label_selector: Option<String>,
        content_type: ContentType,
        bytes: Arc<ApiBytes>,
    ) -> Self {
        Self { client, url: url.to_owned(), label_selector, content_type, bytes }
    }

    /// The events of the list, the watch and every relist, as kube-runtime's
    /// watcher gives them; after an error, the next poll tries again (the
    /// caller waits between: `super::retry`).
    pub fn stream<K: Decode>(self) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send {
        futures::stream::unfold((self, Phase::List(ListFrom::Cache)), |(lw, phase)| async move {
            let (item, phase) = lw.step(phase).await;
            Some((item, (lw, phase)))
        })
    }

    /// Goes on from `phase` to the next event or error.
    async fn step<K: Decode>(&self, mut phase: Phase<K>) -> (Result<Event<K>, watcher::Error>, Phase<K>) {
        loop {
            phase = match phase {
                // `Init` only once the server answers: a list that fails
                // before is an error alone, so the retries back off
                // (`super::retry` starts afresh at every event).
                Phase::List(from) => match self.list_page(&from, None).await {
                    Ok(items) => {
                        let listing = Phase::Listing { from, items, continue_token: None, version: None };
                        return (Ok(Event::Init), listing);
                    }
                    Err(err) => return (Err(watcher::Error::InitialListFailed(err.error)), Phase::List(err.next)),
                },
                Phase::Page { from, continue_token, version } => {
                    match self.list_page(&from, continue_token.as_deref()).await {
                        Ok(items) => Phase::Listing { from, items, continue_token: None, version },
                        Err(err) => return (Err(watcher::Error::InitialListFailed(err.error)), Phase::List(err.next)),
                    }
                }
                Phase::Listing { from, mut items, continue_token, version } => match items.recv().await {
                    Some(Ok(Listed::Item(item))) => {
                        return (Ok(Event::InitApply(item)), Phase::Listing { from, items, continue_token, version });
                    }
                    Some(Ok(Listed::Meta { resource_version, continue_token })) => {
                        // Every page of a list carries the first's version.
                        let version = resource_version.filter(|v| !v.is_empty()).or(version);
                        let continue_token = continue_token.filter(|c| !c.is_empty());
                        Phase::Listing { from, items, continue_token, version }
                    }
                    Some(Err(err)) => {
                        let err = watcher::Error::InitialListFailed(decode_error(err));
                        return (Err(err), Phase::List(from));
                    }
                    None if continue_token.is_some() => Phase::Page { from, continue_token, version },
                    None => match version {
                        Some(version) => return (Ok(Event::InitDone), Phase::Watch(version)),
                        None => return (Err(watcher::Error::NoResourceVersion), Phase::List(from)),
                    },
                },
                Phase::Watch(version) => match self.watch(&version).await {
                    Ok((body, protobuf)) => Phase::Watching { version, body, buf: BytesMut::new(), protobuf },
                    Err(err) => {
                        let next = if expired(&err) {
                            Phase::List(ListFrom::NotOlderThan(version))
                        } else {
                            Phase::Watch(version)
                        };
                        return (Err(watcher::Error::WatchStartFailed(err)), next);
                    }
                },
                Phase::Watching { mut version, mut body, mut buf, protobuf } => {
                    match next_event::<K>(&mut buf, protobuf) {
                        Ok(Some(Watched::Object(kind, object))) => {
                            if let Some(v) = object.resource_version() {
                                v.clone_into(&mut version);
                            }
                            let event = match kind.as_str() {
                                "ADDED" | "MODIFIED" => Event::Apply(object),
                                "DELETED" => Event::Delete(object),
                                // BOOKMARK: only its version counts.
                                _ => {
                                    phase = Phase::Watching { version, body, buf, protobuf };
                                    continue;
                                }
                            };
                            return (Ok(event), Phase::Watching { version, body, buf, protobuf });
                        }
                        Ok(Some(Watched::Error(status))) => {
                            let next = if status.code == GONE {
                                Phase::List(ListFrom::NotOlderThan(version))
                            } else {
                                Phase::Watch(version)
                            };
                            return (Err(watcher::Error::WatchError(status)), next);
                        }
                        Err(err) => {
                            return (Err(watcher::Error::WatchFailed(decode_error(err))), Phase::Watch(version));
                        }
                        Ok(None) => match body.frame().await {
                            Some(Ok(frame)) => {
                                if let Ok(data) = frame.into_data() {
                                    self.bytes.counter(false, protobuf).fetch_add(len(&data), Ordering::Relaxed);
                                    buf.extend_from_slice(&data);
                                }
                                Phase::Watching { version, body, buf, protobuf }
                            }
                            // The watch's time is up: a new one.
                            None => Phase::Watch(version),
                            Some(Err(err)) => return (Err(watcher::Error::WatchFailed(err)), Phase::Watch(version)),
                        },
                    }
                }
            };
        }
    }

    /// Asks for one page of a list, and starts decoding it as it arrives.
    async fn list_page<K: Decode>(
        &self,
        from: &ListFrom,
        continue_token: Option<&str>,
    ) -> Result<mpsc::Receiver<Result<Listed<K>, DecodeError>>, ListFailed> {
        // A continued list (pages of a quorum read; a server may page one
        // from its cache too) names only its token.
        let mut params = ListParams {
            label_selector: self.label_selector.clone(),
            continue_token: continue_token.map(str::to_owned),
            ..ListParams::default()
        };
        // The cache is asked without a limit: kube-apiserver reads a list
        // with a limit and a resourceVersion other than 0 from etcd.
        match from {
            ListFrom::Cache => params.resource_version = Some("0".into()),
            ListFrom::NotOlderThan(version) => {
                params.resource_version = Some(version.clone());
                params.version_match = Some(VersionMatch::NotOlderThan);
            }
            ListFrom::Quorum => params.limit = Some(QUORUM_PAGE_SIZE),
        }
        let fail = |error: kube::Error| ListFailed { next: after_failure(from, &error), error };
        let request =
            kube::core::Request::new(&self.url).list(&params).map_err(|e| fail(kube::Error::BuildRequest(e)))?;
        let (body, protobuf) = self.send(request).await.map_err(fail)?;
        let chunks = self.pump(body, true, protobuf);
        let (items_tx, items) = mpsc::channel(ITEMS_AHEAD);
        tokio::task::spawn_blocking(move || {
            let body = ChunkReader { chunks, chunk: Bytes::new() };
            let each = |listed| items_tx.blocking_send(Ok(listed)).is_ok();
            let read = if protobuf { protobuf::read_list(body, each) } else { read_json_list(body, each) };
            if let Err(err) = read {
                let _ = items_tx.blocking_send(Err(err));
            }
        });
        Ok(items)
    }

    /// Starts a watch from `version`.
    async fn watch(&self, version: &str) -> Result<(Body, bool), kube::Error> {
        let params = WatchParams {
            label_selector: self.label_selector.clone(),
            bookmarks: true,
            timeout: Some(WATCH_TIMEOUT_SECONDS),
            ..WatchParams::default()
        };
        let request = kube::core::Request::new(&self.url).watch(&params, version).map_err(kube::Error::BuildRequest)?;
        self.send(request).await
    }

    /// Sends `request` asking for the configured encoding; returns the
    /// body of a success and whether it is protobuf, or the error Status
    /// the server answered with.
    async fn send(&self, request: http::Request<Vec<u8>>) -> Result<(Body, bool), kube::Error> {
        let (mut parts, body) = request.into_parts();
        parts.headers.insert(http::header::ACCEPT, http::HeaderValue::from_static(self.content_type.accept()));
        let response = self.client.send(http::Request::from_parts(parts, Body::from(body))).await?;
        let protobuf = response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with(protobuf::MEDIA_TYPE));
        let status = response.status();
        if status.is_success() {
            return Ok((response.into_body(), protobuf));
        }
        let body = response.into_body().collect().await?.to_bytes();
        let decoded = if protobuf {
            protobuf::status(&body).ok()
        } else {
            serde_json::from_slice::<kube::core::Status>(&body).ok()
        };
        let mut answer = decoded.unwrap_or_else(|| kube::core::Status {
            message: String::from_utf8_lossy(&body).into_owned(),
            ..kube::core::Status::default()
        });
        answer.code = status.as_u16();
        Err(kube::Error::Api(Box::new(answer)))
    }

    /// Reads `body` on a task of its own, counting its bytes, into chunks
    /// for a decoding thread.
    fn pump(&self, mut body: Body, list: bool, protobuf: bool) -> mpsc::Receiver<io::Result<Bytes>> {
        let (tx, rx) = mpsc::channel(CHUNKS_AHEAD);
        let bytes = self.bytes.clone();
        tokio::spawn(async move {
            while let Some(frame) = body.frame().await {
                let chunk = match frame {
                    Ok(frame) => match frame.into_data() {
                        Ok(data) => data,
                        Err(_) => continue,
                    },
                    Err(err) => {
                        let _ = tx.send(Err(io::Error::other(err))).await;
                        return;
                    }
                };
                bytes.counter(list, protobuf).fetch_add(len(&chunk), Ordering::Relaxed);
                if tx.send(Ok(chunk)).await.is_err() {
                    return;
                }
            }
        });
        rx
    }
}

/// A list request that failed, and where the next try lists from.
struct ListFailed {
    error: kube::Error,
    next: ListFrom,
}

const GONE: u16 = 410;

/// Where a list that failed with `error` is read from next. client-go: a
/// version the server cannot serve (compacted away, or ahead of this
/// server's cache) is read from etcd; other failures try the same again.
fn after_failure(from: &ListFrom, error: &kube::Error) -> ListFrom {
    if expired(error) || too_large(error) { ListFrom::Quorum } else { from.clone() }
}

fn expired(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == GONE)
}

/// kube-apiserver's answer to a list at a version its cache has not
/// reached (504, "Too large resource version").
fn too_large(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.message.contains("Too large resource version"))
}

fn len(data: &Bytes) -> u64 {
    u64::try_from(data.len()).unwrap_or(u64::MAX)
}

/// A body that could not be read or decoded. A broken connection is the
/// network's (`Failure::Unreachable`); a body that does not decode is the
/// server's answer (`Failure::Answered`).
fn decode_error(err: DecodeError) -> kube::Error {
    match err {
        DecodeError::Io(err) if err.kind() != io::ErrorKind::InvalidData => kube::Error::ReadEvents(err),
        err => kube::Error::SerdeError(serde::de::Error::custom(err)),
    }
}

/// The next whole event at the start of `buf`, taken out of it; `None`
/// until one has arrived.
fn next_event<K: Decode>(buf: &mut BytesMut, protobuf: bool) -> Result<Option<Watched<K>>, DecodeError> {
    if protobuf {
        let Some(len) = protobuf::frame_len(buf) else { return Ok(None) };
        let frame = buf.split_to(len);
        return protobuf::watch_event(&frame).map(Some);
    }
    // JSON: one event a line.
    loop {
        let Some(end) = buf.iter().position(|b| *b == b'\n') else { return Ok(None) };
        let line = buf.split_to(end + 1);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        return json_event(&line).map(Some);
    }
}

/// A JSON watch event.
fn json_event<K: Decode>(line: &[u8]) -> Result<Watched<K>, DecodeError> {
    #[derive(serde::Deserialize)]
    struct JsonEvent {
        #[serde(rename = "type")]
        kind: String,
        object: serde_json::Value,
    }
    let invalid = |e: serde_json::Error| DecodeError::Io(io::Error::new(io::ErrorKind::InvalidData, e));
    let event: JsonEvent = serde_json::from_slice(line).map_err(invalid)?;
    if event.kind == "ERROR" {
        return Ok(Watched::Error(Box::new(serde_json::from_value(event.object).map_err(invalid)?)));
    }
    Ok(Watched::Object(event.kind, serde_json::from_value(event.object).map_err(invalid)?))
}

/// A JSON list body read as it arrives: its metadata and each item handed
/// to `each` as soon as they are decoded (`protobuf::read_list`'s twin).
fn read_json_list<K: Decode>(body: impl Read, each: impl FnMut(Listed<K>) -> bool) -> Result<(), DecodeError> {
    use serde::de::{self, DeserializeSeed, Deserializer as _, IgnoredAny, MapAccess, SeqAccess, Visitor};

    /// Stopped by `each`: not an error.
    const STOPPED: &str = "the list's reader went away";

    struct List<F, K>(F, std::marker::PhantomData<K>);
    impl<'de, K: Decode, F: FnMut(Listed<K>) -> bool> Visitor<'de> for List<F, K> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a list")
        }
        fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
            #[derive(serde::Deserialize, Default)]
            #[serde(rename_all = "camelCase")]
            struct Meta {
                resource_version: Option<String>,
                #[serde(rename = "continue")]
                continue_token: Option<String>,
            }
            while let Some(key) = map.next_key::<String>()? {
                match key.as_str() {
                    "metadata" => {
                        let Meta { resource_version, continue_token } = map.next_value()?;
                        if !(self.0)(Listed::Meta { resource_version, continue_token }) {
                            return Err(de::Error::custom(STOPPED));
                        }
                    }
                    "items" => map.next_value_seed(Items(&mut self.0, std::marker::PhantomData))?,
                    _ => drop(map.next_value::<IgnoredAny>()?),
                }
            }
            Ok(())
        }
    }

    struct Items<'a, F, K>(&'a mut F, std::marker::PhantomData<K>);
    impl<'de, K: Decode, F: FnMut(Listed<K>) -> bool> DeserializeSeed<'de> for Items<'_, F, K> {
        type Value = ();
        fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_any(self)
        }
    }
    impl<'de, K: Decode, F: FnMut(Listed<K>) -> bool> Visitor<'de> for Items<'_, F, K> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a list's items")
        }
        fn visit_unit<E>(self) -> Result<(), E> {
            Ok(())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            while let Some(item) = seq.next_element::<K>()? {
                if !(self.0)(Listed::Item(item)) {
                    return Err(de::Error::custom(STOPPED));
                }
            }
            Ok(())
        }
    }

    let mut reader = serde_json::Deserializer::from_reader(io::BufReader::with_capacity(64 * 1024, body));
    match reader.deserialize_map(List(each, std::marker::PhantomData)) {
        Err(err) if err.to_string().starts_with(STOPPED) => Ok(()),
        Err(err) if err.is_io() => Err(DecodeError::Io(err.into())),
        Err(err) => Err(DecodeError::Io(io::Error::new(io::ErrorKind::InvalidData, err))),
        Ok(()) => Ok(()),
    }
}

/// The chunks of a body as `Read`, for a decoding thread (each read waits
/// for the next chunk).
struct ChunkReader {
    chunks: mpsc::Receiver<io::Result<Bytes>>,
    chunk: Bytes,
}

impl Read for ChunkReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.chunk.is_empty() {
            match self.chunks.blocking_recv() {
                Some(chunk) => self.chunk = chunk?,
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.chunk.len());
        out[..n].copy_from_slice(&self.chunk[..n]);
        self.chunk.advance(n);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::lean::{LeanService, LeanSlice};

    fn fixture(dir: &str, name: &str) -> Vec<u8> {
        let path = format!("{}/tests/fixtures/{dir}/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// A list's resourceVersion, continue token and items.
    type List<K> = (Option<String>, Option<String>, Vec<K>);

    fn json_list<K: Decode>(body: &[u8]) -> Result<List<K>, DecodeError> {
        let (mut rv, mut cont, mut items) = (None, None, Vec::new());
        read_json_list(body, |listed| {
            match listed {
                Listed::Meta { resource_version, continue_token } => (rv, cont) = (resource_version, continue_token),
                Listed::Item(item) => items.push(item),
            }
            true
        })?;
        Ok((rv, cont, items))
    }

    /// The streaming JSON reader reads the real API server's lists as
    /// serde_json reads them whole.
    #[test]
    fn json_lists_read_as_they_arrive_as_whole() {
        let body = fixture("real-apiserver", "services-list-page1.json");
        let (rv, cont, items) = json_list::<LeanService>(&body).unwrap();
        let whole: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(rv.as_deref(), whole["metadata"]["resourceVersion"].as_str());
        assert_eq!(cont.as_deref(), whole["metadata"]["continue"].as_str());
        let expected: Vec<LeanService> = serde_json::from_value(whole["items"].clone()).unwrap();
        assert_eq!(items, expected);
        let (_, _, slices) =
            json_list::<LeanSlice>(&fixture("real-apiserver-protobuf", "endpointslices-list.json")).unwrap();
        assert!(!slices.is_empty());
        // `items: null`, and a body cut short.
        assert!(json_list::<LeanSlice>(br#"{"metadata":{"resourceVersion":"5"},"items":null}"#).unwrap().2.is_empty());
        assert!(json_list::<LeanSlice>(&body[..body.len() / 2]).is_err());
    }

    /// Watch events come out whole however the stream is cut into chunks.
    #[test]
    fn watch_events_are_split_from_any_chunks() {
        for (protobuf, name) in [(true, "endpointslices-watch.pbstream"), (false, "endpointslices-watch.jsonstream")] {
            let stream = fixture("real-apiserver-protobuf", name);
            for chunk in [1, 7, 4096] {
                let mut buf = BytesMut::new();
                let mut versions = Vec::new();
                for piece in stream.chunks(chunk) {
                    buf.extend_from_slice(piece);
                    while let Some(event) = next_event::<LeanSlice>(&mut buf, protobuf).unwrap() {
                        let Watched::Object(_, slice) = event else { panic!("an object") };
                        versions.push(slice.0.metadata.resource_version.unwrap());
                    }
                }
                assert_eq!(versions.len(), 24, "{name} in chunks of {chunk}");
                assert!(buf.is_empty());
            }
        }
    }

    #[test]
    fn a_version_the_cache_cannot_serve_is_read_from_etcd() {
        let answer = |code: u16, message: &str| {
            kube::Error::Api(Box::new(kube::core::Status { code, message: message.into(), ..Default::default() }))
        };
        let relist = ListFrom::NotOlderThan("42".into());
        assert_eq!(after_failure(&relist, &answer(410, "too old resource version")), ListFrom::Quorum);
        assert_eq!(after_failure(&relist, &answer(504, "Too large resource version")), ListFrom::Quorum);
        assert_eq!(after_failure(&relist, &answer(500, "etcdserver: leader changed")), relist);
        let refused = kube::Error::ReadEvents(io::Error::from(io::ErrorKind::ConnectionRefused));
        assert_eq!(after_failure(&ListFrom::Cache, &refused), ListFrom::Cache);
        assert_eq!(after_failure(&ListFrom::Quorum, &answer(410, "continue token expired")), ListFrom::Quorum);
    }

    #[test]
    fn an_error_event_carries_its_status() {
        let line = br#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 1 (5)","reason":"Expired","code":410}}"#;
        let Watched::Error(status) = json_event::<LeanSlice>(line).unwrap() else { panic!("an error") };
        assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
    }
}
