//! MPEG-2 program stream (ISO/IEC 13818-1 §2.5) over RTP as GB/T 28181 sends it: each frame
//! starts with a pack header in a new RTP packet, its packets share one timestamp, the last
//! one has the marker bit.
//!
//! The stream is a sequence of units, each starting with a start code: pack header (0xBA),
//! system header (0xBB), program stream map (0xBC), PES packets of video (0xE0–0xEF) and
//! audio (0xC0–0xDF), padding (0xBE, only as 0xFF filler) and the end code (0xB9). A unit may
//! straddle RTP packets: the state carries the bytes still owed to the current unit (skipped
//! without looking, or checked as filler) and, when a header itself is cut, up to
//! [`CARRY`] bytes of it. Private streams (0xBD, 0xBF) and anything else are refused.

use super::{all_ff, Bytes, Cuts, Policy, RtpInfo, Violation};

/// The longest unit header followed across a packet boundary: a pack header with stuffing
/// (21), a PES header with its optional fields and stuffing, a system header or a PSM of a
/// few streams. Longer ones must not be cut by the packetiser.
const CARRY: usize = 96;

#[derive(Clone, Debug)]
pub(super) struct PsState {
    /// Bytes of the current unit still to come.
    owed: u32,
    /// The owed bytes are padding: each must be 0xFF.
    owed_filler: bool,
    /// The owed bytes belong to a unit the strip action removes (private stream, padding),
    /// for this reason: they are cut from the packets that carry them.
    owed_cut: Option<Violation>,
    /// The start of a unit header cut by the end of the previous packet.
    carry: [u8; CARRY],
    carry_len: u8,
    /// In step with the stream (a frame start has been seen since the last loss).
    synced: bool,
    /// A frame start was ever seen: before it, a refusal is `no_frame_start`, after a loss
    /// `lost_sync` (an operator tells "never looked like PS" from "lost a packet").
    started: bool,
    /// The stream IDs (bit `id - 0xC0`) the last PSM declared; 0: no PSM seen, any audio or
    /// video ID. Once a PSM was seen, a PES of another ID is refused.
    declared: u64,
}

impl Default for PsState {
    fn default() -> Self {
        PsState {
            owed: 0,
            owed_filler: false,
            owed_cut: None,
            carry: [0; CARRY],
            carry_len: 0,
            synced: false,
            started: false,
            declared: 0,
        }
    }
}

const PACK: [u8; 4] = [0, 0, 1, 0xba];

impl PsState {
    /// Checks one RTP payload; under the strip action, the units it removes are added to
    /// `cuts` (offsets into `p`).
    pub fn check(
        &mut self,
        p: &[u8],
        rtp: &RtpInfo,
        policy: &Policy,
        cuts: &mut Cuts,
    ) -> Result<(), Violation> {
        let base = p.len();
        let frame_start = p.starts_with(&PACK);
        if rtp.gap || !self.synced {
            // Resynchronise on the next frame start; until then nothing can be checked.
            self.owed = 0;
            self.owed_cut = None;
            self.carry_len = 0;
            self.synced = false;
            if !frame_start {
                return Err(if self.started {
                    Violation::LostSync
                } else {
                    Violation::NoFrameStart
                });
            }
            self.synced = true;
            self.started = true;
        } else if rtp.prev_marker && !frame_start {
            return Err(Violation::PsFrame);
        }
        let mut p = p;
        self.pay_owed(&mut p, base, cuts)?;
        if self.carry_len > 0 {
            // The header's first bytes crossed in the previous packet: it cannot be cut any
            // more, so it is checked as without the strip action (a private stream refused,
            // padding checked as filler).
            // Complete the cut header with the first bytes of this packet.
            let mut have = usize::from(self.carry_len);
            loop {
                let need = need(&self.carry[..have], false)?;
                if have >= need {
                    break;
                }
                if need > CARRY {
                    return Err(Violation::PsHeaderSplit);
                }
                let take = (need - have).min(p.len());
                self.carry[have..have + take].copy_from_slice(&p[..take]);
                have += take;
                p = &p[take..];
                if p.is_empty() && have < need {
                    self.carry_len = have as u8;
                    return self.frame_end(rtp);
                }
            }
            let (unit, body) = parse(&self.carry[..have], policy, &mut self.declared, false)?;
            self.carry_len = 0;
            self.owed = (unit - have) as u32;
            self.owed_filler = body == Body::Filler;
            self.owed_cut = None;
            self.pay_owed(&mut p, base, cuts)?;
        }
        while !p.is_empty() {
            let need = need(p, cuts.strip)?;
            if need > p.len() {
                if need > CARRY {
                    return Err(Violation::PsHeaderSplit);
                }
                self.carry[..p.len()].copy_from_slice(p);
                self.carry_len = p.len() as u8;
                break;
            }
            let (unit, kind) = parse(&p[..need], policy, &mut self.declared, cuts.strip)?;
            let body = &p[need..];
            let here = (unit - need).min(body.len());
            if kind == Body::Filler && !all_ff(&body[..here]) {
                return Err(Violation::PsPadding);
            }
            if let Body::Cut(why) = kind {
                let at = base - p.len();
                cuts.cut(at, at + need + here, why)?;
            }
            self.owed = (unit - need - here) as u32;
            self.owed_filler = kind == Body::Filler;
            self.owed_cut = match kind {
                Body::Cut(why) => Some(why),
                _ => None,
            };
            p = &body[here..];
        }
        self.frame_end(rtp)
    }

