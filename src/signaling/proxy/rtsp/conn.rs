//! One client connection: two threads around an [`Exchange`].
//!
//! The client thread reads the client's socket (requests and interleaved `$` frames), opens
//! the upstream connection when the first routable request arrives, and keeps the timers
//! (session idle, no media, shutdown) on a one-second read timeout. The upstream thread
//! reads the upstream's socket (replies and `$` frames). Both hand messages to the exchange
//! under one lock and take the writer lock of the socket they write before letting the
//! exchange go, so bytes reach each peer in the exchange's order. Interleaved frames are
//! relayed as they arrive, channel numbers untouched, counted per direction; frames on a
//! bridge leg's channels go to that leg's injectors (each reader thread owns its own, see
//! [`super::bridge`]); frames on channels no SETUP negotiated are dropped and counted.
//! [`RoutesMedia`] opens and closes the legs and puts their sinks on the track's routes;
//! the legs on the client's connection start held and are released right after the reply
//! that starts the media has been written ([`Output::ReleaseClientLegs`]).

use std::io::{self, Read};
use std::net::{Shutdown, SocketAddrV4, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::bridge::{ConnWriter, Leg, LegInjectors, LegPlace, SharedWriter};
use super::logic::{Events, Exchange, LegSpec, MediaPorts, Output, Settings, TcpSide};
use crate::clock::now_ms;
use crate::config::DomainId;
use crate::routes::legs::Legs;
use crate::routes::{Channel, RouteError, RouteSpec, Routes, SessionId, SessionKind, StreamRoute};
use crate::signaling::proxy::trace::Dir;
use crate::signaling::rtsp::{next_frame, Frame};

/// How long a connect to the upstream may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A peer that does not take our bytes for this long is cut off.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Timer resolution of the client thread.
const TICK: Duration = Duration::from_millis(500);
/// Extra slack on the session timeout before vgate ends an idle session.
const SESSION_GRACE_MS: u64 = 2_000;
const READ_CHUNK: usize = 64 * 1024;

/// The route tables seen through one connection's session.
pub struct RoutesMedia {
    routes: Arc<Routes>,
    label: String,
    session: Option<SessionId>,
    installed: Vec<Arc<StreamRoute>>,
    /// What bridge legs need: absent, the connection cannot open any.
    bridge: Option<LegContext>,
}

/// What a connection's bridge legs need.
struct LegContext {
    settings: Arc<Settings>,
    /// Where the legs' injectors come from.
    injectors: Arc<dyn Legs>,
    /// The client's and the upstream's writers.
    client: SharedWriter,
    upstream: SharedWriter,
    legs: Arc<ConnLegs>,
}

/// The open legs of one connection, for its readers: they keep a copy (`LegCache`) and
/// take a new one only when `generation` moved, so no frame takes a lock.
#[derive(Default)]
pub struct ConnLegs {
    legs: Mutex<Vec<Arc<Leg>>>,
    generation: AtomicU64,
}

/// A reader's copy of the [`ConnLegs`], with its own injectors for each leg. It may
/// outlive a leg's ports (until the next frame refreshes it): the injectors hold the egress
/// sockets only weakly, so the TEARDOWN this same thread handles closes them at once.
///
/// It also gathers the `$` frames of one read that go to the same leg and channel, one
/// after the other, into a batch ([`LegInjectors::inject_batch`]: one route lookup, one
/// send): sent when a frame for another leg or channel, anything else on the connection,
/// or the end of the read comes, or when it is full.
struct LegCache {
    generation: u64,
    legs: Vec<LegInjectors>,
    max_payload: usize,
    /// The batch's leg (its index in `legs`) and channel, and where each frame's payload
    /// lies in the reader's buffer (capacity [`INJECT_BATCH`], never grown).
    batch_for: Option<(usize, u8)>,
    batch: Vec<std::ops::Range<usize>>,
}

/// Frames of one read injected together at most.
const INJECT_BATCH: usize = 32;

impl LegCache {
    fn new(settings: &Settings) -> LegCache {
        LegCache {
            generation: 0,
            legs: Vec::new(),
            max_payload: settings.bridge.as_ref().map_or(0, |b| b.max_payload),
            batch_for: None,
            batch: Vec::with_capacity(INJECT_BATCH),
        }
    }

    /// A `$` frame on `channel` of `side`'s connection whose payload is `at` in `buf`:
    /// added to its leg's batch (the batch so far sent first if it is another leg's or
    /// channel's, or full); `false` when no leg takes the channel.
    fn take(
        &mut self,
        table: &ConnLegs,
        side: TcpSide,
        channel: u8,
        buf: &[u8],
        at: std::ops::Range<usize>,
    ) -> bool {
        self.refresh(table, buf);
        let Some(i) = self.legs.iter().position(|l| l.leg.takes(side, channel)) else {
            return false;
        };
        if self.batch_for != Some((i, channel)) || self.batch.len() >= INJECT_BATCH {
            self.flush(buf);
        }
        self.batch_for = Some((i, channel));
        self.batch.push(at);
        true
    }

    /// Sends the batch (its ranges are in `buf`).
    fn flush(&mut self, buf: &[u8]) {
        let Some((i, channel)) = self.batch_for.take() else {
            return;
        };
        if let Some(l) = self.legs.get_mut(i) {
            l.inject_batch(channel, buf, &self.batch);
        }
        self.batch.clear();
    }

    /// Takes a new copy of the legs when they changed (the batch, which names a leg by its
    /// index, is sent first).
    fn refresh(&mut self, table: &ConnLegs, buf: &[u8]) {
        let g = table.generation.load(Relaxed);
        if g != self.generation {
            self.flush(buf);
            let max = self.max_payload;
            self.legs = lock(&table.legs)
                .iter()
                .map(|l| LegInjectors::new(Arc::clone(l), max))
                .collect();
            self.generation = g;
        }
    }

    /// `side`'s connection lost its framing (it closes; `partial`: in the middle of a
    /// frame or message): counted on that side's legs.
    fn framing_lost(&mut self, table: &ConnLegs, side: TcpSide, partial: bool, buf: &[u8]) {
        self.refresh(table, buf);
        for l in self.legs.iter().filter(|l| l.leg.spec.side == side) {
            let c = &l.leg.counters;
            if partial {
                c.partial_frames.fetch_add(1, Relaxed);
            } else {
                c.framing_errors.fetch_add(1, Relaxed);
            }
        }
    }
}

impl RoutesMedia {
    pub fn new(routes: Arc<Routes>, label: String) -> RoutesMedia {
        RoutesMedia {
            routes,
            label,
            session: None,
            installed: Vec::new(),
            bridge: None,
        }
    }

    fn close_legs(&mut self, keep: impl Fn(&Leg) -> bool) {
        let Some(b) = &self.bridge else { return };
        let mut legs = lock(&b.legs.legs);
        let (kept, closed): (Vec<_>, Vec<_>) = legs.drain(..).partition(|l| keep(l));
        *legs = kept;
        drop(legs);
        if closed.is_empty() {
            return;
        }
        b.legs.generation.fetch_add(1, Relaxed);
        for leg in closed {
            leg.close();
            let c = &leg.counters;
            tracing::info!(
                route = %b.settings.name,
                side = ?leg.spec.side,
                channels = ?leg.spec.channels,
                frames_to_tcp = c.frames_out.load(Relaxed),
                bytes_to_tcp = c.bytes_out.load(Relaxed),
                frames_from_tcp = c.frames_in.load(Relaxed),
                bytes_from_tcp = c.bytes_in.load(Relaxed),
                stalls = c.stalls.load(Relaxed),
                inject_drops = c.inject_drops.load(Relaxed),
                "rtsp bridge leg closed"
            );
        }
    }

    fn session(&mut self) -> SessionId {
        match self.session {
            Some(s) => s,
            None => {
                let s = self
                    .routes
                    .open_session(SessionKind::Rtsp, self.label.clone());
                self.session = Some(s);
                s
            }
        }
    }

    /// When the last media packet crossed any of the session's routes.
    pub fn last_media_ms(&self) -> Option<u64> {
        self.installed.iter().filter_map(|r| r.last_seen_ms()).max()
    }

    /// (packets, bytes) forwarded by the session's routes.
    pub fn forwarded(&self) -> (u64, u64) {
        self.installed.iter().fold((0, 0), |(p, b), r| {
            let s = r.stats.snapshot().packets;
            (p + s.tx_packets, b + s.tx_bytes)
        })
    }
}

impl MediaPorts for RoutesMedia {
    fn alloc_pair(&mut self, domain: DomainId) -> Result<u16, RouteError> {
        let s = self.session();
        self.routes.alloc_pair(s, domain)
    }

    fn add_route(&mut self, spec: RouteSpec) -> Result<(), RouteError> {
        let s = self.session();
        let r = self.routes.add_route(s, spec)?;
        self.installed.push(r);
        Ok(())
    }

    fn open_leg(&mut self, spec: LegSpec) -> io::Result<()> {
        self.open_leg_here(spec)
    }

    fn add_leg_route(
        &mut self,
        spec: RouteSpec,
        side: TcpSide,
        channels: (u8, u8),
        index: usize,
    ) -> Result<(), RouteError> {
        self.add_leg_route_here(spec, side, channels, index)
    }

    fn close_leg(&mut self, side: TcpSide, channels: (u8, u8)) {
        self.close_legs(|l| !(l.spec.side == side && l.spec.channels == channels));
    }

    fn release_track(&mut self, routes: &[(DomainId, u16)], ports: &[(DomainId, u16)]) {
        let Some(s) = self.session else { return };
        for &(ingress, port) in routes {
            let _ = self
                .routes
                .remove_route(Channel::from_ingress(ingress), port);
            self.installed
                .retain(|r| !(r.port == port && r.channel == Channel::from_ingress(ingress)));
        }
        for &(domain, port) in ports {
            let _ = self.routes.release_port(s, domain, port);
        }
    }

    fn release(&mut self) {
        self.close_legs(|_| false);
        self.installed.clear();
        if let Some(s) = self.session.take() {
            let _ = self.routes.close_session(s);
        }
    }
}

impl RoutesMedia {
    fn open_leg_here(&mut self, spec: LegSpec) -> io::Result<()> {
        let session = self.session();
        let Some(b) = &self.bridge else {
            return Err(io::Error::other("this connection cannot bridge"));
        };
        let (writer, conn) = match spec.side {
            TcpSide::Client => (&b.client, &b.client),
            TcpSide::Upstream => (&b.upstream, &b.upstream),
        };
        let ends = lock(conn)
            .stream
            .as_ref()
            .and_then(|s| match (s.local_addr(), s.peer_addr()) {
                (Ok(std::net::SocketAddr::V4(l)), Ok(std::net::SocketAddr::V4(p))) => Some((l, p)),
                _ => None,
            });
        let Some((local, peer)) = ends else {
            return Err(io::Error::other(
                "the connection of the interleaved side is gone",
            ));
        };
        let place = LegPlace {
            session,
            label: format!(
                "{}:{:?}:{}-{}",
                self.label, spec.side, spec.channels.0, spec.channels.1
            ),
            local,
            peer,
        };
        // The longest packet the leg's sinks take (a UDP datagram of the other side).
        let max_payload = b
            .settings
            .bridge
            .as_ref()
            .map_or(crate::sink::SLOT_BYTES, |s| s.max_payload);
        let leg = Leg::open(
            spec,
            max_payload,
            place,
            Arc::clone(writer),
            Arc::clone(&self.routes),
            Arc::clone(&b.injectors),
            Arc::clone(&b.settings.events),
        )?;
        lock(&b.legs.legs).push(leg);
        b.legs.generation.fetch_add(1, Relaxed);
        Ok(())
    }

    fn add_leg_route_here(
        &mut self,
        spec: RouteSpec,
        side: TcpSide,
        channels: (u8, u8),
        index: usize,
    ) -> Result<(), RouteError> {
        let s = self.session();
        let sink = self.bridge.as_ref().and_then(|b| {
            lock(&b.legs.legs)
                .iter()
                .find(|l| l.spec.side == side && l.spec.channels == channels)
                .and_then(|l| l.sinks.get(index).cloned())
        });
        let Some(sink) = sink else {
            return Err(RouteError::NoSession(s));
        };
        let r = self.routes.add_edge_route(s, spec, Some(sink))?;
        self.installed.push(r);
        Ok(())
    }
}

impl Drop for RoutesMedia {
    fn drop(&mut self) {
        self.release();
    }
}

/// Counters of one connection's interleaved relay.
#[derive(Debug, Default)]
pub struct Interleaved {
    pub to_client_frames: AtomicU64,
    pub to_client_bytes: AtomicU64,
    pub to_upstream_frames: AtomicU64,
    pub to_upstream_bytes: AtomicU64,
    /// Frames on channels no SETUP negotiated.
    pub dropped: AtomicU64,
    /// Last frame from the upstream (ms since the epoch).
    pub last_ms: AtomicU64,
    /// Last frame from the client (ms since the epoch): the media of a RECORD session.
    pub last_up_ms: AtomicU64,
}

/// What the proxy's accept thread sees of a connection (for its limits: which connections
/// of a source count toward `max_connections_per_source` and which one may be evicted),
/// kept by the connection's threads after each message.
#[derive(Debug, Default)]
pub struct ConnStatus {
    /// The connection holds a media session: a track is set up and not torn down.
    pub session: AtomicBool,
    /// A request of the client waits for the upstream's reply.
    pub busy: AtomicBool,
    /// The client has sent a whole request.
    pub requested: AtomicBool,
    /// The proxy closed the connection to make room for another (set before it shuts the
    /// socket down).
    pub evicted: AtomicBool,
    /// When the client last sent a whole request or frame (ms since the epoch; the
    /// connection's opening until then).
    pub last_ms: AtomicU64,
}

impl ConnStatus {
    pub fn new() -> ConnStatus {
        ConnStatus {
            last_ms: AtomicU64::new(now_ms()),
            ..ConnStatus::default()
        }
    }
}

/// What both threads share.
struct Shared {
    exchange: Mutex<Exchange<RoutesMedia>>,
    /// The writers, shared with the bridge legs (the client's is always `Some`).
    client_w: SharedWriter,
    upstream_w: SharedWriter,
    legs: Arc<ConnLegs>,
    /// Handles for shutting the sockets down while a writer may hold its lock.
    client_ctl: TcpStream,
    upstream_ctl: Mutex<Option<TcpStream>>,
    /// Negotiated channels, readable without the exchange lock.
    channels: [AtomicBool; 256],
    counters: Interleaved,
    closing: AtomicBool,
    /// When the session last started playing (ms), for the no-media timer.
    play_epoch_ms: AtomicU64,
    last_request_ms: AtomicU64,
    status: Arc<ConnStatus>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Why a connection ended, for the log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    ClientClosed,
    UpstreamClosed,
    SessionTimeout,
    NoMedia,
    Protocol,
    Shutdown,
    /// An operator ended the session through the admin interface.
    Operator,
    /// A request took longer than `request_timeout` to arrive whole (slow-loris).
    SlowRequest,
    /// Idle without a session, closed to make room for a new connection.
    Evicted,
}

impl EndReason {
    pub fn name(self) -> &'static str {
        match self {
            EndReason::ClientClosed => "client-closed",
            EndReason::UpstreamClosed => "upstream-closed",
            EndReason::SessionTimeout => "session-timeout",
            EndReason::NoMedia => "no-media",
            EndReason::Protocol => "protocol-error",
            EndReason::Shutdown => "shutdown",
            EndReason::Operator => "ended-by-operator",
            EndReason::SlowRequest => "request-too-slow",
            EndReason::Evicted => "evicted-idle",
        }
    }
}

