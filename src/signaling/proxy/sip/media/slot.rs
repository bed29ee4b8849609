//! The state of one `m=` line of a call ([`Slot`]): each side's peer as its SDP announced
//! it ([`MediaPeer`], its RFC 4145 [`Setup`] role), the gateway ports, and the TCP leg vgate
//! runs on a side ([`SlotLeg`], with the registry port a replacing leg may borrow,
//! [`PortLease`]). [`Slot::leg_plan`] says which leg a side calls for.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::time::Instant;

use crate::config::DomainId;
use crate::routes::legs::{LegHandle, Role};
use crate::routes::{Routes, SessionId};
use crate::signaling::sdp::Direction;
use crate::stats::leg::LegState;

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
    /// The formats and `y=` SSRC its `m=` line describes, for media validation.
    pub spec: crate::media::StreamSpec,
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
    pub(super) routes: Arc<Routes>,
    pub(super) session: SessionId,
    pub(super) domain: DomainId,
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
    pub(super) last_renew: [Option<Instant>; 2],
}

impl Slot {
    /// Whether `d`'s leg is connected and is the one [`Slot::leg_plan`] calls for (so it
    /// is kept).
    pub(super) fn leg_connected_as_planned(&self, d: DomainId) -> bool {
        let Some(l) = &self.legs[d.index()] else {
            return false;
        };
        let have = (l.role, (l.role == Role::Active).then_some(l.peer));
        l.leg.counters().state() == LegState::Connected && self.leg_plan(d) == Some(have)
    }

    /// The role vgate plays on side `d` and, when active, where it connects; `None` while
    /// it cannot be known yet (or the side is not TCP).
    pub(super) fn leg_plan(&self, d: DomainId) -> Option<(Role, Option<SocketAddrV4>)> {
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
