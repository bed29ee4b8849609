//! The protocol core of the SIP proxy: bytes and the time in, messages to send out. It owns
//! the transaction, binding and call tables; it does no I/O (the event loop in `net.rs`
//! does), so every decision can be tested without sockets (`tests/sip_golden.rs`).
//!
//! See the module doc of [`super`] for the design; this folder follows it message by message:
//! `dispatch` (a message enters), `transactions`, `requests`, `replies`, `registrations`,
//! `rewrite` (what crosses the boundary), `timers`, `calls`. This file holds the tables.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnet::Ipv4Net;

use crate::config::{
    Config, DomainId, SignalingKind, SignalingPolicy, SignalingRoute, SourcePolicy, Transport,
};
use crate::logging::RateLimit;
use crate::routes::legs::Legs;
use crate::routes::Routes;
use crate::signaling::proxy::SignalingStats;
use crate::signaling::sip::Limits;

use super::access::RateLimiter;
use super::media::CallMedia;

mod calls;
mod claim;

pub use claim::Claim;
mod dispatch;
mod registrations;
mod replica;
mod replies;
mod requests;
mod rewrite;
mod timers;
mod transactions;

/// The Request-URI / Contact parameter carrying a binding token.
pub const TOKEN_PARAM: &str = "vgt";
/// Our branches start with this, after the RFC 3261 magic cookie.
pub const BRANCH_PREFIX: &str = "z9hG4bKvg";

/// Transactions, bindings and calls are capped; past a cap new work is refused (503).
pub const MAX_TXNS: usize = 65_536;
pub const MAX_BINDINGS: usize = 65_536;
pub const MAX_CALLS: usize = 16_384;
/// Call-IDs mapped between the faces (each mapping is two entries).
pub const MAX_CALL_IDS: usize = 2 * MAX_TXNS;
/// How long a finished transaction is kept to absorb retransmissions (64 × T1).
pub const TXN_LINGER: Duration = Duration::from_secs(32);
/// How long a contact binding seen in a dialog lives after its last use.
pub const DIALOG_IDLE: Duration = Duration::from_secs(3600);
/// Longest registration honoured for a binding.
pub const MAX_REGISTRATION: Duration = Duration::from_secs(24 * 3600);

/// The two sides of a proxy: the listen side and the upstream side, each in its own domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Face {
    Listen,
    Upstream,
}

impl Face {
    pub const BOTH: [Face; 2] = [Face::Listen, Face::Upstream];

    pub fn other(self) -> Face {
        match self {
            Face::Listen => Face::Upstream,
            Face::Upstream => Face::Listen,
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// Where a message came from or goes to: an address, and the TCP connection when there is one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Peer {
    pub addr: SocketAddrV4,
    pub conn: Option<u64>,
}

impl Peer {
    pub fn udp(addr: SocketAddrV4) -> Peer {
        Peer { addr, conn: None }
    }
}

/// A message to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Out {
    pub face: Face,
    pub to: Peer,
    pub bytes: Vec<u8>,
}

/// What the core counted; read by tests and logged at shutdown.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub requests: u64,
    pub responses: u64,
    pub forwarded_requests: u64,
    pub forwarded_responses: u64,
    pub retransmissions: u64,
    pub answered_errors: u64,
    pub forbidden: u64,
    pub rate_limited: u64,
    pub dropped_malformed: u64,
    pub dropped_keepalive: u64,
    pub dropped_stray_responses: u64,
    pub dropped_bad_sdp_responses: u64,
    pub tcp_media_refused: u64,
    /// SDPs refused (`488`) by media validation (`enforce`): an `m=` line negotiates no
    /// format the policy lets cross.
    pub media_refused: u64,
    pub no_ports: u64,
    pub table_full: u64,
    pub invite_timeouts: u64,
    pub media_timeouts: u64,
    pub calls_started: u64,
    pub calls_ended: u64,
    /// TCP streams that could not be framed any more (answered when possible, closed).
    pub tcp_unframeable: u64,
    /// Messages over `max_message` (UDP) or `max_tcp_message` (TCP; a stream declaring one
    /// is also unframeable).
    pub too_large: u64,
    /// TCP connections refused: over `max_connections_per_source` or the global cap.
    pub tcp_connections_refused: u64,
    /// Outgoing TCP connections refused, failed or not made within the connect timeout.
    pub tcp_connect_failures: u64,
    /// TCP connections vgate closed because the one mirroring them on the other side ended
    /// (a device's connection dropped: the platform's is closed too, and the reverse).
    pub tcp_closes_mirrored: u64,
    /// Contacts refused because their source already holds `max_bindings_per_source`.
    pub bindings_refused: u64,
    /// Requests on the upstream face routed by Request-URI user to a registered device.
    pub routed_by_user: u64,
    /// New requests on the upstream face (no binding token, no dialog of this route) from
    /// a source that may not start requests there: neither the route's upstream nor a peer
    /// a route listening on that socket accepts (403; an ACK is dropped).
    pub upstream_forbidden: u64,
    /// MANSCDP requests refused by the route's command policy (403).
    pub manscdp_refused: u64,
    /// MANSCDP bodies whose address fields were rewritten or blanked.
    pub manscdp_rewritten: u64,
    /// `OPTIONS` probes for vgate itself (Request-URI = the face's address, no user)
    /// answered `200` here.
    pub options_answered: u64,
}

