//! The split link's counters ([`LinkCounters`], one per link) and its drop reasons
//! ([`LinkDrop`]): written by the link's TX/RX, read by stats, the admin API and metrics.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::wire::link::HeaderError;

/// Why a datagram on the incoming link was dropped before delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum LinkDrop {
    /// Not a vgate link packet (magic or kind).
    Garbage,
    /// Shorter than its header or than the length it claims.
    Truncated,
    /// Another link header version.
    BadVersion,
    /// FEC fields impossible, or not this link's setting.
    BadFec,
    /// No route on the gateway port it names.
    UnknownPort,
    /// From another address than the configured peer.
    ForeignSource,
    /// Longer than a link frame.
    Oversize,
    /// A fragment of a datagram that can no longer complete (another fragment lost).
    FragmentLost,
    /// A fragment of a datagram not complete [`crate::link::frag::JOIN_TIMEOUT_MS`] after its first.
    FragmentTimeout,
    /// An impossible stream header (fragment fields), or a fragment that contradicts the
    /// others of its datagram.
    BadFragment,
    /// The frame's MAC does not match the link's key (forged, another key, or corrupted),
    /// or it is too short to carry one.
    BadMac,
    /// Authentic, but too far behind the newest frame of its lane (the replay window).
    ReplayOld,
    /// Authentic, but a frame of its lane already taken (a replay or a duplicate).
    Duplicate,
    /// Authentic, but of an older epoch than its lane's newest (a previous sender process).
    StaleEpoch,
}

impl LinkDrop {
    pub const COUNT: usize = 14;
    pub const ALL: [LinkDrop; Self::COUNT] = [
        LinkDrop::Garbage,
        LinkDrop::Truncated,
        LinkDrop::BadVersion,
        LinkDrop::BadFec,
        LinkDrop::UnknownPort,
        LinkDrop::ForeignSource,
        LinkDrop::Oversize,
        LinkDrop::FragmentLost,
        LinkDrop::FragmentTimeout,
        LinkDrop::BadFragment,
        LinkDrop::BadMac,
        LinkDrop::ReplayOld,
        LinkDrop::Duplicate,
        LinkDrop::StaleEpoch,
    ];

    pub fn name(self) -> &'static str {
        match self {
            LinkDrop::Garbage => "garbage",
            LinkDrop::Truncated => "truncated",
            LinkDrop::BadVersion => "bad_version",
            LinkDrop::BadFec => "bad_fec",
            LinkDrop::UnknownPort => "unknown_port",
            LinkDrop::ForeignSource => "foreign_source",
            LinkDrop::Oversize => "oversize",
            LinkDrop::FragmentLost => "fragment_lost",
            LinkDrop::FragmentTimeout => "fragment_timeout",
            LinkDrop::BadFragment => "bad_fragment",
            LinkDrop::BadMac => "bad_mac",
            LinkDrop::ReplayOld => "replay_old",
            LinkDrop::Duplicate => "duplicate",
            LinkDrop::StaleEpoch => "stale_epoch",
        }
    }

    /// The drop a link header check's error counts as.
    pub fn from_header(e: HeaderError) -> LinkDrop {
        match e {
            HeaderError::Garbage => LinkDrop::Garbage,
            HeaderError::Truncated => LinkDrop::Truncated,
            HeaderError::BadVersion => LinkDrop::BadVersion,
            HeaderError::BadFec => LinkDrop::BadFec,
            HeaderError::Oversize => LinkDrop::Oversize,
        }
    }
}

