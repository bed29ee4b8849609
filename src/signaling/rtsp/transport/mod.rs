//! The `Transport:` header (RFC 2326 §12.39, RFC 7826 §18.54): parse, police, rewrite.
//!
//! Owns: turning a Transport value into a list of alternatives
//! ([`parse_transport`]), the gateway's policy on them (unicast only, no
//! third-party `destination`, UDP or interleaved — [`select_transport`]), the
//! rewrites the proxy applies on the way through (`with_client_port`,
//! `with_server_port`, `with_source`, `without_destination`), and writing the
//! value back ([`format_transport`]) with unknown parameters preserved.
//!
//! Does not own: port allocation (the caller passes the ports it allocated),
//! stream routes, or anything about the message around the header.
//!
//! Parameters the proxy does not change are written back exactly as they
//! arrived (spelling, quoting), so a peer's vendor extensions survive.
//! Every input is bounded and checked: this header comes straight from an
//! untrusted peer, and `rtsp-types` 0.1.3 panics on `RTP/AVP;mode="`.

use std::borrow::Cow;
use std::fmt;
use std::net::IpAddr;

use crate::signaling::rtsp::error::RtspError;

/// Longest Transport value accepted (real ones are well under 200 bytes).
pub const MAX_TRANSPORT_LEN: usize = 4096;
/// Most alternatives accepted in one header.
pub const MAX_TRANSPORT_SPECS: usize = 16;
/// Most parameters accepted in one alternative.
pub const MAX_TRANSPORT_PARAMS: usize = 32;

/// Lower transport: where the media travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LowerTransport {
    /// RTP over UDP (the default when the protocol names none).
    Udp,
    /// RTP interleaved on the RTSP TCP connection.
    Tcp,
}

/// `a` or `a-b` ports, both in 1..=65535, `a <= b`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    /// The RTP port (the first of the range).
    pub fn rtp(&self) -> u16 {
        self.first
    }

    /// The RTCP port when the range names one (RTP + 1); a single port
    /// leaves RTCP to convention (RTP + 1 in RFC 2326, muxed in RFC 7826).
    pub fn rtcp(&self) -> Option<u16> {
        (self.last > self.first).then(|| self.first.saturating_add(1))
    }

    fn pair(param: &'static str, rtp: u16, rtcp: Option<u16>) -> Result<Self, RtspError> {
        if rtp == 0 {
            return Err(RtspError::BadPort { param });
        }
        match rtcp {
            None => Ok(PortRange {
                first: rtp,
                last: rtp,
            }),
            Some(rtcp) if Some(rtcp) == rtp.checked_add(1) => Ok(PortRange {
                first: rtp,
                last: rtcp,
            }),
            Some(_) => Err(RtspError::PortsNotAdjacent),
        }
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
    }
}

/// `interleaved=a[-b]` channel numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelRange {
    pub first: u8,
    pub last: u8,
}

impl fmt::Display for ChannelRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
    }
}

/// Unicast, multicast, or neither said (RFC 2326 then defaults to multicast,
/// which is why the proxy writes `unicast` explicitly: see
/// [`TransportSpec::with_unicast`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cast {
    Unicast,
    Multicast,
    Unspecified,
}

