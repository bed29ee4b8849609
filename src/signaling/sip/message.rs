//! The message itself: start line, header fields and the body framed by Content-Length.
//!
//! [`SipMessage::parse_datagram`] reads one UDP datagram, [`frame`] finds message
//! boundaries in a TCP stream and [`SipMessage::parse_framed`] reads what it found.
//! Parsing is structural: it checks what is needed to find every field and the body,
//! and nothing about what the fields mean; `validate.rs` decides that. So a request
//! with, say, a malformed CSeq still parses, and can be answered with 400.

use std::ops::Range;

use super::headers::{parse_content_length, same_name, CSeq, NameAddr, Via};
use super::lex::{
    eq_ic, find_byte, find_seq, first, is_lws, is_token, is_token_char, rest, split_at, take_while,
    trim_lws, trim_lws_end, CommaValues,
};
use super::{Limits, SipError};

const CRLF: &[u8] = b"\r\n";
const EMPTY_LINE: &[u8] = b"\r\n\r\n";

/// The first line of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartLine<'a> {
    Request {
        method: &'a [u8],
        uri: &'a [u8],
        version: &'a [u8],
    },
    Response {
        version: &'a [u8],
        code: u16,
        reason: &'a [u8],
    },
}

/// One header field as received: `name`, its `value` (folding kept, outer LWS
/// trimmed) and where the whole field sits in the message, for the editor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header<'a> {
    name: &'a [u8],
    value: &'a [u8],
    /// From the first byte of the name to the end of the field's final CRLF.
    field: Range<usize>,
    /// Where `value` starts (equal to the CRLF position when the value is empty).
    value_start: usize,
}

impl<'a> Header<'a> {
    /// The name as written (`v`, `VIA`, `Via`...).
    pub fn name(&self) -> &'a [u8] {
        self.name
    }

    /// The value as written, folding included, outer whitespace trimmed.
    pub fn value(&self) -> &'a [u8] {
        self.value
    }

    /// Whether this is the header `name`, comparing case-insensitively and treating
    /// compact forms as their full names (`is("Via")` is true for `v:`).
    pub fn is(&self, name: &str) -> bool {
        same_name(self.name, name.as_bytes())
    }

    /// Byte range of the whole field (name to final CRLF) in [`Head::raw`].
    pub fn field_range(&self) -> Range<usize> {
        self.field.clone()
    }

    pub(crate) fn value_start(&self) -> usize {
        self.value_start
    }
}

/// Start line and header fields of a message, as views into the received bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head<'a> {
    /// The message from the start line on (leading keep-alive CRLFs dropped).
    raw: &'a [u8],
    start: StartLine<'a>,
    /// End of the start line, CRLF included.
    start_end: usize,
    /// Where the Request-URI sits in `raw` (requests only).
    uri_range: Option<Range<usize>>,
    headers: Vec<Header<'a>>,
    /// Length through the empty line that ends the headers.
    len: usize,
}

impl<'a> Head<'a> {
    /// Parses start line and header lines in `raw[..fields_end]`, where `fields_end` is
    /// just past the CRLF of the last header line.
    fn parse(raw: &'a [u8], fields_end: usize, limits: &Limits) -> Result<Head<'a>, SipError> {
        let (start_line, start_end, headers) = parse_fields(raw, fields_end, limits)?;
        let (start, uri_range) = parse_start_line(raw, start_line)?;
        Ok(Head {
            raw,
            start,
            start_end,
            uri_range,
            headers,
            len: fields_end + CRLF.len(),
        })
    }

    pub fn start(&self) -> &StartLine<'a> {
        &self.start
    }

