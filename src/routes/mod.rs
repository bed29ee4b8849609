//! Route tables, port allocation and sessions: the shared state between the control side
//! (config, signaling proxies, admin) and the data path (workers).
//!
//! - The **signaling table** is static: the config's signaling routes.
//! - The **stream tables** are dynamic, one per one-way channel ([`Channel::Forward`] A→B,
//!   [`Channel::Reverse`] B→A), keyed by the gateway port the media arrives on, as in the
//!   published model. Workers read them lock-free per shard (`dashmap`); only the control side
//!   writes.
//! - A **port allocator** per domain hands out media ports; **sessions** own ports and routes
//!   and give them all back when closed, so nothing leaks whatever the signaling does.
//!
//! This module does no I/O. Whoever needs to act when a port is taken or given back (the
//! stack engine binds a socket) implements [`PortHooks`].

pub mod alloc;
pub mod board;
pub mod capture;
pub mod legs;
pub mod spec_record;
pub mod stream;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use dashmap::DashMap;

use crate::config::{Config, Domain, DomainId, SignalingRoute, SourcePolicy, StaticStream};
use crate::stats::rtp::RtpSnapshot;
use crate::stats::Histogram;
pub use alloc::{AllocError, PortAllocator};
pub use stream::{
    Channel, RouteSnapshot, RouteSpec, RouteStats, SessionId, SourceCheck, StreamRoute,
    DEFAULT_RELATCH_AFTER_MS,
};

/// Called when a gateway port is taken or given back, before any route uses it and after the
/// last one stopped using it.
pub trait PortHooks: Send + Sync {
    /// Make the port usable (the stack engine binds its socket). An error refuses the port.
    fn open_port(&self, domain: DomainId, port: u16) -> std::io::Result<()>;
    fn close_port(&self, domain: DomainId, port: u16);
    /// `route` was installed (it is in the table already). Engines
    /// that filter before user space (the XDP program of `afxdp`) start letting the port's
    /// media through. Called with the tables' lock held: keep it short. An error refuses
    /// the route: it is taken out of the table again and the caller gets
    /// [`RouteError::Install`] (rather than a route whose media the engine drops).
    fn route_added(&self, _route: &Arc<StreamRoute>) -> std::io::Result<()> {
        Ok(())
    }
    /// The route was removed from the table (its channel and port are free again).
    fn route_removed(&self, _route: &StreamRoute) {}
}

/// Hooks that do nothing: for pure tests and tools.
pub struct NoHooks;

impl PortHooks for NoHooks {
    fn open_port(&self, _: DomainId, _: u16) -> std::io::Result<()> {
        Ok(())
    }
    fn close_port(&self, _: DomainId, _: u16) {}
}

/// Why a route or session operation was refused.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error("domain {domain}: {source}")]
    Ports {
        domain: DomainId,
        source: AllocError,
    },
    #[error("port {port} of domain {domain} could not be opened: {source}; is another program using it?")]
    PortOpen {
        domain: DomainId,
        port: u16,
        source: std::io::Error,
    },
    #[error("no session {0}; it may have ended already")]
    NoSession(SessionId),
    #[error("port {port} of domain {domain} does not belong to session {session}; allocate or reserve it for the session first")]
    NotOwned {
        domain: DomainId,
        port: u16,
        session: SessionId,
    },
    #[error(
        "the {channel} channel already has a route on port {port} (\"{label}\"); remove it first"
    )]
    Exists {
        channel: Channel,
        port: u16,
        label: String,
    },
    #[error("the {channel} channel has no route on port {port}")]
    NoRoute { channel: Channel, port: u16 },
    #[error(
        "destination {dest} is not in domain {domain}; a route must cross to the other domain"
    )]
    WrongDomain {
        dest: std::net::SocketAddrV4,
        domain: DomainId,
    },
    #[error("source validation is strict but no expected source was given; give one or use latch")]
    StrictWithoutSource,
    #[error("the engine could not install the {channel} route on port {port}: {source}")]
    Install {
        channel: Channel,
        port: u16,
        source: std::io::Error,
    },
}

