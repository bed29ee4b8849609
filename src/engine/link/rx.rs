//! The incoming link's worker: receive, check, repair, reorder and join, then deliver each
//! datagram to the link face as a domain packet (route lookup, `inspect`, egress).

use super::*;

/// The incoming link's worker: what crosses threads at start.
pub(super) struct RxPath {
    pub(super) sock: UdpSocket,
    /// For the legs' sender on the outgoing link ([`EdgeLink::close_if_due`]).
    pub(super) registry: Arc<PortRegistry>,
    pub(super) face: DomainId,
    pub(super) peer_face: Ipv4Addr,
    pub(super) peer: Ipv4Addr,
    pub(super) split: Arc<SplitStats>,
    pub(super) local: EgressSockets,
    pub(super) batch: usize,
    pub(super) fec: Option<Fec>,
    /// The reorder window's longest wait (0: datagrams are handed on as they arrive).
    pub(super) reorder_ms: u64,
    pub(super) max_payload: usize,
    pub(super) overflow_seen: u32,
    /// Checks each frame's MAC (`split.in_link.key`; none: only strips the trailer).
    pub(super) auth: LinkAuth,
    /// Every lane's replay window, after the MAC and before the decoder.
    pub(super) replay: Replay,
}

/// The incoming link's worker, with its buffers (built on its own thread).
pub(super) struct RxState {
    pub(super) path: RxPath,
    pub(super) rx: RecvBatch,
    pub(super) dec: Decoder,
    pub(super) join: Joiner,
    pub(super) out: Delivery,
    /// The longest sleep with nothing due ([`IDLE_MS`]; a test makes it long so that only a
    /// wakeup, never the sleep's end, can close the legs' block in time).
    pub(super) idle_cap_ms: u16,
}

/// The incoming link worker's longest sleep with nothing due.
pub(super) const IDLE_MS: u16 = 100;

/// One datagram waiting in a [`Delivery`]: its route, the egress socket, its length.
pub(super) struct Waiting {
    pub(super) route: Arc<StreamRoute>,
    pub(super) sock: Arc<UdpSocket>,
    pub(super) len: usize,
}

/// Datagrams delivered from the incoming link during one wakeup, copied (they come from the
/// receive batch or the decoder's rebuilt shards, both reused before the wakeup ends) and
/// sent together by [`Delivery::send`]. Allocated once; never grows.
pub(super) struct Delivery {
    pub(super) buf: Box<[u8]>,
    pub(super) waiting: Vec<Waiting>,
    pub(super) tx: SliceBatch,
}

impl Delivery {
    pub(super) fn new(cap: usize) -> Delivery {
        let cap = cap.max(1);
        Delivery {
            buf: vec![0u8; cap * FRAME_CAP].into_boxed_slice(),
            waiting: Vec::with_capacity(cap),
            tx: SliceBatch::new(cap),
        }
    }

    pub(super) fn is_full(&self) -> bool {
        self.waiting.len() == self.waiting.capacity()
    }

    /// Queues a copy of `payload` (at most [`FRAME_CAP`] bytes: a link frame's payload) for
    /// `route`'s destination from `sock`. The caller sends first when [`Delivery::is_full`].
    pub(super) fn queue(&mut self, route: Arc<StreamRoute>, sock: Arc<UdpSocket>, payload: &[u8]) {
        let i = self.waiting.len();
        let len = payload.len().min(FRAME_CAP);
        self.buf[i * FRAME_CAP..i * FRAME_CAP + len].copy_from_slice(&payload[..len]);
        self.waiting.push(Waiting { route, sock, len });
    }

    /// Sends what is queued, one `sendmmsg` per run of one route, and counts it in the
    /// routes and in `chan` (the link face's channel).
    pub(super) fn send(&mut self, chan: &mut Tally) {
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

pub(super) static RX_ERRORS: RateLimit = RateLimit::new(5000);
pub(super) static VERSION_LOG: RateLimit = RateLimit::new(10_000);
pub(super) static AUTH_LOG: RateLimit = RateLimit::new(10_000);

/// Opens one frame from the wire: the trailer's length, the header, the MAC, the replay
/// window, in that order (a forged frame never moves a window). The checked view and
/// the frame without its trailer, or the drop it counts as.
pub(super) fn open_frame<'a>(
    auth: &LinkAuth,
    replay: &mut Replay,
    wire: &'a [u8],
) -> Result<LinkPacket<&'a [u8]>, LinkDrop> {
    let Some(body) = wire.len().checked_sub(TRAILER_LEN) else {
        // Too short for a trailer: garbage or another version says so; else no MAC.
        return Err(match LinkPacket::new_checked(wire) {
            Err(e @ (HeaderError::Garbage | HeaderError::BadVersion)) => LinkDrop::from_header(e),
            _ if auth.keyed() => LinkDrop::BadMac,
            _ => LinkDrop::Truncated,
        });
    };
    let p = LinkPacket::new_checked(&wire[..body]).map_err(LinkDrop::from_header)?;
    let (_, epoch) = auth.open(wire).map_err(|_| LinkDrop::BadMac)?;
    match replay.check(p.lane(), epoch, p.sequence()) {
        Ok(Taken::InWindow | Taken::NewEpoch) => Ok(p),
        Err(Refusal::Duplicate) => Err(LinkDrop::Duplicate),
        Err(Refusal::Old) => Err(LinkDrop::ReplayOld),
        Err(Refusal::StaleEpoch) => Err(LinkDrop::StaleEpoch),
    }
}

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
pub(super) fn on_datagram(
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

pub(super) fn count_drops(link: &LinkCounters, drops: &[u64; LinkDrop::COUNT]) {
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
pub(super) fn deliver_one(
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
    let media = &mut *shell.media.borrow_mut();
    match inspect(&route, from, payload, false, ctx.max_payload, now, media) {
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
pub(super) fn send_delivery(shell: &Shell, ctx: &RxPath, out: &mut Delivery) {
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

pub(super) fn drain(
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
            let p = match open_frame(&ctx.auth, &mut ctx.replay, frame) {
                Ok(p) => p,
                Err(d) => {
                    drops[d as usize] += 1;
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
        let refused = drops[LinkDrop::BadMac as usize] + drops[LinkDrop::StaleEpoch as usize];
        if refused > 0 {
            if let Some(suppressed) = AUTH_LOG.check(now) {
                tracing::warn!(
                    suppressed,
                    bad_mac = drops[LinkDrop::BadMac as usize],
                    stale_epoch = drops[LinkDrop::StaleEpoch as usize],
                    "link frames refused: bad_mac (forged, or split.in_link.key differs from the peer's split.out_link.key) or stale_epoch (a previous sender process's frames, or the peer's clock stepped back across its restart)"
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