/// Everything a connection needs from its proxy.
#[derive(Clone)]
pub struct ConnContext {
    pub settings: Arc<Settings>,
    pub routes: Arc<Routes>,
    /// Where the bridge legs' injectors come from.
    pub legs: Arc<dyn Legs>,
    pub stop: Arc<AtomicBool>,
    /// Seconds without media on a playing session before it ends; 0: never.
    pub media_timeout: u64,
}

/// Serves one client connection until it ends; returns why. `status` is kept up to date
/// for the proxy's limits.
pub fn serve(client: TcpStream, id: u64, ctx: &ConnContext, status: Arc<ConnStatus>) -> EndReason {
    let peer = match client.peer_addr() {
        Ok(std::net::SocketAddr::V4(a)) => *a.ip(),
        _ => return EndReason::Protocol,
    };
    let (Ok(writer), Ok(ctl)) = (client.try_clone(), client.try_clone()) else {
        return EndReason::Protocol;
    };
    let _ = client.set_nodelay(true);
    let _ = writer.set_write_timeout(Some(WRITE_TIMEOUT));
    let label = format!("rtsp:{}:c{id}", ctx.settings.name);
    let client_w: SharedWriter = Arc::new(Mutex::new(ConnWriter::new(Some(writer))));
    let upstream_w: SharedWriter = Arc::new(Mutex::new(ConnWriter::new(None)));
    let legs = Arc::new(ConnLegs::default());
    let mut media = RoutesMedia::new(Arc::clone(&ctx.routes), label);
    media.bridge = Some(LegContext {
        settings: Arc::clone(&ctx.settings),
        injectors: Arc::clone(&ctx.legs),
        client: Arc::clone(&client_w),
        upstream: Arc::clone(&upstream_w),
        legs: Arc::clone(&legs),
    });
    let Some(seed) = seed() else {
        return EndReason::Protocol;
    };
    let exchange = Exchange::new(Arc::clone(&ctx.settings), media, peer, seed);
    let shared = Arc::new(Shared {
        exchange: Mutex::new(exchange),
        client_w,
        upstream_w,
        legs,
        client_ctl: ctl,
        upstream_ctl: Mutex::new(None),
        channels: std::array::from_fn(|_| AtomicBool::new(false)),
        counters: Interleaved::default(),
        closing: AtomicBool::new(false),
        play_epoch_ms: AtomicU64::new(0),
        last_request_ms: AtomicU64::new(now_ms()),
        status,
    });
    let mut upstream_thread = None;
    let reason = client_loop(client, &shared, ctx, &mut upstream_thread);
    shared.closing.store(true, Relaxed);
    close_both(&shared);
    let upstream_reason = upstream_thread.and_then(|t| t.join().ok());
    let reason = match (reason, upstream_reason) {
        _ if shared.status.evicted.load(Relaxed) => EndReason::Evicted,
        (EndReason::ClientClosed, Some(Some(EndReason::UpstreamClosed))) => {
            EndReason::UpstreamClosed
        }
        (r, _) => r,
    };
    let mut ex = lock(&shared.exchange);
    let (packets, bytes) = ex.media().forwarded();
    ex.end_session();
    drop(ex);
    let c = &shared.counters;
    tracing::info!(
        route = %ctx.settings.name,
        conn = id,
        udp_packets = packets,
        udp_bytes = bytes,
        interleaved_to_client = c.to_client_frames.load(Relaxed),
        interleaved_to_upstream = c.to_upstream_frames.load(Relaxed),
        interleaved_dropped = c.dropped.load(Relaxed),
        "rtsp connection ended ({}); live {}",
        reason.name(),
        live(&ctx.routes)
    );
    reason
}

