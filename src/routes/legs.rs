//! The live TCP media legs, for listings and metrics: what each is and its counters
//! ([`LegCounters`]). The legs themselves (sockets, threads) are `edge`'s; this table only
//! lists them. Control side only (a mutex, never touched per packet).

use std::collections::BTreeMap;
use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use crate::config::DomainId;
pub use crate::stats::leg::{LegCounters, LegState};

use super::SessionId;

/// What the admin interface and the metrics know of a live leg.
#[derive(Debug)]
pub struct LegInfo {
    pub id: u64,
    pub session: SessionId,
    pub label: String,
    pub domain: DomainId,
    /// `passive` (the gateway listens) or `active` (it connects).
    pub role: &'static str,
    /// The gateway's end.
    pub local: SocketAddrV4,
    /// The peer the SDP named.
    pub peer: SocketAddrV4,
    pub counters: Arc<LegCounters>,
}

/// The live legs, for listings. Control side only (a mutex, never touched per packet).
#[derive(Debug, Default)]
pub struct LegTable {
    legs: Mutex<BTreeMap<u64, Arc<LegInfo>>>,
    next: AtomicU64,
    /// Counters of legs that have ended, summed, so totals never go backwards.
    pub ended: LegCounters,
}

impl LegTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<LegInfo>>> {
        self.legs.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn next_id(&self) -> u64 {
        self.next.fetch_add(1, Relaxed) + 1
    }

    pub fn insert(&self, info: Arc<LegInfo>) {
        self.lock().insert(info.id, info);
    }

    pub fn remove(&self, id: u64) {
        if let Some(info) = self.lock().remove(&id) {
            let c = &info.counters;
            let e = &self.ended;
            for (from, to) in [
                (&c.frames_in, &e.frames_in),
                (&c.bytes_in, &e.bytes_in),
                (&c.frames_out, &e.frames_out),
                (&c.bytes_out, &e.bytes_out),
                (&c.framing_errors, &e.framing_errors),
                (&c.skipped_bytes, &e.skipped_bytes),
                (&c.oversize, &e.oversize),
                (&c.partial_frames, &e.partial_frames),
                (&c.stalls, &e.stalls),
                (&c.inject_drops, &e.inject_drops),
                (&c.connects, &e.connects),
                (&c.refused, &e.refused),
                (&c.renew_refused, &e.renew_refused),
            ] {
                to.fetch_add(from.load(Relaxed), Relaxed);
            }
        }
    }

    /// The live legs, by id.
    pub fn list(&self) -> Vec<Arc<LegInfo>> {
        self.lock().values().cloned().collect()
    }

    /// Live legs.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every counter summed over live and ended legs.
    pub fn totals(&self) -> [(&'static str, u64); 13] {
        let mut t = self.ended.named();
        for l in self.list() {
            for (acc, (_, v)) in t.iter_mut().zip(l.counters.named()) {
                acc.1 += v;
            }
        }
        t
    }
}