/// One Transport parameter, typed where vgate needs the meaning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Param<'a> {
    Unicast,
    Multicast,
    Append,
    ClientPort(PortRange),
    ServerPort(PortRange),
    /// Multicast `port=`.
    Port(PortRange),
    Interleaved(ChannelRange),
    Ttl(u8),
    Layers(u32),
    /// `source=` host, as written.
    Source(Cow<'a, str>),
    /// `destination[=host]`.
    Destination(Option<&'a str>),
    /// `ssrc=` hex value(s), as written (RFC 7826 allows `a/b` lists).
    Ssrc(&'a str),
    /// `mode=` with quotes removed, e.g. `PLAY` or `PLAY,RECORD`.
    Mode(&'a str),
    /// Anything else, e.g. RTSP 2.0's `dest_addr`, vendor extensions.
    Other {
        name: &'a str,
        value: Option<&'a str>,
    },
}

impl Param<'_> {
    /// Name used for duplicate detection and replacement.
    fn key(&self) -> &str {
        match self {
            Param::Unicast | Param::Multicast => "unicast/multicast",
            Param::Append => "append",
            Param::ClientPort(_) => "client_port",
            Param::ServerPort(_) => "server_port",
            Param::Port(_) => "port",
            Param::Interleaved(_) => "interleaved",
            Param::Ttl(_) => "ttl",
            Param::Layers(_) => "layers",
            Param::Source(_) => "source",
            Param::Destination(_) => "destination",
            Param::Ssrc(_) => "ssrc",
            Param::Mode(_) => "mode",
            Param::Other { name, .. } => name,
        }
    }

    /// Canonical spelling, used when vgate wrote or changed the parameter.
    fn write_canonical(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Param::Unicast => f.write_str("unicast"),
            Param::Multicast => f.write_str("multicast"),
            Param::Append => f.write_str("append"),
            Param::ClientPort(r) => write!(f, "client_port={r}"),
            Param::ServerPort(r) => write!(f, "server_port={r}"),
            Param::Port(r) => write!(f, "port={r}"),
            Param::Interleaved(r) => write!(f, "interleaved={r}"),
            Param::Ttl(t) => write!(f, "ttl={t}"),
            Param::Layers(n) => write!(f, "layers={n}"),
            Param::Source(s) => write!(f, "source={s}"),
            Param::Destination(None) => f.write_str("destination"),
            Param::Destination(Some(d)) => write!(f, "destination={d}"),
            Param::Ssrc(s) => write!(f, "ssrc={s}"),
            Param::Mode(m) => write!(f, "mode=\"{m}\""),
            Param::Other { name, value: None } => f.write_str(name),
            Param::Other {
                name,
                value: Some(v),
            } => write!(f, "{name}={v}"),
        }
    }
}

/// A parameter and, while vgate has not changed it, its original text.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Slot<'a> {
    original: Option<&'a str>,
    param: Param<'a>,
}

/// One alternative of a Transport header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportSpec<'a> {
    protocol_text: &'a str,
    /// `RTP` in `RTP/AVP/UDP`.
    pub protocol: &'a str,
    /// `AVP` in `RTP/AVP/UDP` (also `SAVP`, `AVPF`, `SAVPF`).
    pub profile: &'a str,
    pub lower: LowerTransport,
    slots: Vec<Slot<'a>>,
}

/// Parses a Transport header value into its comma-separated alternatives.
pub fn parse_transport(value: &str) -> Result<Vec<TransportSpec<'_>>, RtspError> {
    if value.len() > MAX_TRANSPORT_LEN {
        return Err(RtspError::TransportTooLong {
            limit: MAX_TRANSPORT_LEN,
        });
    }
    let specs = split_unquoted(value, ',', MAX_TRANSPORT_SPECS)?;
    specs.into_iter().map(TransportSpec::parse).collect()
}

/// Writes alternatives back as one header value.
pub fn format_transport(specs: &[TransportSpec<'_>]) -> String {
    let parts: Vec<String> = specs.iter().map(ToString::to_string).collect();
    parts.join(",")
}

/// Splits on `sep` outside double quotes (backslash escapes inside quotes,
/// RFC 7826 quoted-pair). An unterminated quote is an error, not a panic.
fn split_unquoted(s: &str, sep: char, max_parts: usize) -> Result<Vec<&str>, RtspError> {
    let mut parts = Vec::new();
    let mut start = 0;
    let mut in_quotes = false;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match (in_quotes, escaped, c) {
            (true, true, _) => escaped = false,
            (true, false, '\\') => escaped = true,
            (_, _, '"') => in_quotes = !in_quotes,
            (false, _, c) if c == sep => {
                parts.push(s.get(start..i).unwrap_or_default());
                start = i + c.len_utf8();
                if parts.len() >= max_parts {
                    return Err(RtspError::TransportTooLong {
                        limit: MAX_TRANSPORT_LEN,
                    });
                }
            }
            _ => {}
        }
    }
    if in_quotes {
        return Err(RtspError::UnterminatedQuote);
    }
    parts.push(s.get(start..).unwrap_or_default());
    Ok(parts)
}

