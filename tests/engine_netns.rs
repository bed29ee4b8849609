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

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use common::relay::*;
use common::{in_netns, prerequisites, vgate_bin, Bed};

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

fn vgate_tables(ns: &str) -> Vec<String> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "list", "tables"])
        .output()
        .expect("nft list tables");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("vgate_"))
        .map(str::to_owned)
        .collect()
}

/// The vgate process; killed on drop if it is still running (a failed test).
struct Vgate {
    child: Child,
    stderr: Arc<std::sync::Mutex<String>>,
}

impl Vgate {
    /// Starts `vgate run` in namespace `ns` and waits for its "running" line.
    fn start(ns: &str, config: &std::path::Path, mode: &str) -> Vgate {
        let mut child = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(vgate_bin())
            .args(["run", "--config"])
            .arg(config)
            .args(["--mode", mode, "--stats-interval", "0"])
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start vgate");
        let stderr = Arc::new(std::sync::Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let err = child.stderr.take().unwrap();
        let log = Arc::clone(&stderr);
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                {
                    let mut l = log.lock().unwrap();
                    l.push_str(&line);
                    l.push('\n');
                }
                if line.contains("vgate running") {
                    let _ = tx.send(());
                }
            }
        });
        let mut v = Vgate { child, stderr };
        if rx.recv_timeout(Duration::from_secs(20)).is_err() {
            let _ = v.child.kill();
            let _ = v.child.wait();
            std::thread::sleep(Duration::from_millis(100));
            panic!("vgate did not start: {}", v.log());
        }
        v
    }

    fn log(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// SIGTERM, then its stdout (the totals).
    fn stop(mut self) -> String {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                assert!(st.success(), "vgate exited with {st}: {}", self.log());
                break;
            }
            assert!(Instant::now() < deadline, "vgate did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut out = String::new();
        self.child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        out
    }
}

