//! `sip:` and `sips:` URIs (RFC 3261 §19.1, §25.1) and GB/T 28181 device IDs.
//!
//! A [`Uri`] is a view: user, password, host text, parameters and headers are slices
//! of the input, `%` escapes left as sent (RFC 3261 compares some parts unescaped; the
//! proxy only routes, so it never needs the unescaped form). Other schemes are
//! recognised syntactically by [`scheme_of`] so callers can tell a malformed URI (400)
//! from a well-formed one vgate does not route (416).

use std::net::{Ipv4Addr, Ipv6Addr};

use super::lex::{eq_ic, find_byte, first, rest, split_at, take_while};
use super::SipError;

/// The two schemes vgate routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Sip,
    Sips,
}

/// A host as written in a URI or Via: literal addresses parsed, names kept as text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Host<'a> {
    V4(Ipv4Addr),
    V6(Ipv6Addr),
    /// A domain name (or anything name-shaped, e.g. a GB/T 28181 10-digit domain ID).
    Name(&'a str),
}

impl Host<'_> {
    /// Parses `host` = hostname / IPv4address / IPv6reference.
    pub fn parse(s: &[u8]) -> Result<Host<'_>, SipError> {
        if first(s) == Some(b'[') {
            let inner = s
                .strip_prefix(b"[")
                .and_then(|x| x.strip_suffix(b"]"))
                .ok_or(SipError::BadUri("IPv6 reference is missing its ']'"))?;
            let text =
                std::str::from_utf8(inner).map_err(|_| SipError::BadUri("bad IPv6 address"))?;
            return text
                .parse()
                .map(Host::V6)
                .map_err(|_| SipError::BadUri("bad IPv6 address"));
        }
        if s.is_empty() || !s.iter().all(|&b| is_host_char(b)) {
            return Err(SipError::BadUri(
                "host must be a domain name or an IP address",
            ));
        }
        // Only ASCII passed the check above, so this cannot fail.
        let text = std::str::from_utf8(s).map_err(|_| SipError::BadUri("host is not ASCII"))?;
        match text.parse::<Ipv4Addr>() {
            Ok(a) => Ok(Host::V4(a)),
            Err(_) => Ok(Host::Name(text)),
        }
    }

    /// An IPv4 address that must never be a destination: broadcast, multicast,
    /// unspecified. Sending a response there would reflect traffic onto a whole segment.
    pub fn is_unsafe_destination(&self) -> bool {
        match self {
            Host::V4(a) => a.is_broadcast() || a.is_multicast() || a.is_unspecified(),
            Host::V6(a) => a.is_multicast() || a.is_unspecified(),
            Host::Name(_) => false,
        }
    }
}

/// Domain names per RFC 1034 plus `_`, which real devices use in host names.
fn is_host_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_')
}

/// `unreserved` = alphanum / mark.
fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-_.!~*'()".contains(&b)
}

fn is_user_char(b: u8) -> bool {
    is_unreserved(b) || b"&=+$,;?/".contains(&b)
}

fn is_password_char(b: u8) -> bool {
    is_unreserved(b) || b"&=+$,".contains(&b)
}

fn is_param_char(b: u8) -> bool {
    is_unreserved(b) || b"[]/:&+$".contains(&b)
}

fn is_header_char(b: u8) -> bool {
    is_unreserved(b) || b"[]/?:+$".contains(&b)
}

/// Checks that `s` is made of `allowed` bytes and well-formed `%HH` escapes.
fn check_escaped(s: &[u8], allowed: fn(u8) -> bool, what: &'static str) -> Result<(), SipError> {
    let mut i = 0;
    while let Some(&b) = s.get(i) {
        if b == b'%' {
            let hex = s.get(i + 1..i + 3).ok_or(SipError::BadUri(what))?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return Err(SipError::BadUri(what));
            }
            i += 3;
        } else if allowed(b) {
            i += 1;
        } else {
            return Err(SipError::BadUri(what));
        }
    }
    Ok(())
}

