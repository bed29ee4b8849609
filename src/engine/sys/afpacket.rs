//! Unsafe core of the AF_PACKET engine: the socket syscalls and the mmapped TPACKET_V3 or
//! TPACKET_V2 ring.
//!
//! Owns: every raw pointer and raw fd of the engine, and the memory-ordering protocol of the
//! ring. Must not touch: packet parsing, policy, errors shown to operators — that is
//! `engine::afpacket`, which is safe code on top of this module.
//!
//! # The ring protocol (TPACKET_V3)
//!
//! The ring is `block_count` blocks of `block_size` bytes shared with the kernel. Each block
//! starts with a `tpacket_block_desc` whose `block_status` word says who owns the block:
//! `TP_STATUS_KERNEL` (0) — the kernel may write it; `TP_STATUS_USER` — the kernel has
//! filled and closed it and will not touch it until user space stores `TP_STATUS_KERNEL`
//! again. The kernel publishes a block with `smp_wmb()` before the status store, so an
//! *acquire* load that sees `TP_STATUS_USER` makes all packet bytes of the block visible;
//! user space hands it back with a *release* store, so all its reads of the block happen
//! before the kernel may overwrite it. [`RawBlock`] is the only way to see block bytes and
//! the only way to hand a block back, so those two steps cannot be separated or reordered.
//!
//! # TPACKET_V2
//!
//! A V2 ring is `frame_nr` frames of `frame_size` bytes, each starting with a `tpacket2_hdr`
//! whose first word `tp_status` follows the same protocol per frame (the kernel publishes
//! each frame with `smp_wmb()` before setting `TP_STATUS_USER`, and takes it back when user
//! space stores `TP_STATUS_KERNEL`). [`RingMap`] therefore deals in *slots*: a V3 block
//! (status word at [`BLOCK_STATUS_OFFSET`]) or a V2 frame (status word at
//! [`FRAME_STATUS_OFFSET`]); everything else is the same.

use std::ffi::CStr;
use std::io;
use std::marker::PhantomData;
use std::mem::{size_of, MaybeUninit};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

/// Byte offset of `block_status` inside a block (`tpacket_block_desc.hdr.bh1.block_status`).
pub(crate) const BLOCK_STATUS_OFFSET: usize = std::mem::offset_of!(libc::tpacket_block_desc, hdr)
    + std::mem::offset_of!(libc::tpacket_hdr_v1, block_status);

/// Byte offset of `tp_status` inside a TPACKET_V2 frame (`tpacket2_hdr.tp_status`).
pub(crate) const FRAME_STATUS_OFFSET: usize = std::mem::offset_of!(libc::tpacket2_hdr, tp_status);

