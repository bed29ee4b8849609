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
//!
//! RTP over TCP (GB/T 28181 `TCP/RTP/AVP`, RFC 4571; RFC 4145 `a=setup`, `a=connection`):
//! each side's transport is what its own SDP says — the offer crosses with the offerer's
//! transport, and the answerer may answer over UDP or TCP whatever was offered; vgate bridges
//! (all four combinations). On a TCP side vgate ends the TCP connection itself at its gateway
//! RTP port in that domain with a stream leg ([`crate::edge`]): **passive** (it listens)
//! when that side's peer is `active` (or says nothing in an offer, RFC 4145's default),
//! **active** (it connects to the address and port the peer's SDP names) when the peer is
//! `passive`; an `actpass` offer takes the role of the answer. When both sides are TCP the
//! `a=setup`/`a=connection` lines cross byte for byte, so each peer sees the role the other
//! asked for and vgate plays the complement on each side. When only one side is TCP, vgate
//! writes that side's proto and role itself (`passive` unless the peer asked to listen) and
//! strips them from the UDP side. Only RTP crosses a TCP side (no RTCP routes on it). The
//! routes are the same as for UDP: a leg's packets enter the route of its gateway port, and
//! a route whose receiver is a leg hands its packets to the leg's sink. A leg that ends
//! (peer closed and `CLOSE_GRACE` (2 s) passed with no new connection or new SDP, connect
//! failed) asks for the call's end: BYE both ways ([`Routes::request_end`]). A passive leg
//! (the peer is the TCP client) waits the route's `tcp_media_reconnect` (default 10 s)
//! instead, listening on its gateway port: GB/T 28181-2022 Annex D has the client reconnect
//! at least 3 times at least 1 s apart before it gives up; only the SDP's address is taken. A listening
//! peer's changed SDP with an explicit `a=connection:new` makes vgate's active leg
//! reconnect (at most once per `RENEW_MIN` (5 s); no `a=connection` keeps the connection,
//! against RFC 4145's default, as devices in the field mean it), from its gateway port or a
//! registry port pair taken for the new leg while the old connection lingers.
//!
//! In a half of the split appliance (`[split]`) the link face is never a TCP side: media
//! between the halves must cross on the one-way media links, and a TCP leg toward the link
//! face would be a stream over the signaling link. So an offer toward the link face always
//! crosses as `RTP/AVP` (UDP, `a=setup`/`a=connection` stripped) and each half terminates
//! the TCP leg of its own domain; an SDP from the link face is UDP (the other half wrote it).
//!
//! This folder: `slot` (one `m=` line: peers, roles, legs), `legs` (RTP over TCP: the
//! transport written toward each side and the legs it calls for), `install` (the routes the
//! slots call for); this file crosses an SDP ([`CallMedia::cross`]) and ends the call's media.

use std::sync::Arc;
use std::time::Duration;

use crate::config::{DomainId, SourcePolicy};
use crate::routes::legs::Legs;
use crate::routes::{Channel, RouteError, RouteSpec, Routes, SessionId, SessionKind};
use crate::signaling::sdp::{self, RewriteError};
use crate::sink::EdgeSink;

mod install;
mod legs;
mod record;
mod slot;
#[cfg(test)]
mod tests;

pub use record::{PeerRecord, SlotRecord};
pub use slot::{MediaPeer, PortLease, Setup, Slot, SlotLeg};

/// How long a TCP leg whose peer closed waits before the call ends: the close may be the
/// peer's half of an `a=connection:new` reconnect whose SDP is still on its way (the leg is
/// replaced meanwhile, or a passive one takes the peer's new connection).
const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// The shortest time between two reconnects of one side's leg that a peer's
/// `a=connection:new` may ask for; one asked sooner keeps the connection and is counted
/// in the leg's `renew_refused`.
const RENEW_MIN: Duration = Duration::from_secs(5);

/// How a refusal's Warning text starts when media validation refused the SDP
/// ([`MediaError::is_media_validation`]).
pub const MEDIA_VALIDATION: &str = "media validation";

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

impl MediaError {
    /// Whether media validation (`enforce`) refused the SDP: it negotiates no format the
    /// policy lets cross.
    pub fn is_media_validation(&self) -> bool {
        let MediaError::Refuse { warning, .. } = self;
        warning.starts_with(&format!("399 vgate \"{MEDIA_VALIDATION}:"))
    }
}

