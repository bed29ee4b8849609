//! Media sources in the field, on the three-namespace bed with the real `vgate run`:
//!
//! - **Latching** (`source_validation = "latch"`): 100 static routes. A junk datagram (an nmap
//!   style probe, not RTP) reaches every route before its sender: it must not capture the
//!   route. The senders then restart with new source ports: after the latched source has been
//!   silent for the re-latch time (`security.relatch_after_ms`, default 2 s) the new source
//!   takes over and the streams resume; every re-latch is counted. While a latched source is
//!   alive, another source is refused.
//! - **Media timeouts see only forwarded packets**: a SIP call and an RTSP session whose media
//!   is all rejected (oversize datagrams on their ports) time out on `media_timeout` and free
//!   their ports while the rejected packets keep coming.
//! - **Reload of a changed SIP route**: its live call gets a BYE and is counted, not dropped
//!   silently.
//!
//! Needs root and iproute2.

mod common;
#[path = "hostile/peers.rs"]
mod peers;

use std::collections::HashMap;
use std::net::{SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{in_netns, Bed};
use peers::*;

const STREAMS: u16 = 100;
const PER_PHASE: u32 = 10;
const JUNK_PORTS: u16 = 43000;
const NEW_PORTS: u16 = 44000;
const INTRUDER_PORTS: u16 = 45000;

/// Root (namespaces) and iproute2.
const NEEDS: &[(&str, &str)] = &[("ip", "iproute2")];

/// Static latch routes without an expected source: gateway port `A_PORTS + 2i` →
/// `B_IP:SINK_PORTS + i`.
fn latch_routes(bed: &Bed, n: u16) -> String {
    common::relay::stream_routes(bed, n, "l", |_| "source_validation = \"latch\"\n".into())
}

/// An RTP packet of stream `i` in `phase`, sequence `seq` (the SSRC says both).
fn rtp(i: u16, phase: u8, seq: u16) -> [u8; 32] {
    let mut p = [0u8; 32];
    p[0] = 0x80;
    p[1] = 96;
    p[2..4].copy_from_slice(&seq.to_be_bytes());
    p[8..12].copy_from_slice(&((u32::from(phase) << 16) | u32::from(i)).to_be_bytes());
    p
}

/// Receivers in B for every stream: counts per (stream, phase) until stopped.
struct Sinks {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<HashMap<(u16, u8), u32>>>,
}

impl Sinks {
    fn start(bed: &Bed) -> Sinks {
        let (b_ns, b_ip) = (bed.get("B_NS").to_owned(), bed.ip("B_IP"));
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                common::enter_netns(&b_ns).unwrap();
                let socks: Vec<UdpSocket> = (0..STREAMS)
                    .map(|i| {
                        let s = UdpSocket::bind(SocketAddrV4::new(b_ip, SINK_PORTS + i)).unwrap();
                        s.set_nonblocking(true).unwrap();
                        s
                    })
                    .collect();
                let _ = tx.send(());
                let mut got: HashMap<(u16, u8), u32> = HashMap::new();
                let mut buf = [0u8; 2048];
                while !stop.load(Relaxed) {
                    let mut any = false;
                    for (i, s) in socks.iter().enumerate() {
                        while let Ok(n) = s.recv(&mut buf) {
                            any = true;
                            let key = if n >= 12 && buf[0] == 0x80 {
                                (u16::from_be_bytes([buf[10], buf[11]]), buf[9])
                            } else {
                                (i as u16, 255)
                            };
                            *got.entry(key).or_default() += 1;
                        }
                    }
                    if !any {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                }
                got
            })
        };
        rx.recv_timeout(Duration::from_secs(5))
            .expect("sinks bound");
        Sinks {
            stop,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> HashMap<(u16, u8), u32> {
        self.stop.store(true, Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Sinks {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
    }
}

/// Sends `count` packets of `phase` on every stream from `A_IP:base + i`, 20 ms apart per
/// round; `with` runs between rounds (an intruder).
fn send_phase(bed: &Bed, base: u16, phase: u8, count: u32, intruder: Option<u16>) {
    let (a_ns, a_ip, ga) = (bed.get("A_NS").to_owned(), bed.ip("A_IP"), bed.ip("GA_IP"));
    in_netns(&a_ns, move || {
        let socks: Vec<UdpSocket> = (0..STREAMS)
            .map(|i| UdpSocket::bind(SocketAddrV4::new(a_ip, base + i)).unwrap())
            .collect();
        let bad: Vec<UdpSocket> = intruder
            .map(|b| {
                (0..STREAMS)
                    .map(|i| UdpSocket::bind(SocketAddrV4::new(a_ip, b + i)).unwrap())
                    .collect()
            })
            .unwrap_or_default();
        for seq in 0..count {
            for (i, s) in socks.iter().enumerate() {
                let to = SocketAddrV4::new(ga, A_PORTS + 2 * i as u16);
                s.send_to(&rtp(i as u16, phase, seq as u16), to).unwrap();
                if let Some(b) = bad.get(i) {
                    b.send_to(&rtp(i as u16, 200, seq as u16), to).unwrap();
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
}

/// Waits until every stream has `want` packets of `phase` (or the deadline).
fn wait_phase(gw_ns: &str, phase_tx: u64, within: Duration) -> u64 {
    let deadline = Instant::now() + within;
    loop {
        let m = admin_get(gw_ns, "/metrics");
        let tx = metric(
            &m,
            "vgate_channel_packets_total",
            &["channel=\"forward\"", "direction=\"tx\""],
        );
        if tx >= phase_tx || Instant::now() > deadline {
            return tx;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn latch_follows_restarted_senders_and_ignores_junk() {
    require!(true, NEEDS);
    let (bed, g_ns) = Bed::up_with_g_ns(1);
    let cfg = config(&bed, "stack", 400, "latch", &latch_routes(&bed, STREAMS));
    let gw = Vgate::start_in(&g_ns, &cfg, &[]);
    let sinks = Sinks::start(&bed);
    let per_phase = u64::from(STREAMS) * u64::from(PER_PHASE);

    // A probe first: one junk datagram per route from its own port, then the real senders.
    let (a_ns, a_ip, ga) = (bed.get("A_NS").to_owned(), bed.ip("A_IP"), bed.ip("GA_IP"));
    in_netns(&a_ns, move || {
        for i in 0..STREAMS {
            let s = UdpSocket::bind(SocketAddrV4::new(a_ip, JUNK_PORTS + i)).unwrap();
            s.send_to(
                b"nmap probe, not RTP",
                SocketAddrV4::new(ga, A_PORTS + 2 * i),
            )
            .unwrap();
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    send_phase(&bed, SRC_PORTS, 1, PER_PHASE, None);
    let after1 = wait_phase(&g_ns, per_phase, Duration::from_secs(10));

    // The senders restart with new source ports after more than the re-latch time (2 s).
    std::thread::sleep(Duration::from_secs(4));
    send_phase(&bed, NEW_PORTS, 2, PER_PHASE, None);
    let after2 = wait_phase(&g_ns, 2 * per_phase, Duration::from_secs(10));

    // While the new sources are alive, intruders on other ports are refused.
    send_phase(&bed, NEW_PORTS, 3, PER_PHASE, Some(INTRUDER_PORTS));
    let after3 = wait_phase(&g_ns, 3 * per_phase, Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(500));
    let metrics = admin_get(&g_ns, "/metrics");
    let totals = gw.stop().raw;
    let got = sinks.finish();
    let fwd = channel_totals(&totals, "forward");
    let phase = |p: u8| -> Vec<u16> {
        (0..STREAMS)
            .filter(|&i| got.get(&(i, p)).copied().unwrap_or(0) != PER_PHASE)
            .collect()
    };
    let _ = std::io::Write::write_fmt(
        &mut std::io::stderr(),
        format_args!("FIGURE latch: forwarded after phases {after1} {after2} {after3}; {totals}\n"),
    );
    assert!(
        phase(1).is_empty(),
        "a junk datagram captured these routes (the real sender's packets were dropped): {:?}\n{totals}",
        phase(1)
    );
    assert!(
        phase(2).is_empty(),
        "streams that did not resume after their senders restarted on new ports: {:?}\n{totals}",
        phase(2)
    );
    assert!(
        phase(3).is_empty(),
        "streams disturbed by an intruder: {:?}",
        phase(3)
    );
    let leaked: u32 = (0..STREAMS)
        .map(|i| {
            got.get(&(i, 200)).copied().unwrap_or(0) + got.get(&(i, 255)).copied().unwrap_or(0)
        })
        .sum();
    assert_eq!(leaked, 0, "junk or intruder packets crossed: {got:?}");
    assert_eq!(num(&fwd, "tx_packets"), 3 * per_phase, "{totals}");
    assert_eq!(num(&fwd, "drop_not_rtp"), u64::from(STREAMS), "{totals}");
    assert_eq!(num(&fwd, "drop_source_mismatch"), per_phase, "{totals}");
    assert_eq!(num(&fwd, "relatches"), u64::from(STREAMS), "{totals}");
    assert_eq!(
        metric(&metrics, "vgate_relatches_total", &["channel=\"forward\""]),
        u64::from(STREAMS),
        "{metrics}"
    );
}

/// The forward (A→B) routes of the live sessions: their gateway ports in A.
fn forward_ports(g_ns: &str) -> Vec<u16> {
    let v: serde_json::Value = serde_json::from_str(&admin_get(g_ns, "/api/v1/routes")).unwrap();
    v["routes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["channel"] == "forward")
        .map(|r| r["port"].as_u64().unwrap() as u16)
        .collect()
}

fn live_sessions(g_ns: &str) -> usize {
    let v: serde_json::Value = serde_json::from_str(&admin_get(g_ns, "/api/v1/sessions")).unwrap();
    v["sessions"].as_array().map_or(0, Vec::len)
}

/// Sends oversize datagrams (dropped as `oversize`) from A to every port in `ports`, 20 a
/// second each, until `stop`.
fn reject_flood(bed: &Bed, ports: Vec<u16>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    let (a_ns, a_ip, ga) = (bed.get("A_NS").to_owned(), bed.ip("A_IP"), bed.ip("GA_IP"));
    std::thread::spawn(move || {
        common::enter_netns(&a_ns).unwrap();
        let s = UdpSocket::bind(SocketAddrV4::new(a_ip, 0)).unwrap();
        let mut p = vec![0u8; 1450];
        p[0] = 0x80;
        let mut sent = 0;
        let limit = Instant::now() + Duration::from_secs(30);
        while !stop.load(Relaxed) && Instant::now() < limit {
            for &port in &ports {
                if s.send_to(&p, SocketAddrV4::new(ga, port)).is_ok() {
                    sent += 1;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        sent
    })
}

/// Waits (up to `within`) for the gateway to have no session while `flood` keeps coming.
fn ends_under_rejected_media(g_ns: &str, within: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < within {
        if live_sessions(g_ns) == 0 {
            return Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    None
}

#[test]
fn sessions_whose_media_is_all_rejected_time_out() {
    require!(true, NEEDS);
    let bed = Bed::up(1);
    let (_, b_ns, g_ns) = bed.namespaces();
    let (gw, _upstreams) = sip_and_rtsp_gateway(&bed, "sip", 2, 200);
    let (gb, b_ip) = (bed.ip("GB_IP"), bed.ip("B_IP"));

    // SIP: a call whose media is all oversize.
    let code = in_netns(&b_ns, move || {
        let uac = SipUac::new(SocketAddrV4::new(b_ip, 0), SocketAddrV4::new(gb, 5060));
        uac.invite(1, SocketAddrV4::new(b_ip, 6000)).0
    });
    assert_eq!(code, 200);
    let ports = forward_ports(&g_ns);
    assert!(!ports.is_empty(), "the call installed no forward route");
    let stop = Arc::new(AtomicBool::new(false));
    let flood = reject_flood(&bed, ports.clone(), Arc::clone(&stop));
    let sip_end = ends_under_rejected_media(&g_ns, Duration::from_secs(10));
    stop.store(true, Relaxed);
    let sip_sent = flood.join().unwrap();

    // RTSP: a session (client holding its connection) whose media is all oversize.
    let (hold_tx, hold_rx) = std::sync::mpsc::channel::<()>();
    let (setup_tx, setup_rx) = std::sync::mpsc::channel();
    let client = {
        let b_ns = b_ns.clone();
        std::thread::spawn(move || {
            in_netns(&b_ns, move || {
                let mut c = RtspClient::connect(SocketAddrV4::new(gb, 8554)).unwrap();
                let url = format!("rtsp://{gb}:8554/cam");
                let s = c.setup(&url, 42000);
                let p = status(&c.request("PLAY", &url, "Range: npt=0-\r\n"));
                let _ = setup_tx.send((s, p));
                let _ = hold_rx.recv_timeout(Duration::from_secs(30));
            })
        })
    };
    let (setup, play) = setup_rx.recv_timeout(Duration::from_secs(15)).unwrap();
    assert_eq!((setup, play), (200, 200));
    let ports = forward_ports(&g_ns);
    assert!(
        !ports.is_empty(),
        "the RTSP session installed no forward route"
    );
    let stop = Arc::new(AtomicBool::new(false));
    let flood = reject_flood(&bed, ports, Arc::clone(&stop));
    let rtsp_end = ends_under_rejected_media(&g_ns, Duration::from_secs(10));
    stop.store(true, Relaxed);
    let rtsp_sent = flood.join().unwrap();
    let _ = hold_tx.send(());
    client.join().unwrap();
    let totals = gw.stop().raw;
    let fwd = channel_totals(&totals, "forward");
    let _ = std::io::Write::write_fmt(
        &mut std::io::stderr(),
        format_args!("FIGURE rejected media: SIP call ended after {sip_end:?} of {sip_sent} rejected datagrams, RTSP session after {rtsp_end:?} of {rtsp_sent}\n"),
    );
    assert!(
        sip_end.is_some(),
        "a SIP call whose media was all rejected did not time out:\n{totals}"
    );
    assert!(
        rtsp_end.is_some(),
        "an RTSP session whose media was all rejected did not time out:\n{totals}"
    );
    assert!(num(&fwd, "drop_oversize") > 0, "{totals}");
    assert_eq!(num(&fwd, "tx_packets"), 0, "{totals}");
    assert_eq!(live_counts(&totals), [0, 0, 0, 0], "{totals}");
}

/// A reload that changes a SIP route does not drop its live call silently: vgate sends BYE
/// to the caller (and the callee) and counts the call in the reload summary.
#[test]
fn a_changed_sip_route_ends_its_calls_with_bye_on_reload() {
    require!(true, NEEDS);
    let bed = Bed::up(1);
    let (a_ns, b_ns, g_ns) = bed.namespaces();
    let cfg = |extra: &str| {
        config(
            &bed,
            "stack",
            200,
            "strict",
            &sip_route(
                &bed,
                "sip",
                "udp",
                5060,
                5060,
                &format!("media_timeout = 0\nrate_limit = 0\n{extra}"),
            ),
        )
    };
    let gw = Vgate::start_in(&g_ns, &cfg(""), &[]);
    let _uas = SipUas::start(&a_ns, SocketAddrV4::new(bed.ip("A_IP"), 5060), true);
    let (gb, b_ip) = (bed.ip("GB_IP"), bed.ip("B_IP"));
    let uac = in_netns(&b_ns, move || {
        let uac = SipUac::new(SocketAddrV4::new(b_ip, 0), SocketAddrV4::new(gb, 5060));
        let (code, call) = uac.invite(1, SocketAddrV4::new(b_ip, 6000));
        assert_eq!(code, 200);
        assert!(call.is_some());
        uac
    });
    assert_eq!(live_sessions(&g_ns), 1);
    std::fs::write(gw.config.path(), cfg("invite_timeout = 7")).unwrap();
    gw.signal(nix::sys::signal::Signal::SIGHUP);
    gw.wait_log("config reloaded", 1, Duration::from_secs(10));
    // The caller gets a BYE for its call.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut buf = vec![0u8; 65536];
    let mut bye = String::new();
    while Instant::now() < deadline && bye.is_empty() {
        if let Ok((n, _)) = uac.sock.recv_from(&mut buf) {
            let m = String::from_utf8_lossy(&buf[..n]).into_owned();
            if m.starts_with("BYE ") {
                bye = m;
            }
        }
    }
    let log = gw.log();
    let sessions = live_sessions(&g_ns);
    let totals = gw.stop().raw;
    assert!(
        !bye.is_empty(),
        "the caller got no BYE when its route was replaced by a reload:\n{log}"
    );
    assert!(bye.contains("c1-"), "BYE of another call: {bye}");
    assert!(
        log.contains("1 live calls/sessions ended"),
        "the reload summary does not count the ended call:\n{log}"
    );
    assert_eq!(sessions, 0, "{totals}");
}
