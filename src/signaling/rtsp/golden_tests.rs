//! Golden tests: a whole DESCRIBE / SETUP / PLAY exchange with a GStreamer
//! RTSP server, as the proxy will rewrite it in each direction.
//!
//! The little `Proxy` below composes the public API exactly the way the real
//! proxy is expected to, so it doubles as the usage example. Ports the
//! caller allocates appear in expected texts as `A_RTP`/`A_RTCP` (vgate's
//! domain-A ports the camera sends to) and `B_RTP`/`B_RTCP` (vgate's
//! domain-B ports the client receives from), filled in from a fake allocator.
//!
//! Domain A: camera 10.0.0.5:8554 (`/test`), vgate 10.0.0.1.
//! Domain B: client 192.168.1.20, vgate 192.168.1.1:554, route `/cam1`.

use std::net::IpAddr;

use crate::signaling::rtsp::message::{Editor, Frame, Limits, Message};
use crate::signaling::rtsp::transport::{
    parse_transport, select_transport, Delivery, PortRange, TransportPolicy,
};
use crate::signaling::rtsp::url::{Authority, Route, UrlMap};
use crate::signaling::rtsp::{next_frame, RtspError};

/// Which domain a port is allocated in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    A,
    B,
}

const A_PORTS: (u16, u16) = (40000, 40001);
const B_PORTS: (u16, u16) = (50000, 50001);

fn fake_allocator() -> impl FnMut(Side) -> (u16, u16) {
    |side| match side {
        Side::A => A_PORTS,
        Side::B => B_PORTS,
    }
}

fn fill(expected: &str) -> String {
    expected
        .replace("A_RTCP", &A_PORTS.1.to_string())
        .replace("A_RTP", &A_PORTS.0.to_string())
        .replace("B_RTCP", &B_PORTS.1.to_string())
        .replace("B_RTP", &B_PORTS.0.to_string())
}

/// What a UDP SETUP left for its reply: the client's own ports.
#[derive(Debug, Clone, Copy)]
struct PendingSetup {
    client_ports: PortRange,
}

struct Proxy {
    map: UrlMap,
    vgate_b: IpAddr,
    limits: Limits,
    policy: TransportPolicy,
}

impl Proxy {
    fn new() -> Self {
        let camera = Authority::new("10.0.0.5", 8554).unwrap();
        Proxy {
            map: UrlMap::new(
                Authority::new("192.168.1.1", 554).unwrap(),
                vec![Route::new("/cam1", camera, "/test")],
            ),
            vgate_b: "192.168.1.1".parse().unwrap(),
            limits: Limits::default(),
            policy: TransportPolicy::default(),
        }
    }

    /// Client request → upstream request.
    fn request_upstream(
        &self,
        raw: &[u8],
        client: IpAddr,
        alloc: &mut impl FnMut(Side) -> (u16, u16),
    ) -> Result<(Vec<u8>, usize, Option<PendingSetup>), RtspError> {
        assert_eq!(next_frame(raw, &self.limits)?, Frame::Message(raw.len()));
        let msg = Message::parse(raw, &self.limits)?;
        let up = self.map.to_upstream(msg.uri().unwrap_or_default())?;
        let mut editor = Editor::new(&msg);
        editor.set_uri(&up.url)?;
        let mut pending = None;
        if let Some(value) = msg.transport() {
            let specs = parse_transport(value)?;
            let (chosen, delivery) = select_transport(&specs, client, &self.policy)?;
            let mut spec = chosen.clone().with_unicast().without_destination();
            if let Delivery::Udp { client_port } = delivery {
                let (rtp, rtcp) = alloc(Side::A);
                spec = spec.with_client_port(rtp, Some(rtcp))?;
                pending = Some(PendingSetup {
                    client_ports: client_port,
                });
            }
            editor.set_header("Transport", &spec.to_string())?;
        }
        Ok((editor.to_bytes(), up.route, pending))
    }

    /// Upstream response → client response.
    fn response_to_client(
        &self,
        raw: &[u8],
        route: usize,
        pending: Option<PendingSetup>,
        alloc: &mut impl FnMut(Side) -> (u16, u16),
    ) -> Result<Vec<u8>, RtspError> {
        assert_eq!(next_frame(raw, &self.limits)?, Frame::Message(raw.len()));
        let msg = Message::parse(raw, &self.limits)?;
        let mut editor = Editor::new(&msg);
        for name in ["Content-Base", "Content-Location"] {
            if let Some(url) = msg.header(name) {
                editor.set_header(name, &self.map.to_client(route, url)?)?;
            }
        }
        if let Some(info) = msg.rtp_info() {
            editor.set_header("RTP-Info", &self.map.rtp_info_to_client(route, info)?)?;
        }
        if !msg.body().is_empty() {
            let body = self.map.sdp_to_client(route, msg.body())?;
            editor.set_body(body.into_owned());
        }
        if let Some(value) = msg.transport() {
            let mut specs = parse_transport(value)?;
            let spec = specs.swap_remove(0).without_destination();
            let spec = match pending {
                Some(setup) => {
                    let ports = setup.client_ports;
                    let (rtp, rtcp) = alloc(Side::B);
                    spec.with_client_port(ports.rtp(), ports.rtcp())?
                        .with_server_port(rtp, Some(rtcp))?
                        .with_source(self.vgate_b)
                }
                None if spec.source().is_some() => spec.with_source(self.vgate_b),
                None => spec,
            };
            editor.set_header("Transport", &spec.to_string())?;
        }
        Ok(editor.to_bytes())
    }
}

