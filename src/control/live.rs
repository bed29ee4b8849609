//! Live statistics (rates since the previous look) and the final totals report.
//!
//! The totals are `key=value` lines on stdout so scripts and tests can read them; the live
//! line is for people and goes to the log.

use std::fmt::Write as _;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use crate::channel::{ChannelTotals, WorkerStats};
use crate::routes::{Channel, Routes};
use crate::stats::DropReason;

/// Computes per-second rates between successive looks at the counters.
pub struct LiveView {
    prev: ChannelTotals,
    prev_cpu_ns: Vec<u64>,
    prev_at: Instant,
}

impl LiveView {
    pub fn new(workers: &[Arc<WorkerStats>]) -> LiveView {
        LiveView {
            prev: ChannelTotals::gather(workers.iter().map(|w| &**w)),
            prev_cpu_ns: workers.iter().map(|w| w.cpu_ns.load(Relaxed)).collect(),
            prev_at: Instant::now(),
        }
    }

    /// One line: per channel packet rate, Mbit/s and drops; per worker CPU use.
    pub fn line(&mut self, workers: &[Arc<WorkerStats>]) -> String {
        let now = Instant::now();
        let dt = now.duration_since(self.prev_at).as_secs_f64().max(1e-3);
        let cur = ChannelTotals::gather(workers.iter().map(|w| &**w));
        let mut s = String::new();
        for c in Channel::ALL {
            let (a, b) = (cur.channel(c), self.prev.channel(c));
            let pps = (a.tx_packets - b.tx_packets) as f64 / dt;
            let mbps = (a.tx_bytes - b.tx_bytes) as f64 * 8.0 / dt / 1e6;
            let drops = a.dropped() - b.dropped();
            let _ = write!(
                s,
                "{}: {:.1} kpps {:.1} Mbit/s drops {} | ",
                c,
                pps / 1e3,
                mbps,
                drops
            );
        }
        s.push_str("cpu");
        let mut cpus = Vec::new();
        for (i, w) in workers.iter().enumerate() {
            let ns = w.cpu_ns.load(Relaxed);
            let prev = self.prev_cpu_ns.get(i).copied().unwrap_or(0);
            let pct = ns.saturating_sub(prev) as f64 / 1e9 / dt * 100.0;
            let _ = write!(s, " w{i} {pct:.0}%");
            cpus.push(ns);
        }
        self.prev = cur;
        self.prev_cpu_ns = cpus;
        self.prev_at = now;
        s
    }
}

/// Totals per channel and per live route, one `key=value` line each.
pub fn totals_report(workers: &[Arc<WorkerStats>], routes: &Routes) -> String {
    let totals = ChannelTotals::gather(workers.iter().map(|w| &**w));
    let mut s = String::new();
    for c in Channel::ALL {
        let _ = writeln!(s, "total channel={} {}", c, totals.channel(c).kv());
    }
    for w in workers {
        let _ = writeln!(
            s,
            "worker index={} cpu={:?} pinned={} cpu_seconds={:.3} ring_drops={} ring_freezes={}",
            w.index,
            w.running_cpu(),
            w.pinned(),
            w.cpu_seconds(),
            w.ring_drops.load(Relaxed),
            w.ring_freezes.load(Relaxed)
        );
    }
    // Per worker and channel, so a test or an operator can see that every queue worked.
    for w in workers {
        for c in Channel::ALL {
            let _ = writeln!(
                s,
                "worker_channel index={} channel={} {}",
                w.index,
                c,
                w.channel(c).snapshot().kv()
            );
        }
    }
    let (used_a, _) = routes.ports(crate::config::DomainId::A);
    let (used_b, _) = routes.ports(crate::config::DomainId::B);
    let _ = writeln!(
        s,
        "sessions live={} routes={} ports_used_a={used_a} ports_used_b={used_b}",
        routes.sessions().len(),
        routes.routes().len()
    );
    for r in routes.routes() {
        let snap = r.stats.snapshot();
        let _ = writeln!(
            s,
            "route name={} channel={} port={} dest={} egress_port={} {} rtp_packets={} rtp_lost={} rtp_reordered={} rtp_duplicate={} link_received={} link_repaired={} link_lost={} link_late={} link_duplicate={} link_restarts={}",
            r.label, r.channel, r.port, r.dest, r.egress_port, snap.packets.kv(), snap.rtp.packets, snap.rtp.lost, snap.rtp.reordered, snap.rtp.duplicate, snap.link.received, snap.link.repaired, snap.link.lost, snap.link.late, snap.link.duplicate, snap.link.restarts
        );
        // Media violations by reason (`media_REASON=N`), only those counted.
        if snap.media.total() > 0 {
            s.pop();
            for (v, n) in snap.media.nonzero() {
                let _ = write!(s, " media_{}={n}", v.name());
            }
            s.push('\n');
        }
    }
    s
}

/// Human summary of drops by reason, or "no drops".
pub fn drops_summary(t: &ChannelTotals) -> String {
    let mut parts = Vec::new();
    for r in DropReason::ALL {
        let n: u64 = Channel::ALL
            .iter()
            .map(|c| t.channel(*c).drop_count(r))
            .sum();
        if n > 0 {
            parts.push(format!("{}={n}", r.name()));
        }
    }
    if parts.is_empty() {
        "no drops".into()
    } else {
        parts.join(" ")
    }
}
