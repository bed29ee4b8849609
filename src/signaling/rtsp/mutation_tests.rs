//! Random-mutation test: framing, parsing, transport, URL and auth code must
//! never panic, whatever the peer sends. A deterministic xorshift drives byte
//! flips, insertions of protocol-significant bytes, deletions, duplications
//! and truncations of real-looking seeds. (cargo-fuzz targets can reuse the
//! same `exercise_*` functions later.)

use crate::signaling::rtsp::auth::{parse_www_authenticate, Credentials, DigestVerifier};
use crate::signaling::rtsp::message::{interleaved_payload, Editor, Frame, Limits, Message};
use crate::signaling::rtsp::transport::{
    format_transport, parse_transport, select_transport, TransportPolicy,
};
use crate::signaling::rtsp::url::{rewrite_rtp_info_urls, Authority, Route, RtspUrl, UrlMap};
use crate::signaling::rtsp::{next_frame, Status};

/// `RTSP_MUTATION_ROUNDS=n` scales the rounds (e.g. a long run in release).
fn rounds(default: usize) -> usize {
    std::env::var("RTSP_MUTATION_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

/// Bytes that sit on grammar boundaries, so mutations hit interesting paths.
const SPECIAL: &[u8] = b"\"\\;,-=:/@[]?$\r\n \t0123456789\x00\xff\xc3";

fn mutate(rng: &mut XorShift, seed: &[u8]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..=rng.below(4) {
        let pos = rng.below(v.len() + 1);
        match rng.below(6) {
            0 if pos < v.len() => v[pos] ^= 1 << rng.below(8),
            1 => v.insert(pos, SPECIAL[rng.below(SPECIAL.len())]),
            2 if pos < v.len() => {
                v.remove(pos);
            }
            3 => {
                let end = (pos + rng.below(16)).min(v.len());
                let chunk = v[pos..end].to_vec();
                v.splice(pos..pos, chunk);
            }
            4 => v.truncate(pos),
            _ if pos < v.len() => v[pos] = SPECIAL[rng.below(SPECIAL.len())],
            _ => {}
        }
    }
    v
}

fn url_map() -> UrlMap {
    UrlMap::new(
        Authority::new("192.168.1.1", 554).unwrap(),
        vec![
            Route::new("/cam1", Authority::new("10.0.0.5", 8554).unwrap(), "/test"),
            Route::new("/", Authority::new("10.0.0.6", 554).unwrap(), "/"),
        ],
    )
}

/// Runs the whole stream through framing and every accessor/rewrite.
fn exercise_stream(buf: &[u8], map: &UrlMap) {
    let limits = Limits {
        max_header_bytes: 2048,
        max_headers: 16,
        max_body_bytes: 2048,
        max_line_bytes: 512,
    };
    let mut rest = buf;
    while let Ok(frame) = next_frame(rest, &limits) {
        let Some(len) = frame.wire_len() else { break };
        let (this, next) = rest.split_at(len);
        match frame {
            Frame::Message(_) => {
                let msg = Message::parse(this, &limits).expect("next_frame accepted it");
                exercise_message(this, &msg, map);
            }
            Frame::Interleaved { len, .. } => {
                assert_eq!(interleaved_payload(this).map(<[u8]>::len), Some(len));
            }
            Frame::Skip(n) => assert!(n > 0 && this.iter().all(|b| *b == b'\r' || *b == b'\n')),
            Frame::Incomplete => unreachable!(),
        }
        rest = next;
    }
}

fn exercise_message(raw: &[u8], msg: &Message<'_>, map: &UrlMap) {
    let _ = (
        msg.cseq(),
        msg.session(),
        msg.method(),
        msg.status(),
        msg.version(),
    );
    // An editor with no edits reproduces the message (leading blank lines aside).
    let untouched = Editor::new(msg).to_bytes();
    assert!(raw.ends_with(&untouched));
    assert!(raw[..raw.len() - untouched.len()]
        .iter()
        .all(|b| *b == b'\r' || *b == b'\n'));
    let mut editor = Editor::new(msg);
    if let Some(uri) = msg.uri() {
        if let Ok(up) = map.to_upstream(uri) {
            editor
                .set_uri(&up.url)
                .expect("mapped URLs are always writable");
        }
    }
    for url in [msg.content_base(), msg.content_location()]
        .into_iter()
        .flatten()
    {
        if let Ok(u) = map.to_client(0, url) {
            editor
                .set_header("Content-Base", &u)
                .expect("mapped URLs are always writable");
        }
    }
    if let Some(info) = msg.rtp_info() {
        if let Ok(v) = map.rtp_info_to_client(0, info) {
            let _ = editor.set_header("RTP-Info", &v);
        }
    }
    if let Ok(body) = map.sdp_to_client(0, msg.body()) {
        editor.set_body(body.into_owned());
    }
    if let Some(t) = msg.transport() {
        exercise_transport(t);
    }
    for c in msg.www_authenticate() {
        let _ = parse_www_authenticate(c);
    }
    let out = editor.to_bytes();
    // Whatever we write must frame and parse again (up to the default limits).
    let limits = Limits::default();
    if out.len() < limits.max_body_bytes {
        assert!(
            matches!(next_frame(&out, &limits), Ok(Frame::Message(n)) if n == out.len()),
            "editor output does not frame: {:?}",
            String::from_utf8_lossy(&out)
        );
    }
    let _ = msg.respond(Status::BAD_REQUEST, &[]);
}

fn exercise_transport(value: &str) {
    let Ok(specs) = parse_transport(value) else {
        return;
    };
    // Writing back must give something that parses to the same text.
    let written = format_transport(&specs);
    let again = parse_transport(&written).expect("our own output must parse");
    assert_eq!(format_transport(&again), written);
    let client = "192.168.1.20".parse().unwrap();
    if let Ok((spec, _)) = select_transport(&specs, client, &TransportPolicy::default()) {
        if let Ok(s) = spec.clone().with_client_port(40000, Some(40001)) {
            let s = s.with_source(client).without_destination();
            parse_transport(&s.to_string()).expect("rewritten transport must parse");
        }
    }
}

const MESSAGE_SEEDS: &[&[u8]] = &[
    b"SETUP rtsp://192.168.1.1:554/cam1/stream=0 RTSP/1.0\r\nCSeq: 3\r\nTransport: RTP/AVP;unicast;client_port=5000-5001;mode=\"PLAY\"\r\nSession: abc;timeout=60\r\n\r\n",
    b"RTSP/1.0 200 OK\r\nCSeq: 5\r\nRTP-Info: url=rtsp://10.0.0.5:8554/test/stream=0;seq=1;rtptime=0, url=rtsp://10.0.0.5:8554/test/stream=1;seq=1;rtptime=0\r\nSession: abc;timeout=60\r\n\r\n",
    b"RTSP/1.0 200 OK\r\nCSeq: 2\r\nContent-Base: rtsp://10.0.0.5:8554/test/\r\nContent-Length: 64\r\n\r\nv=0\r\na=control:rtsp://10.0.0.5:8554/test\r\nm=video 0 RTP/AVP 26\r\n",
    b"RTSP/1.0 401 Unauthorized\r\nCSeq: 1\r\nWWW-Authenticate: Digest realm=\"r\", nonce=\"n\", qop=\"auth\", algorithm=SHA-256\r\nWWW-Authenticate: Basic realm=\"r\"\r\n\r\n",
    b"$\x00\x00\x04\x80\x1a\x00\x01\r\nOPTIONS * RTSP/1.0\nCSeq: 1\n\n$\x01\x00\x00",
];

const TRANSPORT_SEEDS: &[&str] = &[
    "RTP/AVP;unicast;client_port=5000-5001",
    "RTP/AVP/TCP;unicast;interleaved=0-1;mode=\"PLAY\"",
    "RTP/AVP;unicast;client_port=5000-5001;server_port=6970-6971;ssrc=1F2E3D4C;source=10.0.0.5;mode=record",
    "RTP/AVP;multicast;destination=224.2.0.1;port=3456-3457;ttl=16,RTP/AVP;unicast;client_port=1-2;x-y=\"a,b\"",
    "RTP/AVP;mode=\"",
];

#[test]
fn mutated_streams_never_panic() {
    let map = url_map();
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    for _ in 0..rounds(4000) {
        for seed in MESSAGE_SEEDS {
            exercise_stream(&mutate(&mut rng, seed), &map);
        }
    }
}

#[test]
fn mutated_transports_never_panic() {
    let mut rng = XorShift(0xD1B5_4A32_D192_ED03);
    for _ in 0..rounds(6000) {
        for seed in TRANSPORT_SEEDS {
            let bytes = mutate(&mut rng, seed.as_bytes());
            exercise_transport(&String::from_utf8_lossy(&bytes));
        }
    }
}

#[test]
fn mutated_urls_and_auth_never_panic() {
    let map = url_map();
    let verifier = DigestVerifier::new("vgate", [1; 32], vec![Credentials::new("a", "b")]);
    let challenge = verifier.challenges(100, [2; 16], false).remove(1);
    let seeds: Vec<String> = vec![
        "rtsp://user:pw@[fe80::1]:8554/cam1/stream=0?x=1".into(),
        "url=rtsp://10.0.0.5:8554/test/stream=0;seq=1;rtptime=0, url=\"rtsp://10.0.0.5/test/a\";seq=2".into(),
        challenge.clone(),
        format!("Digest username=\"a\", realm=\"vgate\", nonce=\"{}\", uri=\"rtsp://gw/cam1\", response=\"00\", qop=auth, nc=00000001, cnonce=\"c\"", challenge.split('"').nth(3).unwrap()),
    ];
    let mut rng = XorShift(0x2545_F491_4F6C_DD1D);
    for _ in 0..rounds(5000) {
        for seed in &seeds {
            let bytes = mutate(&mut rng, seed.as_bytes());
            let s = String::from_utf8_lossy(&bytes);
            let _ = RtspUrl::parse(&s);
            let _ = map.to_upstream(&s);
            let _ = map.to_client(1, &s);
            let _ = rewrite_rtp_info_urls(&s, |u| map.to_client(0, u));
            let _ = map.sdp_to_client(0, &bytes);
            let _ = parse_www_authenticate(&s);
            let _ = verifier.verify(&s, "DESCRIBE", "rtsp://gw/cam1", 100);
        }
    }
}
