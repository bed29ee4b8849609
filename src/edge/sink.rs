//! [`EdgeSink`]: where an engine hands a route's admitted packets when the far side of the
//! route is a stream leg the gateway terminates itself (UDP → TCP).
//!
//! A bounded lock-free queue of fixed slots, allocated once when the leg is made; the
//! engine's [`EdgeSink::offer`] copies the payload in and wakes the leg's thread through an
//! eventfd only when that thread is asleep. No allocation, lock or log per packet. A full
//! queue (the leg's peer is not reading) refuses the packet; the engine counts it as
//! `leg_stall` and the leg counts it in its own `stalls`.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;

use crossbeam_queue::ArrayQueue;
use nix::sys::eventfd::{EfdFlags, EventFd};

use super::LegCounters;

/// The longest payload a sink slot holds; longer packets are refused (counted as stalls).
pub const SLOT_BYTES: usize = 2048;
/// Slots per sink: about 80 ms of a 20 Mbit/s stream.
pub const DEFAULT_SLOTS: usize = 256;

/// One queued packet.
pub struct Slot {
    len: u16,
    data: [u8; SLOT_BYTES],
}

impl Slot {
    pub fn payload(&self) -> &[u8] {
        &self.data[..usize::from(self.len)]
    }
}

/// The engine's end of a stream leg: see the module doc.
pub struct EdgeSink {
    queue: ArrayQueue<Slot>,
    wake: EventFd,
    /// The leg's thread is (about to be) asleep: the next offer writes the eventfd.
    sleeping: AtomicBool,
    /// The leg has closed: offers are refused at once.
    closed: AtomicBool,
    pub counters: Arc<LegCounters>,
}

impl std::fmt::Debug for EdgeSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EdgeSink")
            .field("queued", &self.queue.len())
            .field("capacity", &self.queue.capacity())
            .finish()
    }
}

impl EdgeSink {
    pub fn new(slots: usize, counters: Arc<LegCounters>) -> std::io::Result<EdgeSink> {
        Ok(EdgeSink {
            queue: ArrayQueue::new(slots.max(1)),
            wake: EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?,
            sleeping: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            counters,
        })
    }

    /// Queues one packet for the leg; `false` (counted in the leg's `stalls`) when the queue
    /// is full, the packet is longer than [`SLOT_BYTES`] or the leg has closed.
    #[inline]
    pub fn offer(&self, payload: &[u8]) -> bool {
        let ok = payload.len() <= SLOT_BYTES && !self.closed.load(Ordering::Relaxed) && {
            let mut slot = Slot {
                len: payload.len() as u16,
                data: [0; SLOT_BYTES],
            };
            slot.data[..payload.len()].copy_from_slice(payload);
            self.queue.push(slot).is_ok()
        };
        if !ok {
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

    /// The leg's thread: the next queued packet.
    pub fn take(&self) -> Option<Slot> {
        self.queue.pop()
    }

    /// Packets waiting.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The leg's thread is going to sleep: `false` if packets arrived meanwhile (do not
    /// sleep). Wake-ups then come through [`EdgeSink::wake_fd`].
    pub fn prepare_sleep(&self) -> bool {
        self.sleeping.store(true, Ordering::SeqCst);
        // Pairs with the fence in `offer` (see there).
        fence(Ordering::SeqCst);
        if !self.queue.is_empty() {
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
        while self.queue.pop().is_some() {
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
        let s = EdgeSink::new(4, Arc::clone(&c)).unwrap();
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
        let s = EdgeSink::new(4, Arc::default()).unwrap();
        assert!(s.offer(&[0x80]));
        assert!(s.wake.read().is_err(), "awake: no eventfd write");
        assert!(!s.prepare_sleep(), "a packet is waiting");
        s.take();
        assert!(s.prepare_sleep());
        assert!(s.offer(&[0x80]));
        assert_eq!(s.wake.read().unwrap(), 1);
    }
}
