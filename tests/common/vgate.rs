//! A `vgate run` child process for tests: started with a config text, ready when it says
//! so on stderr, stopped with SIGTERM; its key=value totals parsed from stdout.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The start of a loopback config on `127.0.NET.0/24`: domain A at `.1` (media ports
/// 20000-20099), domain B at `.2` (30000-30099), the admin interface on `.1:9941`. Extra
/// networks of each domain (peers the test plays) are given as last octets.
pub fn loopback_config(net: u8, extra_a: &[u8], extra_b: &[u8]) -> String {
    let host = |o: &u8| format!("127.0.{net}.{o}/32");
    let (a, b): (Vec<String>, Vec<String>) = (
        extra_a.iter().map(host).collect(),
        extra_b.iter().map(host).collect(),
    );
    let (a, b): (Vec<&str>, Vec<&str>) = (
        a.iter().map(String::as_str).collect(),
        b.iter().map(String::as_str).collect(),
    );
    loopback_with(net, 9941, 100, &a, &b)
}

/// A loopback config on `127.0.NET.0/24`: domain A at `.1` with `ports` media ports from
/// 20000, domain B at `.2` with `ports` from 30000, each domain's networks its own address
/// and the `extra` networks (CIDR), the admin interface on `.1:control`. Sections a test
/// adds go after it (`per_stream_metrics = true` first lands in `[control]`). The layout is
/// fixed: `domains.b.media_ports` is line 11 (config errors name lines).
pub fn loopback_with(
    net: u8,
    control: u16,
    ports: u16,
    extra_a: &[&str],
    extra_b: &[&str],
) -> String {
    let nets = |own: u8, extra: &[&str]| {
        std::iter::once(format!("127.0.{net}.{own}/32"))
            .chain(extra.iter().map(|n| n.to_string()))
            .map(|n| format!("\"{n}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (a_last, b_last) = (20000 + ports - 1, 30000 + ports - 1);
    format!(
        r#"
[domains.a]
interface = "lo"
address = "127.0.{net}.1"
networks = [{}]
media_ports = "20000-{a_last}"
[domains.b]
interface = "lo"
address = "127.0.{net}.2"
networks = [{}]
media_ports = "30000-{b_last}"
[control]
listen = "127.0.{net}.1:{control}"
"#,
        nets(1, extra_a),
        nets(2, extra_b)
    )
}

/// The SIP route `gb` of the loopback configs, over UDP: platforms call on domain B's
/// address (`127.0.NET.2:5060`), the device side is `127.0.NET.1:5070`. Keys a test adds
/// right after it belong to the route.
pub fn loopback_gb_route(net: u8) -> String {
    super::signaling_route(
        "gb",
        "sip",
        "udp",
        ("b", 5060),
        &format!("127.0.{net}.1:5070"),
    )
}

/// The static stream `cam1` of the loopback configs: port 20000 of domain A to
/// `127.0.NET.2:40000`, leaving from port 30000.
pub fn loopback_cam_route(net: u8) -> String {
    format!(
        r#"[[stream_route]]
name = "cam1"
domain = "a"
port = 20000
destination = "127.0.{net}.2:40000"
egress_port = 30000
"#
    )
}

/// A running `vgate run` (the one launcher of the tests): started with a config text,
/// optionally inside a network namespace, ready once it logged that its static routes are
/// installed (the last start-up line, after the admin interface listens), stopped with
/// SIGTERM and its totals parsed; killed on drop (a failed test).
///
/// Every stderr line is kept ([`Vgate::log`]) and echoed to the test's stderr (shown when
/// the test fails); [`Vgate::wait_for`] reads the lines one after the other.
pub struct Vgate {
    child: Option<Child>,
    lines: mpsc::Receiver<String>,
    log: Arc<Mutex<Vec<String>>>,
    stdout: Option<JoinHandle<String>>,
    stderr: Option<JoinHandle<()>>,
    pub config: tempfile::NamedTempFile,
    /// When the process was spawned.
    pub started: Instant,
}

/// How to start a [`Vgate`]: `Vgate::launch(config)….start()`.
pub struct Launch {
    config: String,
    wrapper: Vec<String>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    ready: Option<String>,
}

impl Launch {
    /// Inside network namespace `ns` (`ip netns exec NS vgate …`).
    pub fn netns(self, ns: &str) -> Launch {
        self.wrapper(&["ip", "netns", "exec", ns])
    }

    /// Through a wrapper command (`ip netns exec NAME`, `taskset …`).
    pub fn wrapper(mut self, wrapper: &[&str]) -> Launch {
        self.wrapper = wrapper.iter().map(|s| s.to_string()).collect();
        self
    }

    /// Extra arguments after `run --config FILE --stats-interval 0`.
    pub fn args(mut self, extra: &[&str]) -> Launch {
        self.args.extend(extra.iter().map(|s| s.to_string()));
        self
    }

    pub fn env(mut self, key: &str, value: &str) -> Launch {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Do not wait for the ready line (a test of start-up itself).
    pub fn no_wait(mut self) -> Launch {
        self.ready = None;
        self
    }

    pub fn start(self) -> Vgate {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(self.config.as_bytes()).unwrap();
        let bin = super::vgate_bin();
        let mut cmd = match self.wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(&bin);
                c
            }
            None => Command::new(&bin),
        };
        cmd.args(["run", "--config"])
            .arg(file.path())
            .args(["--stats-interval", "0"])
            .args(self.args.iter().map(OsStr::new))
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        let started = Instant::now();
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start vgate");
        let stderr = child.stderr.take().unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let stderr = {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    eprintln!("vgate: {line}");
                    log.lock().unwrap().push(line.clone());
                    let _ = tx.send(line);
                }
            })
        };
        let stdout = std::thread::spawn(move || {
            let mut out = String::new();
            let _ = stdout.read_to_string(&mut out);
            out
        });
        let v = Vgate {
            child: Some(child),
            lines: rx,
            log,
            stdout: Some(stdout),
            stderr: Some(stderr),
            config: file,
            started,
        };
        if let Some(needle) = &self.ready {
            v.wait_for(needle, Duration::from_secs(30));
        }
        v
    }
}

