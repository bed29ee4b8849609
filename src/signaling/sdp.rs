//! SDP bodies (RFC 4566) as views, and the one rewrite vgate makes to them.
//!
//! When a session description crosses the gateway, every address of the sending domain
//! in it must become the gateway's address in the receiving domain, and every media
//! port must become the gateway port that relays it. This module owns exactly that:
//! [`parse`] reads the description into per-media views, [`rewrite`] replaces the
//! address of `c=` lines (session and media level), the unicast-address of `o=`, the
//! port of `m=` lines and the port/address of `a=rtcp:` (RFC 3605), and copies every
//! other byte as received: GB/T 28181 `y=` (SSRC) and `f=` lines, `s=`, `u=`, `t=`,
//! all other attributes, unknown lines, and each line's own ending (CRLF or LF).
//!
//! It does not allocate ports or install routes (the callback given to [`rewrite`] does,
//! in the proxy) and does not fix the SIP Content-Length (`sip::Editor::set_body` does).
//!
//! Strictness: a line that is not `<letter>=<value>` is refused rather than passed
//! through, because a line vgate cannot read is a line whose addresses it cannot
//! rewrite, and a lenient receiver may still read an address out of it.

#![deny(unsafe_code)]
#![deny(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::net::Ipv4Addr;
use std::ops::Range;

/// Largest body accepted, in bytes.
pub const MAX_BODY: usize = 64 * 1024;
/// Most media sections (`m=` lines) accepted.
pub const MAX_MEDIA: usize = 64;

/// What is wrong with an SDP body; each message says what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SdpError {
    #[error("SDP body is {len} bytes, over the {max}-byte limit: refuse the offer (488)")]
    TooLarge { len: usize, max: usize },
    #[error("SDP has more than {max} media sections: refuse the offer (488)")]
    TooManyMedia { max: usize },
    #[error("SDP does not start with v=0: the body is not a session description, refuse it (488)")]
    MissingVersion,
    #[error("SDP line {line} is not `<letter>=<value>`: refuse the offer (488); a line vgate cannot read may hide an address")]
    BadLine { line: usize },
    #[error("SDP o= line {line} is malformed (needs 6 fields: user id version IN IP4 address)")]
    BadOrigin { line: usize },
    #[error("SDP c= line {line} is malformed (needs `IN IP4 <address>`)")]
    BadConnection { line: usize },
    #[error("SDP line {line} holds a host name where vgate needs a literal IPv4 address (vgate does not resolve names): configure the peer to send addresses")]
    NotAnAddress { line: usize },
    #[error("SDP line {line} uses IPv6; vgate relays IPv4 only: configure the peer for IPv4, or refuse the offer (488)")]
    Ipv6Unsupported { line: usize },
    #[error(
        "SDP m= line {line} is malformed (needs `m=<media> <port>[/<count>] <proto> <fmt>...`)"
    )]
    BadMedia { line: usize },
    #[error("SDP a=rtcp line {line} is malformed (needs `a=rtcp:<port> [IN IP4 <address>]`)")]
    BadRtcp { line: usize },
    #[error("SDP media section {media} has a port but no c= line, and there is no session-level c=: refuse the offer (488)")]
    MissingConnection { media: usize },
}

/// Failure of [`rewrite`]: the body, or the port callback.
#[derive(Debug, thiserror::Error)]
pub enum RewriteError<E> {
    #[error(transparent)]
    Sdp(#[from] SdpError),
    #[error("no gateway port for media section {media}: {source}")]
    Ports {
        media: usize,
        #[source]
        source: E,
    },
    #[error("media section {media} was given gateway port {port}, whose RTCP port (port + 1) does not exist: allocate RTP ports below 65535")]
    RtcpOverflow { media: usize, port: u16 },
}

/// Media direction (RFC 4566 §6); media level overrides session level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Direction {
    #[default]
    SendRecv,
    SendOnly,
    RecvOnly,
    Inactive,
}

impl Direction {
    fn from_attribute(a: &[u8]) -> Option<Direction> {
        match a {
            b"sendrecv" => Some(Direction::SendRecv),
            b"sendonly" => Some(Direction::SendOnly),
            b"recvonly" => Some(Direction::RecvOnly),
            b"inactive" => Some(Direction::Inactive),
            _ => None,
        }
    }

