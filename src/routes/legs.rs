//! TCP media legs as the tables and the signaling see them: what a leg is asked to be
//! ([`LegSpec`]), how to start one or inject into a route ([`Legs`], implemented by `edge`
//! over the engine's ports, so signaling never imports the data path), and the live legs
//! for listings and metrics ([`LegTable`], [`LegCounters`]). The legs themselves (sockets,
//! threads) are `edge`'s. Control side only: nothing here is called per packet except
//! [`Inject::forward_batch`], once per read.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::config::DomainId;
use crate::sink::EdgeSink;
pub use crate::stats::leg::{LegCounters, LegState};
use crate::stats::Tally;
use crate::wire::framing::Framing;

use super::{SessionId, StreamRoute};

/// Stream legs as the signaling proxies use them: start a TCP media leg, or get an injector
/// for the frames of a TCP connection the proxy reads itself (RTSP interleaved). Implemented
/// by `edge` over the engine's ports; chosen once at start (`gateway`).
pub trait Legs: Send + Sync {
    /// Starts a leg. A passive leg listens before this returns, so the SDP naming its port
    /// may go out at once.
    fn start(&self, spec: LegSpec) -> Result<Box<dyn LegHandle>, LegError>;
    /// The TCP → UDP side for packets from a leg in `domain` whose gateway port is `port`:
    /// each checked as a datagram arriving there would be.
    fn injector(&self, domain: DomainId, port: u16, max_payload: usize) -> Box<dyn Inject>;
}

/// A running leg; dropping it stops it.
pub trait LegHandle: Send + Sync + std::fmt::Debug {
    /// A passive leg started before an SDP named its peer accepts only `addr` from now on.
    /// A connection already taken from another address is dropped (counted as refused).
    fn expect_peer(&self, addr: Ipv4Addr);
    /// The sink an engine offers this leg's packets to (for the route whose receiver it is).
    fn sink(&self) -> &Arc<EdgeSink>;
    fn counters(&self) -> &Arc<LegCounters>;
    fn id(&self) -> u64;
}

/// Puts de-framed packets into the route keyed by a leg's gateway port, as the engines do
/// with datagrams that arrive there.
pub trait Inject: Send {
    /// The route for the next batch of frames (one lookup per read, not per frame).
    fn route(&self) -> Option<Arc<StreamRoute>>;
    /// The packets of one read, from `from`, for `route` (from [`Inject::route`]): the
    /// payloads at `frames` in `buf`, each checked as a datagram would be, the admitted ones
    /// sent on, one send per batch.
    fn forward_batch(
        &mut self,
        route: Option<&StreamRoute>,
        from: SocketAddrV4,
        buf: &[u8],
        frames: &[Range<usize>],
        now: u64,
        t: &mut Tally,
    );
    /// Ends a batch: the route's counters once, and the route kept alive if anything passed.
    fn finish(&mut self, route: Option<&StreamRoute>, t: &Tally, now: u64);
}

/// Who opens the TCP connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The gateway listens on its end; only the peer's address may connect, once.
    Passive,
    /// The gateway connects from its end to the peer, retrying until `connect_for` ends.
    Active,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Passive => "passive",
            Role::Active => "active",
        }
    }
}

/// What a leg is asked to be.
pub struct LegSpec {
    pub label: String,
    pub session: SessionId,
    pub domain: DomainId,
    pub role: Role,
    /// The gateway's end: its address in `domain` and the gateway port written in the SDP.
    /// It is also the route key for what the peer sends.
    pub local: SocketAddrV4,
    /// The peer the SDP named (passive: only its address is checked; unspecified while no
    /// SDP has named it yet, see [`LegHandle::expect_peer`]).
    pub peer: SocketAddrV4,
    /// Passive, while the peer's address is unknown: a connection from any address of this
    /// domain is taken (the listener is on the domain's address and interface anyway).
    pub within: Option<crate::config::Domain>,
    /// The domain's interface: the leg's sockets are tied to it, as the media ports are.
    pub interface: Option<String>,
    pub framing: Box<dyn Framing>,
    /// The longest packet either way: frames from the peer (longer ones are skipped) and
    /// packets the engines offer to the sink (`Config::leg_max_payload`).
    pub max_payload: usize,
    /// Small (2 KiB) sink buffers ([`crate::sink::DEFAULT_SLOTS`]); the large ones are
    /// [`crate::sink::LARGE_SLOTS`], made only when `max_payload` is longer than 2 KiB.
    pub slots: usize,
    /// Active: how long to keep trying to connect.
    pub connect_for: Duration,
    /// Active: another port of the gateway's address, from the port registry (so no other
    /// leg or media port has it), to connect from while `local`'s port cannot be used (the
    /// old connection of a reconnect still exists or lingers in TIME_WAIT). `None`: only
    /// `local`'s port, retried until `connect_for` ends.
    pub fallback_port: Option<u16>,
    /// Called once, from the leg's thread, when the leg ends by itself (not when dropped).
    pub on_close: Option<Box<dyn FnOnce() + Send>>,
    /// After the peer closed: how long the leg waits (passive: listening for the peer's new
    /// connection; active: for its owner to replace it) before it ends. Zero: at once.
    pub close_grace: Duration,
}

/// Why a leg could not be made.
#[derive(Debug, thiserror::Error)]
pub enum LegError {
    #[error("cannot listen for the {domain} TCP media leg on {addr}: {source}; free the port or widen the domain's port range")]
    Listen {
        domain: DomainId,
        addr: SocketAddrV4,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot tie the {domain} TCP media leg to its interface: {source}; check the domain's interface name and CAP_NET_RAW")]
    Device {
        domain: DomainId,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the TCP media leg's thread or its wake-up eventfd: {0}; the host is out of threads or descriptors")]
    Resources(#[source] std::io::Error),
}

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
                (&c.reconnects, &e.reconnects),
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
    pub fn totals(&self) -> [(&'static str, u64); 14] {
        let mut t = self.ended.named();
        for l in self.list() {
            for (acc, (_, v)) in t.iter_mut().zip(l.counters.named()) {
                acc.1 += v;
            }
        }
        t
    }
}
