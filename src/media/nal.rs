//! H.264 (RFC 6184, non-interleaved mode) and H.265 (RFC 7798, without DONL) RTP payloads:
//! NAL headers (forbidden bit, types from the allow-list), single NAL units, aggregation
//! packets whose sizes add up exactly (STAP-A, AP), fragmentation units whose start/end bits
//! and types follow one another (FU-A, FU), and SEI messages: user data (payload types 4 and
//! 5) capped per message and per second of the stream's clock, other payload types from an
//! allow-list (filler only of 0xFF).
//!
//! The start of every NAL unit is parsed as far as it is cheap and needs nothing the stream
//! has not shown: the NAL header rules (H.264 `nal_ref_idc`, H.265 layer and `TemporalId`),
//! the fixed sizes of AUD and end-of-sequence/stream units, the parameter sets' ids, profile
//! and level ranges (H.264 SPS/PPS, H.265 VPS/SPS/PPS), and the head of each slice (single
//! NAL or the start fragment of an FU): H.264 `first_mb_in_slice`, `slice_type`,
//! `pic_parameter_set_id` (Exp-Golomb, in range; an IDR slice is I or SI), H.265
//! `first_slice_segment_in_pic_flag` and `slice_pic_parameter_set_id`. Across the slices of
//! one access unit (one RTP timestamp, after a marker): the first starts the picture
//! (`first_mb_in_slice` 0, `first_slice_segment_in_pic_flag` 1) and, for H.264, the next
//! ones start further on (no arbitrary slice order, which only Baseline allows: not checked
//! after a Baseline SPS). Once a parameter set has crossed in-band a slice may only refer to
//! one that did; with [`super::StreamSpec::in_band_parameter_sets`] (no `sprop-*` in the
//! SDP) a slice before any is refused. A few dozen instructions per slice, no allocation.

use super::{Cuts, Policy, RtpInfo, Violation};

#[derive(Clone, Debug, Default)]
pub(super) struct NalState {
    /// A fragmented NAL unit is in progress: its type.
    fu: Option<u8>,
    /// Bytes of the SEI NAL unit being fragmented so far.
    fu_sei_bytes: u32,
    /// The fragmented NAL unit is an SEI with user data that the strip action removes:
    /// every one of its fragments is stripped away.
    fu_cut: bool,
    /// Start (RTP timestamp) of the current one-second window of SEI user data.
    sei_window: Option<u32>,
    sei_window_bytes: u32,
    /// Picture parameter set ids seen in-band (bit n: id n; H.264 up to 255, H.265 up to 63).
    pps: [u64; 4],
    /// A picture parameter set crossed in-band: slices must refer to one of `pps`.
    pps_seen: bool,
    /// A Baseline SPS (without constraint_set1) crossed: arbitrary slice order is allowed.
    aso: bool,
    /// Where the current access unit is.
    au: Au,
    /// Parameter sets must have crossed in-band before the first slice.
    in_band: bool,
}

/// The slices of the current access unit so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Au {
    /// Not known (the stream's first packet, or after a loss).
    #[default]
    Unknown,
    /// A new access unit started (after a marker) and has no slice yet.
    Fresh,
    /// Slices seen; H.264: the last one's first_mb_in_slice.
    Slices(u32),
}

/// The largest H.264 frame in macroblocks (level 6.2 MaxFS: 8192×4320) and H.265 PPS/SPS
/// id limits.
const MAX_MBS: u32 = 139_264;
/// Parameter sets longer than this are not what encoders send (an SPS with VUI and HRD is
/// well under 100 bytes).
const MAX_PARAMETER_SET: usize = 256;

#[derive(Clone, Copy)]
enum Kind {
    H264,
    H265,
}

impl Kind {
    fn header_len(self) -> usize {
        match self {
            Kind::H264 => 1,
            Kind::H265 => 2,
        }
    }

