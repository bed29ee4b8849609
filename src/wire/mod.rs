//! Zero-copy views over untrusted packet bytes: Ethernet (with one 802.1Q tag), IPv4, UDP and
//! RTP.
//!
//! Owns: the byte layout of the headers the media path reads, their length checks and the
//! IPv4 header checksum. Must not touch: sockets, rings, routes — it only reads (and for the
//! `set_*`/`fill_*` methods writes) the buffer it is given.
//!
//! Every view follows one rule, taken from smoltcp: `new_checked(buffer)` validates every
//! length the accessors rely on, once; after that no accessor can panic, whatever the
//! bytes are. `new_unchecked` exists for buffers the caller has already validated (or is
//! building) and is the only way to get a view that can panic.
//!
//! [`parse_udp4`] is the one-shot helper for the receive path: Ethernet → IPv4 → UDP, with
//! one [`WireError`] per drop reason. [`pcap`] writes (and reads back) the pcap files of
//! `vgate capture-refused`.

mod ethernet;
pub mod framing;
mod ipv4;
pub mod link;
pub mod pcap;
pub mod rtp;
mod udp;

pub use ethernet::{mac_string, parse_mac, EtherType, EthernetFrame};
pub use ipv4::{Ipv4Packet, PROTO_UDP};
pub use udp::UdpPacket;

use std::net::Ipv4Addr;

/// Why a buffer was rejected. Each variant is one drop reason with its own counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum WireError {
    /// A header, or a length field, reaches past the end of the buffer.
    #[error("packet truncated: a header or length field reaches past the captured bytes (raise the capture snaplen if this counter grows)")]
    Truncated,
    /// The Ethernet type (after at most one VLAN tag) is not IPv4, or the IP version is not 4.
    #[error("not an IPv4 packet")]
    NotIpv4,
    /// An IPv4 packet that is not UDP.
    #[error("not a UDP datagram")]
    NotUdp,
    /// An IPv4 fragment (MF set or a non-zero offset): media must not be fragmented.
    #[error("IPv4 fragment: lower the sender's packet size below the path MTU")]
    Fragment,
    /// A length field is inconsistent (IHL < 5, total length < header, UDP length < 8).
    #[error("inconsistent length field in an IPv4 or UDP header")]
    BadLength,
    /// Not an RTP version 2 packet (or an RTCP packet on a muxed port).
    #[error("not an RTP version 2 packet")]
    NotRtp,
}

/// The parts of an Ethernet/IPv4/UDP frame the forwarding path needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Udp4Datagram<'a> {
    /// 802.1Q VLAN id if the frame carried a tag in its bytes (tags stripped into ring
    /// metadata are reported by the ring, not here).
    pub vlan: Option<u16>,
    pub src_addr: Ipv4Addr,
    pub src_port: u16,
    pub dst_addr: Ipv4Addr,
    pub dst_port: u16,
    /// UDP payload, exactly as long as the UDP length field says (link padding removed).
    pub payload: &'a [u8],
    /// The IPv4 header (options included), for [`Udp4Datagram::checksums_ok`].
    pub ip_header: &'a [u8],
    /// The whole UDP datagram, header included.
    pub udp: &'a [u8],
    /// Where [`Udp4Datagram::payload`] starts in the parsed frame: an engine that owns the
    /// frame writable takes the payload as `&mut frame[payload_at..][..payload.len()]` to
    /// rewrite it in place (media strip, [`crate::channel::inspect_mut`]).
    pub payload_at: usize,
}

impl Udp4Datagram<'_> {
    /// Whether the IPv4 header checksum and (unless `skip_udp`) the UDP checksum are right.
    /// A capture ring sees frames before the kernel checks them; `skip_udp` is for frames
    /// the ring marks as already verified by the NIC or not yet filled in by a local sender.
    pub fn checksums_ok(&self, skip_udp: bool) -> bool {
        Ipv4Packet::new_unchecked(self.ip_header).verify_checksum()
            && (skip_udp
                || UdpPacket::new_unchecked(self.udp).verify_checksum(self.src_addr, self.dst_addr))
    }
}

