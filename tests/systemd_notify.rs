//! systemd for real: vgate run under a `NOTIFY_SOCKET` this test listens on. `READY=1` comes
//! only once every worker receives (health is 200 and a packet crosses at that moment);
//! `WATCHDOG=1` pings come while every worker is alive and stop while one is stuck (its
//! thread stopped with PTRACE_INTERRUPT), then resume; the unit's `ExecReload` command
//! fails on a rejected config and succeeds on a good one, with `RELOADING=1` then `READY=1`.

mod common;

use std::net::UdpSocket;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::vgate::Vgate;
use nix::unistd::Pid;

const NET: u8 = 32;

fn config(extra_route: bool) -> String {
    let mut c = common::vgate::loopback_config(NET, &[], &[])
        + "[security]\nsource_validation = \"latch\"\n"
        + &common::vgate::loopback_cam_route(NET);
    if extra_route {
        c.push_str(&format!(
            "[[stream_route]]\nname = \"cam2\"\ndomain = \"a\"\nport = 20002\ndestination = \"127.0.{NET}.2:40002\"\negress_port = 30002\n"
        ));
    }
    c
}

/// An RTP packet (version 2, PT 96) carrying `payload`.
fn rtp(payload: &[u8]) -> Vec<u8> {
    let mut p = vec![0x80, 96, 0, 1, 0, 0, 0, 0, 0, 0, 0x12, 0x34];
    p.extend_from_slice(payload);
    p
}

/// The notify socket: every datagram vgate sends, one message per call.
struct Notify {
    sock: UnixDatagram,
}

impl Notify {
    /// Waits for a message containing `needle`; returns it, or None after `within`.
    fn wait_for(&self, needle: &str, within: Duration) -> Option<String> {
        let deadline = Instant::now() + within;
        while let Some(msg) = self.recv_until(deadline)? {
            if msg.lines().any(|l| l == needle || l.starts_with(needle)) {
                return Some(msg);
            }
        }
        None
    }

    /// `RELOADING=1`, then `READY=1` after `what`, each within 10 s (panics otherwise).
    fn reloading_then_ready(&self, what: &str) {
        self.wait_for("RELOADING=1", Duration::from_secs(10))
            .unwrap_or_else(|| panic!("RELOADING=1 before {what}"));
        self.wait_for("READY=1", Duration::from_secs(10))
            .unwrap_or_else(|| panic!("READY=1 after {what}"));
    }

    /// Every message that arrives within `d`.
    fn collect(&self, d: Duration) -> Vec<String> {
        let mut out = Vec::new();
        let deadline = Instant::now() + d;
        while Instant::now() < deadline {
            if let Some(Some(msg)) = self.recv_until(deadline) {
                out.push(msg);
            }
        }
        out
    }

    /// The next message before `deadline`: `Some(Some(msg))`, `Some(None)` once the deadline
    /// passed, `None` when the receive failed (nothing came in time).
    fn recv_until(&self, deadline: Instant) -> Option<Option<String>> {
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            return Some(None);
        };
        self.sock
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        let mut buf = [0u8; 4096];
        let n = self.sock.recv(&mut buf).ok()?;
        Some(Some(String::from_utf8_lossy(&buf[..n]).to_string()))
    }
}

fn health() -> u16 {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    agent
        .get(&format!("http://127.0.{NET}.1:9941/api/v1/health"))
        .call()
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}

/// The thread id of worker `vgate-w0` of process `pid`.
fn worker_tid(pid: u32) -> Pid {
    for e in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if comm.trim() == "vgate-w0" {
            return Pid::from_raw(e.file_name().to_str().unwrap().parse().unwrap());
        }
    }
    panic!("no thread vgate-w0 in process {pid}");
}

/// The `ExecReload=` command of the repository's unit, for this binary and config.
fn exec_reload(config: &Path) -> Vec<String> {
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/vgate.service"),
    )
    .unwrap();
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecReload="))
        .expect("the unit has ExecReload=");
    line.replace("/usr/bin/vgate", common::vgate_bin().to_str().unwrap())
        .replace("/etc/vgate/vgate.toml", config.to_str().unwrap())
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

