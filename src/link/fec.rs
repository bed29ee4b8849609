//! Forward error correction on a one-way link: the sender's [`Encoder`] and the receiver's
//! [`Decoder`]. Pure logic over caller-visible buffers: no I/O, no clock, no allocation per
//! packet (every buffer is allocated when the encoder, or a decoder lane, is created).
//!
//! ## The code: systematic Reed-Solomon over GF(2^8) (`reed-solomon-erasure`)
//!
//! Packets are grouped in blocks of `k` data packets followed by `m` repair packets; any `k`
//! of the `k + m` rebuild the block. We chose `reed-solomon-erasure` over `raptorq`:
//! - it is systematic and block-exact: data packets go out unchanged the moment they arrive,
//!   and a block of `k` media packets is protected by exactly `m` more, which is the knob an
//!   operator understands (8+2 = 25 % overhead, repairs any 2 losses in 10);
//! - at the block sizes that keep latency low (k ≤ 32) an MDS code is optimal — RaptorQ's
//!   advantage is huge objects with thousands of symbols, which live video never forms, and
//!   it allocates per object;
//! - its encoder works on caller-owned slices, so the sender encodes straight from the
//!   frames it has just sent, and its decoder reconstructs in place into the receiver's
//!   preallocated block buffers. Its work arrays are `SmallVec`s inline up to 32 shards
//!   (hence k ≤ 32); on a repair it takes an uncontended lock on its decode-matrix cache
//!   and, on a cache miss, inverts a k×k matrix: once per repaired block, never per packet.
//! - it is well kept (used by several storage systems), pure Rust, and builds with 1.95.
//!
//! Shards have variable length (media packets differ in size): the shard of a data packet is
//! its link header's last six bytes (destination port, source port, length) followed by the
//! payload (see [`crate::wire::link`]); a block's shards are zero-padded to the longest one, and
//! the repair packets carry that length. A partial block (the sender went idle) is closed
//! with `k' < k` data packets; its repair packets say `k'`.
//!
//! ## The receiver's window
//!
//! Each sending worker is a *lane* with its own blocks. The receiver keeps the last
//! [`WINDOW_BLOCKS`] blocks of every lane: packets arriving out of order within that window
//! are placed in their block, and a block is rebuilt as soon as enough of it has arrived.
//! Without a reorder window data packets are delivered the moment they arrive and rebuilt
//! ones as soon as their block can be decoded (so behind later ones); with one
//! ([`Decoder::with_reorder`], [`super::reorder`]) each lane's datagrams are handed on in the
//! sender's order, a datagram behind a gap waiting at most the window's time. Blocks
//! pushed out of the window, or quiet for [`Decoder::settle`]'s age, count what they never
//! got as lost; a datagram of a settled block that still arrives (or is rebuilt) while the
//! block is in the window is handed on, counted late and taken off lost (a sending worker
//! that stalled mid-block loses nothing). With FEC off the lane only follows the sequence: gaps count as lost, late
//! arrivals are delivered and counted.

use reed_solomon_erasure::galois_8::ReedSolomon;

use super::reorder::{Reorder, ReorderCounts};
use crate::wire::link::{
    Fields, HeaderError, Kind, LinkPacket, HEADER_LEN, MAX_K, MAX_M, SHARD_PREFIX, SHARD_START,
};

pub use crate::wire::link::{data_mask, FRAME_CAP, MAX_LANES, MAX_PAYLOAD};
/// Room before each of the sender's frames for the Ethernet, IPv4 and UDP headers: an
/// engine-family link ([`crate::engine::link`]) writes them there, in place, so the frame
/// and its headers are one contiguous buffer (no copy, one iovec).
pub const HEADROOM: usize = crate::wire::UDP4_FRAME_HEADERS;
/// One sender slot: headroom, then a frame.
const SLOT: usize = HEADROOM + FRAME_CAP;
/// Blocks of one lane the receiver keeps (the reorder and repair window).
pub const WINDOW_BLOCKS: usize = 8;
/// FEC-off reorder tolerance: a sequence this far behind is a restart, not a late packet.
const RESTART_GAP: u32 = 1 << 20;

/// A link's FEC setting: `k` data + `m` repair packets per block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fec {
    pub k: u8,
    pub m: u8,
}

impl Fec {
    /// Parses `off` (None) or `K+M`.
    pub fn parse(s: &str) -> Result<Option<Fec>, String> {
        if s == "off" {
            return Ok(None);
        }
        let bad = || {
            format!(
                "expected \"off\" or \"K+M\" (K data and M repair packets per block, 1 <= K <= {MAX_K}, 1 <= M <= {MAX_M}), e.g. \"8+2\""
            )
        };
        let (k, m) = s.split_once('+').ok_or_else(bad)?;
        let k: u8 = k.trim().parse().map_err(|_| bad())?;
        let m: u8 = m.trim().parse().map_err(|_| bad())?;
        if !(1..=MAX_K).contains(&k) || !(1..=MAX_M).contains(&m) {
            return Err(bad());
        }
        Ok(Some(Fec { k, m }))
    }

    /// Repair bytes per data byte, as a fraction (m / k).
    pub fn overhead(&self) -> f64 {
        f64::from(self.m) / f64::from(self.k)
    }
}

impl std::fmt::Display for Fec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}+{}", self.k, self.m)
    }
}

/// One codec per possible block size `1..=k` (partial blocks), built once.
fn codecs(fec: Fec) -> Vec<ReedSolomon> {
    (1..=fec.k)
        .map(|k| {
            ReedSolomon::new(usize::from(k), usize::from(fec.m))
                .expect("k and m were checked against the code's limits")
        })
        .collect()
}