    /// Its attribute name (`sendrecv`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::SendRecv => "sendrecv",
            Direction::SendOnly => "sendonly",
            Direction::RecvOnly => "recvonly",
            Direction::Inactive => "inactive",
        }
    }

    /// The direction an attribute name says (`sendrecv`, ...).
    pub fn parse(s: &str) -> Option<Direction> {
        Direction::from_attribute(s.as_bytes())
    }
}

/// One media section (`m=` line and the lines up to the next `m=`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Media<'a> {
    /// `video`, `audio`, `application`...
    pub kind: &'a str,
    pub port: u16,
    /// The `/<count>` of `m=video 6000/2 ...`.
    pub port_count: Option<u16>,
    /// `RTP/AVP`, `TCP/RTP/AVP`, `RTP/AVPF`...
    pub proto: &'a str,
    /// Formats as written (`96 98 97`); see [`Media::formats`].
    pub formats_text: &'a str,
    /// The effective connection address: this section's `c=`, else the session's.
    pub connection: Option<Ipv4Addr>,
    pub direction: Direction,
    /// `a=setup:` (RFC 4145), used by GB/T 28181 for RTP over TCP.
    pub setup: Option<&'a str>,
    /// `a=connection:` (RFC 4145 §5): `new` or `existing`.
    pub tcp_connection: Option<&'a str>,
    /// `a=rtcp:` port (RFC 3605).
    pub rtcp_port: Option<u16>,
    /// `a=rtcp-mux` (RFC 5761): RTCP shares the RTP port.
    pub rtcp_mux: bool,
    /// GB/T 28181 `y=` SSRC: this section's, else a session-level one.
    pub ssrc: Option<&'a str>,
    /// The `a=rtpmap:` values as written (`96 PS/90000`), at most [`MAX_RTPMAPS`].
    pub rtpmaps: Vec<&'a str>,
    /// `a=control:` (RTSP, RFC 2326 C.1.1): the track's URL, absolute or relative.
    pub control: Option<&'a str>,
}

/// `a=rtpmap:` lines kept per media section; further ones are ignored (their payload types
/// then have no encoding, which media validation refuses).
pub const MAX_RTPMAPS: usize = 16;

impl<'a> Media<'a> {
    pub fn formats(&self) -> impl Iterator<Item = &'a str> {
        self.formats_text.split(' ').filter(|f| !f.is_empty())
    }
}

/// A parsed session description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sdp<'a> {
    /// The `o=` unicast-address as written (may be a host name).
    pub origin_address: Option<&'a str>,
    /// Session-level `c=` address.
    pub connection: Option<Ipv4Addr>,
    /// Session-level direction attribute, if any.
    pub direction: Option<Direction>,
    /// `s=` as written (GB/T 28181: `Play`, `Playback`, `Download`, `Talk`).
    pub session_name: &'a [u8],
    pub media: Vec<Media<'a>>,
}

/// Parses an SDP body into views.
pub fn parse(body: &[u8]) -> Result<Sdp<'_>, SdpError> {
    scan(body).map(|s| s.sdp)
}

