//! The outgoing link's sender ([`LinkTx`], one per worker lane): FEC encoding, fragments,
//! frame headers and the send per wakeup, for each family.

use super::*;

pub(super) static LINK_SEND_ERRORS: RateLimit = RateLimit::new(5000);

/// The Ethernet, IPv4 and UDP headers of every frame on the outgoing link (engine-family
/// sends): fixed but for the lengths, the IPv4 identification and the checksums. Written by
/// the one frame writer of frames vgate builds ([`FrameEnds`]).
#[derive(Clone, Copy, Debug)]
pub struct WireHeader {
    pub ends: FrameEnds,
    /// The link interface's index (frames for a packet socket name it).
    pub ifindex: u32,
    pub(super) ident: u16,
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
pub(super) enum Wire {
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
    pub(super) fn packet(fd: Arc<OwnedFd>, hdr: WireHeader, batch: usize) -> Wire {
        let frames = Box::new(FrameBatch::new(batch.max(1), hdr.ifindex));
        Wire::Packet(fd, hdr, frames)
    }
}

/// Sums of the send outcomes of one flush.
#[derive(Default)]
pub(super) struct Sent {
    pub(super) frames: u64,
    pub(super) bytes: u64,
    pub(super) failed: u64,
    pub(super) last_error: Option<i32>,
}

impl Sent {
    /// Adds one `sendmmsg` outcome; `extra` bytes per frame are headers, not link bytes.
    pub(super) fn add(&mut self, out: &SendOutcome, extra: usize) {
        self.frames += out.sent as u64;
        self.bytes += out.sent_bytes.saturating_sub(out.sent * extra) as u64;
        self.failed += (out.queue_full + out.errors) as u64;
        self.last_error = out.last_error.or(self.last_error);
    }
}

/// One worker's sender on the outgoing link.
pub struct LinkTx {
    pub(super) wire: Wire,
    pub(super) peer: SocketAddrV4,
    pub(super) enc: Encoder,
    pub(super) batch: SliceBatch,
    pub(super) stats: Arc<SplitStats>,
    pub(super) block_opened_ms: u64,
    pub(super) repair_published: u64,
    /// Longest datagram sent (`split.out_link.max_datagram`), cut into fragments.
    pub(super) max_datagram: usize,
    /// Seals every frame (epoch and MAC trailer) before it is sent.
    pub(super) auth: LinkAuth,
    /// This lane's epoch ([`next_epoch`] at its start, one more at each sequence wrap) and
    /// whether it sealed a frame yet.
    pub(super) epoch: u64,
    pub(super) sealed: bool,
    /// The hot-standby gate's openings ([`crate::routes::Routes::activations`]) and the
    /// count this lane last saw: when it moved (this node took over), the lane takes a new
    /// epoch at its next flush, newer than any the old active's lanes used.
    pub(super) activations: Option<(Arc<AtomicU64>, u64)>,
}

impl LinkTx {
    pub(super) fn new(
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
            enc: Encoder::new(lane, epoch, cfg.fec, batch).with_trailer(TRAILER_LEN),
            batch: SliceBatch::new(slots),
            stats,
            block_opened_ms: 0,
            repair_published: 0,
            max_datagram: cfg.max_datagram.min(MAX_DATAGRAM),
            auth: LinkAuth::new(cfg.key.as_ref()),
            epoch: next_epoch(crate::clock::wall_ms().saturating_mul(1000)),
            sealed: false,
            activations: None,
        }
    }

    /// Follows the hot-standby gate's openings `activations`: the lane takes a new epoch at
    /// the first flush after each (a node that takes over sends on the link as a new sender
    /// would, and the receiving half accepts it).
    pub fn follow_activations(mut self, activations: Arc<AtomicU64>) -> LinkTx {
        let seen = activations.load(Relaxed);
        self.activations = Some((activations, seen));
        self
    }

    /// A new epoch when the gate opened since the last flush (one relaxed load per flush).
    fn epoch_after_takeover(&mut self) {
        if let Some((a, seen)) = &mut self.activations {
            let now = a.load(Relaxed);
            if now != *seen {
                *seen = now;
                // `sealed` stays: the sequence goes on, so a later wrap still moves the
                // epoch on and no (epoch, lane, sequence) repeats.
                self.epoch = next_epoch(crate::clock::wall_ms().saturating_mul(1000));
            }
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
        // A block open longer than its closing time is closed first, also while traffic
        // flows (the block code's blocks are sized by time as well as by count).
        if self.enc.block_open() && now_ms >= self.block_opened_ms + self.enc.close_ms() {
            self.enc.close_block(ts_us);
            self.flush();
        }
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
        self.epoch_after_takeover();
        let (auth, epoch, sealed) = (&self.auth, &mut self.epoch, &mut self.sealed);
        self.enc.seal(|f| {
            // Sequence 0 again: the lane's sequence wrapped, so its epoch moves on (the
            // receiver's window would take the old sequences for replays otherwise).
            if LinkPacket::new_unchecked(&*f).sequence() == 0 && *sealed {
                *epoch += 1;
            }
            *sealed = true;
            auth.seal(f, *epoch);
        });
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
            .then_some(self.block_opened_ms + self.enc.close_ms())
    }

    /// How long the worker may sleep (at most `most` ms): until the open block is due to be
    /// closed, so its repair frames leave on time when the sender goes quiet.
    pub fn sleep_ms(&self, now_ms: u64, most: u16) -> u16 {
        match self.close_due_ms() {
            Some(due) => due.saturating_sub(now_ms).clamp(1, u64::from(most)) as u16,
            None => most,
        }
    }

    /// Called on every worker wakeup: closes a partial FEC block older than its code's
    /// closing time ([`CLOSE_BLOCK_MS`] for `K+M`, `fec_block_ms` for the block code) and
    /// sends its repair frames; takes back sent AF_XDP chunks.
    pub fn idle(&mut self, now_ms: u64) {
        if self.enc.block_open()
            && now_ms.saturating_sub(self.block_opened_ms) >= self.enc.close_ms()
        {
            self.enc.close_block(crate::clock::wall_us());
            self.flush();
        }
        if let Wire::Xdp(xsk, _) = &mut self.wire {
            xsk.reclaim();
        }
    }
}
