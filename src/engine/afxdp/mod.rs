//! The `afxdp` engine: mode `zc` without PF_RING. One AF_XDP socket per RX queue of each
//! domain interface, fed by an XDP program that redirects only routed media; one pinned
//! worker per `engine.queues` index. With the in-kernel fast path of [`super::xdp`] (its
//! section of the program, its maps and hooks) the same engine is mode `xdp`.
//!
//! Owns: the XDP program (`vgate_xdp`), its maps (`vgate_ports`, `vgate_xsks`, `vgate_noroute`), its attachment to each domain interface,
//! the AF_XDP sockets (opened at build time, so a mode that cannot run fails before anything
//! else starts) and the worker loop. Must not touch: route decisions (that is
//! [`crate::channel::inspect`]) or gateway-port sockets (that is [`super::ports`]).
//!
//! # The XDP program
//!
//! Hand-assembled eBPF (no clang in the build): Ethernet (+ one 802.1Q tag) → IPv4 (IHL,
//! no fragments) → UDP, each header bounds-checked against `data_end` before it is read; the
//! destination address must be the gateway's address of a domain the interface faces and the
//! destination port inside that domain's media range. The whole range is the program's,
//! routed or not: the gateway holds no socket on its ports ([`super::ports`]), so no
//! datagram for the range may reach the kernel's UDP layer (it would answer with ICMP port
//! unreachable, or hand it to another program's socket). `vgate_ports` (a 65 536-entry ARRAY
//! of u32, bit *d* set when domain *d* has a route on that port) decides: a routed port goes
//! (after mode xdp's fast path, which may take it) to
//! `bpf_redirect_map(vgate_xsks, ctx->rx_queue_index, XDP_PASS)`: the queue's socket, or the
//! kernel when the queue has none. A port without a route is dropped in the program
//! (`XDP_DROP`) and counted in `vgate_noroute` (a per-CPU ARRAY by ingress domain: packets,
//! payload bytes), so a flood to unrouted ports never shares the workers' rings with routed
//! media; worker 0 adds the counts to the channel's `rx` and `no_route` at each sample
//! ([`super::worker::SAMPLE_MS`]) and at exit. The map entry of a route is written in
//! [`PortHooks::route_added`], inside the call that installs the route, before anyone is
//! told of it: its first packets are not dropped. Everything
//! else — ARP, signaling, management, fragments — goes to the kernel (`XDP_PASS`). Fragments
//! for the media ranges are reassembled there and dropped by the nft table of
//! [`super::nft`] (installed when ports hold no socket, as tnapi does; best effort).
//!
//! `vgate_ports` is kept in step with the stream tables by [`PortHooks::route_added`] /
//! [`PortHooks::route_removed`]: a route change takes effect at the next packet, without
//! touching the workers.
//!
//! The program is attached in driver (native) mode through a BPF link, so the kernel detaches
//! it when vgate exits, even after a crash. A program named `vgate_xdp` found on the
//! interface at start (left by an older run attached through netlink) is detached first with
//! `XDP_FLAGS_REPLACE`; any other program is an error, never replaced.
//!
//! # Sockets
//!
//! Per (interface, RX queue): a socket with its own UMEM ([`FRAMES`] × [`FRAME_SIZE`]),
//! bound zero-copy when the driver supports it (ixgbe, i40e, ice, mlx5) and in copy mode
//! otherwise (veth) — said once per interface in the log and in [`Engine::describe`]. RX
//! queue *q* goes to worker *q mod queues*.
//!
//! # Per packet
//!
//! As in the `afpacket` engine: `parse_udp4` → IPv4 header checksum (the UDP checksum is not
//! checked: a local sender's offloaded checksum is not filled in yet, and AF_XDP carries no
//! checksum status) → channel by destination → route by destination port →
//! [`crate::channel::inspect_mut`] (a stripping route's payload rewritten in its UMEM frame) →
//! egress. One [`Tally`] per route run and per RX batch per channel.
//!
//! # Egress
//!
//! - `xdp` (default): the payload is copied into a TX frame of the worker's socket on the
//!   egress interface behind Ethernet/IPv4/UDP headers built here (source: the gateway's
//!   address and the route's egress port; next hop's MAC from the kernel's route and
//!   neighbour tables, read by the engine's resolver thread ([`super::neigh`]) and looked up
//!   by the worker without a system call; IPv4 checksum; the UDP checksum left to the
//!   kernel through AF_XDP TX metadata — `XDP_TXMD_FLAGS_CHECKSUM`, which copy mode turns
//!   into a `CHECKSUM_PARTIAL` skb the egress device or the kernel completes — where the
//!   kernel grants it and is known to honour it (copy-mode sockets; Linux ≥ 6.18, or veth
//!   on 6.11–6.17: before 6.18 drivers with `IFF_TX_SKB_NO_LINEAR` such as virtio_net
//!   drop the metadata, see [`csum_offload_verdict`]), else computed here; said once per
//!   interface, with the reason, in the log and in [`Engine::describe`];
//!   `VGATE_AFXDP_TX_CSUM=software` forces the software sum). The kernel is asked to send
//!   (copy mode sends only from the caller's context) once per wake-up, when the worker
//!   has nothing else to do, or after [`TX_KICK_AT`] frames; by default the worker sleeps
//!   in `poll(2)`, which does that kick itself for up to 32 frames per socket (one system
//!   call per wake-up; with more waiting, or after a kick the device stopped, the idle
//!   worker kicks first; `VGATE_AFXDP_WAIT=epoll` for epoll_wait and a `sendto`). A frame
//!   the device drops after the kick (`EBUSY`) is taken off the channel's `tx_packets` and
//!   counted `send_error`; a TX ring that keeps frames with none taken between two 100 ms
//!   samples is logged (rate-limited) and counted in the worker's `ring_freezes`. A
//!   destination whose neighbour is not resolved yet goes through the worker's raw socket
//!   of the egress domain ([`super::ports::RawUdp`], which makes the kernel resolve it); the
//!   engine holds no socket per gateway port ([`super::ports::PortHold::Reserved`]). Only for interfaces that face one domain; packets
//!   sent this way bypass the gateway's own netfilter output hooks.
//! - `sockets` (`VGATE_AFXDP_TX=sockets`): the gateway-port UDP sockets of [`PortRegistry`]
//!   (held for this variant only),
//!   `sendmmsg` with payloads borrowed straight from the UMEM (no copy in user space).
//!
//! Measured on the 3-namespace veth bed (copy mode, 2 workers on 2 cores shared with the
//! iperf2 sender, 172-byte payloads, one route, release build): at ~46 kpps both deliver
//! everything, the workers spending ~9.5 µs of CPU per packet with `sockets` and ~7 µs with
//! `xdp`; at ~122 kpps offered, `sockets` forwarded 70 % (the rest lost to full RX rings,
//! 4.6 µs/packet) and `xdp` 97.6 % (2.5 µs/packet). Hence `xdp` by default.

