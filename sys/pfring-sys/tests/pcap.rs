//! The wrapper against a real libpfring.so (built with the `pfring` feature only).
//!
//! - `pcap:FILE` and `pcap:lo` open and deliver packets through libpcap, which needs no
//!   kernel module: the wrapper's open → enable → zero-copy receive path and the packed
//!   header's fields are checked against known frames.
//! - Where `pf_ring.ko` is not loaded (no `/proc/net/pf_ring`), opening `lo`, `lo@0`,
//!   `stack:lo` and `zc:lo@0` fails with errno 97 and the wrapper says the module is missing.
//!
//! libpfring.so is found through the loader (ldconfig, `LD_LIBRARY_PATH`); where it is not,
//! each test says it did not run, and fails under `CI=true`.
#![cfg(feature = "pfring")]

use std::io::Write;
use std::net::UdpSocket;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pfring_sys::{Error, Library, Ring, SocketMode};

fn library(test: &str) -> Option<Arc<Library>> {
    match Library::load() {
        Ok(l) => Some(l),
        Err(e) if std::env::var("CI").as_deref() == Ok("true") => panic!("{test}: {e}"),
        Err(e) => {
            eprintln!("{test}: DID NOT RUN: {e}");
            None
        }
    }
}

/// An Ethernet/IPv4/UDP frame to 10.0.0.2:`port` with `payload` (checksums not needed).
fn frame(port: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1, 0x08, 0x00];
    let total = (20 + 8 + payload.len()) as u16;
    f.extend_from_slice(&[
        0x45,
        0,
        (total >> 8) as u8,
        total as u8,
        0,
        0,
        0x40,
        0,
        64,
        17,
        0,
        0,
    ]);
    f.extend_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
    let ulen = (8 + payload.len()) as u16;
    f.extend_from_slice(&4000u16.to_be_bytes());
    f.extend_from_slice(&port.to_be_bytes());
    f.extend_from_slice(&ulen.to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(payload);
    f
}

/// A classic pcap file (microsecond timestamps, Ethernet) holding `frames`, the first with
/// timestamp 1000.000250 s, each next one a second later; the last one cut to 40 bytes.
fn pcap_file(frames: &[Vec<u8>]) -> tempfile_path::TempPath {
    let path = tempfile_path::TempPath::new("pcap");
    let mut f = std::fs::File::create(&path.0).unwrap();
    let mut hdr = Vec::new();
    hdr.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    hdr.extend_from_slice(&2u16.to_le_bytes());
    hdr.extend_from_slice(&4u16.to_le_bytes());
    hdr.extend_from_slice(&0i32.to_le_bytes());
    hdr.extend_from_slice(&0u32.to_le_bytes());
    hdr.extend_from_slice(&65535u32.to_le_bytes());
    hdr.extend_from_slice(&1u32.to_le_bytes());
    f.write_all(&hdr).unwrap();
    for (i, fr) in frames.iter().enumerate() {
        let cut = if i + 1 == frames.len() { 40 } else { fr.len() };
        let mut rec = Vec::new();
        rec.extend_from_slice(&(1000 + i as u32).to_le_bytes());
        rec.extend_from_slice(&250u32.to_le_bytes());
        rec.extend_from_slice(&(cut as u32).to_le_bytes());
        rec.extend_from_slice(&(fr.len() as u32).to_le_bytes());
        f.write_all(&rec).unwrap();
        f.write_all(&fr[..cut]).unwrap();
    }
    path
}

