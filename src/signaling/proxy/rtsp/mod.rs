//! The RTSP proxy: one per RTSP signaling route, transparent end to end.
//!
//! A client in the listen domain opens `rtsp://<gateway address there>:<listen_port>/<path>`;
//! the proxy opens one upstream connection per client connection, to the upstream of the
//! longest matching path prefix, and forwards every request and reply through the pure
//! rewrites of [`crate::signaling::rtsp`] composed in [`logic`]. Media crosses on the
//! one-way channels through gateway ports the proxy allocates on each SETUP ([`logic`]
//! installs the stream routes), or stays interleaved on the two TCP connections
//! ([`conn`] relays the `$` frames).
//!
//! | file | owns |
//! |---|---|
//! | `mod.rs` | the listener and accept thread, the connection registry, start and shutdown, settings from the config |
//! | [`logic`] | one connection's exchange without I/O: pairing, rewrites, auth, SETUP media plumbing |
//! | [`conn`] | one connection's two threads, timers and the interleaved relay |
//! | [`bridge`] | bridge legs: a track interleaved on one connection and UDP on the other side |
//!
//! A client that pushes (ANNOUNCE, SETUP with `mode=record`, RECORD) gets the same plumbing
//! turned round: its RTP and RTCP enter at vgate's client-side pair and cross on the reverse
//! channel to the server's `server_port`; the server's receiver reports come back on the
//! forward channel. Interleaved pushes relay `$` frames client to server.
//!
//! **Media validation `enforce`**: the SETUP of a track none of whose described formats the
//! policy lets cross (or an ANNOUNCE of only such tracks) is answered `415 Unsupported Media
//! Type` with a `Warning` naming the codec, counted `media_refused`; not `461`, which a
//! client answers by retrying another transport (docs/media-validation.md).
//!
//! **Lower-transport mismatch: bridged.** When the server refuses the client's lower
//! transport (`461`) or answers a SETUP with the other one (interleaved asked, UDP answered,
//! or the reverse), vgate sends the same SETUP again with the other transport (UDP with its
//! own upstream-side pair as `client_port`, or interleaved on channels free on its own
//! connection) and bridges the track ([`bridge`], on the edge-leg core [`crate::edge`]):
//! the media still crosses only on the one-way channels, through the track's stream routes.
//! Toward the interleaved side the routes end in the leg's sinks and a leg thread writes
//! `$` frames into that connection between the RTSP messages (a peer that does not read
//! loses frames, counted as stalls, never memory; a leg on the client's connection holds
//! its frames until the reply to PLAY or RECORD has been written there, so no `$` frame
//! ever precedes the reply that starts the media); from it the connection's reader hands
//! the `$` frames of the leg's channels to injectors that put them into the track's routes
//! as if they had arrived as datagrams. RTP and RTCP cross both ways; the client sees the
//! transport it asked for (its channels, or `server_port` = vgate's pair). A `461` stays
//! only where no bridge can be made, with the reason in its reason phrase: the server
//! refuses the other transport too (or answers the first again), no channel pair is free,
//! or the leg cannot start. Pushes (`mode=record`) are bridged the same way. In a session
//! with several tracks the first SETUP's answer settles the lower transport toward the
//! server: every further track is asked with it at once (bridged where the client asked the
//! other), never the client's first and then the other (servers that fix a session's
//! transport at its first SETUP close the connection at a second SETUP of one track); a
//! `2xx` answering UDP with interleaved is bridged as it is. The route's
//! `bridge_*` events count legs, frames and bytes each way, stalls and drops; each leg is
//! also listed with its counters in the route tables' [`crate::routes::legs::LegTable`].
//!
//! **Requests from the server** (keep-alive `OPTIONS`/`GET_PARAMETER`, `ANNOUNCE` of a changed
//! stream, `REDIRECT`, `PLAY_NOTIFY`...) are forwarded to the client with their URLs and SDP
//! rewritten and their `CSeq` kept; the client's reply goes back. vgate answers one itself
//! (`200` for keep-alives, `501` otherwise) only when it names a URL the client must not see
//! (a `REDIRECT` to another server).
//!
//! **Per-track TEARDOWN** (RFC 2326 §10.7): a TEARDOWN of one track's control URL, while the
//! session has other tracks, gives back only that track's routes, ports and channels; a
//! TEARDOWN of the aggregate URL (or of the last track) ends the session.
//!
//! The route's interleaved counters (frames and bytes each way, frames dropped on channels no
//! SETUP negotiated) and the events above are summed over its connections in
//! [`logic::Events`] and published each second as the route's signaling events
//! (the families `control::metrics::EVENT_FAMILIES` names).
//!
//! **Who may connect** (checked at accept, refusals closed unanswered and counted):
//! `allow_peers` (default: any address of the listen domain; `refused_peers`),
//! `rate_limit` new connections per second per source (bursts of twice that;
//! `refused_rate`), `max_sessions_per_source` connections with a live media session
//! (default 1024: a platform pulls a stream per connection; `refused_sessions_per_source`)
//! and `max_connections_per_source` without one (default 64): at that cap a new connection
//! evicts the source's idlest connection without a session and no request in flight
//! (`evicted_per_source`; refused, `refused_per_source`, only when every one waits for a
//! reply), so an idle flood from an address never locks that address out. Route-wide,
//! [`MAX_CONNECTIONS`] without a session (the route's idlest evicted, `evicted_route_full`)
//! and [`MAX_SESSION_CONNECTIONS`] with one (`503`, `refused_route_full`). `max_message` caps the
//! request head, each line and the body (it only tightens the RTSP defaults). A client
//! must send each request whole within `request_timeout` of its first byte (the first
//! request: of the connection), or the connection is closed (`slow_requests`): a
//! slow-loris cannot hold connections; a client quiet between whole requests is not
//! affected (the session timeout covers it).
//!
//! Each connection's media session ends — routes removed, ports given back — on TEARDOWN,
//! when the client or upstream closes its connection, when the session is idle past its
//! timeout, when a playing session carries no media for the route's `media_timeout`, and
//! at shutdown. A line on stderr says which, with the gateway's live session, route and
//! port counts after it.

