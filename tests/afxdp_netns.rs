//! The `zc` mode's AF_XDP engine on the three-namespace bed (`scripts/testbed.sh`, 4-queue
//! veth pairs, where AF_XDP runs in copy mode): the real `vgate run --mode zc` in the gateway
//! namespace relays static stream routes from senders in A to receivers in B; in process,
//! route changes while traffic flows change what the XDP program redirects; a stale program
//! of ours is replaced at start and nothing is left after exit.
//!
//! Checked: every packet delivered exactly once, to the right receiver, from the gateway's B
//! address and the route's egress port; at least two workers forwarded; the gateway's UDP
//! `NoPorts` did not grow; ARP (the static neighbour entry in A is removed first) and a UDP
//! datagram to a non-media port still reach the gateway's kernel; no XDP program on the
//! gateway's interfaces after exit. Rates are modest: a loaded 2-core machine passes.
//!
//! Needs root and `ip` (iproute2); without them each test says it did not run (and fails
//! under `CI=true`). bpffs is not needed: vgate pins nothing (its program is attached through
//! a BPF link that dies with the process).

mod common;

use std::net::{Ipv4Addr, UdpSocket};
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use common::relay::*;
use common::vgate::Vgate;
use common::{enter_netns, in_netns, Bed};
use vgate::routes::Channel;

const NEEDS: &[(&str, &str)] = &[("ip", "iproute2")];
const STREAMS: u32 = 64;
const PER_STREAM: u32 = 150;
/// A port outside both media ranges, bound by a plain socket in the gateway namespace.
const SIGNALING_PORT: u16 = 5999;

/// Packets the XDP programs in namespace `ns` dropped for ports without a route: the sum of
/// the `vgate_noroute` map their programs use (read with `bpftool`); `None` when no program
/// has that map (or bpftool is missing).
fn noroute_in_kernel(ns: &str) -> Option<u64> {
    let json = |cmd: &str, args: &[&str]| -> Option<serde_json::Value> {
        let out = Command::new(cmd).args(args).output().ok()?;
        serde_json::from_slice(&out.stdout).ok()
    };
    let links = json("ip", &["-n", ns, "-j", "-d", "link", "show"])?;
    let mut maps: Vec<u64> = Vec::new();
    for l in links.as_array()? {
        let Some(prog) = l["xdp"]["prog"]["id"].as_u64() else {
            continue;
        };
        let p = json("bpftool", &["prog", "show", "id", &prog.to_string(), "-j"])?;
        for m in p["map_ids"].as_array()? {
            let m = m.as_u64()?;
            let info = json("bpftool", &["map", "show", "id", &m.to_string(), "-j"])?;
            if info["name"] == "vgate_noroute" && !maps.contains(&m) {
                maps.push(m);
            }
        }
    }
    let mut packets = None;
    for m in maps {
        let dump = json("bpftool", &["map", "dump", "id", &m.to_string(), "-j"])?;
        for entry in dump.as_array()? {
            for v in entry["values"].as_array()? {
                // (packets, bytes) as 16 bytes, "0x.." strings without BTF.
                let bytes: Vec<u8> = v["value"]
                    .as_array()?
                    .iter()
                    .filter_map(|b| {
                        u8::from_str_radix(b.as_str()?.trim_start_matches("0x"), 16).ok()
                    })
                    .collect();
                let n = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
                *packets.get_or_insert(0) += n;
            }
        }
    }
    packets
}

tests_of!(relay_run, true, NEEDS;
    afxdp_relays_every_packet_once_over_the_queues => ("xdp"),
    /// The same with egress through the gateway-port sockets (`sendmmsg`).
    afxdp_relays_through_sockets_too => ("sockets"),
);

