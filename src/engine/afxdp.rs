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
//! checksum status) → channel by destination → route by destination port → [`inspect`] →
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

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

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

/// How forwarded packets leave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxPath {
    /// Gateway-port UDP sockets, `sendmmsg`.
    Sockets,
    /// AF_XDP TX on the egress interface, headers built by vgate.
    Xdp,
}

impl TxPath {
    /// `VGATE_AFXDP_TX=xdp|sockets`; the default, `xdp`, was the faster on the bed (see
    /// the module doc).
    pub fn from_env() -> TxPath {
        match std::env::var("VGATE_AFXDP_TX").as_deref() {
            Ok("sockets") => TxPath::Sockets,
            Ok("xdp") | Err(_) => TxPath::Xdp,
            Ok(v) => {
                knob_ignored("VGATE_AFXDP_TX", v, "xdp|sockets; xdp used");
                TxPath::Xdp
            }
        }
    }
}

/// `VGATE_AFXDP_TX_CSUM=software|offload`: who fills the UDP checksum of AF_XDP TX frames.
/// `offload` (default) asks the kernel for TX metadata where it is known to be honoured
/// ([`csum_offload_verdict`]) and, where it is granted (copy-mode sockets), leaves the
/// checksum to the egress device; `software` always sums in vgate (for A/B runs).
pub fn csum_offload_from_env() -> bool {
    match std::env::var("VGATE_AFXDP_TX_CSUM").as_deref() {
        Ok("software") => false,
        Ok("offload") | Err(_) => true,
        Ok(v) => {
            knob_ignored("VGATE_AFXDP_TX_CSUM", v, "software|offload; offload used");
            true
        }
    }
}

/// Warns, once per knob per process, that an environment knob's value was not understood
/// and what is used instead (startup only).
fn knob_ignored(name: &'static str, value: &str, instead: &str) {
    static WARNED: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut w = WARNED.lock().unwrap_or_else(|e| e.into_inner());
    if !w.contains(&name) {
        w.push(name);
        tracing::warn!("{name}={value:?} not understood (expected {instead})");
    }
}

/// A numeric knob: its value clamped to `lo..=hi`, or `default` when unset; a value that is
/// not a number, or out of range, is warned about once.
fn numeric_knob(name: &'static str, default: u32, lo: u32, hi: u32) -> u32 {
    let Ok(v) = std::env::var(name) else {
        return default;
    };
    match v.trim().parse::<u32>() {
        Ok(n) if (lo..=hi).contains(&n) => n,
        Ok(n) => {
            let c = n.clamp(lo, hi);
            knob_ignored(name, &v, &format!("{lo}–{hi}; {c} used"));
            c
        }
        Err(_) => {
            knob_ignored(name, &v, &format!("a number {lo}–{hi}; {default} used"));
            default
        }
    }
}

/// Whether the kernel's copy-mode transmit can be trusted to fill the UDP checksum from TX
/// metadata on an interface with `driver`, under kernel `release` (`uname -r`); `Err` says
/// why not (the socket then sums in software).
///
/// Copy mode honours TX metadata from Linux 6.11, but before 6.18 only for drivers without
/// `IFF_TX_SKB_NO_LINEAR`: for those (virtio_net) the skb is built by
/// `xsk_build_skb_zerocopy`, which ignored the metadata (fixed by upstream 30c3055f, "xsk: wrap
/// generic metadata handling onto separate function") while the kernel still granted
/// `XDP_UMEM_TX_METADATA_LEN` — every datagram would leave with only the pseudo-header sum.
/// The flag is not visible from user space, so on 6.11–6.17 only veth (known not to set it)
/// is trusted.
pub(crate) fn csum_offload_verdict(
    release: Option<&str>,
    driver: Option<&str>,
) -> Result<(), String> {
    let Some((major, minor)) = release.and_then(kernel_version) else {
        return Err("the kernel version is unknown".into());
    };
    let v = (major, minor);
    if v >= (6, 18) {
        return Ok(());
    }
    if v < (6, 11) {
        return Err(format!(
            "Linux {major}.{minor}: copy-mode AF_XDP honours TX metadata from 6.11"
        ));
    }
    match driver {
        Some("veth") => Ok(()),
        d => Err(format!(
            "Linux {major}.{minor} with driver {}: before 6.18 copy mode ignores TX metadata on drivers with IFF_TX_SKB_NO_LINEAR (virtio_net); only veth is trusted",
            d.unwrap_or("unknown")
        )),
    }
}

/// `6.18.4-arch1` → (6, 18).
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

// ---- the XDP program ----------------------------------------------------------------------