/// The gateway's live RTSP sessions, routes and ports, for the lines that say a session ended.
pub fn live(routes: &Routes) -> String {
    let open = routes
        .sessions()
        .iter()
        .filter(|s| s.kind == SessionKind::Rtsp)
        .count();
    format!(
        "rtsp_sessions={open} routes={} ports_a={} ports_b={}",
        routes.routes().len(),
        routes.ports(DomainId::A).0,
        routes.ports(DomainId::B).0
    )
}

/// The seed of the connection's client nonces and session ids, from the operating system.
fn seed() -> Option<u64> {
    getrandom::u64().ok()
}

fn close_both(shared: &Shared) {
    let _ = shared.client_ctl.shutdown(Shutdown::Both);
    if let Some(u) = lock(&shared.upstream_ctl).as_ref() {
        let _ = u.shutdown(Shutdown::Both);
    }
}

fn client_loop(
    mut client: TcpStream,
    shared: &Arc<Shared>,
    ctx: &ConnContext,
    upstream_thread: &mut Option<std::thread::JoinHandle<Option<EndReason>>>,
) -> EndReason {
    let _ = client.set_read_timeout(Some(TICK));
    let limits = ctx.settings.limits;
    let mut buf: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    let mut chunk = vec![0u8; READ_CHUNK];
    // Since when a request (or a `$` frame) has been arriving without being whole; the
    // first request is awaited from the moment the connection opened.
    let mut waiting_since = Some(now_ms());
    let request_ms = u64::from(ctx.settings.request_timeout) * 1000;
    let mut legs = LegCache::new(&ctx.settings);
    loop {
        if ctx.stop.load(Relaxed) {
            return EndReason::Shutdown;
        }
        if waiting_since.is_some_and(|t| now_ms().saturating_sub(t) > request_ms) {
            ctx.settings.events.slow_requests.fetch_add(1, Relaxed);
            return EndReason::SlowRequest;
        }
        if shared.closing.load(Relaxed) {
            return EndReason::UpstreamClosed;
        }
        if let Some(r) = timers(shared, ctx) {
            return r;
        }
        match client.read(&mut chunk) {
            Ok(0) => {
                if !buf.is_empty() {
                    ctx.settings.events.partial_frames.fetch_add(1, Relaxed);
                    legs.framing_lost(&shared.legs, TcpSide::Client, true, &buf);
                }
                return EndReason::ClientClosed;
            }
            Ok(n) => buf.extend_from_slice(chunk.get(..n).unwrap_or_default()),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => {
                if !buf.is_empty() {
                    ctx.settings.events.partial_frames.fetch_add(1, Relaxed);
                    legs.framing_lost(&shared.legs, TcpSide::Client, true, &buf);
                }
                return EndReason::ClientClosed;
            }
        }
        let mut consumed = 0;
        loop {
            let rest = buf.get(consumed..).unwrap_or_default();
            let frame = match next_frame(rest, &limits) {
                Ok(f) => f,
                Err(_) => {
                    // Framing is lost: a 400 in turn, then the connection goes.
                    legs.flush(&buf);
                    legs.framing_lost(&shared.legs, TcpSide::Client, false, &buf);
                    let mut ex = lock(&shared.exchange);
                    let outs = ex.framing_error();
                    perform_outputs(shared, outs, ctx);
                    return EndReason::Protocol;
                }
            };
            let Some(len) = frame.wire_len() else { break };
            let bytes = rest.get(..len).unwrap_or_default();
            match frame {
                Frame::Interleaved { channel, len } => {
                    shared.last_request_ms.store(now_ms(), Relaxed);
                    shared.status.last_ms.store(now_ms(), Relaxed);
                    let at = consumed + 4..consumed + 4 + len;
                    if !legs.take(&shared.legs, TcpSide::Client, channel, &buf, at) {
                        legs.flush(&buf);
                        relay_frame(shared, &ctx.settings.events, channel, len, bytes, false);
                    }
                }
                Frame::Message(_) => {
                    legs.flush(&buf);
                    shared.last_request_ms.store(now_ms(), Relaxed);
                    shared.status.last_ms.store(now_ms(), Relaxed);
                    shared.status.requested.store(true, Relaxed);
                    let mut ex = lock(&shared.exchange);
                    let was_playing = ex.state().playing;
                    trace(shared, ctx, Dir::In, true, bytes);
                    let outs = ex.client_message(bytes, crate::clock::now_secs());
                    // A TEARDOWN closes its channels at once.
                    sync_state(shared, &ex, was_playing);
                    let outs = connect_if_asked(outs, &mut ex, shared, ctx, upstream_thread);
                    // Writer locks are taken while `ex` is still held: order kept.
                    let close = perform_outputs(shared, outs, ctx);
                    drop(ex);
                    if close {
                        return EndReason::Protocol;
                    }
                }
                Frame::Skip(_) | Frame::Incomplete => {}
            }
            consumed += len;
        }
        legs.flush(&buf);
        buf.drain(..consumed);
        waiting_since = match (buf.is_empty(), consumed > 0) {
            (true, true) => None,
            (true, false) => waiting_since,
            // A new request has begun: its time starts now.
            (false, true) => Some(now_ms()),
            (false, false) => waiting_since.or_else(|| Some(now_ms())),
        };
    }
}

