//! The classic pcap file format (what tcpdump, tshark, Wireshark and scapy read): a 24-byte
//! file header, then per packet a 16-byte record header and the frame. vgate writes it for
//! `vgate capture-refused` with microsecond timestamps and link type Ethernet: each UDP
//! payload vgate received is put back behind the Ethernet, IPv4 and UDP headers it came with
//! (addresses and ports as received; MAC addresses zero, TTL 64, both checksums recomputed:
//! [`super::FrameEnds`], the one writer of vgate's headers).
//!
//! Only writes into a caller's buffer: the file is the caller's.

use std::net::SocketAddrV4;

use super::{FrameEnds, UdpChecksum, UDP4_FRAME_HEADERS};

/// `LINKTYPE_ETHERNET`.
pub const LINKTYPE_ETHERNET: u32 = 1;
/// The file header's length.
pub const FILE_HEADER_LEN: usize = 24;
/// A record header's length.
pub const RECORD_HEADER_LEN: usize = 16;
/// The longest UDP payload an IPv4 datagram holds.
pub const MAX_UDP4_PAYLOAD: usize = 65_535 - 20 - 8;

/// The file header (little-endian, microsecond timestamps, version 2.4) for frames of at
/// most `snaplen` bytes.
pub fn file_header(snaplen: u32) -> [u8; FILE_HEADER_LEN] {
    let mut h = [0u8; FILE_HEADER_LEN];
    h[0..4].copy_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    h[4..6].copy_from_slice(&2u16.to_le_bytes());
    h[6..8].copy_from_slice(&4u16.to_le_bytes());
    // thiszone, sigfigs: 0.
    h[16..20].copy_from_slice(&snaplen.to_le_bytes());
    h[20..24].copy_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
    h
}

/// The snap length of a file of UDP payloads up to `max_payload` bytes.
pub fn snaplen(max_payload: usize) -> u32 {
    (max_payload.min(MAX_UDP4_PAYLOAD) + UDP4_FRAME_HEADERS) as u32
}

/// Appends one record to `out`: the datagram `src` → `dst` received at `unix_us`
/// (microseconds since the Unix epoch) whose UDP payload was `orig_len` bytes, of which
/// `payload` (its first bytes) was kept. A cut payload keeps its original lengths in the
/// headers and goes without a UDP checksum (0: none), which could not be computed.
pub fn record(
    out: &mut Vec<u8>,
    unix_us: u64,
    src: SocketAddrV4,
    dst: SocketAddrV4,
    ident: u16,
    payload: &[u8],
    orig_len: usize,
) {
    let payload = &payload[..payload.len().min(MAX_UDP4_PAYLOAD)];
    let orig_len = orig_len.clamp(payload.len(), MAX_UDP4_PAYLOAD);
    let incl = UDP4_FRAME_HEADERS + payload.len();
    let mut h = [0u8; RECORD_HEADER_LEN];
    h[0..4].copy_from_slice(&((unix_us / 1_000_000) as u32).to_le_bytes());
    h[4..8].copy_from_slice(&((unix_us % 1_000_000) as u32).to_le_bytes());
    h[8..12].copy_from_slice(&(incl as u32).to_le_bytes());
    h[12..16].copy_from_slice(&((UDP4_FRAME_HEADERS + orig_len) as u32).to_le_bytes());
    out.extend_from_slice(&h);
    let ends = FrameEnds {
        dst_mac: [0; 6],
        src_mac: [0; 6],
        src,
        dst,
    };
    let mut frame = [0u8; UDP4_FRAME_HEADERS];
    if orig_len == payload.len() {
        ends.write(&mut frame, ident, UdpChecksum::Full(payload));
    } else {
        ends.write(&mut frame, ident, UdpChecksum::Offload(orig_len));
        frame[40..42].copy_from_slice(&[0, 0]);
    }
    out.extend_from_slice(&frame);
    out.extend_from_slice(payload);
}

/// One record read back by [`records`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    pub unix_us: u64,
    /// The frame as stored, and the length it had on the wire.
    pub frame: &'a [u8],
    pub orig_len: usize,
}

/// Reads a little-endian microsecond pcap file of Ethernet frames (what [`file_header`]
/// starts): its records, or what is wrong with it.
pub fn records(file: &[u8]) -> Result<Vec<Record<'_>>, String> {
    let le32 = |b: &[u8], at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    if file.len() < FILE_HEADER_LEN || le32(file, 0) != 0xa1b2_c3d4 {
        return Err("not a little-endian microsecond pcap file".into());
    }
    if le32(file, 20) != LINKTYPE_ETHERNET {
        return Err(format!("link type {} is not Ethernet", le32(file, 20)));
    }
    let mut out = Vec::new();
    let mut at = FILE_HEADER_LEN;
    while at < file.len() {
        if file.len() - at < RECORD_HEADER_LEN {
            return Err(format!("record header cut at byte {at}"));
        }
        let incl = le32(file, at + 8) as usize;
        let start = at + RECORD_HEADER_LEN;
        if file.len() - start < incl {
            return Err(format!("record at byte {at} cut: {incl} bytes announced"));
        }
        out.push(Record {
            unix_us: u64::from(le32(file, at)) * 1_000_000 + u64::from(le32(file, at + 4)),
            frame: &file[start..start + incl],
            orig_len: le32(file, at + 12) as usize,
        });
        at = start + incl;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::parse_udp4;

    #[test]
    fn written_records_read_back_as_the_datagrams_received() {
        let src: SocketAddrV4 = "10.1.0.9:5004".parse().unwrap();
        let dst: SocketAddrV4 = "10.1.0.1:20000".parse().unwrap();
        let mut f = file_header(snaplen(1472)).to_vec();
        let a: Vec<u8> = (0..=255u8).cycle().take(1316).collect();
        record(&mut f, 1_700_000_000_123_456, src, dst, 1, &a, a.len());
        record(&mut f, 1_700_000_001_000_001, src, dst, 2, &a[..100], 1316);
        let r = records(&f).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].unix_us, 1_700_000_000_123_456);
        let d = parse_udp4(r[0].frame).unwrap();
        assert_eq!((d.src_addr, d.src_port), (*src.ip(), src.port()));
        assert_eq!((d.dst_addr, d.dst_port), (*dst.ip(), dst.port()));
        assert_eq!(d.payload, &a[..]);
        assert!(d.checksums_ok(false), "IPv4 and UDP checksums right");
        assert_eq!(r[0].orig_len, r[0].frame.len());
        // A cut packet: its frame is shorter than its headers say, the wire length is kept.
        assert_eq!(r[1].frame.len(), UDP4_FRAME_HEADERS + 100);
        assert_eq!(r[1].orig_len, UDP4_FRAME_HEADERS + 1316);
        assert_eq!(&r[1].frame[40..42], &[0, 0], "no UDP checksum");
        assert!(records(&f[..f.len() - 1]).is_err());
        assert!(records(b"nonsense").is_err());
    }
}
