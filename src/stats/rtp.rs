//! Cheap RTP sequence accounting per route: lost (gaps), reordered and duplicate packets.
//!
//! One highest-sequence number and a 64-packet window bitmap, both in atomics. A route's
//! packets are handled by one worker at a time (one socket per port in stack mode, one RSS
//! queue per 5-tuple in the ring modes), so plain loads and stores suffice; were two workers
//! ever to race on a route the only harm is a miscounted packet, never a wrong forward.
//!
//! `lost` is reported as gaps minus late arrivals that filled them, like RFC 3550's
//! cumulative loss (expected − received).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A jump this large is taken as a restarted sender, not as loss (RFC 3550 A.1 MAX_DROPOUT).
const MAX_DROPOUT: i32 = 3000;
const WINDOW: i32 = 64;

/// Per-route RTP state and counters.
#[derive(Debug, Default)]
pub struct RtpTracker {
    /// bit 63: initialised; bits 32..48: highest sequence; bits 0..32: SSRC.
    state: AtomicU64,
    /// Bit i set: sequence (highest − i) was received.
    window: AtomicU64,
    packets: AtomicU64,
    gaps: AtomicU64,
    reordered: AtomicU64,
    duplicate: AtomicU64,
    resyncs: AtomicU64,
}

/// A copy of an [`RtpTracker`]'s counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RtpSnapshot {
    /// RTP packets seen (RTP version 2, not RTCP).
    pub packets: u64,
    pub lost: u64,
    pub reordered: u64,
    pub duplicate: u64,
    /// SSRC changes and sequence jumps beyond MAX_DROPOUT (sender restarts).
    pub resyncs: u64,
}

impl RtpSnapshot {
    pub fn add(&mut self, o: &RtpSnapshot) {
        self.packets += o.packets;
        self.lost += o.lost;
        self.reordered += o.reordered;
        self.duplicate += o.duplicate;
        self.resyncs += o.resyncs;
    }
}

const INIT: u64 = 1 << 63;

impl RtpTracker {
    /// Accounts one RTP packet.
    pub fn observe(&self, seq: u16, ssrc: u32) {
        self.packets.fetch_add(1, Relaxed);
        let state = self.state.load(Relaxed);
        let max = (state >> 32) as u16;
        if state & INIT == 0 || state as u32 != ssrc {
            if state & INIT != 0 {
                self.resyncs.fetch_add(1, Relaxed);
            }
            self.reset(seq, ssrc);
            return;
        }
        let delta = i32::from(seq.wrapping_sub(max) as i16);
        let window = self.window.load(Relaxed);
        if delta > 0 {
            if delta >= MAX_DROPOUT {
                self.resyncs.fetch_add(1, Relaxed);
                self.reset(seq, ssrc);
                return;
            }
            if delta > 1 {
                self.gaps.fetch_add((delta - 1) as u64, Relaxed);
            }
            let shifted = if delta >= WINDOW { 0 } else { window << delta };
            self.window.store(shifted | 1, Relaxed);
            self.state
                .store(INIT | (u64::from(seq) << 32) | u64::from(ssrc), Relaxed);
        } else if delta == 0 {
            self.duplicate.fetch_add(1, Relaxed);
        } else {
            let back = -delta;
            if back < WINDOW {
                let bit = 1u64 << back;
                if window & bit != 0 {
                    self.duplicate.fetch_add(1, Relaxed);
                } else {
                    self.window.store(window | bit, Relaxed);
                    self.reordered.fetch_add(1, Relaxed);
                }
            } else {
                // Older than the window: late; whether it is a duplicate cannot be told.
                self.reordered.fetch_add(1, Relaxed);
            }
        }
    }

    fn reset(&self, seq: u16, ssrc: u32) {
        self.window.store(1, Relaxed);
        self.state
            .store(INIT | (u64::from(seq) << 32) | u64::from(ssrc), Relaxed);
    }

    /// The SSRC of the stream being tracked, once a packet was seen.
    pub fn ssrc(&self) -> Option<u32> {
        let state = self.state.load(Relaxed);
        (state & INIT != 0).then_some(state as u32)
    }

    pub fn snapshot(&self) -> RtpSnapshot {
        let gaps = self.gaps.load(Relaxed);
        let reordered = self.reordered.load(Relaxed);
        RtpSnapshot {
            packets: self.packets.load(Relaxed),
            lost: gaps.saturating_sub(reordered),
            reordered,
            duplicate: self.duplicate.load(Relaxed),
            resyncs: self.resyncs.load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(seqs: &[u16]) -> RtpSnapshot {
        let t = RtpTracker::default();
        for &s in seqs {
            t.observe(s, 7);
        }
        t.snapshot()
    }

    #[test]
    fn in_order_has_no_loss() {
        let seqs: Vec<u16> = (0..1000).collect();
        let s = run(&seqs);
        assert_eq!(
            s,
            RtpSnapshot {
                packets: 1000,
                ..Default::default()
            }
        );
    }

    #[test]
    fn gaps_are_lost() {
        let s = run(&[1, 2, 5, 6, 10]);
        assert_eq!(s.lost, 5); // 3, 4, 7, 8, 9
        assert_eq!(s.reordered, 0);
    }

    #[test]
    fn late_packet_is_reordered_not_lost() {
        let s = run(&[1, 2, 4, 3, 5]);
        assert_eq!(s.lost, 0);
        assert_eq!(s.reordered, 1);
        assert_eq!(s.duplicate, 0);
    }

    #[test]
    fn duplicates_are_counted_once_each() {
        let s = run(&[1, 2, 2, 3, 1, 3]);
        assert_eq!(s.duplicate, 3);
        assert_eq!(s.lost, 0);
        assert_eq!(s.reordered, 0);
    }

    #[test]
    fn wraps_around() {
        let s = run(&[65533, 65534, 65535, 0, 1, 3]);
        assert_eq!(s.lost, 1);
        assert_eq!(s.resyncs, 0);
    }

    #[test]
    fn big_jump_and_new_ssrc_resync() {
        let t = RtpTracker::default();
        t.observe(1, 7);
        t.observe(2, 7);
        t.observe(20000, 7);
        t.observe(20001, 7);
        t.observe(5, 8);
        t.observe(6, 8);
        let s = t.snapshot();
        assert_eq!(s.lost, 0);
        assert_eq!(s.resyncs, 2);
    }

    #[test]
    fn very_late_packet_counts_as_reordered() {
        let mut seqs: Vec<u16> = (0..200).collect();
        seqs.retain(|&s| s != 50);
        seqs.push(50);
        let s = run(&seqs);
        assert_eq!(s.reordered, 1);
        assert_eq!(s.lost, 0);
    }
}
