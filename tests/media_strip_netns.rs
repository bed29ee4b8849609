//! The strip action on the data path (`[media] validate = "strip"`), on the three-namespace
//! bed with the real `vgate run` (`common::media_bed`), in capture modes stack (the
//! `recvmmsg` buffers rewritten), tnapi (the AF_PACKET ring block), zc (the AF_XDP UMEM
//! frame) and xdp (a validated route stays on the AF_XDP path):
//!
//! - a real encoder (ffmpeg from Debian: libx264 baseline, ffmpeg's RTP muxer) on an H.264
//!   route: its version banner (SEI user data) is cut out, every other byte crosses, the
//!   sequence arrives without a gap, and the stream received in B decodes (ffprobe counts
//!   the frames the encoder sent);
//! - a GB/T 28181 PS stream (ffmpeg's PS muxer, packetised as cameras do:
//!   `tests/golden/media/ffmpeg_ps_h264.rtp`) replayed from A with a private stream (0xBD)
//!   full of marked data added to frames: none of the marked bytes reaches B, every packet
//!   does, the counters say exactly how many were stripped and why, and the PS received in
//!   B decodes to as many frames as the original.
//!
//! - on a split appliance (`common::split`, modes stack, tnapi, zc), half A, which receives
//!   the PS stream from domain A, strips it (or, with `enforce`, drops what carries data)
//!   before its one-way link; half B validates what the link hands it and finds nothing to
//!   refuse; the viewer in domain B gets no marked byte.
//!
//! Needs root, iproute2, nftables (the split bed), ffmpeg (with libx264) and ffprobe.

mod common;

#[path = "common/media_corpus.rs"]
mod media_corpus;

use std::process::Command;
use std::time::Duration;

use common::admin::metric;
use common::media_bed::{self, Outcome, ENCODER_FRAMES};
use common::prerequisites;
use common::split::{half_config_mode, route, start_half, SplitBed, FACE_A, FACE_B};

const MARK: &[u8] = b"COVERT-DATA-";

fn can_run(test: &str) -> bool {
    prerequisites(
        test,
        true,
        &[
            ("ip", "iproute2"),
            ("ffmpeg", "ffmpeg"),
            ("ffprobe", "ffmpeg"),
        ],
    )
}

/// The golden PS stream's packets.
fn ps_fixture() -> Vec<Vec<u8>> {
    media_corpus::fixture("ffmpeg_ps_h264").packets
}

/// A private stream 1 PES (0xBD) of `n` bytes of marked data.
fn private_pes(n: usize) -> Vec<u8> {
    let mut v = vec![0, 0, 1, 0xbd];
    v.extend_from_slice(&(n as u16).to_be_bytes());
    v.extend(MARK.iter().cycle().take(n));
    v
}

/// The PS replay with a private stream at the end of each frame's last packet (after the
/// frame's last PES, where a unit may start), while it fits 1400 bytes; returns the packets
/// and how many carry one, and how many carry a unit the strip action cuts (a private stream
/// or ffmpeg's padding).
fn ps_with_private_data() -> (Vec<Vec<u8>>, u64, u64) {
    let (mut n, mut cut) = (0, 0);
    let pkts = ps_fixture()
        .into_iter()
        .map(|mut p| {
            let padded = contains(&p[12..], &[0, 0, 1, 0xbe]);
            let marked = p[1] & 0x80 != 0 && p.len() + 306 <= 1400;
            if marked {
                p.extend_from_slice(&private_pes(300));
                n += 1;
            }
            cut += u64::from(marked || padded);
            p
        })
        .collect();
    (pkts, n, cut)
}

/// RFC 6184 (single NAL units, STAP-A, FU-A) to an Annex B byte stream.
fn annex_b(pkts: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in pkts {
        let pl = &p[12..];
        match pl[0] & 0x1f {
            24 => {
                let mut r = &pl[1..];
                while r.len() >= 2 {
                    let n = usize::from(u16::from_be_bytes([r[0], r[1]]));
                    out.extend_from_slice(&[0, 0, 0, 1]);
                    out.extend_from_slice(&r[2..2 + n]);
                    r = &r[2 + n..];
                }
            }
            28 => {
                if pl[1] & 0x80 != 0 {
                    out.extend_from_slice(&[0, 0, 0, 1, (pl[0] & 0xe0) | (pl[1] & 0x1f)]);
                }
                out.extend_from_slice(&pl[2..]);
            }
            _ => {
                out.extend_from_slice(&[0, 0, 0, 1]);
                out.extend_from_slice(pl);
            }
        }
    }
    out
}

