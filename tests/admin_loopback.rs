//! The admin interface and its CLI against a real `vgate run` on loopback: metrics that match
//! the traffic, every metric family produced, routes added and removed at run time, sessions
//! ended, reload under load, `vgate stats`, and clear words when no vgate is running.

mod common;

use common::{run_vgate as vgate, wait_until};

use std::fmt::Write as _;
use std::net::UdpSocket;
use std::time::{Duration, Instant};

use common::udp::bound;
use common::vgate::Vgate;
use serde_json::Value;
use vgate::control::metrics::FAMILIES;

fn config(net: u8, streams: u16) -> String {
    let mut c = common::vgate::loopback_with(net, 9941, 1000, &[], &[])
        + "per_stream_metrics = true\n"
        + &common::vgate::loopback_gb_route(net)
        + "[security]\nsource_validation = \"latch\"\n";
    for i in 0..streams {
        let _ = write!(
            c,
            "[[stream_route]]\nname = \"s{i}\"\ndomain = \"a\"\nport = {}\ndestination = \"127.0.{net}.2:{}\"\negress_port = {}\n",
            20000 + 2 * i,
            40000 + i,
            30000 + 2 * i
        );
    }
    c
}

fn http(method: &str, url: &str, body: Option<&str>) -> (u16, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let resp = match (method, body) {
        ("GET", _) => agent.get(url).call(),
        ("DELETE", _) => agent.delete(url).call(),
        ("POST", b) => agent
            .post(url)
            .content_type("application/json")
            .send(b.unwrap_or("{}")),
        _ => unreachable!(),
    };
    let mut resp = resp.expect("admin interface answers");
    let status = resp.status().as_u16();
    (status, resp.body_mut().read_to_string().unwrap())
}

fn json(method: &str, url: &str, body: Option<&str>) -> (u16, Value) {
    let (s, b) = http(method, url, body);
    (
        s,
        serde_json::from_str(&b).unwrap_or_else(|_| panic!("not JSON: {b}")),
    )
}

