//! # vgate — an inter-network video gateway
//!
//! vgate joins two network domains that must never be joined at the IP level — domain **A**,
//! the video surveillance private network (cameras, NVRs, GB/T 28181 platforms, RTSP servers),
//! and domain **B**, the user network — and lets video cross between them under control.
//!
//! ```text
//!             domain A                      vgate                         domain B
//!   camera/platform ──RTP──►  [A-side ports] ─ forward channel ─► [B-side ports] ──RTP──► viewer
//!   SIP/RTSP server ◄──────── signaling proxy (SIP UDP/TCP, RTSP TCP) ────────────► SIP/RTSP client
//!   talkback sink   ◄──RTP──  [A-side ports] ◄ reverse channel ─ [B-side ports] ◄──RTP── client
//! ```
//!
//! ## How a packet crosses: engine → routes → channel
//!
//! - [`engine`] captures packets. The capture mode is chosen once at start: `stack` (kernel
//!   UDP sockets with `recvmmsg`/`sendmmsg`), `tnapi` (one ring per NIC RSS queue), `zc`
//!   (zero copy) or `xdp` (`zc` plus an in-kernel fast path for settled streams: the XDP
//!   program rewrites and redirects them itself, [`engine::xdp`]). Each engine runs one worker
//!   thread per queue, pinned to its own CPU; `vgate run` keeps every other thread (main
//!   loop, admin interface, signaling) off those CPUs when any CPU is left over
//!   ([`engine::keep_off_worker_cpus`]). All the `unsafe` of the data path lives in
//!   `engine::sys`, and in [`sink`] (its buffers handed between threads by queues).
//! - [`routes`] holds the tables the worker consults: one **stream route table per one-way
//!   channel** (forward A→B, reverse B→A), keyed by the gateway port the packet arrived on,
//!   plus the static signaling table, the per-domain port allocators and the sessions that own
//!   ports and routes. It does no I/O: what it needs from an engine is a trait
//!   ([`routes::PortHooks`]), and what signaling needs of the legs too ([`routes::legs::Legs`]).
//! - [`channel`] is what happens between lookup and send, the same for every engine: size and
//!   source checks, RTP sequence accounting, per-channel and per-worker counters. The engine
//!   then sends the packet from the far-side gateway address and the route's egress port.
//! - [`edge`] is media the gateway terminates itself at a domain's edge: stream legs (GB/T
//!   28181 RTP over TCP, RTSP interleaved) that turn a TCP byte stream into datagrams on the
//!   same routes and channels and back. An engine hands a packet whose receiver is a leg to
//!   the leg's bounded sink ([`sink`]) instead of its egress socket; a leg puts what its peer
//!   sends into the route of its gateway port as if it had arrived there. `edge` implements
//!   [`routes::legs::Legs`]; the gateway hands that to the proxies.
//! - In a split half (`[split]`, [`config::split`]) one domain is the link face: the engines
//!   send and receive the one-way link themselves (`engine::link`), framed as
//!   [`wire::link`] with the sans-I/O protocol of [`link`] (FEC, reorder, fragments); the
//!   signaling link is [`signaling::split`], wired to the proxies by [`gateway`].
//!
//! ## Beside the data path
//!
//! - [`config`] reads the TOML file (unknown keys rejected) into a checked [`config::Config`];
//!   `vgate check-config` reports the file, line and key of the first problem.
//! - [`signaling`] holds the SIP (GB/T 28181) and RTSP proxies: pure parsing and rewriting
//!   of SIP, SDP, RTSP and `Transport` (no I/O), and the proxies that own the signaling sockets
//!   and install stream routes for each session they negotiate.
//! - [`control`] shows and steers what the gateway is doing: the admin interface (Prometheus
//!   metrics, routes, sessions, reload), the live statistics, totals and systemd
//!   readiness/watchdog.
//! - [`gateway`] starts and stops the whole: engine, tables, workers, static routes.
//! - [`ha`] makes the gateway one node of a hot-standby pair (`[ha]`): keepalived moves the
//!   domain addresses and tells vgate its role; a standby holds ports and routes but drops
//!   with `standby`; the active's run-time sessions go to Redis and the standby keeps copies.
//! - [`demo`] drives the gateway with its own RTP traffic on loopback (`vgate demo`).
//! - [`stats`] declares the counters (drop reasons, RTP loss/reorder/duplicate, legs, links)
//!   once; [`wire`] has the zero-copy packet views; [`logging`] the stderr logger and rate
//!   limits; [`clock`] the monotonic clock every timer reads; [`iface`] ties sockets to
//!   interfaces.
//! - [`media`] is the per-stream media validator: sans-IO, a leaf (it imports nothing of
//!   vgate). Fed the RTP packets of a stream, it follows their payload format (GB/T 28181
//!   MPEG-PS, H.264, H.265, MPEG-TS, JPEG, G.711, AAC) across packets by its length fields
//!   and answers pass or drop with a reason, so that only well-formed audio/video of what
//!   was negotiated crosses; RTCP routes and RTCP muxed on an RTP port (RFC 5761) are held
//!   to well-formed RTCP compound packets.
//!
//! ## The layers
//!
//! Imports between these modules go one way only. The table below is
//! `tests/layering/allowed.txt`, which `tests/layering.rs` checks against every `crate::`
//! path in `src/` (test code aside): an import not listed, a cycle, a module without a row,
//! or this table differing from that file fails the build's tests. Leaves first.
//!
//! | module | owns | may import |
//! |---|---|---|
//! | `wire` | zero-copy packet views (Ethernet, IPv4, UDP, RTP), checksums, the split link header (`wire::link`), RFC 4571 / `$` framing (`wire::framing`), MAC parsing, the pcap file format (`wire::pcap`) | — |
//! | `clock` | the monotonic clock every timer reads; wall-clock stamps for display and the link header | — |
//! | `iface` | tying a socket to its interface (`SO_BINDTODEVICE`), once | — |
//! | `logging` | the stderr logger and rate limits | — |
//! | `media` | the per-stream media validator, sans I/O (RTP, PS, H.264/H.265, TS, JPEG, G.711, AAC) | `wire` |
//! | `stats` | counters declared once: drop reasons, RTP loss/reorder, leg counters, link counters, media violations | `wire`, `media` |
//! | `sink` | the leg sink pools an engine hands a leg's packets to (the only `unsafe` outside `engine::sys`) | `stats` |
//! | `link` | the split link protocol, sans I/O: FEC, reorder window, fragmentation | `wire` |
//! | `config` | the TOML file into a checked `Config`, `[split]` settings, the checks they share | `link`, `wire`, `media` |
//! | `routes` | stream and signaling tables, port allocators, sessions, the leg listing, the refusal capture's buffers (`routes::capture`) and the `Legs`/`PortHooks` traits; no I/O | `config`, `clock`, `sink`, `stats`, `wire`, `media` |
//! | `channel` | the per-packet decision between lookup and send (`inspect`, media validation with each worker's `Validators`), worker counters | `routes`, `config`, `stats`, `wire`, `media`, `clock`, `logging` |
//! | `engine` | capture and send for each mode, the port registry, the split link's I/O (`engine::link`); `unsafe` in `engine::sys` | `channel`, `routes`, `config`, `clock`, `iface`, `link`, `logging`, `sink`, `stats`, `wire` |
//! | `edge` | TCP media legs (GB/T 28181 RTP over TCP, RTSP interleaved injection); implements `routes::legs::Legs` | `engine`, `channel`, `routes`, `config`, `clock`, `logging`, `sink`, `stats`, `wire` |
//! | `signaling` | SIP, SDP (and what it negotiates for media validation), RTSP, MANSCDP parsing and rewriting; the proxies; the split signaling agent | `routes`, `config`, `clock`, `iface`, `logging`, `sink`, `stats`, `wire`, `media` |
//! | `ha` | the hot-standby role (the standby gate of the tables) and the state store's thread: sessions (with their media rules) to and from Redis | `routes`, `config`, `clock`, `logging`, `media` |
//! | `control` | admin interface, metrics, live stats, totals, systemd readiness, the refusal capture's pcap files | `signaling`, `routes`, `config`, `engine`, `channel`, `clock`, `logging`, `stats`, `media`, `ha`, `wire` |
//! | `gateway` | starting and stopping the whole; wiring the split agent to the proxies | `edge`, `engine`, `channel`, `signaling`, `routes`, `config`, `ha` |
//! | `demo` | `vgate demo`: the gateway driven by its own RTP on loopback | `gateway`, `control`, `engine`, `routes`, `config`, `stats`, `wire` |
//! | `cli` | the `vgate` commands | `gateway`, `demo`, `control`, `engine`, `config`, `link`, `clock`, `logging`, `ha` |
//! | `fuzzing` | fuzz entry points (hidden) | `signaling`, `channel`, `routes`, `config`, `link`, `wire`, `media` |
#![deny(unsafe_code)]

pub mod channel;
pub mod cli;
pub mod clock;
pub mod config;
pub mod control;
pub mod demo;
pub mod edge;
pub mod engine;
#[doc(hidden)]
pub mod fuzzing;
pub mod gateway;
pub mod ha;
pub mod iface;
pub mod link;
pub mod logging;
pub mod media;
pub mod routes;
pub mod signaling;
// The sink's buffers pass between threads through its queues (`UnsafeCell`, fenced there).
#[allow(unsafe_code)]
pub mod sink;
pub mod stats;
pub mod wire;

/// A unit test whose prerequisite (root, a capability, a kernel feature) is missing here:
/// says plainly that it did not run, and fails under `CI=true`, where CI must provide it.
#[cfg(test)]
pub(crate) fn test_did_not_run(test: &str, why: impl std::fmt::Display) {
    let msg = format!("{test}: {why}: this test DID NOT RUN");
    assert_ne!(
        std::env::var("CI").as_deref(),
        Ok("true"),
        "{msg}; CI must provide it"
    );
    eprintln!("{msg}");
}
