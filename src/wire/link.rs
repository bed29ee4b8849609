//! The link header: what every datagram on a one-way link starts with.
//!
//! A checked zero-copy view in the style of [`crate::wire`]: [`LinkPacket::new_checked`]
//! checks magic, version, kind, the FEC fields and the lengths once; after that no accessor
//! can panic. Big-endian; version 2 is 34 bytes: the 28-byte *lane header* (FEC and order,
//! per sending worker) and the 6-byte *stream header* (per route), which starts the link
//! datagram the lane header carries:
//!
//! ```text
//!  0      2      3      4      5      6      7      8             12            16
//!  +------+------+------+------+------+------+------+-------------+-------------+
//!  | "VG" | ver  | kind | lane |  k   |  m   | idx  |  sequence   |    block    |
//!  +------+------+------+------+------+------+------+-------------+-------------+
//!  16            20      22     24     26     28
//!  +-------------+-------+------+------+------+---- payload (data) / coded shard (repair)
//!  | timestamp µs| epoch | dst  | src  | len  |
//!  +-------------+-------+------+------+------+
//!  28                  32     33     34
//!  +-------------------+------+------+---- media (the datagram, or one fragment of it)
//!  | stream sequence   | frag | frags|
//!  +-------------------+------+------+
//! ```
//!
//! - `lane`: the sending worker; each lane has its own sequence, blocks and FEC state.
//! - `k`, `m`: the FEC setting of the block (`0`, `0` when FEC is off); `idx` is the packet's
//!   index in its block (`< k` data, `>= k` repair).
//! - `epoch`: chosen at random when the sending half starts, so a restarted sender is told
//!   apart from a very late one.
//! - `dst`, `src`, `len`: the peer's gateway port, our egress port and the payload length.
//!   They sit last on purpose: bytes 22.. of a data packet, padded, are exactly the shard the
//!   erasure code protects, so a repaired shard gives back ports and length as well as the
//!   payload, and the sender encodes straight from the frames it sends (no copy).
//!   In a repair packet those six bytes are coded bytes, not ports. `len` counts the link
//!   datagram: the stream header and the media.
//! - The stream header (version 2; [`StreamHeader`]) is part of the link datagram, so FEC
//!   protects and rebuilds it like the media and the lane layers ([`crate::link::fec`],
//!   [`crate::link::reorder`]) never look at it. `stream sequence`: the sending half's per-route
//!   count of datagrams (each route starts at a random value), so the receiving half counts
//!   each stream's losses exactly. `frag`/`frags`: a datagram longer than a link frame's
//!   media ([`MAX_MEDIA`]) is cut into `frags` frames, `frag` = 0.. (all but the last carry
//!   exactly [`MAX_MEDIA`] bytes); 0/1 for a whole datagram. The view checks the lane header
//!   only; [`StreamHeader::parse`] checks the stream header where datagrams are handed on.
//!
//! Version 1 (no stream header) and version 2 do not interoperate: a frame of another
//! version is dropped and counted (`bad_version`); both halves must run the same release.
//! Version 4 ([`VERSION_BLOCK`]) is version 3's layout for the block code (`fec =
//! "block"`): `k + m` up to [`MAX_BLOCK_SHARDS`], the rest unchanged (the auth trailer
//! covers it as before). A receiver takes both and checks the version against its own FEC
//! setting (`bad_fec` for the other code's frames).

use std::ops::Range;

