//! The refusal capture: an operator arms it on one route for that route's next N refused
//! packets (`vgate capture-refused`, `POST /api/v1/capture`), the data path copies each of
//! them into a buffer allocated when it was armed, and the admin interface hands them out
//! (for a pcap file, forensics of what a camera or a client tried to carry across).
//!
//! What is captured: the refusals that are about a packet's content or origin — media
//! validation (`media_invalid`, with the validator's reason, and `media_stripped`: a packet
//! whose whole payload the strip action cut), `not_rtp` and `source_mismatch` — each as
//! the UDP payload that arrived, byte for byte (before any strip rewrite), with its source,
//! the wall-clock time it was decided and the reason. Not captured: `standby`, empty and
//! oversize datagrams (nothing, or not all of it, was received), and drops after the
//! decision (send errors, full queues).
//!
//! Cost on the data path: while nothing is armed, one relaxed atomic load per refused
//! packet ([`RefusalCapture::wants`]: is the armed route this one?), and on a route whose
//! media rule strips one per packet (its bytes must be copied before the strip rewrites
//! them). While armed on the route: a buffer popped from a lock-free free list, the bytes
//! copied, the wall clock read, the buffer pushed on the ready queue — no allocation, lock
//! or log. No free buffer (the reader is behind): counted as `capture_overflow` and not
//! counted against N.
//!
//! One capture at a time per gateway: arming another while one runs is refused (stop it
//! first, or wait for its timeout). Its id is the generation of the arming, stamped on every
//! buffer when its packet is counted, with the route it came from: a packet of another route
//! in flight while the capture was re-armed is never handed out under the new one.

use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::Mutex;

use crossbeam_queue::ArrayQueue;

use super::Channel;
use crate::media::Violation;
use crate::stats::DropReason;

/// Most packets one capture may ask for.
pub const MAX_COUNT: u32 = 10_000;
/// Longest a capture may stay armed.
pub const MAX_TIMEOUT_MS: u64 = 3_600_000;
/// Buffers of one capture at most (fewer when it asks for fewer packets): what the data path
/// can hold between two reads of the admin interface (the CLI reads five times a second).
pub const POOL: usize = 512;
/// Most packets one read hands out (keeps an answer of the admin interface bounded).
pub const MAX_DRAIN: usize = 256;

/// One buffer: a refused packet and what is known of it.
struct Slot {
    /// The [`crate::routes::StreamRoute::id`] and capture id it was taken under.
    route: u64,
    id: u32,
    unix_us: u64,
    src: SocketAddrV4,
    reason: DropReason,
    violation: Option<Violation>,
    /// Bytes kept (at most the buffer) and bytes the datagram had.
    len: usize,
    orig_len: usize,
    data: Box<[u8]>,
}

/// A captured packet as handed out to the control side (owned).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapturedPacket {
    /// When it was refused, microseconds since the Unix epoch.
    pub unix_us: u64,
    pub src: SocketAddrV4,
    pub reason: DropReason,
    /// The media validator's reason, for `media_invalid` and `media_stripped`.
    pub violation: Option<Violation>,
    /// The UDP payload (all of it unless it exceeded the capture's snap length).
    pub payload: Vec<u8>,
    pub orig_len: usize,
}

/// What a capture was armed on (told by the control side, which resolved the route).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub route: u64,
    pub channel: Channel,
    pub port: u16,
    pub label: String,
    /// The gateway's address the route receives on (the captured packets' destination).
    pub dst: SocketAddrV4,
}

/// Where a capture stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureState {
    /// Waiting for refused packets.
    Armed,
    /// All N captured and handed out.
    Done,
    /// The time limit passed first.
    Expired,
    /// Stopped by the operator.
    Stopped,
}

impl CaptureState {
    pub fn name(self) -> &'static str {
        match self {
            CaptureState::Armed => "armed",
            CaptureState::Done => "done",
            CaptureState::Expired => "expired",
            CaptureState::Stopped => "stopped",
        }
    }
}

