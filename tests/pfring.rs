//! The PF_RING engines from the outside: `vgate run` with `--engine pfring` / `pfring-zc`.
//!
//! - Built without the `pfring` feature (the default): both engines exit non-zero saying
//!   vgate was built without PF_RING. Runs anywhere, no privileges.
//! - Built with it (`--features pfring`, libpfring.so on the loader's path): on the
//!   three-namespace bed's 4-queue veths, where `pf_ring.ko` is not loaded (it cannot be on
//!   these machines), `--mode tnapi` — with `--engine pfring` and without `--engine` — and
//!   `--mode zc --engine pfring-zc` fail with the errno-97 sentence naming the device
//!   (`IFACE@0`, `zc:IFACE@0`) and the engine that runs the mode without PF_RING. Needs root
//!   and `ip`; otherwise it says it did not run.

mod common;

use std::process::Command;

use common::vgate_bin;

/// `vgate run` with `args` (through `wrapper`, e.g. `ip netns exec NS`): exit success and
/// stderr.
fn run(wrapper: &[&str], args: &[&str]) -> (bool, String) {
    let bin = vgate_bin();
    let mut cmd = match wrapper.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(&bin);
            c
        }
        None => Command::new(&bin),
    };
    let out = cmd
        .arg("run")
        .args(args)
        .args(["--stats-interval", "0"])
        .output()
        .expect("run vgate");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[cfg(not(feature = "pfring"))]
#[test]
fn without_pfring_the_engines_say_so() {
    for args in [
        ["--mode", "tnapi", "--engine", "pfring"],
        ["--mode", "zc", "--engine", "pfring-zc"],
    ] {
        let (ok, err) = run(&[], &args);
        assert!(!ok, "{args:?} must fail: {err}");
        assert!(err.contains("built without PF_RING"), "{args:?}: {err}");
        assert!(err.contains(args[3]), "{args:?} names the engine: {err}");
    }
}

#[cfg(feature = "pfring")]
#[test]
fn without_the_module_open_fails_with_errno_97() {
    use common::{prerequisites, Bed};
    use std::io::Write;

    const TEST: &str = "without_the_module_open_fails_with_errno_97";
    require!(TEST, true, &[("ip", "iproute2")]);
    if std::path::Path::new("/proc/net/pf_ring").exists() {
        eprintln!("{TEST}: pf_ring.ko is loaded here: this test DID NOT RUN");
        return;
    }
    let (_, probe) = run(&[], &["--mode", "tnapi", "--engine", "pfring"]);
    if probe.contains("libpfring.so not found") {
        common::test_did_not_run(
            TEST,
            &format!("libpfring.so is not on the loader's path: {probe}"),
        );
        return;
    }
    let bed = Bed::up(4);
    let config = bed.config(common::BedConfig {
        mode: "tnapi",
        policy: "",
        control: "127.0.0.1:9941",
        ..Default::default()
    });
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(config.as_bytes()).unwrap();
    let path = file.path().to_str().unwrap().to_owned();
    let ns = format!("{}g", bed.name);
    let wrapper = ["ip", "netns", "exec", ns.as_str()];
    let ga_if = bed.get("GA_IF");
    for (args, device, alternative) in [
        (
            // One worker reads all four queues of the bed's veth (a PF_RING channel list).
            vec!["--config", &path, "--engine", "pfring"],
            format!("{ga_if}@0,1,2,3"),
            "--engine afpacket",
        ),
        // No --engine: a PF_RING build prefers PF_RING, and says what runs without it.
        (
            vec!["--config", &path],
            format!("{ga_if}@0,1,2,3"),
            "--engine afpacket",
        ),
        (
            vec!["--config", &path, "--mode", "zc", "--engine", "pfring-zc"],
            format!("zc:{ga_if}@0"),
            "--engine afxdp",
        ),
    ] {
        let (ok, err) = run(&wrapper, &args);
        assert!(!ok, "{args:?} must fail without pf_ring.ko: {err}");
        assert!(
            err.contains(&format!(
                "cannot open PF_RING device {device}: pf_ring.ko is not loaded (modprobe pf_ring)"
            )),
            "{args:?}: {err}"
        );
        assert!(err.contains("errno 97"), "{args:?}: {err}");
        assert!(err.contains(alternative), "{args:?}: {err}");
    }
}