    /// The bytes this head was parsed from (start line first; the body may follow).
    pub fn raw(&self) -> &'a [u8] {
        self.raw
    }

    /// Length of the head, through the empty line.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false for a parsed head, which holds at least a start line.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The start line as received, without its CRLF.
    pub fn start_line(&self) -> &'a [u8] {
        let (line, _) = split_at(self.raw, self.start_end.saturating_sub(CRLF.len()));
        line
    }

    pub(crate) fn start_end(&self) -> usize {
        self.start_end
    }

    pub(crate) fn uri_range(&self) -> Option<Range<usize>> {
        self.uri_range.clone()
    }

    pub fn is_request(&self) -> bool {
        matches!(self.start, StartLine::Request { .. })
    }

    pub fn method(&self) -> Option<&'a [u8]> {
        match self.start {
            StartLine::Request { method, .. } => Some(method),
            StartLine::Response { .. } => None,
        }
    }

    pub fn request_uri(&self) -> Option<&'a [u8]> {
        match self.start {
            StartLine::Request { uri, .. } => Some(uri),
            StartLine::Response { .. } => None,
        }
    }

    pub fn status(&self) -> Option<u16> {
        match self.start {
            StartLine::Response { code, .. } => Some(code),
            StartLine::Request { .. } => None,
        }
    }

    pub fn version(&self) -> &'a [u8] {
        match self.start {
            StartLine::Request { version, .. } | StartLine::Response { version, .. } => version,
        }
    }

    /// All header fields in order.
    pub fn headers(&self) -> &[Header<'a>] {
        &self.headers
    }

    /// The first field called `name` (compact forms and case folded).
    pub fn header(&self, name: &str) -> Option<&Header<'a>> {
        self.headers.iter().find(|h| h.is(name))
    }

    /// Every field called `name`, in order.
    pub fn headers_named<'s>(&'s self, name: &'s str) -> impl Iterator<Item = &'s Header<'a>> + 's {
        self.headers.iter().filter(move |h| h.is(name))
    }

    /// Number of fields called `name`.
    pub fn count(&self, name: &str) -> usize {
        self.headers_named(name).count()
    }

    /// Every value of `name` across all its fields, comma lists split for the headers
    /// whose grammar is a list (Via, Contact, Route...), whole values for the rest.
    pub fn values<'s>(&'s self, name: &'s str) -> impl Iterator<Item = &'a [u8]> + 's {
        let list = super::headers::is_list_header(name.as_bytes());
        self.headers_named(name).flat_map(move |h| {
            let mut whole = Some(h.value);
            let mut split = CommaValues::new(h.value);
            std::iter::from_fn(move || if list { split.next() } else { whole.take() })
        })
    }

    pub fn call_id(&self) -> Option<&'a [u8]> {
        self.header("Call-ID").map(Header::value)
    }

    pub fn cseq(&self) -> Result<CSeq<'a>, SipError> {
        CSeq::parse(
            self.header("CSeq")
                .ok_or(SipError::BadCSeq("missing"))?
                .value,
        )
    }

    /// Every Via value, topmost first.
    pub fn vias(&self) -> impl Iterator<Item = Result<Via<'a>, SipError>> + '_ {
        self.values("Via").map(Via::parse)
    }

    pub fn top_via(&self) -> Result<Via<'a>, SipError> {
        self.vias()
            .next()
            .unwrap_or(Err(SipError::BadVia("missing")))
    }

    pub fn from(&self) -> Result<NameAddr<'a>, SipError> {
        NameAddr::parse(
            self.header("From")
                .ok_or(SipError::BadNameAddr("missing From"))?
                .value,
        )
    }

    pub fn to(&self) -> Result<NameAddr<'a>, SipError> {
        NameAddr::parse(
            self.header("To")
                .ok_or(SipError::BadNameAddr("missing To"))?
                .value,
        )
    }
}

/// A line of the head: its content range (CRLF excluded).
#[derive(Debug, Clone)]
struct LineSpan(Range<usize>);

impl LineSpan {
    fn bytes<'a>(&self, raw: &'a [u8]) -> &'a [u8] {
        raw.get(self.0.clone()).unwrap_or_default()
    }
}

/// Physical lines of `raw[pos..end]`, each ending in CRLF.
struct Lines<'a> {
    raw: &'a [u8],
    pos: usize,
    end: usize,
    max_line: usize,
}

impl Lines<'_> {
    /// The next line and the offset just past its CRLF.
    fn next_line(&mut self) -> Result<Option<(LineSpan, usize)>, SipError> {
        if self.pos >= self.end {
            return Ok(None);
        }
        let window = self.raw.get(self.pos..self.end).unwrap_or_default();
        let len = find_seq(window, CRLF).ok_or(SipError::BareLineBreak)?;
        let (line, _) = split_at(window, len);
        if line.iter().any(|&b| b == b'\r' || b == b'\n') {
            return Err(SipError::BareLineBreak);
        }
        if len > self.max_line {
            return Err(SipError::LineTooLong {
                limit: self.max_line,
            });
        }
        let span = LineSpan(self.pos..self.pos + len);
        self.pos += len + CRLF.len();
        Ok(Some((span, self.pos)))
    }
}

