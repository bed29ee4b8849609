//! Opening a half's links: the sockets of the two one-way links (by family), the permanent
//! neighbour entry of the peer, and [`HalfLinks`], which hands each worker its sender and
//! starts the incoming link's worker.

use super::*;

/// A per-start value for the link header's epoch: a restarted sender is told apart. From the
/// OS's randomness like every other identifier vgate makes (a time-seeded value repeats).
pub fn new_epoch() -> u16 {
    let mut b = [0u8; 2];
    // Without randomness the SIP/RTSP proxies refuse to start; here an epoch of 0 only makes
    // a restart look like the same sender until its sequence numbers say otherwise.
    let _ = getrandom::fill(&mut b);
    u16::from_ne_bytes(b)
}

pub(super) fn io_err(what: String) -> impl FnOnce(io::Error) -> EngineError {
    move |source| EngineError::Io { what, source }
}

pub(super) fn bind_on(
    local: SocketAddrV4,
    ifname: &str,
    what: &str,
) -> Result<UdpSocket, EngineError> {
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

/// The outgoing link's shared socket, by family (AF_XDP sockets are per worker).
pub(super) enum OutLink {
    Udp(Arc<UdpSocket>),
    Packet(Arc<OwnedFd>, WireHeader),
    /// One socket per lane, taken by [`HalfLinks::sender`].
    Xdp(Vec<Option<Xsk>>, WireHeader),
}

/// Link interface facts an engine-family link needs: its index and our MAC on it.
pub(super) fn link_interface(cfg: &LinkConfig) -> Result<(u32, [u8; 6]), EngineError> {
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
pub(super) fn wire_header(
    cfg: &LinkConfig,
    index: u32,
    mac: [u8; 6],
) -> Result<WireHeader, EngineError> {
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
pub(super) fn open_packet(cfg: &LinkConfig) -> Result<OutLink, EngineError> {
    let (index, mac) = link_interface(cfg)?;
    let fd = psys::packet_tx_socket(index).map_err(io_err(format!(
        "outgoing link (AF_PACKET on {}): cannot open the packet socket (vgate needs CAP_NET_RAW; PACKET_QDISC_BYPASS needs Linux 3.14, PACKET_VNET_HDR 3.0)",
        cfg.interface
    )))?;
    Ok(OutLink::Packet(Arc::new(fd), wire_header(cfg, index, mac)?))
}

/// UMEM of an outgoing link's AF_XDP socket: 512 chunks, 256 for the (unused) fill ring and
/// 256 for TX — more than a wakeup's frames.
pub(super) const XDP_PARAMS: XskParams = XskParams {
    frame_size: 2048,
    frames: 512,
    ring: 256,
};

/// One AF_XDP socket per lane on the outgoing link's interface, queue = lane, zero-copy
/// where the driver can, else copy mode. No XDP program: they only transmit.
pub(super) fn open_xdp(cfg: &LinkConfig, lanes: usize) -> Result<OutLink, EngineError> {
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
    pub(super) cfg: SplitConfig,
    pub(super) stats: Arc<SplitStats>,
    pub(super) out: OutLink,
    pub(super) incoming: Option<UdpSocket>,
    pub(super) epoch: u16,
    /// The hot-standby gate's openings, followed by every lane ([`LinkTx::follow_activations`]).
    pub(super) activations: Arc<AtomicU64>,
}

impl HalfLinks {
    /// Opens both links: the outgoing one in `family` for `lanes` engine workers (the UDP
    /// socket also installs the peer's neighbour), the incoming link's UDP socket.
    pub fn open(
        cfg: &SplitConfig,
        stats: &Arc<SplitStats>,
        family: LinkFamily,
        lanes: usize,
        routes: &Routes,
    ) -> Result<HalfLinks, EngineError> {
        let out = match family {
            LinkFamily::Udp => OutLink::Udp(open_outgoing(&cfg.out_link)?),
            LinkFamily::Packet => open_packet(&cfg.out_link)?,
            LinkFamily::Xdp => open_xdp(&cfg.out_link, lanes)?,
        };
        stats.out_tx.store(family as u8, Relaxed);
        if let Some(w) = crate::config::split::unauthenticated_warning(cfg) {
            tracing::warn!("{w}");
        }
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
            activations: routes.activations(),
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
            )
            .follow_activations(Arc::clone(&self.activations)),
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
        )
        .follow_activations(Arc::clone(&self.activations)))
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
            auth: LinkAuth::new(self.cfg.in_link.key.as_ref()),
            replay: Replay::default(),
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