/// One run of `vgate run --mode zc` with egress `tx_path` (`VGATE_AFXDP_TX`).
fn relay_run(tx_path: &str) {
    let (bed, g_ns) = Bed::up_with_g_ns(4);
    let a_ns = bed.get("A_NS").to_owned();
    // Domain A must resolve the gateway by ARP, through the XDP program.
    let st = Command::new("ip")
        .args([
            "-n",
            &a_ns,
            "neigh",
            "del",
            bed.get("GA_IP"),
            "dev",
            bed.get("A_IF"),
        ])
        .status()
        .unwrap();
    assert!(st.success());
    let noports_before = snmp_noports(&g_ns);
    let env = format!("VGATE_AFXDP_TX={tx_path}");
    let vg = Vgate::start_with(
        &["ip", "netns", "exec", &g_ns, "env", &env],
        &config(&bed, "zc", STREAMS, 9941),
        &["--mode", "zc"],
    );
    assert_eq!(
        xdp_links(&g_ns).len(),
        2,
        "a program on each domain interface"
    );

    // Signaling-like traffic to a non-media port reaches the gateway's kernel.
    let sig_ip = bed.ip("GA_IP");
    let (sig_tx, sig_rx) = mpsc::channel();
    let sig = {
        let g_ns = g_ns.clone();
        std::thread::spawn(move || {
            enter_netns(&g_ns).unwrap();
            let s = UdpSocket::bind((sig_ip, SIGNALING_PORT)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let _ = sig_tx.send(());
            let mut buf = [0u8; 64];
            s.recv_from(&mut buf).map(|(n, _)| buf[..n].to_vec())
        })
    };
    sig_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    in_netns(&a_ns, move || {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        s.send_to(b"REGISTER", (sig_ip, SIGNALING_PORT)).unwrap();
    });
    assert_eq!(
        sig.join()
            .unwrap()
            .expect("the non-media datagram reached its socket"),
        b"REGISTER"
    );

    let test = format!("relay zc, egress {tx_path}");
    relay_and_check(&test, &bed, vg, STREAMS, PER_STREAM);
    assert_eq!(
        noports_before,
        snmp_noports(&g_ns),
        "the kernel saw no datagram for a port without a socket"
    );
    assert_no_xdp_left(&g_ns);
}

/// A stale `vgate_xdp` (attached through netlink, as a crashed older run leaves it) is
/// replaced at start; an interface that does not exist or lacks queues is a clear error;
/// nothing is attached afterwards.
#[test]
fn afxdp_replaces_a_stale_program_and_refuses_what_it_cannot_run() {
    require!(true, NEEDS);
    let (bed, g_ns) = Bed::up_with_g_ns(4);
    let ga_if = bed.get("GA_IF").to_owned();
    let cfg = parsed_config(&bed, "zc", 9941);
    let (stale, describe, no_iface, no_queue) = in_netns(&g_ns, move || {
        let stale = vgate::engine::afxdp::leave_stale_program(&ga_if).expect("stale program");
        let gw = vgate::gateway::Gateway::start(cfg.clone(), None).expect("zc starts");
        let d = gw.describe();
        drop(gw);
        let e1 = start_error(&cfg, no_such_interface);
        let e2 = start_error(&cfg, more_queues_than_lo_has);
        (stale, d, e1, e2)
    });
    assert!(
        describe.contains("mode zc, engine afxdp")
            && describe.contains(&format!("replaced stale program id {stale}"))
            && describe.contains("copy mode (zero-copy refused")
            && describe.contains("on CPU"),
        "the start-up banner names mode, engine, socket modes and CPUs: {describe}"
    );
    assert!(
        no_iface.contains("mode zc") && no_iface.contains("no interface named \"vgnosuch0\""),
        "{no_iface}"
    );
    assert!(no_queue.contains("RX queue(s)"), "{no_queue}");
    assert_no_xdp_left(&g_ns);
}

/// Route changes while a sender runs: removing a route makes the XDP program drop its port
/// (counted no_route; the workers see nothing more of it), adding it back resumes, a route on new ports
/// starts — all without restarting a worker — and each route forwards its first packet
/// within 1 s of being installed (measured: 1–3 ms; the time is printed).
#[test]
fn afxdp_route_changes_take_effect_while_traffic_flows() {
    require!(true, NEEDS);
    let (bed, g_ns) = Bed::up_with_g_ns(4);
    let peers = Peers::of(&bed);
    let ga_ip = peers.addrs.1;
    let cfg = parsed_config(&bed, "zc", 9941);
    let gw_ns = g_ns.clone();
    let raw_ns = peers.a_ns.clone();
    in_netns(&g_ns, move || {
        let gw = vgate::gateway::Gateway::start(cfg, None).expect("zc starts");
        // From a route's installation to its first packet at the sink: the sender sends one
        // packet per route every ~1 ms, so this is the activation time plus at most that.
        // Measured here: 1–3 ms. The bound is generous for a loaded machine, but a route
        // that waits for anything periodic (a poll timeout, a refresh) fails it.
        let rc = RouteChanges::start(&gw, peers, Some(Duration::from_secs(1)));
        let workers = rc.workers.clone();
        let count = |i: usize| rc.sinks.count(i);
        // What the workers counted received on the forward channel (the XDP program takes
        // the whole media range: routed ports to the workers, the rest dropped and counted
        // in `vgate_noroute`, which worker 0 adds in), and how much of it `no_route`.
        let seen = || -> (u64, u64) {
            workers
                .iter()
                .map(|w| w.channel(Channel::Forward).snapshot())
                .fold((0, 0), |(rx, nr), s| {
                    (
                        rx + s.rx_packets,
                        nr + s.drop_count(vgate::stats::DropReason::NoRoute),
                    )
                })
        };
        rc.assert_nothing_before_a_route(Duration::from_millis(200));
        // Until 100 datagrams to the port without a route were counted (the XDP program's
        // drops, worker 0 adds them at each sample), however slow the sender is here.
        let wait_no_route = |from: u64, by: u64| {
            let until = std::time::Instant::now() + Duration::from_secs(20);
            while seen().1 < from + by && std::time::Instant::now() < until {
                std::thread::sleep(Duration::from_millis(20));
            }
        };
        wait_no_route(0, 100);
        let (rx, no_route) = seen();
        assert!(
            no_route >= 100,
            "the datagrams to a port without a route are counted: {no_route}"
        );
        assert_eq!(no_route, rx, "…as no_route");
        rc.add_first();
        rc.wait_growth(0, 50);

        gw.routes.remove_route(Channel::Forward, A_PORTS).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let (after_remove, seen_after) = (count(0), seen());
        // Until 50 more datagrams to the port were counted no_route: as many as the route
        // would have forwarded.
        wait_no_route(seen_after.1, 50);
        assert_eq!(count(0), after_remove, "a removed route forwards nothing");
        let (rx, no_route) = seen();
        assert!(
            no_route - seen_after.1 >= (rx - seen_after.0) / 2 && rx > seen_after.0,
            "the removed route's port is counted no_route: {seen_after:?} -> {:?}",
            (rx, no_route)
        );

        rc.readd_add_second_and_finish();
        // The XDP program dropped the datagrams for ports without a route itself (they never
        // took the workers' rings); worker 0 adds its count at each sample.
        let in_kernel = noroute_in_kernel(&gw_ns).expect("a vgate_noroute map (bpftool)");
        let counted = || seen().1;
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while counted() < in_kernel && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        let fwd = gw.totals();
        let fwd = fwd.channel(Channel::Forward);
        // Before the first route and while it was removed, every packet for its port was
        // counted no_route (about 1 per ms for ~0.5 s); never a packet forwarded wrongly.
        // Besides the program's drops, only packets already in a ring when the route went
        // are counted by the workers.
        let nr = fwd.drop_count(vgate::stats::DropReason::NoRoute);
        assert!(
            in_kernel >= 100 && nr >= in_kernel,
            "the XDP program drops ports without a route ({in_kernel}) and the workers count them no_route: {fwd:?}"
        );

        // The program's no_route bytes are what the frame holds, not what the sender's UDP
        // length field claims: 10 datagrams of 42 payload bytes claiming 65 527 add 420.
        let counted = || -> (u64, u64) {
            workers
                .iter()
                .map(|w| w.channel(Channel::Forward).snapshot())
                .fold((0, 0), |(n, b), s| {
                    (
                        n + s.drop_count(vgate::stats::DropReason::NoRoute),
                        b + s.rx_bytes,
                    )
                })
        };
        let before = counted();
        std::thread::spawn(move || {
            use nix::sys::socket::{sendto, socket, AddressFamily, MsgFlags, SockFlag};
            use nix::sys::socket::{SockProtocol, SockType, SockaddrIn};
            use std::os::fd::AsRawFd;
            enter_netns(&raw_ns).unwrap_or_else(|e| panic!("setns {raw_ns}: {e}"));
            // The kernel writes the IP header; the UDP header is ours, checksum 0 (none).
            let fd = socket(
                AddressFamily::Inet,
                SockType::Raw,
                SockFlag::empty(),
                SockProtocol::Udp,
            )
            .expect("raw socket");
            let mut d = [0u8; 8 + 42];
            d[0..2].copy_from_slice(&40000u16.to_be_bytes());
            d[2..4].copy_from_slice(&(A_PORTS + 100).to_be_bytes());
            d[4..6].copy_from_slice(&65535u16.to_be_bytes());
            let to = SockaddrIn::from(std::net::SocketAddrV4::new(ga_ip, 0));
            for _ in 0..10 {
                sendto(fd.as_raw_fd(), &d, &to, MsgFlags::empty()).expect("raw send");
            }
        })
        .join()
        .unwrap();
        let until = std::time::Instant::now() + Duration::from_secs(20);
        while counted().0 < before.0 + 10 && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        let after = counted();
        assert_eq!(
            (after.0 - before.0, after.1 - before.1),
            (10, 420),
            "10 datagrams of 42 bytes (UDP length 65 535) counted no_route: {before:?} -> {after:?}"
        );
        drop(gw);
    });
    assert_no_xdp_left(&g_ns);
}

/// Counts, in an nft table of its own in `ns`, the UDP datagrams to `dst` that pass the
/// output hook (sent by the kernel's stack, not AF_XDP). The table goes with the namespace.
fn nft_count_output(ns: &str, dst: Ipv4Addr) {
    let rules = format!(
        "table ip zcfix_out {{\n  chain out {{ type filter hook output priority 0; policy accept;\n    ip daddr {dst} meta l4proto udp counter\n  }}\n}}\n"
    );
    common::nft_apply(ns, &rules);
}

/// The packet count of [`nft_count_output`]'s counter.
fn nft_output_count(ns: &str) -> u64 {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "nft",
            "list",
            "table",
            "ip",
            "zcfix_out",
        ])
        .output()
        .expect("nft list");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut words = text.split_whitespace();
    while let Some(w) = words.next() {
        if w == "packets" {
            return words
                .next()
                .and_then(|n| n.parse().ok())
                .expect("a counter");
        }
    }
    panic!("no counter in {text}");
}

