//! Link send and receive: the sockets of the two one-way links, the per-worker sender and
//! the receiving worker, and the link counters.
//!
//! **Outgoing link.** One UDP socket bound to our link address and tied to the link's
//! interface (`SO_BINDTODEVICE`); the peer's MAC from the config is installed as a
//! *permanent* neighbour entry before the first send, so the kernel never sends an ARP
//! request on the link. Every engine worker owns a [`LinkTx`] (its own FEC encoder, frame
//! slots and `sendmmsg` batch) over that shared socket: the worker pushes the datagrams of a
//! receive batch and flushes once per batch, so a batch of media costs one `sendmmsg` on
//! the link. The worker's lane number goes in the header, so the receiver keeps one FEC
//! state per sending worker and no worker ever waits for another.
//!
//! **Incoming link.** One UDP socket bound to our link address on the incoming link's
//! interface, read by its own pinned worker ([`HalfLinks::start_receiver`]) with `recvmmsg`. Each
//! datagram is checked (source = the configured peer, then the [`LinkPacket`] view), fed to
//! the [`Decoder`], and each datagram it yields is delivered to the link face as if it had
//! arrived from `(peer face, source port)` on gateway port `destination port`: route lookup,
//! [`crate::channel::inspect`] and the route's egress socket, exactly as a domain packet.
//! Delivery sends one datagram per `send_to` (a batched send is future work).
//!
//! What keeps the links one-way on the host (no ARP answers, no IPv6, no ICMP out of the
//! receive-only interface) is the host's interface setup, not this process: it must hold
//! while vgate is stopped or restarting too. See `scripts/split-bed.sh` (`harden_link`) and
//! the README's split section.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use nix::sys::socket::{setsockopt, sockopt};

use super::fec::{Decoder, DecoderCounts, Encoder, Fec, FRAME_CAP};
use super::header::{HeaderError, LinkPacket};
use super::{mac_string, LinkConfig, SplitConfig};
use crate::channel::{inspect, Admitted};
use crate::clock::now_ms;
use crate::config::DomainId;
use crate::engine::ports::{Cmd, PortRegistry};
use crate::engine::sys::mmsg::{RecvBatch, SliceBatch};
use crate::engine::worker::{apply_egress, spawn, Datapath, EgressSockets, Poller, Shell};
use crate::engine::{EngineError, Worker};
use crate::logging::RateLimit;
use crate::routes::{Channel, Routes, StreamRoute};
use crate::stats::{DropReason, Tally};

/// A partial FEC block older than this is closed (its repair frames sent) when the sender
/// goes quiet, so the tail of a burst is protected without waiting for more traffic.
pub const CLOSE_BLOCK_MS: u64 = 20;
/// A receiver block quiet this long counts what it never got as lost.
pub const SETTLE_MS: u64 = 500;
/// The incoming link's reorder window by default with FEC on: a datagram waits at most this
/// long for a missing earlier one to be rebuilt (`split.in_link.reorder_ms`; 0 hands
/// datagrams on as they arrive, the default with FEC off: a gap is then a loss, and waiting
/// for it only delays what follows). Long enough for the repair frames of a block closed
/// early ([`CLOSE_BLOCK_MS`]).
pub const DEFAULT_REORDER_MS: u64 = 25;
/// Receive batches read per wakeup before looking at commands again.
const BUDGET: usize = 8;
/// The incoming link socket's token in the worker's epoll set.
const LINK: u64 = 1;

/// Why a datagram on the incoming link was dropped before delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum LinkDrop {
    /// Not a vgate link packet (magic or kind).
    Garbage,
    /// Shorter than its header or than the length it claims.
    Truncated,
    /// Another link header version.
    BadVersion,
    /// FEC fields impossible, or not this link's setting.
    BadFec,
    /// No route on the gateway port it names.
    UnknownPort,
    /// From another address than the configured peer.
    ForeignSource,
    /// Longer than a link frame.
    Oversize,
}

