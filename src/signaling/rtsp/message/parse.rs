//! Parsing a framed message into borrowed slices: start line, headers, body, and the typed
//! header accessors of [`Message`].

use std::fmt;

use super::{build_response, Status};
use super::{scan_head, Limits};
use crate::signaling::rtsp::error::RtspError;

/// The first line of a message.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum StartLine<'a> {
    Request {
        method: &'a str,
        uri: &'a str,
        version: &'a str,
    },
    Response {
        version: &'a str,
        status: u16,
        reason: &'a str,
    },
}

/// Debug hides URL userinfo (`rtsp://user:password@host/`).
impl fmt::Debug for StartLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartLine::Request {
                method,
                uri,
                version,
            } => f
                .debug_struct("Request")
                .field("method", method)
                .field("uri", &redact_userinfo(uri))
                .field("version", version)
                .finish(),
            StartLine::Response {
                version,
                status,
                reason,
            } => f
                .debug_struct("Response")
                .field("version", version)
                .field("status", status)
                .field("reason", reason)
                .finish(),
        }
    }
}

/// `scheme://user:pass@host/...` → `scheme://***@host/...`.
pub(super) fn redact_userinfo(uri: &str) -> std::borrow::Cow<'_, str> {
    let Some((scheme, rest)) = uri.split_once("://") else {
        return uri.into();
    };
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    match authority.rsplit_once('@') {
        Some((_, host)) => {
            let tail = rest.get(authority.len()..).unwrap_or_default();
            format!("{scheme}://***@{host}{tail}").into()
        }
        None => uri.into(),
    }
}

/// One header line, borrowed from the message buffer.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Header<'a> {
    /// The name as the peer spelled it.
    pub name: &'a str,
    /// The value with surrounding whitespace trimmed.
    pub value: &'a str,
    /// The whole line, terminator included, for byte-exact re-emission.
    pub(super) line: &'a str,
}

/// Headers whose values carry credentials: never printed by `Debug`.
pub(super) const SECRET_HEADERS: [&str; 2] = ["authorization", "proxy-authorization"];

pub(super) fn is_secret_header(name: &str) -> bool {
    SECRET_HEADERS.iter().any(|s| s.eq_ignore_ascii_case(name))
}

/// Debug masks credential-bearing values (Basic is a reversible password).
impl fmt::Debug for Header<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = if is_secret_header(self.name) {
            "***"
        } else {
            self.value
        };
        f.debug_struct("Header")
            .field("name", &self.name)
            .field("value", &value)
            .finish()
    }
}

/// `Session: id[;timeout=n]` (RFC 2326 §12.37).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Session<'a> {
    pub id: &'a str,
    pub timeout: Option<u32>,
}

/// Start line and headers, parsed but body not yet attached.
pub(super) struct Head<'a> {
    pub(super) start: StartLine<'a>,
    pub(super) start_line: &'a str,
    pub(super) headers: Vec<Header<'a>>,
    pub(super) blank_line: &'a str,
    pub(super) content_length: usize,
}

impl<'a> Head<'a> {
    /// Parses a header block exactly as delimited by `scan_head`.
    pub(super) fn parse(bytes: &'a [u8], limits: &Limits) -> Result<Self, RtspError> {
        let text = std::str::from_utf8(bytes).map_err(|_| RtspError::NotUtf8)?;
        let mut lines = text
            .split_inclusive('\n')
            .skip_while(|line| line_content(line).is_empty());
        let start_line = lines
            .next()
            .ok_or(RtspError::BadStartLine { what: "start" })?;
        let start = parse_start_line(line_content(start_line))?;
        let mut headers = Vec::new();
        let mut blank_line = "";
        for line in lines {
            if line_content(line).is_empty() {
                blank_line = line;
                break;
            }
            if headers.len() >= limits.max_headers {
                return Err(RtspError::TooManyHeaders {
                    limit: limits.max_headers,
                });
            }
            headers.push(parse_header_line(line)?);
        }
        if blank_line.is_empty() {
            // scan_head guarantees an empty line; reaching here means the
            // caller passed a block that scan_head did not delimit.
            return Err(RtspError::FrameMismatch);
        }
        let content_length = parse_content_length(&headers, limits)?;
        Ok(Head {
            start,
            start_line,
            headers,
            blank_line,
            content_length,
        })
    }
}

/// A line without its `\n` or `\r\n` terminator.
pub(super) fn line_content(line: &str) -> &str {
    let line = line.strip_suffix('\n').unwrap_or(line);
    line.strip_suffix('\r').unwrap_or(line)
}

