//! Batched UDP receive and send (`recvmmsg`/`sendmmsg`) into caller-owned, reused buffers,
//! quinn-udp style: one system call per batch, `EINTR` retried in one place, no allocation
//! after construction.
//!
//! The `mmsghdr`s point into boxed slices owned by the same struct. Boxed slices never move
//! their contents, so the pointers stay valid however the struct itself is moved.

use std::io;
use std::marker::PhantomData;
use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

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

/// A batch of receive buffers.
pub struct RecvBatch {
    bufs: Box<[u8]>,
    buf_size: usize,
    /// Distance between buffers: `buf_size` rounded up to a cache line, so every datagram
    /// is copied to and from an aligned address (the kernel's copies run faster so).
    stride: usize,
    iov: Box<[libc::iovec]>,
    addrs: Box<[libc::sockaddr_in]>,
    ctrl: Box<[[u8; CTRL_LEN]]>,
    hdrs: Box<[libc::mmsghdr]>,
    len: usize,
    /// Headers `recv` must reset before the next call: those the kernel may have written.
    dirty: usize,
}

// SAFETY:
// - The raw pointers inside `iov` and `hdrs` only point into the boxed slices owned by this
//   struct; moving the struct to another thread moves their owner with them.
unsafe impl Send for RecvBatch {}

impl RecvBatch {
    /// `batch` buffers of `buf_size` bytes each.
    pub fn new(batch: usize, buf_size: usize) -> RecvBatch {
        let batch = batch.max(1);
        let stride = buf_size.div_ceil(64) * 64;
        let mut b = RecvBatch {
            // One line more, so the first buffer can start on a cache line.
            bufs: vec![0u8; batch * stride + 64].into_boxed_slice(),
            buf_size,
            stride,
            // SAFETY:
            // - iovec, sockaddr_in and mmsghdr are plain C structs for which all-zero
            //   (null pointers, zero lengths) is a valid value; they are filled in below.
            iov: (0..batch).map(|_| unsafe { zeroed() }).collect(),
            // SAFETY: as above.
            addrs: (0..batch).map(|_| unsafe { zeroed() }).collect(),
            ctrl: vec![[0u8; CTRL_LEN]; batch].into_boxed_slice(),
            // SAFETY: as above.
            hdrs: (0..batch).map(|_| unsafe { zeroed() }).collect(),
            len: 0,
            dirty: batch,
        };
        let base = b.bufs.as_mut_ptr();
        for i in 0..batch {
            b.iov[i] = libc::iovec {
                // SAFETY:
                // - offset() < 64 and i * stride + buf_size <= batch * stride, so
                //   offset() + i * stride + buf_size <= bufs.len(): the buffer stays in the
                //   slice.
                iov_base: unsafe { base.add(b.offset() + i * stride) }.cast(),
                iov_len: buf_size,
            };
            let h = &mut b.hdrs[i].msg_hdr;
            h.msg_iov = &mut b.iov[i];
            h.msg_iovlen = 1;
            h.msg_name = (&mut b.addrs[i] as *mut libc::sockaddr_in).cast();
            h.msg_control = b.ctrl[i].as_mut_ptr().cast();
        }
        b
    }

    pub fn capacity(&self) -> usize {
        self.hdrs.len()
    }

    /// Where the first buffer starts in `bufs`: its first cache-line boundary.
    fn offset(&self) -> usize {
        (self.bufs.as_ptr() as usize).wrapping_neg() % 64
    }

