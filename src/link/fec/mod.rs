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
//!
//! This folder: `encoder` (the sender's lane), `decoder` (the receiver's lanes and windows);
//! this file holds the setting ([`Fec`]) and the sizes both sides share.

use reed_solomon_erasure::galois_8::ReedSolomon;

use crate::wire::link::{MAX_K, MAX_M};

mod decoder;
mod encoder;
#[cfg(test)]
mod tests;

pub use decoder::{Decoder, DecoderCounts};
pub use encoder::Encoder;

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
