//! The one-way channels: what happens to a packet between "received on a gateway port" and
//! "handed to the egress", the same for every engine.
//!
//! [`inspect`] is the per-packet decision (size, source, RTP accounting); [`WorkerStats`] holds
//! each worker's per-channel counters, CPU time and heartbeat; [`ChannelTotals`] adds them up
//! for reports. Engines own the receive loop and the egress and call into this module; this
//! module owns no sockets and never blocks, allocates or logs.

use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use crate::routes::{Channel, SourceCheck, StreamRoute};
use crate::stats::{DropReason, PacketCounters, Snapshot};
use crate::wire::rtp::RtpPacket;

/// What [`inspect`] decided for a datagram that may be forwarded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admitted {
    /// From the route's known source.
    Known,
    /// Its source has just taken the (`latch`) route: the first latch.
    Latched,
    /// Its source has taken the route from a latched source that had fallen silent
    /// (counted as `relatches`).
    Relatched,
}

/// Decides whether one datagram received for `route` at `now_ms` ([`crate::clock`]) may be
/// forwarded, and accounts its RTP sequence. `truncated` is the engine's word that the
/// datagram did not fit its buffer. A `latch` route latches a source only with a datagram
/// that passed every check and is RTP: a probe or a stray datagram never captures a route.
/// The caller touches the route (`last_seen`) only for admitted datagrams.
#[inline]
pub fn inspect(
    route: &StreamRoute,
    src: SocketAddrV4,
    payload: &[u8],
    truncated: bool,
    max_payload: usize,
    now_ms: u64,
) -> Result<Admitted, DropReason> {
    if route.standby() {
        return Err(DropReason::Standby);
    }
    if payload.is_empty() {
        return Err(DropReason::Truncated);
    }
    if truncated || payload.len() > max_payload {
        return Err(DropReason::Oversize);
    }
    let source = route.check_source(src, now_ms);
    if source == SourceCheck::Refused {
        return Err(DropReason::SourceMismatch);
    }
    let rtp = RtpPacket::new_checked(payload).ok();
    let mut admitted = Admitted::Known;
    if let SourceCheck::Candidate(seen) = source {
        if rtp.is_none() {
            return Err(DropReason::NotRtp);
        }
        admitted = match route.latch(seen, src, now_ms) {
            Some(true) => Admitted::Relatched,
            Some(false) => Admitted::Latched,
            None => return Err(DropReason::SourceMismatch),
        };
    }
    match rtp {
        Some(rtp) => route.stats.rtp.observe(rtp.sequence(), rtp.ssrc()),
        None if route.rtp_only => return Err(DropReason::NotRtp),
        None => {}
    }
    Ok(admitted)
}

/// One worker's counters, written by the worker, read by reports and the watchdog.
#[derive(Debug)]
pub struct WorkerStats {
    pub index: usize,
    /// The CPU the config assigns the worker (what it tries to pin to).
    pub cpu: Option<usize>,
    /// The CPU the worker ran on right after pinning (`sched_getcpu`); `u64::MAX`: unknown.
    running_cpu: AtomicU64,
    /// Whether the worker is pinned to its configured CPU.
    pinned: AtomicBool,
    /// Per channel, indexed by [`Channel::index`].
    pub channels: [PacketCounters; 2],
    /// Thread CPU time, nanoseconds.
    pub cpu_ns: AtomicU64,
    /// Last loop iteration ([`crate::clock::now_ms`]): a stalled worker stops moving it.
    pub heartbeat_ms: AtomicU64,
    /// Set once the worker is receiving.
    pub ready: AtomicBool,
    /// Set when the worker has exited (normally or not).
    pub exited: AtomicBool,
    /// Ring engines: packets the kernel dropped because the worker's rings were full (also
    /// counted as `rx_overflow` in the channel counters).
    pub ring_drops: AtomicU64,
    /// Ring engines: times a ring froze (tnapi: every block held by user space; afxdp: a TX
    /// ring kept frames with none taken by the kernel between two samples).
    pub ring_freezes: AtomicU64,
}

impl WorkerStats {
    pub fn new(index: usize, cpu: Option<usize>) -> WorkerStats {
        WorkerStats {
            index,
            cpu,
            running_cpu: AtomicU64::new(u64::MAX),
            pinned: AtomicBool::new(false),
            channels: Default::default(),
            cpu_ns: AtomicU64::new(0),
            heartbeat_ms: AtomicU64::new(0),
            ready: AtomicBool::new(false),
            exited: AtomicBool::new(false),
            ring_drops: AtomicU64::new(0),
            ring_freezes: AtomicU64::new(0),
        }
    }

    pub fn channel(&self, c: Channel) -> &PacketCounters {
        &self.channels[c.index()]
    }

    /// Records where the worker runs after its pinning attempt.
    pub fn record_cpu(&self, running: Option<usize>, pinned: bool) {
        self.running_cpu
            .store(running.map_or(u64::MAX, |c| c as u64), Relaxed);
        self.pinned.store(pinned, Relaxed);
    }