use std::ffi::CString;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use super::ebpf::*;
use super::frames::{account, classify, drop_frame, wire_reason, Run, Targets};
use super::neigh::{NeighResolver, Neighbours};
use super::nft::{DropRule, MediaDropTable};
use super::ports::{Cmd, PortRegistry, TxVia};
use super::sys::afxdp::{self as xsys, BindMode, RxFrame, TxCsum, Xsk, XskParams};
use super::sys::bpf::{self, Insn, Map, Prog, XdpLink};
use super::sys::mmsg::{SliceBatch, SliceScope};
use super::worker::{start_workers, Datapath, EgressSockets, Poller, Shell};
use super::xdp::{egress_of, emit_fast, Egress, FastFds, FastPath};
use super::{Engine, EngineError, EngineKind, Worker};
use crate::clock::now_ms;
use crate::config::split::SplitConfig;
use crate::config::{Config, DomainId, EngineConfig};
use crate::engine::link::SplitStats;
use crate::engine::link::{HalfLinks, LinkFamily, LinkTx};
use crate::logging::RateLimit;
use crate::routes::{Channel, PortHooks, Routes, StreamRoute};
use crate::stats::{DropReason, Tally};
use crate::wire::{
    parse_udp4, write_udp4_frame, FrameEnds, UdpChecksum, UDP4_CSUM_START, UDP4_FRAME_HEADERS,
    UDP_CSUM_OFFSET,
};

mod hooks;
mod knobs;
mod program;
mod worker;
use hooks::*;
pub use knobs::*;
use program::*;
use worker::*;

/// The name of our XDP program: how a stale one of ours is recognised.
pub const PROG_NAME: &str = "vgate_xdp";
/// UMEM chunk size.
pub const FRAME_SIZE: u32 = 2048;
/// UMEM chunks per socket: half for RX (the fill ring), half for TX.
pub const FRAMES: u32 = 4096;
/// Entries of each ring.
pub const RING: u32 = 2048;
/// Frames taken from one socket before looking at the next.
pub const RX_BATCH: usize = 64;
/// A worker asks the kernel to send (the `sendto` kick) after this many TX frames even while
/// more RX keeps coming; otherwise once per wake-up, when its rings are empty.
pub const TX_KICK_AT: u32 = 32;
/// Whether an idle worker sleeps in `poll(2)` (which sends what waits on its copy-mode
/// sockets' TX rings: one system call per wake-up instead of a `sendto` and an
/// `epoll_wait`) rather than `epoll_wait`; `VGATE_AFXDP_WAIT=poll|epoll` overrides it.
pub const WAIT_IN_POLL: bool = true;
/// Frames the kernel sends per `poll(2)` of a copy-mode socket (its `max_tx_budget`): with
/// more waiting, an idle worker that sleeps in `poll(2)` kicks first.
const POLL_TX_BUDGET: u32 = 32;
/// Microseconds a worker keeps polling its rings after work before it sleeps (see
/// [`super::worker::Datapath::spin_us`]); `VGATE_AFXDP_SPIN_US` overrides it.
pub const SPIN_US: u32 = 0;

