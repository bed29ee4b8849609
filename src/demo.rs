//! `vgate demo`: the gateway on the embedded loopback default, with its own traffic.
//!
//! N RTP-like streams of R Mbit/s leave domain A addresses for the gateway's A-side ports;
//! the gateway relays them over the forward channel to receivers on domain B addresses. Each
//! packet carries its RTP sequence number and its send time, so the receiver measures loss and
//! the latency the relay adds. Every second one line of figures; at the end a report (also as
//! JSON with `--json`, which the benchmark script reads).
//!
//! Generator and receiver run in this process, each on one thread; on a small machine they
//! compete with the gateway for CPU, which the report states (generator lag).

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddrV4, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::socket::{setsockopt, sockopt};

use crate::config::{Config, DomainId};
use crate::control::live::drops_summary;
use crate::engine::sys::mmsg::RecvBatch;
use crate::gateway::{Gateway, GatewayError};
use crate::routes::{RouteError, RouteSpec, SessionKind};
use crate::stats::rtp::{RtpSnapshot, RtpTracker};
use crate::wire::rtp::{write_header, RtpPacket};

/// What to generate.
#[derive(Clone, Debug)]
pub struct DemoOptions {
    pub streams: usize,
    /// Per stream, Mbit/s of UDP payload.
    pub mbps: f64,
    /// UDP payload bytes per packet (1328: RTP header + 7 MPEG-TS packets).
    pub payload: usize,
    pub duration: Duration,
    pub queues: Option<usize>,
    /// Print the live line every second.
    pub live: bool,
}

/// The demo's outcome.
#[derive(Clone, Debug, Default)]
pub struct DemoReport {
    pub streams: usize,
    pub seconds: f64,
    pub sent: u64,
    pub received: u64,
    pub lost: u64,
    pub wrong_source: u64,
    pub offered_pps: f64,
    pub delivered_pps: f64,
    pub offered_mbps: f64,
    pub latency_p50_us: f64,
    pub latency_p99_us: f64,
    pub latency_max_us: f64,
    /// Gateway worker CPU seconds over the run.
    pub gateway_cpu_s: f64,
    /// Gateway CPU microseconds per forwarded packet.
    pub cpu_us_per_packet: f64,
    /// How far behind schedule the generator ended, in packets (it could not keep up).
    pub generator_lag: u64,
    pub worst_streams: Vec<(usize, u64)>,
    pub gateway_drops: String,
}

impl DemoReport {
    pub fn loss_ratio(&self) -> f64 {
        if self.sent == 0 {
            0.0
        } else {
            self.lost as f64 / self.sent as f64
        }
    }

