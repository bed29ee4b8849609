//! Small RTP-over-TCP (RFC 4571) and RTP-over-UDP media peers for the GB/T 28181 TCP tests
//! (sipp cannot do RTP over TCP).
//!
//! Every flow sends RTP with consecutive sequence numbers every [`PACE`] and counts what it
//! receives per flow: packets, first and last sequence number. Loss is measured the RTP way,
//! between the first and the last packet a flow received, so packets dropped before the
//! gateway had a route (by design, counted there as `no_route`) are not loss, and nothing
//! hinges on when a call's routes appear.
//!
//! - [`tcp_server`]: listens (the SDP said `passive`); each accepted connection is a flow.
//! - [`tcp_connect`]: connects (the SDP said `active`) to a gateway port, then the same.
//! - [`udp_responder`]: a UDP peer that, for each gateway port it hears from, sends back to it
//!   (symmetric RTP), until that port falls silent.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One packet every 20 ms per flow: 50 packets/s.
pub const PACE: Duration = Duration::from_millis(20);
/// RTP payload bytes per packet (plus the 12-byte header).
pub const PAYLOAD: usize = 188;

/// What one flow received.
#[derive(Clone, Debug, Default)]
pub struct Flow {
    /// The far end (the gateway's address and port).
    pub peer: Option<SocketAddr>,
    pub received: u64,
    pub first: Option<u16>,
    pub last: u16,
    pub sent: u64,
    /// Bytes that were not a whole frame when the connection closed (TCP).
    pub trailing: usize,
    pub bad_frames: u64,
    /// When the first and the last packet arrived.
    pub span: Option<(Instant, Instant)>,
}

impl Flow {
    fn observe(&mut self, pkt: &[u8]) {
        if pkt.len() < 12 || pkt[0] >> 6 != 2 {
            self.bad_frames += 1;
            return;
        }
        let seq = u16::from_be_bytes([pkt[2], pkt[3]]);
        self.first.get_or_insert(seq);
        self.last = seq;
        let now = Instant::now();
        self.span = Some((self.span.map_or(now, |s| s.0), now));
        self.received += 1;
    }

    /// Time between the first and the last packet received.
    pub fn duration(&self) -> Duration {
        self.span.map_or(Duration::ZERO, |(a, b)| b - a)
    }

    /// Packets missing between the first and the last received.
    pub fn lost(&self) -> u64 {
        match self.first {
            Some(f) => (u64::from(self.last.wrapping_sub(f)) + 1).saturating_sub(self.received),
            None => 0,
        }
    }
}

/// Flows seen by one peer.
pub type Flows = Arc<Mutex<Vec<Flow>>>;

/// A new SSRC for each flow this process sends (flows are told apart by it).
fn next_ssrc() -> u32 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0x4571_0000);
    NEXT.fetch_add(1, Relaxed)
}

fn ssrc_of(pkt: &[u8]) -> Option<u32> {
    (pkt.len() >= 12).then(|| u32::from_be_bytes([pkt[8], pkt[9], pkt[10], pkt[11]]))
}

fn rtp(seq: u16, ssrc: u32, payload: usize) -> Vec<u8> {
    let mut p = vec![0u8; 12 + payload];
    p[0] = 0x80;
    p[1] = 96;
    p[2..4].copy_from_slice(&seq.to_be_bytes());
    p[4..8].copy_from_slice(&(u32::from(seq) * 3600).to_be_bytes());
    p[8..12].copy_from_slice(&ssrc.to_be_bytes());
    p
}

/// Runs one TCP flow: a writer sending framed RTP every [`PACE`] while the connection is up
/// (at most `max_send` packets) and a reader de-framing what comes back.
fn run_flow(s: TcpStream, stop: Arc<AtomicBool>, max_send: u64, flows: Flows, payload: usize) {
    let peer = s.peer_addr().ok();
    let mut w = s.try_clone().unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let done2 = Arc::clone(&done);
    let stop2 = Arc::clone(&stop);
    let writer = std::thread::spawn(move || {
        let mut sent = 0u64;
        let ssrc = next_ssrc();
        while sent < max_send && !done2.load(Relaxed) && !stop2.load(Relaxed) {
            let p = rtp(sent as u16, ssrc, payload);
            let mut f = (p.len() as u16).to_be_bytes().to_vec();
            f.extend_from_slice(&p);
            if w.write_all(&f).is_err() {
                break;
            }
            sent += 1;
            std::thread::sleep(PACE);
        }
        sent
    });
    let mut r = s;
    r.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut flow = Flow {
        peer,
        ..Flow::default()
    };
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        match r.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if stop.load(Relaxed) {
                    break;
                }
                continue;
            }
            Err(_) => break,
        }
        let mut at = 0;
        while buf.len() >= at + 2 {
            let len = usize::from(u16::from_be_bytes([buf[at], buf[at + 1]]));
            if buf.len() < at + 2 + len {
                break;
            }
            flow.observe(&buf[at + 2..at + 2 + len]);
            at += 2 + len;
        }
        buf.drain(..at);
    }
    done.store(true, Relaxed);
    flow.sent = writer.join().unwrap_or(0);
    flow.trailing = buf.len();
    flows.lock().unwrap().push(flow);
}