/// The media state of a call.
pub struct CallMedia {
    pub session: Option<SessionId>,
    pub slots: Vec<Slot>,
    /// The routes installed, with the sink of the leg that receives them, if any.
    pub installed: Vec<(RouteSpec, Option<Arc<EdgeSink>>)>,
    /// Per sending domain: the last body received and what it was rewritten to, so a
    /// retransmitted message (same body) gets the same SDP and allocates nothing.
    cache: [Option<(Vec<u8>, Vec<u8>)>; 2],
    /// The side whose SDP crossed last: an SDP from the other side answers it; one from
    /// the same side again is a retransmission (or a new offer).
    last_from: Option<DomainId>,
    pub label: String,
    /// `engine.max_payload`: the longest packet a TCP leg puts on a channel.
    max_payload: usize,
    /// The split appliance's link face: that side is always UDP (see the module doc).
    link_face: Option<DomainId>,
    /// [`CLOSE_GRACE`] and [`RENEW_MIN`] (tests set their own).
    close_grace: Duration,
    renew_min: Duration,
    /// A passive leg's wait for its peer's reconnect (`tcp_media_reconnect`, GB/T 28181
    /// Annex D); active legs wait [`CLOSE_GRACE`].
    reconnect_window: Duration,
    /// Where TCP media legs start (`None`: nowhere; a TCP offer's leg then fails).
    legs: Option<Arc<dyn Legs>>,
    /// Media validation of the call's RTP routes: `(enforce, policy)`; `None`: off.
    pub(super) validate: Option<(bool, crate::media::Policy)>,
}

/// Whether an `m=` line carries RTP over TCP (GB/T 28181 `TCP/RTP/AVP`, RFC 4571).
pub fn is_tcp_media(proto: &str) -> bool {
    proto.to_ascii_uppercase().contains("TCP")
}

/// Whether vgate bridges this TCP proto: RTP over plain TCP, RFC 4571 framing.
fn tcp_supported(proto: &str) -> bool {
    matches!(
        proto.to_ascii_uppercase().as_str(),
        "TCP/RTP/AVP" | "RTP/AVP/TCP"
    )
}

impl CallMedia {
    pub fn new(label: String, max_payload: usize) -> CallMedia {
        CallMedia {
            session: None,
            slots: Vec::new(),
            installed: Vec::new(),
            cache: [None, None],
            last_from: None,
            label,
            max_payload,
            link_face: None,
            close_grace: CLOSE_GRACE,
            renew_min: RENEW_MIN,
            reconnect_window: crate::config::TCP_MEDIA_RECONNECT,
            legs: None,
            validate: None,
        }
    }

    /// Validates the media of the call's RTP routes against what the SDPs negotiated
    /// (`mode` off: not validated).
    pub fn with_media_validation(
        mut self,
        mode: crate::config::MediaMode,
        policy: crate::media::Policy,
    ) -> CallMedia {
        let policy = crate::media::Policy {
            strip: mode == crate::config::MediaMode::Strip,
            ..policy
        };
        self.validate =
            (mode != crate::config::MediaMode::Off).then_some((mode.enforces(), policy));
        self
    }

    /// TCP media legs start with `legs`.
    pub fn with_legs(mut self, legs: Option<Arc<dyn Legs>>) -> CallMedia {
        self.legs = legs;
        self
    }

    /// A passive leg whose peer closed keeps the call `window` for the peer's reconnect
    /// (never less than [`CLOSE_GRACE`]).
    pub fn with_reconnect_window(mut self, window: Duration) -> CallMedia {
        self.reconnect_window = window;
        self
    }

