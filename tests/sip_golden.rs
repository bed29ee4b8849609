//! Golden tests of the SIP proxy core: GB/T 28181 flows in, the messages vgate sends out,
//! compared with `tests/golden/sip/*.txt`. Allocated media ports show as `PORT`.
//! `UPDATE_GOLDEN=1 cargo test --test sip_golden` rewrites the files (review the diff).

mod common;

use std::fmt::Write as _;
use std::net::SocketAddrV4;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vgate::config::{self, Config, DomainId};
use vgate::routes::{NoHooks, Routes};
use vgate::signaling::proxy::sip::{Core, Face, Out, Peer};

/// The golden config: route 0 `b2a` (platforms in B call the camera 10.1.0.9 in A), route 1
/// `a2b` (devices in A register with the platform 10.2.0.60 in B).
static CONFIG: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    use common::signaling_route;
    offline_config!("\n[security]\nsource_validation = \"strict\"\n\n").to_owned()
        + &signaling_route("b2a", "sip", "udp", ("b", 5060), "10.1.0.9:5060")
        + "upstream_port = 5061\nmedia_timeout = 5\n\n"
        + &signaling_route("a2b", "sip", "udp", ("a", 5060), "10.2.0.60:5060")
        + "upstream_port = 5061\nallow_ids = [\"3402000000\"]\n"
});

pub struct Bench {
    /// The Call-ID each face's peers know a call by: vgate hides Call-IDs, so a peer
    /// answers and continues a dialog with the Call-ID it received. Scripts are written
    /// with one Call-ID per call; `send` puts the peer's in.
    pub peer_cids: std::collections::HashMap<(Face, String), String>,
    pub cfg: Config,
    pub routes: Arc<Routes>,
    pub core: Core,
    pub log: String,
    pub now: Instant,
}

pub fn bench(route: usize) -> Bench {
    bench_with(&CONFIG, route)
}

/// A bench on another config (the golden one with route settings added).
pub fn bench_with(config_text: &str, route: usize) -> Bench {
    let cfg = config::parse(config_text, "golden.toml").unwrap();
    let routes = Arc::new(Routes::new(&cfg, Arc::new(NoHooks)));
    let r = &cfg.signaling[route];
    let listen = SocketAddrV4::new(cfg.domain(r.listen_domain).address, r.listen_port);
    let up = SocketAddrV4::new(cfg.domain(r.listen_domain.other()).address, 40000);
    let core = Core::new(r, &cfg, Arc::clone(&routes), [listen, up], "t");
    Bench {
        peer_cids: Default::default(),
        cfg,
        routes,
        core,
        log: String::new(),
        now: Instant::now(),
    }
}

/// Ports of the media ranges become `PORT`.
fn placeholders(s: &str) -> String {
    let mut out = String::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_digit() && (i == 0 || !b[i - 1].is_ascii_alphanumeric()) {
            let j = (i..b.len())
                .find(|&k| !b[k].is_ascii_digit())
                .unwrap_or(b.len());
            let n: Option<u32> = s[i..j].parse().ok();
            let after_ok = j == b.len() || !b[j].is_ascii_alphanumeric();
            if after_ok
                && n.is_some_and(|n| (20000..=20099).contains(&n) || (30000..=30099).contains(&n))
            {
                out.push_str("PORT");
                i = j;
                continue;
            }
            out.push_str(&s[i..j]);
            i = j;
            continue;
        }
        out.push(b[i] as char);
        i += 1;
    }
    out
}

impl Bench {
    pub fn send(&mut self, face: Face, from: &str, msg: &str) -> Vec<Out> {
        let mut msg = msg.replace('\n', "\r\n");
        let script_cid = call_id_of(&msg);
        if let Some(c) = script_cid
            .as_ref()
            .and_then(|c| self.peer_cids.get(&(face, c.clone())))
        {
            msg = msg.replace(
                &format!("Call-ID: {}\r\n", script_cid.clone().unwrap_or_default()),
                &format!("Call-ID: {c}\r\n"),
            );
        }
        let src = Peer::udp(from.parse().unwrap());
        let outs = self.core.on_message(face, src, msg.as_bytes(), self.now);
        if let Some(script) = script_cid {
            for o in outs.iter().filter(|o| o.face != face) {
                if let Some(c) = call_id_of(&String::from_utf8_lossy(&o.bytes)) {
                    self.peer_cids.insert((o.face, script.clone()), c);
                }
            }
        }
        let _ = writeln!(
            self.log,
            "======== in {face:?} from {from}\n{}",
            msg.replace("\r\n", "\n")
        );
        for o in &outs {
            let _ = writeln!(
                self.log,
                "-------- out {:?} to {}\n{}",
                o.face,
                o.to.addr,
                String::from_utf8_lossy(&o.bytes).replace("\r\n", "\n")
            );
        }
        outs
    }

    pub fn note_routes(&mut self) {
        let _ = writeln!(self.log, "======== routes");
        for r in self.routes.routes() {
            let _ = writeln!(
                self.log,
                "{} port={} dest={} egress={} policy={} expected={:?} label={}",
                r.channel, r.port, r.dest, r.egress_port, r.policy, r.expected, r.label
            );
        }
        let (a, _) = self.routes.ports(DomainId::A);
        let (b, _) = self.routes.ports(DomainId::B);
        let _ = writeln!(
            self.log,
            "sessions={} ports a={a} b={b}",
            self.routes.sessions().len()
        );
    }

    pub fn advance(&mut self, d: Duration) {
        self.now += d;
    }

    pub fn check(&self, name: &str) {
        let path = format!("{}/tests/golden/sip/{name}.txt", env!("CARGO_MANIFEST_DIR"));
        let got = placeholders(&self.log);
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::write(&path, &got).unwrap();
            return;
        }
        let want = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{path}: {e}; run with UPDATE_GOLDEN=1 to create it"));
        if want != got {
            let line = want
                .lines()
                .zip(got.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            panic!(
                "{name}: output differs from {path} at line {}:\nwant: {:?}\ngot:  {:?}\n(UPDATE_GOLDEN=1 rewrites it)",
                line + 1,
                want.lines().nth(line),
                got.lines().nth(line)
            );
        }
    }
}

/// The Call-ID of a message.
pub fn call_id_of(msg: &str) -> Option<String> {
    msg.lines()
        .find_map(|l| l.strip_prefix("Call-ID: "))
        .map(|c| c.trim().to_owned())
}

/// The token vgate put in a Contact (`vgt=...`).
pub fn token(out: &Out) -> String {
    let s = String::from_utf8_lossy(&out.bytes);
    let i = s.find(";vgt=").expect("a contact with a token");
    s[i + 5..].split(['>', ';']).next().unwrap().to_owned()
}

pub const OFFER: &str = "v=0
o=34020000002000000001 0 0 IN IP4 10.2.0.50
s=Play
c=IN IP4 10.2.0.50
t=0 0
m=video 6000 RTP/AVP 96 98 97
a=recvonly
a=rtpmap:96 PS/90000
a=rtpmap:98 H264/90000
a=rtpmap:97 MPEG4/90000
y=0100000001
f=v/2/4///a///
";

pub const ANSWER: &str = "v=0
o=34020000001320000001 0 0 IN IP4 10.1.0.9
s=Play
c=IN IP4 10.1.0.9
t=0 0
m=video 15060 RTP/AVP 96
a=sendonly
a=rtpmap:96 PS/90000
y=0100000001
f=
";

pub fn with_body(head: &str, ctype: &str, body: &str) -> String {
    let body = body.replace('\n', "\r\n");
    format!(
        "{head}Content-Type: {ctype}\nContent-Length: {}\n\n{}",
        body.len(),
        body.replace("\r\n", "\n")
    )
}

/// INVITE (with one retransmission) / 200 / ACK of a GB live-view call from a platform in B
/// to a camera in A; returns the gateway contact tokens of the caller and the callee.
fn establish_call(t: &mut Bench) -> (String, String) {
    let invite = with_body(
        "INVITE sip:34020000001320000001@3402000000 SIP/2.0
Via: SIP/2.0/UDP 10.2.0.50:5060;rport;branch=z9hG4bK1001
From: <sip:34020000002000000001@3402000000>;tag=p1
To: <sip:34020000001320000001@3402000000>
Call-ID: 1001@3402000000
CSeq: 20 INVITE
Contact: <sip:34020000002000000001@10.2.0.50:5060>
Max-Forwards: 70
User-Agent: Platform
Subject: 34020000001320000001:0100000001,34020000002000000001:0
",
        "APPLICATION/SDP",
        OFFER,
    );
    let outs = t.send(Face::Listen, "10.2.0.50:5060", &invite);
    assert_eq!(outs.len(), 2, "100 Trying and the forwarded INVITE");
    let fwd = String::from_utf8_lossy(&outs[1].bytes).into_owned();
    let branch = fwd
        .split("branch=")
        .nth(1)
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let caller_token = token(&outs[1]);
    // A retransmission: same answer, same forwarded bytes, no second session.
    let again = t.send(Face::Listen, "10.2.0.50:5060", &invite);
    assert_eq!(again.len(), 2);
    assert_eq!(again[1].bytes, outs[1].bytes);
    assert_eq!(t.routes.sessions().len(), 1);

    let ok = with_body(
        &format!(
            "SIP/2.0 200 OK
Via: SIP/2.0/UDP 10.1.0.1:40000;branch={branch};rport=40000;received=10.1.0.1
From: <sip:34020000002000000001@3402000000>;tag=p1
To: <sip:34020000001320000001@3402000000>;tag=d1
Call-ID: 1001@3402000000
CSeq: 20 INVITE
Contact: <sip:34020000001320000001@10.1.0.9:5060>
User-Agent: IPC
"
        ),
        "application/sdp",
        ANSWER,
    );
    let outs = t.send(Face::Upstream, "10.1.0.9:5060", &ok);
    assert_eq!(outs.len(), 1);
    let callee_token = token(&outs[0]);
    t.note_routes();
    let ack = format!(
        "ACK sip:34020000001320000001@10.2.0.1:5060;vgt={callee_token} SIP/2.0
Via: SIP/2.0/UDP 10.2.0.50:5060;rport;branch=z9hG4bK1002
From: <sip:34020000002000000001@3402000000>;tag=p1
To: <sip:34020000001320000001@3402000000>;tag=d1
Call-ID: 1001@3402000000
CSeq: 20 ACK
Max-Forwards: 70
Content-Length: 0

"
    );
    assert_eq!(t.send(Face::Listen, "10.2.0.50:5060", &ack).len(), 1);
    (caller_token, callee_token)
}

#[test]
fn gb_invite_200_ack_bye() {
    let mut t = bench(0);
    let (caller_token, _callee_token) = establish_call(&mut t);
    // The device hangs up: BYE from A to the caller's gateway contact.
    let bye = format!(
        "BYE sip:34020000002000000001@10.1.0.1:40000;vgt={caller_token} SIP/2.0
Via: SIP/2.0/UDP 10.1.0.9:5060;rport;branch=z9hG4bK2001
From: <sip:34020000001320000001@3402000000>;tag=d1
To: <sip:34020000002000000001@3402000000>;tag=p1
Call-ID: 1001@3402000000
CSeq: 1 BYE
Max-Forwards: 70
Content-Length: 0

"
    );
    let outs = t.send(Face::Upstream, "10.1.0.9:5060", &bye);
    assert_eq!(outs.len(), 1);
    assert_eq!(outs[0].to.addr, "10.2.0.50:5060".parse().unwrap());
    let fwd = String::from_utf8_lossy(&outs[0].bytes).into_owned();
    let branch = fwd
        .split("branch=")
        .nth(1)
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let bye_ok = format!(
        "SIP/2.0 200 OK
Via: SIP/2.0/UDP 10.2.0.1:5060;branch={branch};rport=5060;received=10.2.0.1
From: <sip:34020000001320000001@3402000000>;tag=d1
To: <sip:34020000002000000001@3402000000>;tag=p1
Call-ID: 1001@3402000000
CSeq: 1 BYE
Content-Length: 0

"
    );
    assert_eq!(t.send(Face::Listen, "10.2.0.50:5060", &bye_ok).len(), 1);
    t.note_routes();
    assert_eq!(t.routes.sessions().len(), 0);
    assert_eq!(
        t.routes.ports(DomainId::A).0 + t.routes.ports(DomainId::B).0,
        0
    );
    t.check("invite_200_ack_bye");
}

#[test]
fn gb_register_digest_and_catalog() {
    let mut t = bench(1);
    let reg = |auth: &str, branch: &str, cseq: u32| {
        format!(
            "REGISTER sip:34020000002000000001@3402000000 SIP/2.0
Via: SIP/2.0/UDP 10.1.0.20:5060;rport;branch={branch}
From: <sip:34020000001320000001@3402000000>;tag=r1
To: <sip:34020000001320000001@3402000000>
Call-ID: reg1@3402000000
CSeq: {cseq} REGISTER
Contact: <sip:34020000001320000001@10.1.0.20:5060>
Max-Forwards: 70
{auth}Expires: 3600
Content-Length: 0

"
        )
    };
    let outs = t.send(Face::Listen, "10.1.0.20:5060", &reg("", "z9hG4bKr1", 1));
    assert_eq!(outs.len(), 1);
    let b1 = String::from_utf8_lossy(&outs[0].bytes)
        .split("branch=")
        .nth(1)
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let tok = token(&outs[0]);
    let challenge = format!(
        "SIP/2.0 401 Unauthorized
Via: SIP/2.0/UDP 10.2.0.1:40000;branch={b1};rport
From: <sip:34020000001320000001@3402000000>;tag=r1
To: <sip:34020000001320000001@3402000000>;tag=s1
Call-ID: reg1@3402000000
CSeq: 1 REGISTER
WWW-Authenticate: Digest realm=\"3402000000\", nonce=\"9bd055\", algorithm=MD5
Content-Length: 0

"
    );
    assert_eq!(
        t.send(Face::Upstream, "10.2.0.60:5060", &challenge).len(),
        1
    );
    let auth = "Authorization: Digest username=\"34020000001320000001\", realm=\"3402000000\", nonce=\"9bd055\", uri=\"sip:34020000002000000001@3402000000\", response=\"ab12cd34ef56ab12cd34ef56ab12cd34\", algorithm=MD5\n";
    let outs = t.send(Face::Listen, "10.1.0.20:5060", &reg(auth, "z9hG4bKr2", 2));
    assert_eq!(token(&outs[0]), tok, "same contact, same binding");
    let b2 = String::from_utf8_lossy(&outs[0].bytes)
        .split("branch=")
        .nth(1)
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let ok = format!(
        "SIP/2.0 200 OK
Via: SIP/2.0/UDP 10.2.0.1:40000;branch={b2};rport
From: <sip:34020000001320000001@3402000000>;tag=r1
To: <sip:34020000001320000001@3402000000>;tag=s2
Call-ID: reg1@3402000000
CSeq: 2 REGISTER
Contact: <sip:34020000001320000001@10.2.0.1:40000;vgt={tok}>;expires=3600
Date: 2024-05-01T10:00:00.000
Content-Length: 0

"
    );
    assert_eq!(t.send(Face::Upstream, "10.2.0.60:5060", &ok).len(), 1);
    // The platform queries the catalog at the contact it learned: routed by the token.
    let query = with_body(
        &format!(
            "MESSAGE sip:34020000001320000001@10.2.0.1:40000;vgt={tok} SIP/2.0
Via: SIP/2.0/UDP 10.2.0.60:5060;rport;branch=z9hG4bKq1
From: <sip:34020000002000000001@3402000000>;tag=q1
To: <sip:34020000001320000001@3402000000>
Call-ID: q1@3402000000
CSeq: 1 MESSAGE
Max-Forwards: 70
"
        ),
        "Application/MANSCDP+xml",
        "<?xml version=\"1.0\"?>\n<Query>\n<CmdType>Catalog</CmdType>\n<SN>17</SN>\n<DeviceID>34020000001320000001</DeviceID>\n</Query>\n",
    );
    let outs = t.send(Face::Upstream, "10.2.0.60:5060", &query);
    assert_eq!(outs.len(), 1);
    assert_eq!(outs[0].to.addr, "10.1.0.20:5060".parse().unwrap());
    // The device answers with a big catalog (> 1500 bytes) to the platform.
    let mut items = String::new();
    for i in 0..12 {
        let _ = write!(items, "<Item>\n<DeviceID>340200000013200000{i:02}</DeviceID>\n<Name>Camera {i}</Name>\n<Manufacturer>Vendor</Manufacturer>\n<Model>IPC</Model>\n<Owner>Owner</Owner>\n<CivilCode>3402000000</CivilCode>\n<Address>Gate {i}</Address>\n<Parental>0</Parental>\n<SafetyWay>0</SafetyWay>\n<RegisterWay>1</RegisterWay>\n<Secrecy>0</Secrecy>\n<Status>ON</Status>\n</Item>\n");
    }
    let catalog = format!("<?xml version=\"1.0\" encoding=\"GB2312\"?>\n<Response>\n<CmdType>Catalog</CmdType>\n<SN>17</SN>\n<DeviceID>34020000001320000001</DeviceID>\n<SumNum>12</SumNum>\n<DeviceList Num=\"12\">\n{items}</DeviceList>\n</Response>\n");
    assert!(catalog.len() > 1500);
    let resp = with_body(
        "MESSAGE sip:34020000002000000001@3402000000 SIP/2.0
Via: SIP/2.0/UDP 10.1.0.20:5060;rport;branch=z9hG4bKc1
From: <sip:34020000001320000001@3402000000>;tag=c1
To: <sip:34020000002000000001@3402000000>
Call-ID: c1@3402000000
CSeq: 2 MESSAGE
Max-Forwards: 70
",
        "Application/MANSCDP+xml",
        &catalog,
    );
    let outs = t.send(Face::Listen, "10.1.0.20:5060", &resp);
    assert_eq!(outs.len(), 1);
    let out = String::from_utf8_lossy(&outs[0].bytes).into_owned();
    assert!(
        out.ends_with(&catalog.replace('\n', "\r\n")),
        "GB body unchanged"
    );
    assert_eq!(outs[0].to.addr, "10.2.0.60:5060".parse().unwrap());
    t.check("register_digest_catalog");
}

