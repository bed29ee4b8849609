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

use std::collections::{HashMap, HashSet};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::socket::{self, sockopt, AddressFamily, SockFlag, SockType, SockaddrIn};

use super::frame::{Frame, FrameError, Hello, Keys, Opener, Role, Sealer, HELLO_LEN, TCP_CHUNK};
use super::stats::SignalStats;
use super::{AgentConfig, PeerEvents};

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

fn random<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    if getrandom::fill(&mut b).is_err() {
        // No entropy source at all: the kernel is broken; a predictable nonce would let a
        // recorded connection be replayed, so refuse to go on.
        panic!("getrandom failed: the kernel offers no random numbers");
    }
    b
}

fn v4(a: SocketAddr) -> Option<SocketAddrV4> {
    match a {
        SocketAddr::V4(a) => Some(a),
        SocketAddr::V6(_) => None,
    }
}

/// Ties a socket to its interface (`SO_BINDTODEVICE`; empty: not tied, for the loopback
/// tests). A socket that cannot be tied is not used: it would also see packets for its
/// address arriving on another interface (isolation never degrades quietly).
fn bind_device<F: AsFd>(sock: &F, interface: &str, what: &str) -> std::io::Result<()> {
    if interface.is_empty() {
        return Ok(());
    }
    crate::iface::bind_to_device(sock, interface).map_err(|e| {
        std::io::Error::other(format!(
            "cannot tie the split {what} socket to interface {interface:?} (SO_BINDTODEVICE: {e}); check the interface name and that vgate has CAP_NET_RAW"
        ))
    })
}

