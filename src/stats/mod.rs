//! Counters shared by routes, channels and workers, declared once so their names cannot drift
//! between the data path, the shutdown totals and the metrics.
//!
//! All counters are relaxed atomics: each is written by the worker that handles the packet
//! (a route's packets normally stay on one worker, so there is no contention) and read by the
//! control side, which only needs eventually-consistent totals.

pub mod leg;
pub mod link;
pub mod media;
pub mod rtp;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Why a packet was not forwarded. Every drop increments exactly one of these.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(usize)]
pub enum DropReason {
    /// No stream route for the gateway port it arrived on.
    NoRoute,
    /// The source is not the route's expected (or latched) source.
    SourceMismatch,
    /// Longer than `engine.max_payload` (or than the receive buffer).
    Oversize,
    /// Empty, or headers claiming more bytes than arrived.
    Truncated,
    /// Not RTP version 2 on a route that forwards RTP only.
    NotRtp,
    /// The kernel refused the send (no route to the destination, ...), or (AF_XDP) the
    /// egress device dropped a frame it was handed (counted per channel only).
    SendError,
    /// The egress queue stayed full; the packet could not be handed to the kernel.
    QueueFull,
    /// Lost in the kernel's receive queue before vgate read it (socket buffer or ring full).
    RxOverflow,
    /// A captured frame that is not a whole, correct IPv4/UDP datagram (fragment, bad length
    /// or checksum, not UDP): only the ring engines see these; the kernel drops them before
    /// any socket.
    Malformed,
    /// The route's receiver is a stream leg ([`crate::edge`]) whose queue was full (its peer
    /// is not reading fast enough) or that has closed.
    LegStall,
    /// Mode xdp: the fast path redirected the frame to the egress interface and the kernel
    /// then dropped it (the egress driver refused it, the interface was down, its queue was
    /// full). Counted per channel only: the kernel reports these per egress interface, not per
    /// route.
    RedirectFailed,
    /// The route validates its media ([`crate::media`], mode `enforce`) and the packet is not
    /// well-formed media of what was negotiated; the reason is counted in `media_invalid`.
    MediaInvalid,
    /// This node is the standby of a hot-standby pair (`[ha]`): it holds the ports and the
    /// routes but forwards nothing until it is told it is the active one.
    Standby,
    /// Media validation `strip`: everything the packet carried was cut out (PS padding or a
    /// private stream, an SEI with user data); counted by what in `media_stripped`.
    MediaStripped,
}

impl DropReason {
    pub const COUNT: usize = 14;
    pub const ALL: [DropReason; Self::COUNT] = [
        DropReason::NoRoute,
        DropReason::SourceMismatch,
        DropReason::Oversize,
        DropReason::Truncated,
        DropReason::NotRtp,
        DropReason::SendError,
        DropReason::QueueFull,
        DropReason::RxOverflow,
        DropReason::Malformed,
        DropReason::LegStall,
        DropReason::RedirectFailed,
        DropReason::MediaInvalid,
        DropReason::Standby,
        DropReason::MediaStripped,
    ];

    /// Name used in totals and metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            DropReason::NoRoute => "no_route",
            DropReason::SourceMismatch => "source_mismatch",
            DropReason::Oversize => "oversize",
            DropReason::Truncated => "truncated",
            DropReason::NotRtp => "not_rtp",
            DropReason::SendError => "send_error",
            DropReason::QueueFull => "queue_full",
            DropReason::RxOverflow => "rx_overflow",
            DropReason::Malformed => "malformed",
            DropReason::LegStall => "leg_stall",
            DropReason::RedirectFailed => "redirect_failed",
            DropReason::MediaInvalid => "media_invalid",
            DropReason::Standby => "standby",
            DropReason::MediaStripped => "media_stripped",
        }
    }
}

/// Packet, byte and drop counters for a route, a channel or a worker.
#[derive(Debug, Default)]
pub struct PacketCounters {
    pub rx_packets: AtomicU64,
    pub rx_bytes: AtomicU64,
    pub tx_packets: AtomicU64,
    pub tx_bytes: AtomicU64,
    pub drops: [AtomicU64; DropReason::COUNT],
    /// Times a `latch` route moved to a new source after its latched one fell silent.
    pub relatches: AtomicU64,
}

