//! `vgate capture-refused`: the admin interface's side of the refusal capture
//! ([`crate::routes::capture`]) and the CLI's, which writes what it hands out to a pcap file.
//!
//! | request | does |
//! |---|---|
//! | `POST /api/v1/capture` | arm: `{"route": "forward/20000", "count": 100, "timeout_s": 60}` (`route`: `CHANNEL/PORT`, `CHANNEL:PORT`, a port, or a route's name; or `"channel"` and `"port"`) |
//! | `GET /api/v1/capture?id=N` | progress, and the packets taken since the last read (each once, at most 256 an answer, payload in base64) |
//! | `GET /api/v1/capture` | progress of the last capture, no packets |
//! | `DELETE /api/v1/capture?id=N` | stop it (what it took is still handed out) |

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::SocketAddrV4;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};

use super::admin::parse_channel;
use super::client::{Client, ClientError};
use super::ControlState;
use crate::clock::now_ms;
use crate::routes::capture::{CaptureError, CaptureStatus, CapturedPacket, Target, MAX_DRAIN};
use crate::routes::StreamRoute;
use crate::wire::pcap;

/// Default time limit of a capture.
pub const DEFAULT_TIMEOUT_S: u64 = 60;

/// An admin answer: status and JSON body.
pub type Reply = (u16, Value);

fn refuse(status: u16, why: impl std::fmt::Display) -> Reply {
    (status, json!({ "error": why.to_string() }))
}