/// Rewrites `body` for the other domain: every address in `c=`, `o=` and `a=rtcp:`
/// becomes `new_addr`; each `m=` port becomes what `ports(index, media)` returns
/// (`None` leaves it, e.g. for a rejected stream with port 0). Every other byte,
/// line endings included, is copied as received.
///
/// `a=rtcp:` ports follow their media: port + 1, because the gateway allocates RTP/RTCP
/// as an even/odd pair (RFC 3550 §11) and relays RTCP on the odd port; an explicit
/// RTCP port from the other domain would point the peer at a port it cannot reach.
/// With `a=rtcp-mux`, RTCP rides on the RTP port, so `a=rtcp:` gets that port.
pub fn rewrite<E, F>(
    body: &[u8],
    new_addr: Ipv4Addr,
    mut ports: F,
) -> Result<Vec<u8>, RewriteError<E>>
where
    F: FnMut(usize, &Media<'_>) -> Result<Option<u16>, E>,
{
    let scanned = scan(body)?;
    let mut new_ports = Vec::with_capacity(scanned.sdp.media.len());
    for (i, m) in scanned.sdp.media.iter().enumerate() {
        new_ports.push(ports(i, m).map_err(|source| RewriteError::Ports { media: i, source })?);
    }
    let addr = new_addr.to_string();
    let mut out = Vec::with_capacity(body.len() + 64);
    let mut pos = 0;
    for edit in &scanned.edits {
        out.extend_from_slice(body.get(pos..edit.range.start).unwrap_or_default());
        let original = body.get(edit.range.clone()).unwrap_or_default();
        match edit.kind {
            EditKind::Address => out.extend_from_slice(addr.as_bytes()),
            EditKind::MediaPort(i) => match new_ports.get(i).copied().flatten() {
                Some(p) => out.extend_from_slice(p.to_string().as_bytes()),
                None => out.extend_from_slice(original),
            },
            EditKind::RtcpPort(i) => match new_ports.get(i).copied().flatten() {
                Some(p) => {
                    out.extend_from_slice(rtcp_port(&scanned.sdp, i, p)?.to_string().as_bytes())
                }
                None => out.extend_from_slice(original),
            },
        }
        pos = edit.range.end;
    }
    out.extend_from_slice(body.get(pos..).unwrap_or_default());
    Ok(out)
}

/// What [`set_transport`] does to a media section's `a=setup:`/`a=connection:` lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetupEdit<'a> {
    /// Remove them (the section is now RTP over UDP).
    Remove,
    /// Replace them with `a=setup:<role>` and `a=connection:new` at the end of the section.
    Set(&'a str),
    /// Replace them with `a=setup:<role>` and `a=connection:existing` (RFC 4145 §5.1: the
    /// connection already open for this line stays, e.g. in a session-refresh re-INVITE).
    Keep(&'a str),
}

/// Changes the transport of media section `media` of an SDP already checked by [`parse`]
/// (or [`rewrite`]): its `m=` proto becomes `proto`, and its `a=setup:`/`a=connection:`
/// lines are edited as `setup` says. Every other byte is kept, `y=` and `f=` included; line
/// endings follow the body's. The gateway uses it when the two sides of a call use different
/// transports (GB/T 28181 `TCP/RTP/AVP` on one side, `RTP/AVP` on the other).
pub fn set_transport(body: &[u8], media: usize, proto: &str, setup: SetupEdit<'_>) -> Vec<u8> {
    let eol: &[u8] = if body.windows(2).any(|w| w == b"\r\n") {
        b"\r\n"
    } else {
        b"\n"
    };
    let mut out = Vec::with_capacity(body.len() + 48);
    let mut section: Option<usize> = None;
    let mut next = 0;
    let insert = |out: &mut Vec<u8>| {
        let (role, connection) = match setup {
            SetupEdit::Remove => return,
            SetupEdit::Set(role) => (role, "new"),
            SetupEdit::Keep(role) => (role, "existing"),
        };
        for l in [
            format!("a=setup:{role}"),
            format!("a=connection:{connection}"),
        ] {
            out.extend_from_slice(l.as_bytes());
            out.extend_from_slice(eol);
        }
    };
    let mut ended_with_eol = true;
    let mut inserted = false;
    for line in lines(body) {
        let end = line.start + line.text.len();
        // The line's own ending, as written.
        let rest = body.get(end..).unwrap_or_default();
        let ending: &[u8] = if rest.starts_with(b"\r\n") {
            b"\r\n"
        } else if rest.starts_with(b"\n") {
            b"\n"
        } else {
            b""
        };
        if line.text.starts_with(b"m=") {
            if section == Some(media) && !inserted {
                insert(&mut out);
                inserted = true;
            }
            section = Some(next);
            next += 1;
            if section == Some(media) {
                let f: Vec<(usize, &[u8])> =
                    fields(line.text.get(2..).unwrap_or_default()).collect();
                if let Some((off, old)) = f.get(2) {
                    let at = 2 + off;
                    out.extend_from_slice(line.text.get(..at).unwrap_or_default());
                    out.extend_from_slice(proto.as_bytes());
                    out.extend_from_slice(line.text.get(at + old.len()..).unwrap_or_default());
                    out.extend_from_slice(ending);
                    ended_with_eol = !ending.is_empty();
                    continue;
                }
            }
        } else if section == Some(media)
            && (line.text.starts_with(b"a=setup:") || line.text.starts_with(b"a=connection:"))
        {
            continue;
        } else if section == Some(media)
            && !inserted
            && (line.text.starts_with(b"y=") || line.text.starts_with(b"f="))
        {
            // GB/T 28181 puts y= and f= last: the attributes go before them.
            insert(&mut out);
            inserted = true;
        }
        out.extend_from_slice(body.get(line.start..end).unwrap_or_default());
        out.extend_from_slice(ending);
        ended_with_eol = !ending.is_empty();
    }
    if section == Some(media) && !inserted {
        if !ended_with_eol {
            out.extend_from_slice(eol);
        }
        insert(&mut out);
    }
    out
}

fn rtcp_port<E>(sdp: &Sdp<'_>, media: usize, port: u16) -> Result<u16, RewriteError<E>> {
    if sdp.media.get(media).is_some_and(|m| m.rtcp_mux) {
        return Ok(port);
    }
    port.checked_add(1)
        .ok_or(RewriteError::RtcpOverflow { media, port })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EditKind {
    Address,
    MediaPort(usize),
    RtcpPort(usize),
}

/// A byte range of the body that [`rewrite`] replaces.
#[derive(Debug, Clone)]
struct Edit {
    range: Range<usize>,
    kind: EditKind,
}

struct Scan<'a> {
    sdp: Sdp<'a>,
    /// In body order, non-overlapping.
    edits: Vec<Edit>,
}

/// One line: where its content sits in the body (line ending excluded) and its number.
struct Line<'a> {
    start: usize,
    text: &'a [u8],
    number: usize,
}

/// Lines of `body`, each ending in LF or CRLF (the last may have neither).
fn lines(body: &[u8]) -> impl Iterator<Item = Line<'_>> {
    let mut pos = 0;
    let mut number = 0;
    std::iter::from_fn(move || {
        let rest = body.get(pos..).filter(|r| !r.is_empty())?;
        let (content_len, step) = match rest.iter().position(|&b| b == b'\n') {
            Some(nl) => (
                if nl > 0 && rest.get(nl - 1) == Some(&b'\r') {
                    nl - 1
                } else {
                    nl
                },
                nl + 1,
            ),
            None => (rest.len(), rest.len()),
        };
        let line = Line {
            start: pos,
            text: rest.get(..content_len).unwrap_or_default(),
            number,
        };
        pos += step;
        number += 1;
        Some(line)
    })
}

