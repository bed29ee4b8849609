use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::config;

/// Two loopback domains with ten media ports each (A 127.0.0.1:20000-, B 127.0.0.2:30000-),
/// `latch` sources, plus `extra`.
pub(crate) fn cfg(extra: &str) -> Config {
    let text = format!(
        r#"
[domains.a]
interface = "lo"
address = "127.0.0.1"
media_ports = "20000-20009"
[domains.b]
interface = "lo"
address = "127.0.0.2"
media_ports = "30000-30009"
[security]
source_validation = "latch"
{extra}"#
    );
    config::parse(&text, "t").unwrap()
}

/// Counts open ports, refusing one port to exercise the error path.
#[derive(Default)]
struct CountingHooks {
    open: AtomicUsize,
    refuse: Option<u16>,
    /// A route on this (ingress) port is refused by `route_added`.
    refuse_route: Option<u16>,
}

impl PortHooks for CountingHooks {
    fn open_port(&self, _: DomainId, port: u16) -> std::io::Result<()> {
        if Some(port) == self.refuse {
            return Err(std::io::Error::from(std::io::ErrorKind::AddrInUse));
        }
        self.open.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn close_port(&self, _: DomainId, _: u16) {
        self.open.fetch_sub(1, Ordering::SeqCst);
    }
    fn route_added(&self, route: &Arc<StreamRoute>) -> std::io::Result<()> {
        if Some(route.port) == self.refuse_route {
            return Err(std::io::Error::other("map full"));
        }
        Ok(())
    }
}

fn spec(port: u16, egress: u16) -> RouteSpec {
    RouteSpec {
        ingress: DomainId::A,
        port,
        dest: "127.0.0.2:40000".parse().unwrap(),
        egress_port: egress,
        policy: SourcePolicy::Latch,
        expected: None,
        rtp_only: false,
        label: format!("r{port}"),
        media: None,
    }
}

#[test]
fn session_owns_and_frees_ports_and_routes() {
    let hooks = Arc::new(CountingHooks::default());
    let routes = Routes::new(&cfg(""), hooks.clone());
    let s = routes.open_session(SessionKind::Sip, "call-1");
    let a = routes.alloc_pair(s, DomainId::A).unwrap();
    let b = routes.alloc_pair(s, DomainId::B).unwrap();
    assert_eq!(hooks.open.load(Ordering::SeqCst), 4);
    routes.add_route(s, spec(a, b)).unwrap();
    let mut rev = spec(b + 1, a + 1);
    rev.ingress = DomainId::B;
    rev.dest = "127.0.0.1:5001".parse().unwrap();
    routes.add_route(s, rev).unwrap();
    assert!(routes.lookup(Channel::Forward, a).is_some());
    assert!(routes.lookup(Channel::Reverse, b + 1).is_some());
    assert_eq!(routes.ports(DomainId::A), (2, 8));

    let report = routes.close_session(s).unwrap();
    assert_eq!(report.routes.len(), 2);
    assert!(routes.lookup(Channel::Forward, a).is_none());
    assert_eq!(routes.ports(DomainId::A), (0, 10));
    assert_eq!(routes.ports(DomainId::B), (0, 10));
    assert_eq!(hooks.open.load(Ordering::SeqCst), 0);
    assert!(routes.sessions().is_empty());
    assert!(matches!(
        routes.close_session(s),
        Err(RouteError::NoSession(_))
    ));
}

#[test]
fn route_ports_must_belong_to_the_session() {
    let routes = Routes::new(&cfg(""), Arc::new(NoHooks));
    let s1 = routes.open_session(SessionKind::Sip, "1");
    let s2 = routes.open_session(SessionKind::Sip, "2");
    let a = routes.alloc_pair(s1, DomainId::A).unwrap();
    let b = routes.alloc_pair(s2, DomainId::B).unwrap();
    let e = routes.add_route(s1, spec(a, b)).unwrap_err();
    assert!(
        matches!(e, RouteError::NotOwned { port, .. } if port == b),
        "{e}"
    );
}

#[test]
fn duplicate_route_wrong_domain_and_strict_are_refused() {
    let routes = Routes::new(&cfg(""), Arc::new(NoHooks));
    let s = routes.open_session(SessionKind::Admin, "x");
    let a = routes.alloc_pair(s, DomainId::A).unwrap();
    let b = routes.alloc_pair(s, DomainId::B).unwrap();
    routes.add_route(s, spec(a, b)).unwrap();
    assert!(matches!(
        routes.add_route(s, spec(a, b)),
        Err(RouteError::Exists { .. })
    ));
    let mut wrong = spec(a + 1, b);
    wrong.dest = "127.0.0.1:9".parse().unwrap();
    assert!(matches!(
        routes.add_route(s, wrong),
        Err(RouteError::WrongDomain { .. })
    ));
    let mut strict = spec(a + 1, b);
    strict.policy = SourcePolicy::Strict;
    assert!(matches!(
        routes.add_route(s, strict),
        Err(RouteError::StrictWithoutSource)
    ));
}

#[test]
fn the_generation_moves_with_every_route_change_and_only_then() {
    // A data path keeps a port's route while the generation stays: it must move on every
    // add and remove (also a session's close), and not on anything else.
    let routes = Routes::new(&cfg(""), Arc::new(NoHooks));
    let g0 = routes.generation();
    let s = routes.open_session(SessionKind::Admin, "x");
    let a = routes.alloc_pair(s, DomainId::A).unwrap();
    let b = routes.alloc_pair(s, DomainId::B).unwrap();
    assert_eq!(routes.generation(), g0, "sessions and ports are not routes");
    routes.add_route(s, spec(a, b)).unwrap();
    let g1 = routes.generation();
    assert_ne!(g1, g0);
    assert!(routes.add_route(s, spec(a, b)).is_err());
    assert_eq!(routes.generation(), g1, "a refused add changes nothing");
    routes.remove_route(Channel::Forward, a).unwrap();
    let g2 = routes.generation();
    assert_ne!(g2, g1);
    routes.add_route(s, spec(a, b)).unwrap();
    let g3 = routes.generation();
    assert_ne!(g3, g2);
    routes.close_session(s).unwrap();
    assert_ne!(
        routes.generation(),
        g3,
        "closing a session removes its routes"
    );
}

#[test]
fn remove_route_keeps_ports_until_session_ends() {
    let routes = Routes::new(&cfg(""), Arc::new(NoHooks));
    let s = routes.open_session(SessionKind::Admin, "x");
    let a = routes.alloc_pair(s, DomainId::A).unwrap();
    let b = routes.alloc_pair(s, DomainId::B).unwrap();
    routes.add_route(s, spec(a, b)).unwrap();
    routes.remove_route(Channel::Forward, a).unwrap();
    assert!(routes.lookup(Channel::Forward, a).is_none());
    assert!(matches!(
        routes.remove_route(Channel::Forward, a),
        Err(RouteError::NoRoute { .. })
    ));
    assert_eq!(routes.session(s).unwrap().routes.len(), 0);
    assert_eq!(routes.ports(DomainId::A).0, 2);
    routes.close_session(s).unwrap();
    assert_eq!(routes.ports(DomainId::A).0, 0);
}

#[test]
fn exhaustion_is_reported_and_teardown_makes_room() {
    let routes = Routes::new(&cfg(""), Arc::new(NoHooks));
    let mut sessions = Vec::new();
    for i in 0..5 {
        let s = routes.open_session(SessionKind::Sip, format!("{i}"));
        routes.alloc_pair(s, DomainId::A).unwrap();
        sessions.push(s);
    }
    let extra = routes.open_session(SessionKind::Sip, "extra");
    let e = routes.alloc_pair(extra, DomainId::A).unwrap_err();
    assert!(
        matches!(
            e,
            RouteError::Ports {
                source: AllocError::Exhausted { .. },
                ..
            }
        ),
        "{e}"
    );
    routes.close_session(sessions[2]).unwrap();
    routes.alloc_pair(extra, DomainId::A).unwrap();
}

#[test]
fn a_port_the_system_refuses_is_skipped() {
    let hooks = Arc::new(CountingHooks {
        refuse: Some(20000),
        ..Default::default()
    });
    let routes = Routes::new(&cfg(""), hooks.clone());
    let s = routes.open_session(SessionKind::Sip, "x");
    assert_eq!(routes.alloc_pair(s, DomainId::A).unwrap(), 20002);
    let e = routes.reserve_port(s, DomainId::A, 20000).unwrap_err();
    assert!(matches!(e, RouteError::PortOpen { port: 20000, .. }), "{e}");
    assert!(!routes
        .session(s)
        .unwrap()
        .ports
        .contains(&(DomainId::A, 20000)));
    assert_eq!(routes.ports(DomainId::A).0, 2);
}

/// A route the engine cannot install (`route_added` fails: the XDP port map update) is
/// refused with the engine's reason and left out of the tables and the session.
#[test]
fn a_route_the_engine_refuses_is_not_installed() {
    let hooks = Arc::new(CountingHooks {
        refuse_route: Some(20000),
        ..Default::default()
    });
    let routes = Routes::new(&cfg(""), hooks.clone());
    let s = routes.open_session(SessionKind::Sip, "x");
    assert_eq!(routes.alloc_pair(s, DomainId::A).unwrap(), 20000);
    assert_eq!(routes.alloc_pair(s, DomainId::A).unwrap(), 20002);
    let b = routes.alloc_pair(s, DomainId::B).unwrap();
    let generation = routes.generation();
    let e = routes.add_route(s, spec(20000, b)).unwrap_err();
    assert!(
        matches!(e, RouteError::Install { port: 20000, .. }) && e.to_string().contains("map full"),
        "{e}"
    );
    assert!(routes.lookup(Channel::Forward, 20000).is_none());
    assert!(routes.session(s).unwrap().routes.is_empty());
    assert_ne!(routes.generation(), generation, "workers look again");
    routes.add_route(s, spec(20002, b)).unwrap();
    assert_eq!(routes.session(s).unwrap().routes.len(), 1);
    routes.close_session(s).unwrap();
}

#[test]
fn end_requests_are_seen_until_the_session_closes() {
    let routes = Routes::new(&cfg(""), Arc::new(NoHooks));
    let s = routes.open_session(SessionKind::Sip, "call");
    assert!(!routes.end_requested(s));
    routes.request_end(s).unwrap();
    assert!(routes.end_requested(s));
    routes.close_session(s).unwrap();
    assert!(!routes.end_requested(s));
    assert!(matches!(
        routes.request_end(s),
        Err(RouteError::NoSession(_))
    ));
}

#[test]
fn static_routes_are_installed_one_session_each() {
    let c = cfg(r#"
[[stream_route]]
name = "cam1"
domain = "a"
port = 20000
destination = "127.0.0.2:40000"
egress_port = 30000
[[stream_route]]
name = "talk"
domain = "b"
port = 30002
destination = "127.0.0.1:41000"
"#);
    let routes = Routes::new(&c, Arc::new(NoHooks));
    let ids = routes.install_static(&c).unwrap();
    assert_eq!(ids.len(), 2);
    let r = routes.lookup(Channel::Forward, 20000).unwrap();
    assert_eq!(r.egress_port, 30000);
    let t = routes.lookup(Channel::Reverse, 30002).unwrap();
    assert!(c.domain(DomainId::A).media_ports.contains(t.egress_port));
    assert_eq!(routes.routes().len(), 2);
}

/// The number of observations of the time-to-first-packet histogram of `kind`.
fn first_packets(routes: &Routes, kind: SessionKind) -> u64 {
    let (buckets, _) = routes.first_packet_histogram(kind).unwrap().snapshot();
    buckets.last().unwrap().1
}

#[test]
fn time_to_first_packet_is_counted_once_per_signaled_route() {
    let routes = Routes::new(&cfg(""), Arc::new(NoHooks));
    let call = routes.open_session(SessionKind::Sip, "call");
    let a = routes.alloc_pair(call, DomainId::A).unwrap();
    let b = routes.alloc_pair(call, DomainId::B).unwrap();
    let fwd = routes.add_route(call, spec(a, b)).unwrap();
    let quiet = routes.add_route(call, spec(a + 1, b + 1)).unwrap();
    let admin = routes.open_session(SessionKind::Admin, "admin");
    let a2 = routes.alloc_pair(admin, DomainId::A).unwrap();
    let b2 = routes.alloc_pair(admin, DomainId::B).unwrap();
    let untimed = routes.add_route(admin, spec(a2, b2)).unwrap();

    routes.count_first_packets();
    assert_eq!(first_packets(&routes, SessionKind::Sip), 0, "no packet yet");
    // The data path marks the first admitted packet (and every later one the same way).
    let now = crate::clock::now_ms();
    fwd.touch(now);
    fwd.touch(now + 5000);
    untimed.touch(now);
    routes.count_first_packets();
    routes.count_first_packets();
    assert_eq!(first_packets(&routes, SessionKind::Sip), 1);
    assert_eq!(first_packets(&routes, SessionKind::Rtsp), 0);
    assert!(routes.first_packet_histogram(SessionKind::Admin).is_none());
    // The first mark stays: the observation is from the first touch, well under 5 s.
    let (buckets, sum) = routes
        .first_packet_histogram(SessionKind::Sip)
        .unwrap()
        .snapshot();
    assert!(sum < 5.0, "{sum}");
    assert_eq!(buckets.iter().find(|b| b.0 == 5.0).unwrap().1, 1);

    // A route whose first packet came after the last count is counted at its removal;
    // a route that never had one is not counted at all.
    quiet.latch(0, "127.0.0.1:7000".parse().unwrap(), now);
    routes.close_session(call).unwrap();
    assert_eq!(first_packets(&routes, SessionKind::Sip), 2);
    let s = routes.open_session(SessionKind::Rtsp, "play");
    let a3 = routes.alloc_pair(s, DomainId::A).unwrap();
    let b3 = routes.alloc_pair(s, DomainId::B).unwrap();
    routes.add_route(s, spec(a3, b3)).unwrap();
    routes.close_session(s).unwrap();
    routes.count_first_packets();
    assert_eq!(first_packets(&routes, SessionKind::Sip), 2);
    assert_eq!(first_packets(&routes, SessionKind::Rtsp), 0);
}
