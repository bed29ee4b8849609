//! The media validator's corpus from real encoders (`tests/golden/media/`, made by
//! `scripts/media-golden.sh`): one RFC 4571 recording per stream and a manifest line each
//! (name, codec, payload type, clock rate). Shared by the golden and the strip tests, which
//! include this file directly (`#[path]`), not through `common`.

// Each including test uses only part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use vgate::media::{Codec, Stream, StreamSpec};

pub struct Fixture {
    pub name: String,
    pub codec: Codec,
    pub pt: u8,
    pub clock: u32,
    pub packets: Vec<Vec<u8>>,
}

pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/media")
}

/// A manifest codec name: the library's names (those of a static route's `codec`).
fn codec(name: &str) -> Codec {
    match Codec::from_rtpmap(name) {
        Codec::Unknown => panic!("manifest: unknown codec {name}"),
        c => c,
    }
}

/// RFC 4571 records: a 2-byte length, then the packet.
pub fn packets(data: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        let n = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
        out.push(rest[2..2 + n].to_vec());
        rest = &rest[2 + n..];
    }
    out
}

pub fn fixtures() -> Vec<Fixture> {
    let manifest = std::fs::read_to_string(dir().join("manifest.txt")).unwrap();
    manifest
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let data = std::fs::read(dir().join(format!("{}.rtp", f[0]))).unwrap();
            Fixture {
                name: f[0].to_string(),
                codec: codec(f[1]),
                pt: f[2].parse().unwrap(),
                clock: f[3].parse().unwrap(),
                packets: packets(&data),
            }
        })
        .collect()
}

pub fn fixture(name: &str) -> Fixture {
    fixtures()
        .into_iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("no fixture {name}"))
}

/// A fresh validator stream for the fixture's format, no SSRC negotiated.
pub fn stream(f: &Fixture) -> Stream {
    Stream::new(StreamSpec::new(None).with(f.pt, f.codec, f.clock))
}
