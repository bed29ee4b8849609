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
