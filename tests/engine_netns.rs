//! The engines on the three-namespace bed (`scripts/testbed.sh`, 4-queue veth pairs): the real
//! `vgate run` binary in the gateway namespace relays static stream routes from senders in A
//! to receivers in B, for `--mode tnapi` (AF_PACKET rings) and `--mode stack`; and, in
//! process, route changes while traffic flows on the tnapi engine.
//!
//! Checked: every packet delivered exactly once, to the right receiver, from the gateway's B
//! address and the route's egress port; at least two workers (queues) forwarded; the gateway
//! namespace's UDP `NoPorts` did not grow (the kernel did not also handle captured media);
//! no `vgate_` nft table is left after exit. Rates are modest: a loaded 2-core machine passes.
//!
//! Needs root, `ip` (iproute2) and `nft` (nftables); without them each test says it did not
//! run (and fails under `CI=true`).

mod common;

use std::process::Command;
use std::time::Duration;

use common::relay::*;
use common::vgate::Vgate;
use common::{in_netns, Bed};
use vgate::routes::Channel;

const NEEDS: &[(&str, &str)] = &[("ip", "iproute2"), ("nft", "nftables")];
const STREAMS: u32 = 48;
const PER_STREAM: u32 = 200;

/// This thread's namespace's PF_RING rings (`/proc/net/pf_ring/PID-DEV.ID`), if any.
fn pf_rings() -> Vec<String> {
    std::fs::read_dir("/proc/thread-self/net/pf_ring")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.contains('-') && n.contains('.'))
                .collect()
        })
        .unwrap_or_default()
}

/// The engine mode tnapi runs by default: PF_RING's `dev@q` rings in a PF_RING build (the
/// guest check, scripts/pfring-guest.sh), AF_PACKET otherwise.
const TNAPI_ENGINE: &str = if cfg!(feature = "pfring") {
    "pfring"
} else {
    "afpacket"
};

/// The process's socket descriptors and socket mappings (what could keep a ring open).
fn sockets_and_mappings() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(|e| {
                let e = e.ok()?;
                let l = std::fs::read_link(e.path()).ok()?;
                let l = l.to_string_lossy().into_owned();
                l.starts_with("socket:")
                    .then(|| format!("fd {} -> {l}", e.file_name().to_string_lossy()))
            })
            .collect()
        })
        .unwrap_or_default();
    if let Ok(maps) = std::fs::read_to_string("/proc/self/maps") {
        v.extend(
            maps.lines()
                .filter(|l| l.contains("socket:") || l.contains("pf_ring"))
                .map(|l| format!("map {l}")),
        );
    }
    v
}

fn vgate_tables(ns: &str) -> Vec<String> {
    common::nft_tables(ns, "vgate_")
}

/// One full run of the binary in `mode` on a fresh bed.
fn relay_run(mode: &str) {
    let (bed, g_ns) = Bed::up_with_g_ns(4);
    let noports_before = snmp_noports(&g_ns);

    let vg = Vgate::launch(&config(&bed, mode, STREAMS, 9940))
        .netns(&g_ns)
        .args(&["--mode", mode])
        .env("RUST_LOG", "info")
        .start();
    let log = vg.log();
    if mode == "tnapi" {
        assert!(
            log.contains(&format!("mode tnapi, engine {TNAPI_ENGINE}")) && log.contains("on CPU"),
            "start-up banner names mode, engine, queues and CPUs: {log}"
        );
        // The PF_RING engine sends by UDP sockets; AF_PACKET builds its frames.
        assert!(
            cfg!(feature = "pfring") || log.contains("egress packet socket with qdisc bypass on"),
            "forwarded packets leave by the packet sockets (frames built by vgate): {log}"
        );
        assert_eq!(
            vgate_tables(&g_ns).len(),
            1,
            "the media drop table is installed"
        );
    }

    relay_and_check(&format!("relay {mode}"), &bed, vg, STREAMS, PER_STREAM);
    let noports_after = snmp_noports(&g_ns);
    assert_eq!(
        noports_before, noports_after,
        "the kernel saw no datagram for a port without a socket"
    );
    assert!(
        vgate_tables(&g_ns).is_empty(),
        "no vgate nft table left: {:?}",
        vgate_tables(&g_ns)
    );
}

tests_of!(relay_run, true, NEEDS;
    tnapi_relays_every_packet_once_over_the_queues => ("tnapi"),
    stack_relays_every_packet_once_over_the_queues => ("stack"),
);

