//! The `afpacket` engine: mode `tnapi` without PF_RING. One AF_PACKET ring (TPACKET_V2 by
//! default, V3 with `[engine.tnapi] ring = "v3"`) per RX queue of each domain interface, one
//! pinned worker per queue index.
//!
//! Owns: the rings (opened at build time, so a mode that cannot run fails before anything
//! else starts), the nftables table that keeps the kernel from also handling captured media,
//! and the worker loop. Must not touch: route decisions (that is [`crate::channel::inspect`])
//! or socket ownership (that is [`super::ports`]).
//!
//! # Layout
//!
//! Per distinct domain interface, `engine.queues` rings join one `PACKET_FANOUT_QM` group in
//! queue order, so ring *q* gets RX queue *q* (and *q + queues*, … when the NIC has more
//! queues than workers). Each ring carries a classic BPF filter that keeps only UDP to the
//! gateway's address and media port range of the domain(s) the interface faces. Worker *q*
//! reads ring *q* of every interface (two domains on one interface, e.g. `lo`, share one set
//! of rings; a packet's channel comes from its destination address and port range).
//!
//! # Ring version (`engine.tnapi.ring`)
//!
//! - `v2` (default): fixed 2 KiB frames (for 1500-byte MTUs), each visible to the worker as
//!   soon as the kernel wrote it. A wakeup takes every ready frame (up to a round's
//!   [`Geometry::budget`]), so batches grow with the load and nothing waits for a timer.
//! - `v3`: 4 KiB blocks of two full-size frames, handed over when full or after the kernel's
//!   1 ms block timer ([`BLOCK_TIMEOUT_MS`]): at moderate load a packet waits for the next
//!   one to fill its block, at a trickle for the timer (p50 180 µs against stack's 74 µs at
//!   20 streams, docs/bench-relay.md).
//!
//! In both, a "block" of the round is a V3 block or one V2 frame
//! ([`super::afpacket::Blocks`]); everything after the ring is the same.
//!
//! # Per packet
//!
//! `parse_udp4` → checksums (unless the ring says the NIC verified them, or a local sender
//! has not filled them in yet) → channel by destination → route by destination port (the
//! dashmap guard is held only for the lookup; consecutive packets for the same port reuse
//! the route without a second lookup) → [`crate::channel::inspect_mut`] (a stripping route's
//! payload rewritten in the ring block, which is mapped writable) → queued for sending.
//! Payloads are never copied in user space: a round takes up to [`Geometry::budget`] filled blocks from a ring
//! at once ([`PacketRing::try_blocks`]) and hands them back only after everything queued
//! from them was sent.
//!
//! # Sending (`VGATE_TNAPI_TX`, default `packet`)
//!
//! - `packet`: per egress interface, one packet socket with `PACKET_QDISC_BYPASS`; vgate
//!   builds Ethernet/IPv4/UDP headers in front of the ring's payload (source: the gateway's
//!   address and the route's egress port, TTL 64, DF; next-hop MAC from the kernel's route
//!   and neighbour tables, read by the engine's resolver thread ([`super::neigh`]) and
//!   looked up by the worker without a system call, as zc's AF_XDP TX does) and a
//!   `virtio_net_hdr` (`PACKET_VNET_HDR`) that leaves the UDP checksum to the device, or to
//!   the kernel just before the driver — what the kernel's own UDP sockets do. The whole
//!   round leaves with one `sendmmsg` per egress interface, whatever the routes (more only
//!   past `TX_FRAMES` frames): on the namespace bed at 20 streams that cut the worker's
//!   system calls from about 1.2 to about 0.55 per packet (two runs, docs/bench-relay.md). Like zc's, these
//!   frames skip the gateway's netfilter OUTPUT/POSTROUTING hooks and taps
//!   (`tcpdump` on the gateway does not see them; on the receiving side it does). A
//!   destination whose neighbour is not resolved yet, a payload larger than the egress
//!   MTU allows, and an interface without an Ethernet address (loopback) go through the
//!   worker's raw socket of the egress domain ([`super::ports::RawUdp`]: vgate writes the
//!   UDP header with the route's ports, the kernel adds the IPv4 header, routes, resolves
//!   the neighbour and fragments), one `sendmmsg` per run of packets for one route. The
//!   engine holds no socket per gateway port ([`super::ports::PortHold::Reserved`]).
//! - `sockets`: the route's gateway-port UDP socket (the registry then holds one per port),
//!   one `sendmmsg` per run of packets for one route.
//!
//! Counters: one [`Tally`] per route run (added to the route once, after the round's frames
//! were sent, with each frame counted as sent or dropped by what `sendmmsg` said of it) and
//! per round per channel (added to the worker once). Ring drops (`tp_drops`) are read every
//! 100 ms and counted as `rx_overflow`; ring freezes go to [`WorkerStats::ring_freezes`].
//!
//! # The kernel's copy
//!
//! A packet socket receives a *copy*; the kernel would still look the datagram up and answer
//! "port unreachable" or deliver it to the port's socket. At build time the engine installs
//! `inet vgate_<hash of interfaces, addresses and ranges>` ([`super::nft`]) dropping the media
//! ranges before routing (`prerouting`, before conntrack); a table of the same name left by a
//! crashed run is replaced. It is removed
//! when the engine is dropped (drop it in the network namespace it was built in).

