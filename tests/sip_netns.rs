//! SIP proxy end to end on the three-namespace bed with real sipp peers:
//! - B→A: a GB platform in B (sipp UAC) places 50 live-view calls to a device in A (sipp
//!   UAS answering with SDP and playing RTP); every call completes, RTP arrives at the
//!   B address the platform offered, no message received in B names an A address (nor the
//!   reverse), and no session, route or port is left when vgate stops.
//! - A→B: the device REGISTERs with digest (401 → Authorization → 200), sends a Keepalive
//!   and a Catalog MESSAGE larger than 1500 bytes (one UDP datagram) to the platform.
//! - Unknown GB IDs and unknown sources get 403.
//! - A GB/T 28181-2022 REGISTER: `X-GB-ver` and the SM3 digest cross both ways intact.
//! - One SIP port per side (both routes on 5060, UDP and TCP): 5060 in Via and Contact on
//!   both sides, and a source no route allows gets 403 on the shared port.

mod common;

use std::collections::HashSet;
use std::io::Read;
use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::sipp::{self, make_rtp_pcap, read_logs, Sipp, GB_CID};
use common::udp::count_sink;
use common::vgate::Vgate;
use common::{admin, in_netns, Bed, BedConfig};

/// The capture mode of the UDP SIP flow: `stack`, or `VGATE_TEST_SIP_MODE` (the PF_RING guest
/// check, scripts/pfring-guest.sh, runs it with `tnapi` on the pfring engine).
fn sip_mode() -> String {
    std::env::var("VGATE_TEST_SIP_MODE").unwrap_or_else(|_| "stack".into())
}

/// `--engine` for the UDP SIP flow: `VGATE_TEST_SIP_ENGINE` (the guest check runs mode tnapi
/// on `afpacket` beside `pfring`, to compare the two on the same machine), else the mode's
/// default.
fn sip_engine() -> Vec<String> {
    match std::env::var("VGATE_TEST_SIP_ENGINE") {
        Ok(e) if !e.is_empty() => vec!["--engine".into(), e],
        _ => Vec::new(),
    }
}

/// The 50-call live view's pace: calls started per second and sipp's run timeout (s), 10
/// and 90, or `VGATE_TEST_SIP_RATE` and `VGATE_TEST_SIP_TIMEOUT` (the PF_RING guest under
/// software emulation runs slower; the calls and every check stay the same).
fn sip_pace() -> (u32, u32) {
    let var = |name: &str, default: u32| match std::env::var(name) {
        Ok(v) if !v.is_empty() => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v}: a whole number")),
        _ => default,
    };
    (
        var("VGATE_TEST_SIP_RATE", 10),
        var("VGATE_TEST_SIP_TIMEOUT", 90),
    )
}

fn config(bed: &Bed) -> String {
    let mode = sip_mode();
    let head = bed.config(BedConfig {
        control: "127.0.0.1:9940",
        mode: &mode,
        ..Default::default()
    });
    let upstream = format!("{}:5070", bed.get("B_IP"));
    head + &sipp::gb_b2a_route(bed, "")
        + "\n"
        + &common::signaling_route("a2b", "sip", "udp", ("a", 5060), &upstream)
        + "upstream_port = 5061\nallow_ids = [\"3402000000\"]\n"
}

/// Sends `msg` from `from` to `to` inside the current namespace and returns the first line
/// of the answer.
fn ask(from: &str, to: &str, msg: &str) -> String {
    let s = UdpSocket::bind(from).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    s.send_to(msg.as_bytes(), to).unwrap();
    let mut buf = [0u8; 4096];
    let n = s.recv(&mut buf).unwrap_or(0);
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .next()
        .unwrap_or("")
        .to_owned()
}

fn forbidden_probe(from_id: &str, b_ip: &str, port: u16) -> String {
    format!(
        "MESSAGE sip:34020000001320000001@3402000000 SIP/2.0\r\n\
Via: SIP/2.0/UDP {b_ip}:{port};branch=z9hG4bKprobe{port}\r\n\
From: <sip:{from_id}@3402000000>;tag=x\r\n\
To: <sip:34020000001320000001@3402000000>\r\n\
Call-ID: probe{port}@3402000000\r\n\
CSeq: 1 MESSAGE\r\n\
Max-Forwards: 70\r\n\
Content-Length: 0\r\n\r\n"
    )
}

/// What the sipp tests need besides root.
const PEERS: &[(&str, &str)] = &[
    ("sipp", "sip-tester"),
    ("ip", "iproute2"),
    ("timeout", "coreutils"),
];

