//! A stream route: what the data path needs to forward one gateway port's packets.
//!
//! Immutable after creation except for the latched source, the last-seen time and the
//! counters, which are atomics. The counters live in their own `Arc` outside the table entry,
//! so a session's final figures can be read after its routes are gone.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::SystemTime;

use crate::config::{DomainId, SourcePolicy};
use crate::stats::media::{MediaCounters, MediaSnapshot};
use crate::stats::rtp::{RtpSnapshot, RtpTracker};
use crate::stats::{bump_only_writer as bump, PacketCounters, Snapshot};

/// A one-way channel: the direction media crosses the gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Channel {
    /// A → B: from the video private network to the users.
    Forward,
    /// B → A: talkback, broadcast, receiver reports.
    Reverse,
}

impl Channel {
    pub const ALL: [Channel; 2] = [Channel::Forward, Channel::Reverse];

    /// The channel carrying media that arrives from `domain`.
    pub fn from_ingress(domain: DomainId) -> Channel {
        match domain {
            DomainId::A => Channel::Forward,
            DomainId::B => Channel::Reverse,
        }
    }

    pub fn ingress(self) -> DomainId {
        match self {
            Channel::Forward => DomainId::A,
            Channel::Reverse => DomainId::B,
        }
    }

    pub fn egress(self) -> DomainId {
        self.ingress().other()
    }

    pub fn index(self) -> usize {
        self as usize
    }

    pub fn name(self) -> &'static str {
        match self {
            Channel::Forward => "forward",
            Channel::Reverse => "reverse",
        }
    }
}

impl std::fmt::Display for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Identifies a session (the owner of ports and routes).
pub type SessionId = u64;

/// Counters of one route.
#[derive(Debug, Default)]
pub struct RouteStats {
    pub packets: PacketCounters,
    pub rtp: RtpTracker,
    /// A split half's route from the link face: what the incoming one-way link handed it.
    pub link: LinkStreamCounters,
    /// Media validation violations by reason (routes with a [`crate::media::Rule`]).
    pub media: MediaCounters,
}

/// Per stream on a split half's incoming link (version 2 link header: every datagram carries
/// its route's sequence number from the sending half). Counted after the reorder window, FEC
/// and fragment reassembly: `received` as sent, `repaired` (rebuilt by FEC, or joined from
/// fragments one of which was), `lost` (sequence numbers that never came: exact, but a loss
/// before the stream's first datagram here or after its last cannot be seen), `late` (came
/// after a later one and was counted lost meanwhile: taken off `lost`; one from before the
/// stream's first datagram here was never counted lost, so it is neither), `duplicate`, and
/// `restarts` (the sequence jumped by [`LINK_SEQ_RESYNC`] or more: the sending route was
/// made anew or its half restarted; or the datagrams now come from another source port: a
/// second sending route toward the same port, whose sequence is its own; no loss counted
/// for either).
///
/// Single writer (the link's receive worker), so the state is plain loads and stores.
#[derive(Debug, Default)]
pub struct LinkStreamCounters {
    received: AtomicU64,
    repaired: AtomicU64,
    lost: AtomicU64,
    late: AtomicU64,
    duplicate: AtomicU64,
    restarts: AtomicU64,
    /// Highest sequence seen, and bit `i` of `window`: `highest - i` arrived.
    highest: AtomicU32,
    window: AtomicU64,
    /// The stream's first sequence here, kept within [`LINK_SEQ_RESYNC`] of `highest`
    /// (nothing further back can count late anyway): older ones were never counted lost.
    first: AtomicU32,
    /// The sending route's source port (the stream is per route and source).
    src: AtomicU32,
    started: AtomicBool,
}

/// A per-stream sequence this far from the highest seen, either way, is a new sender, not a
/// loss or a late datagram.
pub const LINK_SEQ_RESYNC: u32 = 1 << 16;

/// A copy of [`LinkStreamCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStreamSnapshot {
    pub received: u64,
    pub repaired: u64,
    pub lost: u64,
    pub late: u64,
    pub duplicate: u64,
    pub restarts: u64,
}

