//! RTP (RFC 3550) and RTCP header views: just enough to tell RTP from the rest and to read
//! the sequence number and SSRC on the data path. Checked once; the accessors cannot panic.

use super::WireError;

/// A checked view of an RTP packet's fixed header.
#[derive(Clone, Copy, Debug)]
pub struct RtpPacket<'a> {
    buf: &'a [u8],
}

const FIXED: usize = 12;

impl<'a> RtpPacket<'a> {
    /// Accepts version 2 packets whose fixed header and CSRC list fit in `buf`. RTCP
    /// (payload types 200-204 with the marker bit position, RFC 5761 §4) is refused, so that
    /// RTCP on a muxed port does not disturb sequence accounting.
    pub fn new_checked(buf: &'a [u8]) -> Result<Self, WireError> {
        if buf.len() < FIXED {
            return Err(WireError::Truncated);
        }
        if buf[0] >> 6 != 2 {
            return Err(WireError::NotRtp);
        }
        if (200..=204).contains(&buf[1]) {
            return Err(WireError::NotRtp);
        }
        let csrc = usize::from(buf[0] & 0x0f) * 4;
        if buf.len() < FIXED + csrc {
            return Err(WireError::Truncated);
        }
        Ok(RtpPacket { buf })
    }

    pub fn sequence(&self) -> u16 {
        u16::from_be_bytes([self.buf[2], self.buf[3]])
    }

    pub fn timestamp(&self) -> u32 {
        u32::from_be_bytes([self.buf[4], self.buf[5], self.buf[6], self.buf[7]])
    }

    pub fn ssrc(&self) -> u32 {
        u32::from_be_bytes([self.buf[8], self.buf[9], self.buf[10], self.buf[11]])
    }

    pub fn payload_type(&self) -> u8 {
        self.buf[1] & 0x7f
    }

    pub fn marker(&self) -> bool {
        self.buf[1] & 0x80 != 0
    }
}

/// Whether `buf` looks like RTCP (version 2, packet type 200-204).
pub fn is_rtcp(buf: &[u8]) -> bool {
    buf.len() >= 8 && buf[0] >> 6 == 2 && (200..=204).contains(&buf[1])
}

/// Writes a minimal RTP header (version 2, no CSRC) into `buf[..12]`; for generators/tests.
pub fn write_header(buf: &mut [u8], pt: u8, seq: u16, ts: u32, ssrc: u32) -> Result<(), WireError> {
    let h = buf.get_mut(..FIXED).ok_or(WireError::Truncated)?;
    h[0] = 0x80;
    h[1] = pt & 0x7f;
    h[2..4].copy_from_slice(&seq.to_be_bytes());
    h[4..8].copy_from_slice(&ts.to_be_bytes());
    h[8..12].copy_from_slice(&ssrc.to_be_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut b = [0u8; 20];
        write_header(&mut b, 33, 65535, 90000, 0xdeadbeef).unwrap();
        let p = RtpPacket::new_checked(&b).unwrap();
        assert_eq!(p.sequence(), 65535);
        assert_eq!(p.timestamp(), 90000);
        assert_eq!(p.ssrc(), 0xdeadbeef);
        assert_eq!(p.payload_type(), 33);
        assert!(!p.marker());
    }

    #[test]
    fn refuses_garbage_short_and_rtcp() {
        assert_eq!(
            RtpPacket::new_checked(&[0x80; 5]).unwrap_err(),
            WireError::Truncated
        );
        assert_eq!(
            RtpPacket::new_checked(&[0; 40]).unwrap_err(),
            WireError::NotRtp
        );
        let mut b = [0u8; 12];
        b[0] = 0x8f; // 15 CSRCs announced, none present
        assert_eq!(
            RtpPacket::new_checked(&b).unwrap_err(),
            WireError::Truncated
        );
        let rr = [0x81, 201, 0, 7, 1, 2, 3, 4];
        assert!(is_rtcp(&rr));
        assert!(RtpPacket::new_checked(&[0x81, 201, 0, 7, 1, 2, 3, 4, 0, 0, 0, 0]).is_err());
    }

    #[test]
    fn never_panics_on_any_prefix() {
        let mut b = [0u8; 64];
        let mut x = 0x9e3779b97f4a7c15u64;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            for (i, v) in b.iter_mut().enumerate() {
                *v = (x >> (i % 8 * 8)) as u8 ^ i as u8;
            }
            let n = (x % 65) as usize;
            if let Ok(p) = RtpPacket::new_checked(&b[..n]) {
                let _ = (p.sequence(), p.ssrc(), p.timestamp());
            }
        }
    }
}
