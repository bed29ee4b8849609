//! The mappings under an AF_XDP socket: [`Mmap`] (UMEM or ring memory, unmapped on drop)
//! and [`Ring`], one mapped ring with the acquire/release protocol of the crate doc.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

/// An anonymous or ring mapping, unmapped on drop.
pub(super) struct Mmap {
    pub(super) ptr: NonNull<u8>,
    pub(super) len: usize,
}

impl Mmap {
    /// `mmap(len)` of `fd` at `offset` (shared) or anonymous memory (`fd` = None).
    pub(super) fn new(len: usize, fd: Option<BorrowedFd<'_>>, offset: u64) -> io::Result<Mmap> {
        let (flags, raw) = match fd {
            Some(fd) => (libc::MAP_SHARED | libc::MAP_POPULATE, fd.as_raw_fd()),
            None => (
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
            ),
        };
        // SAFETY:
        // - a fresh mapping at an address the kernel picks: it aliases no Rust object;
        // - `raw` is a live fd (borrowed for the call) or -1 with MAP_ANONYMOUS.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                raw,
                offset as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mmap {
            ptr: NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned NULL"))?,
            len,
        })
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY:
        // - `ptr`/`len` are exactly one mapping made by `Mmap::new`, unmapped only here;
        // - no reference into it outlives the owner (frames borrow the `Xsk`).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// Ring descriptor types.
pub(super) trait Desc: Copy {}
impl Desc for u64 {}
impl Desc for libc::xdp_desc {}

/// One mapped ring. `cached_prod`/`cached_cons` are this side's copies of the indices.
pub(super) struct Ring<T: Desc> {
    _map: Mmap,
    producer: NonNull<AtomicU32>,
    consumer: NonNull<AtomicU32>,
    flags: NonNull<AtomicU32>,
    descs: NonNull<T>,
    mask: u32,
    size: u32,
    pub(super) cached_prod: u32,
    cached_cons: u32,
}

impl<T: Desc> Ring<T> {
    pub(super) fn map(
        fd: BorrowedFd<'_>,
        off: &libc::xdp_ring_offset,
        entries: u32,
        pgoff: u64,
    ) -> io::Result<Ring<T>> {
        let len = off.desc as usize + entries as usize * size_of::<T>();
        let map = Mmap::new(len, Some(fd), pgoff)?;
        let at = |o: u64| -> io::Result<NonNull<u8>> {
            if o as usize + 4 > len {
                return Err(io::Error::other("ring offset outside the mapping"));
            }
            // SAFETY: `o + 4 <= len` (checked), so the result stays inside the mapping.
            Ok(unsafe { map.ptr.add(o as usize) })
        };
        let producer = at(off.producer)?.cast();
        let consumer = at(off.consumer)?.cast();
        let flags = at(off.flags)?.cast();
        let descs = at(off.desc)?.cast();
        let mut r = Ring {
            _map: map,
            producer,
            consumer,
            flags,
            descs,
            mask: entries - 1,
            size: entries,
            cached_prod: 0,
            cached_cons: 0,
        };
        r.cached_prod = r.prod().load(Ordering::Acquire);
        r.cached_cons = r.cons().load(Ordering::Acquire);
        Ok(r)
    }

    pub(super) fn prod(&self) -> &AtomicU32 {
        // SAFETY:
        // - `producer` points at a 4-byte-aligned u32 inside the live mapping (the kernel's
        //   `xdp_ring_offset`), which lives as long as `self`;
        // - it is only ever accessed atomically, by us and by the kernel.
        unsafe { self.producer.as_ref() }
    }

    pub(super) fn cons(&self) -> &AtomicU32 {
        // SAFETY: as for `prod`.
        unsafe { self.consumer.as_ref() }
    }

    pub(super) fn needs_wakeup(&self) -> bool {
        // SAFETY: as for `prod`; the flags word is written by the kernel, read atomically.
        let f = unsafe { self.flags.as_ref() }.load(Ordering::Relaxed);
        f & libc::XDP_RING_NEED_WAKEUP != 0
    }

    /// Producer side: free slots, refreshing the kernel's consumer index (acquire) only when
    /// the cached view has fewer than `want`.
    pub(super) fn free(&mut self, want: u32) -> u32 {
        let mut free = self.size - self.cached_prod.wrapping_sub(self.cached_cons);
        if free < want {
            // Acquire: the kernel's reads of the slots it consumed happen before we reuse
            // them (pairs with its smp_store_release of `consumer`).
            self.cached_cons = self.cons().load(Ordering::Acquire);
            free = self.size - self.cached_prod.wrapping_sub(self.cached_cons);
        }
        free
    }

    /// Producer side: writes `d` into slot `cached_prod + i` (not yet visible).
    pub(super) fn write(&mut self, i: u32, d: T) {
        let idx = (self.cached_prod.wrapping_add(i) & self.mask) as usize;
        // SAFETY:
        // - `idx <= mask < size`: inside the descriptor array of the live mapping;
        // - the slot is free (callers write at most `free()` slots), so the kernel does not
        //   read it until `publish` releases it.
        unsafe { self.descs.as_ptr().add(idx).write_volatile(d) }
    }

    /// Producer side: makes `n` written slots visible to the kernel.
    pub(super) fn publish(&mut self, n: u32) {
        self.cached_prod = self.cached_prod.wrapping_add(n);
        // Release: every descriptor (and frame byte) written before is visible to the kernel
        // once it sees the new index (it loads it with smp_load_acquire).
        self.prod().store(self.cached_prod, Ordering::Release);
    }

    /// Consumer side: entries ready, refreshing the kernel's producer index (acquire).
    pub(super) fn available(&mut self) -> u32 {
        // Acquire: pairs with the kernel's smp_store_release of `producer`, made after it
        // wrote the descriptors and frame bytes.
        self.cached_prod = self.prod().load(Ordering::Acquire);
        self.cached_prod.wrapping_sub(self.cached_cons)
    }

    /// Consumer side: reads slot `cached_cons + i` (which must be `< available()`).
    pub(super) fn read(&self, i: u32) -> T {
        let idx = (self.cached_cons.wrapping_add(i) & self.mask) as usize;
        // SAFETY:
        // - `idx < size`: inside the descriptor array of the live mapping;
        // - the slot is between our consumer and the producer we acquired, so the kernel
        //   wrote it before publishing and does not touch it until we release it.
        unsafe { self.descs.as_ptr().add(idx).read_volatile() }
    }

    /// Consumer side: gives `n` read slots back to the kernel.
    pub(super) fn release(&mut self, n: u32) {
        self.cached_cons = self.cached_cons.wrapping_add(n);
        // Release: our reads of those slots happen before the kernel may overwrite them.
        self.cons().store(self.cached_cons, Ordering::Release);
    }
}
