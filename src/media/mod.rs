//! Per-stream media validation: proves that what crosses on a stream route is well-formed
//! audio/video of the format negotiated for it, one packet at a time.
//!
//! Owns: the structure of the RTP payload formats that cross the boundary (MPEG-PS as
//! GB/T 28181 sends it, H.264, H.265, MPEG-TS, JPEG, G.711, AAC), the policy of what may
//! cross ([`Policy`]) and the reasons a packet is refused ([`Violation`]). Must not touch:
//! sockets, routes, counters, logs or clocks — it is sans-IO and a leaf of the crate (it
//! imports nothing of vgate). The caller hands it the UDP payload of each packet of a stream,
//! the stream's [`Stream`] state and the current monotonic time; it answers a [`Verdict`].
//! What the verdict leads to (count, drop, log the first offenders) is the caller's.
//!
//! It follows each stream's structure across packets without reassembling anything: it jumps
//! by the length fields (PES lengths, NAL sizes, AU sizes, 188-byte TS packets) and keeps only
//! what it needs to continue in the next packet ("bytes still owed to the current PES", the
//! FU in progress, the PIDs the PMT declared), so its cost is a few dozen instructions per
//! packet and it allocates nothing. The bytes it cannot vouch for (slice data, entropy-coded
//! JPEG, audio samples) are bounded by the structure around them; everything a format leaves
//! open for arbitrary data (private streams, padding, SEI user data, header extensions,
//! CSRC lists, private PIDs, adaptation-field private data) is refused or capped.
//!
//! Deny by default: a codec it does not know, a payload type that was not negotiated, a
//! packet it lost the context to check (after a loss inside a PS frame) are refused, each
//! with its own reason.
//!
//! - [`rtcp`]: RTCP compound packets, on RTCP routes and muxed on the RTP port (RFC 5761).
//! - [`rtp`]: the RTP header and the stream's progress (SSRC, sequence, timestamps).
//! - [`ps`]: MPEG program stream (pack, system header, PSM, PES) across packets.
//! - [`nal`]: H.264 (RFC 6184) and H.265 (RFC 7798) NAL units, FUs, aggregation, SEI.
//! - [`ts`]: MPEG transport stream (RFC 2250): 188-byte packets, PAT/PMT, PIDs.
//! - [`jpeg`] and [`audio`]: RFC 2435 JPEG, G.711 and RFC 3640 AAC.

mod audio;
mod jpeg;
mod nal;
mod ps;
mod rtcp;
mod rtp;
mod ts;

/// The payload format of one negotiated RTP payload type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Codec {
    /// MPEG-2 program stream (GB/T 28181 `PS/90000`).
    Ps,
    /// H.264, RFC 6184 (non-interleaved mode: single NAL, STAP-A, FU-A).
    H264,
    /// H.265, RFC 7798 (no DONL: single NAL, AP, FU).
    H265,
    /// MPEG-2 transport stream, RFC 2250 (`MP2T/90000`).
    Mp2t,
    /// JPEG, RFC 2435 (`JPEG/90000`, static payload type 26).
    Jpeg,
    /// G.711 μ-law (`PCMU/8000`, static payload type 0).
    Pcmu,
    /// G.711 A-law (`PCMA/8000`, static payload type 8).
    Pcma,
    /// AAC in RFC 3640 `mpeg4-generic`, mode AAC-hbr (13-bit sizes, 3-bit indices); also
    /// GB/T 28181-2022's `AAC/8000/1` (PT 102, `mode=AAC-hbr;sizeLength=13;indexLength=3`).
    Aac,
    /// Anything else: refused unless [`Policy::allow_unknown_codec`] (then RTP checks only).
    Unknown,
}

impl Codec {
    /// The codec for an SDP `rtpmap` encoding name (case-insensitive).
    pub fn from_rtpmap(name: &str) -> Codec {
        const NAMES: [(&str, Codec); 9] = [
            ("PS", Codec::Ps),
            ("H264", Codec::H264),
            ("H265", Codec::H265),
            ("MP2T", Codec::Mp2t),
            ("JPEG", Codec::Jpeg),
            ("PCMU", Codec::Pcmu),
            ("PCMA", Codec::Pcma),
            ("MPEG4-GENERIC", Codec::Aac),
            ("AAC", Codec::Aac),
        ];
        NAMES
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map_or(Codec::Unknown, |&(_, c)| c)
    }

