//! The namespace relay harness shared by the engine tests (`engine_netns`, `afxdp_netns`):
//! a config of N static routes on the bed, RTP-like packets that say which stream and
//! sequence they are, paced senders in A, checking receivers in B, and readings of the
//! gateway namespace.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{enter_netns, Bed, BedConfig};

pub const A_PORTS: u16 = 20000;
pub const B_PORTS: u16 = 30000;
pub const SINK_PORTS: u16 = 40000;
pub const PAYLOAD: usize = 172;

/// Workers: 2 where the machine has them (one per core at most).
pub fn queues() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(2)
}

/// [`config`] without routes, parsed (for a gateway started in process).
pub fn parsed_config(bed: &Bed, mode: &str, control_port: u16) -> vgate::config::Config {
    vgate::config::parse(&config(bed, mode, 0, control_port), "test").unwrap()
}

pub fn config(bed: &Bed, mode: &str, streams: u32, control_port: u16) -> String {
    let control = format!("127.0.0.1:{control_port}");
    let s = bed.config(BedConfig {
        mode,
        queues: queues(),
        policy: "latch",
        control: &control,
        ..Default::default()
    });
    s + &stream_routes(bed, streams as u16, "s", |_| String::new())
}

/// `n` static routes A→B named `{prefix}{i}`: gateway port `A_PORTS + 2i` in A to
/// `B_IP:SINK_PORTS + i`, leaving from `B_PORTS + 2i`; `extra(i)`: route `i`'s further lines.
pub fn stream_routes(bed: &Bed, n: u16, prefix: &str, extra: impl Fn(u16) -> String) -> String {
    (0..n)
        .map(|i| {
            format!(
                "[[stream_route]]\nname = \"{prefix}{i}\"\ndomain = \"a\"\nport = {}\ndestination = \"{}:{}\"\negress_port = {}\n{}",
                A_PORTS + 2 * i,
                bed.get("B_IP"),
                SINK_PORTS + i,
                B_PORTS + 2 * i,
                extra(i)
            )
        })
        .collect()
}

/// `n` sockets bound to `addr:SINK_PORTS + i`, not blocking.
pub fn sink_sockets(addr: Ipv4Addr, n: u16) -> Vec<UdpSocket> {
    (0..n)
        .map(|i| {
            let s = UdpSocket::bind((addr, SINK_PORTS + i))
                .unwrap_or_else(|e| panic!("bind sink {addr}:{}: {e}", SINK_PORTS + i));
            s.set_nonblocking(true).unwrap();
            s
        })
        .collect()
}

/// Notes in `problems` (20 at most) a datagram sink `i` got from `from` if it did not come
/// from the gateway's `gateway:B_PORTS + 2i`.
pub fn note_wrong_source(
    problems: &mut Vec<String>,
    i: usize,
    from: std::net::SocketAddr,
    gateway: Ipv4Addr,
) {
    let want = SocketAddrV4::new(gateway, B_PORTS + 2 * i as u16);
    if from != want.into() && problems.len() < 20 {
        problems.push(format!("stream {i}: from {from}, want {want}"));
    }
}

/// An RTP packet of stream `i`, sequence `seq`, padded to [`PAYLOAD`] bytes.
pub fn packet(i: u32, seq: u32) -> [u8; PAYLOAD] {
    let mut p = [0u8; PAYLOAD];
    p[0] = 0x80;
    p[1] = 96;
    p[2..4].copy_from_slice(&(seq as u16).to_be_bytes());
    p[8..12].copy_from_slice(&i.to_be_bytes());
    p[12..16].copy_from_slice(&i.to_be_bytes());
    p[16..20].copy_from_slice(&seq.to_be_bytes());
    p
}

pub fn parse_packet(p: &[u8]) -> Option<(u32, u32)> {
    if p.len() != PAYLOAD {
        return None;
    }
    let i = u32::from_be_bytes(p[12..16].try_into().ok()?);
    let seq = u32::from_be_bytes(p[16..20].try_into().ok()?);
    Some((i, seq))
}

