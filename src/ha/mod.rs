//! Hot standby (`[ha]`): this node's role in an active/standby pair and the state it shares
//! with its peer through Redis. keepalived owns the domain addresses and moves them; it tells
//! vgate the role through its notify hooks (`vgate ha-notify`, or a role file), and asks
//! `vgate health` whether this node may hold them.
//!
//! - The role gate is [`Routes::set_standby`]: a standby holds its ports and routes and every
//!   packet it receives is dropped with `standby`; the active forwards. Demotion closes the
//!   gate at once; promotion first reads the state store one last time, then opens it.
//! - One thread ([`Ha::start`]) does all the rest, off the packet path: the active writes
//!   its replicated sessions (static routes added at run time, the stream routes of SIP/RTSP
//!   sessions with their ports and latched sources, [`record`]) to Redis in batches, every
//!   100 ms, as the difference from what the store holds; the standby reads them back as
//!   often and keeps copies installed ([`record::Replicas`]). What is pending while Redis is
//!   away is the difference itself, so it is bounded by the tables and needs no queue: when
//!   Redis is back, the next batch rewrites the whole (catch-up), counted.
//! - The SIP proxies' registrations (bindings by token) and confirmed dialogs go the same
//!   way, in the same batch: each proxy publishes its records on the routes' board
//!   ([`crate::routes::board`], from its timer tick, never per packet) and installs the ones
//!   the standby read from it (`signaling/proxy/sip/core/replica.rs`), so a token handed out
//!   by the old active routes on the new one and a BYE, INFO or MESSAGE in a dialog set up
//!   before the takeover crosses in both directions. RTSP sessions are not in the store: a
//!   copied RTSP session (or a SIP call whose dialog did not make it) keeps its media flowing
//!   after a takeover, and is ended once its routes have carried nothing for
//!   `ha.replica_idle_ms`.

mod media_rule;
pub mod record;
mod store;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};

use crate::clock::{now_ms, wall_ms};
use crate::config::ha::HaConfig;
use crate::logging::RateLimit;
use crate::routes::{Routes, SessionKind};

use crate::config::ha::StoreLoss;
use record::{Replicas, SessionRecord};
use store::{Lease, Store};

/// How often the HA thread writes (active) or reads (standby) the state store.
const TICK: Duration = Duration::from_millis(100);

/// A node's role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Role {
    /// Holds ports and routes, forwards nothing, copies the active's state.
    Standby = 0,
    /// Forwards.
    Active = 1,
    /// keepalived says this node is faulty: as a standby.
    Fault = 2,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Standby => "standby",
            Role::Active => "active",
            Role::Fault => "fault",
        }
    }

    fn from_u8(v: u8) -> Role {
        match v {
            1 => Role::Active,
            2 => Role::Fault,
            _ => Role::Standby,
        }
    }

    /// keepalived's words (`MASTER`, `BACKUP`, `FAULT`, `STOP`) or ours, any case.
    pub fn parse(s: &str) -> Option<Role> {
        match s.trim().to_ascii_uppercase().as_str() {
            "MASTER" | "ACTIVE" => Some(Role::Active),
            "BACKUP" | "STANDBY" => Some(Role::Standby),
            "FAULT" | "STOP" | "DELETED" => Some(Role::Fault),
            _ => None,
        }
    }
}

