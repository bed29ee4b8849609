//! The `stack` engine: kernel UDP sockets, one per gateway port in use, batched with
//! `recvmmsg`/`sendmmsg`.
//!
//! Every port a session holds gets a socket ([`super::ports`]). Each socket belongs to one
//! worker, chosen by port pair, which reads it through its own epoll set; any worker may send
//! on any socket. Workers learn of sockets through their command queue and eventfd, so they
//! never take a lock.
//!
//! Per wakeup a worker reads at most [`BUDGET`] batches from a socket, so one busy stream
//! cannot starve the others; level-triggered epoll brings it back for the rest.

use std::collections::HashMap;
use std::io;
use std::net::UdpSocket;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use crossbeam_channel::Receiver;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::EventFd;

use super::ports::{Cmd, PortKey, PortRegistry};
use super::sys::mmsg::{RecvBatch, SendBatch};
use super::sys::thread_cpu_ns;
use super::{pin_worker, Engine, EngineError, EngineKind, ExitFlag, Worker};
use crate::channel::{inspect, Admitted, WorkerStats};
use crate::clock::now_ms;
use crate::config::{Config, DomainId, EngineConfig};
use crate::logging::RateLimit;
use crate::routes::{Channel, PortHooks, Routes};
use crate::stats::{DropReason, Tally};

/// Batches read from one socket per wakeup before moving on to the next.
pub const BUDGET: usize = 4;
const WAKE: u64 = u64::MAX;

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
}

