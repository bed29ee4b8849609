//! GB/T 28181 RTP over TCP (RFC 4571) through vgate on the three-namespace bed, with real
//! sipp peers for the signaling and the small RFC 4571 / UDP media peers of
//! `tests/common/rfc4571.rs` (sipp cannot do RTP over TCP).
//!
//! A platform in B (sipp UAC) places live-view calls to a device in A (sipp UAS), both
//! `a=sendrecv`, so every call carries live view A→B and talkback B→A at once. Five
//! combinations, 10 calls each (50 in all), every one conforming to RFC 4145:
//!
//! | B offers | A answers | vgate's legs |
//! |---|---|---|
//! | TCP passive | UDP | B: active (connects to the platform) |
//! | UDP | TCP active | A: passive (the device connects) |
//! | TCP passive | TCP active | B: active, A: passive |
//! | TCP active | TCP passive | B: passive, A: active |
//! | TCP actpass | UDP | B: passive (vgate answers `passive`) |
//!
//! UDP ↔ UDP is `tests/sip_netns.rs`. Checked: every call completes; on every side every
//! call is one flow that received media with no gap (loss 0, measured between the first and
//! last packet received), from the gateway's own address (no address of one domain in the
//! other, also checked by the sipp scenarios on the SIP messages); no framing error; no leg,
//! session, route or port left at the end.
//!
//! A second test: bad input on a TCP leg (a length of 0, one of 65535, garbage before the
//! first frame, a frame cut at the close) is counted, the leg's close ends the call with a
//! BYE to both sides, and a peer that never reads costs counted stalls, not memory.

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::gb_sipp::{check_flows, uac_xml, uas_xml, Side};
use common::proc::rss_kb;
use common::rfc4571::{self, Flow, Flows};
use common::sipp::{self, Sipp, GB_CID};
use common::vgate::Vgate;
use common::{admin, in_netns, prerequisites, Bed, BedConfig};

const ADMIN: &str = "127.0.0.1:9946";

fn config(bed: &Bed) -> String {
    let head = bed.config(BedConfig {
        control: ADMIN,
        ..Default::default()
    });
    head + &sipp::gb_b2a_route(bed, "media_timeout = 30\n")
}

/// Runs `calls` calls: the device scenario `uas` in A (from its file's directory), then the
/// platform scenario `uac` in B with `extra` sipp arguments. Whether each scenario passed
/// (every call, every check in it).
fn run_calls(bed: &Bed, uas: &Path, uac: &Path, calls: usize, extra: &[&str]) -> (bool, bool) {
    let (a_ns, b_ns, _) = bed.namespaces();
    let (a_ip, b_ip) = (bed.get("A_IP"), bed.get("B_IP"));
    let target = format!("{}:5060", bed.get("GB_IP"));
    let dir = |p: &str| Path::new(p).parent().unwrap().to_owned();
    let calls: u32 = calls.try_into().unwrap();
    let (uas, uac) = (uas.to_str().unwrap(), uac.to_str().unwrap());
    let mut device = Sipp::new(&a_ns, &dir(uas), uas, a_ip, 5060)
        .args(&["-m", &calls.to_string(), "-trace_err"])
        .spawn();
    std::thread::sleep(Duration::from_millis(300));
    let platform = Sipp::new(&b_ns, &dir(uac), uac, b_ip, 5060)
        .args(&[
            "-cid_str",
            GB_CID,
            &target,
            "-m",
            &calls.to_string(),
            "-trace_err",
        ])
        .timeout(90)
        .args(extra)
        .status()
        .success();
    (
        platform,
        device.wait_exit(Duration::from_secs(15)) == Some(true),
    )
}

