//! Mode `xdp` on the three-namespace bed (`scripts/testbed.sh`, 4-queue veth pairs): the
//! in-kernel fast path of `vgate run --mode xdp` relays stream routes from senders in A to
//! receivers in B, with the AF_XDP path of mode `zc` behind it for what the program does not
//! forward.
//!
//! Checked: every packet delivered exactly once, from the gateway's address and the route's
//! egress port (both channels: A → B, and the reverse B → A), and most of them by the kernel
//! (the gateway's egress veth counts frames redirected into it: `tx_queue_N_xdp_xmit`);
//! per-route counters in the admin API equal what was sent; route add/remove while traffic
//! flows takes effect at once; frames the fast path must not forward (wrong source, IP
//! options, fragments, truncated or inconsistent lengths, bad header checksum, oversize,
//! unknown port) are forwarded correctly by the slow path or dropped with their reason
//! counter, never forwarded wrongly; redirects the kernel drops after the program are counted
//! `redirect_failed`, not sent; nothing stays attached after exit or `kill -9` (the XDP
//! programs nor the redirect-failure watch's tracepoint programs).
//!
//! The bed for native XDP redirect between veths: the gateway's B-side veth takes redirected
//! frames only when its peer (in B) has NAPI — GRO on (`ethtool -K vb gro on`, done here) or
//! an XDP program of its own; without either the kernel drops them (counted by vgate as
//! `redirect_failed`, by veth nowhere, and take that egress off the fast path: see
//! `xdp_counts_redirects_the_egress_refuses`). The
//! senders turn TX checksum offload off, so their UDP checksums are complete when the XDP
//! program updates them (see `engine::xdp`). Both are set on A's and B's veths.
//!
//! Needs root, `ip` (iproute2), `ethtool` and `python3` (raw frames for the bad-input test);
//! without them each test says it did not run (and fails under `CI=true`).

mod common;

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::proc::run_ok;
use common::relay::*;
use common::vgate::Vgate;
use common::{admin, enter_netns, in_netns, Bed};
use vgate::config::{DomainId, SourcePolicy};
use vgate::routes::{Channel, RouteSpec, SessionKind};
use vgate::stats::DropReason;

const NEEDS: &[(&str, &str)] = &[("ip", "iproute2"), ("ethtool", "ethtool")];
const STREAMS: u32 = 32;
const PER_STREAM: u32 = 150;

/// `ethtool ARGS` inside namespace `ns`; panics on failure.
fn ethtool(ns: &str, args: &[&str]) -> String {
    run_ok(
        Command::new("ip")
            .args(["netns", "exec", ns, "ethtool"])
            .args(args),
        &format!("ethtool {args:?} in {ns}"),
    )
}

/// The bed as mode xdp needs it (see the module doc), and its gateway namespace.
fn xdp_bed() -> (Bed, String) {
    let bed = Bed::up(4);
    // Both directions: the reverse channel's senders are in B, its sinks in A.
    for (ns, dev) in [("A_NS", "A_IF"), ("B_NS", "B_IF")] {
        ethtool(bed.get(ns), &["-K", bed.get(dev), "tx", "off"]);
        ethtool(bed.get(ns), &["-K", bed.get(dev), "gro", "on"]);
    }
    let g_ns = bed.get("G_NS").to_owned();
    (bed, g_ns)
}

/// GRO `on` or `off` on the B-side peer: without it (nor an XDP program) the peer has no
/// NAPI, and the gateway's B-side veth takes no redirected frames.
fn b_gro(bed: &Bed, on: &str) {
    ethtool(bed.get("B_NS"), &["-K", bed.get("B_IF"), "gro", on]);
}

/// Frames the kernel redirected into the gateway's B-side veth (the fast path's output),
/// and the redirects it refused.
fn fast_xmit(bed: &Bed) -> (u64, u64) {
    xmit_of(bed.get("G_NS"), bed.get("GB_IF"))
}

fn xmit_of(g_ns: &str, gb_if: &str) -> (u64, u64) {
    let text = ethtool(g_ns, &["-S", gb_if]);
    let mut out = (0, 0);
    for l in text.lines() {
        let Some((k, v)) = l.trim().split_once(": ") else {
            continue;
        };
        let v: u64 = v.trim().parse().unwrap_or(0);
        if k.starts_with("tx_queue_") && k.ends_with("_xdp_xmit") {
            out.0 += v;
        } else if k.starts_with("tx_queue_") && k.ends_with("_xdp_xmit_errors") {
            out.1 += v;
        }
    }
    out
}

