//! Entry points shared by the fuzz targets (`fuzz/fuzz_targets/`) and by the regression test
//! that replays their corpus and every crash ever found (`tests/fuzz_replay.rs`), so the
//! normal test run exercises exactly what the fuzzer did.
//!
//! Each takes arbitrary bytes and drives one parser (and its rewriter) through its whole
//! public surface. They must never panic, hang or allocate without bound, whatever the input.

use std::net::{Ipv4Addr, SocketAddrV4};

use crate::config::{DomainId, SourcePolicy};
use crate::routes::{RouteSpec, StreamRoute};
use crate::signaling::{rtsp, sdp, sip};

/// A fuzz target's body.
pub type Target = fn(&[u8]);

/// The fuzz targets by name, for the replay test.
pub const TARGETS: &[(&str, Target)] = &[
    ("sip", sip_message),
    ("sdp", sdp_rewrite),
    ("rtsp", rtsp_message),
    ("transport", rtsp_transport),
    ("packet", packet_path),
    ("config", config_text),
    ("signal", signal_frames),
    ("deframe", deframe_stream),
    ("link", link_frames),
    ("media", media_stream),
];

/// Stream-leg de-framing (RFC 4571 and `$`-interleaved): the first byte picks the read size,
/// the rest is the byte stream. Every frame handed out is 1..=max bytes of RTP/RTCP v2, and
/// every input byte is accounted for: in a frame (with its header), skipped, or pending.
pub fn deframe_stream(data: &[u8]) {
    use crate::wire::framing::{DeframeTally, Deframer, Framing, Interleaved, Rfc4571};
    fn run<F: Framing>(f: F, chunk: usize, data: &[u8]) {
        let h = f.header_len();
        let mut d = Deframer::new(f, 1472);
        let mut t = DeframeTally::default();
        let mut framed = 0usize;
        for mut c in data.chunks(chunk) {
            while !c.is_empty() {
                let s = d.space();
                let n = s.len().min(c.len());
                s[..n].copy_from_slice(&c[..n]);
                d.filled(n);
                c = &c[n..];
                d.drain(&mut t, |_, p| {
                    assert!(!p.is_empty() && p.len() <= 1472 && p[0] >> 6 == 2);
                    framed += h + p.len();
                });
            }
        }
        assert_eq!(framed + t.skipped_bytes as usize + d.pending(), data.len());
    }
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(first).max(1) * 7;
    run(Rfc4571, chunk, rest);
    run(Interleaved, chunk, rest);
}

/// SIP: datagram triage, TCP framing, header views and an edit round trip.
pub fn sip_message(data: &[u8]) {
    let limits = sip::Limits::default();
    match sip::triage_datagram(data, &limits) {
        sip::Verdict::Forward(msg) => {
            let head = msg.head();
            let _ = head.cseq();
            let _ = head.from();
            let _ = head.to();
            for v in head.vias() {
                let _ = v;
            }
            let mut ed = sip::Editor::new(&msg);
            let _ = ed.insert_top("Via", b"SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKfuzz");
            let _ = ed.remove_first_value("Via");
            let _ = ed.replace_value("Contact", b"<sip:gw@192.0.2.1:5060>");
            if let Ok(body) = sdp_rewrite_body(msg.body()) {
                ed.set_body(body);
            }
            let out = ed.to_bytes();
            // What we produce must parse again.
            let _ = sip::SipMessage::parse_datagram(&out, &limits);
        }
        sip::Verdict::Answer { head, reject } => {
            let _ = reject.response(&head, "fuzz");
        }
        sip::Verdict::Drop(_) => {}
    }
    let mut rest = data;
    for _ in 0..64 {
        match sip::frame(rest, &limits) {
            Ok(sip::Framing::Message { skip, len })
                if skip + len <= rest.len() && skip + len > 0 =>
            {
                let _ = sip::triage_framed(&rest[skip..skip + len], &limits);
                rest = &rest[skip + len..];
            }
            _ => break,
        }
    }
}

fn sdp_rewrite_body(body: &[u8]) -> Result<Vec<u8>, sdp::RewriteError<()>> {
    let mut next = 20000u16;
    sdp::rewrite(body, Ipv4Addr::new(192, 0, 2, 1), |_, m| {
        if m.port == 0 {
            return Ok(None);
        }
        next = next.wrapping_add(2);
        Ok(Some(next))
    })
}

