//! Runs one golden stream through the media validator once, for an instruction count per
//! packet under callgrind (`scripts/bench-media.sh`): `media_cost NAME CODEC PT CLOCK`.

use std::hint::black_box;

use vgate::media::{Codec, Policy, Stream, StreamSpec};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let codec = match a[2].as_str() {
        "ps" => Codec::Ps,
        "h264" => Codec::H264,
        "h265" => Codec::H265,
        "mp2t" => Codec::Mp2t,
        "jpeg" => Codec::Jpeg,
        "pcmu" => Codec::Pcmu,
        "pcma" => Codec::Pcma,
        "aac" => Codec::Aac,
        c => panic!("unknown codec {c}"),
    };
    let data = std::fs::read(format!("tests/golden/media/{}.rtp", a[1])).unwrap();
    let mut pkts = Vec::new();
    let mut rest = &data[..];
    while rest.len() >= 2 {
        let n = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
        pkts.push(&rest[2..2 + n]);
        rest = &rest[2 + n..];
    }
    let spec = StreamSpec::new(None).with(a[3].parse().unwrap(), codec, a[4].parse().unwrap());
    let policy = Policy::default();
    let mut s = Stream::new(spec);
    let mut pass = 0;
    for (i, p) in pkts.iter().enumerate() {
        pass += usize::from(black_box(s.check(&policy, p, i as u64)).is_pass());
    }
    let bytes: usize = pkts.iter().map(|p| p.len()).sum();
    println!("{} {} {pass} {bytes}", a[1], pkts.len());
}
