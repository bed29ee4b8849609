//! The running gateway: config + route tables + engine + workers, started and stopped as one.
//!
//! `vgate run`, `vgate demo` and the integration tests all go through [`Gateway::start`], so
//! there is one start-up order: build the engine (it may refuse), create the tables with the
//! engine's port hooks, start the workers, then install the static routes.

pub mod split_signal;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::channel::{ChannelTotals, WorkerStats};
use crate::config::{Config, SignalingRoute};
use crate::edge::EdgeLegs;
use crate::engine::{self, Engine, EngineError, EngineKind, Worker};
use crate::routes::legs::Legs;
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
    SplitSignal(#[from] crate::signaling::split::SignalError),
    #[error("[ha] with mode xdp: the in-kernel fast path does not know the standby role yet; use mode zc, tnapi or stack")]
    HaXdp,
    #[error("cannot start the ha thread: {0}")]
    Ha(std::io::Error),
}

/// What [`Gateway::reload_streams`] did, to report or undo.
struct StreamChange {
    installed: Vec<(String, SessionId)>,
    removed: Vec<crate::config::StaticStream>,
    unchanged: usize,
}

/// Which proxies a reload replaces and starts ([`Gateway::plan_proxies`]).
struct ProxyPlan {
    replace: Vec<Box<dyn Proxy>>,
    fresh: Vec<SignalingRoute>,
    successors: Vec<SignalingRoute>,
}

/// What [`Gateway::replace_proxies`] did.
struct ProxyChange {
    started: usize,
    stopped: usize,
    restarted: usize,
    ended: usize,
}

pub struct Gateway {
    pub config: Arc<Config>,
    pub routes: Arc<Routes>,
    /// The stream legs the proxies start, over the engine's ports.
    legs: Arc<dyn Legs>,
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
    split_signal: Option<crate::signaling::split::Agent>,
    /// Hot standby (`[ha]` configs only): the role and the state store's thread.
    ha: Option<crate::ha::Ha>,
}

