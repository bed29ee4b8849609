//! Unit tests of the FEC: loss patterns, settling, hostile frames, the reorder window.

use crate::wire::link::{HeaderError, LinkPacket, SHARD_PREFIX};

use super::*;

/// Sends `n` datagrams through an encoder, drops the frames `lose` says, feeds the rest
/// to a decoder; returns what was delivered, in order.
fn run(fec: Option<Fec>, n: usize, lose: impl Fn(usize) -> bool) -> (Vec<Vec<u8>>, DecoderCounts) {
    let mut enc = Encoder::new(2, 7, fec, 4);
    let mut dec = Decoder::new(fec);
    let mut out = Vec::new();
    let mut wire = 0usize;
    let mut send = |enc: &mut Encoder, dec: &mut Decoder, out: &mut Vec<Vec<u8>>| {
        let frames: Vec<Vec<u8>> = enc.ready().map(|f| f.to_vec()).collect();
        enc.mark_sent();
        for f in frames {
            let keep = !lose(wire);
            wire += 1;
            if keep {
                let p = LinkPacket::new_checked(&f[..]).unwrap();
                dec.receive(&p, 0, |dst, src, pl, _| {
                    assert_eq!((dst, src), (30000, 20002));
                    out.push(pl.to_vec())
                })
                .unwrap();
            }
        }
    };
    for i in 0..n {
        let payload: Vec<u8> = (0..(20 + i * 37 % 1200)).map(|j| (i + j) as u8).collect();
        if enc.must_flush() {
            send(&mut enc, &mut dec, &mut out);
        }
        assert!(enc.push(30000, 20002, &payload, i as u32));
    }
    enc.close_block(0);
    send(&mut enc, &mut dec, &mut out);
    dec.settle(10_000, 1);
    (out, dec.counts)
}

fn expected(n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| (0..(20 + i * 37 % 1200)).map(|j| (i + j) as u8).collect())
        .collect()
}

/// The sending worker stalls mid-block for longer than the settle age: the receiver
/// gives the block up and counts its missing positions lost; when the sender resumes,
/// the rest of the block (data, and the rebuild of a frame the link lost before the
/// stall) is still handed on, counted late, and nothing stays counted lost.
#[test]
fn a_block_settled_while_its_sender_stalled_still_delivers_the_rest() {
    let fec = Fec::kpm(8, 2);
    let mut enc = Encoder::new(2, 7, Some(fec), 4);
    let mut dec = Decoder::new(Some(fec));
    let mut out = Vec::new();
    let mut feed = |enc: &mut Encoder, dec: &mut Decoder, now: u64, lose: &[usize]| {
        let frames: Vec<Vec<u8>> = enc.ready().map(|f| f.to_vec()).collect();
        enc.mark_sent();
        for (i, f) in frames.iter().enumerate() {
            if !lose.contains(&i) {
                let p = LinkPacket::new_checked(&f[..]).unwrap();
                dec.receive(&p, now, |_, _, pl, _| out.push(pl.to_vec()))
                    .unwrap();
            }
        }
    };
    let payloads = expected(8);
    for p in &payloads[..5] {
        assert!(enc.push(30000, 20002, p, 0));
    }
    // Data 0..5 sent, the link loses 1; then the sender stalls.
    feed(&mut enc, &mut dec, 0, &[1]);
    dec.settle(600, 500);
    assert_eq!(dec.counts.lost, 4, "1, and 5..8 not sent yet");
    for p in &payloads[5..] {
        assert!(enc.push(30000, 20002, p, 0));
    }
    feed(&mut enc, &mut dec, 2000, &[]);
    let mut got = out.clone();
    got.sort();
    let mut want = payloads.clone();
    want.sort();
    assert_eq!(got, want, "every datagram once");
    let c = dec.counts;
    assert_eq!((c.lost, c.repaired, c.late), (0, 1, 4), "{c:?}");

    // A partial block closed short after it was settled: its never-sent positions are
    // not lost.
    let mut enc = Encoder::new(2, 7, Some(fec), 4);
    let mut dec = Decoder::new(Some(fec));
    for p in &payloads[..3] {
        assert!(enc.push(30000, 20002, p, 0));
    }
    let frames: Vec<Vec<u8>> = enc.ready().map(|f| f.to_vec()).collect();
    enc.mark_sent();
    for f in &frames {
        let p = LinkPacket::new_checked(&f[..]).unwrap();
        dec.receive(&p, 0, |_, _, _, _| {}).unwrap();
    }
    dec.settle(600, 500);
    assert_eq!(dec.counts.lost, 5);
    enc.close_block(0);
    let frames: Vec<Vec<u8>> = enc.ready().map(|f| f.to_vec()).collect();
    for f in &frames {
        let p = LinkPacket::new_checked(&f[..]).unwrap();
        dec.receive(&p, 2000, |_, _, _, _| {}).unwrap();
    }
    assert_eq!(dec.counts.lost, 0, "{:?}", dec.counts);
}

