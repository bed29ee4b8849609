//! Bridge legs of the RTSP proxy: one track interleaved (`$` frames) on one RTSP connection
//! and plain UDP on the other side, on the edge-leg core ([`crate::edge`]).
//!
//! The TCP connection is the RTSP connection itself, shared with the signaling, so the leg
//! does not own a socket as [`crate::edge::Leg`] does; it takes the core's two halves:
//!
//! - **UDP to TCP**: the track's routes toward the interleaved side carry one of the leg's
//!   [`EdgeSink`]s (RTP, RTCP): every engine hands them the admitted packets instead of
//!   sending them. The leg's thread drains the sinks and frames each packet as
//!   `$ channel length payload`; a batch of frames goes to the RTSP connection with one
//!   take of the connection's writer lock and one send, so a frame never splits an RTSP
//!   message. The write never waits (but for a released leg's backlog, below): frames that
//!   find the peer's socket buffer full are dropped and counted as stalls; a frame the buffer cuts keeps its tail in the
//!   connection's [`ConnWriter`], which sends it before anything else (the next batch, an
//!   RTSP reply), so the stream stays in step. A full sink is counted by the engines as
//!   `leg_stall`. Memory stays bounded by the sinks and the kernel buffers.
//! - **Held until the media starts**: a leg on the client's connection opens *held*
//!   ([`LegState::Held`]): it writes nothing, what the engines offer stays queued in its
//!   sinks (bounded; a full sink refuses and counts as today), and the thread sleeps
//!   without being woken per packet. The connection releases it ([`Leg::release`]) right
//!   after it has written the `200` reply to PLAY or RECORD
//!   ([`super::logic::Output::ReleaseClientLegs`], naming the legs that existed when that
//!   reply was made), and the queued packets go out first: that first drain waits for the
//!   client's socket to take them (up to `RELEASE_DRAIN`, 2 s) instead of dropping what
//!   does not fit at once, so the keyframe the hold kept is not lost to it; only what
//!   still does not fit by then counts as stalls.
//!   So no `$` frame ever reaches a client before the reply that starts its media, even
//!   where the reply and the first media take different paths (across the split: the
//!   signaling link and a media link). A leg whose PLAY fails stays held until its track or
//!   session ends and closes it. A leg on the upstream's connection writes at once: the
//!   server has answered the SETUP that opened it, and `$` frames may follow a SETUP.
//! - **TCP to UDP**: the connection's reader de-frames `$` frames on the leg's channels and
//!   hands them to an injector ([`crate::routes::legs::Inject`], [`LegInjectors`], owned by that reader thread): each
//!   packet enters the route keyed by the track's gateway port on the interleaved side as
//!   if it had arrived there as a datagram (source check, counters, the one-way channel).
//!   The consecutive frames of one read on one channel go as one batch: one route lookup
//!   and one `sendmmsg` (or one link lock) for all of them.
//!
//! Each leg is listed in the route tables' [`crate::routes::legs::LegTable`] (admin interface and
//! metrics) with the core's [`LegCounters`], and summed per proxy route in
//! [`super::logic::Events`].
//!
//! Owns: the leg's sinks, its thread and its counters. Does not own: the routes (the
//! exchange installs them), the connection (the writer is lent).

