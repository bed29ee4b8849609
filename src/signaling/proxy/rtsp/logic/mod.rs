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
//!
//! This file holds the types and the session's state; the exchange itself is split by seam:
//! `requests` (both directions, paired by `CSeq`), `setup`, `bridging`, `auth`, `server` (the
//! server's requests to the client).

use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::config::{DomainId, SourcePolicy};
use crate::routes::{RouteError, RouteSpec};
use crate::signaling::rtsp::auth::{Credentials, DigestVerifier};
use crate::signaling::rtsp::transport::{LowerTransport, TransportPolicy};
use crate::signaling::rtsp::{Limits, Status, UrlMap};

mod auth;
mod bridging;
mod requests;
mod server;
mod setup;

/// Most tracks one session may hold (relayed, UDP or bridged, SETUPs in flight included);
/// a SETUP beyond gets `453`, nothing sent upstream.
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
    /// Connections refused: the source holds `max_connections_per_source` connections
    /// without a session already, each with a request in flight (none could be evicted).
    pub refused_per_source: AtomicU64,
    /// Connections refused: the source holds `max_sessions_per_source` connections with a
    /// live session already.
    pub refused_sessions_per_source: AtomicU64,
    /// Connections refused with `503`: the route holds [`super::MAX_CONNECTIONS`] without a
    /// session (none idle) or [`super::MAX_SESSION_CONNECTIONS`] with one.
    pub refused_route_full: AtomicU64,
    /// Idle connections without a session closed to make room for a new one of the same
    /// source at `max_connections_per_source` (the source's idlest first).
    pub evicted_per_source: AtomicU64,
    /// Idle connections without a session closed to make room for a new one when the route
    /// held [`super::MAX_CONNECTIONS`] without a session (the route's idlest first).
    pub evicted_route_full: AtomicU64,
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
    /// Requests answered `415` by media validation (`enforce`): a SETUP of a track, or an
    /// ANNOUNCE of tracks, none of whose formats may cross.
    pub media_refused: AtomicU64,
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
            (
                "refused_sessions_per_source",
                &self.refused_sessions_per_source,
            ),
            ("refused_route_full", &self.refused_route_full),
            ("evicted_per_source", &self.evicted_per_source),
            ("evicted_route_full", &self.evicted_route_full),
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
            ("media_refused", &self.media_refused),
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
    /// Media validation of the tracks' RTP (`signaling_route.media_validate`) and its policy
    /// (`[media]`): what the session description offered for the track is what may cross.
    pub media_validate: crate::config::MediaMode,
    pub media_policy: crate::media::Policy,
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
/// `461` when the server refuses a track over the lower transport its session's first track
/// settled: vgate does not ask that track again (a server that fixes the transport closes the
/// connection at a second SETUP of one track).
const SETTLED_REFUSED: Status = Status::new(
    461,
    "Unsupported Transport (the server refused this track over the lower transport the session's first track settled)",
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
    /// A SETUP that must not be sent again with the other lower transport: resent already,
    /// or asked with the transport the session's first track settled.
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
    /// The lower transport the upstream took for the session's first track: every further
    /// track is asked with it (servers that fix it at the first SETUP answer another track
    /// with it anyway, or refuse the track and then close at a second SETUP of it).
    settled: Option<LowerTransport>,
    /// UDP tracks set up since the session began, for route labels.
    track_seq: usize,
    /// `CSeq`s of the server's requests forwarded to the client and not yet answered.
    server_requests: VecDeque<String>,
    /// The tracks the last session description (DESCRIBE reply, ANNOUNCE) offered, by
    /// upstream control URL, for media validation.
    described: Vec<(String, crate::media::StreamSpec)>,
    /// The same tracks, each with why media validation refuses it whole (`enforce`).
    refused: Vec<(String, Option<String>)>,
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
            settled: None,
            track_seq: 0,
            server_requests: VecDeque::new(),
            described: Vec::new(),
            refused: Vec::new(),
        }
    }

    /// Takes the tracks of a session description (DESCRIBE reply, ANNOUNCE; upstream
    /// control URLs) as what the session's RTP may carry.
    pub(super) fn describe(&mut self, body: &[u8]) {
        self.described = crate::signaling::media_spec::tracks(body);
        self.refused = crate::signaling::media_spec::refusals(body, &self.settings.media_policy);
    }

    /// Under `enforce`, why the SETUP of the track `url` (upstream form) is refused: none of
    /// the formats described for it may cross, so its routes would drop every packet.
    pub(super) fn media_refusal(&self, url: &str) -> Option<String> {
        self.settings
            .media_validate
            .enforces()
            .then(|| crate::signaling::media_spec::track_refusal(&self.refused, url))
            .flatten()
    }

    /// Answers a request media validation refuses: `415 Unsupported Media Type` with a
    /// `Warning` saying why, counted (`media_refused`). Not `461`: the transport is not
    /// the problem, and a client retries a `461` with another transport, which the same
    /// refusal would meet.
    pub(super) fn refuse_media(&mut self, out: &mut Vec<Output>, cseq: &str, why: &str) {
        self.settings
            .events
            .media_refused
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        static LOG: crate::logging::RateLimit = crate::logging::RateLimit::new(10_000);
        if let Some(suppressed) = LOG.check(crate::clock::now_ms()) {
            tracing::warn!(route = %self.settings.name, suppressed, "RTSP request refused with 415: media validation: {why}");
        }
        let warning = format!("399 vgate \"media validation: {why}\"");
        self.local(
            out,
            Some(cseq),
            crate::signaling::rtsp::Status::UNSUPPORTED_MEDIA_TYPE,
            &[("Warning", &warning)],
        );
    }

    /// The media rule of the RTP of the track SETUP named `url` (upstream form).
    pub(super) fn track_rule(&self, url: &str) -> Option<crate::media::Rule> {
        let spec = crate::signaling::media_spec::track_spec(&self.described, url)
            // Nothing described (a SETUP without DESCRIBE): nothing may be assumed.
            .unwrap_or(crate::media::StreamSpec::new(None));
        self.settings
            .media_validate
            .rule(spec, self.settings.media_policy)
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

    /// Whether the connection holds a media session: a track set up and not torn down.
    pub fn holds_session(&self) -> bool {
        !self.tracks.is_empty()
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
        self.settled = None;
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
}
