//! One client connection's RTSP exchange, without I/O: bytes of one message in, a list of
//! [`Output`]s (bytes to the upstream, bytes to the client, connect, close) out.
//!
//! Owns: the request/response pairing (vgate numbers the requests it sends upstream with its
//! own `CSeq` and maps each reply back to the client's; replies reach the client in request
//! order even when vgate answers some requests itself), the rewrites of
//! [`crate::signaling::rtsp`] applied in each direction, answering the upstream's 401 with
//! the route's credentials, checking the client's credentials, the media plumbing of
//! each SETUP through [`MediaPorts`] (ports on both sides, stream routes, per track so a
//! TEARDOWN of one track frees only its own), and the server's requests to the client
//! (forwarded rewritten, the client's reply mapped back by `CSeq`).
//!
//! It also decides the bridges: a SETUP the upstream refuses (or answers with the other
//! lower transport) is sent again with the other one, and the reply installs the track with
//! a bridge leg on the interleaved side ([`MediaPorts::open_leg`], routes toward that side
//! into the leg's sinks through [`MediaPorts::add_leg_route`]).
//!
//! Does not own: sockets, threads, clocks or randomness (passed in), nor the `$` frames of
//! interleaved media (the connection relays them, or hands a leg's to its injectors;
//! [`Exchange::channel_allowed`] and [`Exchange::bridged`] say which channels are which).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::config::{DomainId, SourcePolicy};
use crate::routes::{RouteError, RouteSpec};
use crate::signaling::rtsp::auth::{
    authorization, choose_challenge, parse_www_authenticate, Challenge, ClientNonce, Credentials,
    DigestVerifier,
};
use crate::signaling::rtsp::transport::{Delivery, LowerTransport, TransportPolicy};
use crate::signaling::rtsp::{
    build_response, parse_transport, select_transport, Editor, Limits, Message, RtspError, Status,
    UrlMap,
};
use crate::signaling::sdp;

/// Most SETUPs (tracks) one connection may hold ports for.
pub const MAX_TRACKS: usize = 16;
/// Most requests awaiting a reply on one connection (pipelining depth).
pub const MAX_PENDING: usize = 32;

const BAD_GATEWAY: Status = Status::new(502, "Bad Gateway");
const NOT_IMPLEMENTED: Status = Status::new(501, "Not Implemented");
const METHOD_NOT_ALLOWED: Status = Status::new(405, "Method Not Allowed");
const METHODS: &str =
    "OPTIONS, DESCRIBE, SETUP, PLAY, PAUSE, GET_PARAMETER, SET_PARAMETER, TEARDOWN, ANNOUNCE, RECORD";

/// What the exchange needs from the route tables: ports and routes of this connection's
/// session. The real one wraps [`crate::routes::Routes`]; tests use a fake.
pub trait MediaPorts {
    /// An RTP/RTCP pair in `domain`; the even (RTP) port.
    fn alloc_pair(&mut self, domain: DomainId) -> Result<u16, RouteError>;
    fn add_route(&mut self, spec: RouteSpec) -> Result<(), RouteError>;
    /// Gives back one track's routes (by ingress domain and port) and then its ports; the
    /// session and its other tracks go on.
    fn release_track(&mut self, routes: &[(DomainId, u16)], ports: &[(DomainId, u16)]);
    /// Ends the session: every route and port goes back (and every bridge leg closes).
    /// The next SETUP starts a new one.
    fn release(&mut self);
    /// Opens a bridge leg ([`super::bridge`]): its sinks and the thread that frames what
    /// they take onto `leg.side`'s connection. The default has no legs: bridging is refused.
    fn open_leg(&mut self, leg: LegSpec) -> std::io::Result<()> {
        let _ = leg;
        Err(std::io::Error::other("bridge legs are not available here"))
    }
    /// Installs a route whose receiver is the leg of `side` on `channels`: its packets go
    /// into the leg's sink `index` (0 RTP, 1 RTCP), framed onto that connection.
    fn add_leg_route(
        &mut self,
        spec: RouteSpec,
        side: TcpSide,
        channels: (u8, u8),
        index: usize,
    ) -> Result<(), RouteError> {
        let _ = (side, channels, index);
        self.add_route(spec)
    }
    /// Closes the leg of `side` on `channels` (a per-track TEARDOWN or a failed SETUP).
    fn close_leg(&mut self, side: TcpSide, channels: (u8, u8)) {
        let _ = (side, channels);
    }
}

/// The RTSP connection a bridge leg's `$` frames travel on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcpSide {
    Client,
    Upstream,
}

/// A bridge leg the exchange asks for: one track interleaved on `side`'s connection and
/// UDP on the other side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LegSpec {
    /// Domain of the interleaved side.
    pub domain: DomainId,
    pub side: TcpSide,
    /// `$` channels (RTP, RTCP) on that connection.
    pub channels: (u8, u8),
    /// Gateway ports in `domain` (RTP, RTCP) whose routes take the frames from the
    /// interleaved side (the track's ingress there).
    pub inject: [u16; 2],
}

/// What bridge legs need from the config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeSettings {
    /// Largest payload a leg injects, and its sinks take
    /// ([`crate::config::Config::leg_max_payload`]: up to `split.out_link.max_datagram` in a
    /// split half, else `engine.max_payload`).
    pub max_payload: usize,
    /// The upstream is the split appliance's link face (`[split]`): an interleaved client's
    /// SETUP goes upstream over UDP at once and is bridged, so media between the halves
    /// crosses on the one-way media links, never as `$` frames on the signaling link.
    pub udp_upstream: bool,
}

/// Events of one proxy route, summed over its connections (lock-free), published to the
/// metrics in the families `EVENT_FAMILIES` of `control::metrics` names.
#[derive(Debug, Default)]
pub struct Events {
    pub interleaved_frames_to_client: AtomicU64,
    pub interleaved_bytes_to_client: AtomicU64,
    pub interleaved_frames_to_server: AtomicU64,
    pub interleaved_bytes_to_server: AtomicU64,
    /// `$` frames on channels no SETUP negotiated (or that a peer did not take).
    pub interleaved_dropped: AtomicU64,
    /// Requests of the server forwarded to the client (URLs rewritten).
    pub server_requests_forwarded: AtomicU64,
    /// Requests of the server vgate answered itself (a URL it cannot show the client).
    pub server_requests_answered: AtomicU64,
    /// Client replies to server requests forwarded back.
    pub client_replies_forwarded: AtomicU64,
    /// TEARDOWNs of one track's control URL that freed only that track.
    pub track_teardowns: AtomicU64,
    /// Connections closed because a request took longer than `request_timeout` to arrive.
    pub slow_requests: AtomicU64,
    /// Connections refused: the peer is not in `allow_peers` (or not in the listen domain).
    pub refused_peers: AtomicU64,
    /// Connections refused: the source holds `max_connections_per_source` already.
    pub refused_per_source: AtomicU64,
    /// Connections refused: the source opens more than `rate_limit` per second.
    pub refused_rate: AtomicU64,
    /// Bridge legs opened (one per bridged track).
    pub bridge_legs: AtomicU64,
    /// Datagrams a bridge leg wrote as `$` frames (UDP side to TCP side), and their bytes.
    pub bridge_frames_to_tcp: AtomicU64,
    pub bridge_bytes_to_tcp: AtomicU64,
    /// `$` frames a bridge leg sent on as datagrams (TCP side to UDP side), and their bytes.
    pub bridge_frames_to_udp: AtomicU64,
    pub bridge_bytes_to_udp: AtomicU64,
    /// Frames a bridge leg dropped because the TCP peer did not read (socket buffer full).
    pub bridge_stalls: AtomicU64,
    /// Frames a bridge leg dropped because a socket refused them.
    pub bridge_dropped: AtomicU64,
    /// SETUPs answered `461` because the transports could not be bridged.
    pub bridge_refused: AtomicU64,
    /// SETUPs answered `461` because the interleaved channels (answered by the server or
    /// asked by the client) are another track's on that connection.
    pub channels_taken: AtomicU64,
    /// Connections that closed in the middle of a `$` frame (or a message): the cut bytes
    /// were dropped.
    pub partial_frames: AtomicU64,
}