/// A capture's progress.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaptureStatus {
    pub id: u32,
    pub target: Target,
    pub state: CaptureState,
    pub count: u32,
    /// Packets taken so far (handed out or waiting to be).
    pub captured: u32,
    /// Packets handed out so far.
    pub delivered: u32,
    /// Refused packets of the route not captured because every buffer was waiting to be read.
    pub overflow: u64,
    /// Milliseconds left before the time limit (0 once passed).
    pub left_ms: u64,
    pub snaplen: usize,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CaptureError {
    #[error("a capture (id {id}) is already armed on {label}; stop it first (DELETE /api/v1/capture) or wait for its time limit")]
    Busy { id: u32, label: String },
    #[error("count must be 1 to {MAX_COUNT} packets (got {0})")]
    Count(u64),
    #[error("timeout must be 1 ms to {MAX_TIMEOUT_MS} ms (got {0})")]
    Timeout(u64),
    #[error("no capture with id {0}: it was replaced by a newer one, or never armed; arm one with POST /api/v1/capture")]
    Unknown(u32),
}

/// The control side's record of the last capture armed.
#[derive(Debug)]
struct Session {
    status: CaptureStatus,
    deadline_ms: u64,
    overflow_at_arm: u64,
    stopped: bool,
}

/// The gateway's refusal capture ([`crate::routes::Routes::capture`]), shared by every
/// worker's validators and the admin interface.
#[derive(Debug)]
pub struct RefusalCapture {
    /// The armed route's id; 0: nothing armed (route ids start at 1).
    armed: AtomicU64,
    /// Capture id (high 32 bits) and packets still wanted (low 32 bits).
    ticket: AtomicU64,
    /// [`crate::clock::now_ms`] after which the data path captures no more.
    deadline_ms: AtomicU64,
    free: ArrayQueue<Box<Slot>>,
    ready: ArrayQueue<Box<Slot>>,
    /// Over every capture so far (metrics).
    captured: AtomicU64,
    overflow: AtomicU64,
    armings: AtomicU64,
    /// Control side only; the data path never takes it.
    session: Mutex<Option<Session>>,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot").field("len", &self.len).finish()
    }
}

impl Default for RefusalCapture {
    fn default() -> RefusalCapture {
        RefusalCapture {
            armed: AtomicU64::new(0),
            ticket: AtomicU64::new(0),
            deadline_ms: AtomicU64::new(0),
            free: ArrayQueue::new(POOL),
            ready: ArrayQueue::new(POOL),
            captured: AtomicU64::new(0),
            overflow: AtomicU64::new(0),
            armings: AtomicU64::new(0),
            session: Mutex::new(None),
        }
    }
}

/// A buffer the data path holds between [`RefusalCapture::take`] and
/// [`RefusalCapture::commit`] (or [`RefusalCapture::give_back`]).
#[derive(Debug)]
pub struct Held(Box<Slot>);

impl RefusalCapture {
    /// Whether a capture is armed on route `route` (the data path's one check: one relaxed
    /// load).
    #[inline]
    pub fn wants(&self, route: u64) -> bool {
        self.armed.load(Relaxed) == route
    }

    /// Takes a free buffer and copies `payload` (the datagram as it arrived) into it, for a
    /// route [`RefusalCapture::wants`]; `None` past the time limit (the capture is then
    /// disarmed) or with no free buffer (`capture_overflow`).
    #[cold]
    pub fn take(&self, route: u64, payload: &[u8], now_ms: u64) -> Option<Held> {
        if now_ms > self.deadline_ms.load(Relaxed) {
            let _ = self.armed.compare_exchange(route, 0, Relaxed, Relaxed);
            return None;
        }
        let Some(mut slot) = self.free.pop() else {
            self.overflow.fetch_add(1, Relaxed);
            return None;
        };
        let n = payload.len().min(slot.data.len());
        slot.data[..n].copy_from_slice(&payload[..n]);
        slot.len = n;
        slot.orig_len = payload.len();
        slot.route = route;
        Some(Held(slot))
    }

    /// Hands a buffer of [`RefusalCapture::take`] back unused (the packet was admitted).
    #[cold]
    pub fn give_back(&self, held: Held) {
        // The free list holds every buffer of the pool: it has room for this one.
        let _ = self.free.push(held.0);
    }

