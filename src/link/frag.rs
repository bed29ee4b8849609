//! Datagrams longer than a link frame: the receiving half's reassembly ([`Joiner`]).
//!
//! The sender (`engine::link::LinkTx::push`) cuts a datagram of more than
//! [`MAX_MEDIA`] bytes into `frags` consecutive frames of its lane, each with the
//! same stream sequence and its fragment index in the stream header
//! ([`crate::wire::link::StreamHeader`]); all but the last carry exactly [`MAX_MEDIA`] bytes.
//! FEC protects each fragment like any frame, and the reorder window orders them like any
//! datagram. The receiver joins them here, after FEC and the reorder window:
//!
//! - **Bounded.** [`JOIN_SLOTS`] datagrams at a time, each slot [`MAX_FRAGS`] ×
//!   [`MAX_MEDIA`] bytes, allocated once at the first fragment (about 1 MiB); never more.
//! - **Given up** (the fragments it holds counted as dropped, by reason): `fragment_lost`
//!   when the datagram can no longer complete — with a reorder window (lane order), a
//!   fragment of a newer datagram of the same stream came (wrapping compare), so the
//!   missing ones were given up, and a late fragment of an older datagram (an FEC rebuild
//!   the window already passed over, a duplicate) is dropped, counted, leaving the newer
//!   slot alone; in any mode, every slot was busy and this was the oldest — and `fragment_timeout`
//!   when it waited [`JOIN_TIMEOUT_MS`].
//! - A fragment whose fields disagree with its slot's (another fragment count) or that
//!   repeats one already held is counted `bad_fragment` / ignored.
//!
//! No allocation, lock or log per packet; pure logic (the clock comes from the caller).

use crate::wire::link::{StreamHeader, MAX_FRAGS, MAX_MEDIA};

/// Datagrams being joined at once.
pub const JOIN_SLOTS: usize = 16;
/// A datagram whose fragments have not all come this long after its first is given up.
/// Longer than the reorder window's longest wait (500 ms) would be pointless: by then
/// the window gave the missing fragment up.
pub const JOIN_TIMEOUT_MS: u64 = 500;
/// Bytes of one slot: the largest datagram, in whole fragments.
const SLOT_BYTES: usize = MAX_FRAGS * MAX_MEDIA;

#[derive(Clone, Copy, Default)]
struct Slot {
    used: bool,
    dst: u16,
    src: u16,
    seq: u32,
    frags: u8,
    /// Bit `i`: fragment `i` is here.
    have: u64,
    /// Length of the whole datagram, once its last fragment came.
    len: usize,
    repaired: bool,
    since_ms: u64,
}

/// What a [`Joiner`] counted, cumulative (fragments are link frames).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JoinCounts {
    /// Fragments taken in.
    pub fragments: u64,
    /// Datagrams joined whole and handed on.
    pub joined: u64,
    /// Fragments dropped: their datagram could no longer complete.
    pub lost: u64,
    /// Fragments dropped: their datagram waited [`JOIN_TIMEOUT_MS`].
    pub timeout: u64,
    /// Fragments that contradict their datagram's others (dropped).
    pub bad: u64,
    /// Fragments that came twice (ignored).
    pub duplicate: u64,
}

/// A joined datagram: the bytes and whether FEC rebuilt any of its fragments.
pub struct Joined<'a> {
    pub data: &'a [u8],
    pub repaired: bool,
}

/// The receiving half's reassembly of fragmented datagrams (see the module doc).
pub struct Joiner {
    slots: [Slot; JOIN_SLOTS],
    /// `JOIN_SLOTS × SLOT_BYTES`, allocated at the first fragment.
    buf: Box<[u8]>,
    /// Lanes hand datagrams on in the sender's order (a reorder window is on).
    in_order: bool,
    pub counts: JoinCounts,
}

impl Joiner {
    pub fn new(in_order: bool) -> Joiner {
        Joiner {
            slots: [Slot::default(); JOIN_SLOTS],
            buf: Box::default(),
            in_order,
            counts: JoinCounts::default(),
        }
    }

    fn give_up(slot: &mut Slot, counter: &mut u64) {
        *counter += u64::from(slot.have.count_ones());
        slot.used = false;
    }

