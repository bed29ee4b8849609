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
//!
//! A gap the caller knows will not be filled ([`Reorder::give_up_before`]: with FEC, the
//! lane's frames still to come cannot rebuild it) is given up after [`LOST_GRACE_MS`]
//! instead of `hold_ms`. The counts say why each held datagram waited and how long
//! ([`ReorderCounts`]: waits begun, [`Release`] causes, wait buckets).

use crate::wire::link::MAX_PAYLOAD;

/// Positions a lane's window spans (and datagrams it can hold).
pub const SLOTS: usize = 256;
/// A position this far behind the window is a restarted sender, not a late datagram.
const RESTART_GAP: u32 = 1 << 20;
/// How long a gap known lost in lane order ([`Reorder::give_up_before`]) is still waited
/// for (milliseconds; at most `hold_ms`): a frame the link put behind its neighbour.
pub const LOST_GRACE_MS: u64 = 1;

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

/// What handed a held datagram on: the index of [`ReorderCounts::released`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// The datagram its gap waited for arrived (late: reordered on the way).
    Arrived = 0,
    /// The datagram its gap waited for was rebuilt from its block's repair frames.
    Rebuilt,
    /// Its gap was a partial block's unused positions (told by a repair frame).
    Skipped,
    /// It waited `hold_ms` ([`Reorder::release_due`]): its gap was given up on time.
    Timeout,
    /// Its gap was given up as soon as it was known lost ([`Reorder::give_up_before`]: the
    /// frames still to come on the lane could not fill it).
    Lost,
    /// A datagram too far ahead pushed it out of the window.
    Slide,
    /// Its lane started over ([`Reorder::flush`]).
    Flush,
}

impl Release {
    pub const ALL: [Release; 7] = [
        Release::Arrived,
        Release::Rebuilt,
        Release::Skipped,
        Release::Timeout,
        Release::Lost,
        Release::Slide,
        Release::Flush,
    ];
}

/// Upper bounds (milliseconds, inclusive) of [`ReorderCounts::waited`]'s buckets; the last
/// bucket takes the longer waits.
pub const WAIT_BOUNDS_MS: [u64; 5] = [1, 2, 5, 10, 25];

/// What the window counted, cumulative.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReorderCounts {
    /// Datagrams that waited for an earlier position.
    pub held: u64,
    /// Positions given up: a held datagram's wait reached `hold_ms`, its gap was known lost,
    /// or a datagram far ahead pushed them out of the window (lost, or never sent: not every
    /// one is a loss).
    pub expired: u64,
    /// Datagrams handed on after later positions had been (their gap was given up).
    pub overtaken: u64,
    /// Waits begun: a datagram held while the window held nothing (a gap opened). On a
    /// lossless link that keeps its lanes in order this stays 0.
    pub waits: u64,
    /// Held datagrams by what handed them on, in [`Release`] order (their sum is `held`
    /// less what the window holds now).
    pub released: [u64; Release::ALL.len()],
    /// Held datagrams by how long they waited: up to each of [`WAIT_BOUNDS_MS`], then more.
    pub waited: [u64; WAIT_BOUNDS_MS.len() + 1],
}

