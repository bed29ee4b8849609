//! What may cross the gateway: the checks a proxy at a security boundary makes before
//! forwarding, and the answer it gives instead when a request fails them.
//!
//! The rules are RFC 3261's for a proxy (§16.3 request validation, §8.2.2 for the
//! Request-URI scheme, §20 for the header grammars) made concrete by RFC 4475's torture
//! tests, plus three rules of vgate's own, each said where it is made:
//! From/To must be SIP URIs (GB/T 28181 identifies parties by them), Proxy-Require
//! names no extension vgate supports, and offer/answer bodies must be SDP (vgate must
//! rewrite every session description that crosses, and can rewrite only SDP).
//!
//! Malformed responses are never answered, only dropped (§16.7 has nothing to send
//! back, and answering junk would make vgate a reflector).

use super::headers::{CSeq, NameAddr, Via};
use super::lex::{contains_lws, eq_ic, is_token, trim_lws};
use super::message::{Head, ParseFailure, SipMessage, StartLine};
use super::response::build_response;
use super::uri::{scheme_of, Uri};
use super::{parse_max_forwards, Limits, SipError};

/// A request refused: the status to answer with, a reason phrase naming the
/// problem, and headers the answer must carry (e.g. `Unsupported` with 420).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    pub code: u16,
    pub reason: &'static str,
    pub headers: Vec<(&'static str, String)>,
}

impl Reject {
    pub fn new(code: u16, reason: &'static str) -> Self {
        Reject {
            code,
            reason,
            headers: Vec::new(),
        }
    }

    fn bad(reason: &'static str) -> Self {
        Reject::new(400, reason)
    }

    /// The answer to `request` carrying this rejection (see [`build_response`]).
    pub fn response(&self, request: &Head<'_>, to_tag: &str) -> Result<Vec<u8>, SipError> {
        let extra: Vec<(&str, &str)> = self.headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        build_response(request, self.code, self.reason, to_tag, &extra)
    }
}

impl From<&SipError> for Reject {
    fn from(e: &SipError) -> Self {
        Reject::new(e.status(), e.phrase())
    }
}

/// Why a datagram or framed message was dropped without an answer: one counter each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dropped {
    /// Only CRLFs: a keep-alive, not an error.
    KeepAlive,
    /// Not parseable far enough to answer (or a response that does not parse).
    Unparsable(SipError),
    /// A response that parsed but must not be relayed.
    BadResponse(&'static str),
}

/// What the proxy does with one received message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict<'a> {
    /// Well formed and acceptable: process and forward.
    Forward(SipMessage<'a>),
    /// A request to refuse: answer `reject` to it (`head` has what the answer copies).
    Answer { head: Head<'a>, reject: Reject },
    /// Drop silently.
    Drop(Dropped),
}

/// Parses and judges one UDP datagram.
pub fn triage_datagram<'a>(buf: &'a [u8], limits: &Limits) -> Verdict<'a> {
    triage(SipMessage::parse_datagram(buf, limits))
}

/// Parses and judges one message cut out of a stream by [`frame`](super::frame).
pub fn triage_framed<'a>(buf: &'a [u8], limits: &Limits) -> Verdict<'a> {
    triage(SipMessage::parse_framed(buf, limits))
}

fn triage<'a>(parsed: Result<SipMessage<'a>, ParseFailure<'a>>) -> Verdict<'a> {
    match parsed {
        Ok(msg) if msg.head().is_request() => match check_request(&msg) {
            Ok(()) => Verdict::Forward(msg),
            Err(reject) => Verdict::Answer {
                head: msg.head().clone(),
                reject,
            },
        },
        Ok(msg) => match check_response(&msg) {
            Ok(()) => Verdict::Forward(msg),
            Err(why) => Verdict::Drop(Dropped::BadResponse(why)),
        },
        Err(ParseFailure {
            error: SipError::Empty,
            ..
        }) => Verdict::Drop(Dropped::KeepAlive),
        Err(ParseFailure {
            error,
            head: Some(head),
        }) if head.is_request() => Verdict::Answer {
            reject: Reject::from(&error),
            head: *head,
        },
        Err(ParseFailure { error, .. }) => Verdict::Drop(Dropped::Unparsable(error)),
    }
}

