//! The hot-standby pair of the namespace tests (`tests/ha_netns.rs`,
//! `tests/ha_splitbrain_netns.rs`): namespaces A (sender), B (receiver) and M (Redis) joined
//! to two vgate nodes n1 and n2 by bridges, keepalived and a health watcher on each node,
//! and an RTP stream whose arrivals are recorded.
//!
//! ```text
//!   ns A (sender, bridge) ──ea── n1 ──eb── ns B (receiver, bridge)
//!                         ──ea── n2 ──eb──
//!   ns M (redis, bridge)  ──em── n1, n2
//! ```
//!
//! Also what the other HA beds (`tests/ha_split_netns.rs`) share: commands and logged
//! processes in namespaces, the admin interface at [`ADMIN`] inside a node's namespace,
//! waiting with the run's logs on failure, keepalived's config for a node of any pair
//! ([`Keepalived`]) and the health watcher ([`start_watcher`]).

use std::net::{SocketAddrV4, UdpSocket};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::proc::Proc;

/// Where every HA test's vgate listens for its admin interface, inside its namespace.
pub const ADMIN: &str = "127.0.0.1:9940";

pub const NEEDS: &[(&str, &str)] = &[
    ("ip", "iproute2"),
    ("keepalived", "keepalived"),
    ("redis-server", "redis-server"),
];

pub fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn ns_sh(ns: &str, cmd: &str) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "sh", "-c", cmd])
        .output()
        .expect("ip netns exec");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The namespaces of one run, deleted on drop (also when the test fails).
pub struct Net {
    pub tag: String,
    pub names: Vec<String>,
    pub dir: tempfile::TempDir,
}

impl Net {
    pub fn ns(&self, which: &str) -> String {
        format!("{}{which}", self.tag)
    }

    pub fn up() -> Net {
        static RUN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let tag = format!(
            "ha{}x{}",
            std::process::id() % 100_000,
            RUN.fetch_add(1, Relaxed)
        );
        let mut net = Net {
            names: Vec::new(),
            tag,
            dir: tempfile::tempdir().expect("tempdir"),
        };
        for which in ["a", "b", "m", "n1", "n2"] {
            let ns = net.ns(which);
            let _ = Command::new("ip")
                .args(["netns", "del", &ns])
                .stderr(Stdio::null())
                .status();
            ip(&["netns", "add", &ns]);
            net.names.push(ns.clone());
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
        }
        // The three shared segments: a bridge in each of A, B and M.
        for (seg, host_ip) in [
            ("a", "10.61.0.100/24"),
            ("b", "10.62.0.100/24"),
            ("m", "10.69.0.100/24"),
        ] {
            let ns = net.ns(seg);
            ip(&["-n", &ns, "link", "add", "sw0", "type", "bridge"]);
            ip(&["-n", &ns, "link", "set", "sw0", "up"]);
            ip(&["-n", &ns, "addr", "add", host_ip, "dev", "sw0"]);
        }
        for (node, last) in [("n1", 11), ("n2", 12)] {
            let n = net.ns(node);
            for (seg, ifc, subnet) in [("a", "ea", 61), ("b", "eb", 62), ("m", "em", 69)] {
                let s = net.ns(seg);
                let peer = format!("{node}{seg}");
                ip(&[
                    "link", "add", ifc, "netns", &n, "type", "veth", "peer", "name", &peer,
                    "netns", &s,
                ]);
                ip(&["-n", &s, "link", "set", &peer, "master", "sw0"]);
                ip(&["-n", &s, "link", "set", &peer, "up"]);
                ip(&[
                    "-n",
                    &n,
                    "addr",
                    "add",
                    &format!("10.{subnet}.0.{last}/24"),
                    "dev",
                    ifc,
                ]);
                ip(&["-n", &n, "link", "set", ifc, "up"]);
            }
            // The gateway addresses are keepalived's: bind to them before they are here.
            ns_sh(&n, "sysctl -qw net.ipv4.ip_nonlocal_bind=1");
        }
        net
    }

