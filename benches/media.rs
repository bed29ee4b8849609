//! Cost of the media validator per packet, over the real-encoder streams of
//! `tests/golden/media/` (GB/T 28181 PS, H.264, H.265, MP2T, JPEG, G.711, AAC): each
//! iteration checks a whole stream from a fresh state. `cargo bench --bench media`.

use std::hint::black_box;
use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use vgate::media::{Codec, Policy, Stream, StreamSpec};

fn load(name: &str, codec: Codec, pt: u8, clock: u32) -> (StreamSpec, Vec<Vec<u8>>) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/golden/media/{name}.rtp"));
    let data = std::fs::read(path).unwrap();
    let mut pkts = Vec::new();
    let mut rest = &data[..];
    while rest.len() >= 2 {
        let n = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
        pkts.push(rest[2..2 + n].to_vec());
        rest = &rest[2 + n..];
    }
    (StreamSpec::new(None).with(pt, codec, clock), pkts)
}

fn validate(c: &mut Criterion) {
    let policy = Policy::default();
    let mut g = c.benchmark_group("media_check_per_packet");
    for (name, codec, pt, clock) in [
        ("gst_ps_h264", Codec::Ps, 96, 90000),
        ("ffmpeg_ps_h264", Codec::Ps, 96, 90000),
        ("ffmpeg_h264_high", Codec::H264, 96, 90000),
        ("gst_h265", Codec::H265, 96, 90000),
        ("ffmpeg_mp2t", Codec::Mp2t, 33, 90000),
        ("gst_jpeg", Codec::Jpeg, 26, 90000),
        ("gst_pcma", Codec::Pcma, 8, 8000),
    ] {
        let (spec, pkts) = load(name, codec, pt, clock);
        g.throughput(Throughput::Elements(pkts.len() as u64));
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut s = Stream::new(spec);
                for (i, p) in pkts.iter().enumerate() {
                    black_box(s.check(&policy, black_box(p), i as u64));
                }
            })
        });
    }
    g.finish();
}

criterion_group!(benches, validate);
criterion_main!(benches);
