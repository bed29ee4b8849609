use super::*;

const DESCRIBE: &[u8] = b"DESCRIBE rtsp://10.0.0.5:8554/test RTSP/1.0\r\nCSeq: 2\r\nUser-Agent: x\r\nAccept: application/sdp\r\n\r\n";

fn lim() -> Limits {
    Limits::default()
}

#[test]
fn frames_request_without_body() {
    assert_eq!(
        next_frame(DESCRIBE, &lim()),
        Ok(Frame::Message(DESCRIBE.len()))
    );
    for cut in 0..DESCRIBE.len() {
        assert_eq!(
            next_frame(&DESCRIBE[..cut], &lim()),
            Ok(Frame::Incomplete),
            "cut {cut}"
        );
    }
}

#[test]
fn frames_body_by_content_length_and_tolerates_bare_lf() {
    let msg = b"RTSP/1.0 200 OK\nCSeq: 3\nContent-Length: 4\n\nabcdEXTRA";
    assert_eq!(next_frame(msg, &lim()), Ok(Frame::Message(msg.len() - 5)));
    let m = Message::parse(&msg[..msg.len() - 5], &lim()).unwrap();
    assert_eq!(m.body(), b"abcd");
    assert_eq!(m.status(), Some(200));
    assert_eq!(m.cseq(), Ok(3));
    assert_eq!(
        next_frame(&msg[..msg.len() - 6], &lim()),
        Ok(Frame::Incomplete)
    );
}

#[test]
fn frames_interleaved() {
    let buf = [b'$', 1, 0, 3, 9, 8, 7, b'R'];
    assert_eq!(
        next_frame(&buf, &lim()),
        Ok(Frame::Interleaved { channel: 1, len: 3 })
    );
    assert_eq!(
        Frame::Interleaved { channel: 1, len: 3 }.wire_len(),
        Some(7)
    );
    assert_eq!(interleaved_payload(&buf), Some(&[9u8, 8, 7][..]));
    assert_eq!(next_frame(&buf[..6], &lim()), Ok(Frame::Incomplete));
    assert_eq!(next_frame(&buf[..2], &lim()), Ok(Frame::Incomplete));
}

#[test]
fn empty_lines_between_frames_are_skipped() {
    let mut buf = b"\r\n\n".to_vec();
    buf.extend_from_slice(DESCRIBE);
    assert_eq!(next_frame(&buf, &lim()), Ok(Frame::Skip(3)));
    assert_eq!(
        next_frame(&buf[3..], &lim()),
        Ok(Frame::Message(DESCRIBE.len()))
    );
    assert_eq!(next_frame(b"\r\n$\x00\x00\x00", &lim()), Ok(Frame::Skip(2)));
    // Message::parse itself tolerates them too.
    let m = Message::parse(&buf, &lim()).unwrap();
    assert_eq!(m.method(), Some("DESCRIBE"));
    let dollar = b"$OPTIONS * RTSP/1.0\r\n\r\n";
    assert!(Message::parse(dollar, &lim()).is_err());
}

#[test]
fn limits_apply_before_the_message_is_complete() {
    let small = Limits {
        max_header_bytes: 64,
        max_headers: 2,
        max_body_bytes: 10,
        max_line_bytes: 40,
    };
    let long_line = [b'A'; 41];
    assert_eq!(
        next_frame(&long_line, &small),
        Err(RtspError::LineTooLong { limit: 40 })
    );
    let many = b"OPTIONS * RTSP/1.0\r\nA: 1\r\nB: 2\r\nC: 3\r\n";
    assert_eq!(
        next_frame(many, &small),
        Err(RtspError::TooManyHeaders { limit: 2 })
    );
    let big = b"OPTIONS * RTSP/1.0\r\nA: 11111111111111111111\r\nB: 22222222222222222222";
    assert_eq!(
        next_frame(big, &small),
        Err(RtspError::HeaderTooLarge { limit: 64 })
    );
    let body = b"OPTIONS * RTSP/1.0\r\nContent-Length: 11\r\n\r\n";
    assert_eq!(
        next_frame(body, &small),
        Err(RtspError::BodyTooLarge { len: 11, limit: 10 })
    );
}

