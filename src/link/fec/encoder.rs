//! The sender's side of one lane ([`Encoder`]): data frames written into preallocated slots
//! (with [`HEADROOM`] for the engine's headers), a block's repair frames computed in place
//! from them, and the frames handed out in order until sent.

use reed_solomon_erasure::galois_8::ReedSolomon;
use reed_solomon_simd::ReedSolomonEncoder;

use crate::wire::link::{Fields, HEADER_LEN, MAX_K, MAX_M, SHARD_START};

use super::{codecs, coded_len, Fec, HEADROOM, MAX_PAYLOAD, SLOT};

/// The sender's side of one lane: frames are written into preallocated slots, sent by the
/// caller from [`Encoder::ready`], and a block's repair frames are computed from the data
/// frames in place.
pub struct Encoder {
    lane: u8,
    epoch: u16,
    fec: Option<Fec>,
    codecs: Vec<ReedSolomon>,
    /// The block code's encoder, its work buffers sized for the largest block when the
    /// lane starts (`None` for `K+M` and off).
    leopard: Option<Box<ReedSolomonEncoder>>,
    /// `slots` slots of [`HEADROOM`] + [`FRAME_CAP`](super::FRAME_CAP) bytes: data `0..k`,
    /// repair `k..k+m` (FEC on); a plain batch of frames (FEC off).
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
    /// Bytes after each frame, outside the FEC shards, that [`Encoder::seal`] fills (the
    /// auth trailer, [`crate::link::auth`]); 0 unless [`Encoder::with_trailer`].
    trailer: usize,
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
            leopard: fec.filter(Fec::block_code).map(|f| {
                Box::new(
                    ReedSolomonEncoder::new(
                        usize::from(f.k),
                        usize::from(f.m),
                        coded_len(MAX_PAYLOAD + super::SHARD_PREFIX),
                    )
                    .expect("block sizes were checked against the code's limits"),
                )
            }),
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
            trailer: 0,
        }
    }

    /// Leaves `n` bytes after every frame (at most [`FRAME_CAP`](super::FRAME_CAP) minus the
    /// longest frame: the auth trailer) for [`Encoder::seal`]; the frames handed out include
    /// them. They are not part of any FEC shard.
    pub fn with_trailer(mut self, n: usize) -> Encoder {
        self.trailer = n;
        self
    }

    /// Calls `seal` on each frame written and not yet sealed, with its trailer room after it
    /// (call it once before each send of [`Encoder::ready`]).
    pub fn seal(&mut self, mut seal: impl FnMut(&mut [u8])) {
        for s in self.ready_slots() {
            let at = s * SLOT + HEADROOM;
            seal(&mut self.frames[at..at + self.lens[s] + self.trailer]);
        }
    }

    fn data_slots(&self) -> usize {
        self.fec.map(|f| usize::from(f.k)).unwrap_or(self.slots)
    }

    /// Whether the caller must send [`Encoder::ready`] before the next [`Encoder::push`].
    pub fn must_flush(&self) -> bool {
        match self.fec {
            Some(_) => self.repairs > 0,
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
                block_code: self.fec.is_some_and(|f| f.block_code()),
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

    /// How long after its first frame an open block is closed, milliseconds (FEC on).
    pub fn close_ms(&self) -> u64 {
        self.fec.map_or(super::CLOSE_MS, |f| f.close_ms())
    }

    /// Whether a partial block is waiting for more data (FEC on).
    pub fn block_open(&self) -> bool {
        self.fec.is_some() && self.filled > 0 && self.repairs == 0
    }

    fn encode(&mut self, ts_us: u32) {
        let Some(fec) = self.fec else { return };
        let k = usize::from(fec.k);
        let kk = self.filled;
        let m = fec.repairs_for(kk);
        let shard_len = self.lens[..kk].iter().max().copied().unwrap_or(HEADER_LEN) - SHARD_START;
        // The block code takes shards of an even length: one zero byte more at most (the
        // slot has room: a frame leaves its trailer's bytes free).
        let coded = if fec.block_code() {
            coded_len(shard_len)
        } else {
            shard_len
        };
        let (data, parity) = self.frames.split_at_mut(k * SLOT);
        // Zero each data shard's padding: the code sees every shard at the block's length.
        for (i, slot) in data.chunks_mut(SLOT).take(kk).enumerate() {
            slot[HEADROOM..][self.lens[i]..SHARD_START + coded].fill(0);
        }
        for (j, slot) in parity.chunks_mut(SLOT).take(m).enumerate() {
            crate::wire::link::write_fields(
                &mut slot[HEADROOM..],
                &Fields {
                    repair: true,
                    block_code: fec.block_code(),
                    lane: self.lane,
                    k: kk as u8,
                    m: m as u8,
                    index: (kk + j) as u8,
                    sequence: self.sequence.wrapping_add(j as u32),
                    block: self.block,
                    timestamp_us: ts_us,
                    epoch: self.epoch,
                },
            );
        }
        let shard = SHARD_START..SHARD_START + coded;
        match self.leopard.as_deref_mut() {
            Some(enc) => {
                enc.reset(kk, m, coded)
                    .expect("block sizes were checked against the code's limits");
                for slot in data.chunks(SLOT).take(kk) {
                    enc.add_original_shard(&slot[HEADROOM..][shard.clone()])
                        .expect("shards of the block's length, counted");
                }
                let out = enc.encode().expect("every original shard was added");
                for (rec, slot) in out.recovery_iter().zip(parity.chunks_mut(SLOT)) {
                    slot[HEADROOM..][shard.clone()].copy_from_slice(rec);
                }
            }
            None => {
                let mut ins: [&[u8]; MAX_K as usize] = Default::default();
                for (i, slot) in data.chunks(SLOT).take(kk).enumerate() {
                    ins[i] = &slot[HEADROOM..][shard.clone()];
                }
                let mut outs: [&mut [u8]; MAX_M as usize] = Default::default();
                for (j, slot) in parity.chunks_mut(SLOT).take(m).enumerate() {
                    outs[j] = &mut slot[HEADROOM..][shard.clone()];
                }
                self.codecs[kk - 1]
                    .encode_sep(&ins[..kk], &mut outs[..m])
                    .expect("shards of equal length, counts from the codec");
            }
        }
        for j in 0..m {
            self.lens[k + j] = SHARD_START + coded;
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
            &self.frames[at..at + self.lens[s] + self.trailer]
        })
    }

    /// The same frames as [`Encoder::ready`], each with its [`HEADROOM`] in front, writable:
    /// `write(buf)` fills the headroom of `buf` (headroom + frame) for the wire.
    pub fn fill_headroom(&mut self, mut write: impl FnMut(&mut [u8])) {
        for s in self.ready_slots() {
            let at = s * SLOT;
            write(&mut self.frames[at..at + HEADROOM + self.lens[s] + self.trailer]);
        }
    }

    /// [`Encoder::ready`] with each frame's headroom in front (after
    /// [`Encoder::fill_headroom`]): whole wire frames.
    pub fn ready_wire(&self) -> impl Iterator<Item = &[u8]> {
        self.ready_slots().map(move |s| {
            let at = s * SLOT;
            &self.frames[at..at + HEADROOM + self.lens[s] + self.trailer]
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
