//! Forward error correction on a one-way link: the sender's [`Encoder`] and the receiver's
//! [`Decoder`]. Pure logic over caller-visible buffers: no I/O, no clock, no allocation per
//! packet (every buffer is allocated when the encoder, or a decoder lane, is created).
//!
//! ## Two codes: `K+M` (GF(2^8)) and `block` (Leopard, GF(2^16))
//!
//! Packets are grouped in blocks of `k` data packets followed by repair packets; any `k`
//! of a block's packets rebuild it (both codes are MDS: the best any code can do at that
//! overhead). A block holds the frames of every stream the lane (sending worker) carries,
//! in the order they are sent.
//!
//! - **`K+M`** (the previous release's setting, unchanged on the wire: link header version
//!   3): systematic Reed-Solomon over GF(2^8) from `reed-solomon-erasure`, exactly `m`
//!   repair packets per block of `k <= 32`, a partial block closed [`CLOSE_MS`] after its
//!   first frame. Its encoder multiplies a k×m matrix over every byte: about 3 µs of CPU
//!   per 1.3 KB datagram at 8+2 (`cargo bench --bench fec`), and short blocks average the
//!   loss badly (8+2 at 5 % link loss leaves ≈ 0.3 %).
//! - **`block`** (link header version 4; [`Code::Block`]): Leopard Reed-Solomon over
//!   GF(2^16) from `reed-solomon-simd` (O(n log n) additive FFT, SSSE3/AVX2 picked at run
//!   time, safe API, well kept), blocks of up to `k` frames (`fec_block_frames`, default
//!   116) closed after `fec_block_ms` (default 2) even while traffic flows, each with
//!   `ceil(k' × fec_overhead / 100)` repair frames (default 10 %: 12 per full block). Long
//!   blocks average the loss: 116+12 repairs 1 % random loss to ~1e-9 and any burst of up
//!   to 12 frames in a block; 111+17 (15 %) leaves ~0.002 % at 5 %. Why this crate:
//!   encoding costs ≈ 0.25 µs per datagram at 116+12 (12× less than 8+2 with
//!   `reed-solomon-erasure`, whose cost grows with k × m); `raptorq` allocates per
//!   object, is not MDS (it needs a few frames more than `k`) and its encoder is slower
//!   at these block sizes. Decoding: the crate's decoder evaluates the erasure locator over
//!   the whole field (two 2^16-point transforms, ~3 million instructions per rebuilt block
//!   whatever its size); the link's evaluates it only at the block's positions
//!   ([`LocatorEngine`], `locator`), and rebuilds a block that lost up to 32 data frames
//!   without the transforms, by solving the small system of its lost frames over as many
//!   repair frames ([`Direct`], `direct`; the full decoder only beyond): figures in
//!   `docs/bench-split.md` (`scripts/bench-fec.sh`, callgrind). A block without loss costs
//!   no decoding at all.
//!   `k + m <= MAX_BLOCK_SHARDS` (128): the receiver's presence masks are 128 bits.
//!
//! Both encode from caller-owned slices (the sender encodes straight from the frames it
//! has just sent; `reed-solomon-simd` copies them into its work buffers, sized for the
//! largest block when the encoder or decoder is made, so no block allocates) and rebuild
//! into the receiver's preallocated block buffers. `reed-solomon-erasure`'s work arrays
//! are `SmallVec`s inline up to 32 shards (hence k ≤ 32); on a repair it takes an
//! uncontended lock on its decode-matrix cache and, on a cache miss, inverts a k×k matrix:
//! once per repaired block, never per packet. `reed-solomon-simd` takes no lock.
//!
//! Shards have variable length (media packets differ in size): the shard of a data packet is
//! its link header's last six bytes (destination port, source port, length) followed by the
//! payload (see [`crate::wire::link`]); a block's shards are zero-padded to the longest one
//! (rounded up to even for the block code), and the repair packets carry that length. A
//! partial block (closed on time) has `k' < k` data packets; its repair packets say `k'`
//! (and, for the block code, its `m'`).
//!
//! ## The receiver's window
//!
//! Each sending worker is a *lane* with its own blocks. The receiver keeps the last
//! [`WINDOW_BLOCKS`] blocks of every lane: packets arriving out of order within that window
//! are placed in their block, and a block is rebuilt as soon as enough of it has arrived.
//! Without a reorder window data packets are delivered the moment they arrive and rebuilt
//! ones as soon as their block can be decoded (so behind later ones); with one
//! ([`Decoder::with_reorder`], [`super::reorder`]) each lane's datagrams are handed on in the
//! sender's order, a datagram behind a gap waiting at most the window's time, and only
//! [`crate::link::reorder::LOST_GRACE_MS`] once the lane's frames still to come cannot
//! rebuild the gap (a lane's frames arrive in the order they were sent). Blocks
//! pushed out of the window, or quiet for [`Decoder::settle`]'s age, count what they never
//! got as lost; a datagram of a settled block that still arrives (or is rebuilt) while the
//! block is in the window is handed on, counted late and taken off lost (a sending worker
//! that stalled mid-block loses nothing). With FEC off the lane only follows the sequence: gaps count as lost, late
//! arrivals are delivered and counted.
//!
//! This folder: `encoder` (the sender's lane), `decoder` (the receiver's lanes and windows),
//! `locator` and `direct` (the block code's decoding);
//! this file holds the setting ([`Fec`]) and the sizes both sides share.

