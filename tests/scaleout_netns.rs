//! Scale-out: two active vgate gateways side by side behind Kamailio's dispatcher
//! (docs/scale-out.md). A GB/T 28181 platform in domain B (sipp UAC) sends every live-view
//! INVITE to one address, Kamailio's; Kamailio picks a gateway by a hash of the Call-ID
//! (dispatcher algorithm 0) and stays out of the dialog (no Record-Route): the gateway's
//! Contact pins the ACK and BYE to the gateway that carried the INVITE. Each gateway is a
//! real `vgate run` with addresses and media port ranges of its own; the device in domain A
//! (sipp UAS) answers and plays RTP to the gateway that invited it.
//!
//! ```text
//!   ns A (bridge; device 10.201.1.10) ──ea── g1 (A .11, B .11) ──eb── ns B (bridge;
//!                                     ──ea── g2 (A .12, B .12) ──eb──  platform 10.201.2.10)
//!                                                    ns K (Kamailio 10.201.2.5) ──ek── ns B
//! ```
//!
//! Checked: every call completes; each call's 200, ACK and BYE name one gateway only, and the
//! device saw each INVITE from that same gateway (per-gateway counts from both sides' sipp
//! logs equal each gateway's `calls_started`); both gateways carried calls and they sum to
//! the calls; media arrived at the platform from the gateway B port each call's answer named,
//! inside that gateway's own range; Kamailio's OPTIONS probes reached both gateways; then
//! with one gateway stopped, Kamailio's probing marks it down and the next calls all go
//! through the other. No session, route or port is left on either gateway.
//!
//! Needs root, iproute2, sipp and kamailio.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::proc::Proc;
use common::sipp::{self, Sipp, GB_CID};
use common::udp::count_sink;
use common::vgate::Vgate;
use common::{admin, wait_until};

const NEEDS: &[(&str, &str)] = &[
    ("ip", "iproute2"),
    ("sipp", "sip-tester"),
    ("kamailio", "kamailio"),
    ("timeout", "coreutils"),
];

const DEVICE: &str = "10.201.1.10";
const PLATFORM: &str = "10.201.2.10";
const KAMAILIO: &str = "10.201.2.5";
/// Where the platform's offer asks for the media (gb_uac_play.xml).
const MEDIA_AT: &str = "10.201.2.10:6000";
const ADMIN: &str = "127.0.0.1:9940";

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One gateway: its namespace, its two addresses, its media ranges (A, B).
struct Gw {
    ns: String,
    a_ip: String,
    b_ip: String,
    a_ports: (u16, u16),
    b_ports: (u16, u16),
}

impl Gw {
    fn config(&self) -> String {
        format!(
            r#"
[domains.a]
interface = "ea"
address = "{a_ip}"
networks = ["10.201.1.0/24"]
media_ports = "{a0}-{a1}"
[domains.b]
interface = "eb"
address = "{b_ip}"
networks = ["10.201.2.0/24"]
media_ports = "{b0}-{b1}"
[engine]
mode = "stack"
queues = 1
[security]
source_validation = "strict"
[control]
listen = "{ADMIN}"

# Live view: requests on B:5060 only from the dispatcher (a platform sending the dialog's
# ACK and BYE to the gateway's Contact directly is accepted too: they carry its token).
[[signaling_route]]
name = "b2a"
type = "sip"
transport = "udp"
listen_domain = "b"
listen_port = 5060
upstream = "{DEVICE}:5060"
upstream_port = 5061
allow_peers = ["{KAMAILIO}/32"]
allow_ids = ["3402000000"]
"#,
            a_ip = self.a_ip,
            b_ip = self.b_ip,
            a0 = self.a_ports.0,
            a1 = self.a_ports.1,
            b0 = self.b_ports.0,
            b1 = self.b_ports.1,
        )
    }

    fn event(&self, event: &str) -> u64 {
        let series = vgate::control::metrics::event_series("b2a", "sip", event);
        let text = admin::get_in(&self.ns, ADMIN, "/metrics");
        admin::sample(&text, &series).unwrap_or(0.0) as u64
    }
}

/// The namespaces of one run (unique names), deleted on drop, also when the test fails;
/// whatever still runs in them is killed first.
struct Net {
    tag: String,
    names: Vec<String>,
    dir: tempfile::TempDir,
    /// The folder of the logs (kept when the test fails).
    logs: PathBuf,
}