/// A tiny eBPF assembler: instructions plus forward jumps to named labels.
pub(super) struct Asm {
    insns: Vec<Insn>,
    /// (instruction index, label)
    fixups: Vec<(usize, &'static str)>,
    labels: HashMap<&'static str, usize>,
}

pub(super) const R0: u8 = 0;
pub(super) const R1: u8 = 1;
pub(super) const R2: u8 = 2;
pub(super) const R3: u8 = 3;
pub(super) const R4: u8 = 4;
pub(super) const R5: u8 = 5;
pub(super) const R6: u8 = 6;
use super::xdp::{R7, R9};
pub(super) const R8: u8 = 8;
pub(super) const R10: u8 = 10;

// Opcodes (class | size/op | source).
pub(super) const LDX_W: u8 = 0x61;
pub(super) const LDX_H: u8 = 0x69;
pub(super) const LDX_B: u8 = 0x71;
pub(super) const STX_W: u8 = 0x63;
pub(super) const MOV64_IMM: u8 = 0xb7;
pub(super) const MOV64_REG: u8 = 0xbf;
pub(super) const ADD64_IMM: u8 = 0x07;
pub(super) const ADD64_REG: u8 = 0x0f;
pub(super) const AND64_IMM: u8 = 0x57;
pub(super) const LSH64_IMM: u8 = 0x67;
pub(super) const BE: u8 = 0xdc;
pub(super) const JA: u8 = 0x05;
pub(super) const JGT_REG: u8 = 0x2d;
pub(super) const JEQ_IMM: u8 = 0x15;
pub(super) const JLT_IMM: u8 = 0xa5;
pub(super) const JGT_IMM: u8 = 0x25;
pub(super) const JNE32_IMM: u8 = 0x56;
pub(super) const JSET32_IMM: u8 = 0x46;
pub(super) const CALL: u8 = 0x85;
pub(super) const EXIT: u8 = 0x95;
pub(super) const LD_IMM64: u8 = 0x18;
pub(super) const PSEUDO_MAP_FD: u8 = 1;
pub(super) const HELPER_MAP_LOOKUP_ELEM: i32 = 1;
pub(super) const HELPER_REDIRECT_MAP: i32 = 51;
pub(super) const XDP_PASS: i32 = 2;
const XDP_DROP: i32 = 1;
const LDX_DW: u8 = 0x79;
const SUB64_REG: u8 = 0x1f;
const STX_DW: u8 = 0x7b;
const RSH64_IMM: u8 = 0x77;

impl Asm {
    pub(super) fn new() -> Asm {
        Asm {
            insns: Vec::new(),
            fixups: Vec::new(),
            labels: HashMap::new(),
        }
    }

    pub(super) fn op(&mut self, code: u8, dst: u8, src: u8, off: i16, imm: i32) {
        self.insns.push(Insn {
            code,
            regs: (src << 4) | dst,
            off,
            imm,
        });
    }

    /// A conditional (or, with `JA`, unconditional) jump to `label`, placed later.
    pub(super) fn jmp(&mut self, code: u8, dst: u8, src: u8, imm: i32, label: &'static str) {
        self.fixups.push((self.insns.len(), label));
        self.op(code, dst, src, 0, imm);
    }

    pub(super) fn label(&mut self, name: &'static str) {
        self.labels.insert(name, self.insns.len());
    }

    pub(super) fn has_label(&self, name: &'static str) -> bool {
        self.labels.contains_key(name)
    }

    pub(super) fn ld_map_fd(&mut self, dst: u8, fd: i32) {
        self.op(LD_IMM64, dst, PSEUDO_MAP_FD, 0, fd);
        self.op(0, 0, 0, 0, 0);
    }

