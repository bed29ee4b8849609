//! The RTP header (RFC 3550 §5.1) and a stream's progress: one SSRC, a sequence number that
//! moves forward, timestamps plausible for the clock rate and, for video, one timestamp per
//! frame.

use super::{Format, Policy, RtpInfo, Violation};

/// A parsed RTP header; `payload` is what lies between the header (with its extension) and
/// the padding.
pub(super) struct Header<'a> {
    pub pt: u8,
    pub marker: bool,
    pub seq: u16,
    pub timestamp: u32,
    pub ssrc: u32,
    pub payload: &'a [u8],
}

impl<'a> Header<'a> {
    pub fn parse(p: &'a [u8], policy: &Policy) -> Result<Header<'a>, Violation> {
        let fixed = p.get(..12).ok_or(Violation::RtpTruncated)?;
        if fixed[0] >> 6 != 2 {
            return Err(Violation::RtpVersion);
        }
        if fixed[0] & 0x0f != 0 {
            return Err(Violation::Csrc);
        }
        let mut start = 12;
        if fixed[0] & 0x10 != 0 {
            if !policy.allow_extension {
                return Err(Violation::Extension);
            }
            let ext = p.get(12..16).ok_or(Violation::RtpTruncated)?;
            start = 16 + 4 * usize::from(u16::from_be_bytes([ext[2], ext[3]]));
            if start > p.len() {
                return Err(Violation::RtpTruncated);
            }
        }
        let mut end = p.len();
        if fixed[0] & 0x20 != 0 {
            if !policy.allow_padding {
                return Err(Violation::Padding);
            }
            let n = usize::from(p[end - 1]);
            if n == 0 || n > end - start {
                return Err(Violation::Padding);
            }
            end -= n;
        }
        if start == end {
            return Err(Violation::EmptyPayload);
        }
        Ok(Header {
            pt: fixed[1] & 0x7f,
            marker: fixed[1] & 0x80 != 0,
            seq: u16::from_be_bytes([fixed[2], fixed[3]]),
            timestamp: u32::from_be_bytes([fixed[4], fixed[5], fixed[6], fixed[7]]),
            ssrc: u32::from_be_bytes([fixed[8], fixed[9], fixed[10], fixed[11]]),
            payload: &p[start..end],
        })
    }
}

/// Late or duplicate packets this far behind are "out of order"; further back is a jump.
const MAX_MISORDER: i32 = 100;

#[derive(Clone, Debug, Default)]
pub(super) struct RtpState {
    ssrc: Option<u32>,
    /// When the last packet was accepted (ms), for re-learning the SSRC after silence.
    last_ok_ms: u64,
    /// The last accepted packet.
    last: Option<Last>,
    /// After a jump: the sequence number that confirms the new position.
    probe: Option<u16>,
    /// After a timestamp jump: the next sequence number and the jumping packet's timestamp;
    /// a packet with that number and a timestamp plausible from there confirms the jump.
    ts_probe: Option<(u16, u32)>,
    pub ssrc_changes: u64,
}

#[derive(Clone, Copy, Debug)]
struct Last {
    seq: u16,
    ts: u32,
    marker: bool,
    len: usize,
}

impl RtpState {
    /// Checks the SSRC; `Ok(true)` when a new one was learnt (the caller resets its state).
    pub fn check_ssrc(
        &mut self,
        ssrc: u32,
        negotiated: Option<u32>,
        policy: &Policy,
        now_ms: u64,
    ) -> Result<bool, Violation> {
        if let Some(want) = negotiated {
            if ssrc != want {
                return Err(Violation::SsrcMismatch);
            }
        }
        match self.ssrc {
            Some(s) if s == ssrc => Ok(false),
            Some(_) if now_ms.saturating_sub(self.last_ok_ms) < policy.ssrc_relearn_after_ms => {
                Err(Violation::SsrcChanged)
            }
            old => {
                if old.is_some() {
                    self.ssrc_changes += 1;
                }
                *self = RtpState {
                    ssrc: Some(ssrc),
                    last_ok_ms: now_ms,
                    ssrc_changes: self.ssrc_changes,
                    ..RtpState::default()
                };
                Ok(true)
            }
        }
    }

