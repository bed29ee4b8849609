//! Batched send of borrowed payloads (frames still in a capture ring's block), over UDP
//! sockets or a raw socket with vgate's own UDP header.

use super::send::{pack, send_all, send_all_framed, SegCtrl, SendOutcome};
use super::sockaddr_v4;
use std::marker::PhantomData;
use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::BorrowedFd;

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
