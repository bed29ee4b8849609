//! The media side of one call: gateway ports per `m=` line, the peers' media addresses as
//! each SDP announced them, and the stream routes that follow from both.
//!
//! Each `m=` line with a port gets an RTP/RTCP pair in **both** domains when it first
//! appears (`ports[A]`, `ports[B]`): the peer in a domain sends to, and receives from, the
//! gateway pair of its own domain. An SDP from domain X is rewritten to show the pair of
//! the other domain (that is where the peer reading it must send), and it records X's
//! address, port and direction for that line. Once both sides are known the routes are
//! recomputed ([`CallMedia::wanted`]) and the difference installed: RTP in the direction(s)
//! the two `a=` directions allow (sendonly/recvonly as each side sees it), RTCP sender
//! reports alongside, receiver reports the other way. So GB/T 28181 playback (device in A
//! `sendonly`) installs the forward channel, talkback/broadcast (the device in A
//! `recvonly`) the reverse one.
//!
//! RTCP: without `a=rtcp-mux` on both sides, sender reports go on RTP + 1 in the media
//! direction and receiver reports on RTP + 1 the other way. With `a=rtcp-mux` on both
//! sides (RFC 5761) RTCP rides the RTP ports: the sender's reports share the RTP route,
//! and the receiver-report route is the reverse-direction route on the same ports (the
//! receiver's RTP port in its domain to the sender's RTP port). Those muxed routes are not
//! `rtp_only` (the RTP-only check would drop the RTCP they must carry); the expected
//! source still applies. A one-sided `a=rtcp-mux` is not negotiated mux: both parties
//! then use RTP + 1, and so does vgate.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;

use crate::config::{DomainId, SourcePolicy};
use crate::routes::{Channel, RouteError, RouteSpec, Routes, SessionId, SessionKind};
use crate::signaling::sdp::{self, Direction, RewriteError};

/// One side's view of an `m=` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MediaPeer {
    pub addr: Ipv4Addr,
    pub port: u16,
    pub direction: Direction,
    pub rtcp_mux: bool,
}

/// One `m=` line: the gateway pair in each domain and each side's peer.
#[derive(Debug, Clone, Default)]
pub struct Slot {
    /// Gateway RTP port per domain (RTCP is +1), indexed by [`DomainId::index`].
    pub ports: [u16; 2],
    pub peer: [Option<MediaPeer>; 2],
}

/// Why an SDP could not cross.
#[derive(Debug)]
pub enum MediaError {
    /// Refuse the offer with this status, reason and Warning text.
    Refuse {
        code: u16,
        reason: &'static str,
        warning: String,
    },
}

/// The media state of a call.
pub struct CallMedia {
    pub session: Option<SessionId>,
    pub slots: Vec<Slot>,
    pub installed: Vec<RouteSpec>,
    /// Per sending domain: the last body received and what it was rewritten to, so a
    /// retransmitted message (same body) gets the same SDP and allocates nothing.
    cache: [Option<(Vec<u8>, Vec<u8>)>; 2],
    pub label: String,
}

/// Whether an `m=` line carries RTP over TCP (GB/T 28181 `TCP/RTP/AVP`, RFC 4571).
pub fn is_tcp_media(proto: &str) -> bool {
    proto.to_ascii_uppercase().contains("TCP")
}

fn sends(d: Direction) -> bool {
    matches!(d, Direction::SendRecv | Direction::SendOnly)
}

fn receives(d: Direction) -> bool {
    matches!(d, Direction::SendRecv | Direction::RecvOnly)
}

impl CallMedia {
    pub fn new(label: String) -> CallMedia {
        CallMedia {
            session: None,
            slots: Vec::new(),
            installed: Vec::new(),
            cache: [None, None],
            label,
        }
    }