/// Checks a parsed request before it is forwarded. `Err` carries the answer to
/// send instead. The order matters only for which problem is named when there are
/// several; version first, since nothing else is meaningful in another version.
pub fn check_request(msg: &SipMessage<'_>) -> Result<(), Reject> {
    let head = msg.head();
    let StartLine::Request { method, uri, .. } = *head.start() else {
        return Err(Reject::bad("Bad Request - Not a Request"));
    };
    check_version(head)?;
    check_request_line(head, uri)?;
    check_request_uri(uri)?;
    check_mandatory(head, &["Via", "From", "To", "Call-ID", "CSeq"])?;
    check_single(head)?;
    check_call_id(head)?;
    let cseq = CSeq::parse(head.header("CSeq").map(|h| h.value()).unwrap_or_default())
        .map_err(|_| Reject::bad("Bad Request - Malformed CSeq"))?;
    if cseq.method != method {
        return Err(Reject::bad(
            "Bad Request - CSeq Method Does Not Match Request-Line",
        ));
    }
    let max_forwards = check_max_forwards(head)?;
    check_vias(head)?;
    check_party(head, "From")?;
    check_party(head, "To")?;
    check_contacts(head, method)?;
    check_routes(head)?;
    check_proxy_require(head)?;
    check_session_body(msg, method)?;
    if max_forwards == Some(0) {
        // §16.3 step 3: a proxy must not forward a request with Max-Forwards 0.
        return Err(Reject::new(483, "Too Many Hops"));
    }
    Ok(())
}

/// Checks a parsed response before it is relayed; `Err` names why it is dropped.
pub fn check_response(msg: &SipMessage<'_>) -> Result<(), &'static str> {
    let head = msg.head();
    if head.is_request() {
        return Err("not a response");
    }
    if !eq_ic(head.version(), b"SIP/2.0") {
        return Err("SIP version is not 2.0");
    }
    check_mandatory(head, &["Via", "From", "To", "Call-ID", "CSeq"]).map_err(|r| r.reason)?;
    check_single(head).map_err(|r| r.reason)?;
    check_call_id(head).map_err(|r| r.reason)?;
    CSeq::parse(head.header("CSeq").map(|h| h.value()).unwrap_or_default())
        .map_err(|_| "malformed CSeq")?;
    for via in head.vias() {
        let via = via.map_err(|_| "malformed Via")?;
        // RFC 4475 §3.3.10: a Via naming a broadcast address must not be followed.
        if via.destinations().any(|h| h.is_unsafe_destination()) {
            return Err("Via names a broadcast, multicast or unspecified address");
        }
    }
    for name in ["From", "To"] {
        let value = head.header(name).map(|h| h.value()).unwrap_or_default();
        NameAddr::parse(value).map_err(|_| "malformed From or To")?;
    }
    Ok(())
}

fn check_version(head: &Head<'_>) -> Result<(), Reject> {
    if eq_ic(head.version(), b"SIP/2.0") {
        Ok(())
    } else {
        Err(Reject::new(505, "Version Not Supported"))
    }
}

/// `Method SP Request-URI SP SIP-Version` with single spaces (§25.1): extra
/// whitespace is how RFC 4475 `lwsstart`, `trws` and `lwsruri` smuggle ambiguity.
fn check_request_line(head: &Head<'_>, uri: &[u8]) -> Result<(), Reject> {
    if contains_lws(uri) {
        return Err(Reject::bad("Bad Request - Whitespace in Request-URI"));
    }
    let line = head.start_line();
    let method_len = head.method().map_or(0, <[u8]>::len);
    if line.len() != method_len + uri.len() + head.version().len() + 2 {
        return Err(Reject::bad(
            "Bad Request - Extra Whitespace in Request-Line",
        ));
    }
    Ok(())
}

fn check_request_uri(uri: &[u8]) -> Result<(), Reject> {
    let scheme = scheme_of(uri).map_err(|_| Reject::bad("Bad Request - Malformed Request-URI"))?;
    if !eq_ic(scheme, b"sip") && !eq_ic(scheme, b"sips") {
        return Err(Reject::new(416, "Unsupported URI Scheme"));
    }
    let parsed = Uri::parse(uri).map_err(|_| Reject::bad("Bad Request - Malformed Request-URI"))?;
    if parsed.headers.is_some() {
        // §19.1.5: the headers component is not allowed in a Request-URI.
        return Err(Reject::bad("Bad Request - Headers in Request-URI"));
    }
    Ok(())
}

fn missing(name: &str) -> &'static str {
    match name {
        "Via" => "Bad Request - Missing Via",
        "From" => "Bad Request - Missing From",
        "To" => "Bad Request - Missing To",
        "Call-ID" => "Bad Request - Missing Call-ID",
        _ => "Bad Request - Missing CSeq",
    }
}

