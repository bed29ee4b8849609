//! Legs on loopback with the real port registry: TCP → UDP through a route, UDP → TCP
//! through a sink, a refused source, the close callback.

use std::io::{Read, Write};
use std::net::{SocketAddrV4, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::config::{self, SourcePolicy};
use crate::engine::ports::{PortHold, PortRegistry};
use crate::routes::legs::LegState;
use crate::routes::{PortHooks, RouteSpec, SessionId, SessionKind};
use crate::wire::framing::{frame_into, Rfc4571};

fn routes() -> Loopback {
    loopback_routes("47000-47199", "48000-48199")
}

/// Route tables and the port registry their hooks are, as an engine would pair them.
pub(crate) struct Loopback {
    pub routes: Arc<Routes>,
    pub ports: Arc<PortRegistry>,
}

impl Loopback {
    /// The legs over these tables and ports, as the gateway gives the proxies.
    pub(crate) fn legs(&self) -> Arc<dyn crate::routes::legs::Legs> {
        Arc::new(EdgeLegs::new(
            Arc::clone(&self.routes),
            Some(Arc::clone(&self.ports)),
        ))
    }

    fn ports(&self) -> Option<Arc<PortRegistry>> {
        Some(Arc::clone(&self.ports))
    }
}

impl std::ops::Deref for Loopback {
    type Target = Arc<Routes>;
    fn deref(&self) -> &Arc<Routes> {
        &self.routes
    }
}

/// Route tables on loopback (A = 127.0.0.1, B = 127.0.0.2) with the real port registry, so
/// legs and injectors find their sockets; the ranges keep concurrent tests apart.
pub(crate) fn loopback_routes(a_ports: &str, b_ports: &str) -> Loopback {
    loopback_routes_holding(a_ports, b_ports, PortHold::Sockets).unwrap()
}

/// As [`loopback_routes`], ports held as `hold` says (`Reserved`: no socket per port, the
/// legs send through a raw socket per domain; `None` without CAP_NET_RAW).
fn loopback_routes_holding(a_ports: &str, b_ports: &str, hold: PortHold) -> Option<Loopback> {
    let cfg = config::parse(
        &format!(
            r#"
[domains.a]
interface = "lo"
address = "127.0.0.1"
media_ports = "{a_ports}"
[domains.b]
interface = "lo"
address = "127.0.0.2"
media_ports = "{b_ports}"
"#
        ),
        "t",
    )
    .unwrap();
    let reg = PortRegistry::new(["127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap()])
        .holding(hold)
        .ok()?;
    let ports = Arc::new(reg);
    let routes = Arc::new(Routes::new(&cfg, Arc::clone(&ports) as Arc<dyn PortHooks>));
    Some(Loopback { routes, ports })
}

/// A UDP receiver in domain B (loopback 127.0.0.2), with its address.
fn viewer() -> (UdpSocket, SocketAddrV4) {
    let viewer = UdpSocket::bind("127.0.0.2:0").unwrap();
    viewer
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    match viewer.local_addr().unwrap() {
        std::net::SocketAddr::V4(v) => (viewer, v),
        _ => unreachable!(),
    }
}

fn rtp(seq: u16, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    crate::wire::rtp::write_header(&mut b, 96, seq, 0, 1).unwrap();
    b
}

fn spec(
    session: SessionId,
    domain: DomainId,
    role: Role,
    local: SocketAddrV4,
    peer: SocketAddrV4,
    closed: Option<Arc<AtomicBool>>,
) -> LegSpec {
    LegSpec {
        label: "test leg".into(),
        session,
        domain,
        role,
        local,
        peer,
        within: None,
        interface: None,
        framing: Box::new(Rfc4571),
        max_payload: 1472,
        slots: 64,
        connect_for: Duration::from_secs(5),
        on_close: closed
            .map(|c| Box::new(move || c.store(true, SeqCst)) as Box<dyn FnOnce() + Send>),
        close_grace: Duration::ZERO,
        fallback_port: None,
    }
}

/// `conn` is closed by the leg, which has counted `refused` refusals.
fn closed_by_the_leg(mut conn: TcpStream, leg: &Leg, refused: u64) {
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 1];
    assert!(
        matches!(conn.read(&mut b), Ok(0) | Err(_)),
        "closed by the leg"
    );
    wait("refused", || leg.counters().refused.load(SeqCst) == refused);
}

/// A passive leg on A's port `a` expecting its peer on 127.0.0.1; `closed` set when it ends.
fn passive_leg_on_a(
    routes: &Loopback,
    s: SessionId,
    a: u16,
    closed: &Arc<AtomicBool>,
) -> (Leg, SocketAddrV4) {
    let local = SocketAddrV4::new("127.0.0.1".parse().unwrap(), a);
    let leg = Leg::start(
        spec(
            s,
            DomainId::A,
            Role::Passive,
            local,
            "127.0.0.1:9".parse().unwrap(),
            Some(Arc::clone(closed)),
        ),
        Arc::clone(routes),
        routes.ports(),
    )
    .unwrap();
    (leg, local)
}

fn thread_named(name: &str) -> bool {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .any(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
}

fn wait(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn passive_leg_bridges_both_ways() {
    bridges_both_ways(routes());
}

/// As a ring mode holds ports: no socket per port, the leg's packets leave through the
/// domain's raw socket from the route's egress port.
#[test]
fn passive_leg_bridges_both_ways_without_port_sockets() {
    match loopback_routes_holding("47200-47299", "48200-48299", PortHold::Reserved) {
        Some(routes) => bridges_both_ways(routes),
        None => crate::test_did_not_run(
            "passive_leg_bridges_both_ways_without_port_sockets",
            "no CAP_NET_RAW",
        ),
    }
}

fn bridges_both_ways(routes: Loopback) {
    let s = routes.open_session(SessionKind::Sip, "t");
    let a = routes.alloc_pair(s, DomainId::A).unwrap();
    let b = routes.alloc_pair(s, DomainId::B).unwrap();
    let (viewer, viewer_at) = viewer();
    let closed = Arc::new(AtomicBool::new(false));
    let (leg, local) = passive_leg_on_a(&routes, s, a, &closed);
    // A -> B: what the TCP peer sends leaves as UDP from B's egress port.
    routes
        .add_route(
            s,
            RouteSpec {
                ingress: DomainId::A,
                port: a,
                dest: viewer_at,
                egress_port: b,
                policy: SourcePolicy::Strict,
                expected: Some("127.0.0.1:0".parse().unwrap()),
                rtp_only: true,
                label: "fwd".into(),
                media: None,
            },
        )
        .unwrap();
    // B -> A: a packet the engine admits for the reverse route goes to the leg's sink.
    let rev = routes
        .add_edge_route(
            s,
            RouteSpec {
                ingress: DomainId::B,
                port: b,
                dest: local,
                egress_port: a,
                policy: SourcePolicy::Any,
                expected: None,
                rtp_only: false,
                label: "rev".into(),
                media: None,
            },
            Some(Arc::clone(leg.sink())),
        )
        .unwrap();
    assert_eq!(routes.legs.len(), 1);
    let name = format!("vgate-leg{}", leg.id());
    // The new thread names itself when it starts: wait for it rather than race it.
    wait("the leg runs its own thread", || thread_named(&name));
    // A second client from an address the SDP did not name is refused.
    let mut peer = TcpStream::connect(local).unwrap();
    let mut bytes = Vec::with_capacity(65536);
    for i in 0..20 {
        assert!(frame_into(
            &Rfc4571,
            0,
            &rtp(i, 100 + usize::from(i)),
            &mut bytes
        ));
    }
    peer.write_all(&bytes).unwrap();
    let mut buf = [0u8; 2048];
    for i in 0..20u16 {
        let (n, from) = viewer.recv_from(&mut buf).unwrap();
        assert_eq!(n, 100 + usize::from(i));
        assert_eq!(
            from.to_string(),
            format!("127.0.0.2:{b}"),
            "sent from B's egress port"
        );
    }
    let c = leg.counters();
    wait("frames_in", || c.frames_in.load(SeqCst) == 20);
    assert_eq!(c.connects.load(SeqCst), 1);
    // UDP -> TCP: offered packets come out framed.
    for i in 0..10 {
        assert!(rev.edge.as_ref().unwrap().offer(&rtp(i, 60)));
    }
    peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = vec![0u8; 10 * 62];
    peer.read_exact(&mut got).unwrap();
    assert_eq!(&got[..2], &[0, 60]);
    wait("frames_out", || c.frames_out.load(SeqCst) == 10);
    // A cut frame at the close: counted, the owner told.
    peer.write_all(&[0, 50, 0x80, 1, 2]).unwrap();
    drop(peer);
    wait("close", || closed.load(SeqCst));
    assert_eq!(c.partial_frames.load(SeqCst), 1);
    assert_eq!(c.state(), LegState::Closed);
    assert!(
        !rev.edge.as_ref().unwrap().offer(&rtp(1, 60)),
        "closed legs take nothing"
    );
    drop(leg);
    // Joined; the kernel drops the task from /proc a moment after the join returns.
    wait("the leg's thread to end", || !thread_named(&name));
    assert_eq!(routes.legs.len(), 0);
    assert_eq!(routes.legs.ended.frames_in.load(SeqCst), 20);
    routes.close_session(s).unwrap();
}

#[test]
fn passive_leg_refuses_other_sources() {
    let routes = routes();
    let s = routes.open_session(SessionKind::Sip, "t");
    let a = routes.alloc_pair(s, DomainId::A).unwrap();
    let local = SocketAddrV4::new("127.0.0.1".parse().unwrap(), a);
    let leg = Leg::start(
        spec(
            s,
            DomainId::A,
            Role::Passive,
            local,
            "127.0.0.5:9".parse().unwrap(),
            None,
        ),
        Arc::clone(&routes),
        routes.ports(),
    )
    .unwrap();
    let intruder = TcpStream::connect(local).unwrap();
    closed_by_the_leg(intruder, &leg, 1);
    assert_eq!(leg.counters().connects.load(SeqCst), 0);
    drop(leg);
    routes.close_session(s).unwrap();
}

#[test]
fn passive_leg_takes_a_new_connection_from_its_peer_in_place_of_the_old() {
    let routes = routes();
    let s = routes.open_session(SessionKind::Sip, "t");
    let a = routes.alloc_pair(s, DomainId::A).unwrap();
    let closed = Arc::new(AtomicBool::new(false));
    let (leg, local) = passive_leg_on_a(&routes, s, a, &closed);
    let c = Arc::clone(leg.counters());
    let mut first = TcpStream::connect(local).unwrap();
    wait("first connect", || c.connects.load(SeqCst) == 1);
    // A frame and half of one on the old connection (one small write: read at once), then
    // the peer reconnects (a=connection:new).
    let mut old = Vec::with_capacity(128);
    assert!(frame_into(&Rfc4571, 0, &rtp(9, 40), &mut old));
    old.extend_from_slice(&[0, 50, 0x80, 1]);
    first.write_all(&old).unwrap();
    wait("the old connection's frame", || {
        c.frames_in.load(SeqCst) == 1
    });
    let mut second = TcpStream::connect(local).unwrap();
    wait("second connect", || c.connects.load(SeqCst) == 2);
    drop(first);
    let mut bytes = Vec::with_capacity(1024);
    for i in 0..3 {
        assert!(frame_into(&Rfc4571, 0, &rtp(i, 80), &mut bytes));
    }
    second.write_all(&bytes).unwrap();
    wait("frames on the new connection", || {
        c.frames_in.load(SeqCst) == 4
    });
    assert_eq!(
        c.framing_errors.load(SeqCst),
        0,
        "read in step from its start"
    );
    assert_eq!(c.partial_frames.load(SeqCst), 1, "the old one's half frame");
    assert_eq!(c.refused.load(SeqCst), 0);
    assert_eq!(c.state(), LegState::Connected);
    assert!(
        !closed.load(SeqCst),
        "the old connection closing ends nothing"
    );
    drop(second);
    wait("close", || closed.load(SeqCst));
    drop(leg);
    routes.close_session(s).unwrap();
}

/// The peer closes first and connects again after (a reconnect whose close came first):
/// within `close_grace` the passive leg listens again and takes the new connection, and the
/// call is not ended; past the grace a close ends it. Deterministic: the reconnect waits
/// for the leg to have seen the close (state `listening`), the grace is an hour.
#[test]
fn a_passive_leg_whose_peer_closes_takes_its_new_connection_within_the_grace() {
    let routes = routes();
    let s = routes.open_session(SessionKind::Sip, "t");
    let a = routes.alloc_pair(s, DomainId::A).unwrap();
    let closed = Arc::new(AtomicBool::new(false));
    let local = SocketAddrV4::new("127.0.0.1".parse().unwrap(), a);
    let mut sp = spec(
        s,
        DomainId::A,
        Role::Passive,
        local,
        "127.0.0.1:9".parse().unwrap(),
        Some(Arc::clone(&closed)),
    );
    sp.close_grace = Duration::from_secs(3600);
    let leg = Leg::start(sp, Arc::clone(&routes), routes.ports()).unwrap();
    let c = Arc::clone(leg.counters());
    let first = TcpStream::connect(local).unwrap();
    wait("first connect", || c.state() == LegState::Connected);
    drop(first);
    wait("the close seen", || c.state() == LegState::Listening);
    assert!(!closed.load(SeqCst), "not ended within the grace");
    let mut second = TcpStream::connect(local).unwrap();
    wait("second connect", || c.connects.load(SeqCst) == 2);
    let mut bytes = Vec::with_capacity(256);
    assert!(frame_into(&Rfc4571, 0, &rtp(1, 80), &mut bytes));
    second.write_all(&bytes).unwrap();
    wait("a frame on the new connection", || {
        c.frames_in.load(SeqCst) == 1
    });
    assert_eq!(c.state(), LegState::Connected);
    assert!(!closed.load(SeqCst));
    assert_eq!(
        c.reconnects.load(SeqCst),
        1,
        "the second connection is a reconnect"
    );
    // GB/T 28181 Annex D: the device reconnects again and again (at least three times).
    // Another address is refused meanwhile, on the same gateway port.
    for n in 2..=3u64 {
        second.shutdown(std::net::Shutdown::Both).unwrap();
        wait("the close seen", || c.state() == LegState::Listening);
        let stranger = nix::sys::socket::socket(
            nix::sys::socket::AddressFamily::Inet,
            nix::sys::socket::SockType::Stream,
            nix::sys::socket::SockFlag::empty(),
            None,
        )
        .unwrap();
        let from = nix::sys::socket::SockaddrIn::new(127, 0, 0, 2, 0);
        nix::sys::socket::bind(std::os::fd::AsRawFd::as_raw_fd(&stranger), &from).unwrap();
        let to = nix::sys::socket::SockaddrIn::from(local);
        nix::sys::socket::connect(std::os::fd::AsRawFd::as_raw_fd(&stranger), &to).unwrap();
        wait("the stranger refused", || c.refused.load(SeqCst) == n - 1);
        assert_eq!(c.state(), LegState::Listening, "a stranger is no reconnect");
        second = TcpStream::connect(local).unwrap();
        wait("the reconnect", || c.reconnects.load(SeqCst) == n);
        assert!(!closed.load(SeqCst));
    }
    assert_eq!(c.connects.load(SeqCst), 4);
    drop(second);
    drop(leg);
    assert!(!closed.load(SeqCst), "dropped by its owner: nobody told");
    routes.close_session(s).unwrap();
}

#[test]
fn active_leg_gives_up_at_its_deadline_while_syns_go_unanswered() {
    use nix::sys::socket::{
        bind, getsockname, listen, socket, AddressFamily, Backlog, SockFlag, SockType, SockaddrIn,
    };
    use std::os::fd::AsRawFd;
    let routes = routes();
    let s = routes.open_session(SessionKind::Sip, "t");
    let a = routes.alloc_pair(s, DomainId::A).unwrap();
    // A loopback listener with a backlog of 0, never accepting: once one connection waits
    // in its queue, the kernel drops further SYNs (the peer that silently drops SYNs).
    let l = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    bind(
        l.as_raw_fd(),
        &SockaddrIn::from("127.0.0.1:0".parse::<SocketAddrV4>().unwrap()),
    )
    .unwrap();
    listen(&l, Backlog::new(0).unwrap()).unwrap();
    let at: SocketAddrV4 = getsockname::<SockaddrIn>(l.as_raw_fd()).unwrap().into();
    let _queued = TcpStream::connect(at).unwrap();
    let closed = Arc::new(AtomicBool::new(false));
    let mut sp = spec(
        s,
        DomainId::A,
        Role::Active,
        SocketAddrV4::new("127.0.0.1".parse().unwrap(), a),
        at,
        Some(Arc::clone(&closed)),
    );
    sp.connect_for = Duration::from_millis(300);
    let leg = Leg::start(sp, Arc::clone(&routes), routes.ports()).unwrap();
    // The first SYN retry alone is 1 s after the first; the kernel gives up after ~127 s.
    wait("the leg to give up", || closed.load(SeqCst));
    assert_eq!(leg.counters().state(), LegState::Closed);
    assert_eq!(
        leg.counters().connects.load(SeqCst),
        0,
        "no SYN was answered"
    );
    drop(leg);
    routes.close_session(s).unwrap();
}

#[test]
fn active_leg_connects_and_a_stalled_peer_costs_drops_not_memory() {
    let routes = routes();
    let s = routes.open_session(SessionKind::Sip, "t");
    let b = routes.alloc_pair(s, DomainId::B).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.2:0").unwrap();
    let peer_at = match listener.local_addr().unwrap() {
        std::net::SocketAddr::V4(v) => v,
        _ => unreachable!(),
    };
    let local = SocketAddrV4::new("127.0.0.2".parse().unwrap(), b);
    let leg = Leg::start(
        spec(s, DomainId::B, Role::Active, local, peer_at, None),
        Arc::clone(&routes),
        routes.ports(),
    )
    .unwrap();
    let (conn, from) = listener.accept().unwrap();
    assert_eq!(
        from.ip().to_string(),
        "127.0.0.2",
        "connects from the gateway's address"
    );
    wait("connected", || {
        leg.counters().state() == LegState::Connected
    });
    // The peer never reads: offers are refused once the socket, the write buffer and the
    // sink are full; memory stays bounded by construction.
    let sink = Arc::clone(leg.sink());
    let (mut refused, mut offered) = (0u64, 0u64);
    for i in 0..200_000u32 {
        offered += 1;
        if !sink.offer(&rtp(i as u16, 1400)) {
            refused += 1;
        }
        if refused > 1000 {
            break;
        }
        if i % 64 == 0 {
            std::thread::yield_now();
        }
    }
    assert!(
        refused > 1000,
        "a peer that never reads ends in counted drops"
    );
    assert_eq!(leg.counters().stalls.load(SeqCst), refused);
    // Stopping the leg drops what its sink and write buffer still hold, counted: every
    // packet taken is either read whole by the peer or a stall.
    let c = Arc::clone(leg.counters());
    drop(leg);
    let mut conn = conn;
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut got = Vec::new();
    conn.read_to_end(&mut got).unwrap();
    let mut whole = 0u64;
    let mut at = 0;
    while let Some(h) = got.get(at..at + 2) {
        let end = at + 2 + usize::from(u16::from_be_bytes([h[0], h[1]]));
        if end > got.len() {
            break;
        }
        whole += 1;
        at = end;
    }
    let dropped_at_stop = c.stalls.load(SeqCst) - refused;
    assert_eq!(whole + dropped_at_stop, offered - refused);
    // Each packet counts once: `frames_out` is what the peer read whole, never also a
    // stall (a frame framed and then dropped unwritten at the stop is only a stall).
    assert_eq!(
        c.frames_out.load(SeqCst),
        whole,
        "frames_out counts whole writes"
    );
    assert_eq!(c.frames_out.load(SeqCst) + c.stalls.load(SeqCst), offered);
    assert_eq!(c.bytes_out.load(SeqCst), whole * 1400);
    routes.close_session(s).unwrap();
}

/// An injector kept between reads (an RTSP reader's leg cache) must not keep the egress
/// port's socket: the session's close returns at once and the port can be bound again,
/// even when the thread closing it is the one holding the injector.
#[test]
fn a_kept_injector_does_not_hold_a_closed_port() {
    let routes = routes();
    let s = routes.open_session(SessionKind::Rtsp, "t");
    let a = routes.alloc_pair(s, DomainId::A).unwrap();
    let b = routes.alloc_pair(s, DomainId::B).unwrap();
    let (viewer, viewer_at) = viewer();
    routes
        .add_route(
            s,
            RouteSpec {
                ingress: DomainId::A,
                port: a,
                dest: viewer_at,
                egress_port: b,
                policy: SourcePolicy::Any,
                expected: None,
                rtp_only: false,
                label: "fwd".into(),
                media: None,
            },
        )
        .unwrap();
    let mut inj = Injector::new(Arc::clone(&routes), routes.ports(), DomainId::A, a, 1472);
    let from: SocketAddrV4 = "127.0.0.1:9".parse().unwrap();
    for seq in 0..2 {
        let route = inj.route();
        let mut t = Tally::default();
        inj.forward(route.as_deref(), from, &rtp(seq, 80), 1, &mut t);
        inj.finish(route.as_deref(), &t, 1);
        assert_eq!(t.tx_packets, 1, "forwarded");
    }
    let mut buf = [0u8; 2048];
    for _ in 0..2 {
        let (n, from) = viewer.recv_from(&mut buf).unwrap();
        assert_eq!((n, from.to_string()), (80, format!("127.0.0.2:{b}")));
    }
    // Closed with the injector still alive on this thread.
    routes.close_session(s).unwrap();
    UdpSocket::bind(("127.0.0.2", b))
        .expect("the egress port is free once its session is closed, injector or not");
    UdpSocket::bind(("127.0.0.1", a)).expect("the ingress port is free too");
    // A packet after the close is dropped for want of a route, not sent.
    let route = inj.route();
    assert!(route.is_none());
    let mut t = Tally::default();
    inj.forward(route.as_deref(), from, &rtp(3, 80), 2, &mut t);
    assert_eq!(t.tx_packets, 0);
}

#[test]
fn a_passive_leg_drops_a_stranger_once_the_sdp_names_its_peer() {
    let routes = routes();
    let s = routes.open_session(SessionKind::Sip, "t");
    let a = routes.alloc_pair(s, DomainId::A).unwrap();
    let local = SocketAddrV4::new("127.0.0.1".parse().unwrap(), a);
    let mut sp = spec(
        s,
        DomainId::A,
        Role::Passive,
        local,
        "0.0.0.0:0".parse().unwrap(),
        None,
    );
    sp.within = Some(routes.domain(DomainId::A).clone());
    let leg = Leg::start(sp, Arc::clone(&routes), routes.ports()).unwrap();
    // Before any SDP named the peer: an address of the domain is taken.
    let early = TcpStream::connect(local).unwrap();
    wait("connected", || leg.counters().connects.load(SeqCst) == 1);
    // The answer names 127.0.0.3: the early connection is dropped, counted.
    leg.expect_peer("127.0.0.3".parse().unwrap());
    closed_by_the_leg(early, &leg, 1);
    // The named peer gets in.
    let sock = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Stream,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    use std::os::fd::AsRawFd;
    let from: SocketAddrV4 = "127.0.0.3:0".parse().unwrap();
    nix::sys::socket::bind(sock.as_raw_fd(), &nix::sys::socket::SockaddrIn::from(from)).unwrap();
    nix::sys::socket::connect(sock.as_raw_fd(), &nix::sys::socket::SockaddrIn::from(local))
        .unwrap();
    let _named = TcpStream::from(sock);
    wait("the named peer", || {
        leg.counters().connects.load(SeqCst) == 2
    });
    assert_eq!(leg.counters().state(), LegState::Connected);
    drop(leg);
    routes.close_session(s).unwrap();
}

/// A leg's packets are validated after de-framing, as a datagram's would be: on an
/// `enforce` route a de-framed packet of random bytes behind a valid RTP header is dropped
/// as `media_invalid` and counted by reason; a well-formed one crosses.
#[test]
fn a_legs_packets_are_media_validated() {
    let routes = routes();
    let s = routes.open_session(SessionKind::Sip, "t");
    let a = routes.alloc_pair(s, DomainId::A).unwrap();
    let b = routes.alloc_pair(s, DomainId::B).unwrap();
    let (viewer, viewer_at) = viewer();
    let rule = crate::media::Rule {
        enforce: true,
        spec: crate::media::StreamSpec::new(None).with(96, crate::media::Codec::H264, 90000),
        policy: Default::default(),
    };
    let route = routes
        .add_route(
            s,
            RouteSpec {
                ingress: DomainId::A,
                port: a,
                dest: viewer_at,
                egress_port: b,
                policy: SourcePolicy::Any,
                expected: None,
                rtp_only: false,
                label: "fwd".into(),
                media: Some(rule),
            },
        )
        .unwrap();
    let mut inj = Injector::new(Arc::clone(&routes), routes.ports(), DomainId::A, a, 1472);
    let from: SocketAddrV4 = "127.0.0.1:9".parse().unwrap();
    let packet = |seq: u16, nal: u8| {
        let mut p = rtp(seq, 40);
        p[1] = 0x80 | 96; // marker: one NAL per frame
        p[4..8].copy_from_slice(&(u32::from(seq) * 3000).to_be_bytes());
        p[12] = nal;
        // An SEI recovery point (the validator parses what follows the NAL header).
        p[13..17].copy_from_slice(&[0x06, 0x01, 0x84, 0x80]);
        p.truncate(17);
        p
    };
    let mut t = Tally::default();
    let r = inj.route();
    // An SEI NAL (allowed), then one with the forbidden bit set.
    inj.forward(r.as_deref(), from, &packet(1, 0x06), 1, &mut t);
    inj.forward(r.as_deref(), from, &packet(2, 0x86), 1, &mut t);
    inj.finish(r.as_deref(), &t, 1);
    assert_eq!(t.tx_packets, 1);
    assert_eq!(t.drops[DropReason::MediaInvalid as usize], 1);
    let m = route.stats.media.snapshot();
    assert_eq!(m.get(crate::media::Violation::NalForbiddenBit), 1);
    assert_eq!(
        routes.media_totals().channels[0]
            .snapshot()
            .get(crate::media::Violation::NalForbiddenBit),
        1
    );
    let mut buf = [0u8; 2048];
    let (n, _) = viewer.recv_from(&mut buf).unwrap();
    assert_eq!(buf[12], 0x06, "the well-formed one crossed ({n} bytes)");
    routes.close_session(s).unwrap();
}
