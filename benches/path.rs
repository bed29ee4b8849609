//! The per-packet path without I/O: stream-table lookup, source check, RTP accounting, counter
//! tallies and selection of the packets to send, for a batch of 32 RTP packets, with 1 and
//! with 10 000 routes in the table; and the frame zc transmits (headers and checksums around a
//! 1316-byte payload); and the same path over real encoder streams with media validation off
//! and on (`per_packet_path_media`). `cargo bench --bench path`.

use std::hint::black_box;
use std::net::SocketAddrV4;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use vgate::channel::{inspect, Validators, WORKER_SLOTS};
use vgate::config::{Config, DomainId, SourcePolicy};
use vgate::routes::{Channel, NoHooks, RouteSpec, Routes, SessionKind};
use vgate::stats::Tally;

fn table(n: usize) -> (Routes, u16) {
    let mut cfg = Config::embedded_default();
    cfg.domains[0].media_ports.last = 20000 + 2 * n as u16 + 1;
    cfg.domains[1].media_ports.first = 40000;
    cfg.domains[1].media_ports.last = 40000 + 2 * n as u16 + 1;
    let routes = Routes::new(&cfg, Arc::new(NoHooks));
    let s = routes.open_session(SessionKind::Admin, "bench");
    let mut last = 0;
    for _ in 0..n {
        let a = routes.alloc_pair(s, DomainId::A).unwrap();
        let b = routes.alloc_pair(s, DomainId::B).unwrap();
        routes
            .add_route(
                s,
                RouteSpec {
                    ingress: DomainId::A,
                    port: a,
                    dest: "127.0.0.2:50000".parse().unwrap(),
                    egress_port: b,
                    policy: SourcePolicy::Strict,
                    expected: Some("127.0.0.1:6000".parse().unwrap()),
                    rtp_only: true,
                    label: "b".into(),
                    media: None,
                },
            )
            .unwrap();
        last = a;
    }
    (routes, last)
}

fn batch(c: &mut Criterion) {
    let src: SocketAddrV4 = "127.0.0.1:6000".parse().unwrap();
    let mut pkts = vec![[0u8; 1328]; 32];
    for (i, p) in pkts.iter_mut().enumerate() {
        vgate::wire::rtp::write_header(p, 33, i as u16, 0, 1).unwrap();
    }
    let mut g = c.benchmark_group("per_packet_path");
    g.throughput(Throughput::Elements(32));
    for n in [1usize, 10_000] {
        let (routes, port) = table(n);
        let mut sel: Vec<u16> = Vec::with_capacity(32);
        let mut seq = 0u16;
        let mut media = Validators::new(WORKER_SLOTS, Default::default());
        g.bench_function(format!("batch32_lookup_per_packet_routes{n}"), |b| {
            b.iter(|| {
                let mut tally = Tally::default();
                sel.clear();
                for (i, p) in pkts.iter_mut().enumerate() {
                    seq = seq.wrapping_add(1);
                    p[2..4].copy_from_slice(&seq.to_be_bytes());
                    let Some(route) = routes
                        .table(Channel::Forward)
                        .get(&black_box(port))
                        .map(|r| Arc::clone(&r))
                    else {
                        tally.drop(vgate::stats::DropReason::NoRoute);
                        continue;
                    };
                    tally.rx_packets += 1;
                    tally.rx_bytes += p.len() as u64;
                    match inspect(&route, src, p, false, 1472, 1, &mut media) {
                        Ok(_) => sel.push(i as u16),
                        Err(r) => tally.drop(r),
                    }
                    route.stats.packets.add(&tally);
                }
                black_box(&sel);
            })
        });
        g.bench_function(format!("batch32_lookup_per_batch_routes{n}"), |b| {
            b.iter(|| {
                let mut tally = Tally::default();
                sel.clear();
                let route = routes.lookup(Channel::Forward, black_box(port)).unwrap();
                for (i, p) in pkts.iter_mut().enumerate() {
                    seq = seq.wrapping_add(1);
                    p[2..4].copy_from_slice(&seq.to_be_bytes());
                    tally.rx_packets += 1;
                    tally.rx_bytes += p.len() as u64;
                    match inspect(&route, src, p, false, 1472, 1, &mut media) {
                        Ok(_) => sel.push(i as u16),
                        Err(r) => tally.drop(r),
                    }
                }
                route.stats.packets.add(&tally);
                black_box(&sel);
            })
        });
    }
    g.finish();
}

