//! `net.ipv4.ip_local_reserved_ports` as text: the list the kernel prints
//! and takes (comma-separated ports and `A-B` ranges, e.g.
//! `8080,30000-32767`), and what the agent writes to it so the node's own
//! connections never take a local port in the NodePort range (a reply to
//! one would arrive at a NodePort). Cilium does the same
//! (`enable-auto-protect-node-port-range`): the NodePort range is added to
//! the reserved ports when it overlaps the ephemeral ports
//! (`net.ipv4.ip_local_port_range`). Pure: `crate::node::port_reservation`
//! reads and writes the files.
use std::fmt;

/// Ports `min..=max` (`min <= max`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortRange {
    pub(crate) min: u16,
    pub(crate) max: u16,
}

impl PortRange {
    /// kube-apiserver's default `--service-node-port-range`.
    pub(crate) const DEFAULT_NODE_PORTS: Self = Self { min: 30000, max: 32767 };

    /// `min..=max`, `None` if `min > max`.
    #[must_use]
    pub(crate) const fn new(min: u16, max: u16) -> Option<Self> {
        if min <= max { Some(Self { min, max }) } else { None }
    }

    /// Whether the two share a port.
    #[must_use]
    pub(crate) const fn overlaps(self, other: Self) -> bool {
        self.min <= other.max && other.min <= self.max
    }

    /// `A-B`, or `A` alone.
    fn parse(text: &str) -> Result<Self, String> {
        let port = |t: &str| t.trim().parse::<u16>().map_err(|_| format!("{t:?} is not a port (0 to 65535)"));
        let (min, max) = if let Some((a, b)) = text.split_once('-') {
            (port(a)?, port(b)?)
        } else {
            let p = port(text)?;
            (p, p)
        };
        Self::new(min, max).ok_or_else(|| format!("{text:?}: the range's first port is above its last"))
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.min == self.max { write!(f, "{}", self.min) } else { write!(f, "{}-{}", self.min, self.max) }
    }
}

/// `--node-port-range`: the NodePort range to keep out of the ephemeral
/// ports, or `none` (the sysctl is left alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodePortRange {
    /// Reserve these ports when they overlap the ephemeral ones.
    Range(PortRange),
    /// Leave `ip_local_reserved_ports` alone.
    None,
}

impl NodePortRange {
    /// `MIN-MAX` (1 to 65535) or `none`.
    ///
    /// # Errors
    ///
    /// Anything else, with the reason.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        if text == "none" {
            return Ok(Self::None);
        }
        let bad = || format!("{text:?}: expected MIN-MAX (e.g. 30000-32767) or none");
        let (a, b) = text.split_once('-').ok_or_else(bad)?;
        let (min, max) = (a.parse::<u16>().map_err(|_| bad())?, b.parse::<u16>().map_err(|_| bad())?);
        if min == 0 {
            return Err(format!("{text:?}: port 0 is no NodePort"));
        }
        PortRange::new(min, max).map(Self::Range).ok_or_else(|| format!("{text:?}: MIN is above MAX"))
    }

    /// The range, unless `none`.
    #[must_use]
    pub(crate) const fn range(self) -> Option<PortRange> {
        match self {
            Self::Range(range) => Some(range),
            Self::None => None,
        }
    }
}

impl fmt::Display for NodePortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Range(r) => write!(f, "{}-{}", r.min, r.max),
            Self::None => f.write_str("none"),
        }
    }
}

/// A set of ports, as `ip_local_reserved_ports` holds it: sorted ranges
/// that neither overlap nor touch (the kernel's bitmap, printed the way
/// the kernel prints it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ports(Vec<PortRange>);

