//! Operating the appliance: the systemd units verify, the example appliance config checks,
//! the NIC setup script's dry run changes nothing and its real run applies on a multi-queue
//! veth, and `vgate stats` in a real terminal (tmux) shows live rates.

mod common;

use std::net::UdpSocket;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::proc::run_ok;
use common::vgate::{assert_success, check_config, check_config_file, Vgate};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn systemd_units_verify() {
    require!(false, &[("systemd-analyze", "systemd")]);
    let dir = tempfile::tempdir().unwrap();
    let bin = common::vgate_bin();
    let unit = std::fs::read_to_string(repo().join("systemd/vgate.service"))
        .unwrap()
        .replace("/usr/bin/vgate", bin.to_str().unwrap())
        .replace(
            "/etc/vgate/vgate.toml",
            repo().join("systemd/vgate.toml").to_str().unwrap(),
        );
    std::fs::write(dir.path().join("vgate.service"), unit).unwrap();
    let nic = std::fs::read_to_string(repo().join("systemd/vgate-nic-setup.service"))
        .unwrap()
        .replace(
            "/usr/lib/vgate/nic-setup.sh",
            repo().join("scripts/nic-setup.sh").to_str().unwrap(),
        )
        .replace("/etc/vgate/nic.env", "/dev/null");
    std::fs::write(dir.path().join("vgate-nic-setup.service"), nic).unwrap();
    let ha = std::fs::read_to_string(repo().join("systemd/vgate-ha-health.service"))
        .unwrap()
        .replace("/usr/bin/vgate", bin.to_str().unwrap())
        .replace(
            "/etc/vgate/vgate.toml",
            repo().join("systemd/vgate.toml").to_str().unwrap(),
        );
    std::fs::write(dir.path().join("vgate-ha-health.service"), ha).unwrap();
    run_ok(
        Command::new("systemd-analyze")
            .arg("verify")
            .arg(dir.path().join("vgate.service"))
            .arg(dir.path().join("vgate-nic-setup.service"))
            .arg(dir.path().join("vgate-ha-health.service")),
        "systemd-analyze verify",
    );
    // Every directive of the main unit's [Service] section carries a comment saying why.
    let text = std::fs::read_to_string(repo().join("systemd/vgate.service")).unwrap();
    let service = text
        .split("[Service]")
        .nth(1)
        .unwrap()
        .split("[Install]")
        .next()
        .unwrap();
    let mut commented = false;
    for line in service.lines() {
        if line.starts_with('#') {
            commented = true;
        } else if line.trim().is_empty() {
            commented = false;
        } else {
            assert!(commented, "no comment says why for: {line}");
        }
    }
}

/// The example keepalived config of a hot-standby pair passes `keepalived -t`, in a namespace
/// that has its two interfaces (eth1, eth2), with this build's vgate as the scripts.
#[test]
fn example_keepalived_config_checks() {
    require!(true, &[("keepalived", "keepalived"), ("ip", "iproute2")]);
    let ns = format!("vgkt{}", std::process::id());
    struct Gone(String);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        }
    }
    let ip = |args: &[&str]| {
        let st = Command::new("ip").args(args).status().unwrap();
        assert!(st.success(), "ip {args:?}");
    };
    ip(&["netns", "add", &ns]);
    let _gone = Gone(ns.clone());
    ip(&[
        "-n", &ns, "link", "add", "eth1", "type", "veth", "peer", "name", "eth2",
    ]);
    let dir = tempfile::tempdir().unwrap();
    let conf = std::fs::read_to_string(repo().join("systemd/keepalived-vgate.conf"))
        .unwrap()
        .replace("/usr/bin/vgate", common::vgate_bin().to_str().unwrap());
    let path = dir.path().join("keepalived.conf");
    std::fs::write(&path, conf).unwrap();
    run_ok(
        Command::new("ip")
            .args(["netns", "exec", &ns, "keepalived", "-t", "-l", "-f"])
            .arg(&path),
        "keepalived -t of systemd/keepalived-vgate.conf",
    );
}

