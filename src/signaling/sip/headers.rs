//! Header names and the header values a proxy has to understand.
//!
//! Names: compact forms (RFC 3261 §7.3.3 and later RFCs) map to their full names, and
//! names compare case-insensitively. Values: Via (§20.42), name-addr/addr-spec for
//! From/To/Contact/Route/Record-Route (§20.10), CSeq, Max-Forwards, Content-Length and
//! `;name=value` parameters. Everything is a view over the header value, LWS and
//! folding included; every other header stays an opaque byte string.

use super::lex::{
    eq_ic, find_byte, first, is_lws, is_token, is_token_char, parse_decimal, quoted_len, rest,
    split_at, take_while, trim_lws, trim_lws_start,
};
use super::uri::{parse_port, scheme_of, GbId, Host, Uri};
use super::SipError;

/// Compact form → full name, lowercase compact letters as keys.
const COMPACT: &[(u8, &str)] = &[
    (b'a', "Accept-Contact"),
    (b'b', "Referred-By"),
    (b'c', "Content-Type"),
    (b'd', "Request-Disposition"),
    (b'e', "Content-Encoding"),
    (b'f', "From"),
    (b'i', "Call-ID"),
    (b'j', "Reject-Contact"),
    (b'k', "Supported"),
    (b'l', "Content-Length"),
    (b'm', "Contact"),
    (b'n', "Identity-Info"),
    (b'o', "Event"),
    (b'r', "Refer-To"),
    (b's', "Subject"),
    (b't', "To"),
    (b'u', "Allow-Events"),
    (b'v', "Via"),
    (b'x', "Session-Expires"),
    (b'y', "Identity"),
];

/// The full name for a compact one (`v` → `Via`); any other name is returned as is.
/// Compare the result with [`eq_ignore_ascii_case`](slice::eq_ignore_ascii_case).
pub fn full_name(name: &[u8]) -> &[u8] {
    if let [c] = name {
        let c = c.to_ascii_lowercase();
        if let Some((_, full)) = COMPACT.iter().find(|(k, _)| *k == c) {
            return full.as_bytes();
        }
    }
    name
}

/// Same header, whatever the case or the compact/full form of either name.
pub(crate) fn same_name(a: &[u8], b: &[u8]) -> bool {
    eq_ic(full_name(a), full_name(b))
}

/// Headers whose grammar is a comma-separated list, so one field may carry several
/// values. Others (notably Authorization, WWW-Authenticate, Date, Call-ID, From, To)
/// contain commas that do not separate values and are never split.
pub fn is_list_header(name: &[u8]) -> bool {
    const LISTS: &[&str] = &[
        "Via",
        "Route",
        "Record-Route",
        "Path",
        "Service-Route",
        "Contact",
        "Allow",
        "Supported",
        "Require",
        "Proxy-Require",
        "Unsupported",
        "Accept",
        "Accept-Encoding",
        "Accept-Language",
        "Allow-Events",
        "Content-Encoding",
        "In-Reply-To",
        "Alert-Info",
        "Call-Info",
        "Error-Info",
        "Warning",
    ];
    let full = full_name(name);
    LISTS.iter().any(|l| eq_ic(full, l.as_bytes()))
}

/// One `;name[=value]` parameter. The value keeps its quotes if it was quoted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Param<'a> {
    pub name: &'a [u8],
    pub value: Option<&'a [u8]>,
}

/// A validated run of header parameters (`;a=1 ; b ;c="x"`), kept as the raw slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Params<'a> {
    raw: &'a [u8],
}

impl<'a> Params<'a> {
    /// Checks `*( SEMI name [ EQUAL value ] )` with LWS allowed around `;` and `=`.
    pub fn parse(raw: &'a [u8]) -> Result<Params<'a>, SipError> {
        let mut s = raw;
        while let Some((_, tail)) = next_param(s)? {
            s = tail;
        }
        Ok(Params { raw })
    }

    /// The parameters exactly as written, leading `;` included.
    pub fn raw(&self) -> &'a [u8] {
        self.raw
    }

