//! A group of SIP routes on shared sockets (one SIP port per side): which route each
//! message goes to ([`net::pick`], [`Core::claim`]) and who may start requests there.
//!
//! The pair of one deployment, both on 5060 without `upstream_port`: "a2b" listens in A
//! (devices register with the platform P in B through it) and "b2a" listens in B (P calls
//! the NVR in A through it, and only P may: `allow_peers`). Socket 0 is A:5060 (a2b's
//! listen face, b2a's upstream face), socket 1 is B:5060 (b2a's listen face, a2b's
//! upstream face).

use std::net::SocketAddrV4;
use std::sync::Arc;
use std::time::Instant;

use super::net::{pick, users, Member};
use super::{group_sockets, member_core, Face, Out, Peer};
use crate::config::{self, Config};
use crate::routes::{NoHooks, Routes};

const CONFIG: &str = r#"
[domains.a]
interface = "eth0"
address = "10.1.0.1"
networks = ["10.1.0.0/16"]
media_ports = "20000-20099"

[domains.b]
interface = "eth1"
address = "10.2.0.1"
networks = ["10.2.0.0/16"]
media_ports = "30000-30099"

[engine]
queues = 1

[[signaling_route]]
name = "a2b"
type = "sip"
transport = "udp"
listen_domain = "a"
listen_port = 5060
upstream = "10.2.0.60:5060"

[[signaling_route]]
name = "b2a"
type = "sip"
transport = "udp"
listen_domain = "b"
listen_port = 5060
upstream = "10.1.0.9:5060"
allow_peers = ["10.2.0.60/32"]
"#;

const A2B: usize = 0;
const B2A: usize = 1;
const SOCK_A: usize = 0;
const SOCK_B: usize = 1;
const DEVICE: &str = "10.1.0.20:5070";
const PLATFORM: &str = "10.2.0.60:5060";
/// In domain B, allowed by no route.
const STRANGER: &str = "10.2.0.77:5060";
const DEVICE_ID: &str = "34020000001320000001";

struct Group {
    members: Vec<Member>,
    on: Vec<Vec<(usize, Face)>>,
    now: Instant,
    _routes: Arc<Routes>,
}

fn group() -> Group {
    let cfg: Config = config::parse(CONFIG, "group.toml").unwrap();
    let routes = Arc::new(Routes::new(&cfg, Arc::new(NoHooks)));
    let (keys, socks_of) = group_sockets(&cfg.signaling);
    assert_eq!(
        keys.len(),
        2,
        "one socket per side: {keys:?} (check-config accepts this pair)"
    );
    assert_eq!(socks_of, vec![[SOCK_A, SOCK_B], [SOCK_B, SOCK_A]]);
    let local: Vec<SocketAddrV4> = keys
        .iter()
        .map(|(d, port)| SocketAddrV4::new(cfg.domain(*d).address, *port))
        .collect();
    let members: Vec<Member> = cfg
        .signaling
        .iter()
        .zip(&socks_of)
        .map(|(r, s)| Member {
            core: member_core(
                &cfg.signaling,
                &socks_of,
                r,
                &cfg,
                &routes,
                [local[s[0]], local[s[1]]],
            ),
            socks: *s,
        })
        .collect();
    let on = users(&members, keys.len());
    Group {
        members,
        on,
        now: Instant::now(),
        _routes: routes,
    }
}

impl Group {
    /// Which (route, face) a message from `from` on socket `sock` goes to.
    fn pick(&self, sock: usize, from: &str, msg: &str) -> Option<(usize, Face)> {
        let peer = Peer::udp(from.parse().unwrap());
        pick(&self.members, &self.on, sock, peer, msg.as_bytes())
    }

    /// Delivers a message as the event loop does: picked, then handled by that core. The
    /// outputs, each with the socket it leaves by.
    fn send(&mut self, sock: usize, from: &str, msg: &str) -> (usize, Vec<(usize, Out)>) {
        let msg = msg.replace('\n', "\r\n");
        let (m, face) = self
            .pick(sock, from, &msg)
            .expect("a route has a face here");
        assert_eq!(self.members[m].socks[face.index()], sock);
        let peer = Peer::udp(from.parse().unwrap());
        let member = &mut self.members[m];
        let outs = member.core.on_message(face, peer, msg.as_bytes(), self.now);
        let socks = member.socks;
        (
            m,
            outs.into_iter()
                .map(|o| (socks[o.face.index()], o))
                .collect(),
        )
    }