use std::io::{self, Write};
use std::net::{SocketAddrV4, TcpStream};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{
    AtomicBool,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::logic::{Events, LegSpec, TcpSide};
use crate::clock::now_ms;
use crate::routes::legs::{Inject, Legs};
use crate::routes::legs::{LegCounters, LegInfo, LegState};
use crate::routes::{Routes, SessionId};
use crate::sink::{EdgeSink, DEFAULT_SLOTS, SLOT_BYTES};
use crate::stats::Tally;

/// A connection's writer, shared between the RTSP messages, the relayed `$` frames and the
/// legs.
pub type SharedWriter = Arc<Mutex<ConnWriter>>;

/// One connection's write side: the stream (`None` before the upstream connection exists)
/// and the tail of a frame a leg could only half write, which goes out before anything
/// else so the stream stays in step.
pub struct ConnWriter {
    pub stream: Option<TcpStream>,
    tail: Vec<u8>,
}

impl ConnWriter {
    pub fn new(stream: Option<TcpStream>) -> ConnWriter {
        ConnWriter {
            stream,
            // Room for the rest of one largest frame: never grows.
            tail: Vec::with_capacity(4 + usize::from(u16::MAX)),
        }
    }

    /// Writes `bytes` whole after any frame tail, waiting at most the socket's write
    /// timeout.
    pub fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        let Some(s) = self.stream.as_mut() else {
            return Err(io::ErrorKind::NotConnected.into());
        };
        if !self.tail.is_empty() {
            s.write_all(&self.tail)?;
            self.tail.clear();
        }
        s.write_all(bytes)
    }

    /// Waits until the socket takes bytes again, at most until `until` (and [`POLL_MS`] at a
    /// time, so a stop is seen); whether it may.
    fn wait_writable(&self, until: std::time::Instant) -> bool {
        let Some(s) = self.stream.as_ref() else {
            return false;
        };
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return false;
        }
        let ms = u16::try_from(left.as_millis())
            .unwrap_or(u16::MAX)
            .min(POLL_MS);
        let mut fds = [nix::poll::PollFd::new(
            s.as_fd(),
            nix::poll::PollFlags::POLLOUT,
        )];
        match nix::poll::poll(&mut fds, ms) {
            // Timed out (this slice): try again while time is left.
            Ok(0) | Err(nix::errno::Errno::EINTR) => true,
            Ok(_) => fds[0].revents().is_some_and(|r| {
                r.contains(nix::poll::PollFlags::POLLOUT)
                    && !r.intersects(nix::poll::PollFlags::POLLERR | nix::poll::PollFlags::POLLHUP)
            }),
            Err(_) => false,
        }
    }

    /// Sends what the socket takes now, without waiting; the bytes sent.
    fn send_now(&self, buf: &[u8]) -> usize {
        let Some(s) = self.stream.as_ref() else {
            return 0;
        };
        let flags =
            nix::sys::socket::MsgFlags::MSG_DONTWAIT | nix::sys::socket::MsgFlags::MSG_NOSIGNAL;
        loop {
            match nix::sys::socket::send(s.as_raw_fd(), buf, flags) {
                Err(nix::errno::Errno::EINTR) => continue,
                r => return r.unwrap_or(0),
            }
        }
    }
}

/// Packets one sink may give the leg thread per wake-up before the other is served.
const BATCH: usize = 64;
/// The leg thread's write buffer: one batch of frames.
const OUT_BYTES: usize = 64 * 1024;
/// How long the leg thread sleeps at most before looking at its stop flag.
const POLL_MS: u16 = 250;
/// After a held leg is released: how long its first drain (the backlog queued while held,
/// starting with the keyframe the client needs) may wait for the client's socket to take
/// it, instead of dropping what does not fit at once. Tests wait longer (a loaded machine).
const RELEASE_DRAIN: std::time::Duration = if cfg!(test) {
    std::time::Duration::from_secs(30)
} else {
    std::time::Duration::from_secs(2)
};

/// Where a leg sits, for its listing.
pub struct LegPlace {
    pub session: SessionId,
    pub label: String,
    /// The RTSP connection: the gateway's end and the peer's.
    pub local: SocketAddrV4,
    pub peer: SocketAddrV4,
}

