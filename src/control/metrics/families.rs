//! The declaration of every exported family: [`FAMILIES`] (name, type, help),
//! [`SPLIT_FAMILIES`] (a split half's links), [`HA_FAMILIES`] (a hot-standby node) and
//! [`EVENT_FAMILIES`] (which family and label each signaling proxy event is exported as,
//! [`event_series`]).

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
        "Stream leg counters summed over every leg so far: frames and bytes in (from the TCP peer) and out, framing errors, partial frames at close, stalls (packets dropped because the peer did not read), inject drops, connects, refused connections, renewals refused, reconnects of a device (the TCP client) to a passive leg",
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
        "vgate_media_invalid_total",
        "counter",
        "Packets the media validator refused, per channel and reason (dropped under validate = enforce, forwarded and counted under count)",
    ),
    (
        "vgate_media_stripped_total",
        "counter",
        "Packets the strip action rewrote or stripped away, per channel and what it cut (validate = strip)",
    ),
    (
        "vgate_media_stripped_bytes_total",
        "counter",
        "Bytes the strip action kept from crossing, per channel: what it cut out of packets, and whole datagrams it stripped away (validate = strip)",
    ),
    (
        "vgate_media_validator_evictions_total",
        "counter",
        "Times a worker's media validator table was full and gave up the state of the stream seen longest ago",
    ),
    (
        "vgate_capture_armed",
        "gauge",
        "1 while a refusal capture (vgate capture-refused) is armed on a route, else 0",
    ),
    (
        "vgate_capture_packets_total",
        "counter",
        "Refused packets taken by refusal captures (vgate capture-refused), over every capture",
    ),
    (
        "vgate_capture_overflow_total",
        "counter",
        "Refused packets of a route under capture not taken because every capture buffer waited to be read (capture_overflow)",
    ),
    (
        "vgate_captures_total",
        "counter",
        "Refusal captures armed",
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
        "vgate_xdp_egress_fallback_total",
        "counter",
        "Mode xdp: times an egress interface was taken off the in-kernel fast path (at start: its xdp-features lack ndo_xdp_xmit; while running: the kernel refused at least half of what the fast path redirected to it); its routes then use the AF_XDP path",
    ),
    (
        "vgate_xdp_egress_off_fast_path",
        "gauge",
        "Mode xdp: 1 while an egress interface is off the in-kernel fast path (its routes on the AF_XDP path), 0 while on it",
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
        "vgate_route_media_stripped_total",
        "counter",
        "Per route (with control.per_stream_metrics): packets the strip action rewrote or stripped away, by what it cut",
    ),
    (
        "vgate_route_media_invalid_total",
        "counter",
        "Per stream route (with control.per_stream_metrics): media violations by reason, the reasons counted only",
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
        "vgate_rtsp_evicted_total",
        "counter",
        "RTSP connections without a session closed to make room for a new one, per route, by reason (per_source: the source was at max_connections_per_source; route_full: the route held its most connections without a session)",
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

/// The families of a hot-standby node (`[ha]`): declared in every scrape, with samples only
/// on such a node.
pub const HA_FAMILIES: &[(&str, &str, &str)] = &[
    (
        "vgate_ha_role",
        "gauge",
        "Hot standby ([ha]): 1 for the role this node is in (active, standby, fault), 0 for the others",
    ),
    (
        "vgate_ha_state_store_up",
        "gauge",
        "Hot standby: 1 when the last call to the state store (Redis) worked",
    ),
    (
        "vgate_ha_state_store_errors_total",
        "counter",
        "Hot standby: state-store calls that failed (Redis away or slow)",
    ),
    (
        "vgate_ha_state_store_writes_total",
        "counter",
        "Hot standby: batches the active wrote to the state store; kind resync counts whole rewrites",
    ),
    (
        "vgate_ha_state_store_pending",
        "gauge",
        "Hot standby: sessions changed on the active and not yet in the state store",
    ),
    (
        "vgate_ha_state_store_age_seconds",
        "gauge",
        "Hot standby: seconds since the state store last answered (-1: never)",
    ),
    (
        "vgate_ha_state_store_lost_total",
        "counter",
        "Hot standby, on the active: batches that found the state store had lost this node's writes (flushed, restarted empty, a replica promoted early); each is followed by a whole rewrite",
    ),
    (
        "vgate_ha_lag_seconds",
        "gauge",
        "Hot standby, on the standby: age of the active's last write to the state store",
    ),
    (
        "vgate_ha_replicas",
        "gauge",
        "Hot standby: copies of the active's sessions held here",
    ),
    (
        "vgate_ha_replica_errors_total",
        "counter",
        "Hot standby: copies that could not be installed here, or unreadable records",
    ),
    (
        "vgate_ha_takeovers_total",
        "counter",
        "Hot standby: times this node became the active one",
    ),
    (
        "vgate_ha_takeovers_refused_total",
        "counter",
        "Hot standby: takeovers this node refused because its copy of the state was stale",
    ),
    (
        "vgate_ha_fenced_total",
        "counter",
        "Hot standby: times this node, asked to be the active one, could not hold the fencing lease and forwarded nothing",
    ),
    (
        "vgate_ha_fenced",
        "gauge",
        "Hot standby: 1 while this node is fenced (asked to be active, another node holds the lease)",
    ),
    (
        "vgate_ha_lease_epoch",
        "gauge",
        "Hot standby: the fencing lease epoch this node holds (0: none)",
    ),
    (
        "vgate_ha_last_takeover_timestamp_seconds",
        "gauge",
        "Hot standby: Unix time of the last takeover (0: none)",
    ),
];

/// The families only a split half produces (its links); see [`crate::config::split`].
pub const SPLIT_FAMILIES: &[(&str, &str, &str)] = &[
    (
        "vgate_link_authenticated",
        "gauge",
        "Split half: 1 when the link's frames are authenticated (split.out_link/in_link key set), 0 when anyone on the link could forge them",
    ),
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
        "Split half: FEC per link: repair frames sent or received, datagrams repaired, lost, late, duplicate; the incoming link's reorder window: datagrams held, positions given up, datagrams overtaken, waits begun (reorder_waits), held datagrams by what handed them on (reorder_released_*) and by how long they waited (reorder_wait_*); datagrams cut into fragments (out), fragments received and datagrams joined from them (in)",
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
        "media_refused",
        "vgate_signaling_refused_total",
        "media_validation",
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
        "refused_sessions_per_source",
        "vgate_signaling_refused_total",
        "sessions_per_source",
    ),
    (
        "refused_route_full",
        "vgate_signaling_refused_total",
        "route_full",
    ),
    (
        "evicted_per_source",
        "vgate_rtsp_evicted_total",
        "per_source",
    ),
    (
        "evicted_route_full",
        "vgate_rtsp_evicted_total",
        "route_full",
    ),
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
        "options_answered",
        "vgate_signaling_proxied_total",
        "probes_answered",
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
        "tcp_closes_mirrored",
        "vgate_signaling_proxied_total",
        "tcp_closes_mirrored",
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
pub(super) fn event_label(family: &str) -> &'static str {
    match family {
        "vgate_signaling_refused_total"
        | "vgate_signaling_dropped_total"
        | "vgate_rtsp_evicted_total" => "reason",
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
pub(super) fn event_family(event: &str) -> (&'static str, &str) {
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