/// Parse an Ethernet frame carrying an unfragmented IPv4/UDP datagram.
///
/// Checks lengths and structure only; it does not verify the IPv4 header checksum or the
/// UDP checksum (use [`Ipv4Packet::verify_checksum`] / [`UdpPacket::verify_checksum`]).
pub fn parse_udp4(frame: &[u8]) -> Result<Udp4Datagram<'_>, WireError> {
    let eth = EthernetFrame::new_checked(frame)?;
    if eth.ethertype() != EtherType::IPV4 {
        return Err(WireError::NotIpv4);
    }
    let vlan = eth.vlan_id();
    let eth_payload = eth.into_payload();
    let ip_at = frame.len() - eth_payload.len();
    let ip = Ipv4Packet::new_checked(eth_payload)?;
    if ip.is_fragment() {
        return Err(WireError::Fragment);
    }
    if ip.protocol() != ipv4::PROTO_UDP {
        return Err(WireError::NotUdp);
    }
    let (header_len, total_len) = (ip.header_len(), ip.total_len());
    let src_addr = ip.src_addr();
    let dst_addr = ip.dst_addr();
    let ip_bytes = ip.into_inner();
    let (ip_header, rest) = ip_bytes.split_at(header_len);
    let udp = UdpPacket::new_checked(&rest[..total_len - header_len])?;
    let udp_len = udp.len();
    Ok(Udp4Datagram {
        vlan,
        src_addr,
        src_port: udp.src_port(),
        dst_addr,
        dst_port: udp.dst_port(),
        payload: udp.into_payload(),
        ip_header,
        udp: &rest[..udp_len],
        payload_at: ip_at + header_len + 8,
    })
}

/// Internet checksum helpers (RFC 1071), shared by IPv4 and UDP.
pub(crate) mod checksum {
    /// Ones'-complement sum of `data` as big-endian 16-bit words, folded to 16 bits (returned
    /// as `u32` for [`combine`]).
    ///
    /// The sum does not depend on byte order except for one final swap (RFC 1071 §2(B)), so
    /// it adds native-endian 32-bit words into a `u64` (four bytes a step, no per-word swap;
    /// a datagram is far below the 2^32 words that could overflow it) and swaps once at the
    /// end. This is the per-packet checksum over the whole payload of the ring engines'
    /// transmit and receive checks.
    pub fn sum(data: &[u8]) -> u32 {
        let mut acc: u64 = 0;
        let mut chunks = data.chunks_exact(4);
        for w in &mut chunks {
            acc += u64::from(u32::from_ne_bytes([w[0], w[1], w[2], w[3]]));
        }
        // 0 to 3 bytes left: zero-padded in memory order, which is what big-endian 16-bit
        // words padded with a zero byte are.
        let rest = chunks.remainder();
        let mut tail = [0u8; 4];
        tail[..rest.len()].copy_from_slice(rest);
        acc += u64::from(u32::from_ne_bytes(tail));
        let mut s = fold64(acc);
        while s >> 16 != 0 {
            s = (s & 0xffff) + (s >> 16);
        }
        u32::from(u16::from_be(s as u16))
    }

    /// The plain reference: big-endian 16-bit words one at a time.
    #[cfg(test)]
    pub fn sum_reference(data: &[u8]) -> u32 {
        let mut acc: u64 = 0;
        let mut chunks = data.chunks_exact(2);
        for w in &mut chunks {
            acc += u64::from(u16::from_be_bytes([w[0], w[1]]));
        }
        if let [last] = chunks.remainder() {
            acc += u64::from(u16::from_be_bytes([*last, 0]));
        }
        fold64(acc)
    }

    fn fold64(mut acc: u64) -> u32 {
        while acc >> 32 != 0 {
            acc = (acc & 0xffff_ffff) + (acc >> 32);
        }
        acc as u32
    }

    /// Fold a 32-bit sum into 16 bits and complement it.
    pub fn finish(mut acc: u32) -> u16 {
        while acc >> 16 != 0 {
            acc = (acc & 0xffff) + (acc >> 16);
        }
        !(acc as u16)
    }

    pub fn combine(a: u32, b: u32) -> u32 {
        fold64(u64::from(a) + u64::from(b))
    }
}

/// Frame builders shared by unit tests.
#[cfg(test)]
pub(crate) mod testutil {
    use std::net::Ipv4Addr;

