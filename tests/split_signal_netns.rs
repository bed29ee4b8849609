//! SIP across the split appliance (`scripts/split-bed.sh`), with real sipp peers and the
//! GB/T 28181 scenarios of `tests/sipp/`: each half runs its own SIP proxies, and the
//! signaling agents carry the link face's SIP between them over the authenticated
//! signaling link; RTP crosses the one-way links.
//!
//! - `sip_gb_across_the_split`: 10 live-view calls B→A (UDP) with RTP at the offered address,
//!   then REGISTER with digest + Keepalive + a Catalog larger than 1500 bytes A→B; no domain
//!   address in the other domain, nothing travelled a one-way link the wrong way, no
//!   session, route or port left on either half, no frame refused on the signaling link.
//! - `sip_tcp_across_the_split`: the same REGISTER/Keepalive/Catalog over SIP/TCP on both
//!   domain sides (the agent carries the TCP streams).
//! - `killing_half_b_ends_the_call_in_a_and_a_restart_brings_calls_back`: a call is up, half B
//!   is killed (SIGKILL); half A sends BYE to the device in domain A within seconds and
//!   counts it; half B restarts and new calls complete; a forged frame on the signaling link
//!   is dropped and counted.
//!
//! - `static_routes_keep_flowing_through_a_signaling_outage`: the signaling link is cut, both
//!   halves declare the peer lost, a static stream still crosses intact; the link returns.
//! - `rtsp_udp_and_interleaved_with_upstream_digest_across_the_split`: GStreamer's RTSP server
//!   in A (digest required, answered by half A), ffmpeg in B plays 50 frames over UDP and over
//!   interleaved TCP through both halves; no domain A, face or signaling-link address in
//!   anything ffmpeg received; sessions end with TEARDOWN; nothing left on either half.
//!
//! - `gb_tcp_media_crosses_the_split_on_the_media_links`: GB calls with `TCP/RTP/AVP` at the
//!   platform's end, the device's, or both (RFC 4571 peers of `tests/common/rfc4571.rs`):
//!   each half terminates its own domain's TCP leg and offers the link face `RTP/AVP`; no
//!   gap in any flow, nothing left, no leak; the media crossed on the one-way links and the
//!   signaling link carried under a quarter of their bytes.
//! - `rtsp_interleaved_client_crosses_the_split_on_the_media_links`: interleaved ffmpeg in B,
//!   UDP-only GStreamer server in A: half B bridges to UDP toward the link face, 120 frames
//!   decoded, the video crossed on the forward link, not the signaling link.
//! - `rtsp_interleaved_record_crosses_the_split_on_the_reverse_link`: interleaved ffmpeg
//!   pushes to a UDP-only RECORD server: the packets half B's bridge injects toward the face
//!   go down the reverse link, all delivered (those over a frame's 1414 bytes of media cut
//!   into two frames and joined), and the server decodes the video.
//!
//! Needs root, iproute2, nftables and sipp (sip-tester) — the RTSP test ffmpeg and
//! GStreamer's RTSP server instead of sipp; prints DID NOT RUN without them (fails under
//! CI=true).

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddrV4, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::gb_sipp::{uac_xml, uas_xml, Side};
use common::proc::{run_ok, Proc};
use common::sipp::{self, read_logs, Sipp, GB_CID};
use common::split::{half_config, start_half, start_halves, SplitBed, FACE_A, FACE_B};
use common::vgate::Vgate;

fn ready(test: &str) -> bool {
    let needs = [sipp::NEEDS, &[("python3", "python3")]].concat();
    common::prerequisites(test, true, &needs)
}

/// Signaling routes of each half for the GB flows. Calls: platform in B → half B (domain b,
/// 5060) → link → half A (link face, 5060) → device in A. Registration: device in A → half
/// A (domain a, 5060) → link → half B (link face, 5060) → platform in B (5070). Each route's
/// upstream face is port 5061, as the pair of routes of one host needs (each listens where the
/// other's upstream face would be by default).
fn sip_routes(bed: &SplitBed, half: &str, transport: &str) -> String {
    let route = |name: &str, listen: &str, upstream: String, extra: &str| {
        format!(
            "[[signaling_route]]\nname = \"{name}\"\ntype = \"sip\"\ntransport = \"{transport}\"\nlisten_domain = \"{listen}\"\nlisten_port = 5060\nupstream_port = 5061\nupstream = \"{upstream}\"\nallow_ids = [\"3402000000\"]\n{extra}\n"
        )
    };
    if half == "a" {
        route("link2a", "b", format!("{}:5060", bed.get("DA_IP")), "")
            + &route("a2link", "a", format!("{FACE_B}:5060"), "")
    } else {
        route(
            "b2link",
            "b",
            format!("{FACE_A}:5060"),
            &format!("allow_peers = [\"{}/32\"]", bed.get("DB_IP")),
        ) + &route("link2b", "a", format!("{}:5070", bed.get("DB_IP")), "")
    }
}

fn half(bed: &SplitBed, name: &str, transport: &str) -> Vgate {
    start_half(
        bed,
        name,
        &half_config(bed, name, "off", "off", &sip_routes(bed, name, transport)),
    )
}

/// Both halves with the GB routes over `transport` ([`half`]), once their peers are up.
fn halves_up(bed: &SplitBed, transport: &str) -> (Vgate, Vgate) {
    let (a, b) = (half(bed, "a", transport), half(bed, "b", transport));
    peers_up(&a, &b);
    (a, b)
}

/// Waits until both agents say the peer is up.
fn peers_up(a: &Vgate, b: &Vgate) {
    a.wait_for("peer authenticated, up", Duration::from_secs(30));
    b.wait_for("peer authenticated, up", Duration::from_secs(30));
}

/// Counts RTP packets arriving at `DB_IP:6000` and checks they come from half B's address.
struct Sink {
    stop: Arc<AtomicBool>,
    packets: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<Vec<std::net::SocketAddr>>>,
}