    /// The codec of a static payload type (RFC 3551) that needs no `rtpmap`.
    pub fn from_static_pt(pt: u8) -> Option<(Codec, u32)> {
        match pt {
            0 => Some((Codec::Pcmu, 8000)),
            8 => Some((Codec::Pcma, 8000)),
            26 => Some((Codec::Jpeg, 90000)),
            33 => Some((Codec::Mp2t, 90000)),
            _ => None,
        }
    }

    /// The static payload type (RFC 3551) and clock rate of this codec, if it has one.
    pub fn static_pt(self) -> Option<(u8, u32)> {
        match self {
            Codec::Pcmu => Some((0, 8000)),
            Codec::Pcma => Some((8, 8000)),
            Codec::Jpeg => Some((26, 90000)),
            Codec::Mp2t => Some((33, 90000)),
            _ => None,
        }
    }

    /// Video formats: every packet of a frame has the frame's timestamp.
    fn is_video(self) -> bool {
        matches!(
            self,
            Codec::Ps | Codec::H264 | Codec::H265 | Codec::Jpeg | Codec::Mp2t
        )
    }
}

/// One payload type a stream may carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Format {
    pub pt: u8,
    pub codec: Codec,
    /// RTP clock rate (Hz), from the `rtpmap`.
    pub clock_rate: u32,
}

/// At most this many payload types per stream (one `m=` line rarely offers more).
pub const MAX_FORMATS: usize = 4;

/// What was negotiated for one stream: its payload types and, for GB/T 28181, its SSRC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamSpec {
    formats: [Format; MAX_FORMATS],
    n_formats: u8,
    /// The SSRC every packet must carry (GB/T 28181 `y=`); `None`: learnt from the first
    /// packet, then fixed.
    pub ssrc: Option<u32>,
    /// H.264/H.265: the SDP gave no parameter sets (`sprop-parameter-sets`, `sprop-vps/sps/
    /// pps`), so the first slice must follow an SPS/PPS that crossed in-band. Off (the
    /// default): slices may refer to parameter sets from the SDP until one crosses in-band.
    pub in_band_parameter_sets: bool,
    /// RTCP shares the RTP port (`a=rtcp-mux`, RFC 5761): a packet of RTCP type (192–223
    /// in the second byte) is checked as RTCP.
    pub rtcp_mux: bool,
    /// The route carries RTCP only (the RTP port + 1): every packet is checked as RTCP.
    pub rtcp: bool,
}

impl StreamSpec {
    /// A stream that carries nothing yet; add its payload types with [`StreamSpec::with`].
    pub fn new(ssrc: Option<u32>) -> StreamSpec {
        StreamSpec {
            formats: [Format {
                pt: 0,
                codec: Codec::Unknown,
                clock_rate: 0,
            }; MAX_FORMATS],
            n_formats: 0,
            ssrc,
            in_band_parameter_sets: false,
            rtcp_mux: false,
            rtcp: false,
        }
    }

    /// The stream of an RTCP route (the RTP port + 1): RTCP compound packets only.
    pub fn rtcp() -> StreamSpec {
        StreamSpec {
            rtcp: true,
            ..StreamSpec::new(None)
        }
    }

    /// Adds (or replaces) payload type `pt`. Payload types beyond [`MAX_FORMATS`] are
    /// ignored, which refuses them.
    pub fn with(mut self, pt: u8, codec: Codec, clock_rate: u32) -> StreamSpec {
        let f = Format {
            pt: pt & 0x7f,
            codec,
            clock_rate: clock_rate.max(1),
        };
        let n = usize::from(self.n_formats);
        if let Some(slot) = self.formats[..n].iter_mut().find(|x| x.pt == f.pt) {
            *slot = f;
        } else if n < MAX_FORMATS {
            self.formats[n] = f;
            self.n_formats += 1;
        }
        self
    }

    /// This spec with `other`'s flags (parameter sets, RTCP), its own formats and SSRC kept.
    pub fn flags_of(mut self, other: &StreamSpec) -> StreamSpec {
        self.in_band_parameter_sets = other.in_band_parameter_sets;
        self.rtcp_mux = other.rtcp_mux;
        self.rtcp = other.rtcp;
        self
    }