/// SDP: parse and rewrite; the rewrite must parse again.
pub fn sdp_rewrite(data: &[u8]) {
    if let Ok(s) = sdp::parse(data) {
        for m in &s.media {
            let _ = m.formats().count();
        }
    }
    if let Ok(out) = sdp_rewrite_body(data) {
        let _ = sdp::parse(&out);
    }
}

/// RTSP: stream framing (messages and interleaved frames), message views and an edit.
pub fn rtsp_message(data: &[u8]) {
    let limits = rtsp::Limits::default();
    let mut rest = data;
    for _ in 0..64 {
        let Ok(frame) = rtsp::next_frame(rest, &limits) else {
            break;
        };
        let Some(len) = frame.wire_len() else { break };
        if len == 0 || len > rest.len() {
            break;
        }
        if let rtsp::Frame::Message(n) = frame {
            if let Ok(msg) = rtsp::Message::parse(&rest[..n], &limits) {
                let _ = msg.cseq();
                let _ = msg.session();
                if let Some(t) = msg.transport() {
                    rtsp_transport(t.as_bytes());
                }
                let mut ed = rtsp::Editor::new(&msg);
                let _ = ed.set_uri("rtsp://192.0.2.1:554/x");
                let out = ed.to_bytes();
                let _ = rtsp::Message::parse(&out, &limits);
                let _ = msg.respond(rtsp::Status::BAD_REQUEST, &[]);
            }
        }
        rest = &rest[len..];
    }
}

/// RTSP `Transport`: parse, policy checks, rewrites, format, and parse the output again.
pub fn rtsp_transport(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(specs) = rtsp::parse_transport(text) else {
        return;
    };
    for s in &specs {
        let _ = s.require_unicast();
        let _ = s.check_destination(std::net::IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7)));
        let _ = s.delivery();
    }
    let formatted = rtsp::format_transport(&specs);
    let _ = rtsp::parse_transport(&formatted);
    if let Some(first) = specs.into_iter().next() {
        if let Ok(t) = first.with_client_port(20000, Some(20001)) {
            let t = t
                .with_source(std::net::IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)))
                .without_destination();
            let _ = rtsp::parse_transport(&rtsp::format_transport(&[t]));
        }
    }
}

/// The packet path as the ring engines see it: Ethernet/IPv4/UDP views, checksums, then
/// the per-packet decision (size, source, RTP accounting) on a route.
pub fn packet_path(data: &[u8]) {
    let route = StreamRoute::new(
        RouteSpec {
            ingress: DomainId::A,
            port: 20000,
            dest: SocketAddrV4::new(Ipv4Addr::new(10, 2, 0, 2), 4000),
            egress_port: 30000,
            policy: SourcePolicy::Latch,
            expected: None,
            rtp_only: data.first().is_some_and(|b| b & 1 == 1),
            label: "fuzz".into(),
            // Bit 1 of the first byte: the route validates its media (H.264 on 96).
            media: data
                .first()
                .filter(|b| *b & 2 == 2)
                .map(|_| crate::media::Rule {
                    enforce: true,
                    spec: crate::media::StreamSpec::new(None).with(
                        96,
                        crate::media::Codec::H264,
                        90000,
                    ),
                    policy: crate::media::Policy::default(),
                }),
        },
        1,
    );
    let mut media = crate::channel::Validators::new(crate::channel::LEG_SLOTS, Default::default());
    if let Ok(d) = crate::wire::parse_udp4(data) {
        let _ = d.checksums_ok(false);
        let src = SocketAddrV4::new(d.src_addr, d.src_port);
        let _ = crate::channel::inspect(&route, src, d.payload, false, 1472, 1, &mut media);
    }
    // The same bytes as a bare UDP payload, as the stack engine sees it.
    let src = SocketAddrV4::new(Ipv4Addr::new(10, 1, 0, 2), 5000);
    let _ = crate::channel::inspect(&route, src, data, false, 1472, 1, &mut media);
    let _ = route.stats.snapshot();
}

