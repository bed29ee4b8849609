//! The block code's direct rebuild of the lost data frames of a block (up to [`MAX_LOST`]).
//!
//! Leopard's decoder runs an inverse and a forward FFT over the whole block (256 positions
//! at 116+12) whatever the number lost: about 2 million instructions per rebuilt block,
//! 17 000 per datagram of it. The code is systematic and linear: repair `j` =
//! `Σ_i g[j][i] × original_i` over GF(2^16), element by element. With the data shards `E`
//! (`t = |E|`) missing and `t` repair shards `J` present, the syndromes
//! `s_j = repair_j + Σ_{i∉E} g[j][i] × original_i` (subtraction is XOR) satisfy
//! `s_j = Σ_{e∈E} g[j][e] × original_e`: a `t × t` system `A x = s` with
//! `A = g[J][E]`, which is invertible because the code is MDS (every square submatrix of
//! `g` is). Its inverse (scalars: `t³` table look-ups) gives `original_e = Σ_j A⁻¹[e][j] ×
//! s_j`: `t²` shard multiplications (the crate's SIMD `mul`). The syndromes cost `t × k`
//! shard multiplications when few are lost; from [`REENCODE_FROM`] lost on, one encode of
//! the block with the lost shards as zeros (the crate's encoder, ≈ the sender's cost for
//! the block) gives every repair's `Σ_{i∉E}` at once. So a block costs, in shard
//! multiplications, about `k` at one lost, `2k` at two, `≈ 4k + t²` from three: less
//! than the full decoder's at any loss a link block can repair (`docs/bench-split.md`,
//! `scripts/bench-fec.sh`). More than [`MAX_LOST`] lost go to the full decoder.
//!
//! The coefficients `g` of a block size are read off the crate's own encoder once (one
//! encode of unit shards of 256 bytes: column `i` of original `i` is 1), so they are the
//! sender's by construction; a few block sizes are kept.
//!
//! Shards are handled in the crate's layout of 64-byte chunks (32 low bytes, then the 32
//! high bytes of 32 elements; a shard's tail shorter than 64 bytes: its first half low
//! bytes, its second half high bytes), which this module reproduces to and from the
//! frames' bytes.

use reed_solomon_simd::engine::{tables, DefaultEngine, Engine, GfElement, GF_MODULUS};
use reed_solomon_simd::ReedSolomonEncoder;

use crate::wire::link::MAX_BLOCK_SHARDS;

/// Most lost data frames of a block rebuilt here (the full decoder beyond: only blocks of
/// more than 32 repair frames, `fec_overhead` above 33 %, can lose more and be rebuilt).
pub const MAX_LOST: usize = 32;
/// From this many lost on, the syndromes come from one encode of the block instead of
/// `k` products per lost frame (the encode costs about 3 of those rows at 116+12).
const REENCODE_FROM: usize = 3;
/// Block sizes whose coefficients are kept (a lane's blocks are mostly full: one or two).
const CACHED: usize = 4;
/// The unit shards' length: 128 elements, one column per original.
const UNIT_BYTES: usize = 2 * MAX_BLOCK_SHARDS;

/// Coefficients of one block size: `logs[j * MAX_BLOCK_SHARDS + i]` = `log g[j][i]`.
struct Coeffs {
    k: usize,
    m: usize,
    logs: Box<[u16]>,
}

pub struct Direct {
    /// The coefficients' unit encodes and the syndromes' re-encode (buffers sized for the
    /// largest block when made).
    enc: ReedSolomonEncoder,
    engine: DefaultEngine,
    cache: [Coeffs; CACHED],
    /// The next cache entry to replace.
    next: usize,
    /// Chunks of the longest shard.
    chunks: usize,
    /// Work shards in the crate's layout: [`MAX_LOST`] syndromes, a sum and one term.
    syn: Box<[[u8; 64]]>,
    acc: Box<[[u8; 64]]>,
    term: Box<[[u8; 64]]>,
    unit: Box<[u8]>,
}

