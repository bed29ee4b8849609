//! What an SDP negotiates for media validation ([`crate::media`]): the payload types of an
//! `m=` line with their codec and clock rate (`a=rtpmap:`, or the static payload types of
//! RFC 3551), and the GB/T 28181 `y=` SSRC. Pure: SDP views in, [`StreamSpec`] out.
//!
//! A stream's packets cross from the side that sends to the side that receives; what may
//! cross is what the receiver's SDP accepts ([`crossing`]): its formats, and the sender's own
//! payload type numbers for a codec the receiver accepts too (RFC 3264 lets each side number
//! its formats; GB/T 28181 devices answer with their own numbers). A payload type without
//! an `rtpmap` and not static has no codec: [`Codec::Unknown`], which the validator refuses
//! unless the policy allows unknown codecs.
//!
//! Under `validate = "enforce"` an `m=` line none of whose formats the policy lets cross
//! ([`refusal`]) is refused at the signaling (SIP `488`, RTSP `415`) instead of a session
//! whose every packet would be dropped; a line with some allowed formats crosses unchanged
//! (nothing is stripped from the SDP) and its routes validate only the allowed ones
//! ([`allowed`]).

use crate::media::{Codec, Policy, StreamSpec};
use crate::signaling::sdp::Media;

/// The formats and `y=` SSRC one side's `m=` line describes.
///
/// Formats of a known codec take the [`crate::media::MAX_FORMATS`] places first, so an offer
/// listing many unknown formats before a known one still keeps the known one.
pub fn media_spec(m: &Media<'_>) -> StreamSpec {
    let mut known = StreamSpec::new(m.ssrc.and_then(gb_ssrc));
    let mut unknown = Vec::new();
    for (pt, codec, rate) in line_formats(m) {
        if codec == Codec::Unknown {
            unknown.push((pt, rate));
        } else {
            known = known.with(pt, codec, rate);
        }
    }
    unknown
        .into_iter()
        .fold(known, |s, (pt, rate)| s.with(pt, Codec::Unknown, rate))
}

/// The RTP payload types of an `m=` line in order, with their codec and clock rate.
fn line_formats<'m>(m: &'m Media<'_>) -> impl Iterator<Item = (u8, Codec, u32)> + 'm {
    m.formats().filter_map(|f| {
        let pt = f.parse::<u8>().ok().filter(|p| *p < 128)?;
        let (codec, rate) = rtpmap(m, pt)
            .map(|(name, rate)| (Codec::from_rtpmap(name), rate))
            .or_else(|| Codec::from_static_pt(pt))
            .unwrap_or((Codec::Unknown, 90000));
        Some((pt, codec, rate))
    })
}

/// The encoding name and clock rate the `a=rtpmap:` of `pt` names.
fn rtpmap<'a>(m: &Media<'a>, pt: u8) -> Option<(&'a str, u32)> {
    m.rtpmaps.iter().find_map(|r| {
        let (num, enc) = r.split_once(' ')?;
        if num.trim().parse::<u8>().ok()? != pt {
            return None;
        }
        let mut parts = enc.trim().split('/');
        let name = parts.next()?;
        let rate = parts.next()?.trim().parse::<u32>().ok()?;
        Some((name.trim(), rate))
    })
}

/// Whether `policy` lets a format of `codec` cross at all (before any packet is seen): a
/// codec the validator knows, or any codec where `allow_unknown_codec` is set.
pub fn codec_allowed(codec: Codec, policy: &Policy) -> bool {
    codec != Codec::Unknown || policy.allow_unknown_codec
}

/// The formats of `spec` that `policy` lets cross ([`codec_allowed`]), its SSRC kept.
pub fn allowed(spec: &StreamSpec, policy: &Policy) -> StreamSpec {
    spec.formats()
        .iter()
        .filter(|f| codec_allowed(f.codec, policy))
        .fold(StreamSpec::new(spec.ssrc).flags_of(spec), |s, f| {
            s.with(f.pt, f.codec, f.clock_rate)
        })
}

/// Why validation under `policy` refuses an `m=` line whole: none of its formats may cross
/// (each is named: `codec VP8/90000`, `payload type 101 without rtpmap`). `None`: at least one
/// may, and the line crosses unchanged.
pub fn refusal(m: &Media<'_>, policy: &Policy) -> Option<String> {
    let mut refused = Vec::new();
    for (pt, codec, _) in line_formats(m) {
        if codec_allowed(codec, policy) {
            return None;
        }
        refused.push(match rtpmap(m, pt) {
            Some((name, rate)) => format!("codec {name}/{rate}"),
            None => format!("payload type {pt} without rtpmap"),
        });
    }
    Some(match refused.as_slice() {
        [] => format!(
            "{} media offers no RTP payload type ({} {})",
            m.kind, m.proto, m.formats_text
        ),
        some => format!(
            "{} not allowed (allow_unknown_codec = false)",
            some.join(", ")
        ),
    })
}