fn check_mandatory(head: &Head<'_>, names: &[&str]) -> Result<(), Reject> {
    match names.iter().find(|n| head.header(n).is_none()) {
        Some(n) => Err(Reject::bad(missing(n))),
        None => Ok(()),
    }
}

/// Headers that must appear at most once (RFC 4475 §3.3.8 `multi01`).
fn check_single(head: &Head<'_>) -> Result<(), Reject> {
    const SINGLE: &[(&str, &str)] = &[
        ("From", "Bad Request - Multiple From"),
        ("To", "Bad Request - Multiple To"),
        ("Call-ID", "Bad Request - Multiple Call-ID"),
        ("CSeq", "Bad Request - Multiple CSeq"),
        ("Max-Forwards", "Bad Request - Multiple Max-Forwards"),
        ("Content-Type", "Bad Request - Multiple Content-Type"),
    ];
    match SINGLE.iter().find(|(n, _)| head.count(n) > 1) {
        Some((_, reason)) => Err(Reject::bad(reason)),
        None => Ok(()),
    }
}

fn check_call_id(head: &Head<'_>) -> Result<(), Reject> {
    let id = head.call_id().unwrap_or_default();
    if id.is_empty() || contains_lws(id) {
        return Err(Reject::bad("Bad Request - Malformed Call-ID"));
    }
    Ok(())
}

fn check_max_forwards(head: &Head<'_>) -> Result<Option<u8>, Reject> {
    match head.header("Max-Forwards") {
        None => Ok(None),
        Some(h) => parse_max_forwards(h.value())
            .map(Some)
            .map_err(|_| Reject::bad("Bad Request - Malformed Max-Forwards")),
    }
}

fn check_vias(head: &Head<'_>) -> Result<(), Reject> {
    for v in head.values("Via") {
        Via::parse(v).map_err(|_| Reject::bad("Bad Request - Malformed Via"))?;
    }
    Ok(())
}

/// From and To. Requiring a SIP URI is vgate's rule: GB/T 28181 identifies every
/// party by the user part of a SIP URI, and ID allow-lists are checked on it.
fn check_party(head: &Head<'_>, name: &str) -> Result<(), Reject> {
    let value = head.header(name).map(|h| h.value()).unwrap_or_default();
    let addr =
        NameAddr::parse(value).map_err(|_| Reject::bad("Bad Request - Malformed From or To"))?;
    match addr.sip_uri() {
        Ok(_) => Ok(()),
        Err(SipError::UnsupportedScheme) => {
            Err(Reject::bad("Bad Request - From and To Must Be SIP URIs"))
        }
        Err(_) => Err(Reject::bad("Bad Request - Malformed URI in From or To")),
    }
}

