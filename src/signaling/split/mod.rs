//! The split appliance's signaling agent: carries the link face's signaling between the two
//! halves over one authenticated TCP connection on the signaling link.
//!
//! Each half's proxies talk to the other half's proxies as ordinary peers in the link face
//! "domain", whose only addresses are the two *face addresses* (`V_A` on half A, `V_B` on
//! half B, loopback addresses). The agent of a half listens on the **peer's** face address,
//! on the ports the peer's proxies announced, and delivers what the peer sends from sockets
//! bound to the peer's face address — so a proxy on half A sending to `V_B:5060` reaches the
//! agent, the agent of half B sends it on from `V_A:<same port>` to the proxy listening on
//! `V_B:5060` there, and the answer goes back the same way.
//!
//! - **Connection.** Half A dials, half B listens and accepts only the peer's address; the
//!   dialer retries every heartbeat (at most every second) while the link is down. A newer
//!   authenticated connection replaces the current one.
//! - **Authentication** ([`frame`]): a hello each way (role, a random instance id per process,
//!   a random nonce per connection), then frames tagged with HMAC-SHA256 under direction keys
//!   derived from the shared key and both hellos, with sequence numbers. A forged, altered,
//!   replayed, reordered, truncated or malformed frame resets the connection and is counted;
//!   so is a connection from anyone but the peer or one that is not vgate.
//! - **Multiplexing.** UDP datagrams as `(source port, destination port, bytes)`; TCP
//!   connections as streams (open / data / close). Frames never carry an address.
//! - **Failure of a half.** Heartbeats both ways; a peer silent for `dead_after`, one that said
//!   goodbye, one whose connection stays down for `dead_after`, or one that comes back with a
//!   new instance id (it restarted) is *lost*: [`PeerEvents::end_sessions`] ends every
//!   signaled session in the own domain the way an operator kill does (BYE / TEARDOWN), and
//!   it is counted. Static routes are not sessions of a proxy and keep flowing.
//! - **A half that is a hot-standby pair** ([`PeerEvents::standby`]): only its active node
//!   holds the link. The active presents the pair's instance id, which travels with the
//!   pair's state through its Redis ([`PeerEvents::inherited_instance`]): a standby that
//!   takes over presents the id of the node it replaces, so the peer half sees the same
//!   instance reconnect (within `dead_after`) and keeps the sessions the new active holds
//!   copies of. A half whose state was lost (a restart of the whole pair) presents a new id
//!   and its sessions end on the peer as at any restart.
//!
//! The agent is signaling, not the media path: it allocates per frame and runs on its own
//! thread; media crosses on the one-way links.

mod agent;
pub mod frame;
pub mod stats;

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

pub use crate::config::split_signal::{SignalKey, SignalLink, SignalLinkConfig};
pub use frame::Role;
pub use stats::SignalStats;

/// What the agent needs to run.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub link: SignalLink,
    pub role: Role,
    /// This half's face address (where its proxies bind in the link face).
    pub own_face: Ipv4Addr,
    /// The peer's face address, as this half sees it (the agent binds it).
    pub peer_face: Ipv4Addr,
    /// The link face's interface; face sockets are tied to it (empty: not tied).
    pub face_interface: String,
}

/// What the agent asks of the gateway: ending the sessions when the peer is lost, and, on a
/// node of a hot-standby pair, its role and the pair's signaling identity.
pub trait PeerEvents: Send + 'static {
    /// Ends every signaled session crossing the link (BYE / TEARDOWN into the own domain);
    /// returns how many it asked to end.
    fn end_sessions(&self, why: &str) -> usize;

    /// Whether this half is a node of a hot-standby pair (`[ha]`): it then says no goodbye
    /// when it stops (the pair's other node may take over with the sessions).
    fn paired(&self) -> bool {
        false
    }

    /// Whether this node is a pair's standby now: it neither dials nor accepts the signaling
    /// link and ends nothing (the active holds the link and the sessions).
    fn standby(&self) -> bool {
        false
    }

    /// The instance id the pair's active presented, as the pair's state store holds it
    /// (`None`: none known, or not a pair). A standby that becomes the active presents it, so
    /// the peer half sees a takeover with the sessions, not a restart.
    fn inherited_instance(&self) -> Option<[u8; 16]> {
        None
    }

    /// Called at every tick with the instance id this node presents (active) or would
    /// present at a takeover (standby): for the pair's state store.
    fn presenting(&self, _instance: [u8; 16]) {}
}

/// Why the agent did not start.
#[derive(Debug, thiserror::Error)]
pub enum SignalError {
    #[error("split signaling link: cannot listen on {addr}: {source}; is the signaling interface up with that address, and no other vgate running?")]
    Listen {
        addr: std::net::SocketAddrV4,
        source: std::io::Error,
    },
    #[error("split signaling link: cannot start the agent thread: {0}")]
    Thread(std::io::Error),
}

/// The running agent; stops (saying goodbye to the peer) when dropped.
pub struct Agent {
    thread: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    pub stats: Arc<SignalStats>,
    announce: Arc<Mutex<(Vec<u16>, Vec<u16>)>>,
    announce_gen: Arc<AtomicU64>,
}

impl Agent {
    /// Starts the agent. `udp` and `tcp` are the ports this half's proxies listen on at its own
    /// face address (announced to the peer; [`Agent::announce`] changes them).
    pub fn start(
        cfg: AgentConfig,
        events: Box<dyn PeerEvents>,
        udp: Vec<u16>,
        tcp: Vec<u16>,
    ) -> Result<Agent, SignalError> {
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(SignalStats::default());
        let announce = Arc::new(Mutex::new((udp, tcp)));
        let announce_gen = Arc::new(AtomicU64::new(0));
        let local = cfg.link.local;
        let lp = agent::Loop::new(
            cfg,
            events,
            Arc::clone(&stats),
            Arc::clone(&stop),
            Arc::clone(&announce),
            Arc::clone(&announce_gen),
        )
        .map_err(|source| SignalError::Listen {
            addr: local,
            source,
        })?;
        let thread = std::thread::Builder::new()
            .name("vgate-split-signal".into())
            .spawn(move || lp.run())
            .map_err(SignalError::Thread)?;
        Ok(Agent {
            thread: Some(thread),
            stop,
            stats,
            announce,
            announce_gen,
        })
    }

    /// Replaces the ports announced to the peer (after a reload started or stopped proxies).
    pub fn announce(&self, udp: Vec<u16>, tcp: Vec<u16>) {
        if let Ok(mut a) = self.announce.lock() {
            *a = (udp, tcp);
        }
        self.announce_gen.fetch_add(1, Relaxed);
    }

    /// True while the peer is authenticated and heard within `dead_after`.
    pub fn peer_up(&self) -> bool {
        self.stats.peer_up.load(Relaxed) == 1
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests;

/// A blocking TCP connection from `from` (any port) to `to`, for the tests.
#[cfg(test)]
fn agent_test_connect(from: Ipv4Addr, to: std::net::SocketAddrV4) -> std::net::TcpStream {
    let s = agent::connect_from(std::net::SocketAddrV4::new(from, 0), to, "").unwrap();
    s.set_nonblocking(false).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    // The non-blocking connect finishes in the background; wait until it is writable.
    while s.peer_addr().is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "cannot connect to {to}"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    s
}