    /// Takes one fragment (`sh.frags > 1`) of the datagram with stream sequence `sh.sequence`
    /// for gateway port `dst` from `src`; the whole datagram once its last missing fragment
    /// came.
    pub fn offer(
        &mut self,
        dst: u16,
        src: u16,
        sh: StreamHeader,
        media: &[u8],
        repaired: bool,
        now_ms: u64,
    ) -> Option<Joined<'_>> {
        debug_assert!(sh.frags > 1 && usize::from(sh.frags) <= MAX_FRAGS);
        self.counts.fragments += 1;
        if self.buf.is_empty() {
            // Once, at the first fragment this half ever receives.
            self.buf = vec![0u8; JOIN_SLOTS * SLOT_BYTES].into_boxed_slice();
        }
        let same = |s: &Slot| s.used && s.dst == dst && s.src == src;
        // Wrapping compare: the slot's datagram came after this fragment's in the stream.
        let newer = |s: &Slot| (s.seq.wrapping_sub(sh.sequence) as i32) > 0;
        if self.in_order && self.slots.iter().any(|s| same(s) && newer(s)) {
            // A late fragment (an FEC rebuild the reorder window already passed over, a
            // duplicate): its datagram was given up when the newer one began; the newer
            // one's slot is left alone.
            self.counts.lost += 1;
            return None;
        }
        let mut found = None;
        for (i, s) in self.slots.iter_mut().enumerate() {
            if same(s) && s.seq == sh.sequence {
                found = Some(i);
            } else if self.in_order && same(s) {
                // In lane order a newer datagram of the stream means this older one's
                // missing fragments were given up (no slot of the stream is newer: above).
                Self::give_up(s, &mut self.counts.lost);
            }
        }
        let i = match found {
            Some(i) => i,
            None => {
                let i = match self.slots.iter().position(|s| !s.used) {
                    Some(i) => i,
                    None => {
                        let (i, _) = self
                            .slots
                            .iter()
                            .enumerate()
                            .min_by_key(|(_, s)| s.since_ms)
                            .expect("JOIN_SLOTS > 0");
                        Self::give_up(&mut self.slots[i], &mut self.counts.lost);
                        i
                    }
                };
                self.slots[i] = Slot {
                    used: true,
                    dst,
                    src,
                    seq: sh.sequence,
                    frags: sh.frags,
                    since_ms: now_ms,
                    ..Slot::default()
                };
                i
            }
        };
        let s = &mut self.slots[i];
        if s.frags != sh.frags {
            self.counts.bad += 1;
            return None;
        }
        let bit = 1u64 << sh.frag;
        if s.have & bit != 0 {
            self.counts.duplicate += 1;
            return None;
        }
        s.have |= bit;
        s.repaired |= repaired;
        let at = i * SLOT_BYTES + usize::from(sh.frag) * MAX_MEDIA;
        self.buf[at..at + media.len()].copy_from_slice(media);
        if sh.frag + 1 == sh.frags {
            s.len = usize::from(sh.frag) * MAX_MEDIA + media.len();
        }
        if s.have != crate::wire::link::data_mask(usize::from(s.frags)) {
            return None;
        }
        s.used = false;
        self.counts.joined += 1;
        let start = i * SLOT_BYTES;
        Some(Joined {
            data: &self.buf[start..start + s.len],
            repaired: s.repaired,
        })
    }

    /// When [`Joiner::expire`] next has something to give up (None: nothing waiting).
    pub fn next_deadline(&self) -> Option<u64> {
        self.slots
            .iter()
            .filter(|s| s.used)
            .map(|s| s.since_ms + JOIN_TIMEOUT_MS)
            .min()
    }

    /// Gives up the datagrams that waited [`JOIN_TIMEOUT_MS`] (`u64::MAX`: all of them).
    pub fn expire(&mut self, now_ms: u64) {
        for s in self.slots.iter_mut() {
            if s.used && now_ms.saturating_sub(s.since_ms) >= JOIN_TIMEOUT_MS {
                Self::give_up(s, &mut self.counts.timeout);
            }
        }
    }
}

