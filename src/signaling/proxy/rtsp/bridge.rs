//! Bridge legs: one track whose media is interleaved (`$` frames) on one RTSP connection and
//! plain UDP on the other side.
//!
//! A leg is two UDP sockets (RTP, RTCP) at the gateway's address in the domain of the TCP
//! side, tied to that domain's interface, and one thread. The track's stream routes treat
//! the leg's sockets as the peer of that side, so the media still crosses on the one-way
//! channels of the engine:
//!
//! - **UDP to TCP**: the engine forwards the far side's datagrams to the leg's sockets (the
//!   routes' destination); the leg thread reads them and writes each as one
//!   `$ channel length payload` frame to the RTSP connection, under the connection's writer
//!   lock so frames never split an RTSP message. The write never waits: a peer that does
//!   not read fills its socket buffer, and frames that find it full are dropped and
//!   counted as `stalls` (a frame half written is finished first, so the stream stays in
//!   step). Memory stays bounded by the kernel's buffers.
//! - **TCP to UDP**: the connection's reader de-frames `$` frames on the leg's channels and
//!   calls [`Leg::inject`]: the payload leaves the leg's socket for the gateway port the
//!   track's route listens on (its ingress), where the engine takes it like any datagram
//!   (source validation, counters, the one-way channel). Never blocks: a full socket
//!   buffer drops the frame, counted.
//!
//! The local hop is delivered by the kernel to the engine's sockets, so a leg works with
//! the `stack` engine (the ring engines capture on the NIC and never see it); the proxy
//! answers `461` when it cannot bridge (see the module doc of the proxy).
//!
//! Owns: the leg's sockets, its thread and its counters. Does not own: the routes (the
//! exchange installs them), the connection (the writer is lent).

use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::logic::{Events, LegSpec, TcpSide};

/// A connection writer shared between the RTSP replies and the legs (`None` before the
/// upstream connection exists).
pub type SharedWriter = Arc<Mutex<Option<TcpStream>>>;

/// Datagrams one socket may give the leg thread per wake-up before the other is served.
const BATCH: usize = 64;
/// How long the leg thread waits for a datagram before looking at its stop flag.
const POLL_MS: u16 = 250;
/// Largest payload of one `$` frame (a 16-bit length).
const MAX_FRAME: usize = 65_535;

/// Counters of one leg.
#[derive(Debug, Default)]
pub struct LegCounters {
    /// Datagrams written as `$` frames to the TCP side, and their payload bytes.
    pub to_tcp_frames: AtomicU64,
    pub to_tcp_bytes: AtomicU64,
    /// `$` frames sent on as datagrams to the UDP side, and their payload bytes.
    pub from_tcp_frames: AtomicU64,
    pub from_tcp_bytes: AtomicU64,
    /// Frames dropped because the TCP peer did not take them (its socket buffer full).
    pub stalls: AtomicU64,
    /// Frames dropped because a socket refused them (TCP side gone, UDP buffer full).
    pub dropped: AtomicU64,
}

