//! The CLI side of the admin interface: `vgate stats`, `routes`, `sessions`, `reload` talk to
//! a running vgate over HTTP and say plainly when none is running.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::Value;

/// Where the admin interface is and how to authenticate.
#[derive(Clone, Debug)]
pub struct Client {
    pub addr: SocketAddr,
    pub token: Option<String>,
    agent: ureq::Agent,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no vgate is running at {addr} ({why}); start one with `vgate run`, or point --admin at the right address")]
    NotRunning { addr: SocketAddr, why: String },
    #[error("vgate answered {status}: {message}")]
    Refused { status: u16, message: String },
    #[error("unexpected answer from vgate: {0}")]
    Garbled(String),
}

impl Client {
    pub fn new(addr: SocketAddr, token: Option<String>) -> Client {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(35)))
            .http_status_as_error(false)
            .build()
            .into();
        Client { addr, token, agent }
    }

    /// The same client with another overall timeout per request (`vgate health` asks
    /// often and must know fast).
    pub fn with_timeout(mut self, timeout: Duration) -> Client {
        self.agent = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .http_status_as_error(false)
            .build()
            .into();
        self
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    fn finish(
        &self,
        r: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<Value, ClientError> {
        let mut resp = r.map_err(|e| ClientError::NotRunning {
            addr: self.addr,
            why: e.to_string(),
        })?;
        let status = resp.status().as_u16();
        let body = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| ClientError::Garbled(e.to_string()))?;
        let v: Value = serde_json::from_str(&body)
            .map_err(|_| ClientError::Garbled(body.chars().take(200).collect()))?;
        if status >= 400 {
            let message = v["error"].as_str().unwrap_or("").to_string();
            return Err(ClientError::Refused { status, message });
        }
        Ok(v)
    }

    fn auth(&self) -> Option<String> {
        self.token.as_ref().map(|t| format!("Bearer {t}"))
    }

    pub fn get(&self, path: &str) -> Result<Value, ClientError> {
        let mut req = self.agent.get(self.url(path));
        if let Some(a) = self.auth() {
            req = req.header("Authorization", a);
        }
        self.finish(req.call())
    }

    pub fn post(&self, path: &str, body: &Value) -> Result<Value, ClientError> {
        let mut req = self
            .agent
            .post(self.url(path))
            .content_type("application/json");
        if let Some(a) = self.auth() {
            req = req.header("Authorization", a);
        }
        self.finish(req.send(body.to_string()))
    }

    pub fn put(&self, path: &str, body: &Value) -> Result<Value, ClientError> {
        let mut req = self
            .agent
            .put(self.url(path))
            .content_type("application/json");
        if let Some(a) = self.auth() {
            req = req.header("Authorization", a);
        }
        self.finish(req.send(body.to_string()))
    }

    pub fn delete(&self, path: &str) -> Result<Value, ClientError> {
        let mut req = self.agent.delete(self.url(path));
        if let Some(a) = self.auth() {
            req = req.header("Authorization", a);
        }
        self.finish(req.call())
    }
}

/// A connection to the admin port held open and never used, so that a watcher learns at
/// once when the vgate process is gone: its kernel closes every socket of a process that
/// exits (a crash, `kill -9`), and [`Tripwire::wait`] returns the moment the peer closes,
/// instead of the watcher finding out at its next question. A vgate that hangs keeps it
/// open: only a question's timeout finds that.
pub struct Tripwire {
    addr: SocketAddr,
    conn: Option<std::net::TcpStream>,
}

impl Tripwire {
    pub fn new(addr: SocketAddr) -> Tripwire {
        Tripwire { addr, conn: None }
    }