    pub fn formats(&self) -> &[Format] {
        &self.formats[..usize::from(self.n_formats)]
    }

    fn format(&self, pt: u8) -> Option<Format> {
        self.formats().iter().copied().find(|f| f.pt == pt)
    }
}

/// What may cross. The default is what the operator of a boundary wants: nothing the
/// payload formats leave open for arbitrary data, except what real encoders send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// RTP header extensions (RFC 8285). Off: nothing negotiates them on these sessions.
    pub allow_extension: bool,
    /// RTP padding (the P bit). Off: no encoder of these formats pads.
    pub allow_padding: bool,
    /// Pass a payload type whose codec the validator does not know (RTP checks only).
    pub allow_unknown_codec: bool,
    /// PS padding packets (0xBE) and TS null packets, provided every byte is 0xFF filler.
    /// On: ffmpeg's PS muxer pads its packs. Padding with any other byte is always refused.
    pub allow_filler: bool,
    /// The largest SEI user-data message (payload types 4 and 5) in bytes. The x264 and x265
    /// version banners (sent once, with the first IDR) are 0.6–2.1 KB.
    pub sei_user_data_max: u16,
    /// SEI user-data bytes a stream may carry per second of its RTP clock, all messages
    /// together (a fragmented SEI counts whole): what bounds SEI as a covert channel
    /// (8192 B/s: 64 kbit/s at most). ffmpeg's libx265 repeats its 2.3 KB banner with every
    /// IDR: this passes it at up to three IDRs a second.
    pub sei_user_data_per_s: u32,
    /// H.264 NAL unit types that may cross (bit n: type n), in single NAL units, STAP-A and
    /// FU-A. Default: slices (1, 5), SEI (6), SPS (7), PPS (8), AUD (9), end of sequence and
    /// stream (10, 11).
    pub h264_nal_types: u32,
    /// H.265 NAL unit types that may cross (bit n: type n). Default: VCL 0–9 and 16–21,
    /// VPS/SPS/PPS/AUD/EOS/EOB (32–37), prefix and suffix SEI (39, 40).
    pub h265_nal_types: u64,
    /// A changed SSRC is learnt only after the current one has been silent this long
    /// (like `security.relatch_after_ms`).
    pub ssrc_relearn_after_ms: u64,
    /// Largest forward jump of the sequence number taken as loss; beyond it the stream must
    /// continue from the new number for one more packet before it is believed.
    pub max_seq_gap: u16,
    /// Longest audio packet, in milliseconds of samples (G.711).
    pub max_audio_ptime_ms: u32,
    /// MPEG-TS: packets of a not yet declared PID accepted before the stream's first PMT
    /// (GStreamer's muxer sends 21 before its tables). Each is structure-checked, but its
    /// payload is unknown: at most this many × 184 bytes once per stream (SSRC).
    pub ts_startup_grace: u16,
    /// The `strip` action ([`Stream::check_mut`]): what a format lets a packet carry besides
    /// media and can be cut out soundly is removed from the packet instead of refusing it —
    /// MPEG-PS padding (0xBE) and private streams (0xBD, 0xBF), H.264/H.265 SEI NAL units
    /// with user data (payload types 4, 5). Everything else is checked as without it.
    pub strip: bool,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            allow_extension: false,
            allow_padding: false,
            allow_unknown_codec: false,
            allow_filler: true,
            sei_user_data_max: 2560,
            sei_user_data_per_s: 8192,
            h264_nal_types: mask(&[1, 5, 6, 7, 8, 9, 10, 11]) as u32,
            h265_nal_types: mask(&[
                0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 18, 19, 20, 21, 32, 33, 34, 35, 36, 37, 39,
                40,
            ]),
            ssrc_relearn_after_ms: 2000,
            max_seq_gap: 3000,
            max_audio_ptime_ms: 200,
            ts_startup_grace: 32,
            strip: false,
        }
    }
}

const fn mask(types: &[u8]) -> u64 {
    let mut m = 0u64;
    let mut i = 0;
    while i < types.len() {
        m |= 1 << types[i];
        i += 1;
    }
    m
}

/// What a route asks of the validator: the stream that was negotiated (or configured), the
/// policy, and whether a violation drops the packet (`enforce`) or is only counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    pub enforce: bool,
    pub spec: StreamSpec,
    pub policy: Policy,
}

