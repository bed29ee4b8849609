//! Walking the ring's slots: V3 blocks (descriptor + `tpacket3_hdr` chain) and V2 frames,
//! bounds-checked so a corrupt slot ends the walk instead of panicking.

use super::sys;
use super::RingVersion;

pub(super) mod bd {
    //! Offsets inside `tpacket_block_desc` (all native-endian).
    use std::mem::offset_of;
    const H: usize = offset_of!(libc::tpacket_block_desc, hdr);
    pub const BLOCK_STATUS: usize = H + offset_of!(libc::tpacket_hdr_v1, block_status);
    pub const NUM_PKTS: usize = H + offset_of!(libc::tpacket_hdr_v1, num_pkts);
    pub const FIRST_PKT: usize = H + offset_of!(libc::tpacket_hdr_v1, offset_to_first_pkt);
    pub const SEQ_NUM: usize = H + offset_of!(libc::tpacket_hdr_v1, seq_num);
}

pub(super) mod ph {
    //! Offsets inside `tpacket3_hdr` (all native-endian).
    use libc::tpacket3_hdr as H;
    use std::mem::{offset_of, size_of};
    pub const NEXT_OFFSET: usize = offset_of!(H, tp_next_offset);
    pub const SEC: usize = offset_of!(H, tp_sec);
    pub const NSEC: usize = offset_of!(H, tp_nsec);
    pub const SNAPLEN: usize = offset_of!(H, tp_snaplen);
    pub const LEN: usize = offset_of!(H, tp_len);
    pub const STATUS: usize = offset_of!(H, tp_status);
    pub const MAC: usize = offset_of!(H, tp_mac);
    pub const RXHASH: usize =
        offset_of!(H, hv1) + offset_of!(libc::tpacket_hdr_variant1, tp_rxhash);
    pub const VLAN_TCI: usize =
        offset_of!(H, hv1) + offset_of!(libc::tpacket_hdr_variant1, tp_vlan_tci);
    pub const SIZE: usize = size_of::<H>();
}

pub(super) fn ne_u32(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at.checked_add(4)?)?;
    Some(u32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
}

pub(super) fn ne_u16(b: &[u8], at: usize) -> Option<u16> {
    let s = b.get(at..at.checked_add(2)?)?;
    Some(u16::from_ne_bytes([s[0], s[1]]))
}

/// A filled block (V2: one frame) owned by user space. Hands it back to the kernel on drop.
///
/// The block's offsets come from memory shared with the kernel; they are bounds-checked
/// while iterating, so a corrupt block ends the iteration instead of panicking.
pub struct Block<'r> {
    raw: sys::RawBlock<'r>,
    version: RingVersion,
}

impl<'r> Block<'r> {
    pub(super) fn new(raw: sys::RawBlock<'r>, version: RingVersion) -> Self {
        Block { raw, version }
    }

    /// Number of packets the kernel put in the block (V2: 1).
    pub fn num_packets(&self) -> u32 {
        match self.version {
            RingVersion::V3 => ne_u32(self.raw.bytes(), bd::NUM_PKTS).unwrap_or(0),
            RingVersion::V2 => 1,
        }
    }

    /// The block's sequence number (increments by one per block the kernel closes; V2: 0).
    pub fn seq_num(&self) -> u64 {
        if self.version == RingVersion::V2 {
            return 0;
        }
        self.raw
            .bytes()
            .get(bd::SEQ_NUM..bd::SEQ_NUM + 8)
            .and_then(|s| s.try_into().ok())
            .map_or(0, u64::from_ne_bytes)
    }

    /// True if the kernel closed the block because of the timeout rather than because it
    /// was full.
    pub fn timed_out(&self) -> bool {
        self.version == RingVersion::V3
            && ne_u32(self.raw.bytes(), bd::BLOCK_STATUS).unwrap_or(0) & libc::TP_STATUS_BLK_TMO
                != 0
    }

    /// The frames of the block, in arrival order.
    pub fn frames(&self) -> Frames<'_> {
        Frames::of_slot(self.raw.bytes(), self.version)
    }
}

/// Consecutive filled blocks owned by user space (see [`PacketRing::try_blocks`]); all go
/// back to the kernel on drop.
pub struct Blocks<'r> {
    pub(super) raw: sys::RawRun<'r>,
    pub(super) version: RingVersion,
}

impl Blocks<'_> {
    pub fn len(&self) -> usize {
        self.raw.len()
    }

    pub fn is_empty(&self) -> bool {
        self.raw.len() == 0
    }

    /// The frames of block `k` (`k < len()`), in arrival order.
    pub fn frames(&self, k: usize) -> Frames<'_> {
        Frames::of_slot(self.raw.bytes(k), self.version)
    }

    /// The frames of every block, writable, block by block in ring order.
    pub fn frames_mut(&mut self) -> impl Iterator<Item = FramesMut<'_>> + '_ {
        let version = self.version;
        self.raw
            .bytes_mut()
            .map(move |b| FramesMut::of_slot(b, version))
    }
}