    /// Rewrites an SDP body sent from domain `from` for the other domain, allocating
    /// ports for new `m=` lines and updating the routes.
    pub fn cross(
        &mut self,
        routes: &Arc<Routes>,
        policy: SourcePolicy,
        rtp_only: bool,
        from: DomainId,
        body: &[u8],
    ) -> Result<Vec<u8>, MediaError> {
        if let Some((seen, out)) = &self.cache[from.index()] {
            if seen.as_slice() == body {
                return Ok(out.clone());
            }
        }
        let parsed = sdp::parse(body).map_err(|e| MediaError::Refuse {
            code: 488,
            reason: "Not Acceptable Here",
            warning: format!("399 vgate \"{e}\""),
        })?;
        if let Some(m) = parsed
            .media
            .iter()
            .find(|m| m.port != 0 && is_tcp_media(m.proto))
        {
            return Err(MediaError::Refuse {
                code: 488,
                reason: "Not Acceptable Here",
                warning: format!(
                    "399 vgate \"{} media over TCP ({}) is not relayed by this gateway; offer RTP/AVP over UDP\"",
                    m.kind, m.proto
                ),
            });
        }
        let session = match self.session {
            Some(s) => s,
            None => {
                let s = routes.open_session(SessionKind::Sip, self.label.clone());
                self.session = Some(s);
                s
            }
        };
        let to = from.other();
        let slots = &mut self.slots;
        let out = sdp::rewrite(body, routes.domain(to).address, |i, m| {
            if m.port == 0 {
                if let Some(slot) = slots.get_mut(i) {
                    slot.peer[from.index()] = None;
                }
                return Ok(None);
            }
            while slots.len() <= i {
                slots.push(Slot::default());
            }
            let Some(slot) = slots.get_mut(i) else {
                return Ok(None);
            };
            if slot.ports[0] == 0 {
                let a = routes.alloc_pair(session, DomainId::A)?;
                let b = routes.alloc_pair(session, DomainId::B)?;
                slot.ports = [a, b];
            }
            slot.peer[from.index()] =
                m.connection
                    .filter(|ip| !ip.is_unspecified())
                    .map(|addr| MediaPeer {
                        addr,
                        port: m.port,
                        direction: m.direction,
                        rtcp_mux: m.rtcp_mux,
                    });
            Ok::<_, RouteError>(Some(slot.ports[to.index()]))
        });
        let out = match out {
            Ok(o) => o,
            Err(RewriteError::Ports {
                source: RouteError::Ports { .. },
                ..
            }) => {
                return Err(MediaError::Refuse {
                    code: 503,
                    reason: "Service Unavailable",
                    warning: "399 vgate \"no free media ports; try again later\"".into(),
                })
            }
            Err(e) => {
                return Err(MediaError::Refuse {
                    code: 488,
                    reason: "Not Acceptable Here",
                    warning: format!("399 vgate \"{e}\""),
                })
            }
        };
        self.reconcile(routes, policy, rtp_only);
        self.cache[from.index()] = Some((body.to_vec(), out.clone()));
        Ok(out)
    }

    /// The routes the current slots call for.
    pub fn wanted(&self, policy: SourcePolicy, rtp_only: bool) -> Vec<RouteSpec> {
        let mut v: Vec<RouteSpec> = Vec::new();
        let mut push = |spec: RouteSpec| {
            if !v
                .iter()
                .any(|s| s.ingress == spec.ingress && s.port == spec.port)
            {
                v.push(spec);
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
    fn reconcile(&mut self, routes: &Arc<Routes>, policy: SourcePolicy, rtp_only: bool) {
        let Some(session) = self.session else {
            return;
        };
        let want = self.wanted(policy, rtp_only);
        self.installed.retain(|spec| {
            if want.contains(spec) {
                return true;
            }
            let _ = routes.remove_route(Channel::from_ingress(spec.ingress), spec.port);
            false
        });
        for spec in want {
            if self.installed.contains(&spec) {
                continue;
            }
            match routes.add_route(session, spec.clone()) {
                Ok(_) => self.installed.push(spec),
                Err(e) => {
                    static LOG: crate::logging::RateLimit = crate::logging::RateLimit::new(10_000);
                    if let Some(suppressed) = LOG.check(crate::clock::now_ms()) {
                        tracing::warn!(route = %spec.label, suppressed, "SIP media route not installed: {e}");
                    }
                }
            }
        }
    }

    /// The newest packet time over the installed routes (ms since the epoch).
    pub fn last_media_ms(&self, routes: &Routes) -> Option<u64> {
        self.installed
            .iter()
            .filter_map(|s| routes.lookup(Channel::from_ingress(s.ingress), s.port))
            .filter_map(|r| r.last_seen_ms())
            .max()
    }

    /// Ends the media session: routes removed, ports given back.
    pub fn close(&mut self, routes: &Routes) {
        if let Some(s) = self.session.take() {
            let _ = routes.close_session(s);
        }
        self.installed.clear();
        self.slots.clear();
        self.cache = [None, None];
    }
}
