//! Bindings to libpfring for vgate's PF_RING engines, and a safe wrapper over them.
//!
//! Built **without** the `pfring` feature (the default) this crate is empty: [`AVAILABLE`] is
//! `false`, its build script reports `found=0`, and `vgate` says plainly that its PF_RING
//! engines are absent. Neither PF_RING nor libclang is needed.
//!
//! Built **with** it, `build.rs` finds `pfring.h` and `linux/pf_ring.h` (`PFRING_DIR`, then
//! `PFRING_INCLUDE_DIR`/`PFRING_LIB_DIR`, then `/usr/local` and `/usr`) and bindgen writes
//! [`ffi`]: an allowlist of the `pfring_*` functions, types and constants used here, layout
//! assertions kept, `__pfring` opaque, `pfring_pkthdr` packed as in C. The functions are not
//! linked: they are members of [`ffi::PfRing`], resolved from `libpfring.so` when
//! [`Library::load`] runs. A binary built with the feature therefore starts on machines
//! without PF_RING (its PF_RING engines then fail with "libpfring.so not found"), and it never
//! carries PF_RING's ZC object, which is linked into libpfring under ntop's licence and must
//! not be redistributed.
//!
//! # The contract the wrapper keeps (PF_RING's `pfring.h`, `pfcount_multichannel.c`)
//!
//! - One ring per thread: zero-copy receive is not reentrant, so [`Ring`] is `Send` but not
//!   `Sync`, and every call that touches the ring takes `&mut self`.
//! - A received [`Packet`] points into the ring's slot, valid until the next receive: it
//!   borrows the ring, so the borrow checker forbids a second `recv` while it lives.
//! - `pfring_pkthdr` is packed: its fields are copied out by value, never referenced.
//! - Call order: open (one ring per queue, `dev@q`) → direction, socket mode, watermark →
//!   enable → receive on one pinned thread.
//! - `pfring_open` failing with errno 97 (`EAFNOSUPPORT`) means the kernel has no PF_RING
//!   socket family: `pf_ring.ko` is not loaded. [`Error::ModuleNotLoaded`] says exactly that.
#![cfg_attr(not(feature = "pfring"), no_std)]

/// Whether this build carries the PF_RING bindings (the `pfring` feature, headers found).
pub const AVAILABLE: bool = cfg!(feature = "pfring");

/// What bindgen generated from `pfring.h` (see the crate doc for what is in it).
#[cfg(feature = "pfring")]
#[allow(
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    dead_code,
    unused_qualifications,
    clippy::all,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc
)]
pub mod ffi {
    include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
}

#[cfg(feature = "pfring")]
mod ring;

#[cfg(feature = "pfring")]
pub use ring::{flags, Direction, Error, Library, Packet, Ring, SocketMode, Stats};