/// The validator's answer for one packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Well-formed: it may cross.
    Pass,
    /// Refused, for this reason. The stream's state treats the packet as lost, so a caller
    /// that drops it stays in step with what the receiver sees; a caller that only counts
    /// (and forwards it) loses nothing but the check of the rest of that frame.
    Drop(Violation),
    /// [`Policy::strip`]: well-formed once what `reason` names was cut out; the packet was
    /// rewritten in place and is now `len` bytes long (its RTP header unchanged but for the
    /// sequence number, see [`Stream::check_mut`]).
    Strip { len: usize, reason: Violation },
    /// [`Policy::strip`]: the whole payload was what `reason` names; nothing is left to
    /// forward. The stream's state counts it as received (the next packet follows it).
    StrippedAway(Violation),
}

impl Verdict {
    pub fn is_pass(self) -> bool {
        self == Verdict::Pass
    }
}

macro_rules! violations {
    ($( $(#[doc = $doc:literal])* $v:ident = $name:literal, )*) => {
        /// Why a packet was refused: one counter (`media_invalid{reason}`) each.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum Violation {
            $( $(#[doc = $doc])* $v, )*
        }

        impl Violation {
            pub const ALL: &'static [Violation] = &[$(Violation::$v),*];
            pub const COUNT: usize = Self::ALL.len();
            /// What the strip action cuts ([`Policy::strip`]), the reasons of
            /// [`Verdict::Strip`] and [`Verdict::StrippedAway`].
            pub const STRIPPED: &'static [Violation] = &[
                Violation::PsPadding,
                Violation::PsPrivateStream,
                Violation::SeiUserData,
            ];

            /// snake_case name, for metrics labels and drop counters.
            pub fn name(self) -> &'static str {
                match self { $(Violation::$v => $name,)* }
            }
        }
    };
}

violations! {
    /// Shorter than an RTP header, or a CSRC list / extension / padding reaching past the end.
    RtpTruncated = "rtp_truncated",
    /// RTP version is not 2.
    RtpVersion = "rtp_version",
    /// A payload type that was not negotiated for this stream.
    PayloadType = "payload_type",
    /// A CSRC list (no mixer sits in front of a camera).
    Csrc = "csrc",
    /// An RTP header extension the policy does not allow.
    Extension = "extension",
    /// RTP padding the policy does not allow, or a padding count larger than the payload.
    Padding = "padding",
    /// An RTP packet with no payload.
    EmptyPayload = "empty_payload",
    /// The SSRC is not the negotiated one (GB/T 28181 `y=`).
    SsrcMismatch = "ssrc_mismatch",
    /// The SSRC changed while the learnt one was still alive.
    SsrcChanged = "ssrc_changed",
    /// The sequence number jumped further than a loss explains.
    SeqJump = "seq_jump",
    /// A duplicate or a late (reordered) sequence number.
    SeqOutOfOrder = "seq_out_of_order",
    /// The timestamp moved implausibly for the clock rate (more than 10 s ahead or 1 s back).
    TimestampJump = "timestamp_jump",
    /// Video: the timestamp changed inside a frame, or stayed the same across frames.
    FrameTimestamp = "frame_timestamp",
    /// After a loss, a packet that cannot be checked without what was lost (the middle of a
    /// PS frame, an SEI fragment).
    LostSync = "lost_sync",
    /// PS: no frame has started since the stream's first packet (random bytes from the
    /// start, or a stream joined mid-frame): nothing can be checked before a pack header.
    NoFrameStart = "no_frame_start",
    /// A codec the validator does not know, refused by policy.
    UnknownCodec = "unknown_codec",
    /// PS: a pack header that is not MPEG-2 (marker bits), or its stuffing is not 0xFF.
    PsPackHeader = "ps_pack_header",
    /// PS: a malformed system header, or one that lists a stream that may not cross.
    PsSystemHeader = "ps_system_header",
    /// PS: a malformed program stream map.
    PsPsm = "ps_psm",
    /// PS: the PSM declares a stream type outside the GB/T 28181 table.
    PsStreamType = "ps_stream_type",
    /// PS: a malformed PES header (not MPEG-2, scrambled, lengths that do not add up, PES
    /// private data, stuffing that is not 0xFF).
    PsPesHeader = "ps_pes_header",
    /// PS: a PES with length 0 (unbounded), which a program stream may not carry.
    PsPesUnbounded = "ps_pes_unbounded",
    /// PS: private stream 1 or 2 (0xBD, 0xBF).
    PsPrivateStream = "ps_private_stream",
    /// PS: a padding stream (0xBE) with data in it, or padding refused by policy.
    PsPadding = "ps_padding",
    /// PS: a stream ID or start code that is neither video, audio nor PS structure.
    PsUnknownStream = "ps_unknown_stream",
    /// PS: bytes where a start code must be.
    PsNoStartCode = "ps_no_start_code",
    /// PS: a system header or PSM too long to follow across an RTP packet boundary.
    PsHeaderSplit = "ps_header_split",
    /// PS: a frame that does not start with a pack header, or ends inside a PES.
    PsFrame = "ps_frame",
    /// H.264/H.265: the forbidden_zero_bit is set.
    NalForbiddenBit = "nal_forbidden_bit",
    /// A NAL header against its type's rules: H.265 temporal ID 0, a layer other than 0, or a
    /// temporal ID its type forbids (IRAP, VPS, SPS, EOS/EOB above 0; TSA/STSA at 0); H.264
    /// an IDR slice or parameter set with nal_ref_idc 0, or SEI/AUD/end units with one.
    NalHeader = "nal_header",
    /// A NAL unit whose type fixes its size (AUD, end of sequence/stream) of another size, or
    /// a parameter set longer than 256 bytes.
    NalLength = "nal_length",
    /// A slice whose header is out of range (H.264 first_mb_in_slice, slice_type,
    /// pic_parameter_set_id; an IDR slice not I/SI; H.265 slice_pic_parameter_set_id), or that
    /// does not follow the access unit's slices (the first not at the picture's start; H.264
    /// slices out of order without Baseline's arbitrary slice order).
    NalSliceHeader = "nal_slice_header",
    /// A malformed SPS/PPS/VPS: profile, level, ids or sizes out of range.
    NalParameterSet = "nal_parameter_set",
    /// A slice referring to a picture parameter set that did not cross in-band (once one
    /// did), or a slice before any where the SDP gave none.
    NalUnknownParameterSet = "nal_unknown_parameter_set",
    /// H.264/H.265: a NAL unit (or packet) type outside the allow-list.
    NalType = "nal_type",
    /// H.264/H.265: fragmentation units whose start/end bits or types do not follow.
    NalFragment = "nal_fragment",
    /// H.264/H.265: an aggregation packet whose sizes do not add up.
    NalAggregation = "nal_aggregation",
    /// SEI user data larger than the policy allows, per message or per second.
    SeiUserData = "sei_user_data",
    /// A malformed SEI message (sizes past the end of the NAL unit, filler that is not 0xFF).
    SeiMalformed = "sei_malformed",
    /// An SEI payload type outside the allow-list (timing, pan-scan, filler, user data,
    /// recovery point, frame packing, colour volume, decoded picture hash, ...).
    SeiPayloadType = "sei_payload_type",
    /// RTCP: a compound packet whose lengths do not add up to the datagram, a report whose
    /// size is not its report blocks', misplaced padding, a malformed BYE, feedback or XR.
    RtcpMalformed = "rtcp_malformed",
    /// RTCP: a compound packet that does not start with an SR or RR.
    RtcpFirst = "rtcp_first",
    /// RTCP: a packet type outside 200–207, or a feedback message or XR block type that may
    /// not cross (application-layer feedback).
    RtcpType = "rtcp_type",
    /// RTCP: SDES items malformed, of a type that may not cross (PRIV), or with control bytes.
    RtcpSdes = "rtcp_sdes",
    /// RTCP: an APP packet (free-form application data).
    RtcpApp = "rtcp_app",
    /// TS: the payload is not a whole number of 188-byte packets.
    TsSize = "ts_size",
    /// TS: a packet without the 0x47 sync byte.
    TsSync = "ts_sync",
    /// TS: transport_error_indicator set.
    TsError = "ts_error",
    /// TS: scrambled content, which cannot be checked.
    TsScrambled = "ts_scrambled",
    /// TS: a malformed adaptation field, private data in it, or stuffing that is not 0xFF.
    TsAdaptation = "ts_adaptation",
    /// TS: a malformed or split PAT/PMT/SDT section, or one that changed too often.
    TsPsi = "ts_psi",
    /// TS: a PES of an elementary stream that does not start like one.
    TsPes = "ts_pes",
    /// TS: a PID the PMT declared with a private (non audio/video) stream type.
    TsPrivatePid = "ts_private_pid",
    /// TS: a PID neither the PAT nor the PMT declared.
    TsUnknownPid = "ts_unknown_pid",
    /// TS: a null packet whose payload is not 0xFF filler.
    TsNullData = "ts_null_data",
    /// JPEG: a malformed RFC 2435 header (type, Q, size, quantization tables).
    JpegHeader = "jpeg_header",
    /// JPEG: a fragment offset that does not follow the previous fragment.
    JpegOffset = "jpeg_offset",
    /// Audio: a packet size implausible for the clock rate and packet time.
    AudioSize = "audio_size",
    /// Audio: a timestamp that does not advance by the samples of the previous packet.
    AudioTimestamp = "audio_timestamp",
    /// AAC: AU headers whose sizes do not add up to the payload.
    AacAuHeaders = "aac_au_headers",
}

/// What is left of a PS packet with the marker bit that the strip action emptied: a padding
/// unit of no bytes.
const PS_STUB: [u8; 6] = [0, 0, 1, 0xbe, 0, 0];

/// At most this many byte ranges are cut out of one packet; a packet that needs more is
/// refused with the reason of the cut that did not fit.
pub const MAX_CUTS: usize = 8;

/// The byte ranges of one packet's RTP payload that the strip action removes, in order.
/// Without [`Policy::strip`] (or on a packet that cannot be rewritten) a cut is refused
/// with its reason, which is exactly what `enforce` does with the same bytes.
#[derive(Clone, Copy, Debug)]
struct Cuts {
    strip: bool,
    ranges: [(u16, u16); MAX_CUTS],
    n: u8,
    reason: Option<Violation>,
}

impl Cuts {
    fn new(strip: bool) -> Cuts {
        Cuts {
            strip,
            ranges: [(0, 0); MAX_CUTS],
            n: 0,
            reason: None,
        }
    }

    /// Cuts payload bytes `start..end` (offsets into the RTP payload, after any earlier
    /// cut), or refuses the packet with `why`.
    fn cut(&mut self, start: usize, end: usize, why: Violation) -> Result<(), Violation> {
        if !self.strip {
            return Err(why);
        }
        if start >= end {
            return Ok(());
        }
        let (s, e) = (start as u16, end as u16);
        let n = usize::from(self.n);
        self.reason.get_or_insert(why);
        match self.ranges[..n].last_mut() {
            Some(last) if last.1 == s => last.1 = e,
            Some(last) if last.1 > s => return Err(why),
            _ if n == MAX_CUTS => return Err(why),
            _ => {
                self.ranges[n] = (s, e);
                self.n += 1;
            }
        }
        Ok(())
    }

    /// Cuts the whole payload (`len` bytes), whatever was cut before.
    fn all(&mut self, len: usize, why: Violation) -> Result<(), Violation> {
        self.n = 0;
        self.cut(0, len, why)
    }

    fn ranges(&self) -> &[(u16, u16)] {
        &self.ranges[..usize::from(self.n)]
    }

    /// Bytes cut.
    fn bytes(&self) -> usize {
        self.ranges().iter().map(|&(s, e)| usize::from(e - s)).sum()
    }
}

/// What the codec checks learn from the RTP layer about one packet.
#[derive(Clone, Copy, Debug)]
struct RtpInfo {
    marker: bool,
    timestamp: u32,
    clock_rate: u32,
    /// Packets were lost (or refused) since the previous accepted one: cross-packet state
    /// may be stale.
    gap: bool,
    /// The previous accepted packet had the marker bit (for video: it ended a frame).
    prev_marker: bool,
    /// Timestamp minus the previous accepted packet's (wrapping), if there was one.
    ts_delta: Option<i32>,
    /// Payload length of the previous accepted packet.
    prev_len: usize,
}

/// Per-codec state carried from one packet to the next.
#[derive(Clone, Debug)]
enum CodecState {
    None,
    Ps(ps::PsState),
    Nal(nal::NalState),
    Ts(ts::TsState),
    Jpeg(jpeg::JpegState),
    Aac,
    G711,
}

/// One stream: what was negotiated and what has been seen. About 200 bytes; no heap.
#[derive(Clone, Debug)]
pub struct Stream {
    spec: StreamSpec,
    rtp: rtp::RtpState,
    /// The payload type the codec state belongs to.
    codec_pt: Option<u8>,
    codec: CodecState,
    /// Packets stripped away so far: subtracted from every forwarded packet's sequence
    /// number, so the receiver sees a continuous sequence ([`Stream::check_mut`]).
    seq_shift: u16,
}

impl Stream {
    pub fn new(spec: StreamSpec) -> Stream {
        Stream {
            spec,
            rtp: rtp::RtpState::default(),
            codec_pt: None,
            codec: CodecState::None,
            seq_shift: 0,
        }
    }

    pub fn spec(&self) -> &StreamSpec {
        &self.spec
    }

    /// Times the SSRC changed and was re-learnt after the old one fell silent.
    pub fn ssrc_changes(&self) -> u64 {
        self.rtp.ssrc_changes
    }

    /// Checks one RTP packet (the UDP payload) received at `now_ms` (any monotonic
    /// milliseconds; only differences are used). A packet that cannot be rewritten is never
    /// stripped: under [`Policy::strip`] what would be cut is refused, as without it.
    pub fn check(&mut self, policy: &Policy, packet: &[u8], now_ms: u64) -> Verdict {
        let mut cuts = Cuts::new(false);
        match self.check_inner(policy, packet, now_ms, &mut cuts) {
            Ok(_) => Verdict::Pass,
            Err(v) => Verdict::Drop(v),
        }
    }

    /// Checks one RTP packet like [`Stream::check`] and, under [`Policy::strip`], rewrites it
    /// in place: the bytes the strip action removes are cut out (the rest moved up, RTP
    /// padding included), and a packet left without payload is [`Verdict::StrippedAway`]
    /// (except the last packet of a PS frame, which keeps the marker bit and an empty
    /// padding unit, `00 00 01 BE 00 00`).
    /// The packets forwarded after a packet stripped away have their sequence number
    /// lowered by the number stripped away so far, so the receiver sees no loss that did
    /// not happen (a real loss stays a gap). No allocation: the moves are `copy_within`.
    pub fn check_mut(&mut self, policy: &Policy, packet: &mut [u8], now_ms: u64) -> Verdict {
        let mut cuts = Cuts::new(policy.strip);
        let (start, payload_len) = match self.check_inner(policy, packet, now_ms, &mut cuts) {
            Ok(at) => at,
            Err(v) => return Verdict::Drop(v),
        };
        let Some(reason) = cuts.reason else {
            self.shift_seq(packet);
            return Verdict::Pass;
        };
        if cuts.bytes() >= payload_len {
            let ps = matches!(self.codec, CodecState::Ps(_));
            if ps && packet[1] & 0x80 != 0 && payload_len >= PS_STUB.len() {
                // The frame's last packet: dropping it would take the marker with it, so
                // it keeps an empty padding unit (6 bytes that carry nothing) and no RTP
                // padding.
                packet[0] &= !0x20;
                packet[start..start + PS_STUB.len()].copy_from_slice(&PS_STUB);
                self.shift_seq(packet);
                return Verdict::Strip {
                    len: start + PS_STUB.len(),
                    reason,
                };
            }
            self.seq_shift = self.seq_shift.wrapping_add(1);
            return Verdict::StrippedAway(reason);
        }
        let mut w = start + usize::from(cuts.ranges()[0].0);
        let r = cuts.ranges();
        for (i, &(_, e)) in r.iter().enumerate() {
            let from = start + usize::from(e);
            let to = r
                .get(i + 1)
                .map_or(packet.len(), |n| start + usize::from(n.0));
            packet.copy_within(from..to, w);
            w += to - from;
        }
        self.shift_seq(packet);
        Verdict::Strip { len: w, reason }
    }

    fn shift_seq(&self, packet: &mut [u8]) {
        if self.seq_shift != 0 && !(self.spec.rtcp || (self.spec.rtcp_mux && rtcp::is_rtcp(packet)))
        {
            let seq = u16::from_be_bytes([packet[2], packet[3]]).wrapping_sub(self.seq_shift);
            packet[2..4].copy_from_slice(&seq.to_be_bytes());
        }
    }

    /// Returns where the RTP payload starts in `pkt` and its length; the cuts are offsets
    /// into it.
    fn check_inner(
        &mut self,
        policy: &Policy,
        pkt: &[u8],
        now_ms: u64,
        cuts: &mut Cuts,
    ) -> Result<(usize, usize), Violation> {
        if self.spec.rtcp || (self.spec.rtcp_mux && rtcp::is_rtcp(pkt)) {
            return rtcp::check(pkt).map(|()| (0, pkt.len()));
        }
        let h = rtp::Header::parse(pkt, policy)?;
        let format = self.spec.format(h.pt).ok_or(Violation::PayloadType)?;
        if self
            .rtp
            .check_ssrc(h.ssrc, self.spec.ssrc, policy, now_ms)?
        {
            // Re-learnt after silence: a new stream from scratch.
            self.codec_pt = None;
        }
        let info = self.rtp.progress(&h, format, policy)?;
        if self.codec_pt != Some(h.pt) {
            self.codec_pt = Some(h.pt);
            self.codec = match format.codec {
                Codec::Ps => CodecState::Ps(ps::PsState::default()),
                Codec::H264 | Codec::H265 => {
                    CodecState::Nal(nal::NalState::new(self.spec.in_band_parameter_sets))
                }
                Codec::Mp2t => CodecState::Ts(ts::TsState::default()),
                Codec::Jpeg => CodecState::Jpeg(jpeg::JpegState::default()),
                Codec::Aac => CodecState::Aac,
                Codec::Pcmu | Codec::Pcma => CodecState::G711,
                Codec::Unknown => CodecState::None,
            };
        }
        let payload = h.payload;
        let r = match (&mut self.codec, format.codec) {
            (CodecState::Ps(s), _) => s.check(payload, &info, policy, cuts),
            (CodecState::Nal(s), Codec::H264) => s.check_h264(payload, &info, policy, cuts),
            (CodecState::Nal(s), _) => s.check_h265(payload, &info, policy, cuts),
            (CodecState::Ts(s), _) => s.check(payload, &info, policy),
            (CodecState::Jpeg(s), _) => s.check(payload, &info),
            (CodecState::Aac, _) => audio::check_aac(payload),
            (CodecState::G711, _) => audio::check_g711(payload, &info, policy),
            (CodecState::None, _) if policy.allow_unknown_codec => Ok(()),
            (CodecState::None, _) => Err(Violation::UnknownCodec),
        };
        // A refused packet is not recorded: to the next one it is a loss, and the codec
        // state resynchronises as after any loss.
        r?;
        self.rtp.accept(&h, payload.len(), now_ms);
        Ok((
            payload.as_ptr() as usize - pkt.as_ptr() as usize,
            payload.len(),
        ))
    }
}

/// A forward-only reader over bytes, used by the parsers: reads past the end yield `None`.
#[derive(Clone, Copy)]
struct Bytes<'a> {
    b: &'a [u8],
}

impl<'a> Bytes<'a> {
    fn new(b: &'a [u8]) -> Self {
        Bytes { b }
    }
    fn u8(&mut self) -> Option<u8> {
        let (&x, rest) = self.b.split_first()?;
        self.b = rest;
        Some(x)
    }
    fn u16(&mut self) -> Option<u16> {
        let x = self.b.get(..2)?;
        let v = u16::from_be_bytes([x[0], x[1]]);
        self.b = &self.b[2..];
        Some(v)
    }
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.b.len() {
            return None;
        }
        let (x, rest) = self.b.split_at(n);
        self.b = rest;
        Some(x)
    }
    fn rest(&self) -> &'a [u8] {
        self.b
    }
    fn is_empty(&self) -> bool {
        self.b.is_empty()
    }
}

/// Whether every byte is 0xFF (padding and stuffing bytes), eight at a time.
fn all_ff(b: &[u8]) -> bool {
    let mut c = b.chunks_exact(8);
    let words = c.by_ref().all(|w| w == [0xff; 8]);
    words && c.remainder().iter().all(|&x| x == 0xff)
}