fn invite_with(sdp: &str, from_id: &str, call: &str) -> String {
    with_body(
        &format!(
            "INVITE sip:34020000001320000001@3402000000 SIP/2.0
Via: SIP/2.0/UDP 10.2.0.50:5060;rport;branch=z9hG4bK{call}
From: <sip:{from_id}@3402000000>;tag=p1
To: <sip:34020000001320000001@3402000000>
Call-ID: {call}
CSeq: 1 INVITE
Contact: <sip:{from_id}@10.2.0.50:5060>
Max-Forwards: 70
"
        ),
        "application/sdp",
        sdp,
    )
}

fn status(o: &Out) -> String {
    String::from_utf8_lossy(&o.bytes)
        .lines()
        .next()
        .unwrap()
        .to_owned()
}

#[test]
fn tcp_media_vgate_cannot_bridge_is_refused_with_488_and_warning() {
    // RTP over plain TCP (RFC 4571) is bridged (tests/gb_tcp_netns.rs); over TLS it is not.
    let mut t = bench(0);
    let sdp = OFFER
        .replace("RTP/AVP 96 98 97", "TCP/TLS/RTP/AVP 96")
        .replace("a=recvonly", "a=recvonly\na=setup:active\na=connection:new");
    let msg = invite_with(&sdp, "34020000002000000001", "tcp1");
    let outs = t.send(Face::Listen, "10.2.0.50:5060", &msg);
    assert_eq!(outs.len(), 1);
    assert_eq!(status(&outs[0]), "SIP/2.0 488 Not Acceptable Here");
    assert!(String::from_utf8_lossy(&outs[0].bytes).contains("Warning: 399 vgate"));
    assert_eq!(t.core.counters.tcp_media_refused, 1);
    // The retransmission gets the same answer, counted once.
    let outs = t.send(Face::Listen, "10.2.0.50:5060", &msg);
    assert_eq!(status(&outs[0]), "SIP/2.0 488 Not Acceptable Here");
    assert_eq!(t.core.counters.tcp_media_refused, 1);
    assert_eq!(t.routes.sessions().len(), 0);
    assert_eq!(t.core.table_sizes().0, 0);
}

/// The golden config with route 0 (`b2a`) validating its calls' media in `mode`.
fn validating(mode: &str) -> Bench {
    let cfg = CONFIG.replacen(
        "upstream_port = 5061\nmedia_timeout = 5\n",
        &format!("upstream_port = 5061\nmedia_timeout = 5\nmedia_validate = \"{mode}\"\n"),
        1,
    );
    bench_with(&cfg, 0)
}

const VP8_OFFER: &str = "v=0
o=34020000002000000001 0 0 IN IP4 10.2.0.50
s=Play
c=IN IP4 10.2.0.50
t=0 0
m=video 6000 RTP/AVP 96
a=recvonly
a=rtpmap:96 VP8/90000
";

#[test]
fn enforce_refuses_an_offer_of_only_unknown_codecs_with_488() {
    let mut t = validating("enforce");
    let msg = invite_with(VP8_OFFER, "34020000002000000001", "vp8");
    let outs = t.send(Face::Listen, "10.2.0.50:5060", &msg);
    assert_eq!(outs.len(), 1, "answered here, nothing forwarded");
    assert_eq!(status(&outs[0]), "SIP/2.0 488 Not Acceptable Here");
    assert!(
        text(&outs[0]).contains(
            "Warning: 399 vgate \"media validation: codec VP8/90000 not allowed (allow_unknown_codec = false)\"\r\n"
        ),
        "{}",
        text(&outs[0])
    );
    assert_eq!(t.core.counters.media_refused, 1);
    // The retransmission gets the same answer, counted once; nothing was allocated.
    let again = t.send(Face::Listen, "10.2.0.50:5060", &msg);
    assert_eq!(again[0].bytes, outs[0].bytes);
    assert_eq!(t.core.counters.media_refused, 1);
    assert_eq!(t.routes.sessions().len(), 0);
    assert_eq!(t.core.table_sizes().0, 0);
    let (a, _) = t.routes.ports(DomainId::A);
    let (b, _) = t.routes.ports(DomainId::B);
    assert_eq!((a, b), (0, 0), "no media ports held");
    // Also refused: a payload type without rtpmap that is not static.
    let no_map = VP8_OFFER
        .replace("RTP/AVP 96", "RTP/AVP 101")
        .replace("a=rtpmap:96 VP8/90000\n", "");
    let outs = t.send(
        Face::Listen,
        "10.2.0.50:5060",
        &invite_with(&no_map, "34020000002000000001", "nomap"),
    );
    assert_eq!(status(&outs[0]), "SIP/2.0 488 Not Acceptable Here");
    assert!(text(&outs[0]).contains("payload type 101 without rtpmap not allowed"));
    assert_eq!(t.core.counters.media_refused, 2);
    t.check("media_validation_488");
}

#[test]
fn count_and_off_let_the_same_offer_cross() {
    for mode in ["count", "off"] {
        let mut t = validating(mode);
        let msg = invite_with(VP8_OFFER, "34020000002000000001", "vp8");
        let outs = t.send(Face::Listen, "10.2.0.50:5060", &msg);
        assert_eq!(outs.len(), 2, "{mode}: 100 Trying and the forwarded INVITE");
        assert_eq!(status(&outs[0]), "SIP/2.0 100 Trying");
        assert!(text(&outs[1]).starts_with("INVITE "));
        assert!(text(&outs[1]).contains("a=rtpmap:96 VP8/90000"));
        assert_eq!(t.core.counters.media_refused, 0, "{mode}");
        assert_eq!(t.routes.sessions().len(), 1);
    }
}

#[test]
fn enforce_keeps_an_offer_with_one_allowed_codec_and_validates_only_those() {
    // OFFER: PS (96), H264 (98) and MPEG4 (97, unknown to the validator).
    let mut t = validating("enforce");
    establish_call(&mut t);
    assert!(
        placeholders(&t.log).contains("m=video PORT RTP/AVP 96 98 97"),
        "nothing stripped from the SDP"
    );
    assert_eq!(t.core.counters.media_refused, 0);
    let rtp: Vec<_> = t
        .routes
        .routes()
        .into_iter()
        .filter(|r| r.label.ends_with(" rtp"))
        .collect();
    assert_eq!(rtp.len(), 1, "the camera's RTP toward the platform");
    let rule = rtp[0].media.expect("validated");
    assert!(rule.enforce);
    let pts: Vec<(u8, vgate::media::Codec)> = rule
        .spec
        .formats()
        .iter()
        .map(|f| (f.pt, f.codec))
        .collect();
    assert_eq!(
        pts,
        [
            (96, vgate::media::Codec::Ps),
            (98, vgate::media::Codec::H264)
        ],
        "MPEG4 is not among what may cross"
    );
    // Under count, the route's spec keeps every format (an unknown one counted as such).
    let mut t = validating("count");
    establish_call(&mut t);
    let rule = t
        .routes
        .routes()
        .into_iter()
        .find(|r| r.label.ends_with(" rtp"))
        .and_then(|r| r.media)
        .expect("validated");
    assert!(!rule.enforce);
    assert_eq!(rule.spec.formats().len(), 3);
}

#[test]
fn enforce_refuses_an_answer_of_only_unknown_codecs_with_488_to_the_caller() {
    let mut t = validating("enforce");
    let msg = invite_with(OFFER, "34020000002000000001", "ans");
    let outs = t.send(Face::Listen, "10.2.0.50:5060", &msg);
    assert_eq!(outs.len(), 2);
    let fwd = text(&outs[1]);
    let branch = fwd
        .split("branch=")
        .nth(1)
        .unwrap()
        .split(['\r', ';'])
        .next()
        .unwrap()
        .to_owned();
    let ok = with_body(
        &format!(
            "SIP/2.0 200 OK
Via: SIP/2.0/UDP 10.1.0.1:40000;branch={branch};rport=40000;received=10.1.0.1
From: <sip:34020000002000000001@3402000000>;tag=p1
To: <sip:34020000001320000001@3402000000>;tag=d1
Call-ID: ans
CSeq: 1 INVITE
Contact: <sip:34020000001320000001@10.1.0.9:5060>
"
        ),
        "application/sdp",
        &ANSWER.replace("a=rtpmap:96 PS/90000", "a=rtpmap:96 VP8/90000"),
    );
    let outs = t.send(Face::Upstream, "10.1.0.9:5060", &ok);
    // The answer does not cross; the caller gets the 488 with the reason at once (not a
    // 408 after the INVITE timeout), the callee a CANCEL (it ends its unacknowledged
    // dialog itself, RFC 3261 §13.3.1.4).
    assert_eq!(outs.len(), 2, "{outs:?}");
    assert!(text(&outs[0]).starts_with("CANCEL "), "{}", text(&outs[0]));
    assert_eq!(outs[0].face, Face::Upstream);
    assert_eq!(status(&outs[1]), "SIP/2.0 488 Not Acceptable Here");
    assert_eq!(outs[1].face, Face::Listen);
    assert!(
        text(&outs[1]).contains(
            "Warning: 399 vgate \"media validation: codec VP8/90000 not allowed (allow_unknown_codec = false)\"\r\n"
        ),
        "{}",
        text(&outs[1])
    );
    assert_eq!(t.core.counters.media_refused, 1);
    assert_eq!(t.core.counters.dropped_bad_sdp_responses, 1);
    assert_eq!(t.core.counters.invite_timeouts, 0);
    assert!(
        t.routes.routes().is_empty(),
        "no route that would drop every packet"
    );
    assert_eq!(
        t.routes.sessions().len(),
        0,
        "the call's ports are given back"
    );
    // The callee's retransmitted 200 is dropped; nothing more is refused or sent.
    let again = t.send(Face::Upstream, "10.1.0.9:5060", &ok);
    assert!(again.is_empty(), "{again:?}");
    assert_eq!(t.core.counters.media_refused, 1);
    t.check("media_validation_answer_488");
}

#[test]
fn unknown_ids_and_sources_get_403() {
    let mut t = bench(1);
    let msg = "MESSAGE sip:34020000002000000001@3402000000 SIP/2.0
Via: SIP/2.0/UDP 10.1.0.20:5060;branch=z9hG4bKk1
From: <sip:44010000001320000001@4401000000>;tag=k
To: <sip:34020000002000000001@3402000000>
Call-ID: k1
CSeq: 1 MESSAGE
Max-Forwards: 70
Content-Length: 0

";
    let outs = t.send(Face::Listen, "10.1.0.20:5060", msg);
    assert_eq!(status(&outs[0]), "SIP/2.0 403 Forbidden");
    let ok_id = msg.replace(
        "44010000001320000001@4401000000",
        "34020000001320000001@3402000000",
    );
    let outs = t.send(Face::Listen, "10.2.0.77:5060", &ok_id);
    assert_eq!(
        status(&outs[0]),
        "SIP/2.0 403 Forbidden",
        "a source outside domain a"
    );
    assert_eq!(t.core.counters.forbidden, 2);
}

#[test]
fn port_exhaustion_answers_503_and_frees_everything() {
    let mut t = bench(0);
    let mut refused = 0;
    for i in 0..40 {
        let outs = t.send(
            Face::Listen,
            "10.2.0.50:5060",
            &invite_with(OFFER, "34020000002000000001", &format!("x{i}")),
        );
        if status(&outs[0]).starts_with("SIP/2.0 503") {
            assert!(String::from_utf8_lossy(&outs[0].bytes).contains("Retry-After: 5"));
            refused += 1;
        }
    }
    // 100 ports per domain, one pair per call and domain: 50 calls fit... 40 do.
    assert_eq!(refused, 0);
    for i in 40..60 {
        let outs = t.send(
            Face::Listen,
            "10.2.0.50:5060",
            &invite_with(OFFER, "34020000002000000001", &format!("x{i}")),
        );
        refused += usize::from(status(&outs[0]).starts_with("SIP/2.0 503"));
    }
    assert_eq!(refused, 10);
    // Unanswered: the INVITE timeout cancels them all and frees the ports.
    t.advance(Duration::from_secs(33));
    let outs = t.core.tick(t.now, 0);
    assert_eq!(
        outs.iter()
            .filter(|o| status(o).starts_with("CANCEL"))
            .count(),
        50
    );
    assert_eq!(
        outs.iter()
            .filter(|o| status(o).starts_with("SIP/2.0 408"))
            .count(),
        50
    );
    assert_eq!(t.routes.sessions().len(), 0);
    assert_eq!(
        t.routes.ports(DomainId::A).0 + t.routes.ports(DomainId::B).0,
        0
    );
    t.advance(Duration::from_secs(100));
    t.core.tick(t.now, 0);
    let (calls, txns, _) = t.core.table_sizes();
    assert_eq!((calls, txns), (0, 0));
    // Contact bindings outlive their dialog by an hour (a late in-dialog request still
    // finds its way), then go too.
    t.advance(Duration::from_secs(3600));
    t.core.tick(t.now, 0);
    assert_eq!(t.core.table_sizes(), (0, 0, 0));
}

