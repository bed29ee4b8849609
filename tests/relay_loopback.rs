//! Loopback integration tests of the stack relay (no privileges): the real `vgate run`
//! binary with a config file, real UDP sockets as sources and receivers. Each test uses its
//! own 127.0.N.x addresses so tests can run in parallel.

mod common;

use std::fmt::Write as _;
use std::net::{SocketAddr, SocketAddrV4, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};

use common::vgate::{assert_success, check_config, Vgate};

use vgate::wire::rtp::{write_header, RtpPacket};

fn header(net: u8) -> String {
    common::vgate::loopback_with(net, 9940, 1000, &[], &[]) + "[engine]\nqueues = 1\n"
}

fn rtp(seq: u16, ssrc: u32, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    write_header(&mut b, 33, seq, u32::from(seq) * 3000, ssrc).unwrap();
    b
}

fn recv_all(sock: &UdpSocket, want: usize, within: Duration) -> Vec<(Vec<u8>, SocketAddr)> {
    let mut got = Vec::new();
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 4096];
    sock.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    while got.len() < want && Instant::now() < deadline {
        if let Ok((n, from)) = sock.recv_from(&mut buf) {
            got.push((buf[..n].to_vec(), from));
        }
    }
    got
}

/// Waits a little for stragglers, so "nothing else arrived" is checked, not assumed.
fn nothing_more(sock: &UdpSocket) -> usize {
    recv_all(sock, usize::MAX, Duration::from_millis(300)).len()
}

