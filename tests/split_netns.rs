//! The split appliance on its real topology (`scripts/split-bed.sh`): two `vgate` halves in
//! their own namespaces joined by two one-way links and a signaling link.
//!
//! - static streams cross the forward link (camera → viewer) and the reverse link
//!   (talkback): every datagram delivered once, intact, from the right source; nothing ever
//!   travels a one-way link the wrong way (nftables counter 0);
//! - bad input on the incoming link (garbage, truncated header, other version, unknown port)
//!   is dropped and counted, never forwarded;
//! - FEC repairs injected loss that a link without FEC loses.
//!
//! Needs root, iproute2 and nftables; prints DID NOT RUN without them (fails under CI=true).

mod common;

use std::net::{SocketAddrV4, UdpSocket};
use std::time::Duration;

use common::split::{
    cam_routes, half_config, half_config_mode, link_totals, receive_numbered, route, send_numbered,
    start_half, SplitBed, FACE_A, FACE_B, FWD_PORT,
};
use common::vgate::Totals;

const LEN: usize = 1200;

/// What a receiving link half may drop, and must not have here.
const IN_LINK_DROPS: &[&str] = &[
    "drop_garbage",
    "drop_truncated",
    "drop_bad_version",
    "drop_bad_fec",
    "drop_unknown_port",
    "drop_foreign_source",
];

fn ready(test: &str) -> bool {
    common::prerequisites(test, true, &[("ip", "iproute2"), ("nft", "nftables")])
}

/// Half A: camera (domain a, port 20000) → half B's gateway port 21000; talkback from half
/// B (link face port 33000) → the sink in domain a.
fn routes_a(bed: &SplitBed) -> String {
    cam_routes(bed).0
        + &route(
            "talk",
            "b",
            33000,
            &format!("{}:5002", bed.get("DA_IP")),
            20002,
            &format!("{FACE_B}:22000"),
        )
}

/// Half B: half A's camera (link face port 21000) → the viewer; the viewer's talkback
/// (domain b, port 32000) → half A's gateway port 33000.
fn routes_b(bed: &SplitBed) -> String {
    cam_routes(bed).1
        + &route(
            "talk",
            "b",
            32000,
            &format!("{FACE_A}:33000"),
            22000,
            &format!("{}:6002", bed.get("DB_IP")),
        )
}

/// How a mode sends its outgoing link (`tx=` in the totals, `out_link.tx` in the stats).
fn link_tx(mode: &str) -> &'static str {
    match mode {
        "tnapi" => "af_packet",
        "zc" => "af_xdp",
        _ => "udp",
    }
}

/// The `link name=out` line of a half's totals says the link was sent with `mode`'s family.
fn assert_link_tx(raw: &str, mode: &str) {
    let line = raw
        .lines()
        .find(|l| l.starts_with("link name=out "))
        .unwrap_or_else(|| panic!("no link out line:\n{raw}"));
    assert!(
        line.split_whitespace()
            .any(|w| w == format!("tx={}", link_tx(mode))),
        "mode {mode}: {line}"
    );
}

/// Where the datagrams of a stream went, for an assertion message: the receiving half's
/// shutdown totals (its `link` lines: delivered, repaired, lost, late, reorder; its `route`
/// lines; its workers' drop reasons), the sending half's, the bed's counters (injected loss,
/// wrong-direction packets) and every interface's packet and drop counters.
fn explain(bed: &SplitBed, receiver: &Totals, sender: &Totals) -> String {
    format!(
        "\n--- receiving half's totals:\n{}\n--- sending half's totals:\n{}\n--- bed counters: {:?}\n--- interfaces:\n{}",
        receiver.raw,
        sender.raw,
        bed.counters(),
        bed.interface_stats()
    )
}

/// A route's `rx_packets` from a running half's routes API.
fn route_rx_packets(bed: &SplitBed, half: &str, name: &str) -> u64 {
    let routes = common::split::admin_get(bed, half, "/api/v1/routes");
    let v: serde_json::Value = serde_json::from_str(&routes).expect("routes JSON");
    v["routes"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["name"] == name))
        .and_then(|r| r["counters"]["rx_packets"].as_u64())
        .unwrap_or_else(|| panic!("half {half}: no {name} route with counters: {routes}"))
}

/// The datagrams of `channel` the sending half's engine dropped before they reached the
/// link, each counted by its reason (`drop_rx_overflow`: its RX ring was full, e.g. a
/// worker starved of CPU on a loaded machine). The link tests hold the link to exact
/// accounting for everything the sending half took in, and every datagram the generator
/// sent either arrives once or is one of these.
fn source_drops(sender: &Totals, channel: &str) -> u64 {
    sender
        .channels
        .get(channel)
        .map(|c| {
            c.iter()
                .filter(|(k, _)| k.starts_with("drop_"))
                .map(|(_, v)| v.parse::<u64>().unwrap_or(0))
                .sum()
        })
        .unwrap_or(0)
}

/// A permanent neighbour `ip` at `mac` on half A's interface `dev` (no ARP), as half A's
/// vgate installs for its peer.
fn permanent_neighbour(bed: &SplitBed, ip: &str, mac: &str, dev: &str) {
    let st = std::process::Command::new("ip")
        .args([
            "-n",
            bed.get("HA_NS"),
            "neigh",
            "replace",
            ip,
            "lladdr",
            mac,
        ])
        .args(["dev", dev, "nud", "permanent"])
        .status()
        .unwrap();
    assert!(st.success(), "ip neigh replace {ip} dev {dev}");
}