/// The three-namespace bed with a sipp folder per domain (the RTP pcap the device plays in
/// A's, of `rtp` packets, when asked), the namespaces and the addresses.
struct SipBed {
    bed: Bed,
    dir: tempfile::TempDir,
    a_dir: PathBuf,
    b_dir: PathBuf,
    a_ns: String,
    g_ns: String,
    b_ns: String,
    a_ip: String,
    b_ip: String,
    ga_ip: String,
    gb_ip: String,
}

impl SipBed {
    fn up(rtp: Option<u32>) -> SipBed {
        let bed = Bed::up(1);
        let (dir, a_dir, b_dir) = sipp::side_dirs(rtp);
        let (a_ns, b_ns, g_ns) = bed.namespaces();
        let [a_ip, b_ip, ga_ip, gb_ip] = bed.addresses();
        SipBed {
            bed,
            dir,
            a_dir,
            b_dir,
            a_ns,
            g_ns,
            b_ns,
            a_ip,
            b_ip,
            ga_ip,
            gb_ip,
        }
    }

    /// Where the logs were, and the tails of sipp's errors, screens and stderr of both sides
    /// (the folder is removed with the test).
    fn keep_logs(&self) -> String {
        format!(
            "logs in {}{}{}",
            self.dir.path().display(),
            sipp::failure_logs("A", &self.a_dir),
            sipp::failure_logs("B", &self.b_dir)
        )
    }

    /// Adds 10.201.2.3, an address no route allows, to B's interface.
    fn add_stranger(&self) {
        let st = Command::new("ip")
            .args([
                "-n",
                &self.b_ns,
                "addr",
                "add",
                "10.201.2.3/24",
                "dev",
                self.bed.get("B_IF"),
            ])
            .status()
            .unwrap();
        assert!(st.success());
    }

    /// Topology hiding: nothing received in B names A, nothing received in A names B; the
    /// sipp logs of both sides, (A, B).
    fn assert_hidden(&self) -> (String, String) {
        let (a_log, b_log) = (
            read_logs(&self.a_dir, "_messages.log"),
            read_logs(&self.b_dir, "_messages.log"),
        );
        assert!(!b_log.contains("10.201.1."), "an A address reached B");
        assert!(!a_log.contains("10.201.2."), "a B address reached A");
        (a_log, b_log)
    }
}

/// Stops vgate: nothing left behind, and `channel` carried something.
fn stop_and_check(vgate: Vgate, channel: &str) {
    let totals = vgate.stop();
    totals.assert_nothing_left("vgate");
    let line = totals
        .raw
        .lines()
        .find(|l| l.starts_with(&format!("total channel={channel}")))
        .unwrap_or_default()
        .to_owned();
    assert!(
        !line.contains("tx_packets=0 "),
        "{channel} channel carried nothing: {line}"
    );
}

/// `step`'s calls all completed, and at least `min` RTP packets arrived, all from `from`
/// (the gateway's address).
fn assert_calls_and_rtp(
    what: &str,
    step: (ExitStatus, u64, HashSet<SocketAddr>),
    min: u64,
    from: &str,
    logs: &str,
) {
    let (st, rtp, sources) = step;
    assert!(
        st.success(),
        "{what}: not every call completed ({st:?}); {logs}"
    );
    assert!(rtp >= min, "{what}: {rtp} RTP packets, not {min}; {logs}");
    assert!(
        sources.iter().all(|s| s.ip().to_string() == from),
        "{what}: RTP must come from the gateway ({from}): {sources:?}"
    );
}

/// One step of calls: `server` (sipp) answers while `client` (sipp) runs to its end; with
/// `rtp_at` (namespace, address), a sink counts what reaches that address meanwhile. The
/// client's exit, and the RTP packets with their sources (none without `rtp_at`).
fn calls_with_rtp(
    server: Sipp,
    client: Sipp,
    rtp_at: Option<(&str, &str)>,
) -> (ExitStatus, u64, HashSet<SocketAddr>) {
    let stop = Arc::new(AtomicBool::new(false));
    let sink = rtp_at.map(|(ns, addr)| count_sink(ns, addr, Arc::clone(&stop)));
    let mut server = server.spawn();
    std::thread::sleep(Duration::from_millis(500));
    let st = client.status();
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let (rtp, sources) = sink.map(|h| h.join().unwrap()).unwrap_or_default();
    let _ = server.stop();
    (st, rtp, sources)
}