use reed_solomon_erasure::galois_8::ReedSolomon;

use crate::wire::link::{MAX_BLOCK_SHARDS, MAX_K, MAX_M};

#[cfg(test)]
mod block_tests;
mod decoder;
mod direct;
mod encoder;
mod locator;
#[cfg(test)]
mod tests;

pub use decoder::{Decoder, DecoderCounts};
pub use direct::Direct;
pub use encoder::Encoder;
pub use locator::LocatorEngine;

pub use crate::wire::link::{data_mask, FRAME_CAP, MAX_LANES, MAX_PAYLOAD, SHARD_PREFIX};
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

/// Which code a link's FEC setting uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// `K+M`: Reed-Solomon over GF(2^8), exactly `m` repair frames per block of `k`, a
    /// partial block closed after [`CLOSE_MS`] (link header version 3).
    Gf8,
    /// `block`: Leopard Reed-Solomon over GF(2^16) (`reed-solomon-simd`), blocks of up to
    /// `k` frames across all the lane's streams, closed after `close_ms` even while
    /// traffic flows; a block of `k'` frames gets `ceil(k' × overhead_pct / 100)` repair
    /// frames (link header version 4).
    Block { overhead_pct: u8, close_ms: u8 },
}

/// A `K+M` link closes a partial block this long after its first frame.
pub const CLOSE_MS: u64 = 20;
/// `fec = "block"` defaults: repair frames per 100 data frames, data frames per block, and
/// the longest a block stays open.
pub const DEFAULT_OVERHEAD_PCT: u8 = 10;
pub const DEFAULT_BLOCK_FRAMES: u8 = 116;
pub const DEFAULT_BLOCK_MS: u8 = 2;

/// A link's FEC setting: `k` data + `m` repair packets per (full) block, and the code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fec {
    pub k: u8,
    pub m: u8,
    pub code: Code,
}

impl Fec {
    /// `K+M` of the GF(2^8) code (no range check: [`Fec::parse`] does it).
    pub const fn kpm(k: u8, m: u8) -> Fec {
        Fec {
            k,
            m,
            code: Code::Gf8,
        }
    }