fn check_contacts(head: &Head<'_>, method: &[u8]) -> Result<(), Reject> {
    let values: Vec<&[u8]> = head.values("Contact").collect();
    for v in &values {
        if *v == b"*" {
            // §10.2.2: "*" only in REGISTER, alone, meaning "remove all bindings".
            if method != b"REGISTER" || values.len() != 1 {
                return Err(Reject::bad("Bad Request - Misplaced Contact *"));
            }
            continue;
        }
        let addr =
            NameAddr::parse(v).map_err(|_| Reject::bad("Bad Request - Malformed Contact"))?;
        match addr.sip_uri() {
            Ok(_) | Err(SipError::UnsupportedScheme) => {}
            Err(_) => return Err(Reject::bad("Bad Request - Malformed Contact URI")),
        }
    }
    Ok(())
}

fn check_routes(head: &Head<'_>) -> Result<(), Reject> {
    for name in ["Route", "Record-Route"] {
        for v in head.values(name) {
            let addr =
                NameAddr::parse(v).map_err(|_| Reject::bad("Bad Request - Malformed Route"))?;
            if !addr.bracketed || addr.sip_uri().is_err() {
                return Err(Reject::bad("Bad Request - Malformed Route"));
            }
        }
    }
    Ok(())
}

/// §16.3 step 5 (proxies check Proxy-Require, UASs check Require): vgate implements
/// no proxy extension, so any option tag there is refused with the list echoed.
fn check_proxy_require(head: &Head<'_>) -> Result<(), Reject> {
    let tags: Vec<&[u8]> = head.values("Proxy-Require").collect();
    if tags.is_empty() {
        return Ok(());
    }
    // Option tags are tokens; only tokens are echoed, so nothing a peer sends here
    // can reach the Unsupported header of our answer unchecked.
    if !tags.iter().all(|t| is_token(t)) {
        return Err(Reject::bad("Bad Request - Malformed Proxy-Require"));
    }
    let tags: Vec<String> = tags
        .iter()
        .map(|t| String::from_utf8_lossy(t).into_owned())
        .collect();
    let mut r = Reject::new(420, "Bad Extension");
    r.headers.push(("Unsupported", tags.join(", ")));
    Err(r)
}

/// Methods whose bodies are session descriptions under offer/answer (RFC 3264, 3262, 3311).
fn carries_offer_answer(method: &[u8]) -> bool {
    [&b"INVITE"[..], b"ACK", b"PRACK", b"UPDATE"].contains(&method)
}

/// The media type of a Content-Type/Accept value, parameters dropped.
fn media_type(value: &[u8]) -> &[u8] {
    trim_lws(value.split(|&b| b == b';').next().unwrap_or_default())
}

/// vgate's rule: an offer/answer body must be SDP, since vgate must rewrite every
/// session description that crosses and a body it cannot read may carry addresses of
/// the other domain; and the answer to an INVITE must be allowed to be SDP.
fn check_session_body(msg: &SipMessage<'_>, method: &[u8]) -> Result<(), Reject> {
    let head = msg.head();
    let content_type = head.header("Content-Type").map(|h| media_type(h.value()));
    if !msg.body().is_empty() {
        let Some(ct) = content_type else {
            // §20.15: Content-Type must be present when there is a body.
            return Err(Reject::bad("Bad Request - Body Without Content-Type"));
        };
        if carries_offer_answer(method) && !eq_ic(ct, b"application/sdp") {
            let mut r = Reject::new(415, "Unsupported Media Type");
            r.headers.push(("Accept", "application/sdp".to_owned()));
            return Err(r);
        }
    }
    if method == b"INVITE" {
        let accepts: Vec<&[u8]> = head
            .values("Accept")
            .map(media_type)
            .filter(|v| !v.is_empty())
            .collect();
        let sdp_ok =
            |t: &&[u8]| eq_ic(t, b"application/sdp") || eq_ic(t, b"application/*") || *t == b"*/*";
        if !accepts.is_empty() && !accepts.iter().any(sdp_ok) {
            let mut r = Reject::new(406, "Not Acceptable");
            r.headers.push((
                "Warning",
                "399 vgate \"Accept must allow application/sdp\"".to_owned(),
            ));
            return Err(r);
        }
    }
    Ok(())
}