    /// The type of the NAL unit whose header starts `h` (checked), for NAL units that stand
    /// for themselves (not packet types).
    fn nal_type(self, h: &[u8], policy: &Policy) -> Result<u8, Violation> {
        let t = self.header(h)?;
        let allowed = match self {
            Kind::H264 => t < 24 && policy.h264_nal_types & (1 << t) != 0,
            Kind::H265 => t < 48 && policy.h265_nal_types & (1 << t) != 0,
        };
        if !allowed {
            return Err(Violation::NalType);
        }
        match self {
            Kind::H264 => {
                // §7.4.1: parameter sets and IDR slices are references, SEI, AUD and end of
                // sequence/stream never.
                let nri = (h[0] >> 5) & 3;
                let bad = match t {
                    5 | 7 | 8 => nri == 0,
                    6 | 9..=12 => nri != 0,
                    _ => false,
                };
                if bad {
                    return Err(Violation::NalHeader);
                }
            }
            Kind::H265 => {
                // §7.4.2.2: TemporalId 0 for IRAP pictures, VPS, SPS, EOS and EOB; never 0
                // for TSA and (base layer) STSA pictures.
                let tid = (h[1] & 7) - 1;
                let bad = match t {
                    16..=23 | 32 | 33 | 36 | 37 => tid != 0,
                    2..=5 => tid == 0,
                    _ => false,
                };
                if bad {
                    return Err(Violation::NalHeader);
                }
            }
        }
        Ok(t)
    }

    fn is_vcl(self, t: u8) -> bool {
        match self {
            Kind::H264 => t == 1 || t == 5,
            Kind::H265 => t < 32,
        }
    }

    /// Forbidden bit (and for H.265 layer and temporal ID) of a NAL or payload header;
    /// returns its type field.
    fn header(self, h: &[u8]) -> Result<u8, Violation> {
        let b0 = *h.first().ok_or(Violation::NalAggregation)?;
        if b0 & 0x80 != 0 {
            return Err(Violation::NalForbiddenBit);
        }
        match self {
            Kind::H264 => Ok(b0 & 0x1f),
            Kind::H265 => {
                let b1 = *h.get(1).ok_or(Violation::NalAggregation)?;
                // nuh_layer_id 0 (no layered coding negotiated), nuh_temporal_id_plus1 > 0.
                if b0 & 0x01 != 0 || b1 & 0xf8 != 0 || b1 & 0x07 == 0 {
                    return Err(Violation::NalHeader);
                }
                Ok((b0 >> 1) & 0x3f)
            }
        }
    }

    fn is_sei(self, t: u8) -> bool {
        match self {
            Kind::H264 => t == 6,
            Kind::H265 => t == 39 || t == 40,
        }
    }

    /// (aggregation, fragmentation) packet types.
    fn packet_types(self) -> (u8, u8) {
        match self {
            Kind::H264 => (24, 28),
            Kind::H265 => (48, 49),
        }
    }
}

impl NalState {
    /// `in_band`: the SDP gave no parameter sets (`sprop-*`), so a slice may only follow
    /// ones that crossed in-band.
    pub fn new(in_band: bool) -> NalState {
        NalState {
            pps_seen: false,
            in_band,
            ..NalState::default()
        }
    }

    pub fn check_h264(
        &mut self,
        p: &[u8],
        rtp: &RtpInfo,
        pol: &Policy,
        cuts: &mut Cuts,
    ) -> Result<(), Violation> {
        self.check(Kind::H264, p, rtp, pol, cuts)
    }

    pub fn check_h265(
        &mut self,
        p: &[u8],
        rtp: &RtpInfo,
        pol: &Policy,
        cuts: &mut Cuts,
    ) -> Result<(), Violation> {
        self.check(Kind::H265, p, rtp, pol, cuts)
    }

