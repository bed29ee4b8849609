//! Two agents on loopback, with sockets standing in for the proxies of each half. Each half
//! uses its own pair of face addresses (frames carry ports only), so both fit in one
//! namespace. Every wait is for a condition, with a generous bound.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::frame::{Hello, Keys, Role, Sealer, HELLO_LEN};
use super::{Agent, AgentConfig, PeerEvents};
use crate::config::split_signal::{SignalKey, SignalLink};

const KEY: &[u8; 32] = b"split test key, 32 bytes long!!!";

struct Ended(Arc<AtomicUsize>);

impl PeerEvents for Ended {
    fn end_sessions(&self, _why: &str) -> usize {
        self.0.fetch_add(1, Relaxed);
        2
    }
}

fn wait(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A free TCP port on `ip` (bound then released; the agents bind it right after).
fn free_port(ip: Ipv4Addr) -> u16 {
    TcpListener::bind(SocketAddrV4::new(ip, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Addresses of one test: `n` keeps concurrent tests apart.
struct Bed {
    sig_a: Ipv4Addr,
    sig_b: Ipv4Addr,
    sig_port: u16,
    /// Half A's faces (own, peer) and half B's.
    a: (Ipv4Addr, Ipv4Addr),
    b: (Ipv4Addr, Ipv4Addr),
}

impl Bed {
    fn new(n: u8) -> Bed {
        let sig_b = Ipv4Addr::new(127, 88, n, 2);
        Bed {
            sig_a: Ipv4Addr::new(127, 88, n, 1),
            sig_b,
            sig_port: free_port(sig_b),
            a: (Ipv4Addr::new(127, 77, n, 1), Ipv4Addr::new(127, 77, n, 2)),
            b: (Ipv4Addr::new(127, 78, n, 2), Ipv4Addr::new(127, 78, n, 1)),
        }
    }

    fn link(&self, role: Role, key: &[u8]) -> SignalLink {
        let (local, peer) = match role {
            Role::Dialer => (
                SocketAddrV4::new(self.sig_a, 0),
                SocketAddrV4::new(self.sig_b, self.sig_port),
            ),
            Role::Listener => (
                SocketAddrV4::new(self.sig_b, self.sig_port),
                SocketAddrV4::new(self.sig_a, 0),
            ),
        };
        SignalLink {
            interface: String::new(),
            local,
            peer,
            key: SignalKey::new(key.to_vec()),
            heartbeat: Duration::from_millis(100),
            dead_after: Duration::from_millis(600),
        }
    }

    fn agent(&self, role: Role, udp: Vec<u16>, tcp: Vec<u16>, ended: &Arc<AtomicUsize>) -> Agent {
        let (own_face, peer_face) = match role {
            Role::Dialer => self.a,
            Role::Listener => self.b,
        };
        let cfg = AgentConfig {
            link: self.link(role, KEY),
            role,
            own_face,
            peer_face,
            face_interface: String::new(),
        };
        Agent::start(cfg, Box::new(Ended(Arc::clone(ended))), udp, tcp).unwrap()
    }
}

fn counters() -> Arc<AtomicUsize> {
    Arc::new(AtomicUsize::new(0))
}

#[test]
fn udp_and_tcp_cross_and_answers_come_back() {
    let bed = Bed::new(11);
    // Half B's "proxy": a UDP socket and a TCP listener on its own face address.
    let b_udp = UdpSocket::bind(SocketAddrV4::new(bed.b.0, 0)).unwrap();
    let b_tcp = TcpListener::bind(SocketAddrV4::new(bed.b.0, 0)).unwrap();
    let (pu, pt) = (
        b_udp.local_addr().unwrap().port(),
        b_tcp.local_addr().unwrap().port(),
    );
    let (ea, eb) = (counters(), counters());
    let agent_b = bed.agent(Role::Listener, vec![pu], vec![pt], &eb);
    let agent_a = bed.agent(Role::Dialer, vec![], vec![], &ea);
    wait("both peers are up", || {
        agent_a.peer_up() && agent_b.peer_up()
    });

    // UDP: half A's proxy sends to the peer's face address, the datagram arrives at half B
    // from half A's face address as half B sees it, with the same source port.
    let a_udp = UdpSocket::bind(SocketAddrV4::new(bed.a.0, 0)).unwrap();
    a_udp
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    b_udp
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let a_port = a_udp.local_addr().unwrap().port();
    let to_b = SocketAddrV4::new(bed.a.1, pu);
    let mut buf = [0u8; 2048];
    // The peer's listeners open when its announcement arrives; resend until one gets through.
    let mut got = None;
    for _ in 0..100 {
        a_udp.send_to(b"REGISTER", to_b).unwrap();
        b_udp
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        if let Ok((n, from)) = b_udp.recv_from(&mut buf) {
            got = Some((buf[..n].to_vec(), from));
            break;
        }
    }
    let (data, from) = got.expect("a datagram crossed");
    assert_eq!(data, b"REGISTER");
    assert_eq!(from, SocketAddrV4::new(bed.b.1, a_port).into());
    b_udp.send_to(b"200 OK", from).unwrap();
    let (n, from) = a_udp.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"200 OK");
    assert_eq!(from, to_b.into());

    // TCP both ways on one connection, then its end is seen on the far side.
    let mut a_conn = super::agent_test_connect(bed.a.0, SocketAddrV4::new(bed.a.1, pt));
    a_conn
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    b_tcp.set_nonblocking(true).unwrap();
    let mut accepted = None;
    wait("the stream reaches half B", || {
        accepted = b_tcp.accept().ok();
        accepted.is_some()
    });
    let (mut b_conn, b_from) = accepted.unwrap();
    b_conn.set_nonblocking(false).unwrap();
    assert_eq!(
        *match b_from {
            std::net::SocketAddr::V4(a) => a,
            _ => unreachable!(),
        }
        .ip(),
        bed.b.1
    );
    b_conn
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let big: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
    a_conn.write_all(&big).unwrap();
    let mut recv = vec![0u8; big.len()];
    b_conn.read_exact(&mut recv).unwrap();
    assert_eq!(recv, big);
    b_conn.write_all(b"RTSP/1.0 200 OK\r\n\r\n").unwrap();
    let mut r = [0u8; 19];
    a_conn.read_exact(&mut r).unwrap();
    assert_eq!(&r, b"RTSP/1.0 200 OK\r\n\r\n");
    drop(a_conn);
    assert_eq!(b_conn.read(&mut r).unwrap(), 0, "the close crossed");

    let (sa, sb) = (&agent_a.stats, &agent_b.stats);
    assert!(sa.udp_out.load(Relaxed) >= 1 && sb.udp_in.load(Relaxed) >= 1);
    assert_eq!(sb.udp_out.load(Relaxed), 1);
    assert_eq!(sa.udp_in.load(Relaxed), 1);
    for s in [sa, sb] {
        assert_eq!(s.auth_failures.load(Relaxed), 0);
        assert_eq!(s.replays.load(Relaxed), 0);
        assert_eq!(s.resets.load(Relaxed), 0);
        assert_eq!(s.peer_lost.load(Relaxed), 0);
    }
    assert_eq!(ea.load(Relaxed) + eb.load(Relaxed), 0);
}

#[test]
fn a_stopped_peer_ends_sessions_and_a_restarted_one_is_counted() {
    let bed = Bed::new(12);
    let (ea, eb) = (counters(), counters());
    let agent_a = bed.agent(Role::Dialer, vec![], vec![], &ea);
    let agent_b = bed.agent(Role::Listener, vec![], vec![], &eb);
    wait("peer up", || agent_a.peer_up());
    let hb = agent_a.stats.heartbeats_in.load(Relaxed);
    wait("heartbeats arrive", || {
        agent_a.stats.heartbeats_in.load(Relaxed) >= hb + 3
    });
    drop(agent_b);
    wait("sessions ended on half A", || ea.load(Relaxed) == 1);
    assert!(!agent_a.peer_up());
    assert_eq!(agent_a.stats.sessions_ended.load(Relaxed), 2);
    assert_eq!(agent_a.stats.peer_lost.load(Relaxed), 1);
    let agent_b = bed.agent(Role::Listener, vec![], vec![], &eb);
    wait("peer up again", || agent_a.peer_up() && agent_b.peer_up());
    assert_eq!(agent_a.stats.peer_restarts.load(Relaxed), 1);
    assert_eq!(ea.load(Relaxed), 1, "sessions are ended once per outage");
}

/// A node of a hot-standby pair, as the gateway tells its agent ([`PeerEvents`]).
#[derive(Clone, Default)]
struct PairNode {
    ended: Arc<AtomicUsize>,
    standby: Arc<std::sync::atomic::AtomicBool>,
    /// What the pair's state store holds (shared by both nodes: a Redis and its replica).
    store: Arc<std::sync::Mutex<Option<[u8; 16]>>>,
}

impl PeerEvents for PairNode {
    fn end_sessions(&self, _why: &str) -> usize {
        self.ended.fetch_add(1, Relaxed);
        1
    }
    fn paired(&self) -> bool {
        true
    }
    fn standby(&self) -> bool {
        self.standby.load(Relaxed)
    }
    fn inherited_instance(&self) -> Option<[u8; 16]> {
        *self.store.lock().unwrap()
    }
    fn presenting(&self, instance: [u8; 16]) {
        // Only the active's record reaches the store.
        if !self.standby.load(Relaxed) {
            *self.store.lock().unwrap() = Some(instance);
        }
    }
}

impl Bed {
    fn pair_node(&self, node: &PairNode) -> Agent {
        let cfg = AgentConfig {
            link: self.link(Role::Dialer, KEY),
            role: Role::Dialer,
            own_face: self.a.0,
            peer_face: self.a.1,
            face_interface: String::new(),
        };
        Agent::start(cfg, Box::new(node.clone()), vec![], vec![]).unwrap()
    }
}

#[test]
fn a_pair_s_takeover_keeps_the_peer_s_sessions_and_a_restart_of_the_pair_ends_them() {
    let bed = Bed::new(16);
    let eb = counters();
    let agent_b = bed.agent(Role::Listener, vec![], vec![], &eb);
    let store = Arc::new(std::sync::Mutex::new(None));
    let node = |standby: bool| PairNode {
        standby: Arc::new(std::sync::atomic::AtomicBool::new(standby)),
        store: Arc::clone(&store),
        ..PairNode::default()
    };
    let (n1, n2) = (node(false), node(true));
    let a1 = bed.pair_node(&n1);
    let a2 = bed.pair_node(&n2);
    wait("half B sees half A's active", || agent_b.peer_up());
    wait("the active's id in the store", || {
        store.lock().unwrap().is_some()
    });
    // The standby neither dials nor ends anything while the active holds the link.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(agent_b.stats.connects.load(Relaxed), 1);
    assert!(!a2.peer_up());

    // The active dies without a goodbye (a pair's node says none); the standby takes over
    // within dead_after and presents the pair's id: half B ends nothing.
    drop(a1);
    n2.standby.store(false, Relaxed);
    wait("half B sees the new active", || {
        agent_b.stats.connects.load(Relaxed) == 2 && agent_b.peer_up() && a2.peer_up()
    });
    let sb = &agent_b.stats;
    assert_eq!(sb.peer_resumed.load(Relaxed), 1);
    assert_eq!(sb.peer_restarts.load(Relaxed), 0);
    assert_eq!(sb.peer_lost.load(Relaxed), 0);
    assert_eq!(
        eb.load(Relaxed),
        0,
        "half B ended no session at the takeover"
    );
    assert_eq!(a2.stats.identity_inherited.load(Relaxed), 1);
    assert_eq!(n1.ended.load(Relaxed) + n2.ended.load(Relaxed), 0);

    // The whole pair restarts with its state lost: a new id, a restart for half B, which
    // ends its sessions (within dead_after or by it: either way once).
    drop(a2);
    *store.lock().unwrap() = None;
    let n3 = node(false);
    let a3 = bed.pair_node(&n3);
    wait("half B sees the restarted half", || {
        sb.connects.load(Relaxed) == 3 && agent_b.peer_up() && a3.peer_up()
    });
    assert_eq!(sb.peer_restarts.load(Relaxed), 1);
    assert_eq!(eb.load(Relaxed), 1);
    assert_eq!(a3.stats.identity_inherited.load(Relaxed), 0);

    // The active is demoted with no other node to take over: it drops the link and ends
    // nothing itself; half B, left without a peer for dead_after, ends its sessions.
    n3.standby.store(true, Relaxed);
    wait("half B loses its peer", || eb.load(Relaxed) == 2);
    assert!(!a3.peer_up());
    assert_eq!(n3.ended.load(Relaxed), 0, "a standby ends nothing");
}

#[test]
fn a_silent_peer_is_lost_after_dead_after() {
    let bed = Bed::new(13);
    let ea = counters();
    let agent_a = bed.agent(Role::Dialer, vec![], vec![], &ea);
    // A listener that authenticates and then says nothing more.
    let l = TcpListener::bind(SocketAddrV4::new(bed.sig_b, bed.sig_port)).unwrap();
    let (mut s, _) = l.accept().unwrap();
    let ours = Hello {
        role: Role::Listener,
        instance: [5; 16],
        nonce: [6; 32],
    };
    s.write_all(&ours.encode()).unwrap();
    let mut h = [0u8; HELLO_LEN];
    s.read_exact(&mut h).unwrap();
    let theirs = Hello::parse(&h).unwrap();
    let keys = Keys::derive(KEY, &ours, &theirs).unwrap();
    let mut out = Vec::new();
    Sealer::new(keys.send).announce(&mut out, &[], &[]);
    s.write_all(&out).unwrap();
    wait("peer up", || agent_a.peer_up());
    wait("the silent peer is lost", || ea.load(Relaxed) == 1);
    assert!(!agent_a.peer_up());
    assert_eq!(agent_a.stats.peer_lost.load(Relaxed), 1);
}

/// Connects to the listening agent from `from` and sends `bytes`.
fn poke(from: Ipv4Addr, to: SocketAddrV4, bytes: &[u8]) -> TcpStream {
    let s = super::agent_test_connect(from, to);
    let mut s = s;
    let _ = s.write_all(bytes);
    s
}

#[test]
fn strangers_garbage_forgeries_and_truncation_are_refused_and_counted() {
    let bed = Bed::new(14);
    let (ea, eb) = (counters(), counters());
    let agent_b = bed.agent(Role::Listener, vec![], vec![], &eb);
    let agent_a = bed.agent(Role::Dialer, vec![], vec![], &ea);
    wait("peer up", || agent_a.peer_up() && agent_b.peer_up());
    let to = SocketAddrV4::new(bed.sig_b, bed.sig_port);
    let st = &agent_b.stats;

    // From an address other than the peer's.
    let _s = poke(Ipv4Addr::new(127, 88, 14, 9), to, b"hello");
    wait("stranger refused", || st.refused.load(Relaxed) >= 1);

    // From the peer's address, but not vgate.
    let _s = poke(bed.sig_a, to, b"GET / HTTP/1.0\r\n\r\n");
    wait("garbage refused", || st.refused.load(Relaxed) >= 2);

    // A good hello, then a frame sealed with another key.
    let mut s = poke(bed.sig_a, to, &[]);
    let ours = Hello {
        role: Role::Dialer,
        instance: [1; 16],
        nonce: [2; 32],
    };
    s.write_all(&ours.encode()).unwrap();
    let mut h = [0u8; HELLO_LEN];
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.read_exact(&mut h).unwrap();
    let theirs = Hello::parse(&h).unwrap();
    let keys = Keys::derive(b"a forger's key, also 32 bytes!!!", &ours, &theirs).unwrap();
    let mut out = Vec::new();
    Sealer::new(keys.send).announce(&mut out, &[9], &[]);
    s.write_all(&out).unwrap();
    wait("forgery counted", || st.auth_failures.load(Relaxed) == 1);

    // A good hello, then half a frame and the end of the connection.
    let mut s = poke(bed.sig_a, to, &[]);
    let ours = Hello {
        role: Role::Dialer,
        instance: [1; 16],
        nonce: [3; 32],
    };
    s.write_all(&ours.encode()).unwrap();
    s.read_exact(&mut h).unwrap();
    let theirs = Hello::parse(&h).unwrap();
    let keys = Keys::derive(KEY, &ours, &theirs).unwrap();
    let mut out = Vec::new();
    Sealer::new(keys.send).announce(&mut out, &[9], &[]);
    s.write_all(&out[..out.len() - 5]).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    wait("truncation counted", || st.truncated.load(Relaxed) == 1);

    // None of that disturbed the real peer.
    assert!(agent_a.peer_up() && agent_b.peer_up());
    assert_eq!(agent_b.stats.connects.load(Relaxed), 1);
    assert_eq!(ea.load(Relaxed) + eb.load(Relaxed), 0);
}

#[test]
fn a_replayed_frame_resets_the_connection_and_it_comes_back() {
    // Half A dials a relay that forwards both ways and, once, sends one of A's frames twice.
    let bed = Bed::new(15);
    let (ea, eb) = (counters(), counters());
    let agent_b = bed.agent(Role::Listener, vec![], vec![], &eb);
    let relay = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::new(127, 88, 15, 3), 0)).unwrap();
    let relay_addr = match relay.local_addr().unwrap() {
        std::net::SocketAddr::V4(a) => a,
        _ => unreachable!(),
    };
    let mut link = bed.link(Role::Dialer, KEY);
    link.peer = relay_addr;
    let cfg = AgentConfig {
        link,
        role: Role::Dialer,
        own_face: bed.a.0,
        peer_face: bed.a.1,
        face_interface: String::new(),
    };
    let agent_a = Agent::start(cfg, Box::new(Ended(Arc::clone(&ea))), vec![], vec![]).unwrap();
    let to_b = SocketAddrV4::new(bed.sig_b, bed.sig_port);
    let sig_a = bed.sig_a;
    std::thread::spawn(move || {
        let mut first = true;
        while let Ok((a, _)) = relay.accept() {
            let b = super::agent_test_connect(sig_a, to_b);
            b.set_nonblocking(false).unwrap();
            let (mut a2, mut b2) = (a.try_clone().unwrap(), b.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut b2, &mut a2);
            });
            let replay = first;
            first = false;
            std::thread::spawn(move || relay_a_to_b(a, b, replay));
        }
    });
    wait("peer up through the relay", || {
        agent_b.peer_up() && agent_b.stats.connects.load(Relaxed) >= 1
    });
    wait("the replay is counted", || {
        agent_b.stats.replays.load(Relaxed) == 1
    });
    wait("the connection comes back", || {
        agent_b.stats.connects.load(Relaxed) >= 2 && agent_a.peer_up()
    });
    assert!(agent_b.stats.resets.load(Relaxed) >= 1);
    assert_eq!(agent_b.stats.auth_failures.load(Relaxed), 0);
    // The same instance came back quickly: no restart, no sessions ended.
    assert_eq!(agent_b.stats.peer_restarts.load(Relaxed), 0);
    assert_eq!(ea.load(Relaxed) + eb.load(Relaxed), 0);
}

/// Copies A's hello and frames to B; with `replay`, the third frame is sent twice.
fn relay_a_to_b(mut a: TcpStream, mut b: TcpStream, replay: bool) {
    let mut h = [0u8; HELLO_LEN];
    if a.read_exact(&mut h).is_err() || b.write_all(&h).is_err() {
        return;
    }
    let mut n = 0;
    loop {
        let mut len = [0u8; 4];
        if a.read_exact(&mut len).is_err() {
            return;
        }
        let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
        if a.read_exact(&mut body).is_err() {
            return;
        }
        let mut frame = len.to_vec();
        frame.extend_from_slice(&body);
        if b.write_all(&frame).is_err() {
            return;
        }
        n += 1;
        if replay && n == 3 && b.write_all(&frame).is_err() {
            return;
        }
    }
}