impl Sink {
    fn start(bed: &SplitBed) -> Sink {
        let stop = Arc::new(AtomicBool::new(false));
        let packets = Arc::new(AtomicU64::new(0));
        let (ns, addr) = (
            bed.get("DB_NS").to_owned(),
            format!("{}:6000", bed.get("DB_IP")),
        );
        let (stop2, packets2) = (Arc::clone(&stop), Arc::clone(&packets));
        let thread = std::thread::spawn(move || {
            common::enter_netns(&ns).unwrap();
            let s = UdpSocket::bind(&addr).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(100)))
                .unwrap();
            let mut buf = [0u8; 2048];
            let mut sources = Vec::new();
            while !stop2.load(Ordering::Relaxed) {
                if let Ok((_, from)) = s.recv_from(&mut buf) {
                    packets2.fetch_add(1, Ordering::Relaxed);
                    if !sources.contains(&from) {
                        sources.push(from);
                    }
                }
            }
            sources
        });
        Sink {
            stop,
            packets,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> (u64, Vec<std::net::SocketAddr>) {
        self.stop.store(true, Ordering::Relaxed);
        let sources = self.thread.take().unwrap().join().unwrap();
        (self.packets.load(Ordering::Relaxed), sources)
    }
}

fn device(bed: &SplitBed, dir: &Path, calls: &str) -> Proc {
    let uas = sipp::scenario("gb_uas_device.xml");
    Sipp::new(bed.get("DA_NS"), dir, &uas, bed.get("DA_IP"), 5060)
        .args(&["-mp", "16000", "-m", calls, "-trace_msg"])
        .spawn()
}

fn platform_calls(bed: &SplitBed, dir: &Path, scenario: &str, calls: &str) -> Sipp {
    let target = format!("{}:5060", bed.get("GB_IP"));
    Sipp::new(bed.get("DB_NS"), dir, scenario, bed.get("DB_IP"), 5060)
        .args(&["-mp", "16000", "-cid_str", GB_CID, &target])
        .args(&["-m", calls, "-r", "5", "-l", "5", "-trace_msg"])
        .timeout(90)
}

/// REGISTER with digest, Keepalive and a big Catalog from the device in A to the platform
/// in B; `t` is "u1" (UDP) or "t1" (TCP). The Catalog reaches B, and neither side sees an
/// address of the other.
fn register_a_to_b(bed: &SplitBed, a_dir: &Path, b_dir: &Path, t: &str) {
    let plat = sipp::scenario("gb_uas_platform_register.xml");
    let platform = Sipp::new(bed.get("DB_NS"), b_dir, &plat, bed.get("DB_IP"), 5070)
        .args(&["-t", t, "-trace_msg"])
        .spawn();
    std::thread::sleep(Duration::from_millis(500));
    // The scenario checks that the 200's Contact names the device's own address, written
    // for the three-namespace bed's A address; this bed's is another.
    let scenario = std::fs::read_to_string(sipp::scenario("gb_uac_device_register.xml")).unwrap();
    assert!(scenario.contains(r"10\.201\.1\.2:"));
    let dev = a_dir.join("gb_uac_device_register.xml");
    std::fs::write(
        &dev,
        scenario.replace(
            r"10\.201\.1\.2:",
            &format!("{}:", bed.get("DA_IP").replace('.', r"\.")),
        ),
    )
    .unwrap();
    let dev = dev.to_str().unwrap().to_owned();
    let target = format!("{}:5060", bed.get("GA_IP"));
    let st = Sipp::new(bed.get("DA_NS"), a_dir, &dev, bed.get("DA_IP"), 5062)
        .args(&[
            "-t",
            t,
            "-cid_str",
            GB_CID,
            &target,
            "-m",
            "1",
            "-trace_msg",
        ])
        .timeout(30)
        .run();
    if let Err(e) = st {
        panic!("REGISTER/Keepalive/Catalog across the split did not complete ({t}, {e})");
    }
    drop(platform);
    let b_log = read_logs(b_dir, "_messages.log");
    assert!(
        b_log.contains("Content-Length:  4377"),
        "the Catalog reached B ({t})"
    );
    topology_hidden(a_dir, b_dir);
}

/// The signaling link carried less than a quarter of the bytes of the media `links`.
fn no_media_on_the_signaling_link(signal: u64, media: u64, links: &str) {
    assert!(
        signal * 4 < media,
        "the signaling link carried {signal} bytes, the {links} {media}: media rode the signaling link"
    );
}

fn signal_totals(raw: &str) -> std::collections::HashMap<String, u64> {
    raw.lines()
        .find(|l| l.starts_with("signal "))
        .unwrap_or_else(|| panic!("no signal line in the totals:\n{raw}"))
        .split_whitespace()
        .filter_map(|w| w.split_once('='))
        .filter_map(|(k, v)| v.parse().ok().map(|v| (k.to_owned(), v)))
        .collect()
}

/// Stops a half; checks it left nothing behind and no frame was refused on the link.
fn stop_clean(v: Vgate, name: &str) -> std::collections::HashMap<String, u64> {
    let t = v.stop();
    t.assert_nothing_left(&format!("half {name}"));
    signal_totals(&t.raw)
}

fn no_wrong_direction(bed: &SplitBed) {
    let c = bed.counters();
    assert_eq!(
        c["FWD_WRONG"], 0,
        "a packet travelled the forward link backwards"
    );
    assert_eq!(
        c["REV_WRONG"], 0,
        "a packet travelled the reverse link backwards"
    );
}

fn topology_hidden(a_dir: &Path, b_dir: &Path) {
    let (a_log, b_log) = (
        read_logs(a_dir, "_messages.log"),
        read_logs(b_dir, "_messages.log"),
    );
    assert!(
        !a_log.is_empty() && !b_log.is_empty(),
        "sipp logged messages"
    );
    for (log, other, what) in [
        (&b_log, "10.211.1.", "a domain A address reached B"),
        (&a_log, "10.211.2.", "a domain B address reached A"),
    ] {
        assert!(!log.contains(other), "{what}");
    }
    for (log, link) in [&a_log, &b_log]
        .into_iter()
        .flat_map(|l| [(l, "127.77."), (l, "10.211.0.")])
    {
        assert!(
            !log.contains(link),
            "a link address ({link}) reached a domain"
        );
    }
}