#[test]
fn no_loss_delivers_everything_once() {
    for fec in [None, Some(Fec::kpm(8, 2)), Some(Fec::kpm(16, 4))] {
        let (out, c) = run(fec, 100, |_| false);
        assert_eq!(out, expected(100), "{fec:?}");
        assert_eq!((c.delivered, c.repaired, c.lost), (100, 0, 0));
    }
}

#[test]
fn repairs_up_to_m_losses_per_block_and_counts_the_rest() {
    let fec = Some(Fec::kpm(8, 2));
    // Every block is 10 frames; lose 2 of each (data 1 and 5): all rebuilt.
    let (mut out, c) = run(fec, 80, |w| w % 10 == 1 || w % 10 == 5);
    assert_eq!((c.repaired, c.lost), (20, 0), "10 blocks, 2 rebuilt each");
    out.sort();
    let mut want = expected(80);
    want.sort();
    assert_eq!(out, want);
    // Lose 3 data frames of the first block: beyond repair, counted lost.
    let (out, c) = run(fec, 16, |w| w < 3);
    assert_eq!((c.delivered, c.repaired, c.lost), (13, 0, 3));
    assert_eq!(out.len(), 13);
    // The partial last block (5 of 8, closed early) is repaired too.
    let (out, c) = run(fec, 21, |w| w == 21);
    assert_eq!((c.repaired, c.lost, out.len()), (1, 0, 21));
}

#[test]
fn plain_counts_gaps() {
    let (out, c) = run(None, 50, |w| w == 10 || w == 11);
    assert_eq!((out.len(), c.lost), (48, 2));
}

#[test]
fn fec_setting_must_match() {
    let mut enc = Encoder::new(0, 1, Some(Fec::kpm(4, 1)), 1);
    assert!(enc.push(1, 2, b"x", 0));
    let f: Vec<u8> = enc.ready().next().unwrap().to_vec();
    let p = LinkPacket::new_checked(&f[..]).unwrap();
    let mut dec = Decoder::new(Some(Fec::kpm(8, 2)));
    assert_eq!(
        dec.receive(&p, 0, |_, _, _, _| panic!()),
        Err(HeaderError::BadFec)
    );
    let mut off = Decoder::new(None);
    assert_eq!(
        off.receive(&p, 0, |_, _, _, _| panic!()),
        Err(HeaderError::BadFec)
    );
    assert_eq!(off.counts.fec_mismatch, 1);
}

/// What a compromised peer half could send: mutated and random frames, never a panic,
/// and nothing delivered longer than a frame.
#[test]
fn hostile_frames_never_panic() {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for (fec, hold) in [
        (None, 0),
        (Some(Fec::kpm(8, 2)), 0),
        (Some(Fec::kpm(3, 4)), 0),
        (None, 20),
        (Some(Fec::kpm(8, 2)), 20),
    ] {
        let mut dec = Decoder::with_reorder(fec, hold);
        let mut enc = Encoder::new(1, 9, fec, 4);
        for round in 0..8_000u32 {
            if enc.must_flush() {
                enc.mark_sent();
            }
            let len = (next() % 1400) as usize;
            let payload = vec![round as u8; len];
            enc.push(20000, 30000, &payload, round);
            let mut f: Vec<u8> = match enc.ready().last() {
                Some(f) => f.to_vec(),
                None => continue,
            };
            // Flip bytes (often in the header), cut or extend.
            for _ in 0..(next() % 4) {
                let i = (next() as usize) % f.len();
                f[i] = next() as u8;
            }
            match next() % 8 {
                0 => f.truncate((next() as usize) % (f.len() + 1)),
                // Up to twice a frame: longer ones must be refused, not stored.
                1 => f.resize(((next() as usize) % (2 * FRAME_CAP)).max(1), next() as u8),
                _ => {}
            }
            if let Ok(p) = LinkPacket::new_checked(&f[..]) {
                let _ = dec.receive(&p, u64::from(round), |_, _, pl, _| {
                    assert!(pl.len() <= MAX_PAYLOAD + SHARD_PREFIX)
                });
            }
            if round % 1000 == 0 {
                dec.settle(u64::from(round), 10);
            }
            if round % 7 == 0 {
                dec.release_due(u64::from(round), |_, _, pl, _| {
                    assert!(pl.len() <= MAX_PAYLOAD + SHARD_PREFIX)
                });
            }
        }
    }
}