/// Turn a `-1` return into `io::Error::last_os_error()`, retrying on `EINTR`. The one place
/// where interrupted system calls are retried.
fn cvt_retry<T: PartialEq + From<i8>>(mut f: impl FnMut() -> T) -> io::Result<T> {
    loop {
        let r = f();
        if r != T::from(-1) {
            return Ok(r);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// `socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, 0)`: a packet socket that receives nothing
/// until it is bound with a protocol (so nothing from other interfaces slips in before
/// `bind`).
pub(crate) fn packet_socket() -> io::Result<OwnedFd> {
    // SAFETY: socket(2) takes plain integers and touches no memory of ours.
    let fd = cvt_retry(|| unsafe {
        libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0)
    })?;
    // SAFETY:
    // - `fd` was just returned by a successful socket(2) call, so it is an open descriptor;
    // - nothing else owns it: it becomes owned (closed on drop) here, once.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `if_nametoindex(3)`: `Err` with the OS error (ENODEV for an unknown name).
pub(crate) fn if_nametoindex(name: &CStr) -> io::Result<u32> {
    // SAFETY: `name` is a valid NUL-terminated string that outlives the call, which only
    // reads it.
    let idx = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if idx == 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(idx)
    }
}

/// Plain-old-data option values that may be handed to `setsockopt(2)` by address.
pub(crate) trait SockOptValue: Copy {}
impl SockOptValue for libc::c_int {}
impl SockOptValue for libc::tpacket_req3 {}
impl SockOptValue for libc::tpacket_req {}
impl SockOptValue for libc::sock_fprog {}

/// `setsockopt(fd, level, name, &value, sizeof value)`.
pub(crate) fn set_opt<T: SockOptValue>(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> io::Result<()> {
    cvt_retry(|| {
        // SAFETY:
        // - `value` is a live reference to a `T`, readable for `size_of::<T>()` bytes;
        // - `T: SockOptValue` is a `repr(C)` kernel ABI type, so the kernel reads the layout
        //   it expects; the kernel only reads the buffer during the call;
        // - `fd` is a borrowed, open descriptor.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                level,
                name,
                (value as *const T).cast(),
                size_of::<T>() as libc::socklen_t,
            )
        }
    })?;
    Ok(())
}

/// `SO_ATTACH_FILTER` with a classic BPF program (the kernel copies it).
pub(crate) fn attach_filter(fd: BorrowedFd<'_>, program: &[libc::sock_filter]) -> io::Result<()> {
    let len =
        u16::try_from(program.len()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let prog = libc::sock_fprog {
        len,
        // The kernel only reads through this pointer (copy_from_user) during the call.
        filter: program.as_ptr().cast_mut(),
    };
    set_opt(fd, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &prog)
}

/// `SO_DETACH_FILTER`; ENOENT (no filter attached) is success.
pub(crate) fn detach_filter(fd: BorrowedFd<'_>) -> io::Result<()> {
    match set_opt(
        fd,
        libc::SOL_SOCKET,
        libc::SO_DETACH_FILTER,
        &0 as &libc::c_int,
    ) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        r => r,
    }
}

/// `getsockopt(PACKET_STATISTICS)` for TPACKET_V3; the kernel resets its counters on read.
pub(crate) fn packet_stats_v3(fd: BorrowedFd<'_>) -> io::Result<libc::tpacket_stats_v3> {
    let mut st = MaybeUninit::<libc::tpacket_stats_v3>::zeroed();
    let mut len = size_of::<libc::tpacket_stats_v3>() as libc::socklen_t;
    cvt_retry(|| {
        // SAFETY:
        // - `st` is writable for `len` bytes and `len` is a live, writable socklen_t;
        // - `fd` is a borrowed, open descriptor.
        unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                st.as_mut_ptr().cast(),
                &mut len,
            )
        }
    })?;
    // SAFETY: the struct was zero-initialised (a valid value of three u32s) and the kernel
    // may only have overwritten a prefix of it.
    Ok(unsafe { st.assume_init() })
}

/// `bind(2)` to an interface with an ethertype (`protocol` in host order).
pub(crate) fn bind_ll(fd: BorrowedFd<'_>, ifindex: u32, protocol: u16) -> io::Result<()> {
    // SAFETY: sockaddr_ll is plain integers and arrays; all-zero is a valid value.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as libc::c_ushort;
    sll.sll_protocol = protocol.to_be();
    sll.sll_ifindex =
        libc::c_int::try_from(ifindex).map_err(|_| io::Error::from_raw_os_error(libc::ENODEV))?;
    cvt_retry(|| {
        // SAFETY: `sll` is a live sockaddr_ll and the length passed is its size; the kernel
        // only reads it during the call; `fd` is a borrowed, open descriptor.
        unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        }
    })?;
    Ok(())
}

/// `poll(2)` for input on one descriptor. `Ok(false)` on timeout. A negative timeout waits
/// forever. After `EINTR` the wait restarts with the full timeout.
pub(crate) fn poll_readable(fd: BorrowedFd<'_>, timeout_ms: i32) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN | libc::POLLRDNORM | libc::POLLERR,
        revents: 0,
    };
    // SAFETY: `pfd` is one live, writable pollfd and we pass nfds = 1.
    let n = cvt_retry(|| unsafe { libc::poll(&mut pfd, 1, timeout_ms) })?;
    Ok(n > 0)
}

/// The system page size.
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf only reads a constant of the running system.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).unwrap_or(4096)
}

/// The mmapped RX ring of one packet socket, as `block_count` slots of `block_size` bytes (a
/// slot is a V3 block or a V2 frame, see the module doc). Unmapped on drop.
///
/// Invariants: `base` points to a live `MAP_SHARED` mapping of `block_size * block_count`
/// bytes set up by `PACKET_RX_RING` + `mmap`; `block_size` is a multiple of 16 (the mapping
/// is page aligned, so every slot start is 16-aligned); `status_offset` is a multiple of 4
/// and `status_offset + 4 <= block_size` (so every slot's status word is a 4-aligned `u32`
/// inside its slot).
pub(crate) struct RingMap {
    base: NonNull<u8>,
    block_size: usize,
    block_count: usize,
    status_offset: usize,
}

// SAFETY: the mapping is plain shared memory, valid from any thread; `RingMap` has no
// thread-affine state. It is deliberately not `Sync`: blocks are handed out through
// `&mut self`, and two threads consuming one ring would break the in-order protocol.
unsafe impl Send for RingMap {}