fn sa(ip: &str, port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(ip.parse().unwrap(), port)
}

/// Streams `count` datagrams each way and returns (forward arrivals, reverse arrivals,
/// totals of half A, totals of half B).
fn run_streams(
    bed: &SplitBed,
    mode: &str,
    fec_fwd: &str,
    fec_rev: &str,
    count: u32,
    reverse: bool,
    queues: usize,
) -> (
    common::split::Arrivals,
    common::split::Arrivals,
    Totals,
    Totals,
) {
    let workers = format!("queues = {queues}\n");
    let a = start_half(
        bed,
        "a",
        &half_config_mode(bed, "a", mode, fec_fwd, fec_rev, &routes_a(bed))
            .replace("queues = 1\n", &workers),
    );
    let b = start_half(
        bed,
        "b",
        &half_config_mode(bed, "b", mode, fec_rev, fec_fwd, &routes_b(bed))
            .replace("queues = 1\n", &workers),
    );
    // In domain `d` (`DA`, `DB`): a receiver at its `port` of `n` datagrams from the gateway's
    // address in that domain (`g`: `GA`, `GB`) and port `from`; a sender of `count` from `port`
    // to the gateway's `to`.
    let at = |d: &str, port: u16| sa(bed.get(&format!("{d}_IP")), port);
    let recv = |d: &str, port: u16, (g, from): (&str, u16), n: u32, secs: u64| {
        let ns = bed.get(&format!("{d}_NS"));
        let quiet = Duration::from_secs(2);
        receive_numbered(
            ns,
            at(d, port),
            at(g, from),
            n,
            LEN,
            Duration::from_secs(secs),
            quiet,
        )
    };
    let send = |d: &str, port: u16, (g, to): (&str, u16), rate: u32| {
        send_numbered(
            bed.get(&format!("{d}_NS")),
            at(d, port),
            at(g, to),
            count,
            LEN,
            rate,
        )
    };
    let (fwd_rx, fwd_ready) = recv("DB", 6000, ("GB", 30000), count, 60);
    let rev_count = if reverse { count } else { 0 };
    let rev_secs = if reverse { 60 } else { 1 };
    let (rev_rx, rev_ready) = recv("DA", 5002, ("GA", 20002), rev_count.max(1), rev_secs);
    fwd_ready.recv().unwrap();
    rev_ready.recv().unwrap();
    let s1 = send("DA", 5000, ("GA", 20000), 2000);
    let s2 = reverse.then(|| send("DB", 6002, ("GB", 32000), 1000));
    s1.join().unwrap();
    if let Some(s) = s2 {
        s.join().unwrap();
    }
    let fwd = fwd_rx.join().unwrap();
    let rev = rev_rx.join().unwrap();
    // What half A's camera route took in (on a starved worker some of `count` can be
    // dropped at its RX ring, counted as rx_overflow: see `source_drops`).
    let taken = route_rx_packets(bed, "a", "cam");
    // The links show in each half's metrics and stats API while it runs.
    for (half, link, want) in [("a", "out", taken), ("b", "in", taken)] {
        let m = common::split::admin_get(bed, half, "/metrics");
        let line = format!("vgate_link_packets_total{{link=\"{link}\"}} ");
        let v: u64 = m
            .lines()
            .find_map(|l| l.strip_prefix(&line))
            .unwrap_or_else(|| panic!("half {half} metrics lack {line}:\n{m}"))
            .trim()
            .parse()
            .unwrap();
        assert!(v >= want * 9 / 10, "half {half} {link}: {v} of {want}");
        let stats = common::split::admin_get(bed, half, "/api/v1/stats");
        assert!(stats.contains(&format!("\"half\":\"{half}\"")), "{stats}");
        // The outgoing link is sent with the engine family of the mode.
        let tx = format!("\"tx\":\"{}\"", link_tx(mode));
        assert!(stats.contains(&tx), "half {half} stats lack {tx}: {stats}");
    }
    // Per stream on the receiving half: the routes list, the stats' link streams, metrics.
    let routes = common::split::admin_get(bed, "b", "/api/v1/routes");
    let v: serde_json::Value = serde_json::from_str(&routes).expect("routes JSON");
    let cam = v["routes"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["name"] == "cam"))
        .unwrap_or_else(|| panic!("no cam route: {routes}"));
    let link = &cam["link"];
    let n = link["received"].as_u64().unwrap() + link["repaired"].as_u64().unwrap();
    assert!(n >= taken * 9 / 10, "half A took in {taken}: {cam}");
    // The exact per-stream link loss (link header v2) is there too; its value is checked
    // against the receiver's count in the totals.
    for k in ["lost", "late", "duplicate", "restarts"] {
        assert!(link[k].is_u64(), "{k}: {cam}");
    }
    let stats = common::split::admin_get(bed, "b", "/api/v1/stats");
    let v: serde_json::Value = serde_json::from_str(&stats).expect("stats JSON");
    assert_eq!(v["split"]["streams"][0]["route"], "cam", "{stats}");
    assert!(v["split"]["streams"][0]["lost"].is_u64(), "{stats}");
    let m = common::split::admin_get(bed, "b", "/metrics");
    for how in ["received", "lost"] {
        assert!(
            m.lines().any(
                |l| l.starts_with("vgate_route_link_packets_total{route=\"cam\"")
                    && l.contains(&format!("how=\"{how}\""))
            ),
            "{how}: {m}"
        );
    }
    assert!(
        m.lines()
            .any(|l| l.starts_with("vgate_route_link_restarts_total{route=\"cam\"")),
        "restarts: {m}"
    );
    let ta = a.stop();
    let tb = b.stop();
    (fwd, rev, ta, tb)
}

