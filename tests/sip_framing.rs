//! TCP framing: split reads, pipelined messages, keep-alives, refused streams.

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
                Framing::Incomplete { skip } => {
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