/// `"VG"`.
pub const MAGIC: u16 = 0x5647;
pub const VERSION: u8 = 3;
/// The version of frames of the block code (`fec = "block"`: Leopard Reed-Solomon over
/// GF(2^16), [`crate::link::fec`]): the same layout as [`VERSION`], with `k` and `m` up to
/// [`MAX_BLOCK_SHARDS`] together. A release before it drops them as `bad_version`; a half
/// configured for the other code drops them as `bad_fec` (and counts `fec_mismatch`).
pub const VERSION_BLOCK: u8 = 4;
/// Bytes of the lane header, before the link datagram ([`LinkPacket::payload`]).
pub const HEADER_LEN: usize = 28;
/// Bytes of the stream header at the start of every link datagram.
pub const STREAM_HEADER_LEN: usize = 6;
/// Every header byte before the media of a frame.
pub const FULL_HEADER_LEN: usize = HEADER_LEN + STREAM_HEADER_LEN;
/// Largest link frame (1500-byte MTU minus IPv4 and UDP headers).
pub const FRAME_CAP: usize = 1472;
/// Bytes after every frame on the wire: the sending lane's epoch (8) and the MAC (16)
/// ([`crate::link::auth`]). A frame and its trailer fit [`FRAME_CAP`].
pub const TRAILER_LEN: usize = 24;
/// Media bytes one link frame carries; longer datagrams are cut into fragments.
pub const MAX_MEDIA: usize = FRAME_CAP - FULL_HEADER_LEN - TRAILER_LEN;
/// Largest datagram a link carries (the largest UDP payload over IPv4), in up to
/// [`MAX_FRAGS`] frames.
pub const MAX_DATAGRAM: usize = 65_507;
/// Frames of the largest datagram.
pub const MAX_FRAGS: usize = MAX_DATAGRAM.div_ceil(MAX_MEDIA);
/// Where the FEC shard starts in a frame (ports and length, then payload).
pub const SHARD_START: usize = 22;
/// Shard bytes before the payload (dst, src, len).
pub const SHARD_PREFIX: usize = HEADER_LEN - SHARD_START;
/// Largest k and m accepted (the receiver keeps a 64-bit presence mask per block and the
/// erasure code's work arrays stay inline up to 32 shards).
pub const MAX_K: u8 = 32;
pub const MAX_M: u8 = 16;
/// Largest `k + m` of a block of the block code (version 4): the receiver's presence masks
/// are 128 bits, and a lane's window of 8 such blocks is 1.5 MB.
pub const MAX_BLOCK_SHARDS: usize = 128;
/// Largest link datagram one frame carries: a frame minus the lane header and the trailer
/// (the stream header and the media, or one fragment of it: [`MAX_MEDIA`]).
pub const MAX_PAYLOAD: usize = FRAME_CAP - HEADER_LEN - TRAILER_LEN;
/// Lanes (sending workers) a receiver tracks.
pub const MAX_LANES: usize = 64;

/// Bits of positions `0..k` of a block (data frames, or the fragments of a datagram).
pub fn data_mask(k: usize) -> u64 {
    if k >= 64 {
        u64::MAX
    } else {
        (1u64 << k) - 1
    }
}

mod field {
    use std::ops::Range;
    pub const MAGIC: Range<usize> = 0..2;
    pub const VERSION: usize = 2;
    pub const KIND: usize = 3;
    pub const LANE: usize = 4;
    pub const K: usize = 5;
    pub const M: usize = 6;
    pub const INDEX: usize = 7;
    pub const SEQUENCE: Range<usize> = 8..12;
    pub const BLOCK: Range<usize> = 12..16;
    pub const TIMESTAMP: Range<usize> = 16..20;
    pub const EPOCH: Range<usize> = 20..22;
    pub const DST: Range<usize> = 22..24;
    pub const SRC: Range<usize> = 24..26;
    pub const LEN: Range<usize> = 26..28;
}

/// Data or repair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Data = 0,
    Repair = 1,
}

/// Why a link datagram was refused. Each has its own counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// Not ours: wrong magic or unknown kind.
    #[error("not a vgate link packet (bad magic or kind)")]
    Garbage,
    /// Shorter than the header, or than the length the header claims.
    #[error("link packet shorter than its header or claimed length")]
    Truncated,
    /// Magic right, version not ours: the peer half runs another vgate version.
    #[error("link packet of another version: run the same vgate version on both halves")]
    BadVersion,
    /// FEC fields out of range (k or m too large, index past k+m, k=0 with m>0, ...).
    #[error("link packet with impossible FEC fields")]
    BadFec,
    /// Longer than a link frame ([`FRAME_CAP`]): no vgate half sends one.
    #[error("link packet longer than a link frame: run the same vgate version on both halves")]
    Oversize,
}

/// A view of one link datagram. After [`LinkPacket::new_checked`] every accessor is safe.
#[derive(Debug, Clone)]
pub struct LinkPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> LinkPacket<T> {
    /// Wraps without checking; accessors may panic unless [`Self::check`] passes.
    pub const fn new_unchecked(buffer: T) -> Self {
        LinkPacket { buffer }
    }

    /// Wraps and checks magic, version, kind, FEC fields and lengths.
    pub fn new_checked(buffer: T) -> Result<Self, HeaderError> {
        let p = Self::new_unchecked(buffer);
        p.check()?;
        Ok(p)
    }

