//! JPEG over RTP (RFC 2435): the main header (types 0/1, or 64/65 with a restart marker
//! header), Q values from the standard range or with in-band quantization tables whose
//! length fits, a non-zero size, and fragment offsets that follow one another inside a
//! frame. The entropy-coded data itself is not checked.

use super::{RtpInfo, Violation};

#[derive(Clone, Debug, Default)]
pub(super) struct JpegState {
    /// Inside a frame: the offset the next fragment must have, and the frame's
    /// type/Q/width/height, which must not change inside it.
    next: Option<(u32, [u8; 4])>,
}

impl JpegState {
    pub fn check(&mut self, p: &[u8], rtp: &RtpInfo) -> Result<(), Violation> {
        let bad = Err(Violation::JpegHeader);
        let Some(h) = p.get(..8) else {
            return bad;
        };
        let offset = u32::from_be_bytes([0, h[1], h[2], h[3]]);
        let (typ, q, w, ht) = (h[4], h[5], h[6], h[7]);
        let mut o = 8;
        match typ {
            0 | 1 => {}
            64 | 65 => {
                // Restart marker header: interval, F/L bits, count.
                if p.len() < o + 4 {
                    return bad;
                }
                o += 4;
            }
            _ => return bad,
        }
        if q == 0 || (100..128).contains(&q) || w == 0 || ht == 0 {
            return bad;
        }
        if q >= 128 && offset == 0 {
            let Some(qt) = p.get(o..o + 4) else {
                return bad;
            };
            let len = usize::from(u16::from_be_bytes([qt[2], qt[3]]));
            if qt[0] != 0 || len % 64 != 0 || len > 4 * 128 || p.len() < o + 4 + len {
                return bad;
            }
            o += 4 + len;
        }
        if p.len() <= o {
            return bad;
        }
        let frame = [typ, q, w, ht];
        if rtp.gap {
            self.next = None;
        }
        match self.next {
            Some((want, f)) => {
                if offset != want {
                    return Err(Violation::JpegOffset);
                }
                if f != frame {
                    return bad;
                }
            }
            None if offset != 0 && !rtp.gap => return Err(Violation::JpegOffset),
            None => {}
        }
        let data = (p.len() - o) as u32;
        // After a loss the frame is followed from whatever fragment arrived.
        self.next = (!rtp.marker).then_some((offset + data, frame));
        Ok(())
    }
}