#[test]
fn refuses_smuggling_shapes() {
    let dup = b"OPTIONS * RTSP/1.0\r\nContent-Length: 1\r\ncontent-length: 1\r\n\r\nx";
    assert_eq!(
        next_frame(dup, &lim()),
        Err(RtspError::DuplicateContentLength)
    );
    let plus = b"OPTIONS * RTSP/1.0\r\nContent-Length: +1\r\n\r\nx";
    assert_eq!(next_frame(plus, &lim()), Err(RtspError::BadContentLength));
    let fold = b"OPTIONS * RTSP/1.0\r\nCSeq: 1\r\n Content-Length: 1\r\n\r\nx";
    assert_eq!(next_frame(fold, &lim()), Err(RtspError::FoldedHeader));
    let colon = b"OPTIONS * RTSP/1.0\r\nCSeq 1\r\n\r\n";
    assert_eq!(next_frame(colon, &lim()), Err(RtspError::BadHeaderLine));
    let ctl = b"OPTIONS * RTSP/1.0\r\nCSeq: 1\rX: 2\r\n\r\n";
    assert_eq!(next_frame(ctl, &lim()), Err(RtspError::BadHeaderLine));
}

#[test]
fn parses_start_lines() {
    let bad = [
        &b"DESCRIBE rtsp://x RTSP/1.0 extra\r\n\r\n"[..],
        b"DESCRIBE  rtsp://x RTSP/1.0\r\n\r\n",
        b"DESCRIBE rtsp://x HTTP/1.1\r\n\r\n",
        b"RTSP/1.0 20 OK\r\n\r\n",
        b"RTSP/1.0 2000 OK\r\n\r\n",
        b"RTSP/10 200 OK\r\n\r\n",
    ];
    for b in bad {
        assert!(
            matches!(next_frame(b, &lim()), Err(RtspError::BadStartLine { .. })),
            "{b:?}"
        );
    }
    let m = Message::parse(b"RTSP/1.0 454 Session Not Found\r\n\r\n", &lim()).unwrap();
    assert_eq!(
        m.start_line(),
        StartLine::Response {
            version: "RTSP/1.0",
            status: 454,
            reason: "Session Not Found"
        }
    );
    let m = Message::parse(b"RTSP/1.0 200\r\n\r\n", &lim()).unwrap();
    assert_eq!(m.status(), Some(200));
}

#[test]
fn typed_headers() {
    let raw = b"RTSP/1.0 200 OK\r\ncseq: 7\r\nsession:  abcDEF-1.2;timeout=60 \r\nContent-Base: rtsp://h/t/\r\nWWW-Authenticate: Basic realm=\"a\"\r\nWWW-Authenticate: Digest realm=\"a\", nonce=\"n\"\r\n\r\n";
    let m = Message::parse(raw, &lim()).unwrap();
    assert_eq!(m.cseq(), Ok(7));
    assert_eq!(
        m.session(),
        Ok(Some(Session {
            id: "abcDEF-1.2",
            timeout: Some(60)
        }))
    );
    assert_eq!(m.content_base(), Some("rtsp://h/t/"));
    assert_eq!(m.www_authenticate().count(), 2);
    assert_eq!(m.content_location(), None);
    let bad = Message::parse(b"RTSP/1.0 200 OK\r\nSession: ;timeout=1\r\n\r\n", &lim()).unwrap();
    assert_eq!(bad.session(), Err(RtspError::BadSession));
    let bad = Message::parse(b"RTSP/1.0 200 OK\r\nSession: a;timeout=x\r\n\r\n", &lim()).unwrap();
    assert_eq!(bad.session(), Err(RtspError::BadSession));
}

#[test]
fn parse_requires_exact_frame() {
    let mut extra = DESCRIBE.to_vec();
    extra.push(b'X');
    assert_eq!(
        Message::parse(&extra, &lim()).unwrap_err(),
        RtspError::FrameMismatch
    );
    assert_eq!(
        Message::parse(&DESCRIBE[..10], &lim()).unwrap_err(),
        RtspError::FrameMismatch
    );
}

#[test]
fn editor_keeps_untouched_lines_byte_for_byte() {
    let raw = b"SETUP rtsp://gw/cam1/stream=0 RTSP/1.0\r\nCSeq:3\r\nX-Odd:   spaced  \nTransport: RTP/AVP;unicast;client_port=5000-5001\r\nUser-Agent: t\r\n\r\n";
    let m = Message::parse(raw, &lim()).unwrap();
    let mut e = Editor::new(&m);
    e.set_uri("rtsp://10.0.0.5:8554/test/stream=0").unwrap();
    e.set_header("transport", "RTP/AVP;unicast;client_port=40000-40001")
        .unwrap();
    e.remove_header("User-Agent").unwrap();
    e.insert_header("Via", "RTSP/1.0 vgate").unwrap();
    assert_eq!(
            String::from_utf8(e.to_bytes()).unwrap(),
            "SETUP rtsp://10.0.0.5:8554/test/stream=0 RTSP/1.0\r\nCSeq:3\r\nX-Odd:   spaced  \nTransport: RTP/AVP;unicast;client_port=40000-40001\r\nVia: RTSP/1.0 vgate\r\n\r\n"
        );
    assert_eq!(Editor::new(&m).to_bytes(), raw.to_vec());
}