/// The scheme of any absolute URI (`scheme ":" ...`), checked for syntax only:
/// ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ).
pub fn scheme_of(uri: &[u8]) -> Result<&[u8], SipError> {
    let colon = find_byte(uri, b':').ok_or(SipError::BadUri("no scheme (\"sip:\") in URI"))?;
    let (scheme, _) = split_at(uri, colon);
    let starts_alpha = first(scheme).is_some_and(|b| b.is_ascii_alphabetic());
    let rest_ok = scheme
        .iter()
        .all(|&b| b.is_ascii_alphanumeric() || b"+-.".contains(&b));
    if !starts_alpha || !rest_ok {
        return Err(SipError::BadUri("malformed URI scheme"));
    }
    if uri.iter().any(|&b| b <= b' ' || b == 0x7f) {
        return Err(SipError::BadUri("whitespace or control character in URI"));
    }
    Ok(scheme)
}

/// User and password of a URI's userinfo.
type UserInfo<'a> = (Option<&'a [u8]>, Option<&'a [u8]>);

/// A parsed `sip:` or `sips:` URI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Uri<'a> {
    pub scheme: Scheme,
    pub user: Option<&'a [u8]>,
    pub password: Option<&'a [u8]>,
    pub host: Host<'a>,
    /// The host exactly as written (brackets of an IPv6 reference included).
    pub host_text: &'a [u8],
    pub port: Option<u16>,
    /// `;`-separated uri-parameters without the leading `;` (empty when none).
    pub params: &'a [u8],
    /// The `?` headers part without the `?`.
    pub headers: Option<&'a [u8]>,
}

impl<'a> Uri<'a> {
    /// Parses a SIP or SIPS URI. Other well-formed schemes give
    /// [`SipError::UnsupportedScheme`]; anything malformed gives [`SipError::BadUri`].
    pub fn parse(s: &'a [u8]) -> Result<Uri<'a>, SipError> {
        let scheme_text = scheme_of(s)?;
        let scheme = if eq_ic(scheme_text, b"sip") {
            Scheme::Sip
        } else if eq_ic(scheme_text, b"sips") {
            Scheme::Sips
        } else {
            return Err(SipError::UnsupportedScheme);
        };
        let (_, after) = split_at(s, scheme_text.len() + 1);
        // '@' cannot appear unescaped outside the userinfo, so the first one ends it;
        // the user part may itself hold '?' and ';' (RFC 4475 `intmeth`, `semiuri`).
        let (userinfo, after_user) = match find_byte(after, b'@') {
            Some(at) => {
                let (u, h) = split_at(after, at);
                (Some(u), rest(h))
            }
            None => (None, after),
        };
        let (hostpart, headers) = match find_byte(after_user, b'?') {
            Some(q) => {
                let (a, h) = split_at(after_user, q);
                (a, Some(rest(h)))
            }
            None => (after_user, None),
        };
        let (user, password) = match userinfo {
            Some(u) => Self::split_userinfo(u)?,
            None => (None, None),
        };
        let (hostport, params) = match find_byte(hostpart, b';') {
            Some(i) => {
                let (hp, p) = split_at(hostpart, i);
                (hp, rest(p))
            }
            None => (hostpart, &[][..]),
        };
        let (host_text, port) = split_hostport(hostport)?;
        let host = Host::parse(host_text)?;
        check_uri_params(params)?;
        if let Some(h) = headers {
            check_uri_headers(h)?;
        }
        Ok(Uri {
            scheme,
            user,
            password,
            host,
            host_text,
            port,
            params,
            headers,
        })
    }

    fn split_userinfo(u: &'a [u8]) -> Result<UserInfo<'a>, SipError> {
        let (user, password) = match find_byte(u, b':') {
            Some(c) => {
                let (a, b) = split_at(u, c);
                (a, Some(rest(b)))
            }
            None => (u, None),
        };
        if user.is_empty() {
            return Err(SipError::BadUri("empty user part before '@'"));
        }
        check_escaped(user, is_user_char, "invalid character in URI user part")?;
        if let Some(p) = password {
            check_escaped(p, is_password_char, "invalid character in URI password")?;
        }
        Ok((Some(user), password))
    }

    /// Iterates the uri-parameters as `(name, value)`.
    pub fn param_iter(&self) -> impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)> {
        self.params
            .split(|&b| b == b';')
            .filter(|p| !p.is_empty())
            .map(|p| match find_byte(p, b'=') {
                Some(i) => {
                    let (n, v) = split_at(p, i);
                    (n, Some(rest(v)))
                }
                None => (p, None),
            })
    }

    /// A uri-parameter by case-insensitive name: `Some(None)` for a flag like `lr`.
    pub fn param(&self, name: &str) -> Option<Option<&'a [u8]>> {
        self.param_iter()
            .find(|(n, _)| eq_ic(n, name.as_bytes()))
            .map(|(_, v)| v)
    }

