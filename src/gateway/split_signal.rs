//! How a half's gateway runs its agent: the face addresses and ports come from the config and
//! the running proxies, and a lost peer ends the signaled sessions through the proxies' own
//! kill path ([`Routes::request_end`], as `DELETE /api/v1/sessions/{id}` does).

use std::sync::Arc;

use crate::config::{Config, Transport};
use crate::routes::{Routes, SessionKind};
use crate::signaling::proxy::Proxy;

use crate::signaling::split::{Agent, AgentConfig, PeerEvents, Role, SignalError};

/// Ends every SIP and RTSP session: in a half, each of them crosses the link (one of the
/// proxy's two faces is the link face). Their proxies send BYE / TEARDOWN into the own domain
/// and free the ports and routes. Static routes are not proxy sessions and stay.
pub struct EndSignaledSessions(pub Arc<Routes>);

impl PeerEvents for EndSignaledSessions {
    fn end_sessions(&self, why: &str) -> usize {
        let mut n = 0;
        for s in self.0.sessions() {
            if matches!(s.kind, SessionKind::Sip | SessionKind::Rtsp)
                && self.0.request_end(s.id).is_ok()
            {
                tracing::info!(session = s.id, kind = s.kind.name(), label = %s.label, "{why}: ending the session");
                n += 1;
            }
        }
        n
    }
}

/// The UDP and TCP ports the proxies listen on at the half's own face address.
pub fn announced(config: &Config, proxies: &[Box<dyn Proxy>]) -> (Vec<u16>, Vec<u16>) {
    let (mut udp, mut tcp) = (Vec::new(), Vec::new());
    let Some(split) = &config.split else {
        return (udp, tcp);
    };
    let own_face = config.domain(split.link_face()).address;
    for p in proxies {
        for (t, a) in p.listening() {
            if *a.ip() == own_face {
                match t {
                    Transport::Udp => udp.push(a.port()),
                    Transport::Tcp => tcp.push(a.port()),
                }
            }
        }
    }
    udp.sort_unstable();
    udp.dedup();
    tcp.sort_unstable();
    tcp.dedup();
    (udp, tcp)
}

/// Starts the agent of a half (`None` for a single-host config).
pub fn start(
    config: &Config,
    proxies: &[Box<dyn Proxy>],
    routes: Arc<Routes>,
) -> Result<Option<Agent>, SignalError> {
    let Some(split) = &config.split else {
        return Ok(None);
    };
    let face = config.domain(split.link_face());
    let cfg = AgentConfig {
        link: split.signal.clone(),
        role: match split.half {
            crate::config::split::Half::A => Role::Dialer,
            crate::config::split::Half::B => Role::Listener,
        },
        own_face: face.address,
        peer_face: split.peer_face,
        face_interface: face.interface.clone(),
    };
    let (udp, tcp) = announced(config, proxies);
    tracing::info!(half = %split.half, local = %cfg.link.local, peer = %cfg.link.peer, udp = ?udp, tcp = ?tcp, "split signaling agent starting");
    Agent::start(cfg, Box::new(EndSignaledSessions(routes)), udp, tcp).map(Some)
}