    /// Receives up to a batch without blocking; `Ok(0)` when nothing is waiting.
    pub fn recv(&mut self, fd: BorrowedFd<'_>) -> io::Result<usize> {
        // Only the headers the kernel wrote last time need their lengths back (at low load
        // that is one, not the whole batch).
        for h in self.hdrs[..self.dirty].iter_mut() {
            h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_in>() as libc::socklen_t;
            h.msg_hdr.msg_controllen = CTRL_LEN as _;
            h.msg_hdr.msg_flags = 0;
            h.msg_len = 0;
        }
        // Until the call returns, assume it may write any of them.
        self.dirty = self.hdrs.len();
        self.len = 0;
        loop {
            // SAFETY:
            // - `hdrs` holds `capacity()` initialised mmsghdrs whose iovecs, names and control
            //   buffers point into slices owned by `self`, valid and exclusively borrowed for
            //   the duration of the call; `fd` is a live descriptor borrowed from its owner.
            let n = unsafe {
                raw_mmsg(
                    libc::SYS_recvmmsg,
                    fd,
                    self.hdrs.as_mut_ptr(),
                    self.hdrs.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n >= 0 {
                self.len = n as usize;
                self.dirty = self.len;
                return Ok(self.len);
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                // Nothing was received, so nothing was written.
                io::ErrorKind::WouldBlock => {
                    self.dirty = 0;
                    return Ok(0);
                }
                _ => return Err(e),
            }
        }
    }

    /// The bytes of datagram `i` (at most the buffer size).
    pub fn payload(&self, i: usize) -> &[u8] {
        let n = (self.hdrs[i].msg_len as usize).min(self.buf_size);
        let start = self.offset() + i * self.stride;
        &self.bufs[start..start + n]
    }

    /// Whether datagram `i` was longer than the buffer (`MSG_TRUNC`).
    pub fn truncated(&self, i: usize) -> bool {
        self.hdrs[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0
    }

    /// Source of datagram `i`.
    pub fn source(&self, i: usize) -> SocketAddrV4 {
        let a = &self.addrs[i];
        SocketAddrV4::new(
            Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
            u16::from_be(a.sin_port),
        )
    }

    /// The socket's cumulative receive-queue drop counter (`SO_RXQ_OVFL`) as reported with
    /// the last datagram of the batch, if the option is on.
    pub fn rx_overflow(&self) -> Option<u32> {
        let i = self.len.checked_sub(1)?;
        let mut found = None;
        self.for_each_cmsg(i, |level, kind, data| {
            if level == libc::SOL_SOCKET && kind == libc::SO_RXQ_OVFL && data.len() >= 4 {
                found = Some(u32::from_ne_bytes([data[0], data[1], data[2], data[3]]));
            }
        });
        found
    }

    /// When the kernel received datagram `i` (`SO_TIMESTAMPNS`, realtime clock), in
    /// nanoseconds since the Unix epoch, if the option is on.
    pub fn timestamp_ns(&self, i: usize) -> Option<u64> {
        let mut found = None;
        self.for_each_cmsg(i, |level, kind, data| {
            if level == libc::SOL_SOCKET && kind == libc::SCM_TIMESTAMPNS && data.len() >= 16 {
                let mut sec = [0u8; 8];
                let mut nsec = [0u8; 8];
                sec.copy_from_slice(&data[..8]);
                nsec.copy_from_slice(&data[8..16]);
                let (sec, nsec) = (i64::from_ne_bytes(sec), i64::from_ne_bytes(nsec));
                found = Some(sec as u64 * 1_000_000_000 + nsec as u64);
            }
        });
        found
    }

    /// Calls `f(level, type, data)` for each control message of datagram `i`.
    fn for_each_cmsg(&self, i: usize, mut f: impl FnMut(i32, i32, &[u8])) {
        if i >= self.len {
            return;
        }
        let h = &self.hdrs[i].msg_hdr;
        let base = self.ctrl[i].as_ptr() as usize;
        // SAFETY:
        // - `h` was filled by the kernel in the last recvmmsg: msg_control points at our
        //   CTRL_LEN buffer and msg_controllen says how much of it holds control messages,
        //   which is what the CMSG_* macros require.
        // - Each data slice is bounded by both the cmsg's own length and the end of our
        //   buffer, so it never reads outside `self.ctrl[i]`.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(h);
            while !c.is_null() {
                let data = libc::CMSG_DATA(c);
                let header = data as usize - c as usize;
                let len = ((*c).cmsg_len as usize).saturating_sub(header);
                let end = base + CTRL_LEN;
                let len = len.min(end.saturating_sub(data as usize));
                f(
                    (*c).cmsg_level,
                    (*c).cmsg_type,
                    std::slice::from_raw_parts(data, len),
                );
                c = libc::CMSG_NXTHDR(h, c);
            }
        }
    }
}

/// What happened to a send batch.
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
type SegCtrl = [u64; 4];
/// UDP GSO: datagrams per message at most (the kernel's `UDP_MAX_SEGMENTS` is 64 or more)…
const GSO_MAX_SEGS: usize = 64;
/// …and bytes per message (a UDP length field).
const GSO_MAX_BYTES: usize = 65_000;
/// Larger datagrams are sent alone: a segment must fit a 1500-byte MTU.
const GSO_MAX_SIZE: usize = 1472;
/// Cleared, and said once, when the kernel refuses a GSO message (no checksum offload on
/// the egress device, a smaller MTU): from then on every datagram is its own message.
/// `VGATE_UDP_GSO=off` in the environment clears it at start (for A/B benchmarks).
static GSO: AtomicBool = AtomicBool::new(true);
static GSO_ENV: std::sync::Once = std::sync::Once::new();

/// Turns the datagrams `iov` (in order, all to `dest`) into messages `hdrs[..m]`, returned
/// `m`: with `want_gso` (the stack engine's [`SendBatch`]; not [`SliceBatch`], see its
/// `send`), a run of datagrams of one size (the run's last may be shorter) becomes one message
/// with a `UDP_SEGMENT` control message — one trip through the kernel's UDP/IP output path
/// and one route lookup for the run instead of one per datagram, split into the same
/// datagrams at the device (or by the NIC); the receiver sees exactly what it would have
/// seen. Without GSO every datagram is its own message.
fn pack(
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
unsafe fn send_all(fd: BorrowedFd<'_>, hdrs: &mut [libc::mmsghdr]) -> SendOutcome {
    // SAFETY: the caller's contract.
    unsafe { send_all_framed(fd, hdrs, 0) }
}

/// [`send_all`] for messages whose datagrams each take two iovecs, a header of `hdr` bytes
/// and the payload ([`SliceScope::send_raw_udp`]); `hdr` 0: one iovec per datagram. Counts
/// are in datagrams and payload bytes either way.
///
/// # Safety
/// - as for [`send_all`].
unsafe fn send_all_framed(
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

/// Send headers for datagrams whose payloads are borrowed slices, e.g. frames still in a
/// capture ring's block: nothing is copied. Use it through [`SliceBatch::scope`].
pub struct SliceBatch {
    iov: Box<[libc::iovec]>,
    hdrs: Box<[libc::mmsghdr]>,
    ctrl: Box<[SegCtrl]>,
    dest: Box<libc::sockaddr_in>,
    /// [`SliceScope::send_raw_udp`]: each datagram's UDP header…
    udp: Box<[[u8; 8]]>,
    /// …and its two iovecs (header, payload).
    riov: Box<[[libc::iovec; 2]]>,
}

// SAFETY:
// - Between scopes the headers hold only stale pointers that a scope rewrites before use
//   (a scope starts empty); nothing is shared with another thread.
unsafe impl Send for SliceBatch {}

impl SliceBatch {
    /// Room for `batch` datagrams per `sendmmsg`.
    pub fn new(batch: usize) -> SliceBatch {
        let batch = batch.max(1);
        SliceBatch {
            // SAFETY:
            // - iovec and mmsghdr are plain C structs; all-zero is valid and is overwritten
            //   before each send.
            iov: (0..batch).map(|_| unsafe { zeroed() }).collect(),
            // SAFETY: as above.
            hdrs: (0..batch).map(|_| unsafe { zeroed() }).collect(),
            ctrl: vec![[0u64; 4]; batch].into_boxed_slice(),
            dest: Box::new(sockaddr_v4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0))),
            udp: vec![[0u8; 8]; batch].into_boxed_slice(),
            // SAFETY: as above.
            riov: (0..batch).map(|_| unsafe { zeroed() }).collect(),
        }
    }

    /// An empty batch of payloads that live at least `'p` (e.g. one ring block). The
    /// borrow checker keeps the scope, and so every pointer it queued, inside `'p`.
    pub fn scope<'p>(&mut self) -> SliceScope<'_, 'p> {
        SliceScope {
            batch: self,
            len: 0,
            _payloads: PhantomData,
        }
    }
}

/// Payloads queued for one destination, sent with [`SliceScope::send`].
pub struct SliceScope<'s, 'p> {
    batch: &'s mut SliceBatch,
    len: usize,
    _payloads: PhantomData<&'p [u8]>,
}

impl<'p> SliceScope<'_, 'p> {
    pub fn is_full(&self) -> bool {
        self.len == self.batch.hdrs.len()
    }

