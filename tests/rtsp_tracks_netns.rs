//! RTSP sessions with more than one track through vgate, with real peers on the
//! three-namespace bed (issue 26): GStreamer's RTSP server (`tests/rtsp/server.py`) in
//! domain A restricted to one lower transport and fixing a session's transport at its first
//! SETUP (`--fixed-transport`, like a widely deployed media server: a second SETUP of one
//! track closes the connection), serving two and three tracks (JPEG video, PCMU and PCMA
//! audio), or taking pushed video and audio (`--record --tracks 2`); ffmpeg in domain B over
//! UDP and interleaved. Every track decodes (ffmpeg's frames per stream, the server's decoded
//! frames and audio buffers), bridged both ways and not, no track is set up twice, one
//! bridge leg per bridged track, and every session gives back all its routes and ports.
//!
//! Needs root, iproute2, ffmpeg, and GStreamer's RTSP server for Debian's /usr/bin/python3
//! (python3-gi gir1.2-gst-rtsp-server-1.0 gstreamer1.0-plugins-base
//! gstreamer1.0-plugins-good). Under `CI=true` a missing one fails the test.

mod common;

use std::time::Duration;

use common::rtsp::*;

/// The server saw no track set up twice.
fn no_track_set_up_twice(rig: &Rig, what: &str) {
    let out = rig.server_out.lock().unwrap().clone();
    assert!(
        !out.contains("TWICE"),
        "{what}: a track set up twice: {out}"
    );
}

/// A server that fixes a connection's lower transport at its first SETUP (`--fixed-transport`:
/// a later track asked over the other one is answered with the fixed one or refused, and a
/// second SETUP of a track closes the connection), restricted to one transport, serving two
/// and three tracks; clients over UDP and interleaved: every track decodes, bridged or not,
/// no track is set up twice, and each session gives back every port.
#[test]
fn multi_track_sessions_bridge_every_track() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if !can_run("multi_track_sessions_bridge_every_track") {
        return;
    }
    let mut rig = Rig::up(
        &["--udp-only", "--fixed-transport", "--tracks", "2"],
        &simple_route(""),
    );
    let b = rig.bed.get("B_NS").to_string();
    let mut sessions = 0;
    let mut bridged = 0;
    for serves in ["udp", "tcp"] {
        for tracks in [2usize, 3] {
            rig.server = None;
            rig.server_out.lock().unwrap().clear();
            rig.start_server(&[
                &format!("--{serves}-only"),
                "--fixed-transport",
                "--tracks",
                &tracks.to_string(),
            ]);
            for asks in ["udp", "tcp"] {
                let what = format!("{tracks} tracks, server {serves} only, client {asks}");
                let legs0 = cam_event(&rig, "bridge_legs");
                let p = ffmpeg(
                    &b,
                    &rig.url(8554, "/cam1"),
                    asks,
                    50,
                    rig.dir.path(),
                    &format!("tracks{tracks}-{serves}-{asks}"),
                );
                assert!(p.ok, "{what}: ffmpeg failed; errors: {:?}", p.errors);
                assert!(p.errors.is_empty(), "{what}: ffmpeg errors: {:?}", p.errors);
                assert!(
                    p.frames[0] >= 50,
                    "{what}: only {} video frames",
                    p.frames[0]
                );
                for (i, n) in p.frames.iter().enumerate().take(tracks).skip(1) {
                    assert!(*n >= 3, "{what}: only {n} frames of audio track {i}");
                }
                assert_no_a_address(&rig, &p.trace, &what);
                no_track_set_up_twice(&rig, &what);
                sessions += 1;
                rig.wait_ended("session ended (teardown)", sessions, 10);
                if serves != asks {
                    // One leg per track.
                    let legs = wait_event(&rig, "bridge_legs", legs0 + tracks as f64) - legs0;
                    assert_eq!(legs, tracks as f64, "{what}: bridge legs");
                    bridged += tracks;
                }
            }
        }
    }
    assert_eq!(cam_event(&rig, "bridge_legs"), bridged as f64);
    assert_eq!(cam_event(&rig, "bridge_refused"), 0.0);
    rig.stop_with_no_route_left();
}

/// Pushes (ANNOUNCE, two or three SETUPs with `mode=record`, RECORD) of video and one or two
/// audio tracks to a RECORD server that fixes the lower transport at the first SETUP,
/// restricted to one transport; the client over UDP and interleaved: the server decodes
/// every track, no track is set up twice, every port comes back.
#[test]
fn multi_track_pushes_bridge_every_track() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if !can_run("multi_track_pushes_bridge_every_track") {
        return;
    }
    let mut rig = Rig::up_with(None, &simple_route(""));
    let b = rig.bed.get("B_NS").to_string();
    let url = rig.url(8554, "/cam1");
    let mut sessions = 0;
    for (serves, pushes, tracks) in [
        ("udp", "udp", 2usize),
        ("udp", "tcp", 2),
        ("tcp", "udp", 2),
        ("tcp", "tcp", 2),
        ("udp", "tcp", 3),
        ("tcp", "udp", 3),
    ] {
        {
            rig.server = None;
            rig.server_out.lock().unwrap().clear();
            rig.start_server(&[
                "--record",
                &format!("--{serves}-only"),
                "--fixed-transport",
                "--tracks",
                &tracks.to_string(),
            ]);
            let what = format!(
                "push video + {} audio {pushes}, server takes {serves} only",
                tracks - 1
            );
            let (ok, err) = ffmpeg_push_tracks(&b, &url, pushes, 4, tracks - 1);
            assert!(ok, "{what}: ffmpeg push failed: {err}");
            // 40 frames sent at 10 fps; the last second may still be on its way.
            let frames = rig.wait_frames(30, Duration::from_secs(5));
            assert!(
                frames >= 30,
                "{what}: the server decoded {frames} of 40 frames"
            );
            let audio = rig.server_count("AUDIO ");
            assert!(
                audio >= 10,
                "{what}: the server decoded {audio} audio buffers"
            );
            if tracks >= 3 {
                let audio2 = rig.server_count("AUDIO2 ");
                assert!(
                    audio2 >= 10,
                    "{what}: the server decoded {audio2} buffers of the second audio track"
                );
            }
            no_track_set_up_twice(&rig, &what);
            sessions += 1;
            rig.wait_ended("session ended (teardown)", sessions, 10);
        }
    }
    assert_eq!(cam_event(&rig, "bridge_refused"), 0.0);
    rig.stop_with_no_route_left();
}