    pub fn check(&self) -> Result<(), HeaderError> {
        let b = self.buffer.as_ref();
        if b.len() < 4 {
            return Err(HeaderError::Truncated);
        }
        if self.u16_at(field::MAGIC) != MAGIC || b[field::KIND] > Kind::Repair as u8 {
            return Err(HeaderError::Garbage);
        }
        let block_code = match b[field::VERSION] {
            VERSION => false,
            VERSION_BLOCK => true,
            _ => return Err(HeaderError::BadVersion),
        };
        if b.len() < HEADER_LEN {
            return Err(HeaderError::Truncated);
        }
        // The decoder keeps shards in FRAME_CAP slots; a longer frame would not fit one,
        // and no vgate half sends one that leaves no room for its trailer.
        if b.len() > FRAME_CAP - TRAILER_LEN {
            return Err(HeaderError::Oversize);
        }
        let (k, m, idx) = (b[field::K], b[field::M], b[field::INDEX]);
        let fec_ok = if block_code {
            k > 0 && m > 0 && usize::from(k) + usize::from(m) <= MAX_BLOCK_SHARDS && idx < k + m
        } else if k == 0 {
            m == 0 && idx == 0
        } else {
            k <= MAX_K && m <= MAX_M && idx < k + m
        };
        let kind_ok = match self.kind() {
            Kind::Data => k == 0 || idx < k,
            Kind::Repair => k > 0 && idx >= k,
        };
        if !fec_ok || !kind_ok {
            return Err(HeaderError::BadFec);
        }
        // A data packet carries exactly `len` payload bytes; a repair packet a coded shard.
        if self.kind() == Kind::Data && HEADER_LEN + usize::from(self.len()) != b.len() {
            return Err(HeaderError::Truncated);
        }
        Ok(())
    }

    fn u16_at(&self, r: Range<usize>) -> u16 {
        let b = &self.buffer.as_ref()[r];
        u16::from_be_bytes([b[0], b[1]])
    }

    fn u32_at(&self, r: Range<usize>) -> u32 {
        let b = &self.buffer.as_ref()[r];
        u32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }

    pub fn kind(&self) -> Kind {
        if self.buffer.as_ref()[field::KIND] == Kind::Repair as u8 {
            Kind::Repair
        } else {
            Kind::Data
        }
    }
    /// [`VERSION`] or [`VERSION_BLOCK`] (checked).
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION]
    }
    /// A frame of the block code ([`VERSION_BLOCK`]).
    pub fn block_code(&self) -> bool {
        self.version() == VERSION_BLOCK
    }
    pub fn lane(&self) -> u8 {
        self.buffer.as_ref()[field::LANE]
    }
    pub fn fec_k(&self) -> u8 {
        self.buffer.as_ref()[field::K]
    }
    pub fn fec_m(&self) -> u8 {
        self.buffer.as_ref()[field::M]
    }
    pub fn index(&self) -> u8 {
        self.buffer.as_ref()[field::INDEX]
    }
    pub fn sequence(&self) -> u32 {
        self.u32_at(field::SEQUENCE)
    }
    pub fn block(&self) -> u32 {
        self.u32_at(field::BLOCK)
    }
    /// Sender's clock when sent, microseconds, wrapping.
    pub fn timestamp_us(&self) -> u32 {
        self.u32_at(field::TIMESTAMP)
    }
    pub fn epoch(&self) -> u16 {
        self.u16_at(field::EPOCH)
    }
    /// The peer's gateway port the datagram is for (data packets).
    pub fn dst_port(&self) -> u16 {
        self.u16_at(field::DST)
    }
    /// The sending half's egress port (data packets).
    pub fn src_port(&self) -> u16 {
        self.u16_at(field::SRC)
    }
    /// Payload length (data packets).
    pub fn len(&self) -> u16 {
        self.u16_at(field::LEN)
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The original datagram (data packets).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
    /// The FEC shard: ports, length and payload of a data packet; the coded bytes of a repair.
    pub fn shard(&self) -> &[u8] {
        &self.buffer.as_ref()[SHARD_START..]
    }
}

/// Header fields to write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fields {
    pub repair: bool,
    /// A frame of the block code: written as [`VERSION_BLOCK`].
    pub block_code: bool,
    pub lane: u8,
    pub k: u8,
    pub m: u8,
    pub index: u8,
    pub sequence: u32,
    pub block: u32,
    pub timestamp_us: u32,
    pub epoch: u16,
}