    /// Records the packet in `held` as refused from `src` for `reason`: counted against the
    /// capture's N (the last one disarms it) and queued for the admin interface. Past the N
    /// (another worker took the last), the buffer goes back unused.
    #[cold]
    pub fn commit(
        &self,
        held: Held,
        src: SocketAddrV4,
        reason: DropReason,
        violation: Option<Violation>,
    ) {
        let mut slot = held.0;
        let mut t = self.ticket.load(Acquire);
        let id = loop {
            let left = t & u64::from(u32::MAX);
            if left == 0 {
                let _ = self.armed.compare_exchange(slot.route, 0, Relaxed, Relaxed);
                let _ = self.free.push(slot);
                return;
            }
            match self.ticket.compare_exchange_weak(t, t - 1, AcqRel, Acquire) {
                Ok(_) => {
                    if left == 1 {
                        let _ = self.armed.compare_exchange(slot.route, 0, Relaxed, Relaxed);
                    }
                    break (t >> 32) as u32;
                }
                Err(now) => t = now,
            }
        };
        slot.id = id;
        slot.unix_us = unix_us();
        slot.src = src;
        slot.reason = reason;
        slot.violation = violation;
        // The ready queue has room for every buffer of the pool.
        let _ = self.ready.push(slot);
        self.captured.fetch_add(1, Relaxed);
    }

    /// [`RefusalCapture::take`] then [`RefusalCapture::commit`]: for a refusal decided
    /// before the packet could be rewritten.
    #[cold]
    pub fn record(
        &self,
        route: u64,
        src: SocketAddrV4,
        payload: &[u8],
        reason: DropReason,
        violation: Option<Violation>,
        now_ms: u64,
    ) {
        if let Some(held) = self.take(route, payload, now_ms) {
            self.commit(held, src, reason, violation);
        }
    }