/// The media validator over a stream of packets. The first byte picks the codec (low 3 bits),
/// whether the harness renumbers the packets so that mutations reach the payload parsers
/// rather than the sequence check (bit 3), and policy switches (bits 4-7: extension,
/// padding, filler, unknown codec; the filler bit also muxes RTCP, the padding bit asks for
/// H.264/H.265 parameter sets in-band; the unknown codec renumbered is an RTCP route, not
/// renumbered). The rest is RFC 4571 records (2-byte length, packet), as in
/// `tests/golden/media/`. Every packet gets a verdict; a passing one must be RTP or RTCP v2.
/// A second stream checks the same packets under the strip action (`check_mut`): what it
/// rewrites only ever gets shorter and keeps its RTP header.
pub fn media_stream(data: &[u8]) {
    use crate::media::{Codec, Policy, Stream, StreamSpec, Verdict};
    let Some((&sel, mut rest)) = data.split_first() else {
        return;
    };
    const CODECS: [(Codec, u8, u32); 8] = [
        (Codec::Ps, 96, 90000),
        (Codec::H264, 96, 90000),
        (Codec::H265, 96, 90000),
        (Codec::Mp2t, 33, 90000),
        (Codec::Jpeg, 26, 90000),
        (Codec::Pcmu, 0, 8000),
        (Codec::Aac, 97, 48000),
        (Codec::Unknown, 98, 90000),
    ];
    let (codec, pt, clock) = CODECS[usize::from(sel & 7)];
    let renumber = sel & 8 != 0;
    let policy = Policy {
        allow_extension: sel & 0x10 != 0,
        allow_padding: sel & 0x20 != 0,
        allow_filler: sel & 0x40 != 0,
        allow_unknown_codec: sel & 0x80 != 0,
        ..Policy::default()
    };
    let mut spec = StreamSpec::new(None)
        .with(pt, codec, clock)
        .with(8, Codec::Pcma, 8000);
    // The spec's flags share the policy's bits: RTCP muxed (with allow_filler), parameter
    // sets required in-band (with allow_padding); an RTCP route in the unknown codec's slot
    // when renumbering.
    spec.rtcp_mux = sel & 0x40 != 0;
    spec.in_band_parameter_sets = sel & 0x20 != 0;
    let rtcp_route = codec == Codec::Unknown && renumber;
    if rtcp_route {
        spec = StreamSpec::rtcp();
    }
    let mut s = Stream::new(spec);
    // The same stream under the strip action, rewriting a copy of each packet in place.
    let strip = Policy {
        strip: true,
        ..policy
    };
    let mut t = Stream::new(spec);
    let mut cut = [0u8; 2048];
    let mut buf = [0u8; 2048];
    let mut i = 0u16;
    while let [a, b, tail @ ..] = rest {
        let n = usize::from(u16::from_be_bytes([*a, *b]))
            .min(tail.len())
            .min(buf.len());
        let p = &mut buf[..n];
        p.copy_from_slice(&tail[..n]);
        rest = &tail[n..];
        if renumber && !rtcp_route && n >= 12 {
            p[2..4].copy_from_slice(&i.to_be_bytes());
            p[8..12].copy_from_slice(&[0, 0, 0, 1]);
        }
        let v = s.check(&policy, p, u64::from(i) * 20);
        if v == Verdict::Pass {
            assert!(n >= 8 && p[0] >> 6 == 2);
        }
        let c = &mut cut[..n];
        c.copy_from_slice(p);
        match t.check_mut(&strip, c, u64::from(i) * 20) {
            Verdict::Strip { len, .. } => assert!(len >= 12 && len < n && c[0] >> 6 == 2),
            Verdict::Pass => assert!(n >= 8 && c[0] >> 6 == 2),
            Verdict::StrippedAway(_) | Verdict::Drop(_) => {}
        }
        i = i.wrapping_add(1);
    }
}

/// The config parser and validator.
pub fn config_text(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = crate::config::parse_for(text, "fuzz.toml", 4);
    }
}

