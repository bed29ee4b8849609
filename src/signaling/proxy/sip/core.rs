//! The protocol core of the SIP proxy: bytes and the time in, messages to send out. It owns
//! the transaction, binding and call tables; it does no I/O (the event loop in `net.rs`
//! does), so every decision can be tested without sockets (`tests/sip_golden.rs`).
//!
//! See the module doc of [`super`] for the design; this file follows it message by message.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::clock::now_ms;
use crate::config::{
    Config, DomainId, SignalingKind, SignalingPolicy, SignalingRoute, SourcePolicy, Transport,
};
use crate::logging::RateLimit;
use crate::routes::legs::Legs;
use crate::routes::Routes;
use crate::signaling::manscdp;
use crate::signaling::proxy::stats::Registration;
use crate::signaling::proxy::SignalingStats;
use crate::signaling::sip::{
    build_response, triage_datagram, triage_framed, CSeq, Editor, Head, Host, Limits, NameAddr,
    ParseFailure, SipError, SipMessage, Uri, Verdict,
};

use super::access::{parties_allowed, peer_allowed, RateLimiter};
use super::media::{CallMedia, MediaError};

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
    pub no_ports: u64,
    pub table_full: u64,
    pub invite_timeouts: u64,
    pub media_timeouts: u64,
    pub calls_started: u64,
    pub calls_ended: u64,
    /// TCP streams that could not be framed any more (answered when possible, closed).
    pub tcp_unframeable: u64,
    /// Messages over `max_message` (a TCP stream declaring one is also unframeable).
    pub too_large: u64,
    /// TCP connections refused: over `max_connections_per_source` or the global cap.
    pub tcp_connections_refused: u64,
    /// Outgoing TCP connections refused, failed or not made within the connect timeout.
    pub tcp_connect_failures: u64,
    /// Contacts refused because their source already holds `max_bindings_per_source`.
    pub bindings_refused: u64,
    /// Requests on the upstream face routed by Request-URI user to a registered device.
    pub routed_by_user: u64,
    /// MANSCDP requests refused by the route's command policy (403).
    pub manscdp_refused: u64,
    /// MANSCDP bodies whose address fields were rewritten or blanked.
    pub manscdp_rewritten: u64,
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
            ("rate_limited", self.rate_limited),
            ("dropped_malformed", self.dropped_malformed),
            ("dropped_keepalive", self.dropped_keepalive),
            ("dropped_stray_responses", self.dropped_stray_responses),
            ("dropped_bad_sdp_responses", self.dropped_bad_sdp_responses),
            ("tcp_media_refused", self.tcp_media_refused),
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
            ("bindings_refused", self.bindings_refused),
            ("routed_by_user", self.routed_by_user),
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

/// A header value on one line: each CRLF and the whitespace after it become one space.
fn unfold(v: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len());
    let mut folding = false;
    for &b in v {
        match b {
            b'\r' | b'\n' => folding = true,
            b' ' | b'\t' if folding => {}
            _ => {
                if folding {
                    out.push(b' ');
                    folding = false;
                }
                out.push(b);
            }
        }
    }
    out
}

/// Where `inner` (a subslice) starts in `outer`.
fn offset_in(outer: &[u8], inner: &[u8]) -> Option<usize> {
    let o = outer.as_ptr() as usize;
    let i = inner.as_ptr() as usize;
    (i >= o && i + inner.len() <= o + outer.len()).then(|| i - o)
}

/// Replaces `host[:port]` of the SIP URI `uri` (a subslice of `value`) with `hostport`.
fn replace_hostport(value: &[u8], uri: &Uri<'_>, hostport: &str) -> Option<Vec<u8>> {
    let start = offset_in(value, uri.host_text)?;
    let mut end = start + uri.host_text.len();
    if uri.port.is_some() {
        let digits = value
            .get(end + 1..)?
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        end += 1 + digits;
    }
    let mut out = Vec::with_capacity(value.len() + 16);
    out.extend_from_slice(value.get(..start)?);
    out.extend_from_slice(hostport.as_bytes());
    out.extend_from_slice(value.get(end..)?);
    Some(out)
}

fn token_of(uri: &Uri<'_>) -> Option<String> {
    uri.param(TOKEN_PARAM)
        .flatten()
        .and_then(|t| std::str::from_utf8(t).ok())
        .map(str::to_owned)
}

fn is_sdp(head: &Head<'_>) -> bool {
    head.header("Content-Type").is_some_and(|h| {
        let v = h.value();
        let t = v.split(|&b| b == b';').next().unwrap_or_default();
        String::from_utf8_lossy(t)
            .trim()
            .eq_ignore_ascii_case("application/sdp")
    })
}

