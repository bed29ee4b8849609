//! The signaling proxies: one per configured signaling route, each owning its sockets and
//! threads, calling the pure logic of [`super::sip`], [`super::sdp`] and [`super::rtsp`] and
//! installing stream routes through [`crate::routes`].
//!
//! [`start`] starts a proxy for every signaling route of the config. A kind of proxy that is
//! not built yet is reported once as a warning naming the route that is not served; it does
//! not stop the media path.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::config::{Config, DomainId, SignalingKind, SignalingRoute, Transport};
use crate::routes::Routes;

pub mod rtsp;
pub mod sip;
pub mod stats;
pub mod trace;

pub use stats::{SignalingRegistry, SignalingStats};

/// A running proxy.
pub trait Proxy: Send {
    /// The signaling routes it serves: one, or (SIP) a group of routes sharing sockets.
    fn routes(&self) -> &[SignalingRoute];
    /// Stops its threads and ends its sessions (freeing their ports and routes).
    fn shutdown(self: Box<Self>);
    /// The addresses its sockets listen on, every face (the split agent announces those on
    /// the link face to the other half).
    fn listening(&self) -> Vec<(crate::config::Transport, std::net::SocketAddrV4)>;
}

/// Why a proxy did not start.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("signaling route \"{route}\": cannot listen on {addr}: {source}; is another program using the port?")]
    Listen {
        route: String,
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("signaling route \"{route}\": {message}")]
    Other { route: String, message: String },
}

/// Everything a proxy needs from the gateway.
#[derive(Clone)]
pub struct ProxyContext {
    pub config: Arc<Config>,
    pub routes: Arc<Routes>,
    /// Where the proxies start their stream legs (`edge`, over the engine's ports).
    pub legs: Arc<dyn crate::routes::legs::Legs>,
    pub stop: Arc<AtomicBool>,
    /// Where each proxy registers its counters for the metrics.
    pub stats: Arc<SignalingRegistry>,
}

/// Ties a proxy socket to the interface of the domain whose address it is bound to
/// (`SO_BINDTODEVICE`). Linux accepts a packet for any local address on any interface, so
/// without this a host in domain A that routes through the gateway reaches the listeners on
/// the gateway's B address (and the reverse): an IP path across the boundary. Bound to its
/// interface, the socket only sees what arrives there. If the kernel refuses (no such
/// interface, no privilege), the proxy does not start: isolation never degrades quietly.
pub fn bind_to_interface<F: std::os::fd::AsFd>(
    sock: &F,
    interface: &str,
    route: &str,
) -> Result<(), ProxyError> {
    crate::iface::bind_to_device(sock, interface).map_err(|e| ProxyError::Other {
        route: route.to_owned(),
        message: format!(
            "cannot bind a signaling socket to its interface {interface:?} (SO_BINDTODEVICE: {e}); without it the socket also answers packets for its address arriving from the other domain. Check the domain's interface name and that vgate has CAP_NET_RAW"
        ),
    })
}

/// Starts a proxy for every signaling route; stops those already started if one fails.
pub fn start(ctx: &ProxyContext) -> Result<Vec<Box<dyn Proxy>>, ProxyError> {
    start_routes(ctx, &ctx.config.signaling)
}

/// Starts a proxy for each of `routes` (a reload starts only the new ones): one per RTSP
/// route, one per group of SIP routes sharing sockets ([`units`]).
pub fn start_routes(
    ctx: &ProxyContext,
    routes: &[SignalingRoute],
) -> Result<Vec<Box<dyn Proxy>>, ProxyError> {
    let mut proxies: Vec<Box<dyn Proxy>> = Vec::new();
    for unit in units(routes) {
        let started = match unit.first().map(|r| r.kind) {
            Some(SignalingKind::Sip) => sip::start(&unit, ctx),
            Some(SignalingKind::Rtsp) => rtsp::start(&unit[0], ctx),
            None => continue,
        };
        match started {
            Ok(p) => proxies.push(p),
            Err(e) => {
                for p in proxies {
                    p.shutdown();
                }
                return Err(e);
            }
        }
    }
    Ok(proxies)
}

/// A signaling socket: domain, port, transport.
pub type Socket = (DomainId, u16, Transport);

/// The sockets a route's faces use: (domain, port, transport) of its listen face and, for
/// SIP, of its upstream face.
pub fn sockets(r: &SignalingRoute) -> Vec<Socket> {
    let mut v = vec![(r.listen_domain, r.listen_port, r.transport)];
    if r.kind == SignalingKind::Sip {
        v.push((r.listen_domain.other(), r.policy.upstream_port, r.transport));
    }
    v
}

/// The routes one proxy serves, in config order: each RTSP route alone; SIP routes joined
/// when a face of one and a face of the other use the same socket (and so on, transitively:
/// a group is a connected set).
pub fn units(routes: &[SignalingRoute]) -> Vec<Vec<SignalingRoute>> {
    let mut groups: Vec<(Vec<Socket>, Vec<SignalingRoute>)> = Vec::new();
    for r in routes {
        if r.kind != SignalingKind::Sip {
            groups.push((Vec::new(), vec![r.clone()]));
            continue;
        }
        let mut socks = sockets(r);
        let mut members = vec![r.clone()];
        let mut i = 0;
        while i < groups.len() {
            let touches = groups
                .get(i)
                .is_some_and(|(s, _)| s.iter().any(|k| socks.contains(k)));
            if touches {
                let (s, m) = groups.remove(i);
                socks.extend(s);
                let mut m = m;
                m.append(&mut members);
                members = m;
            } else {
                i += 1;
            }
        }
        groups.push((socks, members));
    }
    // Back in the config order of each group's first route.
    let order = |m: &Vec<SignalingRoute>| {
        m.first()
            .and_then(|f| routes.iter().position(|r| r == f))
            .unwrap_or(usize::MAX)
    };
    let mut out: Vec<Vec<SignalingRoute>> = groups.into_iter().map(|(_, m)| m).collect();
    for m in &mut out {
        m.sort_by_key(|r| routes.iter().position(|x| x == r).unwrap_or(usize::MAX));
    }
    out.sort_by_key(order);
    out
}