/// REGISTER with digest, Keepalive and a Catalog (> 1500 bytes, `t_args` the transport) from
/// the device in A (port `port`) to the platform in B; the Catalog reaches B and nothing
/// names the other domain.
fn register_and_catalog(sb: &SipBed, t_args: &[&str], port: u16) {
    let plat = sipp::scenario("gb_uas_platform_register.xml");
    let platform = Sipp::new(&sb.b_ns, &sb.b_dir, &plat, &sb.b_ip, 5070)
        .args(t_args)
        .args(&["-trace_msg"]);
    let dev = sipp::scenario("gb_uac_device_register.xml");
    let target = format!("{}:5060", sb.ga_ip);
    let device = Sipp::new(&sb.a_ns, &sb.a_dir, &dev, &sb.a_ip, port)
        .args(t_args)
        .args(&["-cid_str", GB_CID, &target, "-m", "1", "-trace_msg"])
        .timeout(30);
    let (st, _, _) = calls_with_rtp(platform, device, None);
    assert!(
        st.success(),
        "REGISTER/Keepalive/Catalog ({t_args:?}) did not complete; {}",
        sb.keep_logs()
    );
    let (_, b_log) = sb.assert_hidden();
    assert!(
        b_log.contains("Content-Length:  4377"),
        "the Catalog reached B"
    );
}

/// A wvp-style platform in B (sipp, port 5070) INVITEs the device in A (sipp at A:5060)
/// where its REGISTER came from: the device's exit and whether the platform completed.
fn invited_by_platform(sb: &SipBed, t_args: &[&str]) -> (ExitStatus, Option<bool>) {
    let platform_xml = sipp::scenario("gb_uas_platform_invites_registered.xml");
    let mut platform = Sipp::new(&sb.b_ns, &sb.b_dir, &platform_xml, &sb.b_ip, 5070)
        .args(t_args)
        .args(&["-m", "1", "-trace_msg", "-trace_err"])
        .timeout(60)
        .spawn();
    std::thread::sleep(Duration::from_millis(300));
    let device_xml = sipp::scenario("gb_uac_device_invited.xml");
    let target = format!("{}:5060", sb.ga_ip);
    let st = Sipp::new(&sb.a_ns, &sb.a_dir, &device_xml, &sb.a_ip, 5060)
        .args(t_args)
        .args(&[
            "-mp",
            "16000",
            &target,
            "-m",
            "1",
            "-trace_msg",
            "-trace_err",
        ])
        .timeout(60)
        .status();
    (st, platform.wait_exit(Duration::from_secs(120)))
}

/// The live view B→A: the device in A (sipp UAS at A:5060) answers `calls` (count, rate,
/// limit) of the platform in B (sipp UAC at B:5060), `t_args` the transport; RTP counted at
/// `rtp_at` in B when given.
fn live_view(
    sb: &SipBed,
    t_args: &[&str],
    calls: (u32, u32, u32),
    timeout: u32,
    rtp_at: Option<&str>,
) -> (ExitStatus, u64, HashSet<SocketAddr>) {
    let uas = sipp::scenario("gb_uas_device.xml");
    let device = Sipp::new(&sb.a_ns, &sb.a_dir, &uas, &sb.a_ip, 5060)
        .args(t_args)
        .args(&["-mp", "16000", "-trace_msg", "-trace_err"]);
    let uac = sipp::scenario("gb_uac_play.xml");
    let target = format!("{}:5060", sb.gb_ip);
    let platform = Sipp::new(&sb.b_ns, &sb.b_dir, &uac, &sb.b_ip, 5060)
        .args(t_args)
        .args(&["-mp", "16000", "-cid_str", GB_CID, &target])
        .args(&["-trace_msg", "-trace_err", "-trace_screen"])
        .calls(calls.0, calls.1, calls.2)
        .timeout(timeout);
    calls_with_rtp(
        device,
        platform,
        rtp_at.map(|addr| (sb.b_ns.as_str(), addr)),
    )
}

#[test]
fn sip_gb_calls_register_and_access_control_through_vgate() {
    require!("sip_netns", true, PEERS);
    let sb = SipBed::up(Some(100));
    let (b_ns, gb_ip) = (sb.b_ns.clone(), sb.gb_ip.clone());
    let engine = sip_engine();
    let engine: Vec<&str> = engine.iter().map(String::as_str).collect();
    let vgate = Vgate::start_in(&sb.g_ns, &config(&sb.bed), &engine);

    // 50 calls from the platform in B; the RTP sink at the address the platform offers.
    let (rate, timeout) = sip_pace();
    let step = live_view(
        &sb,
        &[],
        (50, rate, 20),
        timeout,
        Some(&format!("{}:6000", sb.b_ip)),
    );
    let what = "sipp UAC, RTP at the offered B address";
    assert_calls_and_rtp(what, step, 50, &gb_ip, &sb.keep_logs());

    // REGISTER with digest, Keepalive and a big Catalog from A to B; topology hiding.
    register_and_catalog(&sb, &[], 5062);

    // Access control: unknown ID, unknown source.
    let (b_ns2, b_ip2, gb2) = (b_ns.clone(), sb.b_ip.clone(), gb_ip.clone());
    let first = in_netns(&b_ns2, move || {
        ask(
            &format!("{b_ip2}:0"),
            &format!("{gb2}:5060"),
            &forbidden_probe("44010000002000000001", &b_ip2, 7001),
        )
    });
    assert!(first.starts_with("SIP/2.0 403"), "unknown GB ID: {first:?}");
    sb.add_stranger();
    let gb3 = gb_ip.clone();
    let second = in_netns(&b_ns, move || {
        ask(
            "10.201.2.3:7002",
            &format!("{gb3}:5060"),
            &forbidden_probe("34020000002000000001", "10.201.2.3", 7002),
        )
    });
    assert!(
        second.starts_with("SIP/2.0 403"),
        "unknown source: {second:?}"
    );

    // Nothing left behind.
    stop_and_check(vgate, "forward");
}