    /// Checks one RTP payload; under the strip action, SEI NAL units with user data are
    /// added to `cuts`: a single NAL unit or every fragment of a fragmented one whole, an
    /// aggregation packet's unit with its size field (the others' sizes stay right).
    fn check(
        &mut self,
        k: Kind,
        p: &[u8],
        rtp: &RtpInfo,
        pol: &Policy,
        cuts: &mut Cuts,
    ) -> Result<(), Violation> {
        if rtp.gap {
            // The end of a fragmented NAL unit may have been lost, and the start of the
            // access unit.
            self.fu = None;
            self.fu_cut = false;
            self.au = Au::Unknown;
        } else if rtp.prev_marker {
            self.au = Au::Fresh;
        }
        let t = k.header(p)?;
        let (aggregation, fragmentation) = k.packet_types();
        let hl = k.header_len();
        if t == fragmentation {
            if self.fragment(k, p, rtp, pol, cuts.strip)? {
                cuts.cut(0, p.len(), Violation::SeiUserData)?;
            }
        } else {
            if self.fu.is_some() {
                return Err(Violation::NalFragment);
            }
            if t == aggregation {
                let mut rest = p.get(hl..).ok_or(Violation::NalAggregation)?;
                let mut at = hl;
                if rest.is_empty() {
                    return Err(Violation::NalAggregation);
                }
                while !rest.is_empty() {
                    let n = match rest {
                        [a, b, ..] => usize::from(u16::from_be_bytes([*a, *b])),
                        _ => return Err(Violation::NalAggregation),
                    };
                    let nal = rest.get(2..2 + n).ok_or(Violation::NalAggregation)?;
                    if n < hl {
                        return Err(Violation::NalAggregation);
                    }
                    if self.single(k, nal, rtp, pol, cuts.strip)? {
                        cuts.cut(at, at + 2 + n, Violation::SeiUserData)?;
                    }
                    rest = &rest[2 + n..];
                    at += 2 + n;
                }
                if cuts.bytes() == p.len() - hl {
                    // Nothing left to aggregate: the packet goes whole.
                    cuts.all(p.len(), Violation::SeiUserData)?;
                }
            } else if self.single(k, p, rtp, pol, cuts.strip)? {
                cuts.cut(0, p.len(), Violation::SeiUserData)?;
            }
        }
        if rtp.marker && self.fu.is_some() {
            // The access unit ended inside a NAL unit.
            return Err(Violation::NalFragment);
        }
        Ok(())
    }

    /// One whole NAL unit; `Ok(true)`: an SEI with user data that the strip action (`strip`)
    /// removes.
    fn single(
        &mut self,
        k: Kind,
        nal: &[u8],
        rtp: &RtpInfo,
        pol: &Policy,
        strip: bool,
    ) -> Result<bool, Violation> {
        let t = k.nal_type(nal, pol)?;
        let hl = k.header_len();
        if nal.len() < hl {
            return Err(Violation::NalAggregation);
        }
        let body = &nal[hl..];
        if k.is_sei(t) {
            return self.sei(body, true, rtp, pol, strip);
        }
        if k.is_vcl(t) {
            return self.slice(k, t, body).map(|()| false);
        }
        let fixed = |n: usize| {
            // AUD: 3 bits of picture type, then the trailing bits; EOS/EOB: nothing.
            if body.len() != n || (n == 1 && body[0] & 0x1f != 0x10) {
                Err(Violation::NalLength)
            } else {
                Ok(())
            }
        };
        let r = match (k, t) {
            (Kind::H264, 9) | (Kind::H265, 35) => fixed(1),
            (Kind::H264, 10 | 11) | (Kind::H265, 36 | 37) => fixed(0),
            (Kind::H264, 7 | 8) | (Kind::H265, 32..=34) if body.len() > MAX_PARAMETER_SET => {
                Err(Violation::NalLength)
            }
            (Kind::H264, 7) => self.h264_sps(body),
            (Kind::H264, 8) => self.h264_pps(body),
            (Kind::H265, 32) => h265_vps(body),
            (Kind::H265, 33) => h265_sps(body),
            (Kind::H265, 34) => self.h265_pps(body),
            // Types the policy allows beyond these (data partitions, ...): header only.
            _ => Ok(()),
        };
        r.map(|()| false)
    }