impl Gateway {
    /// Starts the engine for the config's mode (or `engine`), its workers and static routes,
    /// and waits until every worker is receiving.
    pub fn start(config: Config, engine: Option<EngineKind>) -> Result<Gateway, GatewayError> {
        let mut kind = engine::choose(config.engine.mode, engine)?;
        if config.split.is_some() {
            let half = engine::for_split_half(kind, engine.is_some())?;
            if half != kind {
                tracing::info!(
                    engine = half.name(),
                    "split half: the PF_RING engines have no link datapath; running mode {} on {}",
                    config.engine.mode,
                    half.name()
                );
            }
            kind = half;
        }
        if config.ha.is_some() && kind == EngineKind::Xdp {
            return Err(GatewayError::HaXdp);
        }
        say_where_media_is_validated(&config);
        let mut eng = engine::build(&config, kind)?;
        let routes = Arc::new(Routes::new(&config, eng.port_hooks()));
        let stop = Arc::new(AtomicBool::new(false));
        let workers = eng.start(Arc::clone(&routes), Arc::clone(&stop))?;
        let legs: Arc<dyn Legs> = Arc::new(EdgeLegs::new(Arc::clone(&routes), Some(eng.ports())));
        let mut gw = Gateway {
            config: Arc::new(config),
            routes,
            legs,
            proxies: Vec::new(),
            signaling_stats: Arc::new(SignalingRegistry::default()),
            engine: eng,
            workers,
            stop,
            static_sessions: HashMap::new(),
            started: Instant::now(),
            split_signal: None,
            ha: None,
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
            legs: Arc::clone(&gw.legs),
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
        match crate::gateway::split_signal::start(&gw.config, &gw.proxies, Arc::clone(&gw.routes)) {
            Ok(a) => gw.split_signal = a,
            Err(e) => {
                gw.stop_workers();
                return Err(e.into());
            }
        }
        if let Some(h) = &gw.config.ha {
            match crate::ha::Ha::start(h.clone(), Arc::clone(&gw.routes)) {
                Ok(ha) => gw.ha = Some(ha),
                Err(e) => {
                    gw.stop_workers();
                    return Err(GatewayError::Ha(e));
                }
            }
        }
        Ok(gw)
    }

    /// Applies a new, already validated config without restarting workers, all or nothing:
    /// static stream routes that changed are replaced, removed ones end, new ones start;
    /// signaling routes that changed (or all of them, when `[security]` changed: the proxies
    /// apply it) get a new proxy; untouched routes and their streams are left alone. Changes
    /// to the domains, the engine or the management address need a restart: then nothing is
    /// changed and the error says so. If anything fails half-way — a stream route's port, a
    /// proxy that cannot bind — everything done so far is undone, the previous routes and
    /// proxies run again, and the error gives the reason. The live calls and sessions of a
    /// replaced signaling route are ended (SIP: BYE to both sides; RTSP: both connections
    /// closed) and counted in the summary (or the error, if the reload failed after that).
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
        if old.ha != new.ha {
            restart.push("ha");
        }
        if !restart.is_empty() {
            return Err(format!(
                "{} changed: restart vgate to apply that; the running configuration was kept",
                restart.join(", ")
            ));
        }
        let new = Arc::new(new);
        // New proxies on free ports first (nothing running is touched if one fails), then
        // the stream routes, then the proxies that replace running ones.
        let mut plan = self.plan_proxies(&old, &new);
        let fresh = match proxy::start_routes(&self.proxy_ctx(&new), &plan.fresh) {
            Ok(p) => p,
            Err(e) => {
                self.proxies.append(&mut plan.replace);
                return Err(format!("{e}; the running configuration was kept"));
            }
        };
        let streams = match self.reload_streams(&old, &new) {
            Ok(s) => s,
            Err(reason) => {
                for p in fresh {
                    p.shutdown();
                }
                self.proxies.append(&mut plan.replace);
                return Err(reason);
            }
        };
        let proxies = match self.replace_proxies(&old, &new, plan, fresh) {
            Ok(p) => p,
            Err(reason) => {
                self.undo_streams(streams);
                return Err(format!("{reason}; the stream routes were restored"));
            }
        };
        self.routes
            .set_relatch_after_ms(new.security.relatch_after_ms);
        self.config = new;
        // The peer half's agent listens for what our proxies serve now.
        if let Some(agent) = &self.split_signal {
            let (udp, tcp) = crate::gateway::split_signal::announced(&self.config, &self.proxies);
            agent.announce(udp, tcp);
        }
        Ok(format!(
            "stream routes: {} added or changed, {} removed or replaced, {} unchanged; signaling proxies: {} started, {} stopped, {} restarted ({} live calls/sessions ended on replaced routes)",
            streams.installed.len(),
            streams.removed.len(),
            streams.unchanged,
            proxies.started,
            proxies.stopped,
            proxies.restarted,
            proxies.ended,
        ))
    }

    /// Replaces the static stream routes that differ between `old` and `new`; on a failure
    /// the previous ones are back and the error says why.
    fn reload_streams(&mut self, old: &Config, new: &Config) -> Result<StreamChange, String> {
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
        let mut change = StreamChange {
            installed: Vec::new(),
            removed,
            unchanged,
        };
        for s in &added {
            match self.routes.install_stream(s) {
                Ok(id) => {
                    self.static_sessions.insert(s.name.clone(), id);
                    change.installed.push((s.name.clone(), id));
                }
                Err(e) => {
                    self.undo_streams(change);
                    return Err(format!(
                        "stream route \"{}\": {e}; the running configuration was kept",
                        s.name
                    ));
                }
            }
        }
        Ok(change)
    }

    /// Undoes [`Gateway::reload_streams`]: the new routes go, the previous ones come back.
    fn undo_streams(&mut self, change: StreamChange) {
        for (name, id) in change.installed {
            self.static_sessions.remove(&name);
            let _ = self.routes.close_session(id);
        }
        for s in &change.removed {
            match self.routes.install_stream(s) {
                Ok(id) => {
                    self.static_sessions.insert(s.name.clone(), id);
                }
                Err(e) => {
                    tracing::error!(route = %s.name, "could not restore the previous route: {e}")
                }
            }
        }
    }

