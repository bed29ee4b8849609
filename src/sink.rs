//! [`EdgeSink`]: where an engine hands a route's admitted packets when the far side of the
//! route is a stream leg the gateway terminates itself (UDP → TCP, and TCP → TCP across the
//! split).
//!
//! Buffers allocated once when the leg is made, in two pools: [`DEFAULT_SLOTS`] small ones
//! of [`SLOT_BYTES`], and, only when the leg's maximum packet (`max_payload`, from
//! `Config::leg_max_payload`) is longer, [`LARGE_SLOTS`] large ones of that maximum. Each
//! pool has a lock-free free list of buffer indices; one ready queue of (pool, index,
//! length) keeps the packets' order across sizes. The engine's [`EdgeSink::offer`] takes a
//! free buffer of the packet's pool, copies only the payload's bytes in, queues it and wakes
//! the leg's thread through an eventfd only when that thread is asleep; [`EdgeSink::take`]
//! lends the next packet, whose buffer goes back to its free list when the [`Taken`] is
//! dropped. No allocation, lock or log per packet. Memory per leg: `slots × 2 KiB`, plus
//! `LARGE_SLOTS × max_payload` when `max_payload` > 2 KiB (512 KiB + 16 × 64 KiB = 1.5 MiB
//! at most with the defaults). A packet whose pool has no free buffer (the leg's peer is not
//! reading), one longer than `max_payload`, or one offered after the leg closed is refused;
//! the engine counts it as `leg_stall` and the leg counts it in its own `stalls`.
//!
//! Ownership protocol (what makes the `unsafe` here sound): a buffer index is in exactly one
//! place at a time — its pool's free list, the ready queue, or the hands of the one thread
//! that popped it from either (a producer between its free-list pop and its ready push; the
//! consumer holding a [`Taken`]). Only that holder touches the buffer's bytes. The queues
//! are crossbeam `ArrayQueue`s, whose push (Release) and pop (Acquire) order the previous
//! holder's accesses before the next holder's.

use std::cell::UnsafeCell;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;

use crossbeam_queue::ArrayQueue;
use nix::sys::eventfd::{EfdFlags, EventFd};

use crate::stats::leg::LegCounters;

/// A small buffer's length: packets up to this long take one.
pub const SLOT_BYTES: usize = 2048;
/// Small buffers per sink: about 80 ms of a 20 Mbit/s stream.
pub const DEFAULT_SLOTS: usize = 256;
/// Large buffers (of the leg's `max_payload`) per sink whose maximum exceeds [`SLOT_BYTES`]:
/// 16 packets of 4 KiB queued at once is a 64 KiB burst (a video frame's worth at the
/// rates these legs carry); more waiting means the leg's peer is not keeping up.
pub const LARGE_SLOTS: usize = 16;

/// One pool of equal buffers and its free list.
struct Pool {
    /// Each buffer's length.
    size: usize,
    /// `count × size` bytes; buffer `i` is `bytes[i × size ..][.. size]`.
    bytes: Box<[UnsafeCell<u8>]>,
    /// Indices of the buffers nobody holds.
    free: ArrayQueue<u32>,
}

impl Pool {
    fn new(count: usize, size: usize) -> Pool {
        let free = ArrayQueue::new(count.max(1));
        for i in 0..count {
            let _ = free.push(i as u32);
        }
        Pool {
            size,
            bytes: (0..count * size).map(|_| UnsafeCell::new(0)).collect(),
            free,
        }
    }

    /// Buffer `i`'s first byte (`UnsafeCell<u8>` has `u8`'s layout).
    fn ptr(&self, i: u32) -> *mut u8 {
        UnsafeCell::raw_get(self.bytes[i as usize * self.size..].as_ptr())
    }
}

/// A queued packet: its pool (0 small, 1 large), buffer index and length.
#[derive(Clone, Copy)]
struct Ready {
    pool: u8,
    index: u32,
    len: u32,
}

/// A packet lent by [`EdgeSink::take`]; its buffer returns to the sink when this is dropped.
pub struct Taken<'a> {
    sink: &'a EdgeSink,
    ready: Ready,
}