    /// The head of a slice (the RBSP after the NAL header; complete or a start fragment).
    fn slice(&mut self, k: Kind, t: u8, body: &[u8]) -> Result<(), Violation> {
        let mut b = Bits::new(body);
        let bad = Violation::NalSliceHeader;
        let (first, pps) = match k {
            Kind::H264 => {
                let first_mb = b.ue().filter(|&v| v < MAX_MBS).ok_or(bad)?;
                let slice_type = b.ue().filter(|&v| v <= 9).ok_or(bad)?;
                let pps = b.ue().filter(|&v| v <= 255).ok_or(bad)?;
                // An IDR picture has only I or SI slices (§7.4.3).
                if t == 5 && !matches!(slice_type % 5, 2 | 4) {
                    return Err(bad);
                }
                (first_mb, pps)
            }
            Kind::H265 => {
                let first = b.bit().ok_or(bad)?;
                if (16..=23).contains(&t) {
                    b.bit().ok_or(bad)?; // no_output_of_prior_pics_flag
                }
                let pps = b.ue().filter(|&v| v <= 63).ok_or(bad)?;
                // As an address: 0 for the first segment of the picture, else "later".
                (u32::from(first == 0), pps)
            }
        };
        let known = self.pps[(pps / 64) as usize] & (1 << (pps % 64)) != 0;
        if (self.pps_seen && !known) || (self.in_band && !self.pps_seen) {
            return Err(Violation::NalUnknownParameterSet);
        }
        let in_order = match self.au {
            Au::Unknown => true,
            Au::Fresh => first == 0,
            Au::Slices(prev) => match k {
                Kind::H264 => first > prev,
                Kind::H265 => first != 0,
            },
        };
        if !in_order && !self.aso {
            return Err(bad);
        }
        self.au = Au::Slices(first);
        Ok(())
    }

    /// H.264 SPS (§7.3.2.1.1) up to the frame size, where it is cheap to follow.
    fn h264_sps(&mut self, body: &[u8]) -> Result<(), Violation> {
        const PROFILES: [u32; 16] = [
            66, 77, 88, 100, 110, 122, 244, 44, 83, 86, 118, 128, 138, 139, 134, 135,
        ];
        const LEVELS: [u32; 20] = [
            9, 10, 11, 12, 13, 20, 21, 22, 30, 31, 32, 40, 41, 42, 50, 51, 52, 60, 61, 62,
        ];
        let bad = Violation::NalParameterSet;
        let mut b = Bits::new(body);
        let profile = b.bits(8).ok_or(bad)?;
        let constraints = b.bits(8).ok_or(bad)?;
        let level = b.bits(8).ok_or(bad)?;
        if !PROFILES.contains(&profile) || constraints & 3 != 0 || !LEVELS.contains(&level) {
            return Err(bad);
        }
        b.ue().filter(|&v| v <= 31).ok_or(bad)?;
        if profile == 66 && constraints & 0x40 == 0 {
            // Baseline proper (not constrained): arbitrary slice order may follow.
            self.aso = true;
        }
        if !matches!(profile, 66 | 77 | 88) {
            let chroma = b.ue().filter(|&v| v <= 3).ok_or(bad)?;
            if chroma == 3 {
                b.bit().ok_or(bad)?;
            }
            b.ue().filter(|&v| v <= 6).ok_or(bad)?; // bit_depth_luma_minus8
            b.ue().filter(|&v| v <= 6).ok_or(bad)?; // bit_depth_chroma_minus8
            b.bit().ok_or(bad)?;
            if b.bit().ok_or(bad)? == 1 {
                // Scaling lists follow: the ranges above are what is checked.
                return Ok(());
            }
        }
        b.ue().filter(|&v| v <= 12).ok_or(bad)?; // log2_max_frame_num_minus4
        match b.ue().filter(|&v| v <= 2).ok_or(bad)? {
            0 => {
                b.ue().filter(|&v| v <= 12).ok_or(bad)?;
            }
            1 => return Ok(()), // offset cycles follow
            _ => {}
        }
        b.ue().filter(|&v| v <= 16).ok_or(bad)?; // max_num_ref_frames
        b.bit().ok_or(bad)?;
        let w = b.ue().filter(|&v| v < 1024).ok_or(bad)? + 1;
        let h = b.ue().filter(|&v| v < 1024).ok_or(bad)? + 1;
        let frame_mbs_only = b.bit().ok_or(bad)?;
        if w * h * (2 - frame_mbs_only) > MAX_MBS {
            return Err(bad);
        }
        Ok(())
    }

    /// H.264 PPS (§7.3.2.2): its ids and slice groups.
    fn h264_pps(&mut self, body: &[u8]) -> Result<(), Violation> {
        let bad = Violation::NalParameterSet;
        let mut b = Bits::new(body);
        let id = b.ue().filter(|&v| v <= 255).ok_or(bad)?;
        b.ue().filter(|&v| v <= 31).ok_or(bad)?;
        b.bits(2).ok_or(bad)?;
        b.ue().filter(|&v| v <= 7).ok_or(bad)?; // num_slice_groups_minus1
        self.pps_add(id);
        Ok(())
    }