    /// Arms a capture of the next `count` refused packets of `target` for `timeout_ms`,
    /// keeping at most `snaplen` bytes of each; allocates its buffers. Control path.
    pub fn arm(
        &self,
        target: Target,
        count: u64,
        timeout_ms: u64,
        snaplen: usize,
        now_ms: u64,
    ) -> Result<CaptureStatus, CaptureError> {
        if count == 0 || count > u64::from(MAX_COUNT) {
            return Err(CaptureError::Count(count));
        }
        if timeout_ms == 0 || timeout_ms > MAX_TIMEOUT_MS {
            return Err(CaptureError::Timeout(timeout_ms));
        }
        let mut session = self.lock();
        if let Some(s) = session.as_mut() {
            self.settle(s, now_ms);
            // A stopped or expired capture whose last packets nobody read gives way.
            if s.status.state == CaptureState::Armed && !s.stopped && now_ms <= s.deadline_ms {
                return Err(CaptureError::Busy {
                    id: s.status.id,
                    label: s.status.target.label.clone(),
                });
            }
        }
        self.armed.store(0, Release);
        while self.ready.pop().is_some() {}
        while self.free.pop().is_some() {}
        let buffers = (count as usize).min(POOL);
        for _ in 0..buffers {
            let _ = self.free.push(Box::new(Slot {
                route: 0,
                id: 0,
                unix_us: 0,
                src: SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, 0),
                reason: DropReason::MediaInvalid,
                violation: None,
                len: 0,
                orig_len: 0,
                data: vec![0; snaplen].into_boxed_slice(),
            }));
        }
        let id = ((self.ticket.load(Acquire) >> 32) as u32)
            .wrapping_add(1)
            .max(1);
        self.ticket.store((u64::from(id) << 32) | count, Release);
        let deadline_ms = now_ms + timeout_ms;
        self.deadline_ms.store(deadline_ms, Release);
        self.armings.fetch_add(1, Relaxed);
        let route = target.route;
        let status = CaptureStatus {
            id,
            target,
            state: CaptureState::Armed,
            count: count as u32,
            captured: 0,
            delivered: 0,
            overflow: 0,
            left_ms: timeout_ms,
            snaplen,
        };
        *session = Some(Session {
            status: status.clone(),
            deadline_ms,
            overflow_at_arm: self.overflow.load(Relaxed),
            stopped: false,
        });
        self.armed.store(route, Release);
        Ok(status)
    }

    /// Hands out up to `max` packets of capture `id` (oldest first) and its progress.
    pub fn drain(
        &self,
        id: u32,
        max: usize,
        now_ms: u64,
    ) -> Result<(CaptureStatus, Vec<CapturedPacket>), CaptureError> {
        let mut session = self.lock();
        let s = match session.as_mut() {
            Some(s) if s.status.id == id => s,
            _ => return Err(CaptureError::Unknown(id)),
        };
        let mut out = Vec::new();
        while out.len() < max.min(MAX_DRAIN) {
            let Some(slot) = self.ready.pop() else { break };
            if slot.id == id && slot.route == s.status.target.route {
                out.push(CapturedPacket {
                    unix_us: slot.unix_us,
                    src: slot.src,
                    reason: slot.reason,
                    violation: slot.violation,
                    payload: slot.data[..slot.len].to_vec(),
                    orig_len: slot.orig_len,
                });
            }
            let _ = self.free.push(slot);
        }
        s.status.delivered += out.len() as u32;
        self.settle(s, now_ms);
        Ok((s.status.clone(), out))
    }

    /// Stops capture `id` (what it took and nobody read yet stays to be handed out).
    pub fn stop(&self, id: u32, now_ms: u64) -> Result<CaptureStatus, CaptureError> {
        let mut session = self.lock();
        let s = match session.as_mut() {
            Some(s) if s.status.id == id => s,
            _ => return Err(CaptureError::Unknown(id)),
        };
        let _ = self
            .armed
            .compare_exchange(s.status.target.route, 0, Release, Relaxed);
        if s.status.state == CaptureState::Armed {
            s.stopped = true;
        }
        self.settle(s, now_ms);
        Ok(s.status.clone())
    }

    /// The last capture armed, if any.
    pub fn status(&self, now_ms: u64) -> Option<CaptureStatus> {
        let mut session = self.lock();
        let s = session.as_mut()?;
        self.settle(s, now_ms);
        Some(s.status.clone())
    }

    /// Whether a capture is armed now (metrics).
    pub fn is_armed(&self) -> bool {
        self.armed.load(Relaxed) != 0
    }

    /// Packets captured, over every capture so far.
    pub fn captured_total(&self) -> u64 {
        self.captured.load(Relaxed)
    }

    /// Refused packets of an armed route not captured for want of a free buffer, so far.
    pub fn overflow_total(&self) -> u64 {
        self.overflow.load(Relaxed)
    }

    /// Captures armed so far.
    pub fn armings(&self) -> u64 {
        self.armings.load(Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Session>> {
        self.session.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Brings `s`'s progress and state up to date (and disarms a capture past its limit).
    fn settle(&self, s: &mut Session, now_ms: u64) {
        let st = &mut s.status;
        let t = self.ticket.load(Acquire);
        let left = if (t >> 32) as u32 == st.id {
            (t & u64::from(u32::MAX)) as u32
        } else {
            0
        };
        st.captured = st.count - left;
        st.overflow = self.overflow.load(Relaxed) - s.overflow_at_arm;
        st.left_ms = s.deadline_ms.saturating_sub(now_ms);
        if st.state != CaptureState::Armed {
            return;
        }
        let expired = now_ms > s.deadline_ms;
        if expired || s.stopped {
            let _ = self
                .armed
                .compare_exchange(st.target.route, 0, Release, Relaxed);
        }
        // Finished once every packet taken has been handed out (a worker may be between
        // taking the last ticket and queueing its packet for a few instructions).
        let all_read = st.delivered >= st.captured && self.ready.is_empty();
        st.state = if st.delivered == st.count {
            CaptureState::Done
        } else if s.stopped && all_read {
            CaptureState::Stopped
        } else if expired && all_read {
            CaptureState::Expired
        } else {
            CaptureState::Armed
        };
    }
}

fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(route: u64) -> Target {
        Target {
            route,
            channel: Channel::Forward,
            port: 20000,
            label: "cam".into(),
            dst: "127.0.0.1:20000".parse().unwrap(),
        }
    }

    fn src() -> SocketAddrV4 {
        "10.0.0.9:5000".parse().unwrap()
    }

    #[test]
    fn nothing_armed_wants_nothing() {
        let c = RefusalCapture::default();
        assert!(!c.wants(7));
        assert!(!c.is_armed());
        assert_eq!(c.drain(1, 10, 0), Err(CaptureError::Unknown(1)));
    }

    #[test]
    fn captures_exactly_n_of_the_armed_route_then_disarms() {
        let c = RefusalCapture::default();
        let st = c.arm(target(7), 3, 10_000, 1500, 100).unwrap();
        assert_eq!(st.state, CaptureState::Armed);
        assert!(c.wants(7) && !c.wants(8));
        for i in 0..5u8 {
            if c.wants(7) {
                c.record(7, src(), &[i; 40], DropReason::MediaInvalid, None, 101);
            }
        }
        assert!(!c.wants(7), "the third packet disarmed it");
        let (st, pkts) = c.drain(st.id, 100, 102).unwrap();
        assert_eq!(pkts.len(), 3);
        assert_eq!(
            pkts.iter().map(|p| p.payload[0]).collect::<Vec<_>>(),
            [0, 1, 2]
        );
        assert!(pkts
            .iter()
            .all(|p| p.payload.len() == 40 && p.orig_len == 40));
        assert_eq!(
            (st.state, st.captured, st.delivered),
            (CaptureState::Done, 3, 3)
        );
        assert_eq!(c.captured_total(), 3);
    }

    #[test]
    fn a_full_pool_counts_overflow_and_not_against_n() {
        let c = RefusalCapture::default();
        let n = POOL as u64 + 10;
        let st = c.arm(target(7), n, 10_000, 64, 0).unwrap();
        for _ in 0..POOL + 5 {
            c.record(7, src(), b"x", DropReason::NotRtp, None, 1);
        }
        assert_eq!(c.overflow_total(), 5);
        let (st2, pkts) = c.drain(st.id, usize::MAX, 2).unwrap();
        assert_eq!(pkts.len(), MAX_DRAIN, "one read is bounded");
        assert_eq!((st2.captured, st2.overflow), (POOL as u32, 5));
        assert!(c.wants(7), "still armed: 10 more wanted");
        // Read buffers are free again.
        c.record(7, src(), b"y", DropReason::NotRtp, None, 3);
        assert_eq!(c.overflow_total(), 5);
    }

    #[test]
    fn time_limit_disarms_and_long_packets_are_cut_to_snaplen() {
        let c = RefusalCapture::default();
        let st = c.arm(target(7), 10, 1000, 16, 0).unwrap();
        c.record(7, src(), &[9; 100], DropReason::SourceMismatch, None, 500);
        c.record(7, src(), &[9; 100], DropReason::SourceMismatch, None, 1001);
        assert!(!c.wants(7), "past the limit the data path disarms it");
        let (st, pkts) = c.drain(st.id, 10, 1002).unwrap();
        assert_eq!(pkts.len(), 1);
        assert_eq!((pkts[0].payload.len(), pkts[0].orig_len), (16, 100));
        assert_eq!(st.state, CaptureState::Expired);
    }

    #[test]
    fn one_capture_at_a_time_and_bounds() {
        let c = RefusalCapture::default();
        assert_eq!(
            c.arm(target(7), 0, 1000, 64, 0),
            Err(CaptureError::Count(0))
        );
        assert_eq!(
            c.arm(target(7), 10_001, 1000, 64, 0),
            Err(CaptureError::Count(10_001))
        );
        assert_eq!(c.arm(target(7), 1, 0, 64, 0), Err(CaptureError::Timeout(0)));
        let a = c.arm(target(7), 5, 1000, 64, 0).unwrap();
        assert!(matches!(
            c.arm(target(8), 5, 1000, 64, 1),
            Err(CaptureError::Busy { .. })
        ));
        // A packet refused under the first, read after a second was armed, is not handed
        // out under the second.
        c.record(7, src(), b"old", DropReason::NotRtp, None, 2);
        let st = c.stop(a.id, 3).unwrap();
        assert_eq!(st.state, CaptureState::Armed, "one packet still to read");
        assert!(!c.wants(7), "stopped: the data path captures no more");
        let (st, pkts) = c.drain(a.id, 10, 5).unwrap();
        assert_eq!((st.state, pkts.len()), (CaptureState::Stopped, 1));
        // A packet the data path took under the first capture and queued after the second
        // was armed is not handed out under the second.
        let late = c.take(7, b"late", 5).unwrap();
        let b = c.arm(target(7), 5, 1000, 64, 6).unwrap();
        c.commit(late, src(), DropReason::NotRtp, None);
        assert_ne!(a.id, b.id);
        assert_eq!(c.drain(a.id, 10, 7), Err(CaptureError::Unknown(a.id)));
        let (st, pkts) = c.drain(b.id, 10, 7).unwrap();
        assert_eq!(
            pkts.len(),
            1,
            "same route, taken a ticket of the second: its packet"
        );
        assert_eq!(st.captured, 1);
    }

    #[test]
    fn held_buffers_go_back_when_admitted() {
        let c = RefusalCapture::default();
        let st = c.arm(target(7), 1, 1000, 64, 0).unwrap();
        let h = c.take(7, b"admitted", 1).unwrap();
        c.give_back(h);
        let h = c.take(7, b"refused", 1).unwrap();
        c.commit(h, src(), DropReason::MediaStripped, None);
        let (st, pkts) = c.drain(st.id, 10, 2).unwrap();
        assert_eq!(pkts[0].payload, b"refused");
        assert_eq!(st.state, CaptureState::Done);
    }
}