use std::io;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use super::afpacket::{AfPacketError, DstMatch, PacketRing, RingParams, RingVersion};
use super::frames::Targets;
use super::neigh::NeighResolver;
use super::nft::{DropRule, MediaDropTable, NftError};
use super::ports::PortRegistry;
use super::sys::afxdp as xsys;
use super::sys::mmsg::SliceBatch;
use super::worker::{start_workers, EgressSockets, Shell};
use super::{Engine, EngineError, EngineKind, Worker};
use crate::config::split::SplitConfig;
use crate::config::{Config, DomainId, EngineConfig, TnapiRing};
use crate::engine::link::SplitStats;
use crate::engine::link::{HalfLinks, LinkFamily};
use crate::routes::{Channel, PortHooks, Routes};

/// Ring memory per ring: 24 MiB, to ride out a worker that the kernel's own receive work
/// (or anything else) keeps off its CPU for a while: in 4 KiB blocks of two full-size media
/// packets, about 12 000 packets (0.6 s at 20 streams).
pub const RING_BYTES: u32 = 24 << 20;
/// A partly filled block reaches the worker after at most this long (added latency bound;
/// the kernel counts it in whole milliseconds, so 1 is the floor).
pub const BLOCK_TIMEOUT_MS: u32 = 1;
/// Ring memory taken from one ring before looking at the next, so one busy interface cannot
/// starve the other.
pub const ROUND_BYTES: u32 = 256 << 10;

/// How the ring is cut into blocks (V2: frames) for datagrams of up to `max_payload` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub version: RingVersion,
    pub block_size: u32,
    pub block_count: u32,
    /// V2: the slot of one packet. V3: the kernel's accounting unit only.
    pub frame_size: u32,
    /// Blocks (V2: frames) taken from one ring per round.
    pub budget: usize,
}

impl Geometry {
    /// The geometry of a ring of version `ring`.
    pub fn for_ring(ring: TnapiRing, max_payload: usize) -> Geometry {
        match ring {
            TnapiRing::V3 => Geometry::for_payload(max_payload),
            TnapiRing::V2 => Geometry::v2_for_payload(max_payload),
        }
    }

    /// A V2 ring: frames of the smallest power of two that holds the largest frame the
    /// gateway takes (2 KiB for a 1472-byte payload), blocks of a page or one frame, the
    /// same ring memory and round size as V3.
    pub fn v2_for_payload(max_payload: usize) -> Geometry {
        // Per frame: TPACKET2 header + sockaddr_ll (TPACKET2_HDRLEN), the kernel's 16-byte
        // MAC headroom, Ethernet with a VLAN tag, IPv4 with options, UDP, the payload and
        // one byte to see truncation.
        let frame = (libc::TPACKET2_HDRLEN + 16 + 18 + 60 + 8 + max_payload + 1 + 15) & !15;
        let frame = frame.next_power_of_two() as u32;
        let page = super::sys::afpacket::page_size().max(4096) as u32;
        let block = frame.max(page);
        Geometry {
            version: RingVersion::V2,
            block_size: block,
            block_count: (RING_BYTES / block).max(2),
            frame_size: frame,
            budget: (ROUND_BYTES / frame).max(8) as usize,
        }
    }

