//! `vgate capture-refused` against the real `vgate run` on loopback (mode stack, media
//! validation `enforce` on an H.264 route):
//!
//! - covert packets (random bytes behind a valid RTP header, each byte's top bit set so the
//!   first is never a valid NAL header) interleaved with valid frames: the pcap file holds
//!   exactly the first N covert packets, byte for byte, with their real source and the
//!   gateway address and port they arrived on, and none of the valid ones (which all crossed);
//!   the listing names the validator's reason; the capture metrics count them;
//! - valid RTP from a host of domain A that is not the route's source: captured as
//!   `source_mismatch`, named by the route's name;
//! - arming an unknown route, or a second capture while one runs, fails with the reason.
//!
//! The pcap file is read twice: with `vgate::wire::pcap::records` (whose frames must parse
//! with correct IPv4 and UDP checksums) and, independently, with scapy's `rdpcap` when
//! python3-scapy is installed (scripts/test.sh installs it; required under CI).

mod common;

use std::net::{SocketAddrV4, UdpSocket};
use std::process::Command;
use std::time::Duration;

use common::admin::{get, get_json, metric};
use common::capture::{
    datagrams, finish, packet, scapy_datagrams, send_interleaved, start_capture,
};
use common::vgate::Vgate;

const NET: u8 = 91;
const ADMIN: u16 = 9971;
const SINK: u16 = 40000;

fn config() -> String {
    common::vgate::loopback_with(NET, ADMIN, 100, &[format!("127.0.{NET}.3/32").as_str()], &[])
        + &format!(
            "[media]\nvalidate = \"enforce\"\n[[stream_route]]\nname = \"cam\"\ndomain = \"a\"\nport = 20000\n\
             destination = \"127.0.{NET}.2:{SINK}\"\negress_port = 30000\nexpect_source = \"127.0.{NET}.1:0\"\n\
             media = {{ codec = \"h264\", payload_types = [96] }}\n"
        )
}

fn admin() -> String {
    format!("127.0.{NET}.1:{ADMIN}")
}

fn capture_cmd(args: &[&str]) -> Command {
    let mut c = Command::new(common::vgate_bin());
    c.args(["capture-refused", "--admin", &admin()]).args(args);
    c
}