    pub fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in &self.names {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

pub fn vgate_config(net: &Net, node: &str) -> String {
    format!(
        r#"
[domains.a]
interface = "ea"
address = "10.61.0.1"
networks = ["10.61.0.0/24"]
media_ports = "20000-20099"
[domains.b]
interface = "eb"
address = "10.62.0.1"
networks = ["10.62.0.0/24"]
media_ports = "30000-30099"
[engine]
mode = "stack"
queues = 1
[security]
source_validation = "latch"
# Counted, not enforced: the test's RTP carries no real PS (the SIP test checks the copy
# carries the rule).
[media]
validate = "count"
[control]
listen = "{ADMIN}"
[ha]
node = "{node}"
redis = "10.69.0.100:6379"
key_prefix = "{tag}"

# GB/T 28181 live view: the platform in B invites the device in A.
[[signaling_route]]
name = "b2a"
type = "sip"
transport = "udp"
listen_domain = "b"
listen_port = 5060
upstream = "10.61.0.100:5060"
upstream_port = 5061
allow_peers = ["10.62.0.100/32"]
allow_ids = ["3402000000"]

# GB/T 28181 registration: the device in A registers with the platform in B, which then
# reaches it by its registration (INVITE, MESSAGE).
[[signaling_route]]
name = "reg"
type = "sip"
transport = "udp"
listen_domain = "a"
listen_port = 5062
upstream = "10.62.0.100:5090"
upstream_port = 5062
allow_peers = ["10.61.0.100/32"]
"#,
        tag = net.tag
    )
}

pub fn admin_json(ns: &str, path: &str) -> Option<serde_json::Value> {
    let (ns, path) = (ns.to_owned(), path.to_owned());
    super::in_netns(&ns, move || {
        super::admin::try_get(ADMIN, &path)
            .ok()
            .and_then(|b| serde_json::from_str(&b).ok())
    })
}

pub fn admin_post(ns: &str, path: &str, body: &str) -> String {
    admin_request(ns, "POST", path, body)
}

pub fn admin_delete(ns: &str, path: &str) -> String {
    admin_request(ns, "DELETE", path, "")
}

/// One request to node `ns`'s admin interface; the whole answer.
pub fn admin_request(ns: &str, method: &str, path: &str, body: &str) -> String {
    let (ns, method, path, body) = (
        ns.to_owned(),
        method.to_owned(),
        path.to_owned(),
        body.to_owned(),
    );
    super::in_netns(&ns, move || {
        super::admin::request(ADMIN, &method, &path, &body)
    })
}

pub fn wait_for(
    what: &str,
    within: Duration,
    mut f: impl FnMut() -> bool,
    log: impl Fn() -> String,
) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(
            Instant::now() < deadline,
            "{what} within {within:?}\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn role(ns: &str) -> Option<String> {
    admin_json(ns, "/api/v1/ha").and_then(|v| v["role"].as_str().map(str::to_owned))
}

pub fn spawn_logged(ns: &str, args: &[&str], log: &str) -> Proc {
    let f = std::fs::File::create(log).expect("log file");
    Proc::spawn(
        Command::new("ip")
            .args(["netns", "exec", ns])
            .args(args)
            .stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f),
    )
}

pub fn tail(path: &str) -> String {
    let t = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = t.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// Every log of the run, the last lines of each.
pub fn logs_of(dir: &std::path::Path) -> String {
    let mut out = String::new();
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    files.sort();
    for f in files {
        let f = f.display().to_string();
        out.push_str(&format!("--- {f}\n{}\n", tail(&f)));
    }
    out
}

/// The pair: namespaces, Redis, two vgates, their health watchers and keepaliveds, n1 the
/// active one at the end of [`Pair::up`].
pub struct Pair {
    // Dropped in this order: peers first, namespaces last.
    pub keepaliveds: Vec<Proc>,
    pub watchers: Vec<Proc>,
    pub vgates: Vec<Option<Proc>>,
    pub redis: Option<Proc>,
    pub net: Net,
    pub _one: std::sync::MutexGuard<'static, ()>,
}

pub static ONE_PAIR: Mutex<()> = Mutex::new(());

impl Pair {
    pub fn node(&self, i: usize) -> String {
        self.net.ns(&format!("n{}", i + 1))
    }

    pub fn show(&self) -> String {
        logs_of(self.net.dir.path())
    }

    pub fn start_redis(&mut self) {
        let dir = self.net.path("");
        self.redis = Some(spawn_redis(
            &self.net.ns("m"),
            &["10.69.0.100"],
            &dir,
            &[],
            &self.net.path("redis.log"),
        ));
    }

    pub fn start_vgate(&mut self, i: usize) {
        let node = format!("n{}", i + 1);
        let cfg = self.net.path(&format!("{node}.toml"));
        std::fs::write(&cfg, vgate_config(&self.net, &node)).unwrap();
        // A restarted node appends to its log.
        let log = self.net.path(&format!("{node}-{}.log", self.vgates.len()));
        let bin = super::vgate_bin().display().to_string();
        let p = spawn_logged(
            &self.node(i),
            &[&bin, "run", "--config", &cfg, "--stats-interval", "0"],
            &log,
        );
        if i < self.vgates.len() {
            self.vgates[i] = Some(p);
        } else {
            self.vgates.push(Some(p));
        }
    }

    pub fn wait_healthy_standby(&self, i: usize, within: Duration) {
        wait_for(
            "vgate healthy as a standby (state store read)",
            within,
            || {
                admin_json(&self.node(i), "/api/v1/health")
                    .is_some_and(|v| v["healthy"] == true && v["role"] == "standby")
            },
            || self.show(),
        );
    }

    pub fn up() -> Pair {
        // One pair at a time: the gaps measured are the pair's, not two pairs' on 2 cores.
        let guard = ONE_PAIR.lock().unwrap_or_else(|p| p.into_inner());
        let mut p = Pair {
            _one: guard,
            keepaliveds: Vec::new(),
            watchers: Vec::new(),
            vgates: Vec::new(),
            redis: None,
            net: Net::up(),
        };
        p.start_redis();
        for i in 0..2 {
            p.start_vgate(i);
        }
        for i in 0..2 {
            p.wait_healthy_standby(i, Duration::from_secs(15));
        }
        // `vgate health --track-file`: a crash is seen within 50 ms (keepalived's
        // track_file); `vgate health` as track_script is the backstop (whole seconds).
        for i in 0..2 {
            let file = p.net.path(&format!("n{}.alive", i + 1));
            let log = p.net.path(&format!("watch-n{}.log", i + 1));
            p.watchers.push(start_watcher(&p.node(i), &file, &log));
        }
        for i in 0..2 {
            p.start_keepalived(i);
            if i == 0 {
                wait_for(
                    "n1 active through keepalived's notify",
                    Duration::from_secs(15),
                    || role(&p.node(0)).as_deref() == Some("active"),
                    || p.show(),
                );
            }
        }
        std::thread::sleep(Duration::from_secs(1));
        assert_eq!(role(&p.node(1)).as_deref(), Some("standby"), "{}", p.show());
        assert!(
            ns_sh(&p.node(0), "ip -4 addr show dev eb").contains("10.62.0.1/"),
            "n1 holds the B address"
        );
        p
    }

    /// Starts node `i`'s keepalived (n1 priority 150, n2 100), or starts it again.
    pub fn start_keepalived(&mut self, i: usize) {
        let node = format!("n{}", i + 1);
        let prio = if i == 0 { 150 } else { 100 };
        let conf = self.net.path(&format!("keepalived-{node}.conf"));
        let alive = self.net.path(&format!("{node}.alive"));
        let vgate = super::vgate_bin().display().to_string();
        let vips = [
            "10.61.0.1/24 dev ea".to_string(),
            "10.62.0.1/24 dev eb".to_string(),
        ];
        // A restarted keepalived logs to a file of its own.
        let log = self
            .net
            .path(&format!("keepalived-{node}-{}.log", self.keepaliveds.len()));
        let p = Keepalived {
            node: &node,
            priority: prio,
            interface: "ea",
            router_id: 61,
            vips: &vips,
            track_file: &alive,
            notify: &|role| format!("{vgate} ha-notify --admin {ADMIN} {role}"),
        }
        .start(&self.node(i), &conf, &log);
        if i < self.keepaliveds.len() {
            self.keepaliveds[i] = p;
        } else {
            self.keepaliveds.push(p);
        }
    }

    /// `kill -9` of node `i`'s keepalived, its parent and its VRRP child (their pid files):
    /// nothing of it runs a notify or withdraws an address.
    pub fn kill9_keepalived(&mut self, i: usize) {
        let conf = self.net.path(&format!("keepalived-n{}.conf", i + 1));
        let (pid_file, vrrp_file) = Keepalived::pid_files(&conf);
        let vrrp = std::fs::read_to_string(&vrrp_file)
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok());
        for pid in std::iter::once(self.keepaliveds[i].pid() as i32).chain(vrrp) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = self.keepaliveds[i].wait_exit(Duration::from_secs(5));
        // The VRRP child, orphaned, may stay a zombie here (nobody reaps it at once): gone
        // or dead, then its pid file goes as its service manager's cleanup would, or the
        // next keepalived takes it for a running one ("daemon is already running").
        if let Some(pid) = vrrp {
            wait_for(
                "the killed VRRP child to die",
                Duration::from_secs(5),
                || {
                    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |t| {
                        t.rsplit(')')
                            .next()
                            .is_some_and(|r| r.trim_start().starts_with('Z'))
                    })
                },
                || self.show(),
            );
        }
        for f in [pid_file, vrrp_file] {
            let _ = std::fs::remove_file(f);
        }
    }

