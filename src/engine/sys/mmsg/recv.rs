//! Batched receive: [`RecvBatch`], `recvmmsg` into reused buffers, with the `SO_RXQ_OVFL`
//! drop counter read from each datagram's control message.

use super::{raw_mmsg, CTRL_LEN};
use std::io;
use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::BorrowedFd;

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

    /// The bytes of datagram `i`, to be rewritten in place (media validation `strip`).
    pub fn payload_mut(&mut self, i: usize) -> &mut [u8] {
        let n = (self.hdrs[i].msg_len as usize).min(self.buf_size);
        let start = self.offset() + i * self.stride;
        &mut self.bufs[start..start + n]
    }

    /// Shortens datagram `i` to `len` bytes (never lengthens it): what [`RecvBatch::payload`]
    /// and a send of it see from now on.
    pub fn set_len(&mut self, i: usize, len: usize) {
        let h = &mut self.hdrs[i];
        h.msg_len = h.msg_len.min(len as u32);
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