impl Events {
    /// (event, count) in a fixed order.
    pub fn list(&self) -> Vec<(&'static str, u64)> {
        [
            (
                "interleaved_frames_to_client",
                &self.interleaved_frames_to_client,
            ),
            (
                "interleaved_bytes_to_client",
                &self.interleaved_bytes_to_client,
            ),
            (
                "interleaved_frames_to_server",
                &self.interleaved_frames_to_server,
            ),
            (
                "interleaved_bytes_to_server",
                &self.interleaved_bytes_to_server,
            ),
            ("interleaved_dropped", &self.interleaved_dropped),
            ("server_requests_forwarded", &self.server_requests_forwarded),
            ("server_requests_answered", &self.server_requests_answered),
            ("client_replies_forwarded", &self.client_replies_forwarded),
            ("track_teardowns", &self.track_teardowns),
            ("slow_requests", &self.slow_requests),
            ("refused_peers", &self.refused_peers),
            ("refused_per_source", &self.refused_per_source),
            ("refused_rate", &self.refused_rate),
            ("bridge_legs", &self.bridge_legs),
            ("bridge_frames_to_tcp", &self.bridge_frames_to_tcp),
            ("bridge_bytes_to_tcp", &self.bridge_bytes_to_tcp),
            ("bridge_frames_to_udp", &self.bridge_frames_to_udp),
            ("bridge_bytes_to_udp", &self.bridge_bytes_to_udp),
            ("bridge_stalls", &self.bridge_stalls),
            ("bridge_dropped", &self.bridge_dropped),
            ("bridge_refused", &self.bridge_refused),
            ("channels_taken", &self.channels_taken),
            ("partial_frames", &self.partial_frames),
        ]
        .into_iter()
        .map(|(n, a)| (n, a.load(Relaxed)))
        .collect()
    }
}

/// Static facts of one proxy route, shared by its connections.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Signaling route name, for labels.
    pub name: String,
    pub map: UrlMap,
    /// Upstream socket per route of `map`.
    pub upstreams: Vec<SocketAddrV4>,
    /// Credentials vgate answers each upstream's challenges with.
    pub credentials: Vec<Option<Credentials>>,
    /// Clients must authenticate to vgate when set.
    pub verifier: Option<DigestVerifier>,
    /// Domain of the clients (the route's listen domain); upstreams are in the other.
    pub client_domain: DomainId,
    /// The gateway's address in each domain, by [`DomainId::index`].
    pub gateway: [Ipv4Addr; 2],
    pub policy: SourcePolicy,
    pub rtp_only: bool,
    pub limits: Limits,
    pub transports: TransportPolicy,
    /// Where the route may bridge a lower-transport mismatch; `None`: it answers `461`.
    pub bridge: Option<BridgeSettings>,
    /// Longest idle time of a session in seconds (the server's, if shorter, wins).
    pub session_timeout: u32,
    /// Seconds a client may take to send one whole request.
    pub request_timeout: u32,
    /// Requests by method and upstream responses by class, for the metrics.
    pub stats: std::sync::Arc<crate::signaling::proxy::SignalingStats>,
    /// The route's events, summed over its connections.
    pub events: std::sync::Arc<Events>,
    /// Message traces (`trace = true` on the route).
    pub trace: Option<std::sync::Arc<crate::signaling::proxy::trace::Tracer>>,
}

/// What the connection must do, in this order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Open the upstream connection (before the first `Upstream`).
    Connect(SocketAddrV4),
    /// Bytes for the upstream.
    Upstream(Vec<u8>),
    /// Bytes for the client.
    Client(Vec<u8>),
    /// The RTSP session ended (TEARDOWN answered): its routes and ports are gone.
    SessionEnded,
    /// A TEARDOWN of one track's control URL: that track's routes and ports are gone, the
    /// session goes on.
    TrackEnded,
    /// The reply just before (a `200` to PLAY or RECORD, or to a SETUP while playing) has
    /// been written to the client: its bridge legs may write `$` frames from now on. Until
    /// then a leg on the client's connection holds what its sinks take, so no interleaved
    /// frame reaches the client before the reply that starts its media (across the split
    /// the reply and the media travel on different links and may arrive in either order).
    /// The legs are those (by channel pair) that existed when the reply was produced: a
    /// leg a later reply opened meanwhile waits for a release after its own reply.
    ReleaseClientLegs(Vec<(u8, u8)>),
    /// Close both connections (after writing what came before).
    Close,
}

/// A UDP SETUP in flight: what its reply needs.
#[derive(Debug, Clone, Copy)]
struct UdpSetup {
    /// The client's own ports.
    client_rtp: u16,
    client_rtcp: u16,
    /// vgate's upstream-side pair given to the server as client_port.
    upstream_pair: u16,
    record: bool,
}

#[derive(Debug, Clone, Copy)]
enum SetupKind {
    /// UDP on both sides.
    Udp(UdpSetup),
    /// Interleaved on both connections: frames relayed, channels kept.
    Interleaved {
        /// The client's channels, if it named them.
        channels: Option<(u8, u8)>,
        record: bool,
    },
    /// A bridge: the client interleaved, the upstream asked for UDP on `upstream_pair`
    /// (vgate's pair there) after it refused interleaved.
    TcpToUdp {
        channels: Option<(u8, u8)>,
        upstream_pair: u16,
        record: bool,
    },
    /// A bridge: the client on UDP, the upstream asked for interleaved on `channels` of
    /// vgate's connection after it refused UDP.
    UdpToTcp { setup: UdpSetup, channels: (u8, u8) },
}

impl SetupKind {
    /// The lower transport asked of the upstream.
    fn upstream_lower(self) -> LowerTransport {
        match self {
            SetupKind::Udp(_) | SetupKind::TcpToUdp { .. } => LowerTransport::Udp,
            SetupKind::Interleaved { .. } | SetupKind::UdpToTcp { .. } => LowerTransport::Tcp,
        }
    }

    fn record(self) -> bool {
        match self {
            SetupKind::Udp(s) | SetupKind::UdpToTcp { setup: s, .. } => s.record,
            SetupKind::Interleaved { record, .. } | SetupKind::TcpToUdp { record, .. } => record,
        }
    }
}

/// `461` when a SETUP's transports cannot be bridged; the reason phrase says why.
const UNBRIDGEABLE: Status = Status::new(
    461,
    "Unsupported Transport (the server takes neither interleaved nor UDP for this track)",
);
/// `461` when a track's interleaved channels are another track's on the same connection
/// (a server answering `interleaved=0-1` for every track): its frames would be taken for
/// the other track's.
const CHANNELS_TAKEN: Status = Status::new(
    461,
    "Unsupported Transport (the interleaved channels are already another track's on this connection)",
);
/// `461` where the exchange has no bridge legs (tests of the pure exchange).
const NO_BRIDGE: Status = Status::new(
    461,
    "Unsupported Transport (the server answered the other lower transport and this proxy cannot bridge)",
);

/// One set-up track: what a TEARDOWN of its control URL gives back.
#[derive(Debug, Clone, Default)]
struct Track {
    /// The upstream URL its SETUP named.
    url: String,
    /// Stream routes installed for it: (ingress domain, port).
    routes: Vec<(DomainId, u16)>,
    /// Ports it holds, both sides.
    ports: Vec<(DomainId, u16)>,
    /// Interleaved channels it negotiated (relayed as they are).
    channels: Option<(u8, u8)>,
    /// Its bridge leg: the connection and the channels there.
    leg: Option<(TcpSide, (u8, u8))>,
}

/// A request sent upstream, awaiting its reply.
#[derive(Debug)]
struct InFlight {
    cseq: u32,
    client_cseq: String,
    method: String,
    upstream_uri: String,
    /// The request as sent, for a resend with credentials.
    sent: Vec<u8>,
    setup: Option<SetupKind>,
    /// `RTP/AVP` of the client's Transport, for a SETUP resent with the other transport.
    profile: String,
    /// A SETUP already resent with the other lower transport.
    retried: bool,
    answered_challenge: bool,
}

/// One reply slot in request order.
#[derive(Debug)]
enum Slot {
    Waiting(InFlight),
    /// A reply for the client, and the client's bridge legs (channel pairs) released after
    /// it ([`Output::ReleaseClientLegs`]; none: empty).
    Ready(Vec<u8>, Vec<(u8, u8)>),
}

/// Counters and state the connection reads for its timers and logs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct State {
    /// PLAY or RECORD answered 200 and no PAUSE/TEARDOWN since.
    pub playing: bool,
    /// The last of those was a RECORD: media flows from the client (reverse channel).
    pub recording: bool,
    /// `timeout=` of the server's Session header, if it gave one.
    pub session_timeout: Option<u32>,
    /// Media routes installed in the current session.
    pub routes: usize,
    /// UDP tracks set up in the current session (and not torn down one by one).
    pub tracks: usize,
}

