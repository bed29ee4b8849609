//! Mode `xdp`: the `afxdp` engine plus an in-kernel fast path. For a datagram whose gateway
//! port has a confirmed route, the XDP program itself checks the source, rewrites the
//! Ethernet, IPv4 and UDP headers and sends the frame out of the egress interface with
//! `XDP_REDIRECT` through a devmap — no user-space work per packet. Everything else goes the
//! `zc` way (AF_XDP to a worker, or the kernel), where it is forwarded or dropped with its
//! reason counter exactly as in mode `zc`.
//!
//! Owns: the fast-path part of the XDP program (`emit_fast`), its three maps
//! (`vgate_fwd`, `vgate_fstats`, `vgate_egress`) and keeping them in step with the stream
//! tables (`FastPath`); the redirect-failure watch (two tracepoint programs and `vgate_xerr`);
//! which egress interfaces are on the fast path (`fallback`: [`XdpStatus`]). Must not touch: the AF_XDP sockets and workers (`engine::afxdp`),
//! route decisions (a route is put on the fast path only in a state where
//! [`crate::channel::inspect`] would forward every packet the program forwards).
//!
//! # Why a mode of its own, not inside `zc`
//!
//! `zc` means "every routed frame reaches a user-space worker" (PF_RING ZC where built with
//! it, AF_XDP otherwise); the fast path changes what the workers see and what is counted
//! where (RTP sequence gaps are not counted for packets the kernel forwards, see below), and
//! it needs the egress interface to accept XDP redirects. An operator chooses that with
//! `--mode xdp`; `zc` stays as it was.
//!
//! # What the program forwards
//!
//! A frame takes the fast path only if all of these hold; otherwise it goes to the AF_XDP
//! socket of its RX queue as in `zc`: untagged Ethernet; IPv4 with a 20-byte header (no
//! options), a valid header checksum and no fragment bits (fragments already go to the
//! kernel); destination the
//! gateway's address in the interface's domain; the destination port has a route in the
//! ingress domain and a `vgate_fwd` entry marked active; the source matches the entry (the
//! route's latched source, or the `strict` expected address and port); the IPv4 total length
//! equals UDP length + 20 and the whole datagram is in the frame; a payload of 1 to
//! `engine.max_payload` bytes; the new IPv4 total length within the egress MTU.
//!
//! A route gets an active entry when it can be decided without user space: policy `any`, or
//! `strict` with an expected source, or `latch` once latched (the first packet goes through a
//! worker, which latches it; the next poll, at most 100 ms later, activates the entry — the
//! worker forwards in the meantime; a re-latch to another source after the latched one fell
//! silent is made by a worker the same way, and the next poll rewrites the entry — until then
//! the new source's packets take the slow path); not `rtp_only` routes (RTP parsing stays in user space),
//! nor routes that validate their media ([`crate::media`]: the program checks only headers
//! and the source, so such a route's packets all go to a worker, which validates each);
//! the egress interface faces only the egress domain; the next hop's MAC is known (from the
//! engine's neighbour resolver thread, [`super::neigh`], as the AF_XDP TX path: never a
//! netlink exchange on a worker; while unresolved the worker sends through its raw socket
//! ([`super::ports::RawUdp`]), which makes the kernel resolve it, and the entry becomes active at a later poll);
//! a free counter slot (of [`SLOTS`]).
//!
//! The rewrite: destination MAC (next hop), source MAC (egress interface), IPv4 source (the
//! gateway's egress address), destination (the route's), TTL 64 (the gateway originates the
//! datagram, as in the other modes), UDP ports (route's egress port → destination port);
//! the IPv4 and UDP checksums are updated incrementally (RFC 1624), a zero UDP checksum
//! (none) stays zero. A sender's checksum that its NIC was to fill in (veth with TX
//! checksum offload from a local socket) is not complete in XDP and stays incomplete: on the
//! namespace bed the senders' offload is turned off (`ethtool -K … tx off`).
//!
//! # Counters
//!
//! `vgate_fstats` is a per-CPU array of (packets, payload bytes) per route slot, added by the
//! program without atomics. Slots are handed out lowest first, so those in use stay packed low
//! after churn. Worker 0 reads the slots in use every 100 ms — in `BPF_MAP_LOOKUP_BATCH`
//! calls of 256 slots, skipping a block of 256 with none in use, so the poll's system calls do
//! not grow with the routes (one lookup per slot when batch lookups are refused: an older
//! kernel without them for per-CPU arrays, or a transient error; a batch is tried again every
//! 10 s); a poll that cannot read every slot counts nothing, its growth is counted by the next
//! one — and adds
//! the growth to the route's counters (rx and tx: a fast-path packet is received and sent)
//! and to its own channel counters, and marks the route seen (so idle timeouts see the
//! stream); a route removed is read once more at removal. RTP sequence gaps (`rtp_lost`) are
//! not counted for fast-path packets.
//!
//! # Redirects the kernel drops after the program
//!
//! `XDP_REDIRECT` hands the frame to the devmap; the kernel may still drop it: before it is
//! queued (egress down, frame over its MTU: tracepoint `xdp:xdp_redirect_err`) or when the
//! queue is flushed to the egress driver (`ndo_xdp_xmit` took fewer frames: on veth when the
//! peer of the egress end has neither an XDP program nor GRO, or its ring is full;
//! tracepoint `xdp:xdp_devmap_xmit`). Two raw-tracepoint programs (`vgate_xdperr`,
//! `vgate_xmiterr`, emitted here like the XDP program, attached through fds: detached when
//! vgate exits or dies) add those frames into `vgate_xerr`, a per-CPU array indexed by the
//! egress domain. Ours are told apart from other programs' by the devmap's id
//! (`xdp_redirect_err`) and, for `xdp_devmap_xmit`, by both `net_device`s it names: the
//! egress one (`to_dev`) must be one of ours and the receiving one (`from_dev`, whose XDP
//! program redirected) one carrying vgate's XDP program, each by ifindex and network
//! namespace inode (read with `bpf_probe_read_kernel` at offsets from the kernel's BTF,
//! [`super::btf`]); another program redirecting to the same egress from an interface
//! without vgate's program is not counted. Worker 0 reads `vgate_xerr` before the route counters at each poll and
//! counts the growth as `redirect_failed` on the channel leaving through that interface. A
//! failure shows up after the redirect it follows (at the flush that ends the driver's poll),
//! possibly in the next poll, so the channel counts fast-path frames as sent one poll later
//! (at once when no new ones came, and at exit), less the failures that arrived meanwhile
//! (their bytes at the mean payload size: the tracepoints give frame counts only). The
//! channel's `rx_packets` are counted at once. **Per route** the kernel does not say which
//! frames of a flush failed, so a route's `tx_packets` stays "handed to the egress by the
//! program"; the channel's figures are the honest ones. Loading the two programs needs
//! CAP_PERFMON (besides CAP_BPF) and a kernel with BTF; without either the engine runs, says
//! so once in the log and in its description, and those drops go uncounted.
//!
//! # An egress that takes no redirects
//!
//! An egress that drops what the program redirects to it would make a black hole that says
//! it is running; the engine keeps such an egress off the fast path (`fallback`), its
//! routes then without an active entry, forwarded by the AF_XDP path as in mode `zc`:
//!
//! - At start it asks the kernel (generic netlink family `netdev`, `xdp-features`) whether
//!   each egress interface takes redirected frames (`ndo_xdp_xmit`; on veth only while the
//!   peer has GRO on or an XDP program); one that does not starts off the fast path, with a
//!   warning and the reason in the engine's description. A kernel without the family
//!   (before 6.3) cannot say; the fast path then uses the egress.
//! - While running, worker 0's poll judges each egress's redirect failures (`vgate_xerr`)
//!   against the frames the program redirected to it, in windows of up to 1 024 frames or
//!   10 s: 8 failures that are at least half of the window's frames (or, at a window's end,
//!   any failures that are half of its frames) take it off the fast path — every active
//!   entry leaving by it is cleared, a rate-limited warning says why, the reason goes in the
//!   description, `vgate_xdp_egress_fallback_total` counts it. Transient refusals (a full
//!   ring under a burst: a few per cent) are counted `redirect_failed` and leave it on. What
//!   the kernel dropped before the verdict (some 100 to 200 ms of that egress's fast-path
//!   traffic, at least 8 frames) is counted `redirect_failed`, never sent.
//! - The way back: while off, the poll asks its xdp-features every second (one generic
//!   netlink exchange on worker 0). After they said "no `ndo_xdp_xmit`", a "yes" puts it
//!   back at once (veth whose peer got GRO or an XDP program again). When they say "yes"
//!   throughout (a driver whose features promise more than it does, an egress that was down,
//!   a kernel that cannot say), the fast path is tried again after 10 s, doubled after each
//!   try the kernel refuses again up to 640 s (each refused try costs about one poll of that
//!   egress's traffic, counted `redirect_failed`); a try that lasts a window resets the wait.

