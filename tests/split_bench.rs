//! Benchmark (ignored by default; run by `scripts/bench-split.sh`): the forward link of the
//! split bed under injected random loss, with FEC off and on. For each (loss, FEC) point: a
//! paced stream of numbered, timestamped datagrams from domain A through half A, the forward
//! one-way link and half B to a receiver in domain B; reported: datagrams sent, delivered,
//! delivered loss, link frames dropped by the loss rule, repaired, repair rate (repaired /
//! data frames the link lost), overhead (repair frames / data frames), and the one-way
//! latency p50/p99 from sender to receiver (one clock: the namespaces share the host's), and
//! how many datagrams arrived behind a later one (`out_of_order`). Each point runs once per
//! reorder window of half B's incoming link (`SPLIT_BENCH_REORDER`, milliseconds; 0 hands
//! datagrams on as they arrive), so the latency the window adds is measured beside it.
//! One line per point, `point loss_permille=… fec=… reorder_ms=… …`, for the script to
//! tabulate.
//!
//! `split_link_tx_families` (`scripts/bench-split.sh --tx`): the sending half's cost of the
//! outgoing link per family. Half A runs mode tnapi or zc twice — its link sent with the
//! engine family of the mode (AF_PACKET / AF_XDP) and with the UDP socket
//! (`VGATE_LINK_TX=udp`) — and mode stack once, against the same half B (mode stack); the
//! configurations alternate within each round so the machine's load falls on all of them.
//! Per point: delivered loss, and half A's CPU time (its engine worker, which captures the
//! domain and sends the link; and all its datapath workers) per datagram sent.
//! `txpoint mode=… tx=… …` lines.

mod common;

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::split::{
    cam_routes, half_config, half_config_mode, link_totals, route, start_half, SplitBed, FACE_A,
    FACE_B,
};
use common::vgate::{Totals, Vgate};
use common::{Bed, BedConfig};

fn env_or(k: &str, d: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| d.to_owned())
}

