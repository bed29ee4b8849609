//! The PF_RING engines: `pfring` (mode `tnapi`, one ring per RSS queue `dev@q`) and
//! `pfring-zc` (mode `zc`, `zc:dev@q`). Compiled only where vgate was built with PF_RING
//! (`--features pfring` → `cfg(vgate_pfring)`); the binding and every unsafe call live in
//! `pfring-sys`, which loads `libpfring.so` at run time.
//!
//! Owns: the rings (opened at build time, so a mode that cannot run fails before anything
//! else starts), for `pfring` the nftables table that keeps the kernel from also handling
//! captured media ([`super::nft`], as the `afpacket` engine), and the worker loop. Must not
//! touch: route decisions ([`crate::channel::inspect`], through [`super::frames`]) or socket
//! ownership ([`super::ports`]).
//!
//! # Layout
//!
//! Per distinct domain interface, worker *q* of *n* opens `IFACE@q,q+n,…` (`zc:IFACE@q`),
//! opened in PF_RING's order: open → name, direction RX only, socket mode receive only, poll
//! watermark 1 (wake on the first packet; batches come from draining) → BPF filter (UDP to
//! the gateway's address and media ports; where the library cannot, the worker ignores what
//! is not its own) → enable. Worker *q* owns ring *q* of every interface, pinned to its CPU.
//!
//! # Per packet
//!
//! A zero-copy PF_RING packet is valid only until the next receive on its ring, so it cannot
//! wait in a `sendmmsg` batch: the worker copies each packet once into a reused batch arena
//! (what PF_RING's own one-copy receive does) and then runs the same path as `afpacket`:
//! `parse_udp4` → channel by destination → route by port, one lookup per run of packets →
//! [`crate::channel::inspect_mut`] (a stripping route's payload rewritten in its arena slot) →
//! `pfring`: queued on a [`SliceBatch`] for the worker's raw
//! IPv4 socket of the egress domain (no socket per port); `pfring-zc`: a frame built here and
//! sent on the worker's send-only ZC ring of the egress interface, since a ZC driver drops what
//! the kernel hands a NIC a ZC application holds (docs/pfring.md).
//! Ring drops (`pfring_stats`) are read every 100 ms and counted as `rx_overflow`.
//!
//! # Choosing PF_RING, and when it cannot run
//!
//! [`super::choose`] prefers these engines for modes `tnapi` and `zc` whenever they are built
//! in (the design: PF_RING where built with it, AF_PACKET / AF_XDP otherwise). A PF_RING build
//! on a machine without `libpfring.so` or without `pf_ring.ko` therefore fails at start with
//! the reason — the errno-97 sentence names the device and says `modprobe pf_ring` — and with
//! the engine that runs the mode without PF_RING (`--engine afpacket`, `--engine afxdp`). It
//! never falls back silently: the operator who built PF_RING in asked for it.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use pfring_sys::{Direction, Library, Ring, SocketMode};

use super::frames::{account, classify, drop_frame, wire_reason, Run, Targets};
use super::neigh::{NeighResolver, Neighbours};
use super::nft::{DropRule, MediaDropTable};
use super::ports::{Cmd, PortRegistry};
use super::sys::mmsg::{SliceBatch, SliceScope};
use super::worker::{start_workers, Datapath, EgressSockets, Poller, Shell};
use super::{Engine, EngineError, EngineKind, Worker};
use crate::clock::now_ms;
use crate::config::{Config, DomainId, EngineConfig, Mode};
use crate::logging::RateLimit;
use crate::routes::{Channel, PortHooks, Routes};
use crate::stats::{DropReason, Tally};
use crate::wire::{parse_udp4, write_udp4_frame, WireError, UDP4_FRAME_HEADERS};
use std::net::{Ipv4Addr, SocketAddrV4};

/// Ethernet + one VLAN tag + the longest IPv4 header + UDP: what a frame adds to a payload.
const FRAME_OVERHEAD: usize = 14 + 4 + 60 + 8;
/// Batches drained from one ring before looking at the next.
const BATCH_BUDGET: usize = 8;
/// Packets waiting before the ring's descriptor polls readable.
const WATERMARK: u16 = 1;

/// A domain interface and the domains whose media arrive on it.
struct Iface {
    name: String,
    domains: Vec<DomainId>,
    /// RX queues as the driver reports them (1 where it does not say).
    rx_queues: usize,
    /// Mode zc: the interface's MAC and index (the source and egress of the frames vgate
    /// builds).
    mac: [u8; 6],
    ifindex: u32,
}