/// Lines and header fields of `raw[..fields_end]`, the start line left unparsed: what
/// framing needs, so a stream stays in sync past a message with a bad start line.
fn parse_fields<'a>(
    raw: &'a [u8],
    fields_end: usize,
    limits: &Limits,
) -> Result<(LineSpan, usize, Vec<Header<'a>>), SipError> {
    let mut lines = Lines {
        raw,
        pos: 0,
        end: fields_end,
        max_line: limits.max_line,
    };
    let (start_line, start_end) = lines.next_line()?.ok_or(SipError::Empty)?;
    let mut headers: Vec<Header<'a>> = Vec::new();
    while let Some((line, line_end)) = lines.next_line()? {
        if first(line.bytes(raw)).is_some_and(|b| b == b' ' || b == b'\t') {
            extend_folded(raw, headers.last_mut(), line, line_end)?;
            continue;
        }
        if headers.len() >= limits.max_headers {
            return Err(SipError::TooManyHeaders {
                limit: limits.max_headers,
            });
        }
        headers.push(parse_header_line(raw, line, line_end)?);
    }
    Ok((start_line, start_end, headers))
}

/// `SIP/<digits>.<digits>`, "SIP" in any case.
fn is_version(v: &[u8]) -> bool {
    let Some((proto, num)) = v.get(..4).zip(v.get(4..)) else {
        return false;
    };
    let mut parts = num.splitn(2, |&b| b == b'.');
    let major = parts.next().unwrap_or_default();
    let minor = parts.next().unwrap_or_default();
    eq_ic(proto, b"SIP/")
        && !major.is_empty()
        && !minor.is_empty()
        && major.iter().chain(minor).all(u8::is_ascii_digit)
}

fn parse_start_line<'a>(
    raw: &'a [u8],
    line: LineSpan,
) -> Result<(StartLine<'a>, Option<Range<usize>>), SipError> {
    let text = line.bytes(raw);
    if text.get(..4).is_some_and(|p| eq_ic(p, b"SIP/")) {
        return parse_status_line(text).map(|s| (s, None));
    }
    // Method SP Request-URI SP SIP-Version. Extra or trailing whitespace is tolerated
    // here so the request can still be answered; `check_request` refuses it with 400.
    let trimmed = trim_lws_end(text);
    let (method, after_method) = take_while(trimmed, is_token_char);
    if !is_token(method) || first(after_method) != Some(b' ') {
        return Err(SipError::BadStartLine(
            "expected a method token and a space",
        ));
    }
    let last_sp = trimmed.iter().rposition(|&b| b == b' ').unwrap_or(0);
    let (before_version, version) = split_at(trimmed, last_sp);
    let version = rest(version);
    if !is_version(version) {
        return Err(SipError::BadStartLine("request line must end in SIP/2.0"));
    }
    let uri_area = before_version.get(method.len()..).unwrap_or_default();
    let lead = uri_area.iter().take_while(|&&b| is_lws(b)).count();
    let uri = trim_lws(uri_area);
    if uri.is_empty() {
        return Err(SipError::BadStartLine("missing Request-URI"));
    }
    let uri_start = line.0.start + method.len() + lead;
    let start = StartLine::Request {
        method,
        uri,
        version,
    };
    Ok((start, Some(uri_start..uri_start + uri.len())))
}

fn parse_status_line(text: &[u8]) -> Result<StartLine<'_>, SipError> {
    let sp =
        find_byte(text, b' ').ok_or(SipError::BadStartLine("status line needs a status code"))?;
    let (version, after) = split_at(text, sp);
    if !is_version(version) {
        return Err(SipError::BadStartLine(
            "status line must start with SIP/2.0",
        ));
    }
    let after = rest(after);
    let (digits, tail) = take_while(after, |b| b.is_ascii_digit());
    let code = match digits {
        [a @ b'1'..=b'6', b, c] => {
            u16::from(a - b'0') * 100 + u16::from(b - b'0') * 10 + u16::from(c - b'0')
        }
        _ => {
            return Err(SipError::BadStartLine(
                "status code must be 3 digits from 100 to 699",
            ))
        }
    };
    // The reason phrase may be empty, and then some stacks also drop the space.
    let reason = match tail {
        [] => tail,
        [b' ', r @ ..] => r,
        _ => {
            return Err(SipError::BadStartLine(
                "expected a space after the status code",
            ))
        }
    };
    Ok(StartLine::Response {
        version,
        code,
        reason,
    })
}