impl LinkStreamCounters {
    /// One datagram from the link from source port `src` with the sending route's sequence
    /// `seq`: `repaired` when FEC rebuilt it (or a fragment of it). `false` for a duplicate,
    /// which the caller drops.
    pub fn count(&self, src: u16, seq: u32, repaired: bool) -> bool {
        let fresh = self.track(u32::from(src), seq);
        if fresh {
            bump(
                if repaired {
                    &self.repaired
                } else {
                    &self.received
                },
                1,
            );
        }
        fresh
    }

    fn track(&self, src: u32, seq: u32) -> bool {
        let high = self.highest.load(Relaxed);
        let ahead = seq.wrapping_sub(high);
        let behind = high.wrapping_sub(seq);
        let started = self.started.load(Relaxed);
        if !started
            || self.src.load(Relaxed) != src
            || (ahead >= LINK_SEQ_RESYNC && behind >= LINK_SEQ_RESYNC)
        {
            if started {
                bump(&self.restarts, 1);
            }
            self.started.store(true, Relaxed);
            self.src.store(src, Relaxed);
            self.highest.store(seq, Relaxed);
            self.first.store(seq, Relaxed);
            self.window.store(1, Relaxed);
            return true;
        }
        let window = self.window.load(Relaxed);
        if ahead != 0 && ahead < LINK_SEQ_RESYNC {
            bump(&self.lost, u64::from(ahead - 1));
            let shifted = if ahead >= 64 { 0 } else { window << ahead };
            self.window.store(shifted | 1, Relaxed);
            self.highest.store(seq, Relaxed);
            if seq.wrapping_sub(self.first.load(Relaxed)) > LINK_SEQ_RESYNC {
                self.first.store(seq.wrapping_sub(LINK_SEQ_RESYNC), Relaxed);
            }
            return true;
        }
        // At or behind the highest.
        if behind < 64 {
            let bit = 1u64 << behind;
            if window & bit != 0 {
                bump(&self.duplicate, 1);
                return false;
            }
            self.window.store(window | bit, Relaxed);
        }
        if behind > high.wrapping_sub(self.first.load(Relaxed)) {
            // Before the stream's first here: never counted lost, so not late either.
            return true;
        }
        // Counted lost when the gap opened (further back than the window remembers: taken
        // as late all the same; a duplicate that old is not told apart).
        bump(&self.late, 1);
        let lost = self.lost.load(Relaxed);
        self.lost.store(lost.saturating_sub(1), Relaxed);
        true
    }

    pub fn snapshot(&self) -> LinkStreamSnapshot {
        LinkStreamSnapshot {
            received: self.received.load(Relaxed),
            repaired: self.repaired.load(Relaxed),
            lost: self.lost.load(Relaxed),
            late: self.late.load(Relaxed),
            duplicate: self.duplicate.load(Relaxed),
            restarts: self.restarts.load(Relaxed),
        }
    }
}

/// A copy of a route's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RouteSnapshot {
    pub packets: Snapshot,
    pub rtp: RtpSnapshot,
    pub link: LinkStreamSnapshot,
    pub media: MediaSnapshot,
}

impl RouteStats {
    pub fn snapshot(&self) -> RouteSnapshot {
        RouteSnapshot {
            packets: self.packets.snapshot(),
            rtp: self.rtp.snapshot(),
            link: self.link.snapshot(),
            media: self.media.snapshot(),
        }
    }
}

/// What the caller asks for when adding a route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteSpec {
    /// Domain the media arrives from (so the channel).
    pub ingress: DomainId,
    /// Gateway port in `ingress` receiving the media; the table key.
    pub port: u16,
    /// Receiver in the other domain.
    pub dest: SocketAddrV4,
    /// Gateway port in the other domain the media leaves from.
    pub egress_port: u16,
    pub policy: SourcePolicy,
    /// Expected source; port 0 matches any port of the address.
    pub expected: Option<SocketAddrV4>,
    pub rtp_only: bool,
    /// Human name shown in listings and logs.
    pub label: String,
    /// Validate the route's media against what was negotiated ([`crate::media`]); `None`:
    /// not validated.
    pub media: Option<crate::media::Rule>,
}

