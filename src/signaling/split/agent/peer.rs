//! What a frame from the peer does here: announcements open the face sockets the peer's
//! proxies listen on, datagrams go out from the face socket of their source port (a mirror
//! opened on demand), stream frames go to their carried TCP stream.

use std::collections::HashSet;
use std::net::{SocketAddrV4, TcpListener, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use nix::sys::epoll::{EpollEvent, EpollFlags};

use crate::signaling::split::frame::Frame;

use super::sock::bind_device;
use super::{FaceUdp, Loop, MAX_FACE_UDP, T_TCPL, T_UDP};

impl Loop {
    pub(super) fn on_frame(&mut self, _slot: usize, frame: Frame<'_>) {
        match frame {
            Frame::Announce { udp, tcp } => self.apply_announce(&udp, &tcp),
            Frame::Heartbeat => {
                self.stats.heartbeats_in.fetch_add(1, Relaxed);
            }
            Frame::Udp { src, dst, data } => self.deliver_udp(src, dst, data),
            Frame::TcpOpen { id, src, dst } => self.open_stream(id, src, dst),
            Frame::TcpData { id, data } => self.stream_data(id, data),
            Frame::TcpClose { id } => {
                if let Some(s) = self.streams.get_mut(&id) {
                    s.closing = true;
                } else {
                    self.stats.unknown_stream.fetch_add(1, Relaxed);
                }
            }
            Frame::Goodbye => {
                tracing::warn!("split signaling link: the peer half is stopping");
                self.close_conn(0);
                self.next_dial = Instant::now() + self.retry();
                if !self.lost {
                    self.lose_peer("the peer half stopped");
                }
            }
        }
    }

    /// Whether a datagram or connection on a face socket comes from this host's side of the
    /// link face: the own face address, or another loopback address (a proxy's outgoing TCP
    /// connection is not bound, so the kernel picks 127.0.0.1). Nothing from outside the
    /// host can reach a loopback address.
    pub(super) fn local_source(&self, ip: std::net::Ipv4Addr) -> bool {
        ip == self.cfg.own_face || (ip.is_loopback() && self.cfg.own_face.is_loopback())
    }

    pub(super) fn peer_face(&self, port: u16) -> SocketAddrV4 {
        SocketAddrV4::new(self.cfg.peer_face, port)
    }

    fn open_face_udp(&mut self, port: u16, announced: bool) -> bool {
        if let Some(f) = self.udp.get_mut(&port) {
            f.announced |= announced;
            return true;
        }
        if self.udp.len() >= MAX_FACE_UDP {
            return false;
        }
        let sock = match UdpSocket::bind(self.peer_face(port)).and_then(|s| {
            bind_device(&s, &self.cfg.face_interface, "face")?;
            Ok(s)
        }) {
            Ok(s) => s,
            Err(e) => {
                self.stats.bind_errors.fetch_add(1, Relaxed);
                static LOG: crate::logging::RateLimit = crate::logging::RateLimit::new(10_000);
                if let Some(suppressed) = LOG.check(crate::clock::now_ms()) {
                    tracing::warn!(
                        port,
                        suppressed,
                        "split: cannot open UDP port {port} on the peer's face address ({e})"
                    );
                }
                return false;
            }
        };
        let _ = sock.set_nonblocking(true);
        if self
            .epoll
            .add(
                sock.as_fd(),
                EpollEvent::new(EpollFlags::EPOLLIN, T_UDP | u64::from(port)),
            )
            .is_err()
        {
            return false;
        }
        self.udp.insert(
            port,
            FaceUdp {
                sock,
                announced,
                last_used: Instant::now(),
            },
        );
        true
    }

    fn apply_announce(&mut self, udp: &[u16], tcp: &[u16]) {
        let udp_set: HashSet<u16> = udp.iter().copied().collect();
        for f in self.udp.iter_mut() {
            if !udp_set.contains(f.0) {
                f.1.announced = false;
            }
        }
        for &p in udp {
            if !self.open_face_udp(p, true) && self.udp.len() >= MAX_FACE_UDP {
                self.stats.mirror_full.fetch_add(1, Relaxed);
            }
        }
        let tcp_set: HashSet<u16> = tcp.iter().copied().collect();
        self.tcp_listeners.retain(|p, _| tcp_set.contains(p));
        for &p in tcp {
            if self.tcp_listeners.contains_key(&p) {
                continue;
            }
            match TcpListener::bind(self.peer_face(p)).and_then(|l| {
                bind_device(&l, &self.cfg.face_interface, "face")?;
                Ok(l)
            }) {
                Ok(l) => {
                    let _ = l.set_nonblocking(true);
                    if self
                        .epoll
                        .add(
                            l.as_fd(),
                            EpollEvent::new(EpollFlags::EPOLLIN, T_TCPL | u64::from(p)),
                        )
                        .is_ok()
                    {
                        self.tcp_listeners.insert(p, l);
                    }
                }
                Err(e) => {
                    self.stats.bind_errors.fetch_add(1, Relaxed);
                    tracing::warn!(
                        port = p,
                        "split: cannot listen on TCP port {p} of the peer's face address ({e})"
                    );
                }
            }
        }
        tracing::info!(udp = ?udp, tcp = ?tcp, "split signaling link: the peer's proxies listen on these face ports");
    }

    fn deliver_udp(&mut self, src: u16, dst: u16, data: &[u8]) {
        if !self.open_face_udp(src, false) {
            self.stats.mirror_full.fetch_add(1, Relaxed);
            return;
        }
        let to = SocketAddrV4::new(self.cfg.own_face, dst);
        if let Some(f) = self.udp.get_mut(&src) {
            f.last_used = Instant::now();
            match f.sock.send_to(data, to) {
                Ok(_) => self.stats.udp_in.fetch_add(1, Relaxed),
                Err(_) => self.stats.udp_send_errors.fetch_add(1, Relaxed),
            };
        }
    }
}
