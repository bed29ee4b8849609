//! The stream routes a call's slots call for ([`CallMedia::wanted`]: RTP in the directions
//! the SDPs allow, RTCP beside it or muxed, into a TCP leg's sink where one receives) and
//! installing the difference ([`CallMedia::reconcile`]).

use std::net::SocketAddrV4;
use std::sync::Arc;

use crate::config::{DomainId, SourcePolicy};
use crate::routes::{Channel, RouteSpec, Routes};
use crate::signaling::sdp::Direction;
use crate::sink::EdgeSink;

use super::{CallMedia, MediaPeer};

fn sends(d: Direction) -> bool {
    matches!(d, Direction::SendRecv | Direction::SendOnly)
}

fn receives(d: Direction) -> bool {
    matches!(d, Direction::SendRecv | Direction::RecvOnly)
}

impl CallMedia {
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
                let validate = self.validate;
                let spec = |ingress: DomainId, off: u16, to: MediaPeer, from: MediaPeer, kind| {
                    let egress = ingress.other();
                    // RTP: what the receiver's SDP accepts. RTCP on RTP + 1: RTCP only.
                    // Muxed (RFC 5761): RTCP packets on the RTP route are checked as RTCP;
                    // the receiver's reports ("rtcp-rr" on the RTP port) are RTCP only,
                    // unless that way carries RTP too (sendrecv: the same route).
                    let reverse_sends = sends(from.direction) && receives(to.direction);
                    let rtcp_only = off == 1 || (kind == "rtcp-rr" && !reverse_sends);
                    let media = validate.map(|(enforce, policy)| crate::media::Rule {
                        enforce,
                        spec: if rtcp_only {
                            crate::media::StreamSpec::rtcp()
                        } else {
                            let mut c =
                                crate::signaling::media_spec::crossing(&to.spec, &from.spec);
                            c.rtcp_mux = kind != "rtp";
                            // `enforce`: only the formats the policy lets cross (the
                            // SDP keeps them all; a packet of another is refused as
                            // `payload_type`).
                            if enforce {
                                crate::signaling::media_spec::allowed(&c, &policy)
                            } else {
                                c
                            }
                        },
                        policy,
                    });
                    RouteSpec {
                        ingress,
                        port: slot.ports[ingress.index()] + off,
                        dest: SocketAddrV4::new(to.addr, to.port.saturating_add(off)),
                        egress_port: slot.ports[egress.index()] + off,
                        policy,
                        expected: Some(SocketAddrV4::new(from.addr, 0)),
                        rtp_only: rtp_only && off == 0,
                        label: format!("{} m{i} {kind}", self.label),
                        media,
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
}