impl Drop for Vgate {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One full run of the binary in `mode` on a fresh bed.
fn relay_run(mode: &str) {
    let bed = Bed::up(4);
    let g_ns = bed.get("G_NS").to_owned();
    let dir = tempfile::tempdir().unwrap();
    let cfg_path = dir.path().join("vgate.toml");
    std::fs::write(&cfg_path, config(&bed, mode, STREAMS, 9940)).unwrap();
    let noports_before = snmp_noports(&g_ns);

    let vg = Vgate::start(&g_ns, &cfg_path, mode);
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

    let done = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = mpsc::channel();
    let rx = receiver(
        bed.get("B_NS").into(),
        bed.ip("B_IP"),
        bed.ip("GB_IP"),
        STREAMS,
        Arc::clone(&done),
        ready_tx,
    );
    ready_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("receivers bound");
    let t0 = Instant::now();
    let tx = sender(
        bed.get("A_NS").into(),
        bed.ip("A_IP"),
        bed.ip("GA_IP"),
        STREAMS,
        PER_STREAM,
    );
    let sent = tx.join().expect("sender");
    let send_time = t0.elapsed();
    done.store(true, Relaxed);
    let got = rx.join().expect("receiver");
    let totals = vg.stop();
    eprintln!("{mode}: sent {sent} in {send_time:?}\n{totals}");

    assert_eq!(sent, STREAMS * PER_STREAM);
    check_delivery(&got, PER_STREAM);

    let fwd = totals
        .lines()
        .find(|l| l.starts_with("total channel=forward"))
        .map(kv)
        .expect("forward total");
    assert_eq!(num(&fwd, "tx_packets"), u64::from(sent), "{totals}");
    assert!(
        !fwd.keys().any(|k| k.starts_with("drop_")),
        "no drops: {totals}"
    );
    let busy_workers = totals
        .lines()
        .filter(|l| l.starts_with("worker_channel ") && l.contains("channel=forward"))
        .map(kv)
        .filter(|m| num(m, "tx_packets") > 0)
        .count();
    if queues() >= 2 {
        assert!(busy_workers >= 2, "at least two queues worked: {totals}");
    } else {
        common::part_did_not_run(
            &format!("relay {mode}"),
            "one CPU: whether two queues both worked",
        );
    }
    let routes: Vec<_> = totals
        .lines()
        .filter(|l| l.starts_with("route name="))
        .map(kv)
        .collect();
    assert_eq!(routes.len(), STREAMS as usize);
    for r in &routes {
        assert_eq!(num(r, "tx_packets"), u64::from(PER_STREAM), "{r:?}");
        assert_eq!(num(r, "rtp_lost"), 0, "{r:?}");
    }
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

#[test]
fn tnapi_relays_every_packet_once_over_the_queues() {
    if !prerequisites(
        "tnapi_relays_every_packet_once_over_the_queues",
        true,
        NEEDS,
    ) {
        return;
    }
    relay_run("tnapi");
}

#[test]
fn stack_relays_every_packet_once_over_the_queues() {
    if !prerequisites(
        "stack_relays_every_packet_once_over_the_queues",
        true,
        NEEDS,
    ) {
        return;
    }
    relay_run("stack");
}

/// A crashed run's table (same config, so same name) is replaced, and removed at exit.
#[test]
fn tnapi_replaces_a_stale_table_and_refuses_what_it_cannot_run() {
    if !prerequisites(
        "tnapi_replaces_a_stale_table_and_refuses_what_it_cannot_run",
        true,
        NEEDS,
    ) {
        return;
    }
    let bed = Bed::up(4);
    let g_ns = bed.get("G_NS").to_owned();
    let cfg = vgate::config::parse(&config(&bed, "tnapi", 0, 9940), "test").unwrap();
    let table = format!("vgate_{}", vgate::engine::tnapi::instance_name(&cfg));
    let st = Command::new("ip")
        .args([
            "netns", "exec", &g_ns, "nft", "add", "table", "inet", &table,
        ])
        .status()
        .unwrap();
    assert!(st.success());
    let report = in_netns(&g_ns, move || {
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
            assert!(
                left.is_empty(),
                "rings left open after the gateway stopped: {left:?}"
            );
        }
        let mut bad = cfg.clone();
        bad.domains[0].interface = "vgnosuch0".into();
        let e1 = vgate::gateway::Gateway::start(bad, None)
            .err()
            .unwrap()
            .to_string();
        let mut lo = cfg;
        lo.domains[0].interface = "lo".into();
        lo.engine.queues = 2;
        lo.engine.cpus = vec![0, 1];
        // (Two queues need two CPUs; on one CPU this check does not run, and says so.)
        let e2 = (queues() >= 2).then(|| {
            vgate::gateway::Gateway::start(lo, None)
                .err()
                .unwrap()
                .to_string()
        });
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
    if !prerequisites(
        "tnapi_route_changes_take_effect_while_traffic_flows",
        true,
        NEEDS,
    ) {
        return;
    }
    use vgate::config::DomainId;
    use vgate::routes::{Channel, SessionKind};

    let bed = Bed::up(4);
    let g_ns = bed.get("G_NS").to_owned();
    let (a_ns, b_ns) = (bed.get("A_NS").to_owned(), bed.get("B_NS").to_owned());
    let (a_ip, ga_ip, gb_ip, b_ip) = addrs(&bed);
    let cfg = vgate::config::parse(&config(&bed, "tnapi", 0, 9940), "test").unwrap();
    in_netns(&g_ns, move || {
        let gw = vgate::gateway::Gateway::start(cfg, None).expect("tnapi starts");
        let workers = gw.worker_stats();
        let stop = Arc::new(AtomicBool::new(false));
        let sinks = Sinks::start(b_ns, b_ip, gb_ip, 2);
        // One sender per gateway port, 1 packet per ms each, until stopped.
        let tx = paced_senders(a_ns, a_ip, ga_ip, 2, Arc::clone(&stop));
        let count = |i: usize| sinks.count(i);
        let wait_growth = |i: usize, by: u64| {
            let (first, all) = sinks.wait_growth(i, by, Duration::from_secs(10));
            eprintln!("route {i}: first packet after {first:?}, {by} packets after {all:?}");
        };
        let spec = |i: u16| route_spec(i, b_ip);
        let s = gw.routes.open_session(SessionKind::Admin, "test");
        for (d, p) in [(DomainId::A, A_PORTS), (DomainId::B, B_PORTS)] {
            gw.routes.reserve_port(s, d, p).unwrap();
        }
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(count(0), 0, "nothing forwarded before a route exists");
        gw.routes.add_route(s, spec(0)).unwrap();
        wait_growth(0, 50);

        gw.routes.remove_route(Channel::Forward, A_PORTS).unwrap();
        // In-flight blocks (≤ 2 ms timeout) drain, then nothing more.
        std::thread::sleep(Duration::from_millis(100));
        let after_remove = count(0);
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(count(0), after_remove, "a removed route forwards nothing");

        gw.routes.add_route(s, spec(0)).unwrap();
        wait_growth(0, 50);

        // A route on ports opened now: its egress socket reaches the workers by command.
        let s2 = gw.routes.open_session(SessionKind::Admin, "second");
        gw.routes
            .reserve_port(s2, DomainId::A, A_PORTS + 2)
            .unwrap();
        gw.routes
            .reserve_port(s2, DomainId::B, B_PORTS + 2)
            .unwrap();
        gw.routes.add_route(s2, spec(1)).unwrap();
        wait_growth(1, 50);
        wait_growth(0, 20);

        stop.store(true, Relaxed);
        tx.join().unwrap();
        sinks.finish();
        assert!(
            workers.iter().all(|w| !w.exited.load(Relaxed)),
            "no worker restarted or stopped"
        );
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