#[test]
fn hundred_streams_relayed_exactly() {
    const STREAMS: u16 = 100;
    const PACKETS: u16 = 200;
    let mut cfg = header(3);
    for i in 0..STREAMS {
        let _ = write!(
            cfg,
            "[[stream_route]]\nname = \"s{i}\"\ndomain = \"a\"\nport = {}\ndestination = \"127.0.3.2:{}\"\negress_port = {}\nexpect_source = \"127.0.3.1:{}\"\nsource_validation = \"strict\"\n",
            20000 + 2 * i,
            40000 + i,
            30000 + 2 * i,
            50000 + i
        );
    }
    let vg = Vgate::start(&cfg);
    let senders: Vec<UdpSocket> = (0..STREAMS)
        .map(|i| UdpSocket::bind(("127.0.3.1", 50000 + i)).unwrap())
        .collect();
    let receivers: Vec<UdpSocket> = (0..STREAMS)
        .map(|i| UdpSocket::bind(("127.0.3.2", 40000 + i)).unwrap())
        .collect();
    for r in &receivers {
        nix::sys::socket::setsockopt(r, nix::sys::socket::sockopt::RcvBuf, &(1usize << 20))
            .unwrap();
    }
    // Rounds of one packet per stream with a pause: modest, so a loaded machine keeps up.
    for seq in 0..PACKETS {
        for (i, s) in senders.iter().enumerate() {
            s.send_to(
                &rtp(seq, i as u32, 200),
                ("127.0.3.1", 20000 + 2 * i as u16),
            )
            .unwrap();
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    for (i, r) in receivers.iter().enumerate() {
        let got = recv_all(r, PACKETS as usize, Duration::from_secs(10));
        assert_eq!(got.len(), PACKETS as usize, "stream {i} lost packets");
        let want_from: SocketAddr =
            SocketAddrV4::new("127.0.3.2".parse().unwrap(), 30000 + 2 * i as u16).into();
        for (n, (p, from)) in got.iter().enumerate() {
            assert_eq!(*from, want_from, "stream {i} packet from the wrong source");
            let h = RtpPacket::new_checked(p).unwrap();
            assert_eq!(h.ssrc(), i as u32, "stream {i} got another stream's packet");
            assert_eq!(h.sequence(), n as u16, "stream {i} out of order");
        }
    }
    let totals = vg.stop();
    let n = u64::from(PACKETS);
    for name in (0..STREAMS).map(|i| format!("s{i}")) {
        for (key, want) in [
            ("rx_packets", n),
            ("tx_packets", n),
            ("tx_bytes", n * 200),
            ("rtp_packets", n),
            ("rtp_lost", 0),
        ] {
            assert_eq!(totals.route(&name, key), want, "{name} {key}");
        }
    }
    let all = u64::from(STREAMS) * u64::from(PACKETS);
    assert_eq!(totals.channel("forward", "rx_packets"), all);
    assert_eq!(totals.channel("forward", "tx_packets"), all);
    assert_eq!(totals.channel("reverse", "rx_packets"), 0);
}

#[test]
fn wrong_sources_garbage_and_oversize_are_counted_not_fatal() {
    let mut cfg = header(4);
    cfg.push_str(
        r#"
[[stream_route]]
name = "strict"
domain = "a"
port = 20000
destination = "127.0.4.2:40000"
egress_port = 30000
expect_source = "127.0.4.1:51000"
source_validation = "strict"
[[stream_route]]
name = "latch"
domain = "a"
port = 20002
destination = "127.0.4.2:40001"
egress_port = 30002
source_validation = "latch"
[[stream_route]]
name = "any"
domain = "a"
port = 20004
destination = "127.0.4.2:40002"
egress_port = 30004
source_validation = "any"
[[stream_route]]
name = "rtponly"
domain = "a"
port = 20006
destination = "127.0.4.2:40003"
egress_port = 30006
source_validation = "any"
rtp_only = true
"#,
    );
    let vg = Vgate::start(&cfg);
    let good = UdpSocket::bind("127.0.4.1:51000").unwrap();
    let other = UdpSocket::bind("127.0.4.1:51001").unwrap();
    let third = UdpSocket::bind("127.0.4.1:51002").unwrap();
    let rx: Vec<UdpSocket> = (0..4)
        .map(|i| UdpSocket::bind(("127.0.4.2", 40000 + i)).unwrap())
        .collect();
    let gw = |port: u16| ("127.0.4.1", port);

    // strict: only 127.0.4.1:51000 passes.
    for s in 0..10 {
        good.send_to(&rtp(s, 1, 100), gw(20000)).unwrap();
        other.send_to(&rtp(s, 2, 100), gw(20000)).unwrap();
    }
    // latch: the first source (other) is kept; good is refused afterwards.
    for s in 0..10 {
        other.send_to(&rtp(s, 3, 100), gw(20002)).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    for s in 0..7 {
        third.send_to(&rtp(s, 4, 100), gw(20002)).unwrap();
    }
    // any: garbage is relayed as is; empty and oversized datagrams are dropped.
    good.send_to(b"not rtp at all", gw(20004)).unwrap();
    good.send_to(&[], gw(20004)).unwrap();
    good.send_to(&[0x80u8; 1473], gw(20004)).unwrap();
    good.send_to(&[0x80u8; 9000], gw(20004)).unwrap();
    // rtp only: garbage and a truncated RTP header are refused, real RTP passes.
    good.send_to(b"garbage garbage", gw(20006)).unwrap();
    good.send_to(&[0x80, 0x21, 0, 1, 2], gw(20006)).unwrap();
    good.send_to(&rtp(1, 5, 60), gw(20006)).unwrap();
    // A gateway port that only sends (egress of "strict") has no reverse route.
    for _ in 0..5 {
        good.send_to(b"stray", ("127.0.4.2", 30000)).unwrap();
    }

    assert_eq!(recv_all(&rx[0], 10, Duration::from_secs(5)).len(), 10);
    assert_eq!(nothing_more(&rx[0]), 0);
    let latched = recv_all(&rx[1], 10, Duration::from_secs(5));
    assert_eq!(latched.len(), 10);
    assert!(latched
        .iter()
        .all(|(p, _)| RtpPacket::new_checked(p).unwrap().ssrc() == 3));
    assert_eq!(nothing_more(&rx[1]), 0);
    let any = recv_all(&rx[2], 1, Duration::from_secs(5));
    assert_eq!(any[0].0, b"not rtp at all");
    assert_eq!(nothing_more(&rx[2]), 0);
    let only = recv_all(&rx[3], 1, Duration::from_secs(5));
    assert_eq!(RtpPacket::new_checked(&only[0].0).unwrap().ssrc(), 5);
    assert_eq!(nothing_more(&rx[3]), 0);

    // The worker survived all of it: a fresh packet still crosses.
    good.send_to(&rtp(10, 1, 100), gw(20000)).unwrap();
    assert_eq!(recv_all(&rx[0], 1, Duration::from_secs(5)).len(), 1);

    let t = vg.stop();
    assert_eq!(t.route("strict", "tx_packets"), 11);
    assert_eq!(t.route("strict", "drop_source_mismatch"), 10);
    assert_eq!(t.route("latch", "tx_packets"), 10);
    assert_eq!(t.route("latch", "drop_source_mismatch"), 7);
    assert_eq!(t.route("any", "tx_packets"), 1);
    assert_eq!(t.route("any", "drop_truncated"), 1);
    assert_eq!(t.route("any", "drop_oversize"), 2);
    assert_eq!(t.route("rtponly", "tx_packets"), 1);
    assert_eq!(t.route("rtponly", "drop_not_rtp"), 2);
    assert_eq!(t.channel("reverse", "drop_no_route"), 5);
    assert_eq!(t.channel("forward", "drop_source_mismatch"), 17);
}

#[test]
fn check_config_names_line_and_key() {
    let text = header(5).replace(
        "media_ports = \"30000-30999\"",
        "media_ports = \"20500-30999\"",
    );
    let out = check_config(&text, &[]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(":11:") && err.contains("domains.b.media_ports") && err.contains("overlaps"),
        "{err}"
    );

    let out = check_config(&header(5), &[]);
    assert_success(&out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok"));
}

#[test]
fn modes_that_are_not_built_say_so() {
    let out = Command::new(common::vgate_bin())
        .args([
            "run",
            "--mode",
            "zc",
            "--engine",
            "pfring-zc",
            "--stats-interval",
            "0",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("without PF_RING"), "{err}");
}

/// Domain isolation must not degrade quietly: a socket that cannot be tied to its domain's
/// interface (`SO_BINDTODEVICE`) would take datagrams for its address from the other domain,
/// so vgate refuses to start and names the interface.
#[test]
fn an_interface_that_cannot_be_bound_is_a_start_up_error() {
    let cfg = header(9).replacen("interface = \"lo\"", "interface = \"vgnosuch0\"", 1);
    let mut vg = Vgate::launch(&cfg).no_wait().start();
    let status = vg.wait_exit(Duration::from_secs(20)).map(|(st, _)| st);
    let err = vg.log();
    let status = status.unwrap_or_else(|| {
        panic!("vgate kept running with a socket it could not bind to its interface:\n{err}")
    });
    assert!(!status.success(), "{err}");
    assert!(err.contains("vgnosuch0"), "{err}");
}
