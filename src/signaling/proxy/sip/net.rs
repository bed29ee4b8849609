//! The sockets of one SIP proxy and its event loop: one thread, one epoll, the [`Core`]s
//! owned by that thread (no lock on the message path).
//!
//! A proxy serves a **group** of routes ([`Member`]s) that share sockets: the pair of routes
//! of one deployment (one listening in each domain) shares the gateway's SIP socket on each
//! side, each route's upstream face being the other's listen face. Each message received on
//! a socket shared by several routes goes to the route that claims it most strongly
//! ([`Core::claim`], [`pick`]): the route whose transaction or dialog it is, then the one
//! through which the addressed device registered, then the one listening there; a route's
//! answers leave by its own face's socket. A socket of one route skips the claim.
//!
//! UDP: a socket per face (shared within the group); up to [`BATCH`] datagrams per socket per wakeup, into one
//! 64 KiB buffer reused for every datagram (UDP datagrams up to 64 KiB cross loopback and
//! veth; over a real path IP fragmentation carries them, and a route whose path drops
//! fragments should use TCP, see the module doc of [`super`]).
//!
//! TCP: a listener per socket (the upstream face listens on the port its Contact and Via
//! show); connections belong to the socket, not to a route (a platform's one connection
//! carries the answers to one route and the new requests of the other), accepted and outgoing connections framed by Content-Length ([`take_frames`], over
//! [`frame`]), at most `max_connections_per_source` accepted connections per source address
//! (the next one is accepted and closed at once, counted) and [`MAX_CONNS`] in all. A
//! CRLFCRLF keep-alive gets a CRLF pong (RFC 5626 §3.5.1). A stream that cannot be framed
//! any more (a message over `max_tcp_message`, a missing or double Content-Length) is answered
//! when its head is a readable request (`513`/`400`, [`Core::on_stream_error`]), counted,
//! and closed gracefully: our side is shut down, what the peer still sends is read and
//! discarded for [`LINGER`], so the answer is not lost to a reset. A connection whose unsent
//! data passes [`MAX_PENDING`] is closed.
//!
//! Mirroring: an accepted connection's messages to the other face go on a connection
//! opened for it (its *mate*, made by the first such message); when either of the two ends,
//! for whatever reason, the other is closed gracefully ([`TcpNet::begin_close`]) and counted
//! (`tcp_closes_mirrored`). So a platform sees its connection drop when the device's did (it
//! takes the device as offline only then), and the reverse. Other messages go on the
//! connection they name, else one to their address that mirrors nobody, if any.
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

use super::core::{Claim, Core, Counters, Face, Out, Peer};
use crate::clock::now_ms;

/// Datagrams or reads per socket per wakeup, so one busy peer cannot starve the rest.
pub const BATCH: usize = 64;
/// Connections open at once (accepted and outgoing).
pub const MAX_CONNS: usize = 1024;
/// Unsent bytes queued on one connection before it is closed as stuck (at least twice the
/// largest message).
pub const MAX_PENDING: usize = 4 << 20;
/// A connection's receive buffer grown past this by a large message is shrunk once the
/// message is taken.
pub const SHRINK_ABOVE: usize = 256 << 10;
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

/// One route of a proxy's group: its core, and the index of the group's socket each of its
/// faces uses (by [`Face::index`]).
pub struct Member {
    pub core: Core,
    pub socks: [usize; 2],
}

/// The route (member index) and face a message received on socket `sock` goes to: the
/// strongest [`Claim`] among the routes with a face there, the first in config order on a
/// tie. `on`: for each socket, the (member, face) pairs using it.
pub fn pick(
    members: &[Member],
    on: &[Vec<(usize, Face)>],
    sock: usize,
    peer: Peer,
    msg: &[u8],
) -> Option<(usize, Face)> {
    let cands = on.get(sock)?;
    if cands.len() <= 1 {
        return cands.first().copied();
    }
    let now = Instant::now();
    let claim = |&(m, face): &(usize, Face)| {
        members
            .get(m)
            .map_or(Claim::None, |x| x.core.claim(face, peer, msg, now))
    };
    // `max_by_key` keeps the last of equals: walk backwards to keep the first.
    cands.iter().rev().max_by_key(|c| claim(c)).copied()
}