pub mod bridge;
pub mod conn;
pub mod logic;

use std::collections::HashMap;
use std::net::{SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::sip::access::{peer_allowed, RateLimiter};
use super::{Proxy, ProxyContext, ProxyError, SignalingStats};
use crate::config::{RtspOptions, SignalingKind, SignalingRoute};
use crate::signaling::rtsp::auth::{Credentials, DigestVerifier};
use crate::signaling::rtsp::transport::TransportPolicy;
use crate::signaling::rtsp::{build_response, Authority, Limits, Route, Status, UrlMap};
use conn::{ConnContext, ConnStatus};
use logic::Settings;

/// Most client connections without a media session one route serves at once: at that, the
/// route's idlest one (no request in flight) is evicted for a new one, or the new one gets
/// `503` when every one is busy.
pub const MAX_CONNECTIONS: usize = 256;
/// Most client connections with a live media session one route serves at once; more get
/// `503`.
pub const MAX_SESSION_CONNECTIONS: usize = 2048;
/// How often the route's [`logic::Events`] are published to the metrics.
const EVENTS_EVERY: Duration = Duration::from_secs(1);

/// A running RTSP proxy.
pub struct RtspProxy {
    route: SignalingRoute,
    listen: SocketAddrV4,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    conns: Arc<Mutex<HashMap<u64, Conn>>>,
    settings: Arc<Settings>,
}

struct Conn {
    stream: TcpStream,
    thread: Option<JoinHandle<()>>,
    peer: std::net::Ipv4Addr,
    status: Arc<ConnStatus>,
}

/// The proxy settings of a route from the config.
pub fn settings(route: &SignalingRoute, cfg: &crate::config::Config) -> Result<Settings, String> {
    let default_opts;
    let opts: &RtspOptions = match &route.rtsp {
        Some(o) => o,
        None => {
            default_opts = RtspOptions {
                paths: vec![crate::config::RtspPath {
                    prefix: "/".into(),
                    upstream: route.upstream,
                    upstream_path: "/".into(),
                    credentials: None,
                }],
                client_users: Vec::new(),
                client_realm: "vgate".into(),
                session_timeout: 60,
                request_timeout: 10,
                max_sessions_per_source: crate::config::RTSP_SESSIONS_PER_SOURCE,
            };
            &default_opts
        }
    };
    let client_domain = route.listen_domain;
    let gw = cfg.domain(client_domain).address;
    let gateway = Authority::new(&gw.to_string(), route.listen_port).map_err(|e| e.to_string())?;
    let mut routes = Vec::new();
    let mut upstreams = Vec::new();
    let mut credentials = Vec::new();
    for p in &opts.paths {
        let up = Authority::from(SocketAddr::V4(p.upstream));
        routes.push(Route::new(&p.prefix, up, &p.upstream_path));
        upstreams.push(p.upstream);
        credentials.push(
            p.credentials
                .as_ref()
                .map(|c| Credentials::new(c.username.clone(), c.password.expose())),
        );
    }
    let verifier = if opts.client_users.is_empty() {
        None
    } else {
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).map_err(|e| format!("the operating system gave no randomness ({e}); check that getrandom(2) or /dev/urandom works"))?;
        let users = opts
            .client_users
            .iter()
            .map(|u| Credentials::new(u.username.clone(), u.password.expose()))
            .collect();
        Some(DigestVerifier::new(
            opts.client_realm.clone(),
            secret,
            users,
        ))
    };
    Ok(Settings {
        name: route.name.clone(),
        map: UrlMap::new(gateway, routes),
        upstreams,
        credentials,
        verifier,
        client_domain,
        gateway: [cfg.domains[0].address, cfg.domains[1].address],
        policy: cfg.security.source_validation,
        rtp_only: cfg.security.rtp_only,
        media_validate: route.media_validate,
        media_policy: cfg.media.policy,
        limits: {
            // `max_message` only tightens the RTSP limits (head and body each).
            let d = Limits::default();
            let m = route.policy.max_message;
            Limits {
                max_header_bytes: d.max_header_bytes.min(m),
                max_body_bytes: d.max_body_bytes.min(m),
                max_line_bytes: d.max_line_bytes.min(m),
                ..d
            }
        },
        transports: TransportPolicy::default(),
        bridge: Some(logic::BridgeSettings {
            max_payload: cfg.leg_max_payload(),
            udp_upstream: cfg
                .split
                .as_ref()
                .is_some_and(|s| s.link_face() == client_domain.other()),
        }),
        session_timeout: opts.session_timeout,
        request_timeout: opts.request_timeout,
        stats: Arc::new(SignalingStats::new(SignalingKind::Rtsp)),
        events: Arc::new(logic::Events::default()),
        trace: route.trace.then(|| {
            Arc::new(crate::signaling::proxy::trace::Tracer::new(
                &route.name,
                "rtsp",
            ))
        }),
    })
}

