//! A stream route: what the data path needs to forward one gateway port's packets.
//!
//! Immutable after creation except for the latched source, the last-seen time and the
//! counters, which are atomics. The counters live in their own `Arc` outside the table entry,
//! so a session's final figures can be read after its routes are gone.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::SystemTime;

use crate::config::{DomainId, SourcePolicy};
use crate::stats::rtp::{RtpSnapshot, RtpTracker};
use crate::stats::{PacketCounters, Snapshot};

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
}

/// A copy of a route's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RouteSnapshot {
    pub packets: Snapshot,
    pub rtp: RtpSnapshot,
}

impl RouteStats {
    pub fn snapshot(&self) -> RouteSnapshot {
        RouteSnapshot {
            packets: self.packets.snapshot(),
            rtp: self.rtp.snapshot(),
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
    pub session: SessionId,
    pub label: Arc<str>,
    pub created: SystemTime,
    /// Packed source latched by the `latch` policy (0: none yet).
    latched: AtomicU64,
    /// [`crate::clock::now_ms`] of the last forwarded packet; 0: none yet.
    last_seen_ms: AtomicU64,
    pub stats: Arc<RouteStats>,
}

const LATCHED: u64 = 1 << 48;

fn pack(a: SocketAddrV4) -> u64 {
    LATCHED | (u64::from(u32::from(*a.ip())) << 16) | u64::from(a.port())
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
            session,
            label: spec.label.into(),
            created: SystemTime::now(),
            latched: AtomicU64::new(latched),
            last_seen_ms: AtomicU64::new(0),
            stats: Arc::new(RouteStats::default()),
        }
    }

    /// Whether a packet from `src` may be forwarded. Under `latch`, the first source that
    /// passes the expected-address check is kept (one compare-and-swap, once).
    #[inline]
    pub fn accepts(&self, src: SocketAddrV4) -> bool {
        match self.policy {
            SourcePolicy::Any => true,
            SourcePolicy::Strict => self.expected.is_some_and(|e| matches(e, src)),
            SourcePolicy::Latch => {
                let cur = self.latched.load(Relaxed);
                if cur != 0 {
                    return cur == pack(src);
                }
                if let Some(e) = self.expected {
                    if !matches(e, src) {
                        return false;
                    }
                }
                match self
                    .latched
                    .compare_exchange(0, pack(src), Relaxed, Relaxed)
                {
                    Ok(_) => true,
                    Err(now) => now == pack(src),
                }
            }
        }
    }

    /// The source this route is latched to, if any.
    pub fn latched(&self) -> Option<SocketAddrV4> {
        match self.latched.load(Relaxed) {
            0 => None,
            v => Some(unpack(v)),
        }
    }

    pub fn touch(&self, now_ms: u64) {
        self.last_seen_ms.store(now_ms, Relaxed);
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
        assert!(r.accepts(a("10.1.0.7:5000")));
        assert!(!r.accepts(a("10.1.0.7:5001")));
        assert!(!r.accepts(a("10.1.0.8:5000")));
        let any_port = route(SourcePolicy::Strict, Some("10.1.0.7:0"));
        assert!(any_port.accepts(a("10.1.0.7:9")));
        assert!(!any_port.accepts(a("10.1.0.9:9")));
        assert!(!route(SourcePolicy::Strict, None).accepts(a("10.1.0.7:5000")));
    }

    #[test]
    fn latch_keeps_the_first_source() {
        let r = route(SourcePolicy::Latch, None);
        assert_eq!(r.latched(), None);
        assert!(r.accepts(a("10.1.0.7:5000")));
        assert!(r.accepts(a("10.1.0.7:5000")));
        assert!(!r.accepts(a("10.1.0.8:5000")));
        assert_eq!(r.latched(), Some(a("10.1.0.7:5000")));
    }

    #[test]
    fn latch_within_expected_address() {
        let r = route(SourcePolicy::Latch, Some("10.1.0.7:0"));
        assert!(!r.accepts(a("10.1.0.8:1")));
        assert!(r.accepts(a("10.1.0.7:1234")));
        assert!(!r.accepts(a("10.1.0.7:1235")));
    }

    #[test]
    fn any_accepts_all_and_channels_map_domains() {
        assert!(route(SourcePolicy::Any, None).accepts(a("1.2.3.4:5")));
        assert_eq!(Channel::from_ingress(DomainId::B), Channel::Reverse);
        assert_eq!(Channel::Forward.egress(), DomainId::B);
    }
}