/// Frames ffprobe decodes from `data` (format `fmt`).
fn frames(data: &[u8], fmt: &str, tag: &str) -> u64 {
    // One file per call: the tests of several modes may probe at the same time.
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("vgate-strip-{}-{n}-{tag}", std::process::id()));
    std::fs::write(&path, data).unwrap();
    let out = Command::new("ffprobe")
        .args([
            "-v",
            "error",
            "-f",
            fmt,
            "-count_frames",
            "-select_streams",
            "v:0",
        ])
        .args(["-show_entries", "stream=nb_read_frames", "-of", "csv=p=0"])
        .arg(&path)
        .output()
        .expect("run ffprobe");
    let _ = std::fs::remove_file(&path);
    let s = String::from_utf8_lossy(&out.stdout);
    s.trim()
        .trim_end_matches(',')
        .parse()
        .unwrap_or_else(|_| panic!("ffprobe: {s} {}", String::from_utf8_lossy(&out.stderr)))
}

/// SEI NAL units carrying user data (payload type 4 or 5 first) in an Annex B stream.
fn sei_user_data(annex_b: &[u8]) -> usize {
    annex_b
        .windows(5)
        .filter(|w| w[..3] == [0, 0, 1] && w[3] & 0x1f == 6 && matches!(w[4], 4 | 5))
        .count()
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn seq_continuous(pkts: &[Vec<u8>]) -> bool {
    pkts.windows(2).all(|w| {
        u16::from_be_bytes([w[1][2], w[1][3]])
            == u16::from_be_bytes([w[0][2], w[0][3]]).wrapping_add(1)
    })
}

fn run(mode: &str) {
    run_with(mode, "");
}

/// [`run`] with the `[engine]` lines `engine`.
fn run_with(mode: &str, engine: &str) {
    let m = media_bed::start(mode, engine, "strip", "ps");
    let enc = media_bed::encoder(&m.bed);
    let (ps, marked, cut) = ps_with_private_data();
    let ps_sent = ps.len() as u64;
    assert!(marked >= 2, "frames with private data: {marked}");
    media_bed::send_from_a(&m.bed, ps, Duration::from_millis(5));
    let Outcome {
        received: (cam, ps_rx),
        metrics,
        totals,
    } = m.finish(enc);

    // H.264: the banner is gone, the rest crossed whole and decodes.
    let cam_in = totals.route("cam", "rx_packets");
    let cam_away = totals.route("cam", "drop_media_stripped");
    let cam_stripped = metric(
        &metrics,
        "vgate_route_media_stripped_total",
        &["route=\"cam\"", "reason=\"sei_user_data\""],
    );
    println!(
        "mode {mode}: cam rx={cam_in} tx={} sink={} stripped={cam_stripped} away={cam_away}",
        totals.route("cam", "tx_packets"),
        cam.len()
    );
    assert!(
        cam_in >= 100,
        "mode {mode}: the encoder's stream came: {cam_in}"
    );
    assert_eq!(
        totals.route("cam", "drop_media_invalid"),
        0,
        "mode {mode}:\n{metrics}"
    );
    assert!(
        cam_stripped >= 1,
        "mode {mode}: the x264 banner was stripped:\n{metrics}"
    );
    assert_eq!(
        totals.route("cam", "tx_packets") + cam_away,
        cam_in,
        "mode {mode}: every other packet was sent"
    );
    assert_eq!(
        cam.len() as u64 + cam_away,
        cam_in,
        "mode {mode}: and arrived"
    );
    let all: Vec<u8> = cam.iter().flat_map(|p| p[12..].to_vec()).collect();
    assert!(
        !contains(&all, b"x264 - core"),
        "mode {mode}: the banner reached B"
    );
    let stream = annex_b(&cam);
    assert_eq!(
        sei_user_data(&stream),
        0,
        "mode {mode}: SEI user data reached B"
    );
    assert!(seq_continuous(&cam), "mode {mode}: the sequence has a gap");
    assert_eq!(
        frames(&stream, "h264", &format!("{mode}-cam.h264")),
        ENCODER_FRAMES,
        "mode {mode}: decodes"
    );

    // PS: the private streams are gone, every packet crossed, the frames decode.
    let ps_stripped = metric(
        &metrics,
        "vgate_route_media_stripped_total",
        &["route=\"ps\"", "reason=\"ps_private_stream\""],
    );
    println!(
        "mode {mode}: ps sent={ps_sent} rx={} sink={} private stripped={ps_stripped}",
        totals.route("ps", "rx_packets"),
        ps_rx.len()
    );
    assert_eq!(totals.route("ps", "rx_packets"), ps_sent, "mode {mode}");
    assert_eq!(totals.route("ps", "tx_packets"), ps_sent, "mode {mode}");
    assert_eq!(
        ps_rx.len() as u64,
        ps_sent,
        "mode {mode}: every packet arrived"
    );
    // A packet is counted once, by the first thing cut from it (ffmpeg's padding comes
    // before the private stream added at the end of a frame).
    let padding = metric(
        &metrics,
        "vgate_route_media_stripped_total",
        &["route=\"ps\"", "reason=\"ps_padding\""],
    );
    assert!(
        ps_stripped >= marked - padding && ps_stripped <= marked,
        "mode {mode}"
    );
    assert_eq!(
        ps_stripped + padding,
        cut,
        "mode {mode}: one strip per packet:\n{metrics}"
    );
    assert_eq!(totals.route("ps", "drop_media_invalid"), 0, "mode {mode}");
    let ps_out: Vec<u8> = ps_rx.iter().flat_map(|p| p[12..].to_vec()).collect();
    assert!(
        !contains(&ps_out, MARK),
        "mode {mode}: marked private data reached B"
    );
    assert!(
        !contains(&ps_out, &[0, 0, 1, 0xbd]) && !contains(&ps_out, &[0, 0, 1, 0xbf]),
        "mode {mode}: a private stream reached B"
    );
    assert!(seq_continuous(&ps_rx), "mode {mode}");
    let original: Vec<u8> = ps_fixture().iter().flat_map(|p| p[12..].to_vec()).collect();
    assert_eq!(
        frames(&ps_out, "mpeg", &format!("{mode}-ps.mpg")),
        frames(&original, "mpeg", &format!("{mode}-orig.mpg")),
        "mode {mode}: the stripped PS decodes to the original's frames"
    );
    assert!(
        metric(
            &metrics,
            "vgate_media_stripped_bytes_total",
            &["channel=\"forward\""]
        ) >= marked * 306,
        "mode {mode}"
    );
}

#[test]
fn strip_cuts_covert_data_and_the_streams_still_decode_stack() {
    if can_run("strip_cuts_covert_data_and_the_streams_still_decode_stack") {
        run("stack");
    }
}

#[test]
fn strip_cuts_covert_data_and_the_streams_still_decode_tnapi() {
    if can_run("strip_cuts_covert_data_and_the_streams_still_decode_tnapi") {
        run("tnapi");
    }
}

/// The V3 ring: blocks of several frames, each rewritten in place without touching the next.
#[test]
fn strip_cuts_covert_data_and_the_streams_still_decode_tnapi_v3() {
    if can_run("strip_cuts_covert_data_and_the_streams_still_decode_tnapi_v3") {
        run_with("tnapi", "[engine.tnapi]\nring = \"v3\"\n");
    }
}

#[test]
fn strip_cuts_covert_data_and_the_streams_still_decode_zc() {
    if can_run("strip_cuts_covert_data_and_the_streams_still_decode_zc") {
        run("zc");
    }
}

/// Mode xdp: a route that validates its media never takes the in-kernel fast path, so
/// its packets are stripped on the AF_XDP path as in mode zc.
#[test]
fn strip_cuts_covert_data_and_the_streams_still_decode_xdp() {
    if can_run("strip_cuts_covert_data_and_the_streams_still_decode_xdp") {
        run("xdp");
    }
}

/// Half A (domain A's PS camera on port 20000 -> half B's face at 21000) and half B (the link
/// -> the viewer at `DB_IP:6000`) in `mode`, both validating the route as PS with `validate`
/// on half A and `enforce` on half B. Sends the PS replay with private data from domain A and
/// returns what the viewer received, the marked and cut counts, and both halves' totals and
/// metrics.
fn split_run(mode: &str, validate: &str) -> SplitOutcome {
    let bed = SplitBed::up();
    let media = "media = { codec = \"ps\", payload_types = [96] }\n";
    let (da, db) = (bed.get("DA_IP"), bed.get("DB_IP"));
    let routes_a = route(
        "ps",
        "a",
        20000,
        &format!("{FACE_B}:21000"),
        30000,
        &format!("{da}:5000"),
    ) + media;
    let routes_b = route(
        "ps",
        "a",
        21000,
        &format!("{db}:6000"),
        30000,
        &format!("{FACE_A}:30000"),
    ) + media;
    let with_media = |v: &str, routes: &str| format!("[media]\nvalidate = \"{v}\"\n{routes}");
    let a = start_half(
        &bed,
        "a",
        &half_config_mode(
            &bed,
            "a",
            mode,
            "off",
            "off",
            &with_media(validate, &routes_a),
        ),
    );
    let b = start_half(
        &bed,
        "b",
        &half_config_mode(
            &bed,
            "b",
            mode,
            "off",
            "off",
            &with_media("enforce", &routes_b),
        ),
    );
    let (ps, marked, cut) = ps_with_private_data();
    let sent = ps.len() as u64;
    // The viewer keeps every datagram until 2 s after the last one (or 60 s in all).
    let (db_ns, db_ip) = (bed.get("DB_NS").to_owned(), bed.ip("DB_IP"));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let viewer = std::thread::spawn(move || {
        common::enter_netns(&db_ns).unwrap();
        let s = std::net::UdpSocket::bind(std::net::SocketAddrV4::new(db_ip, 6000)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        ready_tx.send(()).unwrap();
        let (mut got, mut buf) = (Vec::new(), [0u8; 2048]);
        let start = std::time::Instant::now();
        let mut idle = 0;
        while start.elapsed() < Duration::from_secs(60) && got.len() < sent as usize {
            match s.recv(&mut buf) {
                Ok(n) => {
                    got.push(buf[..n].to_vec());
                    idle = 0;
                }
                // Quiet for 2 s after the first arrival, or for 20 s before it.
                Err(_) if got.is_empty() && idle < 10 => idle += 1,
                Err(_) => break,
            }
        }
        got
    });
    ready_rx.recv().unwrap();
    let (da_ns, da_ip, ga) = (
        bed.get("DA_NS").to_owned(),
        bed.ip("DA_IP"),
        bed.ip("GA_IP"),
    );
    common::in_netns(&da_ns, move || {
        let s = std::net::UdpSocket::bind(std::net::SocketAddrV4::new(da_ip, 5000)).unwrap();
        for p in &ps {
            s.send_to(p, std::net::SocketAddrV4::new(ga, 20000))
                .unwrap();
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    let received = viewer.join().unwrap();
    let metrics_a = common::split::admin_get(&bed, "a", "/metrics");
    let metrics_b = common::split::admin_get(&bed, "b", "/metrics");
    SplitOutcome {
        received,
        sent,
        marked,
        cut,
        a: a.stop(),
        b: b.stop(),
        metrics_a,
        metrics_b,
    }
}

struct SplitOutcome {
    received: Vec<Vec<u8>>,
    sent: u64,
    marked: u64,
    cut: u64,
    a: common::vgate::Totals,
    b: common::vgate::Totals,
    metrics_a: String,
    metrics_b: String,
}

/// Half A strips before its link; half B, validating what the link hands it, refuses nothing.
fn split_strip(mode: &str) {
    let o = split_run(mode, "strip");
    let stripped = |reason: &str| {
        metric(
            &o.metrics_a,
            "vgate_route_media_stripped_total",
            &["route=\"ps\"", &format!("reason=\"{reason}\"")],
        )
    };
    let (private, padding) = (stripped("ps_private_stream"), stripped("ps_padding"));
    println!(
        "split {mode} strip: sent={} viewer={} marked={} cut={} private={private} padding={padding}",
        o.sent,
        o.received.len(),
        o.marked,
        o.cut
    );
    assert!(o.marked >= 2, "frames with private data: {}", o.marked);
    assert_eq!(o.a.route("ps", "rx_packets"), o.sent, "half A took all in");
    assert_eq!(
        private + padding,
        o.cut,
        "half A: one strip per packet:\n{}",
        o.metrics_a
    );
    assert_eq!(o.a.route("ps", "drop_media_invalid"), 0, "{}", o.a.raw);
    assert_eq!(o.a.route("ps", "tx_packets"), o.sent, "{}", o.a.raw);
    assert_eq!(o.b.route("ps", "tx_packets"), o.sent, "{}", o.b.raw);
    assert_eq!(
        o.b.route("ps", "drop_media_invalid"),
        0,
        "half B found nothing to refuse:\n{}",
        o.metrics_b
    );
    assert_eq!(
        o.received.len() as u64,
        o.sent,
        "every packet reached the viewer"
    );
    let out: Vec<u8> = o.received.iter().flat_map(|p| p[12..].to_vec()).collect();
    assert!(
        !contains(&out, MARK),
        "marked private data reached domain B"
    );
    assert!(
        !contains(&out, &[0, 0, 1, 0xbd]) && !contains(&out, &[0, 0, 1, 0xbf]),
        "a private stream reached domain B"
    );
    assert!(seq_continuous(&o.received), "the sequence has a gap");
    let original: Vec<u8> = ps_fixture().iter().flat_map(|p| p[12..].to_vec()).collect();
    assert_eq!(
        frames(&out, "mpeg", &format!("split-{mode}-ps.mpg")),
        frames(&original, "mpeg", &format!("split-{mode}-orig.mpg")),
        "the stripped PS decodes to the original's frames"
    );
}

/// With `enforce` on half A, every packet that carries a private stream is dropped there,
/// before the link, counted by reason; the rest crosses and half B refuses nothing.
fn split_enforce(mode: &str) {
    let o = split_run(mode, "enforce");
    let private = metric(
        &o.metrics_a,
        "vgate_route_media_invalid_total",
        &["route=\"ps\"", "reason=\"ps_private_stream\""],
    );
    let invalid = o.a.route("ps", "drop_media_invalid");
    println!(
        "split {mode} enforce: sent={} viewer={} marked={} private={private} invalid={invalid}",
        o.sent,
        o.received.len(),
        o.marked
    );
    assert!(o.marked >= 2, "frames with private data: {}", o.marked);
    assert_eq!(o.a.route("ps", "rx_packets"), o.sent);
    assert_eq!(
        private, o.marked,
        "half A refused each marked packet as a private stream:\n{}",
        o.metrics_a
    );
    assert_eq!(invalid, o.marked, "and nothing else:\n{}", o.metrics_a);
    assert_eq!(o.a.route("ps", "tx_packets"), o.sent - o.marked);
    assert_eq!(o.b.route("ps", "drop_media_invalid"), 0, "{}", o.metrics_b);
    assert_eq!(
        o.received.len() as u64,
        o.sent - o.marked,
        "the rest crossed"
    );
    let out: Vec<u8> = o.received.iter().flat_map(|p| p[12..].to_vec()).collect();
    assert!(
        !contains(&out, MARK),
        "marked private data reached domain B"
    );
}

fn split_ready(test: &str) -> bool {
    can_run(test) && prerequisites(test, true, &[("nft", "nftables")])
}

tests_of!(split_strip, if split_ready;
    /// Stack mode: half A strips in its `recvmmsg` buffers before the link.
    split_half_strips_before_its_link_stack => ("stack"),
    /// Mode tnapi: half A strips in its AF_PACKET ring block.
    split_half_strips_before_its_link_tnapi => ("tnapi"),
    /// Mode zc: half A strips in its UMEM frame.
    split_half_strips_before_its_link_zc => ("zc"),
);

tests_of!(split_enforce, if split_ready;
    split_half_refuses_before_its_link_stack => ("stack"),
    split_half_refuses_before_its_link_tnapi => ("tnapi"),
    split_half_refuses_before_its_link_zc => ("zc"),
);