impl ReorderCounts {
    /// Adds `o`'s counts to these.
    pub fn add(&mut self, o: &ReorderCounts) {
        self.held += o.held;
        self.expired += o.expired;
        self.overtaken += o.overtaken;
        self.waits += o.waits;
        for (a, b) in self.released.iter_mut().zip(o.released) {
            *a += b;
        }
        for (a, b) in self.waited.iter_mut().zip(o.waited) {
            *a += b;
        }
    }
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
    /// Positions before `lost_before` that have not come are given up at `lost_at`
    /// ([`Reorder::give_up_before`]; `u64::MAX`: none).
    lost_before: u32,
    lost_at: u64,
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
            lost_before: 0,
            lost_at: u64::MAX,
            counts: ReorderCounts::default(),
        }
    }

    /// When [`Reorder::release_due`] has something to hand on, if anything is held.
    pub fn deadline(&self) -> Option<u64> {
        (self.waiting > 0).then(|| self.deadline.min(self.lost_due()))
    }

    /// When the gaps known lost are given up (`u64::MAX`: none pending).
    fn lost_due(&self) -> u64 {
        match ahead(self.lost_before, self.next) {
            Some(d) if d > 0 => self.lost_at,
            _ => u64::MAX,
        }
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
                self.flush(now_ms, deliver);
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
            // What waited behind this position waited for it.
            let why = if repaired {
                Release::Rebuilt
            } else {
                Release::Arrived
            };
            self.advance(why, now_ms, deliver);
            return;
        }
        if d as usize >= SLOTS {
            // Slide: the window ends at `pos`.
            self.release_to(
                pos.wrapping_sub(SLOTS as u32),
                Release::Slide,
                now_ms,
                deliver,
            );
            self.advance(Release::Slide, now_ms, deliver);
            if pos == self.next {
                deliver(dst, src, payload, repaired);
                self.next = self.next.wrapping_add(1);
                self.advance(Release::Slide, now_ms, deliver);
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
        if self.waiting == 0 {
            self.counts.waits += 1;
        }
        self.waiting += 1;
        self.counts.held += 1;
        self.deadline = self.deadline.min(now_ms.saturating_add(self.hold_ms));
    }

    /// Positions `from..to` will never come (a partial FEC block's unused ones).
    pub fn skip<F: FnMut(u16, u16, &[u8], bool)>(
        &mut self,
        from: u32,
        to: u32,
        now_ms: u64,
        deliver: &mut F,
    ) {
        if !self.started {
            return;
        }
        let mut p = from;
        while p != to {
            match ahead(p, self.next) {
                Some(0) => {
                    self.next = self.next.wrapping_add(1);
                    self.advance(Release::Skipped, now_ms, deliver);
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

    /// Every position before `to` that has not come will not come any more (the caller
    /// knows: on a link that keeps a lane's frames in order, a frame of a later FEC block
    /// arrived, or the frames still to come cannot rebuild its block): what waits behind
    /// those gaps is handed on at `at_ms` (the gaps given up, counted `expired`) instead of
    /// after `hold_ms`. Waiting until `at_ms` (the caller's [`LOST_GRACE_MS`]) lets a frame
    /// the link swapped with its neighbour still fill its gap. A later call never postpones
    /// an earlier one's time.
    pub fn give_up_before(&mut self, to: u32, at_ms: u64) {
        if !self.started {
            return;
        }
        match ahead(to, self.next) {
            Some(d) if d > 0 && (d as usize) <= SLOTS => {
                let at = self.lost_due().min(at_ms);
                if ahead(to, self.lost_before).is_some() || self.lost_due() == u64::MAX {
                    self.lost_before = to;
                }
                self.lost_at = at;
            }
            _ => {}
        }
    }

    /// Hands on what waited `hold_ms` and everything before it, giving up the gaps between.
    pub fn release_due<F: FnMut(u16, u16, &[u8], bool)>(&mut self, now_ms: u64, deliver: &mut F) {
        if self.waiting > 0 && self.lost_due() <= now_ms {
            self.lost_at = u64::MAX;
            self.release_to(
                self.lost_before.wrapping_sub(1),
                Release::Lost,
                now_ms,
                deliver,
            );
            self.advance(Release::Lost, now_ms, deliver);
        }
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
            self.release_to(p, Release::Timeout, now_ms, deliver);
            self.advance(Release::Timeout, now_ms, deliver);
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
    pub fn flush<F: FnMut(u16, u16, &[u8], bool)>(&mut self, now_ms: u64, deliver: &mut F) {
        if self.started {
            let last = self.next.wrapping_add(SLOTS as u32 - 1);
            self.release_to(last, Release::Flush, now_ms, deliver);
        }
        self.started = false;
        self.deadline = u64::MAX;
        self.lost_at = u64::MAX;
    }

    /// Hands on every held datagram at positions `next..=to` (at most [`SLOTS`] of them, all
    /// the window can hold) and moves `next` past `to`; gaps on the way are given up.
    fn release_to<F: FnMut(u16, u16, &[u8], bool)>(
        &mut self,
        to: u32,
        why: Release,
        now_ms: u64,
        deliver: &mut F,
    ) {
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
            self.hand_on(i, why, now_ms, deliver);
        }
        self.next = to.wrapping_add(1);
        if self.waiting == 0 {
            self.deadline = u64::MAX;
        }
    }

    /// Hands on consecutive held (or skipped) positions from `next`.
    fn advance<F: FnMut(u16, u16, &[u8], bool)>(
        &mut self,
        why: Release,
        now_ms: u64,
        deliver: &mut F,
    ) {
        loop {
            let i = self.next as usize % SLOTS;
            let s = self.slots[i];
            if s.state == State::Empty || s.pos != self.next {
                break;
            }
            self.hand_on(i, why, now_ms, deliver);
            self.next = self.next.wrapping_add(1);
        }
        if self.waiting == 0 {
            self.deadline = u64::MAX;
        }
        if self.lost_at != u64::MAX && self.lost_due() == u64::MAX {
            // Passed: forgotten before the positions wrap round to it.
            self.lost_at = u64::MAX;
        }
    }

    /// Hands on slot `i`'s datagram if it holds one (counted by `why` and by how long it
    /// waited), and empties the slot.
    fn hand_on<F: FnMut(u16, u16, &[u8], bool)>(
        &mut self,
        i: usize,
        why: Release,
        now_ms: u64,
        deliver: &mut F,
    ) {
        let s = self.slots[i];
        if s.state == State::Held {
            self.waiting -= 1;
            self.counts.released[why as usize] += 1;
            let waited = now_ms.saturating_sub(s.at_ms);
            let bucket = WAIT_BOUNDS_MS
                .iter()
                .position(|&b| waited <= b)
                .unwrap_or(WAIT_BOUNDS_MS.len());
            self.counts.waited[bucket] += 1;
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
        r.skip(1, 8, 0, &mut |_, _, pl, _| {
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
        r.flush(1, &mut |_, _, pl, _| {
            out.push(u32::from_be_bytes(pl.try_into().unwrap()))
        });
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

    /// Feeds `(pos, now, repaired)` offers; returns the delivered positions.
    fn feed_rebuilt(r: &mut Reorder, offers: &[(u32, u64, bool)]) -> Vec<u32> {
        let mut out = Vec::new();
        for &(p, now, rep) in offers {
            r.offer(p, 1, 2, &p.to_be_bytes(), rep, now, &mut |_, _, pl, _| {
                out.push(u32::from_be_bytes(pl.try_into().unwrap()))
            });
        }
        out
    }

    #[test]
    fn counts_say_what_ended_each_wait_and_how_long_it_was() {
        let mut r = Reorder::new(20);
        // 1 missing: 2 and 3 wait; 1 is rebuilt 3 ms later.
        assert_eq!(
            feed_rebuilt(&mut r, &[(0, 0, false), (2, 0, false), (3, 1, false)]),
            [0]
        );
        assert_eq!(feed_rebuilt(&mut r, &[(1, 3, true)]), [1, 2, 3]);
        // 5 missing: 6 waits; 5 arrives (reordered) within the millisecond.
        assert_eq!(feed_rebuilt(&mut r, &[(4, 10, false), (6, 10, false)]), [4]);
        assert_eq!(feed_rebuilt(&mut r, &[(5, 10, false)]), [5, 6]);
        // 8 missing: 9 waits the whole 20 ms.
        assert_eq!(feed_rebuilt(&mut r, &[(7, 40, false), (9, 40, false)]), [7]);
        assert_eq!(due(&mut r, 60), [9]);
        let c = r.counts;
        assert_eq!((c.held, c.waits, c.expired), (4, 3, 1));
        let by = |w: Release| c.released[w as usize];
        assert_eq!(
            (
                by(Release::Rebuilt),
                by(Release::Arrived),
                by(Release::Timeout)
            ),
            (2, 1, 1)
        );
        // 2 waited 3 ms, 3 waited 2 ms, 6 none, 9 20 ms.
        assert_eq!(c.waited, [1, 1, 1, 0, 1, 0]);
    }

    #[test]
    fn a_gap_known_lost_is_given_up_after_the_grace_not_the_whole_wait() {
        let mut r = Reorder::new(25);
        assert_eq!(feed(&mut r, &[(0, 10), (2, 10), (3, 10)]), [0]);
        assert_eq!(r.deadline(), Some(35));
        // The caller learns 1 will not come (in lane order): given up at 11.
        r.give_up_before(2, 11);
        assert_eq!(r.deadline(), Some(11));
        assert!(due(&mut r, 10).is_empty());
        assert_eq!(due(&mut r, 11), [2, 3]);
        assert_eq!(r.deadline(), None);
        let c = r.counts;
        assert_eq!((c.expired, c.released[Release::Lost as usize]), (1, 2));
        // A later give-up never postpones an earlier one; one already passed is forgotten.
        r.give_up_before(3, 50);
        assert_eq!(feed(&mut r, &[(5, 20)]), Vec::<u32>::new());
        assert_eq!(r.deadline(), Some(45), "the wait of 5, not a stale give-up");
        r.give_up_before(5, 21);
        r.give_up_before(6, 30);
        assert_eq!(r.deadline(), Some(21));
        assert_eq!(due(&mut r, 21), [5]);
    }

    #[test]
    fn a_gap_filled_within_the_grace_is_filled_in_order() {
        let mut r = Reorder::new(25);
        assert_eq!(feed(&mut r, &[(0, 10), (2, 10)]), [0]);
        r.give_up_before(2, 11);
        // The link had swapped 1 and 2: 1 comes before the grace ends.
        assert_eq!(feed(&mut r, &[(1, 10)]), [1, 2]);
        assert_eq!(r.deadline(), None);
        assert_eq!(r.counts.expired, 0);
        assert_eq!(r.counts.released[Release::Arrived as usize], 1);
        // The give-up is spent: a new gap waits its whole time.
        assert_eq!(feed(&mut r, &[(4, 12)]), Vec::<u32>::new());
        assert_eq!(r.deadline(), Some(37));
    }
}