impl<'a> TransportSpec<'a> {
    fn parse(text: &'a str) -> Result<Self, RtspError> {
        let mut pieces = split_unquoted(text, ';', MAX_TRANSPORT_PARAMS + 1)?;
        // One trailing ';' is common from sloppy clients and harmless.
        if pieces.len() > 1 && pieces.last().is_some_and(|p| p.trim().is_empty()) {
            pieces.pop();
        }
        let mut pieces = pieces.into_iter();
        let protocol_text = pieces.next().unwrap_or_default().trim();
        if protocol_text.is_empty() {
            return Err(RtspError::EmptyTransport);
        }
        let (protocol, profile, lower) = parse_protocol(protocol_text)?;
        let mut spec = TransportSpec {
            protocol_text,
            protocol,
            profile,
            lower,
            slots: Vec::new(),
        };
        for piece in pieces {
            let piece = piece.trim();
            let param = parse_param(piece)?;
            if spec.slot_index(param.key()).is_some() {
                return Err(RtspError::DuplicateTransportParam {
                    param: static_key(&param),
                });
            }
            spec.slots.push(Slot {
                original: Some(piece),
                param,
            });
        }
        Ok(spec)
    }

    /// All parameters in wire order.
    pub fn params(&self) -> impl Iterator<Item = &Param<'a>> {
        self.slots.iter().map(|s| &s.param)
    }

    pub fn cast(&self) -> Cast {
        self.params()
            .find_map(|p| match p {
                Param::Unicast => Some(Cast::Unicast),
                Param::Multicast => Some(Cast::Multicast),
                _ => None,
            })
            .unwrap_or(Cast::Unspecified)
    }

    pub fn client_port(&self) -> Option<PortRange> {
        self.params().find_map(|p| match p {
            Param::ClientPort(r) => Some(*r),
            _ => None,
        })
    }

    pub fn server_port(&self) -> Option<PortRange> {
        self.params().find_map(|p| match p {
            Param::ServerPort(r) => Some(*r),
            _ => None,
        })
    }

    pub fn interleaved(&self) -> Option<ChannelRange> {
        self.params().find_map(|p| match p {
            Param::Interleaved(r) => Some(*r),
            _ => None,
        })
    }

    pub fn source(&self) -> Option<&str> {
        self.params().find_map(|p| match p {
            Param::Source(s) => Some(s.as_ref()),
            _ => None,
        })
    }

    /// `Some(None)` for a bare `destination`, `Some(Some(host))` with a value.
    pub fn destination(&self) -> Option<Option<&'a str>> {
        self.params().find_map(|p| match p {
            Param::Destination(d) => Some(*d),
            _ => None,
        })
    }

    pub fn ssrc(&self) -> Option<&'a str> {
        self.params().find_map(|p| match p {
            Param::Ssrc(s) => Some(*s),
            _ => None,
        })
    }

    pub fn mode(&self) -> Option<&'a str> {
        self.params().find_map(|p| match p {
            Param::Mode(m) => Some(*m),
            _ => None,
        })
    }

    pub fn ttl(&self) -> Option<u8> {
        self.params().find_map(|p| match p {
            Param::Ttl(t) => Some(*t),
            _ => None,
        })
    }

    /// A parameter vgate does not type, by name (case-insensitive).
    pub fn other(&self, name: &str) -> Option<Option<&'a str>> {
        self.params().find_map(|p| match p {
            Param::Other { name: n, value } if n.eq_ignore_ascii_case(name) => Some(*value),
            _ => None,
        })
    }

    // ---- policy ---------------------------------------------------------

    /// vgate relays unicast only: multicast would need group membership on
    /// the far side and turns one SETUP into traffic for many.
    pub fn require_unicast(&self) -> Result<(), RtspError> {
        if self.cast() == Cast::Multicast {
            return Err(RtspError::MulticastRefused);
        }
        let multicast_destination = self
            .destination()
            .flatten()
            .and_then(|d| d.parse::<IpAddr>().ok())
            .is_some_and(|ip| ip.is_multicast());
        if multicast_destination {
            return Err(RtspError::MulticastRefused);
        }
        Ok(())
    }

    /// `destination=` (and RTSP 2.0 `dest_addr=`) may only name the client
    /// that sent the request: otherwise anyone can aim a camera's stream at
    /// a third party (RFC 7826 §21.2.1). Host names cannot be checked and
    /// are refused.
    pub fn check_destination(&self, client: IpAddr) -> Result<(), RtspError> {
        if let Some(Some(dest)) = self.destination() {
            if dest.trim().parse::<IpAddr>() != Ok(client) {
                return Err(RtspError::ForeignDestination);
            }
        }
        if let Some(value) = self.other("dest_addr") {
            let value = value.unwrap_or_default();
            let addrs = value.trim_matches('"');
            if addrs.split('/').any(|a| !dest_addr_is(a, client)) {
                return Err(RtspError::ForeignDestination);
            }
        }
        Ok(())
    }

    /// How media will travel for this alternative.
    pub fn delivery(&self) -> Result<Delivery, RtspError> {
        match self.lower {
            LowerTransport::Udp => self
                .client_port()
                .map(|client_port| Delivery::Udp { client_port })
                .ok_or(RtspError::MissingClientPort),
            LowerTransport::Tcp => Ok(Delivery::Interleaved {
                channels: self.interleaved(),
            }),
        }
    }

    /// All request-side checks for one alternative, returning its delivery.
    fn acceptable(&self, client: IpAddr, policy: &TransportPolicy) -> Result<Delivery, RtspError> {
        if !self.protocol.eq_ignore_ascii_case("RTP") {
            return Err(RtspError::BadTransportProtocol);
        }
        self.require_unicast()?;
        self.check_destination(client)?;
        let delivery = self.delivery()?;
        let allowed = match delivery {
            Delivery::Udp { .. } => policy.allow_udp,
            Delivery::Interleaved { .. } => policy.allow_interleaved,
        };
        if !allowed {
            return Err(RtspError::NoAcceptableTransport);
        }
        Ok(delivery)
    }

    // ---- rewrites -------------------------------------------------------

    /// Client ports as the upstream must see them (vgate's upstream-side
    /// ports in a request; vgate's client-side ports in a reply).
    pub fn with_client_port(self, rtp: u16, rtcp: Option<u16>) -> Result<Self, RtspError> {
        let range = PortRange::pair("client_port", rtp, rtcp)?;
        Ok(self.with_param(Param::ClientPort(range)))
    }

    /// Server ports as the client must see them (vgate's client-side ports).
    pub fn with_server_port(self, rtp: u16, rtcp: Option<u16>) -> Result<Self, RtspError> {
        let range = PortRange::pair("server_port", rtp, rtcp)?;
        Ok(self.with_param(Param::ServerPort(range)))
    }

    /// `source=` naming vgate instead of the upstream server.
    pub fn with_source(self, ip: IpAddr) -> Self {
        self.with_param(Param::Source(Cow::Owned(ip.to_string())))
    }

    /// Drops `destination` and `dest_addr`: past the policy check they only
    /// carry one domain's addresses into the other.
    pub fn without_destination(self) -> Self {
        self.without("destination").without("dest_addr")
    }

    /// Drops every parameter of this name (e.g. RTSP 2.0 `src_addr`).
    pub fn without(mut self, name: &str) -> Self {
        self.slots
            .retain(|s| !s.param.key().eq_ignore_ascii_case(name));
        self
    }

    /// Says `unicast` explicitly when the peer said neither: RFC 2326's
    /// default is multicast and servers differ on honouring it.
    pub fn with_unicast(mut self) -> Self {
        if self.cast() == Cast::Unspecified {
            self.slots.insert(
                0,
                Slot {
                    original: None,
                    param: Param::Unicast,
                },
            );
        }
        self
    }

    /// Replaces the parameter of the same kind in place, or appends it.
    fn with_param(mut self, param: Param<'a>) -> Self {
        let slot = Slot {
            original: None,
            param,
        };
        let key = slot.param.key().to_owned();
        match self
            .slots
            .iter_mut()
            .find(|s| s.param.key().eq_ignore_ascii_case(&key))
        {
            Some(existing) => *existing = slot,
            None => self.slots.push(slot),
        }
        self
    }

    fn slot_index(&self, key: &str) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.param.key().eq_ignore_ascii_case(key))
    }
}