/// Sends `per_stream` packets on each of `streams` sockets (distinct source ports, so spread
/// over the veth's TX queues) from namespace `ns`, paced gently.
pub fn sender(
    ns: String,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    streams: u32,
    per_stream: u32,
) -> JoinHandle<u32> {
    std::thread::spawn(move || {
        enter_netns(&ns).unwrap_or_else(|e| panic!("setns {ns}: {e}"));
        let socks: Vec<UdpSocket> = (0..streams)
            .map(|_| UdpSocket::bind(SocketAddrV4::new(src, 0)).expect("bind sender"))
            .collect();
        let mut sent = 0;
        for seq in 0..per_stream {
            for (i, s) in socks.iter().enumerate() {
                let to = SocketAddrV4::new(dst, A_PORTS + 2 * i as u16);
                s.send_to(&packet(i as u32, seq), to).expect("send");
                sent += 1;
            }
            // ~12 kpps for 48 streams.
            std::thread::sleep(Duration::from_millis(4));
        }
        sent
    })
}

/// What the receivers in B saw: per stream, the sequence numbers and every wrong thing.
#[derive(Debug, Default)]
pub struct Received {
    pub per_stream: Vec<Vec<u32>>,
    pub problems: Vec<String>,
}

/// Receives on `SINK_PORTS + i` in namespace `ns` until `done` is set and nothing arrived for
/// 500 ms (or `limit` passed), checking each datagram's source and contents.
pub fn receiver(
    ns: String,
    addr: Ipv4Addr,
    gateway: Ipv4Addr,
    streams: u32,
    done: Arc<AtomicBool>,
    ready: mpsc::Sender<()>,
) -> JoinHandle<Received> {
    std::thread::spawn(move || {
        enter_netns(&ns).unwrap_or_else(|e| panic!("setns {ns}: {e}"));
        let socks = sink_sockets(addr, streams as u16);
        let _ = ready.send(());
        let mut r = Received {
            per_stream: vec![Vec::new(); streams as usize],
            problems: Vec::new(),
        };
        let mut buf = [0u8; 2048];
        let start = Instant::now();
        let mut last = Instant::now();
        let limit = Duration::from_secs(60);
        loop {
            let mut any = false;
            for (i, s) in socks.iter().enumerate() {
                while let Ok((n, from)) = s.recv_from(&mut buf) {
                    any = true;
                    note_wrong_source(&mut r.problems, i, from, gateway);
                    match parse_packet(&buf[..n]) {
                        Some((id, seq)) if id == i as u32 => r.per_stream[i].push(seq),
                        other => {
                            if r.problems.len() < 20 {
                                r.problems
                                    .push(format!("stream {i}: got {other:?} ({n} bytes)"))
                            }
                        }
                    }
                }
            }
            if any {
                last = Instant::now();
            } else {
                std::thread::sleep(Duration::from_millis(1));
            }
            let quiet = last.elapsed() > Duration::from_millis(500);
            if (done.load(Relaxed) && quiet) || start.elapsed() > limit {
                return r;
            }
        }
    })
}

/// Checks every stream got each of its `per_stream` packets exactly once.
pub fn check_delivery(r: &Received, per_stream: u32) {
    assert!(r.problems.is_empty(), "misdelivered: {:?}", r.problems);
    for (i, seqs) in r.per_stream.iter().enumerate() {
        let mut s = seqs.clone();
        s.sort_unstable();
        let before = s.len();
        s.dedup();
        assert_eq!(before, s.len(), "stream {i}: duplicates");
        assert_eq!(
            s.len() as u32,
            per_stream,
            "stream {i}: {} of {per_stream} delivered",
            s.len()
        );
    }
}

pub fn snmp_noports(ns: &str) -> u64 {
    snmp_udp(ns, "NoPorts")
}

/// A `Udp:` counter of `/proc/net/snmp` in namespace `ns` (`InDatagrams`, `NoPorts`, ...).
pub fn snmp_udp(ns: &str, field: &str) -> u64 {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "cat", "/proc/net/snmp"])
        .output()
        .expect("read snmp");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut udp = text.lines().filter(|l| l.starts_with("Udp:"));
    let (names, values) = (
        udp.next().expect("Udp header"),
        udp.next().expect("Udp values"),
    );
    let idx = names
        .split_whitespace()
        .position(|n| n == field)
        .unwrap_or_else(|| panic!("no Udp {field} in /proc/net/snmp"));
    values.split_whitespace().nth(idx).unwrap().parse().unwrap()
}