/// Adds `n` to a counter that only the calling thread ever writes: a plain load and store,
/// no locked read-modify-write. Readers see the value whole. A second writer loses counts.
pub(crate) fn bump_only_writer(a: &AtomicU64, n: u64) {
    if n > 0 {
        a.store(a.load(Relaxed).wrapping_add(n), Relaxed);
    }
}

impl PacketCounters {
    pub fn drop(&self, reason: DropReason, n: u64) {
        if n > 0 {
            self.drops[reason as usize].fetch_add(n, Relaxed);
        }
    }

    /// Adds a batch's worth of local tallies in one go (one atomic add per field).
    pub fn add(&self, t: &Tally) {
        if t.rx_packets > 0 {
            self.rx_packets.fetch_add(t.rx_packets, Relaxed);
            self.rx_bytes.fetch_add(t.rx_bytes, Relaxed);
        }
        if t.tx_packets > 0 {
            self.tx_packets.fetch_add(t.tx_packets, Relaxed);
            self.tx_bytes.fetch_add(t.tx_bytes, Relaxed);
        }
        if t.any_drop() {
            for r in DropReason::ALL {
                self.drop(r, t.drops[r as usize]);
            }
        }
        if t.relatches > 0 {
            self.relatches.fetch_add(t.relatches, Relaxed);
        }
    }

    /// [`PacketCounters::add`] for counters that only the calling thread ever writes (a
    /// worker's own channel counters): plain loads and stores, no locked read-modify-write
    /// per field. Readers see each field whole, as with `add`.
    ///
    /// **Only for counters with one writer thread, ever**: a second writer (another worker,
    /// the control thread, even one `add` on the same counters) loses increments silently.
    /// Crate-private for that reason; anything shared uses [`PacketCounters::add`].
    pub(crate) fn add_as_only_writer(&self, t: &Tally) {
        let bump = bump_only_writer;
        bump(&self.rx_packets, t.rx_packets);
        bump(&self.rx_bytes, t.rx_bytes);
        bump(&self.tx_packets, t.tx_packets);
        bump(&self.tx_bytes, t.tx_bytes);
        if t.any_drop() {
            for (a, &n) in self.drops.iter().zip(&t.drops) {
                bump(a, n);
            }
        }
        bump(&self.relatches, t.relatches);
    }

    pub fn snapshot(&self) -> Snapshot {
        let mut drops = [0; DropReason::COUNT];
        for (d, a) in drops.iter_mut().zip(&self.drops) {
            *d = a.load(Relaxed);
        }
        Snapshot {
            rx_packets: self.rx_packets.load(Relaxed),
            rx_bytes: self.rx_bytes.load(Relaxed),
            tx_packets: self.tx_packets.load(Relaxed),
            tx_bytes: self.tx_bytes.load(Relaxed),
            drops,
            relatches: self.relatches.load(Relaxed),
        }
    }
}

/// Plain (non-atomic) counts gathered while processing a batch, added to
/// [`PacketCounters`] once per batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub drops: [u64; DropReason::COUNT],
    pub relatches: u64,
}

impl Tally {
    pub fn drop(&mut self, reason: DropReason) {
        self.drops[reason as usize] += 1;
    }

    pub fn is_empty(&self) -> bool {
        *self == Tally::default()
    }

    /// Whether any drop is counted (one branch instead of one per reason on the usual
    /// batch, which drops nothing).
    #[inline]
    pub fn any_drop(&self) -> bool {
        self.drops.iter().fold(0, |a, &d| a | d) != 0
    }

    /// Adds another tally into this one (e.g. a route run into its channel's batch).
    pub fn merge(&mut self, o: &Tally) {
        self.rx_packets += o.rx_packets;
        self.rx_bytes += o.rx_bytes;
        self.tx_packets += o.tx_packets;
        self.tx_bytes += o.tx_bytes;
        for (a, b) in self.drops.iter_mut().zip(&o.drops) {
            *a += b;
        }
        self.relatches += o.relatches;
    }
}

