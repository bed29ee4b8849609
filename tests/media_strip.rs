//! The strip action of the media validator (`validate = "strip"`, [`Policy::strip`]) against
//! real encoders and crafted carriers.
//!
//! - **Real encoders**: every stream of `tests/golden/media/` goes through
//!   [`Stream::check_mut`]; nothing is refused, what is not PS padding/private data or SEI
//!   user data is forwarded byte for byte, and what comes out validates again under the
//!   default policy (sequence continuous, frames whole) with the encoders' banners (SEI user
//!   data) and every padding byte gone.
//! - **Covert data**: PS private streams (0xBD, 0xBF) and padding full of data, in one
//!   packet and spread over several, and SEI user data in single NAL units, aggregation
//!   packets and fragments, are cut out: none of their bytes is left, the rest is exact.

use vgate::media::{Codec, Policy, Stream, Verdict, Violation};

#[path = "common/media_corpus.rs"]
mod media_corpus;
use media_corpus::{fixture, fixtures, stream, Fixture};

fn strip() -> Policy {
    Policy {
        strip: true,
        ..Policy::default()
    }
}

/// What the strip action makes of `pkts`: the packets forwarded, and (reason, packets)
/// counts of what it cut; panics on a refusal.
struct Out {
    forwarded: Vec<Vec<u8>>,
    rewritten: usize,
    away: usize,
    cut_bytes: usize,
    reasons: Vec<Violation>,
}

fn run_strip(f: &Fixture, s: &mut Stream, pkts: &[Vec<u8>], t0: u64) -> Out {
    let policy = strip();
    let mut out = Out {
        forwarded: Vec::new(),
        rewritten: 0,
        away: 0,
        cut_bytes: 0,
        reasons: Vec::new(),
    };
    for (i, p) in pkts.iter().enumerate() {
        let mut b = p.clone();
        match s.check_mut(&policy, &mut b, t0 + i as u64) {
            Verdict::Pass => out.forwarded.push(b),
            Verdict::Strip { len, reason } => {
                out.rewritten += 1;
                out.cut_bytes += p.len() - len;
                out.reasons.push(reason);
                b.truncate(len);
                out.forwarded.push(b);
            }
            Verdict::StrippedAway(reason) => {
                out.away += 1;
                out.cut_bytes += p.len() - 12;
                out.reasons.push(reason);
            }
            Verdict::Drop(v) => panic!("{}: packet {i} refused under strip: {v:?}", f.name),
        }
    }
    out
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// PS units the strip action removes: private streams, and padding that holds any byte.
fn ps_covert_units(ps: &[u8]) -> usize {
    ps.windows(6)
        .filter(|w| {
            w[..3] == [0, 0, 1]
                && (matches!(w[3], 0xbd | 0xbf) || (w[3] == 0xbe && (w[4], w[5]) != (0, 0)))
        })
        .count()
}

#[test]
fn real_encoders_pass_the_strip_action_and_validate_again() {
    for f in fixtures() {
        let mut s = stream(&f);
        let out = run_strip(&f, &mut s, &f.packets, 0);
        // What comes out is a stream the default policy (without strip) accepts whole.
        let mut again = stream(&f);
        for (i, p) in out.forwarded.iter().enumerate() {
            assert_eq!(
                again.check(&Policy::default(), p, i as u64),
                Verdict::Pass,
                "{}: forwarded packet {i} after strip",
                f.name
            );
        }
        let all_in: Vec<u8> = f.packets.iter().flat_map(|p| p[12..].to_vec()).collect();
        let all_out: Vec<u8> = out
            .forwarded
            .iter()
            .flat_map(|p| p[12..].to_vec())
            .collect();
        println!(
            "{:24} {:5} packets: {} rewritten, {} stripped away, {} bytes cut {:?}",
            f.name,
            f.packets.len(),
            out.rewritten,
            out.away,
            out.cut_bytes,
            out.reasons.first()
        );
        assert_eq!(
            out.forwarded.len() + out.away,
            f.packets.len(),
            "{}",
            f.name
        );
        match f.codec {
            Codec::Ps => {
                assert_eq!(ps_covert_units(&all_out), 0, "{}: padding left", f.name);
                assert!(
                    out.reasons.iter().all(|r| *r == Violation::PsPadding),
                    "{}",
                    f.name
                );
            }
            Codec::H264 | Codec::H265 => {
                // The encoders' banners are SEI user data.
                for banner in [&b"x264 - core"[..], b"x265 (build"] {
                    assert!(!contains(&all_out, banner), "{}: banner left", f.name);
                }
                if f.name.starts_with("ffmpeg_h26") {
                    assert!(out.away + out.rewritten > 0, "{}: banner not cut", f.name);
                }
                assert!(out.reasons.iter().all(|r| *r == Violation::SeiUserData));
            }
            _ => {
                // Nothing to strip in these formats: forwarded byte for byte.
                assert_eq!(out.forwarded, f.packets, "{}", f.name);
            }
        }
        if out.rewritten + out.away == 0 {
            assert_eq!(all_in, all_out, "{}", f.name);
        }
        // The sequence numbers forwarded follow each other without a gap.
        for w in out.forwarded.windows(2) {
            let a = u16::from_be_bytes([w[0][2], w[0][3]]);
            let b = u16::from_be_bytes([w[1][2], w[1][3]]);
            assert_eq!(b, a.wrapping_add(1), "{}", f.name);
        }
    }
}

fn xorshift(seed: &mut u64) -> u8 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    (*seed >> 24) as u8
}

