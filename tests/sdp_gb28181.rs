//! Golden test: a GB/T 28181 playback INVITE crossing the gateway. Only the c=, o= and
//! m= values change; GB lines (y=, f=, s=, u=, t=) and attributes stay byte for byte.

use std::convert::Infallible;
use std::net::Ipv4Addr;

use vgate::signaling::sdp::{self, Direction};
use vgate::signaling::sip::{triage_datagram, Editor, Limits, SipMessage, Verdict};

/// A GB/T 28181 playback offer (`tests/golden/sdp`, CRLF line ends).
const GB_SDP: &str = include_str!("golden/sdp/gb_playback.in.sdp");

/// The expected rewrite, with the gateway's address and allocated port spelled out.
const GB_SDP_REWRITTEN: &str = include_str!("golden/sdp/gb_playback.gateway.sdp");

const GW: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 7);

#[test]
fn gb_playback_sdp_parses() {
    let sdp = sdp::parse(GB_SDP.as_bytes()).unwrap();
    assert_eq!(sdp.session_name, b"Playback");
    assert_eq!(sdp.origin_address, Some("192.168.1.64"));
    let [m] = sdp.media.as_slice() else {
        panic!("one media section")
    };
    assert_eq!((m.kind, m.port, m.proto), ("video", 6000, "RTP/AVP"));
    assert_eq!(m.formats().collect::<Vec<_>>(), ["96", "98", "97"]);
    assert_eq!(m.connection, Some(Ipv4Addr::new(192, 168, 1, 64)));
    assert_eq!(m.direction, Direction::RecvOnly);
    assert_eq!(m.ssrc, Some("0100000001"));
    assert_eq!((m.setup, m.rtcp_port), (None, None));
}

#[test]
fn gb_playback_sdp_rewrites_only_addresses_and_ports() {
    let mut seen = Vec::new();
    let out = sdp::rewrite(GB_SDP.as_bytes(), GW, |i, m| {
        seen.push((i, m.port, m.connection));
        Ok::<_, Infallible>(Some(40000))
    })
    .unwrap();
    assert_eq!(seen, [(0, 6000, Some(Ipv4Addr::new(192, 168, 1, 64)))]);
    assert_eq!(String::from_utf8(out.clone()).unwrap(), GB_SDP_REWRITTEN);
    // Nothing of domain A is left in the output.
    assert!(!String::from_utf8_lossy(&out).contains("192.168.1.64"));
}

#[test]
fn gb_tcp_media_keeps_setup_and_reports_it() {
    let body = GB_SDP.replace(
        "RTP/AVP 96 98 97\r\n",
        "TCP/RTP/AVP 96\r\na=setup:passive\r\na=connection:new\r\n",
    );
    let sdp = sdp::parse(body.as_bytes()).unwrap();
    assert_eq!(sdp.media[0].proto, "TCP/RTP/AVP");
    assert_eq!(sdp.media[0].setup, Some("passive"));
    let out = sdp::rewrite(body.as_bytes(), GW, |_, _| Ok::<_, Infallible>(Some(40000))).unwrap();
    let out = String::from_utf8(out).unwrap();
    assert!(out.contains("m=video 40000 TCP/RTP/AVP 96\r\na=setup:passive\r\na=connection:new\r\n"));
}

/// The whole path a proxy takes: triage, rewrite the SDP, replace the body, and the
/// Content-Length follows.
#[test]
fn gb_invite_through_the_editor() {
    let invite = format!(
        "INVITE sip:34020000001320000001@3402000000 SIP/2.0\r\n\
Via: SIP/2.0/UDP 192.168.1.10:5060;rport;branch=z9hG4bK123456\r\n\
From: <sip:34020000002000000001@3402000000>;tag=185326220\r\n\
To: <sip:34020000001320000001@3402000000>\r\n\
Call-ID: 0a7c2f1e@192.168.1.10\r\n\
CSeq: 20 INVITE\r\n\
Contact: <sip:34020000002000000001@192.168.1.10:5060>\r\n\
Content-Type: APPLICATION/SDP\r\n\
Max-Forwards: 70\r\n\
User-Agent: LiveGBS v1\r\n\
Subject: 34020000001320000001:0100000001,34020000002000000001:0\r\n\
Content-Length: {}\r\n\r\n{}",
        GB_SDP.len(),
        GB_SDP
    );
    let Verdict::Forward(msg) = triage_datagram(invite.as_bytes(), &Limits::default()) else {
        panic!("a GB/T 28181 INVITE must pass")
    };
    assert_eq!(msg.head().from().unwrap().gb_id().unwrap().type_code(), 200);
    assert_eq!(msg.head().to().unwrap().gb_id().unwrap().type_code(), 132);
    let body = sdp::rewrite(msg.body(), GW, |_, _| Ok::<_, Infallible>(Some(40000))).unwrap();
    let mut ed = Editor::new(&msg);
    ed.set_body(body);
    let out = ed.to_bytes();
    let again = SipMessage::parse_datagram(&out, &Limits::default()).unwrap();
    assert_eq!(again.body(), GB_SDP_REWRITTEN.as_bytes());
    assert_eq!(
        again.head().header("l").unwrap().value(),
        GB_SDP_REWRITTEN.len().to_string().as_bytes()
    );
    // Headers other than Content-Length are unchanged, byte for byte.
    let head_before = invite.split("Content-Length").next().unwrap();
    assert!(out.starts_with(head_before.as_bytes()));
}
