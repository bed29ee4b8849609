//! One stream leg: a TCP connection the gateway terminates at its own address in one domain,
//! run by a thread of its own (`vgate-leg<id>`).
//!
//! The thread sleeps in `epoll` on the socket (or the listener, or a connect in progress)
//! and the sink's eventfd. Readable: a bounded number of reads into the de-framer, each
//! frame handed to the [`Injector`] (one route lookup per read). Sink not empty: packets
//! framed into a bounded write buffer ([`OUT_BYTES`]) and written non-blocking; while that
//! buffer is full the sink fills and the engines count `leg_stall`. The peer closing, a
//! read or write error, or an active connect that never succeeds ends the leg: counted,
//! the sink closed, the owner told once ([`LegSpec::on_close`]). The peer closing may be
//! the start of a reconnect (RFC 4145 `a=connection:new` in an SDP that has not reached
//! the owner yet), so with [`LegSpec::close_grace`] the leg first waits that long without
//! its connection (a passive leg listening again and taking the peer's new one) before it
//! ends; the owner replacing (dropping) it meanwhile tells nobody. Dropping the [`Leg`]
//! stops and joins the thread, closes its sockets and takes it out of the [`crate::routes::legs::LegTable`].

use std::io::{self, Read, Write};
use std::net::{SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::socket::{self, sockopt, AddressFamily, SockFlag, SockType, SockaddrIn};

use super::Injector;
use crate::clock::now_ms;
use crate::config::DomainId;
use crate::engine::ports::{bind_to_device, PortRegistry};
use crate::routes::legs::{LegCounters, LegInfo, LegState};
use crate::routes::legs::{LegError as EdgeError, LegHandle, LegSpec, Role};
use crate::routes::Routes;
use crate::sink::EdgeSink;
use crate::stats::{DropReason, Tally};
use crate::wire::framing::{frame_into, DeframeTally, Deframer, Framing};

/// The write buffer of a leg, bytes: what the peer's TCP window may lag behind the stream
/// before packets are dropped (about 100 ms of a 20 Mbit/s stream).
pub const OUT_BYTES: usize = 256 * 1024;
/// Reads per wake-up before the thread looks at its sink and stop flag again.
const READS_PER_WAKE: usize = 16;
/// An active leg retries a refused connect this often.
const RETRY: Duration = Duration::from_millis(200);

/// A running leg; dropping it stops it.
pub struct Leg {
    id: u64,
    sink: Arc<EdgeSink>,
    counters: Arc<LegCounters>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    routes: Arc<Routes>,
    /// The address a passive leg accepts (0: not known yet).
    allowed: Arc<AtomicU32>,
}

impl std::fmt::Debug for Leg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leg").field("id", &self.id).finish()
    }
}

impl Framing for Box<dyn Framing> {
    fn header_len(&self) -> usize {
        (**self).header_len()
    }
    fn write_header(&self, channel: u8, len: u16, out: &mut [u8]) {
        (**self).write_header(channel, len, out)
    }
    fn parse(&self, buf: &[u8]) -> crate::wire::framing::Header {
        (**self).parse(buf)
    }
}