/// The sender's side of one lane: frames are written into preallocated slots, sent by the
/// caller from [`Encoder::ready`], and a block's repair frames are computed from the data
/// frames in place.
pub struct Encoder {
    lane: u8,
    epoch: u16,
    fec: Option<Fec>,
    codecs: Vec<ReedSolomon>,
    /// `slots` slots of [`HEADROOM`] + [`FRAME_CAP`] bytes: data `0..k`, repair `k..k+m`
    /// (FEC on); a plain batch of frames (FEC off).
    frames: Box<[u8]>,
    lens: Box<[usize]>,
    slots: usize,
    /// Data frames written in the current block (or batch).
    filled: usize,
    /// Repair frames computed for the current block.
    repairs: usize,
    /// Frames already handed out by `ready` and sent.
    sent: usize,
    block: u32,
    sequence: u32,
    /// Frames and bytes written, repair frames among them.
    pub frames_out: u64,
    pub repair_out: u64,
}

impl Encoder {
    /// `batch` is the number of frames queued before a send when FEC is off.
    pub fn new(lane: u8, epoch: u16, fec: Option<Fec>, batch: usize) -> Encoder {
        let slots = match fec {
            Some(f) => usize::from(f.k) + usize::from(f.m),
            None => batch.max(1),
        };
        Encoder {
            lane,
            epoch,
            fec,
            codecs: fec.map(codecs).unwrap_or_default(),
            frames: vec![0u8; slots * SLOT].into_boxed_slice(),
            lens: vec![0; slots].into_boxed_slice(),
            slots,
            filled: 0,
            repairs: 0,
            sent: 0,
            block: 0,
            sequence: 0,
            frames_out: 0,
            repair_out: 0,
        }
    }

    fn data_slots(&self) -> usize {
        self.fec.map(|f| usize::from(f.k)).unwrap_or(self.slots)
    }

    /// Whether the caller must send [`Encoder::ready`] before the next [`Encoder::push`].
    pub fn must_flush(&self) -> bool {
        match self.fec {
            Some(f) => self.repairs == usize::from(f.m),
            None => self.filled == self.slots,
        }
    }

    /// Writes one datagram for gateway port `dst` from egress port `src` as the next data
    /// frame; when that completes a block, its repair frames are computed too. `false` (and
    /// nothing written) when the payload does not fit a link frame or a flush is due.
    pub fn push(&mut self, dst: u16, src: u16, payload: &[u8], ts_us: u32) -> bool {
        self.push_parts(dst, src, &[], payload, ts_us)
    }

    /// [`Encoder::push`] of the link datagram `head` followed by `body` (a stream header and
    /// the media), written straight into the frame.
    pub fn push_parts(&mut self, dst: u16, src: u16, head: &[u8], body: &[u8], ts_us: u32) -> bool {
        let len = head.len() + body.len();
        if len > MAX_PAYLOAD || self.must_flush() {
            return false;
        }
        let i = self.filled;
        let (k, m) = self.fec.map(|f| (f.k, f.m)).unwrap_or((0, 0));
        let f = &mut self.frames[i * SLOT + HEADROOM..(i + 1) * SLOT];
        crate::wire::link::write_fields(
            f,
            &Fields {
                repair: false,
                lane: self.lane,
                k,
                m,
                index: if k == 0 { 0 } else { i as u8 },
                sequence: self.sequence,
                block: self.block,
                timestamp_us: ts_us,
                epoch: self.epoch,
            },
        );
        crate::wire::link::write_shard_prefix(f, dst, src, len as u16);
        f[HEADER_LEN..HEADER_LEN + head.len()].copy_from_slice(head);
        f[HEADER_LEN + head.len()..HEADER_LEN + len].copy_from_slice(body);
        self.lens[i] = HEADER_LEN + len;
        self.filled += 1;
        self.sequence = self.sequence.wrapping_add(1);
        self.frames_out += 1;
        if self.fec.is_some() && self.filled == self.data_slots() {
            self.encode(ts_us);
        }
        true
    }

    /// Closes a partial block (FEC on): its repair frames are computed for the data frames
    /// written so far. Called when the sender goes idle, so the last packets of a burst are
    /// protected without waiting for more traffic.
    pub fn close_block(&mut self, ts_us: u32) {
        if self.fec.is_some() && self.filled > 0 && self.repairs == 0 {
            self.encode(ts_us);
        }
    }

    /// Whether a partial block is waiting for more data (FEC on).
    pub fn block_open(&self) -> bool {
        self.fec.is_some() && self.filled > 0 && self.repairs == 0
    }

    fn encode(&mut self, ts_us: u32) {
        let Some(fec) = self.fec else { return };
        let (k, m) = (usize::from(fec.k), usize::from(fec.m));
        let kk = self.filled;
        let shard_len = self.lens[..kk].iter().max().copied().unwrap_or(HEADER_LEN) - SHARD_START;
        let (data, parity) = self.frames.split_at_mut(k * SLOT);
        // Zero each data shard's padding: the code sees every shard at the block's length.
        for (i, slot) in data.chunks_mut(SLOT).take(kk).enumerate() {
            slot[HEADROOM..][self.lens[i]..SHARD_START + shard_len].fill(0);
        }
        let mut ins: [&[u8]; MAX_K as usize] = Default::default();
        for (i, slot) in data.chunks(SLOT).take(kk).enumerate() {
            ins[i] = &slot[HEADROOM..][SHARD_START..SHARD_START + shard_len];
        }
        let mut outs: [&mut [u8]; MAX_M as usize] = Default::default();
        for (j, slot) in parity.chunks_mut(SLOT).take(m).enumerate() {
            let chunk = &mut slot[HEADROOM..];
            crate::wire::link::write_fields(
                chunk,
                &Fields {
                    repair: true,
                    lane: self.lane,
                    k: kk as u8,
                    m: fec.m,
                    index: (kk + j) as u8,
                    sequence: self.sequence.wrapping_add(j as u32),
                    block: self.block,
                    timestamp_us: ts_us,
                    epoch: self.epoch,
                },
            );
            outs[j] = &mut chunk[SHARD_START..SHARD_START + shard_len];
        }
        self.codecs[kk - 1]
            .encode_sep(&ins[..kk], &mut outs[..m])
            .expect("shards of equal length, counts from the codec");
        for j in 0..m {
            self.lens[k + j] = SHARD_START + shard_len;
        }
        self.repairs = m;
        self.sequence = self.sequence.wrapping_add(m as u32);
        self.frames_out += m as u64;
        self.repair_out += m as u64;
    }

