//! The receiver's bounded reorder window: datagrams of one lane are handed on in the
//! sender's order, a datagram that arrives (or is rebuilt) ahead of a missing one waits at
//! most `hold_ms` for it, and the window never holds more than [`SLOTS`] positions.
//!
//! A *position* is where a datagram sits in its lane's order: the link sequence with FEC off,
//! `block × k + index` with FEC on (repair frames take no position; a partial block's unused
//! positions are skipped as soon as one of its repair frames says how many it has). Pure
//! logic, no clock and no allocation per packet: the slots and their payload buffers are
//! allocated once, when the lane's first packet arrives.
//!
//! What the window does with a datagram at position `p` while `next` is the first position not
//! yet handed on:
//! - `p == next`: handed on at once, followed by every consecutive held datagram;
//! - `next < p < next + SLOTS`: held in its slot (a second copy is ignored) until the gap
//!   before it fills, is skipped, or its wait reaches `hold_ms` ([`Reorder::release_due`]:
//!   everything up to it is then handed on, the gaps given up);
//! - `p >= next + SLOTS`: the window slides: what it held below the new window is handed on
//!   in order, then `p` is placed;
//! - `p < next`: already passed (its gap was given up): handed on at once and counted
//!   `overtaken`; a position far behind (more than [`super::fec`]'s restart gap) is a sender
//!   that started over: everything held is handed on and the window restarts at `p`.

use crate::wire::link::MAX_PAYLOAD;

/// Positions a lane's window spans (and datagrams it can hold).
pub const SLOTS: usize = 256;
/// A position this far behind the window is a restarted sender, not a late datagram.
const RESTART_GAP: u32 = 1 << 20;

#[derive(Clone, Copy, Default, PartialEq, Eq)]
enum State {
    #[default]
    Empty,
    Held,
    /// Known never to come (a partial FEC block's unused positions).
    Skip,
}

#[derive(Clone, Copy, Default)]
struct Slot {
    pos: u32,
    state: State,
    dst: u16,
    src: u16,
    len: u16,
    repaired: bool,
    at_ms: u64,
}

/// What the window counted, cumulative.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReorderCounts {
    /// Datagrams that waited for an earlier position.
    pub held: u64,
    /// Positions given up: a held datagram's wait reached `hold_ms`, or a datagram far ahead
    /// pushed them out of the window (lost, or never sent: not every one is a loss).
    pub expired: u64,
    /// Datagrams handed on after later positions had been (their gap was given up).
    pub overtaken: u64,
}

/// One lane's reorder window.
pub struct Reorder {
    hold_ms: u64,
    started: bool,
    next: u32,
    slots: Box<[Slot]>,
    data: Box<[u8]>,
    waiting: usize,
    /// When the oldest held datagram's wait ends (`u64::MAX` when none is held).
    deadline: u64,
    pub counts: ReorderCounts,
}

fn ahead(pos: u32, of: u32) -> Option<u32> {
    let d = pos.wrapping_sub(of);
    (d <= u32::MAX / 2).then_some(d)
}

impl Reorder {
    pub fn new(hold_ms: u64) -> Reorder {
        Reorder {
            hold_ms,
            started: false,
            next: 0,
            slots: vec![Slot::default(); SLOTS].into_boxed_slice(),
            data: vec![0u8; SLOTS * MAX_PAYLOAD].into_boxed_slice(),
            waiting: 0,
            deadline: u64::MAX,
            counts: ReorderCounts::default(),
        }
    }

    /// When [`Reorder::release_due`] has something to hand on, if anything is held.
    pub fn deadline(&self) -> Option<u64> {
        (self.waiting > 0).then_some(self.deadline)
    }

    /// Takes the datagram at position `pos`; calls `deliver(dst, src, payload, repaired)` for
    /// it and for everything it releases, in order.
    #[allow(clippy::too_many_arguments)]
    pub fn offer<F: FnMut(u16, u16, &[u8], bool)>(
        &mut self,
        pos: u32,
        dst: u16,
        src: u16,
        payload: &[u8],
        repaired: bool,
        now_ms: u64,
        deliver: &mut F,
    ) {
        if !self.started {
            self.started = true;
            self.next = pos;
        }
        let d = match ahead(pos, self.next) {
            Some(d) => d,
            None if self.next.wrapping_sub(pos) > RESTART_GAP => {
                self.flush(deliver);
                self.started = true;
                self.next = pos;
                0
            }
            None => {
                self.counts.overtaken += 1;
                deliver(dst, src, payload, repaired);
                return;
            }
        };
        if d == 0 {
            deliver(dst, src, payload, repaired);
            self.next = self.next.wrapping_add(1);
            self.advance(deliver);
            return;
        }
        if d as usize >= SLOTS {
            // Slide: the window ends at `pos`.
            self.release_to(pos.wrapping_sub(SLOTS as u32), deliver);
            self.advance(deliver);
            if pos == self.next {
                deliver(dst, src, payload, repaired);
                self.next = self.next.wrapping_add(1);
                self.advance(deliver);
                return;
            }
        }
        let i = pos as usize % SLOTS;
        if self.slots[i].state != State::Empty && self.slots[i].pos == pos {
            return; // a second copy
        }
        let len = payload.len().min(MAX_PAYLOAD);
        self.data[i * MAX_PAYLOAD..i * MAX_PAYLOAD + len].copy_from_slice(&payload[..len]);
        self.slots[i] = Slot {
            pos,
            state: State::Held,
            dst,
            src,
            len: len as u16,
            repaired,
            at_ms: now_ms,
        };
        self.waiting += 1;
        self.counts.held += 1;
        self.deadline = self.deadline.min(now_ms.saturating_add(self.hold_ms));
    }

