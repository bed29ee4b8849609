//! IPv4 header view: version/IHL checks, total length against the buffer, fragment
//! detection, addresses, protocol and the header checksum.

use super::{checksum, WireError};
use std::net::Ipv4Addr;

/// IP protocol number of UDP.
pub const PROTO_UDP: u8 = 17;

mod field {
    use std::ops::Range;
    pub const VER_IHL: usize = 0;
    pub const TOTAL_LEN: Range<usize> = 2..4;
    pub const IDENT: Range<usize> = 4..6;
    pub const FLAGS_FRAG: Range<usize> = 6..8;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: Range<usize> = 10..12;
    pub const SRC: Range<usize> = 12..16;
    pub const DST: Range<usize> = 16..20;
    pub const MIN_HEADER_LEN: usize = 20;
}

const FLAG_DF: u16 = 0x4000;
const FLAG_MF: u16 = 0x2000;
const FRAG_OFFSET_MASK: u16 = 0x1fff;

/// A view of an IPv4 packet. After [`Ipv4Packet::new_checked`]:
/// `20 <= header_len() <= total_len() <= buffer.len()`, so no accessor panics.
#[derive(Debug, Clone)]
pub struct Ipv4Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    /// Wrap without checking. Accessors may panic unless [`Self::check_len`] passes.
    pub const fn new_unchecked(buffer: T) -> Self {
        Ipv4Packet { buffer }
    }

    /// Wrap and validate version, IHL and total length.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// - `Truncated`: fewer than 20 bytes, or the header or total length is past the buffer;
    /// - `NotIpv4`: version is not 4;
    /// - `BadLength`: IHL < 5 or total length < header length.
    pub fn check_len(&self) -> Result<(), WireError> {
        let b = self.buffer.as_ref();
        if b.len() < field::MIN_HEADER_LEN {
            return Err(WireError::Truncated);
        }
        if self.version() != 4 {
            return Err(WireError::NotIpv4);
        }
        let hl = self.header_len();
        let tl = self.total_len();
        if hl < field::MIN_HEADER_LEN || tl < hl {
            return Err(WireError::BadLength);
        }
        if tl > b.len() {
            return Err(WireError::Truncated);
        }
        Ok(())
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn u16_at(&self, r: std::ops::Range<usize>) -> u16 {
        let b = &self.buffer.as_ref()[r];
        u16::from_be_bytes([b[0], b[1]])
    }

    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VER_IHL] >> 4
    }

    /// Header length in bytes (IHL × 4).
    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[field::VER_IHL] & 0x0f) * 4
    }

    pub fn total_len(&self) -> usize {
        usize::from(self.u16_at(field::TOTAL_LEN))
    }

    pub fn ident(&self) -> u16 {
        self.u16_at(field::IDENT)
    }

    pub fn dont_frag(&self) -> bool {
        self.u16_at(field::FLAGS_FRAG) & FLAG_DF != 0
    }

    pub fn more_frags(&self) -> bool {
        self.u16_at(field::FLAGS_FRAG) & FLAG_MF != 0
    }

    /// Fragment offset in bytes.
    pub fn frag_offset(&self) -> u16 {
        (self.u16_at(field::FLAGS_FRAG) & FRAG_OFFSET_MASK) << 3
    }

    /// True for any fragment: more-fragments set or a non-zero offset.
    pub fn is_fragment(&self) -> bool {
        self.u16_at(field::FLAGS_FRAG) & (FLAG_MF | FRAG_OFFSET_MASK) != 0
    }

    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[field::TTL]
    }

    pub fn protocol(&self) -> u8 {
        self.buffer.as_ref()[field::PROTOCOL]
    }

    pub fn checksum(&self) -> u16 {
        self.u16_at(field::CHECKSUM)
    }

    pub fn src_addr(&self) -> Ipv4Addr {
        let b = &self.buffer.as_ref()[field::SRC];
        Ipv4Addr::new(b[0], b[1], b[2], b[3])
    }

    pub fn dst_addr(&self) -> Ipv4Addr {
        let b = &self.buffer.as_ref()[field::DST];
        Ipv4Addr::new(b[0], b[1], b[2], b[3])
    }

    /// Header options (empty for IHL 5).
    pub fn options(&self) -> &[u8] {
        &self.buffer.as_ref()[field::MIN_HEADER_LEN..self.header_len()]
    }

    /// The checksum the header should carry (computed with the checksum field as zero).
    pub fn compute_checksum(&self) -> u16 {
        let h = &self.buffer.as_ref()[..self.header_len()];
        let stored = u32::from(self.checksum());
        // Sum of the header minus the stored checksum word: add its complement.
        checksum::finish(checksum::combine(checksum::sum(h), !stored & 0xffff))
    }

    /// True if the header checksum is correct.
    pub fn verify_checksum(&self) -> bool {
        checksum::finish(checksum::sum(&self.buffer.as_ref()[..self.header_len()])) == 0
    }

    /// Bytes after the header up to the total length (link-layer padding excluded).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..self.total_len()]
    }
}

