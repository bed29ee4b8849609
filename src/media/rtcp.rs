//! RTCP (RFC 3550 §6) compound packets, on an RTCP route (the RTP port + 1) or muxed on the
//! RTP port (RFC 5761: the second byte 192–223, which no RTP payload type of a muxed session
//! may take). Each packet is version 2 with a known type (SR, RR, SDES, BYE, RTPFB, PSFB,
//! XR: 200–203, 205–207); its length field, in 32-bit words, keeps it inside the datagram and
//! the packets add up to the datagram exactly; the first is an SR or RR (RFC 3550 §6.1; the
//! reduced-size RTCP of RFC 5506 is not negotiated by these sessions); padding only in the
//! last. Inside: SR/RR are exactly their report blocks, SDES chunks hold well-formed items
//! of the standard types (CNAME ... NOTE: text without control bytes; PRIV, free-form, is
//! refused), BYE its SSRCs and a reason that fits, feedback only the standard messages
//! (NACK, TMMBR/TMMBN, transport-wide CC; PLI, SLI, RPSI, FIR — not the application-layer
//! AFB, which is free-form), XR blocks of the RFC 3611 types whose lengths add up. APP (204)
//! is free-form data by definition and is refused.

use super::Violation;

const SR: u8 = 200;
const RR: u8 = 201;
const SDES: u8 = 202;
const BYE: u8 = 203;
const APP: u8 = 204;
const RTPFB: u8 = 205;
const PSFB: u8 = 206;
const XR: u8 = 207;

/// Whether `p` is RTCP by RFC 5761 §4: packet types 192–223 occupy the byte that holds an
/// RTP packet's marker and payload type 64–95.
pub(super) fn is_rtcp(p: &[u8]) -> bool {
    matches!(p.get(1), Some(192..=223))
}

/// Checks one RTCP compound packet (the whole UDP payload).
pub(super) fn check(p: &[u8]) -> Result<(), Violation> {
    let bad = Violation::RtcpMalformed;
    let mut rest = p;
    let mut first = true;
    if rest.is_empty() {
        return Err(bad);
    }
    while !rest.is_empty() {
        let h = rest.get(..4).ok_or(bad)?;
        if h[0] >> 6 != 2 {
            return Err(Violation::RtpVersion);
        }
        let count = usize::from(h[0] & 0x1f);
        let pt = h[1];
        let len = 4 * (usize::from(u16::from_be_bytes([h[2], h[3]])) + 1);
        let pkt = rest.get(..len).ok_or(bad)?;
        rest = &rest[len..];
        let mut body = &pkt[4..];
        if h[0] & 0x20 != 0 {
            // Padding: only in the last packet (RFC 3550 §6.4.1), a count within it.
            let n = usize::from(pkt[len - 1]);
            if !rest.is_empty() || n == 0 || n > body.len() {
                return Err(bad);
            }
            body = &body[..body.len() - n];
        }
        if first && pt != SR && pt != RR {
            return Err(Violation::RtcpFirst);
        }
        first = false;
        match pt {
            SR => exact(body, 24 + 24 * count)?,
            RR => exact(body, 4 + 24 * count)?,
            SDES => sdes(body, count)?,
            BYE => bye(body, count)?,
            APP => return Err(Violation::RtcpApp),
            RTPFB | PSFB => feedback(pt, body, count)?,
            XR => xr(body)?,
            _ => return Err(Violation::RtcpType),
        }
    }
    Ok(())
}

fn exact(body: &[u8], n: usize) -> Result<(), Violation> {
    if body.len() == n {
        Ok(())
    } else {
        Err(Violation::RtcpMalformed)
    }
}

/// SDES (§6.5): `count` chunks, each an SSRC, items, a null item and padding to 32 bits.
fn sdes(body: &[u8], count: usize) -> Result<(), Violation> {
    let bad = Violation::RtcpSdes;
    let mut rest = body;
    for _ in 0..count {
        let chunk_start = rest.len();
        rest = rest.get(4..).ok_or(bad)?;
        loop {
            let (&ty, tail) = rest.split_first().ok_or(bad)?;
            if ty == 0 {
                rest = tail;
                // Null item, then zeros up to the next 32-bit boundary.
                let used = chunk_start - rest.len();
                let pad = (4 - used % 4) % 4;
                let zeros = rest.get(..pad).ok_or(bad)?;
                if zeros.iter().any(|&z| z != 0) {
                    return Err(bad);
                }
                rest = &rest[pad..];
                break;
            }
            // CNAME, NAME, EMAIL, PHONE, LOC, TOOL, NOTE: text. PRIV (8) and others refused.
            if !(1..=7).contains(&ty) {
                return Err(bad);
            }
            let (&n, tail) = tail.split_first().ok_or(bad)?;
            let text = tail.get(..usize::from(n)).ok_or(bad)?;
            if text.iter().any(|&c| c < 0x20 || c == 0x7f) {
                return Err(bad);
            }
            rest = &tail[usize::from(n)..];
        }
    }
    if rest.is_empty() {
        Ok(())
    } else {
        Err(bad)
    }
}

/// BYE (§6.6): `count` SSRCs, then an optional reason (length, text, zero padding).
fn bye(body: &[u8], count: usize) -> Result<(), Violation> {
    let bad = Violation::RtcpMalformed;
    let rest = body.get(4 * count..).ok_or(bad)?;
    let Some((&n, tail)) = rest.split_first() else {
        return Ok(());
    };
    let text = tail.get(..usize::from(n)).ok_or(bad)?;
    let pad = &tail[usize::from(n)..];
    if text.iter().any(|&c| c < 0x20 || c == 0x7f) || pad.len() > 3 || pad.iter().any(|&z| z != 0) {
        return Err(bad);
    }
    Ok(())
}

/// RTPFB/PSFB (RFC 4585 §6.1, RFC 5104): sender and media SSRC, then the FCI of a standard
/// message: RTPFB generic NACK (4-byte entries), TMMBR/TMMBN (8), transport-wide CC; PSFB
/// PLI (none), SLI, RPSI, FIR (8). Not AFB (application-layer, free-form).
fn feedback(pt: u8, body: &[u8], fmt: usize) -> Result<(), Violation> {
    let fci = body.len().checked_sub(8).ok_or(Violation::RtcpMalformed)?;
    let ok = match (pt, fmt) {
        (RTPFB, 1) => fci > 0 && fci % 4 == 0,
        (RTPFB, 3 | 4) | (PSFB, 4) => fci > 0 && fci % 8 == 0,
        (RTPFB, 15) | (PSFB, 2 | 3) => true,
        (PSFB, 1) => fci == 0,
        _ => return Err(Violation::RtcpType),
    };
    if !ok {
        return Err(Violation::RtcpMalformed);
    }
    Ok(())
}

/// XR (RFC 3611 §3): sender SSRC, then report blocks (type 1–7) whose lengths add up.
fn xr(body: &[u8]) -> Result<(), Violation> {
    let bad = Violation::RtcpMalformed;
    let mut rest = body.get(4..).ok_or(bad)?;
    while !rest.is_empty() {
        let h = rest.get(..4).ok_or(bad)?;
        if !(1..=7).contains(&h[0]) {
            return Err(Violation::RtcpType);
        }
        let n = 4 + 4 * usize::from(u16::from_be_bytes([h[2], h[3]]));
        rest = rest.get(n..).ok_or(bad)?;
    }
    Ok(())
}