//! # Route changes
//!
//! [`PortHooks::route_added`](crate::routes::PortHooks::route_added) writes the entry at
//! once (one `bpf(2)` call; a next hop the resolver's table lacks costs this control-side call
//! one netlink exchange, and one still unresolved defers it to a later poll), `route_removed`
//! clears it before the port map stops sending the port to the sockets: a route change
//! reaches the next packet.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::{Arc, Mutex};

use super::btf::Btf;
use super::ebpf::*;
use super::neigh::Neighbours;
use super::sys::bpf::{self, Map, Prog, TpLink};
use crate::channel::WorkerStats;
use crate::config::{DomainId, SourcePolicy};
use crate::routes::{Channel, StreamRoute};
use crate::stats::{DropReason, Tally};

mod fallback;
mod program;
mod redirect;
use fallback::*;
pub use fallback::{egress_report, EgressStatus, XdpStatus};
pub(super) use program::{emit_fast, FastFds};
use redirect::*;

/// Counter slots of the fast path: active routes beyond this stay on the AF_XDP path.
pub const SLOTS: u32 = 16384;
/// `vgate_fwd` keys: domain index × 65 536 + port.
const FWD_KEYS: u32 = 2 * 65536;
/// Bytes of a `vgate_fwd` value (layout in [`FastValue::encode`]).
const VALUE: usize = 48;
/// Entry flags.
const ACTIVE: u32 = 1;
const CHECK_ADDR: u32 = 2;
const CHECK_PORT: u32 = 4;