    /// Skips (or checks, for padding) the bytes the current unit still owes.
    fn pay_owed(&mut self, p: &mut &[u8], base: usize, cuts: &mut Cuts) -> Result<(), Violation> {
        if self.owed == 0 {
            return Ok(());
        }
        let n = (self.owed as usize).min(p.len());
        if let Some(why) = self.owed_cut {
            let at = base - p.len();
            cuts.cut(at, at + n, why)?;
        } else if self.owed_filler && !all_ff(&p[..n]) {
            return Err(Violation::PsPadding);
        }
        self.owed -= n as u32;
        *p = &p[n..];
        Ok(())
    }

    /// A frame (marker bit) must end at a unit boundary.
    fn frame_end(&self, rtp: &RtpInfo) -> Result<(), Violation> {
        if rtp.marker && (self.owed != 0 || self.carry_len != 0) {
            return Err(Violation::PsFrame);
        }
        Ok(())
    }
}

/// What follows a unit's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Body {
    /// Checked by its header, skipped.
    Plain,
    /// Padding: every byte must be 0xFF.
    Filler,
    /// The strip action removes the whole unit, for this reason.
    Cut(Violation),
}

/// How many bytes of the unit starting at `h` are needed to check its header, as far as `h`
/// tells (with fewer bytes than returned, call again with more). Refuses at once what can
/// be refused from the start code alone (private streams unless `strip` cuts them).
fn need(h: &[u8], strip: bool) -> Result<usize, Violation> {
    for (i, &want) in [0u8, 0, 1].iter().enumerate() {
        match h.get(i) {
            None => return Ok(4),
            Some(&b) if b != want => return Err(Violation::PsNoStartCode),
            Some(_) => {}
        }
    }
    let Some(&id) = h.get(3) else {
        return Ok(4);
    };
    let len16 = |h: &[u8]| usize::from(u16::from_be_bytes([h[4], h[5]]));
    Ok(match id {
        0xba if h.len() < 14 => 14,
        0xba => 14 + usize::from(h[13] & 7),
        0xb9 => 4,
        0xbb | 0xbc if h.len() < 6 => 6,
        0xbb | 0xbc => 6 + len16(h),
        0xc0..=0xef if h.len() < 9 => 9,
        0xc0..=0xef => 9 + usize::from(h[8]),
        0xbe => 6,
        0xbd | 0xbf if strip => 6,
        0xbd | 0xbf => return Err(Violation::PsPrivateStream),
        _ => return Err(Violation::PsUnknownStream),
    })
}

/// Checks a unit header (`h` is exactly what [`need`] asked for); returns the unit's whole
/// length and what its body is. `declared` is the PSM's set of stream IDs; `strip`: padding
/// and private streams are cut whole.
fn parse(
    h: &[u8],
    policy: &Policy,
    declared: &mut u64,
    strip: bool,
) -> Result<(usize, Body), Violation> {
    let len16 = || 6 + usize::from(u16::from_be_bytes([h[4], h[5]]));
    match h[3] {
        0xbd | 0xbf => Ok((len16(), Body::Cut(Violation::PsPrivateStream))),
        0xbe if strip => Ok((len16(), Body::Cut(Violation::PsPadding))),
        0xba => {
            // '01' SCR[32..30] '1' SCR[29..15] '1' SCR[14..0] '1' ext '1' mux_rate '11'
            // reserved stuffing_length: the MPEG-2 layout and its marker bits.
            let ok = h[4] & 0xc4 == 0x44
                && h[6] & 0x04 != 0
                && h[8] & 0x04 != 0
                && h[9] & 0x01 != 0
                && h[12] & 0x03 == 0x03
                && all_ff(&h[14..]);
            if !ok {
                return Err(Violation::PsPackHeader);
            }
            Ok((h.len(), Body::Plain))
        }
        0xb9 => Ok((4, Body::Plain)),
        0xbb => system_header(&h[6..]).map(|()| (h.len(), Body::Plain)),
        0xbc => {
            *declared = psm(&h[6..])?;
            Ok((h.len(), Body::Plain))
        }
        0xbe => {
            if !policy.allow_filler {
                return Err(Violation::PsPadding);
            }
            Ok((len16(), Body::Filler))
        }
        id => {
            if *declared != 0 && *declared & (1 << (id - 0xc0)) == 0 {
                return Err(Violation::PsUnknownStream);
            }
            pes(h).map(|unit| (unit, Body::Plain))
        }
    }
}