/// A live route in a stream table.
#[derive(Debug)]
pub struct StreamRoute {
    pub channel: Channel,
    pub port: u16,
    pub dest: SocketAddrV4,
    pub egress_port: u16,
    pub policy: SourcePolicy,
    pub expected: Option<SocketAddrV4>,
    pub rtp_only: bool,
    /// What the media validator checks on this route; `None`: not validated.
    pub media: Option<crate::media::Rule>,
    /// Unique for the process's life (never reused, unlike the port or the allocation):
    /// what a worker's per-stream validator state is keyed by.
    pub id: u64,
    pub session: SessionId,
    pub label: Arc<str>,
    pub created: SystemTime,
    /// Packed source latched by the `latch` policy (0: none yet).
    latched: AtomicU64,
    /// Under `latch`: how long the latched source must have been silent (nothing forwarded)
    /// before another source may take the route; 0: never.
    relatch_after_ms: u64,
    /// [`crate::clock::now_ms`] of the last forwarded packet; 0: none yet.
    last_seen_ms: AtomicU64,
    /// [`crate::clock::now_ms`] when the route was created.
    created_ms: u64,
    /// [`crate::clock::now_ms`] of the first admitted packet, set once; 0: none yet.
    first_ms: AtomicU64,
    /// Whether the time to its first packet was already counted (see
    /// [`StreamRoute::take_first_packet`]); set from the start on routes not installed by
    /// signaling, whose first packet is not timed.
    first_counted: AtomicBool,
    timed_kind: Option<super::SessionKind>,
    pub stats: Arc<RouteStats>,
    /// When the receiver is a stream leg the gateway terminates ([`crate::edge`]): engines
    /// offer admitted packets to it instead of sending them to `dest`.
    pub edge: Option<Arc<crate::sink::EdgeSink>>,
    /// A split half: the next link stream sequence of this route's datagrams down the
    /// outgoing link (starts at random, so a route made anew is told apart by the receiver).
    /// One worker normally sends a route; an atomic keeps it right when two do.
    link_seq: AtomicU32,
    /// The hot-standby gate shared by every route of the tables ([`super::Routes::set_standby`]):
    /// set, the node is a standby and [`crate::channel::inspect`] drops with `standby`.
    standby: Arc<AtomicBool>,
}

const LATCHED: u64 = 1 << 48;

/// The next [`StreamRoute::id`]; 0 is never one.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub use crate::config::DEFAULT_RELATCH_AFTER_MS;

/// What [`StreamRoute::check_source`] says of a packet's source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceCheck {
    /// The expected or latched source (or any source under `any`).
    Known,
    /// Not latched yet, or the latched source has fallen silent: `src` may take the route,
    /// but only once the packet passed every other check ([`StreamRoute::latch`]). Holds
    /// the latch value seen, for the compare-and-swap.
    Candidate(u64),
    /// Refused: `source_mismatch`.
    Refused,
}

fn pack(a: SocketAddrV4) -> u64 {
    LATCHED | (u64::from(u32::from(*a.ip())) << 16) | u64::from(a.port())
}

/// From the OS's randomness; 0 when it has none (a new route then looks like a restart only
/// when its sequence is far from the old one's).
fn random_u32() -> u32 {
    let mut b = [0u8; 4];
    let _ = getrandom::fill(&mut b);
    u32::from_ne_bytes(b)
}

fn unpack(v: u64) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::from((v >> 16) as u32), v as u16)
}