/// A bed and a log folder for sipp in each domain (A's with the RTP pcap of `rtp` packets
/// when asked), once `test`'s prerequisites hold ([`ready`]; `None`: it said why not).
fn setup(test: &str, rtp: Option<u32>) -> Option<(SplitBed, tempfile::TempDir, PathBuf, PathBuf)> {
    if !ready(test) {
        return None;
    }
    let bed = SplitBed::up();
    let (dir, a_dir, b_dir) = sipp::side_dirs(rtp);
    Some((bed, dir, a_dir, b_dir))
}

#[test]
fn sip_gb_across_the_split() {
    let Some((bed, _dir, a_dir, b_dir)) = setup("split_signal_netns", Some(100)) else {
        return;
    };
    let (a, b) = halves_up(&bed, "udp");

    let mut dev = device(&bed, &a_dir, "10");
    let sink = Sink::start(&bed);
    std::thread::sleep(Duration::from_millis(300));
    let uac = sipp::scenario("gb_uac_play.xml");
    let st = platform_calls(&bed, &b_dir, &uac, "10").status();
    assert!(
        st.success(),
        "sipp UAC: not every call across the split completed; logs in {}",
        b_dir.display()
    );
    std::thread::sleep(Duration::from_millis(500));
    let (rtp, sources) = sink.finish();
    assert!(rtp >= 10, "RTP packets at the offered B address: {rtp}");
    let gb: std::net::SocketAddr = format!("{}:0", bed.get("GB_IP")).parse().unwrap();
    assert!(
        sources.iter().all(|s| s.ip() == gb.ip()),
        "RTP must come from half B's address: {sources:?}"
    );
    assert_eq!(
        dev.wait_exit(Duration::from_secs(10)),
        Some(true),
        "the device saw every call end with BYE"
    );

    register_a_to_b(&bed, &a_dir, &b_dir, "u1");
    // The peer's state and the agent's counters in each half's metrics and stats API.
    for half in ["a", "b"] {
        let m = common::split::admin_get(&bed, half, "/metrics");
        assert!(
            m.lines().any(|l| l == "vgate_split_peer_up 1"),
            "half {half}:\n{m}"
        );
        let carried = m
            .lines()
            .find_map(|l| l.strip_prefix("vgate_split_signal_total{event=\"udp_out\"} "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("half {half} metrics lack udp_out:\n{m}"));
        assert!(carried > 0, "half {half}");
        let stats: serde_json::Value =
            serde_json::from_str(&common::split::admin_get(&bed, half, "/api/v1/stats")).unwrap();
        assert_eq!(
            stats["split_signal"]["peer_up"], true,
            "half {half}: {stats}"
        );
        assert_eq!(
            stats["split_signal"]["counters"]["auth_failures"], 0,
            "half {half}"
        );
    }
    no_wrong_direction(&bed);
    for (v, name) in [(a, "a"), (b, "b")] {
        let s = stop_clean(v, name);
        for k in [
            "auth_failures",
            "replays",
            "malformed",
            "truncated",
            "refused",
        ] {
            assert_eq!(s[k], 0, "half {name}: {k}");
        }
        // Half a stops first and says goodbye: half b counts one loss with nothing to end.
        let lost = if name == "a" { 0 } else { 1 };
        assert_eq!(s["peer_lost"], lost, "half {name}: {s:?}");
        assert_eq!(s["sessions_ended"], 0, "half {name}: {s:?}");
        assert!(
            s["udp_out"] > 0 && s["udp_in"] > 0,
            "half {name} carried SIP: {s:?}"
        );
    }
}

#[test]
fn sip_tcp_across_the_split() {
    let Some((bed, _dir, a_dir, b_dir)) = setup("split_signal_netns", None) else {
        return;
    };
    let (a, b) = halves_up(&bed, "tcp");
    register_a_to_b(&bed, &a_dir, &b_dir, "t1");
    no_wrong_direction(&bed);
    for (v, name) in [(a, "a"), (b, "b")] {
        let s = stop_clean(v, name);
        assert_eq!(
            s["auth_failures"] + s["replays"] + s["malformed"] + s["truncated"],
            0,
            "half {name}: {s:?}"
        );
        assert!(
            s["tcp_opened"] > 0,
            "half {name} carried TCP streams: {s:?}"
        );
    }
}

/// Sends a hello and a frame sealed with the wrong key to half B's signaling listener, from
/// half A's namespace (the only address half B accepts).
fn forge(bed: &SplitBed) {
    use vgate::signaling::split::frame::{Hello, Keys, Role, Sealer, HELLO_LEN};
    let (ns, to) = (
        bed.get("HA_NS").to_owned(),
        format!("{}:7400", bed.get("SB_IP")),
    );
    common::in_netns(&ns, move || {
        let to: SocketAddrV4 = to.parse().unwrap();
        let mut s = TcpStream::connect_timeout(&to.into(), Duration::from_secs(5)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let ours = Hello {
            role: Role::Dialer,
            instance: [7; 16],
            nonce: [8; 32],
        };
        s.write_all(&ours.encode()).unwrap();
        let mut h = [0u8; HELLO_LEN];
        s.read_exact(&mut h).unwrap();
        let theirs = Hello::parse(&h).unwrap();
        let keys = Keys::derive(&[0x42; 32], &ours, &theirs).unwrap();
        let mut out = Vec::new();
        Sealer::new(keys.send).announce(&mut out, &[5060], &[]);
        s.write_all(&out).unwrap();
        // Half B resets the connection.
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
    });
}

#[test]
fn killing_half_b_ends_the_call_in_a_and_a_restart_brings_calls_back() {
    let Some((bed, _dir, a_dir, b_dir)) = setup("split_signal_netns", Some(100)) else {
        return;
    };
    // The live-view scenario, holding the call for a minute instead of 1.5 s.
    let play = std::fs::read_to_string(sipp::scenario("gb_uac_play.xml")).unwrap();
    assert!(play.contains("<pause milliseconds=\"1500\"/>"));
    let hold = b_dir.join("gb_uac_play_hold.xml");
    std::fs::write(
        &hold,
        play.replace(
            "<pause milliseconds=\"1500\"/>",
            "<pause milliseconds=\"60000\"/>",
        ),
    )
    .unwrap();

    let (a, b) = halves_up(&bed, "udp");
    let mut dev = device(&bed, &a_dir, "1");
    let sink = Sink::start(&bed);
    std::thread::sleep(Duration::from_millis(300));
    let caller = platform_calls(&bed, &b_dir, hold.to_str().unwrap(), "1").spawn();
    // The call is up once its RTP arrives in domain B.
    let deadline = Instant::now() + Duration::from_secs(30);
    while sink.packets.load(Ordering::Relaxed) < 5 {
        assert!(
            Instant::now() < deadline,
            "the call's RTP never arrived in domain B"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Half B dies without a word.
    b.crash();
    let killed = Instant::now();
    assert_eq!(
        dev.wait_exit(Duration::from_secs(20)),
        Some(true),
        "the device in A got no BYE after half B died"
    );
    let took = killed.elapsed();
    eprintln!("BYE into domain A {took:?} after half B was killed (dead_after 3 s)");
    let _ = sink.finish();
    // The caller in B lost its gateway with the call; it would wait for its BYE's answer.
    drop(caller);

    // Half B comes back; calls work again.
    let b = half(&bed, "b", "udp");
    peers_up(&a, &b);
    let mut dev = device(&bed, &a_dir, "2");
    std::thread::sleep(Duration::from_millis(300));
    let uac = sipp::scenario("gb_uac_play.xml");
    if let Err(e) = platform_calls(&bed, &b_dir, &uac, "2").run() {
        panic!("calls after half B restarted did not complete: {e}");
    }
    assert_eq!(dev.wait_exit(Duration::from_secs(10)), Some(true));

    // A forged frame on the signaling link: dropped, counted, the real peer unaffected.
    forge(&bed);
    let uac2 = platform_calls(&bed, &b_dir, &uac, "1").spawn();
    let mut dev = device(&bed, &a_dir, "1");
    let mut uac2 = uac2;
    assert_eq!(
        uac2.wait_exit(Duration::from_secs(60)),
        Some(true),
        "a call after the forgery"
    );
    assert_eq!(dev.wait_exit(Duration::from_secs(10)), Some(true));

    no_wrong_direction(&bed);
    let sb = stop_clean(b, "b");
    let sa = stop_clean(a, "a");
    assert_eq!(
        sb["auth_failures"], 1,
        "half B counted the forged frame: {sb:?}"
    );
    assert_eq!(sb["resets"], 1, "{sb:?}");
    assert!(
        sa["peer_lost"] >= 1,
        "half A counted the loss of its peer: {sa:?}"
    );
    assert!(
        sa["sessions_ended"] >= 1,
        "half A counted the call it ended: {sa:?}"
    );
    assert_eq!(sa["peer_restarts"], 1, "half A saw half B restart: {sa:?}");
}

// ---- RTSP across the split: GStreamer's RTSP server in A, ffmpeg in B. ----

/// Half A: the link face's clients (half B's proxy) get `/cam1` = the server's `/test`,
/// with the server's digest answered by half A. Half B: clients in domain b, every path
/// to half A's proxy.
fn rtsp_routes(bed: &SplitBed, half: &str) -> String {
    if half == "a" {
        format!(
            "[[signaling_route]]\nname = \"cam\"\ntype = \"rtsp\"\ntransport = \"tcp\"\nlisten_domain = \"b\"\nlisten_port = 8554\nupstream = \"{}:8554\"\nupstream_username = \"cam\"\nupstream_password = \"s3cret\"\n[[signaling_route.paths]]\nprefix = \"/cam1\"\nupstream_path = \"/test\"\n",
            bed.get("DA_IP")
        )
    } else {
        format!(
            "[[signaling_route]]\nname = \"cam\"\ntype = \"rtsp\"\ntransport = \"tcp\"\nlisten_domain = \"b\"\nlisten_port = 8554\nupstream = \"{FACE_A}:8554\"\n"
        )
    }
}

fn rtsp_ready(test: &str) -> bool {
    common::prerequisites(
        test,
        true,
        &[
            ("ip", "iproute2"),
            ("nft", "nftables"),
            ("ffmpeg", "ffmpeg"),
            ("timeout", "coreutils"),
        ],
    ) && common::have_gst_rtsp_server(test)
}

/// A bed with GStreamer's RTSP server in A (digest cam:s3cret, `server_args` added) and
/// both halves running [`rtsp_routes`], peers up.
fn rtsp_across_the_split(
    server_args: &[&str],
) -> (SplitBed, tempfile::TempDir, Proc, Vgate, Vgate) {
    let (bed, dir, server, a, b, _) = rtsp_across_the_split_out(server_args);
    (bed, dir, server, a, b)
}

/// [`rtsp_across_the_split`] that also keeps what the server prints (`FRAMES n` lines of a
/// RECORD server).
fn rtsp_across_the_split_out(
    server_args: &[&str],
) -> (
    SplitBed,
    tempfile::TempDir,
    Proc,
    Vgate,
    Vgate,
    Arc<std::sync::Mutex<String>>,
) {
    let bed = SplitBed::up();
    let dir = tempfile::tempdir().unwrap();
    let script = format!("{}/tests/rtsp/server.py", env!("CARGO_MANIFEST_DIR"));
    let mut server = Command::new("ip")
        .args([
            "netns",
            "exec",
            bed.get("DA_NS"),
            "/usr/bin/python3",
            &script,
        ])
        .args([
            "--address",
            bed.get("DA_IP"),
            "--port",
            "8554",
            "--digest",
            "cam:s3cret",
        ])
        .args(server_args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the GStreamer RTSP server");
    let mut line = String::new();
    let mut out = std::io::BufReader::new(server.stdout.take().unwrap());
    let _ = std::io::BufRead::read_line(&mut out, &mut line);
    assert!(
        line.starts_with("READY"),
        "RTSP server did not start: {line:?}"
    );
    let printed = Arc::new(std::sync::Mutex::new(String::new()));
    let printed2 = Arc::clone(&printed);
    std::thread::spawn(move || {
        let mut l = String::new();
        while std::io::BufRead::read_line(&mut out, &mut l).is_ok_and(|n| n > 0) {
            printed2.lock().unwrap().push_str(&l);
            l.clear();
        }
    });
    let server = Proc::new(server);
    let routes = (rtsp_routes(&bed, "a"), rtsp_routes(&bed, "b"));
    let (a, b) = start_halves(&bed, "stack", ("off", "off"), (&routes.0, &routes.1));
    peers_up(&a, &b);
    (bed, dir, server, a, b, printed)
}

/// ffmpeg in domain B plays `rtsp://GB_IP:8554/cam1` over `transport` (streams `map`) until
/// `frames` video frames are decoded: it must succeed with no error and nothing of domain A,
/// the faces or the signaling link in its trace, which is returned.
fn ffmpeg_plays(bed: &SplitBed, dir: &Path, transport: &str, map: &str, frames: usize) -> String {
    let url = format!("rtsp://{}:8554/cam1", bed.get("GB_IP"));
    let trace_path = dir.join(format!("ffmpeg-{transport}.log"));
    let out = Command::new("ip")
        .args(["netns", "exec", bed.get("DB_NS"), "timeout", "60", "ffmpeg"])
        .args([
            "-nostdin",
            "-hide_banner",
            "-loglevel",
            "repeat+level+trace",
        ])
        .args(["-rtsp_transport", transport, "-i", &url])
        .args([
            "-map",
            map,
            "-frames:v",
            &frames.to_string(),
            "-f",
            "framemd5",
            "-",
        ])
        .stderr(std::fs::File::create(&trace_path).unwrap())
        .output()
        .expect("run ffmpeg");
    let got = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("0,"))
        .count();
    let trace = std::fs::read_to_string(&trace_path).unwrap_or_default();
    // No error at all. Across the split the PLAY reply crosses the signaling link and the
    // first media a media link, in either order; half B's bridge leg holds its frames until
    // the reply is written, so ffmpeg never sees a `$` frame before it (it would skip it and
    // log "Received packet without a start chunk").
    let errors: Vec<&str> = trace
        .lines()
        .filter(|l| l.contains("[error]") || l.contains("[fatal]"))
        .collect();
    assert!(
        out.status.success() && got >= frames,
        "{transport}: ffmpeg decoded {got} frames; errors: {errors:?}; trace in {}",
        trace_path.display()
    );
    assert!(errors.is_empty(), "{transport}: ffmpeg errors: {errors:?}");
    for (net, what) in [
        ("10.211.1.", "a domain A address"),
        ("127.77.", "a face address"),
        ("10.211.0.", "a signaling link address"),
    ] {
        if let Some(l) = trace.lines().find(|l| l.contains(net)) {
            panic!("{transport}: {what} reached domain B: {l}");
        }
    }
    trace
}

#[test]
fn rtsp_udp_and_interleaved_with_upstream_digest_across_the_split() {
    if !rtsp_ready("split_signal_netns rtsp") {
        return;
    }
    let (bed, dir, server, a, b) = rtsp_across_the_split(&[]);
    for transport in ["udp", "tcp"] {
        let trace = ffmpeg_plays(&bed, dir.path(), transport, "0", 50);
        assert!(
            trace.contains("Content-Base: rtsp://"),
            "{transport}: the trace has the RTSP replies"
        );
    }
    // The sessions end with TEARDOWN through both halves before the halves stop.
    std::thread::sleep(Duration::from_secs(2));
    no_wrong_direction(&bed);
    let sb = stop_clean(b, "b");
    let sa = stop_clean(a, "a");
    for (s, name) in [(&sa, "a"), (&sb, "b")] {
        assert_eq!(
            s["auth_failures"] + s["replays"] + s["malformed"] + s["truncated"] + s["refused"],
            0,
            "half {name}: {s:?}"
        );
        assert!(
            s["tcp_opened"] >= 2,
            "half {name} carried the RTSP connections: {s:?}"
        );
    }
    drop(server);
}

/// Media on static routes does not depend on the signaling link: cut it, the halves declare
/// each other lost (ending no static route), the stream still crosses every datagram; the link
/// comes back and the peers are up again without a restart.
#[test]
fn static_routes_keep_flowing_through_a_signaling_outage() {
    if !ready("split_signal_netns outage") {
        return;
    }
    use common::split::{cam_routes, receive_numbered, send_numbered};
    let bed = SplitBed::up();
    let (da, db) = (bed.get("DA_IP").to_owned(), bed.get("DB_IP").to_owned());
    let (ra, rb) = cam_routes(&bed);
    let a = start_half(&bed, "a", &half_config(&bed, "a", "off", "off", &ra));
    let b = start_half(&bed, "b", &half_config(&bed, "b", "off", "off", &rb));
    peers_up(&a, &b);
    let link = |state: &str| {
        let st = Command::new("ip")
            .args(["-n", bed.get("HA_NS"), "link", "set", "sa", state])
            .status()
            .unwrap();
        assert!(st.success(), "ip link set sa {state}");
    };
    link("down");
    a.wait_for("the peer half is silent", Duration::from_secs(30));
    b.wait_for("the peer half is silent", Duration::from_secs(30));
    let sa = |ip: &str, port: u16| SocketAddrV4::new(ip.parse().unwrap(), port);
    let count = 300;
    let (rx, rx_ready) = receive_numbered(
        bed.get("DB_NS"),
        sa(&db, 6000),
        sa(bed.get("GB_IP"), 30000),
        count,
        1200,
        Duration::from_secs(60),
        Duration::from_secs(2),
    );
    rx_ready.recv().unwrap();
    send_numbered(
        bed.get("DA_NS"),
        sa(&da, 5000),
        sa(bed.get("GA_IP"), 20000),
        count,
        1200,
        300,
    )
    .join()
    .unwrap();
    let got = rx.join().unwrap();
    assert_eq!(
        got.missing_and_dups(count),
        (0, 0),
        "the static stream crossed during the outage"
    );
    assert_eq!(got.wrong_source + got.corrupt, 0);
    link("up");
    a.wait_for("peer authenticated, up", Duration::from_secs(30));
    no_wrong_direction(&bed);
    let ta = signal_totals(&a.stop().raw);
    let tb = signal_totals(&b.stop().raw);
    for (s, name) in [(&ta, "a"), (&tb, "b")] {
        assert_eq!(
            s["peer_lost"],
            if name == "a" { 1 } else { 2 },
            "half {name}: {s:?}"
        );
        assert_eq!(
            s["sessions_ended"], 0,
            "static routes are not sessions: {s:?}"
        );
        assert_eq!(s["peer_restarts"], 0, "the same processes came back: {s:?}");
    }
}

// ---- TCP media at the edges (GB/T 28181 `TCP/RTP/AVP`, RTSP interleaved) across the split.
// Toward the link face a half always uses UDP, so media crosses on the one-way links and
// the signaling link carries signaling only.

/// The bytes a half's agent moved on the signaling link (both ways) and the bytes its
/// one-way links carried (sent on the outgoing one, delivered from the incoming one), from
/// its shutdown totals.
struct LinkBytes {
    /// The shutdown totals.
    raw: String,
    signal: u64,
    media_out_bytes: u64,
    media_out_packets: u64,
    media_in_delivered: u64,
}

fn link_bytes(raw: &str) -> LinkBytes {
    let s = signal_totals(raw);
    let out = common::split::link_totals(raw, "out");
    let inl = common::split::link_totals(raw, "in");
    LinkBytes {
        raw: raw.to_string(),
        signal: s["bytes_in"] + s["bytes_out"],
        media_out_bytes: out["bytes"],
        media_out_packets: out["packets"],
        media_in_delivered: inl["delivered"],
    }
}

/// Stops a half like [`stop_clean`] and also returns its link byte counts.
fn stop_clean_links(v: Vgate, name: &str) -> LinkBytes {
    let t = v.stop();
    t.assert_nothing_left(&format!("half {name}"));
    let s = signal_totals(&t.raw);
    assert_eq!(
        s["auth_failures"] + s["replays"] + s["malformed"] + s["truncated"] + s["refused"],
        0,
        "half {name}: {s:?}"
    );
    link_bytes(&t.raw)
}

/// What no domain may see: the other domain's addresses, the faces, the signaling link.
const HIDDEN_FROM_B: &str = r"10\.211\.1\.|127\.77\.|10\.211\.0\.";
const HIDDEN_FROM_A: &str = r"10\.211\.2\.|127\.77\.|10\.211\.0\.";

/// The media peer of one GB side, started in its namespace.
fn gb_media_peer(
    side: Side,
    ns: &str,
    addr: String,
    stop: &Arc<AtomicBool>,
    payload: usize,
) -> (common::rfc4571::Flows, std::thread::JoinHandle<()>) {
    let stop = Arc::clone(stop);
    common::in_netns(ns, move || match side {
        Side::Udp => common::rfc4571::udp_responder(&addr, stop, 10_000),
        Side::Tcp(_) => common::rfc4571::tcp_server_sized(&addr, stop, 10_000, payload),
    })
}

/// GB/T 28181 live view + talkback (sendrecv) from the platform in B to the device in A with
/// `TCP/RTP/AVP` at one end or both: each half terminates its own domain's TCP leg and the
/// link face gets `RTP/AVP`. Every call completes, every flow has no gap, no address leaks,
/// no leg/session/route/port is left on either half, nothing travels a one-way link the
/// wrong way; the media crossed on the one-way links and the signaling link carried a
/// fraction of the media's bytes.
#[test]
fn gb_tcp_media_crosses_the_split_on_the_media_links() {
    gb_tcp_across_the_split("stack", "off", &ALL_TCP_COMBOS, common::rfc4571::PAYLOAD);
}

/// RTP over TCP with 4 KiB packets (GB/T 28181 devices send PS packets of several KiB over
/// TCP) from the platform, then from the device, to a UDP peer on the other side, then TCP
/// at both ends, FEC 8+2: each packet is cut into three link frames by the half that
/// receives it and joined by the other half (link header v2), whose leg sink takes it whole
/// (a large buffer, `edge::sink::LARGE_SLOTS`); every flow arrives complete, nothing is
/// dropped as oversize, lost or timed out.
#[test]
fn gb_tcp_packets_larger_than_a_link_frame_cross_the_split() {
    gb_tcp_across_the_split("stack", "8+2", &ALL_TCP_COMBOS, 4096);
}

/// Platform side / device side of the GB TCP calls.
const ALL_TCP_COMBOS: [(Side, Side); 3] = [
    (Side::Tcp("passive"), Side::Udp),
    (Side::Udp, Side::Tcp("passive")),
    (Side::Tcp("passive"), Side::Tcp("passive")),
];

/// The same in mode tnapi (the legs' lane shares the AF_PACKET link socket), FEC 8+2.
#[test]
fn gb_tcp_media_crosses_the_split_in_mode_tnapi_with_fec() {
    gb_tcp_across_the_split("tnapi", "8+2", &ALL_TCP_COMBOS, common::rfc4571::PAYLOAD);
}

/// The same in mode zc (the legs' lane opens an AF_PACKET socket beside the AF_XDP one).
#[test]
fn gb_tcp_media_crosses_the_split_in_mode_zc() {
    gb_tcp_across_the_split("zc", "off", &ALL_TCP_COMBOS, common::rfc4571::PAYLOAD);
}

fn gb_tcp_across_the_split(mode: &str, fec: &str, combos: &[(Side, Side)], payload: usize) {
    let Some((bed, _dir, a_dir, b_dir)) = setup(&format!("split_signal_netns gb tcp {mode}"), None)
    else {
        return;
    };
    let start = |name: &str| {
        let routes = sip_routes(&bed, name, "udp");
        let cfg = common::split::half_config_mode(&bed, name, mode, fec, fec, &routes);
        start_half(&bed, name, &cfg)
    };
    let a = start("a");
    let b = start("b");
    peers_up(&a, &b);
    let (da, db) = (bed.get("DA_IP").to_owned(), bed.get("DB_IP").to_owned());
    const CALLS: usize = 3;
    let (mut at_a, mut at_b) = (0u64, 0u64);
    for (n, &(b_side, a_side)) in combos.iter().enumerate() {
        let what = format!("{mode}: platform {b_side:?} / device {a_side:?}");
        let uas = a_dir.join(format!("tcp_uas{n}.xml"));
        let uac = b_dir.join(format!("tcp_uac{n}.xml"));
        std::fs::write(&uas, uas_xml(a_side, 16000, HIDDEN_FROM_A, Some("RTP/AVP"))).unwrap();
        std::fs::write(&uac, uac_xml(b_side, 6000, 3000, false, HIDDEN_FROM_B)).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (a_flows, a_peer) = gb_media_peer(
            a_side,
            bed.get("DA_NS"),
            format!("{da}:16000"),
            &stop,
            payload,
        );
        let (b_flows, b_peer) = gb_media_peer(
            b_side,
            bed.get("DB_NS"),
            format!("{db}:6000"),
            &stop,
            payload,
        );
        let calls = CALLS.to_string();
        let mut dev = Sipp::new(bed.get("DA_NS"), &a_dir, uas.to_str().unwrap(), &da, 5060)
            .args(&["-m", &calls, "-trace_msg", "-trace_err"])
            .spawn();
        std::thread::sleep(Duration::from_millis(300));
        if let Err(e) = platform_calls(&bed, &b_dir, uac.to_str().unwrap(), &calls).run() {
            panic!(
                "{what}: not every call completed: {e}; logs in {}",
                b_dir.display()
            );
        }
        assert_eq!(
            dev.wait_exit(Duration::from_secs(15)),
            Some(true),
            "{what}: the device scenario failed (leak or a TCP offer toward A); logs in {}",
            a_dir.display()
        );
        // The calls are over: their legs close on both halves, then the peers stop.
        for h in ["a", "b"] {
            let deadline = Instant::now() + Duration::from_secs(10);
            let live = || {
                let body = common::split::admin_get(&bed, h, "/api/v1/legs");
                let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
                v["legs"].as_array().map_or(usize::MAX, Vec::len)
            };
            while live() != 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            assert_eq!(live(), 0, "{what}: legs left on half {h}");
        }
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, Ordering::Relaxed);
        a_peer.join().unwrap();
        b_peer.join().unwrap();
        let (af, bf) = (a_flows.lock().unwrap(), b_flows.lock().unwrap());
        let sum = |f: &[common::rfc4571::Flow]| f.iter().map(|f| f.received).sum::<u64>();
        eprintln!(
            "{what}: talkback at A {} flows {} packets; live view at B {} flows {} packets",
            af.len(),
            sum(&af),
            bf.len(),
            sum(&bf)
        );
        common::gb_sipp::check_flows(
            &format!("{what}: talkback at A"),
            &af,
            CALLS,
            bed.get("GA_IP"),
        );
        common::gb_sipp::check_flows(
            &format!("{what}: live view at B"),
            &bf,
            CALLS,
            bed.get("GB_IP"),
        );
        at_a += sum(&af);
        at_b += sum(&bf);
    }
    for h in ["a", "b"] {
        let body = common::split::admin_get(&bed, h, "/api/v1/legs");
        let t =
            serde_json::from_str::<serde_json::Value>(&body).unwrap_or_default()["totals"].clone();
        assert_eq!(t["framing_errors"], 0, "half {h}: {t}");
        assert_eq!(t["refused"], 0, "half {h}: {t}");
        assert_eq!(t["oversize"], 0, "half {h}: {t}");
    }
    topology_hidden(&a_dir, &b_dir);
    no_wrong_direction(&bed);
    let lb = stop_clean_links(b, "b");
    let la = stop_clean_links(a, "a");
    // Packets longer than a link frame's media were cut by one half and joined by the other.
    for (name, out, inl) in [("forward", &la.raw, &lb.raw), ("reverse", &lb.raw, &la.raw)] {
        let (o, i) = (
            common::split::link_totals(out, "out"),
            common::split::link_totals(inl, "in"),
        );
        let frames = payload.div_ceil(vgate::wire::link::MAX_MEDIA) as u64;
        eprintln!(
            "{mode}: {name} link: {} datagrams cut, {} fragments and {} joined at the receiver",
            o["fragmented"], i["fragments"], i["joined"]
        );
        if frames > 1 {
            assert!(o["fragmented"] >= 50, "{name}: {o:?}");
            assert_eq!(i["joined"], o["fragmented"], "{name}: {i:?}");
            assert_eq!(i["fragments"], o["fragmented"] * frames, "{name}: {i:?}");
        } else {
            assert_eq!(o["fragmented"], 0, "{name}: {o:?}");
        }
        let drops = [
            "drop_fragment_lost",
            "drop_fragment_timeout",
            "drop_bad_fragment",
            "drop_bad_version",
        ];
        common::split::assert_zero(&i, &drops, name);
    }
    eprintln!(
        "{mode}: signaling link {} bytes; media links: A sent {} bytes, B sent {} bytes; delivered A {} B {} packets; received at A {at_a} at B {at_b}",
        la.signal, la.media_out_bytes, lb.media_out_bytes, la.media_in_delivered, lb.media_in_delivered
    );
    // What the device in A received came down the reverse link, what the platform in B
    // received down the forward link.
    assert!(
        la.media_in_delivered >= at_a && lb.media_in_delivered >= at_b,
        "the media crossed on the one-way links"
    );
    no_media_on_the_signaling_link(
        la.signal,
        la.media_out_bytes + lb.media_out_bytes,
        "media links",
    );
}

/// An interleaved ffmpeg client in B against a GStreamer RTSP server in A that takes UDP
/// only: half B SETUPs the link face over UDP and bridges to the client's `$` frames, half A
/// relays UDP to UDP. At least 100 frames with no decode error; the media crossed on the
/// forward link and the signaling link carried a fraction of its bytes.
#[test]
fn rtsp_interleaved_client_crosses_the_split_on_the_media_links() {
    if !rtsp_ready("split_signal_netns rtsp interleaved") {
        return;
    }
    let (bed, dir, server, a, b) = rtsp_across_the_split(&["--udp-only"]);
    let trace = ffmpeg_plays(&bed, dir.path(), "tcp", "0:v", 120);
    assert!(
        trace.contains("RTP/AVP/TCP;unicast;interleaved="),
        "ffmpeg got interleaved media"
    );
    // The sum of the metric lines holding every `&`-separated part of `name`.
    let events = |h: &str, name: &str| -> u64 {
        common::split::admin_get(&bed, h, "/metrics")
            .lines()
            .filter(|l| l.starts_with("vgate_") && name.split('&').all(|n| l.contains(n)))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    let bridged = (
        events("a", "vgate_rtsp_bridge_legs_total"),
        events("b", "vgate_rtsp_bridge_legs_total"),
    );
    let interleaved_a = events("a", "vgate_rtsp_interleaved_frames_total");
    // What ffmpeg sent on its `$` channels (RTCP receiver reports) half B injected toward
    // the link face: it must go down the reverse link, not from a face socket.
    let injected_b = events("b", "vgate_rtsp_bridge_frames_total{&tcp_to_udp");
    eprintln!(
        "bridge legs (half A, half B): {bridged:?}; interleaved frames on half A: {interleaved_a}"
    );
    assert!(
        bridged.0 == 0 && bridged.1 >= 1,
        "half B bridges the client's interleaved track to UDP toward the link face, half A relays UDP: {bridged:?}"
    );
    assert_eq!(interleaved_a, 0, "no $ frame crossed half A");
    std::thread::sleep(Duration::from_secs(2));
    no_wrong_direction(&bed);
    let lb = stop_clean_links(b, "b");
    let la = stop_clean_links(a, "a");
    eprintln!(
        "signaling link {} bytes; forward link: A sent {} bytes, B delivered {} packets",
        la.signal, la.media_out_bytes, lb.media_in_delivered
    );
    eprintln!(
        "half B injected {injected_b} packets from ffmpeg; the reverse link delivered {} to half A",
        la.media_in_delivered
    );
    assert!(
        la.media_in_delivered >= injected_b,
        "what half B injected toward the face crossed on the reverse link"
    );
    assert!(
        lb.media_in_delivered >= 100,
        "the video crossed on the forward link: {} packets",
        lb.media_in_delivered
    );
    no_media_on_the_signaling_link(la.signal, la.media_out_bytes, "forward link");
    drop(server);
}

/// An interleaved ffmpeg in B pushes (ANNOUNCE/RECORD) 4 s of JPEG video to a UDP-only
/// RECORD server in A: half B bridges the client's `$` frames to UDP toward the link face,
/// and those packets — sent from the leg's thread, not an engine worker — go down the
/// reverse link on the legs' lane, every one delivered by half A. ffmpeg's RTP packets over
/// TCP are up to 1472 bytes, more than the 1414 bytes of media a link frame carries: those
/// are cut into two frames by half B and joined by half A (link header v2), so nothing is
/// dropped as `oversize` and the server decodes the video (before v2: 132 of 173 packets
/// oversize, no frame decoded). Nothing rides the signaling link.
#[test]
fn rtsp_interleaved_record_crosses_the_split_on_the_reverse_link() {
    if !rtsp_ready("split_signal_netns rtsp record") {
        return;
    }
    let (bed, _dir, server, a, b, printed) = rtsp_across_the_split_out(&["--udp-only", "--record"]);
    let url = format!("rtsp://{}:8554/cam1", bed.get("GB_IP"));
    run_ok(
        Command::new("ip")
            .args(["netns", "exec", bed.get("DB_NS"), "timeout", "30", "ffmpeg"])
            .args(["-nostdin", "-hide_banner", "-loglevel", "error", "-re"])
            .args([
                "-f",
                "lavfi",
                "-i",
                "testsrc=size=320x240:rate=10",
                "-t",
                "4",
            ])
            .args([
                "-c:v", "mjpeg", "-huffman", "default", "-pix_fmt", "yuvj420p",
            ])
            .args(["-f", "rtsp", "-rtsp_transport", "tcp", &url]),
        "ffmpeg push",
    );
    let metric = |h: &str, family: &str, label: &str| {
        common::split::admin_get(&bed, h, "/metrics")
            .lines()
            .filter(|l| l.starts_with(family) && l.contains(label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum::<u64>()
    };
    let injected = metric("b", "vgate_rtsp_bridge_frames_total{", "tcp_to_udp");
    std::thread::sleep(Duration::from_secs(2));
    no_wrong_direction(&bed);
    let oversize = |h: &str| {
        metric(h, "vgate_channel_drops_total{", "reason=\"oversize\"")
            + metric(h, "vgate_edge_leg_events_total{", "event=\"oversize\"")
            + metric(h, "vgate_edge_leg_events_total{", "event=\"inject_drops\"")
    };
    assert_eq!(
        (oversize("b"), oversize("a")),
        (0, 0),
        "no pushed packet dropped as oversize or refused by the injector"
    );
    let frames = || {
        printed
            .lock()
            .unwrap()
            .lines()
            .filter_map(|l| l.strip_prefix("FRAMES "))
            .filter_map(|n| n.trim().parse::<u64>().ok())
            .next_back()
            .unwrap_or(0)
    };
    let lb = stop_clean_links(b, "b");
    let la = stop_clean_links(a, "a");
    let (b_out, a_in) = (
        common::split::link_totals(&lb.raw, "out"),
        common::split::link_totals(&la.raw, "in"),
    );
    eprintln!(
        "record: server decoded {} frames; half B cut {} datagrams, half A joined {} from {} fragments",
        frames(),
        b_out["fragmented"],
        a_in["joined"],
        a_in["fragments"]
    );
    assert!(
        b_out["fragmented"] > 0,
        "ffmpeg's largest packets were cut: {b_out:?}"
    );
    assert_eq!(
        a_in["joined"], b_out["fragmented"],
        "half A joined every datagram half B cut: {a_in:?}"
    );
    for k in [
        "drop_fragment_lost",
        "drop_fragment_timeout",
        "drop_bad_fragment",
    ] {
        assert_eq!(a_in[k], 0, "{k}: {a_in:?}");
    }
    // 4 s at 10 frames/s; the server counts what it decoded (the first frames may come
    // before its pipeline is up).
    assert!(
        frames() >= 30,
        "the RECORD server decoded {} frames:\n{}",
        frames(),
        printed.lock().unwrap()
    );
    eprintln!(
        "record: half B injected {injected} of ffmpeg's packets toward the face; reverse link: B sent {} packets ({} bytes), A delivered {}; signaling link {} bytes",
        lb.media_out_packets, lb.media_out_bytes, la.media_in_delivered, la.signal
    );
    assert!(
        injected >= 30 && lb.media_out_packets >= injected,
        "half B sent the pushed packets that fit a link frame down the reverse link: {injected} injected, {} sent",
        lb.media_out_packets
    );
    assert_eq!(
        la.media_in_delivered, lb.media_out_packets,
        "half A delivered every packet of the reverse link"
    );
    no_media_on_the_signaling_link(la.signal, lb.media_out_bytes, "reverse link");
    drop(server);
}