impl StackEngine {
    pub fn new(cfg: &Config) -> Result<StackEngine, EngineError> {
        Ok(StackEngine {
            cfg: cfg.engine.clone(),
            registry: Arc::new(super::bound_registry(cfg)?),
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

    fn start(
        &mut self,
        routes: Arc<Routes>,
        stop: Arc<AtomicBool>,
    ) -> Result<Vec<Worker>, EngineError> {
        let n = self.cfg.queues;
        let links = self
            .registry
            .attach_workers(n)
            .map_err(|source| EngineError::Io {
                what: "eventfd".into(),
                source,
            })?;
        let mut workers = Vec::with_capacity(n);
        for (index, link) in links.into_iter().enumerate() {
            let cpu = self.cfg.cpus.get(index).copied();
            let stats = Arc::new(WorkerStats::new(index, cpu));
            let ctx = WorkerCtx {
                index,
                cpu,
                routes: Arc::clone(&routes),
                stop: Arc::clone(&stop),
                stats: Arc::clone(&stats),
                cmds: link.cmds,
                wake: link.wake,
                batch: self.cfg.batch,
                max_payload: self.cfg.max_payload,
            };
            let thread = std::thread::Builder::new()
                .name(format!("vgate-w{index}"))
                .spawn(move || worker(ctx))
                .map_err(|source| EngineError::Spawn { index, source })?;
            workers.push(Worker { stats, thread });
        }
        Ok(workers)
    }
}

struct WorkerCtx {
    index: usize,
    cpu: Option<usize>,
    routes: Arc<Routes>,
    stop: Arc<AtomicBool>,
    stats: Arc<WorkerStats>,
    cmds: Receiver<Cmd>,
    wake: Arc<EventFd>,
    batch: usize,
    max_payload: usize,
}

struct LocalSocket {
    sock: Arc<UdpSocket>,
    owned: bool,
    /// Last value of the socket's cumulative SO_RXQ_OVFL counter.
    overflow_seen: u32,
}

static RECV_ERRORS: RateLimit = RateLimit::new(5000);
static SEND_ERRORS: RateLimit = RateLimit::new(5000);

fn worker(ctx: WorkerCtx) {
    let _exit = ExitFlag(&ctx.stats);
    pin_worker(&ctx.stats, ctx.cpu);
    if let Err(e) = run_worker(&ctx) {
        tracing::error!(worker = ctx.index, "worker stopped: {e}");
    }
}

fn run_worker(ctx: &WorkerCtx) -> io::Result<()> {
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
    epoll.add(ctx.wake.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, WAKE))?;
    let mut local: HashMap<Key, LocalSocket> = HashMap::new();
    let mut rx = RecvBatch::new(ctx.batch, ctx.max_payload + 1);
    let mut tx = SendBatch::new(ctx.batch);
    let mut sel: Vec<u16> = Vec::with_capacity(ctx.batch);
    let mut events = vec![EpollEvent::empty(); 64];
    let mut next_cpu_sample = 0;
    apply_commands(ctx, &epoll, &mut local);
    ctx.stats.ready.store(true, Relaxed);
    while !ctx.stop.load(Relaxed) {
        let n = match epoll.wait(&mut events, EpollTimeout::from(100u16)) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => 0,
            Err(e) => return Err(e.into()),
        };
        let now = now_ms();
        ctx.stats.heartbeat_ms.store(now, Relaxed);
        if now >= next_cpu_sample {
            ctx.stats.cpu_ns.store(thread_cpu_ns(), Relaxed);
            next_cpu_sample = now + 100;
        }
        for ev in &events[..n] {
            if ev.data() == WAKE {
                let _ = ctx.wake.read();
                apply_commands(ctx, &epoll, &mut local);
                continue;
            }
            let key = data_key(ev.data());
            drain_socket(ctx, key, &mut local, &mut rx, &mut tx, &mut sel, now);
        }
    }
    ctx.stats.cpu_ns.store(thread_cpu_ns(), Relaxed);
    Ok(())
}

fn apply_commands(ctx: &WorkerCtx, epoll: &Epoll, local: &mut HashMap<Key, LocalSocket>) {
    while let Ok(cmd) = ctx.cmds.try_recv() {
        match cmd {
            Cmd::Add { key, sock, owner } => {
                let owned = owner == ctx.index;
                if owned {
                    if let Err(e) = epoll.add(
                        sock.as_fd(),
                        EpollEvent::new(EpollFlags::EPOLLIN, key_data(key)),
                    ) {
                        tracing::error!(
                            worker = ctx.index,
                            port = key.1,
                            "cannot watch socket: {e}"
                        );
                    }
                }
                if let Some(old) = local.insert(
                    key,
                    LocalSocket {
                        sock,
                        owned,
                        overflow_seen: 0,
                    },
                ) {
                    if old.owned {
                        let _ = epoll.delete(old.sock.as_fd());
                    }
                }
            }
            Cmd::Remove { key } => {
                if let Some(old) = local.remove(&key) {
                    if old.owned {
                        let _ = epoll.delete(old.sock.as_fd());
                    }
                }
            }
        }
    }
}

/// Reads up to [`BUDGET`] batches from one socket and forwards them.
fn drain_socket(
    ctx: &WorkerCtx,
    key: Key,
    local: &mut HashMap<Key, LocalSocket>,
    rx: &mut RecvBatch,
    tx: &mut SendBatch,
    sel: &mut Vec<u16>,
    now: u64,
) {
    let channel = Channel::from_ingress(key.0);
    for _ in 0..BUDGET {
        let Some(ls) = local.get_mut(&key) else {
            return;
        };
        let n = match rx.recv(ls.sock.as_fd()) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) => {
                if let Some(suppressed) = RECV_ERRORS.check(now) {
                    tracing::warn!(port = key.1, domain = %key.0, suppressed, "receive failed: {e}");
                }
                return;
            }
        };
        let mut tally = Tally::default();
        if let Some(total) = rx.rx_overflow() {
            let lost = total.wrapping_sub(ls.overflow_seen);
            ls.overflow_seen = total;
            tally.drops[DropReason::RxOverflow as usize] += u64::from(lost);
        }
        // The batch came from one port, so it has one route: one lookup per batch.
        let Some(route) = ctx.routes.lookup(channel, key.1) else {
            tally.rx_packets = n as u64;
            tally.rx_bytes = (0..n).map(|i| rx.payload(i).len() as u64).sum();
            tally.drops[DropReason::NoRoute as usize] += n as u64;
            ctx.stats.channel(channel).add(&tally);
            if n < rx.capacity() {
                return;
            }
            continue;
        };
        sel.clear();
        for i in 0..n {
            let p = rx.payload(i);
            tally.rx_packets += 1;
            tally.rx_bytes += p.len() as u64;
            match inspect(
                &route,
                rx.source(i),
                p,
                rx.truncated(i),
                ctx.max_payload,
                now,
            ) {
                Ok(admitted) => {
                    tally.relatches += u64::from(admitted == Admitted::Relatched);
                    sel.push(i as u16);
                }
                Err(reason) => tally.drop(reason),
            }
        }
        if !sel.is_empty() {
            // Only packets that passed every check keep the route alive.
            route.touch(now);
            match local.get(&(channel.egress(), route.egress_port)) {
                Some(egress) => {
                    let out = tx.send(egress.sock.as_fd(), rx, sel, route.dest);
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
        ctx.stats.channel(channel).add(&tally);
        if n < rx.capacity() {
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
            assert_ne!(key_data(k), WAKE);
        }
    }
}