/// `bpf_probe_read_kernel(dst, size, unsafe_ptr)`.
const HELPER_PROBE_READ_KERNEL: i32 = 113;

/// One `vgate_fwd` value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FastValue {
    flags: u32,
    /// Expected source (address, and port when `CHECK_PORT`).
    src: SocketAddrV4,
    mtu: u16,
    saddr: Ipv4Addr,
    daddr: Ipv4Addr,
    sport: u16,
    dport: u16,
    devkey: u32,
    slot: u32,
    dmac: [u8; 6],
    smac: [u8; 6],
}

impl FastValue {
    /// The layout the program reads: flags u32 @0, source address @4 and port @8 (network
    /// order), MTU u16 @10, new source @12 and destination @16 addresses, new source @20 and
    /// destination @22 ports (network order), devmap key u32 @24, counter slot u32 @28,
    /// next-hop MAC @32, egress MAC @38.
    fn encode(&self) -> [u8; VALUE] {
        let mut v = [0u8; VALUE];
        v[0..4].copy_from_slice(&self.flags.to_ne_bytes());
        v[4..8].copy_from_slice(&self.src.ip().octets());
        v[8..10].copy_from_slice(&self.src.port().to_be_bytes());
        v[10..12].copy_from_slice(&self.mtu.to_ne_bytes());
        v[12..16].copy_from_slice(&self.saddr.octets());
        v[16..20].copy_from_slice(&self.daddr.octets());
        v[20..22].copy_from_slice(&self.sport.to_be_bytes());
        v[22..24].copy_from_slice(&self.dport.to_be_bytes());
        v[24..28].copy_from_slice(&self.devkey.to_ne_bytes());
        v[28..32].copy_from_slice(&self.slot.to_ne_bytes());
        v[32..38].copy_from_slice(&self.dmac);
        v[38..44].copy_from_slice(&self.smac);
        v
    }
}

/// Where a channel's fast-path packets leave: the interface facing only the egress domain.
#[derive(Clone, Copy, Debug)]
pub(super) struct Egress {
    pub ifindex: u32,
    pub mac: [u8; 6],
    pub mtu: u32,
    /// The gateway's address in the egress domain.
    pub addr: Ipv4Addr,
}

/// The flags and expected source of a route's entry, or `None` while the route needs user
/// space for every packet (see the module doc).
fn entry_policy(route: &StreamRoute) -> Option<(u32, SocketAddrV4)> {
    // The program cannot validate media: a route with a media rule stays on the AF_XDP
    // path, where every packet is checked.
    if route.rtp_only || route.media.is_some() {
        return None;
    }
    let any = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0);
    match route.policy {
        SourcePolicy::Any => Some((ACTIVE, any)),
        SourcePolicy::Strict => route.expected.map(|e| {
            let port = if e.port() != 0 { CHECK_PORT } else { 0 };
            (ACTIVE | CHECK_ADDR | port, e)
        }),
        SourcePolicy::Latch => route
            .latched()
            .map(|s| (ACTIVE | CHECK_ADDR | CHECK_PORT, s)),
    }
}

/// A route the fast path knows.
struct Entry {
    route: Arc<StreamRoute>,
    slot: Option<u32>,
    /// Counter values already added to the route: (packets, bytes).
    seen: (u64, u64),
    /// What `vgate_fwd` holds for it, once active.
    value: Option<FastValue>,
}

struct FastState {
    entries: HashMap<(Channel, u16), Entry>,
    free: Slots,
    /// Next hops from the engine's resolver thread (attached when the engine starts; until
    /// then no entry becomes active).
    neigh: Option<Neighbours>,
    /// Figures of routes removed since the last poll, for worker 0's channel counters.
    flushed: [Tally; 2],
    /// Per-CPU read buffer.
    buf: Vec<u8>,
    /// Redirect failures per egress domain already counted.
    xerr_seen: [u64; 2],
    /// Per channel: fast-path frames (packets, bytes) redirected but not yet counted sent — a
    /// redirect's failure shows up after it (at the flush ending the driver's poll), so
    /// frames are confirmed sent one poll later, or at once when no new ones came.
    unconfirmed: [(u64, u64); 2],
    /// Per-CPU read buffer of `vgate_xerr`.
    xbuf: Vec<u8>,
    /// Per egress domain: its redirect failures judged (see `fallback`).
    judges: [Judge; 2],
    /// The poll's batch read of `vgate_fstats`: each slot's (packets, bytes) summed over
    /// CPUs, and the keys and per-CPU values of one `BPF_MAP_LOOKUP_BATCH`.
    sums: Vec<(u64, u64)>,
    bkeys: Vec<u8>,
    bvals: Vec<u8>,
    /// Batch lookups refused (an older kernel without them for per-CPU arrays, or a
    /// transient error such as ENOMEM): one lookup per slot instead, until `batch_retry`
    /// polls later, when a batch is tried again.
    no_batch: bool,
    batch_retry: u32,
    /// The refusal was logged (once per process run of the fast path, not every retry).
    batch_logged: bool,
}