    /// The slots written and not yet sent, in order (data, then the block's repairs); owns
    /// its indices, so the slots may be written while it runs.
    fn ready_slots(&self) -> impl Iterator<Item = usize> + use<> {
        let (k, sent, filled) = (self.data_slots(), self.sent, self.filled);
        let repair = (sent.saturating_sub(filled)..self.repairs).map(move |j| k + j);
        (sent.min(filled)..filled).chain(repair)
    }

    /// Frames written and not yet sent, in order (data, then the block's repairs).
    pub fn ready(&self) -> impl Iterator<Item = &[u8]> {
        self.ready_slots().map(move |s| {
            let at = s * SLOT + HEADROOM;
            &self.frames[at..at + self.lens[s]]
        })
    }

    /// The same frames as [`Encoder::ready`], each with its [`HEADROOM`] in front, writable:
    /// `write(buf)` fills the headroom of `buf` (headroom + frame) for the wire.
    pub fn fill_headroom(&mut self, mut write: impl FnMut(&mut [u8])) {
        for s in self.ready_slots() {
            let at = s * SLOT;
            write(&mut self.frames[at..at + HEADROOM + self.lens[s]]);
        }
    }

    /// [`Encoder::ready`] with each frame's headroom in front (after
    /// [`Encoder::fill_headroom`]): whole wire frames.
    pub fn ready_wire(&self) -> impl Iterator<Item = &[u8]> {
        self.ready_slots().map(move |s| {
            let at = s * SLOT;
            &self.frames[at..at + HEADROOM + self.lens[s]]
        })
    }

    /// Marks everything [`Encoder::ready`] returned as sent; a finished block (or batch)
    /// frees its slots.
    pub fn mark_sent(&mut self) {
        self.sent = self.filled + self.repairs;
        let done = match self.fec {
            Some(_) => self.repairs > 0,
            None => true,
        };
        if done {
            if self.fec.is_some() {
                self.block = self.block.wrapping_add(1);
            }
            self.filled = 0;
            self.repairs = 0;
            self.sent = 0;
        }
    }
}

/// What a receiver counted, cumulative. Single writer (the link's receive worker).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecoderCounts {
    /// Frames accepted into a lane (data and repair).
    pub frames: u64,
    pub repair_frames: u64,
    /// Datagrams handed on, as received.
    pub delivered: u64,
    /// Datagrams rebuilt from repair frames and handed on.
    pub repaired: u64,
    /// Datagrams that never arrived and could not be rebuilt.
    pub lost: u64,
    /// Arrived after their block left the window (FEC on; dropped) or behind the sequence
    /// (FEC off; delivered).
    pub late: u64,
    pub duplicate: u64,
    /// The FEC fields do not match this link's setting (the halves' configs disagree).
    pub fec_mismatch: u64,
    /// A lane started over (the peer half restarted).
    pub restarts: u64,
    /// The reorder windows' counts, summed over the lanes (zero when reordering is off).
    pub reorder: ReorderCounts,
}

/// Where a lane's datagrams go: straight to the caller, or through the lane's reorder
/// window, which hands them on in the sender's order.
struct Out<'a, F> {
    order: Option<&'a mut Reorder>,
    deliver: &'a mut F,
    now: u64,
}

impl<F: FnMut(u16, u16, &[u8], bool)> Out<'_, F> {
    fn data(&mut self, pos: u32, dst: u16, src: u16, payload: &[u8], repaired: bool) {
        match self.order.as_deref_mut() {
            Some(r) => r.offer(pos, dst, src, payload, repaired, self.now, self.deliver),
            None => (self.deliver)(dst, src, payload, repaired),
        }
    }

    fn skip(&mut self, from: u32, to: u32) {
        if let Some(r) = self.order.as_deref_mut() {
            r.skip(from, to, self.deliver);
        }
    }
}

#[derive(Clone, Copy, Default)]
struct Block {
    id: u32,
    used: bool,
    /// Data packets in this block: `k` until a repair frame says `k' < k`.
    k: usize,
    present: u64,
    delivered: u64,
    /// Length of the repair shards (all equal), once one arrived.
    shard_len: usize,
    /// Settled: its losses are counted.
    settled: bool,
    last_ms: u64,
}

struct Lane {
    epoch: u16,
    /// Oldest block in the window (FEC on) / next expected sequence (FEC off).
    base: u32,
    started: bool,
    blocks: [Block; WINDOW_BLOCKS],
    /// Shard buffers: `WINDOW_BLOCKS × (k+m)` × [`FRAME_CAP`] (FEC on; empty when off).
    shards: Box<[u8]>,
    shard_lens: Box<[usize]>,
}

/// The receiver's side of a link: lanes, their windows and the erasure decoder.
pub struct Decoder {
    fec: Option<Fec>,
    codecs: Vec<ReedSolomon>,
    lanes: Vec<Option<Box<Lane>>>,
    /// Each lane's reorder window (when `hold_ms` > 0).
    orders: Vec<Option<Box<Reorder>>>,
    hold_ms: u64,
    /// Bit `lane` set: that lane's window holds datagrams.
    waiting: u64,
    pub counts: DecoderCounts,
}

impl Decoder {
    /// A decoder that hands datagrams on as they arrive or are rebuilt.
    pub fn new(fec: Option<Fec>) -> Decoder {
        Decoder::with_reorder(fec, 0)
    }

