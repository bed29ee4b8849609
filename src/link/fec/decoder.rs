//! The receiver's side of a link ([`Decoder`]): each lane's window of [`WINDOW_BLOCKS`]
//! blocks, the erasure decoder that rebuilds a block, the FEC-off sequence check, the loss,
//! late and duplicate counts ([`DecoderCounts`]) and the hand-off through a lane's reorder
//! window.

use reed_solomon_erasure::galois_8::ReedSolomon;
use reed_solomon_simd::rate::{DefaultRateDecoder, RateDecoder};

use crate::link::reorder::{Reorder, ReorderCounts, LOST_GRACE_MS};
use crate::wire::link::{HeaderError, Kind, LinkPacket, MAX_K, MAX_M, SHARD_PREFIX};

use super::direct::Direct;
use super::locator::LocatorEngine;
use super::{
    codecs, coded_len, Fec, FRAME_CAP, MAX_LANES, MAX_PAYLOAD, RESTART_GAP, WINDOW_BLOCKS,
};

/// The block code's decoder: the crate's, with the erasure locator evaluated directly
/// ([`LocatorEngine`]).
type BlockDecoder = DefaultRateDecoder<LocatorEngine>;

/// Bits of positions `0..k` of a block (`k <= 128`).
fn data_mask(k: usize) -> u128 {
    if k >= 128 {
        u128::MAX
    } else {
        (1u128 << k) - 1
    }
}

/// The erasure codes a lane's blocks are rebuilt with: the `K+M` codecs (one per block
/// size) or the block code's decoder.
struct Codecs<'a> {
    gf8: &'a [ReedSolomon],
    leopard: Option<&'a mut BlockDecoder>,
    direct: Option<&'a mut Direct>,
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
    /// How long a gap known lost is still waited for ([`LOST_GRACE_MS`], at most the
    /// window's wait).
    grace: u64,
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
            r.skip(from, to, self.now, self.deliver);
        }
    }

    /// Positions before `to` that have not come never will (in lane order): what waits
    /// for them goes after [`LOST_GRACE_MS`] instead of the window's whole wait.
    fn give_up_before(&mut self, to: u32) {
        if let Some(r) = self.order.as_deref_mut() {
            r.give_up_before(to, self.now + self.grace);
        }
    }
}