impl fmt::Display for TransportSpec<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.protocol_text)?;
        for slot in &self.slots {
            f.write_str(";")?;
            match slot.original {
                Some(text) => f.write_str(text)?,
                None => slot.param.write_canonical(f)?,
            }
        }
        Ok(())
    }
}

/// One `dest_addr` entry: `":port"` (the sender itself) or `host:port`.
fn dest_addr_is(entry: &str, client: IpAddr) -> bool {
    let entry = entry.trim();
    if entry.starts_with(':') {
        return true;
    }
    let host = match entry.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => entry,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.parse::<IpAddr>() == Ok(client)
}

/// What the chosen alternative means for the forwarding plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// RTP/RTCP to these client ports over UDP.
    Udp { client_port: PortRange },
    /// RTP/RTCP as `$` frames on the RTSP connection; channels may be left
    /// for the server to choose.
    Interleaved { channels: Option<ChannelRange> },
}

/// Which deliveries this route allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransportPolicy {
    pub allow_udp: bool,
    pub allow_interleaved: bool,
}

impl Default for TransportPolicy {
    fn default() -> Self {
        TransportPolicy {
            allow_udp: true,
            allow_interleaved: true,
        }
    }
}

/// Picks the first alternative vgate can serve for `client`.
///
/// The proxy should forward only the chosen alternative upstream (it has
/// allocated ports for that one alone). A `destination` aimed at someone
/// else is reported as [`RtspError::ForeignDestination`] even when another
/// alternative would do, because it is worth a log line of its own.
pub fn select_transport<'s, 'a>(
    specs: &'s [TransportSpec<'a>],
    client: IpAddr,
    policy: &TransportPolicy,
) -> Result<(&'s TransportSpec<'a>, Delivery), RtspError> {
    let mut first_error = None;
    let mut foreign = false;
    let mut choice = None;
    for spec in specs {
        match spec.acceptable(client, policy) {
            Ok(delivery) if choice.is_none() => choice = Some((spec, delivery)),
            Ok(_) => {}
            Err(e) => {
                foreign |= e == RtspError::ForeignDestination;
                first_error.get_or_insert(e);
            }
        }
    }
    match (foreign, choice, first_error) {
        (true, _, _) => Err(RtspError::ForeignDestination),
        (false, Some(choice), _) => Ok(choice),
        (false, None, Some(e)) if specs.len() == 1 => Err(e),
        _ => Err(RtspError::NoAcceptableTransport),
    }
}

