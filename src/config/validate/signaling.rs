//! A `[[signaling]]` route: its name, listening side, upstream, kind-specific keys refused
//! on the other kind, and its policy (limits, timers, allowed sources).

use std::ops::Range;

use ipnet::Ipv4Net;
use toml::Spanned;

use crate::config::check::{invalid, parse_sockaddr, Invalid};
use crate::config::raw::RawSignalingRoute;
use crate::config::{
    Domain, ManscdpAddresses, MediaConfig, SignalingKind, SignalingPolicy, SignalingRoute,
    Transport, MAX_TCP_MESSAGE_CAP,
};

use super::fields::{check_far_side, domain_id, port, route_name};
use super::rtsp::rtsp_options;
use super::Result;

/// Default `max_connections_per_source` of an RTSP route.
pub const RTSP_CONNECTIONS_PER_SOURCE: usize = 64;

pub(super) fn signaling_route(
    i: usize,
    r: &RawSignalingRoute,
    domains: &[Domain; 2],
    media: &MediaConfig,
) -> Result<SignalingRoute> {
    let key = |k: &str| format!("signaling_route[{i}].{k}");
    let name = route_name(&r.name, &key("name"))?;
    let listen_domain = domain_id(&r.listen_domain, &key("listen_domain"))?;
    let listen_port = port(&r.listen_port, &key("listen_port"))?;
    for d in domains {
        if d.media_ports.contains(listen_port) {
            return Err(invalid(
                &r.listen_port,
                key("listen_port"),
                format!("port {listen_port} is inside domain {}'s media ports {}; pick a port outside the media ranges", d.id, d.media_ports),
            ));
        }
    }
    let upstream = parse_sockaddr(&r.upstream, &key("upstream"))?;
    check_far_side(
        domains,
        listen_domain,
        *upstream.ip(),
        &r.upstream,
        &key("upstream"),
        "upstream",
    )?;
    let mut policy = signaling_policy(r, &key, &domains[listen_domain.index()])?;
    if r.kind == SignalingKind::Rtsp && r.max_connections_per_source.is_none() {
        // RTSP takes a connection per stream: a recorder pulling many cameras from one
        // address needs more than SIP's 16.
        policy.max_connections_per_source = RTSP_CONNECTIONS_PER_SOURCE;
    }
    policy.upstream_port = match &r.upstream_port {
        None => listen_port,
        Some(v) => {
            let p = port(v, &key("upstream_port"))?;
            let far = &domains[listen_domain.other().index()];
            if far.media_ports.contains(p) {
                return Err(invalid(
                    v,
                    key("upstream_port"),
                    format!("port {p} is inside domain {}'s media ports {}; pick a port outside the media ranges", far.id, far.media_ports),
                ));
            }
            p
        }
    };
    let rtsp = match r.kind {
        SignalingKind::Rtsp => Some(rtsp_options(i, r, domains, listen_domain, upstream)?),
        _ => {
            refuse_rtsp_keys(i, r)?;
            None
        }
    };
    if r.kind == SignalingKind::Rtsp {
        refuse_sip_keys(i, r)?;
    } else if let (Transport::Udp, Some(v)) = (r.transport, &r.max_tcp_message) {
        return Err(invalid(
            v,
            key("max_tcp_message"),
            "max_tcp_message limits SIP over TCP and this route is transport = \"udp\", where one datagram carries a message: use max_message (up to 65535), or a TCP route for larger messages",
        ));
    }
    Ok(SignalingRoute {
        name,
        kind: r.kind,
        transport: r.transport,
        listen_domain,
        listen_port,
        upstream,
        rtsp,
        policy,
        trace: r.trace,
        media_validate: r
            .media_validate
            .as_ref()
            .map_or(media.validate, |v| *v.get_ref()),
    })
}

