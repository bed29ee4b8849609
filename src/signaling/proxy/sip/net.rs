//! The sockets of one SIP proxy and its event loop: one thread, one epoll, the [`Core`]
//! owned by that thread (no lock on the message path).
//!
//! UDP: a socket per face; up to [`BATCH`] datagrams per socket per wakeup, into one
//! 64 KiB buffer reused for every datagram (UDP datagrams up to 64 KiB cross loopback and
//! veth; over a real path IP fragmentation carries them, and a route whose path drops
//! fragments should use TCP, see the module doc of [`super`]).
//!
//! TCP: a listener per face (the upstream face listens on the port its Contact and Via
//! show), accepted and outgoing connections framed by Content-Length ([`frame`]), at most
//! `max_connections_per_source` accepted connections per source address and [`MAX_CONNS`]
//! in all; a connection whose stream cannot be framed any more, or whose unsent data
//! passes [`MAX_PENDING`], is closed.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};

use crate::signaling::sip::{frame, Framing, Limits};

use super::core::{wall_ms, Core, Face, Out, Peer};

/// Datagrams or reads per socket per wakeup, so one busy peer cannot starve the rest.
pub const BATCH: usize = 64;
/// Connections open at once (accepted and outgoing).
pub const MAX_CONNS: usize = 1024;
/// Unsent bytes queued on one connection before it is closed as stuck.
pub const MAX_PENDING: usize = 4 << 20;
/// How long an outgoing TCP connect may block the loop.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
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
        core.shutdown();
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
                        let outs = core.on_message(face, Peer::udp(from), msg, Instant::now());
                        send_udp(&socks, outs);
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(_) => break,
                }
            }
        }
        let outs = core.tick(Instant::now(), wall_ms());
        send_udp(&socks, outs);
    }
    core.shutdown();
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

struct Conn {
    stream: TcpStream,
    face: Face,
    peer: SocketAddrV4,
    accepted: bool,
    rbuf: Vec<u8>,
    wbuf: Vec<u8>,
    last: Instant,
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
}

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
        })
    }

    fn register(
        &mut self,
        stream: TcpStream,
        face: Face,
        peer: SocketAddrV4,
        accepted: bool,
    ) -> Option<u64> {
        if self.conns.len() >= MAX_CONNS {
            return None;
        }
        stream.set_nonblocking(true).ok()?;
        let _ = stream.set_nodelay(true);
        let id = self.next_id;
        self.next_id += 1;
        self.epoll
            .add(stream.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, id))
            .ok()?;
        if accepted {
            *self.per_source.entry(*peer.ip()).or_insert(0) += 1;
        }
        self.conns.insert(
            id,
            Conn {
                stream,
                face,
                peer,
                accepted,
                rbuf: Vec::new(),
                wbuf: Vec::new(),
                last: Instant::now(),
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

    fn accept(&mut self, face: Face) {
        for _ in 0..BATCH {
            let Some(l) = self.listeners.get(face.index()) else {
                return;
            };
            match l.accept() {
                Ok((s, from)) => {
                    let Some(from) = v4(from) else { continue };
                    let n = self.per_source.get(from.ip()).copied().unwrap_or(0);
                    if n >= self.max_per_source {
                        static LOG: crate::logging::RateLimit =
                            crate::logging::RateLimit::new(10_000);
                        if let Some(suppressed) = LOG.check(wall_ms()) {
                            tracing::warn!(peer = %from, suppressed, "SIP/TCP connection refused: {n} already open from this source");
                        }
                        continue;
                    }
                    let _ = self.register(s, face, from, true);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return,
            }
        }
    }

    /// Reads what a connection has; returns framed messages to hand to the core.
    fn read(&mut self, id: u64, scratch: &mut [u8]) -> Vec<(Face, Peer, Vec<u8>)> {
        let mut msgs = Vec::new();
        let mut close = false;
        let limits = self.limits;
        let Some(c) = self.conns.get_mut(&id) else {
            return msgs;
        };
        for _ in 0..BATCH {
            match c.stream.read(scratch) {
                Ok(0) => {
                    close = true;
                    break;
                }
                Ok(n) => {
                    c.rbuf
                        .extend_from_slice(scratch.get(..n).unwrap_or_default());
                    c.last = Instant::now();
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
        loop {
            match frame(&c.rbuf, &limits) {
                Ok(Framing::Message { skip, len }) => {
                    if skip >= 4 {
                        // RFC 5626 §3.5.1: a CRLFCRLF ping gets a CRLF pong.
                        c.wbuf.extend_from_slice(b"\r\n");
                    }
                    if let Some(m) = c.rbuf.get(skip..skip + len) {
                        msgs.push((
                            c.face,
                            Peer {
                                addr: c.peer,
                                conn: Some(id),
                            },
                            m.to_vec(),
                        ));
                    }
                    c.rbuf.drain(..(skip + len).min(c.rbuf.len()));
                }
                Ok(Framing::Incomplete { skip }) => {
                    if skip >= 4 {
                        c.wbuf.extend_from_slice(b"\r\n");
                    }
                    c.rbuf.drain(..skip.min(c.rbuf.len()));
                    break;
                }
                Err(_) => {
                    // The stream cannot be framed any more: nothing after this is trustworthy.
                    close = true;
                    break;
                }
            }
        }
        if close {
            self.close(id);
        } else {
            self.flush(id);
        }
        msgs
    }

    fn flush(&mut self, id: u64) {
        let mut close = false;
        if let Some(c) = self.conns.get_mut(&id) {
            while !c.wbuf.is_empty() {
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
        let mut id =
            o.to.conn
                .filter(|id| self.conns.get(id).is_some_and(|c| c.face == o.face));
        if id.is_none() {
            id = self
                .conns
                .iter()
                .find(|(_, c)| c.face == o.face && c.peer == o.to.addr)
                .map(|(id, _)| *id);
        }
        if id.is_none() {
            match TcpStream::connect_timeout(&SocketAddr::V4(o.to.addr), CONNECT_TIMEOUT) {
                Ok(s) => id = self.register(s, o.face, o.to.addr, false),
                Err(e) => {
                    static LOG: crate::logging::RateLimit = crate::logging::RateLimit::new(10_000);
                    if let Some(suppressed) = LOG.check(wall_ms()) {
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

    fn close_idle(&mut self, now: Instant) {
        let idle: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| now.saturating_duration_since(c.last) > IDLE && c.wbuf.is_empty())
            .map(|(id, _)| *id)
            .collect();
        for id in idle {
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
                    0 => self.accept(Face::Listen),
                    1 => self.accept(Face::Upstream),
                    id => {
                        if ev.events().contains(EpollFlags::EPOLLOUT) {
                            self.flush(id);
                        }
                        if ev.events().intersects(
                            EpollFlags::EPOLLIN | EpollFlags::EPOLLHUP | EpollFlags::EPOLLERR,
                        ) {
                            for (face, peer, msg) in self.read(id, &mut scratch) {
                                for o in core.on_message(face, peer, &msg, Instant::now()) {
                                    self.send(o);
                                }
                            }
                        }
                    }
                }
            }
            for o in core.tick(Instant::now(), wall_ms()) {
                self.send(o);
            }
            if last_idle_check.elapsed() > Duration::from_secs(10) {
                last_idle_check = Instant::now();
                self.close_idle(last_idle_check);
            }
        }
        core.shutdown();
    }
}