/// A TCP media peer listening at `addr` (call from inside its namespace); every accepted
/// connection is a flow sending at most `max_send` packets. Stops when `stop` is set.
pub fn tcp_server(addr: &str, stop: Arc<AtomicBool>, max_send: u64) -> (Flows, JoinHandle<()>) {
    tcp_server_sized(addr, stop, max_send, PAYLOAD)
}

/// [`tcp_server`] whose packets carry `payload` bytes after the RTP header (RFC 4571 allows
/// up to 65535 per frame; GB/T 28181 devices over TCP send PS packets of several KiB).
pub fn tcp_server_sized(
    addr: &str,
    stop: Arc<AtomicBool>,
    max_send: u64,
    payload: usize,
) -> (Flows, JoinHandle<()>) {
    let l = TcpListener::bind(addr).unwrap();
    l.set_nonblocking(true).unwrap();
    let flows: Flows = Arc::default();
    let f2 = Arc::clone(&flows);
    let h = std::thread::spawn(move || {
        let mut threads = Vec::new();
        while !stop.load(Relaxed) {
            match l.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(false).unwrap();
                    let (stop, flows) = (Arc::clone(&stop), Arc::clone(&f2));
                    threads.push(std::thread::spawn(move || {
                        run_flow(s, stop, max_send, flows, payload)
                    }));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        for t in threads {
            let _ = t.join();
        }
    });
    (flows, h)
}

/// Connects from `from_ip` to `to` (inside the caller's namespace) and runs one flow on its
/// own thread.
pub fn tcp_connect(
    from_ip: &str,
    to: SocketAddr,
    stop: Arc<AtomicBool>,
    max_send: u64,
    flows: Flows,
) -> Option<JoinHandle<()>> {
    let sock = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Stream,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .ok()?;
    let from: std::net::SocketAddrV4 = format!("{from_ip}:0").parse().ok()?;
    use std::os::fd::AsRawFd;
    nix::sys::socket::bind(sock.as_raw_fd(), &nix::sys::socket::SockaddrIn::from(from)).ok()?;
    let SocketAddr::V4(to4) = to else { return None };
    nix::sys::socket::connect(sock.as_raw_fd(), &nix::sys::socket::SockaddrIn::from(to4)).ok()?;
    let s = TcpStream::from(sock);
    Some(std::thread::spawn(move || {
        run_flow(s, stop, max_send, flows, PAYLOAD)
    }))
}

/// A UDP media peer at `addr`: every stream (SSRC) it hears is a flow; it sends back to the
/// gateway port that stream last came from, every [`PACE`] (at most `max_send` packets),
/// while that stream is alive (heard within 300 ms; a pause only pauses the reply, it never
/// splits the flow).
pub fn udp_responder(addr: &str, stop: Arc<AtomicBool>, max_send: u64) -> (Flows, JoinHandle<()>) {
    struct Live {
        flow: Flow,
        to: SocketAddr,
        heard: Instant,
        next: Instant,
        ssrc: u32,
    }
    let s = UdpSocket::bind(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(5))).unwrap();
    let flows: Flows = Arc::default();
    let f2 = Arc::clone(&flows);
    let h = std::thread::spawn(move || {
        let mut live: HashMap<u32, Live> = HashMap::new();
        let mut buf = vec![0u8; 65536];
        while !stop.load(Relaxed) {
            while let Ok((n, from)) = s.recv_from(&mut buf) {
                let now = Instant::now();
                let Some(key) = ssrc_of(&buf[..n]) else {
                    continue;
                };
                let e = live.entry(key).or_insert_with(|| Live {
                    flow: Flow {
                        peer: Some(from),
                        ..Flow::default()
                    },
                    to: from,
                    heard: now,
                    next: now,
                    ssrc: next_ssrc(),
                });
                e.flow.observe(&buf[..n]);
                if e.to != from {
                    e.flow.peer = Some(from);
                    e.to = from;
                }
                if now.duration_since(e.heard) > Duration::from_millis(300) {
                    e.next = now;
                }
                e.heard = now;
            }
            let now = Instant::now();
            for l in live.values_mut() {
                if now.duration_since(l.heard) > Duration::from_millis(300) {
                    continue;
                }
                if now >= l.next && l.flow.sent < max_send {
                    let _ = s.send_to(&rtp(l.flow.sent as u16, l.ssrc, PAYLOAD), l.to);
                    l.flow.sent += 1;
                    l.next += PACE;
                }
            }
        }
        f2.lock()
            .unwrap()
            .extend(live.into_values().map(|l| l.flow));
    });
    (flows, h)
}
