//! `vgate capture-refused` in the capture modes that do not use the kernel's sockets, on the
//! three-namespace bed (tnapi: AF_PACKET rings; zc: AF_XDP; xdp: a validated route is decided
//! in user space, off the in-kernel fast path), media validation `enforce` on
//! an H.264 route: covert packets (random bytes behind a valid RTP header) interleaved with
//! valid frames from a sender in A; the pcap file holds exactly the first N covert packets,
//! byte for byte, with the sender's address and the gateway's address and port in A, and
//! none of the valid ones, which all reach B. (Mode stack: tests/media_capture.rs.)
//!
//! Needs root and iproute2; scapy (python3-scapy) for the independent reading of the file.

mod common;

use std::net::{SocketAddrV4, UdpSocket};
use std::time::Duration;

use common::capture::{datagrams, finish, scapy_datagrams, send_interleaved, start_capture};
use common::vgate::Vgate;
use common::{enter_netns, in_netns, prerequisites, Bed, BedConfig};

const PORT: u16 = 20000;
const SINK: u16 = 40000;
const N: usize = 5;

fn config(bed: &Bed, mode: &str) -> String {
    let mut s = bed.config(BedConfig {
        mode,
        ..Default::default()
    });
    s.push_str(&format!(
        "[media]\nvalidate = \"enforce\"\n[[stream_route]]\nname = \"cam\"\ndomain = \"a\"\nport = {PORT}\n\
         destination = \"{}:{SINK}\"\negress_port = 30000\nexpect_source = \"{}:0\"\n\
         media = {{ codec = \"h264\", payload_types = [96] }}\n",
        bed.get("B_IP"),
        bed.get("A_IP"),
    ));
    s
}

/// The modes take turns (one bed at a time) on a shared machine.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn run(mode: &str) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let bed = Bed::up(1);
    let g_ns = bed.get("G_NS").to_owned();
    let vg = Vgate::start_in(&g_ns, &config(&bed, mode), &[]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cam.pcap");
    let gw = SocketAddrV4::new(bed.ip("GA_IP"), PORT);

    // The sink in B: every datagram until 1 s of quiet.
    let (b_ns, b_ip) = (bed.get("B_NS").to_owned(), bed.ip("B_IP"));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let sink = std::thread::spawn(move || {
        enter_netns(&b_ns).unwrap();
        let s = UdpSocket::bind(SocketAddrV4::new(b_ip, SINK)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        ready_tx.send(()).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 2048];
        while let Ok(n) = s.recv(&mut buf) {
            got.push(buf[..n].to_vec());
        }
        got
    });
    ready_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("sink bound");

    let cap = start_capture(
        &["ip", "netns", "exec", &g_ns],
        "127.0.0.1:9940",
        &[
            "--route",
            "forward/20000",
            "--count",
            "5",
            "--timeout",
            "60",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    let a_ip = bed.ip("A_IP");
    let (valid, covert, from) = in_netns(bed.get("A_NS"), move || {
        let s = UdpSocket::bind(SocketAddrV4::new(a_ip, 5004)).unwrap();
        let (valid, covert) = send_interleaved(&s, gw, 8);
        (valid, covert, SocketAddrV4::new(a_ip, 5004))
    });
    let (ok, _stdout, stderr) = finish(cap);
    assert!(ok, "mode {mode}: capture-refused failed:\n{stderr}");
    let crossed = sink.join().unwrap();
    vg.stop();

    assert_eq!(
        crossed, valid,
        "mode {mode}: every valid frame crossed, no covert one"
    );
    let got = datagrams(&std::fs::read(&out).unwrap());
    let want: Vec<_> = covert[..N].iter().map(|p| (from, gw, p.clone())).collect();
    assert_eq!(
        got, want,
        "mode {mode}: exactly the first {N} covert packets"
    );
    match scapy_datagrams(&out) {
        Some(lines) => assert_eq!(lines.len(), N, "mode {mode}: scapy reads {N} datagrams"),
        None => common::test_did_not_run(
            "media_capture_netns (scapy's reading of the pcap)",
            "python3-scapy is not installed",
        ),
    }
}

fn can_run(test: &str) -> bool {
    prerequisites(test, true, &[("ip", "iproute2")])
}

#[test]
fn capture_refused_takes_the_covert_packets_tnapi() {
    if can_run("capture_refused_takes_the_covert_packets_tnapi") {
        run("tnapi");
    }
}

#[test]
fn capture_refused_takes_the_covert_packets_zc() {
    if can_run("capture_refused_takes_the_covert_packets_zc") {
        run("zc");
    }
}

#[test]
fn capture_refused_takes_the_covert_packets_xdp() {
    if can_run("capture_refused_takes_the_covert_packets_xdp") {
        run("xdp");
    }
}
