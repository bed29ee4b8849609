//! The raw IPv4/UDP socket of [`super::SliceScope::send_raw_udp`]: opened with a drop-all
//! filter and drained, and one-datagram sends through it.

use super::sockaddr_v4;
use crate::engine::sys::afpacket;
use std::io;
use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// Opens a raw IPv4 socket of protocol UDP for [`SliceScope::send_raw_udp`]: bound to `src`
/// (the source address of everything it sends), non-blocking, with a [`RAW_SNDBUF`] send
/// buffer (`SO_SNDBUFFORCE`, past `net.core.wmem_max`, where the process has CAP_NET_ADMIN;
/// else `SO_SNDBUF`, capped there; the size obtained is logged once): one such socket
/// carries every fallback route of a worker, or every stream leg of a domain. It never
/// receives: the kernel hands it a copy of every UDP datagram delivered locally to `src`
/// (signaling included), so a filter that drops everything is attached, what was queued
/// before the filter is drained (as libpcap does), and the receive buffer is kept at its
/// minimum. Needs CAP_NET_RAW.
pub fn raw_udp_socket(src: Ipv4Addr) -> io::Result<OwnedFd> {
    raw_udp_socket_with(src, |_| {})
}

/// Send buffer asked for by [`raw_udp_socket`].
pub const RAW_SNDBUF: libc::c_int = 4 << 20;

static RAW_SNDBUF_SAID: std::sync::Once = std::sync::Once::new();

/// [`raw_udp_socket`], calling `before_filter` between `socket()` and the filter (tests).
pub(super) fn raw_udp_socket_with(
    src: Ipv4Addr,
    before_filter: impl FnOnce(BorrowedFd<'_>),
) -> io::Result<OwnedFd> {
    // SAFETY:
    // - plain socket(2) call with constant arguments; the result is checked.
    let fd = unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            libc::IPPROTO_UDP,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY:
    // - `fd` was just returned by socket(2) and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    before_filter(fd.as_fd());
    // `ret #0`: accept no byte of any packet.
    let mut drop_all = [libc::sock_filter {
        code: 0x06,
        jt: 0,
        jf: 0,
        k: 0,
    }];
    let prog = libc::sock_fprog {
        len: 1,
        filter: drop_all.as_mut_ptr(),
    };
    afpacket::set_opt(fd.as_fd(), libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &prog)?;
    // What arrived between socket() and the filter is queued still and would stay so for
    // the socket's life (nothing reads it): drop it now.
    drain(fd.as_fd());
    let rcvbuf: libc::c_int = 0; // the kernel raises it to its minimum
    afpacket::set_opt(fd.as_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, &rcvbuf)?;
    if afpacket::set_opt(
        fd.as_fd(),
        libc::SOL_SOCKET,
        libc::SO_SNDBUFFORCE,
        &RAW_SNDBUF,
    )
    .is_err()
    {
        // Without CAP_NET_ADMIN: as much as net.core.wmem_max allows.
        let _ = afpacket::set_opt(fd.as_fd(), libc::SOL_SOCKET, libc::SO_SNDBUF, &RAW_SNDBUF);
    }
    RAW_SNDBUF_SAID.call_once(|| {
        match nix::sys::socket::getsockopt(&fd, nix::sys::socket::sockopt::SndBuf) {
            Ok(got) if got < RAW_SNDBUF as usize => tracing::warn!(
                "raw send sockets got a {got}-byte send buffer ({RAW_SNDBUF} asked for; SO_SNDBUFFORCE needs CAP_NET_ADMIN, else net.core.wmem_max caps it): a worker's fallback routes share it, a burst may find it full"
            ),
            Ok(got) => tracing::info!("raw send sockets: {got}-byte send buffer"),
            Err(e) => tracing::warn!("raw send sockets: cannot read the send buffer size: {e}"),
        }
    });
    let sa = sockaddr_v4(SocketAddrV4::new(src, 0));
    // SAFETY:
    // - `sa` is a valid sockaddr_in on our stack and its size is passed with it.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sa as *const libc::sockaddr_in).cast(),
            size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Reads and discards what `fd`'s receive queue holds, without waiting, until it is empty.
fn drain(fd: BorrowedFd<'_>) {
    let mut buf = [0u8; 1];
    loop {
        // SAFETY:
        // - `buf` is a live, writable buffer of the length passed; the kernel writes at most
        //   that many bytes (the rest of a longer datagram is discarded, MSG_TRUNC semantics).
        let r = unsafe {
            libc::recv(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if r < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            // EAGAIN: empty (any other error: nothing more to read either).
            return;
        }
    }
}

/// Sends one UDP datagram `src` → `dest` through a raw socket of [`raw_udp_socket`] (the
/// one-off form of [`SliceScope::send_raw_udp`]); returns the payload bytes sent.
pub fn send_raw_udp_one(
    fd: BorrowedFd<'_>,
    src: SocketAddrV4,
    dest: SocketAddrV4,
    payload: &[u8],
) -> io::Result<usize> {
    let mut udp = crate::wire::udp_header(src, dest, payload);
    let mut iov = [
        libc::iovec {
            iov_base: udp.as_mut_ptr().cast(),
            iov_len: 8,
        },
        libc::iovec {
            iov_base: payload.as_ptr() as *mut libc::c_void,
            iov_len: payload.len(),
        },
    ];
    let mut sa = sockaddr_v4(dest);
    // SAFETY:
    // - msghdr is plain old data; all-zero is valid (no name, no iovecs, no control).
    let mut h: libc::msghdr = unsafe { zeroed() };
    h.msg_name = (&mut sa as *mut libc::sockaddr_in).cast();
    h.msg_namelen = size_of::<libc::sockaddr_in>() as libc::socklen_t;
    h.msg_iov = iov.as_mut_ptr();
    h.msg_iovlen = 2;
    loop {
        // SAFETY:
        // - `h` names `sa` and the two iovecs on this stack frame (the header and the
        //   borrowed payload), all live for the call; the kernel only reads them.
        let n = unsafe { libc::sendmsg(fd.as_raw_fd(), &h, libc::MSG_DONTWAIT) };
        if n >= 0 {
            return Ok((n as usize).saturating_sub(8));
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}