/// A GB/T 28181 `y=` value: the SSRC in decimal (10 digits).
fn gb_ssrc(y: &str) -> Option<u32> {
    let y = y.trim();
    (!y.is_empty() && y.len() <= 10 && y.bytes().all(|b| b.is_ascii_digit()))
        .then(|| y.parse::<u32>().ok())
        .flatten()
}

/// The tracks an RTSP session description (DESCRIBE reply, ANNOUNCE) offers: each `m=`
/// line's `a=control:` (empty when none) and its formats.
pub fn tracks(body: &[u8]) -> Vec<(String, StreamSpec)> {
    match crate::signaling::sdp::parse(body) {
        Ok(sdp) => sdp
            .media
            .iter()
            .map(|m| (m.control.unwrap_or("").to_string(), media_spec(m)))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// The formats of the track SETUP names `url` among `tracks` ([`tracks`]): the one whose
/// control URL `url` is or ends with, the only one, or — when none matches — every
/// track's formats together (still each checked by its codec), `None` without any.
pub fn track_spec(tracks: &[(String, StreamSpec)], url: &str) -> Option<StreamSpec> {
    if let Some(s) = find_track(tracks, url) {
        return Some(*s);
    }
    match tracks {
        [] => None,
        [(_, s)] => Some(*s),
        all => Some(all.iter().fold(StreamSpec::new(None), |acc, (_, s)| {
            s.formats()
                .iter()
                .fold(acc, |a, f| a.with(f.pt, f.codec, f.clock_rate))
        })),
    }
}

/// The entry of the track whose control URL `url` is or ends with.
fn find_track<'t, T>(tracks: &'t [(String, T)], url: &str) -> Option<&'t T> {
    let url = url.trim_end_matches('/');
    let matches = |control: &str| {
        let c = control.trim_end_matches('/');
        !c.is_empty()
            && c != "*"
            && (url == c || url.ends_with(&format!("/{}", c.trim_start_matches('/'))))
    };
    tracks.iter().find(|(c, _)| matches(c)).map(|(_, t)| t)
}

