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
use super::{pin_to, Engine, EngineError, EngineKind, ExitFlag, Worker};
use crate::channel::{inspect, now_ms, WorkerStats};
use crate::config::{Config, DomainId, EngineConfig};
use crate::logging::RateLimit;
use crate::routes::{Channel, PortHooks, Routes};
use crate::split::link::{self, LinkTx};
use crate::split::{SplitConfig, SplitStats};
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
    /// A split half: the links and their counters.
    split: Option<(SplitConfig, Arc<SplitStats>)>,
}

impl StackEngine {
    pub fn new(cfg: &Config) -> StackEngine {
        StackEngine {
            cfg: cfg.engine.clone(),
            registry: Arc::new(
                PortRegistry::new([cfg.domains[0].address, cfg.domains[1].address]).on_interfaces(
                    [
                        cfg.domains[0].interface.clone(),
                        cfg.domains[1].interface.clone(),
                    ],
                ),
            ),
            split: cfg
                .split
                .as_ref()
                .map(|s| (s.clone(), Arc::new(SplitStats::new(s)))),
        }
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

    fn split_stats(&self) -> Option<Arc<SplitStats>> {
        self.split.as_ref().map(|(_, s)| Arc::clone(s))
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
        let out_sock = match &self.split {
            Some((s, _)) => Some(link::open_outgoing(&s.out_link)?),
            None => None,
        };
        let in_sock = match &self.split {
            Some((s, _)) => Some(link::open_incoming(&s.in_link)?),
            None => None,
        };
        let epoch = link::new_epoch();
        let mut workers = Vec::with_capacity(n + 1);
        for (index, link) in links.into_iter().enumerate() {
            let cpu = self.cfg.cpus.get(index).copied();
            let stats = Arc::new(WorkerStats::new(index, cpu));
            let link_tx = match (&self.split, &out_sock) {
                (Some((s, st)), Some(sock)) => Some(LinkTx::new(
                    Arc::clone(sock),
                    &s.out_link,
                    index as u8,
                    epoch,
                    self.cfg.batch,
                    Arc::clone(st),
                )),
                _ => None,
            };
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
                link_face: self.split.as_ref().map(|(s, _)| s.link_face()),
                link_tx,
            };
            let thread = std::thread::Builder::new()
                .name(format!("vgate-w{index}"))
                .spawn(move || worker(ctx))
                .map_err(|source| EngineError::Spawn { index, source })?;
            workers.push(Worker { stats, thread });
        }
        if let (Some((s, st)), Some(sock)) = (&self.split, in_sock) {
            workers.push(link::spawn_receiver(link::ReceiverSetup {
                index: n,
                cpu: s.in_link.cpu.or(self.cfg.cpus.last().copied()),
                sock,
                cfg: s.clone(),
                routes: Arc::clone(&routes),
                registry: Arc::clone(&self.registry),
                stop: Arc::clone(&stop),
                stats: Arc::clone(st),
                batch: self.cfg.batch,
                max_payload: self.cfg.max_payload,
            })?);
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
    /// Split half: the link-face domain, whose egress goes down the outgoing link.
    link_face: Option<DomainId>,
    link_tx: Option<LinkTx>,
}

struct LocalSocket {
    sock: Arc<UdpSocket>,
    owned: bool,
    /// Last value of the socket's cumulative SO_RXQ_OVFL counter.
    overflow_seen: u32,
}

static RECV_ERRORS: RateLimit = RateLimit::new(5000);
static SEND_ERRORS: RateLimit = RateLimit::new(5000);

fn worker(mut ctx: WorkerCtx) {
    let mut link_tx = ctx.link_tx.take();
    let _exit = ExitFlag(&ctx.stats);
    if let Some(cpu) = ctx.cpu {
        if !pin_to(cpu) {
            tracing::warn!(
                worker = ctx.index,
                cpu,
                "could not pin worker to its CPU; running unpinned"
            );
        }
    }
    if let Err(e) = run_worker(&ctx, &mut link_tx) {
        tracing::error!(worker = ctx.index, "worker stopped: {e}");
    }
}

fn run_worker(ctx: &WorkerCtx, link_tx: &mut Option<LinkTx>) -> io::Result<()> {
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
            drain_socket(
                ctx, key, &mut local, &mut rx, &mut tx, &mut sel, link_tx, now,
            );
        }
        if let Some(l) = link_tx.as_mut() {
            l.idle(now);
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
#[allow(clippy::too_many_arguments)]
fn drain_socket(
    ctx: &WorkerCtx,
    key: Key,
    local: &mut HashMap<Key, LocalSocket>,
    rx: &mut RecvBatch,
    tx: &mut SendBatch,
    sel: &mut Vec<u16>,
    link_tx: &mut Option<LinkTx>,
    now: u64,
) {
    let channel = Channel::from_ingress(key.0);
    let to_link = ctx.link_face == Some(channel.egress());
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
            match inspect(&route, rx.source(i), p, rx.truncated(i), ctx.max_payload) {
                Ok(()) => sel.push(i as u16),
                Err(reason) => tally.drop(reason),
            }
        }
        if let (true, false, Some(link)) = (to_link, sel.is_empty(), link_tx.as_mut()) {
            // Split half: the far side is the peer half, down the outgoing link.
            let ts = link::now_us();
            for &i in sel.iter() {
                let p = rx.payload(usize::from(i));
                if link.push(route.dest.port(), route.egress_port, p, now, ts) {
                    tally.tx_packets += 1;
                    tally.tx_bytes += p.len() as u64;
                } else {
                    tally.drop(DropReason::Oversize);
                }
            }
            link.flush();
        } else if !sel.is_empty() {
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
        route.touch(now);
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