    /// The smallest block (a power of two, at least a page) that holds two of the largest
    /// frames the gateway takes. The kernel hands a block over when it is full or after
    /// [`BLOCK_TIMEOUT_MS`], so small blocks bound the added latency at moderate load: at 20
    /// streams (19 000 packets/s) a 4 KiB block of two 1316-byte datagrams is handed over
    /// within about 100 µs, where a 32 KiB block (22 datagrams) waited for the 1 ms timer.
    /// Interleaved streams give runs of about one packet per route, so bigger blocks saved
    /// no `sendmmsg` calls there.
    pub fn for_payload(max_payload: usize) -> Geometry {
        // Per frame: TPACKET3 header + sockaddr_ll (TPACKET3_HDRLEN) and alignment, Ethernet
        // with a VLAN tag, IPv4 with options, UDP, the payload and one byte to see truncation.
        let frame = (libc::TPACKET3_HDRLEN + 16 + 18 + 60 + 8 + max_payload + 1 + 15) & !15;
        let page = super::sys::afpacket::page_size().max(4096);
        let block = (64 + 2 * frame).next_power_of_two().max(page) as u32;
        Geometry {
            version: RingVersion::V3,
            block_size: block,
            block_count: (RING_BYTES / block).max(2),
            frame_size: RingParams::default().frame_size.min(block),
            budget: (ROUND_BYTES / block).max(8) as usize,
        }
    }
}

/// A domain interface and the domains whose media arrive on it.
struct Iface {
    name: String,
    domains: Vec<DomainId>,
    rx_queues: Option<u32>,
    fanout_id: u16,
}

/// The AF_PACKET engine.
pub struct AfpacketEngine {
    cfg: EngineConfig,
    registry: Arc<PortRegistry>,
    ifaces: Vec<Iface>,
    /// `rings[q][i]`: ring `q` of `ifaces[i]`; handed to the workers by `start`.
    rings: Vec<Vec<PacketRing>>,
    targets: Targets,
    nft: Option<MediaDropTable>,
    /// A split half: the links and their counters.
    split: Option<(SplitConfig, Arc<SplitStats>)>,
    /// Per egress domain: its interface, when forwarded packets leave by a packet socket
    /// (see [`TxPath`]); `None` for the gateway's UDP sockets.
    tx_ifaces: [Option<TxIface>; 2],
    /// The neighbour resolver's table, once `start` runs one.
    neigh: Option<Arc<super::neigh::NeighTable>>,
}

/// How forwarded packets leave (`VGATE_TNAPI_TX`, for A/B benchmarks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxPath {
    /// Gateway-port UDP sockets, one `sendmmsg` per run of packets for one route.
    Sockets,
    /// One packet socket per egress interface (`PACKET_QDISC_BYPASS`), headers built by
    /// vgate, next hop from the neighbour table: one `sendmmsg` per round of ring blocks,
    /// whatever the routes.
    Packet,
}

impl TxPath {
    /// `VGATE_TNAPI_TX=packet|sockets`; the default is `packet`.
    pub fn from_env() -> TxPath {
        match std::env::var("VGATE_TNAPI_TX").as_deref() {
            Ok("sockets") => TxPath::Sockets,
            _ => TxPath::Packet,
        }
    }
}

/// An egress interface that takes frames built by vgate.
#[derive(Clone, Debug)]
struct TxIface {
    name: String,
    ifindex: u32,
    mac: [u8; 6],
    /// The largest UDP payload that fits its MTU unfragmented.
    max_udp: usize,
}

impl TxIface {
    /// `None` for an interface without an Ethernet address (loopback, tunnels): the kernel
    /// sends there.
    fn probe(name: &str) -> Option<TxIface> {
        let c = std::ffi::CString::new(name).ok()?;
        let mac = xsys::hw_addr(&c).ok()?;
        if mac == [0; 6] {
            return None;
        }
        Some(TxIface {
            name: name.to_owned(),
            ifindex: xsys::if_nametoindex(&c).ok()?,
            mac,
            max_udp: (xsys::mtu(&c).ok()? as usize).saturating_sub(28),
        })
    }
}

