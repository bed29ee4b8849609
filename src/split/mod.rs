//! The split appliance: two halves of one gateway joined by one bidirectional signaling link
//! and two one-way media links (see `docs/split.md`). [`signal`] carries the link face's
//! signaling between the halves.

pub mod signal;
