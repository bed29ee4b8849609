//! The framing and its authentication: every kind of bad input is an error naming its counter,
//! never a panic.

use super::*;

const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

fn hello(role: Role, seed: u8) -> Hello {
    Hello {
        role,
        instance: [seed; 16],
        nonce: [seed.wrapping_add(1); 32],
    }
}

/// A dialer's sealer and the listener's opener of one connection.
fn pair() -> (Sealer, Opener) {
    let d = hello(Role::Dialer, 1);
    let l = hello(Role::Listener, 9);
    let kd = Keys::derive(KEY, &d, &l).unwrap();
    let kl = Keys::derive(KEY, &l, &d).unwrap();
    (Sealer::new(kd.send), Opener::new(kl.recv))
}

fn stream() -> Vec<u8> {
    let (mut s, _) = pair();
    let mut out = Vec::new();
    s.announce(&mut out, &[5060], &[554, 5060]);
    s.udp(&mut out, 40000, 5060, b"REGISTER sip:x SIP/2.0\r\n\r\n");
    s.seal(&mut out, Kind::Heartbeat, &[]);
    s.tcp_open(&mut out, 7, 41000, 554);
    s.tcp_data(&mut out, 7, b"OPTIONS * RTSP/1.0\r\n\r\n");
    s.tcp_close(&mut out, 7);
    s.seal(&mut out, Kind::Goodbye, &[]);
    out
}

fn open_all(op: &mut Opener, mut buf: &[u8]) -> Result<Vec<String>, FrameError> {
    let mut got = Vec::new();
    while let Some((f, n)) = op.open(buf)? {
        got.push(format!("{f:?}"));
        buf = &buf[n..];
    }
    if buf.is_empty() {
        Ok(got)
    } else {
        Err(FrameError::Truncated)
    }
}

#[test]
fn hello_round_trip_and_refusals() {
    let h = hello(Role::Listener, 3);
    assert_eq!(Hello::parse(&h.encode()), Ok(h));
    let mut b = h.encode();
    b[0] = b'X';
    assert_eq!(Hello::parse(&b), Err(FrameError::NotVgate));
    let mut b = h.encode();
    b[4] = 2;
    assert_eq!(Hello::parse(&b), Err(FrameError::Version(2)));
    let mut b = h.encode();
    b[5] = 0;
    assert_eq!(Hello::parse(&b), Err(FrameError::Malformed));
    let d = hello(Role::Dialer, 1);
    assert!(matches!(
        Keys::derive(KEY, &d, &d),
        Err(FrameError::SameRole)
    ));
}

#[test]
fn frames_round_trip() {
    let (_, mut op) = pair();
    let got = open_all(&mut op, &stream()).unwrap();
    assert_eq!(
        got,
        [
            "Announce { udp: [5060], tcp: [554, 5060] }".to_string(),
            format!(
                "{:?}",
                Frame::Udp {
                    src: 40000,
                    dst: 5060,
                    data: b"REGISTER sip:x SIP/2.0\r\n\r\n"
                }
            ),
            "Heartbeat".to_string(),
            "TcpOpen { id: 7, src: 41000, dst: 554 }".to_string(),
            format!(
                "{:?}",
                Frame::TcpData {
                    id: 7,
                    data: b"OPTIONS * RTSP/1.0\r\n\r\n"
                }
            ),
            "TcpClose { id: 7 }".to_string(),
            "Goodbye".to_string(),
        ]
    );
}

#[test]
fn partial_input_waits() {
    let s = stream();
    for cut in 0..40 {
        let (_, mut op) = pair();
        assert!(op.open(&s[..cut]).unwrap().is_none(), "cut {cut}");
    }
}

#[test]
fn every_flipped_bit_is_refused() {
    let s = stream();
    for i in 0..s.len() {
        for bit in [0x01u8, 0x80] {
            let mut b = s.clone();
            b[i] ^= bit;
            let (_, mut op) = pair();
            let r = open_all(&mut op, &b);
            assert!(
                r.is_err(),
                "flipping bit {bit:#x} of byte {i} went unnoticed"
            );
        }
    }
}

#[test]
fn forged_frame_fails_its_tag() {
    let (_, mut op) = pair();
    // Sealed with the wrong shared key.
    let d = hello(Role::Dialer, 1);
    let l = hello(Role::Listener, 9);
    let mut wrong = Sealer::new(
        Keys::derive(b"another key another key another!", &d, &l)
            .unwrap()
            .send,
    );
    let mut out = Vec::new();
    wrong.announce(&mut out, &[], &[]);
    assert_eq!(op.open(&out), Err(FrameError::BadTag));
}