/// A repair frame longer than a link frame, for the last shard of the last block slot:
/// the header check refuses it (the decoder's shard slots are a frame long, and it
/// overran the shard buffer before; the link fuzz target's find).
#[test]
fn an_oversized_repair_frame_is_refused_not_stored() {
    use crate::wire::link::{write_fields, Fields, HEADER_LEN};
    let fec = Fec::kpm(8, 2);
    let mut dec = Decoder::new(Some(fec));
    let mut f = vec![0u8; FRAME_CAP + 600];
    write_fields(
        &mut f,
        &Fields {
            repair: true,
            k: 8,
            m: 2,
            index: 9,
            block: WINDOW_BLOCKS as u32 - 1,
            ..Fields::default()
        },
    );
    assert!(f.len() > HEADER_LEN);
    assert_eq!(
        LinkPacket::new_checked(&f[..]).err(),
        Some(HeaderError::Oversize)
    );
    // Even a caller that skips the check (the view's accessors stay in bounds) cannot
    // make the decoder write past its buffers: the check is the decoder's own first step.
    let p = LinkPacket::new_unchecked(&f[..]);
    assert_eq!(
        dec.receive(&p, 0, |_, _, _, _| panic!("nothing to deliver")),
        Err(HeaderError::Oversize)
    );
}

/// Every frame an encoder (lane 2, `epoch`) sends for datagrams `ids`, in wire order.
fn wire(fec: Option<Fec>, epoch: u16, ids: std::ops::Range<usize>) -> Vec<Vec<u8>> {
    let mut enc = Encoder::new(2, epoch, fec, 4);
    let mut frames = Vec::new();
    let all = expected(ids.end);
    for payload in &all[ids] {
        if enc.must_flush() {
            frames.extend(enc.ready().map(|f| f.to_vec()));
            enc.mark_sent();
        }
        assert!(enc.push(30000, 20002, payload, 0));
    }
    enc.close_block(0);
    frames.extend(enc.ready().map(|f| f.to_vec()));
    enc.mark_sent();
    frames
}

/// Feeds `frames` at `now`; returns what was delivered (payload, repaired).
fn feed(dec: &mut Decoder, frames: &[Vec<u8>], now: u64) -> Vec<(Vec<u8>, bool)> {
    let mut out = Vec::new();
    for f in frames {
        let p = LinkPacket::new_checked(&f[..]).unwrap();
        dec.receive(&p, now, |_, _, pl, rep| out.push((pl.to_vec(), rep)))
            .unwrap();
    }
    out
}

fn payloads(v: Vec<(Vec<u8>, bool)>) -> Vec<Vec<u8>> {
    v.into_iter().map(|(p, _)| p).collect()
}

#[test]
fn reorder_window_delivers_in_sender_order() {
    for fec in [None, Some(Fec::kpm(8, 2)), Some(Fec::kpm(4, 2))] {
        let mut frames = wire(fec, 7, 0..60);
        // Swap neighbours all along, and lose one frame in 7 (FEC rebuilds them).
        // (From the second frame: the window starts where its first frame is.)
        for i in (1..frames.len() - 1).step_by(3) {
            frames.swap(i, i + 1);
        }
        if fec.is_some() {
            frames = frames
                .into_iter()
                .enumerate()
                .filter(|(i, _)| i % 7 != 3)
                .map(|(_, f)| f)
                .collect();
        }
        let mut dec = Decoder::with_reorder(fec, 50);
        let got = feed(&mut dec, &frames, 0);
        assert_eq!(payloads(got.clone()), expected(60), "{fec:?}: in order");
        let c = dec.totals();
        assert!(c.reorder.held > 0, "{fec:?}: {c:?}");
        assert_eq!((c.lost, c.reorder.expired), (0, 0), "{fec:?}: {c:?}");
        assert_eq!(dec.next_deadline(), None, "{fec:?}: nothing left waiting");
        if fec.is_some() {
            assert_eq!(got.iter().filter(|(_, r)| *r).count() as u64, c.repaired);
            assert!(c.repaired > 0);
        }
        // Without a window the same frames come out of order.
        let mut plain = Decoder::new(fec);
        assert_ne!(payloads(feed(&mut plain, &frames, 0)), expected(60));
    }
}