/// Random bytes without the byte 0x00 (so they never look like a start code), marked with
/// a recognisable prefix.
fn covert(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed;
    let mut v = b"COVERT".to_vec();
    v.extend((0..n).map(|_| xorshift(&mut s) | 1));
    v
}

fn pes(id: u8, body: &[u8], len: usize) -> Vec<u8> {
    let mut v = vec![0, 0, 1, id];
    v.extend_from_slice(&(len as u16).to_be_bytes());
    v.extend_from_slice(body);
    v
}

/// The index of a packet of `f` right after a frame end, and the stream fed up to it.
fn after_frame(f: &Fixture) -> (usize, Stream) {
    let k = (6..f.packets.len())
        .find(|&i| f.packets[i - 1][1] & 0x80 != 0)
        .unwrap();
    let mut s = stream(f);
    for (i, p) in f.packets[..k].iter().enumerate() {
        assert!(s.check(&Policy::default(), p, i as u64).is_pass());
    }
    (k, s)
}

/// An RTP packet following packet `prev` of the stream (sequence + 1, a new timestamp
/// unless `same_ts`).
fn rtp_after(prev: &[u8], payload: &[u8], marker: bool, same_ts: bool) -> Vec<u8> {
    let mut p = prev[..12].to_vec();
    let seq = u16::from_be_bytes([p[2], p[3]]).wrapping_add(1);
    p[2..4].copy_from_slice(&seq.to_be_bytes());
    if !same_ts {
        let ts = u32::from_be_bytes([p[4], p[5], p[6], p[7]]).wrapping_add(3600);
        p[4..8].copy_from_slice(&ts.to_be_bytes());
    }
    p[1] = (p[1] & 0x7f) | if marker { 0x80 } else { 0 };
    p.extend_from_slice(payload);
    p
}