/// `a × b` over GF(2^16) given as logarithms (`log 0` is not taken: both non-zero).
fn add_log(a: u16, b: u16) -> u16 {
    ((u32::from(a) + u32::from(b)) % u32::from(GF_MODULUS)) as u16
}

fn sub_log(a: u16, b: u16) -> u16 {
    ((u32::from(a) + u32::from(GF_MODULUS) - u32::from(b)) % u32::from(GF_MODULUS)) as u16
}

fn xor_into(acc: &mut [[u8; 64]], x: &[[u8; 64]]) {
    for (a, t) in acc.iter_mut().zip(x) {
        for (p, q) in a.iter_mut().zip(t) {
            *p ^= q;
        }
    }
}

/// Inverts the `t × t` matrix `a` (field elements) in place by Gauss-Jordan elimination;
/// `false` if it is singular.
fn invert(a: &mut [[GfElement; MAX_LOST]; MAX_LOST], t: usize) -> bool {
    let el = tables::get_exp_log();
    let (exp, log) = (&el.exp, &el.log);
    let mul = |x: GfElement, y: GfElement| -> GfElement {
        if x == 0 || y == 0 {
            0
        } else {
            exp[usize::from(add_log(log[usize::from(x)], log[usize::from(y)]))]
        }
    };
    let mut inv = [[0 as GfElement; MAX_LOST]; MAX_LOST];
    for (i, row) in inv.iter_mut().enumerate().take(t) {
        row[i] = 1;
    }
    for c in 0..t {
        let Some(p) = (c..t).find(|&r| a[r][c] != 0) else {
            return false;
        };
        a.swap(c, p);
        inv.swap(c, p);
        // Scale the pivot row to 1.
        let f = exp[usize::from(sub_log(0, log[usize::from(a[c][c])]))];
        for x in 0..t {
            a[c][x] = mul(a[c][x], f);
            inv[c][x] = mul(inv[c][x], f);
        }
        for r in 0..t {
            let f = a[r][c];
            if r == c || f == 0 {
                continue;
            }
            for x in 0..t {
                a[r][x] ^= mul(a[c][x], f);
                inv[r][x] ^= mul(inv[c][x], f);
            }
        }
    }
    *a = inv;
    true
}

/// Positions of the set bits of `bits`, the lowest first, at most `N`.
fn positions<const N: usize>(mut bits: u128) -> ([usize; N], usize) {
    let mut out = [0; N];
    let mut n = 0;
    while bits != 0 && n < N {
        out[n] = bits.trailing_zeros() as usize;
        bits &= bits - 1;
        n += 1;
    }
    (out, n)
}