/// A point-in-time copy of [`PacketCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub drops: [u64; DropReason::COUNT],
    pub relatches: u64,
}

impl Snapshot {
    pub fn dropped(&self) -> u64 {
        self.drops.iter().sum()
    }

    pub fn drop_count(&self, r: DropReason) -> u64 {
        self.drops[r as usize]
    }

    pub fn add(&mut self, o: &Snapshot) {
        self.rx_packets += o.rx_packets;
        self.rx_bytes += o.rx_bytes;
        self.tx_packets += o.tx_packets;
        self.tx_bytes += o.tx_bytes;
        for (a, b) in self.drops.iter_mut().zip(&o.drops) {
            *a += b;
        }
        self.relatches += o.relatches;
    }

    /// `key=value` pairs, drops and re-latches only where non-zero: the format of the shutdown totals,
    /// which tests and scripts parse.
    pub fn kv(&self) -> String {
        let mut s = format!(
            "rx_packets={} rx_bytes={} tx_packets={} tx_bytes={}",
            self.rx_packets, self.rx_bytes, self.tx_packets, self.tx_bytes
        );
        for r in DropReason::ALL {
            let n = self.drops[r as usize];
            if n > 0 {
                let _ = write!(s, " drop_{}={n}", r.name());
            }
        }
        if self.relatches > 0 {
            let _ = write!(s, " relatches={}", self.relatches);
        }
        s
    }
}

/// Upper bounds (seconds) of the buckets of the call-setup and time-to-first-packet
/// histograms; `+Inf` follows.
pub const SETUP_BUCKETS: [f64; 9] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// A Prometheus histogram over [`SETUP_BUCKETS`], lock-free.
#[derive(Debug, Default)]
pub struct Histogram {
    /// Observations per bucket (not cumulative); the last is `+Inf`.
    counts: [AtomicU64; SETUP_BUCKETS.len() + 1],
    sum_us: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, d: std::time::Duration) {
        let s = d.as_secs_f64();
        let i = SETUP_BUCKETS
            .iter()
            .position(|b| s <= *b)
            .unwrap_or(SETUP_BUCKETS.len());
        self.counts[i].fetch_add(1, Relaxed);
        self.sum_us
            .fetch_add(u64::try_from(d.as_micros()).unwrap_or(u64::MAX), Relaxed);
    }

    /// (upper bound, cumulative count) per bucket, `+Inf` (f64::INFINITY) last; and the sum
    /// of the observations in seconds.
    pub fn snapshot(&self) -> (Vec<(f64, u64)>, f64) {
        let mut acc = 0;
        let mut v = Vec::with_capacity(self.counts.len());
        for (i, c) in self.counts.iter().enumerate() {
            acc += c.load(Relaxed);
            v.push((SETUP_BUCKETS.get(i).copied().unwrap_or(f64::INFINITY), acc));
        }
        (v, self.sum_us.load(Relaxed) as f64 / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tally_adds_once_per_field() {
        let c = PacketCounters::default();
        let mut t = Tally {
            rx_packets: 3,
            rx_bytes: 300,
            tx_packets: 2,
            tx_bytes: 200,
            ..Default::default()
        };
        t.drop(DropReason::SourceMismatch);
        c.add(&t);
        c.add(&t);
        let s = c.snapshot();
        assert_eq!(s.rx_packets, 6);
        assert_eq!(s.tx_bytes, 400);
        assert_eq!(s.drop_count(DropReason::SourceMismatch), 2);
        assert_eq!(s.dropped(), 2);
        assert_eq!(
            s.kv(),
            "rx_packets=6 rx_bytes=600 tx_packets=4 tx_bytes=400 drop_source_mismatch=2"
        );
    }

    #[test]
    fn names_are_unique() {
        let mut names: Vec<_> = DropReason::ALL.iter().map(|r| r.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), DropReason::COUNT);
        for (i, r) in DropReason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i);
        }
    }
}