/// `GET path` on the admin interface at 127.0.0.1:`port` inside namespace `ns`.
fn admin_get(ns: &str, port: u16, path: &str) -> serde_json::Value {
    let url = format!("http://127.0.0.1:{port}{path}");
    in_netns(ns, move || {
        let mut resp = ureq::get(&url).call().expect("admin interface answers");
        let body = resp.body_mut().read_to_string().unwrap();
        serde_json::from_str(&body).unwrap_or_else(|_| panic!("not JSON: {body}"))
    })
}

#[test]
fn xdp_relays_every_packet_once_in_the_kernel() {
    require!(true, NEEDS);
    let (bed, g_ns) = xdp_bed();
    let control = 9951;
    let vg = Vgate::start_with(
        &["ip", "netns", "exec", &g_ns],
        &config(&bed, "xdp", STREAMS, control),
        &["--mode", "xdp"],
    );
    assert_eq!(xdp_links(&g_ns).len(), 2, "a program on each interface");
    let (xmit_before, _) = fast_xmit(&bed);
    let (sent, got) = relay_across(&bed, STREAMS, PER_STREAM);
    let (xmit, xmit_err) = fast_xmit(&bed);
    let fast = xmit - xmit_before;
    // Counters are polled every 100 ms; the receiver waited 500 ms of silence.
    let routes = admin_get(&g_ns, control, "/api/v1/routes");
    let totals = vg.stop();
    let raw = &totals.raw;
    eprintln!("xdp: sent {sent}, by the kernel {fast} (refused {xmit_err})\n{raw}");

    assert_eq!(sent, STREAMS * PER_STREAM);
    check_delivery(&got, PER_STREAM);
    assert_eq!(xmit_err, 0, "no redirect refused");
    // The first packets of each route go through a worker until the latch is polled (at
    // most 100 ms at 250 packets/s per stream: ~25 of 150).
    assert!(
        fast * 2 > u64::from(sent),
        "the kernel forwarded most packets: {fast} of {sent}"
    );
    totals.assert_forwarded_all(sent);
    let list = routes["routes"].as_array().expect("routes");
    assert_eq!(list.len(), STREAMS as usize);
    for r in list {
        let c = &r["counters"];
        for k in ["rx_packets", "tx_packets"] {
            assert_eq!(c[k], u64::from(PER_STREAM), "{k} of {r}");
        }
        for k in ["rx_bytes", "tx_bytes"] {
            assert_eq!(c[k], u64::from(PER_STREAM) * PAYLOAD as u64, "{k} of {r}");
        }
        assert!(r["latched_source"].is_string(), "latched: {r}");
    }
    assert_no_xdp_left(&g_ns);
}