/// Receivers on `SINK_PORTS + i` (`i < n`) in namespace `ns` that count what arrives (and
/// note anything not from `gateway:B_PORTS + 2i` or not stream `i`'s packet), for tests that keep senders running while routes change. Every socket is read
/// without blocking in turn, so a busy stream never starves another (a blocking read with a
/// timeout stays on a socket that always has a packet within the timeout, and the other
/// socket's buffer overflows — which once looked like a slow route in zc mode).
pub struct Sinks {
    counts: Arc<Vec<std::sync::atomic::AtomicU64>>,
    seqs: Arc<std::sync::Mutex<Vec<Vec<u32>>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<String>>>,
}

impl Sinks {
    pub fn start(ns: String, addr: Ipv4Addr, gateway: Ipv4Addr, n: u16) -> Sinks {
        let counts: Arc<Vec<std::sync::atomic::AtomicU64>> =
            Arc::new((0..n).map(|_| Default::default()).collect());
        let stop = Arc::new(AtomicBool::new(false));
        let seqs = Arc::new(std::sync::Mutex::new(vec![Vec::new(); usize::from(n)]));
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread = {
            let (counts, stop, seqs) = (Arc::clone(&counts), Arc::clone(&stop), Arc::clone(&seqs));
            std::thread::spawn(move || {
                enter_netns(&ns).unwrap_or_else(|e| panic!("setns {ns}: {e}"));
                let socks = sink_sockets(addr, n);
                let _ = ready_tx.send(());
                let mut problems = Vec::new();
                let mut buf = [0u8; 2048];
                while !stop.load(Relaxed) {
                    let mut any = false;
                    for (i, s) in socks.iter().enumerate() {
                        while let Ok((n, from)) = s.recv_from(&mut buf) {
                            any = true;
                            note_wrong_source(&mut problems, i, from, gateway);
                            match parse_packet(&buf[..n]) {
                                Some((id, seq)) if id == i as u32 => {
                                    seqs.lock().unwrap()[i].push(seq)
                                }
                                other if problems.len() < 20 => {
                                    problems.push(format!("sink {i}: {other:?} ({n} bytes)"))
                                }
                                _ => {}
                            }
                            counts[i].fetch_add(1, Relaxed);
                        }
                    }
                    if !any {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
                problems
            })
        };
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("sinks bound");
        Sinks {
            counts,
            seqs,
            stop,
            thread: Some(thread),
        }
    }

    /// The sequence numbers sink `i` received so far, in arrival order.
    pub fn seqs(&self, i: usize) -> Vec<u32> {
        self.seqs.lock().unwrap()[i].clone()
    }

    /// Datagrams sink `i` received so far.
    pub fn count(&self, i: usize) -> u64 {
        self.counts[i].load(Relaxed)
    }

    /// Waits until sink `i` received `by` more datagrams (panics after `limit`); returns how
    /// long its first new datagram took and how long all `by` took.
    pub fn wait_growth(&self, i: usize, by: u64, limit: Duration) -> (Duration, Duration) {
        let start = self.count(i);
        let began = Instant::now();
        let mut first = None;
        while self.count(i) < start + by {
            if first.is_none() && self.count(i) > start {
                first = Some(began.elapsed());
            }
            assert!(
                began.elapsed() < limit,
                "sink {i} got {} of {by} datagrams within {limit:?}",
                self.count(i) - start
            );
            std::thread::sleep(Duration::from_micros(200));
        }
        let all = began.elapsed();
        (first.unwrap_or(all), all)
    }

    /// Stops the receivers; panics if any datagram came from elsewhere than the gateway.
    pub fn finish(mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let problems = t.join().expect("sinks");
            assert!(problems.is_empty(), "misdelivered: {problems:?}");
        }
    }
}

/// Senders for the route-change tests: one socket per gateway port `A_PORTS + 2i` (`i < n`)
/// in namespace `ns`, each sending stream `i`'s next packet about every millisecond until
/// `stop` is set (at most 60 s). Send errors are ignored: a port without a route may answer
/// with ICMP.
pub fn paced_senders(
    ns: String,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    n: u16,
    stop: Arc<AtomicBool>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        enter_netns(&ns).unwrap_or_else(|e| panic!("setns {ns}: {e}"));
        let socks: Vec<UdpSocket> = (0..n)
            .map(|_| UdpSocket::bind((src, 0)).expect("bind sender"))
            .collect();
        let mut seq = 0;
        let deadline = Instant::now() + Duration::from_secs(60);
        while !stop.load(Relaxed) && Instant::now() < deadline {
            for (i, s) in socks.iter().enumerate() {
                let _ = s.send_to(&packet(i as u32, seq), (dst, A_PORTS + 2 * i as u16));
            }
            seq += 1;
            std::thread::sleep(Duration::from_millis(1));
        }
    })
}