/// The value of one sample line `name{labels} value` in a scrape.
fn sample(scrape: &str, name_and_labels: &str) -> f64 {
    scrape
        .lines()
        .find(|l| l.starts_with(name_and_labels) && l[name_and_labels.len()..].starts_with(' '))
        .unwrap_or_else(|| panic!("no sample {name_and_labels} in:\n{scrape}"))
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn metrics_routes_sessions_and_stats() {
    let net = 8;
    let vg = Vgate::start(&config(net, 3));
    let base = format!("http://127.0.{net}.1:9941");
    let src = UdpSocket::bind(format!("127.0.{net}.1:0")).unwrap();
    let rx = UdpSocket::bind(format!("127.0.{net}.2:40000")).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut buf = [0u8; 2048];
    for _ in 0..50 {
        src.send_to(&rtp_like(7, 100), (format!("127.0.{net}.1"), 20000))
            .unwrap();
        rx.recv_from(&mut buf).unwrap();
    }
    // 3 unroutable packets arrive on a B-side egress port (reverse channel, no route).
    for _ in 0..3 {
        src.send_to(b"x", (format!("127.0.{net}.2"), 30002))
            .unwrap();
    }
    // The sink can have the last datagram before the worker has counted its batch (it counts
    // after the send): the unroutable ones, read after it, say the worker is past it.
    wait_until("no_route drops in metrics", Duration::from_secs(5), || {
        let (_, s) = http("GET", &format!("{base}/metrics"), None);
        sample(
            &s,
            "vgate_channel_drops_total{channel=\"reverse\",reason=\"no_route\"}",
        ) == 3.0
    });
    let (_, scrape) = http("GET", &format!("{base}/metrics"), None);
    assert_eq!(
        sample(
            &scrape,
            "vgate_channel_packets_total{channel=\"forward\",direction=\"tx\"}"
        ),
        50.0
    );
    assert_eq!(
        sample(
            &scrape,
            "vgate_channel_bytes_total{channel=\"forward\",direction=\"tx\"}"
        ),
        5000.0
    );
    assert_eq!(sample(&scrape, "vgate_route_packets_total{route=\"s0\",channel=\"forward\",port=\"20000\",ssrc=\"0x07070707\",direction=\"rx\"}"), 50.0);
    assert_eq!(
        sample(
            &scrape,
            "vgate_worker_packets_total{worker=\"0\",channel=\"forward\",direction=\"tx\"}"
        ),
        50.0
    );
    assert_eq!(sample(&scrape, "vgate_sessions{kind=\"static\"}"), 3.0);
    assert_eq!(sample(&scrape, "vgate_ports_used{domain=\"a\"}"), 3.0);
    assert_eq!(sample(&scrape, "vgate_up"), 1.0);
    // Signaling counters: an OPTIONS and a malformed datagram to the SIP route.
    let sip = UdpSocket::bind(format!("127.0.{net}.2:0")).unwrap();
    sip.send_to(b"this is not SIP\r\n\r\n", (format!("127.0.{net}.2"), 5060))
        .unwrap();
    let options = format!(
        "OPTIONS sip:34020000002000000001@127.0.{net}.2 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.{net}.2:{};branch=z9hG4bK77\r\nFrom: <sip:34020000001320000001@3402000000>;tag=1\r\nTo: <sip:34020000002000000001@3402000000>\r\nCall-ID: m1\r\nCSeq: 1 OPTIONS\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n",
        sip.local_addr().unwrap().port()
    );
    sip.send_to(options.as_bytes(), (format!("127.0.{net}.2"), 5060))
        .unwrap();
    wait_until(
        "signaling counters in metrics",
        Duration::from_secs(5),
        || {
            let (_, s) = http("GET", &format!("{base}/metrics"), None);
            sample(
                &s,
                "vgate_signaling_requests_total{route=\"gb\",kind=\"sip\",method=\"OPTIONS\"}",
            ) == 1.0
                && sample(
                    &s,
                    "vgate_signaling_dropped_total{route=\"gb\",kind=\"sip\",reason=\"malformed\"}",
                ) == 1.0
        },
    );
    let (_, scrape) = http("GET", &format!("{base}/metrics"), None);
    for (name, kind, _) in FAMILIES {
        assert!(
            scrape.contains(&format!("# TYPE {name} {kind}\n")),
            "metric family {name} is never produced"
        );
        // This gateway has no RTSP route, and every proxy event it knows has a family.
        let empty_here = [
            "vgate_rtsp_interleaved_frames_total",
            "vgate_rtsp_interleaved_bytes_total",
            "vgate_rtsp_bridge_legs_total",
            "vgate_rtsp_bridge_frames_total",
            "vgate_rtsp_bridge_bytes_total",
            "vgate_rtsp_evicted_total",
            "vgate_signaling_other_events_total",
            // Per live TCP media leg: none on this gateway.
            "vgate_edge_leg_total",
            // Mode stack sends through the kernel's sockets: no neighbour resolver.
            "vgate_neigh_refused_total",
            "vgate_neigh_entries",
            // Mode xdp only.
            "vgate_xdp_egress_fallback_total",
            "vgate_xdp_egress_off_fast_path",
            // Per route and reason, once a validated route refused media: this gateway's
            // static routes name no codec, so nothing here is validated (the totals per
            // channel, vgate_media_invalid_total, are asserted like every other family).
            "vgate_route_media_invalid_total",
            // Per route and reason, once a route's strip action cut something: likewise.
            "vgate_route_media_stripped_total",
        ];
        assert!(
            empty_here.contains(name)
                || scrape
                    .lines()
                    .any(|l| l.starts_with(name) && !l.starts_with('#')),
            "no sample of {name}"
        );
    }

    // A route added at run time forwards; removing it frees its ports.
    let (s, added) = json(
        "POST",
        &format!("{base}/api/v1/routes"),
        Some(&format!(
            r#"{{"name":"extra","domain":"a","destination":"127.0.{net}.2:40100"}}"#
        )),
    );
    assert_eq!(s, 201, "{added}");
    let port = added["port"].as_u64().unwrap() as u16;
    let rx2 = UdpSocket::bind(format!("127.0.{net}.2:40100")).unwrap();
    rx2.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    src.send_to(&rtp_like(9, 20), (format!("127.0.{net}.1"), port))
        .unwrap();
    let (n, from) = rx2.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], &rtp_like(9, 20)[..]);
    assert_eq!(from.port() as u64, added["egress_port"].as_u64().unwrap());
    let (_, routes) = json("GET", &format!("{base}/api/v1/routes"), None);
    assert_eq!(routes["routes"].as_array().unwrap().len(), 4);
    let (s, _) = json(
        "DELETE",
        &format!("{base}/api/v1/routes/forward/{port}"),
        None,
    );
    assert_eq!(s, 200);
    let (_, scrape) = http("GET", &format!("{base}/metrics"), None);
    assert_eq!(sample(&scrape, "vgate_ports_used{domain=\"a\"}"), 3.0);

    // Malformed requests get a 4xx with a reason.
    let (s, e) = json(
        "POST",
        &format!("{base}/api/v1/routes"),
        Some("{\"name\": 5}"),
    );
    assert_eq!(s, 400, "{e}");
    assert!(e["error"].as_str().unwrap().contains("bad route"));
    let (s, _) = json("DELETE", &format!("{base}/api/v1/routes/sideways/1"), None);
    assert_eq!(s, 400);
    let (s, _) = json("GET", &format!("{base}/api/v1/nothing"), None);
    assert_eq!(s, 405);
    let big = "x".repeat(70 * 1024);
    let (s, _) = json("POST", &format!("{base}/api/v1/routes"), Some(&big));
    assert_eq!(s, 413);

    // The CLI: sessions list (table and --json) / kill, routes list, stats.
    let admin = format!("127.0.{net}.1:9941");
    let out = vgate(&["sessions", "--admin", &admin, "list"]);
    assert!(out.status.success());
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.starts_with("ID  ") && table.contains("KIND") && table.contains("PORTS"),
        "{table}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.split_whitespace().last() == Some("s1")),
        "a row for session s1:\n{table}"
    );
    let out = vgate(&["routes", "--admin", &admin, "list"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.starts_with("CHANNEL") && table.contains("DESTINATION"),
        "{table}"
    );
    let row = table
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("20000"))
        .unwrap_or_else(|| panic!("a row for port 20000:\n{table}"));
    assert!(row.starts_with("forward"), "{row}");
    let out = vgate(&["sessions", "--admin", &admin, "list", "--json"]);
    assert!(out.status.success());
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    let s1 = list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["label"] == "s1")
        .unwrap()["id"]
        .as_u64()
        .unwrap();
    let out = vgate(&["sessions", "--admin", &admin, "kill", &s1.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (_, scrape) = http("GET", &format!("{base}/metrics"), None);
    assert_eq!(
        sample(&scrape, "vgate_ports_used{domain=\"a\"}"),
        2.0,
        "the killed session's ports are back"
    );
    assert_eq!(sample(&scrape, "vgate_ports_used{domain=\"b\"}"), 2.0);

    let sender = std::thread::spawn({
        let src = src.try_clone().unwrap();
        move || {
            for _ in 0..400 {
                let _ = src.send_to(&rtp_like(1, 200), (format!("127.0.{net}.1"), 20000));
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    });
    let out = vgate(&["stats", "--admin", &admin, "--count", "1"]);
    sender.join().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let screen = String::from_utf8_lossy(&out.stdout);
    let fwd = screen
        .lines()
        .find(|l| l.starts_with("forward"))
        .expect("a forward line");
    let rate: f64 = fwd.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(
        rate > 0.0,
        "stats shows a forwarding rate while traffic flows:\n{screen}"
    );
    assert!(screen.contains("WORKER"), "{screen}");
    let totals = vg.stop();
    assert_eq!(totals.channel("reverse", "drop_no_route"), 3);
}

#[test]
fn cli_says_when_no_vgate_is_running() {
    let out = vgate(&["stats", "--admin", "127.0.10.1:9", "--count", "1"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no vgate is running at 127.0.10.1:9"), "{err}");
    let out = vgate(&["routes", "--admin", "127.0.10.1:9", "list"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("no vgate is running"));
}

#[test]
fn admin_token_is_required_when_set() {
    let net = 11;
    let cfg = config(net, 1).replace(
        "per_stream_metrics = true",
        "token = \"0123456789abcdef0123\"",
    );
    let vg = Vgate::start(&cfg);
    let base = format!("http://127.0.{net}.1:9941");
    let (s, _) = http("GET", &format!("{base}/metrics"), None);
    assert_eq!(s, 401);
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let r = agent
        .get(format!("{base}/api/v1/health"))
        .header("Authorization", "Bearer 0123456789abcdef0123")
        .call()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    drop(vg);
}

#[test]
fn reload_under_load_keeps_untouched_streams_whole() {
    let net = 9;
    const STREAMS: u16 = 100;
    const ROUNDS: u16 = 300;
    let mut vg = Vgate::start(&config(net, STREAMS));
    let senders: Vec<UdpSocket> = (0..STREAMS)
        .map(|_| UdpSocket::bind(format!("127.0.{net}.1:0")).unwrap())
        .collect();
    let receivers: Vec<UdpSocket> = (0..STREAMS)
        .map(|i| UdpSocket::bind(format!("127.0.{net}.2:{}", 40000 + i)).unwrap())
        .collect();
    for r in &receivers {
        nix::sys::socket::setsockopt(r, nix::sys::socket::sockopt::RcvBuf, &(1usize << 20))
            .unwrap();
        r.set_nonblocking(true).unwrap();
    }
    // The new config drops s0 and adds "late"; s1..s99 are untouched.
    let mut new_cfg = config(net, STREAMS).replacen(
        "[[stream_route]]\nname = \"s0\"",
        "[[stream_route]]\nname = \"gone\"\nsource_validation = \"any\"",
        1,
    );
    let _ = write!(new_cfg, "[[stream_route]]\nname = \"late\"\ndomain = \"a\"\nport = 20900\ndestination = \"127.0.{net}.2:40900\"\n");
    let mut received = vec![0u32; STREAMS as usize];
    let mut buf = [0u8; 2048];
    for round in 0..ROUNDS {
        if round == ROUNDS / 2 {
            vg.rewrite_config(&new_cfg);
            vg.signal(nix::sys::signal::Signal::SIGHUP);
        }
        for (i, s) in senders.iter().enumerate() {
            s.send_to(
                &rtp_like(round as u8, 300),
                (format!("127.0.{net}.1"), 20000 + 2 * i as u16),
            )
            .unwrap();
        }
        for (i, r) in receivers.iter().enumerate() {
            while r.recv_from(&mut buf).is_ok() {
                received[i] += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(3));
    }
    let line = vg.wait_for("config reloaded", Duration::from_secs(10));
    assert!(line.contains("1 removed"), "{line}");
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        for (i, r) in receivers.iter().enumerate() {
            while r.recv_from(&mut buf).is_ok() {
                received[i] += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for (i, n) in received.iter().enumerate().skip(1) {
        assert_eq!(
            *n,
            u32::from(ROUNDS),
            "untouched stream s{i} lost packets across the reload"
        );
    }

    // An invalid file is rejected whole; the running routes stay.
    vg.rewrite_config("[domains.a]\nthis is not toml");
    vg.signal(nix::sys::signal::Signal::SIGHUP);
    let line = vg.wait_for("reload rejected", Duration::from_secs(10));
    assert!(line.contains("expected"), "the reason is logged: {line}");
    let (_, routes) = json(
        "GET",
        &format!("http://127.0.{net}.1:9941/api/v1/routes"),
        None,
    );
    assert_eq!(
        routes["routes"].as_array().unwrap().len(),
        STREAMS as usize + 1
    );
    // The same through `vgate reload`, which returns the reason.
    let out = vgate(&["reload", "--admin", &format!("127.0.{net}.1:9941")]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("422"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let totals = vg.stop();
    assert_eq!(totals.route("s5", "tx_packets"), u64::from(ROUNDS));
    assert!(
        totals.routes.contains_key("late")
            && totals.routes.contains_key("gone")
            && !totals.routes.contains_key("s0")
    );
}

/// A datagram of `len` bytes filled with `fill` that parses as RTP version 2 (latch routes
/// latch only on RTP).
fn rtp_like(fill: u8, len: usize) -> Vec<u8> {
    let mut p = vec![fill; len];
    p[0] = 0x80;
    p
}

/// A reload is all or nothing: when a new signaling route cannot start (its port is taken),
/// the reload is refused with the reason (API 422, `vgate reload` exit code), and the old
/// configuration stays whole — the static route it would have replaced still forwards, the
/// old proxy still answers, the routes listing is unchanged. A `[security]` change restarts
/// the proxies so they use it (the summary says so).
#[test]
fn reload_is_all_or_nothing_and_reports_why() {
    let net = 12;
    let mut vg = Vgate::start(&config(net, 2));
    let base = format!("http://127.0.{net}.1:9941");
    let admin = format!("127.0.{net}.1:9941");
    let (_, before) = json("GET", &format!("{base}/api/v1/routes"), None);
    // Another program holds the port the new route wants.
    let squatter = UdpSocket::bind(format!("127.0.{net}.2:5090")).unwrap();
    let broken = format!(
        "{}[[signaling_route]]\nname = \"late\"\ntype = \"sip\"\ntransport = \"udp\"\nlisten_domain = \"b\"\nlisten_port = 5090\nupstream = \"127.0.{net}.1:5091\"\n",
        // s1 moves to a new destination: must not happen when the reload fails.
        config(net, 2).replace(&format!("127.0.{net}.2:40001"), &format!("127.0.{net}.2:40101"))
    );
    vg.rewrite_config(&broken);
    let (status, body) = http("POST", &format!("{base}/api/v1/reload"), None);
    assert_eq!(
        status, 422,
        "a reload whose proxy cannot start was accepted: {body}"
    );
    assert!(body.contains("late") && body.contains("5090"), "{body}");
    let out = vgate(&["reload", "--admin", &admin]);
    assert!(
        !out.status.success(),
        "vgate reload exited 0 on a refused reload: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("late"));
    // Nothing of the new file was applied.
    let (_, after) = json("GET", &format!("{base}/api/v1/routes"), None);
    assert_eq!(
        before["routes"], after["routes"],
        "routes changed by a refused reload"
    );
    let src = UdpSocket::bind(format!("127.0.{net}.1:0")).unwrap();
    let rx = UdpSocket::bind(format!("127.0.{net}.2:40001")).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    src.send_to(&rtp_like(3, 50), (format!("127.0.{net}.1"), 20002))
        .unwrap();
    let mut buf = [0u8; 2048];
    assert!(rx.recv_from(&mut buf).is_ok(), "s1 stopped forwarding");
    let (_, health) = json("GET", &format!("{base}/api/v1/health"), None);
    assert_eq!(health["healthy"], true, "{health}");
    // The old proxy (gb on 5060) still answers.
    let sip = bound(&format!("127.0.{net}.2:0"), Duration::from_secs(2));
    let probe = bound(&format!("127.0.{net}.1:5070"), Duration::from_secs(2));
    let options = format!(
        "OPTIONS sip:34020000002000000001@127.0.{net}.2:5060 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.{net}.2:{p};branch=z9hG4bK-r1\r\nFrom: <sip:34020000002000000002@127.0.{net}.2>;tag=a\r\nTo: <sip:34020000002000000001@127.0.{net}.2>\r\nCall-ID: reload-1\r\nCSeq: 1 OPTIONS\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n",
        p = sip.local_addr().unwrap().port()
    );
    sip.send_to(options.as_bytes(), format!("127.0.{net}.2:5060"))
        .unwrap();
    assert!(
        probe.recv_from(&mut buf).is_ok(),
        "the old SIP proxy no longer forwards after a refused reload"
    );
    drop(squatter);

    // A [security] change reaches the proxies: they are restarted with it.
    vg.rewrite_config(&config(net, 2).replace(
        "source_validation = \"latch\"",
        "source_validation = \"latch\"\nrelatch_after_ms = 500",
    ));
    let (status, body) = json("POST", &format!("{base}/api/v1/reload"), None);
    assert_eq!(status, 200, "{body}");
    let summary = body["summary"].as_str().unwrap();
    assert!(summary.contains("1 restarted"), "{summary}");
    vg.stop();
}
