//! Media validation on the data path, on the three-namespace bed with the real `vgate run`,
//! in capture modes stack, tnapi and zc (`[media] validate = "enforce"`):
//!
//! - a real encoder's stream (ffmpeg from Debian: libx264 baseline, ffmpeg's RTP muxer) on
//!   a route declared `codec = "h264"` crosses whole: every packet the gateway received is
//!   forwarded and reaches the receiver, no violation counted;
//! - a stream of random bytes behind a valid RTP header (right payload type, sequence,
//!   timestamps, marker on every packet), from the same host in A, on a route declared
//!   `codec = "ps"` (a GB/T 28181 camera's) is dropped whole: nothing reaches the receiver,
//!   every packet is counted as `media_invalid` on the route, by reason in the metrics.
//!
//! Random bytes are sent on a PS route because a PS frame's structure covers every byte (pack
//! header, start codes, PES lengths): none can pass. On an H.264 route a random payload whose
//! first byte happens to be a slice NAL header passes, since slice data is opaque
//! (`tests/media_golden.rs` bounds that rate).
//!
//! Needs root, iproute2 and ffmpeg (with libx264).

mod common;

use std::time::Duration;

use common::admin::metric;
use common::media_bed::{self, Outcome};
use common::prerequisites;

const JUNK_PACKETS: u32 = 300;

fn can_run(test: &str) -> bool {
    prerequisites(test, true, &[("ip", "iproute2"), ("ffmpeg", "ffmpeg")])
}

/// Random bytes behind a valid RTP header (PT 96, one frame per packet).
fn junk() -> Vec<Vec<u8>> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    (0..JUNK_PACKETS)
        .map(|seq| {
            let mut p = vec![0x80, 0x80 | 96];
            p.extend_from_slice(&(seq as u16).to_be_bytes());
            p.extend_from_slice(&(seq * 3600).to_be_bytes());
            p.extend_from_slice(&0x1234_5678u32.to_be_bytes());
            for _ in 0..1200 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                p.push((x >> 32) as u8);
            }
            p
        })
        .collect()
}

fn run(mode: &str) {
    let m = media_bed::start(mode, "", "enforce", "junk");
    let enc = media_bed::encoder(&m.bed);
    media_bed::send_from_a(&m.bed, junk(), Duration::from_millis(10));
    let Outcome {
        received: (cam, junk),
        metrics,
        totals,
    } = m.finish(enc);
    let (cam_rx, junk_rx) = (cam.len() as u64, junk.len() as u64);

    let cam_in = totals.route("cam", "rx_packets");
    let cam_out = totals.route("cam", "tx_packets");
    println!(
        "mode {mode}: cam rx={cam_in} tx={cam_out} sink={cam_rx}; junk sent={JUNK_PACKETS} rx={} dropped={} sink={junk_rx}",
        totals.route("junk", "rx_packets"),
        totals.route("junk", "drop_media_invalid"),
    );
    assert!(
        cam_in >= 100,
        "mode {mode}: the encoder's stream came: {cam_in}"
    );
    assert_eq!(
        cam_out, cam_in,
        "mode {mode}: every encoder packet forwarded"
    );
    assert_eq!(cam_rx, cam_in, "mode {mode}: and received in B");
    assert_eq!(totals.route("cam", "drop_media_invalid"), 0, "mode {mode}");
    assert_eq!(
        metric(
            &metrics,
            "vgate_route_media_invalid_total",
            &["route=\"cam\""]
        ),
        0,
        "mode {mode}: no violation on the real stream:\n{metrics}"
    );

    assert_eq!(junk_rx, 0, "mode {mode}: no random payload reached B");
    assert_eq!(
        totals.route("junk", "rx_packets"),
        u64::from(JUNK_PACKETS),
        "mode {mode}"
    );
    assert_eq!(
        totals.route("junk", "drop_media_invalid"),
        u64::from(JUNK_PACKETS),
        "mode {mode}: every one dropped as media_invalid"
    );
    assert_eq!(totals.route("junk", "tx_packets"), 0, "mode {mode}");
    let by_reason = metric(
        &metrics,
        "vgate_route_media_invalid_total",
        &["route=\"junk\""],
    );
    assert_eq!(
        by_reason,
        u64::from(JUNK_PACKETS),
        "mode {mode}: one reason each:\n{metrics}"
    );
    assert_eq!(
        metric(
            &metrics,
            "vgate_media_invalid_total",
            &["channel=\"forward\""]
        ),
        u64::from(JUNK_PACKETS),
        "mode {mode}: the channel's totals"
    );
}

#[test]
fn real_encoder_crosses_and_random_payload_is_dropped_stack() {
    if can_run("real_encoder_crosses_and_random_payload_is_dropped_stack") {
        run("stack");
    }
}

#[test]
fn real_encoder_crosses_and_random_payload_is_dropped_tnapi() {
    if can_run("real_encoder_crosses_and_random_payload_is_dropped_tnapi") {
        run("tnapi");
    }
}

#[test]
fn real_encoder_crosses_and_random_payload_is_dropped_zc() {
    if can_run("real_encoder_crosses_and_random_payload_is_dropped_zc") {
        run("zc");
    }
}