/// Route `i` of the route-change tests: gateway port `A_PORTS + 2i` in A to
/// `dest:SINK_PORTS + i`, leaving from `B_PORTS + 2i`, any source.
pub fn route_spec(i: u16, dest: Ipv4Addr) -> vgate::routes::RouteSpec {
    vgate::routes::RouteSpec {
        ingress: vgate::config::DomainId::A,
        port: A_PORTS + 2 * i,
        dest: SocketAddrV4::new(dest, SINK_PORTS + i),
        egress_port: B_PORTS + 2 * i,
        policy: vgate::config::SourcePolicy::Any,
        expected: None,
        rtp_only: false,
        label: format!("r{i}"),
        media: None,
    }
}

/// The bed's addresses: (A_IP, GA_IP, GB_IP, B_IP) — sender, gateway in A, gateway in B,
/// receiver.
pub fn addrs(bed: &Bed) -> (Ipv4Addr, Ipv4Addr, Ipv4Addr, Ipv4Addr) {
    (
        bed.ip("A_IP"),
        bed.ip("GA_IP"),
        bed.ip("GB_IP"),
        bed.ip("B_IP"),
    )
}

/// Where [`RouteChanges`] runs its peers: the A and B namespaces and [`addrs`] of a bed.
#[derive(Clone, Debug)]
pub struct Peers {
    pub a_ns: String,
    pub b_ns: String,
    /// (A_IP, GA_IP, GB_IP, B_IP).
    pub addrs: (Ipv4Addr, Ipv4Addr, Ipv4Addr, Ipv4Addr),
}

impl Peers {
    /// Only the peers' namespaces: a bed whose gateway runs in the root namespace (the ZC
    /// bed of `tests/pfring.rs`) has no `G_NS`.
    pub fn of(bed: &Bed) -> Peers {
        Peers {
            a_ns: bed.get("A_NS").to_owned(),
            b_ns: bed.get("B_NS").to_owned(),
            addrs: addrs(bed),
        }
    }
}

/// The route-change scenario of the engine tests, run inside the gateway namespace with an
/// in-process gateway: [`Sinks`] in B for routes 0 and 1, [`paced_senders`] in A to both
/// ports, and an admin session holding route 0's ports (`A_PORTS`, `B_PORTS`).
pub struct RouteChanges<'g> {
    pub gw: &'g vgate::gateway::Gateway,
    pub sinks: Sinks,
    pub session: vgate::routes::SessionId,
    /// The gateway's workers when the scenario started.
    pub workers: Vec<Arc<vgate::channel::WorkerStats>>,
    stop: Arc<AtomicBool>,
    senders: Option<JoinHandle<()>>,
    dest: Ipv4Addr,
    first_within: Option<Duration>,
}