#[test]
fn operator_ends_a_call_with_bye_to_both_sides() {
    let mut t = bench(0);
    establish_call(&mut t);
    let sessions = t.routes.sessions();
    assert_eq!(sessions.len(), 1);
    t.routes.request_end(sessions[0].id).unwrap();
    t.advance(Duration::from_secs(2));
    let outs = t.core.tick(t.now, 0);
    let byes: Vec<String> = outs
        .iter()
        .map(|o| String::from_utf8_lossy(&o.bytes).into_owned())
        .filter(|m| m.starts_with("BYE "))
        .collect();
    assert_eq!(byes.len(), 2, "one BYE to each side: {outs:?}");
    for (to, what) in [
        ("10.1.0.9", "the camera in A"),
        ("10.2.0.50", "the platform in B"),
    ] {
        assert!(
            byes.iter().any(|b| b.contains(to)),
            "BYE to {what}: {byes:?}"
        );
    }
    assert!(t.routes.sessions().is_empty());
    assert!(t.routes.routes().is_empty());
}

/// The branch of the top Via of a message vgate sent.
fn branch_of(o: &Out) -> String {
    String::from_utf8_lossy(&o.bytes)
        .split("branch=")
        .nth(1)
        .unwrap()
        .split([';', '\r'])
        .next()
        .unwrap()
        .to_owned()
}

fn text(o: &Out) -> String {
    String::from_utf8_lossy(&o.bytes).into_owned()
}

fn ports_used(t: &Bench) -> usize {
    t.routes.ports(DomainId::A).0 + t.routes.ports(DomainId::B).0
}

#[test]
fn cancel_before_answer_gives_487_and_frees_everything() {
    let mut t = bench(0);
    let invite = invite_with(OFFER, "34020000002000000001", "cn1");
    let outs = t.send(Face::Listen, "10.2.0.50:5060", &invite);
    assert_eq!(outs.len(), 2);
    assert_eq!(status(&outs[0]), "SIP/2.0 100 Trying");
    let b = branch_of(&outs[1]);
    assert_eq!(
        t.routes.sessions().len(),
        1,
        "ports allocated for the offer"
    );
    let ringing = format!(
        "SIP/2.0 180 Ringing
Via: SIP/2.0/UDP 10.1.0.1:40000;branch={b};rport=40000
From: <sip:34020000002000000001@3402000000>;tag=p1
To: <sip:34020000001320000001@3402000000>;tag=d9
Call-ID: cn1
CSeq: 1 INVITE
Content-Length: 0

"
    );
    let outs = t.send(Face::Upstream, "10.1.0.9:5060", &ringing);
    assert_eq!(outs.len(), 1);
    assert_eq!(outs[0].face, Face::Listen);
    // The caller gives up before the answer.
    let cancel = "CANCEL sip:34020000001320000001@3402000000 SIP/2.0
Via: SIP/2.0/UDP 10.2.0.50:5060;rport;branch=z9hG4bKcn1
From: <sip:34020000002000000001@3402000000>;tag=p1
To: <sip:34020000001320000001@3402000000>
Call-ID: cn1
CSeq: 1 CANCEL
Max-Forwards: 70
Content-Length: 0

";
    let outs = t.send(Face::Listen, "10.2.0.50:5060", cancel);
    assert_eq!(
        outs.len(),
        2,
        "200 to the CANCEL, CANCEL downstream: {outs:?}"
    );
    assert_eq!(status(&outs[0]), "SIP/2.0 200 OK");
    assert_eq!(outs[0].face, Face::Listen);
    assert!(status(&outs[1]).starts_with("CANCEL "));
    assert_eq!(outs[1].to.addr, "10.1.0.9:5060".parse().unwrap());
    assert_eq!(branch_of(&outs[1]), b, "the CANCEL has the INVITE's branch");
    assert!(text(&outs[1]).contains("CSeq: 1 CANCEL"));
    assert_eq!(t.routes.sessions().len(), 0, "ports freed at the CANCEL");
    assert_eq!(ports_used(&t), 0);
    // The callee confirms the CANCEL (absorbed) and ends the INVITE with 487.
    let cancel_ok = format!(
        "SIP/2.0 200 OK
Via: SIP/2.0/UDP 10.1.0.1:40000;branch={b};rport=40000
From: <sip:34020000002000000001@3402000000>;tag=p1
To: <sip:34020000001320000001@3402000000>;tag=d9
Call-ID: cn1
CSeq: 1 CANCEL
Content-Length: 0

"
    );
    assert!(t
        .send(Face::Upstream, "10.1.0.9:5060", &cancel_ok)
        .is_empty());
    let terminated = format!(
        "SIP/2.0 487 Request Terminated
Via: SIP/2.0/UDP 10.1.0.1:40000;branch={b};rport=40000
From: <sip:34020000002000000001@3402000000>;tag=p1
To: <sip:34020000001320000001@3402000000>;tag=d9
Call-ID: cn1
CSeq: 1 INVITE
Content-Length: 0

"
    );
    let outs = t.send(Face::Upstream, "10.1.0.9:5060", &terminated);
    assert_eq!(outs.len(), 2, "ACK downstream, 487 to the caller: {outs:?}");
    assert!(status(&outs[0]).starts_with("ACK "));
    assert_eq!(outs[0].face, Face::Upstream);
    assert_eq!(status(&outs[1]), "SIP/2.0 487 Request Terminated");
    assert_eq!(outs[1].to.addr, "10.2.0.50:5060".parse().unwrap());
    assert!(text(&outs[1]).contains("branch=z9hG4bKcn1"));
    // The caller's ACK of the 487 ends at vgate (the callee had its ACK).
    let ack = "ACK sip:34020000001320000001@3402000000 SIP/2.0
Via: SIP/2.0/UDP 10.2.0.50:5060;rport;branch=z9hG4bKcn1
From: <sip:34020000002000000001@3402000000>;tag=p1
To: <sip:34020000001320000001@3402000000>;tag=d9
Call-ID: cn1
CSeq: 1 ACK
Max-Forwards: 70
Content-Length: 0

";
    assert!(t.send(Face::Listen, "10.2.0.50:5060", ack).is_empty());
    t.note_routes();
    assert!(t.routes.routes().is_empty());
    assert_eq!(t.core.counters.calls_ended, 1);
    // No INVITE timeout later: the transaction has its final answer.
    t.advance(Duration::from_secs(40));
    assert!(t.core.tick(t.now, 0).is_empty());
    t.advance(Duration::from_secs(100));
    t.core.tick(t.now, 0);
    assert_eq!(t.core.table_sizes().0, 0);
    t.check("cancel_before_answer");
}

fn reinvite_offer() -> String {
    OFFER.replace("m=video 6000", "m=video 6002")
}

#[test]
fn reinvite_keeps_gateway_ports_and_updates_routes() {
    let mut t = bench(0);
    let (_caller_token, callee_token) = establish_call(&mut t);
    let before = t.routes.routes();
    let fwd_rtp = before
        .iter()
        .find(|r| r.label.ends_with("m0 rtp"))
        .unwrap()
        .clone();
    assert_eq!(fwd_rtp.dest, "10.2.0.50:6000".parse().unwrap());
    let reinvite = with_body(
        &format!(
            "INVITE sip:34020000001320000001@10.2.0.1:5060;vgt={callee_token} SIP/2.0
Via: SIP/2.0/UDP 10.2.0.50:5060;rport;branch=z9hG4bK1003
From: <sip:34020000002000000001@3402000000>;tag=p1
To: <sip:34020000001320000001@3402000000>;tag=d1
Call-ID: 1001@3402000000
CSeq: 21 INVITE
Contact: <sip:34020000002000000001@10.2.0.50:5060>
Max-Forwards: 70
"
        ),
        "application/sdp",
        &reinvite_offer(),
    );
    let outs = t.send(Face::Listen, "10.2.0.50:5060", &reinvite);
    assert_eq!(
        outs.len(),
        1,
        "in-dialog: no 100 of ours, forwarded: {outs:?}"
    );
    assert_eq!(outs[0].to.addr, "10.1.0.9:5060".parse().unwrap());
    let fwd = text(&outs[0]);
    assert!(fwd.starts_with("INVITE sip:34020000001320000001@10.1.0.9:5060 SIP/2.0"));
    // The same gateway pair in A is offered again (the forward route's ingress port).
    let a_port = fwd_rtp.port;
    assert!(fwd.contains(&format!("m=video {a_port} RTP/AVP")), "{fwd}");
    assert_eq!(t.routes.sessions().len(), 1);
    let b = branch_of(&outs[0]);
    let ok = with_body(
        &format!(
            "SIP/2.0 200 OK
Via: SIP/2.0/UDP 10.1.0.1:40000;branch={b};rport=40000
From: <sip:34020000002000000001@3402000000>;tag=p1
To: <sip:34020000001320000001@3402000000>;tag=d1
Call-ID: 1001@3402000000
CSeq: 21 INVITE
Contact: <sip:34020000001320000001@10.1.0.9:5060>
"
        ),
        "application/sdp",
        &ANSWER.replace("m=video 15060", "m=video 15062"),
    );
    let outs = t.send(Face::Upstream, "10.1.0.9:5060", &ok);
    assert_eq!(outs.len(), 1);
    let back = text(&outs[0]);
    assert!(back.contains("branch=z9hG4bK1003"));
    t.note_routes();
    let after = t.routes.routes();
    let rtp = after.iter().find(|r| r.label.ends_with("m0 rtp")).unwrap();
    assert_eq!(rtp.port, fwd_rtp.port, "same gateway port");
    assert_eq!(rtp.egress_port, fwd_rtp.egress_port);
    assert_eq!(rtp.dest, "10.2.0.50:6002".parse().unwrap(), "new B port");
    assert_eq!(
        rtp.expected,
        Some("10.1.0.9:0".parse().unwrap()),
        "the device stays the expected source"
    );
    let rr = after
        .iter()
        .find(|r| r.label.ends_with("m0 rtcp-rr"))
        .unwrap();
    assert_eq!(
        rr.dest,
        "10.1.0.9:15063".parse().unwrap(),
        "RR to the new A port"
    );
    assert_eq!(after.len(), before.len());
    assert_eq!(ports_used(&t), 4, "one pair per domain, no new allocation");
    t.check("reinvite");
}

const MANSRTSP_PAUSE: &str = "PAUSE RTSP/1.0
CSeq: 2
PauseTime: now
";

const MANSRTSP_PLAY: &str = "PLAY RTSP/1.0
CSeq: 3
Scale: 2.0
Range: npt=now-
";

#[test]
fn info_mansrtsp_crosses_in_dialog_unchanged() {
    let mut t = bench(0);
    let (_caller_token, callee_token) = establish_call(&mut t);
    let routes_before = t.routes.routes().len();
    for (i, body) in [MANSRTSP_PAUSE, MANSRTSP_PLAY].iter().enumerate() {
        let cseq = 30 + i;
        let info = with_body(
            &format!(
                "INFO sip:34020000001320000001@10.2.0.1:5060;vgt={callee_token} SIP/2.0
Via: SIP/2.0/UDP 10.2.0.50:5060;rport;branch=z9hG4bKinfo{i}
From: <sip:34020000002000000001@3402000000>;tag=p1
To: <sip:34020000001320000001@3402000000>;tag=d1
Call-ID: 1001@3402000000
CSeq: {cseq} INFO
Max-Forwards: 70
"
            ),
            "Application/MANSRTSP",
            body,
        );
        let outs = t.send(Face::Listen, "10.2.0.50:5060", &info);
        assert_eq!(outs.len(), 1);
        assert_eq!(outs[0].to.addr, "10.1.0.9:5060".parse().unwrap());
        let fwd = text(&outs[0]);
        assert!(fwd.starts_with("INFO sip:34020000001320000001@10.1.0.9:5060 SIP/2.0"));
        assert!(fwd.contains("Content-Type: Application/MANSRTSP\r\n"));
        assert!(fwd.contains(&format!("CSeq: {cseq} INFO\r\n")));
        assert!(
            fwd.ends_with(&body.replace('\n', "\r\n")),
            "MANSRTSP body unchanged"
        );
        let b = branch_of(&outs[0]);
        let ok = format!(
            "SIP/2.0 200 OK
Via: SIP/2.0/UDP 10.1.0.1:40000;branch={b};rport=40000
From: <sip:34020000002000000001@3402000000>;tag=p1
To: <sip:34020000001320000001@3402000000>;tag=d1
Call-ID: 1001@3402000000
CSeq: {cseq} INFO
Content-Length: 0

"
        );
        let outs = t.send(Face::Upstream, "10.1.0.9:5060", &ok);
        assert_eq!(outs.len(), 1);
        assert_eq!(outs[0].to.addr, "10.2.0.50:5060".parse().unwrap());
        assert!(text(&outs[0]).contains(&format!("branch=z9hG4bKinfo{i}")));
    }
    assert_eq!(t.routes.sessions().len(), 1, "INFO touches no media");
    assert_eq!(t.routes.routes().len(), routes_before);
    t.check("info_mansrtsp");
}

