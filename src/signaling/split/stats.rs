//! The signaling agent's counters: lock-free, declared once with their help text so the
//! metrics, `/api/v1/stats` and `vgate stats` cannot drift apart.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

macro_rules! counters {
    ($( $name:ident : $help:literal ),* $(,)?) => {
        /// Counters of one agent.
        #[derive(Debug, Default)]
        pub struct SignalStats {
            /// 1 while the peer is authenticated and heard within `dead_after`.
            pub peer_up: AtomicU64,
            /// Milliseconds since the Unix epoch of the last frame from the peer (0: never).
            pub peer_last_ms: AtomicU64,
            $( #[doc = $help] pub $name: AtomicU64, )*
        }

        impl SignalStats {
            /// Every counter with its name and help, in declaration order.
            pub fn list(&self) -> Vec<(&'static str, &'static str, u64)> {
                vec![ $( (stringify!($name), $help, self.$name.load(Relaxed)), )* ]
            }

            /// The `signal peer_up=… key=value …` line of the shutdown totals.
            pub fn report(&self) -> String {
                let mut s = format!("signal peer_up={}", self.peer_up.load(Relaxed));
                for (k, _, v) in self.list() {
                    s.push_str(&format!(" {k}={v}"));
                }
                s
            }
        }
    };
}

counters! {
    connects: "connections to the peer authenticated",
    resets: "connections to the peer reset after an error",
    peer_lost: "times the peer was declared down (silent for dead_after, or said goodbye)",
    peer_restarts: "times the peer came back as a new process (new instance)",
    peer_resumed: "times the peer came back on a new connection as the same instance (a reconnection, or its hot-standby pair's takeover presenting the pair's id): nothing ended",
    identity_inherited: "times this node, taking over as its pair's active, presented the pair's instance id read from the state store",
    sessions_ended: "signaled sessions ended in the own domain because the peer was lost or restarted",
    frames_in: "authenticated frames received",
    frames_out: "frames sent",
    bytes_in: "bytes received on the signaling link",
    bytes_out: "bytes sent on the signaling link",
    heartbeats_in: "heartbeats received",
    heartbeats_out: "heartbeats sent",
    auth_failures: "frames whose tag failed (forged, altered, wrong key, or recorded on another connection); connection reset",
    replays: "authenticated frames out of sequence (replayed or reordered); connection reset",
    malformed: "frames with a bad length, type or payload; connection reset",
    truncated: "connections that ended in the middle of a frame or hello",
    refused: "connections refused: from another address, not a vgate hello, wrong version or role, handshake too slow",
    udp_out: "datagrams from the own proxies carried to the peer",
    udp_in: "datagrams from the peer delivered to the own proxies",
    udp_dropped_peer_down: "datagrams from the own proxies dropped because the peer is down",
    udp_dropped_source: "datagrams on a face socket from outside this host's loopback, dropped",
    udp_send_errors: "datagrams from the peer the own proxies' socket did not take",
    mirror_full: "datagrams from the peer dropped because no more mirror sockets may be opened",
    bind_errors: "face sockets that could not be opened (port in use on the peer's face address, or not tied to the link face's interface)",
    tcp_opened: "TCP streams carried (either direction)",
    tcp_closed: "TCP streams ended",
    tcp_refused: "TCP streams refused: peer down, source outside this host's loopback, too many",
    tcp_overflow: "TCP streams closed because their receiver did not keep up",
    unknown_stream: "frames for a TCP stream that is not open (already closed on this side), ignored",
}