impl Taken<'_> {
    pub fn payload(&self) -> &[u8] {
        let pool = &self.sink.pools[usize::from(self.ready.pool)];
        // SAFETY: this `Taken` holds the buffer (popped from the ready queue, see the module
        // doc): no producer writes it until `drop` pushes its index to the free list, and a
        // producer wrote `len` ≤ `pool.size` bytes before the push this pop paired with.
        unsafe { std::slice::from_raw_parts(pool.ptr(self.ready.index), self.ready.len as usize) }
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        let pool = &self.sink.pools[usize::from(self.ready.pool)];
        // Cannot fail: the free list has room for every buffer of its pool.
        let _ = pool.free.push(self.ready.index);
    }
}

/// The engine's end of a stream leg: see the module doc.
pub struct EdgeSink {
    /// Small, and large when `max_payload` > [`SLOT_BYTES`].
    pools: Vec<Pool>,
    /// Packets in offer order; room for every buffer, so a push never fails.
    ready: ArrayQueue<Ready>,
    max_payload: usize,
    wake: EventFd,
    /// The leg's thread is (about to be) asleep: the next offer writes the eventfd.
    sleeping: AtomicBool,
    /// The leg has closed: offers are refused at once.
    closed: AtomicBool,
    pub counters: Arc<LegCounters>,
}

// SAFETY: the pools' `UnsafeCell` bytes are only touched by the holder of their buffer's
// index, which the queues hand from one thread to the next (see the module doc).
unsafe impl Sync for EdgeSink {}

impl std::fmt::Debug for EdgeSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EdgeSink")
            .field("queued", &self.ready.len())
            .field("capacity", &self.ready.capacity())
            .field("max_payload", &self.max_payload)
            .finish()
    }
}

impl EdgeSink {
    /// `slots` small buffers; packets up to `max_payload` bytes (at least [`SLOT_BYTES`]
    /// is never refused for length when `max_payload` is that long; a maximum under it is
    /// still enforced), with [`LARGE_SLOTS`] large buffers when it exceeds [`SLOT_BYTES`].
    pub fn new(
        slots: usize,
        max_payload: usize,
        counters: Arc<LegCounters>,
    ) -> std::io::Result<EdgeSink> {
        Self::with_large(slots, max_payload, LARGE_SLOTS, counters)
    }

    /// [`EdgeSink::new`] with `large` large buffers.
    pub fn with_large(
        slots: usize,
        max_payload: usize,
        large: usize,
        counters: Arc<LegCounters>,
    ) -> std::io::Result<EdgeSink> {
        let slots = slots.max(1);
        let mut pools = vec![Pool::new(slots, SLOT_BYTES.min(max_payload))];
        let mut total = slots;
        if max_payload > SLOT_BYTES {
            let large = large.max(1);
            pools.push(Pool::new(large, max_payload));
            total += large;
        }
        Ok(EdgeSink {
            pools,
            ready: ArrayQueue::new(total),
            max_payload,
            wake: EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?,
            sleeping: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            counters,
        })
    }

    /// The longest packet [`EdgeSink::offer`] takes.
    pub fn max_payload(&self) -> usize {
        self.max_payload
    }

    /// Queues one packet for the leg; `false` (counted in the leg's `stalls`) when its pool
    /// has no free buffer, the packet is longer than the maximum or the leg has closed.
    #[inline]
    pub fn offer(&self, payload: &[u8]) -> bool {
        if !self.push(payload) {
            self.counters.stalls.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        // Pairs with the fence in `prepare_sleep` (store-buffering: push then load
        // `sleeping` here, store `sleeping` then load the queue there). With a SeqCst fence
        // on both sides at least one of them sees the other's write, so either the leg sees
        // this packet and does not sleep, or this sees it sleeping and wakes it. Without
        // them both could read the old values (allowed by the model, real on ARMv8): a lost
        // wake-up, bounded only by the leg's 100 ms poll.
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) && self.sleeping.swap(false, Ordering::AcqRel) {
            let _ = self.wake.write(1);
        }
        true
    }

    /// Copies `payload` into a free buffer and queues it; `false`: refused.
    #[inline]
    fn push(&self, payload: &[u8]) -> bool {
        let len = payload.len();
        if len > self.max_payload || self.closed.load(Ordering::Relaxed) {
            return false;
        }
        let pool = usize::from(len > SLOT_BYTES);
        let p = &self.pools[pool];
        let Some(index) = p.free.pop() else {
            return false;
        };
        // SAFETY: `index` was just popped from the free list, so this thread holds the
        // buffer (module doc): nobody else reads or writes it until the ready push below.
        // `len` ≤ `p.size` (small pool: `len` ≤ SLOT_BYTES and ≤ max_payload; large pool:
        // ≤ max_payload), so the copy stays within buffer `index`.
        unsafe { std::ptr::copy_nonoverlapping(payload.as_ptr(), p.ptr(index), len) };
        let ready = Ready {
            pool: pool as u8,
            index,
            len: len as u32,
        };
        if self.ready.push(ready).is_err() {
            // Cannot happen (the ready queue has room for every buffer); give it back.
            let _ = p.free.push(index);
            return false;
        }
        true
    }