impl Direct {
    /// For blocks of up to `k` + `m` shards of up to `shard_bytes` (even) bytes.
    pub fn new(k: usize, m: usize, shard_bytes: usize) -> Direct {
        let chunks = shard_bytes.div_ceil(64);
        Direct {
            enc: ReedSolomonEncoder::new(k, m, shard_bytes.max(UNIT_BYTES))
                .expect("block sizes were checked against the code's limits"),
            engine: DefaultEngine::new(),
            cache: std::array::from_fn(|_| Coeffs {
                k: 0,
                m: 0,
                logs: vec![0u16; MAX_BLOCK_SHARDS * MAX_BLOCK_SHARDS].into_boxed_slice(),
            }),
            next: 0,
            chunks,
            syn: vec![[0u8; 64]; MAX_LOST * chunks].into_boxed_slice(),
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

    /// Rebuilds the originals `missing` (bits of `0..k`) of a block of `k` + `m` shards of
    /// `len` bytes from all other originals and the repair shards `repairs` (bits of
    /// `0..m`; as many of them are used as are missing): `region` holds the block's shards
    /// in slots of `cap` bytes (originals `0..k`, then repairs), each present one
    /// zero-padded to `len`; the results are written to the missing slots. `false` when
    /// this path cannot (the caller uses the full decoder).
    #[allow(clippy::too_many_arguments)]
    pub fn rebuild(
        &mut self,
        k: usize,
        m: usize,
        len: usize,
        missing: u128,
        repairs: u128,
        region: &mut [u8],
        cap: usize,
    ) -> bool {
        let t = missing.count_ones() as usize;
        if !len.is_multiple_of(2)
            || len > cap
            || len.div_ceil(64) > self.chunks
            || t == 0
            || t > MAX_LOST
            || (repairs.count_ones() as usize) < t
            || k + m > MAX_BLOCK_SHARDS
            || missing >> k != 0
            || repairs >> m != 0
            || region.len() < (k + m) * cap
        {
            return false;
        }
        let Some(at) = self.coeffs(k, m) else {
            return false;
        };
        let (lost, _) = positions::<MAX_LOST>(missing);
        let (rows, _) = positions::<MAX_LOST>(repairs);
        let logs = &self.cache[at].logs;
        let g = |j: usize, i: usize| logs[j * MAX_BLOCK_SHARDS + i];

        // A = g[rows][lost], inverted.
        let exp = &tables::get_exp_log().exp;
        let mut a = [[0 as GfElement; MAX_LOST]; MAX_LOST];
        for r in 0..t {
            for c in 0..t {
                a[r][c] = exp[usize::from(g(rows[r], lost[c]))];
            }
        }
        if !invert(&mut a, t) {
            return false;
        }

        // The syndromes s_r = repair_{rows[r]} + Σ_{i∉lost} g[rows[r]][i] × original_i.
        let chunks = len.div_ceil(64);
        let engine = &self.engine;
        let (acc, term) = (&mut self.acc[..chunks], &mut self.term[..chunks]);
        let syn = &mut self.syn[..t * self.chunks];
        let slot = |i: usize| i * cap..i * cap + len;
        for r in 0..t {
            to_chunks(
                &region[slot(k + rows[r])],
                &mut syn[r * chunks..(r + 1) * chunks],
            );
        }
        if t < REENCODE_FROM {
            for i in (0..k).filter(|&i| missing & (1 << i) == 0) {
                // g[rows[r]][i] × original_i, from the previous row's product.
                to_chunks(&region[slot(i)], term);
                let mut prev = 0;
                for r in 0..t {
                    self.engine.mul(term, sub_log(g(rows[r], i), prev));
                    prev = g(rows[r], i);
                    xor_into(&mut syn[r * chunks..(r + 1) * chunks], term);
                }
            }
        } else {
            // One encode of the block with the lost originals as zeros.
            for &e in &lost[..t] {
                region[slot(e)].fill(0);
            }
            if self.enc.reset(k, m, len).is_err() {
                return false;
            }
            for i in 0..k {
                if self.enc.add_original_shard(&region[slot(i)]).is_err() {
                    return false;
                }
            }
            let Ok(out) = self.enc.encode() else {
                return false;
            };
            for r in 0..t {
                let Some(rec) = out.recovery(rows[r]) else {
                    return false;
                };
                to_chunks(rec, term);
                xor_into(&mut syn[r * chunks..(r + 1) * chunks], term);
            }
        }

        // original_lost[c] = Σ_r A⁻¹[c][r] × s_r.
        let log = &tables::get_exp_log().log;
        for c in 0..t {
            acc.fill([0; 64]);
            for r in 0..t {
                let x = a[c][r];
                if x == 0 {
                    continue;
                }
                term.copy_from_slice(&syn[r * chunks..(r + 1) * chunks]);
                engine.mul(term, log[usize::from(x)]);
                xor_into(acc, term);
            }
            from_chunks(acc, &mut region[slot(lost[c])]);
        }
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

    const CAP: usize = 1472;

    use crate::link::fec::block_tests::rng;

    /// A block of `k` + `m` random shards of `len` bytes, in `CAP` slots, its repairs from
    /// the crate's encoder (as the sender makes them).
    fn block(k: usize, m: usize, len: usize, next: &mut impl FnMut() -> u64) -> Vec<u8> {
        let mut region = vec![0u8; (k + m) * CAP];
        for i in 0..k {
            for x in region[i * CAP..i * CAP + len].iter_mut() {
                *x = next() as u8;
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
        region
    }

    /// `n` distinct random positions of `0..of`, as bits.
    fn pick(n: usize, of: usize, next: &mut impl FnMut() -> u64) -> u128 {
        let mut bits = 0u128;
        while (bits.count_ones() as usize) < n {
            bits |= 1 << (next() as usize % of);
        }
        bits
    }

    /// One lost original, from every repair shard, at lengths with and without a short
    /// tail chunk and at the block sizes a lane uses: the original comes back byte for byte.
    #[test]
    fn one_lost_original_is_rebuilt_from_any_repair_shard() {
        let mut next = rng(0x0e1_0551);
        let mut one = Direct::new(116, 12, 1424);
        for (k, m, len) in [
            (116, 12, 1322),
            (116, 12, 1408),
            (5, 1, 70),
            (2, 1, 2),
            (111, 17, 64),
        ] {
            let mut region = block(k, m, len, &mut next);
            for lost in [0, k / 2, k - 1] {
                for j in [0, m - 1] {
                    let want = region[lost * CAP..lost * CAP + len].to_vec();
                    region[lost * CAP..lost * CAP + len].fill(0xee);
                    assert!(
                        one.rebuild(k, m, len, 1 << lost, 1 << j, &mut region, CAP),
                        "{k}+{m}"
                    );
                    assert_eq!(
                        region[lost * CAP..lost * CAP + len],
                        want[..],
                        "{k}+{m} len {len} lost {lost} from {j}"
                    );
                }
            }
        }
        assert!(
            !one.rebuild(116, 12, 1323, 1, 1, &mut vec![0; 128 * CAP], CAP),
            "odd length"
        );
    }

    /// Property: random block sizes (overhead 1 to 50 %), shard lengths, lost originals
    /// (1 up to the repairs left) and lost repairs; every lost original is rebuilt bit-exact
    /// from whichever repairs are left, through both ways of making the syndromes, and the
    /// other shards are untouched. 400 seeded cases.
    #[test]
    fn random_losses_are_rebuilt_bit_exact() {
        let mut next = rng(0xd1ec_7501_5eed_0001);
        let mut direct = Direct::new(116, 43, 1424);
        for case in 0..400 {
            let k = 2 + next() as usize % 115;
            let pct = 1 + next() as usize % 50;
            let m = (k * pct).div_ceil(100).max(1);
            if k + m > MAX_BLOCK_SHARDS {
                continue;
            }
            let len = 2 + 2 * (next() as usize % 712);
            let t = 1 + next() as usize % m.min(MAX_LOST);
            let region = block(k, m, len, &mut next);
            let missing = pick(t.min(k), k, &mut next);
            let t = missing.count_ones() as usize;
            let repairs = pick(t + next() as usize % (m - t + 1), m, &mut next);
            let mut got = region.clone();
            for e in 0..k {
                if missing & (1 << e) != 0 {
                    got[e * CAP..e * CAP + len].fill(next() as u8);
                }
            }
            // Lost repairs are garbage too: they must not be read.
            for j in 0..m {
                if repairs & (1 << j) == 0 {
                    got[(k + j) * CAP..(k + j) * CAP + len].fill(0x77);
                    got[(k + j) * CAP] ^= 1;
                }
            }
            assert!(
                direct.rebuild(k, m, len, missing, repairs, &mut got, CAP),
                "case {case}: {k}+{m} len {len} lost {t}"
            );
            for i in 0..k {
                assert_eq!(
                    got[i * CAP..i * CAP + len],
                    region[i * CAP..i * CAP + len],
                    "case {case}: {k}+{m} len {len} lost {missing:#x} from {repairs:#x}: shard {i}"
                );
            }
        }
    }

    #[test]
    fn too_few_repairs_are_refused() {
        let mut next = rng(7);
        let mut direct = Direct::new(116, 12, 1424);
        let mut region = block(116, 12, 100, &mut next);
        assert!(!direct.rebuild(116, 12, 100, 0b111, 0b11, &mut region, CAP));
        assert!(!direct.rebuild(116, 12, 100, 0, 0b11, &mut region, CAP));
        assert!(!direct.rebuild(116, 12, 100, 1 << 116, 0b11, &mut region, CAP));
    }
}