#[test]
fn example_appliance_config_checks() {
    let out = check_config_file(&repo().join("systemd/vgate.toml"), &["--cpus", "4"]);
    assert_success(&out);
    // On a 2-CPU machine the same file names the problem.
    let out = check_config_file(&repo().join("systemd/vgate.toml"), &["--cpus", "2"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("engine.cpus"));
}

#[test]
fn example_half_configs_check() {
    for (half, face) in [
        ("a", "domain b is the link face"),
        ("b", "domain a is the link face"),
    ] {
        let file = repo().join(format!("systemd/vgate-half-{half}.toml"));
        let out = check_config_file(&file, &["--cpus", "2"]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_success(&out);
        assert!(
            stdout.contains(&format!("split half {half}: {face}")),
            "{stdout}"
        );
    }
}

/// A namespace with a 4-queue veth pair, removed on drop.
struct Ns(String);

impl Ns {
    fn new() -> Ns {
        let name = format!("vgnic{}", std::process::id());
        assert!(Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .unwrap()
            .success());
        let ns = Ns(name);
        let ok = Command::new("ip")
            .args([
                "-n",
                &ns.0,
                "link",
                "add",
                "nica",
                "numrxqueues",
                "4",
                "numtxqueues",
                "4",
                "type",
                "veth",
            ])
            .args([
                "peer",
                "name",
                "nicb",
                "numrxqueues",
                "4",
                "numtxqueues",
                "4",
            ])
            .status()
            .unwrap();
        assert!(ok.success());
        ns
    }

    fn exec(&self, args: &[&str]) -> std::process::Output {
        Command::new("ip")
            .args(["netns", "exec", &self.0])
            .args(args)
            .output()
            .unwrap()
    }

    fn rx_queues(&self, ifc: &str) -> String {
        let out = String::from_utf8_lossy(&self.exec(&["ethtool", "-l", ifc]).stdout).to_string();
        let current = out
            .split("Current hardware settings:")
            .nth(1)
            .unwrap_or("")
            .to_string();
        current
            .lines()
            .find(|l| l.starts_with("RX:"))
            .unwrap_or("")
            .split_whitespace()
            .nth(1)
            .unwrap_or("")
            .to_string()
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

#[test]
fn nic_setup_dry_run_then_real_run_on_veth() {
    require!(true, &[("ip", "iproute2"), ("ethtool", "ethtool")]);
    let ns = Ns::new();
    let script = repo().join("scripts/nic-setup.sh");
    let script = script.to_str().unwrap();
    assert_eq!(ns.rx_queues("nica"), "4");
    let dry = ns.exec(&[
        "bash",
        script,
        "--dry-run",
        "--queues",
        "2",
        "--cpus",
        "0 1",
        "nica",
        "nicb",
    ]);
    assert!(
        dry.status.success(),
        "{}",
        String::from_utf8_lossy(&dry.stderr)
    );
    let text = String::from_utf8_lossy(&dry.stdout);
    for cmd in [
        "+ ethtool -L nica rx 2 tx 2",
        "+ ethtool -N nica rx-flow-hash udp4 sdfn",
        "+ ethtool -G nicb rx 4096 tx 4096",
    ] {
        assert!(
            text.contains(cmd),
            "dry run does not print {cmd:?}:\n{text}"
        );
    }
    assert!(text.contains("dry run: nothing changed"));
    assert_eq!(ns.rx_queues("nica"), "4", "the dry run changed nothing");

    let real = ns.exec(&[
        "bash", script, "--queues", "2", "--cpus", "0 1", "nica", "nicb",
    ]);
    assert!(
        real.status.success(),
        "{}",
        String::from_utf8_lossy(&real.stderr)
    );
    assert_eq!(ns.rx_queues("nica"), "2");
    assert_eq!(ns.rx_queues("nicb"), "2");
    // veth cannot hash UDP by port or size rings: said as a warning, not an error.
    assert!(String::from_utf8_lossy(&real.stderr).contains("warning: nica UDP 4-tuple hashing"));

    let bad = ns.exec(&["bash", script, "--queues", "2", "--cpus", "0", "nica"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("one CPU per queue"));
}

#[test]
fn stats_in_a_terminal_shows_live_rates() {
    require!(false, &[("tmux", "tmux")]);
    let net = 12;
    let cfg = common::vgate::loopback_with(net, 9942, 1000, &[], &[])
        + &format!(
            r#"[[stream_route]]
name = "cam"
domain = "a"
port = 20000
destination = "127.0.{net}.2:40000"
[security]
source_validation = "latch"
"#
        );
    let vg = Vgate::start(&cfg);
    let session = format!("vgstats{}", std::process::id());
    let cmd = format!(
        "{} stats --admin 127.0.{net}.1:9942",
        common::vgate_bin().display()
    );
    let started = Command::new("tmux")
        .args([
            "new-session",
            "-d",
            "-s",
            &session,
            "-x",
            "120",
            "-y",
            "40",
            &cmd,
        ])
        .status()
        .unwrap();
    assert!(started.success());
    struct Kill(String);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = Command::new("tmux")
                .args(["kill-session", "-t", &self.0])
                .status();
        }
    }
    let _kill = Kill(session.clone());
    let src = UdpSocket::bind(format!("127.0.{net}.1:0")).unwrap();
    let _sink = UdpSocket::bind(format!("127.0.{net}.2:40000")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut screen = String::new();
    // RTP version 2 (a latch route latches only on RTP).
    let mut rtp = [0u8; 200];
    rtp[0] = 0x80;
    while Instant::now() < deadline {
        for _ in 0..20 {
            src.send_to(&rtp, (format!("127.0.{net}.1"), 20000))
                .unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
        let out = Command::new("tmux")
            .args(["capture-pane", "-p", "-t", &session])
            .output()
            .unwrap();
        screen = String::from_utf8_lossy(&out.stdout).to_string();
        let rate = screen
            .lines()
            .find(|l| l.starts_with("forward"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
        if rate > 0.0 {
            assert!(
                screen.contains("WORKER") && screen.contains("healthy"),
                "{screen}"
            );
            drop(vg);
            return;
        }
    }
    panic!("vgate stats never showed a forwarding rate; last screen:\n{screen}");
}

/// A half in mode tnapi or zc builds the link's frames itself: check-config (on the machine
/// that runs it) refuses an outgoing link interface this host does not have, at its line;
/// with `--cpus` (checking for another machine) the host is not looked at.
#[test]
fn check_config_refuses_an_engine_family_link_on_a_missing_interface() {
    let text = std::fs::read_to_string(repo().join("systemd/vgate-half-a.toml")).unwrap();
    let cfg = text.replace("mode = \"stack\"", "mode = \"tnapi\"");
    assert_ne!(cfg, text, "the example sets mode = \"stack\"");
    let start = cfg.find("[split.out_link]").unwrap();
    let at = start + cfg[start..].find("interface = \"").unwrap() + "interface = \"".len();
    let end = at + cfg[at..].find('"').unwrap();
    let cfg = format!("{}vgnosuchif0{}", &cfg[..at], &cfg[end..]);
    let line = cfg[..at].lines().count();
    let out = check_config(&cfg, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(":{line}:"))
            && stderr.contains("split.out_link.interface")
            && stderr.contains("vgnosuchif0"),
        "{stderr}"
    );
    assert_success(&check_config(&cfg, &["--cpus", "2"]));
}

/// A half whose media links have no `key` (every config from before link keys) is still
/// accepted, with a warning that names the links; the example, keyed, gets none.
#[test]
fn check_config_warns_of_an_unauthenticated_link() {
    let text = std::fs::read_to_string(repo().join("systemd/vgate-half-a.toml")).unwrap();
    let keyed = check_config(&text, &["--cpus", "2"]);
    assert_success(&keyed);
    assert!(
        !String::from_utf8_lossy(&keyed.stderr).contains("without key"),
        "{}",
        String::from_utf8_lossy(&keyed.stderr)
    );
    let key = "key = \"8899aabbccddeeff00112233445566778899aabbccddeeff0011223344556677\"\n";
    let old = text.replacen(key, "", 1);
    assert_ne!(old, text, "the example keys its outgoing link");
    let out = check_config(&old, &["--cpus", "2"]);
    assert_success(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("warning: split.out_link without key: its frames are not authenticated"),
        "{stderr}"
    );
}

/// `vgate demo` is the first thing a newcomer runs: its screen must read as live lines and a
/// report, not as a log. No per-route `route started` lines, no `session ended` line listing
/// every route, no line a terminal has to wrap many times over. (Loopback, no privileges.)
#[test]
fn demo_screen_has_live_lines_and_a_report_not_route_logs() {
    let out = Command::new(common::vgate_bin())
        .args(["demo", "--streams", "20", "--duration", "2"])
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "vgate demo failed:\n{stdout}{stderr}");
    let screen = format!("{stderr}{stdout}");
    for spam in ["route started", "session ended"] {
        assert!(
            !screen.contains(spam),
            "the demo's screen has `{spam}` log lines:\n{screen}"
        );
    }
    let longest = screen.lines().map(|l| l.chars().count()).max().unwrap_or(0);
    assert!(
        longest <= 300,
        "a line of {longest} characters on the demo's screen:\n{screen}"
    );
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("offered") && l.contains("loss")),
        "no live line:\n{stderr}"
    );
    assert!(
        stdout.contains("vgate demo: 20 streams") && stdout.contains("lost"),
        "no report:\n{stdout}"
    );
    // The lines stay for whoever asks for them.
    let out = Command::new(common::vgate_bin())
        .args(["demo", "--streams", "2", "--duration", "1", "--quiet"])
        .env("RUST_LOG", "debug")
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("route started"),
        "RUST_LOG=debug no longer shows the route lines"
    );
}

/// One SIP port per side: the example's pair (gb-up and gb-down both on 5060, no
/// upstream_port) checks, and a real conflict — a second route listening on gb-down's port —
/// is refused at its line with what to change.
#[test]
fn check_config_accepts_sip_routes_sharing_5060_and_explains_a_real_conflict() {
    let text = std::fs::read_to_string(repo().join("systemd/vgate.toml")).unwrap();
    assert!(
        text.contains("name = \"gb-down\"") && !text.contains("upstream_port ="),
        "the example's pair shares 5060 on both sides"
    );
    assert_success(&check_config(&text, &["--cpus", "4"]));
    let twin = "\n[[signaling_route]]\nname = \"gb-down2\"\ntype = \"sip\"\ntransport = \"udp\"\nlisten_domain = \"b\"\nlisten_port = 5060\nupstream = \"10.10.0.21:5060\"\nupstream_port = 5062\n";
    let cfg = format!("{text}{twin}");
    let out = check_config(&cfg, &["--cpus", "4"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("listen_port")
            && stderr.contains("two listen faces on one socket cannot be told apart")
            && stderr.contains("give this route its own listen_port"),
        "{stderr}"
    );
}

/// The channel bench's provenance lines (revision, uncommitted files) outside a git checkout,
/// as in the guest of `scripts/pfring-guest.sh` (a copied tree, no git): they must say
/// "unknown", not end the bench. Under `set -euo pipefail` the failing `git status` in a
/// pipeline stopped `bench-channel.sh` silently right after its start (guest, 2026-12-03).
#[test]
fn bench_channel_provenance_outside_a_git_checkout() {
    let script = std::fs::read_to_string(repo().join("scripts/bench-channel.sh")).unwrap();
    let lines: Vec<&str> = script
        .lines()
        .filter(|l| l.starts_with("REV=") || l.starts_with("DIRTY="))
        .collect();
    assert_eq!(
        lines.len(),
        2,
        "bench-channel.sh sets REV and DIRTY once each"
    );
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "set -euo pipefail; ROOT=\"$1\"; {}; echo \"rev=$REV dirty=$DIRTY\"",
            lines.join("; ")
        ))
        .arg("bash")
        .arg(dir.path())
        .env("GIT_CEILING_DIRECTORIES", dir.path().parent().unwrap())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}: {stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.trim(), "rev=unknown dirty=unknown");
}

