//! The block code's decoding engine: `reed-solomon-simd`'s own SIMD engine
//! ([`DefaultEngine`]: AVX2/SSSE3/NEON chosen at run time) for the transforms, with the
//! erasure locator evaluated only where the decoder reads it.
//!
//! Leopard's decoder needs, for every position `i` of the codeword it reads (recovery and
//! original shards, `0..truncated_size`), the logarithm of the erasure locator
//! `Λ(i) = Π_{j erased} (i ⊕ j)` (additive subspace points: subtraction is XOR), that is
//! `Σ_{j erased} log(i ⊕ j) mod 65535` (`log 0` counts 0). The crate evaluates it with two
//! Walsh-Hadamard transforms over the whole field (2^16 points, 16 butterfly layers), a fixed
//! cost of about a million operations per decode whatever the block's size — the 390–450 µs
//! per rebuilt block of `docs/bench-split.md`. A link block has at most 128 shards and at most
//! `chunk_size` (the recovery count rounded up to a power of two) erased positions, so the
//! direct sum costs `truncated_size × erased` table reads (≤ 144 × 16 at 116+12), a few
//! thousand. Larger problems (the low-rate decoder erases the whole field's tail) go to the
//! crate's transform.

use reed_solomon_simd::engine::{tables, DefaultEngine, Engine, GfElement, ShardsRefMut};
use reed_solomon_simd::engine::{GF_MODULUS, GF_ORDER};

/// Direct evaluation while `positions × erased` stays under this (table reads); above it the
/// crate's two transforms (~16 × 2^16 operations each) are cheaper.
const DIRECT_LIMIT: usize = 1 << 17;
/// Erased positions the direct evaluation collects at most.
const MAX_ERASED: usize = 1024;

/// [`DefaultEngine`] with a direct erasure-locator evaluation (see the module doc).
pub struct LocatorEngine(DefaultEngine);

impl LocatorEngine {
    pub fn new() -> LocatorEngine {
        LocatorEngine(DefaultEngine::new())
    }
}

impl Default for LocatorEngine {
    fn default() -> LocatorEngine {
        LocatorEngine::new()
    }
}

impl Engine for LocatorEngine {
    fn fft(
        &self,
        data: &mut ShardsRefMut,
        pos: usize,
        size: usize,
        truncated_size: usize,
        skew_delta: usize,
    ) {
        self.0.fft(data, pos, size, truncated_size, skew_delta);
    }

    fn ifft(
        &self,
        data: &mut ShardsRefMut,
        pos: usize,
        size: usize,
        truncated_size: usize,
        skew_delta: usize,
    ) {
        self.0.ifft(data, pos, size, truncated_size, skew_delta);
    }

    fn mul(&self, x: &mut [[u8; 64]], log_m: GfElement) {
        self.0.mul(x, log_m);
    }

    fn eval_poly(erasures: &mut [GfElement; GF_ORDER], truncated_size: usize) {
        if !eval_direct(erasures, truncated_size) {
            <DefaultEngine as Engine>::eval_poly(erasures, truncated_size);
        }
    }
}

/// Replaces `erasures[..n]` (1 where erased, 0 elsewhere; nothing is erased at or past `n`)
/// by the locator's logarithm at each position, as the crate's `eval_poly` does (mod 65535:
/// the same field element, 0 and 65535 both meaning 1). `false`, touching nothing, when the
/// problem is too large for the direct sum.
fn eval_direct(erasures: &mut [GfElement; GF_ORDER], n: usize) -> bool {
    let mut erased = [0usize; MAX_ERASED];
    let mut count = 0;
    for (i, &e) in erasures[..n].iter().enumerate() {
        if e != 0 {
            if count == MAX_ERASED {
                return false;
            }
            erased[count] = i;
            count += 1;
        }
    }
    if count.saturating_mul(n) > DIRECT_LIMIT {
        return false;
    }
    let log = &tables::get_exp_log().log;
    let modulus = u32::from(GF_MODULUS);
    for (i, e) in erasures[..n].iter_mut().enumerate() {
        // At most MAX_ERASED terms below 2^16: no overflow. log[0] is 65535 ≡ 0.
        let sum: u32 = erased[..count].iter().map(|&j| u32::from(log[i ^ j])).sum();
        *e = (sum % modulus) as GfElement;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The direct sum gives the crate's values (mod 65535) wherever the decoder reads them,
    /// for erasure patterns of the link's block sizes.
    #[test]
    fn direct_locator_matches_the_transform() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for (k, m) in [
            (116usize, 12usize),
            (111, 17),
            (8, 1),
            (1, 1),
            (85, 43),
            (3, 2),
        ] {
            let chunk = m.next_power_of_two();
            let end = chunk + k;
            for _ in 0..20 {
                let mut a = Box::new([0 as GfElement; GF_ORDER]);
                a[m..chunk].fill(1);
                let lose = (next() as usize) % (m + 1);
                for _ in 0..lose {
                    let i = (next() as usize) % (m + k);
                    let pos = if i < m { i } else { chunk + i - m };
                    a[pos] = 1;
                }
                let mut b = a.clone();
                assert!(eval_direct(&mut a, end), "{k}+{m}: direct");
                <DefaultEngine as Engine>::eval_poly(&mut b, end);
                for i in 0..end {
                    assert_eq!(
                        u32::from(a[i]) % 65535,
                        u32::from(b[i]) % 65535,
                        "{k}+{m} at {i}"
                    );
                }
            }
        }
    }

    #[test]
    fn large_problems_go_to_the_transform() {
        let mut a = Box::new([1 as GfElement; GF_ORDER]);
        assert!(!eval_direct(&mut a, GF_ORDER));
        assert!(a.iter().all(|&e| e == 1), "untouched");
    }
}