impl Counters {
    /// Every counter by name, for the metrics.
    pub fn list(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("requests", self.requests),
            ("responses", self.responses),
            ("forwarded_requests", self.forwarded_requests),
            ("forwarded_responses", self.forwarded_responses),
            ("retransmissions", self.retransmissions),
            ("answered_errors", self.answered_errors),
            ("forbidden", self.forbidden),
            ("options_answered", self.options_answered),
            ("rate_limited", self.rate_limited),
            ("dropped_malformed", self.dropped_malformed),
            ("dropped_keepalive", self.dropped_keepalive),
            ("dropped_stray_responses", self.dropped_stray_responses),
            ("dropped_bad_sdp_responses", self.dropped_bad_sdp_responses),
            ("tcp_media_refused", self.tcp_media_refused),
            ("media_refused", self.media_refused),
            ("no_ports", self.no_ports),
            ("table_full", self.table_full),
            ("invite_timeouts", self.invite_timeouts),
            ("media_timeouts", self.media_timeouts),
            ("calls_started", self.calls_started),
            ("calls_ended", self.calls_ended),
            ("tcp_unframeable", self.tcp_unframeable),
            ("too_large", self.too_large),
            ("tcp_connections_refused", self.tcp_connections_refused),
            ("tcp_connect_failures", self.tcp_connect_failures),
            ("tcp_closes_mirrored", self.tcp_closes_mirrored),
            ("bindings_refused", self.bindings_refused),
            ("routed_by_user", self.routed_by_user),
            ("upstream_forbidden", self.upstream_forbidden),
            ("manscdp_refused", self.manscdp_refused),
            ("manscdp_rewritten", self.manscdp_rewritten),
        ]
    }
}

/// A received request identified the way its sender retransmits it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct InKey {
    face: Face,
    src: SocketAddrV4,
    branch: Vec<u8>,
    method: Vec<u8>,
}

/// A request we forwarded (or sent ourselves, `internal`).
struct Txn {
    in_key: Option<InKey>,
    from_face: Face,
    src: Peer,
    /// The Via fields as received: (name as written, value unfolded).
    vias: Vec<(Vec<u8>, Vec<u8>)>,
    from_value: Vec<u8>,
    to_value: Vec<u8>,
    call_id: Vec<u8>,
    method: Vec<u8>,
    cseq: u32,
    dest: Peer,
    forwarded: Vec<u8>,
    last_response: Option<Vec<u8>>,
    final_code: Option<u16>,
    created: Instant,
    expires: Instant,
    internal: bool,
    initial_invite: bool,
    /// Bindings a REGISTER's 2xx confirms.
    registers: Vec<String>,
}

/// A Contact seen on one face, now shown on the other as the gateway with a token.
struct Binding {
    face: Face,
    uri: Vec<u8>,
    peer: Peer,
    expires: Instant,
    /// A REGISTER's contact before the registrar's 2xx: shown (the REGISTER carries its
    /// token) but routes nothing, and lives only as long as the transaction.
    pending: bool,
    /// Where the message that created it came from (for the per-source cap).
    source: Ipv4Addr,
    /// The lifetime the REGISTER asked for, granted on its 2xx.
    asked: Duration,
    /// Registered contacts are also found by their user (the GB device ID), for platforms
    /// that address a device at the address it registered from.
    user: Option<Vec<u8>>,
}

/// Why a contact got no binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BindRefused {
    Malformed,
    TableFull,
    SourceCap,
}