impl StreamRoute {
    pub fn new(spec: RouteSpec, session: SessionId) -> StreamRoute {
        let latched = match (spec.policy, spec.expected) {
            (SourcePolicy::Latch, Some(e)) if e.port() != 0 => pack(e),
            _ => 0,
        };
        StreamRoute {
            channel: Channel::from_ingress(spec.ingress),
            port: spec.port,
            dest: spec.dest,
            egress_port: spec.egress_port,
            policy: spec.policy,
            expected: spec.expected,
            rtp_only: spec.rtp_only,
            media: spec.media,
            id: NEXT_ID.fetch_add(1, Relaxed),
            session,
            label: spec.label.into(),
            created: SystemTime::now(),
            latched: AtomicU64::new(latched),
            relatch_after_ms: DEFAULT_RELATCH_AFTER_MS,
            last_seen_ms: AtomicU64::new(0),
            created_ms: crate::clock::now_ms(),
            first_ms: AtomicU64::new(0),
            first_counted: AtomicBool::new(true),
            timed_kind: None,
            stats: Arc::new(RouteStats::default()),
            edge: None,
            link_seq: AtomicU32::new(random_u32()),
            standby: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Shares the tables' hot-standby gate with this route.
    pub fn with_standby_gate(mut self, gate: Arc<AtomicBool>) -> StreamRoute {
        self.standby = gate;
        self
    }

    /// Whether this node is a standby (nothing may be forwarded).
    #[inline]
    pub fn standby(&self) -> bool {
        self.standby.load(Relaxed)
    }

    /// Sets the latched source as another node saw it (the standby's copy of an active's
    /// route, [`crate::ha`]); `None` un-latches. Not for the data path.
    pub fn set_latched(&self, source: Option<SocketAddrV4>) {
        self.latched.store(source.map_or(0, pack), Relaxed);
    }

    /// The link stream sequence for the route's next datagram down the outgoing link.
    pub fn next_link_seq(&self) -> u32 {
        self.link_seq.fetch_add(1, Relaxed)
    }

    /// Times this route's first packet ([`StreamRoute::take_first_packet`]): for routes a
    /// signaling session installs.
    pub fn with_first_packet_timing(mut self, kind: super::SessionKind) -> StreamRoute {
        self.first_counted.store(false, Relaxed);
        self.timed_kind = Some(kind);
        self
    }

    /// Hands this route's admitted packets to a stream leg's sink instead of `dest`.
    pub fn with_edge(mut self, edge: Option<Arc<crate::sink::EdgeSink>>) -> StreamRoute {
        self.edge = edge;
        self
    }

    /// The kind of session whose installation starts this route's first-packet timer.
    pub fn timed_kind(&self) -> Option<super::SessionKind> {
        self.timed_kind
    }

    /// The re-latch silence of this route (see [`DEFAULT_RELATCH_AFTER_MS`]); 0: never.
    pub fn with_relatch_after(mut self, ms: u64) -> StreamRoute {
        self.relatch_after_ms = ms;
        self
    }

    /// What the source check says of a packet from `src` at `now_ms` ([`crate::clock`]).
    /// Under `latch` a source that passes the expected-address check is a candidate when
    /// nothing is latched yet, or when the latched source has forwarded nothing for the
    /// re-latch time; it takes the route only through [`StreamRoute::latch`].
    #[inline]
    pub fn check_source(&self, src: SocketAddrV4, now_ms: u64) -> SourceCheck {
        let known = match self.policy {
            SourcePolicy::Any => true,
            SourcePolicy::Strict => self.expected.is_some_and(|e| matches(e, src)),
            SourcePolicy::Latch => {
                if self.expected.is_some_and(|e| !matches(e, src)) {
                    return SourceCheck::Refused;
                }
                let cur = self.latched.load(Relaxed);
                if cur == pack(src) {
                    return SourceCheck::Known;
                }
                if cur == 0 {
                    return SourceCheck::Candidate(0);
                }
                let silent = now_ms.saturating_sub(self.last_seen_ms.load(Relaxed));
                if self.relatch_after_ms != 0 && silent >= self.relatch_after_ms {
                    return SourceCheck::Candidate(cur);
                }
                false
            }
        };
        if known {
            SourceCheck::Known
        } else {
            SourceCheck::Refused
        }
    }

    /// Latches `src` in place of `seen` (the value [`SourceCheck::Candidate`] carried) and
    /// marks the route alive at `now_ms`, so no other source can take it in the same breath.
    /// `Some(true)`: a re-latch (another source was latched before); `None` when another
    /// worker latched a different source first.
    #[inline]
    pub fn latch(&self, seen: u64, src: SocketAddrV4, now_ms: u64) -> Option<bool> {
        let new = pack(src);
        match self.latched.compare_exchange(seen, new, Relaxed, Relaxed) {
            Ok(_) => {
                self.last_seen_ms.store(now_ms, Relaxed);
                self.mark_first(now_ms);
                Some(seen != 0)
            }
            Err(now) if now == new => Some(false),
            Err(_) => None,
        }
    }

    /// The source this route is latched to, if any.
    pub fn latched(&self) -> Option<SocketAddrV4> {
        match self.latched.load(Relaxed) {
            0 => None,
            v => Some(unpack(v)),
        }
    }

    /// Marks the route alive: call only when a packet passed every check (a route whose
    /// packets are all rejected must time out).
    pub fn touch(&self, now_ms: u64) {
        self.last_seen_ms.store(now_ms, Relaxed);
        self.mark_first(now_ms);
    }

    /// Sets the first-packet mark once: a relaxed load per batch, a store only the first time.
    #[inline]
    fn mark_first(&self, now_ms: u64) {
        if self.first_ms.load(Relaxed) == 0 {
            let _ = self
                .first_ms
                .compare_exchange(0, now_ms.max(1), Relaxed, Relaxed);
        }
    }

    /// Time from the route's creation to its first admitted packet, returned once (to the
    /// one caller that counts it); `None` before the first packet and after it was taken.
    /// Not for the data path: the metrics and the route's removal call it.
    pub fn take_first_packet(&self) -> Option<std::time::Duration> {
        let first = self.first_ms.load(Relaxed);
        if first == 0 || self.first_counted.swap(true, Relaxed) {
            return None;
        }
        Some(std::time::Duration::from_millis(
            first.saturating_sub(self.created_ms),
        ))
    }

    /// When the last packet was forwarded ([`crate::clock::now_ms`]), if any was.
    pub fn last_seen_ms(&self) -> Option<u64> {
        match self.last_seen_ms.load(Relaxed) {
            0 => None,
            v => Some(v),
        }
    }
}

fn matches(expected: SocketAddrV4, src: SocketAddrV4) -> bool {
    expected.ip() == src.ip() && (expected.port() == 0 || expected.port() == src.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(policy: SourcePolicy, expected: Option<&str>) -> StreamRoute {
        StreamRoute::new(
            RouteSpec {
                ingress: DomainId::A,
                port: 20000,
                dest: "10.2.0.5:4000".parse().unwrap(),
                egress_port: 30000,
                policy,
                expected: expected.map(|e| e.parse().unwrap()),
                rtp_only: false,
                label: "t".into(),
                media: None,
            },
            1,
        )
    }

    fn a(s: &str) -> SocketAddrV4 {
        s.parse().unwrap()
    }

    #[test]
    fn strict_accepts_only_the_expected_source() {
        let r = route(SourcePolicy::Strict, Some("10.1.0.7:5000"));
        assert!(admit(&r, a("10.1.0.7:5000"), 1));
        assert!(!admit(&r, a("10.1.0.7:5001"), 1));
        assert!(!admit(&r, a("10.1.0.8:5000"), 1));
        let any_port = route(SourcePolicy::Strict, Some("10.1.0.7:0"));
        assert!(admit(&any_port, a("10.1.0.7:9"), 1));
        assert!(!admit(&any_port, a("10.1.0.9:9"), 1));
        assert!(!admit(
            &route(SourcePolicy::Strict, None),
            a("10.1.0.7:5000"),
            1
        ));
    }

    /// The source check and latch as `inspect` does them, for a packet that passed every
    /// other check.
    fn admit(r: &StreamRoute, src: SocketAddrV4, now: u64) -> bool {
        match r.check_source(src, now) {
            SourceCheck::Known => {
                r.touch(now);
                true
            }
            SourceCheck::Candidate(seen) => r.latch(seen, src, now).is_some(),
            SourceCheck::Refused => false,
        }
    }

    #[test]
    fn latch_keeps_a_live_source_and_moves_after_silence() {
        let r = route(SourcePolicy::Latch, None);
        assert_eq!(r.latched(), None);
        assert_eq!(
            r.check_source(a("10.1.0.7:5000"), 1000),
            SourceCheck::Candidate(0)
        );
        assert_eq!(r.latched(), None, "checking does not latch");
        assert!(admit(&r, a("10.1.0.7:5000"), 1000));
        assert!(admit(&r, a("10.1.0.7:5000"), 2500));
        assert!(
            !admit(&r, a("10.1.0.8:5000"), 4000),
            "1.5 s of silence is not enough"
        );
        assert_eq!(r.latched(), Some(a("10.1.0.7:5000")));
        assert!(
            admit(&r, a("10.1.0.8:5000"), 4500),
            "2 s of silence: re-latch"
        );
        assert_eq!(r.latched(), Some(a("10.1.0.8:5000")));
        assert!(
            !admit(&r, a("10.1.0.7:5000"), 4501),
            "the old source is now refused"
        );
        let never = route(SourcePolicy::Latch, None).with_relatch_after(0);
        assert!(admit(&never, a("10.1.0.7:5000"), 1000));
        assert!(!admit(&never, a("10.1.0.8:5000"), 1_000_000));
    }

    #[test]
    fn latch_within_expected_address() {
        let r = route(SourcePolicy::Latch, Some("10.1.0.7:0"));
        assert!(!admit(&r, a("10.1.0.8:1"), 1000));
        assert!(admit(&r, a("10.1.0.7:1234"), 1000));
        assert!(!admit(&r, a("10.1.0.7:1235"), 1000));
        assert!(
            !admit(&r, a("10.1.0.8:1"), 9000),
            "never outside the expected address"
        );
        assert!(admit(&r, a("10.1.0.7:1235"), 9000));
    }

    #[test]
    fn any_accepts_all_and_channels_map_domains() {
        assert!(admit(&route(SourcePolicy::Any, None), a("1.2.3.4:5"), 1));
        assert_eq!(Channel::from_ingress(DomainId::B), Channel::Reverse);
        assert_eq!(Channel::Forward.egress(), DomainId::B);
    }

    /// Exact per-stream loss from the link stream sequence: gaps, late arrivals taken off,
    /// duplicates refused, wrapping, and a new sender (a jump) not counted as loss.
    #[test]
    fn link_stream_sequence() {
        let c = LinkStreamCounters::default();
        let base = u32::MAX - 3; // wraps
        let fresh: Vec<bool> = [0u32, 1, 2, 5, 6, 4, 4, 9, 3, 10]
            .iter()
            .map(|&i| c.count(6000, base.wrapping_add(i), i == 6))
            .collect();
        assert_eq!(
            fresh,
            [true, true, true, true, true, true, false, true, true, true]
        );
        let s = c.snapshot();
        // Sent 0..=10; never came: 7, 8. 4 came late (once; its second copy a duplicate),
        // 3 came late.
        assert_eq!(
            (
                s.received,
                s.repaired,
                s.lost,
                s.late,
                s.duplicate,
                s.restarts
            ),
            (8, 1, 2, 2, 1, 0)
        );
        // Further back than the window remembers: late all the same.
        let c = LinkStreamCounters::default();
        c.count(6000, 0, false);
        c.count(6000, 200, false);
        assert_eq!(c.snapshot().lost, 199);
        assert!(c.count(6000, 100, false));
        assert_eq!((c.snapshot().lost, c.snapshot().late), (198, 1));
        // A new sender far away: a restart, no loss; then counting goes on from it.
        assert!(c.count(6000, 7_000_000, false));
        assert!(c.count(6000, 7_000_002, false));
        let s = c.snapshot();
        assert_eq!((s.restarts, s.lost, s.received), (1, 199, 5));

        // Before the stream's first datagram here: neither late nor lost (it was never
        // counted lost); a duplicate of it still refused.
        let c = LinkStreamCounters::default();
        assert!(c.count(6000, 10, false));
        assert!(c.count(6000, 12, false));
        assert!(c.count(6000, 8, false));
        assert!(!c.count(6000, 8, false));
        assert!(c.count(6000, 11, false));
        let s = c.snapshot();
        assert_eq!((s.received, s.lost, s.late, s.duplicate), (4, 0, 1, 1));
        // Far along, the first is forgotten: a datagram far behind counts late as before.
        let c = LinkStreamCounters::default();
        for i in 0..4u32 {
            assert!(c.count(6000, i * (LINK_SEQ_RESYNC - 1), false));
        }
        let high = 3 * (LINK_SEQ_RESYNC - 1);
        assert!(c.count(6000, high - 100, false));
        let s = c.snapshot();
        assert_eq!((s.late, s.restarts), (1, 0));

        // Two sending routes toward one port (their own sequences): each change of source
        // port is a restart, no loss, no late.
        let c = LinkStreamCounters::default();
        for (src, seq) in [(6000, 5), (6000, 6), (6002, 900), (6002, 901), (6000, 7)] {
            assert!(c.count(src, seq, false));
        }
        let s = c.snapshot();
        assert_eq!((s.received, s.lost, s.late, s.restarts), (5, 0, 0, 2));
        // Two routes start apart.
        let r1 = route(SourcePolicy::Any, None);
        let a = r1.next_link_seq();
        assert_eq!(r1.next_link_seq(), a.wrapping_add(1));
    }
}
