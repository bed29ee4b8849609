//! Signaling: SIP (GB/T 28181) and RTSP proxies that rewrite SDP/Transport so media flows
//! through gateway ports, and install and remove stream routes through [`crate::routes`].
//!
//! Not in this version yet: the parsers, rewriters and proxies land here (pure rewrite logic
//! in `sdp`, `sip/` and `rtsp/`, sockets in the proxies). Until then `vgate` accepts
//! signaling routes in its config and checks them, but does not listen on them.