    fn proxy_ctx(&self, config: &Arc<Config>) -> ProxyContext {
        ProxyContext {
            config: Arc::clone(config),
            routes: Arc::clone(&self.routes),
            legs: Arc::clone(&self.legs),
            stop: Arc::clone(&self.stop),
            stats: Arc::clone(&self.signaling_stats),
        }
    }

    /// Which proxies a reload replaces (route changed or gone, or the group of SIP routes
    /// sharing its sockets is not the same any more; all of them when `[security]` changed,
    /// so they apply it), and which new proxies can start beside the running ones (`fresh`:
    /// no name or socket shared with a replaced one) or only after the replaced ones stop
    /// (`successors`). A group moves as a whole. The replaced proxies leave `self.proxies`.
    fn plan_proxies(&mut self, old: &Config, new: &Config) -> ProxyPlan {
        let security_changed = old.security != new.security;
        let units = proxy::units(&new.signaling);
        let (keep, replace): (Vec<_>, Vec<_>) = self
            .proxies
            .drain(..)
            .partition(|p| !security_changed && units.iter().any(|u| u.as_slice() == p.routes()));
        self.proxies = keep;
        let wanted: Vec<Vec<SignalingRoute>> = units
            .into_iter()
            .filter(|u| !self.proxies.iter().any(|p| p.routes() == u.as_slice()))
            .collect();
        let clashes = |r: &SignalingRoute| {
            replace.iter().flat_map(|p| p.routes()).any(|o| {
                o.name == r.name
                    || proxy::sockets(o)
                        .iter()
                        .any(|k| proxy::sockets(r).contains(k))
            })
        };
        let (successors, fresh): (Vec<_>, Vec<_>) =
            wanted.into_iter().partition(|u| u.iter().any(&clashes));
        ProxyPlan {
            replace,
            fresh: fresh.into_iter().flatten().collect(),
            successors: successors.into_iter().flatten().collect(),
        }
    }

    /// Stops the replaced proxies (their live calls end, counted) and starts their
    /// successors. On a failure every new proxy (`fresh` too) stops and the replaced routes
    /// start again with the old config.
    fn replace_proxies(
        &mut self,
        old: &Arc<Config>,
        new: &Arc<Config>,
        plan: ProxyPlan,
        fresh: Vec<Box<dyn Proxy>>,
    ) -> Result<ProxyChange, String> {
        let replaced: Vec<SignalingRoute> = plan
            .replace
            .iter()
            .flat_map(|p| p.routes())
            .cloned()
            .collect();
        let ended: usize = replaced
            .iter()
            .map(|r| self.live_sessions_of(r).len())
            .sum();
        self.end_rtsp_sessions_of(&replaced);
        for p in plan.replace {
            p.shutdown();
        }
        match proxy::start_routes(&self.proxy_ctx(new), &plan.successors) {
            Ok(successors) => {
                let routes_of = |v: &[Box<dyn Proxy>]| v.iter().map(|p| p.routes().len()).sum();
                let restarted: usize = routes_of(&successors);
                let change = ProxyChange {
                    started: routes_of(&fresh),
                    stopped: replaced.len().saturating_sub(restarted),
                    restarted,
                    ended,
                };
                self.proxies.extend(fresh);
                self.proxies.extend(successors);
                Ok(change)
            }
            Err(e) => {
                for p in fresh {
                    p.shutdown();
                }
                let back = match proxy::start_routes(&self.proxy_ctx(old), &replaced) {
                    Ok(p) => {
                        self.proxies.extend(p);
                        "the previous signaling routes run again".to_string()
                    }
                    Err(e2) => format!(
                        "the previous signaling routes could not all be restarted either: {e2}"
                    ),
                };
                Err(format!(
                    "{e}; {back}; {ended} live calls/sessions on the replaced routes had been ended"
                ))
            }
        }
    }

