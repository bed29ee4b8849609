//! Gateway ports: how the engines hold them and send from them.
//!
//! Owns: the gateway ports in use and, where the engine needs them, one UDP socket per port
//! bound to the gateway's address in that domain; the raw sockets that send from a port
//! without holding it ([`RawUdp`]); the command queues that tell the workers about sockets.
//! Must not touch: the route tables (it is what the tables call, through [`PortHooks`]) or
//! packet contents.
//!
//! # Two ways to hold a port ([`PortHold`])
//!
//! - [`PortHold::Sockets`]: every port a session holds gets a socket, whether the port
//!   receives media (ingress) or sends it (egress: receivers see a stable source, the
//!   far-side gateway address and the route's egress port). The `stack` engine reads these
//!   sockets; a split half's incoming link worker and the `sockets` transmit variants of
//!   the ring engines (`VGATE_TNAPI_TX=sockets`, `VGATE_AFXDP_TX=sockets`) send on them.
//! - [`PortHold::Reserved`] (the ring modes `tnapi`, `zc`, `xdp` by default): no socket per
//!   port. Those engines capture ingress media from their rings and build what they send;
//!   the per-port socket was only a fallback transmit path and a claim on the port number.
//!   The fallback goes through one raw IPv4 socket per worker and egress domain instead
//!   ([`RawUdp`]: vgate writes the UDP header with the route's ports, the kernel adds the
//!   IPv4 header, routes, resolves the next hop and fragments — what the UDP socket did),
//!   and stream legs send through one shared raw socket per domain ([`PortTx::Raw`]). The
//!   port number is safe without a socket because (1) media arriving for the range never
//!   reaches the kernel's UDP layer: tnapi's nft table drops it before routing, zc/xdp's XDP
//!   program hands a routed port's datagrams to a worker and drops the rest itself (counted
//!   `no_route`), so no ICMP port unreachable goes out and no other socket gets it; (2) the kernel must not give the range's ports to other programs' ephemeral
//!   sockets — `net.ipv4.ip_local_reserved_ports` covers the media ranges (checked at start,
//!   [`reserved_ports_advice`]; docs/operations.md). A port another program holds when a
//!   session takes it is refused as before: `open_port` binds a UDP socket to it and closes
//!   it at once (control side, no lasting descriptor), so the allocator takes another port
//!   and a static route's error names the holder class. A program that binds a port of the
//!   range *after* vgate took it is not detected (a socket per port would have kept it
//!   out); its socket receives nothing from the media interfaces (the rings take those
//!   datagrams first) but may send from the gateway's port. 10 000 routes then cost no file
//!   descriptors beyond the engine's own (docs/bench-relay.md).
//!
//! Sockets are opened and closed on the control side and announced to the workers through a
//! per-worker command queue plus an eventfd wake-up, so workers never take a lock.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};

use crossbeam_channel::{Receiver, Sender};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::socket::{setsockopt, sockopt};

use super::sys::mmsg::{raw_udp_socket, send_raw_udp_one, SendOutcome, SliceScope};
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

/// How gateway ports are held (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortHold {
    /// One UDP socket per port in use.
    Sockets,
    /// No socket per port; sending goes through raw sockets ([`RawUdp`]).
    Reserved,
}

/// A raw IPv4 socket that sends UDP datagrams from the gateway's address in one domain, from
/// any of its ports, out of that domain's interface (`SO_BINDTODEVICE`, as the port sockets
/// are tied). It never receives (see [`raw_udp_socket`]).
pub struct RawUdp {
    fd: OwnedFd,
    addr: Ipv4Addr,
}

impl RawUdp {
    /// A raw socket sending from `addr`, tied to `interface` when given.
    pub fn open(addr: Ipv4Addr, interface: Option<&str>, domain: DomainId) -> io::Result<RawUdp> {
        let fd = raw_udp_socket(addr).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot open the raw socket that sends domain {domain}'s media from {addr}: {e}; vgate needs CAP_NET_RAW"),
            )
        })?;
        if let Some(ifname) = interface {
            bind_to_device(&fd, ifname, domain)?;
        }
        Ok(RawUdp { fd, addr })
    }

    /// Where a datagram from gateway port `port` leaves.
    pub fn from_port(&self, port: u16) -> TxVia<'_> {
        TxVia::Raw(self.fd.as_fd(), SocketAddrV4::new(self.addr, port))
    }
}