#[test]
fn ps_private_streams_and_padding_are_cut_out() {
    let f = fixture("ffmpeg_ps_h264");
    let (k, _) = after_frame(&f);
    let pack = &f.packets[k][12..];
    let pack = pack[..14 + usize::from(pack[13] & 7)].to_vec();
    let policy = strip();
    for (id, why) in [
        (0xbd, Violation::PsPrivateStream),
        (0xbf, Violation::PsPrivateStream),
        (0xbe, Violation::PsPadding),
    ] {
        // In one packet: the pack header, the unit, the pack header again is not needed;
        // what is left is the pack header alone.
        let data = covert(600, u64::from(id));
        let mut payload = pack.clone();
        payload.extend_from_slice(&pes(id, &data, data.len()));
        let (_, mut s) = after_frame(&f);
        let mut p = rtp_after(&f.packets[k - 1], &payload, true, false);
        let n = p.len();
        assert_eq!(
            s.check_mut(&policy, &mut p, k as u64),
            Verdict::Strip {
                len: 12 + pack.len(),
                reason: why
            },
            "{id:#x}"
        );
        assert_eq!(&p[12..12 + pack.len()], &pack[..]);
        assert_eq!(n - (12 + pack.len()), 6 + data.len());

        // Across three packets: the unit starts after the pack header, fills the second
        // packet (stripped away) and ends in the third, where video follows.
        let data = covert(2500, u64::from(id) + 1);
        let unit = pes(id, &data, data.len());
        let mut first = pack.clone();
        first.extend_from_slice(&unit[..1000]);
        let second = unit[1000..2200].to_vec();
        let mut third = unit[2200..].to_vec();
        let video = pes(0xe0, &[0x80, 0x00, 0x00, 0xff, 0xff], 5);
        third.extend_from_slice(&video);
        let (_, mut s) = after_frame(&f);
        let mut p1 = rtp_after(&f.packets[k - 1], &first, false, false);
        let mut p2 = rtp_after(&p1, &second, false, true);
        let mut p3 = rtp_after(&p2, &third, true, true);
        let seq1 = u16::from_be_bytes([p1[2], p1[3]]);
        assert_eq!(
            s.check_mut(&policy, &mut p1, 1000),
            Verdict::Strip {
                len: 12 + pack.len(),
                reason: why
            }
        );
        assert_eq!(
            s.check_mut(&policy, &mut p2, 1001),
            Verdict::StrippedAway(why)
        );
        assert_eq!(
            s.check_mut(&policy, &mut p3, 1002),
            Verdict::Strip {
                len: 12 + video.len(),
                reason: why
            }
        );
        assert_eq!(&p3[12..12 + video.len()], &video[..]);
        // The packet stripped away leaves no gap in the sequence.
        assert_eq!(u16::from_be_bytes([p3[2], p3[3]]), seq1.wrapping_add(1));
        let mut next = f.packets[k].clone();
        let seq = u16::from_be_bytes([p3[2], p3[3]]).wrapping_add(2);
        next[2..4].copy_from_slice(&seq.to_be_bytes());
        let ts = u32::from_be_bytes([p3[4], p3[5], p3[6], p3[7]]).wrapping_add(3600);
        next[4..8].copy_from_slice(&ts.to_be_bytes());
        let sent = u16::from_be_bytes([next[2], next[3]]);
        let v = s.check_mut(&policy, &mut next, 1003);
        assert!(matches!(v, Verdict::Pass | Verdict::Strip { .. }), "{v:?}");
        assert_eq!(u16::from_be_bytes([next[2], next[3]]), sent.wrapping_sub(1));

        // A frame's last packet all private data keeps the marker and an empty padding unit.
        let (_, mut s) = after_frame(&f);
        let mut first = pack.clone();
        first.extend_from_slice(&unit[..1000]);
        let mut p1 = rtp_after(&f.packets[k - 1], &first, false, false);
        let mut p2 = rtp_after(&p1, &unit[1000..], true, true);
        assert!(matches!(
            s.check_mut(&policy, &mut p1, 2000),
            Verdict::Strip { .. }
        ));
        assert_eq!(
            s.check_mut(&policy, &mut p2, 2001),
            Verdict::Strip {
                len: 18,
                reason: why
            }
        );
        assert_eq!(&p2[12..18], &[0, 0, 1, 0xbe, 0, 0]);
        assert_ne!(p2[1] & 0x80, 0);
    }
    // Without strip (enforce) the same packet is refused, as before.
    let data = covert(100, 9);
    let mut payload = pack.clone();
    payload.extend_from_slice(&pes(0xbd, &data, data.len()));
    let (_, mut s) = after_frame(&f);
    let mut p = rtp_after(&f.packets[k - 1], &payload, true, false);
    assert_eq!(
        s.check_mut(&Policy::default(), &mut p, 1),
        Verdict::Drop(Violation::PsPrivateStream)
    );
}

#[test]
fn a_private_stream_whose_header_straddles_packets_is_refused() {
    // Its first bytes crossed in the previous packet; they cannot be cut any more.
    let f = fixture("ffmpeg_ps_h264");
    let (k, mut s) = after_frame(&f);
    let pack = &f.packets[k][12..];
    let mut first = pack[..14 + usize::from(pack[13] & 7)].to_vec();
    first.extend_from_slice(&[0, 0, 1, 0xbd]);
    let data = covert(100, 4);
    let mut second = 106u16.to_be_bytes().to_vec();
    second.extend_from_slice(&data);
    let policy = strip();
    let mut p1 = rtp_after(&f.packets[k - 1], &first, false, false);
    let mut p2 = rtp_after(&p1, &second, true, true);
    assert_eq!(s.check_mut(&policy, &mut p1, 1), Verdict::Pass);
    assert_eq!(
        s.check_mut(&policy, &mut p2, 2),
        Verdict::Drop(Violation::PsPrivateStream)
    );
}

