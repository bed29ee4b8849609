//! Turning what both SDPs say into what runs: the TCP legs the slots call for, the routes
//! wanted, installing the difference, and closing it all at the call's end.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use super::{receives, sends, CallMedia, MediaPeer, PortLease, SlotLeg, CONNECT_FOR, RENEW_LOG};
use crate::config::{DomainId, SourcePolicy};
use crate::edge::framing::Rfc4571;
use crate::edge::sink::DEFAULT_SLOTS;
use crate::edge::{EdgeSink, Leg, LegSpec, Role};
use crate::routes::{Channel, RouteSpec, Routes};

impl CallMedia {
    /// Starts, replaces or stops the TCP legs the slots call for; returns the legs replaced
    /// or stopped, for the caller to drop once the routes are re-pointed. `renew`: the
    /// lines whose SDP from `from` asked for a new connection.
    pub(super) fn reconcile_legs(
        &mut self,
        routes: &Arc<Routes>,
        from: DomainId,
        renew: &[usize],
    ) -> Result<Vec<SlotLeg>, crate::edge::EdgeError> {
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
                let leg = Leg::start(
                    LegSpec {
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
                        close_grace: self.close_grace,
                        fallback_port: fallback.as_ref().map(|f| f.port),
                    },
                    Arc::clone(routes),
                )?;
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

    /// The routes the current slots call for.
    pub fn wanted(
        &self,
        policy: SourcePolicy,
        rtp_only: bool,
    ) -> Vec<(RouteSpec, Option<Arc<EdgeSink>>)> {
        let mut v: Vec<(RouteSpec, Option<Arc<EdgeSink>>)> = Vec::new();
        let mut push_edge = |spec: RouteSpec, edge: Option<Arc<EdgeSink>>| {
            if !v
                .iter()
                .any(|(s, _)| s.ingress == spec.ingress && s.port == spec.port)
            {
                v.push((spec, edge));
            }
        };
        for (i, slot) in self.slots.iter().enumerate() {
            for src in DomainId::ALL {
                let dst = src.other();
                let (Some(s), Some(d)) = (slot.peer[src.index()], slot.peer[dst.index()]) else {
                    continue;
                };
                if !(sends(s.direction) && receives(d.direction)) {
                    continue;
                }
                let spec = |ingress: DomainId, off: u16, to: MediaPeer, from: MediaPeer, kind| {
                    let egress = ingress.other();
                    RouteSpec {
                        ingress,
                        port: slot.ports[ingress.index()] + off,
                        dest: SocketAddrV4::new(to.addr, to.port.saturating_add(off)),
                        egress_port: slot.ports[egress.index()] + off,
                        policy,
                        expected: Some(SocketAddrV4::new(from.addr, 0)),
                        rtp_only: rtp_only && off == 0,
                        label: format!("{} m{i} {kind}", self.label),
                    }
                };
                if slot.tcp[src.index()] || slot.tcp[dst.index()] {
                    // RTP over TCP on a side: RTP only, and when the receiver is vgate's
                    // leg, into the leg's sink (no leg yet: no route yet).
                    let edge = match &slot.legs[dst.index()] {
                        Some(l) => Some(Arc::clone(l.leg.sink())),
                        None if slot.tcp[dst.index()] => continue,
                        None => None,
                    };
                    push_edge(spec(src, 0, d, s, "rtp"), edge);
                    continue;
                }
                let mut push = |spec: RouteSpec| push_edge(spec, None);
                if s.rtcp_mux && d.rtcp_mux {
                    // RFC 5761: RTCP shares the RTP port. The sender's reports ride the
                    // RTP route; the receiver's reports come back on the same ports
                    // the other way (its own RTP port to the sender's RTP port). Neither
                    // route can be RTP-only: RTCP is legitimately on it.
                    let mut rtp = spec(src, 0, d, s, "rtp+rtcp");
                    rtp.rtp_only = false;
                    push(rtp);
                    push(spec(dst, 0, s, d, "rtcp-rr"));
                } else {
                    // Not muxed (mux counts only when both sides say so, RFC 5761
                    // §5.1.1): RTCP on RTP + 1 both ways.
                    push(spec(src, 0, d, s, "rtp"));
                    push(spec(src, 1, d, s, "rtcp"));
                    push(spec(dst, 1, s, d, "rtcp-rr"));
                }
            }
        }
        v
    }

    /// Removes routes no longer wanted, adds the missing ones.
    pub(super) fn reconcile(&mut self, routes: &Arc<Routes>, policy: SourcePolicy, rtp_only: bool) {
        let Some(session) = self.session else {
            return;
        };
        let want = self.wanted(policy, rtp_only);
        let same = |a: &(RouteSpec, Option<Arc<EdgeSink>>),
                    b: &(RouteSpec, Option<Arc<EdgeSink>>)| {
            a.0 == b.0
                && match (&a.1, &b.1) {
                    (None, None) => true,
                    (Some(x), Some(y)) => Arc::ptr_eq(x, y),
                    _ => false,
                }
        };
        self.installed.retain(|have| {
            if want.iter().any(|w| same(w, have)) {
                return true;
            }
            let spec = &have.0;
            let _ = routes.remove_route(Channel::from_ingress(spec.ingress), spec.port);
            false
        });
        for w in want {
            if self.installed.iter().any(|have| same(have, &w)) {
                continue;
            }
            let (spec, edge) = w;
            match routes.add_edge_route(session, spec.clone(), edge.clone()) {
                Ok(_) => self.installed.push((spec, edge)),
                Err(e) => {
                    static LOG: crate::logging::RateLimit = crate::logging::RateLimit::new(10_000);
                    if let Some(suppressed) = LOG.check(crate::clock::now_ms()) {
                        tracing::warn!(route = %spec.label, suppressed, "SIP media route not installed: {e}");
                    }
                }
            }
        }
    }

    /// Whether one of the call's TCP media legs has ended by itself (peer closed, connect
    /// failed): the call ends with it.
    pub fn leg_closed(&self) -> bool {
        self.slots
            .iter()
            .flat_map(|s| s.legs.iter().flatten())
            .any(|l| l.leg.counters().state() == crate::edge::LegState::Closed)
    }

    /// The newest packet time over the installed routes (ms since the epoch).
    pub fn last_media_ms(&self, routes: &Routes) -> Option<u64> {
        self.installed
            .iter()
            .filter_map(|(s, _)| routes.lookup(Channel::from_ingress(s.ingress), s.port))
            .filter_map(|r| r.last_seen_ms())
            .max()
    }

    /// Ends the media session: routes removed, ports given back.
    pub fn close(&mut self, routes: &Routes) {
        // The routes go first, so no engine offers to a leg whose counters were already
        // summed; then the legs stop (and let go of the egress sockets they send from);
        // then the ports are given back (a port's close waits for its socket's last user).
        for (spec, _) in &self.installed {
            let _ = routes.remove_route(Channel::from_ingress(spec.ingress), spec.port);
        }
        for slot in &mut self.slots {
            slot.legs = [None, None];
        }
        if let Some(s) = self.session.take() {
            let _ = routes.close_session(s);
        }
        self.installed.clear();
        self.slots.clear();
        self.cache = [None, None];
    }
}