/// Media validation `enforce` on the route: a real sipp platform offering only VP8 gets
/// vgate's own `488` with the Warning (the scenario checks it), counted; nothing is
/// forwarded to A (no device runs there). Under `count` the same run fails (the INVITE is
/// forwarded and never answered), which this test was checked against.
#[test]
fn sip_enforce_answers_an_offer_of_only_unknown_codecs_with_488() {
    require!("sip_netns", true, PEERS);
    let sb = SipBed::up(None);
    let cfg = sb.bed.config(BedConfig {
        control: "127.0.0.1:9940",
        mode: "stack",
        ..Default::default()
    }) + &sipp::gb_b2a_route(&sb.bed, "media_validate = \"enforce\"\n");
    let vgate = Vgate::start_in(&sb.g_ns, &cfg, &[]);
    let uac = sipp::scenario("gb_uac_play_vp8.xml");
    let target = format!("{}:5060", sb.gb_ip);
    let run = Sipp::new(&sb.b_ns, &sb.b_dir, &uac, &sb.b_ip, 5060)
        .args(&["-cid_str", GB_CID, &target, "-trace_msg"])
        .calls(3, 10, 1)
        .timeout(30)
        .run();
    assert!(run.is_ok(), "sipp: {run:?}; {}", sb.keep_logs());
    // The proxy publishes its counters on its timer.
    let refused = || sip_event_at(&sb.g_ns, "127.0.0.1:9940", "b2a", "media_refused");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while refused() < 3 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        refused(),
        3,
        "one refusal per call, retransmissions not counted"
    );
    assert_eq!(
        sip_event_at(&sb.g_ns, "127.0.0.1:9940", "b2a", "forwarded_requests"),
        0
    );
    let totals = vgate.stop();
    totals.assert_nothing_left("vgate");
}

// ---- SIP over TCP (`transport = "tcp"` routes) with sipp `-t t1`. ----

fn tcp_config(bed: &Bed) -> String {
    config(bed)
        .replace("transport = \"udp\"", "transport = \"tcp\"")
        .replace("listen = \"127.0.0.1:9940\"", "listen = \"127.0.0.1:9941\"")
        .replace(
            "allow_ids = [\"3402000000\"]\n",
            "allow_ids = [\"3402000000\"]\nmax_message = 8192\nmax_connections_per_source = 3\n",
        )
}

/// A proxy event of a SIP route (in its family, see `metrics::event_series`), from the metrics inside `g_ns`.
fn sip_event(g_ns: &str, route: &str, event: &str) -> u64 {
    sip_event_at(g_ns, "127.0.0.1:9941", route, event)
}

fn big_message(b_ip: &str, port: u16, body_len: usize) -> Vec<u8> {
    let body = "x".repeat(body_len);
    format!(
        "MESSAGE sip:34020000001320000001@3402000000 SIP/2.0\r\n\
Via: SIP/2.0/TCP {b_ip}:{port};branch=z9hG4bKbig{port}\r\n\
From: <sip:34020000002000000001@3402000000>;tag=big\r\n\
To: <sip:34020000001320000001@3402000000>\r\n\
Call-ID: big{port}@3402000000\r\n\
CSeq: 1 MESSAGE\r\n\
Max-Forwards: 70\r\n\
Content-Type: Application/MANSCDP+xml\r\n\
Content-Length: {body_len}\r\n\r\n{body}"
    )
    .into_bytes()
}