/// A non-blocking socket bound to `from` (port 0: any), connecting to `to`.
pub(super) fn connect_from(
    from: SocketAddrV4,
    to: SocketAddrV4,
    interface: &str,
) -> std::io::Result<TcpStream> {
    let fd = socket::socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    socket::setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    bind_device(&fd, interface, "signaling")?;
    if socket::bind(fd.as_raw_fd(), &SockaddrIn::from(from)).is_err() && from.port() != 0 {
        socket::bind(
            fd.as_raw_fd(),
            &SockaddrIn::from(SocketAddrV4::new(*from.ip(), 0)),
        )?;
    }
    match socket::connect(fd.as_raw_fd(), &SockaddrIn::from(to)) {
        Ok(()) | Err(Errno::EINPROGRESS) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(TcpStream::from(fd))
}

/// Writes as much of `buf` as the socket takes now: the bytes written, or `Err` when the
/// connection is gone.
fn write_pending(sock: &mut TcpStream, buf: &mut Vec<u8>) -> Result<usize, ()> {
    let mut total = 0;
    while !buf.is_empty() {
        match sock.write(buf) {
            Ok(0) => return Err(()),
            Ok(n) => {
                buf.drain(..n);
                total += n;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(_) => return Err(()),
        }
    }
    Ok(total)
}

/// Asks epoll for writability of `sock` only while it has something to write.
fn want_writable(epoll: &Epoll, sock: &TcpStream, token: u64, want: bool, current: &mut bool) {
    if want != *current {
        *current = want;
        let mut flags = EpollFlags::EPOLLIN;
        if want {
            flags |= EpollFlags::EPOLLOUT;
        }
        let _ = epoll.modify(sock.as_fd(), &mut EpollEvent::new(flags, token));
    }
}

/// One connection on the signaling link.
struct Conn {
    sock: TcpStream,
    connected: bool,
    started: Instant,
    ours: Hello,
    theirs: Option<Hello>,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    sealer: Option<Sealer>,
    opener: Option<Opener>,
    authed: bool,
    last_tx: Instant,
    want_out: bool,
}

impl Conn {
    fn new(sock: TcpStream, connected: bool, role: Role, instance: [u8; 16]) -> Conn {
        let ours = Hello {
            role,
            instance,
            nonce: random(),
        };
        let now = Instant::now();
        let mut c = Conn {
            sock,
            connected,
            started: now,
            ours,
            theirs: None,
            inbuf: Vec::with_capacity(64 * 1024),
            out: Vec::with_capacity(64 * 1024),
            sealer: None,
            opener: None,
            authed: false,
            last_tx: now,
            want_out: false,
        };
        if connected {
            c.out.extend_from_slice(&ours.encode());
        }
        c
    }
}

/// A TCP stream carried over the link.
struct Stream {
    sock: TcpStream,
    connected: bool,
    pending: Vec<u8>,
    /// The peer closed its end: close ours once `pending` is written.
    closing: bool,
    want_out: bool,
}

struct FaceUdp {
    sock: UdpSocket,
    announced: bool,
    last_used: Instant,
}

/// What happened to the connection after reading from it.
enum ConnOutcome {
    Open,
    Closed,
    Failed(FrameError),
}

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

    // ---------------------------------------------------------------- the connection

    fn accept_conn(&mut self) {
        for _ in 0..BATCH {
            let Some(l) = &self.listener else { return };
            match l.accept() {
                Ok((s, from)) => {
                    if v4(from).map(|a| *a.ip()) != Some(*self.cfg.link.peer.ip()) {
                        self.stats.refused.fetch_add(1, Relaxed);
                        static LOG: crate::logging::RateLimit =
                            crate::logging::RateLimit::new(10_000);
                        if let Some(suppressed) = LOG.check(crate::clock::now_ms()) {
                            tracing::warn!(from = %from, suppressed, "split signaling link: connection from an address other than the peer refused");
                        }
                        continue;
                    }
                    if s.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let _ = s.set_nodelay(true);
                    let slot = if self.conns[0].is_none() { 0 } else { 1 };
                    if let Some(old) = self.conns[slot].take() {
                        // A newer handshake replaces one still in progress.
                        let _ = self.epoll.delete(old.sock.as_fd());
                        self.stats.refused.fetch_add(1, Relaxed);
                    }
                    self.install_conn(slot, Conn::new(s, true, Role::Listener, self.instance));
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return,
            }
        }
    }

    fn install_conn(&mut self, slot: usize, c: Conn) {
        let token = if slot == 0 { CONN } else { PENDING };
        let flags = EpollFlags::EPOLLIN | EpollFlags::EPOLLOUT;
        if self
            .epoll
            .add(c.sock.as_fd(), EpollEvent::new(flags, token))
            .is_ok()
        {
            let mut c = c;
            c.want_out = true;
            self.conns[slot] = Some(c);
        }
    }

    fn dial(&mut self) {
        let from = SocketAddrV4::new(*self.cfg.link.local.ip(), 0);
        match connect_from(from, self.cfg.link.peer, &self.cfg.link.interface) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                self.install_conn(0, Conn::new(s, false, Role::Dialer, self.instance));
            }
            Err(e) => {
                static LOG: crate::logging::RateLimit = crate::logging::RateLimit::new(30_000);
                if let Some(suppressed) = LOG.check(crate::clock::now_ms()) {
                    tracing::warn!(peer = %self.cfg.link.peer, suppressed, "split signaling link: cannot connect to the peer ({e}); retrying");
                }
            }
        }
    }

    fn conn_event(&mut self, slot: usize, flags: EpollFlags) {
        let Some(c) = self.conns[slot].as_mut() else {
            return;
        };
        if !c.connected {
            if flags.intersects(EpollFlags::EPOLLOUT | EpollFlags::EPOLLERR | EpollFlags::EPOLLHUP)
            {
                match c.sock.take_error() {
                    Ok(None) if !flags.contains(EpollFlags::EPOLLERR) => {
                        c.connected = true;
                        let hello = c.ours.encode();
                        c.out.extend_from_slice(&hello);
                    }
                    _ => {
                        self.drop_conn(slot, None);
                        return;
                    }
                }
            } else {
                return;
            }
        }
        if flags.intersects(EpollFlags::EPOLLIN | EpollFlags::EPOLLHUP | EpollFlags::EPOLLERR) {
            match self.read_conn(slot) {
                ConnOutcome::Open => {}
                ConnOutcome::Closed => self.drop_conn(slot, None),
                ConnOutcome::Failed(e) => self.drop_conn(slot, Some(e)),
            }
        }
    }

    fn read_conn(&mut self, slot: usize) -> ConnOutcome {
        for _ in 0..BATCH {
            let Some(c) = self.conns[slot].as_mut() else {
                return ConnOutcome::Closed;
            };
            let n = match c.sock.read(&mut self.buf) {
                Ok(0) => {
                    return if !c.inbuf.is_empty() {
                        ConnOutcome::Failed(FrameError::Truncated)
                    } else {
                        ConnOutcome::Closed
                    };
                }
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return ConnOutcome::Open,
                Err(_) => return ConnOutcome::Closed,
            };
            self.stats.bytes_in.fetch_add(n as u64, Relaxed);
            c.inbuf.extend_from_slice(&self.buf[..n]);
            if let Err(e) = self.process_conn(slot) {
                return ConnOutcome::Failed(e);
            }
        }
        ConnOutcome::Open
    }

    /// Takes the hello and every complete frame out of the connection's input.
    fn process_conn(&mut self, slot: usize) -> Result<(), FrameError> {
        let Some(c) = self.conns[slot].as_mut() else {
            return Ok(());
        };
        if c.theirs.is_none() {
            let have = c.inbuf.len().min(4);
            if c.inbuf[..have] != super::frame::MAGIC[..have] {
                return Err(FrameError::NotVgate);
            }
            if c.inbuf.len() < HELLO_LEN {
                return Ok(());
            }
            let mut h = [0u8; HELLO_LEN];
            h.copy_from_slice(&c.inbuf[..HELLO_LEN]);
            let theirs = Hello::parse(&h)?;
            let keys = Keys::derive(self.cfg.link.key.expose(), &c.ours, &theirs)?;
            c.inbuf.drain(..HELLO_LEN);
            c.theirs = Some(theirs);
            let mut sealer = Sealer::new(keys.send);
            let (udp, tcp) = self.announce.lock().map(|a| a.clone()).unwrap_or_default();
            self.sent_gen = self.announce_gen.load(Relaxed);
            sealer.announce(&mut c.out, &udp, &tcp);
            self.stats.frames_out.fetch_add(1, Relaxed);
            c.sealer = Some(sealer);
            c.opener = Some(Opener::new(keys.recv));
        }
        let mut input = std::mem::take(&mut c.inbuf);
        let mut opener = c.opener.take();
        let mut used = 0;
        let mut result = Ok(());
        if let Some(op) = opener.as_mut() {
            loop {
                match op.open(&input[used..]) {
                    Ok(Some((frame, len))) => {
                        used += len;
                        self.stats.frames_in.fetch_add(1, Relaxed);
                        self.last_rx = Instant::now();
                        self.stats
                            .peer_last_ms
                            .store(crate::clock::wall_ms(), Relaxed);
                        if op.accepted() == 1 {
                            self.on_authenticated(slot);
                        }
                        // After a pending connection took over it lives in slot 0.
                        let s = if self.conns[slot].is_some() { slot } else { 0 };
                        self.on_frame(s, frame);
                    }
                    Ok(None) => break,
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            }
        }
        input.drain(..used);
        let s = if self.conns[slot].is_some() { slot } else { 0 };
        if let Some(c) = self.conns[s].as_mut() {
            c.inbuf = input;
            if c.opener.is_none() {
                c.opener = opener;
            }
        }
        result
    }

    fn on_authenticated(&mut self, slot: usize) {
        let theirs = self.conns[slot].as_ref().and_then(|c| c.theirs);
        if slot == 1 {
            // The new connection replaces the old one and everything carried on it.
            self.close_conn(0);
            self.conns[0] = self.conns[1].take();
            if let Some(c) = &self.conns[0] {
                let mut ev = EpollEvent::new(EpollFlags::EPOLLIN | EpollFlags::EPOLLOUT, CONN);
                let _ = self.epoll.modify(c.sock.as_fd(), &mut ev);
            }
        }
        if let Some(c) = self.conns[0].as_mut() {
            c.authed = true;
        }
        self.stats.connects.fetch_add(1, Relaxed);
        let instance = theirs.map(|h| h.instance);
        if self.peer_instance.is_some() && self.peer_instance != instance {
            self.stats.peer_restarts.fetch_add(1, Relaxed);
            tracing::warn!("split signaling link: the peer half restarted");
            if !self.lost {
                self.lose_peer("the peer half restarted");
            }
        }
        self.peer_instance = instance;
        self.peer_up = true;
        self.lost = false;
        self.stats.peer_up.store(1, Relaxed);
        tracing::info!(peer = %self.cfg.link.peer, "split signaling link: peer authenticated, up");
    }

    /// Closes the connection in `slot` and, for the active one, every stream carried on it.
    fn close_conn(&mut self, slot: usize) {
        if let Some(c) = self.conns[slot].take() {
            let _ = self.epoll.delete(c.sock.as_fd());
            if slot == 0 {
                let ids: Vec<u32> = self.streams.keys().copied().collect();
                for id in ids {
                    self.close_stream(id, false);
                }
                if self.peer_up {
                    self.peer_up = false;
                    self.down_since = Instant::now();
                    self.stats.peer_up.store(0, Relaxed);
                }
            }
        }
    }

    fn drop_conn(&mut self, slot: usize, err: Option<FrameError>) {
        if let Some(e) = err {
            let c = &self.stats;
            match e.counter() {
                "auth_failures" => c.auth_failures.fetch_add(1, Relaxed),
                "replays" => c.replays.fetch_add(1, Relaxed),
                "truncated" => c.truncated.fetch_add(1, Relaxed),
                "refused" => c.refused.fetch_add(1, Relaxed),
                _ => c.malformed.fetch_add(1, Relaxed),
            };
            c.resets.fetch_add(1, Relaxed);
            static LOG: crate::logging::RateLimit = crate::logging::RateLimit::new(10_000);
            if let Some(suppressed) = LOG.check(crate::clock::now_ms()) {
                tracing::warn!(suppressed, "split signaling link: connection reset: {e}");
            }
        } else if self.conns[slot].as_ref().is_some_and(|c| c.authed) {
            tracing::warn!("split signaling link: connection to the peer closed");
        }
        self.close_conn(slot);
        self.next_dial = Instant::now() + self.retry();
    }

    fn retry(&self) -> Duration {
        self.cfg.link.heartbeat.min(Duration::from_secs(1))
    }

    /// The peer is gone (silent, said goodbye, or restarted): end every signaled session
    /// crossing the link and forget its ports until it announces them again.
    fn lose_peer(&mut self, why: &str) {
        self.lost = true;
        self.stats.peer_lost.fetch_add(1, Relaxed);
        let n = self.events.end_sessions(why);
        self.stats.sessions_ended.fetch_add(n as u64, Relaxed);
        tracing::warn!(
            sessions = n,
            "split signaling link: {why}; ending the sessions that cross the link"
        );
        self.udp.clear();
        self.tcp_listeners.clear();
    }

    fn send_frame(&mut self, f: impl FnOnce(&mut Sealer, &mut Vec<u8>) -> usize) -> bool {
        let Some(c) = self.conns[0].as_mut() else {
            return false;
        };
        if !c.authed || c.out.len() > MAX_OUT {
            return false;
        }
        let Some(s) = c.sealer.as_mut() else {
            return false;
        };
        f(s, &mut c.out);
        c.last_tx = Instant::now();
        self.stats.frames_out.fetch_add(1, Relaxed);
        true
    }

    fn flush_conns(&mut self) {
        for slot in 0..2 {
            let mut failed = false;
            if let Some(c) = self.conns[slot].as_mut() {
                if c.connected {
                    match write_pending(&mut c.sock, &mut c.out) {
                        Ok(n) => {
                            self.stats.bytes_out.fetch_add(n as u64, Relaxed);
                        }
                        Err(()) => failed = true,
                    }
                }
                let want = !c.connected || !c.out.is_empty();
                let token = if slot == 0 { CONN } else { PENDING };
                want_writable(&self.epoll, &c.sock, token, want, &mut c.want_out);
            }
            if failed {
                self.drop_conn(slot, None);
            }
        }
        self.flush_streams();
    }

    fn timers(&mut self) {
        let now = Instant::now();
        if self.cfg.role == Role::Dialer && self.conns[0].is_none() && now >= self.next_dial {
            self.next_dial = now + self.retry();
            self.dial();
        }
        for slot in 0..2 {
            if let Some(c) = &self.conns[slot] {
                if !c.authed && now.duration_since(c.started) > HANDSHAKE_TIMEOUT {
                    self.stats.refused.fetch_add(1, Relaxed);
                    self.drop_conn(slot, None);
                }
            }
        }
        if self.peer_up && now.duration_since(self.last_rx) > self.cfg.link.dead_after {
            self.close_conn(0);
            self.next_dial = now;
            self.lose_peer("the peer half is silent");
        }
        if !self.peer_up
            && !self.lost
            && now.duration_since(self.down_since) > self.cfg.link.dead_after
        {
            self.lose_peer("the peer half is unreachable");
        }
        let gen = self.announce_gen.load(Relaxed);
        if gen != self.sent_gen && self.peer_up {
            let (udp, tcp) = self.announce.lock().map(|a| a.clone()).unwrap_or_default();
            if self.send_frame(|s, out| s.announce(out, &udp, &tcp)) {
                self.sent_gen = gen;
            }
        }
        let heartbeat_due = self.conns[0]
            .as_ref()
            .is_some_and(|c| c.authed && now.duration_since(c.last_tx) >= self.cfg.link.heartbeat);
        if heartbeat_due
            && self.send_frame(|s, out| s.seal(out, super::frame::Kind::Heartbeat, &[]))
        {
            self.stats.heartbeats_out.fetch_add(1, Relaxed);
        }
        if now.duration_since(self.last_sweep) > Duration::from_secs(1) {
            self.last_sweep = now;
            self.udp
                .retain(|_, f| f.announced || now.duration_since(f.last_used) < MIRROR_IDLE);
        }
    }

    fn goodbye(&mut self) {
        if self.send_frame(|s, out| s.seal(out, super::frame::Kind::Goodbye, &[])) {
            if let Some(c) = self.conns[0].as_mut() {
                let _ = c.sock.set_nonblocking(false);
                let _ = c.sock.set_write_timeout(Some(Duration::from_millis(300)));
                let _ = c.sock.write_all(&c.out);
                let _ = c.sock.shutdown(std::net::Shutdown::Write);
            }
        }
    }

    // ---------------------------------------------------------------- frames from the peer

    fn on_frame(&mut self, _slot: usize, frame: Frame<'_>) {
        match frame {
            Frame::Announce { udp, tcp } => self.apply_announce(&udp, &tcp),
            Frame::Heartbeat => {
                self.stats.heartbeats_in.fetch_add(1, Relaxed);
            }
            Frame::Udp { src, dst, data } => self.deliver_udp(src, dst, data),
            Frame::TcpOpen { id, src, dst } => self.open_stream(id, src, dst),
            Frame::TcpData { id, data } => self.stream_data(id, data),
            Frame::TcpClose { id } => {
                if let Some(s) = self.streams.get_mut(&id) {
                    s.closing = true;
                } else {
                    self.stats.unknown_stream.fetch_add(1, Relaxed);
                }
            }
            Frame::Goodbye => {
                tracing::warn!("split signaling link: the peer half is stopping");
                self.close_conn(0);
                self.next_dial = Instant::now() + self.retry();
                if !self.lost {
                    self.lose_peer("the peer half stopped");
                }
            }
        }
    }

    /// Whether a datagram or connection on a face socket comes from this host's side of the
    /// link face: the own face address, or another loopback address (a proxy's outgoing TCP
    /// connection is not bound, so the kernel picks 127.0.0.1). Nothing from outside the
    /// host can reach a loopback address.
    fn local_source(&self, ip: std::net::Ipv4Addr) -> bool {
        ip == self.cfg.own_face || (ip.is_loopback() && self.cfg.own_face.is_loopback())
    }

    fn peer_face(&self, port: u16) -> SocketAddrV4 {
        SocketAddrV4::new(self.cfg.peer_face, port)
    }

    fn open_face_udp(&mut self, port: u16, announced: bool) -> bool {
        if let Some(f) = self.udp.get_mut(&port) {
            f.announced |= announced;
            return true;
        }
        if self.udp.len() >= MAX_FACE_UDP {
            return false;
        }
        let sock = match UdpSocket::bind(self.peer_face(port)).and_then(|s| {
            bind_device(&s, &self.cfg.face_interface, "face")?;
            Ok(s)
        }) {
            Ok(s) => s,
            Err(e) => {
                self.stats.bind_errors.fetch_add(1, Relaxed);
                static LOG: crate::logging::RateLimit = crate::logging::RateLimit::new(10_000);
                if let Some(suppressed) = LOG.check(crate::clock::now_ms()) {
                    tracing::warn!(
                        port,
                        suppressed,
                        "split: cannot open UDP port {port} on the peer's face address ({e})"
                    );
                }
                return false;
            }
        };
        let _ = sock.set_nonblocking(true);
        if self
            .epoll
            .add(
                sock.as_fd(),
                EpollEvent::new(EpollFlags::EPOLLIN, T_UDP | u64::from(port)),
            )
            .is_err()
        {
            return false;
        }
        self.udp.insert(
            port,
            FaceUdp {
                sock,
                announced,
                last_used: Instant::now(),
            },
        );
        true
    }

    fn apply_announce(&mut self, udp: &[u16], tcp: &[u16]) {
        let udp_set: HashSet<u16> = udp.iter().copied().collect();
        for f in self.udp.iter_mut() {
            if !udp_set.contains(f.0) {
                f.1.announced = false;
            }
        }
        for &p in udp {
            if !self.open_face_udp(p, true) && self.udp.len() >= MAX_FACE_UDP {
                self.stats.mirror_full.fetch_add(1, Relaxed);
            }
        }
        let tcp_set: HashSet<u16> = tcp.iter().copied().collect();
        self.tcp_listeners.retain(|p, _| tcp_set.contains(p));
        for &p in tcp {
            if self.tcp_listeners.contains_key(&p) {
                continue;
            }
            match TcpListener::bind(self.peer_face(p)).and_then(|l| {
                bind_device(&l, &self.cfg.face_interface, "face")?;
                Ok(l)
            }) {
                Ok(l) => {
                    let _ = l.set_nonblocking(true);
                    if self
                        .epoll
                        .add(
                            l.as_fd(),
                            EpollEvent::new(EpollFlags::EPOLLIN, T_TCPL | u64::from(p)),
                        )
                        .is_ok()
                    {
                        self.tcp_listeners.insert(p, l);
                    }
                }
                Err(e) => {
                    self.stats.bind_errors.fetch_add(1, Relaxed);
                    tracing::warn!(
                        port = p,
                        "split: cannot listen on TCP port {p} of the peer's face address ({e})"
                    );
                }
            }
        }
        tracing::info!(udp = ?udp, tcp = ?tcp, "split signaling link: the peer's proxies listen on these face ports");
    }

    fn deliver_udp(&mut self, src: u16, dst: u16, data: &[u8]) {
        if !self.open_face_udp(src, false) {
            self.stats.mirror_full.fetch_add(1, Relaxed);
            return;
        }
        let to = SocketAddrV4::new(self.cfg.own_face, dst);
        if let Some(f) = self.udp.get_mut(&src) {
            f.last_used = Instant::now();
            match f.sock.send_to(data, to) {
                Ok(_) => self.stats.udp_in.fetch_add(1, Relaxed),
                Err(_) => self.stats.udp_send_errors.fetch_add(1, Relaxed),
            };
        }
    }

    // ---------------------------------------------------------------- face sockets

    fn face_udp_readable(&mut self, port: u16) {
        for _ in 0..BATCH {
            let Some(f) = self.udp.get_mut(&port) else {
                return;
            };
            let (n, from) = match f.sock.recv_from(&mut self.buf) {
                Ok(r) => r,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return,
            };
            f.last_used = Instant::now();
            let Some(from) = v4(from).filter(|a| self.local_source(*a.ip())) else {
                self.stats.udp_dropped_source.fetch_add(1, Relaxed);
                continue;
            };
            if !self.peer_up {
                self.stats.udp_dropped_peer_down.fetch_add(1, Relaxed);
                continue;
            }
            let data = &self.buf[..n];
            let Some(c) = self.conns[0].as_mut() else {
                continue;
            };
            let Some(s) = c
                .sealer
                .as_mut()
                .filter(|_| c.authed && c.out.len() <= MAX_OUT)
            else {
                self.stats.udp_dropped_peer_down.fetch_add(1, Relaxed);
                continue;
            };
            s.udp(&mut c.out, from.port(), port, data);
            c.last_tx = Instant::now();
            self.stats.frames_out.fetch_add(1, Relaxed);
            self.stats.udp_out.fetch_add(1, Relaxed);
        }
    }

    fn stream_id(&mut self) -> u32 {
        let bit = if self.cfg.role == Role::Listener {
            LISTENER_STREAM
        } else {
            0
        };
        loop {
            let id = (self.next_stream & !LISTENER_STREAM) | bit;
            self.next_stream = self.next_stream.wrapping_add(1).max(1);
            if !self.streams.contains_key(&id) {
                return id;
            }
        }
    }

    fn add_stream(&mut self, id: u32, sock: TcpStream, connected: bool) -> bool {
        let flags = if connected {
            EpollFlags::EPOLLIN
        } else {
            EpollFlags::EPOLLIN | EpollFlags::EPOLLOUT
        };
        if self
            .epoll
            .add(
                sock.as_fd(),
                EpollEvent::new(flags, T_STREAM | u64::from(id)),
            )
            .is_err()
        {
            return false;
        }
        self.streams.insert(
            id,
            Stream {
                sock,
                connected,
                pending: Vec::new(),
                closing: false,
                want_out: !connected,
            },
        );
        self.stats.tcp_opened.fetch_add(1, Relaxed);
        true
    }

    fn face_tcp_accept(&mut self, port: u16) {
        for _ in 0..BATCH {
            let Some(l) = self.tcp_listeners.get(&port) else {
                return;
            };
            let (s, from) = match l.accept() {
                Ok(r) => r,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return,
            };
            let Some(from) = v4(from).filter(|a| self.local_source(*a.ip())) else {
                self.stats.tcp_refused.fetch_add(1, Relaxed);
                continue;
            };
            if !self.peer_up
                || self.streams.len() >= MAX_STREAMS
                || s.set_nonblocking(true).is_err()
            {
                self.stats.tcp_refused.fetch_add(1, Relaxed);
                continue;
            }
            let _ = s.set_nodelay(true);
            let id = self.stream_id();
            if self.add_stream(id, s, true) {
                self.send_frame(|sl, out| sl.tcp_open(out, id, from.port(), port));
            }
        }
    }

    fn open_stream(&mut self, id: u32, src: u16, dst: u16) {
        let from_listener = id & LISTENER_STREAM != 0;
        let ours = from_listener == (self.cfg.role == Role::Listener);
        if ours || self.streams.contains_key(&id) || self.streams.len() >= MAX_STREAMS {
            self.stats.tcp_refused.fetch_add(1, Relaxed);
            self.send_frame(|s, out| s.tcp_close(out, id));
            return;
        }
        let to = SocketAddrV4::new(self.cfg.own_face, dst);
        match connect_from(self.peer_face(src), to, &self.cfg.face_interface) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                if !self.add_stream(id, s, false) {
                    self.send_frame(|s, out| s.tcp_close(out, id));
                }
            }
            Err(_) => {
                self.stats.tcp_refused.fetch_add(1, Relaxed);
                self.send_frame(|s, out| s.tcp_close(out, id));
            }
        }
    }

    fn stream_data(&mut self, id: u32, data: &[u8]) {
        let Some(s) = self.streams.get_mut(&id) else {
            self.stats.unknown_stream.fetch_add(1, Relaxed);
            return;
        };
        if s.pending.len() + data.len() > MAX_STREAM_PENDING {
            self.stats.tcp_overflow.fetch_add(1, Relaxed);
            self.close_stream(id, true);
            return;
        }
        s.pending.extend_from_slice(data);
    }

    /// Closes a stream; `tell` sends the peer a close for it.
    fn close_stream(&mut self, id: u32, tell: bool) {
        if let Some(s) = self.streams.remove(&id) {
            let _ = self.epoll.delete(s.sock.as_fd());
            self.stats.tcp_closed.fetch_add(1, Relaxed);
            if tell {
                self.send_frame(|sl, out| sl.tcp_close(out, id));
            }
        }
    }

    fn stream_event(&mut self, id: u32, flags: EpollFlags) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        if !s.connected {
            if flags.intersects(EpollFlags::EPOLLOUT | EpollFlags::EPOLLERR | EpollFlags::EPOLLHUP)
            {
                match s.sock.take_error() {
                    Ok(None) if !flags.contains(EpollFlags::EPOLLERR) => s.connected = true,
                    _ => {
                        self.stats.tcp_refused.fetch_add(1, Relaxed);
                        self.close_stream(id, true);
                        return;
                    }
                }
            } else {
                return;
            }
        }
        if !flags.intersects(EpollFlags::EPOLLIN | EpollFlags::EPOLLHUP | EpollFlags::EPOLLERR) {
            return;
        }
        for _ in 0..4 {
            let congested = self.conns[0]
                .as_ref()
                .is_none_or(|c| !c.authed || c.out.len() > MAX_OUT);
            let Some(s) = self.streams.get_mut(&id) else {
                return;
            };
            let n = match s.sock.read(&mut self.buf[..TCP_CHUNK]) {
                Ok(0) => {
                    self.close_stream(id, true);
                    return;
                }
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(_) => {
                    self.close_stream(id, true);
                    return;
                }
            };
            if congested {
                self.stats.tcp_overflow.fetch_add(1, Relaxed);
                self.close_stream(id, true);
                return;
            }
            let Some(c) = self.conns[0].as_mut() else {
                return;
            };
            if let Some(sl) = c.sealer.as_mut() {
                sl.tcp_data(&mut c.out, id, &self.buf[..n]);
                c.last_tx = Instant::now();
                self.stats.frames_out.fetch_add(1, Relaxed);
            }
        }
    }

    fn flush_streams(&mut self) {
        let mut done = Vec::new();
        for (id, s) in self.streams.iter_mut() {
            if !s.connected {
                continue;
            }
            if write_pending(&mut s.sock, &mut s.pending).is_err() {
                done.push((*id, true));
                continue;
            }
            if s.closing && s.pending.is_empty() {
                let _ = s.sock.shutdown(std::net::Shutdown::Both);
                done.push((*id, false));
                continue;
            }
            let want = !s.pending.is_empty();
            want_writable(
                &self.epoll,
                &s.sock,
                T_STREAM | u64::from(*id),
                want,
                &mut s.want_out,
            );
        }
        for (id, tell) in done {
            self.close_stream(id, tell);
        }
    }
}
