//! Prometheus text exposition (format 0.0.4) of the gateway's counters.
//!
//! Every family is declared once in [`FAMILIES`] (name, type, help); the renderer writes only
//! declared families, and a test checks that a scrape of a running gateway shows all of them.
//!
//! This folder: `families` (the declarations), `out` (the text writer), `signaling` and
//! `process` (those families' samples); this file renders the gateway's own state.

use std::sync::atomic::Ordering::Relaxed;

use super::ControlState;
use crate::clock::now_ms;
use crate::config::DomainId;
use crate::routes::{Channel, SessionKind};

mod families;
mod out;
mod process;
mod signaling;
#[cfg(test)]
mod tests;

pub use families::{event_series, EVENT_FAMILIES, FAMILIES, HA_FAMILIES, SPLIT_FAMILIES};

use out::Out;
use process::process_families;
use signaling::signaling_families;

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
    let media = st.routes.media_totals();
    o.family("vgate_media_invalid_total");
    for c in Channel::ALL {
        let m = media.channels[c.index()].snapshot();
        for &v in crate::media::Violation::ALL {
            o.sample(
                "vgate_media_invalid_total",
                &[("channel", c.name()), ("reason", v.name())],
                m.get(v),
            );
        }
    }
    o.family("vgate_media_stripped_total");
    for c in Channel::ALL {
        let m = media.channels[c.index()].snapshot();
        for &v in crate::media::Violation::STRIPPED {
            o.sample(
                "vgate_media_stripped_total",
                &[("channel", c.name()), ("reason", v.name())],
                m.stripped(v),
            );
        }
    }
    o.family("vgate_media_stripped_bytes_total");
    for c in Channel::ALL {
        o.sample(
            "vgate_media_stripped_bytes_total",
            &[("channel", c.name())],
            media.channels[c.index()].snapshot().stripped_bytes,
        );
    }
    o.family("vgate_media_validator_evictions_total");
    o.sample(
        "vgate_media_validator_evictions_total",
        &[],
        media.evictions.load(Relaxed),
    );
    let capture = st.routes.capture();
    o.family("vgate_capture_armed");
    o.sample("vgate_capture_armed", &[], u64::from(capture.is_armed()));
    o.family("vgate_capture_packets_total");
    o.sample("vgate_capture_packets_total", &[], capture.captured_total());
    o.family("vgate_capture_overflow_total");
    o.sample(
        "vgate_capture_overflow_total",
        &[],
        capture.overflow_total(),
    );
    o.family("vgate_captures_total");
    o.sample("vgate_captures_total", &[], capture.armings());
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
        o.family("vgate_link_authenticated");
        for (l, a) in [("out", sp.out_auth), ("in", sp.in_auth)] {
            o.sample("vgate_link_authenticated", &[("link", l)], u64::from(a));
        }
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
            // The reorder window: waits begun, what handed held datagrams on, how long
            // they waited.
            let named = crate::stats::link::REORDER_RELEASES
                .iter()
                .zip(s.reorder_released)
                .map(|(n, v)| (format!("reorder_released_{n}"), v))
                .chain(
                    crate::stats::link::REORDER_WAITS
                        .iter()
                        .zip(s.reorder_waited)
                        .map(|(n, v)| (format!("reorder_wait_{n}"), v)),
                )
                .chain([("reorder_waits".to_owned(), s.reorder_waits)]);
            for (what, v) in named {
                o.sample(
                    "vgate_link_fec_total",
                    &[("link", l), ("what", what.as_str())],
                    v,
                );
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
    ha_families(&mut o, st);
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

    // Mode xdp: per egress interface of the fast path (declared whatever the mode).
    o.family("vgate_xdp_egress_fallback_total");
    o.family("vgate_xdp_egress_off_fast_path");
    for e in st.xdp.iter().flat_map(|x| x.egress.iter().flatten()) {
        use std::sync::atomic::Ordering::Relaxed;
        let labels = [
            ("interface", e.interface.as_str()),
            ("domain", e.domain.name()),
        ];
        o.sample(
            "vgate_xdp_egress_fallback_total",
            &labels,
            e.fallbacks.load(Relaxed),
        );
        o.sample(
            "vgate_xdp_egress_off_fast_path",
            &labels,
            u8::from(!e.on_fast_path()),
        );
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
        // The labels every per-route family carries, formatted once (one SSRC per scrape).
        let ids: Vec<(String, String)> = routes
            .iter()
            .map(|r| (r.port.to_string(), ssrc_label(r)))
            .collect();
        let labels_of = |i: usize| {
            let (r, (port, ssrc)) = (&routes[i], &ids[i]);
            [
                ("route", &*r.label),
                ("channel", r.channel.name()),
                ("port", port.as_str()),
                ("ssrc", ssrc.as_str()),
            ]
        };
        o.family("vgate_route_packets_total");
        for (i, r) in routes.iter().enumerate() {
            let labels = labels_of(i);
            o.packets(
                "vgate_route_packets_total",
                &labels,
                &r.stats.packets.snapshot(),
            );
        }
        o.family("vgate_route_drops_total");
        for (i, r) in routes.iter().enumerate() {
            let labels = labels_of(i);
            o.drops(
                "vgate_route_drops_total",
                &labels,
                &r.stats.packets.snapshot(),
            );
        }
        o.family("vgate_route_media_invalid_total");
        for (i, r) in routes.iter().enumerate() {
            let [route, channel, port, ssrc] = labels_of(i);
            for (v, n) in r.stats.media.snapshot().nonzero() {
                o.sample(
                    "vgate_route_media_invalid_total",
                    &[route, channel, port, ssrc, ("reason", v.name())],
                    n,
                );
            }
        }
        o.family("vgate_route_media_stripped_total");
        for (i, r) in routes.iter().enumerate() {
            let [route, channel, port, ssrc] = labels_of(i);
            for (v, n) in r.stats.media.snapshot().stripped_nonzero() {
                o.sample(
                    "vgate_route_media_stripped_total",
                    &[route, channel, port, ssrc, ("reason", v.name())],
                    n,
                );
            }
        }
        o.family("vgate_route_rtp_lost_packets");
        for (i, r) in routes.iter().enumerate() {
            let labels = labels_of(i);
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

/// `vgate_ha_*`: declared always, samples only on a node with `[ha]`.
fn ha_families(o: &mut out::Out, st: &ControlState) {
    use crate::ha::Role;
    let h = st.ha.as_deref();
    o.family("vgate_ha_role");
    if let Some(h) = h {
        for r in [Role::Active, Role::Standby, Role::Fault] {
            o.sample(
                "vgate_ha_role",
                &[("role", r.name())],
                u8::from(h.role() == r),
            );
        }
    }
    o.family("vgate_ha_state_store_up");
    if let Some(h) = h.filter(|h| h.config.redis.is_some()) {
        o.sample(
            "vgate_ha_state_store_up",
            &[],
            u8::from(h.store_ok.load(Relaxed)),
        );
    }
    o.family("vgate_ha_state_store_errors_total");
    o.family("vgate_ha_state_store_writes_total");
    o.family("vgate_ha_state_store_pending");
    o.family("vgate_ha_state_store_age_seconds");
    o.family("vgate_ha_lag_seconds");
    o.family("vgate_ha_state_store_lost_total");
    o.family("vgate_ha_replicas");
    o.family("vgate_ha_replica_errors_total");
    o.family("vgate_ha_takeovers_total");
    o.family("vgate_ha_takeovers_refused_total");
    o.family("vgate_ha_fenced_total");
    o.family("vgate_ha_fenced");
    o.family("vgate_ha_lease_epoch");
    o.family("vgate_ha_last_takeover_timestamp_seconds");
    let Some(h) = h else {
        return;
    };
    if h.config.redis.is_some() {
        o.sample(
            "vgate_ha_state_store_errors_total",
            &[],
            h.store_errors.load(Relaxed),
        );
        let resyncs = h.store_resyncs.load(Relaxed);
        let writes = h.store_writes.load(Relaxed);
        o.sample(
            "vgate_ha_state_store_writes_total",
            &[("kind", "batch")],
            writes.saturating_sub(resyncs),
        );
        o.sample(
            "vgate_ha_state_store_writes_total",
            &[("kind", "resync")],
            resyncs,
        );
        o.sample(
            "vgate_ha_state_store_lost_total",
            &[],
            h.store_lost.load(Relaxed),
        );
        o.sample(
            "vgate_ha_state_store_pending",
            &[],
            h.store_pending.load(Relaxed),
        );
        let age = h
            .store_age_ms(crate::clock::now_ms())
            .map_or(-1.0, |a| a as f64 / 1e3);
        o.sample("vgate_ha_state_store_age_seconds", &[], age);
        o.sample(
            "vgate_ha_lag_seconds",
            &[],
            h.lag_ms.load(Relaxed) as f64 / 1e3,
        );
    }
    o.sample("vgate_ha_replicas", &[], h.replicas.load(Relaxed));
    o.sample(
        "vgate_ha_replica_errors_total",
        &[],
        h.apply_errors.load(Relaxed),
    );
    o.sample("vgate_ha_takeovers_total", &[], h.takeovers.load(Relaxed));
    o.sample(
        "vgate_ha_takeovers_refused_total",
        &[],
        h.takeovers_refused.load(Relaxed),
    );
    o.sample("vgate_ha_fenced_total", &[], h.fenced_total.load(Relaxed));
    o.sample("vgate_ha_fenced", &[], u8::from(h.fenced().is_some()));
    o.sample("vgate_ha_lease_epoch", &[], h.lease_epoch.load(Relaxed));
    o.sample(
        "vgate_ha_last_takeover_timestamp_seconds",
        &[],
        h.last_takeover_wall_ms.load(Relaxed) as f64 / 1e3,
    );
}