/// Session idle and no-media timers; `Some` when the connection must end.
fn timers(shared: &Shared, ctx: &ConnContext) -> Option<EndReason> {
    let now = now_ms();
    let mut ex = lock(&shared.exchange);
    if ex
        .media()
        .session
        .is_some_and(|s| ctx.routes.end_requested(s))
    {
        let outs = ex.teardown();
        drop(ex);
        perform_outputs(shared, outs, ctx);
        return Some(EndReason::Operator);
    }
    let st = ex.state();
    // Idle connections end too, session or not.
    {
        let timeout = u64::from(st.session_timeout.unwrap_or(ctx.settings.session_timeout));
        let idle = now.saturating_sub(shared.last_request_ms.load(Relaxed));
        if idle > timeout * 1000 + SESSION_GRACE_MS {
            return Some(EndReason::SessionTimeout);
        }
    }
    if st.playing && ctx.media_timeout > 0 {
        let interleaved = if st.recording {
            &shared.counters.last_up_ms
        } else {
            &shared.counters.last_ms
        };
        let last = [
            ex.media().last_media_ms().unwrap_or(0),
            interleaved.load(Relaxed),
            shared.play_epoch_ms.load(Relaxed),
        ]
        .into_iter()
        .max()
        .unwrap_or(0);
        if now.saturating_sub(last) > ctx.media_timeout * 1000 {
            return Some(EndReason::NoMedia);
        }
    }
    None
}