/// A temporary file path removed on drop (no extra dev-dependency for one file).
mod tempfile_path {
    pub struct TempPath(pub std::path::PathBuf);
    impl TempPath {
        pub fn new(ext: &str) -> TempPath {
            let n = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos();
            TempPath(
                std::env::temp_dir().join(format!("pfring-sys-{}-{n}.{ext}", std::process::id())),
            )
        }
    }
    impl Drop for TempPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

#[test]
fn pcap_file_packets_come_through_the_wrapper() {
    let Some(lib) = library("pcap_file_packets_come_through_the_wrapper") else {
        return;
    };
    let frames: Vec<Vec<u8>> = (0..3u16)
        .map(|i| frame(20000 + i, format!("packet {i}").as_bytes()))
        .collect();
    let file = pcap_file(&frames);
    let dev = format!("pcap:{}", file.0.display());
    let mut ring = Ring::open(&lib, &dev, 1536, 0).expect("open pcap: file");
    ring.set_socket_mode(SocketMode::RecvOnly).unwrap();
    ring.enable().unwrap();
    for (i, want) in frames.iter().enumerate() {
        let p = ring
            .recv(false)
            .unwrap()
            .unwrap_or_else(|| panic!("packet {i}"));
        let last = i + 1 == frames.len();
        let cut = if last { 40 } else { want.len() };
        assert_eq!(p.data, &want[..cut], "packet {i} bytes");
        assert_eq!(p.caplen as usize, cut);
        assert_eq!(p.len as usize, want.len());
        assert_eq!(p.truncated(), last);
        assert_eq!(p.ts, Duration::new(1000 + i as u64, 250_000));
    }
    // The end of the file is libpcap's -2 (PCAP_ERROR_BREAK), reported as an error.
    assert!(ring.recv(false).is_err(), "end of file");
    // libpcap's module cannot send, nor be anything but receive-only.
    assert!(ring.set_socket_mode(SocketMode::SendAndRecv).is_err());
}

#[test]
fn pcap_live_capture_needs_no_module() {
    let Some(lib) = library("pcap_live_capture_needs_no_module") else {
        return;
    };
    if !nix_is_root() {
        eprintln!("pcap_live_capture_needs_no_module: DID NOT RUN: needs root (CAP_NET_RAW)");
        return;
    }
    let mut ring = Ring::open(&lib, "pcap:lo", 1536, 0).expect("open pcap:lo");
    ring.enable().unwrap();
    let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = rx.local_addr().unwrap().port();
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let payload = b"vgate pfring pcap probe";
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = false;
    while !seen && Instant::now() < deadline {
        tx.send_to(payload, ("127.0.0.1", port)).unwrap();
        // A blocking receive waits at most a second (the pcap module's poll) then says None.
        for _ in 0..64 {
            match ring.recv(true).unwrap() {
                Some(p) => {
                    // Ethernet (14) + IPv4 (20) + UDP (8), then the payload.
                    let d = p.data;
                    if d.len() >= 42 + payload.len()
                        && u16::from_be_bytes([d[36], d[37]]) == port
                        && &d[42..42 + payload.len()] == payload
                    {
                        assert_eq!(p.len as usize, 42 + payload.len());
                        assert!(p.ts > Duration::from_secs(1_600_000_000), "live timestamp");
                        seen = true;
                        break;
                    }
                }
                None => break,
            }
        }
    }
    assert!(seen, "the probe datagram was captured through pcap:lo");
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

#[test]
fn without_the_module_open_says_so() {
    let Some(lib) = library("without_the_module_open_says_so") else {
        return;
    };
    if Path::new("/proc/net/pf_ring").exists() {
        eprintln!("without_the_module_open_says_so: DID NOT RUN: pf_ring.ko is loaded here");
        return;
    }
    for dev in ["lo", "lo@0", "stack:lo", "zc:lo@0"] {
        match Ring::open(&lib, dev, 1536, pfring_sys::flags::PROMISC) {
            Ok(_) => panic!("{dev} opened without pf_ring.ko"),
            Err(e @ Error::ModuleNotLoaded { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains(dev), "{msg}");
                assert!(
                    msg.contains("pf_ring.ko is not loaded (modprobe pf_ring)"),
                    "{msg}"
                );
            }
            Err(e) => panic!("{dev}: expected errno 97 (pf_ring.ko missing), got: {e}"),
        }
    }
}
