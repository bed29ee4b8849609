//! Batched send straight out of a [`RecvBatch`] ([`SendBatch`]), and the `sendmmsg` core
//! every batch shares: UDP GSO packing, full-queue waits, the GSO fallback.

use super::recv::RecvBatch;
use super::{raw_mmsg, sockaddr_v4, wait_writable};
use std::io;
use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendOutcome {
    pub sent: usize,
    pub sent_bytes: usize,
    /// Refused because the socket's send queue stayed full.
    pub queue_full: usize,
    /// Refused by the kernel for another reason.
    pub errors: usize,
    /// The last error other than a full queue, for a (rate-limited) log line.
    pub last_error: Option<i32>,
}

/// Send headers for forwarding datagrams straight out of a [`RecvBatch`] (no copy).
pub struct SendBatch {
    iov: Box<[libc::iovec]>,
    hdrs: Box<[libc::mmsghdr]>,
    ctrl: Box<[SegCtrl]>,
    dest: Box<libc::sockaddr_in>,
}

// SAFETY:
// - Between calls the headers hold only pointers into `dest` (owned) and stale iovec
//   pointers that are rewritten before every use; nothing is shared with another thread.
unsafe impl Send for SendBatch {}

impl SendBatch {
    pub fn new(batch: usize) -> SendBatch {
        let batch = batch.max(1);
        SendBatch {
            // SAFETY:
            // - iovec and mmsghdr are plain C structs; all-zero is valid and is overwritten
            //   before each send.
            iov: (0..batch).map(|_| unsafe { zeroed() }).collect(),
            // SAFETY: as above.
            hdrs: (0..batch).map(|_| unsafe { zeroed() }).collect(),
            ctrl: vec![[0u64; 4]; batch].into_boxed_slice(),
            dest: Box::new(sockaddr_v4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0))),
        }
    }

    /// Sends datagrams `which` of `rx` to `dest` from socket `fd`. Waits at most once, about a
    /// millisecond, for room in a full send queue; what still does not fit is counted as
    /// `queue_full`, not retried: a relay must not stall every other stream for one.
    pub fn send(
        &mut self,
        fd: BorrowedFd<'_>,
        rx: &RecvBatch,
        which: &[u16],
        dest: SocketAddrV4,
    ) -> SendOutcome {
        let k = which.len().min(self.hdrs.len());
        *self.dest = sockaddr_v4(dest);
        for (j, &i) in which[..k].iter().enumerate() {
            let p = rx.payload(usize::from(i));
            self.iov[j] = libc::iovec {
                iov_base: p.as_ptr() as *mut libc::c_void,
                iov_len: p.len(),
            };
        }
        let m = pack(
            &mut self.iov[..k],
            &mut self.hdrs,
            &mut self.ctrl,
            &mut self.dest,
            true,
        );
        // SAFETY:
        // - `pack` pointed hdrs[..m] at `self.dest`, at runs of iov[..k] and at their own
        //   control buffers; the iovecs point into `rx`, which is borrowed immutably for this
        //   whole call.
        unsafe { send_all(fd, &mut self.hdrs[..m]) }
    }
}

/// Room for one `UDP_SEGMENT` control message (`CMSG_SPACE(2)`), 8-byte aligned.
pub(super) type SegCtrl = [u64; 4];
/// UDP GSO: datagrams per message at most (the kernel's `UDP_MAX_SEGMENTS` is 64 or more)…
const GSO_MAX_SEGS: usize = 64;
/// …and bytes per message (a UDP length field).
const GSO_MAX_BYTES: usize = 65_000;
/// Larger datagrams are sent alone: a segment must fit a 1500-byte MTU.
const GSO_MAX_SIZE: usize = 1472;
/// Cleared, and said once, when the kernel refuses a GSO message (no checksum offload on
/// the egress device, a smaller MTU): from then on every datagram is its own message.
/// `VGATE_UDP_GSO=off` in the environment clears it at start (for A/B benchmarks).
pub(super) static GSO: AtomicBool = AtomicBool::new(true);
static GSO_ENV: std::sync::Once = std::sync::Once::new();

