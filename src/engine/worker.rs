//! The one worker skeleton every engine plugs into.
//!
//! An engine says only how its worker receives and forwards: a [`Datapath`] per worker. The
//! skeleton ([`start_workers`], [`spawn`]) does the rest, the same way for every engine:
//!
//! - the thread (`vgate-w<index>`), pinned to the configured CPU (a refusal is said once);
//! - the readiness set ([`Poller`]: epoll, or `poll(2)` for a datapath that asks,
//!   [`Datapath::sleep_in_poll`]), with the port registry's wake-up eventfd in it;
//! - the port commands ([`Cmd`]): drained before the worker says it is ready, after every
//!   wake-up that the registry's eventfd (written after each command) or the idle timeout
//!   caused, and between busy rounds (one queue check, no lock);
//! - the heartbeat and the thread's CPU time every [`SAMPLE_MS`], with the datapath's own
//!   kernel counters ([`Datapath::sample`]), and once more at exit;
//! - `ready` once receiving, `exited` however the thread leaves (return or panic), and the
//!   shared stop flag, checked every round.
//!
//! The loop: [`Datapath::poll`] takes what is waiting without sleeping (rings: a bounded
//! number of blocks or descriptors); while it finds work the worker polls again. When it finds
//! none, the worker sleeps in `epoll_wait` (at most [`Datapath::idle_ms`]) and hands each
//! readable descriptor to [`Datapath::ready`] (sockets: read a bounded number of batches).
//! A ring engine implements `poll`, a socket engine `ready`; both bound the work per call so
//! that commands, samples and the stop flag are looked at often. After each wakeup's work
//! (a busy `poll`, or one `epoll_wait`'s `ready` calls) the worker calls
//! [`Datapath::flush`] once: what a datapath batches across descriptors goes out then. A
//! datapath may ask to keep polling for a few microseconds after work before it sleeps
//! ([`Datapath::spin_us`]): the rest of a burst is then taken without another wake-up.
//! Right before it sleeps the worker calls [`Datapath::idle`]: what a datapath holds back
//! until it has nothing else to do (AF_XDP's transmit kick) goes out then.

use std::cell::RefCell;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};

use super::ports::{Cmd, PortRegistry, WorkerLink};
use super::sys::{poll_fds, thread_cpu_ns};
use super::{pin_worker, EngineError, ExitFlag, Worker};
use crate::channel::{Validators, WorkerStats, WORKER_SLOTS};
use crate::clock::now_ms;
use crate::routes::Routes;

/// Heartbeat, CPU time and kernel counters are sampled this often (milliseconds).
pub const SAMPLE_MS: u64 = 100;
/// Readiness events taken per `epoll_wait`.
const EVENTS: usize = 64;

/// What a datapath knows of the worker it runs in.
pub struct Shell {
    pub index: usize,
    /// The CPU the worker is pinned to, when the config names one.
    pub cpu: Option<usize>,
    pub routes: Arc<Routes>,
    pub stats: Arc<WorkerStats>,
    /// The media validator's per-stream state of the streams this worker receives
    /// ([`crate::channel::inspect`] checks every packet of a route with a media rule with it):
    /// held by the worker alone, borrowed once per batch, so every engine validates the same
    /// way and none can forget to.
    pub media: RefCell<Validators>,
}

impl Shell {
    pub fn new(
        index: usize,
        cpu: Option<usize>,
        routes: &Arc<Routes>,
        stats: Arc<WorkerStats>,
    ) -> Shell {
        Shell {
            index,
            cpu,
            media: RefCell::new(Validators::for_routes(WORKER_SLOTS, routes)),
            routes: Arc::clone(routes),
            stats,
        }
    }
}

/// The worker's readiness set: an epoll set, or (for a datapath that asks,
/// [`Datapath::sleep_in_poll`]) a `poll(2)` list. Tokens are the datapath's own, except
/// [`Poller::WAKE`].
pub struct Poller {
    backend: Backend,
}

enum Backend {
    Epoll(Epoll),
    /// The descriptors (as `pollfd`, for input) and their tokens, in step.
    Poll(RefCell<(Vec<libc::pollfd>, Vec<u64>)>),
}