/// One of the PF_RING engines.
pub struct PfringEngine {
    kind: EngineKind,
    cfg: EngineConfig,
    registry: Arc<PortRegistry>,
    lib: Arc<Library>,
    ifaces: Vec<Iface>,
    /// `rings[q][i]`: ring `q` of `ifaces[i]`; handed to the workers by `start`.
    rings: Vec<Vec<Ring>>,
    /// Mode zc, `tx_rings[q][i]`: the send-only ZC ring of queue `q` of `ifaces[i]`. A ZC
    /// driver drops whatever the kernel hands it while a ZC application holds the NIC
    /// (PF_RING's e1000e: "We don't allow apps to send data when in zc mode"), so egress UDP
    /// sockets cannot reach the wire: the worker builds each frame and sends it here.
    tx_rings: Vec<Vec<Ring>>,
    /// Mode zc: the neighbour table the workers read, once `start` runs its resolver.
    neigh: Option<Arc<super::neigh::NeighTable>>,
    /// Whether every ring took the BPF filter.
    filtered: bool,
    targets: Targets,
    nft: Option<MediaDropTable>,
}

/// The engine that runs `kind`'s mode without PF_RING.
fn alternative(kind: EngineKind) -> &'static str {
    match kind.mode() {
        Mode::Zc => EngineKind::Afxdp.name(),
        _ => EngineKind::Afpacket.name(),
    }
}

fn unavailable(kind: EngineKind, reason: impl ToString) -> EngineError {
    EngineError::Pfring {
        mode: kind.mode(),
        engine: kind.name(),
        reason: reason.to_string(),
        alternative: alternative(kind),
    }
}

/// The PF_RING device worker `w` of `workers` opens on `iface`, which has `rx` RX queues.
/// `pfring`: every queue `w, w + workers, …` as one PF_RING channel list (`iface@0,2`), as
/// the afpacket engine's fanout spreads them, so no queue goes unread when the interface has
/// more queues than workers. `pfring-zc`: the one ZC queue `zc:iface@w` (a ZC ring maps one
/// NIC queue; [`PfringEngine::new`] refuses more queues than workers).
pub fn device(kind: EngineKind, iface: &str, w: usize, workers: usize, rx: usize) -> String {
    match kind {
        EngineKind::PfringZc => format!("zc:{iface}@{w}"),
        _ => {
            let list: Vec<String> = (w..rx.max(w + 1))
                .step_by(workers.max(1))
                .map(|q| q.to_string())
                .collect();
            format!("{iface}@{}", list.join(","))
        }
    }
}

/// Why `workers` workers cannot run `kind` on `iface` with `have` RX queues, if they cannot:
/// fewer queues than workers, or (ZC) more, which no worker would map.
fn queue_mismatch(
    kind: EngineKind,
    iface: &str,
    have: usize,
    workers: usize,
) -> Option<EngineError> {
    if have >= workers && (kind != EngineKind::PfringZc || have == workers) {
        return None;
    }
    let zc = if kind == EngineKind::PfringZc {
        " (one ZC queue per worker: a queue no worker maps would go unread)"
    } else {
        ""
    };
    Some(unavailable(
        kind,
        format!(
            "interface {iface:?} has {have} RX queue(s) but engine.queues is {workers}{zc}; set its queues (ethtool -L {iface} combined {workers}) or engine.queues"
        ),
    ))
}

/// pf_ring.ko's switch that makes it lock every ring it writes (module parameter, 0644).
const FORCE_RING_LOCK: &str = "/sys/module/pf_ring/parameters/force_ring_lock";

/// The channels (RX queues) in a `pfring` device string (`eth1@0,2` → 2); 0 for none.
fn channels(dev: &str) -> usize {
    dev.rsplit_once('@')
        .map_or(0, |(_, list)| list.split(',').count())
}

/// Why the kernel may deliver `iface`'s packets of one RX queue on several CPUs at once, if
/// it may: a software interface (veth, tun…: each sender's CPU delivers what it sends) or a
/// NIC with RPS, which hands one queue's packets to other CPUs. `None` for hardware queues
/// (one interrupt, one CPU) and for the devices pf_ring.ko always locks (loopback, bridge).
fn fed_by_many_cpus(iface: &str) -> Option<&'static str> {
    let dir = std::path::Path::new("/sys/class/net").join(iface);
    let kind = std::fs::read_to_string(dir.join("type")).unwrap_or_default();
    if kind.trim() == "772" || dir.join("bridge").exists() {
        return None;
    }
    if !dir.join("device").exists() {
        return Some(
            "a software interface (veth, tun…): the CPU of each sender delivers what it sends",
        );
    }
    let rps = std::fs::read_dir(dir.join("queues"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|q| {
            std::fs::read_to_string(q.path().join("rps_cpus"))
                .is_ok_and(|m| m.trim().chars().any(|c| c != '0' && c != ','))
        });
    rps.then_some("RPS is set on its queues (rps_cpus): one queue's packets go to several CPUs")
}

