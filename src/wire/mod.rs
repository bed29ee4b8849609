//! Zero-copy views over packet bytes, smoltcp-style: `new_checked` validates lengths once, then
//! no accessor can panic. The data path parses untrusted bytes only through these views.

pub mod rtp;

/// Why bytes are not the packet they claim to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("packet shorter than its headers claim")]
    Truncated,
    #[error("not an RTP version 2 packet")]
    NotRtp,
}