/// One client connection's exchange.
pub struct Exchange<M: MediaPorts> {
    settings: std::sync::Arc<Settings>,
    media: M,
    client: Ipv4Addr,
    route: Option<usize>,
    next_cseq: u32,
    slots: VecDeque<Slot>,
    /// `WWW-Authenticate` values of the upstream's last challenge.
    challenge: Vec<String>,
    nonce_count: u32,
    rng: u64,
    /// Interleaved channels negotiated on this connection.
    channels: [bool; 256],
    /// Channels of bridge legs on the client's connection and on the upstream's.
    client_bridged: [bool; 256],
    upstream_bridged: [bool; 256],
    /// Spare upstream-side pairs from SETUPs that failed, reused before allocating.
    spare: Vec<u16>,
    announced: bool,
    state: State,
    closed: bool,
    /// The upstream's session id and the last upstream URL a SETUP/PLAY/RECORD named: what a
    /// TEARDOWN of vgate's own needs.
    upstream_session: Option<String>,
    upstream_url: Option<String>,
    /// Tracks set up in the current session, in SETUP order.
    tracks: Vec<Track>,
    /// UDP tracks set up since the session began, for route labels.
    track_seq: usize,
    /// `CSeq`s of the server's requests forwarded to the client and not yet answered.
    server_requests: VecDeque<String>,
}

impl<M: MediaPorts> Exchange<M> {
    /// `client` is the peer address of the client connection; `seed` feeds the client
    /// nonces of Digest answers.
    pub fn new(settings: std::sync::Arc<Settings>, media: M, client: Ipv4Addr, seed: u64) -> Self {
        Exchange {
            settings,
            media,
            client,
            route: None,
            next_cseq: 1,
            slots: VecDeque::new(),
            challenge: Vec::new(),
            nonce_count: 0,
            rng: seed | 1,
            channels: [false; 256],
            client_bridged: [false; 256],
            upstream_bridged: [false; 256],
            spare: Vec::new(),
            announced: false,
            state: State::default(),
            closed: false,
            upstream_session: None,
            upstream_url: None,
            tracks: Vec::new(),
            track_seq: 0,
            server_requests: VecDeque::new(),
        }
    }

    pub fn state(&self) -> State {
        self.state
    }

    pub fn media(&self) -> &M {
        &self.media
    }

    pub fn media_mut(&mut self) -> &mut M {
        &mut self.media
    }

    /// Whether `$` frames on this channel belong to a negotiated interleaved track.
    pub fn channel_allowed(&self, channel: u8) -> bool {
        self.channels[usize::from(channel)]
    }

    /// Whether `$` frames on `channel` of `side`'s connection belong to a bridge leg.
    pub fn bridged(&self, side: TcpSide, channel: u8) -> bool {
        match side {
            TcpSide::Client => self.client_bridged[usize::from(channel)],
            TcpSide::Upstream => self.upstream_bridged[usize::from(channel)],
        }
    }