    /// H.265 PPS (§7.3.2.3.1): its ids.
    fn h265_pps(&mut self, body: &[u8]) -> Result<(), Violation> {
        let bad = Violation::NalParameterSet;
        let mut b = Bits::new(body);
        let id = b.ue().filter(|&v| v <= 63).ok_or(bad)?;
        b.ue().filter(|&v| v <= 15).ok_or(bad)?;
        self.pps_add(id);
        Ok(())
    }

    fn pps_add(&mut self, id: u32) {
        self.pps[(id / 64) as usize] |= 1 << (id % 64);
        self.pps_seen = true;
    }

    /// One fragmentation unit; `Ok(true)`: a fragment of an SEI with user data that the
    /// strip action (`strip`) removes.
    fn fragment(
        &mut self,
        k: Kind,
        p: &[u8],
        rtp: &RtpInfo,
        pol: &Policy,
        strip: bool,
    ) -> Result<bool, Violation> {
        let hl = k.header_len();
        let &fh = p.get(hl).ok_or(Violation::NalFragment)?;
        let data = &p[hl + 1..];
        let (start, end) = (fh & 0x80 != 0, fh & 0x40 != 0);
        let t = match k {
            Kind::H264 => {
                if fh & 0x20 != 0 {
                    return Err(Violation::NalFragment);
                }
                fh & 0x1f
            }
            Kind::H265 => fh & 0x3f,
        };
        // The fragmented NAL unit's own header: the payload header with the FU's type.
        let mut hdr = [p[0], p.get(1).copied().unwrap_or(0)];
        match k {
            Kind::H264 => hdr[0] = (p[0] & 0xe0) | t,
            Kind::H265 => hdr[0] = (p[0] & 0x81) | (t << 1),
        }
        k.nal_type(&hdr[..hl], pol)?;
        if (start && end) || data.is_empty() {
            return Err(Violation::NalFragment);
        }
        if start {
            if self.fu.is_some() {
                return Err(Violation::NalFragment);
            }
            self.fu = Some(t);
            self.fu_sei_bytes = 0;
            self.fu_cut = false;
            if k.is_sei(t) {
                // Message sizes checked against the cap; the bytes are spent per fragment.
                self.fu_cut = self.sei(data, false, rtp, pol, strip)?;
            } else if k.is_vcl(t) {
                self.slice(k, t, data)?;
            } else {
                // Parameter sets, AUD, end of sequence: small, never fragmented.
                return Err(Violation::NalFragment);
            }
        } else {
            match self.fu {
                Some(ft) if ft == t => {}
                Some(_) => return Err(Violation::NalFragment),
                // The start was lost: slice data is as unchecked as ever, but an SEI
                // continuation could carry anything.
                None if k.is_sei(t) => return Err(Violation::LostSync),
                // After a loss: follow the fragmented unit from here.
                None if rtp.gap => self.fu = Some(t),
                None => return Err(Violation::NalFragment),
            }
        }
        if self.fu_cut {
            if end {
                self.fu = None;
                self.fu_cut = false;
            }
            return Ok(true);
        }
        if k.is_sei(t) {
            // The messages were read (as far as they went) from the first fragment; every
            // byte of a fragmented SEI counts against the user-data budget.
            self.fu_sei_bytes = self.fu_sei_bytes.saturating_add(data.len() as u32);
            if self.fu_sei_bytes > u32::from(pol.sei_user_data_max) + 64 {
                return Err(Violation::SeiUserData);
            }
            self.spend(data.len() as u32, rtp, pol)?;
        }
        if end {
            self.fu = None;
        }
        Ok(false)
    }