    /// Build Ethernet(+optional VLAN)/IPv4/UDP with valid checksums.
    pub fn udp4_frame(
        vlan: Option<u16>,
        src: (Ipv4Addr, u16),
        dst: (Ipv4Addr, u16),
        payload: &[u8],
    ) -> Vec<u8> {
        let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1];
        if let Some(id) = vlan {
            f.extend_from_slice(&[0x81, 0x00]);
            f.extend_from_slice(&(id & 0x0fff).to_be_bytes());
        }
        f.extend_from_slice(&[0x08, 0x00]);
        let ip_start = f.len();
        let total = (20 + 8 + payload.len()) as u16;
        f.extend_from_slice(&[0x45, 0, 0, 0, 0x12, 0x34, 0x40, 0, 64, 17, 0, 0]);
        f[ip_start + 2..ip_start + 4].copy_from_slice(&total.to_be_bytes());
        f.extend_from_slice(&src.0.octets());
        f.extend_from_slice(&dst.0.octets());
        f.extend_from_slice(&src.1.to_be_bytes());
        f.extend_from_slice(&dst.1.to_be_bytes());
        f.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(payload);
        {
            let mut ip = super::Ipv4Packet::new_unchecked(&mut f[ip_start..]);
            ip.fill_checksum();
        }
        {
            let udp_start = ip_start + 20;
            let mut udp = super::UdpPacket::new_unchecked(&mut f[udp_start..]);
            udp.fill_checksum(src.0, dst.0);
        }
        f
    }

    /// Tiny xorshift64* generator: deterministic, no crates.
    pub struct XorShift(pub u64);
    impl XorShift {
        pub fn next_u64(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            self.0 = x;
            x.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        pub fn below(&mut self, n: usize) -> usize {
            (self.next_u64() % n as u64) as usize
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testutil::{udp4_frame, XorShift};
    use super::*;

    const A: Ipv4Addr = Ipv4Addr::new(10, 201, 1, 2);
    const B: Ipv4Addr = Ipv4Addr::new(10, 201, 1, 1);

    #[test]
    fn word_at_a_time_sum_equals_the_reference() {
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        let mut data = vec![0u8; 1600];
        for round in 0..4000 {
            let len = if round % 4 == 0 { 1316 } else { rng.below(100) };
            for b in data[..len].iter_mut() {
                // Runs of 0xff and 0x00 too: the end-around carry and the two zeros.
                *b = match round % 3 {
                    0 => rng.next_u64() as u8,
                    1 => 0xff,
                    _ => (rng.below(2) * 0xff) as u8,
                };
            }
            let d = &data[..len];
            assert_eq!(
                checksum::finish(checksum::sum(d)),
                checksum::finish(checksum::sum_reference(d)),
                "len {len}: {d:?}"
            );
            assert!(checksum::sum(d) <= 0xffff);
        }
        assert_eq!(checksum::sum(&[]), 0);
        assert_eq!(checksum::sum(&[0x12]), 0x1200);
        assert_eq!(checksum::sum(&[0x12, 0x34, 0x56]), 0x1234 + 0x5600);
    }

    #[test]
    fn parses_plain_and_tagged_frames() {
        for vlan in [None, Some(42)] {
            let f = udp4_frame(vlan, (A, 40000), (B, 20002), b"rtp!");
            let d = parse_udp4(&f).unwrap();
            assert_eq!(d.vlan, vlan);
            assert_eq!((d.src_addr, d.src_port), (A, 40000));
            assert_eq!((d.dst_addr, d.dst_port), (B, 20002));
            assert_eq!(d.payload, b"rtp!");
            assert_eq!(&f[d.payload_at..][..4], b"rtp!");
        }
    }

    #[test]
    fn link_padding_is_not_payload() {
        let mut f = udp4_frame(None, (A, 1), (B, 2), b"x");
        f.resize(60, 0xee); // minimum Ethernet frame, padded
        let d = parse_udp4(&f).unwrap();
        assert_eq!(d.payload, b"x");
        assert_eq!(d.payload_at, 14 + 20 + 8);
    }

    #[test]
    fn every_prefix_is_truncated_or_ok() {
        let f = udp4_frame(Some(7), (A, 1000), (B, 2000), &[0xab; 100]);
        for n in 0..f.len() {
            assert_eq!(parse_udp4(&f[..n]), Err(WireError::Truncated), "prefix {n}");
        }
        assert!(parse_udp4(&f).is_ok());
    }

    #[test]
    fn drop_reasons() {
        let good = udp4_frame(None, (A, 1000), (B, 2000), b"payload");
        let mut f = good.clone();
        f[12..14].copy_from_slice(&[0x86, 0xdd]);
        assert_eq!(parse_udp4(&f), Err(WireError::NotIpv4));
        let mut f = good.clone();
        f[14] = 0x65; // version 6 in an IPv4 ethertype
        assert_eq!(parse_udp4(&f), Err(WireError::NotIpv4));
        let mut f = good.clone();
        f[14 + 9] = 6; // TCP
        assert_eq!(parse_udp4(&f), Err(WireError::NotUdp));
        let mut f = good.clone();
        f[14 + 6] = 0x20; // MF
        assert_eq!(parse_udp4(&f), Err(WireError::Fragment));
        let mut f = good.clone();
        f[14 + 7] = 0x01; // offset 8 bytes
        assert_eq!(parse_udp4(&f), Err(WireError::Fragment));
        let mut f = good.clone();
        f[14] = 0x44; // IHL 4
        assert_eq!(parse_udp4(&f), Err(WireError::BadLength));
        let mut f = good.clone();
        f[14 + 2..14 + 4].copy_from_slice(&19u16.to_be_bytes());
        assert_eq!(parse_udp4(&f), Err(WireError::BadLength));
        let mut f = good.clone();
        f[14 + 2..14 + 4].copy_from_slice(&2000u16.to_be_bytes());
        assert_eq!(parse_udp4(&f), Err(WireError::Truncated));
        let mut f = good.clone();
        f[14 + 20 + 4..14 + 20 + 6].copy_from_slice(&7u16.to_be_bytes());
        assert_eq!(parse_udp4(&f), Err(WireError::BadLength));
        let mut f = good.clone();
        f[14 + 20 + 4..14 + 20 + 6].copy_from_slice(&100u16.to_be_bytes());
        assert_eq!(parse_udp4(&f), Err(WireError::Truncated));
        // IHL longer than total length
        let mut f = good;
        f[14] = 0x4f;
        assert_eq!(parse_udp4(&f), Err(WireError::BadLength));
    }

    #[test]
    fn garbage_never_panics() {
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        for _ in 0..20_000 {
            let len = rng.below(100);
            let buf: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            let _ = parse_udp4(&buf);
            exercise_views(&buf);
        }
    }

    /// Mutate valid frames at random (bytes, length fields, truncation) and call every
    /// accessor on whatever `new_checked` accepts.
    #[test]
    fn random_mutations_never_panic() {
        let mut rng = XorShift(0x1234_5678_9abc_def1);
        let seeds = [
            udp4_frame(None, (A, 5004), (B, 30000), &[1; 40]),
            udp4_frame(Some(100), (A, 5004), (B, 30000), &[2; 3]),
            udp4_frame(None, (A, 1), (B, 2), &[]),
        ];
        let mut ok = 0usize;
        for i in 0..200_000 {
            let mut f = seeds[i % seeds.len()].clone();
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(f.len());
                match rng.below(4) {
                    0 => f[at] = rng.next_u64() as u8,
                    1 => f[at] ^= 1 << rng.below(8),
                    2 => f.truncate(at),
                    _ => f.extend((0..rng.below(8)).map(|_| rng.next_u64() as u8)),
                }
                if f.is_empty() {
                    break;
                }
            }
            if let Ok(d) = parse_udp4(&f) {
                ok += 1;
                assert!(d.payload.len() <= f.len());
            }
            exercise_views(&f);
        }
        assert!(
            ok > 1000,
            "mutations should leave many frames valid, got {ok}"
        );
    }

    fn exercise_views(buf: &[u8]) {
        if let Ok(eth) = EthernetFrame::new_checked(buf) {
            let _ = (
                eth.dst_addr(),
                eth.src_addr(),
                eth.ethertype(),
                eth.vlan_tci(),
            );
            let _ = (eth.vlan_id(), eth.header_len());
            let p = eth.payload();
            if let Ok(ip) = Ipv4Packet::new_checked(p) {
                let _ = (ip.version(), ip.header_len(), ip.total_len(), ip.ident());
                let _ = (ip.dont_frag(), ip.more_frags(), ip.frag_offset(), ip.ttl());
                let _ = (ip.protocol(), ip.checksum(), ip.src_addr(), ip.dst_addr());
                let _ = (ip.verify_checksum(), ip.compute_checksum(), ip.options());
                let (s, d) = (ip.src_addr(), ip.dst_addr());
                if let Ok(u) = UdpPacket::new_checked(ip.payload()) {
                    let _ = (u.src_port(), u.dst_port(), u.len(), u.checksum());
                    let _ = (u.payload(), u.verify_checksum(s, d));
                }
            }
        }
    }
}

/// The UDP header of a datagram `src` → `dst` carrying `payload` (at most 65 507 bytes),
/// checksum filled in: for a raw IPv4 socket, where the kernel writes the IPv4 header.
pub fn udp_header(
    src: std::net::SocketAddrV4,
    dst: std::net::SocketAddrV4,
    payload: &[u8],
) -> [u8; 8] {
    let udp_len = (8 + payload.len()) as u16;
    let mut h = [0u8; 8];
    h[0..2].copy_from_slice(&src.port().to_be_bytes());
    h[2..4].copy_from_slice(&dst.port().to_be_bytes());
    h[4..6].copy_from_slice(&udp_len.to_be_bytes());
    let pseudo = udp::pseudo_sum(*src.ip(), *dst.ip(), udp_len);
    let sum = checksum::combine(pseudo, checksum::sum(&h));
    let c = match checksum::finish(checksum::combine(sum, checksum::sum(payload))) {
        // A computed zero is sent as all ones (RFC 768).
        0 => 0xffff,
        c => c,
    };
    h[6..8].copy_from_slice(&c.to_be_bytes());
    h
}

/// Ethernet + IPv4 + UDP header bytes in front of a UDP payload.
pub const UDP4_FRAME_HEADERS: usize = 14 + 20 + 8;

/// Where the UDP checksum's coverage starts in a frame of [`FrameEnds::write`] (the UDP
/// header: Ethernet, then IPv4 without options), and where the checksum field sits from
/// there: what a device that finishes an offloaded checksum is told.
pub const UDP4_CSUM_START: u16 = 14 + 20;
/// See [`UDP4_CSUM_START`].
pub const UDP_CSUM_OFFSET: u16 = 6;

/// Writes the Ethernet, IPv4 (DF, TTL 64, identification `ident`) and UDP headers of a
/// datagram `src` → `dst` into the first [`UDP4_FRAME_HEADERS`] bytes of `frame`, whose rest
/// is the payload, and fills both checksums (for frames nothing fills in later: AF_XDP).
/// `frame` must be at least the headers long and at most 65 535 - 20 bytes past the Ethernet
/// header.
pub fn write_udp4_frame(
    frame: &mut [u8],
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    src: std::net::SocketAddrV4,
    dst: std::net::SocketAddrV4,
    ident: u16,
) {
    let (h, payload) = frame.split_at_mut(UDP4_FRAME_HEADERS);
    let ends = FrameEnds {
        dst_mac,
        src_mac,
        src,
        dst,
    };
    ends.write(h, ident, UdpChecksum::Full(payload));
}

/// Who fills the UDP checksum of a frame built by [`FrameEnds::write`].
#[derive(Clone, Copy, Debug)]
pub enum UdpChecksum<'a> {
    /// Computed here over this payload.
    Full(&'a [u8]),
    /// Left to the device, or to the kernel just before the driver, as for the kernel's own
    /// UDP sockets: the field holds the pseudo-header sum and a `virtio_net_hdr`
    /// ([`write_vnet_udp_csum`]) asks for the rest. The payload is this long.
    Offload(usize),
}

/// The two ends of the IPv4/UDP frames vgate builds itself (the packet-socket transmit of
/// mode tnapi and of a split half's outgoing link, and AF_XDP transmit): the one writer of
/// their Ethernet/IPv4/UDP headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameEnds {
    /// The next hop's MAC address.
    pub dst_mac: [u8; 6],
    /// Ours on the egress interface.
    pub src_mac: [u8; 6],
    pub src: std::net::SocketAddrV4,
    pub dst: std::net::SocketAddrV4,
}