/// Starts the proxy of one RTSP route: listens on the gateway's address in the route's
/// listen domain.
pub fn start(route: &SignalingRoute, ctx: &ProxyContext) -> Result<Box<dyn Proxy>, ProxyError> {
    let settings = settings(route, &ctx.config).map_err(|message| ProxyError::Other {
        route: route.name.clone(),
        message,
    })?;
    // Session ids and nonces come from the operating system: none, no proxy.
    getrandom::u64().map_err(|e| ProxyError::Other {
        route: route.name.clone(),
        message: format!("the operating system gave no randomness ({e}); check that getrandom(2) or /dev/urandom works"),
    })?;
    ctx.stats.register(&route.name, Arc::clone(&settings.stats));
    let addr = SocketAddrV4::new(
        ctx.config.domain(route.listen_domain).address,
        route.listen_port,
    );
    let listener = TcpListener::bind(addr).map_err(|source| ProxyError::Listen {
        route: route.name.clone(),
        addr: addr.into(),
        source,
    })?;
    super::bind_to_interface(
        &listener,
        &ctx.config.domain(route.listen_domain).interface,
        &route.name,
    )?;
    listener
        .set_nonblocking(true)
        .map_err(|e| ProxyError::Other {
            route: route.name.clone(),
            message: format!("cannot make the listener non-blocking: {e}"),
        })?;
    let stop = Arc::new(AtomicBool::new(false));
    let conns: Arc<Mutex<HashMap<u64, Conn>>> = Arc::new(Mutex::new(HashMap::new()));
    let settings = Arc::new(settings);
    let cctx = ConnContext {
        settings: Arc::clone(&settings),
        routes: Arc::clone(&ctx.routes),
        legs: Arc::clone(&ctx.legs),
        stop: Arc::clone(&stop),
        media_timeout: media_timeout(route),
    };
    let gateway_stop = Arc::clone(&ctx.stop);
    let access = Access {
        allow_peers: route.policy.allow_peers.clone(),
        listen_domain: ctx.routes.domain(route.listen_domain).clone(),
        per_source: route.policy.max_connections_per_source,
        sessions_per_source: route
            .rtsp
            .as_ref()
            .map_or(crate::config::RTSP_SESSIONS_PER_SOURCE, |o| {
                o.max_sessions_per_source
            }),
        rate: std::cell::RefCell::new(RateLimiter::new(route.policy.rate_limit)),
    };
    let accept = {
        let conns = Arc::clone(&conns);
        let stop = Arc::clone(&stop);
        std::thread::Builder::new()
            .name(format!("rtsp-{}", route.name))
            .spawn(move || accept_loop(&listener, &cctx, &access, &conns, &stop, &gateway_stop))
            .map_err(|e| ProxyError::Other {
                route: route.name.clone(),
                message: format!("cannot start the accept thread: {e}"),
            })?
    };
    tracing::info!(route = %route.name, listen = %addr, "RTSP proxy listening");
    Ok(Box::new(RtspProxy {
        route: route.clone(),
        listen: addr,
        stop,
        accept: Some(accept),
        conns,
        settings,
    }))
}

