//! Watching and steering a running gateway: the admin interface (HTTP on the management
//! address: Prometheus metrics, JSON listings, static routes, sessions, reload), the live
//! statistics line and the shutdown totals, and systemd readiness/watchdog.
//!
//! Everything here is control path: it may allocate and lock, but it never touches a packet.

pub mod admin;
pub mod capture;
pub mod client;
pub mod live;
pub mod metrics;
pub mod process;
pub mod systemd;
pub mod table;

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use crate::channel::{ChannelTotals, WorkerStats};
use crate::config::Config;
use crate::routes::Routes;

/// A heartbeat older than this means the worker is stuck.
pub const STALE_MS: u64 = 2000;

/// What the control side reads.
#[derive(Clone)]
pub struct ControlState {
    /// The running config; replaced by a reload.
    pub config: Arc<RwLock<Arc<Config>>>,
    pub routes: Arc<Routes>,
    pub workers: Vec<Arc<WorkerStats>>,
    pub started: Instant,
    /// One line on the engine in use, for `stats`.
    pub engine: String,
    /// Counters of the signaling routes.
    pub signaling: Arc<crate::signaling::proxy::SignalingRegistry>,
    /// The split signaling agent's counters (a half of a split appliance only).
    pub split_signal: Option<Arc<crate::signaling::split::SignalStats>>,
    /// A split half's link counters; `None` on a single host.
    pub split: Option<Arc<crate::engine::link::SplitStats>>,
    /// The engine's neighbour resolver (modes tnapi with packet-socket transmit, zc, xdp).
    pub neigh: Option<Arc<crate::engine::neigh::NeighTable>>,
    /// Mode xdp: the fast path's egress interfaces (on it or not, and why).
    pub xdp: Option<Arc<crate::engine::xdp::XdpStatus>>,
    /// Outcomes of config reloads.
    pub reloads: Arc<ReloadStats>,
    /// Hot standby (`[ha]`): role and state store; `None` without it.
    pub ha: Option<Arc<crate::ha::HaStatus>>,
}

/// Config reloads so far and whether the last one was applied (for the alert on a rejected
/// reload, like Prometheus's own `..._config_last_reload_successful`).
#[derive(Debug)]
pub struct ReloadStats {
    pub applied: std::sync::atomic::AtomicU64,
    pub rejected: std::sync::atomic::AtomicU64,
    pub last_ok: AtomicBool,
}

impl Default for ReloadStats {
    fn default() -> ReloadStats {
        ReloadStats {
            applied: Default::default(),
            rejected: Default::default(),
            last_ok: AtomicBool::new(true),
        }
    }
}

impl ReloadStats {
    pub fn record(&self, ok: bool) {
        let n = if ok { &self.applied } else { &self.rejected };
        n.fetch_add(1, Relaxed);
        self.last_ok.store(ok, Relaxed);
    }
}

impl ControlState {
    pub fn config(&self) -> Arc<Config> {
        Arc::clone(&self.config.read().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn set_config(&self, c: Arc<Config>) {
        *self.config.write().unwrap_or_else(|p| p.into_inner()) = c;
    }

    pub fn totals(&self) -> ChannelTotals {
        ChannelTotals::gather(self.workers.iter().map(|w| &**w))
    }

    /// What keeps this gateway from being healthy, and what an operator should know:
    /// every worker alive and receiving with a fresh heartbeat, and (`[ha]`) a standby's
    /// copy of the state fresh (`vgate health`, keepalived's `track_script`).
    pub fn health(&self, now_ms: u64) -> (Vec<String>, Vec<String>) {
        let mut problems = Vec::new();
        for w in &self.workers {
            let age = now_ms.saturating_sub(w.heartbeat_ms.load(Relaxed));
            if w.exited.load(Relaxed) {
                problems.push(format!("worker {} has stopped", w.index));
            } else if !w.ready.load(Relaxed) {
                problems.push(format!("worker {} is not receiving", w.index));
            } else if age > STALE_MS {
                problems.push(format!(
                    "worker {} is stuck: no heartbeat for {age} ms",
                    w.index
                ));
            }
        }
        let mut warnings = Vec::new();
        // Mode xdp: an egress off the fast path forwards (by AF_XDP), more slowly.
        if let Some(x) = &self.xdp {
            warnings.extend(x.warnings());
        }
        if let Some(h) = &self.ha {
            let (p, w) = h.health(now_ms);
            problems.extend(p);
            warnings.extend(w);
        }
        (problems, warnings)
    }

    /// Every worker alive with a fresh heartbeat.
    pub fn healthy(&self, now_ms: u64) -> bool {
        self.workers.iter().all(|w| {
            w.ready.load(Relaxed)
                && !w.exited.load(Relaxed)
                && now_ms.saturating_sub(w.heartbeat_ms.load(Relaxed)) <= STALE_MS
        })
    }
}
