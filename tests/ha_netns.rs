//! Hot standby with real keepalived and redis-server: two vgate nodes in two namespaces share
//! the gateway's domain addresses through VRRP (keepalived, `track_script` = `vgate health`,
//! notify = `vgate ha-notify`); a Redis in a management namespace holds the state. A static
//! route is added at run time through the active's admin API, the standby copies it, an RTP
//! stream runs through it, the active vgate is killed with SIGKILL: keepalived moves the
//! addresses, the standby takes over, the stream resumes on the same gateway port. The gap
//! at the receiver is printed (a figure; bounded generously, never tight).
//!
//! ```text
//!   ns A (sender, bridge) ──ea── n1 ──eb── ns B (receiver, bridge)
//!                         ──ea── n2 ──eb──
//!   ns M (redis, bridge)  ──em── n1, n2
//! ```
//!
//! Needs root, iproute2, keepalived and redis-server.

mod common;

use std::io::Write;
use std::net::{SocketAddrV4, UdpSocket};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::proc::Proc;

const NEEDS: &[(&str, &str)] = &[
    ("ip", "iproute2"),
    ("keepalived", "keepalived"),
    ("redis-server", "redis-server"),
];

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn ns_sh(ns: &str, cmd: &str) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "sh", "-c", cmd])
        .output()
        .expect("ip netns exec");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The namespaces of one run, deleted on drop (also when the test fails).
struct Net {
    tag: String,
    names: Vec<String>,
    dir: tempfile::TempDir,
}

impl Net {
    fn ns(&self, which: &str) -> String {
        format!("{}{which}", self.tag)
    }

