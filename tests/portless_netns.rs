//! The ring modes (`tnapi`, `zc`, `xdp`) hold no socket per gateway port (see
//! `engine::ports`): on the three-namespace bed (`scripts/testbed.sh`), `vgate run` with
//! [`ROUTES`] static routes in each ring mode, checked for:
//!
//! - **no per-port sockets**: no UDP socket of the gateway namespace (`ss -uan`) is bound on a
//!   media port, and the process holds far fewer sockets than routes (`/proc/PID/fd`; with a
//!   socket per port it held two per route);
//! - **the fallback transmit**: the gateway's neighbour entry for the receiver is deleted
//!   before traffic starts, so the first datagrams cannot leave by vgate's own frames (no
//!   next-hop MAC) and go through the worker's raw socket, which makes the kernel resolve the
//!   neighbour (`Ip: OutRequests` of the gateway namespace grows: frames vgate builds itself
//!   never pass the IP layer); every datagram arrives once, from the gateway's B address and
//!   the route's egress port (the receivers check both);
//! - **a port without a route**: datagrams to a port of the media range that has no route
//!   produce no ICMP port unreachable and reach no socket (`Icmp: OutDestUnreachs` and `Udp:
//!   NoPorts` of the gateway namespace do not grow) and are counted `no_route`; nor do
//!   fragmented datagrams to a media port (reassembled by the kernel, then dropped by the
//!   media ranges' nft table).
//!
//! - **engine.reserve_ports**: the media ranges are in the namespace's
//!   `net.ipv4.ip_local_reserved_ports` once vgate runs.
//!
//! Rates are modest (a loaded 2-core machine passes). Needs root, `ip` (iproute2), `ss`,
//! `nft` (tnapi) and `ethtool` (the xdp bed); without them each test says it did not run
//! (and fails under `CI=true`).

mod common;

use std::net::{SocketAddrV4, UdpSocket};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use common::relay::*;
use common::vgate::Vgate;
use common::{enter_netns, Bed};

const NEEDS: &[(&str, &str)] = &[
    ("ip", "iproute2"),
    ("ss", "iproute2"),
    ("nft", "nftables"),
    ("ethtool", "ethtool"),
];
/// Static routes installed (two gateway ports each).
const ROUTES: u32 = 300;
/// Streams that carry traffic, and datagrams per stream.
const STREAMS: u32 = 8;
const PER_STREAM: u32 = 60;
/// Datagrams sent to a media port without a route.
const UNROUTED: u32 = 40;

/// A counter of `/proc/net/snmp` in namespace `ns`: `group` is `Ip`, `Icmp`, `Udp`, ….
fn snmp(ns: &str, group: &str, field: &str) -> u64 {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "cat", "/proc/net/snmp"])
        .output()
        .expect("read snmp");
    let text = String::from_utf8_lossy(&out.stdout);
    let prefix = format!("{group}:");
    let mut rows = text.lines().filter(|l| l.starts_with(&prefix));
    let (names, values) = (rows.next().expect("header"), rows.next().expect("values"));
    let idx = names
        .split_whitespace()
        .position(|n| n == field)
        .unwrap_or_else(|| panic!("no {group} {field} in /proc/net/snmp"));
    values.split_whitespace().nth(idx).unwrap().parse().unwrap()
}

/// Local ports of the UDP sockets in namespace `ns`.
fn udp_ports(ns: &str) -> Vec<u16> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "ss", "-Huan"])
        .output()
        .expect("ss");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3))
        .filter_map(|local| local.rsplit_once(':'))
        .filter_map(|(_, p)| p.parse().ok())
        .collect()
}

/// Sockets among the open files of process `pid`.
fn process_sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("read /proc/PID/fd")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| l.to_string_lossy().starts_with("socket:"))
        .count()
}

fn ethtool(ns: &str, args: &[&str]) {
    let ok = Command::new("ip")
        .args(["netns", "exec", ns, "ethtool"])
        .args(args)
        .status()
        .expect("ethtool")
        .success();
    assert!(ok, "ethtool {args:?} in {ns}");
}

