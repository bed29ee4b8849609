//! The per-frame path the ring engines (`tnapi`: AF_PACKET, `zc`: AF_XDP) share: which
//! channel a captured datagram belongs to, the run of consecutive packets for one route (one
//! table lookup and one counter update per run, not per packet), the checks of
//! [`crate::channel::inspect_mut`] (a stripping route's payload rewritten in the engine's
//! frame), and the accounting of what a send did. Each engine keeps only
//! what differs: where frames come from and how a run's packets leave.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;

use super::ports::{EgressSockets, TxVia};
use super::sys::mmsg::SendOutcome;
use crate::channel::{inspect_mut, Admitted, Validators};
use crate::clock::now_ms;
use crate::config::{DomainId, PortRange};
use crate::logging::RateLimit;
use crate::routes::{Channel, Routes, StreamRoute};
use crate::stats::{DropReason, Tally};
use crate::wire::WireError;

/// The gateway's address and media ports in each domain, by [`DomainId::index`].
pub type Targets = [(Ipv4Addr, PortRange); 2];

/// The channel of a datagram to `dst:port` arriving on an interface facing `domains`.
#[inline]
pub fn classify(
    targets: &Targets,
    domains: &[DomainId],
    dst: Ipv4Addr,
    port: u16,
) -> Option<Channel> {
    domains
        .iter()
        .find(|d| {
            let (addr, range) = targets[d.index()];
            addr == dst && range.contains(port)
        })
        .map(|d| Channel::from_ingress(*d))
}

/// The drop reason of a frame that is not a well-formed IPv4/UDP datagram.
pub fn wire_reason(e: WireError) -> DropReason {
    match e {
        WireError::Truncated => DropReason::Truncated,
        _ => DropReason::Malformed,
    }
}

/// Counts a frame that could not be parsed or classified on the channel of its interface.
pub fn drop_frame(chan: &mut [Tally; 2], fallback: Channel, len: usize, reason: DropReason) {
    let t = &mut chan[fallback.index()];
    t.rx_packets += 1;
    t.rx_bytes += len as u64;
    t.drop(reason);
}

/// Consecutive packets for one route.
pub struct Run<'l> {
    pub channel: Channel,
    pub port: u16,
    pub route: Option<Arc<StreamRoute>>,
    pub egress: Option<TxVia<'l>>,
    pub tally: Tally,
    /// When the run's packets arrived ([`crate::clock::now_ms`]).
    pub now: u64,
    /// Whether any packet passed every check (only those keep the route alive).
    pub admitted: bool,
}

impl<'l> Run<'l> {
    /// Whether a datagram for `channel`/`port` continues this run.
    pub fn continues(run: &Option<Run<'l>>, channel: Channel, port: u16) -> bool {
        run.as_ref()
            .is_some_and(|r| r.channel == channel && r.port == port)
    }

    /// Starts a run: one table lookup (the read guard lives only for this statement) and the
    /// way out of its route (the egress port's socket, or the worker's raw socket).
    pub fn start(
        routes: &Routes,
        local: &'l EgressSockets,
        channel: Channel,
        port: u16,
        now: u64,
    ) -> Run<'l> {
        let route = routes
            .table(channel)
            .get(&port)
            .map(|r| Arc::clone(r.value()));
        let egress = route
            .as_ref()
            .and_then(|r| local.egress(channel.egress(), r.egress_port));
        Run {
            channel,
            port,
            route,
            egress,
            tally: Tally::default(),
            now,
            admitted: false,
        }
    }

    /// Counts a datagram from `src` and decides whether it is forwarded:
    /// `Some((destination, egress, len))` when it passes every check (the media validator's
    /// too, with the worker's `media` state: [`super::worker::Shell::media`]), otherwise it is
    /// counted as dropped with its reason. `payload` is the datagram's payload in the
    /// engine's own frame (ring block, UMEM chunk, arena slot): a route that strips its media
    /// has it rewritten there ([`crate::channel::inspect_mut`]) and `len` is what to send of
    /// it; the way out builds its IPv4/UDP headers (lengths, checksums) for that length.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub fn admit(
        &mut self,
        src: SocketAddrV4,
        payload: &mut [u8],
        checksums_ok: bool,
        truncated: bool,
        max_payload: usize,
        media: &mut Validators,
    ) -> Option<(SocketAddrV4, TxVia<'l>, usize)> {
        self.tally.rx_packets += 1;
        self.tally.rx_bytes += payload.len() as u64;
        let Some(route) = &self.route else {
            self.tally.drop(DropReason::NoRoute);
            return None;
        };
        if !checksums_ok {
            self.tally.drop(DropReason::Malformed);
            return None;
        }
        let len = match inspect_mut(route, src, payload, truncated, max_payload, self.now, media) {
            Ok((admitted, len)) => {
                self.admitted = true;
                self.tally.relatches += u64::from(admitted == Admitted::Relatched);
                len
            }
            Err(reason) => {
                self.tally.drop(reason);
                return None;
            }
        };
        if let Some(sink) = &route.edge {
            // The receiver is a stream leg: its sink, not a socket.
            offer_to_leg(sink, &payload[..len], &mut self.tally);
            return None;
        }
        let Some(fd) = self.egress else {
            // The egress socket is announced before the route is installed, so this only
            // happens while the route's session is being torn down.
            self.tally.drop(DropReason::SendError);
            return None;
        };
        Some((route.dest, fd, len))
    }

    /// Adds the run's figures to its route (once) and to its channel's batch tally.
    pub fn close(self, now: u64, chan: &mut [Tally; 2]) {
        self.park().close(now, chan);
    }

    /// The run's figures without its egress socket, to be closed later (after a batch that
    /// outlives the run was sent).
    pub fn park(self) -> Parked {
        Parked {
            channel: self.channel,
            route: self.route,
            tally: self.tally,
            admitted: self.admitted,
        }
    }
}