#[test]
fn catalog_subscription_notify_comes_back_through_vgate() {
    let mut t = bench(0);
    let query = "<?xml version=\"1.0\"?>\n<Query>\n<CmdType>Catalog</CmdType>\n<SN>41</SN>\n<DeviceID>34020000001320000001</DeviceID>\n</Query>\n";
    let subscribe = |branch: &str, cseq: u32, to_tag: &str, uri: &str, expires: u32| {
        with_body(
            &format!(
                "SUBSCRIBE {uri} SIP/2.0
Via: SIP/2.0/UDP 10.2.0.50:5060;rport;branch={branch}
From: <sip:34020000002000000001@3402000000>;tag=s1
To: <sip:34020000001320000001@3402000000>{to_tag}
Call-ID: sub1@3402000000
CSeq: {cseq} SUBSCRIBE
Contact: <sip:34020000002000000001@10.2.0.50:5060>
Event: Catalog;id=41
Expires: {expires}
Max-Forwards: 70
"
            ),
            "Application/MANSCDP+xml",
            query,
        )
    };
    let outs = t.send(
        Face::Listen,
        "10.2.0.50:5060",
        &subscribe(
            "z9hG4bKsub1",
            1,
            "",
            "sip:34020000001320000001@3402000000",
            3600,
        ),
    );
    assert_eq!(outs.len(), 1);
    assert_eq!(outs[0].to.addr, "10.1.0.9:5060".parse().unwrap());
    let sub_token = token(&outs[0]);
    let b = branch_of(&outs[0]);
    let ok = format!(
        "SIP/2.0 200 OK
Via: SIP/2.0/UDP 10.1.0.1:40000;branch={b};rport=40000
From: <sip:34020000002000000001@3402000000>;tag=s1
To: <sip:34020000001320000001@3402000000>;tag=n1
Call-ID: sub1@3402000000
CSeq: 1 SUBSCRIBE
Contact: <sip:34020000001320000001@10.1.0.9:5060>
Expires: 3600
Content-Length: 0

"
    );
    let outs = t.send(Face::Upstream, "10.1.0.9:5060", &ok);
    assert_eq!(outs.len(), 1);
    let dev_token = token(&outs[0]);
    // The device notifies at the subscriber's contact, i.e. the gateway with a token.
    let notify_body = "<?xml version=\"1.0\" encoding=\"GB2312\"?>\n<Notify>\n<CmdType>Catalog</CmdType>\n<SN>41</SN>\n<DeviceID>34020000001320000001</DeviceID>\n<SumNum>1</SumNum>\n<DeviceList Num=\"1\">\n<Item>\n<DeviceID>34020000001320000001</DeviceID>\n<Event>ON</Event>\n</Item>\n</DeviceList>\n</Notify>\n";
    let notify = with_body(
        &format!(
            "NOTIFY sip:34020000002000000001@10.1.0.1:40000;vgt={sub_token} SIP/2.0
Via: SIP/2.0/UDP 10.1.0.9:5060;rport;branch=z9hG4bKnot1
From: <sip:34020000001320000001@3402000000>;tag=n1
To: <sip:34020000002000000001@3402000000>;tag=s1
Call-ID: sub1@3402000000
CSeq: 1 NOTIFY
Contact: <sip:34020000001320000001@10.1.0.9:5060>
Event: Catalog;id=41
Subscription-State: active;expires=3600
Max-Forwards: 70
"
        ),
        "Application/MANSCDP+xml",
        notify_body,
    );
    let outs = t.send(Face::Upstream, "10.1.0.9:5060", &notify);
    assert_eq!(outs.len(), 1, "{outs:?}");
    assert_eq!(outs[0].face, Face::Listen);
    assert_eq!(outs[0].to.addr, "10.2.0.50:5060".parse().unwrap());
    let fwd = text(&outs[0]);
    assert!(fwd.starts_with("NOTIFY sip:34020000002000000001@10.2.0.50:5060 SIP/2.0"));
    assert!(fwd.contains("Subscription-State: active;expires=3600\r\n"));
    assert!(fwd.ends_with(&notify_body.replace('\n', "\r\n")));
    let nb = branch_of(&outs[0]);
    let notify_ok = format!(
        "SIP/2.0 200 OK
Via: SIP/2.0/UDP 10.2.0.1:5060;branch={nb};rport=5060
From: <sip:34020000001320000001@3402000000>;tag=n1
To: <sip:34020000002000000001@3402000000>;tag=s1
Call-ID: sub1@3402000000
CSeq: 1 NOTIFY
Content-Length: 0

"
    );
    let outs = t.send(Face::Listen, "10.2.0.50:5060", &notify_ok);
    assert_eq!(outs.len(), 1);
    assert_eq!(outs[0].to.addr, "10.1.0.9:5060".parse().unwrap());
    assert!(text(&outs[0]).contains("branch=z9hG4bKnot1"));
    // Unsubscribe in the dialog: routed by the device's token.
    let outs = t.send(
        Face::Listen,
        "10.2.0.50:5060",
        &subscribe(
            "z9hG4bKsub2",
            2,
            ";tag=n1",
            &format!("sip:34020000001320000001@10.2.0.1:5060;vgt={dev_token}"),
            0,
        ),
    );
    assert_eq!(outs.len(), 1);
    assert_eq!(outs[0].to.addr, "10.1.0.9:5060".parse().unwrap());
    assert!(text(&outs[0]).starts_with("SUBSCRIBE sip:34020000001320000001@10.1.0.9:5060 "));
    assert!(
        t.routes.sessions().is_empty(),
        "a subscription has no media"
    );
    t.check("subscribe_notify_catalog");
}

#[test]
fn media_timeout_sends_bye_to_both_sides() {
    let mut t = bench(0);
    establish_call(&mut t);
    let start = vgate::clock::now_ms();
    // 3 s without media: still within the route's media_timeout of 5 s.
    t.advance(Duration::from_secs(2));
    assert!(t.core.tick(t.now, start + 3_000).is_empty());
    assert_eq!(t.routes.sessions().len(), 1);
    t.advance(Duration::from_secs(2));
    let outs = t.core.tick(t.now, start + 6_000);
    for o in &outs {
        let _ = writeln!(
            t.log,
            "-------- tick out {:?} to {}\n{}",
            o.face,
            o.to.addr,
            text(o).replace("\r\n", "\n")
        );
    }
    assert_eq!(outs.len(), 2, "{outs:?}");
    let to_a = outs.iter().find(|o| o.face == Face::Upstream).unwrap();
    let to_b = outs.iter().find(|o| o.face == Face::Listen).unwrap();
    assert_eq!(to_a.to.addr, "10.1.0.9:5060".parse().unwrap());
    assert_eq!(to_b.to.addr, "10.2.0.50:5060".parse().unwrap());
    // Each side gets the Call-ID it knows the call by (vgate hides the caller's from A).
    let a_cid = t.peer_cids[&(Face::Upstream, "1001@3402000000".to_owned())].clone();
    assert_ne!(a_cid, "1001@3402000000");
    for (o, cid) in [(to_a, a_cid.as_str()), (to_b, "1001@3402000000")] {
        let m = text(o);
        assert!(m.starts_with("BYE "), "{m}");
        assert!(m.contains(&format!("Call-ID: {cid}\r\n")), "{m}");
        assert!(m.contains("Reason: SIP;cause=200;text=\"vgate: no media\""));
    }
    // Each side's BYE carries that side's view of the dialog (its own tag in To or From).
    assert!(text(to_a).contains("From: <sip:34020000002000000001@3402000000>;tag=p1\r\n"));
    assert!(text(to_a).contains("To: <sip:34020000001320000001@3402000000>;tag=d1\r\n"));
    assert!(text(to_b).contains("From: <sip:34020000001320000001@3402000000>;tag=d1\r\n"));
    assert!(text(to_b).contains("To: <sip:34020000002000000001@3402000000>;tag=p1\r\n"));
    assert!(
        text(to_a).contains("CSeq: 21 BYE"),
        "above the caller's CSeq 20"
    );
    assert_eq!(t.core.counters.media_timeouts, 1);
    assert!(t.routes.sessions().is_empty());
    assert_eq!(ports_used(&t), 0);
    // Their 200s end at vgate.
    for (face, from, o) in [
        (Face::Upstream, "10.1.0.9:5060", to_a),
        (Face::Listen, "10.2.0.50:5060", to_b),
    ] {
        let m = text(o);
        let via = m.lines().find(|l| l.starts_with("Via: ")).unwrap();
        let hdr = |n: &str| m.lines().find(|l| l.starts_with(n)).unwrap().to_owned();
        let ok = format!(
            "SIP/2.0 200 OK\n{via}\n{}\n{}\n{}\n{}\nContent-Length: 0\n\n",
            hdr("From: "),
            hdr("To: "),
            hdr("Call-ID: "),
            hdr("CSeq: ")
        );
        assert!(t.send(face, from, &ok).is_empty());
    }
    t.note_routes();
    t.check("media_timeout");
}

#[test]
fn talkback_media_flows_on_the_reverse_channel() {
    // GB/T 28181 voice broadcast: after the platform's Broadcast MESSAGE the device in A
    // calls the platform in B, receiving audio (recvonly); the platform sends it.
    let mut t = bench(1);
    let offer = "v=0
o=34020000001320000001 0 0 IN IP4 10.1.0.20
s=Play
c=IN IP4 10.1.0.20
t=0 0
m=audio 8000 RTP/AVP 8
a=recvonly
a=rtpmap:8 PCMA/8000
y=0100000002
f=v/////a/1/8/1
";
    let invite = with_body(
        "INVITE sip:34020000002000000001@3402000000 SIP/2.0
Via: SIP/2.0/UDP 10.1.0.20:5060;rport;branch=z9hG4bKtb1
From: <sip:34020000001320000001@3402000000>;tag=t1
To: <sip:34020000002000000001@3402000000>
Call-ID: talk1@3402000000
CSeq: 1 INVITE
Contact: <sip:34020000001320000001@10.1.0.20:5060>
Subject: 34020000002000000001:0,34020000001320000001:0
Max-Forwards: 70
",
        "application/sdp",
        offer,
    );
    let outs = t.send(Face::Listen, "10.1.0.20:5060", &invite);
    assert_eq!(outs.len(), 2);
    assert_eq!(outs[1].to.addr, "10.2.0.60:5060".parse().unwrap());
    let b = branch_of(&outs[1]);
    let answer = "v=0
o=34020000002000000001 0 0 IN IP4 10.2.0.60
s=Play
c=IN IP4 10.2.0.60
t=0 0
m=audio 9000 RTP/AVP 8
a=sendonly
a=rtpmap:8 PCMA/8000
y=0100000002
f=v/////a/1/8/1
";
    let ok = with_body(
        &format!(
            "SIP/2.0 200 OK
Via: SIP/2.0/UDP 10.2.0.1:40000;branch={b};rport=40000
From: <sip:34020000001320000001@3402000000>;tag=t1
To: <sip:34020000002000000001@3402000000>;tag=pl1
Call-ID: talk1@3402000000
CSeq: 1 INVITE
Contact: <sip:34020000002000000001@10.2.0.60:5060>
"
        ),
        "application/sdp",
        answer,
    );
    let outs = t.send(Face::Upstream, "10.2.0.60:5060", &ok);
    assert_eq!(outs.len(), 1);
    t.note_routes();
    let routes = t.routes.routes();
    let rtp: Vec<_> = routes
        .iter()
        .filter(|r| r.label.ends_with(" rtp"))
        .collect();
    assert_eq!(rtp.len(), 1, "{routes:?}");
    assert_eq!(
        rtp[0].channel,
        vgate::routes::Channel::Reverse,
        "B→A media on the reverse channel"
    );
    assert_eq!(rtp[0].dest, "10.1.0.20:8000".parse().unwrap());
    assert_eq!(rtp[0].expected, Some("10.2.0.60:0".parse().unwrap()));
    let rr = routes
        .iter()
        .find(|r| r.label.ends_with("rtcp-rr"))
        .unwrap();
    assert_eq!(rr.channel, vgate::routes::Channel::Forward);
    assert_eq!(rr.dest, "10.2.0.60:9001".parse().unwrap());
    // The platform's SDP shows the gateway port in A that the reverse route sends from.
    let to_device = text(&outs[0]);
    assert!(to_device.contains(&format!("m=audio {} RTP/AVP 8", rtp[0].egress_port)));
    assert!(to_device.contains("c=IN IP4 10.1.0.1\r\n"));
    t.check("talkback_reverse");
}

#[test]
fn rtcp_mux_installs_the_receiver_report_route_on_the_rtp_ports() {
    let mut t = bench(0);
    let offer = OFFER.replace("a=recvonly", "a=recvonly\na=rtcp-mux");
    let outs = t.send(
        Face::Listen,
        "10.2.0.50:5060",
        &invite_with(&offer, "34020000002000000001", "mux1"),
    );
    let b = branch_of(&outs[1]);
    let ok = with_body(
        &format!(
            "SIP/2.0 200 OK
Via: SIP/2.0/UDP 10.1.0.1:40000;branch={b};rport=40000
From: <sip:34020000002000000001@3402000000>;tag=p1
To: <sip:34020000001320000001@3402000000>;tag=d1
Call-ID: mux1
CSeq: 1 INVITE
Contact: <sip:34020000001320000001@10.1.0.9:5060>
"
        ),
        "application/sdp",
        &ANSWER.replace("a=sendonly", "a=sendonly\na=rtcp-mux"),
    );
    let outs = t.send(Face::Upstream, "10.1.0.9:5060", &ok);
    assert_eq!(outs.len(), 1);
    t.note_routes();
    let routes = t.routes.routes();
    assert_eq!(routes.len(), 2, "{routes:?}");
    let rtp = routes
        .iter()
        .find(|r| r.channel == vgate::routes::Channel::Forward)
        .unwrap();
    let rr = routes
        .iter()
        .find(|r| r.channel == vgate::routes::Channel::Reverse)
        .unwrap();
    assert_eq!(rtp.dest, "10.2.0.50:6000".parse().unwrap());
    assert!(!rtp.rtp_only, "sender reports share the RTP port");
    // The receiver's reports: from its RTP port to the gateway's RTP port in B, out of
    // the gateway's RTP port in A to the sender's RTP port.
    assert_eq!(rr.port, rtp.egress_port);
    assert_eq!(rr.egress_port, rtp.port);
    assert_eq!(rr.dest, "10.1.0.9:15060".parse().unwrap());
    assert_eq!(rr.expected, Some("10.2.0.50:0".parse().unwrap()));
    t.check("rtcp_mux");
}

fn code(o: &Out) -> String {
    text(o).split(' ').nth(1).unwrap_or_default().to_owned()
}

fn register(contact_port: u16, cseq: u32, expires: u32) -> String {
    format!(
        "REGISTER sip:34020000002000000001@3402000000 SIP/2.0
Via: SIP/2.0/UDP 10.1.0.20:{contact_port};rport;branch=z9hG4bKreg{contact_port}x{cseq}
From: <sip:34020000001320000001@3402000000>;tag=r{contact_port}
To: <sip:34020000001320000001@3402000000>
Call-ID: reg{contact_port}@3402000000
CSeq: {cseq} REGISTER
Contact: <sip:34020000001320000001@10.1.0.20:{contact_port}>
Max-Forwards: 70
Expires: {expires}
Content-Length: 0

"
    )
}

fn answer_register(t: &mut Bench, fwd: &Out, code: &str) -> Vec<Out> {
    let f = text(fwd);
    let head = |name: &str| {
        f.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_default()
            .to_owned()
    };
    let resp = format!(
        "SIP/2.0 {code}\n{}\n{}\n{};tag=s1\n{}\n{}\nContent-Length: 0\n\n",
        head("Via:"),
        head("From:"),
        head("To:"),
        head("Call-ID:"),
        head("CSeq:"),
    );
    t.send(Face::Upstream, "10.2.0.60:5060", &resp)
}

/// What a wvp-style platform sends: a request to the device at the address its REGISTER
/// came from (the gateway's upstream face), without any token.
fn platform_message(ruri: &str, n: u32) -> String {
    with_body(
        &format!(
            "MESSAGE {ruri} SIP/2.0
Via: SIP/2.0/UDP 10.2.0.60:5060;rport;branch=z9hG4bKplat{n}
From: <sip:34020000002000000001@3402000000>;tag=p{n}
To: <sip:34020000001320000001@3402000000>
Call-ID: plat{n}@3402000000
CSeq: {n} MESSAGE
Max-Forwards: 70
"
        ),
        "Application/MANSCDP+xml",
        "<?xml version=\"1.0\" encoding=\"GB2312\"?>
<Query>
<CmdType>DeviceInfo</CmdType>
<SN>1</SN>
<DeviceID>34020000001320000001</DeviceID>
</Query>
",
    )
}

#[test]
fn a_registration_routes_only_after_the_registrars_2xx() {
    let mut t = bench(1);
    let outs = t.send(Face::Listen, "10.1.0.20:5070", &register(5070, 1, 3600));
    assert_eq!(outs.len(), 1);
    let tok = token(&outs[0]);
    let by_token = format!("sip:34020000001320000001@10.2.0.1:40000;vgt={tok}");
    // Before the registrar answers, the token routes nothing.
    let o = t.send(
        Face::Upstream,
        "10.2.0.60:5060",
        &platform_message(&by_token, 1),
    );
    assert_eq!(code(&o[0]), "404", "a pending registration must not route");
    // A refused REGISTER never becomes a binding either.
    let fwd = outs[0].clone();
    let back = answer_register(&mut t, &fwd, "403 Forbidden");
    assert_eq!(code(&back[0]), "403");
    let o = t.send(
        Face::Upstream,
        "10.2.0.60:5060",
        &platform_message(&by_token, 2),
    );
    assert_eq!(code(&o[0]), "404");
    t.advance(Duration::from_secs(40));
    let _ = t.core.tick(t.now, 0);
    assert_eq!(t.core.table_sizes().2, 0, "the refused contact is gone");
    // Accepted: now it routes, to the device.
    let outs = t.send(Face::Listen, "10.1.0.20:5070", &register(5070, 2, 3600));
    let tok = token(&outs[0]);
    let fwd = outs[0].clone();
    let back = answer_register(&mut t, &fwd, "200 OK");
    assert_eq!(code(&back[0]), "200");
    let by_token = format!("sip:34020000001320000001@10.2.0.1:40000;vgt={tok}");
    let o = t.send(
        Face::Upstream,
        "10.2.0.60:5060",
        &platform_message(&by_token, 3),
    );
    assert_eq!(o.len(), 1);
    assert_eq!(o[0].to.addr, "10.1.0.20:5070".parse().unwrap());
    assert!(text(&o[0]).starts_with("MESSAGE sip:34020000001320000001@10.1.0.20:5070 "));
}