impl<'g> RouteChanges<'g> {
    /// Starts the sinks and senders (in the namespaces of `peers`) and reserves route 0's
    /// ports; `first_within`: the bound on a route's first packet that
    /// [`RouteChanges::wait_growth`] checks, if any. No route yet.
    pub fn start(
        gw: &'g vgate::gateway::Gateway,
        peers: Peers,
        first_within: Option<Duration>,
    ) -> RouteChanges<'g> {
        use vgate::config::DomainId;
        let Peers { a_ns, b_ns, addrs } = peers;
        let (a_ip, ga_ip, gb_ip, b_ip) = addrs;
        let sinks = Sinks::start(b_ns, b_ip, gb_ip, 2);
        let stop = Arc::new(AtomicBool::new(false));
        let senders = paced_senders(a_ns, a_ip, ga_ip, 2, Arc::clone(&stop));
        let session = gw
            .routes
            .open_session(vgate::routes::SessionKind::Admin, "test");
        for (d, p) in [(DomainId::A, A_PORTS), (DomainId::B, B_PORTS)] {
            gw.routes.reserve_port(session, d, p).unwrap();
        }
        RouteChanges {
            gw,
            sinks,
            session,
            workers: gw.worker_stats(),
            stop,
            senders: Some(senders),
            dest: b_ip,
            first_within,
        }
    }

    /// Installs route 0 (on the session's ports).
    pub fn add_first(&self) -> Arc<vgate::routes::StreamRoute> {
        self.gw
            .routes
            .add_route(self.session, route_spec(0, self.dest))
            .unwrap()
    }

    /// Installs route 1 on ports reserved now by a second session (a new egress socket).
    pub fn add_second(&self) -> Arc<vgate::routes::StreamRoute> {
        use vgate::config::DomainId;
        let routes = &self.gw.routes;
        let s2 = routes.open_session(vgate::routes::SessionKind::Admin, "second");
        routes.reserve_port(s2, DomainId::A, A_PORTS + 2).unwrap();
        routes.reserve_port(s2, DomainId::B, B_PORTS + 2).unwrap();
        routes.add_route(s2, route_spec(1, self.dest)).unwrap()
    }

    /// Waits until route `i`'s sink received `by` more datagrams (10 s at most) and prints
    /// how long the first and all took; checks the first came within the bound, if any.
    pub fn wait_growth(&self, i: usize, by: u64) {
        let (first, all) = self.sinks.wait_growth(i, by, Duration::from_secs(10));
        eprintln!("route {i}: first packet after {first:?}, {by} packets after {all:?}");
        if let Some(bound) = self.first_within {
            assert!(
                first < bound,
                "route {i} took {first:?} to forward its first packet"
            );
        }
    }

    /// Stops and joins the senders.
    pub fn stop_senders(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.senders.take() {
            t.join().unwrap();
        }
    }

    /// Stops the senders, then the sinks (panics on a misdelivered datagram).
    pub fn finish(mut self) {
        self.stop_senders();
        self.sinks.finish();
    }

    /// Waits `settle`, then checks route 0's sink got nothing: no route forwards yet.
    pub fn assert_nothing_before_a_route(&self, settle: Duration) {
        std::thread::sleep(settle);
        assert_eq!(
            self.sinks.count(0),
            0,
            "nothing forwarded before a route exists"
        );
    }

    /// The end of the scenario: route 0 added back forwards again, route 1 on ports opened
    /// now (a new egress socket) starts while route 0 goes on; then [`RouteChanges::finish`]
    /// and no worker restarted or stopped.
    pub fn readd_add_second_and_finish(self) {
        self.add_first();
        self.wait_growth(0, 50);
        self.add_second();
        self.wait_growth(1, 50);
        self.wait_growth(0, 20);
        let workers = self.workers.clone();
        self.finish();
        assert!(
            workers.iter().all(|w| !w.exited.load(Relaxed)),
            "no worker restarted or stopped"
        );
    }
}

/// The links in namespace `ns` that carry an XDP program.
pub fn xdp_links(ns: &str) -> Vec<String> {
    let out = Command::new("ip")
        .args(["-n", ns, "-d", "link", "show"])
        .output()
        .expect("ip link show");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("prog/xdp"))
        .map(str::to_owned)
        .collect()
}

/// Panics if a link in namespace `ns` still carries an XDP program (after vgate stopped).
pub fn assert_no_xdp_left(ns: &str) {
    assert!(
        xdp_links(ns).is_empty(),
        "nothing left: {:?}",
        xdp_links(ns)
    );
}

