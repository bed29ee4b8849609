//! RTSP URLs: parsing, and mapping between client-visible and upstream URLs.
//!
//! Owns: `rtsp://[user[:pass]@]host[:port]/path?query` parsing ([`RtspUrl`]),
//! the path-prefix routes that send `/cam1/...` to one upstream server
//! ([`UrlMap`]), and every place a URL crosses the gateway: the Request-URI
//! (client → upstream), and Content-Base, Content-Location, `RTP-Info: url=`
//! and absolute SDP `a=control:` / `a=content-base:` lines (upstream → client).
//!
//! Does not own: the rest of the SDP (`c=`/`o=`/`m=` belong to the SDP
//! rewriter), the message around a header, or authentication.
//!
//! Two rules hold for every URL that crosses: the authority is always
//! replaced (so no address of one domain ever reaches the other, even when
//! the upstream names itself by another name), and userinfo is always
//! dropped (credentials never cross in URLs; vgate sends its own in
//! `Authorization`). Relative URLs and `*` are left alone: they carry no
//! address, and clients resolve them against the rewritten Content-Base.

use std::borrow::Cow;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::signaling::rtsp::error::RtspError;

/// `rtsp` (TCP, default port 554) or `rtsps` (TLS, default port 322).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Rtsp,
    Rtsps,
}

impl Scheme {
    pub fn default_port(self) -> u16 {
        match self {
            Scheme::Rtsp => 554,
            Scheme::Rtsps => 322,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Rtsp => "rtsp",
            Scheme::Rtsps => "rtsps",
        }
    }
}

/// The host part of a URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Host<'a> {
    V4(Ipv4Addr),
    V6(Ipv6Addr),
    Name(&'a str),
}

impl fmt::Display for Host<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::V4(ip) => write!(f, "{ip}"),
            Host::V6(ip) => write!(f, "[{ip}]"),
            Host::Name(name) => f.write_str(name),
        }
    }
}

/// A parsed absolute RTSP URL, borrowing from the input.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct RtspUrl<'a> {
    pub scheme: Scheme,
    /// `user[:password]`, if present. Never written back out.
    pub userinfo: Option<&'a str>,
    pub host: Host<'a>,
    pub port: Option<u16>,
    /// Empty or starting with `/`.
    pub path: &'a str,
    /// Without the `?`.
    pub query: Option<&'a str>,
}

/// Debug hides the userinfo: it may hold a password.
impl fmt::Debug for RtspUrl<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RtspUrl")
            .field("scheme", &self.scheme)
            .field("userinfo", &self.userinfo.map(|_| "***"))
            .field("host", &self.host)
            .field("port", &self.port)
            .field("path", &self.path)
            .field("query", &self.query)
            .finish()
    }
}

const MAX_URL_LEN: usize = 4096;
const MAX_HOST_LEN: usize = 253;

impl<'a> RtspUrl<'a> {
    pub fn parse(s: &'a str) -> Result<Self, RtspError> {
        if s.len() > MAX_URL_LEN || s.chars().any(is_forbidden_in_url) {
            return Err(RtspError::BadUrl);
        }
        let (scheme, rest) = split_scheme(s)?;
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, path_and_query) = rest
            .split_at_checked(authority_end)
            .ok_or(RtspError::BadUrl)?;
        let (userinfo, host_port) = match authority.rsplit_once('@') {
            Some((user, hp)) => (Some(user), hp),
            None => (None, authority),
        };
        let (host, port) = parse_host_port(host_port)?;
        let (path, query) = match path_and_query.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (path_and_query, None),
        };
        Ok(RtspUrl {
            scheme,
            userinfo,
            host,
            port,
            path,
            query,
        })
    }

    /// The port, or the scheme's default.
    pub fn port_or_default(&self) -> u16 {
        self.port.unwrap_or(self.scheme.default_port())
    }

    /// This URL with another authority and no userinfo.
    pub fn with_authority(&self, authority: &Authority) -> String {
        self.with_authority_and_path(authority, self.path)
    }

    fn with_authority_and_path(&self, authority: &Authority, path: &str) -> String {
        let mut out = format!("{}://{}{}", self.scheme.as_str(), authority, path);
        if let Some(q) = self.query {
            out.push('?');
            out.push_str(q);
        }
        out
    }

    /// Refuses `.`/`..` segments, also percent-encoded, and encoded `/` or
    /// `\`: with prefix routes, `/cam1/../admin` would otherwise reach a path
    /// of the upstream that no route exposes.
    pub fn check_no_dot_segments(&self) -> Result<(), RtspError> {
        for segment in self.path.split('/') {
            let lower = segment.to_ascii_lowercase();
            let decoded = lower.replace("%2e", ".");
            if decoded == "." || decoded == ".." || lower.contains("%2f") || lower.contains("%5c") {
                return Err(RtspError::DotSegment);
            }
        }
        Ok(())
    }
}