    pub fn iter(&self) -> impl Iterator<Item = Param<'a>> {
        let mut s = self.raw;
        std::iter::from_fn(move || {
            let (p, tail) = next_param(s).ok().flatten()?;
            s = tail;
            Some(p)
        })
    }

    /// A parameter by case-insensitive name: `Some(None)` for a flag such as `rport`.
    pub fn get(&self, name: &str) -> Option<Option<&'a [u8]>> {
        self.iter()
            .find(|p| eq_ic(p.name, name.as_bytes()))
            .map(|p| p.value)
    }
}

/// Value characters beyond `token`: `host` values such as `[2001:db8::1]`.
fn is_gen_value_char(b: u8) -> bool {
    is_token_char(b) || matches!(b, b'[' | b']' | b':')
}

/// Reads one parameter from `s`; `Ok(None)` at the end of the input.
fn next_param(s: &[u8]) -> Result<Option<(Param<'_>, &[u8])>, SipError> {
    let s = trim_lws_start(s);
    if s.is_empty() {
        return Ok(None);
    }
    let s = s
        .strip_prefix(b";")
        .ok_or(SipError::BadParams("expected ';' before a parameter"))?;
    let (name, s) = take_while(trim_lws_start(s), is_token_char);
    if name.is_empty() {
        return Err(SipError::BadParams(
            "empty parameter (\";;\" or a trailing ';')",
        ));
    }
    let after_name = trim_lws_start(s);
    let Some(v) = after_name.strip_prefix(b"=") else {
        return Ok(Some((Param { name, value: None }, s)));
    };
    let v = trim_lws_start(v);
    let len = if first(v) == Some(b'"') {
        quoted_len(v)?
    } else {
        take_while(v, is_gen_value_char).0.len()
    };
    if len == 0 {
        return Err(SipError::BadParams("parameter has '=' but no value"));
    }
    let (value, tail) = split_at(v, len);
    Ok(Some((
        Param {
            name,
            value: Some(value),
        },
        tail,
    )))
}

/// One Via value: `SIP/2.0/UDP host:port;branch=...`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Via<'a> {
    pub protocol: &'a [u8],
    pub version: &'a [u8],
    pub transport: &'a [u8],
    pub host: Host<'a>,
    pub host_text: &'a [u8],
    pub port: Option<u16>,
    pub params: Params<'a>,
}

impl<'a> Via<'a> {
    /// Parses one via-parm (split a Via field with [`CommaValues`](super::CommaValues)
    /// first). LWS is allowed around `/`, `:` and `;` as §25.1 says.
    pub fn parse(value: &'a [u8]) -> Result<Via<'a>, SipError> {
        let s = trim_lws(value);
        let (protocol, s) = take_while(s, is_token_char);
        let s = expect_slash(s)?;
        let (version, s) = take_while(s, is_token_char);
        let s = expect_slash(s)?;
        let (transport, s) = take_while(s, is_token_char);
        if protocol.is_empty() || version.is_empty() || transport.is_empty() {
            return Err(SipError::BadVia("sent-protocol must be like SIP/2.0/UDP"));
        }
        if !first(s).is_some_and(is_lws) {
            return Err(SipError::BadVia("expected whitespace before sent-by"));
        }
        let s = trim_lws_start(s);
        let host_len = if first(s) == Some(b'[') {
            find_byte(s, b']')
                .map(|i| i + 1)
                .ok_or(SipError::BadVia("IPv6 reference is missing its ']'"))?
        } else {
            take_while(s, |b| {
                b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_')
            })
            .0
            .len()
        };
        let (host_text, s) = split_at(s, host_len);
        let host =
            Host::parse(host_text).map_err(|_| SipError::BadVia("sent-by host is malformed"))?;
        let s = trim_lws_start(s);
        let (port, s) = match s.strip_prefix(b":") {
            Some(p) => {
                let (digits, tail) = take_while(trim_lws_start(p), |b| b.is_ascii_digit());
                (
                    Some(
                        parse_port(digits)
                            .ok_or(SipError::BadVia("sent-by port must be 0-65535"))?,
                    ),
                    tail,
                )
            }
            None => (None, s),
        };
        let params = Params::parse(s).map_err(|_| SipError::BadVia("malformed Via parameters"))?;
        let via = Via {
            protocol,
            version,
            transport,
            host,
            host_text,
            port,
            params,
        };
        via.check_params()?;
        Ok(via)
    }

    fn check_params(&self) -> Result<(), SipError> {
        if let Some(r) = self.received() {
            if !matches!(Host::parse(r), Ok(Host::V4(_) | Host::V6(_))) {
                return Err(SipError::BadVia("received must be an IP address"));
            }
        }
        if let Some(Some(p)) = self.params.get("rport") {
            parse_port(p).ok_or(SipError::BadVia("rport must be a port number"))?;
        }
        if self.params.get("branch") == Some(None) {
            return Err(SipError::BadVia("branch without a value"));
        }
        Ok(())
    }

    /// The transaction ID; RFC 3261 ones start with `z9hG4bK` (RFC 2543 peers send none).
    pub fn branch(&self) -> Option<&'a [u8]> {
        self.params.get("branch").flatten()
    }

