//! `--ct-map-size` changed across a restart, or `CT` grown while the agent
//! runs (`crate::agent::resize::grow_ct`). A pinned map is reused as it
//! is (aya opens the pin and ignores the size asked for), so without this
//! a larger `CT` would only come with a new set of maps, and an operator
//! raising the size after `ConntrackNearlyFull` (`crate::observe::ct_fill`) would
//! see nothing change. Before the load, a pinned `CT` of another size is
//! moved aside (its pin renamed, in the same directory), so the load makes
//! one of the size asked for; after the load its entries are copied over
//! (the flows keep their backends and NAT) and the old one is unpinned. A
//! failed load puts the pin back. (bpffs cannot rename: a move is a second
//! pin of the map and the first one removed.)
use std::{
    os::fd::AsFd as _,
    path::{Path, PathBuf},
};

use proxy_common::{CtKey, CtValue};

use super::sys;

/// The pin a `CT` being replaced is moved to, beside its own (bpffs
/// refuses names with a dot).
const ASIDE: &str = "CT_RESIZED_FROM";

/// A pinned `CT` moved aside for one of another size.
#[derive(Debug)]
pub(crate) struct CtResize {
    /// Where it was pinned, and where it is now.
    original: PathBuf,
    aside: PathBuf,
    from: u32,
    to: u32,
}

impl CtResize {
    /// Pins the map pinned at `from` at `to` instead.
    fn move_pin(from: &Path, to: &Path) -> std::io::Result<()> {
        let step = |what: &str, err: std::io::Error| std::io::Error::new(err.kind(), format!("{what}: {err}"));
        let map = sys::obj_get(from).map_err(|e| step("open the pin", e))?;
        if to.exists() {
            std::fs::remove_file(to).map_err(|e| step("remove an old pin", e))?;
        }
        sys::obj_pin(map.as_fd(), to).map_err(|e| step(&format!("pin at {}", to.display()), e))?;
        std::fs::remove_file(from).map_err(|e| step("unpin", e))
    }

    /// Moves the `CT` pinned at `pin` aside when it does not hold
    /// `wanted` entries; `None` when there is none or it is of that size.
    pub(crate) fn set_aside(pin: &Path, wanted: u32) -> std::io::Result<Option<Self>> {
        let aside = pin.with_file_name(ASIDE);
        if !pin.exists() {
            // An agent killed between the move and the copy: the old map
            // is the one with the flows.
            if aside.exists() {
                Self::move_pin(&aside, pin)?;
            } else {
                return Ok(None);
            }
        }
        let from = sys::map_max_entries(sys::obj_get(pin)?.as_fd())?;
        if from == wanted {
            return Ok(None);
        }
        Self::move_pin(pin, &aside)?;
        Ok(Some(Self { original: pin.to_owned(), aside, from, to: wanted }))
    }

    /// The load failed: the old map is pinned where it was.
    pub(crate) fn undo(self) {
        if let Err(err) = Self::move_pin(&self.aside, &self.original) {
            tracing::warn!(%err, pin = %self.original.display(), "cannot pin the conntrack map back after a failed load");
        }
    }

    /// Copies the old map's entries into `ct` (the new one), then unpins
    /// the old one. How many were copied. Flows the old programs open after
    /// the copy, before the new ones attach, start anew in the new map.
    pub(crate) fn finish(self, ct: std::os::fd::BorrowedFd<'_>) -> std::io::Result<usize> {
        let old = sys::obj_get(&self.aside)?;
        let entries = sys::read_hash_map::<CtKey, CtValue>(old.as_fd(), 1024)?.unwrap_or_default();
        let (keys, values): (Vec<CtKey>, Vec<CtValue>) = entries.into_iter().unzip();
        let mut copied = 0;
        for (keys, values) in keys.chunks(1024).zip(values.chunks(1024)) {
            let (done, result) = sys::map_update_batch(ct, keys, values);
            copied += done;
            result?;
        }
        std::fs::remove_file(&self.aside)?;
        tracing::info!(
            from = self.from,
            to = self.to,
            flows_entries_copied = copied,
            "conntrack map (CT) resized; its entries were copied"
        );
        Ok(copied)
    }
}