    pub(super) fn finish(mut self) -> Vec<Insn> {
        for (at, label) in self.fixups {
            let target = self.labels[label];
            self.insns[at].off = (target as isize - at as isize - 1) as i16;
        }
        self.insns
    }
}

/// The XDP program for an interface facing the domains whose gateway addresses and port-map
/// bits are `dsts`. `ports_fd` is the `vgate_ports` ARRAY, `xsks_fd` the interface's XSKMAP,
/// `noroute_fd` the `vgate_noroute` per-CPU ARRAY ([`NoRouteCount`]); with `fast` (mode
/// xdp), routed media may be forwarded in the kernel first (see [`super::xdp`]).
fn xdp_program(
    ports_fd: i32,
    xsks_fd: i32,
    noroute_fd: i32,
    dsts: &[(Ipv4Addr, u32, u16, u16)],
    fast: Option<&FastFds>,
) -> Vec<Insn> {
    let mut a = Asm::new();
    a.op(MOV64_REG, R6, R1, 0, 0); // r6 = ctx
    a.op(LDX_W, R2, R6, 0, 0); // r2 = data
    a.op(LDX_W, R3, R6, 4, 0); // r3 = data_end
    a.op(MOV64_REG, R7, R2, 0, 0); // r7 = data (the fast path's frame)
    a.op(MOV64_IMM, R9, 0, 0, 1); // r9: the fast path may take it (untagged, IHL 5)
    a.op(MOV64_REG, R4, R2, 0, 0);
    a.op(ADD64_IMM, R4, 0, 0, 14);
    a.jmp(JGT_REG, R4, R3, 0, "pass"); // Ethernet header present
    a.op(LDX_H, R5, R2, 12, 0); // ethertype, network order
    a.jmp(JNE32_IMM, R5, 0, 0x0081, "untagged"); // not 802.1Q
    a.op(MOV64_REG, R4, R2, 0, 0);
    a.op(ADD64_IMM, R4, 0, 0, 18);
    a.jmp(JGT_REG, R4, R3, 0, "pass");
    a.op(LDX_H, R5, R2, 16, 0); // inner ethertype
    a.op(MOV64_IMM, R9, 0, 0, 0); // tagged: not for the fast path
    a.op(ADD64_IMM, R2, 0, 0, 4); // from here r2 + 14 is the IP header
    a.label("untagged");
    a.jmp(JNE32_IMM, R5, 0, 0x0008, "pass"); // IPv4
    a.op(MOV64_REG, R4, R2, 0, 0);
    a.op(ADD64_IMM, R4, 0, 0, 34);
    a.jmp(JGT_REG, R4, R3, 0, "pass"); // 20-byte IPv4 header present
    a.op(LDX_B, R5, R2, 14, 0); // version | IHL
    a.op(MOV64_REG, R4, R5, 0, 0);
    a.op(AND64_IMM, R4, 0, 0, 0xf0);
    a.jmp(JNE32_IMM, R4, 0, 0x40, "pass"); // version 4
    a.op(AND64_IMM, R5, 0, 0, 0x0f);
    a.jmp(JLT_IMM, R5, 0, 5, "pass"); // IHL >= 5; now r5 in [5, 15]
    if fast.is_some() {
        a.jmp(JEQ_IMM, R5, 0, 5, "no_options");
        a.op(MOV64_IMM, R9, 0, 0, 0); // IPv4 options: not for the fast path
        a.label("no_options");
    }
    a.op(LDX_B, R4, R2, 23, 0);
    a.jmp(JNE32_IMM, R4, 0, 17, "pass"); // UDP
    a.op(LDX_H, R4, R2, 20, 0);
    a.jmp(JSET32_IMM, R4, 0, 0xff3f, "pass"); // MF or a fragment offset: the kernel's
    a.op(LDX_W, R4, R2, 30, 0); // destination address
    a.op(MOV64_IMM, R8, 0, 0, 0);
    for (i, (addr, bit, _, _)) in dsts.iter().enumerate() {
        let next: &'static str = ["dst1", "dst2", "dst3"][i.min(2)];
        a.jmp(
            JNE32_IMM,
            R4,
            0,
            u32::from_le_bytes(addr.octets()) as i32,
            next,
        );
        a.op(MOV64_IMM, R8, 0, 0, *bit as i32);
        a.jmp(JA, 0, 0, 0, "have_dst");
        a.label(next);
    }
    a.jmp(JA, 0, 0, 0, "pass");
    a.label("have_dst");
    a.op(LSH64_IMM, R5, 0, 0, 2); // IHL in bytes: [20, 60]
    a.op(ADD64_REG, R2, R5, 0, 0); // r2 + 14 is the UDP header
    a.op(MOV64_REG, R4, R2, 0, 0);
    a.op(ADD64_IMM, R4, 0, 0, 22);
    a.jmp(JGT_REG, R4, R3, 0, "pass"); // UDP header present
    a.op(LDX_H, R4, R2, 16, 0); // destination port, network order
    a.op(BE, R4, 0, 0, 16); // to host order
                            // The whole media range of the domain is ours, routed or not: no datagram for it may
                            // reach the kernel's UDP layer (port unreachable, another socket); a port without a
                            // route is dropped here and counted in `vgate_noroute`.
    for (i, (_, bit, lo, hi)) in dsts.iter().enumerate() {
        let next: &'static str = ["rng1", "rng2", "rng3"][i.min(2)];
        a.jmp(JNE32_IMM, R8, 0, *bit as i32, next);
        a.jmp(JLT_IMM, R4, 0, i32::from(*lo), "pass");
        a.jmp(JGT_IMM, R4, 0, i32::from(*hi), "pass");
        a.jmp(JA, 0, 0, 0, "in_range");
        a.label(next);
    }
    a.jmp(JA, 0, 0, 0, "pass");
    a.label("in_range");
    // no_route's byte count: the payload the UDP length claims, but no more than the frame
    // holds (the length field is the sender's word).
    a.op(LDX_H, R5, R2, 18, 0); // UDP length, network order
    a.op(BE, R5, 0, 0, 16);
    a.jmp(JGT_IMM, R5, 0, 7, "ulen_ok");
    a.op(MOV64_IMM, R5, 0, 0, 8); // below its header: no payload
    a.label("ulen_ok");
    a.op(ADD64_IMM, R5, 0, 0, -8);
    a.op(MOV64_REG, R1, R3, 0, 0);
    a.op(SUB64_REG, R1, R2, 0, 0);
    a.op(ADD64_IMM, R1, 0, 0, -22); // payload in the frame: >= 0, the UDP header is there
    a.jmp(JGT_REG, R1, R5, 0, "ulen_min"); // more in the frame (Ethernet padding)
    a.op(MOV64_REG, R5, R1, 0, 0);
    a.label("ulen_min");
    a.op(STX_W, R10, R5, -8, 0);
    a.op(STX_W, R10, R4, -4, 0); // key on the stack
    a.op(MOV64_REG, R2, R10, 0, 0);
    a.op(ADD64_IMM, R2, 0, 0, -4);
    a.ld_map_fd(R1, ports_fd);
    a.op(CALL, 0, 0, 0, HELPER_MAP_LOOKUP_ELEM);
    a.jmp(JEQ_IMM, R0, 0, 0, "no_route");
    a.op(LDX_W, R0, R0, 0, 0); // the port's domain bits
    a.op(0x5f, R0, R8, 0, 0); // r0 &= r8 (AND64_REG)
    a.jmp(JEQ_IMM, R0, 0, 0, "no_route"); // no route for this domain
    if let Some(f) = fast {
        a.jmp(JEQ_IMM, R9, 0, 0, "xsk");
        emit_fast(&mut a, f);
    }
    a.label("xsk");
    a.op(LDX_W, R2, R6, 16, 0); // ctx->rx_queue_index
    a.ld_map_fd(R1, xsks_fd);
    a.op(MOV64_IMM, R3, 0, 0, XDP_PASS); // no socket on this queue: to the kernel
    a.op(CALL, 0, 0, 0, HELPER_REDIRECT_MAP);
    a.op(EXIT, 0, 0, 0, 0);
    // A port of the range without a route: dropped, counted per ingress domain
    // (`vgate_noroute[bit >> 1]`: packets, payload bytes), so a flood to unrouted ports
    // does not share the workers' rings with routed media.
    a.label("no_route");
    a.op(MOV64_REG, R1, R8, 0, 0);
    a.op(RSH64_IMM, R1, 0, 0, 1); // bit 1 -> 0 (A), bit 2 -> 1 (B)
    a.op(STX_W, R10, R1, -4, 0);
    a.op(MOV64_REG, R2, R10, 0, 0);
    a.op(ADD64_IMM, R2, 0, 0, -4);
    a.ld_map_fd(R1, noroute_fd);
    a.op(CALL, 0, 0, 0, HELPER_MAP_LOOKUP_ELEM);
    a.jmp(JEQ_IMM, R0, 0, 0, "drop");
    a.op(LDX_DW, R1, R0, 0, 0);
    a.op(ADD64_IMM, R1, 0, 0, 1);
    a.op(STX_DW, R0, R1, 0, 0);
    a.op(LDX_W, R1, R10, -8, 0); // payload bytes
    a.op(LDX_DW, R2, R0, 8, 0);
    a.op(ADD64_REG, R2, R1, 0, 0);
    a.op(STX_DW, R0, R2, 8, 0);
    a.label("drop");
    a.op(MOV64_IMM, R0, 0, 0, XDP_DROP);
    a.op(EXIT, 0, 0, 0, 0);
    a.label("pass");
    a.op(MOV64_IMM, R0, 0, 0, XDP_PASS);
    a.op(EXIT, 0, 0, 0, 0);
    // Unused labels of the address and range chains must exist for the assembler.
    for l in ["dst1", "dst2", "dst3", "rng1", "rng2", "rng3"] {
        if !a.labels.contains_key(l) {
            a.labels.insert(l, a.labels["pass"]);
        }
    }
    a.finish()
}

/// Who fills the UDP checksum of an interface's AF_XDP TX frames, for the log and
/// [`Engine::describe`].
fn csum_summary(modes: &[TxCsum]) -> String {
    let off = modes.iter().filter(|m| **m == TxCsum::Offload).count();
    match (off, modes.len() - off) {
        (0, _) => "UDP checksum computed in vgate".into(),
        (_, 0) => "UDP checksum left to the kernel/device (TX metadata)".into(),
        (o, s) => format!(
            "UDP checksum left to the kernel/device on {o} socket(s) (TX metadata), computed in vgate on {s}"
        ),
    }
}

/// The port-map bit of `domain`.
fn bit(domain: DomainId) -> u32 {
    1 << domain.index()
}

// ---- route observer -----------------------------------------------------------------------

/// The engine's [`PortHooks`]: the port registry (no socket per port unless a `sockets`
/// variant or a split half needs them) plus the `vgate_ports`
/// map and, in mode xdp, the fast path's entries, updated as routes come and go.
struct XdpHooks {
    registry: Arc<PortRegistry>,
    ports: Mutex<PortMap>,
    fast: Option<Arc<FastPath>>,
}

struct PortMap {
    map: Arc<Map>,
    /// What the map holds, so an update is one write.
    flags: Vec<u32>,
}

static MAP_ERRORS: RateLimit = RateLimit::new(5000);

impl XdpHooks {
    /// Lets the XDP program pass (`on`) or drop the port's media for `channel`; on an error
    /// the map and `flags` are as they were.
    fn set(&self, channel: Channel, port: u16, on: bool) -> io::Result<()> {
        let mut p = self.ports.lock().unwrap_or_else(|e| e.into_inner());
        let b = bit(channel.ingress());
        let old = p.flags[usize::from(port)];
        let new = if on { old | b } else { old & !b };
        if new == old {
            return Ok(());
        }
        p.map
            .update(&u32::from(port).to_ne_bytes(), &new.to_ne_bytes())
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("could not update the XDP port map (vgate_ports) for port {port}: {e}"),
                )
            })?;
        p.flags[usize::from(port)] = new;
        Ok(())
    }
}