/// The HA state the admin interface, the metrics and `vgate health` read.
pub struct HaStatus {
    pub config: HaConfig,
    routes: Arc<Routes>,
    /// The role asked for (keepalived); the HA thread makes it the role in force.
    wanted: AtomicU8,
    role: AtomicU8,
    wake: Sender<()>,
    /// Whether the last state-store call worked.
    pub store_ok: AtomicBool,
    /// [`now_ms`] of the last state-store call that worked (0: none yet).
    pub store_last_ok_ms: AtomicU64,
    /// Batches written (active).
    pub store_writes: AtomicU64,
    /// State-store calls that failed (Redis away, timeout).
    pub store_errors: AtomicU64,
    /// Full rewrites after the store was away or this node became the writer.
    pub store_resyncs: AtomicU64,
    /// Batches that found the store had lost this node's writes (its generation gone:
    /// flushed, restarted empty without the connection dropping, a replica promoted early).
    pub store_lost: AtomicU64,
    /// Sessions changed here and not yet in the store (active).
    pub store_pending: AtomicU64,
    /// Standby: the writer's heartbeat age at the last read, milliseconds.
    pub lag_ms: AtomicU64,
    /// Copies of the active's sessions installed here (standby), or still held after a
    /// takeover.
    pub replicas: AtomicU64,
    /// Copies that could not be installed (a port taken here, ...).
    pub apply_errors: AtomicU64,
    /// Copied SIP/RTSP sessions ended after a takeover because they carried nothing.
    pub replicas_idle_ended: AtomicU64,
    /// Takeovers (standby → active) since start.
    pub takeovers: AtomicU64,
    /// Takeovers refused because this standby's copy of the state was stale (one per
    /// refusal, however long keepalived keeps asking).
    pub takeovers_refused: AtomicU64,
    /// The operator allowed a takeover with a stale state (`vgate ha-notify --force`), until
    /// the state store answers again.
    force: AtomicBool,
    /// Why the last takeover asked for was refused (cleared by a takeover or a demotion).
    refusal: Mutex<Option<String>>,
    /// keepalived asked for MASTER anew: the next promotion may take the lease from its
    /// holder (a takeover); a node that lost it, or retries, only takes a free one.
    steal: AtomicBool,
    /// Times this node was fenced: it was (or was asked to be) the active one and could not
    /// hold the lease (another node holds it, or the state store cannot be reached), so it
    /// forwards nothing. One per episode.
    pub fenced_total: AtomicU64,
    /// The lease epoch this node holds (0: none).
    pub lease_epoch: AtomicU64,
    /// Why this node is fenced, while it is.
    fence: Mutex<Option<String>>,
    /// The lease as the store last showed it (`EPOCH NODE`).
    lease_holder: Mutex<Option<String>>,
    /// Wall clock (ms) of the last takeover; 0: none.
    pub last_takeover_wall_ms: AtomicU64,
    /// [`now_ms`] of the last takeover; 0: none.
    last_takeover_ms: AtomicU64,
    /// When keepalived last asked for MASTER anew (the monotonic instant, and the wall
    /// clock in ms to show): where a takeover's steps are counted from.
    asked: Mutex<Option<(std::time::Instant, u64)>>,
    /// How the last takeover spent its time, from the request to the open gate.
    last_steps: Mutex<Option<TakeoverSteps>>,
    /// The writer the standby last saw, and the last state-store error.
    text: Mutex<(Option<String>, Option<String>)>,
    /// Held while the role changes ([`HaStatus::request`], the promotion's last step).
    transition: Mutex<()>,
}

impl HaStatus {
    pub fn role(&self) -> Role {
        Role::from_u8(self.role.load(Relaxed))
    }

    pub fn wanted(&self) -> Role {
        Role::from_u8(self.wanted.load(Relaxed))
    }

    /// Asks for `role` (keepalived's notify, the role file). Leaving the active role closes
    /// the gate here and now; becoming active is done by the HA thread (one last read of the
    /// state store first), woken at once.
    pub fn request(&self, role: Role) {
        // One transition at a time: a promotion half-way never reopens a gate closed here.
        let _t = self.transition.lock().unwrap_or_else(|p| p.into_inner());
        let before = self.wanted.swap(role as u8, Relaxed);
        if role != Role::Active {
            self.routes.set_standby(true);
            self.role.store(role as u8, Relaxed);
            self.set_refusal(None);
            self.set_fence(None);
            self.steal.store(false, Relaxed);
        } else if before != role as u8 {
            // A takeover: this node may take the lease from the one that holds it.
            self.steal.store(true, Relaxed);
            *self.asked.lock().unwrap_or_else(|p| p.into_inner()) =
                Some((std::time::Instant::now(), wall_ms()));
        }
        if before != role as u8 {
            tracing::info!(role = role.name(), "ha: role requested");
        }
        let _ = self.wake.try_send(());
    }

    /// The writer the standby last saw.
    pub fn peer(&self) -> Option<String> {
        self.text
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .clone()
    }

    pub fn last_store_error(&self) -> Option<String> {
        self.text
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .clone()
    }

    /// How long ago (ms) the state store last answered; `None`: never.
    pub fn store_age_ms(&self, now: u64) -> Option<u64> {
        match self.store_last_ok_ms.load(Relaxed) {
            0 => None,
            t => Some(now.saturating_sub(t)),
        }
    }

    /// Whether a takeover may happen with a stale state: `ha.takeover_when_stale`, or the
    /// operator said so (`vgate ha-notify --force`) since the store last answered.
    pub fn stale_takeover_allowed(&self) -> bool {
        self.config.takeover_when_stale || self.force.load(Relaxed)
    }