    /// A decoder whose lanes hand datagrams on in the sender's order, a datagram waiting at
    /// most `hold_ms` for a missing earlier one (0: as they arrive, like [`Decoder::new`]).
    pub fn with_reorder(fec: Option<Fec>, hold_ms: u64) -> Decoder {
        Decoder {
            fec,
            codecs: fec.map(codecs).unwrap_or_default(),
            lanes: (0..MAX_LANES).map(|_| None).collect(),
            orders: (0..MAX_LANES).map(|_| None).collect(),
            hold_ms,
            waiting: 0,
            counts: DecoderCounts::default(),
        }
    }

    /// The counts, the reorder windows' included.
    pub fn totals(&self) -> DecoderCounts {
        let mut c = self.counts;
        for r in self.orders.iter().flatten() {
            c.reorder.held += r.counts.held;
            c.reorder.expired += r.counts.expired;
            c.reorder.overtaken += r.counts.overtaken;
        }
        c
    }

    /// When [`Decoder::release_due`] next has something to hand on (None: nothing held).
    pub fn next_deadline(&self) -> Option<u64> {
        let mut bits = self.waiting;
        let mut min: Option<u64> = None;
        while bits != 0 {
            let lane = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            if let Some(d) = self.orders[lane].as_ref().and_then(|r| r.deadline()) {
                min = Some(min.map_or(d, |m| m.min(d)));
            }
        }
        min
    }

    /// Hands on, in order, what waited `hold_ms` in a reorder window (and what it waited
    /// for is given up). Called by the receive worker when [`Decoder::next_deadline`] passes.
    pub fn release_due<F: FnMut(u16, u16, &[u8], bool)>(&mut self, now_ms: u64, mut deliver: F) {
        let mut bits = self.waiting;
        while bits != 0 {
            let lane = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            if let Some(r) = self.orders[lane].as_deref_mut() {
                r.release_due(now_ms, &mut deliver);
                if r.deadline().is_none() {
                    self.waiting &= !(1u64 << lane);
                }
            }
        }
    }

    fn per_block(&self) -> usize {
        self.fec
            .map(|f| usize::from(f.k) + usize::from(f.m))
            .unwrap_or(0)
    }

    /// Takes one checked link packet; calls `deliver(dst, src, payload, repaired)` for each
    /// datagram it yields (the packet's own, any its arrival let the code rebuild, and with a
    /// reorder window those that waited for it).
    /// `Err` when the packet is refused; the caller counts the reason.
    pub fn receive<F: FnMut(u16, u16, &[u8], bool)>(
        &mut self,
        p: &LinkPacket<&[u8]>,
        now_ms: u64,
        mut deliver: F,
    ) -> Result<(), HeaderError> {
        let lane_no = usize::from(p.lane());
        if lane_no >= MAX_LANES {
            return Err(HeaderError::BadFec);
        }
        // The halves must agree on the link's FEC setting.
        let ok = match (self.fec, p.kind()) {
            (None, _) => p.fec_k() == 0,
            (Some(f), Kind::Data) => p.fec_k() == f.k && p.fec_m() == f.m,
            (Some(f), Kind::Repair) => p.fec_k() <= f.k && p.fec_m() == f.m,
        };
        if !ok {
            self.counts.fec_mismatch += 1;
            return Err(HeaderError::BadFec);
        }
        if self.lanes[lane_no].is_none() {
            // Once per lane, at its first packet.
            let per = self.per_block();
            self.lanes[lane_no] = Some(Box::new(Lane {
                epoch: p.epoch(),
                base: 0,
                started: false,
                blocks: [Block::default(); WINDOW_BLOCKS],
                shards: vec![0u8; WINDOW_BLOCKS * per * FRAME_CAP].into_boxed_slice(),
                shard_lens: vec![0; WINDOW_BLOCKS * per].into_boxed_slice(),
            }));
            if self.hold_ms > 0 {
                self.orders[lane_no] = Some(Box::new(Reorder::new(self.hold_ms)));
            }
        }
        let mut out = Out {
            order: self.orders[lane_no].as_deref_mut(),
            deliver: &mut deliver,
            now: now_ms,
        };
        let Some(lane) = self.lanes[lane_no].as_deref_mut() else {
            return Ok(());
        };
        if lane.started && lane.epoch != p.epoch() {
            self.counts.restarts += 1;
            lane.started = false;
            lane.blocks = [Block::default(); WINDOW_BLOCKS];
            // What the old sender's window held goes first; the new one starts its own order.
            if let Some(r) = out.order.as_deref_mut() {
                r.flush(out.deliver);
            }
        }
        lane.epoch = p.epoch();
        match self.fec {
            None => receive_plain(lane, &mut self.counts, p, &mut out),
            Some(fec) => receive_block(
                lane,
                &self.codecs,
                fec,
                &mut self.counts,
                p,
                now_ms,
                &mut out,
            ),
        }
        if out.order.is_some_and(|r| r.deadline().is_some()) {
            self.waiting |= 1u64 << lane_no;
        } else {
            self.waiting &= !(1u64 << lane_no);
        }
        Ok(())
    }

    /// Counts as lost what blocks quiet for `age_ms` never got (FEC on), so the figures are
    /// right when a stream stops, not only when newer blocks push old ones out.
    pub fn settle(&mut self, now_ms: u64, age_ms: u64) {
        let Some(_) = self.fec else { return };
        for lane in self.lanes.iter_mut().flatten() {
            for b in lane.blocks.iter_mut() {
                if b.used && !b.settled && now_ms.saturating_sub(b.last_ms) >= age_ms {
                    settle_block(b, &mut self.counts);
                }
            }
        }
    }
}

