//! RTSP/1.0 stream framing, zero-copy message views, and a byte-preserving editor.
//!
//! Owns: cutting a TCP byte stream into messages and interleaved `$` frames
//! ([`next_frame`]), parsing a message into borrowed slices ([`Message`]),
//! typed access to the headers the proxy needs, rewriting a message so that
//! every header it did not touch comes out byte-for-byte ([`Editor`]), and
//! building the small error responses the proxy sends itself
//! ([`build_response`]).
//!
//! Does not own: what a URL means (`url.rs`), what a Transport header means
//! (`transport.rs`), credentials (`auth.rs`), or any I/O.
//!
//! Framing rules (RFC 2326 §4, RFC 7826 §8): a message is a start line and
//! headers ending with an empty line (CRLF, bare LF tolerated), then exactly
//! `Content-Length` bytes of body (no Content-Length means no body — RTSP,
//! unlike HTTP/1.0, never reads to connection close). Everything is bounded by
//! [`Limits`] *before* the whole message has arrived, so a peer can never make
//! the proxy buffer more than the limits allow.

use std::fmt;

use crate::signaling::rtsp::error::RtspError;

/// Size limits applied while framing; a peer exceeding them is cut off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Start line + headers + the empty line (leading empty lines included).
    pub max_header_bytes: usize,
    /// Header lines, start line not counted.
    pub max_headers: usize,
    /// Body bytes as announced by `Content-Length`.
    pub max_body_bytes: usize,
    /// Any single line, terminator not counted.
    pub max_line_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_header_bytes: 16 * 1024,
            max_headers: 128,
            max_body_bytes: 64 * 1024,
            max_line_bytes: 8 * 1024,
        }
    }
}

/// What the front of a receive buffer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame {
    /// A complete RTSP message of this many bytes (feed exactly them to
    /// [`Message::parse`]).
    Message(usize),
    /// A complete interleaved binary frame: `$`, `channel`, a 16-bit length,
    /// then `len` payload bytes. The frame occupies `4 + len` bytes; see
    /// [`Frame::wire_len`] and [`interleaved_payload`].
    Interleaved { channel: u8, len: usize },
    /// Empty-line bytes (CR/LF) between frames: discard this many. RFC 2326
    /// allows empty lines before a message; reporting them separately keeps
    /// a `$` frame that follows them from being mistaken for a message.
    Skip(usize),
    /// Not enough bytes yet; read more and call again with the grown buffer.
    Incomplete,
}

impl Frame {
    /// How many bytes to consume from the buffer for this frame, if complete.
    pub fn wire_len(&self) -> Option<usize> {
        match *self {
            Frame::Message(len) | Frame::Skip(len) => Some(len),
            Frame::Interleaved { len, .. } => Some(INTERLEAVED_HEADER + len),
            Frame::Incomplete => None,
        }
    }
}

const INTERLEAVED_HEADER: usize = 4;

/// Decides what the front of `buf` is, without copying it.
///
/// Never panics and never asks for more than `limits` allow: a header block
/// that is already too large, or a line too long, is an error even while the
/// message is still incomplete.
pub fn next_frame(buf: &[u8], limits: &Limits) -> Result<Frame, RtspError> {
    match buf.first() {
        None => Ok(Frame::Incomplete),
        Some(b'$') => Ok(interleaved_frame(buf)),
        Some(b'\r' | b'\n') => Ok(Frame::Skip(
            buf.iter()
                .take_while(|&&b| b == b'\r' || b == b'\n')
                .count(),
        )),
        Some(_) => message_frame(buf, limits),
    }
}

/// The payload of a complete interleaved frame at the front of `buf`.
pub fn interleaved_payload(buf: &[u8]) -> Option<&[u8]> {
    match interleaved_frame(buf) {
        Frame::Interleaved { len, .. } => buf.get(INTERLEAVED_HEADER..INTERLEAVED_HEADER + len),
        _ => None,
    }
}