/// The ZC bed is made by hand (the gateway runs in the root namespace, so it has no `G_NS`):
/// the relay's peers must come from its A and B namespaces alone (they panicked with
/// "testbed.sh printed no G_NS" before the ZC test could send, in the guest of 2026-12-03).
#[test]
fn a_bed_without_a_gateway_namespace_has_peers() {
    use common::relay::Peers;
    let env = [
        ("A_NS", "vgzna"),
        ("B_NS", "vgznb"),
        ("A_IP", "10.201.1.2"),
        ("GA_IP", "10.201.1.1"),
        ("GB_IP", "10.201.2.1"),
        ("B_IP", "10.201.2.2"),
    ];
    let bed = common::Bed {
        name: "vgzn-never-made".to_owned(),
        env: env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    };
    let peers = Peers::of(&bed);
    // Nothing was made: no `testbed.sh down` for it.
    std::mem::forget(bed);
    assert_eq!(
        (peers.a_ns.as_str(), peers.b_ns.as_str()),
        ("vgzna", "vgznb")
    );
    assert_eq!(peers.addrs.0, std::net::Ipv4Addr::new(10, 201, 1, 2));
    assert_eq!(peers.addrs.3, std::net::Ipv4Addr::new(10, 201, 2, 2));
}

/// `--mode zc --engine pfring-zc` on two NICs that a PF_RING ZC driver runs: in the guest of
/// `scripts/pfring-guest.sh`, two emulated e1000e (QEMU `-device e1000e`) under PF_RING's
/// e1000e ZC driver, each joined by a QEMU hub to a virtio NIC that the test moves into a
/// namespace of its own (domain A's sender, domain B's receivers). The gateway runs in the
/// root namespace; a ZC queue takes its NIC from the kernel, so every neighbour is static.
/// Every packet must arrive once, from the gateway's B address and the route's egress port,
/// with the totals exact. The NICs come from `VGATE_ZC_A`, `VGATE_ZC_PA` (A's peer),
/// `VGATE_ZC_B`, `VGATE_ZC_PB`; without them (anywhere but that guest) it says it did not run.
#[cfg(feature = "pfring")]
#[test]
fn zc_forwards_every_packet_once_between_e1000e_nics() {
    use common::relay::{check_delivery, config, relay_across};
    use common::Bed;
    use std::collections::HashMap;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::process::Stdio;
    use std::sync::mpsc;
    use std::time::Duration;

    const TEST: &str = "zc_forwards_every_packet_once_between_e1000e_nics";
    const STREAMS: u32 = 8;
    const PER_STREAM: u32 = 200;
    let nics: Vec<String> = ["VGATE_ZC_A", "VGATE_ZC_PA", "VGATE_ZC_B", "VGATE_ZC_PB"]
        .iter()
        .filter_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()))
        .collect();
    if nics.len() != 4 {
        eprintln!("{TEST}: no ZC NICs given (VGATE_ZC_A/PA/B/PB, set by scripts/pfring-guest.sh): this test DID NOT RUN");
        return;
    }
    let (ga, pa, gb, pb) = (&nics[0], &nics[1], &nics[2], &nics[3]);
    let mac = |i: &str| {
        std::fs::read_to_string(format!("/sys/class/net/{i}/address"))
            .unwrap()
            .trim()
            .to_owned()
    };
    let sh = |args: &[&str]| {
        let st = Command::new(args[0]).args(&args[1..]).status().unwrap();
        assert!(st.success(), "{args:?}");
    };
    let name = format!("vgz{}", std::process::id());
    let (a_ns, b_ns) = (format!("{name}a"), format!("{name}b"));
    // The guard first, so a half-made bed is removed too (testbed.sh down removes the
    // namespaces; the NICs go back to the root namespace).
    let mut env = HashMap::new();
    for (k, v) in [
        ("GA_IF", ga.as_str()),
        ("GB_IF", gb.as_str()),
        ("GA_IP", "10.201.1.1"),
        ("GB_IP", "10.201.2.1"),
        ("A_IP", "10.201.1.2"),
        ("B_IP", "10.201.2.2"),
        ("A_NS", a_ns.as_str()),
        ("B_NS", b_ns.as_str()),
    ] {
        env.insert(k.to_owned(), v.to_owned());
    }
    let bed = Bed {
        name: name.clone(),
        env,
    };
    let (mac_ga, mac_gb, mac_pa, mac_pb) = (mac(ga), mac(gb), mac(pa), mac(pb));
    for (ns, peer, ip, gw_ip, gw_mac) in [
        (&a_ns, pa, "10.201.1.2/24", "10.201.1.1", &mac_ga),
        (&b_ns, pb, "10.201.2.2/24", "10.201.2.1", &mac_gb),
    ] {
        sh(&["ip", "netns", "add", ns]);
        sh(&["ip", "link", "set", peer, "netns", ns]);
        sh(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        sh(&["ip", "-n", ns, "addr", "add", ip, "dev", peer]);
        sh(&["ip", "-n", ns, "link", "set", peer, "up"]);
        sh(&[
            "ip", "-n", ns, "neigh", "replace", gw_ip, "lladdr", gw_mac, "dev", peer,
        ]);
    }
    for (dev, ip, peer_ip, peer_mac) in [
        (ga, "10.201.1.1/24", "10.201.1.2", &mac_pa),
        (gb, "10.201.2.1/24", "10.201.2.2", &mac_pb),
    ] {
        sh(&["ip", "addr", "replace", ip, "dev", dev]);
        sh(&["ip", "link", "set", dev, "up"]);
        sh(&[
            "ip", "neigh", "replace", peer_ip, "lladdr", peer_mac, "dev", dev,
        ]);
    }
    // One queue: the ZC driver runs the emulated 82574 with one RX queue.
    let text = config(&bed, "zc", STREAMS, 9946).replace(
        &format!("queues = {}", common::relay::queues()),
        "queues = 1",
    );
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(text.as_bytes()).unwrap();

    let mut child = Command::new(vgate_bin())
        .args(["run", "--config"])
        .arg(file.path())
        .args(["--engine", "pfring-zc", "--stats-interval", "0"])
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start vgate");
    let (up_tx, up_rx) = mpsc::channel();
    let err = child.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            eprintln!("vgate: {line}");
            if line.contains("vgate running") {
                let _ = up_tx.send(());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    if up_rx.recv_timeout(Duration::from_secs(60)).is_err() {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "vgate --engine pfring-zc did not start: {}",
            log.join().unwrap()
        );
    }
    let (sent, got) = relay_across(&bed, STREAMS, PER_STREAM);
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let st = child.wait().unwrap();
    let mut totals = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut totals)
        .unwrap();
    let log = log.join().unwrap();
    eprintln!("zc: sent {sent}\n{totals}");
    assert!(st.success(), "vgate exited with {st}: {log}");
    assert!(log.contains("engine pfring-zc"), "{log}");
    check_delivery(&got, PER_STREAM);
    common::vgate::Totals::parse(&totals).assert_forwarded_all(sent);
}

