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

pub mod fec;
pub mod frag;
pub mod header;
pub mod link;
pub mod reorder;
pub mod signal;

use std::net::{Ipv4Addr, SocketAddrV4};

use crate::config::DomainId;
pub use fec::Fec;
pub use link::{LinkCounters, SplitStats};

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

/// Formats a MAC as `aa:bb:cc:dd:ee:ff`.
pub fn mac_string(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut out = [0u8; 6];
    let mut parts = s.split(':');
    for b in out.iter_mut() {
        let p = parts.next()?;
        if p.len() != 2 {
            return None;
        }
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs() {
        let m = parse_mac("02:00:0a:FF:00:01").unwrap();
        assert_eq!(mac_string(&m), "02:00:0a:ff:00:01");
        for bad in [
            "",
            "02:00:0a:ff:00",
            "02:00:0a:ff:00:01:02",
            "2:00:0a:ff:00:01",
            "zz:00:0a:ff:00:01",
        ] {
            assert!(parse_mac(bad).is_none(), "{bad}");
        }
    }
}