impl LinkDrop {
    pub const COUNT: usize = 7;
    pub const ALL: [LinkDrop; Self::COUNT] = [
        LinkDrop::Garbage,
        LinkDrop::Truncated,
        LinkDrop::BadVersion,
        LinkDrop::BadFec,
        LinkDrop::UnknownPort,
        LinkDrop::ForeignSource,
        LinkDrop::Oversize,
    ];

    pub fn name(self) -> &'static str {
        match self {
            LinkDrop::Garbage => "garbage",
            LinkDrop::Truncated => "truncated",
            LinkDrop::BadVersion => "bad_version",
            LinkDrop::BadFec => "bad_fec",
            LinkDrop::UnknownPort => "unknown_port",
            LinkDrop::ForeignSource => "foreign_source",
            LinkDrop::Oversize => "oversize",
        }
    }

    fn from_header(e: HeaderError) -> LinkDrop {
        match e {
            HeaderError::Garbage => LinkDrop::Garbage,
            HeaderError::Truncated => LinkDrop::Truncated,
            HeaderError::BadVersion => LinkDrop::BadVersion,
            HeaderError::BadFec => LinkDrop::BadFec,
        }
    }
}

/// Counters of one link. Outgoing: `packets`/`bytes` sent (repair frames included),
/// `repair_packets`, `send_errors`. Incoming: the same for what arrived, then what the
/// decoder made of it and the drops by reason.
#[derive(Debug, Default)]
pub struct LinkCounters {
    pub packets: AtomicU64,
    pub bytes: AtomicU64,
    pub repair_packets: AtomicU64,
    pub send_errors: AtomicU64,
    /// Incoming: datagrams handed to the link face as received.
    pub delivered: AtomicU64,
    /// Incoming: datagrams rebuilt by FEC.
    pub repaired: AtomicU64,
    /// Incoming: datagrams lost on the link and not rebuilt.
    pub lost: AtomicU64,
    pub late: AtomicU64,
    pub duplicate: AtomicU64,
    /// Incoming: times a sending lane started over (the peer half restarted).
    pub restarts: AtomicU64,
    /// Incoming, the reorder window: datagrams that waited for an earlier one, positions
    /// given up, datagrams handed on after their gap was given up.
    pub reorder_held: AtomicU64,
    pub reorder_expired: AtomicU64,
    pub reorder_overtaken: AtomicU64,
    pub drops: [AtomicU64; LinkDrop::COUNT],
}

/// A point-in-time copy of [`LinkCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LinkSnapshot {
    pub packets: u64,
    pub bytes: u64,
    pub repair_packets: u64,
    pub send_errors: u64,
    pub delivered: u64,
    pub repaired: u64,
    pub lost: u64,
    pub late: u64,
    pub duplicate: u64,
    pub restarts: u64,
    pub reorder_held: u64,
    pub reorder_expired: u64,
    pub reorder_overtaken: u64,
    pub drops: [u64; LinkDrop::COUNT],
}

impl LinkSnapshot {
    pub fn drop_count(&self, r: LinkDrop) -> u64 {
        self.drops[r as usize]
    }
}

impl LinkCounters {
    pub fn snapshot(&self) -> LinkSnapshot {
        let mut drops = [0; LinkDrop::COUNT];
        for (d, a) in drops.iter_mut().zip(&self.drops) {
            *d = a.load(Relaxed);
        }
        LinkSnapshot {
            packets: self.packets.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            repair_packets: self.repair_packets.load(Relaxed),
            send_errors: self.send_errors.load(Relaxed),
            delivered: self.delivered.load(Relaxed),
            repaired: self.repaired.load(Relaxed),
            lost: self.lost.load(Relaxed),
            late: self.late.load(Relaxed),
            duplicate: self.duplicate.load(Relaxed),
            restarts: self.restarts.load(Relaxed),
            reorder_held: self.reorder_held.load(Relaxed),
            reorder_expired: self.reorder_expired.load(Relaxed),
            reorder_overtaken: self.reorder_overtaken.load(Relaxed),
            drops,
        }
    }

