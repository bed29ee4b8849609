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
        + &format!(
            r#"{extra}
[[signaling_route]]
name = "gbt"
type = "sip"
transport = "tcp"
listen_domain = "b"
listen_port = 5062
upstream = "127.0.{NET}.1:5070"
upstream_port = 5064
"#
        )
}

/// The upstream face each route's proxy logged when it started.
fn faces(v: &Vgate, n: usize) -> Vec<String> {
    (0..n)
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
        .collect()
}

#[test]
fn upstream_faces_keep_their_port_across_restarts_and_reloads() {
    let mut v = start(&config(""));
    let mut first = faces(&v, 2);
    first.sort();
    assert_eq!(
        first,
        vec![
            format!("gb 127.0.{NET}.1:5060"),
            format!("gbt 127.0.{NET}.1:5064")
        ],
        "default: the listen port; upstream_port when set"
    );
    // A reload that changes the UDP route restarts its proxy on the same face.
    v.wait_for("static stream routes installed", Duration::from_secs(30));
    v.rewrite_config(&config("rate_limit = 50\n"));
    v.signal(nix::sys::signal::Signal::SIGHUP);
    let again = faces(&v, 1);
    assert_eq!(again, vec![format!("gb 127.0.{NET}.1:5060")]);
    v.stop();
    // A restart: the same faces again.
    let v = start(&config("rate_limit = 50\n"));
    let mut second = faces(&v, 2);
    second.sort();
    assert_eq!(second, first);
    v.stop();
}