    /// The loose-routing flag of a Route/Record-Route URI.
    pub fn is_loose_route(&self) -> bool {
        self.param("lr").is_some()
    }

    /// The user part read as a GB/T 28181 device/platform ID.
    pub fn gb_id(&self) -> Result<GbId<'a>, SipError> {
        GbId::parse(
            self.user
                .ok_or(SipError::BadGbId("the URI has no user part"))?,
        )
    }
}

fn split_hostport(hp: &[u8]) -> Result<(&[u8], Option<u16>), SipError> {
    // An IPv6 reference carries colons of its own: the port colon comes after ']'.
    let host_end = if first(hp) == Some(b'[') {
        find_byte(hp, b']')
            .map(|i| i + 1)
            .ok_or(SipError::BadUri("IPv6 reference is missing its ']'"))?
    } else {
        take_while(hp, |b| b != b':').0.len()
    };
    let (host, port_part) = split_at(hp, host_end);
    if port_part.is_empty() {
        return Ok((host, None));
    }
    let digits = port_part
        .strip_prefix(b":")
        .ok_or(SipError::BadUri("junk after the host"))?;
    Ok((
        host,
        Some(parse_port(digits).ok_or(SipError::BadUri("port must be a number 0-65535"))?),
    ))
}

/// A port: 1 to 5 digits, at most 65535.
pub(crate) fn parse_port(digits: &[u8]) -> Option<u16> {
    if digits.len() > 5 {
        return None;
    }
    super::lex::parse_decimal(digits, u64::from(u16::MAX)).and_then(|n| u16::try_from(n).ok())
}

fn check_uri_params(params: &[u8]) -> Result<(), SipError> {
    if params.is_empty() {
        return Ok(());
    }
    for p in params.split(|&b| b == b';') {
        let (name, value) = match find_byte(p, b'=') {
            Some(i) => {
                let (n, v) = split_at(p, i);
                (n, Some(rest(v)))
            }
            None => (p, None),
        };
        if name.is_empty() {
            return Err(SipError::BadUri("empty URI parameter"));
        }
        check_escaped(name, is_param_char, "invalid character in URI parameter")?;
        if let Some(v) = value {
            // An IPv6 maddr keeps its brackets; otherwise the same character set.
            check_escaped(v, is_param_char, "invalid character in URI parameter value")?;
        }
    }
    Ok(())
}

fn check_uri_headers(headers: &[u8]) -> Result<(), SipError> {
    for h in headers.split(|&b| b == b'&') {
        let eq = find_byte(h, b'=').ok_or(SipError::BadUri("URI header without '='"))?;
        let (name, value) = split_at(h, eq);
        if name.is_empty() {
            return Err(SipError::BadUri("empty URI header name"));
        }
        check_escaped(name, is_header_char, "invalid character in URI header")?;
        check_escaped(
            rest(value),
            is_header_char,
            "invalid character in URI header value",
        )?;
    }
    Ok(())
}

/// A GB/T 28181 ID: 20 decimal digits (GB/T 28181-2016 Appendix D), e.g.
/// `34020000001320000001`: center code (8), industry (2), type (3), network (1),
/// serial (6). Platforms and devices are addressed by it in the user part of
/// From/To/Request-URI; the host part is the 10-digit SIP domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GbId<'a>(&'a str);

impl<'a> GbId<'a> {
    pub const LEN: usize = 20;