    /// Positions `from..to` will never come (a partial FEC block's unused ones).
    pub fn skip<F: FnMut(u16, u16, &[u8], bool)>(&mut self, from: u32, to: u32, deliver: &mut F) {
        if !self.started {
            return;
        }
        let mut p = from;
        while p != to {
            match ahead(p, self.next) {
                Some(0) => {
                    self.next = self.next.wrapping_add(1);
                    self.advance(deliver);
                }
                Some(d) if (d as usize) < SLOTS => {
                    let s = &mut self.slots[p as usize % SLOTS];
                    if s.state == State::Empty || s.pos != p {
                        *s = Slot {
                            pos: p,
                            state: State::Skip,
                            ..Slot::default()
                        };
                    }
                }
                _ => {}
            }
            p = p.wrapping_add(1);
        }
    }

    /// Hands on what waited `hold_ms` and everything before it, giving up the gaps between.
    pub fn release_due<F: FnMut(u16, u16, &[u8], bool)>(&mut self, now_ms: u64, deliver: &mut F) {
        if self.waiting == 0 || now_ms < self.deadline {
            return;
        }
        // The furthest position whose wait is over.
        let mut last = None;
        for k in 0..SLOTS as u32 {
            let p = self.next.wrapping_add(k);
            let s = &self.slots[p as usize % SLOTS];
            if s.state == State::Held
                && s.pos == p
                && s.at_ms.saturating_add(self.hold_ms) <= now_ms
            {
                last = Some(p);
            }
        }
        if let Some(p) = last {
            self.release_to(p, deliver);
            self.advance(deliver);
        }
        self.deadline = self
            .slots
            .iter()
            .filter(|s| s.state == State::Held)
            .map(|s| s.at_ms.saturating_add(self.hold_ms))
            .min()
            .unwrap_or(u64::MAX);
    }

    /// Hands on everything held, in order, and forgets the lane's position (its sender
    /// started over).
    pub fn flush<F: FnMut(u16, u16, &[u8], bool)>(&mut self, deliver: &mut F) {
        if self.started {
            self.release_to(self.next.wrapping_add(SLOTS as u32 - 1), deliver);
        }
        self.started = false;
        self.deadline = u64::MAX;
    }

    /// Hands on every held datagram at positions `next..=to` (at most [`SLOTS`] of them, all
    /// the window can hold) and moves `next` past `to`; gaps on the way are given up.
    fn release_to<F: FnMut(u16, u16, &[u8], bool)>(&mut self, to: u32, deliver: &mut F) {
        let Some(d) = ahead(to, self.next) else {
            return;
        };
        let steps = (d as usize + 1).min(SLOTS);
        // Positions beyond the window were never held: given up without a look.
        self.counts.expired += u64::from(d) + 1 - steps as u64;
        for k in 0..steps as u32 {
            let p = self.next.wrapping_add(k);
            let i = p as usize % SLOTS;
            let s = self.slots[i];
            if s.pos != p || s.state == State::Empty {
                self.counts.expired += 1;
                continue;
            }
            self.hand_on(i, deliver);
        }
        self.next = to.wrapping_add(1);
        if self.waiting == 0 {
            self.deadline = u64::MAX;
        }
    }

    /// Hands on consecutive held (or skipped) positions from `next`.
    fn advance<F: FnMut(u16, u16, &[u8], bool)>(&mut self, deliver: &mut F) {
        loop {
            let i = self.next as usize % SLOTS;
            let s = self.slots[i];
            if s.state == State::Empty || s.pos != self.next {
                break;
            }
            self.hand_on(i, deliver);
            self.next = self.next.wrapping_add(1);
        }
        if self.waiting == 0 {
            self.deadline = u64::MAX;
        }
    }