/// Why the engine cannot run. Each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum AfxdpError {
    #[error("no interface named {ifname:?} in this network namespace")]
    NoInterface { ifname: String },
    #[error("interface {ifname:?} has {have} RX queue(s) but engine.queues is {want}; give it more queues (ethtool -L {ifname} combined {want}) or lower engine.queues")]
    Queues {
        ifname: String,
        have: u32,
        want: usize,
    },
    #[error("{what} needs CAP_BPF and CAP_NET_ADMIN (run as root, or grant both in the systemd unit): {source}")]
    Privilege {
        what: &'static str,
        source: io::Error,
    },
    #[error("could not create BPF map {name}: {source}")]
    Map {
        name: &'static str,
        source: io::Error,
    },
    #[error("the kernel refused the XDP program: {source}; verifier log:\n{log}")]
    Verifier { source: io::Error, log: String },
    #[error("interface {ifname:?} has no native (driver) XDP support ({source}); mode zc needs a driver with XDP (ixgbe, i40e, ice, mlx5, veth, virtio_net, …): use --mode tnapi on this interface")]
    NoNativeXdp { ifname: String, source: io::Error },
    #[error("interface {ifname:?} already has XDP program {name:?} (id {id}) attached; vgate replaces only its own ({PROG_NAME}). Remove it (ip link set dev {ifname} xdp off) if it is not needed")]
    Foreign {
        ifname: String,
        name: String,
        id: u32,
    },
    #[error("interface {ifname:?} has XDP program {PROG_NAME} (id {id}) held by a running process: is another vgate running on this interface?")]
    Busy { ifname: String, id: u32 },
    #[error("could not attach the XDP program to {ifname:?}: {source}")]
    Attach { ifname: String, source: io::Error },
    #[error("could not read the XDP state of {ifname:?}: {source}")]
    Query { ifname: String, source: io::Error },
    #[error("could not replace the stale {PROG_NAME} (id {id}) on {ifname:?}: {source}")]
    Replace {
        ifname: String,
        id: u32,
        source: io::Error,
    },
    #[error("AF_XDP socket for {ifname}@{queue}: {step}: {source}")]
    Socket {
        ifname: String,
        queue: u32,
        step: &'static str,
        source: io::Error,
    },
    #[error("domain isolation: {0}")]
    Isolation(#[source] io::Error),
    #[error("{0}")]
    Fast(#[source] super::xdp::XdpError),
    #[error("could not register the socket of {ifname}@{queue} in the XSKMAP: {source}")]
    XskMap {
        ifname: String,
        queue: u32,
        source: io::Error,
    },
}

impl From<AfxdpError> for EngineError {
    fn from(e: AfxdpError) -> EngineError {
        EngineError::Io {
            what: "mode zc (engine afxdp) cannot run".into(),
            source: io::Error::other(e),
        }
    }
}

// ---- the engine ---------------------------------------------------------------------------

/// A domain interface with our program on it.
struct Iface {
    name: String,
    ifindex: u32,
    domains: Vec<DomainId>,
    rx_queues: u32,
    mac: [u8; 6],
    prog_id: u32,
    /// Bind mode per RX queue.
    modes: Vec<BindMode>,
    /// Why zero-copy was refused (first refusal).
    zc_refused: Option<String>,
    /// Who fills the UDP checksum, per RX queue's socket.
    tx_csum: Vec<TxCsum>,
    /// Why the kernel refused TX metadata (first refusal).
    tx_meta_refused: Option<String>,
    /// Why vgate did not ask for TX checksum offload here ([`csum_offload_verdict`]).
    csum_withheld: Option<String>,
    replaced_stale: Option<u32>,
    xsks: Map,
    /// The attachment; dropping it detaches the program.
    link: Option<XdpLink>,
    _prog: Prog,
}

/// An interface to open: name, domains, ifindex, RX queues, MAC.
type Wanted = (String, Vec<DomainId>, u32, u32, [u8; 6]);

/// The AF_XDP engine.
pub struct AfxdpEngine {
    cfg: EngineConfig,
    hooks: Arc<XdpHooks>,
    registry: Arc<PortRegistry>,
    ifaces: Vec<Iface>,
    /// `sockets[w]`: (interface index, queue, socket) of worker `w`; handed over by `start`.
    sockets: Vec<Vec<(usize, u32, Xsk)>>,
    targets: Targets,
    tx_path: TxPath,
    /// A split half: the links and their counters.
    split: Option<(SplitConfig, Arc<SplitStats>)>,
    /// Mode xdp: the in-kernel fast path.
    fast: Option<Arc<FastPath>>,
    /// What the program dropped for ports without a route.
    noroute: Arc<NoRouteCount>,
    /// The neighbour resolver's table, once `start` runs one.
    neigh: Option<Arc<super::neigh::NeighTable>>,
    /// The media ranges' nft drop table for what the program passes (fragments), when ports
    /// hold no socket.
    nft: Option<MediaDropTable>,
}

fn xdp_mode_flag(attached: u8) -> u32 {
    match attached {
        2 => bpf::XDP_FLAGS_SKB_MODE,
        3 => bpf::XDP_FLAGS_HW_MODE,
        _ => bpf::XDP_FLAGS_DRV_MODE,
    }
}

/// Detaches a stale `vgate_xdp` from `ifindex`; errors for anything else attached.
fn clear_stale(ifname: &str, ifindex: u32) -> Result<Option<u32>, AfxdpError> {
    let st = bpf::xdp_state(ifindex).map_err(|source| AfxdpError::Query {
        ifname: ifname.into(),
        source,
    })?;
    if st.attached == 0 {
        return Ok(None);
    }
    let id = st.prog_id;
    let (fd, name) = bpf::prog_by_id(id).map_err(|source| AfxdpError::Query {
        ifname: ifname.into(),
        source,
    })?;
    if name != PROG_NAME {
        return Err(AfxdpError::Foreign {
            ifname: ifname.into(),
            name,
            id,
        });
    }
    match bpf::xdp_detach_expected(ifindex, fd.as_fd(), xdp_mode_flag(st.attached)) {
        Ok(()) => {
            tracing::warn!(
                interface = ifname,
                prog_id = id,
                "replaced a stale {PROG_NAME} left on the interface by an earlier run"
            );
            Ok(Some(id))
        }
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Err(AfxdpError::Busy {
            ifname: ifname.into(),
            id,
        }),
        Err(source) => Err(AfxdpError::Replace {
            ifname: ifname.into(),
            id,
            source,
        }),
    }
}

/// Loads a `vgate_xdp` that passes everything and attaches it to `ifname` through netlink,
/// where it stays after this process exits — what a run of an older vgate that attached
/// without a BPF link, and crashed, leaves behind. For tests and drills of the start-up
/// replacement; returns the program id.
pub fn leave_stale_program(ifname: &str) -> io::Result<u32> {
    let c = CString::new(ifname).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let ifindex = xsys::if_nametoindex(&c)?;
    let mut a = Asm::new();
    a.op(MOV64_IMM, R0, 0, 0, XDP_PASS);
    a.op(EXIT, 0, 0, 0, 0);
    let prog = Prog::load_xdp(&a.finish(), PROG_NAME).map_err(|e| e.source)?;
    bpf::xdp_attach_legacy(ifindex, &prog, bpf::XDP_FLAGS_DRV_MODE)?;
    Ok(bpf::xdp_state(ifindex)?.prog_id)
}

/// Whether a BPF program with this id is loaded (for tests and drills: a program vgate
/// logged is gone once vgate has exited or been killed).
pub fn bpf_program_loaded(id: u32) -> bool {
    bpf::prog_by_id(id).is_ok()
}

fn privilege(what: &'static str) -> impl Fn(io::Error) -> Option<AfxdpError> {
    move |e: io::Error| match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => Some(AfxdpError::Privilege { what, source: e }),
        _ => None,
    }
}