/// `kill -9` leaves nothing attached: the program hangs on BPF links that die with the
/// process.
#[test]
fn xdp_leaves_nothing_after_kill_9() {
    require!(true, NEEDS);
    let (bed, g_ns) = xdp_bed();
    let vg = Vgate::start_with(
        &["ip", "netns", "exec", &g_ns],
        &config(&bed, "xdp", 4, 9952),
        &["--mode", "xdp"],
    );
    assert_eq!(xdp_links(&g_ns).len(), 2);
    let stats = admin_get(&g_ns, 9952, "/api/v1/stats");
    // The neighbour resolver's counters are shown with the engine's.
    let neigh = &stats["neigh"];
    assert_eq!(
        neigh["capacity"].as_u64(),
        Some(vgate::engine::neigh::TABLE_SLOTS as u64 / 4 * 3),
        "{stats}"
    );
    assert_eq!(neigh["queue_full"].as_u64(), Some(0), "{stats}");
    assert_eq!(neigh["table_full"].as_u64(), Some(0), "{stats}");
    let metrics = admin::get_in(&g_ns, "127.0.0.1:9952", "/metrics");
    for series in [
        "vgate_neigh_refused_total{reason=\"queue_full\"} 0\n",
        "vgate_neigh_refused_total{reason=\"table_full\"} 0\n",
        "vgate_neigh_entries{kind=\"capacity\"} 12288\n",
    ] {
        assert!(metrics.contains(series), "{series} in {metrics}");
    }
    // The redirect-failure watch's tracepoint programs, as the engine describes them.
    let engine = stats["engine"].as_str().unwrap_or_default().to_owned();
    let tp_progs = tracepoint_programs(&engine);
    assert_eq!(tp_progs.len(), 2, "two tracepoint programs: {engine}");
    for id in &tp_progs {
        assert!(vgate::engine::afxdp::bpf_program_loaded(*id), "{id} loaded");
    }
    vg.crash();
    // The links go when the last fd does, as the process is torn down; bounded wait.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !xdp_links(&g_ns).is_empty()
        || tp_progs
            .iter()
            .any(|id| vgate::engine::afxdp::bpf_program_loaded(*id))
    {
        assert!(
            Instant::now() < deadline,
            "left: {:?}, tracepoint programs {tp_progs:?} loaded: {:?}",
            xdp_links(&g_ns),
            tp_progs
                .iter()
                .map(|id| vgate::engine::afxdp::bpf_program_loaded(*id))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The program ids in the engine description's "…=progN" words (the redirect-failure watch).
fn tracepoint_programs(engine: &str) -> Vec<u32> {
    engine
        .split([' ', ';', ','])
        .filter_map(|w| w.split_once("=prog"))
        .filter_map(|(_, id)| id.parse().ok())
        .collect()
}

/// An egress that stops taking redirects while vgate runs is no black hole (issue 25): once
/// the route is on the fast path, the B-side peer's GRO goes off, so the gateway's veth has no
/// NAPI to hand redirected frames to and the kernel drops them (`xdp_devmap_xmit` reports
/// them; veth counts them nowhere). The first failures are counted `redirect_failed`, never
/// sent; then the egress goes off the fast path (the description says why) and the route's
/// packets are delivered through AF_XDP: every packet received is either sent and delivered,
/// or counted `redirect_failed`. With GRO on again its xdp-features say it takes redirects,
/// and the route is back on the fast path, forwarded by the kernel with no failure. (Before:
/// every packet after GRO went off was `redirect_failed`, none delivered.)
#[test]
fn xdp_counts_redirects_the_egress_refuses() {
    require!(true, NEEDS);
    const COUNT: u32 = 500;

    let (bed, g_ns) = xdp_bed();
    let (a_ip, ga_ip, _, _) = addrs(&bed);
    let cfg = parsed_config(&bed, "xdp", 9956);
    let (gw, sinks) = forward_and_sink(
        &bed,
        cfg,
        "refused",
        "redirect failures counted on tracepoints",
    );
    let send = |n: u32, from: u32| {
        send_seqs(
            bed.get("A_NS"),
            a_ip,
            SocketAddrV4::new(ga_ip, A_PORTS),
            from..from + n,
        )
    };
    let forward = || *gw.totals().channel(Channel::Forward);
    let failed_of = |f: &vgate::stats::Snapshot| f.drop_count(DropReason::RedirectFailed);
    // Waits until the channel's counters account for every packet sent so far (worker 0
    // polls the fast path's maps every 100 ms) and the sink has what was counted sent;
    // bounded.
    let settled = |sent: u64| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let f = forward();
            if (f.tx_packets + failed_of(&f) >= sent && sinks.count(0) >= f.tx_packets)
                || Instant::now() > deadline
            {
                return f;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let wait_for = |what: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !gw.describe().contains(what) {
            assert!(
                Instant::now() < deadline,
                "never described {what:?}: {}",
                gw.describe()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    // Every packet received is sent or counted redirect_failed; what is sent is delivered.
    let exact = |f: &vgate::stats::Snapshot, total: u64| {
        assert_eq!(f.rx_packets, total, "every packet received: {f:?}");
        assert_eq!(
            f.rx_packets,
            f.tx_packets + failed_of(f),
            "rx = tx + redirect_failed: {f:?}"
        );
        assert_eq!(f.dropped(), failed_of(f), "no other drop: {f:?}");
        assert_eq!(sinks.count(0), f.tx_packets, "sent = delivered: {f:?}");
    };

    // A warm-up packet resolves the next hop (the slow path sends it), so the route is on
    // the fast path before the measured packets.
    send(1, 0);
    wait_for("1 route(s) active");
    let f0 = settled(1);
    assert_eq!(failed_of(&f0), 0, "{f0:?}");

    // 1. The egress driver refuses while running: no NAPI on the B-side peer.
    b_gro(&bed, "off");
    send(COUNT, 1);
    let total = 1 + u64::from(COUNT);
    let f1 = settled(total);
    let failed1 = failed_of(&f1);
    let described = gw.describe();
    eprintln!(
        "driver refused: counted {failed1}, delivered {}; {f1:?}\n{described}",
        sinks.count(0)
    );
    assert!(failed1 > 0, "the first refusals counted: {f1:?}");
    assert!(
        failed1 < u64::from(COUNT),
        "then the route's packets take the AF_XDP path: {failed1} of {COUNT} refused"
    );
    let off = format!("egress {} refused {failed1} of ", bed.get("GB_IF"));
    assert!(
        described.contains(&off) && described.contains("while running"),
        "the egress is off the fast path, said why: {described}"
    );
    assert!(described.contains("0 route(s) active"), "{described}");
    exact(&f1, total);

    // 2. The way back: GRO on again; once its xdp-features were seen without ndo_xdp_xmit,
    // their change puts the egress back on the fast path.
    wait_for("xdp-features now lack ndo_xdp_xmit");
    b_gro(&bed, "on");
    wait_for("1 route(s) active");
    let (xmit_before, _) = fast_xmit(&bed);
    send(COUNT, 1 + COUNT);
    let total = 1 + 2 * u64::from(COUNT);
    let f2 = settled(total);
    let (xmit, _) = fast_xmit(&bed);
    eprintln!("back: by the kernel {}; {f2:?}", xmit - xmit_before);
    assert_eq!(failed_of(&f2), failed1, "no refusal once back: {f2:?}");
    assert!(
        (xmit - xmit_before) * 2 > u64::from(COUNT),
        "the kernel forwards again: {} of {COUNT}",
        xmit - xmit_before
    );
    assert!(
        !gw.describe().contains("XDP redirects while running"),
        "no longer off: {}",
        gw.describe()
    );
    exact(&f2, total);
    sinks.finish();
    stop_in(&g_ns, gw);
}

/// `vgate check-config` on the host, mode xdp, lists each egress interface and whether it
/// takes XDP redirects now, and what vgate does with its routes (issue 25): B's peer with
/// GRO on, then off.
#[test]
fn xdp_check_config_says_which_egress_takes_redirects() {
    require!(true, NEEDS);
    let (bed, g_ns) = xdp_bed();
    let mut file = tempfile::NamedTempFile::new().unwrap();
    use std::io::Write;
    file.write_all(config(&bed, "xdp", 1, 9958).as_bytes())
        .unwrap();
    let check = || {
        let out = Command::new("ip")
            .args(["netns", "exec", &g_ns])
            .arg(common::vgate_bin())
            .arg("check-config")
            .arg(file.path())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    let (ga, gb) = (bed.get("GA_IF"), bed.get("GB_IF"));
    let takes =
        |i: &str, d: &str| format!("xdp egress {i} (routes into domain {d}): takes XDP redirects");
    let out = check();
    for (i, d) in [(ga, "a"), (gb, "b")] {
        assert!(out.contains(&takes(i, d)), "{out}");
    }
    b_gro(&bed, "off");
    let out = check();
    assert!(out.contains(&takes(ga, "a")), "{out}");
    assert!(
        out.contains(&format!(
            "xdp egress {gb} (routes into domain b): takes NO XDP redirects"
        )) && out.contains("vgate sends them by the AF_XDP path"),
        "{out}"
    );
}

/// An egress that cannot take XDP redirects when vgate starts is no black hole (issue 25):
/// on the plain bed (the B-side peer has neither GRO nor an XDP program, so the gateway's
/// veth reports no `ndo_xdp_xmit` in its xdp-features) vgate says so in its description,
/// keeps that egress's routes on the AF_XDP path, and every packet is delivered, none
/// counted `redirect_failed`. (Before: the route went on the fast path and all 150 were
/// `redirect_failed`.)
#[test]
fn xdp_egress_that_takes_no_redirects_is_no_black_hole() {
    require!(
        "xdp_egress_that_takes_no_redirects_is_no_black_hole",
        true,
        NEEDS
    );
    const COUNT: u32 = 150;

    let (bed, g_ns) = xdp_bed();
    b_gro(&bed, "off");
    let (a_ip, ga_ip, _, _) = addrs(&bed);
    let cfg = vgate::config::parse(&config(&bed, "xdp", 0, 9957), "test").unwrap();
    let described = format!("egress {} takes no XDP redirects", bed.get("GB_IF"));
    let (gw, sinks) = forward_and_sink(&bed, cfg, "no-redirects", &described);
    send_seqs(
        bed.get("A_NS"),
        a_ip,
        SocketAddrV4::new(ga_ip, A_PORTS),
        0..COUNT,
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while sinks.count(0) < u64::from(COUNT) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    let f = *gw.totals().channel(Channel::Forward);
    let delivered = sinks.count(0);
    sinks.finish();
    assert_eq!(
        f.drop_count(DropReason::RedirectFailed),
        0,
        "nothing redirected into the egress that takes none: {f:?}"
    );
    assert_eq!(delivered, u64::from(COUNT), "every packet delivered: {f:?}");
    assert!(
        gw.describe().contains("0 route(s) active"),
        "the route stays off the fast path"
    );
    stop_in(&g_ns, gw);
}

/// Route changes while a sender runs, in process: a route (policy any: on the fast path at
/// once) forwards its first packet within 1 s of `add_route` (measured: about 1 ms), by the
/// kernel; removed, it forwards nothing more; re-added and a second route on new ports
/// forward again; the route counters equal what the sinks received.
#[test]
fn xdp_route_changes_take_effect_while_traffic_flows() {
    require!(true, NEEDS);
    let (bed, g_ns) = xdp_bed();
    let peers = Peers::of(&bed);
    let cfg = parsed_config(&bed, "xdp", 9953);
    let (g, gb_if) = (g_ns.clone(), bed.get("GB_IF").to_owned());
    let xmit = move || xmit_of(&g, &gb_if).0;
    let xmit_at_start = xmit();
    let xmit_outside = xmit.clone();
    let (gw_fast, sinks_total) = in_netns(&g_ns, move || {
        let gw = vgate::gateway::Gateway::start(cfg, None).expect("xdp starts");
        let mut rc = RouteChanges::start(&gw, peers, Some(Duration::from_secs(1)));
        let sinks = &rc.sinks;
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(sinks.count(0), 0, "nothing forwarded before a route exists");
        let r0 = rc.add_first();
        let x0 = xmit();
        rc.wait_growth(0, 50);
        assert!(xmit() - x0 >= 50, "the kernel forwarded them");

        let old = gw.routes.remove_route(Channel::Forward, A_PORTS).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let after_remove = sinks.count(0);
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(
            sinks.count(0),
            after_remove,
            "a removed route forwards nothing"
        );
        // Its counters were read once more at removal: all it forwarded.
        assert_eq!(
            old.stats.snapshot().packets.tx_packets,
            after_remove,
            "route counters = delivered"
        );
        drop(r0);

        rc.add_first();
        rc.wait_growth(0, 50);
        let r1 = rc.add_second();
        rc.wait_growth(1, 50);
        rc.wait_growth(0, 20);
        rc.stop_senders();
        std::thread::sleep(Duration::from_millis(300));
        let delivered1 = rc.sinks.count(1);
        // Polled every 100 ms.
        let deadline = Instant::now() + Duration::from_secs(5);
        while r1.stats.snapshot().packets.tx_packets < delivered1 {
            assert!(
                Instant::now() < deadline,
                "route 1 counters lag: {:?}",
                r1.stats.snapshot()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(r1.stats.snapshot().packets.tx_packets, delivered1);
        rc.finish();
        let fast = gw.describe();
        let total = gw.totals();
        let total = total.channel(Channel::Forward).tx_packets;
        drop(gw);
        (fast, total)
    });
    assert!(gw_fast.contains("mode xdp, engine xdp"), "{gw_fast}");
    let by_kernel = xmit_outside() - xmit_at_start;
    assert!(
        by_kernel + 20 >= sinks_total,
        "nearly all by the kernel: {by_kernel} of {sinks_total}"
    );
    assert_no_xdp_left(&g_ns);
}

/// One's-complement sum of `data` (16-bit big-endian words) added to `acc`.
fn csum_add(mut acc: u32, data: &[u8]) -> u32 {
    for c in data.chunks(2) {
        let w = u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]);
        acc += u32::from(w);
    }
    acc
}

fn csum_fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

/// How a test frame differs from a good one.
#[derive(Clone, Copy, Default)]
struct Frame {
    src: Option<std::net::Ipv4Addr>,
    sport: u16,
    dport: u16,
    /// IPv4 option bytes (multiple of 4).
    options: usize,
    /// IPv4 flags/fragment-offset field.
    frag: u16,
    /// Added to the IPv4 total length (a frame shorter than its header says).
    ip_len_extra: u16,
    /// Added to the UDP length.
    udp_len_extra: u16,
    /// Payload bytes beyond the test packet (oversize).
    pad: usize,
    /// Cut the frame after this many bytes.
    cut: Option<usize>,
    /// Spoil the IPv4 header checksum.
    bad_ip_csum: bool,
    /// The test stream whose packet it carries (the sink it is for).
    stream: u32,
}

/// An Ethernet frame from A to the gateway carrying stream `f.stream`'s packet `seq`, shaped by `f`;
/// checksums correct for what it claims.
fn frame(bed: &Bed, seq: u32, f: Frame) -> Vec<u8> {
    let mac = |k: &str| -> Vec<u8> {
        bed.get(k)
            .split(':')
            .map(|h| u8::from_str_radix(h, 16).unwrap())
            .collect()
    };
    let mut payload = packet(f.stream, seq).to_vec();
    payload.resize(PAYLOAD + f.pad, 0);
    let ihl = 20 + f.options;
    let udp_len = (8 + payload.len()) as u16;
    let total = ihl as u16 + udp_len;
    let src = f.src.unwrap_or(bed.ip("A_IP"));
    let dst = bed.ip("GA_IP");
    let mut ip = vec![0x40 | (ihl / 4) as u8, 0];
    ip.extend_from_slice(&(total + f.ip_len_extra).to_be_bytes());
    ip.extend_from_slice(&[0x12, 0x34]);
    ip.extend_from_slice(&f.frag.to_be_bytes());
    ip.extend_from_slice(&[64, 17, 0, 0]);
    ip.extend_from_slice(&src.octets());
    ip.extend_from_slice(&dst.octets());
    ip.resize(ihl, 1); // NOP options
    let c = csum_fold(csum_add(0, &ip)) ^ u16::from(f.bad_ip_csum);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let mut udp = Vec::new();
    udp.extend_from_slice(&f.sport.to_be_bytes());
    udp.extend_from_slice(&f.dport.to_be_bytes());
    udp.extend_from_slice(&(udp_len + f.udp_len_extra).to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(&payload);
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&src.octets());
    pseudo.extend_from_slice(&dst.octets());
    pseudo.extend_from_slice(&[0, 17]);
    pseudo.extend_from_slice(&udp_len.to_be_bytes());
    let c = csum_fold(csum_add(csum_add(0, &pseudo), &udp));
    udp[6..8].copy_from_slice(&(if c == 0 { 0xffff } else { c }).to_be_bytes());
    let mut out = mac("GA_MAC");
    out.extend_from_slice(&mac("A_MAC"));
    out.extend_from_slice(&[0x08, 0x00]);
    out.extend_from_slice(&ip);
    out.extend_from_slice(&udp);
    if let Some(n) = f.cut {
        out.truncate(n);
    }
    out
}

/// A route of policy `any` (on the fast path at once), for any payload.
fn any_route(
    ingress: DomainId,
    port: u16,
    dest: SocketAddrV4,
    egress_port: u16,
    label: &str,
) -> RouteSpec {
    RouteSpec {
        ingress,
        port,
        dest,
        egress_port,
        policy: SourcePolicy::Any,
        expected: None,
        rtp_only: false,
        label: label.into(),
        media: None,
    }
}

/// A gateway with the route `label` (policy any) from A's `A_PORTS` to a sink in B (one
/// stream, `SINK_PORTS`, from the gateway's `B_PORTS`); its description says `described`.
fn forward_and_sink(
    bed: &Bed,
    cfg: vgate::config::Config,
    label: &str,
    described: &str,
) -> (vgate::gateway::Gateway, Sinks) {
    let (_, b_ns, g_ns) = bed.namespaces();
    let (_, _, gb_ip, b_ip) = addrs(bed);
    let dest = SocketAddrV4::new(b_ip, SINK_PORTS);
    let gw = gateway_with_route(
        &g_ns,
        cfg,
        any_route(DomainId::A, A_PORTS, dest, B_PORTS, label),
    );
    let engine = gw.describe();
    assert!(engine.contains(described), "{engine}");
    (gw, Sinks::start(b_ns, b_ip, gb_ip, 1))
}

/// Stops `gw` in its namespace `g_ns`: no XDP program left there.
fn stop_in(g_ns: &str, gw: vgate::gateway::Gateway) {
    in_netns(g_ns, move || drop(gw));
    assert_no_xdp_left(g_ns);
}

/// Sends the packets `seqs` of stream 0 from `from` (port chosen by the kernel) in namespace
/// `ns` to `to`, one per millisecond.
fn send_seqs(ns: &str, from: Ipv4Addr, to: SocketAddrV4, seqs: std::ops::Range<u32>) {
    in_netns(ns, move || {
        let s = UdpSocket::bind((from, 0)).unwrap();
        for seq in seqs {
            s.send_to(&packet(0, seq), to).unwrap();
            std::thread::sleep(Duration::from_millis(1));
        }
    });
}

/// A gateway started in namespace `g_ns` with one admin session holding `spec`'s ports and
/// route.
fn gateway_with_route(
    g_ns: &str,
    cfg: vgate::config::Config,
    spec: RouteSpec,
) -> vgate::gateway::Gateway {
    in_netns(g_ns, move || {
        let gw = vgate::gateway::Gateway::start(cfg, None).expect("xdp starts");
        let s = gw.routes.open_session(SessionKind::Admin, &spec.label);
        gw.routes.reserve_port(s, spec.ingress, spec.port).unwrap();
        gw.routes
            .reserve_port(s, spec.ingress.other(), spec.egress_port)
            .unwrap();
        gw.routes.add_route(s, spec).unwrap();
        gw
    })
}

/// Sends raw Ethernet frames out of A's veth (python3's AF_PACKET socket).
fn send_frames(bed: &Bed, frames: &[Vec<u8>]) {
    let hex: Vec<String> = frames
        .iter()
        .map(|f| f.iter().map(|b| format!("{b:02x}")).collect())
        .collect();
    let script = "import socket,sys\n\
        s=socket.socket(socket.AF_PACKET,socket.SOCK_RAW)\n\
        s.bind((sys.argv[1],0))\n\
        for l in sys.stdin.read().split():\n    s.send(bytes.fromhex(l))\n";
    let mut child = Command::new("ip")
        .args(["netns", "exec", bed.get("A_NS"), "python3", "-c", script])
        .arg(bed.get("A_IF"))
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(hex.join("\n").as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success(), "python3 sent the frames");
}

/// Frames the fast path must not forward go to the slow path (which forwards them correctly
/// or drops them with their reason counter) or to the kernel; none is forwarded wrongly.
#[test]
fn xdp_passes_what_it_cannot_forward_to_the_slow_path() {
    require!(
        true,
        &[
            ("ip", "iproute2"),
            ("ethtool", "ethtool"),
            ("python3", "python3"),
        ]
    );

    let (bed, g_ns) = xdp_bed();
    let (gb_ip, b_ip, a_ip) = (bed.ip("GB_IP"), bed.ip("B_IP"), bed.ip("A_IP"));
    let mut cfg = parsed_config(&bed, "xdp", 9954);
    cfg.engine.max_payload = 1000;
    let good = Frame {
        sport: 5000,
        dport: A_PORTS,
        ..Frame::default()
    };
    let cases: Vec<(&str, Frame, bool)> = vec![
        // (what, frame, delivered)
        ("good", good, true),
        (
            "wrong source port",
            Frame {
                sport: 5001,
                ..good
            },
            false,
        ),
        (
            "wrong source address",
            Frame {
                src: Some(std::net::Ipv4Addr::new(10, 201, 1, 77)),
                ..good
            },
            false,
        ),
        ("IPv4 options", Frame { options: 4, ..good }, true),
        (
            "first fragment",
            Frame {
                frag: 0x2000,
                ..good
            },
            false,
        ),
        (
            "later fragment",
            Frame {
                frag: 0x0010,
                ..good
            },
            false,
        ),
        (
            "IPv4 length beyond the frame",
            Frame {
                ip_len_extra: 64,
                ..good
            },
            false,
        ),
        (
            "UDP length beyond IPv4's",
            Frame {
                udp_len_extra: 16,
                ..good
            },
            false,
        ),
        ("oversize payload", Frame { pad: 1100, ..good }, false),
        (
            "bad IPv4 header checksum",
            Frame {
                bad_ip_csum: true,
                ..good
            },
            false,
        ),
        (
            "unknown port",
            Frame {
                dport: A_PORTS + 500,
                ..good
            },
            false,
        ),
        (
            "truncated UDP header",
            Frame {
                cut: Some(14 + 20 + 4),
                ..good
            },
            false,
        ),
        ("good again", good, true),
    ];
    // A second route, policy `any` (no source checks): its frames skip the source checks,
    // not the header checksum's.
    let any = Frame {
        dport: A_PORTS + 2,
        stream: 1,
        ..good
    };
    let any_cases: Vec<(&str, Frame, bool)> = vec![
        ("any: good", any, true),
        (
            "any: bad IPv4 header checksum",
            Frame {
                bad_ip_csum: true,
                ..any
            },
            false,
        ),
        ("any: good again", any, true),
    ];
    let mut frames: Vec<Vec<u8>> = cases
        .iter()
        .enumerate()
        .map(|(i, (_, f, _))| frame(&bed, i as u32, *f))
        .collect();
    frames.extend(
        any_cases
            .iter()
            .enumerate()
            .map(|(i, (_, f, _))| frame(&bed, i as u32, *f)),
    );
    let delivered = |cases: &[(&str, Frame, bool)]| -> Vec<u32> {
        cases
            .iter()
            .enumerate()
            .filter(|(_, c)| c.2)
            .map(|(i, _)| i as u32)
            .collect()
    };
    let (want, want_any) = (delivered(&cases), delivered(&any_cases));
    let b_ns = bed.get("B_NS").to_owned();
    let gw = gateway_with_route(
        &g_ns,
        cfg,
        RouteSpec {
            ingress: DomainId::A,
            port: A_PORTS,
            dest: SocketAddrV4::new(b_ip, SINK_PORTS),
            egress_port: B_PORTS,
            policy: SourcePolicy::Strict,
            expected: Some(SocketAddrV4::new(a_ip, 5000)),
            rtp_only: false,
            label: "strict".into(),
            media: None,
        },
    );
    let gw = in_netns(&g_ns, move || {
        let s = gw.routes.open_session(SessionKind::Admin, "any");
        gw.routes.reserve_port(s, DomainId::A, A_PORTS + 2).unwrap();
        gw.routes.reserve_port(s, DomainId::B, B_PORTS + 2).unwrap();
        gw.routes
            .add_route(
                s,
                any_route(
                    DomainId::A,
                    A_PORTS + 2,
                    SocketAddrV4::new(b_ip, SINK_PORTS + 1),
                    B_PORTS + 2,
                    "any",
                ),
            )
            .unwrap();
        gw
    });
    let sinks = Sinks::start(b_ns, b_ip, gb_ip, 2);
    let (x0, _) = fast_xmit(&bed);
    send_frames(&bed, &frames);
    // Delivered ones are likely in already (python3 takes longer than the relay).
    let deadline = Instant::now() + Duration::from_secs(10);
    while sinks.count(0) < want.len() as u64 || sinks.count(1) < want_any.len() as u64 {
        assert!(
            Instant::now() < deadline,
            "delivered: {:?} {:?}",
            sinks.seqs(0),
            sinks.seqs(1)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Anything wrongly forwarded would arrive within this quiet time too.
    std::thread::sleep(Duration::from_millis(500));
    let (x1, _) = fast_xmit(&bed);
    let mut got = sinks.seqs(0);
    got.sort_unstable();
    let mut got_any = sinks.seqs(1);
    got_any.sort_unstable();
    sinks.finish();
    assert_eq!(got, want, "exactly the valid frames, once each");
    assert_eq!(
        got_any, want_any,
        "route `any`: the valid frames, once each"
    );
    assert_eq!(
        x1 - x0,
        4,
        "only the two good frames of each route took the fast path"
    );
    // Let worker 0 poll the fast path's counters, then read the channel.
    std::thread::sleep(Duration::from_millis(300));
    let fwd = in_netns(&g_ns, move || {
        let t = gw.totals();
        let fwd = *t.channel(Channel::Forward);
        drop(gw);
        fwd
    });
    eprintln!("{fwd:?}");
    assert_eq!(
        fwd.tx_packets,
        (want.len() + want_any.len()) as u64,
        "{fwd:?}"
    );
    assert_eq!(fwd.drop_count(DropReason::SourceMismatch), 2, "{fwd:?}");
    assert_eq!(fwd.drop_count(DropReason::Oversize), 1, "{fwd:?}");
    assert_eq!(
        fwd.drop_count(DropReason::Truncated) + fwd.drop_count(DropReason::Malformed),
        4,
        "IPv4 length beyond the frame, UDP length beyond IPv4's, bad header checksum (on \
         both routes): {fwd:?}"
    );
    assert_no_xdp_left(&g_ns);
}

/// The reverse channel (B → A) takes the fast path too: every packet delivered once from the
/// gateway's A address and the route's egress port, redirected into the A-side veth.
#[test]
fn xdp_forwards_the_reverse_channel_in_the_kernel() {
    require!(true, NEEDS);
    const COUNT: u32 = 200;
    let (bed, g_ns) = xdp_bed();
    let (a_ns, b_ns, _) = bed.namespaces();
    let (a_ip, ga_ip, gb_ip, b_ip) = addrs(&bed);
    let (in_port, out_port) = (B_PORTS + 500, A_PORTS + 500);
    let cfg = parsed_config(&bed, "xdp", 9955);
    let gw = gateway_with_route(
        &g_ns,
        cfg,
        any_route(
            DomainId::B,
            in_port,
            SocketAddrV4::new(a_ip, SINK_PORTS),
            out_port,
            "talkback",
        ),
    );
    let x0 = xmit_of(&g_ns, bed.get("GA_IF")).0;
    let (ready_tx, ready_rx) = mpsc::channel();
    let rx = std::thread::spawn(move || {
        enter_netns(&a_ns).unwrap();
        let s = UdpSocket::bind((a_ip, SINK_PORTS)).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let _ = ready_tx.send(());
        let mut seqs = Vec::new();
        let mut buf = [0u8; 2048];
        while let Ok((n, from)) = s.recv_from(&mut buf) {
            assert_eq!(from, SocketAddrV4::new(ga_ip, out_port).into(), "source");
            seqs.push(parse_packet(&buf[..n]).expect("the packet").1);
        }
        seqs
    });
    ready_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    send_seqs(&b_ns, b_ip, SocketAddrV4::new(gb_ip, in_port), 0..COUNT);
    let mut seqs = rx.join().unwrap();
    seqs.sort_unstable();
    assert_eq!(seqs, (0..COUNT).collect::<Vec<_>>(), "each packet once");
    let by_kernel = xmit_of(&g_ns, bed.get("GA_IF")).0 - x0;
    assert_eq!(by_kernel, u64::from(COUNT), "all by the kernel");
    stop_in(&g_ns, gw);
}