/// Why a `pfring` ring `dev` on `iface` would be corrupted, if it would: pf_ring.ko writes a
/// ring bound to a single channel without its lock (one queue, one CPU: a NIC's interrupt),
/// unless `force_ring_lock` is set. Where one queue's packets arrive on several CPUs (`many`,
/// from [`fed_by_many_cpus`]), two CPUs then write the same slot: found in the guest, a
/// stream's packet was overwritten by another's and the slot after it read with a stale
/// packet, so route counts (and destinations) were wrong while the totals matched the wire.
fn unlocked_ring(
    kind: EngineKind,
    dev: &str,
    iface: &str,
    many: Option<&str>,
    force_lock: bool,
) -> Option<EngineError> {
    let why = many?;
    if kind != EngineKind::Pfring || force_lock || channels(dev) != 1 {
        return None;
    }
    Some(unavailable(
        kind,
        format!(
            "ring {dev} would be written by several CPUs without a lock: {iface} is {why}, and pf_ring.ko locks a ring of one channel only with force_ring_lock=1; load it so (modprobe pf_ring force_ring_lock=1, or echo 1 > {FORCE_RING_LOCK})"
        ),
    ))
}

/// tcpdump syntax for "UDP to one of `targets` of `domains`".
fn bpf_expr(targets: &Targets, domains: &[DomainId]) -> String {
    let parts: Vec<String> = domains
        .iter()
        .map(|d| {
            let (addr, r) = targets[d.index()];
            format!("(dst host {addr} and dst portrange {}-{})", r.first, r.last)
        })
        .collect();
    format!("udp and ({})", parts.join(" or "))
}

/// Whether a PF_RING call failed only because the device or module does not do it.
fn not_supported(e: &pfring_sys::Error) -> bool {
    matches!(e, pfring_sys::Error::Call { code, .. } if *code == pfring_sys::ffi::PF_RING_ERROR_NOT_SUPPORTED)
}

impl PfringEngine {
    /// Loads libpfring, opens and enables the rings (and for `pfring` installs the media
    /// drop table); fails with the reason when the mode cannot run here.
    pub fn new(cfg: &Config, kind: EngineKind) -> Result<PfringEngine, EngineError> {
        let lib = Library::load().map_err(|e| unavailable(kind, e))?;
        let queues = cfg.engine.queues;
        let mut ifaces: Vec<Iface> = Vec::new();
        for d in &cfg.domains {
            match ifaces.iter_mut().find(|i| i.name == d.interface) {
                Some(i) => i.domains.push(d.id),
                None => ifaces.push(Iface {
                    name: d.interface.clone(),
                    domains: vec![d.id],
                    rx_queues: 1,
                    mac: [0; 6],
                    ifindex: 0,
                }),
            }
        }
        let targets: Targets = [
            (cfg.domains[0].address, cfg.domains[0].media_ports),
            (cfg.domains[1].address, cfg.domains[1].media_ports),
        ];
        let caplen = u32::try_from(cfg.engine.max_payload + FRAME_OVERHEAD).unwrap_or(u32::MAX);
        let flags = pfring_sys::flags::DO_NOT_TIMESTAMP;
        let mut rings: Vec<Vec<Ring>> = (0..queues).map(|_| Vec::new()).collect();
        let mut tx_rings: Vec<Vec<Ring>> = (0..queues).map(|_| Vec::new()).collect();
        let mut filtered = true;
        for iface in &mut ifaces {
            let have = super::afpacket::PacketRing::rx_queues(&iface.name)
                .map_err(|e| unavailable(kind, e))?
                .unwrap_or(1) as usize;
            iface.rx_queues = have;
            let filter = bpf_expr(&targets, &iface.domains);
            for (q, per_queue) in rings.iter_mut().enumerate() {
                let dev = device(kind, &iface.name, q, queues, have);
                let mut ring =
                    Ring::open(&lib, &dev, caplen, flags).map_err(|e| unavailable(kind, e))?;
                // After the first open: a missing module or library is the first thing to say.
                if q == 0 {
                    if let Some(e) = queue_mismatch(kind, &iface.name, have, queues) {
                        return Err(e);
                    }
                }
                let force = std::fs::read_to_string(FORCE_RING_LOCK).is_ok_and(|v| v.trim() != "0");
                if let Some(e) = unlocked_ring(
                    kind,
                    &dev,
                    &iface.name,
                    fed_by_many_cpus(&iface.name),
                    force,
                ) {
                    return Err(e);
                }
                let _ = ring.set_application_name("vgate");
                let setup = (|| {
                    match ring.set_direction(Direction::RxOnly) {
                        Err(e) if !not_supported(&e) => return Err(e),
                        _ => {}
                    }
                    ring.set_socket_mode(SocketMode::RecvOnly)?;
                    match ring.set_poll_watermark(WATERMARK) {
                        Err(e) if !not_supported(&e) => return Err(e),
                        _ => {}
                    }
                    Ok(())
                })();
                setup.map_err(|e| unavailable(kind, e))?;
                if let Err(e) = ring.set_bpf_filter(&filter) {
                    if filtered {
                        tracing::info!(
                            "{dev}: no BPF filter ({e}); the worker skips what is not media for the gateway"
                        );
                    }
                    filtered = false;
                }
                ring.enable().map_err(|e| unavailable(kind, e))?;
                per_queue.push(ring);
            }
            if kind == EngineKind::PfringZc {
                let c = std::ffi::CString::new(iface.name.as_str())
                    .map_err(|_| unavailable(kind, "interface name with a NUL byte"))?;
                let no_iface = |e: io::Error| unavailable(kind, format!("{}: {e}", iface.name));
                iface.ifindex = super::sys::afxdp::if_nametoindex(&c).map_err(no_iface)?;
                iface.mac = super::sys::afxdp::hw_addr(&c).map_err(no_iface)?;
                for (q, per_queue) in tx_rings.iter_mut().enumerate() {
                    let dev = device(kind, &iface.name, q, queues, have);
                    let mut ring =
                        Ring::open(&lib, &dev, caplen, flags).map_err(|e| unavailable(kind, e))?;
                    let _ = ring.set_application_name("vgate-tx");
                    ring.set_socket_mode(SocketMode::SendOnly)
                        .and_then(|()| ring.enable())
                        .map_err(|e| unavailable(kind, e))?;
                    per_queue.push(ring);
                }
            }
        }
        // Standard PF_RING rings receive a copy: the kernel still handles the datagram. A ZC
        // queue belongs to vgate alone; the kernel never sees its packets.
        let nft = if kind == EngineKind::Pfring {
            let rules: Vec<DropRule> = cfg
                .domains
                .iter()
                .map(|d| DropRule {
                    iface: d.interface.clone(),
                    addr: Some(d.address),
                    ports: d.media_ports.first..=d.media_ports.last,
                })
                .collect();
            Some(
                MediaDropTable::install(&super::tnapi::instance_name(cfg), &rules)
                    .map_err(|e| unavailable(kind, e))?,
            )
        } else {
            None
        };
        Ok(PfringEngine {
            kind,
            cfg: cfg.engine.clone(),
            // No socket per gateway port, as the other ring engines: a raw IPv4 socket per
            // worker and domain sends (found in the guest: per-port sockets kept
            // engine.reserve_ports from applying and the ports visible to the kernel).
            registry: Arc::new(super::ring_registry(cfg, false)?),
            lib,
            ifaces,
            rings,
            tx_rings,
            neigh: None,
            filtered,
            targets,
            nft,
        })
    }
}

