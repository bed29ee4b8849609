//! RTP over TCP on a side of a call: the proto and `a=setup` vgate writes toward each side
//! ([`CallMedia::transports`]) and the TCP legs that follow from the roles
//! ([`CallMedia::reconcile_legs`]: start, replace on `a=connection:new`, stop). See the
//! module doc of [`super`] for the rules.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::DomainId;
use crate::routes::legs::{LegError, LegSpec, Role};
use crate::routes::Routes;
use crate::signaling::sdp::{self, SetupEdit};
use crate::sink::DEFAULT_SLOTS;
use crate::wire::framing::Rfc4571;

use super::{CallMedia, PortLease, Setup, SlotLeg};

/// How long an active TCP leg keeps trying to connect to its peer.
const CONNECT_FOR: Duration = Duration::from_secs(10);
/// A peer's SDP can trigger the refused-reconnect warning: at most one line per 5 s.
static RENEW_LOG: crate::logging::RateLimit = crate::logging::RateLimit::new(5000);

impl CallMedia {
    /// Writes each crossing TCP line's proto and `a=setup` for the receiving side and
    /// records the role written (see the module doc).
    pub(super) fn transports(
        &mut self,
        parsed: &sdp::Sdp<'_>,
        from: DomainId,
        mut out: Vec<u8>,
    ) -> Vec<u8> {
        let to = from.other();
        // This SDP answers one `to` sent (else it offers to `to`).
        let answering = self.last_from == Some(to);
        for (i, m) in parsed.media.iter().enumerate() {
            let Some(slot) = self.slots.get_mut(i) else {
                continue;
            };
            if m.port == 0 {
                continue;
            }
            let (tcp_from, tcp_to) = (slot.tcp[from.index()], slot.tcp[to.index()]);
            match (tcp_from, tcp_to) {
                (true, true) => {
                    // Byte for byte: each peer sees the role the other asked for.
                    slot.written[to.index()] = Setup::parse(m.setup);
                }
                (true, false) => {
                    out = sdp::set_transport(&out, i, "RTP/AVP", SetupEdit::Remove);
                    slot.written[to.index()] = None;
                }
                (false, true) => {
                    // An answer to a TCP offer from `to`: the complement of its role.
                    let role = match slot.peer[to.index()].and_then(|p| p.setup) {
                        Some(Setup::Passive) => Setup::Active,
                        // RFC 4145 §4: an offer of `holdconn` is answered `holdconn` (no
                        // connection now, so no leg).
                        Some(Setup::HoldConn) if answering => Setup::HoldConn,
                        _ => Setup::Passive,
                    };
                    slot.written[to.index()] = Some(role);
                    // RFC 4145 §5.1: `existing` when vgate's leg on that side is connected
                    // and stays as it is (a re-INVITE), unless `to` offered `new`.
                    let keep = slot.leg_connected_as_planned(to)
                        && (!answering || slot.peer[to.index()].is_some_and(|p| !p.asks_new));
                    let edit = if keep {
                        SetupEdit::Keep(role.as_str())
                    } else {
                        SetupEdit::Set(role.as_str())
                    };
                    out = sdp::set_transport(&out, i, "TCP/RTP/AVP", edit);
                }
                (false, false) => {}
            }
        }
        out
    }