/// zc's transmit: Ethernet/IPv4/UDP headers and both checksums around a 1316-byte payload
/// (the UDP checksum covers the whole payload).
fn frame(c: &mut Criterion) {
    use vgate::wire::{write_udp4_frame, UDP4_FRAME_HEADERS};
    let mut g = c.benchmark_group("transmit_frame");
    g.throughput(Throughput::Elements(1));
    let mut buf = vec![0u8; UDP4_FRAME_HEADERS + 1316];
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i as u32).wrapping_mul(2_654_435_761).to_be_bytes()[0];
    }
    let src: SocketAddrV4 = "10.201.2.1:30000".parse().unwrap();
    let dst: SocketAddrV4 = "10.201.2.2:40000".parse().unwrap();
    g.bench_function("write_udp4_frame_1316", |b| {
        b.iter(|| write_udp4_frame(black_box(&mut buf), [1; 6], [2; 6], src, dst, 7))
    });
    g.finish();
}

/// The golden stream `name` (`tests/golden/media/`, RFC 4571 records).
fn golden(name: &str) -> Vec<Vec<u8>> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("tests/golden/media/{name}.rtp"));
    let data = std::fs::read(path).unwrap();
    let mut pkts = Vec::new();
    let mut rest = &data[..];
    while rest.len() >= 2 {
        let n = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
        pkts.push(rest[2..2 + n].to_vec());
        rest = &rest[2 + n..];
    }
    pkts
}

/// The per-packet path over a real encoder's stream, media validation off and on (the
/// same route, lookup per batch of 32 as the engines do): what validation adds per packet.
/// Each iteration is one pass over the stream, its sequence numbers and timestamps moved on
/// so the validator sees one continuous stream.
fn validation(c: &mut Criterion) {
    use vgate::media::{Codec, Policy, Rule, StreamSpec};
    let src: SocketAddrV4 = "127.0.0.1:6000".parse().unwrap();
    let mut g = c.benchmark_group("per_packet_path_media");
    for (name, codec) in [
        ("ffmpeg_ps_h264", Codec::Ps),
        ("ffmpeg_h264_high", Codec::H264),
    ] {
        let mut pkts = golden(name);
        let span = {
            let ts = |p: &[u8]| u32::from_be_bytes([p[4], p[5], p[6], p[7]]);
            ts(pkts.last().unwrap()).wrapping_sub(ts(&pkts[0])) + 3600
        };
        g.throughput(Throughput::Elements(pkts.len() as u64));
        for validate in [false, true] {
            let mut cfg = Config::embedded_default();
            cfg.domains[1].media_ports.first = 40000;
            cfg.domains[1].media_ports.last = 40099;
            let routes = Routes::new(&cfg, Arc::new(NoHooks));
            let s = routes.open_session(SessionKind::Admin, "bench");
            let a = routes.alloc_pair(s, DomainId::A).unwrap();
            let b = routes.alloc_pair(s, DomainId::B).unwrap();
            let media = validate.then(|| Rule {
                enforce: true,
                spec: StreamSpec::new(None).with(96, codec, 90000),
                policy: Policy::default(),
            });
            routes
                .add_route(
                    s,
                    RouteSpec {
                        ingress: DomainId::A,
                        port: a,
                        dest: "127.0.0.2:50000".parse().unwrap(),
                        egress_port: b,
                        policy: SourcePolicy::Strict,
                        expected: Some("127.0.0.1:6000".parse().unwrap()),
                        rtp_only: true,
                        label: "b".into(),
                        media,
                    },
                )
                .unwrap();
            let mut v = Validators::new(WORKER_SLOTS, Default::default());
            let mut sel: Vec<u16> = Vec::with_capacity(32);
            let label = if validate { "enforce" } else { "off" };
            g.bench_function(format!("{name}_media_{label}"), |bench| {
                bench.iter(|| {
                    for chunk in pkts.chunks_mut(32) {
                        let route = routes.lookup(Channel::Forward, black_box(a)).unwrap();
                        let mut tally = Tally::default();
                        sel.clear();
                        for (i, p) in chunk.iter_mut().enumerate() {
                            tally.rx_packets += 1;
                            match inspect(&route, src, p, false, 1472, 1, &mut v) {
                                Ok(_) => sel.push(i as u16),
                                Err(r) => tally.drop(r),
                            }
                        }
                        assert_eq!(sel.len(), chunk.len(), "a real stream passes whole");
                        route.stats.packets.add(&tally);
                    }
                    shift(&mut pkts, span);
                })
            });
        }
    }
    g.finish();
}

/// Moves every packet's sequence number on by the stream's length and its timestamp by
/// `span`: the next pass continues the stream.
fn shift(pkts: &mut [Vec<u8>], span: u32) {
    let n = pkts.len() as u16;
    for p in pkts {
        let seq = u16::from_be_bytes([p[2], p[3]]).wrapping_add(n);
        p[2..4].copy_from_slice(&seq.to_be_bytes());
        let ts = u32::from_be_bytes([p[4], p[5], p[6], p[7]]).wrapping_add(span);
        p[4..8].copy_from_slice(&ts.to_be_bytes());
    }
}

criterion_group!(benches, batch, frame, validation);
criterion_main!(benches);