impl Engine for PfringEngine {
    fn kind(&self) -> EngineKind {
        self.kind
    }

    fn describe(&self) -> String {
        let q = self.cfg.queues;
        let workers: Vec<String> = (0..q)
            .map(|w| {
                let devs: Vec<String> = self
                    .ifaces
                    .iter()
                    .map(|i| device(self.kind, &i.name, w, q, i.rx_queues))
                    .collect();
                let cpu = self
                    .cfg
                    .cpus
                    .get(w)
                    .map_or("unpinned".into(), |c| format!("CPU {c}"));
                format!("w{w} rings {} on {cpu}", devs.join(" "))
            })
            .collect();
        let ifaces: Vec<String> = self
            .ifaces
            .iter()
            .map(|i| {
                let doms: Vec<&str> = i.domains.iter().map(|d| d.name()).collect();
                format!("{} (domain {})", i.name, doms.join("+"))
            })
            .collect();
        format!(
            "mode {}, engine {} ({} loaded at run time; one ring per RX queue, watermark {WATERMARK}, {}; {}); interfaces: {}; {} queue(s), workers: {}{}",
            self.kind.mode(),
            self.kind.name(),
            self.lib.name(),
            if self.filtered { "BPF filter on the rings" } else { "no ring filter" },
            if self.kind == EngineKind::PfringZc {
                "egress: frames built in vgate on each worker's ZC TX ring of the egress interface, next hop from the neighbour table (a ZC NIC sends nothing the kernel hands it)".to_owned()
            } else {
                format!("egress raw IPv4 socket per worker and domain (no socket per port), sendmmsg batch {}", self.cfg.batch)
            },
            ifaces.join(", "),
            q,
            workers.join(", "),
            self.nft.as_ref().map_or(String::new(), |t| format!("; nft table inet {} drops captured media at input", t.table_name())),
        )
    }

    fn port_hooks(&self) -> Arc<dyn PortHooks> {
        Arc::clone(&self.registry) as Arc<dyn PortHooks>
    }

    fn neigh_table(&self) -> Option<Arc<super::neigh::NeighTable>> {
        self.neigh.clone()
    }

    fn ports(&self) -> Arc<PortRegistry> {
        Arc::clone(&self.registry)
    }

