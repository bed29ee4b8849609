//! MPEG-2 transport stream over RTP (RFC 2250): whole 188-byte packets with the 0x47 sync
//! byte, no transport errors, nothing scrambled, adaptation fields without private data and
//! with 0xFF stuffing; only PIDs the PAT and PMT declared for audio/video (and the PCR),
//! null packets only as filler. The PSI tables are where a sender could hide data too: a
//! section must fit in its packet (real muxers' PAT/PMT/SDT do), its CRC must be right, and
//! its content may change at most once per second of the RTP clock.

use super::{all_ff, Policy, RtpInfo, Violation};

const PKT: usize = 188;
const MAX_ES: usize = 8;
const NONE: u16 = 0xffff;
const PID_PAT: u16 = 0;
const PID_SDT: u16 = 0x11;
const PID_NULL: u16 = 0x1fff;

#[derive(Clone, Debug)]
pub(super) struct TsState {
    pmt_pid: u16,
    pcr_pid: u16,
    es: [u16; MAX_ES],
    n_es: u8,
    private: [u16; MAX_ES],
    n_private: u8,
    /// CRC of the last PAT, PMT and SDT section, and when (RTP time) one last changed.
    crc: [Option<u32>; 3],
    changed_at: [u32; 3],
    /// TS packets seen before the first PMT ([`Policy::ts_startup_grace`]).
    before_pmt: u16,
}

impl Default for TsState {
    fn default() -> Self {
        TsState {
            pmt_pid: NONE,
            pcr_pid: NONE,
            es: [NONE; MAX_ES],
            n_es: 0,
            private: [NONE; MAX_ES],
            n_private: 0,
            crc: [None; 3],
            changed_at: [0; 3],
            before_pmt: 0,
        }
    }
}

/// Elementary stream types that are audio or video (ISO/IEC 13818-1 Table 2-34 and the
/// GB/T 28181 table); anything else in a PMT (0x05/0x06 private data, ...) is private.
fn av_stream_type(t: u8) -> bool {
    matches!(
        t,
        0x01 | 0x02
            | 0x03
            | 0x04
            | 0x0f
            | 0x10
            | 0x11
            | 0x1b
            | 0x24
            | 0x80
            | 0x90
            | 0x91
            | 0x92
            | 0x93
            | 0x99
            | 0x9b
    )
}

impl TsState {
    pub fn check(&mut self, p: &[u8], rtp: &RtpInfo, policy: &Policy) -> Result<(), Violation> {
        if !p.len().is_multiple_of(PKT) {
            return Err(Violation::TsSize);
        }
        if self.crc[1].is_none() {
            // No PMT yet: read the tables of this packet first, so that the packets before
            // them in the same datagram are judged by them.
            for t in p.chunks_exact(PKT) {
                let pid = u16::from_be_bytes([t[1] & 0x1f, t[2]]);
                if t[0] == 0x47 && (pid == PID_PAT || pid == self.pmt_pid) {
                    self.packet(t, rtp, policy)?;
                }
            }
        }
        for pkt in p.chunks_exact(PKT) {
            self.packet(pkt, rtp, policy)?;
        }
        Ok(())
    }

    fn packet(&mut self, t: &[u8], rtp: &RtpInfo, policy: &Policy) -> Result<(), Violation> {
        if t[0] != 0x47 {
            return Err(Violation::TsSync);
        }
        if t[1] & 0x80 != 0 {
            return Err(Violation::TsError);
        }
        let pusi = t[1] & 0x40 != 0;
        let pid = u16::from_be_bytes([t[1] & 0x1f, t[2]]);
        if t[3] & 0xc0 != 0 {
            return Err(Violation::TsScrambled);
        }
        let afc = (t[3] >> 4) & 3;
        let mut payload_at = 4;
        if afc & 2 != 0 {
            let afl = usize::from(t[4]);
            let max = if afc == 2 { 183 } else { 182 };
            if afl > max || (afc == 2 && afl != 183) {
                return Err(Violation::TsAdaptation);
            }
            adaptation(&t[5..5 + afl])?;
            payload_at = 5 + afl;
        } else if afc == 0 {
            return Err(Violation::TsAdaptation);
        }
        let payload = if afc & 1 != 0 {
            &t[payload_at..]
        } else {
            &[][..]
        };
        match pid {
            PID_PAT => self.psi(0, pusi, payload, rtp, Self::pat),
            PID_SDT => self.psi(2, pusi, payload, rtp, |_, _| Ok(())),
            PID_NULL if policy.allow_filler && all_ff(payload) => Ok(()),
            PID_NULL => Err(Violation::TsNullData),
            _ if pid == self.pmt_pid => self.psi(1, pusi, payload, rtp, Self::pmt),
            _ if self.es[..usize::from(self.n_es)].contains(&pid) => {
                if pusi && !payload.starts_with(&[0, 0, 1]) {
                    return Err(Violation::TsPes);
                }
                if pusi && !matches!(payload.get(3), Some(0xc0..=0xef)) {
                    return Err(Violation::TsPes);
                }
                Ok(())
            }
            _ if pid == self.pcr_pid && payload.is_empty() => Ok(()),
            _ if self.private[..usize::from(self.n_private)].contains(&pid) => {
                Err(Violation::TsPrivatePid)
            }
            _ if self.crc[1].is_none() && self.before_pmt < policy.ts_startup_grace => {
                // A muxer that starts before its first PAT/PMT (GStreamer's mpegtsmux sends
                // three RTP packets of video first): structure checked, PID not yet known.
                self.before_pmt += 1;
                Ok(())
            }
            // Not yet in step with the tables (they were lost, or are still to come).
            _ if self.crc[1].is_none() => Err(Violation::LostSync),
            _ => Err(Violation::TsUnknownPid),
        }
    }

