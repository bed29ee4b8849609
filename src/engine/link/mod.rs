//! Link send and receive: the sockets of the two one-way links, the per-worker sender and
//! the receiving worker, and the link counters.
//!
//! **Outgoing link.** Every engine worker owns a [`LinkTx`] (its own FEC encoder, frame
//! slots and send batch): the worker pushes the datagrams it forwards to the link face and
//! flushes once per wakeup ([`crate::engine::worker::Datapath::flush`]), so a wakeup's media
//! costs one send on the link. The worker's lane number goes in the header, so the receiver
//! keeps one FEC state per sending worker and no worker ever waits for another. The link is
//! sent with the engine family of the mode ([`LinkFamily`]):
//!
//! - `stack`: one UDP socket bound to our link address and tied to the link's interface
//!   (`SO_BINDTODEVICE`), `sendmmsg`; the peer's MAC from the config is installed as a
//!   *permanent* neighbour entry, so the kernel never sends an ARP request on the link.
//! - `tnapi`: one AF_PACKET socket bound to the link interface (protocol 0: it receives
//!   nothing) with `PACKET_QDISC_BYPASS` and `PACKET_VNET_HDR`, opened as mode tnapi opens
//!   its own ([`psys::packet_tx_socket`]). Per frame, a `virtio_net_hdr`, the Ethernet
//!   (peer MAC from the config, our MAC read from the interface), IPv4 and UDP headers are
//!   written by the one frame writer ([`FrameEnds::write_vnet`], shared with mode tnapi) in
//!   a header buffer of a [`FrameBatch`], the link frame follows from the encoder's slot
//!   (no copy), and the UDP checksum is left to the device or to the kernel just before the
//!   driver; the wakeup's frames go out with one `sendmmsg`. No kernel route, neighbour or
//!   qdisc is involved. (A `PACKET_TX_RING` would save the `sendmmsg` but not a copy of
//!   each frame, into the ring instead of an skb; not built — see `docs/split.md`.)
//! - `zc`: one AF_XDP socket per worker on the link interface, queue = lane (copy mode
//!   where the driver has no zero-copy, e.g. veth), no XDP program (TX only): each frame is
//!   built in a UMEM chunk (the same headers with the UDP checksum computed here, then the
//!   link frame) and the TX ring is kicked
//!   once per wakeup. The interface needs a TX queue per engine worker.
//!
//! `VGATE_LINK_TX=udp` in the environment sends the link with the UDP socket in every mode
//! (for side-by-side benchmarks); the family in use is in the stats (`out_link.tx`) and the
//! shutdown line (`tx=`).
//!
//! **Incoming link.** One UDP socket bound to our link address on the incoming link's
//! interface, read by its own pinned worker ([`HalfLinks::start_receiver`]) with `recvmmsg`. Each
//! datagram is checked (source = the configured peer, then the [`LinkPacket`] view), fed to
//! the [`Decoder`], and each datagram it yields is delivered to the link face as if it had
//! arrived from `(peer face, source port)` on gateway port `destination port`: route lookup,
//! [`crate::channel::inspect`] and the route's egress socket, exactly as a domain packet.
//! The incoming link keeps a kernel UDP socket in every mode: it is one socket per half
//! (not per queue), the kernel checks the IPv4/UDP headers and the destination, and a ring
//! or an AF_XDP socket there would need a filter or an XDP program on the receive-only
//! interface for the little it would save on the receiving half.
//! Delivery is batched per wakeup: the datagrams a wakeup yields are copied into the
//! worker's preallocated delivery buffer and sent at the end of the wakeup
//! ([`Datapath::flush`]) with one `sendmmsg` per run of one route (one egress socket and
//! destination); a full buffer is sent at once.
//!
//! What keeps the links one-way on the host (no ARP answers, no IPv6, no ICMP out of the
//! receive-only interface) is the host's interface setup, not this process: it must hold
//! while vgate is stopped or restarting too. See `scripts/split-bed.sh` (`harden_link`) and
//! the README's split section.

use std::ffi::CString;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;

use nix::sys::eventfd::EventFd;
use nix::sys::socket::{setsockopt, sockopt};

use crate::channel::{inspect, Admitted};
use crate::clock::now_ms;
use crate::config::split::{Half, LinkConfig, SplitConfig};
use crate::config::DomainId;
use crate::engine::frames::account;
use crate::engine::ports::{Cmd, PortRegistry};
use crate::engine::sys::afpacket as psys;
use crate::engine::sys::afxdp::{self as xsys, BindMode, Xsk, XskParams};
use crate::engine::sys::mmsg::{FrameBatch, RecvBatch, SendOutcome, SliceBatch};
use crate::engine::worker::{spawn, Datapath, EgressSockets, Poller, Shell};
use crate::engine::{EngineError, EngineKind, Worker};
use crate::link::fec::{Decoder, DecoderCounts, Encoder, Fec, FRAME_CAP, HEADROOM};
use crate::link::frag::{self, JoinCounts, Joiner};
use crate::logging::RateLimit;
use crate::routes::{Channel, Routes, StreamRoute};
use crate::stats::link::{LinkCounters, LinkDrop};
use crate::stats::{DropReason, Tally};
use crate::wire::link::{LinkPacket, StreamHeader, MAX_DATAGRAM};
use crate::wire::mac_string;
use crate::wire::{FrameEnds, UdpChecksum};

/// A partial FEC block older than this is closed (its repair frames sent) when the sender
/// goes quiet, so the tail of a burst is protected without waiting for more traffic.
pub const CLOSE_BLOCK_MS: u64 = 20;
pub use crate::config::split::{DEFAULT_REORDER_MS, SETTLE_MS};
/// Receive batches read per wakeup before looking at commands again.
const BUDGET: usize = 8;
/// The incoming link socket's token in the worker's epoll set.
const LINK: u64 = 1;

/// How the outgoing link is sent: the engine family of the mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum LinkFamily {
    /// A kernel UDP socket, `sendmmsg` (mode stack).
    Udp = 1,
    /// An AF_PACKET socket, whole Ethernet frames built in place, `sendmmsg`, qdisc
    /// bypassed (mode tnapi).
    Packet = 2,
    /// AF_XDP TX, one socket per worker (mode zc).
    Xdp = 3,
}

impl LinkFamily {
    pub fn name(self) -> &'static str {
        match self {
            LinkFamily::Udp => "udp",
            LinkFamily::Packet => "af_packet",
            LinkFamily::Xdp => "af_xdp",
        }
    }

    /// The family of an engine; `VGATE_LINK_TX=udp` in the environment forces the UDP
    /// socket (side-by-side benchmarks).
    pub fn of(kind: EngineKind) -> LinkFamily {
        if std::env::var("VGATE_LINK_TX").as_deref() == Ok("udp") {
            return LinkFamily::Udp;
        }
        match kind {
            EngineKind::Afpacket => LinkFamily::Packet,
            EngineKind::Afxdp => LinkFamily::Xdp,
            _ => LinkFamily::Udp,
        }
    }

    fn from_u8(v: u8) -> Option<LinkFamily> {
        [LinkFamily::Udp, LinkFamily::Packet, LinkFamily::Xdp]
            .into_iter()
            .find(|f| *f as u8 == v)
    }
}