/// The route's no-media timeout in seconds (the shared `media_timeout` setting).
fn media_timeout(route: &SignalingRoute) -> u64 {
    route.policy.media_timeout.as_secs()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The route's events, summed over its connections, to the metrics.
fn publish(settings: &Settings) {
    settings.stats.set_events(settings.events.list());
}

/// Who may connect: the route's `allow_peers` (default: the listen domain), `rate_limit`
/// new connections per second per source, at most `max_sessions_per_source` connections
/// with a live session and `max_connections_per_source` without one per source (at that
/// cap the source's idlest connection without a session is evicted for the new one), and
/// the route-wide [`MAX_CONNECTIONS`] and [`MAX_SESSION_CONNECTIONS`].
struct Access {
    allow_peers: Vec<ipnet::Ipv4Net>,
    listen_domain: crate::config::Domain,
    per_source: usize,
    sessions_per_source: usize,
    rate: std::cell::RefCell<RateLimiter>,
}

/// An open connection as admission sees it.
#[derive(Debug, Clone, Copy)]
struct Open {
    id: u64,
    peer: std::net::Ipv4Addr,
    session: bool,
    busy: bool,
    requested: bool,
    last_ms: u64,
}

impl Open {
    fn of(id: u64, c: &Conn) -> Open {
        let s = &c.status;
        Open {
            id,
            peer: c.peer,
            session: s.session.load(Relaxed),
            busy: s.busy.load(Relaxed),
            requested: s.requested.load(Relaxed),
            last_ms: s.last_ms.load(Relaxed),
        }
    }
}

/// What becomes of a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admission {
    Serve,
    /// Served once this idle connection (no session, no request in flight) is closed.
    Evict(u64),
    /// Closed at once, unanswered.
    Refuse,
    /// Answered `503` and closed: the route is full.
    Full,
}