/// Opens the upstream connection when the exchange asks for it (under its lock: nothing
/// else can happen on this connection before it exists).
fn connect_if_asked(
    outs: Vec<Output>,
    ex: &mut Exchange<RoutesMedia>,
    shared: &Arc<Shared>,
    ctx: &ConnContext,
    upstream_thread: &mut Option<std::thread::JoinHandle<Option<EndReason>>>,
) -> Vec<Output> {
    let Some(pos) = outs.iter().position(|o| matches!(o, Output::Connect(_))) else {
        return outs;
    };
    let Some(Output::Connect(addr)) = outs.get(pos).cloned() else {
        return outs;
    };
    let from = ctx.settings.gateway[ctx.settings.client_domain.other().index()];
    match connect(from, addr) {
        Ok(stream) => {
            let reader = stream.try_clone();
            *lock(&shared.upstream_ctl) = stream.try_clone().ok();
            lock(&shared.upstream_w).stream = Some(stream);
            match reader {
                Ok(r) => {
                    let sh = Arc::clone(shared);
                    let c = ctx.clone();
                    *upstream_thread = std::thread::Builder::new()
                        .name("rtsp-upstream".into())
                        .spawn(move || upstream_loop(r, &sh, &c))
                        .ok();
                    outs
                }
                Err(_) => {
                    let mut v: Vec<Output> = outs.into_iter().take(pos).collect();
                    v.extend(ex.connect_failed());
                    v
                }
            }
        }
        Err(e) => {
            tracing::warn!(route = %ctx.settings.name, upstream = %addr, "cannot reach the RTSP upstream: {e}; answering 503");
            let mut v: Vec<Output> = outs.into_iter().take(pos).collect();
            v.extend(ex.connect_failed());
            v
        }
    }
}