#[test]
fn reorder_window_gives_a_gap_up_when_the_wait_ends() {
    for fec in [None, Some(Fec::kpm(8, 2))] {
        let frames = wire(fec, 7, 0..20);
        // Lose data 3 and both repair frames of the first block (FEC on): beyond repair.
        let keep: Vec<Vec<u8>> = frames
            .into_iter()
            .enumerate()
            .filter(|(i, _)| *i != 3 && !(fec.is_some() && (*i == 8 || *i == 9)))
            .map(|(_, f)| f)
            .collect();
        let mut dec = Decoder::with_reorder(fec, 30);
        let got = payloads(feed(&mut dec, &keep, 100));
        assert_eq!(got, expected(3), "{fec:?}: 4.. wait for 3");
        // FEC off: nothing tells a loss from a late frame, 3 is waited for the whole 30 ms.
        // FEC on: the next block's first frame says the first block had all its frames and
        // could not be rebuilt; 3 is waited for only the grace of a swapped neighbour.
        let at = if fec.is_some() {
            100 + crate::link::reorder::LOST_GRACE_MS
        } else {
            130
        };
        assert_eq!(dec.next_deadline(), Some(at), "{fec:?}");
        let mut late = Vec::new();
        dec.release_due(at - 1, |_, _, pl, _| late.push(pl.to_vec()));
        assert!(late.is_empty());
        dec.release_due(at, |_, _, pl, _| late.push(pl.to_vec()));
        assert_eq!(late, expected(20)[4..].to_vec(), "{fec:?}");
        assert_eq!(dec.next_deadline(), None);
        assert_eq!(dec.totals().reorder.expired, 1, "{fec:?}");
        // 3 shows up after all: handed on, counted (FEC on: its block is not settled yet).
        let late3 = wire(fec, 7, 0..20).swap_remove(3);
        let got = feed(&mut dec, &[late3], 200);
        assert_eq!(payloads(got), vec![expected(4)[3].clone()]);
        assert_eq!(dec.totals().reorder.overtaken, 1);
    }
}

#[test]
fn reorder_window_flushes_on_a_new_epoch() {
    for fec in [None, Some(Fec::kpm(8, 2))] {
        let mut old = wire(fec, 7, 0..5);
        old.remove(1); // datagram 1 lost: 2.. wait
        let mut dec = Decoder::with_reorder(fec, 1000);
        assert_eq!(payloads(feed(&mut dec, &old[..3], 0)), expected(1));
        // The sender restarts (new epoch, its sequence from 0): what waited goes first,
        // then the new sender's datagrams, in their own order.
        let new = wire(fec, 8, 0..3);
        let got = payloads(feed(&mut dec, &new, 1));
        let mut want = expected(4)[2..4].to_vec();
        want.extend(expected(3));
        assert_eq!(got, want, "{fec:?}");
        let c = dec.totals();
        assert_eq!(c.restarts, 1, "{fec:?}");
        assert_eq!(dec.next_deadline(), None);
    }
}

#[test]
fn reorder_window_hands_duplicates_on_once() {
    let fec = Some(Fec::kpm(8, 2));
    let frames = wire(fec, 7, 0..8);
    let mut dup = vec![frames[0].clone(), frames[2].clone(), frames[2].clone()];
    dup.push(frames[1].clone());
    dup.push(frames[2].clone());
    let mut dec = Decoder::with_reorder(fec, 20);
    assert_eq!(payloads(feed(&mut dec, &dup, 0)), expected(3));
    assert_eq!(dec.totals().duplicate, 2);
    // FEC off: the link has no way to tell a copy from a late datagram; the window holds
    // a position once, and a copy after it passed is handed on as overtaken.
    let frames = wire(None, 7, 0..3);
    let mut dec = Decoder::with_reorder(None, 20);
    let seq = [&frames[0], &frames[2], &frames[2], &frames[1]].map(|f| f.clone());
    assert_eq!(payloads(feed(&mut dec, &seq, 0)), expected(3));
}

#[test]
fn fec_parse() {
    assert_eq!(Fec::parse("off"), Ok(None));
    assert_eq!(Fec::parse("8+2"), Ok(Some(Fec::kpm(8, 2))));
    for bad in ["", "8", "0+2", "8+0", "33+1", "8+17", "a+b", "8-2"] {
        assert!(Fec::parse(bad).is_err(), "{bad}");
    }
}