#[derive(Clone, Copy, Default)]
struct Block {
    id: u32,
    used: bool,
    /// Data packets in this block: `k` until a repair frame says `k' < k`.
    k: usize,
    /// Repair frames of this block (`m`, or for the block code those of its `k`).
    m: usize,
    present: u128,
    delivered: u128,
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
    /// The block code's decoder, shared by the lanes, its work buffers sized for the
    /// largest block when the decoder is made.
    leopard: Option<Box<BlockDecoder>>,
    /// The block code's direct rebuild of a few lost data frames ([`Direct`]).
    direct: Option<Box<Direct>>,
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
            leopard: fec.filter(Fec::block_code).map(|f| {
                Box::new(
                    BlockDecoder::new(
                        usize::from(f.k),
                        usize::from(f.m),
                        coded_len(MAX_PAYLOAD + super::SHARD_PREFIX),
                        LocatorEngine::new(),
                        None,
                    )
                    .expect("block sizes were checked against the code's limits"),
                )
            }),
            direct: fec.filter(Fec::block_code).map(|f| {
                Box::new(Direct::new(
                    usize::from(f.k),
                    usize::from(f.m),
                    coded_len(MAX_PAYLOAD + super::SHARD_PREFIX),
                ))
            }),
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
            c.reorder.add(&r.counts);
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
        // Callers pass checked views; checking again costs a few compares and keeps a
        // frame longer than a shard slot out of the buffers whatever the caller did.
        p.check()?;
        let lane_no = usize::from(p.lane());
        if lane_no >= MAX_LANES {
            return Err(HeaderError::BadFec);
        }
        // The halves must agree on the link's FEC setting.
        let ok = match (self.fec, p.kind()) {
            (None, _) => !p.block_code() && p.fec_k() == 0,
            (Some(f), _) if f.block_code() != p.block_code() => false,
            (Some(f), Kind::Data) => p.fec_k() == f.k && p.fec_m() == f.m,
            (Some(f), Kind::Repair) => {
                p.fec_k() <= f.k && usize::from(p.fec_m()) == f.repairs_for(usize::from(p.fec_k()))
            }
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
            grace: LOST_GRACE_MS.min(self.hold_ms),
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
                r.flush(now_ms, out.deliver);
            }
        }
        lane.epoch = p.epoch();
        match self.fec {
            None => receive_plain(lane, &mut self.counts, p, &mut out),
            Some(fec) => receive_block(
                lane,
                Codecs {
                    gf8: &self.codecs,
                    leopard: self.leopard.as_deref_mut(),
                    direct: self.direct.as_deref_mut(),
                },
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
    codecs: Codecs<'_>,
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
    // A lane's frames arrive in the order they were sent: a frame of block `id` says every
    // earlier block has had all its frames (and been rebuilt if it could be), so nothing
    // before it is worth the window's whole wait.
    out.give_up_before(position(id, fec, 0));
    let per = usize::from(fec.k) + usize::from(fec.m);
    let slot = id as usize % WINDOW_BLOCKS;
    let b = &mut lane.blocks[slot];
    if !b.used || b.id != id {
        *b = Block {
            id,
            used: true,
            k: usize::from(fec.k),
            m: usize::from(fec.m),
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
            if hopeless(b, idx) {
                // More of this block was lost than its repair frames can rebuild: the gaps
                // before this frame are lost, it need not wait for them.
                out.give_up_before(position(id, fec, idx));
            }
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
            b.m = fec.repairs_for(k);
            b.shard_len = shard.len();
            if b.k < usize::from(fec.k) {
                // A partial block: its unused positions will never come.
                out.skip(
                    position(id, fec, b.k),
                    position(id, fec, usize::from(fec.k)),
                );
            }
            if hopeless(b, idx) {
                // The block's last chance passed: what it lost stays lost.
                out.give_up_before(position(id, fec, usize::from(fec.k)));
            }
        }
    }
    try_rebuild(lane, slot, codecs, fec, counts, out);
}

/// Whether block `b` can no longer be rebuilt, its frame `idx` just in: it misses data
/// and, with the frames after `idx` still to come (the block's `k + m`, or `k + m` of a
/// full block until a repair frame says its size), it cannot reach `k` frames. Only a link
/// that reorders a lane's frames can still bring one of the missing ones.
fn hopeless(b: &Block, idx: usize) -> bool {
    let (k, m) = (b.k, b.m);
    let have = (b.present & data_mask(k + m)).count_ones() as usize;
    let still = (k + m).saturating_sub(idx + 1);
    data_mask(k) & !b.present != 0 && have + still < k
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
    codecs: Codecs<'_>,
    fec: Fec,
    counts: &mut DecoderCounts,
    out: &mut Out<'_, F>,
) {
    let b = lane.blocks[slot];
    let (k, m) = (b.k, b.m);
    let missing = data_mask(k) & !b.present;
    let have = b.present & data_mask(k + m);
    if b.shard_len == 0 || missing == 0 || (have.count_ones() as usize) < k {
        return;
    }
    let per = usize::from(fec.k) + usize::from(fec.m);
    let base = slot * per * FRAME_CAP;
    let region = &mut lane.shards[base..base + per * FRAME_CAP];
    let lens = &lane.shard_lens[slot * per..(slot + 1) * per];
    let rebuilt = match codecs.leopard {
        Some(dec) => rebuild_block_code(dec, codecs.direct, region, lens, &b),
        None => rebuild_gf8(codecs.gf8, region, lens, &b),
    };
    if !rebuilt {
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

/// Rebuilds the missing data shards of block `b` in place (`K+M`, GF(2^8)): `region` holds
/// its shards in [`FRAME_CAP`] slots, data `0..k`, repair `k..k+m` (repair packets are
/// numbered from the block's own k). `false` when it cannot.
fn rebuild_gf8(codecs: &[ReedSolomon], region: &mut [u8], lens: &[usize], b: &Block) -> bool {
    let (k, m) = (b.k, b.m);
    let mut shards: [(&mut [u8], bool); (MAX_K + MAX_M) as usize] =
        std::array::from_fn(|_| (Default::default(), false));
    for (i, chunk) in region.chunks_mut(FRAME_CAP).take(k + m).enumerate() {
        let len = lens[i];
        let have = b.present & (1 << i) != 0;
        if have && i < k && len < b.shard_len {
            chunk[len..b.shard_len].fill(0);
        }
        if have && i >= k && len != b.shard_len {
            // A repair shard of another length cannot belong to this block.
            return false;
        }
        shards[i] = (&mut chunk[..b.shard_len], have);
    }
    codecs[k - 1].reconstruct_data(&mut shards[..k + m]).is_ok()
}

/// [`rebuild_gf8`] for the block code (Leopard, GF(2^16)): the present shards go into the
/// decoder (its buffers were sized for the largest block: no allocation), the restored
/// ones come back into their slots.
fn rebuild_block_code(
    dec: &mut BlockDecoder,
    direct: Option<&mut Direct>,
    region: &mut [u8],
    lens: &[usize],
    b: &Block,
) -> bool {
    let (k, m, coded) = (b.k, b.m, b.shard_len);
    // The sender codes even lengths; a repair shard of an odd one is not of this block.
    if coded % 2 != 0 {
        return false;
    }
    let missing = data_mask(k) & !b.present;
    if let Some(direct) = direct {
        // Few lost (the common case): solved directly from as many repair frames and the
        // other originals. Repair shards of another length are not of this block.
        let mut repairs = 0u128;
        for j in 0..m {
            if b.present & (1 << (k + j)) != 0 && lens[k + j] == coded {
                repairs |= 1 << j;
            }
        }
        let mut fits = true;
        for (i, chunk) in region.chunks_mut(FRAME_CAP).take(k).enumerate() {
            if missing & (1 << i) != 0 {
                continue;
            }
            if lens[i] <= coded {
                chunk[lens[i]..coded].fill(0);
            } else {
                fits = false;
            }
        }
        if fits && direct.rebuild(k, m, coded, missing, repairs, region, FRAME_CAP) {
            return true;
        }
    }
    if dec.reset(k, m, coded).is_err() {
        return false;
    }
    let mut given = 0;
    for (i, chunk) in region.chunks_mut(FRAME_CAP).take(k + m).enumerate() {
        if b.present & (1 << i) == 0 || given == k {
            continue;
        }
        let len = lens[i];
        let ok = if i < k {
            if len > coded {
                return false;
            }
            chunk[len..coded].fill(0);
            dec.add_original_shard(i, &chunk[..coded]).is_ok()
        } else {
            len == coded && dec.add_recovery_shard(i - k, &chunk[..coded]).is_ok()
        };
        if !ok {
            return false;
        }
        given += 1;
    }
    let Ok(res) = dec.decode() else {
        return false;
    };
    for (i, shard) in res.restored_original_iter() {
        if i < k && shard.len() == coded {
            region[i * FRAME_CAP..i * FRAME_CAP + coded].copy_from_slice(shard);
        }
    }
    true
}