tests_of!(streams_in_mode, if ready;
    streams_cross_both_links_once_and_nothing_goes_the_wrong_way => ("stack", 1),
    /// The same with the domain side captured by AF_PACKET rings (mode tnapi).
    streams_cross_the_split_in_mode_tnapi => ("tnapi", 1),
    /// The same with the domain side on AF_XDP sockets (mode zc; copy mode on veth).
    streams_cross_the_split_in_mode_zc => ("zc", 1),
    /// Mode zc with two workers: each has its own AF_XDP socket on its own TX queue of the
    /// link.
    streams_cross_the_split_in_mode_zc_with_two_workers => ("zc", 2),
);

fn streams_in_mode(mode: &str, queues: usize) {
    let bed = SplitBed::up_with_queues(queues);
    let count = 1500;
    let (fwd, rev, ta, tb) = run_streams(&bed, mode, "8+2", "8+2", count, true, queues);
    // What each sending half took in went down its link; what it did not take in it counted
    // as dropped (a starved worker's full RX ring on a loaded machine): the links and the
    // far ends are held exact to what was sent down them.
    let fwd_dropped = source_drops(&ta, "forward");
    let rev_dropped = source_drops(&tb, "reverse");
    let fwd_sent = u64::from(count) - fwd_dropped;
    let rev_sent = u64::from(count) - rev_dropped;
    if fwd_dropped + rev_dropped > 0 {
        eprintln!(
            "streams_in_mode({mode}): dropped before the links: {fwd_dropped} forward, {rev_dropped} reverse"
        );
    }
    assert_eq!(
        fwd.missing_and_dups(count),
        (u32::try_from(fwd_dropped).unwrap(), 0),
        "forward: every datagram once{}",
        explain(&bed, &tb, &ta)
    );
    assert_eq!(
        rev.missing_and_dups(count),
        (u32::try_from(rev_dropped).unwrap(), 0),
        "reverse: every datagram once{}",
        explain(&bed, &ta, &tb)
    );
    assert_eq!(
        (fwd.wrong_source, fwd.corrupt),
        (0, 0),
        "forward source and bytes"
    );
    assert_eq!(
        (rev.wrong_source, rev.corrupt),
        (0, 0),
        "reverse source and bytes"
    );
    assert_link_tx(&ta.raw, mode);
    assert_link_tx(&tb.raw, mode);
    // Half A sent the camera down the forward link and delivered the talkback from it.
    let a_out = link_totals(&ta.raw, "out");
    let a_in = link_totals(&ta.raw, "in");
    let b_out = link_totals(&tb.raw, "out");
    let b_in = link_totals(&tb.raw, "in");
    assert_eq!(b_in["delivered"], fwd_sent, "{}", tb.raw);
    assert_eq!(a_in["delivered"], rev_sent, "{}", ta.raw);
    for (name, l) in [("a out", &a_out), ("b out", &b_out)] {
        // 8+2: at least 2 repair frames per 8 data frames (more with partial blocks).
        assert!(
            l["repair_packets"] >= fwd_sent.min(rev_sent) / 4,
            "{name}: {l:?}"
        );
        assert_eq!(l["send_errors"], 0, "{name}");
    }
    for (name, l) in [("a in", &a_in), ("b in", &b_in)] {
        assert_eq!(l["lost"], 0, "{name}: {l:?}");
        common::split::assert_zero(l, IN_LINK_DROPS, name);
    }
    // Half A forwarded every camera datagram into the link (data frames = datagrams).
    assert_eq!(ta.route("cam", "tx_packets"), fwd_sent);
    assert_eq!(
        a_out["packets"] - a_out["repair_packets"],
        fwd_sent,
        "{a_out:?}"
    );
    assert_eq!(tb.route("cam", "tx_packets"), fwd_sent);
    assert_eq!(ta.route("talk", "tx_packets"), rev_sent);
    let c = bed.counters();
    assert_eq!(
        (c["FWD_WRONG"], c["REV_WRONG"], c["A_LEAK"], c["B_LEAK"]),
        (0, 0, 0, 0),
        "wrong-direction packets, and nothing sent on a receive-only interface: {c:?}"
    );
    // Per stream: each half's route from the link face counts what the link handed it.
    assert_eq!(
        tb.route("cam", "link_received") + tb.route("cam", "link_repaired"),
        fwd_sent,
        "{}",
        tb.raw
    );
    assert_eq!(
        ta.route("talk", "link_received") + ta.route("talk", "link_repaired"),
        rev_sent
    );
    assert_eq!(ta.route("cam", "link_received"), 0, "domain-side routes: 0");
    // Each half counts the same from its interfaces.
    for (name, l) in [
        ("a out", &a_out),
        ("a in", &a_in),
        ("b out", &b_out),
        ("b in", &b_in),
    ] {
        assert_eq!(l.get("wrong_direction"), Some(&0), "{name}: {l:?}");
    }
}