/// A PES header of an audio or video stream: MPEG-2 syntax, not scrambled, no private data,
/// stuffing 0xFF, header inside the packet. Returns the PES's whole length.
fn pes(h: &[u8]) -> Result<usize, Violation> {
    let len = usize::from(u16::from_be_bytes([h[4], h[5]]));
    if len == 0 {
        return Err(Violation::PsPesUnbounded);
    }
    let (b6, flags) = (h[6], h[7]);
    if b6 & 0xc0 != 0x80 || b6 & 0x30 != 0 || h.len() > 6 + len {
        return Err(Violation::PsPesHeader);
    }
    let mut o = 9;
    o += match flags >> 6 {
        0b10 => 5,
        0b11 => 10,
        0b00 => 0,
        _ => return Err(Violation::PsPesHeader),
    };
    for (bit, n) in [(0x20, 6), (0x10, 3), (0x08, 1), (0x04, 1), (0x02, 2)] {
        if flags & bit != 0 {
            o += n;
        }
    }
    if flags & 0x01 != 0 {
        let ext = *h.get(o).ok_or(Violation::PsPesHeader)?;
        if ext & 0x80 != 0 {
            // PES_private_data: 16 bytes of anything.
            return Err(Violation::PsPesHeader);
        }
        if ext & 0x41 != 0 {
            // pack_header_field, PES_extension_2: nothing real sends them.
            return Err(Violation::PsPesHeader);
        }
        o += 1;
        if ext & 0x20 != 0 {
            o += 2;
        }
        if ext & 0x10 != 0 {
            o += 2;
        }
    }
    if o > h.len() || !all_ff(&h[o..]) {
        return Err(Violation::PsPesHeader);
    }
    Ok(6 + len)
}

/// System header body (§2.5.3.5): marker bits, then 3-byte entries for streams that may
/// cross.
fn system_header(b: &[u8]) -> Result<(), Violation> {
    let bad = Err(Violation::PsSystemHeader);
    if b.len() < 6 || !(b.len() - 6).is_multiple_of(3) {
        return bad;
    }
    if b[0] & 0x80 == 0 || b[2] & 0x01 == 0 || b[4] & 0x20 == 0 {
        return bad;
    }
    for e in b[6..].chunks_exact(3) {
        match e[0] {
            0xb8 | 0xb9 | 0xc0..=0xef => {}
            0xbd | 0xbf => return Err(Violation::PsPrivateStream),
            _ => return bad,
        }
        if e[1] & 0xc0 != 0xc0 {
            return bad;
        }
    }
    Ok(())
}

/// Stream types a PSM may declare: GB/T 28181-2016 Annex C, plus MPEG-1/2 audio and video.
fn stream_type_ok(t: u8) -> bool {
    matches!(
        t,
        0x01 | 0x02 // MPEG-1/2 video
            | 0x03 | 0x04 // MPEG-1/2 audio
            | 0x0f // AAC
            | 0x10 // MPEG-4 video
            | 0x1b // H.264
            | 0x24 // H.265
            | 0x80 // SVAC video
            | 0x90 | 0x91 // G.711 A-law, μ-law
            | 0x92 | 0x93 | 0x99 // G.722.1, G.723.1, G.729
            | 0x9b // SVAC audio
    )
}

/// Program stream map body (§2.5.4): lengths that add up, elementary streams of allowed
/// types with audio/video stream IDs. Returns the set of declared IDs.
fn psm(b: &[u8]) -> Result<u64, Violation> {
    let bad = Violation::PsPsm;
    let mut r = Bytes::new(b);
    let _version = r.u8().ok_or(bad)?;
    if r.u8().ok_or(bad)? & 0x01 == 0 {
        return Err(bad);
    }
    let info = usize::from(r.u16().ok_or(bad)?);
    r.take(info).ok_or(bad)?;
    let map_len = usize::from(r.u16().ok_or(bad)?);
    let mut map = Bytes::new(r.take(map_len).ok_or(bad)?);
    if r.rest().len() != 4 {
        // CRC_32, then nothing.
        return Err(bad);
    }
    let mut ids = 0u64;
    while !map.is_empty() {
        let stream_type = map.u8().ok_or(bad)?;
        let id = map.u8().ok_or(bad)?;
        let n = usize::from(map.u16().ok_or(bad)?);
        map.take(n).ok_or(bad)?;
        if !stream_type_ok(stream_type) {
            return Err(Violation::PsStreamType);
        }
        match id {
            0xc0..=0xef => ids |= 1 << (id - 0xc0),
            0xbd | 0xbf => return Err(Violation::PsPrivateStream),
            _ => return Err(bad),
        }
    }
    if ids == 0 {
        return Err(bad);
    }
    Ok(ids)
}