/// How a stream leg (`edge::Injector`) sends from a gateway port.
#[derive(Clone)]
pub enum PortTx {
    /// The port's own socket.
    Socket(Arc<UdpSocket>),
    /// A raw socket shared by the domain's legs, and the port to send from.
    Raw(Arc<RawUdp>, u16),
}

impl PortTx {
    /// Where the datagrams leave.
    pub fn egress(&self) -> TxVia<'_> {
        match self {
            PortTx::Socket(s) => TxVia::Port(s.as_fd()),
            PortTx::Raw(r, port) => r.from_port(*port),
        }
    }
}

/// The way a route's datagrams leave a worker: the egress port's socket, or a raw socket
/// and the source (gateway address and egress port) to write in the UDP header.
#[derive(Clone, Copy, Debug)]
pub enum TxVia<'l> {
    Port(BorrowedFd<'l>),
    Raw(BorrowedFd<'l>, SocketAddrV4),
}

impl TxVia<'_> {
    /// Sends what `scope` holds to `dest` and empties it.
    #[inline]
    pub fn send(self, scope: &mut SliceScope<'_, '_>, dest: SocketAddrV4) -> SendOutcome {
        match self {
            TxVia::Port(fd) => scope.send(fd, dest),
            TxVia::Raw(fd, src) => scope.send_raw_udp(fd, src, dest),
        }
    }

    /// Sends one datagram to `dest` without waiting; the payload bytes sent.
    pub fn send_one(self, payload: &[u8], dest: SocketAddrV4) -> io::Result<usize> {
        match self {
            TxVia::Port(fd) => Ok(nix::sys::socket::sendto(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                payload,
                &nix::sys::socket::SockaddrIn::from(dest),
                nix::sys::socket::MsgFlags::MSG_DONTWAIT,
            )?),
            TxVia::Raw(fd, src) => send_raw_udp_one(fd, src, dest, payload),
        }
    }
}

/// The gateway's sending side as a worker knows it: the port sockets it was told of (by
/// port), and, where ports hold no socket, its own raw socket per egress domain.
#[derive(Default)]
pub struct EgressSockets {
    ports: HashMap<PortKey, Arc<UdpSocket>>,
    raw: [Option<RawUdp>; 2],
}

impl EgressSockets {
    pub fn new() -> EgressSockets {
        EgressSockets::default()
    }

    /// With the worker's raw sockets (from [`PortRegistry::raw_senders`]).
    pub fn with_raw(raw: [Option<RawUdp>; 2]) -> EgressSockets {
        EgressSockets {
            ports: HashMap::new(),
            raw,
        }
    }

    /// Applies a port command.
    pub fn apply(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Add { key, sock, .. } => {
                self.ports.insert(key, sock);
            }
            Cmd::Remove { key } => {
                self.ports.remove(&key);
            }
        }
    }

    /// The socket of port `key`, when ports hold sockets.
    pub fn get(&self, key: &PortKey) -> Option<&Arc<UdpSocket>> {
        self.ports.get(key)
    }

    /// How a datagram from gateway port `port` of `domain` leaves: its socket, else the raw
    /// socket of `domain`; `None` when neither exists (a port being closed).
    #[inline]
    pub fn egress(&self, domain: DomainId, port: u16) -> Option<TxVia<'_>> {
        match self.ports.get(&(domain, port)) {
            Some(s) => Some(TxVia::Port(s.as_fd())),
            None => self.raw[domain.index()].as_ref().map(|r| r.from_port(port)),
        }
    }
}

/// Sockets by port, and the workers to tell about them. Control side only.
pub struct PortRegistry {
    addrs: [Ipv4Addr; 2],
    /// Interface of each domain: a port's socket is tied to it (`SO_BINDTODEVICE`), so the
    /// gateway's address in one domain takes no datagram arriving from the other.
    interfaces: [Option<String>; 2],
    hold: PortHold,
    /// [`PortHold::Reserved`]: the raw socket per domain the stream legs send through.
    leg_raw: [Option<Arc<RawUdp>>; 2],
    /// In a split half: the TCP media legs' sender on the outgoing link (set when the
    /// engine opens its links).
    pub edge_link: super::link::EdgeLink,
    state: Mutex<State>,
}

impl PortRegistry {
    /// A registry binding ports on `addrs` (indexed by [`DomainId::index`]).
    pub fn new(addrs: [Ipv4Addr; 2]) -> PortRegistry {
        PortRegistry {
            addrs,
            interfaces: [None, None],
            hold: PortHold::Sockets,
            leg_raw: [None, None],
            edge_link: Default::default(),
            state: Mutex::new(State::default()),
        }
    }