#[test]
fn ready_after_workers_receive_watchdog_while_healthy_reload_fails_on_bad_config() {
    // Stopping a thread of another process needs ptrace rights: root (or a parent under
    // Yama scope 1, which the `env` wrapper is not).
    require!(true, &[("env", "coreutils")]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify");
    let notify = Notify {
        sock: UnixDatagram::bind(&path).unwrap(),
    };
    let socket_env = format!("NOTIFY_SOCKET={}", path.display());
    // A 1 s watchdog: vgate pings every 0.5 s.
    let mut vg = Vgate::start_with(
        &["env", &socket_env, "WATCHDOG_USEC=1000000"],
        &config(false),
        &[],
    );
    let ready = notify
        .wait_for("READY=1", Duration::from_secs(30))
        .expect("READY=1 once the workers receive");
    assert!(ready.contains("STATUS=forwarding"), "{ready}");
    // At READY=1 every worker is receiving: health is green and a packet crosses now.
    assert_eq!(health(), 200);
    let rx = UdpSocket::bind(format!("127.0.{NET}.2:40000")).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let tx = UdpSocket::bind(format!("127.0.{NET}.1:0")).unwrap();
    tx.send_to(&rtp(b"first packet"), format!("127.0.{NET}.1:20000"))
        .unwrap();
    let mut buf = [0u8; 64];
    let (n, _) = rx
        .recv_from(&mut buf)
        .expect("forwarded right after READY=1");
    assert_eq!(&buf[..n], rtp(b"first packet"));

    // Healthy: pings keep coming.
    for _ in 0..3 {
        notify
            .wait_for("WATCHDOG=1", Duration::from_secs(10))
            .expect("WATCHDOG=1 while every worker is alive");
    }

    // A stuck worker: its thread stopped. Once vgate sees the stale heartbeat (health 503)
    // no ping may come while it stays stuck.
    let tid = worker_tid(vg.pid());
    nix::sys::ptrace::seize(tid, nix::sys::ptrace::Options::empty()).expect("PTRACE_SEIZE");
    nix::sys::ptrace::interrupt(tid).expect("PTRACE_INTERRUPT");
    nix::sys::wait::waitpid(tid, Some(nix::sys::wait::WaitPidFlag::__WALL))
        .expect("the worker thread stops");
    let deadline = Instant::now() + Duration::from_secs(30);
    while health() != 503 {
        assert!(
            Instant::now() < deadline,
            "health never said the stuck worker"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    notify.collect(Duration::from_millis(200)); // a ping sent before the check flipped
    let while_stuck = notify.collect(Duration::from_secs(3));
    assert!(
        !while_stuck.iter().any(|m| m.contains("WATCHDOG=1")),
        "pinged while a worker was stuck: {while_stuck:?}"
    );
    nix::sys::ptrace::detach(tid, None).expect("PTRACE_DETACH");
    notify
        .wait_for("WATCHDOG=1", Duration::from_secs(30))
        .expect("pings resume once the worker runs again");

    // ExecReload: a rejected config fails the command; the running config stays.
    let reload = exec_reload(vg.config.path());
    let good = config(false);
    vg.rewrite_config(&good.replace(
        "media_ports = \"30000-30099\"",
        "media_ports = \"20050-20150\"",
    ));
    let run_reload = || {
        Command::new(&reload[0])
            .args(&reload[1..])
            .output()
            .unwrap()
    };
    let out = run_reload();
    assert!(
        !out.status.success(),
        "reload of a config with overlapping port ranges must fail: {out:?}"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.trim().is_empty(), "the reason is printed");
    notify.reloading_then_ready("a rejected reload (still running)");
    assert_eq!(health(), 200);

    vg.rewrite_config(&config(true));
    let out = run_reload();
    assert!(out.status.success(), "a good reload succeeds: {out:?}");
    notify.reloading_then_ready("the reload");
    let rx2 = UdpSocket::bind(format!("127.0.{NET}.2:40002")).unwrap();
    rx2.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    tx.send_to(&rtp(b"new route"), format!("127.0.{NET}.1:20002"))
        .unwrap();
    let (n, _) = rx2
        .recv_from(&mut buf)
        .expect("the reloaded route forwards");
    assert_eq!(&buf[..n], rtp(b"new route"));

    vg.stop();
}