/// Each track of an RTSP session description with why `policy` refuses it whole
/// ([`refusal`]; `None`: some of its formats may cross).
pub fn refusals(body: &[u8], policy: &Policy) -> Vec<(String, Option<String>)> {
    match crate::signaling::sdp::parse(body) {
        Ok(sdp) => sdp
            .media
            .iter()
            .map(|m| (m.control.unwrap_or("").to_string(), refusal(m, policy)))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Why `enforce` refuses the SETUP of the track `url` names among `refusals`
/// ([`refusals`]), matched as [`track_spec`] matches: that track's refusal; without a match,
/// a refusal only when every track is refused; nothing described: refused, since nothing
/// says what the track carries.
pub fn track_refusal(refusals: &[(String, Option<String>)], url: &str) -> Option<String> {
    if let Some(r) = find_track(refusals, url) {
        return r.clone();
    }
    match refusals {
        [] => Some(
            "no session description (DESCRIBE or ANNOUNCE) says what this track carries".into(),
        ),
        all => all_refused(all),
    }
}

/// The refusals of every track joined, when every track is refused; `None` when one may
/// cross (or there is none).
pub fn all_refused(refusals: &[(String, Option<String>)]) -> Option<String> {
    let whys: Option<Vec<&str>> = refusals.iter().map(|(_, r)| r.as_deref()).collect();
    whys.filter(|w| !w.is_empty()).map(|w| w.join("; "))
}

/// What may cross from the side that described `sender` to the side that described
/// `receiver`: the receiver's formats, then the sender's numbers for a codec (and clock rate)
/// the receiver accepts; the SSRC the sender's `y=` names, else the receiver's.
pub fn crossing(receiver: &StreamSpec, sender: &StreamSpec) -> StreamSpec {
    let mut out = StreamSpec::new(sender.ssrc.or(receiver.ssrc));
    out.rtcp_mux = receiver.rtcp_mux && sender.rtcp_mux;
    out.in_band_parameter_sets = receiver.in_band_parameter_sets && sender.in_band_parameter_sets;
    for f in receiver.formats() {
        out = out.with(f.pt, f.codec, f.clock_rate);
    }
    for f in sender.formats() {
        let accepted = f.codec != Codec::Unknown
            && receiver
                .formats()
                .iter()
                .any(|r| r.codec == f.codec && r.clock_rate == f.clock_rate);
        if accepted && !out.formats().iter().any(|o| o.pt == f.pt) {
            out = out.with(f.pt, f.codec, f.clock_rate);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signaling::sdp::parse;

    fn formats(s: &StreamSpec) -> Vec<(u8, Codec, u32)> {
        s.formats()
            .iter()
            .map(|f| (f.pt, f.codec, f.clock_rate))
            .collect()
    }

    #[test]
    fn gb28181_invite_and_answer() {
        let invite = "v=0\r\no=34020000002000000001 0 0 IN IP4 10.2.0.5\r\ns=Play\r\nc=IN IP4 10.2.0.5\r\nt=0 0\r\nm=video 6000 RTP/AVP 96 98 97\r\na=recvonly\r\na=rtpmap:96 PS/90000\r\na=rtpmap:98 H264/90000\r\na=rtpmap:97 MPEG4/90000\r\ny=0100000001\r\n";
        let sdp = parse(invite.as_bytes()).unwrap();
        let offer = media_spec(&sdp.media[0]);
        assert_eq!(
            formats(&offer),
            [
                (96, Codec::Ps, 90000),
                (98, Codec::H264, 90000),
                (97, Codec::Unknown, 90000)
            ]
        );
        assert_eq!(offer.ssrc, Some(100000001));
        let answer = "v=0\r\no=34020000001320000001 0 0 IN IP4 10.1.0.9\r\ns=Play\r\nc=IN IP4 10.1.0.9\r\nt=0 0\r\nm=video 15060 RTP/AVP 96\r\na=sendonly\r\na=rtpmap:96 PS/90000\r\ny=0100000001\r\nf=\r\n";
        let sdp = parse(answer.as_bytes()).unwrap();
        let dev = media_spec(&sdp.media[0]);
        assert_eq!(formats(&dev), [(96, Codec::Ps, 90000)]);
        // The device sends to the platform: what the platform accepts crosses.
        let c = crossing(&offer, &dev);
        assert_eq!(c.ssrc, Some(100000001));
        assert_eq!(formats(&c).len(), 3);
    }

    #[test]
    fn gb2022_h265_and_aac() {
        let body = "v=0\r\no=34020000001320000001 0 0 IN IP4 10.1.0.9\r\ns=Play\r\nc=IN IP4 10.1.0.9\r\nt=0 0\r\nm=video 15060 RTP/AVP 100\r\na=sendonly\r\na=rtpmap:100 H265/90000\r\nm=audio 15062 RTP/AVP 102\r\na=rtpmap:102 MPEG4-GENERIC/16000/1\r\ny=0100000022\r\nf=v/5/6/25/1/4096a/1/3/3\r\n";
        let sdp = parse(body.as_bytes()).unwrap();
        assert_eq!(
            formats(&media_spec(&sdp.media[0])),
            [(100, Codec::H265, 90000)]
        );
        assert_eq!(
            formats(&media_spec(&sdp.media[1])),
            [(102, Codec::Aac, 16000)]
        );
        assert_eq!(refusal(&sdp.media[0], &Policy::default()), None);
        assert_eq!(refusal(&sdp.media[1], &Policy::default()), None);
        // GB/T 28181-2022 writes AAC as `AAC/8000/1` (AAC-hbr, as RFC 3640's).
        let gb = body.replace("MPEG4-GENERIC/16000/1", "AAC/8000/1");
        let sdp = parse(gb.as_bytes()).unwrap();
        assert_eq!(
            formats(&media_spec(&sdp.media[1])),
            [(102, Codec::Aac, 8000)]
        );
    }

    #[test]
    fn static_types_and_own_numbers() {
        let body = "v=0\r\no=- 1 1 IN IP4 10.1.0.9\r\ns=-\r\nc=IN IP4 10.1.0.9\r\nt=0 0\r\nm=audio 4000 RTP/AVP 8 0 101\r\nm=video 4002 RTP/AVP 100\r\na=rtpmap:100 H264/90000\r\n";
        let sdp = parse(body.as_bytes()).unwrap();
        let audio = media_spec(&sdp.media[0]);
        assert_eq!(
            formats(&audio),
            [
                (8, Codec::Pcma, 8000),
                (0, Codec::Pcmu, 8000),
                (101, Codec::Unknown, 90000)
            ]
        );
        assert_eq!(audio.ssrc, None);
        let sender = media_spec(&sdp.media[1]);
        let receiver = StreamSpec::new(None).with(96, Codec::H264, 90000);
        assert_eq!(
            formats(&crossing(&receiver, &sender)),
            [(96, Codec::H264, 90000), (100, Codec::H264, 90000)],
            "the sender's number for a codec the receiver takes"
        );
        let ps_only = StreamSpec::new(None).with(96, Codec::Ps, 90000);
        assert_eq!(
            formats(&crossing(&ps_only, &sender)),
            [(96, Codec::Ps, 90000)],
            "a codec the receiver did not accept never crosses"
        );
        assert_eq!(gb_ssrc("0100000001"), Some(100000001));
    }

    #[test]
    fn rtsp_tracks_by_control_url() {
        let body = b"v=0\r\no=- 1 1 IN IP4 10.1.0.5\r\ns=cam\r\nc=IN IP4 0.0.0.0\r\nt=0 0\r\na=control:*\r\nm=video 0 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\na=control:stream=0\r\nm=audio 0 RTP/AVP 8\r\na=control:rtsp://10.1.0.5:8554/test/stream=1\r\n";
        let t = tracks(body);
        assert_eq!(t.len(), 2);
        let v = track_spec(&t, "rtsp://10.1.0.5:8554/test/stream=0").unwrap();
        assert_eq!(formats(&v), [(96, Codec::H264, 90000)]);
        let a = track_spec(&t, "rtsp://10.1.0.5:8554/test/stream=1/").unwrap();
        assert_eq!(formats(&a), [(8, Codec::Pcma, 8000)]);
        let any = track_spec(&t, "rtsp://10.1.0.5:8554/other").unwrap();
        assert_eq!(formats(&any).len(), 2, "no match: every track's formats");
        assert_eq!(track_spec(&[], "rtsp://x/"), None);
        assert_eq!(gb_ssrc("9999999999"), None);
        assert_eq!(gb_ssrc("12ab"), None);
    }

    #[test]
    fn refusal_only_when_nothing_may_cross() {
        let policy = Policy::default();
        let sdp = |m: &str| {
            format!("v=0\r\no=- 1 1 IN IP4 10.1.0.9\r\ns=-\r\nc=IN IP4 10.1.0.9\r\nt=0 0\r\n{m}")
        };
        let vp8 = sdp("m=video 4000 RTP/AVP 96\r\na=rtpmap:96 VP8/90000\r\n");
        let parsed = parse(vp8.as_bytes()).unwrap();
        assert_eq!(
            refusal(&parsed.media[0], &policy).as_deref(),
            Some("codec VP8/90000 not allowed (allow_unknown_codec = false)")
        );
        let open = Policy {
            allow_unknown_codec: true,
            ..Policy::default()
        };
        assert_eq!(refusal(&parsed.media[0], &open), None);
        let two = sdp("m=video 4000 RTP/AVP 96 101\r\na=rtpmap:96 VP8/90000\r\n");
        let parsed = parse(two.as_bytes()).unwrap();
        assert_eq!(
            refusal(&parsed.media[0], &policy).as_deref(),
            Some("codec VP8/90000, payload type 101 without rtpmap not allowed (allow_unknown_codec = false)")
        );
        // One allowed format among refused ones: the line crosses; its routes take the
        // allowed one only. Known codecs take the places first.
        let mixed = sdp("m=video 4000 RTP/AVP 97 98 99 100 101 96\r\na=rtpmap:96 PS/90000\r\n");
        let parsed = parse(mixed.as_bytes()).unwrap();
        assert_eq!(refusal(&parsed.media[0], &policy), None);
        let spec = media_spec(&parsed.media[0]);
        assert_eq!(spec.formats()[0].codec, Codec::Ps);
        assert_eq!(formats(&allowed(&spec, &policy)), [(96, Codec::Ps, 90000)]);
        assert_eq!(formats(&allowed(&spec, &open)).len(), 4);
        let two_tracks = b"v=0\r\no=- 1 1 IN IP4 10.1.0.5\r\ns=cam\r\nt=0 0\r\nm=video 0 RTP/AVP 96\r\na=rtpmap:96 VP8/90000\r\na=control:stream=0\r\nm=audio 0 RTP/AVP 0\r\na=control:stream=1\r\n";
        let r = refusals(two_tracks, &policy);
        assert_eq!(
            track_refusal(&r, "rtsp://10.1.0.5/cam/stream=0").as_deref(),
            Some("codec VP8/90000 not allowed (allow_unknown_codec = false)")
        );
        assert_eq!(track_refusal(&r, "rtsp://10.1.0.5/cam/stream=1"), None);
        assert_eq!(track_refusal(&r, "rtsp://10.1.0.5/cam/other"), None);
        assert_eq!(all_refused(&r), None, "the audio track may cross");
        assert!(
            track_refusal(&[], "rtsp://x/").is_some(),
            "nothing described"
        );
        assert_eq!(all_refused(&[]), None);
        let none = sdp("m=application 5000 TCP/BFCP *\r\n");
        let parsed = parse(none.as_bytes()).unwrap();
        assert!(refusal(&parsed.media[0], &open).is_some());
    }
}