    /// How to send from an open port: its socket, or the domain's raw socket and the port
    /// number. Stream legs (`edge`) send this way.
    pub fn port_tx(&self, domain: DomainId, port: u16) -> Option<PortTx> {
        match &self.leg_raw[domain.index()] {
            Some(raw) => Some(PortTx::Raw(Arc::clone(raw), port)),
            None => self
                .lock()
                .sockets
                .get(&(domain, port))
                .cloned()
                .map(PortTx::Socket),
        }
    }

    /// Holds ports as `hold` says; [`PortHold::Reserved`] opens the stream legs' raw socket
    /// per domain now (tied to the interfaces given so far: call after
    /// [`PortRegistry::on_interfaces`]), so a missing CAP_NET_RAW is a start-up error.
    pub fn holding(mut self, hold: PortHold) -> io::Result<PortRegistry> {
        self.hold = hold;
        if hold == PortHold::Reserved {
            let a = self.open_raw(DomainId::A)?;
            let b = self.open_raw(DomainId::B)?;
            self.leg_raw = [Some(Arc::new(a)), Some(Arc::new(b))];
        }
        Ok(self)
    }

    /// How ports are held.
    pub fn hold(&self) -> PortHold {
        self.hold
    }

    fn open_raw(&self, d: DomainId) -> io::Result<RawUdp> {
        RawUdp::open(
            self.addrs[d.index()],
            self.interfaces[d.index()].as_deref(),
            d,
        )
    }

