//! The hand-over point between the components whose state the hot standby copies besides
//! the routes (the SIP proxies' registrations and dialogs) and the HA thread
//! ([`crate::ha`]), which neither depends on the other: a producer (`sip/ROUTE`) publishes
//! its records (key → JSON) off the packet path, the active's HA thread writes them to the
//! state store with the sessions; a standby's HA thread puts what the store holds here and
//! the producer installs it at its next tick. A lock held for a copy of `Arc`s, a few times
//! a second: never on the packet path.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// One producer's records: key (no `/`-free requirement) → JSON.
pub type Records = Arc<BTreeMap<String, String>>;

#[derive(Default)]
pub struct Board {
    exported: Mutex<BTreeMap<String, Records>>,
    /// The generation of `imported` (bumped by every [`Board::set_imported`]).
    imported: Mutex<(u64, BTreeMap<String, Records>)>,
    /// Records a producer could not read (a newer version, malformed), for the HA status.
    rejected: AtomicU64,
    /// Set by the HA thread: without it (no `[ha]`) producers publish nothing.
    enabled: AtomicBool,
}

impl Board {
    /// A state store will take the records (the HA thread started).
    pub fn enable(&self) {
        self.enabled.store(true, Relaxed);
    }

    /// Whether producers should publish (a node with `[ha]`).
    pub fn enabled(&self) -> bool {
        self.enabled.load(Relaxed)
    }

    /// Producer `producer` (`sip/ROUTE`) holds `records` now.
    pub fn publish(&self, producer: &str, records: Records) {
        self.exported
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(producer.to_string(), records);
    }

    /// Producer `producer` holds nothing any more (it stopped).
    pub fn withdraw(&self, producer: &str) {
        self.exported
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(producer);
    }

    /// What every producer published last.
    pub fn exported(&self) -> Vec<(String, Records)> {
        self.exported
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), Arc::clone(v)))
            .collect()
    }

    /// What the state store holds for each producer (a standby's read).
    pub fn set_imported(&self, by_producer: BTreeMap<String, Records>) {
        let mut g = self.imported.lock().unwrap_or_else(|p| p.into_inner());
        g.0 += 1;
        g.1 = by_producer;
    }

    /// The store's records for `producer` if they changed since generation `*seen` (an
    /// empty set when the store holds none for it), and `*seen` moved on.
    pub fn imported(&self, producer: &str, seen: &mut u64) -> Option<Records> {
        let g = self.imported.lock().unwrap_or_else(|p| p.into_inner());
        if g.0 == *seen {
            return None;
        }
        *seen = g.0;
        Some(g.1.get(producer).cloned().unwrap_or_default())
    }

    /// A producer could not read `n` records.
    pub fn reject(&self, n: u64) {
        self.rejected.fetch_add(n, Relaxed);
    }

    /// The rejections since the last call.
    pub fn take_rejected(&self) -> u64 {
        self.rejected.swap(0, Relaxed)
    }
}
