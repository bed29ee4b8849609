//! The block code's cheap path for the common case: one data frame of a block lost.
//!
//! Leopard's decoder runs an inverse and a forward FFT over the whole block (256 positions
//! at 116+12) whatever the number lost: about 2 million instructions per rebuilt block, 17 000
//! per datagram of it. With one data shard `e` missing and a repair shard `j` present, the
//! code's linearity gives it directly: repair `j` = `Σ_i g[j][i] × original_i` over GF(2^16)
//! (element by element), so `original_e = (repair_j + Σ_{i≠e} g[j][i] × original_i) / g[j][e]`
//! — `k` multiplications of a shard (the crate's SIMD `mul`) and XORs, about 30× less. The
//! coefficients `g` of a block size are read off the crate's own encoder once (one encode of
//! unit shards of 256 bytes: column `i` of original `i` is 1), so they are the sender's by
//! construction; a few block sizes are kept. Two or more lost go to the full decoder.
//!
//! Shards are handled in the crate's layout of 64-byte chunks (32 low bytes, then the 32 high
//! bytes of 32 elements; a shard's tail shorter than 64 bytes: its first half low bytes, its
//! second half high bytes), which this module reproduces to and from the frames' bytes.

use reed_solomon_simd::engine::{tables, DefaultEngine, Engine, GF_MODULUS};
use reed_solomon_simd::ReedSolomonEncoder;

use crate::wire::link::MAX_BLOCK_SHARDS;

/// Block sizes whose coefficients are kept (a lane's blocks are mostly full: one or two).
const CACHED: usize = 4;
/// The unit shards' length: 128 elements, one column per original.
const UNIT_BYTES: usize = 2 * MAX_BLOCK_SHARDS;

/// Coefficients of one block size: `rows[j * MAX_BLOCK_SHARDS + i]` = `g[j][i]` (logs).
struct Coeffs {
    k: usize,
    m: usize,
    logs: Box<[u16]>,
}

pub struct OneLoss {
    enc: ReedSolomonEncoder,
    engine: DefaultEngine,
    cache: [Coeffs; CACHED],
    /// The next cache entry to replace.
    next: usize,
    /// Work shards in the crate's layout: the sum and one term.
    acc: Box<[[u8; 64]]>,
    term: Box<[[u8; 64]]>,
    unit: Box<[u8]>,
}

impl OneLoss {
    /// For blocks of up to `k` + `m` shards of up to `shard_bytes` (even) bytes.
    pub fn new(k: usize, m: usize, shard_bytes: usize) -> OneLoss {
        let chunks = shard_bytes.div_ceil(64);
        OneLoss {
            enc: ReedSolomonEncoder::new(k, m, UNIT_BYTES)
                .expect("block sizes were checked against the code's limits"),
            engine: DefaultEngine::new(),
            cache: std::array::from_fn(|_| Coeffs {
                k: 0,
                m: 0,
                logs: vec![0u16; MAX_BLOCK_SHARDS * MAX_BLOCK_SHARDS].into_boxed_slice(),
            }),
            next: 0,
            acc: vec![[0u8; 64]; chunks].into_boxed_slice(),
            term: vec![[0u8; 64]; chunks].into_boxed_slice(),
            unit: vec![0u8; UNIT_BYTES].into_boxed_slice(),
        }
    }

    /// The cache entry of block size `k` + `m`, computed if missing. `None` if the crate
    /// refuses the size or a coefficient is zero (then the full decoder is used).
    fn coeffs(&mut self, k: usize, m: usize) -> Option<usize> {
        if let Some(at) = self.cache.iter().position(|c| c.k == k && c.m == m) {
            return Some(at);
        }
        let at = self.next;
        self.next = (self.next + 1) % CACHED;
        self.cache[at].k = 0;
        self.enc.reset(k, m, UNIT_BYTES).ok()?;
        for i in 0..k {
            self.unit.fill(0);
            // Element i: chunk i / 32, low byte at i % 32 (high byte 0): the value 1.
            self.unit[(i / 32) * 64 + i % 32] = 1;
            self.enc.add_original_shard(&self.unit[..]).ok()?;
        }
        let log = &tables::get_exp_log().log;
        let out = self.enc.encode().ok()?;
        let logs = &mut self.cache[at].logs;
        for (j, rec) in out.recovery_iter().enumerate() {
            for i in 0..k {
                let b = (i / 32) * 64 + i % 32;
                let g = u16::from(rec[b]) | (u16::from(rec[b + 32]) << 8);
                if g == 0 {
                    return None;
                }
                logs[j * MAX_BLOCK_SHARDS + i] = log[usize::from(g)];
            }
        }
        self.cache[at].k = k;
        self.cache[at].m = m;
        Some(at)
    }

