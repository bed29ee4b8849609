//! Unit tests of the call media: SDP crossing, TCP legs over loopback, route sets.

use std::sync::atomic::Ordering::Relaxed;

use super::*;
use crate::routes::legs::Role;
use crate::stats::leg::LegState;

/// Each call its own 24 ports per domain (a range starts even): the tests run in parallel,
/// each with its own port registry, and two of them listening for TCP legs on the same port
/// collided (503, address in use; seen in a CI run).
fn routes() -> crate::edge::tests::Loopback {
    static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    let k = NEXT.fetch_add(1, Relaxed) % 10;
    let (a, b) = (46000 + 24 * k, 45000 + 24 * k);
    crate::edge::tests::loopback_routes(&format!("{a}-{}", a + 23), &format!("{b}-{}", b + 23))
}

fn sdp(addr: &str, port: u16, proto: &str, extra: &str) -> Vec<u8> {
    format!(
        "v=0\r\no=- 1 1 IN IP4 {addr}\r\ns=Play\r\nc=IN IP4 {addr}\r\nt=0 0\r\nm=video {port} {proto} 96\r\na=rtpmap:96 PS/90000\r\n{extra}y=0100000001\r\nf=\r\n"
    )
    .into_bytes()
}

#[test]
fn tcp_offer_udp_answer_bridges_with_the_right_roles() {
    let routes = routes();
    let mut m = CallMedia::new("t".into(), 1472).with_legs(Some(routes.legs()));
    // The platform in B listens (passive) and offers TCP.
    let offer = sdp(
        "127.0.0.2",
        9000,
        "TCP/RTP/AVP",
        "a=recvonly\r\na=setup:passive\r\na=connection:new\r\n",
    );
    let to_a = m
        .cross(&routes, SourcePolicy::Strict, true, DomainId::B, &offer)
        .unwrap();
    let text = String::from_utf8(to_a).unwrap();
    assert!(text.contains("TCP/RTP/AVP 96"), "{text}");
    assert!(
        text.contains("a=setup:passive\r\na=connection:new\r\n"),
        "kept as offered"
    );
    assert!(text.contains("y=0100000001\r\nf=\r\n"));
    let slot = &m.slots[0];
    assert_eq!(
        slot.legs[0].as_ref().map(|l| l.role),
        Some(Role::Passive),
        "listens on A at once"
    );
    assert_eq!(
        slot.legs[1].as_ref().map(|l| l.role),
        Some(Role::Active),
        "connects to B's peer"
    );
    assert_eq!(routes.legs.len(), 2);
    // The device in A answers over UDP.
    let answer = sdp("127.0.0.1", 7000, "RTP/AVP", "a=sendonly\r\n");
    let to_b = m
        .cross(&routes, SourcePolicy::Strict, true, DomainId::A, &answer)
        .unwrap();
    let text = String::from_utf8(to_b).unwrap();
    assert!(
        text.contains("TCP/RTP/AVP 96"),
        "B keeps its transport: {text}"
    );
    assert!(
        text.contains("a=setup:active\r\na=connection:new\r\ny=0100000001"),
        "{text}"
    );
    assert!(!text.contains("127.0.0.1"));
    let slot = &m.slots[0];
    assert!(slot.legs[0].is_none(), "A is UDP now: its listener is gone");
    assert_eq!(routes.legs.len(), 1);
    assert_eq!(m.installed.len(), 1, "RTP only across a TCP side");
    let (spec, edge) = &m.installed[0];
    assert_eq!(
        (spec.ingress, spec.dest.to_string().as_str()),
        (DomainId::A, "127.0.0.2:9000")
    );
    assert!(edge.is_some(), "B's leg receives");
    m.close(&routes);
    assert_eq!(routes.legs.len(), 0);
    assert_eq!(routes.ports(DomainId::A).0, 0);
}

/// `body` (from [`sdp`]) with its `o=` version set to `version`.
fn versioned(mut body: Vec<u8>, version: u32) -> Vec<u8> {
    let at = body.windows(7).position(|w| w == b"o=- 1 1").unwrap();
    body.splice(at..at + 7, format!("o=- 1 {version}").into_bytes());
    body
}