pub(super) fn parse_start_line(line: &str) -> Result<StartLine<'_>, RtspError> {
    if line.starts_with("RTSP/") {
        parse_status_line(line)
    } else {
        parse_request_line(line)
    }
}

pub(super) fn parse_request_line(line: &str) -> Result<StartLine<'_>, RtspError> {
    let bad = RtspError::BadStartLine { what: "request" };
    let mut parts = line.split(' ');
    let (Some(method), Some(uri), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad);
    };
    // A method starting with `$` would be framed as interleaved data.
    let starts_alpha = method.starts_with(|c: char| c.is_ascii_alphabetic());
    if !starts_alpha || !is_token(method) || uri.is_empty() || uri.chars().any(is_forbidden_in_uri)
    {
        return Err(bad);
    }
    if !is_rtsp_version(version) {
        return Err(bad);
    }
    Ok(StartLine::Request {
        method,
        uri,
        version,
    })
}

pub(super) fn parse_status_line(line: &str) -> Result<StartLine<'_>, RtspError> {
    let bad = RtspError::BadStartLine { what: "status" };
    let (version, rest) = line.split_once(' ').ok_or(bad.clone())?;
    let (code, reason) = rest.split_once(' ').unwrap_or((rest, ""));
    if !is_rtsp_version(version) || code.len() != 3 || !code.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad);
    }
    let status: u16 = code.parse().map_err(|_| bad.clone())?;
    if !(100..=599).contains(&status) || reason.chars().any(is_forbidden_in_value) {
        return Err(bad);
    }
    Ok(StartLine::Response {
        version,
        status,
        reason,
    })
}

/// `RTSP/<digit>.<digit>`; which versions to serve is the proxy's decision.
pub(super) fn is_rtsp_version(version: &str) -> bool {
    match version.strip_prefix("RTSP/").map(str::as_bytes) {
        Some(&[major, b'.', minor]) => major.is_ascii_digit() && minor.is_ascii_digit(),
        _ => false,
    }
}

pub(super) fn parse_header_line(line: &str) -> Result<Header<'_>, RtspError> {
    let content = line_content(line);
    if content.starts_with([' ', '\t']) {
        return Err(RtspError::FoldedHeader);
    }
    let (name, value) = content.split_once(':').ok_or(RtspError::BadHeaderLine)?;
    let value = value.trim_matches([' ', '\t']);
    if !is_token(name) || value.chars().any(is_forbidden_in_value) {
        return Err(RtspError::BadHeaderLine);
    }
    Ok(Header { name, value, line })
}

pub(super) fn parse_content_length(
    headers: &[Header<'_>],
    limits: &Limits,
) -> Result<usize, RtspError> {
    let mut values = headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("content-length"));
    let Some(first) = values.next() else {
        return Ok(0);
    };
    if values.next().is_some() {
        return Err(RtspError::DuplicateContentLength);
    }
    let len = parse_decimal(first.value).ok_or(RtspError::BadContentLength)?;
    if len > limits.max_body_bytes {
        return Err(RtspError::BodyTooLarge {
            len,
            limit: limits.max_body_bytes,
        });
    }
    Ok(len)
}

/// Plain ASCII digits only: `usize::from_str` would also accept `+5`.
pub(super) fn parse_decimal(s: &str) -> Option<usize> {
    if s.is_empty() || s.len() > 18 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// RFC 7230 `token`.
pub(crate) fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

pub(super) fn is_forbidden_in_value(c: char) -> bool {
    c.is_ascii_control() && c != '\t'
}

pub(super) fn is_forbidden_in_uri(c: char) -> bool {
    c.is_ascii_control() || c == ' '
}

/// A parsed RTSP message borrowing every field from the receive buffer.
#[derive(Clone)]
pub struct Message<'a> {
    pub(super) start: StartLine<'a>,
    pub(super) start_line: &'a str,
    pub(super) headers: Vec<Header<'a>>,
    pub(super) blank_line: &'a str,
    pub(super) body: &'a [u8],
}

impl<'a> Message<'a> {
    /// Parses exactly one message: `buf` must be the `Frame::Message(len)`
    /// bytes reported by [`next_frame`].
    pub fn parse(buf: &'a [u8], limits: &Limits) -> Result<Self, RtspError> {
        let head_len = scan_head(buf, limits)?.ok_or(RtspError::FrameMismatch)?;
        let (head_bytes, body) = buf
            .split_at_checked(head_len)
            .ok_or(RtspError::FrameMismatch)?;
        let head = Head::parse(head_bytes, limits)?;
        if body.len() != head.content_length {
            return Err(RtspError::FrameMismatch);
        }
        Ok(Message {
            start: head.start,
            start_line: head.start_line,
            headers: head.headers,
            blank_line: head.blank_line,
            body,
        })
    }

