//! A platform pulling many streams through the RTSP proxy from one address: 200 sessions
//! (DESCRIBE, SETUP over UDP, PLAY, each on its own connection, all from domain B's peer
//! address) of GStreamer's RTSP server in domain A (`tests/rtsp/server.py --shared`: one
//! pipeline for every session, 64x48 JPEG at 2 frames a second), each stream's RTP then
//! received by the test. Connections holding a session count toward
//! `max_sessions_per_source` (default 1024), not toward `max_connections_per_source`
//! (default 64): before that, the 65th stream was refused.

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use common::rtsp::{cam_event, can_run, request, simple_route, Rig, SERIAL};

/// Streams the platform pulls (bounded; one pipeline at the server).
const STREAMS: usize = 200;

/// One whole RTSP reply on `s` (head and body), within 10 s.
fn reply(s: &mut TcpStream) -> (String, String) {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            let len = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())
                        .flatten()
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                let body = String::from_utf8_lossy(&buf[end + 4..end + 4 + len]).into_owned();
                return (head, body);
            }
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return (String::from_utf8_lossy(&buf).into_owned(), String::new()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Sets up and plays stream `i` of `url` on a new connection; the connection and the
/// stream's RTP and RTCP sockets (on `me`).
fn pull(i: usize, url: &str, me: Ipv4Addr) -> (TcpStream, UdpSocket, UdpSocket) {
    let rtp_port = 41_000 + 2 * i as u16;
    let rtp =
        UdpSocket::bind((me, rtp_port)).unwrap_or_else(|e| panic!("bind {me}:{rtp_port}: {e}"));
    let rtcp = UdpSocket::bind((me, rtp_port + 1))
        .unwrap_or_else(|e| panic!("bind {me}:{}: {e}", rtp_port + 1));
    let gw: std::net::SocketAddr = url
        .strip_prefix("rtsp://")
        .and_then(|r| r.split('/').next())
        .and_then(|a| a.parse().ok())
        .expect("the gateway's address in the URL");
    let mut s = TcpStream::connect_timeout(&gw, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("stream {i}: connect {gw}: {e}"));
    s.write_all(request("DESCRIBE", url, 1, None, "Accept: application/sdp\r\n").as_bytes())
        .unwrap();
    let (head, sdp) = reply(&mut s);
    assert!(
        head.starts_with("RTSP/1.0 200"),
        "stream {i}: DESCRIBE: {head}"
    );
    let control = sdp
        .lines()
        .filter_map(|l| l.trim().strip_prefix("a=control:"))
        .find(|c| *c != "*")
        .unwrap_or_else(|| panic!("stream {i}: no track control in {sdp}"))
        .to_owned();
    let track = if control.starts_with("rtsp://") {
        control
    } else {
        format!("{url}/{control}")
    };
    let transport = format!(
        "Transport: RTP/AVP;unicast;client_port={rtp_port}-{}\r\n",
        rtp_port + 1
    );
    s.write_all(request("SETUP", &track, 2, None, &transport).as_bytes())
        .unwrap();
    let (head, _) = reply(&mut s);
    assert!(
        head.starts_with("RTSP/1.0 200"),
        "stream {i}: SETUP: {head}"
    );
    let session = head
        .lines()
        .find_map(|l| l.strip_prefix("Session: "))
        .map(|v| v.split(';').next().unwrap_or(v).trim().to_owned())
        .unwrap_or_else(|| panic!("stream {i}: no Session in {head}"));
    s.write_all(request("PLAY", url, 3, Some(&session), "").as_bytes())
        .unwrap();
    let (head, _) = reply(&mut s);
    assert!(head.starts_with("RTSP/1.0 200"), "stream {i}: PLAY: {head}");
    (s, rtp, rtcp)
}

#[test]
fn a_platform_pulls_200_streams_from_one_address() {
    if !can_run("a_platform_pulls_200_streams_from_one_address") {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // The limits' defaults: 64 connections without a session, 1024 with one, per source.
    let rig = Rig::up(
        &[
            "--shared", "--tracks", "1", "--fps", "2", "--width", "64", "--height", "48",
        ],
        &simple_route(""),
    );
    let url = rig.url(8554, "/cam1");
    let me: Ipv4Addr = rig.bed.get("B_IP").parse().unwrap();
    let b_ns = rig.bed.get("B_NS").to_owned();
    let (setup, silent) = common::in_netns(&b_ns, move || {
        let started = Instant::now();
        let mut streams = Vec::new();
        for i in 0..STREAMS {
            streams.push(pull(i, &url, me));
            assert!(
                started.elapsed() < Duration::from_secs(240),
                "only {i} streams set up in 4 minutes"
            );
        }
        let setup = started.elapsed();
        // Every stream carries its RTP (2 frames a second at the server).
        let silent: Vec<usize> = streams
            .iter()
            .enumerate()
            .filter(|(_, (_, rtp, _))| {
                rtp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let mut b = [0u8; 2048];
                !rtp.recv(&mut b).is_ok_and(|n| n >= 12 && b[0] >> 6 == 2)
            })
            .map(|(i, _)| i)
            .collect();
        drop(streams);
        (setup, silent)
    });
    assert!(
        silent.is_empty(),
        "{} of {STREAMS} streams carried no RTP: {silent:?}",
        silent.len()
    );
    assert_eq!(cam_event(&rig, "refused_per_source"), 0.0);
    assert_eq!(cam_event(&rig, "refused_sessions_per_source"), 0.0);
    assert_eq!(cam_event(&rig, "evicted_per_source"), 0.0);
    eprintln!("{STREAMS} streams from one address set up in {setup:?}");
}