/// Cuts `datagram` into link datagrams of at most [`MAX_MEDIA`] bytes of media: calls
/// `frame(stream header, media)` for each in order. `false` (nothing called) when it is
/// longer than `max` or than [`crate::wire::link::MAX_DATAGRAM`].
pub fn cut(
    datagram: &[u8],
    seq: u32,
    max: usize,
    mut frame: impl FnMut(StreamHeader, &[u8]),
) -> bool {
    let Some(n) = crate::wire::link::fragments(datagram.len()) else {
        return false;
    };
    if datagram.len() > max {
        return false;
    }
    let mut chunks = datagram.chunks(MAX_MEDIA);
    for i in 0..n {
        let sh = StreamHeader {
            sequence: seq,
            frag: i as u8,
            frags: n as u8,
        };
        frame(sh, chunks.next().unwrap_or(&[]));
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::link::{MAX_DATAGRAM, STREAM_HEADER_LEN};

    fn datagram(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    /// Cuts into link datagrams (stream header + media), as they cross the link.
    fn cut_all(d: &[u8], seq: u32) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        assert!(cut(d, seq, MAX_DATAGRAM, |sh, m| {
            let mut f = sh.bytes().to_vec();
            f.extend_from_slice(m);
            out.push(f);
        }));
        out
    }

    fn feed(j: &mut Joiner, frames: &[Vec<u8>], now: u64) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        for f in frames {
            let (sh, media) = StreamHeader::parse(f).expect("a valid stream header");
            if sh.frags == 1 {
                got.push(media.to_vec());
            } else if let Some(d) = j.offer(5000, 6000, sh, media, false, now) {
                got.push(d.data.to_vec());
            }
        }
        got
    }

    #[test]
    fn cut_sizes() {
        for len in [
            0,
            1,
            MAX_MEDIA,
            MAX_MEDIA + 1,
            1472,
            4096,
            3 * MAX_MEDIA,
            MAX_DATAGRAM,
        ] {
            let d = datagram(len, 1);
            let frames = cut_all(&d, 9);
            assert_eq!(frames.len(), len.div_ceil(MAX_MEDIA).max(1), "len {len}");
            for f in &frames {
                assert!(f.len() <= STREAM_HEADER_LEN + MAX_MEDIA);
                assert!(StreamHeader::parse(f).is_some());
            }
            let mut j = Joiner::new(true);
            assert_eq!(feed(&mut j, &frames, 0), vec![d], "len {len}");
        }
        assert!(!cut(&[0; 2000], 1, 1999, |_, _| panic!("nothing cut")));
        assert!(!cut(
            &vec![0; MAX_DATAGRAM + 1],
            1,
            usize::MAX,
            |_, _| panic!()
        ));
    }

    /// Any order joins; a lost fragment loses its datagram only, counted; the slots come
    /// back (timeout, or the stream moving on in lane order).
    #[test]
    fn join_with_loss_and_reordering() {
        let a = datagram(4096, 1);
        let b = datagram(1472, 2);
        let c = datagram(3000, 3);
        let (fa, fb, fc) = (cut_all(&a, 10), cut_all(&b, 11), cut_all(&c, 12));
        assert_eq!((fa.len(), fb.len(), fc.len()), (3, 2, 3));

        // Out of order, no reorder window: a whole, b missing its fragment 0, c reversed.
        let mut j = Joiner::new(false);
        let frames = [&fa[2], &fa[0], &fb[1], &fc[2], &fa[1], &fc[1], &fc[0]].map(|f| f.clone());
        assert_eq!(feed(&mut j, &frames, 0), vec![a.clone(), c.clone()]);
        assert_eq!(j.next_deadline(), Some(JOIN_TIMEOUT_MS));
        j.expire(JOIN_TIMEOUT_MS - 1);
        assert_eq!(j.counts.timeout, 0);
        j.expire(JOIN_TIMEOUT_MS);
        assert_eq!(j.counts.timeout, 1, "b's one fragment");
        assert_eq!(j.next_deadline(), None);
        assert_eq!(
            (j.counts.joined, j.counts.fragments, j.counts.lost),
            (2, 7, 0)
        );

        // In lane order: b's fragment 1 lost; c's first fragment gives b up at once.
        let mut j = Joiner::new(true);
        let mut frames = fa.clone();
        frames.push(fb[0].clone());
        frames.extend(fc.iter().cloned());
        assert_eq!(feed(&mut j, &frames, 0), vec![a.clone(), c.clone()]);
        assert_eq!((j.counts.lost, j.counts.timeout), (1, 0));
        assert_eq!(j.next_deadline(), None);

        // In lane order, a late fragment of b (e.g. rebuilt by FEC after the reorder window
        // passed it) after c's first fragment: counted lost, dropped; c still joins and
        // no slot is left waiting for b.
        let mut j = Joiner::new(true);
        let frames = [&fc[0], &fb[1], &fc[1], &fb[0], &fc[2]].map(|f| f.clone());
        assert_eq!(feed(&mut j, &frames, 0), vec![c.clone()]);
        assert_eq!(
            (j.counts.lost, j.counts.timeout, j.counts.joined),
            (2, 0, 1)
        );
        assert_eq!(j.next_deadline(), None);
        // Across the sequence's wrap: 0 is newer than u32::MAX.
        let (fw, fz) = (cut_all(&a, u32::MAX), cut_all(&c, 0));
        let mut j = Joiner::new(true);
        let frames = [&fz[0], &fw[2], &fz[1], &fz[2]].map(|f| f.clone());
        assert_eq!(feed(&mut j, &frames, 0), vec![c.clone()]);
        assert_eq!((j.counts.lost, j.counts.joined), (1, 1));

        // A duplicate fragment is ignored; one with another count is refused.
        let mut j = Joiner::new(false);
        let mut frames = vec![fa[0].clone(), fa[0].clone()];
        let mut odd = fa[1].clone();
        odd[5] = 4;
        frames.push(odd);
        frames.extend(fa[1..].iter().cloned());
        assert_eq!(feed(&mut j, &frames, 0), vec![a.clone()]);
        assert_eq!((j.counts.duplicate, j.counts.bad), (1, 1));
    }

    /// More datagrams waiting than slots: the oldest is given up, memory stays bounded.
    #[test]
    fn slots_are_bounded() {
        let mut j = Joiner::new(false);
        for seq in 0..(JOIN_SLOTS as u32 + 4) {
            let f = cut_all(&datagram(2000, seq as u8), seq);
            let (sh, media) = StreamHeader::parse(&f[0]).unwrap();
            assert!(j
                .offer(5000, 6000, sh, media, false, u64::from(seq))
                .is_none());
        }
        assert_eq!(j.counts.lost, 4);
        assert_eq!(j.next_deadline(), Some(4 + JOIN_TIMEOUT_MS));
        j.expire(u64::MAX);
        assert_eq!(j.counts.timeout, JOIN_SLOTS as u64);
        assert_eq!(j.buf.len(), JOIN_SLOTS * SLOT_BYTES);
    }

    /// Random and mutated link datagrams (what a hostile or broken peer could make FEC
    /// rebuild) never panic the reassembly and never grow it.
    #[test]
    fn random_input_is_harmless() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let good = cut_all(&datagram(5000, 9), 77);
        for in_order in [false, true] {
            let mut j = Joiner::new(in_order);
            for i in 0..20_000u64 {
                let mut f = if next() % 2 == 0 {
                    good[(next() % good.len() as u64) as usize].clone()
                } else {
                    let len = (next() % 1500) as usize;
                    (0..len).map(|_| next() as u8).collect()
                };
                if !f.is_empty() && next() % 3 == 0 {
                    let at = (next() as usize) % f.len();
                    f[at] ^= 1 << (next() % 8);
                }
                if let Some((sh, media)) = StreamHeader::parse(&f) {
                    if sh.frags > 1 {
                        let (dst, src) = ((next() % 3) as u16, (next() % 2) as u16);
                        if let Some(d) = j.offer(dst, src, sh, media, false, i) {
                            assert!(d.data.len() <= MAX_DATAGRAM);
                        }
                    }
                }
                if i % 1000 == 0 {
                    j.expire(i);
                }
            }
            assert_eq!(j.buf.len(), JOIN_SLOTS * SLOT_BYTES);
            j.expire(u64::MAX);
            assert_eq!(j.next_deadline(), None);
        }
    }
}