fn receive_plain<F: FnMut(u16, u16, &[u8], bool)>(
    lane: &mut Lane,
    counts: &mut DecoderCounts,
    p: &LinkPacket<&[u8]>,
    out: &mut Out<'_, F>,
) {
    let seq = p.sequence();
    if !lane.started {
        lane.started = true;
        lane.base = seq;
    }
    let ahead = seq.wrapping_sub(lane.base);
    if ahead < RESTART_GAP {
        counts.lost += u64::from(ahead);
        lane.base = seq.wrapping_add(1);
    } else if lane.base.wrapping_sub(seq) < RESTART_GAP {
        // Behind what we expect: reordered (it was counted lost when the gap opened).
        counts.late += 1;
        counts.lost = counts.lost.saturating_sub(1);
    } else {
        counts.restarts += 1;
        lane.base = seq.wrapping_add(1);
    }
    counts.frames += 1;
    counts.delivered += 1;
    out.data(seq, p.dst_port(), p.src_port(), p.payload(), false);
}

/// Counts what a block never got as lost. A datagram of it that still arrives (or is
/// rebuilt) while the block is in the window is handed on, late, and un-counted.
fn settle_block(b: &mut Block, counts: &mut DecoderCounts) {
    counts.lost += u64::from((data_mask(b.k) & !b.delivered).count_ones());
    b.settled = true;
}

fn receive_block<F: FnMut(u16, u16, &[u8], bool)>(
    lane: &mut Lane,
    codecs: &[ReedSolomon],
    fec: Fec,
    counts: &mut DecoderCounts,
    p: &LinkPacket<&[u8]>,
    now_ms: u64,
    out: &mut Out<'_, F>,
) {
    let id = p.block();
    if !lane.started {
        lane.started = true;
        lane.base = id;
    }
    let d = id.wrapping_sub(lane.base);
    if d > u32::MAX / 2 {
        // Behind the window: its block was already given up.
        if lane.base.wrapping_sub(id) > RESTART_GAP {
            counts.restarts += 1;
            lane.blocks = [Block::default(); WINDOW_BLOCKS];
            lane.base = id;
        } else {
            counts.late += 1;
            return;
        }
    } else if d as usize >= WINDOW_BLOCKS {
        if d > RESTART_GAP {
            counts.restarts += 1;
            lane.blocks = [Block::default(); WINDOW_BLOCKS];
            lane.base = id;
        } else {
            // Slide: blocks leaving the window count what they never got; blocks never
            // seen at all count k each.
            let new_base = id.wrapping_sub(WINDOW_BLOCKS as u32 - 1);
            while lane.base != new_base {
                let b = &mut lane.blocks[lane.base as usize % WINDOW_BLOCKS];
                if b.used && b.id == lane.base {
                    if !b.settled {
                        settle_block(b, counts);
                    }
                } else {
                    counts.lost += u64::from(fec.k);
                }
                b.used = false;
                lane.base = lane.base.wrapping_add(1);
            }
        }
    }
    let per = usize::from(fec.k) + usize::from(fec.m);
    let slot = id as usize % WINDOW_BLOCKS;
    let b = &mut lane.blocks[slot];
    if !b.used || b.id != id {
        *b = Block {
            id,
            used: true,
            k: usize::from(fec.k),
            ..Block::default()
        };
    }
    b.last_ms = now_ms;
    let idx = usize::from(p.index());
    if b.present & (1 << idx) != 0 {
        counts.duplicate += 1;
        return;
    }
    counts.frames += 1;
    b.present |= 1 << idx;
    // Keep the shard for a rebuild.
    let shard = p.shard();
    let at = (slot * per + idx) * FRAME_CAP;
    lane.shards[at..at + shard.len()].copy_from_slice(shard);
    lane.shard_lens[slot * per + idx] = shard.len();
    match p.kind() {
        Kind::Data => {
            if b.settled {
                // Its block was given up (quiet for the settle age: e.g. the sending worker
                // stalled mid-block) and its position counted lost; it was not: hand it on,
                // late.
                counts.late += 1;
                counts.lost = counts.lost.saturating_sub(1);
            }
            b.delivered |= 1 << idx;
            counts.delivered += 1;
            out.data(
                position(id, fec, idx),
                p.dst_port(),
                p.src_port(),
                p.payload(),
                false,
            );
        }
        Kind::Repair => {
            counts.repair_frames += 1;
            let k = b.k.min(usize::from(p.fec_k()));
            if b.settled && k < b.k {
                // Settled as a full block, closed short by its sender since: the positions
                // past `k` never existed, so they were not lost.
                let never = data_mask(b.k) & !data_mask(k) & !b.delivered;
                counts.lost = counts.lost.saturating_sub(u64::from(never.count_ones()));
            }
            b.k = k;
            b.shard_len = shard.len();
            if b.k < usize::from(fec.k) {
                // A partial block: its unused positions will never come.
                out.skip(
                    position(id, fec, b.k),
                    position(id, fec, usize::from(fec.k)),
                );
            }
        }
    }
    try_rebuild(lane, slot, codecs, fec, counts, out);
}

/// A data packet's place in its lane's order (FEC on): `block × k + index`, wrapping.
fn position(block: u32, fec: Fec, index: usize) -> u32 {
    block
        .wrapping_mul(u32::from(fec.k))
        .wrapping_add(index as u32)
}