/// `scripts/pfring-guest.sh` reads the guest's verdict from the serial console, whose lines
/// end in CR LF: `VGATE-GUEST-RESULT pass` must read as `pass` (it read `pass\r`, and the
/// script said "the guest printed no result" after a whole run, 2026-12-03).
#[test]
fn pfring_guest_reads_the_result_of_a_serial_console() {
    let script = std::fs::read_to_string(repo().join("scripts/pfring-guest.sh")).unwrap();
    let line = script
        .lines()
        .find(|l| l.starts_with("result=\"$(grep -a '^VGATE-GUEST-RESULT "))
        .expect("pfring-guest.sh reads VGATE-GUEST-RESULT");
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("console.log");
    std::fs::write(&log, "VGATE-GUEST PASS x\r\nVGATE-GUEST-RESULT pass\r\n").unwrap();
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "set -euo pipefail; LOG=\"$1\"; {line}; printf '%s' \"$result\""
        ))
        .arg("bash")
        .arg(&log)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "pass");
}

/// `scripts/qemu-accel.sh` (the guest check's accelerator): KVM when a probe boot of the
/// guest kernel under KVM reaches its "Kernel panic" (no root file system), else TCG with a
/// message; `--accel kvm` fails instead of falling back. QEMU here is a stand-in that prints
/// what a real one does: the panic, QEMU 7.2's death on MSR 0x10a (`-cpu host` with
/// arch-capabilities on this host's KVM), or nothing.
#[test]
fn pfring_guest_uses_kvm_when_it_boots_the_kernel_else_tcg() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let kvm = dir.path().join("kvm");
    std::fs::write(&kvm, "").unwrap();
    std::fs::write(
        bin.join("qemu-system-x86_64"),
        "#!/bin/bash\necho \"$*\" >>\"$QEMU_ARGS\"\ncase \"$FAKE\" in\n\
         panic) printf 'Linux version 6.1\\r\\nKernel panic - not syncing: VFS\\r\\n' ;;\n\
         msr) echo 'qemu-system-x86_64: error: failed to set MSR 0x10a to 0x...' >&2; exit 1 ;;\n\
         esac\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        bin.join("qemu-system-x86_64"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let script = repo().join("scripts/qemu-accel.sh");
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let run = |want: &str, fake: &str, dev: &Path| {
        let args = dir.path().join(format!("args-{want}-{fake}"));
        let out = Command::new("bash")
            .arg("-c")
            .arg("set -euo pipefail; . \"$1\"; qemu_accel \"$2\" /boot/vmlinuz-x || exit 3; echo \"$ACCEL_USED ${QEMU_ACCEL[*]}\"")
            .arg("bash")
            .arg(&script)
            .arg(want)
            .env("PATH", &path)
            .env("FAKE", fake)
            .env("KVM_DEV", dev)
            .env("QEMU_ARGS", &args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
            std::fs::read_to_string(&args).unwrap_or_default(),
        )
    };
    let (rc, used, _, probe) = run("auto", "panic", &kvm);
    assert_eq!(rc, Some(0));
    assert_eq!(used, "kvm -accel kvm -cpu host,-arch-capabilities");
    assert!(
        probe.contains("-accel kvm -cpu host,-arch-capabilities")
            && probe.contains("-kernel /boot/vmlinuz-x"),
        "{probe}"
    );
    let (rc, used, err, _) = run("auto", "msr", &kvm);
    assert_eq!(rc, Some(0));
    assert_eq!(used, "tcg -accel tcg -cpu max");
    assert!(
        err.contains("KVM did not boot the guest kernel")
            && err.contains("MSR 0x10a")
            && err.contains("using TCG"),
        "{err}"
    );
    let (rc, _, err, _) = run("kvm", "msr", &kvm);
    assert_eq!(rc, Some(3), "--accel kvm does not fall back: {err}");
    assert!(err.contains("--accel kvm"), "{err}");
    let (rc, used, err, _) = run("auto", "panic", &dir.path().join("no-kvm"));
    assert_eq!((rc, used.as_str()), (Some(0), "tcg -accel tcg -cpu max"));
    assert!(err.contains("no usable"), "{err}");
    let (rc, used, _, probe) = run("tcg", "panic", &kvm);
    assert_eq!((rc, used.as_str()), (Some(0), "tcg -accel tcg -cpu max"));
    assert_eq!(probe, "", "no probe when TCG is asked for");
}