impl Poller {
    /// The token of the port registry's wake-up eventfd; a datapath never uses it.
    pub const WAKE: u64 = u64::MAX;

    pub(crate) fn new(poll: bool) -> io::Result<Poller> {
        Ok(Poller {
            backend: if poll {
                Backend::Poll(RefCell::new((Vec::new(), Vec::new())))
            } else {
                Backend::Epoll(Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?)
            },
        })
    }

    /// Watches `fd` for input (level-triggered); its events come back with `token`.
    pub fn add(&self, fd: BorrowedFd<'_>, token: u64) -> io::Result<()> {
        debug_assert_ne!(token, Self::WAKE);
        self.watch(fd, token)
    }

    fn watch(&self, fd: BorrowedFd<'_>, token: u64) -> io::Result<()> {
        match &self.backend {
            Backend::Epoll(e) => e.add(fd, EpollEvent::new(EpollFlags::EPOLLIN, token))?,
            Backend::Poll(l) => {
                let mut l = l.borrow_mut();
                l.0.push(libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
                l.1.push(token);
            }
        }
        Ok(())
    }

    /// Stops watching `fd`.
    pub fn delete(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        match &self.backend {
            Backend::Epoll(e) => e.delete(fd)?,
            Backend::Poll(l) => {
                let mut l = l.borrow_mut();
                if let Some(i) = l.0.iter().position(|p| p.fd == fd.as_raw_fd()) {
                    l.0.swap_remove(i);
                    l.1.swap_remove(i);
                }
            }
        }
        Ok(())
    }

    /// Sleeps until a descriptor is readable or `timeout_ms` passes; fills `events` with
    /// the ready tokens and returns how many.
    fn wait(&self, events: &mut [EpollEvent], timeout_ms: u16) -> io::Result<usize> {
        match &self.backend {
            // The plain system call, not glibc's cancellation-point wrapper (`sys::epoll_wait`).
            Backend::Epoll(e) => {
                match super::sys::epoll_wait(e.0.as_fd(), events, i32::from(timeout_ms)) {
                    Ok(n) => Ok(n),
                    Err(nix::errno::Errno::EINTR) => Ok(0),
                    Err(e) => Err(e.into()),
                }
            }
            Backend::Poll(l) => {
                let mut l = l.borrow_mut();
                let (fds, tokens) = &mut *l;
                match poll_fds(fds, i32::from(timeout_ms)) {
                    Ok(0) => Ok(0),
                    Ok(_) => {
                        // A descriptor closed while watched would report POLLNVAL at once,
                        // forever: the worker would spin. It is dropped from the set.
                        let mut i = 0;
                        while i < fds.len() {
                            if fds[i].revents & libc::POLLNVAL != 0 {
                                tracing::warn!(
                                    fd = fds[i].fd,
                                    token = tokens[i],
                                    "poll: descriptor no longer open (POLLNVAL); no longer watched"
                                );
                                fds.swap_remove(i);
                                tokens.swap_remove(i);
                            } else {
                                i += 1;
                            }
                        }
                        let mut n = 0;
                        for (p, t) in fds.iter().zip(tokens.iter()) {
                            if p.revents != 0 && n < events.len() {
                                events[n] = EpollEvent::new(EpollFlags::EPOLLIN, *t);
                                n += 1;
                            }
                        }
                        Ok(n)
                    }
                    Err(e) if e.raw_os_error() == Some(libc::EINTR) => Ok(0),
                    Err(e) => Err(e),
                }
            }
        }
    }
}

/// How one worker receives and forwards; built on the worker's own thread by the `make`
/// closure given to [`spawn`], so it may hold buffers that never cross threads.
pub trait Datapath {
    /// Puts the datapath's descriptors in the worker's epoll set; called once, before the
    /// worker says it is ready.
    fn register(&mut self, poller: &Poller) -> io::Result<()>;