    fn start(
        &mut self,
        routes: Arc<Routes>,
        stop: Arc<AtomicBool>,
    ) -> Result<Vec<Worker>, EngineError> {
        let n = self.cfg.queues;
        let per_queue = std::mem::take(&mut self.rings);
        if per_queue.len() != n {
            return Err(EngineError::Io {
                what: format!("starting the {} workers", self.kind.name()),
                source: io::Error::other("the rings were already handed to workers"),
            });
        }
        let slot = self.cfg.max_payload + FRAME_OVERHEAD;
        let (targets, batch, max_payload) =
            (self.targets, self.cfg.batch.max(1), self.cfg.max_payload);
        let mut per_queue = per_queue.into_iter();
        let mut tx_per_queue = std::mem::take(&mut self.tx_rings).into_iter();
        let resolver = if self.kind == EngineKind::PfringZc {
            let r = NeighResolver::start(Arc::clone(&stop)).map_err(|source| EngineError::Io {
                what: "starting the neighbour resolver thread".into(),
                source,
            })?;
            self.neigh = Some(Arc::clone(r.table()));
            Some(r)
        } else {
            None
        };
        // Which interface of the worker's list sends each domain's traffic.
        let mut by_domain = [0usize; 2];
        for (i, iface) in self.ifaces.iter().enumerate() {
            for d in &iface.domains {
                by_domain[d.index()] = i;
            }
        }
        // Each worker's raw sockets (ports without sockets), opened here so a refusal stops
        // the start.
        let mut raws = (0..n)
            .map(|_| self.registry.raw_senders())
            .collect::<io::Result<Vec<_>>>()
            .map_err(EngineError::Isolation)?
            .into_iter();
        start_workers(n, &self.cfg.cpus, &self.registry, &routes, &stop, |_| {
            let raw = raws.next().unwrap_or_default();
            let zc = resolver.as_ref().map(|r| ZcTx {
                out: tx_per_queue
                    .next()
                    .unwrap_or_default()
                    .into_iter()
                    .zip(&self.ifaces)
                    .map(|(ring, iface)| ZcOut {
                        ring,
                        mac: iface.mac,
                        ifindex: iface.ifindex,
                        unflushed: false,
                    })
                    .collect(),
                by_domain,
                neigh: r.handle(),
                frame: vec![0u8; slot],
                ident: 0,
                last: None,
                last_lookup: 0,
            });
            let rings: Vec<WorkerRing> = per_queue
                .next()
                .unwrap_or_default()
                .into_iter()
                .zip(&self.ifaces)
                .map(|(ring, iface)| WorkerRing {
                    ring,
                    domains: iface.domains.clone(),
                    fallback: Channel::from_ingress(iface.domains[0]),
                    drops_seen: 0,
                })
                .collect();
            move |shell: &Shell| {
                Ok(PfringPath {
                    ctx: WorkerCtx {
                        index: shell.index,
                        routes: Arc::clone(&shell.routes),
                        targets,
                        batch,
                        max_payload,
                    },
                    rings,
                    zc,
                    local: EgressSockets::with_raw(raw),
                    tx: SliceBatch::new(batch),
                    arena: Arena {
                        bytes: vec![0u8; batch * slot],
                        meta: Vec::with_capacity(batch),
                        slot,
                    },
                    idle_ms: 100,
                })
            }
        })
    }
}

impl Drop for PfringEngine {
    fn drop(&mut self) {
        if let Some(t) = self.nft.take() {
            let name = t.table_name().to_owned();
            if let Err(e) = t.remove() {
                tracing::error!("could not remove nft table inet {name}: {e}; remove it with `nft delete table inet {name}`");
            }
        }
    }
}

struct WorkerRing {
    ring: Ring,
    domains: Vec<DomainId>,
    /// The channel that counts what cannot be classified (malformed frames, ring drops).
    fallback: Channel,
    /// `pfring_stats` drops already counted (the library's counter is cumulative).
    drops_seen: u64,
}

/// What a worker's forwarding needs besides its rings.
struct WorkerCtx {
    index: usize,
    routes: Arc<Routes>,
    targets: Targets,
    batch: usize,
    max_payload: usize,
}

/// Packets copied out of a ring, waiting to be forwarded together.
struct Arena {
    bytes: Vec<u8>,
    /// Per packet: bytes in its slot, whether the capture was cut, and whether the kernel
    /// marked its checksums verified (or left for the device to fill in).
    meta: Vec<(usize, bool, bool)>,
    slot: usize,
}

static RECV_ERRORS: RateLimit = RateLimit::new(5000);

/// One PF_RING worker: ring *q* of every interface, the egress sockets, the copy arena.
struct PfringPath {
    ctx: WorkerCtx,
    rings: Vec<WorkerRing>,
    /// Mode zc: the TX rings the worker sends its frames on.
    zc: Option<ZcTx>,
    local: EgressSockets,
    tx: SliceBatch,
    arena: Arena,
    /// The longest idle sleep: 1 ms when a ring has no descriptor to wait on.
    idle_ms: u16,
}

