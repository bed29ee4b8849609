//! Checks of one value shared by the sections: names, domain ids, ports, port ranges, and
//! that an address a route sends to is across from where it listens.

use std::net::Ipv4Addr;

use toml::Spanned;

use crate::config::check::invalid;
use crate::config::{Domain, DomainId, PortRange};

use super::Result;

/// An address a route sends to must be in the domain across from where it listens.
pub(super) fn check_far_side(
    domains: &[Domain; 2],
    listen: DomainId,
    addr: Ipv4Addr,
    at: &Spanned<String>,
    key: &str,
    what: &str,
) -> Result<()> {
    let far = listen.other();
    if domains[listen.index()].contains(addr) {
        return Err(invalid(
            at,
            key,
            format!("the {what} {addr} is in domain {listen}, the same domain the route listens in; a route must cross to domain {far}"),
        ));
    }
    if !domains[far.index()].contains(addr) {
        return Err(invalid(
            at,
            key,
            format!(
                "the {what} {addr} is in neither domain; add its network to domains.{far}.networks"
            ),
        ));
    }
    Ok(())
}

pub(super) fn route_name(s: &Spanned<String>, key: &str) -> Result<String> {
    let name = s.get_ref();
    if name.is_empty()
        || name.len() > 64
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(invalid(
            s,
            key,
            "names are 1-64 characters of letters, digits, '-', '_' and '.'",
        ));
    }
    Ok(name.clone())
}

pub(super) fn domain_id(s: &Spanned<String>, key: &str) -> Result<DomainId> {
    match s.get_ref().as_str() {
        "a" => Ok(DomainId::A),
        "b" => Ok(DomainId::B),
        other => Err(invalid(
            s,
            key,
            format!("unknown domain \"{other}\"; use \"a\" or \"b\""),
        )),
    }
}

pub(super) fn port(p: &Spanned<i64>, key: &str) -> Result<u16> {
    match u16::try_from(*p.get_ref()) {
        Ok(v) if v > 0 => Ok(v),
        _ => Err(invalid(p, key, "a port is a number from 1 to 65535")),
    }
}

pub(super) fn port_range(s: &Spanned<String>, key: &str) -> Result<PortRange> {
    let bad = || {
        invalid(s, key, "expected a port range such as \"20000-29999\" (first-last, first even, at least 2 ports)")
    };
    let (a, b) = s.get_ref().split_once('-').ok_or_else(bad)?;
    let first: u16 = a.trim().parse().map_err(|_| bad())?;
    let last: u16 = b.trim().parse().map_err(|_| bad())?;
    if first == 0 || last <= first || !first.is_multiple_of(2) {
        return Err(bad());
    }
    Ok(PortRange { first, last })
}