/// An INVITE dialog and its media.
struct Call {
    media: CallMedia,
    /// Binding token of each face's party (by [`Face::index`]).
    contact: [Option<String>; 2],
    /// (From, To) a request sent to that face in this dialog carries.
    view: [Option<(Vec<u8>, Vec<u8>)>; 2],
    /// Highest CSeq of requests delivered to each face.
    cseq_to: [u32; 2],
    confirmed_ms: Option<u64>,
    ended: Option<Instant>,
    created: Instant,
    last_activity: Instant,
}

/// Call-IDs seen on one face → (the Call-ID on the other face, expiry).
type CallIds = HashMap<Vec<u8>, (Vec<u8>, Instant)>;

/// Where a request goes: the peer, and the new Request-URI if it changes.
type Target = (Peer, Option<Vec<u8>>);

static LOG_FORBIDDEN: RateLimit = RateLimit::new(10_000);
static LOG_REFUSED_MEDIA: RateLimit = RateLimit::new(10_000);
static LOG_BAD_RESPONSE_SDP: RateLimit = RateLimit::new(10_000);
static LOG_UNFRAMEABLE: RateLimit = RateLimit::new(10_000);
static LOG_BINDINGS: RateLimit = RateLimit::new(10_000);

/// The SIP proxy core of one signaling route.
pub struct Core {
    /// Requests by method, responses by class and the counters below, for the metrics.
    pub stats: Arc<SignalingStats>,
    name: String,
    tcp: bool,
    limits: Limits,
    policy: SignalingPolicy,
    source_policy: SourcePolicy,
    rtp_only: bool,
    /// Media validation of the calls' RTP (`signaling_route.media_validate`, `[media]`).
    media_validate: crate::config::MediaMode,
    media_policy: crate::media::Policy,
    /// `engine.max_payload`, for the TCP media legs.
    max_payload: usize,
    /// The split appliance's link face (`[split]`): media toward it is always UDP.
    link_face: Option<DomainId>,
    routes: Arc<Routes>,
    /// Where the calls' TCP media legs start (`None`: no legs, as in pure tests).
    legs: Option<Arc<dyn Legs>>,
    /// Domain of each face.
    domain: [DomainId; 2],
    /// The gateway's SIP address on each face (what Via, Contact and Record-Route show).
    local: [SocketAddrV4; 2],
    upstream: SocketAddrV4,
    /// The `allow_peers` of each route listening on this route's upstream socket (a
    /// socket shared within a group): their peers may start requests on the upstream face
    /// too (an empty list: any address of that domain). Empty: only `upstream` may.
    upstream_starters: Vec<Vec<Ipv4Net>>,
    salt: String,
    /// Key of the identifiers (tokens, branches, tags): `None` only in tests, which want
    /// them readable (`salt` + counter).
    secret: Option<[u8; 32]>,
    seq: u64,
    txns: HashMap<String, Txn>,
    by_in: HashMap<InKey, String>,
    bindings: HashMap<String, Binding>,
    binding_index: HashMap<(Face, Vec<u8>, SocketAddrV4), String>,
    /// Call-IDs on both faces: `cids[f][Call-ID on f]` = (the Call-ID on the other face,
    /// expiry). The tables below key calls by the Call-ID on the listen face.
    cids: [CallIds; 2],
    /// Registered (2xx) contacts by face and user.
    by_user: HashMap<(Face, Vec<u8>), String>,
    /// Bindings held by each source address (capped by `max_bindings_per_source`).
    per_source: HashMap<Ipv4Addr, usize>,
    calls: HashMap<Vec<u8>, Call>,
    limiter: RateLimiter,
    pub counters: Counters,
    /// Message traces (`trace = true` on the route).
    pub trace: Option<crate::signaling::proxy::trace::Tracer>,
    last_sweep: Option<Instant>,
    /// Hot standby: what was copied from the active, when this core last published.
    replica: replica::ReplicaState,
}