impl Ports {
    /// The sysctl's text: comma-separated ports and `A-B` ranges, in any
    /// order, overlapping or not; blank is none.
    ///
    /// # Errors
    ///
    /// An item that is not a port or a range, with the reason.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.is_empty() {
            return Ok(Self::default());
        }
        let ranges = text.split(',').map(PortRange::parse).collect::<Result<Vec<_>, _>>()?;
        Ok(Self::from_ranges(ranges))
    }

    /// The set of these ranges.
    #[must_use]
    pub(crate) fn from_ranges(mut ranges: Vec<PortRange>) -> Self {
        ranges.sort_unstable();
        let mut merged: Vec<PortRange> = Vec::with_capacity(ranges.len());
        for r in ranges {
            match merged.last_mut() {
                Some(last) if u32::from(r.min) <= u32::from(last.max) + 1 => last.max = last.max.max(r.max),
                _ => merged.push(r),
            }
        }
        Self(merged)
    }

    /// The ranges, sorted, apart.
    #[must_use]
    pub(crate) fn ranges(&self) -> &[PortRange] {
        &self.0
    }

    /// Whether there is no port.
    #[cfg(test)]
    #[must_use]
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether every port of `range` is in the set.
    #[must_use]
    pub(crate) fn covers(&self, range: PortRange) -> bool {
        self.0.iter().any(|r| r.min <= range.min && range.max <= r.max)
    }

    /// Whether `port` is in the set.
    #[cfg(test)]
    #[must_use]
    pub(crate) fn contains(&self, port: u16) -> bool {
        self.covers(PortRange { min: port, max: port })
    }

    /// The ports of either.
    #[must_use]
    pub(crate) fn union(&self, other: &Self) -> Self {
        Self::from_ranges(self.0.iter().chain(&other.0).copied().collect())
    }

    /// The ports of `self` not in `other`.
    #[must_use]
    pub(crate) fn minus(&self, other: &Self) -> Self {
        let mut out = Vec::new();
        for &r in &self.0 {
            let mut next = Some(r.min);
            for o in other.0.iter().filter(|o| o.overlaps(r)) {
                let Some(from) = next else { break };
                if o.min > from {
                    out.push(PortRange { min: from, max: o.min - 1 });
                }
                next = o.max.checked_add(1);
            }
            if let Some(from) = next.filter(|&from| from <= r.max) {
                out.push(PortRange { min: from, max: r.max });
            }
        }
        Self(out)
    }
}

impl From<PortRange> for Ports {
    fn from(range: PortRange) -> Self {
        Self(vec![range])
    }
}

