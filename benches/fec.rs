//! The link FEC's CPU per media datagram: encoder (frames written, repair frames computed)
//! plus decoder (frames taken, blocks rebuilt), for FEC off (the framing alone), today's
//! `8+2` (Reed-Solomon over GF(2^8), `reed-solomon-erasure`) and the block code
//! (`fec = "block"`, Leopard Reed-Solomon over GF(2^16), `reed-solomon-simd`), at 0, 1 and
//! 5 % random frame loss (a fixed pattern). 1322-byte link datagrams (a 1316-byte media
//! payload and the stream header). One iteration is one datagram. `cargo bench --bench fec`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use vgate::link::fec::{Decoder, Encoder};
use vgate::link::Fec;
use vgate::wire::link::LinkPacket;

const LEN: usize = 1322;

/// Runs `iters` datagrams through a fresh encoder and decoder, losing frames where the
/// pattern says; the time of the whole (encode, loss, decode).
fn run(fec: Option<Fec>, permille: u64, iters: u64) -> Duration {
    let mut enc = Encoder::new(0, 1, fec, 32);
    let mut dec = Decoder::new(fec);
    let payload = vec![0x5au8; LEN];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut lose = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % 1000 < permille
    };
    let mut delivered = 0u64;
    let mut send = |enc: &mut Encoder, dec: &mut Decoder| {
        for f in enc.ready() {
            if lose() {
                continue;
            }
            let p = LinkPacket::new_checked(f).unwrap();
            let _ = dec.receive(&p, 0, |_, _, pl, _| delivered += pl.len() as u64);
        }
        enc.mark_sent();
    };
    // The decoder's lane (its buffers) is made at its first frame: before the clock starts.
    enc.push(30000, 20000, &payload, 0);
    enc.close_block(0);
    send(&mut enc, &mut dec);
    let t = Instant::now();
    for i in 0..iters {
        if enc.must_flush() {
            send(&mut enc, &mut dec);
        }
        enc.push(30000, 20000, black_box(&payload), i as u32);
    }
    enc.close_block(0);
    send(&mut enc, &mut dec);
    black_box(delivered);
    t.elapsed()
}

fn fec(c: &mut Criterion) {
    let settings = [
        ("off", None),
        ("8+2", Fec::parse("8+2").unwrap()),
        ("block_116+12", Fec::parse("block").unwrap()),
        ("block_111+17", Some(Fec::block(111, 15, 2).unwrap())),
    ];
    for permille in [0u64, 10, 50] {
        let mut g = c.benchmark_group(format!("fec_loss_{permille}permille"));
        g.throughput(Throughput::Elements(1));
        g.sample_size(20);
        g.measurement_time(Duration::from_secs(3));
        for (name, f) in settings {
            if f.is_none() && permille > 0 {
                continue;
            }
            g.bench_function(name, |b| b.iter_custom(|iters| run(f, permille, iters)));
        }
        g.finish();
    }
}

criterion_group!(benches, fec);
criterion_main!(benches);
