//! Prometheus text exposition (format 0.0.4) of the gateway's counters.
//!
//! Every family is declared once in [`FAMILIES`] (name, type, help); the renderer writes only
//! declared families, and a test checks that a scrape of a running gateway shows all of them.

use std::fmt::Write as _;
use std::sync::atomic::Ordering::Relaxed;

use super::ControlState;
use crate::channel::now_ms;
use crate::config::DomainId;
use crate::routes::{Channel, SessionKind};
use crate::stats::{DropReason, Snapshot};

/// (name, type, help) of every metric family vgate exports.
pub const FAMILIES: &[(&str, &str, &str)] = &[
    (
        "vgate_up",
        "gauge",
        "1 while every worker is alive and its heartbeat is fresh",
    ),
    (
        "vgate_uptime_seconds",
        "gauge",
        "Seconds since the gateway started",
    ),
    (
        "vgate_channel_packets_total",
        "counter",
        "Packets per one-way channel, received (rx) and forwarded (tx)",
    ),
    (
        "vgate_channel_bytes_total",
        "counter",
        "UDP payload bytes per one-way channel, received (rx) and forwarded (tx)",
    ),
    (
        "vgate_channel_drops_total",
        "counter",
        "Packets dropped per channel, by reason",
    ),
    (
        "vgate_worker_packets_total",
        "counter",
        "Packets per worker (queue) and channel",
    ),
    (
        "vgate_worker_drops_total",
        "counter",
        "Packets dropped per worker (queue) and channel, by reason",
    ),
    (
        "vgate_worker_cpu_seconds_total",
        "counter",
        "CPU time of each worker thread",
    ),
    (
        "vgate_worker_heartbeat_age_seconds",
        "gauge",
        "Seconds since each worker last went round its loop",
    ),
    (
        "vgate_ports_used",
        "gauge",
        "Media ports held by sessions, per domain",
    ),
    (
        "vgate_ports_free",
        "gauge",
        "Media ports free for new sessions, per domain",
    ),
    ("vgate_sessions", "gauge", "Live sessions by kind"),
    ("vgate_routes", "gauge", "Live stream routes per channel"),
    (
        "vgate_routes_rtp_lost",
        "gauge",
        "RTP packets lost (sequence gaps) on the live routes of a channel",
    ),
    (
        "vgate_routes_rtp_reordered",
        "gauge",
        "RTP packets that arrived out of order on the live routes of a channel",
    ),
    (
        "vgate_routes_rtp_duplicate",
        "gauge",
        "Duplicate RTP packets on the live routes of a channel",
    ),
    (
        "vgate_route_packets_total",
        "counter",
        "Per stream route (with control.per_stream_metrics): packets received and forwarded",
    ),
    (
        "vgate_route_drops_total",
        "counter",
        "Per stream route (with control.per_stream_metrics): drops by reason",
    ),
    (
        "vgate_route_rtp_lost",
        "gauge",
        "Per stream route (with control.per_stream_metrics): RTP packets lost",
    ),
    ("vgate_signaling_requests_total", "counter", "Signaling requests received per signaling route, by method"),
    ("vgate_signaling_responses_total", "counter", "Signaling responses received per signaling route, by status class"),
    (
        "vgate_signaling_events_total",
        "counter",
        "Per signaling route, the proxy's own events: refusals (403, 503 ...), rate-limited and malformed messages, timeouts, calls",
    ),
];

/// The families only a split half produces (its links); see [`crate::split`].
pub const SPLIT_FAMILIES: &[(&str, &str, &str)] = &[
    (
        "vgate_link_packets_total",
        "counter",
        "Split half: packets on each one-way link (out: sent, repair frames included; in: received)",
    ),
    ("vgate_link_bytes_total", "counter", "Split half: bytes on each one-way link"),
    (
        "vgate_link_fec_total",
        "counter",
        "Split half: FEC per link: repair frames sent or received, datagrams repaired, lost, late, duplicate",
    ),
    (
        "vgate_link_drops_total",
        "counter",
        "Split half: incoming-link datagrams dropped before delivery, by reason; outgoing send errors",
    ),
    ("vgate_split_peer_up", "gauge", "Split half: 1 while the other half is authenticated and heard within dead_after"),
    ("vgate_split_peer_last_seen_ms", "gauge", "Split half: Unix time in ms of the last frame from the other half (0: never)"),
    ("vgate_split_signal_total", "counter", "Split half, signaling link: frames, bytes, heartbeats, auth failures, replays, resets, peer losses and restarts, sessions ended, carried datagrams and streams, by event"),
];

struct Out {
    text: String,
}

