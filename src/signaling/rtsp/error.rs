//! The one error type of the RTSP component.
//!
//! Every message says what went wrong *and* what the proxy (or the operator)
//! should do next, because these errors end up in logs read by people who did
//! not write this code. Variants carry only numbers and static text, never
//! bytes from the peer: an error must not become a log-injection channel nor
//! echo a password.

use thiserror::Error;

/// Everything that can go wrong while framing, parsing or rewriting RTSP.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum RtspError {
    // ---- framing -------------------------------------------------------
    /// The header block is larger than `Limits::max_header_bytes`.
    #[error("RTSP header block exceeds {limit} bytes: answer 400 and close the connection, or raise `max_header_bytes` if this peer is legitimate")]
    HeaderTooLarge { limit: usize },
    /// More header lines than `Limits::max_headers`.
    #[error("RTSP message has more than {limit} header lines: answer 400 and close the connection, or raise `max_headers`")]
    TooManyHeaders { limit: usize },
    /// One line is longer than `Limits::max_line_bytes`.
    #[error("RTSP line longer than {limit} bytes: answer 400 and close the connection, or raise `max_line_bytes`")]
    LineTooLong { limit: usize },
    /// `Content-Length` announces more than `Limits::max_body_bytes`.
    #[error("RTSP body of {len} bytes exceeds the {limit}-byte limit: answer 413/400 and close the connection, or raise `max_body_bytes`")]
    BodyTooLarge { len: usize, limit: usize },
    /// `Content-Length` is not a plain decimal number.
    #[error("Content-Length is not a decimal number: the stream can no longer be framed, close the connection")]
    BadContentLength,
    /// Two `Content-Length` headers: a classic request-smuggling vector.
    #[error("message has more than one Content-Length header: refuse it and close the connection (request smuggling risk)")]
    DuplicateContentLength,
    /// The header block is not UTF-8 (RFC 7826 §20 requires UTF-8).
    #[error("RTSP header block is not valid UTF-8: answer 400 and close the connection")]
    NotUtf8,
    /// The request or status line does not follow the grammar.
    #[error("malformed RTSP {what} line: answer 400 (requests) or drop the response and close the upstream connection")]
    BadStartLine { what: &'static str },
    /// A header line has no colon, a bad name or control characters.
    #[error("malformed RTSP header line: answer 400 and close the connection")]
    BadHeaderLine,
    /// A header line starts with whitespace (obsolete line folding).
    #[error("RTSP header uses obsolete line folding: refused because it hides header boundaries; answer 400")]
    FoldedHeader,
    /// The buffer handed to the parser is not exactly one framed message.
    #[error("buffer is not exactly one RTSP message: pass the byte count `next_frame` returned (this is a bug in the caller)")]
    FrameMismatch,
    /// A request has no usable `CSeq`.
    #[error("request has no valid CSeq header: answer 400 without a CSeq")]
    MissingCSeq,
    /// The `Session` header is malformed.
    #[error("malformed Session header: answer 454 Session Not Found")]
    BadSession,
    /// The editor was given a header index the message does not have.
    #[error("header index out of range for this message: a bug in the caller, which must index `Message::headers()`")]
    HeaderIndex,
    /// The editor was given a value that would break the message framing.
    #[error("refusing to write a header name/value or URI containing CR, LF or other control characters (header injection); check the rewrite that produced it")]
    HeaderInjection,

    // ---- transport -----------------------------------------------------
    /// The Transport header is empty or has an empty alternative.
    #[error(
        "Transport header is empty or has an empty alternative: answer 461 Unsupported Transport"
    )]
    EmptyTransport,
    /// The Transport header is longer than the parser accepts.
    #[error("Transport header longer than {limit} bytes or with too many alternatives/parameters: answer 461")]
    TransportTooLong { limit: usize },
    /// A quoted parameter value never closes.
    #[error("Transport header has an unterminated quoted string: answer 400")]
    UnterminatedQuote,
    /// The transport-protocol/profile/lower-transport triple is malformed.
    #[error("Transport protocol is not of the form RTP/AVP[/UDP|/TCP]: answer 461 Unsupported Transport")]
    BadTransportProtocol,
    /// A lower transport other than UDP or TCP.
    #[error("Transport lower transport is neither UDP nor TCP: answer 461 Unsupported Transport")]
    UnsupportedLowerTransport,
    /// A parameter has an empty name or a value where none belongs.
    #[error("Transport parameter `{param}` is malformed: answer 461 Unsupported Transport")]
    BadTransportParam { param: &'static str },
    /// A port is 0, above 65535, or not a number.
    #[error(
        "Transport `{param}` port is not a number in 1..=65535: answer 461 Unsupported Transport"
    )]
    BadPort { param: &'static str },
    /// `a-b` with `b < a`.
    #[error("Transport `{param}` range is reversed (high-low): answer 461 Unsupported Transport")]
    ReversedRange { param: &'static str },
    /// A parameter that may appear once appears twice.
    #[error("Transport parameter `{param}` appears twice in one alternative: answer 461")]
    DuplicateTransportParam { param: &'static str },
    /// Multicast delivery requested; vgate forwards unicast only.
    #[error("multicast transport requested: vgate forwards unicast only; answer 461 Unsupported Transport")]
    MulticastRefused,
    /// `destination=` names someone other than the requesting client.
    #[error("Transport destination= names an address other than the requesting client (RFC 7826 §21.2.1, media flood risk): answer 403 Forbidden or 461 and log the client")]
    ForeignDestination,
    /// No alternative in the Transport header is acceptable.
    #[error("no Transport alternative is acceptable to vgate (need unicast RTP over UDP with client_port, or interleaved TCP): answer 461 Unsupported Transport")]
    NoAcceptableTransport,
    /// UDP delivery without `client_port`.
    #[error(
        "UDP Transport without client_port: vgate cannot know where to send media; answer 461"
    )]
    MissingClientPort,
    /// A port pair where RTCP is not RTP + 1 cannot be written as a range.
    #[error("RTCP port must be RTP port + 1 to be written as a Transport range: allocate ports as adjacent pairs")]
    PortsNotAdjacent,

    // ---- URLs ----------------------------------------------------------
    /// Not an `rtsp://` / `rtsps://` URL or otherwise unparsable.
    #[error("malformed RTSP URL: answer 400 Bad Request")]
    BadUrl,
    /// The URL path contains `.`/`..` segments (also percent-encoded).
    #[error("RTSP URL path contains dot segments: refused so a client cannot climb out of its route prefix; answer 400")]
    DotSegment,
    /// No route prefix matches the client's URL.
    #[error(
        "no RTSP route matches the requested path: answer 404 Not Found, or add a route for it"
    )]
    NoRoute,
    /// An upstream URL lies outside the route's upstream prefix.
    #[error("upstream server named a URL outside its route prefix: drop that header/line (it cannot be reached through vgate) or widen the route")]
    OutsideRoute,
    /// A route index passed by the caller does not exist.
    #[error("route index out of range: the session refers to a route that was removed; tear the session down")]
    UnknownRoute,

    // ---- authentication ------------------------------------------------
    /// The challenge or credentials header cannot be parsed.
    #[error("malformed {what} header: treat it as absent (answer 401 again to a client; fail the session upstream)")]
    BadAuthHeader { what: &'static str },
    /// A Digest challenge lacks a mandatory parameter.
    #[error("Digest {what} lacks `{param}`: treat it as malformed")]
    MissingAuthParam {
        what: &'static str,
        param: &'static str,
    },
    /// Only Basic and Digest exist here.
    #[error("authentication scheme is neither Basic nor Digest: cannot answer it; configure the upstream for Digest")]
    UnsupportedScheme,
    /// An algorithm not in RFC 7616.
    #[error("Digest algorithm not supported (MD5, MD5-sess, SHA-256, SHA-256-sess, SHA-512-256 are): configure the peer for one of them")]
    UnsupportedAlgorithm,
    /// Only `qop=auth-int` (or an unknown qop) offered.
    #[error("Digest qop offered is not `auth`: vgate does not implement auth-int; configure the peer for qop=auth")]
    UnsupportedQop,
    /// A nonce we did not issue, or that expired.
    #[error("Digest nonce is not one vgate issued or has expired: answer 401 with a fresh challenge (stale={stale})")]
    BadNonce { stale: bool },
    /// Unknown user, wrong password, or response for another URI/realm.
    #[error("Digest credentials rejected: answer 401 with a fresh challenge; repeated failures from one client deserve a rate limit")]
    AuthRejected,
}