    pub fn received(&self) -> Option<&'a [u8]> {
        self.params.get("received").flatten()
    }

    /// `None`: no rport; `Some(None)`: rport asked for (RFC 3581); `Some(Some(p))`: filled in.
    pub fn rport(&self) -> Option<Option<u16>> {
        self.params.get("rport").map(|v| v.and_then(parse_port))
    }

    pub fn maddr(&self) -> Option<&'a [u8]> {
        self.params.get("maddr").flatten()
    }

    /// Every address in this Via a response could be sent to (sent-by, received, maddr).
    pub fn destinations(&self) -> impl Iterator<Item = Host<'a>> {
        let extra = [self.received(), self.maddr()];
        std::iter::once(self.host).chain(
            extra
                .into_iter()
                .flatten()
                .filter_map(|h| Host::parse(h).ok()),
        )
    }
}

fn expect_slash(s: &[u8]) -> Result<&[u8], SipError> {
    trim_lws_start(s)
        .strip_prefix(b"/")
        .map(trim_lws_start)
        .ok_or(SipError::BadVia("sent-protocol must be like SIP/2.0/UDP"))
}

/// From, To, Contact, Route and Record-Route values: `"Name" <uri>;params`,
/// `Name <uri>;params` or a bare `uri;params` (then the params belong to the header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NameAddr<'a> {
    /// Quoted (quotes kept) or a run of tokens; `None` when absent.
    pub display_name: Option<&'a [u8]>,
    /// The URI text, without `<` `>`.
    pub uri: &'a [u8],
    /// Whether the URI was enclosed in `<>`.
    pub bracketed: bool,
    pub params: Params<'a>,
}

impl<'a> NameAddr<'a> {
    pub fn parse(value: &'a [u8]) -> Result<NameAddr<'a>, SipError> {
        let s = trim_lws(value);
        let (display_name, bracketed_part) = if first(s) == Some(b'"') {
            let len = quoted_len(s)
                .map_err(|_| SipError::BadNameAddr("unterminated quoted display name"))?;
            let (dn, tail) = split_at(s, len);
            (Some(dn), Some(trim_lws_start(tail)))
        } else if let Some(lt) = find_byte(s, b'<') {
            let (dn, tail) = split_at(s, lt);
            let dn = trim_lws(dn);
            if !dn
                .split(|&b| is_lws(b))
                .all(|w| w.is_empty() || is_token(w))
            {
                return Err(SipError::BadNameAddr(
                    "display name with special characters must be quoted",
                ));
            }
            (if dn.is_empty() { None } else { Some(dn) }, Some(tail))
        } else {
            (None, None)
        };
        match bracketed_part {
            Some(b) => Self::parse_bracketed(display_name, b),
            None => Self::parse_addr_spec(s),
        }
    }

    fn parse_bracketed(
        display_name: Option<&'a [u8]>,
        s: &'a [u8],
    ) -> Result<NameAddr<'a>, SipError> {
        let inner = s
            .strip_prefix(b"<")
            .ok_or(SipError::BadNameAddr("expected '<' after the display name"))?;
        let gt = find_byte(inner, b'>').ok_or(SipError::BadNameAddr("'<' without '>'"))?;
        let (uri, tail) = split_at(inner, gt);
        if uri.is_empty() || uri.iter().any(|&b| is_lws(b) || b == b'<') {
            return Err(SipError::BadNameAddr("no whitespace allowed inside <...>"));
        }
        scheme_of(uri).map_err(|_| SipError::BadNameAddr("URI inside <...> is malformed"))?;
        let params = Params::parse(rest(tail))?;
        Ok(NameAddr {
            display_name,
            uri,
            bracketed: true,
            params,
        })
    }