/// What owns a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SessionKind {
    /// A stream route from the config file.
    Static,
    Sip,
    Rtsp,
    /// Added through the admin interface.
    Admin,
    /// A copy of another node's SIP or RTSP session, taken from the state store by a
    /// hot-standby node ([`crate::ha`]): its routes and ports, without the dialog.
    Replica,
    /// `vgate demo`'s own streams.
    Demo,
}

impl SessionKind {
    pub fn name(self) -> &'static str {
        match self {
            SessionKind::Static => "static",
            SessionKind::Sip => "sip",
            SessionKind::Rtsp => "rtsp",
            SessionKind::Admin => "admin",
            SessionKind::Replica => "replica",
            SessionKind::Demo => "demo",
        }
    }
}

/// A session's ports and routes.
#[derive(Clone, Debug)]
pub struct Session {
    pub id: SessionId,
    pub kind: SessionKind,
    pub label: String,
    pub created: SystemTime,
    pub ports: Vec<(DomainId, u16)>,
    pub routes: Vec<(Channel, u16)>,
}

/// What a closed session leaves behind: its routes' final counters.
#[derive(Clone, Debug)]
pub struct SessionReport {
    pub session: Session,
    pub routes: Vec<(Arc<str>, Channel, u16, RouteSnapshot)>,
}

struct Inner {
    alloc: [PortAllocator; 2],
    sessions: HashMap<SessionId, Session>,
    /// Sessions an operator asked to end, for their owner (a proxy) to end properly.
    ending: std::collections::HashSet<SessionId>,
    next_session: SessionId,
}

/// The gateway's route state. Cheap to share (`Arc<Routes>`).
pub struct Routes {
    tables: [DashMap<u16, Arc<StreamRoute>>; 2],
    /// Bumped after every change to the stream tables: a worker that keeps the route of a
    /// socket between batches ([`Routes::generation`]) looks it up again when this moved.
    generation: AtomicU64,
    signaling: Vec<SignalingRoute>,
    domains: [Domain; 2],
    inner: Mutex<Inner>,
    hooks: Arc<dyn PortHooks>,
    /// RTP counters of the routes already removed, per channel, so the metrics' totals
    /// never go back when a route ends.
    ended_rtp: Mutex<[RtpSnapshot; 2]>,
    /// The highest lost count reported per channel: a late packet filling a gap lowers a
    /// route's `lost`, but a Prometheus counter must never go down.
    lost_reported: [std::sync::atomic::AtomicU64; 2],
    /// `security.relatch_after_ms` for routes added from now on (a reload changes it).
    relatch_after_ms: AtomicU64,
    /// Time from a SIP ([0]) or RTSP ([1]) session's route installation to its first admitted
    /// packet; counted by [`Routes::count_first_packets`] and on the route's removal.
    first_packet: [Histogram; 2],
    /// The live stream legs ([`crate::edge`]), for listings and metrics.
    pub legs: legs::LegTable,
    /// The hot-standby gate every route shares: set while this node is a standby.
    standby: Arc<std::sync::atomic::AtomicBool>,
    /// Media validation violations per channel, over every route that ever was.
    media: Arc<crate::stats::media::MediaTotals>,
    /// The refusal capture every validator of the data path feeds ([`capture`]).
    capture: Arc<capture::RefusalCapture>,
    /// The hot standby's records of the SIP proxies (registrations, dialogs).
    pub board: board::Board,
}

/// The session kinds whose routes' first packet is timed, in [`Routes::first_packet`] order.
pub const FIRST_PACKET_KINDS: [SessionKind; 2] = [SessionKind::Sip, SessionKind::Rtsp];

impl Routes {
    pub fn new(cfg: &Config, hooks: Arc<dyn PortHooks>) -> Routes {
        Routes {
            tables: [DashMap::new(), DashMap::new()],
            generation: AtomicU64::new(0),
            signaling: cfg.signaling.clone(),
            domains: cfg.domains.clone(),
            inner: Mutex::new(Inner {
                alloc: [
                    PortAllocator::new(cfg.domains[0].media_ports),
                    PortAllocator::new(cfg.domains[1].media_ports),
                ],
                sessions: HashMap::new(),
                ending: std::collections::HashSet::new(),
                next_session: 1,
            }),
            hooks,
            ended_rtp: Mutex::new([RtpSnapshot::default(); 2]),
            lost_reported: Default::default(),
            relatch_after_ms: AtomicU64::new(cfg.security.relatch_after_ms),
            first_packet: Default::default(),
            legs: Default::default(),
            standby: Arc::new(std::sync::atomic::AtomicBool::new(cfg.ha.is_some())),
            media: Default::default(),
            capture: Default::default(),
            board: Default::default(),
        }
    }

