//! SIP messages as zero-copy views, and the edits a proxy makes to them.
//!
//! This module owns the SIP wire format (RFC 3261 §7 and §25) for vgate's signaling
//! proxy: it turns bytes into a [`SipMessage`] whose every part is a slice of the input,
//! decides whether a message may cross the gateway ([`triage_datagram`],
//! [`check_request`]), and turns a message plus a list of edits back into bytes
//! ([`Editor`]). It does no I/O, keeps no state between messages and never panics on any
//! input; the proxy owns sockets, transactions and the SDP rewrite (`signaling::sdp`).
//!
//! | file | owns |
//! |---|---|
//! | `message.rs` | start line, header fields, folding, body framing by Content-Length, TCP [`frame`] |
//! | `headers.rs` | header names (compact forms), comma lists, Via, name-addr, CSeq, parameters |
//! | `uri.rs` | `sip:`/`sips:` URIs, hosts, GB/T 28181 20-digit IDs |
//! | `edit.rs` | [`Editor`]: replace the Request-URI, insert/remove/replace headers, replace the body |
//! | `validate.rs` | what a proxy at a security boundary accepts, rejects (with which code) or drops |
//! | `response.rs` | minimal responses to a request (RFC 3261 §8.2.6) |
//! | `lex.rs` | byte classes and the small scanners the others share |
//!
//! Header values are left exactly as received, folding included: the scanners treat CR
//! and LF inside a value as whitespace, which is only correct because the message parser
//! has already checked that every CRLF inside a header is followed by SP or HTAB.

#![deny(unsafe_code)]
#![deny(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

mod edit;
mod headers;
mod lex;
mod message;
mod response;
mod uri;
mod validate;

pub use edit::Editor;
pub use headers::{
    full_name, is_list_header, parse_content_length, parse_max_forwards, CSeq, NameAddr, Param,
    Params, Via,
};
pub use lex::CommaValues;
pub use message::{frame, Framing, Head, Header, ParseFailure, SipMessage, StartLine};
pub use response::build_response;
pub use uri::{scheme_of, GbId, Host, Scheme, Uri};
pub use validate::{
    check_request, check_response, triage_datagram, triage_framed, Dropped, Reject, Verdict,
};

/// Size limits applied before and while parsing; everything past them is refused.
///
/// The defaults suit GB/T 28181 and ordinary SIP: the largest legitimate messages
/// (catalog NOTIFYs, SDP with many codecs) stay well under 64 KiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Whole message (start line, headers, body), in bytes.
    pub max_message: usize,
    /// Number of header fields (a folded field counts once; a comma list counts once).
    pub max_headers: usize,
    /// One physical line of the start line or header section, in bytes, without its CRLF.
    pub max_line: usize,
    /// The header section of a framed (TCP) message, in bytes: where [`frame`] looks for
    /// its end, however large `max_message` is.
    pub max_head: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_message: 64 * 1024,
            max_headers: 256,
            max_line: 8 * 1024,
            max_head: 64 * 1024,
        }
    }
}