impl PortHooks for XdpHooks {
    fn open_port(&self, domain: DomainId, port: u16) -> io::Result<()> {
        self.registry.open_port(domain, port)
    }
    fn close_port(&self, domain: DomainId, port: u16) {
        self.registry.close_port(domain, port)
    }
    /// A failed port-map update refuses the route: installed, the XDP program would drop
    /// its media as `no_route`.
    fn route_added(&self, route: &Arc<StreamRoute>) -> io::Result<()> {
        self.set(route.channel, route.port, true)?;
        if let Some(f) = &self.fast {
            // A route whose receiver is a stream leg stays on the slow path: only user
            // space can hand its packets to the leg's sink.
            if route.edge.is_none() {
                f.added(route, now_ms());
            }
        }
        Ok(())
    }
    /// A failed update leaves the port passed to the workers, which count its media
    /// `no_route` (they find no route): logged, rate-limited.
    fn route_removed(&self, route: &StreamRoute) {
        if let Some(f) = &self.fast {
            f.removed(route);
        }
        if let Err(e) = self.set(route.channel, route.port, false) {
            if let Some(suppressed) = MAP_ERRORS.check(now_ms()) {
                tracing::error!(port = route.port, suppressed, "{e}");
            }
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
                "mode xdp, engine xdp (in-kernel fast path for confirmed streams: XDP rewrite + devmap redirect, {} counter slots, {} route(s) active, {}; slow path AF_XDP",
                super::xdp::SLOTS,
                f.active(),
                f.watch_summary()
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

// ---- the worker ---------------------------------------------------------------------------

struct WorkerXsk {
    xsk: Xsk,
    iface: usize,
    queue: u32,
    /// Domains whose media arrive on this socket's interface.
    domains: Vec<DomainId>,
    /// The channel that counts what cannot be classified.
    fallback: Channel,
    /// Kernel drops already counted.
    dropped: u64,
    /// [`Xsk::tx_busy_drops`] already counted.
    busy_seen: u64,
}

/// What a worker's forwarding needs besides its sockets.
struct WorkerCtx {
    index: usize,
    routes: Arc<Routes>,
    targets: Targets,
    max_payload: usize,
    tx_path: TxPath,
    /// Per egress domain: this worker's socket (index) for AF_XDP TX.
    tx_sock: [Option<usize>; 2],
    src_mac: [[u8; 6]; 2],
    egress_ifindex: [u32; 2],
    /// Worker 0 in mode xdp: polls the fast path's counters.
    fast: Option<Arc<FastPath>>,
    /// Worker 0: adds what the XDP program dropped for ports without a route.
    noroute: Option<Arc<NoRouteCount>>,
    /// Microseconds to keep polling the rings after work before sleeping (`VGATE_AFXDP_SPIN_US`).
    spin_us: u32,
    /// Sleep in `poll(2)`, which also kicks TX (`VGATE_AFXDP_WAIT`).
    sleep_in_poll: bool,
    /// Kick TX once this many frames wait, even while RX keeps coming (`VGATE_AFXDP_KICK_AT`).
    kick_at: u32,
}

static SEND_ERRORS: RateLimit = RateLimit::new(5000);

/// One afxdp worker: its sockets (one per RX queue it serves), the egress sockets, batches.
struct XskPath {
    ctx: WorkerCtx,
    socks: Vec<WorkerXsk>,
    local: EgressSockets,
    txb: SliceBatch,
    frames: Vec<RxFrame>,
    neigh: Neighbours,
    /// Split half: the link-face domain and this worker's sender on the outgoing link.
    link: Option<(DomainId, LinkTx)>,
}

impl Datapath for XskPath {
    fn register(&mut self, poller: &Poller) -> io::Result<()> {
        for (i, s) in self.socks.iter().enumerate() {
            poller.add(s.xsk.as_fd(), i as u64)?;
        }
        Ok(())
    }

    fn poll(&mut self, shell: &Shell) -> bool {
        let XskPath {
            ctx,
            socks,
            local,
            txb,
            frames,
            neigh,
            link,
        } = self;
        let mut busy = false;
        for i in 0..socks.len() {
            let n = socks[i].xsk.rx_batch(frames, RX_BATCH);
            if n == 0 {
                if socks[i].xsk.rx_needs_wakeup() && socks[i].xsk.mode == BindMode::ZeroCopy {
                    socks[i].xsk.wake_rx();
                }
                continue;
            }
            busy = true;
            let now = now_ms();
            let mut chan = [Tally::default(); 2];
            let egress = egress_sock(ctx, &socks[i]);
            match egress {
                Some(j) if j != i => {
                    let (rx, tx) = two_mut(socks, i, j);
                    let out = XdpOut {
                        xsk: &mut tx.xsk,
                        neigh,
                        ident: &IDENT,
                    };
                    forward_batch(
                        ctx,
                        rx,
                        frames,
                        local,
                        Out::Xdp(out),
                        link.as_mut(),
                        now,
                        &mut chan,
                    );
                    // Published now; the kernel is asked to send once the worker has
                    // nothing else to do (`idle`), or now if much is waiting.
                    tx.xsk.tx_publish();
                    if tx.xsk.tx_unkicked() >= ctx.kick_at {
                        kick(ctx.index, &mut tx.xsk);
                    }
                }
                _ => {
                    let s = &socks[i];
                    forward_batch(
                        ctx,
                        s,
                        frames,
                        local,
                        Out::Sockets(txb.scope()),
                        link.as_mut(),
                        now,
                        &mut chan,
                    );
                }
            }
            socks[i].xsk.recycle(frames);
            for c in Channel::ALL {
                if !chan[c.index()].is_empty() {
                    shell.stats.channel(c).add(&chan[c.index()]);
                }
            }
        }
        if !busy && ctx.spin_us > 0 {
            // Spinning: the worker does not sleep after this round, so `idle` would come
            // only after the spin.
            kick_waiting(ctx.index, socks);
        }
        busy
    }

    fn idle(&mut self, _shell: &Shell) {
        if !self.ctx.sleep_in_poll {
            kick_waiting(self.ctx.index, &mut self.socks);
            return;
        }
        // `poll(2)` sends at most POLL_TX_BUDGET frames per socket and then waits for RX
        // only: more than that, or what a stopped kick left, is asked for now.
        for s in self.socks.iter_mut() {
            if poll_needs_kick(s.xsk.tx_queued(), s.xsk.tx_stopped()) {
                kick(self.ctx.index, &mut s.xsk);
            }
        }
    }

    fn sleep_in_poll(&self) -> bool {
        self.ctx.sleep_in_poll
    }

    fn command(&mut self, _shell: &Shell, _poller: &Poller, cmd: Cmd) {
        self.local.apply(cmd);
    }

    fn spin_us(&self) -> u32 {
        self.ctx.spin_us
    }

    fn finish(&mut self, shell: &Shell) {
        if let Some(f) = &self.ctx.fast {
            f.finish(&shell.stats);
        }
        // The XDP drops up to now were added by the final `sample` just before this.
    }

    /// The wakeup's link frames go out together.
    fn flush(&mut self, _shell: &Shell) {
        if let Some((_, l)) = self.link.as_mut() {
            l.flush();
        }
    }

    fn sample(&mut self, shell: &Shell) {
        if let Some((_, l)) = self.link.as_mut() {
            l.idle(now_ms());
        }
        socket_stats(shell, &mut self.socks);
        if let Some(n) = &self.ctx.noroute {
            n.poll(shell);
        }
        if let Some(f) = &self.ctx.fast {
            f.poll(now_ms(), &shell.stats);
        }
        if self.ctx.tx_path == TxPath::Xdp {
            for s in self.socks.iter_mut() {
                s.xsk.reclaim();
            }
            // What a full device queue left on a ring is asked for again.
            kick_waiting(self.ctx.index, &mut self.socks);
            tx_health(shell, &self.ctx, &mut self.socks);
        }
    }
}

/// Asks the kernel to send what waits on `xsk`'s TX ring (a rate-limited warning when it
/// fails).
fn kick(worker: usize, xsk: &mut Xsk) {
    if let Err(e) = xsk.tx_kick() {
        if let Some(suppressed) = SEND_ERRORS.check(now_ms()) {
            tracing::warn!(worker, suppressed, "AF_XDP TX: {e}");
        }
    }
}

/// A worker about to sleep in `poll(2)`: whether a socket with `queued` TX frames waiting,
/// whose last kick `stopped` early, must be kicked first (the poll sends only
/// [`POLL_TX_BUDGET`], and nothing for a stopped device until RX wakes the worker).
fn poll_needs_kick(queued: u32, stopped: bool) -> bool {
    queued > POLL_TX_BUDGET || (queued > 0 && stopped)
}

static TX_STALLS: RateLimit = RateLimit::new(5000);

/// Per sample: frames the egress device dropped after a kick (`EBUSY`) move from the channel's
/// `tx_packets` to `drop_send_error` (per channel only, like the fast path's redirect
/// failures: the route is not known any more); a TX ring that kept frames with none taken
/// since the last sample (sends failing, e.g. the interface is down, or the poll-driven send
/// erroring unseen) counts a [`WorkerStats::ring_freezes`] and is logged (rate-limited).
///
/// [`WorkerStats::ring_freezes`]: crate::channel::WorkerStats::ring_freezes
fn tx_health(shell: &Shell, ctx: &WorkerCtx, socks: &mut [WorkerXsk]) {
    for (j, s) in socks.iter_mut().enumerate() {
        let busy = s.xsk.tx_busy_drops();
        let new = busy - s.busy_seen;
        if new > 0 {
            s.busy_seen = busy;
            let chan = [DomainId::A, DomainId::B]
                .into_iter()
                .find(|d| ctx.tx_sock[d.index()] == Some(j))
                .map_or(s.fallback, |d| Channel::from_ingress(d.other()));
            let c = shell.stats.channel(chan);
            c.drop(DropReason::SendError, new);
            // Counted sent when queued; never below zero.
            let _ = c
                .tx_packets
                .fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(new)));
        }
        if s.xsk.tx_stalled() {
            shell.stats.ring_freezes.fetch_add(1, Relaxed);
            if let Some(suppressed) = TX_STALLS.check(now_ms()) {
                tracing::warn!(
                    worker = ctx.index,
                    queue = s.queue,
                    waiting = s.xsk.tx_queued(),
                    suppressed,
                    "AF_XDP TX ring made no progress since the last sample (sends failing: interface down? device stalled?)"
                );
            }
        }
    }
}

/// [`kick`] for each socket with TX waiting.
fn kick_waiting(worker: usize, socks: &mut [WorkerXsk]) {
    for s in socks.iter_mut() {
        if s.xsk.tx_waiting() {
            kick(worker, &mut s.xsk);
        }
    }
}

/// `VGATE_AFXDP_KICK_AT` (1–2048): TX frames after which a busy worker kicks the kernel;
/// default [`TX_KICK_AT`]; 1 kicks after every RX batch (the behaviour before, for A/B).
fn kick_at_from_env() -> u32 {
    numeric_knob("VGATE_AFXDP_KICK_AT", TX_KICK_AT, 1, RING)
}

/// `VGATE_AFXDP_WAIT=poll|epoll`: how an idle worker sleeps (see
/// [`Datapath::sleep_in_poll`]); default [`WAIT_IN_POLL`].
fn sleep_in_poll_from_env() -> bool {
    match std::env::var("VGATE_AFXDP_WAIT").as_deref() {
        Ok("poll") => true,
        Ok("epoll") => false,
        Err(_) => WAIT_IN_POLL,
        Ok(v) => {
            knob_ignored("VGATE_AFXDP_WAIT", v, "poll|epoll; the default used");
            WAIT_IN_POLL
        }
    }
}

/// `VGATE_AFXDP_SPIN_US` (0–1000): how long a worker keeps polling its rings after work
/// before it sleeps; default [`SPIN_US`].
fn spin_from_env() -> u32 {
    numeric_knob("VGATE_AFXDP_SPIN_US", SPIN_US, 0, 1000)
}

/// The socket to transmit on for what arrives on `s`, in AF_XDP TX mode.
fn egress_sock(ctx: &WorkerCtx, s: &WorkerXsk) -> Option<usize> {
    if ctx.tx_path != TxPath::Xdp {
        return None;
    }
    match s.domains.as_slice() {
        [d] => ctx.tx_sock[d.other().index()],
        _ => None,
    }
}

fn two_mut<T>(v: &mut [T], i: usize, j: usize) -> (&mut T, &mut T) {
    if i < j {
        let (a, b) = v.split_at_mut(j);
        (&mut a[i], &mut b[0])
    } else {
        let (a, b) = v.split_at_mut(i);
        (&mut b[0], &mut a[j])
    }
}

/// `vgate_noroute`: what the XDP program dropped for ports of a media range without a route,
/// a per-CPU ARRAY indexed by the ingress domain, each value (packets, payload bytes). Worker
/// 0 adds the growth to its channel counters at each sample and at exit, so `no_route` and
/// `rx_packets` count these datagrams as they did when the workers received them.
struct NoRouteCount {
    map: Map,
    /// Per domain, (packets, bytes) already added, and the buffer a lookup reads the
    /// per-CPU values into (kept: no allocation per sample); only worker 0 polls.
    seen: Mutex<NoRouteSeen>,
}

/// Per domain, (packets, bytes) already added; the lookup buffer.
type NoRouteSeen = ([(u64, u64); 2], Vec<u8>);

impl NoRouteCount {
    fn create() -> io::Result<NoRouteCount> {
        Ok(NoRouteCount {
            map: Map::create(bpf::BPF_MAP_TYPE_PERCPU_ARRAY, 4, 16, 2, "vgate_noroute")?,
            seen: Mutex::new(([(0, 0); 2], Vec::new())),
        })
    }

