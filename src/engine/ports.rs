//! Gateway-port UDP sockets, shared by the engines.
//!
//! Owns: one UDP socket per gateway port in use, bound to the gateway's address in that
//! domain, and the command queues that tell the workers about them. Must not touch: the
//! route tables (it is what the tables call, through [`PortHooks`]) or packet contents.
//!
//! Every port a session holds gets a socket, whether the port receives media (ingress) or
//! sends it (egress: receivers see a stable source, the far-side gateway address and the
//! route's egress port). The `stack` engine also reads the sockets; the ring engines
//! (`tnapi`) capture ingress media from their rings and only send on the sockets — the
//! socket then just holds the port, so no other program can take it.
//!
//! Sockets are opened and closed on the control side and announced to the workers through a
//! per-worker command queue plus an eventfd wake-up, so workers never take a lock.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex, MutexGuard};

use crossbeam_channel::{Receiver, Sender};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::socket::{setsockopt, sockopt};

use crate::config::DomainId;
use crate::routes::PortHooks;

/// A gateway port: the domain it faces and its number.
pub type PortKey = (DomainId, u16);

/// Socket buffer sizes asked for: enough for a burst of a few milliseconds of one stream.
const SOCKET_BUFFER: usize = 4 << 20;

/// What the control side tells a worker.
pub enum Cmd {
    /// A socket every worker may send on; `owner` also reads it (stack engine).
    Add {
        key: PortKey,
        sock: Arc<UdpSocket>,
        owner: usize,
    },
    /// The port was given back: forget its socket.
    Remove { key: PortKey },
}

/// A worker's end of the registry: its command queue and the eventfd that signals it.
pub struct WorkerLink {
    pub cmds: Receiver<Cmd>,
    pub wake: Arc<EventFd>,
}

struct Link {
    tx: Sender<Cmd>,
    wake: Arc<EventFd>,
}

#[derive(Default)]
struct State {
    sockets: HashMap<PortKey, Arc<UdpSocket>>,
    links: Vec<Link>,
    /// Workers that read sockets (the first `readers` links); senders only send.
    readers: usize,
}

/// Sockets by port, and the workers to tell about them. Control side only.
pub struct PortRegistry {
    addrs: [Ipv4Addr; 2],
    /// Interface of each domain: a port's socket is tied to it (`SO_BINDTODEVICE`), so the
    /// gateway's address in one domain takes no datagram arriving from the other.
    interfaces: [Option<String>; 2],
    state: Mutex<State>,
}

impl PortRegistry {
    /// A registry binding ports on `addrs` (indexed by [`DomainId::index`]).
    pub fn new(addrs: [Ipv4Addr; 2]) -> PortRegistry {
        PortRegistry {
            addrs,
            interfaces: [None, None],
            state: Mutex::new(State::default()),
        }
    }

    /// Ties every port's socket to its domain's interface (indexed by [`DomainId::index`]).
    /// Linux takes a datagram for any local address on any interface; without this a host in
    /// one domain that routes through the gateway reaches the ports of the other side. A
    /// probe socket per domain is tied at once: an interface that cannot be bound (missing,
    /// no privilege) is a start-up error, never a quiet loss of isolation.
    pub fn on_interfaces(mut self, interfaces: [String; 2]) -> io::Result<PortRegistry> {
        for d in DomainId::ALL {
            let probe = UdpSocket::bind(SocketAddrV4::new(self.addrs[d.index()], 0))?;
            bind_to_device(&probe, &interfaces[d.index()], d)?;
        }
        self.interfaces = interfaces.map(Some);
        Ok(self)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The worker that reads `port` (stack engine): RTP and RTCP of a pair go to the same
    /// worker; pairs spread over workers.
    pub fn owner(port: u16, workers: usize) -> usize {
        usize::from(port >> 1) % workers.max(1)
    }

    /// Creates the command queues of `n` workers and queues every socket already open
    /// (static routes are installed before or after the workers start; either works).
    pub fn attach_workers(&self, n: usize) -> io::Result<Vec<WorkerLink>> {
        let mut st = self.lock();
        let out = (0..n)
            .map(|_| Self::new_link(&mut st, |port| Self::owner(port, n)))
            .collect::<io::Result<Vec<_>>>()?;
        st.readers = n;
        Ok(out)
    }

    /// A command queue for a worker that only sends on the sockets (the split's incoming
    /// link worker): it hears of every port but reads none. Call after
    /// [`PortRegistry::attach_workers`].
    pub fn attach_sender(&self) -> io::Result<WorkerLink> {
        Self::new_link(&mut self.lock(), |_| usize::MAX)
    }

    /// One more worker's queue, told of every open socket (`owner` names its reader).
    fn new_link(st: &mut State, owner: impl Fn(u16) -> usize) -> io::Result<WorkerLink> {
        let wake = Arc::new(EventFd::from_flags(
            EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC,
        )?);
        let (tx, rx) = crossbeam_channel::unbounded();
        for (key, sock) in &st.sockets {
            let _ = tx.send(Cmd::Add {
                key: *key,
                sock: Arc::clone(sock),
                owner: owner(key.1),
            });
        }
        st.links.push(Link {
            tx,
            wake: Arc::clone(&wake),
        });
        Ok(WorkerLink { cmds: rx, wake })
    }

    fn broadcast(state: &State, make: impl Fn() -> Cmd) {
        for l in &state.links {
            // A worker that has exited has dropped its receiver; nothing to tell it.
            if l.tx.send(make()).is_ok() {
                let _ = l.wake.write(1);
            }
        }
    }
}

impl PortHooks for PortRegistry {
    fn open_port(&self, domain: DomainId, port: u16) -> io::Result<()> {
        let sock = UdpSocket::bind(SocketAddrV4::new(self.addrs[domain.index()], port))?;
        if let Some(ifname) = &self.interfaces[domain.index()] {
            // Refused, the port is not opened (the session gets no port rather than one
            // that also takes datagrams from the other domain).
            bind_to_device(&sock, ifname, domain)?;
        }
        sock.set_nonblocking(true)?;
        // Best effort: the kernel caps these at net.core.[rw]mem_max without CAP_NET_ADMIN.
        let _ = setsockopt(&sock, sockopt::RcvBuf, &SOCKET_BUFFER);
        let _ = setsockopt(&sock, sockopt::SndBuf, &SOCKET_BUFFER);
        // Ask the kernel to report its receive-queue drops with each datagram, so queue
        // overflow is counted instead of silent.
        let _ = setsockopt(&sock, sockopt::RxqOvfl, &1);
        let sock = Arc::new(sock);
        let key = (domain, port);
        let mut st = self.lock();
        st.sockets.insert(key, Arc::clone(&sock));
        let owner = Self::owner(port, st.readers);
        Self::broadcast(&st, || Cmd::Add {
            key,
            sock: Arc::clone(&sock),
            owner,
        });
        Ok(())
    }