    /// Hands on slot `i`'s datagram if it holds one, and empties the slot.
    fn hand_on<F: FnMut(u16, u16, &[u8], bool)>(&mut self, i: usize, deliver: &mut F) {
        let s = self.slots[i];
        if s.state == State::Held {
            self.waiting -= 1;
            let at = i * MAX_PAYLOAD;
            deliver(
                s.dst,
                s.src,
                &self.data[at..at + usize::from(s.len)],
                s.repaired,
            );
        }
        self.slots[i].state = State::Empty;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `(pos, now)` offers; returns the delivered positions (the payload is the position).
    fn feed(r: &mut Reorder, offers: &[(u32, u64)]) -> Vec<u32> {
        let mut out = Vec::new();
        for &(p, now) in offers {
            r.offer(p, 1, 2, &p.to_be_bytes(), false, now, &mut |_, _, pl, _| {
                out.push(u32::from_be_bytes(pl.try_into().unwrap()))
            });
        }
        out
    }

    fn due(r: &mut Reorder, now: u64) -> Vec<u32> {
        let mut out = Vec::new();
        r.release_due(now, &mut |_, _, pl, _| {
            out.push(u32::from_be_bytes(pl.try_into().unwrap()))
        });
        out
    }

    #[test]
    fn in_order_passes_at_once() {
        let mut r = Reorder::new(20);
        assert_eq!(feed(&mut r, &[(5, 0), (6, 0), (7, 0)]), [5, 6, 7]);
        assert_eq!(r.deadline(), None);
        assert_eq!(r.counts, ReorderCounts::default());
    }

    #[test]
    fn reorders_within_the_window() {
        let mut r = Reorder::new(20);
        assert_eq!(
            feed(&mut r, &[(0, 0), (2, 1), (3, 1), (1, 2)]),
            [0, 1, 2, 3]
        );
        assert_eq!(r.counts.held, 2);
        assert_eq!(r.deadline(), None);
    }

    #[test]
    fn a_gap_is_given_up_when_the_wait_ends() {
        let mut r = Reorder::new(20);
        assert_eq!(feed(&mut r, &[(0, 0), (2, 5), (4, 10)]), [0]);
        assert_eq!(r.deadline(), Some(25));
        assert!(due(&mut r, 24).is_empty());
        assert_eq!(due(&mut r, 25), [2], "4 still waits for 3");
        assert_eq!(r.deadline(), Some(30));
        assert_eq!(due(&mut r, 30), [4]);
        assert_eq!(r.counts.expired, 2, "1 and 3 given up");
        // The late one is still handed on, counted.
        assert_eq!(feed(&mut r, &[(1, 40), (5, 40)]), [1, 5]);
        assert_eq!(r.counts.overtaken, 1);
    }

    #[test]
    fn the_window_slides_when_full() {
        let mut r = Reorder::new(1000);
        let mut offers = vec![(0, 0)];
        offers.extend((2..=SLOTS as u32).map(|p| (p, 0)));
        let got = feed(&mut r, &offers);
        assert_eq!(got, [0], "1 missing: 2..=SLOTS-1 held");
        // SLOTS + 1 does not fit: 1 is given up, 2.. released.
        let got = feed(&mut r, &[(SLOTS as u32 + 1, 0)]);
        assert_eq!(got, (2..=SLOTS as u32 + 1).collect::<Vec<_>>());
        assert_eq!(r.deadline(), None);
        // Far ahead: everything held goes first, in order.
        let got = feed(&mut r, &[(1000, 0), (999, 0), (5000, 0)]);
        assert_eq!(got, [999, 1000]);
        assert_eq!(feed(&mut r, &[(4999, 0)]), Vec::<u32>::new());
        assert_eq!(
            r.counts.held,
            SLOTS as u64 + 3,
            "2..=SLOTS, 1000, 999, 5000, 4999"
        );
    }

    #[test]
    fn duplicates_are_held_once() {
        let mut r = Reorder::new(20);
        assert_eq!(feed(&mut r, &[(0, 0), (2, 0), (2, 0), (1, 0)]), [0, 1, 2]);
        assert_eq!(r.counts.held, 1);
    }

    #[test]
    fn skipped_positions_do_not_wait() {
        let mut r = Reorder::new(20);
        assert_eq!(feed(&mut r, &[(0, 0), (8, 0)]), [0]);
        let mut out = Vec::new();
        r.skip(1, 8, &mut |_, _, pl, _| {
            out.push(u32::from_be_bytes(pl.try_into().unwrap()))
        });
        assert_eq!(out, [8]);
        assert_eq!(r.counts.expired, 0);
    }

    #[test]
    fn a_restarted_sender_flushes_and_starts_over() {
        let mut r = Reorder::new(20);
        let start = 100_000_000u32;
        assert_eq!(feed(&mut r, &[(start, 0), (start + 2, 0)]), [start]);
        // Far behind: a sender that started over.
        assert_eq!(feed(&mut r, &[(7, 1), (8, 1)]), [start + 2, 7, 8]);
        let mut out = Vec::new();
        assert_eq!(feed(&mut r, &[(10, 1)]), Vec::<u32>::new());
        r.flush(&mut |_, _, pl, _| out.push(u32::from_be_bytes(pl.try_into().unwrap())));
        assert_eq!(out, [10]);
        assert_eq!(
            feed(&mut r, &[(3, 2)]),
            [3],
            "after a flush the window starts anew"
        );
    }

    #[test]
    fn positions_wrap() {
        let mut r = Reorder::new(20);
        let p = u32::MAX - 1;
        assert_eq!(
            feed(&mut r, &[(p, 0), (0, 0), (u32::MAX, 0), (1, 0)]),
            [p, u32::MAX, 0, 1]
        );
    }
}
