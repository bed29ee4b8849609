//! The one-way channels: what happens to a packet between "received on a gateway port" and
//! "handed to the egress", the same for every engine.
//!
//! [`inspect`] is the per-packet decision (size, source, RTP accounting); [`WorkerStats`] holds
//! each worker's per-channel counters, CPU time and heartbeat; [`ChannelTotals`] adds them up
//! for reports. Engines own the receive loop and the egress and call into this module; this
//! module owns no sockets and never blocks, allocates or logs.

use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use crate::routes::{Channel, StreamRoute};
use crate::stats::{DropReason, PacketCounters, Snapshot};
use crate::wire::rtp::RtpPacket;

/// Decides whether one datagram received for `route` may be forwarded, and accounts its RTP
/// sequence. `truncated` is the engine's word that the datagram did not fit its buffer.
#[inline]
pub fn inspect(
    route: &StreamRoute,
    src: SocketAddrV4,
    payload: &[u8],
    truncated: bool,
    max_payload: usize,
) -> Result<(), DropReason> {
    if payload.is_empty() {
        return Err(DropReason::Truncated);
    }
    if truncated || payload.len() > max_payload {
        return Err(DropReason::Oversize);
    }
    if !route.accepts(src) {
        return Err(DropReason::SourceMismatch);
    }
    match RtpPacket::new_checked(payload) {
        Ok(rtp) => route.stats.rtp.observe(rtp.sequence(), rtp.ssrc()),
        Err(_) if route.rtp_only => return Err(DropReason::NotRtp),
        Err(_) => {}
    }
    Ok(())
}

/// One worker's counters, written by the worker, read by reports and the watchdog.
#[derive(Debug)]
pub struct WorkerStats {
    pub index: usize,
    /// The CPU the worker is pinned to (if pinning succeeded).
    pub cpu: Option<usize>,
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
    /// Ring engines: times a ring froze (every block held by user space).
    pub ring_freezes: AtomicU64,
}

impl WorkerStats {
    pub fn new(index: usize, cpu: Option<usize>) -> WorkerStats {
        WorkerStats {
            index,
            cpu,
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
        assert_eq!(inspect(&r, src, &rtp(1), false, 1472), Ok(()));
        assert_eq!(
            inspect(&r, src, &[], false, 1472),
            Err(DropReason::Truncated)
        );
        assert_eq!(
            inspect(&r, src, &[0; 1500], false, 1472),
            Err(DropReason::Oversize)
        );
        assert_eq!(
            inspect(&r, src, &rtp(2), true, 1472),
            Err(DropReason::Oversize)
        );
        assert_eq!(
            inspect(&r, bad, &rtp(3), false, 1472),
            Err(DropReason::SourceMismatch)
        );
        assert_eq!(inspect(&r, src, b"garbage!", false, 1472), Ok(()));
        assert_eq!(inspect(&r, src, &rtp(5), false, 1472), Ok(()));
        let s = r.stats.rtp.snapshot();
        assert_eq!(
            (s.packets, s.lost),
            (2, 3),
            "2 and 3 were dropped before accounting, 4 never came"
        );
        let only = route(SourcePolicy::Strict, true);
        assert_eq!(
            inspect(&only, src, b"garbage!", false, 1472),
            Err(DropReason::NotRtp)
        );
    }
}
