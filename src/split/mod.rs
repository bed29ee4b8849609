//! The split appliance: one half of a gateway whose two halves are joined only by one-way
//! media links and a signaling link (see `docs/split.md`).
//!
//! A half is the single-host gateway with one of its domains replaced by the **link face**:
//! half `a` keeps domain a and turns domain b into the face (its address is our face
//! address, its only network the peer's face address); half `b` mirrors it. Routes whose
//! destination is the peer's face address are not sent with a socket: the engine's worker
//! hands each datagram to its [`link::LinkTx`], which frames it with a [`header`] and
//! [`fec`] and sends it down the outgoing one-way link. The incoming link is read by its own
//! pinned worker ([`link::HalfLinks::start_receiver`]), which checks, repairs and delivers each
//! datagram to the link face as if it came from `(peer face, source port)` on gateway port
//! `destination port`: the ordinary route lookup, source checks and egress follow.
//!
//! Owns: the `[split]` settings, the link header, FEC, link send/receive and the link
//! counters. Must not touch: the route tables (it only looks up), signaling (the agent in
//! [`signal`]).

pub mod link;
pub mod signal;

use std::net::{Ipv4Addr, SocketAddrV4};

use crate::config::DomainId;
pub use crate::link::fec::Fec;
pub use crate::stats::link::LinkCounters;
pub use link::SplitStats;

/// Which half this process is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Half {
    /// Device side: joins domain a and the links.
    A,
    /// User side: joins the links and domain b.
    B,
}

impl Half {
    pub fn name(self) -> &'static str {
        match self {
            Half::A => "a",
            Half::B => "b",
        }
    }

    /// The domain that is the link face in this half.
    pub fn link_face(self) -> DomainId {
        match self {
            Half::A => DomainId::B,
            Half::B => DomainId::A,
        }
    }
}

impl std::fmt::Display for Half {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One one-way link as configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkConfig {
    /// The interface the link is on (one end of the one-way cable).
    pub interface: String,
    /// Our address and UDP port on the link.
    pub local: SocketAddrV4,
    /// The peer half's address and UDP port on the link: where we send (outgoing), the only
    /// source we accept (incoming).
    pub peer: SocketAddrV4,
    /// The peer's MAC (outgoing link only): installed as a permanent neighbour entry so the
    /// kernel never asks for it.
    pub peer_mac: Option<[u8; 6]>,
    /// FEC: `None` off, or k data + m repair per block. Both halves must agree per link.
    pub fec: Option<Fec>,
    /// Incoming link only: the CPU its receive worker is pinned to (default: the engine's
    /// last worker CPU).
    pub cpu: Option<usize>,
    /// Incoming link only: datagrams are handed on in the sender's order, one waiting at
    /// most this long for a missing earlier one (0: handed on as they arrive; the default
    /// with FEC off).
    pub reorder_ms: u64,
    /// Outgoing link only: the longest datagram sent down the link, cut into as many frames
    /// as it needs ([`frag`]); longer ones are dropped as `oversize`.
    pub max_datagram: usize,
}

/// `[split]`: this process is one half.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitConfig {
    pub half: Half,
    /// The peer half's face address (the only network of our link-face domain).
    pub peer_face: Ipv4Addr,
    pub out_link: LinkConfig,
    pub in_link: LinkConfig,
    pub signal: signal::SignalLink,
}

impl SplitConfig {
    pub fn link_face(&self) -> DomainId {
        self.half.link_face()
    }
}