    /// The block code: blocks of at most `frames` data frames and `close_ms` milliseconds,
    /// `overhead_pct` repair frames per 100. `Err` says which value is out of range.
    pub fn block(frames: u8, overhead_pct: u8, close_ms: u8) -> Result<Fec, String> {
        if !(1..=50).contains(&overhead_pct) {
            return Err(format!(
                "fec_overhead must be 1 to 50 (repair frames per 100 data frames), not {overhead_pct}"
            ));
        }
        if !(1..=100).contains(&close_ms) {
            return Err(format!(
                "fec_block_ms must be 1 to 100 (the longest a block stays open), not {close_ms}"
            ));
        }
        let m = repairs(usize::from(frames), overhead_pct);
        if frames < 2 || usize::from(frames) + m > MAX_BLOCK_SHARDS {
            let most = (2..=MAX_BLOCK_SHARDS)
                .rev()
                .find(|&k| k + repairs(k, overhead_pct) <= MAX_BLOCK_SHARDS)
                .unwrap_or(2);
            return Err(format!(
                "fec_block_frames must be 2 to {most} at fec_overhead = {overhead_pct} (data and repair frames of a block: at most {MAX_BLOCK_SHARDS}), not {frames}"
            ));
        }
        Ok(Fec {
            k: frames,
            m: m as u8,
            code: Code::Block {
                overhead_pct,
                close_ms,
            },
        })
    }

    /// Parses `off` (None), `K+M`, or `block` (the block code at its defaults; the
    /// `fec_*` keys change them: [`Fec::block`]).
    pub fn parse(s: &str) -> Result<Option<Fec>, String> {
        if s == "off" {
            return Ok(None);
        }
        if s == "block" {
            return Fec::block(DEFAULT_BLOCK_FRAMES, DEFAULT_OVERHEAD_PCT, DEFAULT_BLOCK_MS)
                .map(Some);
        }
        let bad = || {
            format!(
                "expected \"off\", \"block\" (Leopard Reed-Solomon blocks across the lane's streams, sized by fec_overhead, fec_block_frames and fec_block_ms) or \"K+M\" (K data and M repair packets per block, 1 <= K <= {MAX_K}, 1 <= M <= {MAX_M}), e.g. \"8+2\""
            )
        };
        let (k, m) = s.split_once('+').ok_or_else(bad)?;
        let k: u8 = k.trim().parse().map_err(|_| bad())?;
        let m: u8 = m.trim().parse().map_err(|_| bad())?;
        if !(1..=MAX_K).contains(&k) || !(1..=MAX_M).contains(&m) {
            return Err(bad());
        }
        Ok(Some(Fec::kpm(k, m)))
    }

    /// Repair bytes per data byte of a full block, as a fraction (m / k).
    pub fn overhead(&self) -> f64 {
        f64::from(self.m) / f64::from(self.k)
    }

    /// Whether this is the block code (link header version 4).
    pub fn block_code(&self) -> bool {
        matches!(self.code, Code::Block { .. })
    }

    /// Repair frames of a block of `k` data frames (`k <= self.k`).
    pub fn repairs_for(&self, k: usize) -> usize {
        match self.code {
            Code::Gf8 => usize::from(self.m),
            Code::Block { overhead_pct, .. } => repairs(k, overhead_pct),
        }
    }

    /// How long after its first frame a block is closed, milliseconds.
    pub fn close_ms(&self) -> u64 {
        match self.code {
            Code::Gf8 => CLOSE_MS,
            Code::Block { close_ms, .. } => u64::from(close_ms),
        }
    }
}

/// `ceil(k × pct / 100)`, at least 1.
fn repairs(k: usize, pct: u8) -> usize {
    (k * usize::from(pct)).div_ceil(100).max(1)
}

impl std::fmt::Display for Fec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.code {
            Code::Gf8 => write!(f, "{}+{}", self.k, self.m),
            Code::Block {
                overhead_pct,
                close_ms,
            } => write!(
                f,
                "block {}+{} {overhead_pct}% {close_ms}ms",
                self.k, self.m
            ),
        }
    }
}

/// A shard's length as the block code takes it: even (`reed-solomon-simd`).
fn coded_len(shard_len: usize) -> usize {
    shard_len.next_multiple_of(2)
}

/// One codec per possible block size `1..=k` (partial blocks), built once (`K+M`; none
/// for the block code).
fn codecs(fec: Fec) -> Vec<ReedSolomon> {
    if fec.block_code() {
        return Vec::new();
    }
    (1..=fec.k)
        .map(|k| {
            ReedSolomon::new(usize::from(k), usize::from(fec.m))
                .expect("k and m were checked against the code's limits")
        })
        .collect()
}