    /// The CPU the worker really ran on after pinning (not the configured one).
    pub fn running_cpu(&self) -> Option<usize> {
        match self.running_cpu.load(Relaxed) {
            u64::MAX => None,
            c => Some(c as usize),
        }
    }

    /// Whether the worker is pinned to its configured CPU.
    pub fn pinned(&self) -> bool {
        self.pinned.load(Relaxed)
    }

    pub fn cpu_seconds(&self) -> f64 {
        self.cpu_ns.load(Relaxed) as f64 / 1e9
    }
}

/// Totals per channel over all workers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChannelTotals {
    pub channels: [Snapshot; 2],
}

impl ChannelTotals {
    pub fn gather<'a>(workers: impl IntoIterator<Item = &'a WorkerStats>) -> ChannelTotals {
        let mut t = ChannelTotals::default();
        for w in workers {
            for c in Channel::ALL {
                t.channels[c.index()].add(&w.channel(c).snapshot());
            }
        }
        t
    }

    pub fn channel(&self, c: Channel) -> &Snapshot {
        &self.channels[c.index()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DomainId, SourcePolicy};
    use crate::routes::RouteSpec;

    fn route(policy: SourcePolicy, rtp_only: bool) -> StreamRoute {
        StreamRoute::new(
            RouteSpec {
                ingress: DomainId::A,
                port: 20000,
                dest: "127.0.0.2:4000".parse().unwrap(),
                egress_port: 30000,
                policy,
                expected: Some("127.0.0.1:5000".parse().unwrap()),
                rtp_only,
                label: "t".into(),
            },
            1,
        )
    }

    fn rtp(seq: u16) -> [u8; 20] {
        let mut b = [0u8; 20];
        crate::wire::rtp::write_header(&mut b, 96, seq, 0, 1).unwrap();
        b
    }

    #[test]
    fn decisions_and_reasons() {
        let src = "127.0.0.1:5000".parse().unwrap();
        let bad = "127.0.0.1:5001".parse().unwrap();
        let r = route(SourcePolicy::Strict, false);
        assert_eq!(
            inspect(&r, src, &rtp(1), false, 1472, 1),
            Ok(Admitted::Known)
        );
        assert_eq!(
            inspect(&r, src, &[], false, 1472, 1),
            Err(DropReason::Truncated)
        );
        assert_eq!(
            inspect(&r, src, &[0; 1500], false, 1472, 1),
            Err(DropReason::Oversize)
        );
        assert_eq!(
            inspect(&r, src, &rtp(2), true, 1472, 1),
            Err(DropReason::Oversize)
        );
        assert_eq!(
            inspect(&r, bad, &rtp(3), false, 1472, 1),
            Err(DropReason::SourceMismatch)
        );
        assert_eq!(
            inspect(&r, src, b"garbage!", false, 1472, 1),
            Ok(Admitted::Known)
        );
        assert_eq!(
            inspect(&r, src, &rtp(5), false, 1472, 1),
            Ok(Admitted::Known)
        );
        let s = r.stats.rtp.snapshot();
        assert_eq!(
            (s.packets, s.lost),
            (2, 3),
            "2 and 3 were dropped before accounting, 4 never came"
        );
        let only = route(SourcePolicy::Strict, true);
        assert_eq!(
            inspect(&only, src, b"garbage!", false, 1472, 1),
            Err(DropReason::NotRtp)
        );
    }

    #[test]
    fn only_rtp_that_passed_every_check_latches() {
        let r = StreamRoute::new(
            RouteSpec {
                ingress: DomainId::A,
                port: 20000,
                dest: "127.0.0.2:4000".parse().unwrap(),
                egress_port: 30000,
                policy: SourcePolicy::Latch,
                expected: Some("127.0.0.1:0".parse().unwrap()),
                rtp_only: false,
                label: "t".into(),
            },
            1,
        );
        let probe = "127.0.0.1:40000".parse().unwrap();
        let sender = "127.0.0.1:5000".parse().unwrap();
        let restarted = "127.0.0.1:5002".parse().unwrap();
        assert_eq!(
            inspect(&r, probe, b"nmap probe", false, 1472, 1000),
            Err(DropReason::NotRtp)
        );
        assert_eq!(
            inspect(&r, probe, &[0x80; 1500], false, 1472, 1000),
            Err(DropReason::Oversize)
        );
        assert_eq!(r.latched(), None, "nothing that failed a check latched");
        assert_eq!(
            inspect(&r, sender, &rtp(1), false, 1472, 1000),
            Ok(Admitted::Latched)
        );
        assert_eq!(
            inspect(&r, sender, b"not rtp, latched source", false, 1472, 1001),
            Ok(Admitted::Known)
        );
        r.touch(1001);
        assert_eq!(
            inspect(&r, restarted, &rtp(1), false, 1472, 2000),
            Err(DropReason::SourceMismatch)
        );
        assert_eq!(
            inspect(&r, restarted, b"junk", false, 1472, 9000),
            Err(DropReason::NotRtp),
            "after the silence only RTP re-latches"
        );
        assert_eq!(
            inspect(&r, restarted, &rtp(2), false, 1472, 9000),
            Ok(Admitted::Relatched)
        );
        assert_eq!(r.latched(), Some(restarted));
    }
}