/// For each of `n` sockets, the (member, face) pairs using it, listen faces first.
pub fn users(members: &[Member], n: usize) -> Vec<Vec<(usize, Face)>> {
    let mut on = vec![Vec::new(); n];
    for face in Face::BOTH {
        for (i, m) in members.iter().enumerate() {
            if let Some(v) = on.get_mut(m.socks[face.index()]) {
                v.push((i, face));
            }
        }
    }
    on
}

/// Runs a UDP proxy until a stop flag is set; then ends every call.
pub fn run_udp(mut members: Vec<Member>, socks: Vec<UdpSocket>, stop: &[Arc<AtomicBool>]) {
    let Ok(epoll) = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC) else {
        tracing::error!("SIP proxy: cannot create an epoll instance; the route is not served");
        for m in &mut members {
            m.core.shutdown(Instant::now());
        }
        return;
    };
    for (i, s) in socks.iter().enumerate() {
        let _ = s.set_nonblocking(true);
        let _ = epoll.add(s.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, i as u64));
    }
    let on = users(&members, socks.len());
    let mut buf = vec![0u8; 65_536];
    let mut events = [EpollEvent::empty(); 16];
    while !stopped(stop) {
        let n = epoll
            .wait(&mut events, EpollTimeout::from(100u16))
            .unwrap_or(0);
        for ev in events.iter().take(n) {
            let s = ev.data() as usize;
            let Some(sock) = socks.get(s) else {
                continue;
            };
            for _ in 0..BATCH {
                match sock.recv_from(&mut buf) {
                    Ok((len, from)) => {
                        let (Some(from), Some(msg)) = (v4(from), buf.get(..len)) else {
                            continue;
                        };
                        let peer = Peer::udp(from);
                        let Some((m, face)) = pick(&members, &on, s, peer, msg) else {
                            continue;
                        };
                        if let Some(m) = members.get_mut(m) {
                            let outs = traced(&mut m.core, face, peer, msg);
                            send_udp(&socks, m.socks, outs);
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(_) => break,
                }
            }
        }
        for m in &mut members {
            let outs = m.core.tick(Instant::now(), now_ms());
            send_udp(&socks, m.socks, outs);
        }
    }
    for m in &mut members {
        let outs = m.core.shutdown(Instant::now());
        send_udp(&socks, m.socks, outs);
    }
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

fn send_udp(socks: &[UdpSocket], map: [usize; 2], outs: Vec<Out>) {
    for o in outs {
        if let Some(s) = socks.get(map[o.face.index()]) {
            // A send error (no route, buffer full) is the same as a datagram lost on the
            // way: SIP over UDP retransmits.
            let _ = s.send_to(&o.bytes, o.to.addr);
        }
    }
}

/// Adds one to `counts[member]`.
fn count(counts: &mut Vec<u64>, member: usize) {
    if counts.len() <= member {
        counts.resize(member + 1, 0);
    }
    if let Some(n) = counts.get_mut(member) {
        *n += 1;
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
    /// Bytes the buffer must hold before framing again can find the next message (its
    /// whole length once its head is in; 0: frame on the next read).
    pub need: usize,
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
            Ok(Framing::Incomplete { skip, need }) => {
                f.need = need;
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
    /// A message on a connection of socket `.0`.
    Message(usize, Peer, Vec<u8>),
    /// The stream cannot be framed: the error and the bytes buffered at that point.
    Broken(usize, Peer, SipError, Vec<u8>),
}

/// Connection ids start here; below are the listeners' epoll tokens.
const FIRST_CONN: u64 = 1 << 20;

struct Conn {
    stream: TcpStream,
    /// The group's socket (listener) it belongs to.
    sock: usize,
    /// The member whose counters its failures go to (who opened it; for an accepted one
    /// the first route on its socket).
    owner: usize,
    peer: SocketAddrV4,
    accepted: bool,
    rbuf: Vec<u8>,
    /// What `rbuf` must hold before it is framed again ([`Frames::need`]).
    need: usize,
    wbuf: Vec<u8>,
    last: Instant,
    /// Outgoing, not connected yet: since when.
    connecting: Option<Instant>,
    /// Refused: our side shut down (once `wbuf` is sent), input discarded, since when.
    closing: Option<Instant>,
    /// The connection on the other side that mirrors this one: for an accepted one, the
    /// connection vgate opened to carry its messages on; for that one, the accepted one.
    /// When either ends, the other is closed too.
    mate: Option<u64>,
}

/// The TCP side: listeners, connections, and the loop.
pub struct TcpNet {
    epoll: Epoll,
    listeners: Vec<TcpListener>,
    conns: HashMap<u64, Conn>,
    next_id: u64,
    /// Accepted connections by socket and source address.
    per_source: HashMap<(usize, std::net::Ipv4Addr), usize>,
    /// Each socket's cap: the largest `max_connections_per_source` of its routes.
    max_per_source: Vec<usize>,
    limits: Limits,
    /// Outgoing connections refused or timed out, by member, since the cores last took
    /// the count.
    failed_connects: Vec<u64>,
    /// Connections closed because their mate ended ([`Conn::mate`]), by member, since the
    /// cores last took the count.
    mirrored: Vec<u64>,
}

static LOG_CONNECT: crate::logging::RateLimit = crate::logging::RateLimit::new(10_000);

impl TcpNet {
    /// `max_per_source`: each listener's cap on accepted connections per source address;
    /// `max_message`: the largest message any route of the group takes.
    pub fn new(
        listeners: Vec<TcpListener>,
        max_per_source: Vec<usize>,
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
            next_id: FIRST_CONN,
            per_source: HashMap::new(),
            max_per_source,
            limits: Limits {
                max_message,
                ..Limits::default()
            },
            failed_connects: Vec::new(),
            mirrored: Vec::new(),
        })
    }

    fn register(
        &mut self,
        stream: TcpStream,
        (sock, owner): (usize, usize),
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
            *self.per_source.entry((sock, *peer.ip())).or_insert(0) += 1;
        }
        let now = Instant::now();
        self.conns.insert(
            id,
            Conn {
                stream,
                sock,
                owner,
                peer,
                accepted,
                rbuf: Vec::new(),
                need: 0,
                wbuf: Vec::new(),
                last: now,
                connecting: connecting.then_some(now),
                closing: None,
                mate: None,
            },
        );
        Some(id)
    }

    fn close(&mut self, id: u64) {
        if let Some(c) = self.conns.remove(&id) {
            let _ = self.epoll.delete(c.stream.as_fd());
            // Its mate on the other side ends too (gracefully: what is queued is sent), so
            // the peer there sees what this peer did (a platform takes a device whose
            // connection dropped as offline only when its own connection drops).
            if let Some(m) = c.mate {
                let live = self.conns.get_mut(&m).filter(|m| m.closing.is_none());
                if let Some(mate) = live {
                    mate.mate = None;
                    let owner = mate.owner;
                    tracing::info!(peer = %c.peer, mate = %mate.peer, "SIP/TCP: connection ended; closing the one that mirrors it on the other side");
                    self.begin_close(m);
                    count(&mut self.mirrored, owner);
                }
            }
            if c.accepted {
                let key = (c.sock, *c.peer.ip());
                if let Some(n) = self.per_source.get_mut(&key) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        self.per_source.remove(&key);
                    }
                }
            }
        }
    }

    /// Starts an outgoing connection without waiting for it (the socket is non-blocking;
    /// `flush` finishes it when epoll reports it writable).
    fn connect(&mut self, (sock, owner): (usize, usize), to: SocketAddrV4) -> std::io::Result<u64> {
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
        self.register(TcpStream::from(fd), (sock, owner), to, false, true)
            .ok_or_else(|| std::io::Error::other(format!("{MAX_CONNS} connections already open")))
    }

    /// Accepts what listener `sock` has; `owner` (the first route there) counts refusals.
    fn accept(&mut self, sock: usize, owner: usize, counters: &mut Counters) {
        let max = self.max_per_source.get(sock).copied().unwrap_or(0);
        for _ in 0..BATCH {
            let Some(l) = self.listeners.get(sock) else {
                return;
            };
            match l.accept() {
                Ok((s, from)) => {
                    let Some(from) = v4(from) else { continue };
                    let n = self
                        .per_source
                        .get(&(sock, *from.ip()))
                        .copied()
                        .unwrap_or(0);
                    if n >= max {
                        counters.tcp_connections_refused += 1;
                        static LOG: crate::logging::RateLimit =
                            crate::logging::RateLimit::new(10_000);
                        if let Some(suppressed) = LOG.check(now_ms()) {
                            tracing::warn!(peer = %from, suppressed, "SIP/TCP connection refused: {n} already open from this source (max_connections_per_source)");
                        }
                        // Dropping the stream closes it: the peer sees the connection end.
                        continue;
                    }
                    if self.register(s, (sock, owner), from, true, false).is_none() {
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
        if c.closing.is_none() && c.rbuf.len() >= c.need {
            let f = take_frames(&mut c.rbuf, &limits);
            c.need = f.need;
            // A large message (a cascade's Catalog) leaves no large buffer behind.
            if c.rbuf.capacity() > SHRINK_ABOVE && c.rbuf.len() <= SHRINK_ABOVE / 4 {
                c.rbuf.shrink_to(SHRINK_ABOVE / 4);
            }
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
                    .map(|m| Event::Message(c.sock, peer, m)),
            );
            if let Some(e) = f.error {
                // Nothing after this is trustworthy; the core answers, then we close.
                events.push(Event::Broken(c.sock, peer, e, std::mem::take(&mut c.rbuf)));
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
        let mut failed = None;
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
                        failed = Some(c.owner);
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
            if c.wbuf.is_empty() && c.wbuf.capacity() > SHRINK_ABOVE {
                c.wbuf.shrink_to(SHRINK_ABOVE / 4);
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
            if c.wbuf.len() > MAX_PENDING.max(2 * self.limits.max_message) {
                close = true;
            }
        }
        if let Some(owner) = failed {
            self.count_failure(owner);
        }
        if close {
            self.close(id);
        }
    }

    fn count_failure(&mut self, member: usize) {
        count(&mut self.failed_connects, member);
    }

    /// Sends `o` (of member `member`) on socket `sock`: on the connection it names, else
    /// (a message that came on accepted connection `from` of the other side) on the
    /// connection opened for that one (its mate, made now if it has none), else on one to
    /// its address (one nobody mirrors first), else on a new one.
    fn send(&mut self, o: Out, sock: usize, member: usize, from: Option<u64>) {
        let usable = |c: &Conn| c.sock == sock && c.closing.is_none();
        let mut id =
            o.to.conn
                .filter(|id| self.conns.get(id).is_some_and(usable));
        let origin = from.and_then(|f| {
            self.conns
                .get(&f)
                .filter(|c| c.accepted && c.sock != sock && c.closing.is_none())
                .map(|c| (f, c.mate))
        });
        let mut mate_of = None;
        if id.is_none() {
            match origin {
                Some((_, Some(m))) => {
                    id = Some(m).filter(|m| {
                        self.conns
                            .get(m)
                            .is_some_and(|c| usable(c) && c.peer == o.to.addr)
                    });
                }
                Some((f, None)) => mate_of = Some(f),
                None => {}
            }
        }
        if id.is_none() && mate_of.is_none() {
            let to = |c: &&Conn| usable(c) && c.peer == o.to.addr;
            id = self
                .conns
                .iter()
                .filter(|(_, c)| to(c))
                .min_by_key(|(_, c)| c.mate.is_some())
                .map(|(id, _)| *id);
        }
        if id.is_none() {
            match self.connect((sock, member), o.to.addr) {
                Ok(new) => {
                    if let Some(f) = mate_of {
                        for (a, b) in [(f, new), (new, f)] {
                            if let Some(c) = self.conns.get_mut(&a) {
                                c.mate = Some(b);
                            }
                        }
                    }
                    id = Some(new)
                }
                Err(e) => {
                    self.count_failure(member);
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
            if let Some(owner) = self.conns.get(&id).map(|c| c.owner) {
                self.count_failure(owner);
            }
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

    /// Runs the group's routes until a stop flag is set; then ends every call.
    pub fn run(mut self, mut members: Vec<Member>, stop: &[Arc<AtomicBool>]) {
        let mut scratch = vec![0u8; 65_536];
        let mut events = [EpollEvent::empty(); 64];
        let mut last_idle_check = Instant::now();
        let on = users(&members, self.listeners.len());
        let send_all =
            |net: &mut TcpNet, m: usize, socks: [usize; 2], outs: Vec<Out>, from: Option<u64>| {
                for o in outs {
                    let sock = socks[o.face.index()];
                    net.send(o, sock, m, from);
                }
            };
        while !stopped(stop) {
            let n = self
                .epoll
                .wait(&mut events, EpollTimeout::from(100u16))
                .unwrap_or(0);
            for ev in events.iter().take(n) {
                let id = ev.data();
                if id < FIRST_CONN {
                    let sock = id as usize;
                    let owner = on.get(sock).and_then(|v| v.first()).map_or(0, |c| c.0);
                    if let Some(m) = members.get_mut(owner) {
                        self.accept(sock, owner, &mut m.core.counters);
                    }
                    continue;
                }
                if ev.events().contains(EpollFlags::EPOLLOUT) {
                    self.flush(id);
                }
                if !ev
                    .events()
                    .intersects(EpollFlags::EPOLLIN | EpollFlags::EPOLLHUP | EpollFlags::EPOLLERR)
                {
                    continue;
                }
                if self.conns.get(&id).is_some_and(|c| c.connecting.is_some()) {
                    self.flush(id);
                }
                for e in self.read(id, &mut scratch) {
                    match e {
                        Event::Message(sock, peer, msg) => {
                            let Some((i, face)) = pick(&members, &on, sock, peer, &msg) else {
                                continue;
                            };
                            let Some(m) = members.get_mut(i) else {
                                continue;
                            };
                            let outs = traced(&mut m.core, face, peer, &msg);
                            send_all(&mut self, i, m.socks, outs, peer.conn);
                        }
                        Event::Broken(sock, peer, err, bytes) => {
                            if let Some((i, face)) = pick(&members, &on, sock, peer, &bytes) {
                                if let Some(m) = members.get_mut(i) {
                                    let outs = m.core.on_stream_error(
                                        face,
                                        peer,
                                        &bytes,
                                        &err,
                                        Instant::now(),
                                    );
                                    send_all(&mut self, i, m.socks, outs, None);
                                }
                            }
                            self.begin_close(id);
                        }
                    }
                }
            }
            for (i, m) in members.iter_mut().enumerate() {
                let outs = m.core.tick(Instant::now(), now_ms());
                send_all(&mut self, i, m.socks, outs, None);
            }
            let now = Instant::now();
            let idle_too = now.saturating_duration_since(last_idle_check) > Duration::from_secs(10);
            if idle_too {
                last_idle_check = now;
            }
            self.expire(now, idle_too);
            for (i, n) in self.failed_connects.iter_mut().enumerate() {
                if let Some(m) = members.get_mut(i) {
                    m.core.counters.tcp_connect_failures += std::mem::take(n);
                }
            }
            for (i, n) in self.mirrored.iter_mut().enumerate() {
                if let Some(m) = members.get_mut(i) {
                    m.core.counters.tcp_closes_mirrored += std::mem::take(n);
                }
            }
        }
        for (i, m) in members.iter_mut().enumerate() {
            let outs = m.core.shutdown(Instant::now());
            send_all(&mut self, i, m.socks, outs, None);
        }
    }
}
