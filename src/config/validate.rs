//! From the file as written ([`super::raw`]) to a [`Config`] the gateway can trust. Each check
//! names the key and says what to change; the first failure wins, in file order.

use std::collections::{HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::ops::Range;

use ipnet::Ipv4Net;
use toml::Spanned;

use super::check::{invalid, parse_ipv4, parse_sockaddr, parse_sockaddr_any_port, Invalid};
use super::raw::{RawConfig, RawDomain, RawSecret, RawSignalingRoute, RawStreamRoute};
use super::{
    Config, Control, Cpus, Domain, DomainId, EngineConfig, ManscdpAddresses, Mode, PortRange,
    RtspOptions, RtspPath, Secret, Security, SignalingKind, SignalingPolicy, SignalingRoute,
    SourcePolicy, StaticStream, TnapiRing, Transport, UserPass,
};

type Result<T> = std::result::Result<T, Invalid>;

/// Checks `raw` against itself and against a machine with `cpus` CPUs.
pub fn validate(raw: &RawConfig, cpus: &Cpus) -> Result<Config> {
    let a = domain(DomainId::A, &raw.domains.a)?;
    let b = domain(DomainId::B, &raw.domains.b)?;
    cross_domain(&a, &b, &raw.domains.b)?;
    let domains = [a, b];
    let engine = engine(raw, cpus)?;
    let relatch_after_ms =
        match &raw.security.relatch_after_ms {
            None => super::DEFAULT_RELATCH_AFTER_MS,
            Some(v) if *v.get_ref() == 0 || (100..=3_600_000).contains(v.get_ref()) => {
                *v.get_ref() as u64
            }
            Some(v) => return Err(invalid(
                v,
                "security.relatch_after_ms",
                "expected 0 (never re-latch) or 100 to 3600000 milliseconds; the default is 2000",
            )),
        };
    let security = Security {
        source_validation: raw.security.source_validation,
        rtp_only: raw.security.rtp_only,
        relatch_after_ms,
    };
    let listen: SocketAddr = raw.control.listen.get_ref().parse().map_err(|_| {
        invalid(
            &raw.control.listen,
            "control.listen",
            "expected an address and port such as \"127.0.0.1:9940\"",
        )
    })?;
    let token = raw.control.token.as_ref().map(|t| t.get_ref().clone());
    if let (Some(t), Some(at)) = (&token, &raw.control.token) {
        if t.len() < 16 || t.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(invalid(
                at,
                "control.token",
                "use at least 16 printable characters without spaces (e.g. the output of `openssl rand -hex 24`)",
            ));
        }
    }
    if !listen.ip().is_loopback() && token.is_none() {
        return Err(invalid(
            &raw.control.listen,
            "control.listen",
            "the admin interface is off loopback, so it needs control.token; add one, or listen on 127.0.0.1",
        ));
    }
    let control = Control {
        listen,
        token,
        per_stream_metrics: raw.control.per_stream_metrics,
    };

    let mut signaling = Vec::new();
    let mut names = HashSet::new();
    let mut listeners = HashSet::new();
    for (i, r) in raw.signaling_route.iter().enumerate() {
        let route = signaling_route(i, r, &domains)?;
        if !names.insert(route.name.clone()) {
            return Err(invalid(
                &r.name,
                format!("signaling_route[{i}].name"),
                format!(
                    "the name \"{}\" is used twice; give each route its own",
                    route.name
                ),
            ));
        }
        if !listeners.insert((route.listen_domain, route.listen_port, route.transport)) {
            return Err(invalid(
                &r.listen_port,
                format!("signaling_route[{i}].listen_port"),
                format!(
                    "another signaling route already listens on port {} of domain {} with the same transport: two listen faces on one socket cannot be told apart (a new request could be for either); give this route its own listen_port",
                    route.listen_port, route.listen_domain
                ),
            ));
        }
        signaling.push(route);
    }
    // Each SIP route also has a socket on the upstream side. SIP faces of several routes
    // on one socket share it (the proxy dispatches each message to its route: see
    // `signaling::proxy::sip::net::pick`); an RTSP listener cannot share a socket with SIP.
    let rtsp: HashMap<(DomainId, u16, Transport), String> = signaling
        .iter()
        .filter(|r| r.kind == SignalingKind::Rtsp)
        .map(|r| {
            (
                (r.listen_domain, r.listen_port, r.transport),
                r.name.clone(),
            )
        })
        .collect();
    for (i, (route, r)) in signaling.iter().zip(&raw.signaling_route).enumerate() {
        if route.kind != SignalingKind::Sip {
            continue;
        }
        let face = (
            route.listen_domain.other(),
            route.policy.upstream_port,
            route.transport,
        );
        if let Some(other) = rtsp.get(&face) {
            let k = format!("signaling_route[{i}].upstream_port");
            let message = format!(
                "this route's socket on the upstream side would be port {} of domain {}, where RTSP route \"{other}\" listens; SIP routes share a socket with each other, not with RTSP: set upstream_port to another port (it is where the upstream side reaches this route, so keep it fixed)",
                face.1, face.0
            );
            return Err(match &r.upstream_port {
                Some(v) => invalid(v, k, message),
                None => invalid(&r.listen_port, k, message),
            });
        }
    }

    let mut streams = Vec::new();
    let mut names = HashSet::new();
    let mut ingress: HashMap<(DomainId, u16), String> = HashMap::new();
    let mut egress: HashMap<(DomainId, u16), String> = HashMap::new();
    for (i, r) in raw.stream_route.iter().enumerate() {
        let s = stream_route(i, r, &domains, &security)?;
        if !names.insert(s.name.clone()) {
            return Err(invalid(
                &r.name,
                format!("stream_route[{i}].name"),
                format!(
                    "the name \"{}\" is used twice; give each route its own",
                    s.name
                ),
            ));
        }
        if let Some(other) = ingress.insert((s.domain, s.port), s.name.clone()) {
            return Err(invalid(
                &r.port,
                format!("stream_route[{i}].port"),
                format!(
                    "port {} of domain {} is already the listen port of route \"{other}\"",
                    s.port, s.domain
                ),
            ));
        }
        if let (Some(port), Some(at)) = (s.egress_port, &r.egress_port) {
            if let Some(other) = egress.insert((s.domain.other(), port), s.name.clone()) {
                return Err(invalid(
                    at,
                    format!("stream_route[{i}].egress_port"),
                    format!(
                        "egress port {port} is already used by route \"{other}\"; receivers tell streams apart by their source port"
                    ),
                ));
            }
        }
        streams.push(s);
    }

    let split = match &raw.split {
        None => None,
        Some(r) => Some(super::split::split(r, &domains, &engine, cpus)?),
    };

    Ok(Config {
        domains,
        engine,
        security,
        control,
        signaling,
        streams,
        split,
    })
}

