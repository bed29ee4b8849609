//! The sender's side of one lane ([`Encoder`]): data frames written into preallocated slots
//! (with [`HEADROOM`] for the engine's headers), a block's repair frames computed in place
//! from them, and the frames handed out in order until sent.

use reed_solomon_erasure::galois_8::ReedSolomon;

use crate::wire::link::{Fields, HEADER_LEN, MAX_K, MAX_M, SHARD_START};

use super::{codecs, Fec, HEADROOM, MAX_PAYLOAD, SLOT};

/// The sender's side of one lane: frames are written into preallocated slots, sent by the
/// caller from [`Encoder::ready`], and a block's repair frames are computed from the data
/// frames in place.
pub struct Encoder {
    lane: u8,
    epoch: u16,
    fec: Option<Fec>,
    codecs: Vec<ReedSolomon>,
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