    pub fn to_json(&self) -> String {
        format!(
            "{{\"streams\":{},\"seconds\":{:.3},\"sent\":{},\"received\":{},\"lost\":{},\"loss_ratio\":{:.8},\"wrong_source\":{},\"offered_pps\":{:.1},\"delivered_pps\":{:.1},\"offered_mbps\":{:.2},\"latency_p50_us\":{:.1},\"latency_p99_us\":{:.1},\"latency_max_us\":{:.1},\"gateway_cpu_s\":{:.4},\"cpu_us_per_packet\":{:.4},\"generator_lag\":{}}}",
            self.streams, self.seconds, self.sent, self.received, self.lost, self.loss_ratio(), self.wrong_source,
            self.offered_pps, self.delivered_pps, self.offered_mbps, self.latency_p50_us, self.latency_p99_us,
            self.latency_max_us, self.gateway_cpu_s, self.cpu_us_per_packet, self.generator_lag
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error(transparent)]
    Gateway(#[from] GatewayError),
    #[error("setting up demo stream {stream}: {source}")]
    Route { stream: usize, source: RouteError },
    #[error("demo socket: {0}; is another vgate demo running?")]
    Io(#[from] io::Error),
    #[error("{0}")]
    Options(String),
}

/// Receiver ports in domain B (outside the gateway's media ranges).
const RX_BASE: u16 = 40000;
const HEADER: usize = 12 + 16;

struct Stream {
    tx: UdpSocket,
    rx: UdpSocket,
    expect_from: SocketAddrV4,
}

/// Runs the demo until `duration` passes or `stop` is set.
pub fn run(opts: &DemoOptions, stop: &AtomicBool) -> Result<DemoReport, DemoError> {
    if opts.payload < HEADER || opts.payload > 1472 {
        return Err(DemoError::Options(format!(
            "--payload must be between {HEADER} and 1472 bytes"
        )));
    }
    let mut cfg = Config::embedded_default();
    if let Some(q) = opts.queues {
        cfg.engine.queues = q;
        cfg.engine.cpus = crate::config::auto_cpus(q, &crate::config::Cpus::this_machine());
    }
    let max_streams = cfg.domain(DomainId::A).media_ports.len() / 2;
    if opts.streams == 0 || opts.streams > max_streams {
        return Err(DemoError::Options(format!(
            "--streams must be between 1 and {max_streams}"
        )));
    }
    let gw = Gateway::start(cfg, None)?;
    tracing::info!("{}", gw.describe());
    let a_addr = gw.config.domain(DomainId::A).address;
    let b_addr = gw.config.domain(DomainId::B).address;
    let session = gw.routes.open_session(SessionKind::Demo, "demo");
    let mut streams = Vec::with_capacity(opts.streams);
    for i in 0..opts.streams {
        let tx = UdpSocket::bind(SocketAddrV4::new(a_addr, 0))?;
        let from = match tx.local_addr()? {
            std::net::SocketAddr::V4(a) => a,
            _ => unreachable!("bound to an IPv4 address"),
        };
        let rx = UdpSocket::bind(SocketAddrV4::new(b_addr, RX_BASE + i as u16))?;
        rx.set_nonblocking(true)?;
        let _ = setsockopt(&rx, sockopt::RcvBuf, &(4usize << 20));
        // The kernel stamps each datagram on arrival, so the latency measured is the
        // relay's, not the time the receiver thread took to get to it.
        setsockopt(&rx, sockopt::ReceiveTimestampns, &true).map_err(io::Error::from)?;
        let _ = setsockopt(&tx, sockopt::SndBuf, &(4usize << 20));
        let route = (|| {
            let a_port = gw.routes.alloc_pair(session, DomainId::A)?;
            let b_port = gw.routes.alloc_pair(session, DomainId::B)?;
            gw.routes.add_route(
                session,
                RouteSpec {
                    ingress: DomainId::A,
                    port: a_port,
                    dest: SocketAddrV4::new(b_addr, RX_BASE + i as u16),
                    egress_port: b_port,
                    policy: gw.config.security.source_validation,
                    expected: Some(from),
                    rtp_only: true,
                    label: format!("demo-{i}"),
                    media: None,
                },
            )
        })()
        .map_err(|source| DemoError::Route { stream: i, source })?;
        tx.connect(SocketAddrV4::new(a_addr, route.port))?;
        streams.push(Stream {
            tx,
            rx,
            expect_from: SocketAddrV4::new(b_addr, route.egress_port),
        });
    }

    let done = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let lag = Arc::new(AtomicU64::new(0));
    let rxs: Vec<(UdpSocket, SocketAddrV4)> = streams
        .iter()
        .map(|s| Ok((s.rx.try_clone()?, s.expect_from)))
        .collect::<io::Result<_>>()?;
    let txs: Vec<UdpSocket> = streams
        .iter()
        .map(|s| s.tx.try_clone())
        .collect::<io::Result<_>>()?;
    drop(streams);
    let rx_state = Arc::new(Mutex::new(RxState::new(opts.streams)));
    let receiver = {
        let (done, st) = (Arc::clone(&done), Arc::clone(&rx_state));
        std::thread::Builder::new()
            .name("demo-rx".into())
            .spawn(move || receive(rxs, &done, &st))?
    };
    let generator = {
        let (done, sent, lag, o) = (
            Arc::clone(&done),
            Arc::clone(&sent),
            Arc::clone(&lag),
            opts.clone(),
        );
        std::thread::Builder::new()
            .name("demo-tx".into())
            .spawn(move || generate(txs, &o, &done, &sent, &lag))?
    };

    let cpu0: u64 = gw.workers().map(|w| w.cpu_ns.load(Relaxed)).sum();
    let worker_stats = gw.worker_stats();
    let mut live = crate::control::live::LiveView::new(&worker_stats);
    let mut prev = (0u64, 0u64, Instant::now());
    let mut prev_rtp = RtpSnapshot::default();
    let start = Instant::now();
    while !stop.load(Relaxed) && (opts.duration.is_zero() || start.elapsed() < opts.duration) {
        std::thread::sleep(
            Duration::from_millis(100).min(
                opts.duration
                    .saturating_sub(start.elapsed())
                    .max(Duration::from_millis(1)),
            ),
        );
        if opts.live && prev.2.elapsed() >= Duration::from_secs(1) {
            let dt = prev.2.elapsed().as_secs_f64();
            let s = sent.load(Relaxed);
            let (r, p50, p99, rtp) = {
                let mut st = rx_state.lock().unwrap_or_else(|p| p.into_inner());
                let mut rtp = RtpSnapshot::default();
                for t in &st.per_stream {
                    rtp.add(&t.snapshot());
                }
                let out = (
                    st.received,
                    st.window.value_at_quantile(0.5),
                    st.window.value_at_quantile(0.99),
                    rtp,
                );
                st.window.reset();
                out
            };
            let (ds, dr) = (s - prev.0, r - prev.1);
            let loss = interval_loss_percent(&prev_rtp, &rtp);
            prev_rtp = rtp;
            eprintln!(
                "[{:>4.0}s] offered {:>7.1} kpps {:>7.1} Mbit/s | delivered {:>7.1} kpps | loss {:>6.3}% | added latency p50 {:>6} us p99 {:>6} us | {}",
                start.elapsed().as_secs_f64(),
                ds as f64 / dt / 1e3,
                ds as f64 * opts.payload as f64 * 8.0 / dt / 1e6,
                dr as f64 / dt / 1e3,
                loss,
                p50 / 1000,
                p99 / 1000,
                live.line(&worker_stats),
            );
            prev = (s, r, Instant::now());
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    done.store(true, Relaxed);
    let _ = generator.join();
    // Let the last packets cross before counting them lost.
    std::thread::sleep(Duration::from_millis(300));
    let stop_rx = Arc::clone(&done);
    stop_rx.store(true, Relaxed);
    let _ = receiver.join();
    let cpu_s = (gw.workers().map(|w| w.cpu_ns.load(Relaxed)).sum::<u64>() - cpu0) as f64 / 1e9;
    let totals = gw.totals();
    let st = rx_state.lock().unwrap_or_else(|p| p.into_inner());
    let sent_total = sent.load(Relaxed);
    let mut worst: Vec<(usize, u64)> = (0..opts.streams)
        .map(|i| (i, st.per_stream[i].snapshot().lost))
        .filter(|x| x.1 > 0)
        .collect();
    worst.sort_by_key(|w| std::cmp::Reverse(w.1));
    worst.truncate(5);
    let forwarded = totals.channel(crate::routes::Channel::Forward).tx_packets;
    let report = DemoReport {
        streams: opts.streams,
        seconds,
        sent: sent_total,
        received: st.received,
        lost: sent_total.saturating_sub(st.received),
        wrong_source: st.wrong_source,
        offered_pps: sent_total as f64 / seconds,
        delivered_pps: st.received as f64 / seconds,
        offered_mbps: sent_total as f64 * opts.payload as f64 * 8.0 / seconds / 1e6,
        latency_p50_us: st.total.value_at_quantile(0.5) as f64 / 1e3,
        latency_p99_us: st.total.value_at_quantile(0.99) as f64 / 1e3,
        latency_max_us: st.total.max() as f64 / 1e3,
        gateway_cpu_s: cpu_s,
        cpu_us_per_packet: if forwarded > 0 {
            cpu_s * 1e6 / forwarded as f64
        } else {
            0.0
        },
        generator_lag: lag.load(Relaxed),
        worst_streams: worst,
        gateway_drops: drops_summary(&totals),
    };
    drop(st);
    let _ = gw.routes.close_session(session);
    drop(gw);
    Ok(report)
}

/// The live line's loss, in percent: RTP sequence gaps opened since the previous line that no
/// late packet has filled since, over the packets that interval should have brought (RFC
/// 3550's fraction lost). A packet still in flight at the line's second is not a gap yet, and a
/// late one that fills a gap in the same interval takes it back, so neither shows as loss
/// (one overtaken right at the line's boundary would, for that second: loopback does not
/// reorder a stream). The report's `lost` (sent minus received once the run has drained) is
/// the exact figure.
fn interval_loss_percent(prev: &RtpSnapshot, now: &RtpSnapshot) -> f64 {
    let lost = now.lost.saturating_sub(prev.lost);
    let expected = now.packets.saturating_sub(prev.packets) + lost;
    if expected == 0 {
        0.0
    } else {
        lost as f64 / expected as f64 * 100.0
    }
}

/// Human report.
pub fn render(r: &DemoReport) -> String {
    let mut s = String::new();
    use std::fmt::Write as _;
    let _ = writeln!(
        s,
        "vgate demo: {} streams for {:.1} s",
        r.streams, r.seconds
    );
    let _ = writeln!(
        s,
        "  offered    {:>10} packets  {:>9.1} kpps  {:>8.1} Mbit/s",
        r.sent,
        r.offered_pps / 1e3,
        r.offered_mbps
    );
    let _ = writeln!(
        s,
        "  delivered  {:>10} packets  {:>9.1} kpps",
        r.received,
        r.delivered_pps / 1e3
    );
    let _ = writeln!(
        s,
        "  lost       {:>10} packets  ({:.4} %)",
        r.lost,
        r.loss_ratio() * 100.0
    );
    let _ = writeln!(
        s,
        "  added latency  p50 {:.0} us  p99 {:.0} us  max {:.0} us",
        r.latency_p50_us, r.latency_p99_us, r.latency_max_us
    );
    let _ = writeln!(
        s,
        "  gateway CPU    {:.3} s  ({:.2} us per packet)",
        r.gateway_cpu_s, r.cpu_us_per_packet
    );
    let _ = writeln!(s, "  gateway drops  {}", r.gateway_drops);
    if r.wrong_source > 0 {
        let _ = writeln!(
            s,
            "  WRONG SOURCE   {} packets arrived from an unexpected address",
            r.wrong_source
        );
    }
    if r.generator_lag > 0 {
        let _ = writeln!(
            s,
            "  note: the generator fell {} packets behind schedule: this machine could not offer the full load, so the generator, not vgate, was the limit",
            r.generator_lag
        );
    }
    if !r.worst_streams.is_empty() {
        let list: Vec<String> = r
            .worst_streams
            .iter()
            .map(|(i, l)| format!("#{i}: {l}"))
            .collect();
        let _ = writeln!(s, "  worst streams (lost packets)  {}", list.join(", "));
    }
    s
}

/// Sends every stream at its rate; records how far behind schedule it fell.
fn generate(
    txs: Vec<UdpSocket>,
    o: &DemoOptions,
    done: &AtomicBool,
    sent: &AtomicU64,
    lag: &AtomicU64,
) {
    let pps = o.mbps * 1e6 / 8.0 / o.payload as f64;
    let mut buf = vec![0u8; o.payload];
    let mut seq = vec![0u16; txs.len()];
    let mut count = vec![0u64; txs.len()];
    let start = Instant::now();
    // Streams start spread over the first packet interval, as independent cameras would.
    let offsets: Vec<f64> = (0..txs.len())
        .map(|i| i as f64 / txs.len() as f64 / pps)
        .collect();
    while !done.load(Relaxed) {
        let t = start.elapsed().as_secs_f64();
        let mut behind = 0u64;
        for (i, tx) in txs.iter().enumerate() {
            let due = ((t - offsets[i]) * pps).max(0.0) as u64;
            // Catch up at most a few packets per round: a burst would measure the burst.
            let mut n = 0;
            while count[i] < due && n < 8 {
                let _ = write_header(&mut buf, 33, seq[i], 0, i as u32);
                buf[12..20].copy_from_slice(&realtime_ns().to_be_bytes());
                buf[20..28].copy_from_slice(&(i as u64).to_be_bytes());
                if tx.send(&buf).is_ok() {
                    sent.fetch_add(1, Relaxed);
                }
                seq[i] = seq[i].wrapping_add(1);
                count[i] += 1;
                n += 1;
            }
            behind += due.saturating_sub(count[i]);
        }
        lag.store(behind, Relaxed);
        std::thread::sleep(Duration::from_micros(500));
    }
}

struct RxState {
    received: u64,
    wrong_source: u64,
    per_stream: Vec<RtpTracker>,
    total: Histogram<u64>,
    window: Histogram<u64>,
}

impl RxState {
    fn new(n: usize) -> RxState {
        let h = || {
            Histogram::new_with_bounds(1, 60_000_000_000, 2)
                .expect("static histogram bounds are valid")
        };
        RxState {
            received: 0,
            wrong_source: 0,
            per_stream: (0..n).map(|_| RtpTracker::default()).collect(),
            total: h(),
            window: h(),
        }
    }
}

fn receive(rxs: Vec<(UdpSocket, SocketAddrV4)>, done: &AtomicBool, st: &Mutex<RxState>) {
    let Ok(epoll) = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC) else {
        return;
    };
    let mut by_port: HashMap<u64, usize> = HashMap::new();
    for (i, (s, _)) in rxs.iter().enumerate() {
        if epoll
            .add(s.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, i as u64))
            .is_ok()
        {
            by_port.insert(i as u64, i);
        }
    }
    let mut batch = RecvBatch::new(32, 2048);
    let mut events = vec![EpollEvent::empty(); 64];
    let mut quiet_rounds = 0;
    loop {
        let n = epoll
            .wait(&mut events, EpollTimeout::from(50u16))
            .unwrap_or(0);
        if n == 0 && done.load(Relaxed) {
            quiet_rounds += 1;
            if quiet_rounds > 2 {
                return;
            }
        }
        let mut guard = st.lock().unwrap_or_else(|p| p.into_inner());
        for ev in &events[..n] {
            let Some(&i) = by_port.get(&ev.data()) else {
                continue;
            };
            let (sock, expect) = &rxs[i];
            while let Ok(k) = batch.recv(sock.as_fd()) {
                if k == 0 {
                    break;
                }
                let fallback = realtime_ns();
                for j in 0..k {
                    let p = batch.payload(j);
                    if batch.source(j) != *expect {
                        guard.wrong_source += 1;
                        continue;
                    }
                    let Ok(rtp) = RtpPacket::new_checked(p) else {
                        continue;
                    };
                    if p.len() < HEADER {
                        continue;
                    }
                    let mut ts = [0u8; 8];
                    ts.copy_from_slice(&p[12..20]);
                    let arrived = batch.timestamp_ns(j).unwrap_or(fallback);
                    let lat = arrived.saturating_sub(u64::from_be_bytes(ts)).max(1);
                    guard.received += 1;
                    guard.per_stream[i].observe(rtp.sequence(), rtp.ssrc());
                    let _ = guard.total.record(lat);
                    let _ = guard.window.record(lat);
                }
            }
        }
    }
}

/// Realtime clock in nanoseconds: the clock `SO_TIMESTAMPNS` stamps with.
fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_in_flight_or_late_are_not_loss_on_the_live_line() {
        let t = RtpTracker::default();
        let mut prev = t.snapshot();
        // A second of packets 0..10 received; 10..13 were sent but are still in flight.
        for seq in 0..10 {
            t.observe(seq, 7);
        }
        let now = t.snapshot();
        assert_eq!(
            interval_loss_percent(&prev, &now),
            0.0,
            "in flight is not lost"
        );
        prev = now;
        // 10 overtaken by 11 and 12, then 10 arrives late in the same interval.
        for seq in [11, 12, 10] {
            t.observe(seq, 7);
        }
        let now = t.snapshot();
        assert_eq!(
            interval_loss_percent(&prev, &now),
            0.0,
            "reordered is not lost"
        );
        t.observe(13, 7);
        t.observe(14, 7);
        prev = t.snapshot();
        // A packet really lost (15) is loss: 1 of the 2 the interval should have brought.
        t.observe(16, 7);
        assert_eq!(interval_loss_percent(&prev, &t.snapshot()), 50.0);
    }
}