/// The connection to evict among `open`: without a session and no request in flight;
/// those that never sent a whole request first, then the one quiet the longest.
fn idlest<'a>(open: impl Iterator<Item = &'a Open>) -> Option<u64> {
    open.filter(|c| !c.session && !c.busy)
        .min_by_key(|c| (c.requested, c.last_ms, c.id))
        .map(|c| c.id)
}

impl Access {
    /// What becomes of a new connection from `peer` (`open`: the route's connections open
    /// now); counts the refusals and evictions.
    fn admit(
        &self,
        peer: std::net::Ipv4Addr,
        open: &[Open],
        now: std::time::Instant,
        events: &logic::Events,
    ) -> Admission {
        let mine = || open.iter().filter(|c| c.peer == peer);
        let (counter, answer) =
            if !peer_allowed(&self.allow_peers, self.listen_domain.contains(peer), peer) {
                (&events.refused_peers, Admission::Refuse)
            } else if !self.rate.borrow_mut().allow(peer, now) {
                (&events.refused_rate, Admission::Refuse)
            } else if mine().filter(|c| c.session).count() >= self.sessions_per_source {
                (&events.refused_sessions_per_source, Admission::Refuse)
            } else if open.iter().filter(|c| c.session).count() >= MAX_SESSION_CONNECTIONS {
                (&events.refused_route_full, Admission::Full)
            } else if mine().filter(|c| !c.session).count() >= self.per_source {
                match idlest(mine()) {
                    Some(id) => (&events.evicted_per_source, Admission::Evict(id)),
                    None => (&events.refused_per_source, Admission::Refuse),
                }
            } else if open.iter().filter(|c| !c.session).count() >= MAX_CONNECTIONS {
                match idlest(open.iter()) {
                    Some(id) => (&events.evicted_route_full, Admission::Evict(id)),
                    None => (&events.refused_route_full, Admission::Full),
                }
            } else {
                return Admission::Serve;
            };
        counter.fetch_add(1, Relaxed);
        let limit = crate::clock::now_ms();
        if let Admission::Evict(_) = answer {
            if let Some(suppressed) = LOG_EVICTED.check(limit) {
                tracing::warn!(%peer, suppressed, "RTSP connection without a session evicted to make room for a new one (max_connections_per_source, or the route's limit)");
            }
        } else if let Some(suppressed) = LOG_REFUSED.check(limit) {
            tracing::warn!(%peer, suppressed, "RTSP connection refused (allow_peers, rate_limit, max_sessions_per_source, max_connections_per_source with every connection busy, or the route's limits)");
        }
        answer
    }
}

static LOG_EVICTED: crate::logging::RateLimit = crate::logging::RateLimit::new(10_000);
static LOG_REFUSED: crate::logging::RateLimit = crate::logging::RateLimit::new(10_000);

