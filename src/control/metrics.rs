//! Prometheus text exposition (format 0.0.4) of the gateway's counters.
//!
//! Every family is declared once in [`FAMILIES`] (name, type, help); the renderer writes only
//! declared families, and a test checks that a scrape of a running gateway shows all of them.

use std::fmt::Write as _;
use std::sync::atomic::Ordering::Relaxed;

use super::ControlState;
use crate::clock::now_ms;
use crate::config::DomainId;
use crate::routes::{Channel, SessionKind};
use crate::stats::{DropReason, Snapshot};

/// (name, type, help) of every metric family vgate exports.
pub const FAMILIES: &[(&str, &str, &str)] = &[
    (
        "vgate_edge_legs",
        "gauge",
        "Live stream legs (RTP over TCP the gateway terminates), by state",
    ),
    (
        "vgate_edge_leg_events_total",
        "counter",
        "Stream leg counters summed over every leg so far: frames and bytes in (from the TCP peer) and out, framing errors, partial frames at close, stalls (packets dropped because the peer did not read), inject drops, connects, refused connections",
    ),
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
        "vgate_relatches_total",
        "counter",
        "Times a latch route moved to a new source after its latched source fell silent, per channel",
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
        "vgate_neigh_refused_total",
        "counter",
        "Engines that build frames themselves (tnapi packet-socket transmit, zc, xdp): next-hop lookups the neighbour resolver did not take, by reason: queue_full (a worker's miss did not fit its queue), table_full (a new destination refused, the table holding 3/4 of its slots); those packets go through the kernel's socket",
    ),
    (
        "vgate_neigh_entries",
        "gauge",
        "Destinations in the neighbour resolver's table, and its capacity (kind=capacity)",
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
        "vgate_media_first_packet_seconds",
        "histogram",
        "Time from a stream route's installation by signaling (SIP call, RTSP session) to its first forwarded packet, by session kind",
    ),
    (
        "vgate_rtp_lost_packets_total",
        "counter",
        "RTP packets lost (sequence gaps not filled later) per channel, ended routes included",
    ),
    (
        "vgate_rtp_reordered_packets_total",
        "counter",
        "RTP packets that arrived out of order per channel, ended routes included",
    ),
    (
        "vgate_rtp_duplicate_packets_total",
        "counter",
        "Duplicate RTP packets per channel, ended routes included",
    ),
    (
        "vgate_edge_leg_total",
        "counter",
        "Per live stream leg (with control.per_stream_metrics): its counters by event (see vgate_edge_leg_events_total)",
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
        "vgate_route_rtp_lost_packets",
        "gauge",
        "Per stream route (with control.per_stream_metrics): RTP packets lost so far",
    ),
    (
        "vgate_signaling_requests_total",
        "counter",
        "Signaling requests received per signaling route, by method",
    ),
    (
        "vgate_signaling_responses_total",
        "counter",
        "Signaling responses received per signaling route, by status class",
    ),
    (
        "vgate_signaling_call_setup_seconds",
        "histogram",
        "SIP calls: time from the INVITE crossing to its first 2xx, per signaling route",
    ),
    (
        "vgate_signaling_refused_total",
        "counter",
        "Requests or connections the proxy refused itself, per signaling route, by reason",
    ),
    (
        "vgate_signaling_dropped_total",
        "counter",
        "Messages the proxy dropped without an answer, per signaling route, by reason",
    ),
    (
        "vgate_signaling_timeouts_total",
        "counter",
        "Transactions or media that timed out, per signaling route, by what timed out",
    ),
    (
        "vgate_signaling_calls_started_total",
        "counter",
        "Calls (dialogs with media) set up per signaling route",
    ),
    (
        "vgate_signaling_calls_ended_total",
        "counter",
        "Calls ended per signaling route",
    ),
    (
        "vgate_signaling_proxied_total",
        "counter",
        "The proxy's own message handling per signaling route: forwarded, retransmitted, answered",
    ),
    (
        "vgate_signaling_upstream_failures_total",
        "counter",
        "Connections to the far side of a signaling route that failed",
    ),
    (
        "vgate_rtsp_interleaved_frames_total",
        "counter",
        "RTP/RTCP frames carried inside RTSP connections, by direction",
    ),
    (
        "vgate_rtsp_interleaved_bytes_total",
        "counter",
        "Bytes of frames carried inside RTSP connections, by direction",
    ),
    (
        "vgate_rtsp_bridge_legs_total",
        "counter",
        "RTSP tracks bridged between interleaved TCP and UDP (one leg each)",
    ),
    (
        "vgate_rtsp_bridge_frames_total",
        "counter",
        "RTP/RTCP packets carried by RTSP bridge legs, by direction (udp_to_tcp, tcp_to_udp)",
    ),
    (
        "vgate_rtsp_bridge_bytes_total",
        "counter",
        "Payload bytes carried by RTSP bridge legs, by direction",
    ),
    (
        "vgate_signaling_other_events_total",
        "counter",
        "Proxy events not yet given a family of their own (see EVENT_FAMILIES)",
    ),
    (
        "vgate_reloads_total",
        "counter",
        "Config reloads asked for (SIGHUP, vgate reload), by result: applied or rejected",
    ),
    (
        "vgate_reload_last_success",
        "gauge",
        "1 when the last config reload was applied (or none was asked for), 0 when it was rejected",
    ),
    (
        "vgate_build_info",
        "gauge",
        "Always 1; the labels name the vgate version and whether this build has the PF_RING engines",
    ),
    (
        "process_cpu_seconds_total",
        "counter",
        "Total user and system CPU time of the vgate process",
    ),
    (
        "process_resident_memory_bytes",
        "gauge",
        "Resident memory of the vgate process",
    ),
    (
        "process_open_fds",
        "gauge",
        "Open file descriptors of the vgate process",
    ),
    (
        "process_max_fds",
        "gauge",
        "The process's limit on open file descriptors",
    ),
    (
        "process_start_time_seconds",
        "gauge",
        "Start time of the vgate process, seconds since the Unix epoch",
    ),
];