#[test]
fn sip_over_tcp_calls_talkback_catalog_and_limits_through_vgate() {
    require!("sip_netns (tcp)", true, PEERS);
    let sb = SipBed::up(None);
    for d in [&sb.a_dir, &sb.b_dir] {
        make_rtp_pcap(&d.join("rtp.pcap"), 60);
    }
    let (a_ns, g_ns, b_ns) = (&sb.a_ns, &sb.g_ns, &sb.b_ns);
    let (a_ip, b_ip, ga_ip, gb_ip) = (&sb.a_ip, &sb.b_ip, &sb.ga_ip, &sb.gb_ip);
    let vgate = Vgate::start_in(g_ns, &tcp_config(&sb.bed), &[]);
    let keep_logs = sb.keep_logs();
    let t1: &[&str] = &["-t", "t1"];

    // 1. Live view B→A over TCP: 10 calls at a modest rate.
    let step = live_view(&sb, t1, (10, 5, 5), 60, Some(&format!("{b_ip}:6000")));
    assert_calls_and_rtp(
        "TCP calls B→A, RTP at the offered B address",
        step,
        10,
        gb_ip,
        &keep_logs,
    );

    // 2. Talkback A→B over TCP: the platform in B sends the voice, relayed B→A.
    let plat_tb = sipp::scenario("gb_uas_platform_talkback.xml");
    let platform = Sipp::new(b_ns, &sb.b_dir, &plat_tb, b_ip, 5070).args(&[
        "-t",
        "t1",
        "-mp",
        "16000",
        "-trace_msg",
    ]);
    let dev_tb = sipp::scenario("gb_uac_talkback.xml");
    let target_a = format!("{ga_ip}:5060");
    let device = Sipp::new(a_ns, &sb.a_dir, &dev_tb, a_ip, 5062)
        .args(&["-t", "t1", "-cid_str", GB_CID, &target_a, "-trace_msg"])
        .calls(3, 2, 1)
        .timeout(40);
    let voice_at = format!("{a_ip}:8000");
    let step = calls_with_rtp(platform, device, Some((a_ns, &voice_at)));
    assert_calls_and_rtp(
        "talkback, RTP from B to the device in A on the reverse channel",
        step,
        10,
        ga_ip,
        &keep_logs,
    );

    // 3. REGISTER with digest, Keepalive and a Catalog (> 1500 bytes) A→B over TCP.
    register_and_catalog(&sb, t1, 5064);

    // 4. Connection limit (3 per source) and an oversized message (max_message 8192).
    let (gb2, b_ip2) = (gb_ip.clone(), b_ip.clone());
    let (fourth, kept_open, oversize) = in_netns(b_ns, move || {
        use std::io::Write;
        use std::net::TcpStream;
        let to = format!("{gb2}:5060");
        let open: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(&to).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(300));
        let mut extra = TcpStream::connect(&to).unwrap();
        extra
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        let mut buf = [0u8; 64];
        let fourth = match extra.read(&mut buf) {
            Ok(0) => "closed".to_string(),
            Ok(n) => format!("data: {:?}", String::from_utf8_lossy(&buf[..n])),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => "closed".into(),
            Err(e) => format!("error: {e}"),
        };
        let mut first = &open[0];
        first
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let kept_open = matches!(
            first.read(&mut buf),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
        );
        drop(open);
        drop(extra);
        std::thread::sleep(Duration::from_millis(300));
        // An oversized message: answered 513, then the connection ends; no hang.
        let mut s = TcpStream::connect(&to).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let port = s.local_addr().unwrap().port();
        let started = Instant::now();
        let _ = s.write_all(&big_message(&b_ip2, port, 9000));
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer);
        (
            fourth,
            kept_open,
            (
                String::from_utf8_lossy(&answer).into_owned(),
                started.elapsed(),
            ),
        )
    });
    assert_eq!(
        fourth, "closed",
        "a 4th connection from one source must be refused"
    );
    assert!(kept_open, "the 3 allowed connections stay open");
    let (answer, took) = oversize;
    assert!(
        answer.starts_with("SIP/2.0 513 Message Too Large\r\n"),
        "oversized message: {answer:?}; {keep_logs}"
    );
    assert!(answer.contains("Warning: 399 vgate \"message exceeds the 8192-byte limit"));
    assert!(took < Duration::from_secs(4), "the refusal took {took:?}");
    std::thread::sleep(Duration::from_millis(1300)); // counters reach the metrics each second
    assert_eq!(sip_event(g_ns, "b2a", "too_large"), 1);
    assert_eq!(sip_event(g_ns, "b2a", "tcp_unframeable"), 1);
    assert_eq!(sip_event(g_ns, "b2a", "tcp_connections_refused"), 1);

    stop_and_check(vgate, "reverse");
}