impl Net {
    fn ns(&self, which: &str) -> String {
        format!("{}{which}", self.tag)
    }

    fn up() -> Net {
        static RUN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let tag = format!(
            "so{}x{}",
            std::process::id() % 100_000,
            RUN.fetch_add(1, Relaxed)
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let mut net = Net {
            tag,
            names: Vec::new(),
            logs: dir.path().to_owned(),
            dir,
        };
        for which in ["a", "b", "k", "g1", "g2"] {
            let ns = net.ns(which);
            ip(&["netns", "add", &ns]);
            net.names.push(ns.clone());
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
        }
        // The two domains' segments: a bridge in A and in B, the peer's address on it.
        for (seg, addr) in [("a", DEVICE), ("b", PLATFORM)] {
            let ns = net.ns(seg);
            ip(&["-n", &ns, "link", "add", "sw0", "type", "bridge"]);
            ip(&["-n", &ns, "link", "set", "sw0", "up"]);
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                "sw0",
            ]);
        }
        let plug = |node: &str, seg: &str, ifc: &str, addr: &str| {
            let (n, s) = (net.ns(node), net.ns(seg));
            let peer = format!("{node}{seg}");
            ip(&[
                "link", "add", ifc, "netns", &n, "type", "veth", "peer", "name", &peer, "netns", &s,
            ]);
            ip(&["-n", &s, "link", "set", &peer, "master", "sw0"]);
            ip(&["-n", &s, "link", "set", &peer, "up"]);
            ip(&["-n", &n, "addr", "add", &format!("{addr}/24"), "dev", ifc]);
            ip(&["-n", &n, "link", "set", ifc, "up"]);
        };
        plug("k", "b", "ek", KAMAILIO);
        for (node, last) in [("g1", 11), ("g2", 12)] {
            plug(node, "a", "ea", &format!("10.201.1.{last}"));
            plug(node, "b", "eb", &format!("10.201.2.{last}"));
        }
        net
    }

    fn path(&self, name: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::create_dir_all(&p).unwrap();
        p
    }

    fn gateway(&self, i: u16) -> Gw {
        // Each gateway its own ranges (docs/scale-out.md): a port names its gateway.
        let off = (i - 1) * 100;
        Gw {
            ns: self.ns(&format!("g{i}")),
            a_ip: format!("10.201.1.{}", 10 + i),
            b_ip: format!("10.201.2.{}", 10 + i),
            a_ports: (20000 + off, 20099 + off),
            b_ports: (30000 + off, 30099 + off),
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in &self.names {
            // Only processes this test started live in these namespaces.
            let out = Command::new("ip")
                .args(["netns", "pids", ns])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            for pid in out.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        if std::thread::panicking() {
            let kept = std::env::temp_dir().join(format!("{}-logs", self.tag));
            let _ = Command::new("cp")
                .arg("-r")
                .arg(&self.logs)
                .arg(&kept)
                .status();
            eprintln!("scaleout: logs kept in {}", kept.display());
        }
    }
}

/// Kamailio's config: listen on K's address, the dispatcher's set 1 = the gateways' B faces,
/// hash over the Call-ID, OPTIONS probes every second (the gateway answers a probe for its
/// own address itself: its 2xx means alive; no answer, which Kamailio turns into a local 408,
/// means down), a failed branch retried on the next gateway, no
/// Record-Route.
fn kamailio_config(list: &Path, gws: &[&Gw]) -> String {
    let gateways = gws
        .iter()
        .map(|g| format!("$rd == \"{}\"", g.b_ip))
        .collect::<Vec<_>>()
        .join(" || ");
    format!(
        r#"#!KAMAILIO
debug=2
log_stderror=yes
log_prefix=""
children=2
auto_aliases=no
listen=udp:{KAMAILIO}:5060
mpath="/usr/lib/x86_64-linux-gnu/kamailio/modules/"
loadmodule "tm.so"
loadmodule "sl.so"
loadmodule "pv.so"
loadmodule "maxfwd.so"
loadmodule "textops.so"
loadmodule "siputils.so"
loadmodule "xlog.so"
loadmodule "dispatcher.so"
modparam("tm", "fr_timer", 2000)
modparam("tm", "fr_inv_timer", 10000)
modparam("dispatcher", "list_file", "{list}")
modparam("dispatcher", "ds_ping_interval", 1)
modparam("dispatcher", "ds_probing_mode", 1)
modparam("dispatcher", "ds_probing_threshold", 1)
modparam("dispatcher", "ds_inactive_threshold", 1)
modparam("dispatcher", "ds_ping_reply_codes", "class=2")
modparam("dispatcher", "ds_ping_from", "sip:34020000002000000099@3402000000")

request_route {{
    if (!mf_process_maxfwd_header("10")) {{ sl_send_reply("483", "Too Many Hops"); exit; }}
    # Not record-routed: a platform that sends in-dialog requests to the Contact reaches the
    # gateway directly; one that sends everything to its proxy (sipp does) gets them relayed
    # to the Request-URI, the gateway's Contact with its token: the same gateway. Only the
    # gateways' addresses are relayed to.
    if (has_totag()) {{
        if (is_method("ACK") && t_check_trans()) {{ t_relay(); exit; }}
        if (!({gateways})) {{ sl_send_reply("403", "Not a gateway"); exit; }}
        t_relay();
        exit;
    }}
    if (is_method("CANCEL")) {{
        if (t_check_trans()) {{ t_relay(); }}
        exit;
    }}
    if (!ds_select_dst("1", "0")) {{ sl_send_reply("503", "No gateway"); exit; }}
    xlog("L_NOTICE", "scaleout: $rm $ci to $du\n");
    t_on_failure("NEXT_GATEWAY");
    if (!t_relay()) {{ sl_reply_error(); }}
    exit;
}}

failure_route[NEXT_GATEWAY] {{
    if (t_is_canceled()) {{ exit; }}
    if (t_branch_timeout() || t_check_status("503")) {{
        ds_mark_dst("ip");
        if (ds_next_dst()) {{
            xlog("L_NOTICE", "scaleout: retry $ci to $du\n");
            t_on_failure("NEXT_GATEWAY");
            t_relay();
        }}
    }}
}}

event_route[dispatcher:dst-down] {{ xlog("L_NOTICE", "scaleout: down $ru\n"); }}
event_route[dispatcher:dst-up] {{ xlog("L_NOTICE", "scaleout: up $ru\n"); }}
"#,
        list = list.display(),
    )
}

/// Starts Kamailio in namespace `ns` with the config of [`kamailio_config`] in `dir`; its
/// log goes to `dir/kamailio.log`.
fn start_kamailio(ns: &str, dir: &Path, gws: &[&Gw]) -> Proc {
    let list = dir.join("dispatcher.list");
    let lines: String = gws
        .iter()
        .enumerate()
        .map(|(i, g)| format!("1 sip:{}:5060 0 0 name=gw{}\n", g.b_ip, i + 1))
        .collect();
    std::fs::write(&list, lines).unwrap();
    let rundir = dir.join("run");
    std::fs::create_dir_all(&rundir).unwrap();
    let cfg = dir.join("kamailio.cfg");
    std::fs::write(&cfg, kamailio_config(&list, gws)).unwrap();
    let check = Command::new("kamailio")
        .args(["-c", "-f"])
        .arg(&cfg)
        .output()
        .expect("kamailio -c");
    assert!(
        check.status.success(),
        "kamailio -c refused the config: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    let log = std::fs::File::create(dir.join("kamailio.log")).unwrap();
    Proc::spawn(
        Command::new("ip")
            .args([
                "netns", "exec", ns, "kamailio", "-DD", "-E", "-m", "32", "-M", "4",
            ])
            .arg("-f")
            .arg(&cfg)
            .arg("-Y")
            .arg(&rundir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log),
    )
}

/// One message of a sipp `-trace_msg` log: whether it was received, and its text.
fn messages(log: &str) -> Vec<(bool, String)> {
    log.split("-----------------------------------------------")
        .filter_map(|block| {
            let (head, body) = block.split_once('\n')?.1.split_once('\n')?;
            let received = head.contains("received");
            let sent = head.contains("sent");
            (received || sent).then(|| (received, body.trim_start().replace("\r\n", "\n")))
        })
        .collect()
}

/// The value of header `name` (or its compact form) in a SIP message.
fn header<'a>(msg: &'a str, name: &str, compact: &str) -> Option<&'a str> {
    msg.lines()
        .take_while(|l| !l.trim().is_empty())
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            let k = k.trim();
            (k.eq_ignore_ascii_case(name) || k.eq_ignore_ascii_case(compact)).then(|| v.trim())
        })
}

