//! CPU per packet of a GB/T 28181 TCP→UDP bridged stream (a stream leg: read, RFC 4571
//! de-framing, the channel checks, one `send_to`) against a UDP→UDP stream (the stack
//! engine's worker: `recvmmsg`, checks, `sendmmsg`), in the same run, on loopback, without
//! root. `scripts/bench-gbtcp.sh` runs it; see `docs/bench-gbtcp.md` for the method.
//!
//! In one process: the stack engine with one worker, a UDP route A→B and a TCP leg whose
//! packets enter another A→B route. Senders and sinks are threads of this process too, so
//! the figure compared is the CPU time of the gateway's own thread for each path — the
//! worker `vgate-w0` for UDP, the leg `vgate-leg*` for TCP — read from
//! `/proc/self/task/*/stat`, divided by the packets that thread forwarded. Rounds alternate
//! UDP and TCP so load from the rest of the machine falls on both.
//!
//! `cargo bench --bench edge -- [--packets N] [--rounds R] [--payload BYTES]`

use std::io::Write;
use std::net::{SocketAddrV4, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vgate::config::{self, DomainId, SourcePolicy};
use vgate::edge::{Leg, LegSpec, Role};
use vgate::engine::{self, EngineKind};
use vgate::routes::legs::LegHandle;
use vgate::routes::{RouteSpec, Routes, SessionKind};
use vgate::wire::framing::Rfc4571;

/// CPU time (user + system, clock ticks) of this process's threads whose name starts with
/// `prefix`.
fn thread_ticks(prefix: &str) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        if !stat[open + 1..close].starts_with(prefix) {
            continue;
        }
        let f: Vec<&str> = stat[close + 2..].split(' ').collect();
        // Fields 14 and 15 of stat (utime, stime) are 11 and 12 after the command.
        total += f[11].parse::<u64>().unwrap_or(0) + f[12].parse::<u64>().unwrap_or(0);
    }
    total
}

fn ticks_per_second() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64
}

fn rtp(seq: u32, len: usize) -> Vec<u8> {
    let mut p = vec![0u8; len];
    p[0] = 0x80;
    p[1] = 96;
    p[2..4].copy_from_slice(&(seq as u16).to_be_bytes());
    p[8..12].copy_from_slice(&0x1234u32.to_be_bytes());
    p
}