    /// Receives and forwards what is already waiting, a bounded amount, without sleeping;
    /// `true` when there was work (the worker then polls again before it sleeps).
    fn poll(&mut self, _shell: &Shell) -> bool {
        false
    }

    /// The descriptor registered with `token` is readable: receive and forward a bounded
    /// amount from it (level-triggered epoll brings it back for the rest).
    fn ready(&mut self, _shell: &Shell, _token: u64, _now: u64) {}

    /// Once after each wakeup's work (a busy `poll`, or the `ready` calls of one
    /// `epoll_wait`): sends what the datapath batched across the wakeup (e.g. a split half's
    /// link frames), so a wakeup costs one send however many descriptors or blocks it read.
    fn flush(&mut self, _shell: &Shell) {}

    /// A port was opened or closed by the route tables.
    fn command(&mut self, shell: &Shell, poller: &Poller, cmd: Cmd);

    /// Every [`SAMPLE_MS`] and at exit: reads the kernel's counters into `shell.stats`.
    fn sample(&mut self, _shell: &Shell) {}

    /// Once at exit, after the last [`Datapath::sample`]: counts what the datapath still
    /// held back (e.g. mode xdp's sent frames awaiting confirmation).
    fn finish(&mut self, _shell: &Shell) {}

    /// The longest sleep when idle, milliseconds (a datapath with a descriptor-less source
    /// asks for less).
    fn idle_ms(&self) -> u16 {
        100
    }

    /// Microseconds to keep calling [`Datapath::poll`] after the last round that found
    /// work, before sleeping in `epoll_wait` (0: sleep at once). For a ring datapath whose
    /// packets arrive in bursts (a sender's NAPI round, a video frame), a short spin takes
    /// the rest of the burst without another wake-up; it never spins when idle.
    fn spin_us(&self) -> u32 {
        0
    }

    /// Right before the worker sleeps (a round found no work and any spin is over): sends
    /// what the datapath held back until it had nothing else to do (e.g. AF_XDP's transmit
    /// kick, once per wake-up instead of once per round).
    fn idle(&mut self, _shell: &Shell) {}