/// The host of the first SIP URI in `text` (`sip:user@host:port` or `sip:host:port`).
fn uri_host(text: &str) -> String {
    let rest = &text[text.find("sip:").map(|i| i + 4).unwrap_or(0)..];
    let rest = rest.split_once('@').map_or(rest, |(_, h)| h);
    rest.split([':', ';', '>', ' '])
        .next()
        .unwrap_or("")
        .to_owned()
}

/// The SDP's `c=` address and first `m=` port.
fn sdp_media(msg: &str) -> Option<(String, u16)> {
    let c = msg
        .lines()
        .find_map(|l| l.trim().strip_prefix("c=IN IP4 "))?
        .trim();
    let m = msg.lines().find_map(|l| l.trim().strip_prefix("m="))?;
    let port = m.split_whitespace().nth(1)?.parse().ok()?;
    Some((c.to_owned(), port))
}

/// What the platform's log says about each call (by its Call-ID): the gateways its 200s
/// named (Contact), its media address (the answer's SDP), and where its ACK and BYE went.
#[derive(Default, Debug)]
struct Call {
    contacts: BTreeSet<String>,
    media: BTreeSet<(String, u16)>,
    in_dialog: BTreeSet<String>,
}

fn platform_calls(log: &str) -> BTreeMap<String, Call> {
    let mut calls: BTreeMap<String, Call> = BTreeMap::new();
    for (received, msg) in messages(log) {
        let Some(cid) = header(&msg, "Call-ID", "i") else {
            continue;
        };
        let call = calls.entry(cid.to_owned()).or_default();
        let first = msg.lines().next().unwrap_or("");
        let cseq = header(&msg, "CSeq", "").unwrap_or("");
        if received && first.starts_with("SIP/2.0 200") && cseq.ends_with("INVITE") {
            if let Some(c) = header(&msg, "Contact", "m") {
                call.contacts.insert(uri_host(c));
            }
            if let Some(m) = sdp_media(&msg) {
                call.media.insert(m);
            }
        } else if !received && (first.starts_with("ACK ") || first.starts_with("BYE ")) {
            call.in_dialog.insert(uri_host(first));
        }
    }
    calls
}