/// Writes the header fields before [`SHARD_START`] into `buf` (which must hold at least
/// [`SHARD_START`] bytes). Ports and length are written by [`write_shard_prefix`].
pub fn write_fields(buf: &mut [u8], f: &Fields) {
    let b = &mut buf[..SHARD_START];
    b[field::MAGIC].copy_from_slice(&MAGIC.to_be_bytes());
    b[field::VERSION] = if f.block_code { VERSION_BLOCK } else { VERSION };
    b[field::KIND] = if f.repair {
        Kind::Repair as u8
    } else {
        Kind::Data as u8
    };
    b[field::LANE] = f.lane;
    b[field::K] = f.k;
    b[field::M] = f.m;
    b[field::INDEX] = f.index;
    b[field::SEQUENCE].copy_from_slice(&f.sequence.to_be_bytes());
    b[field::BLOCK].copy_from_slice(&f.block.to_be_bytes());
    b[field::TIMESTAMP].copy_from_slice(&f.timestamp_us.to_be_bytes());
    b[field::EPOCH].copy_from_slice(&f.epoch.to_be_bytes());
}

/// Writes destination port, source port and payload length (the shard prefix) at
/// `buf[SHARD_START..HEADER_LEN]`.
pub fn write_shard_prefix(buf: &mut [u8], dst: u16, src: u16, len: u16) {
    buf[field::DST].copy_from_slice(&dst.to_be_bytes());
    buf[field::SRC].copy_from_slice(&src.to_be_bytes());
    buf[field::LEN].copy_from_slice(&len.to_be_bytes());
}

/// Reads (dst, src, len) back from a shard (e.g. a repaired one).
pub fn shard_prefix(shard: &[u8]) -> Option<(u16, u16, u16)> {
    let p = shard.get(..SHARD_PREFIX)?;
    Some((
        u16::from_be_bytes([p[0], p[1]]),
        u16::from_be_bytes([p[2], p[3]]),
        u16::from_be_bytes([p[4], p[5]]),
    ))
}

/// The stream header at the start of a link datagram (version 2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamHeader {
    /// The sending half's sequence of the route's datagrams (all fragments of one share it).
    pub sequence: u32,
    /// This frame's fragment, `0..frags`.
    pub frag: u8,
    /// Frames the datagram was cut into (1: whole).
    pub frags: u8,
}

impl StreamHeader {
    /// Splits a link datagram into its stream header and media. `None` when it is shorter
    /// than the header, or its fragment fields are impossible: `frags` 0 or above
    /// [`MAX_FRAGS`], `frag` not below `frags`, media longer than [`MAX_MEDIA`], a
    /// fragment before the last not exactly [`MAX_MEDIA`] long, or a last fragment making
    /// the joined datagram longer than [`MAX_DATAGRAM`].
    pub fn parse(datagram: &[u8]) -> Option<(StreamHeader, &[u8])> {
        let (h, media) = datagram.split_at_checked(STREAM_HEADER_LEN)?;
        let sh = StreamHeader {
            sequence: u32::from_be_bytes([h[0], h[1], h[2], h[3]]),
            frag: h[4],
            frags: h[5],
        };
        let (frag, frags) = (usize::from(sh.frag), usize::from(sh.frags));
        let ok = (1..=MAX_FRAGS).contains(&frags)
            && frag < frags
            && media.len() <= MAX_MEDIA
            && (frag + 1 == frags || media.len() == MAX_MEDIA)
            // The joined datagram (its length set by the last fragment) fits a UDP one.
            && (frag + 1 < frags || frag * MAX_MEDIA + media.len() <= MAX_DATAGRAM);
        ok.then_some((sh, media))
    }

    /// The header's bytes.
    pub fn bytes(&self) -> [u8; STREAM_HEADER_LEN] {
        let s = self.sequence.to_be_bytes();
        [s[0], s[1], s[2], s[3], self.frag, self.frags]
    }
}

