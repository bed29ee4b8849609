//! The sockets of one SIP proxy and its event loop: one thread, one epoll, the [`Core`]
//! owned by that thread (no lock on the message path).
//!
//! UDP: a socket per face; up to [`BATCH`] datagrams per socket per wakeup, into one
//! 64 KiB buffer reused for every datagram (UDP datagrams up to 64 KiB cross loopback and
//! veth; over a real path IP fragmentation carries them, and a route whose path drops
//! fragments should use TCP, see the module doc of [`super`]).
//!
//! TCP: a listener per face (the upstream face listens on the port its Contact and Via
//! show), accepted and outgoing connections framed by Content-Length ([`take_frames`], over
//! [`frame`]), at most `max_connections_per_source` accepted connections per source address
//! (the next one is accepted and closed at once, counted) and [`MAX_CONNS`] in all. A
//! CRLFCRLF keep-alive gets a CRLF pong (RFC 5626 §3.5.1). A stream that cannot be framed
//! any more (a message over `max_message`, a missing or double Content-Length) is answered
//! when its head is a readable request (`513`/`400`, [`Core::on_stream_error`]), counted,
//! and closed gracefully: our side is shut down, what the peer still sends is read and
//! discarded for [`LINGER`], so the answer is not lost to a reset. A connection whose unsent
//! data passes [`MAX_PENDING`] is closed.
//!
//! Outgoing connections are opened without blocking: the socket connects in the
//! background while messages queue on it; if it has not connected within
//! [`CONNECT_TIMEOUT`] (or is refused) it is closed, its queued messages are lost (as a
//! datagram would be; the INVITE timeout answers a lost INVITE) and the failure counted.
//! So a dead peer never stalls the loop, and other calls go on.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, SockaddrIn};

use crate::signaling::sip::{frame, Framing, Limits, SipError};

use super::core::{Core, Counters, Face, Out, Peer};
use crate::clock::now_ms;

/// Datagrams or reads per socket per wakeup, so one busy peer cannot starve the rest.
pub const BATCH: usize = 64;
/// Connections open at once (accepted and outgoing).
pub const MAX_CONNS: usize = 1024;
/// Unsent bytes queued on one connection before it is closed as stuck.
pub const MAX_PENDING: usize = 4 << 20;
/// How long an outgoing TCP connect may take (it never blocks the loop).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a refused stream is read and discarded after our answer, before it is closed.
pub const LINGER: Duration = Duration::from_secs(2);
/// An accepted connection silent this long is closed.
const IDLE: Duration = Duration::from_secs(900);

fn v4(a: SocketAddr) -> Option<SocketAddrV4> {
    match a {
        SocketAddr::V4(a) => Some(a),
        SocketAddr::V6(_) => None,
    }
}

fn stopped(flags: &[Arc<AtomicBool>]) -> bool {
    flags.iter().any(|f| f.load(Relaxed))
}

/// Runs a UDP proxy until a stop flag is set; then ends every call.
pub fn run_udp(mut core: Core, socks: [UdpSocket; 2], stop: &[Arc<AtomicBool>]) {
    let Ok(epoll) = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC) else {
        tracing::error!("SIP proxy: cannot create an epoll instance; the route is not served");
        core.shutdown(Instant::now());
        return;
    };
    for (i, s) in socks.iter().enumerate() {
        let _ = s.set_nonblocking(true);
        let _ = epoll.add(s.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, i as u64));
    }
    let mut buf = vec![0u8; 65_536];
    let mut events = [EpollEvent::empty(); 4];
    while !stopped(stop) {
        let n = epoll
            .wait(&mut events, EpollTimeout::from(100u16))
            .unwrap_or(0);
        for ev in events.iter().take(n) {
            let face = if ev.data() == 0 {
                Face::Listen
            } else {
                Face::Upstream
            };
            let Some(sock) = socks.get(face.index()) else {
                continue;
            };
            for _ in 0..BATCH {
                match sock.recv_from(&mut buf) {
                    Ok((len, from)) => {
                        let (Some(from), Some(msg)) = (v4(from), buf.get(..len)) else {
                            continue;
                        };
                        let outs = traced(&mut core, face, Peer::udp(from), msg);
                        send_udp(&socks, outs);
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(_) => break,
                }
            }
        }
        let outs = core.tick(Instant::now(), now_ms());
        send_udp(&socks, outs);
    }
    let outs = core.shutdown(Instant::now());
    send_udp(&socks, outs);
}