/// The INVITEs the device received, by the gateway they came from (top Via), with the
/// media address each offered (the gateway's A side).
fn device_invites(log: &str) -> BTreeMap<String, Vec<(String, u16)>> {
    let mut by_gw: BTreeMap<String, Vec<(String, u16)>> = BTreeMap::new();
    let mut seen = HashSet::new();
    for (received, msg) in messages(log) {
        if !received || !msg.starts_with("INVITE ") {
            continue;
        }
        let cid = header(&msg, "Call-ID", "i").unwrap_or("").to_owned();
        if !seen.insert(cid) {
            continue; // a retransmission
        }
        let via = header(&msg, "Via", "v").unwrap_or("");
        let host = via
            .split_whitespace()
            .nth(1)
            .unwrap_or("")
            .split([':', ';'])
            .next()
            .unwrap_or("")
            .to_owned();
        let media = sdp_media(&msg).unwrap_or_default();
        by_gw.entry(host).or_default().push(media);
    }
    by_gw
}

/// One round of `calls` live views: the device answers in A, the platform calls through
/// Kamailio, RTP counted where the platform asked for it. (platform's log, device's log,
/// RTP packets, their sources).
fn round(net: &Net, name: &str, calls: u32) -> (String, String, u64, HashSet<SocketAddr>) {
    let (a_dir, b_dir) = (
        net.path(&format!("{name}-a")),
        net.path(&format!("{name}-b")),
    );
    sipp::make_rtp_pcap(&a_dir.join("rtp.pcap"), 100);
    let stop = Arc::new(AtomicBool::new(false));
    let sink = count_sink(&net.ns("b"), MEDIA_AT, Arc::clone(&stop));
    let mut device = Sipp::new(
        &net.ns("a"),
        &a_dir,
        &sipp::scenario("gb_uas_device.xml"),
        DEVICE,
        5060,
    )
    .args(&["-mp", "16000", "-aa", "-trace_msg"])
    .spawn();
    std::thread::sleep(Duration::from_millis(500));
    let target = format!("{KAMAILIO}:5060");
    let run = Sipp::new(
        &net.ns("b"),
        &b_dir,
        &sipp::scenario("gb_uac_play.xml"),
        PLATFORM,
        5060,
    )
    .args(&["-mp", "16000", "-cid_str", GB_CID, &target, "-trace_msg"])
    .calls(calls, 5, 10)
    .timeout(90)
    .run();
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Relaxed);
    let (rtp, sources) = sink.join().unwrap();
    let _ = device.stop();
    if run.is_err() {
        for g in ["g1", "g2"] {
            let m = admin::get_in(&net.ns(g), ADMIN, "/metrics");
            for l in m
                .lines()
                .filter(|l| l.contains("b2a") && !l.ends_with(" 0"))
            {
                eprintln!("scaleout: {g} {l}");
            }
        }
    }
    assert!(run.is_ok(), "{name}: not every call completed: {run:?}");
    (
        sipp::read_logs(&b_dir, "_messages.log"),
        sipp::read_logs(&a_dir, "_messages.log"),
        rtp,
        sources,
    )
}