/// A multipart body that contains SDP: vgate cannot rewrite inside it.
fn hides_sdp(head: &Head<'_>, body: &[u8]) -> bool {
    head.header("Content-Type").is_some_and(|h| {
        String::from_utf8_lossy(h.value())
            .trim_start()
            .to_ascii_lowercase()
            .starts_with("multipart/")
    }) && String::from_utf8_lossy(body)
        .to_ascii_lowercase()
        .contains("application/sdp")
}

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
                max_message: policy.max_message,
                ..Limits::default()
            },
            source_policy: config.security.source_validation,
            rtp_only: config.security.rtp_only,
            max_payload: config.leg_max_payload(),
            link_face: config.split.as_ref().map(|s| s.link_face()),
            routes,
            legs: None,
            domain: [route.listen_domain, route.listen_domain.other()],
            local,
            upstream: route.upstream,
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
            policy,
        }
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

    /// Handles one received message (a datagram, or one framed TCP message).
    pub fn on_message(&mut self, face: Face, src: Peer, buf: &[u8], now: Instant) -> Vec<Out> {
        let mut out = Vec::new();
        let is_request =
            !buf.starts_with(b"SIP/") && !buf.iter().all(|b| matches!(b, b'\r' | b'\n'));
        let in_domain = self.routes.domain(self.dom(face)).contains(*src.addr.ip());
        let allowed = match face {
            Face::Listen => peer_allowed(&self.policy.allow_peers, in_domain, *src.addr.ip()),
            Face::Upstream => in_domain,
        };
        if is_request && !self.limiter.allow(*src.addr.ip(), now) {
            self.counters.rate_limited += 1;
            return out;
        }
        let verdict = if self.tcp {
            triage_framed(buf, &self.limits)
        } else {
            triage_datagram(buf, &self.limits)
        };
        match verdict {
            Verdict::Drop(crate::signaling::sip::Dropped::KeepAlive) => {
                self.counters.dropped_keepalive += 1;
            }
            Verdict::Drop(why) => {
                self.counters.dropped_malformed += 1;
                if let crate::signaling::sip::Dropped::Unparsable(SipError::TooLarge { .. }) = why {
                    self.counters.too_large += 1;
                }
            }
            Verdict::Answer { head, reject } => {
                if !allowed {
                    self.forbid(face, src, &head, "source address not allowed", &mut out);
                    return out;
                }
                self.counters.answered_errors += 1;
                let tag = self.next_id();
                if let Ok(bytes) = reject.response(&head, &tag) {
                    out.push(Out {
                        face,
                        to: src,
                        bytes,
                    });
                }
            }
            Verdict::Forward(msg) => {
                match (msg.head().method(), msg.head().status()) {
                    (Some(m), _) => self.stats.request(m),
                    (None, Some(code)) => self.stats.response(code),
                    _ => {}
                }
                if msg.head().is_request() {
                    self.counters.requests += 1;
                    if !allowed {
                        self.forbid(
                            face,
                            src,
                            msg.head(),
                            "source address not allowed",
                            &mut out,
                        );
                    } else if !parties_allowed(&self.policy.allow_ids, msg.head()) {
                        self.forbid(face, src, msg.head(), "GB/T 28181 ID not allowed", &mut out);
                    } else {
                        self.request(face, src, &msg, now, &mut out);
                    }
                } else {
                    self.counters.responses += 1;
                    if allowed {
                        self.response(face, src, &msg, now, &mut out);
                    } else {
                        self.counters.forbidden += 1;
                    }
                }
            }
        }
        out
    }

    /// A TCP stream that cannot be framed any more (`err` from [`frame`], `bytes` what was
    /// buffered, the offending message first): counted, logged (rate-limited), and
    /// answered when its head is a readable request from an allowed peer — `513 Message
    /// Too Large` for a message over `max_message`, `400` for a missing or double
    /// Content-Length — with a Warning naming the problem. The caller then closes the
    /// connection: nothing after this point of the stream can be trusted.
    ///
    /// [`frame`]: crate::signaling::sip::frame
    pub fn on_stream_error(
        &mut self,
        face: Face,
        src: Peer,
        bytes: &[u8],
        err: &SipError,
        _now: Instant,
    ) -> Vec<Out> {
        let mut out = Vec::new();
        self.counters.tcp_unframeable += 1;
        if matches!(
            err,
            SipError::TooLarge { .. }
                | SipError::TooManyHeaders { .. }
                | SipError::LineTooLong { .. }
        ) {
            self.counters.too_large += 1;
        }
        if let Some(suppressed) = LOG_UNFRAMEABLE.check(now_ms()) {
            tracing::warn!(route = %self.name, peer = %src.addr, suppressed, "SIP/TCP stream refused and closed: {err}");
        }
        let in_domain = self.routes.domain(self.dom(face)).contains(*src.addr.ip());
        let allowed = match face {
            Face::Listen => peer_allowed(&self.policy.allow_peers, in_domain, *src.addr.ip()),
            Face::Upstream => in_domain,
        };
        // The header section alone, when it ends within the limit: enough to answer.
        let skip = bytes
            .iter()
            .take_while(|b| matches!(b, b'\r' | b'\n'))
            .count();
        let rest = bytes.get(skip..).unwrap_or_default();
        let window = rest.get(..self.limits.max_message).unwrap_or(rest);
        let Some(end) = window.windows(4).position(|w| w == b"\r\n\r\n") else {
            return out;
        };
        let head_bytes = rest.get(..end + 4).unwrap_or_default();
        let head = match SipMessage::parse_datagram(head_bytes, &self.limits) {
            Ok(m) => m.head().clone(),
            Err(ParseFailure { head: Some(h), .. }) => *h,
            Err(_) => return out,
        };
        if !allowed || !head.is_request() || head.method() == Some(b"ACK") {
            return out;
        }
        self.counters.answered_errors += 1;
        let tag = self.next_id();
        let warning = format!("399 vgate \"{err}\"");
        if let Ok(bytes) = build_response(
            &head,
            err.status(),
            err.phrase(),
            &tag,
            &[("Warning", &warning)],
        ) {
            out.push(Out {
                face,
                to: src,
                bytes,
            });
        }
        out
    }

    fn forbid(&mut self, face: Face, src: Peer, head: &Head<'_>, why: &str, out: &mut Vec<Out>) {
        self.counters.forbidden += 1;
        if let Some(suppressed) = LOG_FORBIDDEN.check(now_ms()) {
            tracing::warn!(route = %self.name, peer = %src.addr, suppressed, "SIP request refused with 403: {why}");
        }
        if head.method() == Some(b"ACK") {
            return;
        }
        let tag = self.next_id();
        let warning = format!("399 vgate \"{why}\"");
        if let Ok(bytes) = build_response(head, 403, "Forbidden", &tag, &[("Warning", &warning)]) {
            out.push(Out {
                face,
                to: src,
                bytes,
            });
        }
    }

    fn answer(
        &mut self,
        (face, src): (Face, Peer),
        head: &Head<'_>,
        code: u16,
        reason: &str,
        extra: &[(&str, &str)],
        out: &mut Vec<Out>,
    ) -> Option<Vec<u8>> {
        if head.method() == Some(b"ACK") {
            return None;
        }
        if code >= 300 {
            self.counters.answered_errors += 1;
        }
        let tag = self.next_id();
        let bytes = build_response(head, code, reason, &tag, extra).ok()?;
        out.push(Out {
            face,
            to: src,
            bytes: bytes.clone(),
        });
        Some(bytes)
    }

    /// `503` with `Retry-After`: a table is full.
    fn busy(&mut self, to: (Face, Peer), head: &Head<'_>, out: &mut Vec<Out>) {
        self.answer(
            to,
            head,
            503,
            "Service Unavailable",
            &[("Retry-After", "5")],
            out,
        );
    }

    fn in_key(face: Face, src: Peer, head: &Head<'_>, method: &[u8]) -> InKey {
        let branch = match head.top_via().ok().and_then(|v| v.branch()) {
            Some(b) if b.starts_with(b"z9hG4bK") => b.to_vec(),
            // RFC 2543 peers: no usable branch; Call-ID, CSeq and From tag identify it.
            _ => {
                let mut k = head.call_id().unwrap_or_default().to_vec();
                k.push(b' ');
                k.extend_from_slice(&head.cseq().map(|c| c.seq).unwrap_or(0).to_be_bytes());
                if let Some(t) = head.from().ok().and_then(|f| f.tag()) {
                    k.extend_from_slice(t);
                }
                k
            }
        };
        InKey {
            face,
            src: src.addr,
            branch,
            method: method.to_vec(),
        }
    }

    fn request(
        &mut self,
        face: Face,
        src: Peer,
        msg: &SipMessage<'_>,
        now: Instant,
        out: &mut Vec<Out>,
    ) {
        let head = msg.head();
        let method = head.method().unwrap_or_default().to_vec();
        let key = Self::in_key(face, src, head, &method);
        if let Some(branch) = self.by_in.get(&key).cloned() {
            self.retransmission(&branch, out);
            return;
        }
        match method.as_slice() {
            b"CANCEL" => self.cancel(face, src, head, now, out),
            b"ACK" => {
                // The ACK of a non-2xx final response shares the INVITE's branch: that
                // transaction already acknowledged the response downstream; absorb it.
                let mut inv = key.clone();
                inv.method = b"INVITE".to_vec();
                let absorbed = self
                    .by_in
                    .get(&inv)
                    .and_then(|b| self.txns.get(b))
                    .is_some_and(|t| t.final_code.is_some_and(|c| c >= 300));
                if absorbed {
                    self.counters.retransmissions += 1;
                    return;
                }
                self.forward_request(face, src, msg, key, now, out);
            }
            _ => self.forward_request(face, src, msg, key, now, out),
        }
    }

    fn retransmission(&mut self, branch: &str, out: &mut Vec<Out>) {
        self.counters.retransmissions += 1;
        let Some(t) = self.txns.get(branch) else {
            return;
        };
        if let Some(r) = &t.last_response {
            out.push(Out {
                face: t.from_face,
                to: t.src,
                bytes: r.clone(),
            });
        }
        // No final answer yet: the retransmission is also ours to make downstream
        // (UDP only; TCP is reliable). Same bytes, same branch, same SDP.
        if t.final_code.is_none() && !self.tcp {
            out.push(Out {
                face: t.from_face.other(),
                to: t.dest,
                bytes: t.forwarded.clone(),
            });
        }
    }

    /// Finds where a request goes: a binding token, the dialog, or the upstream.
    /// `call_id`: the request's Call-ID on the listen face (the key of the call table).
    fn target(
        &mut self,
        face: Face,
        head: &Head<'_>,
        call_id: &[u8],
        now: Instant,
    ) -> Result<Target, (u16, &'static str)> {
        let ruri = head.request_uri().unwrap_or_default();
        let uri = Uri::parse(ruri).map_err(|_| (400u16, "Bad Request - Malformed Request-URI"))?;
        if let Some(tok) = token_of(&uri) {
            let b = self
                .bindings
                .get_mut(&tok)
                .filter(|b| b.face == face.other() && !b.pending)
                .ok_or((404u16, "Not Found"))?;
            b.expires = b.expires.max(now + DIALOG_IDLE);
            return Ok((b.peer, Some(b.uri.clone())));
        }
        let in_dialog = head.to().ok().and_then(|t| t.tag()).is_some();
        if in_dialog {
            if let Some(tok) = self
                .calls
                .get(call_id)
                .and_then(|c| c.contact[face.other().index()].clone())
            {
                if let Some(b) = self.bindings.get(&tok) {
                    return Ok((b.peer, Some(b.uri.clone())));
                }
            }
        }
        match face {
            Face::Listen => {
                let new_uri = match uri.host {
                    Host::V4(ip) if self.routes.domain(self.dom(face)).contains(ip) => {
                        replace_hostport(ruri, &uri, &self.upstream.to_string())
                    }
                    _ => None,
                };
                Ok((Peer::udp(self.upstream), new_uri))
            }
            Face::Upstream => {
                // A platform addressing a device at the address it registered from (our
                // upstream face) or by its domain: the device's registration.
                let ours = match uri.host {
                    Host::V4(ip) => ip == self.gw_ip(face),
                    Host::Name(_) => true,
                    _ => false,
                };
                let user = uri.user.filter(|_| ours).ok_or((404u16, "Not Found"))?;
                let b = self
                    .by_user
                    .get(&(face.other(), user.to_vec()))
                    .and_then(|tok| self.bindings.get(tok))
                    .filter(|b| !b.pending && b.expires > now)
                    .ok_or((404u16, "Not Found"))?;
                self.counters.routed_by_user += 1;
                Ok((b.peer, Some(b.uri.clone())))
            }
        }
    }

    /// From/To: a host that is an IP address of the sending domain becomes the gateway's
    /// address on the receiving face.
    fn rewrite_party(&self, value: &[u8], from: Face) -> Option<Vec<u8>> {
        let na = NameAddr::parse(value).ok()?;
        let uri = na.sip_uri().ok()?;
        match uri.host {
            Host::V4(ip) if self.routes.domain(self.dom(from)).contains(ip) => {
                replace_hostport(value, &uri, &self.gw_ip(from.other()).to_string())
            }
            _ => None,
        }
    }

    /// The devices registered through this route, read from the binding table (whose
    /// lifecycle this does not touch), soonest expiry last.
    pub fn registrations(&self, now: Instant) -> Vec<Registration> {
        let mut v: Vec<Registration> = self
            .bindings
            .iter()
            // A registered contact: a REGISTER's (it has its user) that the registrar's 2xx
            // confirmed (no longer pending), not yet expired.
            .filter(|(_, b)| b.user.is_some() && !b.pending && b.expires > now)
            .map(|(tok, b)| {
                let contact = String::from_utf8_lossy(&b.uri).into_owned();
                let id = b
                    .user
                    .as_deref()
                    .map(|u| String::from_utf8_lossy(u).into_owned())
                    .unwrap_or_default();
                Registration {
                    id,
                    domain: self.dom(b.face),
                    contact,
                    peer: b.peer.addr,
                    token: tok.clone(),
                    expires_in: b.expires.saturating_duration_since(now),
                }
            })
            .collect();
        v.sort_by(|a, b| b.expires_in.cmp(&a.expires_in).then(a.id.cmp(&b.id)));
        v
    }

    /// A binding for `uri` seen on `face` from `peer`; reused when the same contact is seen
    /// again (retransmissions and refreshes get the same token).
    /// `register`: the contact of a REGISTER, which only becomes usable when the
    /// registrar answers 2xx ([`Core::confirm_registration`]). Each source address holds
    /// at most `max_bindings_per_source` bindings.
    fn bind(
        &mut self,
        face: Face,
        uri: &[u8],
        (peer, src): (Peer, Ipv4Addr),
        lifetime: Duration,
        register: bool,
        now: Instant,
    ) -> Result<String, BindRefused> {
        let key = (face, uri.to_vec(), peer.addr);
        if let Some(tok) = self.binding_index.get(&key).cloned() {
            if let Some(b) = self.bindings.get_mut(&tok) {
                if register {
                    // A refresh waits for its 2xx too; a live registration stays live.
                    b.asked = lifetime;
                    b.expires = b.expires.max(now + TXN_LINGER);
                } else {
                    b.expires = b.expires.max(now + lifetime);
                }
                b.peer = peer;
                return Ok(tok);
            }
        }
        if self.bindings.len() >= MAX_BINDINGS {
            self.sweep(now);
            if self.bindings.len() >= MAX_BINDINGS {
                self.counters.table_full += 1;
                return Err(BindRefused::TableFull);
            }
        }
        let held = self.per_source.get(&src).copied().unwrap_or(0);
        if held >= self.policy.max_bindings_per_source {
            self.sweep(now);
            if self.per_source.get(&src).copied().unwrap_or(0)
                >= self.policy.max_bindings_per_source
            {
                self.counters.bindings_refused += 1;
                if let Some(suppressed) = LOG_BINDINGS.check(now_ms()) {
                    tracing::warn!(route = %self.name, peer = %src, suppressed, limit = self.policy.max_bindings_per_source, "contact refused: this source holds the most bindings allowed (max_bindings_per_source)");
                }
                return Err(BindRefused::SourceCap);
            }
        }
        let tok = self.next_id();
        let user = Uri::parse(uri)
            .ok()
            .and_then(|u| u.user.map(<[u8]>::to_vec));
        self.bindings.insert(
            tok.clone(),
            Binding {
                face,
                uri: uri.to_vec(),
                peer,
                expires: now + if register { TXN_LINGER } else { lifetime },
                pending: register,
                asked: lifetime,
                user: user.filter(|_| register),
                source: src,
            },
        );
        *self.per_source.entry(src).or_insert(0) += 1;
        self.binding_index.insert(key, tok.clone());
        Ok(tok)
    }

    /// The registrar accepted a REGISTER: its contacts become routable for the lifetime
    /// asked (0: the contact is removed), and findable by user.
    fn confirm_registration(&mut self, tokens: &[String], now: Instant) {
        for tok in tokens {
            let Some(b) = self.bindings.get_mut(tok) else {
                continue;
            };
            if b.asked <= TXN_LINGER {
                // Expires: 0 (plus the linger we add): unregistered.
                b.expires = now;
                continue;
            }
            b.pending = false;
            b.expires = now + b.asked;
            if let Some(u) = b.user.clone() {
                self.by_user.insert((b.face, u), tok.clone());
            }
        }
    }

    /// Rewrites every Contact of a message going from `from` to the other face. Returns the
    /// new header value (None: nothing to change) and the token of the first contact.
    fn contacts(
        &mut self,
        head: &Head<'_>,
        from: Face,
        src: Peer,
        default_lifetime: Duration,
        now: Instant,
    ) -> Result<(Option<Vec<u8>>, Vec<String>), BindRefused> {
        let values: Vec<&[u8]> = head.values("Contact").collect();
        if values.is_empty() {
            return Ok((None, Vec::new()));
        }
        let register = head.method() == Some(b"REGISTER");
        let header_expires = head
            .header("Expires")
            .and_then(|h| std::str::from_utf8(h.value()).ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let to = from.other();
        let mut new = Vec::new();
        let mut tokens = Vec::new();
        for v in values {
            if v == b"*" {
                new.push(b"*".to_vec());
                continue;
            }
            let na = NameAddr::parse(v).map_err(|_| BindRefused::Malformed)?;
            let uri = match na.sip_uri() {
                Ok(u) => u,
                Err(_) => {
                    // Not a SIP URI (tel:, mailto:...): no address of ours to hide or map.
                    new.push(v.to_vec());
                    continue;
                }
            };
            let mut item = Vec::new();
            if let Some(d) = na.display_name {
                item.extend_from_slice(d);
                item.push(b' ');
            }
            if let Some(tok) =
                token_of(&uri).filter(|t| self.bindings.get(t).is_some_and(|b| b.face == to))
            {
                // One of ours going home: the original contact again.
                let orig = self
                    .bindings
                    .get(&tok)
                    .map(|b| b.uri.clone())
                    .unwrap_or_default();
                item.push(b'<');
                item.extend_from_slice(&orig);
                item.push(b'>');
            } else {
                let secs = na
                    .expires()
                    .map(u64::from)
                    .or(header_expires)
                    .map(|s| Duration::from_secs(s).min(MAX_REGISTRATION) + TXN_LINGER)
                    .unwrap_or(default_lifetime);
                let reach = match (src.conn, uri.host, uri.port) {
                    (Some(_), Host::V4(ip), port) => Peer {
                        addr: SocketAddrV4::new(ip, port.unwrap_or(5060)),
                        conn: src.conn,
                    },
                    _ => src,
                };
                let tok = self.bind(from, na.uri, (reach, *src.addr.ip()), secs, register, now)?;
                tokens.push(tok.clone());
                item.extend_from_slice(b"<sip:");
                if let Some(user) = uri.user {
                    item.extend_from_slice(user);
                    item.push(b'@');
                }
                item.extend_from_slice(self.local[to.index()].to_string().as_bytes());
                if self.tcp {
                    item.extend_from_slice(b";transport=tcp");
                }
                item.extend_from_slice(format!(";{TOKEN_PARAM}={tok}>").as_bytes());
            }
            item.extend_from_slice(na.params.raw());
            new.push(item);
        }
        Ok((Some(new.join(&b", "[..])), tokens))
    }

    /// Call-ID hiding: the Call-ID `received` on `face` and the one the other face sees,
    /// made up (random, `@` the gateway's address there) the first time a Call-ID crosses.
    /// A device's `...@192.168.1.64` never reaches the other domain, and the answer gets
    /// its own Call-ID back. A mapping lives `life` from now (at least: a transaction's
    /// `TXN_LINGER`; a dialog's `DIALOG_IDLE`; a registration's lifetime), and as long as
    /// its call.
    /// Returns (the Call-ID on the listen face, which keys the tables; the Call-ID the
    /// other face sees, for the message crossing), or None when the table is full.
    fn call_ids(
        &mut self,
        face: Face,
        received: &[u8],
        life: Duration,
        now: Instant,
    ) -> Option<(Vec<u8>, Vec<u8>)> {
        let until = now + life;
        let (f, o) = (face.index(), face.other().index());
        let other = match self.cids[f].get_mut(received) {
            Some(e) => {
                e.1 = e.1.max(until);
                e.0.clone()
            }
            None => {
                if self.cids[f].len() >= MAX_CALL_IDS {
                    self.sweep(now);
                    if self.cids[f].len() >= MAX_CALL_IDS {
                        self.counters.table_full += 1;
                        return None;
                    }
                }
                let made = format!("{}@{}", self.next_id(), self.gw_ip(face.other())).into_bytes();
                self.cids[f].insert(received.to_vec(), (made.clone(), until));
                self.cids[o].insert(made.clone(), (received.to_vec(), until));
                made
            }
        };
        if let Some(e) = self.cids[o].get_mut(&other) {
            e.1 = e.1.max(until);
        }
        let canonical = match face {
            Face::Listen => received.to_vec(),
            Face::Upstream => other.clone(),
        };
        Some((canonical, other))
    }

    /// The Call-ID face `face` knows a call by (`canonical`: its Call-ID on the listen face).
    fn call_id_on(&self, canonical: &[u8], face: Face) -> Vec<u8> {
        match face {
            Face::Listen => canonical.to_vec(),
            Face::Upstream => self.cids[Face::Listen.index()]
                .get(canonical)
                .map_or_else(|| canonical.to_vec(), |e| e.0.clone()),
        }
    }

    /// A MANSCDP body going to face `to`: its address fields rewritten per the route's
    /// `manscdp_addresses` (None: unchanged).
    fn manscdp_body(&mut self, body: &[u8], to: Face) -> Option<Vec<u8>> {
        let local = self.local[to.index()];
        let new = manscdp::rewrite_addresses(
            body,
            self.policy.manscdp_addresses,
            *local.ip(),
            local.port(),
        )?;
        self.counters.manscdp_rewritten += 1;
        Some(new)
    }

    fn our_via(&self, to: Face, branch: &str) -> Vec<u8> {
        format!(
            "SIP/2.0/{} {};branch={branch};rport",
            self.transport_name(),
            self.local[to.index()]
        )
        .into_bytes()
    }

    fn forward_request(
        &mut self,
        face: Face,
        src: Peer,
        msg: &SipMessage<'_>,
        key: InKey,
        now: Instant,
        out: &mut Vec<Out>,
    ) {
        let head = msg.head();
        let method = head.method().unwrap_or_default().to_vec();
        let to = face.other();
        if self.txns.len() >= MAX_TXNS {
            self.sweep(now);
            if self.txns.len() >= MAX_TXNS {
                self.counters.table_full += 1;
                self.busy((face, src), head, out);
                return;
            }
        }
        let body = msg.body();
        let manscdp = !body.is_empty()
            && head
                .header("Content-Type")
                .is_some_and(|h| manscdp::is_manscdp(h.value()));
        if manscdp {
            let cmds = manscdp::commands(body);
            let (allow, deny) = (&self.policy.manscdp_allow, &self.policy.manscdp_deny);
            if let Some(cmd) = manscdp::refused(&cmds, allow, deny) {
                let cmd = String::from_utf8_lossy(cmd).into_owned();
                self.counters.manscdp_refused += 1;
                if let Some(suppressed) = LOG_FORBIDDEN.check(now_ms()) {
                    tracing::warn!(route = %self.name, peer = %src.addr, command = %cmd, suppressed, "MANSCDP command refused with 403 (manscdp_allow / manscdp_deny)");
                }
                let warning =
                    format!("399 vgate \"MANSCDP command {cmd} is not allowed on this route\"");
                self.answer(
                    (face, src),
                    head,
                    403,
                    "Forbidden",
                    &[("Warning", &warning)],
                    out,
                );
                return;
            }
        }
        let to_tagged = head.to().ok().and_then(|t| t.tag()).is_some();
        let received_cid = head.call_id().unwrap_or_default();
        let life = if to_tagged { DIALOG_IDLE } else { TXN_LINGER };
        let Some((call_id, cid_out)) = self.call_ids(face, received_cid, life, now) else {
            self.busy((face, src), head, out);
            return;
        };
        let (dest, new_uri) = match self.target(face, head, &call_id, now) {
            Ok(t) => t,
            Err((code, reason)) => {
                self.answer((face, src), head, code, reason, &[], out);
                return;
            }
        };
        let cseq = head.cseq().map(|c| c.seq).unwrap_or(0);
        let initial_invite = method == b"INVITE" && !to_tagged;
        if !body.is_empty() && hides_sdp(head, body) {
            self.answer(
                (face, src),
                head,
                415,
                "Unsupported Media Type",
                &[("Accept", "application/sdp")],
                out,
            );
            return;
        }
        if initial_invite && !self.calls.contains_key(&call_id) {
            if self.calls.len() >= MAX_CALLS {
                self.sweep(now);
            }
            if self.calls.len() >= MAX_CALLS {
                self.counters.table_full += 1;
                self.busy((face, src), head, out);
                return;
            }
            let label = call_label(&self.name, head.request_uri(), body, &call_id);
            self.calls.insert(
                call_id.clone(),
                Call {
                    media: CallMedia::new(label, self.max_payload)
                        .with_link_face(self.link_face)
                        .with_legs(self.legs.clone()),
                    contact: [None, None],
                    view: [None, None],
                    cseq_to: [0, 0],
                    confirmed_ms: None,
                    ended: None,
                    created: now,
                    last_activity: now,
                },
            );
            self.counters.calls_started += 1;
        }
        // SDP first: it may refuse the request.
        let new_body = if !body.is_empty() && is_sdp(head) {
            let from_dom = self.dom(face);
            let (routes, sp, ro) = (Arc::clone(&self.routes), self.source_policy, self.rtp_only);
            let Some(call) = self.calls.get_mut(&call_id) else {
                self.answer(
                    (face, src),
                    head,
                    488,
                    "Not Acceptable Here",
                    &[("Warning", "399 vgate \"SDP outside an INVITE dialog\"")],
                    out,
                );
                return;
            };
            match call.media.cross(&routes, sp, ro, from_dom, body) {
                Ok(b) => Some(b),
                Err(MediaError::Refuse {
                    code,
                    reason,
                    warning,
                }) => {
                    if code == 503 {
                        self.counters.no_ports += 1;
                    } else {
                        self.counters.tcp_media_refused += u64::from(warning.contains("over TCP"));
                        if let Some(suppressed) = LOG_REFUSED_MEDIA.check(now_ms()) {
                            tracing::warn!(route = %self.name, call = %String::from_utf8_lossy(&call_id), suppressed, "SDP refused with {code}: {warning}");
                        }
                    }
                    let retry = [("Retry-After", "5"), ("Warning", warning.as_str())];
                    let warn = [("Warning", warning.as_str())];
                    let extra: &[(&str, &str)] = if code == 503 { &retry } else { &warn };
                    let resp = self.answer((face, src), head, code, reason, extra, out);
                    if initial_invite {
                        if let Some(mut c) = self.calls.remove(&call_id) {
                            c.media.close(&self.routes);
                            self.counters.calls_ended += 1;
                        }
                        // Remember the answer so a retransmitted INVITE gets it again.
                        let branch = format!("{BRANCH_PREFIX}{}", self.next_id());
                        self.by_in.insert(key.clone(), branch.clone());
                        self.txns.insert(
                            branch,
                            Txn {
                                in_key: Some(key),
                                from_face: face,
                                src,
                                vias: Vec::new(),
                                from_value: Vec::new(),
                                to_value: Vec::new(),
                                call_id,
                                method,
                                cseq,
                                dest,
                                forwarded: Vec::new(),
                                last_response: resp,
                                final_code: Some(code),
                                created: now,
                                expires: now + TXN_LINGER,
                                internal: false,
                                initial_invite: false,
                                registers: Vec::new(),
                            },
                        );
                    }
                    return;
                }
            }
        } else if manscdp {
            self.manscdp_body(body, to)
        } else {
            None
        };

        let lifetime = if method == b"REGISTER" {
            Duration::from_secs(3600)
        } else {
            DIALOG_IDLE
        };
        let (contact, tokens) = match self.contacts(head, face, src, lifetime, now) {
            Ok(c) => c,
            Err(why) => {
                let (code, reason, extra): (u16, &str, &[(&str, &str)]) = match why {
                    BindRefused::Malformed => (400, "Bad Request - Malformed Contact", &[]),
                    BindRefused::TableFull => (503, "Service Unavailable", &[("Retry-After", "5")]),
                    BindRefused::SourceCap => (
                        403,
                        "Forbidden",
                        &[(
                            "Warning",
                            "399 vgate \"too many contacts from this source\"",
                        )],
                    ),
                };
                self.answer((face, src), head, code, reason, extra, out);
                return;
            }
        };
        let token = tokens.first().cloned();
        let registers = if method == b"REGISTER" {
            tokens
        } else {
            Vec::new()
        };
        let branch = format!("{BRANCH_PREFIX}{}", self.next_id());
        let mut ed = Editor::new(msg);
        if let Some(u) = &new_uri {
            if ed.set_request_uri(u).is_err() {
                self.answer(
                    (face, src),
                    head,
                    400,
                    "Bad Request - Malformed Request-URI",
                    &[],
                    out,
                );
                return;
            }
        }
        let vias: Vec<(Vec<u8>, Vec<u8>)> = head
            .headers_named("Via")
            .map(|h| (h.name().to_vec(), unfold(h.value())))
            .collect();
        ed.remove_all("Via");
        let _ = ed.insert_top("Via", &self.our_via(to, &branch));
        for name in ["Route", "Record-Route", "Path"] {
            ed.remove_all(name);
        }
        let _ = ed.replace_value("Call-ID", &cid_out);
        if let Some(mf) = head
            .header("Max-Forwards")
            .and_then(|h| crate::signaling::sip::parse_max_forwards(h.value()).ok())
        {
            let _ = ed.replace_value("Max-Forwards", mf.saturating_sub(1).to_string().as_bytes());
        }
        if let Some(c) = &contact {
            let _ = ed.replace_all("Contact", c);
        }
        let from_value = head
            .header("From")
            .map(|h| unfold(h.value()))
            .unwrap_or_default();
        let to_value = head
            .header("To")
            .map(|h| unfold(h.value()))
            .unwrap_or_default();
        let from_out = self.rewrite_party(&from_value, face);
        let to_out = self.rewrite_party(&to_value, face);
        if let Some(v) = &from_out {
            let _ = ed.replace_value("From", v);
        }
        if let Some(v) = &to_out {
            let _ = ed.replace_value("To", v);
        }
        if let Some(b) = new_body {
            ed.set_body(b);
        }
        if self.tcp {
            ed.ensure_content_length();
        }
        let bytes = ed.to_bytes();
        // Dialog bookkeeping.
        let closes = method == b"BYE";
        if let Some(call) = self.calls.get_mut(&call_id) {
            call.last_activity = now;
            call.cseq_to[to.index()] = call.cseq_to[to.index()].max(cseq);
            if initial_invite {
                if let Some(t) = &token {
                    call.contact[face.index()] = Some(t.clone());
                }
                call.view[to.index()] = Some((
                    from_out.clone().unwrap_or_else(|| from_value.clone()),
                    to_out.clone().unwrap_or_else(|| to_value.clone()),
                ));
            } else if let Some(t) = &token {
                call.contact[face.index()] = Some(t.clone());
            }
            if closes && call.ended.is_none() {
                call.media.close(&self.routes);
                call.ended = Some(now);
                self.counters.calls_ended += 1;
            }
        }
        if initial_invite {
            // Our own 100 Trying: the caller stops retransmitting; downstream's is absorbed.
            let tag = self.next_id();
            if let Ok(r) = build_response(head, 100, "Trying", &tag, &[]) {
                out.push(Out {
                    face,
                    to: src,
                    bytes: r,
                });
            }
        }
        let trying = out
            .last()
            .filter(|_| initial_invite)
            .map(|o| o.bytes.clone());
        out.push(Out {
            face: to,
            to: dest,
            bytes: bytes.clone(),
        });
        self.counters.forwarded_requests += 1;
        let expires = if method == b"INVITE" {
            now + self.policy.invite_timeout + TXN_LINGER
        } else {
            now + TXN_LINGER
        };
        self.by_in.insert(key.clone(), branch.clone());
        self.txns.insert(
            branch,
            Txn {
                in_key: Some(key),
                from_face: face,
                src,
                vias,
                from_value,
                to_value,
                call_id,
                method: method.clone(),
                cseq,
                dest,
                forwarded: bytes,
                last_response: trying,
                final_code: (method == b"ACK").then_some(200),
                created: now,
                expires,
                internal: false,
                initial_invite,
                registers,
            },
        );
    }

    fn cancel(&mut self, face: Face, src: Peer, head: &Head<'_>, now: Instant, out: &mut Vec<Out>) {
        let mut key = Self::in_key(face, src, head, b"INVITE");
        key.method = b"INVITE".to_vec();
        let Some(branch) = self.by_in.get(&key).cloned() else {
            self.answer(
                (face, src),
                head,
                481,
                "Call/Transaction Does Not Exist",
                &[],
                out,
            );
            return;
        };
        self.answer((face, src), head, 200, "OK", &[], out);
        let Some(t) = self.txns.get(&branch) else {
            return;
        };
        if t.final_code.is_some() {
            return;
        }
        let (dest, to_face, call_id) = (t.dest, t.from_face.other(), t.call_id.clone());
        if let Some(c) = self.build_cancel(&t.forwarded) {
            out.push(Out {
                face: to_face,
                to: dest,
                bytes: c,
            });
        }
        if let Some(call) = self.calls.get_mut(&call_id) {
            call.media.close(&self.routes);
        }
        let _ = now;
    }

    /// CANCEL for a forwarded INVITE (RFC 3261 §9.1): same Request-URI, Via, From, To,
    /// Call-ID and CSeq number.
    fn build_cancel(&self, forwarded: &[u8]) -> Option<Vec<u8>> {
        self.build_from_invite(forwarded, b"CANCEL", None)
    }

    fn build_from_invite(
        &self,
        forwarded: &[u8],
        method: &[u8],
        to: Option<&[u8]>,
    ) -> Option<Vec<u8>> {
        let m = SipMessage::parse_datagram(forwarded, &Limits::default()).ok()?;
        let h = m.head();
        let uri = h.request_uri()?;
        let via = h.header("Via")?.value();
        let mut b = Vec::with_capacity(512);
        b.extend_from_slice(method);
        b.push(b' ');
        b.extend_from_slice(uri);
        b.extend_from_slice(b" SIP/2.0\r\nVia: ");
        b.extend_from_slice(via);
        b.extend_from_slice(b"\r\nMax-Forwards: 70\r\nFrom: ");
        b.extend_from_slice(&unfold(h.header("From")?.value()));
        b.extend_from_slice(b"\r\nTo: ");
        b.extend_from_slice(
            &to.map(unfold)
                .unwrap_or_else(|| unfold(h.header("To").map(|x| x.value()).unwrap_or_default())),
        );
        b.extend_from_slice(b"\r\nCall-ID: ");
        b.extend_from_slice(h.call_id()?);
        b.extend_from_slice(format!("\r\nCSeq: {} ", h.cseq().ok()?.seq).as_bytes());
        b.extend_from_slice(method);
        b.extend_from_slice(b"\r\nContent-Length: 0\r\n\r\n");
        Some(b)
    }

    fn response(
        &mut self,
        face: Face,
        src: Peer,
        msg: &SipMessage<'_>,
        now: Instant,
        out: &mut Vec<Out>,
    ) {
        let head = msg.head();
        let code = head.status().unwrap_or(0);
        let branch = head
            .top_via()
            .ok()
            .and_then(|v| v.branch())
            .and_then(|b| std::str::from_utf8(b).ok())
            .unwrap_or_default()
            .to_owned();
        let cseq_method = head
            .cseq()
            .map(|c: CSeq<'_>| c.method.to_vec())
            .unwrap_or_default();
        let Some(t) = self.txns.get(&branch) else {
            self.counters.dropped_stray_responses += 1;
            return;
        };
        if t.from_face.other() != face || t.internal || cseq_method != t.method || code == 100 {
            // Answers to our own CANCEL/BYE/ACK, and downstream's 100 Trying, end here.
            if t.from_face.other() != face {
                self.counters.dropped_stray_responses += 1;
            }
            if let Some(t) = self.txns.get_mut(&branch) {
                if t.internal && code >= 200 {
                    t.final_code = Some(code);
                }
            }
            return;
        }
        let (from_face, src_peer, initial_invite, call_id) =
            (t.from_face, t.src, t.initial_invite, t.call_id.clone());
        let is_invite = t.method == b"INVITE";
        let orig_from = t.from_value.clone();
        let orig_to = t.to_value.clone();
        let vias = t.vias.clone();
        let forwarded = t.forwarded.clone();
        let dest = t.dest;

        // Non-2xx final answer to an INVITE: this transaction acknowledges it downstream.
        if is_invite && code >= 300 {
            let resp_to = head.header("To").map(|h| h.value());
            if let Some(ack) = self.build_from_invite(&forwarded, b"ACK", resp_to) {
                out.push(Out {
                    face,
                    to: dest,
                    bytes: ack,
                });
            }
        }
        let body = msg.body();
        let new_body = if !body.is_empty() && is_sdp(head) {
            let (routes, sp, ro) = (Arc::clone(&self.routes), self.source_policy, self.rtp_only);
            let from_dom = self.dom(face);
            let res = self
                .calls
                .get_mut(&call_id)
                .filter(|c| c.ended.is_none())
                .map(|c| c.media.cross(&routes, sp, ro, from_dom, body));
            match res {
                Some(Ok(b)) => Some(b),
                other => {
                    // Never let an SDP through unrewritten: drop the answer. The call then
                    // ends by the INVITE timeout (CANCEL downstream, 408 upstream).
                    self.counters.dropped_bad_sdp_responses += 1;
                    if let Some(suppressed) = LOG_BAD_RESPONSE_SDP.check(now_ms()) {
                        let why = match other {
                            Some(Err(MediaError::Refuse { warning, .. })) => warning,
                            _ => "no live call for this SDP".into(),
                        };
                        tracing::warn!(route = %self.name, code, suppressed, "SIP response dropped: its SDP cannot cross: {why}");
                    }
                    return;
                }
            }
        } else if !body.is_empty() && hides_sdp(head, body) {
            self.counters.dropped_bad_sdp_responses += 1;
            return;
        } else if !body.is_empty()
            && head
                .header("Content-Type")
                .is_some_and(|h| manscdp::is_manscdp(h.value()))
        {
            self.manscdp_body(body, from_face)
        } else {
            None
        };
        let (contact, token) = match self.contacts(head, face, src, DIALOG_IDLE, now) {
            Ok((c, t)) => (c, t.into_iter().next()),
            Err(_) => {
                self.counters.dropped_malformed += 1;
                return;
            }
        };
        if (200..300).contains(&code) {
            let registers = std::mem::take(
                &mut self
                    .txns
                    .get_mut(&branch)
                    .map(|t| &mut t.registers)
                    .cloned()
                    .unwrap_or_default(),
            );
            self.confirm_registration(&registers, now);
        }
        if (200..300).contains(&code) {
            // A dialog or registration the answer established: its Call-IDs stay mapped
            // (a registration's for as long as it may last, so refreshes keep one Call-ID).
            let life = if cseq_method == b"REGISTER" {
                MAX_REGISTRATION + TXN_LINGER
            } else {
                DIALOG_IDLE
            };
            let _ = self.call_ids(face, head.call_id().unwrap_or_default(), life, now);
        }
        let cid_back = self.call_id_on(&call_id, from_face);
        let mut ed = Editor::new(msg);
        let _ = ed.replace_value("Call-ID", &cid_back);
        ed.remove_all("Via");
        for (name, value) in vias.iter().rev() {
            let name = std::str::from_utf8(name).unwrap_or("Via");
            let _ = ed.insert_top(name, value);
        }
        for name in ["Record-Route", "Service-Route", "Path"] {
            ed.remove_all(name);
        }
        if let Some(c) = &contact {
            let _ = ed.replace_all("Contact", c);
        }
        let resp_to = head
            .header("To")
            .map(|h| unfold(h.value()))
            .unwrap_or_default();
        let tag = head.to().ok().and_then(|t| t.tag()).map(<[u8]>::to_vec);
        let orig_has_tag = NameAddr::parse(&orig_to)
            .ok()
            .and_then(|n| n.tag())
            .is_some();
        let mut to_back = orig_to.clone();
        if let (Some(tag), false) = (&tag, orig_has_tag) {
            to_back.extend_from_slice(b";tag=");
            to_back.extend_from_slice(tag);
        }
        let _ = ed.replace_value("From", &orig_from);
        let _ = ed.replace_value("To", &to_back);
        if let Some(b) = new_body {
            ed.set_body(b);
        }
        if self.tcp {
            ed.ensure_content_length();
        }
        let bytes = ed.to_bytes();
        if let Some(call) = self.calls.get_mut(&call_id) {
            call.last_activity = now;
            if initial_invite && (200..300).contains(&code) {
                if let Some(tok) = token {
                    call.contact[face.index()] = Some(tok);
                }
                if call.confirmed_ms.is_none() {
                    call.confirmed_ms = Some(now_ms());
                    self.stats
                        .call_setup
                        .observe(now.saturating_duration_since(call.created));
                }
                if let Some(v) = &mut call.view[face.index()] {
                    v.1 = resp_to.clone();
                }
                call.view[from_face.index()] = Some((to_back.clone(), orig_from.clone()));
            }
            if initial_invite && code >= 300 && call.ended.is_none() {
                call.media.close(&self.routes);
                call.ended = Some(now);
                self.counters.calls_ended += 1;
            }
        }
        if let Some(t) = self.txns.get_mut(&branch) {
            t.last_response = Some(bytes.clone());
            if code >= 200 && t.final_code.is_none() {
                t.final_code = Some(code);
                t.expires = now + TXN_LINGER;
            }
        }
        out.push(Out {
            face: from_face,
            to: src_peer,
            bytes,
        });
        self.counters.forwarded_responses += 1;
    }

    /// Sends a request of our own into a dialog (BYE on media timeout).
    fn send_in_dialog(
        &mut self,
        call_id: &[u8],
        face: Face,
        method: &str,
        reason: &str,
        now: Instant,
        out: &mut Vec<Out>,
    ) {
        let Some(call) = self.calls.get_mut(call_id) else {
            return;
        };
        let (Some(tok), Some((from, to))) = (
            call.contact[face.index()].clone(),
            call.view[face.index()].clone(),
        ) else {
            return;
        };
        call.cseq_to[face.index()] += 1;
        let cseq = call.cseq_to[face.index()];
        let Some(b) = self.bindings.get(&tok) else {
            return;
        };
        let (uri, peer) = (b.uri.clone(), b.peer);
        let branch = format!("{BRANCH_PREFIX}{}", self.next_id());
        let mut m = Vec::with_capacity(512);
        m.extend_from_slice(method.as_bytes());
        m.push(b' ');
        m.extend_from_slice(&uri);
        m.extend_from_slice(b" SIP/2.0\r\nVia: ");
        m.extend_from_slice(&self.our_via(face, &branch));
        m.extend_from_slice(b"\r\nMax-Forwards: 70\r\nFrom: ");
        m.extend_from_slice(&from);
        m.extend_from_slice(b"\r\nTo: ");
        m.extend_from_slice(&to);
        m.extend_from_slice(b"\r\nCall-ID: ");
        m.extend_from_slice(&self.call_id_on(call_id, face));
        m.extend_from_slice(format!("\r\nCSeq: {cseq} {method}\r\nReason: SIP;cause=200;text=\"{reason}\"\r\nContent-Length: 0\r\n\r\n").as_bytes());
        out.push(Out {
            face,
            to: peer,
            bytes: m.clone(),
        });
        self.txns.insert(
            branch,
            Txn {
                in_key: None,
                from_face: face.other(),
                src: peer,
                vias: Vec::new(),
                from_value: Vec::new(),
                to_value: Vec::new(),
                call_id: call_id.to_vec(),
                method: method.as_bytes().to_vec(),
                cseq,
                dest: peer,
                forwarded: m,
                last_response: None,
                final_code: None,
                created: now,
                expires: now + TXN_LINGER,
                internal: true,
                initial_invite: false,
                registers: Vec::new(),
            },
        );
    }

    /// Timers: INVITE timeouts, media timeouts, expiry of every table. Call about every
    /// 100 ms; the sweep runs once a second.
    pub fn tick(&mut self, now: Instant, now_ms: u64) -> Vec<Out> {
        let mut out = Vec::new();
        if self
            .last_sweep
            .is_some_and(|t| now.saturating_duration_since(t) < Duration::from_secs(1))
        {
            return out;
        }
        self.last_sweep = Some(now);
        self.stats.set_events(self.counters.list());
        self.stats.set_registrations(self.registrations(now));
        // Unanswered INVITEs.
        let timed_out: Vec<String> = self
            .txns
            .iter()
            .filter(|(_, t)| {
                t.initial_invite
                    && t.final_code.is_none()
                    && now.saturating_duration_since(t.created) >= self.policy.invite_timeout
            })
            .map(|(b, _)| b.clone())
            .collect();
        for branch in timed_out {
            self.invite_timeout(&branch, now, &mut out);
        }
        // Calls an operator ended through the admin interface, or whose TCP media leg
        // closed: BYE to both sides.
        let killed: Vec<Vec<u8>> = self
            .calls
            .iter()
            .filter(|(_, c)| {
                c.ended.is_none()
                    && c.media
                        .session
                        .is_some_and(|s| self.routes.end_requested(s))
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in killed {
            let why = match self.calls.get(&id) {
                Some(c) if c.media.leg_closed() => "its TCP media leg closed",
                _ => "ended by the operator",
            };
            tracing::info!(route = %self.name, call = %String::from_utf8_lossy(&id), "{why}: BYE to both sides");
            let reason = format!("vgate: {why}");
            for f in Face::BOTH {
                self.send_in_dialog(&id, f, "BYE", &reason, now, &mut out);
            }
            if let Some(c) = self.calls.get_mut(&id) {
                c.media.close(&self.routes);
                c.ended = Some(now);
                self.counters.calls_ended += 1;
            }
        }
        // Calls without media.
        if !self.policy.media_timeout.is_zero() {
            let limit = self.policy.media_timeout.as_millis() as u64;
            let idle: Vec<Vec<u8>> = self
                .calls
                .iter()
                .filter(|(_, c)| c.ended.is_none() && c.media.session.is_some())
                .filter_map(|(id, c)| {
                    let since = c.media.last_media_ms(&self.routes).or(c.confirmed_ms)?;
                    (now_ms.saturating_sub(since) >= limit).then(|| id.clone())
                })
                .collect();
            for id in idle {
                self.counters.media_timeouts += 1;
                tracing::info!(route = %self.name, call = %String::from_utf8_lossy(&id), "no media for {:?}: ending the call (BYE to both sides)", self.policy.media_timeout);
                for f in Face::BOTH {
                    self.send_in_dialog(&id, f, "BYE", "vgate: no media", now, &mut out);
                }
                if let Some(c) = self.calls.get_mut(&id) {
                    c.media.close(&self.routes);
                    c.ended = Some(now);
                    self.counters.calls_ended += 1;
                }
            }
        }
        self.sweep(now);
        out
    }

    fn invite_timeout(&mut self, branch: &str, now: Instant, out: &mut Vec<Out>) {
        let tag = self.next_id();
        let Some(t) = self.txns.get(branch) else {
            return;
        };
        self.counters.invite_timeouts += 1;
        let (dest, to_face, call_id) = (t.dest, t.from_face.other(), t.call_id.clone());
        if let Some(c) = self.build_cancel(&t.forwarded) {
            out.push(Out {
                face: to_face,
                to: dest,
                bytes: c,
            });
        }
        // 408 to the caller, built from what the transaction kept of the request.
        let mut r = b"SIP/2.0 408 Request Timeout\r\n".to_vec();
        for (n, v) in &t.vias {
            r.extend_from_slice(n);
            r.extend_from_slice(b": ");
            r.extend_from_slice(v);
            r.extend_from_slice(b"\r\n");
        }
        let to_has_tag = NameAddr::parse(&t.to_value)
            .ok()
            .and_then(|n| n.tag())
            .is_some();
        r.extend_from_slice(b"From: ");
        r.extend_from_slice(&t.from_value);
        r.extend_from_slice(b"\r\nTo: ");
        r.extend_from_slice(&t.to_value);
        if !to_has_tag {
            r.extend_from_slice(format!(";tag={tag}").as_bytes());
        }
        r.extend_from_slice(b"\r\nCall-ID: ");
        r.extend_from_slice(&self.call_id_on(&t.call_id, t.from_face));
        r.extend_from_slice(
            format!("\r\nCSeq: {} INVITE\r\nContent-Length: 0\r\n\r\n", t.cseq).as_bytes(),
        );
        out.push(Out {
            face: t.from_face,
            to: t.src,
            bytes: r.clone(),
        });
        if let Some(t) = self.txns.get_mut(branch) {
            t.last_response = Some(r);
            t.final_code = Some(408);
            t.expires = now + TXN_LINGER;
        }
        if let Some(c) = self.calls.get_mut(&call_id) {
            if c.ended.is_none() {
                c.media.close(&self.routes);
                c.ended = Some(now);
                self.counters.calls_ended += 1;
            }
        }
    }

    /// Drops expired transactions, bindings and calls.
    fn sweep(&mut self, now: Instant) {
        let mut gone = Vec::new();
        self.txns.retain(|_, t| {
            let keep = t.expires > now;
            if !keep {
                if let Some(k) = t.in_key.take() {
                    gone.push(k);
                }
            }
            keep
        });
        for k in gone {
            self.by_in.remove(&k);
        }
        let per_source = &mut self.per_source;
        self.bindings.retain(|_, b| {
            let keep = b.expires > now;
            if !keep {
                if let Some(n) = per_source.get_mut(&b.source) {
                    *n = n.saturating_sub(1);
                }
            }
            keep
        });
        self.per_source.retain(|_, n| *n > 0);
        let bindings = &self.bindings;
        self.binding_index
            .retain(|_, tok| bindings.contains_key(tok));
        self.by_user.retain(|_, tok| bindings.contains_key(tok));
        let calls = &self.calls;
        let [listen_ids, up_ids] = &mut self.cids;
        listen_ids.retain(|id, e| e.1 > now || calls.contains_key(id));
        up_ids.retain(|_, e| e.1 > now || calls.contains_key(&e.0));
        let routes = Arc::clone(&self.routes);
        let invite_window = self.policy.invite_timeout + TXN_LINGER;
        let mut ended = 0;
        self.calls.retain(|_, c| {
            let done = match (c.ended, c.confirmed_ms) {
                (Some(e), _) => now.saturating_duration_since(e) >= TXN_LINGER,
                (None, None) => now.saturating_duration_since(c.created) >= invite_window,
                (None, Some(_)) => {
                    c.media.session.is_none()
                        && now.saturating_duration_since(c.last_activity) >= DIALOG_IDLE
                }
            };
            if done {
                if c.ended.is_none() {
                    ended += 1;
                }
                c.media.close(&routes);
            }
            !done
        });
        self.counters.calls_ended += ended;
    }

    /// Ends every call (ports and routes freed); called when the proxy stops (a reload that
    /// changes the route, or the gateway stopping). An established call is not dropped
    /// silently: the returned BYEs go to both sides, and the calls are counted as ended.
    pub fn shutdown(&mut self, now: Instant) -> Vec<Out> {
        let mut out = Vec::new();
        let live: Vec<Vec<u8>> = self
            .calls
            .iter()
            .filter(|(_, c)| c.ended.is_none() && c.confirmed_ms.is_some())
            .map(|(id, _)| id.clone())
            .collect();
        for id in &live {
            for f in Face::BOTH {
                self.send_in_dialog(id, f, "BYE", "vgate: route stopped", now, &mut out);
            }
        }
        self.counters.calls_ended += live.len() as u64;
        self.stats.set_events(self.counters.list());
        for (_, mut c) in self.calls.drain() {
            c.media.close(&self.routes);
        }
        self.txns.clear();
        self.by_in.clear();
        self.bindings.clear();
        self.binding_index.clear();
        self.by_user.clear();
        self.per_source.clear();
        self.cids = [HashMap::new(), HashMap::new()];
        out
    }
}

/// The name of a call's session and routes (logs, `vgate sessions list`, the `route` label of
/// per-stream metrics): the GB/T 28181 channel the INVITE asks for (its Request-URI user) and
/// the SSRC its SDP offers (`y=`), which an operator finds in the platform's own screens; the
/// Call-ID (rewritten at the boundary, so of no use to them) only when the Request-URI has no
/// user.
fn call_label(route: &str, uri: Option<&[u8]>, body: &[u8], call_id: &[u8]) -> String {
    let clean = |b: &[u8]| -> String {
        String::from_utf8_lossy(b)
            .chars()
            .filter(|c| c.is_ascii_graphic())
            .take(48)
            .collect()
    };
    let user = uri
        .map(|u| {
            let u = u
                .strip_prefix(b"sips:")
                .or_else(|| u.strip_prefix(b"sip:"))
                .unwrap_or(u);
            match u.iter().position(|c| *c == b'@') {
                Some(at) => &u[..at],
                None => &[][..],
            }
        })
        .filter(|u| !u.is_empty());
    let Some(user) = user else {
        return format!("sip:{route}:{}", clean(call_id));
    };
    let ssrc = crate::signaling::sdp::parse(body)
        .ok()
        .and_then(|sdp| sdp.media.iter().find_map(|m| m.ssrc))
        .map(|y| clean(y.as_bytes()));
    match ssrc {
        Some(y) if !y.is_empty() => format!("sip:{route}:{} y={y}", clean(user)),
        _ => format!("sip:{route}:{}", clean(user)),
    }
}

#[cfg(test)]
mod call_label_tests {
    use super::call_label;

    #[test]
    fn calls_are_named_by_gb_channel_and_ssrc() {
        let sdp = b"v=0\r\no=34020000002000000001 0 0 IN IP4 10.1.0.9\r\ns=Play\r\nc=IN IP4 10.1.0.9\r\nt=0 0\r\nm=video 6000 RTP/AVP 96\r\na=recvonly\r\na=rtpmap:96 PS/90000\r\ny=0100000001\r\n";
        let uri = Some(&b"sip:34020000001320000001@3402000000"[..]);
        assert_eq!(
            call_label("gb", uri, sdp, b"abc@10.1.0.9"),
            "sip:gb:34020000001320000001 y=0100000001"
        );
        assert_eq!(
            call_label("gb", uri, b"", b"abc@10.1.0.9"),
            "sip:gb:34020000001320000001"
        );
        // No user in the Request-URI: the Call-ID is all there is.
        assert_eq!(
            call_label("gb", Some(b"sip:10.2.0.1:5060"), sdp, b"abc@10.1.0.9"),
            "sip:gb:abc@10.1.0.9"
        );
    }
}