    /// The media validation totals per channel: every validator of the data path counts
    /// into these (see [`crate::channel::Validators`]).
    pub fn media_totals(&self) -> &Arc<crate::stats::media::MediaTotals> {
        &self.media
    }

    /// The refusal capture (`vgate capture-refused`): armed by the admin interface, fed by
    /// every validator of the data path ([`crate::channel::Validators::for_routes`]).
    pub fn capture(&self) -> &Arc<capture::RefusalCapture> {
        &self.capture
    }

    /// Makes this node a standby (`true`: every route drops with `standby`) or the active
    /// one. A gateway with `[ha]` starts as a standby; without it, always active.
    pub fn set_standby(&self, standby: bool) {
        self.standby.store(standby, Ordering::Relaxed);
    }

    /// Whether this node is a standby.
    pub fn is_standby(&self) -> bool {
        self.standby.load(Ordering::Relaxed)
    }

    /// Counts the time to the first packet of `route` if it has one not yet counted.
    fn count_first_packet(&self, route: &StreamRoute) {
        if let Some(d) = route.take_first_packet() {
            let i = match route.timed_kind() {
                Some(SessionKind::Rtsp) => 1,
                _ => 0,
            };
            self.first_packet[i].observe(d);
        }
    }

    /// Counts the first packets that arrived on live routes since the last call (the metrics
    /// call it before reading [`Routes::first_packet_histogram`]); not for the data path.
    pub fn count_first_packets(&self) {
        for t in &self.tables {
            for r in t.iter() {
                self.count_first_packet(r.value());
            }
        }
    }

    /// The time-to-first-packet histogram of the routes of `kind` (see
    /// [`FIRST_PACKET_KINDS`]), `None` for other kinds.
    pub fn first_packet_histogram(&self, kind: SessionKind) -> Option<&Histogram> {
        FIRST_PACKET_KINDS
            .iter()
            .position(|k| *k == kind)
            .map(|i| &self.first_packet[i])
    }

    /// Keeps the RTP counters of a route being removed.
    fn retire(&self, route: &StreamRoute) {
        self.count_first_packet(route);
        let mut ended = self.ended_rtp.lock().unwrap_or_else(|p| p.into_inner());
        ended[route.channel.index()].add(&route.stats.rtp.snapshot());
    }

    /// RTP counters per channel (by [`Channel::index`]) of every route there ever was:
    /// the live ones and those removed since start; `lost` never goes down between calls.
    pub fn rtp_totals(&self) -> [RtpSnapshot; 2] {
        // Routes leave the tables and are retired under the session lock: hold it so no
        // route is in neither place while we add up.
        let _inner = self.lock();
        let mut t = *self.ended_rtp.lock().unwrap_or_else(|p| p.into_inner());
        for c in Channel::ALL {
            for r in self.tables[c.index()].iter() {
                t[c.index()].add(&r.stats.rtp.snapshot());
            }
            let hw = &self.lost_reported[c.index()];
            let lost = &mut t[c.index()].lost;
            *lost = hw
                .fetch_max(*lost, std::sync::atomic::Ordering::Relaxed)
                .max(*lost);
        }
        t
    }