/// Turns the datagrams `iov` (in order, all to `dest`) into messages `hdrs[..m]`, returned
/// `m`: with `want_gso` (the stack engine's [`SendBatch`]; not [`SliceBatch`], see its
/// `send`), a run of datagrams of one size (the run's last may be shorter) becomes one message
/// with a `UDP_SEGMENT` control message — one trip through the kernel's UDP/IP output path
/// and one route lookup for the run instead of one per datagram, split into the same
/// datagrams at the device (or by the NIC); the receiver sees exactly what it would have
/// seen. Without GSO every datagram is its own message.
pub(super) fn pack(
    iov: &mut [libc::iovec],
    hdrs: &mut [libc::mmsghdr],
    ctrl: &mut [SegCtrl],
    dest: &mut libc::sockaddr_in,
    want_gso: bool,
) -> usize {
    GSO_ENV.call_once(|| {
        if std::env::var("VGATE_UDP_GSO").as_deref() == Ok("off") {
            GSO.store(false, Relaxed);
        }
    });
    let gso = want_gso && GSO.load(Relaxed);
    let k = iov.len();
    let mut m = 0;
    let mut i = 0;
    while i < k {
        let size = iov[i].iov_len;
        let mut j = i + 1;
        if gso && size <= GSO_MAX_SIZE && size > 0 {
            let mut bytes = size;
            while j < k
                && j - i < GSO_MAX_SEGS
                && bytes + iov[j].iov_len <= GSO_MAX_BYTES
                && iov[j].iov_len <= size
                && iov[j].iov_len > 0
            {
                bytes += iov[j].iov_len;
                j += 1;
                if iov[j - 1].iov_len < size {
                    break; // a shorter datagram ends a run
                }
            }
        }
        let h = &mut hdrs[m].msg_hdr;
        h.msg_iov = &mut iov[i];
        h.msg_iovlen = j - i;
        h.msg_name = (dest as *mut libc::sockaddr_in).cast();
        h.msg_namelen = size_of::<libc::sockaddr_in>() as libc::socklen_t;
        h.msg_flags = 0;
        if j - i > 1 {
            let c = &mut ctrl[m];
            h.msg_control = c.as_mut_ptr().cast();
            // SAFETY: CMSG_SPACE is a pure computation on its argument.
            h.msg_controllen = unsafe { libc::CMSG_SPACE(2) } as _;
            // SAFETY:
            // - msg_control points at `ctrl[m]` (32 bytes, 8-aligned) and msg_controllen
            //   (CMSG_SPACE(2) = 24) fits in it, so CMSG_FIRSTHDR returns a pointer to the
            //   start of that buffer with room for the header and 2 bytes of data, which is
            //   all that is written.
            unsafe {
                let cm = libc::CMSG_FIRSTHDR(h);
                (*cm).cmsg_level = libc::SOL_UDP;
                (*cm).cmsg_type = libc::UDP_SEGMENT;
                (*cm).cmsg_len = libc::CMSG_LEN(2) as _;
                std::ptr::write_unaligned(libc::CMSG_DATA(cm).cast::<u16>(), size as u16);
            }
        } else {
            h.msg_control = std::ptr::null_mut();
            h.msg_controllen = 0;
        }
        hdrs[m].msg_len = 0;
        m += 1;
        i = j;
    }
    m
}

/// Sends `hdrs` with as few `sendmmsg` calls as the kernel allows. Waits at most once, about
/// a millisecond, for room in a full send queue; what still does not fit is counted as
/// `queue_full`, not retried: a relay must not stall every other stream for one. Counts are
/// in datagrams: a message carries `msg_iovlen` of them (one, or a GSO run of one each).
///
/// # Safety
/// - `hdrs[i]` names a valid `sockaddr_in` (or no address: null, length 0), and its `msg_iov` points to `msg_iovlen` iovecs
///   each pointing to `iov_len` readable bytes, all valid for the whole call; its control
///   buffer, if any, is valid for `msg_controllen` bytes.
pub(super) unsafe fn send_all(fd: BorrowedFd<'_>, hdrs: &mut [libc::mmsghdr]) -> SendOutcome {
    // SAFETY: the caller's contract.
    unsafe { send_all_framed(fd, hdrs, 0) }
}

