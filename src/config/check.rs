//! The checking helpers every part of the config's validation shares: the error before it is
//! placed in the file ([`Invalid`]) and the address parsers. `validate`, `split` and
//! `split_signal` use these; none of them imports another's helpers.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::ops::Range;

use toml::Spanned;

/// A validation failure before it is placed in the file.
#[derive(Debug)]
pub struct Invalid {
    pub span: Option<Range<usize>>,
    pub key: String,
    pub message: String,
}

type Result<T> = std::result::Result<T, Invalid>;

pub fn invalid<T>(at: &Spanned<T>, key: impl Into<String>, message: impl Into<String>) -> Invalid {
    let span = at.span();
    Invalid {
        // Defaults carry an empty span at 0: they have no place in the file.
        span: (span != (0..0)).then_some(span),
        key: key.into(),
        message: message.into(),
    }
}

pub fn parse_ipv4(s: &Spanned<String>, key: &str) -> Result<Ipv4Addr> {
    s.get_ref()
        .parse()
        .map_err(|_| invalid(s, key, "expected an IPv4 address such as \"10.0.0.1\""))
}

pub fn parse_sockaddr(s: &Spanned<String>, key: &str) -> Result<SocketAddrV4> {
    let addr = parse_sockaddr_any_port(s, key)?;
    if addr.port() == 0 {
        return Err(invalid(s, key, "the port must not be 0"));
    }
    Ok(addr)
}

pub fn parse_sockaddr_any_port(s: &Spanned<String>, key: &str) -> Result<SocketAddrV4> {
    let addr: SocketAddrV4 = s.get_ref().parse().map_err(|_| {
        invalid(
            s,
            key,
            "expected an IPv4 address and port such as \"10.0.0.5:5000\"",
        )
    })?;
    if addr.ip().is_unspecified() || addr.ip().is_broadcast() || addr.ip().is_multicast() {
        return Err(invalid(s, key, "must be a unicast address"));
    }
    Ok(addr)
}