/// The split signaling link's framing: the bytes as a hello and as a received frame stream
/// (which the tag check stops), and as the kind and payload of a frame sealed with the right
/// key (which reaches every payload parser).
pub fn signal_frames(data: &[u8]) {
    use crate::signaling::split::frame::{
        Hello, Keys, Kind, Opener, Role, Sealer, HELLO_LEN, MAX_PAYLOAD,
    };
    let key = [0x5au8; 32];
    let d = Hello {
        role: Role::Dialer,
        instance: [1; 16],
        nonce: [2; 32],
    };
    let l = Hello {
        role: Role::Listener,
        instance: [3; 16],
        nonce: [4; 32],
    };
    let (Ok(kd), Ok(kl)) = (Keys::derive(&key, &d, &l), Keys::derive(&key, &l, &d)) else {
        return;
    };
    if let Some(h) = data.get(..HELLO_LEN) {
        let mut b = [0u8; HELLO_LEN];
        b.copy_from_slice(h);
        let _ = Hello::parse(&b);
    }
    let mut op = Opener::new(kl.recv.clone());
    let mut rest = data;
    while let Ok(Some((_, n))) = op.open(rest) {
        rest = &rest[n..];
    }
    if let Some((&k, payload)) = data.split_first() {
        if payload.len() <= MAX_PAYLOAD {
            let mut s = Sealer::new(kd.send);
            let mut out = Vec::new();
            s.announce(&mut out, &[5060], &[554]);
            s.seal(
                &mut out,
                Kind::ALL[usize::from(k) % Kind::ALL.len()],
                &[payload],
            );
            let mut op = Opener::new(kl.recv);
            let mut rest = &out[..];
            while let Ok(Some((_, n))) = op.open(rest) {
                rest = &rest[n..];
            }
        }
    }
}

/// The split link's receiving side: the bytes as a stream of link frames (each a 2-byte
/// length, then the frame) through the header view, the FEC decoder with a reorder window
/// (8+2) and the stream header and reassembly, as the incoming link's worker drives them;
/// then the bytes as one datagram cut by the sender, encoded, decoded and joined, which
/// must give them back exactly.
pub fn link_frames(data: &[u8]) {
    use crate::link::fec::{Decoder, Encoder, Fec};
    use crate::link::frag::{cut, Joiner};
    use crate::wire::link::{LinkPacket, StreamHeader, MAX_DATAGRAM};
    let fec = Some(Fec::kpm(8, 2));
    let mut dec = Decoder::with_reorder(fec, 25);
    let mut join = Joiner::new(true);
    let sink = |dec_out: (u16, u16, &[u8], bool), join: &mut Joiner, now: u64| {
        let (dst, src, dg, repaired) = dec_out;
        if let Some((sh, media)) = StreamHeader::parse(dg) {
            if sh.frags > 1 {
                if let Some(j) = join.offer(dst, src, sh, media, repaired, now) {
                    assert!(j.data.len() <= MAX_DATAGRAM);
                }
            }
        }
    };
    let mut rest = data;
    let mut now = 0u64;
    while let Some((len, tail)) = rest.split_first_chunk::<2>() {
        let n = usize::from(u16::from_be_bytes(*len)).min(tail.len());
        let (frame, tail) = tail.split_at(n);
        rest = tail;
        now += 3;
        if let Ok(p) = LinkPacket::new_checked(frame) {
            let _ = dec.receive(&p, now, |d, s, dg, r| sink((d, s, dg, r), &mut join, now));
        }
        dec.release_due(now, |d, s, dg, r| sink((d, s, dg, r), &mut join, now));
        join.expire(now);
    }
    // Round trip: cut, encode, decode, join.
    let datagram = &data[..data.len().min(MAX_DATAGRAM)];
    let mut enc = Encoder::new(0, 1, fec, 8);
    let mut dec = Decoder::with_reorder(fec, 25);
    let mut join = Joiner::new(true);
    let mut got: Vec<Vec<u8>> = Vec::new();
    let take = |dg: &[u8], join: &mut Joiner, got: &mut Vec<Vec<u8>>| {
        let (sh, media) = StreamHeader::parse(dg).expect("our own stream header");
        if sh.frags == 1 {
            got.push(media.to_vec());
        } else if let Some(j) = join.offer(1, 2, sh, media, false, 0) {
            got.push(j.data.to_vec());
        }
    };
    let mut frames: Vec<Vec<u8>> = Vec::new();
    let ok = cut(datagram, 7, MAX_DATAGRAM, |sh, media| {
        if enc.must_flush() {
            frames.extend(enc.ready().map(<[u8]>::to_vec));
            enc.mark_sent();
        }
        assert!(enc.push_parts(1, 2, &sh.bytes(), media, 0));
    });
    assert!(ok);
    enc.close_block(0);
    frames.extend(enc.ready().map(<[u8]>::to_vec));
    enc.mark_sent();
    for f in &frames {
        let p = LinkPacket::new_checked(&f[..]).expect("our own frame");
        dec.receive(&p, 0, |_, _, dg, _| take(dg, &mut join, &mut got))
            .expect("our own frame");
    }
    assert_eq!(got, [datagram.to_vec()]);
}
