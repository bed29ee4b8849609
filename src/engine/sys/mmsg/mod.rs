//! Batched UDP receive and send (`recvmmsg`/`sendmmsg`) into caller-owned, reused buffers,
//! quinn-udp style: one system call per batch, `EINTR` retried in one place, no allocation
//! after construction.
//!
//! The `mmsghdr`s point into boxed slices owned by the same struct. Boxed slices never move
//! their contents, so the pointers stay valid however the struct itself is moved.

use std::mem::zeroed;
use std::net::SocketAddrV4;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Room for the `SO_RXQ_OVFL` counter (and any other small control message).
const CTRL_LEN: usize = 64;

fn sockaddr_v4(a: SocketAddrV4) -> libc::sockaddr_in {
    // SAFETY:
    // - sockaddr_in is plain old data; all-zero is a valid value (and the padding must be 0).
    let mut s: libc::sockaddr_in = unsafe { zeroed() };
    s.sin_family = libc::AF_INET as libc::sa_family_t;
    s.sin_port = a.port().to_be();
    s.sin_addr.s_addr = u32::from(*a.ip()).to_be();
    s
}

/// `recvmmsg` or `sendmmsg` (`nr`) as a plain system call, returning what the call returns
/// (-1 with `errno` set on failure). glibc's wrappers are cancellation points: in a
/// multi-threaded process each call also runs `__pthread_enable_asynccancel` and
/// `__pthread_disable_asynccancel` (about 45 instructions per call, two calls per batch
/// here), which the workers never need (no thread is ever cancelled).
///
/// # Safety
/// - `hdrs` points to `len` valid `mmsghdr`s whose buffers, names and control buffers are
///   valid for the call (writable for `recvmmsg`), and `fd` is a live descriptor.
unsafe fn raw_mmsg(
    nr: libc::c_long,
    fd: BorrowedFd<'_>,
    hdrs: *mut libc::mmsghdr,
    len: usize,
    flags: libc::c_int,
) -> isize {
    // SAFETY:
    // - The caller's contract covers the pointers; the remaining arguments are plain values
    //   (the timeout of recvmmsg is null: none), passed as the kernel's `long`s.
    unsafe {
        libc::syscall(
            nr,
            libc::c_long::from(fd.as_raw_fd()),
            hdrs,
            len as libc::c_long,
            libc::c_long::from(flags),
            std::ptr::null_mut::<libc::timespec>(),
        ) as isize
    }
}

mod frame;
mod raw;
mod recv;
mod send;
mod slice;
#[cfg(test)]
mod tests;

pub use frame::{FrameBatch, FrameScope, FrameStatus};
pub use raw::{raw_udp_socket, send_raw_udp_one};
pub use recv::RecvBatch;
pub use send::{SendBatch, SendOutcome};
pub use slice::{SliceBatch, SliceScope};

/// Waits up to `ms` milliseconds for `fd` to accept more data.
fn wait_writable(fd: BorrowedFd<'_>, ms: i32) {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY:
    // - `p` is one valid pollfd on our stack for the duration of the call.
    unsafe {
        libc::poll(&mut p, 1, ms);
    }
}
