//! The ids of one set of maps in another. A move to maps of other sizes
//! (`crate::agent::resize`) writes the table anew, so every frontend and
//! backend gets the id the new set hands out; the flows in `CT` (from
//! outside, and the pods' per-packet flows) name the old ones. Carried
//! over with their ids changed, the flows keep their backends and NAT: a
//! DSR flow's reply entry on the backend's node, above all, is made only
//! by the SYN, so without it every later reply would leave untranslated.
use std::collections::HashMap;

use proxy_common::{CtValue, RevNatId, ct_flags};

use super::Reconciler;

/// The frontend ids of the old set by their ids in the new one, and both
/// sets' backends.
pub(crate) struct IdRemap<'a> {
    old: &'a Reconciler,
    new: &'a Reconciler,
    frontends: HashMap<RevNatId, RevNatId>,
}

impl<'a> IdRemap<'a> {
    /// From the reconciler of the old set to that of the new one, once
    /// the new one wrote the table.
    #[must_use]
    pub(crate) fn new(old: &'a Reconciler, new: &'a Reconciler) -> Self {
        let frontends = old.frontend_ids().filter_map(|(id, key, _)| Some((id, new.frontend_id(&key)?))).collect();
        Self { old, new, frontends }
    }

    /// The new id of old frontend `id`.
    #[must_use]
    pub(crate) fn frontend(&self, id: RevNatId) -> Option<RevNatId> {
        self.frontends.get(&id).copied()
    }

    /// The new id of old backend `id` (the same address, port and
    /// protocol).
    #[must_use]
    pub(crate) fn backend(&self, id: u32) -> Option<u32> {
        self.new.backends.id(&self.old.backends.addr(id)?)
    }

    /// A flow's `CT` value with the new set's ids; `None` when its
    /// frontend or backend is in the old set only (the flow would be
    /// forgotten there too: `SessionMaps::purge`). Flows left to netfilter
    /// (`ct_flags::KERNEL`) and id 0 (none) name nothing and stay as they
    /// are.
    #[must_use]
    pub(crate) fn flow(&self, mut value: CtValue) -> Option<CtValue> {
        if value.flags & ct_flags::KERNEL != 0 {
            return Some(value);
        }
        if value.rev_nat != 0 {
            value.rev_nat = self.frontend(value.rev_nat)?;
        }
        if value.backend_id != 0 {
            value.backend_id = self.backend(value.backend_id)?;
        }
        Some(value)
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use proxy_common::{CtValue, ct_flags};

    use super::IdRemap;
    use crate::{
        model::{Backend, BackendState, Frontend, FrontendKey, FrontendKind, Protocol, ServicePort, ServiceTable},
        reconcile::{BackendAddr, Reconciler, fake_maps::FakeMaps},
    };

    fn frontend(last: u8, backends: &[u8]) -> (FrontendKey, Frontend) {
        let backends = backends
            .iter()
            .map(|b| Backend {
                addr: Ipv4Addr::new(10, 244, 0, *b).into(),
                port: 8080,
                state: BackendState::Active,
                local: false,
            })
            .collect();
        let port = ServicePort::new("ns", format!("s{last}"), "http");
        (
            FrontendKey::new(Ipv4Addr::new(10, 96, 0, last).into(), 80, Protocol::Tcp),
            Frontend::new(port, FrontendKind::NodePort, backends),
        )
    }

    fn applied(table: &ServiceTable) -> Reconciler {
        let mut r = Reconciler::new();
        let report = r.apply(&mut FakeMaps::default(), table);
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        r
    }

    fn backend_id(r: &Reconciler, last: u8) -> u32 {
        let addr = BackendAddr { addr: Ipv4Addr::new(10, 244, 0, last).into(), port: 8080, protocol: Protocol::Tcp };
        r.backends.id(&addr).unwrap()
    }

    /// The same frontends and backends under other ids (the new set was
    /// filled in another order, with a service the old one lacks) are
    /// found by key and address; what only the old set has is not.
    #[test]
    fn flows_keep_their_frontend_and_backend_under_the_new_ids() {
        let old_table: ServiceTable = [frontend(1, &[1, 2]), frontend(2, &[3])].into_iter().collect();
        let old = applied(&old_table);
        let new_table: ServiceTable = [frontend(0, &[0, 8]), frontend(1, &[2, 1])].into_iter().collect();
        let new = applied(&new_table);
        let remap = IdRemap::new(&old, &new);
        let key = |last| FrontendKey::new(Ipv4Addr::new(10, 96, 0, last).into(), 80, Protocol::Tcp);
        let (old_fe, new_fe) = (old.frontend_id(&key(1)).unwrap(), new.frontend_id(&key(1)).unwrap());
        assert_ne!(old_fe, new_fe, "the test must give other ids");
        assert_ne!(backend_id(&old, 1), backend_id(&new, 1), "the test must give other ids");
        assert_eq!(remap.frontend(old_fe), Some(new_fe));
        for b in [1, 2] {
            assert_eq!(remap.backend(backend_id(&old, b)), Some(backend_id(&new, b)));
        }
        let flow =
            CtValue { rev_nat: old_fe, backend_id: backend_id(&old, 2), flags: ct_flags::SNAT, ..CtValue::default() };
        assert_eq!(remap.flow(flow), Some(CtValue { rev_nat: new_fe, backend_id: backend_id(&new, 2), ..flow }));
        // Service 2 and backend 3 are gone in the new set.
        let gone = CtValue { rev_nat: old.frontend_id(&key(2)).unwrap(), backend_id: backend_id(&old, 3), ..flow };
        assert_eq!(remap.flow(gone), None);
        assert_eq!(remap.flow(CtValue { backend_id: backend_id(&old, 3), ..flow }), None, "a backend gone");
        // netfilter's flows name no id of ours.
        let kernel = CtValue { rev_nat: 77, flags: ct_flags::KERNEL, ..CtValue::default() };
        assert_eq!(remap.flow(kernel), Some(kernel));
    }
}