/// Connects to the upstream from the gateway's address in the upstream's domain (`from`),
/// so the server sees that address, and sends a session's media there, even when the
/// host's source address selection would pick another (a host with several addresses,
/// loopback); unbound when `from` is not an address of this host (a split half).
fn connect(from: std::net::Ipv4Addr, addr: SocketAddrV4) -> io::Result<TcpStream> {
    use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, SockaddrIn};
    use std::os::fd::AsRawFd;
    let fd = socket::socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    match socket::bind(
        fd.as_raw_fd(),
        &SockaddrIn::from(SocketAddrV4::new(from, 0)),
    ) {
        Ok(()) | Err(nix::errno::Errno::EADDRNOTAVAIL) => {}
        Err(e) => return Err(e.into()),
    }
    let s = TcpStream::from(fd);
    // Linux bounds a blocking connect by the socket's send timeout.
    s.set_write_timeout(Some(CONNECT_TIMEOUT))?;
    socket::connect(s.as_raw_fd(), &SockaddrIn::from(addr)).map_err(|e| match e {
        nix::errno::Errno::EINPROGRESS => io::Error::from(io::ErrorKind::TimedOut),
        e => io::Error::from(e),
    })?;
    let _ = s.set_nodelay(true);
    s.set_write_timeout(Some(WRITE_TIMEOUT))?;
    Ok(s)
}