fn parse_protocol(text: &str) -> Result<(&str, &str, LowerTransport), RtspError> {
    let mut parts = text.split('/');
    let (Some(protocol), Some(profile), lower, None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(RtspError::BadTransportProtocol);
    };
    if !is_plain_token(protocol) || !is_plain_token(profile) {
        return Err(RtspError::BadTransportProtocol);
    }
    let lower = match lower {
        None => LowerTransport::Udp,
        Some(l) if l.eq_ignore_ascii_case("UDP") => LowerTransport::Udp,
        Some(l) if l.eq_ignore_ascii_case("TCP") => LowerTransport::Tcp,
        Some(_) => return Err(RtspError::UnsupportedLowerTransport),
    };
    Ok((protocol, profile, lower))
}

fn is_plain_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn parse_param(piece: &str) -> Result<Param<'_>, RtspError> {
    if piece.is_empty() {
        return Err(RtspError::BadTransportParam { param: "(empty)" });
    }
    let (name, value) = match piece.split_once('=') {
        Some((n, v)) => (n.trim(), Some(v.trim())),
        None => (piece, None),
    };
    let lname = name.to_ascii_lowercase();
    match (lname.as_str(), value) {
        ("unicast", None) => Ok(Param::Unicast),
        ("multicast", None) => Ok(Param::Multicast),
        ("append", None) => Ok(Param::Append),
        ("destination", None) => Ok(Param::Destination(None)),
        ("client_port", Some(v)) => parse_port_range("client_port", v).map(Param::ClientPort),
        ("server_port", Some(v)) => parse_port_range("server_port", v).map(Param::ServerPort),
        ("port", Some(v)) => parse_port_range("port", v).map(Param::Port),
        ("interleaved", Some(v)) => parse_channel_range(v).map(Param::Interleaved),
        ("ttl", Some(v)) => parse_number(v, "ttl").map(Param::Ttl),
        ("layers", Some(v)) => parse_number(v, "layers").map(Param::Layers),
        ("source", Some(v)) => parse_host(v, "source").map(|h| Param::Source(Cow::Borrowed(h))),
        ("destination", Some(v)) => {
            parse_host(v, "destination").map(|h| Param::Destination(Some(h)))
        }
        ("ssrc", Some(v)) => parse_ssrc(v).map(Param::Ssrc),
        ("mode", Some(v)) => parse_mode(v).map(Param::Mode),
        (known, _) if KNOWN.contains(&known) => Err(RtspError::BadTransportParam {
            param: static_name(known),
        }),
        _ => parse_other(name, value),
    }
}

