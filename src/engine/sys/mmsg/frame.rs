//! Frames for a packet socket ([`FrameBatch`]): caller-written headers in front of borrowed
//! payloads, one `sendmmsg` for the lot.

use super::send::SendOutcome;
use super::{raw_mmsg, wait_writable};
use std::io;
use std::marker::PhantomData;
use std::mem::{size_of, zeroed};
use std::os::fd::BorrowedFd;

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