impl<'a> Ipv4Packet<&'a [u8]> {
    /// The payload with the buffer's lifetime (not tied to the view).
    pub fn into_payload(self) -> &'a [u8] {
        let (start, end) = (self.header_len(), self.total_len());
        &self.buffer[start..end]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    pub fn set_checksum(&mut self, value: u16) {
        self.buffer.as_mut()[field::CHECKSUM].copy_from_slice(&value.to_be_bytes());
    }

    /// Compute and store the header checksum.
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let c = self.compute_checksum();
        self.set_checksum(c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 1071-style example header (from a real capture), checksum 0xb861.
    const HDR: [u8; 20] = [
        0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8, 0x00,
        0x01, 0xc0, 0xa8, 0x00, 0xc7,
    ];

    #[test]
    fn known_checksum() {
        let mut buf = HDR.to_vec();
        buf.resize(0x73, 0);
        let p = Ipv4Packet::new_checked(&buf[..]).unwrap();
        assert!(p.verify_checksum());
        assert_eq!(p.compute_checksum(), 0xb861);
        assert!(p.dont_frag() && !p.more_frags() && !p.is_fragment());
        assert_eq!(p.protocol(), PROTO_UDP);
        assert_eq!(p.src_addr(), Ipv4Addr::new(192, 168, 0, 1));
        assert_eq!(p.payload().len(), 0x73 - 20);
        let mut buf2 = buf.clone();
        buf2[10] = 0;
        buf2[11] = 0;
        let mut q = Ipv4Packet::new_unchecked(&mut buf2[..]);
        assert!(!q.verify_checksum());
        q.fill_checksum();
        assert_eq!(q.checksum(), 0xb861);
        buf[8] = 1; // TTL changed
        assert!(!Ipv4Packet::new_checked(&buf[..]).unwrap().verify_checksum());
    }

    #[test]
    fn length_checks() {
        let mut buf = HDR.to_vec();
        assert_eq!(
            Ipv4Packet::new_checked(&buf[..]).unwrap_err(),
            WireError::Truncated
        );
        buf[2..4].copy_from_slice(&20u16.to_be_bytes());
        assert!(Ipv4Packet::new_checked(&buf[..])
            .unwrap()
            .payload()
            .is_empty());
        buf[0] = 0x46; // IHL 6 > total 20
        assert_eq!(
            Ipv4Packet::new_checked(&buf[..]).unwrap_err(),
            WireError::BadLength
        );
        buf[2..4].copy_from_slice(&24u16.to_be_bytes());
        assert_eq!(
            Ipv4Packet::new_checked(&buf[..]).unwrap_err(),
            WireError::Truncated
        );
        buf.extend_from_slice(&[1, 2, 3, 4]);
        let p = Ipv4Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(p.options(), &[1, 2, 3, 4]);
        assert!(p.payload().is_empty());
    }

    #[test]
    fn fragments() {
        let mut buf = HDR.to_vec();
        buf[2..4].copy_from_slice(&20u16.to_be_bytes());
        buf[6..8].copy_from_slice(&0x2000u16.to_be_bytes());
        let p = Ipv4Packet::new_checked(&buf[..]).unwrap();
        assert!(p.is_fragment() && p.more_frags() && p.frag_offset() == 0);
        buf[6..8].copy_from_slice(&0x0003u16.to_be_bytes());
        let p = Ipv4Packet::new_checked(&buf[..]).unwrap();
        assert!(p.is_fragment() && !p.more_frags() && p.frag_offset() == 24);
    }
}
