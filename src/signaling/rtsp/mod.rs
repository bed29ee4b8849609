//! RTSP signaling logic for vgate's transparent RTSP proxy — bytes in,
//! decisions and bytes out; no sockets, no threads, no clocks.
//!
//! The proxy keeps the RTSP session end to end: it forwards each request
//! and response, rewriting only what would let one domain see the other or
//! would send media around the gateway. Media then flows through gateway
//! ports on the one-way channels, or stays interleaved on the TCP connection.
//!
//! | file | owns |
//! |---|---|
//! | [`message`] | stream framing (messages and `$` frames) under [`Limits`], zero-copy [`Message`] views, the byte-preserving [`Editor`], vgate's own error responses |
//! | [`transport`] | the `Transport:` header: parse alternatives, policy (unicast only, no third-party `destination`), port/source rewrites |
//! | [`url`] | RTSP URLs and the path-prefix [`UrlMap`]: Request-URI to the upstream; Content-Base, Content-Location, RTP-Info and SDP `a=control:` back to the client |
//! | [`auth`] | Basic/Digest: answering an upstream's challenge, challenging clients and verifying their answers |
//! | [`error`] | [`RtspError`], the component's single error type |
//!
//! What a proxy does with one exchange, in these terms:
//!
//! 1. `next_frame` on the receive buffer; `Interleaved` frames pass through,
//!    `Skip` bytes (stray empty lines) are dropped, a `Message(len)` is
//!    parsed with `Message::parse`.
//! 2. Requests: `UrlMap::to_upstream` picks the route and rewrites the
//!    Request-URI; on SETUP, `parse_transport` + `select_transport` police
//!    the client's Transport, the caller allocates ports, and
//!    `with_client_port` points the upstream at the gateway.
//! 3. Responses: `UrlMap::to_client` for Content-Base/Content-Location,
//!    `rtp_info_to_client`, `sdp_to_client` (the SDP rewriter does `c=`/`o=`/
//!    `m=`); on SETUP replies, `with_client_port` (back to the client's own
//!    ports), `with_server_port` (the gateway's ports), `with_source`,
//!    `without_destination`.
//! 4. `Editor` writes the message back with every untouched header intact.
//!
//! `golden_tests.rs` composes these calls exactly this way and is the
//! worked example.
//!
//! Nothing here panics on any input; every parser is bounded.

pub mod auth;
pub mod error;
pub mod message;
pub mod transport;
pub mod url;

pub use error::RtspError;
pub use message::{build_response, next_frame, Editor, Frame, Limits, Message, Status};
pub use transport::{format_transport, parse_transport, select_transport, TransportSpec};
pub use url::{Authority, Route, RtspUrl, UrlMap};

#[cfg(test)]
mod golden_tests;
#[cfg(test)]
mod mutation_tests;
