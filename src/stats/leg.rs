//! The counters and state of a TCP media leg (`edge`): written by the leg's thread and, for
//! `stalls`, by the engines offering to its sink ([`crate::sink`]); read by listings and
//! metrics. Lock-free.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};

/// A leg's state, for listings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum LegState {
    Listening = 0,
    Connecting = 1,
    Connected = 2,
    Closed = 3,
    /// Connected, but holding what its sinks take: an RTSP bridge leg on the client's
    /// connection before the reply that starts the media has been written there.
    Held = 4,
}

impl LegState {
    /// Every state, for listings and metrics.
    pub const ALL: [LegState; 5] = [
        LegState::Listening,
        LegState::Connecting,
        LegState::Connected,
        LegState::Held,
        LegState::Closed,
    ];

    pub fn name(self) -> &'static str {
        match self {
            LegState::Listening => "listening",
            LegState::Connecting => "connecting",
            LegState::Connected => "connected",
            LegState::Closed => "closed",
            LegState::Held => "held",
        }
    }
}

/// Counters of one leg (lock-free; written by the leg's thread and, for `stalls`, the
/// engines offering to its sink).
#[derive(Debug, Default)]
pub struct LegCounters {
    /// Frames and payload bytes de-framed from the peer.
    pub frames_in: AtomicU64,
    pub bytes_in: AtomicU64,
    /// Frames and payload bytes written whole to the peer's socket (a frame dropped before
    /// its last byte was written counts only in `stalls`).
    pub frames_out: AtomicU64,
    pub bytes_out: AtomicU64,
    /// Runs of bytes from the peer that were not a valid frame.
    pub framing_errors: AtomicU64,
    /// Bytes skipped in those runs and in oversize frames.
    pub skipped_bytes: AtomicU64,
    /// Whole frames from the peer longer than `engine.max_payload`, skipped.
    pub oversize: AtomicU64,
    /// Closes with an incomplete frame left over.
    pub partial_frames: AtomicU64,
    /// Packets for the peer dropped because the leg could not take them (peer not reading,
    /// leg closed, too long), or still queued or unwritten when the leg stopped or the peer
    /// replaced its connection.
    pub stalls: AtomicU64,
    /// De-framed packets the route did not forward (no route, source, size, send failure).
    pub inject_drops: AtomicU64,
    /// TCP connections established.
    pub connects: AtomicU64,
    /// Connections refused: from a source the SDP did not name. (A new connection from the
    /// peer replaces its old one: counted in `connects`.)
    pub refused: AtomicU64,
    /// `a=connection:new` asks this leg to reconnect sooner than the minimum interval after
    /// its last reconnect: the connection is kept, the ask counted here.
    pub renew_refused: AtomicU64,
    /// Connections a passive leg took from its peer after its first one (GB/T 28181
    /// Annex D: the device, the TCP client, reconnected after a close within the leg's
    /// reconnect window, or replaced its connection with a new one).
    pub reconnects: AtomicU64,
    state: AtomicU8,
    /// Tests: batches of de-framed packets injected (an RTSP bridge leg's
    /// `LegInjectors::inject_batch` calls).
    #[cfg(test)]
    pub batches_in: AtomicU64,
}

impl LegCounters {
    pub fn state(&self) -> LegState {
        match self.state.load(Relaxed) {
            0 => LegState::Listening,
            1 => LegState::Connecting,
            2 => LegState::Connected,
            4 => LegState::Held,
            _ => LegState::Closed,
        }
    }

    pub(crate) fn set_state(&self, s: LegState) {
        self.state.store(s as u8, Relaxed);
    }

    /// The counters by name, for listings and metrics (one place, so names cannot drift).
    pub fn named(&self) -> [(&'static str, u64); 14] {
        [
            ("frames_in", self.frames_in.load(Relaxed)),
            ("bytes_in", self.bytes_in.load(Relaxed)),
            ("frames_out", self.frames_out.load(Relaxed)),
            ("bytes_out", self.bytes_out.load(Relaxed)),
            ("framing_errors", self.framing_errors.load(Relaxed)),
            ("skipped_bytes", self.skipped_bytes.load(Relaxed)),
            ("oversize", self.oversize.load(Relaxed)),
            ("partial_frames", self.partial_frames.load(Relaxed)),
            ("stalls", self.stalls.load(Relaxed)),
            ("inject_drops", self.inject_drops.load(Relaxed)),
            ("connects", self.connects.load(Relaxed)),
            ("refused", self.refused.load(Relaxed)),
            ("renew_refused", self.renew_refused.load(Relaxed)),
            ("reconnects", self.reconnects.load(Relaxed)),
        ]
    }
}