impl RingMap {
    /// mmap the ring of `fd`, which must already have `PACKET_RX_RING` set with exactly
    /// this length (the kernel checks the length against the ring it allocated), as
    /// `block_count` slots of `block_size` bytes whose status word is at `status_offset`
    /// ([`BLOCK_STATUS_OFFSET`] for V3 blocks, [`FRAME_STATUS_OFFSET`] for V2 frames).
    pub(crate) fn map(
        fd: BorrowedFd<'_>,
        block_size: usize,
        block_count: usize,
        status_offset: usize,
    ) -> io::Result<Self> {
        if !block_size.is_multiple_of(16)
            || !status_offset.is_multiple_of(4)
            || status_offset + 4 > block_size
        {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let len = block_size
            .checked_mul(block_count)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY:
        // - a fresh mapping at an address the kernel picks (NULL hint), so no existing Rust
        //   memory is replaced;
        // - `len` is the ring length; the kernel refuses a length that does not match.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EFAULT))?;
        Ok(RingMap {
            base,
            block_size,
            block_count,
            status_offset,
        })
    }

    pub(crate) fn block_count(&self) -> usize {
        self.block_count
    }

    fn status_word(&self, idx: usize) -> &AtomicU32 {
        assert!(idx < self.block_count, "block index out of range");
        // SAFETY:
        // - `idx < block_count` and `status_offset + 4 <= block_size`, so the word lies
        //   inside slot `idx` of the live mapping;
        // - slot starts are 16-aligned and `status_offset` is a multiple of 4, so the word
        //   is 4-aligned;
        // - the kernel and we only ever access this word as a 32-bit value (the kernel with
        //   WRITE_ONCE/READ_ONCE plus barriers), so treating it as an atomic is sound;
        // - the returned reference lives no longer than `&self`, i.e. than the mapping.
        unsafe {
            AtomicU32::from_ptr(
                self.base
                    .as_ptr()
                    .add(idx * self.block_size + self.status_offset)
                    .cast::<u32>(),
            )
        }
    }

    /// True if block `idx` is owned by user space (acquire load).
    pub(crate) fn is_ready(&self, idx: usize) -> bool {
        self.status_word(idx).load(Ordering::Acquire) & libc::TP_STATUS_USER != 0
    }

    /// Take block `idx` if the kernel has handed it to user space. The block goes back to
    /// the kernel when the returned value is dropped.
    pub(crate) fn take(&mut self, idx: usize) -> Option<RawBlock<'_>> {
        if !self.is_ready(idx) {
            return None;
        }
        // SAFETY: `idx < block_count` (checked by `is_ready`), so the block lies inside the
        // mapping.
        let start = unsafe { self.base.add(idx * self.block_size) };
        Some(RawBlock {
            start,
            len: self.block_size,
            status: start.as_ptr().wrapping_add(self.status_offset).cast(),
            _ring: PhantomData,
        })
    }
}

impl Drop for RingMap {
    fn drop(&mut self) {
        // SAFETY: `base`/length describe the mapping created in `map`; no `RawBlock` can be
        // alive (each borrows `&mut self`), so nothing refers into it any more.
        unsafe {
            libc::munmap(
                self.base.as_ptr().cast(),
                self.block_size * self.block_count,
            );
        }
    }
}

impl RingMap {
    /// Takes up to `max` consecutive blocks from `first` on (wrapping) that the kernel has
    /// handed to user space, all at once; they go back to the kernel together, in ring
    /// order, when the returned value is dropped. Empty when block `first` is not ready.
    pub(crate) fn take_run(&mut self, first: usize, max: usize) -> RawRun<'_> {
        let mut n = 0;
        while n < max.min(self.block_count) && self.is_ready((first + n) % self.block_count) {
            n += 1;
        }
        RawRun {
            base: self.base,
            block_size: self.block_size,
            block_count: self.block_count,
            status_offset: self.status_offset,
            first: first % self.block_count.max(1),
            n,
            _ring: PhantomData,
        }
    }
}

/// Consecutive blocks owned by user space (see [`RingMap::take_run`]). Each block's bytes are
/// readable through [`RawRun::bytes`] for as long as the run lives; dropping it hands every
/// block back to the kernel.
pub(crate) struct RawRun<'a> {
    base: NonNull<u8>,
    block_size: usize,
    block_count: usize,
    status_offset: usize,
    first: usize,
    n: usize,
    /// Exclusive borrow of the ring: no other block, no unmapping, while this run lives.
    _ring: PhantomData<&'a mut RingMap>,
}