/// Counters of one link. Outgoing: `packets`/`bytes` sent (repair frames included),
/// `repair_packets`, `send_errors`. Incoming: the same for what arrived, then what the
/// decoder made of it and the drops by reason.
#[derive(Debug, Default)]
pub struct LinkCounters {
    pub packets: AtomicU64,
    pub bytes: AtomicU64,
    pub repair_packets: AtomicU64,
    pub send_errors: AtomicU64,
    /// Incoming: datagrams handed to the link face as received.
    pub delivered: AtomicU64,
    /// Incoming: datagrams rebuilt by FEC.
    pub repaired: AtomicU64,
    /// Incoming: datagrams lost on the link and not rebuilt.
    pub lost: AtomicU64,
    pub late: AtomicU64,
    pub duplicate: AtomicU64,
    /// Incoming: times a sending lane started over (the peer half restarted).
    pub restarts: AtomicU64,
    /// Incoming, the reorder window: datagrams that waited for an earlier one, positions
    /// given up, datagrams handed on after their gap was given up.
    pub reorder_held: AtomicU64,
    pub reorder_expired: AtomicU64,
    pub reorder_overtaken: AtomicU64,
    /// Incoming, the reorder window: waits begun (a gap opened with nothing held before),
    /// held datagrams by what handed them on ([`REORDER_RELEASES`]) and by how long they
    /// waited ([`REORDER_WAITS`]).
    pub reorder_waits: AtomicU64,
    pub reorder_released: [AtomicU64; REORDER_RELEASES.len()],
    pub reorder_waited: [AtomicU64; REORDER_WAITS.len()],
    /// Outgoing: datagrams cut into fragments. Incoming: fragments received, datagrams
    /// joined from them.
    pub fragmented: AtomicU64,
    pub fragments: AtomicU64,
    pub joined: AtomicU64,
    pub drops: [AtomicU64; LinkDrop::COUNT],
}

/// What hands a held datagram on in the reorder window, in the order of the link's
/// `Release` (`crate::link::reorder`): the missing one arrived late, was rebuilt, was a
/// partial block's unused position, the wait ran out, the gap was known lost, the window
/// slid, the lane started over.
pub const REORDER_RELEASES: [&str; 7] = [
    "arrived", "rebuilt", "skipped", "timeout", "lost", "slide", "flush",
];
/// The reorder window's wait buckets (`crate::link::reorder::WAIT_BOUNDS_MS`): held up to
/// 1, 2, 5, 10, 25 ms, or longer.
pub const REORDER_WAITS: [&str; 6] = ["le1ms", "le2ms", "le5ms", "le10ms", "le25ms", "over25ms"];

/// A point-in-time copy of [`LinkCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LinkSnapshot {
    pub packets: u64,
    pub bytes: u64,
    pub repair_packets: u64,
    pub send_errors: u64,
    pub delivered: u64,
    pub repaired: u64,
    pub lost: u64,
    pub late: u64,
    pub duplicate: u64,
    pub restarts: u64,
    pub reorder_held: u64,
    pub reorder_expired: u64,
    pub reorder_overtaken: u64,
    pub reorder_waits: u64,
    pub reorder_released: [u64; REORDER_RELEASES.len()],
    pub reorder_waited: [u64; REORDER_WAITS.len()],
    pub fragmented: u64,
    pub fragments: u64,
    pub joined: u64,
    pub drops: [u64; LinkDrop::COUNT],
}

impl LinkSnapshot {
    pub fn drop_count(&self, r: LinkDrop) -> u64 {
        self.drops[r as usize]
    }
}

impl LinkCounters {
    pub fn snapshot(&self) -> LinkSnapshot {
        let mut drops = [0; LinkDrop::COUNT];
        for (d, a) in drops.iter_mut().zip(&self.drops) {
            *d = a.load(Relaxed);
        }
        LinkSnapshot {
            packets: self.packets.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            repair_packets: self.repair_packets.load(Relaxed),
            send_errors: self.send_errors.load(Relaxed),
            delivered: self.delivered.load(Relaxed),
            repaired: self.repaired.load(Relaxed),
            lost: self.lost.load(Relaxed),
            late: self.late.load(Relaxed),
            duplicate: self.duplicate.load(Relaxed),
            restarts: self.restarts.load(Relaxed),
            reorder_held: self.reorder_held.load(Relaxed),
            reorder_expired: self.reorder_expired.load(Relaxed),
            reorder_overtaken: self.reorder_overtaken.load(Relaxed),
            reorder_waits: self.reorder_waits.load(Relaxed),
            reorder_released: self.reorder_released.each_ref().map(|a| a.load(Relaxed)),
            reorder_waited: self.reorder_waited.each_ref().map(|a| a.load(Relaxed)),
            fragmented: self.fragmented.load(Relaxed),
            fragments: self.fragments.load(Relaxed),
            joined: self.joined.load(Relaxed),
            drops,
        }
    }
}
