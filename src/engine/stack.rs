//! The `stack` engine: kernel UDP sockets, one per gateway port in use, batched with
//! `recvmmsg`/`sendmmsg`.
//!
//! Every port a session holds gets a socket ([`super::ports`]). Each socket belongs to one
//! worker, chosen by port pair, which reads it through its own epoll set; any worker may send
//! on any socket. Workers learn of sockets through their command queue and eventfd, so they
//! never take a lock.
//!
//! Per wakeup a worker reads at most [`BUDGET`] batches from a socket, so one busy stream
//! cannot starve the others; level-triggered epoll brings it back for the rest. A batch
//! leaves with one `sendmmsg`, whose runs of equal-sized datagrams go as UDP GSO messages
//! (one pass through the kernel's output path per run; see [`super::sys::mmsg`]).

use std::collections::HashMap;
use std::io;
use std::net::UdpSocket;
use std::os::fd::AsFd;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use super::ports::{Cmd, PortKey, PortRegistry};
use super::sys::mmsg::{RecvBatch, SendBatch};
use super::worker::{start_workers, Datapath, Poller, Shell};
use super::{Engine, EngineError, EngineKind, Worker};
use crate::channel::{inspect_mut, Admitted};
use crate::config::split::SplitConfig;
use crate::config::{Config, DomainId, EngineConfig};
use crate::engine::link::SplitStats;
use crate::engine::link::{HalfLinks, LinkFamily, LinkTx};
use crate::logging::RateLimit;
use crate::routes::{Channel, PortHooks, Routes, StreamRoute};
use crate::stats::{DropReason, Tally};

/// Batches read from one socket per wakeup before moving on to the next.
pub const BUDGET: usize = 4;

type Key = PortKey;

fn key_data(k: Key) -> u64 {
    ((k.0.index() as u64) << 16) | u64::from(k.1)
}

fn data_key(d: u64) -> Key {
    let domain = if d >> 16 == 0 {
        DomainId::A
    } else {
        DomainId::B
    };
    (domain, d as u16)
}

/// The stack engine.
pub struct StackEngine {
    cfg: EngineConfig,
    registry: Arc<PortRegistry>,
    /// A split half: the links and their counters.
    split: Option<(SplitConfig, Arc<SplitStats>)>,
}

impl StackEngine {
    pub fn new(cfg: &Config) -> Result<StackEngine, EngineError> {
        Ok(StackEngine {
            cfg: cfg.engine.clone(),
            registry: Arc::new(super::bound_registry(cfg)?),
            split: cfg
                .split
                .as_ref()
                .map(|s| (s.clone(), Arc::new(SplitStats::new(s)))),
        })
    }
}

impl Engine for StackEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Stack
    }

    fn describe(&self) -> String {
        format!(
            "mode stack, engine stack (UDP sockets, recvmmsg/sendmmsg, batch {}), {} worker(s) on CPU(s) {:?}",
            self.cfg.batch, self.cfg.queues, self.cfg.cpus
        )
    }

    fn port_hooks(&self) -> Arc<dyn PortHooks> {
        Arc::clone(&self.registry) as Arc<dyn PortHooks>
    }

    fn ports(&self) -> Arc<PortRegistry> {
        Arc::clone(&self.registry)
    }

    fn split_stats(&self) -> Option<Arc<SplitStats>> {
        self.split.as_ref().map(|(_, s)| Arc::clone(s))
    }

    fn start(
        &mut self,
        routes: Arc<Routes>,
        stop: Arc<AtomicBool>,
    ) -> Result<Vec<Worker>, EngineError> {
        let (batch, max_payload) = (self.cfg.batch, self.cfg.max_payload);
        // A split half: the link face's egress goes down the outgoing link, one sender
        // (lane) per worker over one socket; the incoming link has its own worker.
        let mut links = match &self.split {
            Some((s, st)) => Some(HalfLinks::open(
                s,
                st,
                LinkFamily::of(EngineKind::Stack),
                self.cfg.queues,
                &routes,
            )?),
            None => None,
        };
        let workers = start_workers(
            self.cfg.queues,
            &self.cfg.cpus,
            &self.registry,
            &routes,
            &stop,
            |index| {
                let link_tx = links.as_mut().and_then(|l| l.sender(index, batch));
                move |_: &Shell| Ok(StackPath::new(batch, max_payload, link_tx))
            },
        )?;
        HalfLinks::finish(
            links.as_mut(),
            workers,
            &self.cfg.cpus,
            &routes,
            &self.registry,
            &stop,
            batch,
            max_payload,
        )
    }
}