    /// Per domain, (packets, bytes) so far, summed over CPUs; `buf` is resized once.
    fn read(&self, buf: &mut Vec<u8>) -> [(u64, u64); 2] {
        buf.resize(self.map.lookup_len(), 0);
        let mut out = [(0, 0); 2];
        for (d, o) in out.iter_mut().enumerate() {
            if self.map.lookup(&(d as u32).to_ne_bytes(), buf).is_ok() {
                *o = super::xdp::sum_cpus(buf);
            }
        }
        out
    }

    /// Adds what grew since the last poll to the channel of each ingress domain.
    fn poll(&self, shell: &Shell) {
        let mut guard = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let (seen, buf) = &mut *guard;
        let now = self.read(buf);
        for d in DomainId::ALL {
            let (p, b) = now[d.index()];
            let (sp, sb) = seen[d.index()];
            let new = p.saturating_sub(sp);
            if new == 0 {
                continue;
            }
            seen[d.index()] = (p, b);
            let mut t = Tally {
                rx_packets: new,
                rx_bytes: b.saturating_sub(sb),
                ..Tally::default()
            };
            t.drops[DropReason::NoRoute as usize] = new;
            shell.stats.channel(Channel::from_ingress(d)).add(&t);
        }
    }
}

/// Kernel drops per socket (RX ring full, no fill frames, invalid descriptors).
fn socket_stats(shell: &Shell, socks: &mut [WorkerXsk]) {
    for s in socks.iter_mut() {
        match s.xsk.stats() {
            Ok(st) => {
                let total = st.rx_dropped + st.rx_ring_full + st.rx_invalid_descs;
                let new = total.saturating_sub(s.dropped);
                if new > 0 {
                    s.dropped = total;
                    shell.stats.ring_drops.fetch_add(new, Relaxed);
                    shell
                        .stats
                        .channel(s.fallback)
                        .drop(DropReason::RxOverflow, new);
                }
            }
            Err(e) => tracing::warn!(worker = shell.index, queue = s.queue, "XDP_STATISTICS: {e}"),
        }
    }
}

/// IPv4 identification of the datagrams this gateway builds.
static IDENT: AtomicU16 = AtomicU16::new(1);

/// AF_XDP TX state borrowed for one batch.
struct XdpOut<'a> {
    xsk: &'a mut Xsk,
    neigh: &'a mut Neighbours,
    ident: &'static AtomicU16,
}

