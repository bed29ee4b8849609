//! Signaling: SIP (GB/T 28181) and RTSP, the pure logic the proxies are built on.
//!
//! - [`sdp`]: SDP views and the line-preserving rewrite of `c=`, `o=` and `m=` (everything
//!   else, GB/T 28181's `y=`/`f=` included, passes byte for byte).
//! - [`sip`]: zero-copy SIP messages, TCP framing, header views (Via, name-addr, CSeq, GB
//!   IDs), the checks a proxy at a security boundary makes (RFC 4475-driven), an editor that
//!   leaves untouched headers byte-identical, and minimal responses.
//! - [`manscdp`]: GB/T 28181 MANSCDP bodies: the commands they carry (per-route policy)
//!   and the rewrite of their address fields, encoding (GB2312) kept.
//! - [`rtsp`]: RTSP/1.0 framing with interleaved `$` frames, `Transport` parsing, policy and
//!   rewrite, URL mapping between the domains, and Basic/Digest authentication.
//!
//! - [`proxy`]: the proxies, one per configured signaling route, which own the sockets and
//!   threads, call the pure logic above and install and remove stream routes through
//!   [`crate::routes`].
//!
//! Everything but `proxy` is bytes in, decisions or bytes out: no sockets, no threads, no
//! panics on any input.

pub mod manscdp;
pub mod media_spec;
pub mod proxy;
pub mod rtsp;
pub mod sdp;
pub mod sip;
pub mod split;
