//! Audio payloads: G.711 (RFC 3551 §4.5.14: one byte per sample, any byte value; the size
//! must be a plausible packet time and the timestamp must advance by the samples of the
//! previous packet) and AAC in RFC 3640 `mpeg4-generic` mode AAC-hbr (AU headers of 13-bit
//! sizes and 3-bit indices that add up to the payload, or one AU fragmented).

use super::{Policy, RtpInfo, Violation};

pub(super) fn check_g711(p: &[u8], rtp: &RtpInfo, policy: &Policy) -> Result<(), Violation> {
    let max = u64::from(rtp.clock_rate) * u64::from(policy.max_audio_ptime_ms) / 1000;
    if p.len() as u64 > max {
        return Err(Violation::AudioSize);
    }
    if !rtp.gap {
        if let Some(d) = rtp.ts_delta {
            if d as i64 != rtp.prev_len as i64 {
                return Err(Violation::AudioTimestamp);
            }
        }
    }
    Ok(())
}

pub(super) fn check_aac(p: &[u8]) -> Result<(), Violation> {
    let bad = Err(Violation::AacAuHeaders);
    let [a, b, ..] = *p else {
        return bad;
    };
    let bits = usize::from(u16::from_be_bytes([a, b]));
    if bits == 0 || bits % 16 != 0 {
        return bad;
    }
    let n = bits / 16;
    let Some(headers) = p.get(2..2 + 2 * n) else {
        return bad;
    };
    let data = p.len() - 2 - 2 * n;
    let mut sum = 0usize;
    for h in headers.chunks_exact(2) {
        let h = u16::from_be_bytes([h[0], h[1]]);
        if h & 0x07 != 0 {
            // AU-Index / AU-Index-delta 0: no interleaving was negotiated.
            return bad;
        }
        let size = usize::from(h >> 3);
        if size == 0 {
            return bad;
        }
        sum += size;
    }
    // Whole AUs, or one AU fragmented over several packets (each carries its full size).
    if sum == data || (n == 1 && sum > data && data > 0) {
        Ok(())
    } else {
        bad
    }
}