fn interleaved_frame(buf: &[u8]) -> Frame {
    let Some(&[b'$', channel, hi, lo]) = buf.get(..INTERLEAVED_HEADER) else {
        return Frame::Incomplete;
    };
    let len = usize::from(u16::from_be_bytes([hi, lo]));
    if buf.len() < INTERLEAVED_HEADER + len {
        return Frame::Incomplete;
    }
    Frame::Interleaved { channel, len }
}

fn message_frame(buf: &[u8], limits: &Limits) -> Result<Frame, RtspError> {
    let Some(head_len) = scan_head(buf, limits)? else {
        return Ok(Frame::Incomplete);
    };
    let head = Head::parse(buf.get(..head_len).unwrap_or_default(), limits)?;
    let total = head_len
        .checked_add(head.content_length)
        .ok_or(RtspError::BadContentLength)?;
    if buf.len() < total {
        return Ok(Frame::Incomplete);
    }
    Ok(Frame::Message(total))
}

/// Finds the end of the header block (just past the empty line), enforcing
/// the limits on what has arrived so far. `Ok(None)` means "need more bytes".
fn scan_head(buf: &[u8], limits: &Limits) -> Result<Option<usize>, RtspError> {
    let mut pos = 0usize;
    let mut header_lines = 0usize;
    let mut seen_start_line = false;
    loop {
        let rest = buf.get(pos..).unwrap_or_default();
        let Some(newline) = rest.iter().position(|&b| b == b'\n') else {
            if rest.len() > limits.max_line_bytes {
                return Err(RtspError::LineTooLong {
                    limit: limits.max_line_bytes,
                });
            }
            if buf.len() > limits.max_header_bytes {
                return Err(RtspError::HeaderTooLarge {
                    limit: limits.max_header_bytes,
                });
            }
            return Ok(None);
        };
        let content_len = match newline.checked_sub(1).and_then(|i| rest.get(i)) {
            Some(b'\r') => newline - 1,
            _ => newline,
        };
        if content_len > limits.max_line_bytes {
            return Err(RtspError::LineTooLong {
                limit: limits.max_line_bytes,
            });
        }
        pos += newline + 1;
        if pos > limits.max_header_bytes {
            return Err(RtspError::HeaderTooLarge {
                limit: limits.max_header_bytes,
            });
        }
        if content_len == 0 {
            if seen_start_line {
                return Ok(Some(pos));
            }
            // Only reachable from `Message::parse` (next_frame reports them as
            // `Skip`); tolerated and counted against max_header_bytes.
            continue;
        }
        if seen_start_line {
            header_lines += 1;
            if header_lines > limits.max_headers {
                return Err(RtspError::TooManyHeaders {
                    limit: limits.max_headers,
                });
            }
        }
        seen_start_line = true;
    }
}

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
fn redact_userinfo(uri: &str) -> std::borrow::Cow<'_, str> {
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
    line: &'a str,
}

/// Headers whose values carry credentials: never printed by `Debug`.
const SECRET_HEADERS: [&str; 2] = ["authorization", "proxy-authorization"];

fn is_secret_header(name: &str) -> bool {
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
struct Head<'a> {
    start: StartLine<'a>,
    start_line: &'a str,
    headers: Vec<Header<'a>>,
    blank_line: &'a str,
    content_length: usize,
}