    fn up() -> Net {
        let tag = format!("ha{}", std::process::id() % 100_000);
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

    fn path(&self, name: &str) -> String {
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

fn vgate_config(net: &Net, node: &str) -> String {
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
[control]
listen = "127.0.0.1:9940"
[ha]
node = "{node}"
redis = "10.69.0.100:6379"
key_prefix = "{tag}"
"#,
        tag = net.tag
    )
}

fn keepalived_config(node: &str, priority: u32, track_file: &str) -> String {
    let vgate = common::vgate_bin().display().to_string();
    format!(
        r#"
global_defs {{
    router_id {node}
    script_user root
    vrrp_version 3
}}
vrrp_script vgate_health {{
    script "{vgate} health --admin 127.0.0.1:9940"
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
    interface ea
    virtual_router_id 61
    priority {priority}
    advert_int 0.1
    virtual_ipaddress {{
        10.61.0.1/24 dev ea
        10.62.0.1/24 dev eb
    }}
    track_script {{
        vgate_health
    }}
    track_file {{
        vgate_alive weight 0
    }}
    notify_master "{vgate} ha-notify --admin 127.0.0.1:9940 MASTER"
    notify_backup "{vgate} ha-notify --admin 127.0.0.1:9940 BACKUP"
    notify_fault "{vgate} ha-notify --admin 127.0.0.1:9940 FAULT"
}}
"#
    )
}

fn admin_json(ns: &str, path: &str) -> Option<serde_json::Value> {
    let (ns, path) = (ns.to_owned(), path.to_owned());
    common::in_netns(&ns, move || {
        common::admin::try_get("127.0.0.1:9940", &path)
            .ok()
            .and_then(|b| serde_json::from_str(&b).ok())
    })
}

fn admin_post(ns: &str, path: &str, body: &str) -> String {
    let (ns, path, body) = (ns.to_owned(), path.to_owned(), body.to_owned());
    common::in_netns(&ns, move || {
        use std::io::Read;
        let mut s = std::net::TcpStream::connect("127.0.0.1:9940").expect("admin");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            s,
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    })
}

fn wait_for(what: &str, within: Duration, mut f: impl FnMut() -> bool, log: impl Fn() -> String) {
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

fn role(ns: &str) -> Option<String> {
    admin_json(ns, "/api/v1/ha").and_then(|v| v["role"].as_str().map(str::to_owned))
}

fn spawn_logged(ns: &str, args: &[&str], log: &str) -> Proc {
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

fn tail(path: &str) -> String {
    let t = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = t.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

#[test]
fn kill9_of_the_active_moves_the_addresses_and_the_stream_resumes_on_the_same_port() {
    require!("ha_netns", true, NEEDS);
    let net = Net::up();
    let (ns_a, ns_b, ns_m, n1, n2) = (
        net.ns("a"),
        net.ns("b"),
        net.ns("m"),
        net.ns("n1"),
        net.ns("n2"),
    );
    let redis_log = net.path("redis.log");
    let _redis = spawn_logged(
        &ns_m,
        &[
            "redis-server",
            "--bind",
            "10.69.0.100",
            "--port",
            "6379",
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
            "--dir",
            &net.path(""),
        ],
        &redis_log,
    );
    let mut vgates = Vec::new();
    let mut logs = Vec::new();
    for (node, ns) in [("n1", &n1), ("n2", &n2)] {
        let cfg = net.path(&format!("{node}.toml"));
        std::fs::write(&cfg, vgate_config(&net, node)).unwrap();
        let log = net.path(&format!("{node}.log"));
        let bin = common::vgate_bin().display().to_string();
        vgates.push(spawn_logged(
            ns,
            &[&bin, "run", "--config", &cfg, "--stats-interval", "0"],
            &log,
        ));
        logs.push(log);
    }
    let logs2 = logs.clone();
    let all_logs = move || {
        logs2
            .iter()
            .map(|l| format!("--- {l}\n{}", tail(l)))
            .collect::<Vec<_>>()
            .join("\n")
    };
    for ns in [&n1, &n2] {
        wait_for(
            "vgate healthy as a standby (state store read)",
            Duration::from_secs(15),
            || {
                admin_json(ns, "/api/v1/health")
                    .is_some_and(|v| v["healthy"] == true && v["role"] == "standby")
            },
            || format!("{}\n--- redis\n{}", all_logs(), tail(&redis_log)),
        );
    }
    // `vgate health --track-file`: a crash is seen within 100 ms (keepalived's track_file),
    // `vgate health` as track_script is the backstop (whole seconds).
    let mut watchers = Vec::new();
    for (node, ns) in [("n1", &n1), ("n2", &n2)] {
        let file = net.path(&format!("{node}.alive"));
        let log = net.path(&format!("watch-{node}.log"));
        let bin = common::vgate_bin().display().to_string();
        watchers.push(spawn_logged(
            ns,
            &[
                &bin,
                "health",
                "--admin",
                "127.0.0.1:9940",
                "--track-file",
                &file,
                "--every-ms",
                "50",
            ],
            &log,
        ));
        wait_for(
            "the health watcher's first word",
            Duration::from_secs(5),
            || std::fs::read_to_string(&file).is_ok_and(|t| t.trim() == "0"),
            || tail(&log),
        );
    }
    let mut keepaliveds = Vec::new();
    for (node, ns, prio) in [("n1", &n1, 150), ("n2", &n2, 100)] {
        let conf = net.path(&format!("keepalived-{node}.conf"));
        let alive = net.path(&format!("{node}.alive"));
        std::fs::write(&conf, keepalived_config(node, prio, &alive)).unwrap();
        let log = net.path(&format!("keepalived-{node}.log"));
        keepaliveds.push(spawn_logged(
            ns,
            &[
                "keepalived",
                "-n",
                "-l",
                "-D",
                "--vrrp",
                "-f",
                &conf,
                "-p",
                &net.path(&format!("{node}.pid")),
                "-r",
                &net.path(&format!("{node}-vrrp.pid")),
            ],
            &log,
        ));
        logs.push(log);
        if node == "n1" {
            let l = logs.clone();
            wait_for(
                "n1 active through keepalived's notify",
                Duration::from_secs(15),
                || role(&n1).as_deref() == Some("active"),
                || {
                    l.iter()
                        .map(|x| format!("--- {x}\n{}", tail(x)))
                        .collect::<Vec<_>>()
                        .join("\n")
                },
            );
        }
    }
    let l = logs.clone();
    let show = move || {
        l.iter()
            .map(|x| format!("--- {x}\n{}", tail(x)))
            .collect::<Vec<_>>()
            .join("\n")
    };
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(role(&n2).as_deref(), Some("standby"), "{}", show());
    assert!(
        ns_sh(&n1, "ip -4 addr show dev eb").contains("10.62.0.1/"),
        "n1 holds the B address"
    );

    // A static route at run time through the active's admin API.
    let resp = admin_post(
        &n1,
        "/api/v1/routes",
        r#"{"name":"cam1","domain":"a","port":20010,"destination":"10.62.0.100:40000","egress_port":30010,"source_validation":"latch"}"#,
    );
    assert!(resp.starts_with("HTTP/1.1 201"), "route not added: {resp}");

    // The receiver in B and a 200 packets/s RTP sender in A.
    let stop = Arc::new(AtomicBool::new(false));
    let arrivals: Arc<Mutex<Vec<(Instant, u16, SocketAddrV4)>>> = Arc::default();
    let receiver = {
        let (stop, arrivals, ns) = (Arc::clone(&stop), Arc::clone(&arrivals), ns_b.clone());
        std::thread::spawn(move || {
            common::enter_netns(&ns).unwrap();
            let s = UdpSocket::bind("10.62.0.100:40000").unwrap();
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
        let (stop, ns) = (Arc::clone(&stop), ns_a.clone());
        std::thread::spawn(move || {
            common::enter_netns(&ns).unwrap();
            let s = UdpSocket::bind("10.61.0.100:5000").unwrap();
            let mut pkt = [0u8; 172];
            pkt[0] = 0x80;
            pkt[1] = 96;
            pkt[8..12].copy_from_slice(&0x1234_5678u32.to_be_bytes());
            let start = Instant::now();
            let mut seq: u16 = 0;
            // Bounded: at most 60 s.
            while !stop.load(Relaxed) && start.elapsed() < Duration::from_secs(60) {
                pkt[2..4].copy_from_slice(&seq.to_be_bytes());
                let _ = s.send_to(&pkt, "10.61.0.1:20010");
                seq = seq.wrapping_add(1);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let count = || arrivals.lock().unwrap().len();
    wait_for(
        "media through the active",
        Duration::from_secs(10),
        || count() >= 200,
        &show,
    );
    // The standby holds a copy of the route with its latched source.
    wait_for(
        "the standby's copy of the route, latched",
        Duration::from_secs(5),
        || {
            admin_json(&n2, "/api/v1/routes").is_some_and(|v| {
                v["routes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|r| r["port"] == 20010 && r["latched_source"] == "10.61.0.100:5000")
            })
        },
        &show,
    );

    // kill -9 of the active vgate.
    let before = count();
    vgates[0].signal(nix::sys::signal::Signal::SIGKILL);
    let killed = Instant::now();
    wait_for(
        "the stream to resume through the standby",
        Duration::from_secs(10),
        || count() >= before + 200,
        &show,
    );
    stop.store(true, Relaxed);
    sender.join().unwrap();
    receiver.join().unwrap();
    let arrivals = arrivals.lock().unwrap().clone();
    let gateway: SocketAddrV4 = "10.62.0.1:30010".parse().unwrap();
    assert!(
        arrivals.iter().all(|(_, _, from)| *from == gateway),
        "every packet from the same gateway port {gateway}, before and after the takeover"
    );
    let (gap, lost) = arrivals
        .windows(2)
        .filter(|w| w[1].0 >= killed)
        .map(|w| (w[1].0 - w[0].0, w[1].1.wrapping_sub(w[0].1).wrapping_sub(1)))
        .max()
        .unwrap();
    let v = admin_json(&n2, "/api/v1/ha").expect("n2 admin");
    assert_eq!(v["role"], "active", "{v}");
    assert_eq!(v["takeovers"], 1, "{v}");
    assert!(
        ns_sh(&n2, "ip -4 addr show dev ea").contains("10.61.0.1/"),
        "n2 holds the A address"
    );
    assert!(
        ns_sh(&n2, "ip -4 addr show dev eb").contains("10.62.0.1/"),
        "n2 holds the B address"
    );
    let _ = writeln!(
        std::io::stderr(),
        "FIGURE ha kill -9 of the active vgate: largest gap at the receiver {:.0} ms ({lost} packets of 200/s lost), stream resumed from {gateway}; packets received {}",
        gap.as_secs_f64() * 1e3,
        arrivals.len()
    );
    assert!(gap < Duration::from_secs(10), "gap {gap:?}");
    drop(keepaliveds);
    drop(watchers);
    drop(vgates);
}