impl std::fmt::Debug for Block<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Block")
            .field("seq_num", &self.seq_num())
            .field("num_packets", &self.num_packets())
            .finish()
    }
}

/// Iterator over the frames of a [`Block`].
#[derive(Debug, Clone)]
pub struct Frames<'b> {
    pub(super) block: &'b [u8],
    pub(super) pos: usize,
    pub(super) left: u32,
    pub(super) version: RingVersion,
}

impl<'b> Iterator for Frames<'b> {
    type Item = Frame<'b>;

    fn next(&mut self) -> Option<Frame<'b>> {
        if self.left == 0 {
            return None;
        }
        let frame = match self.version {
            RingVersion::V3 => self.parse_at(self.pos),
            RingVersion::V2 => parse_v2(self.block).map(|f| (f, 0)),
        };
        match frame {
            Some((f, next)) => {
                self.left -= 1;
                if next == 0 && self.left > 0 {
                    self.left = 0; // corrupt chain: stop rather than loop
                }
                self.pos += next as usize;
                Some(f)
            }
            None => {
                self.left = 0;
                None
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.left as usize))
    }
}

impl<'b> Frames<'b> {
    /// The frames of a whole slot: a V3 block (descriptor included) or one V2 frame.
    pub(super) fn of_slot(b: &'b [u8], version: RingVersion) -> Frames<'b> {
        match version {
            RingVersion::V3 => Frames {
                block: b,
                pos: ne_u32(b, bd::FIRST_PKT).unwrap_or(0) as usize,
                left: ne_u32(b, bd::NUM_PKTS).unwrap_or(0),
                version,
            },
            RingVersion::V2 => Frames {
                block: b,
                pos: 0,
                left: 1,
                version,
            },
        }
    }

    /// Parse the `tpacket3_hdr` at `pos`; `None` if any part lies outside the block.
    fn parse_at(&self, pos: usize) -> Option<(Frame<'b>, u32)> {
        let b = self.block;
        let hdr = b.get(pos..pos.checked_add(ph::SIZE)?)?;
        let snaplen = ne_u32(hdr, ph::SNAPLEN)? as usize;
        let mac = usize::from(ne_u16(hdr, ph::MAC)?);
        let start = pos.checked_add(mac)?;
        let data = b.get(start..start.checked_add(snaplen)?)?;
        let status = ne_u32(hdr, ph::STATUS)?;
        let vlan_tci = if status & libc::TP_STATUS_VLAN_VALID != 0 {
            Some(ne_u32(hdr, ph::VLAN_TCI)? as u16)
        } else {
            None
        };
        let frame = Frame {
            data,
            wire_len: ne_u32(hdr, ph::LEN)?,
            status,
            vlan_tci,
            rxhash: ne_u32(hdr, ph::RXHASH)?,
            sec: ne_u32(hdr, ph::SEC)?,
            nsec: ne_u32(hdr, ph::NSEC)?,
        };
        Some((frame, ne_u32(hdr, ph::NEXT_OFFSET)?))
    }
}

/// [`Frames`] over a writable slot: each frame's bytes are handed out writable and
/// disjoint from every other frame's. A V3 chain only moves forward (each header after the
/// previous frame's bytes); one that goes back ends the walk, as a corrupt chain does.
#[derive(Debug)]
pub struct FramesMut<'b> {
    /// The slot from `base` on (what no frame handed out covers).
    rest: &'b mut [u8],
    base: usize,
    /// The walk, as in [`Frames`]: the next header's position in the slot, frames left.
    pos: usize,
    left: u32,
    version: RingVersion,
}

impl<'b> FramesMut<'b> {
    pub(super) fn of_slot(b: &'b mut [u8], version: RingVersion) -> FramesMut<'b> {
        let Frames { pos, left, .. } = Frames::of_slot(b, version);
        FramesMut {
            rest: b,
            base: 0,
            pos,
            left,
            version,
        }
    }
}

impl<'b> Iterator for FramesMut<'b> {
    type Item = FrameMut<'b>;