fn text(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).unwrap()
}

fn client_ip() -> IpAddr {
    "192.168.1.20".parse().unwrap()
}

const SDP_RELATIVE: &str = "v=0\r\n\
o=- 1188340656180883 1 IN IP4 10.0.0.5\r\n\
s=Session streamed with GStreamer\r\n\
i=rtsp-server\r\n\
t=0 0\r\n\
a=tool:GStreamer\r\n\
a=type:broadcast\r\n\
a=control:*\r\n\
a=range:npt=now-\r\n\
m=video 0 RTP/AVP 26\r\n\
c=IN IP4 0.0.0.0\r\n\
a=rtpmap:26 JPEG/90000\r\n\
a=control:stream=0\r\n\
m=audio 0 RTP/AVP 0\r\n\
c=IN IP4 0.0.0.0\r\n\
a=rtpmap:0 PCMU/8000\r\n\
a=control:stream=1\r\n";

fn describe_reply(sdp: &str) -> String {
    format!(
        "RTSP/1.0 200 OK\r\n\
CSeq: 2\r\n\
Content-Type: application/sdp\r\n\
Content-Base: rtsp://10.0.0.5:8554/test/\r\n\
Server: GStreamer RTSP server\r\n\
Date: Thu, 01 Jan 2026 00:00:00 GMT\r\n\
Content-Length: {}\r\n\r\n{sdp}",
        sdp.len()
    )
}

#[test]
fn describe_with_relative_controls() {
    let proxy = Proxy::new();
    let mut alloc = fake_allocator();
    let request = b"DESCRIBE rtsp://192.168.1.1:554/cam1 RTSP/1.0\r\n\
CSeq: 2\r\n\
User-Agent: LibVLC/3.0.18 (LIVE555 Streaming Media v2016.11.28)\r\n\
Accept: application/sdp\r\n\r\n";
    let (up, route, pending) = proxy
        .request_upstream(request, client_ip(), &mut alloc)
        .unwrap();
    assert_eq!(
        text(&up),
        "DESCRIBE rtsp://10.0.0.5:8554/test RTSP/1.0\r\n\
CSeq: 2\r\n\
User-Agent: LibVLC/3.0.18 (LIVE555 Streaming Media v2016.11.28)\r\n\
Accept: application/sdp\r\n\r\n"
    );
    assert!(pending.is_none());

    let reply = describe_reply(SDP_RELATIVE);
    let down = proxy
        .response_to_client(reply.as_bytes(), route, None, &mut alloc)
        .unwrap();
    // Only Content-Base changes: relative controls need no rewrite, and the
    // o=/c= lines are the SDP rewriter's job.
    let expected = reply.replace(
        "Content-Base: rtsp://10.0.0.5:8554/test/",
        "Content-Base: rtsp://192.168.1.1:554/cam1/",
    );
    assert_eq!(text(&down), expected);
}

