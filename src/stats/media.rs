//! Media validation counters ([`crate::media`]): violations by reason, per route and per
//! channel. A violation is counted here whether the route drops it (`enforce`: also counted
//! as the drop reason `media_invalid`) or forwards it (`count`).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::media::Violation;

/// Violations by [`Violation`], lock-free; several workers may write the same counters.
#[derive(Debug)]
pub struct MediaCounters {
    by_reason: [AtomicU64; Violation::COUNT],
    /// The strip action: packets rewritten or stripped away, by what was cut from them.
    stripped: [AtomicU64; Violation::COUNT],
    stripped_bytes: AtomicU64,
}

impl Default for MediaCounters {
    fn default() -> Self {
        MediaCounters {
            by_reason: std::array::from_fn(|_| AtomicU64::new(0)),
            stripped: std::array::from_fn(|_| AtomicU64::new(0)),
            stripped_bytes: AtomicU64::new(0),
        }
    }
}

impl MediaCounters {
    pub fn count(&self, v: Violation) {
        self.by_reason[v as usize].fetch_add(1, Relaxed);
    }

    /// A packet the strip action rewrote (or stripped away): `bytes` cut for `v`.
    pub fn count_stripped(&self, v: Violation, bytes: usize) {
        self.stripped[v as usize].fetch_add(1, Relaxed);
        self.stripped_bytes.fetch_add(bytes as u64, Relaxed);
    }

    pub fn snapshot(&self) -> MediaSnapshot {
        MediaSnapshot {
            by_reason: std::array::from_fn(|i| self.by_reason[i].load(Relaxed)),
            stripped: std::array::from_fn(|i| self.stripped[i].load(Relaxed)),
            stripped_bytes: self.stripped_bytes.load(Relaxed),
        }
    }
}

/// A copy of [`MediaCounters`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MediaSnapshot {
    pub by_reason: [u64; Violation::COUNT],
    /// Packets the strip action rewrote or stripped away, by what it cut.
    pub stripped: [u64; Violation::COUNT],
    /// Bytes the strip action cut.
    pub stripped_bytes: u64,
}

impl Default for MediaSnapshot {
    fn default() -> Self {
        MediaSnapshot {
            by_reason: [0; Violation::COUNT],
            stripped: [0; Violation::COUNT],
            stripped_bytes: 0,
        }
    }
}

impl MediaSnapshot {
    pub fn get(&self, v: Violation) -> u64 {
        self.by_reason[v as usize]
    }

    pub fn total(&self) -> u64 {
        self.by_reason.iter().sum()
    }

    /// Packets stripped (rewritten or stripped away) for `v`.
    pub fn stripped(&self, v: Violation) -> u64 {
        self.stripped[v as usize]
    }

    /// The reasons the strip action cut at least once, with their packet counts.
    pub fn stripped_nonzero(&self) -> impl Iterator<Item = (Violation, u64)> + '_ {
        Violation::ALL
            .iter()
            .map(|&v| (v, self.stripped(v)))
            .filter(|&(_, n)| n > 0)
    }

    /// The reasons counted at least once, with their counts, in [`Violation::ALL`] order.
    pub fn nonzero(&self) -> impl Iterator<Item = (Violation, u64)> + '_ {
        Violation::ALL
            .iter()
            .map(|&v| (v, self.get(v)))
            .filter(|&(_, n)| n > 0)
    }

    pub fn add(&mut self, o: &MediaSnapshot) {
        for (a, b) in self.by_reason.iter_mut().zip(&o.by_reason) {
            *a += b;
        }
        for (a, b) in self.stripped.iter_mut().zip(&o.stripped) {
            *a += b;
        }
        self.stripped_bytes += o.stripped_bytes;
    }
}

/// The gateway's media validation totals, per channel (by [`crate::routes::Channel`] index,
/// forward then reverse): they outlive the routes.
#[derive(Debug, Default)]
pub struct MediaTotals {
    pub channels: [MediaCounters; 2],
    /// Times a worker's validator table was full and a live stream's state was given up for
    /// another (the evicted stream restarts its checks: a PS stream loses up to one frame).
    pub evictions: AtomicU64,
}
