//! Unsafe core of the `afxdp` engine: the AF_XDP socket, its UMEM and its four mmapped rings.
//!
//! Owns: every raw pointer of the engine, the UMEM frame ownership protocol and the memory
//! ordering of the rings. Must not touch: packet parsing, routes, policy, operator messages
//! (`engine::afxdp` is safe code on top of this module).
//!
//! # The rings
//!
//! Each ring is a power-of-two array of descriptors plus a `producer` and a `consumer` index
//! shared with the kernel. User space *produces* on the fill ring (frames the kernel may
//! receive into) and the TX ring (frames to send), and *consumes* the RX ring (received
//! frames) and the completion ring (sent frames given back).
//!
//! - Producing: read the kernel's `consumer` with an *acquire* load (the kernel publishes it
//!   with `smp_store_release` after it has finished reading the slots it consumed, so once
//!   we see it those slots may be overwritten); write descriptors; publish `producer` with a
//!   *release* store (the kernel reads it with `smp_load_acquire`, so it sees every
//!   descriptor — and, for TX, every frame byte — written before).
//! - Consuming: read the kernel's `producer` with an *acquire* load (pairs with the kernel's
//!   release store after it wrote the descriptors and, for RX, the frame bytes); read
//!   descriptors; publish `consumer` with a *release* store, so those reads happen before the
//!   kernel may reuse the slots.
//!
//! # Frame ownership
//!
//! The UMEM is `frames` chunks of `frame_size` bytes. At any time each chunk belongs to
//! either the kernel (it is on the fill or TX ring) or user space. User space sees frame
//! bytes only through a token that proves it owns the chunk: an [`RxFrame`] (from the RX
//! ring; not `Clone`; given back with [`Xsk::recycle`]) or a [`TxFrame`] (from the free list;
//! given up with [`Xsk::tx_push`]). So no `&[u8]` ever covers memory the kernel may write.

use std::io;
use std::mem::{size_of, MaybeUninit};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::Ordering;

mod netdev;
mod ring;
#[cfg(test)]
mod tests;

pub(crate) use netdev::{driver, hw_addr, if_nametoindex, kernel_release, mtu, rx_queues};
use ring::{Mmap, Ring};

/// Sizes of one socket's UMEM and rings (all powers of two).
#[derive(Clone, Copy, Debug)]
pub(crate) struct XskParams {
    pub frame_size: u32,
    /// UMEM frames: the first `rx_ring` go to the fill ring, the rest are for TX.
    pub frames: u32,
    /// Entries of the fill, RX, TX and completion rings.
    pub ring: u32,
}

/// How a socket was bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BindMode {
    ZeroCopy,
    Copy,
}

/// Bytes of TX metadata in front of each TX frame when the kernel takes it
/// (`XDP_UMEM_TX_METADATA_LEN`, kernel ≥ 6.11, and stable 6.8–6.10 updates that took the fix adding the flag): the size
/// of `struct xsk_tx_metadata` since 6.14 (flags, then `request { csum_start, csum_offset,
/// launch_time }`). A multiple of 8, under 256, as the kernel requires.
pub(crate) const TX_META_LEN: u32 = 24;

/// Who fills the UDP checksum of the frames a socket transmits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TxCsum {
    /// User space, over every payload.
    Software,
    /// The kernel's skb path (copy mode): the descriptor carries `XDP_TX_METADATA` with
    /// `XDP_TXMD_FLAGS_CHECKSUM`, the skb becomes `CHECKSUM_PARTIAL`, and the egress device
    /// (or the kernel just before a device without checksum offload) finishes the sum.
    Offload,
}

/// Which step of opening a socket failed.
#[derive(Debug)]
pub(crate) struct XskError {
    pub step: &'static str,
    pub source: io::Error,
}

