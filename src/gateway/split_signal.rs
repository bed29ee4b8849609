//! How a half's gateway runs its agent: the face addresses and ports come from the config and
//! the running proxies, and a lost peer ends the signaled sessions through the proxies' own
//! kill path ([`Routes::request_end`], as `DELETE /api/v1/sessions/{id}` does).
//!
//! A half that is a hot-standby pair (`[ha]`) shares one signaling identity between its two
//! nodes: the active publishes the instance id its agent presents on the routes' board
//! (`split/signal/agent`, written to the pair's Redis with the sessions, [`crate::ha`]); the
//! standby reads it back from the store and presents it once it takes over, so the peer half
//! sees its peer reconnect as the same instance and keeps the sessions (docs/ha-split.md).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::config::{Config, Transport};
use crate::routes::{Routes, SessionKind};
use crate::signaling::proxy::Proxy;

use crate::signaling::split::{Agent, AgentConfig, PeerEvents, Role, SignalError};

/// The board producer and key of the pair's signaling identity (`split/signal/agent` in the
/// state store).
const PRODUCER: &str = "split/signal";
const KEY: &str = "agent";
/// An agent's instance id.
type InstanceId = [u8; 16];
/// The identity record's version.
const VERSION: u32 = 1;

/// The pair's signaling identity as the state store holds it.
#[derive(serde::Serialize, serde::Deserialize)]
struct IdentityRecord {
    v: u32,
    /// The agent's instance id, 32 hex digits.
    instance: String,
}

fn to_hex(id: &[u8; 16]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(s: &str) -> Option<[u8; 16]> {
    if s.len() != 32 || !s.is_ascii() {
        return None;
    }
    let mut id = [0u8; 16];
    for (i, b) in id.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(id)
}

/// The gateway's side of the agent. A lost peer ends every SIP and RTSP session: in a half,
/// each of them crosses the link (one of the proxy's two faces is the link face). Their
/// proxies send BYE / TEARDOWN into the own domain and free the ports and routes. Static
/// routes are not proxy sessions and stay. On a node of a pair it also tells the agent the
/// node's role and carries the pair's identity through the board.
pub struct EndSignaledSessions {
    routes: Arc<Routes>,
    paired: bool,
    /// The board generation read last and the identity it held; the identity published last.
    seen: Mutex<(u64, Option<InstanceId>, Option<InstanceId>)>,
}

impl EndSignaledSessions {
    pub fn new(routes: Arc<Routes>, paired: bool) -> EndSignaledSessions {
        EndSignaledSessions {
            routes,
            paired,
            seen: Mutex::new((0, None, None)),
        }
    }
}

impl PeerEvents for EndSignaledSessions {
    fn end_sessions(&self, why: &str) -> usize {
        let mut n = 0;
        for s in self.routes.sessions() {
            if matches!(s.kind, SessionKind::Sip | SessionKind::Rtsp)
                && self.routes.request_end(s.id).is_ok()
            {
                tracing::info!(session = s.id, kind = s.kind.name(), label = %s.label, "{why}: ending the session");
                n += 1;
            }
        }
        n
    }

    fn paired(&self) -> bool {
        self.paired
    }

    fn standby(&self) -> bool {
        self.paired && self.routes.is_standby()
    }

    fn inherited_instance(&self) -> Option<[u8; 16]> {
        if !self.paired {
            return None;
        }
        let mut g = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let mut generation = g.0;
        if let Some(recs) = self.routes.board.imported(PRODUCER, &mut generation) {
            g.0 = generation;
            g.1 = recs.get(KEY).and_then(|j| {
                let r: IdentityRecord = serde_json::from_str(j).ok()?;
                let id = (r.v == VERSION).then(|| from_hex(&r.instance)).flatten();
                if id.is_none() {
                    self.routes.board.reject(1);
                }
                id
            });
        }
        g.1
    }

    fn presenting(&self, instance: [u8; 16]) {
        let board = &self.routes.board;
        if !self.paired || !board.enabled() {
            return;
        }
        let mut g = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if g.2 == Some(instance) {
            return;
        }
        let rec = IdentityRecord {
            v: VERSION,
            instance: to_hex(&instance),
        };
        if let Ok(j) = serde_json::to_string(&rec) {
            board.publish(PRODUCER, Arc::new(BTreeMap::from([(KEY.to_string(), j)])));
            g.2 = Some(instance);
        }
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
    let events = EndSignaledSessions::new(routes, config.ha.is_some());
    Agent::start(cfg, Box::new(events), udp, tcp).map(Some)
}

#[cfg(test)]
mod tests {
    use super::{from_hex, to_hex};

    #[test]
    fn an_instance_id_survives_its_hex_form() {
        let id: [u8; 16] = std::array::from_fn(|i| (i * 17) as u8);
        assert_eq!(from_hex(&to_hex(&id)), Some(id));
        assert_eq!(from_hex("00"), None);
        assert_eq!(from_hex(&"zz".repeat(16)), None);
        assert_eq!(from_hex(&"\u{e9}".repeat(16)), None);
    }
}