/// Length of the legacy `struct virtio_net_hdr` a packet socket with `PACKET_VNET_HDR` takes
/// in front of each frame.
pub const VNET_HDR_LEN: usize = 10;

/// Bytes [`FrameEnds::write_vnet`] puts before a payload: `virtio_net_hdr`, Ethernet, IPv4,
/// UDP.
pub const VNET_UDP4_HEADERS: usize = VNET_HDR_LEN + UDP4_FRAME_HEADERS;

/// Writes a `virtio_net_hdr` (legacy, native byte order) asking the device or the kernel to
/// fill in the UDP checksum of the Ethernet/IPv4 (no options)/UDP frame that follows it:
/// `NEEDS_CSUM`, no GSO, checksum from byte 34 (the UDP header) stored 6 bytes in.
pub fn write_vnet_udp_csum(h: &mut [u8]) {
    const VIRTIO_NET_HDR_F_NEEDS_CSUM: u8 = 1;
    const VIRTIO_NET_HDR_GSO_NONE: u8 = 0;
    // flags, gso_type, hdr_len, gso_size, csum_start, csum_offset.
    h[0] = VIRTIO_NET_HDR_F_NEEDS_CSUM;
    h[1] = VIRTIO_NET_HDR_GSO_NONE;
    h[2..4].copy_from_slice(&(UDP4_FRAME_HEADERS as u16).to_ne_bytes());
    h[4..6].copy_from_slice(&0u16.to_ne_bytes());
    h[6..8].copy_from_slice(&UDP4_CSUM_START.to_ne_bytes());
    h[8..10].copy_from_slice(&UDP_CSUM_OFFSET.to_ne_bytes());
}