#[test]
fn bad_input_on_the_incoming_link_is_dropped_and_counted() {
    use vgate::wire::link::{
        write_fields, write_shard_prefix, Fields, StreamHeader, HEADER_LEN, TRAILER_LEN, VERSION,
    };
    if !ready("bad_input_on_the_incoming_link_is_dropped_and_counted") {
        return;
    }
    let bed = SplitBed::up();
    let b = start_half(
        &bed,
        "b",
        &half_config(&bed, "b", "off", "8+2", &routes_b(&bed)),
    );
    let (rx, rx_ready) = receive_numbered(
        bed.get("DB_NS"),
        sa(bed.get("DB_IP"), 6000),
        sa(bed.get("GB_IP"), 30000),
        1,
        LEN,
        Duration::from_secs(3),
        Duration::from_secs(1),
    );
    rx_ready.recv().unwrap();
    // Each frame its own sequence (the replay window takes each once), and the trailer
    // of an unkeyed link (the epoch, a zero MAC) after it.
    let seq = std::cell::Cell::new(0u32);
    let frame_at = |dst: u16, version: u8, k: u8, index: u8, frags: u8| {
        let mut f = vec![0u8; HEADER_LEN + 100 + TRAILER_LEN];
        seq.set(seq.get() + 1);
        write_fields(
            &mut f,
            &Fields {
                k,
                m: if k > 0 { 2 } else { 0 },
                index,
                epoch: 1,
                sequence: seq.get(),
                ..Fields::default()
            },
        );
        write_shard_prefix(&mut f, dst, 30000, 100);
        let sh = StreamHeader {
            sequence: 1,
            frag: 0,
            frags,
        };
        f[HEADER_LEN..HEADER_LEN + 6].copy_from_slice(&sh.bytes());
        f[2] = version;
        vgate::link::auth::LinkAuth::new(None).seal(&mut f, 1);
        f
    };
    let frame = |dst: u16, version: u8, k: u8| frame_at(dst, version, k, 0, 1);
    let to = sa(bed.get("FB_IP"), FWD_PORT);
    // What half A's vgate would install: the peer's permanent neighbour (no ARP).
    permanent_neighbour(&bed, bed.get("FB_IP"), bed.get("FB_MAC"), "fa");
    let fa = bed.get("FA_IP").to_owned();
    let unknown = frame(29990, VERSION, 8);
    let bad_version = frame(21000, 9, 8);
    // A peer half of the release before the link header's version 3.
    let version_1 = frame(21000, 2, 8);
    let wrong_fec = frame(21000, VERSION, 4);
    let good = frame(21000, VERSION, 8);
    // A stream header no vgate writes: 0 fragments.
    let bad_fragment = frame_at(21000, VERSION, 8, 1, 0);
    common::in_netns(bed.get("HA_NS"), move || {
        let s = UdpSocket::bind(format!("{fa}:0")).unwrap();
        s.send_to(b"GET / HTTP/1.1\r\n\r\n", to).unwrap(); // garbage
        s.send_to(&good[..10], to).unwrap(); // truncated header
        s.send_to(&good[..HEADER_LEN + 50], to).unwrap(); // shorter than it claims
        s.send_to(&bad_version, to).unwrap();
        s.send_to(&version_1, to).unwrap();
        s.send_to(&unknown, to).unwrap();
        s.send_to(&wrong_fec, to).unwrap();
        s.send_to(&bad_fragment, to).unwrap();
    });
    let arrivals = rx.join().unwrap();
    // One datagram the wrong way down the reverse link (half A's receive-only end ra to
    // half B's send-only end rb): the hardening of half A's receive-only interface drops it
    // on the way out and counts it; nothing reaches the link.
    let (ra_ip, rb_ip) = (bed.get("RA_IP").to_owned(), bed.get("RB_IP").to_owned());
    permanent_neighbour(&bed, &rb_ip, bed.get("RB_MAC"), "ra");
    let wrong_way = || {
        let (ra_ip, rb_ip) = (ra_ip.clone(), rb_ip.clone());
        common::in_netns(bed.get("HA_NS"), move || {
            let s = UdpSocket::bind(format!("{ra_ip}:0")).unwrap();
            s.send_to(b"wrong way", format!("{rb_ip}:9")).unwrap();
        });
    };
    wrong_way();
    let c = bed.counters();
    assert_eq!(
        (c["FWD_WRONG"], c["REV_WRONG"], c["A_LEAK"], c["B_LEAK"]),
        (0, 0, 1, 0),
        "{c:?}"
    );
    // Without the hardening it travels the link backwards: the bed's far end drops and
    // counts it, and half B sees it on its outgoing link's interface.
    bed.guard(false);
    wrong_way();
    bed.guard(true);
    let c = bed.counters();
    assert_eq!(
        (c["FWD_WRONG"], c["REV_WRONG"], c["A_LEAK"]),
        (0, 1, 1),
        "{c:?}"
    );
    let log = b.log();
    let t = b.stop();
    assert_eq!(
        link_totals(&t.raw, "out").get("wrong_direction"),
        Some(&1),
        "half B counts the packet that arrived on its send-only interface:\n{}",
        t.raw
    );
    let l = link_totals(&t.raw, "in");
    assert_eq!(l["drop_garbage"], 1, "{l:?}");
    assert_eq!(l["drop_truncated"], 2, "{l:?}");
    assert_eq!(l["drop_bad_version"], 2, "{l:?}");
    assert_eq!(l["drop_unknown_port"], 1, "{l:?}");
    assert_eq!(l["drop_bad_fec"], 1, "{l:?}");
    assert_eq!(l["drop_bad_fragment"], 1, "{l:?}");
    assert_eq!(
        l["delivered"], 2,
        "only the unknown-port and bad-fragment frames got past the lane header: {l:?}"
    );
    assert!(
        log.contains("both halves must run the same vgate release"),
        "the other version is logged: {log}"
    );
    assert!(
        arrivals.counts.is_empty() && arrivals.wrong_source == 0,
        "nothing forwarded: {arrivals:?}"
    );
    assert_eq!(t.route("cam", "tx_packets"), 0);
    assert_eq!(l.get("wrong_direction"), Some(&0), "{l:?}");
}