#[test]
fn replayed_and_reordered_frames_are_refused() {
    let (mut s, mut op) = pair();
    let mut a = Vec::new();
    s.announce(&mut a, &[], &[]);
    let mut h1 = Vec::new();
    s.seal(&mut h1, Kind::Heartbeat, &[]);
    let mut h2 = Vec::new();
    s.seal(&mut h2, Kind::Heartbeat, &[]);
    assert!(op.open(&a).unwrap().is_some());
    // Reordered: h2 before h1.
    let (_, mut op2) = pair();
    assert!(op2.open(&a).unwrap().is_some());
    assert_eq!(op2.open(&h2), Err(FrameError::Replay));
    // Replayed: h1 twice.
    assert!(op.open(&h1).unwrap().is_some());
    assert_eq!(op.open(&h1), Err(FrameError::Replay));
}

#[test]
fn frame_from_another_connection_or_reflected_fails() {
    let (mut s, _) = pair();
    let mut a = Vec::new();
    s.announce(&mut a, &[], &[]);
    // Another connection: new nonces.
    let d = hello(Role::Dialer, 1);
    let l = hello(Role::Listener, 77);
    let mut op = Opener::new(Keys::derive(KEY, &l, &d).unwrap().recv);
    assert_eq!(op.open(&a), Err(FrameError::BadTag));
    // Reflected back to the dialer: the other direction's key.
    let d = hello(Role::Dialer, 1);
    let l = hello(Role::Listener, 9);
    let mut back = Opener::new(Keys::derive(KEY, &d, &l).unwrap().recv);
    assert_eq!(back.open(&a), Err(FrameError::BadTag));
}

#[test]
fn first_frame_must_be_the_announcement() {
    let (mut s, mut op) = pair();
    let mut h = Vec::new();
    s.seal(&mut h, Kind::Heartbeat, &[]);
    assert_eq!(op.open(&h), Err(FrameError::NoAnnounce));
}

#[test]
fn bad_lengths_and_payloads_are_malformed() {
    let (_, mut op) = pair();
    assert_eq!(op.open(&[0, 0, 0, 3, 1, 2, 3]), Err(FrameError::Malformed));
    assert_eq!(
        op.open(&[0xff, 0xff, 0xff, 0xff]),
        Err(FrameError::Malformed)
    );
    // Well tagged but a payload that does not fit its type.
    let (mut s, mut op) = pair();
    let mut a = Vec::new();
    s.announce(&mut a, &[], &[]);
    s.seal(&mut a, Kind::TcpClose, &[b"xy"]);
    let (f, n) = op.open(&a).unwrap().unwrap();
    assert!(matches!(f, Frame::Announce { .. }));
    assert_eq!(op.open(&a[n..]), Err(FrameError::Malformed));
    // Unknown type.
    let (mut s, mut op) = pair();
    let mut a = Vec::new();
    s.announce(&mut a, &[], &[]);
    let mut bad = Vec::new();
    let len = (MIN_BODY as u32).to_be_bytes();
    bad.extend_from_slice(&len);
    bad.push(99);
    bad.extend_from_slice(&1u64.to_be_bytes());
    let mut m = s.key.clone();
    m.update(&bad);
    bad.extend_from_slice(&m.finalize().into_bytes());
    let (_, n) = op.open(&a).unwrap().unwrap();
    assert_eq!(n, a.len());
    assert_eq!(op.open(&bad), Err(FrameError::Malformed));
}

/// A small xorshift: the fuzz-style tests are reproducible without a crate.
fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed | 1;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

#[test]
fn random_bytes_never_panic_and_never_pass() {
    let mut r = rng(0x5eed_1234);
    for _ in 0..20_000 {
        let len = (r() % 200) as usize;
        let mut b: Vec<u8> = (0..len).map(|_| r() as u8).collect();
        if r().is_multiple_of(2) && b.len() >= 4 {
            // A plausible length, so the tag check is reached.
            let l = (b.len() - 4) as u32;
            b[..4].copy_from_slice(&l.to_be_bytes());
        }
        let (_, mut op) = pair();
        match op.open(&b) {
            Ok(None) => {}
            Ok(Some(f)) => panic!("random bytes accepted as {f:?}"),
            Err(_) => {}
        }
        if b.len() >= HELLO_LEN {
            let mut h = [0u8; HELLO_LEN];
            h.copy_from_slice(&b[..HELLO_LEN]);
            let _ = Hello::parse(&h);
        }
    }
}

#[test]
fn mutated_streams_never_panic() {
    let s = stream();
    let mut r = rng(42);
    for _ in 0..5_000 {
        let mut b = s.clone();
        for _ in 0..1 + r() % 4 {
            let i = (r() as usize) % b.len();
            match r() % 3 {
                0 => b[i] = r() as u8,
                1 => {
                    b.truncate(i);
                }
                _ => b.insert(i, r() as u8),
            }
            if b.is_empty() {
                break;
            }
        }
        let (_, mut op) = pair();
        let _ = open_all(&mut op, &b);
    }
}