/// Whitespace-separated fields of `text` with their offsets in it.
fn fields(text: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    let mut pos = 0;
    std::iter::from_fn(move || {
        let rest = text.get(pos..)?;
        let skip = rest.iter().take_while(|&&b| b == b' ').count();
        let start = pos + skip;
        let word = text.get(start..)?;
        let len = word.iter().take_while(|&&b| b != b' ').count();
        if len == 0 {
            return None;
        }
        pos = start + len;
        Some((start, word.get(..len).unwrap_or_default()))
    })
}

fn ascii(b: &[u8]) -> Option<&str> {
    std::str::from_utf8(b).ok().filter(|s| s.is_ascii())
}

/// Parser state while walking the lines.
struct Scanner<'a> {
    sdp: Sdp<'a>,
    edits: Vec<Edit>,
    session_ssrc: Option<&'a str>,
    /// Per media: its own c= address and direction, before session fallbacks apply.
    media_conn: Vec<Option<Ipv4Addr>>,
    media_dir: Vec<Option<Direction>>,
}

fn scan(body: &[u8]) -> Result<Scan<'_>, SdpError> {
    if body.len() > MAX_BODY {
        return Err(SdpError::TooLarge {
            len: body.len(),
            max: MAX_BODY,
        });
    }
    let mut s = Scanner {
        sdp: Sdp {
            origin_address: None,
            connection: None,
            direction: None,
            session_name: b"",
            media: Vec::new(),
        },
        edits: Vec::new(),
        session_ssrc: None,
        media_conn: Vec::new(),
        media_dir: Vec::new(),
    };
    let mut seen_version = false;
    for line in lines(body) {
        if line.text.is_empty() {
            continue; // blank lines (often a trailing one) carry nothing to rewrite
        }
        if line.text.contains(&b'\r') {
            // A receiver that ends lines at a bare CR would read a line here that
            // this scan never saw, with an address it never rewrote.
            return Err(SdpError::BadLine {
                line: line.number + 1,
            });
        }
        let (kind, value, value_start) = match line.text {
            [k @ b'a'..=b'z', b'=', value @ ..] => (*k, value, line.start + 2),
            _ => {
                return Err(SdpError::BadLine {
                    line: line.number + 1,
                })
            }
        };
        if !seen_version {
            if kind != b'v' || value != b"0" {
                return Err(SdpError::MissingVersion);
            }
            seen_version = true;
            continue;
        }
        s.line(kind, value, value_start, line.number + 1)?;
    }
    if !seen_version {
        return Err(SdpError::MissingVersion);
    }
    s.finish()
}