/// One running leg.
pub struct Leg {
    pub spec: LegSpec,
    sockets: [UdpSocket; 2],
    /// Where frames from the TCP side go: the gateway's ingress ports of the track.
    targets: [SocketAddrV4; 2],
    pub counters: Arc<LegCounters>,
    events: Arc<Events>,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Leg {
    /// Binds the leg's sockets at `address` (the gateway's, in `spec.domain`) tied to
    /// `interface`, and starts its thread writing to `writer`.
    pub fn open(
        spec: LegSpec,
        address: Ipv4Addr,
        interface: &str,
        writer: SharedWriter,
        events: Arc<Events>,
    ) -> io::Result<Arc<Leg>> {
        let bind = || -> io::Result<UdpSocket> {
            let s = UdpSocket::bind(SocketAddrV4::new(address, 0))?;
            nix::sys::socket::setsockopt(
                &s,
                nix::sys::socket::sockopt::BindToDevice,
                &std::ffi::OsString::from(interface),
            )
            .map_err(io::Error::from)?;
            s.set_nonblocking(true)?;
            Ok(s)
        };
        let sockets = [bind()?, bind()?];
        let targets = [
            SocketAddrV4::new(address, spec.inject[0]),
            SocketAddrV4::new(address, spec.inject[1]),
        ];
        let leg = Arc::new(Leg {
            spec,
            sockets,
            targets,
            counters: Arc::new(LegCounters::default()),
            events,
            stop: Arc::new(AtomicBool::new(false)),
            thread: Mutex::new(None),
        });
        let run = Arc::clone(&leg);
        let handle = std::thread::Builder::new()
            .name("rtsp-bridge".into())
            .spawn(move || run.run(&writer))?;
        *lock(&leg.thread) = Some(handle);
        leg.events.bridge_legs.fetch_add(1, Relaxed);
        Ok(leg)
    }

    /// The leg's local ports (RTP, RTCP): the peer of the UDP side's routes.
    pub fn ports(&self) -> [u16; 2] {
        let port = |s: &UdpSocket| match s.local_addr() {
            Ok(a) => a.port(),
            Err(_) => 0,
        };
        [port(&self.sockets[0]), port(&self.sockets[1])]
    }

    /// Whether `$` frames on `channel` of the connection on `side` belong to this leg.
    pub fn takes(&self, side: TcpSide, channel: u8) -> bool {
        self.spec.side == side
            && (channel == self.spec.channels.0 || channel == self.spec.channels.1)
    }

    /// A frame from the TCP side on one of the leg's channels: to the track's ingress port.
    /// Never blocks, never allocates.
    pub fn inject(&self, channel: u8, payload: &[u8]) {
        let i = usize::from(channel != self.spec.channels.0);
        let (Some(sock), Some(target)) = (self.sockets.get(i), self.targets.get(i)) else {
            return;
        };
        let c = &self.counters;
        match sock.send_to(payload, *target) {
            Ok(_) => {
                c.from_tcp_frames.fetch_add(1, Relaxed);
                c.from_tcp_bytes.fetch_add(payload.len() as u64, Relaxed);
                self.events.bridge_frames_to_udp.fetch_add(1, Relaxed);
                self.events
                    .bridge_bytes_to_udp
                    .fetch_add(payload.len() as u64, Relaxed);
            }
            Err(_) => {
                c.dropped.fetch_add(1, Relaxed);
                self.events.bridge_dropped.fetch_add(1, Relaxed);
            }
        }
    }

    /// Stops the thread and waits for it; the sockets close when the last `Arc` goes.
    pub fn close(&self) {
        self.stop.store(true, Relaxed);
        let handle = lock(&self.thread).take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }

    fn run(&self, writer: &SharedWriter) {
        // One buffer for the leg's life: a 4-byte `$` header, then the datagram.
        let mut buf = vec![0u8; 4 + MAX_FRAME];
        while !self.stop.load(Relaxed) {
            let mut fds = [
                nix::poll::PollFd::new(self.sockets[0].as_fd(), nix::poll::PollFlags::POLLIN),
                nix::poll::PollFd::new(self.sockets[1].as_fd(), nix::poll::PollFlags::POLLIN),
            ];
            match nix::poll::poll(&mut fds, POLL_MS) {
                Ok(0) => continue,
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => return,
            }
            for i in 0..2 {
                for _ in 0..BATCH {
                    let Some(sock) = self.sockets.get(i) else {
                        break;
                    };
                    let Some(body) = buf.get_mut(4..) else { break };
                    let n = match sock.recv_from(body) {
                        Ok((n, _)) => n,
                        Err(_) => break,
                    };
                    let channel = if i == 0 {
                        self.spec.channels.0
                    } else {
                        self.spec.channels.1
                    };
                    let len = (n.min(MAX_FRAME) as u16).to_be_bytes();
                    if let Some(head) = buf.get_mut(..4) {
                        head.copy_from_slice(&[b'$', channel, len[0], len[1]]);
                    }
                    self.write_frame(writer, buf.get(..4 + n).unwrap_or_default());
                }
            }
        }
    }

    /// Writes one whole frame or none of it.
    fn write_frame(&self, writer: &SharedWriter, frame: &[u8]) {
        let c = &self.counters;
        let payload = frame.len().saturating_sub(4) as u64;
        let mut w = lock(writer);
        let Some(stream) = w.as_mut() else {
            c.dropped.fetch_add(1, Relaxed);
            self.events.bridge_dropped.fetch_add(1, Relaxed);
            return;
        };
        let flags =
            nix::sys::socket::MsgFlags::MSG_DONTWAIT | nix::sys::socket::MsgFlags::MSG_NOSIGNAL;
        let sent = loop {
            match nix::sys::socket::send(stream.as_raw_fd(), frame, flags) {
                Err(nix::errno::Errno::EINTR) => continue,
                r => break r,
            }
        };
        match sent {
            Ok(n) if n == frame.len() => {}
            Ok(n) => {
                // Half a frame is out: the rest must follow before anything else, waiting
                // at most the writer's timeout.
                if stream
                    .write_all(frame.get(n..).unwrap_or_default())
                    .is_err()
                {
                    c.dropped.fetch_add(1, Relaxed);
                    self.events.bridge_dropped.fetch_add(1, Relaxed);
                    return;
                }
            }
            Err(nix::errno::Errno::EAGAIN) => {
                c.stalls.fetch_add(1, Relaxed);
                self.events.bridge_stalls.fetch_add(1, Relaxed);
                return;
            }
            Err(_) => {
                c.dropped.fetch_add(1, Relaxed);
                self.events.bridge_dropped.fetch_add(1, Relaxed);
                return;
            }
        }
        drop(w);
        c.to_tcp_frames.fetch_add(1, Relaxed);
        c.to_tcp_bytes.fetch_add(payload, Relaxed);
        self.events.bridge_frames_to_tcp.fetch_add(1, Relaxed);
        self.events.bridge_bytes_to_tcp.fetch_add(payload, Relaxed);
    }
}

impl Drop for Leg {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
