//! H.264 (RFC 6184, non-interleaved mode) and H.265 (RFC 7798, without DONL) RTP payloads:
//! NAL headers (forbidden bit, types from the allow-list), single NAL units, aggregation
//! packets whose sizes add up exactly (STAP-A, AP), fragmentation units whose start/end bits
//! and types follow one another (FU-A, FU), and SEI messages: user data (payload types 4 and
//! 5) capped per message and per second of the stream's clock.

use super::{Policy, RtpInfo, Violation};

#[derive(Clone, Debug, Default)]
pub(super) struct NalState {
    /// A fragmented NAL unit is in progress: its type.
    fu: Option<u8>,
    /// Bytes of the SEI NAL unit being fragmented so far.
    fu_sei_bytes: u32,
    /// Start (RTP timestamp) of the current one-second window of SEI user data.
    sei_window: Option<u32>,
    sei_window_bytes: u32,
}

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
        Ok(t)
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
    pub fn check_h264(&mut self, p: &[u8], rtp: &RtpInfo, pol: &Policy) -> Result<(), Violation> {
        self.check(Kind::H264, p, rtp, pol)
    }

    pub fn check_h265(&mut self, p: &[u8], rtp: &RtpInfo, pol: &Policy) -> Result<(), Violation> {
        self.check(Kind::H265, p, rtp, pol)
    }

    fn check(&mut self, k: Kind, p: &[u8], rtp: &RtpInfo, pol: &Policy) -> Result<(), Violation> {
        if rtp.gap {
            // The end of a fragmented NAL unit may have been lost.
            self.fu = None;
        }
        let t = k.header(p)?;
        let (aggregation, fragmentation) = k.packet_types();
        let hl = k.header_len();
        if t == fragmentation {
            self.fragment(k, p, rtp, pol)?;
        } else {
            if self.fu.is_some() {
                return Err(Violation::NalFragment);
            }
            if t == aggregation {
                let mut rest = p.get(hl..).ok_or(Violation::NalAggregation)?;
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
                    self.single(k, nal, rtp, pol)?;
                    rest = &rest[2 + n..];
                }
            } else {
                self.single(k, p, rtp, pol)?;
            }
        }
        if rtp.marker && self.fu.is_some() {
            // The access unit ended inside a NAL unit.
            return Err(Violation::NalFragment);
        }
        Ok(())
    }

    /// One whole NAL unit.
    fn single(
        &mut self,
        k: Kind,
        nal: &[u8],
        rtp: &RtpInfo,
        pol: &Policy,
    ) -> Result<(), Violation> {
        let t = k.nal_type(nal, pol)?;
        if nal.len() < k.header_len() {
            return Err(Violation::NalAggregation);
        }
        if k.is_sei(t) {
            self.sei(&nal[k.header_len()..], true, rtp, pol)?;
        }
        Ok(())
    }

    fn fragment(
        &mut self,
        k: Kind,
        p: &[u8],
        rtp: &RtpInfo,
        pol: &Policy,
    ) -> Result<(), Violation> {
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
            if k.is_sei(t) {
                // Message sizes checked against the cap; the bytes are spent per fragment.
                self.sei(data, false, rtp, pol)?;
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
        Ok(())
    }

    /// SEI messages (H.264 §7.3.2.3, H.265 §7.3.5): `complete` when `rbsp` is the whole
    /// NAL unit payload (then it must end with the trailing bits exactly).
    fn sei(
        &mut self,
        ebsp: &[u8],
        complete: bool,
        rtp: &RtpInfo,
        pol: &Policy,
    ) -> Result<(), Violation> {
        let mut r = Rbsp::new(ebsp);
        loop {
            if r.at_trailing() {
                return Ok(());
            }
            let Some(ptype) = r.ff_coded() else {
                return if complete {
                    Err(Violation::SeiMalformed)
                } else {
                    Ok(())
                };
            };
            let Some(size) = r.ff_coded() else {
                return if complete {
                    Err(Violation::SeiMalformed)
                } else {
                    Ok(())
                };
            };
            if ptype == 4 || ptype == 5 {
                if size > u32::from(pol.sei_user_data_max) {
                    return Err(Violation::SeiUserData);
                }
                if complete {
                    self.spend(size, rtp, pol)?;
                }
            }
            if !r.skip(size) {
                return if complete {
                    Err(Violation::SeiMalformed)
                } else {
                    Ok(())
                };
            }
            if r.is_empty() {
                // A complete SEI ends with rbsp_trailing_bits.
                return if complete {
                    Err(Violation::SeiMalformed)
                } else {
                    Ok(())
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

    /// Only rbsp_trailing_bits left (0x80).
    fn at_trailing(&self) -> bool {
        self.b == [0x80]
    }

    fn is_empty(&self) -> bool {
        self.b.is_empty()
    }
}