/// The UDP checksum of what zc transmits is right whoever fills it: vgate
/// (`VGATE_AFXDP_TX_CSUM=software`) or the kernel from the frame's TX metadata (default where
/// the kernel honours it in copy mode: veth from Linux 6.11; on older kernels the offload is
/// not granted and the software sum is checked instead). The receivers' kernel drops a datagram whose
/// checksum is wrong and counts it in `Udp InCsumErrors`, so every datagram delivered and no
/// checksum error is the proof — for the offloaded checksum only where the kernel finishes it
/// before the wire: with checksum offload turned off on the gateway's egress veth
/// (`ethtool -K tx off`, as on a NIC without it). With it on (the veth default, and GRO on
/// the receivers' side as on the bench bed) the frame stays `CHECKSUM_PARTIAL` up to the
/// receiver, which is checked for delivery. The engine description says which is in use.
#[test]
fn afxdp_transmit_checksums_are_right_offloaded_or_computed() {
    require!(
        true,
        &[
            ("ip", "iproute2"),
            ("ethtool", "ethtool"),
            ("nft", "nftables"),
        ]
    );
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut v = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let kernel = (v.next().unwrap_or(0), v.next().unwrap_or(0));
    // veth: copy mode honours TX metadata from 6.11 (vgate's rule, see csum_offload_verdict).
    let offload_granted = kernel >= (6, 11);
    if !offload_granted {
        eprintln!(
            "Linux {}: AF_XDP TX checksum offload not granted on veth; the offload runs check the software path",
            release.trim()
        );
    }
    // (VGATE_AFXDP_TX_CSUM, egress veth's tx checksum offload, receivers' GRO)
    for (csum, egress_tx, sink_gro) in [
        ("offload", "off", "off"),
        ("offload", "on", "on"),
        ("software", "on", "off"),
    ] {
        let bed = Bed::up(2);
        let (g_ns, b_ns) = (bed.get("G_NS").to_owned(), bed.get("B_NS").to_owned());
        for (ns, dev, feature, v) in [
            (&g_ns, bed.get("GB_IF"), "tx", egress_tx),
            (&b_ns, bed.get("B_IF"), "gro", sink_gro),
        ] {
            let st = Command::new("ip")
                .args(["netns", "exec", ns, "ethtool", "-K", dev, feature, v])
                .output()
                .unwrap();
            assert!(
                st.status.success(),
                "ethtool -K {dev} {feature} {v}: {st:?}"
            );
        }
        let csum_errors_before = snmp_udp(&b_ns, "InCsumErrors");
        let in_errors_before = snmp_udp(&b_ns, "InErrors");
        let env = format!("VGATE_AFXDP_TX_CSUM={csum}");
        let streams = 8;
        let per_stream = 100;
        let vg = Vgate::start_with(
            &["ip", "netns", "exec", &g_ns, "env", &env],
            &config(&bed, "zc", streams, 9942),
            &["--mode", "zc"],
        );
        let stats = common::admin::get_in(&g_ns, "127.0.0.1:9942", "/api/v1/stats");
        let want = if csum == "offload" && offload_granted {
            "UDP checksum left to the kernel/device (TX metadata)"
        } else {
            "UDP checksum computed in vgate"
        };
        assert!(
            stats.contains(want),
            "{csum}: the engine description says {want:?}: {stats}"
        );
        // What the gateway's kernel sends (the raw-socket fallback while a neighbour
        // resolves) passes its output hook; AF_XDP frames do not.
        nft_count_output(&g_ns, bed.ip("B_IP"));
        let (sent, got) = relay_across(&bed, streams, per_stream);
        let totals = vg.stop();
        let through_kernel = nft_output_count(&g_ns);
        let raw = &totals.raw;
        let csum_errors = snmp_udp(&b_ns, "InCsumErrors") - csum_errors_before;
        let in_errors = snmp_udp(&b_ns, "InErrors") - in_errors_before;
        eprintln!(
            "checksum {csum}, egress tx offload {egress_tx}, receivers' GRO {sink_gro}: sent {sent}, \
             InCsumErrors +{csum_errors}, InErrors +{in_errors}, through the kernel's output {through_kernel}"
        );
        assert_eq!(sent, streams * per_stream);
        assert_eq!(
            totals.channel("forward", "tx_packets"),
            u64::from(sent),
            "every datagram forwarded (on AF_XDP, or the raw socket while the neighbour resolved): {raw}"
        );
        // Only a stream's first packets, while the neighbour resolves, take the raw socket:
        // the checksums checked here are (nearly all) those of AF_XDP frames.
        assert!(
            through_kernel * 2 < u64::from(sent),
            "most datagrams left on AF_XDP, not through the kernel ({through_kernel} of {sent})"
        );
        assert_eq!(csum_errors, 0, "{csum}/{egress_tx}: no checksum errors");
        assert_eq!(in_errors, 0, "{csum}/{egress_tx}: no receive errors");
        check_delivery(&got, per_stream);
    }
}