/// One running leg.
pub struct Leg {
    pub spec: LegSpec,
    /// Sinks of the routes toward the interleaved side: RTP, RTCP.
    pub sinks: [Arc<EdgeSink>; 2],
    pub counters: Arc<LegCounters>,
    /// The peer of the interleaved side: the source its frames are checked against.
    peer: SocketAddrV4,
    id: u64,
    routes: Arc<Routes>,
    legs: Arc<dyn Legs>,
    events: Arc<Events>,
    /// Writes nothing until [`Leg::release`] (see the module doc).
    held: AtomicBool,
    /// Set by [`Leg::release`], taken by the thread: its next drain is the backlog.
    released: AtomicBool,
    stop: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Leg {
    /// Makes the leg's sinks (taking packets of up to `max_payload` bytes), lists it and
    /// starts its thread writing to `writer`; a leg on the client's connection starts held.
    pub fn open(
        spec: LegSpec,
        max_payload: usize,
        place: LegPlace,
        writer: SharedWriter,
        routes: Arc<Routes>,
        legs: Arc<dyn Legs>,
        events: Arc<Events>,
    ) -> io::Result<Arc<Leg>> {
        let counters = Arc::new(LegCounters::default());
        let sinks = [
            Arc::new(EdgeSink::new(
                DEFAULT_SLOTS,
                max_payload,
                Arc::clone(&counters),
            )?),
            Arc::new(EdgeSink::new(
                DEFAULT_SLOTS,
                max_payload,
                Arc::clone(&counters),
            )?),
        ];
        let held = spec.side == TcpSide::Client;
        counters.set_state(if held {
            LegState::Held
        } else {
            LegState::Connected
        });
        let id = routes.legs.next_id();
        routes.legs.insert(Arc::new(LegInfo {
            id,
            session: place.session,
            label: place.label,
            domain: spec.domain,
            role: "interleaved",
            local: place.local,
            peer: place.peer,
            counters: Arc::clone(&counters),
        }));
        let leg = Arc::new(Leg {
            spec,
            sinks,
            counters,
            peer: place.peer,
            id,
            routes,
            legs,
            events,
            held: AtomicBool::new(held),
            released: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
        });
        let run = Arc::clone(&leg);
        let handle = std::thread::Builder::new()
            .name("rtsp-bridge".into())
            .spawn(move || run.run(&writer));
        match handle {
            Ok(h) => *lock(&leg.thread) = Some(h),
            Err(e) => {
                leg.close();
                return Err(e);
            }
        }
        leg.events.bridge_legs.fetch_add(1, Relaxed);
        Ok(leg)
    }

    /// Whether `$` frames on `channel` of the connection on `side` belong to this leg.
    pub fn takes(&self, side: TcpSide, channel: u8) -> bool {
        self.spec.side == side
            && (channel == self.spec.channels.0 || channel == self.spec.channels.1)
    }

    /// Lets a held leg write: called once the reply that starts the media has been written
    /// on its connection (the frames queued meanwhile go first). Idempotent.
    pub fn release(&self) {
        // Marked before the hold ends, so the thread's first drain after it is patient.
        if self.held.load(Acquire) {
            self.released.store(true, Release);
        }
        if self.held.swap(false, AcqRel) {
            self.counters.set_state(LegState::Connected);
            self.sinks[0].nudge();
        }
    }

    /// Whether the leg still holds its frames.
    pub fn is_held(&self) -> bool {
        self.held.load(Acquire)
    }

    /// Stops the thread, closes the sinks and takes the leg out of the listing.
    pub fn close(&self) {
        self.stop.store(true, Relaxed);
        for s in &self.sinks {
            s.nudge();
        }
        let handle = lock(&self.thread).take();
        if let Some(h) = handle {
            let _ = h.join();
        }
        for s in &self.sinks {
            s.close();
        }
        self.counters.set_state(LegState::Closed);
        self.routes.legs.remove(self.id);
    }

    fn run(&self, writer: &SharedWriter) {
        // One buffer for the leg's life: up to 2 x BATCH frames (`$`, channel, length,
        // packet), written with one lock and one send. Frames are added while fewer than
        // OUT_BYTES - 4 - SLOT_BYTES bytes are used, so the buffer's tail has room for one
        // of the longest packet the sinks take.
        let max_frame = 4 + self.sinks[0].max_payload().max(SLOT_BYTES);
        let mut out = vec![0u8; OUT_BYTES - 4 - SLOT_BYTES + max_frame];
        let mut ends = [0usize; 2 * BATCH];
        let channels = [self.spec.channels.0, self.spec.channels.1];
        // Set while the backlog of a released leg drains: writes wait for room until then.
        let mut patient: Option<std::time::Instant> = None;
        while !self.stop.load(Relaxed) {
            if self.held.load(Acquire) {
                // Held: packets wait in the sinks. Not armed, so offers do not wake this
                // thread; `release` and `close` nudge it.
                self.sleep_on_wake_fds(false);
                continue;
            }
            if self.released.swap(false, AcqRel) {
                patient = Some(std::time::Instant::now() + RELEASE_DRAIN);
            }
            let (mut len, mut n) = (0, 0);
            for (sink, channel) in self.sinks.iter().zip(channels) {
                let mut taken = 0;
                while taken < BATCH && n < ends.len() && len + 4 + SLOT_BYTES <= OUT_BYTES {
                    let Some(slot) = sink.take() else { break };
                    let payload = slot.payload();
                    let size = (payload.len() as u16).to_be_bytes();
                    let Some(frame) = out.get_mut(len..len + 4 + payload.len()) else {
                        break;
                    };
                    frame[..4].copy_from_slice(&[b'$', channel, size[0], size[1]]);
                    frame[4..].copy_from_slice(payload);
                    len += 4 + payload.len();
                    if let Some(e) = ends.get_mut(n) {
                        *e = len;
                    }
                    n += 1;
                    taken += 1;
                }
            }
            if n > 0 {
                self.write_frames(writer, &out[..len], &ends[..n], patient);
                continue;
            }
            // The backlog is out: from now on a write never waits.
            patient = None;
            // Asleep until an engine offers a packet (or the stop nudge).
            if !self.sinks.iter().all(|s| s.prepare_sleep()) {
                for s in &self.sinks {
                    s.unarm();
                }
                continue;
            }
            self.sleep_on_wake_fds(true);
        }
    }

    /// Sleeps until a sink's eventfd fires or [`POLL_MS`] passes; `armed`: the sinks were
    /// armed by `prepare_sleep` and are unarmed after.
    fn sleep_on_wake_fds(&self, armed: bool) {
        let mut fds = [
            nix::poll::PollFd::new(self.sinks[0].wake_fd(), nix::poll::PollFlags::POLLIN),
            nix::poll::PollFd::new(self.sinks[1].wake_fd(), nix::poll::PollFlags::POLLIN),
        ];
        let _ = nix::poll::poll(&mut fds, POLL_MS);
        let fired = fds.map(|f| {
            f.revents()
                .is_some_and(|r| r.contains(nix::poll::PollFlags::POLLIN))
        });
        for (s, fired) in self.sinks.iter().zip(fired) {
            if armed {
                s.unarm();
            }
            if fired {
                s.clear_wake();
            }
        }
    }

    /// Writes whole frames (`ends`: where each ends in `buf`) without waiting (or, until
    /// `patient`, waiting for the socket to take them: a released leg's backlog): frames the
    /// peer's socket buffer does not take are dropped as stalls; a frame cut by the buffer
    /// keeps its tail in the writer, sent before anything else, so the stream stays in
    /// step.
    fn write_frames(
        &self,
        writer: &SharedWriter,
        buf: &[u8],
        ends: &[usize],
        patient: Option<std::time::Instant>,
    ) {
        let mut w = lock(writer);
        let mut whole = 0;
        let mut sent = 0;
        let tail_out = loop {
            if !w.tail.is_empty() {
                let n = w.send_now(&w.tail);
                w.tail.drain(..n);
            }
            if w.tail.is_empty() {
                sent += w.send_now(buf.get(sent..).unwrap_or_default());
            }
            let done = w.tail.is_empty() && sent == buf.len();
            // The writer's lock is held meanwhile, as an RTSP reply's blocking write holds
            // it: the bytes of the connection go out in order either way.
            if done || self.stop.load(Relaxed) || !patient.is_some_and(|t| w.wait_writable(t)) {
                break w.tail.is_empty();
            }
        };
        if tail_out {
            whole = ends.iter().take_while(|&&e| e <= sent).count();
            let start = whole
                .checked_sub(1)
                .and_then(|k| ends.get(k))
                .copied()
                .unwrap_or(0);
            if let Some(&end) = ends.get(whole) {
                if sent > start {
                    w.tail
                        .extend_from_slice(buf.get(sent..end).unwrap_or_default());
                    whole += 1;
                }
            }
        }
        drop(w);
        let written = whole
            .checked_sub(1)
            .and_then(|k| ends.get(k))
            .copied()
            .unwrap_or(0);
        let payload = (written - 4 * whole) as u64;
        let c = &self.counters;
        c.frames_out.fetch_add(whole as u64, Relaxed);
        c.bytes_out.fetch_add(payload, Relaxed);
        self.events
            .bridge_frames_to_tcp
            .fetch_add(whole as u64, Relaxed);
        self.events.bridge_bytes_to_tcp.fetch_add(payload, Relaxed);
        let lost = (ends.len() - whole) as u64;
        if lost > 0 {
            c.stalls.fetch_add(lost, Relaxed);
            self.events.bridge_stalls.fetch_add(lost, Relaxed);
        }
    }
}

/// A reader thread's injectors of one leg (RTP, RTCP), made when it first sees the leg.
pub struct LegInjectors {
    pub leg: Arc<Leg>,
    injectors: [Box<dyn Inject>; 2],
}

impl LegInjectors {
    pub fn new(leg: Arc<Leg>, max_payload: usize) -> LegInjectors {
        let make = |port: u16| leg.legs.injector(leg.spec.domain, port, max_payload);
        let injectors = [make(leg.spec.inject[0]), make(leg.spec.inject[1])];
        LegInjectors { leg, injectors }
    }