#[test]
fn a_platform_reaches_a_device_at_the_address_it_registered_from() {
    let mut t = bench(1);
    let outs = t.send(Face::Listen, "10.1.0.20:5070", &register(5070, 1, 3600));
    // Not registered yet: 404.
    let registered_at = "sip:34020000001320000001@10.2.0.1:40000";
    let o = t.send(
        Face::Upstream,
        "10.2.0.60:5060",
        &platform_message(registered_at, 1),
    );
    assert_eq!(code(&o[0]), "404");
    let fwd = outs[0].clone();
    answer_register(&mut t, &fwd, "200 OK");
    // The platform addresses the device where its REGISTER came from, no token.
    let o = t.send(
        Face::Upstream,
        "10.2.0.60:5060",
        &platform_message(registered_at, 2),
    );
    assert_eq!(o.len(), 1, "{}", text(&o[0]));
    assert_eq!(o[0].face, Face::Listen);
    assert_eq!(o[0].to.addr, "10.1.0.20:5070".parse().unwrap());
    assert!(text(&o[0]).starts_with("MESSAGE sip:34020000001320000001@10.1.0.20:5070 "));
    assert_eq!(t.core.counters.routed_by_user, 1);
    // An unknown device ID at the same address: 404.
    let o = t.send(
        Face::Upstream,
        "10.2.0.60:5060",
        &platform_message("sip:34020000001320000099@10.2.0.1:40000", 3),
    );
    assert_eq!(code(&o[0]), "404");
    // Unregistering (Expires: 0, accepted) ends it.
    let outs = t.send(Face::Listen, "10.1.0.20:5070", &register(5070, 3, 0));
    let fwd = outs[0].clone();
    answer_register(&mut t, &fwd, "200 OK");
    t.advance(Duration::from_secs(1));
    let _ = t.core.tick(t.now, 0);
    let o = t.send(
        Face::Upstream,
        "10.2.0.60:5060",
        &platform_message(registered_at, 4),
    );
    assert_eq!(code(&o[0]), "404");
}

#[test]
fn contacts_are_capped_per_source_with_a_counted_refusal() {
    let mut t = bench(1);
    let cap = t.cfg.signaling[1].policy.max_bindings_per_source;
    for i in 0..cap {
        let outs = t.send(
            Face::Listen,
            "10.1.0.20:5070",
            &register(10_000 + i as u16, 1, 3600),
        );
        assert!(
            text(&outs[0]).starts_with("REGISTER"),
            "contact {i} refused"
        );
    }
    let outs = t.send(Face::Listen, "10.1.0.20:5070", &register(9_000, 1, 3600));
    assert_eq!(code(&outs[0]), "403");
    assert!(text(&outs[0]).contains("too many contacts from this source"));
    assert_eq!(t.core.counters.bindings_refused, 1);
    // Another source is not affected.
    let other = register(5070, 1, 3600).replace("10.1.0.20", "10.1.0.21");
    let outs = t.send(Face::Listen, "10.1.0.21:5070", &other);
    assert!(text(&outs[0]).starts_with("REGISTER"));
    // Pending contacts the registrar never accepted expire and free the source's quota.
    t.advance(Duration::from_secs(40));
    let _ = t.core.tick(t.now, 0);
    let outs = t.send(Face::Listen, "10.1.0.20:5070", &register(9_000, 2, 3600));
    assert!(text(&outs[0]).starts_with("REGISTER"));
}

#[test]
fn tokens_and_branches_are_not_guessable() {
    let cfg = config::parse(&CONFIG, "golden.toml").unwrap();
    let routes = Arc::new(Routes::new(&cfg, Arc::new(NoHooks)));
    let r = &cfg.signaling[1];
    let listen = SocketAddrV4::new(cfg.domain(r.listen_domain).address, r.listen_port);
    let up = SocketAddrV4::new(cfg.domain(r.listen_domain.other()).address, 40000);
    let mut ids = Vec::new();
    for _ in 0..2 {
        let secret = vgate::signaling::proxy::sip::random_secret("t").unwrap();
        let mut core =
            Core::new(r, &cfg, Arc::clone(&routes), [listen, up], "").with_secret(secret);
        for port in [5070u16, 5071] {
            let m = register(port, 1, 3600).replace('\n', "\r\n");
            let outs = core.on_message(
                Face::Listen,
                Peer::udp(format!("10.1.0.20:{port}").parse().unwrap()),
                m.as_bytes(),
                Instant::now(),
            );
            ids.push(token(&outs[0]));
            ids.push(branch_of(&outs[0]));
        }
    }
    for id in &ids {
        let tail = id.trim_start_matches("z9hG4bKvg");
        assert!(
            tail.len() >= 24 && tail.bytes().all(|b| b.is_ascii_hexdigit()),
            "{id}"
        );
    }
    let mut uniq = ids.clone();
    uniq.sort();
    uniq.dedup();
    assert_eq!(uniq.len(), ids.len(), "identifiers repeat: {ids:?}");
    // Consecutive identifiers share no prefix a counter would leave.
    assert_ne!(ids[0][..8], ids[2][..8]);
}

/// The MANSCDP body `tests/golden/manscdp/<name>`, as text.
fn manscdp(name: &str) -> String {
    String::from_utf8(golden_bytes(name)).unwrap()
}

fn golden_bytes(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/golden/manscdp/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn check_golden_bytes(name: &str, got: &[u8]) {
    let path = format!("{}/tests/golden/manscdp/{name}", env!("CARGO_MANIFEST_DIR"));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, got).unwrap();
        return;
    }
    let want = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}; run with UPDATE_GOLDEN=1 to create it"));
    assert!(
        want == got,
        "{name}: output differs from {path} (UPDATE_GOLDEN=1 rewrites it):\n{}",
        String::from_utf8_lossy(got)
    );
}

