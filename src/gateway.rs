//! The running gateway: config + route tables + engine + workers, started and stopped as one.
//!
//! `vgate run`, `vgate demo` and the integration tests all go through [`Gateway::start`], so
//! there is one start-up order: build the engine (it may refuse), create the tables with the
//! engine's port hooks, start the workers, then install the static routes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::channel::{ChannelTotals, WorkerStats};
use crate::config::Config;
use crate::engine::{self, Engine, EngineError, EngineKind, Worker};
use crate::routes::{RouteError, Routes, SessionId};
use crate::signaling::proxy::{self, Proxy, ProxyContext, ProxyError, SignalingRegistry};

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
    #[error(transparent)]
    SplitSignal(#[from] crate::split::signal::SignalError),
}

pub struct Gateway {
    pub config: Arc<Config>,
    pub routes: Arc<Routes>,
    proxies: Vec<Box<dyn Proxy>>,
    /// Counters of the signaling routes, shared with the metrics.
    pub signaling_stats: Arc<SignalingRegistry>,
    engine: Box<dyn Engine>,
    workers: Vec<Worker>,
    stop: Arc<AtomicBool>,
    /// Session of each static stream route, by route name.
    pub static_sessions: HashMap<String, SessionId>,
    pub started: Instant,
    /// The split signaling agent (`[split]` configs only).
    split_signal: Option<crate::split::signal::Agent>,
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
            signaling_stats: Arc::new(SignalingRegistry::default()),
            engine: eng,
            workers,
            stop,
            static_sessions: HashMap::new(),
            started: Instant::now(),
            split_signal: None,
        };
        let ready_within = Duration::from_secs(5);
        if !gw.wait_ready(ready_within) {
            gw.stop_workers();
            return Err(GatewayError::NotReady(ready_within));
        }
        match gw.routes.install_static(&gw.config) {
            Ok(ids) => {
                gw.static_sessions = gw
                    .config
                    .streams
                    .iter()
                    .map(|s| s.name.clone())
                    .zip(ids)
                    .collect()
            }
            Err((route, source)) => {
                gw.stop_workers();
                return Err(GatewayError::StaticRoute { route, source });
            }
        }
        let ctx = ProxyContext {
            config: Arc::clone(&gw.config),
            routes: Arc::clone(&gw.routes),
            stop: Arc::clone(&gw.stop),
            stats: Arc::clone(&gw.signaling_stats),
        };
        match proxy::start(&ctx) {
            Ok(p) => gw.proxies = p,
            Err(e) => {
                gw.stop_workers();
                return Err(e.into());
            }
        }
        match crate::split::signal::gateway::start(&gw.config, &gw.proxies, Arc::clone(&gw.routes))
        {
            Ok(a) => gw.split_signal = a,
            Err(e) => {
                gw.stop_workers();
                return Err(e.into());
            }
        }
        Ok(gw)
    }

    /// Applies a new, already validated config without restarting workers: static stream
    /// routes that changed are replaced, removed ones end, new ones start; signaling routes
    /// that changed get a new proxy; untouched routes and their streams are left alone.
    /// Changes to the domains, the engine or the management address need a restart: then
    /// nothing is changed and the error says so. On a failure half-way the previous routes are
    /// put back.
    pub fn reload(&mut self, new: Config) -> Result<String, String> {
        let old = Arc::clone(&self.config);
        let mut restart = Vec::new();
        if old.domains != new.domains {
            restart.push("domains");
        }
        if old.engine != new.engine {
            restart.push("engine");
        }
        if old.control.listen != new.control.listen {
            restart.push("control.listen");
        }
        if old.split != new.split {
            restart.push("split");
        }
        if !restart.is_empty() {
            return Err(format!(
                "{} changed: restart vgate to apply that; the running configuration was kept",
                restart.join(", ")
            ));
        }
        let old_streams: HashMap<&str, &crate::config::StaticStream> =
            old.streams.iter().map(|s| (s.name.as_str(), s)).collect();
        let new_streams: HashMap<&str, &crate::config::StaticStream> =
            new.streams.iter().map(|s| (s.name.as_str(), s)).collect();
        let removed: Vec<crate::config::StaticStream> = old
            .streams
            .iter()
            .filter(|s| new_streams.get(s.name.as_str()) != Some(s))
            .cloned()
            .collect();
        let added: Vec<crate::config::StaticStream> = new
            .streams
            .iter()
            .filter(|s| old_streams.get(s.name.as_str()) != Some(s))
            .cloned()
            .collect();
        let unchanged = new_streams.len() - added.len();
        drop((old_streams, new_streams));
        for s in &removed {
            if let Some(id) = self.static_sessions.remove(&s.name) {
                let _ = self.routes.close_session(id);
            }
        }
        let mut installed = Vec::new();
        for s in &added {
            match self.routes.install_stream(s) {
                Ok(id) => installed.push((s.name.clone(), id)),
                Err(e) => {
                    for (_, id) in installed {
                        let _ = self.routes.close_session(id);
                    }
                    for s in &removed {
                        match self.routes.install_stream(s) {
                            Ok(id) => {
                                self.static_sessions.insert(s.name.clone(), id);
                            }
                            Err(e) => {
                                tracing::error!(route = %s.name, "could not restore the previous route: {e}")
                            }
                        }
                    }
                    return Err(format!(
                        "stream route \"{}\": {e}; the running configuration was kept",
                        s.name
                    ));
                }
            }
        }
        self.static_sessions.extend(installed);

        let (keep, stop): (Vec<_>, Vec<_>) = self
            .proxies
            .drain(..)
            .partition(|p| new.signaling.contains(p.route()));
        let stopped = stop.len();
        for p in stop {
            p.shutdown();
        }
        self.proxies = keep;
        let new = Arc::new(new);
        let missing: Vec<_> = new
            .signaling
            .iter()
            .filter(|r| !self.proxies.iter().any(|p| p.route() == *r))
            .cloned()
            .collect();
        let ctx = ProxyContext {
            config: Arc::clone(&new),
            routes: Arc::clone(&self.routes),
            stop: Arc::clone(&self.stop),
            stats: Arc::clone(&self.signaling_stats),
        };
        let started = match proxy::start_routes(&ctx, &missing) {
            Ok(p) => {
                let n = p.len();
                self.proxies.extend(p);
                n
            }
            Err(e) => {
                tracing::error!("{e}");
                0
            }
        };
        self.config = new;
        if let Some(agent) = &self.split_signal {
            let (udp, tcp) = crate::split::signal::gateway::announced(&self.config, &self.proxies);
            agent.announce(udp, tcp);
        }
        Ok(format!(
            "stream routes: {} added or changed, {} removed or replaced, {} unchanged; signaling proxies: {} started, {} stopped",
            added.len(),
            removed.len(),
            unchanged,
            started,
            stopped
        ))
    }

    /// The split signaling agent's counters (`None` on a single host).
    pub fn split_signal_stats(&self) -> Option<Arc<crate::split::signal::SignalStats>> {
        self.split_signal.as_ref().map(|a| Arc::clone(&a.stats))
    }

    pub fn describe(&self) -> String {
        match &self.config.split {
            Some(s) => format!(
                "split half {}: out link {} -> {} (fec {}), in link {} <- {} (fec {}); {}",
                s.half,
                s.out_link.interface,
                s.out_link.peer,
                s.out_link
                    .fec
                    .map(|f| f.to_string())
                    .unwrap_or_else(|| "off".into()),
                s.in_link.interface,
                s.in_link.peer,
                s.in_link
                    .fec
                    .map(|f| f.to_string())
                    .unwrap_or_else(|| "off".into()),
                self.engine.describe()
            ),
            None => self.engine.describe(),
        }
    }

    /// A split half's link counters; `None` on a single host.
    pub fn split_stats(&self) -> Option<Arc<crate::split::SplitStats>> {
        self.engine.split_stats()
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
        // Then the split agent: it says goodbye, so the peer ends its side at once.
        self.split_signal = None;
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