    fn parse_addr_spec(s: &'a [u8]) -> Result<NameAddr<'a>, SipError> {
        // §20: without <>, the URI ends at the first ';' and must not contain ',' '?'.
        let (uri, tail) = take_while(s, |b| b != b';' && !is_lws(b));
        if uri.iter().any(|&b| b == b',' || b == b'?') {
            return Err(SipError::BadNameAddr(
                "a URI with ',', '?' or ';' must be enclosed in <>",
            ));
        }
        scheme_of(uri).map_err(|_| SipError::BadNameAddr("malformed URI"))?;
        let params = Params::parse(tail)?;
        Ok(NameAddr {
            display_name: None,
            uri,
            bracketed: false,
            params,
        })
    }

    /// The URI parsed as `sip:`/`sips:`.
    pub fn sip_uri(&self) -> Result<Uri<'a>, SipError> {
        Uri::parse(self.uri)
    }

    pub fn tag(&self) -> Option<&'a [u8]> {
        self.params.get("tag").flatten()
    }

    /// The `expires` Contact parameter, when it is a number (absurd values read as `None`).
    pub fn expires(&self) -> Option<u32> {
        let v = self.params.get("expires").flatten()?;
        parse_decimal(v, u64::from(u32::MAX)).and_then(|n| u32::try_from(n).ok())
    }

    /// The GB/T 28181 ID in the user part of the URI.
    pub fn gb_id(&self) -> Result<GbId<'a>, SipError> {
        self.sip_uri()?.gb_id()
    }
}

/// `CSeq: 1*DIGIT LWS Method`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CSeq<'a> {
    pub seq: u32,
    pub method: &'a [u8],
}