    fn counter(&self, m: usize, name: &str) -> u64 {
        self.members[m]
            .core
            .counters
            .list()
            .into_iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v)
            .unwrap()
    }
}

fn text(o: &Out) -> String {
    String::from_utf8_lossy(&o.bytes).into_owned()
}

fn status(o: &Out) -> String {
    text(o).split(' ').nth(1).unwrap_or_default().to_owned()
}

fn header(msg: &str, name: &str) -> String {
    msg.lines()
        .find(|l| l.starts_with(&format!("{name}:")))
        .unwrap_or_default()
        .trim_end()
        .to_owned()
}

/// A response to a request the gateway forwarded (`fwd`), from the party it went to.
fn reply(fwd: &Out, code: &str, extra: &str) -> String {
    let f = text(fwd);
    format!(
        "SIP/2.0 {code}\n{}\n{}\n{};tag=answer\n{}\n{}\n{extra}Content-Length: 0\n\n",
        header(&f, "Via"),
        header(&f, "From"),
        header(&f, "To"),
        header(&f, "Call-ID"),
        header(&f, "CSeq"),
    )
}

fn register() -> String {
    format!(
        "REGISTER sip:34020000002000000001@3402000000 SIP/2.0
Via: SIP/2.0/UDP {DEVICE};rport;branch=z9hG4bKreg1
From: <sip:{DEVICE_ID}@3402000000>;tag=r1
To: <sip:{DEVICE_ID}@3402000000>
Call-ID: reg1@3402000000
CSeq: 1 REGISTER
Contact: <sip:{DEVICE_ID}@{DEVICE}>
Max-Forwards: 70
Expires: 3600
Content-Length: 0

"
    )
}

/// A request from `from` addressed to the device by its ID (no token), as a wvp-style
/// platform sends it.
fn to_device(method: &str, from: &str, n: u32, extra: &str) -> String {
    format!(
        "{method} sip:{DEVICE_ID}@3402000000 SIP/2.0
Via: SIP/2.0/UDP {from};rport;branch=z9hG4bKp{n}
From: <sip:34020000002000000001@3402000000>;tag=p{n}
To: <sip:{DEVICE_ID}@3402000000>{extra}
Call-ID: p{n}@3402000000
CSeq: {n} {method}
Contact: <sip:34020000002000000001@{from}>
Max-Forwards: 70
Content-Length: 0

"
    )
}

/// The device registers through a2b and the platform confirms it.
fn registered(g: &mut Group) {
    let (m, outs) = g.send(SOCK_A, DEVICE, &register());
    assert_eq!(m, A2B, "the device's REGISTER is a2b's: it listens in A");
    assert_eq!(outs.len(), 1);
    assert_eq!(outs[0].0, SOCK_B, "forwarded from B:5060");
    assert_eq!(outs[0].1.to.addr, PLATFORM.parse().unwrap());
    let ok = reply(&outs[0].1, "200 OK", "");
    // Response routed by mapping: the REGISTER's transaction is a2b's, even though b2a
    // listens on that socket and accepts the platform.
    assert_eq!(
        g.pick(SOCK_B, PLATFORM, &ok.replace('\n', "\r\n")),
        Some((A2B, Face::Upstream))
    );
    let (m, back) = g.send(SOCK_B, PLATFORM, &ok);
    assert_eq!(m, A2B);
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].0, SOCK_A);
    assert_eq!(status(&back[0].1), "200");
    assert_eq!(back[0].1.to.addr, DEVICE.parse().unwrap());
}