    /// Sleeps for `d`, or less: `true` when the connection was closed meanwhile (vgate
    /// exited, or closed an idle connection: the caller asks at once and finds out which).
    /// Not connected (vgate not running yet, or gone): connects first, sleeps `d` if it
    /// cannot.
    pub fn wait(&mut self, d: Duration) -> bool {
        use std::io::Read as _;
        if self.conn.is_none() {
            self.conn =
                std::net::TcpStream::connect_timeout(&self.addr, d.max(Duration::from_millis(1)))
                    .ok();
            if self.conn.is_none() {
                std::thread::sleep(d);
                return false;
            }
        }
        let Some(c) = self.conn.as_mut() else {
            return false;
        };
        if d.is_zero() || c.set_read_timeout(Some(d)).is_err() {
            return false;
        }
        let mut byte = [0u8; 1];
        match c.read(&mut byte) {
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                false
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => false,
            // EOF, a reset, or bytes (a server that gave up on an idle connection says why
            // and closes): either way, this connection is done.
            _ => {
                self.conn = None;
                true
            }
        }
    }
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

/// Renders one screen of `vgate stats` from two samples `dt` apart.
pub fn render_stats(prev: &Value, cur: &Value, dt: f64) -> String {
    let mut s = String::new();
    let rate = |path: &[&str]| -> f64 {
        let get = |v: &Value| path.iter().fold(v.clone(), |acc, k| acc[*k].clone());
        (num(&get(cur)) - num(&get(prev))).max(0.0) / dt
    };
    let _ = writeln!(
        s,
        "vgate  up {:.0}s  {}  workers {}  sessions {}  routes {}  {}",
        num(&cur["uptime_seconds"]),
        cur["engine"].as_str().unwrap_or(""),
        cur["workers"].as_array().map(|w| w.len()).unwrap_or(0),
        cur["sessions"],
        cur["routes"],
        if cur["healthy"].as_bool() == Some(true) {
            "healthy"
        } else {
            "UNHEALTHY"
        }
    );
    for d in ["a", "b"] {
        let _ = write!(
            s,
            "ports {d}: {} used {} free   ",
            cur["ports"][d]["used"], cur["ports"][d]["free"]
        );
    }
    s.push('\n');
    let ha = &cur["ha"];
    if ha.is_object() {
        let last = match ha["last_takeover_unix_ms"].as_u64() {
            Some(0) | None => "none".to_string(),
            Some(t) => {
                let ago = crate::clock::wall_ms().saturating_sub(t) / 1000;
                format!("{ago}s ago")
            }
        };
        let fenced = if ha["fenced"].as_bool() == Some(true) {
            " FENCED (another node holds the lease)"
        } else {
            ""
        };
        let _ = writeln!(
            s,
            "ha: node {} {}{fenced}  peer {}  state store {}  lag {} ms  pending {}  copies {}  takeovers {} (last {last})",
            ha["node"].as_str().unwrap_or("?"),
            ha["role"].as_str().unwrap_or("?").to_uppercase(),
            ha["peer"].as_str().unwrap_or("-"),
            if ha["state_store_up"].as_bool() == Some(true) { "up" } else { "DOWN" },
            ha["lag_ms"],
            ha["pending"],
            ha["replicas"],
            ha["takeovers"],
        );
    }
    let _ = writeln!(
        s,
        "\n{:<10} {:>12} {:>10} {:>12}  drops/s by reason",
        "CHANNEL", "packets/s", "Gbit/s", "rx pkts/s"
    );
    for c in ["forward", "reverse"] {
        let tx = rate(&["channels", c, "tx_packets"]);
        let gbps = rate(&["channels", c, "tx_bytes"]) * 8.0 / 1e9;
        let rx = rate(&["channels", c, "rx_packets"]);
        let mut drops = Vec::new();
        if let Some(m) = cur["channels"][c]["drops"].as_object() {
            for k in m.keys() {
                let r = rate(&["channels", c, "drops", k]);
                if r > 0.0 {
                    drops.push(format!("{k} {r:.0}"));
                }
            }
        }
        let _ = writeln!(
            s,
            "{c:<10} {tx:>12.0} {gbps:>10.3} {rx:>12.0}  {}",
            if drops.is_empty() {
                "-".into()
            } else {
                drops.join(", ")
            }
        );
    }
    let _ = writeln!(
        s,
        "\n{:<8} {:>6} {:>12} {:>12} {:>7}",
        "WORKER", "CPU", "fwd pkts/s", "rev pkts/s", "CPU %"
    );
    if let (Some(ws), Some(pw)) = (cur["workers"].as_array(), prev["workers"].as_array()) {
        for (w, p) in ws.iter().zip(pw) {
            let r = |c: &str| {
                (num(&w["channels"][c]["tx_packets"]) - num(&p["channels"][c]["tx_packets"]))
                    .max(0.0)
                    / dt
            };
            let cpu = (num(&w["cpu_seconds"]) - num(&p["cpu_seconds"])).max(0.0) / dt * 100.0;
            let _ = writeln!(
                s,
                "w{:<7} {:>6} {:>12.0} {:>12.0} {:>6.0}%{}",
                w["index"],
                w["cpu"]
                    .as_u64()
                    .map(|c| c.to_string())
                    .unwrap_or_else(|| "-".into()),
                r("forward"),
                r("reverse"),
                cpu,
                if w["alive"].as_bool() == Some(true) {
                    ""
                } else {
                    "  STOPPED"
                }
            );
        }
    }
    let sig = &cur["split_signal"];
    if sig.is_object() {
        let c = &sig["counters"];
        let _ = writeln!(
            s,
            "\nSPLIT PEER {}  last heard {}  frames in/out {}/{}  bytes in/out {}/{}\n  auth failures {}  replays {}  malformed {}  truncated {}  refused {}  resets {}  peer lost {}  restarts {}  resumed {}  sessions ended {}",
            if sig["peer_up"].as_bool() == Some(true) { "UP" } else { "DOWN" },
            sig["peer_last_seen_ms_ago"]
                .as_u64()
                .map(|ms| format!("{ms} ms ago"))
                .unwrap_or_else(|| "never".into()),
            c["frames_in"], c["frames_out"], c["bytes_in"], c["bytes_out"],
            c["auth_failures"], c["replays"], c["malformed"], c["truncated"], c["refused"],
            c["resets"], c["peer_lost"], c["peer_restarts"], c["peer_resumed"], c["sessions_ended"]
        );
    }
    if cur["split"].is_object() {
        let _ = writeln!(
            s,
            "\nSPLIT half {}\n{:<5} {:>6} {:>10} {:>10} {:>10} {:>9} {:>8}  drops by reason (since start)",
            cur["split"]["half"].as_str().unwrap_or("?"),
            "LINK", "FEC", "pkts/s", "Mbit/s", "repair/s", "repaired", "lost"
        );
        for l in ["out_link", "in_link"] {
            let v = &cur["split"][l];
            let mut drops = Vec::new();
            if let Some(m) = v["drops"].as_object() {
                for (k, n) in m {
                    if num(n) > 0.0 {
                        drops.push(format!("{k} {n}"));
                    }
                }
            }
            if num(&v["send_errors"]) > 0.0 {
                drops.push(format!("send_error {}", v["send_errors"]));
            }
            if num(&v["wrong_direction"]) > 0.0 {
                drops.push(format!("WRONG DIRECTION {}", v["wrong_direction"]));
            }
            let _ = writeln!(
                s,
                "{:<5} {:>6} {:>10.0} {:>10.2} {:>10.0} {:>9} {:>8}  {}",
                if l == "out_link" { "out" } else { "in" },
                v["fec"].as_str().unwrap_or("?"),
                rate(&["split", l, "packets"]),
                rate(&["split", l, "bytes"]) * 8.0 / 1e6,
                rate(&["split", l, "repair_packets"]),
                v["repaired"],
                v["lost"],
                if drops.is_empty() {
                    "-".into()
                } else {
                    drops.join(", ")
                }
            );
        }
        if let Some(streams) = cur["split"]["streams"].as_array() {
            if !streams.is_empty() {
                let _ = writeln!(
                    s,
                    "\nLINK STREAMS (in link, since start)\n{:<24} {:>6} {:>10} {:>9} {:>9} {:>6} {:>6} {:>9}",
                    "ROUTE", "PORT", "RECEIVED", "REPAIRED", "LOST", "LATE", "DUP", "RTP LOST"
                );
                for v in streams {
                    let _ = writeln!(
                        s,
                        "{:<24} {:>6} {:>10} {:>9} {:>9} {:>6} {:>6} {:>9}",
                        v["route"].as_str().unwrap_or(""),
                        v["port"],
                        v["received"],
                        v["repaired"],
                        v["lost"],
                        v["late"],
                        v["duplicate"],
                        v["rtp_lost"]
                    );
                }
            }
        }
    }
    if let Some(worst) = cur["worst_routes"].as_array() {
        if !worst.is_empty() {
            let _ = writeln!(
                s,
                "\nWORST STREAMS (since start)\n{:<24} {:<8} {:>6} {:>10} {:>10} {:>10}",
                "ROUTE", "CHANNEL", "PORT", "RTP LOST", "RTP PKTS", "DROPPED"
            );
            for w in worst {
                let _ = writeln!(
                    s,
                    "{:<24} {:<8} {:>6} {:>10} {:>10} {:>10}",
                    w["route"].as_str().unwrap_or(""),
                    w["channel"].as_str().unwrap_or(""),
                    w["port"],
                    w["rtp_lost"],
                    w["rtp_packets"],
                    w["dropped"]
                );
            }
        }
    }
    s
}

/// The live view: every second until interrupted (or `count` screens).
pub fn stats_loop(
    client: &Client,
    count: Option<u64>,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<(), ClientError> {
    let tty = std::io::stdout().is_terminal();
    let mut prev = client.get("/api/v1/stats")?;
    let mut at = Instant::now();
    let mut shown = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) && count.is_none_or(|c| shown < c) {
        std::thread::sleep(Duration::from_secs(1));
        let cur = client.get("/api/v1/stats")?;
        let dt = at.elapsed().as_secs_f64();
        at = Instant::now();
        let screen = render_stats(&prev, &cur, dt);
        if tty {
            // Home and clear, like top.
            print!("\x1b[H\x1b[2J{screen}");
        } else {
            println!("{screen}");
        }
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        prev = cur;
        shown += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::render_stats;
    use serde_json::json;

    #[test]
    fn the_ha_role_shows_in_the_live_view() {
        let single = json!({ "uptime_seconds": 1.0, "healthy": true });
        assert!(!render_stats(&single, &single, 1.0).contains("ha: "));
        let node = json!({
            "uptime_seconds": 1.0, "healthy": true,
            "ha": { "node": "gw-2", "role": "standby", "peer": "gw-1", "state_store_up": true,
                    "lag_ms": 40, "pending": 0, "replicas": 3, "takeovers": 0,
                    "last_takeover_unix_ms": 0 },
        });
        let screen = render_stats(&node, &node, 1.0);
        assert!(
            screen.contains("ha: node gw-2 STANDBY  peer gw-1  state store up  lag 40 ms  pending 0  copies 3  takeovers 0 (last none)"),
            "{screen}"
        );
        let mut fenced = node.clone();
        fenced["ha"]["fenced"] = json!(true);
        let screen = render_stats(&fenced, &fenced, 1.0);
        assert!(
            screen.contains("ha: node gw-2 STANDBY FENCED (another node holds the lease)  peer"),
            "{screen}"
        );
    }

    #[test]
    fn the_split_peer_shows_in_the_live_view() {
        let single = json!({ "uptime_seconds": 1.0, "healthy": true });
        assert!(!render_stats(&single, &single, 1.0).contains("SPLIT PEER"));
        let counters = json!({ "frames_in": 10, "frames_out": 12, "auth_failures": 2, "replays": 1, "sessions_ended": 3 });
        let half = json!({
            "uptime_seconds": 2.0, "healthy": true,
            "split_signal": { "peer_up": false, "peer_last_seen_ms_ago": 4200, "counters": counters },
        });
        let screen = render_stats(&half, &half, 1.0);
        assert!(
            screen.contains("SPLIT PEER DOWN  last heard 4200 ms ago"),
            "{screen}"
        );
        assert!(screen.contains("frames in/out 10/12"), "{screen}");
        assert!(screen.contains("auth failures 2  replays 1"), "{screen}");
        assert!(screen.contains("sessions ended 3"), "{screen}");
    }

    #[test]
    fn link_streams_show_in_the_live_view() {
        let link = json!({ "fec": "8+2", "packets": 10, "bytes": 1000, "drops": {} });
        let half = json!({
            "uptime_seconds": 2.0, "healthy": true,
            "split": {
                "half": "b", "out_link": link, "in_link": link,
                "streams": [{ "route": "cam", "port": 21000, "received": 990, "repaired": 7, "lost": 2, "late": 1, "duplicate": 0, "rtp_lost": 3 }],
            },
        });
        let screen = render_stats(&half, &half, 1.0);
        assert!(screen.contains("LINK STREAMS"), "{screen}");
        let row = screen
            .lines()
            .find(|l| l.starts_with("cam "))
            .unwrap_or_else(|| panic!("{screen}"));
        assert_eq!(
            row.split_whitespace().collect::<Vec<_>>(),
            ["cam", "21000", "990", "7", "2", "1", "0", "3"]
        );
    }
}
