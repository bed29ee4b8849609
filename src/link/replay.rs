//! The receiver's replay window ([`ReplayWindow`], one per lane; [`Replay`] for all lanes):
//! a frame is handed on once, only if its lane's epoch is the newest seen and its sequence
//! is new and no more than [`WINDOW`] behind the newest. It runs on every authenticated
//! frame (data and repair, FEC on or off) before the FEC decoder, so a replayed frame is
//! refused before it can be delivered or help rebuild anything.
//!
//! - Within an epoch: a sliding bitmap over the last [`WINDOW`] sequence numbers (a ring of
//!   64-bit words, RFC 6479 style: moving forward clears the words it enters, so a frame
//!   costs a few instructions). A sequence seen before is `duplicate`; one [`WINDOW`] or more
//!   behind the newest is `replay_old`.
//! - Across epochs (the sender's lane started again: a restart, or its sequence wrapped):
//!   a frame of a newer epoch starts the window afresh at its sequence; a frame of an older
//!   epoch is `stale_epoch`. The receiver only moves forward, so once it has seen the new
//!   process's frames no frame of the old one is taken again. The epoch is in the frame's
//!   authenticated trailer ([`super::auth`]): a forger cannot move a lane forward.
//!
//! A receiver that restarts starts with no epoch: it takes the first epoch it sees on each
//! lane (see `docs/split.md`, "Authenticated link frames", for what this leaves open).

use crate::wire::link::MAX_LANES;

/// Words of the ring (a power of two, so the ring index stays right across the 32-bit
/// sequence wrap).
const WORDS: usize = 64;
/// How far behind the newest sequence a frame may be and still be taken (frames).
pub const WINDOW: u32 = ((WORDS - 1) * 64) as u32;

/// Why a frame was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Its sequence was seen already in this epoch.
    Duplicate,
    /// [`WINDOW`] or more behind the newest sequence of this epoch.
    Old,
    /// Its epoch is older than the lane's newest.
    StaleEpoch,
}

/// A frame taken: whether it started a new epoch on its lane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taken {
    InWindow,
    NewEpoch,
}

/// One lane's window.
#[derive(Clone, Debug)]
pub struct ReplayWindow {
    started: bool,
    epoch: u64,
    top: u32,
    bits: [u64; WORDS],
}

impl Default for ReplayWindow {
    fn default() -> Self {
        ReplayWindow {
            started: false,
            epoch: 0,
            top: 0,
            bits: [0; WORDS],
        }
    }
}

impl ReplayWindow {
    /// Takes (and remembers) frame `seq` of `epoch`, or says why not. Only call it for a
    /// frame whose MAC was checked.
    pub fn check(&mut self, epoch: u64, seq: u32) -> Result<Taken, Refusal> {
        if !self.started || epoch > self.epoch {
            self.started = true;
            self.epoch = epoch;
            self.bits = [0; WORDS];
            self.top = seq;
            self.mark(seq);
            return Ok(Taken::NewEpoch);
        }
        if epoch < self.epoch {
            return Err(Refusal::StaleEpoch);
        }
        let ahead = seq.wrapping_sub(self.top);
        if ahead != 0 && ahead < 1 << 31 {
            // Words entered: counted from the top's, so right across the 32-bit wrap too.
            let words = ((ahead + self.top % 64) / 64) as usize;
            if words >= WORDS {
                self.bits = [0; WORDS];
            } else {
                for i in 1..=words {
                    self.bits[((self.top / 64) as usize).wrapping_add(i) % WORDS] = 0;
                }
            }
            self.top = seq;
            self.mark(seq);
            return Ok(Taken::InWindow);
        }
        if self.top.wrapping_sub(seq) >= WINDOW {
            return Err(Refusal::Old);
        }
        let (w, b) = Self::at(seq);
        if self.bits[w] & b != 0 {
            return Err(Refusal::Duplicate);
        }
        self.bits[w] |= b;
        Ok(Taken::InWindow)
    }

    fn at(seq: u32) -> (usize, u64) {
        ((seq / 64) as usize % WORDS, 1u64 << (seq % 64))
    }

    fn mark(&mut self, seq: u32) {
        let (w, b) = Self::at(seq);
        self.bits[w] |= b;
    }

    /// The lane's newest epoch (None before its first frame).
    pub fn epoch(&self) -> Option<u64> {
        self.started.then_some(self.epoch)
    }
}