/// Per gateway (by its B address), how many of the round's calls it carried, checking
/// that each call went through exactly one gateway end to end.
fn check_round(
    what: &str,
    calls: u32,
    gws: &[&Gw],
    (b_log, a_log, rtp, sources): &(String, String, u64, HashSet<SocketAddr>),
) -> BTreeMap<String, u64> {
    let by_cid = platform_calls(b_log);
    assert_eq!(
        by_cid.len(),
        calls as usize,
        "{what}: one Call-ID per call in the platform's log"
    );
    let mut per_gw: BTreeMap<String, u64> = BTreeMap::new();
    let mut answered: BTreeSet<SocketAddr> = BTreeSet::new();
    for (cid, call) in &by_cid {
        assert_eq!(
            call.contacts.len(),
            1,
            "{what}: call {cid}: its 200s named one gateway: {call:?}"
        );
        let gw_ip = call.contacts.first().unwrap();
        let gw = gws
            .iter()
            .find(|g| &g.b_ip == gw_ip)
            .unwrap_or_else(|| panic!("{what}: call {cid} answered by no gateway: {call:?}"));
        assert_eq!(
            call.in_dialog.iter().collect::<Vec<_>>(),
            vec![gw_ip],
            "{what}: call {cid}: ACK and BYE to the gateway that answered"
        );
        assert_eq!(call.media.len(), 1, "{what}: call {cid}: one media address");
        let (m_ip, m_port) = call.media.first().unwrap().clone();
        assert_eq!(&m_ip, gw_ip, "{what}: call {cid}: media on its gateway");
        assert!(
            (gw.b_ports.0..=gw.b_ports.1).contains(&m_port),
            "{what}: call {cid}: B port {m_port} in {gw_ip}'s range {:?}",
            gw.b_ports
        );
        answered.insert(format!("{m_ip}:{m_port}").parse().unwrap());
        *per_gw.entry(gw_ip.clone()).or_default() += 1;
    }
    // The device saw each INVITE from the same gateway, its media offer in that gateway's
    // A range.
    let invites = device_invites(a_log);
    for gw in gws {
        let at_a = invites.get(&gw.a_ip).map_or(&[][..], Vec::as_slice);
        assert_eq!(
            at_a.len() as u64,
            per_gw.get(&gw.b_ip).copied().unwrap_or(0),
            "{what}: INVITEs the device got from {} = calls {} answered",
            gw.a_ip,
            gw.b_ip
        );
        for (ip, port) in at_a {
            assert_eq!(ip, &gw.a_ip, "{what}: the offer names its gateway");
            assert!(
                (gw.a_ports.0..=gw.a_ports.1).contains(port),
                "{what}: A port {port} in {}'s range {:?}",
                gw.a_ip,
                gw.a_ports
            );
        }
    }
    assert_eq!(
        invites.values().map(Vec::len).sum::<usize>(),
        calls as usize,
        "{what}: the device got every call once: {:?}",
        invites.keys()
    );
    // Media: at least one packet per call, each from the gateway port a call's answer named.
    assert!(*rtp >= calls as u64, "{what}: {rtp} RTP packets arrived");
    for s in sources {
        assert!(
            answered.contains(s),
            "{what}: RTP from {s}, a port no answer named ({answered:?})"
        );
    }
    for gw in gws {
        if per_gw.contains_key(&gw.b_ip) {
            assert!(
                sources.iter().any(|s| s.ip().to_string() == gw.b_ip),
                "{what}: media through {} arrived",
                gw.b_ip
            );
        }
    }
    per_gw
}

