//! UDP header view: ports, length against the buffer, payload, checksum.

use super::{checksum, WireError};
use std::net::Ipv4Addr;

mod field {
    use std::ops::Range;
    pub const SRC_PORT: Range<usize> = 0..2;
    pub const DST_PORT: Range<usize> = 2..4;
    pub const LENGTH: Range<usize> = 4..6;
    pub const CHECKSUM: Range<usize> = 6..8;
    pub const HEADER_LEN: usize = 8;
}

/// A view of a UDP datagram. After [`UdpPacket::new_checked`]:
/// `8 <= len() <= buffer.len()`, so no accessor panics.
#[derive(Debug, Clone)]
pub struct UdpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> UdpPacket<T> {
    /// Wrap without checking. Accessors may panic unless [`Self::check_len`] passes.
    pub const fn new_unchecked(buffer: T) -> Self {
        UdpPacket { buffer }
    }

    /// Wrap and validate the header and the length field.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// `Truncated` if the header or the length field reach past the buffer, `BadLength`
    /// if the length field is below 8.
    pub fn check_len(&self) -> Result<(), WireError> {
        let b = self.buffer.as_ref();
        if b.len() < field::HEADER_LEN {
            return Err(WireError::Truncated);
        }
        let len = self.len();
        if len < field::HEADER_LEN {
            return Err(WireError::BadLength);
        }
        if len > b.len() {
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

    pub fn src_port(&self) -> u16 {
        self.u16_at(field::SRC_PORT)
    }

    pub fn dst_port(&self) -> u16 {
        self.u16_at(field::DST_PORT)
    }

    /// The UDP length field: header plus payload, in bytes.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        usize::from(self.u16_at(field::LENGTH))
    }

    pub fn checksum(&self) -> u16 {
        self.u16_at(field::CHECKSUM)
    }

    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[field::HEADER_LEN..self.len()]
    }

    fn pseudo_sum(&self, src: Ipv4Addr, dst: Ipv4Addr) -> u32 {
        pseudo_sum(src, dst, self.len() as u16)
    }

    /// True if the checksum is correct or absent (zero means "not computed" over IPv4).
    ///
    /// On a capture ring, `TP_STATUS_CSUMNOTREADY` marks packets whose checksum was never
    /// filled in (offloaded by a local sender); do not verify those.
    pub fn verify_checksum(&self, src: Ipv4Addr, dst: Ipv4Addr) -> bool {
        if self.checksum() == 0 {
            return true;
        }
        let data = &self.buffer.as_ref()[..self.len()];
        checksum::finish(checksum::combine(
            self.pseudo_sum(src, dst),
            checksum::sum(data),
        )) == 0
    }
}

impl<'a> UdpPacket<&'a [u8]> {
    /// The payload with the buffer's lifetime (not tied to the view).
    pub fn into_payload(self) -> &'a [u8] {
        let end = self.len();
        &self.buffer[field::HEADER_LEN..end]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> UdpPacket<T> {
    pub fn set_src_port(&mut self, port: u16) {
        self.buffer.as_mut()[field::SRC_PORT].copy_from_slice(&port.to_be_bytes());
    }

    pub fn set_dst_port(&mut self, port: u16) {
        self.buffer.as_mut()[field::DST_PORT].copy_from_slice(&port.to_be_bytes());
    }

    pub fn set_checksum(&mut self, value: u16) {
        self.buffer.as_mut()[field::CHECKSUM].copy_from_slice(&value.to_be_bytes());
    }

    /// Compute and store the checksum over the pseudo-header, header and payload.
    pub fn fill_checksum(&mut self, src: Ipv4Addr, dst: Ipv4Addr) {
        self.set_checksum(0);
        let data = &self.buffer.as_ref()[..self.len()];
        let c = checksum::finish(checksum::combine(
            self.pseudo_sum(src, dst),
            checksum::sum(data),
        ));
        // A computed zero is sent as all ones (RFC 768).
        self.set_checksum(if c == 0 { 0xffff } else { c });
    }
}

/// The one's-complement sum of the IPv4 pseudo-header of a UDP datagram of `udp_len` bytes
/// (RFC 768), not folded.
pub(crate) fn pseudo_sum(src: Ipv4Addr, dst: Ipv4Addr, udp_len: u16) -> u32 {
    let mut ph = [0u8; 12];
    ph[..4].copy_from_slice(&src.octets());
    ph[4..8].copy_from_slice(&dst.octets());
    ph[9] = super::ipv4::PROTO_UDP;
    ph[10..12].copy_from_slice(&udp_len.to_be_bytes());
    checksum::sum(&ph)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_and_lengths() {
        let mut b = [0u8; 12];
        b[..2].copy_from_slice(&5004u16.to_be_bytes());
        b[2..4].copy_from_slice(&20000u16.to_be_bytes());
        b[4..6].copy_from_slice(&11u16.to_be_bytes());
        let p = UdpPacket::new_checked(&b[..]).unwrap();
        assert_eq!((p.src_port(), p.dst_port(), p.len()), (5004, 20000, 11));
        assert_eq!(p.payload().len(), 3);
        assert_eq!(
            UdpPacket::new_checked(&b[..10]).unwrap_err(),
            WireError::Truncated
        );
        assert_eq!(
            UdpPacket::new_checked(&b[..7]).unwrap_err(),
            WireError::Truncated
        );
        b[4..6].copy_from_slice(&7u16.to_be_bytes());
        assert_eq!(
            UdpPacket::new_checked(&b[..]).unwrap_err(),
            WireError::BadLength
        );
    }

    #[test]
    fn checksum_roundtrip() {
        let (s, d) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        let mut b = [0u8; 8 + 5];
        b[4..6].copy_from_slice(&13u16.to_be_bytes());
        b[8..].copy_from_slice(b"hello");
        let mut p = UdpPacket::new_unchecked(&mut b[..]);
        p.set_src_port(1234);
        p.set_dst_port(5678);
        p.fill_checksum(s, d);
        assert!(p.verify_checksum(s, d));
        assert!(!p.verify_checksum(s, Ipv4Addr::new(10, 0, 0, 3)));
        p.set_checksum(0);
        assert!(p.verify_checksum(s, Ipv4Addr::new(10, 0, 0, 3)));
    }
}