/// [`Core::on_message`], with the message and what it turned into traced when the route
/// asks for traces.
fn traced(core: &mut Core, face: Face, peer: Peer, msg: &[u8]) -> Vec<Out> {
    use crate::signaling::proxy::trace::Dir;
    if let Some(t) = &core.trace {
        t.message(Dir::In, face_name(face), &peer.addr, msg);
    }
    let outs = core.on_message(face, peer, msg, Instant::now());
    if let Some(t) = &core.trace {
        for o in &outs {
            t.message(Dir::Out, face_name(o.face), &o.to.addr, &o.bytes);
        }
    }
    outs
}

fn face_name(face: Face) -> &'static str {
    match face {
        Face::Listen => "listen",
        Face::Upstream => "upstream",
    }
}

fn send_udp(socks: &[UdpSocket; 2], outs: Vec<Out>) {
    for o in outs {
        if let Some(s) = socks.get(o.face.index()) {
            // A send error (no route, buffer full) is the same as a datagram lost on the
            // way: SIP over UDP retransmits.
            let _ = s.send_to(&o.bytes, o.to.addr);
        }
    }
}

/// What one pass over a connection's buffered bytes found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Frames {
    /// Complete messages, in order, each exactly as [`frame`] delimited it.
    pub messages: Vec<Vec<u8>>,
    /// CRLFCRLF keep-alive pings seen; each is owed a CRLF pong (RFC 5626 §3.5.1).
    pub pings: usize,
    /// The stream cannot be framed any more; the offending bytes stay at the start of the
    /// buffer (for the answer) and nothing after them can be trusted.
    pub error: Option<SipError>,
}

/// Cuts every complete message off the front of `rbuf` (a connection's received bytes):
/// framing by Content-Length, keep-alive CRLFs skipped (a CRLFCRLF is a ping), an
/// incomplete tail kept for the next read. Pure: the loop below and the tests share it.
pub fn take_frames(rbuf: &mut Vec<u8>, limits: &Limits) -> Frames {
    let mut f = Frames::default();
    loop {
        match frame(rbuf, limits) {
            Ok(Framing::Message { skip, len }) => {
                f.pings += usize::from(skip >= 4);
                if let Some(m) = rbuf.get(skip..skip + len) {
                    f.messages.push(m.to_vec());
                }
                rbuf.drain(..(skip + len).min(rbuf.len()));
            }
            Ok(Framing::Incomplete { skip }) => {
                if skip < 4 && rbuf.iter().all(|b| matches!(b, b'\r' | b'\n')) {
                    // Maybe the first half of a ping split across reads: keep it whole.
                    return f;
                }
                f.pings += usize::from(skip >= 4);
                rbuf.drain(..skip.min(rbuf.len()));
                return f;
            }
            Err(e) => {
                f.error = Some(e);
                return f;
            }
        }
    }
}

/// What reading a connection produced, for the core.
enum Event {
    Message(Face, Peer, Vec<u8>),
    /// The stream cannot be framed: the error and the bytes buffered at that point.
    Broken(Face, Peer, SipError, Vec<u8>),
}

struct Conn {
    stream: TcpStream,
    face: Face,
    peer: SocketAddrV4,
    accepted: bool,
    rbuf: Vec<u8>,
    wbuf: Vec<u8>,
    last: Instant,
    /// Outgoing, not connected yet: since when.
    connecting: Option<Instant>,
    /// Refused: our side shut down (once `wbuf` is sent), input discarded, since when.
    closing: Option<Instant>,
}

