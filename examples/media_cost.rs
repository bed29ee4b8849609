//! Runs one golden stream once, for an instruction count per packet under callgrind
//! (`scripts/bench-media.sh`): `media_cost NAME CODEC PT CLOCK [MODE]`.
//!
//! - without MODE: the validator alone (`Stream::check`, counted with
//!   `--toggle-collect='*media_cost*check_one*'`: a pattern that matches one function only,
//!   since entering a second matching function inside it would toggle counting off);
//! - MODE `off`, `count`, `enforce` or `strip`: the per-packet decision every engine makes
//!   (`channel::inspect_mut`: size, source, media validation in that mode, RTP accounting)
//!   for a route with that `validate` mode, each packet first copied into a reused receive
//!   buffer as an engine's ring or socket buffer holds it (the copy is not counted: count
//!   with `--toggle-collect='*media_cost*per_packet*'`).
//!
//! Prints `NAME PACKETS PASSED BYTES` (for a MODE: packets forwarded, and bytes forwarded).

use std::hint::black_box;
use std::net::SocketAddrV4;
use std::sync::Arc;

#[path = "../tests/common/media_corpus.rs"]
mod media_corpus;

use vgate::channel::{inspect_mut, Validators, WORKER_SLOTS};
use vgate::config::{Config, DomainId, SourcePolicy};
use vgate::media::{Codec, Policy, Rule, Stream, StreamSpec};
use vgate::routes::{NoHooks, RouteSpec, Routes, SessionKind, StreamRoute};
use vgate::stats::DropReason;

const SRC: &str = "127.0.0.1:6000";

fn main() {
    let a: Vec<String> = std::env::args().collect();
    // The library's codec names (an `rtpmap` name or a static route's `codec`).
    let codec = Codec::from_rtpmap(&a[2]);
    assert!(codec != Codec::Unknown, "unknown codec {}", a[2]);
    let data = std::fs::read(media_corpus::dir().join(format!("{}.rtp", a[1]))).unwrap();
    let pkts = media_corpus::packets(&data);
    let spec = StreamSpec::new(None).with(a[3].parse().unwrap(), codec, a[4].parse().unwrap());
    let (pass, bytes) = match a.get(5) {
        None => validator(spec, &pkts),
        Some(mode) => path(spec, mode, &pkts),
    };
    println!("{} {} {pass} {bytes}", a[1], pkts.len());
}

/// The validator alone, every packet.
fn validator(spec: StreamSpec, pkts: &[Vec<u8>]) -> (usize, usize) {
    let policy = Policy::default();
    let mut s = Stream::new(spec);
    let mut pass = 0;
    for (i, p) in pkts.iter().enumerate() {
        pass += usize::from(check_one(&mut s, &policy, p, i as u64).is_pass());
    }
    (pass, pkts.iter().map(|p| p.len()).sum())
}

/// What is counted: one packet through the validator.
#[inline(never)]
fn check_one(s: &mut Stream, policy: &Policy, p: &[u8], now_ms: u64) -> vgate::media::Verdict {
    black_box(s.check(policy, black_box(p), now_ms))
}

/// The per-packet decision for a route in `mode`, every packet.
fn path(spec: StreamSpec, mode: &str, pkts: &[Vec<u8>]) -> (usize, usize) {
    let media = match mode {
        "off" => None,
        "count" | "enforce" | "strip" => Some(Rule {
            enforce: mode != "count",
            spec,
            policy: Policy {
                strip: mode == "strip",
                ..Policy::default()
            },
        }),
        m => panic!("unknown mode {m}: off, count, enforce or strip"),
    };
    let mut cfg = Config::embedded_default();
    cfg.domains[1].media_ports.first = 40000;
    cfg.domains[1].media_ports.last = 40099;
    let routes = Routes::new(&cfg, Arc::new(NoHooks));
    let s = routes.open_session(SessionKind::Admin, "cost");
    let port = routes.alloc_pair(s, DomainId::A).unwrap();
    let egress_port = routes.alloc_pair(s, DomainId::B).unwrap();
    routes
        .add_route(
            s,
            RouteSpec {
                ingress: DomainId::A,
                port,
                dest: "127.0.0.2:50000".parse().unwrap(),
                egress_port,
                policy: SourcePolicy::Strict,
                expected: Some(SRC.parse().unwrap()),
                rtp_only: true,
                label: "cost".into(),
                media,
            },
        )
        .unwrap();
    let route = routes
        .lookup(vgate::routes::Channel::Forward, port)
        .unwrap();
    let src: SocketAddrV4 = SRC.parse().unwrap();
    let mut v = Validators::new(WORKER_SLOTS, Default::default());
    let mut buf = vec![0u8; 2048];
    let (mut pass, mut bytes) = (0, 0);
    for (i, p) in pkts.iter().enumerate() {
        let rx = &mut buf[..p.len()];
        rx.copy_from_slice(p);
        if let Ok(len) = per_packet(&route, src, rx, i as u64, &mut v) {
            pass += 1;
            bytes += len;
        }
    }
    (pass, bytes)
}

/// What is counted: one packet's decision.
#[inline(never)]
fn per_packet(
    route: &StreamRoute,
    src: SocketAddrV4,
    rx: &mut [u8],
    now_ms: u64,
    v: &mut Validators,
) -> Result<usize, DropReason> {
    inspect_mut(route, src, black_box(rx), false, 1472, now_ms, v).map(|(_, len)| len)
}
