//! The `afpacket` engine: mode `tnapi` without PF_RING. One AF_PACKET TPACKET_V3 ring per RX
//! queue of each domain interface, one pinned worker per queue index.
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
//! # Per packet
//!
//! `parse_udp4` → checksums (unless the ring says the NIC verified them, or a local sender
//! has not filled them in yet) → channel by destination → route by destination port (the
//! dashmap guard is held only for the lookup; consecutive packets for the same port reuse
//! the route without a second lookup, within one block) → [`inspect`] → queued, as a slice of
//! the ring block, on a `sendmmsg` batch for the route's egress socket and destination.
//! A route run is sent when the next packet belongs to another route, when the batch is full,
//! and always before the block goes back to the kernel: payloads are never copied.
//!
//! Counters: one [`Tally`] per route run (added to the route once) and per block per channel
//! (added to the worker once). Ring drops (`tp_drops`) are read every 100 ms and counted as
//! `rx_overflow`; ring freezes go to [`WorkerStats::ring_freezes`].
//!
//! # The kernel's copy
//!
//! A packet socket receives a *copy*; the kernel would still look the datagram up and answer
//! "port unreachable" or deliver it to the port's socket. At build time the engine installs
//! `inet vgate_<hash of interfaces, addresses and ranges>` ([`super::nft`]) dropping the media
//! ranges at input; a table of the same name left by a crashed run is replaced. It is removed
//! when the engine is dropped (drop it in the network namespace it was built in).

use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use super::afpacket::{AfPacketError, DstMatch, PacketRing, RingParams};
use super::frames::{account, classify, drop_frame, wire_reason, Run, Targets};
use super::nft::{DropRule, MediaDropTable, NftError};
use super::ports::{Cmd, PortRegistry};
use super::sys::mmsg::{SliceBatch, SliceScope};
use super::worker::{apply_egress, start_workers, Datapath, EgressSockets, Poller, Shell};
use super::{Engine, EngineError, EngineKind, Worker};
use crate::clock::now_ms;
use crate::config::{Config, DomainId, EngineConfig};
use crate::routes::{Channel, PortHooks, Routes};
use crate::split::link::{HalfLinks, LinkFamily, LinkTx};
use crate::split::{SplitConfig, SplitStats};
use crate::stats::{DropReason, Tally};
use crate::wire::parse_udp4;

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

/// How the ring is cut into blocks for datagrams of up to `max_payload` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub block_size: u32,
    pub block_count: u32,
    /// Blocks taken from one ring per round.
    pub budget: usize,
}