fn is_forbidden_in_url(c: char) -> bool {
    c.is_control() || c.is_whitespace() || "\"<>\\^`{|}#".contains(c)
}

fn split_scheme(s: &str) -> Result<(Scheme, &str), RtspError> {
    let (scheme, rest) = s.split_once("://").ok_or(RtspError::BadUrl)?;
    if scheme.eq_ignore_ascii_case("rtsp") {
        Ok((Scheme::Rtsp, rest))
    } else if scheme.eq_ignore_ascii_case("rtsps") {
        Ok((Scheme::Rtsps, rest))
    } else {
        Err(RtspError::BadUrl)
    }
}

fn parse_host_port(s: &str) -> Result<(Host<'_>, Option<u16>), RtspError> {
    let (host_text, port_text) = if let Some(rest) = s.strip_prefix('[') {
        let (v6, after) = rest.split_once(']').ok_or(RtspError::BadUrl)?;
        let ip = v6.parse::<Ipv6Addr>().map_err(|_| RtspError::BadUrl)?;
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':').ok_or(RtspError::BadUrl)?),
        };
        return Ok((Host::V6(ip), parse_port(port)?));
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    Ok((parse_host(host_text)?, parse_port(port_text)?))
}

fn parse_port(text: Option<&str>) -> Result<Option<u16>, RtspError> {
    match text {
        None | Some("") => Ok(None),
        Some(p) if p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()) => {
            match p.parse::<u16>() {
                Ok(0) | Err(_) => Err(RtspError::BadUrl),
                Ok(port) => Ok(Some(port)),
            }
        }
        Some(_) => Err(RtspError::BadUrl),
    }
}

fn parse_host(text: &str) -> Result<Host<'_>, RtspError> {
    if let Ok(ip) = text.parse::<Ipv4Addr>() {
        return Ok(Host::V4(ip));
    }
    let name_ok = !text.is_empty()
        && text.len() <= MAX_HOST_LEN
        && text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_')
        // `10.0.0.999` is a broken address, not a name.
        && !text.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    name_ok.then_some(Host::Name(text)).ok_or(RtspError::BadUrl)
}

/// An owned `host:port` a URL can be pointed at (vgate's own address on one
/// side, or an upstream server).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authority {
    host: String,
    port: u16,
}

impl Authority {
    /// `host` is an IPv4 address, an IPv6 address (with or without
    /// brackets) or a DNS name.
    pub fn new(host: &str, port: u16) -> Result<Self, RtspError> {
        if port == 0 {
            return Err(RtspError::BadUrl);
        }
        let bare = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        let host = match bare.parse::<Ipv6Addr>() {
            Ok(ip) => Host::V6(ip).to_string(),
            Err(_) => parse_host(bare)?.to_string(),
        };
        Ok(Authority { host, port })
    }

    pub fn host(&self) -> &str {
        &self.host
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}

impl From<SocketAddr> for Authority {
    fn from(addr: SocketAddr) -> Self {
        let host = match addr.ip() {
            IpAddr::V4(ip) => Host::V4(ip).to_string(),
            IpAddr::V6(ip) => Host::V6(ip).to_string(),
        };
        Authority {
            host,
            port: addr.port(),
        }
    }
}

impl fmt::Display for Authority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// One path-prefix route: client paths under `client_prefix` go to
/// `upstream`, with the prefix replaced by `upstream_prefix`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    client_prefix: String,
    upstream: Authority,
    upstream_prefix: String,
}