/// SIP-only keys on an RTSP route would do nothing: refused, named.
fn refuse_sip_keys(i: usize, r: &RawSignalingRoute) -> Result<()> {
    let key = |k: &str| format!("signaling_route[{i}].{k}");
    let only = "is a SIP setting and does nothing on an RTSP route; remove it";
    let spans: [(&str, Option<Range<usize>>); 10] = [
        (
            "tcp_media_reconnect",
            r.tcp_media_reconnect.as_ref().map(|s| s.span()),
        ),
        ("upstream_port", r.upstream_port.as_ref().map(|s| s.span())),
        (
            "max_tcp_message",
            r.max_tcp_message.as_ref().map(|s| s.span()),
        ),
        (
            "max_bindings_per_source",
            r.max_bindings_per_source.as_ref().map(|s| s.span()),
        ),
        (
            "manscdp_addresses",
            r.manscdp_addresses.as_ref().map(|s| s.span()),
        ),
        ("manscdp_allow", r.manscdp_allow.first().map(|s| s.span())),
        ("manscdp_deny", r.manscdp_deny.first().map(|s| s.span())),
        (
            "manscdp_deny_from_b",
            r.manscdp_deny_from_b.as_ref().map(|s| s.span()),
        ),
        ("allow_ids", r.allow_ids.first().map(|s| s.span())),
        (
            "invite_timeout",
            r.invite_timeout.as_ref().map(|s| s.span()),
        ),
    ];
    for (k, span) in spans {
        if let Some(span) = span {
            return Err(Invalid {
                span: Some(span),
                key: key(k),
                message: format!("{k} {only}"),
            });
        }
    }
    Ok(())
}

/// RTSP-only keys on another kind of route are a mistake worth naming.
fn refuse_rtsp_keys(i: usize, r: &RawSignalingRoute) -> Result<()> {
    let key = |k: &str| format!("signaling_route[{i}].{k}");
    let only = "is an RTSP setting; this route is not type = \"rtsp\"";
    let spans: [(&str, Option<Range<usize>>); 7] = [
        (
            "max_sessions_per_source",
            r.max_sessions_per_source.as_ref().map(|s| s.span()),
        ),
        (
            "request_timeout",
            r.request_timeout.as_ref().map(|s| s.span()),
        ),
        (
            "upstream_username",
            r.upstream_username.as_ref().map(|s| s.span()),
        ),
        (
            "upstream_password",
            r.upstream_password.as_ref().map(|s| s.span()),
        ),
        ("client_realm", r.client_realm.as_ref().map(|s| s.span())),
        (
            "session_timeout",
            r.session_timeout.as_ref().map(|s| s.span()),
        ),
        ("paths", r.paths.first().map(|p| p.prefix.span())),
    ];
    for (k, span) in spans {
        if let Some(span) = span {
            return Err(Invalid {
                span: Some(span),
                key: key(k),
                message: format!("{k} {only}"),
            });
        }
    }
    if let Some(u) = r.client_users.first() {
        return Err(invalid(
            &u.username,
            key("client_users"),
            format!("client_users {only}"),
        ));
    }
    Ok(())
}

