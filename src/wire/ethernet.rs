//! Ethernet II frame view, with at most one 802.1Q VLAN tag.
//!
//! On a TPACKET ring the kernel usually strips the tag into the ring metadata
//! (`TP_STATUS_VLAN_VALID`); a tag still in the bytes (no offload) is handled here.

use super::WireError;

/// An Ethernet type (the EtherType field after at most one VLAN tag).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EtherType(pub u16);

impl EtherType {
    pub const IPV4: EtherType = EtherType(0x0800);
    pub const ARP: EtherType = EtherType(0x0806);
    pub const VLAN: EtherType = EtherType(0x8100);
    pub const IPV6: EtherType = EtherType(0x86dd);
}

mod field {
    use std::ops::Range;
    pub const DST: Range<usize> = 0..6;
    pub const SRC: Range<usize> = 6..12;
    pub const ETHERTYPE: Range<usize> = 12..14;
    pub const HEADER_LEN: usize = 14;
    /// With a tag: TCI after the 0x8100 TPID, then the inner EtherType.
    pub const VLAN_TCI: Range<usize> = 14..16;
    pub const VLAN_ETHERTYPE: Range<usize> = 16..18;
    pub const VLAN_HEADER_LEN: usize = 18;
}

/// A read view of an Ethernet frame. After [`EthernetFrame::new_checked`] no accessor panics.
#[derive(Debug, Clone)]
pub struct EthernetFrame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    /// Wrap without checking. Accessors may panic unless [`Self::check_len`] passes.
    pub const fn new_unchecked(buffer: T) -> Self {
        EthernetFrame { buffer }
    }

    /// Wrap and validate: the header (and the VLAN tag, if the frame has one) is present.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let f = Self::new_unchecked(buffer);
        f.check_len()?;
        Ok(f)
    }

    /// `Truncated` if the buffer is shorter than the header it announces.
    pub fn check_len(&self) -> Result<(), WireError> {
        let b = self.buffer.as_ref();
        if b.len() < field::HEADER_LEN {
            return Err(WireError::Truncated);
        }
        if self.is_tagged() && b.len() < field::VLAN_HEADER_LEN {
            return Err(WireError::Truncated);
        }
        Ok(())
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn outer_type(&self) -> u16 {
        let b = &self.buffer.as_ref()[field::ETHERTYPE];
        u16::from_be_bytes([b[0], b[1]])
    }

    fn is_tagged(&self) -> bool {
        self.outer_type() == EtherType::VLAN.0
    }

    pub fn dst_addr(&self) -> [u8; 6] {
        let mut a = [0; 6];
        a.copy_from_slice(&self.buffer.as_ref()[field::DST]);
        a
    }

    pub fn src_addr(&self) -> [u8; 6] {
        let mut a = [0; 6];
        a.copy_from_slice(&self.buffer.as_ref()[field::SRC]);
        a
    }

    /// The 802.1Q tag control information, if the frame carries a tag.
    pub fn vlan_tci(&self) -> Option<u16> {
        if self.is_tagged() {
            let b = &self.buffer.as_ref()[field::VLAN_TCI];
            Some(u16::from_be_bytes([b[0], b[1]]))
        } else {
            None
        }
    }

    /// The 12-bit VLAN id, if the frame carries a tag.
    pub fn vlan_id(&self) -> Option<u16> {
        self.vlan_tci().map(|tci| tci & 0x0fff)
    }

    /// The EtherType of the payload (the inner one for a tagged frame).
    pub fn ethertype(&self) -> EtherType {
        if self.is_tagged() {
            let b = &self.buffer.as_ref()[field::VLAN_ETHERTYPE];
            EtherType(u16::from_be_bytes([b[0], b[1]]))
        } else {
            EtherType(self.outer_type())
        }
    }

    /// 14, or 18 with a VLAN tag.
    pub fn header_len(&self) -> usize {
        if self.is_tagged() {
            field::VLAN_HEADER_LEN
        } else {
            field::HEADER_LEN
        }
    }

    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }
}

impl<'a> EthernetFrame<&'a [u8]> {
    /// The payload with the buffer's lifetime (not tied to the view).
    pub fn into_payload(self) -> &'a [u8] {
        let start = self.header_len();
        &self.buffer[start..]
    }
}

/// Formats a MAC as `aa:bb:cc:dd:ee:ff`.
pub fn mac_string(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut out = [0u8; 6];
    let mut parts = s.split(':');
    for b in out.iter_mut() {
        let p = parts.next()?;
        if p.len() != 2 {
            return None;
        }
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untagged() {
        let mut f = [0u8; 20];
        f[..6].copy_from_slice(&[1, 2, 3, 4, 5, 6]);
        f[6..12].copy_from_slice(&[7, 8, 9, 10, 11, 12]);
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        let e = EthernetFrame::new_checked(&f[..]).unwrap();
        assert_eq!(e.dst_addr(), [1, 2, 3, 4, 5, 6]);
        assert_eq!(e.src_addr(), [7, 8, 9, 10, 11, 12]);
        assert_eq!(e.ethertype(), EtherType::IPV4);
        assert_eq!(e.vlan_id(), None);
        assert_eq!(e.payload().len(), 6);
    }

    #[test]
    fn tagged_needs_18_bytes() {
        let mut f = [0u8; 18];
        f[12..14].copy_from_slice(&[0x81, 0x00]);
        f[14..16].copy_from_slice(&[0xa0, 0x2a]); // PCP 5, VID 42
        f[16..18].copy_from_slice(&[0x08, 0x06]);
        let e = EthernetFrame::new_checked(&f[..]).unwrap();
        assert_eq!(e.vlan_id(), Some(42));
        assert_eq!(e.vlan_tci(), Some(0xa02a));
        assert_eq!(e.ethertype(), EtherType::ARP);
        assert!(e.payload().is_empty());
        assert_eq!(
            EthernetFrame::new_checked(&f[..17]).unwrap_err(),
            WireError::Truncated
        );
        assert_eq!(
            EthernetFrame::new_checked(&f[..13]).unwrap_err(),
            WireError::Truncated
        );
    }

    #[test]
    fn macs() {
        let m = parse_mac("02:00:0a:FF:00:01").unwrap();
        assert_eq!(mac_string(&m), "02:00:0a:ff:00:01");
        for bad in [
            "",
            "02:00:0a:ff:00",
            "02:00:0a:ff:00:01:02",
            "2:00:0a:ff:00:01",
            "zz:00:0a:ff:00:01",
        ] {
            assert!(parse_mac(bad).is_none(), "{bad}");
        }
    }
}