    fn next(&mut self) -> Option<FrameMut<'b>> {
        if self.left == 0 {
            return None;
        }
        let rest = std::mem::take(&mut self.rest);
        // One step of the read-only walk over what is left, at positions relative to it.
        let mut walk = Frames {
            block: &*rest,
            pos: self.pos - self.base,
            left: self.left,
            version: self.version,
        };
        let Some(f) = walk.next() else {
            self.left = 0;
            return None;
        };
        let start = f.data.as_ptr() as usize - rest.as_ptr() as usize;
        let (len, wire_len, status) = (f.data.len(), f.wire_len, f.status);
        let (next, left) = (self.base + walk.pos, walk.left);
        let (_, tail) = rest.split_at_mut(start);
        let (data, after) = tail.split_at_mut(len);
        self.base += start + len;
        self.rest = after;
        self.left = if next < self.base { 0 } else { left };
        self.pos = next;
        Some(FrameMut {
            data,
            wire_len,
            status,
        })
    }
}

/// One captured frame, writable (see [`FramesMut`]): its bytes and the ring metadata the
/// data path reads.
#[derive(Debug)]
pub struct FrameMut<'b> {
    /// As [`Frame::data`].
    pub data: &'b mut [u8],
    pub wire_len: u32,
    /// `tp_status` flags (`TP_STATUS_*`).
    pub status: u32,
}

impl FrameMut<'_> {
    /// True if the capture holds fewer bytes than the frame had on the wire.
    pub fn truncated(&self) -> bool {
        (self.data.len() as u64) < u64::from(self.wire_len)
    }
}

pub(super) mod ph2 {
    //! Offsets inside `tpacket2_hdr` (all native-endian).
    use libc::tpacket2_hdr as H;
    use std::mem::{offset_of, size_of};
    pub const STATUS: usize = offset_of!(H, tp_status);
    pub const LEN: usize = offset_of!(H, tp_len);
    pub const SNAPLEN: usize = offset_of!(H, tp_snaplen);
    pub const MAC: usize = offset_of!(H, tp_mac);
    pub const SEC: usize = offset_of!(H, tp_sec);
    pub const NSEC: usize = offset_of!(H, tp_nsec);
    pub const VLAN_TCI: usize = offset_of!(H, tp_vlan_tci);
    pub const SIZE: usize = size_of::<H>();
}

/// Parses the V2 frame slot `b` (`tpacket2_hdr` first); `None` if any part lies outside it.
fn parse_v2(b: &[u8]) -> Option<Frame<'_>> {
    let hdr = b.get(..ph2::SIZE)?;
    let snaplen = ne_u32(hdr, ph2::SNAPLEN)? as usize;
    let mac = usize::from(ne_u16(hdr, ph2::MAC)?);
    let data = b.get(mac..mac.checked_add(snaplen)?)?;
    let status = ne_u32(hdr, ph2::STATUS)?;
    let vlan_tci = if status & libc::TP_STATUS_VLAN_VALID != 0 {
        Some(ne_u16(hdr, ph2::VLAN_TCI)?)
    } else {
        None
    };
    Some(Frame {
        data,
        wire_len: ne_u32(hdr, ph2::LEN)?,
        status,
        vlan_tci,
        rxhash: 0,
        sec: ne_u32(hdr, ph2::SEC)?,
        nsec: ne_u32(hdr, ph2::NSEC)?,
    })
}

/// One captured frame and its ring metadata.
#[derive(Debug, Clone, Copy)]
pub struct Frame<'b> {
    /// The captured bytes from the Ethernet header on (`tp_mac`, `tp_snaplen`). A VLAN tag
    /// stripped by the NIC/driver is not in here: see [`Frame::vlan_tci`].
    pub data: &'b [u8],
    /// Length on the wire; more than `data.len()` if the capture was truncated.
    pub wire_len: u32,
    /// `tp_status` flags (`TP_STATUS_*`).
    pub status: u32,
    /// The VLAN TCI the kernel stripped into metadata (`TP_STATUS_VLAN_VALID`).
    pub vlan_tci: Option<u16>,
    /// The kernel's flow hash of the packet (`tp_rxhash`), 0 if none was computed (always
    /// 0 on a V2 ring, which has no such field).
    pub rxhash: u32,
    pub sec: u32,
    pub nsec: u32,
}

impl Frame<'_> {
    /// `TP_STATUS_LOSING`: the ring dropped packets since the statistics were last read.
    pub fn losing(&self) -> bool {
        self.status & libc::TP_STATUS_LOSING != 0
    }

    /// `TP_STATUS_CSUMNOTREADY`: a local sender's offloaded checksum is not filled in yet;
    /// do not verify the UDP checksum of this frame.
    pub fn csum_not_ready(&self) -> bool {
        self.status & libc::TP_STATUS_CSUMNOTREADY != 0
    }

    /// True if the capture holds fewer bytes than the frame had on the wire.
    pub fn truncated(&self) -> bool {
        (self.data.len() as u64) < u64::from(self.wire_len)
    }
}