#[test]
fn capture_refused_writes_exactly_the_next_n_refused_packets() {
    let vg = Vgate::start(&config());
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cam.pcap");
    let out_s = out.to_str().unwrap();

    // An unknown route: a clear error, exit 2, nothing armed.
    let bad = capture_cmd(&["--route", "forward/20099", "--count", "5", "--out", out_s])
        .output()
        .unwrap();
    let bad_err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(2), "{bad_err}");
    assert!(
        bad_err.contains("no stream route on forward/20099")
            && bad_err.contains("vgate routes list"),
        "{bad_err}"
    );

    let sink = UdpSocket::bind(format!("127.0.{NET}.2:{SINK}")).unwrap();
    sink.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let cam = UdpSocket::bind(format!("127.0.{NET}.1:0")).unwrap();
    let cam_addr = match cam.local_addr().unwrap() {
        std::net::SocketAddr::V4(a) => a,
        a => panic!("{a}"),
    };
    let gw: SocketAddrV4 = format!("127.0.{NET}.1:20000").parse().unwrap();

    const N: usize = 5;
    let cap = start_capture(
        &[],
        &admin(),
        &[
            "--route",
            "forward/20000",
            "--count",
            "5",
            "--timeout",
            "30",
            "--out",
            out_s,
        ],
    );
    // A second capture while this one runs is refused.
    let busy = capture_cmd(&["--route", "cam", "--count", "1", "--out", "/dev/null"])
        .output()
        .unwrap();
    let busy_err = String::from_utf8_lossy(&busy.stderr);
    assert_eq!(busy.status.code(), Some(2), "{busy_err}");
    assert!(busy_err.contains("already armed"), "{busy_err}");

    // 8 valid frames and 8 covert packets, interleaved; the first 5 covert are captured.
    let (valid, covert) = send_interleaved(&cam, gw, 8);
    let (ok, stdout, stderr) = finish(cap);
    assert!(ok, "capture-refused failed:\n{stderr}");
    assert!(stderr.contains("captured 5/5"), "{stderr}");

    let mut crossed = Vec::new();
    let mut buf = [0u8; 2048];
    while let Ok(n) = sink.recv(&mut buf) {
        crossed.push(buf[..n].to_vec());
    }
    assert_eq!(crossed, valid, "every valid frame crossed, no covert one");

    let file = std::fs::read(&out).unwrap();
    let got = datagrams(&file);
    let want: Vec<_> = covert[..N]
        .iter()
        .map(|p| (cam_addr, gw, p.clone()))
        .collect();
    assert_eq!(
        got, want,
        "exactly the first {N} covert packets, byte for byte"
    );
    if let Some(lines) = scapy_datagrams(&out) {
        let want: Vec<String> = covert[..N]
            .iter()
            .map(|p| {
                let hex: String = p.iter().map(|b| format!("{b:02x}")).collect();
                format!(
                    "{} {} {} {} {hex}",
                    cam_addr.ip(),
                    cam_addr.port(),
                    gw.ip(),
                    gw.port()
                )
            })
            .collect();
        assert_eq!(lines, want, "scapy reads the same datagrams");
    } else {
        common::test_did_not_run(
            "capture_refused (scapy's reading of the pcap)",
            "python3-scapy is not installed",
        );
    }
    // The listing, printed and beside the file.
    let reasons = std::fs::read_to_string(dir.path().join("cam.pcap.reasons.txt")).unwrap();
    assert_eq!(stdout, reasons);
    let rows: Vec<&str> = reasons.lines().skip(1).collect();
    assert_eq!(rows.len(), N, "{reasons}");
    assert!(
        rows.iter()
            .all(|r| r.ends_with("\tmedia_invalid\tnal_forbidden_bit")
                && r.contains(&cam_addr.to_string())),
        "{reasons}"
    );
    let m = get(&admin(), "/metrics");
    assert_eq!(metric(&m, "vgate_capture_packets_total", &[]), N as u64);
    assert_eq!(metric(&m, "vgate_capture_armed", &[]), 0);
    assert_eq!(metric(&m, "vgate_capture_overflow_total", &[]), 0);
    assert_eq!(
        metric(
            &m,
            "vgate_channel_drops_total",
            &["reason=\"media_invalid\""]
        ),
        8,
        "the capture took copies: every covert packet was still dropped"
    );

    // A host of domain A that is not the route's source: its valid RTP is refused as
    // source_mismatch and captured; the route named by its name.
    let stranger = UdpSocket::bind(format!("127.0.{NET}.3:0")).unwrap();
    let out2 = dir.path().join("stranger.pcap");
    let cap = start_capture(
        &[],
        &admin(),
        &[
            "--route",
            "cam",
            "--count",
            "2",
            "--timeout",
            "30",
            "--out",
            out2.to_str().unwrap(),
        ],
    );
    let sent: Vec<_> = (100..103u16).map(|s| packet(s, false)).collect();
    for p in &sent {
        stranger.send_to(p, gw).unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    let (ok, stdout, stderr) = finish(cap);
    assert!(ok, "{stderr}");
    let got = datagrams(&std::fs::read(&out2).unwrap());
    assert_eq!(got.len(), 2);
    assert_eq!(
        (got[0].2.clone(), got[1].2.clone()),
        (sent[0].clone(), sent[1].clone())
    );
    assert!(got
        .iter()
        .all(|d| *d.0.ip() == std::net::Ipv4Addr::new(127, 0, NET, 3)));
    assert!(
        stdout
            .lines()
            .skip(1)
            .all(|r| r.ends_with("\tsource_mismatch\t-")),
        "{stdout}"
    );
    vg.stop();
}

#[test]
fn the_time_limit_ends_a_capture_with_what_it_took() {
    // Own gateway: admin port and network apart from the other test of this file.
    let net = NET + 1;
    let cfg = config()
        .replace(&format!("127.0.{NET}."), &format!("127.0.{net}."))
        .replace(&format!(":{ADMIN}"), &format!(":{}", ADMIN + 1));
    let vg = Vgate::start(&cfg);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.pcap");
    let admin = format!("127.0.{net}.1:{}", ADMIN + 1);
    let gw = format!("127.0.{net}.1:20000");
    let cam = UdpSocket::bind(format!("127.0.{net}.1:0")).unwrap();
    let out_s = out.to_str().unwrap();
    let cap = start_capture(
        &[],
        &admin,
        &[
            "--route",
            "20000",
            "--count",
            "10",
            "--timeout",
            "2",
            "--out",
            out_s,
        ],
    );
    for seq in [2u16, 4, 6] {
        cam.send_to(&packet(seq, true), &gw).unwrap();
    }
    let (ok, _, stderr) = finish(cap);
    assert!(!ok, "fewer than asked for: exit 1");
    assert!(
        stderr.contains("3 of 10 refused packets captured"),
        "{stderr}"
    );
    assert_eq!(datagrams(&std::fs::read(&out).unwrap()).len(), 3);
    assert_eq!(get_json(&admin, "/api/v1/capture")["state"], "expired");
    vg.stop();
}