    /// Sets the re-latch silence of routes added from now on (`security.relatch_after_ms`).
    pub fn set_relatch_after_ms(&self, ms: u64) {
        self.relatch_after_ms.store(ms, Ordering::Relaxed);
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data that is still consistent enough
        // to free ports; keep serving rather than poison the whole gateway.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The static signaling table.
    pub fn signaling(&self) -> &[SignalingRoute] {
        &self.signaling
    }

    pub fn domain(&self, id: DomainId) -> &Domain {
        &self.domains[id.index()]
    }

    /// Looks a route up by channel and gateway port (the data path's call).
    #[inline]
    pub fn lookup(&self, channel: Channel, port: u16) -> Option<Arc<StreamRoute>> {
        self.tables[channel.index()]
            .get(&port)
            .map(|r| Arc::clone(r.value()))
    }

    /// Changes with every route added or removed (never goes back). A data path may keep the
    /// result of [`Routes::lookup`] for as long as this has not moved: a route removed is then
    /// not used for a batch that starts after `remove_route` or `close_session` returned, as
    /// with a lookup per batch.
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn changed(&self) {
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// The stream table of one channel, for engines that look up per packet without
    /// taking a reference count.
    pub fn table(&self, channel: Channel) -> &DashMap<u16, Arc<StreamRoute>> {
        &self.tables[channel.index()]
    }

    pub fn open_session(&self, kind: SessionKind, label: impl Into<String>) -> SessionId {
        let mut inner = self.lock();
        let id = inner.next_session;
        inner.next_session += 1;
        inner.sessions.insert(
            id,
            Session {
                id,
                kind,
                label: label.into(),
                created: SystemTime::now(),
                ports: Vec::new(),
                routes: Vec::new(),
            },
        );
        id
    }

    /// Allocates an RTP/RTCP pair in `domain` for `session`; returns the even (RTP) port.
    pub fn alloc_pair(&self, session: SessionId, domain: DomainId) -> Result<u16, RouteError> {
        let mut inner = self.lock();
        let inner = &mut *inner;
        let s = inner
            .sessions
            .get_mut(&session)
            .ok_or(RouteError::NoSession(session))?;
        let hooks = &self.hooks;
        let port = inner.alloc[domain.index()]
            .alloc_pair_where(|p| match hooks.open_port(domain, p) {
                Ok(()) => match hooks.open_port(domain, p + 1) {
                    Ok(()) => true,
                    Err(_) => {
                        hooks.close_port(domain, p);
                        false
                    }
                },
                Err(_) => false,
            })
            .map_err(|source| RouteError::Ports { domain, source })?;
        s.ports.push((domain, port));
        s.ports.push((domain, port + 1));
        Ok(port)
    }

    /// Allocates any single port in `domain` for `session`.
    pub fn alloc_port(&self, session: SessionId, domain: DomainId) -> Result<u16, RouteError> {
        let mut inner = self.lock();
        let inner = &mut *inner;
        let s = inner
            .sessions
            .get_mut(&session)
            .ok_or(RouteError::NoSession(session))?;
        let alloc = &mut inner.alloc[domain.index()];
        let port = alloc
            .alloc_one()
            .map_err(|source| RouteError::Ports { domain, source })?;
        if let Err(source) = self.hooks.open_port(domain, port) {
            alloc.release(port);
            return Err(RouteError::PortOpen {
                domain,
                port,
                source,
            });
        }
        s.ports.push((domain, port));
        Ok(port)
    }

    /// Reserves one given port in `domain` for `session` (static routes).
    pub fn reserve_port(
        &self,
        session: SessionId,
        domain: DomainId,
        port: u16,
    ) -> Result<(), RouteError> {
        let mut inner = self.lock();
        let inner = &mut *inner;
        let s = inner
            .sessions
            .get_mut(&session)
            .ok_or(RouteError::NoSession(session))?;
        let alloc = &mut inner.alloc[domain.index()];
        alloc
            .reserve(port)
            .map_err(|source| RouteError::Ports { domain, source })?;
        if let Err(source) = self.hooks.open_port(domain, port) {
            alloc.release(port);
            return Err(RouteError::PortOpen {
                domain,
                port,
                source,
            });
        }
        s.ports.push((domain, port));
        Ok(())
    }

    /// Installs a route. Both its ports must belong to `session`.
    pub fn add_route(
        &self,
        session: SessionId,
        spec: RouteSpec,
    ) -> Result<Arc<StreamRoute>, RouteError> {
        self.add_edge_route(session, spec, None)
    }

    /// Installs a route whose receiver may be a stream leg (`edge`: its sink, see
    /// [`crate::edge`]). Both its ports must belong to `session`.
    pub fn add_edge_route(
        &self,
        session: SessionId,
        spec: RouteSpec,
        edge: Option<Arc<crate::sink::EdgeSink>>,
    ) -> Result<Arc<StreamRoute>, RouteError> {
        let far = spec.ingress.other();
        if !self.domains[far.index()].contains(*spec.dest.ip()) {
            return Err(RouteError::WrongDomain {
                dest: spec.dest,
                domain: far,
            });
        }
        if spec.policy == SourcePolicy::Strict && spec.expected.is_none() {
            return Err(RouteError::StrictWithoutSource);
        }
        let mut inner = self.lock();
        let s = inner
            .sessions
            .get_mut(&session)
            .ok_or(RouteError::NoSession(session))?;
        for (domain, port) in [(spec.ingress, spec.port), (far, spec.egress_port)] {
            if !s.ports.contains(&(domain, port)) {
                return Err(RouteError::NotOwned {
                    domain,
                    port,
                    session,
                });
            }
        }
        let channel = Channel::from_ingress(spec.ingress);
        let table = &self.tables[channel.index()];
        if let Some(old) = table.get(&spec.port) {
            return Err(RouteError::Exists {
                channel,
                port: spec.port,
                label: old.label.to_string(),
            });
        }
        let mut route = StreamRoute::new(spec, session)
            .with_relatch_after(self.relatch_after_ms.load(Ordering::Relaxed))
            .with_edge(edge)
            .with_standby_gate(Arc::clone(&self.standby));
        if FIRST_PACKET_KINDS.contains(&s.kind) {
            route = route.with_first_packet_timing(s.kind);
        }
        let route = Arc::new(route);
        table.insert(route.port, Arc::clone(&route));
        self.changed();
        if let Err(source) = self.hooks.route_added(&route) {
            table.remove(&route.port);
            self.changed();
            tracing::error!(session, route = %route.label, channel = %channel, port = route.port, "route refused: {source}");
            return Err(RouteError::Install {
                channel,
                port: route.port,
                source,
            });
        }
        s.routes.push((channel, route.port));
        tracing::info!(
            session,
            kind = s.kind.name(),
            route = %route.label,
            channel = %channel,
            port = route.port,
            dest = %route.dest,
            egress_port = route.egress_port,
            policy = %route.policy,
            "route started"
        );
        Ok(route)
    }

    /// Removes one route; its ports stay with the session. Forwarding stops at once: the
    /// next packet on that port finds no route.
    pub fn remove_route(
        &self,
        channel: Channel,
        port: u16,
    ) -> Result<Arc<StreamRoute>, RouteError> {
        let mut inner = self.lock();
        let (_, route) = self.tables[channel.index()]
            .remove(&port)
            .ok_or(RouteError::NoRoute { channel, port })?;
        self.changed();
        self.hooks.route_removed(&route);
        self.retire(&route);
        if let Some(s) = inner.sessions.get_mut(&route.session) {
            s.routes.retain(|r| *r != (channel, port));
        }
        Ok(route)
    }

    /// Gives one of `session`'s ports back before the session ends (one track of an RTSP
    /// session torn down by itself). Remove the routes on it first.
    pub fn release_port(
        &self,
        session: SessionId,
        domain: DomainId,
        port: u16,
    ) -> Result<(), RouteError> {
        let mut inner = self.lock();
        let inner = &mut *inner;
        let s = inner
            .sessions
            .get_mut(&session)
            .ok_or(RouteError::NoSession(session))?;
        let Some(i) = s.ports.iter().position(|p| *p == (domain, port)) else {
            return Err(RouteError::NotOwned {
                domain,
                port,
                session,
            });
        };
        s.ports.swap_remove(i);
        if inner.alloc[domain.index()].release(port) {
            self.hooks.close_port(domain, port);
        }
        Ok(())
    }

    /// Ends a session: removes its routes, gives its ports back.
    pub fn close_session(&self, id: SessionId) -> Result<SessionReport, RouteError> {
        let mut inner = self.lock();
        let session = inner
            .sessions
            .remove(&id)
            .ok_or(RouteError::NoSession(id))?;
        inner.ending.remove(&id);
        let mut routes = Vec::new();
        for &(channel, port) in &session.routes {
            if let Some((_, r)) = self.tables[channel.index()].remove(&port) {
                self.changed();
                self.hooks.route_removed(&r);
                self.retire(&r);
                routes.push((Arc::clone(&r.label), channel, port, r.stats.snapshot()));
            }
        }
        for &(domain, port) in &session.ports {
            if inner.alloc[domain.index()].release(port) {
                self.hooks.close_port(domain, port);
            }
        }
        let ports: Vec<String> = session
            .ports
            .iter()
            .map(|(d, p)| format!("{d}:{p}"))
            .collect();
        let counters: Vec<String> = routes
            .iter()
            .map(|(label, c, p, s)| {
                format!(
                    "{label}({c}:{p} {} rtp_lost={})",
                    s.packets.kv(),
                    s.rtp.lost
                )
            })
            .collect();
        tracing::info!(
            session = id,
            kind = session.kind.name(),
            label = %session.label,
            ports = %ports.join(","),
            "session ended: {}",
            if counters.is_empty() { "no routes".to_string() } else { counters.join("; ") }
        );
        Ok(SessionReport { session, routes })
    }

    /// Asks the owner of a signaling session (a proxy) to end it its own way: BYE to both
    /// sides of a SIP call, TEARDOWN upstream for RTSP. Proxies look on their timer tick;
    /// [`close_session`](Self::close_session) clears the request.
    pub fn request_end(&self, id: SessionId) -> Result<(), RouteError> {
        let mut inner = self.lock();
        if !inner.sessions.contains_key(&id) {
            return Err(RouteError::NoSession(id));
        }
        inner.ending.insert(id);
        Ok(())
    }

    /// Whether an operator asked to end `id`.
    pub fn end_requested(&self, id: SessionId) -> bool {
        self.lock().ending.contains(&id)
    }

    pub fn session(&self, id: SessionId) -> Option<Session> {
        self.lock().sessions.get(&id).cloned()
    }

    pub fn sessions(&self) -> Vec<Session> {
        let mut v: Vec<_> = self.lock().sessions.values().cloned().collect();
        v.sort_by_key(|s| s.id);
        v
    }

    /// Every live route, forward channel first, by port.
    pub fn routes(&self) -> Vec<Arc<StreamRoute>> {
        let mut v = Vec::new();
        for c in Channel::ALL {
            let mut t: Vec<_> = self.tables[c.index()]
                .iter()
                .map(|r| Arc::clone(r.value()))
                .collect();
            t.sort_by_key(|r| r.port);
            v.extend(t);
        }
        v
    }

    /// (used, free) media ports of a domain.
    pub fn ports(&self, domain: DomainId) -> (usize, usize) {
        let inner = self.lock();
        let a = &inner.alloc[domain.index()];
        (a.used(), a.free())
    }

    /// Installs the config's static stream routes, one session each. On failure the routes
    /// installed so far are removed again and the failing route is named.
    pub fn install_static(&self, cfg: &Config) -> Result<Vec<SessionId>, (String, RouteError)> {
        let mut ids = Vec::new();
        for s in &cfg.streams {
            match self.install_stream(s) {
                Ok(id) => ids.push(id),
                Err(e) => {
                    for id in ids {
                        let _ = self.close_session(id);
                    }
                    return Err((s.name.clone(), e));
                }
            }
        }
        Ok(ids)
    }

    /// Installs one static stream route as a session of its own.
    pub fn install_stream(&self, s: &StaticStream) -> Result<SessionId, RouteError> {
        let id = self.open_session(SessionKind::Static, s.name.clone());
        let res = (|| {
            self.reserve_port(id, s.domain, s.port)?;
            let far = s.domain.other();
            let egress_port = match s.egress_port {
                Some(p) => {
                    self.reserve_port(id, far, p)?;
                    p
                }
                None => self.alloc_port(id, far)?,
            };
            self.add_route(
                id,
                RouteSpec {
                    ingress: s.domain,
                    port: s.port,
                    dest: s.destination,
                    egress_port,
                    policy: s.policy,
                    expected: s.expect_source,
                    rtp_only: s.rtp_only,
                    label: s.name.clone(),
                    media: s.media,
                },
            )
        })();
        match res {
            Ok(_) => Ok(id),
            Err(e) => {
                let _ = self.close_session(id);
                Err(e)
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