const KNOWN: [&str; 13] = [
    "unicast",
    "multicast",
    "append",
    "destination",
    "client_port",
    "server_port",
    "port",
    "interleaved",
    "ttl",
    "layers",
    "source",
    "ssrc",
    "mode",
];

/// Error messages take `&'static str`, never peer bytes.
fn static_name(lower_name: &str) -> &'static str {
    KNOWN
        .iter()
        .find(|k| **k == lower_name)
        .copied()
        .unwrap_or("(unknown)")
}

fn static_key(param: &Param<'_>) -> &'static str {
    match param {
        Param::Unicast | Param::Multicast => "unicast/multicast",
        Param::Other { .. } => "(extension)",
        other => static_name(other.key()),
    }
}

fn parse_port_range(param: &'static str, v: &str) -> Result<PortRange, RtspError> {
    let (first, last) = match v.split_once('-') {
        Some((a, b)) => (parse_port(param, a)?, parse_port(param, b)?),
        None => {
            let p = parse_port(param, v)?;
            (p, p)
        }
    };
    if last < first {
        return Err(RtspError::ReversedRange { param });
    }
    Ok(PortRange { first, last })
}

fn parse_port(param: &'static str, s: &str) -> Result<u16, RtspError> {
    match parse_number::<u16>(s.trim(), param) {
        Ok(0) | Err(_) => Err(RtspError::BadPort { param }),
        Ok(p) => Ok(p),
    }
}

fn parse_channel_range(v: &str) -> Result<ChannelRange, RtspError> {
    let channel = |s: &str| parse_number::<u8>(s.trim(), "interleaved");
    let (first, last) = match v.split_once('-') {
        Some((a, b)) => (channel(a)?, channel(b)?),
        None => {
            let c = channel(v)?;
            (c, c)
        }
    };
    if last < first {
        return Err(RtspError::ReversedRange {
            param: "interleaved",
        });
    }
    Ok(ChannelRange { first, last })
}

/// Decimal digits only (no sign, no spaces), value must fit `T`.
fn parse_number<T: std::str::FromStr>(s: &str, param: &'static str) -> Result<T, RtspError> {
    if s.is_empty() || s.len() > 10 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(RtspError::BadTransportParam { param });
    }
    s.parse()
        .map_err(|_| RtspError::BadTransportParam { param })
}

/// A host as written: IPv4, IPv6 or a name; no quotes, spaces or separators.
fn parse_host<'v>(v: &'v str, param: &'static str) -> Result<&'v str, RtspError> {
    let ok = !v.is_empty()
        && v.len() <= 255
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-:_[]%".contains(&b));
    ok.then_some(v)
        .ok_or(RtspError::BadTransportParam { param })
}

fn parse_ssrc(v: &str) -> Result<&str, RtspError> {
    let one_ok = |s: &str| (1..=8).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit());
    if v.split('/').count() <= 8 && v.split('/').all(one_ok) {
        Ok(v)
    } else {
        Err(RtspError::BadTransportParam { param: "ssrc" })
    }
}

/// `mode=PLAY`, `mode="PLAY"`, `mode="PLAY,RECORD"`: returns the inside.
fn parse_mode(v: &str) -> Result<&str, RtspError> {
    let bad = RtspError::BadTransportParam { param: "mode" };
    let inner = match v.strip_prefix('"') {
        Some(rest) => rest.strip_suffix('"').ok_or(bad.clone())?,
        None => v,
    };
    let ok = inner.split(',').all(|m| {
        !m.trim().is_empty()
            && m.trim()
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_')
    });
    ok.then_some(inner).ok_or(bad)
}

fn parse_other<'v>(name: &'v str, value: Option<&'v str>) -> Result<Param<'v>, RtspError> {
    let bad = RtspError::BadTransportParam {
        param: "(extension)",
    };
    if !is_plain_token(name) {
        return Err(bad);
    }
    if let Some(v) = value {
        if v.is_empty() || v.chars().any(|c| c.is_control()) {
            return Err(bad);
        }
    }
    Ok(Param::Other { name, value })
}

#[cfg(test)]
mod tests;
