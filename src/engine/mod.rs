//! Capture/forward engines behind one interface, chosen once at start.
//!
//! The `--mode` names the published model's capture modes; the engine is the implementation
//! that provides it here:
//!
//! | mode    | engine      | status in this build |
//! |---------|-------------|----------------------|
//! | `stack` | `stack`     | kernel UDP sockets, `recvmmsg`/`sendmmsg`, one worker per queue |
//! | `tnapi` | `afpacket`   | AF_PACKET ring per RX queue (fanout QM), egress by packet socket with frames built by vgate, else through a raw socket per worker ([`ports`]) |
//! | `tnapi` | `pfring`     | PF_RING ring per RX queue (`dev@q`), where built with `--features pfring` and `pf_ring.ko` is loaded; egress through a UDP socket per gateway port |
//! | `zc`    | `afxdp`     | AF_XDP socket per RX queue behind an XDP program that redirects routed media only; zero-copy where the driver allows, copy mode otherwise |
//! | `zc`    | `pfring-zc` | PF_RING ZC `zc:dev@q` per RX queue, where built with `--features pfring` (ntop's licence; libpfring.so loaded at run time) |
//! | `xdp`   | `xdp`       | the `afxdp` engine plus an in-kernel fast path: confirmed streams are rewritten and redirected by the XDP program itself (see [`xdp`]) |
//!
//! A mode that cannot run fails with the reason; there is never a silent fallback to another
//! mode. Each engine gives one [`worker::Datapath`] per queue to the one worker skeleton
//! ([`worker`]: thread, pinning, epoll and wake-up, port commands, heartbeat, CPU time, ready
//! and exit flags); datapaths look packets up in the stream tables and hand them to
//! [`crate::channel::inspect`] before sending.

pub mod afpacket;
pub mod afxdp;
pub mod btf;
mod ebpf;
pub mod frames;
pub mod link;
pub mod neigh;
pub mod nft;
#[cfg(vgate_pfring)]
pub mod pfring;
pub mod ports;
pub mod stack;
#[allow(unsafe_code)]
pub(crate) mod sys;
pub mod tnapi;
pub mod worker;
pub mod xdp;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::channel::WorkerStats;
use crate::config::{Config, Mode};
use crate::routes::{PortHooks, Routes};

/// An implementation of a capture mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineKind {
    /// Kernel UDP sockets (mode stack).
    Stack,
    /// AF_PACKET TPACKET_V3 rings with queue fanout (mode tnapi).
    Afpacket,
    /// PF_RING per-queue rings `dev@q` (mode tnapi).
    Pfring,
    /// AF_XDP sockets per queue (mode zc).
    Afxdp,
    /// PF_RING ZC `zc:dev@q` (mode zc).
    PfringZc,
    /// XDP fast path in the kernel, AF_XDP for the rest (mode xdp).
    Xdp,
}

impl EngineKind {
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Stack => "stack",
            EngineKind::Afpacket => "afpacket",
            EngineKind::Pfring => "pfring",
            EngineKind::Afxdp => "afxdp",
            EngineKind::PfringZc => "pfring-zc",
            EngineKind::Xdp => "xdp",
        }
    }

    /// The mode this engine provides.
    pub fn mode(self) -> Mode {
        match self {
            EngineKind::Stack => Mode::Stack,
            EngineKind::Afpacket | EngineKind::Pfring => Mode::Tnapi,
            EngineKind::Afxdp | EngineKind::PfringZc => Mode::Zc,
            EngineKind::Xdp => Mode::Xdp,
        }
    }
}

