//! The link FEC's instructions per media datagram, for callgrind (`scripts/bench-fec.sh`):
//! `fec_cost FEC LOSS COUNT [STREAMS]` runs COUNT link datagrams (1322 bytes: a 1316-byte
//! media payload and the stream header, round robin over STREAMS destination ports, 100 by
//! default) through one [`Encoder`] → a fixed random loss of LOSS per 1000 frames (or, as
//! `bN`, a burst of N consecutive frames at a random place in every 1000) →
//! one [`Decoder`]. FEC is `off`, `K+M`, `block` or `block/P/F` (`fec_overhead` P,
//! `fec_block_frames` F). Only `run` is meant to be counted (`--toggle-collect='fec_cost::run'`):
//! the lanes' buffers are made before it. Prints what was sent, lost, delivered and rebuilt.
//!
//! `fec_cost decode K M LOST ROUNDS` decodes one block of K+M 1408-byte shards with LOST data
//! shards missing, ROUNDS times with the crate's decoder (`decode_crate`) and
//! with the link's decoder (`decode_link`: the same crate with the erasure locator evaluated
//! directly, [`LocatorEngine`]) and with the link's direct solve (`decode_direct`, [`Direct`],
//! what the receiver runs for up to 32 lost); count each with
//! `--toggle-collect='fec_cost::decode_crate'`, `'fec_cost::decode_link'` or
//! `'fec_cost::decode_direct'`. Checks that all three restore the same shards.

use std::hint::black_box;

use reed_solomon_simd::engine::{DefaultEngine, Engine};
use reed_solomon_simd::rate::{DefaultRateDecoder, RateDecoder};
use reed_solomon_simd::ReedSolomonEncoder;
use vgate::link::fec::{Decoder, Direct, Encoder, LocatorEngine};
use vgate::link::Fec;
use vgate::wire::link::LinkPacket;

const LEN: usize = 1322;

fn parse(s: &str) -> Option<Fec> {
    let mut parts = s.split('/');
    let head = parts.next().unwrap_or(s);
    match (head, parts.next(), parts.next()) {
        ("block", Some(p), Some(f)) => {
            Some(Fec::block(f.parse().unwrap(), p.parse().unwrap(), 100).unwrap())
        }
        _ => Fec::parse(s).unwrap(),
    }
}

/// The link's loss: PERMILLE random (`10`), or `bN`: a burst of N consecutive frames in
/// every 1000.
#[derive(Clone, Copy)]
enum Loss {
    Random(u64),
    Burst(u64),
}

struct Totals {
    frames: u64,
    lost: u64,
    delivered: u64,
    repaired: u64,
}

#[inline(never)]
fn run(enc: &mut Encoder, dec: &mut Decoder, loss: Loss, count: u64, streams: u16) -> Totals {
    let payload = [0x5au8; LEN];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut wire = 0u64;
    let mut burst_at = 0u64;
    let mut t = Totals {
        frames: 0,
        lost: 0,
        delivered: 0,
        repaired: 0,
    };
    let mut send = |enc: &mut Encoder, dec: &mut Decoder, t: &mut Totals| {
        for f in enc.ready() {
            t.frames += 1;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let lose = match loss {
                Loss::Random(permille) => x % 1000 < permille,
                Loss::Burst(n) => {
                    // One burst of n consecutive frames in every 1000, at a random offset.
                    if wire.is_multiple_of(1000) {
                        burst_at = wire + x % (1000 - n);
                    }
                    (burst_at..burst_at + n).contains(&wire)
                }
            };
            wire += 1;
            if lose {
                t.lost += 1;
                continue;
            }
            let p = LinkPacket::new_checked(f).unwrap();
            let _ = dec.receive(&p, 0, |_, _, pl, rebuilt| {
                t.delivered += 1;
                t.repaired += u64::from(rebuilt);
                black_box(pl);
            });
        }
        enc.mark_sent();
    };
    for i in 0..count {
        if enc.must_flush() {
            send(enc, dec, &mut t);
        }
        let dst = 30000 + (i % u64::from(streams)) as u16;
        enc.push(dst, 20000, black_box(&payload), i as u32);
    }
    enc.close_block(0);
    send(enc, dec, &mut t);
    t
}

const SHARD: usize = 1408;

/// The block: originals, then recovery shards.
fn block(k: usize, m: usize) -> Shards {
    let orig: Vec<Vec<u8>> = (0..k)
        .map(|i| (0..SHARD).map(|j| (i * 31 + j * 7) as u8).collect())
        .collect();
    let mut enc = ReedSolomonEncoder::new(k, m, SHARD).unwrap();
    for o in &orig {
        enc.add_original_shard(o).unwrap();
    }
    let rec = enc
        .encode()
        .unwrap()
        .recovery_iter()
        .map(<[u8]>::to_vec)
        .collect();
    (orig, rec)
}

