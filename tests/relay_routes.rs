//! Route changes at run time, in process: the library's `Gateway` with real sockets on
//! loopback. Removing a route stops forwarding at once (the next packet is counted as
//! `no_route`); adding it back resumes without restarting any worker; closing a session
//! gives its ports back.

mod common;

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use vgate::config::{self, DomainId, SourcePolicy};
use vgate::gateway::Gateway;
use vgate::routes::{Channel, RouteSpec, SessionKind};
use vgate::stats::DropReason;

fn cfg(net: u8) -> config::Config {
    let text = common::vgate::loopback_with(net, 9940, 100, &[], &[]) + "[engine]\nqueues = 1\n";
    config::parse(&text, "test").unwrap()
}

fn recv_count(sock: &UdpSocket, within: Duration) -> usize {
    sock.set_read_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    let deadline = Instant::now() + within;
    let mut n = 0;
    let mut buf = [0u8; 2048];
    while Instant::now() < deadline {
        if sock.recv_from(&mut buf).is_ok() {
            n += 1;
        }
    }
    n
}

#[test]
fn remove_stops_at_once_and_add_resumes() {
    let gw = Gateway::start(cfg(6), None).expect("gateway starts");
    let s = gw.routes.open_session(SessionKind::Admin, "test");
    let a = gw.routes.alloc_pair(s, DomainId::A).unwrap();
    let b = gw.routes.alloc_pair(s, DomainId::B).unwrap();
    let spec = RouteSpec {
        ingress: DomainId::A,
        port: a,
        dest: "127.0.6.2:41000".parse().unwrap(),
        egress_port: b,
        policy: SourcePolicy::Any,
        expected: None,
        rtp_only: false,
        label: "t".into(),
        media: None,
    };
    gw.routes.add_route(s, spec.clone()).unwrap();
    let tx = UdpSocket::bind("127.0.6.1:0").unwrap();
    let rx = UdpSocket::bind("127.0.6.2:41000").unwrap();
    let send = |n: usize| {
        for _ in 0..n {
            tx.send_to(b"payload", ("127.0.6.1", a)).unwrap();
        }
    };
    send(20);
    assert_eq!(recv_count(&rx, Duration::from_millis(500)), 20);

    gw.routes.remove_route(Channel::Forward, a).unwrap();
    send(15);
    assert_eq!(
        recv_count(&rx, Duration::from_millis(500)),
        0,
        "a removed route forwards nothing"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while gw
        .totals()
        .channel(Channel::Forward)
        .drop_count(DropReason::NoRoute)
        < 15
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        gw.totals()
            .channel(Channel::Forward)
            .drop_count(DropReason::NoRoute),
        15
    );

    let route = gw.routes.add_route(s, spec).unwrap();
    send(10);
    assert_eq!(
        recv_count(&rx, Duration::from_millis(500)),
        10,
        "the same workers forward again"
    );
    assert_eq!(route.stats.snapshot().packets.tx_packets, 10);

    assert_eq!(gw.routes.ports(DomainId::A).0, 2);
    gw.routes.close_session(s).unwrap();
    assert_eq!(gw.routes.ports(DomainId::A).0, 0);
    assert_eq!(gw.routes.ports(DomainId::B).0, 0);
    assert!(gw.routes.sessions().is_empty());
    // The port is closed: nothing is received or forwarded any more.
    send(5);
    assert_eq!(recv_count(&rx, Duration::from_millis(300)), 0);
    // And it can be bound again by anyone, i.e. the socket is really gone.
    assert!(UdpSocket::bind(("127.0.6.1", a)).is_ok());
    let stats = gw.shutdown();
    assert!(stats
        .iter()
        .all(|w| w.exited.load(std::sync::atomic::Ordering::Relaxed)));
}

#[test]
fn exhausted_ports_are_an_error_and_come_back() {
    let gw = Gateway::start(cfg(7), None).expect("gateway starts");
    let s = gw.routes.open_session(SessionKind::Sip, "many");
    let mut n = 0;
    while gw.routes.alloc_pair(s, DomainId::A).is_ok() {
        n += 1;
    }
    assert_eq!(n, 50, "100 ports = 50 RTP/RTCP pairs");
    let other = gw.routes.open_session(SessionKind::Sip, "one more");
    let e = gw
        .routes
        .alloc_pair(other, DomainId::A)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no free port pair"), "{e}");
    gw.routes.close_session(s).unwrap();
    assert!(gw.routes.alloc_pair(other, DomainId::A).is_ok());
}