    /// Sequence and timestamp progress; what the codec checks need to know about it.
    pub fn progress(
        &mut self,
        h: &Header<'_>,
        format: Format,
        policy: &Policy,
    ) -> Result<RtpInfo, Violation> {
        let mut info = RtpInfo {
            marker: h.marker,
            timestamp: h.timestamp,
            clock_rate: format.clock_rate,
            gap: true,
            prev_marker: true,
            ts_delta: None,
            prev_len: 0,
        };
        let Some(last) = self.last else {
            return Ok(info);
        };
        let d = i32::from(h.seq.wrapping_sub(last.seq) as i16);
        if d <= 0 && d > -MAX_MISORDER {
            return Err(Violation::SeqOutOfOrder);
        }
        if d <= 0 || d > i32::from(policy.max_seq_gap) {
            // A jump: believed once the next packet follows the new number.
            if self.probe != Some(h.seq) {
                self.probe = Some(h.seq.wrapping_add(1));
                return Err(Violation::SeqJump);
            }
            self.probe = None;
            return Ok(info);
        }
        let dts = h.timestamp.wrapping_sub(last.ts) as i32;
        let clock = i64::from(format.clock_rate);
        if i64::from(dts) > 10 * clock || i64::from(dts) < -clock {
            // Believed once the next packet follows it (as a sequence jump is): after a long
            // outage of a slow stream every later packet would otherwise be compared with the
            // same stale one and the stream refused for good.
            let confirmed = self.ts_probe.is_some_and(|(seq, ts)| {
                let from_probe = i64::from(h.timestamp.wrapping_sub(ts) as i32);
                seq == h.seq && from_probe <= 10 * clock && from_probe >= -clock
            });
            if !confirmed {
                self.ts_probe = Some((h.seq.wrapping_add(1), h.timestamp));
                return Err(Violation::TimestampJump);
            }
            self.ts_probe = None;
            return Ok(info);
        }
        info.gap = d != 1;
        info.prev_marker = last.marker;
        info.ts_delta = Some(dts);
        info.prev_len = last.len;
        if format.codec.is_video() && !info.gap && format.codec != super::Codec::Mp2t {
            // GB/T 28181-2022 and RFC 6184 §5.1: one timestamp per frame (access unit).
            let same = dts == 0;
            if same == last.marker {
                return Err(Violation::FrameTimestamp);
            }
        }
        Ok(info)
    }

    pub fn accept(&mut self, h: &Header<'_>, len: usize, now_ms: u64) {
        self.last = Some(Last {
            seq: h.seq,
            ts: h.timestamp,
            marker: h.marker,
            len,
        });
        self.probe = None;
        self.ts_probe = None;
        self.last_ok_ms = now_ms;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::Codec;

    fn packet(seq: u16, ts: u32, marker: bool) -> Vec<u8> {
        let mut p = vec![0x80, 96 | if marker { 0x80 } else { 0 }];
        p.extend_from_slice(&seq.to_be_bytes());
        p.extend_from_slice(&ts.to_be_bytes());
        p.extend_from_slice(&7u32.to_be_bytes());
        p.push(0x41);
        p
    }

    /// Feeds one packet and accepts it when its progress is plausible.
    fn feed(st: &mut RtpState, seq: u16, ts: u32) -> Result<(), Violation> {
        let policy = Policy::default();
        let format = Format {
            pt: 96,
            codec: Codec::H264,
            clock_rate: 90_000,
        };
        let p = packet(seq, ts, true);
        let h = Header::parse(&p, &policy).unwrap();
        st.progress(&h, format, &policy)?;
        st.accept(&h, p.len(), 0);
        Ok(())
    }

    #[test]
    fn a_timestamp_jump_is_believed_once_the_next_packet_follows_it() {
        let mut st = RtpState::default();
        feed(&mut st, 1, 0).unwrap();
        feed(&mut st, 2, 3000).unwrap();
        // 20 s of clock later (an outage of a slow stream with few packets lost).
        let far = 3000 + 20 * 90_000;
        assert_eq!(feed(&mut st, 10, far), Err(Violation::TimestampJump));
        feed(&mut st, 11, far + 3000).unwrap();
        feed(&mut st, 12, far + 6000).unwrap();
    }

    #[test]
    fn jumping_timestamps_that_never_settle_stay_refused() {
        let mut st = RtpState::default();
        feed(&mut st, 1, 0).unwrap();
        let mut ts: u32 = 0;
        for seq in 2..50u16 {
            ts = ts.wrapping_add(20 * 90_000);
            assert_eq!(
                feed(&mut st, seq, ts),
                Err(Violation::TimestampJump),
                "seq {seq}"
            );
        }
        // A confirming number with a timestamp that jumps again from the probe is refused too.
        let mut st = RtpState::default();
        feed(&mut st, 1, 0).unwrap();
        assert_eq!(feed(&mut st, 2, 20 * 90_000), Err(Violation::TimestampJump));
        assert_eq!(feed(&mut st, 3, 40 * 90_000), Err(Violation::TimestampJump));
    }
}
