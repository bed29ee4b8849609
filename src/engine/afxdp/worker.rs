//! The afxdp worker: one AF_XDP socket per interface on its queue, the receive loop, the
//! route decision through `frames`, and TX (own socket, another interface's, or the fast path).

use super::*;

// ---- the worker ---------------------------------------------------------------------------

pub(super) struct WorkerXsk {
    pub(super) xsk: Xsk,
    pub(super) iface: usize,
    pub(super) queue: u32,
    /// Domains whose media arrive on this socket's interface.
    pub(super) domains: Vec<DomainId>,
    /// The channel that counts what cannot be classified.
    pub(super) fallback: Channel,
    /// Kernel drops already counted.
    pub(super) dropped: u64,
    /// [`Xsk::tx_busy_drops`] already counted.
    pub(super) busy_seen: u64,
}

/// What a worker's forwarding needs besides its sockets.
pub(super) struct WorkerCtx {
    pub(super) index: usize,
    pub(super) routes: Arc<Routes>,
    pub(super) targets: Targets,
    pub(super) max_payload: usize,
    pub(super) tx_path: TxPath,
    /// Per egress domain: this worker's socket (index) for AF_XDP TX.
    pub(super) tx_sock: [Option<usize>; 2],
    pub(super) src_mac: [[u8; 6]; 2],
    pub(super) egress_ifindex: [u32; 2],
    /// Worker 0 in mode xdp: polls the fast path's counters.
    pub(super) fast: Option<Arc<FastPath>>,
    /// Worker 0: adds what the XDP program dropped for ports without a route.
    pub(super) noroute: Option<Arc<NoRouteCount>>,
    /// Microseconds to keep polling the rings after work before sleeping (`VGATE_AFXDP_SPIN_US`).
    pub(super) spin_us: u32,
    /// Sleep in `poll(2)`, which also kicks TX (`VGATE_AFXDP_WAIT`).
    pub(super) sleep_in_poll: bool,
    /// Kick TX once this many frames wait, even while RX keeps coming (`VGATE_AFXDP_KICK_AT`).
    pub(super) kick_at: u32,
}

pub(super) static SEND_ERRORS: RateLimit = RateLimit::new(5000);

/// One afxdp worker: its sockets (one per RX queue it serves), the egress sockets, batches.
pub(super) struct XskPath {
    pub(super) ctx: WorkerCtx,
    pub(super) socks: Vec<WorkerXsk>,
    pub(super) local: EgressSockets,
    pub(super) txb: SliceBatch,
    pub(super) frames: Vec<RxFrame>,
    pub(super) neigh: Neighbours,
    /// Split half: the link-face domain and this worker's sender on the outgoing link.
    pub(super) link: Option<(DomainId, LinkTx)>,
}

impl Datapath for XskPath {
    fn register(&mut self, poller: &Poller) -> io::Result<()> {
        for (i, s) in self.socks.iter().enumerate() {
            poller.add(s.xsk.as_fd(), i as u64)?;
        }
        Ok(())
    }