/// Polls after a refused batch lookup before the poll tries one again (10 s).
const BATCH_RETRY: u32 = 100;

/// The counter slots not in use, lowest handed out first (so the slots in use stay packed
/// low after churn and the poll's reads stay short), and how many are in use per [`BATCH`]
/// block of slots (the poll skips a block with none). Control side and poll only.
struct Slots {
    free: BinaryHeap<Reverse<u32>>,
    in_block: Vec<u32>,
}

impl Slots {
    fn new() -> Slots {
        Slots {
            free: (0..SLOTS).map(Reverse).collect(),
            in_block: vec![0; (SLOTS as usize).div_ceil(BATCH)],
        }
    }

    /// The lowest free slot, now in use.
    fn take(&mut self) -> Option<u32> {
        let Reverse(s) = self.free.pop()?;
        self.in_block[s as usize / BATCH] += 1;
        Some(s)
    }

    /// `s` (from [`Slots::take`]) free again.
    fn put(&mut self, s: u32) {
        self.in_block[s as usize / BATCH] -= 1;
        self.free.push(Reverse(s));
    }

    /// Whether block `b` ([`BATCH`] slots from `b * BATCH`) may hold a slot in use (a
    /// block beyond the map is read, and fails there).
    fn block_used(&self, b: usize) -> bool {
        self.in_block.get(b).is_none_or(|&n| n > 0)
    }
}

/// Counter slots one `BPF_MAP_LOOKUP_BATCH` of the poll reads (16 bytes per possible CPU each).
const BATCH: usize = 256;

/// The fast path's maps and what they hold. Shared by the port hooks (route changes) and
/// worker 0 (counters, latches, neighbours); the lock is never taken per packet.
pub(super) struct FastPath {
    fwd: Map,
    stats: Map,
    devmap: Map,
    egress: [Option<Egress>; 2],
    /// Per egress domain: whether its interface is on the fast path, and why not (at start:
    /// its xdp-features; while running: its redirect failures); its routes then use the
    /// AF_XDP path.
    status: Arc<XdpStatus>,
    max_payload: u32,
    watch: Option<RedirectWatch>,
    /// What the redirect-failure watch could not attach (empty when it watches both).
    watch_missing: Vec<String>,
    state: Mutex<FastState>,
}

/// Why the fast path could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum XdpError {
    #[error("could not create BPF map {name}: {source}")]
    Map {
        name: &'static str,
        source: io::Error,
    },
    #[error("could not put interface {ifname:?} in the egress devmap: {source}; the driver must support XDP redirect (ndo_xdp_xmit)")]
    Devmap { ifname: String, source: io::Error },
}

static POLL_ERRORS: crate::logging::RateLimit = crate::logging::RateLimit::new(5000);