    /// Node `i`'s links (domain A, domain B, management) down or up.
    pub fn links(&self, i: usize, up: bool) {
        for ifc in ["ea", "eb", "em"] {
            ip(&[
                "-n",
                &self.node(i),
                "link",
                "set",
                ifc,
                if up { "up" } else { "down" },
            ]);
        }
    }

    /// Adds a latch route at run time through node `i`'s admin API: A `port` → the
    /// receiver `dest`, leaving from B `egress`.
    pub fn add_route(&self, i: usize, name: &str, port: u16, egress: u16, dest: &str) {
        let resp = admin_post(
            &self.node(i),
            "/api/v1/routes",
            &format!(
                r#"{{"name":"{name}","domain":"a","port":{port},"destination":"{dest}","egress_port":{egress},"source_validation":"latch"}}"#
            ),
        );
        assert!(resp.starts_with("HTTP/1.1 201"), "route not added: {resp}");
    }

    /// Waits until node `i` holds a route on `port` (`latched`: with that latched source).
    pub fn wait_route(&self, i: usize, port: u16, latched: Option<&str>, within: Duration) {
        wait_for(
            "the standby's copy of the route",
            within,
            || {
                admin_json(&self.node(i), "/api/v1/routes").is_some_and(|v| {
                    v["routes"].as_array().into_iter().flatten().any(|r| {
                        r["port"] == port && latched.is_none_or(|l| r["latched_source"] == l)
                    })
                })
            },
            || self.show(),
        );
    }
}

/// One RTP stream, 200 packets/s, from the sender in A to the gateway address, received in B;
/// every arrival with its time, RTP sequence and source.
pub struct Stream {
    pub stop: Arc<AtomicBool>,
    pub arrivals: Arc<Mutex<Vec<(Instant, u16, SocketAddrV4)>>>,
    pub threads: Vec<std::thread::JoinHandle<()>>,
}

