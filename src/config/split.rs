//! `[split]`: checks of a half's config (see [`crate::split`]).

use std::net::{Ipv4Addr, SocketAddrV4};

use ipnet::Ipv4Net;
use toml::Spanned;

use super::raw::{RawLink, RawSplit};
use super::validate::{invalid, parse_ipv4, parse_sockaddr, Invalid};
use super::{Cpus, Domain, EngineConfig, Mode};
use crate::split::{self, Fec, Half, LinkConfig, SplitConfig};

type Result<T> = std::result::Result<T, Invalid>;

pub fn split(
    r: &RawSplit,
    domains: &[Domain; 2],
    engine: &EngineConfig,
    cpus: &Cpus,
) -> Result<SplitConfig> {
    let half = match r.half.get_ref().as_str() {
        "a" => Half::A,
        "b" => Half::B,
        other => {
            return Err(invalid(
                &r.half,
                "split.half",
                format!("unknown half \"{other}\"; use \"a\" (device side, joins domain a) or \"b\" (user side, joins domain b)"),
            ))
        }
    };
    let face = &domains[half.link_face().index()];
    let peer_face = parse_ipv4(&r.peer_face, "split.peer_face")?;
    if peer_face == face.address {
        return Err(invalid(
            &r.peer_face,
            "split.peer_face",
            format!(
                "the peer's face address must differ from ours (domains.{}.address = {})",
                face.id, face.address
            ),
        ));
    }
    let only_peer = vec![Ipv4Net::new(peer_face, 32).expect("/32 is valid")];
    if face.networks != only_peer {
        return Err(invalid(
            &r.peer_face,
            "split.peer_face",
            format!(
                "in half {half} domain {} is the link face: set domains.{}.networks = [\"{peer_face}/32\"] (the peer's face address and nothing else), so no route can send anywhere but down the link",
                face.id, face.id
            ),
        ));
    }
    if engine.mode == Mode::Xdp {
        return Err(Invalid {
            span: None,
            key: "engine.mode".into(),
            message: "mode xdp forwards inside the kernel and cannot hand datagrams to the link; a split half runs mode stack, tnapi or zc".into(),
        });
    }
    let out_link = link(&r.out_link, "split.out_link", true, cpus)?;
    if engine.max_payload > out_link.max_datagram {
        return Err(Invalid {
            span: None,
            key: "engine.max_payload".into(),
            message: format!(
                "a half sends datagrams of up to split.out_link.max_datagram = {} bytes down the link; set engine.max_payload = {} or less, or raise max_datagram",
                out_link.max_datagram, out_link.max_datagram
            ),
        });
    }
    let in_link = link(&r.in_link, "split.in_link", false, cpus)?;
    if in_link.interface == out_link.interface {
        return Err(invalid(
            &r.in_link.interface,
            "split.in_link.interface",
            "the incoming and outgoing links must be different interfaces: each is one direction of its own one-way cable",
        ));
    }
    // The link's addresses are checked against the domains below, with the media links'.
    let signal = r.signal.check(&[])?;
    if signal.interface == out_link.interface || signal.interface == in_link.interface {
        return Err(invalid(
            &r.signal.interface,
            "split.signal.interface",
            "the signaling link needs its own interface, not one of the one-way media links",
        ));
    }
    for (raw, name, ifname) in [
        (
            &r.out_link.interface,
            "split.out_link.interface",
            &out_link.interface,
        ),
        (
            &r.in_link.interface,
            "split.in_link.interface",
            &in_link.interface,
        ),
        (
            &r.signal.interface,
            "split.signal.interface",
            &signal.interface,
        ),
    ] {
        if let Some(d) = domains.iter().find(|d| &d.interface == ifname) {
            return Err(invalid(
                raw,
                name,
                format!("interface {ifname} is domain {}'s interface; a link between the halves must never be a domain's network", d.id),
            ));
        }
    }
    // No domain address may be reachable through a link: link addresses are in no domain.
    let addrs: [(&Spanned<String>, &str, Ipv4Addr); 4] = [
        (
            &r.out_link.local,
            "split.out_link.local",
            *out_link.local.ip(),
        ),
        (&r.out_link.peer, "split.out_link.peer", *out_link.peer.ip()),
        (&r.in_link.local, "split.in_link.local", *in_link.local.ip()),
        (&r.in_link.peer, "split.in_link.peer", *in_link.peer.ip()),
    ];
    let sig: [(&Spanned<String>, &str, Option<Ipv4Addr>); 2] = [
        (
            &r.signal.local,
            "split.signal.local",
            Some(*signal.local.ip()),
        ),
        (&r.signal.peer, "split.signal.peer", Some(*signal.peer.ip())),
    ];
    let all = addrs
        .iter()
        .map(|(s, k, a)| (*s, *k, Some(*a)))
        .chain(sig.iter().copied());
    for (raw, key, addr) in all {
        let Some(addr) = addr else { continue };
        if let Some(d) = domains.iter().find(|d| d.contains(addr)) {
            return Err(invalid(
                raw,
                key,
                format!("{addr} lies in domain {}: a link's addresses must belong to no domain, or that domain becomes reachable through the link", d.id),
            ));
        }
    }
    if out_link.local.ip() == in_link.local.ip() {
        return Err(invalid(
            &r.in_link.local,
            "split.in_link.local",
            "give each link its own address: the two one-way links are separate networks",
        ));
    }
    Ok(SplitConfig {
        half,
        peer_face,
        out_link,
        in_link,
        signal,
    })
}