impl Datapath for PfringPath {
    fn register(&mut self, poller: &Poller) -> io::Result<()> {
        for (i, r) in self.rings.iter_mut().enumerate() {
            match r.ring.selectable_fd() {
                Some(fd) => poller.add(fd, i as u64)?,
                // A ring without a descriptor (some ZC devices) is looked at every
                // millisecond when idle.
                None => self.idle_ms = 1,
            }
        }
        Ok(())
    }

    fn poll(&mut self, shell: &Shell) -> bool {
        let PfringPath {
            ctx,
            rings,
            zc,
            local,
            tx,
            arena,
            ..
        } = self;
        let mut busy = false;
        for r in rings.iter_mut() {
            for _ in 0..BATCH_BUDGET {
                if fill(ctx, &mut r.ring, arena) == 0 {
                    break;
                }
                busy = true;
                let mut chan = [Tally::default(); 2];
                let media = &mut *shell.media.borrow_mut();
                forward(
                    ctx,
                    r,
                    arena,
                    local,
                    tx,
                    zc.as_mut(),
                    now_ms(),
                    &mut chan,
                    media,
                );
                for c in Channel::ALL {
                    if !chan[c.index()].is_empty() {
                        shell.stats.channel(c).add(&chan[c.index()]);
                    }
                }
            }
        }
        busy
    }

    fn command(&mut self, _shell: &Shell, _poller: &Poller, cmd: Cmd) {
        self.local.apply(cmd);
    }

    fn sample(&mut self, shell: &Shell) {
        ring_stats(shell, &mut self.rings);
    }

    fn idle_ms(&self) -> u16 {
        self.idle_ms
    }
}

/// Copies up to a batch of waiting packets out of `ring` into the arena; how many.
fn fill(ctx: &WorkerCtx, ring: &mut Ring, arena: &mut Arena) -> usize {
    arena.meta.clear();
    while arena.meta.len() < ctx.batch {
        match ring.recv(false) {
            Ok(Some(p)) => {
                let i = arena.meta.len();
                let n = p.data.len().min(arena.slot);
                let at = i * arena.slot;
                arena.bytes[at..at + n].copy_from_slice(&p.data[..n]);
                arena
                    .meta
                    .push((n, p.truncated() || p.data.len() > n, p.checksum_ok));
            }
            Ok(None) => break,
            Err(e) => {
                if let Some(suppressed) = RECV_ERRORS.check(now_ms()) {
                    tracing::warn!(worker = ctx.index, suppressed, "{e}");
                }
                break;
            }
        }
    }
    arena.meta.len()
}

/// Forwards the packets of the arena; adds per-channel figures to `chan`.
#[allow(clippy::too_many_arguments)]
fn forward(
    ctx: &WorkerCtx,
    r: &WorkerRing,
    arena: &mut Arena,
    local: &EgressSockets,
    tx: &mut SliceBatch,
    mut zc: Option<&mut ZcTx>,
    now: u64,
    chan: &mut [Tally; 2],
    media: &mut crate::channel::Validators,
) {
    let mut scope: SliceScope<'_, '_> = tx.scope();
    let mut run: Option<Run<'_>> = None;
    // Each packet's slot, writable: a stripping route has its payload rewritten there.
    let slots = arena.bytes.chunks_mut(arena.slot);
    for (slot, &(len, truncated, checksum_ok)) in slots.zip(arena.meta.iter()) {
        let data = &mut slot[..len];
        let d = match parse_udp4(data) {
            Ok(d) => d,
            // Not media (ARP, TCP signaling, IPv6…): the kernel's, when the ring has no filter.
            Err(WireError::NotIpv4 | WireError::NotUdp) => continue,
            Err(e) => {
                drop_frame(chan, r.fallback, data.len(), wire_reason(e));
                continue;
            }
        };
        let Some(channel) = classify(&ctx.targets, &r.domains, d.dst_addr, d.dst_port) else {
            // UDP not to a media port of the gateway (e.g. SIP): not ours.
            continue;
        };
        if !Run::continues(&run, channel, d.dst_port) {
            if let Some(r) = run.take() {
                finish_run(r, &mut scope, now, chan);
            }
            run = Some(Run::start(&ctx.routes, local, channel, d.dst_port, now));
        }
        let Some(run) = run.as_mut() else { continue };
        // The UDP checksum is verified unless the kernel says it was (PKT_FLAGS_CHECKSUM_OK):
        // a local sender on a veth leaves it partial, to be filled in by a device.
        let ok = d.checksums_ok(checksum_ok);
        let src = SocketAddrV4::new(d.src_addr, d.src_port);
        let (at, n) = (d.payload_at, d.payload.len());
        let payload = &mut data[at..at + n];
        let Some((dest, fd, len)) = run.admit(src, payload, ok, truncated, ctx.max_payload, media)
        else {
            continue;
        };
        let payload: &[u8] = &payload[..len];
        if let (Some(z), Some(route)) = (zc.as_deref_mut(), run.route.as_deref()) {
            z.send(
                ctx,
                channel,
                route.egress_port,
                dest,
                payload,
                now,
                &mut run.tally,
            );
            continue;
        }
        if scope.is_full() {
            let out = fd.send(&mut scope, dest);
            account(&mut run.tally, &out, run.route.as_deref());
        }
        scope.push(payload);
    }
    if let Some(r) = run.take() {
        finish_run(r, &mut scope, now, chan);
    }
    if let Some(z) = zc {
        z.flush();
    }
}