impl RawRun<'_> {
    /// Number of blocks in the run.
    pub(crate) fn len(&self) -> usize {
        self.n
    }

    /// The whole of block `k` of the run (`k < len()`), descriptor included.
    pub(crate) fn bytes(&self, k: usize) -> &[u8] {
        assert!(k < self.n, "block of the run out of range");
        let idx = (self.first + k) % self.block_count;
        // SAFETY:
        // - `idx < block_count`, so `idx * block_size .. + block_size` is one block inside
        //   the live mapping (`_ring` keeps the ring borrowed, so it cannot be unmapped);
        // - `take_run` saw TP_STATUS_USER on this block with an acquire load: the kernel
        //   finished writing it and does not write it again until we store
        //   TP_STATUS_KERNEL, which only `Drop` does, after every `&[u8]` returned here has
        //   ended (they borrow `self`);
        // - u8 has no invalid values and alignment 1.
        unsafe {
            std::slice::from_raw_parts(
                self.base.as_ptr().add(idx * self.block_size),
                self.block_size,
            )
        }
    }
}

impl<'a> RawRun<'a> {
    /// Every block of the run, writable, in ring order: for rewriting payloads in place
    /// (media strip) before they are sent straight from the ring.
    pub(crate) fn bytes_mut(&mut self) -> impl Iterator<Item = &mut [u8]> + '_ {
        let (base, size, count, first) = (self.base, self.block_size, self.block_count, self.first);
        (0..self.n).map(move |k| {
            let idx = (first + k) % count;
            // SAFETY:
            // - `idx < block_count`, so `idx * block_size .. + block_size` is one block inside
            //   the live mapping, which is mapped PROT_READ | PROT_WRITE (`_ring` keeps the
            //   ring borrowed, so it cannot be unmapped);
            // - `k < n <= block_count` takes each block of the run once, so the slices
            //   handed out are disjoint; they borrow `self` mutably, so no `bytes()` view
            //   and no `Drop` (which hands the blocks back) overlaps them;
            // - the kernel does not write a block it handed to user space (TP_STATUS_USER,
            //   acquired in `take_run`) until `Drop` stores TP_STATUS_KERNEL;
            // - u8 has no invalid values and alignment 1.
            unsafe { std::slice::from_raw_parts_mut(base.as_ptr().add(idx * size), size) }
        })
    }
}

impl Drop for RawRun<'_> {
    fn drop(&mut self) {
        for k in 0..self.n {
            let idx = (self.first + k) % self.block_count;
            // SAFETY:
            // - `idx < block_count`: the 4-aligned status word of a slot inside the live
            //   mapping (16-aligned slot start, `status_offset` a multiple of 4 inside it);
            // - release ordering: every read of the block's bytes (all `bytes()` borrows
            //   have ended, they borrow `self`) happens before the kernel can observe
            //   TP_STATUS_KERNEL and start refilling it.
            unsafe {
                AtomicU32::from_ptr(
                    self.base
                        .as_ptr()
                        .add(idx * self.block_size + self.status_offset)
                        .cast::<u32>(),
                )
            }
            .store(libc::TP_STATUS_KERNEL, Ordering::Release);
        }
    }
}

/// A packet socket for sending ready-made Ethernet frames out of interface `ifindex`: bound
/// with protocol 0 (it receives nothing), `PACKET_QDISC_BYPASS` (frames go straight to the
/// driver, as AF_XDP TX does) and `PACKET_VNET_HDR` (each frame starts with a
/// `virtio_net_hdr` that asks for the UDP checksum to be filled in by the device or, where it
/// cannot, by the kernel just before the driver).
///
/// Its send buffer is raised to [`TX_SNDBUF`] (past `wmem_max` where the process has
/// CAP_NET_ADMIN): a NIC holds each frame until its transmit completes, and a round of a few
/// hundred frames must not find the default 208 KiB full.
pub(crate) fn packet_tx_socket(ifindex: u32) -> io::Result<OwnedFd> {
    let fd = packet_socket()?;
    bind_ll(fd.as_fd(), ifindex, 0)?;
    set_opt(fd.as_fd(), libc::SOL_PACKET, libc::PACKET_QDISC_BYPASS, &1)?;
    set_opt(fd.as_fd(), libc::SOL_PACKET, libc::PACKET_VNET_HDR, &1)?;
    if set_opt(
        fd.as_fd(),
        libc::SOL_SOCKET,
        libc::SO_SNDBUFFORCE,
        &TX_SNDBUF,
    )
    .is_err()
    {
        // Without CAP_NET_ADMIN: as much as wmem_max allows.
        let _ = set_opt(fd.as_fd(), libc::SOL_SOCKET, libc::SO_SNDBUF, &TX_SNDBUF);
    }
    Ok(fd)
}