/// A finished run whose figures are added once its packets' fate is known.
pub struct Parked {
    pub channel: Channel,
    pub route: Option<Arc<StreamRoute>>,
    pub tally: Tally,
    pub admitted: bool,
}

impl Parked {
    /// Adds the run's figures to its route (once) and to its channel's batch tally.
    pub fn close(self, now: u64, chan: &mut [Tally; 2]) {
        if let Some(route) = &self.route {
            if self.admitted {
                route.touch(now);
            }
            route.stats.packets.add(&self.tally);
        }
        chan[self.channel.index()].merge(&self.tally);
    }
}

/// Hands an admitted packet to a stream leg's sink ([`crate::edge`]) and counts what
/// happened: sent, or dropped as `leg_stall`.
#[inline]
pub fn offer_to_leg(sink: &crate::sink::EdgeSink, payload: &[u8], t: &mut Tally) {
    if sink.offer(payload) {
        t.tx_packets += 1;
        t.tx_bytes += payload.len() as u64;
    } else {
        t.drop(DropReason::LegStall);
    }
}

static SEND_ERRORS: RateLimit = RateLimit::new(5000);

/// Adds what a socket send did to a run's tally; a failure is logged, rate-limited.
pub fn account(t: &mut Tally, out: &SendOutcome, route: Option<&StreamRoute>) {
    t.tx_packets += out.sent as u64;
    t.tx_bytes += out.sent_bytes as u64;
    t.drops[DropReason::QueueFull as usize] += out.queue_full as u64;
    t.drops[DropReason::SendError as usize] += out.errors as u64;
    if let Some(code) = out.last_error {
        if let Some(suppressed) = SEND_ERRORS.check(now_ms()) {
            let e = io::Error::from_raw_os_error(code);
            let (label, dest) = route
                .map(|r| (&*r.label, r.dest.to_string()))
                .unwrap_or(("?", String::new()));
            tracing::warn!(route = %label, dest = %dest, suppressed, "send failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_by_address_and_range() {
        let t: Targets = [
            (
                Ipv4Addr::new(127, 0, 0, 1),
                PortRange {
                    first: 20000,
                    last: 20099,
                },
            ),
            (
                Ipv4Addr::new(127, 0, 0, 2),
                PortRange {
                    first: 30000,
                    last: 30099,
                },
            ),
        ];
        let both = [DomainId::A, DomainId::B];
        assert_eq!(
            classify(&t, &both, Ipv4Addr::new(127, 0, 0, 1), 20010),
            Some(Channel::Forward)
        );
        assert_eq!(
            classify(&t, &both, Ipv4Addr::new(127, 0, 0, 2), 30010),
            Some(Channel::Reverse)
        );
        assert_eq!(
            classify(&t, &both, Ipv4Addr::new(127, 0, 0, 2), 20010),
            None
        );
        assert_eq!(
            classify(&t, &[DomainId::A], Ipv4Addr::new(127, 0, 0, 2), 30010),
            None
        );
        assert_eq!(wire_reason(WireError::Truncated), DropReason::Truncated);
        assert_eq!(wire_reason(WireError::NotUdp), DropReason::Malformed);
    }
}
