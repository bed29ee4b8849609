//! `[split]`: a half's settings ([`SplitConfig`]: which half, the peer's face address, the two
//! one-way media links and the signaling link) and their checks.
//!
//! The split appliance is one half of a gateway whose two halves are joined only by one-way
//! media links and a signaling link (see `docs/split.md`). A half is the single-host gateway
//! with one of its domains replaced by the **link face**: half `a` keeps domain a and turns
//! domain b into the face (its address is our face address, its only network the peer's face
//! address); half `b` mirrors it. The link's frames are [`crate::wire::link`], its protocol
//! [`crate::link`], its sending and receiving `engine::link`, the signaling agent
//! `signaling::split`.

use std::net::{Ipv4Addr, SocketAddrV4};

use ipnet::Ipv4Net;
use toml::Spanned;

use super::check::{invalid, parse_ipv4, parse_sockaddr, Invalid};
use super::raw::{RawLink, RawSplit};
use super::split_signal::SignalLink;
use super::{Cpus, Domain, DomainId, EngineConfig, Mode};
use crate::link::auth::LinkKey;
use crate::link::Fec;

/// A receiver block quiet this long counts what it never got as lost (the longest
/// `split.in_link.reorder_ms`).
pub const SETTLE_MS: u64 = 500;
/// The incoming link's reorder window by default with FEC on: a datagram waits at most this
/// long for a missing earlier one to be rebuilt (`split.in_link.reorder_ms`; 0 hands
/// datagrams on as they arrive, the default with FEC off: a gap is then a loss, and waiting
/// for it only delays what follows). Long enough for the repair frames of a block closed
/// early (the link's `CLOSE_BLOCK_MS`).
pub const DEFAULT_REORDER_MS: u64 = 25;

/// Which half this process is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Half {
    /// Device side: joins domain a and the links.
    A,
    /// User side: joins the links and domain b.
    B,
}

impl Half {
    pub fn name(self) -> &'static str {
        match self {
            Half::A => "a",
            Half::B => "b",
        }
    }

    /// The domain that is the link face in this half.
    pub fn link_face(self) -> DomainId {
        match self {
            Half::A => DomainId::B,
            Half::B => DomainId::A,
        }
    }
}

impl std::fmt::Display for Half {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One one-way link as configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkConfig {
    /// The interface the link is on (one end of the one-way cable).
    pub interface: String,
    /// Our address and UDP port on the link.
    pub local: SocketAddrV4,
    /// The peer half's address and UDP port on the link: where we send (outgoing), the only
    /// source we accept (incoming).
    pub peer: SocketAddrV4,
    /// The peer's MAC (outgoing link only): installed as a permanent neighbour entry so the
    /// kernel never asks for it.
    pub peer_mac: Option<[u8; 6]>,
    /// FEC: `None` off, or k data + m repair per block. Both halves must agree per link.
    pub fec: Option<Fec>,
    /// Incoming link only: the CPU its receive worker is pinned to (default: the engine's
    /// last worker CPU).
    pub cpu: Option<usize>,
    /// Incoming link only: datagrams are handed on in the sender's order, one waiting at
    /// most this long for a missing earlier one (0: handed on as they arrive; the default
    /// with FEC off).
    pub reorder_ms: u64,
    /// Outgoing link only: the longest datagram sent down the link, cut into as many frames
    /// as it needs ([`crate::link::frag`]); longer ones are dropped as `oversize`.
    pub max_datagram: usize,
    /// The key that authenticates the link's frames, derived for its direction from
    /// `key`/`key_file` ([`crate::link::auth`]); `None`: frames are not authenticated.
    pub key: Option<LinkKey>,
}

/// `[split]`: this process is one half.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitConfig {
    pub half: Half,
    /// The peer half's face address (the only network of our link-face domain).
    pub peer_face: Ipv4Addr,
    pub out_link: LinkConfig,
    pub in_link: LinkConfig,
    pub signal: SignalLink,
}

impl SplitConfig {
    pub fn link_face(&self) -> DomainId {
        self.half.link_face()
    }
}

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
    let mut out_link = link(&r.out_link, "split.out_link", true, cpus)?;
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
    let mut in_link = link(&r.in_link, "split.in_link", false, cpus)?;
    // Each direction its own key, even from one key written in both links.
    let other = match half {
        Half::A => Half::B,
        Half::B => Half::A,
    };
    out_link.key =
        link_key(&r.out_link, "split.out_link")?.map(|k| LinkKey::derive(&k, half.name()));
    in_link.key = link_key(&r.in_link, "split.in_link")?.map(|k| LinkKey::derive(&k, other.name()));
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