/// A MESSAGE from the device in A carrying `body` (bytes, any encoding) to the platform.
fn device_message(body: &[u8], n: u32) -> Vec<u8> {
    let mut m = format!(
        "MESSAGE sip:34020000002000000001@3402000000 SIP/2.0\r\n\
Via: SIP/2.0/UDP 10.1.0.20:5060;rport;branch=z9hG4bKmsg{n}\r\n\
From: <sip:34020000001110000001@3402000000>;tag=m{n}\r\n\
To: <sip:34020000002000000001@3402000000>\r\n\
Call-ID: msg{n}@3402000000\r\n\
CSeq: {n} MESSAGE\r\n\
Max-Forwards: 70\r\n\
Content-Type: Application/MANSCDP+xml\r\n\
Content-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    m.extend_from_slice(body);
    m
}

/// Splits what vgate sent into head and body, checking Content-Length against the body.
fn head_and_body(o: &Out) -> (String, Vec<u8>) {
    let b = &o.bytes;
    let at = b.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let head = String::from_utf8(b[..at].to_vec()).unwrap();
    let body = b[at..].to_vec();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(
        len,
        body.len(),
        "Content-Length must match the rewritten body"
    );
    (head, body)
}

/// GB2312 bytes of the device names in the golden bodies: they must cross unchanged.
const GB2312_EAST_GATE: &[u8] = b"\xb6\xab\xc3\xc5\xc8\xeb\xbf\xda\xc7\xb9\xbb\xfa";

#[test]
fn manscdp_catalog_in_gb2312_gets_the_gateway_address() {
    let mut t = bench(1);
    let body = golden_bytes("catalog.in.xml");
    assert!(body
        .windows(GB2312_EAST_GATE.len())
        .any(|w| w == GB2312_EAST_GATE));
    let m = device_message(&body, 1);
    let outs = t.core.on_message(
        Face::Listen,
        Peer::udp("10.1.0.20:5060".parse().unwrap()),
        &m,
        t.now,
    );
    assert_eq!(outs.len(), 1);
    let (head, out_body) = head_and_body(&outs[0]);
    assert!(head.starts_with("MESSAGE "));
    check_golden_bytes("catalog.gateway.xml", &out_body);
    assert!(
        !outs[0].bytes.windows(8).any(|w| w == b"192.168."),
        "a device address crossed"
    );
    assert!(out_body
        .windows(GB2312_EAST_GATE.len())
        .any(|w| w == GB2312_EAST_GATE));
    // The address field holding a place name in GB2312 is kept.
    assert!(out_body
        .windows(10)
        .any(|w| w == b"\xcd\xa3\xb3\xb5\xb3\xa1\xb1\xb1\xb2\xe0"));
    assert_eq!(t.core.counters.manscdp_rewritten, 1);
}

#[test]
fn manscdp_deviceinfo_blanked_when_the_route_says_so() {
    let cfg = CONFIG.replace(
        "upstream = \"10.2.0.60:5060\"\n",
        "upstream = \"10.2.0.60:5060\"\nmanscdp_addresses = \"blank\"\n",
    );
    let mut t = bench_with(&cfg, 1);
    let m = device_message(&golden_bytes("deviceinfo.in.xml"), 2);
    let outs = t.core.on_message(
        Face::Listen,
        Peer::udp("10.1.0.20:5060".parse().unwrap()),
        &m,
        t.now,
    );
    let (_, out_body) = head_and_body(&outs[0]);
    check_golden_bytes("deviceinfo.blank.xml", &out_body);
    assert!(!outs[0].bytes.windows(8).any(|w| w == b"192.168."));
    // "keep" passes the body byte for byte.
    let cfg = CONFIG.replace(
        "upstream = \"10.2.0.60:5060\"\n",
        "upstream = \"10.2.0.60:5060\"\nmanscdp_addresses = \"keep\"\n",
    );
    let mut t = bench_with(&cfg, 1);
    let outs = t.core.on_message(
        Face::Listen,
        Peer::udp("10.1.0.20:5060".parse().unwrap()),
        &m,
        t.now,
    );
    let (_, out_body) = head_and_body(&outs[0]);
    assert_eq!(out_body, golden_bytes("deviceinfo.in.xml"));
}

fn platform_control(body: &str, n: u32) -> String {
    with_body(
        &format!(
            "MESSAGE sip:34020000001320000001@3402000000 SIP/2.0
Via: SIP/2.0/UDP 10.2.0.50:5060;rport;branch=z9hG4bKctl{n}
From: <sip:34020000002000000001@3402000000>;tag=c{n}
To: <sip:34020000001320000001@3402000000>
Call-ID: ctl{n}@3402000000
CSeq: {n} MESSAGE
Max-Forwards: 70
"
        ),
        "Application/MANSCDP+xml",
        body,
    )
}

#[test]
fn manscdp_commands_refused_by_route_policy_get_403_and_are_counted() {
    // Without a policy everything crosses (the default).
    let mut t = bench(0);
    let o = t.send(
        Face::Listen,
        "10.2.0.50:5060",
        &platform_control(&manscdp("teleboot.control.xml"), 1),
    );
    assert!(text(&o[0]).starts_with("MESSAGE "), "{}", text(&o[0]));
    let cfg = CONFIG.replace(
        "upstream_port = 5061\nmedia_timeout = 5\n",
        "upstream_port = 5061\nmedia_timeout = 5\nmanscdp_deny = [\"TeleBoot\", \"DeviceConfig\"]\n",
    );
    let mut t = bench_with(&cfg, 0);
    let o = t.send(
        Face::Listen,
        "10.2.0.50:5060",
        &platform_control(&manscdp("teleboot.control.xml"), 1),
    );
    assert_eq!(o.len(), 1);
    assert_eq!(code(&o[0]), "403");
    assert!(text(&o[0]).contains("MANSCDP command TeleBoot is not allowed"));
    let o = t.send(
        Face::Listen,
        "10.2.0.50:5060",
        &platform_control(&manscdp("ptz.control.xml"), 2),
    );
    assert!(text(&o[0]).starts_with("MESSAGE "), "PTZ is not denied");
    assert_eq!(t.core.counters.manscdp_refused, 1);
    // An allow-list: only the commands named cross.
    let cfg = CONFIG.replace(
        "upstream_port = 5061\nmedia_timeout = 5\n",
        "upstream_port = 5061\nmedia_timeout = 5\nmanscdp_allow = [\"Catalog\", \"DeviceControl\"]\nmanscdp_deny = [\"TeleBoot\"]\n",
    );
    let mut t = bench_with(&cfg, 0);
    let o = t.send(
        Face::Listen,
        "10.2.0.50:5060",
        &platform_control(&manscdp("deviceinfo.query.xml"), 3),
    );
    assert_eq!(code(&o[0]), "403");
    let o = t.send(
        Face::Listen,
        "10.2.0.50:5060",
        &platform_control(&manscdp("ptz.control.xml"), 4),
    );
    assert!(text(&o[0]).starts_with("MESSAGE "));
    let o = t.send(
        Face::Listen,
        "10.2.0.50:5060",
        &platform_control(&manscdp("teleboot.control.xml"), 5),
    );
    assert_eq!(code(&o[0]), "403");
    assert_eq!(t.core.counters.manscdp_refused, 2);
    assert!(t.core.counters.list().contains(&("manscdp_refused", 2)));
}

/// No message vgate sent into one domain names an address of the other (10.1/16 is A,
/// 10.2/16 is B; route 0 listens in B).
fn assert_no_leak(outs: &[Out]) {
    for o in outs {
        let m = text(o);
        let foreign = match o.face {
            Face::Upstream => "10.2.",
            Face::Listen => "10.1.",
        };
        assert!(
            !m.contains(foreign),
            "{foreign} leaked into {:?}:\n{m}",
            o.face
        );
    }
}

fn in_dialog(
    method: &str,
    ruri: &str,
    (from, to): (&str, &str),
    call: &str,
    cseq: u32,
    n: &str,
    via: &str,
) -> String {
    format!(
        "{method} {ruri} SIP/2.0
Via: SIP/2.0/UDP {via};rport;branch=z9hG4bK{n}
From: {from}
To: {to}
Call-ID: {call}
CSeq: {cseq} {method}
Max-Forwards: 70
Content-Length: 0

"
    )
}

fn answer(
    t: &mut Bench,
    face: Face,
    from: &str,
    req: &Out,
    status: &str,
    to_tag: Option<&str>,
) -> Vec<Out> {
    let f = text(req);
    let h = |name: &str| {
        f.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_default()
            .to_owned()
    };
    let to = match to_tag {
        Some(tag) if !h("To:").contains(";tag=") => format!("{};tag={tag}", h("To:")),
        _ => h("To:"),
    };
    let r = format!(
        "SIP/2.0 {status}\n{}\n{}\n{to}\n{}\n{}\nContent-Length: 0\n\n",
        h("Via:"),
        h("From:"),
        h("Call-ID:"),
        h("CSeq:")
    );
    t.send(face, from, &r)
}

#[test]
fn call_ids_with_addresses_never_cross() {
    let mut t = bench(0);
    let call = "8f3a55e1@10.2.0.50";
    let invite = invite_with(OFFER, "34020000002000000001", "x1")
        .replace("Call-ID: x1", &format!("Call-ID: {call}"));
    let outs = t.send(Face::Listen, "10.2.0.50:5060", &invite);
    assert_no_leak(&outs);
    let inv = outs
        .iter()
        .find(|o| o.face == Face::Upstream)
        .unwrap()
        .clone();
    let a_cid = call_id_of(&text(&inv)).unwrap();
    assert_ne!(a_cid, call);
    let caller_token = token(&inv);
    // 200 from the device (with the Call-ID it received), SDP and all.
    let f = text(&inv);
    let h = |name: &str| {
        f.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_default()
            .to_owned()
    };
    let ok = with_body(
        &format!(
            "SIP/2.0 200 OK\n{}\n{}\n{};tag=d1\nCall-ID: {a_cid}\n{}\nContact: <sip:34020000001320000001@10.1.0.9:5060>\n",
            h("Via:"),
            h("From:"),
            h("To:"),
            h("CSeq:")
        ),
        "application/sdp",
        ANSWER,
    );
    let outs = t.send(Face::Upstream, "10.1.0.9:5060", &ok);
    assert_no_leak(&outs);
    assert_eq!(
        call_id_of(&text(&outs[0])).unwrap(),
        call,
        "the caller gets its own Call-ID back"
    );
    let callee_token = token(&outs[0]);
    let (p, d) = (
        "<sip:34020000002000000001@3402000000>;tag=p1",
        "<sip:34020000001320000001@3402000000>;tag=d1",
    );
    let to_callee = format!("sip:34020000001320000001@10.2.0.1:5060;vgt={callee_token}");
    let to_caller = format!("sip:34020000002000000001@10.1.0.1:40000;vgt={caller_token}");
    let ack = in_dialog("ACK", &to_callee, (p, d), call, 1, "ack1", "10.2.0.50:5060");
    let outs = t.send(Face::Listen, "10.2.0.50:5060", &ack);
    assert_no_leak(&outs);
    assert!(text(&outs[0]).contains(&format!("Call-ID: {a_cid}\r\n")));
    // In-dialog requests from each side, and their answers.
    let info = in_dialog(
        "INFO",
        &to_callee,
        (p, d),
        call,
        2,
        "info1",
        "10.2.0.50:5060",
    );
    let outs = t.send(Face::Listen, "10.2.0.50:5060", &info);
    assert_no_leak(&outs);
    let fwd = outs[0].clone();
    assert_no_leak(&answer(
        &mut t,
        Face::Upstream,
        "10.1.0.9:5060",
        &fwd,
        "200 OK",
        None,
    ));
    let info = in_dialog(
        "INFO",
        &to_caller,
        (d, p),
        &a_cid,
        1,
        "info2",
        "10.1.0.9:5060",
    );
    let outs = t.send(Face::Upstream, "10.1.0.9:5060", &info);
    assert_eq!(outs.len(), 1, "{outs:?}");
    assert_no_leak(&outs);
    assert!(text(&outs[0]).contains(&format!("Call-ID: {call}\r\n")));
    let fwd = outs[0].clone();
    assert_no_leak(&answer(
        &mut t,
        Face::Listen,
        "10.2.0.50:5060",
        &fwd,
        "200 OK",
        None,
    ));
    // BYE from the device; the call ends.
    let bye = in_dialog(
        "BYE",
        &to_caller,
        (d, p),
        &a_cid,
        2,
        "bye1",
        "10.1.0.9:5060",
    );
    let outs = t.send(Face::Upstream, "10.1.0.9:5060", &bye);
    assert_no_leak(&outs);
    let fwd = outs[0].clone();
    assert_no_leak(&answer(
        &mut t,
        Face::Listen,
        "10.2.0.50:5060",
        &fwd,
        "200 OK",
        None,
    ));
    assert_eq!(t.routes.sessions().len(), 0);

    // A call cancelled before the answer: INVITE, CANCEL, 487, ACK all hide it too.
    let call2 = "c2@10.2.0.50";
    let invite = invite_with(OFFER, "34020000002000000001", "x2")
        .replace("Call-ID: x2", &format!("Call-ID: {call2}"));
    let outs = t.send(Face::Listen, "10.2.0.50:5060", &invite);
    assert_no_leak(&outs);
    let inv = outs
        .iter()
        .find(|o| o.face == Face::Upstream)
        .unwrap()
        .clone();
    let cancel = format!(
        "CANCEL sip:34020000001320000001@3402000000 SIP/2.0
Via: SIP/2.0/UDP 10.2.0.50:5060;rport;branch=z9hG4bKx2
From: <sip:34020000002000000001@3402000000>;tag=p1
To: <sip:34020000001320000001@3402000000>
Call-ID: {call2}
CSeq: 1 CANCEL
Max-Forwards: 70
Content-Length: 0

"
    );
    let outs = t.send(Face::Listen, "10.2.0.50:5060", &cancel);
    assert_no_leak(&outs);
    let down = outs.iter().find(|o| o.face == Face::Upstream).unwrap();
    assert!(text(down).starts_with("CANCEL "));
    assert!(!text(down).contains(call2));
    let outs = answer(
        &mut t,
        Face::Upstream,
        "10.1.0.9:5060",
        &inv,
        "487 Request Terminated",
        Some("d2"),
    );
    assert_no_leak(&outs);
    let up = outs.iter().find(|o| o.face == Face::Listen).unwrap();
    assert!(
        text(up).contains(&format!("Call-ID: {call2}\r\n")),
        "{}",
        text(up)
    );
    let ack = outs.iter().find(|o| o.face == Face::Upstream).unwrap();
    assert!(text(ack).starts_with("ACK ") && !text(ack).contains(call2));
    assert_eq!(t.routes.sessions().len(), 0);
}

#[test]
fn a_devices_call_id_with_its_address_never_reaches_the_platform() {
    // Route 1 listens in A: the device's REGISTER and MESSAGE carry `...@10.1.0.20`.
    let mut t = bench(1);
    let reg = register(5070, 1, 3600).replace("reg5070@3402000000", "77d1@10.1.0.20");
    let outs = t.send(Face::Listen, "10.1.0.20:5070", &reg);
    let fwd = outs[0].clone();
    assert!(!text(&fwd).contains("10.1."), "{}", text(&fwd));
    let back = answer_register(&mut t, &fwd, "200 OK");
    assert!(text(&back[0]).contains("Call-ID: 77d1@10.1.0.20\r\n"));
    // A refresh keeps the same Call-ID upstream (the registrar sees one registration).
    // (also when it comes late: two hours on, past any dialog's idle time).
    t.advance(Duration::from_secs(2 * 3600));
    let _ = t.core.tick(t.now, 0);
    let again = register(5070, 2, 3600).replace("reg5070@3402000000", "77d1@10.1.0.20");
    let outs = t.send(Face::Listen, "10.1.0.20:5070", &again);
    assert_eq!(call_id_of(&text(&outs[0])), call_id_of(&text(&fwd)));
}

#[test]
fn registrations_list_only_contacts_the_registrar_confirmed() {
    let mut t = bench(1);
    let outs = t.send(Face::Listen, "10.1.0.20:5070", &register(5070, 1, 3600));
    assert!(
        t.core.registrations(t.now).is_empty(),
        "pending until the 2xx"
    );
    let fwd = outs[0].clone();
    answer_register(&mut t, &fwd, "200 OK");
    let regs = t.core.registrations(t.now);
    assert_eq!(regs.len(), 1, "{regs:?}");
    let r = &regs[0];
    assert_eq!(r.id, "34020000001320000001");
    assert_eq!(r.peer, "10.1.0.20:5070".parse().unwrap());
    assert_eq!(r.token, token(&outs[0]));
    assert!(r.expires_in > Duration::from_secs(3500) && r.expires_in <= Duration::from_secs(3700));
}

#[test]
fn call_setup_time_is_observed_once_per_answered_call() {
    let mut t = bench(0);
    let (before, _) = t.core.stats.call_setup.snapshot();
    assert_eq!(before.last().unwrap().1, 0);
    establish_call(&mut t);
    let (after, _) = t.core.stats.call_setup.snapshot();
    assert_eq!(after.last().unwrap().1, 1, "{after:?}");
}

/// Observations of the time-to-first-packet histogram of SIP routes.
fn sip_first_packets(routes: &Routes) -> u64 {
    routes.count_first_packets();
    let h = routes
        .first_packet_histogram(vgate::routes::SessionKind::Sip)
        .unwrap();
    h.snapshot().0.last().unwrap().1
}

#[test]
fn a_call_route_with_traffic_gives_one_time_to_first_packet() {
    let mut t = bench(0);
    establish_call(&mut t);
    assert_eq!(sip_first_packets(&t.routes), 0, "no media yet");
    let fwd = t
        .routes
        .routes()
        .into_iter()
        .find(|r| r.label.ends_with("m0 rtp"))
        .unwrap();
    // What a worker does with a datagram: the admission checks, then the touch.
    let mut rtp = vec![0x80, 96, 0, 1, 0, 0, 0, 0, 0x05, 0xf5, 0xe1, 0x01];
    rtp.extend_from_slice(&[0u8; 100]);
    let now = vgate::clock::now_ms();
    let stranger = "10.1.0.77:5000".parse().unwrap();
    let mut media = vgate::channel::Validators::new(8, Default::default());
    assert!(vgate::channel::inspect(&fwd, stranger, &rtp, false, 1500, now, &mut media).is_err());
    assert_eq!(
        sip_first_packets(&t.routes),
        0,
        "a refused packet is not media"
    );
    let device = "10.1.0.9:5000".parse().unwrap();
    for _ in 0..3 {
        vgate::channel::inspect(&fwd, device, &rtp, false, 1500, now, &mut media).unwrap();
        fwd.touch(now);
    }
    assert_eq!(sip_first_packets(&t.routes), 1);
    assert_eq!(sip_first_packets(&t.routes), 1, "counted once");
    drop(fwd);
    for s in t.routes.sessions() {
        t.routes.close_session(s.id).unwrap();
    }
    assert_eq!(
        sip_first_packets(&t.routes),
        1,
        "not again at the route's removal"
    );
}

// ---- GB/T 28181-2022 at the boundary -------------------------------------------------

/// [`assert_no_leak`] for route 1, which listens in A: nothing of A goes upstream (B),
/// nothing of B to the listen face (A).
fn assert_no_leak_listen_in_a(outs: &[Out]) {
    for o in outs {
        let m = text(o);
        let foreign = match o.face {
            Face::Upstream => "10.1.",
            Face::Listen => "10.2.",
        };
        assert!(
            !m.contains(foreign),
            "{foreign} leaked into {:?}:\n{m}",
            o.face
        );
    }
}

/// A 2022 device's REGISTER (route 1: the device in A registers with the platform in B),
/// addressed to the gateway's A address as the device was configured.
fn register_2022(branch: &str, cseq: u32, auth: &str) -> String {
    format!(
        "REGISTER sip:34020000002000000001@10.1.0.1:5060 SIP/2.0
Via: SIP/2.0/UDP 10.1.0.20:5060;rport;branch={branch}
From: <sip:34020000001320000001@3402000000>;tag=g22
To: <sip:34020000001320000001@3402000000>
Call-ID: 2022reg@10.1.0.20
CSeq: {cseq} REGISTER
Contact: <sip:34020000001320000001@10.1.0.20:5060>
Max-Forwards: 70
User-Agent: IP Camera
X-GB-ver: 3.0
{auth}Expires: 3600
Content-Length: 0

"
    )
}

/// The branch vgate put in its Via.
fn our_branch(o: &Out) -> String {
    text(o)
        .split("branch=")
        .nth(1)
        .unwrap()
        .split([';', '\r'])
        .next()
        .unwrap()
        .to_owned()
}

fn header_line<'a>(msg: &'a str, name: &str) -> Vec<&'a str> {
    msg.lines()
        .filter(|l| {
            l.split(':')
                .next()
                .is_some_and(|n| n.eq_ignore_ascii_case(name))
        })
        .collect()
}

#[test]
fn gb2022_register_with_x_gb_ver_and_sm3_digest_crosses_intact() {
    let mut t = bench(1);
    let outs = t.send(
        Face::Listen,
        "10.1.0.20:5060",
        &register_2022("z9hG4bK22a", 1, ""),
    );
    assert_eq!(outs.len(), 1);
    let fwd = text(&outs[0]);
    assert!(
        fwd.starts_with("REGISTER sip:34020000002000000001@10.2.0.60:5060 SIP/2.0\r\n"),
        "without credentials the Request-URI names the registrar: {fwd}"
    );
    assert_eq!(header_line(&fwd, "X-GB-ver"), ["X-GB-ver: 3.0"]);
    assert_no_leak_listen_in_a(&outs);
    let challenge = format!(
        "SIP/2.0 401 Unauthorized
Via: SIP/2.0/UDP 10.2.0.1:40000;branch={};rport=40000
From: <sip:34020000001320000001@3402000000>;tag=g22
To: <sip:34020000001320000001@3402000000>;tag=1860151452
Call-ID: {}
CSeq: 1 REGISTER
WWW-Authenticate: Digest realm=\"3402000000\", nonce=\"5a4b2c6d9e0f1a2b\", opaque=\"9c7d\", qop=\"auth\", algorithm=SM3
User-Agent: WVP-Pro
X-GB-ver: 3.0
Content-Length: 0

",
        our_branch(&outs[0]),
        call_id_of(&fwd).unwrap()
    );
    let back = t.send(Face::Upstream, "10.2.0.60:5060", &challenge);
    assert_eq!(back.len(), 1);
    let b = text(&back[0]);
    assert_eq!(
        header_line(&b, "WWW-Authenticate"),
        ["WWW-Authenticate: Digest realm=\"3402000000\", nonce=\"5a4b2c6d9e0f1a2b\", opaque=\"9c7d\", qop=\"auth\", algorithm=SM3"]
    );
    assert_eq!(header_line(&b, "X-GB-ver"), ["X-GB-ver: 3.0"]);
    // The device's answer to the challenge: SM3 over the Request-URI it wrote.
    let auth = "Authorization: Digest username=\"34020000001320000001\", realm=\"3402000000\", nonce=\"5a4b2c6d9e0f1a2b\", uri=\"sip:34020000002000000001@10.1.0.1:5060\", response=\"6b1f3e0d2a4c5b7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f708192a3b4\", algorithm=SM3, cnonce=\"0a4f113b\", opaque=\"9c7d\", qop=auth, nc=00000001\n";
    let outs = t.send(
        Face::Listen,
        "10.1.0.20:5060",
        &register_2022("z9hG4bK22b", 2, auth),
    );
    assert_eq!(outs.len(), 1);
    let fwd = text(&outs[0]);
    assert!(
        fwd.starts_with("REGISTER sip:34020000002000000001@10.1.0.1:5060 SIP/2.0\r\n"),
        "the Request-URI the digest covers is kept: {fwd}"
    );
    assert_eq!(
        header_line(&fwd, "Authorization"),
        [auth.trim_end()],
        "credentials byte for byte"
    );
    assert_eq!(header_line(&fwd, "X-GB-ver"), ["X-GB-ver: 3.0"]);
    let ok = format!(
        "SIP/2.0 200 OK
Via: SIP/2.0/UDP 10.2.0.1:40000;branch={};rport=40000
From: <sip:34020000001320000001@3402000000>;tag=g22
To: <sip:34020000001320000001@3402000000>;tag=1860151453
Call-ID: {}
CSeq: 2 REGISTER
Contact: <sip:34020000001320000001@10.2.0.1:40000;vgt={}>;expires=3600
Date: 2026-12-03T00:30:00.000
X-GB-ver: 3.0
Content-Length: 0

",
        our_branch(&outs[0]),
        call_id_of(&fwd).unwrap(),
        token(&outs[0])
    );
    let back = t.send(Face::Upstream, "10.2.0.60:5060", &ok);
    assert_eq!(back.len(), 1);
    let b = text(&back[0]);
    assert!(b.starts_with("SIP/2.0 200 OK\r\n"));
    assert_eq!(header_line(&b, "X-GB-ver"), ["X-GB-ver: 3.0"]);
    assert!(
        !b.contains("10.2."),
        "no domain-B address reaches the device: {b}"
    );
    assert_eq!(t.core.registrations(t.now).len(), 1);
    t.check("register_2022_sm3");
}