/// The whitespace-separated values of `k` (default `d`), parsed.
fn env_list<T: std::str::FromStr>(k: &str, d: &str) -> Vec<T>
where
    T::Err: std::fmt::Debug,
{
    env_or(k, d)
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect()
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// `streams` routes `cam0`.. from domain A to domain B across the forward link: half A
/// takes `DA_IP:5000` on ports 20000.. and sends each to half B's face at 21000.. (from
/// 30000..); half B sends them all to `DB_IP:6000` (from 30000..), where one socket takes
/// them. With one stream, [`cam_routes`].
fn stream_routes(bed: &SplitBed, streams: u16) -> (String, String) {
    if streams <= 1 {
        return cam_routes(bed);
    }
    let (da, db) = (bed.get("DA_IP"), bed.get("DB_IP"));
    let (mut a, mut b) = (String::new(), String::new());
    for i in 0..streams {
        let name = format!("cam{i}");
        a += &route(
            &name,
            "a",
            20000 + i,
            &format!("{FACE_B}:{}", 21000 + i),
            30000 + i,
            &format!("{da}:5000"),
        );
        b += &route(
            &name,
            "a",
            21000 + i,
            &format!("{db}:6000"),
            30000 + i,
            &format!("{FACE_A}:{}", 30000 + i),
        );
    }
    (a, b)
}

/// A bench FEC setting as the halves' configs take it: `off`, `K+M`, `block`, or
/// `block/OVERHEAD/FRAMES/MS` (the block code with `fec_overhead`, `fec_block_frames`,
/// `fec_block_ms`). Returns the `fec` value and the extra keys of the link.
fn fec_keys(fec: &str) -> (String, String) {
    match fec.strip_prefix("block/") {
        Some(rest) => {
            let v: Vec<&str> = rest.split('/').collect();
            assert_eq!(v.len(), 3, "block/OVERHEAD/FRAMES/MS, not {fec}");
            (
                "block".into(),
                format!(
                    "fec_overhead = {}\nfec_block_frames = {}\nfec_block_ms = {}\n",
                    v[0], v[1], v[2]
                ),
            )
        }
        None => (fec.to_owned(), String::new()),
    }
}

/// A loss setting of the bench: `N` permille at random, or `bN` bursts of 10 consecutive
/// frames every `N` frames (`numgen inc`).
fn apply_loss(bed: &SplitBed, loss: &str) {
    match loss.strip_prefix('b') {
        Some(period) => bed.burst("forward", 10, period.parse().unwrap()),
        None => bed.loss("forward", loss.parse().unwrap()),
    }
}

#[test]
#[ignore = "benchmark: scripts/bench-split.sh"]
fn split_loss_and_fec() {
    require!(true, &[("ip", "iproute2"), ("nft", "nftables")]);
    let losses: Vec<String> = env_list("SPLIT_BENCH_LOSS", "1 10 50");
    let fecs: Vec<String> = env_list("SPLIT_BENCH_FEC", "off 8+2 16+4");
    let count: u32 = env_or("SPLIT_BENCH_COUNT", "20000").parse().unwrap();
    let pps: u32 = env_or("SPLIT_BENCH_PPS", "4000").parse().unwrap();
    let reorders: Vec<u64> = env_list("SPLIT_BENCH_REORDER", "0 25");
    let streams: u16 = env_or("SPLIT_BENCH_STREAMS", "1").parse().unwrap();
    // The single host (one gateway between the domains, no link) before and after the
    // split points: the same stream, the baseline the split's latency is held to.
    let single = env_or("SPLIT_BENCH_SINGLE", "1") == "1";
    let len: usize = 1328;
    if single {
        single_host_point(count, pps, len, streams, "before");
    }
    let bed = SplitBed::up();
    for loss in &losses {
        apply_loss(&bed, loss);
        for (fec, reorder) in fecs
            .iter()
            .flat_map(|f| reorders.iter().map(move |r| (f, *r)))
        {
            let before = bed.counters()["FWD_LOSS"];
            let (ra, rb) = stream_routes(&bed, streams);
            let (fec_value, keys) = fec_keys(fec);
            // The link with the block code is the only one with it in each half's config.
            let with_keys = |cfg: String, _section: &str| {
                cfg.replace(
                    &format!("fec = \"{fec_value}\"\n"),
                    &format!("fec = \"{fec_value}\"\n{keys}"),
                )
            };
            let a_cfg = half_config(&bed, "a", &fec_value, "off", &ra);
            let a_cfg = with_keys(a_cfg, "[split.out_link]");
            let a = start_half(&bed, "a", &a_cfg);
            let b_cfg = half_config(&bed, "b", "off", &fec_value, &rb).replacen(
                "[split.in_link]\n",
                &format!("[split.in_link]\nreorder_ms = {reorder}\n"),
                1,
            );
            let b_cfg = with_keys(b_cfg, "[split.in_link]");
            let b = start_half(&bed, "b", &b_cfg);
            let mut m = stream(&Ends::split(&bed), count, pps, len, streams);
            let ta = a.stop();
            let tb = b.stop();
            let link_lost = bed.counters()["FWD_LOSS"] - before;
            let l = link_totals(&tb.raw, "in");
            let out = link_totals(&ta.raw, "out");
            let (p50, p99, p999) = percentiles(&mut m.lat);
            let delivered = m.lat.len() as u64;
            let frames = l["packets"] + link_lost;
            let data_frames_lost = u64::from(count).saturating_sub(l["delivered"]);
            let route_sum = |t: &Totals, key: &str| -> u64 {
                if streams <= 1 {
                    return t.route("cam", key);
                }
                (0..streams).map(|i| t.route(&format!("cam{i}"), key)).sum()
            };
            // Why datagrams waited on half B (the reorder window's counters) and what was
            // lost that the loss rule did not drop: half B's link socket overflowing, half
            // A's link sends refused.
            let reorder: String = l
                .iter()
                .filter(|(k, _)| k.starts_with("reorder_"))
                .map(|(k, v)| format!(" b_{k}={v}"))
                .collect();
            println!(
                "point loss={loss} streams={streams} pps={pps} fec={fec} reorder_ms={reorder} out_of_order={} stream_out_of_order={} sent={count} delivered={delivered} delivered_loss_pct={:.4} link_frames={frames} link_dropped={link_lost} data_frames_lost={data_frames_lost} repaired={} repair_rate_pct={:.1} overhead_pct={:.1} lat_p50_us={p50:.0} lat_p99_us={p99:.0} lat_p999_us={p999:.0} counted_lost={} stream_lost={} stream_received={} stream_repaired={} stream_late={} link_bytes_per_frame={:.1} a_cpu_us_per_pkt={:.2} b_cpu_us_per_pkt={:.2} a_send_errors={} a_rx_overflow={} b_rx_overflow={}{reorder} load={}",
                m.out_of_order,
                m.stream_out_of_order,
                100.0 * (u64::from(count) - delivered) as f64 / f64::from(count),
                l["repaired"],
                if data_frames_lost == 0 { 100.0 } else { 100.0 * l["repaired"] as f64 / data_frames_lost as f64 },
                100.0 * (frames.saturating_sub(u64::from(count))) as f64 / f64::from(count),
                l["lost"],
                route_sum(&tb, "link_lost"),
                route_sum(&tb, "link_received"),
                route_sum(&tb, "link_repaired"),
                route_sum(&tb, "link_late"),
                l["bytes"] as f64 / l["packets"].max(1) as f64,
                1e6 * cpu(&ta) / f64::from(count),
                1e6 * cpu(&tb) / f64::from(count),
                out["send_errors"],
                channel_drops(&ta, "drop_rx_overflow"),
                channel_drops(&tb, "drop_rx_overflow"),
                load(),
            );
        }
    }
    drop(bed);
    if single {
        single_host_point(count, pps, len, streams, "after");
    }
}

/// The same stream through one gateway (mode stack, one worker, like each half) on
/// `scripts/testbed.sh`'s bed: a `point … fec=single-host …` line (`when`: before or after
/// the split's points).
fn single_host_point(count: u32, pps: u32, len: usize, streams: u16, when: &str) {
    let bed = Bed::up(1);
    let cfg = bed.config(BedConfig {
        mode: "stack",
        queues: 1,
        policy: "strict",
        ..Default::default()
    });
    let (a_ip, b_ip) = (bed.get("A_IP"), bed.get("B_IP"));
    let routes: String = (0..streams.max(1))
        .map(|i| {
            route(
                &format!("s{i}"),
                "a",
                20000 + i,
                &format!("{b_ip}:6000"),
                30000 + i,
                &format!("{a_ip}:5000"),
            )
        })
        .collect();
    let g = Vgate::start_with(
        &["ip", "netns", "exec", bed.get("G_NS")],
        &(cfg + &routes),
        &[],
    );
    let mut m = stream(&Ends::single(&bed), count, pps, len, streams);
    let t = g.stop();
    let (p50, p99, p999) = percentiles(&mut m.lat);
    let delivered = m.lat.len() as u64;
    println!(
        "point loss=0 streams={streams} pps={pps} fec=single-host-{when} reorder_ms=0 out_of_order={} stream_out_of_order={} sent={count} delivered={delivered} delivered_loss_pct={:.4} lat_p50_us={p50:.0} lat_p99_us={p99:.0} lat_p999_us={p999:.0} a_cpu_us_per_pkt={:.2} a_rx_overflow={} load={}",
        m.out_of_order,
        m.stream_out_of_order,
        100.0 * (u64::from(count) - delivered) as f64 / f64::from(count),
        1e6 * cpu(&t) / f64::from(count),
        channel_drops(&t, "drop_rx_overflow"),
        load(),
    );
}

/// p50, p99 and p99.9 of `lat` (ns) in µs (sorts it).
fn percentiles(lat: &mut [u64]) -> (f64, f64, f64) {
    lat.sort_unstable();
    let pct = |q: f64| {
        if lat.is_empty() {
            0.0
        } else {
            lat[((lat.len() - 1) as f64 * q) as usize] as f64 / 1e3
        }
    };
    (pct(0.5), pct(0.99), pct(0.999))
}

/// A process's datapath CPU (all workers: a half A's encodes, a half B's link worker
/// decodes), seconds.
fn cpu(t: &Totals) -> f64 {
    t.workers
        .iter()
        .filter_map(|w| w.get("cpu_seconds").and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

/// Drops of reason `name` (`drop_rx_overflow`, ...) summed over a process's channels.
fn channel_drops(t: &Totals, name: &str) -> u64 {
    t.channels
        .values()
        .filter_map(|c| c.get(name).and_then(|v| v.parse::<u64>().ok()))
        .sum()
}

/// The 1-minute load average, as `/proc/loadavg` says it.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

/// Where a bench stream runs: the sender's namespace and address (it sends from port 5000),
/// the gateway's address in domain A (ports 20000..), the receiver's namespace and address
/// (port 6000).
struct Ends {
    sender_ns: String,
    sender: Ipv4Addr,
    gateway: Ipv4Addr,
    receiver_ns: String,
    receiver: Ipv4Addr,
}

impl Ends {
    /// Domain A to domain B across the split bed.
    fn split(bed: &SplitBed) -> Ends {
        Ends {
            sender_ns: bed.get("DA_NS").to_owned(),
            sender: bed.ip("DA_IP"),
            gateway: bed.ip("GA_IP"),
            receiver_ns: bed.get("DB_NS").to_owned(),
            receiver: bed.ip("DB_IP"),
        }
    }

    /// Domain A to domain B through the one gateway of `scripts/testbed.sh`'s bed.
    fn single(bed: &Bed) -> Ends {
        Ends {
            sender_ns: bed.get("A_NS").to_owned(),
            sender: bed.ip("A_IP"),
            gateway: bed.ip("GA_IP"),
            receiver_ns: bed.get("B_NS").to_owned(),
            receiver: bed.ip("B_IP"),
        }
    }
}

/// What a bench stream measured: the one-way latency (ns) of each distinct datagram that
/// arrived, how many arrived behind a later one of any stream (`out_of_order`; the
/// gateway's reading of many sockets in turn reorders across streams) and behind a later
/// one of their own stream (`stream_out_of_order`: what the link and the reorder window
/// answer for).
struct Measured {
    lat: Vec<u64>,
    out_of_order: u64,
    stream_out_of_order: u64,
}

/// A paced stream of `count` numbered, timestamped datagrams of `len` bytes at `pps` from
/// the sender (port 5000) to the gateway's ports 20000.. (`streams` of them, in turn); what
/// reached the receiver (port 6000), [`Measured`].
fn stream(ends: &Ends, count: u32, pps: u32, len: usize, streams: u16) -> Measured {
    let (da, ga, db) = (ends.sender, ends.gateway, ends.receiver);
    let per_stream = usize::from(streams.max(1));
    let (tx, rx) = std::sync::mpsc::channel();
    let recv = {
        let ns = ends.receiver_ns.clone();
        std::thread::spawn(move || {
            common::enter_netns(&ns).unwrap();
            let s = UdpSocket::bind(SocketAddrV4::new(db, 6000)).unwrap();
            let _ = nix::sys::socket::setsockopt(
                &s,
                nix::sys::socket::sockopt::RcvBufForce,
                &(16 << 20),
            );
            tx.send(()).unwrap();
            let mut seen = vec![false; count as usize];
            let mut lat = Vec::with_capacity(count as usize);
            let (mut highest, mut out_of_order) = (None::<usize>, 0u64);
            let mut stream_highest = vec![None::<usize>; per_stream];
            let mut stream_out_of_order = 0u64;
            let mut buf = [0u8; 2048];
            s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            while let Ok((n, _)) = s.recv_from(&mut buf) {
                let t = now_ns();
                if n < 24 {
                    continue;
                }
                let id = u32::from_be_bytes(buf[12..16].try_into().unwrap()) as usize;
                let sent = u64::from_be_bytes(buf[16..24].try_into().unwrap());
                if id < seen.len() && !seen[id] {
                    seen[id] = true;
                    lat.push(t.saturating_sub(sent));
                    if highest.is_some_and(|h| id < h) {
                        out_of_order += 1;
                    }
                    highest = highest.max(Some(id));
                    let h = &mut stream_highest[id % per_stream];
                    if h.is_some_and(|h| id < h) {
                        stream_out_of_order += 1;
                    }
                    *h = (*h).max(Some(id));
                }
            }
            Measured {
                lat,
                out_of_order,
                stream_out_of_order,
            }
        })
    };
    rx.recv().unwrap();
    common::in_netns(&ends.sender_ns, move || {
        let s = UdpSocket::bind(SocketAddrV4::new(da, 5000)).unwrap();
        let streams = streams.max(1);
        let mut p = vec![0u8; len];
        p[0] = 0x80;
        p[1] = 96;
        let start = Instant::now();
        for id in 0..count {
            p[2..4].copy_from_slice(&(id as u16).to_be_bytes());
            p[12..16].copy_from_slice(&id.to_be_bytes());
            p[16..24].copy_from_slice(&now_ns().to_be_bytes());
            let to = SocketAddrV4::new(ga, 20000 + (id % u32::from(streams)) as u16);
            s.send_to(&p, to).unwrap();
            if id % 10 == 9 {
                let due = start + Duration::from_secs_f64(f64::from(id + 1) / f64::from(pps));
                if let Some(w) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(w);
                }
            }
        }
    });
    recv.join().unwrap()
}

/// Half A's datapath CPU per datagram, by link TX family (see the module doc).
#[test]
#[ignore = "benchmark: scripts/bench-split.sh --tx"]
fn split_link_tx_families() {
    require!(true, &[("ip", "iproute2"), ("nft", "nftables")]);
    let rates: Vec<u32> = env_list("SPLIT_BENCH_PPS", "10000 30000");
    let count: u32 = env_or("SPLIT_BENCH_COUNT", "30000").parse().unwrap();
    let rounds: u32 = env_or("SPLIT_BENCH_ROUNDS", "3").parse().unwrap();
    let fec = env_or("SPLIT_BENCH_FEC", "8+2");
    let len: usize = 1328;
    let bed = SplitBed::up();
    let (ra, rb) = cam_routes(&bed);
    // (mode of half A, force the UDP socket on its link)
    let configs = [
        ("stack", false),
        ("tnapi", true),
        ("tnapi", false),
        ("zc", true),
        ("zc", false),
    ];
    for &pps in &rates {
        for round in 0..rounds {
            for &(mode, udp) in &configs {
                let ns = bed.get("HA_NS").to_owned();
                let mut wrapper = vec!["ip", "netns", "exec", &ns];
                if udp {
                    wrapper.extend(["env", "VGATE_LINK_TX=udp"]);
                }
                let a = Vgate::start_with(
                    &wrapper,
                    &half_config_mode(&bed, "a", mode, &fec, "off", &ra),
                    &[],
                );
                let b = start_half(&bed, "b", &half_config(&bed, "b", "off", &fec, &rb));
                let delivered = stream(&Ends::split(&bed), count, pps, len, 1).lat.len() as u64;
                let ta = a.stop();
                let tb = b.stop();
                let out = link_totals(&ta.raw, "out");
                let b_in = link_totals(&tb.raw, "in");
                // What half B dropped (its incoming link's socket overflowing, sends refused).
                let b_drop = |name: &str| channel_drops(&tb, name);
                let tx_line = ta
                    .raw
                    .lines()
                    .find(|l| l.starts_with("link name=out "))
                    .unwrap_or("");
                let tx = tx_line
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix("tx="))
                    .unwrap_or("?");
                let cpu = |w: &std::collections::HashMap<String, String>| -> f64 {
                    w.get("cpu_seconds")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0.0)
                };
                // Worker 0 captures the domain and sends the link; the last one reads the
                // (idle) incoming link.
                let w0 = ta.workers.first().map(cpu).unwrap_or(0.0);
                let all: f64 = ta.workers.iter().map(cpu).sum();
                let sent = ta.route("cam", "tx_packets").max(1);
                println!(
                    "txpoint pps={pps} round={round} mode={mode} tx={tx} fec={fec} sent={count} forwarded={} link_frames={} delivered={delivered} loss_pct={:.3} send_errors={} worker_cpu_us_per_pkt={:.2} all_cpu_us_per_pkt={:.2} b_link_frames={} b_repaired={} b_lost={} b_rx_overflow={} b_queue_full={}",
                    ta.route("cam", "tx_packets"),
                    out["packets"],
                    100.0 * (u64::from(count) - delivered.min(u64::from(count))) as f64
                        / f64::from(count),
                    out["send_errors"],
                    1e6 * w0 / sent as f64,
                    1e6 * all / sent as f64,
                    b_in["packets"],
                    b_in["repaired"],
                    b_in["lost"],
                    b_drop("drop_rx_overflow"),
                    b_drop("drop_queue_full"),
                );
            }
        }
    }
}
