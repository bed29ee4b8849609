//! A `vgate run` child process for tests: started with a config text, ready when it says
//! so on stderr, stopped with SIGTERM; its key=value totals parsed from stdout.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The start of a loopback config on `127.0.NET.0/24`: domain A at `.1` (media ports
/// 20000-20099), domain B at `.2` (30000-30099), the admin interface on `.1:9941`. Extra
/// networks of each domain (peers the test plays) are given as last octets.
pub fn loopback_config(net: u8, extra_a: &[u8], extra_b: &[u8]) -> String {
    let nets = |own: u8, extra: &[u8]| {
        std::iter::once(own)
            .chain(extra.iter().copied())
            .map(|o| format!("\"127.0.{net}.{o}/32\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        r#"
[domains.a]
interface = "lo"
address = "127.0.{net}.1"
networks = [{}]
media_ports = "20000-20099"
[domains.b]
interface = "lo"
address = "127.0.{net}.2"
networks = [{}]
media_ports = "30000-30099"
[control]
listen = "127.0.{net}.1:9941"
"#,
        nets(1, extra_a),
        nets(2, extra_b)
    )
}

/// A running `vgate run`, killed on drop.
pub struct Vgate {
    pub child: Child,
    pub stderr_lines: mpsc::Receiver<String>,
    pub config: tempfile::NamedTempFile,
}

impl Vgate {
    /// `vgate run --config <file with config>` plus `extra` arguments, optionally through a
    /// wrapper such as `ip netns exec NAME`; waits until the static routes are installed.
    pub fn start_with(wrapper: &[&str], config: &str, extra: &[&str]) -> Vgate {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(config.as_bytes()).unwrap();
        let bin = super::vgate_bin();
        let mut cmd = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(&bin);
                c
            }
            None => Command::new(&bin),
        };
        cmd.args(["run", "--config"])
            .arg(file.path())
            .args(["--stats-interval", "0"]);
        cmd.args(extra.iter().map(OsStr::new));
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start vgate");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("vgate: {line}");
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let v = Vgate {
            child,
            stderr_lines: rx,
            config: file,
        };
        v.wait_for("static stream routes installed", Duration::from_secs(30));
        v
    }

    pub fn start(config: &str) -> Vgate {
        Vgate::start_with(&[], config, &[])
    }

    /// Waits for a stderr line containing `needle`; panics after `within`.
    pub fn wait_for(&self, needle: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr_lines.recv_timeout(left) {
                Ok(l) if l.contains(needle) => return l,
                Ok(_) => {}
                Err(_) => panic!("vgate did not log {needle:?} within {within:?}"),
            }
        }
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig).unwrap();
    }

    /// Replaces the config file's text (for reload tests).
    pub fn rewrite_config(&mut self, text: &str) {
        std::fs::write(self.config.path(), text).unwrap();
    }

    /// SIGTERM, wait, and parse the totals from stdout.
    pub fn stop(mut self) -> Totals {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        let mut out = String::new();
        self.child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        let status = self.child.wait().unwrap();
        assert!(
            status.success(),
            "vgate exited with {status}; stdout:\n{out}"
        );
        Totals::parse(&out)
    }
}

impl Drop for Vgate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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
        let r = self
            .routes
            .get(name)
            .unwrap_or_else(|| panic!("no totals for route {name}:\n{}", self.raw));
        r.get(key).map(|v| v.parse().unwrap()).unwrap_or(0)
    }

    pub fn channel(&self, name: &str, key: &str) -> u64 {
        let c = self
            .channels
            .get(name)
            .unwrap_or_else(|| panic!("no totals for channel {name}:\n{}", self.raw));
        c.get(key).map(|v| v.parse().unwrap()).unwrap_or(0)
    }
}