/// The nft instance name for `cfg`: a hash of what the table covers, so that a table left by
/// a crashed run of the same config is found and replaced.
pub fn instance_name(cfg: &Config) -> String {
    let mut key = String::new();
    for d in &cfg.domains {
        key.push_str(&format!("{}|{}|{}|", d.interface, d.address, d.media_ports));
    }
    // FNV-1a 64: stable across runs and builds (std's hasher is seeded per process).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

fn unavailable(e: AfPacketError) -> EngineError {
    EngineError::Afpacket(e)
}

impl AfpacketEngine {
    /// Opens the rings and installs the media drop table; fails with the reason when the
    /// mode cannot run here.
    pub fn new(cfg: &Config) -> Result<AfpacketEngine, EngineError> {
        let queues = cfg.engine.queues;
        let mut ifaces: Vec<Iface> = Vec::new();
        // A split half captures its real domain only: the link face has no wire (its media
        // comes from the incoming link's worker).
        let face = cfg.split.as_ref().map(|s| s.link_face());
        let captured = || cfg.domains.iter().filter(move |d| Some(d.id) != face);
        for d in captured() {
            match ifaces.iter_mut().find(|i| i.name == d.interface) {
                Some(i) => i.domains.push(d.id),
                None => ifaces.push(Iface {
                    name: d.interface.clone(),
                    domains: vec![d.id],
                    rx_queues: None,
                    fanout_id: 0,
                }),
            }
        }
        let targets: Targets = [
            (cfg.domains[0].address, cfg.domains[0].media_ports),
            (cfg.domains[1].address, cfg.domains[1].media_ports),
        ];
        let geometry = Geometry::for_ring(cfg.engine.tnapi_ring, cfg.engine.max_payload);
        let mut rings: Vec<Vec<PacketRing>> = (0..queues).map(|_| Vec::new()).collect();
        for iface in &mut ifaces {
            iface.rx_queues = PacketRing::rx_queues(&iface.name).map_err(unavailable)?;
            let have = iface.rx_queues.unwrap_or(1) as usize;
            if have < queues {
                return Err(EngineError::Queues {
                    ifname: iface.name.clone(),
                    have,
                    want: queues,
                });
            }
            let params = RingParams {
                version: geometry.version,
                block_size: geometry.block_size,
                block_count: geometry.block_count,
                frame_size: geometry.frame_size,
                block_timeout_ms: BLOCK_TIMEOUT_MS,
                filter: iface
                    .domains
                    .iter()
                    .map(|d| {
                        let (addr, r) = targets[d.index()];
                        DstMatch {
                            addr: Some(addr),
                            ports: r.first..=r.last,
                        }
                    })
                    .collect(),
            };
            let opened = PacketRing::open_queues(&iface.name, None, queues as u16, &params)
                .map_err(unavailable)?;
            iface.fanout_id = match opened.first() {
                Some(r) => r.fanout_id().map_err(unavailable)?,
                None => 0,
            };
            for (q, ring) in opened.into_iter().enumerate() {
                rings[q].push(ring);
            }
        }
        let rules: Vec<DropRule> = captured()
            .map(|d| DropRule {
                iface: d.interface.clone(),
                addr: Some(d.address),
                ports: d.media_ports.first..=d.media_ports.last,
            })
            .collect();
        let nft = MediaDropTable::install(&instance_name(cfg), &rules)?;
        let tx_iface = |i: usize| match TxPath::from_env() {
            TxPath::Packet if Some(cfg.domains[i].id) != face => {
                TxIface::probe(&cfg.domains[i].interface)
            }
            _ => None,
        };
        let tx_ifaces = [tx_iface(0), tx_iface(1)];
        Ok(AfpacketEngine {
            cfg: cfg.engine.clone(),
            registry: Arc::new(super::ring_registry(
                cfg,
                TxPath::from_env() == TxPath::Sockets,
            )?),
            ifaces,
            rings,
            targets,
            nft: Some(nft),
            split: cfg
                .split
                .as_ref()
                .map(|s| (s.clone(), Arc::new(SplitStats::new(s)))),
            tx_ifaces,
            neigh: None,
        })
    }
}

impl AfpacketEngine {
    fn tx_describe(&self) -> String {
        let by_packet: Vec<&str> = self
            .tx_ifaces
            .iter()
            .flatten()
            .map(|t| t.name.as_str())
            .collect();
        let sockets = match self.registry.hold() {
            super::ports::PortHold::Sockets => {
                format!("UDP sockets, sendmmsg batch {}", self.cfg.batch)
            }
            super::ports::PortHold::Reserved => format!(
                "a raw IPv4 socket per worker and egress domain (no socket per port), sendmmsg batch {}",
                self.cfg.batch
            ),
        };
        if by_packet.is_empty() {
            sockets
        } else {
            format!(
                "packet socket with qdisc bypass on {} (next hop from the neighbour table, one sendmmsg per round), else {sockets}",
                by_packet.join("+")
            )
        }
    }
}

impl Engine for AfpacketEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Afpacket
    }

    fn describe(&self) -> String {
        let q = self.cfg.queues;
        let ifaces: Vec<String> = self
            .ifaces
            .iter()
            .map(|i| {
                let doms: Vec<&str> = i.domains.iter().map(|d| d.name()).collect();
                let rxq = match i.rx_queues {
                    Some(n) => format!("{n} RX queue(s)"),
                    None => "1 RX queue (the driver reports none)".into(),
                };
                format!(
                    "{} (domain {}, {rxq}, fanout group {})",
                    i.name,
                    doms.join("+"),
                    i.fanout_id
                )
            })
            .collect();
        let workers: Vec<String> = (0..q)
            .map(|w| {
                let rxqs: Vec<String> = self
                    .ifaces
                    .iter()
                    .map(|i| {
                        let n = i.rx_queues.unwrap_or(1) as usize;
                        let list: Vec<String> =
                            (w..n).step_by(q.max(1)).map(|x| x.to_string()).collect();
                        format!("{}@{}", i.name, list.join(","))
                    })
                    .collect();
                let cpu = self
                    .cfg
                    .cpus
                    .get(w)
                    .map_or("unpinned".into(), |c| format!("CPU {c}"));
                format!("w{w} ring {w} ({}) on {cpu}", rxqs.join(" "))
            })
            .collect();
        let g = Geometry::for_ring(self.cfg.tnapi_ring, self.cfg.max_payload);
        let ring = match g.version {
            RingVersion::V3 => format!(
                "TPACKET_V3, {} x {} KiB blocks, {} ms block timeout",
                g.block_count,
                g.block_size / 1024,
                BLOCK_TIMEOUT_MS
            ),
            RingVersion::V2 => format!(
                "TPACKET_V2, {} x {} KiB frames, each handed over when written",
                g.block_size / g.frame_size * g.block_count,
                g.frame_size / 1024
            ),
        };
        format!(
            "mode tnapi, engine afpacket (AF_PACKET {ring}, fanout QM; egress {}); interfaces: {}; {} queue(s), workers: {}; nft table inet {} drops captured media before routing",
            self.tx_describe(),
            ifaces.join(", "),
            q,
            workers.join(", "),
            self.nft.as_ref().map_or("-", |t| t.table_name()),
        )
    }

    fn port_hooks(&self) -> Arc<dyn PortHooks> {
        Arc::clone(&self.registry) as Arc<dyn PortHooks>
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
        let n = self.cfg.queues;
        let per_queue = std::mem::take(&mut self.rings);
        if per_queue.len() != n {
            return Err(EngineError::Io {
                what: "starting the afpacket workers".into(),
                source: io::Error::other("the rings were already handed to workers"),
            });
        }
        let per_queue: Vec<Vec<WorkerRing>> = per_queue
            .into_iter()
            .map(|rings| {
                rings
                    .into_iter()
                    .zip(&self.ifaces)
                    .map(|(ring, iface)| WorkerRing {
                        ring,
                        domains: iface.domains.clone(),
                        fallback: Channel::from_ingress(iface.domains[0]),
                    })
                    .collect()
            })
            .collect();
        let mut per_queue = per_queue.into_iter();
        let (targets, batch, max_payload) = (self.targets, self.cfg.batch, self.cfg.max_payload);
        let mut links = match &self.split {
            Some((s, st)) => Some(HalfLinks::open(
                s,
                st,
                LinkFamily::of(EngineKind::Afpacket),
                n,
            )?),
            None => None,
        };
        let budget = Geometry::for_ring(self.cfg.tnapi_ring, max_payload).budget;
        let tx_ifaces = self.tx_ifaces.clone();
        // Next hops for the packet-socket transmit, resolved off the workers.
        let resolver = if tx_ifaces.iter().any(Option::is_some) {
            Some(
                NeighResolver::start(Arc::clone(&stop)).map_err(|source| EngineError::Io {
                    what: "starting the neighbour resolver thread".into(),
                    source,
                })?,
            )
        } else {
            None
        };
        self.neigh = resolver.as_ref().map(|r| Arc::clone(r.table()));
        // Each worker's raw sockets (ports without sockets), opened here so a refusal stops
        // the start.
        let mut raws = (0..n)
            .map(|_| self.registry.raw_senders())
            .collect::<io::Result<Vec<_>>>()
            .map_err(EngineError::Isolation)?
            .into_iter();
        let workers = start_workers(n, &self.cfg.cpus, &self.registry, &routes, &stop, |q| {
            let rings = per_queue.next().unwrap_or_default();
            let raw = raws.next().unwrap_or_default();
            let link = links.as_mut().and_then(|l| l.sender(q, batch));
            let tx_ifaces = tx_ifaces.clone();
            let neigh = resolver.as_ref().map(NeighResolver::handle);
            move |shell: &Shell| {
                let ptx: [Option<PacketTx>; 2] = std::array::from_fn(|i| {
                    let t = tx_ifaces[i].as_ref()?;
                    match PacketTx::open(t, targets[i].0, TX_FRAMES) {
                        Ok(p) => Some(p),
                        Err(e) => {
                            tracing::warn!(worker = shell.index, iface = %t.name, "packet socket for sending: {e}; sending through the UDP sockets");
                            None
                        }
                    }
                });
                Ok(RingPath {
                    budget,
                    rings,
                    local: EgressSockets::with_raw(raw),
                    tx: SliceBatch::new(batch),
                    ptx,
                    neigh,
                    pending: Vec::with_capacity(TX_FRAMES),
                    ident: 1,
                    targets,
                    max_payload,
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
            batch,
            max_payload,
        )
    }
}

impl Drop for AfpacketEngine {
    fn drop(&mut self) {
        if let Some(t) = self.nft.take() {
            let name = t.table_name().to_owned();
            if let Err(e) = t.remove() {
                tracing::error!("could not remove nft table inet {name}: {e}; remove it with `nft delete table inet {name}`");
            }
        }
    }
}

impl From<NftError> for EngineError {
    fn from(e: NftError) -> EngineError {
        EngineError::Nft(e)
    }
}

mod datapath;
use datapath::{PacketTx, RingPath, WorkerRing, TX_FRAMES};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_hold_two_of_the_largest_frames_and_the_ring_keeps_its_size() {
        for (payload, block) in [(1472, 4096), (64, 4096), (2000, 8192), (9000, 32768)] {
            let g = Geometry::for_ring(TnapiRing::V3, payload);
            assert_eq!(g.version, RingVersion::V3);
            assert_eq!(g.block_size, block, "max_payload {payload}");
            assert!(64 + 2 * (payload + 100) <= g.block_size as usize);
            assert_eq!(g.block_size * g.block_count, RING_BYTES);
            assert_eq!(g.budget * g.block_size as usize, ROUND_BYTES as usize);
            assert_eq!(g.block_size % g.frame_size, 0);
        }
    }

    #[test]
    fn v2_frames_hold_the_largest_frame_and_the_ring_keeps_its_size() {
        for (payload, frame) in [(1472, 2048), (64, 256), (2000, 4096), (9000, 16384)] {
            let g = Geometry::for_ring(TnapiRing::V2, payload);
            assert_eq!(g.version, RingVersion::V2);
            assert_eq!(g.frame_size, frame, "max_payload {payload}");
            // Header, headroom, Ethernet + VLAN, IPv4 with options, UDP, payload.
            assert!(libc::TPACKET2_HDRLEN + 16 + 18 + 60 + 8 + payload < frame as usize);
            assert_eq!(g.block_size % g.frame_size, 0);
            assert_eq!(g.block_size % 4096, 0);
            assert_eq!(g.block_size * g.block_count, RING_BYTES);
            assert_eq!(g.budget * g.frame_size as usize, ROUND_BYTES as usize);
        }
    }

    #[test]
    fn instance_names_follow_the_config() {
        let cfg = Config::embedded_default();
        let n = instance_name(&cfg);
        assert_eq!(n.len(), 16);
        assert_eq!(n, instance_name(&cfg), "stable");
        let mut other = cfg.clone();
        other.domains[1].media_ports.last -= 1;
        assert_ne!(n, instance_name(&other));
    }
}