    pub fn start_line(&self) -> StartLine<'a> {
        self.start
    }

    /// The method, if this is a request.
    pub fn method(&self) -> Option<&'a str> {
        match self.start {
            StartLine::Request { method, .. } => Some(method),
            StartLine::Response { .. } => None,
        }
    }

    /// The Request-URI, if this is a request.
    pub fn uri(&self) -> Option<&'a str> {
        match self.start {
            StartLine::Request { uri, .. } => Some(uri),
            StartLine::Response { .. } => None,
        }
    }

    /// The status code, if this is a response.
    pub fn status(&self) -> Option<u16> {
        match self.start {
            StartLine::Response { status, .. } => Some(status),
            StartLine::Request { .. } => None,
        }
    }

    pub fn version(&self) -> &'a str {
        match self.start {
            StartLine::Request { version, .. } | StartLine::Response { version, .. } => version,
        }
    }

    /// All headers in wire order.
    pub fn headers(&self) -> &[Header<'a>] {
        &self.headers
    }

    pub fn body(&self) -> &'a [u8] {
        self.body
    }

    /// First value of a header, name compared case-insensitively.
    pub fn header(&self, name: &str) -> Option<&'a str> {
        self.headers_named(name).next()
    }

    /// Every value of a header, in wire order.
    pub fn headers_named<'s>(&'s self, name: &'s str) -> impl Iterator<Item = &'a str> + 's {
        self.headers
            .iter()
            .filter(move |h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
    }

    /// The raw CSeq value, for echoing into a response.
    pub fn cseq_raw(&self) -> Option<&'a str> {
        self.header("CSeq")
    }

    /// The CSeq as a number; requests without one get a 400.
    pub fn cseq(&self) -> Result<u32, RtspError> {
        let raw = self.cseq_raw().ok_or(RtspError::MissingCSeq)?;
        parse_decimal(raw)
            .and_then(|n| u32::try_from(n).ok())
            .ok_or(RtspError::MissingCSeq)
    }

    /// Body length as validated during parsing.
    pub fn content_length(&self) -> usize {
        self.body.len()
    }

    /// `Session` header split into id and timeout; `Ok(None)` when absent.
    pub fn session(&self) -> Result<Option<Session<'a>>, RtspError> {
        self.header("Session").map(parse_session).transpose()
    }

    pub fn content_base(&self) -> Option<&'a str> {
        self.header("Content-Base")
    }

    pub fn content_location(&self) -> Option<&'a str> {
        self.header("Content-Location")
    }

    pub fn rtp_info(&self) -> Option<&'a str> {
        self.header("RTP-Info")
    }

    pub fn transport(&self) -> Option<&'a str> {
        self.header("Transport")
    }

    pub fn authorization(&self) -> Option<&'a str> {
        self.header("Authorization")
    }

    /// Every `WWW-Authenticate` value (servers send one per scheme/algorithm).
    pub fn www_authenticate<'s>(&'s self) -> impl Iterator<Item = &'a str> + 's {
        self.headers_named("WWW-Authenticate")
    }

    /// A response to this request echoing its CSeq; see [`build_response`].
    pub fn respond(&self, status: Status, extra: &[(&str, &str)]) -> Result<Vec<u8>, RtspError> {
        build_response(self.cseq_raw(), status, extra)
    }
}

/// Debug without raw lines (they would bypass the masking of credentials).
impl fmt::Debug for Message<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Message")
            .field("start", &self.start)
            .field("headers", &self.headers)
            .field("body_len", &self.body.len())
            .finish()
    }
}

pub(super) const MAX_SESSION_ID: usize = 256;

pub(super) fn parse_session(value: &str) -> Result<Session<'_>, RtspError> {
    let mut parts = value.split(';');
    let id = parts.next().unwrap_or_default().trim();
    let id_ok = !id.is_empty()
        && id.len() <= MAX_SESSION_ID
        && id
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b',' && b != b'"');
    if !id_ok {
        return Err(RtspError::BadSession);
    }
    let mut timeout = None;
    for param in parts {
        let (name, val) = param.split_once('=').unwrap_or((param, ""));
        if name.trim().eq_ignore_ascii_case("timeout") {
            let secs = parse_decimal(val.trim())
                .and_then(|n| u32::try_from(n).ok())
                .ok_or(RtspError::BadSession)?;
            timeout = Some(secs);
        }
    }
    Ok(Session { id, timeout })
}