/// This process's rings as `/proc/net/pf_ring` lists them (`PID-DEV.ID`).
#[cfg(feature = "pfring")]
fn own_rings() -> Vec<String> {
    let me = format!("{}-", std::process::id());
    std::fs::read_dir("/proc/net/pf_ring")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.starts_with(&me))
                .collect()
        })
        .unwrap_or_default()
}

/// A dropped ring is closed in the kernel at once, not at process exit: found in the guest,
/// libpfring's `pfring_close` unmaps and closes nothing in its default build (see
/// `pfring_sys`'s `release_leftovers`), and a stopped in-process gateway's rings stayed
/// listed. Opens, enables and drops rings on `lo` three times; none may stay.
#[cfg(feature = "pfring")]
#[test]
fn a_dropped_ring_is_closed_at_once() {
    const TEST: &str = "a_dropped_ring_is_closed_at_once";
    if !std::path::Path::new("/proc/net/pf_ring").exists() {
        // (The guest check runs this suite before and after loading it.)
        eprintln!("{TEST}: pf_ring.ko is not loaded here: this test DID NOT RUN");
        return;
    }
    let lib = pfring_sys::Library::load().expect("libpfring.so loads");
    for round in 0..3 {
        let mut ring = pfring_sys::Ring::open(&lib, "lo", 1600, 0).expect("lo opens");
        ring.enable().expect("enable");
        let listed = own_rings();
        assert_eq!(
            listed.len(),
            1,
            "round {round}: the open ring is listed: {listed:?}"
        );
        drop(ring);
        let left = own_rings();
        assert!(
            left.is_empty(),
            "round {round}: rings left after drop: {left:?}"
        );
    }
}