fn params() -> XskParams {
    XskParams {
        frame_size: FRAME_SIZE,
        frames: FRAMES,
        ring: RING,
    }
}

impl AfxdpEngine {
    /// Loads and attaches the program and opens every socket; fails with the reason when the
    /// mode cannot run here. Nothing stays attached when it fails.
    pub fn new(cfg: &Config) -> Result<AfxdpEngine, EngineError> {
        Ok(AfxdpEngine::open(cfg, TxPath::from_env(), false)?)
    }

    /// Mode xdp: as [`AfxdpEngine::new`], with the in-kernel fast path of [`super::xdp`].
    pub fn new_fast(cfg: &Config) -> Result<AfxdpEngine, EngineError> {
        AfxdpEngine::open(cfg, TxPath::from_env(), true).map_err(|e| EngineError::Io {
            what: "mode xdp (engine xdp) cannot run".into(),
            source: io::Error::other(e),
        })
    }

    fn open(cfg: &Config, tx_path: TxPath, fast: bool) -> Result<AfxdpEngine, AfxdpError> {
        let queues = cfg.engine.queues.max(1);
        let csum_offload = csum_offload_from_env();
        let targets: Targets = [
            (cfg.domains[0].address, cfg.domains[0].media_ports),
            (cfg.domains[1].address, cfg.domains[1].media_ports),
        ];
        // Interfaces and their domains, checked before anything is created.
        let mut wanted: Vec<Wanted> = Vec::new();
        // A split half attaches to its real domain only: the link face has no wire.
        let face = cfg.split.as_ref().map(|s| s.link_face());
        for d in cfg.domains.iter().filter(|d| Some(d.id) != face) {
            if let Some(w) = wanted.iter_mut().find(|w| w.0 == d.interface) {
                w.1.push(d.id);
                continue;
            }
            let no_iface = || AfxdpError::NoInterface {
                ifname: d.interface.clone(),
            };
            let c = CString::new(d.interface.as_str()).map_err(|_| no_iface())?;
            let ifindex = xsys::if_nametoindex(&c).map_err(|_| no_iface())?;
            let rxq = xsys::rx_queues(&c).ok().flatten().unwrap_or(1);
            if (rxq as usize) < queues {
                return Err(AfxdpError::Queues {
                    ifname: d.interface.clone(),
                    have: rxq,
                    want: queues,
                });
            }
            let mac = xsys::hw_addr(&c).unwrap_or_default();
            wanted.push((d.interface.clone(), vec![d.id], ifindex, rxq, mac));
        }
        // The registry's sockets (raw send sockets; per-port sockets only where needed) are
        // tied to their interfaces like the other engines' (checked before anything is
        // attached).
        let registry = PortRegistry::new([cfg.domains[0].address, cfg.domains[1].address])
            .on_interfaces([
                cfg.domains[0].interface.clone(),
                cfg.domains[1].interface.clone(),
            ])
            .and_then(|r| r.holding(super::ring_hold(cfg, tx_path == TxPath::Sockets)))
            .map_err(AfxdpError::Isolation)?;
        let registry = Arc::new(registry);
        let ports =
            Map::create(bpf::BPF_MAP_TYPE_ARRAY, 4, 4, 65536, "vgate_ports").map_err(|e| {
                privilege("creating BPF maps")(io::Error::from_raw_os_error(
                    e.raw_os_error().unwrap_or(0),
                ))
                .unwrap_or(AfxdpError::Map {
                    name: "vgate_ports",
                    source: e,
                })
            })?;
        let ports = Arc::new(ports);
        let noroute = Arc::new(NoRouteCount::create().map_err(|source| AfxdpError::Map {
            name: "vgate_noroute",
            source,
        })?);
        let fast = if fast {
            let mut eg = Vec::new();
            for (name, domains, ifindex, _, mac) in &wanted {
                let c = CString::new(name.as_str()).map_err(|_| AfxdpError::NoInterface {
                    ifname: name.clone(),
                })?;
                let mtu = xsys::mtu(&c).map_err(|source| AfxdpError::Query {
                    ifname: name.clone(),
                    source,
                })?;
                let addr = targets[domains[0].index()].0;
                eg.push((
                    name.clone(),
                    domains.clone(),
                    Egress {
                        ifindex: *ifindex,
                        mac: *mac,
                        mtu,
                        addr,
                    },
                ));
            }
            Some(Arc::new(
                FastPath::new(
                    egress_of(&eg),
                    &wanted.iter().map(|w| w.2).collect::<Vec<u32>>(),
                    cfg.engine.max_payload,
                )
                .map_err(AfxdpError::Fast)?,
            ))
        } else {
            None
        };
        let mut ifaces = Vec::new();
        for (name, domains, ifindex, rx_queues, mac) in wanted {
            let xsks = Map::create(bpf::BPF_MAP_TYPE_XSKMAP, 4, 4, rx_queues, "vgate_xsks")
                .map_err(|source| AfxdpError::Map {
                    name: "vgate_xsks",
                    source,
                })?;
            let dsts: Vec<(Ipv4Addr, u32, u16, u16)> = domains
                .iter()
                .map(|d| {
                    let (addr, r) = targets[d.index()];
                    (addr, bit(*d), r.first, r.last)
                })
                .collect();
            let fds = fast.as_ref().map(|f| f.fds());
            let insns = xdp_program(
                ports.raw_fd(),
                xsks.raw_fd(),
                noroute.map.raw_fd(),
                &dsts,
                fds.as_ref(),
            );
            let prog = Prog::load_xdp(&insns, PROG_NAME).map_err(|e| {
                privilege("loading an XDP program")(io::Error::from_raw_os_error(
                    e.source.raw_os_error().unwrap_or(0),
                ))
                .unwrap_or(AfxdpError::Verifier {
                    source: e.source,
                    log: e.log,
                })
            })?;
            let replaced_stale = clear_stale(&name, ifindex)?;
            let link =
                bpf::xdp_link(&prog, ifindex, bpf::XDP_FLAGS_DRV_MODE).map_err(|e| {
                    match e.raw_os_error() {
                        Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) => AfxdpError::NoNativeXdp {
                            ifname: name.clone(),
                            source: e,
                        },
                        Some(libc::EPERM) => AfxdpError::Privilege {
                            what: "attaching an XDP program",
                            source: e,
                        },
                        Some(libc::EBUSY) | Some(libc::EEXIST) => AfxdpError::Busy {
                            ifname: name.clone(),
                            id: 0,
                        },
                        _ => AfxdpError::Attach {
                            ifname: name.clone(),
                            source: e,
                        },
                    }
                })?;
            let prog_id = bpf::xdp_state(ifindex).map(|s| s.prog_id).unwrap_or(0);
            ifaces.push(Iface {
                name,
                ifindex,
                domains,
                rx_queues,
                mac,
                prog_id,
                modes: Vec::new(),
                zc_refused: None,
                tx_csum: Vec::new(),
                tx_meta_refused: None,
                csum_withheld: None,
                replaced_stale,
                xsks,
                link: Some(link),
                _prog: prog,
            });
        }
        // Sockets, once every program is attached (an error drops the links: detached).
        let mut sockets: Vec<Vec<(usize, u32, Xsk)>> = (0..queues).map(|_| Vec::new()).collect();
        let release = xsys::kernel_release().ok();
        for (i, iface) in ifaces.iter_mut().enumerate() {
            let csum_offload = csum_offload && {
                let driver = CString::new(iface.name.as_str())
                    .ok()
                    .and_then(|c| xsys::driver(&c).ok());
                match csum_offload_verdict(release.as_deref(), driver.as_deref()) {
                    Ok(()) => true,
                    Err(why) => {
                        iface.csum_withheld = Some(why);
                        false
                    }
                }
            };
            for q in 0..iface.rx_queues {
                let sock_err = |e: xsys::XskError| AfxdpError::Socket {
                    ifname: iface.name.clone(),
                    queue: q,
                    step: e.step,
                    source: e.source,
                };
                let open = |mode| Xsk::open(iface.ifindex, q, params(), mode, csum_offload);
                let xsk = if iface.zc_refused.is_none() {
                    match open(BindMode::ZeroCopy) {
                        Ok(x) => x,
                        Err(e) if e.step == "bind" => {
                            iface.zc_refused = Some(e.source.to_string());
                            open(BindMode::Copy).map_err(sock_err)?
                        }
                        Err(e) => return Err(sock_err(e)),
                    }
                } else {
                    open(BindMode::Copy).map_err(sock_err)?
                };
                if let (Some(e), None) = (&xsk.tx_meta_refused, &iface.tx_meta_refused) {
                    iface.tx_meta_refused = Some(e.to_string());
                }
                iface.tx_csum.push(xsk.tx_csum);
                iface
                    .xsks
                    .update(&q.to_ne_bytes(), &(xsk.raw_fd() as u32).to_ne_bytes())
                    .map_err(|source| AfxdpError::XskMap {
                        ifname: iface.name.clone(),
                        queue: q,
                        source,
                    })?;
                iface.modes.push(xsk.mode);
                sockets[q as usize % queues].push((i, q, xsk));
            }
            if let Some(why) = &iface.zc_refused {
                tracing::warn!(
                    interface = %iface.name,
                    "zero-copy AF_XDP bind refused by the driver ({why}); the sockets of this interface run in copy mode"
                );
            }
            match (&iface.tx_meta_refused, csum_offload) {
                _ if iface.csum_withheld.is_some() => tracing::warn!(
                    interface = %iface.name,
                    "AF_XDP TX checksum offload not used ({}): vgate computes the UDP checksum of every frame it sends on this interface",
                    iface.csum_withheld.as_deref().unwrap_or("-")
                ),
                (Some(why), _) => tracing::warn!(
                    interface = %iface.name,
                    "the kernel refused AF_XDP TX metadata ({why}; needs Linux 6.11 or later): vgate computes the UDP checksum of every frame it sends on this interface"
                ),
                (None, true) => tracing::info!(
                    interface = %iface.name,
                    "AF_XDP transmit: {}",
                    csum_summary(&iface.tx_csum)
                ),
                (None, false) => {}
            }
        }
        let hooks = Arc::new(XdpHooks {
            registry: Arc::clone(&registry),
            ports: Mutex::new(PortMap {
                map: ports,
                flags: vec![0; 65536],
            }),
            fast: fast.clone(),
        });
        let nft = if registry.hold() == super::ports::PortHold::Reserved {
            fragment_guard(cfg, face)
        } else {
            None
        };
        Ok(AfxdpEngine {
            cfg: cfg.engine.clone(),
            hooks,
            registry,
            ifaces,
            sockets,
            targets,
            tx_path,
            split: cfg
                .split
                .as_ref()
                .map(|s| (s.clone(), Arc::new(SplitStats::new(s)))),
            fast,
            noroute,
            neigh: None,
            nft,
        })
    }
}

