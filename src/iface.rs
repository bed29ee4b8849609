//! Tying a socket to one network interface (`SO_BINDTODEVICE`), the one place vgate does it.
//!
//! Linux accepts a packet for any local address on any interface, so a socket bound to the
//! gateway's address in one domain would also take packets for that address arriving from
//! the other domain: an IP path across the boundary. Tied to its interface, a socket only
//! sees what arrives there. Callers never go on with a socket that could not be tied
//! (isolation never degrades quietly); each wraps the error with what the operator should
//! check for that socket.

use std::os::fd::AsFd;

use nix::sys::socket::{setsockopt, sockopt};

/// Ties `sock` to `interface`. The error is the kernel's (no such interface, no
/// `CAP_NET_RAW`).
pub fn bind_to_device<F: AsFd>(sock: &F, interface: &str) -> nix::Result<()> {
    setsockopt(
        sock,
        sockopt::BindToDevice,
        &std::ffi::OsString::from(interface),
    )
}