impl Route {
    /// Prefixes are whole path segments: `/cam1` (or `/cam1/`) matches
    /// `/cam1` and `/cam1/...` but not `/cam10`. `/` or `` matches all.
    /// An `upstream_prefix` of `/` strips the client prefix.
    pub fn new(client_prefix: &str, upstream: Authority, upstream_prefix: &str) -> Self {
        Route {
            client_prefix: normalize_prefix(client_prefix),
            upstream,
            upstream_prefix: normalize_prefix(upstream_prefix),
        }
    }

    pub fn upstream(&self) -> &Authority {
        &self.upstream
    }
}

/// `/cam1/` → `/cam1`, `/` → ``, `cam1` → `/cam1`.
fn normalize_prefix(prefix: &str) -> String {
    let trimmed = prefix.trim_matches('/');
    if trimmed.is_empty() {
        String::new()
    } else {
        format!("/{trimmed}")
    }
}

/// The rest of `path` after a whole-segment `prefix`, if it is under it.
fn strip_segment_prefix<'p>(path: &'p str, prefix: &str) -> Option<&'p str> {
    let rest = path.strip_prefix(prefix)?;
    (rest.is_empty() || rest.starts_with('/')).then_some(rest)
}

/// `prefix` + `rest`, never an empty path.
fn join_path(prefix: &str, rest: &str) -> String {
    let joined = format!("{prefix}{rest}");
    if joined.is_empty() {
        "/".to_owned()
    } else {
        joined
    }
}

/// A client URL mapped to its upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// Index into the map's routes; a session stays on one route.
    pub route: usize,
    pub url: String,
}

/// vgate's client-visible authority and its routes to upstream servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlMap {
    gateway: Authority,
    routes: Vec<Route>,
}

impl UrlMap {
    pub fn new(gateway: Authority, routes: Vec<Route>) -> Self {
        UrlMap { gateway, routes }
    }

    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// Client URL → upstream URL, by the longest matching route prefix.
    /// The client's host is not checked: clients may reach vgate by any name.
    pub fn to_upstream(&self, client_url: &str) -> Result<Upstream, RtspError> {
        let url = RtspUrl::parse(client_url)?;
        url.check_no_dot_segments()?;
        let (route, rest) = self
            .routes
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                strip_segment_prefix(url.path, &r.client_prefix).map(|rest| (i, r, rest))
            })
            .max_by_key(|(_, r, _)| r.client_prefix.len())
            .map(|(i, _, rest)| (i, rest))
            .ok_or(RtspError::NoRoute)?;
        let r = self.route(route)?;
        let path = join_path(&r.upstream_prefix, rest);
        Ok(Upstream {
            route,
            url: url.with_authority_and_path(&r.upstream, &path),
        })
    }

    /// Client URL → upstream URL on a session's route: a session must not
    /// wander to another upstream with its next SETUP.
    pub fn to_upstream_on(&self, route: usize, client_url: &str) -> Result<String, RtspError> {
        let mapped = self.to_upstream(client_url)?;
        if mapped.route != route {
            return Err(RtspError::NoRoute);
        }
        Ok(mapped.url)
    }

    /// Upstream URL → client-visible URL (Content-Base, Content-Location,
    /// RTP-Info, SDP). The upstream's authority is replaced whatever it is:
    /// a server naming itself differently must still not leak its address.
    pub fn to_client(&self, route: usize, upstream_url: &str) -> Result<String, RtspError> {
        let r = self.route(route)?;
        let url = RtspUrl::parse(upstream_url)?;
        let rest =
            strip_segment_prefix(url.path, &r.upstream_prefix).ok_or(RtspError::OutsideRoute)?;
        let path = join_path(&r.client_prefix, rest);
        Ok(url.with_authority_and_path(&self.gateway, &path))
    }

    /// A `Location` the upstream sends the client to (REDIRECT): like [`Self::to_client`], but
    /// only when it names the route's own upstream — the gateway cannot reach anything else
    /// for the client, and the rewrite would otherwise send it to the wrong server.
    pub fn redirect_to_client(
        &self,
        route: usize,
        upstream_url: &str,
    ) -> Result<String, RtspError> {
        let r = self.route(route)?;
        let url = RtspUrl::parse(upstream_url)?;
        let same = url.host.to_string().eq_ignore_ascii_case(r.upstream.host())
            && url.port_or_default() == r.upstream.port();
        if !same {
            return Err(RtspError::OutsideRoute);
        }
        self.to_client(route, upstream_url)
    }

    fn route(&self, route: usize) -> Result<&Route, RtspError> {
        self.routes.get(route).ok_or(RtspError::UnknownRoute)
    }

    /// Rewrites every absolute `url=` of an RTP-Info value to the client's
    /// view; seq/rtptime/ssrc and spacing are kept byte-for-byte.
    pub fn rtp_info_to_client(&self, route: usize, value: &str) -> Result<String, RtspError> {
        rewrite_rtp_info_urls(value, |u| self.to_client(route, u))
    }

    /// Rewrites absolute `a=control:`/`a=content-base:` URLs in an SDP body
    /// from the upstream's view to the client's; all other bytes unchanged.
    pub fn sdp_to_client<'b>(
        &self,
        route: usize,
        sdp: &'b [u8],
    ) -> Result<Cow<'b, [u8]>, RtspError> {
        rewrite_sdp_urls(sdp, |u| self.to_client(route, u))
    }

    /// The same for an SDP going upstream (ANNOUNCE for talkback/RECORD).
    pub fn sdp_to_upstream<'b>(
        &self,
        route: usize,
        sdp: &'b [u8],
    ) -> Result<Cow<'b, [u8]>, RtspError> {
        rewrite_sdp_urls(sdp, |u| self.to_upstream_on(route, u))
    }
}