/// What the XDP program passes to the kernel for the media ranges — fragments, which the
/// kernel reassembles and, with no socket on the port, would answer with ICMP port
/// unreachable — dropped after reassembly by the nft table tnapi uses
/// ([`super::nft::MediaDropTable`]; datagrams the program redirects never reach it). Best
/// effort: without `nft` the engine runs and says once what that leaves open.
fn fragment_guard(cfg: &Config, face: Option<DomainId>) -> Option<MediaDropTable> {
    let rules: Vec<DropRule> = cfg
        .domains
        .iter()
        .filter(|d| Some(d.id) != face)
        .map(|d| DropRule {
            iface: d.interface.clone(),
            addr: Some(d.address),
            ports: d.media_ports.first..=d.media_ports.last,
        })
        .collect();
    match MediaDropTable::install(&super::tnapi::instance_name(cfg), &rules) {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::warn!("no nft table for the media ranges ({e}): a fragmented datagram to a media port is reassembled by the kernel and answered with ICMP port unreachable");
            None
        }
    }
}

impl Engine for AfxdpEngine {
    fn kind(&self) -> EngineKind {
        if self.fast.is_some() {
            EngineKind::Xdp
        } else {
            EngineKind::Afxdp
        }
    }

    fn describe(&self) -> String {
        let q = self.cfg.queues.max(1);
        let ifaces: Vec<String> = self
            .ifaces
            .iter()
            .map(|i| {
                let doms: Vec<&str> = i.domains.iter().map(|d| d.name()).collect();
                let zc = i.modes.iter().filter(|m| **m == BindMode::ZeroCopy).count();
                let copy = i.modes.len() - zc;
                let modes = match (zc, copy) {
                    (_, 0) => format!("{zc} socket(s) zero-copy"),
                    (0, _) => format!(
                        "{copy} socket(s) copy mode (zero-copy refused: {})",
                        i.zc_refused.as_deref().unwrap_or("-")
                    ),
                    _ => format!("{zc} socket(s) zero-copy, {copy} copy mode"),
                };
                let stale = i
                    .replaced_stale
                    .map_or(String::new(), |id| format!(", replaced stale program id {id}"));
                let refused = i
                    .tx_meta_refused
                    .as_deref()
                    .map_or(String::new(), |why| {
                        format!(" (TX metadata refused: {why})")
                    })
                    + &i.csum_withheld.as_deref().map_or(String::new(), |why| {
                        format!(" (TX checksum offload not used: {why})")
                    });
                format!(
                    "{} (domain {}, {} RX queue(s), {PROG_NAME} id {} in driver mode{stale}, {modes}, {}{refused})",
                    i.name,
                    doms.join("+"),
                    i.rx_queues,
                    i.prog_id,
                    csum_summary(&i.tx_csum),
                )
            })
            .collect();
        let workers: Vec<String> = (0..q)
            .map(|w| {
                let socks: Vec<String> = self
                    .ifaces
                    .iter()
                    .map(|i| {
                        let list: Vec<String> = (w as u32..i.rx_queues)
                            .step_by(q)
                            .map(|x| x.to_string())
                            .collect();
                        format!("{}@{}", i.name, list.join(","))
                    })
                    .collect();
                let cpu = self
                    .cfg
                    .cpus
                    .get(w)
                    .map_or("unpinned".into(), |c| format!("CPU {c}"));
                format!("w{w} ({}) on {cpu}", socks.join(" "))
            })
            .collect();
        let egress = match self.tx_path {
            TxPath::Sockets => format!("egress UDP sockets, sendmmsg batch {}", self.cfg.batch),
            TxPath::Xdp => {
                "egress AF_XDP TX (headers built in vgate, next hop from the neighbour table), else a raw IPv4 socket per worker and egress domain (no socket per port)"
                    .into()
            }
        };
        let head = match &self.fast {
            None => "mode zc, engine afxdp (AF_XDP".to_string(),
            Some(f) => format!(
                "mode xdp, engine xdp (in-kernel fast path for confirmed streams: XDP rewrite + devmap redirect, {} counter slots, {} route(s) active, {}{}; slow path AF_XDP",
                super::xdp::SLOTS,
                f.active(),
                f.watch_summary(),
                f.refused_summary()
            ),
        };
        format!(
            "{head}, UMEM {FRAMES} x {FRAME_SIZE} B per socket, rings {RING}; {egress}); interfaces: {}; {q} queue(s), workers: {}",
            ifaces.join(", "),
            workers.join(", "),
        )
    }