#[test]
fn re_invites_keep_a_connected_leg_with_existing_and_reconnect_it_with_new() {
    let routes = routes();
    let mut m = CallMedia::new("t".into(), 1472).with_legs(Some(routes.legs()));
    // B's platform listens on loopback (this test's own listener).
    let listener = std::net::TcpListener::bind("127.0.0.2:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let b_offer = |version: u32, connection: &str| {
        let o = sdp(
            "127.0.0.2",
            port,
            "TCP/RTP/AVP",
            &format!("a=recvonly\r\na=setup:passive\r\na=connection:{connection}\r\n"),
        );
        versioned(o, version)
    };
    let a_sdp = |version: u32| {
        let s = sdp("127.0.0.1", 7000, "RTP/AVP", "a=sendonly\r\n");
        versioned(s, version)
    };
    let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
    m.cross(
        &routes,
        SourcePolicy::Strict,
        true,
        DomainId::B,
        &b_offer(1, "new"),
    )
    .unwrap();
    let to_b = m
        .cross(&routes, SourcePolicy::Strict, true, DomainId::A, &a_sdp(1))
        .unwrap();
    assert!(
        text(to_b).contains("a=setup:active\r\na=connection:new\r\n"),
        "nothing connected yet"
    );
    let (_conn, _) = listener.accept().unwrap();
    let counters = Arc::clone(m.slots[0].legs[1].as_ref().unwrap().leg.counters());
    let t = std::time::Instant::now();
    while counters.state() != LegState::Connected {
        assert!(t.elapsed() < Duration::from_secs(10), "B's leg connects");
        std::thread::sleep(Duration::from_millis(5));
    }
    // A's session refresh (a re-INVITE offer): B keeps its connection.
    let to_b = text(
        m.cross(&routes, SourcePolicy::Strict, true, DomainId::A, &a_sdp(2))
            .unwrap(),
    );
    assert!(
        to_b.contains("a=setup:active\r\na=connection:existing\r\n"),
        "{to_b}"
    );
    assert_eq!(to_b.matches("a=connection:").count(), 1, "{to_b}");
    m.cross(
        &routes,
        SourcePolicy::Strict,
        true,
        DomainId::B,
        &b_offer(2, "existing"),
    )
    .unwrap();
    // The same refresh body again after B answered: a new exchange, rewritten again.
    let again = text(
        m.cross(&routes, SourcePolicy::Strict, true, DomainId::A, &a_sdp(2))
            .unwrap(),
    );
    assert!(again.contains("a=connection:existing\r\n"), "{again}");
    // B's own re-INVITE asking for `existing`: answered `existing`; asking for `new`:
    // answered `new`.
    m.cross(
        &routes,
        SourcePolicy::Strict,
        true,
        DomainId::B,
        &b_offer(3, "existing"),
    )
    .unwrap();
    let to_b = text(
        m.cross(&routes, SourcePolicy::Strict, true, DomainId::A, &a_sdp(3))
            .unwrap(),
    );
    assert!(to_b.contains("a=connection:existing\r\n"), "{to_b}");
    assert_eq!(
        counters.connects.load(std::sync::atomic::Ordering::Relaxed),
        1,
        "`existing` kept the connection"
    );
    let first = m.slots[0].legs[1].as_ref().unwrap().leg.id();
    // B (listening) asks for `new`: RFC 4145 §5.1, a new connection. vgate's active leg
    // is replaced by one that connects again; the answer says `new`.
    m.cross(
        &routes,
        SourcePolicy::Strict,
        true,
        DomainId::B,
        &b_offer(4, "new"),
    )
    .unwrap();
    let to_b = text(
        m.cross(&routes, SourcePolicy::Strict, true, DomainId::A, &a_sdp(4))
            .unwrap(),
    );
    assert!(to_b.contains("a=connection:new\r\n"), "{to_b}");
    let second = m.slots[0].legs[1].as_ref().unwrap();
    assert_ne!(second.leg.id(), first, "a new leg");
    assert!(
        !routes.legs.list().iter().any(|l| l.id == first),
        "the old one closed"
    );
    listener.set_nonblocking(true).unwrap();
    let t = std::time::Instant::now();
    let _conn2 = loop {
        match listener.accept() {
            Ok((c, _)) => break c,
            Err(_) if t.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => panic!("vgate never connected again: {e}"),
        }
    };
    let counters = Arc::clone(second.leg.counters());
    while counters.state() != LegState::Connected {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the new leg connects"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // The same offer again (unchanged, so not a new one): the connection stays.
    let second = second.leg.id();
    m.cross(
        &routes,
        SourcePolicy::Strict,
        true,
        DomainId::B,
        &b_offer(4, "new"),
    )
    .unwrap();
    assert_eq!(m.slots[0].legs[1].as_ref().unwrap().leg.id(), second);
    m.close(&routes);
}

/// A call whose B side listens on this test's own listener (`a=setup:passive`), with
/// vgate's active leg connected to it: the call, the listener, the connection accepted.
fn connected_to_listening_b(
    routes: &crate::edge::tests::Loopback,
    close_grace: Duration,
    renew_min: Duration,
) -> (CallMedia, std::net::TcpListener, std::net::TcpStream) {
    let mut m = CallMedia::new("t".into(), 1472).with_legs(Some(routes.legs()));
    (m.close_grace, m.renew_min) = (close_grace, renew_min);
    let listener = std::net::TcpListener::bind("127.0.0.2:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let offer = b_listening(port, 1, "a=connection:new\r\n");
    m.cross(routes, SourcePolicy::Strict, true, DomainId::B, &offer)
        .unwrap();
    let answer = sdp("127.0.0.1", 7000, "RTP/AVP", "a=sendonly\r\n");
    m.cross(routes, SourcePolicy::Strict, true, DomainId::A, &answer)
        .unwrap();
    let (conn, _) = listener.accept().unwrap();
    let counters = Arc::clone(m.slots[0].legs[1].as_ref().unwrap().leg.counters());
    wait_for("B's leg connects", || {
        counters.state() == LegState::Connected
    });
    (m, listener, conn)
}

/// B's offer (it listens on `port`), `o=` version `version`, with `connection` lines.
fn b_listening(port: u16, version: u32, connection: &str) -> Vec<u8> {
    let extra = format!("a=recvonly\r\na=setup:passive\r\n{connection}");
    versioned(sdp("127.0.0.2", port, "TCP/RTP/AVP", &extra), version)
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t = std::time::Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(20), "{what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn b_leg_id(m: &CallMedia) -> u64 {
    m.slots[0].legs[1].as_ref().unwrap().leg.id()
}

#[test]
fn a_peer_close_before_its_new_connection_sdp_does_not_end_the_call() {
    let routes = routes();
    let hour = Duration::from_secs(3600);
    let (mut m, listener, conn) = connected_to_listening_b(&routes, hour, hour);
    let session = m.session.unwrap();
    let first = b_leg_id(&m);
    let counters = Arc::clone(m.slots[0].legs[1].as_ref().unwrap().leg.counters());
    // B closes the old connection before its `a=connection:new` re-INVITE arrives.
    drop(conn);
    wait_for("the leg sees the close", || {
        counters.state() != LegState::Connected
    });
    assert!(!routes.end_requested(session), "no BYE for a reconnect");
    assert!(!m.leg_closed(), "the call is not ended by the close");
    let port = listener.local_addr().unwrap().port();
    m.cross(
        &routes,
        SourcePolicy::Strict,
        true,
        DomainId::B,
        &b_listening(port, 2, "a=connection:new\r\n"),
    )
    .unwrap();
    assert_ne!(b_leg_id(&m), first, "replaced");
    assert!(
        !routes.end_requested(session),
        "the replaced leg told nobody"
    );
    let (_conn2, _) = listener.accept().unwrap();
    let counters = Arc::clone(m.slots[0].legs[1].as_ref().unwrap().leg.counters());
    wait_for("the new leg connects", || {
        counters.state() == LegState::Connected
    });
    m.close(&routes);

    // A close that no new SDP follows ends the call once the grace has passed.
    let (m, _listener, conn) = connected_to_listening_b(&routes, Duration::from_millis(50), hour);
    let session = m.session.unwrap();
    drop(conn);
    wait_for("the call ends", || {
        routes.end_requested(session) && m.leg_closed()
    });
}

#[test]
fn only_an_explicit_connection_new_reconnects_and_not_too_often() {
    let routes = routes();
    let hour = Duration::from_secs(3600);
    let (mut m, listener, _conn) = connected_to_listening_b(&routes, hour, hour);
    let port = listener.local_addr().unwrap().port();
    let first = b_leg_id(&m);
    let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
    // A changed SDP (a hold, a version bump) without `a=connection`: kept, and the answer
    // to it says so.
    m.cross(
        &routes,
        SourcePolicy::Strict,
        true,
        DomainId::B,
        &b_listening(port, 2, ""),
    )
    .unwrap();
    assert_eq!(b_leg_id(&m), first, "no a=connection: no reconnect");
    let answer = versioned(sdp("127.0.0.1", 7000, "RTP/AVP", "a=sendonly\r\n"), 2);
    let to_b = text(
        m.cross(&routes, SourcePolicy::Strict, true, DomainId::A, &answer)
            .unwrap(),
    );
    assert!(to_b.contains("a=connection:existing\r\n"), "{to_b}");
    // An explicit `new`: reconnected.
    m.cross(
        &routes,
        SourcePolicy::Strict,
        true,
        DomainId::B,
        &b_listening(port, 3, "a=connection:new\r\n"),
    )
    .unwrap();
    let second = b_leg_id(&m);
    assert_ne!(second, first, "`new` reconnects");
    let (_conn2, from) = listener.accept().unwrap();
    // From the gateway port, or (the old connection lingering) from the port pair the
    // call took from the registry for it: never an ephemeral port.
    let slot = &m.slots[0];
    let lease = slot.legs[1].as_ref().unwrap().fallback.as_ref().unwrap();
    assert!(
        [slot.ports[1], lease.port].contains(&from.port()),
        "{from} not from {} or {}",
        slot.ports[1],
        lease.port
    );
    let (lease_port, taken) = (lease.port, routes.ports(DomainId::B).0);
    // `new` again within `renew_min`: refused, counted, the connection kept.
    m.cross(
        &routes,
        SourcePolicy::Strict,
        true,
        DomainId::B,
        &b_listening(port, 4, "a=connection:new\r\n"),
    )
    .unwrap();
    assert_eq!(b_leg_id(&m), second, "bounded");
    let refused = m.slots[0].legs[1].as_ref().unwrap().leg.counters();
    assert_eq!(refused.renew_refused.load(Relaxed), 1, "counted");
    assert_eq!(refused.refused.load(Relaxed), 0, "not a refused connection");
    // The third `new`, once allowed again: the second leg's lease goes back with it.
    m.renew_min = Duration::ZERO;
    m.cross(
        &routes,
        SourcePolicy::Strict,
        true,
        DomainId::B,
        &b_listening(port, 5, "a=connection:new\r\n"),
    )
    .unwrap();
    let slot = &m.slots[0];
    let lease = slot.legs[1].as_ref().unwrap().fallback.as_ref().unwrap();
    assert_ne!(lease.port, lease_port);
    assert_eq!(routes.ports(DomainId::B).0, taken, "one lease at a time");
    m.close(&routes);
    assert_eq!(routes.ports(DomainId::B).0, 0, "all given back");
}

#[test]
fn a_holdconn_offer_is_answered_holdconn_and_opens_no_leg() {
    let routes = routes();
    let mut m = CallMedia::new("t".into(), 1472).with_legs(Some(routes.legs()));
    let offer = sdp(
        "127.0.0.2",
        9004,
        "TCP/RTP/AVP",
        "a=recvonly\r\na=setup:holdconn\r\na=connection:new\r\n",
    );
    m.cross(&routes, SourcePolicy::Strict, true, DomainId::B, &offer)
        .unwrap();
    let answer = sdp("127.0.0.1", 7004, "RTP/AVP", "a=sendonly\r\n");
    let to_b = m
        .cross(&routes, SourcePolicy::Strict, true, DomainId::A, &answer)
        .unwrap();
    let text = String::from_utf8(to_b).unwrap();
    assert!(text.contains("TCP/RTP/AVP 96"), "{text}");
    assert!(text.contains("a=setup:holdconn\r\n"), "{text}");
    assert!(!text.contains("a=setup:passive"), "{text}");
    assert!(m.slots[0].legs.iter().all(Option::is_none));
    assert_eq!(routes.legs.len(), 0, "no listener for a held connection");
    m.close(&routes);
}

#[test]
fn the_split_link_face_always_gets_udp() {
    let routes = routes();
    // A half whose link face is B: the device in A offers TCP (it listens).
    let mut m = CallMedia::new("t".into(), 1472)
        .with_legs(Some(routes.legs()))
        .with_link_face(Some(DomainId::B));
    let offer = sdp(
        "127.0.0.1",
        7010,
        "TCP/RTP/AVP",
        "a=sendonly\r\na=setup:passive\r\na=connection:new\r\n",
    );
    let to_face = String::from_utf8(
        m.cross(&routes, SourcePolicy::Strict, true, DomainId::A, &offer)
            .unwrap(),
    )
    .unwrap();
    assert!(to_face.contains(" RTP/AVP 96"), "{to_face}");
    assert!(
        !to_face.contains("TCP")
            && !to_face.contains("a=setup")
            && !to_face.contains("a=connection"),
        "{to_face}"
    );
    assert!(m.slots[0].legs[1].is_none(), "no leg on the link face");
    // The other half answers over UDP; the device's side connects to it.
    let answer = sdp("127.0.0.2", 9010, "RTP/AVP", "a=recvonly\r\n");
    let to_a = String::from_utf8(
        m.cross(&routes, SourcePolicy::Strict, true, DomainId::B, &answer)
            .unwrap(),
    )
    .unwrap();
    assert!(
        to_a.contains("TCP/RTP/AVP 96") && to_a.contains("a=setup:active"),
        "{to_a}"
    );
    assert_eq!(
        m.slots[0].legs[0].as_ref().map(|l| l.role),
        Some(Role::Active)
    );
    assert_eq!(m.installed.len(), 1);
    assert!(m.installed[0].1.is_none(), "the face side is UDP");
    m.close(&routes);
    // TCP from the link face is refused: it would ride the signaling link.
    let mut m = CallMedia::new("t2".into(), 1472)
        .with_legs(Some(routes.legs()))
        .with_link_face(Some(DomainId::B));
    let offer = sdp("127.0.0.2", 9012, "TCP/RTP/AVP", "a=recvonly\r\n");
    let Err(MediaError::Refuse { code, warning, .. }) =
        m.cross(&routes, SourcePolicy::Strict, true, DomainId::B, &offer)
    else {
        panic!("TCP from the link face must be refused");
    };
    assert_eq!(code, 488);
    assert!(warning.contains("link face"), "{warning}");
    assert_eq!(routes.legs.len(), 0);
}

#[test]
fn udp_offer_tcp_answer_and_tcp_both_sides() {
    let routes = routes();
    let mut m = CallMedia::new("t".into(), 1472).with_legs(Some(routes.legs()));
    let offer = sdp("127.0.0.2", 9002, "RTP/AVP", "a=recvonly\r\n");
    let to_a = m
        .cross(&routes, SourcePolicy::Strict, true, DomainId::B, &offer)
        .unwrap();
    assert!(String::from_utf8(to_a).unwrap().contains("RTP/AVP 96"));
    assert_eq!(routes.legs.len(), 0);
    // The device answers TCP, active (it will connect).
    let answer = sdp(
        "127.0.0.1",
        7002,
        "TCP/RTP/AVP",
        "a=sendonly\r\na=setup:active\r\na=connection:new\r\n",
    );
    let to_b = String::from_utf8(
        m.cross(&routes, SourcePolicy::Strict, true, DomainId::A, &answer)
            .unwrap(),
    )
    .unwrap();
    assert!(to_b.contains("m=video") && to_b.contains(" RTP/AVP 96"));
    assert!(
        !to_b.contains("a=setup") && !to_b.contains("a=connection"),
        "{to_b}"
    );
    assert_eq!(
        m.slots[0].legs[0].as_ref().map(|l| l.role),
        Some(Role::Passive)
    );
    assert_eq!(m.installed.len(), 1);
    assert!(m.installed[0].1.is_none(), "B is UDP");
    m.close(&routes);

    // TCP both sides, actpass offer: the answer's role decides both legs.
    let mut m = CallMedia::new("t2".into(), 1472).with_legs(Some(routes.legs()));
    let offer = sdp(
        "127.0.0.2",
        9004,
        "TCP/RTP/AVP",
        "a=recvonly\r\na=setup:actpass\r\na=connection:new\r\n",
    );
    m.cross(&routes, SourcePolicy::Strict, true, DomainId::B, &offer)
        .unwrap();
    assert_eq!(
        m.slots[0].legs[0].as_ref().map(|l| l.role),
        Some(Role::Passive)
    );
    assert!(
        m.slots[0].legs[1].is_none(),
        "B's role waits for the answer"
    );
    let answer = sdp(
        "127.0.0.1",
        7004,
        "TCP/RTP/AVP",
        "a=sendonly\r\na=setup:passive\r\na=connection:new\r\n",
    );
    let to_b = String::from_utf8(
        m.cross(&routes, SourcePolicy::Strict, true, DomainId::A, &answer)
            .unwrap(),
    )
    .unwrap();
    assert!(
        to_b.contains("a=setup:passive\r\n"),
        "crosses byte for byte"
    );
    let roles = m.slots[0]
        .legs
        .each_ref()
        .map(|l| l.as_ref().map(|l| l.role));
    assert_eq!(roles, [Some(Role::Active), Some(Role::Passive)]);
    assert!(m.installed[0].1.is_some());
    m.close(&routes);
    assert_eq!(routes.legs.len(), 0);
}

#[test]
fn rtp_routes_validate_what_the_sdps_negotiated() {
    use crate::media::Codec;
    let routes = routes();
    let mut m = CallMedia::new("t".into(), 1472)
        .with_legs(Some(routes.legs()))
        .with_media_validation(crate::config::MediaMode::Enforce, Default::default());
    // The platform in B receives PS (y= names the SSRC); the device in A sends.
    let offer = sdp("127.0.0.2", 9000, "RTP/AVP", "a=recvonly\r\n");
    m.cross(&routes, SourcePolicy::Strict, true, DomainId::B, &offer)
        .unwrap();
    let answer = sdp("127.0.0.1", 7000, "RTP/AVP", "a=sendonly\r\n");
    m.cross(&routes, SourcePolicy::Strict, true, DomainId::A, &answer)
        .unwrap();
    let rtp: Vec<_> = m
        .installed
        .iter()
        .filter(|(s, _)| s.label.ends_with(" rtp"))
        .collect();
    assert_eq!(rtp.len(), 1);
    let rule = rtp[0].0.media.expect("the RTP route validates");
    assert!(rule.enforce);
    assert_eq!(rule.spec.ssrc, Some(100000001), "y=");
    let f = rule.spec.formats();
    assert_eq!(
        (f.len(), f[0].pt, f[0].codec, f[0].clock_rate),
        (1, 96, Codec::Ps, 90000)
    );
    assert!(
        m.installed
            .iter()
            .filter(|(s, _)| !s.label.ends_with(" rtp"))
            .all(|(s, _)| s.media.is_some_and(|r| r.spec.rtcp)),
        "RTCP routes validate RTCP"
    );
    // The live route carries the rule to the data path.
    let live = routes
        .lookup(Channel::Forward, rtp[0].0.port)
        .expect("installed");
    assert_eq!(live.media, Some(rule));
    m.close(&routes);
}

/// A call's slots through the state store (JSON), restored in a copy of the call that holds
/// the original's session and routes (as after a takeover): a re-INVITE from either side
/// crosses onto the same gateway ports and installs nothing new; the copy's own SDP then
/// wins over a late record.
#[test]
fn restored_slots_give_a_re_invite_the_same_ports_and_routes() {
    let routes = routes();
    let validation = |m: CallMedia| {
        m.with_media_validation(crate::config::MediaMode::Enforce, Default::default())
    };
    let mut m = validation(CallMedia::new("c".into(), 1472));
    let offer = sdp("127.0.0.2", 9000, "RTP/AVP", "a=recvonly\r\n");
    let to_a = m
        .cross(&routes, SourcePolicy::Latch, true, DomainId::B, &offer)
        .unwrap();
    let answer = sdp("127.0.0.1", 7000, "RTP/AVP", "a=sendonly\r\n");
    let to_b = m
        .cross(&routes, SourcePolicy::Latch, true, DomainId::A, &answer)
        .unwrap();
    assert!(!m.installed.is_empty());
    let json = serde_json::to_string(&m.slot_records()).unwrap();
    let recs: Vec<SlotRecord> = serde_json::from_str(&json).unwrap();
    assert_eq!(recs, m.slot_records());

    // The copy: the original's session and routes (the HA thread's), the slots restored.
    let mut copy = validation(CallMedia::new("c".into(), 1472));
    copy.session = m.session;
    copy.installed = m.installed.clone();
    assert_eq!(copy.restore_slots(&recs), Ok(true));
    assert_eq!(copy.slots[0].ports, m.slots[0].ports);
    let ports_before = routes.session(m.session.unwrap()).unwrap().ports;
    // Re-INVITE from B (a new SDP version), answered from A.
    let reoffer = String::from_utf8(offer)
        .unwrap()
        .replace("o=- 1 1", "o=- 1 2")
        .into_bytes();
    let again_a = copy
        .cross(&routes, SourcePolicy::Latch, true, DomainId::B, &reoffer)
        .unwrap();
    let reanswer = String::from_utf8(answer)
        .unwrap()
        .replace("o=- 1 1", "o=- 1 2")
        .into_bytes();
    let again_b = copy
        .cross(&routes, SourcePolicy::Latch, true, DomainId::A, &reanswer)
        .unwrap();
    let m_line = |b: &[u8]| {
        String::from_utf8_lossy(b)
            .lines()
            .find(|l| l.starts_with("m="))
            .unwrap()
            .to_string()
    };
    assert_eq!(
        m_line(&again_a),
        m_line(&to_a),
        "A sees the same gateway port"
    );
    assert_eq!(
        m_line(&again_b),
        m_line(&to_b),
        "B sees the same gateway port"
    );
    let specs = |v: &[(RouteSpec, Option<Arc<EdgeSink>>)]| {
        let mut s: Vec<String> = v.iter().map(|(s, _)| format!("{s:?}")).collect();
        s.sort();
        s
    };
    assert_eq!(
        specs(&copy.installed),
        specs(&m.installed),
        "the same routes"
    );
    assert_eq!(
        routes.session(m.session.unwrap()).unwrap().ports,
        ports_before,
        "no port taken"
    );
    // A re-INVITE from A the other way (the device's), on the same ports too.
    let from_a = String::from_utf8(reanswer)
        .unwrap()
        .replace("o=- 1 2", "o=- 1 3")
        .into_bytes();
    let out = copy
        .cross(&routes, SourcePolicy::Latch, true, DomainId::A, &from_a)
        .unwrap();
    assert_eq!(m_line(&out), m_line(&to_b));
    // Its SDP crossed here: a late record does not replace its slots.
    assert_eq!(copy.restore_slots(&[]), Ok(false));
    assert_eq!(copy.slots.len(), 1);
    // A record this build cannot read is refused, the slots unchanged.
    let mut fresh = validation(CallMedia::new("c".into(), 1472));
    let mut bad = recs.clone();
    bad[0].peer[0].as_mut().unwrap().direction = "sideways".into();
    assert!(fresh.restore_slots(&bad).unwrap_err().contains("sideways"));
    assert!(fresh.slots.is_empty());
}