    /// A worker's own raw socket per egress domain when ports hold no socket (all `None`
    /// with [`PortHold::Sockets`]).
    pub fn raw_senders(&self) -> io::Result<[Option<RawUdp>; 2]> {
        if self.hold == PortHold::Sockets {
            return Ok([None, None]);
        }
        Ok([
            Some(self.open_raw(DomainId::A)?),
            Some(self.open_raw(DomainId::B)?),
        ])
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
        if self.hold == PortHold::Reserved {
            // Nothing to hold (see the module doc), but a port another program holds is
            // refused as a socket per port would refuse it.
            return probe_free(self.addrs[domain.index()], port, domain);
        }
        let addr = self.addrs[domain.index()];
        let sock = UdpSocket::bind(SocketAddrV4::new(addr, port))
            .map_err(|e| not_on_host(e, addr, domain))?;
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

    fn close_port(&self, domain: DomainId, port: u16) {
        if self.hold == PortHold::Reserved {
            return;
        }
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

/// Whether UDP port `port` of `addr` is free: a socket is bound to it and closed at once.
/// Without device binding, so it collides with another program's socket on the address or
/// the wildcard, tied to an interface or not. The error says who holds it, or that the
/// gateway address of `domain` is not on the host.
fn probe_free(addr: Ipv4Addr, port: u16, domain: DomainId) -> io::Result<()> {
    match UdpSocket::bind(SocketAddrV4::new(addr, port)) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AddrNotAvailable => Err(not_on_host(e, addr, domain)),
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => Err(io::Error::new(
            e.kind(),
            format!("another program's UDP socket holds port {port} on {addr} or on all addresses (ss -ulpn 'sport = :{port}' names it): {e}"),
        )),
        Err(e) => Err(e),
    }
}

/// A bind to a domain's gateway address that failed because no interface of this network
/// namespace has that address (EADDRNOTAVAIL): says so, with the address and the domain
/// (every port of the domain fails the same way until it is configured). Other errors as
/// they are.
fn not_on_host(e: io::Error, addr: Ipv4Addr, domain: DomainId) -> io::Error {
    if e.kind() != io::ErrorKind::AddrNotAvailable {
        return e;
    }
    io::Error::new(
        e.kind(),
        format!("the gateway address {addr} of domain {domain} is not configured on this host (network namespace): add it to the domain's interface (ip addr add {addr}/<prefix> dev <interface>); {e}"),
    )
}

/// Whether the kernel may hand ports of `ranges` (inclusive) to other programs' ephemeral
/// sockets in this network namespace: `Some(advice)` naming the ports of a range that lie
/// inside `net.ipv4.ip_local_port_range` and are not in `net.ipv4.ip_local_reserved_ports`,
/// with the command that reserves them; `None` when every port is safe (or the files cannot
/// be read). With [`PortHold::Reserved`] nothing else stops the kernel from giving such a
/// port to another program's `connect()` or `bind(0)`.
pub fn reserved_ports_advice(ranges: &[(u16, u16)]) -> Option<String> {
    let eph = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let reserved = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_reserved_ports").ok()?;
    advice_for(ranges, &eph, &reserved)
}

/// Adds `ranges` (inclusive) to `net.ipv4.ip_local_reserved_ports` of this network
/// namespace, keeping what it holds: `Ok(Some(list written))`, `Ok(None)` when every port was
/// reserved already.
pub fn reserve_ranges(ranges: &[(u16, u16)]) -> io::Result<Option<String>> {
    const FILE: &str = "/proc/sys/net/ipv4/ip_local_reserved_ports";
    let held = std::fs::read_to_string(FILE)?;
    let Some(list) = reserved_with(&held, ranges) else {
        return Ok(None);
    };
    std::fs::write(FILE, &list)?;
    Ok(Some(list))
}

/// `held` (the sysctl's comma-separated ports and ranges) plus `ranges`, or `None` when it
/// covers them already.
fn reserved_with(held: &str, ranges: &[(u16, u16)]) -> Option<String> {
    let held: Vec<(u16, u16)> = parse_port_list(held);
    let covered =
        |(a, b): &(u16, u16)| (*a..=*b).all(|p| held.iter().any(|(x, y)| (*x..=*y).contains(&p)));
    if ranges.iter().all(covered) {
        return None;
    }
    let mut missing: Vec<(u16, u16)> = Vec::new();
    for r in ranges.iter().filter(|r| !covered(r)) {
        // Both domains may share one range: written once.
        if !missing.contains(r) {
            missing.push(*r);
        }
    }
    let list: Vec<String> = held
        .iter()
        .chain(missing.iter())
        .map(|(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect();
    Some(list.join(","))
}

fn parse_port_list(list: &str) -> Vec<(u16, u16)> {
    list.trim()
        .split(',')
        .filter(|p| !p.trim().is_empty())
        .filter_map(|p| match p.split_once('-') {
            Some((a, b)) => Some((a.trim().parse().ok()?, b.trim().parse().ok()?)),
            None => p.trim().parse().ok().map(|a| (a, a)),
        })
        .collect()
}

fn advice_for(ranges: &[(u16, u16)], eph: &str, reserved: &str) -> Option<String> {
    let mut it = eph.split_whitespace().filter_map(|w| w.parse::<u16>().ok());
    let (lo, hi) = (it.next()?, it.next()?);
    let held = parse_port_list(reserved);
    let exposed = |port: u16| {
        (lo..=hi).contains(&port) && !held.iter().any(|(a, b)| (*a..=*b).contains(&port))
    };
    let bad: Vec<(u16, u16)> = ranges
        .iter()
        .filter(|(a, b)| (*a..=*b).any(exposed))
        .copied()
        .collect();
    if bad.is_empty() {
        return None;
    }
    let mut list: Vec<String> = ranges.iter().map(|(a, b)| format!("{a}-{b}")).collect();
    list.dedup(); // both domains on one range
    let mut want: Vec<String> = held.iter().map(|(a, b)| format!("{a}-{b}")).collect();
    want.extend(list.iter().cloned());
    Some(format!(
        "media port range(s) {} overlap the kernel's ephemeral ports {lo}-{hi} and are not in net.ipv4.ip_local_reserved_ports: another program's connect() or bind(0) may get one of them and send from the gateway's port. Reserve them in this network namespace: sysctl -w net.ipv4.ip_local_reserved_ports={} (and in /etc/sysctl.d, see docs/operations.md)",
        bad.iter().map(|(a, b)| format!("{a}-{b}")).collect::<Vec<_>>().join(","),
        want.join(",")
    ))
}

/// Ties `sock` to `interface` (`SO_BINDTODEVICE`); the error names the interface, the
/// domain and what to do.
pub fn bind_to_device<F: AsFd>(sock: &F, interface: &str, domain: DomainId) -> io::Result<()> {
    crate::iface::bind_to_device(sock, interface).map_err(|e| {
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
    fn reserved_ports_advice_names_the_exposed_ranges() {
        let eph = "32768\t60999\n";
        assert_eq!(advice_for(&[(20000, 20999)], eph, "\n"), None, "below");
        let a = advice_for(&[(40000, 40999), (20000, 20099)], eph, "\n").expect("exposed");
        assert!(a.contains("40000-40999 overlap"), "{a}");
        assert!(
            a.contains("ip_local_reserved_ports=40000-40999,20000-20099"),
            "{a}"
        );
        assert_eq!(
            advice_for(&[(40000, 40999)], eph, "5060,39000-41000\n"),
            None,
            "reserved"
        );
        let partly = advice_for(&[(40000, 40999)], eph, "40000-40500\n").expect("partly");
        assert!(
            partly.contains("ip_local_reserved_ports=40000-40500,40000-40999"),
            "{partly}"
        );
    }

    /// A domain address missing from the host fails every port the same way: the error says
    /// which address of which domain to configure.
    #[test]
    fn a_gateway_address_missing_from_the_host_is_named() {
        // TEST-NET-1: on no interface here.
        let addr = Ipv4Addr::new(192, 0, 2, 77);
        let e = probe_free(addr, 40000, DomainId::B).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrNotAvailable);
        let m = e.to_string();
        assert!(
            m.contains("192.0.2.77 of domain") && m.contains("not configured on this host"),
            "{m}"
        );
        assert!(probe_free(Ipv4Addr::LOCALHOST, 0, DomainId::A).is_ok());
    }

    #[test]
    fn reserving_keeps_what_the_list_holds() {
        assert_eq!(
            reserved_with("\n", &[(40000, 40999)]).as_deref(),
            Some("40000-40999")
        );
        assert_eq!(
            reserved_with("5060,39000-40500\n", &[(40000, 40999), (20000, 20099)]).as_deref(),
            Some("5060,39000-40500,40000-40999,20000-20099")
        );
        assert_eq!(reserved_with("5060,39000-41000\n", &[(40000, 40999)]), None);
        assert_eq!(
            reserved_with("5060\n", &[(40000, 40999), (40000, 40999)]).as_deref(),
            Some("5060,40000-40999"),
            "a range both domains share is written once"
        );
    }

    #[test]
    fn reserved_registry_opens_no_socket_per_port() {
        let reg = PortRegistry::new([Ipv4Addr::LOCALHOST, Ipv4Addr::new(127, 0, 0, 2)]);
        // Raw sockets need CAP_NET_RAW: without it this part cannot run.
        let Ok(reg) = reg.holding(PortHold::Reserved) else {
            crate::test_did_not_run(
                "reserved_registry_opens_no_socket_per_port",
                "no CAP_NET_RAW",
            );
            return;
        };
        let links = reg.attach_workers(1).unwrap();
        // A port another program holds is refused, on the address or the wildcard.
        for holder in [Ipv4Addr::LOCALHOST, Ipv4Addr::UNSPECIFIED] {
            let taken = UdpSocket::bind((holder, 0)).unwrap();
            let port = taken.local_addr().unwrap().port();
            let e = reg.open_port(DomainId::A, port).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::AddrInUse, "{holder}: {e}");
            assert!(
                e.to_string().contains("another program's UDP socket"),
                "{e}"
            );
            drop(taken);
            reg.open_port(DomainId::A, port).unwrap();
            reg.close_port(DomainId::A, port);
        }
        let port = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        reg.open_port(DomainId::A, port).unwrap();
        assert!(links[0].cmds.try_recv().is_err(), "no socket announced");
        assert!(matches!(
            reg.port_tx(DomainId::A, port),
            Some(PortTx::Raw(_, p)) if p == port
        ));
        // The port stays free for the kernel: binding it here works.
        let other = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let sink = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        sink.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let dest = match sink.local_addr().unwrap() {
            std::net::SocketAddr::V4(a) => a,
            _ => unreachable!(),
        };
        drop(other);
        let raw = reg.raw_senders().unwrap();
        let local = EgressSockets::with_raw(raw);
        let eg = local.egress(DomainId::A, port).unwrap();
        assert_eq!(eg.send_one(b"hello", dest).unwrap(), 5);
        let mut batch = super::super::sys::mmsg::SliceBatch::new(4);
        let mut scope = batch.scope();
        let data = [b"one".as_slice(), b"two-two", &[7u8; 1400]];
        for d in data {
            assert!(scope.push(d));
        }
        let out = eg.send(&mut scope, dest);
        assert_eq!((out.sent, out.sent_bytes), (3, 3 + 7 + 1400), "{out:?}");
        let mut buf = [0u8; 2048];
        for want in [b"hello".as_slice(), b"one", b"two-two", &[7u8; 1400]] {
            let (n, from) = sink.recv_from(&mut buf).unwrap();
            assert_eq!(&buf[..n], want);
            assert_eq!(
                from,
                std::net::SocketAddr::from((Ipv4Addr::LOCALHOST, port))
            );
        }
        reg.close_port(DomainId::A, port);
    }

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