impl fmt::Display for Ports {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

/// `net.ipv4.ip_local_port_range`'s text (`32768\t60999`): the ephemeral
/// ports.
///
/// # Errors
///
/// Text that is not two ports, the first not above the second.
pub(crate) fn parse_ephemeral(text: &str) -> Result<PortRange, String> {
    let mut fields = text.split_whitespace().map(str::parse::<u16>);
    match (fields.next(), fields.next(), fields.next()) {
        (Some(Ok(min)), Some(Ok(max)), None) => PortRange::new(min, max),
        _ => None,
    }
    .ok_or_else(|| format!("{:?} is not two ports MIN MAX", text.trim()))
}

/// What reserving `node_ports` does to `reserved` when the ephemeral
/// ports are `ephemeral`: `None` when nothing is to be written (the ranges
/// do not overlap, or every NodePort is reserved already), else the new
/// value: the old ports and the NodePort range.
#[must_use]
pub(crate) fn reserve(node_ports: PortRange, ephemeral: PortRange, reserved: &Ports) -> Option<Ports> {
    (node_ports.overlaps(ephemeral) && !reserved.covers(node_ports)).then(|| reserved.union(&node_ports.into()))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn ports(text: &str) -> Ports {
        Ports::parse(text).unwrap()
    }

    const fn range(min: u16, max: u16) -> PortRange {
        PortRange { min, max }
    }

    #[test]
    fn the_kernel_s_list_parses_and_prints_as_the_kernel_does() {
        for (text, printed) in [
            ("", ""),
            ("\n", ""),
            ("8080", "8080"),
            ("8080\n", "8080"),
            ("30000-32767", "30000-32767"),
            ("8080,30000-32767", "8080,30000-32767"),
            ("30000-32767,8080", "8080,30000-32767"),
            ("1-3,2-5", "1-5"),
            ("1-3,4", "1-4"),
            ("5,5", "5"),
            ("0-65535", "0-65535"),
            (" 7 , 9-9 ", "7,9"),
        ] {
            assert_eq!(ports(text).to_string(), printed, "{text:?}");
        }
        for bad in ["x", "1-", "-1", "5-3", "65536", "1,,2", "1;2"] {
            assert!(Ports::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn node_port_ranges_are_min_max_or_none() {
        assert_eq!(NodePortRange::parse("30000-32767"), Ok(NodePortRange::Range(range(30000, 32767))));
        assert_eq!(NodePortRange::parse("none"), Ok(NodePortRange::None));
        assert_eq!(NodePortRange::parse("100-100").map(|r| r.to_string()).as_deref(), Ok("100-100"));
        for bad in ["", "30000", "0-10", "5-3", "1-65536", "a-b", "30000+2767"] {
            assert!(NodePortRange::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_ephemeral_range_is_two_ports() {
        assert_eq!(parse_ephemeral("32768\t60999\n"), Ok(range(32768, 60999)));
        assert_eq!(parse_ephemeral("1024 65535"), Ok(range(1024, 65535)));
        for bad in ["", "1", "1 2 3", "9 3", "a b"] {
            assert!(parse_ephemeral(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_range_is_added_only_when_it_overlaps_and_is_not_reserved() {
        let node_ports = PortRange::DEFAULT_NODE_PORTS;
        for (ephemeral, reserved, want) in [
            // The kernel's default: 32768-60999, above the NodePorts.
            (range(32768, 60999), "", None),
            (range(1024, 29999), "8080", None),
            (range(1024, 65535), "", Some("30000-32767")),
            (range(32767, 60999), "8080", Some("8080,30000-32767")),
            (range(1024, 65535), "30000-32767", None),
            (range(1024, 65535), "29000-40000", None),
            (range(1024, 65535), "31000-31010", Some("30000-32767")),
            (range(1024, 65535), "8080,32767-33000", Some("8080,30000-33000")),
        ] {
            let new = reserve(node_ports, ephemeral, &ports(reserved)).map(|p| p.to_string());
            assert_eq!(new.as_deref(), want, "{ephemeral} over {reserved:?}");
        }
    }

    #[test]
    fn minus_keeps_what_the_other_lacks() {
        for (a, b, want) in [
            ("", "1", ""),
            ("1-10", "", "1-10"),
            ("1-10", "3-4", "1-2,5-10"),
            ("1-10", "1-10", ""),
            ("1-10", "0-65535", ""),
            ("1-10,20-30", "5-25", "1-4,26-30"),
            ("0-65535", "65535", "0-65534"),
            ("0-65535", "0", "1-65535"),
            ("8080,30000-32767", "30000-32767", "8080"),
        ] {
            assert_eq!(ports(a).minus(&ports(b)).to_string(), want, "{a:?} minus {b:?}");
        }
    }

    fn any_ports() -> impl Strategy<Value = Ports> {
        prop::collection::vec((any::<u16>(), 0u16..2000), 0..8).prop_map(|v| {
            Ports::from_ranges(v.into_iter().map(|(min, len)| range(min, min.saturating_add(len))).collect())
        })
    }

    fn any_range() -> impl Strategy<Value = PortRange> {
        (any::<u16>(), any::<u16>()).prop_map(|(a, b)| range(a.min(b), a.max(b)))
    }

    /// A sample of the ports that matter to `sets`: each range's edges and
    /// their neighbours.
    fn edges(sets: &[&Ports]) -> Vec<u16> {
        sets.iter()
            .flat_map(|s| s.ranges())
            .flat_map(|r| [r.min.saturating_sub(1), r.min, r.max, r.max.saturating_add(1)])
            .collect()
    }

    proptest! {
        #[test]
        fn parse_of_format_is_the_same_set(p in any_ports()) {
            prop_assert_eq!(Ports::parse(&p.to_string()), Ok(p));
        }

        #[test]
        fn the_new_value_covers_the_range_and_keeps_every_old_port(
            reserved in any_ports(), node_ports in any_range(), ephemeral in any_range(),
        ) {
            match reserve(node_ports, ephemeral, &reserved) {
                Some(new) => {
                    prop_assert!(node_ports.overlaps(ephemeral));
                    prop_assert!(new.covers(node_ports));
                    prop_assert!(new.minus(&reserved).minus(&node_ports.into()).is_empty(), "nothing else");
                    prop_assert!(reserved.minus(&new).is_empty(), "every old port kept");
                    // Removing what was added gives the old value back.
                    prop_assert_eq!(new.minus(&new.minus(&reserved)), reserved);
                }
                None => prop_assert!(!node_ports.overlaps(ephemeral) || reserved.covers(node_ports)),
            }
        }

        #[test]
        fn minus_and_union_agree_port_by_port(a in any_ports(), b in any_ports()) {
            let (diff, both) = (a.minus(&b), a.union(&b));
            for port in edges(&[&a, &b]) {
                prop_assert_eq!(diff.contains(port), a.contains(port) && !b.contains(port), "{}", port);
                prop_assert_eq!(both.contains(port), a.contains(port) || b.contains(port), "{}", port);
            }
            prop_assert_eq!(Ports::from_ranges(diff.ranges().to_vec()), diff);
        }
    }
}
