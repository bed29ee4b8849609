//! The RTSP proxy's connection limits against a real `vgate run` on loopback:
//! - a client that sends its request byte by byte (slow-loris) is cut off after
//!   `request_timeout` and counted (`slow_requests`), while a client that sent a whole
//!   request and then stays quiet keeps its connection;
//! - at `max_connections_per_source` a new connection evicts the source's idlest
//!   connection without a session (counted `evicted_per_source`), and `allow_peers`
//!   refuses connections at once, counted;
//! - an idle flood (250 connections that never send a byte) from one address does not
//!   lock that address out: its next DESCRIBE is answered, the flood evicted its own
//!   oldest connections, and the gateway's descriptors and threads stay bounded;
//!
//! (A platform pulling 200 streams from one address: `tests/rtsp_limits_netns.rs`.)
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
    connect_on(NET, last_octet)
}

/// A connection from `127.0.net.last_octet` to the gateway's RTSP port in domain B.
fn connect_on(net: u8, last_octet: u8) -> TcpStream {
    let sock = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Stream,
        nix::sys::socket::SockFlag::empty(),
        None,
    )
    .unwrap();
    let local = nix::sys::socket::SockaddrIn::from(SocketAddrV4::new(
        Ipv4Addr::new(127, 0, net, last_octet),
        0,
    ));
    nix::sys::socket::bind(std::os::fd::AsRawFd::as_raw_fd(&sock), &local).unwrap();
    let gw =
        nix::sys::socket::SockaddrIn::from(SocketAddrV4::new(Ipv4Addr::new(127, 0, net, 2), 8554));
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
    event_of(NET, 9947, name)
}

/// An event of route `cam` on the gateway whose admin interface is `127.0.net.1:admin`.
fn event_of(net: u8, admin: u16, name: &str) -> u64 {
    let Ok(mut s) = TcpStream::connect((Ipv4Addr::new(127, 0, net, 1), admin)) else {
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
    wait_event_of(NET, 9947, name, want)
}

fn wait_event_of(net: u8, admin: u16, name: &str, want: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let v = event_of(net, admin, name);
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

    // max_connections_per_source = 2: the third from one source makes room by evicting
    // the source's connection quiet the longest (`good`), not by being refused.
    let mut second = connect_from(65);
    assert!(options(&mut second, 1).starts_with("RTSP/1.0 200"));
    let mut third = connect_from(65);
    assert!(
        options(&mut third, 1).starts_with("RTSP/1.0 200"),
        "a third connection from one source was not served"
    );
    assert!(
        closed_within(&mut good, Duration::from_secs(10)),
        "the idlest connection of the source was not evicted"
    );
    assert_eq!(wait_event("evicted_per_source", 1), 1);
    assert_eq!(event("refused_per_source"), 0);
    assert!(options(&mut second, 2).starts_with("RTSP/1.0 200"));
    // Another source is not affected.
    let mut other = connect_from(67);
    assert!(options(&mut other, 1).starts_with("RTSP/1.0 200"));

    // allow_peers: 127.0.47.100 is in domain b but not in 127.0.47.64/27.
    let mut outsider = connect_from(100);
    assert!(closed_within(&mut outsider, Duration::from_secs(10)));
    assert_eq!(wait_event("refused_peers", 1), 1);
    drop((second, third, other));
    let _ = gw.stop();
}

const FLOOD_NET: u8 = 147;
const FLOOD_ADMIN: u16 = 9147;
/// Idle connections the flood opens from one address (bounded).
const FLOOD: usize = 250;

#[test]
fn an_idle_flood_from_one_address_does_not_lock_it_out() {
    let net = FLOOD_NET;
    upstream(SocketAddrV4::new(Ipv4Addr::new(127, 0, net, 1), 8555));
    // The defaults (64 connections without a session per source); a request_timeout long
    // enough that the flood is not cut off as slow requests while the test runs.
    let config =
        common::vgate::loopback_with(net, FLOOD_ADMIN, 100, &[], &[&format!("127.0.{net}.64/26")])
            + &common::signaling_route(
                "cam",
                "rtsp",
                "tcp",
                ("b", 8554),
                &format!("127.0.{net}.1:8555"),
            )
            + "request_timeout = 120\n";
    let gw = Vgate::start(&config);
    let pid = gw.pid();
    let (fds_before, threads_before) = (common::proc::fd_count(pid), common::proc::threads(pid));

    // The flood: connections that never send a byte, all from 127.0.NET.65.
    let mut flood: Vec<TcpStream> = (0..FLOOD).map(|_| connect_on(net, 65)).collect();
    // Then a real client from the same address.
    let mut client = connect_on(net, 65);
    let req = format!("DESCRIBE rtsp://127.0.{net}.2:8554/cam RTSP/1.0\r\nCSeq: 1\r\nAccept: application/sdp\r\n\r\n");
    client.write_all(req.as_bytes()).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut b = [0u8; 1024];
    let n = client.read(&mut b).unwrap_or(0);
    let r = String::from_utf8_lossy(&b[..n]).into_owned();
    assert!(
        r.starts_with("RTSP/1.0 200"),
        "a DESCRIBE after an idle flood from its address was not answered: {r:?}"
    );

    // Each connection past the 64th evicted the oldest idle one: the flood's first.
    let evictions = (FLOOD + 1 - 64) as u64;
    assert_eq!(
        wait_event_of(net, FLOOD_ADMIN, "evicted_per_source", evictions),
        evictions
    );
    assert_eq!(event_of(net, FLOOD_ADMIN, "refused_per_source"), 0);
    for (i, s) in flood.iter_mut().enumerate().take(FLOOD + 1 - 64) {
        assert!(
            closed_within(s, Duration::from_secs(10)),
            "flood connection {i} was not evicted"
        );
    }
    for (i, s) in flood.iter_mut().enumerate().skip(FLOOD + 1 - 64) {
        assert!(
            !closed_within(s, Duration::from_millis(50)),
            "flood connection {i}, among the newest 63, was closed"
        );
    }

    // Bounded: the gateway holds 64 connections of this source, not 251 (each connection
    // takes 4 descriptors and a thread here; 32 more of each for slack).
    let deadline = Instant::now() + Duration::from_secs(20);
    let bounded = || {
        let fds = common::proc::fd_count(pid);
        let threads = common::proc::threads(pid);
        (
            fds <= fds_before + 64 * 4 + 32 && threads <= threads_before + 64 + 32,
            fds,
            threads,
        )
    };
    let (mut ok, mut fds, mut threads) = bounded();
    while !ok && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        (ok, fds, threads) = bounded();
    }
    assert!(
        ok,
        "after the flood the gateway holds {fds} descriptors (before: {fds_before}) and {threads} threads (before: {threads_before})"
    );
    drop((flood, client));
    let _ = gw.stop();
}