#[test]
fn gb2022_302_answering_register_redirects_through_the_gateway() {
    let mut t = bench(1);
    let outs = t.send(
        Face::Listen,
        "10.1.0.20:5060",
        &register_2022("z9hG4bK302a", 1, ""),
    );
    let fwd = text(&outs[0]);
    let redirect = format!(
        "SIP/2.0 302 Moved Temporarily
Via: SIP/2.0/UDP 10.2.0.1:40000;branch={};rport=40000
From: <sip:34020000001320000001@3402000000>;tag=g22
To: <sip:34020000001320000001@3402000000>;tag=77
Call-ID: {}
CSeq: 1 REGISTER
Contact: <sip:34020000002000000002@10.2.0.61:5070>
X-GB-ver: 3.0
Content-Length: 0

",
        our_branch(&outs[0]),
        call_id_of(&fwd).unwrap()
    );
    let back = t.send(Face::Upstream, "10.2.0.60:5060", &redirect);
    assert_eq!(back.len(), 1);
    assert_no_leak_listen_in_a(&back);
    let b = text(&back[0]);
    assert!(b.starts_with("SIP/2.0 302 Moved Temporarily\r\n"));
    let contact = header_line(&b, "Contact")[0].to_owned();
    assert!(
        contact.starts_with("Contact: <sip:34020000002000000002@10.1.0.1:5060;vgt="),
        "the redirect names the gateway: {contact}"
    );
    assert_eq!(header_line(&b, "X-GB-ver"), ["X-GB-ver: 3.0"]);
    // The device registers where it was sent: the gateway forwards to the new server.
    let tok = token(&back[0]);
    let again = register_2022("z9hG4bK302b", 2, "").replace(
        "REGISTER sip:34020000002000000001@10.1.0.1:5060",
        &format!("REGISTER sip:34020000002000000002@10.1.0.1:5060;vgt={tok}"),
    );
    let outs = t.send(Face::Listen, "10.1.0.20:5060", &again);
    assert_eq!(outs.len(), 1);
    assert_eq!(outs[0].to.addr, "10.2.0.61:5070".parse().unwrap());
    let fwd = text(&outs[0]);
    assert!(
        fwd.starts_with("REGISTER sip:34020000002000000002@10.2.0.61:5070 SIP/2.0\r\n"),
        "{fwd}"
    );
    assert_no_leak_listen_in_a(&outs);
    let back = answer_register_from(&mut t, &outs[0], "200 OK", "10.2.0.61:5070");
    assert_eq!(back.len(), 1);
    assert!(text(&back[0]).starts_with("SIP/2.0 200 OK\r\n"));
    assert_no_leak_listen_in_a(&back);
    assert_eq!(t.core.registrations(t.now).len(), 1);
    t.check("register_302_redirect");
}

fn answer_register_from(t: &mut Bench, fwd: &Out, code: &str, from: &str) -> Vec<Out> {
    let f = text(fwd);
    let head = |name: &str| header_line(&f, name)[0].to_owned();
    let resp = format!(
        "SIP/2.0 {code}\n{}\n{}\n{};tag=s1\n{}\n{}\n{}\nContent-Length: 0\n\n",
        head("Via"),
        head("From"),
        head("To"),
        head("Call-ID"),
        head("CSeq"),
        head("Contact"),
    );
    t.send(Face::Upstream, from, &resp)
}

/// 丂乚㐀 (GBK trail bytes 0x40 and 0x5d, a four-byte GB 18030 character with ASCII
/// digits inside) and 𠀀𠀁 (two four-byte characters).
const GB18030_NAMES: [&[u8]; 2] = [
    b"\x81\x40\x81\x5d\x81\x39\xee\x39",
    b"\x95\x32\x82\x36\x95\x32\x82\x37",
];

#[test]
fn manscdp_catalog_in_gb18030_is_rewritten_on_bytes() {
    let mut t = bench(1);
    let body = golden_bytes("catalog_gb18030.in.xml");
    assert!(std::str::from_utf8(&body).is_err(), "not UTF-8");
    let m = device_message(&body, 7);
    let outs = t.core.on_message(
        Face::Listen,
        Peer::udp("10.1.0.20:5060".parse().unwrap()),
        &m,
        t.now,
    );
    assert_eq!(outs.len(), 1);
    let (_, out_body) = head_and_body(&outs[0]);
    assert_ne!(out_body.len(), body.len(), "the addresses changed length");
    check_golden_bytes("catalog_gb18030.gateway.xml", &out_body);
    for name in GB18030_NAMES {
        assert!(out_body.windows(name.len()).any(|w| w == name));
    }
    assert!(!outs[0].bytes.windows(8).any(|w| w == b"192.168."));
    assert!(!outs[0].bytes.windows(5).any(|w| w == b"10.1."));
    // Everything but the address fields is byte for byte the device's.
    let strip = |b: &[u8]| {
        let s: Vec<u8> = b.to_vec();
        let mut out = Vec::new();
        let mut i = 0;
        while i < s.len() {
            let rest = &s[i..];
            let field = [&b"<IPAddress>"[..], b"<Address>", b"<Port>"]
                .into_iter()
                .find(|f| rest.starts_with(f));
            if let Some(f) = field {
                out.extend_from_slice(f);
                i += f.len();
                while s[i] != b'<' {
                    i += 1;
                }
            } else {
                out.push(s[i]);
                i += 1;
            }
        }
        out
    };
    let kept = strip(&body);
    assert_eq!(strip(&out_body), kept);
    assert_eq!(t.core.counters.manscdp_rewritten, 1);
}

/// An offer of H.265 video (PT 100, `f=` video codec 5) and AAC audio as a GB/T
/// 28181-2022 platform writes it (PT 102 `AAC/8000/1`, AAC-hbr) and as RFC 3640 does (PT 97
/// `MPEG4-GENERIC`).
const H265_AAC_OFFER: &str = "v=0
o=34020000002000000001 0 0 IN IP4 10.2.0.50
s=Play
c=IN IP4 10.2.0.50
t=0 0
m=video 6000 RTP/AVP 100
a=recvonly
a=rtpmap:100 H265/90000
m=audio 6002 RTP/AVP 102 97
a=recvonly
a=rtpmap:102 AAC/8000/1
a=fmtp:102 streamtype=5;profile-level-id=16;mode=AAC-hbr;config=1588;sizeLength=13;indexLength=3;indexDeltaLength=3;constantDuration=1024
a=rtpmap:97 MPEG4-GENERIC/16000/1
a=fmtp:97 streamtype=5;profile-level-id=15;mode=AAC-hbr;config=1408;sizelength=13;indexlength=3;indexdeltalength=3
y=0100000022
f=v/5/6/25/1/4096a/1/3/3
";

const H265_AAC_ANSWER: &str = "v=0
o=34020000001320000001 0 0 IN IP4 10.1.0.9
s=Play
c=IN IP4 10.1.0.9
t=0 0
m=video 15060 RTP/AVP 100
a=sendonly
a=rtpmap:100 H265/90000
m=audio 15062 RTP/AVP 102
a=sendonly
a=rtpmap:102 AAC/8000/1
a=fmtp:102 streamtype=5;profile-level-id=16;mode=AAC-hbr;config=1588;sizeLength=13;indexLength=3;indexDeltaLength=3;constantDuration=1024
y=0100000022
f=v/5/6/25/1/4096a/1/3/3
";

#[test]
fn gb2022_h265_and_aac_cross_and_are_validated() {
    let mut t = validating("enforce");
    let outs = t.send(
        Face::Listen,
        "10.2.0.50:5060",
        &invite_with(H265_AAC_OFFER, "34020000002000000001", "h265"),
    );
    assert_eq!(
        outs.len(),
        2,
        "100 Trying and the INVITE: {}",
        text(&outs[0])
    );
    let fwd = text(&outs[1]);
    for l in [
        "a=rtpmap:100 H265/90000\r\n",
        "a=rtpmap:102 AAC/8000/1\r\n",
        "a=rtpmap:97 MPEG4-GENERIC/16000/1\r\n",
        "y=0100000022\r\nf=v/5/6/25/1/4096a/1/3/3\r\n",
    ] {
        assert!(fwd.contains(l), "{l:?} kept: {fwd}");
    }
    assert_no_leak(&outs);
    let ok = with_body(
        &format!(
            "SIP/2.0 200 OK
Via: SIP/2.0/UDP 10.1.0.1:40000;branch={};rport=40000
From: <sip:34020000002000000001@3402000000>;tag=p1
To: <sip:34020000001320000001@3402000000>;tag=d22
Call-ID: {}
CSeq: 20 INVITE
Contact: <sip:34020000001320000001@10.1.0.9:5060>
",
            our_branch(&outs[1]),
            call_id_of(&fwd).unwrap()
        ),
        "application/sdp",
        H265_AAC_ANSWER,
    );
    let back = t.send(Face::Upstream, "10.1.0.9:5060", &ok);
    assert_eq!(back.len(), 1);
    assert!(text(&back[0]).starts_with("SIP/2.0 200 OK\r\n"));
    assert!(text(&back[0]).contains("f=v/5/6/25/1/4096a/1/3/3\r\n"));
    assert_eq!(t.core.counters.media_refused, 0);
    type Formats = Vec<(u8, vgate::media::Codec, u32)>;
    let specs: Vec<(String, Formats)> = t
        .routes
        .routes()
        .into_iter()
        .filter(|r| r.label.ends_with(" rtp"))
        .map(|r| {
            let rule = r.media.expect("validated");
            assert!(rule.enforce);
            let f = rule
                .spec
                .formats()
                .iter()
                .map(|f| (f.pt, f.codec, f.clock_rate))
                .collect();
            (r.label.to_string(), f)
        })
        .collect();
    let formats: Vec<_> = specs.iter().map(|(_, f)| f.clone()).collect();
    assert!(
        formats.contains(&vec![(100, vgate::media::Codec::H265, 90000)]),
        "{specs:?}"
    );
    assert!(
        formats.contains(&vec![
            (102, vgate::media::Codec::Aac, 8000),
            (97, vgate::media::Codec::Aac, 16000)
        ]),
        "{specs:?}"
    );
}

/// A `<Control>` body a platform sends a device.
fn control_2022(cmd_type: &str, inner: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"GB2312\"?>\n<Control>\n<CmdType>{cmd_type}</CmdType>\n<SN>51</SN>\n<DeviceID>34020000001320000001</DeviceID>\n{inner}\n</Control>\n"
    )
}

fn query_2022(cmd_type: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"GB2312\"?>\n<Query>\n<CmdType>{cmd_type}</CmdType>\n<SN>52</SN>\n<DeviceID>34020000001320000001</DeviceID>\n</Query>\n"
    )
}

/// The 2022 commands from the user network (B): queries and controls cross, the
/// destructive ones (DeviceUpgrade, FormatSDCard) are refused unless the route allows them;
/// from domain A (a device's own platform side) nothing is refused by default.
#[test]
fn gb2022_manscdp_commands_default_policy() {
    let crossing = [
        query_2022("HomePositionQuery"),
        query_2022("CruiseTrackListQuery"),
        query_2022("CruiseTrackQuery").replace("</DeviceID>\n", "</DeviceID>\n<Number>1</Number>\n"),
        query_2022("PTZPosition"),
        query_2022("SDCardStatus"),
        control_2022("DeviceControl", "<PTZPreciseCtrl>\n<Pan>90.5</Pan>\n<Tilt>10.25</Tilt>\n<Zoom>2</Zoom>\n</PTZPreciseCtrl>"),
        control_2022("DeviceControl", "<TargetTrack>Auto</TargetTrack>"),
        control_2022("DeviceConfig", "<SnapShotConfig>\n<SnapNum>3</SnapNum>\n<Interval>1</Interval>\n<UploadURL>http://10.2.0.60:8080/snap</UploadURL>\n<SessionID>0123456789abcdef0123456789abcdef</SessionID>\n</SnapShotConfig>"),
    ];
    let destructive = [
        ("DeviceUpgrade", control_2022("DeviceControl", "<DeviceUpgrade>\n<Firmware>V5.7.3</Firmware>\n<FileURL>http://10.2.0.60/fw.bin</FileURL>\n<Manufacturer>Vendor</Manufacturer>\n<SessionID>0123456789abcdef0123456789abcdef</SessionID>\n</DeviceUpgrade>")),
        ("FormatSDCard", control_2022("DeviceControl", "<FormatSDCard>1</FormatSDCard>")),
    ];
    // Route 0 listens in B: the platform's commands arrive on the listen face.
    let mut t = bench(0);
    for (n, body) in crossing.iter().enumerate() {
        let o = t.send(
            Face::Listen,
            "10.2.0.50:5060",
            &platform_control(body, 100 + n as u32),
        );
        assert!(
            text(&o[0]).starts_with("MESSAGE "),
            "{body}: {}",
            text(&o[0])
        );
    }
    for (n, (cmd, body)) in destructive.iter().enumerate() {
        let o = t.send(
            Face::Listen,
            "10.2.0.50:5060",
            &platform_control(body, 200 + n as u32),
        );
        assert_eq!(o.len(), 1);
        assert_eq!(code(&o[0]), "403", "{cmd}");
        assert!(
            text(&o[0]).contains(&format!(
                "Warning: 399 vgate \"MANSCDP command {cmd} is not allowed from domain B (manscdp_deny_from_b)\""
            )),
            "{}",
            text(&o[0])
        );
    }
    assert_eq!(t.core.counters.manscdp_refused, 2);
    // Route 1: the platform in B reaches the registered device through the upstream face.
    let mut t = bench(1);
    let fwd = t.send(Face::Listen, "10.1.0.20:5060", &register(5060, 1, 3600));
    answer_register(&mut t, &fwd[0], "200 OK");
    let ruri = "sip:34020000001320000001@10.2.0.1:40000";
    let (_, body) = &destructive[1];
    let msg = with_body(
        &format!(
            "MESSAGE {ruri} SIP/2.0
Via: SIP/2.0/UDP 10.2.0.60:5060;rport;branch=z9hG4bKfmt
From: <sip:34020000002000000001@3402000000>;tag=f1
To: <sip:34020000001320000001@3402000000>
Call-ID: fmt@3402000000
CSeq: 9 MESSAGE
Max-Forwards: 70
"
        ),
        "Application/MANSCDP+xml",
        body,
    );
    let o = t.send(Face::Upstream, "10.2.0.60:5060", &msg);
    assert_eq!(code(&o[0]), "403", "{}", text(&o[0]));
    // The route allows them: they cross.
    let cfg = CONFIG.replace(
        "upstream_port = 5061\nmedia_timeout = 5\n",
        "upstream_port = 5061\nmedia_timeout = 5\nmanscdp_deny_from_b = []\n",
    );
    let mut t = bench_with(&cfg, 0);
    for (n, (cmd, body)) in destructive.iter().enumerate() {
        let o = t.send(
            Face::Listen,
            "10.2.0.50:5060",
            &platform_control(body, 300 + n as u32),
        );
        assert!(
            text(&o[0]).starts_with("MESSAGE "),
            "{cmd}: {}",
            text(&o[0])
        );
    }
    assert_eq!(t.core.counters.manscdp_refused, 0);
    // The device's notifications (Notify from A) are never policed.
    let mut t = bench(1);
    for (n, cmd) in ["UploadSnapShotFinished", "DeviceUpgradeResult"]
        .iter()
        .enumerate()
    {
        let body = format!("<?xml version=\"1.0\" encoding=\"GB2312\"?>\r\n<Notify>\r\n<CmdType>{cmd}</CmdType>\r\n<SN>9</SN>\r\n<DeviceID>34020000001320000001</DeviceID>\r\n<Result>OK</Result>\r\n</Notify>\r\n");
        let o = t.core.on_message(
            Face::Listen,
            Peer::udp("10.1.0.20:5060".parse().unwrap()),
            &device_message(body.as_bytes(), 40 + n as u32),
            t.now,
        );
        assert!(text(&o[0]).starts_with("MESSAGE "), "{cmd}");
    }
}