#[test]
fn editor_body_updates_content_length() {
    let raw = b"RTSP/1.0 200 OK\r\nCSeq: 2\r\nContent-Length: 3\r\nX: y\r\n\r\nabc";
    let m = Message::parse(raw, &lim()).unwrap();
    let mut e = Editor::new(&m);
    e.set_body(b"hello".to_vec());
    assert_eq!(
        e.to_bytes(),
        b"RTSP/1.0 200 OK\r\nCSeq: 2\r\nContent-Length: 5\r\nX: y\r\n\r\nhello".to_vec()
    );
    let raw = b"RTSP/1.0 200 OK\r\nCSeq: 2\r\n\r\n";
    let m = Message::parse(raw, &lim()).unwrap();
    let mut e = Editor::new(&m);
    e.set_body(b"v=0\r\n".to_vec());
    assert_eq!(
        e.to_bytes(),
        b"RTSP/1.0 200 OK\r\nCSeq: 2\r\nContent-Length: 5\r\n\r\nv=0\r\n".to_vec()
    );
}

#[test]
fn editor_refuses_injection_and_manual_content_length() {
    let m = Message::parse(DESCRIBE, &lim()).unwrap();
    let mut e = Editor::new(&m);
    assert_eq!(
        e.set_header("X", "a\r\nContent-Length: 9").unwrap_err(),
        RtspError::HeaderInjection
    );
    assert_eq!(
        e.set_uri("rtsp://a b").unwrap_err(),
        RtspError::HeaderInjection
    );
    assert_eq!(
        e.set_header("Content-Length", "1").unwrap_err(),
        RtspError::HeaderInjection
    );
    assert_eq!(
        e.set_header("Bad Name", "1").unwrap_err(),
        RtspError::HeaderInjection
    );
    assert_eq!(Editor::new(&m).to_bytes(), DESCRIBE.to_vec());
}

#[test]
fn debug_masks_credentials() {
    let raw = b"DESCRIBE rtsp://u:pw42@h/ RTSP/1.0\r\nCSeq: 1\r\nAuthorization: Basic YWxpY2U6czNjcmV0\r\n\r\n";
    let m = Message::parse(raw, &lim()).unwrap();
    let mut e = Editor::new(&m);
    e.set_header("Proxy-Authorization", "Basic Ym9iOmh1bnRlcjI=")
        .unwrap();
    let dbg = format!("{m:?} {e:?}");
    assert!(
        !dbg.contains("YWxpY2U6czNjcmV0") && !dbg.contains("Ym9iOmh1bnRlcjI="),
        "{dbg}"
    );
    assert!(
        !dbg.contains("pw42") && dbg.contains("rtsp://***@h/"),
        "{dbg}"
    );
}

#[test]
fn builds_responses() {
    let m = Message::parse(DESCRIBE, &lim()).unwrap();
    let r = m
        .respond(
            Status::UNAUTHORIZED,
            &[("WWW-Authenticate", "Basic realm=\"vgate\"")],
        )
        .unwrap();
    assert_eq!(
        r,
        b"RTSP/1.0 401 Unauthorized\r\nCSeq: 2\r\nWWW-Authenticate: Basic realm=\"vgate\"\r\n\r\n"
            .to_vec()
    );
    assert_eq!(
        build_response(None, Status::BAD_REQUEST, &[]).unwrap(),
        b"RTSP/1.0 400 Bad Request\r\n\r\n".to_vec()
    );
    for s in [
        Status::NOT_ENOUGH_BANDWIDTH,
        Status::SESSION_NOT_FOUND,
        Status::UNSUPPORTED_TRANSPORT,
        Status::INTERNAL_SERVER_ERROR,
        Status::SERVICE_UNAVAILABLE,
    ] {
        let r = m.respond(s, &[]).unwrap();
        let parsed = Message::parse(&r, &lim()).unwrap();
        assert_eq!(parsed.status(), Some(s.code));
        assert_eq!(parsed.cseq(), Ok(2));
    }
    assert!(build_response(Some("1\r\nX: y"), Status::OK, &[]).is_err());
}
