//! The cost per link frame of authenticating it, for the candidate MACs, over one
//! 1366-byte frame (a 1316-byte media payload with the link headers and the auth trailer's
//! epoch): keyed BLAKE3, GMAC (AES-256-GCM with no plaintext: the one vgate uses,
//! `crate::link::auth`), Poly1305 (ChaCha20-Poly1305 with no plaintext), HMAC-SHA256; then
//! vgate's seal and open of a frame and the replay window's check per frame. `cargo bench --bench link_auth`.

use std::hint::black_box;

use aes_gcm::aead::{AeadInOut, KeyInit};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use hmac::{Hmac, Mac};
use vgate::link::auth::{LinkAuth, LinkKey, TRAILER_LEN};
use vgate::link::replay::ReplayWindow;

const FRAME: usize = 1316 + 34 + 8;

fn macs(c: &mut Criterion) {
    let frame = vec![0x5au8; FRAME];
    let key = [7u8; 32];
    let mut g = c.benchmark_group("link_mac_1316");
    g.throughput(Throughput::Elements(1));
    g.bench_function("blake3_keyed", |b| {
        b.iter(|| blake3::keyed_hash(&key, black_box(&frame)))
    });
    let gcm = aes_gcm::Aes256Gcm::new(&key.into());
    g.bench_function("aes256_gmac", |b| {
        let nonce = [1u8; 12].into();
        b.iter(|| {
            gcm.encrypt_inout_detached(&nonce, black_box(&frame), (&mut [][..]).into())
                .unwrap()
        })
    });
    let cc = chacha20poly1305::ChaCha20Poly1305::new(&key.into());
    g.bench_function("chacha20_poly1305", |b| {
        let nonce = [1u8; 12].into();
        b.iter(|| {
            cc.encrypt_inout_detached(&nonce, black_box(&frame), (&mut [][..]).into())
                .unwrap()
        })
    });
    g.bench_function("hmac_sha256", |b| {
        b.iter(|| {
            let mut m = <Hmac<sha2::Sha256> as KeyInit>::new_from_slice(&key).unwrap();
            m.update(black_box(&frame));
            m.finalize()
        })
    });
    g.finish();
}

fn seal_open(c: &mut Criterion) {
    let auth = LinkAuth::new(Some(&LinkKey::raw([9u8; 32])));
    let mut frame = vec![0x5au8; 1316 + 34 + TRAILER_LEN];
    let mut win = ReplayWindow::default();
    let mut seq = 0u32;
    let mut g = c.benchmark_group("link_auth_1316");
    g.throughput(Throughput::Elements(1));
    g.bench_function("seal", |b| {
        b.iter(|| auth.seal(black_box(&mut frame), 1_800_000_000_000_000))
    });
    g.bench_function("open", |b| b.iter(|| auth.open(black_box(&frame)).unwrap()));
    g.bench_function("replay_window", |b| {
        b.iter(|| {
            seq = seq.wrapping_add(1);
            win.check(1, black_box(seq))
        })
    });
    g.bench_function("open_and_window", |b| {
        b.iter(|| {
            seq = seq.wrapping_add(1);
            let e = auth.open(black_box(&frame)).unwrap();
            win.check(e.1, black_box(seq))
        })
    });
    g.finish();
}

criterion_group!(benches, macs, seal_open);
criterion_main!(benches);