impl LinkCounters {
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

    /// Publishes the reassembly's cumulative counts (single writer: the receive worker).
    fn publish_join(&self, j: &JoinCounts) {
        self.fragments.store(j.fragments, Relaxed);
        self.joined.store(j.joined, Relaxed);
        self.drops[LinkDrop::FragmentLost as usize].store(j.lost, Relaxed);
        self.drops[LinkDrop::FragmentTimeout as usize].store(j.timeout, Relaxed);
        self.drops[LinkDrop::BadFragment as usize].store(j.bad, Relaxed);
    }
}

/// Both links of a half, for stats, the admin API and metrics.
#[derive(Debug)]
pub struct SplitStats {
    pub half: Half,
    pub out_fec: Option<Fec>,
    pub in_fec: Option<Fec>,
    pub out_link: LinkCounters,
    pub in_link: LinkCounters,
    /// The outgoing link's [`LinkFamily`] once the links are open (0 before).
    out_tx: AtomicU8,
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
            out_tx: AtomicU8::new(0),
            wrong_base: (
                if_counter(&out_if, "rx_packets"),
                if_counter(&in_if, "tx_packets"),
            ),
            out_if,
            in_if,
        }
    }

    /// How the outgoing link is sent (`None` until the links are open).
    pub fn out_tx(&self) -> Option<LinkFamily> {
        LinkFamily::from_u8(self.out_tx.load(Relaxed))
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
                "link name={name} half={} packets={} bytes={} repair_packets={} send_errors={} delivered={} repaired={} lost={} late={} duplicate={} restarts={} reorder_held={} reorder_expired={} reorder_overtaken={} fragmented={} fragments={} joined={}",
                self.half, v.packets, v.bytes, v.repair_packets, v.send_errors, v.delivered, v.repaired, v.lost, v.late, v.duplicate, v.restarts, v.reorder_held, v.reorder_expired, v.reorder_overtaken, v.fragmented, v.fragments, v.joined
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
            if let (true, Some(tx)) = (name == "out", self.out_tx()) {
                s.push_str(&format!(" tx={}", tx.name()));
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
                "fragmented": s.fragmented, "fragments": s.fragments, "joined": s.joined,
                "drops": drops,
            })
        };
        let (wrong_out, wrong_in) = self.wrong_direction();
        let mut out = link(&self.out_link, self.out_fec);
        out["wrong_direction"] = wrong_out.into();
        out["tx"] = self.out_tx().map(LinkFamily::name).into();
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

fn io_err(what: String) -> impl FnOnce(io::Error) -> EngineError {
    move |source| EngineError::Io { what, source }
}