impl Vgate {
    /// A [`Launch`] of `vgate run` with `config`, waiting for the ready line by default.
    pub fn launch(config: &str) -> Launch {
        Launch {
            config: config.to_owned(),
            wrapper: Vec::new(),
            args: Vec::new(),
            env: Vec::new(),
            ready: Some(READY.to_owned()),
        }
    }

    /// `vgate run --config <file with config>` plus `extra` arguments, optionally through a
    /// wrapper such as `ip netns exec NAME`; waits until the static routes are installed.
    pub fn start_with(wrapper: &[&str], config: &str, extra: &[&str]) -> Vgate {
        Vgate::launch(config).wrapper(wrapper).args(extra).start()
    }

    /// [`Vgate::start_with`] inside network namespace `ns`.
    pub fn start_in(ns: &str, config: &str, extra: &[&str]) -> Vgate {
        Vgate::launch(config).netns(ns).args(extra).start()
    }

    pub fn start(config: &str) -> Vgate {
        Vgate::launch(config).start()
    }

    /// The pid of the process started (with a wrapper: the wrapper's, which `ip netns exec`
    /// turns into vgate's own by exec).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Waits for a stderr line containing `needle` (after those already waited for); panics
    /// after `within`.
    pub fn wait_for(&self, needle: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.contains(needle) => return l,
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => panic!(
                    "vgate did not log {needle:?} within {within:?}; log:\n{}",
                    self.log()
                ),
                Err(mpsc::RecvTimeoutError::Disconnected) => panic!(
                    "vgate closed its stderr (exited) before logging {needle:?}; log:\n{}",
                    self.log()
                ),
            }
        }
    }

    /// Every stderr line so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// How many stderr lines so far.
    pub fn log_lines(&self) -> usize {
        self.log.lock().unwrap().len()
    }

    /// Waits until the whole log holds `needle` `count` times; panics after `within`.
    pub fn wait_log(&self, needle: &str, count: usize, within: Duration) {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if self.log().matches(needle).count() >= count {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "vgate never logged {count} x {needle:?}; log:\n{}",
            self.log()
        );
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        if let Some(c) = &self.child {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), sig).unwrap();
        }
    }

    /// Replaces the config file's text (for reload tests).
    pub fn rewrite_config(&mut self, text: &str) {
        std::fs::write(self.config.path(), text).unwrap();
    }

    /// `kill -9`, as a crash would; reaped.
    pub fn crash(mut self) {
        self.signal(nix::sys::signal::Signal::SIGKILL);
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }

    /// Waits up to `within` for vgate to exit by itself: its exit status and stdout (and
    /// every stderr line in [`Vgate::log`]), or `None` if it still runs.
    pub fn wait_exit(&mut self, within: Duration) -> Option<(std::process::ExitStatus, String)> {
        let deadline = Instant::now() + within;
        loop {
            let c = self.child.as_mut()?;
            if let Ok(Some(st)) = c.try_wait() {
                self.child = None;
                let out = self
                    .stdout
                    .take()
                    .map(|h| h.join().unwrap())
                    .unwrap_or_default();
                return Some((st, out));
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, wait (30 s at most), and parse the totals from stdout. Panics unless vgate
    /// exits with success and without a panic in its log.
    pub fn stop(mut self) -> Totals {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        let Some((status, out)) = self.wait_exit(Duration::from_secs(30)) else {
            panic!("vgate did not stop on SIGTERM; log:\n{}", self.log());
        };
        assert!(
            status.success(),
            "vgate exited with {status}; stdout:\n{out}\nlog:\n{}",
            self.log()
        );
        assert!(
            !self.log().contains("panicked"),
            "vgate panicked:\n{}",
            self.log()
        );
        Totals::parse(&out)
    }
}

/// The line `vgate run` logs once it forwards and its admin interface listens.
pub const READY: &str = "static stream routes installed";

impl Drop for Vgate {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The totals vgate prints on shutdown (`total …`, `worker …`, `route …` lines).
#[derive(Debug, Default)]
pub struct Totals {
    pub channels: HashMap<String, HashMap<String, String>>,
    pub routes: HashMap<String, HashMap<String, String>>,
    pub workers: Vec<HashMap<String, String>>,
    pub raw: String,
}

impl Totals {
    pub fn parse(out: &str) -> Totals {
        let mut t = Totals {
            raw: out.to_string(),
            ..Default::default()
        };
        for line in out.lines() {
            let mut words = line.split_whitespace();
            let kind = words.next().unwrap_or("");
            let kv: HashMap<String, String> = words
                .filter_map(|w| w.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            match kind {
                "total" => {
                    if let Some(c) = kv.get("channel").cloned() {
                        t.channels.insert(c, kv);
                    }
                }
                "route" => {
                    if let Some(n) = kv.get("name").cloned() {
                        t.routes.insert(n, kv);
                    }
                }
                "worker" => t.workers.push(kv),
                _ => {}
            }
        }
        t
    }

    pub fn route(&self, name: &str, key: &str) -> u64 {
        self.value(&self.routes, "route", name, key)
    }

    pub fn channel(&self, name: &str, key: &str) -> u64 {
        self.value(&self.channels, "channel", name, key)
    }

    /// `key` of line `name` among `lines` (0 if the line lacks it; panics without the line).
    fn value(
        &self,
        lines: &HashMap<String, HashMap<String, String>>,
        kind: &str,
        name: &str,
        key: &str,
    ) -> u64 {
        let l = lines
            .get(name)
            .unwrap_or_else(|| panic!("no totals for {kind} {name}:\n{}", self.raw));
        l.get(key).map(|v| v.parse().unwrap()).unwrap_or(0)
    }

    /// Panics unless the forward channel's totals say `sent` packets left and no drop of any
    /// reason was counted.
    pub fn assert_forwarded_all(&self, sent: u32) {
        let raw = &self.raw;
        assert_eq!(
            self.channel("forward", "tx_packets"),
            u64::from(sent),
            "{raw}"
        );
        assert!(
            !self.channels["forward"]
                .keys()
                .any(|k| k.starts_with("drop_")),
            "no drops: {raw}"
        );
    }

    /// Panics unless the totals say no session, route or port was left (`who` names the
    /// process in the message).
    pub fn assert_nothing_left(&self, who: &str) {
        assert!(
            self.raw
                .contains("sessions live=0 routes=0 ports_used_a=0 ports_used_b=0"),
            "{who} left state behind:\n{}",
            self.raw
        );
    }
}

/// `key=value` pairs of a totals line.
pub fn kv(line: &str) -> HashMap<String, String> {
    line.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// The number under `k` (0 if absent or not a number).
pub fn num(m: &HashMap<String, String>, k: &str) -> u64 {
    m.get(k).map_or(0, |v| v.parse().unwrap_or(0))
}

/// The `sessions live=… routes=… ports_used_a=… ports_used_b=…` figures of a totals text.
pub fn live_counts(totals: &str) -> [u64; 4] {
    let line = totals
        .lines()
        .find(|l| l.starts_with("sessions live="))
        .unwrap_or_else(|| panic!("no sessions line in:\n{totals}"));
    let kv = kv(line);
    ["live", "routes", "ports_used_a", "ports_used_b"].map(|k| num(&kv, k))
}

/// `key=value` pairs of the `total channel=NAME` line.
pub fn channel_totals(totals: &str, channel: &str) -> HashMap<String, String> {
    totals
        .lines()
        .find(|l| l.starts_with(&format!("total channel={channel} ")))
        .map(kv)
        .unwrap_or_else(|| panic!("no {channel} totals in:\n{totals}"))
}

/// `vgate check-config [extra…] FILE`: its output.
pub fn check_config_file(file: &std::path::Path, extra: &[&str]) -> std::process::Output {
    Command::new(super::vgate_bin())
        .arg("check-config")
        .args(extra)
        .arg(file)
        .output()
        .expect("run vgate check-config")
}

/// [`check_config_file`] of `config` written to a temporary file.
pub fn check_config(config: &str, extra: &[&str]) -> std::process::Output {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(config.as_bytes()).unwrap();
    check_config_file(f.path(), extra)
}

/// Panics with its stderr unless the command `out` is the output of succeeded.
pub fn assert_success(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