fn link(r: &RawLink, key: &str, outgoing: bool, cpus: &Cpus) -> Result<LinkConfig> {
    let k = |f: &str| format!("{key}.{f}");
    if r.interface.get_ref().is_empty() {
        return Err(invalid(
            &r.interface,
            k("interface"),
            "name the link's interface, e.g. \"ens2f1\"",
        ));
    }
    let local: SocketAddrV4 = parse_sockaddr(&r.local, &k("local"))?;
    let peer: SocketAddrV4 = parse_sockaddr(&r.peer, &k("peer"))?;
    if local.ip() == peer.ip() {
        return Err(invalid(
            &r.peer,
            k("peer"),
            "the peer's link address must differ from ours",
        ));
    }
    let peer_mac = match (&r.peer_mac, outgoing) {
        (Some(m), true) => Some(crate::wire::parse_mac(m.get_ref()).ok_or_else(|| {
            invalid(m, k("peer_mac"), "expected a MAC such as \"02:00:00:00:01:02\" (the peer's link interface)")
        })?),
        (None, true) => {
            return Err(invalid(
                &r.interface,
                k("peer_mac"),
                "the outgoing link needs peer_mac = the MAC of the peer's link interface: nothing may ask for it (no ARP on a one-way link)",
            ))
        }
        (Some(m), false) => {
            return Err(invalid(
                m,
                k("peer_mac"),
                "the incoming link sends nothing, so it needs no peer MAC; remove the key",
            ))
        }
        (None, false) => None,
    };
    let fec: Option<Fec> = Fec::parse(r.fec.get_ref()).map_err(|m| invalid(&r.fec, k("fec"), m))?;
    match (&r.cpu, outgoing) {
        (Some(c), true) => {
            return Err(invalid(
                c,
                k("cpu"),
                "the outgoing link is sent by the engine's workers; only split.in_link has a cpu",
            ))
        }
        (Some(c), false) if *c.get_ref() < 0 || !cpus.online.contains(&(*c.get_ref() as usize)) => {
            return Err(invalid(
                c,
                k("cpu"),
                format!(
                    "CPU {} is not online here (online: {:?})",
                    c.get_ref(),
                    cpus.online
                ),
            ))
        }
        _ => {}
    }
    let reorder_ms = match (&r.reorder_ms, outgoing) {
        (Some(v), true) => {
            return Err(invalid(
                v,
                k("reorder_ms"),
                "the outgoing link sends in order; only split.in_link has a reorder window",
            ))
        }
        (Some(v), false) if !(0..=i64::try_from(split::link::SETTLE_MS).unwrap_or(500)).contains(v.get_ref()) => {
            return Err(invalid(
                v,
                k("reorder_ms"),
                format!(
                    "expected 0 (hand datagrams on as they arrive) to {} milliseconds (the longest a datagram waits for a missing earlier one)",
                    split::link::SETTLE_MS
                ),
            ))
        }
        (Some(v), false) => *v.get_ref() as u64,
        // Without FEC a gap on a point-to-point link is a loss (a cable does not reorder):
        // waiting for it would only delay what follows.
        (None, _) if fec.is_none() => 0,
        (None, _) => split::link::DEFAULT_REORDER_MS,
    };
    let max_datagram = match (&r.max_datagram, outgoing) {
        (Some(v), false) => {
            return Err(invalid(
                v,
                k("max_datagram"),
                "the incoming link joins datagrams of any length the peer may send; only split.out_link has max_datagram",
            ))
        }
        (Some(v), true) if !(64..=crate::wire::link::MAX_DATAGRAM as i64).contains(v.get_ref()) => {
            return Err(invalid(
                v,
                k("max_datagram"),
                format!(
                    "expected 64 to {} bytes (the largest UDP payload); a datagram longer than a link frame's {} bytes of media is cut into several frames",
                    crate::wire::link::MAX_DATAGRAM,
                    crate::wire::link::MAX_MEDIA
                ),
            ))
        }
        (Some(v), true) => *v.get_ref() as usize,
        (None, _) => crate::wire::link::MAX_DATAGRAM,
    };
    Ok(LinkConfig {
        interface: r.interface.get_ref().clone(),
        local,
        peer,
        peer_mac,
        fec,
        cpu: r.cpu.as_ref().map(|c| *c.get_ref() as usize),
        reorder_ms,
        max_datagram,
    })
}

