//! A call's `m=` slots as the state store holds them ([`SlotRecord`], in the SIP proxy's call
//! records): the gateway ports of each line, each side's media peer as its SDP announced it
//! (address, port, direction, RTCP mux, transport, `a=setup` role, the formats and SSRC
//! negotiated) and the roles vgate wrote. A copy of the call restored from them rewrites a
//! re-INVITE's SDP onto the same gateway ports, and installs the same routes, as the
//! original would have. TCP legs are not in it: their connections do not move (a TCP side
//! is set up again by its peer's next SDP).

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

use crate::config::DomainId;
use crate::routes::spec_record::SpecRecord;
use crate::signaling::sdp::Direction;

use super::{CallMedia, MediaPeer, Setup, Slot};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotRecord {
    /// The gateway RTP port in domain A and in domain B (0: none yet).
    pub ports: [u16; 2],
    pub peer: [Option<PeerRecord>; 2],
    /// `a` / `b`: the side that offered the line first.
    pub offerer: Option<String>,
    pub tcp: [bool; 2],
    /// The `a=setup:` vgate last wrote toward each side.
    pub written: [Option<String>; 2],
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerRecord {
    pub addr: Ipv4Addr,
    pub port: u16,
    pub direction: String,
    pub rtcp_mux: bool,
    pub tcp: bool,
    pub setup: Option<String>,
    pub asks_new: bool,
    pub spec: SpecRecord,
}

fn domain(s: &str) -> Option<DomainId> {
    DomainId::ALL.into_iter().find(|d| d.name() == s)
}

impl PeerRecord {
    fn of(p: &MediaPeer) -> PeerRecord {
        PeerRecord {
            addr: p.addr,
            port: p.port,
            direction: p.direction.as_str().into(),
            rtcp_mux: p.rtcp_mux,
            tcp: p.tcp,
            setup: p.setup.map(|s| s.as_str().into()),
            asks_new: p.asks_new,
            spec: SpecRecord::of(&p.spec),
        }
    }

    fn peer(&self) -> Result<MediaPeer, String> {
        Ok(MediaPeer {
            addr: self.addr,
            port: self.port,
            direction: Direction::parse(&self.direction)
                .ok_or_else(|| format!("bad media direction {:?}", self.direction))?,
            rtcp_mux: self.rtcp_mux,
            tcp: self.tcp,
            setup: match &self.setup {
                None => None,
                Some(s) => Some(Setup::parse(Some(s)).ok_or_else(|| format!("bad a=setup {s:?}"))?),
            },
            asks_new: self.asks_new,
            spec: self.spec.spec()?,
        })
    }
}

impl SlotRecord {
    pub fn of(s: &Slot) -> SlotRecord {
        SlotRecord {
            ports: s.ports,
            peer: s.peer.map(|p| p.as_ref().map(PeerRecord::of)),
            offerer: s.offerer.map(|d| d.name().to_string()),
            tcp: s.tcp,
            written: s.written.map(|w| w.map(|w| w.as_str().to_string())),
        }
    }

    /// The slot back (no TCP leg); `Err` says what this build cannot read.
    pub fn slot(&self) -> Result<Slot, String> {
        let peer = |i: usize| self.peer[i].as_ref().map(PeerRecord::peer).transpose();
        let written = |i: usize| -> Result<Option<Setup>, String> {
            match &self.written[i] {
                None => Ok(None),
                Some(w) => Setup::parse(Some(w))
                    .map(Some)
                    .ok_or_else(|| format!("bad a=setup {w:?}")),
            }
        };
        Ok(Slot {
            ports: self.ports,
            peer: [peer(0)?, peer(1)?],
            offerer: match &self.offerer {
                None => None,
                Some(d) => Some(domain(d).ok_or_else(|| format!("bad domain {d:?}"))?),
            },
            tcp: self.tcp,
            written: [written(0)?, written(1)?],
            ..Slot::default()
        })
    }
}

impl CallMedia {
    /// The call's slots as records.
    pub fn slot_records(&self) -> Vec<SlotRecord> {
        self.slots.iter().map(SlotRecord::of).collect()
    }

    /// Takes the slots of a copied call (its routes are the copied session's). Refused once
    /// an SDP of the call crossed here (the slots are this node's own then, newer than any
    /// copy).
    /// `Ok(false)`: kept its own; `Err`: a record this build cannot read (the slots unchanged).
    pub fn restore_slots(&mut self, recs: &[SlotRecord]) -> Result<bool, String> {
        if self.cache.iter().any(Option::is_some)
            || self
                .slots
                .iter()
                .any(|s| s.legs.iter().any(Option::is_some))
        {
            return Ok(false);
        }
        self.slots = recs
            .iter()
            .map(SlotRecord::slot)
            .collect::<Result<_, _>>()?;
        Ok(true)
    }
}
