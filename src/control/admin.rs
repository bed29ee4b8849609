//! The admin interface: HTTP/1.1 on the management address (loopback by default; anywhere
//! else only with a token, which every request must then carry as `Authorization: Bearer`).
//!
//! | request | does |
//! |---|---|
//! | `GET /metrics` | Prometheus text format |
//! | `GET /api/v1/health` | 200 when every worker is alive (and, `[ha]`, a standby's state fresh), else 503 with the problems |
//! | `GET /api/v1/ha` | hot standby: role, state store, copies, takeovers |
//! | `POST /api/v1/ha/role` | hot standby: `{"role": "MASTER"}` (or `BACKUP`, `FAULT`; `"force": true` takes over with a stale state), what `vgate ha-notify` sends |
//! | `GET /api/v1/stats` | counters per channel and worker, ports, worst routes (for `vgate stats`) |
//! | `GET /api/v1/routes` | live stream routes |
//! | `POST /api/v1/routes` | add a static route (JSON body, see [`NewRoute`]) |
//! | `DELETE /api/v1/routes/{channel}/{port}` | remove a static or admin route and free its ports |
//! | `GET /api/v1/sessions` | live sessions |
//! | `DELETE /api/v1/sessions/{id}` | end a session: its routes go, its ports come back |
//! | `GET /api/v1/legs` | stream legs (RTP over TCP the gateway terminates): role, state, counters, and totals |
//! | `POST /api/v1/reload` | re-read the config file (same as SIGHUP) |
//! | `GET /api/v1/registrations` | devices registered through each SIP route: ID, contact, expiry |
//! | `GET /api/v1/dialogs` | confirmed SIP calls through each route: Call-IDs on both faces, contact tokens, media ports |
//! | `GET /api/v1/log-level` | the log filter in force |
//! | `PUT /api/v1/log-level` | replace it: `{"level": "debug"}` (a level or `RUST_LOG` directives) |
//! | `POST /api/v1/capture` | arm a capture of a route's next N refused packets (`vgate capture-refused`, [`super::capture`]) |
//! | `GET /api/v1/capture?id=N` | its progress and the packets taken since the last read |
//! | `DELETE /api/v1/capture?id=N` | stop it |
//!
//! One thread serves requests one at a time with a bounded body, so no client can make it
//! allocate without limit. Malformed requests get a 4xx with a reason in a JSON body.