    /// Rebuilds original `lost` of a block of `k` + `m` shards of `len` bytes from all other
    /// originals and repair shard `j`: `region` holds the block's shards in slots of `cap`
    /// bytes (originals `0..k`, then repairs), each zero-padded to `len`; the result is
    /// written to slot `lost`. `false` when this path cannot (the caller uses the full
    /// decoder).
    #[allow(clippy::too_many_arguments)]
    pub fn rebuild(
        &mut self,
        k: usize,
        m: usize,
        len: usize,
        lost: usize,
        j: usize,
        region: &mut [u8],
        cap: usize,
    ) -> bool {
        if !len.is_multiple_of(2)
            || len > cap
            || len.div_ceil(64) > self.acc.len()
            || lost >= k
            || j >= m
            || region.len() < (k + m) * cap
        {
            return false;
        }
        let Some(at) = self.coeffs(k, m) else {
            return false;
        };
        let chunks = len.div_ceil(64);
        let logs = &self.cache[at].logs[j * MAX_BLOCK_SHARDS..];
        let (acc, term) = (&mut self.acc[..chunks], &mut self.term[..chunks]);
        let shard = |i: usize| &region[i * cap..i * cap + len];
        to_chunks(shard(k + j), acc);
        for i in (0..k).filter(|&i| i != lost) {
            to_chunks(shard(i), term);
            self.engine.mul(term, logs[i]);
            for (a, t) in acc.iter_mut().zip(term.iter()) {
                for (x, y) in a.iter_mut().zip(t) {
                    *x ^= y;
                }
            }
        }
        // Divide by g[j][lost]: multiply by its inverse (log 65535 - log g).
        self.engine.mul(acc, GF_MODULUS - logs[lost]);
        from_chunks(acc, &mut region[lost * cap..lost * cap + len]);
        true
    }
}

/// `shard` (even length) into the crate's chunk layout.
fn to_chunks(shard: &[u8], dst: &mut [[u8; 64]]) {
    let whole = shard.len() / 64;
    let tail = shard.len() % 64;
    dst[..whole]
        .as_flattened_mut()
        .copy_from_slice(&shard[..whole * 64]);
    if tail > 0 {
        let (lo, hi) = shard[whole * 64..].split_at(tail / 2);
        let d = &mut dst[whole];
        d.fill(0);
        d[..lo.len()].copy_from_slice(lo);
        d[32..32 + hi.len()].copy_from_slice(hi);
    }
}

/// The inverse of [`to_chunks`].
fn from_chunks(src: &[[u8; 64]], out: &mut [u8]) {
    let whole = out.len() / 64;
    let tail = out.len() % 64;
    out[..whole * 64].copy_from_slice(&src[..whole].as_flattened()[..whole * 64]);
    if tail > 0 {
        let (lo, hi) = out[whole * 64..].split_at_mut(tail / 2);
        lo.copy_from_slice(&src[whole][..lo.len()]);
        let n = hi.len();
        hi.copy_from_slice(&src[whole][32..32 + n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every lost position, from every repair shard, at lengths with and without a short
    /// tail chunk and at the block sizes a lane uses: the original comes back byte for byte.
    #[test]
    fn one_lost_original_is_rebuilt_from_any_repair_shard() {
        const CAP: usize = 1472;
        let mut one = OneLoss::new(116, 12, 1424);
        for (k, m, len) in [
            (116, 12, 1322),
            (116, 12, 1408),
            (5, 1, 70),
            (2, 1, 2),
            (111, 17, 64),
        ] {
            let mut region = vec![0u8; (k + m) * CAP];
            for i in 0..k {
                for (b, x) in region[i * CAP..i * CAP + len].iter_mut().enumerate() {
                    *x = (i * 131 + b * 7 + b / 3) as u8;
                }
            }
            let mut enc = ReedSolomonEncoder::new(k, m, len).unwrap();
            for i in 0..k {
                enc.add_original_shard(&region[i * CAP..i * CAP + len])
                    .unwrap();
            }
            let rec: Vec<Vec<u8>> = enc
                .encode()
                .unwrap()
                .recovery_iter()
                .map(<[u8]>::to_vec)
                .collect();
            for (j, r) in rec.iter().enumerate() {
                region[(k + j) * CAP..(k + j) * CAP + len].copy_from_slice(r);
            }
            for lost in [0, k / 2, k - 1] {
                for j in [0, m - 1] {
                    let want = region[lost * CAP..lost * CAP + len].to_vec();
                    region[lost * CAP..lost * CAP + len].fill(0xee);
                    assert!(one.rebuild(k, m, len, lost, j, &mut region, CAP), "{k}+{m}");
                    assert_eq!(
                        region[lost * CAP..lost * CAP + len],
                        want[..],
                        "{k}+{m} len {len} lost {lost} from {j}"
                    );
                }
            }
        }
        assert!(
            !one.rebuild(116, 12, 1323, 0, 0, &mut vec![0; 128 * CAP], CAP),
            "odd length"
        );
    }
}