    /// Frames from the interleaved side on one of the leg's channels, consecutive in one
    /// read: into the route of the track's gateway port, as datagrams arriving there would,
    /// with one route lookup and one send for the batch. No allocation, no lock.
    /// The frames' payloads are at `frames` in `buf`.
    pub fn inject_batch(&mut self, channel: u8, buf: &[u8], frames: &[std::ops::Range<usize>]) {
        let LegInjectors { leg, injectors } = self;
        let i = usize::from(channel != leg.spec.channels.0);
        let Some(inj) = injectors.get_mut(i) else {
            return;
        };
        let route = inj.route();
        let now = now_ms();
        let mut t = Tally::default();
        inj.forward_batch(route.as_deref(), leg.peer, buf, frames, now, &mut t);
        inj.finish(route.as_deref(), &t, now);
        let (c, ev) = (&leg.counters, &leg.events);
        #[cfg(test)]
        c.batches_in.fetch_add(1, Relaxed);
        c.frames_in.fetch_add(t.rx_packets, Relaxed);
        c.bytes_in.fetch_add(t.rx_bytes, Relaxed);
        ev.bridge_frames_to_udp.fetch_add(t.tx_packets, Relaxed);
        ev.bridge_bytes_to_udp.fetch_add(t.tx_bytes, Relaxed);
        let dropped = t.rx_packets.saturating_sub(t.tx_packets);
        if dropped > 0 {
            c.inject_drops.fetch_add(dropped, Relaxed);
            ev.bridge_dropped.fetch_add(dropped, Relaxed);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DomainId;
    use std::io::Read;
    use std::net::TcpListener;
    use std::time::{Duration, Instant};

    /// A leg on a loopback connection whose writer is also returned; on the client's side
    /// it starts held.
    fn leg_on(side: TcpSide) -> (Arc<Leg>, TcpStream, Arc<Events>, Arc<Routes>, SharedWriter) {
        leg_on_buffers(side, None)
    }

    /// [`leg_on`], the socket buffers on both ends `bufs` bytes when given (small: a
    /// connection that takes little at a time).
    fn leg_on_buffers(
        side: TcpSide,
        bufs: Option<usize>,
    ) -> (Arc<Leg>, TcpStream, Arc<Events>, Arc<Routes>, SharedWriter) {
        use nix::sys::socket::{setsockopt, sockopt};
        let cfg = crate::config::parse(crate::config::DEFAULT_TOML, "default").unwrap();
        let routes = Arc::new(Routes::new(&cfg, Arc::new(crate::routes::NoHooks)));
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        if let Some(b) = bufs {
            // Inherited by the connection accepted: its window stays small.
            setsockopt(&l, sockopt::RcvBuf, &b).unwrap();
        }
        let ours = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        if let Some(b) = bufs {
            setsockopt(&ours, sockopt::SndBuf, &b).unwrap();
        }
        let (peer, _) = l.accept().unwrap();
        ours.set_write_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let addr = |a: std::net::SocketAddr| match a {
            std::net::SocketAddr::V4(a) => a,
            _ => unreachable!(),
        };
        let place = LegPlace {
            session: 1,
            label: "t".into(),
            local: addr(ours.local_addr().unwrap()),
            peer: addr(ours.peer_addr().unwrap()),
        };
        let events = Arc::new(Events::default());
        let spec = LegSpec {
            domain: DomainId::B,
            side,
            channels: (4, 5),
            inject: [30000, 30001],
        };
        let writer: SharedWriter = Arc::new(Mutex::new(ConnWriter::new(Some(ours))));
        let leg = Leg::open(
            spec,
            4096,
            place,
            Arc::clone(&writer),
            Arc::clone(&routes),
            Arc::new(crate::edge::EdgeLegs::new(Arc::clone(&routes), None)),
            Arc::clone(&events),
        )
        .unwrap();
        (leg, peer, events, routes, writer)
    }

    /// How long a reader waits for frames that are expected.
    const LONG: Duration = Duration::from_secs(10);

    /// A leg that writes at once (on the upstream's side, or a client's leg released).
    fn leg_on_loopback() -> (Arc<Leg>, TcpStream, Arc<Events>, Arc<Routes>) {
        let (leg, peer, events, routes, _) = leg_on(TcpSide::Upstream);
        assert!(!leg.is_held());
        (leg, peer, events, routes)
    }

    /// Reads `$` frames until `n` arrived, the connection ends or the peer is quiet for
    /// `quiet`; each must be well formed. Where frames are expected `quiet` is long (a
    /// loaded machine); only a check that nothing comes uses a short one.
    fn read_frames(peer: &mut TcpStream, n: usize, quiet: Duration) -> Vec<(u8, Vec<u8>)> {
        peer.set_read_timeout(Some(quiet)).unwrap();
        let mut out = Vec::new();
        let mut head = [0u8; 4];
        while out.len() < n && peer.read_exact(&mut head).is_ok() {
            assert_eq!(head[0], b'$', "the stream is in step");
            let mut body = vec![0u8; usize::from(u16::from_be_bytes([head[2], head[3]]))];
            if peer.read_exact(&mut body).is_err() {
                // The connection ended inside a frame (its tail never went out).
                break;
            }
            out.push((head[1], body));
        }
        out
    }

    #[test]
    fn packets_offered_to_the_sinks_reach_the_peer_as_frames_on_their_channels() {
        let (leg, mut peer, events, routes) = leg_on_loopback();
        assert_eq!(routes.legs.len(), 1, "listed");
        for i in 0..10u8 {
            assert!(leg.sinks[0].offer(&[0x80, 96, 0, i]));
        }
        for i in 0..3u8 {
            assert!(leg.sinks[1].offer(&[0x80, 200, 0, 6, i]));
        }
        let frames = read_frames(&mut peer, 13, LONG);
        assert_eq!(frames.len(), 13);
        let rtp: Vec<_> = frames.iter().filter(|f| f.0 == 4).collect();
        assert_eq!(rtp.len(), 10);
        assert_eq!(rtp[9].1, [0x80, 96, 0, 9], "in order");
        assert_eq!(frames.iter().filter(|f| f.0 == 5).count(), 3);
        // Counted just after the send.
        let deadline = Instant::now() + Duration::from_secs(5);
        while leg.counters.frames_out.load(Relaxed) < 13 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(leg.counters.frames_out.load(Relaxed), 13);
        assert_eq!(events.bridge_bytes_to_tcp.load(Relaxed), 10 * 4 + 3 * 5);
        leg.close();
        assert!(routes.legs.is_empty(), "out of the listing");
        assert!(!leg.sinks[0].offer(&[0x80]), "a closed leg takes nothing");
    }

    /// Waits (bounded) until `done`; the verdict is the caller's, on state, never on time.
    fn wait_until(mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// The defect this guards against: across the split the first media can reach the leg
    /// before the PLAY reply reaches the connection. A client-side leg holds what it is
    /// offered until released, and the connection releases it right after writing the
    /// reply: the peer reads the reply whole, then every frame offered before it, in order.
    /// Deterministic: the reply is written only once the offered packets are either written
    /// (a leg that does not hold: the test fails) or queued in a held leg.
    #[test]
    fn a_client_leg_holds_its_frames_until_released_after_the_reply() {
        let (leg, mut peer, _events, routes, writer) = leg_on(TcpSide::Client);
        assert!(leg.is_held());
        assert_eq!(routes.legs.list()[0].counters.state(), LegState::Held);
        for i in 0..5u8 {
            assert!(leg.sinks[0].offer(&[0x80, 96, 0, i]));
        }
        assert!(leg.sinks[1].offer(&[0x80, 200, 0, 6]));
        wait_until(|| {
            leg.counters.frames_out.load(Relaxed) == 6
                || (leg.is_held() && leg.sinks[0].len() == 5 && leg.sinks[1].len() == 1)
        });
        assert_eq!(
            leg.counters.frames_out.load(Relaxed),
            0,
            "nothing written while held"
        );
        let reply = b"RTSP/1.0 200 OK\r\nCSeq: 3\r\nSession: 1\r\n\r\n";
        lock(&writer).write_all(reply).unwrap();
        leg.release();
        assert_eq!(leg.counters.state(), LegState::Connected);
        let mut head = vec![0u8; reply.len()];
        peer.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        peer.read_exact(&mut head).unwrap();
        assert_eq!(head, reply, "the reply comes first, whole");
        let frames = read_frames(&mut peer, 6, LONG);
        assert_eq!(frames.len(), 6, "then every frame queued while held");
        let rtp: Vec<_> = frames.iter().filter(|f| f.0 == 4).map(|f| f.1[3]).collect();
        assert_eq!(rtp, [0, 1, 2, 3, 4], "in order");
        leg.release();
        leg.close();
    }

    /// The backlog a held leg queued (a full sink: the keyframe the client waits for) goes
    /// out whole on release even when the client's socket takes only a little at a time:
    /// the first drain waits for room instead of dropping what does not fit at once.
    /// Deterministic: the peer reads only after the release, through small buffers, so a
    /// leg that does not wait drops most of the backlog.
    #[test]
    fn a_released_backlog_waits_for_a_slow_socket_instead_of_dropping() {
        let (leg, mut peer, events, _routes, _writer) = leg_on_buffers(TcpSide::Client, Some(4096));
        let mut packet = [0u8; 1400];
        packet[0] = 0x80;
        for i in 0..DEFAULT_SLOTS {
            packet[2..4].copy_from_slice(&(i as u16).to_be_bytes());
            assert!(leg.sinks[0].offer(&packet));
        }
        leg.release();
        let frames = read_frames(&mut peer, DEFAULT_SLOTS, LONG);
        assert_eq!(frames.len(), DEFAULT_SLOTS, "the whole backlog arrives");
        let seq: Vec<u16> = frames
            .iter()
            .map(|f| u16::from_be_bytes([f.1[2], f.1[3]]))
            .collect();
        assert!(
            seq.iter().enumerate().all(|(i, s)| usize::from(*s) == i),
            "in order"
        );
        assert_eq!(leg.counters.stalls.load(Relaxed), 0, "nothing dropped");
        assert_eq!(events.bridge_stalls.load(Relaxed), 0);
        leg.close();
    }

    /// A held leg whose sinks fill refuses and counts the rest (bounded); closed while
    /// still held (a PLAY that never succeeded), it writes nothing and counts what it held.
    #[test]
    fn a_leg_held_forever_is_bounded_and_closes_clean() {
        let (leg, mut peer, events, routes, _writer) = leg_on(TcpSide::Client);
        let mut refused = 0u64;
        for i in 0..(DEFAULT_SLOTS + 10) {
            if !leg.sinks[0].offer(&[0x80, 96, 0, i as u8]) {
                refused += 1;
            }
        }
        assert_eq!(refused, 10, "the sink is bounded");
        assert_eq!(leg.counters.stalls.load(Relaxed), 10);
        leg.close();
        assert!(routes.legs.is_empty());
        assert_eq!(
            leg.counters.stalls.load(Relaxed),
            10 + DEFAULT_SLOTS as u64,
            "what it held counts as stalls at the close"
        );
        assert_eq!(events.bridge_frames_to_tcp.load(Relaxed), 0);
        assert!(
            read_frames(&mut peer, 1, Duration::from_millis(500)).is_empty(),
            "nothing was written"
        );
    }

    #[test]
    fn a_peer_that_never_reads_costs_stalls_not_memory_and_the_stream_stays_in_step() {
        let (leg, mut peer, events, _routes) = leg_on_loopback();
        let packet = [0x80u8; 1400];
        let mut offered = 0u64;
        let deadline = Instant::now() + Duration::from_secs(20);
        // Offer until the leg has dropped frames for a while (bounded in count and time).
        while events.bridge_stalls.load(Relaxed) < 200 && Instant::now() < deadline {
            if leg.sinks[0].offer(&packet) {
                offered += 1;
            }
            if offered.is_multiple_of(64) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let stalls = events.bridge_stalls.load(Relaxed);
        assert!(stalls >= 200, "{stalls} stalls");
        // Everything the peer finally reads is whole frames in step, as many as were
        // written (the last one may have its tail still in the writer when the leg closes).
        let written = leg.counters.frames_out.load(Relaxed);
        leg.close();
        drop(leg);
        let frames = read_frames(&mut peer, usize::MAX, LONG);
        let read = frames.len() as u64;
        assert!(
            read == written || read + 1 == written,
            "{read} of {written}"
        );
        assert!(frames.iter().all(|f| f.0 == 4 && f.1.len() == 1400));
        assert!(written + stalls <= offered);
    }
}