/// True for `rtsp://...`/`rtsps://...`; relative controls and `*` are not.
pub fn is_absolute_rtsp_url(s: &str) -> bool {
    let lower_prefix = |p: &str| s.get(..p.len()).is_some_and(|h| h.eq_ignore_ascii_case(p));
    lower_prefix("rtsp://") || lower_prefix("rtsps://")
}

const RTP_INFO_PARAMS: [&str; 3] = ["seq=", "rtptime=", "ssrc="];

/// Applies `map` to each absolute `url=` in an RTP-Info value.
///
/// URLs may themselves contain `,` and `;` (RFC 2326 leaves this ambiguous),
/// so entries are split only before `url=` and a URL ends only before
/// `;seq=`, `;rtptime=` or `;ssrc=`. RFC 7826 quoted URLs are handled too.
pub fn rewrite_rtp_info_urls(
    value: &str,
    mut map: impl FnMut(&str) -> Result<String, RtspError>,
) -> Result<String, RtspError> {
    let mut out = String::with_capacity(value.len() + 32);
    let mut copied = 0;
    for (start, end) in rtp_info_url_spans(value) {
        let url = value.get(start..end).unwrap_or_default();
        if !is_absolute_rtsp_url(url) {
            continue;
        }
        out.push_str(value.get(copied..start).unwrap_or_default());
        out.push_str(&map(url)?);
        copied = end;
    }
    out.push_str(value.get(copied..).unwrap_or_default());
    Ok(out)
}

/// Byte spans of the URL inside each `url=` (quotes excluded).
fn rtp_info_url_spans(value: &str) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut search_from = 0;
    while let Some(found) = find_url_param(value, search_from) {
        let url_start = found + "url=".len();
        let after = value.get(url_start..).unwrap_or_default();
        let (start, len) = match after.strip_prefix('"') {
            Some(quoted) => (url_start + 1, quoted.find('"').unwrap_or(quoted.len())),
            None => (url_start, unquoted_url_len(after)),
        };
        spans.push((start, start + len));
        search_from = start + len;
    }
    spans
}