/// Traces a message to or from the client (`client`) or the server, when the route asks.
fn trace(shared: &Shared, ctx: &ConnContext, dir: Dir, client: bool, bytes: &[u8]) {
    let Some(t) = &ctx.settings.trace else {
        return;
    };
    // upstream_ctl is only ever held for a moment, never while taking another lock.
    let peer = if client {
        shared.client_ctl.peer_addr().ok()
    } else {
        lock(&shared.upstream_ctl)
            .as_ref()
            .and_then(|s| s.peer_addr().ok())
    };
    let peer = peer.map_or_else(|| "-".to_string(), |p| p.to_string());
    t.message(dir, if client { "client" } else { "server" }, &peer, bytes);
}

/// Writes the outputs in order; `true` when the connection must close.
fn perform_outputs(shared: &Shared, outs: Vec<Output>, ctx: &ConnContext) -> bool {
    let mut close = false;
    for o in outs {
        match o {
            Output::Client(b) => {
                trace(shared, ctx, Dir::Out, true, &b);
                if lock(&shared.client_w).write_all(&b).is_err() {
                    close = true;
                }
            }
            Output::Upstream(b) => {
                trace(shared, ctx, Dir::Out, false, &b);
                if lock(&shared.upstream_w).write_all(&b).is_err() {
                    close = true;
                }
            }
            Output::SessionEnded => {
                tracing::info!(route = %ctx.settings.name, "rtsp session ended (teardown); live {}", live(&ctx.routes));
            }
            Output::TrackEnded => {
                tracing::info!(route = %ctx.settings.name, "rtsp track ended (teardown of one track); live {}", live(&ctx.routes));
            }
            Output::ReleaseClientLegs(channels) => {
                // The reply before it is in the client's socket (written whole, under the
                // writer lock): from now on the legs' frames follow it. Not after a failed
                // write: the connection closes and the legs with it. Only the legs that
                // existed when the reply was made: one opened since waits for its own.
                if !close {
                    for leg in lock(&shared.legs.legs).iter().filter(|l| {
                        l.spec.side == TcpSide::Client && channels.contains(&l.spec.channels)
                    }) {
                        leg.release();
                    }
                }
            }
            Output::Close => close = true,
            Output::Connect(_) => {}
        }
    }
    if close {
        shared.closing.store(true, Relaxed);
        close_both(shared);
    }
    close
}

/// After each exchange step: negotiated channels and play state, for lock-free readers.
fn sync_state(shared: &Shared, ex: &Exchange<RoutesMedia>, was_playing: bool) {
    for (i, c) in shared.channels.iter().enumerate() {
        c.store(ex.channel_allowed(i as u8), Relaxed);
    }
    if ex.state().playing && !was_playing {
        shared.play_epoch_ms.store(now_ms(), Relaxed);
    }
    shared.status.session.store(ex.holds_session(), Relaxed);
    shared.status.busy.store(ex.pending() > 0, Relaxed);
}