fn parse_header_line<'a>(
    raw: &'a [u8],
    line: LineSpan,
    line_end: usize,
) -> Result<Header<'a>, SipError> {
    let text = line.bytes(raw);
    let (name, after) = take_while(text, is_token_char);
    if name.is_empty() {
        return Err(SipError::BadHeaderLine(
            "header line does not start with a name",
        ));
    }
    let gap = after
        .iter()
        .take_while(|&&b| b == b' ' || b == b'\t')
        .count();
    let colon_at = name.len() + gap;
    if text.get(colon_at) != Some(&b':') {
        return Err(SipError::BadHeaderLine(
            "expected ':' after the header name",
        ));
    }
    let after_colon = text.get(colon_at + 1..).unwrap_or_default();
    let lead = after_colon
        .iter()
        .take_while(|&&b| b == b' ' || b == b'\t')
        .count();
    let value_start = line.0.start + colon_at + 1 + lead;
    let value = trim_lws_end(raw.get(value_start..line.0.end).unwrap_or_default());
    Ok(Header {
        name,
        value,
        field: line.0.start..line_end,
        value_start,
    })
}

/// A continuation line (starting with SP/HTAB) extends the previous header's value.
fn extend_folded<'a>(
    raw: &'a [u8],
    prev: Option<&mut Header<'a>>,
    line: LineSpan,
    line_end: usize,
) -> Result<(), SipError> {
    let prev = prev.ok_or(SipError::BadHeaderLine(
        "continuation line right after the start line",
    ))?;
    prev.field.end = line_end;
    // An empty value followed by a fold (`Contact:\r\n  <sip:...>`) starts on the fold.
    if prev.value.is_empty() {
        let content = line.bytes(raw);
        let lead = content.iter().take_while(|&&b| is_lws(b)).count();
        prev.value_start = line.0.start + lead;
    }
    prev.value = trim_lws_end(raw.get(prev.value_start..line.0.end).unwrap_or_default());
    Ok(())
}

/// How many bytes of leading CRLF keep-alives (RFC 5626 §3.5.1) start `buf`.
fn keepalive_len(buf: &[u8]) -> usize {
    buf.chunks(2).take_while(|c| *c == CRLF).count() * CRLF.len()
}

/// A request or response, head and body, all borrowed from the received bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SipMessage<'a> {
    head: Head<'a>,
    body: &'a [u8],
}

/// Why a message could not be parsed, with its head when that much was readable:
/// a request whose head parsed can still be answered (e.g. 400 for a bad
/// Content-Length), one whose head did not cannot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseFailure<'a> {
    pub error: SipError,
    pub head: Option<Box<Head<'a>>>,
}

impl From<SipError> for ParseFailure<'_> {
    fn from(error: SipError) -> Self {
        ParseFailure { error, head: None }
    }
}

/// How the body length is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BodyRule {
    /// UDP: Content-Length if present (extra octets ignored, §18.3), else the rest.
    Datagram,
    /// TCP, after `frame`: Content-Length required and the bytes end with the body.
    Framed,
}

impl<'a> SipMessage<'a> {
    /// Parses one UDP datagram. Octets after Content-Length's worth of body are
    /// ignored (RFC 3261 §18.3); leading CRLFs are skipped.
    pub fn parse_datagram(
        buf: &'a [u8],
        limits: &Limits,
    ) -> Result<SipMessage<'a>, ParseFailure<'a>> {
        Self::parse_with(buf, limits, BodyRule::Datagram)
    }

    /// Parses exactly one message as delimited by [`frame`] (`&buf[skip..skip + len]`).
    pub fn parse_framed(
        buf: &'a [u8],
        limits: &Limits,
    ) -> Result<SipMessage<'a>, ParseFailure<'a>> {
        Self::parse_with(buf, limits, BodyRule::Framed)
    }