    fn port_socket(&self, domain: DomainId, port: u16) -> Option<Arc<UdpSocket>> {
        self.lock().sockets.get(&(domain, port)).cloned()
    }

    fn close_port(&self, domain: DomainId, port: u16) {
        let key = (domain, port);
        let sock = {
            let mut st = self.lock();
            let sock = st.sockets.remove(&key);
            Self::broadcast(&st, || Cmd::Remove { key });
            sock
        };
        if let Some(sock) = sock {
            wait_released(&sock, port);
        }
    }
}

/// Ties `sock` to `interface` (`SO_BINDTODEVICE`); the error names the interface, the
/// domain and what to do.
pub fn bind_to_device<F: AsFd>(sock: &F, interface: &str, domain: DomainId) -> io::Result<()> {
    setsockopt(sock, sockopt::BindToDevice, &std::ffi::OsString::from(interface)).map_err(|e| {
        io::Error::new(
            io::Error::from(e).kind(),
            format!(
                "cannot bind a socket of domain {domain} to its interface {interface:?} (SO_BINDTODEVICE: {e}); without it the gateway's address in one domain takes datagrams from the other. Check domains.{domain}.interface names an interface that exists here and that vgate has CAP_NET_RAW"
            ),
        )
    })
}

/// Waits until every worker has let go of `sock`, so that the port is really closed when
/// `close_port` returns: a session set up right after may bind it again (a reload replacing a
/// route reuses its ports at once). Workers answer within microseconds; a worker that does
/// not within a second is stuck, and the socket is then left to it.
fn wait_released(sock: &Arc<UdpSocket>, port: u16) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    while Arc::strong_count(sock) > 1 {
        if std::time::Instant::now() > deadline {
            tracing::warn!(
                port,
                "a worker did not release the socket of a closed port within 1 s"
            );
            return;
        }
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_share_a_worker_and_workers_hear_of_ports() {
        assert_eq!(PortRegistry::owner(20000, 2), PortRegistry::owner(20001, 2));
        assert_ne!(PortRegistry::owner(20000, 2), PortRegistry::owner(20002, 2));
        assert_eq!(PortRegistry::owner(20000, 0), 0);

        let reg = PortRegistry::new([Ipv4Addr::LOCALHOST, Ipv4Addr::new(127, 0, 0, 2)]);
        reg.open_port(DomainId::A, 0).unwrap();
        let links = reg.attach_workers(2).unwrap();
        for l in &links {
            assert!(
                matches!(l.cmds.try_recv(), Ok(Cmd::Add { .. })),
                "preloaded"
            );
        }
        reg.close_port(DomainId::A, 0);
        for l in &links {
            assert_eq!(l.wake.read().unwrap(), 1, "woken");
            assert!(matches!(l.cmds.try_recv(), Ok(Cmd::Remove { .. })));
        }
    }
}