/// Every frame of lane `lane`'s encoder for datagrams `ids`, blocks closed on time every
/// `every` datagrams (partial blocks, as `fec_block_ms` cuts them), in wire order.
fn wire_cut(fec: Option<Fec>, lane: u8, ids: std::ops::Range<usize>, every: usize) -> Vec<Vec<u8>> {
    let mut enc = Encoder::new(lane, 7, fec, 4);
    let mut frames = Vec::new();
    let all = expected(ids.end);
    for (n, payload) in all[ids].iter().enumerate() {
        if enc.must_flush() {
            frames.extend(enc.ready().map(|f| f.to_vec()));
            enc.mark_sent();
        }
        assert!(enc.push(30000, 20002, payload, 0));
        if n % every == every - 1 {
            enc.close_block(0);
            frames.extend(enc.ready().map(|f| f.to_vec()));
            enc.mark_sent();
        }
    }
    enc.close_block(0);
    frames.extend(enc.ready().map(|f| f.to_vec()));
    enc.mark_sent();
    frames
}

#[test]
fn a_lossless_link_never_opens_a_wait_with_blocks_cut_on_time_and_many_lanes() {
    let block = Fec::block(116, 10, 2).unwrap();
    for fec in [None, Some(Fec::kpm(8, 2)), Some(block)] {
        for every in [1, 3, 7, 200] {
            // Two sending workers (lanes 1 and 2), their frames interleaved unevenly on the
            // link: each lane has its own positions, so neither makes gaps in the other's.
            let a = wire_cut(fec, 1, 0..300, every);
            let b = wire_cut(fec, 2, 0..300, every);
            let mut mixed = Vec::new();
            let (mut i, mut j) = (0, 0);
            while i < a.len() || j < b.len() {
                for _ in 0..(i % 5 + 1) {
                    if i < a.len() {
                        mixed.push(a[i].clone());
                        i += 1;
                    }
                }
                if j < b.len() {
                    mixed.push(b[j].clone());
                    j += 1;
                }
            }
            let mut dec = Decoder::with_reorder(fec, 25);
            let got = feed(&mut dec, &mixed, 0);
            assert_eq!(got.len(), 600, "{fec:?} every {every}");
            let c = dec.totals();
            assert_eq!(
                (c.reorder.waits, c.reorder.held, c.reorder.expired, c.lost),
                (0, 0, 0, 0),
                "{fec:?} every {every}: {c:?}"
            );
            assert_eq!(dec.next_deadline(), None);
        }
    }
}

#[test]
fn a_block_beyond_repair_is_given_up_when_its_frames_say_so_not_after_the_wait() {
    use crate::link::reorder::{Release, LOST_GRACE_MS};
    let fec = Some(Fec::kpm(8, 2));
    let frames = wire(fec, 7, 0..8);
    assert_eq!(frames.len(), 10);
    // Data 1 and 2 and repair frame 8 lost: 7 of the block's 10 frames, where it takes 8.
    // Until its last frame the block could still be rebuilt; the sender then goes quiet (no
    // next block to say the block is over): that last frame says it.
    let keep: Vec<Vec<u8>> = [0, 3, 4, 5, 6, 7]
        .iter()
        .map(|&i| frames[i].clone())
        .collect();
    let mut dec = Decoder::with_reorder(fec, 25);
    assert_eq!(payloads(feed(&mut dec, &keep, 100)), expected(1));
    assert_eq!(
        dec.next_deadline(),
        Some(125),
        "repair frames 8 and 9 could rebuild it"
    );
    assert!(feed(&mut dec, &[frames[9].clone()], 102).is_empty());
    assert_eq!(
        dec.next_deadline(),
        Some(102 + LOST_GRACE_MS),
        "beyond repair"
    );
    let mut out = Vec::new();
    dec.release_due(102 + LOST_GRACE_MS, |_, _, pl, _| out.push(pl.to_vec()));
    assert_eq!(out, expected(8)[3..].to_vec());
    let c = dec.totals();
    assert_eq!((c.reorder.expired, c.reorder.waits), (2, 1));
    assert_eq!(c.reorder.released[Release::Lost as usize], 5);

    // A data frame can say it first: with data 1, 2 and 3 lost, data 4 leaves 5 frames to
    // come and 2 in hand, 7 of the 8 needed.
    let keep: Vec<Vec<u8>> = [0, 4, 5].iter().map(|&i| frames[i].clone()).collect();
    let mut dec = Decoder::with_reorder(fec, 25);
    assert_eq!(payloads(feed(&mut dec, &keep, 100)), expected(1));
    assert_eq!(dec.next_deadline(), Some(100 + LOST_GRACE_MS));
}