    fn parse_with(
        buf: &'a [u8],
        limits: &Limits,
        rule: BodyRule,
    ) -> Result<SipMessage<'a>, ParseFailure<'a>> {
        if buf.len() > limits.max_message {
            return Err(SipError::TooLarge {
                limit: limits.max_message,
            }
            .into());
        }
        let (_, msg) = split_at(buf, keepalive_len(buf));
        if msg.is_empty() {
            return Err(SipError::Empty.into());
        }
        let Some(blank) = find_seq(msg, EMPTY_LINE) else {
            return Err(Self::unterminated(msg, limits));
        };
        let head = Head::parse(msg, blank + CRLF.len(), limits)?;
        match frame_body(&head, msg, rule) {
            Ok(body) => Ok(SipMessage { head, body }),
            Err(error) => Err(ParseFailure {
                error,
                head: Some(Box::new(head)),
            }),
        }
    }

    /// A datagram without the empty line: keep the head if its lines parse, so the
    /// request can be answered (RFC 4475 `baddn` is such a message).
    fn unterminated(msg: &'a [u8], limits: &Limits) -> ParseFailure<'a> {
        if !msg.ends_with(CRLF) {
            return SipError::NoEmptyLine.into();
        }
        match Head::parse(msg, msg.len(), limits) {
            Ok(mut head) => {
                head.len = msg.len();
                ParseFailure {
                    error: SipError::NoEmptyLine,
                    head: Some(Box::new(head)),
                }
            }
            Err(error) => error.into(),
        }
    }

    pub fn head(&self) -> &Head<'a> {
        &self.head
    }

    pub fn body(&self) -> &'a [u8] {
        self.body
    }

    /// The message exactly as received (head and framed body; trailing datagram
    /// octets and leading keep-alives excluded).
    pub fn as_bytes(&self) -> &'a [u8] {
        self.head
            .raw
            .get(..self.head.len + self.body.len())
            .unwrap_or_default()
    }
}

fn frame_body<'a>(head: &Head<'a>, msg: &'a [u8], rule: BodyRule) -> Result<&'a [u8], SipError> {
    let available = msg.len().saturating_sub(head.len);
    let declared = match (content_length(head)?, rule) {
        (Some(n), _) => n,
        (None, BodyRule::Datagram) => available,
        (None, BodyRule::Framed) => return Err(SipError::ContentLengthMissing),
    };
    if declared > available {
        return Err(SipError::BodyTruncated {
            declared,
            available,
        });
    }
    if rule == BodyRule::Framed && declared < available {
        return Err(SipError::BodyOverrun);
    }
    Ok(msg.get(head.len..head.len + declared).unwrap_or_default())
}

/// The single Content-Length, if any; two or more cannot be trusted (RFC 4475 `mcl01`).
fn content_length(head: &Head<'_>) -> Result<Option<usize>, SipError> {
    content_length_of(&head.headers)
}

fn content_length_of(headers: &[Header<'_>]) -> Result<Option<usize>, SipError> {
    let mut fields = headers.iter().filter(|h| h.is("Content-Length"));
    let Some(first_field) = fields.next() else {
        return Ok(None);
    };
    if fields.next().is_some() {
        return Err(SipError::ContentLengthMultiple);
    }
    parse_content_length(first_field.value).map(Some)
}

/// Where the next message in a TCP receive buffer ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// After `skip` bytes of CRLF keep-alives, a whole message of `len` bytes:
    /// parse `&buf[skip..skip + len]` with [`SipMessage::parse_framed`], then drop
    /// `skip + len` bytes. (A `skip` of 4 or more held a CRLFCRLF ping, RFC 5626
    /// §3.5.1, which the connection owner answers with a CRLF pong.)
    Message { skip: usize, len: usize },
    /// Not enough bytes yet; the first `skip` bytes were keep-alives and can be dropped.
    /// `need`: the whole message's length once its head is in (0 before), so the
    /// connection owner can wait for that many bytes instead of framing again on every
    /// read of a large body.
    Incomplete { skip: usize, need: usize },
}