    /// Publishes the decoder's cumulative counts (single writer: the receive worker).
    fn publish(&self, c: &DecoderCounts) {
        self.repair_packets.store(c.repair_frames, Relaxed);
        self.delivered.store(c.delivered, Relaxed);
        self.repaired.store(c.repaired, Relaxed);
        self.lost.store(c.lost, Relaxed);
        self.late.store(c.late, Relaxed);
        self.duplicate.store(c.duplicate, Relaxed);
        self.restarts.store(c.restarts, Relaxed);
        self.reorder_held.store(c.reorder.held, Relaxed);
        self.reorder_expired.store(c.reorder.expired, Relaxed);
        self.reorder_overtaken.store(c.reorder.overtaken, Relaxed);
    }
}

/// Both links of a half, for stats, the admin API and metrics.
#[derive(Debug)]
pub struct SplitStats {
    pub half: super::Half,
    pub out_fec: Option<Fec>,
    pub in_fec: Option<Fec>,
    pub out_link: LinkCounters,
    pub in_link: LinkCounters,
    out_if: String,
    in_if: String,
    /// The interfaces' counters when this half started: wrong-direction figures are counted
    /// from then.
    wrong_base: (Option<u64>, Option<u64>),
}

/// A counter of an interface from sysfs (`rx_packets`, `tx_packets`); `None` when unreadable.
fn if_counter(ifname: &str, what: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/sys/class/net/{ifname}/statistics/{what}"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

impl SplitStats {
    pub fn new(cfg: &SplitConfig) -> SplitStats {
        let (out_if, in_if) = (
            cfg.out_link.interface.clone(),
            cfg.in_link.interface.clone(),
        );
        SplitStats {
            half: cfg.half,
            out_fec: cfg.out_link.fec,
            in_fec: cfg.in_link.fec,
            out_link: LinkCounters::default(),
            in_link: LinkCounters::default(),
            wrong_base: (
                if_counter(&out_if, "rx_packets"),
                if_counter(&in_if, "tx_packets"),
            ),
            out_if,
            in_if,
        }
    }

    /// Packets that travelled a one-way link the wrong way since start, as the interfaces
    /// count them: received on the outgoing link's interface, and sent on the incoming
    /// link's interface (by anything on this host). Both must stay 0; `None` when the
    /// interface counters cannot be read. Read on the control side, never per packet.
    pub fn wrong_direction(&self) -> (Option<u64>, Option<u64>) {
        let since = |base: Option<u64>, now: Option<u64>| Some(now?.saturating_sub(base?));
        (
            since(self.wrong_base.0, if_counter(&self.out_if, "rx_packets")),
            since(self.wrong_base.1, if_counter(&self.in_if, "tx_packets")),
        )
    }

    /// One `link name=out|in key=value ...` line per link (the shutdown totals).
    pub fn report(&self) -> String {
        let mut s = String::new();
        for (name, c) in [("out", &self.out_link), ("in", &self.in_link)] {
            let v = c.snapshot();
            s.push_str(&format!(
                "link name={name} half={} packets={} bytes={} repair_packets={} send_errors={} delivered={} repaired={} lost={} late={} duplicate={} restarts={} reorder_held={} reorder_expired={} reorder_overtaken={}",
                self.half, v.packets, v.bytes, v.repair_packets, v.send_errors, v.delivered, v.repaired, v.lost, v.late, v.duplicate, v.restarts, v.reorder_held, v.reorder_expired, v.reorder_overtaken
            ));
            for r in LinkDrop::ALL {
                s.push_str(&format!(" drop_{}={}", r.name(), v.drop_count(r)));
            }
            let wrong = if name == "out" {
                self.wrong_direction().0
            } else {
                self.wrong_direction().1
            };
            if let Some(w) = wrong {
                s.push_str(&format!(" wrong_direction={w}"));
            }
            s.push('\n');
        }
        s
    }

    /// JSON for `/api/v1/stats` and `vgate stats`.
    pub fn to_json(&self) -> serde_json::Value {
        let fec = |f: Option<Fec>| f.map(|f| f.to_string()).unwrap_or_else(|| "off".into());
        let link = |c: &LinkCounters, f: Option<Fec>| {
            let s = c.snapshot();
            let mut drops = serde_json::Map::new();
            for r in LinkDrop::ALL {
                drops.insert(r.name().into(), s.drop_count(r).into());
            }
            serde_json::json!({
                "fec": fec(f), "packets": s.packets, "bytes": s.bytes,
                "repair_packets": s.repair_packets, "send_errors": s.send_errors,
                "delivered": s.delivered, "repaired": s.repaired, "lost": s.lost,
                "late": s.late, "duplicate": s.duplicate, "restarts": s.restarts,
                "reorder_held": s.reorder_held, "reorder_expired": s.reorder_expired,
                "reorder_overtaken": s.reorder_overtaken,
                "drops": drops,
            })
        };
        let (wrong_out, wrong_in) = self.wrong_direction();
        let mut out = link(&self.out_link, self.out_fec);
        out["wrong_direction"] = wrong_out.into();
        let mut inl = link(&self.in_link, self.in_fec);
        inl["wrong_direction"] = wrong_in.into();
        serde_json::json!({
            "half": self.half.name(),
            "out_link": out,
            "in_link": inl,
        })
    }
}

/// A per-start value for the link header's epoch: a restarted sender is told apart. From the
/// OS's randomness like every other identifier vgate makes (a time-seeded value repeats).
pub fn new_epoch() -> u16 {
    let mut b = [0u8; 2];
    // Without randomness the SIP/RTSP proxies refuse to start; here an epoch of 0 only makes
    // a restart look like the same sender until its sequence numbers say otherwise.
    let _ = getrandom::fill(&mut b);
    u16::from_ne_bytes(b)
}

/// Microseconds of the wall clock, wrapping (the link header's timestamp).
pub fn now_us() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u32)
        .unwrap_or(0)
}