#[test]
fn an_allowed_source_reaches_the_right_route() {
    let mut g = group();
    // Before the device registers, the platform's request by ID is b2a's (it listens in
    // B and allows the platform): forwarded to b2a's upstream in A.
    let (m, outs) = g.send(SOCK_B, PLATFORM, &to_device("MESSAGE", PLATFORM, 1, ""));
    assert_eq!(m, B2A);
    assert_eq!(outs.len(), 1);
    assert_eq!(outs[0].0, SOCK_A, "sent from A:5060");
    assert_eq!(outs[0].1.to.addr, "10.1.0.9:5060".parse().unwrap());
    // b2a's upstream answers: the response is b2a's (its transaction), though a2b
    // listens on that socket and accepts the NVR's address.
    let ok = reply(&outs[0].1, "200 OK", "");
    let (m, back) = g.send(SOCK_A, "10.1.0.9:5060", &ok);
    assert_eq!(m, B2A);
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].0, SOCK_B);
    assert_eq!(back[0].1.to.addr, PLATFORM.parse().unwrap());
    // Once registered through a2b, the platform reaches the device itself through a2b.
    registered(&mut g);
    let (m, outs) = g.send(SOCK_B, PLATFORM, &to_device("MESSAGE", PLATFORM, 2, ""));
    assert_eq!(m, A2B, "addressed to a device registered through a2b");
    assert_eq!(outs.len(), 1);
    assert_eq!(outs[0].0, SOCK_A);
    assert_eq!(outs[0].1.to.addr, DEVICE.parse().unwrap());
    assert_eq!(g.counter(A2B, "routed_by_user"), 1);
    assert_eq!(g.counter(A2B, "upstream_forbidden"), 0);
    assert_eq!(g.counter(B2A, "forbidden"), 0);
}

#[test]
fn an_unknown_source_gets_403_and_is_counted() {
    let mut g = group();
    registered(&mut g);
    // A source of domain B that b2a does not allow, addressing the registered device:
    // no route claims it (a2b's upstream face does not admit it), b2a refuses it.
    let probe = to_device("MESSAGE", STRANGER, 3, "");
    assert_eq!(
        g.pick(SOCK_B, STRANGER, &probe.replace('\n', "\r\n")),
        Some((B2A, Face::Listen))
    );
    let (m, outs) = g.send(SOCK_B, STRANGER, &probe);
    assert_eq!(m, B2A);
    assert_eq!(outs.len(), 1, "only the answer");
    assert_eq!(outs[0].0, SOCK_B);
    assert_eq!(status(&outs[0].1), "403");
    assert_eq!(outs[0].1.to.addr, STRANGER.parse().unwrap());
    assert_eq!(g.counter(B2A, "forbidden"), 1);
    // An ACK from it: nothing sent, counted.
    let (_, outs) = g.send(SOCK_B, STRANGER, &to_device("ACK", STRANGER, 4, ""));
    assert!(outs.is_empty());
    assert_eq!(g.counter(B2A, "forbidden"), 2);
    // A response from it: no transaction of any route; dropped, counted.
    let stray = "SIP/2.0 200 OK\nVia: SIP/2.0/UDP 10.2.0.1:5060;branch=z9hG4bKvgnothing\nFrom: <sip:a@3402000000>;tag=1\nTo: <sip:b@3402000000>;tag=2\nCall-ID: stray@3402000000\nCSeq: 1 MESSAGE\nContent-Length: 0\n\n";
    let (_, outs) = g.send(SOCK_B, STRANGER, stray);
    assert!(outs.is_empty());
    assert_eq!(g.counter(B2A, "forbidden"), 3);
    // The platform's Call-ID of an earlier request, reused by the stranger: a2b knows the
    // Call-ID and takes the message, and its upstream face refuses it (nothing reaches A).
    let (_, outs) = g.send(SOCK_B, PLATFORM, &to_device("MESSAGE", PLATFORM, 5, ""));
    assert_eq!(outs[0].1.to.addr, DEVICE.parse().unwrap());
    let reuse =
        to_device("MESSAGE", STRANGER, 5, "").replace("branch=z9hG4bKp5", "branch=z9hG4bKs5");
    let (m, outs) = g.send(SOCK_B, STRANGER, &reuse);
    assert_eq!(m, A2B, "a Call-ID a2b mapped");
    assert_eq!(outs.len(), 1);
    assert_eq!(outs[0].0, SOCK_B);
    assert_eq!(status(&outs[0].1), "403");
    assert!(text(&outs[0].1).contains("may not start requests on the upstream face"));
    assert_eq!(g.counter(A2B, "upstream_forbidden"), 1);
    // Nothing from the stranger crossed to A.
    assert_eq!(g.counter(A2B, "routed_by_user"), 1, "only the platform's");
}