/// A wvp-style platform in B (sipp) that addresses a device by where its REGISTER came
/// from: the device (sipp in A, Call-ID carrying its address) registers through vgate, the
/// platform INVITEs `sip:<device id>@<vgate's upstream face>` without any token, the call
/// is answered, acknowledged and hung up. Neither side sees an address of the other domain
/// (Call-ID included). Before vgate routed such requests by device ID they got 404.
#[test]
fn sip_wvp_style_platform_invites_the_registered_address() {
    require!("sip_wvp_style_platform", true, PEERS);
    let sb = SipBed::up(None);
    // Only the A→B route: the platform's INVITE has no other way to the device.
    let text = config(&sb.bed);
    let a2b = text.find("[[signaling_route]]\nname = \"a2b\"").unwrap();
    let b2a = text.find("[[signaling_route]]\nname = \"b2a\"").unwrap();
    let text = format!("{}{}", &text[..b2a], &text[a2b..]).replace("upstream_port = 5061\n", "");
    let vgate = Vgate::start_in(&sb.g_ns, &text, &[]);
    let (st, platform_ok) = invited_by_platform(&sb, &[]);
    let (a_log, b_log) = (
        read_logs(&sb.a_dir, "_messages.log"),
        read_logs(&sb.b_dir, "_messages.log"),
    );
    assert!(
        st.success(),
        "the device (sipp in A) did not complete: {st:?}\n{a_log}"
    );
    assert!(
        platform_ok == Some(true),
        "the platform (sipp in B) did not complete: {platform_ok:?}\n{b_log}"
    );
    // The device's Call-ID named its address; none of it reached B, and the reverse.
    assert!(
        a_log.contains(&format!("@{}", sb.a_ip)),
        "the device's Call-ID carries its address"
    );
    for (log, other, what) in [
        (&b_log, "10.201.1.", "an A address reached B"),
        (&a_log, "10.201.2.", "a B address reached A"),
    ] {
        assert!(!log.contains(other), "{what}:\n{log}");
    }
    vgate.stop();
}

/// A GB/T 28181-2022 device (sipp in A) registers with a 2022 platform (sipp in B) through
/// vgate: `X-GB-ver: 3.0` on both REGISTERs and on the 401 and 200, the platform's SM3
/// challenge and the device's SM3 `Authorization` byte for byte, the Request-URI as the
/// device wrote it; each scenario checks what it receives (and that no address of the other
/// domain is in it), so a stripped or altered header fails the flow.
#[test]
fn sip_gb2022_register_with_x_gb_ver_and_sm3_through_vgate() {
    require!("sip_gb2022_register", true, PEERS);
    let sb = SipBed::up(None);
    let vgate = Vgate::start_in(&sb.g_ns, &config(&sb.bed), &[]);
    let plat = sipp::scenario("gb2022_uas_platform_register.xml");
    let mut platform = Sipp::new(&sb.b_ns, &sb.b_dir, &plat, &sb.b_ip, 5070)
        .args(&["-m", "1", "-trace_msg", "-trace_err"])
        .timeout(60)
        .spawn();
    std::thread::sleep(Duration::from_millis(300));
    let dev = sipp::scenario("gb2022_uac_device_register.xml");
    let target = format!("{}:5060", sb.ga_ip);
    let st = Sipp::new(&sb.a_ns, &sb.a_dir, &dev, &sb.a_ip, 5064)
        .args(&[
            "-cid_str",
            GB_CID,
            &target,
            "-m",
            "1",
            "-trace_msg",
            "-trace_err",
        ])
        .timeout(30)
        .status();
    let platform_ok = platform.wait_exit(Duration::from_secs(60));
    let (a_log, b_log) = sb.assert_hidden();
    assert!(
        st.success(),
        "the 2022 device (sipp in A) did not complete: {st:?}\n{a_log}"
    );
    assert!(
        platform_ok == Some(true),
        "the 2022 platform (sipp in B) did not complete: {platform_ok:?}\n{b_log}"
    );
    assert!(b_log.contains("X-GB-ver: 3.0"), "{b_log}");
    assert!(a_log.contains("algorithm=SM3"), "{a_log}");
    vgate.stop();
}

// ---- One SIP port per side: both routes on 5060, sharing each side's socket. ----

/// Yesterday's pair: both routes listen on 5060 and set no `upstream_port`, so each side
/// has one SIP socket (B:5060 is b2a's listen face and a2b's upstream face); b2a allows
/// only the platform's address.
fn shared_config(bed: &Bed, transport: &str, control: &str) -> String {
    config(bed)
        .replace("upstream_port = 5061\n", "")
        .replace(
            "transport = \"udp\"",
            &format!("transport = \"{transport}\""),
        )
        .replace(
            "listen = \"127.0.0.1:9940\"",
            &format!("listen = \"{control}\""),
        )
}

/// A proxy event of a SIP route read from the metrics at `control` inside `g_ns`.
fn sip_event_at(g_ns: &str, control: &str, route: &str, event: &str) -> u64 {
    let series = vgate::control::metrics::event_series(route, "sip", event);
    let text = admin::get_in(g_ns, control, "/metrics");
    admin::sample(&text, &series).unwrap_or_else(|| panic!("no {series} in the metrics")) as u64
}