#[test]
fn annex_h_path_headers_name_the_gateway_not_the_other_domain() {
    let mut t = bench(0);
    let invite = invite_with(OFFER, "34020000002000000001", "path").replace(
        "Max-Forwards: 70\n",
        "Max-Forwards: 70\nX-RoutePath: <sip:34020000002000000009@10.2.0.70:5060>,<sip:34020000002000000001@10.2.0.50:5060>\nX-PreferredPath: <sip:34020000002000000009@3402000000>, <sip:34020000001110000001@10.1.0.30:5060>\n",
    );
    let outs = t.send(Face::Listen, "10.2.0.50:5060", &invite);
    assert_eq!(outs.len(), 2);
    assert_no_leak(&outs);
    let fwd = text(&outs[1]);
    assert_eq!(
        header_line(&fwd, "X-RoutePath"),
        ["X-RoutePath: <sip:34020000002000000009@10.1.0.1:40000>, <sip:34020000002000000001@10.1.0.1:40000>"],
        "the B hops become the gateway's hop in A, their IDs kept"
    );
    assert_eq!(
        header_line(&fwd, "X-PreferredPath"),
        ["X-PreferredPath: <sip:34020000002000000009@3402000000>, <sip:34020000001110000001@10.1.0.30:5060>"],
        "IDs at a domain and A's own addresses are not B's: unchanged"
    );
    // A path vgate cannot read is removed rather than let an address through.
    let odd = invite_with(OFFER, "34020000002000000001", "path2").replace(
        "Max-Forwards: 70\n",
        "Max-Forwards: 70\nX-RoutePath: 10.2.0.70 via 10.2.0.71\n",
    );
    let outs = t.send(Face::Listen, "10.2.0.50:5060", &odd);
    assert!(header_line(&text(&outs[1]), "X-RoutePath").is_empty());
    assert_no_leak(&outs);
    // In a response from A to B too.
    let fwd = t.send(
        Face::Listen,
        "10.2.0.50:5060",
        &platform_control(&query_2022("HomePositionQuery"), 60),
    );
    let f = text(&fwd[0]);
    let resp = format!(
        "SIP/2.0 200 OK\n{}\n{}\n{};tag=d\n{}\n{}\nX-RoutePath: <sip:34020000001320000001@10.1.0.9:5060>\nContent-Length: 0\n\n",
        header_line(&f, "Via")[0],
        header_line(&f, "From")[0],
        header_line(&f, "To")[0],
        header_line(&f, "Call-ID")[0],
        header_line(&f, "CSeq")[0],
    );
    let back = t.send(Face::Upstream, "10.1.0.9:5060", &resp);
    assert_eq!(back.len(), 1);
    assert_no_leak(&back);
    assert_eq!(
        header_line(&text(&back[0]), "X-RoutePath"),
        ["X-RoutePath: <sip:34020000001320000001@10.2.0.1:5060>"]
    );
}

/// GB/T 28181 subscriptions (Catalog, Alarm, MobilePosition) from a platform in B to a device
/// in A live as long as their Expires says, not as long as an idle dialog: a NOTIFY 90
/// minutes into a 2-hour subscription, and the refresh after it, keep each side's own
/// Call-ID (the platform's `...@10.2.0.50` never reaches A); unsubscribing (`Expires: 0`)
/// and the final `terminated` NOTIFY free the subscription's Call-IDs a transaction's
/// linger later, and its contacts once their Expires is over: nothing is left.
#[test]
fn subscriptions_live_as_long_as_their_expires_and_are_freed_after() {
    for (event, body) in [
        ("Catalog", "<Item>\n<DeviceID>34020000001320000001</DeviceID>\n<Event>ON</Event>\n</Item>\n"),
        ("Alarm", "<AlarmPriority>1</AlarmPriority>\n<AlarmMethod>2</AlarmMethod>\n<AlarmTime>2026-12-03T00:00:00</AlarmTime>\n"),
        ("MobilePosition", "<Time>2026-12-03T00:00:00</Time>\n<Longitude>117.2</Longitude>\n<Latitude>31.8</Latitude>\n"),
    ] {
        let mut t = bench(0);
        let cid = "sub7@10.2.0.50";
        let query = format!("<?xml version=\"1.0\"?>\n<Query>\n<CmdType>{event}</CmdType>\n<SN>7</SN>\n<DeviceID>34020000001320000001</DeviceID>\n</Query>\n");
        let subscribe = |branch: &str, cseq: u32, to_tag: &str, uri: &str, expires: u32| {
            with_body(
                &format!(
                    "SUBSCRIBE {uri} SIP/2.0
Via: SIP/2.0/UDP 10.2.0.50:5060;rport;branch={branch}
From: <sip:34020000002000000001@3402000000>;tag=s7
To: <sip:34020000001320000001@3402000000>{to_tag}
Call-ID: {cid}
CSeq: {cseq} SUBSCRIBE
Contact: <sip:34020000002000000001@10.2.0.50:5060>
Event: {event};id=7
Expires: {expires}
Max-Forwards: 70
"
                ),
                "Application/MANSCDP+xml",
                &query,
            )
        };
        let ok = |via: &str, cseq: u32, method: &str, extra: &str| {
            format!(
                "SIP/2.0 200 OK
Via: {via}
From: <sip:34020000002000000001@3402000000>;tag=s7
To: <sip:34020000001320000001@3402000000>;tag=n7
Call-ID: {cid}
CSeq: {cseq} {method}
{extra}Content-Length: 0

"
            )
        };
        let notify = |branch: &str, cseq: u32, sub_token: &str, state: &str| {
            with_body(
                &format!(
                    "NOTIFY sip:34020000002000000001@10.1.0.1:40000;vgt={sub_token} SIP/2.0
Via: SIP/2.0/UDP 10.1.0.9:5060;rport;branch={branch}
From: <sip:34020000001320000001@3402000000>;tag=n7
To: <sip:34020000002000000001@3402000000>;tag=s7
Call-ID: {cid}
CSeq: {cseq} NOTIFY
Contact: <sip:34020000001320000001@10.1.0.9:5060>
Event: {event};id=7
Subscription-State: {state}
Max-Forwards: 70
"
                ),
                "Application/MANSCDP+xml",
                &format!("<?xml version=\"1.0\"?>\n<Notify>\n<CmdType>{event}</CmdType>\n<SN>7</SN>\n<DeviceID>34020000001320000001</DeviceID>\n{body}</Notify>\n"),
            )
        };
        // The device's answers go back on the gateway's Via; the platform's on its own.
        let gw_via = |o: &Out| format!("SIP/2.0/UDP 10.1.0.1:40000;branch={};rport=40000", branch_of(o));
        let plat_via = |o: &Out| format!("SIP/2.0/UDP 10.2.0.1:5060;branch={};rport=5060", branch_of(o));
        let outs = t.send(
            Face::Listen,
            "10.2.0.50:5060",
            &subscribe("z9hG4bKs71", 1, "", "sip:34020000001320000001@3402000000", 7200),
        );
        assert_eq!(outs.len(), 1, "{event}");
        let device_cid = call_id_of(&text(&outs[0])).unwrap();
        assert!(!text(&outs[0]).contains("10.2.0.50"), "{event}: {}", text(&outs[0]));
        let sub_token = token(&outs[0]);
        let outs = t.send(
            Face::Upstream,
            "10.1.0.9:5060",
            &ok(&gw_via(&outs[0]), 1, "SUBSCRIBE", "Contact: <sip:34020000001320000001@10.1.0.9:5060>\nExpires: 7200\n"),
        );
        assert_eq!(outs.len(), 1, "{event}");
        let dev_token = token(&outs[0]);
        assert_eq!(call_id_of(&text(&outs[0])).as_deref(), Some(cid));

        // 90 minutes later (longer than an idle dialog lives) the device notifies.
        t.advance(Duration::from_secs(90 * 60));
        t.core.tick(t.now, 0);
        let outs = t.send(Face::Upstream, "10.1.0.9:5060", &notify("z9hG4bKn71", 1, &sub_token, "active;expires=1800"));
        assert_eq!(outs.len(), 1, "{event}: the NOTIFY crosses: {outs:?}");
        assert_eq!(outs[0].to.addr, "10.2.0.50:5060".parse().unwrap());
        assert_eq!(
            call_id_of(&text(&outs[0])).as_deref(),
            Some(cid),
            "{event}: the platform gets the NOTIFY in its subscription's Call-ID"
        );
        assert!(text(&outs[0]).contains(&format!("<CmdType>{event}</CmdType>")));
        let n = plat_via(&outs[0]);
        let outs = t.send(Face::Listen, "10.2.0.50:5060", &ok(&n, 1, "NOTIFY", "").replace("tag=s7\nTo: <sip:34020000001320000001@3402000000>;tag=n7", "tag=n7\nTo: <sip:34020000001320000001@3402000000>;tag=s7"));
        assert_eq!(outs.len(), 1, "{event}");

        // The refresh before expiry, in the dialog: the device sees its own Call-ID.
        t.advance(Duration::from_secs(10 * 60));
        t.core.tick(t.now, 0);
        let dev_uri = format!("sip:34020000001320000001@10.2.0.1:5060;vgt={dev_token}");
        let outs = t.send(Face::Listen, "10.2.0.50:5060", &subscribe("z9hG4bKs72", 2, ";tag=n7", &dev_uri, 7200));
        assert_eq!(outs.len(), 1, "{event}: the refresh crosses: {outs:?}");
        assert_eq!(call_id_of(&text(&outs[0])), Some(device_cid.clone()), "{event}");
        let outs = t.send(Face::Upstream, "10.1.0.9:5060", &ok(&gw_via(&outs[0]), 2, "SUBSCRIBE", "Expires: 7200\n"));
        assert_eq!(outs.len(), 1, "{event}");

        // Unsubscribe, its 200, the final NOTIFY and its 200.
        t.advance(Duration::from_secs(60));
        let outs = t.send(Face::Listen, "10.2.0.50:5060", &subscribe("z9hG4bKs73", 3, ";tag=n7", &dev_uri, 0));
        assert_eq!(outs.len(), 1, "{event}");
        assert_eq!(call_id_of(&text(&outs[0])), Some(device_cid.clone()));
        let outs = t.send(Face::Upstream, "10.1.0.9:5060", &ok(&gw_via(&outs[0]), 3, "SUBSCRIBE", "Expires: 0\n"));
        assert_eq!(outs.len(), 1, "{event}");
        let outs = t.send(Face::Upstream, "10.1.0.9:5060", &notify("z9hG4bKn72", 2, &sub_token, "terminated;reason=timeout"));
        assert_eq!(outs.len(), 1, "{event}");
        assert_eq!(call_id_of(&text(&outs[0])).as_deref(), Some(cid));
        let n = plat_via(&outs[0]);
        let outs = t.send(Face::Listen, "10.2.0.50:5060", &ok(&n, 2, "NOTIFY", "").replace("tag=s7\nTo: <sip:34020000001320000001@3402000000>;tag=n7", "tag=n7\nTo: <sip:34020000001320000001@3402000000>;tag=s7"));
        assert_eq!(outs.len(), 1, "{event}");

        // A transaction's linger later the subscription's Call-IDs and transactions are
        // gone; its contacts once the Expires they were given is over.
        t.advance(Duration::from_secs(40));
        t.core.tick(t.now, 0);
        assert_eq!(t.core.call_ids_mapped(), 0, "{event}: Call-IDs freed after unsubscribe");
        assert_eq!(t.core.table_sizes().1, 0, "{event}: transactions freed");
        t.advance(Duration::from_secs(2 * 3600 + 60));
        t.core.tick(t.now, 0);
        assert_eq!(t.core.table_sizes(), (0, 0, 0), "{event}: nothing left");
        if event == "MobilePosition" {
            t.check("subscribe_mobile_position_refresh_unsubscribe");
        }
    }
}

/// Hot standby: a registration exported by one core (the active's) and imported into
/// another (the standby's) routes there, by device ID and by token, with no re-REGISTER;
/// a record of another version or malformed is skipped and counted; a record gone from the
/// store goes from the standby's core too.
#[test]
fn a_registration_copied_to_another_core_routes_there() {
    let mut active = bench(1);
    let outs = active.send(Face::Listen, "10.1.0.20:5070", &register(5070, 1, 3600));
    let fwd = outs[0].clone();
    let token = text(&fwd)
        .split("vgt=")
        .nth(1)
        .and_then(|r| r.split('>').next())
        .unwrap()
        .to_owned();
    answer_register(&mut active, &fwd, "200 OK");
    let mut recs = active.core.export(active.now);
    assert_eq!(recs.len(), 1, "{recs:?}");
    let mut standby = bench(1);
    recs.insert("b/zz".into(), "{\"v\":99}".into());
    recs.insert("c/00".into(), "not json".into());
    standby.core.import(&recs, standby.now, true);
    assert_eq!(standby.routes.board.take_rejected(), 2);
    let o = standby.send(
        Face::Upstream,
        "10.2.0.60:5060",
        &platform_message("sip:34020000001320000001@10.2.0.1:40000", 1),
    );
    assert_eq!(o.len(), 1, "{}", text(&o[0]));
    assert_eq!(o[0].to.addr, "10.1.0.20:5070".parse().unwrap());
    let by_token = format!("sip:34020000001320000001@10.2.0.1:40000;vgt={token}");
    let o = standby.send(
        Face::Upstream,
        "10.2.0.60:5060",
        &platform_message(&by_token, 2),
    );
    assert_eq!(o.len(), 1, "{}", text(&o[0]));
    assert!(text(&o[0]).starts_with("MESSAGE sip:34020000001320000001@10.1.0.20:5070 "));
    // The same records again: nothing changes; none: the copy goes.
    standby.core.import(&recs, standby.now, true);
    assert_eq!(standby.core.table_sizes().2, 1);
    standby.core.import(&Default::default(), standby.now, true);
    assert_eq!(standby.core.table_sizes().2, 0);
    let o = standby.send(
        Face::Upstream,
        "10.2.0.60:5060",
        &platform_message(&by_token, 3),
    );
    assert_eq!(code(&o[0]), "404");
}