#[test]
fn fec_repairs_loss_that_a_plain_link_loses() {
    if !ready("fec_repairs_loss_that_a_plain_link_loses") {
        return;
    }
    fec_in_mode("stack");
}

/// The same with the link sent from an AF_PACKET socket (mode tnapi).
#[test]
fn fec_repairs_loss_on_an_af_packet_link() {
    if !ready("fec_repairs_loss_on_an_af_packet_link") {
        return;
    }
    fec_in_mode("tnapi");
}

/// The same with the link sent from AF_XDP sockets (mode zc).
#[test]
fn fec_repairs_loss_on_an_af_xdp_link() {
    if !ready("fec_repairs_loss_on_an_af_xdp_link") {
        return;
    }
    fec_in_mode("zc");
}

/// The block code (`fec = "block"`, header v4) on the forward link, mode stack: at 1 %
/// random loss and with bursts of 10 consecutive frames every 400, every datagram half A
/// sent down the link arrives once and half B counts nothing lost. Blocks are closed by
/// count here (`fec_block_ms = 100`: at the test's rate a 2 ms block would hold a frame or
/// two), 116 data and 12 repair frames.
#[test]
fn block_fec_repairs_random_loss_and_bursts_of_ten() {
    if !ready("block_fec_repairs_random_loss_and_bursts_of_ten") {
        return;
    }
    let bed = SplitBed::up();
    // The config's `fec = "{fec}"` line, with the key after it (the closing quote lands in
    // a comment).
    let fec = "block\"\nfec_block_ms = 100 #";
    let count = 3000;
    for burst in [false, true] {
        if burst {
            bed.burst("forward", 10, 400);
        } else {
            bed.loss("forward", 10);
        }
        let before = bed.counters()["FWD_LOSS"];
        let (got, ta, tb, (sent, dropped)) = forward_run(&bed, "stack", fec, count);
        let why = || explain(&bed, &tb, &ta);
        let b_in = link_totals(&tb.raw, "in");
        assert!(
            bed.counters()["FWD_LOSS"] > before,
            "the rule dropped frames"
        );
        assert_eq!(b_in["lost"], 0, "burst={burst}: {}", why());
        assert_eq!(b_in["drop_bad_fec"], 0, "{}", why());
        assert_eq!(b_in["delivered"] + b_in["repaired"], sent, "{}", why());
        assert!(b_in["repaired"] > 0, "{b_in:?}");
        assert_eq!(
            got.missing_and_dups(count),
            (u32::try_from(dropped).unwrap(), 0),
            "burst={burst}: every datagram once{}",
            why()
        );
        assert_eq!(tb.route("cam", "link_lost"), 0, "{}", tb.raw);
    }
}

/// On a link that loses nothing, the receiving half's reorder window (on by default with
/// FEC: 25 ms) never waits: every frame of a lane comes in order, including the partial
/// blocks the block code closes every 2 ms (at 2000 datagrams/s: a few frames each, their
/// unused positions skipped by the repair frames) and `K+M`'s. Counted, not timed: half B's
/// `reorder_waits` and `reorder_held` stay 0 and nothing is lost or late.
#[test]
fn a_lossless_link_makes_nothing_wait_in_the_reorder_window() {
    if !ready("a_lossless_link_makes_nothing_wait_in_the_reorder_window") {
        return;
    }
    let bed = SplitBed::up();
    let count = 2000;
    for fec in ["block", "8+2"] {
        let (got, ta, tb, (sent, dropped)) = forward_run(&bed, "stack", fec, count);
        let why = || explain(&bed, &tb, &ta);
        let b_in = link_totals(&tb.raw, "in");
        // The link lost nothing: no loss rule, nothing overflowed, FEC rebuilt nothing.
        assert_eq!(bed.counters()["FWD_LOSS"], 0, "{}", why());
        let overflow: u64 = tb
            .channels
            .values()
            .filter_map(|c| {
                c.get("drop_rx_overflow")
                    .and_then(|v| v.parse::<u64>().ok())
            })
            .sum();
        assert_eq!(
            overflow,
            0,
            "{fec}: half B's link socket overflowed{}",
            why()
        );
        assert_eq!(
            (b_in["lost"], b_in["repaired"], b_in["late"]),
            (0, 0, 0),
            "{fec}: {}",
            why()
        );
        assert_eq!(b_in["delivered"], sent, "{fec}: {}", why());
        assert_eq!(
            got.missing_and_dups(count),
            (u32::try_from(dropped).unwrap(), 0),
            "{fec}: every datagram once{}",
            why()
        );
        // And so nothing waited.
        assert_eq!(
            (
                b_in["reorder_waits"],
                b_in["reorder_held"],
                b_in["reorder_expired"]
            ),
            (0, 0, 0),
            "{fec}: a lossless in-order link opened gaps in the reorder window: {b_in:?}"
        );
    }
}