impl FrameEnds {
    /// Writes the Ethernet, IPv4 (DF, TTL 64, identification `ident`, header checksum) and
    /// UDP headers into the first [`UDP4_FRAME_HEADERS`] bytes of `h`, and the UDP checksum
    /// as `csum` says. The payload follows the headers on the wire (in `h` or in another
    /// buffer of the same message); it must be at most 65 535 - 28 bytes.
    pub fn write(&self, h: &mut [u8], ident: u16, csum: UdpChecksum<'_>) {
        let payload_len = match csum {
            UdpChecksum::Full(p) => p.len(),
            UdpChecksum::Offload(n) => n,
        };
        let udp_len = (8 + payload_len) as u16;
        let e = &mut h[..UDP4_FRAME_HEADERS];
        e[0..6].copy_from_slice(&self.dst_mac);
        e[6..12].copy_from_slice(&self.src_mac);
        e[12..14].copy_from_slice(&[0x08, 0x00]);
        // Version 4, IHL 5, DSCP 0, total length, identification, DF, TTL 64, UDP.
        e[14..34].copy_from_slice(&[
            0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        ]);
        e[16..18].copy_from_slice(&(udp_len + 20).to_be_bytes());
        e[18..20].copy_from_slice(&ident.to_be_bytes());
        e[26..30].copy_from_slice(&self.src.ip().octets());
        e[30..34].copy_from_slice(&self.dst.ip().octets());
        Ipv4Packet::new_unchecked(&mut e[14..34]).fill_checksum();
        e[34..36].copy_from_slice(&self.src.port().to_be_bytes());
        e[36..38].copy_from_slice(&self.dst.port().to_be_bytes());
        e[38..40].copy_from_slice(&udp_len.to_be_bytes());
        e[40..42].copy_from_slice(&[0, 0]);
        let pseudo = udp::pseudo_sum(*self.src.ip(), *self.dst.ip(), udp_len);
        let c = match csum {
            UdpChecksum::Full(p) => {
                let hdr = checksum::combine(pseudo, checksum::sum(&e[34..42]));
                match checksum::finish(checksum::combine(hdr, checksum::sum(p))) {
                    // A computed zero is sent as all ones (RFC 768).
                    0 => 0xffff,
                    c => c,
                }
            }
            // The device adds the header and payload to this and complements the result.
            UdpChecksum::Offload(_) => !checksum::finish(pseudo),
        };
        e[40..42].copy_from_slice(&c.to_be_bytes());
    }