/// A crashed run's table (same config, so same name) is replaced, and removed at exit.
#[test]
fn tnapi_replaces_a_stale_table_and_refuses_what_it_cannot_run() {
    require!(true, NEEDS);
    let (bed, g_ns) = Bed::up_with_g_ns(4);
    let cfg = parsed_config(&bed, "tnapi", 9940);
    let table = format!("vgate_{}", vgate::engine::tnapi::instance_name(&cfg));
    let st = Command::new("ip")
        .args([
            "netns", "exec", &g_ns, "nft", "add", "table", "inet", &table,
        ])
        .status()
        .unwrap();
    assert!(st.success());
    let report = in_netns(&g_ns, move || {
        let before = sockets_and_mappings();
        let gw = vgate::gateway::Gateway::start(cfg.clone(), None).expect("tnapi starts");
        let d = gw.describe();
        let open_rings = pf_rings();
        drop(gw);
        // PF_RING lists each open ring in the namespace's /proc/net/pf_ring as PID-DEV.ID: a
        // stopped gateway must have closed every one (a ring left open when the namespace
        // goes makes pf_ring.ko leak its /proc entry, and lock up at the process's exit).
        if cfg!(feature = "pfring") {
            assert!(
                !open_rings.is_empty(),
                "the running gateway's rings are listed"
            );
            let left = pf_rings();
            let kept: Vec<String> = sockets_and_mappings()
                .into_iter()
                .filter(|s| !before.contains(s))
                .collect();
            assert!(
                left.is_empty(),
                "rings left open after the gateway stopped: {left:?}; sockets and mappings the process gained: {kept:?}"
            );
        }
        let e1 = start_error(&cfg, no_such_interface);
        // (Two queues need two CPUs; on one CPU this check does not run, and says so.)
        let e2 = (queues() >= 2).then(|| start_error(&cfg, more_queues_than_lo_has));
        (d, e1, e2)
    });
    let (describe, no_iface, no_queue) = report;
    assert!(
        describe.contains(&format!("engine {TNAPI_ENGINE}")),
        "{describe}"
    );
    assert!(
        no_iface.contains("tnapi") && no_iface.contains("no interface named \"vgnosuch0\""),
        "{no_iface}"
    );
    match no_queue {
        Some(e) => assert!(e.contains("RX queue(s)"), "{e}"),
        None => common::part_did_not_run(
            "tnapi_replaces_a_stale_table_and_refuses_what_it_cannot_run",
            "one CPU: the refusal of more queues than the interface has",
        ),
    }
    assert!(
        vgate_tables(&g_ns).is_empty(),
        "stale table replaced, then removed: {:?}",
        vgate_tables(&g_ns)
    );
}

/// Route changes on the tnapi engine while a sender runs: remove stops forwarding, adding
/// back resumes, a route on new ports (new egress socket) starts forwarding — all without
/// restarting a worker.
#[test]
fn tnapi_route_changes_take_effect_while_traffic_flows() {
    require!(true, NEEDS);
    let (bed, g_ns) = Bed::up_with_g_ns(4);
    let peers = Peers::of(&bed);
    let cfg = parsed_config(&bed, "tnapi", 9940);
    in_netns(&g_ns, move || {
        let gw = vgate::gateway::Gateway::start(cfg, None).expect("tnapi starts");
        // One sender per gateway port, 1 packet per ms each, until stopped.
        let rc = RouteChanges::start(&gw, peers, None);
        let count = |i: usize| rc.sinks.count(i);
        rc.assert_nothing_before_a_route(Duration::from_millis(100));
        rc.add_first();
        rc.wait_growth(0, 50);

        gw.routes.remove_route(Channel::Forward, A_PORTS).unwrap();
        // In-flight blocks (≤ 2 ms timeout) drain, then nothing more.
        std::thread::sleep(Duration::from_millis(100));
        let after_remove = count(0);
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(count(0), after_remove, "a removed route forwards nothing");

        // Back, then a route on ports opened now: its egress socket reaches the workers by
        // command.
        rc.readd_add_second_and_finish();
        let totals = gw.totals();
        let fwd = totals.channel(Channel::Forward);
        assert!(
            fwd.drop_count(vgate::stats::DropReason::NoRoute) > 0,
            "packets without a route are counted: {fwd:?}"
        );
        drop(gw);
    });
    assert!(vgate_tables(&g_ns).is_empty());
}