    /// Queues one datagram; `false` (and nothing queued) when the batch is full: send first.
    pub fn push(&mut self, payload: &'p [u8]) -> bool {
        if self.is_full() {
            return false;
        }
        self.batch.iov[self.len] = libc::iovec {
            iov_base: payload.as_ptr() as *mut libc::c_void,
            iov_len: payload.len(),
        };
        self.len += 1;
        true
    }

    /// Drops what is queued without sending it.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Sends everything queued to `dest` from socket `fd` and empties the scope.
    pub fn send(&mut self, fd: BorrowedFd<'_>, dest: SocketAddrV4) -> SendOutcome {
        let k = std::mem::take(&mut self.len);
        if k == 0 {
            return SendOutcome::default();
        }
        let b = &mut *self.batch;
        *b.dest = sockaddr_v4(dest);
        // No GSO here: a GSO message crosses netfilter and a veth as one packet, so a
        // per-packet rule (the split bed's loss injection, a rate limit) would take or drop
        // its datagrams together — a one-way link's FEC must see frames lost one by one.
        let m = pack(
            &mut b.iov[..k],
            &mut b.hdrs,
            &mut b.ctrl,
            &mut b.dest,
            false,
        );
        // SAFETY:
        // - `pack` pointed hdrs[..m] at `b.dest`, at runs of iov[..k] and at their own control
        //   buffers; iov[..k] were written by `push` in this scope from `&'p [u8]` payloads,
        //   and the scope cannot outlive `'p`, so every buffer is live for the call.
        unsafe { send_all(fd, &mut b.hdrs[..m]) }
    }

