//! The refusal capture's side of the tests (`vgate capture-refused`): covert and valid
//! H.264 RTP packets, the command run and waited for, and its pcap file read back — by
//! vgate's reader and, independently, by scapy.

use std::net::{SocketAddrV4, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};

use super::admin::{get_json, get_json_in};
use super::proc::Proc;

/// An RTP header (PT 96, marker) then, `covert`, 200 pseudo-random bytes each with its top
/// bit set (the H.264 forbidden bit in the first), else an SEI recovery point: one valid NAL.
pub fn packet(seq: u16, covert: bool) -> Vec<u8> {
    let mut b = vec![0x80, 0x80 | 96];
    b.extend_from_slice(&seq.to_be_bytes());
    b.extend_from_slice(&(u32::from(seq) * 3000).to_be_bytes());
    b.extend_from_slice(&7u32.to_be_bytes());
    if covert {
        let mut x = 0x9e37_79b9u32 ^ u32::from(seq);
        b.extend((0..200).map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8 | 0x80
        }));
    } else {
        b.extend_from_slice(&[0x06, 0x06, 0x01, 0x84, 0x80]);
    }
    b
}

/// Sends `pairs` valid frames and as many covert packets, interleaved (valid first), from `s`
/// to `to`, 5 ms apart: (valid, covert) as sent.
pub fn send_interleaved(
    s: &UdpSocket,
    to: SocketAddrV4,
    pairs: u16,
) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let (mut valid, mut covert) = (Vec::new(), Vec::new());
    for seq in 1..=2 * pairs {
        let p = packet(seq, seq % 2 == 0);
        s.send_to(&p, to).unwrap();
        if seq % 2 == 0 {
            covert.push(p);
        } else {
            valid.push(p);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    (valid, covert)
}

/// A running `vgate capture-refused`, its outputs going to files.
pub struct Capture {
    proc: Proc,
    stdout: tempfile::NamedTempFile,
    stderr: tempfile::NamedTempFile,
}

/// Starts `vgate capture-refused` on the gateway at `admin` (through `wrapper`, e.g.
/// `ip netns exec G`) and waits until the gateway says the capture is armed.
pub fn start_capture(wrapper: &[&str], admin: &str, args: &[&str]) -> Capture {
    let (stdout, stderr) = (
        tempfile::NamedTempFile::new().unwrap(),
        tempfile::NamedTempFile::new().unwrap(),
    );
    let mut cmd = match wrapper.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(super::vgate_bin());
            c
        }
        None => Command::new(super::vgate_bin()),
    };
    let proc = Proc::spawn(
        cmd.args(["capture-refused", "--admin", admin])
            .args(args)
            .stdout(stdout.reopen().unwrap())
            .stderr(stderr.reopen().unwrap()),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let state = || match wrapper {
        ["ip", "netns", "exec", ns, ..] => get_json_in(ns, admin, "/api/v1/capture"),
        _ => get_json(admin, "/api/v1/capture"),
    };
    while state()["state"] != "armed" {
        assert!(Instant::now() < deadline, "the capture was never armed");
        std::thread::sleep(Duration::from_millis(50));
    }
    Capture {
        proc,
        stdout,
        stderr,
    }
}

/// Waits for the command's exit: (success, stdout, stderr).
pub fn finish(mut c: Capture) -> (bool, String, String) {
    let ok = c.proc.wait_exit(Duration::from_secs(30));
    let read = |f: &tempfile::NamedTempFile| std::fs::read_to_string(f.path()).unwrap();
    let (out, err) = (read(&c.stdout), read(&c.stderr));
    (
        ok.unwrap_or_else(|| panic!("capture-refused did not end:\n{err}")),
        out,
        err,
    )
}

/// The UDP datagrams of a pcap file: (source, destination, payload), read by vgate's
/// reader; every frame must be a whole IPv4/UDP datagram with right checksums.
pub fn datagrams(file: &[u8]) -> Vec<(SocketAddrV4, SocketAddrV4, Vec<u8>)> {
    vgate::wire::pcap::records(file)
        .expect("a pcap file")
        .iter()
        .map(|r| {
            assert_eq!(r.frame.len(), r.orig_len, "nothing cut");
            let d = vgate::wire::parse_udp4(r.frame).expect("an IPv4/UDP frame");
            assert!(d.checksums_ok(false), "checksums");
            (
                SocketAddrV4::new(d.src_addr, d.src_port),
                SocketAddrV4::new(d.dst_addr, d.dst_port),
                d.payload.to_vec(),
            )
        })
        .collect()
}

/// The same read by scapy: lines `src sport dst dport hexpayload`; `None` without scapy.
pub fn scapy_datagrams(path: &std::path::Path) -> Option<Vec<String>> {
    let script = "import sys\nfrom scapy.all import rdpcap, IP, UDP\n\
                  for p in rdpcap(sys.argv[1]):\n    print(p[IP].src, p[UDP].sport, p[IP].dst, p[UDP].dport, bytes(p[UDP].payload).hex())\n";
    let out = Command::new("/usr/bin/python3")
        .args(["-c", script])
        .arg(path)
        .output()
        .ok()?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        if err.contains("No module named 'scapy'") {
            return None;
        }
        panic!("scapy could not read the capture: {err}");
    }
    Some(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect(),
    )
}
