//! The SIP proxy's upstream face keeps its port across restarts and reloads (a real
//! `vgate run` on loopback): registrations made through it point at that address, so it
//! must not move. Default: the listen port; `upstream_port` sets another.

mod common;

use std::time::Duration;

use common::vgate::Vgate;

/// `vgate run`, read from its first line (the proxies log before start-up completes).
fn start(config: &str) -> Vgate {
    Vgate::launch(config).no_wait().start()
}

const NET: u8 = 48;

fn config(extra: &str) -> String {
    common::vgate::loopback_with(NET, 9948, 1000, &[], &[])
        + &common::vgate::loopback_gb_route(NET)
        + &format!("{extra}\n")
        + &common::signaling_route(
            "gbt",
            "sip",
            "tcp",
            ("b", 5062),
            &format!("127.0.{NET}.1:5070"),
        )
        + "upstream_port = 5064\n"
}

/// The upstream face each of `n` routes' proxies logged when it started, sorted.
fn faces(v: &Vgate, n: usize) -> Vec<String> {
    let mut faces: Vec<String> = (0..n)
        .map(|_| {
            let l = v.wait_for("SIP proxy serving", Duration::from_secs(30));
            let route = l
                .split("route=")
                .nth(1)
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap();
            let face = l
                .split("upstream_face=")
                .nth(1)
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap();
            format!("{route} {face}")
        })
        .collect();
    faces.sort();
    faces
}

/// `route 127.0.net.host:port` of each of `faces` (route, host, port), as [`faces`] gives
/// them.
fn on(net: u8, faces: &[(&str, u8, u16)]) -> Vec<String> {
    faces
        .iter()
        .map(|(route, host, port)| format!("{route} 127.0.{net}.{host}:{port}"))
        .collect()
}

/// [`start`] with `config`: its routes' proxies serve on the upstream faces `want` (`what`
/// says why those), and start-up completes.
fn start_on(config: &str, want: &[String], what: &str) -> Vgate {
    let v = start(config);
    assert_eq!(faces(&v, want.len()), want, "{what}");
    v.wait_for("static stream routes installed", Duration::from_secs(30));
    v
}

#[test]
fn upstream_faces_keep_their_port_across_restarts_and_reloads() {
    let first = on(NET, &[("gb", 1, 5060), ("gbt", 1, 5064)]);
    let what = "default: the listen port; upstream_port when set";
    let mut v = start_on(&config(""), &first, what);
    // A reload that changes the UDP route restarts its proxy on the same face.
    v.rewrite_config(&config("rate_limit = 50\n"));
    v.signal(nix::sys::signal::Signal::SIGHUP);
    let again = faces(&v, 1);
    assert_eq!(again, on(NET, &[("gb", 1, 5060)]));
    v.stop();
    // A restart: the same faces again.
    start_on(&config("rate_limit = 50\n"), &first, "after a restart").stop();
}

const SHARED_NET: u8 = 49;

/// Yesterday's pair on loopback: "gb" listens on 5060 in B, "gbu" on 5060 in A, neither
/// sets `upstream_port`, so each side has one SIP socket that both routes use.
fn shared_config(extra: &str) -> String {
    common::vgate::loopback_with(
        SHARED_NET,
        9949,
        1000,
        &[&format!("127.0.{SHARED_NET}.8/30")],
        &[&format!("127.0.{SHARED_NET}.12/30")],
    ) + &common::vgate::loopback_gb_route(SHARED_NET)
        + &format!("{extra}\n")
        + &common::signaling_route(
            "gbu",
            "sip",
            "udp",
            ("a", 5060),
            &format!("127.0.{SHARED_NET}.2:5070"),
        )
}

/// One SIP port per side: the pair starts (each route's upstream face is the other's listen
/// socket, 5060 on both sides), answers on it, and a reload that changes one route of the
/// group restarts the group on the same faces.
#[test]
fn routes_sharing_5060_on_both_sides_start_answer_and_reload_together() {
    let n = SHARED_NET;
    let first = on(n, &[("gb", 1, 5060), ("gbu", 2, 5060)]);
    let what = "both upstream faces on the other route's listen port";
    let mut v = start_on(&shared_config(""), &first, what);
    // Each side's 5060 answers its own side's peers (127.0.N.11 in A, .12 in B): a bad
    // request (Max-Forwards 0) gets 483 from the route listening there.
    for side in [1u8, 2] {
        let s = std::net::UdpSocket::bind(format!("127.0.{n}.{}:0", side + 10)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let probe = format!(
            "OPTIONS sip:gw@127.0.{n}.{side}:5060 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.{n}.{}:{};branch=z9hG4bKbad\r\nFrom: <sip:x@127.0.{n}.{side}>;tag=1\r\nTo: <sip:gw@127.0.{n}.{side}>\r\nCall-ID: faces{side}\r\nCSeq: 1 OPTIONS\r\nMax-Forwards: 0\r\nContent-Length: 0\r\n\r\n",
            side + 10,
            s.local_addr().unwrap().port()
        );
        s.send_to(probe.as_bytes(), format!("127.0.{n}.{side}:5060"))
            .unwrap();
        let mut buf = [0u8; 2048];
        let got = s
            .recv(&mut buf)
            .map(|k| String::from_utf8_lossy(&buf[..k]).into_owned());
        assert!(
            got.as_deref().is_ok_and(|t| t.starts_with("SIP/2.0 483")),
            "127.0.{n}.{side}:5060 answers (483: Max-Forwards 0): {got:?}"
        );
    }
    v.rewrite_config(&shared_config("rate_limit = 50\n"));
    v.signal(nix::sys::signal::Signal::SIGHUP);
    let again = faces(&v, 2);
    assert_eq!(again, first, "the group restarts whole, on the same faces");
    v.stop();
}
