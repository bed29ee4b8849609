//! The SIP proxy (GB/T 28181 across the two domains): one per `type = "sip"` signaling route.
//!
//! It owns the route's sockets and one event-loop thread (`net.rs`), and a protocol core
//! (`core.rs`) that takes bytes and the time and returns messages to send; the core calls
//! the pure SIP and SDP code of [`crate::signaling::sip`] and [`crate::signaling::sdp`] and
//! installs stream routes through [`crate::routes`] (`media.rs`). Access control and the
//! per-source rate limit are in `access.rs`. It does not touch the data path: the
//! workers forward media on the routes it installs.
//!
//! # Design: a topology-hiding stateful proxy, not a B2BUA
//!
//! GB/T 28181 platforms identify calls and subscriptions by Call-ID, tags and CSeq, sign
//! REGISTERs with digest over the request, and carry their own payloads (MANSCDP XML,
//! MANSRTSP) that name devices by ID. A B2BUA would have to invent a second Call-ID, tag
//! and CSeq space and translate every one of them in both directions (MANSRTSP `CSeq`
//! included), and it would break digest authentication unless it terminated it. A proxy
//! passes all of that unchanged, as the issue asks, and only has to hide addresses:
//!
//! - **Via**: a request crossing from face X to face Y loses its whole Via stack and gets
//!   one Via of the gateway on Y, whose branch (`z9hG4bKvg…`) keys the transaction table.
//!   The response that comes back with that branch gets the original Via fields back, byte
//!   for byte, and is sent to where the request came from (same UDP source, same TCP
//!   connection). Retransmitted requests are recognised by their own branch and source:
//!   they get the last response again (or, before any final answer on UDP, the same
//!   forwarded bytes again) and never a second transaction or a second media session.
//! - **Contact**: every Contact crossing X→Y becomes `<sip:user@gateway-on-Y;vgt=TOKEN>`
//!   (display name and header parameters such as `expires` kept). The token is a
//!   **binding**: the original URI and the peer it came from on X. A request arriving on Y
//!   whose Request-URI carries the token goes to that peer with the original URI as its
//!   Request-URI. This single mechanism routes every in-dialog request (ACK, BYE, INFO,
//!   re-INVITE, NOTIFY) whichever side sends it, and also requests to a registered
//!   contact (a platform in B sending MESSAGE or INVITE to a device in A that registered
//!   through vgate). A contact carrying one of our tokens going back to its own side (the
//!   registrar's 200 to REGISTER echoing it) is turned back into the original.
//! - **Record-Route, Route, Path, Service-Route** are removed as they cross: with Contact
//!   pointing at the gateway, each side's route set is empty and in-dialog requests come
//!   to vgate by themselves. (So a side's own outbound proxies are not kept in-dialog.)
//! - **From/To**: a host part that is an IP address of the sending domain becomes the
//!   gateway's address on the receiving side; responses get the request's original From
//!   and To back (plus the To tag the answerer added). GB/T 28181 parties use the 10-digit
//!   domain ID as host, which passes unchanged.
//! - **Request-URI** of a request from the listen side outside any dialog: a host that is
//!   an address of the listen domain (the gateway itself) becomes the upstream address;
//!   a GB domain ID stays. A Request-URI that Digest credentials cover (their `uri=` is
//!   it) is never rewritten: the gateway cannot recompute the response (MD5, SHA-256,
//!   SM3 alike). In-dialog requests without a token (some UACs send BYE to the
//!   address they first called) are routed by Call-ID to the other party's binding.
//! - **Call-ID**: many devices build it from their address (`...@192.168.1.64`). Every
//!   Call-ID crossing gets a made-up one on the other face (random, `@` the gateway's
//!   address there), mapped both ways for the life of the transaction, dialog,
//!   registration or call, so every message of a call (CANCEL, ACK, BYE and in-dialog
//!   requests from either side included) shows each side only its own Call-ID.
//! - **MANSCDP bodies** (`signaling::manscdp`): address fields (`<IPAddress>`, `<Port>`, an
//!   `<Address>` holding an IP) become the gateway's on the receiving side, or are blanked
//!   (`manscdp_addresses`); the body's encoding (GB2312, GBK, GB 18030) is kept byte for
//!   byte and Content-Length fixed. Control and Query commands pass the route's
//!   `manscdp_allow`/`manscdp_deny`, and from domain B `manscdp_deny_from_b` (by default
//!   the destructive 2022 controls `DeviceUpgrade`, `FormatSDCard`), or get `403`
//!   (counted `manscdp_refused`).
//! - **Annex H path headers** (`X-RoutePath`, `X-PreferredPath`): a URI whose host is an
//!   address of the sending domain names the gateway's hop on the receiving face; a value
//!   that is not a list of SIP URIs is removed.
//! - **A 3xx's Contact** is bound and rewritten like any Contact; a request to its token
//!   goes to the address it named when that is in the sending domain (a registrar's
//!   "register there").
//! - **Unchanged**: tags, CSeq, Subject, Authorization/WWW-Authenticate (any `algorithm`,
//!   SM3 included), `X-GB-ver`, every body but SDP and MANSCDP, every header vgate does not
//!   know.
//!
//! ## The route pair: requests in both directions
//!
//! A proxy has two faces: the **listen** face (the configured port on the gateway's
//! address in `listen_domain`) and the **upstream** face (the gateway's address in the
//! other domain, on `upstream_port`, by default the listen port: fixed, so registrations
//! made through it survive restarts and reloads). New requests from the listen side go to
//! `upstream`; new requests arriving on the upstream face must carry a binding token (they
//! answer a Contact vgate showed), be in a dialog vgate knows, or be addressed to a device
//! registered through this route by its ID (`sip:<device id>@<upstream face>` or
//! `@<domain>`: what a wvp-style platform sends to the address a REGISTER came from), and
//! get `404` otherwise. A deployment where both sides start requests (a device in A
//! registers with the platform in B; the platform in B calls devices in A) configures two
//! routes, one listening in each domain, as the namespace test does: the platform's
//! requests to a device registered through the A→B route carry that route's token and are
//! routed back through it; requests addressed by ID go through the B→A route. Both routes
//! may use 5060 on each side: their faces then share one socket per side and run as one
//! proxy (`net.rs`, [`net::pick`]), a request addressed by ID to a device registered
//! through the A→B route going to that route.
//!
//! ## Media
//!
//! `media.rs`: every `m=` line with RTP over UDP gets a gateway RTP/RTCP pair in both
//! domains; SDP is rewritten line-preserving (`c=`, `o=`, `m=`, `a=rtcp` only) and routes
//! are installed in the channel of the media direction (forward for a device in A that
//! sends, reverse for talkback/broadcast), with the expected source from each side's SDP;
//! RTCP receiver reports get the route the other way (on RTP + 1, or with `a=rtcp-mux` on
//! both sides on the RTP ports themselves). A re-INVITE keeps the gateway ports and moves
//! the routes to the new addresses and ports.
//! GB/T 28181 RTP over TCP (`TCP/RTP/AVP`, RFC 4571 framing, `a=setup`/`a=connection`) is
//! bridged: on a TCP side vgate terminates the TCP connection itself with a stream leg
//! ([`crate::edge`]) at its gateway RTP port in that domain, passive or active as the peer's
//! `a=setup` asks, and the media still crosses on the one-way UDP channels. Each side keeps
//! the transport of its own SDP, so TCP↔UDP, UDP↔TCP and TCP↔TCP all work; a leg that
//! closes ends the call with BYE to both sides (see `media.rs`). Media over TCP that vgate
//! cannot bridge (`TCP/TLS/RTP/AVP`, a port count, any TCP media in a half of the split
//! appliance, whose legs cannot send down the one-way link yet) is refused with `488` and a `Warning`
//! (logged rate-limited; a retransmitted INVITE gets the cached 488, so once per dialog):
//! passing such an SDP on would let media bypass the gateway. An SDP
//! in a response that cannot be rewritten is never passed on: the response is dropped and
//! the INVITE timeout ends the call. Port exhaustion answers `503` with `Retry-After`.
//! Under media validation `enforce`, an SDP with an `m=` line none of whose formats the
//! policy lets cross is refused the same way (`488`, `Warning: 399 vgate "media validation:
//! codec VP8/90000 not allowed ..."`, counted `media_refused`; in the answer to an initial
//! INVITE: dropped, the caller answered that 488, the callee CANCELled), see
//! docs/media-validation.md.
//!
//! ## Lifecycle
//!
//! A call's ports and routes are freed when a BYE crosses, when a CANCEL crosses, when the
//! initial INVITE gets a final error (vgate ACKs it downstream itself and absorbs the
//! caller's ACK), when no final answer came within `invite_timeout` (CANCEL downstream,
//! `408` upstream), and when none of its routes saw a packet for `media_timeout` (BYE to
//! both sides, built from the dialog state). Every table is capped ([`core::MAX_TXNS`],
//! [`core::MAX_BINDINGS`], [`core::MAX_CALLS`], [`core::MAX_CALL_IDS`]; past a cap new work
//! gets `503`; each source address holds at most `max_bindings_per_source` contacts, the
//! next gets `403`, counted `bindings_refused`) and every entry expires: transactions 32 s
//! after their final answer, a REGISTER's contact with the transaction unless the
//! registrar answers 2xx (then with the registration), dialog contacts an hour after
//! their last use, calls 32 s after they end. Tokens, branches and tags are SHA-256 of a
//! key from `getrandom` and a counter; without randomness the proxy does not start.
//!
//! ## Transport and size
//!
//! UDP and TCP (one transport per route, as configured). A message too large for one
//! Ethernet frame still crosses over UDP as one datagram (IP fragments; 64 KiB max): that
//! works on loopback, veth and ordinary LANs. RFC 3261 §18.1.1 would switch such a request
//! to TCP; vgate keeps the route's transport, so a path that drops fragments needs a TCP
//! route. `max_message` caps UDP (default 65 535 bytes), `max_tcp_message` TCP (default 1 MiB,
//! a cascade's one-MESSAGE Catalog; an older config's `max_message` alone caps TCP too).
//!
//! Over TCP (`net.rs`): messages are framed by Content-Length; a CRLFCRLF keep-alive gets
//! a CRLF pong (RFC 5626); a stream that cannot be framed any more (a message over
//! `max_tcp_message`, a missing or double Content-Length) is answered `513`/`400` with a
//! Warning when its head is a readable request, counted (`tcp_unframeable`, `too_large`)
//! and closed; `max_connections_per_source` accepted connections per source address, the
//! next one closed at once (`tcp_connections_refused`). Connections vgate opens connect
//! without blocking the loop (at most [`net::CONNECT_TIMEOUT`], then dropped and counted
//! as `tcp_connect_failures`), so a dead peer delays nothing but its own messages.
//!
//! ## Access control
//!
//! The listen face accepts peers in `allow_peers` (default: any address of the listen
//! domain); the upstream face accepts addresses of the upstream domain, but only the
//! route's `upstream` (and, on a socket shared with a route listening there, the peers that
//! route's `allow_peers` accepts) may *start* requests on it: a new request from anyone else
//! (no binding token, no dialog of the route) gets `403`, counted `upstream_forbidden`, so
//! the upstream face cannot carry an arbitrary source's requests into the other domain. On
//! a shared socket the same rule decides which route a new request goes to
//! ([`Core::claim`]); one no face admits goes to the route listening there, which refuses it. When `allow_ids`
//! is set, From and To must both be 20-digit GB/T 28181 IDs starting with one of its
//! prefixes. Anything else gets `403 Forbidden` with a Warning, counted and logged with a
//! rate limit. Each source may send `rate_limit` requests per second (bursts of twice
//! that); the excess is dropped and counted. Malformed requests get `400` (or the code
//! [`crate::signaling::sip::check_request`] names); unparsable bytes are a counted drop.