    /// Starts, replaces or stops the TCP legs the slots call for; returns the legs replaced
    /// or stopped, for the caller to drop once the routes are re-pointed. `renew`: the
    /// lines whose SDP from `from` asked for a new connection.
    pub(super) fn reconcile_legs(
        &mut self,
        routes: &Arc<Routes>,
        from: DomainId,
        renew: &[usize],
    ) -> Result<Vec<SlotLeg>, LegError> {
        let mut retired = Vec::new();
        let Some(session) = self.session else {
            return Ok(retired);
        };
        for (i, slot) in self.slots.iter_mut().enumerate() {
            for d in DomainId::ALL {
                let plan = slot.leg_plan(d);
                let have = slot.legs[d.index()]
                    .as_ref()
                    .map(|l| (l.role, (l.role == Role::Active).then_some(l.peer)));
                // RFC 4145 §5.1: `new` from a peer that listens means a new connection, so
                // vgate's active leg makes one (a new leg; the old connection closes once
                // the routes point at it). A passive leg needs nothing: the peer's new
                // connection replaces the old one when it comes.
                // A peer may not make vgate reconnect more often than `renew_min`: one asked
                // sooner keeps the connection (counted in the leg's `renew_refused`).
                let asked = d == from
                    && renew.contains(&i)
                    && plan == have
                    && have.is_some_and(|h| h.0 == Role::Active);
                let renew = asked
                    && match (slot.last_renew[d.index()], &slot.legs[d.index()]) {
                        (Some(t), Some(l)) if t.elapsed() < self.renew_min => {
                            l.leg.counters().renew_refused.fetch_add(1, Relaxed);
                            if let Some(suppressed) = RENEW_LOG.check(crate::clock::now_ms()) {
                                tracing::warn!(call = %self.label, line = i, suppressed, "a=connection:new asked again within {:?} of the last reconnect: the TCP media connection is kept", self.renew_min);
                            }
                            false
                        }
                        _ => true,
                    };
                if renew {
                    slot.last_renew[d.index()] = Some(Instant::now());
                }
                if plan == have && !renew {
                    continue;
                }
                // The old leg stops when the caller drops it, after `reconcile` re-made its
                // routes; but a listener going away for an active leg goes now, so the new
                // leg can connect from the gateway port.
                let old = slot.legs[d.index()].take();
                // An active leg replacing one on this side may find the gateway port still
                // tied to the old connection: it connects from a registry port then.
                let fallback = match (&old, plan) {
                    (Some(_), Some((Role::Active, _))) => {
                        match routes.alloc_pair(session, d) {
                            Ok(port) => Some(PortLease {
                                routes: Arc::clone(routes),
                                session,
                                domain: d,
                                port,
                            }),
                            // No port free: the gateway port only (retried).
                            Err(_) => None,
                        }
                    }
                    _ => None,
                };
                match (&old, plan) {
                    (Some(o), Some((Role::Active, _))) if o.role == Role::Passive => drop(old),
                    _ => retired.extend(old),
                }
                let Some((role, target)) = plan else {
                    continue;
                };
                let domain = routes.domain(d);
                let peer = target.unwrap_or_else(|| {
                    let ip = slot.peer[d.index()].map_or(Ipv4Addr::UNSPECIFIED, |p| p.addr);
                    SocketAddrV4::new(ip, 0)
                });
                let r = Arc::clone(routes);
                let Some(legs) = &self.legs else {
                    return Err(LegError::Resources(std::io::Error::other(
                        "no stream legs on this gateway",
                    )));
                };
                let leg = legs.start(LegSpec {
                    label: format!("{} m{i} {d} tcp", self.label),
                    session,
                    domain: d,
                    role,
                    local: SocketAddrV4::new(domain.address, slot.ports[d.index()]),
                    peer,
                    within: Some(domain.clone()),
                    interface: Some(domain.interface.clone()),
                    framing: Box::new(Rfc4571),
                    max_payload: self.max_payload,
                    slots: DEFAULT_SLOTS,
                    connect_for: CONNECT_FOR,
                    on_close: Some(Box::new(move || {
                        let _ = r.request_end(session);
                    })),
                    close_grace: match role {
                        Role::Passive => self.close_grace.max(self.reconnect_window),
                        Role::Active => self.close_grace,
                    },
                    fallback_port: fallback.as_ref().map(|f| f.port),
                })?;
                slot.legs[d.index()] = Some(SlotLeg {
                    leg,
                    role,
                    peer,
                    fallback,
                });
            }
            // A passive leg started before its peer's SDP named an address learns it now.
            for d in DomainId::ALL {
                if let (Some(l), Some(p)) = (&slot.legs[d.index()], slot.peer[d.index()]) {
                    l.leg.expect_peer(p.addr);
                }
            }
        }
        Ok(retired)
    }
}