/// The legs vgate lists: (id, domain, role, state, local).
fn legs(g_ns: &str) -> Vec<(u64, String, String, String, String)> {
    let body = admin::get_in(g_ns, ADMIN, "/api/v1/legs");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    v["legs"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|l| {
                    let s = |k: &str| l[k].as_str().unwrap_or_default().to_owned();
                    (
                        l["id"].as_u64().unwrap_or(0),
                        s("domain"),
                        s("role"),
                        s("state"),
                        s("local"),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn leg_totals(g_ns: &str) -> serde_json::Value {
    let body = admin::get_in(g_ns, ADMIN, "/api/v1/legs");
    serde_json::from_str::<serde_json::Value>(&body).unwrap_or_default()["totals"].clone()
}

/// Connects, from `ip` in `ns`, to every passive leg of `domain` that is listening, once
/// each, until `stop`; every connection is a flow.
fn connector(
    ns: &str,
    g_ns: &str,
    domain: &'static str,
    ip: &str,
    stop: Arc<AtomicBool>,
) -> (Flows, std::thread::JoinHandle<()>) {
    let flows: Flows = Arc::default();
    let (f2, ns, g_ns, ip) = (
        Arc::clone(&flows),
        ns.to_owned(),
        g_ns.to_owned(),
        ip.to_owned(),
    );
    let h = std::thread::spawn(move || {
        let g = g_ns.clone();
        in_netns(&ns, move || {
            let mut seen = std::collections::HashSet::new();
            let mut threads = Vec::new();
            while !stop.load(Relaxed) {
                for (id, d, role, state, local) in legs(&g) {
                    if d == domain && role == "passive" && state == "listening" && seen.insert(id) {
                        let to: SocketAddr = local.parse().unwrap();
                        if let Some(t) = rfc4571::tcp_connect(
                            &ip,
                            to,
                            Arc::clone(&stop),
                            10_000,
                            Arc::clone(&f2),
                        ) {
                            threads.push(t);
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(30));
            }
            for t in threads {
                let _ = t.join();
            }
        })
    });
    (flows, h)
}

/// The media peer of one side for one combination.
fn peer(
    side: Side,
    ns: &str,
    g_ns: &str,
    domain: &'static str,
    ip: &str,
    port: u16,
    stop: &Arc<AtomicBool>,
) -> (Flows, std::thread::JoinHandle<()>) {
    let addr = format!("{ip}:{port}");
    let stop2 = Arc::clone(stop);
    match side {
        Side::Udp => in_netns(ns, move || rfc4571::udp_responder(&addr, stop2, 10_000)),
        // The peer listens: vgate connects.
        Side::Tcp("passive") => in_netns(ns, move || rfc4571::tcp_server(&addr, stop2, 10_000)),
        // The peer connects (active, or actpass answered passive by vgate).
        Side::Tcp(_) => connector(ns, g_ns, domain, ip, stop2),
    }
}

fn setup_bed(test: &str) -> Option<(Bed, tempfile::TempDir)> {
    if !prerequisites(
        test,
        true,
        &[
            ("sipp", "sip-tester"),
            ("ip", "iproute2"),
            ("timeout", "coreutils"),
        ],
    ) {
        return None;
    }
    let bed = Bed::up(1);
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("a")).unwrap();
    std::fs::create_dir_all(dir.path().join("b")).unwrap();
    Some((bed, dir))
}

#[test]
fn gb_tcp_media_every_combination_both_ways() {
    let Some((bed, dir)) = setup_bed("gb_tcp_netns") else {
        return;
    };
    let (a_ns, b_ns, g_ns) = bed.namespaces();
    let [a_ip, b_ip, ga_ip, gb_ip] = bed.addresses();
    let vgate = Vgate::start_in(&g_ns, &config(&bed), &[]);
    let mut combos = vec![
        (Side::Tcp("passive"), Side::Udp),
        (Side::Udp, Side::Tcp("active")),
        (Side::Tcp("passive"), Side::Tcp("active")),
        (Side::Tcp("active"), Side::Tcp("passive")),
        (Side::Tcp("actpass"), Side::Udp),
    ];
    // GBTCP_ONLY=<index>: one combination (for debugging).
    if let Some(i) = std::env::var("GBTCP_ONLY")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        combos = vec![combos[i]];
    }
    const CALLS: usize = 10;
    for (n, (b_side, a_side)) in combos.into_iter().enumerate() {
        let what = format!("B {b_side:?} / A {a_side:?}");
        let (a_dir, b_dir) = (dir.path().join("a"), dir.path().join("b"));
        let uas = a_dir.join(format!("uas{n}.xml"));
        let uac = b_dir.join(format!("uac{n}.xml"));
        std::fs::write(&uas, uas_xml(a_side, 16000, r"10\.201\.2\.", None)).unwrap();
        std::fs::write(&uac, uac_xml(b_side, 6000, 2000, false, r"10\.201\.1\.")).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (a_flows, a_peer) = peer(a_side, &a_ns, &g_ns, "a", &a_ip, 16000, &stop);
        let (b_flows, b_peer) = peer(b_side, &b_ns, &g_ns, "b", &b_ip, 6000, &stop);
        let (platform_ok, device_ok) = run_calls(&bed, &uas, &uac, CALLS, &["-r", "5", "-l", "10"]);
        assert!(
            platform_ok,
            "{what}: not every call completed; logs in {}",
            b_dir.display()
        );
        assert!(
            device_ok,
            "{what}: the device scenario failed (leak or lost y=/f=); logs in {}",
            a_dir.display()
        );
        // The calls are over: their legs close (peers see EOF), then the peers stop.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !legs(&g_ns).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(
            legs(&g_ns).is_empty(),
            "{what}: legs left after the calls: {:?}",
            legs(&g_ns)
        );
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, Relaxed);
        a_peer.join().unwrap();
        b_peer.join().unwrap();
        {
            let (af, bf) = (a_flows.lock().unwrap(), b_flows.lock().unwrap());
            let sum = |f: &[Flow]| f.iter().map(|f| f.received).sum::<u64>();
            let longest = |f: &[Flow]| f.iter().map(Flow::duration).max().unwrap_or_default();
            eprintln!(
                "{what}: talkback at A: {} flows, {} packets (longest {:?}); live view at B: {} flows, {} packets (longest {:?})",
                af.len(),
                sum(&af),
                longest(&af),
                bf.len(),
                sum(&bf),
                longest(&bf),
            );
        }
        check_flows(
            &format!("{what}: talkback at A"),
            &a_flows.lock().unwrap(),
            CALLS,
            &ga_ip,
        );
        check_flows(
            &format!("{what}: live view at B"),
            &b_flows.lock().unwrap(),
            CALLS,
            &gb_ip,
        );
    }
    let pid = vgate.pid();
    assert_eq!(leg_threads(pid), 0, "every leg's thread has ended");
    let totals = leg_totals(&g_ns);
    assert_eq!(totals["framing_errors"], 0, "{totals}");
    assert_eq!(totals["refused"], 0, "{totals}");
    assert!(totals["frames_in"].as_u64().unwrap_or(0) > 0, "{totals}");
    let frames_in = metric(&g_ns, "vgate_edge_leg_events_total{event=\"frames_in\"}");
    assert_eq!(
        Some(frames_in),
        totals["frames_in"].as_u64(),
        "the metrics show the legs' totals"
    );
    vgate.stop().assert_nothing_left("vgate");
}

/// Waits until vgate lists a route on `channel` (both SDPs of the call have crossed), then a
/// little more for the ACK.
fn wait_for_route(g_ns: &str, channel: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let body = admin::get_in(g_ns, ADMIN, "/api/v1/routes");
        if body.contains(&format!("\"channel\":\"{channel}\"")) {
            std::thread::sleep(Duration::from_millis(300));
            return;
        }
        std::thread::sleep(Duration::from_millis(30));
    }
    panic!("no {channel} route appeared");
}

/// Threads of process `pid` that are TCP media legs (`vgate-leg<id>`).
fn leg_threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.starts_with("vgate-leg"))
                })
                .count()
        })
        .unwrap_or(0)
}

