//! From the file as written ([`super::raw`]) to a [`Config`] the gateway can trust. Each check
//! names the key and says what to change; the first failure wins, in file order.
//!
//! This folder, in file order: `domain`, `engine`, `signaling` (and its `rtsp` options),
//! `stream`, and `fields` (checks of one value the sections share); this file runs them and
//! assembles the [`Config`].

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;

use super::check::{invalid, Invalid};
use super::raw::RawConfig;
use super::{Config, Control, Cpus, DomainId, Security, SignalingKind, Transport};

type Result<T> = std::result::Result<T, Invalid>;

mod domain;
mod engine;
mod fields;
mod media;
mod rtsp;
mod signaling;
mod stream;

pub use engine::auto_cpus;

use domain::{cross_domain, domain};
use engine::engine;
use signaling::signaling_route;
use stream::stream_route;

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

    let media = media::media(&raw.media)?;

    let mut signaling = Vec::new();
    let mut names = HashSet::new();
    let mut listeners = HashSet::new();
    for (i, r) in raw.signaling_route.iter().enumerate() {
        let route = signaling_route(i, r, &domains, &media)?;
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
        let s = stream_route(i, r, &domains, &security, &media)?;
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

    let ha = match &raw.ha {
        None => None,
        Some(h) => Some(super::ha::ha(h, engine.mode, &raw.engine.mode)?),
    };

    Ok(Config {
        domains,
        engine,
        security,
        control,
        signaling,
        streams,
        media,
        split,
        ha,
    })
}
