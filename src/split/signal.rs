//! The signaling link between the halves (placeholder: the signaling agent's branch replaces
//! this file). Only the checked settings of `[split.signal]` live here for now.

use std::net::SocketAddr;

/// `[split.signal]`: the bidirectional signaling link to the peer half.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignalLinkConfig {
    /// Interface of the signaling link.
    pub interface: String,
    /// Our address on it.
    pub local: SocketAddr,
    /// The peer half's address on it.
    pub peer: SocketAddr,
    /// Shared key (hex, at least 32 bytes once decoded).
    pub key: String,
    pub heartbeat_ms: u64,
    pub dead_after_ms: u64,
}