/// Numbered traffic across the bed: [`bed_receiver`]s in B, then a [`sender`] in A
/// (`per_stream` packets on each of `streams` streams to the gateway's A address). What was
/// sent, and what arrived once the receivers went quiet.
pub fn relay_across(bed: &Bed, streams: u32, per_stream: u32) -> (u32, Received) {
    let done = Arc::new(AtomicBool::new(false));
    let rx = bed_receiver(bed, streams, Arc::clone(&done));
    let t0 = Instant::now();
    let Peers { a_ns, addrs, .. } = Peers::of(bed);
    let sent = sender(a_ns, addrs.0, addrs.1, streams, per_stream)
        .join()
        .expect("sender");
    eprintln!("sent {sent} in {:?}", t0.elapsed());
    done.store(true, Relaxed);
    (sent, rx.join().expect("receiver"))
}

/// A [`relay_across`] run through `vg` (a `vgate run` on [`config`]'s `streams` routes), then
/// `vg` stopped and [`check_relay`]: its totals, printed and checked.
pub fn relay_and_check(
    test: &str,
    bed: &Bed,
    vg: super::vgate::Vgate,
    streams: u32,
    per_stream: u32,
) -> super::vgate::Totals {
    let (sent, got) = relay_across(bed, streams, per_stream);
    let totals = vg.stop();
    eprintln!("{test}: sent {sent}\n{}", totals.raw);
    check_relay(test, &totals, (sent, &got), streams, per_stream);
    totals
}

/// The checks of a [`relay_across`] run of `per_stream` packets on each of `streams` routes
/// `s0…` (the [`config`] routes), from the totals of `vgate run`: all sent, each delivered
/// exactly once; the forward channel sent them all and dropped none; every route forwarded
/// its packets and lost none; where there are two queues, at least two workers forwarded
/// (`test` names the run when that part cannot be checked).
pub fn check_relay(
    test: &str,
    totals: &super::vgate::Totals,
    (sent, got): (u32, &Received),
    streams: u32,
    per_stream: u32,
) {
    use super::vgate::{kv, num};
    let raw = &totals.raw;
    assert_eq!(sent, streams * per_stream);
    check_delivery(got, per_stream);
    totals.assert_forwarded_all(sent);
    let busy_workers = raw
        .lines()
        .filter(|l| l.starts_with("worker_channel ") && l.contains("channel=forward"))
        .map(kv)
        .filter(|m| num(m, "tx_packets") > 0)
        .count();
    if queues() >= 2 {
        assert!(busy_workers >= 2, "at least two queues worked: {raw}");
    } else {
        super::part_did_not_run(test, "one CPU: whether two queues both worked");
    }
    assert_eq!(totals.routes.len(), streams as usize, "{raw}");
    for i in 0..streams {
        let name = format!("s{i}");
        assert_eq!(
            totals.route(&name, "tx_packets"),
            u64::from(per_stream),
            "{raw}"
        );
        assert_eq!(totals.route(&name, "rtp_lost"), 0, "{raw}");
    }
}

/// Why the gateway refuses to start on `cfg` changed by `change` (panics if it starts).
pub fn start_error(
    cfg: &vgate::config::Config,
    change: impl FnOnce(&mut vgate::config::Config),
) -> String {
    let mut c = cfg.clone();
    change(&mut c);
    vgate::gateway::Gateway::start(c, None)
        .err()
        .expect("the gateway refuses this config")
        .to_string()
}

/// For [`start_error`]: domain A on an interface that does not exist (`vgnosuch0`).
pub fn no_such_interface(c: &mut vgate::config::Config) {
    c.domains[0].interface = "vgnosuch0".into();
}

/// For [`start_error`]: domain A on `lo` (one RX queue) with two queues on CPUs 0 and 1.
pub fn more_queues_than_lo_has(c: &mut vgate::config::Config) {
    c.domains[0].interface = "lo".into();
    c.engine.queues = 2;
    c.engine.cpus = vec![0, 1];
}

/// [`receiver`] for `streams` streams on the bed (`B_IP` in `B_NS`, from `GB_IP`), bound
/// before this returns.
pub fn bed_receiver(bed: &Bed, streams: u32, done: Arc<AtomicBool>) -> JoinHandle<Received> {
    let (ready_tx, ready_rx) = mpsc::channel();
    let rx = receiver(
        bed.get("B_NS").to_owned(),
        bed.ip("B_IP"),
        bed.ip("GB_IP"),
        streams,
        done,
        ready_tx,
    );
    ready_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("receivers bound");
    rx
}