struct LocalSocket {
    sock: Arc<UdpSocket>,
    owned: bool,
    /// Last value of the socket's cumulative SO_RXQ_OVFL counter.
    overflow_seen: u32,
    /// The route of this (ingress) port as last looked up, and its egress socket, valid
    /// while the route tables' generation is `route_gen`: a batch then costs one socket
    /// lookup, no table lookup (hash, shard lock) and no reference count. A removed route
    /// kept here (with its edge sink or link leg) is let go at the worker's next sample
    /// (every `SAMPLE_MS`) after the tables' generation moves, even on an idle port. An
    /// opened port moves the worker's own socket generation (`StackPath::sockets_gen`, kept
    /// here as `sockets_gen`), so a missing egress socket is looked for again; a closed
    /// port's socket is let go at once by the ports that keep it (its `keepers`):
    /// `close_port` waits until no worker holds it.
    route: Option<Arc<StreamRoute>>,
    egress: Option<Arc<UdpSocket>>,
    /// The port whose socket `egress` is (its entry lists this port in `keepers`).
    egress_key: Option<Key>,
    /// The ports that keep this socket as their egress: closing this port lets go of those
    /// copies without a walk of the worker's sockets.
    keepers: Vec<Key>,
    route_gen: u64,
    sockets_gen: u64,
}

impl LocalSocket {
    fn new(sock: Arc<UdpSocket>, owned: bool) -> LocalSocket {
        LocalSocket {
            sock,
            owned,
            overflow_seen: 0,
            route: None,
            egress: None,
            egress_key: None,
            keepers: Vec::new(),
            route_gen: u64::MAX,
            sockets_gen: u64::MAX,
        }
    }

    /// Drops the kept route and egress socket (the caller unlinks `egress_key`): the next
    /// batch looks them up.
    fn clear(&mut self) -> Option<Key> {
        self.route = None;
        self.egress = None;
        self.route_gen = u64::MAX;
        self.egress_key.take()
    }
}

/// Removes `holder` from the keepers of the socket of port `egress`.
fn unlink(local: &mut Sockets, holder: Key, egress: Key) {
    if let Some(e) = local.get_mut(&egress) {
        if let Some(i) = e.keepers.iter().position(|k| *k == holder) {
            e.keepers.swap_remove(i);
        }
    }
}

/// Forgets the route and egress socket kept by port `key`: its next batch looks them up.
fn forget(local: &mut Sockets, key: Key) {
    if let Some(egress) = local.get_mut(&key).and_then(LocalSocket::clear) {
        unlink(local, key, egress);
    }
}

/// Lets go of what the worker's entry `old` of port `key` (closed or replaced, already out
/// of `local`) shared: the ports that kept its socket as their egress forget it (one lookup
/// per keeper, no walk), and it leaves the keepers of its own egress.
fn release(local: &mut Sockets, key: Key, old: &LocalSocket) {
    for k in &old.keepers {
        if let Some(ls) = local.get_mut(k) {
            ls.clear();
        }
    }
    if let Some(egress) = old.egress_key {
        unlink(local, key, egress);
    }
}

/// Runs `f` on port `key`'s socket with its route (and egress socket) current: looked up
/// again if the tables or the worker's sockets (`sockets_gen`) changed since they were
/// kept. `None` when the worker no longer has the port's socket. One socket lookup when
/// nothing changed (a closure rather than a returned reference, so that the refresh may
/// look at other sockets after that lookup).
fn with_route<R>(
    local: &mut Sockets,
    sockets_gen: u64,
    routes: &Routes,
    key: Key,
    f: impl FnOnce(&mut LocalSocket) -> R,
) -> Option<R> {
    let generation = routes.generation();
    let ls = local.get_mut(&key)?;
    if ls.route_gen == generation && ls.sockets_gen == sockets_gen {
        return Some(f(ls));
    }
    let old = ls.egress_key.take();
    if let Some(old) = old {
        unlink(local, key, old);
    }
    let channel = Channel::from_ingress(key.0);
    let route = routes.lookup(channel, key.1);
    let mut egress_key = route.as_ref().map(|r| (channel.egress(), r.egress_port));
    let egress = egress_key.and_then(|k| local.get_mut(&k)).map(|e| {
        e.keepers.push(key);
        Arc::clone(&e.sock)
    });
    if egress.is_none() {
        egress_key = None;
    }
    let ls = local.get_mut(&key)?;
    ls.route = route;
    ls.egress = egress;
    ls.egress_key = egress_key;
    ls.route_gen = generation;
    ls.sockets_gen = sockets_gen;
    Some(f(ls))
}