/// A UDP sink counting datagrams until `stop`.
fn sink(addr: &str, stop: Arc<AtomicBool>) -> (u16, Arc<AtomicU64>, std::thread::JoinHandle<()>) {
    let s = UdpSocket::bind(addr).unwrap();
    let _ = nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::RcvBuf, &(8 << 20));
    s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let port = s.local_addr().unwrap().port();
    let n = Arc::new(AtomicU64::new(0));
    let n2 = Arc::clone(&n);
    let h = std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        while !stop.load(Relaxed) {
            if s.recv(&mut buf).is_ok() {
                n2.fetch_add(1, Relaxed);
            }
        }
    });
    (port, n, h)
}

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Waits until `n` reaches `want` or stops moving for a second.
fn settle(n: &AtomicU64, want: u64) -> u64 {
    let mut last = (n.load(Relaxed), Instant::now());
    loop {
        let now = n.load(Relaxed);
        if now >= want {
            return now;
        }
        if now != last.0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(1) {
            return now;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn main() {
    let packets = arg("--packets", 200_000);
    let rounds = arg("--rounds", 3);
    let payload = arg("--payload", 1328) as usize;
    let cfg = config::parse(
        r#"
[domains.a]
interface = "lo"
address = "127.0.0.1"
media_ports = "41000-41099"
[domains.b]
interface = "lo"
address = "127.0.0.2"
media_ports = "42000-42099"
[engine]
mode = "stack"
queues = 1
"#,
        "bench",
    )
    .unwrap();
    let mut eng = engine::build(&cfg, EngineKind::Stack).expect("stack engine");
    let routes = Arc::new(Routes::new(&cfg, eng.port_hooks()));
    let stop = Arc::new(AtomicBool::new(false));
    let workers = eng.start(Arc::clone(&routes), Arc::clone(&stop)).unwrap();
    let s = routes.open_session(SessionKind::Admin, "bench");
    let (a1, b1) = (
        routes.alloc_pair(s, DomainId::A).unwrap(),
        routes.alloc_pair(s, DomainId::B).unwrap(),
    );
    let (a2, b2) = (
        routes.alloc_pair(s, DomainId::A).unwrap(),
        routes.alloc_pair(s, DomainId::B).unwrap(),
    );
    let sink_stop = Arc::new(AtomicBool::new(false));
    let (p1, n1, h1) = sink("127.0.0.2:0", Arc::clone(&sink_stop));
    let (p2, n2, h2) = sink("127.0.0.2:0", Arc::clone(&sink_stop));
    let route = |port, dest_port, egress_port, label: &str| RouteSpec {
        ingress: DomainId::A,
        port,
        dest: SocketAddrV4::new("127.0.0.2".parse().unwrap(), dest_port),
        egress_port,
        policy: SourcePolicy::Strict,
        expected: Some("127.0.0.1:0".parse().unwrap()),
        rtp_only: true,
        label: label.into(),
        media: None,
    };
    routes.add_route(s, route(a1, p1, b1, "udp")).unwrap();
    routes.add_route(s, route(a2, p2, b2, "tcp")).unwrap();
    let leg = Leg::start(
        LegSpec {
            label: "bench leg".into(),
            session: s,
            domain: DomainId::A,
            role: Role::Passive,
            local: SocketAddrV4::new("127.0.0.1".parse().unwrap(), a2),
            peer: "127.0.0.1:0".parse().unwrap(),
            within: None,
            interface: None,
            framing: Box::new(Rfc4571),
            max_payload: 1472,
            slots: 256,
            connect_for: Duration::from_secs(5),
            on_close: None,
            close_grace: Duration::ZERO,
            fallback_port: None,
        },
        Arc::clone(&routes),
        Some(eng.ports()),
    )
    .unwrap();
    let mut tcp = TcpStream::connect(("127.0.0.1", a2)).unwrap();
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let hz = ticks_per_second();
    println!("# packets per round: {packets}, payload {payload} bytes, {rounds} rounds, loopback, one worker");
    println!("round path   forwarded  lost  thread_cpu_s  ns_per_packet");
    let (mut udp_ns, mut tcp_ns) = (Vec::new(), Vec::new());
    // Paced in bursts of 64 packets per millisecond (64 000 packets/s): under what either
    // path forwards without loss here, so both are measured at the zero-loss point.
    let burst = 64u64;
    for round in 1..=rounds {
        // UDP -> UDP through the worker.
        let (t0, base) = (thread_ticks("vgate-w"), n1.load(Relaxed));
        let start = Instant::now();
        for i in 0..packets {
            let _ = udp.send_to(&rtp(i as u32, payload), ("127.0.0.1", a1));
            if i % burst == burst - 1 {
                let due = start + Duration::from_micros(1000 * (i / burst + 1));
                if let Some(d) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(d);
                }
            }
        }
        let got = settle(&n1, base + packets) - base;
        std::thread::sleep(Duration::from_millis(250)); // a worker CPU sample
        let cpu = (thread_ticks("vgate-w") - t0) as f64 / hz;
        let ns = cpu * 1e9 / got.max(1) as f64;
        udp_ns.push(ns);
        println!(
            "{round:>5} udp   {got:>10} {:>5} {cpu:>13.2} {ns:>14.0}",
            packets - got
        );
        // TCP -> UDP through the leg.
        let (t0, base) = (thread_ticks("vgate-leg"), n2.load(Relaxed));
        let start = Instant::now();
        let mut buf = Vec::with_capacity((payload + 2) * burst as usize);
        for i in 0..packets {
            buf.extend_from_slice(&(payload as u16).to_be_bytes());
            buf.extend_from_slice(&rtp(i as u32, payload));
            if i % burst == burst - 1 {
                tcp.write_all(&buf).unwrap();
                buf.clear();
                let due = start + Duration::from_micros(1000 * (i / burst + 1));
                if let Some(d) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(d);
                }
            }
        }
        tcp.write_all(&buf).unwrap();
        let got = settle(&n2, base + packets) - base;
        let cpu = (thread_ticks("vgate-leg") - t0) as f64 / hz;
        let ns = cpu * 1e9 / got.max(1) as f64;
        tcp_ns.push(ns);
        println!(
            "{round:>5} tcp   {got:>10} {:>5} {cpu:>13.2} {ns:>14.0}",
            packets - got
        );
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let (u, t) = (median(&mut udp_ns), median(&mut tcp_ns));
    println!(
        "median ns per packet: udp->udp {u:.0}, tcp->udp {t:.0}; ratio tcp/udp {:.2}",
        t / u
    );
    let c = leg.counters().named();
    println!("leg counters: {c:?}");
    drop(tcp);
    drop(leg);
    stop.store(true, Relaxed);
    sink_stop.store(true, Relaxed);
    for w in workers {
        let _ = w.thread.join();
    }
    let _ = (h1.join(), h2.join());
}
