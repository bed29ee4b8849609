//! Framings that carry RTP packets on a byte stream, and the de-framer that takes them back
//! out of whatever a peer sends.
//!
//! A [`Framing`] says only how one frame's header looks: RFC 4571 ([`Rfc4571`], a 2-byte
//! length) for GB/T 28181 `TCP/RTP/AVP`, RTSP interleaved ([`Interleaved`], `$`, a channel
//! byte, a 2-byte length, RFC 2326 §10.12). The [`Deframer`] does the rest the same way for
//! both: a caller-owned buffer, complete frames handed out in place, and untrusted input
//! counted instead of trusted. A frame is accepted only if its length is 1..=`max` and its
//! payload starts like RTP/RTCP version 2. A frame longer than `max` whose payload starts
//! like RTP v2, met while the de-framer is in step with the stream, is a real frame too long
//! to forward (RFC 4571 allows any 16-bit length; a device on TCP is not bound by the MTU):
//! it is skipped whole and counted `oversize`, never searched for frames inside. Anything
//! else is a framing error and the de-framer resynchronises one byte further on (garbage
//! before the first frame, a length of 0, a length whose payload is not RTP); while it
//! resynchronises, a long length is not trusted either. One error is counted per run of bad
//! bytes, not per byte.

use std::ops::Range;

/// What a framing found at the start of a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Header {
    /// Not enough bytes to tell.
    Need,
    /// A header of `header` bytes announcing `len` payload bytes on `channel` (RFC 4571: 0).
    Frame {
        header: usize,
        len: usize,
        channel: u8,
    },
    /// These bytes cannot start a frame.
    NotAHeader,
}

/// How one frame's header is written and read. Implementations hold no state.
pub trait Framing: Send + Sync + 'static {
    /// Bytes the header takes.
    fn header_len(&self) -> usize;
    /// Writes the header of a `len`-byte frame on `channel` into `out` (exactly
    /// [`Framing::header_len`] bytes). `len` is at most 65535.
    fn write_header(&self, channel: u8, len: u16, out: &mut [u8]);
    /// Reads a header at the start of `buf`.
    fn parse(&self, buf: &[u8]) -> Header;
}

/// RFC 4571 §2: each packet preceded by its length, 16 bits, network order. GB/T 28181
/// `TCP/RTP/AVP` media.
#[derive(Clone, Copy, Debug, Default)]
pub struct Rfc4571;

impl Framing for Rfc4571 {
    fn header_len(&self) -> usize {
        2
    }
    fn write_header(&self, _channel: u8, len: u16, out: &mut [u8]) {
        out[..2].copy_from_slice(&len.to_be_bytes());
    }
    fn parse(&self, buf: &[u8]) -> Header {
        match buf {
            [h, l, ..] => Header::Frame {
                header: 2,
                len: usize::from(u16::from_be_bytes([*h, *l])),
                channel: 0,
            },
            _ => Header::Need,
        }
    }
}

/// RTSP interleaved binary data (RFC 2326 §10.12): `$`, channel, 16-bit length. The RTSP
/// proxy separates these frames from RTSP messages on the same connection; this framing
/// only reads and writes the frames.
#[derive(Clone, Copy, Debug, Default)]
pub struct Interleaved;

impl Framing for Interleaved {
    fn header_len(&self) -> usize {
        4
    }
    fn write_header(&self, channel: u8, len: u16, out: &mut [u8]) {
        out[0] = b'$';
        out[1] = channel;
        out[2..4].copy_from_slice(&len.to_be_bytes());
    }
    fn parse(&self, buf: &[u8]) -> Header {
        match buf {
            [b'$', c, h, l, ..] => Header::Frame {
                header: 4,
                len: usize::from(u16::from_be_bytes([*h, *l])),
                channel: *c,
            },
            [b'$', ..] | [] => Header::Need,
            _ => Header::NotAHeader,
        }
    }
}

/// What a de-framer counted; plain numbers, added to a leg's atomics by its thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeframeTally {
    pub frames: u64,
    pub bytes: u64,
    /// Runs of bytes that were not a valid frame (garbage, length 0, length > max, payload
    /// not RTP/RTCP version 2), one per run.
    pub framing_errors: u64,
    /// Bytes skipped: in those runs and in oversize frames (headers included).
    pub skipped_bytes: u64,
    /// Whole frames longer than `max` skipped (in step with the stream, payload RTP v2).
    pub oversize: u64,
}