/// The TCP side: listeners, connections, and the loop.
pub struct TcpNet {
    epoll: Epoll,
    listeners: [TcpListener; 2],
    conns: HashMap<u64, Conn>,
    next_id: u64,
    per_source: HashMap<std::net::Ipv4Addr, usize>,
    max_per_source: usize,
    limits: Limits,
    /// Outgoing connections refused or timed out since the core last took the count.
    failed_connects: u64,
}

static LOG_CONNECT: crate::logging::RateLimit = crate::logging::RateLimit::new(10_000);

impl TcpNet {
    pub fn new(
        listeners: [TcpListener; 2],
        max_per_source: usize,
        max_message: usize,
    ) -> std::io::Result<TcpNet> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(std::io::Error::from)?;
        for (i, l) in listeners.iter().enumerate() {
            l.set_nonblocking(true)?;
            epoll
                .add(l.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, i as u64))
                .map_err(std::io::Error::from)?;
        }
        Ok(TcpNet {
            epoll,
            listeners,
            conns: HashMap::new(),
            next_id: 16,
            per_source: HashMap::new(),
            max_per_source,
            limits: Limits {
                max_message,
                ..Limits::default()
            },
            failed_connects: 0,
        })
    }

    fn register(
        &mut self,
        stream: TcpStream,
        face: Face,
        peer: SocketAddrV4,
        accepted: bool,
        connecting: bool,
    ) -> Option<u64> {
        if self.conns.len() >= MAX_CONNS {
            return None;
        }
        stream.set_nonblocking(true).ok()?;
        let _ = stream.set_nodelay(true);
        let id = self.next_id;
        self.next_id += 1;
        let flags = if connecting {
            EpollFlags::EPOLLIN | EpollFlags::EPOLLOUT
        } else {
            EpollFlags::EPOLLIN
        };
        self.epoll
            .add(stream.as_fd(), EpollEvent::new(flags, id))
            .ok()?;
        if accepted {
            *self.per_source.entry(*peer.ip()).or_insert(0) += 1;
        }
        let now = Instant::now();
        self.conns.insert(
            id,
            Conn {
                stream,
                face,
                peer,
                accepted,
                rbuf: Vec::new(),
                wbuf: Vec::new(),
                last: now,
                connecting: connecting.then_some(now),
                closing: None,
            },
        );
        Some(id)
    }

    fn close(&mut self, id: u64) {
        if let Some(c) = self.conns.remove(&id) {
            let _ = self.epoll.delete(c.stream.as_fd());
            if c.accepted {
                if let Some(n) = self.per_source.get_mut(c.peer.ip()) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        self.per_source.remove(c.peer.ip());
                    }
                }
            }
        }
    }

    /// Starts an outgoing connection without waiting for it (the socket is non-blocking;
    /// `flush` finishes it when epoll reports it writable).
    fn connect(&mut self, face: Face, to: SocketAddrV4) -> std::io::Result<u64> {
        let fd = socket::socket(
            AddressFamily::Inet,
            SockType::Stream,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            None,
        )?;
        match socket::connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &SockaddrIn::from(to)) {
            Ok(()) | Err(Errno::EINPROGRESS) => {}
            Err(e) => return Err(e.into()),
        }
        self.register(TcpStream::from(fd), face, to, false, true)
            .ok_or_else(|| std::io::Error::other(format!("{MAX_CONNS} connections already open")))
    }

    fn accept(&mut self, face: Face, counters: &mut Counters) {
        for _ in 0..BATCH {
            let Some(l) = self.listeners.get(face.index()) else {
                return;
            };
            match l.accept() {
                Ok((s, from)) => {
                    let Some(from) = v4(from) else { continue };
                    let n = self.per_source.get(from.ip()).copied().unwrap_or(0);
                    if n >= self.max_per_source {
                        counters.tcp_connections_refused += 1;
                        static LOG: crate::logging::RateLimit =
                            crate::logging::RateLimit::new(10_000);
                        if let Some(suppressed) = LOG.check(now_ms()) {
                            tracing::warn!(peer = %from, suppressed, "SIP/TCP connection refused: {n} already open from this source (max_connections_per_source)");
                        }
                        // Dropping the stream closes it: the peer sees the connection end.
                        continue;
                    }
                    if self.register(s, face, from, true, false).is_none() {
                        counters.tcp_connections_refused += 1;
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return,
            }
        }
    }

    /// Reads what a connection has; returns framed messages (or the framing failure) for
    /// the core.
    fn read(&mut self, id: u64, scratch: &mut [u8]) -> Vec<Event> {
        let mut events = Vec::new();
        let mut close = false;
        let limits = self.limits;
        let Some(c) = self.conns.get_mut(&id) else {
            return events;
        };
        if c.connecting.is_some() {
            // Input before the connect completed: an error (refused); flush decides.
            return events;
        }
        for _ in 0..BATCH {
            match c.stream.read(scratch) {
                Ok(0) => {
                    close = true;
                    break;
                }
                Ok(n) => {
                    c.last = Instant::now();
                    if c.closing.is_some() {
                        continue; // refused stream: discard until the peer closes
                    }
                    c.rbuf
                        .extend_from_slice(scratch.get(..n).unwrap_or_default());
                    if c.rbuf.len() > limits.max_message * 2 + 8 {
                        break;
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(_) => {
                    close = true;
                    break;
                }
            }
        }
        if c.closing.is_none() {
            let f = take_frames(&mut c.rbuf, &limits);
            for _ in 0..f.pings {
                c.wbuf.extend_from_slice(b"\r\n");
            }
            let peer = Peer {
                addr: c.peer,
                conn: Some(id),
            };
            events.extend(
                f.messages
                    .into_iter()
                    .map(|m| Event::Message(c.face, peer, m)),
            );
            if let Some(e) = f.error {
                // Nothing after this is trustworthy; the core answers, then we close.
                events.push(Event::Broken(c.face, peer, e, std::mem::take(&mut c.rbuf)));
            }
        }
        if close {
            self.close(id);
        } else {
            self.flush(id);
        }
        events
    }

    /// Stops taking input from a connection: our side is shut down once its queued data is
    /// sent; what the peer still sends is discarded until it closes or [`LINGER`] passes.
    fn begin_close(&mut self, id: u64) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.closing = Some(Instant::now());
            c.rbuf = Vec::new();
        }
        self.flush(id);
    }

    fn flush(&mut self, id: u64) {
        let mut close = false;
        if let Some(c) = self.conns.get_mut(&id) {
            if c.connecting.is_some() {
                match c.stream.take_error() {
                    Ok(None) if c.stream.peer_addr().is_ok() => c.connecting = None,
                    Ok(None) => return, // still connecting
                    Ok(Some(e)) | Err(e) => {
                        if let Some(suppressed) = LOG_CONNECT.check(now_ms()) {
                            tracing::warn!(peer = %c.peer, suppressed, "SIP/TCP: cannot connect: {e}; {} queued bytes are lost", c.wbuf.len());
                        }
                        c.wbuf.clear();
                        self.failed_connects += 1;
                        close = true;
                    }
                }
            }
            while !close && !c.wbuf.is_empty() {
                match c.stream.write(&c.wbuf) {
                    Ok(0) => {
                        close = true;
                        break;
                    }
                    Ok(n) => {
                        c.wbuf.drain(..n);
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(_) => {
                        close = true;
                        break;
                    }
                }
            }
            if c.wbuf.is_empty() && c.closing.is_some() {
                let _ = c.stream.shutdown(std::net::Shutdown::Write);
            }
            let flags = if c.wbuf.is_empty() {
                EpollFlags::EPOLLIN
            } else {
                EpollFlags::EPOLLIN | EpollFlags::EPOLLOUT
            };
            let mut ev = EpollEvent::new(flags, id);
            let _ = self.epoll.modify(c.stream.as_fd(), &mut ev);
            if c.wbuf.len() > MAX_PENDING {
                close = true;
            }
        }
        if close {
            self.close(id);
        }
    }

    fn send(&mut self, o: Out) {
        let usable = |c: &Conn| c.face == o.face && c.closing.is_none();
        let mut id =
            o.to.conn
                .filter(|id| self.conns.get(id).is_some_and(usable));
        if id.is_none() {
            id = self
                .conns
                .iter()
                .find(|(_, c)| usable(c) && c.peer == o.to.addr)
                .map(|(id, _)| *id);
        }
        if id.is_none() {
            match self.connect(o.face, o.to.addr) {
                Ok(new) => id = Some(new),
                Err(e) => {
                    self.failed_connects += 1;
                    if let Some(suppressed) = LOG_CONNECT.check(now_ms()) {
                        tracing::warn!(peer = %o.to.addr, suppressed, "SIP/TCP: cannot connect: {e}; the message is lost");
                    }
                }
            }
        }
        let Some(id) = id else {
            return;
        };
        if let Some(c) = self.conns.get_mut(&id) {
            c.wbuf.extend_from_slice(&o.bytes);
        }
        self.flush(id);
    }

    /// Closes connections that connect too slowly, linger too long, or sit idle.
    fn expire(&mut self, now: Instant, idle_too: bool) {
        let mut slow = Vec::new();
        let mut done = Vec::new();
        for (id, c) in &self.conns {
            if c.connecting
                .is_some_and(|t| now.saturating_duration_since(t) > CONNECT_TIMEOUT)
            {
                slow.push(*id);
            } else if c
                .closing
                .is_some_and(|t| now.saturating_duration_since(t) > LINGER)
                || (idle_too && now.saturating_duration_since(c.last) > IDLE && c.wbuf.is_empty())
            {
                done.push(*id);
            }
        }
        for id in slow {
            self.failed_connects += 1;
            if let Some(c) = self.conns.get(&id) {
                if let Some(suppressed) = LOG_CONNECT.check(now_ms()) {
                    tracing::warn!(peer = %c.peer, suppressed, "SIP/TCP: no connection within {CONNECT_TIMEOUT:?}; {} queued bytes are lost", c.wbuf.len());
                }
            }
            self.close(id);
        }
        for id in done {
            self.close(id);
        }
    }

    /// Runs until a stop flag is set; then ends every call.
    pub fn run(mut self, mut core: Core, stop: &[Arc<AtomicBool>]) {
        let mut scratch = vec![0u8; 65_536];
        let mut events = [EpollEvent::empty(); 64];
        let mut last_idle_check = Instant::now();
        while !stopped(stop) {
            let n = self
                .epoll
                .wait(&mut events, EpollTimeout::from(100u16))
                .unwrap_or(0);
            for ev in events.iter().take(n) {
                match ev.data() {
                    0 => self.accept(Face::Listen, &mut core.counters),
                    1 => self.accept(Face::Upstream, &mut core.counters),
                    id => {
                        if ev.events().contains(EpollFlags::EPOLLOUT) {
                            self.flush(id);
                        }
                        if ev.events().intersects(
                            EpollFlags::EPOLLIN | EpollFlags::EPOLLHUP | EpollFlags::EPOLLERR,
                        ) {
                            if self.conns.get(&id).is_some_and(|c| c.connecting.is_some()) {
                                self.flush(id);
                            }
                            for e in self.read(id, &mut scratch) {
                                match e {
                                    Event::Message(face, peer, msg) => {
                                        for o in traced(&mut core, face, peer, &msg) {
                                            self.send(o);
                                        }
                                    }
                                    Event::Broken(face, peer, err, bytes) => {
                                        let outs = core.on_stream_error(
                                            face,
                                            peer,
                                            &bytes,
                                            &err,
                                            Instant::now(),
                                        );
                                        for o in outs {
                                            self.send(o);
                                        }
                                        self.begin_close(id);
                                    }
                                }
                            }
                        }
                    }
                }
            }
            for o in core.tick(Instant::now(), now_ms()) {
                self.send(o);
            }
            let now = Instant::now();
            let idle_too = now.saturating_duration_since(last_idle_check) > Duration::from_secs(10);
            if idle_too {
                last_idle_check = now;
            }
            self.expire(now, idle_too);
            core.counters.tcp_connect_failures += std::mem::take(&mut self.failed_connects);
        }
        for o in core.shutdown(Instant::now()) {
            self.send(o);
        }
    }
}
