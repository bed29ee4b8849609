//! The strip action on the data path (`[media] validate = "strip"`, capture mode stack), on
//! the three-namespace bed with the real `vgate run`:
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
//! Needs root, iproute2, ffmpeg (with libx264) and ffprobe.

mod common;

use std::net::{SocketAddrV4, UdpSocket};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use common::admin::{get_in, metric};
use common::vgate::Vgate;
use common::{enter_netns, in_netns, prerequisites, Bed, BedConfig};

const CAM_PORT: u16 = 20000;
const PS_PORT: u16 = 20010;
const SINK_CAM: u16 = 40000;
const SINK_PS: u16 = 40001;
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

fn config(bed: &Bed) -> String {
    let mut s = bed.config(BedConfig {
        mode: "stack",
        ..Default::default()
    });
    s.push_str("per_stream_metrics = true\n[media]\nvalidate = \"strip\"\n");
    for (name, port, sink, egress, media) in [
        (
            "cam",
            CAM_PORT,
            SINK_CAM,
            30000,
            "{ codec = \"h264\", payload_types = [96] }",
        ),
        (
            "ps",
            PS_PORT,
            SINK_PS,
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

type Received = (Vec<Vec<u8>>, Vec<Vec<u8>>);

/// Keeps what arrives on the two sinks in B until `stop` and 500 ms of quiet.
fn sinks(bed: &Bed, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Received> {
    let (ns, ip) = (bed.get("B_NS").to_owned(), bed.ip("B_IP"));
    let (tx, rx) = mpsc::channel();
    let t = std::thread::spawn(move || {
        enter_netns(&ns).unwrap();
        let socks: Vec<UdpSocket> = [SINK_CAM, SINK_PS]
            .iter()
            .map(|p| {
                let s = UdpSocket::bind(SocketAddrV4::new(ip, *p)).unwrap();
                s.set_nonblocking(true).unwrap();
                s
            })
            .collect();
        tx.send(()).unwrap();
        let mut got: [Vec<Vec<u8>>; 2] = [Vec::new(), Vec::new()];
        let mut buf = [0u8; 2048];
        let mut quiet_since = Instant::now();
        loop {
            let mut any = false;
            for (i, s) in socks.iter().enumerate() {
                while let Ok(n) = s.recv(&mut buf) {
                    got[i].push(buf[..n].to_vec());
                    any = true;
                }
            }
            if any {
                quiet_since = Instant::now();
            } else if stop.load(Relaxed) && quiet_since.elapsed() > Duration::from_millis(500) {
                let [a, b] = got;
                return (a, b);
            } else {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(5))
        .expect("sinks bound");
    t
}

/// ffmpeg in A: 4 s (100 frames) of a test pattern, libx264 baseline, RTP to the cam route.
fn encoder(bed: &Bed) -> std::process::Child {
    let url = format!(
        "rtp://{}:{CAM_PORT}?localport=5004&pkt_size=1200",
        bed.get("GA_IP")
    );
    Command::new("ip")
        .args(["netns", "exec", bed.get("A_NS"), "ffmpeg"])
        .args(["-hide_banner", "-loglevel", "error", "-nostdin", "-re"])
        .args(["-f", "lavfi", "-i", "testsrc=size=320x240:rate=25"])
        .args([
            "-frames:v",
            "100",
            "-c:v",
            "libx264",
            "-profile:v",
            "baseline",
        ])
        .args(["-preset", "veryfast", "-g", "25", "-pix_fmt", "yuv420p"])
        .args(["-f", "rtp", &url])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ffmpeg")
}

/// The golden PS stream's packets (RFC 4571 records).
fn ps_fixture() -> Vec<Vec<u8>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/media/ffmpeg_ps_h264.rtp");
    let data = std::fs::read(path).unwrap();
    let mut out = Vec::new();
    let mut rest = &data[..];
    while !rest.is_empty() {
        let n = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
        out.push(rest[2..2 + n].to_vec());
        rest = &rest[2 + n..];
    }
    out
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

fn send_ps(bed: &Bed, pkts: Vec<Vec<u8>>) {
    let (a_ip, ga) = (bed.ip("A_IP"), bed.ip("GA_IP"));
    in_netns(bed.get("A_NS"), move || {
        let s = UdpSocket::bind(SocketAddrV4::new(a_ip, 5010)).unwrap();
        for p in &pkts {
            s.send_to(p, SocketAddrV4::new(ga, PS_PORT)).unwrap();
            std::thread::sleep(Duration::from_millis(5));
        }
    });
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
    let path = std::env::temp_dir().join(format!("vgate-strip-{}-{tag}", std::process::id()));
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

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn seq_continuous(pkts: &[Vec<u8>]) -> bool {
    pkts.windows(2).all(|w| {
        u16::from_be_bytes([w[1][2], w[1][3]])
            == u16::from_be_bytes([w[0][2], w[0][3]]).wrapping_add(1)
    })
}

#[test]
fn strip_cuts_covert_data_and_the_streams_still_decode_stack() {
    if !can_run("strip_cuts_covert_data_and_the_streams_still_decode_stack") {
        return;
    }
    let bed = Bed::up(1);
    let g_ns = bed.get("G_NS").to_owned();
    let vg = Vgate::start_with(&["ip", "netns", "exec", &g_ns], &config(&bed), &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let sink = sinks(&bed, Arc::clone(&stop));
    let enc = encoder(&bed);
    let (ps, marked, cut) = ps_with_private_data();
    let ps_sent = ps.len() as u64;
    assert!(marked >= 2, "frames with private data: {marked}");
    send_ps(&bed, ps);
    let out = enc.wait_with_output().expect("ffmpeg ran");
    assert!(
        out.status.success(),
        "ffmpeg failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stop.store(true, Relaxed);
    let (cam, ps_rx) = sink.join().unwrap();
    let metrics = get_in(&g_ns, "127.0.0.1:9940", "/metrics");
    let totals = vg.stop();

    // H.264: the banner is gone, the rest crossed whole and decodes.
    let cam_in = totals.route("cam", "rx_packets");
    let cam_away = totals.route("cam", "drop_media_stripped");
    let cam_stripped = metric(
        &metrics,
        "vgate_route_media_stripped_total",
        &["route=\"cam\"", "reason=\"sei_user_data\""],
    );
    println!(
        "cam: rx={cam_in} tx={} sink={} stripped={cam_stripped} away={cam_away}",
        totals.route("cam", "tx_packets"),
        cam.len()
    );
    assert!(cam_in >= 100, "the encoder's stream came: {cam_in}");
    assert_eq!(totals.route("cam", "drop_media_invalid"), 0, "{metrics}");
    assert!(
        cam_stripped >= 1,
        "the x264 banner was stripped:\n{metrics}"
    );
    assert_eq!(
        cam.len() as u64 + cam_away,
        cam_in,
        "every other packet arrived"
    );
    let all: Vec<u8> = cam.iter().flat_map(|p| p[12..].to_vec()).collect();
    assert!(!contains(&all, b"x264 - core"), "the banner reached B");
    assert!(seq_continuous(&cam), "the sequence has a gap");
    assert_eq!(frames(&annex_b(&cam), "h264", "cam.h264"), 100, "decodes");

    // PS: the private streams are gone, every packet crossed, the frames decode.
    let ps_stripped = metric(
        &metrics,
        "vgate_route_media_stripped_total",
        &["route=\"ps\"", "reason=\"ps_private_stream\""],
    );
    println!(
        "ps: sent={ps_sent} rx={} sink={} private stripped={ps_stripped}",
        totals.route("ps", "rx_packets"),
        ps_rx.len()
    );
    assert_eq!(totals.route("ps", "rx_packets"), ps_sent);
    assert_eq!(ps_rx.len() as u64, ps_sent, "every packet arrived");
    // A packet is counted once, by the first thing cut from it (ffmpeg's padding comes
    // before the private stream added at the end of a frame).
    let padding = metric(
        &metrics,
        "vgate_route_media_stripped_total",
        &["route=\"ps\"", "reason=\"ps_padding\""],
    );
    assert!(ps_stripped >= marked - padding && ps_stripped <= marked);
    assert_eq!(
        ps_stripped + padding,
        cut,
        "one strip per packet:\n{metrics}"
    );
    assert_eq!(totals.route("ps", "drop_media_invalid"), 0);
    let ps_out: Vec<u8> = ps_rx.iter().flat_map(|p| p[12..].to_vec()).collect();
    assert!(!contains(&ps_out, MARK), "marked private data reached B");
    assert!(seq_continuous(&ps_rx));
    let original: Vec<u8> = ps_fixture().iter().flat_map(|p| p[12..].to_vec()).collect();
    assert_eq!(
        frames(&ps_out, "mpeg", "ps.mpg"),
        frames(&original, "mpeg", "orig.mpg"),
        "the stripped PS decodes to the original's frames"
    );
    assert!(
        metric(
            &metrics,
            "vgate_media_stripped_bytes_total",
            &["channel=\"forward\""]
        ) >= marked * 306
    );
}