/// Where one batch's packets go.
enum Out<'a, 's, 'p> {
    Sockets(SliceScope<'s, 'p>),
    Xdp(XdpOut<'a>),
}

/// Forwards one RX batch of socket `s`; adds per-channel figures to `chan`.
#[allow(clippy::too_many_arguments)]
fn forward_batch<'p>(
    ctx: &WorkerCtx,
    s: &'p WorkerXsk,
    frames: &'p [RxFrame],
    local: &'p EgressSockets,
    mut out: Out<'_, '_, 'p>,
    mut link: Option<&mut (DomainId, LinkTx)>,
    now: u64,
    chan: &mut [Tally; 2],
) {
    let ts = crate::clock::wall_us();
    let mut run: Option<Run<'p>> = None;
    for f in frames {
        let data = s.xsk.frame(f);
        let d = match parse_udp4(data) {
            Ok(d) => d,
            Err(e) => {
                drop_frame(chan, s.fallback, data.len(), wire_reason(e));
                continue;
            }
        };
        let Some(channel) = classify(&ctx.targets, &s.domains, d.dst_addr, d.dst_port) else {
            // The XDP program redirects only our destinations' routed ports; this is its
            // guard.
            drop_frame(chan, s.fallback, d.payload.len(), DropReason::NoRoute);
            continue;
        };
        if !Run::continues(&run, channel, d.dst_port) {
            if let Some(r) = run.take() {
                finish_run(r, &mut out, now, chan);
            }
            run = Some(Run::start(&ctx.routes, local, channel, d.dst_port, now));
        }
        let Some(r) = run.as_mut() else { continue };
        // The UDP checksum is not checked: see the module doc.
        let ok = d.checksums_ok(true);
        let Some((dest, fd)) = r.admit(&d, ok, false, ctx.max_payload) else {
            continue;
        };
        if let Some((_, l)) = link.as_mut().filter(|(face, _)| *face == channel.egress()) {
            // Split half: the far side is the peer half, down the outgoing link.
            if let Some(route) = r.route.as_deref() {
                l.forward(route, d.payload, now, ts, &mut r.tally);
            }
            continue;
        }
        match &mut out {
            Out::Sockets(scope) => {
                if scope.is_full() {
                    let o = fd.send(scope, dest);
                    account(&mut r.tally, &o, r.route.as_deref());
                }
                scope.push(d.payload);
            }
            Out::Xdp(x) => {
                if let Some(route) = r.route.as_deref() {
                    xdp_send(ctx, x, channel, route, d.payload, fd, now, &mut r.tally);
                }
            }
        }
    }
    if let Some(r) = run.take() {
        finish_run(r, &mut out, now, chan);
    }
}