/// The families only a split half produces (its links); see [`crate::config::split`].
pub const SPLIT_FAMILIES: &[(&str, &str, &str)] = &[
    (
        "vgate_link_wrong_direction_packets",
        "gauge",
        "Split half: packets that travelled a one-way link the wrong way since start (received on the outgoing link's interface, sent on the incoming link's); must stay 0",
    ),
    (
        "vgate_link_packets_total",
        "counter",
        "Split half: packets on each one-way link (out: sent, repair frames included; in: received)",
    ),
    ("vgate_link_bytes_total", "counter", "Split half: bytes on each one-way link"),
    (
        "vgate_link_fec_total",
        "counter",
        "Split half: FEC per link: repair frames sent or received, datagrams repaired, lost, late, duplicate; the incoming link's reorder window: datagrams held, positions given up, datagrams overtaken; datagrams cut into fragments (out), fragments received and datagrams joined from them (in)",
    ),
    (
        "vgate_link_drops_total",
        "counter",
        "Split half: incoming-link datagrams dropped before delivery, by reason; outgoing send errors",
    ),
    (
        "vgate_route_link_packets_total",
        "counter",
        "Split half: datagrams the incoming one-way link handed each route of the link face, as received or rebuilt by FEC, and the stream's datagrams the link lost (exact, from the link header's per-route sequence), that came late (taken off lost) or twice",
    ),
    (
        "vgate_route_link_restarts_total",
        "counter",
        "Split half: times a route's link stream started anew (its sequence jumped: the sending route was made anew or its half restarted; or another source port)",
    ),
    ("vgate_split_peer_up", "gauge", "Split half: 1 while the other half is authenticated and heard within dead_after"),
    ("vgate_split_peer_last_seen_timestamp_seconds", "gauge", "Split half: Unix time in seconds of the last authenticated frame from the other half (0: never)"),
    ("vgate_split_signal_total", "counter", "Split half, signaling link: frames, bytes, heartbeats, auth failures, replays, resets, peer losses and restarts, sessions ended, carried datagrams and streams, by event"),
];