/// `count` datagrams of the forward stream only, FEC `fec` on the forward link
/// ([`run_streams`]): what arrived, both halves' totals, and what half A sent down the link
/// and dropped before it. The link was sent from `mode`'s sockets, and every datagram half A
/// took in went down the link (a data frame each); what it did not take in it counted as
/// dropped (a starved worker's full RX ring).
fn forward_run(
    bed: &SplitBed,
    mode: &str,
    fec: &str,
    count: u32,
) -> (common::split::Arrivals, Totals, Totals, (u64, u64)) {
    let (arrived, _, ta, tb) = run_streams(bed, mode, fec, "off", count, false, 1);
    assert_link_tx(&ta.raw, mode);
    let dropped = source_drops(&ta, "forward");
    let sent = ta.route("cam", "tx_packets");
    assert_eq!(
        sent + dropped,
        u64::from(count),
        "{}",
        explain(bed, &tb, &ta)
    );
    (arrived, ta, tb, (sent, dropped))
}

fn fec_in_mode(mode: &str) {
    let bed = SplitBed::up();
    // 1 % random loss on the forward link.
    bed.loss("forward", 10);
    let count = 3000;
    let (plain, ta, tb, (_, dropped)) = forward_run(&bed, mode, "off", count);
    let why = || explain(&bed, &tb, &ta);
    let (missing, dups) = plain.missing_and_dups(count);
    let b_in = link_totals(&tb.raw, "in");
    assert_eq!(dups, 0, "{}", why());
    assert!(
        b_in["lost"] > 0,
        "1 % loss without FEC loses datagrams (P(no loss) ≈ e^-30){}",
        why()
    );
    // The link counts what it lost, and nothing else was lost — but a loss at the very end
    // (ids after the last one that arrived) no later frame reveals to a link without FEC.
    let after_last = plain
        .counts
        .keys()
        .max()
        .map_or(u64::from(count), |&last| u64::from(count - 1 - last));
    let missing = u64::from(missing);
    assert!(
        b_in["lost"] + dropped <= missing && missing <= b_in["lost"] + dropped + after_last,
        "the link counts what it lost ({}), the sending half what it dropped ({dropped}), \
         {after_last} after the last arrival; nothing else was lost: {missing} missing{}",
        b_in["lost"],
        why()
    );
    // Per stream (link header v2): the route counts exactly the stream's losses.
    assert_eq!(tb.route("cam", "link_lost"), b_in["lost"], "{}", why());
    assert_eq!(
        tb.route("cam", "link_received"),
        u64::from(count) - missing,
        "{}",
        why()
    );
    let lost_frames = bed.counters()["FWD_LOSS"];
    assert!(lost_frames > 0);
    // Without FEC the reorder window is off by default: a gap is a loss, nothing waits.
    assert_eq!(
        (b_in["reorder_held"], b_in["reorder_expired"]),
        (0, 0),
        "{b_in:?}"
    );

    // 16+4 at 1 %: a block is lost only with 5 of its 20 frames (≈ 1.5e-6 per block).
    let (fec, ta, tb, (sent, dropped)) = forward_run(&bed, mode, "16+4", count);
    let why = || explain(&bed, &tb, &ta);
    if dropped > 0 {
        eprintln!(
            "fec_in_mode({mode}): half A dropped {dropped} of {count} datagrams before the link \
             (counted: {}); the link is held to the {sent} it sent",
            ta.raw
                .lines()
                .find(|l| l.starts_with("total channel=forward"))
                .unwrap_or("")
        );
    }
    let b_in = link_totals(&tb.raw, "in");
    // The link itself lost nothing after repair: every datagram half A sent down it
    // arrived once (a missing id is one half A counted as dropped before the link).
    assert_eq!(b_in["lost"], 0, "{}", why());
    assert_eq!(b_in["delivered"] + b_in["repaired"], sent, "{}", why());
    assert_eq!(
        fec.missing_and_dups(count),
        (u32::try_from(dropped).unwrap(), 0),
        "FEC delivers every datagram once{}",
        why()
    );
    assert!(b_in["repaired"] > 0, "{b_in:?}");
    // What came behind a lost frame waited for its rebuild in the reorder window.
    assert!(b_in["reorder_held"] > 0, "{b_in:?}");
    // Per stream (one stream here): the route counts the same repaired datagrams.
    assert_eq!(tb.route("cam", "link_repaired"), b_in["repaired"]);
    assert_eq!(tb.route("cam", "link_received"), b_in["delivered"]);
    assert_eq!(tb.route("cam", "link_lost"), 0, "{}", tb.raw);
    // Half B sent on all it got from the link.
    assert_eq!(tb.route("cam", "tx_packets"), sent, "{}", why());
    let c = bed.counters();
    assert_eq!(
        (c["FWD_WRONG"], c["REV_WRONG"], c["A_LEAK"], c["B_LEAK"]),
        (0, 0, 0, 0),
        "{c:?}"
    );
}

