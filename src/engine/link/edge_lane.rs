//! The TCP media legs' lane on the outgoing link ([`EdgeLink`]): one sender shared by the
//! legs' threads, its open blocks closed on time by the incoming link's worker.

use super::*;

/// The lane of the TCP media legs' sender: the last one, never an engine worker's
/// (`engine.queues` is at most the machine's CPUs, far below it).
pub const EDGE_LANE: u8 = (crate::link::fec::MAX_LANES - 1) as u8;
/// Frames the legs' sender writes before it sends them (one read's packets).
pub(super) const EDGE_BATCH: usize = 64;

/// The TCP media legs' sender on the outgoing link, shared by the legs' threads; set when
/// a half's engine starts ([`HalfLinks::finish`]), empty on a single host. A partial FEC
/// block the legs leave open is closed on time by the incoming link's worker
/// ([`EdgeLink::close_due`]), so the tail of a leg's burst is not held until its next read:
/// when a block opens, [`EdgeLink::sent`] wakes that worker (its eventfd; one write per
/// block, not per packet), which then sleeps no longer than the block's closing time.
#[derive(Default)]
pub struct EdgeLink(
    std::sync::OnceLock<(DomainId, std::sync::Mutex<LinkTx>)>,
    /// [`LinkTx::close_due_ms`] of the sender after its last use (0: no block open).
    AtomicU64,
    /// The incoming link's worker's wake-up eventfd ([`EdgeLink::set_waker`]); taken once
    /// per opened block.
    std::sync::Mutex<Option<Arc<EventFd>>>,
);

impl EdgeLink {
    /// Notes when `tx` (this link's sender, locked by the caller after a send) must close
    /// its partial block; wakes the incoming link's worker when a block just opened (it may
    /// be asleep for up to 100 ms, longer than [`CLOSE_BLOCK_MS`]).
    pub fn sent(&self, tx: &LinkTx) {
        let due = tx.close_due_ms().unwrap_or(0);
        if self.1.swap(due, Relaxed) == 0 && due != 0 {
            let waker = self.2.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(w) = waker.as_ref() {
                // Full (never in practice: the worker reads it) or closed: nothing to do.
                let _ = w.write(1);
            }
        }
    }

    /// The eventfd of the worker that closes the legs' blocks (the incoming link's; a
    /// restarted engine replaces it).
    pub fn set_waker(&self, wake: Arc<EventFd>) {
        *self.2.lock().unwrap_or_else(|e| e.into_inner()) = Some(wake);
    }

    /// When the legs' partial FEC block must be closed (None: none open). No lock.
    pub fn close_due(&self) -> Option<u64> {
        Some(self.1.load(Relaxed)).filter(|&d| d != 0)
    }

    /// Closes the legs' partial block if it is due, unless a leg holds the sender (it will
    /// close it itself at the end of its read).
    pub fn close_if_due(&self, now_ms: u64) {
        if self.close_due().is_none_or(|d| now_ms < d) {
            return;
        }
        if let Some((_, m)) = self.0.get() {
            if let Ok(mut tx) = m.try_lock() {
                tx.idle(now_ms);
                self.sent(&tx);
            }
        }
    }

    /// Installs the sender for link face `face` (a restarted engine replaces it).
    pub fn set(&self, face: DomainId, tx: LinkTx) {
        match self.0.get() {
            Some((_, m)) => *m.lock().unwrap_or_else(|e| e.into_inner()) = tx,
            None => {
                if let Err((_, m)) = self.0.set((face, std::sync::Mutex::new(tx))) {
                    // Set meanwhile by another engine: keep theirs.
                    drop(m);
                }
            }
        }
    }

    /// The sender when `egress` is the link face.
    pub fn toward(&self, egress: DomainId) -> Option<&std::sync::Mutex<LinkTx>> {
        self.0.get().filter(|(f, _)| *f == egress).map(|(_, m)| m)
    }
}