fn metric(g_ns: &str, series: &str) -> u64 {
    admin::sample(&admin::get_in(g_ns, ADMIN, "/metrics"), series).unwrap_or(0.0) as u64
}

/// Runs call `n` whose A side is a TCP peer listening at `A_IP:a_port` (vgate connects):
/// once the call's route on `channel` is up, `a_peer` drives the connection. B is a UDP
/// peer at `B_IP:b_port` that `b_peer` drives (given that address). Both peers share a flag
/// set once the call is over (and which they may set themselves). The call must end by
/// vgate's BYE to both sides (the leg closes).
fn call_ended_by_the_leg(
    dir: &Path,
    bed: &Bed,
    (n, a_port, b_port, channel): (usize, u16, u16, &'static str),
    a_peer: impl FnOnce(TcpStream, Arc<AtomicBool>) + Send + 'static,
    b_peer: impl FnOnce(String, Arc<AtomicBool>) + Send + 'static,
) {
    let done = Arc::new(AtomicBool::new(false));
    let (a_done, b_done) = (Arc::clone(&done), Arc::clone(&done));
    let (a_ns, b_ns, g_ns) = bed.namespaces();
    let a_addr = format!("{}:{a_port}", bed.get("A_IP"));
    let b_addr = format!("{}:{b_port}", bed.get("B_IP"));
    let a_peer = move || {
        let l = TcpListener::bind(&a_addr).unwrap();
        let (s, _) = l.accept().unwrap();
        wait_for_route(&g_ns, channel);
        a_peer(s, a_done)
    };
    let b_peer = move || b_peer(b_addr, b_done);
    let (a_dir, b_dir) = (dir.join("a"), dir.join("b"));
    let uas = a_dir.join(format!("bad_uas{n}.xml"));
    let uac = b_dir.join(format!("bad_uac{n}.xml"));
    std::fs::write(
        &uas,
        uas_xml(Side::Tcp("passive"), a_port, r"10\.201\.2\.", None),
    )
    .unwrap();
    std::fs::write(&uac, uac_xml(Side::Udp, b_port, 0, true, r"10\.201\.1\.")).unwrap();
    let a_thread = {
        let a_ns = a_ns.clone();
        std::thread::spawn(move || in_netns(&a_ns, a_peer))
    };
    let b_thread = {
        let b_ns = b_ns.clone();
        std::thread::spawn(move || in_netns(&b_ns, b_peer))
    };
    let (platform_ok, device_ok) = run_calls(bed, &uas, &uac, 1, &[]);
    assert!(
        platform_ok,
        "the platform got no BYE from vgate after the leg closed; logs in {}",
        b_dir.display()
    );
    assert!(
        device_ok,
        "the device got no BYE from vgate; logs in {}",
        a_dir.display()
    );
    a_thread.join().unwrap();
    b_thread.join().unwrap();
    done.store(true, Relaxed);
}

#[test]
fn gb_tcp_bad_input_stalls_and_a_closing_leg_ends_the_call() {
    let Some((bed, dir)) = setup_bed("gb_tcp_netns") else {
        return;
    };
    let (a_ns, _b_ns, g_ns) = bed.namespaces();
    let vgate = Vgate::start_in(&g_ns, &config(&bed), &[]);
    let pid = vgate.pid();

    // 1. Bad input: garbage before the first frame, a zero length, a 65535 length, a frame
    //    cut at the close; 20 good frames among them.
    let frame = |seq: u16| {
        let mut f = vec![0u8, 200, 0x80, 96];
        f.extend_from_slice(&seq.to_be_bytes());
        f.resize(2 + 200, 0x11);
        f
    };
    let mut bad = b"GARBAGE BEFORE THE FIRST FRAME\r\n".to_vec();
    for i in 0..5 {
        bad.extend_from_slice(&frame(i));
    }
    bad.extend_from_slice(&[0, 0]);
    for i in 5..10 {
        bad.extend_from_slice(&frame(i));
    }
    bad.extend_from_slice(&[0xff, 0xff, 0x01, 0x02]);
    for i in 10..20 {
        bad.extend_from_slice(&frame(i));
    }
    bad.extend_from_slice(&[0, 100, 0x80, 96, 0, 99]);
    call_ended_by_the_leg(
        dir.path(),
        &bed,
        (1, 16001, 6001, "forward"),
        move |mut s, _| {
            s.write_all(&bad).unwrap();
            // Closed here, mid-frame.
        },
        move |b1, b_stop| {
            let (_f, h) = rfc4571::udp_responder(&b1, b_stop, 0);
            let _ = h;
        },
    );
    let t = leg_totals(&g_ns);
    assert_eq!(t["frames_in"], 20, "{t}");
    assert_eq!(
        t["framing_errors"], 3,
        "garbage, length 0, length 65535: {t}"
    );
    assert_eq!(t["partial_frames"], 1, "{t}");
    assert!(legs(&g_ns).is_empty(), "the leg is gone with its call");

    // 2. A TCP peer that never reads while B sends 6000 packets at 2000/s: counted stalls,
    //    vgate's memory flat.
    let rss_before = rss_kb(pid);
    call_ended_by_the_leg(
        dir.path(),
        &bed,
        (2, 16002, 6002, "reverse"),
        move |mut s, blasted| {
            let _ = nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::RcvBuf, &4096);
            // Frames every 20 ms so B hears from the gateway; never a read.
            let mut seq = 0u16;
            while !blasted.load(Relaxed) {
                let mut f = vec![0u8, 40, 0x80, 96];
                f.extend_from_slice(&seq.to_be_bytes());
                f.resize(42, 0);
                if s.write_all(&f).is_err() {
                    break;
                }
                seq = seq.wrapping_add(1);
                std::thread::sleep(Duration::from_millis(20));
            }
        },
        move |b2, blasted| {
            let s = std::net::UdpSocket::bind(&b2).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let mut buf = [0u8; 2048];
            let (_, gw) = s.recv_from(&mut buf).unwrap();
            let mut p = vec![0u8; 1200];
            p[0] = 0x80;
            p[1] = 96;
            let start = Instant::now();
            for i in 0..6000u32 {
                p[2..4].copy_from_slice(&(i as u16).to_be_bytes());
                let _ = s.send_to(&p, gw);
                // 2000 packets/s.
                let due = start + Duration::from_micros(500 * u64::from(i));
                if let Some(d) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(d);
                }
            }
            blasted.store(true, Relaxed);
        },
    );
    let t = leg_totals(&g_ns);
    let stalls = t["stalls"].as_u64().unwrap_or(0);
    assert!(
        stalls > 0,
        "a peer that never reads must cost counted stalls: {t}"
    );
    let leg_stall = metric(
        &g_ns,
        "vgate_channel_drops_total{channel=\"reverse\",reason=\"leg_stall\"}",
    );
    // The leg's stalls are the engine's refused offers (leg_stall) plus what the leg still
    // held when the call ended (its sink, 256 slots, and its 256 KiB write buffer of
    // 1202-byte frames): the engines had counted those as sent.
    assert!(
        stalls > leg_stall,
        "what the leg held at the end is counted too: leg {stalls}, engine {leg_stall}"
    );
    assert!(
        stalls - leg_stall <= 256 + (256 * 1024) / 1202 + 1,
        "no more than the sink and write buffer held: leg {stalls}, engine {leg_stall}"
    );
    let rss_after = rss_kb(pid);
    eprintln!("stalls={stalls} rss before={rss_before} KiB after={rss_after} KiB");
    assert!(
        rss_after < rss_before + 16 * 1024,
        "memory must stay flat: {rss_before} KiB -> {rss_after} KiB"
    );
    let _ = a_ns;
    vgate.stop().assert_nothing_left("vgate");
}