use std::io::Read;
use std::net::{SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use serde::Deserialize;
use serde_json::{json, Value};
use tiny_http::{Header, Method, Request, Response, Server};

use super::{metrics, ControlState};
use crate::clock::now_ms;
use crate::config::{DomainId, SourcePolicy};
use crate::routes::{Channel, RouteError, RouteSpec, SessionId, SessionKind};

/// Largest request body accepted.
const MAX_BODY: usize = 64 * 1024;

/// A reload asked for through the admin interface, answered by the main loop.
pub struct ReloadRequest {
    pub reply: Sender<Result<String, String>>,
}

/// The running admin server.
pub struct AdminServer {
    thread: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    pub addr: SocketAddr,
}

#[derive(Debug, thiserror::Error)]
#[error("cannot open the admin interface on {addr}: {message}; is another vgate running? (set control.listen to another address)")]
pub struct AdminError {
    pub addr: SocketAddr,
    pub message: String,
}

impl AdminServer {
    /// Listens on `state.config.control.listen` and serves until dropped.
    pub fn start(
        state: ControlState,
        reload: Sender<ReloadRequest>,
    ) -> Result<AdminServer, AdminError> {
        let addr = state.config().control.listen;
        let server = Server::http(addr).map_err(|e| AdminError {
            addr,
            message: e.to_string(),
        })?;
        let addr = server.server_addr().to_ip().unwrap_or(addr);
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name("vgate-admin".into())
                .spawn(move || serve(server, state, reload, &stop))
                .map_err(|e| AdminError {
                    addr,
                    message: e.to_string(),
                })?
        };
        Ok(AdminServer {
            thread: Some(thread),
            stop,
            addr,
        })
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Requests answered on threads of their own at most at once; more wait their turn.
const MAX_SLOW: usize = 4;

/// Whether answering `req` may wait for another thread (a proxy, the reloader).
fn waits(req: &Request) -> bool {
    matches!(
        (req.method(), req.url()),
        (Method::Delete, u) if u.starts_with("/api/v1/sessions/")
    ) || (req.method() == &Method::Post && req.url().starts_with("/api/v1/reload"))
}

fn serve(server: Server, state: ControlState, reload: Sender<ReloadRequest>, stop: &AtomicBool) {
    let slow = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    while !stop.load(Relaxed) {
        match server.recv_timeout(Duration::from_millis(100)) {
            // A request that waits (ending a SIP/RTSP session waits for its proxy, a
            // reload for the reloader) is answered on a thread of its own: meanwhile
            // `vgate health` (keepalived's watcher asks ten times a second) is still
            // answered, or a hot-standby node would be taken for dead and fail over.
            Ok(Some(req)) if waits(&req) && slow.load(Relaxed) < MAX_SLOW => {
                slow.fetch_add(1, Relaxed);
                let (state, reload, n) = (state.clone(), reload.clone(), Arc::clone(&slow));
                let spawned = std::thread::Builder::new()
                    .name("vgate-admin-wait".into())
                    .spawn(move || {
                        handle(req, &state, &reload);
                        n.fetch_sub(1, Relaxed);
                    });
                if spawned.is_err() {
                    slow.fetch_sub(1, Relaxed);
                }
            }
            Ok(Some(req)) => handle(req, &state, &reload),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!("admin interface: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// An answer: status and JSON (or text) body.
struct Answer {
    status: u16,
    body: String,
    content_type: &'static str,
}

fn ok(v: Value) -> Answer {
    Answer {
        status: 200,
        body: v.to_string(),
        content_type: "application/json",
    }
}

fn reply((status, v): super::capture::Reply) -> Answer {
    Answer { status, ..ok(v) }
}

fn err(status: u16, reason: impl Into<String>) -> Answer {
    Answer {
        status,
        body: json!({ "error": reason.into() }).to_string(),
        content_type: "application/json",
    }
}

fn handle(mut req: Request, st: &ControlState, reload: &Sender<ReloadRequest>) {
    let answer = if !authorized(&req, st) {
        err(
            401,
            "missing or wrong token: send Authorization: Bearer <control.token>",
        )
    } else {
        match read_body(&mut req) {
            Ok(body) => route(req.method(), req.url(), &body, st, reload),
            Err(a) => a,
        }
    };
    let mut resp = Response::from_string(answer.body).with_status_code(answer.status);
    if let Ok(h) = Header::from_bytes("Content-Type", answer.content_type) {
        resp.add_header(h);
    }
    if answer.status == 401 {
        if let Ok(h) = Header::from_bytes("WWW-Authenticate", "Bearer") {
            resp.add_header(h);
        }
    }
    let _ = req.respond(resp);
}

fn authorized(req: &Request, st: &ControlState) -> bool {
    let config = st.config();
    let Some(token) = &config.control.token else {
        return true;
    };
    req.headers().iter().any(|h| {
        h.field.equiv("Authorization")
            && h.value
                .as_str()
                .strip_prefix("Bearer ")
                .is_some_and(|t| constant_time_eq(t.trim().as_bytes(), token.as_bytes()))
    })
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn read_body(req: &mut Request) -> Result<Vec<u8>, Answer> {
    if req.body_length().is_some_and(|n| n > MAX_BODY) {
        return Err(err(413, format!("body larger than {MAX_BODY} bytes")));
    }
    let mut body = Vec::new();
    let n = req
        .as_reader()
        .take(MAX_BODY as u64 + 1)
        .read_to_end(&mut body)
        .map_err(|e| err(400, format!("cannot read the body: {e}")))?;
    if n > MAX_BODY {
        return Err(err(413, format!("body larger than {MAX_BODY} bytes")));
    }
    Ok(body)
}

fn route(
    method: &Method,
    url: &str,
    body: &[u8],
    st: &ControlState,
    reload: &Sender<ReloadRequest>,
) -> Answer {
    let path = url.split('?').next().unwrap_or("");
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (method, parts.as_slice()) {
        (Method::Get, ["metrics"]) => Answer {
            status: 200,
            body: metrics::render(st),
            content_type: "text/plain; version=0.0.4; charset=utf-8",
        },
        (Method::Get, ["api", "v1", "health"]) => {
            let (problems, warnings) = st.health(now_ms());
            let healthy = problems.is_empty();
            let mut v = json!({
                "healthy": healthy, "workers": st.workers.len(),
                "problems": problems, "warnings": warnings,
                "role": st.ha.as_ref().map_or("active", |h| h.role().name()),
            });
            if !healthy {
                v["error"] = json!(problems.join("; "));
            }
            Answer {
                status: if healthy { 200 } else { 503 },
                ..ok(v)
            }
        }
        (Method::Get, ["api", "v1", "ha"]) => ha_json(st),
        (Method::Post, ["api", "v1", "ha", "role"]) => set_role(body, st),
        (Method::Get, ["api", "v1", "stats"]) => ok(stats(st)),
        (Method::Get, ["api", "v1", "routes"]) => ok(routes_json(st)),
        (Method::Post, ["api", "v1", "routes"]) => add_route(body, st),
        (Method::Delete, ["api", "v1", "routes", channel, port]) => delete_route(channel, port, st),
        (Method::Get, ["api", "v1", "sessions"]) => ok(sessions_json(st)),
        (Method::Get, ["api", "v1", "legs"]) => ok(legs_json(st)),
        (Method::Delete, ["api", "v1", "sessions", id]) => kill_session(id, st),
        (Method::Post, ["api", "v1", "reload"]) => do_reload(reload),
        (Method::Get, ["api", "v1", "registrations"]) => ok(registrations_json(st)),
        (Method::Get, ["api", "v1", "dialogs"]) => ok(dialogs_json(st)),
        (Method::Get, ["api", "v1", "log-level"]) => {
            ok(json!({ "level": crate::logging::level() }))
        }
        (Method::Put, ["api", "v1", "log-level"]) => set_log_level(body),
        (Method::Post, ["api", "v1", "capture"]) => reply(super::capture::arm(body, st)),
        (Method::Get, ["api", "v1", "capture"]) => reply(super::capture::read(url, st)),
        (Method::Delete, ["api", "v1", "capture"]) => reply(super::capture::stop(url, st)),
        (_, ["metrics"] | ["api", "v1", ..]) => {
            err(405, format!("{method} is not allowed on {path}"))
        }
        _ => err(
            404,
            format!("no such resource: {path}; see `vgate --help` for the admin API"),
        ),
    }
}

/// The hot-standby state.
fn ha_json(st: &ControlState) -> Answer {
    let Some(h) = &st.ha else {
        return ok(json!({ "enabled": false, "role": "active" }));
    };
    let now = now_ms();
    let (problems, warnings) = h.health(now);
    use std::sync::atomic::Ordering::Relaxed;
    ok(json!({
        "enabled": true,
        "node": h.config.node,
        "role": h.role().name(),
        "requested_role": h.wanted().name(),
        "peer": h.peer(),
        "state_store": h.config.redis.map(|a| a.to_string()),
        "state_store_up": h.store_ok.load(Relaxed),
        "state_store_age_ms": h.store_age_ms(now),
        "state_store_error": h.last_store_error(),
        "state_store_errors": h.store_errors.load(Relaxed),
        "state_store_writes": h.store_writes.load(Relaxed),
        "state_store_resyncs": h.store_resyncs.load(Relaxed),
        "state_store_lost": h.store_lost.load(Relaxed),
        "state_store_pending": h.store_pending.load(Relaxed),
        "lag_ms": h.lag_ms.load(Relaxed),
        "replicas": h.replicas.load(Relaxed),
        "replica_errors": h.apply_errors.load(Relaxed),
        "replicas_idle_ended": h.replicas_idle_ended.load(Relaxed),
        "takeovers": h.takeovers.load(Relaxed),
        "takeovers_refused": h.takeovers_refused.load(Relaxed),
        "takeover_refused": h.refusal(),
        "fenced": h.fenced().is_some(),
        "fenced_reason": h.fenced(),
        "fenced_total": h.fenced_total.load(Relaxed),
        "lease_epoch": h.lease_epoch.load(Relaxed),
        "lease_holder": h.lease_holder(),
        "lease_ms": h.config.lease_ms,
        "store_loss": h.config.store_loss.name(),
        "stale_takeover_allowed": h.stale_takeover_allowed(),
        "last_takeover_unix_ms": h.last_takeover_wall_ms.load(Relaxed),
        "last_takeover": h.last_takeover_steps().map(|t| json!({
            "asked_unix_ms": t.asked_unix_ms,
            "wake_ms": t.wake_ms,
            "read_ms": t.read_ms,
            "lease_ms": t.lease_ms,
            "reread_ms": t.reread_ms,
            "total_ms": t.total_ms,
        })),
        "problems": problems,
        "warnings": warnings,
    }))
}

/// The body of `POST /api/v1/ha/role`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SetRole {
    role: String,
    /// Take over even with a stale copy of the state (`vgate ha-notify --force`).
    #[serde(default)]
    force: bool,
}

fn set_role(body: &[u8], st: &ControlState) -> Answer {
    let Some(h) = &st.ha else {
        return err(
            409,
            "this gateway has no [ha] section: it is always active; add [ha] to run it as one node of a pair",
        );
    };
    let r: SetRole = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return err(400, format!("bad role: {e}")),
    };
    let Some(role) = crate::ha::Role::parse(&r.role) else {
        return err(
            400,
            format!("unknown role {:?}; use MASTER, BACKUP or FAULT", r.role),
        );
    };
    if r.force {
        h.allow_stale_takeover();
    }
    h.request(role);
    let refused = (role == crate::ha::Role::Active)
        .then(|| h.takeover_refusal(now_ms()))
        .flatten();
    ok(json!({ "requested_role": role.name(), "role": h.role().name(), "refused": refused }))
}

/// Every SIP route's registered devices (refreshed by each proxy once a second).
fn registrations_json(st: &ControlState) -> Value {
    let mut list = Vec::new();
    for (route, stats) in st.signaling.all() {
        for r in stats.registrations() {
            list.push(json!({
                "route": route, "id": r.id, "domain": r.domain.name(), "contact": r.contact,
                "peer": r.peer.to_string(), "binding": r.token,
                "expires_in_seconds": r.expires_in.as_secs(),
            }));
        }
    }
    json!({ "registrations": list })
}

/// Every SIP route's confirmed calls (refreshed by each proxy once a second).
fn dialogs_json(st: &ControlState) -> Value {
    let mut list = Vec::new();
    for (route, stats) in st.signaling.all() {
        for d in stats.dialogs() {
            list.push(json!({
                "route": route, "call_id": d.call_id, "upstream_call_id": d.upstream_call_id,
                "contacts": d.contacts, "media_ports": d.media_ports,
            }));
        }
    }
    json!({ "dialogs": list })
}

/// The body of `PUT /api/v1/log-level`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LogLevel {
    level: String,
}

fn set_log_level(body: &[u8]) -> Answer {
    let req: LogLevel = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => return err(400, format!("expected {{\"level\": \"debug\"}}: {e}")),
    };
    match crate::logging::set_level(&req.level) {
        Ok(level) => {
            tracing::info!("log level set to {level} through the admin interface");
            ok(json!({ "level": level }))
        }
        Err(e @ crate::logging::LogLevelError::Invalid { .. }) => err(400, e.to_string()),
        Err(e) => err(409, e.to_string()),
    }
}

fn snapshot_json(s: &crate::stats::Snapshot) -> Value {
    let mut drops = serde_json::Map::new();
    for r in crate::stats::DropReason::ALL {
        drops.insert(r.name().into(), s.drop_count(r).into());
    }
    json!({
        "rx_packets": s.rx_packets, "rx_bytes": s.rx_bytes,
        "tx_packets": s.tx_packets, "tx_bytes": s.tx_bytes,
        "drops": drops,
    })
}

/// A split half's route from the link face: what the incoming link handed it (`received`,
/// `repaired` by FEC), what it lost of the stream (`lost`, exact from the link stream
/// sequence; `late`, `duplicate`, `restarts`), and the RTP gaps seen after the link
/// (`rtp_lost`: the stream's loss so far, what happened before the peer half included). `None` on a single host and for routes
/// from this half's own domain.
fn link_stream_json(
    st: &ControlState,
    r: &crate::routes::StreamRoute,
    s: &crate::routes::RouteSnapshot,
) -> Option<Value> {
    let sp = st.split.as_ref()?;
    (r.channel == Channel::from_ingress(sp.half.link_face())).then(|| {
        let l = &s.link;
        json!({
            "received": l.received, "repaired": l.repaired, "lost": l.lost, "late": l.late,
            "duplicate": l.duplicate, "restarts": l.restarts, "rtp_lost": s.rtp.lost,
        })
    })
}

/// Media violations by reason, only the reasons counted (`{}` when none).
fn media_json(m: &crate::stats::media::MediaSnapshot) -> Value {
    let v: serde_json::Map<String, Value> = m
        .nonzero()
        .map(|(r, n)| (r.name().to_string(), n.into()))
        .collect();
    v.into()
}

fn stripped_json(m: &crate::stats::media::MediaSnapshot) -> Value {
    let v: serde_json::Map<String, Value> = m
        .stripped_nonzero()
        .map(|(r, n)| (r.name().to_string(), n.into()))
        .collect();
    v.into()
}

/// A route's media validation: its mode (`off`, `count`, `enforce`), what it accepts, and
/// its violations by reason.
fn route_media_json(r: &crate::routes::StreamRoute, s: &crate::routes::RouteSnapshot) -> Value {
    match &r.media {
        None => json!({ "validate": "off" }),
        Some(rule) => {
            let formats: Vec<Value> = rule
                .spec
                .formats()
                .iter()
                .map(|f| json!({ "pt": f.pt, "codec": format!("{:?}", f.codec), "clock_rate": f.clock_rate }))
                .collect();
            json!({
                "validate": if rule.policy.strip { "strip" } else if rule.enforce { "enforce" } else { "count" },
                "formats": formats,
                "ssrc": rule.spec.ssrc,
                "invalid": media_json(&s.media),
                "stripped": stripped_json(&s.media),
                "stripped_bytes": s.media.stripped_bytes,
            })
        }
    }
}

fn stats(st: &ControlState) -> Value {
    let totals = st.totals();
    let media_totals = st.routes.media_totals();
    let media: serde_json::Map<String, Value> = Channel::ALL
        .iter()
        .map(|c| {
            (
                c.name().to_string(),
                media_json(&media_totals.channels[c.index()].snapshot()),
            )
        })
        .collect();
    let channels: serde_json::Map<String, Value> = Channel::ALL
        .iter()
        .map(|c| (c.name().to_string(), snapshot_json(totals.channel(*c))))
        .collect();
    let workers: Vec<Value> = st
        .workers
        .iter()
        .map(|w| {
            let ch: serde_json::Map<String, Value> = Channel::ALL
                .iter()
                .map(|c| {
                    (
                        c.name().to_string(),
                        snapshot_json(&w.channel(*c).snapshot()),
                    )
                })
                .collect();
            json!({
                "index": w.index, "cpu": w.running_cpu(), "pinned": w.pinned(),
                "configured_cpu": w.cpu, "cpu_seconds": w.cpu_seconds(),
                "alive": !w.exited.load(Relaxed), "channels": ch,
            })
        })
        .collect();
    let mut worst: Vec<Value> = st
        .routes
        .routes()
        .iter()
        .map(|r| (r, r.stats.snapshot()))
        .filter(|(_, s)| s.rtp.lost > 0 || s.packets.dropped() > 0)
        .map(|(r, s)| {
            json!({
                "route": &*r.label, "channel": r.channel.name(), "port": r.port,
                "rtp_lost": s.rtp.lost, "rtp_packets": s.rtp.packets, "dropped": s.packets.dropped(),
            })
        })
        .collect();
    worst.sort_by_key(|v| {
        std::cmp::Reverse(v["rtp_lost"].as_u64().unwrap_or(0) + v["dropped"].as_u64().unwrap_or(0))
    });
    worst.truncate(10);
    // A split half: the streams the incoming link carries, most lost on the link, then most
    // lost before it, then most repaired first.
    let mut link_streams: Vec<Value> = st
        .routes
        .routes()
        .iter()
        .filter_map(|r| {
            let s = r.stats.snapshot();
            let mut v = link_stream_json(st, r, &s)?;
            v["route"] = (*r.label).into();
            v["port"] = r.port.into();
            Some(v)
        })
        .collect();
    link_streams.sort_by_key(|v| {
        std::cmp::Reverse((
            v["lost"].as_u64().unwrap_or(0),
            v["rtp_lost"].as_u64().unwrap_or(0),
            v["repaired"].as_u64().unwrap_or(0),
            v["received"].as_u64().unwrap_or(0),
        ))
    });
    link_streams.truncate(20);
    let ports: serde_json::Map<String, Value> = DomainId::ALL
        .iter()
        .map(|d| {
            let (used, free) = st.routes.ports(*d);
            (d.name().to_string(), json!({ "used": used, "free": free }))
        })
        .collect();
    let split_signal = st.split_signal.as_ref().map(|sig| {
        let counters: serde_json::Map<String, Value> = sig
            .list()
            .into_iter()
            .map(|(k, _, v)| (k.to_string(), json!(v)))
            .collect();
        let last = sig.peer_last_ms.load(Relaxed);
        json!({
            "peer_up": sig.peer_up.load(Relaxed) == 1,
            "peer_last_seen_ms_ago": (last > 0).then(|| now_ms().saturating_sub(last)),
            "counters": counters,
        })
    });
    json!({
        "split": st.split.as_ref().map(|s| {
            let mut v = s.to_json();
            v["streams"] = link_streams.into();
            v
        }),
        "uptime_seconds": st.started.elapsed().as_secs_f64(),
        "split_signal": split_signal,
        "engine": st.engine,
        "neigh": st.neigh.as_ref().map(|n| json!({
            "entries": n.entries(),
            "capacity": n.capacity(),
            "queue_full": n.queue_full.load(Relaxed),
            "table_full": n.table_full.load(Relaxed),
        })),
        "xdp": st.xdp.as_ref().map(|x| json!({
            "egress": x.egress.iter().flatten().map(xdp_egress_json).collect::<Vec<_>>(),
        })),
        "healthy": st.healthy(now_ms()),
        "ha": st.ha.as_ref().map(|h| json!({
            "node": h.config.node,
            "role": h.role().name(),
            "peer": h.peer(),
            "state_store_up": h.store_ok.load(Relaxed),
            "lag_ms": h.lag_ms.load(Relaxed),
            "pending": h.store_pending.load(Relaxed),
            "replicas": h.replicas.load(Relaxed),
            "takeovers": h.takeovers.load(Relaxed),
            "last_takeover_unix_ms": h.last_takeover_wall_ms.load(Relaxed),
            "fenced": h.fenced().is_some(),
            "fenced_total": h.fenced_total.load(Relaxed),
            "lease_epoch": h.lease_epoch.load(Relaxed),
        })),
        "channels": channels,
        "workers": workers,
        "ports": ports,
        "sessions": st.routes.sessions().len(),
        "routes": st.routes.routes().len(),
        "worst_routes": worst,
        "media_invalid": media,
        "media_validator_evictions": media_totals.evictions.load(Relaxed),
        "media_stripped": Channel::ALL
            .iter()
            .map(|c| {
                let m = media_totals.channels[c.index()].snapshot();
                (c.name().to_string(), json!({ "packets": stripped_json(&m), "bytes": m.stripped_bytes }))
            })
            .collect::<serde_json::Map<String, Value>>(),
    })
}

/// One egress interface of mode xdp's fast path.
fn xdp_egress_json(e: &crate::engine::xdp::EgressStatus) -> Value {
    json!({
        "interface": e.interface,
        "domain": e.domain.name(),
        "fast_path": e.on_fast_path(),
        "off_reason": e.off_reason(),
        "fallbacks": e.fallbacks.load(Relaxed),
    })
}

fn routes_json(st: &ControlState) -> Value {
    let routes: Vec<Value> = st
        .routes
        .routes()
        .iter()
        .map(|r| {
            let s = r.stats.snapshot();
            let mut v = json!({
                "name": &*r.label, "channel": r.channel.name(), "port": r.port,
                "destination": r.dest.to_string(), "egress_port": r.egress_port,
                "source_validation": r.policy.to_string(),
                "expect_source": r.expected.map(|e| e.to_string()),
                "latched_source": r.latched().map(|e| e.to_string()),
                "rtp_only": r.rtp_only, "session": r.session,
                "last_seen_ms": r.last_seen_ms().map(crate::clock::unix_ms),
                "idle_ms": r.last_seen_ms().map(|t| now_ms().saturating_sub(t)),
                "counters": snapshot_json(&s.packets),
                "rtp": { "packets": s.rtp.packets, "lost": s.rtp.lost, "reordered": s.rtp.reordered, "duplicate": s.rtp.duplicate },
                "media": route_media_json(r, &s),
            });
            if let Some(link) = link_stream_json(st, r, &s) {
                v["link"] = link;
            }
            // Mode xdp: whether the route's egress is on the fast path, and why not.
            if let Some(e) = st
                .xdp
                .as_ref()
                .and_then(|x| x.egress[r.channel.egress().index()].as_ref())
            {
                v["xdp_egress"] = xdp_egress_json(e);
            }
            v
        })
        .collect();
    json!({ "routes": routes })
}

/// The live stream legs (RTP over TCP the gateway terminates, [`crate::edge`]) with their
/// counters, and the counters summed over every leg so far.
fn legs_json(st: &ControlState) -> Value {
    let legs: Vec<Value> = st
        .routes
        .legs
        .list()
        .iter()
        .map(|l| {
            let mut v = json!({
                "id": l.id, "session": l.session, "label": l.label, "domain": l.domain.name(),
                "role": l.role, "local": l.local.to_string(), "peer": l.peer.to_string(),
                "state": l.counters.state().name(),
            });
            for (k, n) in l.counters.named() {
                v[k] = json!(n);
            }
            v
        })
        .collect();
    let totals: serde_json::Map<String, Value> = st
        .routes
        .legs
        .totals()
        .iter()
        .map(|(k, n)| (k.to_string(), json!(n)))
        .collect();
    json!({ "legs": legs, "totals": totals })
}

fn sessions_json(st: &ControlState) -> Value {
    let sessions: Vec<Value> = st
        .routes
        .sessions()
        .iter()
        .map(|s| {
            json!({
                "id": s.id, "kind": s.kind.name(), "label": s.label,
                "age_seconds": s.created.elapsed().map(|d| d.as_secs()).unwrap_or(0),
                "ports": s.ports.iter().map(|(d, p)| format!("{d}:{p}")).collect::<Vec<_>>(),
                "routes": s.routes.iter().map(|(c, p)| format!("{c}:{p}")).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({ "sessions": sessions })
}

/// The body of `POST /api/v1/routes`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewRoute {
    pub name: String,
    /// Domain the media arrives from: "a" or "b".
    pub domain: String,
    /// Gateway port in that domain; allocated when absent.
    pub port: Option<u16>,
    pub destination: String,
    /// Gateway port in the other domain the media leaves from; allocated when absent.
    pub egress_port: Option<u16>,
    pub expect_source: Option<String>,
    pub source_validation: Option<String>,
    #[serde(default)]
    pub rtp_only: bool,
}

fn route_error(e: RouteError) -> Answer {
    let status = match e {
        RouteError::Ports { .. } | RouteError::PortOpen { .. } | RouteError::Exists { .. } => 409,
        RouteError::NoSession(_) | RouteError::NoRoute { .. } => 404,
        // The gateway's fault, not the request's.
        RouteError::Install { .. } => 500,
        _ => 400,
    };
    err(status, e.to_string())
}

fn add_route(body: &[u8], st: &ControlState) -> Answer {
    let nr: NewRoute = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return err(400, format!("bad route: {e}")),
    };
    if nr.name.is_empty() || nr.name.len() > 64 {
        return err(400, "name must be 1-64 characters");
    }
    let domain = match nr.domain.as_str() {
        "a" => DomainId::A,
        "b" => DomainId::B,
        other => return err(400, format!("unknown domain {other:?}; use \"a\" or \"b\"")),
    };
    let Ok(dest) = nr.destination.parse::<SocketAddrV4>() else {
        return err(
            400,
            "destination must be an IPv4 address and port such as \"10.0.0.5:5000\"",
        );
    };
    let expected = match &nr.expect_source {
        None => None,
        Some(s) => match s.parse::<SocketAddrV4>() {
            Ok(a) => Some(a),
            Err(_) => {
                return err(
                    400,
                    "expect_source must be an IPv4 address and port (port 0: any)",
                )
            }
        },
    };
    let policy = match nr.source_validation.as_deref() {
        None => st.config().security.source_validation,
        Some("strict") => SourcePolicy::Strict,
        Some("latch") => SourcePolicy::Latch,
        Some("any") => SourcePolicy::Any,
        Some(o) => {
            return err(
                400,
                format!("unknown source_validation {o:?}; use strict, latch or any"),
            )
        }
    };
    let routes = &st.routes;
    let session = routes.open_session(SessionKind::Admin, nr.name.clone());
    let result = (|| {
        let port = match nr.port {
            Some(p) => routes.reserve_port(session, domain, p).map(|_| p)?,
            None => routes.alloc_port(session, domain)?,
        };
        let far = domain.other();
        let egress_port = match nr.egress_port {
            Some(p) => routes.reserve_port(session, far, p).map(|_| p)?,
            None => routes.alloc_port(session, far)?,
        };
        routes.add_route(
            session,
            RouteSpec {
                ingress: domain,
                port,
                dest,
                egress_port,
                policy,
                expected,
                rtp_only: nr.rtp_only,
                label: nr.name.clone(),
                media: None,
            },
        )
    })();
    match result {
        Ok(r) => {
            tracing::info!(route = %r.label, channel = %r.channel, port = r.port, dest = %r.dest, egress_port = r.egress_port, "route added through the admin interface");
            let mut a = ok(
                json!({ "session": session, "channel": r.channel.name(), "port": r.port, "egress_port": r.egress_port }),
            );
            a.status = 201;
            a
        }
        Err(e) => {
            let _ = routes.close_session(session);
            route_error(e)
        }
    }
}

/// `forward`/`a` or `reverse`/`b`, as the admin API names a channel.
pub(super) fn parse_channel(s: &str) -> Option<Channel> {
    match s {
        "forward" | "a" => Some(Channel::Forward),
        "reverse" | "b" => Some(Channel::Reverse),
        _ => None,
    }
}

fn delete_route(channel: &str, port: &str, st: &ControlState) -> Answer {
    let (Some(channel), Ok(port)) = (parse_channel(channel), port.parse::<u16>()) else {
        return err(400, "use DELETE /api/v1/routes/{forward|reverse}/{port}");
    };
    let Some(route) = st.routes.lookup(channel, port) else {
        return err(
            404,
            format!("the {channel} channel has no route on port {port}"),
        );
    };
    let Some(session) = st.routes.session(route.session) else {
        return err(404, "the route's session has just ended");
    };
    if !matches!(session.kind, SessionKind::Static | SessionKind::Admin) {
        return err(
            409,
            format!("route belongs to {} session {}; end the session instead (DELETE /api/v1/sessions/{})", session.kind.name(), session.id, session.id),
        );
    }
    end_session(session.id, st)
}

fn kill_session(id: &str, st: &ControlState) -> Answer {
    match id.parse::<SessionId>() {
        Ok(id) => end_session(id, st),
        Err(_) => err(400, "a session id is a number; see GET /api/v1/sessions"),
    }
}

/// How long a proxy gets to end a session its own way (BYE, TEARDOWN) before vgate just
/// frees its routes and ports.
const GRACEFUL_END: Duration = Duration::from_secs(3);

fn end_session(id: SessionId, st: &ControlState) -> Answer {
    let Some(session) = st.routes.session(id) else {
        return err(404, format!("no session {id}; it may have ended already"));
    };
    if matches!(session.kind, SessionKind::Sip | SessionKind::Rtsp) {
        // The proxy that owns it sends BYE to both sides (SIP) or TEARDOWN upstream (RTSP),
        // then frees it; the admin interface only waits and reports.
        if st.routes.request_end(id).is_ok() {
            let deadline = std::time::Instant::now() + GRACEFUL_END;
            while std::time::Instant::now() < deadline {
                if st.routes.session(id).is_none() {
                    tracing::info!(session = id, kind = session.kind.name(), label = %session.label, "session ended through the admin interface");
                    return ok(
                        json!({ "ended": id, "by": session.kind.name(), "ports_freed": session.ports.len() }),
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            tracing::warn!(session = id, "the {} proxy did not end the session within {GRACEFUL_END:?}; freeing its routes and ports", session.kind.name());
        }
    }
    match st.routes.close_session(id) {
        Ok(report) => {
            tracing::info!(session = id, kind = report.session.kind.name(), label = %report.session.label, ports = report.session.ports.len(), "session ended through the admin interface");
            let routes: Vec<Value> = report
                .routes
                .iter()
                .map(|(label, c, p, s)| json!({ "name": &**label, "channel": c.name(), "port": p, "counters": snapshot_json(&s.packets), "rtp_lost": s.rtp.lost }))
                .collect();
            ok(json!({ "ended": id, "ports_freed": report.session.ports.len(), "routes": routes }))
        }
        Err(e) => route_error(e),
    }
}

fn do_reload(reload: &Sender<ReloadRequest>) -> Answer {
    let (tx, rx): (Sender<_>, Receiver<_>) = crossbeam_channel::bounded(1);
    if reload.send(ReloadRequest { reply: tx }).is_err() {
        return err(503, "the gateway is shutting down");
    }
    match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(Ok(summary)) => ok(json!({ "reloaded": true, "summary": summary })),
        Ok(Err(reason)) => err(422, reason),
        Err(_) => err(503, "the reload did not answer within 30 s"),
    }
}