/// Relays one `$` frame to the other side if its channel was negotiated; counted on the
/// connection (for its log line) and on the route (for the metrics).
fn relay_frame(
    shared: &Shared,
    events: &Events,
    channel: u8,
    len: usize,
    bytes: &[u8],
    to_client: bool,
) {
    let c = &shared.counters;
    if !shared.channels[usize::from(channel)].load(Relaxed) {
        c.dropped.fetch_add(1, Relaxed);
        events.interleaved_dropped.fetch_add(1, Relaxed);
        return;
    }
    let writer = if to_client {
        &shared.client_w
    } else {
        &shared.upstream_w
    };
    let ok = lock(writer).write_all(bytes).is_ok();
    if !ok {
        c.dropped.fetch_add(1, Relaxed);
        events.interleaved_dropped.fetch_add(1, Relaxed);
        return;
    }
    let (frames, total, route_frames, route_bytes) = if to_client {
        c.last_ms.store(now_ms(), Relaxed);
        (
            &c.to_client_frames,
            &c.to_client_bytes,
            &events.interleaved_frames_to_client,
            &events.interleaved_bytes_to_client,
        )
    } else {
        c.last_up_ms.store(now_ms(), Relaxed);
        (
            &c.to_upstream_frames,
            &c.to_upstream_bytes,
            &events.interleaved_frames_to_server,
            &events.interleaved_bytes_to_server,
        )
    };
    frames.fetch_add(1, Relaxed);
    total.fetch_add(len as u64, Relaxed);
    route_frames.fetch_add(1, Relaxed);
    route_bytes.fetch_add(len as u64, Relaxed);
}

fn upstream_loop(mut up: TcpStream, shared: &Arc<Shared>, ctx: &ConnContext) -> Option<EndReason> {
    let limits = ctx.settings.limits;
    let mut buf: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    let mut chunk = vec![0u8; READ_CHUNK];
    let mut legs = LegCache::new(&ctx.settings);
    loop {
        if shared.closing.load(Relaxed) {
            return None;
        }
        match up.read(&mut chunk) {
            Ok(0) => {
                if !buf.is_empty() {
                    ctx.settings.events.partial_frames.fetch_add(1, Relaxed);
                    legs.framing_lost(&shared.legs, TcpSide::Upstream, true, &buf);
                }
                break;
            }
            Ok(n) => buf.extend_from_slice(chunk.get(..n).unwrap_or_default()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
        let mut consumed = 0;
        loop {
            let rest = buf.get(consumed..).unwrap_or_default();
            let Ok(frame) = next_frame(rest, &limits) else {
                // The upstream broke framing: pending requests get 502, then close.
                legs.flush(&buf);
                legs.framing_lost(&shared.legs, TcpSide::Upstream, false, &buf);
                let mut ex = lock(&shared.exchange);
                let mut outs = Vec::new();
                ex.fail_pending(
                    &mut outs,
                    crate::signaling::rtsp::Status::new(502, "Bad Gateway"),
                );
                drop(ex);
                perform_outputs(shared, outs, ctx);
                return Some(EndReason::Protocol);
            };
            let Some(len) = frame.wire_len() else { break };
            let bytes = rest.get(..len).unwrap_or_default();
            match frame {
                Frame::Interleaved { channel, len } => {
                    let at = consumed + 4..consumed + 4 + len;
                    if !legs.take(&shared.legs, TcpSide::Upstream, channel, &buf, at) {
                        legs.flush(&buf);
                        relay_frame(shared, &ctx.settings.events, channel, len, bytes, true);
                    }
                }
                Frame::Message(_) => {
                    legs.flush(&buf);
                    let mut ex = lock(&shared.exchange);
                    let was_playing = ex.state().playing;
                    trace(shared, ctx, Dir::In, false, bytes);
                    let outs = ex.upstream_message(bytes);
                    sync_state(shared, &ex, was_playing);
                    // Writer locks are taken inside while `ex` is still held: order kept.
                    let close = perform_outputs(shared, outs, ctx);
                    drop(ex);
                    if close {
                        return Some(EndReason::Protocol);
                    }
                }
                Frame::Skip(_) | Frame::Incomplete => {}
            }
            consumed += len;
        }
        legs.flush(&buf);
        buf.drain(..consumed);
    }
    if shared.closing.load(Relaxed) {
        return None;
    }
    let mut ex = lock(&shared.exchange);
    let mut outs = Vec::new();
    ex.fail_pending(
        &mut outs,
        crate::signaling::rtsp::Status::new(502, "Bad Gateway"),
    );
    perform_outputs(shared, outs, ctx);
    drop(ex);
    Some(EndReason::UpstreamClosed)
}

#[cfg(test)]
#[path = "conn_tests.rs"]
mod tests;