/// One interface's ZC TX ring in a worker.
struct ZcOut {
    ring: Ring,
    mac: [u8; 6],
    ifindex: u32,
    /// Frames queued since the last flush.
    unflushed: bool,
}

/// Mode zc's way out: frames built here, sent on the egress interface's ZC TX ring.
struct ZcTx {
    /// By the worker's interface order ([`PfringEngine::ifaces`]).
    out: Vec<ZcOut>,
    /// The index in `out` of each domain's interface.
    by_domain: [usize; 2],
    neigh: Neighbours,
    /// The frame being built (one slot; its payload is copied in, once).
    frame: Vec<u8>,
    ident: u16,
    /// The last next hop found: destination, interface index, MAC.
    last: Option<(Ipv4Addr, u32, [u8; 6])>,
    /// When the worker last asked the kernel itself (see [`ZcTx::next_hop`]).
    last_lookup: u64,
}

/// How often a worker asks the kernel's tables itself for a next hop its resolver does not
/// know yet.
const NEIGH_LOOKUP_MS: u64 = 100;

static TX_ERRORS: RateLimit = RateLimit::new(5000);

impl ZcTx {
    /// The next hop's MAC of `dst` out of `ifindex`: the last one, the resolver's table, or —
    /// there is no kernel path to fall back on, a ZC NIC sends nothing the kernel hands it —
    /// at most every [`NEIGH_LOOKUP_MS`] the kernel's route and neighbour tables (one netlink
    /// exchange; only for a destination the resolver has not filled in yet, as for a route's
    /// first packets). A ZC NIC's kernel side receives no ARP reply either: the neighbours
    /// of a ZC interface must be static (`ip neigh replace ... nud permanent`).
    fn next_hop(&mut self, dst: Ipv4Addr, ifindex: u32, now: u64) -> Option<[u8; 6]> {
        if let Some((d, i, mac)) = self.last {
            if d == dst && i == ifindex {
                return Some(mac);
            }
        }
        let mac = self.neigh.get(dst, ifindex, now).or_else(|| {
            if now < self.last_lookup + NEIGH_LOOKUP_MS && self.last_lookup != 0 {
                return None;
            }
            self.last_lookup = now.max(1);
            super::neigh::resolve_next_hop(dst, ifindex)
        })?;
        self.last = Some((dst, ifindex, mac));
        Some(mac)
    }

    /// Builds Ethernet/IPv4/UDP around `payload` (from the gateway's address in the egress
    /// domain and the route's egress port, to `dest`) and queues it on the egress ring.
    #[allow(clippy::too_many_arguments)]
    fn send(
        &mut self,
        ctx: &WorkerCtx,
        channel: Channel,
        egress_port: u16,
        dest: SocketAddrV4,
        payload: &[u8],
        now: u64,
        t: &mut Tally,
    ) {
        let eg = channel.egress();
        let o = self.by_domain[eg.index()];
        let ifindex = self.out[o].ifindex;
        let total = UDP4_FRAME_HEADERS + payload.len();
        if total > self.frame.len() {
            t.drop(DropReason::Oversize);
            return;
        }
        let Some(mac) = self.next_hop(*dest.ip(), ifindex, now) else {
            t.drop(DropReason::SendError);
            if let Some(suppressed) = TX_ERRORS.check(now) {
                tracing::warn!(worker = ctx.index, dest = %dest, suppressed,
                    "no neighbour entry for the next hop of {dest}: a ZC interface hears no ARP reply; add a static one (ip neigh replace ... nud permanent)");
            }
            return;
        };
        let src = SocketAddrV4::new(ctx.targets[eg.index()].0, egress_port);
        let out = &mut self.out[o];
        let f = &mut self.frame[..total];
        f[UDP4_FRAME_HEADERS..].copy_from_slice(payload);
        self.ident = self.ident.wrapping_add(1);
        write_udp4_frame(f, mac, out.mac, src, dest, self.ident);
        match out.ring.send(f, false) {
            Ok(true) => {
                out.unflushed = true;
                t.tx_packets += 1;
                t.tx_bytes += payload.len() as u64;
            }
            Ok(false) => t.drop(DropReason::QueueFull),
            Err(e) => {
                t.drop(DropReason::SendError);
                if let Some(suppressed) = TX_ERRORS.check(now) {
                    tracing::warn!(worker = ctx.index, suppressed, "{e}");
                }
            }
        }
    }

