//! Mode `xdp` on the three-namespace bed (`scripts/testbed.sh`, 4-queue veth pairs): the
//! in-kernel fast path of `vgate run --mode xdp` relays static stream routes from senders in
//! A to receivers in B, with the AF_XDP path of mode `zc` behind it for what the program
//! does not forward.
//!
//! The bed for native XDP redirect between veths: the gateway's B-side veth can only take
//! redirected frames when its peer (in B) has NAPI — GRO on (`ethtool -K … gro on`) or an
//! XDP program; and the senders in A turn TX checksum offload off, so that their UDP
//! checksums are complete when the XDP program updates them (see `engine::xdp`).
//!
//! Needs root, `ip` (iproute2) and `ethtool`; without them each test says it did not run
//! (and fails under `CI=true`).

mod common;

use std::process::Command;

use common::relay::*;
use common::vgate::Vgate;
use common::{prerequisites, Bed};

const NEEDS: &[(&str, &str)] = &[("ip", "iproute2"), ("ethtool", "ethtool")];

/// `ethtool ARGS` inside namespace `ns`; panics on failure.
fn ethtool(ns: &str, args: &[&str]) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "ethtool"])
        .args(args)
        .output()
        .expect("ethtool");
    assert!(
        out.status.success(),
        "ethtool {args:?} in {ns}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The bed as mode xdp needs it (see the module doc).
fn xdp_bed() -> Bed {
    let bed = Bed::up(4);
    ethtool(bed.get("A_NS"), &["-K", bed.get("A_IF"), "tx", "off"]);
    ethtool(bed.get("B_NS"), &["-K", bed.get("B_IF"), "gro", "on"]);
    bed
}

#[test]
fn xdp_probe() {
    if !prerequisites("xdp_probe", true, NEEDS) {
        return;
    }
    let bed = xdp_bed();
    let g_ns = bed.get("G_NS").to_owned();
    let a_ns = bed.get("A_NS").to_owned();
    let vg = Vgate::start_with(
        &["ip", "netns", "exec", &g_ns],
        &config(&bed, "xdp", 8, 9951),
        &["--mode", "xdp"],
    );
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let rx = receiver(
        bed.get("B_NS").into(),
        bed.ip("B_IP"),
        bed.ip("GB_IP"),
        8,
        std::sync::Arc::clone(&done),
        ready_tx,
    );
    ready_rx.recv().unwrap();
    let tx = sender(a_ns, bed.ip("A_IP"), bed.ip("GA_IP"), 8, 300);
    let sent = tx.join().unwrap();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let got = rx.join().unwrap();
    eprintln!("{}", ethtool(&g_ns, &["-S", bed.get("GB_IF")]));
    eprintln!("{}", ethtool(&g_ns, &["-S", bed.get("GA_IF")]));
    let totals = vg.stop();
    eprintln!("sent {sent}\n{}", totals.raw);
    check_delivery(&got, 300);
}
