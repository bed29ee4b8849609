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

use std::net::{SocketAddrV4, UdpSocket};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use common::admin::{get_in, metric};
use common::vgate::Vgate;
use common::{enter_netns, in_netns, prerequisites, Bed, BedConfig};

const CAM_PORT: u16 = 20000;
const JUNK_PORT: u16 = 20010;
const SINK_CAM: u16 = 40000;
const SINK_JUNK: u16 = 40001;
const JUNK_PACKETS: u32 = 300;

fn can_run(test: &str) -> bool {
    prerequisites(test, true, &[("ip", "iproute2"), ("ffmpeg", "ffmpeg")])
}

fn config(bed: &Bed, mode: &str) -> String {
    let mut s = bed.config(BedConfig {
        mode,
        ..Default::default()
    });
    s.push_str("per_stream_metrics = true\n[media]\nvalidate = \"enforce\"\n");
    for (name, port, sink, egress, media) in [
        (
            "cam",
            CAM_PORT,
            SINK_CAM,
            30000,
            "{ codec = \"h264\", payload_types = [96] }",
        ),
        (
            "junk",
            JUNK_PORT,
            SINK_JUNK,
            30010,
            "{ codec = \"ps\", payload_types = [96] }",
        ),
    ] {
        s.push_str(&format!(
            "[[stream_route]]\nname = \"{name}\"\ndomain = \"a\"\nport = {port}\ndestination = \"{}:{sink}\"\negress_port = {egress}\nexpect_source = \"{}:0\"\nmedia = {media}\n",
            bed.get("B_IP"),
            bed.get("A_IP"),
        ));
    }
    s
}

/// Counts what arrives on the two sinks in B until `stop` and 500 ms of quiet.
fn sinks(bed: &Bed, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<(u64, u64)> {
    let (ns, ip) = (bed.get("B_NS").to_owned(), bed.ip("B_IP"));
    let (tx, rx) = mpsc::channel();
    let t = std::thread::spawn(move || {
        enter_netns(&ns).unwrap();
        let socks: Vec<UdpSocket> = [SINK_CAM, SINK_JUNK]
            .iter()
            .map(|p| {
                let s = UdpSocket::bind(SocketAddrV4::new(ip, *p)).unwrap();
                s.set_nonblocking(true).unwrap();
                s
            })
            .collect();
        tx.send(()).unwrap();
        let mut got = [0u64; 2];
        let mut buf = [0u8; 2048];
        let mut quiet_since = Instant::now();
        loop {
            let mut any = false;
            for (i, s) in socks.iter().enumerate() {
                while s.recv(&mut buf).is_ok() {
                    got[i] += 1;
                    any = true;
                }
            }
            if any {
                quiet_since = Instant::now();
            } else if stop.load(Relaxed) && quiet_since.elapsed() > Duration::from_millis(500) {
                return (got[0], got[1]);
            } else {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(5))
        .expect("sinks bound");
    t
}

/// Random bytes behind a valid RTP header (PT 96, one frame per packet), 10 ms apart.
fn junk(bed: &Bed) {
    let (a_ip, ga) = (bed.ip("A_IP"), bed.ip("GA_IP"));
    in_netns(bed.get("A_NS"), move || {
        let s = UdpSocket::bind(SocketAddrV4::new(a_ip, 5010)).unwrap();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for seq in 0..JUNK_PACKETS {
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
            s.send_to(&p, SocketAddrV4::new(ga, JUNK_PORT)).unwrap();
            std::thread::sleep(Duration::from_millis(10));
        }
    });
}

/// ffmpeg in A: 4 s of a test pattern, libx264 baseline, RTP to the cam route.
fn encoder(bed: &Bed) -> std::process::Child {
    let url = format!(
        "rtp://{}:{CAM_PORT}?localport=5004&pkt_size=1200",
        bed.get("GA_IP")
    );
    Command::new("ip")
        .args(["netns", "exec", bed.get("A_NS"), "ffmpeg"])
        .args(["-hide_banner", "-loglevel", "error", "-nostdin", "-re"])
        .args([
            "-f",
            "lavfi",
            "-i",
            "testsrc=size=320x240:rate=25",
            "-t",
            "4",
        ])
        .args([
            "-c:v",
            "libx264",
            "-profile:v",
            "baseline",
            "-preset",
            "veryfast",
        ])
        .args(["-g", "25", "-pix_fmt", "yuv420p", "-f", "rtp", &url])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ffmpeg")
}

/// The modes take turns (one bed and one encoder at a time) on a shared machine.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn run(mode: &str) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let bed = Bed::up(1);
    let g_ns = bed.get("G_NS").to_owned();
    let vg = Vgate::start_with(&["ip", "netns", "exec", &g_ns], &config(&bed, mode), &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let sink = sinks(&bed, Arc::clone(&stop));
    let enc = encoder(&bed);
    junk(&bed);
    let out = enc.wait_with_output().expect("ffmpeg ran");
    assert!(
        out.status.success(),
        "ffmpeg failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stop.store(true, Relaxed);
    let (cam_rx, junk_rx) = sink.join().unwrap();
    let metrics = get_in(&g_ns, "127.0.0.1:9940", "/metrics");
    let totals = vg.stop();

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