    /// Accepts exactly 20 ASCII digits; escapes or anything else are refused, since an
    /// ID that only matches after unescaping could slip past an allow-list.
    pub fn parse(user: &'a [u8]) -> Result<GbId<'a>, SipError> {
        if user.len() != Self::LEN {
            return Err(SipError::BadGbId("a GB/T 28181 ID has exactly 20 digits"));
        }
        if !user.iter().all(u8::is_ascii_digit) {
            return Err(SipError::BadGbId("a GB/T 28181 ID has only digits"));
        }
        std::str::from_utf8(user)
            .map(GbId)
            .map_err(|_| SipError::BadGbId("not ASCII"))
    }

    pub fn as_str(&self) -> &'a str {
        self.0
    }

    fn part(&self, from: usize, to: usize) -> &'a str {
        self.0.get(from..to).unwrap_or_default()
    }

    /// Administrative center code: province, city, district, base unit (8 digits).
    pub fn center_code(&self) -> &'a str {
        self.part(0, 8)
    }

    /// The 10-digit SIP domain this ID belongs to by convention (center + industry).
    pub fn domain(&self) -> &'a str {
        self.part(0, 10)
    }

    /// Industry code (2 digits).
    pub fn industry_code(&self) -> &'a str {
        self.part(8, 10)
    }

    /// Type code (3 digits): 111–130 front-end devices (118 NVR), 131–199 peripherals
    /// (131 camera, 132 IPC), 200–299 platform elements (200 SIP server), 215 business
    /// group, 216 virtual organisation.
    pub fn type_code(&self) -> u16 {
        self.part(10, 13).parse().unwrap_or(0)
    }

    /// Network identifier (1 digit).
    pub fn network_code(&self) -> u8 {
        self.part(13, 14).parse().unwrap_or(0)
    }

    /// Serial number (6 digits).
    pub fn serial(&self) -> &'a str {
        self.part(14, 20)
    }
}

impl std::fmt::Display for GbId<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
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

    #[test]
    fn parses_gb_uri() {
        let u = Uri::parse(b"sip:34020000001320000001@3402000000").unwrap();
        assert_eq!(u.host, Host::Name("3402000000"));
        let id = u.gb_id().unwrap();
        assert_eq!(id.type_code(), 132);
        assert_eq!(id.domain(), "3402000000");
        assert_eq!(id.serial(), "000001");
    }

    #[test]
    fn parses_torture_uris() {
        let u = Uri::parse(b"sip:1_unusual.URI~(to-be!sure)&isn't+it$/crazy?,/;;*:&it+has=1,weird!*pas$wo~d_too.(doesn't-it)@example.com").unwrap();
        assert_eq!(
            u.user.unwrap(),
            b"1_unusual.URI~(to-be!sure)&isn't+it$/crazy?,/;;*"
        );
        assert_eq!(u.host, Host::Name("example.com"));
        let u = Uri::parse(b"sip:[2001:db8::1]:5061;transport=tcp;lr").unwrap();
        assert_eq!(u.port, Some(5061));
        assert!(u.is_loose_route());
        assert_eq!(u.param("transport"), Some(Some(&b"tcp"[..])));
        let u = Uri::parse(b"sip:user@example.com?Route=%3Csip:example.com%3E").unwrap();
        assert_eq!(u.headers, Some(&b"Route=%3Csip:example.com%3E"[..]));
    }

    #[test]
    fn tells_bad_from_unsupported() {
        assert_eq!(
            Uri::parse(b"nobodyKnowsThisScheme:x"),
            Err(SipError::UnsupportedScheme)
        );
        assert!(matches!(
            Uri::parse(b"<sip:user@example.com>"),
            Err(SipError::BadUri(_))
        ));
        assert!(matches!(
            Uri::parse(b"sip:user@example.com; lr"),
            Err(SipError::BadUri(_))
        ));
        assert!(matches!(
            Uri::parse(b"sip:a@b:99999"),
            Err(SipError::BadUri(_))
        ));
        assert!(matches!(
            Uri::parse(b"sip:a%G1@b"),
            Err(SipError::BadUri(_))
        ));
    }

    #[test]
    fn gb_id_is_strict() {
        assert!(GbId::parse(b"3402000000132000000").is_err());
        assert!(GbId::parse(b"3402000000132000000a").is_err());
        assert!(GbId::parse(b"%33402000000132000000").is_err());
    }
}