/// Send buffer asked for by [`packet_tx_socket`].
pub(crate) const TX_SNDBUF: libc::c_int = 4 << 20;

/// A block owned by user space. Its bytes are readable through [`RawBlock::bytes`] for as
/// long as it lives; dropping it hands the block back to the kernel.
pub(crate) struct RawBlock<'a> {
    start: NonNull<u8>,
    len: usize,
    status: *mut u32,
    /// Exclusive borrow of the ring: no second block, no unmapping, while this one lives.
    _ring: PhantomData<&'a mut RingMap>,
}

impl RawBlock<'_> {
    /// The whole block, descriptor included.
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY:
        // - `start..start+len` is one block inside the live mapping (`_ring` keeps the ring
        //   borrowed, so it cannot be unmapped);
        // - the acquire load in `RingMap::take` saw TP_STATUS_USER: the kernel finished
        //   writing the block before publishing it and does not write it again until we
        //   store TP_STATUS_KERNEL, which only `Drop` does, after every `&[u8]` returned
        //   here has ended (they borrow `self`);
        // - u8 has no invalid values and alignment 1.
        unsafe { std::slice::from_raw_parts(self.start.as_ptr(), self.len) }
    }
}

impl Drop for RawBlock<'_> {
    fn drop(&mut self) {
        // SAFETY:
        // - `status` points to the slot's 4-aligned status word inside the live mapping;
        // - release ordering: every read of this block's bytes (all `bytes()` borrows have
        //   ended, they borrow `self`) happens before the kernel can observe
        //   TP_STATUS_KERNEL and start refilling the block.
        unsafe { AtomicU32::from_ptr(self.status) }
            .store(libc::TP_STATUS_KERNEL, Ordering::Release);
    }
}

/// `getsockopt(fd, level, name)` for an `int` option.
pub(crate) fn get_opt_int(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
) -> io::Result<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    cvt_retry(|| {
        // SAFETY:
        // - `v` is a live, writable c_int and `len` its size, a live writable socklen_t;
        // - `fd` is a borrowed, open descriptor.
        unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                level,
                name,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        }
    })?;
    Ok(v)
}

/// `struct ethtool_channels` (`linux/ethtool.h`).
#[repr(C)]
#[derive(Default)]
struct EthtoolChannels {
    cmd: u32,
    max_rx: u32,
    max_tx: u32,
    max_other: u32,
    max_combined: u32,
    rx_count: u32,
    tx_count: u32,
    other_count: u32,
    combined_count: u32,
}

/// `struct ifreq` as `SIOCETHTOOL` reads it: the name and a pointer to the command.
#[repr(C)]
struct IfreqData {
    name: [libc::c_char; libc::IFNAMSIZ],
    data: *mut libc::c_void,
    /// `struct ifreq` is 40 bytes on 64-bit Linux; the kernel copies all of it.
    _pad: [u8; 16],
}

const ETHTOOL_GCHANNELS: u32 = 0x3c;

/// The number of RX queues of interface `name` (`ETHTOOL_GCHANNELS`: combined + rx-only
/// channels), asked through `fd` (any socket of the interface's network namespace).
/// `Err(EOPNOTSUPP)` when the driver has no channel information (e.g. `lo`).
pub(crate) fn rx_queues(fd: BorrowedFd<'_>, name: &CStr) -> io::Result<u32> {
    let bytes = name.to_bytes();
    if bytes.len() >= libc::IFNAMSIZ {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut ch = EthtoolChannels {
        cmd: ETHTOOL_GCHANNELS,
        ..Default::default()
    };
    let mut req = IfreqData {
        name: [0; libc::IFNAMSIZ],
        data: (&mut ch as *mut EthtoolChannels).cast(),
        _pad: [0; 16],
    };
    for (d, s) in req.name.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    cvt_retry(|| {
        // SAFETY:
        // - `req` is a live ifreq-sized struct with a NUL-terminated name (the array is
        //   zero-filled past the copied bytes, and the name is shorter than IFNAMSIZ);
        // - its data pointer points to `ch`, a live ethtool_channels the kernel fills in
        //   during the call and does not keep;
        // - `fd` is a borrowed, open descriptor.
        unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCETHTOOL as _, &mut req) }
    })?;
    Ok(ch.combined_count + ch.rx_count)
}