/// What a half's engine-family outgoing link (modes tnapi and zc: frames built by vgate, see
/// [`crate::split::link`]) needs from the host that runs it: the interface (its index), a
/// MAC on it (the frames' source; the peer's is `peer_mac`), and in mode zc one TX queue per
/// engine worker (an AF_XDP socket each). Read from sysfs. `vgate check-config` runs it on
/// the machine the half runs on (not with `--cpus`, which checks for another machine).
pub fn check_host(
    cfg: &super::Config,
    text: &str,
    file: &str,
) -> std::result::Result<(), super::ConfigError> {
    let Some(s) = &cfg.split else { return Ok(()) };
    if !matches!(cfg.engine.mode, Mode::Tnapi | Mode::Zc) {
        return Ok(());
    }
    let ifname = &s.out_link.interface;
    let sys = |f: &str| std::fs::read_to_string(format!("/sys/class/net/{ifname}/{f}"));
    let problem = if sys("ifindex").is_err() {
        Some(format!(
            "mode {} sends the outgoing link from interface {ifname}, which this host does not have; name the link's interface (ip link)",
            cfg.engine.mode
        ))
    } else if sys("address")
        .ok()
        .and_then(|a| crate::wire::parse_mac(a.trim()))
        .is_none_or(|m| m == [0; 6])
    {
        Some(format!(
            "interface {ifname} has no Ethernet address, which mode {} needs as the source of the link's frames; use an Ethernet interface for the link",
            cfg.engine.mode
        ))
    } else if cfg.engine.mode == Mode::Zc {
        let tx_queues = std::fs::read_dir(format!("/sys/class/net/{ifname}/queues"))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| e.file_name().to_string_lossy().starts_with("tx-"))
                    .count()
            })
            .unwrap_or(0);
        (tx_queues < cfg.engine.queues).then(|| {
            format!(
                "mode zc sends the outgoing link with one AF_XDP socket per engine worker, each on its own TX queue: {ifname} has {tx_queues} TX queue(s) for engine.queues = {}; add queues (ethtool -L {ifname} combined {}) or lower engine.queues",
                cfg.engine.queues, cfg.engine.queues
            )
        })
    } else {
        None
    };
    let Some(message) = problem else {
        return Ok(());
    };
    let span = toml::from_str::<super::raw::RawConfig>(text)
        .ok()
        .and_then(|r| r.split.map(|s| s.out_link.interface.span()));
    let (line, column) = span.map_or((0, 0), |sp| super::line_col(text, sp.start));
    Err(super::ConfigError {
        file: file.to_string(),
        line,
        column,
        key: "split.out_link.interface".into(),
        message,
    })
}