/// Where one stream goes: from `(ns, ip, port)` to the gateway `gw` of the sender's domain,
/// received at `(ns, ip, port)`.
pub struct Path {
    pub from: (String, &'static str, u16),
    pub gw: (&'static str, u16),
    pub to: (String, &'static str, u16),
}

impl Path {
    /// A → B: the sender 10.61.0.100:`src` → gateway A `gw` → receiver 10.62.0.100:`rx`.
    pub fn a_to_b(net: &Net, src: u16, gw: u16, rx: u16) -> Path {
        Path {
            from: (net.ns("a"), "10.61.0.100", src),
            gw: ("10.61.0.1", gw),
            to: (net.ns("b"), "10.62.0.100", rx),
        }
    }

    /// B → A (talkback): 10.62.0.100:`src` → gateway B `gw` → 10.61.0.100:`rx`.
    pub fn b_to_a(net: &Net, src: u16, gw: u16, rx: u16) -> Path {
        Path {
            from: (net.ns("b"), "10.62.0.100", src),
            gw: ("10.62.0.1", gw),
            to: (net.ns("a"), "10.61.0.100", rx),
        }
    }
}

impl Stream {
    pub fn start(net: &Net, src_port: u16, gw_port: u16, rx_port: u16) -> Stream {
        Stream::start_on(
            Path::a_to_b(net, src_port, gw_port, rx_port),
            Duration::from_millis(5),
            Duration::from_secs(90),
        )
    }

    /// A packet every `every` along `path`, for at most `max`.
    pub fn start_on(path: Path, every: Duration, max: Duration) -> Stream {
        let stop = Arc::new(AtomicBool::new(false));
        let arrivals: Arc<Mutex<Vec<(Instant, u16, SocketAddrV4)>>> = Arc::default();
        let receiver = {
            let (stop, arrivals, (ns, ip, port)) =
                (Arc::clone(&stop), Arc::clone(&arrivals), path.to);
            std::thread::spawn(move || {
                super::enter_netns(&ns).unwrap();
                let s = UdpSocket::bind((ip, port)).unwrap();
                s.set_read_timeout(Some(Duration::from_millis(100)))
                    .unwrap();
                let mut buf = [0u8; 2048];
                while !stop.load(Relaxed) {
                    if let Ok((n, std::net::SocketAddr::V4(from))) = s.recv_from(&mut buf) {
                        if n >= 12 {
                            let seq = u16::from_be_bytes([buf[2], buf[3]]);
                            arrivals.lock().unwrap().push((Instant::now(), seq, from));
                        }
                    }
                }
            })
        };
        let sender = {
            let (stop, (ns, ip, port), gw) = (Arc::clone(&stop), path.from, path.gw);
            std::thread::spawn(move || {
                super::enter_netns(&ns).unwrap();
                let s = UdpSocket::bind((ip, port)).unwrap();
                let mut pkt = [0u8; 172];
                pkt[0] = 0x80;
                pkt[1] = 96;
                pkt[8..12].copy_from_slice(&0x1234_5678u32.to_be_bytes());
                let start = Instant::now();
                let mut seq: u16 = 0;
                // Bounded: at most `max`.
                while !stop.load(Relaxed) && start.elapsed() < max {
                    pkt[2..4].copy_from_slice(&seq.to_be_bytes());
                    let _ = s.send_to(&pkt, gw);
                    seq = seq.wrapping_add(1);
                    std::thread::sleep(every);
                }
            })
        };
        Stream {
            stop,
            arrivals,
            threads: vec![receiver, sender],
        }
    }

    pub fn count(&self) -> usize {
        self.arrivals.lock().unwrap().len()
    }

    /// The largest gap between two arrivals after `since`, and the packets lost from `since`
    /// on (sequence numbers never seen between the first and the last arrival after it).
    pub fn largest_gap_after(&self, since: Instant) -> (Duration, u16) {
        self.largest_gap_between(since, Instant::now() + Duration::from_secs(3600))
    }

    /// [`Stream::largest_gap_after`] over the arrivals from `since` to `until` only.
    pub fn largest_gap_between(&self, since: Instant, until: Instant) -> (Duration, u16) {
        let all = self.arrivals.lock().unwrap();
        let a: Vec<_> = all.iter().filter(|x| x.0 < until).copied().collect();
        let gap = a
            .windows(2)
            .filter(|w| w[1].0 >= since)
            .map(|w| w[1].0 - w[0].0)
            .max()
            .unwrap_or_default();
        let after: Vec<u16> = a.iter().skip_while(|x| x.0 < since).map(|x| x.1).collect();
        // The last packet before `since` starts the count (the sequence is one sender's).
        let first = a.iter().rev().find(|x| x.0 < since).map(|x| x.1);
        let lost = match (first, after.last()) {
            (Some(f), Some(l)) => l.wrapping_sub(f).saturating_sub(after.len() as u16),
            _ => 0,
        };
        (gap, lost)
    }

    /// Every arrival so far: (time, RTP sequence).
    pub fn arrivals(&self) -> Vec<(Instant, u16)> {
        self.arrivals
            .lock()
            .unwrap()
            .iter()
            .map(|a| (a.0, a.1))
            .collect()
    }

    pub fn sources(&self) -> std::collections::BTreeSet<SocketAddrV4> {
        self.arrivals.lock().unwrap().iter().map(|a| a.2).collect()
    }

    pub fn finish(mut self) {
        self.stop.store(true, Relaxed);
        for t in self.threads.drain(..) {
            t.join().unwrap();
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
    }
}

pub fn metric(ns: &str, family: &str) -> u64 {
    metric_with(ns, family, &[])
}

/// The sum of `family`'s samples with `labels` in the `/metrics` of the vgate in `ns`.
pub fn metric_with(ns: &str, family: &str, labels: &[&str]) -> u64 {
    let text = super::admin::get_in(ns, ADMIN, "/metrics");
    super::admin::metric(&text, family, labels)
}

/// How the active node fails ([`whole_node_failover`], the bench).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kill {
    /// `kill -9` of the active vgate (started again to come back).
    Vgate,
    /// `kill -9` of its keepalived ([`Pair::kill9_keepalived`]; started again).
    Keepalived,
    /// Its links down ([`Pair::links`]; up again).
    Links,
}

impl Pair {
    pub fn fail(&mut self, i: usize, how: Kill) {
        match how {
            Kill::Vgate => {
                if let Some(p) = &self.vgates[i] {
                    p.signal(nix::sys::signal::Signal::SIGKILL);
                }
            }
            Kill::Keepalived => self.kill9_keepalived(i),
            Kill::Links => self.links(i, false),
        }
    }

    pub fn bring_back(&mut self, i: usize, how: Kill) {
        match how {
            Kill::Vgate => {
                if let Some(mut p) = self.vgates[i].take() {
                    let _ = p.stop();
                }
                self.start_vgate(i);
            }
            Kill::Keepalived => self.start_keepalived(i),
            Kill::Links => self.links(i, true),
        }
    }
}

/// A UDP socket bound in namespace `ns` (a socket stays in the namespace it was made in).
pub fn udp_in(ns: &str, addr: &str) -> UdpSocket {
    let (ns, addr) = (ns.to_string(), addr.to_string());
    std::thread::spawn(move || {
        super::enter_netns(&ns).unwrap();
        let s = UdpSocket::bind(addr.as_str()).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        s
    })
    .join()
    .unwrap()
}

/// The next SIP message on `s` whose first line starts with `start` (others, such as a
/// `100 Trying`, are skipped), within 5 s.
pub fn recv_sip(s: &UdpSocket, start: &str, pair: &Pair) -> (String, std::net::SocketAddr) {
    let until = Instant::now() + Duration::from_secs(5);
    let mut buf = [0u8; 8192];
    while Instant::now() < until {
        if let Ok((n, from)) = s.recv_from(&mut buf) {
            let m = String::from_utf8_lossy(&buf[..n]).into_owned();
            if m.starts_with(start) {
                return (m, from);
            }
        }
    }
    panic!(
        "no {start:?} arrived on {:?}\n{}",
        s.local_addr(),
        pair.show()
    );
}

pub fn header(msg: &str, name: &str) -> String {
    let head = msg.split("\r\n\r\n").next().unwrap_or(msg);
    head.lines()
        .find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
        .unwrap_or_default()
}

/// The URI of a Contact (between `<` and `>`).
pub fn contact_uri(msg: &str) -> String {
    let c = header(msg, "Contact");
    c.split_once('<')
        .and_then(|(_, r)| r.split_once('>'))
        .map(|(u, _)| u.to_string())
        .unwrap_or(c)
}

/// A response to `req`: its Vias, From, To (with `to_tag` unless tagged), Call-ID and CSeq
/// echoed, then `extra` lines and `body`.
pub fn sip_reply(req: &str, code: &str, to_tag: &str, extra: &str, body: &str) -> String {
    let mut r = format!("SIP/2.0 {code}\r\n");
    let head = req.split("\r\n\r\n").next().unwrap_or(req);
    for l in head.lines() {
        let name = l
            .split(':')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        match name.as_str() {
            "via" | "from" | "call-id" | "cseq" => r.push_str(&format!("{l}\r\n")),
            "to" if l.contains("tag=") => r.push_str(&format!("{l}\r\n")),
            "to" => r.push_str(&format!("{l};tag={to_tag}\r\n")),
            _ => {}
        }
    }
    r.push_str(extra);
    r.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    r
}

pub const DEVICE_ID: &str = "34020000001320000001";
pub const PLATFORM_ID: &str = "34020000002000000001";

#[allow(clippy::too_many_arguments)]
/// A request from the platform (B, 10.62.0.100:5090) or the device (A, 10.61.0.100:5064).
pub fn sip_request(
    method: &str,
    ruri: &str,
    from_platform: bool,
    (from, to): (&str, &str),
    call_id: &str,
    cseq: u32,
    extra: &str,
    body: &str,
) -> String {
    let via = if from_platform {
        "10.62.0.100:5090"
    } else {
        "10.61.0.100:5064"
    };
    format!(
        "{method} {ruri} SIP/2.0\r\nVia: SIP/2.0/UDP {via};rport;branch=z9hG4bK{method}{cseq}x{}\r\n\
From: {from}\r\nTo: {to}\r\nCall-ID: {call_id}\r\nCSeq: {cseq} {method}\r\nMax-Forwards: 70\r\n{extra}Content-Length: {}\r\n\r\n{body}",
        call_id.replace(['@', '.'], ""),
        body.len()
    )
}

pub fn registered_ids(ns: &str) -> Vec<String> {
    admin_json(ns, "/api/v1/registrations")
        .and_then(|v| {
            Some(
                v["registrations"]
                    .as_array()?
                    .iter()
                    .filter_map(|r| r["id"].as_str().map(str::to_string))
                    .collect(),
            )
        })
        .unwrap_or_default()
}

/// The sessions of the `reg` route's calls on a node (SIP or their copies).
pub fn call_sessions(ns: &str) -> usize {
    sip_sessions(ns, "reg").len()
}

/// The ids of the sessions of SIP route `route`'s calls on a node (SIP or their copies).
pub fn sip_sessions(ns: &str, route: &str) -> Vec<u64> {
    let prefix = format!("sip:{route}:");
    admin_json(ns, "/api/v1/sessions")
        .and_then(|v| {
            Some(
                v["sessions"]
                    .as_array()?
                    .iter()
                    .filter(|s| s["label"].as_str().is_some_and(|l| l.starts_with(&prefix)))
                    .map(|s| s["id"].as_u64().unwrap_or(0))
                    .collect(),
            )
        })
        .unwrap_or_default()
}

/// One call's dialog as each side sees it.
pub struct Dialog {
    pub call_id: String,
    pub plat_from: String,
    /// The To of the platform's requests (the device's tag).
    pub dev_to: String,
    /// The gateway's contacts: the device's (on B) and the platform's (on A).
    pub dev_contact: String,
    pub plat_contact: String,
    /// The device's Call-ID, From (its tag) and To (the platform's tag).
    pub dev_call_id: String,
    pub dev_from: String,
    pub dev_to_plat: String,
    /// The `m=` line each side saw: the device in the INVITE, the platform in the 200.
    pub dev_m: String,
    pub plat_m: String,
}

/// The first `m=` line of a message's SDP (the gateway port the reader must send to).
pub fn m_line(msg: &str) -> String {
    msg.lines()
        .find(|l| l.starts_with("m="))
        .unwrap_or_default()
        .to_string()
}

/// The platform invites the device at `reg_contact` (call `n`, media to `plat_port`, from
/// `dev_port`), the device answers, the platform ACKs.
#[allow(clippy::too_many_arguments)]
pub fn invite_device(
    platform: &UdpSocket,
    device: &UdpSocket,
    pair: &Pair,
    reg_contact: &str,
    n: u32,
    plat_port: u16,
    dev_port: u16,
) -> Dialog {
    let (gw_b, dev_aor) = ("10.62.0.1:5062", format!("<sip:{DEVICE_ID}@3402000000>"));
    let offer = format!("v=0\r\no=34020000002000000001 0 0 IN IP4 10.62.0.100\r\ns=Play\r\nc=IN IP4 10.62.0.100\r\nt=0 0\r\nm=video {plat_port} RTP/AVP 96\r\na=recvonly\r\na=rtpmap:96 PS/90000\r\ny=0305419896\r\n");
    let plat_from = format!("<sip:{PLATFORM_ID}@3402000000>;tag=plat9{n}");
    let call_id = format!("call-{n}@10.62.0.100");
    let inv = sip_request(
        "INVITE",
        reg_contact,
        true,
        (&plat_from, &dev_aor),
        &call_id,
        20,
        &format!(
            "Contact: <sip:{PLATFORM_ID}@10.62.0.100:5090>\r\nContent-Type: application/sdp\r\n"
        ),
        &offer,
    );
    platform.send_to(inv.as_bytes(), gw_b).unwrap();
    let (inv_in, from) = recv_sip(device, "INVITE ", pair);
    let answer = format!("v=0\r\no=34020000001320000001 0 0 IN IP4 10.61.0.100\r\ns=Play\r\nc=IN IP4 10.61.0.100\r\nt=0 0\r\nm=video {dev_port} RTP/AVP 96\r\na=sendonly\r\na=rtpmap:96 PS/90000\r\ny=0305419896\r\n");
    let ok = sip_reply(
        &inv_in,
        "200 OK",
        &format!("dev2{n}"),
        &format!(
            "Contact: <sip:{DEVICE_ID}@10.61.0.100:5064>\r\nContent-Type: application/sdp\r\n"
        ),
        &answer,
    );
    device.send_to(ok.as_bytes(), from).unwrap();
    let (ok_in, _) = recv_sip(platform, "SIP/2.0 200", pair);
    let dev_contact = contact_uri(&ok_in);
    let dev_to = header(&ok_in, "To");
    let ack = sip_request(
        "ACK",
        &dev_contact,
        true,
        (&plat_from, &dev_to),
        &call_id,
        20,
        "",
        "",
    );
    platform.send_to(ack.as_bytes(), gw_b).unwrap();
    recv_sip(device, "ACK ", pair);
    Dialog {
        call_id,
        plat_from,
        dev_to,
        dev_contact,
        plat_contact: contact_uri(&inv_in),
        dev_call_id: header(&inv_in, "Call-ID"),
        dev_from: header(&ok, "To"),
        dev_to_plat: header(&inv_in, "From"),
        dev_m: m_line(&inv_in),
        plat_m: m_line(&ok_in),
    }
}

/// The device (A, 10.61.0.100:5064) registers with the platform (B, 10.62.0.100:5090)
/// through the `reg` route (`expires` 0: unregisters; `cseq` in the device's sequence);
/// returns the registration's contact as the platform sees it.
pub fn register_device(
    device: &UdpSocket,
    platform: &UdpSocket,
    pair: &Pair,
    expires: u32,
    cseq: u32,
) -> String {
    let dev_aor = format!("<sip:{DEVICE_ID}@3402000000>");
    let gw_a = "10.61.0.1:5062";
    // REGISTER, device → platform.
    let reg = sip_request(
        "REGISTER",
        &format!("sip:{PLATFORM_ID}@3402000000"),
        false,
        (&format!("{dev_aor};tag=dev1"), &dev_aor),
        "reg-1@10.61.0.100",
        cseq,
        &format!("Contact: <sip:{DEVICE_ID}@10.61.0.100:5064>\r\nExpires: {expires}\r\n"),
        "",
    );
    device.send_to(reg.as_bytes(), gw_a).unwrap();
    let (req, from) = recv_sip(platform, "REGISTER ", pair);
    let reg_contact = contact_uri(&req);
    assert!(reg_contact.contains("10.62.0.1:5062"), "{req}");
    let ok = sip_reply(
        &req,
        "200 OK",
        "plat1",
        &format!("Contact: <{reg_contact}>\r\nExpires: {expires}\r\n"),
        "",
    );
    platform.send_to(ok.as_bytes(), from).unwrap();
    recv_sip(device, "SIP/2.0 200", pair);
    reg_contact
}

/// The platform (`by_platform`) or the device ends call `d` with a BYE (`cseq` in its
/// sender's sequence), the other side answers 200; both messages cross the gateway.
pub fn hang_up(
    d: &Dialog,
    by_platform: bool,
    cseq: u32,
    platform: &UdpSocket,
    device: &UdpSocket,
    pair: &Pair,
) {
    let (gw_a, gw_b) = ("10.61.0.1:5062", "10.62.0.1:5062");
    let (bye, by, to, gw, cid_there) = if by_platform {
        let bye = sip_request(
            "BYE",
            &d.dev_contact,
            true,
            (&d.plat_from, &d.dev_to),
            &d.call_id,
            cseq,
            "",
            "",
        );
        (bye, platform, device, gw_b, &d.dev_call_id)
    } else {
        let bye = sip_request(
            "BYE",
            &d.plat_contact,
            false,
            (&d.dev_from, &d.dev_to_plat),
            &d.dev_call_id,
            cseq,
            "",
            "",
        );
        (bye, device, platform, gw_a, &d.call_id)
    };
    by.send_to(bye.as_bytes(), gw).unwrap();
    let (bye_in, from) = recv_sip(to, "BYE ", pair);
    assert_eq!(&header(&bye_in, "Call-ID"), cid_there, "{bye_in}");
    to.send_to(sip_reply(&bye_in, "200 OK", "x", "", "").as_bytes(), from)
        .unwrap();
    let (bye_ok, _) = recv_sip(by, "SIP/2.0 200", pair);
    assert!(bye_ok.contains("BYE"), "{bye_ok}");
}

/// A re-INVITE in call `d` from the platform (`by_platform`) or the device (`cseq` in its
/// sender's sequence), each side's SDP offering its media port again (`ports`: the
/// platform's, the device's); the other side answers 200 with its SDP, the sender ACKs.
/// Each side must see the gateway port it saw at the call's setup.
pub fn re_invite(
    d: &Dialog,
    by_platform: bool,
    cseq: u32,
    (plat_port, dev_port): (u16, u16),
    platform: &UdpSocket,
    device: &UdpSocket,
    pair: &Pair,
) {
    let sdp = |id: &str, ip: &str, port: u16, dir: &str| {
        format!("v=0\r\no={id} 0 1 IN IP4 {ip}\r\ns=Play\r\nc=IN IP4 {ip}\r\nt=0 0\r\nm=video {port} RTP/AVP 96\r\na={dir}\r\na=rtpmap:96 PS/90000\r\ny=0305419896\r\n")
    };
    let plat_sdp = sdp(PLATFORM_ID, "10.62.0.100", plat_port, "recvonly");
    let dev_sdp = sdp(DEVICE_ID, "10.61.0.100", dev_port, "sendonly");
    let plat_contact = format!("Contact: <sip:{PLATFORM_ID}@10.62.0.100:5090>\r\n");
    let dev_contact = format!("Contact: <sip:{DEVICE_ID}@10.61.0.100:5064>\r\n");
    let sdp_type = "Content-Type: application/sdp\r\n";
    // (sender, receiver, gateway, Request-URI, From, To, Call-ID, and each SDP, Contact and
    // m= line seen at the setup for the sender and the receiver)
    let (by, to, gw, ruri, from, to_hdr, cid) = if by_platform {
        let v = (&d.plat_from, &d.dev_to, &d.call_id);
        (
            platform,
            device,
            "10.62.0.1:5062",
            &d.dev_contact,
            v.0,
            v.1,
            v.2,
        )
    } else {
        let v = (&d.dev_from, &d.dev_to_plat, &d.dev_call_id);
        (
            device,
            platform,
            "10.61.0.1:5062",
            &d.plat_contact,
            v.0,
            v.1,
            v.2,
        )
    };
    let (mine, theirs) = if by_platform {
        (
            (&plat_sdp, &plat_contact, &d.plat_m),
            (&dev_sdp, &dev_contact, &d.dev_m),
        )
    } else {
        (
            (&dev_sdp, &dev_contact, &d.dev_m),
            (&plat_sdp, &plat_contact, &d.plat_m),
        )
    };
    let (cid_there, start) = if by_platform {
        (&d.dev_call_id, true)
    } else {
        (&d.call_id, false)
    };
    let inv = sip_request(
        "INVITE",
        ruri,
        start,
        (from, to_hdr),
        cid,
        cseq,
        &format!("{}{sdp_type}", mine.1),
        mine.0,
    );
    by.send_to(inv.as_bytes(), gw).unwrap();
    let (inv_in, src) = recv_sip(to, "INVITE ", pair);
    assert_eq!(&header(&inv_in, "Call-ID"), cid_there, "{inv_in}");
    assert_eq!(
        &m_line(&inv_in),
        theirs.2,
        "the receiver's gateway port is the same: {inv_in}"
    );
    let ok = sip_reply(
        &inv_in,
        "200 OK",
        "x",
        &format!("{}{sdp_type}", theirs.1),
        theirs.0,
    );
    to.send_to(ok.as_bytes(), src).unwrap();
    let (ok_in, _) = recv_sip(by, "SIP/2.0 200", pair);
    assert_eq!(
        &m_line(&ok_in),
        mine.2,
        "the sender's gateway port is the same: {ok_in}"
    );
    let ack = sip_request("ACK", ruri, start, (from, to_hdr), cid, cseq, "", "");
    by.send_to(ack.as_bytes(), gw).unwrap();
    recv_sip(to, "ACK ", pair);
}

/// keepalived's config for one node of a pair: VRRPv3 with 50 ms adverts on `interface`
/// (its VRRP process at real-time priority, as in `systemd/keepalived-vgate.conf`),
/// `nopreempt`, the virtual addresses `vips` (`"ADDR/LEN dev IF"`), `vgate health` as
/// track script and `track_file` (written by `vgate health --track-file`), and the notify
/// hooks: `notify(ROLE)` is the command keepalived runs.
pub struct Keepalived<'a> {
    pub node: &'a str,
    pub priority: u32,
    pub interface: &'a str,
    pub router_id: u8,
    pub vips: &'a [String],
    pub track_file: &'a str,
    pub notify: &'a dyn Fn(&str) -> String,
}

impl Keepalived<'_> {
    pub fn config(&self) -> String {
        let vgate = super::vgate_bin().display().to_string();
        // The advert interval (seconds; the bench's --advert-int), 0.05 by default as in
        // systemd/keepalived-vgate.conf.
        let advert = std::env::var("VGATE_HA_ADVERT_INT").unwrap_or_else(|_| "0.05".into());
        // The VRRP process at real-time priority (the example config's; the bench's
        // --rt-priority 0 leaves it out, to compare).
        let rt = match std::env::var("VGATE_HA_RT_PRIORITY").as_deref() {
            Ok("0") => String::new(),
            Ok(p) => format!(
                "    vrrp_rt_priority {p}\n    vrrp_rlimit_rttime 200000\n    vrrp_no_swap\n"
            ),
            Err(_) => {
                "    vrrp_rt_priority 40\n    vrrp_rlimit_rttime 200000\n    vrrp_no_swap\n".into()
            }
        };
        let vips: String = self.vips.iter().map(|v| format!("        {v}\n")).collect();
        let n = |role: &str| (self.notify)(role);
        format!(
            r#"
global_defs {{
    router_id {node}
    script_user root
    enable_script_security
    vrrp_version 3
{rt}}}
vrrp_script vgate_health {{
    script "{vgate} health --admin {ADMIN}"
    interval 1
    timeout 1
    fall 1
    rise 1
}}
track_file vgate_alive {{
    file "{track_file}"
    weight 0
}}
vrrp_instance gw {{
    state BACKUP
    nopreempt
    interface {interface}
    virtual_router_id {router_id}
    priority {priority}
    advert_int {advert}
    virtual_ipaddress {{
{vips}    }}
    track_script {{
        vgate_health
    }}
    track_file {{
        vgate_alive weight 0
    }}
    notify_master "{master}"
    notify_backup "{backup}"
    notify_fault "{fault}"
    notify_stop "{stop}"
}}
"#,
            node = self.node,
            track_file = self.track_file,
            interface = self.interface,
            router_id = self.router_id,
            priority = self.priority,
            master = n("MASTER"),
            backup = n("BACKUP"),
            fault = n("FAULT"),
            stop = n("STOP"),
        )
    }

    /// The pid files of the keepalived started with config `conf` (its own, its VRRP
    /// child's).
    pub fn pid_files(conf: &str) -> (String, String) {
        (format!("{conf}.pid"), format!("{conf}.vrrp.pid"))
    }

    /// Writes the config to `conf` and starts keepalived in `ns` (VRRP only, in the
    /// foreground, its pid files beside the config), logging to `log`.
    pub fn start(&self, ns: &str, conf: &str, log: &str) -> Proc {
        std::fs::write(conf, self.config()).unwrap();
        let (pid, vrrp_pid) = Keepalived::pid_files(conf);
        spawn_logged(
            ns,
            &[
                "keepalived",
                "-n",
                "-l",
                "-D",
                "--vrrp",
                "-f",
                conf,
                "-p",
                &pid,
                "-r",
                &vrrp_pid,
            ],
            log,
        )
    }
}

/// `redis-server` in `ns` on port 6379 of the addresses `bind`, nothing saved, its files in
/// `dir`, `extra` options after; logging to `log`.
pub fn spawn_redis(ns: &str, bind: &[&str], dir: &str, extra: &[&str], log: &str) -> Proc {
    let mut args = vec!["redis-server", "--bind"];
    args.extend_from_slice(bind);
    args.extend_from_slice(&[
        "--port",
        "6379",
        "--save",
        "",
        "--appendonly",
        "no",
        "--protected-mode",
        "no",
        "--dir",
        dir,
    ]);
    args.extend_from_slice(extra);
    spawn_logged(ns, &args, log)
}

/// `vgate health --track-file FILE --every-ms 50` in `ns` (what `vgate-ha-health.service`
/// runs), once it wrote its first word (0: healthy).
pub fn start_watcher(ns: &str, file: &str, log: &str) -> Proc {
    let bin = super::vgate_bin().display().to_string();
    let p = spawn_logged(
        ns,
        &[
            &bin,
            "health",
            "--admin",
            ADMIN,
            "--track-file",
            file,
            "--every-ms",
            "50",
        ],
        log,
    );
    wait_for(
        "the health watcher's first word",
        Duration::from_secs(5),
        || std::fs::read_to_string(file).is_ok_and(|t| t.trim() == "0"),
        || std::fs::read_to_string(log).unwrap_or_default(),
    );
    p
}
