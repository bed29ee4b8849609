//! Socket helpers of the agent: binding to the interface, a non-blocking connect from a
//! chosen address, writing what a socket takes now, epoll writability on demand, and the
//! random numbers the handshake needs.

use std::io::{ErrorKind, Write};
use std::net::{SocketAddr, SocketAddrV4, TcpStream};
use std::os::fd::{AsFd, AsRawFd};

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollEvent, EpollFlags};
use nix::sys::socket::{self, sockopt, AddressFamily, SockFlag, SockType, SockaddrIn};

pub(super) fn random<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    if getrandom::fill(&mut b).is_err() {
        // No entropy source at all: the kernel is broken; a predictable nonce would let a
        // recorded connection be replayed, so refuse to go on.
        panic!("getrandom failed: the kernel offers no random numbers");
    }
    b
}

pub(super) fn v4(a: SocketAddr) -> Option<SocketAddrV4> {
    match a {
        SocketAddr::V4(a) => Some(a),
        SocketAddr::V6(_) => None,
    }
}

/// Ties a socket to its interface (`SO_BINDTODEVICE`; empty: not tied, for the loopback
/// tests). A socket that cannot be tied is not used: it would also see packets for its
/// address arriving on another interface (isolation never degrades quietly).
pub(super) fn bind_device<F: AsFd>(sock: &F, interface: &str, what: &str) -> std::io::Result<()> {
    if interface.is_empty() {
        return Ok(());
    }
    crate::iface::bind_to_device(sock, interface).map_err(|e| {
        std::io::Error::other(format!(
            "cannot tie the split {what} socket to interface {interface:?} (SO_BINDTODEVICE: {e}); check the interface name and that vgate has CAP_NET_RAW"
        ))
    })
}

/// A non-blocking socket bound to `from` (port 0: any), connecting to `to`.
pub(in crate::signaling::split) fn connect_from(
    from: SocketAddrV4,
    to: SocketAddrV4,
    interface: &str,
) -> std::io::Result<TcpStream> {
    let fd = socket::socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    socket::setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    bind_device(&fd, interface, "signaling")?;
    if socket::bind(fd.as_raw_fd(), &SockaddrIn::from(from)).is_err() && from.port() != 0 {
        socket::bind(
            fd.as_raw_fd(),
            &SockaddrIn::from(SocketAddrV4::new(*from.ip(), 0)),
        )?;
    }
    match socket::connect(fd.as_raw_fd(), &SockaddrIn::from(to)) {
        Ok(()) | Err(Errno::EINPROGRESS) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(TcpStream::from(fd))
}

/// Writes as much of `buf` as the socket takes now: the bytes written, or `Err` when the
/// connection is gone.
pub(super) fn write_pending(sock: &mut TcpStream, buf: &mut Vec<u8>) -> Result<usize, ()> {
    let mut total = 0;
    while !buf.is_empty() {
        match sock.write(buf) {
            Ok(0) => return Err(()),
            Ok(n) => {
                buf.drain(..n);
                total += n;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(_) => return Err(()),
        }
    }
    Ok(total)
}

/// Asks epoll for writability of `sock` only while it has something to write.
pub(super) fn want_writable(
    epoll: &Epoll,
    sock: &TcpStream,
    token: u64,
    want: bool,
    current: &mut bool,
) {
    if want != *current {
        *current = want;
        let mut flags = EpollFlags::EPOLLIN;
        if want {
            flags |= EpollFlags::EPOLLOUT;
        }
        let _ = epoll.modify(sock.as_fd(), &mut EpollEvent::new(flags, token));
    }
}