fn step(step: &'static str) -> impl FnOnce(io::Error) -> XskError {
    move |source| XskError { step, source }
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A received frame: proof that user space owns the chunk until [`Xsk::recycle`].
#[derive(Debug)]
pub(crate) struct RxFrame {
    addr: u64,
    len: u32,
}

/// A TX chunk taken from the free list: user space writes it, [`Xsk::tx_push`] queues it.
#[derive(Debug)]
pub(crate) struct TxFrame {
    addr: u64,
}

/// An AF_XDP socket bound to one queue of one interface, with its own UMEM.
pub(crate) struct Xsk {
    // Field order is drop order: the rings and the UMEM mapping go before the socket.
    fill: Ring<u64>,
    comp: Ring<u64>,
    rx: Ring<libc::xdp_desc>,
    tx: Ring<libc::xdp_desc>,
    umem: Mmap,
    fd: OwnedFd,
    frame_size: u32,
    /// TX chunks user space owns and has not submitted.
    free: Vec<u64>,
    /// TX descriptors written but not yet published.
    tx_pending: u32,
    /// TX descriptors published since the last kick (see [`Xsk::tx_kick`]).
    tx_unkicked: u32,
    /// Where a TX packet starts in its chunk: [`TX_META_LEN`] when the UMEM was registered
    /// with TX metadata (the kernel then wants that much room before every TX packet), else 0.
    tx_offset: u32,
    pub(crate) mode: BindMode,
    /// Who fills the UDP checksum of what this socket sends.
    pub(crate) tx_csum: TxCsum,
    /// Why the kernel refused TX metadata, when it did.
    pub(crate) tx_meta_refused: Option<io::Error>,
    /// Frames the device dropped after the kernel took them (`EBUSY` from a kick:
    /// `NET_XMIT_DROP`), since the socket opened.
    tx_busy_drops: u64,
    /// The last kick stopped before the ring drained (device busy, no buffers, or the
    /// kick's round limit): the rest waits for another kick.
    tx_stopped: bool,
    /// The kernel's TX consumer index at the last [`Xsk::tx_stalled`] check, and whether
    /// frames were waiting then.
    tx_cons_seen: u32,
    tx_waiting_seen: bool,
}

// SAFETY:
// - the raw pointers all point into mappings this value owns; nothing else holds them, so
//   moving the whole socket to another thread (its worker) is sound. It is not `Sync`.
unsafe impl Send for Xsk {}

trait SockOpt: Copy {}
impl SockOpt for u32 {}
impl SockOpt for libc::xdp_umem_reg {}

fn setopt<T: SockOpt>(fd: BorrowedFd<'_>, name: libc::c_int, v: &T) -> io::Result<()> {
    // SAFETY:
    // - `v` is a live `repr(C)` kernel ABI value readable for `size_of::<T>()` bytes, read
    //   only during the call; `fd` is an open socket.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_XDP,
            name,
            (v as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

impl Xsk {
    /// Opens a socket on `ifindex` queue `queue`, bound in `mode`. The XDP program that
    /// redirects to the socket must be attached already. A driver without zero-copy support
    /// refuses the bind (`step == "bind"`): open again in copy mode.
    ///
    /// With `csum_offload`, the UMEM is registered with room for TX metadata and a socket
    /// bound in copy mode leaves the UDP checksum to the kernel ([`TxCsum::Offload`]); a
    /// kernel that refuses TX metadata (before 6.11) gets the registration without it and the
    /// socket sums in software ([`Xsk::tx_meta_refused`] says why). Zero-copy sockets always
    /// sum in software: whether a driver honours the checksum request is not checked here.
    pub(crate) fn open(
        ifindex: u32,
        queue: u32,
        p: XskParams,
        mode: BindMode,
        csum_offload: bool,
    ) -> Result<Xsk, XskError> {
        // SAFETY: socket(2) takes plain integers.
        let raw =
            cvt(unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) })
                .map_err(step("socket(AF_XDP)"))?;
        // SAFETY: `raw` was just returned by socket(2): open and owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let umem_len = p.frames as usize * p.frame_size as usize;
        let umem = Mmap::new(umem_len, None, 0).map_err(step("mmap UMEM"))?;
        let mut reg = libc::xdp_umem_reg {
            addr: umem.ptr.as_ptr() as u64,
            len: umem_len as u64,
            chunk_size: p.frame_size,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        let mut tx_meta_refused = None;
        if csum_offload {
            reg.flags = libc::XDP_UMEM_TX_METADATA_LEN;
            reg.tx_metadata_len = TX_META_LEN;
            match setopt(fd.as_fd(), libc::XDP_UMEM_REG, &reg) {
                Ok(()) => {}
                // A kernel without the flag rejects it as an unknown UMEM flag.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    tx_meta_refused = Some(e);
                    reg.flags = 0;
                    reg.tx_metadata_len = 0;
                }
                Err(e) => return Err(step("XDP_UMEM_REG")(e)),
            }
        }
        if reg.flags == 0 {
            setopt(fd.as_fd(), libc::XDP_UMEM_REG, &reg).map_err(step("XDP_UMEM_REG"))?;
        }
        let tx_offset = reg.tx_metadata_len;
        for (name, what) in [
            (libc::XDP_UMEM_FILL_RING, "XDP_UMEM_FILL_RING"),
            (libc::XDP_UMEM_COMPLETION_RING, "XDP_UMEM_COMPLETION_RING"),
            (libc::XDP_RX_RING, "XDP_RX_RING"),
            (libc::XDP_TX_RING, "XDP_TX_RING"),
        ] {
            setopt(fd.as_fd(), name, &p.ring).map_err(step(what))?;
        }
        let mut off = MaybeUninit::<libc::xdp_mmap_offsets>::zeroed();
        let mut len = size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
        // SAFETY: `off` is writable for `len` bytes and `len` is a live socklen_t.
        cvt(unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_XDP,
                libc::XDP_MMAP_OFFSETS,
                off.as_mut_ptr().cast(),
                &mut len,
            )
        })
        .map_err(step("XDP_MMAP_OFFSETS"))?;
        if len as usize != size_of::<libc::xdp_mmap_offsets>() {
            return Err(XskError {
                step: "XDP_MMAP_OFFSETS",
                source: io::Error::other("the kernel's ring layout is older than 5.4"),
            });
        }
        // SAFETY: the kernel filled the whole struct (length checked); all-zero was valid too.
        let off = unsafe { off.assume_init() };
        let b = fd.as_fd();
        let fill = Ring::map(b, &off.fr, p.ring, libc::XDP_UMEM_PGOFF_FILL_RING)
            .map_err(step("mmap fill ring"))?;
        let comp = Ring::map(b, &off.cr, p.ring, libc::XDP_UMEM_PGOFF_COMPLETION_RING)
            .map_err(step("mmap completion ring"))?;
        let rx = Ring::map(b, &off.rx, p.ring, libc::XDP_PGOFF_RX_RING as u64)
            .map_err(step("mmap RX ring"))?;
        let tx = Ring::map(b, &off.tx, p.ring, libc::XDP_PGOFF_TX_RING as u64)
            .map_err(step("mmap TX ring"))?;
        let mut x = Xsk {
            fill,
            comp,
            rx,
            tx,
            umem,
            fd,
            frame_size: p.frame_size,
            free: Vec::new(),
            tx_pending: 0,
            tx_unkicked: 0,
            tx_offset,
            mode,
            tx_csum: if tx_offset > 0 && mode == BindMode::Copy {
                TxCsum::Offload
            } else {
                TxCsum::Software
            },
            tx_meta_refused,
            tx_busy_drops: 0,
            tx_stopped: false,
            tx_cons_seen: 0,
            tx_waiting_seen: false,
        };
        // Fill before bind, so the first packets find frames.
        let rx_frames = p.ring.min(p.frames);
        let n = x.fill.free(rx_frames).min(rx_frames);
        for i in 0..n {
            x.fill.write(i, u64::from(i) * u64::from(p.frame_size));
        }
        x.fill.publish(n);
        x.free = (rx_frames..p.frames)
            .map(|i| u64::from(i) * u64::from(p.frame_size))
            .collect();
        let flags = libc::XDP_USE_NEED_WAKEUP
            | match mode {
                BindMode::ZeroCopy => libc::XDP_ZEROCOPY,
                BindMode::Copy => libc::XDP_COPY,
            };
        let sa = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: flags,
            sxdp_ifindex: ifindex,
            sxdp_queue_id: queue,
            sxdp_shared_umem_fd: 0,
        };
        // SAFETY: `sa` is a live sockaddr_xdp of the size passed, read during the call.
        cvt(unsafe {
            libc::bind(
                x.fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_xdp).cast(),
                size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
            )
        })
        .map_err(step("bind"))?;
        Ok(x)
    }

    pub(crate) fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Takes up to `max` received frames into `out`; the RX slots go back to the kernel at
    /// once (the frames stay ours until recycled).
    pub(crate) fn rx_batch(&mut self, out: &mut Vec<RxFrame>, max: usize) -> usize {
        let n = self.rx.available().min(max as u32);
        for i in 0..n {
            let d = self.rx.read(i);
            out.push(RxFrame {
                addr: d.addr,
                len: d.len,
            });
        }
        if n > 0 {
            self.rx.release(n);
        }
        n as usize
    }

    /// The bytes of a received frame, writable (media strip rewrites a payload in place
    /// before it is sent from here or copied into a TX frame).
    pub(crate) fn frame_mut<'a>(&'a self, f: &'a mut RxFrame) -> &'a mut [u8] {
        let start = f.addr as usize;
        let end = start.saturating_add(f.len as usize);
        if end > self.umem.len {
            return &mut [];
        }
        // SAFETY:
        // - `start..end` lies inside the UMEM mapping (checked, PROT_READ | PROT_WRITE),
        //   which lives as long as `self`;
        // - `f` proves user space owns the chunk: the kernel wrote it before publishing the
        //   RX descriptor (acquired in `rx_batch`) and cannot write it again until `recycle`
        //   puts it on the fill ring, which consumes `f` — after this borrow ends;
        // - each chunk has at most one token (an `RxFrame` is not `Clone`, a chunk is on the
        //   fill ring once per reception, TX chunks come from the separate free list), and
        //   `&mut f` makes this the only reference to its bytes;
        // - u8 has no invalid values and alignment 1.
        unsafe { std::slice::from_raw_parts_mut(self.umem.ptr.as_ptr().add(start), end - start) }
    }

    /// Gives received frames back to the kernel (fill ring).
    pub(crate) fn recycle(&mut self, frames: &mut Vec<RxFrame>) {
        let mask = !(u64::from(self.frame_size) - 1);
        let n = (frames.len() as u32).min(self.fill.free(frames.len() as u32));
        for (i, f) in frames.drain(..n as usize).enumerate() {
            self.fill.write(i as u32, f.addr & mask);
        }
        self.fill.publish(n);
        // More frames than the fill ring holds cannot happen (the fill ring has room for
        // every RX frame); if it did, the chunks would only be lost to RX, not unsafe.
        frames.clear();
    }

    /// Whether the kernel asks for a wake-up to fill RX (`XDP_USE_NEED_WAKEUP`).
    pub(crate) fn rx_needs_wakeup(&self) -> bool {
        self.fill.needs_wakeup()
    }

    /// Wakes the driver's RX (recvfrom with nothing to read, as libxdp does).
    pub(crate) fn wake_rx(&self) {
        // SAFETY: a zero-length receive with null buffers touches no memory of ours.
        unsafe {
            libc::recvfrom(
                self.fd.as_raw_fd(),
                std::ptr::null_mut(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            );
        }
    }

    /// Takes sent frames back from the completion ring.
    pub(crate) fn reclaim(&mut self) {
        let n = self.comp.available();
        let mask = !(u64::from(self.frame_size) - 1);
        for i in 0..n {
            let a = self.comp.read(i);
            self.free.push(a & mask);
        }
        if n > 0 {
            self.comp.release(n);
        }
    }

    /// A free TX chunk, reclaiming completed ones when the free list is empty.
    pub(crate) fn tx_frame(&mut self) -> Option<TxFrame> {
        if self.free.is_empty() {
            self.reclaim();
        }
        self.free.pop().map(|addr| TxFrame { addr })
    }

    /// The longest frame [`Xsk::tx_buf`] holds.
    pub(crate) fn tx_room(&self) -> usize {
        (self.frame_size - self.tx_offset) as usize
    }

    /// The writable bytes of a TX chunk: where the packet goes (after the TX metadata room
    /// when there is one), up to the chunk's end.
    pub(crate) fn tx_buf<'a>(&'a mut self, f: &'a mut TxFrame) -> &'a mut [u8] {
        let start = f.addr as usize + self.tx_offset as usize;
        let len = (self.frame_size - self.tx_offset) as usize;
        if start + len > self.umem.len {
            return &mut [];
        }
        // SAFETY:
        // - `start..start+len` lies inside one chunk of the UMEM mapping (checked; `f.addr`
        //   is a chunk start and `tx_offset < frame_size`);
        // - `f` proves user space owns the chunk (taken from the free list, not on the TX
        //   ring), and `&mut f` makes this the only reference to it.
        unsafe { std::slice::from_raw_parts_mut(self.umem.ptr.as_ptr().add(start), len) }
    }

    /// Queues a written frame of `len` bytes on the TX ring (not yet visible to the kernel:
    /// see [`Xsk::tx_publish`]). With `csum = Some((start, offset))` on a socket whose
    /// [`Xsk::tx_csum`] is [`TxCsum::Offload`], the kernel is asked to fill the checksum
    /// that covers the frame from byte `start` and is stored `offset` bytes after it (the
    /// field must hold the pseudo-header sum). When the ring is full the frame goes back to
    /// the free list and `false` is returned.
    pub(crate) fn tx_push(&mut self, f: TxFrame, len: u32, csum: Option<(u16, u16)>) -> bool {
        let want = self.tx_pending + 1;
        if self.tx.free(want) < want {
            self.free.push(f.addr);
            return false;
        }
        let mut options = 0;
        if let (Some((start, offset)), TxCsum::Offload) = (csum, self.tx_csum) {
            // `struct xsk_tx_metadata` in the TX_META_LEN bytes before the packet: flags
            // (u64), then request.csum_start and request.csum_offset (u16 each), native order.
            let at = (f.addr + u64::from(self.tx_offset - TX_META_LEN)) as usize;
            let mut meta = [0u8; 12];
            meta[..8].copy_from_slice(&u64::from(libc::XDP_TXMD_FLAGS_CHECKSUM).to_ne_bytes());
            meta[8..10].copy_from_slice(&start.to_ne_bytes());
            meta[10..12].copy_from_slice(&offset.to_ne_bytes());
            if at + meta.len() <= self.umem.len {
                // SAFETY:
                // - `at..at+12` lies inside the UMEM mapping (checked) and inside `f`'s chunk
                //   (`tx_offset >= TX_META_LEN` when the mode is Offload);
                // - `f` proves user space owns the chunk until it is published below.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        meta.as_ptr(),
                        self.umem.ptr.as_ptr().add(at),
                        meta.len(),
                    )
                };
                options = libc::XDP_TX_METADATA;
            }
        }
        self.tx.write(
            self.tx_pending,
            libc::xdp_desc {
                addr: f.addr + u64::from(self.tx_offset),
                len,
                options,
            },
        );
        self.tx_pending = want;
        true
    }

    /// Publishes the queued TX descriptors to the kernel, without asking it to send them
    /// (see [`Xsk::tx_kick`]; a `poll(2)` on the socket also sends them in copy mode).
    pub(crate) fn tx_publish(&mut self) {
        if self.tx_pending > 0 {
            self.tx.publish(self.tx_pending);
            self.tx_unkicked += self.tx_pending;
            self.tx_pending = 0;
        }
    }

    /// TX descriptors published since the last [`Xsk::tx_kick`] plus those not yet published.
    pub(crate) fn tx_unkicked(&self) -> u32 {
        self.tx_unkicked + self.tx_pending
    }

    /// Whether published TX descriptors still wait for the kernel to take them, or some are
    /// queued and not yet published.
    pub(crate) fn tx_waiting(&self) -> bool {
        // Relaxed is enough for a yes/no hint: `tx_kick` re-reads it with acquire.
        self.tx_pending > 0 || self.tx.cons().load(Ordering::Relaxed) != self.tx.cached_prod
    }

    /// Publishes the queued TX descriptors and asks the kernel to send them (a `sendto`,
    /// only when something waits and the kernel needs the call: always in copy mode, where
    /// the kernel sends only from the caller's context; in zero-copy mode when the driver
    /// asks with `XDP_RING_NEED_WAKEUP`). In copy mode the kernel sends a bounded number per
    /// call, so it is asked until the ring drains or it stops making progress.
    pub(crate) fn tx_kick(&mut self) -> io::Result<()> {
        self.tx_publish();
        self.tx_unkicked = 0;
        if !(self.tx.needs_wakeup() || self.mode == BindMode::Copy) {
            self.tx_stopped = false;
            return Ok(());
        }
        self.tx_stopped = true;
        for _ in 0..64 {
            // The kernel's consumer index: everything before it has been taken for sending.
            let cons = self.tx.cons().load(Ordering::Acquire);
            if cons == self.tx.cached_prod {
                self.tx_stopped = false;
                return Ok(());
            }
            // SAFETY: a zero-length send with a null buffer touches no memory of ours; it
            // asks the kernel to process the TX ring.
            let r = unsafe {
                libc::sendto(
                    self.fd.as_raw_fd(),
                    std::ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null(),
                    0,
                )
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EAGAIN) | Some(libc::EINTR) => {}
                    // The device dropped the frame the kernel had taken (`NET_XMIT_DROP`);
                    // the rest stays on the ring for later.
                    Some(libc::EBUSY) => {
                        self.tx_busy_drops += 1;
                        return Ok(());
                    }
                    // No buffer for the skb: the frames stay on the ring for later.
                    Some(libc::ENOBUFS) => return Ok(()),
                    _ => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// Frames the device dropped after a kick handed them over (`EBUSY`), since the socket
    /// opened. They were counted sent when queued.
    pub(crate) fn tx_busy_drops(&self) -> u64 {
        self.tx_busy_drops
    }

    /// TX descriptors the kernel has not taken yet (published or not).
    pub(crate) fn tx_queued(&self) -> u32 {
        let cons = self.tx.cons().load(Ordering::Relaxed);
        self.tx_pending + self.tx.cached_prod.wrapping_sub(cons)
    }

    /// Whether the last [`Xsk::tx_kick`] stopped before the ring drained.
    pub(crate) fn tx_stopped(&self) -> bool {
        self.tx_stopped
    }

    /// Called at a fixed interval: true when TX descriptors waited at the previous call
    /// and still wait now with the kernel having taken none in between (sends fail, e.g.
    /// the interface went down, or the device stopped draining).
    pub(crate) fn tx_stalled(&mut self) -> bool {
        let cons = self.tx.cons().load(Ordering::Acquire);
        let waiting = cons != self.tx.cached_prod;
        let stalled = waiting && self.tx_waiting_seen && cons == self.tx_cons_seen;
        self.tx_cons_seen = cons;
        self.tx_waiting_seen = waiting;
        stalled
    }

    /// The kernel's drop counters for this socket.
    pub(crate) fn stats(&self) -> io::Result<libc::xdp_statistics> {
        let mut st = MaybeUninit::<libc::xdp_statistics>::zeroed();
        let mut len = size_of::<libc::xdp_statistics>() as libc::socklen_t;
        // SAFETY: `st` is writable for `len` bytes and `len` is a live socklen_t.
        cvt(unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_XDP,
                libc::XDP_STATISTICS,
                st.as_mut_ptr().cast(),
                &mut len,
            )
        })?;
        // SAFETY: zero-initialised, then (partly, for older kernels) filled by the kernel.
        Ok(unsafe { st.assume_init() })
    }
}

impl AsFd for Xsk {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