#[test]
fn describe_with_absolute_controls() {
    let proxy = Proxy::new();
    let sdp = SDP_RELATIVE
        .replace("a=control:*", "a=control:rtsp://10.0.0.5:8554/test")
        .replace(
            "a=control:stream=0",
            "a=control:rtsp://10.0.0.5:8554/test/stream=0",
        )
        .replace(
            "a=control:stream=1",
            "a=control:rtsp://10.0.0.5:8554/test/stream=1",
        );
    let reply = describe_reply(&sdp).replace(
        "Server:",
        "Content-Location: rtsp://10.0.0.5:8554/test/\r\nServer:",
    );
    let down = proxy
        .response_to_client(reply.as_bytes(), 0, None, &mut fake_allocator())
        .unwrap();
    let expected_sdp = "v=0\r\n\
o=- 1188340656180883 1 IN IP4 10.0.0.5\r\n\
s=Session streamed with GStreamer\r\n\
i=rtsp-server\r\n\
t=0 0\r\n\
a=tool:GStreamer\r\n\
a=type:broadcast\r\n\
a=control:rtsp://192.168.1.1:554/cam1\r\n\
a=range:npt=now-\r\n\
m=video 0 RTP/AVP 26\r\n\
c=IN IP4 0.0.0.0\r\n\
a=rtpmap:26 JPEG/90000\r\n\
a=control:rtsp://192.168.1.1:554/cam1/stream=0\r\n\
m=audio 0 RTP/AVP 0\r\n\
c=IN IP4 0.0.0.0\r\n\
a=rtpmap:0 PCMU/8000\r\n\
a=control:rtsp://192.168.1.1:554/cam1/stream=1\r\n";
    let expected = format!(
        "RTSP/1.0 200 OK\r\n\
CSeq: 2\r\n\
Content-Type: application/sdp\r\n\
Content-Base: rtsp://192.168.1.1:554/cam1/\r\n\
Content-Location: rtsp://192.168.1.1:554/cam1/\r\n\
Server: GStreamer RTSP server\r\n\
Date: Thu, 01 Jan 2026 00:00:00 GMT\r\n\
Content-Length: {}\r\n\r\n{expected_sdp}",
        expected_sdp.len()
    );
    assert_eq!(text(&down), expected);
    assert!(
        !text(&down).contains("10.0.0.5:8554"),
        "no camera URL may reach domain B"
    );
}

#[test]
fn setup_udp_both_tracks() {
    let proxy = Proxy::new();
    let mut alloc = fake_allocator();
    for (track, client_ports) in [("stream=0", "5000-5001"), ("stream=1", "5002-5003")] {
        let request = format!(
            "SETUP rtsp://192.168.1.1:554/cam1/{track} RTSP/1.0\r\n\
CSeq: 3\r\n\
Transport: RTP/AVP;unicast;client_port={client_ports}\r\n\
User-Agent: GStreamer/1.22.0\r\n\r\n"
        );
        let (up, route, pending) = proxy
            .request_upstream(request.as_bytes(), client_ip(), &mut alloc)
            .unwrap();
        assert_eq!(
            text(&up),
            fill(&format!(
                "SETUP rtsp://10.0.0.5:8554/test/{track} RTSP/1.0\r\n\
CSeq: 3\r\n\
Transport: RTP/AVP;unicast;client_port=A_RTP-A_RTCP\r\n\
User-Agent: GStreamer/1.22.0\r\n\r\n"
            ))
        );

        let reply = fill(
            "RTSP/1.0 200 OK\r\n\
CSeq: 3\r\n\
Transport: RTP/AVP;unicast;client_port=A_RTP-A_RTCP;server_port=6970-6971;ssrc=1F2E3D4C;source=10.0.0.5;mode=\"PLAY\"\r\n\
Server: GStreamer RTSP server\r\n\
Session: 8C1lTfu6ECTy5K4R;timeout=60\r\n\
Date: Thu, 01 Jan 2026 00:00:00 GMT\r\n\r\n",
        );
        let down = proxy
            .response_to_client(reply.as_bytes(), route, pending, &mut alloc)
            .unwrap();
        assert_eq!(
            text(&down),
            fill(&format!(
                "RTSP/1.0 200 OK\r\n\
CSeq: 3\r\n\
Transport: RTP/AVP;unicast;client_port={client_ports};server_port=B_RTP-B_RTCP;ssrc=1F2E3D4C;source=192.168.1.1;mode=\"PLAY\"\r\n\
Server: GStreamer RTSP server\r\n\
Session: 8C1lTfu6ECTy5K4R;timeout=60\r\n\
Date: Thu, 01 Jan 2026 00:00:00 GMT\r\n\r\n"
            ))
        );
    }
}

#[test]
fn setup_interleaved_passes_channels_through() {
    let proxy = Proxy::new();
    let mut alloc = |_| -> (u16, u16) { panic!("interleaved needs no ports") };
    let request = b"SETUP rtsp://192.168.1.1:554/cam1/stream=0 RTSP/1.0\r\n\
CSeq: 3\r\n\
Transport: RTP/AVP/TCP;unicast;interleaved=0-1\r\n\r\n";
    let (up, route, pending) = proxy
        .request_upstream(request, client_ip(), &mut alloc)
        .unwrap();
    assert_eq!(
        text(&up),
        "SETUP rtsp://10.0.0.5:8554/test/stream=0 RTSP/1.0\r\n\
CSeq: 3\r\n\
Transport: RTP/AVP/TCP;unicast;interleaved=0-1\r\n\r\n"
    );
    assert!(pending.is_none());
    let reply = b"RTSP/1.0 200 OK\r\n\
CSeq: 3\r\n\
Transport: RTP/AVP/TCP;unicast;interleaved=0-1;ssrc=5A1B2C3D;mode=\"PLAY\"\r\n\
Session: 8C1lTfu6ECTy5K4R;timeout=60\r\n\r\n";
    let down = proxy
        .response_to_client(reply, route, None, &mut alloc)
        .unwrap();
    assert_eq!(
        down,
        reply.to_vec(),
        "nothing to hide: passes byte-for-byte"
    );

    // Media then arrives interleaved on the same connection, between messages.
    let mut stream = vec![b'$', 0, 0, 4, 0x80, 0x1a, 0, 1];
    stream.extend_from_slice(&down);
    let first = next_frame(&stream, &proxy.limits).unwrap();
    assert_eq!(first, Frame::Interleaved { channel: 0, len: 4 });
    let rest = &stream[first.wire_len().unwrap()..];
    assert_eq!(
        next_frame(rest, &proxy.limits).unwrap(),
        Frame::Message(down.len())
    );
}