/// Half A restarts while its camera stream flows (a new process: a new epoch on the forward
/// link, its sequence from 0): half B takes the new sender's frames as a restart, counts
/// it, and the stream resumes — every datagram sent while half A ran arrives once, and
/// neither half sends anything on its receive-only link.
#[test]
fn media_link_peer_restart_resumes_on_the_other_half() {
    use common::split::send_numbered_from;
    if !ready("media_link_peer_restart_resumes_on_the_other_half") {
        return;
    }
    let bed = SplitBed::up();
    let cfg_a = half_config(&bed, "a", "8+2", "8+2", &routes_a(&bed));
    let b = start_half(
        &bed,
        "b",
        &half_config(&bed, "b", "8+2", "8+2", &routes_b(&bed)),
    );
    let per_run = 600;
    let (rx, rx_ready) = receive_numbered(
        bed.get("DB_NS"),
        sa(bed.get("DB_IP"), 6000),
        sa(bed.get("GB_IP"), 30000),
        2 * per_run,
        LEN,
        Duration::from_secs(60),
        // Covers half A's restart between the two runs.
        Duration::from_secs(20),
    );
    rx_ready.recv().unwrap();
    let mut totals_a = Vec::new();
    for run in 0..2 {
        let a = start_half(&bed, "a", &cfg_a);
        send_numbered_from(
            bed.get("DA_NS"),
            sa(bed.get("DA_IP"), 5000),
            sa(bed.get("GA_IP"), 20000),
            run * per_run,
            per_run,
            LEN,
            1000,
        )
        .join()
        .unwrap();
        // What half A took in it sent on (its partial last block closes when it goes quiet).
        let sent_all = || {
            let m = common::split::admin_get(&bed, "a", "/metrics");
            m.lines().any(|l| {
                l.strip_prefix("vgate_link_packets_total{link=\"out\"} ")
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .is_some_and(|v| v >= u64::from(per_run) * 5 / 4)
            })
        };
        let waited = std::time::Instant::now();
        while !sent_all() {
            assert!(
                waited.elapsed() < Duration::from_secs(30),
                "half A did not send its datagrams and their repair frames"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        totals_a.push(a.stop());
    }
    let arrivals = rx.join().unwrap();
    let tb = b.stop();
    for t in &totals_a {
        assert_eq!(
            t.route("cam", "tx_packets"),
            u64::from(per_run),
            "{}",
            t.raw
        );
    }
    assert_eq!(
        arrivals.missing_and_dups(2 * per_run),
        (0, 0),
        "both runs' datagrams once\n--- half B's totals:\n{}\n--- half A's last run's totals:\n{}\n--- bed counters: {:?}\n--- interfaces:\n{}",
        tb.raw,
        totals_a.last().map_or("", |t| t.raw.as_str()),
        bed.counters(),
        bed.interface_stats()
    );
    let b_in = link_totals(&tb.raw, "in");
    assert_eq!(b_in["restarts"], 1, "half A's restart, counted: {b_in:?}");
    assert_eq!(b_in["lost"], 0, "{b_in:?}");
    assert_eq!(
        b_in["delivered"] + b_in["repaired"],
        u64::from(2 * per_run),
        "{b_in:?}"
    );
    assert_eq!(
        tb.route("cam", "link_received") + tb.route("cam", "link_repaired"),
        u64::from(2 * per_run)
    );
    let c = bed.counters();
    assert_eq!(
        (c["FWD_WRONG"], c["REV_WRONG"], c["A_LEAK"], c["B_LEAK"]),
        (0, 0, 0, 0),
        "{c:?}"
    );
}

/// Issue 25's three attacks on the forward link, from the isolation device's position
/// (frames sent from half A's link address, as anything on the cable could), with both
/// links keyed: 50 forged well-formed frames (right header, a MAC of another key); every
/// frame of a first run captured on the link and replayed; half A restarted (a second
/// run) and the first run's frames replayed again. Domain B gets each camera datagram
/// exactly once and nothing forged; half B counts the forgeries `bad_mac`, the replay
/// `duplicate` and the replay after the restart `stale_epoch`, frame for frame.
fn link_attacks(fec: &str) {
    use common::split::{
        assert_zero, capture_udp, inject, numbered, send_numbered_from, with_link_keys,
    };
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    use std::sync::Arc;
    use vgate::link::auth::{LinkAuth, LinkKey, TRAILER_LEN};
    use vgate::wire::link::{write_fields, write_shard_prefix, Fields, StreamHeader, HEADER_LEN};
    let bed = SplitBed::up();
    let cfg_a = with_link_keys(&half_config(&bed, "a", fec, "off", &routes_a(&bed)));
    let b = start_half(
        &bed,
        "b",
        &with_link_keys(&half_config(&bed, "b", "off", fec, &routes_b(&bed))),
    );
    let per_run = 300u32;
    let (rx, rx_ready) = receive_numbered(
        bed.get("DB_NS"),
        sa(bed.get("DB_IP"), 6000),
        sa(bed.get("GB_IP"), 30000),
        u32::MAX,
        LEN,
        Duration::from_secs(60),
        // Covers half A's restart and the injections between the runs.
        Duration::from_secs(10),
    );
    rx_ready.recv().unwrap();
    let link_to = sa(bed.get("FB_IP"), FWD_PORT);
    let link_from = sa(bed.get("FA_IP"), 0);
    let per_frame = if fec == "off" { 1.0 } else { 1.25 };
    // One run of half A: `per_run` datagrams from id `first`, all sent down the link.
    let run = |first: u32| {
        let a = start_half(&bed, "a", &cfg_a);
        send_numbered_from(
            bed.get("DA_NS"),
            sa(bed.get("DA_IP"), 5000),
            sa(bed.get("GA_IP"), 20000),
            first,
            per_run,
            LEN,
            500,
        )
        .join()
        .unwrap();
        let sent_all = || {
            let m = common::split::admin_get(&bed, "a", "/metrics");
            m.lines().any(|l| {
                l.strip_prefix("vgate_link_packets_total{link=\"out\"} ")
                    .and_then(|v| v.trim().parse::<f64>().ok())
                    .is_some_and(|v| v >= f64::from(per_run) * per_frame)
            })
        };
        let waited = std::time::Instant::now();
        while !sent_all() {
            assert!(
                waited.elapsed() < Duration::from_secs(30),
                "half A did not send its datagrams down the link"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        a
    };
    // Run 1, captured on the link (half B's side of the forward cable).
    let stop = Arc::new(AtomicBool::new(false));
    let (cap, cap_ready) = capture_udp(bed.get("HB_NS"), link_to, Arc::clone(&stop));
    cap_ready.recv().unwrap();
    let a1 = run(0);
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Relaxed);
    let captured = cap.join().unwrap();
    assert!(
        captured.len() as f64 >= f64::from(per_run) * per_frame,
        "captured {} frames of the first run",
        captured.len()
    );
    // Forged: well-formed frames for the camera's port, ids no camera sent, sealed with a
    // key that is not the link's.
    let wrong = LinkAuth::new(Some(&LinkKey::raw([0x42; 32])));
    let forged: Vec<Vec<u8>> = (0..50u32)
        .map(|i| {
            let media = numbered(10_000 + i, LEN);
            let len = 6 + media.len();
            let mut f = vec![0u8; HEADER_LEN + len + TRAILER_LEN];
            write_fields(
                &mut f,
                &Fields {
                    sequence: 100_000 + i,
                    epoch: 1,
                    ..Fields::default()
                },
            );
            write_shard_prefix(&mut f, 21000, 30000, len as u16);
            let sh = StreamHeader {
                sequence: 50_000 + i,
                frag: 0,
                frags: 1,
            };
            f[HEADER_LEN..HEADER_LEN + 6].copy_from_slice(&sh.bytes());
            f[HEADER_LEN + 6..HEADER_LEN + len].copy_from_slice(&media);
            wrong.seal(&mut f, u64::MAX);
            f
        })
        .collect();
    inject(bed.get("HA_NS"), link_from, link_to, forged, 1000);
    // Replayed within the same sender process.
    inject(bed.get("HA_NS"), link_from, link_to, captured.clone(), 1000);
    let t1 = a1.stop();
    // Run 2 (half A restarted), then the first run's frames once more.
    let a2 = run(per_run);
    inject(bed.get("HA_NS"), link_from, link_to, captured.clone(), 1000);
    let t2 = a2.stop();
    let arrivals = rx.join().unwrap();
    let log_b = b.log();
    let tb = b.stop();
    let l = link_totals(&tb.raw, "in");
    let why = format!(
        "fec {fec}\n--- half B:\n{}\n--- half A (runs 1, 2):\n{}\n{}",
        tb.raw, t1.raw, t2.raw
    );
    assert!(
        arrivals.counts.keys().all(|&id| id < 2 * per_run),
        "forged datagrams delivered into domain B: {why}"
    );
    assert_eq!(
        arrivals.missing_and_dups(2 * per_run),
        (0, 0),
        "each camera datagram exactly once: {why}"
    );
    assert_eq!((arrivals.wrong_source, arrivals.corrupt), (0, 0), "{why}");
    let n = captured.len() as u64;
    eprintln!(
        "fec {fec}: {n} frames captured and replayed twice, 50 forged; half B's incoming link: bad_mac {} duplicate {} stale_epoch {} replay_old {} delivered {}",
        l["drop_bad_mac"], l["drop_duplicate"], l["drop_stale_epoch"], l["drop_replay_old"], l["delivered"]
    );
    assert_eq!(l["drop_bad_mac"], 50, "{why}");
    assert_eq!(l["drop_duplicate"], n, "the replay in run 1: {why}");
    assert_eq!(
        l["drop_stale_epoch"], n,
        "the replay after the restart: {why}"
    );
    assert_eq!(l["drop_replay_old"], 0, "{why}");
    assert!(l["duplicate"] >= n, "the link's duplicate counter: {why}");
    assert_zero(&l, IN_LINK_DROPS, "half B's incoming link");
    assert!(
        !log_b.contains("without key"),
        "keyed links give no warning: {log_b}"
    );
}

#[test]
fn forged_and_replayed_link_frames_are_refused_without_fec() {
    if !ready("forged_and_replayed_link_frames_are_refused_without_fec") {
        return;
    }
    link_attacks("off");
}

#[test]
fn forged_and_replayed_link_frames_are_refused_with_fec() {
    if !ready("forged_and_replayed_link_frames_are_refused_with_fec") {
        return;
    }
    link_attacks("8+2");
}