type Shards = (Vec<Vec<u8>>, Vec<Vec<u8>>);

/// One decode of block `b` with its first `lost` originals missing (as many recovery shards
/// given): a checksum of what was restored.
#[inline(always)]
fn decode<E: Engine>(
    dec: &mut DefaultRateDecoder<E>,
    k: usize,
    m: usize,
    lost: usize,
    b: &Shards,
) -> u64 {
    dec.reset(k, m, SHARD).unwrap();
    for (i, o) in b.0.iter().enumerate().skip(lost) {
        dec.add_original_shard(i, o).unwrap();
    }
    for (j, r) in b.1.iter().enumerate().take(lost) {
        dec.add_recovery_shard(j, r).unwrap();
    }
    let res = dec.decode().unwrap();
    res.restored_original_iter()
        .map(|(i, s)| u64::from(s[i % SHARD]))
        .sum()
}

/// The crate's decoder (`ReedSolomonDecoder` is this rate with this engine).
#[inline(never)]
fn decode_crate(
    dec: &mut DefaultRateDecoder<DefaultEngine>,
    k: usize,
    m: usize,
    lost: usize,
    b: &Shards,
) -> u64 {
    decode(dec, k, m, lost, b)
}

/// The link's: the same with the erasure locator evaluated directly.
#[inline(never)]
fn decode_link(
    dec: &mut DefaultRateDecoder<LocatorEngine>,
    k: usize,
    m: usize,
    lost: usize,
    b: &Shards,
) -> u64 {
    decode(dec, k, m, lost, b)
}

/// The link's direct rebuild ([`Direct`], the path a block that lost at most 32 data frames
/// takes): the first `lost` originals from the first `lost` recovery shards.
#[inline(never)]
fn decode_direct(d: &mut Direct, k: usize, m: usize, lost: usize, region: &mut [u8]) -> u64 {
    for i in 0..lost {
        region[i * SHARD..(i + 1) * SHARD].fill(0);
    }
    let missing = (1u128 << lost) - 1;
    assert!(d.rebuild(k, m, SHARD, missing, missing, region, SHARD));
    (0..lost)
        .map(|i| u64::from(region[i * SHARD + i % SHARD]))
        .sum()
}

fn decode_both(a: &[String]) {
    let (k, m, lost, rounds): (usize, usize, usize, u32) = (
        a[2].parse().unwrap(),
        a[3].parse().unwrap(),
        a[4].parse().unwrap(),
        a[5].parse().unwrap(),
    );
    let b = block(k, m);
    let expect: u64 = (0..lost).map(|i| u64::from(b.0[i][i % SHARD])).sum();
    let mut theirs = DefaultRateDecoder::new(k, m, SHARD, DefaultEngine::new(), None).unwrap();
    let mut ours = DefaultRateDecoder::new(k, m, SHARD, LocatorEngine::new(), None).unwrap();
    for _ in 0..rounds {
        assert_eq!(decode_crate(&mut theirs, k, m, lost, &b), expect);
        assert_eq!(decode_link(&mut ours, k, m, lost, &b), expect);
    }
    let mut region: Vec<u8> = b.0.iter().chain(b.1.iter()).flatten().copied().collect();
    let mut direct = Direct::new(k, m, SHARD);
    for _ in 0..rounds {
        assert_eq!(decode_direct(&mut direct, k, m, lost, &mut region), expect);
    }
    println!("decode {k}+{m} lost {lost} rounds {rounds}: all three restored the lost shards");
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a[1] == "decode" {
        return decode_both(&a);
    }
    let fec = parse(&a[1]);
    let loss = match a[2].strip_prefix('b') {
        Some(n) => Loss::Burst(n.parse().unwrap()),
        None => Loss::Random(a[2].parse().unwrap()),
    };
    let count: u64 = a[3].parse().unwrap();
    let streams: u16 = a.get(4).map_or(100, |s| s.parse().unwrap());
    let mut enc = Encoder::new(0, 1, fec, 32);
    let mut dec = Decoder::new(fec);
    // The decoder's lane (its buffers) is made at its first frame: before `run`.
    enc.push(29999, 20000, &[0u8; LEN], 0);
    enc.close_block(0);
    for f in enc.ready() {
        let p = LinkPacket::new_checked(f).unwrap();
        let _ = dec.receive(&p, 0, |_, _, _, _| {});
    }
    enc.mark_sent();
    let t = run(&mut enc, &mut dec, loss, count, streams);
    println!(
        "{} {} {count} frames {} lost {} delivered {} repaired {}",
        a[1], a[2], t.frames, t.lost, t.delivered, t.repaired
    );
}
