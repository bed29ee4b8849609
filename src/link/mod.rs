//! The split link's protocol, sans I/O: forward error correction over blocks of link frames
//! ([`fec`]), the receiver's reorder window ([`reorder`]), the cutting and joining of
//! datagrams longer than a frame ([`frag`]), the frames' authentication ([`auth`]) and the
//! receiver's replay window ([`replay`]). The frame layout itself (header, lanes, sizes) is
//! [`crate::wire::link`]; sending and receiving frames is the engines' (`engine::link`).
//!
//! Owns: bytes in, frames and counts out. Must not touch: sockets, threads, clocks (times
//! are arguments), the route tables.

pub mod auth;
pub mod fec;
pub mod frag;
pub mod reorder;
pub mod replay;

pub use fec::Fec;