    fn port_hooks(&self) -> Arc<dyn PortHooks> {
        Arc::clone(&self.hooks) as Arc<dyn PortHooks>
    }

    fn ports(&self) -> Arc<PortRegistry> {
        Arc::clone(&self.registry)
    }

    fn split_stats(&self) -> Option<Arc<SplitStats>> {
        self.split.as_ref().map(|(_, s)| Arc::clone(s))
    }

    fn neigh_table(&self) -> Option<Arc<super::neigh::NeighTable>> {
        self.neigh.clone()
    }

    fn xdp_status(&self) -> Option<Arc<super::xdp::XdpStatus>> {
        self.fast.as_ref().map(|f| f.status())
    }

    fn start(
        &mut self,
        routes: Arc<Routes>,
        stop: Arc<AtomicBool>,
    ) -> Result<Vec<Worker>, EngineError> {
        let n = self.cfg.queues.max(1);
        let per_worker = std::mem::take(&mut self.sockets);
        if per_worker.len() != n {
            return Err(EngineError::Io {
                what: "starting the afxdp workers".into(),
                source: io::Error::other("the sockets were already handed to workers"),
            });
        }
        let mut per_worker = per_worker.into_iter();
        let mut links = match &self.split {
            Some((s, st)) => Some(HalfLinks::open(
                s,
                st,
                LinkFamily::of(EngineKind::Afxdp),
                n,
            )?),
            None => None,
        };
        let resolver =
            NeighResolver::start(Arc::clone(&stop)).map_err(|source| EngineError::Io {
                what: "starting the neighbour resolver thread".into(),
                source,
            })?;
        if let Some(f) = &self.fast {
            f.attach_neighbours(resolver.handle());
        }
        self.neigh = Some(Arc::clone(resolver.table()));
        // Each worker's raw sockets (ports without sockets), opened here so a refusal stops
        // the start.
        let mut raws = (0..n)
            .map(|_| self.registry.raw_senders())
            .collect::<io::Result<Vec<_>>>()
            .map_err(EngineError::Isolation)?
            .into_iter();
        let workers = start_workers(n, &self.cfg.cpus, &self.registry, &routes, &stop, |w| {
            let link = links.as_mut().and_then(|l| l.sender(w, self.cfg.batch));
            let raw = raws.next().unwrap_or_default();
            let socks: Vec<WorkerXsk> = per_worker
                .next()
                .unwrap_or_default()
                .into_iter()
                .map(|(i, queue, xsk)| {
                    let iface = &self.ifaces[i];
                    WorkerXsk {
                        xsk,
                        iface: i,
                        queue,
                        domains: iface.domains.clone(),
                        fallback: Channel::from_ingress(iface.domains[0]),
                        dropped: 0,
                        busy_seen: 0,
                    }
                })
                .collect();
            // AF_XDP TX: the worker's first socket on the interface facing each domain, when
            // that interface faces that domain only.
            let mut tx_sock = [None, None];
            let mut src_mac = [[0u8; 6]; 2];
            for d in [DomainId::A, DomainId::B] {
                tx_sock[d.index()] = socks.iter().position(|s| s.domains == [d]);
                if let Some(p) = tx_sock[d.index()] {
                    src_mac[d.index()] = self.ifaces[socks[p].iface].mac;
                }
            }
            let egress_ifindex = [DomainId::A, DomainId::B].map(|d| {
                self.ifaces
                    .iter()
                    .find(|i| i.domains == [d])
                    .map_or(0, |i| i.ifindex)
            });
            let (targets, batch, max_payload, tx_path) = (
                self.targets,
                self.cfg.batch,
                self.cfg.max_payload,
                self.tx_path,
            );
            let fast = self.fast.clone();
            let noroute = Arc::clone(&self.noroute);
            let neigh = resolver.handle();
            move |shell: &Shell| {
                let ctx = WorkerCtx {
                    index: shell.index,
                    routes: Arc::clone(&shell.routes),
                    targets,
                    max_payload,
                    tx_path,
                    tx_sock,
                    src_mac,
                    egress_ifindex,
                    fast: if shell.index == 0 { fast } else { None },
                    noroute: (shell.index == 0).then_some(noroute),
                    spin_us: spin_from_env(),
                    sleep_in_poll: sleep_in_poll_from_env(),
                    kick_at: kick_at_from_env(),
                };
                Ok(XskPath {
                    ctx,
                    socks,
                    local: EgressSockets::with_raw(raw),
                    txb: SliceBatch::new(batch),
                    frames: Vec::with_capacity(RX_BATCH),
                    neigh,
                    link,
                })
            }
        })?;
        HalfLinks::finish(
            links.as_mut(),
            workers,
            &self.cfg.cpus,
            &routes,
            &self.registry,
            &stop,
            self.cfg.batch,
            self.cfg.max_payload,
        )
    }
}

impl Drop for AfxdpEngine {
    fn drop(&mut self) {
        for i in &mut self.ifaces {
            // Closing the link fd detaches the program; the maps and the program are freed
            // when their last fd (ours, the workers' sockets) is closed.
            if i.link.take().is_some() {
                tracing::info!(interface = %i.name, "{PROG_NAME} detached");
            }
        }
        if let Some(t) = self.nft.take() {
            let name = t.table_name().to_owned();
            if let Err(e) = t.remove() {
                tracing::error!("could not remove nft table inet {name}: {e}; remove it with `nft delete table inet {name}`");
            }
        }
    }
}

#[cfg(test)]
mod tests;