    /// The operator's override: take over even with a stale state, until the state store
    /// answers again.
    pub fn allow_stale_takeover(&self) {
        if !self.force.swap(true, Relaxed) {
            tracing::warn!("ha: takeover with a stale state allowed by the operator (--force) until the state store answers");
        }
    }

    /// Why this node's copy of the state is stale (`None`: fresh, or no state store).
    pub fn stale(&self, now: u64) -> Option<String> {
        let addr = self.config.redis?;
        let stale = self.config.stale_after_ms;
        let why = self
            .last_store_error()
            .map(|e| format!(": {e}"))
            .unwrap_or_default();
        match self.store_age_ms(now) {
            Some(a) if a <= stale => None,
            None => Some(format!(
                "standby state stale: the state store {addr} has not answered yet{why}"
            )),
            Some(a) => Some(format!(
                "standby state stale: the state store {addr} last answered {a} ms ago (ha.stale_after_ms {stale}){why}"
            )),
        }
    }

    /// Why a takeover now would be refused: a stale state, not allowed.
    pub fn takeover_refusal(&self, now: u64) -> Option<String> {
        if self.role() == Role::Active || self.stale_takeover_allowed() {
            return None;
        }
        self.stale(now).map(|s| {
            format!("{s}; refusing to take over (ha.takeover_when_stale, or vgate ha-notify --force MASTER)")
        })
    }