/// [`send_all`] for messages whose datagrams each take two iovecs, a header of `hdr` bytes
/// and the payload ([`SliceScope::send_raw_udp`]); `hdr` 0: one iovec per datagram. Counts
/// are in datagrams and payload bytes either way.
///
/// # Safety
/// - as for [`send_all`].
pub(super) unsafe fn send_all_framed(
    fd: BorrowedFd<'_>,
    hdrs: &mut [libc::mmsghdr],
    hdr: usize,
) -> SendOutcome {
    let k = hdrs.len();
    let mut out = SendOutcome::default();
    let mut off = 0;
    let mut waited = false;
    while off < k {
        // SAFETY:
        // - hdrs[off..k] are valid headers whose buffers and names are live (the caller's
        //   contract); the kernel only reads them, and writes msg_len.
        // - `fd` is a live descriptor borrowed from its owner.
        let n = unsafe {
            raw_mmsg(
                libc::SYS_sendmmsg,
                fd,
                hdrs.as_mut_ptr().add(off),
                k - off,
                libc::MSG_DONTWAIT,
            )
        };
        if n > 0 {
            // A message is sent whole or not at all.
            for h in &hdrs[off..off + n as usize] {
                // SAFETY: the caller's contract: msg_iov holds msg_iovlen valid iovecs.
                let (count, bytes) = unsafe { datagrams(&h.msg_hdr, hdr) };
                out.sent += count;
                out.sent_bytes += bytes;
            }
            off += n as usize;
            continue;
        }
        let e = io::Error::last_os_error();
        // SAFETY: as above, for the message the error is about.
        let (count, _) = unsafe { datagrams(&hdrs[off].msg_hdr, hdr) };
        match e.raw_os_error() {
            Some(libc::EINTR) => {}
            Some(libc::EAGAIN) if !waited => {
                waited = true;
                wait_writable(fd, 1);
            }
            Some(libc::EAGAIN) => {
                for h in &hdrs[off..] {
                    // SAFETY: as above.
                    out.queue_full += unsafe { datagrams(&h.msg_hdr, hdr) }.0;
                }
                break;
            }
            Some(code) if count > 1 && GSO.swap(false, Relaxed) => {
                tracing::warn!(
                    "the kernel refused UDP GSO ({}); sending every datagram on its own from now on",
                    io::Error::from_raw_os_error(code)
                );
                // SAFETY: as above; the message is sent again one datagram at a time.
                let one = unsafe { send_singly(fd, &hdrs[off].msg_hdr) };
                out.sent += one.sent;
                out.sent_bytes += one.sent_bytes;
                out.queue_full += one.queue_full;
                out.errors += one.errors;
                out.last_error = one.last_error.or(out.last_error);
                off += 1;
            }
            code => {
                // sendmmsg reports an error only for the first message: skip it.
                out.errors += count;
                out.last_error = code;
                off += 1;
            }
        }
    }
    out
}

/// The datagrams a message carries and their payload bytes (each datagram one iovec, or,
/// with `hdr` > 0, a header iovec of `hdr` bytes and a payload iovec).
///
/// # Safety
/// - `h.msg_iov` points to `h.msg_iovlen` valid iovecs.
unsafe fn datagrams(h: &libc::msghdr, hdr: usize) -> (usize, usize) {
    // SAFETY: the caller's contract.
    let iov = unsafe { std::slice::from_raw_parts(h.msg_iov, h.msg_iovlen) };
    let bytes: usize = iov.iter().map(|v| v.iov_len).sum();
    if hdr == 0 {
        (iov.len(), bytes)
    } else {
        let n = iov.len() / 2;
        (n, bytes.saturating_sub(n * hdr))
    }
}

/// Sends each datagram of GSO message `h` as its own message (after the kernel refused GSO).
///
/// # Safety
/// - as for [`send_all`], for the one message `h`.
unsafe fn send_singly(fd: BorrowedFd<'_>, h: &libc::msghdr) -> SendOutcome {
    let mut out = SendOutcome::default();
    // SAFETY: the caller's contract.
    let iov = unsafe { std::slice::from_raw_parts(h.msg_iov, h.msg_iovlen) };
    for v in iov {
        let mut one = *h;
        one.msg_iov = v as *const libc::iovec as *mut libc::iovec;
        one.msg_iovlen = 1;
        one.msg_control = std::ptr::null_mut();
        one.msg_controllen = 0;
        // SAFETY:
        // - `one` names the caller's live sockaddr and one live iovec; `fd` is live.
        let n = unsafe { libc::sendmsg(fd.as_raw_fd(), &one, libc::MSG_DONTWAIT) };
        if n >= 0 {
            out.sent += 1;
            out.sent_bytes += v.iov_len;
        } else {
            match io::Error::last_os_error().raw_os_error() {
                Some(libc::EAGAIN) => out.queue_full += 1,
                code => {
                    out.errors += 1;
                    out.last_error = code;
                }
            }
        }
    }
    out
}
