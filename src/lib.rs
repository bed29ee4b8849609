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
//!   `engine::sys`, and in [`edge::sink`] (its buffers handed between threads by queues).
//! - [`routes`] holds the tables the worker consults: one **stream route table per one-way
//!   channel** (forward A→B, reverse B→A), keyed by the gateway port the packet arrived on,
//!   plus the static signaling table, the per-domain port allocators and the sessions that own
//!   ports and routes. It does no I/O.
//! - [`channel`] is what happens between lookup and send, the same for every engine: size and
//!   source checks, RTP sequence accounting, per-channel and per-worker counters. The engine
//!   then sends the packet from the far-side gateway address and the route's egress port.
//! - [`edge`] is media the gateway terminates itself at a domain's edge: stream legs (GB/T
//!   28181 RTP over TCP, RTSP interleaved) that turn a TCP byte stream into datagrams on the
//!   same routes and channels and back. An engine hands a packet whose receiver is a leg to
//!   the leg's bounded sink instead of its egress socket; a leg puts what its peer sends into
//!   the route of its gateway port as if it had arrived there.
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
//! - [`demo`] drives the gateway with its own RTP traffic on loopback (`vgate demo`).
//! - [`stats`] declares the counters (drop reasons, RTP loss/reorder/duplicate) once;
//!   [`wire`] has the zero-copy packet views; [`logging`] the stderr logger and rate limits;
//!   [`clock`] the monotonic clock every timer reads.
//! - [`media`] is the per-stream media validator: sans-IO, a leaf (it imports nothing of
//!   vgate). Fed the RTP packets of a stream, it follows their payload format (GB/T 28181
//!   MPEG-PS, H.264, H.265, MPEG-TS, JPEG, G.711, AAC) across packets by its length fields
//!   and answers pass or drop with a reason, so that only well-formed audio/video of what
//!   was negotiated crosses.
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
pub mod logging;
pub mod media;
pub mod routes;
pub mod signaling;
pub mod split;
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