/// GB/T 28181-2022 Annex D: a device that is the TCP client of its media (it answers
/// `a=setup:active`, vgate listens) reconnects after its connection drops, at least 3 times
/// at least 1 s apart, before the call is lost. The device here drops its connection and
/// comes back 3 times (after 3 s — longer than the 2 s vgate used to wait —, then 1.2 s
/// twice) to the same gateway port: each new connection carries media both ways again
/// (live view to the platform, talkback back), the call stays up, and the leg counts 3
/// reconnects. Then it drops for good: once `tcp_media_reconnect` (5 s here) is over vgate
/// ends the call with BYE to both sides.
#[test]
fn gb_tcp_device_reconnects_keep_the_call_until_the_window_ends() {
    let Some((bed, dir)) = setup_bed("gb_tcp_netns") else {
        return;
    };
    let (a_ns, b_ns, g_ns) = bed.namespaces();
    let head = bed.config(BedConfig {
        control: ADMIN,
        ..Default::default()
    });
    let cfg = head + &sipp::gb_b2a_route(&bed, "media_timeout = 30\ntcp_media_reconnect = 5\n");
    let vgate = Vgate::start_in(&g_ns, &cfg, &[]);
    let (a_dir, b_dir) = (dir.path().join("a"), dir.path().join("b"));
    let uas = a_dir.join("reconnect_uas.xml");
    let uac = b_dir.join("reconnect_uac.xml");
    std::fs::write(
        &uas,
        uas_xml(Side::Tcp("active"), 16020, r"10\.201\.2\.", None),
    )
    .unwrap();
    std::fs::write(&uac, uac_xml(Side::Udp, 6020, 0, true, r"10\.201\.1\.")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let b_addr = format!("{}:6020", bed.get("B_IP"));
    let (b_flows, b_peer) = {
        let stop = Arc::clone(&stop);
        in_netns(&b_ns, move || {
            rfc4571::udp_responder(&b_addr, stop, 100_000)
        })
    };
    // The device's media: (frames it read back on each connection, the gateway ports).
    let device = {
        let g = g_ns.clone();
        std::thread::spawn(move || {
            in_netns(&a_ns, move || {
                let deadline = Instant::now() + Duration::from_secs(20);
                let local = loop {
                    let listening = legs(&g).into_iter().find(|(_, d, role, state, _)| {
                        d == "a" && role == "passive" && state == "listening"
                    });
                    if let Some((_, _, _, _, local)) = listening {
                        break local.parse::<SocketAddr>().unwrap();
                    }
                    assert!(Instant::now() < deadline, "no passive leg in A appeared");
                    std::thread::sleep(Duration::from_millis(30));
                };
                let mut seq = 0u16;
                let mut back = Vec::new();
                for gap in [3000u64, 1200, 1200, 0] {
                    let mut s = TcpStream::connect(local).unwrap_or_else(|e| {
                        panic!("the device's reconnect to {local} was refused: {e}")
                    });
                    s.set_read_timeout(Some(rfc4571::PACE)).unwrap();
                    let (mut got, mut buf) = (0u64, [0u8; 4096]);
                    let until = Instant::now() + Duration::from_secs(5);
                    let mut sent = 0;
                    while (sent < 25 || got == 0) && Instant::now() < until {
                        let mut f = vec![0u8, 40, 0x80, 96];
                        f.extend_from_slice(&seq.to_be_bytes());
                        f.resize(42, 0x22);
                        // The SSRC the SDP's `y=01` names.
                        f[8..12].copy_from_slice(&1u32.to_be_bytes());
                        if s.write_all(&f).is_err() {
                            break;
                        }
                        (seq, sent) = (seq.wrapping_add(1), sent + 1);
                        match std::io::Read::read(&mut s, &mut buf) {
                            Ok(0) => break,
                            Ok(n) => got += n as u64,
                            Err(_) => {}
                        }
                    }
                    back.push(got);
                    drop(s);
                    std::thread::sleep(Duration::from_millis(gap));
                }
                back
            })
        })
    };
    let (platform_ok, device_ok) = run_calls(&bed, &uas, &uac, 1, &[]);
    let back = device.join().unwrap();
    stop.store(true, Relaxed);
    b_peer.join().unwrap();
    assert!(
        back.iter().all(|&n| n > 0),
        "talkback reached the device on each of its 4 connections: bytes {back:?}"
    );
    assert!(
        platform_ok,
        "the platform got no BYE from vgate after the device stopped reconnecting; logs in {}",
        b_dir.display()
    );
    assert!(
        device_ok,
        "the device got no BYE from vgate; logs in {}",
        a_dir.display()
    );
    let t = leg_totals(&g_ns);
    assert_eq!(t["reconnects"], 3, "{t}");
    assert_eq!(t["connects"], 4, "{t}");
    assert_eq!(
        metric(&g_ns, "vgate_edge_leg_events_total{event=\"reconnects\"}"),
        3
    );
    {
        let bf = b_flows.lock().unwrap();
        let received: u64 = bf.iter().map(|f| f.received).sum();
        eprintln!("live view at B: {} flows, {received} packets", bf.len());
        assert!(
            received >= 4 * 20,
            "live view from each connection reached the platform: {bf:#?}"
        );
    }
    assert!(legs(&g_ns).is_empty(), "the leg is gone with its call");
    vgate.stop().assert_nothing_left("vgate");
}