/// Frames a datagram of `len` bytes is cut into (`None`: longer than [`MAX_DATAGRAM`]).
pub fn fragments(len: usize) -> Option<usize> {
    (len <= MAX_DATAGRAM).then(|| len.div_ceil(MAX_MEDIA).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(f: Fields, payload: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_LEN + payload.len()];
        write_fields(&mut b, &f);
        write_shard_prefix(&mut b, 30000, 20001, payload.len() as u16);
        b[HEADER_LEN..].copy_from_slice(payload);
        b
    }

    #[test]
    fn round_trip() {
        let f = Fields {
            lane: 3,
            k: 8,
            m: 2,
            index: 5,
            sequence: 77,
            block: 9,
            timestamp_us: 123456,
            epoch: 0xbeef,
            ..Fields::default()
        };
        let b = frame(f, b"hello");
        let p = LinkPacket::new_checked(&b[..]).unwrap();
        assert_eq!(p.kind(), Kind::Data);
        assert_eq!((p.lane(), p.fec_k(), p.fec_m(), p.index()), (3, 8, 2, 5));
        assert_eq!((p.sequence(), p.block(), p.timestamp_us()), (77, 9, 123456));
        assert_eq!(
            (p.epoch(), p.dst_port(), p.src_port()),
            (0xbeef, 30000, 20001)
        );
        assert_eq!(p.payload(), b"hello");
        assert_eq!(shard_prefix(p.shard()), Some((30000, 20001, 5)));
    }

    #[test]
    fn refusals() {
        let good = frame(Fields::default(), b"x");
        assert!(LinkPacket::new_checked(&good[..]).is_ok());
        for cut in 0..good.len() {
            assert_eq!(
                LinkPacket::new_checked(&good[..cut]).err(),
                Some(HeaderError::Truncated),
                "cut at {cut}"
            );
        }
        let mut g = good.clone();
        g[0] = b'X';
        assert_eq!(
            LinkPacket::new_checked(&g[..]).err(),
            Some(HeaderError::Garbage)
        );
        let mut v = good.clone();
        v[2] = 9;
        assert_eq!(
            LinkPacket::new_checked(&v[..]).err(),
            Some(HeaderError::BadVersion)
        );
        let mut long = good.clone();
        long.push(0);
        assert_eq!(
            LinkPacket::new_checked(&long[..]).err(),
            Some(HeaderError::Truncated)
        );
        // A repair frame carries whatever shard follows its header, but never more than a
        // link frame: the decoder keeps shards in FRAME_CAP slots (a fuzzer's find).
        let repair = Fields {
            repair: true,
            k: 8,
            m: 2,
            index: 9,
            ..Fields::default()
        };
        let fits = frame(repair, &vec![7u8; MAX_PAYLOAD]);
        assert_eq!(fits.len(), FRAME_CAP - TRAILER_LEN);
        assert!(LinkPacket::new_checked(&fits[..]).is_ok());
        let over = frame(repair, &vec![7u8; MAX_PAYLOAD + 1]);
        assert_eq!(
            LinkPacket::new_checked(&over[..]).err(),
            Some(HeaderError::Oversize)
        );
        for (k, m, idx, repair) in [
            (0, 1, 0, false),
            (33, 1, 0, false),
            (8, 17, 0, false),
            (8, 2, 10, true),
            (8, 2, 8, false),
            (8, 2, 3, true),
            (0, 0, 0, true),
        ] {
            let b = frame(
                Fields {
                    repair,
                    k,
                    m,
                    index: idx,
                    ..Fields::default()
                },
                b"x",
            );
            assert_eq!(
                LinkPacket::new_checked(&b[..]).err(),
                Some(HeaderError::BadFec),
                "k={k} m={m} idx={idx} repair={repair}"
            );
        }
        // A repair packet's length field is coded: any length of shard is accepted.
        let mut r = frame(
            Fields {
                repair: true,
                k: 2,
                m: 1,
                index: 2,
                ..Fields::default()
            },
            b"abc",
        );
        r[26] = 0xff;
        assert!(LinkPacket::new_checked(&r[..]).is_ok());
    }

    /// Version 3 on the wire, byte for byte (the auth trailer follows: `crate::link::auth`):
    /// a change here breaks the peer half.
    #[test]
    fn golden_v3_frame() {
        let f = Fields {
            lane: 1,
            k: 8,
            m: 2,
            index: 3,
            sequence: 0x0102_0304,
            block: 0x0a0b_0c0d,
            timestamp_us: 0x1122_3344,
            epoch: 0xbeef,
            ..Fields::default()
        };
        let sh = StreamHeader {
            sequence: 0xdead_beef,
            frag: 1,
            frags: 2,
        };
        let mut dg = sh.bytes().to_vec();
        dg.extend_from_slice(b"media");
        let b = frame(f, &dg);
        assert_eq!(
            b,
            [
                b'V', b'G', 3, 0, 1, 8, 2, 3, 1, 2, 3, 4, 0x0a, 0x0b, 0x0c, 0x0d, 0x11, 0x22, 0x33,
                0x44, 0xbe, 0xef, 0x75, 0x30, 0x4e, 0x21, 0, 11, 0xde, 0xad, 0xbe, 0xef, 1, 2,
                b'm', b'e', b'd', b'i', b'a'
            ]
        );
        assert_eq!(FULL_HEADER_LEN, 34);
        let p = LinkPacket::new_checked(&b[..]).unwrap();
        assert_eq!(StreamHeader::parse(p.payload()), Some((sh, &b"media"[..])));
        // A version 2 frame (no trailer) is refused as another version.
        let mut v1 = b.clone();
        v1[2] = 2;
        assert_eq!(
            LinkPacket::new_checked(&v1[..]).err(),
            Some(HeaderError::BadVersion)
        );
    }

    /// Version 4 (the block code): the version 3 layout, version byte 4, `k + m` up to
    /// [`MAX_BLOCK_SHARDS`]; a block frame with impossible fields is `BadFec`.
    #[test]
    fn block_code_frames() {
        let f = Fields {
            block_code: true,
            lane: 1,
            k: 116,
            m: 12,
            index: 115,
            sequence: 7,
            block: 9,
            ..Fields::default()
        };
        let b = frame(f, b"media");
        assert_eq!(&b[..8], &[b'V', b'G', 4, 0, 1, 116, 12, 115]);
        let p = LinkPacket::new_checked(&b[..]).unwrap();
        assert!(p.block_code());
        assert_eq!((p.fec_k(), p.fec_m(), p.index()), (116, 12, 115));
        let repair = Fields {
            repair: true,
            index: 127,
            ..f
        };
        assert!(LinkPacket::new_checked(&frame(repair, b"xy")[..]).is_ok());
        for (k, m, idx, repair) in [
            (0, 1, 0, false),
            (1, 0, 0, false),
            (117, 12, 0, false),
            (116, 12, 128, true),
            (116, 12, 116, false),
            (116, 12, 3, true),
        ] {
            let b = frame(
                Fields {
                    block_code: true,
                    repair,
                    k,
                    m,
                    index: idx,
                    ..Fields::default()
                },
                b"x",
            );
            assert_eq!(
                LinkPacket::new_checked(&b[..]).err(),
                Some(HeaderError::BadFec),
                "k={k} m={m} idx={idx} repair={repair}"
            );
        }
        let mut v5 = b.clone();
        v5[2] = 5;
        assert_eq!(
            LinkPacket::new_checked(&v5[..]).err(),
            Some(HeaderError::BadVersion)
        );
    }

    #[test]
    fn stream_header_refusals() {
        let dg = |frag: u8, frags: u8, len: usize| {
            let mut d = StreamHeader {
                sequence: 7,
                frag,
                frags,
            }
            .bytes()
            .to_vec();
            d.resize(STREAM_HEADER_LEN + len, 0);
            d
        };
        assert!(StreamHeader::parse(&dg(0, 1, 0)).is_some());
        assert!(StreamHeader::parse(&dg(0, 1, MAX_MEDIA)).is_some());
        assert!(StreamHeader::parse(&dg(0, 2, MAX_MEDIA)).is_some());
        assert!(StreamHeader::parse(&dg(1, 2, 1)).is_some());
        let max = MAX_FRAGS as u8;
        assert!(StreamHeader::parse(&dg(max - 1, max, 3)).is_some());
        let last = MAX_DATAGRAM - (MAX_FRAGS - 1) * MAX_MEDIA;
        assert!(StreamHeader::parse(&dg(max - 1, max, last)).is_some());
        for (frag, frags, len) in [
            (0, 0, 10),
            (1, 1, 10),
            (0, 1, MAX_MEDIA + 1),
            (0, 2, MAX_MEDIA - 1),
            (0, max + 1, MAX_MEDIA),
            // Joined, longer than MAX_DATAGRAM.
            (max - 1, max, last + 1),
            (max - 1, max, MAX_MEDIA),
        ] {
            assert_eq!(
                StreamHeader::parse(&dg(frag, frags, len)),
                None,
                "{frag}/{frags} len {len}"
            );
        }
        for cut in 0..STREAM_HEADER_LEN {
            assert_eq!(StreamHeader::parse(&dg(0, 1, 0)[..cut]), None);
        }
        assert_eq!(fragments(0), Some(1));
        assert_eq!(fragments(MAX_MEDIA), Some(1));
        assert_eq!(fragments(MAX_MEDIA + 1), Some(2));
        assert_eq!(fragments(MAX_DATAGRAM), Some(MAX_FRAGS));
        assert_eq!(fragments(MAX_DATAGRAM + 1), None);
    }
}
