//! TCP framing: split reads, pipelined messages, keep-alives, refused streams.

mod common;

use vgate::signaling::sip::{frame, triage_framed, Framing, Limits, SipError, Verdict};

fn msg(call: u32, body: &str) -> Vec<u8> {
    format!(
        "MESSAGE sip:34020000001320000001@3402000000 SIP/2.0\r\n\
Via: SIP/2.0/TCP 192.0.2.1:5060;branch=z9hG4bK{call}\r\n\
From: <sip:34020000002000000001@3402000000>;tag={call}\r\n\
To: <sip:34020000001320000001@3402000000>\r\n\
Call-ID: c{call}\r\n\
CSeq: {call} MESSAGE\r\n\
Max-Forwards: 70\r\n\
Content-Type: Application/MANSCDP+xml\r\n\
Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Feeds `stream` in chunks of `chunk` bytes, draining messages the way a
/// connection owner would; returns the messages found.
fn drain(stream: &[u8], chunk: usize) -> Vec<Vec<u8>> {
    let limits = Limits::default();
    let mut buf: Vec<u8> = Vec::new();
    let mut out = Vec::new();
    for piece in stream.chunks(chunk) {
        buf.extend_from_slice(piece);
        loop {
            match frame(&buf, &limits).unwrap() {
                Framing::Message { skip, len } => {
                    let m = buf[skip..skip + len].to_vec();
                    assert!(matches!(triage_framed(&m, &limits), Verdict::Forward(_)));
                    out.push(m);
                    buf.drain(..skip + len);
                }
                Framing::Incomplete { skip, .. } => {
                    buf.drain(..skip);
                    break;
                }
            }
        }
    }
    assert!(
        buf.is_empty(),
        "bytes left over: {:?}",
        String::from_utf8_lossy(&buf)
    );
    out
}

#[test]
fn split_reads_and_pipelining() {
    let a = msg(
        1,
        "<?xml version=\"1.0\"?><Notify><CmdType>Keepalive</CmdType></Notify>",
    );
    let b = msg(2, "");
    let c = msg(3, "\r\n\r\n<x/>\r\n\r\n"); // a body holding blank lines frames by length
    let mut stream = b"\r\n\r\n".to_vec(); // a keep-alive ping first
    stream.extend_from_slice(&a);
    stream.extend_from_slice(b"\r\n");
    stream.extend_from_slice(&b);
    stream.extend_from_slice(&c);
    for chunk in [1, 2, 3, 7, 64, 1000, stream.len()] {
        let got = drain(&stream, chunk);
        assert_eq!(
            got,
            vec![a.clone(), b.clone(), c.clone()],
            "chunk size {chunk}"
        );
    }
}

#[test]
fn refuses_unframeable_streams() {
    let limits = Limits::default();
    let no_length = b"OPTIONS sip:a@b SIP/2.0\r\nVia: SIP/2.0/TCP h;branch=z9hG4bK1\r\n\r\n";
    assert_eq!(
        frame(no_length, &limits),
        Err(SipError::ContentLengthMissing)
    );
    let huge = b"OPTIONS sip:a@b SIP/2.0\r\nContent-Length: 999999\r\n\r\n";
    assert_eq!(
        frame(huge, &limits),
        Err(SipError::TooLarge {
            limit: limits.max_message
        })
    );
    let endless = vec![b'a'; limits.max_message + 1];
    assert!(frame(&endless, &limits).is_err());
    let bad = b"OPTIONS sip:a@b SIP/2.0\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n";
    assert_eq!(frame(bad, &limits), Err(SipError::ContentLengthMultiple));
}

#[test]
fn framed_message_must_be_exact() {
    let limits = Limits::default();
    let mut m = msg(1, "abc");
    m.extend_from_slice(b"junk");
    assert!(matches!(triage_framed(&m, &limits), Verdict::Answer { .. }));
}

// ---- The connection framing path of the proxy (`net::take_frames`) and the core. ----

use std::net::SocketAddrV4;
use std::sync::Arc;
use std::time::Instant;

use vgate::config;
use vgate::routes::{NoHooks, Routes};
use vgate::signaling::proxy::sip::net::take_frames;
use vgate::signaling::proxy::sip::{Core, Face, Out, Peer};

const TCP_CONFIG: &str = offline_config!(
    r#"
[[signaling_route]]
name = "b2a-tcp"
type = "sip"
transport = "tcp"
listen_domain = "b"
listen_port = 5060
upstream = "10.1.0.9:5060"
max_message = 4096
"#
);

fn tcp_core() -> Core {
    let cfg = config::parse(TCP_CONFIG, "framing.toml").unwrap();
    let routes = Arc::new(Routes::new(&cfg, Arc::new(NoHooks)));
    let r = &cfg.signaling[0];
    Core::new(
        r,
        &cfg,
        routes,
        [
            "10.2.0.1:5060".parse().unwrap(),
            "10.1.0.1:40000".parse().unwrap(),
        ],
        "f",
    )
}

/// A connection's bytes arriving in `chunk`-sized reads, through `take_frames` into the
/// core, the way the event loop does it. Returns what the core sent, the pongs owed and
/// the framing error that ended the stream, if any.
fn through(core: &mut Core, stream: &[u8], chunk: usize) -> (Vec<Out>, usize, Option<SipError>) {
    let limits = Limits {
        max_message: 4096,
        ..Limits::default()
    };
    let peer = Peer {
        addr: "10.2.0.50:41000".parse::<SocketAddrV4>().unwrap(),
        conn: Some(7),
    };
    let (mut rbuf, mut outs, mut pongs) = (Vec::new(), Vec::new(), 0);
    for piece in stream.chunks(chunk) {
        rbuf.extend_from_slice(piece);
        let f = take_frames(&mut rbuf, &limits);
        pongs += f.pings;
        for m in f.messages {
            outs.extend(core.on_message(Face::Listen, peer, &m, Instant::now()));
        }
        if let Some(e) = f.error {
            outs.extend(core.on_stream_error(Face::Listen, peer, &rbuf, &e, Instant::now()));
            return (outs, pongs, Some(e));
        }
    }
    (outs, pongs, None)
}

fn catalog_body(items: usize) -> String {
    let mut s = String::from("<?xml version=\"1.0\" encoding=\"GB2312\"?>\r\n<Response>\r\n<CmdType>Catalog</CmdType>\r\n<SN>7</SN>\r\n<DeviceList>\r\n");
    for i in 0..items {
        s.push_str(&format!("<Item><DeviceID>340200000013200000{i:02}</DeviceID><Name>Camera {i}</Name><Status>ON</Status></Item>\r\n"));
    }
    s.push_str("</DeviceList>\r\n</Response>\r\n");
    s
}

#[test]
fn tcp_stream_frames_pings_and_big_messages_through_the_core() {
    let big = catalog_body(25);
    assert!(big.len() > 1500 && big.len() < 3500);
    let a = msg(1, &big);
    let b = msg(2, "");
    let mut stream = b"\r\n\r\n".to_vec(); // an RFC 5626 ping
    stream.extend_from_slice(&a);
    stream.extend_from_slice(&b);
    stream.extend_from_slice(b"\r\n\r\n"); // another, between messages
    for chunk in [1, 5, 700, 1460, stream.len()] {
        let mut core = tcp_core();
        let (outs, pongs, err) = through(&mut core, &stream, chunk);
        assert_eq!(err, None);
        assert_eq!(pongs, 2, "chunk {chunk}: one pong per ping");
        assert_eq!(outs.len(), 2, "chunk {chunk}: both forwarded: {outs:?}");
        for o in &outs {
            assert_eq!(o.face, Face::Upstream);
            assert_eq!(o.to.addr, "10.1.0.9:5060".parse().unwrap());
            let t = String::from_utf8_lossy(&o.bytes);
            assert!(t.contains("Via: SIP/2.0/TCP 10.1.0.1:40000;branch=z9hG4bKvg"));
        }
        let first = String::from_utf8_lossy(&outs[0].bytes);
        assert!(first.ends_with(&big), "the catalog crosses unchanged");
        assert!(first.contains(&format!("Content-Length: {}\r\n", big.len())));
        assert_eq!(core.counters.forwarded_requests, 2);
        assert_eq!(core.counters.tcp_unframeable, 0);
    }
}

#[test]
fn tcp_oversized_message_is_answered_513_counted_and_ends_the_stream() {
    let mut core = tcp_core();
    let huge = catalog_body(60);
    assert!(huge.len() > 4096);
    let mut stream = msg(1, "");
    stream.extend_from_slice(&msg(2, &huge));
    stream.extend_from_slice(&msg(3, ""));
    let (outs, _, err) = through(&mut core, &stream, 1000);
    assert_eq!(err, Some(SipError::TooLarge { limit: 4096 }));
    assert_eq!(outs.len(), 2, "{outs:?}");
    assert_eq!(
        outs[0].face,
        Face::Upstream,
        "the first message is forwarded"
    );
    let answer = String::from_utf8_lossy(&outs[1].bytes);
    assert!(
        answer.starts_with("SIP/2.0 513 Message Too Large\r\n"),
        "{answer}"
    );
    assert!(answer.contains("Warning: 399 vgate \"message exceeds the 4096-byte limit"));
    assert!(answer.contains("CSeq: 2 MESSAGE\r\n"));
    assert_eq!(outs[1].to.conn, Some(7), "on the same connection");
    assert_eq!(core.counters.too_large, 1);
    assert_eq!(core.counters.tcp_unframeable, 1);
    assert_eq!(
        core.counters.forwarded_requests, 1,
        "nothing after it is read"
    );
}

#[test]
fn tcp_unframeable_streams_are_answered_when_possible() {
    // No Content-Length on a stream: 400 naming it.
    let mut core = tcp_core();
    let no_length = b"OPTIONS sip:34020000001320000001@3402000000 SIP/2.0\r\nVia: SIP/2.0/TCP 10.2.0.50:41000;branch=z9hG4bKnl\r\nFrom: <sip:a@3402000000>;tag=1\r\nTo: <sip:b@3402000000>\r\nCall-ID: nl\r\nCSeq: 1 OPTIONS\r\nMax-Forwards: 70\r\n\r\n";
    let (outs, _, err) = through(&mut core, no_length, 64);
    assert_eq!(err, Some(SipError::ContentLengthMissing));
    assert_eq!(outs.len(), 1);
    assert!(String::from_utf8_lossy(&outs[0].bytes)
        .starts_with("SIP/2.0 400 Bad Request - Missing Content-Length\r\n"));
    // A header section that never ends within the limit: nothing to answer, counted.
    let mut core = tcp_core();
    let mut endless = b"MESSAGE sip:a@b SIP/2.0\r\n".to_vec();
    while endless.len() < 5000 {
        endless.extend_from_slice(b"X-Filler: 0123456789012345678901234567890123456789\r\n");
    }
    let (outs, _, err) = through(&mut core, &endless, 512);
    assert_eq!(err, Some(SipError::TooLarge { limit: 4096 }));
    assert!(outs.is_empty());
    assert_eq!(core.counters.tcp_unframeable, 1);
    assert_eq!(core.counters.too_large, 1);
    // A response that cannot be framed is never answered.
    let mut core = tcp_core();
    let resp = b"SIP/2.0 200 OK\r\nVia: SIP/2.0/TCP 10.2.0.50;branch=z9hG4bKr\r\nContent-Length: 9999\r\n\r\n";
    let (outs, _, err) = through(&mut core, resp, 1000);
    assert!(err.is_some());
    assert!(outs.is_empty());
}

/// A TCP limit far above a datagram (`max_tcp_message`, a cascade's Catalog): a large body
/// is framed once its head is in (`need` tells the owner how long to wait), and the header
/// section is still looked for within `max_head` only.
#[test]
fn large_tcp_messages_are_framed_with_a_bounded_head_search() {
    let limits = Limits {
        max_message: 1 << 20,
        ..Limits::default()
    };
    let body = "<Item>x</Item>".repeat(30_000);
    let m = msg(7, &body);
    assert!(m.len() > 400_000);
    let head_len = m.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    assert_eq!(
        frame(&m[..head_len + 10], &limits),
        Ok(Framing::Incomplete {
            skip: 0,
            need: m.len()
        })
    );
    assert_eq!(
        frame(&m, &limits),
        Ok(Framing::Message {
            skip: 0,
            len: m.len()
        })
    );
    assert!(matches!(triage_framed(&m, &limits), Verdict::Forward(_)));
    // Over the limit: refused on the head, before the body is buffered.
    let big = msg(8, &"y".repeat((1 << 20) + 1));
    assert_eq!(
        frame(&big[..head_len + 10], &limits),
        Err(SipError::TooLarge { limit: 1 << 20 })
    );
    // Header lines without end: refused at max_head, not searched up to max_message.
    let endless = format!("MESSAGE sip:a@b SIP/2.0\r\n{}", "X-A: b\r\n".repeat(10_000));
    let e = frame(endless.as_bytes(), &limits).unwrap_err();
    assert_eq!(e, SipError::HeadTooLarge { limit: 64 * 1024 });
    assert_eq!(e.status(), 513);
}