/// Every lane's window (allocated once, [`MAX_LANES`] of them).
pub struct Replay {
    lanes: Box<[ReplayWindow]>,
}

impl Default for Replay {
    fn default() -> Self {
        Replay {
            lanes: vec![ReplayWindow::default(); MAX_LANES].into_boxed_slice(),
        }
    }
}

impl Replay {
    /// [`ReplayWindow::check`] on `lane`'s window (a lane past [`MAX_LANES`] shares the
    /// last one; the header check refuses such frames before).
    pub fn check(&mut self, lane: u8, epoch: u64, seq: u32) -> Result<Taken, Refusal> {
        let i = usize::from(lane).min(MAX_LANES - 1);
        self.lanes[i].check(epoch, seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_sequence_is_taken_once() {
        let mut w = ReplayWindow::default();
        assert_eq!(w.check(5, 100), Ok(Taken::NewEpoch));
        for s in 101..200 {
            assert_eq!(w.check(5, s), Ok(Taken::InWindow));
        }
        for s in 100..200 {
            assert_eq!(w.check(5, s), Err(Refusal::Duplicate), "{s}");
        }
    }

    #[test]
    fn out_of_order_within_the_window_is_taken_once() {
        let mut w = ReplayWindow::default();
        w.check(1, 0).unwrap();
        w.check(1, 3000).unwrap();
        // Skipped ones, late but within the window.
        for s in [2999, 1000, 17, 2000] {
            assert_eq!(w.check(1, s), Ok(Taken::InWindow), "{s}");
            assert_eq!(w.check(1, s), Err(Refusal::Duplicate), "{s}");
        }
    }

    #[test]
    fn frames_behind_the_window_are_old() {
        let mut w = ReplayWindow::default();
        w.check(1, 10).unwrap();
        w.check(1, 10 + WINDOW).unwrap();
        assert_eq!(w.check(1, 10), Err(Refusal::Old));
        assert_eq!(w.check(1, 11), Ok(Taken::InWindow));
        // The case: 2^20 behind was "late"; now it is old.
        w.check(1, 1 << 21).unwrap();
        assert_eq!(w.check(1, (1 << 21) - (1 << 20)), Err(Refusal::Old));
    }

    #[test]
    fn a_jump_clears_what_it_passes() {
        let mut w = ReplayWindow::default();
        for s in 0..64 * 70 {
            w.check(1, s).unwrap();
        }
        // Jump by less than the ring: the words entered are clear.
        let top = 64 * 70 - 1 + 64 * 10;
        w.check(1, top).unwrap();
        for s in (64 * 70)..top {
            assert_eq!(w.check(1, s), Ok(Taken::InWindow), "{s}");
        }
        for s in (top - WINDOW + 1)..=top {
            assert_eq!(w.check(1, s), Err(Refusal::Duplicate), "{s}");
        }
    }

    #[test]
    fn the_window_holds_across_the_sequence_wrap() {
        let mut w = ReplayWindow::default();
        let start = u32::MAX - 100;
        for i in 0..300u32 {
            assert!(w.check(1, start.wrapping_add(i)).is_ok(), "{i}");
        }
        for i in 0..300u32 {
            assert_eq!(
                w.check(1, start.wrapping_add(i)),
                Err(Refusal::Duplicate),
                "{i}"
            );
        }
    }

    #[test]
    fn only_a_newer_epoch_moves_the_lane() {
        let mut w = ReplayWindow::default();
        for s in 0..50 {
            w.check(10, s).unwrap();
        }
        // The sender restarted: a newer epoch, sequences from 0 again.
        assert_eq!(w.check(20, 0), Ok(Taken::NewEpoch));
        assert_eq!(w.check(20, 1), Ok(Taken::InWindow));
        // The old process's frames, replayed: refused, even the ones never seen.
        for s in 0..100 {
            assert_eq!(w.check(10, s), Err(Refusal::StaleEpoch), "{s}");
        }
        assert_eq!(w.check(20, 1), Err(Refusal::Duplicate));
        assert_eq!(w.epoch(), Some(20));
    }

    #[test]
    fn lanes_are_independent() {
        let mut r = Replay::default();
        r.check(0, 1, 5).unwrap();
        assert_eq!(r.check(1, 1, 5), Ok(Taken::NewEpoch));
        assert_eq!(r.check(0, 1, 5), Err(Refusal::Duplicate));
        assert!(r.check(200, 1, 5).is_ok());
    }
}
