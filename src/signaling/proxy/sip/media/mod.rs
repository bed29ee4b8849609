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
//! failed) asks for the call's end: BYE both ways ([`Routes::request_end`]). A listening
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

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::{DomainId, SourcePolicy};
use crate::edge::{EdgeSink, Leg, LegState, Role};
use crate::routes::{RouteError, RouteSpec, Routes, SessionId, SessionKind};
use crate::signaling::sdp::{self, Direction, RewriteError, SetupEdit};

mod reconcile;

/// How long an active TCP leg keeps trying to connect to its peer.
const CONNECT_FOR: Duration = Duration::from_secs(10);
/// How long a TCP leg whose peer closed waits before the call ends: the close may be the
/// peer's half of an `a=connection:new` reconnect whose SDP is still on its way (the leg is
/// replaced meanwhile, or a passive one takes the peer's new connection).
const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// The shortest time between two reconnects of one side's leg that a peer's
/// `a=connection:new` may ask for; one asked sooner keeps the connection and is counted
/// in the leg's `renew_refused`.
const RENEW_MIN: Duration = Duration::from_secs(5);
/// A peer's SDP can trigger the refused-reconnect warning: at most one line per 5 s.
static RENEW_LOG: crate::logging::RateLimit = crate::logging::RateLimit::new(5000);

/// RFC 4145 `a=setup:` roles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setup {
    Active,
    Passive,
    ActPass,
    HoldConn,
}

impl Setup {
    pub fn parse(s: Option<&str>) -> Option<Setup> {
        match s?.to_ascii_lowercase().as_str() {
            "active" => Some(Setup::Active),
            "passive" => Some(Setup::Passive),
            "actpass" => Some(Setup::ActPass),
            "holdconn" => Some(Setup::HoldConn),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Setup::Active => "active",
            Setup::Passive => "passive",
            Setup::ActPass => "actpass",
            Setup::HoldConn => "holdconn",
        }
    }
}

/// One side's view of an `m=` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MediaPeer {
    pub addr: Ipv4Addr,
    pub port: u16,
    pub direction: Direction,
    pub rtcp_mux: bool,
    /// RTP over TCP (`TCP/RTP/AVP`).
    pub tcp: bool,
    /// Its `a=setup:`.
    pub setup: Option<Setup>,
    /// It wrote `a=connection:new`. RFC 4145 §5 reads an absent attribute as `new` too, but
    /// devices in the field omit it in hold/resume and session-refresh re-INVITEs that do
    /// not mean to reconnect: vgate reconnects only on an explicit `new` (or when the
    /// address or port the peer listens on changed).
    pub asks_new: bool,
}

/// The TCP leg vgate runs on one side of an `m=` line.
#[derive(Debug)]
pub struct SlotLeg {
    pub leg: Leg,
    pub role: Role,
    /// Active legs: where they connect.
    pub peer: SocketAddrV4,
    /// A replacing active leg's fallback port pair, from the registry, given back after
    /// the leg stopped (declared after `leg`, so dropped after it).
    pub fallback: Option<PortLease>,
}

/// A port pair a call took from the registry for one leg; given back when dropped (the
/// call's end gives it back anyway).
pub struct PortLease {
    routes: Arc<Routes>,
    session: SessionId,
    domain: DomainId,
    pub port: u16,
}

impl std::fmt::Debug for PortLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortLease")
            .field("domain", &self.domain)
            .field("port", &self.port)
            .finish()
    }
}

impl Drop for PortLease {
    fn drop(&mut self) {
        for p in [self.port, self.port + 1] {
            let _ = self.routes.release_port(self.session, self.domain, p);
        }
    }
}

/// One `m=` line: the gateway pair in each domain and each side's peer.
#[derive(Debug, Default)]
pub struct Slot {
    /// Gateway RTP port per domain (RTCP is +1), indexed by [`DomainId::index`].
    pub ports: [u16; 2],
    pub peer: [Option<MediaPeer>; 2],
    /// The side that described this line first (the offerer).
    pub offerer: Option<DomainId>,
    /// Whether each side speaks RTP over TCP: its own SDP's proto, or, before it has sent
    /// one, the proto vgate offered it.
    pub tcp: [bool; 2],
    /// The `a=setup:` vgate last wrote toward each side.
    pub written: [Option<Setup>; 2],
    /// vgate's TCP leg on each side.
    pub legs: [Option<SlotLeg>; 2],
    /// When each side's active leg last reconnected for `a=connection:new`.
    last_renew: [Option<Instant>; 2],
}

impl Slot {
    /// The role vgate plays on side `d` and, when active, where it connects; `None` while
    /// it cannot be known yet (or the side is not TCP).
    /// Whether `d`'s leg is connected and is the one [`Slot::leg_plan`] calls for (so it
    /// is kept).
    fn leg_connected_as_planned(&self, d: DomainId) -> bool {
        let Some(l) = &self.legs[d.index()] else {
            return false;
        };
        let have = (l.role, (l.role == Role::Active).then_some(l.peer));
        l.leg.counters().state() == LegState::Connected && self.leg_plan(d) == Some(have)
    }

    fn leg_plan(&self, d: DomainId) -> Option<(Role, Option<SocketAddrV4>)> {
        if !self.tcp[d.index()] {
            return None;
        }
        let passive = Some((Role::Passive, None));
        match self.peer[d.index()] {
            Some(p) => {
                let active = Some((Role::Active, Some(SocketAddrV4::new(p.addr, p.port))));
                match p.setup {
                    Some(Setup::Active) => passive,
                    Some(Setup::Passive) => active,
                    // Its offer left the choice to the answer vgate sent it.
                    Some(Setup::ActPass) => match self.written[d.index()] {
                        Some(Setup::Active) => active,
                        Some(Setup::Passive) => passive,
                        _ => None,
                    },
                    Some(Setup::HoldConn) => None,
                    // RFC 4145 §4: the default is active in an offer, passive in an answer.
                    None if self.offerer == Some(d) => passive,
                    None => active,
                }
            }
            // vgate offered this side and awaits its answer: listen at once if it may be
            // asked to (the answerer may connect before its answer arrives).
            None => match self.written[d.index()] {
                Some(Setup::Passive | Setup::ActPass) => passive,
                _ => None,
            },
        }
    }
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

fn sends(d: Direction) -> bool {
    matches!(d, Direction::SendRecv | Direction::SendOnly)
}

fn receives(d: Direction) -> bool {
    matches!(d, Direction::SendRecv | Direction::RecvOnly)
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
        }
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

    /// Writes each crossing TCP line's proto and `a=setup` for the receiving side and
    /// records the role written (see the module doc).
    fn transports(&mut self, parsed: &sdp::Sdp<'_>, from: DomainId, mut out: Vec<u8>) -> Vec<u8> {
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
}

#[cfg(test)]
mod tests;