    /// For a packet socket with `PACKET_VNET_HDR`: a `virtio_net_hdr` asking for the UDP
    /// checksum, then the headers of [`FrameEnds::write`] with the checksum offloaded, for a
    /// payload of `payload_len` bytes that follows in the same message. Returns
    /// [`VNET_UDP4_HEADERS`], the bytes written.
    pub fn write_vnet(&self, h: &mut [u8], ident: u16, payload_len: usize) -> usize {
        write_vnet_udp_csum(&mut h[..VNET_HDR_LEN]);
        self.write(
            &mut h[VNET_HDR_LEN..VNET_UDP4_HEADERS],
            ident,
            UdpChecksum::Offload(payload_len),
        );
        VNET_UDP4_HEADERS
    }
}

#[cfg(test)]
mod frame_tests {
    use super::*;
    use std::net::SocketAddrV4;

    #[test]
    fn udp_header_checksum_verifies() {
        let (src, dst) = (ends().src, ends().dst);
        for n in [0, 1, 2, 3, 1316, 1473] {
            let p = payload(n);
            let mut d = udp_header(src, dst, &p).to_vec();
            d.extend_from_slice(&p);
            let u = UdpPacket::new_checked(&d[..]).unwrap();
            assert_eq!(
                (u.src_port(), u.dst_port(), u.len()),
                (30001, 40001, d.len())
            );
            assert!(u.verify_checksum(*src.ip(), *dst.ip()), "{n} bytes");
        }
    }