pub mod access;
pub mod core;
pub mod media;
pub mod net;

#[cfg(test)]
mod group_tests;

use std::net::{SocketAddrV4, TcpListener, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::config::{Config, DomainId, SignalingRoute, Transport};
use crate::routes::Routes;

use super::{Proxy, ProxyContext, ProxyError};

pub use self::core::{Claim, Core, Counters, Face, Out, Peer};

/// A running SIP proxy: a group of routes sharing sockets (often one route alone).
pub struct SipProxy {
    routes: Vec<SignalingRoute>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// The gateway addresses of each route's listen and upstream faces.
    pub local: Vec<[SocketAddrV4; 2]>,
}

impl Proxy for SipProxy {
    fn routes(&self) -> &[SignalingRoute] {
        &self.routes
    }

    fn listening(&self) -> Vec<(Transport, SocketAddrV4)> {
        let mut v: Vec<(Transport, SocketAddrV4)> = self
            .routes
            .iter()
            .zip(&self.local)
            .flat_map(|(r, l)| l.iter().map(|a| (r.transport, *a)))
            .collect();
        v.sort_unstable_by_key(|(t, a)| (*t == Transport::Tcp, *a));
        v.dedup();
        v
    }

    fn shutdown(mut self: Box<Self>) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                let names: Vec<&str> = self.routes.iter().map(|r| r.name.as_str()).collect();
                tracing::error!(routes = ?names, "SIP proxy thread panicked");
            }
        }
    }
}