    /// SEI messages (H.264 §7.3.2.3, H.265 §7.3.5): `complete` when `rbsp` is the whole
    /// NAL unit payload (then it must end with the trailing bits exactly).
    /// `Ok(true)`: `strip` and a user-data message was found (the messages before it were
    /// checked; the NAL unit is removed whole, so the rest is not read).
    fn sei(
        &mut self,
        ebsp: &[u8],
        complete: bool,
        rtp: &RtpInfo,
        pol: &Policy,
        strip: bool,
    ) -> Result<bool, Violation> {
        let mut r = Rbsp::new(ebsp);
        loop {
            if r.at_trailing() {
                return Ok(false);
            }
            let Some(ptype) = r.ff_coded() else {
                return if complete {
                    Err(Violation::SeiMalformed)
                } else {
                    Ok(false)
                };
            };
            let Some(size) = r.ff_coded() else {
                return if complete {
                    Err(Violation::SeiMalformed)
                } else {
                    Ok(false)
                };
            };
            if !SEI_TYPES.contains(&ptype) {
                return Err(Violation::SeiPayloadType);
            }
            if (ptype == 4 || ptype == 5) && strip {
                return Ok(true);
            }
            if ptype == 4 || ptype == 5 {
                if size > u32::from(pol.sei_user_data_max) {
                    return Err(Violation::SeiUserData);
                }
                if complete {
                    self.spend(size, rtp, pol)?;
                }
            }
            let skipped = if ptype == 3 {
                // Filler payload: 0xFF bytes only.
                match r.skip_ff(size) {
                    Some(false) => return Err(Violation::SeiMalformed),
                    Some(true) => true,
                    None => false,
                }
            } else {
                r.skip(size)
            };
            if !skipped {
                return if complete {
                    Err(Violation::SeiMalformed)
                } else {
                    Ok(false)
                };
            }
            if r.is_empty() {
                // A complete SEI ends with rbsp_trailing_bits.
                return if complete {
                    Err(Violation::SeiMalformed)
                } else {
                    Ok(false)
                };
            }
        }
    }

    /// Counts user-data bytes against the per-second budget (seconds of the RTP clock).
    fn spend(&mut self, n: u32, rtp: &RtpInfo, pol: &Policy) -> Result<(), Violation> {
        let fresh = match self.sei_window {
            None => true,
            Some(t0) => rtp.timestamp.wrapping_sub(t0) >= rtp.clock_rate,
        };
        if fresh {
            self.sei_window = Some(rtp.timestamp);
            self.sei_window_bytes = 0;
        }
        self.sei_window_bytes = self.sei_window_bytes.saturating_add(n);
        if self.sei_window_bytes > pol.sei_user_data_per_s {
            return Err(Violation::SeiUserData);
        }
        Ok(())
    }
}

/// SEI payload types that may cross (H.264 Annex D, H.265 Annex D): timing, pan-scan,
/// filler (0xFF only), user data (capped), recovery point, reference marking repetition,
/// scene info, freeze, film grain, frame packing, display orientation, H.265 active
/// parameter sets, decoding unit info, sub-layer index, decoded picture hash, region
/// refresh, time code, colour volume, content light level, alternative transfer.
const SEI_TYPES: [u32; 25] = [
    0, 1, 2, 3, 4, 5, 6, 7, 9, 13, 19, 45, 47, 128, 129, 130, 131, 132, 133, 134, 135, 136, 137,
    144, 147,
];

/// H.265 VPS (§7.3.2.1): id, layers, sub-layers, the reserved 0xffff.
fn h265_vps(body: &[u8]) -> Result<(), Violation> {
    let bad = Violation::NalParameterSet;
    let mut b = Bits::new(body);
    b.bits(4).ok_or(bad)?; // vps_video_parameter_set_id
    b.bits(2).ok_or(bad)?;
    b.bits(6).filter(|&v| v == 0).ok_or(bad)?; // vps_max_layers_minus1: one layer
    b.bits(3).filter(|&v| v <= 6).ok_or(bad)?;
    b.bit().ok_or(bad)?;
    b.bits(16).filter(|&v| v == 0xffff).ok_or(bad)?;
    general_profile(&mut b)
}

/// general_profile_space 0, a known profile and a level (§7.3.3).
fn general_profile(b: &mut Bits<'_>) -> Result<(), Violation> {
    let bad = Violation::NalParameterSet;
    b.bits(2).filter(|&v| v == 0).ok_or(bad)?;
    b.bit().ok_or(bad)?;
    b.bits(5).filter(|&v| (1..=11).contains(&v)).ok_or(bad)?;
    b.skip(32 + 48).ok_or(bad)?;
    b.bits(8).filter(|&v| v % 3 == 0 && v <= 186).ok_or(bad)?;
    Ok(())
}