    fn ends() -> FrameEnds {
        FrameEnds {
            dst_mac: [2, 0, 0, 0, 0, 9],
            src_mac: [2, 0, 0, 0, 0, 1],
            src: SocketAddrV4::new(Ipv4Addr::new(10, 201, 2, 1), 30001),
            dst: SocketAddrV4::new(Ipv4Addr::new(10, 201, 2, 2), 40001),
        }
    }

    fn payload(n: u32) -> Vec<u8> {
        (0..n).map(|i| (i * 7) as u8).collect()
    }

    /// What a device does for `VIRTIO_NET_HDR_F_NEEDS_CSUM`: sums from `csum_start` to the
    /// end (the field holds the pseudo-header sum) and stores the complement at
    /// `csum_start + csum_offset`.
    fn device_sums(vnet: &[u8], frame: &mut [u8]) {
        let start = usize::from(u16::from_ne_bytes([vnet[6], vnet[7]]));
        let at = start + usize::from(u16::from_ne_bytes([vnet[8], vnet[9]]));
        assert_eq!((vnet[0], start, at), (1, 34, 40));
        let c = checksum::finish(checksum::sum(&frame[start..]));
        frame[at..at + 2].copy_from_slice(&c.to_be_bytes());
    }

    #[test]
    fn offloaded_headers_make_a_valid_datagram_once_the_device_sums_it() {
        // Odd and even lengths: the device's sum must come out right for both.
        for n in [1317, 1316, 1, 0] {
            let p = payload(n);
            let mut h = [0u8; 64];
            assert_eq!(ends().write_vnet(&mut h, 77, p.len()), VNET_UDP4_HEADERS);
            let mut frame = h[VNET_HDR_LEN..VNET_UDP4_HEADERS].to_vec();
            frame.extend_from_slice(&p);
            device_sums(&h[..VNET_HDR_LEN], &mut frame);
            let d = parse_udp4(&frame).expect("a well-formed IPv4/UDP frame");
            assert!(d.checksums_ok(false), "IPv4 and UDP checksums hold ({n})");
            let e = ends();
            assert_eq!((d.src_addr, d.src_port), (*e.src.ip(), 30001));
            assert_eq!((d.dst_addr, d.dst_port), (*e.dst.ip(), 40001));
            assert_eq!(d.payload, &p[..]);
            assert_eq!(&frame[0..6], &e.dst_mac);
            assert_eq!(&frame[6..12], &e.src_mac);
            assert_eq!(u16::from_be_bytes([frame[18], frame[19]]), 77);
        }
    }

    #[test]
    fn full_checksum_matches_the_udp_view_and_the_offloaded_result() {
        for n in [1317, 1316, 1, 0] {
            let p = payload(n);
            let mut full = vec![0u8; UDP4_FRAME_HEADERS];
            full.extend_from_slice(&p);
            write_udp4_frame(
                &mut full,
                ends().dst_mac,
                ends().src_mac,
                ends().src,
                ends().dst,
                5,
            );
            let d = parse_udp4(&full).unwrap();
            assert!(d.checksums_ok(false), "({n})");
            assert_ne!(
                u16::from_be_bytes([full[40], full[41]]),
                0,
                "never 'no checksum'"
            );
            let mut h = [0u8; 64];
            ends().write_vnet(&mut h, 5, p.len());
            let mut off = h[VNET_HDR_LEN..VNET_UDP4_HEADERS].to_vec();
            off.extend_from_slice(&p);
            device_sums(&h[..VNET_HDR_LEN], &mut off);
            // The same bytes but where one side writes 0xffff for a computed zero.
            assert_eq!(full[..40], off[..40]);
            assert_eq!(full[42..], off[42..]);
        }
    }
}