/// Everything that can be wrong with SIP bytes, or with an edit asked of the [`Editor`].
///
/// Each message says what was wrong and, where someone can act on it, what to do.
/// [`SipError::status`] and [`SipError::phrase`] give the answer to send when the
/// offending message was a request that can still be answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SipError {
    #[error("empty message (only CRLF keep-alives): nothing to parse, drop it")]
    Empty,
    #[error("message exceeds the {limit}-byte limit: refuse it, or raise `max_message` (UDP) or `max_tcp_message` (TCP) if such messages are legitimate")]
    TooLarge { limit: usize },
    #[error("message has more than {limit} header fields: refuse it, or raise `max_headers`")]
    TooManyHeaders { limit: usize },
    #[error("a header line is longer than {limit} bytes: refuse it, or raise `max_line`")]
    LineTooLong { limit: usize },
    #[error("the header section is not closed within {limit} bytes: refuse it; SIP headers take a few KB, whatever the body")]
    HeadTooLarge { limit: usize },
    #[error("header section is not closed by an empty line (CRLF CRLF): the sender is broken or the message was cut")]
    NoEmptyLine,
    #[error("bare CR or LF in the header section: SIP lines end in CRLF; the peer must be fixed")]
    BareLineBreak,
    #[error("malformed start line: {0}")]
    BadStartLine(&'static str),
    #[error("malformed header line: {0}")]
    BadHeaderLine(&'static str),
    #[error(
        "Content-Length is required on a stream transport (RFC 3261 §18.3): close the connection"
    )]
    ContentLengthMissing,
    #[error("more than one Content-Length: the body cannot be framed safely, refuse the message")]
    ContentLengthMultiple,
    #[error("Content-Length is not a decimal number: refuse the message")]
    ContentLengthInvalid,
    #[error("Content-Length says {declared} body bytes but only {available} arrived: refuse the message")]
    BodyTruncated { declared: usize, available: usize },
    #[error("bytes after the body of a framed message: pass exactly the bytes `frame` reported")]
    BodyOverrun,
    #[error("malformed URI: {0}")]
    BadUri(&'static str),
    #[error("URI scheme is not sip or sips: vgate routes only SIP URIs")]
    UnsupportedScheme,
    #[error("malformed Via: {0}")]
    BadVia(&'static str),
    #[error("malformed name-addr (From/To/Contact/Route): {0}")]
    BadNameAddr(&'static str),
    #[error("malformed header parameters: {0}")]
    BadParams(&'static str),
    #[error("malformed CSeq: {0}")]
    BadCSeq(&'static str),
    #[error("malformed Max-Forwards: must be a number from 0 to 255")]
    BadMaxForwards,
    #[error("not a GB/T 28181 ID: {0}")]
    BadGbId(&'static str),
    #[error("this edit applies to requests only, and the message is a response")]
    NotARequest,
    #[error("refusing to write {0}: it would inject or corrupt header lines")]
    UnsafeValue(&'static str),
}

impl SipError {
    /// Status code to answer a request that failed with this error.
    pub fn status(&self) -> u16 {
        match self {
            SipError::TooLarge { .. } | SipError::TooManyHeaders { .. } => 513,
            SipError::LineTooLong { .. } | SipError::HeadTooLarge { .. } => 513,
            SipError::UnsupportedScheme => 416,
            _ => 400,
        }
    }

    /// Reason phrase naming the problem, for the status line of that answer.
    pub fn phrase(&self) -> &'static str {
        match self {
            SipError::Empty => "Bad Request - Empty Message",
            SipError::TooLarge { .. } => "Message Too Large",
            SipError::TooManyHeaders { .. } => "Message Too Large - Too Many Headers",
            SipError::LineTooLong { .. } => "Message Too Large - Line Too Long",
            SipError::HeadTooLarge { .. } => "Message Too Large - Header Section Too Large",
            SipError::NoEmptyLine => "Bad Request - Header Section Not Terminated",
            SipError::BareLineBreak => "Bad Request - Bare CR or LF",
            SipError::BadStartLine(_) => "Bad Request - Malformed Request-Line",
            SipError::BadHeaderLine(_) => "Bad Request - Malformed Header Line",
            SipError::ContentLengthMissing => "Bad Request - Missing Content-Length",
            SipError::ContentLengthMultiple => "Bad Request - Multiple Content-Length",
            SipError::ContentLengthInvalid => "Bad Request - Invalid Content-Length",
            SipError::BodyTruncated { .. } => "Bad Request - Content-Length Larger Than Message",
            SipError::BodyOverrun => "Bad Request - Bytes After Body",
            SipError::BadUri(_) => "Bad Request - Malformed URI",
            SipError::UnsupportedScheme => "Unsupported URI Scheme",
            SipError::BadVia(_) => "Bad Request - Malformed Via",
            SipError::BadNameAddr(_) => "Bad Request - Malformed Address",
            SipError::BadParams(_) => "Bad Request - Malformed Parameters",
            SipError::BadCSeq(_) => "Bad Request - Malformed CSeq",
            SipError::BadMaxForwards => "Bad Request - Malformed Max-Forwards",
            SipError::BadGbId(_) => "Bad Request - Malformed GB/T 28181 ID",
            SipError::NotARequest | SipError::UnsafeValue(_) => "Server Internal Error",
        }
    }
}
