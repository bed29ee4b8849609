//! The agent's event loop: one thread, one epoll, level-triggered; it owns the signaling
//! connection, the face sockets and the carried TCP streams (no lock on the path).
//!
//! Sockets and tokens:
//! - the signaling connection (`CONN`) and, on the listening half, a second connection that is
//!   still shaking hands (`PENDING`; it replaces the first once authenticated) and the
//!   listener (`LISTENER`);
//! - UDP face sockets bound to `(peer face, port)`: one per port the peer announced (its
//!   proxies listen there) and *mirrors* opened on demand for the source ports the peer's
//!   proxies send from (at most [`MAX_FACE_UDP`] in all; a mirror idle for [`MIRROR_IDLE`]
//!   is closed);
//! - TCP listeners on `(peer face, port)` for the peer's announced TCP ports, and the
//!   carried TCP streams (at most [`MAX_STREAMS`]).
//!
//! Frames carry ports only, never addresses: each half fills in its own two face addresses,
//! so nothing of one half's addressing crosses the link.
//!
//! This folder: `conn` (the signaling connection and the timers), `peer` (frames from the
//! peer), `face` (the face sockets and carried streams), `sock` (socket helpers); this file
//! holds the loop's state and its dispatch.

use std::collections::HashMap;
use std::net::TcpListener;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};

use crate::signaling::split::frame::Role;
use crate::signaling::split::stats::SignalStats;
use crate::signaling::split::{AgentConfig, PeerEvents};

mod conn;
mod face;
mod peer;
mod sock;

use conn::Conn;
use face::{FaceUdp, Stream};
#[cfg(test)]
pub(super) use sock::connect_from;
use sock::{bind_device, random};

/// UDP face sockets open at once (announced + mirrors).
pub const MAX_FACE_UDP: usize = 256;
/// A mirror socket unused this long is closed.
pub const MIRROR_IDLE: Duration = Duration::from_secs(300);
/// TCP streams carried at once.
pub const MAX_STREAMS: usize = 512;
/// Unsent bytes on the signaling connection before datagrams are dropped and streams closed.
pub const MAX_OUT: usize = 8 << 20;
/// Unsent bytes towards one local TCP peer before the stream is closed.
pub const MAX_STREAM_PENDING: usize = 4 << 20;
/// How long a new connection may take to authenticate.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Datagrams, accepts or reads per socket per wakeup.
const BATCH: usize = 32;

const LISTENER: u64 = 1;
const CONN: u64 = 2;
const PENDING: u64 = 3;
const T_UDP: u64 = 1 << 40;
const T_TCPL: u64 = 2 << 40;
const T_STREAM: u64 = 3 << 40;
const T_MASK: u64 = 0xff << 40;
/// Stream ids opened by the listening half have this bit.
const LISTENER_STREAM: u32 = 1 << 31;

pub(super) struct Loop {
    cfg: AgentConfig,
    events: Box<dyn PeerEvents>,
    pub stats: Arc<SignalStats>,
    stop: Arc<AtomicBool>,
    announce: Arc<Mutex<(Vec<u16>, Vec<u16>)>>,
    announce_gen: Arc<AtomicU64>,
    sent_gen: u64,
    epoll: Epoll,
    instance: [u8; 16],
    listener: Option<TcpListener>,
    conns: [Option<Conn>; 2],
    next_dial: Instant,
    peer_instance: Option<[u8; 16]>,
    peer_up: bool,
    /// Sessions were ended for the current outage (or no peer was ever seen).
    lost: bool,
    /// A pair's standby: holds no link ([`PeerEvents::standby`], read at every tick).
    standby: bool,
    last_rx: Instant,
    down_since: Instant,
    udp: HashMap<u16, FaceUdp>,
    tcp_listeners: HashMap<u16, TcpListener>,
    streams: HashMap<u32, Stream>,
    next_stream: u32,
    buf: Vec<u8>,
    last_sweep: Instant,
}

impl Loop {
    pub(super) fn new(
        cfg: AgentConfig,
        events: Box<dyn PeerEvents>,
        stats: Arc<SignalStats>,
        stop: Arc<AtomicBool>,
        announce: Arc<Mutex<(Vec<u16>, Vec<u16>)>>,
        announce_gen: Arc<AtomicU64>,
    ) -> std::io::Result<Loop> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        let listener = match cfg.role {
            Role::Listener => {
                let l = TcpListener::bind(cfg.link.local)?;
                bind_device(&l, &cfg.link.interface, "signaling")?;
                l.set_nonblocking(true)?;
                epoll.add(l.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, LISTENER))?;
                Some(l)
            }
            Role::Dialer => None,
        };
        let now = Instant::now();
        let standby = events.standby();
        Ok(Loop {
            cfg,
            events,
            stats,
            stop,
            announce,
            announce_gen,
            sent_gen: 0,
            epoll,
            instance: random(),
            listener,
            conns: [None, None],
            next_dial: now,
            peer_instance: None,
            peer_up: false,
            lost: true,
            standby,
            last_rx: now,
            down_since: now,
            udp: HashMap::new(),
            tcp_listeners: HashMap::new(),
            streams: HashMap::new(),
            next_stream: 1,
            buf: vec![0u8; 65_536],
            last_sweep: now,
        })
    }

    pub(super) fn run(mut self) {
        let mut events = [EpollEvent::empty(); 64];
        let tick = (self.cfg.link.heartbeat / 4)
            .clamp(Duration::from_millis(10), Duration::from_millis(100));
        let tick_ms = tick.as_millis() as u16;
        while !self.stop.load(Relaxed) {
            let n = match self.epoll.wait(&mut events, EpollTimeout::from(tick_ms)) {
                Ok(n) => n,
                Err(Errno::EINTR) => 0,
                Err(e) => {
                    tracing::error!("split signaling agent: epoll failed ({e}); the agent stops");
                    break;
                }
            };
            for ev in &events[..n] {
                self.dispatch(ev.data(), ev.events());
            }
            self.timers();
            self.flush_conns();
        }
        self.goodbye();
    }

    fn dispatch(&mut self, token: u64, flags: EpollFlags) {
        match token {
            LISTENER => self.accept_conn(),
            CONN => self.conn_event(0, flags),
            PENDING => self.conn_event(1, flags),
            t if t & T_MASK == T_UDP => self.face_udp_readable((t & 0xffff) as u16),
            t if t & T_MASK == T_TCPL => self.face_tcp_accept((t & 0xffff) as u16),
            t if t & T_MASK == T_STREAM => self.stream_event(t as u32, flags),
            _ => {}
        }
    }
}
