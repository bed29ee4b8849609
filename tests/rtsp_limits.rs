//! The RTSP proxy's connection limits against a real `vgate run` on loopback:
//! - a client that sends its request byte by byte (slow-loris) is cut off after
//!   `request_timeout` and counted (`slow_requests`), while a client that sent a whole
//!   request and then stays quiet keeps its connection;
//! - `max_connections_per_source` and `allow_peers` refuse connections at once, counted.
//!
//! The upstream is a small RTSP responder in the test (200 OK to anything).

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use common::vgate::Vgate;

const NET: u8 = 47;

fn config() -> String {
    common::vgate::loopback_with(NET, 9947, 1000, &[], &[&format!("127.0.{NET}.64/26")])
        + &common::signaling_route(
            "cam",
            "rtsp",
            "tcp",
            ("b", 8554),
            &format!("127.0.{NET}.1:8555"),
        )
        + &format!(
            "request_timeout = 3\nmax_connections_per_source = 2\nallow_peers = [\"127.0.{NET}.64/27\"]\n"
        )
}

/// Answers every request on `addr` with `200 OK` and its CSeq.
fn upstream(addr: SocketAddrV4) {
    let l = TcpListener::bind(addr).unwrap();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut s = s;
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while let Ok(n) = s.read(&mut chunk) {
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                        buf.drain(..end + 4);
                        let cseq = head
                            .lines()
                            .find_map(|l| l.strip_prefix("CSeq: "))
                            .unwrap_or("0")
                            .to_owned();
                        let r = format!(
                            "RTSP/1.0 200 OK\r\nCSeq: {cseq}\r\nPublic: OPTIONS, DESCRIBE, SETUP, PLAY, TEARDOWN\r\n\r\n"
                        );
                        if s.write_all(r.as_bytes()).is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
}

fn connect_from(last_octet: u8) -> TcpStream {
    let sock = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Stream,
        nix::sys::socket::SockFlag::empty(),
        None,
    )
    .unwrap();
    let local = nix::sys::socket::SockaddrIn::from(SocketAddrV4::new(
        Ipv4Addr::new(127, 0, NET, last_octet),
        0,
    ));
    nix::sys::socket::bind(std::os::fd::AsRawFd::as_raw_fd(&sock), &local).unwrap();
    let gw =
        nix::sys::socket::SockaddrIn::from(SocketAddrV4::new(Ipv4Addr::new(127, 0, NET, 2), 8554));
    nix::sys::socket::connect(std::os::fd::AsRawFd::as_raw_fd(&sock), &gw).unwrap();
    TcpStream::from(sock)
}

/// Whether the peer closed the connection (EOF or reset) within `within`.
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut b = [0u8; 512];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
}

fn options(s: &mut TcpStream, cseq: u32) -> String {
    let req = format!("OPTIONS rtsp://127.0.{NET}.2:8554/cam RTSP/1.0\r\nCSeq: {cseq}\r\n\r\n");
    s.write_all(req.as_bytes()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut b = [0u8; 1024];
    let n = s.read(&mut b).unwrap_or(0);
    String::from_utf8_lossy(&b[..n]).into_owned()
}

fn event(name: &str) -> u64 {
    let Ok(mut s) = TcpStream::connect(("127.0.47.1", 9947)) else {
        return 0;
    };
    let _ = s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let key = format!(
        "{} ",
        vgate::control::metrics::event_series("cam", "rtsp", name)
    );
    out.lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(0.0) as u64
}

/// Polls a counter until it reaches `want` (events are published once a second).
fn wait_event(name: &str, want: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let v = event(name);
        if v >= want || Instant::now() > deadline {
            return v;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn rtsp_slow_requests_and_connection_limits() {
    upstream(SocketAddrV4::new(Ipv4Addr::new(127, 0, NET, 1), 8555));
    let gw = Vgate::start(&config());

    // A well-behaved client: a whole request, answered; then quiet, and kept.
    let mut good = connect_from(65);
    let r = options(&mut good, 1);
    assert!(r.starts_with("RTSP/1.0 200"), "{r}");

    // Slow-loris: one byte every 200 ms, never a whole request (bounded: 30 s of bytes).
    let mut slow = connect_from(66);
    let request = b"OPTIONS rtsp://127.0.47.2:8554/cam RTSP/1.0\r\nCSeq: 1\r\nUser-Agent: a-very-slow-client-that-never-finishes-its-request-line-and-headers-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx";
    let started = Instant::now();
    let mut cut_after = None;
    for b in request.iter() {
        if slow.write_all(std::slice::from_ref(b)).is_err() {
            cut_after = Some(started.elapsed());
            break;
        }
        if closed_within(&mut slow, Duration::from_millis(200)) {
            cut_after = Some(started.elapsed());
            break;
        }
    }
    let cut_after = cut_after.expect("the byte-by-byte client was never cut off");
    assert!(
        cut_after >= Duration::from_secs(3),
        "cut off before request_timeout: {cut_after:?}"
    );
    assert_eq!(wait_event("slow_requests", 1), 1);

    // The quiet client that completed its request still has its connection.
    let r = options(&mut good, 2);
    assert!(
        r.starts_with("RTSP/1.0 200"),
        "the quiet client lost its connection: {r}"
    );

    // max_connections_per_source = 2: the third from one source is closed at once.
    let mut second = connect_from(65);
    assert!(options(&mut second, 1).starts_with("RTSP/1.0 200"));
    let mut third = connect_from(65);
    assert!(
        closed_within(&mut third, Duration::from_secs(10)),
        "a third connection from one source was served"
    );
    assert_eq!(wait_event("refused_per_source", 1), 1);
    // Another source is not affected.
    let mut other = connect_from(67);
    assert!(options(&mut other, 1).starts_with("RTSP/1.0 200"));

    // allow_peers: 127.0.47.100 is in domain b but not in 127.0.47.64/27.
    let mut outsider = connect_from(100);
    assert!(closed_within(&mut outsider, Duration::from_secs(10)));
    assert_eq!(wait_event("refused_peers", 1), 1);
    drop((good, second, other));
    let _ = gw.stop();
}