/// Counts what reaches `addr` in `ns` (UDP datagrams, or TCP connections) until `stop`.
fn sip_sink(
    ns: &str,
    addr: &str,
    tcp: bool,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    if !tcp {
        let h = count_sink(ns, addr, stop);
        return std::thread::spawn(move || h.join().unwrap().0);
    }
    let (ns, addr) = (ns.to_owned(), addr.to_owned());
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        in_netns(&ns, move || {
            let l = std::net::TcpListener::bind(&addr).unwrap_or_else(|e| panic!("{addr}: {e}"));
            l.set_nonblocking(true).unwrap();
            let _ = ready_tx.send(());
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok(_) => n += 1,
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
            n
        })
    });
    let _ = ready_rx.recv_timeout(Duration::from_secs(10));
    h
}

/// The gateway as one SIP endpoint per side, with real sipp peers: live view B→A through
/// b2a, then a device registering through a2b and a wvp-style platform calling it at the
/// address its REGISTER came from — B:5060, where b2a listens too, so the call is told
/// apart by the registration. Everything each side receives shows the gateway at 5060 (Via
/// and Contact), never 5061. Then a source of B that no route allows sends a control
/// MESSAGE to the registered device on B:5060: `403 Forbidden`, counted, and nothing
/// reaches domain A (before the access rule was settled, a2b's upstream face took it).
fn one_sip_port_per_side(transport: &str) {
    let tcp = transport == "tcp";
    let t_args: &[&str] = if tcp { &["-t", "t1"] } else { &[] };
    let via_t = transport.to_uppercase();
    let control = if tcp {
        "127.0.0.1:9943"
    } else {
        "127.0.0.1:9942"
    };
    let mut sb = SipBed::up(Some(40));
    sb.dir.disable_cleanup(true);
    let (a_ns, g_ns, b_ns) = (&sb.a_ns, &sb.g_ns, &sb.b_ns);
    let (a_ip, ga_ip, gb_ip) = (&sb.a_ip, &sb.ga_ip, &sb.gb_ip);
    let keep_logs = sb.keep_logs();
    let vgate = Vgate::start_in(g_ns, &shared_config(&sb.bed, transport, control), &[]);

    // 1. Live view B→A: the platform calls b2a's upstream (the device at A:5060).
    let (st, _, _) = live_view(&sb, t_args, (5, 5, 5), 60, None);
    assert!(
        st.success(),
        "{transport}: live view B→A on the shared port failed ({st:?}); {keep_logs}"
    );

    // 2. A device registers through a2b (A:5060 → the platform at B_IP:5070, from B:5060);
    //    the platform INVITEs it at B:5060, where b2a listens as well.
    let (st, platform_ok) = invited_by_platform(&sb, t_args);
    assert!(
        st.success() && platform_ok == Some(true),
        "{transport}: register + platform INVITE by device ID on the shared port failed \
         (device {st:?}, platform {platform_ok:?}); {keep_logs}"
    );

    // 3. Each side sees the gateway on 5060 only.
    let (a_log, b_log) = sb.assert_hidden();
    for (side, log, gw) in [("A", &a_log, &ga_ip), ("B", &b_log, &gb_ip)] {
        let via = format!("Via: SIP/2.0/{via_t} {gw}:5060;branch=z9hG4bKvg");
        let contact = format!("@{gw}:5060;");
        assert!(
            log.contains(&via),
            "{transport}: {side} never saw `{via}`; {keep_logs}"
        );
        assert!(
            log.lines()
                .any(|l| l.starts_with("Contact:") && l.contains(&contact) && l.contains("vgt=")),
            "{transport}: {side} never saw a Contact `{contact}…vgt=`; {keep_logs}"
        );
        assert!(
            !log.contains(&format!("{gw}:5061")),
            "{transport}: {side} saw the gateway on 5061; {keep_logs}"
        );
    }
    // 4. A stranger of domain B (an address no route allows) addresses the registered
    //    device on B:5060: 403, counted, and nothing arrives at the device's address.
    sb.add_stranger();
    let stop = Arc::new(AtomicBool::new(false));
    let reached_a = sip_sink(a_ns, &format!("{a_ip}:5060"), tcp, Arc::clone(&stop));
    let s_dir = sb.dir.path().join("stranger");
    std::fs::create_dir_all(&s_dir).unwrap();
    let stranger_xml = sipp::scenario("gb_uac_stranger.xml");
    let st = Sipp::new(b_ns, &s_dir, &stranger_xml, "10.201.2.3", 5080)
        .args(t_args)
        .args(&[
            &format!("{gb_ip}:5060"),
            "-m",
            "1",
            "-trace_msg",
            "-trace_err",
        ])
        .timeout(30)
        .status();
    std::thread::sleep(Duration::from_millis(700));
    stop.store(true, Ordering::Relaxed);
    let leaked = reached_a.join().unwrap();
    assert!(
        st.success(),
        "{transport}: the stranger's MESSAGE on the shared port was not answered 403 \
         ({st:?}):\n{}",
        read_logs(&s_dir, "_messages.log")
    );
    assert_eq!(
        leaked, 0,
        "{transport}: the stranger's request reached domain A"
    );
    std::thread::sleep(Duration::from_millis(1300)); // counters reach the metrics each second
    assert_eq!(sip_event_at(g_ns, control, "b2a", "forbidden"), 1);
    assert_eq!(sip_event_at(g_ns, control, "a2b", "upstream_forbidden"), 0);
    assert_eq!(sip_event_at(g_ns, control, "a2b", "routed_by_user"), 1);

    let totals = vgate.stop();
    totals.assert_nothing_left("vgate");
}