impl Core {
    /// `local`: the gateway address and port of each face's socket, Listen first.
    pub fn new(
        route: &SignalingRoute,
        config: &Config,
        routes: Arc<Routes>,
        local: [SocketAddrV4; 2],
        salt: &str,
    ) -> Core {
        let policy = route.policy.clone();
        Core {
            stats: Arc::new(SignalingStats::new(SignalingKind::Sip)),
            name: route.name.clone(),
            tcp: route.transport == Transport::Tcp,
            limits: Limits {
                // A TCP route frames messages far larger than a datagram (a cascade's
                // one-MESSAGE Catalog); a UDP route is bounded by the datagram.
                max_message: if route.transport == Transport::Tcp {
                    policy.max_tcp_message
                } else {
                    policy.max_message
                },
                ..Limits::default()
            },
            source_policy: config.security.source_validation,
            rtp_only: config.security.rtp_only,
            media_validate: route.media_validate,
            media_policy: config.media.policy,
            max_payload: config.leg_max_payload(),
            link_face: config.split.as_ref().map(|s| s.link_face()),
            routes,
            legs: None,
            domain: [route.listen_domain, route.listen_domain.other()],
            local,
            upstream: route.upstream,
            upstream_starters: Vec::new(),
            salt: salt.chars().filter(|c| c.is_ascii_alphanumeric()).collect(),
            secret: None,
            seq: 0,
            txns: HashMap::new(),
            by_in: HashMap::new(),
            bindings: HashMap::new(),
            binding_index: HashMap::new(),
            cids: [HashMap::new(), HashMap::new()],
            by_user: HashMap::new(),
            per_source: HashMap::new(),
            calls: HashMap::new(),
            limiter: RateLimiter::new(policy.rate_limit),
            counters: Counters::default(),
            trace: route
                .trace
                .then(|| crate::signaling::proxy::trace::Tracer::new(&route.name, "sip")),
            last_sweep: None,
            replica: Default::default(),
            policy,
        }
    }

    /// Call-IDs mapped between the faces (each mapping once), for tests.
    pub fn call_ids_mapped(&self) -> usize {
        self.cids[Face::Listen.index()].len()
    }

    /// Live calls, transactions and bindings (for tests and the shutdown log).
    pub fn table_sizes(&self) -> (usize, usize, usize) {
        (self.calls.len(), self.txns.len(), self.bindings.len())
    }

    /// Makes every identifier this core hands out (binding tokens, branches, tags)
    /// unguessable: SHA-256 of `secret` and a counter, so one token tells nothing about the
    /// next. Without it (tests) they are `salt` and the counter.
    pub fn with_secret(mut self, secret: [u8; 32]) -> Core {
        self.secret = Some(secret);
        self
    }

    /// Lets the peers of the routes listening on this route's upstream socket start
    /// requests on the upstream face: `allow` holds each such route's `allow_peers` (see
    /// [`Core::may_start_upstream`]).
    pub fn with_upstream_starters(mut self, allow: Vec<Vec<Ipv4Net>>) -> Core {
        self.upstream_starters = allow;
        self
    }

    /// Whether `ip` may start a request on the upstream face (one that carries no binding
    /// token of this route and belongs to none of its dialogs): the route's upstream
    /// itself, or a peer that a route listening on the same socket accepts. Anyone else of
    /// the upstream domain may only continue what a token or a dialog maps.
    pub fn may_start_upstream(&self, ip: Ipv4Addr) -> bool {
        if ip == *self.upstream.ip() {
            return true;
        }
        let in_domain = self.routes.domain(self.dom(Face::Upstream)).contains(ip);
        self.upstream_starters
            .iter()
            .any(|allow| super::access::peer_allowed(allow, in_domain, ip))
    }

    /// The calls start their TCP media legs with `legs`.
    pub fn with_legs(mut self, legs: Arc<dyn Legs>) -> Core {
        self.legs = Some(legs);
        self
    }

    fn next_id(&mut self) -> String {
        use sha2::Digest as _;
        self.seq += 1;
        match &self.secret {
            None => format!("{}{:x}", self.salt, self.seq),
            Some(key) => {
                let mut h = sha2::Sha256::new();
                h.update(key);
                h.update(self.seq.to_le_bytes());
                let d = h.finalize();
                d.iter()
                    .take(12)
                    .fold(String::with_capacity(24), |mut s, b| {
                        let _ = std::fmt::Write::write_fmt(&mut s, format_args!("{b:02x}"));
                        s
                    })
            }
        }
    }

    fn transport_name(&self) -> &'static str {
        if self.tcp {
            "TCP"
        } else {
            "UDP"
        }
    }

    fn dom(&self, face: Face) -> DomainId {
        self.domain[face.index()]
    }

    fn gw_ip(&self, face: Face) -> Ipv4Addr {
        *self.local[face.index()].ip()
    }
}