impl<'a> Scanner<'a> {
    fn line(
        &mut self,
        kind: u8,
        value: &'a [u8],
        at: usize,
        number: usize,
    ) -> Result<(), SdpError> {
        match kind {
            b'o' => self.origin(value, at, number),
            b's' => {
                self.sdp.session_name = value;
                Ok(())
            }
            b'c' => self.connection(value, at, number),
            b'm' => self.media_line(value, at, number),
            b'a' => self.attribute(value, at, number),
            b'y' => {
                let ssrc = ascii(value).map(str::trim);
                match self.sdp.media.last_mut() {
                    Some(m) => m.ssrc = ssrc,
                    None => self.session_ssrc = ssrc,
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn push_edit(&mut self, range: Range<usize>, kind: EditKind) {
        self.edits.push(Edit { range, kind });
    }

    /// `o=<username> <sess-id> <sess-version> IN IP4 <unicast-address>`.
    fn origin(&mut self, value: &'a [u8], at: usize, number: usize) -> Result<(), SdpError> {
        let f: Vec<(usize, &[u8])> = fields(value).collect();
        let [_, _, _, (_, net), (_, addrtype), (off, address)] = f.as_slice() else {
            return Err(SdpError::BadOrigin { line: number });
        };
        check_addrtype(net, addrtype, number, SdpError::BadOrigin { line: number })?;
        self.sdp.origin_address = ascii(address);
        self.push_edit(at + off..at + off + address.len(), EditKind::Address);
        Ok(())
    }

    /// `c=IN IP4 <address>[/<ttl>[/<count>]]`. The whole address token is replaced,
    /// TTL included: vgate relays unicast, and a TTL on a unicast address is invalid.
    fn connection(&mut self, value: &'a [u8], at: usize, number: usize) -> Result<(), SdpError> {
        let f: Vec<(usize, &[u8])> = fields(value).collect();
        let [(_, net), (_, addrtype), (off, token)] = f.as_slice() else {
            return Err(SdpError::BadConnection { line: number });
        };
        check_addrtype(
            net,
            addrtype,
            number,
            SdpError::BadConnection { line: number },
        )?;
        let address = token.split(|&b| b == b'/').next().unwrap_or_default();
        let ip = parse_ipv4(address, number)?;
        match self.media_conn.last_mut() {
            Some(c) => *c = c.or(Some(ip)),
            None => self.sdp.connection = self.sdp.connection.or(Some(ip)),
        }
        self.push_edit(at + off..at + off + token.len(), EditKind::Address);
        Ok(())
    }

    /// `m=<media> <port>[/<count>] <proto> <fmt> ...`.
    fn media_line(&mut self, value: &'a [u8], at: usize, number: usize) -> Result<(), SdpError> {
        if self.sdp.media.len() >= MAX_MEDIA {
            return Err(SdpError::TooManyMedia { max: MAX_MEDIA });
        }
        let bad = SdpError::BadMedia { line: number };
        let text = ascii(value).ok_or(bad.clone())?;
        let f: Vec<(usize, &[u8])> = fields(value).collect();
        let [(_, kind), (port_off, port_field), (proto_off, proto), formats @ ..] = f.as_slice()
        else {
            return Err(bad);
        };
        let Some((fmt_off, _)) = formats.first() else {
            return Err(bad);
        };
        let mut pc = port_field.splitn(2, |&b| b == b'/');
        let port_text = pc.next().unwrap_or_default();
        let port = parse_u16(port_text).ok_or(bad.clone())?;
        let port_count = match pc.next() {
            Some(c) => Some(parse_u16(c).filter(|&n| n > 0).ok_or(bad.clone())?),
            None => None,
        };
        let media = Media {
            kind: ascii(kind).ok_or(bad.clone())?,
            port,
            port_count,
            proto: text
                .get(*proto_off..proto_off + proto.len())
                .ok_or(bad.clone())?,
            formats_text: text.get(*fmt_off..).map(str::trim_end).ok_or(bad)?,
            connection: None,
            direction: Direction::SendRecv,
            setup: None,
            tcp_connection: None,
            rtcp_port: None,
            rtcp_mux: false,
            ssrc: None,
            rtpmaps: Vec::new(),
            control: None,
        };
        let index = self.sdp.media.len();
        self.sdp.media.push(media);
        self.media_conn.push(None);
        self.media_dir.push(None);
        self.push_edit(
            at + port_off..at + port_off + port_text.len(),
            EditKind::MediaPort(index),
        );
        Ok(())
    }

    fn attribute(&mut self, value: &'a [u8], at: usize, number: usize) -> Result<(), SdpError> {
        let (name, arg) = match value.iter().position(|&b| b == b':') {
            Some(i) => (value.get(..i).unwrap_or_default(), value.get(i + 1..)),
            None => (value, None),
        };
        if let Some(d) = Direction::from_attribute(name) {
            match self.media_dir.last_mut() {
                Some(m) => *m = Some(d),
                None => self.sdp.direction = Some(d),
            }
            return Ok(());
        }
        let media_index = self.sdp.media.len().checked_sub(1);
        match (name, arg, media_index) {
            (b"setup", Some(a), Some(i)) => {
                if let Some(m) = self.sdp.media.get_mut(i) {
                    m.setup = ascii(a).map(str::trim);
                }
            }
            (b"connection", Some(a), Some(i)) => {
                if let Some(m) = self.sdp.media.get_mut(i) {
                    m.tcp_connection = ascii(a).map(str::trim);
                }
            }
            (b"rtpmap", Some(a), Some(i)) => {
                if let (Some(m), Some(text)) = (self.sdp.media.get_mut(i), ascii(a)) {
                    if m.rtpmaps.len() < MAX_RTPMAPS {
                        m.rtpmaps.push(text.trim());
                    }
                }
            }
            (b"control", Some(a), Some(i)) => {
                if let Some(m) = self.sdp.media.get_mut(i) {
                    m.control = ascii(a).map(str::trim);
                }
            }
            (b"rtcp-mux", _, Some(i)) => {
                if let Some(m) = self.sdp.media.get_mut(i) {
                    m.rtcp_mux = true;
                }
            }
            (b"rtcp", Some(a), Some(i)) => {
                let arg_start = at + name.len() + 1;
                self.rtcp(a, arg_start, i, number)?;
            }
            _ => {}
        }
        Ok(())
    }

    /// `a=rtcp:<port> [IN IP4 <address>]` (RFC 3605): the address, when present, is one
    /// of the sending domain's and is rewritten like a `c=` address.
    fn rtcp(
        &mut self,
        arg: &'a [u8],
        at: usize,
        media: usize,
        number: usize,
    ) -> Result<(), SdpError> {
        let bad = SdpError::BadRtcp { line: number };
        let f: Vec<(usize, &[u8])> = fields(arg).collect();
        let (port_off, port_text, addr) = match f.as_slice() {
            [(o, p)] => (*o, *p, None),
            [(o, p), (_, net), (_, addrtype), (ao, a)] => {
                check_addrtype(net, addrtype, number, bad.clone())?;
                parse_ipv4(a, number)?;
                (*o, *p, Some((*ao, a.len())))
            }
            _ => return Err(bad),
        };
        let port = parse_u16(port_text).ok_or(bad)?;
        if let Some(m) = self.sdp.media.get_mut(media) {
            m.rtcp_port = Some(port);
        }
        self.push_edit(
            at + port_off..at + port_off + port_text.len(),
            EditKind::RtcpPort(media),
        );
        if let Some((ao, len)) = addr {
            self.push_edit(at + ao..at + ao + len, EditKind::Address);
        }
        Ok(())
    }

    /// Applies session-level fallbacks and checks every live stream has an address.
    fn finish(mut self) -> Result<Scan<'a>, SdpError> {
        let session_dir = self.sdp.direction.unwrap_or_default();
        for (i, m) in self.sdp.media.iter_mut().enumerate() {
            m.connection = self
                .media_conn
                .get(i)
                .copied()
                .flatten()
                .or(self.sdp.connection);
            m.direction = self
                .media_dir
                .get(i)
                .copied()
                .flatten()
                .unwrap_or(session_dir);
            m.ssrc = m.ssrc.or(self.session_ssrc);
            if m.connection.is_none() && m.port != 0 {
                return Err(SdpError::MissingConnection { media: i });
            }
        }
        Ok(Scan {
            sdp: self.sdp,
            edits: self.edits,
        })
    }
}

fn check_addrtype(net: &[u8], addrtype: &[u8], line: usize, bad: SdpError) -> Result<(), SdpError> {
    if addrtype == b"IP6" {
        return Err(SdpError::Ipv6Unsupported { line });
    }
    if net != b"IN" || addrtype != b"IP4" {
        return Err(bad);
    }
    Ok(())
}

fn parse_ipv4(text: &[u8], line: usize) -> Result<Ipv4Addr, SdpError> {
    ascii(text)
        .and_then(|t| t.parse().ok())
        .ok_or(SdpError::NotAnAddress { line })
}

fn parse_u16(text: &[u8]) -> Option<u16> {
    if text.is_empty() || text.len() > 5 || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    ascii(text)?.parse().ok()
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
    use std::convert::Infallible;

    #[test]
    fn lf_endings_and_media_fallbacks() {
        let body = b"v=0\no=- 1 1 IN IP4 10.0.0.1\ns=-\nc=IN IP4 10.0.0.1\nt=0 0\na=sendonly\nm=audio 4000 RTP/AVP 0\nm=video 0 RTP/AVP 96\nc=IN IP4 10.0.0.2\na=inactive\n";
        let sdp = parse(body).unwrap();
        assert_eq!(sdp.media[0].connection, Some(Ipv4Addr::new(10, 0, 0, 1)));
        assert_eq!(sdp.media[0].direction, Direction::SendOnly);
        assert_eq!(sdp.media[1].connection, Some(Ipv4Addr::new(10, 0, 0, 2)));
        assert_eq!(sdp.media[1].direction, Direction::Inactive);
        let out = rewrite(body, Ipv4Addr::new(192, 0, 2, 9), |i, _| {
            Ok::<_, Infallible>((i == 0).then_some(30000))
        })
        .unwrap();
        let expected = b"v=0\no=- 1 1 IN IP4 192.0.2.9\ns=-\nc=IN IP4 192.0.2.9\nt=0 0\na=sendonly\nm=audio 30000 RTP/AVP 0\nm=video 0 RTP/AVP 96\nc=IN IP4 192.0.2.9\na=inactive\n";
        assert_eq!(
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(expected)
        );
    }

    #[test]
    fn rtcp_follows_media() {
        let body = b"v=0\r\no=- 1 1 IN IP4 10.0.0.1\r\ns=-\r\nc=IN IP4 224.2.1.1/127\r\nt=0 0\r\nm=audio 4000/2 RTP/AVP 0\r\na=rtcp:4001 IN IP4 10.0.0.1\r\nm=video 5000 RTP/AVPF 96\r\na=rtcp-mux\r\na=rtcp:5000\r\n";
        let sdp = parse(body).unwrap();
        assert_eq!(sdp.media[0].port_count, Some(2));
        assert_eq!(sdp.media[0].rtcp_port, Some(4001));
        let out = rewrite(body, Ipv4Addr::new(192, 0, 2, 9), |i, _| {
            Ok::<_, Infallible>(Some(30000 + 2 * i as u16))
        })
        .unwrap();
        let expected = b"v=0\r\no=- 1 1 IN IP4 192.0.2.9\r\ns=-\r\nc=IN IP4 192.0.2.9\r\nt=0 0\r\nm=audio 30000/2 RTP/AVP 0\r\na=rtcp:30001 IN IP4 192.0.2.9\r\nm=video 30002 RTP/AVPF 96\r\na=rtcp-mux\r\na=rtcp:30002\r\n";
        assert_eq!(
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(expected)
        );
        let overflow = rewrite(body, Ipv4Addr::LOCALHOST, |_, _| {
            Ok::<_, Infallible>(Some(65535))
        });
        assert!(matches!(
            overflow,
            Err(RewriteError::RtcpOverflow {
                media: 0,
                port: 65535
            })
        ));
    }

    #[test]
    fn errors() {
        assert_eq!(
            parse(b"o=- 1 1 IN IP4 1.2.3.4\r\n"),
            Err(SdpError::MissingVersion)
        );
        assert_eq!(parse(b""), Err(SdpError::MissingVersion));
        let v6 = b"v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\nc=IN IP6 ::1\r\n";
        assert_eq!(parse(v6), Err(SdpError::Ipv6Unsupported { line: 3 }));
        assert_eq!(
            parse(b"v=0\r\nm=audio x RTP/AVP 0\r\n"),
            Err(SdpError::BadMedia { line: 2 })
        );
        assert_eq!(
            parse(b"v=0\r\nm=audio 70000 RTP/AVP 0\r\n"),
            Err(SdpError::BadMedia { line: 2 })
        );
        assert_eq!(
            parse(b"v=0\r\nm=audio 4000 RTP/AVP\r\n"),
            Err(SdpError::BadMedia { line: 2 })
        );
        assert_eq!(
            parse(b"v=0\r\nm =video 1 RTP/AVP 31\r\n"),
            Err(SdpError::BadLine { line: 2 })
        );
        assert_eq!(
            parse(b"v=0\r\ns=x\rc=IN IP4 10.0.0.1\r\n"),
            Err(SdpError::BadLine { line: 2 })
        );
        assert_eq!(
            parse(b"v=0\r\nc=IN IP4 cam.example\r\n"),
            Err(SdpError::NotAnAddress { line: 2 })
        );
        assert_eq!(
            parse(b"v=0\r\nm=audio 4000 RTP/AVP 0\r\n"),
            Err(SdpError::MissingConnection { media: 0 })
        );
        let many: Vec<u8> = std::iter::once(&b"v=0\nc=IN IP4 1.2.3.4\n"[..])
            .chain(std::iter::repeat_n(
                &b"m=audio 1 RTP/AVP 0\n"[..],
                MAX_MEDIA + 1,
            ))
            .flatten()
            .copied()
            .collect();
        assert_eq!(parse(&many), Err(SdpError::TooManyMedia { max: MAX_MEDIA }));
        assert!(matches!(
            parse(&vec![b'v'; MAX_BODY + 1]),
            Err(SdpError::TooLarge { .. })
        ));
    }

    #[test]
    fn callback_errors_name_the_media() {
        let body = b"v=0\r\nc=IN IP4 1.2.3.4\r\nm=audio 4000 RTP/AVP 0\r\n";
        let r = rewrite(body, Ipv4Addr::LOCALHOST, |_, _| Err(std::fmt::Error));
        assert!(matches!(r, Err(RewriteError::Ports { media: 0, .. })));
    }

    #[test]
    fn set_transport_edits_one_section_and_keeps_the_rest() {
        let tcp = "v=0\r\no=- 1 1 IN IP4 10.1.0.5\r\ns=Play\r\nc=IN IP4 10.1.0.5\r\nt=0 0\r\nm=video 6000 TCP/RTP/AVP 96\r\na=recvonly\r\na=setup:passive\r\na=connection:new\r\na=rtpmap:96 PS/90000\r\ny=0100000001\r\nf=v/2/4///a///\r\n";
        let udp = set_transport(tcp.as_bytes(), 0, "RTP/AVP", SetupEdit::Remove);
        assert_eq!(
            String::from_utf8(udp.clone()).unwrap(),
            tcp.replace("TCP/RTP/AVP", "RTP/AVP")
                .replace("a=setup:passive\r\na=connection:new\r\n", "")
        );
        let back = set_transport(&udp, 0, "TCP/RTP/AVP", SetupEdit::Set("active"));
        let text = String::from_utf8(back).unwrap();
        assert!(text.contains("m=video 6000 TCP/RTP/AVP 96\r\n"));
        assert!(text
            .ends_with("a=setup:active\r\na=connection:new\r\ny=0100000001\r\nf=v/2/4///a///\r\n"));
        assert!(text.contains("y=0100000001\r\n"));
        assert!(parse(text.as_bytes()).unwrap().media[0].setup == Some("active"));
        assert_eq!(
            parse(text.as_bytes()).unwrap().media[0].tcp_connection,
            Some("new")
        );
        let kept = set_transport(text.as_bytes(), 0, "TCP/RTP/AVP", SetupEdit::Keep("active"));
        let kept = String::from_utf8(kept).unwrap();
        assert!(
            kept.ends_with(
                "a=setup:active\r\na=connection:existing\r\ny=0100000001\r\nf=v/2/4///a///\r\n"
            ),
            "{kept}"
        );
        assert_eq!(kept.matches("a=setup:").count(), 1, "{kept}");
        // Another section is left alone.
        let two = format!("{tcp}m=audio 7000 TCP/RTP/AVP 8\r\na=setup:active\r\n");
        let out = String::from_utf8(set_transport(
            two.as_bytes(),
            0,
            "RTP/AVP",
            SetupEdit::Remove,
        ))
        .unwrap();
        assert!(out.ends_with("m=audio 7000 TCP/RTP/AVP 8\r\na=setup:active\r\n"));
    }
}
