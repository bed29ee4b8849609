//! Property-style robustness: random mutations of valid messages never panic, and
//! what vgate writes out (edited messages, its own responses, rewritten SDP) always
//! parses again. A plain xorshift generator keeps it dependency-free and repeatable.

use std::convert::Infallible;
use std::net::Ipv4Addr;

use vgate::signaling::sdp;
use vgate::signaling::sip::{
    frame, triage_datagram, triage_framed, Editor, Framing, Limits, NameAddr, SipMessage, Uri,
    Verdict, Via,
};

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

const INTERESTING: &[u8] = b"\r\n \t:;,\"<>\\@?=/[]%09\x00\xff-.*";

fn mutate(rng: &mut XorShift, input: &[u8]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(v.len() + 1);
        match rng.below(6) {
            0 if at < v.len() => v[at] ^= 1 << rng.below(8),
            1 if at < v.len() => v[at] = INTERESTING[rng.below(INTERESTING.len())],
            2 => v.insert(at, INTERESTING[rng.below(INTERESTING.len())]),
            3 if at < v.len() => {
                let end = (at + 1 + rng.below(16)).min(v.len());
                v.drain(at..end);
            }
            4 if at < v.len() => {
                let end = (at + 1 + rng.below(32)).min(v.len());
                let copy = v[at..end].to_vec();
                let to = rng.below(v.len() + 1);
                v.splice(to..to, copy);
            }
            _ => v.truncate(at),
        }
    }
    v
}

fn seeds() -> Vec<Vec<u8>> {
    let sdp = "v=0\r\no=34020000001320000001 0 0 IN IP4 192.168.1.64\r\ns=Play\r\nc=IN IP4 192.168.1.64\r\nt=0 0\r\nm=video 6000 RTP/AVP 96\r\na=recvonly\r\na=rtcp:6001 IN IP4 192.168.1.64\r\na=rtpmap:96 PS/90000\r\ny=0100000001\r\n";
    let mut out = vec![
        format!("INVITE sip:34020000001320000001@3402000000 SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.1:5060;rport;branch=z9hG4bK1, SIP/2.0/TCP [2001:db8::1];branch=z9hG4bK0\r\nFrom: \"A, B\" <sip:34020000002000000001@3402000000>;tag=1\r\nTo: <sip:34020000001320000001@3402000000>\r\nCall-ID: x@y\r\nCSeq: 1 INVITE\r\nContact:\r\n  <sip:a@192.0.2.1:5060>;expires=60\r\nRoute: <sip:p;lr>, <sip:q;lr>\r\nMax-Forwards: 70\r\nContent-Type: application/sdp\r\nContent-Length: {}\r\n\r\n{sdp}", sdp.len()).into_bytes(),
        b"SIP/2.0 200 OK\r\nv: SIP/2.0/UDP 192.0.2.1;branch=z9hG4bK1\r\nf: <sip:a@b>;tag=1\r\nt: <sip:c@d>;tag=2\r\ni: q\r\nCSeq: 1 OPTIONS\r\nl: 0\r\n\r\n".to_vec(),
        sdp.as_bytes().to_vec(),
    ];
    let dir = std::env::var_os("VGATE_RFC4475_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/testdata/rfc4475")
        });
    if let Ok(entries) = std::fs::read_dir(&dir) {
        let mut files: Vec<_> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "dat"))
            .collect();
        files.sort();
        out.extend(files.iter().filter_map(|p| std::fs::read(p).ok()));
    }
    out
}

fn exercise(input: &[u8]) {
    let limits = Limits::default();
    match triage_datagram(input, &limits) {
        Verdict::Forward(msg) => exercise_message(&msg),
        Verdict::Answer { head, reject } => {
            let resp = reject.response(&head, "gw1").expect("own response builds");
            let parsed = SipMessage::parse_datagram(&resp, &limits);
            assert!(
                parsed.is_ok(),
                "own response does not parse: {:?}",
                String::from_utf8_lossy(&resp)
            );
        }
        Verdict::Drop(_) => {}
    }
    if let Ok(Framing::Message { skip, len }) = frame(input, &limits) {
        let _ = triage_framed(&input[skip..skip + len], &limits);
    }
    if let Ok(s) = sdp::parse(input) {
        let _ = s.media.iter().map(|m| m.formats().count()).sum::<usize>();
        let out = sdp::rewrite(input, Ipv4Addr::new(198, 51, 100, 7), |i, m| {
            Ok::<_, Infallible>((m.port != 0).then_some(40000 + 2 * i as u16))
        })
        .expect("rewrite of parsed SDP");
        sdp::parse(&out).expect("rewritten SDP parses");
    }
}

fn exercise_message(msg: &SipMessage<'_>) {
    let limits = Limits::default();
    assert_eq!(Editor::new(msg).to_bytes(), msg.as_bytes());
    let head = msg.head();
    for v in head.values("Via") {
        let _ = Via::parse(v);
    }
    for name in ["From", "To", "Contact", "Route", "Record-Route"] {
        for v in head.values(name) {
            if let Ok(a) = NameAddr::parse(v) {
                let _ = a.sip_uri().map(|u| u.gb_id());
            }
        }
    }
    if let Some(u) = head.request_uri() {
        let _ = Uri::parse(u);
    }
    // The edits a proxy makes keep the message parseable.
    let mut ed = Editor::new(msg);
    ed.remove_first_value("Via");
    ed.insert_top("Via", b"SIP/2.0/UDP 198.51.100.7:5060;branch=z9hG4bKgw")
        .unwrap();
    ed.insert_before("Route", "Record-Route", b"<sip:198.51.100.7;lr>")
        .unwrap();
    ed.remove_first_value("Route");
    ed.replace_value("Contact", b"<sip:gw@198.51.100.7>")
        .unwrap();
    if head.is_request() {
        ed.set_request_uri(b"sip:34020000001320000001@198.51.100.8")
            .unwrap();
    }
    ed.set_body(b"v=0\r\n".to_vec());
    let out = ed.to_bytes();
    let again = SipMessage::parse_datagram(&out, &limits);
    assert!(
        again.is_ok(),
        "edited message does not parse: {:?}",
        String::from_utf8_lossy(&out)
    );
}

#[test]
fn random_mutations_never_panic() {
    let seeds = seeds();
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    let rounds = std::env::var("VGATE_MUTATION_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    for round in 0..rounds {
        for (i, seed) in seeds.iter().enumerate() {
            let input = mutate(&mut rng, seed);
            let result = std::panic::catch_unwind(|| exercise(&input));
            if result.is_err() {
                panic!(
                    "round {round}, seed {i}: panicked on {:?}",
                    String::from_utf8_lossy(&input)
                );
            }
        }
    }
    // The unmutated seeds go through as well.
    for seed in &seeds {
        exercise(seed);
    }
}