/// Takes frames out of a byte stream. The caller reads into [`Deframer::space`], reports
/// the count with [`Deframer::filled`], then takes frames with [`Deframer::drain`].
pub struct Deframer<F: Framing> {
    framing: F,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    max: usize,
    /// Inside a run of bad bytes (its error is already counted).
    bad_run: bool,
    /// Bytes of an oversize frame still to skip (they may not have arrived yet).
    discard: usize,
}

impl<F: Framing> Deframer<F> {
    /// A de-framer accepting payloads of 1..=`max` bytes (at most 65535).
    pub fn new(framing: F, max: usize) -> Deframer<F> {
        let max = max.clamp(1, 65535);
        // Room for two largest frames (a partial one kept at the front never blocks a
        // read), and at least 64 KiB so one read brings a batch of frames (one sendmmsg).
        let cap = (2 * (framing.header_len() + max) + 4096).max(64 * 1024);
        Deframer {
            framing,
            buf: vec![0; cap].into_boxed_slice(),
            start: 0,
            end: 0,
            max,
            bad_run: false,
            discard: 0,
        }
    }

    /// Where the next read goes: never empty.
    pub fn space(&mut self) -> &mut [u8] {
        if self.start > 0 && self.buf.len() - self.end < self.framing.header_len() + self.max {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        &mut self.buf[self.end..]
    }

    /// `n` bytes were read into [`Deframer::space`].
    pub fn filled(&mut self, n: usize) {
        self.end = (self.end + n).min(self.buf.len());
    }

    /// Records every complete frame as (channel, range in the buffer) into `out` (cleared
    /// first), counting into `t`; read each with [`Deframer::bytes`] before the next
    /// [`Deframer::space`]. Lets a caller batch the frames of one read (one `sendmmsg`).
    pub fn drain_ranges(&mut self, t: &mut DeframeTally, out: &mut Vec<(u8, Range<usize>)>) {
        out.clear();
        let base = self.buf.as_ptr() as usize;
        self.drain(t, |c, p| {
            let at = p.as_ptr() as usize - base;
            out.push((c, at..at + p.len()));
        });
    }

    /// The bytes of a range [`Deframer::drain_ranges`] recorded.
    pub fn bytes(&self, r: Range<usize>) -> &[u8] {
        self.buf.get(r).unwrap_or_default()
    }

    /// Frames one buffer can hold at most (for sizing the list given to
    /// [`Deframer::drain_ranges`] once).
    pub fn max_frames(&self) -> usize {
        self.buf.len() / (self.framing.header_len() + 1) + 1
    }

    /// Hands every complete frame to `f(channel, payload)`, counting into `t`.
    pub fn drain(&mut self, t: &mut DeframeTally, mut f: impl FnMut(u8, &[u8])) {
        loop {
            if self.discard > 0 {
                let n = self.discard.min(self.end - self.start);
                if n == 0 {
                    return;
                }
                self.discard -= n;
                t.skipped_bytes += n as u64;
                self.consumed(n);
                continue;
            }
            let avail = &self.buf[self.start..self.end];
            let (header, len, channel) = match self.framing.parse(avail) {
                Header::Need => return,
                Header::NotAHeader => {
                    self.skip(t);
                    continue;
                }
                Header::Frame {
                    header,
                    len,
                    channel,
                } => (header, len, channel),
            };
            if len > self.max && !self.bad_run {
                // In step with the stream, a length is trusted once its payload starts like
                // RTP: the whole frame goes, nothing inside it is read as frames.
                match avail.get(header) {
                    None => return,
                    Some(b) if b >> 6 == 2 => {
                        t.oversize += 1;
                        self.discard = header + len;
                        continue;
                    }
                    Some(_) => {}
                }
            }
            if len == 0 || len > self.max {
                self.skip(t);
                continue;
            }
            let Some(payload) = avail.get(header..header + len) else {
                // The frame is not complete; but a payload that already shows it is not
                // RTP/RTCP need not be waited for.
                if avail.get(header).is_some_and(|b| b >> 6 != 2) {
                    self.skip(t);
                    continue;
                }
                return;
            };
            if payload[0] >> 6 != 2 {
                self.skip(t);
                continue;
            }
            self.bad_run = false;
            t.frames += 1;
            t.bytes += len as u64;
            f(channel, payload);
            self.consumed(header + len);
        }
    }

    fn consumed(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    fn skip(&mut self, t: &mut DeframeTally) {
        if !self.bad_run {
            t.framing_errors += 1;
            self.bad_run = true;
        }
        t.skipped_bytes += 1;
        self.start += 1;
    }

    /// The framing it reads.
    pub fn framing(&self) -> &F {
        &self.framing
    }

    /// Bytes left that are not a complete frame (at a close: a partial frame).
    pub fn pending(&self) -> usize {
        self.end - self.start
    }

    /// In the middle of a frame: bytes pending, or an oversize frame not all skipped yet.
    pub fn mid_frame(&self) -> bool {
        self.pending() > 0 || self.discard > 0
    }

    /// Forgets everything buffered (a connection replaced by another): the next one starts
    /// in step.
    pub fn reset(&mut self) {
        self.start = 0;
        self.end = 0;
        self.bad_run = false;
        self.discard = 0;
    }
}

/// Writes `payload` framed into `out` if it fits in `out`'s spare capacity (never grows it);
/// `false` when it does not fit or is too long to frame.
pub fn frame_into<F: Framing + ?Sized>(
    framing: &F,
    channel: u8,
    payload: &[u8],
    out: &mut Vec<u8>,
) -> bool {
    let h = framing.header_len();
    let Ok(len) = u16::try_from(payload.len()) else {
        return false;
    };
    if out.capacity() - out.len() < h + payload.len() {
        return false;
    }
    let at = out.len();
    out.resize(at + h, 0);
    framing.write_header(channel, len, &mut out[at..]);
    out.extend_from_slice(payload);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rtp(seq: u16, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        crate::wire::rtp::write_header(&mut b, 96, seq, 0, 1).unwrap();
        b
    }

    fn feed<F: Framing>(
        d: &mut Deframer<F>,
        bytes: &[u8],
        chunk: usize,
    ) -> (DeframeTally, Vec<Vec<u8>>) {
        let mut t = DeframeTally::default();
        let mut got = Vec::new();
        for mut c in bytes.chunks(chunk) {
            while !c.is_empty() {
                let s = d.space();
                let n = s.len().min(c.len());
                s[..n].copy_from_slice(&c[..n]);
                d.filled(n);
                c = &c[n..];
                d.drain(&mut t, |_, p| got.push(p.to_vec()));
            }
        }
        (t, got)
    }

    fn framed(payloads: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::with_capacity(payloads.iter().map(|p| 2 + p.len()).sum());
        for p in payloads {
            assert!(frame_into(&Rfc4571, 0, p, &mut out));
        }
        out
    }

    #[test]
    fn round_trip_in_any_chunking() {
        let ps: Vec<_> = (0..50).map(|i| rtp(i, 12 + usize::from(i) * 17)).collect();
        let bytes = framed(&ps);
        for chunk in [1, 2, 3, 7, 100, 1500, 65536] {
            let mut d = Deframer::new(Rfc4571, 1472);
            let (t, got) = feed(&mut d, &bytes, chunk);
            assert_eq!(got, ps, "chunk {chunk}");
            assert_eq!((t.frames, t.framing_errors, d.pending()), (50, 0, 0));
        }
    }

    #[test]
    fn bad_input_is_counted_and_skipped() {
        let good = rtp(1, 200);
        // Garbage before the first frame, a zero length, a 65535 length whose payload is not
        // RTP, then good frames.
        let mut bytes = b"GET / HTTP/1.0\r\n\r\n".to_vec();
        bytes.extend_from_slice(&framed(std::slice::from_ref(&good)));
        bytes.extend_from_slice(&[0, 0]);
        bytes.extend_from_slice(&framed(std::slice::from_ref(&good)));
        bytes.extend_from_slice(&[0xff, 0xff, 0x41, 0x60]);
        bytes.extend_from_slice(&framed(&[good.clone(), good.clone()]));
        let mut d = Deframer::new(Rfc4571, 1472);
        let (t, got) = feed(&mut d, &bytes, 5);
        assert_eq!(got.len(), 4, "every good frame survives");
        assert!(got.iter().all(|g| *g == good));
        assert_eq!(
            t.framing_errors, 3,
            "garbage, zero length, oversize: one each"
        );
        assert_eq!(d.pending(), 0);
    }

    /// A frame whose payload is itself RFC 4571 frames of RTP: what a de-framer that lost
    /// step inside it would inject.
    fn frame_full_of_fake_frames(len: usize) -> Vec<u8> {
        let mut p = rtp(7, 12);
        while p.len() < len {
            p.extend_from_slice(&[0, 12, 0x80, 0x60, 0xee, 0xee]);
            p.extend_from_slice(&[0xee; 8]);
        }
        p.truncate(len);
        p
    }

    #[test]
    fn oversize_frame_is_skipped_whole_in_any_chunking() {
        let big = frame_full_of_fake_frames(3000);
        let max_len = rtp(9, 65535 - 2);
        let before = rtp(1, 100);
        let after = rtp(2, 1472);
        let bytes = framed(&[
            before.clone(),
            big.clone(),
            after.clone(),
            max_len,
            big,
            after.clone(),
        ]);
        for chunk in [1, 2, 3, 7, 100, 1500, 4096, 65536] {
            let mut d = Deframer::new(Rfc4571, 1472);
            let (t, got) = feed(&mut d, &bytes, chunk);
            assert_eq!(
                got,
                vec![before.clone(), after.clone(), after.clone()],
                "chunk {chunk}"
            );
            assert_eq!(
                (t.frames, t.oversize, t.framing_errors, d.pending()),
                (3, 3, 0, 0),
                "chunk {chunk}"
            );
            assert_eq!(
                t.skipped_bytes,
                2 + 3000 + 65535 + 2 + 3000,
                "chunk {chunk}"
            );
        }
    }

    #[test]
    fn cut_oversize_frame_is_pending() {
        let bytes = framed(&[rtp(1, 100), rtp(2, 5000)]);
        let mut d = Deframer::new(Rfc4571, 1472);
        let (t, got) = feed(&mut d, &bytes[..bytes.len() - 10], 512);
        assert_eq!((got.len(), t.oversize), (1, 1));
        assert_eq!(d.pending(), 0, "what came of the frame is skipped");
        assert!(d.mid_frame(), "10 bytes of it still to come");
        d.reset();
        assert!(!d.mid_frame());
    }

    #[test]
    fn long_lengths_are_not_trusted_while_resynchronising() {
        // Garbage, then what looks like a 4000-byte frame, then good frames: the de-framer
        // is out of step, so it does not skip 4000 bytes on the garbage's word.
        let good = rtp(3, 40);
        let mut bytes = b"junk".to_vec();
        bytes.extend_from_slice(&[0x0f, 0xa0, 0x80, 0x60]);
        bytes.extend_from_slice(&framed(&[good.clone(), good.clone()]));
        let mut d = Deframer::new(Rfc4571, 1472);
        let (t, got) = feed(&mut d, &bytes, 3);
        assert_eq!(got, vec![good.clone(), good]);
        assert_eq!((t.oversize, t.framing_errors), (0, 1));
    }

    #[test]
    fn cut_frame_stays_pending() {
        let bytes = framed(&[rtp(1, 100), rtp(2, 100)]);
        let mut d = Deframer::new(Rfc4571, 1472);
        let (t, got) = feed(&mut d, &bytes[..bytes.len() - 10], 64);
        assert_eq!((got.len(), t.frames), (1, 1));
        assert_eq!(d.pending(), 92);
    }

    #[test]
    fn endless_garbage_is_bounded() {
        let mut d = Deframer::new(Rfc4571, 1472);
        let junk = vec![0x41u8; 1 << 20];
        let (t, got) = feed(&mut d, &junk, 4096);
        assert!(got.is_empty());
        assert_eq!(t.framing_errors, 1);
        assert!(d.pending() < 2 + 1472);
    }

    #[test]
    fn interleaved_frames_carry_channels() {
        let mut out = Vec::with_capacity(4096);
        assert!(frame_into(&Interleaved, 3, &rtp(9, 40), &mut out));
        out.splice(0..0, b"xx".iter().copied());
        let mut d = Deframer::new(Interleaved, 1472);
        let mut t = DeframeTally::default();
        let s = d.space();
        s[..out.len()].copy_from_slice(&out);
        d.filled(out.len());
        let mut seen = Vec::new();
        d.drain(&mut t, |c, p| seen.push((c, p.len())));
        assert_eq!(seen, vec![(3, 40)]);
        assert_eq!(t.framing_errors, 1);
    }

    #[test]
    fn frame_into_never_grows() {
        let mut out = Vec::with_capacity(10);
        assert!(!frame_into(&Rfc4571, 0, &[0x80; 9], &mut out));
        assert!(frame_into(&Rfc4571, 0, &[0x80; 8], &mut out));
        assert_eq!(out.capacity(), 10);
    }
}