#[test]
fn setup_policy_refusals_become_responses() {
    let proxy = Proxy::new();
    let mut alloc = fake_allocator();
    let cases = [
        ("RTP/AVP;multicast", RtspError::MulticastRefused),
        (
            "RTP/AVP;unicast;client_port=5000-5001;destination=203.0.113.9",
            RtspError::ForeignDestination,
        ),
        ("RTP/AVP;mode=\"", RtspError::UnterminatedQuote),
    ];
    for (transport, want) in cases {
        let request = format!(
            "SETUP rtsp://192.168.1.1:554/cam1/stream=0 RTSP/1.0\r\nCSeq: 9\r\nTransport: {transport}\r\n\r\n"
        );
        let err = proxy
            .request_upstream(request.as_bytes(), client_ip(), &mut alloc)
            .unwrap_err();
        assert_eq!(err, want);
        let msg = Message::parse(request.as_bytes(), &proxy.limits).unwrap();
        let reply = msg
            .respond(crate::signaling::rtsp::Status::UNSUPPORTED_TRANSPORT, &[])
            .unwrap();
        assert_eq!(
            text(&reply),
            "RTSP/1.0 461 Unsupported Transport\r\nCSeq: 9\r\n\r\n"
        );
    }
}

#[test]
fn play_rewrites_rtp_info() {
    let proxy = Proxy::new();
    let mut alloc = fake_allocator();
    let request = b"PLAY rtsp://192.168.1.1:554/cam1/ RTSP/1.0\r\n\
CSeq: 5\r\n\
Session: 8C1lTfu6ECTy5K4R\r\n\
Range: npt=0-\r\n\r\n";
    let (up, route, _) = proxy
        .request_upstream(request, client_ip(), &mut alloc)
        .unwrap();
    assert_eq!(
        text(&up),
        "PLAY rtsp://10.0.0.5:8554/test/ RTSP/1.0\r\n\
CSeq: 5\r\n\
Session: 8C1lTfu6ECTy5K4R\r\n\
Range: npt=0-\r\n\r\n"
    );
    let reply = b"RTSP/1.0 200 OK\r\n\
CSeq: 5\r\n\
RTP-Info: url=rtsp://10.0.0.5:8554/test/stream=0;seq=1;rtptime=0, url=rtsp://10.0.0.5:8554/test/stream=1;seq=1;rtptime=0\r\n\
Range: npt=now-\r\n\
Server: GStreamer RTSP server\r\n\
Session: 8C1lTfu6ECTy5K4R;timeout=60\r\n\
Date: Thu, 01 Jan 2026 00:00:00 GMT\r\n\r\n";
    let down = proxy
        .response_to_client(reply, route, None, &mut alloc)
        .unwrap();
    assert_eq!(
        text(&down),
        "RTSP/1.0 200 OK\r\n\
CSeq: 5\r\n\
RTP-Info: url=rtsp://192.168.1.1:554/cam1/stream=0;seq=1;rtptime=0, url=rtsp://192.168.1.1:554/cam1/stream=1;seq=1;rtptime=0\r\n\
Range: npt=now-\r\n\
Server: GStreamer RTSP server\r\n\
Session: 8C1lTfu6ECTy5K4R;timeout=60\r\n\
Date: Thu, 01 Jan 2026 00:00:00 GMT\r\n\r\n"
    );
}

#[test]
fn credentials_in_client_url_never_cross() {
    let proxy = Proxy::new();
    let request = b"OPTIONS rtsp://admin:hunter2@192.168.1.1:554/cam1 RTSP/1.0\r\nCSeq: 1\r\n\r\n";
    let (up, _, _) = proxy
        .request_upstream(request, client_ip(), &mut fake_allocator())
        .unwrap();
    assert_eq!(
        text(&up),
        "OPTIONS rtsp://10.0.0.5:8554/test RTSP/1.0\r\nCSeq: 1\r\n\r\n"
    );
}