fn signaling_policy(
    r: &RawSignalingRoute,
    key: &dyn Fn(&str) -> String,
    listen: &Domain,
) -> Result<SignalingPolicy> {
    let mut p = SignalingPolicy::default();
    for (j, s) in r.allow_peers.iter().enumerate() {
        let net: Ipv4Net = s.get_ref().parse().map_err(|_| {
            invalid(
                s,
                key(&format!("allow_peers[{j}]")),
                "expected an IPv4 network such as \"10.0.0.0/24\" or \"10.0.0.5/32\"",
            )
        })?;
        if !listen.contains(net.network()) && !listen.networks.iter().any(|n| n.contains(&net)) {
            return Err(invalid(
                s,
                key(&format!("allow_peers[{j}]")),
                format!("{net} is not in domain {}, where this route listens; list peers of the listen domain", listen.id),
            ));
        }
        p.allow_peers.push(net);
    }
    for (j, s) in r.allow_ids.iter().enumerate() {
        let id = s.get_ref();
        if id.is_empty() || id.len() > 20 || !id.bytes().all(|b| b.is_ascii_digit()) {
            return Err(invalid(
                s,
                key(&format!("allow_ids[{j}]")),
                "a GB/T 28181 ID prefix is 1 to 20 digits (\"3402000000\" allows that whole domain)",
            ));
        }
        p.allow_ids.push(id.clone());
    }
    let int = |v: &Option<Spanned<i64>>, name: &str, min: i64, max: i64, what: &str| match v {
        None => Ok(None),
        Some(s) if (min..=max).contains(s.get_ref()) => Ok(Some(*s.get_ref())),
        Some(s) => Err(invalid(
            s,
            key(name),
            format!("{what}: a number from {min} to {max}"),
        )),
    };
    if let Some(v) = int(
        &r.max_message,
        "max_message",
        1024,
        65_535,
        "largest SIP message in bytes",
    )? {
        p.max_message = v as usize;
        // An older config's `max_message` capped TCP too: it keeps doing so unless
        // `max_tcp_message` says otherwise.
        p.max_tcp_message = v as usize;
    }
    if let Some(v) = int(
        &r.max_tcp_message,
        "max_tcp_message",
        1024,
        MAX_TCP_MESSAGE_CAP as i64,
        "largest SIP message over TCP in bytes (a one-MESSAGE Catalog of 1 000 channels is some 340000)",
    )? {
        p.max_tcp_message = v as usize;
    }
    if let Some(v) = int(
        &r.invite_timeout,
        "invite_timeout",
        1,
        600,
        "seconds an INVITE may wait for its final response",
    )? {
        p.invite_timeout = std::time::Duration::from_secs(v as u64);
    }
    if let Some(v) = int(
        &r.media_timeout,
        "media_timeout",
        0,
        86_400,
        "seconds a call may carry no media (0: never ended for that)",
    )? {
        p.media_timeout = std::time::Duration::from_secs(v as u64);
    }
    if let Some(v) = int(
        &r.tcp_media_reconnect,
        "tcp_media_reconnect",
        2,
        600,
        "seconds a call waits for a TCP media peer that closed to connect again (GB/T 28181 Annex D: 3 tries 1 s apart need some 10)",
    )? {
        p.tcp_media_reconnect = std::time::Duration::from_secs(v as u64);
    }
    if let Some(v) = int(
        &r.rate_limit,
        "rate_limit",
        0,
        1_000_000,
        "requests per second per source (0: no limit)",
    )? {
        p.rate_limit = v as u32;
    }
    if let Some(v) = int(
        &r.max_connections_per_source,
        "max_connections_per_source",
        1,
        10_000,
        "TCP connections per source",
    )? {
        p.max_connections_per_source = v as usize;
    }
    if let Some(v) = int(
        &r.max_bindings_per_source,
        "max_bindings_per_source",
        1,
        65_536,
        "contacts (registrations and dialog parties) one source address may hold",
    )? {
        p.max_bindings_per_source = v as usize;
    }
    if let Some(v) = &r.manscdp_addresses {
        p.manscdp_addresses = match v.get_ref().as_str() {
            "gateway" => ManscdpAddresses::Gateway,
            "blank" => ManscdpAddresses::Blank,
            "keep" => ManscdpAddresses::Keep,
            _ => {
                return Err(invalid(
                    v,
                    key("manscdp_addresses"),
                    "expected \"gateway\" (the gateway's address on the receiving side), \"blank\" (emptied) or \"keep\" (unchanged: the far side learns this side's addresses)",
                ))
            }
        };
    }
    if r.manscdp_deny_from_b.is_some() {
        p.manscdp_deny_from_b.clear();
    }
    let from_b = r
        .manscdp_deny_from_b
        .as_ref()
        .map_or(&[][..], |l| l.get_ref().as_slice());
    for (name, list, out) in [
        ("manscdp_allow", &r.manscdp_allow[..], &mut p.manscdp_allow),
        ("manscdp_deny", &r.manscdp_deny[..], &mut p.manscdp_deny),
        ("manscdp_deny_from_b", from_b, &mut p.manscdp_deny_from_b),
    ] {
        for (j, c) in list.iter().enumerate() {
            let v = c.get_ref();
            if v.is_empty() || v.len() > 32 || !v.bytes().all(|b| b.is_ascii_alphanumeric()) {
                return Err(invalid(
                    c,
                    key(&format!("{name}[{j}]")),
                    "a MANSCDP command: a CmdType such as \"DeviceControl\", \"DeviceConfig\", \"Catalog\", or a control command such as \"TeleBoot\" or \"PTZCmd\"",
                ));
            }
            out.push(v.clone());
        }
    }
    Ok(p)
}
