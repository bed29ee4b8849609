//! The SIP proxy's upstream face keeps its port across restarts and reloads (a real
//! `vgate run` on loopback): registrations made through it point at that address, so it
//! must not move. Default: the listen port; `upstream_port` sets another.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// `vgate run` with every stderr line kept (the proxies log before start-up completes).
struct Run {
    child: Child,
    lines: mpsc::Receiver<String>,
    _config: tempfile::NamedTempFile,
}

impl Run {
    fn start(config: &str) -> Run {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), config).unwrap();
        let mut child = Command::new(common::vgate_bin())
            .args(["run", "--stats-interval", "0", "--config"])
            .arg(file.path())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let err = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("vgate: {l}");
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Run {
            child,
            lines: rx,
            _config: file,
        }
    }

    fn wait_for(&self, needle: &str, within: Duration) -> String {
        loop {
            match self.lines.recv_timeout(within) {
                Ok(l) if l.contains(needle) => return l,
                Ok(_) => {}
                Err(_) => panic!("vgate did not log {needle:?} within {within:?}"),
            }
        }
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig).unwrap();
    }

    fn stop(mut self) {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        let st = self.child.wait().unwrap();
        assert!(st.success(), "vgate exited with {st}");
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const NET: u8 = 48;

fn config(extra: &str) -> String {
    format!(
        r#"
[domains.a]
interface = "lo"
address = "127.0.{NET}.1"
networks = ["127.0.{NET}.1/32"]
media_ports = "20000-20999"
[domains.b]
interface = "lo"
address = "127.0.{NET}.2"
networks = ["127.0.{NET}.2/32"]
media_ports = "30000-30999"
[control]
listen = "127.0.{NET}.1:9948"
[[signaling_route]]
name = "gb"
type = "sip"
transport = "udp"
listen_domain = "b"
listen_port = 5060
upstream = "127.0.{NET}.1:5070"
{extra}
[[signaling_route]]
name = "gbt"
type = "sip"
transport = "tcp"
listen_domain = "b"
listen_port = 5062
upstream = "127.0.{NET}.1:5070"
upstream_port = 5064
"#
    )
}

/// The upstream face each route's proxy logged when it started.
fn faces(v: &Run, n: usize) -> Vec<String> {
    (0..n)
        .map(|_| {
            let l = v.wait_for("SIP proxy serving", Duration::from_secs(30));
            let route = l
                .split("route=")
                .nth(1)
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap();
            let face = l
                .split("upstream_face=")
                .nth(1)
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap();
            format!("{route} {face}")
        })
        .collect()
}

#[test]
fn upstream_faces_keep_their_port_across_restarts_and_reloads() {
    let v = Run::start(&config(""));
    let mut first = faces(&v, 2);
    first.sort();
    assert_eq!(
        first,
        vec![
            format!("gb 127.0.{NET}.1:5060"),
            format!("gbt 127.0.{NET}.1:5064")
        ],
        "default: the listen port; upstream_port when set"
    );
    // A reload that changes the UDP route restarts its proxy on the same face.
    v.wait_for("static stream routes installed", Duration::from_secs(30));
    std::fs::write(v._config.path(), config("rate_limit = 50\n")).unwrap();
    v.signal(nix::sys::signal::Signal::SIGHUP);
    let again = faces(&v, 1);
    assert_eq!(again, vec![format!("gb 127.0.{NET}.1:5060")]);
    v.stop();
    // A restart: the same faces again.
    let v = Run::start(&config("rate_limit = 50\n"));
    let mut second = faces(&v, 2);
    second.sort();
    assert_eq!(second, first);
    v.stop();
}