/// The worker's sockets by (domain, port): a multiplicative hash of the 17-bit key instead of
/// SipHash (one lookup per batch, a few more when the kept route is refreshed; the keys are the
/// gateway's own ports, not chosen by peers).
#[derive(Default)]
struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u8(&mut self, v: u8) {
        self.write_u64(u64::from(v));
    }
    fn write_u16(&mut self, v: u16) {
        self.write_u64(u64::from(v));
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(17) ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type Sockets = HashMap<Key, LocalSocket, std::hash::BuildHasherDefault<KeyHasher>>;

static RECV_ERRORS: RateLimit = RateLimit::new(5000);
static SEND_ERRORS: RateLimit = RateLimit::new(5000);

/// One stack worker: the sockets it knows (those it reads, and every egress), its batches.
struct StackPath {
    local: Sockets,
    rx: RecvBatch,
    tx: SendBatch,
    sel: Vec<u16>,
    max_payload: usize,
    /// Split half: the link-face domain, whose egress goes down the outgoing link, and this
    /// worker's sender on it.
    link: Option<(DomainId, LinkTx)>,
    /// The route tables' generation when the sockets' cached routes were last checked.
    swept_gen: u64,
    /// Moves with every port opened: missing egress sockets are looked for again.
    sockets_gen: u64,
    /// Scratch list of ports (kept between samples, so no allocation once grown).
    stale: Vec<Key>,
}

impl StackPath {
    fn new(batch: usize, max_payload: usize, link: Option<(DomainId, LinkTx)>) -> StackPath {
        StackPath {
            local: Sockets::default(),
            rx: RecvBatch::new(batch, max_payload + 1),
            tx: SendBatch::new(batch),
            sel: Vec::with_capacity(batch),
            max_payload,
            link,
            swept_gen: u64::MAX,
            sockets_gen: 0,
            stale: Vec::new(),
        }
    }

    /// Lets go of every cached route older than the tables' generation (a removed route
    /// must not be kept alive by a port that receives nothing more). Walks the sockets only
    /// when the generation moved since the last call.
    fn drop_stale_routes(&mut self, routes: &Routes) {
        let generation = routes.generation();
        if generation == self.swept_gen {
            return;
        }
        self.swept_gen = generation;
        self.stale.clear();
        for (k, ls) in self.local.iter() {
            if ls.route_gen != generation && (ls.route.is_some() || ls.egress_key.is_some()) {
                self.stale.push(*k);
            }
        }
        for k in self.stale.drain(..) {
            forget(&mut self.local, k);
        }
    }
}

impl Datapath for StackPath {
    fn register(&mut self, _poller: &Poller) -> io::Result<()> {
        // Sockets come with the port commands.
        Ok(())
    }

    fn ready(&mut self, shell: &Shell, token: u64, now: u64) {
        drain_socket(shell, self, data_key(token), now);
        if let Some((_, l)) = self.link.as_mut() {
            l.idle(now);
        }
    }

    /// Before sleeping: the link's open FEC block is closed if due.
    fn idle(&mut self, _shell: &Shell) {
        if let Some((_, l)) = self.link.as_mut() {
            l.idle(crate::clock::now_ms());
        }
    }

    /// Sleeps no longer than the link's open FEC block may stay open.
    fn idle_ms(&self) -> u16 {
        match &self.link {
            Some((_, l)) => l.sleep_ms(crate::clock::now_ms(), 100),
            None => 100,
        }
    }

    /// The wakeup's link frames go out together.
    fn flush(&mut self, _shell: &Shell) {
        if let Some((_, l)) = self.link.as_mut() {
            l.flush();
        }
    }

    fn sample(&mut self, shell: &Shell) {
        self.drop_stale_routes(&shell.routes);
        // A quiet sender still closes its last FEC block.
        if let Some((_, l)) = self.link.as_mut() {
            l.idle(crate::clock::now_ms());
        }
    }

    fn command(&mut self, shell: &Shell, poller: &Poller, cmd: Cmd) {
        match cmd {
            Cmd::Add { key, sock, owner } => {
                // A port kept without its egress socket looks for it again before its next
                // batch. (A closed port needs no such move: `release` lets go of the copies.)
                self.sockets_gen = self.sockets_gen.wrapping_add(1);
                let owned = owner == shell.index;
                if owned {
                    if let Err(e) = poller.add(sock.as_fd(), key_data(key)) {
                        tracing::error!(
                            worker = shell.index,
                            port = key.1,
                            "cannot watch socket: {e}"
                        );
                    }
                }
                if let Some(old) = self.local.insert(key, LocalSocket::new(sock, owned)) {
                    if old.owned {
                        let _ = poller.delete(old.sock.as_fd());
                    }
                    release(&mut self.local, key, &old);
                }
            }
            Cmd::Remove { key } => {
                if let Some(old) = self.local.remove(&key) {
                    if old.owned {
                        let _ = poller.delete(old.sock.as_fd());
                    }
                    release(&mut self.local, key, &old);
                }
            }
        }
    }
}

/// Reads up to [`BUDGET`] batches from one socket and forwards them.
fn drain_socket(shell: &Shell, p: &mut StackPath, key: Key, now: u64) {
    let StackPath {
        local,
        rx,
        tx,
        sel,
        max_payload,
        link,
        swept_gen: _,
        sockets_gen,
        stale: _,
    } = p;
    let sockets_gen = *sockets_gen;
    let max_payload = *max_payload;
    let channel = Channel::from_ingress(key.0);
    let mut link = link
        .as_mut()
        .filter(|(face, _)| *face == channel.egress())
        .map(|(_, l)| l);
    let counters = shell.stats.channel(channel);
    let media = &mut *shell.media.borrow_mut();
    for _ in 0..BUDGET {
        // Whether the socket may hold more (a full batch came).
        let more = with_route(local, sockets_gen, &shell.routes, key, |ls| {
            let n = match rx.recv(ls.sock.as_fd()) {
                Ok(0) => return false,
                Ok(n) => n,
                Err(e) => {
                    if let Some(suppressed) = RECV_ERRORS.check(now) {
                        tracing::warn!(port = key.1, domain = %key.0, suppressed, "receive failed: {e}");
                    }
                    return false;
                }
            };
            let mut tally = Tally::default();
            if let Some(total) = rx.rx_overflow() {
                let lost = total.wrapping_sub(ls.overflow_seen);
                ls.overflow_seen = total;
                tally.drops[DropReason::RxOverflow as usize] += u64::from(lost);
            }
            // The batch came from one port, so it has one route (kept between batches while the
            // tables and the worker's sockets do not change).
            let Some(route) = ls.route.as_deref() else {
                tally.rx_packets = n as u64;
                tally.rx_bytes = (0..n).map(|i| rx.payload(i).len() as u64).sum();
                tally.drops[DropReason::NoRoute as usize] += n as u64;
                // This worker is the only writer of its own channel counters.
                counters.add_as_only_writer(&tally);
                return n == rx.capacity();
            };
            sel.clear();
            for i in 0..n {
                let (src, truncated) = (rx.source(i), rx.truncated(i));
                let p = rx.payload_mut(i);
                tally.rx_packets += 1;
                tally.rx_bytes += p.len() as u64;
                // In place: a `strip` route may have bytes cut out of the datagram.
                match inspect_mut(route, src, p, truncated, max_payload, now, media) {
                    Ok((admitted, len)) => {
                        tally.relatches += u64::from(admitted == Admitted::Relatched);
                        rx.set_len(i, len);
                        sel.push(i as u16);
                    }
                    Err(reason) => tally.drop(reason),
                }
            }
            if !sel.is_empty() {
                // Only packets that passed every check keep the route alive.
                route.touch(now);
            }
            if let (false, Some(sink)) = (sel.is_empty(), route.edge.as_deref()) {
                // The receiver is a stream leg the gateway terminates: its sink, not a socket.
                for &i in sel.iter() {
                    super::frames::offer_to_leg(sink, rx.payload(usize::from(i)), &mut tally);
                }
            } else if let (false, Some(link)) = (sel.is_empty(), link.as_deref_mut()) {
                // Split half: the far side is the peer half, down the outgoing link.
                let ts = crate::clock::wall_us();
                for &i in sel.iter() {
                    link.forward(route, rx.payload(usize::from(i)), now, ts, &mut tally);
                }
            } else if !sel.is_empty() {
                match ls.egress.as_deref() {
                    Some(egress) => {
                        let out = tx.send(egress.as_fd(), rx, sel, route.dest);
                        tally.tx_packets += out.sent as u64;
                        tally.tx_bytes += out.sent_bytes as u64;
                        tally.drops[DropReason::QueueFull as usize] += out.queue_full as u64;
                        tally.drops[DropReason::SendError as usize] += out.errors as u64;
                        if let Some(code) = out.last_error {
                            if let Some(suppressed) = SEND_ERRORS.check(now) {
                                let e = io::Error::from_raw_os_error(code);
                                tracing::warn!(route = %route.label, dest = %route.dest, suppressed, "send failed: {e}");
                            }
                        }
                    }
                    // The route's egress socket is announced before the route is installed, so
                    // this only happens if its session is being torn down right now.
                    None => tally.drops[DropReason::SendError as usize] += sel.len() as u64,
                }
            }
            route.stats.packets.add(&tally);
            counters.add_as_only_writer(&tally);
            n == rx.capacity()
        });
        if more != Some(true) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoll_keys_round_trip() {
        for k in [(DomainId::A, 0), (DomainId::B, 65535), (DomainId::B, 30001)] {
            assert_eq!(data_key(key_data(k)), k);
            assert_ne!(key_data(k), Poller::WAKE);
        }
    }

    /// The egress socket kept with a port's route follows the port commands: a closed
    /// egress port's socket is let go at once (`close_port` waits for that), and a port
    /// opened again is found before the next batch.
    #[test]
    fn a_kept_egress_socket_follows_the_port_commands() {
        use crate::config::SourcePolicy;
        use crate::routes::{NoHooks, RouteSpec, SessionKind};
        let cfg = crate::routes::tests::cfg("");
        let routes = Arc::new(Routes::new(&cfg, Arc::new(NoHooks)));
        let s = routes.open_session(SessionKind::Admin, "x");
        let a = routes.alloc_pair(s, DomainId::A).unwrap();
        let b = routes.alloc_pair(s, DomainId::B).unwrap();
        routes
            .add_route(
                s,
                RouteSpec {
                    ingress: DomainId::A,
                    port: a,
                    dest: "127.0.0.2:40000".parse().unwrap(),
                    egress_port: b,
                    policy: SourcePolicy::Any,
                    expected: None,
                    rtp_only: false,
                    label: "r".into(),
                    media: None,
                },
            )
            .unwrap();
        let shell = Shell::new(
            0,
            None,
            &routes,
            Arc::new(crate::channel::WorkerStats::new(0, None)),
        );
        let poller = Poller::new(false).unwrap();
        let mut p = StackPath::new(4, 1500, None);
        let new_sock = || Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
        let (ingress, egress) = ((DomainId::A, a), (DomainId::B, b));
        let (sa, sb) = (new_sock(), new_sock());
        for (key, s) in [(ingress, &sa), (egress, &sb)] {
            let sock = Arc::clone(s);
            p.command(
                &shell,
                &poller,
                Cmd::Add {
                    key,
                    sock,
                    owner: 0,
                },
            );
        }
        let kept = |p: &mut StackPath| {
            with_route(&mut p.local, p.sockets_gen, &routes, ingress, |ls| {
                ls.egress.clone()
            })
            .unwrap()
        };
        assert!(Arc::ptr_eq(&kept(&mut p).unwrap(), &sb));
        p.command(&shell, &poller, Cmd::Remove { key: egress });
        assert_eq!(
            Arc::strong_count(&sb),
            1,
            "the closed port's socket is let go"
        );
        assert!(kept(&mut p).is_none());
        let sb2 = new_sock();
        let sock = Arc::clone(&sb2);
        p.command(
            &shell,
            &poller,
            Cmd::Add {
                key: egress,
                sock,
                owner: 0,
            },
        );
        assert!(Arc::ptr_eq(&kept(&mut p).unwrap(), &sb2), "found again");
        assert_eq!(
            p.local[&egress].keepers,
            vec![ingress],
            "the keeper is listed"
        );

        // Closing ports nobody keeps costs no walk of the worker's sockets: 10 000 ports
        // closed against a worker with 20 000 sockets (a walk per port was ~40 µs here).
        let shared = new_sock();
        let bulk = |i: u16| {
            (
                if i.is_multiple_of(2) {
                    DomainId::A
                } else {
                    DomainId::B
                },
                40000 + i / 2,
            )
        };
        for i in 0..20_000 {
            let sock = Arc::clone(&shared);
            let cmd = Cmd::Add {
                key: bulk(i),
                sock,
                owner: 1,
            };
            p.command(&shell, &poller, cmd);
        }
        let t = std::time::Instant::now();
        for i in 0..10_000 {
            p.command(&shell, &poller, Cmd::Remove { key: bulk(i) });
        }
        eprintln!(
            "closed 10 000 of 20 002 ports in {:?} (no walk: one lookup per port)",
            t.elapsed()
        );
        assert_eq!(Arc::strong_count(&shared), 10_001);
        // The kept egress survives closes of other ports, and goes with its own.
        assert!(Arc::ptr_eq(&kept(&mut p).unwrap(), &sb2), "still kept");
        p.command(&shell, &poller, Cmd::Remove { key: egress });
        assert_eq!(Arc::strong_count(&sb2), 1, "let go");
        assert!(p.local[&ingress].egress.is_none());
        // The closed holder leaves its egress's keepers.
        let sb3 = new_sock();
        let sock = Arc::clone(&sb3);
        let cmd = Cmd::Add {
            key: egress,
            sock,
            owner: 0,
        };
        p.command(&shell, &poller, cmd);
        assert!(Arc::ptr_eq(&kept(&mut p).unwrap(), &sb3));
        p.command(&shell, &poller, Cmd::Remove { key: ingress });
        assert!(
            p.local[&egress].keepers.is_empty(),
            "the closed holder is unlisted"
        );
    }

    /// A port's cached route is let go once the tables change, without another batch on
    /// that port (a removed route must not stay alive behind an idle port).
    #[test]
    fn an_idle_port_lets_go_of_a_removed_route() {
        use crate::config::SourcePolicy;
        use crate::routes::{NoHooks, RouteSpec, SessionKind};
        let cfg = crate::routes::tests::cfg("");
        let routes = Routes::new(&cfg, Arc::new(NoHooks));
        let s = routes.open_session(SessionKind::Admin, "x");
        let a = routes.alloc_pair(s, DomainId::A).unwrap();
        let b = routes.alloc_pair(s, DomainId::B).unwrap();
        let spec = RouteSpec {
            ingress: DomainId::A,
            port: a,
            dest: "127.0.0.2:40000".parse().unwrap(),
            egress_port: b,
            policy: SourcePolicy::Latch,
            expected: None,
            rtp_only: false,
            label: "r".into(),
            media: None,
        };
        let added = routes.add_route(s, spec).unwrap();
        let weak = Arc::downgrade(&added);
        drop(added);
        let mut p = StackPath::new(4, 1500, None);
        let sock = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
        let key = (DomainId::A, a);
        p.local.insert(key, LocalSocket::new(sock, true));
        assert!(
            with_route(&mut p.local, p.sockets_gen, &routes, key, |ls| ls
                .route
                .is_some())
            .unwrap()
        );
        p.drop_stale_routes(&routes);
        assert!(p.local[&key].route.is_some(), "unchanged tables: kept");
        routes.remove_route(Channel::Forward, a).unwrap();
        routes.close_session(s).unwrap();
        p.drop_stale_routes(&routes);
        assert!(p.local[&key].route.is_none(), "let go after the change");
        assert!(weak.upgrade().is_none(), "nothing else keeps it alive");
    }
}