fn run(mode: &str, control_port: u16) {
    let test = format!("{mode}_holds_no_socket_per_port");
    require!(&test, true, NEEDS);
    let bed = Bed::up(4);
    if mode == "xdp" {
        // The bed of tests/xdp_netns.rs: GRO on B's veth takes the kernel's redirects,
        // complete sender checksums for the program's incremental update.
        for (ns, dev) in [("A_NS", "A_IF"), ("B_NS", "B_IF")] {
            ethtool(bed.get(ns), &["-K", bed.get(dev), "tx", "off"]);
            ethtool(bed.get(ns), &["-K", bed.get(dev), "gro", "on"]);
        }
    }
    let g_ns = bed.get("G_NS").to_owned();
    let (a_ip, ga_ip, _, b_ip) = addrs(&bed);
    // The next hop toward the receivers is unknown until the gateway sends there.
    let del = Command::new("ip")
        .args(["-n", &g_ns, "neigh", "del", &b_ip.to_string()])
        .args(["dev", bed.get("GB_IF")])
        .status()
        .expect("ip neigh del");
    assert!(del.success(), "ip neigh del");

    // engine.reserve_ports: vgate adds the media ranges to the bed namespace's reserved
    // ports (empty before) at start.
    let config = config(&bed, mode, ROUTES, control_port)
        .replace("[engine]\n", "[engine]\nreserve_ports = true\n");
    assert!(config.contains("reserve_ports = true"));
    let vg = Vgate::start_with(&["ip", "netns", "exec", &g_ns], &config, &[]);
    let pid = vg.pid();

    let reserved = Command::new("ip")
        .args(["netns", "exec", &g_ns, "cat"])
        .arg("/proc/sys/net/ipv4/ip_local_reserved_ports")
        .output()
        .expect("read ip_local_reserved_ports");
    let reserved = String::from_utf8_lossy(&reserved.stdout).trim().to_owned();
    for first in [A_PORTS, B_PORTS] {
        assert!(
            reserved.contains(&format!("{first}-{}", first + 999)),
            "{mode}: engine.reserve_ports reserved the media ranges: {reserved:?}"
        );
    }

    // No per-port sockets.
    let in_range =
        |p: &u16| (A_PORTS..=A_PORTS + 999).contains(p) || (B_PORTS..=B_PORTS + 999).contains(p);
    let bound: Vec<u16> = udp_ports(&g_ns).into_iter().filter(in_range).collect();
    assert!(
        bound.is_empty(),
        "{mode}: UDP sockets on media ports: {bound:?}"
    );
    let sockets = process_sockets(pid);
    eprintln!("{mode}: {ROUTES} routes, {sockets} sockets in the process");
    assert!(
        sockets < 64,
        "{mode}: {sockets} sockets for {ROUTES} routes: a socket per port?"
    );

    let before = (
        snmp(&g_ns, "Ip", "OutRequests"),
        snmp(&g_ns, "Icmp", "OutDestUnreachs"),
        snmp(&g_ns, "Udp", "NoPorts"),
    );

    // Routed traffic, checked at the receivers (source address and port, once each).
    let done = Arc::new(AtomicBool::new(false));
    let rx = bed_receiver(&bed, STREAMS, Arc::clone(&done));
    let tx = sender(bed.get("A_NS").into(), a_ip, ga_ip, STREAMS, PER_STREAM);
    // A port of the range without a route (routes take even ports from A_PORTS on).
    let unrouted = A_PORTS + 999;
    let a_ns = bed.get("A_NS").to_owned();
    let stray = std::thread::spawn(move || {
        enter_netns(&a_ns).expect("setns A");
        let s = UdpSocket::bind(SocketAddrV4::new(a_ip, 0)).unwrap();
        for i in 0..UNROUTED {
            s.send_to(&packet(999, i), SocketAddrV4::new(ga_ip, unrouted))
                .unwrap();
            std::thread::sleep(Duration::from_millis(5));
        }
        // Fragmented (over the veth's MTU): the kernel reassembles what XDP passes, and the
        // media ranges' nft table drops it (no socket, so no ICMP either).
        for port in [unrouted, A_PORTS] {
            s.send_to(&[7u8; 3000], SocketAddrV4::new(ga_ip, port))
                .unwrap();
        }
    });
    let sent = tx.join().expect("sender");
    stray.join().unwrap();
    done.store(true, Relaxed);
    let got = rx.join().expect("receiver");
    let after = (
        snmp(&g_ns, "Ip", "OutRequests"),
        snmp(&g_ns, "Icmp", "OutDestUnreachs"),
        snmp(&g_ns, "Udp", "NoPorts"),
    );
    let totals = vg.stop();

    assert_eq!(sent, STREAMS * PER_STREAM);
    check_delivery(&got, PER_STREAM);
    assert!(
        after.0 > before.0,
        "{mode}: the first datagrams left through the kernel's IP layer (raw socket): Ip OutRequests {} -> {}",
        before.0,
        after.0
    );
    assert_eq!(
        after.1, before.1,
        "{mode}: no ICMP destination unreachable from the gateway"
    );
    assert_eq!(
        after.2, before.2,
        "{mode}: no datagram for a port without a socket reached the kernel's UDP layer"
    );
    for (key, want, what) in [
        ("tx_packets", sent, "every routed datagram forwarded"),
        (
            "drop_no_route",
            UNROUTED,
            "the datagrams to a port without a route are counted no_route",
        ),
    ] {
        let got = totals.channel("forward", key);
        assert_eq!(got, u64::from(want), "{mode}: {what}: {}", totals.raw);
    }
}

#[test]
fn tnapi_holds_no_socket_per_port() {
    run("tnapi", 9961);
}

#[test]
fn zc_holds_no_socket_per_port() {
    run("zc", 9962);
}

#[test]
fn xdp_holds_no_socket_per_port() {
    run("xdp", 9963);
}