/// Offset of the next `url=` that starts an entry (at the start, or after a
/// `,` and optional spaces), at or after `from`. One linear pass.
fn find_url_param(value: &str, from: usize) -> Option<usize> {
    let mut at_entry_start = from == 0;
    for (i, c) in value.get(from..)?.char_indices() {
        let i = from + i;
        if at_entry_start
            && value
                .get(i..i + 4)
                .is_some_and(|s| s.eq_ignore_ascii_case("url="))
        {
            return Some(i);
        }
        if c == ',' {
            at_entry_start = true;
        } else if !c.is_whitespace() {
            at_entry_start = false;
        }
    }
    None
}

/// Length of an unquoted URL: up to `;seq=` etc. or `, url=` or the end.
fn unquoted_url_len(after: &str) -> usize {
    let mut end = after.len();
    for (i, c) in after.char_indices() {
        let rest = after.get(i + c.len_utf8()..).unwrap_or_default();
        let next_param = c == ';'
            && RTP_INFO_PARAMS.iter().any(|p| {
                rest.get(..p.len())
                    .is_some_and(|h| h.eq_ignore_ascii_case(p))
            });
        let next_entry = c == ','
            && rest
                .trim_start()
                .get(..4)
                .is_some_and(|h| h.eq_ignore_ascii_case("url="));
        if next_param || next_entry {
            end = i;
            break;
        }
    }
    end
}

const SDP_URL_ATTRIBUTES: [&[u8]; 2] = [b"a=control:", b"a=content-base:"];

/// Applies `map` to absolute URLs on `a=control:` and `a=content-base:`
/// lines; every other byte, line endings included, is kept. Returns the
/// input unchanged (borrowed) when nothing needed rewriting.
pub fn rewrite_sdp_urls<'b>(
    sdp: &'b [u8],
    mut map: impl FnMut(&str) -> Result<String, RtspError>,
) -> Result<Cow<'b, [u8]>, RtspError> {
    let mut out: Option<Vec<u8>> = None;
    let mut offset = 0;
    for line in sdp.split_inclusive(|&b| b == b'\n') {
        if let Some(new_line) = rewrite_sdp_line(line, &mut map)? {
            let buf = out.get_or_insert_with(|| sdp.get(..offset).unwrap_or_default().to_vec());
            buf.extend_from_slice(&new_line);
        } else if let Some(buf) = out.as_mut() {
            buf.extend_from_slice(line);
        }
        offset += line.len();
    }
    Ok(match out {
        Some(buf) => Cow::Owned(buf),
        None => Cow::Borrowed(sdp),
    })
}