#[test]
fn sip_one_port_per_side_shows_5060_and_refuses_strangers() {
    require!("sip_one_port_per_side", true, PEERS);
    one_sip_port_per_side("udp");
}

#[test]
fn sip_over_tcp_one_port_per_side_shows_5060_and_refuses_strangers() {
    require!("sip_one_port_per_side (tcp)", true, PEERS);
    one_sip_port_per_side("tcp");
}

/// GB/T 28181 subscriptions across the gateway, real sipp peers: a platform in B subscribes
/// to the device in A for Catalog, Alarm and MobilePosition in turn (`-key event`), over UDP
/// and over TCP: SUBSCRIBE with Expires and its 200, the device's MANSCDP NOTIFY in the
/// dialog, a refresh and its NOTIFY, unsubscribe (`Expires: 0`) and the final `terminated`
/// NOTIFY (`tests/sipp/gb_uac_platform_subscribe.xml`, `gb_uas_device_subscribed.xml`).
/// Each side sees only its own Call-ID (sipp matches every in-dialog request to the call by
/// it) and no address of the other domain, the device's `<IPAddress>` reaching B as the
/// gateway's.
#[test]
fn sip_gb_subscriptions_catalog_alarm_mobile_position_through_vgate() {
    require!("sip_netns (subscriptions)", true, PEERS);
    let sb = SipBed::up(None);
    for (transport, t_args, cfg) in [
        ("udp", &["-t", "u1"][..], config(&sb.bed)),
        ("tcp", &["-t", "t1"][..], tcp_config(&sb.bed)),
    ] {
        let vgate = Vgate::start_in(&sb.g_ns, &cfg, &[]);
        for event in ["Catalog", "Alarm", "MobilePosition"] {
            let uas = sipp::scenario("gb_uas_device_subscribed.xml");
            let mut device = Sipp::new(&sb.a_ns, &sb.a_dir, &uas, &sb.a_ip, 5060)
                .args(t_args)
                .args(&["-m", "1", "-trace_msg", "-trace_err"])
                .timeout(30)
                .spawn();
            std::thread::sleep(Duration::from_millis(300));
            let uac = sipp::scenario("gb_uac_platform_subscribe.xml");
            let target = format!("{}:5060", sb.gb_ip);
            let st = Sipp::new(&sb.b_ns, &sb.b_dir, &uac, &sb.b_ip, 5060)
                .args(t_args)
                .args(&[
                    "-key",
                    "event",
                    event,
                    "-cid_str",
                    GB_CID,
                    &target,
                    "-m",
                    "1",
                    "-trace_msg",
                    "-trace_err",
                ])
                .timeout(30)
                .status();
            assert!(
                st.success(),
                "{transport} {event}: the platform's subscription flow failed: {}\n{}",
                read_logs(&sb.b_dir, "_errors.log"),
                read_logs(&sb.b_dir, "_messages.log")
            );
            assert_eq!(
                device.wait_exit(Duration::from_secs(15)),
                Some(true),
                "{transport} {event}: the device's subscription flow failed: {}\n{}",
                read_logs(&sb.a_dir, "_errors.log"),
                read_logs(&sb.a_dir, "_messages.log")
            );
        }
        let (_, b_log) = sb.assert_hidden();
        assert!(
            b_log.contains(&format!("<IPAddress>{}</IPAddress>", sb.gb_ip)),
            "{transport}: the device's address reaches B as the gateway's"
        );
        assert!(b_log.contains("<CmdType>MobilePosition</CmdType>"));
        vgate.stop().assert_nothing_left("vgate");
    }
}