/// Finds the first message in a stream buffer. An error means the stream can no
/// longer be framed (bad head, no or bad Content-Length, over the size limit): the
/// connection must be closed, since nothing after it can be trusted.
///
/// Each call rescans from the start (free of state): the header section is searched
/// within [`Limits::max_head`] at most, and a caller waits for `need` bytes before calling
/// again, so a large body arriving in small pieces is not rescanned on every read.
pub fn frame(buf: &[u8], limits: &Limits) -> Result<Framing, SipError> {
    let skip = keepalive_len(buf);
    let (_, msg) = split_at(buf, skip);
    let window = limits.max_message.min(limits.max_head);
    let searched = msg.get(..window).unwrap_or(msg);
    let Some(blank) = find_seq(searched, EMPTY_LINE) else {
        if msg.len() > limits.max_message {
            return Err(SipError::TooLarge {
                limit: limits.max_message,
            });
        }
        if msg.len() > window {
            return Err(SipError::HeadTooLarge { limit: window });
        }
        if msg.len() > limits.max_line && !msg.windows(2).any(|w| w == CRLF) {
            return Err(SipError::LineTooLong {
                limit: limits.max_line,
            });
        }
        return Ok(Framing::Incomplete { skip, need: 0 });
    };
    let head_len = blank + EMPTY_LINE.len();
    let (_, _, headers) = parse_fields(msg, blank + CRLF.len(), limits)?;
    let body = content_length_of(&headers)?.ok_or(SipError::ContentLengthMissing)?;
    let len = head_len
        .checked_add(body)
        .ok_or(SipError::ContentLengthInvalid)?;
    if len > limits.max_message {
        return Err(SipError::TooLarge {
            limit: limits.max_message,
        });
    }
    if msg.len() >= len {
        Ok(Framing::Message { skip, len })
    } else {
        Ok(Framing::Incomplete { skip, need: len })
    }
}

#[cfg(test)]
#[allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
mod tests {
    use super::*;

    const OPTIONS: &[u8] =
        b"OPTIONS sip:a@b SIP/2.0\r\nVia: SIP/2.0/UDP h;branch=z9hG4bK1\r\nl: 0\r\n\r\n";

    #[test]
    fn parses_and_locates_fields() {
        let m = SipMessage::parse_datagram(OPTIONS, &Limits::default()).unwrap();
        assert_eq!(m.head().method(), Some(&b"OPTIONS"[..]));
        assert_eq!(m.head().request_uri(), Some(&b"sip:a@b"[..]));
        assert_eq!(m.head().header("Content-Length").unwrap().value(), b"0");
        assert_eq!(m.as_bytes(), OPTIONS);
        let r = m.head().uri_range().unwrap();
        assert_eq!(&OPTIONS[r], b"sip:a@b");
    }

    #[test]
    fn folding_joins_lines() {
        let msg = b"OPTIONS sip:a@b SIP/2.0\r\nContact:\r\n  <sip:x@y>\r\nX: a\r\n\tb\r\n\r\n";
        let m = SipMessage::parse_datagram(msg, &Limits::default()).unwrap();
        assert_eq!(m.head().header("m").unwrap().value(), b"<sip:x@y>");
        assert_eq!(m.head().header("x").unwrap().value(), b"a\r\n\tb");
    }

    #[test]
    fn rejects_structure_errors() {
        let l = Limits::default();
        let bare_lf = b"OPTIONS sip:a@b SIP/2.0\nVia: x\r\n\r\n";
        assert_eq!(
            SipMessage::parse_datagram(bare_lf, &l).unwrap_err().error,
            SipError::BareLineBreak
        );
        let fold_first = b"OPTIONS sip:a@b SIP/2.0\r\n x: y\r\n\r\n";
        assert!(SipMessage::parse_datagram(fold_first, &l).is_err());
        let no_colon = b"OPTIONS sip:a@b SIP/2.0\r\nVia x\r\n\r\n";
        assert!(SipMessage::parse_datagram(no_colon, &l).is_err());
        assert!(SipMessage::parse_datagram(b"SIP/2.0 4294967301 x\r\n\r\n", &l).is_err());
        assert_eq!(
            SipMessage::parse_datagram(b"\r\n\r\n", &l)
                .unwrap_err()
                .error,
            SipError::Empty
        );
    }

    #[test]
    fn frames_stream() {
        let l = Limits::default();
        let mut buf = b"\r\n\r\n".to_vec();
        buf.extend_from_slice(OPTIONS);
        assert_eq!(
            frame(&buf, &l),
            Ok(Framing::Message {
                skip: 4,
                len: OPTIONS.len()
            })
        );
        assert_eq!(
            frame(&buf[..20], &l),
            Ok(Framing::Incomplete { skip: 4, need: 0 })
        );
        assert_eq!(
            frame(b"\r", &l),
            Ok(Framing::Incomplete { skip: 0, need: 0 })
        );
    }
}