fn domain(id: DomainId, raw: &RawDomain) -> Result<Domain> {
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

fn cross_domain(a: &Domain, b: &Domain, raw_b: &RawDomain) -> Result<()> {
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

fn engine(raw: &RawConfig, machine: &Cpus) -> Result<EngineConfig> {
    let machine_cpus = machine.online.len();
    let e = &raw.engine;
    let queues = *e.queues.get_ref();
    if queues < 1 {
        return Err(invalid(
            &e.queues,
            "engine.queues",
            "needs at least one queue",
        ));
    }
    let queues = queues as usize;
    if queues > machine_cpus {
        return Err(invalid(
            &e.queues,
            "engine.queues",
            format!(
                "{queues} channels but this machine has {machine_cpus} online CPUs; one worker per core at most (the published model never runs more channels than cores)"
            ),
        ));
    }
    let mut cpus = Vec::new();
    let empty = Spanned::new(0..0, Vec::new());
    let cpu_list = e.cpus.as_ref().unwrap_or(&empty);
    for &c in cpu_list.get_ref() {
        if c < 0 || !machine.online.contains(&(c as usize)) {
            return Err(invalid(
                cpu_list,
                "engine.cpus",
                format!(
                    "CPU {c} is not online here (online CPUs: {}); name online CPUs or leave the list empty",
                    machine.online_list()
                ),
            ));
        }
        if cpus.contains(&(c as usize)) {
            return Err(invalid(
                cpu_list,
                "engine.cpus",
                format!("CPU {c} is listed twice; one worker per core"),
            ));
        }
        cpus.push(c as usize);
    }
    if cpus.is_empty() {
        cpus = auto_cpus(queues, machine);
    } else if cpus.len() != queues {
        return Err(invalid(
            cpu_list,
            "engine.cpus",
            format!(
                "lists {} CPUs for {queues} queues; give one CPU per queue or leave it empty",
                cpus.len()
            ),
        ));
    }
    let batch = *e.batch.get_ref();
    if !(1..=1024).contains(&batch) {
        return Err(invalid(
            &e.batch,
            "engine.batch",
            "must be between 1 and 1024 packets",
        ));
    }
    let max_payload = *e.max_payload.get_ref();
    if !(64..=9000).contains(&max_payload) {
        return Err(invalid(
            &e.max_payload,
            "engine.max_payload",
            "must be between 64 and 9000 bytes (jumbo frames at most)",
        ));
    }
    let mode = *e.mode.get_ref();
    if let Some(ring) = &e.tnapi.ring {
        if mode != Mode::Tnapi {
            return Err(invalid(
                ring,
                "engine.tnapi.ring",
                format!("applies to mode tnapi only (mode is {mode}); remove it or set engine.mode = \"tnapi\""),
            ));
        }
    }
    Ok(EngineConfig {
        mode,
        queues,
        cpus,
        batch: batch as usize,
        max_payload: max_payload as usize,
        tnapi_ring: e
            .tnapi
            .ring
            .as_ref()
            .map_or_else(TnapiRing::default, |r| *r.get_ref()),
        reserve_ports: e.reserve_ports,
    })
}

/// One CPU per queue, keeping CPU 0 for the kernel and the rest of the system when there is
/// room (the published model's tuning lesson); on two cores there is not.
pub fn auto_cpus(queues: usize, machine: &Cpus) -> Vec<usize> {
    // From the start-up affinity first (what the operator gave the service), its lowest CPU
    // kept free when there are more than two; then other online CPUs if it is too small.
    let allowed = &machine.allowed;
    let skip = usize::from(allowed.len() > 2 && queues < allowed.len());
    allowed
        .iter()
        .skip(skip)
        .chain(machine.online.iter().filter(|c| !allowed.contains(c)))
        .copied()
        .take(queues)
        .collect()
}

/// Default `max_connections_per_source` of an RTSP route.
pub const RTSP_CONNECTIONS_PER_SOURCE: usize = 64;

fn signaling_route(
    i: usize,
    r: &RawSignalingRoute,
    domains: &[Domain; 2],
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
    })
}