impl Leg {
    /// Starts a leg (see [`crate::routes::legs::Legs::start`]); `ports`: the engine's, which
    /// the leg's injector sends through.
    pub fn start(
        spec: LegSpec,
        routes: Arc<Routes>,
        ports: Option<Arc<PortRegistry>>,
    ) -> Result<Leg, EdgeError> {
        let counters = Arc::new(LegCounters::default());
        let sink = Arc::new(
            EdgeSink::new(spec.slots, spec.max_payload, Arc::clone(&counters))
                .map_err(EdgeError::Resources)?,
        );
        let listener = match spec.role {
            Role::Passive => {
                let l = TcpListener::bind(spec.local).map_err(|source| EdgeError::Listen {
                    domain: spec.domain,
                    addr: spec.local,
                    source,
                })?;
                if let Some(ifname) = &spec.interface {
                    bind_to_device(&l, ifname, spec.domain).map_err(|source| {
                        EdgeError::Device {
                            domain: spec.domain,
                            source,
                        }
                    })?;
                }
                l.set_nonblocking(true).map_err(EdgeError::Resources)?;
                counters.set_state(LegState::Listening);
                Some(l)
            }
            Role::Active => {
                counters.set_state(LegState::Connecting);
                None
            }
        };
        let id = routes.legs.next_id();
        routes.legs.insert(Arc::new(LegInfo {
            id,
            session: spec.session,
            label: spec.label.clone(),
            domain: spec.domain,
            role: spec.role.name(),
            local: spec.local,
            peer: spec.peer,
            counters: Arc::clone(&counters),
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let deframer = Deframer::new(spec.framing, spec.max_payload);
        let max_frames = deframer.max_frames();
        let allowed = Arc::new(AtomicU32::new(u32::from(*spec.peer.ip())));
        let mut run = Run {
            allowed: Arc::clone(&allowed),
            within: spec.within,
            injector: Injector::new(
                Arc::clone(&routes),
                ports,
                spec.domain,
                spec.local.port(),
                spec.max_payload,
            ),
            deframer,
            frames: Vec::with_capacity(max_frames),
            out: Vec::with_capacity(OUT_BYTES),
            out_rest: 0,
            out_rest_payload: 0,
            sink: Arc::clone(&sink),
            counters: Arc::clone(&counters),
            stop: Arc::clone(&stop),
            listener,
            stream: None,
            pending: None,
            from: spec.peer,
            spec_peer: spec.peer,
            local: spec.local,
            domain: spec.domain,
            interface: spec.interface,
            role: spec.role,
            deadline: Instant::now() + spec.connect_for,
            next_try: Instant::now(),
            fallback_port: spec.fallback_port,
            close_grace: spec.close_grace,
            grace_until: None,
            label: spec.label,
        };
        let on_close = spec.on_close;
        let thread = std::thread::Builder::new()
            .name(format!("vgate-leg{id}"))
            .spawn(move || {
                if run.run() {
                    if let Some(f) = on_close {
                        f();
                    }
                }
            });
        let thread = match thread {
            Ok(t) => t,
            Err(e) => {
                routes.legs.remove(id);
                return Err(EdgeError::Resources(e));
            }
        };
        Ok(Leg {
            id,
            sink,
            counters,
            stop,
            thread: Some(thread),
            routes,
            allowed,
        })
    }
}

impl LegHandle for Leg {
    fn expect_peer(&self, addr: std::net::Ipv4Addr) {
        if self.allowed.swap(u32::from(addr), Relaxed) != u32::from(addr) {
            self.sink.nudge();
        }
    }

    fn sink(&self) -> &Arc<EdgeSink> {
        &self.sink
    }

    fn counters(&self) -> &Arc<LegCounters> {
        &self.counters
    }

    fn id(&self) -> u64 {
        self.id
    }
}

impl Drop for Leg {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        self.sink.nudge();
        if let Some(t) = self.thread.take() {
            // The leg's own thread may drop the last handle (its on_close ending the call):
            // it is leaving anyway.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
        self.sink.close();
        self.routes.legs.remove(self.id);
    }
}

const WAKE: u64 = 0;
const LISTEN: u64 = 1;
const CONNECT: u64 = 2;
const STREAM: u64 = 3;

/// Why a leg ends when its peer closed the connection.
const PEER_CLOSED: &str = "peer closed";

static LEG_LOG: crate::logging::RateLimit = crate::logging::RateLimit::new(5000);

/// The leg thread's state.
struct Run {
    injector: Injector,
    deframer: Deframer<Box<dyn Framing>>,
    /// The frames of one read (sized once, never grown).
    frames: Vec<(u8, std::ops::Range<usize>)>,
    out: Vec<u8>,
    /// Bytes at the front of `out` that finish a frame already partly written.
    out_rest: usize,
    /// That frame's payload bytes (counted in `bytes_out` once its last byte is written).
    out_rest_payload: usize,
    sink: Arc<EdgeSink>,
    counters: Arc<LegCounters>,
    stop: Arc<AtomicBool>,
    listener: Option<TcpListener>,
    stream: Option<TcpStream>,
    allowed: Arc<AtomicU32>,
    within: Option<crate::config::Domain>,
    /// An active connect in progress.
    pending: Option<OwnedFd>,
    /// The connected peer (the source the route checks).
    from: SocketAddrV4,
    spec_peer: SocketAddrV4,
    local: SocketAddrV4,
    domain: DomainId,
    interface: Option<String>,
    role: Role,
    deadline: Instant,
    next_try: Instant,
    fallback_port: Option<u16>,
    close_grace: Duration,
    /// The peer closed: the leg ends at this instant unless a new connection comes first
    /// (or the owner drops it).
    grace_until: Option<Instant>,
    label: String,
}

impl Run {
    /// Runs until stopped (`false`) or until the leg ends by itself (`true`).
    fn run(&mut self) -> bool {
        let epoll = match Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC) {
            Ok(e) => e,
            Err(e) => return self.end(&format!("no epoll: {e}")),
        };
        let _ = epoll.add(
            self.sink.wake_fd(),
            EpollEvent::new(EpollFlags::EPOLLIN, WAKE),
        );
        if let Some(l) = &self.listener {
            let _ = epoll.add(l, EpollEvent::new(EpollFlags::EPOLLIN, LISTEN));
        }
        let mut events = [EpollEvent::empty(); 8];
        let mut want_out = false;
        loop {
            if self.stop.load(Relaxed) {
                self.drop_connection();
                return false;
            }
            if let Some(t) = self.grace_until {
                if self.stream.is_some() {
                    self.grace_until = None;
                } else if Instant::now() >= t {
                    return self.end(PEER_CLOSED);
                }
            }
            if self.connected_to_stranger() {
                // Taken before an SDP named the peer, by another address: dropped, counted,
                // listening again for the named one.
                if let Some(s) = self.stream.take() {
                    let _ = epoll.delete(&s);
                }
                self.counters.refused.fetch_add(1, Relaxed);
                self.counters.set_state(LegState::Listening);
                self.drop_connection();
                want_out = false;
            }
            if self.role == Role::Active && self.stream.is_none() && self.grace_until.is_none() {
                // The deadline holds while a connect is pending too: a peer that drops SYNs
                // would otherwise keep the call for the kernel's whole SYN retry (~2 min).
                let now = Instant::now();
                if now >= self.deadline {
                    if let Some(fd) = self.pending.take() {
                        let _ = epoll.delete(&fd);
                    }
                    return self.end("could not connect");
                }
                if self.pending.is_none() && now >= self.next_try {
                    self.next_try = now + RETRY;
                    if let Some(fd) = self.connect() {
                        let _ = epoll.add(&fd, EpollEvent::new(EpollFlags::EPOLLOUT, CONNECT));
                        self.pending = Some(fd);
                    }
                }
            }
            if self.stream.is_some() {
                if let Err(e) = self.pump() {
                    return self.end(&format!("write failed: {e}"));
                }
                let out = !self.out.is_empty();
                if out != want_out {
                    if let Some(s) = &self.stream {
                        let flags = if out {
                            EpollFlags::EPOLLIN | EpollFlags::EPOLLOUT
                        } else {
                            EpollFlags::EPOLLIN
                        };
                        let _ = epoll.modify(s, &mut EpollEvent::new(flags, STREAM));
                    }
                    want_out = out;
                }
            }
            // Not connected, or the socket must drain first: new packets are no reason to
            // wake (they wait in the sink, or are refused when it is full). Connected with
            // nothing to frame: sleep until a packet or a readable socket. Otherwise go on.
            let mut armed = false;
            let timeout = if self.stream.is_none() || want_out {
                100u16
            } else if self.sink.is_empty() && self.sink.prepare_sleep() {
                armed = true;
                100
            } else {
                0
            };
            let n = epoll
                .wait(&mut events, EpollTimeout::from(timeout))
                .unwrap_or(0);
            if armed {
                self.sink.unarm();
            }
            for ev in &events[..n] {
                match ev.data() {
                    WAKE => self.sink.clear_wake(),
                    // A socket taken is registered for reading only.
                    LISTEN => want_out &= !self.accept(&epoll),
                    CONNECT => {
                        if let Some(fd) = self.pending.take() {
                            let _ = epoll.delete(&fd);
                            // Refused or unreachable: retried after RETRY.
                            if let Ok(0) = socket::getsockopt(&fd, sockopt::SocketError) {
                                let s = TcpStream::from(fd);
                                let _ = s.set_nodelay(true);
                                self.from = self.spec_peer;
                                self.connected(&epoll, s);
                            }
                        }
                    }
                    STREAM => match self.read() {
                        Some(PEER_CLOSED) if !self.close_grace.is_zero() => {
                            self.peer_closed(&epoll);
                            want_out = false;
                        }
                        Some(reason) => return self.end(reason),
                        None => {}
                    },
                    _ => {}
                }
            }
        }
    }

    /// Starts a non-blocking connect from the gateway's end: its port when it can, else the
    /// fallback port the owner took from the registry (the port is taken, or the connection
    /// from it to the peer still exists or lingers in TIME_WAIT: a reconnect for
    /// `a=connection:new`). Never an ephemeral port: one could fall inside the media ports
    /// unknown to the registry, and peers that check the source port refuse it.
    fn connect(&self) -> Option<OwnedFd> {
        match self.connect_from(self.local.port()) {
            Ok(fd) => Some(fd),
            Err(Errno::EADDRINUSE | Errno::EADDRNOTAVAIL) => {
                self.connect_from(self.fallback_port?).ok()
            }
            Err(_) => None,
        }
    }

    fn connect_from(&self, port: u16) -> Result<OwnedFd, Errno> {
        let fd = socket::socket(
            AddressFamily::Inet,
            SockType::Stream,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            None,
        )?;
        let _ = socket::setsockopt(&fd, sockopt::ReuseAddr, &true);
        if let Some(ifname) = &self.interface {
            bind_to_device(&fd, ifname, self.domain).map_err(|_| Errno::EPERM)?;
        }
        let at = SocketAddrV4::new(*self.local.ip(), port);
        socket::bind(fd.as_raw_fd(), &SockaddrIn::from(at))?;
        match socket::connect(fd.as_raw_fd(), &SockaddrIn::from(self.spec_peer)) {
            Ok(()) | Err(Errno::EINPROGRESS) => Ok(fd),
            Err(e) => Err(e),
        }
    }

    /// Takes the peer's connections; `true` when one was taken. A new connection from the
    /// peer replaces the one it had (RFC 4145 §5.1 `a=connection:new`, e.g. after a
    /// re-INVITE): the old one is closed, what was buffered for it dropped and counted.
    fn accept(&mut self, epoll: &Epoll) -> bool {
        let mut taken = false;
        loop {
            let Some(l) = &self.listener else {
                return taken;
            };
            match l.accept() {
                Ok((s, std::net::SocketAddr::V4(from))) if self.accepts(*from.ip()) => {
                    if let Some(old) = self.stream.take() {
                        let _ = epoll.delete(&old);
                        self.drop_connection();
                        tracing::info!(leg = %self.label, peer = %from, "TCP media leg: the peer opened a new connection, replacing the old one");
                    }
                    let _ = s.set_nodelay(true);
                    if self.counters.connects.load(Relaxed) > 0 {
                        // The device (the TCP client) connecting again: after a close
                        // within the reconnect window, or replacing its connection.
                        self.counters.reconnects.fetch_add(1, Relaxed);
                    }
                    self.from = from;
                    self.connected(epoll, s);
                    taken = true;
                }
                Ok((s, from)) => {
                    self.counters.refused.fetch_add(1, Relaxed);
                    if let Some(suppressed) = LEG_LOG.check(now_ms()) {
                        let expected = std::net::Ipv4Addr::from(self.allowed.load(Relaxed));
                        tracing::warn!(leg = %self.label, %from, %expected, suppressed, "TCP media connection refused: not the peer the SDP named, or a second connection");
                    }
                    drop(s);
                }
                Err(_) => return taken,
            }
        }
    }

    /// The peer closed its connection: forgotten, and the leg waits [`Run::close_grace`]
    /// for a new one (passive) or for its owner (active) before it ends.
    fn peer_closed(&mut self, epoll: &Epoll) {
        if let Some(s) = self.stream.take() {
            let _ = epoll.delete(&s);
        }
        self.drop_connection();
        self.grace_until = Some(Instant::now() + self.close_grace);
        self.counters.set_state(match self.role {
            Role::Passive => LegState::Listening,
            Role::Active => LegState::Connecting,
        });
        tracing::info!(leg = %self.label, grace = ?self.close_grace, "TCP media leg: the peer closed; ending unless it connects again or the leg is replaced meanwhile");
    }

    /// Forgets the state of a connection that is gone: a frame it left half read is
    /// counted, what was framed for it and not written is dropped.
    fn drop_connection(&mut self) {
        if self.deframer.mid_frame() {
            self.counters.partial_frames.fetch_add(1, Relaxed);
        }
        self.deframer.reset();
        // Framed for the peer, never (or only partly) written: dropped, counted as stalls.
        let framing = self.deframer.framing();
        let (whole, _) = frames_from(framing, &self.out, self.out_rest, self.out.len());
        let unsent = whole + u64::from(self.out_rest > 0);
        if unsent > 0 {
            self.counters.stalls.fetch_add(unsent, Relaxed);
        }
        self.out.clear();
        self.out_rest = 0;
        self.out_rest_payload = 0;
    }

    /// A passive leg connected (before its peer was known) to an address that is not the
    /// one an SDP has named since.
    fn connected_to_stranger(&self) -> bool {
        let a = self.allowed.load(Relaxed);
        self.role == Role::Passive
            && self.stream.is_some()
            && a != 0
            && u32::from(*self.from.ip()) != a
    }

    /// Whether a connection from `ip` is the peer's.
    fn accepts(&self, ip: std::net::Ipv4Addr) -> bool {
        match self.allowed.load(Relaxed) {
            0 => self.within.as_ref().is_some_and(|d| d.contains(ip)),
            a => u32::from(ip) == a,
        }
    }

    fn connected(&mut self, epoll: &Epoll, s: TcpStream) {
        if s.set_nonblocking(true).is_err() {
            return;
        }
        let _ = epoll.add(&s, EpollEvent::new(EpollFlags::EPOLLIN, STREAM));
        self.counters.connects.fetch_add(1, Relaxed);
        self.counters.set_state(LegState::Connected);
        tracing::info!(leg = %self.label, peer = %self.from, role = self.role.name(), "TCP media leg connected");
        self.stream = Some(s);
    }

    /// Reads what the peer sent, de-frames it and injects each packet; `Some(reason)` when
    /// the leg ends.
    fn read(&mut self) -> Option<&'static str> {
        let Run {
            stream,
            deframer,
            injector,
            counters,
            from,
            frames,
            ..
        } = self;
        let s = stream.as_mut()?;
        for _ in 0..READS_PER_WAKE {
            let n = match s.read(deframer.space()) {
                Ok(0) => return Some(PEER_CLOSED),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return Some("read failed"),
            };
            deframer.filled(n);
            let now = now_ms();
            let route = injector.route();
            let mut t = Tally::default();
            let mut d = DeframeTally::default();
            deframer.drain_ranges(&mut d, frames);
            let df = &*deframer;
            injector.forward_batch(
                route.as_deref(),
                *from,
                frames.iter().map(|(_, r)| df.bytes(r.clone())),
                now,
                &mut t,
            );
            injector.finish(route.as_deref(), &t, now);
            counters.frames_in.fetch_add(d.frames, Relaxed);
            counters.bytes_in.fetch_add(d.bytes, Relaxed);
            if d.framing_errors > 0 || d.skipped_bytes > 0 {
                counters.framing_errors.fetch_add(d.framing_errors, Relaxed);
                counters.skipped_bytes.fetch_add(d.skipped_bytes, Relaxed);
                counters.oversize.fetch_add(d.oversize, Relaxed);
            }
            let dropped: u64 = DropReason::ALL.iter().map(|r| t.drops[*r as usize]).sum();
            if dropped > 0 {
                counters.inject_drops.fetch_add(dropped, Relaxed);
            }
        }
        None
    }

    /// Frames what the sink holds into the write buffer and writes what the socket takes.
    /// A frame counts in `frames_out` once its last byte is written; one dropped unwritten
    /// counts only in `stalls` (see [`Run::drop_connection`]).
    fn pump(&mut self) -> io::Result<()> {
        let Run {
            stream,
            deframer,
            out,
            out_rest,
            out_rest_payload,
            sink,
            counters,
            ..
        } = self;
        let Some(s) = stream.as_mut() else {
            return Ok(());
        };
        let framing = deframer.framing();
        let room = framing.header_len() + sink.max_payload();
        for _ in 0..64 {
            while out.capacity() - out.len() >= room {
                let Some(slot) = sink.take() else {
                    break;
                };
                if !frame_into(framing, 0, slot.payload(), out) {
                    // Cannot happen (the room was checked for the longest packet).
                    counters.stalls.fetch_add(1, Relaxed);
                }
            }
            if out.is_empty() {
                return Ok(());
            }
            match s.write(out) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    let w = written(framing, out, *out_rest, *out_rest_payload, n);
                    counters.frames_out.fetch_add(w.frames, Relaxed);
                    counters.bytes_out.fetch_add(w.payload, Relaxed);
                    (*out_rest, *out_rest_payload) = (w.rest, w.rest_payload);
                    out.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
            if sink.is_empty() && out.is_empty() {
                return Ok(());
            }
        }
        Ok(())
    }

    /// The leg ended by itself: count, close the sink, say so once.
    fn end(&mut self, reason: &str) -> bool {
        self.drop_connection();
        self.counters.set_state(LegState::Closed);
        self.sink.close();
        self.stream = None;
        self.listener = None;
        self.pending = None;
        tracing::info!(leg = %self.label, reason, "TCP media leg ended");
        true
    }
}

/// What writing the first `n` bytes of a leg's write buffer completed.
#[derive(Debug, Default, PartialEq, Eq)]
struct Written {
    /// Frames whose last byte was among them, and their payload bytes.
    frames: u64,
    payload: u64,
    /// Bytes still to write of a frame they cut, and that frame's payload bytes.
    rest: usize,
    rest_payload: usize,
}

/// [`Written`] for a write of `n` bytes from the front of `buf` (a leg's write buffer: the
/// `rest` bytes finishing a frame of `rest_payload` payload bytes, then whole frames).
fn written<F: Framing + ?Sized>(
    framing: &F,
    buf: &[u8],
    rest: usize,
    rest_payload: usize,
    n: usize,
) -> Written {
    let mut w = Written::default();
    if rest > 0 {
        if n < rest {
            return Written {
                rest: rest - n,
                rest_payload,
                ..w
            };
        }
        w.frames = 1;
        w.payload = rest_payload as u64;
    }
    let mut pos = rest;
    while pos < n {
        match framing.parse(buf.get(pos..).unwrap_or_default()) {
            crate::wire::framing::Header::Frame { header, len, .. } => {
                let end = pos + header + len;
                if end <= n {
                    w.frames += 1;
                    w.payload += len as u64;
                } else {
                    (w.rest, w.rest_payload) = (end - n, len);
                }
                pos = end;
            }
            // Cannot happen: the buffer holds only frames written by `frame_into`.
            _ => break,
        }
    }
    w
}

/// Walks the frames of `buf` (a leg's write buffer: whole frames from `from` on) that start
/// before `upto`: how many, and where the last of them ends (`from` when none).
fn frames_from<F: Framing + ?Sized>(
    framing: &F,
    buf: &[u8],
    from: usize,
    upto: usize,
) -> (u64, usize) {
    let (mut count, mut pos) = (0u64, from);
    while pos < upto {
        match framing.parse(buf.get(pos..).unwrap_or_default()) {
            crate::wire::framing::Header::Frame { header, len, .. } => {
                pos += header + len;
                count += 1;
            }
            // Cannot happen: the buffer holds only frames written by `frame_into`.
            _ => return (count, upto.max(pos)),
        }
    }
    (count, pos)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::framing::Rfc4571;

    #[test]
    fn a_frame_counts_as_written_only_with_its_last_byte() {
        let f = Rfc4571;
        let mut buf = Vec::with_capacity(64);
        for len in [4usize, 6] {
            let mut p = vec![0u8; len];
            p[0] = 0x80;
            assert!(frame_into(&f, 0, &p, &mut buf));
        }
        // Frames of 2 + 4 and 2 + 6 bytes: a write of 7 completes the first and cuts the
        // second (7 of its 8 bytes still to go).
        let w = written(&f, &buf, 0, 0, 7);
        let cut = Written {
            frames: 1,
            payload: 4,
            rest: 7,
            rest_payload: 6,
        };
        assert_eq!(w, cut);
        let rest = &buf[7..];
        assert_eq!(
            written(&f, rest, 7, 6, 3),
            Written {
                rest: 4,
                rest_payload: 6,
                ..Written::default()
            },
            "still cut"
        );
        assert_eq!(
            written(&f, &rest[3..], 4, 6, 4),
            Written {
                frames: 1,
                payload: 6,
                ..Written::default()
            },
            "its last byte"
        );
        assert_eq!(written(&f, &buf, 0, 0, buf.len()).frames, 2);
    }
}