    /// Sleep in `poll(2)` over the registered descriptors instead of `epoll_wait`, asked once
    /// at start. For AF_XDP sockets `poll(2)` also sends what waits on their TX rings (copy
    /// mode) or wakes the driver (zero-copy), so the sleep and the transmit kick are one
    /// system call; meant for a handful of descriptors.
    fn sleep_in_poll(&self) -> bool {
        false
    }
}

pub use super::ports::EgressSockets;

/// Starts `n` workers on `cpus` (in order; workers past the list run unpinned), each told of
/// `registry`'s ports; `make(index)` gives the closure that builds worker `index`'s datapath
/// on its thread.
pub fn start_workers<D, F>(
    n: usize,
    cpus: &[usize],
    registry: &PortRegistry,
    routes: &Arc<Routes>,
    stop: &Arc<AtomicBool>,
    mut make: impl FnMut(usize) -> F,
) -> Result<Vec<Worker>, EngineError>
where
    D: Datapath,
    F: FnOnce(&Shell) -> io::Result<D> + Send + 'static,
{
    let links = registry
        .attach_workers(n)
        .map_err(|source| EngineError::Io {
            what: "eventfd".into(),
            source,
        })?;
    let mut workers = Vec::with_capacity(n);
    for (index, link) in links.into_iter().enumerate() {
        let cpu = cpus.get(index).copied();
        workers.push(spawn(index, cpu, routes, stop, Some(link), make(index))?);
    }
    Ok(workers)
}

/// Starts one worker: pinned to `cpu`, told of ports through `link` (none for a datapath
/// that sends on no gateway socket), running the datapath `make` builds until `stop` is set.
pub fn spawn<D, F>(
    index: usize,
    cpu: Option<usize>,
    routes: &Arc<Routes>,
    stop: &Arc<AtomicBool>,
    link: Option<WorkerLink>,
    make: F,
) -> Result<Worker, EngineError>
where
    D: Datapath,
    F: FnOnce(&Shell) -> io::Result<D> + Send + 'static,
{
    let stats = Arc::new(WorkerStats::new(index, cpu));
    let shell = Shell::new(index, cpu, routes, Arc::clone(&stats));
    let stop = Arc::clone(stop);
    let thread = std::thread::Builder::new()
        .name(format!("vgate-w{index}"))
        .spawn(move || {
            let _exit = ExitFlag(&shell.stats);
            pin_worker(&shell.stats, shell.cpu);
            let run = make(&shell).and_then(|dp| run(&shell, &stop, link.as_ref(), dp));
            if let Err(e) = run {
                tracing::error!(worker = index, "worker stopped: {e}");
            }
        })
        .map_err(|source| EngineError::Spawn { index, source })?;
    Ok(Worker { stats, thread })
}

fn drain<D: Datapath>(shell: &Shell, poller: &Poller, link: Option<&WorkerLink>, dp: &mut D) {
    if let Some(link) = link {
        while let Ok(cmd) = link.cmds.try_recv() {
            dp.command(shell, poller, cmd);
        }
    }
}

fn sample<D: Datapath>(shell: &Shell, dp: &mut D, now: u64) {
    shell.stats.heartbeat_ms.store(now, Relaxed);
    shell.stats.cpu_ns.store(thread_cpu_ns(), Relaxed);
    dp.sample(shell);
}

fn run<D: Datapath>(
    shell: &Shell,
    stop: &AtomicBool,
    link: Option<&WorkerLink>,
    mut dp: D,
) -> io::Result<()> {
    let poller = Poller::new(dp.sleep_in_poll())?;
    if let Some(link) = link {
        poller.watch(link.wake.as_fd(), Poller::WAKE)?;
    }
    dp.register(&poller)?;
    drain(shell, &poller, link, &mut dp);
    let mut events = [EpollEvent::empty(); EVENTS];
    let mut next_sample = 0;
    let spin = std::time::Duration::from_micros(u64::from(dp.spin_us()));
    let mut worked_at: Option<std::time::Instant> = None;
    shell.stats.ready.store(true, Relaxed);
    while !stop.load(Relaxed) {
        let busy = dp.poll(shell);
        let now = now_ms();
        if now >= next_sample {
            sample(shell, &mut dp, now);
            next_sample = now + SAMPLE_MS;
        }
        if busy {
            dp.flush(shell);
            drain(shell, &poller, link, &mut dp);
            if !spin.is_zero() {
                worked_at = Some(std::time::Instant::now());
            }
            continue;
        }
        if let Some(t) = worked_at {
            if t.elapsed() < spin {
                std::hint::spin_loop();
                continue;
            }
            worked_at = None;
        }
        dp.idle(shell);
        let n = poller.wait(&mut events, dp.idle_ms())?;
        // Every command comes with a write to the wake-up eventfd (after it is queued), so
        // the queue is drained when that fired (or on the idle timeout); and whenever it is
        // not empty (one atomic load), since with more than `EVENTS` ready sockets the
        // wake-up may not be among the events reported for several rounds, while
        // `close_port` waits for its command.
        let woken = n == 0 || events[..n].iter().any(|e| e.data() == Poller::WAKE);
        if let (true, Some(link)) = (woken, link) {
            let _ = link.wake.read();
        }
        if woken || link.is_some_and(|l| !l.cmds.is_empty()) {
            drain(shell, &poller, link, &mut dp);
        }
        if n > 0 {
            let now = now_ms();
            for ev in &events[..n] {
                if ev.data() != Poller::WAKE {
                    dp.ready(shell, ev.data(), now);
                }
            }
            dp.flush(shell);
        }
    }
    sample(shell, &mut dp, now_ms());
    dp.finish(shell);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DomainId;
    use std::net::Ipv4Addr;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::time::{Duration, Instant};

    #[test]
    fn poll_backend_drops_a_closed_descriptor() {
        let poller = Poller::new(true).unwrap();
        let (a, b) = std::os::unix::net::UnixDatagram::pair().unwrap();
        poller.add(a.as_fd(), 7).unwrap();
        // A descriptor closed behind the poller's back (a number no process can have open,
        // so no other test's descriptor takes it): poll(2) reports POLLNVAL for it.
        let Backend::Poll(l) = &poller.backend else {
            unreachable!()
        };
        l.borrow_mut().0.push(libc::pollfd {
            fd: i32::MAX,
            events: libc::POLLIN,
            revents: 0,
        });
        l.borrow_mut().1.push(8);
        b.send(b"x").unwrap();
        let mut events = [EpollEvent::empty(); 4];
        // Returns at once (both ready); without the guard the dead entry would stay and
        // make every later wait return at once.
        assert_eq!(poller.wait(&mut events, 1000).unwrap(), 1);
        assert_eq!(events[0].data(), 7);
        assert_eq!(l.borrow().1, vec![7]);
        assert!(l.borrow().0.iter().all(|p| p.fd != i32::MAX));
    }

    /// Counts what the skeleton hands it.
    struct Probe {
        polls: Arc<AtomicUsize>,
        commands: Arc<AtomicUsize>,
        samples: Arc<AtomicUsize>,
        idles: Arc<AtomicUsize>,
        in_poll: bool,
    }

    impl Datapath for Probe {
        fn register(&mut self, _poller: &Poller) -> io::Result<()> {
            Ok(())
        }
        fn poll(&mut self, _shell: &Shell) -> bool {
            self.polls.fetch_add(1, SeqCst);
            false
        }
        fn command(&mut self, _shell: &Shell, _poller: &Poller, _cmd: Cmd) {
            self.commands.fetch_add(1, SeqCst);
        }
        fn sample(&mut self, _shell: &Shell) {
            self.samples.fetch_add(1, SeqCst);
        }
        fn idle_ms(&self) -> u16 {
            5
        }
        fn idle(&mut self, _shell: &Shell) {
            self.idles.fetch_add(1, SeqCst);
        }
        fn sleep_in_poll(&self) -> bool {
            self.in_poll
        }
    }

    fn wait_for(what: &str, cond: impl Fn() -> bool) {
        let until = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < until, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Both ways of sleeping: `epoll_wait` and `poll(2)` ([`Datapath::sleep_in_poll`]).
    #[test]
    fn skeleton_runs_a_datapath_and_delivers_commands() {
        for in_poll in [false, true] {
            skeleton_run(in_poll);
        }
    }

    fn skeleton_run(in_poll: bool) {
        use crate::routes::PortHooks;
        let registry = Arc::new(PortRegistry::new([
            Ipv4Addr::LOCALHOST,
            Ipv4Addr::LOCALHOST,
        ]));
        let cfg = crate::config::Config::embedded_default();
        let routes = Arc::new(Routes::new(
            &cfg,
            Arc::clone(&registry) as Arc<dyn PortHooks>,
        ));
        let stop = Arc::new(AtomicBool::new(false));
        let (polls, commands, samples, idles) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
        );
        let workers = start_workers(2, &[], &registry, &routes, &stop, |_| {
            let (p, c, s, i) = (
                Arc::clone(&polls),
                Arc::clone(&commands),
                Arc::clone(&samples),
                Arc::clone(&idles),
            );
            move |_: &Shell| {
                Ok(Probe {
                    polls: p,
                    commands: c,
                    samples: s,
                    idles: i,
                    in_poll,
                })
            }
        })
        .unwrap();
        wait_for("ready", || {
            workers.iter().all(|w| w.stats.ready.load(SeqCst))
        });
        // One port opened: every worker hears of it (an Add each), through the wake-up fd.
        registry.open_port(DomainId::A, 0).unwrap();
        wait_for("commands", || commands.load(SeqCst) >= 2);
        wait_for("polls, samples and idles", || {
            polls.load(SeqCst) > 2 && samples.load(SeqCst) >= 2 && idles.load(SeqCst) >= 2
        });
        stop.store(true, SeqCst);
        for w in workers {
            let stats = Arc::clone(&w.stats);
            w.thread.join().unwrap();
            assert!(stats.exited.load(SeqCst));
            assert!(stats.heartbeat_ms.load(SeqCst) > 0);
        }
    }
}