    /// Sends everything queued as UDP datagrams `src` → `dest` through a raw IPv4 socket of
    /// protocol UDP ([`raw_udp_socket`]) and empties the scope: vgate writes each UDP header
    /// (ports, length, checksum over the payload), the kernel adds the IPv4 header (source:
    /// the address the socket is bound to), routes, resolves the next hop and fragments —
    /// what a UDP socket bound to `src` would have sent, without holding the port.
    pub fn send_raw_udp(
        &mut self,
        fd: BorrowedFd<'_>,
        src: SocketAddrV4,
        dest: SocketAddrV4,
    ) -> SendOutcome {
        let k = std::mem::take(&mut self.len);
        if k == 0 {
            return SendOutcome::default();
        }
        let b = &mut *self.batch;
        *b.dest = sockaddr_v4(dest);
        for i in 0..k {
            let v = b.iov[i];
            // SAFETY:
            // - iov[i] was written by `push` in this scope from a `&'p [u8]`, and the scope
            //   cannot outlive `'p`: the bytes are live and not written to.
            let payload = unsafe { std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len) };
            b.udp[i] = crate::wire::udp_header(src, dest, payload);
            b.riov[i] = [
                libc::iovec {
                    iov_base: b.udp[i].as_mut_ptr().cast(),
                    iov_len: 8,
                },
                v,
            ];
            let h = &mut b.hdrs[i].msg_hdr;
            h.msg_iov = b.riov[i].as_mut_ptr();
            h.msg_iovlen = 2;
            h.msg_name = (&mut *b.dest as *mut libc::sockaddr_in).cast();
            h.msg_namelen = size_of::<libc::sockaddr_in>() as libc::socklen_t;
            h.msg_control = std::ptr::null_mut();
            h.msg_controllen = 0;
            h.msg_flags = 0;
            b.hdrs[i].msg_len = 0;
        }
        // SAFETY:
        // - hdrs[..k] name `b.dest` and their own two iovecs: `b.udp[i]` (owned by the batch,
        //   not touched until the call returns) and a payload of this scope (live, see
        //   above).
        unsafe { send_all_framed(fd, &mut b.hdrs[..k], 8) }
    }
}

/// Opens a raw IPv4 socket of protocol UDP for [`SliceScope::send_raw_udp`]: bound to `src`
/// (the source address of everything it sends), non-blocking, with a [`RAW_SNDBUF`] send
/// buffer (`SO_SNDBUFFORCE`, past `net.core.wmem_max`, where the process has CAP_NET_ADMIN;
/// else `SO_SNDBUF`, capped there; the size obtained is logged once): one such socket
/// carries every fallback route of a worker, or every stream leg of a domain. It never
/// receives: the kernel hands it a copy of every UDP datagram delivered locally to `src`
/// (signaling included), so a filter that drops everything is attached, what was queued
/// before the filter is drained (as libpcap does), and the receive buffer is kept at its
/// minimum. Needs CAP_NET_RAW.
pub fn raw_udp_socket(src: Ipv4Addr) -> io::Result<OwnedFd> {
    raw_udp_socket_with(src, |_| {})
}

/// Send buffer asked for by [`raw_udp_socket`].
pub const RAW_SNDBUF: libc::c_int = 4 << 20;

static RAW_SNDBUF_SAID: std::sync::Once = std::sync::Once::new();