/// The rewritten line, or `None` if this line keeps its bytes.
fn rewrite_sdp_line(
    line: &[u8],
    map: &mut impl FnMut(&str) -> Result<String, RtspError>,
) -> Result<Option<Vec<u8>>, RtspError> {
    let Some(attr) = SDP_URL_ATTRIBUTES.iter().find(|a| {
        line.get(..a.len())
            .is_some_and(|h| h.eq_ignore_ascii_case(a))
    }) else {
        return Ok(None);
    };
    let value_and_end = line.get(attr.len()..).unwrap_or_default();
    let content_len = value_and_end
        .iter()
        .rposition(|&b| b != b'\n' && b != b'\r')
        .map_or(0, |i| i + 1);
    let (value, line_end) = value_and_end
        .split_at_checked(content_len)
        .unwrap_or((value_and_end, b""));
    let value = std::str::from_utf8(value).map_err(|_| RtspError::BadUrl)?;
    let url = value.trim();
    if !is_absolute_rtsp_url(url) {
        return Ok(None);
    }
    let mut new_line = line.get(..attr.len()).unwrap_or_default().to_vec();
    new_line.extend_from_slice(map(url)?.as_bytes());
    new_line.extend_from_slice(line_end);
    Ok(Some(new_line))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> UrlMap {
        UrlMap::new(
            Authority::new("192.168.1.1", 554).unwrap(),
            vec![
                Route::new("/cam1/", Authority::new("10.0.0.5", 8554).unwrap(), "/test"),
                Route::new("/cam2", Authority::new("10.0.0.6", 554).unwrap(), "/"),
                Route::new(
                    "/cam1/hd",
                    Authority::new("10.0.0.7", 554).unwrap(),
                    "/main",
                ),
            ],
        )
    }

    #[test]
    fn parses_urls() {
        let u = RtspUrl::parse("rtsp://admin:secret@10.0.0.5:8554/test/stream=0?x=1").unwrap();
        assert_eq!(u.scheme, Scheme::Rtsp);
        assert_eq!(u.userinfo, Some("admin:secret"));
        assert_eq!(u.host, Host::V4(Ipv4Addr::new(10, 0, 0, 5)));
        assert_eq!(u.port, Some(8554));
        assert_eq!((u.path, u.query), ("/test/stream=0", Some("x=1")));
        assert!(!format!("{u:?}").contains("secret"));

        let u = RtspUrl::parse("RTSPS://[fe80::1]:322").unwrap();
        assert_eq!(u.host, Host::V6("fe80::1".parse().unwrap()));
        assert_eq!((u.port_or_default(), u.path), (322, ""));

        let u = RtspUrl::parse("rtsp://cam-1.example/live").unwrap();
        assert_eq!(
            (u.host, u.port_or_default()),
            (Host::Name("cam-1.example"), 554)
        );

        for bad in [
            "http://h/",
            "rtsp://",
            "rtsp://h:0/",
            "rtsp://h:65536/",
            "rtsp://h:x/",
            "rtsp://[::1/",
            "rtsp://[::1]x/",
            "rtsp://10.0.0.999/",
            "rtsp://h/a b",
            "rtsp://h/a#frag",
            "rtsp://h\r\nX: y/",
            "rtsp://h:1:2/",
        ] {
            assert_eq!(RtspUrl::parse(bad), Err(RtspError::BadUrl), "{bad}");
        }
    }

    #[test]
    fn rewrites_authority_and_drops_credentials() {
        let u = RtspUrl::parse("rtsp://u:p@10.0.0.5:8554/test?a").unwrap();
        let a = Authority::new("::1", 8554).unwrap();
        assert_eq!(u.with_authority(&a), "rtsp://[::1]:8554/test?a");
        let a = Authority::from("[2001:db8::1]:9".parse::<SocketAddr>().unwrap());
        assert_eq!(u.with_authority(&a), "rtsp://[2001:db8::1]:9/test?a");
    }

    #[test]
    fn maps_client_urls_by_longest_prefix() {
        let m = map();
        let up = m
            .to_upstream("rtsp://user:pw@gw.example/cam1/stream=0")
            .unwrap();
        assert_eq!(
            up,
            Upstream {
                route: 0,
                url: "rtsp://10.0.0.5:8554/test/stream=0".into()
            }
        );
        assert_eq!(
            m.to_upstream("rtsp://gw/cam1").unwrap().url,
            "rtsp://10.0.0.5:8554/test"
        );
        assert_eq!(
            m.to_upstream("rtsp://gw/cam1/hd/x?q=1").unwrap().url,
            "rtsp://10.0.0.7:554/main/x?q=1"
        );
        assert_eq!(
            m.to_upstream("rtsp://gw/cam2/live").unwrap().url,
            "rtsp://10.0.0.6:554/live"
        );
        assert_eq!(
            m.to_upstream("rtsp://gw/cam2").unwrap().url,
            "rtsp://10.0.0.6:554/"
        );
        assert_eq!(m.to_upstream("rtsp://gw/cam10/x"), Err(RtspError::NoRoute));
        assert_eq!(m.to_upstream("*"), Err(RtspError::BadUrl));
        assert_eq!(
            m.to_upstream_on(1, "rtsp://gw/cam1/x"),
            Err(RtspError::NoRoute)
        );
        for evil in [
            "rtsp://gw/cam1/../cam2",
            "rtsp://gw/cam1/%2e%2E/x",
            "rtsp://gw/cam1/.",
            "rtsp://gw/cam1/a%2Fb",
        ] {
            assert_eq!(m.to_upstream(evil), Err(RtspError::DotSegment), "{evil}");
        }
    }

    #[test]
    fn maps_upstream_urls_back() {
        let m = map();
        assert_eq!(
            m.to_client(0, "rtsp://10.0.0.5:8554/test/").unwrap(),
            "rtsp://192.168.1.1:554/cam1/"
        );
        assert_eq!(
            m.to_client(0, "rtsp://camera.local/test/stream=1").unwrap(),
            "rtsp://192.168.1.1:554/cam1/stream=1"
        );
        assert_eq!(
            m.to_client(1, "rtsp://a:b@10.0.0.6/live?x").unwrap(),
            "rtsp://192.168.1.1:554/cam2/live?x"
        );
        assert_eq!(
            m.to_client(0, "rtsp://10.0.0.5:8554/other"),
            Err(RtspError::OutsideRoute)
        );
        assert_eq!(
            m.to_client(0, "rtsp://10.0.0.5:8554/testing"),
            Err(RtspError::OutsideRoute)
        );
        assert_eq!(
            m.to_client(9, "rtsp://10.0.0.5:8554/test"),
            Err(RtspError::UnknownRoute)
        );
    }

    #[test]
    fn rewrites_rtp_info() {
        let m = map();
        let v = "url=rtsp://10.0.0.5:8554/test/stream=0;seq=1;rtptime=0, url=rtsp://10.0.0.5:8554/test/stream=1;seq=5;rtptime=9";
        assert_eq!(
            m.rtp_info_to_client(0, v).unwrap(),
            "url=rtsp://192.168.1.1:554/cam1/stream=0;seq=1;rtptime=0, url=rtsp://192.168.1.1:554/cam1/stream=1;seq=5;rtptime=9"
        );
        // Commas and semicolons inside URLs, quoted URLs, relative URLs.
        let v = "url=rtsp://10.0.0.5/test/a,b;c=1;seq=1,url=\"rtsp://10.0.0.5/test/q;seq=x\";seq=2,url=trackID=3;seq=3";
        assert_eq!(
            m.rtp_info_to_client(0, v).unwrap(),
            "url=rtsp://192.168.1.1:554/cam1/a,b;c=1;seq=1,url=\"rtsp://192.168.1.1:554/cam1/q;seq=x\";seq=2,url=trackID=3;seq=3"
        );
        assert_eq!(m.rtp_info_to_client(0, "").unwrap(), "");
        assert_eq!(
            m.rtp_info_to_client(0, "url=\"rtsp://10.0.0.5/test")
                .unwrap(),
            "url=\"rtsp://192.168.1.1:554/cam1"
        );
    }

    #[test]
    fn rewrites_only_sdp_url_lines() {
        let m = map();
        let sdp = b"v=0\r\no=- 1 1 IN IP4 10.0.0.5\r\na=control:*\r\na=content-base:rtsp://10.0.0.5:8554/test/\r\nm=video 0 RTP/AVP 96\r\na=control:rtsp://10.0.0.5:8554/test/stream=0\r\nm=audio 0 RTP/AVP 0\na=control:stream=1\n";
        let out = m.sdp_to_client(0, sdp).unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            "v=0\r\no=- 1 1 IN IP4 10.0.0.5\r\na=control:*\r\na=content-base:rtsp://192.168.1.1:554/cam1/\r\nm=video 0 RTP/AVP 96\r\na=control:rtsp://192.168.1.1:554/cam1/stream=0\r\nm=audio 0 RTP/AVP 0\na=control:stream=1\n"
        );
        let relative = b"v=0\r\na=control:*\r\na=control:stream=0\r\n";
        assert!(matches!(
            m.sdp_to_client(0, relative).unwrap(),
            Cow::Borrowed(_)
        ));
        let back = m
            .sdp_to_upstream(0, b"a=control:rtsp://gw/cam1/stream=0")
            .unwrap();
        assert_eq!(&back[..], b"a=control:rtsp://10.0.0.5:8554/test/stream=0");
    }
}
