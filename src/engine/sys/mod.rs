//! The unsafe edge of the engines: system calls the safe crates do not wrap. Every `unsafe`
//! block here carries a `// SAFETY:` comment naming the invariant it relies on; everything
//! outside `sys` modules is `#![deny(unsafe_code)]`.

pub mod afpacket;
pub mod afxdp;
pub mod bpf;
pub mod mmsg;

/// CPU time consumed by the calling thread, in nanoseconds.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY:
    // - `ts` is a valid, writable timespec on our stack; the clock id is a constant the
    //   kernel always supports.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if r != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `poll(2)` over `fds` for at most `timeout_ms`: the number of entries whose `revents` are
/// set (EINTR is returned as an error, for the caller to treat as "nothing").
pub fn poll_fds(fds: &mut [libc::pollfd], timeout_ms: i32) -> std::io::Result<usize> {
    // SAFETY:
    // - `fds` is a live, writable array of `fds.len()` pollfd structs, written by the kernel
    //   (`revents`) during the call only; an fd that is not open comes back as POLLNVAL.
    let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// `epoll_wait` as a plain system call (`epoll_pwait` with no signal mask, which is the
/// same call), returning the number of events written to the front of `events`. glibc's
/// wrapper (and so nix's `Epoll::wait`) is a cancellation point: in a multi-threaded
/// process every call also runs `__pthread_enable_asynccancel`/`_disable_` (about 45
/// instructions), which a worker that is never cancelled does not need.
pub fn epoll_wait(
    epfd: std::os::fd::BorrowedFd<'_>,
    events: &mut [nix::sys::epoll::EpollEvent],
    timeout_ms: i32,
) -> Result<usize, nix::errno::Errno> {
    use std::os::fd::AsRawFd;
    let max = events.len().min(i32::MAX as usize);
    // SAFETY:
    // - `EpollEvent` is `#[repr(transparent)]` over `libc::epoll_event`, so `events` is a
    //   writable array of `max` epoll_events, exclusively borrowed for the call; the kernel
    //   writes at most `max` of them.
    // - A null signal mask makes epoll_pwait behave as epoll_wait (the size is then unused).
    let n = unsafe {
        libc::syscall(
            libc::SYS_epoll_pwait,
            libc::c_long::from(epfd.as_raw_fd()),
            events.as_mut_ptr().cast::<libc::epoll_event>(),
            max as libc::c_long,
            libc::c_long::from(timeout_ms),
            std::ptr::null::<libc::sigset_t>(),
            8 as libc::c_long,
        )
    };
    if n < 0 {
        Err(nix::errno::Errno::last())
    } else {
        Ok(n as usize)
    }
}