    /// Rings the doorbell of every ring that queued frames.
    fn flush(&mut self) {
        for o in self.out.iter_mut().filter(|o| o.unflushed) {
            o.unflushed = false;
            if let Err(e) = o.ring.flush_tx() {
                if let Some(suppressed) = TX_ERRORS.check(now_ms()) {
                    tracing::warn!(suppressed, "{e}");
                }
            }
        }
    }
}

/// Sends what a run queued, then closes the run (its figures to its route and channel).
fn finish_run(mut r: Run<'_>, scope: &mut SliceScope<'_, '_>, now: u64, chan: &mut [Tally; 2]) {
    if let (Some(dest), Some(fd)) = (r.route.as_ref().map(|r| r.dest), r.egress) {
        let out = fd.send(scope, dest);
        account(&mut r.tally, &out, r.route.as_deref());
    }
    scope.clear();
    r.close(now, chan);
}

/// Reads the rings' drop counters into the worker's figures.
fn ring_stats(shell: &Shell, rings: &mut [WorkerRing]) {
    for r in rings.iter_mut() {
        match r.ring.stats() {
            Ok(s) => {
                let new = s.drop.saturating_sub(r.drops_seen);
                r.drops_seen = s.drop;
                if new > 0 {
                    shell.stats.ring_drops.fetch_add(new, Relaxed);
                    shell
                        .stats
                        .channel(r.fallback)
                        .drop(DropReason::RxOverflow, new);
                }
            }
            Err(e) if not_supported(&e) => {}
            Err(e) => {
                if let Some(suppressed) = RECV_ERRORS.check(now_ms()) {
                    tracing::warn!(worker = shell.index, suppressed, "{e}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PortRange;
    use std::net::Ipv4Addr;

    #[test]
    fn devices_filters_and_alternatives() {
        assert_eq!(device(EngineKind::Pfring, "eth1", 3, 4, 4), "eth1@3");
        // Two workers on a 4-queue veth: each reads every other queue (found in the guest:
        // `eth1@0` and `eth1@1` alone left queues 2 and 3 unread).
        assert_eq!(device(EngineKind::Pfring, "eth1", 0, 2, 4), "eth1@0,2");
        assert_eq!(device(EngineKind::Pfring, "eth1", 1, 2, 4), "eth1@1,3");
        assert_eq!(device(EngineKind::Pfring, "lo", 0, 1, 1), "lo@0");
        assert_eq!(device(EngineKind::PfringZc, "eth1", 0, 1, 1), "zc:eth1@0");
        assert!(queue_mismatch(EngineKind::Pfring, "v", 4, 2).is_none());
        let e = queue_mismatch(EngineKind::Pfring, "v", 1, 2)
            .unwrap()
            .to_string();
        assert!(
            e.contains("has 1 RX queue(s) but engine.queues is 2"),
            "{e}"
        );
        // ZC maps one queue per worker: more queues than workers would leave some unread.
        assert!(queue_mismatch(EngineKind::PfringZc, "v", 4, 1).is_some());
        assert!(queue_mismatch(EngineKind::PfringZc, "v", 1, 1).is_none());
        // One channel of a veth is written by several CPUs: refused unless pf_ring.ko locks.
        let veth = Some("a software interface");
        let e = unlocked_ring(EngineKind::Pfring, "v@0", "v", veth, false)
            .unwrap()
            .to_string();
        assert!(e.contains("force_ring_lock=1") && e.contains("v@0"), "{e}");
        assert!(unlocked_ring(EngineKind::Pfring, "v@0", "v", veth, true).is_none());
        // Two channels per ring, a hardware queue, a ZC ring: pf_ring.ko locks or needs not.
        assert!(unlocked_ring(EngineKind::Pfring, "v@0,2", "v", veth, false).is_none());
        assert!(unlocked_ring(EngineKind::Pfring, "eth1@0", "eth1", None, false).is_none());
        assert!(unlocked_ring(EngineKind::PfringZc, "zc:v@0", "v", veth, false).is_none());
        assert_eq!(channels("v@1,3"), 2);
        assert_eq!(channels("zc:v@0"), 1);
        assert!(fed_by_many_cpus("lo").is_none());
        assert_eq!(alternative(EngineKind::Pfring), "afpacket");
        assert_eq!(alternative(EngineKind::PfringZc), "afxdp");
        let t: Targets = [
            (
                Ipv4Addr::new(10, 0, 1, 1),
                PortRange {
                    first: 20000,
                    last: 20999,
                },
            ),
            (
                Ipv4Addr::new(10, 0, 2, 1),
                PortRange {
                    first: 30000,
                    last: 30999,
                },
            ),
        ];
        assert_eq!(
            bpf_expr(&t, &[DomainId::A]),
            "udp and ((dst host 10.0.1.1 and dst portrange 20000-20999))"
        );
        assert!(bpf_expr(&t, &[DomainId::A, DomainId::B]).contains(" or (dst host 10.0.2.1"));
    }
}