    fn poll(&mut self, shell: &Shell) -> bool {
        let media = &mut *shell.media.borrow_mut();
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
                        media,
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
                        media,
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

    /// Sleeps no longer than the link's open FEC block may stay open.
    fn idle_ms(&self) -> u16 {
        match &self.link {
            Some((_, l)) => l.sleep_ms(now_ms(), 100),
            None => 100,
        }
    }

    fn idle(&mut self, _shell: &Shell) {
        // The link's open FEC block is closed if due (its frames are sent by the kicks).
        if let Some((_, l)) = self.link.as_mut() {
            l.idle(now_ms());
        }
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
pub(super) fn kick(worker: usize, xsk: &mut Xsk) {
    if let Err(e) = xsk.tx_kick() {
        if let Some(suppressed) = SEND_ERRORS.check(now_ms()) {
            tracing::warn!(worker, suppressed, "AF_XDP TX: {e}");
        }
    }
}

/// A worker about to sleep in `poll(2)`: whether a socket with `queued` TX frames waiting,
/// whose last kick `stopped` early, must be kicked first (the poll sends only
/// [`POLL_TX_BUDGET`], and nothing for a stopped device until RX wakes the worker).
pub(super) fn poll_needs_kick(queued: u32, stopped: bool) -> bool {
    queued > POLL_TX_BUDGET || (queued > 0 && stopped)
}

pub(super) static TX_STALLS: RateLimit = RateLimit::new(5000);

/// Per sample: frames the egress device dropped after a kick (`EBUSY`) move from the channel's
/// `tx_packets` to `drop_send_error` (per channel only, like the fast path's redirect
/// failures: the route is not known any more); a TX ring that kept frames with none taken
/// since the last sample (sends failing, e.g. the interface is down, or the poll-driven send
/// erroring unseen) counts a [`WorkerStats::ring_freezes`] and is logged (rate-limited).
///
/// [`WorkerStats::ring_freezes`]: crate::channel::WorkerStats::ring_freezes
pub(super) fn tx_health(shell: &Shell, ctx: &WorkerCtx, socks: &mut [WorkerXsk]) {
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
pub(super) fn kick_waiting(worker: usize, socks: &mut [WorkerXsk]) {
    for s in socks.iter_mut() {
        if s.xsk.tx_waiting() {
            kick(worker, &mut s.xsk);
        }
    }
}

/// `VGATE_AFXDP_KICK_AT` (1–2048): TX frames after which a busy worker kicks the kernel;
/// default [`TX_KICK_AT`]; 1 kicks after every RX batch (the behaviour before, for A/B).
pub(super) fn kick_at_from_env() -> u32 {
    numeric_knob("VGATE_AFXDP_KICK_AT", TX_KICK_AT, 1, RING)
}

/// `VGATE_AFXDP_WAIT=poll|epoll`: how an idle worker sleeps (see
/// [`Datapath::sleep_in_poll`]); default [`WAIT_IN_POLL`].
pub(super) fn sleep_in_poll_from_env() -> bool {
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
pub(super) fn spin_from_env() -> u32 {
    numeric_knob("VGATE_AFXDP_SPIN_US", SPIN_US, 0, 1000)
}

/// The socket to transmit on for what arrives on `s`, in AF_XDP TX mode.
pub(super) fn egress_sock(ctx: &WorkerCtx, s: &WorkerXsk) -> Option<usize> {
    if ctx.tx_path != TxPath::Xdp {
        return None;
    }
    match s.domains.as_slice() {
        [d] => ctx.tx_sock[d.other().index()],
        _ => None,
    }
}

pub(super) fn two_mut<T>(v: &mut [T], i: usize, j: usize) -> (&mut T, &mut T) {
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
pub(super) struct NoRouteCount {
    pub(super) map: Map,
    /// Per domain, (packets, bytes) already added, and the buffer a lookup reads the
    /// per-CPU values into (kept: no allocation per sample); only worker 0 polls.
    pub(super) seen: Mutex<NoRouteSeen>,
}

/// Per domain, (packets, bytes) already added; the lookup buffer.
pub(super) type NoRouteSeen = ([(u64, u64); 2], Vec<u8>);

impl NoRouteCount {
    pub(super) fn create() -> io::Result<NoRouteCount> {
        Ok(NoRouteCount {
            map: Map::create(bpf::BPF_MAP_TYPE_PERCPU_ARRAY, 4, 16, 2, "vgate_noroute")?,
            seen: Mutex::new(([(0, 0); 2], Vec::new())),
        })
    }

    /// Per domain, (packets, bytes) so far, summed over CPUs; `buf` is resized once.
    pub(super) fn read(&self, buf: &mut Vec<u8>) -> [(u64, u64); 2] {
        buf.resize(self.map.lookup_len(), 0);
        let mut out = [(0, 0); 2];
        for (d, o) in out.iter_mut().enumerate() {
            if self.map.lookup(&(d as u32).to_ne_bytes(), buf).is_ok() {
                *o = crate::engine::xdp::sum_cpus(buf);
            }
        }
        out
    }

    /// Adds what grew since the last poll to the channel of each ingress domain.
    pub(super) fn poll(&self, shell: &Shell) {
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
pub(super) fn socket_stats(shell: &Shell, socks: &mut [WorkerXsk]) {
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
pub(super) static IDENT: AtomicU16 = AtomicU16::new(1);

/// AF_XDP TX state borrowed for one batch.
pub(super) struct XdpOut<'a> {
    pub(super) xsk: &'a mut Xsk,
    pub(super) neigh: &'a mut Neighbours,
    pub(super) ident: &'static AtomicU16,
}

/// Where one batch's packets go.
pub(super) enum Out<'a, 's, 'p> {
    Sockets(SliceScope<'s, 'p>),
    Xdp(XdpOut<'a>),
}

/// Forwards one RX batch of socket `s`; adds per-channel figures to `chan`.
#[allow(clippy::too_many_arguments)]
pub(super) fn forward_batch<'p>(
    ctx: &WorkerCtx,
    s: &'p WorkerXsk,
    frames: &'p mut [RxFrame],
    local: &'p EgressSockets,
    mut out: Out<'_, '_, 'p>,
    mut link: Option<&mut (DomainId, LinkTx)>,
    now: u64,
    chan: &mut [Tally; 2],
    media: &mut crate::channel::Validators,
) {
    let ts = crate::clock::wall_us();
    let mut run: Option<Run<'p>> = None;
    for f in frames.iter_mut() {
        // Writable: a stripping route has its payload rewritten in the UMEM chunk.
        let data = s.xsk.frame_mut(f);
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
        let src = SocketAddrV4::new(d.src_addr, d.src_port);
        let (at, n) = (d.payload_at, d.payload.len());
        let payload = &mut data[at..at + n];
        let Some((dest, fd, len)) = r.admit(src, payload, ok, false, ctx.max_payload, media) else {
            continue;
        };
        let payload: &'p [u8] = &payload[..len];
        if let Some((_, l)) = link.as_mut().filter(|(face, _)| *face == channel.egress()) {
            // Split half: the far side is the peer half, down the outgoing link.
            if let Some(route) = r.route.as_deref() {
                l.forward(route, payload, now, ts, &mut r.tally);
            }
            continue;
        }
        match &mut out {
            Out::Sockets(scope) => {
                if scope.is_full() {
                    let o = fd.send(scope, dest);
                    account(&mut r.tally, &o, r.route.as_deref());
                }
                scope.push(payload);
            }
            Out::Xdp(x) => {
                if let Some(route) = r.route.as_deref() {
                    xdp_send(ctx, x, channel, route, payload, fd, now, &mut r.tally);
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
pub(super) fn xdp_send(
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
pub(super) fn finish_run(
    mut r: Run<'_>,
    out: &mut Out<'_, '_, '_>,
    now: u64,
    chan: &mut [Tally; 2],
) {
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