fn try_rebuild<F: FnMut(u16, u16, &[u8], bool)>(
    lane: &mut Lane,
    slot: usize,
    codecs: &[ReedSolomon],
    fec: Fec,
    counts: &mut DecoderCounts,
    out: &mut Out<'_, F>,
) {
    let b = lane.blocks[slot];
    let (k, m) = (b.k, usize::from(fec.m));
    let data_mask = (1u64 << k) - 1;
    let missing = data_mask & !b.present;
    if b.shard_len == 0 || missing == 0 || (b.present.count_ones() as usize) < k {
        return;
    }
    let per = usize::from(fec.k) + m;
    let base = slot * per * FRAME_CAP;
    let region = &mut lane.shards[base..base + per * FRAME_CAP];
    // Shards of the rebuilt code: data 0..k, repair k..k+m (repair packets are numbered from
    // the block's own k).
    let mut shards: [(&mut [u8], bool); (MAX_K + MAX_M) as usize] =
        std::array::from_fn(|_| (Default::default(), false));
    for (i, chunk) in region.chunks_mut(FRAME_CAP).take(k + m).enumerate() {
        let len = lane.shard_lens[slot * per + i];
        let have = b.present & (1 << i) != 0;
        if have && i < k && len < b.shard_len {
            chunk[len..b.shard_len].fill(0);
        }
        if have && i >= k && len != b.shard_len {
            // A repair shard of another length cannot belong to this block.
            return;
        }
        shards[i] = (&mut chunk[..b.shard_len], have);
    }
    if codecs[k - 1]
        .reconstruct_data(&mut shards[..k + m])
        .is_err()
    {
        return;
    }
    let blk = &mut lane.blocks[slot];
    for i in 0..k {
        if missing & (1 << i) == 0 {
            continue;
        }
        let chunk = &lane.shards[base + i * FRAME_CAP..base + i * FRAME_CAP + b.shard_len];
        let Some((dst, src, len)) = crate::wire::link::shard_prefix(chunk) else {
            continue;
        };
        let len = usize::from(len);
        if SHARD_PREFIX + len > chunk.len() {
            continue;
        }
        blk.present |= 1 << i;
        blk.delivered |= 1 << i;
        counts.repaired += 1;
        if blk.settled {
            // Counted lost when its block was given up; rebuilt since, late.
            counts.late += 1;
            counts.lost = counts.lost.saturating_sub(1);
        }
        out.data(
            position(b.id, fec, i),
            dst,
            src,
            &chunk[SHARD_PREFIX..SHARD_PREFIX + len],
            true,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sends `n` datagrams through an encoder, drops the frames `lose` says, feeds the rest
    /// to a decoder; returns what was delivered, in order.
    fn run(
        fec: Option<Fec>,
        n: usize,
        lose: impl Fn(usize) -> bool,
    ) -> (Vec<Vec<u8>>, DecoderCounts) {
        let mut enc = Encoder::new(2, 7, fec, 4);
        let mut dec = Decoder::new(fec);
        let mut out = Vec::new();
        let mut wire = 0usize;
        let mut send = |enc: &mut Encoder, dec: &mut Decoder, out: &mut Vec<Vec<u8>>| {
            let frames: Vec<Vec<u8>> = enc.ready().map(|f| f.to_vec()).collect();
            enc.mark_sent();
            for f in frames {
                let keep = !lose(wire);
                wire += 1;
                if keep {
                    let p = LinkPacket::new_checked(&f[..]).unwrap();
                    dec.receive(&p, 0, |dst, src, pl, _| {
                        assert_eq!((dst, src), (30000, 20002));
                        out.push(pl.to_vec())
                    })
                    .unwrap();
                }
            }
        };
        for i in 0..n {
            let payload: Vec<u8> = (0..(20 + i * 37 % 1200)).map(|j| (i + j) as u8).collect();
            if enc.must_flush() {
                send(&mut enc, &mut dec, &mut out);
            }
            assert!(enc.push(30000, 20002, &payload, i as u32));
        }
        enc.close_block(0);
        send(&mut enc, &mut dec, &mut out);
        dec.settle(10_000, 1);
        (out, dec.counts)
    }

    fn expected(n: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| (0..(20 + i * 37 % 1200)).map(|j| (i + j) as u8).collect())
            .collect()
    }

    /// The sending worker stalls mid-block for longer than the settle age: the receiver
    /// gives the block up and counts its missing positions lost; when the sender resumes,
    /// the rest of the block (data, and the rebuild of a frame the link lost before the
    /// stall) is still handed on, counted late, and nothing stays counted lost.
    #[test]
    fn a_block_settled_while_its_sender_stalled_still_delivers_the_rest() {
        let fec = Fec { k: 8, m: 2 };
        let mut enc = Encoder::new(2, 7, Some(fec), 4);
        let mut dec = Decoder::new(Some(fec));
        let mut out = Vec::new();
        let mut feed = |enc: &mut Encoder, dec: &mut Decoder, now: u64, lose: &[usize]| {
            let frames: Vec<Vec<u8>> = enc.ready().map(|f| f.to_vec()).collect();
            enc.mark_sent();
            for (i, f) in frames.iter().enumerate() {
                if !lose.contains(&i) {
                    let p = LinkPacket::new_checked(&f[..]).unwrap();
                    dec.receive(&p, now, |_, _, pl, _| out.push(pl.to_vec()))
                        .unwrap();
                }
            }
        };
        let payloads = expected(8);
        for p in &payloads[..5] {
            assert!(enc.push(30000, 20002, p, 0));
        }
        // Data 0..5 sent, the link loses 1; then the sender stalls.
        feed(&mut enc, &mut dec, 0, &[1]);
        dec.settle(600, 500);
        assert_eq!(dec.counts.lost, 4, "1, and 5..8 not sent yet");
        for p in &payloads[5..] {
            assert!(enc.push(30000, 20002, p, 0));
        }
        feed(&mut enc, &mut dec, 2000, &[]);
        let mut got = out.clone();
        got.sort();
        let mut want = payloads.clone();
        want.sort();
        assert_eq!(got, want, "every datagram once");
        let c = dec.counts;
        assert_eq!((c.lost, c.repaired, c.late), (0, 1, 4), "{c:?}");

        // A partial block closed short after it was settled: its never-sent positions are
        // not lost.
        let mut enc = Encoder::new(2, 7, Some(fec), 4);
        let mut dec = Decoder::new(Some(fec));
        for p in &payloads[..3] {
            assert!(enc.push(30000, 20002, p, 0));
        }
        let frames: Vec<Vec<u8>> = enc.ready().map(|f| f.to_vec()).collect();
        enc.mark_sent();
        for f in &frames {
            let p = LinkPacket::new_checked(&f[..]).unwrap();
            dec.receive(&p, 0, |_, _, _, _| {}).unwrap();
        }
        dec.settle(600, 500);
        assert_eq!(dec.counts.lost, 5);
        enc.close_block(0);
        let frames: Vec<Vec<u8>> = enc.ready().map(|f| f.to_vec()).collect();
        for f in &frames {
            let p = LinkPacket::new_checked(&f[..]).unwrap();
            dec.receive(&p, 2000, |_, _, _, _| {}).unwrap();
        }
        assert_eq!(dec.counts.lost, 0, "{:?}", dec.counts);
    }

    #[test]
    fn no_loss_delivers_everything_once() {
        for fec in [None, Some(Fec { k: 8, m: 2 }), Some(Fec { k: 16, m: 4 })] {
            let (out, c) = run(fec, 100, |_| false);
            assert_eq!(out, expected(100), "{fec:?}");
            assert_eq!((c.delivered, c.repaired, c.lost), (100, 0, 0));
        }
    }

    #[test]
    fn repairs_up_to_m_losses_per_block_and_counts_the_rest() {
        let fec = Some(Fec { k: 8, m: 2 });
        // Every block is 10 frames; lose 2 of each (data 1 and 5): all rebuilt.
        let (mut out, c) = run(fec, 80, |w| w % 10 == 1 || w % 10 == 5);
        assert_eq!((c.repaired, c.lost), (20, 0), "10 blocks, 2 rebuilt each");
        out.sort();
        let mut want = expected(80);
        want.sort();
        assert_eq!(out, want);
        // Lose 3 data frames of the first block: beyond repair, counted lost.
        let (out, c) = run(fec, 16, |w| w < 3);
        assert_eq!((c.delivered, c.repaired, c.lost), (13, 0, 3));
        assert_eq!(out.len(), 13);
        // The partial last block (5 of 8, closed early) is repaired too.
        let (out, c) = run(fec, 21, |w| w == 21);
        assert_eq!((c.repaired, c.lost, out.len()), (1, 0, 21));
    }

    #[test]
    fn plain_counts_gaps() {
        let (out, c) = run(None, 50, |w| w == 10 || w == 11);
        assert_eq!((out.len(), c.lost), (48, 2));
    }

    #[test]
    fn fec_setting_must_match() {
        let mut enc = Encoder::new(0, 1, Some(Fec { k: 4, m: 1 }), 1);
        assert!(enc.push(1, 2, b"x", 0));
        let f: Vec<u8> = enc.ready().next().unwrap().to_vec();
        let p = LinkPacket::new_checked(&f[..]).unwrap();
        let mut dec = Decoder::new(Some(Fec { k: 8, m: 2 }));
        assert_eq!(
            dec.receive(&p, 0, |_, _, _, _| panic!()),
            Err(HeaderError::BadFec)
        );
        let mut off = Decoder::new(None);
        assert_eq!(
            off.receive(&p, 0, |_, _, _, _| panic!()),
            Err(HeaderError::BadFec)
        );
        assert_eq!(off.counts.fec_mismatch, 1);
    }

    /// What a compromised peer half could send: mutated and random frames, never a panic,
    /// and nothing delivered longer than a frame.
    #[test]
    fn hostile_frames_never_panic() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for (fec, hold) in [
            (None, 0),
            (Some(Fec { k: 8, m: 2 }), 0),
            (Some(Fec { k: 3, m: 4 }), 0),
            (None, 20),
            (Some(Fec { k: 8, m: 2 }), 20),
        ] {
            let mut dec = Decoder::with_reorder(fec, hold);
            let mut enc = Encoder::new(1, 9, fec, 4);
            for round in 0..8_000u32 {
                if enc.must_flush() {
                    enc.mark_sent();
                }
                let len = (next() % 1400) as usize;
                let payload = vec![round as u8; len];
                enc.push(20000, 30000, &payload, round);
                let mut f: Vec<u8> = match enc.ready().last() {
                    Some(f) => f.to_vec(),
                    None => continue,
                };
                // Flip bytes (often in the header), cut or extend.
                for _ in 0..(next() % 4) {
                    let i = (next() as usize) % f.len();
                    f[i] = next() as u8;
                }
                match next() % 8 {
                    0 => f.truncate((next() as usize) % (f.len() + 1)),
                    1 => f.resize(((next() as usize) % FRAME_CAP).max(1), next() as u8),
                    _ => {}
                }
                if let Ok(p) = LinkPacket::new_checked(&f[..]) {
                    let _ = dec.receive(&p, u64::from(round), |_, _, pl, _| {
                        assert!(pl.len() <= MAX_PAYLOAD + SHARD_PREFIX)
                    });
                }
                if round % 1000 == 0 {
                    dec.settle(u64::from(round), 10);
                }
                if round % 7 == 0 {
                    dec.release_due(u64::from(round), |_, _, pl, _| {
                        assert!(pl.len() <= MAX_PAYLOAD + SHARD_PREFIX)
                    });
                }
            }
        }
    }

    /// Every frame an encoder (lane 2, `epoch`) sends for datagrams `ids`, in wire order.
    fn wire(fec: Option<Fec>, epoch: u16, ids: std::ops::Range<usize>) -> Vec<Vec<u8>> {
        let mut enc = Encoder::new(2, epoch, fec, 4);
        let mut frames = Vec::new();
        let all = expected(ids.end);
        for payload in &all[ids] {
            if enc.must_flush() {
                frames.extend(enc.ready().map(|f| f.to_vec()));
                enc.mark_sent();
            }
            assert!(enc.push(30000, 20002, payload, 0));
        }
        enc.close_block(0);
        frames.extend(enc.ready().map(|f| f.to_vec()));
        enc.mark_sent();
        frames
    }

    /// Feeds `frames` at `now`; returns what was delivered (payload, repaired).
    fn feed(dec: &mut Decoder, frames: &[Vec<u8>], now: u64) -> Vec<(Vec<u8>, bool)> {
        let mut out = Vec::new();
        for f in frames {
            let p = LinkPacket::new_checked(&f[..]).unwrap();
            dec.receive(&p, now, |_, _, pl, rep| out.push((pl.to_vec(), rep)))
                .unwrap();
        }
        out
    }

    fn payloads(v: Vec<(Vec<u8>, bool)>) -> Vec<Vec<u8>> {
        v.into_iter().map(|(p, _)| p).collect()
    }

    #[test]
    fn reorder_window_delivers_in_sender_order() {
        for fec in [None, Some(Fec { k: 8, m: 2 }), Some(Fec { k: 4, m: 2 })] {
            let mut frames = wire(fec, 7, 0..60);
            // Swap neighbours all along, and lose one frame in 7 (FEC rebuilds them).
            // (From the second frame: the window starts where its first frame is.)
            for i in (1..frames.len() - 1).step_by(3) {
                frames.swap(i, i + 1);
            }
            if fec.is_some() {
                frames = frames
                    .into_iter()
                    .enumerate()
                    .filter(|(i, _)| i % 7 != 3)
                    .map(|(_, f)| f)
                    .collect();
            }
            let mut dec = Decoder::with_reorder(fec, 50);
            let got = feed(&mut dec, &frames, 0);
            assert_eq!(payloads(got.clone()), expected(60), "{fec:?}: in order");
            let c = dec.totals();
            assert!(c.reorder.held > 0, "{fec:?}: {c:?}");
            assert_eq!((c.lost, c.reorder.expired), (0, 0), "{fec:?}: {c:?}");
            assert_eq!(dec.next_deadline(), None, "{fec:?}: nothing left waiting");
            if fec.is_some() {
                assert_eq!(got.iter().filter(|(_, r)| *r).count() as u64, c.repaired);
                assert!(c.repaired > 0);
            }
            // Without a window the same frames come out of order.
            let mut plain = Decoder::new(fec);
            assert_ne!(payloads(feed(&mut plain, &frames, 0)), expected(60));
        }
    }

    #[test]
    fn reorder_window_gives_a_gap_up_when_the_wait_ends() {
        for fec in [None, Some(Fec { k: 8, m: 2 })] {
            let frames = wire(fec, 7, 0..20);
            // Lose data 3 and both repair frames of the first block (FEC on): beyond repair.
            let keep: Vec<Vec<u8>> = frames
                .into_iter()
                .enumerate()
                .filter(|(i, _)| *i != 3 && !(fec.is_some() && (*i == 8 || *i == 9)))
                .map(|(_, f)| f)
                .collect();
            let mut dec = Decoder::with_reorder(fec, 30);
            let got = payloads(feed(&mut dec, &keep, 100));
            assert_eq!(got, expected(3), "{fec:?}: 4.. wait for 3");
            assert_eq!(dec.next_deadline(), Some(130));
            let mut late = Vec::new();
            dec.release_due(129, |_, _, pl, _| late.push(pl.to_vec()));
            assert!(late.is_empty());
            dec.release_due(130, |_, _, pl, _| late.push(pl.to_vec()));
            assert_eq!(late, expected(20)[4..].to_vec(), "{fec:?}");
            assert_eq!(dec.next_deadline(), None);
            assert_eq!(dec.totals().reorder.expired, 1, "{fec:?}");
            // 3 shows up after all: handed on, counted (FEC on: its block is not settled yet).
            let late3 = wire(fec, 7, 0..20).swap_remove(3);
            let got = feed(&mut dec, &[late3], 200);
            assert_eq!(payloads(got), vec![expected(4)[3].clone()]);
            assert_eq!(dec.totals().reorder.overtaken, 1);
        }
    }

    #[test]
    fn reorder_window_flushes_on_a_new_epoch() {
        for fec in [None, Some(Fec { k: 8, m: 2 })] {
            let mut old = wire(fec, 7, 0..5);
            old.remove(1); // datagram 1 lost: 2.. wait
            let mut dec = Decoder::with_reorder(fec, 1000);
            assert_eq!(payloads(feed(&mut dec, &old[..3], 0)), expected(1));
            // The sender restarts (new epoch, its sequence from 0): what waited goes first,
            // then the new sender's datagrams, in their own order.
            let new = wire(fec, 8, 0..3);
            let got = payloads(feed(&mut dec, &new, 1));
            let mut want = expected(4)[2..4].to_vec();
            want.extend(expected(3));
            assert_eq!(got, want, "{fec:?}");
            let c = dec.totals();
            assert_eq!(c.restarts, 1, "{fec:?}");
            assert_eq!(dec.next_deadline(), None);
        }
    }

    #[test]
    fn reorder_window_hands_duplicates_on_once() {
        let fec = Some(Fec { k: 8, m: 2 });
        let frames = wire(fec, 7, 0..8);
        let mut dup = vec![frames[0].clone(), frames[2].clone(), frames[2].clone()];
        dup.push(frames[1].clone());
        dup.push(frames[2].clone());
        let mut dec = Decoder::with_reorder(fec, 20);
        assert_eq!(payloads(feed(&mut dec, &dup, 0)), expected(3));
        assert_eq!(dec.totals().duplicate, 2);
        // FEC off: the link has no way to tell a copy from a late datagram; the window holds
        // a position once, and a copy after it passed is handed on as overtaken.
        let frames = wire(None, 7, 0..3);
        let mut dec = Decoder::with_reorder(None, 20);
        let seq = [&frames[0], &frames[2], &frames[2], &frames[1]].map(|f| f.clone());
        assert_eq!(payloads(feed(&mut dec, &seq, 0)), expected(3));
    }

    #[test]
    fn fec_parse() {
        assert_eq!(Fec::parse("off"), Ok(None));
        assert_eq!(Fec::parse("8+2"), Ok(Some(Fec { k: 8, m: 2 })));
        for bad in ["", "8", "0+2", "8+0", "33+1", "8+17", "a+b", "8-2"] {
            assert!(Fec::parse(bad).is_err(), "{bad}");
        }
    }
}