    /// How the last takeover spent its time (`None`: none yet).
    pub fn last_takeover_steps(&self) -> Option<TakeoverSteps> {
        *self.last_steps.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Why the last takeover asked for was refused, while it still is.
    pub fn refusal(&self) -> Option<String> {
        self.refusal
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set_refusal(&self, r: Option<String>) {
        *self.refusal.lock().unwrap_or_else(|p| p.into_inner()) = r;
    }

    /// Why this node, asked to be the active one, forwards nothing (it cannot hold the
    /// lease), while it is so.
    pub fn fenced(&self) -> Option<String> {
        self.fence.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set_fence(&self, r: Option<String>) {
        *self.fence.lock().unwrap_or_else(|p| p.into_inner()) = r;
    }

    /// The lease as the store last showed it (`EPOCH NODE`; `None`: nobody holds it, or
    /// not read yet).
    pub fn lease_holder(&self) -> Option<String> {
        self.lease_holder
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set_lease_holder(&self, h: Option<String>) {
        *self.lease_holder.lock().unwrap_or_else(|p| p.into_inner()) = h;
    }

    /// What keeps this node from being healthy (`problems`) and what an operator should know
    /// (`warnings`). A standby whose copy of the state is stale is not healthy (keepalived
    /// must not give it the addresses) unless a stale takeover is allowed, when it only
    /// warns; an active that cannot reach the store keeps forwarding and only warns (giving
    /// the addresses up would stop every stream for a store that only the next takeover
    /// needs).
    pub fn health(&self, now: u64) -> (Vec<String>, Vec<String>) {
        let (mut problems, mut warnings) = (Vec::new(), Vec::new());
        let Some(addr) = self.config.redis else {
            return (problems, warnings);
        };
        let why = self
            .last_store_error()
            .map(|e| format!(": {e}"))
            .unwrap_or_default();
        let failing = !self.store_ok.load(Relaxed) && self.store_errors.load(Relaxed) > 0;
        // Healthy all the same: keepalived keeps it MASTER and it takes the lease as soon as
        // it is free (a FAULT would give the addresses up and make it flap back and forth).
        if let Some(f) = self.fenced() {
            warnings.push(f);
        }
        if self.role() == Role::Active {
            if failing {
                warnings.push(format!(
                    "the state store {addr} is unreachable{why}; forwarding goes on, {} changed sessions wait for it",
                    self.store_pending.load(Relaxed)
                ));
            }
        } else if let Some(s) = self.stale(now) {
            if self.stale_takeover_allowed() {
                warnings.push(format!(
                    "{s}; a takeover is allowed all the same (ha.takeover_when_stale or --force): what changed since is lost"
                ));
            } else {
                problems.push(s);
            }
        }
        (problems, warnings)
    }

    fn store_result(&self, r: &Result<(), String>) {
        match r {
            Ok(()) => {
                self.store_ok.store(true, Relaxed);
                self.store_last_ok_ms.store(now_ms().max(1), Relaxed);
                // Fresh again: the operator's override has done its work.
                self.force.store(false, Relaxed);
            }
            Err(e) => {
                self.store_ok.store(false, Relaxed);
                self.store_errors.fetch_add(1, Relaxed);
                self.text.lock().unwrap_or_else(|p| p.into_inner()).1 = Some(e.clone());
            }
        }
    }
}

/// Where a takeover's time went, in milliseconds (fractions kept): what `GET /api/v1/ha`
/// shows as `last_takeover` and the failover bench reads. From keepalived's request (the
/// admin interface or the role file) to the open gate; the request itself is some time
/// after keepalived's MASTER (its notify hook's process start, `vgate ha-notify`'s).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TakeoverSteps {
    /// Wall clock (ms since the epoch) of the request.
    pub asked_unix_ms: u64,
    /// Request → the HA thread at work (its wake-up; more when a refusal or the fence made
    /// it try again).
    pub wake_ms: f64,
    /// The last read of the state store.
    pub read_ms: f64,
    /// Taking the fencing lease (one Lua call).
    pub lease_ms: f64,
    /// The read of what the old holder wrote before its lease moved here.
    pub reread_ms: f64,
    /// Request → the gate open (this node forwards).
    pub total_ms: f64,
}

/// The running HA thread.
pub struct Ha {
    pub status: Arc<HaStatus>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Ha {
    /// Starts as the standby (the gate closed) and the thread that follows the role and the
    /// state store.
    pub fn start(config: HaConfig, routes: Arc<Routes>) -> std::io::Result<Ha> {
        routes.set_standby(true);
        routes.board.enable();
        let (wake, woken) = crossbeam_channel::bounded(4);
        let status = Arc::new(HaStatus {
            config,
            routes: Arc::clone(&routes),
            wanted: AtomicU8::new(Role::Standby as u8),
            role: AtomicU8::new(Role::Standby as u8),
            wake,
            store_ok: AtomicBool::new(false),
            store_last_ok_ms: AtomicU64::new(0),
            store_writes: AtomicU64::new(0),
            store_errors: AtomicU64::new(0),
            store_resyncs: AtomicU64::new(0),
            store_lost: AtomicU64::new(0),
            store_pending: AtomicU64::new(0),
            lag_ms: AtomicU64::new(0),
            replicas: AtomicU64::new(0),
            apply_errors: AtomicU64::new(0),
            replicas_idle_ended: AtomicU64::new(0),
            takeovers: AtomicU64::new(0),
            takeovers_refused: AtomicU64::new(0),
            force: AtomicBool::new(false),
            refusal: Mutex::new(None),
            steal: AtomicBool::new(false),
            fenced_total: AtomicU64::new(0),
            lease_epoch: AtomicU64::new(0),
            fence: Mutex::new(None),
            lease_holder: Mutex::new(None),
            last_takeover_wall_ms: AtomicU64::new(0),
            last_takeover_ms: AtomicU64::new(0),
            asked: Mutex::new(None),
            last_steps: Mutex::new(None),
            text: Mutex::new((None, None)),
            transition: Mutex::new(()),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (status, stop) = (Arc::clone(&status), Arc::clone(&stop));
            std::thread::Builder::new()
                .name("vgate-ha".into())
                .spawn(move || Node::new(status, routes).run(&woken, &stop))?
        };
        Ok(Ha {
            status,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Ha {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        let _ = self.status.wake.try_send(());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The HA thread's own state.
struct Node {
    status: Arc<HaStatus>,
    routes: Arc<Routes>,
    store: Option<Store>,
    /// Active: what the store holds (key → JSON) as far as this node knows.
    written: BTreeMap<String, String>,
    /// Active: rewrite everything at the next batch.
    full: bool,
    /// Active: the generation its last whole rewrite set in the store (`meta` `gen`); a
    /// batch that finds another there rewrites the whole ([`store`]: a flushed Redis).
    gen: String,
    /// Standby: the copies installed here, and the store's `seq` they are from.
    replicas: Replicas,
    seq: Option<u64>,
    /// Active: the lease epoch held and [`now_ms`] of its last renewal.
    lease: Option<(u64, u64)>,
    /// The role file's last content.
    role_file_seen: Option<String>,
    last_heartbeat: u64,
    errors_log: RateLimit,
}

impl Node {
    fn new(status: Arc<HaStatus>, routes: Arc<Routes>) -> Node {
        let store = status
            .config
            .redis
            .map(|a| Store::new(a, &status.config.key_prefix));
        Node {
            status,
            routes,
            store,
            written: BTreeMap::new(),
            full: true,
            gen: String::new(),
            replicas: Replicas::default(),
            seq: None,
            lease: None,
            role_file_seen: None,
            last_heartbeat: 0,
            errors_log: RateLimit::new(10_000),
        }
    }

    fn run(mut self, woken: &Receiver<()>, stop: &AtomicBool) {
        // Whether this thread acts as the writer (it was active at the last look).
        let mut writer = false;
        while !stop.load(Relaxed) {
            let _ = woken.recv_timeout(TICK);
            if stop.load(Relaxed) {
                break;
            }
            self.watch_role_file();
            // The role in force is what counts: a request may have closed the gate since.
            let wanted = self.status.wanted();
            let in_force = self.status.role();
            if wanted == Role::Active && in_force != Role::Active {
                self.promote();
            } else if wanted != Role::Active && writer {
                self.demote(wanted);
            } else if wanted != in_force {
                self.status.role.store(wanted as u8, Relaxed);
            }
            writer = self.status.role() == Role::Active;
            let rejected = self.routes.board.take_rejected();
            if rejected > 0 {
                self.status.apply_errors.fetch_add(rejected, Relaxed);
            }
            if writer {
                self.write();
                self.end_idle_replicas();
            } else {
                self.read();
            }
        }
    }

    fn watch_role_file(&mut self) {
        let Some(path) = self.status.config.role_file.clone() else {
            return;
        };
        let text = read_role_file(&path);
        if text == self.role_file_seen {
            return;
        }
        self.role_file_seen = text.clone();
        match text.as_deref().map(Role::parse) {
            Some(Some(r)) => self.status.request(r),
            Some(None) => {
                tracing::warn!(file = %path.display(), "ha: the role file says neither MASTER, BACKUP nor FAULT; the role stays {}", self.status.role().name())
            }
            None => {}
        }
    }

    /// Standby → active: the last copy of the state, then the gate opens.
    fn promote(&mut self) {
        let t0 = std::time::Instant::now();
        let ms = |from: std::time::Instant, to: std::time::Instant| {
            to.saturating_duration_since(from).as_secs_f64() * 1e3
        };
        self.read();
        let t_read = std::time::Instant::now();
        if let Some(why) = self.status.takeover_refusal(now_ms()) {
            // Stays the standby (the gate closed); tried again at every tick, so it takes
            // over as soon as the state store answers (or the operator says so).
            if self.status.refusal().is_none() {
                self.status.takeovers_refused.fetch_add(1, Relaxed);
                tracing::error!("ha: asked to take over, refused: {why}");
            }
            self.status.set_refusal(Some(why));
            return;
        }
        self.status.set_refusal(None);
        let t_lease0 = std::time::Instant::now();
        if let Err(why) = self.take_lease() {
            self.fence(why);
            return;
        }
        let t_lease = std::time::Instant::now();
        if self.lease.is_some() {
            // What the old holder wrote before its lease moved here (refused after).
            self.read();
        }
        let t_reread = std::time::Instant::now();
        {
            let _t = self
                .status
                .transition
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if self.status.wanted() != Role::Active {
                // Asked back to standby while reading: stay one.
                return;
            }
            self.routes.set_standby(false);
            self.status.role.store(Role::Active as u8, Relaxed);
            self.status.set_refusal(None);
            self.status.set_fence(None);
        }
        let open = std::time::Instant::now();
        self.full = true;
        let s = &self.status;
        s.takeovers.fetch_add(1, Relaxed);
        s.last_takeover_wall_ms.store(wall_ms(), Relaxed);
        s.last_takeover_ms.store(now_ms().max(1), Relaxed);
        let (asked, asked_unix_ms) = s
            .asked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .unwrap_or((t0, wall_ms()));
        let steps = TakeoverSteps {
            asked_unix_ms,
            wake_ms: ms(asked, t0),
            read_ms: ms(t0, t_read),
            lease_ms: ms(t_lease0, t_lease),
            reread_ms: ms(t_lease, t_reread),
            total_ms: ms(asked, open),
        };
        *s.last_steps.lock().unwrap_or_else(|p| p.into_inner()) = Some(steps);
        tracing::warn!(
            replicas = self.replicas.len(),
            total_ms = format!("{:.1}", steps.total_ms),
            wake_ms = format!("{:.1}", steps.wake_ms),
            read_ms = format!("{:.1}", steps.read_ms),
            lease_ms = format!("{:.1}", steps.lease_ms),
            reread_ms = format!("{:.1}", steps.reread_ms),
            "ha: this node is the active one now: forwarding"
        );
    }

    /// Takes the fencing lease before forwarding: at a takeover ([`HaStatus::steal`]) from
    /// whoever holds it, else only a free one. `Err`: why this node must not forward. No
    /// state store: no lease (a single node, or a pair without Redis).
    fn take_lease(&mut self) -> Result<(), String> {
        let Some(store) = self.store.as_mut() else {
            return Ok(());
        };
        let c = &self.status.config;
        let steal = self.status.steal.load(Relaxed);
        let r = store.acquire(&c.node, c.lease_ms, steal);
        self.status
            .store_result(&r.as_ref().map(|_| ()).map_err(|e| e.clone()));
        match r {
            Ok(Lease::Ours(e)) => {
                self.lease = Some((e, now_ms()));
                self.full = true;
                self.status.lease_epoch.store(e, Relaxed);
                self.status.set_lease_holder(Some(format!("{e} {}", c.node)));
                self.status.steal.store(false, Relaxed);
                tracing::info!(epoch = e, takeover = steal, "ha: lease taken");
                Ok(())
            }
            Ok(Lease::Held { holder, ttl_ms }) => {
                self.status.set_lease_holder(Some(holder.clone()));
                Err(format!(
                    "fenced: the lease is held by {holder:?} for {ttl_ms} ms more, so another node is the active one; this node forwards nothing until the lease is free (tried every 100 ms)"
                ))
            }
            Err(e) if self.status.stale_takeover_allowed() => {
                tracing::warn!("ha: taking over without the lease (the state store is unreachable: {e}; allowed by ha.takeover_when_stale or --force); it is taken when the store answers");
                Ok(())
            }
            Err(e) => Err(format!(
                "fenced: cannot reach the state store {} to take the lease ({e}), so another node may be the active one; this node forwards nothing until it can (or: vgate ha-notify --force MASTER, ha.takeover_when_stale)",
                store.addr()
            )),
        }
    }

    /// Asked to be the active one and must not forward: stays (or becomes) the standby,
    /// counted once per episode; [`Node::promote`] tries again at every tick.
    fn fence(&mut self, why: String) {
        if self.status.fenced().is_none() {
            self.status.fenced_total.fetch_add(1, Relaxed);
            tracing::error!("ha: {why}");
        }
        self.status.set_fence(Some(why));
    }

    /// The active learns it no longer holds the lease (another node took it, or it ran out
    /// while the store was away with `ha.store_loss = "stop-after-lease"`): it stops
    /// forwarding now and becomes a fenced standby that reloads the holder's state.
    fn lose_lease(&mut self, why: String) {
        self.lease = None;
        self.status.lease_epoch.store(0, Relaxed);
        self.status.steal.store(false, Relaxed);
        {
            let _t = self
                .status
                .transition
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            self.routes.set_standby(true);
            self.status.role.store(Role::Standby as u8, Relaxed);
        }
        self.become_copy();
        self.fence(why);
    }

    /// No longer the writer: what this node holds becomes the copies the active's state
    /// replaces at the next read (what the new active ended goes: sessions here, the SIP
    /// proxies' bindings and dialogs at their next tick).
    fn become_copy(&mut self) {
        self.replicas = Replicas::adopt(&self.routes);
        self.seq = None;
        self.full = true;
        tracing::warn!("ha: this node is no longer the active one: forwarding stopped");
    }

    /// Active → standby or fault: the gate is closed already ([`HaStatus::request`]); the
    /// lease is given up (the peer takes it at once).
    fn demote(&mut self, to: Role) {
        self.routes.set_standby(true);
        self.status.role.store(to as u8, Relaxed);
        if let (Some((epoch, _)), Some(store)) = (self.lease.take(), self.store.as_mut()) {
            let r = store.release(&self.status.config.node, epoch);
            self.status.store_result(&r);
        }
        self.status.lease_epoch.store(0, Relaxed);
        tracing::info!(role = to.name(), "ha: demoted");
        self.become_copy();
    }

    /// Active: the difference between the tables and the store, in one atomic batch.
    fn write(&mut self) {
        if self.store.is_none() {
            return;
        }
        let now = now_ms();
        if self.lease.is_none() {
            // Took over without it (the store was away, allowed): take it now, never from
            // another holder.
            match self.take_lease() {
                Ok(()) if self.lease.is_some() => {}
                Ok(()) => {
                    self.full = true;
                    return;
                }
                Err(why) => {
                    self.lose_lease(why);
                    return;
                }
            }
        }
        let Some(store) = self.store.as_mut() else {
            return;
        };
        let lease = self
            .lease
            .map_or((0, 0), |(e, _)| (e, self.status.config.lease_ms));
        let mut snap: BTreeMap<String, String> = record::snapshot(&self.routes)
            .into_iter()
            .filter_map(|(k, (_, r))| serde_json::to_string(&r).ok().map(|j| (k, j)))
            .collect();
        // The SIP proxies' registrations and dialogs, `sip/ROUTE/KEY`.
        for (producer, recs) in self.routes.board.exported() {
            for (k, v) in recs.iter() {
                snap.insert(format!("{producer}/{k}"), v.clone());
            }
        }
        let set: Vec<(&str, &str)> = snap
            .iter()
            .filter(|(k, v)| self.full || self.written.get(*k) != Some(*v))
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let del: Vec<&str> = if self.full {
            Vec::new()
        } else {
            self.written
                .keys()
                .filter(|k| !snap.contains_key(*k))
                .map(|k| k.as_str())
                .collect()
        };
        self.status
            .store_pending
            .store((set.len() + del.len()) as u64, Relaxed);
        // Every tick: the batch renews the lease (an empty one only renews it) and reads the
        // generation back (a flushed store is seen within a tick).
        let counted =
            !set.is_empty() || !del.is_empty() || self.full || now >= self.last_heartbeat + 500;
        let wall = wall_ms();
        let node = &self.status.config.node;
        let gen = if self.full {
            format!("{node}:{wall}")
        } else {
            self.gen.clone()
        };
        let r = store.write(node, lease, &gen, self.full, &set, &del, wall);
        self.status
            .store_result(&r.as_ref().map(|_| ()).map_err(|e| e.clone()));
        match r {
            Ok((Lease::Held { holder, .. }, _)) => {
                self.status.set_lease_holder(Some(holder.clone()));
                self.lose_lease(format!(
                    "fenced: the lease was taken by {holder:?} (a newer epoch than this node's {}): another node took over, so this node stopped forwarding and reloads its state; it forwards again only once the lease is free",
                    lease.0
                ));
            }
            Ok((Lease::Ours(_), held)) => {
                if let Some(l) = self.lease.as_mut() {
                    l.1 = now;
                }
                let lost = !self.full && held.as_deref() != Some(gen.as_str());
                if !counted && !lost {
                    return;
                }
                self.last_heartbeat = now;
                if self.full {
                    self.status.store_resyncs.fetch_add(1, Relaxed);
                }
                self.status.store_writes.fetch_add(1, Relaxed);
                self.status.store_pending.store(0, Relaxed);
                let lost = !self.full && held.as_deref() != Some(gen.as_str());
                self.written = snap;
                self.full = lost;
                self.gen = gen;
                if lost {
                    // The store no longer holds what this node wrote: all of it again, at
                    // the next tick (woken now).
                    self.status.store_lost.fetch_add(1, Relaxed);
                    tracing::warn!(
                        store = %store.addr(),
                        found = held.as_deref().unwrap_or("nothing"),
                        "ha: the state store lost what this node wrote (flushed, restarted empty, or a replica promoted before it had everything; the lease went with it and this batch took it again): rewriting the whole"
                    );
                    let _ = self.status.wake.try_send(());
                }
            }
            Err(e) => {
                // The whole is rewritten once the store is back.
                self.full = true;
                let addr = store.addr();
                let lease_ms = self.status.config.lease_ms;
                let ran_out = self.lease.filter(|l| now.saturating_sub(l.1) > lease_ms);
                if let (StoreLoss::StopAfterLease, Some((epoch, _))) =
                    (self.status.config.store_loss, ran_out)
                {
                    self.lose_lease(format!(
                        "fenced: the lease (epoch {epoch}) ran out ({lease_ms} ms, ha.lease_ms) while the state store {addr} was unreachable ({e}), and ha.store_loss is \"stop-after-lease\": this node stopped forwarding, another one may have taken over"
                    ));
                } else if let Some(suppressed) = self.errors_log.check(now) {
                    tracing::warn!(store = %addr, suppressed, "ha: cannot write the state store, forwarding goes on: {e}");
                }
            }
        }
    }

    /// Standby: the store's sessions into the copies held here.
    fn read(&mut self) {
        let Some(store) = self.store.as_mut() else {
            return;
        };
        let now = now_ms();
        let r = store.read(self.seq);
        self.status
            .store_result(&r.as_ref().map(|_| ()).map_err(|e| e.clone()));
        let read = match r {
            Ok(read) => read,
            Err(e) => {
                // Read everything again once the store answers.
                self.seq = None;
                if let Some(suppressed) = self.errors_log.check(now) {
                    tracing::warn!(store = %store.addr(), suppressed, "ha: cannot read the state store: {e}");
                }
                return;
            }
        };
        if let Some(hb) = read.heartbeat_ms {
            self.status
                .lag_ms
                .store(wall_ms().saturating_sub(hb), Relaxed);
        }
        self.status.set_lease_holder(read.lease.clone());
        if read.node.is_some() {
            self.status.text.lock().unwrap_or_else(|p| p.into_inner()).0 = read.node.clone();
        }
        let Some(sessions) = read.sessions else {
            return;
        };
        let mut desired = BTreeMap::new();
        let mut boards: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for (k, v) in sessions {
            // A producer's record (`sip/ROUTE/KEY`): for that producer to read.
            if let Some((producer, key)) = board_key(&k) {
                boards
                    .entry(producer.to_string())
                    .or_default()
                    .insert(key.to_string(), v);
                continue;
            }
            match serde_json::from_str::<SessionRecord>(&v) {
                Ok(rec) => {
                    desired.insert(k, rec);
                }
                Err(e) => {
                    self.status.apply_errors.fetch_add(1, Relaxed);
                    if let Some(suppressed) = self.errors_log.check(now) {
                        tracing::warn!(key = %k, suppressed, "ha: a session in the state store is not readable, skipped: {e}");
                    }
                }
            }
        }
        self.routes.board.set_imported(
            boards
                .into_iter()
                .map(|(p, r)| (p, std::sync::Arc::new(r)))
                .collect(),
        );
        let done = self.replicas.apply(&self.routes, &desired);
        self.seq = Some(read.seq);
        self.status
            .replicas
            .store(self.replicas.len() as u64, Relaxed);
        if !done.failed.is_empty() {
            self.status
                .apply_errors
                .fetch_add(done.failed.len() as u64, Relaxed);
            // Try those again at the next read.
            self.seq = None;
            if let Some(suppressed) = self.errors_log.check(now) {
                let (key, why) = &done.failed[0];
                tracing::warn!(key = %key, failed = done.failed.len(), suppressed, "ha: could not install a copy of the active's session: {why}");
            }
        }
        if done.installed + done.removed > 0 {
            tracing::info!(
                installed = done.installed,
                removed = done.removed,
                held = self.replicas.len(),
                "ha: copies of the active's sessions updated"
            );
        }
    }

    /// Active after a takeover: copied SIP/RTSP sessions (their dialogs are not here) end
    /// when their routes have carried nothing for `ha.replica_idle_ms`.
    fn end_idle_replicas(&mut self) {
        let since = self.status.last_takeover_ms.load(Relaxed);
        if since == 0 {
            return;
        }
        let now = now_ms();
        let idle = self.status.config.replica_idle_ms;
        for s in self.routes.sessions() {
            if s.kind != SessionKind::Replica {
                continue;
            }
            let last = s
                .routes
                .iter()
                .filter_map(|(c, p)| self.routes.lookup(*c, *p))
                .filter_map(|r| r.last_seen_ms())
                .max()
                .unwrap_or(0)
                .max(since);
            if now.saturating_sub(last) > idle && self.routes.close_session(s.id).is_ok() {
                self.status.replicas_idle_ended.fetch_add(1, Relaxed);
            }
        }
        let held = self
            .routes
            .sessions()
            .iter()
            .filter(|s| s.kind == SessionKind::Replica)
            .count();
        self.status.replicas.store(held as u64, Relaxed);
    }
}

/// `sip/ROUTE/KEY` → (`sip/ROUTE`, `KEY`); a session's key (`a:20000`) has no `/`.
fn board_key(k: &str) -> Option<(&str, &str)> {
    let (kind, rest) = k.split_once('/')?;
    let (route, key) = rest.split_once('/')?;
    Some((&k[..kind.len() + 1 + route.len()], key))
}

fn read_role_file(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

#[cfg(test)]
mod tests;
