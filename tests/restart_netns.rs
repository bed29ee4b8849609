//! Restarts and faults with the real `vgate run` binary on the three-namespace bed:
//!
//! - `kill -9` during traffic, in tnapi mode (AF_PACKET rings; the run leaves its nft table
//!   `inet vgate_<hash>` behind) and in stack mode: the next start (as systemd would restart
//!   it) replaces the stale table, restores the static routes, and media on them resumes. The
//!   time from the new process's start to the first packet delivered is printed (a figure,
//!   never asserted beyond a generous bound).
//! - Receive overflow is counted, never silent: vgate is stopped (SIGSTOP) while a burst
//!   arrives, continued, and the kernel's drops show as `rx_overflow` in the totals and in
//!   `/metrics`.
//!
//! Needs root, iproute2 and nftables.

mod common;
#[path = "hostile/peers.rs"]
mod peers;

use std::io::Write;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use common::Bed;
use peers::*;

const NEEDS: &[(&str, &str)] = &[("ip", "iproute2"), ("nft", "nftables")];

fn vgate_tables(ns: &str) -> Vec<String> {
    common::nft_tables(ns, "vgate_")
}

tests_of!(kill9_and_restart, true, NEEDS;
    kill9_during_traffic_tnapi_restarts_clean => ("tnapi"),
    kill9_during_traffic_stack_restarts_clean => ("stack"),
);

/// `kill -9` of a `vgate run` in `mode` while streams flow, then a new one on the same
/// config: media resumes, a stale nft table is replaced (not doubled), nothing is left after
/// a clean stop, and no packet was delivered twice.
fn kill9_and_restart(mode: &str) {
    let (bed, g_ns) = Bed::up_with_g_ns(2);
    let cfg = config(&bed, mode, 100, "strict", &stream_routes(&bed, 5));
    let gw = Vgate::start_in(&g_ns, &cfg, &["--mode", mode]);
    let streams = Streams::start(&bed, 5, 200, 0, Duration::from_secs(60));
    let deadline = Instant::now() + Duration::from_secs(10);
    while streams.received.load(Relaxed) < 500 {
        assert!(
            Instant::now() < deadline,
            "no media before the crash:\n{}",
            gw.log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    gw.crash();
    let left = vgate_tables(&g_ns);
    if mode == "tnapi" {
        assert_eq!(
            left.len(),
            1,
            "the crash leaves its nft table behind: {left:?}"
        );
    }
    std::thread::sleep(Duration::from_millis(300));
    let before = streams.received.load(Relaxed);
    let gw = Vgate::start_in(&g_ns, &cfg, &["--mode", mode]);
    let t_ready = gw.started.elapsed();
    let first = loop {
        if streams.received.load(Relaxed) > before {
            break gw.started.elapsed();
        }
        assert!(
            gw.started.elapsed() < Duration::from_secs(10),
            "media did not resume:\n{}",
            gw.log()
        );
        std::thread::sleep(Duration::from_micros(200));
    };
    let tables = vgate_tables(&g_ns);
    std::thread::sleep(Duration::from_millis(500));
    let report = streams.finish();
    let totals = gw.stop().raw;
    let _ = writeln!(
        std::io::stderr(),
        "FIGURE restart {mode}: stale tables after kill -9: {}; new process ready (static routes installed) {:.0} ms, first packet delivered {:.0} ms after its start; packets sent {} received {}",
        left.len(),
        t_ready.as_secs_f64() * 1e3,
        first.as_secs_f64() * 1e3,
        report.sent,
        report.received
    );
    if mode == "tnapi" {
        assert_eq!(
            tables.len(),
            1,
            "stale table replaced, not doubled: {tables:?}"
        );
    }
    assert!(
        vgate_tables(&g_ns).is_empty(),
        "no table after a clean stop"
    );
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(report.duplicates, 0);
    let fwd = channel_totals(&totals, "forward");
    assert!(num(&fwd, "tx_packets") > 0, "{totals}");
}

/// SIGSTOP during a burst: the socket's receive queue overflows; vgate counts it.
#[test]
fn receive_overflow_is_counted_in_totals_and_metrics() {
    require!(true, NEEDS);
    let (bed, g_ns) = Bed::up_with_g_ns(1);
    let cfg = config(&bed, "stack", 100, "strict", &stream_routes(&bed, 1));
    let gw = Vgate::start_in(&g_ns, &cfg, &[]);
    gw.signal(nix::sys::signal::Signal::SIGSTOP);
    // 30 000 packets at 5 000/s while nobody reads: more than the socket buffer holds (the
    // rate stays below what the veth backlog drops on its own).
    let streams = Streams::start(&bed, 1, 5_000, 30_000, Duration::from_secs(15));
    std::thread::sleep(Duration::from_millis(7000));
    gw.signal(nix::sys::signal::Signal::SIGCONT);
    // Let vgate drain its full socket (a debug build takes a while) before more arrives.
    std::thread::sleep(Duration::from_millis(2000));
    let report = streams.finish();
    // One more packet after the burst carries the kernel's drop count to vgate.
    let s2 = Streams::start(&bed, 1, 50, 20, Duration::from_secs(5));
    let after = s2.finish();
    std::thread::sleep(Duration::from_millis(300));
    let metrics = admin_get(&g_ns, "/metrics");
    let totals = gw.stop().raw;
    let fwd = channel_totals(&totals, "forward");
    let overflow = num(&fwd, "drop_rx_overflow");
    let rx = num(&fwd, "rx_packets");
    let sent = report.sent + after.sent;
    let _ = writeln!(
        std::io::stderr(),
        "FIGURE overflow: {sent} packets sent, vgate stopped for 7 s: read {rx}, rx_overflow counted {overflow}, unaccounted {}",
        sent.saturating_sub(rx + overflow)
    );
    assert!(
        overflow > 0,
        "the burst did not overflow the socket:\n{totals}"
    );
    assert!(rx + overflow <= sent, "{totals}");
    assert!(
        rx + overflow >= sent * 99 / 100,
        "drops before vgate's socket (veth backlog): {totals}"
    );
    assert_eq!(
        metric(
            &metrics,
            "vgate_channel_drops_total",
            &["rx_overflow", "forward"]
        ),
        overflow,
        "rx_overflow in /metrics"
    );
}
