//! The face sockets: datagrams and TCP connections of this half's proxies toward the peer's
//! face address, framed onto the signaling connection, and the carried TCP streams
//! ([`Stream`]) in both directions.

use std::io::{ErrorKind, Read};
use std::net::{SocketAddrV4, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use nix::sys::epoll::{EpollEvent, EpollFlags};

use crate::signaling::split::frame::{Role, TCP_CHUNK};

use super::sock::{connect_from, v4, want_writable, write_pending};
use super::{Loop, BATCH, LISTENER_STREAM, MAX_OUT, MAX_STREAMS, MAX_STREAM_PENDING, T_STREAM};

/// A TCP stream carried over the link.
pub(super) struct Stream {
    sock: TcpStream,
    connected: bool,
    pending: Vec<u8>,
    /// The peer closed its end: close ours once `pending` is written.
    pub(super) closing: bool,
    want_out: bool,
}

pub(super) struct FaceUdp {
    pub(super) sock: UdpSocket,
    pub(super) announced: bool,
    pub(super) last_used: Instant,
}

impl Loop {
    pub(super) fn face_udp_readable(&mut self, port: u16) {
        for _ in 0..BATCH {
            let Some(f) = self.udp.get_mut(&port) else {
                return;
            };
            let (n, from) = match f.sock.recv_from(&mut self.buf) {
                Ok(r) => r,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return,
            };
            f.last_used = Instant::now();
            let Some(from) = v4(from).filter(|a| self.local_source(*a.ip())) else {
                self.stats.udp_dropped_source.fetch_add(1, Relaxed);
                continue;
            };
            if !self.peer_up {
                self.stats.udp_dropped_peer_down.fetch_add(1, Relaxed);
                continue;
            }
            let data = &self.buf[..n];
            let Some(c) = self.conns[0].as_mut() else {
                continue;
            };
            let Some(s) = c
                .sealer
                .as_mut()
                .filter(|_| c.authed && c.out.len() <= MAX_OUT)
            else {
                self.stats.udp_dropped_peer_down.fetch_add(1, Relaxed);
                continue;
            };
            s.udp(&mut c.out, from.port(), port, data);
            c.last_tx = Instant::now();
            self.stats.frames_out.fetch_add(1, Relaxed);
            self.stats.udp_out.fetch_add(1, Relaxed);
        }
    }

    fn stream_id(&mut self) -> u32 {
        let bit = if self.cfg.role == Role::Listener {
            LISTENER_STREAM
        } else {
            0
        };
        loop {
            let id = (self.next_stream & !LISTENER_STREAM) | bit;
            self.next_stream = self.next_stream.wrapping_add(1).max(1);
            if !self.streams.contains_key(&id) {
                return id;
            }
        }
    }

    fn add_stream(&mut self, id: u32, sock: TcpStream, connected: bool) -> bool {
        let flags = if connected {
            EpollFlags::EPOLLIN
        } else {
            EpollFlags::EPOLLIN | EpollFlags::EPOLLOUT
        };
        if self
            .epoll
            .add(
                sock.as_fd(),
                EpollEvent::new(flags, T_STREAM | u64::from(id)),
            )
            .is_err()
        {
            return false;
        }
        self.streams.insert(
            id,
            Stream {
                sock,
                connected,
                pending: Vec::new(),
                closing: false,
                want_out: !connected,
            },
        );
        self.stats.tcp_opened.fetch_add(1, Relaxed);
        true
    }

    pub(super) fn face_tcp_accept(&mut self, port: u16) {
        for _ in 0..BATCH {
            let Some(l) = self.tcp_listeners.get(&port) else {
                return;
            };
            let (s, from) = match l.accept() {
                Ok(r) => r,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return,
            };
            let Some(from) = v4(from).filter(|a| self.local_source(*a.ip())) else {
                self.stats.tcp_refused.fetch_add(1, Relaxed);
                continue;
            };
            if !self.peer_up
                || self.streams.len() >= MAX_STREAMS
                || s.set_nonblocking(true).is_err()
            {
                self.stats.tcp_refused.fetch_add(1, Relaxed);
                continue;
            }
            let _ = s.set_nodelay(true);
            let id = self.stream_id();
            if self.add_stream(id, s, true) {
                self.send_frame(|sl, out| sl.tcp_open(out, id, from.port(), port));
            }
        }
    }

    pub(super) fn open_stream(&mut self, id: u32, src: u16, dst: u16) {
        let from_listener = id & LISTENER_STREAM != 0;
        let ours = from_listener == (self.cfg.role == Role::Listener);
        if ours || self.streams.contains_key(&id) || self.streams.len() >= MAX_STREAMS {
            self.stats.tcp_refused.fetch_add(1, Relaxed);
            self.send_frame(|s, out| s.tcp_close(out, id));
            return;
        }
        let to = SocketAddrV4::new(self.cfg.own_face, dst);
        match connect_from(self.peer_face(src), to, &self.cfg.face_interface) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                if !self.add_stream(id, s, false) {
                    self.send_frame(|s, out| s.tcp_close(out, id));
                }
            }
            Err(_) => {
                self.stats.tcp_refused.fetch_add(1, Relaxed);
                self.send_frame(|s, out| s.tcp_close(out, id));
            }
        }
    }

    pub(super) fn stream_data(&mut self, id: u32, data: &[u8]) {
        let Some(s) = self.streams.get_mut(&id) else {
            self.stats.unknown_stream.fetch_add(1, Relaxed);
            return;
        };
        if s.pending.len() + data.len() > MAX_STREAM_PENDING {
            self.stats.tcp_overflow.fetch_add(1, Relaxed);
            self.close_stream(id, true);
            return;
        }
        s.pending.extend_from_slice(data);
    }

    /// Closes a stream; `tell` sends the peer a close for it.
    pub(super) fn close_stream(&mut self, id: u32, tell: bool) {
        if let Some(s) = self.streams.remove(&id) {
            let _ = self.epoll.delete(s.sock.as_fd());
            self.stats.tcp_closed.fetch_add(1, Relaxed);
            if tell {
                self.send_frame(|sl, out| sl.tcp_close(out, id));
            }
        }
    }

    pub(super) fn stream_event(&mut self, id: u32, flags: EpollFlags) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        if !s.connected {
            if flags.intersects(EpollFlags::EPOLLOUT | EpollFlags::EPOLLERR | EpollFlags::EPOLLHUP)
            {
                match s.sock.take_error() {
                    Ok(None) if !flags.contains(EpollFlags::EPOLLERR) => s.connected = true,
                    _ => {
                        self.stats.tcp_refused.fetch_add(1, Relaxed);
                        self.close_stream(id, true);
                        return;
                    }
                }
            } else {
                return;
            }
        }
        if !flags.intersects(EpollFlags::EPOLLIN | EpollFlags::EPOLLHUP | EpollFlags::EPOLLERR) {
            return;
        }
        for _ in 0..4 {
            let congested = self.conns[0]
                .as_ref()
                .is_none_or(|c| !c.authed || c.out.len() > MAX_OUT);
            let Some(s) = self.streams.get_mut(&id) else {
                return;
            };
            let n = match s.sock.read(&mut self.buf[..TCP_CHUNK]) {
                Ok(0) => {
                    self.close_stream(id, true);
                    return;
                }
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(_) => {
                    self.close_stream(id, true);
                    return;
                }
            };
            if congested {
                self.stats.tcp_overflow.fetch_add(1, Relaxed);
                self.close_stream(id, true);
                return;
            }
            let Some(c) = self.conns[0].as_mut() else {
                return;
            };
            if let Some(sl) = c.sealer.as_mut() {
                sl.tcp_data(&mut c.out, id, &self.buf[..n]);
                c.last_tx = Instant::now();
                self.stats.frames_out.fetch_add(1, Relaxed);
            }
        }
    }

    pub(super) fn flush_streams(&mut self) {
        let mut done = Vec::new();
        for (id, s) in self.streams.iter_mut() {
            if !s.connected {
                continue;
            }
            if write_pending(&mut s.sock, &mut s.pending).is_err() {
                done.push((*id, true));
                continue;
            }
            if s.closing && s.pending.is_empty() {
                let _ = s.sock.shutdown(std::net::Shutdown::Both);
                done.push((*id, false));
                continue;
            }
            let want = !s.pending.is_empty();
            want_writable(
                &self.epoll,
                &s.sock,
                T_STREAM | u64::from(*id),
                want,
                &mut s.want_out,
            );
        }
        for (id, tell) in done {
            self.close_stream(id, tell);
        }
    }
}