/// The family and label value each proxy event (see `Counters::list` of the SIP proxy and
/// `Events::list` of the RTSP proxy) is exported as; an event missing here goes to
/// `vgate_signaling_other_events_total{event=...}` until it is given a family.
pub const EVENT_FAMILIES: &[(&str, &str, &str)] = &[
    (
        "bindings_refused",
        "vgate_signaling_refused_total",
        "bindings_per_source",
    ),
    (
        "manscdp_refused",
        "vgate_signaling_refused_total",
        "manscdp_command",
    ),
    ("refused_peers", "vgate_signaling_refused_total", "peer"),
    (
        "refused_per_source",
        "vgate_signaling_refused_total",
        "connections_per_source",
    ),
    (
        "refused_rate",
        "vgate_signaling_refused_total",
        "rate_limited",
    ),
    ("slow_requests", "vgate_signaling_timeouts_total", "request"),
    ("forbidden", "vgate_signaling_refused_total", "forbidden"),
    (
        "upstream_forbidden",
        "vgate_signaling_refused_total",
        "upstream_source",
    ),
    (
        "rate_limited",
        "vgate_signaling_refused_total",
        "rate_limited",
    ),
    ("no_ports", "vgate_signaling_refused_total", "no_ports"),
    ("table_full", "vgate_signaling_refused_total", "table_full"),
    ("too_large", "vgate_signaling_refused_total", "too_large"),
    (
        "tcp_media_refused",
        "vgate_signaling_refused_total",
        "tcp_media",
    ),
    (
        "tcp_connections_refused",
        "vgate_signaling_refused_total",
        "tcp_connections",
    ),
    (
        "dropped_malformed",
        "vgate_signaling_dropped_total",
        "malformed",
    ),
    (
        "dropped_keepalive",
        "vgate_signaling_dropped_total",
        "keepalive",
    ),
    (
        "dropped_stray_responses",
        "vgate_signaling_dropped_total",
        "stray_response",
    ),
    (
        "dropped_bad_sdp_responses",
        "vgate_signaling_dropped_total",
        "bad_sdp_response",
    ),
    (
        "tcp_unframeable",
        "vgate_signaling_dropped_total",
        "tcp_unframeable",
    ),
    (
        "interleaved_dropped",
        "vgate_signaling_dropped_total",
        "interleaved_unnegotiated",
    ),
    ("bridge_legs", "vgate_rtsp_bridge_legs_total", ""),
    (
        "bridge_frames_to_tcp",
        "vgate_rtsp_bridge_frames_total",
        "udp_to_tcp",
    ),
    (
        "bridge_frames_to_udp",
        "vgate_rtsp_bridge_frames_total",
        "tcp_to_udp",
    ),
    (
        "bridge_bytes_to_tcp",
        "vgate_rtsp_bridge_bytes_total",
        "udp_to_tcp",
    ),
    (
        "bridge_bytes_to_udp",
        "vgate_rtsp_bridge_bytes_total",
        "tcp_to_udp",
    ),
    (
        "bridge_stalls",
        "vgate_signaling_dropped_total",
        "bridge_peer_not_reading",
    ),
    (
        "bridge_dropped",
        "vgate_signaling_dropped_total",
        "bridge_socket_refused",
    ),
    (
        "bridge_refused",
        "vgate_signaling_refused_total",
        "transport_unbridgeable",
    ),
    (
        "channels_taken",
        "vgate_signaling_refused_total",
        "interleaved_channels_taken",
    ),
    (
        "partial_frames",
        "vgate_signaling_dropped_total",
        "partial_frame_at_close",
    ),
    (
        "invite_timeouts",
        "vgate_signaling_timeouts_total",
        "invite",
    ),
    ("media_timeouts", "vgate_signaling_timeouts_total", "media"),
    ("calls_started", "vgate_signaling_calls_started_total", ""),
    ("calls_ended", "vgate_signaling_calls_ended_total", ""),
    (
        "requests",
        "vgate_signaling_proxied_total",
        "requests_handled",
    ),
    (
        "responses",
        "vgate_signaling_proxied_total",
        "responses_handled",
    ),
    (
        "forwarded_requests",
        "vgate_signaling_proxied_total",
        "requests_forwarded",
    ),
    (
        "forwarded_responses",
        "vgate_signaling_proxied_total",
        "responses_forwarded",
    ),
    (
        "retransmissions",
        "vgate_signaling_proxied_total",
        "retransmissions",
    ),
    (
        "answered_errors",
        "vgate_signaling_proxied_total",
        "errors_answered",
    ),
    (
        "server_requests_forwarded",
        "vgate_signaling_proxied_total",
        "server_requests_forwarded",
    ),
    (
        "server_requests_answered",
        "vgate_signaling_proxied_total",
        "server_requests_answered",
    ),
    (
        "client_replies_forwarded",
        "vgate_signaling_proxied_total",
        "client_replies_forwarded",
    ),
    (
        "track_teardowns",
        "vgate_signaling_proxied_total",
        "track_teardowns",
    ),
    (
        "routed_by_user",
        "vgate_signaling_proxied_total",
        "routed_by_device_id",
    ),
    (
        "manscdp_rewritten",
        "vgate_signaling_proxied_total",
        "manscdp_rewritten",
    ),
    (
        "tcp_connect_failures",
        "vgate_signaling_upstream_failures_total",
        "",
    ),
    (
        "interleaved_frames_to_client",
        "vgate_rtsp_interleaved_frames_total",
        "to_client",
    ),
    (
        "interleaved_frames_to_server",
        "vgate_rtsp_interleaved_frames_total",
        "to_server",
    ),
    (
        "interleaved_bytes_to_client",
        "vgate_rtsp_interleaved_bytes_total",
        "to_client",
    ),
    (
        "interleaved_bytes_to_server",
        "vgate_rtsp_interleaved_bytes_total",
        "to_server",
    ),
];