/// Why an engine cannot run.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("engine {engine} provides mode {provides}, not mode {mode}; pick an engine of mode {mode} or drop --engine")]
    WrongMode {
        engine: &'static str,
        provides: Mode,
        mode: Mode,
    },
    #[error(
        "mode {mode} (engine {engine}) is not in this build of vgate yet: {why}. Use --mode stack"
    )]
    NotBuilt {
        mode: Mode,
        engine: &'static str,
        why: &'static str,
    },
    #[error("engine {engine} cannot run a split half: the PF_RING engines have no link datapath, so the half would forward nothing; use --engine {alternative} (or drop --engine: a split half then runs {alternative})")]
    SplitHalf {
        engine: &'static str,
        alternative: &'static str,
    },
    #[error("cannot start worker {index}: {source}")]
    Spawn {
        index: usize,
        source: std::io::Error,
    },
    #[error("mode {mode} (engine {engine}) cannot run: {reason}. --engine {alternative} runs mode {mode} without PF_RING")]
    Pfring {
        mode: Mode,
        engine: &'static str,
        reason: String,
        alternative: &'static str,
    },
    #[error("mode tnapi (engine afpacket) cannot run: {0}")]
    Afpacket(#[source] afpacket::AfPacketError),
    #[error("mode tnapi (engine afpacket) cannot run: the table that keeps the kernel off captured media: {0}")]
    Nft(#[source] nft::NftError),
    #[error("mode tnapi (engine afpacket) cannot run: interface {ifname:?} has {have} RX queue(s) but engine.queues is {want}; give it more queues (ethtool -L {ifname} combined {want}) or lower engine.queues")]
    Queues {
        ifname: String,
        have: usize,
        want: usize,
    },
    #[error("domain isolation: {0}")]
    Isolation(#[source] std::io::Error),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

/// The port registry of `cfg`'s domains, every socket tied to its domain's interface; an
/// interface that cannot be bound is a start-up error ([`EngineError::Isolation`]).
pub fn bound_registry(cfg: &Config) -> Result<ports::PortRegistry, EngineError> {
    ports::PortRegistry::new([cfg.domains[0].address, cfg.domains[1].address])
        .on_interfaces([
            cfg.domains[0].interface.clone(),
            cfg.domains[1].interface.clone(),
        ])
        .map_err(EngineError::Isolation)
}

/// The port registry of a ring engine (`tnapi`, `zc`, `xdp`) for `cfg`: no socket per port
/// ([`ports::PortHold::Reserved`]) unless `sockets` (a `sockets` transmit variant) or a
/// split half (its incoming link worker sends on the port sockets) needs them. Says once
/// when the media ranges are not kept from the kernel's ephemeral ports.
pub fn ring_registry(cfg: &Config, sockets: bool) -> Result<ports::PortRegistry, EngineError> {
    bound_registry(cfg)?
        .holding(ring_hold(cfg, sockets))
        .map_err(EngineError::Isolation)
}

/// How a ring engine holds ports (see [`ring_registry`]).
pub fn ring_hold(cfg: &Config, sockets: bool) -> ports::PortHold {
    let hold = if sockets || cfg.split.is_some() {
        ports::PortHold::Sockets
    } else {
        ports::PortHold::Reserved
    };
    if hold == ports::PortHold::Reserved {
        let ranges: Vec<(u16, u16)> = cfg
            .domains
            .iter()
            .map(|d| (d.media_ports.first, d.media_ports.last))
            .collect();
        if cfg.engine.reserve_ports {
            match ports::reserve_ranges(&ranges) {
                Ok(Some(list)) => tracing::info!(
                    "engine.reserve_ports: net.ipv4.ip_local_reserved_ports = {list} in this network namespace"
                ),
                Ok(None) => {}
                Err(e) => tracing::warn!(
                    "engine.reserve_ports: cannot add the media ranges to net.ipv4.ip_local_reserved_ports ({e}; under systemd ProtectKernelTunables=yes forbids it): set it before start (docs/operations.md)"
                ),
            }
        }
        if let Some(advice) = ports::reserved_ports_advice(&ranges) {
            tracing::warn!("{advice}");
        }
    }
    hold
}

/// A running worker thread.
pub struct Worker {
    pub stats: Arc<WorkerStats>,
    pub thread: JoinHandle<()>,
}

/// A capture/forward engine.
pub trait Engine: Send {
    fn kind(&self) -> EngineKind;
    /// One line for the start-up banner: what is in use, per worker.
    fn describe(&self) -> String;
    /// What the route tables call when ports are taken and given back.
    fn port_hooks(&self) -> Arc<dyn PortHooks>;
    /// The engine's ports: how a stream leg (`edge`) sends from a gateway port, and in a
    /// split half the outgoing link's lane for legs.
    fn ports(&self) -> Arc<ports::PortRegistry>;
    /// A split half's link counters (`None` on a single host or for engines without links).
    fn split_stats(&self) -> Option<Arc<crate::engine::link::SplitStats>> {
        None
    }
    /// The neighbour resolver's table and counters, once `start` runs one (engines that
    /// build frames themselves); see [`neigh`].
    fn neigh_table(&self) -> Option<Arc<neigh::NeighTable>> {
        None
    }
    /// Mode xdp: the fast path's egress interfaces, whether each is on it and why not.
    fn xdp_status(&self) -> Option<Arc<xdp::XdpStatus>> {
        None
    }
    /// Starts the workers; they run until `stop` is set.
    fn start(
        &mut self,
        routes: Arc<Routes>,
        stop: Arc<AtomicBool>,
    ) -> Result<Vec<Worker>, EngineError>;
}

/// The engine for `mode`, or for `engine` when given (which must provide `mode`).
pub fn choose(mode: Mode, engine: Option<EngineKind>) -> Result<EngineKind, EngineError> {
    let kind = engine.unwrap_or(match mode {
        Mode::Stack => EngineKind::Stack,
        Mode::Tnapi if pfring_sys::AVAILABLE => EngineKind::Pfring,
        Mode::Tnapi => EngineKind::Afpacket,
        Mode::Zc if pfring_sys::AVAILABLE => EngineKind::PfringZc,
        Mode::Zc => EngineKind::Afxdp,
        Mode::Xdp => EngineKind::Xdp,
    });
    if kind.mode() != mode {
        return Err(EngineError::WrongMode {
            engine: kind.name(),
            provides: kind.mode(),
            mode,
        });
    }
    Ok(kind)
}

/// The engine a split half runs: the PF_RING engines have no link datapath (a half on them
/// would capture its domain and send nothing down the link), so a default choice of them
/// falls back to the kernel family of the same mode and an explicit one is refused.
pub fn for_split_half(kind: EngineKind, explicit: bool) -> Result<EngineKind, EngineError> {
    let alternative = match kind {
        EngineKind::Pfring => EngineKind::Afpacket,
        EngineKind::PfringZc => EngineKind::Afxdp,
        other => return Ok(other),
    };
    if explicit {
        return Err(EngineError::SplitHalf {
            engine: kind.name(),
            alternative: alternative.name(),
        });
    }
    Ok(alternative)
}

/// Builds the engine of `kind` for `cfg`.
pub fn build(cfg: &Config, kind: EngineKind) -> Result<Box<dyn Engine>, EngineError> {
    match kind {
        EngineKind::Stack => Ok(Box::new(stack::StackEngine::new(cfg)?)),
        EngineKind::Afpacket => Ok(Box::new(tnapi::AfpacketEngine::new(cfg)?)),
        EngineKind::Afxdp => Ok(Box::new(afxdp::AfxdpEngine::new(cfg)?)),
        EngineKind::Xdp => Ok(Box::new(afxdp::AfxdpEngine::new_fast(cfg)?)),
        #[cfg(vgate_pfring)]
        EngineKind::Pfring | EngineKind::PfringZc => {
            Ok(Box::new(pfring::PfringEngine::new(cfg, kind)?))
        }
        #[cfg(not(vgate_pfring))]
        EngineKind::Pfring | EngineKind::PfringZc => Err(EngineError::NotBuilt {
            mode: kind.mode(),
            engine: kind.name(),
            why: "vgate was built without PF_RING (the pfring feature of pfring-sys)",
        }),
    }
}

/// Marks a worker exited however it leaves (return or panic), for the watchdog.
pub(crate) struct ExitFlag<'a>(pub(crate) &'a WorkerStats);

impl Drop for ExitFlag<'_> {
    fn drop(&mut self) {
        self.0
            .exited
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Pins the calling thread to `cpu`; `false` when the kernel refused (e.g. the CPU is not in
/// this process's allowed set), which the caller reports once.
/// Pins the calling worker thread to `cpu` (if any) and records in `stats` the CPU it then
/// really runs on, and whether it is pinned there: a failed pin is logged and reported as
/// unpinned, never as the configured CPU.
pub fn pin_worker(stats: &WorkerStats, cpu: Option<usize>) {
    let pinned = cpu.is_some_and(|c| {
        let ok = pin_to(c);
        if !ok {
            tracing::warn!(
                worker = stats.index,
                cpu = c,
                "could not pin worker to its CPU; running unpinned"
            );
        }
        ok
    });
    let on = nix::sched::sched_getcpu().ok();
    stats.record_cpu(on, pinned && on == cpu);
}

/// Keeps the calling thread, and every thread it starts from now on (the main loop, the admin
/// interface, signaling proxies and their sessions, edge legs), off the workers' CPUs: the
/// data-path cores are left to the workers (and to the kernel's receive processing the NIC
/// setup steers there), so a periodic control wake-up never preempts a worker or cools its
/// caches. Workers pin themselves to their own CPU afterwards (an affinity mask inherited
/// from the parent does not limit that). Returns the CPUs the control threads keep; `None`
/// (and nothing changed) when no worker CPU is configured or the workers would leave none
/// of the allowed CPUs over — then the control threads share the workers' CPUs as before.
pub fn keep_off_worker_cpus(worker_cpus: &[usize]) -> Option<Vec<usize>> {
    use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
    use nix::unistd::Pid;
    if worker_cpus.is_empty() {
        return None;
    }
    let current = sched_getaffinity(Pid::from_raw(0)).ok()?;
    let rest: Vec<usize> = (0..CpuSet::count())
        .filter(|&c| current.is_set(c).unwrap_or(false) && !worker_cpus.contains(&c))
        .collect();
    if rest.is_empty() {
        return None;
    }
    let mut set = CpuSet::new();
    for &c in &rest {
        set.set(c).ok()?;
    }
    sched_setaffinity(Pid::from_raw(0), &set).ok()?;
    Some(rest)
}

pub fn pin_to(cpu: usize) -> bool {
    // Core ids come from the config, not from a list of "available" cores, which hides
    // isolated CPUs — exactly the ones an appliance reserves for its workers.
    // (nix's CpuSet refuses a CPU beyond its size instead of writing past it.)
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).is_ok()
        && nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn affinity() -> Vec<usize> {
        let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).unwrap();
        (0..nix::sched::CpuSet::count())
            .filter(|&c| set.is_set(c).unwrap_or(false))
            .collect()
    }

    #[test]
    fn control_threads_leave_the_worker_cpus_to_the_workers() {
        // In a thread of its own: the affinity is per thread, and inherited by its children.
        std::thread::spawn(|| {
            let before = affinity();
            assert_eq!(keep_off_worker_cpus(&[]), None, "no worker CPUs: as is");
            assert_eq!(
                keep_off_worker_cpus(&before),
                None,
                "the workers would take every CPU: as is"
            );
            assert_eq!(affinity(), before);
            if before.len() < 2 {
                return; // nothing to split on a one-CPU allowance
            }
            let worker = before[before.len() - 1];
            let rest = keep_off_worker_cpus(&[worker]).expect("confined");
            assert_eq!(rest, before[..before.len() - 1]);
            assert_eq!(affinity(), rest);
            // A thread started now (an admin or signaling thread) inherits it…
            let child = std::thread::spawn(affinity).join().unwrap();
            assert_eq!(child, rest);
            // …and a worker still pins itself to its own CPU.
            let pinned = std::thread::spawn(move || {
                let st = WorkerStats::new(0, Some(worker));
                pin_worker(&st, Some(worker));
                (affinity(), st.pinned())
            })
            .join()
            .unwrap();
            assert_eq!(pinned, (vec![worker], true));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_failed_pin_reports_where_the_worker_really_runs() {
        let on = std::thread::spawn(|| {
            let st = WorkerStats::new(0, Some(100_000));
            pin_worker(&st, Some(100_000));
            (st.running_cpu(), st.pinned())
        })
        .join()
        .unwrap();
        assert!(!on.1, "a pin to a CPU that does not exist failed");
        assert!(on.0.is_some_and(|c| c != 100_000), "{on:?}");
        let ok = std::thread::spawn(|| {
            let st = WorkerStats::new(0, Some(0));
            pin_worker(&st, Some(0));
            (st.running_cpu(), st.pinned())
        })
        .join()
        .unwrap();
        assert_eq!(ok, (Some(0), true));
    }

    #[test]
    fn modes_map_to_engines_and_unbuilt_ones_say_so() {
        assert_eq!(choose(Mode::Stack, None).unwrap(), EngineKind::Stack);
        // A split half never runs on a PF_RING engine (no link datapath there).
        assert_eq!(
            for_split_half(EngineKind::Pfring, false).unwrap(),
            EngineKind::Afpacket
        );
        assert_eq!(
            for_split_half(EngineKind::PfringZc, false).unwrap(),
            EngineKind::Afxdp
        );
        assert_eq!(
            for_split_half(EngineKind::Stack, true).unwrap(),
            EngineKind::Stack
        );
        let refused = for_split_half(EngineKind::Pfring, true)
            .unwrap_err()
            .to_string();
        assert!(refused.contains("--engine afpacket"), "{refused}");
        // A build with PF_RING prefers it (and fails with the reason where it cannot run).
        let (tnapi, zc) = if pfring_sys::AVAILABLE {
            (EngineKind::Pfring, EngineKind::PfringZc)
        } else {
            (EngineKind::Afpacket, EngineKind::Afxdp)
        };
        assert_eq!(choose(Mode::Tnapi, None).unwrap(), tnapi);
        assert!(matches!(
            choose(Mode::Stack, Some(EngineKind::Afxdp)),
            Err(EngineError::WrongMode { .. })
        ));
        let cfg = Config::embedded_default();
        // Building afpacket or afxdp would open rings, nft rules or XDP programs here: the
        // namespace tests do it.
        assert_eq!(choose(Mode::Zc, None).unwrap(), zc);
        if pfring_sys::AVAILABLE {
            // Opening rings is the job of tests/pfring.rs.
            return;
        }
        let kind = choose(Mode::Tnapi, Some(EngineKind::Pfring)).unwrap();
        let msg = build(&cfg, kind).err().expect("not built").to_string();
        assert!(
            msg.contains("not in this build") && msg.contains("--mode stack"),
            "{msg}"
        );
        let e = build(&cfg, EngineKind::Pfring).err().unwrap().to_string();
        assert!(e.contains("without PF_RING"), "{e}");
    }
}
