//! A `[[stream]]` route (a static relay): its name, domain, ports, destination and the
//! source it expects.

use crate::config::check::{invalid, parse_sockaddr, parse_sockaddr_any_port, Invalid};
use crate::config::raw::RawStreamRoute;
use crate::config::{Domain, MediaConfig, Security, SourcePolicy, StaticStream};

use super::fields::{check_far_side, domain_id, port, route_name};
use super::Result;

pub(super) fn stream_route(
    i: usize,
    r: &RawStreamRoute,
    domains: &[Domain; 2],
    security: &Security,
    media: &MediaConfig,
) -> Result<StaticStream> {
    let key = |k: &str| format!("stream_route[{i}].{k}");
    let name = route_name(&r.name, &key("name"))?;
    let domain = domain_id(&r.domain, &key("domain"))?;
    let listen_port = port(&r.port, &key("port"))?;
    let range = domains[domain.index()].media_ports;
    if !range.contains(listen_port) {
        return Err(invalid(
            &r.port,
            key("port"),
            format!("port {listen_port} is outside domain {domain}'s media ports {range}"),
        ));
    }
    let destination = parse_sockaddr(&r.destination, &key("destination"))?;
    check_far_side(
        domains,
        domain,
        *destination.ip(),
        &r.destination,
        &key("destination"),
        "destination",
    )?;
    let egress_port = match &r.egress_port {
        None => None,
        Some(p) => {
            let e = port(p, &key("egress_port"))?;
            let far = domains[domain.other().index()].media_ports;
            if !far.contains(e) {
                return Err(invalid(
                    p,
                    key("egress_port"),
                    format!("port {e} is outside domain {}'s media ports {far}; the egress port is on the far side", domain.other()),
                ));
            }
            Some(e)
        }
    };
    let expect_source = match &r.expect_source {
        None => None,
        Some(s) => {
            let addr = parse_sockaddr_any_port(s, &key("expect_source"))?;
            if !domains[domain.index()].contains(*addr.ip()) {
                return Err(invalid(
                    s,
                    key("expect_source"),
                    format!("{} is not in domain {domain}, where this route receives; add its network to domains.{domain}.networks", addr.ip()),
                ));
            }
            Some(addr)
        }
    };
    let policy = r
        .source_validation
        .as_ref()
        .map(|p| *p.get_ref())
        .unwrap_or(security.source_validation);
    if policy == SourcePolicy::Strict && expect_source.is_none() {
        let at = r
            .source_validation
            .as_ref()
            .map(|p| p.span())
            .unwrap_or(r.name.span());
        return Err(Invalid {
            span: Some(at),
            key: key("expect_source"),
            message: "source validation is strict but the route has no expect_source; add expect_source = \"addr:port\" or set source_validation = \"latch\" on the route".into(),
        });
    }
    Ok(StaticStream {
        name,
        domain,
        port: listen_port,
        destination,
        egress_port,
        expect_source,
        policy,
        rtp_only: r.rtp_only.unwrap_or(security.rtp_only),
        media: super::media::stream_media(i, r.media.as_ref(), media, &r.name)?,
    })
}
