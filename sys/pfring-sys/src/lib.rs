//! Bindings to libpfring for vgate's PF_RING engines.
//!
//! This crate is a workspace member so that the layout is final; in this version it is empty:
//! built without the `pfring` feature it exposes nothing and its build script reports that
//! PF_RING was not found, so `vgate` says plainly that its PF_RING engines are absent.
#![no_std]

/// Whether this build carries the PF_RING bindings.
pub const AVAILABLE: bool = false;