impl Out {
    fn family(&mut self, name: &str) {
        let (n, kind, help) = FAMILIES
            .iter()
            .chain(SPLIT_FAMILIES)
            .find(|f| f.0 == name)
            .copied()
            .unwrap_or((name, "untyped", ""));
        let _ = writeln!(self.text, "# HELP {n} {help}\n# TYPE {n} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let _ = write!(self.text, "{k}=\"{}\"", escape(v));
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {value}");
    }

    fn packets(&mut self, name: &str, labels: &[(&str, &str)], s: &Snapshot) {
        for (dir, v) in [("rx", s.rx_packets), ("tx", s.tx_packets)] {
            let mut l = labels.to_vec();
            l.push(("direction", dir));
            self.sample(name, &l, v);
        }
    }

    fn drops(&mut self, name: &str, labels: &[(&str, &str)], s: &Snapshot) {
        for r in DropReason::ALL {
            let mut l = labels.to_vec();
            l.push(("reason", r.name()));
            self.sample(name, &l, s.drop_count(r));
        }
    }
}

/// Label values escape backslash, double quote and newline.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The whole exposition.
pub fn render(st: &ControlState) -> String {
    let mut o = Out {
        text: String::with_capacity(8192),
    };
    let now = now_ms();
    o.family("vgate_up");
    o.sample("vgate_up", &[], u8::from(st.healthy(now)));
    o.family("vgate_uptime_seconds");
    o.sample(
        "vgate_uptime_seconds",
        &[],
        format!("{:.1}", st.started.elapsed().as_secs_f64()),
    );

    let totals = st.totals();
    o.family("vgate_channel_packets_total");
    for c in Channel::ALL {
        o.packets(
            "vgate_channel_packets_total",
            &[("channel", c.name())],
            totals.channel(c),
        );
    }
    o.family("vgate_channel_bytes_total");
    for c in Channel::ALL {
        let s = totals.channel(c);
        o.sample(
            "vgate_channel_bytes_total",
            &[("channel", c.name()), ("direction", "rx")],
            s.rx_bytes,
        );
        o.sample(
            "vgate_channel_bytes_total",
            &[("channel", c.name()), ("direction", "tx")],
            s.tx_bytes,
        );
    }
    o.family("vgate_channel_drops_total");
    for c in Channel::ALL {
        o.drops(
            "vgate_channel_drops_total",
            &[("channel", c.name())],
            totals.channel(c),
        );
    }

    o.family("vgate_worker_packets_total");
    for w in &st.workers {
        let idx = w.index.to_string();
        for c in Channel::ALL {
            o.packets(
                "vgate_worker_packets_total",
                &[("worker", &idx), ("channel", c.name())],
                &w.channel(c).snapshot(),
            );
        }
    }
    o.family("vgate_worker_drops_total");
    for w in &st.workers {
        let idx = w.index.to_string();
        for c in Channel::ALL {
            o.drops(
                "vgate_worker_drops_total",
                &[("worker", &idx), ("channel", c.name())],
                &w.channel(c).snapshot(),
            );
        }
    }
    o.family("vgate_worker_cpu_seconds_total");
    for w in &st.workers {
        o.sample(
            "vgate_worker_cpu_seconds_total",
            &[("worker", &w.index.to_string())],
            format!("{:.6}", w.cpu_seconds()),
        );
    }
    o.family("vgate_worker_heartbeat_age_seconds");
    for w in &st.workers {
        let age = now.saturating_sub(w.heartbeat_ms.load(Relaxed)) as f64 / 1e3;
        o.sample(
            "vgate_worker_heartbeat_age_seconds",
            &[("worker", &w.index.to_string())],
            format!("{age:.3}"),
        );
    }

    if let Some(sp) = &st.split {
        let links = [
            ("out", sp.out_link.snapshot()),
            ("in", sp.in_link.snapshot()),
        ];
        o.family("vgate_link_packets_total");
        for (l, s) in &links {
            o.sample("vgate_link_packets_total", &[("link", l)], s.packets);
        }
        o.family("vgate_link_bytes_total");
        for (l, s) in &links {
            o.sample("vgate_link_bytes_total", &[("link", l)], s.bytes);
        }
        o.family("vgate_link_fec_total");
        for (l, s) in &links {
            for (what, v) in [
                ("repair_packets", s.repair_packets),
                ("repaired", s.repaired),
                ("lost", s.lost),
                ("late", s.late),
                ("duplicate", s.duplicate),
                ("restarts", s.restarts),
            ] {
                o.sample("vgate_link_fec_total", &[("link", l), ("what", what)], v);
            }
        }
        o.family("vgate_link_drops_total");
        for r in crate::split::link::LinkDrop::ALL {
            o.sample(
                "vgate_link_drops_total",
                &[("link", "in"), ("reason", r.name())],
                links[1].1.drop_count(r),
            );
        }
        o.sample(
            "vgate_link_drops_total",
            &[("link", "out"), ("reason", "send_error")],
            links[0].1.send_errors,
        );
    }

    o.family("vgate_ports_used");
    for d in DomainId::ALL {
        o.sample(
            "vgate_ports_used",
            &[("domain", d.name())],
            st.routes.ports(d).0,
        );
    }
    o.family("vgate_ports_free");
    for d in DomainId::ALL {
        o.sample(
            "vgate_ports_free",
            &[("domain", d.name())],
            st.routes.ports(d).1,
        );
    }
    o.family("vgate_sessions");
    let sessions = st.routes.sessions();
    for k in [
        SessionKind::Static,
        SessionKind::Sip,
        SessionKind::Rtsp,
        SessionKind::Admin,
        SessionKind::Demo,
    ] {
        let n = sessions.iter().filter(|s| s.kind == k).count();
        o.sample("vgate_sessions", &[("kind", k.name())], n);
    }

    let routes = st.routes.routes();
    o.family("vgate_routes");
    for c in Channel::ALL {
        o.sample(
            "vgate_routes",
            &[("channel", c.name())],
            routes.iter().filter(|r| r.channel == c).count(),
        );
    }
    let mut rtp = [crate::stats::rtp::RtpSnapshot::default(); 2];
    for r in &routes {
        rtp[r.channel.index()].add(&r.stats.rtp.snapshot());
    }
    for (fam, get) in [
        (
            "vgate_routes_rtp_lost",
            (|s: &crate::stats::rtp::RtpSnapshot| s.lost) as fn(&_) -> u64,
        ),
        ("vgate_routes_rtp_reordered", |s| s.reordered),
        ("vgate_routes_rtp_duplicate", |s| s.duplicate),
    ] {
        o.family(fam);
        for c in Channel::ALL {
            o.sample(fam, &[("channel", c.name())], get(&rtp[c.index()]));
        }
    }

    let signaling = st.signaling.all();
    for (fam, rows) in [
        ("vgate_signaling_requests_total", "method"),
        ("vgate_signaling_responses_total", "class"),
        ("vgate_signaling_events_total", "event"),
    ] {
        o.family(fam);
        for (name, s) in &signaling {
            let kind = match s.kind {
                crate::config::SignalingKind::Sip => "sip",
                crate::config::SignalingKind::Rtsp => "rtsp",
            };
            let values = match rows {
                "method" => s.requests(),
                "class" => s.responses(),
                _ => s.events(),
            };
            for (k, v) in values {
                o.sample(fam, &[("route", name), ("kind", kind), (rows, k)], v);
            }
        }
    }

    if let Some(sig) = &st.split_signal {
        use std::sync::atomic::Ordering::Relaxed;
        o.family("vgate_split_peer_up");
        o.sample("vgate_split_peer_up", &[], sig.peer_up.load(Relaxed));
        o.family("vgate_split_peer_last_seen_ms");
        o.sample(
            "vgate_split_peer_last_seen_ms",
            &[],
            sig.peer_last_ms.load(Relaxed),
        );
        o.family("vgate_split_signal_total");
        for (event, _, v) in sig.list() {
            o.sample("vgate_split_signal_total", &[("event", event)], v);
        }
    }

    if st.config().control.per_stream_metrics {
        o.family("vgate_route_packets_total");
        for r in &routes {
            let port = r.port.to_string();
            let labels = [
                ("route", &*r.label),
                ("channel", r.channel.name()),
                ("port", &port),
            ];
            o.packets(
                "vgate_route_packets_total",
                &labels,
                &r.stats.packets.snapshot(),
            );
        }
        o.family("vgate_route_drops_total");
        for r in &routes {
            let port = r.port.to_string();
            let labels = [
                ("route", &*r.label),
                ("channel", r.channel.name()),
                ("port", &port),
            ];
            o.drops(
                "vgate_route_drops_total",
                &labels,
                &r.stats.packets.snapshot(),
            );
        }
        o.family("vgate_route_rtp_lost");
        for r in &routes {
            let port = r.port.to_string();
            let labels = [
                ("route", &*r.label),
                ("channel", r.channel.name()),
                ("port", &port),
            ];
            o.sample("vgate_route_rtp_lost", &labels, r.stats.rtp.snapshot().lost);
        }
    }
    o.text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn families_are_unique_and_named_vgate() {
        let all: Vec<_> = FAMILIES.iter().chain(SPLIT_FAMILIES).collect();
        let mut names: Vec<_> = all.iter().map(|f| f.0).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all.len());
        assert!(all
            .iter()
            .all(|f| f.0.starts_with("vgate_") && (f.1 == "counter" || f.1 == "gauge")));
        assert!(all
            .iter()
            .filter(|f| f.1 == "counter")
            .all(|f| f.0.ends_with("_total")));
    }
}