/// Builds Ethernet/IPv4/UDP around `payload` in a TX frame of the egress socket and queues
/// it; a destination without a resolved neighbour goes through the socket `fd`.
#[allow(clippy::too_many_arguments)]
fn xdp_send(
    ctx: &WorkerCtx,
    x: &mut XdpOut<'_>,
    channel: Channel,
    route: &StreamRoute,
    payload: &[u8],
    fd: TxVia<'_>,
    now: u64,
    t: &mut Tally,
) {
    let eg = channel.egress();
    let dst = *route.dest.ip();
    let mac = x.neigh.get(dst, ctx.egress_ifindex[eg.index()], now);
    let total = UDP4_FRAME_HEADERS + payload.len();
    let frame = if mac.is_some() && total <= x.xsk.tx_room() {
        x.xsk.tx_frame()
    } else {
        None
    };
    let (Some(mac), Some(mut f)) = (mac, frame) else {
        // Through the kernel: it resolves the neighbour (or the TX frames ran out).
        match fd.send_one(payload, route.dest) {
            Ok(n) => {
                t.tx_packets += 1;
                t.tx_bytes += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => t.drop(DropReason::QueueFull),
            Err(_) => t.drop(DropReason::SendError),
        }
        return;
    };
    let src = SocketAddrV4::new(ctx.targets[eg.index()].0, route.egress_port);
    let offload = x.xsk.tx_csum == TxCsum::Offload;
    let buf = x.xsk.tx_buf(&mut f);
    let b = &mut buf[..total];
    b[UDP4_FRAME_HEADERS..].copy_from_slice(payload);
    let ident = x.ident.fetch_add(1, Relaxed);
    let src_mac = ctx.src_mac[eg.index()];
    let csum = if offload {
        let ends = FrameEnds {
            dst_mac: mac,
            src_mac,
            src,
            dst: route.dest,
        };
        ends.write(b, ident, UdpChecksum::Offload(payload.len()));
        Some((UDP4_CSUM_START, UDP_CSUM_OFFSET))
    } else {
        write_udp4_frame(b, mac, src_mac, src, route.dest, ident);
        None
    };
    if x.xsk.tx_push(f, total as u32, csum) {
        t.tx_packets += 1;
        t.tx_bytes += payload.len() as u64;
    } else {
        // The TX ring is full: send what is queued and count this one as lost to it.
        let _ = x.xsk.tx_kick();
        t.drop(DropReason::QueueFull);
    }
}

/// Sends what a run queued (socket path), then closes the run (its figures to its route
/// and channel).
fn finish_run(mut r: Run<'_>, out: &mut Out<'_, '_, '_>, now: u64, chan: &mut [Tally; 2]) {
    if let (Some(dest), Some(fd), Out::Sockets(scope)) =
        (r.route.as_ref().map(|r| r.dest), r.egress, &mut *out)
    {
        let o = fd.send(scope, dest);
        account(&mut r.tally, &o, r.route.as_deref());
    }
    if let Out::Sockets(scope) = out {
        scope.clear();
    }
    r.close(now, chan);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_sleeping_in_poll_kicks_what_the_poll_would_leave() {
        assert!(!poll_needs_kick(0, false));
        assert!(!poll_needs_kick(0, true));
        assert!(
            !poll_needs_kick(POLL_TX_BUDGET, false),
            "the poll sends these"
        );
        assert!(poll_needs_kick(POLL_TX_BUDGET + 1, false));
        assert!(poll_needs_kick(1, true), "after a kick the device stopped");
    }

    #[test]
    fn numeric_knobs_clamp_and_default() {
        // A name no other test or run sets.
        const K: &str = "VGATE_AFXDP_TEST_KNOB_ZCFIX";
        std::env::remove_var(K);
        assert_eq!(numeric_knob(K, 32, 1, 2048), 32);
        std::env::set_var(K, "64");
        assert_eq!(numeric_knob(K, 32, 1, 2048), 64);
        std::env::set_var(K, "0");
        assert_eq!(numeric_knob(K, 32, 1, 2048), 1);
        std::env::set_var(K, "lots");
        assert_eq!(numeric_knob(K, 32, 1, 2048), 32);
        std::env::remove_var(K);
    }

    #[test]
    fn csum_offload_only_where_the_kernel_honours_it() {
        // 6.18 and later: every driver (the skb-zerocopy path handles metadata too).
        for d in [Some("virtio_net"), Some("veth"), Some("mlx5_core"), None] {
            assert_eq!(csum_offload_verdict(Some("6.18.0"), d), Ok(()));
            assert_eq!(csum_offload_verdict(Some("6.19.2-arch1-1"), d), Ok(()));
            assert_eq!(csum_offload_verdict(Some("7.0.0-rc1"), d), Ok(()));
        }
        // 6.11–6.17: veth only; virtio_net (IFF_TX_SKB_NO_LINEAR) and anything unknown sum in
        // software.
        assert_eq!(csum_offload_verdict(Some("6.11.0"), Some("veth")), Ok(()));
        assert_eq!(
            csum_offload_verdict(Some("6.17.9-fc"), Some("veth")),
            Ok(())
        );
        for d in [Some("virtio_net"), Some("e1000e"), None] {
            let why = csum_offload_verdict(Some("6.17.9"), d).unwrap_err();
            assert!(why.contains("IFF_TX_SKB_NO_LINEAR"), "{why}");
            assert!(csum_offload_verdict(Some("6.12.1"), d).is_err());
        }
        // Before 6.11 copy mode ignores TX metadata, whatever the driver.
        for r in ["6.10.14", "6.8.0-45-generic", "5.15.0"] {
            assert!(csum_offload_verdict(Some(r), Some("veth")).is_err(), "{r}");
        }
        // Unknown or unparsable version: software.
        assert!(csum_offload_verdict(None, Some("veth")).is_err());
        assert!(csum_offload_verdict(Some("garbage"), Some("veth")).is_err());
        assert_eq!(kernel_version("6.18.44-fc-v657"), Some((6, 18)));
        assert_eq!(kernel_version("6"), None);
    }

    #[test]
    fn program_jumps_land_inside_and_the_map_loads_are_pseudo() {
        let fast = FastFds {
            fwd: 9,
            stats: 10,
            devmap: 11,
            max_payload: 1400,
        };
        for with_fast in [None, Some(&fast)] {
            let p = xdp_program(
                7,
                8,
                12,
                &[
                    (Ipv4Addr::new(10, 0, 0, 1), 1, 20000, 20999),
                    (Ipv4Addr::new(10, 0, 0, 200), 2, 30000, 30999),
                ],
                with_fast,
            );
            for (i, insn) in p.iter().enumerate() {
                let class = insn.code & 0x07;
                if (class == 0x05 || class == 0x06) && insn.code != CALL && insn.code != EXIT {
                    let target = i as isize + 1 + insn.off as isize;
                    assert!(
                        target > i as isize && (target as usize) < p.len(),
                        "{i}: {insn:?}"
                    );
                }
            }
            let maps: Vec<i32> = p
                .iter()
                .filter(|i| i.code == LD_IMM64)
                .map(|i| {
                    assert_eq!(i.regs >> 4, PSEUDO_MAP_FD);
                    i.imm
                })
                .collect();
            let want = if with_fast.is_some() {
                vec![7, 9, 10, 11, 8, 12]
            } else {
                vec![7, 8, 12]
            };
            assert_eq!(maps, want);
            assert_eq!(p.last().map(|i| i.code), Some(EXIT));
        }
    }
}
