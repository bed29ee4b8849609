//! Media validation counters ([`crate::media`]): violations by reason, per route and per
//! channel. A violation is counted here whether the route drops it (`enforce`: also counted
//! as the drop reason `media_invalid`) or forwards it (`count`).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::media::Violation;

/// Violations by [`Violation`], lock-free; several workers may write the same counters.
#[derive(Debug)]
pub struct MediaCounters {
    by_reason: [AtomicU64; Violation::COUNT],
}

impl Default for MediaCounters {
    fn default() -> Self {
        MediaCounters {
            by_reason: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl MediaCounters {
    pub fn count(&self, v: Violation) {
        self.by_reason[v as usize].fetch_add(1, Relaxed);
    }

    pub fn snapshot(&self) -> MediaSnapshot {
        MediaSnapshot {
            by_reason: std::array::from_fn(|i| self.by_reason[i].load(Relaxed)),
        }
    }
}

/// A copy of [`MediaCounters`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MediaSnapshot {
    pub by_reason: [u64; Violation::COUNT],
}

impl Default for MediaSnapshot {
    fn default() -> Self {
        MediaSnapshot {
            by_reason: [0; Violation::COUNT],
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