fn accept_loop(
    listener: &TcpListener,
    ctx: &ConnContext,
    access: &Access,
    conns: &Arc<Mutex<HashMap<u64, Conn>>>,
    stop: &AtomicBool,
    gateway_stop: &AtomicBool,
) {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let mut published = std::time::Instant::now();
    while !stop.load(Relaxed) && !gateway_stop.load(Relaxed) {
        if published.elapsed() >= EVENTS_EVERY {
            publish(&ctx.settings);
            published = std::time::Instant::now();
            // Ended connections give their descriptors back even when no client comes.
            lock(conns).retain(|_, c| c.thread.as_ref().is_some_and(|t| !t.is_finished()));
        }
        let (stream, peer) = match listener.accept() {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            Err(e) => {
                tracing::warn!(route = %ctx.settings.name, "accept failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let _ = stream.set_nonblocking(false);
        let SocketAddr::V4(peer) = peer else {
            continue;
        };
        let peer = *peer.ip();
        let mut map = lock(conns);
        map.retain(|_, c| c.thread.as_ref().is_some_and(|t| !t.is_finished()));
        // Evicted connections are on their way out: they count no more.
        let open: Vec<Open> = map
            .iter()
            .filter(|(_, c)| !c.status.evicted.load(Relaxed))
            .map(|(&id, c)| Open::of(id, c))
            .collect();
        match access.admit(peer, &open, std::time::Instant::now(), &ctx.settings.events) {
            Admission::Serve => {}
            Admission::Evict(id) => {
                if let Some(c) = map.get(&id) {
                    c.status.evicted.store(true, Relaxed);
                    let _ = c.stream.shutdown(std::net::Shutdown::Both);
                }
            }
            // Closed at once, unanswered.
            Admission::Refuse => continue,
            Admission::Full => {
                let mut s = stream;
                if let Ok(b) = build_response(None, Status::SERVICE_UNAVAILABLE, &[]) {
                    let _ = std::io::Write::write_all(&mut s, &b);
                }
                continue;
            }
        }
        let id = NEXT.fetch_add(1, Relaxed);
        let Ok(handle) = stream.try_clone() else {
            continue;
        };
        let c = ctx.clone();
        let status = Arc::new(ConnStatus::new());
        let theirs = Arc::clone(&status);
        let thread = std::thread::Builder::new()
            .name("rtsp-client".into())
            .spawn(move || {
                conn::serve(stream, id, &c, theirs);
            })
            .ok();
        map.insert(
            id,
            Conn {
                stream: handle,
                thread,
                peer,
                status,
            },
        );
    }
}

impl Proxy for RtspProxy {
    fn routes(&self) -> &[SignalingRoute] {
        std::slice::from_ref(&self.route)
    }

    fn listening(&self) -> Vec<(crate::config::Transport, SocketAddrV4)> {
        vec![(crate::config::Transport::Tcp, self.listen)]
    }

    fn shutdown(mut self: Box<Self>) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        let conns: Vec<Conn> = lock(&self.conns).drain().map(|(_, c)| c).collect();
        for c in &conns {
            let _ = c.stream.shutdown(std::net::Shutdown::Both);
        }
        // Each connection ends its session (routes and ports) before its thread ends.
        for c in conns {
            if let Some(t) = c.thread {
                let _ = t.join();
            }
        }
        publish(&self.settings);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use std::time::Instant;

    fn access(allow: &[&str], per_source: usize, rate: u32) -> Access {
        let cfg = crate::config::parse(crate::config::DEFAULT_TOML, "default").unwrap();
        Access {
            allow_peers: allow.iter().map(|n| n.parse().unwrap()).collect(),
            listen_domain: cfg.domain(crate::config::DomainId::B).clone(),
            per_source,
            sessions_per_source: 3,
            rate: std::cell::RefCell::new(RateLimiter::new(rate)),
        }
    }

    /// `n` connections from `peer`, ids from `first`, quiet since their id (ms).
    fn open(peer: Ipv4Addr, first: u64, n: u64, session: bool) -> Vec<Open> {
        (first..first + n)
            .map(|id| Open {
                id,
                peer,
                session,
                busy: false,
                requested: true,
                last_ms: id,
            })
            .collect()
    }

    #[test]
    fn connections_pass_allow_peers_the_per_source_cap_and_the_rate() {
        let ev = logic::Events::default();
        let now = Instant::now();
        let b = Ipv4Addr::new(127, 0, 0, 2);
        let other = Ipv4Addr::new(192, 0, 2, 1);
        // Default: anyone of the listen domain, nobody else.
        let a = access(&[], 2, 0);
        assert_eq!(a.admit(b, &[], now, &ev), Admission::Serve);
        assert_eq!(a.admit(other, &[], now, &ev), Admission::Refuse);
        assert_eq!(ev.refused_peers.load(Relaxed), 1);
        // allow_peers narrows it.
        let a = access(&["127.0.0.9/32"], 16, 0);
        assert_eq!(a.admit(b, &[], now, &ev), Admission::Refuse);
        assert_eq!(
            a.admit(Ipv4Addr::new(127, 0, 0, 9), &[], now, &ev),
            Admission::Serve
        );
        assert_eq!(ev.refused_peers.load(Relaxed), 2);
        // rate_limit: 1 per second, bursts of 2.
        let a = access(&[], 16, 1);
        assert_eq!(a.admit(b, &[], now, &ev), Admission::Serve);
        assert_eq!(a.admit(b, &[], now, &ev), Admission::Serve);
        assert_eq!(a.admit(b, &[], now, &ev), Admission::Refuse);
        assert_eq!(ev.refused_rate.load(Relaxed), 1);
        assert_eq!(
            a.admit(b, &[], now + Duration::from_secs(1), &ev),
            Admission::Serve
        );
    }

    #[test]
    fn at_the_per_source_cap_the_idlest_connection_without_a_session_makes_room() {
        let ev = logic::Events::default();
        let now = Instant::now();
        let b = Ipv4Addr::new(127, 0, 0, 2);
        let c = Ipv4Addr::new(127, 0, 0, 3);
        let a = access(&["127.0.0.0/24"], 2, 0);
        // One idle connection: under the cap.
        let mut conns = open(b, 10, 1, false);
        assert_eq!(a.admit(b, &conns, now, &ev), Admission::Serve);
        // Sessions do not count toward the cap: two of them and one idle still pass.
        conns.extend(open(b, 1, 2, true));
        assert_eq!(a.admit(b, &conns, now, &ev), Admission::Serve);
        // At the cap (two without a session): the quiet-longest goes, not a session.
        conns.extend(open(b, 20, 1, false));
        assert_eq!(a.admit(b, &conns, now, &ev), Admission::Evict(10));
        assert_eq!(ev.evicted_per_source.load(Relaxed), 1);
        // One that never sent a whole request goes before any that did.
        conns.extend(open(b, 30, 1, false));
        conns.last_mut().unwrap().requested = false;
        assert_eq!(a.admit(b, &conns, now, &ev), Admission::Evict(30));
        // Another source's connections are not evicted for this one, nor counted.
        let others = open(c, 40, 5, false);
        assert_eq!(a.admit(b, &others, now, &ev), Admission::Serve);
        // Every connection without a session waiting for a reply: refused.
        let mut busy = open(b, 50, 2, false);
        for o in &mut busy {
            o.busy = true;
        }
        assert_eq!(a.admit(b, &busy, now, &ev), Admission::Refuse);
        assert_eq!(ev.refused_per_source.load(Relaxed), 1);
        // The ceiling of connections with a live session (3 here).
        let sessions = open(b, 60, 3, true);
        assert_eq!(a.admit(b, &sessions, now, &ev), Admission::Refuse);
        assert_eq!(ev.refused_sessions_per_source.load(Relaxed), 1);
        assert_eq!(a.admit(c, &sessions, now, &ev), Admission::Serve);
    }

    #[test]
    fn a_route_full_of_connections_without_sessions_evicts_its_idlest() {
        let ev = logic::Events::default();
        let now = Instant::now();
        let a = access(&["127.0.0.0/16"], MAX_CONNECTIONS, 0);
        let conns: Vec<Open> = (0..MAX_CONNECTIONS as u64)
            .flat_map(|i| open(Ipv4Addr::new(127, 0, 1, (i % 200) as u8), 100 + i, 1, false))
            .collect();
        assert_eq!(
            a.admit(Ipv4Addr::new(127, 0, 0, 2), &conns, now, &ev),
            Admission::Evict(100)
        );
        assert_eq!(ev.evicted_route_full.load(Relaxed), 1);
        let busy: Vec<Open> = conns.iter().map(|o| Open { busy: true, ..*o }).collect();
        assert_eq!(
            a.admit(Ipv4Addr::new(127, 0, 0, 2), &busy, now, &ev),
            Admission::Full
        );
        assert_eq!(ev.refused_route_full.load(Relaxed), 1);
    }
}