fn bind_on(local: SocketAddrV4, ifname: &str, what: &str) -> Result<UdpSocket, EngineError> {
    let sock = UdpSocket::bind(local).map_err(io_err(format!(
        "{what}: cannot bind {local} (is the address configured on {ifname}?)"
    )))?;
    crate::iface::bind_to_device(&sock, ifname).map_err(|e| EngineError::Io {
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
    // Past net.core.rmem_max with CAP_NET_ADMIN: the link's frames come in bursts (a
    // sending worker's wakeup at once), and what overflows here is lost for good.
    if setsockopt(&sock, sockopt::RcvBufForce, &(8usize << 20)).is_err() {
        let _ = setsockopt(&sock, sockopt::RcvBuf, &(8usize << 20));
    }
    let _ = setsockopt(&sock, sockopt::RxqOvfl, &1);
    Ok(sock)
}

static LINK_SEND_ERRORS: RateLimit = RateLimit::new(5000);

/// The Ethernet, IPv4 and UDP headers of every frame on the outgoing link (engine-family
/// sends): fixed but for the lengths, the IPv4 identification and the checksums. Written by
/// the one frame writer of frames vgate builds ([`FrameEnds`]).
#[derive(Clone, Copy, Debug)]
pub struct WireHeader {
    pub ends: FrameEnds,
    /// The link interface's index (frames for a packet socket name it).
    pub ifindex: u32,
    ident: u16,
}

impl WireHeader {
    pub fn new(
        src_mac: [u8; 6],
        dst_mac: [u8; 6],
        src: SocketAddrV4,
        dst: SocketAddrV4,
        ifindex: u32,
    ) -> Self {
        WireHeader {
            ends: FrameEnds {
                dst_mac,
                src_mac,
                src,
                dst,
            },
            ifindex,
            ident: 0,
        }
    }

    /// Writes the headers into the first [`HEADROOM`] bytes of `buf`, whose rest is the link
    /// frame (the UDP payload), with both checksums (AF_XDP: nothing fills them later).
    /// `buf` is at most `HEADROOM + FRAME_CAP` long (the encoder's slots are).
    pub fn write(&mut self, buf: &mut [u8]) {
        debug_assert!(buf.len() >= HEADROOM && buf.len() <= HEADROOM + FRAME_CAP);
        let (h, payload) = buf.split_at_mut(HEADROOM);
        self.ends.write(h, self.ident, UdpChecksum::Full(payload));
        self.ident = self.ident.wrapping_add(1);
    }

    /// For the packet socket (`PACKET_VNET_HDR`): a `virtio_net_hdr` asking for the UDP
    /// checksum and the headers of a link frame of `len` bytes that follows in the same
    /// message; returns the bytes written.
    pub fn write_vnet(&mut self, h: &mut [u8], len: usize) -> usize {
        let n = self.ends.write_vnet(h, self.ident, len);
        self.ident = self.ident.wrapping_add(1);
        n
    }
}

/// Where a worker's link frames go.
enum Wire {
    /// The shared UDP socket (`sendmmsg` to the peer).
    Udp(Arc<UdpSocket>),
    /// The shared AF_PACKET socket: per frame, headers written in a buffer of this worker's
    /// batch, the link frame borrowed from the encoder.
    Packet(Arc<OwnedFd>, WireHeader, Box<FrameBatch>),
    /// This worker's AF_XDP socket on the link interface.
    Xdp(Box<Xsk>, WireHeader),
}

impl Wire {
    /// The packet-socket wire with room for `batch` frames per `sendmmsg` (a flush of more
    /// sends several).
    fn packet(fd: Arc<OwnedFd>, hdr: WireHeader, batch: usize) -> Wire {
        let frames = Box::new(FrameBatch::new(batch.max(1), hdr.ifindex));
        Wire::Packet(fd, hdr, frames)
    }
}

/// Sums of the send outcomes of one flush.
#[derive(Default)]
struct Sent {
    frames: u64,
    bytes: u64,
    failed: u64,
    last_error: Option<i32>,
}

impl Sent {
    /// Adds one `sendmmsg` outcome; `extra` bytes per frame are headers, not link bytes.
    fn add(&mut self, out: &SendOutcome, extra: usize) {
        self.frames += out.sent as u64;
        self.bytes += out.sent_bytes.saturating_sub(out.sent * extra) as u64;
        self.failed += (out.queue_full + out.errors) as u64;
        self.last_error = out.last_error.or(self.last_error);
    }
}

/// One worker's sender on the outgoing link.
pub struct LinkTx {
    wire: Wire,
    peer: SocketAddrV4,
    enc: Encoder,
    batch: SliceBatch,
    stats: Arc<SplitStats>,
    block_opened_ms: u64,
    repair_published: u64,
    /// Longest datagram sent (`split.out_link.max_datagram`), cut into fragments.
    max_datagram: usize,
}

impl LinkTx {
    fn new(
        wire: Wire,
        cfg: &LinkConfig,
        lane: u8,
        epoch: u16,
        batch: usize,
        stats: Arc<SplitStats>,
    ) -> LinkTx {
        let slots = batch.max(cfg.fec.map(|f| usize::from(f.k + f.m)).unwrap_or(0));
        LinkTx {
            wire,
            peer: cfg.peer,
            enc: Encoder::new(lane, epoch, cfg.fec, batch),
            batch: SliceBatch::new(slots),
            stats,
            block_opened_ms: 0,
            repair_published: 0,
            max_datagram: cfg.max_datagram.min(MAX_DATAGRAM),
        }
    }

    /// Queues one datagram for gateway port `dst` of the peer, sent from our egress port
    /// `src`, with its route's link stream sequence `seq`; a datagram longer than a frame's
    /// media is cut into fragments, consecutive frames of this lane ([`frag`]). Frames go
    /// out when a block or batch is full, and at [`LinkTx::flush`]. `false` (nothing sent)
    /// when it is longer than `split.out_link.max_datagram` (the caller counts it as
    /// oversize).
    pub fn push(
        &mut self,
        dst: u16,
        src: u16,
        seq: u32,
        payload: &[u8],
        now_ms: u64,
        ts_us: u32,
    ) -> bool {
        let mut cut = 0u64;
        let ok = frag::cut(payload, seq, self.max_datagram, |sh, media| {
            cut += u64::from(sh.frag == 1);
            if self.enc.must_flush() {
                self.flush();
            }
            let opened = self.enc.block_open();
            let pushed = self.enc.push_parts(dst, src, &sh.bytes(), media, ts_us);
            debug_assert!(pushed, "a fragment fits a frame and a flush made room");
            if !opened {
                self.block_opened_ms = now_ms;
            }
            if self.enc.must_flush() {
                self.flush();
            }
        });
        if cut > 0 {
            self.stats.out_link.fragmented.fetch_add(cut, Relaxed);
        }
        ok
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
        if payload.len() > self.max_datagram {
            // Refused before it takes a sequence number: the receiver sees no gap.
            t.drop(DropReason::Oversize);
            return;
        }
        let seq = route.next_link_seq();
        if self.push(
            route.dest.port(),
            route.egress_port,
            seq,
            payload,
            now_ms,
            ts_us,
        ) {
            t.tx_packets += 1;
            t.tx_bytes += payload.len() as u64;
        } else {
            t.drop(DropReason::Oversize);
        }
    }

    /// Sends every frame written and not yet sent (engines call it once per wakeup, from
    /// [`Datapath::flush`]).
    pub fn flush(&mut self) {
        let mut sent = Sent::default();
        match &mut self.wire {
            Wire::Udp(sock) => {
                let mut scope = self.batch.scope();
                for f in self.enc.ready() {
                    if !scope.push(f) {
                        sent.add(&scope.send(sock.as_fd(), self.peer), 0);
                        scope.push(f);
                    }
                }
                sent.add(&scope.send(sock.as_fd(), self.peer), 0);
            }
            Wire::Packet(fd, hdr, frames) => {
                let mut scope = frames.scope();
                for f in self.enc.ready() {
                    if scope.is_full() {
                        sent.add(&scope.send(fd.as_fd()), 0);
                    }
                    scope.push(f, |h| hdr.write_vnet(h, f.len()));
                }
                if !scope.is_empty() {
                    sent.add(&scope.send(fd.as_fd()), 0);
                }
            }
            Wire::Xdp(xsk, hdr) => {
                for f in self.enc.ready() {
                    let Some(mut chunk) = xsk.tx_frame() else {
                        // Every TX chunk is in flight: the kernel has not sent them yet.
                        sent.failed += 1;
                        continue;
                    };
                    let len = HEADROOM + f.len();
                    let buf = xsk.tx_buf(&mut chunk);
                    if buf.len() < len {
                        sent.failed += 1;
                        continue;
                    }
                    buf[HEADROOM..len].copy_from_slice(f);
                    hdr.write(&mut buf[..len]);
                    if xsk.tx_push(chunk, len as u32, None) {
                        sent.frames += 1;
                        sent.bytes += f.len() as u64;
                    } else {
                        sent.failed += 1;
                    }
                }
                if let Err(e) = xsk.tx_kick() {
                    sent.last_error = e.raw_os_error();
                }
            }
        }
        self.enc.mark_sent();
        let c = &self.stats.out_link;
        if sent.frames > 0 {
            c.packets.fetch_add(sent.frames, Relaxed);
            c.bytes.fetch_add(sent.bytes, Relaxed);
        }
        if self.enc.repair_out != self.repair_published {
            c.repair_packets
                .fetch_add(self.enc.repair_out - self.repair_published, Relaxed);
            self.repair_published = self.enc.repair_out;
        }
        if sent.failed > 0 {
            c.send_errors.fetch_add(sent.failed, Relaxed);
        }
        if sent.failed > 0 || sent.last_error.is_some() {
            if let Some(suppressed) = LINK_SEND_ERRORS.check(now_ms()) {
                let e = sent.last_error.map_or_else(
                    || io::Error::other("no room in the send queue or TX ring"),
                    io::Error::from_raw_os_error,
                );
                tracing::warn!(peer = %self.peer, suppressed, "send on the outgoing link failed: {e}");
            }
        }
    }

    /// When [`LinkTx::idle`] will close the partial FEC block now open (None: none open).
    pub fn close_due_ms(&self) -> Option<u64> {
        self.enc
            .block_open()
            .then_some(self.block_opened_ms + CLOSE_BLOCK_MS)
    }

    /// Called on every worker wakeup: closes a partial FEC block older than
    /// [`CLOSE_BLOCK_MS`] and sends its repair frames; takes back sent AF_XDP chunks.
    pub fn idle(&mut self, now_ms: u64) {
        if self.enc.block_open() && now_ms.saturating_sub(self.block_opened_ms) >= CLOSE_BLOCK_MS {
            self.enc.close_block(crate::clock::wall_us());
            self.flush();
        }
        if let Wire::Xdp(xsk, _) = &mut self.wire {
            xsk.reclaim();
        }
    }
}

/// The lane of the TCP media legs' sender: the last one, never an engine worker's
/// (`engine.queues` is at most the machine's CPUs, far below it).
pub const EDGE_LANE: u8 = (crate::link::fec::MAX_LANES - 1) as u8;
/// Frames the legs' sender writes before it sends them (one read's packets).
const EDGE_BATCH: usize = 64;

/// The TCP media legs' sender on the outgoing link, shared by the legs' threads; set when
/// a half's engine starts ([`HalfLinks::finish`]), empty on a single host. A partial FEC
/// block the legs leave open is closed on time by the incoming link's worker
/// ([`EdgeLink::close_due`]), so the tail of a leg's burst is not held until its next read:
/// when a block opens, [`EdgeLink::sent`] wakes that worker (its eventfd; one write per
/// block, not per packet), which then sleeps no longer than the block's closing time.
#[derive(Default)]
pub struct EdgeLink(
    std::sync::OnceLock<(DomainId, std::sync::Mutex<LinkTx>)>,
    /// [`LinkTx::close_due_ms`] of the sender after its last use (0: no block open).
    AtomicU64,
    /// The incoming link's worker's wake-up eventfd ([`EdgeLink::set_waker`]); taken once
    /// per opened block.
    std::sync::Mutex<Option<Arc<EventFd>>>,
);

impl EdgeLink {
    /// Notes when `tx` (this link's sender, locked by the caller after a send) must close
    /// its partial block; wakes the incoming link's worker when a block just opened (it may
    /// be asleep for up to 100 ms, longer than [`CLOSE_BLOCK_MS`]).
    pub fn sent(&self, tx: &LinkTx) {
        let due = tx.close_due_ms().unwrap_or(0);
        if self.1.swap(due, Relaxed) == 0 && due != 0 {
            let waker = self.2.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(w) = waker.as_ref() {
                // Full (never in practice: the worker reads it) or closed: nothing to do.
                let _ = w.write(1);
            }
        }
    }

    /// The eventfd of the worker that closes the legs' blocks (the incoming link's; a
    /// restarted engine replaces it).
    pub fn set_waker(&self, wake: Arc<EventFd>) {
        *self.2.lock().unwrap_or_else(|e| e.into_inner()) = Some(wake);
    }

    /// When the legs' partial FEC block must be closed (None: none open). No lock.
    pub fn close_due(&self) -> Option<u64> {
        Some(self.1.load(Relaxed)).filter(|&d| d != 0)
    }

    /// Closes the legs' partial block if it is due, unless a leg holds the sender (it will
    /// close it itself at the end of its read).
    pub fn close_if_due(&self, now_ms: u64) {
        if self.close_due().is_none_or(|d| now_ms < d) {
            return;
        }
        if let Some((_, m)) = self.0.get() {
            if let Ok(mut tx) = m.try_lock() {
                tx.idle(now_ms);
                self.sent(&tx);
            }
        }
    }

    /// Installs the sender for link face `face` (a restarted engine replaces it).
    pub fn set(&self, face: DomainId, tx: LinkTx) {
        match self.0.get() {
            Some((_, m)) => *m.lock().unwrap_or_else(|e| e.into_inner()) = tx,
            None => {
                if let Err((_, m)) = self.0.set((face, std::sync::Mutex::new(tx))) {
                    // Set meanwhile by another engine: keep theirs.
                    drop(m);
                }
            }
        }
    }

    /// The sender when `egress` is the link face.
    pub fn toward(&self, egress: DomainId) -> Option<&std::sync::Mutex<LinkTx>> {
        self.0.get().filter(|(f, _)| *f == egress).map(|(_, m)| m)
    }
}

/// The outgoing link's shared socket, by family (AF_XDP sockets are per worker).
enum OutLink {
    Udp(Arc<UdpSocket>),
    Packet(Arc<OwnedFd>, WireHeader),
    /// One socket per lane, taken by [`HalfLinks::sender`].
    Xdp(Vec<Option<Xsk>>, WireHeader),
}

/// Link interface facts an engine-family link needs: its index and our MAC on it.
fn link_interface(cfg: &LinkConfig) -> Result<(u32, [u8; 6]), EngineError> {
    let name = CString::new(cfg.interface.as_str()).map_err(|_| EngineError::Io {
        what: format!("outgoing link: interface name {:?}", cfg.interface),
        source: io::Error::from_raw_os_error(libc::EINVAL),
    })?;
    let index = xsys::if_nametoindex(&name).map_err(io_err(format!(
        "outgoing link: no interface {} (split.out_link.interface)",
        cfg.interface
    )))?;
    let mac = xsys::hw_addr(&name).map_err(io_err(format!(
        "outgoing link: cannot read the MAC address of {}",
        cfg.interface
    )))?;
    Ok((index, mac))
}

/// The headers of the outgoing link's frames: our MAC read from the interface, the peer's
/// from the config (check-config requires it on an outgoing link).
fn wire_header(cfg: &LinkConfig, index: u32, mac: [u8; 6]) -> Result<WireHeader, EngineError> {
    let peer_mac = cfg.peer_mac.ok_or_else(|| EngineError::Io {
        what: "outgoing link: split.out_link.peer_mac is required to send frames".into(),
        source: io::Error::from_raw_os_error(libc::EINVAL),
    })?;
    Ok(WireHeader::new(mac, peer_mac, cfg.local, cfg.peer, index))
}

/// The AF_PACKET socket of the outgoing link, opened as mode tnapi opens its own
/// ([`psys::packet_tx_socket`]): bound to the interface with protocol 0 (it receives
/// nothing), the qdisc bypassed (frames go straight to the driver), `PACKET_VNET_HDR` (the
/// UDP checksum left to the device or the kernel), a 4 MiB send buffer.
fn open_packet(cfg: &LinkConfig) -> Result<OutLink, EngineError> {
    let (index, mac) = link_interface(cfg)?;
    let fd = psys::packet_tx_socket(index).map_err(io_err(format!(
        "outgoing link (AF_PACKET on {}): cannot open the packet socket (vgate needs CAP_NET_RAW; PACKET_QDISC_BYPASS needs Linux 3.14, PACKET_VNET_HDR 3.0)",
        cfg.interface
    )))?;
    Ok(OutLink::Packet(Arc::new(fd), wire_header(cfg, index, mac)?))
}

/// UMEM of an outgoing link's AF_XDP socket: 512 chunks, 256 for the (unused) fill ring and
/// 256 for TX — more than a wakeup's frames.
const XDP_PARAMS: XskParams = XskParams {
    frame_size: 2048,
    frames: 512,
    ring: 256,
};

/// One AF_XDP socket per lane on the outgoing link's interface, queue = lane, zero-copy
/// where the driver can, else copy mode. No XDP program: they only transmit.
fn open_xdp(cfg: &LinkConfig, lanes: usize) -> Result<OutLink, EngineError> {
    let (index, mac) = link_interface(cfg)?;
    let mut socks = Vec::with_capacity(lanes);
    for lane in 0..lanes as u32 {
        let x = Xsk::open(index, lane, XDP_PARAMS, BindMode::ZeroCopy, false)
            .or_else(|_| Xsk::open(index, lane, XDP_PARAMS, BindMode::Copy, false))
            .map_err(|e| EngineError::Io {
                what: format!(
                    "outgoing link (AF_XDP on {} queue {lane}): {}; the link interface needs one TX queue per engine worker (engine.queues) and vgate needs CAP_NET_ADMIN, CAP_NET_RAW and CAP_BPF",
                    cfg.interface, e.step
                ),
                source: e.source,
            })?;
        socks.push(Some(x));
    }
    Ok(OutLink::Xdp(socks, wire_header(cfg, index, mac)?))
}

/// A half's links as an engine starts them: the sockets, one [`LinkTx`] per worker, the
/// incoming link's worker. Every engine of a half uses this, the same way.
pub struct HalfLinks {
    cfg: SplitConfig,
    stats: Arc<SplitStats>,
    out: OutLink,
    incoming: Option<UdpSocket>,
    epoch: u16,
}

impl HalfLinks {
    /// Opens both links: the outgoing one in `family` for `lanes` engine workers (the UDP
    /// socket also installs the peer's neighbour), the incoming link's UDP socket.
    pub fn open(
        cfg: &SplitConfig,
        stats: &Arc<SplitStats>,
        family: LinkFamily,
        lanes: usize,
    ) -> Result<HalfLinks, EngineError> {
        let out = match family {
            LinkFamily::Udp => OutLink::Udp(open_outgoing(&cfg.out_link)?),
            LinkFamily::Packet => open_packet(&cfg.out_link)?,
            LinkFamily::Xdp => open_xdp(&cfg.out_link, lanes)?,
        };
        stats.out_tx.store(family as u8, Relaxed);
        tracing::info!(
            interface = %cfg.out_link.interface,
            tx = family.name(),
            "outgoing link open"
        );
        Ok(HalfLinks {
            cfg: cfg.clone(),
            stats: Arc::clone(stats),
            out,
            incoming: Some(open_incoming(&cfg.in_link)?),
            epoch: new_epoch(),
        })
    }

    /// Worker `lane`'s sender, with the link-face domain whose egress it takes. An AF_XDP
    /// link gives each lane its own socket, once: `None` for a lane it has no socket for.
    pub fn sender(&mut self, lane: usize, batch: usize) -> Option<(DomainId, LinkTx)> {
        let wire = match &mut self.out {
            OutLink::Udp(s) => Wire::Udp(Arc::clone(s)),
            OutLink::Packet(fd, hdr) => Wire::packet(Arc::clone(fd), *hdr, batch),
            OutLink::Xdp(socks, hdr) => Wire::Xdp(Box::new(socks.get_mut(lane)?.take()?), *hdr),
        };
        Some((
            self.cfg.link_face(),
            LinkTx::new(
                wire,
                &self.cfg.out_link,
                lane as u8,
                self.epoch,
                batch,
                Arc::clone(&self.stats),
            ),
        ))
    }

    /// The sender of the TCP media legs ([`crate::edge`]): their packets toward the link
    /// face go down the link on lane [`EDGE_LANE`], never from an egress socket (a face
    /// address is a loopback address with nothing behind it). Legs send from their own
    /// threads, so the lane sits behind a lock taken once per read ([`EdgeLink`]). On an
    /// AF_XDP link, whose sockets are one per worker queue, the lane uses an AF_PACKET socket.
    pub fn edge_sender(&self) -> Result<LinkTx, EngineError> {
        let wire = match &self.out {
            OutLink::Udp(s) => Wire::Udp(Arc::clone(s)),
            OutLink::Packet(fd, hdr) => Wire::packet(Arc::clone(fd), *hdr, EDGE_BATCH),
            OutLink::Xdp(..) => match open_packet(&self.cfg.out_link)? {
                OutLink::Packet(fd, hdr) => Wire::packet(fd, hdr, EDGE_BATCH),
                _ => unreachable!("open_packet opens a packet socket"),
            },
        };
        Ok(LinkTx::new(
            wire,
            &self.cfg.out_link,
            EDGE_LANE,
            self.epoch,
            EDGE_BATCH,
            Arc::clone(&self.stats),
        ))
    }

    /// Adds the incoming link's worker to an engine's `workers` (after them; pinned to
    /// `split.in_link.cpu`, else the last worker's CPU) and returns them all.
    #[allow(clippy::too_many_arguments)]
    pub fn finish(
        links: Option<&mut HalfLinks>,
        mut workers: Vec<Worker>,
        cpus: &[usize],
        routes: &Arc<Routes>,
        registry: &Arc<PortRegistry>,
        stop: &Arc<AtomicBool>,
        batch: usize,
        max_payload: usize,
    ) -> Result<Vec<Worker>, EngineError> {
        if let Some(l) = links {
            registry.edge_link.set(l.cfg.link_face(), l.edge_sender()?);
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
        registry: &Arc<PortRegistry>,
        stop: &Arc<AtomicBool>,
        batch: usize,
        max_payload: usize,
    ) -> Result<Worker, EngineError> {
        let sock = self.incoming.take().ok_or_else(|| EngineError::Io {
            what: "the incoming link".into(),
            source: io::Error::other("its worker was already started"),
        })?;
        let link = registry.attach_sender().map_err(io_err("eventfd".into()))?;
        registry.edge_link.set_waker(Arc::clone(&link.wake));
        let path = RxPath {
            sock,
            registry: Arc::clone(registry),
            face: self.cfg.link_face(),
            peer_face: self.cfg.peer_face,
            peer: *self.cfg.in_link.peer.ip(),
            split: Arc::clone(&self.stats),
            local: EgressSockets::new(),
            batch,
            fec: self.cfg.in_link.fec,
            reorder_ms: self.cfg.in_link.reorder_ms,
            // What the sending half cut and this one joined may be longer than a frame
            // and than this half's own `engine.max_payload` (which bounds its domain side).
            max_payload: max_payload.max(MAX_DATAGRAM),
            overflow_seen: 0,
        };
        let cpu = self.cfg.in_link.cpu.or(default_cpu);
        spawn(index, cpu, routes, stop, Some(link), move |_: &Shell| {
            Ok(RxState {
                rx: RecvBatch::new(path.batch, FRAME_CAP + 1),
                dec: Decoder::with_reorder(path.fec, path.reorder_ms),
                join: Joiner::new(path.reorder_ms > 0),
                out: Delivery::new(path.batch * BUDGET),
                path,
                idle_cap_ms: IDLE_MS,
            })
        })
    }
}

/// The incoming link's worker: what crosses threads at start.
struct RxPath {
    sock: UdpSocket,
    /// For the legs' sender on the outgoing link ([`EdgeLink::close_if_due`]).
    registry: Arc<PortRegistry>,
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
    join: Joiner,
    out: Delivery,
    /// The longest sleep with nothing due ([`IDLE_MS`]; a test makes it long so that only a
    /// wakeup, never the sleep's end, can close the legs' block in time).
    idle_cap_ms: u16,
}

/// The incoming link worker's longest sleep with nothing due.
const IDLE_MS: u16 = 100;

/// One datagram waiting in a [`Delivery`]: its route, the egress socket, its length.
struct Waiting {
    route: Arc<StreamRoute>,
    sock: Arc<UdpSocket>,
    len: usize,
}

/// Datagrams delivered from the incoming link during one wakeup, copied (they come from the
/// receive batch or the decoder's rebuilt shards, both reused before the wakeup ends) and
/// sent together by [`Delivery::send`]. Allocated once; never grows.
struct Delivery {
    buf: Box<[u8]>,
    waiting: Vec<Waiting>,
    tx: SliceBatch,
}

impl Delivery {
    fn new(cap: usize) -> Delivery {
        let cap = cap.max(1);
        Delivery {
            buf: vec![0u8; cap * FRAME_CAP].into_boxed_slice(),
            waiting: Vec::with_capacity(cap),
            tx: SliceBatch::new(cap),
        }
    }

    fn is_full(&self) -> bool {
        self.waiting.len() == self.waiting.capacity()
    }

    /// Queues a copy of `payload` (at most [`FRAME_CAP`] bytes: a link frame's payload) for
    /// `route`'s destination from `sock`. The caller sends first when [`Delivery::is_full`].
    fn queue(&mut self, route: Arc<StreamRoute>, sock: Arc<UdpSocket>, payload: &[u8]) {
        let i = self.waiting.len();
        let len = payload.len().min(FRAME_CAP);
        self.buf[i * FRAME_CAP..i * FRAME_CAP + len].copy_from_slice(&payload[..len]);
        self.waiting.push(Waiting { route, sock, len });
    }

    /// Sends what is queued, one `sendmmsg` per run of one route, and counts it in the
    /// routes and in `chan` (the link face's channel).
    fn send(&mut self, chan: &mut Tally) {
        let Delivery { buf, waiting, tx } = self;
        let mut start = 0;
        while start < waiting.len() {
            let first = &waiting[start];
            let mut end = start + 1;
            while end < waiting.len() && Arc::ptr_eq(&waiting[end].route, &first.route) {
                end += 1;
            }
            let mut scope = tx.scope();
            for (i, w) in waiting[start..end].iter().enumerate() {
                let at = (start + i) * FRAME_CAP;
                scope.push(&buf[at..at + w.len]);
            }
            let out = scope.send(first.sock.as_fd(), first.route.dest);
            let mut t = Tally::default();
            account(&mut t, &out, Some(&first.route));
            first.route.stats.packets.add(&t);
            chan.merge(&t);
            start = end;
        }
        waiting.clear();
    }
}

static RX_ERRORS: RateLimit = RateLimit::new(5000);
static VERSION_LOG: RateLimit = RateLimit::new(10_000);

impl Datapath for RxState {
    fn register(&mut self, poller: &Poller) -> io::Result<()> {
        poller.add(self.path.sock.as_fd(), LINK)
    }

    fn ready(&mut self, shell: &Shell, _token: u64, now: u64) {
        drain(
            shell,
            &mut self.path,
            &mut self.rx,
            &mut self.dec,
            &mut self.join,
            &mut self.out,
            now,
        );
    }

    /// Hands on what waited its time in the reorder window; gives up the datagrams whose
    /// fragments did not all come in time.
    /// Also closes the TCP legs' partial FEC block on the outgoing link when it is due.
    fn poll(&mut self, shell: &Shell) -> bool {
        let now = now_ms();
        if self.join.next_deadline().is_some_and(|d| now >= d) {
            self.join.expire(now);
        }
        self.path.registry.edge_link.close_if_due(now);
        let Some(due) = self.dec.next_deadline() else {
            return false;
        };
        if now >= due {
            let ctx = &self.path;
            let channel = Channel::from_ingress(ctx.face);
            let mut tally = Tally::default();
            let mut drops = [0u64; LinkDrop::COUNT];
            let (out, join) = (&mut self.out, &mut self.join);
            self.dec.release_due(now, |dst, src, payload, repaired| {
                on_datagram(
                    shell,
                    ctx,
                    join,
                    channel,
                    (dst, src, payload, repaired),
                    now,
                    out,
                    &mut tally,
                    &mut drops,
                )
            });
            count_drops(&ctx.split.in_link, &drops);
            shell.stats.channel(channel).add(&tally);
            // Out now: the worker flushes only after a wakeup's reads.
            send_delivery(shell, ctx, &mut self.out);
        }
        false
    }

    /// Sleeps no longer than the reorder window's next release, the next reassembly timeout
    /// or the legs' partial FEC block's closing time.
    fn idle_ms(&self) -> u16 {
        let due = [
            self.dec.next_deadline(),
            self.join.next_deadline(),
            self.path.registry.edge_link.close_due(),
        ]
        .into_iter()
        .flatten()
        .min();
        let cap = u64::from(self.idle_cap_ms);
        match due {
            Some(due) => due.saturating_sub(now_ms()).clamp(1, cap) as u16,
            None => self.idle_cap_ms,
        }
    }

    fn command(&mut self, _shell: &Shell, _poller: &Poller, cmd: Cmd) {
        self.path.local.apply(cmd);
    }

    /// The wakeup's delivered datagrams go out together.
    fn flush(&mut self, shell: &Shell) {
        send_delivery(shell, &self.path, &mut self.out);
    }

    fn sample(&mut self, _shell: &Shell) {
        self.dec.settle(now_ms(), SETTLE_MS);
        self.path.split.in_link.publish(&self.dec.totals());
        self.path.split.in_link.publish_join(&self.join.counts);
    }
}

impl Drop for RxState {
    fn drop(&mut self) {
        // At exit every block still open counts what it never got (what a reorder window
        // still holds, at most `reorder_ms` of traffic, is not sent any more), and so does
        // every datagram still being joined.
        self.dec.settle(u64::MAX, 0);
        self.join.expire(u64::MAX);
        self.path.split.in_link.publish(&self.dec.totals());
        self.path.split.in_link.publish_join(&self.join.counts);
    }
}

/// One link datagram from the decoder (or its reorder window): its stream header read,
/// a whole datagram delivered, a fragment joined and the datagram delivered once complete.
#[allow(clippy::too_many_arguments)]
fn on_datagram(
    shell: &Shell,
    ctx: &RxPath,
    join: &mut Joiner,
    channel: Channel,
    (dst, src, datagram, repaired): (u16, u16, &[u8], bool),
    now: u64,
    out: &mut Delivery,
    tally: &mut Tally,
    drops: &mut [u64; LinkDrop::COUNT],
) {
    let Some((sh, media)) = StreamHeader::parse(datagram) else {
        // Only a peer that is not vgate (a data frame's header was checked on arrival; a
        // rebuilt one is what that peer sent).
        join.counts.bad += 1;
        return;
    };
    if sh.frags == 1 {
        let d = (dst, src, sh.sequence, media, repaired);
        deliver_one(shell, ctx, channel, d, now, out, tally, drops);
    } else if let Some(j) = join.offer(dst, src, sh, media, repaired, now) {
        let d = (dst, src, sh.sequence, j.data, j.repaired);
        deliver_one(shell, ctx, channel, d, now, out, tally, drops);
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
/// on gateway port `dst`: route lookup and checks, then queued in `out` for the route's
/// egress socket (sent at the end of the wakeup; one longer than a frame is sent at once,
/// after what is queued); counts it in the route's link stream (received or repaired on the
/// link, its stream sequence `seq`: a duplicate goes no further) and the batch's tallies.
#[allow(clippy::too_many_arguments)]
fn deliver_one(
    shell: &Shell,
    ctx: &RxPath,
    channel: Channel,
    (dst, src, seq, payload, repaired): (u16, u16, u32, &[u8], bool),
    now: u64,
    out: &mut Delivery,
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
    if !route.stats.link.count(src, seq, repaired) {
        // A duplicate of one already handed on (counted in the route's link stream).
        return;
    }
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
                Some(s) if payload.len() > FRAME_CAP => {
                    // A joined datagram: after what waits, at once (rare; the queue's
                    // slots are a frame long).
                    let mut t = Tally::default();
                    out.send(&mut t);
                    tally.merge(&t);
                    match s.send_to(payload, route.dest) {
                        Ok(_) => {
                            one.tx_packets += 1;
                            one.tx_bytes += payload.len() as u64;
                        }
                        Err(_) => one.drop(DropReason::SendError),
                    }
                }
                Some(s) => {
                    // Sent (and counted) at the end of the wakeup.
                    if out.is_full() {
                        let mut t = Tally::default();
                        out.send(&mut t);
                        tally.merge(&t);
                    }
                    out.queue(Arc::clone(&route), Arc::clone(s), payload);
                }
                // Only while the route's session is being torn down.
                None => one.drop(DropReason::SendError),
            }
        }
    }
    route.stats.packets.add(&one);
    tally.merge(&one);
}

/// Sends a [`Delivery`] and counts it in the link face's channel.
fn send_delivery(shell: &Shell, ctx: &RxPath, out: &mut Delivery) {
    if out.waiting.is_empty() {
        return;
    }
    let mut chan = Tally::default();
    out.send(&mut chan);
    shell
        .stats
        .channel(Channel::from_ingress(ctx.face))
        .add(&chan);
}

fn drain(
    shell: &Shell,
    ctx: &mut RxPath,
    rx: &mut RecvBatch,
    dec: &mut Decoder,
    join: &mut Joiner,
    out: &mut Delivery,
    now: u64,
) {
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
                on_datagram(
                    shell,
                    ctx,
                    join,
                    channel,
                    (dst, src, payload, repaired),
                    now,
                    out,
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
        if drops[LinkDrop::BadVersion as usize] > 0 {
            if let Some(suppressed) = VERSION_LOG.check(now) {
                tracing::warn!(
                    suppressed,
                    ours = crate::wire::link::VERSION,
                    "link frames of another link header version dropped (bad_version): both halves must run the same vgate release"
                );
            }
        }
        count_drops(link, &drops);
        shell.stats.channel(channel).add(&tally);
        if n < rx.capacity() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::fec::Encoder;
    use crate::wire::link::Kind;
    use crate::wire::parse_udp4;

    /// Frames built in the encoder's headroom (AF_XDP) are valid Ethernet/IPv4/UDP datagrams
    /// from our link address to the peer's, carrying exactly the link frame, checksums
    /// right; the packet socket's frames (`virtio_net_hdr` + the same headers, checksum left
    /// to the device) are the same bytes once the device has summed them.
    #[test]
    fn frames_built_for_the_link_are_valid_udp() {
        let src = SocketAddrV4::new(Ipv4Addr::new(10, 211, 3, 1), 7000);
        let dst = SocketAddrV4::new(Ipv4Addr::new(10, 211, 3, 2), 7001);
        let (ours, peer) = ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
        let mut hdr = WireHeader::new(ours, peer, src, dst, 3);
        let mut vnet = WireHeader::new(ours, peer, src, dst, 3);
        let fec = Fec::parse("2+1").unwrap();
        let mut enc = Encoder::new(3, 9, fec, 8);
        assert!(enc.push(21000, 30000, &[7u8; 1000], 1));
        assert!(enc.push(21000, 30000, &[8u8; 1444], 2)); // completes the block: + 1 repair
        enc.fill_headroom(|b| hdr.write(b));
        let frames: Vec<&[u8]> = enc.ready().collect();
        let wire: Vec<&[u8]> = enc.ready_wire().collect();
        assert_eq!(wire.len(), 3);
        let mut idents = Vec::new();
        for (f, w) in frames.iter().zip(&wire) {
            assert!(w.len() <= 1514, "fits a 1500-byte MTU");
            assert_eq!(&w[0..6], &peer);
            assert_eq!(&w[6..12], &ours);
            let d = parse_udp4(w).unwrap();
            assert!(d.checksums_ok(false));
            assert_eq!((d.src_addr, d.dst_addr), (*src.ip(), *dst.ip()));
            assert_eq!((d.src_port, d.dst_port), (src.port(), dst.port()));
            assert_eq!(d.payload, *f);
            assert!(LinkPacket::new_checked(d.payload).is_ok());
            idents.push(u16::from_be_bytes([w[18], w[19]]));
            // The packet socket's version of the same frame.
            let mut h = [0u8; 64];
            let n = vnet.write_vnet(&mut h, f.len());
            assert_eq!(n, crate::wire::VNET_UDP4_HEADERS);
            let mut p = h[crate::wire::VNET_HDR_LEN..n].to_vec();
            p.extend_from_slice(f);
            assert_eq!(h[0], 1, "VIRTIO_NET_HDR_F_NEEDS_CSUM");
            assert_eq!(
                u16::from_ne_bytes([h[6], h[7]]),
                34,
                "csum_start: the UDP header"
            );
            let c = crate::wire::checksum::finish(crate::wire::checksum::sum(&p[34..]));
            p[40..42].copy_from_slice(&c.to_be_bytes());
            assert!(parse_udp4(&p).unwrap().checksums_ok(false));
            assert_eq!(p[..40], w[..40]);
            assert_eq!(p[42..], w[42..]);
        }
        assert_eq!(idents, [0, 1, 2]);
    }

    fn test_config(fec: &str) -> SplitConfig {
        let link = |port: u16| LinkConfig {
            interface: "lo".into(),
            local: SocketAddrV4::new(Ipv4Addr::LOCALHOST, port),
            peer: SocketAddrV4::new(Ipv4Addr::LOCALHOST, port + 1),
            peer_mac: None,
            fec: Fec::parse(fec).unwrap(),
            cpu: None,
            reorder_ms: 0,
            max_datagram: MAX_DATAGRAM,
        };
        SplitConfig {
            half: crate::config::split::Half::B,
            peer_face: Ipv4Addr::new(127, 77, 0, 1),
            out_link: link(7000),
            in_link: link(7100),
            signal: crate::config::split_signal::SignalLink {
                interface: "lo".into(),
                local: SocketAddrV4::new(Ipv4Addr::LOCALHOST, 7200),
                peer: SocketAddrV4::new(Ipv4Addr::LOCALHOST, 7201),
                key: crate::config::split_signal::SignalKey::new(vec![7; 32]),
                heartbeat: std::time::Duration::from_millis(500),
                dead_after: std::time::Duration::from_millis(3000),
            },
        }
    }

    /// The TCP legs' lane: a partial FEC block left open after a leg's read is closed (its
    /// repair frames sent) by whoever calls `close_if_due` once `CLOSE_BLOCK_MS` passed —
    /// the incoming link's worker — not at the leg's next read.
    #[test]
    fn the_legs_partial_block_is_closed_on_time() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(std::time::Duration::from_millis(200)))
            .unwrap();
        let sock = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
        let mut cfg = test_config("8+2");
        cfg.out_link.peer = match rx.local_addr().unwrap() {
            std::net::SocketAddr::V4(a) => a,
            _ => unreachable!(),
        };
        let stats = Arc::new(SplitStats::new(&cfg));
        let mut tx = LinkTx::new(
            Wire::Udp(sock),
            &cfg.out_link,
            EDGE_LANE,
            1,
            EDGE_BATCH,
            Arc::clone(&stats),
        );
        let t0 = 1_000;
        // A 4000-byte datagram: three fragments of one partial block.
        assert!(tx.push(21000, 30000, 5, &[9u8; 4000], t0, 0));
        tx.flush();
        tx.idle(t0 + 1);
        let edge = EdgeLink::default();
        edge.set(DomainId::A, tx);
        let m = edge.toward(DomainId::A).unwrap();
        edge.sent(&m.lock().unwrap());
        assert_eq!(edge.close_due(), Some(t0 + CLOSE_BLOCK_MS));
        let mut buf = [0u8; 2048];
        let mut frames = Vec::new();
        while let Ok(n) = rx.recv(&mut buf) {
            frames.push(LinkPacket::new_checked(&buf[..n]).unwrap().kind());
        }
        assert_eq!(frames, [Kind::Data; 3], "the data frames went out at once");
        edge.close_if_due(t0 + CLOSE_BLOCK_MS - 1);
        assert!(rx.recv(&mut buf).is_err(), "not due yet");
        edge.close_if_due(t0 + CLOSE_BLOCK_MS);
        let mut frames = Vec::new();
        while let Ok(n) = rx.recv(&mut buf) {
            let p = LinkPacket::new_checked(&buf[..n]).unwrap();
            frames.push((p.kind(), p.fec_k()));
        }
        assert_eq!(
            frames,
            [(Kind::Repair, 3); 2],
            "the partial block's repairs"
        );
        assert_eq!(edge.close_due(), None);
        assert_eq!(stats.out_link.snapshot().repair_packets, 2);
        assert_eq!(stats.out_link.snapshot().fragmented, 1);
    }

    /// The same through the real incoming link worker, asleep (nothing due; its longest
    /// sleep made 20 s here, 100 ms in service) when a leg leaves a partial block open: the
    /// leg's `sent` wakes it, and it closes the block about [`CLOSE_BLOCK_MS`] later. The
    /// bound (5 s) is generous for a loaded machine, and far below the sleep a missing
    /// wakeup would leave it in.
    #[test]
    fn the_incoming_workers_sleep_does_not_hold_the_legs_block() {
        use crate::routes::PortHooks;
        use std::time::{Duration, Instant};
        let registry = Arc::new(PortRegistry::new([Ipv4Addr::LOCALHOST; 2]));
        let routes = Arc::new(Routes::new(
            &crate::config::Config::embedded_default(),
            Arc::clone(&registry) as Arc<dyn PortHooks>,
        ));
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut cfg = test_config("8+2");
        cfg.out_link.peer = match rx.local_addr().unwrap() {
            std::net::SocketAddr::V4(a) => a,
            _ => unreachable!(),
        };
        let stats = Arc::new(SplitStats::new(&cfg));
        let tx = LinkTx::new(
            Wire::Udp(Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap())),
            &cfg.out_link,
            EDGE_LANE,
            1,
            EDGE_BATCH,
            Arc::clone(&stats),
        );
        registry.edge_link.set(DomainId::A, tx);
        // The incoming link's worker, its peer not this host: a datagram we send it is
        // counted `foreign_source`, which tells us it is awake and about to sleep.
        let link_sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let link_addr = link_sock.local_addr().unwrap();
        let wake = registry.attach_sender().unwrap();
        registry.edge_link.set_waker(Arc::clone(&wake.wake));
        let path = RxPath {
            sock: link_sock,
            registry: Arc::clone(&registry),
            face: cfg.link_face(),
            peer_face: cfg.peer_face,
            peer: Ipv4Addr::new(192, 0, 2, 1),
            split: Arc::clone(&stats),
            local: EgressSockets::new(),
            batch: 8,
            fec: cfg.in_link.fec,
            reorder_ms: 0,
            max_payload: MAX_DATAGRAM,
            overflow_seen: 0,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let worker = spawn(0, None, &routes, &stop, Some(wake), move |_: &Shell| {
            Ok(RxState {
                rx: RecvBatch::new(path.batch, FRAME_CAP + 1),
                dec: Decoder::with_reorder(path.fec, path.reorder_ms),
                join: Joiner::new(false),
                out: Delivery::new(path.batch * BUDGET),
                path,
                idle_cap_ms: 20_000,
            })
        })
        .unwrap();
        let poke = UdpSocket::bind("127.0.0.1:0").unwrap();
        let foreign = || stats.in_link.snapshot().drop_count(LinkDrop::ForeignSource);
        let mut buf = [0u8; 2048];
        for round in 1..=3 {
            poke.send_to(b"wake up", link_addr).unwrap();
            while foreign() < round {
                std::thread::sleep(Duration::from_millis(1));
            }
            // Let it go back to sleep (nothing due: 20 s).
            std::thread::sleep(Duration::from_millis(5));
            let m = registry.edge_link.toward(DomainId::A).unwrap();
            let t0 = Instant::now();
            {
                let mut tx = m.lock().unwrap();
                assert!(tx.push(21000, 30000, round as u32, &[9u8; 4000], now_ms(), 0));
                tx.flush();
                registry.edge_link.sent(&tx);
            }
            let mut kinds = Vec::new();
            while kinds.len() < 5 {
                let n = rx.recv(&mut buf).expect("the block's frames and repairs");
                kinds.push(LinkPacket::new_checked(&buf[..n]).unwrap().kind());
            }
            let took = t0.elapsed();
            assert_eq!(
                kinds,
                [
                    Kind::Data,
                    Kind::Data,
                    Kind::Data,
                    Kind::Repair,
                    Kind::Repair
                ]
            );
            assert!(
                took < Duration::from_secs(5),
                "round {round}: the repairs came after {took:?}"
            );
            // The worker clears the due time just after it sent the repairs (`close_if_due`:
            // `idle` then `sent`), so the frames can arrive here first: wait for it.
            let until = Instant::now() + Duration::from_secs(5);
            while registry.edge_link.close_due().is_some() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
            assert_eq!(registry.edge_link.close_due(), None);
        }
        stop.store(true, Relaxed);
        // Wake it to see the stop (its sleep is long here).
        poke.send_to(b"stop", link_addr).unwrap();
        worker.thread.join().unwrap();
    }
}