#[test]
fn an_upstream_face_alone_admits_only_its_upstream() {
    // a2b's upstream face on a socket of its own (the old config with upstream_port): a
    // stranger of domain B cannot reach a registered device through it either.
    let mut g = group();
    registered(&mut g);
    let a2b = &mut g.members[A2B].core;
    let stranger = Peer::udp(STRANGER.parse().unwrap());
    let msg = to_device("INVITE", STRANGER, 6, "").replace('\n', "\r\n");
    let outs = a2b.on_message(Face::Upstream, stranger, msg.as_bytes(), g.now);
    assert_eq!(outs.len(), 1);
    assert_eq!(outs[0].face, Face::Upstream);
    assert_eq!(status(&outs[0]), "403");
    assert_eq!(a2b.counters.upstream_forbidden, 1);
    assert_eq!(a2b.table_sizes().0, 0, "no call started");
    // b2a's upstream is the NVR: it may start requests on b2a's upstream face, and so may
    // the devices a2b accepts on that socket (any address of A).
    assert!(g.members[B2A]
        .core
        .may_start_upstream("10.1.0.9".parse().unwrap()));
    assert!(g.members[B2A]
        .core
        .may_start_upstream("10.1.0.20".parse().unwrap()));
    assert!(!g.members[B2A]
        .core
        .may_start_upstream("10.2.0.60".parse().unwrap()));
    // On B:5060, b2a allows only the platform: a2b's upstream face admits only it.
    assert!(g.members[A2B]
        .core
        .may_start_upstream("10.2.0.60".parse().unwrap()));
    assert!(!g.members[A2B]
        .core
        .may_start_upstream("10.2.0.77".parse().unwrap()));
}

#[test]
fn an_in_dialog_request_goes_to_the_route_of_its_dialog() {
    let mut g = group();
    registered(&mut g);
    // The platform calls the device by ID: a2b's call.
    let (m, outs) = g.send(SOCK_B, PLATFORM, &to_device("INVITE", PLATFORM, 7, ""));
    assert_eq!(m, A2B);
    let (sock, invite) = outs
        .iter()
        .find(|(_, o)| text(o).starts_with("INVITE "))
        .expect("forwarded");
    assert_eq!(*sock, SOCK_A);
    assert!(
        outs.iter().all(|(s, o)| s == sock || status(o) == "100"),
        "the rest is a 100 Trying to the platform"
    );
    assert_eq!(invite.to.addr, DEVICE.parse().unwrap());
    // The device answers on A:5060: a2b's transaction, though b2a's upstream face is
    // there too.
    let ok = reply(
        invite,
        "200 OK",
        &format!("Contact: <sip:{DEVICE_ID}@{DEVICE}>\n"),
    );
    let (m, back) = g.send(SOCK_A, DEVICE, &ok);
    assert_eq!(m, A2B);
    let ok_b = &back
        .iter()
        .find(|(s, _)| *s == SOCK_B)
        .expect("the 200 reaches the platform")
        .1;
    assert_eq!(status(ok_b), "200");
    let contact = header(&text(ok_b), "Contact");
    let uri = contact
        .split('<')
        .nth(1)
        .and_then(|c| c.split('>').next())
        .unwrap()
        .to_owned();
    assert!(
        uri.contains("vgt="),
        "the device's contact is a token: {uri}"
    );
    let to_tag = header(&text(ok_b), "To");
    let tag = to_tag.split("tag=").nth(1).unwrap().to_owned();
    // ACK to the token (b2a listens there and allows the platform; the token is a2b's).
    let ack = format!(
        "ACK {uri} SIP/2.0
Via: SIP/2.0/UDP {PLATFORM};rport;branch=z9hG4bKack7
From: <sip:34020000002000000001@3402000000>;tag=p7
To: <sip:{DEVICE_ID}@3402000000>;tag={tag}
Call-ID: p7@3402000000
CSeq: 7 ACK
Max-Forwards: 70
Content-Length: 0

"
    );
    let (m, outs) = g.send(SOCK_B, PLATFORM, &ack);
    assert_eq!(m, A2B, "the token names a2b's binding");
    assert_eq!(outs.len(), 1);
    assert_eq!(outs[0].0, SOCK_A);
    assert_eq!(outs[0].1.to.addr, DEVICE.parse().unwrap());
    // BYE without the token (to the ID, as some platforms send it): the dialog's Call-ID.
    let bye = to_device("BYE", PLATFORM, 8, &format!(";tag={tag}"))
        .replace("Call-ID: p8@", "Call-ID: p7@")
        .replace("tag=p8", "tag=p7");
    let (m, outs) = g.send(SOCK_B, PLATFORM, &bye);
    assert_eq!(m, A2B, "a2b's dialog");
    assert_eq!(outs.len(), 1);
    assert_eq!(outs[0].0, SOCK_A);
    assert_eq!(outs[0].1.to.addr, DEVICE.parse().unwrap());
    assert!(text(&outs[0].1).starts_with("BYE "));
    assert_eq!(g.counter(B2A, "requests"), 0, "b2a saw none of it");
}