    /// One PSI section that starts and ends in this packet: CRC right, content changed at
    /// most once per second; `apply` reads it.
    fn psi(
        &mut self,
        slot: usize,
        pusi: bool,
        payload: &[u8],
        rtp: &RtpInfo,
        apply: fn(&mut Self, &[u8]) -> Result<(), Violation>,
    ) -> Result<(), Violation> {
        let bad = Err(Violation::TsPsi);
        if !pusi || payload.is_empty() {
            return bad;
        }
        let ptr = usize::from(payload[0]);
        let Some(sec) = payload.get(1 + ptr..) else {
            return bad;
        };
        if ptr != 0 || sec.len() < 3 {
            return bad;
        }
        let len = usize::from(u16::from_be_bytes([sec[1] & 0x0f, sec[2]]));
        if sec[1] & 0x80 == 0 || len < 9 || 3 + len > sec.len() {
            return bad;
        }
        let (section, after) = sec.split_at(3 + len);
        if !all_ff(after) || crc32_mpeg(section) != 0 {
            return bad;
        }
        let crc = u32::from_be_bytes([
            section[len - 1],
            section[len],
            section[len + 1],
            section[len + 2],
        ]);
        if self.crc[slot] != Some(crc) {
            if self.crc[slot].is_some()
                && rtp.timestamp.wrapping_sub(self.changed_at[slot]) < rtp.clock_rate
            {
                return bad;
            }
            apply(self, section)?;
            self.crc[slot] = Some(crc);
            self.changed_at[slot] = rtp.timestamp;
        }
        Ok(())
    }

    /// PAT: the first program's PMT PID (program 0, the NIT, is not followed).
    fn pat(&mut self, s: &[u8]) -> Result<(), Violation> {
        if s[0] != 0x00 {
            return Err(Violation::TsPsi);
        }
        let body = &s[8..s.len() - 4];
        if !body.len().is_multiple_of(4) {
            return Err(Violation::TsPsi);
        }
        self.pmt_pid = NONE;
        for e in body.chunks_exact(4) {
            let program = u16::from_be_bytes([e[0], e[1]]);
            if program != 0 && self.pmt_pid == NONE {
                self.pmt_pid = u16::from_be_bytes([e[2] & 0x1f, e[3]]);
            }
        }
        self.crc[1] = None;
        Ok(())
    }

    /// PMT: the PCR PID, and the elementary streams, audio/video or private.
    fn pmt(&mut self, s: &[u8]) -> Result<(), Violation> {
        let bad = Violation::TsPsi;
        if s[0] != 0x02 || s.len() < 16 {
            return Err(bad);
        }
        let pcr = u16::from_be_bytes([s[8] & 0x1f, s[9]]);
        let info = usize::from(u16::from_be_bytes([s[10] & 0x0f, s[11]]));
        let mut es = s.get(12 + info..s.len() - 4).ok_or(bad)?;
        self.n_es = 0;
        self.n_private = 0;
        self.pcr_pid = pcr;
        while !es.is_empty() {
            let [t, p0, p1, l0, l1, ..] = *es else {
                return Err(bad);
            };
            let pid = u16::from_be_bytes([p0 & 0x1f, p1]);
            let n = usize::from(u16::from_be_bytes([l0 & 0x0f, l1]));
            es = es.get(5 + n..).ok_or(bad)?;
            let (list, count) = if av_stream_type(t) {
                (&mut self.es, &mut self.n_es)
            } else {
                (&mut self.private, &mut self.n_private)
            };
            if usize::from(*count) == MAX_ES {
                return Err(bad);
            }
            list[usize::from(*count)] = pid;
            *count += 1;
        }
        Ok(())
    }
}

/// Adaptation field after its length byte: no transport private data, known optional
/// fields, stuffing 0xFF.
fn adaptation(a: &[u8]) -> Result<(), Violation> {
    let Some((&flags, rest)) = a.split_first() else {
        return Ok(());
    };
    if flags & 0x02 != 0 {
        return Err(Violation::TsAdaptation);
    }
    let mut o = 0;
    for (bit, n) in [(0x10, 6), (0x08, 6), (0x04, 1)] {
        if flags & bit != 0 {
            o += n;
        }
    }
    if flags & 0x01 != 0 {
        let n = usize::from(*rest.get(o).ok_or(Violation::TsAdaptation)?);
        o += 1 + n;
    }
    match rest.get(o..) {
        Some(stuffing) if all_ff(stuffing) => Ok(()),
        _ => Err(Violation::TsAdaptation),
    }
}

const CRC_TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = (i as u32) << 24;
        let mut k = 0;
        while k < 8 {
            c = if c & 0x8000_0000 != 0 {
                (c << 1) ^ 0x04c1_1db7
            } else {
                c << 1
            };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// CRC-32/MPEG-2 over a section including its CRC field: 0 when it is right.
fn crc32_mpeg(b: &[u8]) -> u32 {
    b.iter().fold(0xffff_ffff, |c, &x| {
        (c << 8) ^ CRC_TABLE[((c >> 24) as u8 ^ x) as usize]
    })
}