    /// Requests still waiting for the upstream.
    pub fn pending(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| matches!(s, Slot::Waiting(_)))
            .count()
    }

    /// Ends the session on vgate's own initiative (an operator ended it): a TEARDOWN to the
    /// upstream when a session was set up there, then both connections close.
    pub fn teardown(&mut self) -> Vec<Output> {
        let mut out = Vec::new();
        if let (Some(id), Some(url)) = (self.upstream_session.take(), self.upstream_url.take()) {
            let cseq = self.next_cseq;
            self.next_cseq = self.next_cseq.wrapping_add(1).max(1);
            let mut req = format!("TEARDOWN {url} RTSP/1.0\r\nCSeq: {cseq}\r\nSession: {id}\r\n");
            let route = self.route.unwrap_or_default();
            if let Some(auth) = self.authorization_for(route, "TEARDOWN", &url) {
                req.push_str(&format!("Authorization: {auth}\r\n"));
            }
            req.push_str("\r\n");
            out.push(Output::Upstream(req.into_bytes()));
        }
        self.end_session();
        out.push(Output::SessionEnded);
        out.push(Output::Close);
        out
    }

    /// Ends the media session (timeout, client gone). Idempotent.
    pub fn end_session(&mut self) {
        self.media.release();
        self.state = State::default();
        self.channels = [false; 256];
        self.client_bridged = [false; 256];
        self.upstream_bridged = [false; 256];
        self.spare.clear();
        self.tracks.clear();
        self.track_seq = 0;
    }

    /// A TEARDOWN of one track's control URL (RFC 2326 §10.7) while other tracks remain:
    /// only that track's routes, ports and channels go back.
    fn end_track(&mut self, upstream_uri: &str) -> bool {
        let key = |u: &str| u.trim_end_matches('/').to_owned();
        let want = key(upstream_uri);
        if self.tracks.len() < 2 {
            return false;
        }
        let Some(i) = self.tracks.iter().position(|t| key(&t.url) == want) else {
            return false;
        };
        let track = self.tracks.remove(i);
        self.media.release_track(&track.routes, &track.ports);
        self.state.routes = self.state.routes.saturating_sub(track.routes.len());
        if let Some((side, channels)) = track.leg {
            self.media.close_leg(side, channels);
            self.mark_bridged(side, channels, false);
        }
        if let Some((first, last)) = track.channels {
            for c in first..=last {
                self.channels[usize::from(c)] = false;
            }
        } else {
            self.state.tracks = self.state.tracks.saturating_sub(1);
        }
        self.settings.events.track_teardowns.fetch_add(1, Relaxed);
        true
    }

    fn random_hex(&mut self) -> String {
        // splitmix64: client nonces only need to differ; the seed is random.
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        format!("{:016x}", z ^ (z >> 31))
    }

    // ---- client → upstream -------------------------------------------------------------

    /// A complete message from the client (`raw` is one `Frame::Message`).
    pub fn client_message(&mut self, raw: &[u8], now_secs: u64) -> Vec<Output> {
        if let Some(m) = raw
            .split(|b| *b == b' ')
            .next()
            .filter(|m| !m.is_empty() && !m.starts_with(b"RTSP/"))
        {
            self.settings.stats.request(m);
        }
        let mut out = Vec::new();
        if self.closed {
            return out;
        }
        let msg = match Message::parse(raw, &self.settings.limits) {
            Ok(m) => m,
            Err(_) => {
                // The stream may be out of step now: answer and close.
                self.local(&mut out, None, Status::BAD_REQUEST, &[]);
                out.push(Output::Close);
                self.closed = true;
                return out;
            }
        };
        let Some(method) = msg.method() else {
            self.client_reply(&msg, &mut out);
            return out;
        };
        let cseq = match msg.cseq() {
            Ok(_) => msg.cseq_raw().map(str::to_owned),
            Err(_) => {
                self.local(&mut out, None, Status::BAD_REQUEST, &[]);
                return out;
            }
        };
        let cseq = cseq.unwrap_or_default();
        if msg.version() != "RTSP/1.0" {
            self.local(&mut out, Some(&cseq), Status::VERSION_NOT_SUPPORTED, &[]);
            return out;
        }
        if self.slots.len() >= MAX_PENDING {
            self.local(&mut out, Some(&cseq), Status::SERVICE_UNAVAILABLE, &[]);
            return out;
        }
        match self.request(&msg, method, &cseq, now_secs, &mut out) {
            Ok(()) => {}
            Err(status) => self.local(&mut out, Some(&cseq), status, &[]),
        }
        out
    }

    fn request(
        &mut self,
        msg: &Message<'_>,
        method: &str,
        cseq: &str,
        now_secs: u64,
        out: &mut Vec<Output>,
    ) -> Result<(), Status> {
        const KNOWN: [&str; 10] = [
            "OPTIONS",
            "DESCRIBE",
            "SETUP",
            "PLAY",
            "PAUSE",
            "GET_PARAMETER",
            "SET_PARAMETER",
            "TEARDOWN",
            "ANNOUNCE",
            "RECORD",
        ];
        if !KNOWN.contains(&method) {
            self.local(out, Some(cseq), METHOD_NOT_ALLOWED, &[("Allow", METHODS)]);
            return Ok(());
        }
        let client_uri = msg.uri().unwrap_or_default();
        let settings = std::sync::Arc::clone(&self.settings);
        if let Some(verifier) = &settings.verifier {
            let ok = msg
                .authorization()
                .is_some_and(|a| verifier.verify(a, method, client_uri, now_secs).is_ok());
            if !ok {
                let stale = matches!(
                    msg.authorization()
                        .map(|a| verifier.verify(a, method, client_uri, now_secs)),
                    Some(Err(RtspError::BadNonce { stale: true }))
                );
                let mut random = [0u8; 16];
                for chunk in random.chunks_mut(8) {
                    let r = u64::from_str_radix(&self.random_hex(), 16).unwrap_or(self.rng);
                    chunk.copy_from_slice(&r.to_le_bytes());
                }
                let challenges = verifier.challenges(now_secs, random, stale);
                let headers: Vec<(&str, &str)> = challenges
                    .iter()
                    .map(|c| ("WWW-Authenticate", c.as_str()))
                    .collect();
                self.local(out, Some(cseq), Status::UNAUTHORIZED, &headers);
                return Ok(());
            }
        }
        // Which upstream, and the Request-URI it sees.
        let upstream_uri = if client_uri == "*" {
            if self.route.is_none() {
                // OPTIONS * before any URL: vgate answers; no upstream is chosen yet.
                self.local(out, Some(cseq), Status::OK, &[("Public", METHODS)]);
                return Ok(());
            }
            "*".to_owned()
        } else {
            let mapped = self
                .settings
                .map
                .to_upstream(client_uri)
                .map_err(|e| match e {
                    RtspError::NoRoute => Status::NOT_FOUND,
                    _ => Status::BAD_REQUEST,
                })?;
            match self.route {
                None => {
                    let up = *self
                        .settings
                        .upstreams
                        .get(mapped.route)
                        .ok_or(Status::INTERNAL_SERVER_ERROR)?;
                    self.route = Some(mapped.route);
                    out.push(Output::Connect(up));
                }
                // One upstream connection per client connection: another upstream's
                // path cannot be served on this one.
                Some(r)
                    if self.settings.upstreams.get(r)
                        != self.settings.upstreams.get(mapped.route) =>
                {
                    return Err(Status::NOT_FOUND)
                }
                Some(_) => {}
            }
            mapped.url
        };
        let route = self.route.unwrap_or_default();
        let mut editor = Editor::new(msg);
        editor
            .set_uri(&upstream_uri)
            .map_err(|_| Status::BAD_REQUEST)?;
        let manages_auth = self.settings.verifier.is_some() || self.credentials(route).is_some();
        if manages_auth {
            // The client's credentials are for vgate (or meaningless upstream: digest
            // covers the rewritten URI); they never cross.
            let _ = editor.remove_header("Authorization");
        }
        if matches!(method, "SETUP" | "PLAY" | "RECORD") {
            self.upstream_url = Some(upstream_uri.clone());
        }
        let mut setup = None;
        let mut profile = String::new();
        match method {
            "SETUP" => {
                let (kind, p) = self.setup_request(msg, &mut editor)?;
                setup = Some(kind);
                profile = p;
            }
            "ANNOUNCE" => {
                self.announced = true;
                if !msg.body().is_empty() {
                    let body = self.sdp_to_upstream(route, msg.body())?;
                    editor.set_body(body);
                }
            }
            _ => {}
        }
        // Numbered only once nothing can refuse it: vgate's numbers have no gaps.
        let upstream_cseq = self.next_cseq;
        self.next_cseq = self.next_cseq.wrapping_add(1).max(1);
        editor
            .set_header("CSeq", &upstream_cseq.to_string())
            .map_err(|_| Status::INTERNAL_SERVER_ERROR)?;
        let mut sent = editor.to_bytes();
        if let Some(auth) = self.authorization_for(route, method, &upstream_uri) {
            sent = with_header(&sent, &self.settings.limits, "Authorization", &auth)
                .map_err(|_| Status::INTERNAL_SERVER_ERROR)?;
        }
        out.push(Output::Upstream(sent.clone()));
        if method == "TEARDOWN" {
            // Whatever the server answers, the client is done with the session (or the
            // track); clients often close the connection right after sending it.
            if self.end_track(&upstream_uri) {
                out.push(Output::TrackEnded);
            } else {
                self.end_session();
                out.push(Output::SessionEnded);
            }
        }
        self.slots.push_back(Slot::Waiting(InFlight {
            cseq: upstream_cseq,
            client_cseq: cseq.to_owned(),
            method: method.to_owned(),
            upstream_uri,
            sent,
            setup,
            profile,
            retried: false,
            answered_challenge: false,
        }));
        Ok(())
    }

    /// A new track's RTP/RTCP pair on the upstream side (a spare one first).
    fn upstream_pair(&mut self) -> Result<u16, Status> {
        if self.state.tracks >= MAX_TRACKS {
            return Err(Status::NOT_ENOUGH_BANDWIDTH);
        }
        match self.spare.pop() {
            Some(p) => Ok(p),
            None => self
                .media
                .alloc_pair(self.settings.client_domain.other())
                .map_err(|_| Status::NOT_ENOUGH_BANDWIDTH),
        }
    }

    /// Polices the client's Transport and points the upstream at vgate.
    fn setup_request(
        &mut self,
        msg: &Message<'_>,
        editor: &mut Editor<'_, '_>,
    ) -> Result<(SetupKind, String), Status> {
        let value = msg.transport().ok_or(Status::UNSUPPORTED_TRANSPORT)?;
        let specs = parse_transport(value).map_err(transport_status)?;
        let (chosen, delivery) =
            select_transport(&specs, IpAddr::V4(self.client), &self.settings.transports)
                .map_err(transport_status)?;
        let record = chosen
            .mode()
            .is_some_and(|m| m.to_ascii_uppercase().contains("RECORD"))
            || self.announced;
        let profile = format!("{}/{}", chosen.protocol, chosen.profile);
        let spec = chosen.clone().with_unicast().without_destination();
        let kind = match delivery {
            Delivery::Udp { client_port } => {
                let pair = self.upstream_pair()?;
                let spec = spec
                    .with_client_port(pair, Some(pair + 1))
                    .map_err(|_| Status::INTERNAL_SERVER_ERROR)?;
                editor
                    .set_header("Transport", &spec.to_string())
                    .map_err(|_| Status::BAD_REQUEST)?;
                let client_rtp = client_port.rtp();
                SetupKind::Udp(UdpSetup {
                    client_rtp,
                    client_rtcp: client_port
                        .rtcp()
                        .unwrap_or_else(|| client_rtp.saturating_add(1)),
                    upstream_pair: pair,
                    record,
                })
            }
            Delivery::Interleaved { channels }
                if self
                    .settings
                    .bridge
                    .as_ref()
                    .is_some_and(|b| b.udp_upstream) =>
            {
                let pair = self.upstream_pair()?;
                let mode = if record { ";mode=record" } else { "" };
                editor
                    .set_header(
                        "Transport",
                        &format!("{profile};unicast;client_port={}-{}{mode}", pair, pair + 1),
                    )
                    .map_err(|_| Status::BAD_REQUEST)?;
                SetupKind::TcpToUdp {
                    channels: channels.map(|c| (c.first, c.last.max(c.first))),
                    upstream_pair: pair,
                    record,
                }
            }
            Delivery::Interleaved { channels } => {
                // Relayed frames keep their channel numbers: they must not be a bridge's
                // on either connection (bridged, the client's channels stay its own).
                if channels.is_some_and(|c| {
                    (c.first..=c.last).any(|c| {
                        self.bridged(TcpSide::Client, c) || self.bridged(TcpSide::Upstream, c)
                    })
                }) {
                    return Err(self.taken());
                }
                editor
                    .set_header("Transport", &spec.to_string())
                    .map_err(|_| Status::BAD_REQUEST)?;
                SetupKind::Interleaved {
                    channels: channels.map(|c| (c.first, c.last.max(c.first))),
                    record,
                }
            }
        };
        Ok((kind, profile))
    }

    fn credentials(&self, route: usize) -> Option<&Credentials> {
        self.settings
            .credentials
            .get(route)
            .and_then(Option::as_ref)
    }

    /// `Authorization` for a request upstream, once the upstream has challenged.
    fn authorization_for(&mut self, route: usize, method: &str, uri: &str) -> Option<String> {
        if self.challenge.is_empty() {
            return None;
        }
        let creds = self.credentials(route)?.clone();
        let values = std::mem::take(&mut self.challenge);
        let mut challenges: Vec<Challenge<'_>> = Vec::new();
        for v in &values {
            if let Ok(c) = parse_www_authenticate(v) {
                challenges.extend(c);
            }
        }
        let chosen = choose_challenge(&challenges).cloned();
        self.nonce_count = self.nonce_count.wrapping_add(1);
        let nc = self.nonce_count;
        let cnonce = self.random_hex();
        let answer = chosen.and_then(|c| {
            authorization(
                &c,
                &creds,
                method,
                uri,
                ClientNonce {
                    cnonce: &cnonce,
                    nc,
                },
            )
            .ok()
        });
        drop(challenges);
        self.challenge = values;
        answer
    }

    fn sdp_to_upstream(&self, route: usize, body: &[u8]) -> Result<Vec<u8>, Status> {
        let urls = self
            .settings
            .map
            .sdp_to_upstream(route, body)
            .map_err(|_| Status::BAD_REQUEST)?;
        let addr = self.settings.gateway[self.settings.client_domain.other().index()];
        sdp::rewrite(&urls, addr, |_, _| Ok::<_, Infallible>(None)).map_err(|_| Status::BAD_REQUEST)
    }

    // ---- upstream → client -------------------------------------------------------------

    /// A complete message from the upstream.
    pub fn upstream_message(&mut self, raw: &[u8]) -> Vec<Output> {
        if raw.starts_with(b"RTSP/") {
            if let Some(code) = raw
                .get(9..12)
                .and_then(|c| std::str::from_utf8(c).ok())
                .and_then(|c| c.parse().ok())
            {
                self.settings.stats.response(code);
            }
        }
        let mut out = Vec::new();
        if self.closed {
            return out;
        }
        let Ok(msg) = Message::parse(raw, &self.settings.limits) else {
            self.fail_pending(&mut out, BAD_GATEWAY);
            return out;
        };
        if let Some(method) = msg.method() {
            self.server_request(&msg, method, &mut out);
            return out;
        }
        let Ok(cseq) = msg.cseq() else {
            return out;
        };
        let Some(index) = self
            .slots
            .iter()
            .position(|s| matches!(s, Slot::Waiting(f) if f.cseq == cseq))
        else {
            return out;
        };
        let Some(Slot::Waiting(mut flight)) = self.slots.remove(index) else {
            return out;
        };
        let status = msg.status().unwrap_or(0);
        let route = self.route.unwrap_or_default();
        if status == 401 && !flight.answered_challenge && self.credentials(route).is_some() {
            self.challenge = msg.www_authenticate().map(str::to_owned).collect();
            self.nonce_count = 0;
            if let Some(auth) = self.authorization_for(route, &flight.method, &flight.upstream_uri)
            {
                let new_cseq = self.next_cseq;
                self.next_cseq = self.next_cseq.wrapping_add(1).max(1);
                let resent =
                    with_header(&flight.sent, &self.settings.limits, "Authorization", &auth)
                        .and_then(|b| {
                            with_header(&b, &self.settings.limits, "CSeq", &new_cseq.to_string())
                        });
                if let Ok(bytes) = resent {
                    flight.cseq = new_cseq;
                    flight.sent = bytes.clone();
                    flight.answered_challenge = true;
                    out.push(Output::Upstream(bytes));
                    self.slots.insert(index, Slot::Waiting(flight));
                    return out;
                }
            }
        }
        if flight.method == "SETUP" && !flight.retried && self.settings.bridge.is_some() {
            if let Some(kind) = flight.setup {
                let other = (200..300).contains(&status)
                    && answered_lower(&msg).is_some_and(|l| l != kind.upstream_lower());
                if status == 461 || other {
                    // The upstream refused the client's lower transport (or answered the
                    // other one): ask it for the other one, and bridge.
                    match self.retry_setup(&msg, &mut flight, kind, route) {
                        Ok(bytes) => {
                            out.push(Output::Upstream(bytes));
                            self.slots.insert(index, Slot::Waiting(flight));
                            return out;
                        }
                        Err(status) => {
                            self.give_back(&flight);
                            let reply = build_response(Some(&flight.client_cseq), status, &[])
                                .unwrap_or_default();
                            self.slots.insert(index, Slot::Ready(reply, Vec::new()));
                            self.flush(&mut out);
                            return out;
                        }
                    }
                }
            }
        }
        if flight.method == "SETUP" && flight.retried && status == 461 {
            // The other transport refused too: nothing to bridge.
            self.give_back(&flight);
            let reply = build_response(Some(&flight.client_cseq), self.unbridgeable(), &[])
                .unwrap_or_default();
            self.slots.insert(index, Slot::Ready(reply, Vec::new()));
            self.flush(&mut out);
            return out;
        }
        let (reply, release) = match self.reply(&msg, &flight, route) {
            Ok(bytes) => (bytes, self.releases_client_legs(status, &flight.method)),
            Err(status) => {
                self.give_back(&flight);
                let bytes =
                    build_response(Some(&flight.client_cseq), status, &[]).unwrap_or_default();
                (bytes, Vec::new())
            }
        };
        self.slots.insert(index, Slot::Ready(reply, release));
        self.flush(&mut out);
        out
    }

    /// Rewrites one reply for the client; acts on what it means for the session.
    fn reply(
        &mut self,
        msg: &Message<'_>,
        flight: &InFlight,
        route: usize,
    ) -> Result<Vec<u8>, Status> {
        let status = msg.status().unwrap_or(0);
        let ok = (200..300).contains(&status);
        let mut editor = Editor::new(msg);
        editor
            .set_header("CSeq", &flight.client_cseq)
            .map_err(|_| BAD_GATEWAY)?;
        for name in ["Content-Base", "Content-Location", "Location"] {
            if let Some(url) = msg.header(name) {
                match self.settings.map.to_client(route, url) {
                    Ok(u) => editor.set_header(name, &u).map_err(|_| BAD_GATEWAY)?,
                    Err(_) => editor.remove_header(name).map_err(|_| BAD_GATEWAY)?,
                };
            }
        }
        if let Some(info) = msg.rtp_info() {
            match self.settings.map.rtp_info_to_client(route, info) {
                Ok(v) => editor.set_header("RTP-Info", &v).map_err(|_| BAD_GATEWAY)?,
                Err(_) => editor.remove_header("RTP-Info").map_err(|_| BAD_GATEWAY)?,
            };
        }
        if status == 401 && self.credentials(route).is_some() {
            // vgate's own credentials were refused: the client cannot do better.
            return Err(BAD_GATEWAY);
        }
        if !msg.body().is_empty() && is_sdp(msg) {
            let body = self.sdp_to_client(route, msg.body())?;
            editor.set_body(body);
        }
        if let Ok(Some(session)) = msg.session() {
            self.upstream_session = Some(session.id.to_string());
            // vgate ends idle sessions after the shorter of the server's timeout and its own,
            // so it tells the client the shorter one: keep-alives then come in time.
            let own = self.settings.session_timeout;
            let effective = session.timeout.map_or(own, |t| t.min(own));
            self.state.session_timeout = Some(effective);
            if session.timeout != Some(effective) {
                editor
                    .set_header("Session", &format!("{};timeout={effective}", session.id))
                    .map_err(|_| BAD_GATEWAY)?;
            }
        }
        match flight.method.as_str() {
            "SETUP" => match flight.setup {
                Some(kind) if ok => self.setup_reply(msg, kind, flight, &mut editor)?,
                _ => {
                    self.give_back(flight);
                    self.rewrite_transport_source(msg, &mut editor)?;
                }
            },
            "PLAY" | "RECORD" if ok => {
                self.state.playing = true;
                self.state.recording = flight.method == "RECORD";
            }
            "PAUSE" if ok => self.state.playing = false,
            // The session ended when the TEARDOWN went out.
            "TEARDOWN" => {}
            _ => self.rewrite_transport_source(msg, &mut editor)?,
        }
        Ok(editor.to_bytes())
    }

    /// Whether the client's bridge legs may write once the reply (`status` to `method`,
    /// already acted on) is written: it starts the media (PLAY, RECORD) or sets up a track
    /// of a session already playing, and the client's connection has a leg. A failed PLAY
    /// releases nothing: the legs hold (their sinks bounded, overflow counted as stalls)
    /// until a PLAY succeeds or the track or session ends and closes them. The legs: their
    /// channel pairs, as they are now (none: empty).
    fn releases_client_legs(&self, status: u16, method: &str) -> Vec<(u8, u8)> {
        if !((200..300).contains(&status)
            && self.state.playing
            && matches!(method, "PLAY" | "RECORD" | "SETUP"))
        {
            return Vec::new();
        }
        self.tracks
            .iter()
            .filter_map(|t| match t.leg {
                Some((TcpSide::Client, channels)) => Some(channels),
                _ => None,
            })
            .collect()
    }

    /// A Transport in a reply other than a successful SETUP still must not name domain A.
    fn rewrite_transport_source(
        &self,
        msg: &Message<'_>,
        editor: &mut Editor<'_, '_>,
    ) -> Result<(), Status> {
        if let Some(value) = msg.transport() {
            let specs = parse_transport(value).map_err(|_| BAD_GATEWAY)?;
            let ip = IpAddr::V4(self.settings.gateway[self.settings.client_domain.index()]);
            let specs: Vec<_> = specs
                .into_iter()
                .map(|s| {
                    let s = s.without_destination();
                    if s.source().is_some() {
                        s.with_source(ip)
                    } else {
                        s
                    }
                })
                .collect();
            let text = crate::signaling::rtsp::format_transport(&specs);
            editor
                .set_header("Transport", &text)
                .map_err(|_| BAD_GATEWAY)?;
        }
        Ok(())
    }

    fn setup_reply(
        &mut self,
        msg: &Message<'_>,
        kind: SetupKind,
        flight: &InFlight,
        editor: &mut Editor<'_, '_>,
    ) -> Result<(), Status> {
        let route = self.route.unwrap_or_default();
        let url = flight.upstream_uri.as_str();
        let value = msg.transport().ok_or(BAD_GATEWAY)?;
        let mut specs = parse_transport(value).map_err(|_| BAD_GATEWAY)?;
        if specs.is_empty() {
            return Err(BAD_GATEWAY);
        }
        let spec = specs.swap_remove(0).without_destination();
        let client_ip = IpAddr::V4(self.settings.gateway[self.settings.client_domain.index()]);
        match kind {
            SetupKind::TcpToUdp { .. } | SetupKind::UdpToTcp { .. } => {
                if spec.lower != kind.upstream_lower() {
                    return Err(self.unbridgeable());
                }
                self.bridge_reply(&spec, kind, flight, route, editor)
            }
            SetupKind::Interleaved { .. } => {
                // Asked again with UDP first when the route can bridge (see upstream_message).
                if spec.lower != LowerTransport::Tcp {
                    return Err(self.unbridgeable());
                }
                let mut track = Track {
                    url: url.to_owned(),
                    ..Track::default()
                };
                if let Some(ch) = spec.interleaved() {
                    // Relayed frames keep their numbers on both connections: none may be a
                    // bridge leg's on either.
                    if (ch.first..=ch.last).any(|c| {
                        self.bridged(TcpSide::Client, c) || self.bridged(TcpSide::Upstream, c)
                    }) {
                        return Err(self.taken());
                    }
                    for c in ch.first..=ch.last {
                        self.channels[usize::from(c)] = true;
                    }
                    track.channels = Some((ch.first, ch.last));
                }
                self.tracks.push(track);
                let spec = if spec.source().is_some() {
                    spec.with_source(client_ip)
                } else {
                    spec
                };
                editor
                    .set_header("Transport", &spec.to_string())
                    .map_err(|_| BAD_GATEWAY)?;
                Ok(())
            }
            SetupKind::Udp(setup) => {
                if spec.lower != LowerTransport::Udp {
                    return Err(self.unbridgeable());
                }
                let upstream = self
                    .settings
                    .upstreams
                    .get(route)
                    .copied()
                    .ok_or(BAD_GATEWAY)?;
                let server_ip = match spec.source().map(str::parse::<Ipv4Addr>) {
                    Some(Ok(ip)) => ip,
                    _ => *upstream.ip(),
                };
                let server_port = spec.server_port();
                let pair = self
                    .media
                    .alloc_pair(self.settings.client_domain)
                    .map_err(|_| Status::NOT_ENOUGH_BANDWIDTH)?;
                self.state.tracks += 1;
                self.track_seq += 1;
                let server_rtp = server_port.map(|p| p.rtp());
                let server_rtcp =
                    server_port.map(|p| p.rtcp().unwrap_or(p.rtp().saturating_add(1)));
                let cd = self.settings.client_domain;
                let ud = cd.other();
                let mut track = Track {
                    url: url.to_owned(),
                    routes: Vec::new(),
                    ports: vec![
                        (ud, setup.upstream_pair),
                        (ud, setup.upstream_pair + 1),
                        (cd, pair),
                        (cd, pair + 1),
                    ],
                    channels: None,
                    leg: None,
                };
                let client = self.client;
                if let Err(status) = self.install(
                    setup,
                    pair,
                    client,
                    server_ip,
                    server_rtp,
                    server_rtcp,
                    &mut track,
                    None,
                ) {
                    // What was installed goes back; the upstream-side pair is kept as a spare.
                    self.media
                        .release_track(&track.routes, track.ports.get(2..).unwrap_or_default());
                    self.state.routes = self.state.routes.saturating_sub(track.routes.len());
                    self.state.tracks -= 1;
                    return Err(status);
                }
                self.tracks.push(track);
                let spec = spec
                    .with_client_port(setup.client_rtp, Some(setup.client_rtcp))
                    .and_then(|s| s.with_server_port(pair, Some(pair + 1)))
                    .map_err(|_| BAD_GATEWAY)?
                    .with_source(client_ip);
                editor
                    .set_header("Transport", &spec.to_string())
                    .map_err(|_| BAD_GATEWAY)?;
                Ok(())
            }
        }
    }

    /// The stream routes of one UDP track. `pair` is vgate's client-side pair. With `leg`,
    /// one side is interleaved: the routes toward it end in the leg's sinks, the routes from
    /// it take the leg's frames (that side's ports are 0: any port of its address).
    #[allow(clippy::too_many_arguments)]
    fn install(
        &mut self,
        setup: UdpSetup,
        pair: u16,
        client: Ipv4Addr,
        server_ip: Ipv4Addr,
        server_rtp: Option<u16>,
        server_rtcp: Option<u16>,
        track: &mut Track,
        leg: Option<(TcpSide, (u8, u8))>,
    ) -> Result<(), Status> {
        let cd = self.settings.client_domain;
        let ud = cd.other();
        let up = setup.upstream_pair;
        let seq = self.track_seq;
        let name = self.settings.name.clone();
        let label = |what: &str| format!("rtsp:{name}:t{seq}:{what}");
        let server = |p: Option<u16>| SocketAddrV4::new(server_ip, p.unwrap_or(0));
        let mut specs = Vec::new();
        let policy = self.settings.policy;
        let rtp_only = self.settings.rtp_only;
        let route = |ingress: DomainId,
                     port: u16,
                     dest: SocketAddrV4,
                     egress_port: u16,
                     expected: SocketAddrV4,
                     rtp: bool,
                     what: &str| RouteSpec {
            ingress,
            port,
            dest,
            egress_port,
            policy,
            expected: Some(expected),
            rtp_only: rtp && rtp_only,
            label: label(what),
        };
        let c_rtp = SocketAddrV4::new(client, setup.client_rtp);
        let c_rtcp = SocketAddrV4::new(client, setup.client_rtcp);
        if setup.record {
            if let (Some(_), Some(_)) = (server_rtp, server_rtcp) {
                specs.push(route(cd, pair, server(server_rtp), up, c_rtp, true, "rtp"));
                specs.push(route(
                    cd,
                    pair + 1,
                    server(server_rtcp),
                    up + 1,
                    c_rtcp,
                    false,
                    "rtcp",
                ));
            }
            specs.push(route(
                ud,
                up + 1,
                c_rtcp,
                pair + 1,
                server(server_rtcp),
                false,
                "rtcp-rr",
            ));
        } else {
            specs.push(route(ud, up, c_rtp, pair, server(server_rtp), true, "rtp"));
            specs.push(route(
                ud,
                up + 1,
                c_rtcp,
                pair + 1,
                server(server_rtcp),
                false,
                "rtcp",
            ));
            if server_rtcp.is_some() {
                specs.push(route(
                    cd,
                    pair + 1,
                    server(server_rtcp),
                    up + 1,
                    c_rtcp,
                    false,
                    "rtcp-rr",
                ));
            }
        }
        for spec in specs {
            let key = (spec.ingress, spec.port);
            // Routes toward the leg's side (egress in its domain) end in its sinks.
            let added = match leg {
                Some((side, channels)) => {
                    let leg_domain = match side {
                        TcpSide::Client => cd,
                        TcpSide::Upstream => ud,
                    };
                    if spec.ingress.other() == leg_domain {
                        let index = usize::from(!spec.label.ends_with(":rtp"));
                        self.media.add_leg_route(spec, side, channels, index)
                    } else {
                        self.media.add_route(spec)
                    }
                }
                None => self.media.add_route(spec),
            };
            added.map_err(|_| Status::NOT_ENOUGH_BANDWIDTH)?;
            track.routes.push(key);
            self.state.routes += 1;
        }
        Ok(())
    }

    /// A SETUP that did not succeed gives its upstream-side pair back for the next one.
    fn give_back(&mut self, flight: &InFlight) {
        let pair = match flight.setup {
            Some(SetupKind::Udp(s)) | Some(SetupKind::UdpToTcp { setup: s, .. }) => s.upstream_pair,
            Some(SetupKind::TcpToUdp { upstream_pair, .. }) => upstream_pair,
            _ => return,
        };
        if !self.spare.contains(&pair) {
            self.spare.push(pair);
        }
    }

    /// A SETUP refused for lack of a bridge: `461` with the reason, counted.
    fn unbridgeable(&self) -> Status {
        self.settings.events.bridge_refused.fetch_add(1, Relaxed);
        if self.settings.bridge.is_some() {
            UNBRIDGEABLE
        } else {
            NO_BRIDGE
        }
    }

    /// Whether one of `channels` carries another track on `side`'s connection (relayed
    /// or bridged there).
    fn channels_taken(&self, side: TcpSide, channels: (u8, u8)) -> bool {
        [channels.0, channels.1]
            .into_iter()
            .any(|c| self.channels[usize::from(c)] || self.bridged(side, c))
    }

    /// A SETUP refused because its interleaved channels are taken: `461` with the reason,
    /// counted.
    fn taken(&self) -> Status {
        self.settings.events.channels_taken.fetch_add(1, Relaxed);
        CHANNELS_TAKEN
    }

    /// The lowest pair of `$` channels free on `side`'s connection (neither relayed nor
    /// bridged there).
    fn free_channels(&self, side: TcpSide) -> Option<(u8, u8)> {
        (0u8..=254).step_by(2).find_map(|n| {
            let free = |c: u8| !self.channels[usize::from(c)] && !self.bridged(side, c);
            (free(n) && free(n + 1)).then_some((n, n + 1))
        })
    }

    fn mark_bridged(&mut self, side: TcpSide, channels: (u8, u8), on: bool) {
        let table = match side {
            TcpSide::Client => &mut self.client_bridged,
            TcpSide::Upstream => &mut self.upstream_bridged,
        };
        for c in [channels.0, channels.1] {
            table[usize::from(c)] = on;
        }
    }

    /// The upstream refused the lower transport of a SETUP (or answered the other one): the
    /// same SETUP again with the other one, renumbered, for a bridge.
    fn retry_setup(
        &mut self,
        msg: &Message<'_>,
        flight: &mut InFlight,
        kind: SetupKind,
        route: usize,
    ) -> Result<Vec<u8>, Status> {
        let mode = if kind.record() { ";mode=record" } else { "" };
        let (next, transport) = match kind {
            SetupKind::Udp(setup) => {
                let Some(channels) = self.free_channels(TcpSide::Upstream) else {
                    return Err(self.unbridgeable());
                };
                (
                    SetupKind::UdpToTcp { setup, channels },
                    format!(
                        "{}/TCP;unicast;interleaved={}-{}{mode}",
                        flight.profile, channels.0, channels.1
                    ),
                )
            }
            SetupKind::Interleaved { channels, record } => {
                let pair = self.upstream_pair()?;
                (
                    SetupKind::TcpToUdp {
                        channels,
                        upstream_pair: pair,
                        record,
                    },
                    format!(
                        "{};unicast;client_port={}-{}{mode}",
                        flight.profile,
                        pair,
                        pair + 1
                    ),
                )
            }
            SetupKind::TcpToUdp { .. } | SetupKind::UdpToTcp { .. } => {
                return Err(self.unbridgeable())
            }
        };
        // From here a failure gives the new kind's pair back (give_back).
        flight.setup = Some(next);
        flight.retried = true;
        let limits = self.settings.limits;
        let fail = |_| Status::INTERNAL_SERVER_ERROR;
        let mut bytes =
            with_header(&flight.sent, &limits, "Transport", &transport).map_err(fail)?;
        let had_session = Message::parse(&flight.sent, &limits)
            .ok()
            .is_some_and(|m| m.header("Session").is_some());
        if let (Ok(Some(session)), false) = (msg.session(), had_session) {
            bytes = with_header(&bytes, &limits, "Session", session.id).map_err(fail)?;
        }
        if let Some(auth) = self.authorization_for(route, "SETUP", &flight.upstream_uri) {
            bytes = with_header(&bytes, &limits, "Authorization", &auth).map_err(fail)?;
        }
        let cseq = self.next_cseq;
        self.next_cseq = self.next_cseq.wrapping_add(1).max(1);
        bytes = with_header(&bytes, &limits, "CSeq", &cseq.to_string()).map_err(fail)?;
        flight.cseq = cseq;
        flight.sent = bytes.clone();
        Ok(bytes)
    }

    /// The upstream's answer to a bridged SETUP: the leg, the track's routes (the leg's
    /// sockets stand for the interleaved side's peer) and the client's Transport.
    fn bridge_reply(
        &mut self,
        spec: &crate::signaling::rtsp::transport::TransportSpec<'_>,
        kind: SetupKind,
        flight: &InFlight,
        route: usize,
        editor: &mut Editor<'_, '_>,
    ) -> Result<(), Status> {
        let cd = self.settings.client_domain;
        let ud = cd.other();
        let gateway = self.settings.gateway;
        let upstream = *self.settings.upstreams.get(route).ok_or(BAD_GATEWAY)?;
        let server_ip = match spec.source().map(str::parse::<Ipv4Addr>) {
            Some(Ok(ip)) => ip,
            _ => *upstream.ip(),
        };
        let ssrc = spec
            .ssrc()
            .map(|s| format!(";ssrc={s}"))
            .unwrap_or_default();
        let mode = if kind.record() { ";mode=record" } else { "" };
        if self.state.tracks >= MAX_TRACKS {
            return Err(Status::NOT_ENOUGH_BANDWIDTH);
        }
        let (setup, leg, transport) = match kind {
            SetupKind::TcpToUdp {
                channels,
                upstream_pair,
                record,
            } => {
                let channels = match channels.or_else(|| self.free_channels(TcpSide::Client)) {
                    Some(c) if self.channels_taken(TcpSide::Client, c) => return Err(self.taken()),
                    Some(c) => c,
                    None => return Err(self.unbridgeable()),
                };
                let setup = UdpSetup {
                    client_rtp: 0,
                    client_rtcp: 0,
                    upstream_pair,
                    record,
                };
                let transport = format!(
                    "{}/TCP;unicast;interleaved={}-{}{ssrc}{mode}",
                    flight.profile, channels.0, channels.1
                );
                (setup, (TcpSide::Client, channels), transport)
            }
            SetupKind::UdpToTcp { setup, channels } => {
                let channels = spec
                    .interleaved()
                    .map_or(channels, |c| (c.first, c.last.max(c.first)));
                if self.channels_taken(TcpSide::Upstream, channels) {
                    return Err(self.taken());
                }
                (setup, (TcpSide::Upstream, channels), String::new())
            }
            SetupKind::Udp(_) | SetupKind::Interleaved { .. } => return Err(BAD_GATEWAY),
        };
        let pair = self
            .media
            .alloc_pair(cd)
            .map_err(|_| Status::NOT_ENOUGH_BANDWIDTH)?;
        let (side, channels) = leg;
        let leg = LegSpec {
            domain: match side {
                TcpSide::Client => cd,
                TcpSide::Upstream => ud,
            },
            side,
            channels,
            inject: match side {
                TcpSide::Client => [pair, pair + 1],
                TcpSide::Upstream => [setup.upstream_pair, setup.upstream_pair + 1],
            },
        };
        match self.media.open_leg(leg) {
            Ok(()) => {}
            Err(e) => {
                self.media.release_track(&[], &[(cd, pair), (cd, pair + 1)]);
                if let Some(suppressed) = LOG_LEG.check(crate::clock::now_ms()) {
                    tracing::warn!(route = %self.settings.name, suppressed, "cannot open a bridge leg ({e}); the client gets 461");
                }
                return Err(self.unbridgeable());
            }
        };
        // The interleaved side's peer has no ports: its frames come from its TCP connection
        // (any port of its address), its packets go to the leg's sinks.
        let (setup, server_ip, server_rtp, server_rtcp, transport) = match side {
            TcpSide::Client => {
                let server_port = spec.server_port();
                (
                    UdpSetup {
                        client_rtp: 0,
                        client_rtcp: 0,
                        ..setup
                    },
                    server_ip,
                    server_port.map(|p| p.rtp()),
                    server_port.map(|p| p.rtcp().unwrap_or(p.rtp().saturating_add(1))),
                    transport,
                )
            }
            TcpSide::Upstream => (
                setup,
                *upstream.ip(),
                Some(0),
                Some(0),
                format!(
                    "{};unicast;client_port={}-{};server_port={}-{};source={}{ssrc}{mode}",
                    flight.profile,
                    setup.client_rtp,
                    setup.client_rtcp,
                    pair,
                    pair + 1,
                    gateway[cd.index()]
                ),
            ),
        };
        self.state.tracks += 1;
        self.track_seq += 1;
        let up = setup.upstream_pair;
        let mut track = Track {
            url: flight.upstream_uri.clone(),
            routes: Vec::new(),
            ports: vec![(ud, up), (ud, up + 1), (cd, pair), (cd, pair + 1)],
            channels: None,
            leg: Some((side, channels)),
        };
        let client = self.client;
        if let Err(status) = self.install(
            setup,
            pair,
            client,
            server_ip,
            server_rtp,
            server_rtcp,
            &mut track,
            Some((side, channels)),
        ) {
            self.media
                .release_track(&track.routes, track.ports.get(2..).unwrap_or_default());
            self.media.close_leg(side, channels);
            self.state.routes = self.state.routes.saturating_sub(track.routes.len());
            self.state.tracks -= 1;
            return Err(status);
        }
        self.mark_bridged(side, channels, true);
        self.tracks.push(track);
        editor
            .set_header("Transport", &transport)
            .map_err(|_| BAD_GATEWAY)?;
        Ok(())
    }

    // ---- server → client requests ------------------------------------------------------

    /// The server asks the client something (an `OPTIONS`/`GET_PARAMETER` keep-alive, an
    /// `ANNOUNCE` of a changed stream, a `REDIRECT`, RTSP 2.0's `PLAY_NOTIFY`...): it goes to
    /// the client with its URLs and SDP rewritten like a reply's, its `CSeq` untouched (the
    /// server's numbering of its own requests; vgate sends the client no requests of its
    /// own, so nothing collides), and the client's reply goes back the same way. A request
    /// whose Request-URI or `Location` names something outside the route cannot be shown
    /// to the client: vgate answers it itself, `200` for the keep-alives, `501` otherwise.
    fn server_request(&mut self, msg: &Message<'_>, method: &str, out: &mut Vec<Output>) {
        let Some(cseq) = msg.cseq_raw().map(str::to_owned) else {
            if let Ok(reply) = msg.respond(Status::BAD_REQUEST, &[]) {
                out.push(Output::Upstream(reply));
            }
            return;
        };
        match self.server_request_to_client(msg) {
            Ok(bytes) => {
                if self.server_requests.len() >= MAX_PENDING {
                    // The client never answered the oldest: the server has given up on it.
                    self.server_requests.pop_front();
                }
                self.server_requests.push_back(cseq);
                self.settings
                    .events
                    .server_requests_forwarded
                    .fetch_add(1, Relaxed);
                out.push(Output::Client(bytes));
            }
            Err(()) => {
                let status = match method {
                    "OPTIONS" | "GET_PARAMETER" | "SET_PARAMETER" => Status::OK,
                    _ => NOT_IMPLEMENTED,
                };
                self.settings
                    .events
                    .server_requests_answered
                    .fetch_add(1, Relaxed);
                if let Ok(reply) = msg.respond(status, &[]) {
                    out.push(Output::Upstream(reply));
                }
            }
        }
    }

    /// A server request rewritten for the client; `Err` when it cannot be.
    fn server_request_to_client(&self, msg: &Message<'_>) -> Result<Vec<u8>, ()> {
        let route = self.route.ok_or(())?;
        let map = &self.settings.map;
        let mut editor = Editor::new(msg);
        match msg.uri() {
            Some("*") => {}
            Some(uri) => {
                let u = map.to_client(route, uri).map_err(|_| ())?;
                editor.set_uri(&u).map_err(|_| ())?;
            }
            None => return Err(()),
        }
        if let Some(url) = msg.header("Location") {
            let u = map.redirect_to_client(route, url).map_err(|_| ())?;
            editor.set_header("Location", &u).map_err(|_| ())?;
        }
        for name in ["Content-Base", "Content-Location"] {
            if let Some(url) = msg.header(name) {
                match map.to_client(route, url) {
                    Ok(u) => editor.set_header(name, &u).map_err(|_| ())?,
                    Err(_) => editor.remove_header(name).map_err(|_| ())?,
                };
            }
        }
        if let Some(info) = msg.rtp_info() {
            match map.rtp_info_to_client(route, info) {
                Ok(v) => editor.set_header("RTP-Info", &v).map_err(|_| ())?,
                Err(_) => editor.remove_header("RTP-Info").map_err(|_| ())?,
            };
        }
        if !msg.body().is_empty() && is_sdp(msg) {
            let body = self.sdp_to_client(route, msg.body()).map_err(|_| ())?;
            editor.set_body(body);
        }
        self.rewrite_transport_source(msg, &mut editor)
            .map_err(|_| ())?;
        Ok(editor.to_bytes())
    }

    /// The client's reply to a server request: back to the server with its URLs pointed
    /// upstream. A reply to nothing vgate forwarded is dropped.
    fn client_reply(&mut self, msg: &Message<'_>, out: &mut Vec<Output>) {
        let Some(cseq) = msg.cseq_raw() else { return };
        let Some(i) = self.server_requests.iter().position(|c| c == cseq) else {
            return;
        };
        self.server_requests.remove(i);
        let Some(route) = self.route else { return };
        let mut editor = Editor::new(msg);
        for name in ["Content-Base", "Content-Location", "Location"] {
            if let Some(url) = msg.header(name) {
                let done = match self.settings.map.to_upstream_on(route, url) {
                    Ok(u) => editor.set_header(name, &u).is_ok(),
                    Err(_) => editor.remove_header(name).is_ok(),
                };
                if !done {
                    return;
                }
            }
        }
        self.settings
            .events
            .client_replies_forwarded
            .fetch_add(1, Relaxed);
        out.push(Output::Upstream(editor.to_bytes()));
    }

    fn sdp_to_client(&self, route: usize, body: &[u8]) -> Result<Vec<u8>, Status> {
        let urls = self
            .settings
            .map
            .sdp_to_client(route, body)
            .map_err(|_| BAD_GATEWAY)?;
        let addr = self.settings.gateway[self.settings.client_domain.index()];
        sdp::rewrite(&urls, addr, |_, _| Ok::<_, Infallible>(None)).map_err(|_| BAD_GATEWAY)
    }

    // ---- ordering ------------------------------------------------------------------------

    /// vgate answers a request itself, in its turn.
    fn local(
        &mut self,
        out: &mut Vec<Output>,
        cseq: Option<&str>,
        status: Status,
        extra: &[(&str, &str)],
    ) {
        let bytes = build_response(cseq, status, extra)
            .or_else(|_| build_response(None, status, &[]))
            .unwrap_or_default();
        self.slots.push_back(Slot::Ready(bytes, Vec::new()));
        self.flush(out);
    }

    fn flush(&mut self, out: &mut Vec<Output>) {
        while let Some(Slot::Ready(..)) = self.slots.front() {
            if let Some(Slot::Ready(bytes, release)) = self.slots.pop_front() {
                out.push(Output::Client(bytes));
                if !release.is_empty() {
                    out.push(Output::ReleaseClientLegs(release));
                }
            }
        }
    }

    /// The upstream is gone or broken: every waiting request gets `status`, then close.
    pub fn fail_pending(&mut self, out: &mut Vec<Output>, status: Status) {
        for slot in self.slots.iter_mut() {
            if let Slot::Waiting(f) = slot {
                let bytes = build_response(Some(&f.client_cseq), status, &[]).unwrap_or_default();
                *slot = Slot::Ready(bytes, Vec::new());
            }
        }
        self.flush(out);
        out.push(Output::Close);
        self.closed = true;
    }

    /// The client's byte stream cannot be framed: 400 in its turn, then close.
    pub fn framing_error(&mut self) -> Vec<Output> {
        let mut out = Vec::new();
        if !self.closed {
            self.local(&mut out, None, Status::BAD_REQUEST, &[]);
            out.push(Output::Close);
            self.closed = true;
        }
        out
    }

    /// The upstream could not be reached.
    pub fn connect_failed(&mut self) -> Vec<Output> {
        let mut out = Vec::new();
        self.fail_pending(&mut out, Status::SERVICE_UNAVAILABLE);
        out
    }
}

fn is_sdp(msg: &Message<'_>) -> bool {
    match msg.header("Content-Type") {
        Some(t) => t
            .split(';')
            .next()
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/sdp")),
        None => msg.body().starts_with(b"v=0"),
    }
}

/// The lower transport of the first alternative of a reply's Transport.
fn answered_lower(msg: &Message<'_>) -> Option<LowerTransport> {
    let value = msg.transport()?;
    parse_transport(value).ok()?.first().map(|s| s.lower)
}

static LOG_LEG: crate::logging::RateLimit = crate::logging::RateLimit::new(10_000);

/// A Transport refusal as the status the client gets.
fn transport_status(e: RtspError) -> Status {
    match e {
        RtspError::ForeignDestination => Status::FORBIDDEN,
        RtspError::UnterminatedQuote => Status::BAD_REQUEST,
        _ => Status::UNSUPPORTED_TRANSPORT,
    }
}

/// `raw` (one whole message) with header `name` set to `value`.
fn with_header(raw: &[u8], limits: &Limits, name: &str, value: &str) -> Result<Vec<u8>, RtspError> {
    let msg = Message::parse(raw, limits)?;
    let mut e = Editor::new(&msg);
    e.set_header(name, value)?;
    Ok(e.to_bytes())
}