    /// In a half of the split appliance: `face` (the link face) always gets UDP media.
    pub fn with_link_face(mut self, face: Option<DomainId>) -> CallMedia {
        self.link_face = face;
        self
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
        // A retransmission gets the same SDP. The same body after the other side spoke is
        // a new exchange (a session refresh): rewritten again, as the legs stand now.
        if let Some((seen, out)) = &self.cache[from.index()] {
            if self.last_from == Some(from) && seen.as_slice() == body {
                return Ok(out.clone());
            }
        }
        let parsed = sdp::parse(body).map_err(|e| MediaError::Refuse {
            code: 488,
            reason: "Not Acceptable Here",
            warning: format!("399 vgate \"{e}\""),
        })?;
        if let Some(m) = parsed.media.iter().find(|m| {
            m.port != 0
                && is_tcp_media(m.proto)
                && (!tcp_supported(m.proto) || m.port_count.is_some_and(|c| c > 1))
        }) {
            return Err(MediaError::Refuse {
                code: 488,
                reason: "Not Acceptable Here",
                warning: format!(
                    "399 vgate \"{} media over TCP ({}) is not relayed by this gateway; offer TCP/RTP/AVP (RFC 4571) or RTP/AVP over UDP\"",
                    m.kind, m.proto
                ),
            });
        }
        if self.link_face == Some(from) {
            if let Some(m) = parsed
                .media
                .iter()
                .find(|m| m.port != 0 && is_tcp_media(m.proto))
            {
                return Err(MediaError::Refuse {
                    code: 488,
                    reason: "Not Acceptable Here",
                    warning: format!(
                        "399 vgate \"{} media over TCP ({}) from the split link face: the other half must offer RTP/AVP (UDP) toward the link; run the same vgate version on both halves\"",
                        m.kind, m.proto
                    ),
                });
            }
        }
        if let Some((true, policy)) = self.validate {
            // `enforce`: a line none of whose formats may cross would set up routes that
            // drop every packet; the call is refused instead, saying which codec.
            if let Some(why) = parsed
                .media
                .iter()
                .filter(|m| m.port != 0)
                .find_map(|m| crate::signaling::media_spec::refusal(m, &policy))
            {
                return Err(MediaError::Refuse {
                    code: 488,
                    reason: "Not Acceptable Here",
                    warning: format!("399 vgate \"{MEDIA_VALIDATION}: {why}\""),
                });
            }
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
        let to_face = self.link_face == Some(to);
        // An SDP that differs from the side's last one is a new offer or answer (RFC 3264:
        // an unchanged one changes nothing, not even the connection).
        let changed = self.cache[from.index()]
            .as_ref()
            .is_none_or(|(seen, _)| seen.as_slice() != body);
        let slots = &mut self.slots;
        // The lines whose (changed) SDP asks for a new connection (RFC 4145 §5.1
        // `a=connection:new`) while vgate's leg on that side is in place.
        let mut renew: Vec<usize> = Vec::new();
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
            let tcp = is_tcp_media(m.proto);
            slot.offerer.get_or_insert(from);
            slot.tcp[from.index()] = tcp;
            if slot.peer[to.index()].is_none() {
                // An offer to `to`: it crosses with the offerer's transport, except toward
                // the split link face, which is always UDP.
                slot.tcp[to.index()] = tcp && !to_face;
            }
            slot.peer[from.index()] =
                m.connection
                    .filter(|ip| !ip.is_unspecified())
                    .map(|addr| MediaPeer {
                        addr,
                        port: m.port,
                        direction: m.direction,
                        rtcp_mux: m.rtcp_mux,
                        tcp,
                        setup: Setup::parse(m.setup),
                        asks_new: m
                            .tcp_connection
                            .is_some_and(|c| c.eq_ignore_ascii_case("new")),
                        spec: crate::signaling::media_spec::media_spec(m),
                    });
            if changed
                && tcp
                && slot.legs[from.index()].is_some()
                && slot.peer[from.index()].is_some_and(|p| p.asks_new)
            {
                renew.push(i);
            }
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
        let out = self.transports(&parsed, from, out);
        let retired = match self.reconcile_legs(routes, from, &renew) {
            Ok(r) => r,
            Err(e) => {
                return Err(MediaError::Refuse {
                    code: 503,
                    reason: "Service Unavailable",
                    warning: format!("399 vgate \"{e}\""),
                })
            }
        };
        self.reconcile(routes, policy, rtp_only);
        // Only now, with the routes pointing at the new legs, do the replaced ones stop:
        // no engine offers to a closed sink meanwhile.
        drop(retired);
        self.cache[from.index()] = Some((body.to_vec(), out.clone()));
        self.last_from = Some(from);
        Ok(out)
    }

    /// Whether one of the call's TCP media legs has ended by itself (peer closed, connect
    /// failed): the call ends with it.
    pub fn leg_closed(&self) -> bool {
        self.slots
            .iter()
            .flat_map(|s| s.legs.iter().flatten())
            .any(|l| l.leg.counters().state() == crate::stats::leg::LegState::Closed)
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