/// The label that tells a family's series apart (besides route and kind).
fn event_label(family: &str) -> &'static str {
    match family {
        "vgate_signaling_refused_total" | "vgate_signaling_dropped_total" => "reason",
        "vgate_signaling_timeouts_total" => "what",
        "vgate_rtsp_interleaved_frames_total"
        | "vgate_rtsp_interleaved_bytes_total"
        | "vgate_rtsp_bridge_frames_total"
        | "vgate_rtsp_bridge_bytes_total" => "direction",
        "vgate_signaling_proxied_total" => "action",
        _ => "event",
    }
}

/// Where an event goes: (family, label value).
fn event_family(event: &str) -> (&'static str, &str) {
    EVENT_FAMILIES
        .iter()
        .find(|e| e.0 == event)
        .map(|e| (e.1, e.2))
        .unwrap_or(("vgate_signaling_other_events_total", event))
}

/// The series an event of signaling route `route` (of `kind`, "sip" or "rtsp") is exported
/// as, e.g. `vgate_signaling_dropped_total{route="gb",kind="sip",reason="malformed"}`.
pub fn event_series(route: &str, kind: &str, event: &str) -> String {
    let (fam, value) = event_family(event);
    if value.is_empty() {
        format!("{fam}{{route=\"{route}\",kind=\"{kind}\"}}")
    } else {
        let label = event_label(fam);
        format!("{fam}{{route=\"{route}\",kind=\"{kind}\",{label}=\"{value}\"}}")
    }
}

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

    /// The `_bucket`, `_sum` and `_count` samples of one histogram series labelled `label`.
    fn histogram(&mut self, fam: &str, label: (&str, &str), h: &crate::stats::Histogram) {
        let (buckets, sum) = h.snapshot();
        for (le, n) in &buckets {
            let le = if le.is_infinite() {
                "+Inf".to_string()
            } else {
                le.to_string()
            };
            self.sample(&format!("{fam}_bucket"), &[label, ("le", &le)], n);
        }
        self.sample(&format!("{fam}_sum"), &[label], format!("{sum:.6}"));
        let count = buckets.last().map_or(0, |b| b.1);
        self.sample(&format!("{fam}_count"), &[label], count);
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
    o.family("vgate_relatches_total");
    for c in Channel::ALL {
        o.sample(
            "vgate_relatches_total",
            &[("channel", c.name())],
            totals.channel(c).relatches,
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
                ("reorder_held", s.reorder_held),
                ("reorder_expired", s.reorder_expired),
                ("reorder_overtaken", s.reorder_overtaken),
                ("fragmented", s.fragmented),
                ("fragments", s.fragments),
                ("joined", s.joined),
            ] {
                o.sample("vgate_link_fec_total", &[("link", l), ("what", what)], v);
            }
        }
        o.family("vgate_link_drops_total");
        for r in crate::stats::link::LinkDrop::ALL {
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
        let (wrong_out, wrong_in) = sp.wrong_direction();
        o.family("vgate_link_wrong_direction_packets");
        for (l, w) in [("out", wrong_out), ("in", wrong_in)] {
            if let Some(w) = w {
                o.sample("vgate_link_wrong_direction_packets", &[("link", l)], w);
            }
        }
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
    o.family("vgate_edge_legs");
    let legs = st.routes.legs.list();
    for state in crate::stats::leg::LegState::ALL {
        let n = legs.iter().filter(|l| l.counters.state() == state).count();
        o.sample("vgate_edge_legs", &[("state", state.name())], n);
    }
    o.family("vgate_edge_leg_events_total");
    for (event, n) in st.routes.legs.totals() {
        o.sample("vgate_edge_leg_events_total", &[("event", event)], n);
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

    st.routes.count_first_packets();
    o.family("vgate_media_first_packet_seconds");
    for k in crate::routes::FIRST_PACKET_KINDS {
        if let Some(h) = st.routes.first_packet_histogram(k) {
            o.histogram("vgate_media_first_packet_seconds", ("kind", k.name()), h);
        }
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
    let rtp = st.routes.rtp_totals();
    for (fam, get) in [
        (
            "vgate_rtp_lost_packets_total",
            (|s: &crate::stats::rtp::RtpSnapshot| s.lost) as fn(&_) -> u64,
        ),
        ("vgate_rtp_reordered_packets_total", |s| s.reordered),
        ("vgate_rtp_duplicate_packets_total", |s| s.duplicate),
    ] {
        o.family(fam);
        for c in Channel::ALL {
            o.sample(fam, &[("channel", c.name())], get(&rtp[c.index()]));
        }
    }

    signaling_families(&mut o, st);
    o.family("vgate_reloads_total");
    for (result, n) in [
        ("applied", &st.reloads.applied),
        ("rejected", &st.reloads.rejected),
    ] {
        o.sample(
            "vgate_reloads_total",
            &[("result", result)],
            n.load(Relaxed),
        );
    }
    o.family("vgate_reload_last_success");
    o.sample(
        "vgate_reload_last_success",
        &[],
        u8::from(st.reloads.last_ok.load(Relaxed)),
    );
    process_families(&mut o);

    // Declared whatever the engine (a scrape shows every family); samples only where the
    // engine has a neighbour resolver (not in mode stack).
    o.family("vgate_neigh_refused_total");
    if let Some(n) = &st.neigh {
        use std::sync::atomic::Ordering::Relaxed;
        o.sample(
            "vgate_neigh_refused_total",
            &[("reason", "queue_full")],
            n.queue_full.load(Relaxed),
        );
        o.sample(
            "vgate_neigh_refused_total",
            &[("reason", "table_full")],
            n.table_full.load(Relaxed),
        );
    }
    o.family("vgate_neigh_entries");
    if let Some(n) = &st.neigh {
        o.sample("vgate_neigh_entries", &[("kind", "used")], n.entries());
        o.sample("vgate_neigh_entries", &[("kind", "capacity")], n.capacity());
    }

    if let Some(sig) = &st.split_signal {
        use std::sync::atomic::Ordering::Relaxed;
        o.family("vgate_split_peer_up");
        o.sample("vgate_split_peer_up", &[], sig.peer_up.load(Relaxed));
        // The agent keeps the monotonic time (crate::clock); Prometheus wants wall time.
        let last = match sig.peer_last_ms.load(Relaxed) {
            0 => 0,
            mono => crate::clock::unix_ms(mono),
        };
        o.family("vgate_split_peer_last_seen_timestamp_seconds");
        o.sample(
            "vgate_split_peer_last_seen_timestamp_seconds",
            &[],
            format!("{:.3}", last as f64 / 1000.0),
        );
        o.family("vgate_split_signal_total");
        for (event, _, v) in sig.list() {
            o.sample("vgate_split_signal_total", &[("event", event)], v);
        }
    }

    if st.config().control.per_stream_metrics {
        o.family("vgate_edge_leg_total");
        for l in &legs {
            let id = l.id.to_string();
            for (event, n) in l.counters.named() {
                o.sample(
                    "vgate_edge_leg_total",
                    &[
                        ("leg", &id),
                        ("label", &l.label),
                        ("domain", l.domain.name()),
                        ("role", l.role),
                        ("event", event),
                    ],
                    n,
                );
            }
        }
        o.family("vgate_route_packets_total");
        for r in &routes {
            let port = r.port.to_string();
            let ssrc = ssrc_label(r);
            let labels = [
                ("route", &*r.label),
                ("channel", r.channel.name()),
                ("port", &port),
                ("ssrc", &ssrc),
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
            let ssrc = ssrc_label(r);
            let labels = [
                ("route", &*r.label),
                ("channel", r.channel.name()),
                ("port", &port),
                ("ssrc", &ssrc),
            ];
            o.drops(
                "vgate_route_drops_total",
                &labels,
                &r.stats.packets.snapshot(),
            );
        }
        o.family("vgate_route_rtp_lost_packets");
        for r in &routes {
            let port = r.port.to_string();
            let ssrc = ssrc_label(r);
            let labels = [
                ("route", &*r.label),
                ("channel", r.channel.name()),
                ("port", &port),
                ("ssrc", &ssrc),
            ];
            o.sample(
                "vgate_route_rtp_lost_packets",
                &labels,
                r.stats.rtp.snapshot().lost,
            );
        }
        if let Some(sp) = &st.split {
            // One series pair per route of the link face: bounded like every per-route family.
            let face = crate::routes::Channel::from_ingress(sp.half.link_face());
            o.family("vgate_route_link_packets_total");
            for r in routes.iter().filter(|r| r.channel == face) {
                let port = r.port.to_string();
                let l = r.stats.link.snapshot();
                for (how, v) in [
                    ("received", l.received),
                    ("repaired", l.repaired),
                    ("lost", l.lost),
                    ("late", l.late),
                    ("duplicate", l.duplicate),
                ] {
                    o.sample(
                        "vgate_route_link_packets_total",
                        &[
                            ("route", &*r.label),
                            ("channel", r.channel.name()),
                            ("port", &port),
                            ("how", how),
                        ],
                        v,
                    );
                }
            }
            o.family("vgate_route_link_restarts_total");
            for r in routes.iter().filter(|r| r.channel == face) {
                let port = r.port.to_string();
                o.sample(
                    "vgate_route_link_restarts_total",
                    &[
                        ("route", &*r.label),
                        ("channel", r.channel.name()),
                        ("port", &port),
                    ],
                    r.stats.link.snapshot().restarts,
                );
            }
        }
    }
    o.text
}

/// The SSRC a route carries, as RTP tools print it (`0x1a2b3c4d`), empty before a packet.
fn ssrc_label(r: &crate::routes::StreamRoute) -> String {
    r.stats
        .rtp
        .ssrc()
        .map(|s| format!("{s:#010x}"))
        .unwrap_or_default()
}

fn signaling_families(o: &mut Out, st: &ControlState) {
    let signaling = st.signaling.all();
    let kind_name = |k: crate::config::SignalingKind| match k {
        crate::config::SignalingKind::Sip => "sip",
        crate::config::SignalingKind::Rtsp => "rtsp",
    };
    for (fam, label) in [
        ("vgate_signaling_requests_total", "method"),
        ("vgate_signaling_responses_total", "class"),
    ] {
        o.family(fam);
        for (name, s) in &signaling {
            let values = if label == "method" {
                s.requests()
            } else {
                s.responses()
            };
            for (k, v) in values {
                o.sample(
                    fam,
                    &[("route", name), ("kind", kind_name(s.kind)), (label, k)],
                    v,
                );
            }
        }
    }
    o.family("vgate_signaling_call_setup_seconds");
    for (name, s) in &signaling {
        if s.kind != crate::config::SignalingKind::Sip {
            continue;
        }
        o.histogram(
            "vgate_signaling_call_setup_seconds",
            ("route", name),
            &s.call_setup,
        );
    }
    // Every event family once, in declaration order, with the samples that belong to it.
    let events: Vec<_> = signaling
        .iter()
        .map(|(name, s)| (name, kind_name(s.kind), s.events()))
        .collect();
    let mut families: Vec<&str> = EVENT_FAMILIES.iter().map(|e| e.1).collect();
    families.push("vgate_signaling_other_events_total");
    families.dedup();
    let mut done: Vec<&str> = Vec::new();
    for fam in families {
        if done.contains(&fam) {
            continue;
        }
        done.push(fam);
        o.family(fam);
        let label = event_label(fam);
        for (route, kind, list) in &events {
            for (event, v) in list {
                let (f, value) = event_family(event);
                if f != fam {
                    continue;
                }
                let mut labels = vec![("route", route.as_str()), ("kind", *kind)];
                if !value.is_empty() {
                    labels.push((label, value));
                }
                o.sample(fam, &labels, v);
            }
        }
    }
}

/// `vgate_build_info` and the process metrics every Prometheus client library exports.
fn process_families(o: &mut Out) {
    o.family("vgate_build_info");
    let pfring = if cfg!(vgate_pfring) { "true" } else { "false" };
    o.sample(
        "vgate_build_info",
        &[("version", env!("CARGO_PKG_VERSION")), ("pfring", pfring)],
        1,
    );
    let p = crate::control::process::sample();
    o.family("process_cpu_seconds_total");
    o.sample(
        "process_cpu_seconds_total",
        &[],
        format!("{:.3}", p.cpu_seconds),
    );
    for (fam, v) in [
        ("process_resident_memory_bytes", p.resident_bytes),
        ("process_open_fds", p.open_fds),
        ("process_max_fds", p.max_fds),
    ] {
        if let Some(v) = v {
            o.family(fam);
            o.sample(fam, &[], v);
        }
    }
    if let Some(t) = p.start_time_seconds {
        o.family("process_start_time_seconds");
        o.sample("process_start_time_seconds", &[], format!("{t:.2}"));
    }
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
            .all(|f| matches!(f.1, "counter" | "gauge" | "histogram")));
        assert!(all
            .iter()
            .all(|f| f.0.starts_with("vgate_") || f.0.starts_with("process_")));
        assert!(all
            .iter()
            .filter(|f| f.1 == "counter")
            .all(|f| f.0.ends_with("_total")));
    }

    #[test]
    fn every_event_family_is_declared() {
        for (event, fam, _) in EVENT_FAMILIES {
            assert!(FAMILIES.iter().any(|f| f.0 == *fam), "{event}: {fam}");
        }
        assert_eq!(
            event_family("nonsense").0,
            "vgate_signaling_other_events_total"
        );
    }

    #[test]
    fn every_known_proxy_event_has_a_family() {
        let sip = crate::signaling::proxy::sip::Counters::default().list();
        let rtsp = crate::signaling::proxy::rtsp::logic::Events::default().list();
        for (event, _) in sip.iter().chain(&rtsp) {
            assert_ne!(
                event_family(event).0,
                "vgate_signaling_other_events_total",
                "give the proxy event {event} a family in EVENT_FAMILIES"
            );
        }
    }
}