/// H.265 SPS (§7.3.2.2): sub-layers, profile, tier and level, its id and chroma format.
fn h265_sps(body: &[u8]) -> Result<(), Violation> {
    let bad = Violation::NalParameterSet;
    let mut b = Bits::new(body);
    b.bits(4).ok_or(bad)?;
    let sub = b.bits(3).filter(|&v| v <= 6).ok_or(bad)?;
    b.bit().ok_or(bad)?;
    general_profile(&mut b)?;
    let mut present = [(0, 0); 6];
    for p in present.iter_mut().take(sub as usize) {
        *p = (b.bit().ok_or(bad)?, b.bit().ok_or(bad)?);
    }
    if sub > 0 {
        b.skip(2 * (8 - sub)).ok_or(bad)?;
    }
    for &(profile, level) in present.iter().take(sub as usize) {
        b.skip(88 * profile + 8 * level).ok_or(bad)?;
    }
    b.ue().filter(|&v| v <= 15).ok_or(bad)?;
    b.ue().filter(|&v| v <= 3).ok_or(bad)?;
    Ok(())
}

/// A bit reader over RBSP bytes (emulation prevention removed), MSB first.
struct Bits<'a> {
    r: Rbsp<'a>,
    cur: u32,
    left: u32,
}

impl<'a> Bits<'a> {
    fn new(ebsp: &'a [u8]) -> Self {
        Bits {
            r: Rbsp::new(ebsp),
            cur: 0,
            left: 0,
        }
    }

    fn bit(&mut self) -> Option<u32> {
        if self.left == 0 {
            self.cur = u32::from(self.r.next()?);
            self.left = 8;
        }
        self.left -= 1;
        Some((self.cur >> self.left) & 1)
    }

    /// `n` ≤ 32 bits.
    fn bits(&mut self, n: u32) -> Option<u32> {
        let mut v = 0u32;
        for _ in 0..n {
            v = (v << 1) | self.bit()?;
        }
        Some(v)
    }

    fn skip(&mut self, n: u32) -> Option<()> {
        for _ in 0..n {
            self.bit()?;
        }
        Some(())
    }

    /// ue(v), Exp-Golomb (§9.1); `None` past the end or beyond 31 leading zeros.
    fn ue(&mut self) -> Option<u32> {
        let mut zeros = 0;
        while self.bit()? == 0 {
            zeros += 1;
            if zeros > 31 {
                return None;
            }
        }
        let rest = self.bits(zeros)?;
        Some(((1u64 << zeros) - 1 + u64::from(rest)).min(u64::from(u32::MAX)) as u32)
    }
}

/// Reads the RBSP bytes of a NAL unit payload: drops the emulation prevention byte of each
/// 0x000003 sequence.
struct Rbsp<'a> {
    b: &'a [u8],
    zeros: u8,
}

impl<'a> Rbsp<'a> {
    fn new(b: &'a [u8]) -> Self {
        Rbsp { b, zeros: 0 }
    }

    fn next(&mut self) -> Option<u8> {
        let (&x, rest) = self.b.split_first()?;
        self.b = rest;
        if self.zeros >= 2 && x == 3 {
            self.zeros = 0;
            return self.next();
        }
        self.zeros = if x == 0 {
            self.zeros.saturating_add(1)
        } else {
            0
        };
        Some(x)
    }

    /// payloadType / payloadSize: 0xFF bytes add 255 each, the last byte ends it.
    fn ff_coded(&mut self) -> Option<u32> {
        let mut v = 0u32;
        loop {
            let x = self.next()?;
            v += u32::from(x);
            if x != 0xff {
                return Some(v);
            }
            if v > 1 << 20 {
                return None;
            }
        }
    }

    fn skip(&mut self, n: u32) -> bool {
        (0..n).all(|_| self.next().is_some())
    }

    /// Skips `n` bytes that must all be 0xFF: `Some(false)` at another byte, `None` past the
    /// end.
    fn skip_ff(&mut self, n: u32) -> Option<bool> {
        for _ in 0..n {
            if self.next()? != 0xff {
                return Some(false);
            }
        }
        Some(true)
    }

    /// Only rbsp_trailing_bits left (0x80).
    fn at_trailing(&self) -> bool {
        self.b == [0x80]
    }

    fn is_empty(&self) -> bool {
        self.b.is_empty()
    }
}
