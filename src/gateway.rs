//! The running gateway: config + route tables + engine + workers, started and stopped as one.
//!
//! `vgate run`, `vgate demo` and the integration tests all go through [`Gateway::start`], so
//! there is one start-up order: build the engine (it may refuse), create the tables with the
//! engine's port hooks, start the workers, then install the static routes.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::channel::{ChannelTotals, WorkerStats};
use crate::config::Config;
use crate::engine::{self, Engine, EngineError, EngineKind, Worker};
use crate::routes::{RouteError, Routes, SessionId};
use crate::signaling::proxy::{self, Proxy, ProxyContext, ProxyError};

/// Why the gateway did not start.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("static stream route \"{route}\" could not be installed: {source}")]
    StaticRoute { route: String, source: RouteError },
    #[error("the workers did not start receiving within {0:?}; see the errors above")]
    NotReady(Duration),
    #[error(transparent)]
    Signaling(#[from] ProxyError),
}

pub struct Gateway {
    pub config: Arc<Config>,
    pub routes: Arc<Routes>,
    proxies: Vec<Box<dyn Proxy>>,
    engine: Box<dyn Engine>,
    workers: Vec<Worker>,
    stop: Arc<AtomicBool>,
    pub static_sessions: Vec<SessionId>,
    pub started: Instant,
}

impl Gateway {
    /// Starts the engine for the config's mode (or `engine`), its workers and static routes,
    /// and waits until every worker is receiving.
    pub fn start(config: Config, engine: Option<EngineKind>) -> Result<Gateway, GatewayError> {
        let kind = engine::choose(config.engine.mode, engine)?;
        let mut eng = engine::build(&config, kind)?;
        let routes = Arc::new(Routes::new(&config, eng.port_hooks()));
        let stop = Arc::new(AtomicBool::new(false));
        let workers = eng.start(Arc::clone(&routes), Arc::clone(&stop))?;
        let mut gw = Gateway {
            config: Arc::new(config),
            routes,
            proxies: Vec::new(),
            engine: eng,
            workers,
            stop,
            static_sessions: Vec::new(),
            started: Instant::now(),
        };
        let ready_within = Duration::from_secs(5);
        if !gw.wait_ready(ready_within) {
            gw.stop_workers();
            return Err(GatewayError::NotReady(ready_within));
        }
        match gw.routes.install_static(&gw.config) {
            Ok(ids) => gw.static_sessions = ids,
            Err((route, source)) => {
                gw.stop_workers();
                return Err(GatewayError::StaticRoute { route, source });
            }
        }
        let ctx = ProxyContext {
            config: Arc::clone(&gw.config),
            routes: Arc::clone(&gw.routes),
            stop: Arc::clone(&gw.stop),
        };
        match proxy::start(&ctx) {
            Ok(p) => gw.proxies = p,
            Err(e) => {
                gw.stop_workers();
                return Err(e.into());
            }
        }
        Ok(gw)
    }

    pub fn describe(&self) -> String {
        self.engine.describe()
    }

    /// The workers' counters (shared; they stay readable after shutdown).
    pub fn worker_stats(&self) -> Vec<Arc<WorkerStats>> {
        self.workers.iter().map(|w| Arc::clone(&w.stats)).collect()
    }

    pub fn workers(&self) -> impl Iterator<Item = &WorkerStats> {
        self.workers.iter().map(|w| &*w.stats)
    }

    pub fn totals(&self) -> ChannelTotals {
        ChannelTotals::gather(self.workers())
    }

    /// Whether every worker is receiving.
    pub fn ready(&self) -> bool {
        self.workers().all(|w| w.ready.load(Relaxed))
    }

    /// Whether every worker is alive: not exited, heartbeat within `stale_ms`.
    pub fn healthy(&self, now_ms: u64, stale_ms: u64) -> bool {
        self.workers().all(|w| {
            !w.exited.load(Relaxed)
                && now_ms.saturating_sub(w.heartbeat_ms.load(Relaxed)) <= stale_ms
        })
    }

    fn wait_ready(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if self.ready() {
                return true;
            }
            if self.workers().any(|w| w.exited.load(Relaxed)) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    fn stop_workers(&mut self) {
        self.stop.store(true, Relaxed);
        // Proxies first: ending their sessions frees ports while the workers still run.
        for p in self.proxies.drain(..) {
            p.shutdown();
        }
        for w in self.workers.drain(..) {
            if w.thread.join().is_err() {
                tracing::error!(worker = w.stats.index, "worker panicked");
            }
        }
    }

    /// Stops the workers and returns the final per-worker figures.
    pub fn shutdown(mut self) -> Vec<Arc<WorkerStats>> {
        let stats: Vec<_> = self.workers.iter().map(|w| Arc::clone(&w.stats)).collect();
        self.stop_workers();
        stats
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.stop_workers();
    }
}