/// [`raw_udp_socket`], calling `before_filter` between `socket()` and the filter (tests).
fn raw_udp_socket_with(
    src: Ipv4Addr,
    before_filter: impl FnOnce(BorrowedFd<'_>),
) -> io::Result<OwnedFd> {
    // SAFETY:
    // - plain socket(2) call with constant arguments; the result is checked.
    let fd = unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            libc::IPPROTO_UDP,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY:
    // - `fd` was just returned by socket(2) and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    before_filter(fd.as_fd());
    // `ret #0`: accept no byte of any packet.
    let mut drop_all = [libc::sock_filter {
        code: 0x06,
        jt: 0,
        jf: 0,
        k: 0,
    }];
    let prog = libc::sock_fprog {
        len: 1,
        filter: drop_all.as_mut_ptr(),
    };
    super::afpacket::set_opt(fd.as_fd(), libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &prog)?;
    // What arrived between socket() and the filter is queued still and would stay so for
    // the socket's life (nothing reads it): drop it now.
    drain(fd.as_fd());
    let rcvbuf: libc::c_int = 0; // the kernel raises it to its minimum
    super::afpacket::set_opt(fd.as_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, &rcvbuf)?;
    if super::afpacket::set_opt(
        fd.as_fd(),
        libc::SOL_SOCKET,
        libc::SO_SNDBUFFORCE,
        &RAW_SNDBUF,
    )
    .is_err()
    {
        // Without CAP_NET_ADMIN: as much as net.core.wmem_max allows.
        let _ =
            super::afpacket::set_opt(fd.as_fd(), libc::SOL_SOCKET, libc::SO_SNDBUF, &RAW_SNDBUF);
    }
    RAW_SNDBUF_SAID.call_once(|| {
        match nix::sys::socket::getsockopt(&fd, nix::sys::socket::sockopt::SndBuf) {
            Ok(got) if got < RAW_SNDBUF as usize => tracing::warn!(
                "raw send sockets got a {got}-byte send buffer ({RAW_SNDBUF} asked for; SO_SNDBUFFORCE needs CAP_NET_ADMIN, else net.core.wmem_max caps it): a worker's fallback routes share it, a burst may find it full"
            ),
            Ok(got) => tracing::info!("raw send sockets: {got}-byte send buffer"),
            Err(e) => tracing::warn!("raw send sockets: cannot read the send buffer size: {e}"),
        }
    });
    let sa = sockaddr_v4(SocketAddrV4::new(src, 0));
    // SAFETY:
    // - `sa` is a valid sockaddr_in on our stack and its size is passed with it.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sa as *const libc::sockaddr_in).cast(),
            size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Reads and discards what `fd`'s receive queue holds, without waiting, until it is empty.
fn drain(fd: BorrowedFd<'_>) {
    let mut buf = [0u8; 1];
    loop {
        // SAFETY:
        // - `buf` is a live, writable buffer of the length passed; the kernel writes at most
        //   that many bytes (the rest of a longer datagram is discarded, MSG_TRUNC semantics).
        let r = unsafe {
            libc::recv(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if r < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            // EAGAIN: empty (any other error: nothing more to read either).
            return;
        }
    }
}

/// Sends one UDP datagram `src` → `dest` through a raw socket of [`raw_udp_socket`] (the
/// one-off form of [`SliceScope::send_raw_udp`]); returns the payload bytes sent.
pub fn send_raw_udp_one(
    fd: BorrowedFd<'_>,
    src: SocketAddrV4,
    dest: SocketAddrV4,
    payload: &[u8],
) -> io::Result<usize> {
    let mut udp = crate::wire::udp_header(src, dest, payload);
    let mut iov = [
        libc::iovec {
            iov_base: udp.as_mut_ptr().cast(),
            iov_len: 8,
        },
        libc::iovec {
            iov_base: payload.as_ptr() as *mut libc::c_void,
            iov_len: payload.len(),
        },
    ];
    let mut sa = sockaddr_v4(dest);
    // SAFETY:
    // - msghdr is plain old data; all-zero is valid (no name, no iovecs, no control).
    let mut h: libc::msghdr = unsafe { zeroed() };
    h.msg_name = (&mut sa as *mut libc::sockaddr_in).cast();
    h.msg_namelen = size_of::<libc::sockaddr_in>() as libc::socklen_t;
    h.msg_iov = iov.as_mut_ptr();
    h.msg_iovlen = 2;
    loop {
        // SAFETY:
        // - `h` names `sa` and the two iovecs on this stack frame (the header and the
        //   borrowed payload), all live for the call; the kernel only reads them.
        let n = unsafe { libc::sendmsg(fd.as_raw_fd(), &h, libc::MSG_DONTWAIT) };
        if n >= 0 {
            return Ok((n as usize).saturating_sub(8));
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Room for the headers a [`FrameBatch`] puts in front of each payload (a `virtio_net_hdr`,
/// Ethernet, IPv4 and UDP take 52 bytes).
pub const FRAME_HDR_ROOM: usize = 64;

/// What became of one frame of a [`FrameScope::send`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameStatus {
    Sent,
    /// Refused because the socket's send queue stayed full.
    QueueFull,
    /// Refused by the kernel for another reason.
    Error,
}

/// Frames for a packet socket: per frame, headers written by the caller into a buffer of
/// the batch, followed by a borrowed payload (nothing is copied in user space). One
/// `sendmmsg` sends the lot, whatever their destinations. Use it through
/// [`FrameBatch::scope`].
pub struct FrameBatch {
    hdrs: Box<[[u8; FRAME_HDR_ROOM]]>,
    iov: Box<[[libc::iovec; 2]]>,
    msgs: Box<[libc::mmsghdr]>,
    addr: Box<libc::sockaddr_ll>,
    status: Box<[FrameStatus]>,
}

// SAFETY:
// - Between scopes the headers hold only pointers into the batch's own boxed slices (which
//   never move) and stale payload pointers that a scope rewrites before use (a scope starts
//   empty); nothing is shared with another thread.
unsafe impl Send for FrameBatch {}

impl FrameBatch {
    /// Room for `batch` frames per `sendmmsg`, sent out of interface `ifindex` as IPv4.
    pub fn new(batch: usize, ifindex: u32) -> FrameBatch {
        let batch = batch.max(1);
        // SAFETY: sockaddr_ll is plain integers and arrays; all-zero is a valid value.
        let mut addr: libc::sockaddr_ll = unsafe { zeroed() };
        addr.sll_family = libc::AF_PACKET as libc::c_ushort;
        addr.sll_protocol = (libc::ETH_P_IP as u16).to_be();
        addr.sll_ifindex = ifindex as libc::c_int;
        let mut b = FrameBatch {
            hdrs: vec![[0u8; FRAME_HDR_ROOM]; batch].into_boxed_slice(),
            // SAFETY:
            // - iovec and mmsghdr are plain C structs; all-zero (null pointers, zero
            //   lengths) is valid and is overwritten before each send.
            iov: (0..batch).map(|_| unsafe { zeroed() }).collect(),
            // SAFETY: as above.
            msgs: (0..batch).map(|_| unsafe { zeroed() }).collect(),
            addr: Box::new(addr),
            status: vec![FrameStatus::Sent; batch].into_boxed_slice(),
        };
        for i in 0..batch {
            let h = &mut b.msgs[i].msg_hdr;
            h.msg_iov = b.iov[i].as_mut_ptr();
            h.msg_iovlen = 2;
            h.msg_name = (&mut *b.addr as *mut libc::sockaddr_ll).cast();
            h.msg_namelen = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        }
        b
    }

    /// An empty batch of payloads that live at least `'p` (e.g. ring blocks).
    pub fn scope<'p>(&mut self) -> FrameScope<'_, 'p> {
        FrameScope {
            batch: self,
            len: 0,
            sent: 0,
            _payloads: PhantomData,
        }
    }
}

/// Frames queued on a [`FrameBatch`], sent with [`FrameScope::send`].
pub struct FrameScope<'s, 'p> {
    batch: &'s mut FrameBatch,
    len: usize,
    /// Frames of the last `send`, whose [`FrameScope::status`] can be read.
    sent: usize,
    _payloads: PhantomData<&'p [u8]>,
}

impl<'p> FrameScope<'_, 'p> {
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn is_full(&self) -> bool {
        self.len == self.batch.msgs.len()
    }

    /// Queues one frame: `write` fills the header room and returns how many of its bytes
    /// are headers (at most [`FRAME_HDR_ROOM`]); `payload` follows them. `false` (and
    /// nothing queued) when the batch is full: send first.
    pub fn push(
        &mut self,
        payload: &'p [u8],
        write: impl FnOnce(&mut [u8; FRAME_HDR_ROOM]) -> usize,
    ) -> bool {
        if self.is_full() {
            return false;
        }
        let i = self.len;
        let b = &mut *self.batch;
        let n = write(&mut b.hdrs[i]).min(FRAME_HDR_ROOM);
        b.iov[i] = [
            libc::iovec {
                iov_base: b.hdrs[i].as_mut_ptr().cast(),
                iov_len: n,
            },
            libc::iovec {
                iov_base: payload.as_ptr() as *mut libc::c_void,
                iov_len: payload.len(),
            },
        ];
        self.len += 1;
        true
    }

    /// What became of frame `i` of the last [`FrameScope::send`].
    pub fn status(&self, i: usize) -> FrameStatus {
        if i < self.sent {
            self.batch.status[i]
        } else {
            FrameStatus::Error
        }
    }

    /// Sends every queued frame from packet socket `fd`, as few `sendmmsg` calls as the
    /// kernel allows, and empties the scope; each frame's fate is then in
    /// [`FrameScope::status`]. A frame the device drops (`ENOBUFS`) is `QueueFull` and the
    /// rest go on; a full socket send queue (`EAGAIN`) is waited for at most once, about a
    /// millisecond, and what still does not fit is `QueueFull`, not retried.
    pub fn send(&mut self, fd: BorrowedFd<'_>) -> SendOutcome {
        let k = std::mem::take(&mut self.len);
        self.sent = k;
        let b = &mut *self.batch;
        let mut out = SendOutcome::default();
        let mut off = 0;
        let mut waited = false;
        while off < k {
            // SAFETY:
            // - msgs[off..k] name `b.addr` (owned, live) and two iovecs each of `b.iov`: the
            //   first points into `b.hdrs` (owned), the second at a payload pushed in this
            //   scope from a `&'p [u8]`, and the scope cannot outlive `'p`; the kernel only
            //   reads them and writes msg_len;
            // - `fd` is a live descriptor borrowed from its owner.
            let n = unsafe {
                raw_mmsg(
                    libc::SYS_sendmmsg,
                    fd,
                    b.msgs.as_mut_ptr().add(off),
                    k - off,
                    libc::MSG_DONTWAIT,
                )
            };
            if n > 0 {
                for i in off..off + n as usize {
                    b.status[i] = FrameStatus::Sent;
                    out.sent += 1;
                    out.sent_bytes += b.iov[i][1].iov_len;
                }
                off += n as usize;
                continue;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => {}
                // The device (or, on veth, the peer's backlog) dropped this one frame: the
                // next may pass. (A UDP socket hides this drop; here it is counted.)
                Some(libc::ENOBUFS) => {
                    b.status[off] = FrameStatus::QueueFull;
                    out.queue_full += 1;
                    off += 1;
                }
                Some(libc::EAGAIN) if !waited => {
                    waited = true;
                    wait_writable(fd, 1);
                }
                Some(libc::EAGAIN) => {
                    for st in &mut b.status[off..k] {
                        *st = FrameStatus::QueueFull;
                    }
                    out.queue_full += k - off;
                    break;
                }
                code => {
                    // sendmmsg reports an error only for the first message: skip it.
                    b.status[off] = FrameStatus::Error;
                    out.errors += 1;
                    out.last_error = code;
                    off += 1;
                }
            }
        }
        out
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsFd;

    #[test]
    fn raw_socket_drops_what_arrived_before_its_filter() {
        let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
        let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
        let SocketAddr4(dst) = SocketAddr4::of(&sink);
        let mut sent = 0;
        let raw = raw_udp_socket_with(Ipv4Addr::LOCALHOST, |_| {
            // Delivered locally: the unfiltered raw socket queues a copy of each.
            for _ in 0..3 {
                sent += sender.send_to(b"early", dst).map_or(0, |_| 1);
            }
        });
        let Ok(raw) = raw else {
            crate::test_did_not_run(
                "raw_socket_drops_what_arrived_before_its_filter",
                "no CAP_NET_RAW",
            );
            return;
        };
        assert_eq!(sent, 3);
        let mut buf = [0u8; 64];
        assert_eq!(
            sink.recv(&mut buf).unwrap(),
            5,
            "the datagrams were delivered"
        );
        // SAFETY: `buf` is live and writable for its length during the call.
        let r = unsafe {
            libc::recv(
                raw.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        assert_eq!(r, -1, "the raw socket's queue is empty");
        assert_eq!(
            io::Error::last_os_error().raw_os_error(),
            Some(libc::EAGAIN)
        );
    }

    #[test]
    fn relays_a_batch_between_real_sockets() {
        let rx_sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx_sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
        let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
        let SocketAddr4(dst) = SocketAddr4::of(&rx_sock);
        for i in 0..5u8 {
            sender.send_to(&[i; 100], dst).unwrap();
        }
        sender.send_to(&[9u8; 300], dst).unwrap();
        let mut rb = RecvBatch::new(8, 200);
        // Datagrams are queued synchronously on loopback.
        assert_eq!(rb.recv(rx_sock.as_fd()).unwrap(), 6);
        assert_eq!(rb.payload(2), &[2u8; 100][..]);
        assert!(rb.truncated(5));
        assert_eq!(rb.payload(5).len(), 200);
        assert_eq!(rb.source(0), SocketAddr4::of(&sender).0);

        let mut sb = SendBatch::new(8);
        let out = sb.send(tx_sock.as_fd(), &rb, &[0, 1, 2], SocketAddr4::of(&sink).0);
        assert_eq!(out.sent, 3);
        assert_eq!(out.sent_bytes, 300);
        let mut buf = [0u8; 512];
        for i in 0..3u8 {
            let (n, from) = sink.recv_from(&mut buf).unwrap();
            assert_eq!(&buf[..n], &[i; 100][..]);
            assert_eq!(from, tx_sock.local_addr().unwrap());
        }
        assert_eq!(
            rb.recv(rx_sock.as_fd()).unwrap(),
            0,
            "nothing more was waiting"
        );
        // Reused headers: lengths and flags from the earlier batches do not leak into later
        // ones, whichever of them the kernel wrote.
        for round in [7usize, 2, 8] {
            for i in 0..round {
                sender.send_to(&[i as u8; 50], dst).unwrap();
            }
            assert_eq!(rb.recv(rx_sock.as_fd()).unwrap(), round);
            for i in 0..round {
                assert_eq!(rb.payload(i), &[i as u8; 50][..], "round {round}");
                assert!(!rb.truncated(i), "round {round}");
                assert_eq!(rb.source(i), SocketAddr4::of(&sender).0);
            }
        }
    }

    #[test]
    fn slice_batch_sends_borrowed_payloads_in_order() {
        let tx_sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
        let block: Vec<u8> = (0..=255u8).collect();
        let mut sb = SliceBatch::new(3);
        let mut scope = sb.scope();
        for i in 0..3 {
            assert!(scope.push(&block[i * 10..i * 10 + 10]));
        }
        assert!(scope.is_full() && !scope.push(&block[..1]));
        let out = scope.send(tx_sock.as_fd(), SocketAddr4::of(&sink).0);
        assert_eq!((out.sent, out.sent_bytes), (3, 30));
        assert!(scope.push(&block[100..150]));
        assert_eq!(
            scope.send(tx_sock.as_fd(), SocketAddr4::of(&sink).0).sent,
            1
        );
        let mut buf = [0u8; 512];
        for want in [
            &block[0..10],
            &block[10..20],
            &block[20..30],
            &block[100..150],
        ] {
            let (n, from) = sink.recv_from(&mut buf).unwrap();
            assert_eq!(&buf[..n], want);
            assert_eq!(from, tx_sock.local_addr().unwrap());
        }
    }

    #[test]
    fn runs_of_equal_sizes_arrive_as_the_same_datagrams() {
        let rx_sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx_sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
        let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
        sink.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        // Runs (GSO messages where the kernel takes them), a shorter datagram ending a run, a
        // longer one starting the next, one too big to be a segment, and 70 equal ones (more
        // than one message's worth of segments).
        let mut sizes = vec![100, 100, 100, 50, 100, 200, 200, 1500, 30, 1, 1];
        sizes.extend(std::iter::repeat_n(1316, 70));
        let data: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| (0..n).map(|b| (b + i) as u8).collect())
            .collect();
        let SocketAddr4(dst) = SocketAddr4::of(&rx_sock);
        for d in &data {
            sender.send_to(d, dst).unwrap();
        }
        let mut rb = RecvBatch::new(sizes.len(), 2048);
        // Datagrams are queued synchronously on loopback.
        assert_eq!(rb.recv(rx_sock.as_fd()).unwrap(), sizes.len());
        let all: Vec<u16> = (0..sizes.len() as u16).collect();
        let mut sb = SendBatch::new(sizes.len());
        let out = sb.send(tx_sock.as_fd(), &rb, &all, SocketAddr4::of(&sink).0);
        assert_eq!(out.sent, sizes.len(), "{out:?}");
        assert_eq!(out.sent_bytes, sizes.iter().sum::<usize>());
        assert!(GSO.load(Relaxed), "loopback takes UDP GSO messages");
        let mut buf = [0u8; 2048];
        for want in &data {
            let n = sink.recv(&mut buf).unwrap();
            assert_eq!(&buf[..n], &want[..], "datagram of {} bytes", want.len());
        }
    }

    struct SocketAddr4(SocketAddrV4);
    impl SocketAddr4 {
        fn of(s: &UdpSocket) -> SocketAddr4 {
            match s.local_addr().unwrap() {
                std::net::SocketAddr::V4(a) => SocketAddr4(a),
                _ => unreachable!(),
            }
        }
    }
}
