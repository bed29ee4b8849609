//! The two domains: each one's interface, networks, address and media ports, and what
//! the two may not share.

use ipnet::Ipv4Net;

use crate::config::check::{invalid, parse_ipv4};
use crate::config::raw::RawDomain;
use crate::config::{Domain, DomainId};

use super::fields::port_range;
use super::Result;

pub(super) fn domain(id: DomainId, raw: &RawDomain) -> Result<Domain> {
    let key = |k: &str| format!("domains.{id}.{k}");
    if raw.interface.get_ref().is_empty() {
        return Err(invalid(
            &raw.interface,
            key("interface"),
            "name the network interface facing this domain, e.g. \"eth1\" (\"lo\" on loopback)",
        ));
    }
    let address = parse_ipv4(&raw.address, &key("address"))?;
    if address.is_unspecified() || address.is_multicast() || address.is_broadcast() {
        return Err(invalid(
            &raw.address,
            key("address"),
            "the gateway address must be a unicast address of this host in the domain",
        ));
    }
    let mut networks = Vec::new();
    for (i, n) in raw.networks.iter().enumerate() {
        let net: Ipv4Net = n.get_ref().parse().map_err(|_| {
            invalid(
                n,
                format!("{}[{i}]", key("networks")),
                "expected an IPv4 network such as \"10.1.0.0/16\"",
            )
        })?;
        networks.push(net.trunc());
    }
    let media_ports = port_range(&raw.media_ports, &key("media_ports"))?;
    Ok(Domain {
        id,
        interface: raw.interface.get_ref().clone(),
        address,
        networks,
        media_ports,
    })
}

pub(super) fn cross_domain(a: &Domain, b: &Domain, raw_b: &RawDomain) -> Result<()> {
    if a.address == b.address {
        return Err(invalid(
            &raw_b.address,
            "domains.b.address",
            "domain b needs its own gateway address; it is the same as domain a's",
        ));
    }
    if a.media_ports.overlaps(&b.media_ports) {
        return Err(invalid(
            &raw_b.media_ports,
            "domains.b.media_ports",
            format!(
                "overlaps domain a's media ports {}; the stream tables are keyed by port, so each port must belong to one domain",
                a.media_ports
            ),
        ));
    }
    for (i, n) in b.networks.iter().enumerate() {
        if a.networks.iter().any(|m| m.contains(n) || n.contains(m)) || n.contains(&a.address) {
            return Err(invalid(
                &raw_b.networks[i],
                format!("domains.b.networks[{i}]"),
                format!("network {n} overlaps domain a; every address must belong to one domain"),
            ));
        }
    }
    if a.contains(b.address) {
        return Err(invalid(
            &raw_b.address,
            "domains.b.address",
            "this address lies in one of domain a's networks",
        ));
    }
    Ok(())
}