/// An SEI NAL unit with one user_data_unregistered message of `n` bytes.
fn sei_user_data(header: &[u8], n: usize) -> Vec<u8> {
    let mut v = header.to_vec();
    v.push(5);
    let mut left = n;
    while left >= 255 {
        v.push(0xff);
        left -= 255;
    }
    v.push(left as u8);
    v.extend(covert(n - 6, n as u64));
    v.push(0x80);
    v
}

#[test]
fn sei_user_data_is_cut_from_single_aggregated_and_fragmented_nal_units() {
    let f = fixture("ffmpeg_h264_high");
    let policy = strip();
    // A single NAL unit: nothing left, stripped away; the next packet's sequence closes
    // the gap.
    let (k, mut s) = after_frame(&f);
    let mut p = rtp_after(
        &f.packets[k - 1],
        &sei_user_data(&[0x06], 5000),
        false,
        false,
    );
    assert_eq!(
        s.check_mut(&policy, &mut p, 1),
        Verdict::StrippedAway(Violation::SeiUserData)
    );
    let mut next = f.packets[k].clone();
    let sent = u16::from_be_bytes([p[2], p[3]]).wrapping_add(1);
    next[2..4].copy_from_slice(&sent.to_be_bytes());
    next[4..8].copy_from_slice(&p[4..8]);
    let v = s.check_mut(&policy, &mut next, 2);
    assert!(matches!(v, Verdict::Pass | Verdict::Strip { .. }), "{v:?}");
    assert_eq!(u16::from_be_bytes([next[2], next[3]]), sent.wrapping_sub(1));

    // STAP-A: an access unit delimiter and the SEI; the SEI goes with its size field.
    let (k, mut s) = after_frame(&f);
    let sei = sei_user_data(&[0x06], 300);
    let mut stap = vec![0x18, 0x00, 0x02, 0x09, 0x10];
    stap.extend_from_slice(&(sei.len() as u16).to_be_bytes());
    stap.extend_from_slice(&sei);
    let mut p = rtp_after(&f.packets[k - 1], &stap, false, false);
    assert_eq!(
        s.check_mut(&policy, &mut p, 1),
        Verdict::Strip {
            len: 17,
            reason: Violation::SeiUserData
        }
    );
    assert_eq!(&p[12..17], &[0x18, 0x00, 0x02, 0x09, 0x10]);
    // A STAP-A of SEI user data only goes whole.
    let (k, mut s) = after_frame(&f);
    let mut stap = vec![0x18];
    stap.extend_from_slice(&(sei.len() as u16).to_be_bytes());
    stap.extend_from_slice(&sei);
    let mut p = rtp_after(&f.packets[k - 1], &stap, false, false);
    assert_eq!(
        s.check_mut(&policy, &mut p, 1),
        Verdict::StrippedAway(Violation::SeiUserData)
    );

    // FU-A: every fragment of an SEI with user data is stripped away.
    let (k, mut s) = after_frame(&f);
    let sei = sei_user_data(&[0x06], 2000);
    let body = &sei[1..];
    let chunks: Vec<&[u8]> = body.chunks(700).collect();
    let mut prev = f.packets[k - 1].clone();
    for (i, c) in chunks.iter().enumerate() {
        let mut fu = vec![0x1c, 0x06];
        if i == 0 {
            fu[1] |= 0x80;
        }
        if i + 1 == chunks.len() {
            fu[1] |= 0x40;
        }
        fu.extend_from_slice(c);
        let mut p = rtp_after(&prev, &fu, false, i > 0);
        prev = p.clone();
        assert_eq!(
            s.check_mut(&policy, &mut p, i as u64),
            Verdict::StrippedAway(Violation::SeiUserData),
            "fragment {i}"
        );
    }

    // H.265: a prefix SEI (type 39) with user data.
    let f = fixture("gst_h265");
    let (k, mut s) = after_frame(&f);
    let mut p = rtp_after(
        &f.packets[k - 1],
        &sei_user_data(&[0x4e, 0x01], 800),
        false,
        false,
    );
    assert_eq!(
        s.check_mut(&policy, &mut p, 1),
        Verdict::StrippedAway(Violation::SeiUserData)
    );
}