/// A link's configured key bytes (`key` or `key_file`, checked as `split.signal`'s);
/// `None` when neither is given.
fn link_key(r: &RawLink, key: &str) -> Result<Option<Vec<u8>>> {
    use super::split_signal::decode_key;
    let k = |f: &str| format!("{key}.{f}");
    match (&r.key, &r.key_file) {
        (Some(v), None) => decode_key(&v.get_ref().0)
            .map(Some)
            .map_err(|m| invalid(v, k("key"), m)),
        (None, Some(f)) => {
            let path = std::path::Path::new(f.get_ref());
            if !path.is_absolute() {
                return Err(invalid(f, k("key_file"), "give an absolute path"));
            }
            let text = std::fs::read_to_string(path).map_err(|e| {
                invalid(
                    f,
                    k("key_file"),
                    format!("cannot read {}: {e}", path.display()),
                )
            })?;
            decode_key(&text)
                .map(Some)
                .map_err(|m| invalid(f, k("key_file"), m))
        }
        (Some(v), Some(_)) => Err(invalid(
            v,
            k("key"),
            "give either key or key_file, not both",
        )),
        (None, None) => Ok(None),
    }
}

/// What `check-config` and the start say about a link without a key (None: keyed).
pub fn unauthenticated_warning(s: &SplitConfig) -> Option<String> {
    let names: Vec<&str> = [
        ("split.out_link", &s.out_link),
        ("split.in_link", &s.in_link),
    ]
    .into_iter()
    .filter(|(_, l)| l.key.is_none())
    .map(|(n, _)| n)
    .collect();
    (!names.is_empty()).then(|| {
        format!(
            "{} without key: its frames are not authenticated, so anything that can send on the link (the isolation device's position) can forge or replay media into the domain; add key = \"<64 hex digits>\" (or key_file) to each link, the same for a link on both halves (e.g. `openssl rand -hex 32`)",
            names.join(" and ")
        )
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
    let fec = link_fec(r, &k)?;
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
        (Some(v), false) if !(0..=i64::try_from(SETTLE_MS).unwrap_or(500)).contains(v.get_ref()) => {
            return Err(invalid(
                v,
                k("reorder_ms"),
                format!(
                    "expected 0 (hand datagrams on as they arrive) to {} milliseconds (the longest a datagram waits for a missing earlier one)",
                    SETTLE_MS
                ),
            ))
        }
        (Some(v), false) => *v.get_ref() as u64,
        // Without FEC a gap on a point-to-point link is a loss (a cable does not reorder):
        // waiting for it would only delay what follows.
        (None, _) if fec.is_none() => 0,
        (None, _) => DEFAULT_REORDER_MS,
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
        key: None,
    })
}

/// `fec` and, for `fec = "block"`, the `fec_overhead`, `fec_block_frames` and
/// `fec_block_ms` keys (elsewhere refused: they would change nothing).
fn link_fec(r: &RawLink, k: &impl Fn(&str) -> String) -> Result<Option<Fec>> {
    let fec: Option<Fec> = Fec::parse(r.fec.get_ref()).map_err(|m| invalid(&r.fec, k("fec"), m))?;
    let keys = [
        ("fec_overhead", &r.fec_overhead),
        ("fec_block_frames", &r.fec_block_frames),
        ("fec_block_ms", &r.fec_block_ms),
    ];
    let Some(f) = fec.filter(Fec::block_code) else {
        if let Some((name, Some(v))) = keys.iter().find(|(_, v)| v.is_some()) {
            return Err(invalid(
                v,
                k(name),
                format!(
                    "{name} sizes the blocks of fec = \"block\"; this link has fec = \"{}\": remove the key or set fec = \"block\"",
                    r.fec.get_ref()
                ),
            ));
        }
        return Ok(fec);
    };
    let crate::link::fec::Code::Block {
        overhead_pct,
        close_ms,
    } = f.code
    else {
        return Ok(fec);
    };
    let value =
        |name: &str, v: &Option<Spanned<i64>>, default: u8| -> Result<(u8, Option<Spanned<i64>>)> {
            match v {
                None => Ok((default, None)),
                Some(s) => match u8::try_from(*s.get_ref()) {
                    Ok(x) => Ok((x, Some(s.clone()))),
                    Err(_) => Err(invalid(
                        s,
                        k(name),
                        format!("{name} out of range: {}", s.get_ref()),
                    )),
                },
            }
        };
    let (pct, sp) = value("fec_overhead", &r.fec_overhead, overhead_pct)?;
    let (frames, sf) = value("fec_block_frames", &r.fec_block_frames, f.k)?;
    let (ms, sm) = value("fec_block_ms", &r.fec_block_ms, close_ms)?;
    Fec::block(frames, pct, ms).map(Some).map_err(|m| {
        // Point at the key the message names (or at `fec` when it came from the defaults).
        let at = [
            ("fec_overhead", sp),
            ("fec_block_frames", sf),
            ("fec_block_ms", sm),
        ]
        .into_iter()
        .find(|(n, s)| s.is_some() && m.starts_with(n));
        match at {
            Some((n, Some(s))) => invalid(&s, k(n), m),
            _ => invalid(&r.fec, k("fec"), m),
        }
    })
}

/// What a half's engine-family outgoing link (modes tnapi and zc: frames built by vgate, see
/// [`crate::engine::link`]) needs from the host that runs it: the interface (its index), a
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