impl Geometry {
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
            block_size: block,
            block_count: (RING_BYTES / block).max(2),
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
        let geometry = Geometry::for_payload(cfg.engine.max_payload);
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
                block_size: geometry.block_size,
                block_count: geometry.block_count,
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
                ..RingParams::default()
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
        Ok(AfpacketEngine {
            cfg: cfg.engine.clone(),
            registry: Arc::new(super::bound_registry(cfg)?),
            ifaces,
            rings,
            targets,
            nft: Some(nft),
            split: cfg
                .split
                .as_ref()
                .map(|s| (s.clone(), Arc::new(SplitStats::new(s)))),
        })
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
        let geometry = Geometry::for_payload(self.cfg.max_payload);
        format!(
            "mode tnapi, engine afpacket (AF_PACKET TPACKET_V3, fanout QM, {} x {} KiB blocks, {} ms block timeout; egress UDP sockets, sendmmsg batch {}); interfaces: {}; {} queue(s), workers: {}; nft table inet {} drops captured media at input",
            geometry.block_count,
            geometry.block_size / 1024,
            BLOCK_TIMEOUT_MS,
            self.cfg.batch,
            ifaces.join(", "),
            q,
            workers.join(", "),
            self.nft.as_ref().map_or("-", |t| t.table_name()),
        )
    }

    fn port_hooks(&self) -> Arc<dyn PortHooks> {
        Arc::clone(&self.registry) as Arc<dyn PortHooks>
    }

    fn split_stats(&self) -> Option<Arc<SplitStats>> {
        self.split.as_ref().map(|(_, s)| Arc::clone(s))
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
        let budget = Geometry::for_payload(max_payload).budget;
        let workers = start_workers(n, &self.cfg.cpus, &self.registry, &routes, &stop, |q| {
            let rings = per_queue.next().unwrap_or_default();
            let link = links.as_mut().and_then(|l| l.sender(q, batch));
            move |_: &Shell| {
                Ok(RingPath {
                    budget,
                    rings,
                    local: EgressSockets::new(),
                    tx: SliceBatch::new(batch),
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

struct WorkerRing {
    ring: PacketRing,
    /// Domains whose media arrive on this ring's interface.
    domains: Vec<DomainId>,
    /// The channel that counts what cannot be classified (malformed frames, ring drops).
    fallback: Channel,
}

/// One afpacket worker: ring *q* of every interface, and the egress sockets.
struct RingPath {
    /// Blocks taken from one ring per round.
    budget: usize,
    rings: Vec<WorkerRing>,
    local: EgressSockets,
    tx: SliceBatch,
    targets: Targets,
    max_payload: usize,
    /// Split half: the link-face domain and this worker's sender on the outgoing link.
    link: Option<(DomainId, LinkTx)>,
}

impl Datapath for RingPath {
    fn register(&mut self, poller: &Poller) -> io::Result<()> {
        for (i, r) in self.rings.iter().enumerate() {
            poller.add(r.ring.as_fd(), i as u64)?;
        }
        Ok(())
    }

    fn poll(&mut self, shell: &Shell) -> bool {
        let mut busy = false;
        for r in self.rings.iter_mut() {
            for _ in 0..self.budget {
                let Some(block) = r.ring.try_block() else {
                    break;
                };
                busy = true;
                let mut chan = [Tally::default(); 2];
                let now = now_ms();
                forward_block(
                    shell,
                    &self.targets,
                    self.max_payload,
                    &r.domains,
                    r.fallback,
                    block.frames(),
                    &self.local,
                    &mut self.tx,
                    self.link.as_mut(),
                    now,
                    &mut chan,
                );
                // The block goes back to the kernel only after every send of its payloads.
                drop(block);
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
        apply_egress(&mut self.local, cmd);
    }

    /// The wakeup's link frames go out together.
    fn flush(&mut self, _shell: &Shell) {
        if let Some((_, l)) = self.link.as_mut() {
            l.flush();
        }
    }

    /// Reads (and resets) the kernel's ring counters into the worker's figures.
    fn sample(&mut self, shell: &Shell) {
        if let Some((_, l)) = self.link.as_mut() {
            l.idle(now_ms());
        }
        for r in self.rings.iter_mut() {
            match r.ring.stats() {
                Ok(s) => {
                    if s.drops > 0 {
                        shell.stats.ring_drops.fetch_add(s.drops, Relaxed);
                        shell
                            .stats
                            .channel(r.fallback)
                            .drop(DropReason::RxOverflow, s.drops);
                    }
                    if s.freeze_q_cnt > 0 {
                        shell.stats.ring_freezes.fetch_add(s.freeze_q_cnt, Relaxed);
                    }
                }
                Err(e) => tracing::warn!(worker = shell.index, "{e}"),
            }
        }
    }
}

/// Forwards the frames of one block; adds per-channel figures to `chan`.
#[allow(clippy::too_many_arguments)]
fn forward_block<'b>(
    shell: &Shell,
    targets: &Targets,
    max_payload: usize,
    domains: &[DomainId],
    fallback: Channel,
    frames: impl Iterator<Item = super::afpacket::Frame<'b>>,
    local: &EgressSockets,
    tx: &mut SliceBatch,
    mut link: Option<&mut (DomainId, LinkTx)>,
    now: u64,
    chan: &mut [Tally; 2],
) {
    let ts = crate::split::link::now_us();
    let mut scope: SliceScope<'_, 'b> = tx.scope();
    let mut run: Option<Run<'_>> = None;
    for f in frames {
        let d = match parse_udp4(f.data) {
            Ok(d) => d,
            Err(e) => {
                drop_frame(chan, fallback, f.data.len(), wire_reason(e));
                continue;
            }
        };
        let Some(channel) = classify(targets, domains, d.dst_addr, d.dst_port) else {
            // The ring filter lets only our destinations through; this is its guard.
            drop_frame(chan, fallback, d.payload.len(), DropReason::NoRoute);
            continue;
        };
        if !Run::continues(&run, channel, d.dst_port) {
            if let Some(r) = run.take() {
                finish_run(r, &mut scope, now, chan);
            }
            run = Some(Run::start(&shell.routes, local, channel, d.dst_port, now));
        }
        let Some(r) = run.as_mut() else { continue };
        // The kernel vouches for checksums it validated or has not filled in yet (a local
        // sender's offload); otherwise both are checked.
        let skip_udp = f.status & (libc::TP_STATUS_CSUM_VALID | libc::TP_STATUS_CSUMNOTREADY) != 0;
        let ok = d.checksums_ok(skip_udp);
        let Some((dest, fd)) = r.admit(&d, ok, f.truncated(), max_payload) else {
            continue;
        };
        if let Some((_, l)) = link.as_mut().filter(|(face, _)| *face == channel.egress()) {
            // Split half: the far side is the peer half, down the outgoing link.
            if let Some(route) = r.route.as_deref() {
                l.forward(route, d.payload, now, ts, &mut r.tally);
            }
            continue;
        }
        if scope.is_full() {
            let out = scope.send(fd, dest);
            account(&mut r.tally, &out, r.route.as_deref());
        }
        scope.push(d.payload);
    }
    if let Some(r) = run.take() {
        finish_run(r, &mut scope, now, chan);
    }
}

/// Sends what a run queued, then closes the run (its figures to its route and channel).
fn finish_run(mut r: Run<'_>, scope: &mut SliceScope<'_, '_>, now: u64, chan: &mut [Tally; 2]) {
    if let (Some(dest), Some(fd)) = (r.route.as_ref().map(|r| r.dest), r.egress) {
        let out = scope.send(fd, dest);
        account(&mut r.tally, &out, r.route.as_deref());
    }
    scope.clear();
    r.close(now, chan);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_hold_two_of_the_largest_frames_and_the_ring_keeps_its_size() {
        for (payload, block) in [(1472, 4096), (64, 4096), (2000, 8192), (9000, 32768)] {
            let g = Geometry::for_payload(payload);
            assert_eq!(g.block_size, block, "max_payload {payload}");
            assert!(64 + 2 * (payload + 100) <= g.block_size as usize);
            assert_eq!(g.block_size * g.block_count, RING_BYTES);
            assert_eq!(g.budget * g.block_size as usize, ROUND_BYTES as usize);
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