/// Waits until each gateway's `calls_started` and `calls_ended` (published on the proxy's
/// timer) reach what the logs say it carried.
fn check_counters(what: &str, gws: &[&Gw], expected: &[u64]) {
    for (gw, want) in gws.iter().zip(expected) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (s, e) = (gw.event("calls_started"), gw.event("calls_ended"));
            if (s, e) == (*want, *want) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: {} started {s} and ended {e} calls, the logs say {want}",
                gw.b_ip
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn kamailio_log(net: &Net) -> String {
    std::fs::read_to_string(net.path("kamailio").join("kamailio.log")).unwrap_or_default()
}

#[test]
fn two_gateways_behind_kamailio_carry_each_call_through_exactly_one() {
    require!(true, NEEDS);
    let net = Net::up();
    let (g1, g2) = (net.gateway(1), net.gateway(2));
    let v1 = Vgate::start_in(&g1.ns, &g1.config(), &[]);
    let v2 = Vgate::start_in(&g2.ns, &g2.config(), &[]);
    let _kamailio = start_kamailio(&net.ns("k"), &net.path("kamailio"), &[&g1, &g2]);

    // Kamailio is up once its probes reach both gateways (each answers them itself).
    wait_until(
        "Kamailio's OPTIONS probes at both gateways",
        Duration::from_secs(20),
        || g1.event("options_answered") > 0 && g2.event("options_answered") > 0,
    );
    // Answered, not refused: a probe is no refusal (the refusal alert stays quiet).
    assert_eq!(
        g1.event("forbidden") + g2.event("forbidden"),
        0,
        "probes refused"
    );
    let probes_before = g1.event("forwarded_requests") + g2.event("forwarded_requests");

    // 40 calls, spread by Call-ID.
    let calls = 40;
    let r1 = round(&net, "round1", calls);
    let per_gw = check_round("40 calls over two gateways", calls, &[&g1, &g2], &r1);
    let (n1, n2) = (
        per_gw.get(&g1.b_ip).copied().unwrap_or(0),
        per_gw.get(&g2.b_ip).copied().unwrap_or(0),
    );
    eprintln!("scaleout: gw1 carried {n1} calls, gw2 {n2}");
    assert_eq!(n1 + n2, calls as u64);
    assert!(
        n1 > 0 && n2 > 0,
        "both gateways carried calls: {n1} and {n2}"
    );
    check_counters("round 1", &[&g1, &g2], &[n1, n2]);
    // The probes never crossed to domain A: the gateways answered them.
    assert_eq!(
        g1.event("forwarded_requests") + g2.event("forwarded_requests") - probes_before,
        // INVITE, ACK, BYE per call.
        3 * calls as u64,
        "only the calls' requests crossed"
    );
    assert!(
        !kamailio_log(&net).contains("scaleout: down"),
        "no gateway marked down:\n{}",
        kamailio_log(&net)
    );

    // Gateway 2 stops: Kamailio's probe finds no answer, marks it down; every further call
    // goes through gateway 1.
    let t2 = v2.stop();
    t2.assert_nothing_left("gateway 2");
    let down = format!("scaleout: down sip:{}:5060", g2.b_ip);
    wait_until(
        "Kamailio marks gateway 2 down",
        Duration::from_secs(30),
        || kamailio_log(&net).contains(&down),
    );
    let more = 10;
    let r2 = round(&net, "round2", more);
    let per_gw2 = check_round("gateway 2 down", more, &[&g1, &g2], &r2);
    assert_eq!(
        per_gw2.get(&g1.b_ip).copied(),
        Some(more as u64),
        "every call through gateway 1: {per_gw2:?}"
    );
    check_counters("round 2", &[&g1], &[n1 + more as u64]);

    let t1 = v1.stop();
    t1.assert_nothing_left("gateway 1");
    for (t, who) in [(&t1, "gateway 1"), (&t2, "gateway 2")] {
        let line = t
            .raw
            .lines()
            .find(|l| l.starts_with("total channel=forward"))
            .unwrap_or_default();
        assert!(
            !line.contains("tx_packets=0 "),
            "{who}'s forward channel carried nothing: {line}"
        );
    }
}