fn options(uri: &str, from: &str, n: u32) -> String {
    format!(
        "OPTIONS {uri} SIP/2.0\nVia: SIP/2.0/UDP {from};branch=z9hG4bKprobe{n}\nMax-Forwards: 70\nFrom: <sip:{from}>;tag=p{n}\nTo: <{uri}>\nCall-ID: probe{n}@{from}\nCSeq: {n} OPTIONS\nContent-Length: 0\n\n"
    )
}

#[test]
fn a_probe_for_the_gateway_itself_is_answered_there() {
    let mut g = group();
    // Kamailio's dispatcher probe: OPTIONS for the gateway's own address, no user part.
    for (n, uri) in ["sip:10.2.0.1", "sip:10.2.0.1:5060;transport=udp"]
        .iter()
        .enumerate()
    {
        let (m, outs) = g.send(SOCK_B, PLATFORM, &options(uri, PLATFORM, n as u32));
        assert_eq!(outs.len(), 1, "only the answer, nothing crosses: {uri}");
        assert_eq!(outs[0].0, SOCK_B);
        assert_eq!(status(&outs[0].1), "200");
        assert!(
            text(&outs[0].1).contains("\r\nAllow: INVITE"),
            "{}",
            text(&outs[0].1)
        );
        assert_eq!(g.counter(m, "options_answered"), n as u64 + 1);
        assert_eq!(g.counter(m, "forbidden"), 0);
    }
    // Another port or a user part is not a probe for this gateway: forwarded as before.
    let (_, outs) = g.send(SOCK_B, PLATFORM, &options("sip:10.2.0.1:5070", PLATFORM, 7));
    assert_ne!(outs.first().map(|o| status(&o.1)), Some("200".into()));
    let dev = format!("sip:{DEVICE_ID}@10.2.0.1");
    let (m, outs) = g.send(SOCK_B, PLATFORM, &options(&dev, PLATFORM, 8));
    let sent: Vec<String> = outs.iter().map(|o| text(&o.1)).collect();
    assert!(
        !outs.is_empty() && outs.iter().all(|o| o.0 == SOCK_A),
        "forwarded into A: {sent:?}"
    );
    assert_eq!(g.counter(m, "options_answered"), 2, "only the two probes");
    // A source no route allows still gets 403, probe or not.
    let (m, outs) = g.send(SOCK_B, STRANGER, &options("sip:10.2.0.1", STRANGER, 9));
    assert_eq!(status(&outs[0].1), "403");
    assert_eq!(g.counter(m, "forbidden"), 1);
}