fn capture_error(e: CaptureError) -> Reply {
    let status = match e {
        CaptureError::Busy { .. } => 409,
        CaptureError::Unknown(_) => 404,
        CaptureError::Count(_) | CaptureError::Timeout(_) => 400,
    };
    refuse(status, e)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Arm {
    route: Option<String>,
    channel: Option<String>,
    port: Option<u16>,
    count: u64,
    timeout_s: Option<u64>,
}

/// The route `spec` names (see the table above), or why none.
fn resolve(
    st: &ControlState,
    route: Option<&str>,
    channel: Option<&str>,
    port: Option<u16>,
) -> Result<std::sync::Arc<StreamRoute>, Reply> {
    let channel = match channel {
        Some(c) => Some(parse_channel(c).ok_or_else(|| {
            refuse(
                400,
                format!("channel {c:?}: use forward (a) or reverse (b)"),
            )
        })?),
        None => None,
    };
    let (channel, port, name) = match (route, port) {
        (Some(r), None) => match r.split_once(['/', ':']) {
            Some((c, p)) => match (parse_channel(c), p.parse::<u16>()) {
                (Some(c), Ok(p)) => (Some(c), Some(p), None),
                _ => return Err(refuse(400, format!("route {r:?}: write CHANNEL/PORT, e.g. forward/20000"))),
            },
            None => match r.parse::<u16>() {
                Ok(p) => (channel, Some(p), None),
                Err(_) => (channel, None, Some(r)),
            },
        },
        (None, Some(p)) => (channel, Some(p), None),
        _ => {
            return Err(refuse(
                400,
                "name the route: \"route\" (forward/20000, a port or a route's name), or \"channel\" and \"port\"",
            ))
        }
    };
    let found: Vec<_> = st
        .routes
        .routes()
        .into_iter()
        .filter(|r| {
            channel.is_none_or(|c| r.channel == c)
                && port.is_none_or(|p| r.port == p)
                && name.is_none_or(|n| *r.label == *n)
        })
        .collect();
    let what = || match (name, channel, port) {
        (Some(n), _, _) => format!("named {n:?}"),
        (None, Some(c), Some(p)) => format!("on {c}/{p}"),
        (None, _, Some(p)) => format!("on port {p}"),
        _ => String::new(),
    };
    match found.len() {
        0 => Err(refuse(
            404,
            format!(
                "no stream route {}; `vgate routes list` shows the live ones",
                what()
            ),
        )),
        1 => Ok(found.into_iter().next().expect("one")),
        _ => Err(refuse(
            400,
            format!(
                "{} stream routes {}: name one as CHANNEL/PORT ({})",
                found.len(),
                what(),
                found
                    .iter()
                    .map(|r| format!("{}/{}", r.channel, r.port))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

/// `POST /api/v1/capture`.
pub fn arm(body: &[u8], st: &ControlState) -> Reply {
    let a: Arm = match serde_json::from_slice(body) {
        Ok(a) => a,
        Err(e) => {
            return refuse(
                400,
                format!("bad body ({e}); send {{\"route\": \"forward/20000\", \"count\": 100, \"timeout_s\": 60}}"),
            )
        }
    };
    let route = match resolve(st, a.route.as_deref(), a.channel.as_deref(), a.port) {
        Ok(r) => r,
        Err(reply) => return reply,
    };
    let config = st.config();
    let dst = SocketAddrV4::new(
        st.routes.domain(route.channel.ingress()).address,
        route.port,
    );
    let target = Target {
        route: route.id,
        channel: route.channel,
        port: route.port,
        label: route.label.to_string(),
        dst,
    };
    let timeout_ms = a
        .timeout_s
        .unwrap_or(DEFAULT_TIMEOUT_S)
        .saturating_mul(1000);
    let snaplen = config.leg_max_payload().min(pcap::MAX_UDP4_PAYLOAD);
    match st
        .routes
        .capture()
        .arm(target, a.count, timeout_ms, snaplen, now_ms())
    {
        Ok(s) => {
            tracing::info!(
                route = %route.label, channel = %route.channel, port = route.port,
                count = a.count, timeout_ms, id = s.id,
                "refusal capture armed"
            );
            let mut v = status_json(&s);
            v["validated"] = json!(route.media.is_some());
            (200, v)
        }
        Err(e) => capture_error(e),
    }
}

fn query_id(url: &str) -> Option<Result<u32, Reply>> {
    let q = url.split_once('?')?.1;
    let v = q.split('&').find_map(|kv| kv.strip_prefix("id="))?;
    Some(
        v.parse()
            .map_err(|_| refuse(400, format!("id {v:?} is not a capture id"))),
    )
}

/// `GET /api/v1/capture[?id=N]`.
pub fn read(url: &str, st: &ControlState) -> Reply {
    let cap = st.routes.capture();
    match query_id(url) {
        None => match cap.status(now_ms()) {
            Some(s) => (200, status_json(&s)),
            None => (200, json!({ "state": "none" })),
        },
        Some(Err(r)) => r,
        Some(Ok(id)) => match cap.drain(id, MAX_DRAIN, now_ms()) {
            Ok((s, packets)) => {
                let mut v = status_json(&s);
                v["packets"] = packets.iter().map(packet_json).collect();
                (200, v)
            }
            Err(e) => capture_error(e),
        },
    }
}

/// `DELETE /api/v1/capture[?id=N]`.
pub fn stop(url: &str, st: &ControlState) -> Reply {
    let cap = st.routes.capture();
    let id = match query_id(url) {
        Some(Ok(id)) => id,
        Some(Err(r)) => return r,
        None => match cap.status(now_ms()) {
            Some(s) => s.id,
            None => return refuse(404, "no capture was armed"),
        },
    };
    match cap.stop(id, now_ms()) {
        Ok(s) => (200, status_json(&s)),
        Err(e) => capture_error(e),
    }
}

fn status_json(s: &CaptureStatus) -> Value {
    json!({
        "id": s.id,
        "state": s.state.name(),
        "route": {
            "name": s.target.label, "channel": s.target.channel.name(),
            "port": s.target.port, "destination": s.target.dst.to_string(),
        },
        "count": s.count, "captured": s.captured, "delivered": s.delivered,
        "overflow": s.overflow, "left_ms": s.left_ms, "snaplen": s.snaplen,
    })
}

fn packet_json(p: &CapturedPacket) -> Value {
    json!({
        "time_us": p.unix_us,
        "source": p.src.to_string(),
        "reason": p.reason.name(),
        "violation": p.violation.map(|v| v.name()),
        "orig_len": p.orig_len,
        "data": base64::engine::general_purpose::STANDARD.encode(&p.payload),
    })
}

/// What `vgate capture-refused` asks for.
#[derive(Clone, Debug)]
pub struct Request {
    /// As `POST /api/v1/capture` takes it.
    pub route: String,
    pub count: u32,
    pub timeout_s: u64,
    pub out: PathBuf,
}

/// How a capture ended, for the exit status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub captured: u32,
    pub count: u32,
    pub overflow: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum CaptureCliError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("cannot write {path}: {source}; choose a writable --out")]
    File {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("unexpected answer from vgate: {0}")]
    Garbled(String),
}

fn file_error(path: &Path) -> impl FnOnce(std::io::Error) -> CaptureCliError + '_ {
    move |source| CaptureCliError::File {
        path: path.to_owned(),
        source,
    }
}

/// Arms the capture, writes what it takes to `req.out` as it comes (a progress line on
/// stderr), until N are taken, the time limit passes or `stop` is set (Ctrl-C: the capture
/// is stopped and what it took is still written); then prints a listing of the packets with
/// their reasons on stdout and writes the same beside the file (`FILE.reasons.txt`).
pub fn run(client: &Client, req: &Request, stop: &AtomicBool) -> Result<Outcome, CaptureCliError> {
    let armed = client.post(
        "/api/v1/capture",
        &json!({ "route": req.route, "count": req.count, "timeout_s": req.timeout_s }),
    )?;
    let id = armed["id"]
        .as_u64()
        .ok_or_else(|| CaptureCliError::Garbled(armed.to_string()))?;
    let route = &armed["route"];
    let dst: SocketAddrV4 = route["destination"]
        .as_str()
        .and_then(|d| d.parse().ok())
        .ok_or_else(|| CaptureCliError::Garbled(armed.to_string()))?;
    let snaplen = armed["snaplen"].as_u64().unwrap_or(1472) as usize;
    eprintln!(
        "capture {id} armed on route {} ({}/{}){}: the next {} refused packets, for at most {} s",
        route["name"].as_str().unwrap_or(""),
        route["channel"].as_str().unwrap_or(""),
        route["port"],
        if armed["validated"] == json!(false) {
            " (not media-validated: only source and not-RTP refusals)"
        } else {
            ""
        },
        req.count,
        req.timeout_s
    );
    let mut file = std::fs::File::create(&req.out).map_err(file_error(&req.out))?;
    file.write_all(&pcap::file_header(pcap::snaplen(snaplen)))
        .map_err(file_error(&req.out))?;
    let mut listing = String::new();
    let mut n = 0u32;
    let mut stopped = false;
    let mut shown = (u64::MAX, u64::MAX);
    // The gateway disarms at its limit; this bound only saves the CLI from a gateway that
    // stopped answering progress.
    let give_up = Instant::now() + Duration::from_secs(req.timeout_s + 30);
    let last = loop {
        if stop.load(Relaxed) && !stopped {
            client.delete(&format!("/api/v1/capture?id={id}"))?;
            stopped = true;
        }
        let v = client.get(&format!("/api/v1/capture?id={id}"))?;
        let mut buf = Vec::new();
        for p in v["packets"].as_array().into_iter().flatten() {
            n += 1;
            append(&mut buf, &mut listing, n, p, dst, snaplen)?;
        }
        file.write_all(&buf).map_err(file_error(&req.out))?;
        let progress = (
            v["captured"].as_u64().unwrap_or(0),
            v["overflow"].as_u64().unwrap_or(0),
        );
        if progress != shown {
            eprintln!(
                "captured {}/{}{}",
                progress.0,
                req.count,
                if progress.1 > 0 {
                    format!(" ({} not captured: capture_overflow)", progress.1)
                } else {
                    String::new()
                }
            );
            shown = progress;
        }
        if v["state"] != "armed" || Instant::now() > give_up {
            break v;
        }
        if v["packets"].as_array().is_none_or(|p| p.len() < MAX_DRAIN) {
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    file.flush().map_err(file_error(&req.out))?;
    let side = PathBuf::from(format!("{}.reasons.txt", req.out.display()));
    let header = "#\ttime_us\tsource\tdestination\tbytes\treason\tviolation\n";
    std::fs::write(&side, format!("{header}{listing}")).map_err(file_error(&side))?;
    print!("{header}{listing}");
    let state = last["state"].as_str().unwrap_or("");
    eprintln!(
        "{n} packets written to {} (reasons in {}); capture {state}",
        req.out.display(),
        side.display()
    );
    Ok(Outcome {
        captured: n,
        count: req.count,
        overflow: last["overflow"].as_u64().unwrap_or(0),
    })
}

/// One packet of an answer into the pcap bytes and the listing.
fn append(
    buf: &mut Vec<u8>,
    listing: &mut String,
    n: u32,
    p: &Value,
    dst: SocketAddrV4,
    snaplen: usize,
) -> Result<(), CaptureCliError> {
    let garbled = || CaptureCliError::Garbled(p.to_string().chars().take(200).collect());
    let src: SocketAddrV4 = p["source"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(garbled)?;
    let data = p["data"]
        .as_str()
        .and_then(|d| base64::engine::general_purpose::STANDARD.decode(d).ok())
        .ok_or_else(garbled)?;
    let time_us = p["time_us"].as_u64().ok_or_else(garbled)?;
    let orig_len = p["orig_len"].as_u64().map_or(data.len(), |l| l as usize);
    let data = &data[..data.len().min(snaplen)];
    pcap::record(buf, time_us, src, dst, n as u16, data, orig_len);
    let reason = p["reason"].as_str().unwrap_or("");
    let violation = p["violation"].as_str().unwrap_or("-");
    let _ = writeln!(
        listing,
        "{n}\t{time_us}\t{src}\t{dst}\t{orig_len}\t{reason}\t{violation}"
    );
    Ok(())
}

/// A capture that ended: a line on what it means, and whether it got all it asked for.
pub fn summary(o: &Outcome) -> (String, bool) {
    let all = o.captured == o.count;
    let mut s = if all {
        format!("all {} refused packets captured", o.count)
    } else {
        format!(
            "{} of {} refused packets captured before the time limit or Ctrl-C",
            o.captured, o.count
        )
    };
    if o.overflow > 0 {
        let _ = write!(
            s,
            "; {} more were refused while every capture buffer waited to be read (capture_overflow)",
            o.overflow
        );
    }
    (s, all)
}