impl Drop for SipProxy {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The key of a proxy's identifiers, from the operating system's random source. No
/// randomness, no proxy: guessable tokens would let anyone reach a registered device.
pub fn random_secret(route: &str) -> Result<[u8; 32], ProxyError> {
    let mut key = [0u8; 32];
    getrandom::fill(&mut key).map_err(|e| ProxyError::Other {
        route: route.to_owned(),
        message: format!(
            "the operating system gave no randomness ({e}); vgate will not hand out guessable \
             tokens: check that getrandom(2) or /dev/urandom works in this environment"
        ),
    })?;
    Ok(key)
}

/// The sockets of a group of routes: each (domain, port) once, in order of first use, and
/// for each route the index of its listen and upstream face's socket (by [`Face::index`]).
pub fn group_sockets(group: &[SignalingRoute]) -> (Vec<(DomainId, u16)>, Vec<[usize; 2]>) {
    let mut keys: Vec<(DomainId, u16)> = Vec::new();
    let mut socks_of = Vec::new();
    for r in group {
        let mut idx = [0usize; 2];
        for (face, key) in [
            (r.listen_domain, r.listen_port),
            (r.listen_domain.other(), r.policy.upstream_port),
        ]
        .into_iter()
        .enumerate()
        {
            let i = keys.iter().position(|k| *k == key).unwrap_or_else(|| {
                keys.push(key);
                keys.len() - 1
            });
            if let Some(x) = idx.get_mut(face) {
                *x = i;
            }
        }
        socks_of.push(idx);
    }
    (keys, socks_of)
}

/// The core of `route`, a member of `group` (`socks_of` from [`group_sockets`]) whose faces
/// are at `local`: the routes listening on its upstream socket let their peers start
/// requests on its upstream face ([`Core::may_start_upstream`]). No secret, no legs: the
/// caller adds them.
pub fn member_core(
    group: &[SignalingRoute],
    socks_of: &[[usize; 2]],
    route: &SignalingRoute,
    config: &Config,
    routes: &Arc<Routes>,
    local: [SocketAddrV4; 2],
) -> Core {
    let up = group
        .iter()
        .position(|r| r == route)
        .and_then(|i| socks_of.get(i))
        .map(|s| s[Face::Upstream.index()]);
    let starters = group
        .iter()
        .zip(socks_of)
        .filter(|(r, s)| *r != route && Some(s[Face::Listen.index()]) == up)
        .map(|(r, _)| r.policy.allow_peers.clone())
        .collect();
    Core::new(route, config, Arc::clone(routes), local, "").with_upstream_starters(starters)
}

/// Binds the sockets of a group of routes ([`crate::signaling::proxy::units`]: SIP routes
/// whose faces share sockets, all of one transport) and starts its thread.
pub fn start(group: &[SignalingRoute], ctx: &ProxyContext) -> Result<Box<dyn Proxy>, ProxyError> {
    let Some(first) = group.first() else {
        return Err(ProxyError::Other {
            route: String::new(),
            message: "no route to serve".into(),
        });
    };
    // A fixed port on both faces: registrations made through a face name it and must
    // still reach vgate after a restart or a reload.
    let (keys, socks_of) = group_sockets(group);
    // Which route a socket's errors name: the first one listening there, else the first.
    let owner = |i: usize| {
        group
            .iter()
            .zip(&socks_of)
            .find(|(_, s)| s[0] == i)
            .or_else(|| group.iter().zip(&socks_of).find(|(_, s)| s[1] == i))
            .map_or(first.name.as_str(), |(r, _)| r.name.as_str())
    };
    let addr_of =
        |(d, port): (DomainId, u16)| SocketAddrV4::new(ctx.config.domain(d).address, port);
    let err = |i: usize, addr: SocketAddrV4, source: std::io::Error| ProxyError::Listen {
        route: owner(i).to_owned(),
        addr: addr.into(),
        source,
    };
    let local_of = |a: std::io::Result<std::net::SocketAddr>, fallback: SocketAddrV4| match a {
        Ok(std::net::SocketAddr::V4(a)) => a,
        _ => fallback,
    };
    enum Bound {
        Udp(Vec<UdpSocket>),
        Tcp(Vec<TcpListener>),
    }
    let mut locals = Vec::new();
    let bound = match first.transport {
        Transport::Udp => {
            let mut v = Vec::new();
            for (i, k) in keys.iter().enumerate() {
                let a = addr_of(*k);
                let s = UdpSocket::bind(a).map_err(|e| err(i, a, e))?;
                super::bind_to_interface(&s, &ctx.config.domain(k.0).interface, owner(i))?;
                locals.push(local_of(s.local_addr(), a));
                v.push(s);
            }
            Bound::Udp(v)
        }
        Transport::Tcp => {
            let mut v = Vec::new();
            for (i, k) in keys.iter().enumerate() {
                let a = addr_of(*k);
                let s = TcpListener::bind(a).map_err(|e| err(i, a, e))?;
                super::bind_to_interface(&s, &ctx.config.domain(k.0).interface, owner(i))?;
                locals.push(local_of(s.local_addr(), a));
                v.push(s);
            }
            Bound::Tcp(v)
        }
    };
    let mut members = Vec::new();
    let mut local = Vec::new();
    for (r, socks) in group.iter().zip(&socks_of) {
        let l = [locals[socks[0]], locals[socks[1]]];
        let core = member_core(group, &socks_of, r, &ctx.config, &ctx.routes, l)
            .with_secret(random_secret(&r.name)?)
            .with_legs(Arc::clone(&ctx.legs));
        core.stats.set_events(core.counters.list());
        ctx.stats.register(&r.name, Arc::clone(&core.stats));
        members.push(net::Member {
            core,
            socks: *socks,
        });
        local.push(l);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let flags = [Arc::clone(&stop), Arc::clone(&ctx.stop)];
    let names: Vec<&str> = group.iter().map(|r| r.name.as_str()).collect();
    let name = format!("sip-{}", names.join("+"));
    let thread = match bound {
        Bound::Udp(socks) => std::thread::Builder::new()
            .name(name)
            .spawn(move || net::run_udp(members, socks, &flags)),
        Bound::Tcp(listeners) => {
            // A socket's limits: the most generous of the routes using it.
            let caps = (0..keys.len())
                .map(|i| {
                    group
                        .iter()
                        .zip(&socks_of)
                        .filter(|(_, s)| s.contains(&i))
                        .map(|(r, _)| r.policy.max_connections_per_source)
                        .max()
                        .unwrap_or(0)
                })
                .collect();
            let max_message = group
                .iter()
                .map(|r| r.policy.max_tcp_message)
                .max()
                .unwrap_or(0);
            let a = locals.first().copied().unwrap_or(local[0][0]);
            let tcp = net::TcpNet::new(listeners, caps, max_message).map_err(|e| err(0, a, e))?;
            std::thread::Builder::new()
                .name(name)
                .spawn(move || tcp.run(members, &flags))
        }
    };
    let thread = thread.map_err(|e| ProxyError::Other {
        route: first.name.clone(),
        message: format!("cannot start the proxy thread: {e}"),
    })?;
    for (r, l) in group.iter().zip(&local) {
        tracing::info!(
            route = %r.name,
            transport = ?r.transport,
            listen = %l[0],
            upstream_face = %l[1],
            upstream = %r.upstream,
            shared_with = ?names.iter().filter(|n| **n != r.name).collect::<Vec<_>>(),
            "SIP proxy serving"
        );
    }
    Ok(Box::new(SipProxy {
        routes: group.to_vec(),
        stop,
        thread: Some(thread),
        local,
    }))
}
