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
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::{DomainId, SourcePolicy};
use crate::routes::legs::{LegError, LegHandle, LegSpec, Legs, Role};
use crate::routes::{Channel, RouteError, RouteSpec, Routes, SessionId, SessionKind};
use crate::signaling::sdp::{self, Direction, RewriteError, SetupEdit};
use crate::sink::EdgeSink;
use crate::sink::DEFAULT_SLOTS;
use crate::stats::leg::LegState;
use crate::wire::framing::Rfc4571;

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
    pub leg: Box<dyn LegHandle>,
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
    /// Where TCP media legs start (`None`: nowhere; a TCP offer's leg then fails).
    legs: Option<Arc<dyn Legs>>,
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
            legs: None,
        }
    }

    /// TCP media legs start with `legs`.
    pub fn with_legs(mut self, legs: Option<Arc<dyn Legs>>) -> CallMedia {
        self.legs = legs;
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

    /// Starts, replaces or stops the TCP legs the slots call for; returns the legs replaced
    /// or stopped, for the caller to drop once the routes are re-pointed. `renew`: the
    /// lines whose SDP from `from` asked for a new connection.
    fn reconcile_legs(
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
                    close_grace: self.close_grace,
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
    fn reconcile(&mut self, routes: &Arc<Routes>, policy: SourcePolicy, rtp_only: bool) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn routes() -> crate::edge::tests::Loopback {
        crate::edge::tests::loopback_routes("46000-46199", "45000-45199")
    }

    fn sdp(addr: &str, port: u16, proto: &str, extra: &str) -> Vec<u8> {
        format!(
            "v=0\r\no=- 1 1 IN IP4 {addr}\r\ns=Play\r\nc=IN IP4 {addr}\r\nt=0 0\r\nm=video {port} {proto} 96\r\na=rtpmap:96 PS/90000\r\n{extra}y=0100000001\r\nf=\r\n"
        )
        .into_bytes()
    }

    #[test]
    fn tcp_offer_udp_answer_bridges_with_the_right_roles() {
        let routes = routes();
        let mut m = CallMedia::new("t".into(), 1472).with_legs(Some(routes.legs()));
        // The platform in B listens (passive) and offers TCP.
        let offer = sdp(
            "127.0.0.2",
            9000,
            "TCP/RTP/AVP",
            "a=recvonly\r\na=setup:passive\r\na=connection:new\r\n",
        );
        let to_a = m
            .cross(&routes, SourcePolicy::Strict, true, DomainId::B, &offer)
            .unwrap();
        let text = String::from_utf8(to_a).unwrap();
        assert!(text.contains("TCP/RTP/AVP 96"), "{text}");
        assert!(
            text.contains("a=setup:passive\r\na=connection:new\r\n"),
            "kept as offered"
        );
        assert!(text.contains("y=0100000001\r\nf=\r\n"));
        let slot = &m.slots[0];
        assert_eq!(
            slot.legs[0].as_ref().map(|l| l.role),
            Some(Role::Passive),
            "listens on A at once"
        );
        assert_eq!(
            slot.legs[1].as_ref().map(|l| l.role),
            Some(Role::Active),
            "connects to B's peer"
        );
        assert_eq!(routes.legs.len(), 2);
        // The device in A answers over UDP.
        let answer = sdp("127.0.0.1", 7000, "RTP/AVP", "a=sendonly\r\n");
        let to_b = m
            .cross(&routes, SourcePolicy::Strict, true, DomainId::A, &answer)
            .unwrap();
        let text = String::from_utf8(to_b).unwrap();
        assert!(
            text.contains("TCP/RTP/AVP 96"),
            "B keeps its transport: {text}"
        );
        assert!(
            text.contains("a=setup:active\r\na=connection:new\r\ny=0100000001"),
            "{text}"
        );
        assert!(!text.contains("127.0.0.1"));
        let slot = &m.slots[0];
        assert!(slot.legs[0].is_none(), "A is UDP now: its listener is gone");
        assert_eq!(routes.legs.len(), 1);
        assert_eq!(m.installed.len(), 1, "RTP only across a TCP side");
        let (spec, edge) = &m.installed[0];
        assert_eq!(
            (spec.ingress, spec.dest.to_string().as_str()),
            (DomainId::A, "127.0.0.2:9000")
        );
        assert!(edge.is_some(), "B's leg receives");
        m.close(&routes);
        assert_eq!(routes.legs.len(), 0);
        assert_eq!(routes.ports(DomainId::A).0, 0);
    }

    /// `body` (from [`sdp`]) with its `o=` version set to `version`.
    fn versioned(mut body: Vec<u8>, version: u32) -> Vec<u8> {
        let at = body.windows(7).position(|w| w == b"o=- 1 1").unwrap();
        body.splice(at..at + 7, format!("o=- 1 {version}").into_bytes());
        body
    }

    #[test]
    fn re_invites_keep_a_connected_leg_with_existing_and_reconnect_it_with_new() {
        let routes = routes();
        let mut m = CallMedia::new("t".into(), 1472).with_legs(Some(routes.legs()));
        // B's platform listens on loopback (this test's own listener).
        let listener = std::net::TcpListener::bind("127.0.0.2:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let b_offer = |version: u32, connection: &str| {
            let o = sdp(
                "127.0.0.2",
                port,
                "TCP/RTP/AVP",
                &format!("a=recvonly\r\na=setup:passive\r\na=connection:{connection}\r\n"),
            );
            versioned(o, version)
        };
        let a_sdp = |version: u32| {
            let s = sdp("127.0.0.1", 7000, "RTP/AVP", "a=sendonly\r\n");
            versioned(s, version)
        };
        let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
        m.cross(
            &routes,
            SourcePolicy::Strict,
            true,
            DomainId::B,
            &b_offer(1, "new"),
        )
        .unwrap();
        let to_b = m
            .cross(&routes, SourcePolicy::Strict, true, DomainId::A, &a_sdp(1))
            .unwrap();
        assert!(
            text(to_b).contains("a=setup:active\r\na=connection:new\r\n"),
            "nothing connected yet"
        );
        let (_conn, _) = listener.accept().unwrap();
        let counters = Arc::clone(m.slots[0].legs[1].as_ref().unwrap().leg.counters());
        let t = std::time::Instant::now();
        while counters.state() != LegState::Connected {
            assert!(t.elapsed() < Duration::from_secs(10), "B's leg connects");
            std::thread::sleep(Duration::from_millis(5));
        }
        // A's session refresh (a re-INVITE offer): B keeps its connection.
        let to_b = text(
            m.cross(&routes, SourcePolicy::Strict, true, DomainId::A, &a_sdp(2))
                .unwrap(),
        );
        assert!(
            to_b.contains("a=setup:active\r\na=connection:existing\r\n"),
            "{to_b}"
        );
        assert_eq!(to_b.matches("a=connection:").count(), 1, "{to_b}");
        m.cross(
            &routes,
            SourcePolicy::Strict,
            true,
            DomainId::B,
            &b_offer(2, "existing"),
        )
        .unwrap();
        // The same refresh body again after B answered: a new exchange, rewritten again.
        let again = text(
            m.cross(&routes, SourcePolicy::Strict, true, DomainId::A, &a_sdp(2))
                .unwrap(),
        );
        assert!(again.contains("a=connection:existing\r\n"), "{again}");
        // B's own re-INVITE asking for `existing`: answered `existing`; asking for `new`:
        // answered `new`.
        m.cross(
            &routes,
            SourcePolicy::Strict,
            true,
            DomainId::B,
            &b_offer(3, "existing"),
        )
        .unwrap();
        let to_b = text(
            m.cross(&routes, SourcePolicy::Strict, true, DomainId::A, &a_sdp(3))
                .unwrap(),
        );
        assert!(to_b.contains("a=connection:existing\r\n"), "{to_b}");
        assert_eq!(
            counters.connects.load(std::sync::atomic::Ordering::Relaxed),
            1,
            "`existing` kept the connection"
        );
        let first = m.slots[0].legs[1].as_ref().unwrap().leg.id();
        // B (listening) asks for `new`: RFC 4145 §5.1, a new connection. vgate's active leg
        // is replaced by one that connects again; the answer says `new`.
        m.cross(
            &routes,
            SourcePolicy::Strict,
            true,
            DomainId::B,
            &b_offer(4, "new"),
        )
        .unwrap();
        let to_b = text(
            m.cross(&routes, SourcePolicy::Strict, true, DomainId::A, &a_sdp(4))
                .unwrap(),
        );
        assert!(to_b.contains("a=connection:new\r\n"), "{to_b}");
        let second = m.slots[0].legs[1].as_ref().unwrap();
        assert_ne!(second.leg.id(), first, "a new leg");
        assert!(
            !routes.legs.list().iter().any(|l| l.id == first),
            "the old one closed"
        );
        listener.set_nonblocking(true).unwrap();
        let t = std::time::Instant::now();
        let _conn2 = loop {
            match listener.accept() {
                Ok((c, _)) => break c,
                Err(_) if t.elapsed() < Duration::from_secs(10) => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Err(e) => panic!("vgate never connected again: {e}"),
            }
        };
        let counters = Arc::clone(second.leg.counters());
        while counters.state() != LegState::Connected {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the new leg connects"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        // The same offer again (unchanged, so not a new one): the connection stays.
        let second = second.leg.id();
        m.cross(
            &routes,
            SourcePolicy::Strict,
            true,
            DomainId::B,
            &b_offer(4, "new"),
        )
        .unwrap();
        assert_eq!(m.slots[0].legs[1].as_ref().unwrap().leg.id(), second);
        m.close(&routes);
    }

    /// A call whose B side listens on this test's own listener (`a=setup:passive`), with
    /// vgate's active leg connected to it: the call, the listener, the connection accepted.
    fn connected_to_listening_b(
        routes: &crate::edge::tests::Loopback,
        close_grace: Duration,
        renew_min: Duration,
    ) -> (CallMedia, std::net::TcpListener, std::net::TcpStream) {
        let mut m = CallMedia::new("t".into(), 1472).with_legs(Some(routes.legs()));
        (m.close_grace, m.renew_min) = (close_grace, renew_min);
        let listener = std::net::TcpListener::bind("127.0.0.2:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let offer = b_listening(port, 1, "a=connection:new\r\n");
        m.cross(routes, SourcePolicy::Strict, true, DomainId::B, &offer)
            .unwrap();
        let answer = sdp("127.0.0.1", 7000, "RTP/AVP", "a=sendonly\r\n");
        m.cross(routes, SourcePolicy::Strict, true, DomainId::A, &answer)
            .unwrap();
        let (conn, _) = listener.accept().unwrap();
        let counters = Arc::clone(m.slots[0].legs[1].as_ref().unwrap().leg.counters());
        wait_for("B's leg connects", || {
            counters.state() == LegState::Connected
        });
        (m, listener, conn)
    }

    /// B's offer (it listens on `port`), `o=` version `version`, with `connection` lines.
    fn b_listening(port: u16, version: u32, connection: &str) -> Vec<u8> {
        let extra = format!("a=recvonly\r\na=setup:passive\r\n{connection}");
        versioned(sdp("127.0.0.2", port, "TCP/RTP/AVP", &extra), version)
    }

    fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
        let t = std::time::Instant::now();
        while !f() {
            assert!(t.elapsed() < Duration::from_secs(20), "{what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn b_leg_id(m: &CallMedia) -> u64 {
        m.slots[0].legs[1].as_ref().unwrap().leg.id()
    }

    #[test]
    fn a_peer_close_before_its_new_connection_sdp_does_not_end_the_call() {
        let routes = routes();
        let hour = Duration::from_secs(3600);
        let (mut m, listener, conn) = connected_to_listening_b(&routes, hour, hour);
        let session = m.session.unwrap();
        let first = b_leg_id(&m);
        let counters = Arc::clone(m.slots[0].legs[1].as_ref().unwrap().leg.counters());
        // B closes the old connection before its `a=connection:new` re-INVITE arrives.
        drop(conn);
        wait_for("the leg sees the close", || {
            counters.state() != LegState::Connected
        });
        assert!(!routes.end_requested(session), "no BYE for a reconnect");
        assert!(!m.leg_closed(), "the call is not ended by the close");
        let port = listener.local_addr().unwrap().port();
        m.cross(
            &routes,
            SourcePolicy::Strict,
            true,
            DomainId::B,
            &b_listening(port, 2, "a=connection:new\r\n"),
        )
        .unwrap();
        assert_ne!(b_leg_id(&m), first, "replaced");
        assert!(
            !routes.end_requested(session),
            "the replaced leg told nobody"
        );
        let (_conn2, _) = listener.accept().unwrap();
        let counters = Arc::clone(m.slots[0].legs[1].as_ref().unwrap().leg.counters());
        wait_for("the new leg connects", || {
            counters.state() == LegState::Connected
        });
        m.close(&routes);

        // A close that no new SDP follows ends the call once the grace has passed.
        let (m, _listener, conn) =
            connected_to_listening_b(&routes, Duration::from_millis(50), hour);
        let session = m.session.unwrap();
        drop(conn);
        wait_for("the call ends", || {
            routes.end_requested(session) && m.leg_closed()
        });
    }

    #[test]
    fn only_an_explicit_connection_new_reconnects_and_not_too_often() {
        let routes = routes();
        let hour = Duration::from_secs(3600);
        let (mut m, listener, _conn) = connected_to_listening_b(&routes, hour, hour);
        let port = listener.local_addr().unwrap().port();
        let first = b_leg_id(&m);
        let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
        // A changed SDP (a hold, a version bump) without `a=connection`: kept, and the answer
        // to it says so.
        m.cross(
            &routes,
            SourcePolicy::Strict,
            true,
            DomainId::B,
            &b_listening(port, 2, ""),
        )
        .unwrap();
        assert_eq!(b_leg_id(&m), first, "no a=connection: no reconnect");
        let answer = versioned(sdp("127.0.0.1", 7000, "RTP/AVP", "a=sendonly\r\n"), 2);
        let to_b = text(
            m.cross(&routes, SourcePolicy::Strict, true, DomainId::A, &answer)
                .unwrap(),
        );
        assert!(to_b.contains("a=connection:existing\r\n"), "{to_b}");
        // An explicit `new`: reconnected.
        m.cross(
            &routes,
            SourcePolicy::Strict,
            true,
            DomainId::B,
            &b_listening(port, 3, "a=connection:new\r\n"),
        )
        .unwrap();
        let second = b_leg_id(&m);
        assert_ne!(second, first, "`new` reconnects");
        let (_conn2, from) = listener.accept().unwrap();
        // From the gateway port, or (the old connection lingering) from the port pair the
        // call took from the registry for it: never an ephemeral port.
        let slot = &m.slots[0];
        let lease = slot.legs[1].as_ref().unwrap().fallback.as_ref().unwrap();
        assert!(
            [slot.ports[1], lease.port].contains(&from.port()),
            "{from} not from {} or {}",
            slot.ports[1],
            lease.port
        );
        let (lease_port, taken) = (lease.port, routes.ports(DomainId::B).0);
        // `new` again within `renew_min`: refused, counted, the connection kept.
        m.cross(
            &routes,
            SourcePolicy::Strict,
            true,
            DomainId::B,
            &b_listening(port, 4, "a=connection:new\r\n"),
        )
        .unwrap();
        assert_eq!(b_leg_id(&m), second, "bounded");
        let refused = m.slots[0].legs[1].as_ref().unwrap().leg.counters();
        assert_eq!(refused.renew_refused.load(Relaxed), 1, "counted");
        assert_eq!(refused.refused.load(Relaxed), 0, "not a refused connection");
        // The third `new`, once allowed again: the second leg's lease goes back with it.
        m.renew_min = Duration::ZERO;
        m.cross(
            &routes,
            SourcePolicy::Strict,
            true,
            DomainId::B,
            &b_listening(port, 5, "a=connection:new\r\n"),
        )
        .unwrap();
        let slot = &m.slots[0];
        let lease = slot.legs[1].as_ref().unwrap().fallback.as_ref().unwrap();
        assert_ne!(lease.port, lease_port);
        assert_eq!(routes.ports(DomainId::B).0, taken, "one lease at a time");
        m.close(&routes);
        assert_eq!(routes.ports(DomainId::B).0, 0, "all given back");
    }

    #[test]
    fn a_holdconn_offer_is_answered_holdconn_and_opens_no_leg() {
        let routes = routes();
        let mut m = CallMedia::new("t".into(), 1472).with_legs(Some(routes.legs()));
        let offer = sdp(
            "127.0.0.2",
            9004,
            "TCP/RTP/AVP",
            "a=recvonly\r\na=setup:holdconn\r\na=connection:new\r\n",
        );
        m.cross(&routes, SourcePolicy::Strict, true, DomainId::B, &offer)
            .unwrap();
        let answer = sdp("127.0.0.1", 7004, "RTP/AVP", "a=sendonly\r\n");
        let to_b = m
            .cross(&routes, SourcePolicy::Strict, true, DomainId::A, &answer)
            .unwrap();
        let text = String::from_utf8(to_b).unwrap();
        assert!(text.contains("TCP/RTP/AVP 96"), "{text}");
        assert!(text.contains("a=setup:holdconn\r\n"), "{text}");
        assert!(!text.contains("a=setup:passive"), "{text}");
        assert!(m.slots[0].legs.iter().all(Option::is_none));
        assert_eq!(routes.legs.len(), 0, "no listener for a held connection");
        m.close(&routes);
    }

    #[test]
    fn the_split_link_face_always_gets_udp() {
        let routes = routes();
        // A half whose link face is B: the device in A offers TCP (it listens).
        let mut m = CallMedia::new("t".into(), 1472)
            .with_legs(Some(routes.legs()))
            .with_link_face(Some(DomainId::B));
        let offer = sdp(
            "127.0.0.1",
            7010,
            "TCP/RTP/AVP",
            "a=sendonly\r\na=setup:passive\r\na=connection:new\r\n",
        );
        let to_face = String::from_utf8(
            m.cross(&routes, SourcePolicy::Strict, true, DomainId::A, &offer)
                .unwrap(),
        )
        .unwrap();
        assert!(to_face.contains(" RTP/AVP 96"), "{to_face}");
        assert!(
            !to_face.contains("TCP")
                && !to_face.contains("a=setup")
                && !to_face.contains("a=connection"),
            "{to_face}"
        );
        assert!(m.slots[0].legs[1].is_none(), "no leg on the link face");
        // The other half answers over UDP; the device's side connects to it.
        let answer = sdp("127.0.0.2", 9010, "RTP/AVP", "a=recvonly\r\n");
        let to_a = String::from_utf8(
            m.cross(&routes, SourcePolicy::Strict, true, DomainId::B, &answer)
                .unwrap(),
        )
        .unwrap();
        assert!(
            to_a.contains("TCP/RTP/AVP 96") && to_a.contains("a=setup:active"),
            "{to_a}"
        );
        assert_eq!(
            m.slots[0].legs[0].as_ref().map(|l| l.role),
            Some(Role::Active)
        );
        assert_eq!(m.installed.len(), 1);
        assert!(m.installed[0].1.is_none(), "the face side is UDP");
        m.close(&routes);
        // TCP from the link face is refused: it would ride the signaling link.
        let mut m = CallMedia::new("t2".into(), 1472)
            .with_legs(Some(routes.legs()))
            .with_link_face(Some(DomainId::B));
        let offer = sdp("127.0.0.2", 9012, "TCP/RTP/AVP", "a=recvonly\r\n");
        let Err(MediaError::Refuse { code, warning, .. }) =
            m.cross(&routes, SourcePolicy::Strict, true, DomainId::B, &offer)
        else {
            panic!("TCP from the link face must be refused");
        };
        assert_eq!(code, 488);
        assert!(warning.contains("link face"), "{warning}");
        assert_eq!(routes.legs.len(), 0);
    }

    #[test]
    fn udp_offer_tcp_answer_and_tcp_both_sides() {
        let routes = routes();
        let mut m = CallMedia::new("t".into(), 1472).with_legs(Some(routes.legs()));
        let offer = sdp("127.0.0.2", 9002, "RTP/AVP", "a=recvonly\r\n");
        let to_a = m
            .cross(&routes, SourcePolicy::Strict, true, DomainId::B, &offer)
            .unwrap();
        assert!(String::from_utf8(to_a).unwrap().contains("RTP/AVP 96"));
        assert_eq!(routes.legs.len(), 0);
        // The device answers TCP, active (it will connect).
        let answer = sdp(
            "127.0.0.1",
            7002,
            "TCP/RTP/AVP",
            "a=sendonly\r\na=setup:active\r\na=connection:new\r\n",
        );
        let to_b = String::from_utf8(
            m.cross(&routes, SourcePolicy::Strict, true, DomainId::A, &answer)
                .unwrap(),
        )
        .unwrap();
        assert!(to_b.contains("m=video") && to_b.contains(" RTP/AVP 96"));
        assert!(
            !to_b.contains("a=setup") && !to_b.contains("a=connection"),
            "{to_b}"
        );
        assert_eq!(
            m.slots[0].legs[0].as_ref().map(|l| l.role),
            Some(Role::Passive)
        );
        assert_eq!(m.installed.len(), 1);
        assert!(m.installed[0].1.is_none(), "B is UDP");
        m.close(&routes);

        // TCP both sides, actpass offer: the answer's role decides both legs.
        let mut m = CallMedia::new("t2".into(), 1472).with_legs(Some(routes.legs()));
        let offer = sdp(
            "127.0.0.2",
            9004,
            "TCP/RTP/AVP",
            "a=recvonly\r\na=setup:actpass\r\na=connection:new\r\n",
        );
        m.cross(&routes, SourcePolicy::Strict, true, DomainId::B, &offer)
            .unwrap();
        assert_eq!(
            m.slots[0].legs[0].as_ref().map(|l| l.role),
            Some(Role::Passive)
        );
        assert!(
            m.slots[0].legs[1].is_none(),
            "B's role waits for the answer"
        );
        let answer = sdp(
            "127.0.0.1",
            7004,
            "TCP/RTP/AVP",
            "a=sendonly\r\na=setup:passive\r\na=connection:new\r\n",
        );
        let to_b = String::from_utf8(
            m.cross(&routes, SourcePolicy::Strict, true, DomainId::A, &answer)
                .unwrap(),
        )
        .unwrap();
        assert!(
            to_b.contains("a=setup:passive\r\n"),
            "crosses byte for byte"
        );
        let roles = m.slots[0]
            .legs
            .each_ref()
            .map(|l| l.as_ref().map(|l| l.role));
        assert_eq!(roles, [Some(Role::Active), Some(Role::Passive)]);
        assert!(m.installed[0].1.is_some());
        m.close(&routes);
        assert_eq!(routes.legs.len(), 0);
    }
}