    /// The leg's thread: the next queued packet, lent until the [`Taken`] is dropped.
    pub fn take(&self) -> Option<Taken<'_>> {
        self.ready.pop().map(|ready| Taken { sink: self, ready })
    }

    /// Packets waiting.
    pub fn len(&self) -> usize {
        self.ready.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ready.is_empty()
    }

    /// The leg's thread is going to sleep: `false` if packets arrived meanwhile (do not
    /// sleep). Wake-ups then come through [`EdgeSink::wake_fd`].
    pub fn prepare_sleep(&self) -> bool {
        self.sleeping.store(true, Ordering::SeqCst);
        // Pairs with the fence in `offer` (see there).
        fence(Ordering::SeqCst);
        if !self.ready.is_empty() {
            self.sleeping.store(false, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// After a sleep that [`EdgeSink::prepare_sleep`] armed: offers stop writing the eventfd.
    pub fn unarm(&self) {
        self.sleeping.store(false, Ordering::SeqCst);
    }

    /// The eventfd was readable: clears it.
    pub fn clear_wake(&self) {
        let _ = self.wake.read();
    }

    /// Wakes the leg's thread (stop requests).
    pub fn nudge(&self) {
        let _ = self.wake.write(1);
    }

    pub fn wake_fd(&self) -> BorrowedFd<'_> {
        self.wake.as_fd()
    }

    /// The leg has closed: refuse further packets and drop the queued ones (the engines
    /// counted them sent; they are counted here as `stalls`).
    pub fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        let mut dropped = 0u64;
        while self.take().is_some() {
            dropped += 1;
        }
        if dropped > 0 {
            self.counters.stalls.fetch_add(dropped, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    #[test]
    fn bounded_and_counted() {
        let c = Arc::new(LegCounters::default());
        let s = EdgeSink::new(4, SLOT_BYTES, Arc::clone(&c)).unwrap();
        for i in 0..4u8 {
            assert!(s.offer(&[0x80, i]));
        }
        assert!(!s.offer(&[0x80, 9]), "full");
        assert!(!s.offer(&[0x80; SLOT_BYTES + 1]), "too long");
        assert_eq!(c.stalls.load(Relaxed), 2);
        assert_eq!(s.take().unwrap().payload(), &[0x80, 0]);
        assert!(s.offer(&[0x80, 4]));
        s.close();
        assert!(s.is_empty());
        assert!(!s.offer(&[0x80]));
        assert_eq!(
            c.stalls.load(Relaxed),
            2 + 4 + 1,
            "the 4 queued at the close count"
        );
    }

    #[test]
    fn wakes_only_a_sleeper() {
        let s = EdgeSink::new(4, SLOT_BYTES, Arc::default()).unwrap();
        assert!(s.offer(&[0x80]));
        assert!(s.wake.read().is_err(), "awake: no eventfd write");
        assert!(!s.prepare_sleep(), "a packet is waiting");
        s.take();
        assert!(s.prepare_sleep());
        assert!(s.offer(&[0x80]));
        assert_eq!(s.wake.read().unwrap(), 1);
    }

    /// A packet of `len` bytes whose contents say who sent it, its sequence and its length.
    fn packet(buf: &mut [u8], producer: u8, seq: u32) -> &[u8] {
        let len = buf.len();
        buf[0] = producer;
        buf[1..5].copy_from_slice(&seq.to_be_bytes());
        for (i, b) in buf.iter_mut().enumerate().skip(5) {
            *b = (i as u32).wrapping_add(seq).wrapping_mul(31) as u8 ^ producer;
        }
        &buf[..len]
    }

    fn check(p: &[u8]) -> (u8, u32) {
        let producer = p[0];
        let seq = u32::from_be_bytes(p[1..5].try_into().unwrap());
        for (i, b) in p.iter().enumerate().skip(5) {
            let want = (i as u32).wrapping_add(seq).wrapping_mul(31) as u8 ^ producer;
            assert_eq!(
                *b,
                want,
                "producer {producer} seq {seq} byte {i} of {}",
                p.len()
            );
        }
        (producer, seq)
    }

    #[test]
    fn order_kept_across_sizes() {
        let s = EdgeSink::with_large(8, 9000, 4, Arc::default()).unwrap();
        assert_eq!(s.max_payload(), 9000);
        let lens = [100, 4096, 2048, 2049, 9000, 60, 5000];
        let mut buf = [0u8; 9000];
        for (i, &len) in lens.iter().enumerate() {
            assert!(s.offer(packet(&mut buf[..len], 0, i as u32)), "{len}");
        }
        for (i, &len) in lens.iter().enumerate() {
            let t = s.take().unwrap();
            assert_eq!(t.payload().len(), len);
            assert_eq!(check(t.payload()), (0, i as u32));
        }
        assert!(s.take().is_none());
    }

    #[test]
    fn pools_exhausted_refuse_and_count() {
        let c = Arc::new(LegCounters::default());
        let s = EdgeSink::with_large(3, 4096, 2, Arc::clone(&c)).unwrap();
        let big = [0x80u8; 4096];
        assert!(s.offer(&big) && s.offer(&big[..3000]));
        assert!(!s.offer(&big), "large pool exhausted");
        for _ in 0..3 {
            assert!(s.offer(&big[..1000]), "the small pool is apart");
        }
        assert!(!s.offer(&big[..10]), "small pool exhausted");
        assert!(!s.offer(&[0u8; 4097]), "longer than the maximum");
        assert_eq!(c.stalls.load(Relaxed), 3);
        // A large buffer taken and dropped is free again; one held is not.
        let held = s.take().unwrap();
        assert_eq!(held.payload().len(), 4096);
        assert!(!s.offer(&big));
        let t = s.take().unwrap();
        assert_eq!(t.payload().len(), 3000);
        drop(t);
        assert!(s.offer(&big));
        assert!(!s.offer(&big));
        drop(held);
        assert!(s.offer(&big));
        assert_eq!(c.stalls.load(Relaxed), 5);
        // A maximum under SLOT_BYTES is enforced too, with no large pool.
        let s = EdgeSink::new(2, 1000, Arc::default()).unwrap();
        assert!(s.offer(&[1; 1000]));
        assert!(!s.offer(&[1; 1001]));
    }

    /// Several producers, one consumer: every accepted packet arrives once, in each
    /// producer's order, intact; the refused ones are all counted.
    #[test]
    fn many_producers_one_consumer() {
        const PRODUCERS: u8 = 4;
        const PER: u32 = 20_000;
        let c = Arc::new(LegCounters::default());
        let s = Arc::new(EdgeSink::with_large(16, 6000, 4, Arc::clone(&c)).unwrap());
        let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let (s, done) = (Arc::clone(&s), Arc::clone(&done));
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 6000];
                    let mut accepted = 0u64;
                    for seq in 0..PER {
                        // Sizes in both pools, from a cheap mix of the sequence.
                        let len = 5 + (seq.wrapping_mul(2_654_435_761) >> 7) as usize % 5996;
                        if s.offer(packet(&mut buf[..len], p, seq)) {
                            accepted += 1;
                        }
                        if seq % 64 == 0 {
                            std::thread::yield_now();
                        }
                    }
                    done.fetch_add(1, std::sync::atomic::Ordering::Release);
                    accepted
                })
            })
            .collect();
        let mut next = [0u32; PRODUCERS as usize];
        let mut got = [0u64; PRODUCERS as usize];
        loop {
            let finished = done.load(std::sync::atomic::Ordering::Acquire) == PRODUCERS as usize;
            match s.take() {
                Some(t) => {
                    let (p, seq) = check(t.payload());
                    let p = usize::from(p);
                    assert!(seq >= next[p], "producer {p}: {seq} after {}", next[p]);
                    next[p] = seq + 1;
                    got[p] += 1;
                }
                None if finished => break,
                None => std::thread::yield_now(),
            }
        }
        let accepted: Vec<u64> = producers.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(
            &accepted[..],
            &got[..],
            "every accepted packet arrives once"
        );
        let refused = u64::from(PRODUCERS) * u64::from(PER) - got.iter().sum::<u64>();
        assert_eq!(c.stalls.load(Relaxed), refused);
        assert!(got.iter().all(|&g| g > 0));
    }
}