    /// Live SIP calls or RTSP sessions of signaling route `r` (their sessions' labels start
    /// with the kind and the route name).
    fn live_sessions_of(&self, r: &SignalingRoute) -> Vec<SessionId> {
        let prefix = match r.kind {
            crate::config::SignalingKind::Sip => format!("sip:{}:", r.name),
            crate::config::SignalingKind::Rtsp => format!("rtsp:{}:", r.name),
        };
        self.routes
            .sessions()
            .iter()
            .filter(|s| s.label.starts_with(&prefix))
            .map(|s| s.id)
            .collect()
    }

    /// Ends the live RTSP sessions of `routes` as an operator kill does — TEARDOWN upstream,
    /// both connections closed — and waits (bounded) for them to go, so a replaced RTSP
    /// route never just drops its sessions. (A SIP proxy sends BYE both ways when it stops.)
    fn end_rtsp_sessions_of(&self, routes: &[SignalingRoute]) {
        let ids: Vec<SessionId> = routes
            .iter()
            .filter(|r| r.kind == crate::config::SignalingKind::Rtsp)
            .flat_map(|r| self.live_sessions_of(r))
            .collect();
        for id in &ids {
            let _ = self.routes.request_end(*id);
        }
        // The connections look at their timers every 500 ms; one TEARDOWN round trip more.
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline && ids.iter().any(|id| self.routes.session(*id).is_some()) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The hot-standby state (`None` without `[ha]`).
    pub fn ha_status(&self) -> Option<Arc<crate::ha::HaStatus>> {
        self.ha.as_ref().map(|h| Arc::clone(&h.status))
    }

    /// The split signaling agent's counters (`None` on a single host).
    pub fn split_signal_stats(&self) -> Option<Arc<crate::signaling::split::SignalStats>> {
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

    /// The engine's neighbour resolver (table and counters), if it runs one.
    pub fn neigh_table(&self) -> Option<Arc<crate::engine::neigh::NeighTable>> {
        self.engine.neigh_table()
    }

    /// Mode xdp: the fast path's egress interfaces (on it or not, and why).
    pub fn xdp_status(&self) -> Option<Arc<crate::engine::xdp::XdpStatus>> {
        self.engine.xdp_status()
    }

    /// A split half's link counters; `None` on a single host.
    pub fn split_stats(&self) -> Option<Arc<crate::engine::link::SplitStats>> {
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
        // No more state-store writes of sessions the proxies are about to end.
        self.ha = None;
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

/// Says once at start what media validation covers: its default for signaled sessions, the
/// static routes that validate, and, in mode xdp, that those routes stay off the fast path.
fn say_where_media_is_validated(config: &Config) {
    let validated = config.streams.iter().filter(|s| s.media.is_some()).count();
    let signaled = config
        .signaling
        .iter()
        .filter(|r| r.media_validate != crate::config::MediaMode::Off)
        .count();
    tracing::info!(
        default = %config.media.validate,
        signaling_routes = signaled,
        static_routes = validated,
        "media validation: signaled sessions' RTP and static routes that name their codec are checked packet by packet"
    );
    let strip = config.media.validate == crate::config::MediaMode::Strip
        || config
            .signaling
            .iter()
            .any(|r| r.media_validate == crate::config::MediaMode::Strip)
        || config
            .streams
            .iter()
            .any(|s| s.media.is_some_and(|m| m.policy.strip));
    if strip {
        tracing::info!(
            mode = ?config.engine.mode,
            "media validation \"strip\": the engine cuts PS padding/private streams and SEI user data out of packets in its own buffers (stack: recvmmsg buffers; tnapi: the ring block; zc and xdp: the UMEM frame; PF_RING: its batch arena) before they are sent or put on a split link; TCP media legs act as \"enforce\" (their de-framed packets are not rewritten)"
        );
    }
    if config.engine.mode == crate::config::Mode::Xdp && (validated > 0 || signaled > 0) {
        tracing::info!(
            "mode xdp: routes that validate their media stay on the AF_XDP path (the in-kernel fast path checks headers and the source only, not the media); routes with validate = \"off\" may take the fast path"
        );
    }
}