impl<'a> Head<'a> {
    /// Parses a header block exactly as delimited by `scan_head`.
    fn parse(bytes: &'a [u8], limits: &Limits) -> Result<Self, RtspError> {
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
fn line_content(line: &str) -> &str {
    let line = line.strip_suffix('\n').unwrap_or(line);
    line.strip_suffix('\r').unwrap_or(line)
}

fn parse_start_line(line: &str) -> Result<StartLine<'_>, RtspError> {
    if line.starts_with("RTSP/") {
        parse_status_line(line)
    } else {
        parse_request_line(line)
    }
}

fn parse_request_line(line: &str) -> Result<StartLine<'_>, RtspError> {
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

fn parse_status_line(line: &str) -> Result<StartLine<'_>, RtspError> {
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
fn is_rtsp_version(version: &str) -> bool {
    match version.strip_prefix("RTSP/").map(str::as_bytes) {
        Some(&[major, b'.', minor]) => major.is_ascii_digit() && minor.is_ascii_digit(),
        _ => false,
    }
}

fn parse_header_line(line: &str) -> Result<Header<'_>, RtspError> {
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

fn parse_content_length(headers: &[Header<'_>], limits: &Limits) -> Result<usize, RtspError> {
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
fn parse_decimal(s: &str) -> Option<usize> {
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

fn is_forbidden_in_value(c: char) -> bool {
    c.is_ascii_control() && c != '\t'
}

fn is_forbidden_in_uri(c: char) -> bool {
    c.is_ascii_control() || c == ' '
}

/// A parsed RTSP message borrowing every field from the receive buffer.
#[derive(Clone)]
pub struct Message<'a> {
    start: StartLine<'a>,
    start_line: &'a str,
    headers: Vec<Header<'a>>,
    blank_line: &'a str,
    body: &'a [u8],
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

const MAX_SESSION_ID: usize = 256;

fn parse_session(value: &str) -> Result<Session<'_>, RtspError> {
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

/// A status code with its reason phrase, for responses vgate writes itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    pub code: u16,
    pub reason: &'static str,
}

impl Status {
    pub const OK: Status = Status::new(200, "OK");
    pub const BAD_REQUEST: Status = Status::new(400, "Bad Request");
    pub const UNAUTHORIZED: Status = Status::new(401, "Unauthorized");
    pub const FORBIDDEN: Status = Status::new(403, "Forbidden");
    pub const NOT_FOUND: Status = Status::new(404, "Not Found");
    pub const NOT_ENOUGH_BANDWIDTH: Status = Status::new(453, "Not Enough Bandwidth");
    pub const SESSION_NOT_FOUND: Status = Status::new(454, "Session Not Found");
    pub const UNSUPPORTED_TRANSPORT: Status = Status::new(461, "Unsupported Transport");
    pub const INTERNAL_SERVER_ERROR: Status = Status::new(500, "Internal Server Error");
    pub const SERVICE_UNAVAILABLE: Status = Status::new(503, "Service Unavailable");
    pub const VERSION_NOT_SUPPORTED: Status = Status::new(505, "RTSP Version Not Supported");

    pub const fn new(code: u16, reason: &'static str) -> Self {
        Status { code, reason }
    }
}

/// Builds `RTSP/1.0 <code> <reason>` with `CSeq` (when known) and `extra`
/// headers, no body. `cseq` is `None` when the request was too broken to
/// carry one (then the 400 goes out without it, as RFC 2326 allows).
pub fn build_response(
    cseq: Option<&str>,
    status: Status,
    extra: &[(&str, &str)],
) -> Result<Vec<u8>, RtspError> {
    let mut out = Vec::with_capacity(128);
    if status.reason.chars().any(is_forbidden_in_value) || !(100..=599).contains(&status.code) {
        return Err(RtspError::HeaderInjection);
    }
    out.extend_from_slice(format!("RTSP/1.0 {} {}\r\n", status.code, status.reason).as_bytes());
    if let Some(cseq) = cseq {
        push_header(&mut out, "CSeq", cseq)?;
    }
    for (name, value) in extra {
        push_header(&mut out, name, value)?;
    }
    out.extend_from_slice(b"\r\n");
    Ok(out)
}

fn push_header(out: &mut Vec<u8>, name: &str, value: &str) -> Result<(), RtspError> {
    check_header(name, value)?;
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value.as_bytes());
    out.extend_from_slice(b"\r\n");
    Ok(())
}

fn check_header(name: &str, value: &str) -> Result<(), RtspError> {
    if !is_token(name) || value.chars().any(is_forbidden_in_value) {
        return Err(RtspError::HeaderInjection);
    }
    Ok(())
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Edit {
    Keep,
    Replace(String),
    Remove,
}

/// Rewrites a parsed message; everything not edited is copied byte-for-byte.
///
/// Content-Length is managed here (it follows [`Editor::set_body`]); editing
/// it by hand is refused because a wrong length desynchronises the stream.
#[derive(Clone)]
pub struct Editor<'m, 'a> {
    msg: &'m Message<'a>,
    uri: Option<String>,
    edits: Vec<Edit>,
    appended: Vec<(String, String)>,
    body: Option<Vec<u8>>,
}

impl<'m, 'a> Editor<'m, 'a> {
    pub fn new(msg: &'m Message<'a>) -> Self {
        Editor {
            msg,
            uri: None,
            edits: vec![Edit::Keep; msg.headers.len()],
            appended: Vec::new(),
            body: None,
        }
    }

    /// Replaces the Request-URI (requests only).
    pub fn set_uri(&mut self, uri: &str) -> Result<&mut Self, RtspError> {
        if self.msg.uri().is_none() {
            return Err(RtspError::BadStartLine { what: "request" });
        }
        if uri.is_empty() || uri.chars().any(is_forbidden_in_uri) {
            return Err(RtspError::HeaderInjection);
        }
        self.uri = Some(uri.to_owned());
        Ok(self)
    }

    /// Sets a header: the first occurrence gets `value`, later occurrences go,
    /// and if there was none it is appended.
    pub fn set_header(&mut self, name: &str, value: &str) -> Result<&mut Self, RtspError> {
        check_editable(name, value)?;
        let mut found = false;
        for (header, edit) in self.msg.headers.iter().zip(self.edits.iter_mut()) {
            if header.name.eq_ignore_ascii_case(name) {
                *edit = if found {
                    Edit::Remove
                } else {
                    Edit::Replace(value.to_owned())
                };
                found = true;
            }
        }
        if !found {
            self.appended.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
            self.appended.push((name.to_owned(), value.to_owned()));
        }
        Ok(self)
    }

    /// Replaces the value of the `index`-th header of [`Message::headers`]
    /// (for headers that legitimately repeat, such as WWW-Authenticate).
    pub fn replace_header_at(&mut self, index: usize, value: &str) -> Result<&mut Self, RtspError> {
        self.edit_at(index, value, Edit::Replace(value.to_owned()))
    }

    /// Removes every occurrence of a header.
    pub fn remove_header(&mut self, name: &str) -> Result<&mut Self, RtspError> {
        check_editable(name, "")?;
        for (header, edit) in self.msg.headers.iter().zip(self.edits.iter_mut()) {
            if header.name.eq_ignore_ascii_case(name) {
                *edit = Edit::Remove;
            }
        }
        self.appended.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        Ok(self)
    }

    /// Removes the `index`-th header of [`Message::headers`].
    pub fn remove_header_at(&mut self, index: usize) -> Result<&mut Self, RtspError> {
        self.edit_at(index, "", Edit::Remove)
    }

    fn edit_at(&mut self, index: usize, value: &str, new: Edit) -> Result<&mut Self, RtspError> {
        let header = self.msg.headers.get(index).ok_or(RtspError::HeaderIndex)?;
        check_editable(header.name, value)?;
        let edit = self.edits.get_mut(index).ok_or(RtspError::HeaderIndex)?;
        *edit = new;
        Ok(self)
    }

    /// Adds a header after the existing ones, even if one of that name exists.
    pub fn insert_header(&mut self, name: &str, value: &str) -> Result<&mut Self, RtspError> {
        check_editable(name, value)?;
        self.appended.push((name.to_owned(), value.to_owned()));
        Ok(self)
    }

    /// Replaces the body; Content-Length follows (added if it was absent and
    /// the body is not empty, rewritten in place otherwise).
    pub fn set_body(&mut self, body: Vec<u8>) -> &mut Self {
        self.body = Some(body);
        self
    }

    /// The rewritten message.
    pub fn to_bytes(&self) -> Vec<u8> {
        let body = self.body.as_deref().unwrap_or(self.msg.body);
        let mut out =
            Vec::with_capacity(self.msg.start_line.len() + 64 * self.edits.len() + body.len());
        self.write_start_line(&mut out);
        let new_length = self.body.as_ref().map(|b| b.len().to_string());
        let mut wrote_length = false;
        for (header, edit) in self.msg.headers.iter().zip(&self.edits) {
            let is_length = header.name.eq_ignore_ascii_case("content-length");
            match (edit, &new_length) {
                (_, Some(len)) if is_length => {
                    write_line(&mut out, header.name, len);
                    wrote_length = true;
                }
                (Edit::Keep, _) => out.extend_from_slice(header.line.as_bytes()),
                (Edit::Replace(value), _) => write_line(&mut out, header.name, value),
                (Edit::Remove, _) => {}
            }
        }
        for (name, value) in &self.appended {
            write_line(&mut out, name, value);
        }
        if let (Some(len), false) = (&new_length, wrote_length) {
            if !body.is_empty() {
                write_line(&mut out, "Content-Length", len);
            }
        }
        out.extend_from_slice(self.msg.blank_line.as_bytes());
        out.extend_from_slice(body);
        out
    }

    fn write_start_line(&self, out: &mut Vec<u8>) {
        match (&self.uri, self.msg.start) {
            (
                Some(uri),
                StartLine::Request {
                    method, version, ..
                },
            ) => {
                out.extend_from_slice(format!("{method} {uri} {version}\r\n").as_bytes());
            }
            _ => out.extend_from_slice(self.msg.start_line.as_bytes()),
        }
    }
}

/// Debug shows what is being changed, not new values (they may be credentials).
impl fmt::Debug for Editor<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let changed = self.edits.iter().filter(|e| **e != Edit::Keep).count();
        let appended: Vec<&str> = self.appended.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("Editor")
            .field("msg", self.msg)
            .field("uri", &self.uri)
            .field("changed_headers", &changed)
            .field("appended", &appended)
            .field("body_replaced", &self.body.is_some())
            .finish()
    }
}

fn check_editable(name: &str, value: &str) -> Result<(), RtspError> {
    check_header(name, value)?;
    if name.eq_ignore_ascii_case("content-length") {
        // The editor owns Content-Length; see `Editor::set_body`.
        return Err(RtspError::HeaderInjection);
    }
    Ok(())
}

fn write_line(out: &mut Vec<u8>, name: &str, value: &str) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value.as_bytes());
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    const DESCRIBE: &[u8] = b"DESCRIBE rtsp://10.0.0.5:8554/test RTSP/1.0\r\nCSeq: 2\r\nUser-Agent: x\r\nAccept: application/sdp\r\n\r\n";

    fn lim() -> Limits {
        Limits::default()
    }

    #[test]
    fn frames_request_without_body() {
        assert_eq!(
            next_frame(DESCRIBE, &lim()),
            Ok(Frame::Message(DESCRIBE.len()))
        );
        for cut in 0..DESCRIBE.len() {
            assert_eq!(
                next_frame(&DESCRIBE[..cut], &lim()),
                Ok(Frame::Incomplete),
                "cut {cut}"
            );
        }
    }

    #[test]
    fn frames_body_by_content_length_and_tolerates_bare_lf() {
        let msg = b"RTSP/1.0 200 OK\nCSeq: 3\nContent-Length: 4\n\nabcdEXTRA";
        assert_eq!(next_frame(msg, &lim()), Ok(Frame::Message(msg.len() - 5)));
        let m = Message::parse(&msg[..msg.len() - 5], &lim()).unwrap();
        assert_eq!(m.body(), b"abcd");
        assert_eq!(m.status(), Some(200));
        assert_eq!(m.cseq(), Ok(3));
        assert_eq!(
            next_frame(&msg[..msg.len() - 6], &lim()),
            Ok(Frame::Incomplete)
        );
    }

    #[test]
    fn frames_interleaved() {
        let buf = [b'$', 1, 0, 3, 9, 8, 7, b'R'];
        assert_eq!(
            next_frame(&buf, &lim()),
            Ok(Frame::Interleaved { channel: 1, len: 3 })
        );
        assert_eq!(
            Frame::Interleaved { channel: 1, len: 3 }.wire_len(),
            Some(7)
        );
        assert_eq!(interleaved_payload(&buf), Some(&[9u8, 8, 7][..]));
        assert_eq!(next_frame(&buf[..6], &lim()), Ok(Frame::Incomplete));
        assert_eq!(next_frame(&buf[..2], &lim()), Ok(Frame::Incomplete));
    }

    #[test]
    fn empty_lines_between_frames_are_skipped() {
        let mut buf = b"\r\n\n".to_vec();
        buf.extend_from_slice(DESCRIBE);
        assert_eq!(next_frame(&buf, &lim()), Ok(Frame::Skip(3)));
        assert_eq!(
            next_frame(&buf[3..], &lim()),
            Ok(Frame::Message(DESCRIBE.len()))
        );
        assert_eq!(next_frame(b"\r\n$\x00\x00\x00", &lim()), Ok(Frame::Skip(2)));
        // Message::parse itself tolerates them too.
        let m = Message::parse(&buf, &lim()).unwrap();
        assert_eq!(m.method(), Some("DESCRIBE"));
        let dollar = b"$OPTIONS * RTSP/1.0\r\n\r\n";
        assert!(Message::parse(dollar, &lim()).is_err());
    }

    #[test]
    fn limits_apply_before_the_message_is_complete() {
        let small = Limits {
            max_header_bytes: 64,
            max_headers: 2,
            max_body_bytes: 10,
            max_line_bytes: 40,
        };
        let long_line = [b'A'; 41];
        assert_eq!(
            next_frame(&long_line, &small),
            Err(RtspError::LineTooLong { limit: 40 })
        );
        let many = b"OPTIONS * RTSP/1.0\r\nA: 1\r\nB: 2\r\nC: 3\r\n";
        assert_eq!(
            next_frame(many, &small),
            Err(RtspError::TooManyHeaders { limit: 2 })
        );
        let big = b"OPTIONS * RTSP/1.0\r\nA: 11111111111111111111\r\nB: 22222222222222222222";
        assert_eq!(
            next_frame(big, &small),
            Err(RtspError::HeaderTooLarge { limit: 64 })
        );
        let body = b"OPTIONS * RTSP/1.0\r\nContent-Length: 11\r\n\r\n";
        assert_eq!(
            next_frame(body, &small),
            Err(RtspError::BodyTooLarge { len: 11, limit: 10 })
        );
    }

    #[test]
    fn refuses_smuggling_shapes() {
        let dup = b"OPTIONS * RTSP/1.0\r\nContent-Length: 1\r\ncontent-length: 1\r\n\r\nx";
        assert_eq!(
            next_frame(dup, &lim()),
            Err(RtspError::DuplicateContentLength)
        );
        let plus = b"OPTIONS * RTSP/1.0\r\nContent-Length: +1\r\n\r\nx";
        assert_eq!(next_frame(plus, &lim()), Err(RtspError::BadContentLength));
        let fold = b"OPTIONS * RTSP/1.0\r\nCSeq: 1\r\n Content-Length: 1\r\n\r\nx";
        assert_eq!(next_frame(fold, &lim()), Err(RtspError::FoldedHeader));
        let colon = b"OPTIONS * RTSP/1.0\r\nCSeq 1\r\n\r\n";
        assert_eq!(next_frame(colon, &lim()), Err(RtspError::BadHeaderLine));
        let ctl = b"OPTIONS * RTSP/1.0\r\nCSeq: 1\rX: 2\r\n\r\n";
        assert_eq!(next_frame(ctl, &lim()), Err(RtspError::BadHeaderLine));
    }

    #[test]
    fn parses_start_lines() {
        let bad = [
            &b"DESCRIBE rtsp://x RTSP/1.0 extra\r\n\r\n"[..],
            b"DESCRIBE  rtsp://x RTSP/1.0\r\n\r\n",
            b"DESCRIBE rtsp://x HTTP/1.1\r\n\r\n",
            b"RTSP/1.0 20 OK\r\n\r\n",
            b"RTSP/1.0 2000 OK\r\n\r\n",
            b"RTSP/10 200 OK\r\n\r\n",
        ];
        for b in bad {
            assert!(
                matches!(next_frame(b, &lim()), Err(RtspError::BadStartLine { .. })),
                "{b:?}"
            );
        }
        let m = Message::parse(b"RTSP/1.0 454 Session Not Found\r\n\r\n", &lim()).unwrap();
        assert_eq!(
            m.start_line(),
            StartLine::Response {
                version: "RTSP/1.0",
                status: 454,
                reason: "Session Not Found"
            }
        );
        let m = Message::parse(b"RTSP/1.0 200\r\n\r\n", &lim()).unwrap();
        assert_eq!(m.status(), Some(200));
    }

    #[test]
    fn typed_headers() {
        let raw = b"RTSP/1.0 200 OK\r\ncseq: 7\r\nsession:  abcDEF-1.2;timeout=60 \r\nContent-Base: rtsp://h/t/\r\nWWW-Authenticate: Basic realm=\"a\"\r\nWWW-Authenticate: Digest realm=\"a\", nonce=\"n\"\r\n\r\n";
        let m = Message::parse(raw, &lim()).unwrap();
        assert_eq!(m.cseq(), Ok(7));
        assert_eq!(
            m.session(),
            Ok(Some(Session {
                id: "abcDEF-1.2",
                timeout: Some(60)
            }))
        );
        assert_eq!(m.content_base(), Some("rtsp://h/t/"));
        assert_eq!(m.www_authenticate().count(), 2);
        assert_eq!(m.content_location(), None);
        let bad =
            Message::parse(b"RTSP/1.0 200 OK\r\nSession: ;timeout=1\r\n\r\n", &lim()).unwrap();
        assert_eq!(bad.session(), Err(RtspError::BadSession));
        let bad =
            Message::parse(b"RTSP/1.0 200 OK\r\nSession: a;timeout=x\r\n\r\n", &lim()).unwrap();
        assert_eq!(bad.session(), Err(RtspError::BadSession));
    }

    #[test]
    fn parse_requires_exact_frame() {
        let mut extra = DESCRIBE.to_vec();
        extra.push(b'X');
        assert_eq!(
            Message::parse(&extra, &lim()).unwrap_err(),
            RtspError::FrameMismatch
        );
        assert_eq!(
            Message::parse(&DESCRIBE[..10], &lim()).unwrap_err(),
            RtspError::FrameMismatch
        );
    }

    #[test]
    fn editor_keeps_untouched_lines_byte_for_byte() {
        let raw = b"SETUP rtsp://gw/cam1/stream=0 RTSP/1.0\r\nCSeq:3\r\nX-Odd:   spaced  \nTransport: RTP/AVP;unicast;client_port=5000-5001\r\nUser-Agent: t\r\n\r\n";
        let m = Message::parse(raw, &lim()).unwrap();
        let mut e = Editor::new(&m);
        e.set_uri("rtsp://10.0.0.5:8554/test/stream=0").unwrap();
        e.set_header("transport", "RTP/AVP;unicast;client_port=40000-40001")
            .unwrap();
        e.remove_header("User-Agent").unwrap();
        e.insert_header("Via", "RTSP/1.0 vgate").unwrap();
        assert_eq!(
            String::from_utf8(e.to_bytes()).unwrap(),
            "SETUP rtsp://10.0.0.5:8554/test/stream=0 RTSP/1.0\r\nCSeq:3\r\nX-Odd:   spaced  \nTransport: RTP/AVP;unicast;client_port=40000-40001\r\nVia: RTSP/1.0 vgate\r\n\r\n"
        );
        assert_eq!(Editor::new(&m).to_bytes(), raw.to_vec());
    }

    #[test]
    fn editor_body_updates_content_length() {
        let raw = b"RTSP/1.0 200 OK\r\nCSeq: 2\r\nContent-Length: 3\r\nX: y\r\n\r\nabc";
        let m = Message::parse(raw, &lim()).unwrap();
        let mut e = Editor::new(&m);
        e.set_body(b"hello".to_vec());
        assert_eq!(
            e.to_bytes(),
            b"RTSP/1.0 200 OK\r\nCSeq: 2\r\nContent-Length: 5\r\nX: y\r\n\r\nhello".to_vec()
        );
        let raw = b"RTSP/1.0 200 OK\r\nCSeq: 2\r\n\r\n";
        let m = Message::parse(raw, &lim()).unwrap();
        let mut e = Editor::new(&m);
        e.set_body(b"v=0\r\n".to_vec());
        assert_eq!(
            e.to_bytes(),
            b"RTSP/1.0 200 OK\r\nCSeq: 2\r\nContent-Length: 5\r\n\r\nv=0\r\n".to_vec()
        );
    }

    #[test]
    fn editor_refuses_injection_and_manual_content_length() {
        let m = Message::parse(DESCRIBE, &lim()).unwrap();
        let mut e = Editor::new(&m);
        assert_eq!(
            e.set_header("X", "a\r\nContent-Length: 9").unwrap_err(),
            RtspError::HeaderInjection
        );
        assert_eq!(
            e.set_uri("rtsp://a b").unwrap_err(),
            RtspError::HeaderInjection
        );
        assert_eq!(
            e.set_header("Content-Length", "1").unwrap_err(),
            RtspError::HeaderInjection
        );
        assert_eq!(
            e.set_header("Bad Name", "1").unwrap_err(),
            RtspError::HeaderInjection
        );
        assert_eq!(Editor::new(&m).to_bytes(), DESCRIBE.to_vec());
    }

    #[test]
    fn debug_masks_credentials() {
        let raw = b"DESCRIBE rtsp://u:pw42@h/ RTSP/1.0\r\nCSeq: 1\r\nAuthorization: Basic YWxpY2U6czNjcmV0\r\n\r\n";
        let m = Message::parse(raw, &lim()).unwrap();
        let mut e = Editor::new(&m);
        e.set_header("Proxy-Authorization", "Basic Ym9iOmh1bnRlcjI=")
            .unwrap();
        let dbg = format!("{m:?} {e:?}");
        assert!(
            !dbg.contains("YWxpY2U6czNjcmV0") && !dbg.contains("Ym9iOmh1bnRlcjI="),
            "{dbg}"
        );
        assert!(
            !dbg.contains("pw42") && dbg.contains("rtsp://***@h/"),
            "{dbg}"
        );
    }

    #[test]
    fn builds_responses() {
        let m = Message::parse(DESCRIBE, &lim()).unwrap();
        let r = m
            .respond(
                Status::UNAUTHORIZED,
                &[("WWW-Authenticate", "Basic realm=\"vgate\"")],
            )
            .unwrap();
        assert_eq!(
            r,
            b"RTSP/1.0 401 Unauthorized\r\nCSeq: 2\r\nWWW-Authenticate: Basic realm=\"vgate\"\r\n\r\n".to_vec()
        );
        assert_eq!(
            build_response(None, Status::BAD_REQUEST, &[]).unwrap(),
            b"RTSP/1.0 400 Bad Request\r\n\r\n".to_vec()
        );
        for s in [
            Status::NOT_ENOUGH_BANDWIDTH,
            Status::SESSION_NOT_FOUND,
            Status::UNSUPPORTED_TRANSPORT,
            Status::INTERNAL_SERVER_ERROR,
            Status::SERVICE_UNAVAILABLE,
        ] {
            let r = m.respond(s, &[]).unwrap();
            let parsed = Message::parse(&r, &lim()).unwrap();
            assert_eq!(parsed.status(), Some(s.code));
            assert_eq!(parsed.cseq(), Ok(2));
        }
        assert!(build_response(Some("1\r\nX: y"), Status::OK, &[]).is_err());
    }
}