impl FastPath {
    /// Creates the maps; `egress[d]` is the interface facing only domain `d` (with its name),
    /// if there is one; `ingress` the interfaces vgate's XDP program is attached to.
    pub(super) fn new(
        egress: [Option<(String, Egress)>; 2],
        ingress: &[u32],
        max_payload: usize,
    ) -> Result<FastPath, XdpError> {
        let map = |t, k, v, n, name: &'static str| {
            Map::create(t, k, v, n, name).map_err(|source| XdpError::Map { name, source })
        };
        let fwd = map(
            bpf::BPF_MAP_TYPE_ARRAY,
            4,
            VALUE as u32,
            FWD_KEYS,
            "vgate_fwd",
        )?;
        let stats = map(bpf::BPF_MAP_TYPE_PERCPU_ARRAY, 4, 16, SLOTS, "vgate_fstats")?;
        let devmap = map(bpf::BPF_MAP_TYPE_DEVMAP, 4, 4, 2, "vgate_egress")?;
        for (d, e) in egress.iter().enumerate() {
            if let Some((name, e)) = e {
                devmap
                    .update(&(d as u32).to_ne_bytes(), &e.ifindex.to_ne_bytes())
                    .map_err(|source| XdpError::Devmap {
                        ifname: name.clone(),
                        source,
                    })?;
            }
        }
        let buf = vec![0u8; stats.lookup_len()];
        let slots: Vec<(u32, u32)> = egress
            .iter()
            .enumerate()
            .filter_map(|(d, e)| e.as_ref().map(|(_, e)| (d as u32, e.ifindex)))
            .collect();
        let (watch, watch_missing) = RedirectWatch::open(&devmap, &slots, ingress);
        match &watch {
            Some(w) if watch_missing.is_empty() => tracing::info!(
                programs = ?w.attached,
                "XDP redirect failures are counted (redirect_failed) from the kernel's xdp tracepoints"
            ),
            _ => tracing::warn!(
                "XDP redirect failures are not all counted: {}; a fast-path frame the kernel drops after the redirect is then counted as sent (loading tracepoint programs needs CAP_PERFMON and a kernel with BTF)",
                watch_missing.join("; ")
            ),
        }
        let xerr_seen = watch.as_ref().map_or([0; 2], |w| w.read(&mut Vec::new()));
        let status = Arc::new(XdpStatus::new(
            egress.clone().map(|e| e.map(|(name, _)| name)),
        ));
        let mut judges: [Judge; 2] = Default::default();
        let now = crate::clock::now_ms();
        for d in 0..2 {
            let (Some((name, e)), Some(s)) = (&egress[d], &status.egress[d]) else {
                continue;
            };
            if let Some(why) = redirects_refused(name, bpf::xdp_features(e.ifindex)) {
                s.set(Some(why));
                s.fallbacks
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                judges[d].fell(now, true);
            }
        }
        Ok(FastPath {
            fwd,
            stats,
            devmap,
            egress: egress.map(|e| e.map(|(_, e)| e)),
            status,
            max_payload: max_payload.min(65507) as u32,
            watch,
            watch_missing,
            state: Mutex::new(FastState {
                entries: HashMap::new(),
                free: Slots::new(),
                neigh: None,
                flushed: [Tally::default(); 2],
                buf,
                xerr_seen,
                unconfirmed: [(0, 0); 2],
                xbuf: Vec::new(),
                judges,
                sums: Vec::new(),
                bkeys: Vec::new(),
                bvals: Vec::new(),
                no_batch: false,
                batch_retry: 0,
                batch_logged: false,
            }),
        })
    }

    /// Next hops come from the engine's resolver from now on (a lookup is a read of its
    /// table; a miss is posted to it and retried at the next poll).
    pub(super) fn attach_neighbours(&self, n: Neighbours) {
        self.lock().neigh = Some(n);
    }

    pub(super) fn fds(&self) -> FastFds {
        FastFds {
            fwd: self.fwd.raw_fd(),
            stats: self.stats.raw_fd(),
            devmap: self.devmap.raw_fd(),
            max_payload: self.max_payload,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FastState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A route was installed: its entry becomes active now if it can.
    pub(super) fn added(&self, route: &Arc<StreamRoute>, now: u64) {
        let mut st = self.lock();
        let key = (route.channel, route.port);
        if let Some(old) = st.entries.remove(&key) {
            // Not expected (removal comes first), but never leave a slot behind.
            self.retire(&mut st, old);
        }
        st.entries.insert(
            key,
            Entry {
                route: Arc::clone(route),
                slot: None,
                seen: (0, 0),
                value: None,
            },
        );
        self.activate(&mut st, key, now, None);
        // The resolver's table lacks the next hop: ask the kernel here (control side), with
        // the lock released so worker 0's poll never waits behind a netlink exchange; then
        // activate with what it said (if the entry is still there and for that next hop).
        let Some((dst, ifindex)) = st
            .entries
            .get(&key)
            .filter(|e| e.value.is_none())
            .and_then(|e| self.next_hop_of(&e.route))
        else {
            return;
        };
        drop(st);
        let Some(mac) = super::neigh::resolve_next_hop(dst, ifindex) else {
            return;
        };
        let mut st = self.lock();
        self.activate(&mut st, key, now, Some((dst, ifindex, mac)));
    }

    /// The interface `channel`'s fast-path frames leave by: `None` when there is none, or it
    /// takes no XDP redirects.
    fn fast_egress(&self, channel: Channel) -> Option<Egress> {
        let d = channel.egress().index();
        let on = self.status.egress[d]
            .as_ref()
            .is_some_and(|s| s.on_fast_path());
        self.egress[d].filter(|_| on)
    }

    /// What [`Engine::describe`](super::Engine::describe) adds for egress interfaces off
    /// the fast path (empty when every one is on it).
    pub(super) fn refused_summary(&self) -> String {
        self.status
            .warnings()
            .iter()
            .map(|r| format!("; {r}"))
            .collect()
    }

    /// The egress interfaces as the control side sees them.
    pub(super) fn status(&self) -> Arc<XdpStatus> {
        Arc::clone(&self.status)
    }

    /// The (destination, egress ifindex) whose next hop `route` needs to be activated: `None`
    /// when it has no egress interface or is not decidable yet.
    fn next_hop_of(&self, route: &StreamRoute) -> Option<(Ipv4Addr, u32)> {
        let eg = self.fast_egress(route.channel)?;
        entry_policy(route)?;
        Some((*route.dest.ip(), eg.ifindex))
    }

    /// A route was removed: its entry goes first, then its last figures are counted.
    pub(super) fn removed(&self, route: &StreamRoute) {
        let mut st = self.lock();
        if let Some(e) = st.entries.remove(&(route.channel, route.port)) {
            self.retire(&mut st, e);
        }
    }

    fn retire(&self, st: &mut FastState, mut e: Entry) {
        if e.value.is_some() {
            self.write(e.route.channel, e.route.port, &[0u8; VALUE]);
        }
        if let Some(slot) = e.slot {
            let t = self.collect(st, &mut e, slot);
            st.flushed[e.route.channel.index()].merge(&t);
            st.free.put(slot);
        }
    }

    fn write(&self, channel: Channel, port: u16, value: &[u8; VALUE]) -> bool {
        let key = (channel.ingress().index() as u32) << 16 | u32::from(port);
        match self.fwd.update(&key.to_ne_bytes(), value) {
            Ok(()) => true,
            Err(e) => {
                if let Some(suppressed) = POLL_ERRORS.check(crate::clock::now_ms()) {
                    tracing::error!(port, suppressed, "could not update the XDP fast path: {e}");
                }
                false
            }
        }
    }

    /// The counters of `slot`, summed over CPUs.
    fn read(&self, buf: &mut [u8], slot: u32) -> Option<(u64, u64)> {
        self.stats.lookup(&slot.to_ne_bytes(), buf).ok()?;
        Some(sum_cpus(buf))
    }

    /// Adds the growth of `e`'s counters to its route; returns it.
    fn collect(&self, st: &mut FastState, e: &mut Entry, slot: u32) -> Tally {
        match self.read(&mut st.buf, slot) {
            Some(now) => grow(e, now),
            None => Tally::default(),
        }
    }

    /// Slots `0..hi` of `vgate_fstats`, summed over CPUs, into `st.sums` (zero for a block
    /// of [`BATCH`] slots with none in use, which is not read): one `BPF_MAP_LOOKUP_BATCH`
    /// per block read (one lookup per slot when batch lookups are refused). `false` when
    /// not all of them could be read (the poll then counts nothing this time; the growth is
    /// counted at the next poll that reads).
    fn read_slots(&self, st: &mut FastState, hi: u32) -> bool {
        let hi = hi as usize;
        st.sums.clear();
        let per = self.stats.lookup_len();
        if st.no_batch {
            st.batch_retry = st.batch_retry.saturating_sub(1);
            st.no_batch = st.batch_retry > 0;
        }
        if !st.no_batch {
            st.bkeys.resize(BATCH * 4, 0);
            st.bvals.resize(BATCH * per, 0);
            while st.sums.len() < hi {
                let from = st.sums.len();
                // Up to the end of `from`'s block (a short read leaves `from` inside one).
                let n = (BATCH - from % BATCH).min(hi - from);
                if !st.free.block_used(from / BATCH) {
                    st.sums.resize(from + n, (0, 0));
                    continue;
                }
                let after = (from as u32).wrapping_sub(1).to_ne_bytes();
                let r = self.stats.lookup_batch(
                    (from > 0).then_some(&after[..]),
                    &mut st.bkeys[..n * 4],
                    &mut st.bvals[..n * per],
                );
                match r {
                    Ok((got, _)) if got > 0 => {
                        for v in st.bvals[..got * per].chunks_exact(per) {
                            st.sums.push(sum_cpus(v));
                        }
                    }
                    Ok(_) => break,
                    Err(e) => {
                        if !st.batch_logged {
                            st.batch_logged = true;
                            tracing::info!(
                                "batch reads of the XDP counters refused ({e}): one read per \
                                 slot, batch tried again every {} s",
                                BATCH_RETRY / 10
                            );
                        }
                        st.no_batch = true;
                        st.batch_retry = BATCH_RETRY;
                        st.sums.clear();
                        break;
                    }
                }
            }
            if !st.no_batch {
                return st.sums.len() >= hi;
            }
        }
        for slot in 0..hi as u32 {
            if !st.free.block_used(slot as usize / BATCH) {
                st.sums.push((0, 0));
                continue;
            }
            let Some(v) = self.read(&mut st.buf, slot) else {
                st.sums.clear();
                return false;
            };
            st.sums.push(v);
        }
        true
    }
}

/// One slot's per-CPU (packets, bytes) values summed.
pub(super) fn sum_cpus(v: &[u8]) -> (u64, u64) {
    let mut sum = (0u64, 0u64);
    for c in v.chunks_exact(16) {
        let w = |i: usize| u64::from_ne_bytes(c[i..i + 8].try_into().unwrap_or_default());
        sum.0 += w(0);
        sum.1 += w(8);
    }
    sum
}

/// Adds the growth of `e`'s counters up to `(p, b)` to its route; returns it.
fn grow(e: &mut Entry, (p, b): (u64, u64)) -> Tally {
    let mut t = Tally::default();
    let (dp, db) = (p.wrapping_sub(e.seen.0), b.wrapping_sub(e.seen.1));
    e.seen = (p, b);
    if dp > 0 {
        t.rx_packets = dp;
        t.tx_packets = dp;
        t.rx_bytes = db;
        t.tx_bytes = db;
        e.route.stats.packets.add(&t);
    }
    t
}

impl FastPath {
    /// Makes `key`'s entry active if its route can be decided in the kernel now, or brings
    /// an active one's next hop up to date, with the next hop from the resolver's table, or
    /// else `resolved` (destination, ifindex, MAC) when it is for this route's next hop: what
    /// `added` asked the kernel on the control side, lock released, so a route with a known
    /// neighbour is in the kernel from its first packet. Never a netlink exchange itself.
    fn activate(
        &self,
        st: &mut FastState,
        key: (Channel, u16),
        now: u64,
        resolved: Option<(Ipv4Addr, u32, [u8; 6])>,
    ) {
        let FastState {
            entries,
            free,
            neigh,
            buf,
            ..
        } = st;
        if let Some(e) = entries.get_mut(&key) {
            self.activate_entry(e, free, neigh, buf, now, resolved);
        }
    }

    /// [`FastPath::activate`] for an entry at hand (the poll walks them all).
    fn activate_entry(
        &self,
        e: &mut Entry,
        free: &mut Slots,
        neigh: &mut Option<Neighbours>,
        buf: &mut [u8],
        now: u64,
        resolved: Option<(Ipv4Addr, u32, [u8; 6])>,
    ) {
        let route: &StreamRoute = &e.route;
        let Some(eg) = self.fast_egress(route.channel) else {
            return;
        };
        let Some((flags, src)) = entry_policy(route) else {
            return;
        };
        let dst = *route.dest.ip();
        let known = neigh.as_mut().and_then(|n| n.get(dst, eg.ifindex, now));
        let Some(dmac) = known.or_else(|| {
            resolved
                .filter(|r| r.0 == dst && r.1 == eg.ifindex)
                .map(|r| r.2)
        }) else {
            return;
        };
        let slot = match e.slot {
            Some(s) => s,
            None => {
                let Some(s) = free.take() else { return };
                let Some(base) = self.read(buf, s) else {
                    free.put(s);
                    return;
                };
                e.slot = Some(s);
                e.seen = base;
                s
            }
        };
        let v = FastValue {
            flags,
            src,
            mtu: eg.mtu.min(u32::from(u16::MAX)) as u16,
            saddr: eg.addr,
            daddr: *route.dest.ip(),
            sport: route.egress_port,
            dport: route.dest.port(),
            devkey: route.channel.egress().index() as u32,
            slot,
            dmac,
            smac: eg.mac,
        };
        if e.value != Some(v) && self.write(route.channel, route.port, &v.encode()) {
            e.value = Some(v);
        }
    }

    /// Worker 0, every 100 ms: counters of active routes into the routes and `stats`'s
    /// channels; routes that became decidable (latched, next hop resolved) made active.
    pub(super) fn poll(&self, now: u64, stats: &WorkerStats) {
        let mut st = self.lock();
        // Failures first: each one read here follows a redirect the counters below include.
        let failed = self.failures(&mut st);
        let mut chan = std::mem::take(&mut st.flushed);
        {
            let FastState {
                entries,
                free,
                neigh,
                buf,
                ..
            } = &mut *st;
            for e in entries.values_mut() {
                self.activate_entry(e, free, neigh, buf, now, None);
            }
        }
        // Every slot in use in one batch read (not one system call per route), then each
        // route's growth.
        let hi = st
            .entries
            .values()
            .filter_map(|e| e.slot)
            .max()
            .map_or(0, |s| s + 1);
        if hi > 0 && self.read_slots(&mut st, hi) {
            let FastState { entries, sums, .. } = &mut *st;
            for (key, e) in entries.iter_mut() {
                let Some(&now_counts) = e.slot.and_then(|s| sums.get(s as usize)) else {
                    continue;
                };
                let t = grow(e, now_counts);
                if t.rx_packets > 0 {
                    e.route.touch(now);
                }
                chan[key.0.index()].merge(&t);
            }
        }
        // Per egress: what the kernel refused of what the program sent there (this poll's
        // frames, before they are held for confirmation) takes it off the fast path.
        for c in Channel::ALL {
            let d = c.egress().index();
            self.judge_egress(&mut st, d, chan[c.index()].tx_packets, failed[d], now);
        }
        for c in Channel::ALL {
            let t = &mut chan[c.index()];
            let failed = failed[c.egress().index()];
            t.drops[DropReason::RedirectFailed as usize] += failed;
            let (sent, held) = confirm(
                st.unconfirmed[c.index()],
                (t.tx_packets, t.tx_bytes),
                failed,
            );
            (t.tx_packets, t.tx_bytes) = sent;
            st.unconfirmed[c.index()] = held;
        }
        drop(st);
        for c in Channel::ALL {
            if !chan[c.index()].is_empty() {
                stats.channel(c).add(&chan[c.index()]);
            }
        }
    }

    /// At exit (after the last poll): what is still unconfirmed is counted sent.
    pub(super) fn finish(&self, stats: &WorkerStats) {
        let mut st = self.lock();
        let failed = self.failures(&mut st);
        for c in Channel::ALL {
            let failed = failed[c.egress().index()];
            // With nothing new, everything held is confirmed (or failed).
            let (sent, _) = confirm(st.unconfirmed[c.index()], (0, 0), failed);
            st.unconfirmed[c.index()] = (0, 0);
            let mut t = Tally::default();
            t.drops[DropReason::RedirectFailed as usize] = failed;
            (t.tx_packets, t.tx_bytes) = sent;
            if !t.is_empty() {
                stats.channel(c).add(&t);
            }
        }
    }

    /// Growth of the redirect failures per egress domain since the last call.
    fn failures(&self, st: &mut FastState) -> [u64; 2] {
        let Some(w) = &self.watch else {
            return [0; 2];
        };
        let now = w.read(&mut st.xbuf);
        let mut out = [0; 2];
        for d in 0..2 {
            out[d] = now[d].saturating_sub(st.xerr_seen[d]);
            st.xerr_seen[d] = st.xerr_seen[d].max(now[d]);
        }
        out
    }

    /// How redirect failures are counted, for the engine's description.
    pub(super) fn watch_summary(&self) -> String {
        match &self.watch {
            Some(w) if self.watch_missing.is_empty() => {
                let tps: Vec<String> = w
                    .attached
                    .iter()
                    .map(|(tp, id)| format!("{tp}=prog{id}"))
                    .collect();
                format!("redirect failures counted on tracepoints {}", tps.join(" "))
            }
            _ => format!(
                "redirect failures NOT all counted ({})",
                self.watch_missing.join("; ")
            ),
        }
    }

    /// Routes whose packets the kernel forwards now.
    pub(super) fn active(&self) -> usize {
        self.lock()
            .entries
            .values()
            .filter(|e| e.value.is_some())
            .count()
    }
}

/// Takes `failed` frames off the redirected-but-unconfirmed ones — the older (`old`, from
/// earlier polls) first, then this poll's (`new`) — and returns (sent now, still held): the
/// old ones are confirmed sent (their failures would have shown by now); this poll's are held
/// for the next poll unless there are none. Bytes of failed frames are taken at the mean
/// payload size of the frames they are taken from (the tracepoints count frames only).
fn confirm(old: (u64, u64), new: (u64, u64), mut failed: u64) -> ((u64, u64), (u64, u64)) {
    let mut take = |(p, b): (u64, u64)| {
        let n = failed.min(p);
        failed -= n;
        let bytes = if n == p { b } else { b / p.max(1) * n };
        (p - n, b - bytes)
    };
    let old = take(old);
    let new = take(new);
    if new.0 == 0 {
        ((old.0, old.1 + new.1), (0, 0))
    } else {
        (old, new)
    }
}

/// The egress interface of each domain: the one facing it alone.
/// Why egress `name` takes no XDP redirects, from its xdp-features (`None` when it does, or
/// the kernel cannot say: then a refused redirect is still counted `redirect_failed`). Said
/// once in the log; the fast path leaves that egress alone, so its routes run on AF_XDP.
fn redirects_refused(name: &str, features: io::Result<u64>) -> Option<String> {
    match features {
        Ok(f) if f & bpf::XDP_ACT_NDO_XMIT == 0 => {
            let why = format!(
                "egress {name} takes no XDP redirects (its xdp-features lack ndo_xdp_xmit; on veth the peer needs GRO on or an XDP program): its routes use the AF_XDP path"
            );
            tracing::warn!(
                "{why}; the fast path takes it once its xdp-features say it takes redirects (checked every {} s)",
                CHECK_MS / 1000
            );
            Some(why)
        }
        Ok(_) => None,
        Err(e) => {
            tracing::info!(
                interface = name,
                "cannot tell whether the egress takes XDP redirects ({e}): the fast path uses it, and counts what the kernel drops there as redirect_failed"
            );
            None
        }
    }
}

pub(super) fn egress_of(
    ifaces: &[(String, Vec<DomainId>, Egress)],
) -> [Option<(String, Egress)>; 2] {
    [DomainId::A, DomainId::B].map(|d| {
        ifaces
            .iter()
            .find(|(_, doms, _)| doms.as_slice() == [d])
            .map(|(n, _, e)| (n.clone(), *e))
    })
}

#[cfg(test)]
mod tests;