/// SIP-only keys on an RTSP route would do nothing: refused, named.
fn refuse_sip_keys(i: usize, r: &RawSignalingRoute) -> Result<()> {
    let key = |k: &str| format!("signaling_route[{i}].{k}");
    let only = "is a SIP setting and does nothing on an RTSP route; remove it";
    let spans: [(&str, Option<Range<usize>>); 7] = [
        ("upstream_port", r.upstream_port.as_ref().map(|s| s.span())),
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
    let spans: [(&str, Option<Range<usize>>); 6] = [
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

fn rtsp_options(
    i: usize,
    r: &RawSignalingRoute,
    domains: &[Domain; 2],
    listen_domain: DomainId,
    upstream: SocketAddrV4,
) -> Result<RtspOptions> {
    let key = |k: &str| format!("signaling_route[{i}].{k}");
    if r.transport != Transport::Tcp {
        return Err(Invalid {
            span: Some(r.name.span()),
            key: key("transport"),
            message: "RTSP routes run over TCP: set transport = \"tcp\"".into(),
        });
    }
    let route_credentials = credentials(
        r.upstream_username.as_ref(),
        r.upstream_password.as_ref(),
        &key("upstream_username"),
        &key("upstream_password"),
    )?;
    let mut paths: Vec<RtspPath> = Vec::new();
    for (j, p) in r.paths.iter().enumerate() {
        let pkey = |k: &str| format!("signaling_route[{i}].paths[{j}].{k}");
        let prefix = rtsp_path(&p.prefix, &pkey("prefix"))?;
        let up = match &p.upstream {
            Some(u) => {
                let addr = parse_sockaddr(u, &pkey("upstream"))?;
                check_far_side(
                    domains,
                    listen_domain,
                    *addr.ip(),
                    u,
                    &pkey("upstream"),
                    "upstream",
                )?;
                addr
            }
            None => upstream,
        };
        let upstream_path = match &p.upstream_path {
            Some(u) => rtsp_path(u, &pkey("upstream_path"))?,
            None => "/".to_string(),
        };
        let own = credentials(
            p.upstream_username.as_ref(),
            p.upstream_password.as_ref(),
            &pkey("upstream_username"),
            &pkey("upstream_password"),
        )?;
        let norm = |s: &str| s.trim_end_matches('/').to_string();
        if paths.iter().any(|q| norm(&q.prefix) == norm(&prefix)) {
            return Err(invalid(
                &p.prefix,
                pkey("prefix"),
                format!(
                    "the prefix \"{prefix}\" is listed twice; each prefix maps to one upstream"
                ),
            ));
        }
        paths.push(RtspPath {
            prefix,
            upstream: up,
            upstream_path,
            credentials: own.or_else(|| route_credentials.clone()),
        });
    }
    if paths.is_empty() {
        paths.push(RtspPath {
            prefix: "/".into(),
            upstream,
            upstream_path: "/".into(),
            credentials: route_credentials,
        });
    }
    let mut client_users: Vec<UserPass> = Vec::new();
    for (j, u) in r.client_users.iter().enumerate() {
        let ukey = format!("signaling_route[{i}].client_users[{j}].username");
        let user = username(&u.username, &ukey)?;
        if client_users.iter().any(|c| c.username == user) {
            return Err(invalid(&u.username, ukey, "this username is listed twice"));
        }
        client_users.push(UserPass {
            username: user,
            password: Secret::new(u.password.get_ref().0.clone()),
        });
    }
    let client_realm = match &r.client_realm {
        Some(s) => {
            let v = s.get_ref();
            if v.is_empty()
                || v.len() > 64
                || v.chars().any(|c| c.is_control() || c == '"' || c == '\\')
            {
                return Err(invalid(
                    s,
                    key("client_realm"),
                    "a realm is 1-64 printable characters without quotes or backslashes",
                ));
            }
            v.clone()
        }
        None => "vgate".into(),
    };
    let session_timeout = match &r.session_timeout {
        None => 60,
        Some(s) if (1..=3600).contains(s.get_ref()) => *s.get_ref() as u32,
        Some(s) => {
            return Err(invalid(
                s,
                key("session_timeout"),
                "must be between 1 and 3600 seconds",
            ))
        }
    };
    let request_timeout = match &r.request_timeout {
        None => 10,
        Some(s) if (1..=600).contains(s.get_ref()) => *s.get_ref() as u32,
        Some(s) => {
            return Err(invalid(
                s,
                key("request_timeout"),
                "seconds a client may take to send one whole request: a number from 1 to 600",
            ))
        }
    };
    Ok(RtspOptions {
        paths,
        client_users,
        client_realm,
        session_timeout,
        request_timeout,
    })
}

/// A URL path prefix: starts with `/`, printable, no spaces, no dot segments.
fn rtsp_path(s: &Spanned<String>, key: &str) -> Result<String> {
    let v = s.get_ref();
    let ok = v.starts_with('/')
        && v.len() <= 256
        && v.chars()
            .all(|c| c.is_ascii_graphic() && !"?#%\\".contains(c))
        && !v.split('/').any(|seg| seg == "." || seg == "..");
    if !ok {
        return Err(invalid(
            s,
            key,
            "expected a URL path such as \"/cam1\": starts with '/', no spaces, '?', '#', '%' or dot segments",
        ));
    }
    Ok(v.clone())
}

fn username(s: &Spanned<String>, key: &str) -> Result<String> {
    let v = s.get_ref();
    if v.is_empty() || v.len() > 128 || v.chars().any(|c| c.is_control() || c == ':') {
        return Err(invalid(
            s,
            key,
            "a username is 1-128 characters, no ':' and no control characters",
        ));
    }
    Ok(v.clone())
}

/// Both or neither of a username and password. Messages never repeat a password.
fn credentials(
    user: Option<&Spanned<String>>,
    pass: Option<&Spanned<RawSecret>>,
    user_key: &str,
    pass_key: &str,
) -> Result<Option<UserPass>> {
    match (user, pass) {
        (None, None) => Ok(None),
        (Some(u), Some(p)) => {
            let username = username(u, user_key)?;
            if p.get_ref().0.chars().any(|c| c.is_control()) {
                return Err(invalid(
                    p,
                    pass_key,
                    "the password contains control characters",
                ));
            }
            Ok(Some(UserPass {
                username,
                password: Secret::new(p.get_ref().0.clone()),
            }))
        }
        (Some(u), None) => Err(invalid(
            u,
            pass_key,
            "a username needs a password beside it",
        )),
        (None, Some(p)) => Err(invalid(
            p,
            user_key,
            "a password needs a username beside it",
        )),
    }
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
    for (name, list, out) in [
        ("manscdp_allow", &r.manscdp_allow, &mut p.manscdp_allow),
        ("manscdp_deny", &r.manscdp_deny, &mut p.manscdp_deny),
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

fn stream_route(
    i: usize,
    r: &RawStreamRoute,
    domains: &[Domain; 2],
    security: &Security,
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
    })
}

/// An address a route sends to must be in the domain across from where it listens.
fn check_far_side(
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

fn route_name(s: &Spanned<String>, key: &str) -> Result<String> {
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

fn port(p: &Spanned<i64>, key: &str) -> Result<u16> {
    match u16::try_from(*p.get_ref()) {
        Ok(v) if v > 0 => Ok(v),
        _ => Err(invalid(p, key, "a port is a number from 1 to 65535")),
    }
}

fn port_range(s: &Spanned<String>, key: &str) -> Result<PortRange> {
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