fn io_err(what: String) -> impl FnOnce(io::Error) -> EngineError {
    move |source| EngineError::Io { what, source }
}

fn bind_on(local: SocketAddrV4, ifname: &str, what: &str) -> Result<UdpSocket, EngineError> {
    let sock = UdpSocket::bind(local).map_err(io_err(format!(
        "{what}: cannot bind {local} (is the address configured on {ifname}?)"
    )))?;
    setsockopt(
        &sock,
        sockopt::BindToDevice,
        &std::ffi::OsString::from(ifname),
    )
    .map_err(|e| EngineError::Io {
        what: format!("{what}: cannot tie the socket to interface {ifname}"),
        source: e.into(),
    })?;
    sock.set_nonblocking(true)
        .map_err(io_err(format!("{what}: non-blocking")))?;
    Ok(sock)
}

/// Installs the outgoing link's permanent neighbour entry and opens its socket.
pub fn open_outgoing(cfg: &LinkConfig) -> Result<Arc<UdpSocket>, EngineError> {
    if let Some(mac) = &cfg.peer_mac {
        let out = std::process::Command::new("ip")
            .args([
                "neigh",
                "replace",
                &cfg.peer.ip().to_string(),
                "lladdr",
                &mac_string(mac),
                "dev",
                &cfg.interface,
                "nud",
                "permanent",
            ])
            .output()
            .map_err(io_err(
                "outgoing link: cannot run `ip neigh` (install iproute2)".into(),
            ))?;
        if !out.status.success() {
            return Err(EngineError::Io {
                what: format!(
                    "outgoing link: `ip neigh replace {} lladdr {} dev {} nud permanent` failed ({}); vgate needs CAP_NET_ADMIN and the interface must exist",
                    cfg.peer.ip(),
                    mac_string(mac),
                    cfg.interface,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
                source: io::Error::other("ip neigh failed"),
            });
        }
    }
    let sock = bind_on(cfg.local, &cfg.interface, "outgoing link")?;
    let _ = setsockopt(&sock, sockopt::SndBuf, &(4usize << 20));
    Ok(Arc::new(sock))
}

/// Opens the incoming link's socket.
pub fn open_incoming(cfg: &LinkConfig) -> Result<UdpSocket, EngineError> {
    let sock = bind_on(cfg.local, &cfg.interface, "incoming link")?;
    let _ = setsockopt(&sock, sockopt::RcvBuf, &(8usize << 20));
    let _ = setsockopt(&sock, sockopt::RxqOvfl, &1);
    Ok(sock)
}

static LINK_SEND_ERRORS: RateLimit = RateLimit::new(5000);

/// One worker's sender on the outgoing link.
pub struct LinkTx {
    sock: Arc<UdpSocket>,
    peer: SocketAddrV4,
    enc: Encoder,
    batch: SliceBatch,
    stats: Arc<SplitStats>,
    block_opened_ms: u64,
    repair_published: u64,
}

impl LinkTx {
    pub fn new(
        sock: Arc<UdpSocket>,
        cfg: &LinkConfig,
        lane: u8,
        epoch: u16,
        batch: usize,
        stats: Arc<SplitStats>,
    ) -> LinkTx {
        let slots = batch.max(cfg.fec.map(|f| usize::from(f.k + f.m)).unwrap_or(0));
        LinkTx {
            sock,
            peer: cfg.peer,
            enc: Encoder::new(lane, epoch, cfg.fec, batch),
            batch: SliceBatch::new(slots),
            stats,
            block_opened_ms: 0,
            repair_published: 0,
        }
    }

    /// Queues one datagram for gateway port `dst` of the peer, sent from our egress port
    /// `src`; frames go out when a block or batch is full, and at [`LinkTx::flush`].
    /// `false` when it does not fit a link frame (the caller counts it as oversize).
    pub fn push(&mut self, dst: u16, src: u16, payload: &[u8], now_ms: u64, ts_us: u32) -> bool {
        if self.enc.must_flush() {
            self.flush();
        }
        let opened = self.enc.block_open();
        if !self.enc.push(dst, src, payload, ts_us) {
            return false;
        }
        if !opened {
            self.block_opened_ms = now_ms;
        }
        if self.enc.must_flush() {
            self.flush();
        }
        true
    }

    /// [`LinkTx::push`] for an engine's worker: one admitted datagram of a route, counted in
    /// the route's tally as sent, or dropped as oversize.
    pub fn forward(
        &mut self,
        route: &StreamRoute,
        payload: &[u8],
        now_ms: u64,
        ts_us: u32,
        t: &mut Tally,
    ) {
        if self.push(route.dest.port(), route.egress_port, payload, now_ms, ts_us) {
            t.tx_packets += 1;
            t.tx_bytes += payload.len() as u64;
        } else {
            t.drop(DropReason::Oversize);
        }
    }

    /// Sends every frame written and not yet sent.
    pub fn flush(&mut self) {
        let mut sent = 0u64;
        let mut bytes = 0u64;
        let mut failed = 0u64;
        let mut last_error = None;
        {
            let mut scope = self.batch.scope();
            for f in self.enc.ready() {
                if !scope.push(f) {
                    let out = scope.send(self.sock.as_fd(), self.peer);
                    sent += out.sent as u64;
                    bytes += out.sent_bytes as u64;
                    failed += (out.queue_full + out.errors) as u64;
                    last_error = out.last_error.or(last_error);
                    scope.push(f);
                }
            }
            let out = scope.send(self.sock.as_fd(), self.peer);
            sent += out.sent as u64;
            bytes += out.sent_bytes as u64;
            failed += (out.queue_full + out.errors) as u64;
            last_error = out.last_error.or(last_error);
        }
        self.enc.mark_sent();
        let c = &self.stats.out_link;
        if sent > 0 {
            c.packets.fetch_add(sent, Relaxed);
            c.bytes.fetch_add(bytes, Relaxed);
        }
        if self.enc.repair_out != self.repair_published {
            c.repair_packets
                .fetch_add(self.enc.repair_out - self.repair_published, Relaxed);
            self.repair_published = self.enc.repair_out;
        }
        if failed > 0 {
            c.send_errors.fetch_add(failed, Relaxed);
            if let Some(code) = last_error {
                if let Some(suppressed) = LINK_SEND_ERRORS.check(now_ms()) {
                    let e = io::Error::from_raw_os_error(code);
                    tracing::warn!(peer = %self.peer, suppressed, "send on the outgoing link failed: {e}");
                }
            }
        }
    }

    /// Called on every worker wakeup: closes a partial FEC block older than
    /// [`CLOSE_BLOCK_MS`] and sends its repair frames.
    pub fn idle(&mut self, now_ms: u64) {
        if self.enc.block_open() && now_ms.saturating_sub(self.block_opened_ms) >= CLOSE_BLOCK_MS {
            self.enc.close_block(now_us());
            self.flush();
        }
    }
}

/// A half's links as an engine starts them: the sockets, one [`LinkTx`] per worker, the
/// incoming link's worker. Every engine of a half uses this, the same way.
pub struct HalfLinks {
    cfg: SplitConfig,
    stats: Arc<SplitStats>,
    out: Arc<UdpSocket>,
    incoming: Option<UdpSocket>,
    epoch: u16,
}

impl HalfLinks {
    /// Installs the outgoing link's neighbour and opens both links' sockets.
    pub fn open(cfg: &SplitConfig, stats: &Arc<SplitStats>) -> Result<HalfLinks, EngineError> {
        Ok(HalfLinks {
            cfg: cfg.clone(),
            stats: Arc::clone(stats),
            out: open_outgoing(&cfg.out_link)?,
            incoming: Some(open_incoming(&cfg.in_link)?),
            epoch: new_epoch(),
        })
    }

    /// Worker `lane`'s sender, with the link-face domain whose egress it takes.
    pub fn sender(&self, lane: usize, batch: usize) -> (DomainId, LinkTx) {
        (
            self.cfg.link_face(),
            LinkTx::new(
                Arc::clone(&self.out),
                &self.cfg.out_link,
                lane as u8,
                self.epoch,
                batch,
                Arc::clone(&self.stats),
            ),
        )
    }

    /// Adds the incoming link's worker to an engine's `workers` (after them; pinned to
    /// `split.in_link.cpu`, else the last worker's CPU) and returns them all.
    #[allow(clippy::too_many_arguments)]
    pub fn finish(
        links: Option<&mut HalfLinks>,
        mut workers: Vec<Worker>,
        cpus: &[usize],
        routes: &Arc<Routes>,
        registry: &PortRegistry,
        stop: &Arc<AtomicBool>,
        batch: usize,
        max_payload: usize,
    ) -> Result<Vec<Worker>, EngineError> {
        if let Some(l) = links {
            let index = workers.len();
            workers.push(l.start_receiver(
                index,
                cpus.last().copied(),
                routes,
                registry,
                stop,
                batch,
                max_payload,
            )?);
        }
        Ok(workers)
    }

    /// Starts the incoming link's worker as worker `index`, pinned to `split.in_link.cpu`
    /// or else `default_cpu`.
    #[allow(clippy::too_many_arguments)]
    pub fn start_receiver(
        &mut self,
        index: usize,
        default_cpu: Option<usize>,
        routes: &Arc<Routes>,
        registry: &PortRegistry,
        stop: &Arc<AtomicBool>,
        batch: usize,
        max_payload: usize,
    ) -> Result<Worker, EngineError> {
        let sock = self.incoming.take().ok_or_else(|| EngineError::Io {
            what: "the incoming link".into(),
            source: io::Error::other("its worker was already started"),
        })?;
        let link = registry.attach_sender().map_err(io_err("eventfd".into()))?;
        let path = RxPath {
            sock,
            face: self.cfg.link_face(),
            peer_face: self.cfg.peer_face,
            peer: *self.cfg.in_link.peer.ip(),
            split: Arc::clone(&self.stats),
            local: HashMap::new(),
            batch,
            fec: self.cfg.in_link.fec,
            reorder_ms: self.cfg.in_link.reorder_ms,
            max_payload,
            overflow_seen: 0,
        };
        let cpu = self.cfg.in_link.cpu.or(default_cpu);
        spawn(index, cpu, routes, stop, Some(link), move |_: &Shell| {
            Ok(RxState {
                rx: RecvBatch::new(path.batch, FRAME_CAP + 1),
                dec: Decoder::with_reorder(path.fec, path.reorder_ms),
                path,
            })
        })
    }
}

/// The incoming link's worker: what crosses threads at start.
struct RxPath {
    sock: UdpSocket,
    face: DomainId,
    peer_face: Ipv4Addr,
    peer: Ipv4Addr,
    split: Arc<SplitStats>,
    local: EgressSockets,
    batch: usize,
    fec: Option<Fec>,
    /// The reorder window's longest wait (0: datagrams are handed on as they arrive).
    reorder_ms: u64,
    max_payload: usize,
    overflow_seen: u32,
}

/// The incoming link's worker, with its buffers (built on its own thread).
struct RxState {
    path: RxPath,
    rx: RecvBatch,
    dec: Decoder,
}

static RX_ERRORS: RateLimit = RateLimit::new(5000);

impl Datapath for RxState {
    fn register(&mut self, poller: &Poller) -> io::Result<()> {
        poller.add(self.path.sock.as_fd(), LINK)
    }

    fn ready(&mut self, shell: &Shell, _token: u64, now: u64) {
        drain(shell, &mut self.path, &mut self.rx, &mut self.dec, now);
    }

    /// Hands on what waited its time in the reorder window.
    fn poll(&mut self, shell: &Shell) -> bool {
        let Some(due) = self.dec.next_deadline() else {
            return false;
        };
        let now = now_ms();
        if now >= due {
            let ctx = &self.path;
            let channel = Channel::from_ingress(ctx.face);
            let mut tally = Tally::default();
            let mut drops = [0u64; LinkDrop::COUNT];
            self.dec.release_due(now, |dst, src, payload, repaired| {
                deliver_one(
                    shell,
                    ctx,
                    channel,
                    (dst, src, payload, repaired),
                    now,
                    &mut tally,
                    &mut drops,
                )
            });
            count_drops(&ctx.split.in_link, &drops);
            shell.stats.channel(channel).add(&tally);
        }
        false
    }

    /// Sleeps no longer than the reorder window's next release.
    fn idle_ms(&self) -> u16 {
        match self.dec.next_deadline() {
            Some(due) => due.saturating_sub(now_ms()).clamp(1, 100) as u16,
            None => 100,
        }
    }

    fn command(&mut self, _shell: &Shell, _poller: &Poller, cmd: Cmd) {
        apply_egress(&mut self.path.local, cmd);
    }

    fn sample(&mut self, _shell: &Shell) {
        self.dec.settle(now_ms(), SETTLE_MS);
        self.path.split.in_link.publish(&self.dec.totals());
    }
}

impl Drop for RxState {
    fn drop(&mut self) {
        // At exit every block still open counts what it never got (what a reorder window
        // still holds, at most `reorder_ms` of traffic, is not sent any more).
        self.dec.settle(u64::MAX, 0);
        self.path.split.in_link.publish(&self.dec.totals());
    }
}

fn count_drops(link: &LinkCounters, drops: &[u64; LinkDrop::COUNT]) {
    for (a, &d) in link.drops.iter().zip(drops) {
        if d > 0 {
            a.fetch_add(d, Relaxed);
        }
    }
}

/// Hands one datagram from the link to the link face as if it came from `(peer face, src)`
/// on gateway port `dst`: route lookup, checks and the route's egress socket; counts it in
/// the route (received or repaired on the link) and the batch's tallies.
fn deliver_one(
    shell: &Shell,
    ctx: &RxPath,
    channel: Channel,
    (dst, src, payload, repaired): (u16, u16, &[u8], bool),
    now: u64,
    tally: &mut Tally,
    drops: &mut [u64; LinkDrop::COUNT],
) {
    let egress = channel.egress();
    let mut one = Tally {
        rx_packets: 1,
        rx_bytes: payload.len() as u64,
        ..Tally::default()
    };
    let Some(route) = shell.routes.lookup(channel, dst) else {
        drops[LinkDrop::UnknownPort as usize] += 1;
        one.drop(DropReason::NoRoute);
        tally.merge(&one);
        return;
    };
    route.stats.link.count(repaired);
    let from = SocketAddrV4::new(ctx.peer_face, src);
    match inspect(&route, from, payload, false, ctx.max_payload, now) {
        Err(r) => one.drop(r),
        Ok(admitted) => {
            one.relatches += u64::from(admitted == Admitted::Relatched);
            // Only admitted datagrams keep the route alive.
            route.touch(now);
            if let Some(sink) = &route.edge {
                crate::engine::frames::offer_to_leg(sink, payload, &mut one);
                route.stats.packets.add(&one);
                tally.merge(&one);
                return;
            }
            match ctx.local.get(&(egress, route.egress_port)) {
                Some(s) => match s.send_to(payload, route.dest) {
                    Ok(_) => {
                        one.tx_packets = 1;
                        one.tx_bytes = payload.len() as u64;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        one.drop(DropReason::QueueFull)
                    }
                    Err(_) => one.drop(DropReason::SendError),
                },
                // Only while the route's session is being torn down.
                None => one.drop(DropReason::SendError),
            }
        }
    }
    route.stats.packets.add(&one);
    tally.merge(&one);
}

fn drain(shell: &Shell, ctx: &mut RxPath, rx: &mut RecvBatch, dec: &mut Decoder, now: u64) {
    let channel = Channel::from_ingress(ctx.face);
    let link = &ctx.split.in_link;
    for _ in 0..BUDGET {
        let n = match rx.recv(ctx.sock.as_fd()) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) => {
                if let Some(suppressed) = RX_ERRORS.check(now) {
                    tracing::warn!(suppressed, "receive on the incoming link failed: {e}");
                }
                return;
            }
        };
        let mut tally = Tally::default();
        if let Some(total) = rx.rx_overflow() {
            tally.drops[DropReason::RxOverflow as usize] +=
                u64::from(total.wrapping_sub(ctx.overflow_seen));
            ctx.overflow_seen = total;
        }
        let mut drops = [0u64; LinkDrop::COUNT];
        let mut bytes = 0u64;
        for i in 0..n {
            let frame = rx.payload(i);
            bytes += frame.len() as u64;
            if rx.truncated(i) {
                drops[LinkDrop::Oversize as usize] += 1;
                continue;
            }
            if *rx.source(i).ip() != ctx.peer {
                drops[LinkDrop::ForeignSource as usize] += 1;
                continue;
            }
            let p = match LinkPacket::new_checked(frame) {
                Ok(p) => p,
                Err(e) => {
                    drops[LinkDrop::from_header(e) as usize] += 1;
                    continue;
                }
            };
            let res = dec.receive(&p, now, |dst, src, payload, repaired| {
                deliver_one(
                    shell,
                    ctx,
                    channel,
                    (dst, src, payload, repaired),
                    now,
                    &mut tally,
                    &mut drops,
                )
            });
            if let Err(e) = res {
                drops[LinkDrop::from_header(e) as usize] += 1;
            }
        }
        link.packets.fetch_add(n as u64, Relaxed);
        link.bytes.fetch_add(bytes, Relaxed);
        count_drops(link, &drops);
        shell.stats.channel(channel).add(&tally);
        if n < rx.capacity() {
            return;
        }
    }
}