impl<'a> CSeq<'a> {
    /// The number must be below 2**31 (§8.1.1.5); leading zeros are fine.
    pub fn parse(value: &'a [u8]) -> Result<CSeq<'a>, SipError> {
        let s = trim_lws(value);
        let (digits, s) = take_while(s, |b| b.is_ascii_digit());
        if digits.is_empty() {
            return Err(SipError::BadCSeq("must start with a sequence number"));
        }
        let seq = parse_decimal(digits, (1 << 31) - 1)
            .ok_or(SipError::BadCSeq("sequence number must be below 2^31"))?;
        if !first(s).is_some_and(is_lws) {
            return Err(SipError::BadCSeq("expected whitespace after the number"));
        }
        let method = trim_lws_start(s);
        if !is_token(method) {
            return Err(SipError::BadCSeq("method must be one token"));
        }
        let seq = u32::try_from(seq)
            .map_err(|_| SipError::BadCSeq("sequence number must be below 2^31"))?;
        Ok(CSeq { seq, method })
    }
}

/// `Max-Forwards: 1*DIGIT`, 0–255 (RFC 4475 §3.1.2.4 treats more as malformed).
pub fn parse_max_forwards(value: &[u8]) -> Result<u8, SipError> {
    parse_decimal(trim_lws(value), 255)
        .and_then(|n| u8::try_from(n).ok())
        .ok_or(SipError::BadMaxForwards)
}

/// `Content-Length: 1*DIGIT` as a byte count.
pub fn parse_content_length(value: &[u8]) -> Result<usize, SipError> {
    parse_decimal(trim_lws(value), u64::from(u32::MAX))
        .and_then(|n| usize::try_from(n).ok())
        .ok_or(SipError::ContentLengthInvalid)
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
    use crate::signaling::sip::CommaValues;

    #[test]
    fn compact_names() {
        assert!(same_name(b"v", b"VIA"));
        assert!(same_name(b"i", b"call-id"));
        assert!(!same_name(b"C%6Fntact", b"Contact"));
        assert!(is_list_header(b"m"));
        assert!(!is_list_header(b"Authorization"));
    }

    #[test]
    fn folded_via_from_wsinv() {
        let v = Via::parse(b"SIP  /   2.0\r\n /UDP\r\n    192.0.2.2;branch=390skdjuw").unwrap();
        assert_eq!(v.transport, b"UDP");
        assert_eq!(v.branch(), Some(&b"390skdjuw"[..]));
        let field = b" SIP  / 2.0  / TCP     spindle.example.com   ;\r\n  branch  =   z9hG4bK9ikj8  ,\r\n SIP  /    2.0   / UDP  192.168.255.111   ; branch=\r\n z9hG4bK30239";
        let vias: Vec<_> = CommaValues::new(field)
            .map(Via::parse)
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(vias[0].branch(), Some(&b"z9hG4bK9ikj8"[..]));
        assert_eq!(vias[1].host, Host::V4([192, 168, 255, 111].into()));
        assert_eq!(vias[1].branch(), Some(&b"z9hG4bK30239"[..]));
    }

    #[test]
    fn via_params() {
        let v =
            Via::parse(b"SIP/2.0/UDP [2001:db8::9]:5070;rport;received=192.0.2.1;branch=z9hG4bKx")
                .unwrap();
        assert_eq!(v.port, Some(5070));
        assert_eq!(v.rport(), Some(None));
        assert_eq!(v.received(), Some(&b"192.0.2.1"[..]));
        assert!(Via::parse(b"SIP/2.0/UDP 192.0.2.15;;").is_err());
        assert!(Via::parse(b"SIP/2.0/UDP h;received=not-an-ip").is_err());
    }

    #[test]
    fn name_addr_forms() {
        let n = NameAddr::parse(
            b"\"J Rosenberg \\\\\\\"\"       <sip:jdrosen@example.com>\r\n  ;\r\n  tag = 98asjd8",
        )
        .unwrap();
        assert_eq!(n.tag(), Some(&b"98asjd8"[..]));
        let n = NameAddr::parse(b"caller<sip:caller@example.com>;tag=323").unwrap();
        assert_eq!(n.display_name, Some(&b"caller"[..]));
        let n = NameAddr::parse(b"sip:+19725552222@gw1.example.net;unknownparam").unwrap();
        assert_eq!(n.uri, b"sip:+19725552222@gw1.example.net");
        assert_eq!(n.params.get("unknownparam"), Some(None));
        assert!(NameAddr::parse(b"\"Mr. J. User <sip:j.user@example.com>").is_err());
        assert!(NameAddr::parse(b"\"Watson\" < sip:t.watson@example.org >").is_err());
        assert!(NameAddr::parse(b"Bell, Alexander <sip:a.g.bell@example.com>;tag=43").is_err());
        assert!(NameAddr::parse(b"sip:user@example.com?Route=%3Csip:sip.example.com%3E").is_err());
        assert!(NameAddr::parse(b"\"Joe\" <sip:joe@example.org>;;;;").is_err());
        let n = NameAddr::parse(b"<sip:u@h>;expires=280297596632815").unwrap();
        assert_eq!(n.expires(), None);
    }

    #[test]
    fn scalars() {
        assert_eq!(
            CSeq::parse(b"0009\r\n  INVITE").unwrap(),
            CSeq {
                seq: 9,
                method: b"INVITE"
            }
        );
        assert!(CSeq::parse(b"36893488147419103232 REGISTER").is_err());
        assert!(CSeq::parse(b"8INVITE").is_err());
        assert_eq!(parse_max_forwards(b" 0068"), Ok(68));
        assert!(parse_max_forwards(b"300").is_err());
        assert!(parse_content_length(b"-999").is_err());
    }
}
