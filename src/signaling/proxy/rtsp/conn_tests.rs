//! One connection served end to end on loopback (domain A on 127.0.0.1, B on 127.0.0.2,
//! the real port registry): a real client socket, [`serve`], and a hand-written server
//! that serves UDP only, so vgate bridges the client's interleaved track. No engine runs:
//! the test offers media to the leg's sink itself, as an engine (or, in a split half, the
//! link receiver) would, at the moment it chooses — before the PLAY reply exists. What the
//! client sends on its channels leaves from vgate's A-side ports to the server's UDP
//! sockets (the test's).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::routes::legs::{LegInfo, LegState};
use crate::sink::EdgeSink;

/// The fake server: answers interleaved SETUPs 461 and UDP ones 200 with `server_port`
/// naming `media` (its RTP and RTCP ports); on PLAY it says so on `played` and answers only
/// when `go` gives the status line.
fn udp_only_server(
    played: mpsc::Sender<()>,
    go: mpsc::Receiver<&'static str>,
    media: (u16, u16),
) -> SocketAddrV4 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = match l.local_addr().unwrap() {
        std::net::SocketAddr::V4(a) => a,
        _ => unreachable!(),
    };
    std::thread::spawn(move || {
        let Ok((s, _)) = l.accept() else { return };
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut w = s;
        loop {
            let mut head = String::new();
            loop {
                let mut line = String::new();
                match r.read_line(&mut line) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => head.push_str(&line),
                }
                if line == "\r\n" {
                    break;
                }
            }
            let cseq = head
                .lines()
                .find_map(|l| l.strip_prefix("CSeq: "))
                .unwrap_or("0")
                .to_string();
            let transport = head
                .lines()
                .find_map(|l| l.strip_prefix("Transport: "))
                .unwrap_or("");
            let reply = if head.starts_with("SETUP ") && transport.contains("TCP") {
                format!("RTSP/1.0 461 Unsupported Transport\r\nCSeq: {cseq}\r\n\r\n")
            } else if head.starts_with("SETUP ") {
                format!("RTSP/1.0 200 OK\r\nCSeq: {cseq}\r\nTransport: {transport};server_port={}-{}\r\nSession: 77;timeout=60\r\n\r\n", media.0, media.1)
            } else if head.starts_with("PLAY ") {
                let _ = played.send(());
                let Ok(status) = go.recv() else { return };
                format!("RTSP/1.0 {status}\r\nCSeq: {cseq}\r\nSession: 77\r\n\r\n")
            } else {
                format!("RTSP/1.0 200 OK\r\nCSeq: {cseq}\r\nSession: 77\r\n\r\n")
            };
            if w.write_all(reply.as_bytes()).is_err() {
                return;
            }
        }
    });
    addr
}

/// A client socket on the domain-B address connected to a listener there, and the accepted
/// end `serve` takes.
fn client_pair() -> (TcpStream, TcpStream) {
    use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, SockaddrIn};
    use std::os::fd::AsRawFd;
    let l = TcpListener::bind("127.0.0.2:0").unwrap();
    let to = match l.local_addr().unwrap() {
        std::net::SocketAddr::V4(a) => a,
        _ => unreachable!(),
    };
    let fd = socket::socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    socket::bind(
        fd.as_raw_fd(),
        &SockaddrIn::from(SocketAddrV4::new([127, 0, 0, 2].into(), 0)),
    )
    .unwrap();
    socket::connect(fd.as_raw_fd(), &SockaddrIn::from(to)).unwrap();
    let client = TcpStream::from(fd);
    let (accepted, _) = l.accept().unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    (client, accepted)
}

struct Served {
    client: TcpStream,
    /// The server's RTP and RTCP sockets.
    server_media: (std::net::UdpSocket, std::net::UdpSocket),
    routes: Arc<Routes>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<EndReason>>,
    played: mpsc::Receiver<()>,
    go: mpsc::Sender<&'static str>,
}

impl Served {
    fn start() -> Served {
        let (played_tx, played) = mpsc::channel();
        let (go, go_rx) = mpsc::channel();
        // An even RTP port and the next one for RTCP, as servers give them.
        let (rtp, rtcp) = (0..100)
            .find_map(|_| {
                let rtp = std::net::UdpSocket::bind("127.0.0.1:0").ok()?;
                let port = rtp.local_addr().ok()?.port();
                let rtcp = std::net::UdpSocket::bind(("127.0.0.1", port.checked_add(1)?)).ok()?;
                (port % 2 == 0).then_some((rtp, rtcp))
            })
            .expect("a free port pair");
        for s in [&rtp, &rtcp] {
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        }
        let rtp_port = rtp.local_addr().unwrap().port();
        let rtcp_port = rtp_port + 1;
        let upstream = udp_only_server(played_tx, go_rx, (rtp_port, rtcp_port));
        // Port ranges of their own, apart from the other loopback tests'.
        let text = format!(
            "[domains.a]\ninterface = \"lo\"\naddress = \"127.0.0.1\"\nmedia_ports = \"44000-44199\"\n[domains.b]\ninterface = \"lo\"\naddress = \"127.0.0.2\"\nmedia_ports = \"44200-44399\"\n[security]\nsource_validation = \"strict\"\n[[signaling_route]]\nname = \"cam\"\ntype = \"rtsp\"\ntransport = \"tcp\"\nlisten_domain = \"b\"\nlisten_port = 8554\nupstream = \"{upstream}\"\n"
        );
        let cfg = crate::config::parse(&text, "test").unwrap();
        let registry = Arc::new(crate::engine::ports::PortRegistry::new([
            "127.0.0.1".parse().unwrap(),
            "127.0.0.2".parse().unwrap(),
        ]));
        let routes = Arc::new(Routes::new(
            &cfg,
            Arc::clone(&registry) as Arc<dyn crate::routes::PortHooks>,
        ));
        let legs = Arc::new(crate::edge::EdgeLegs::new(
            Arc::clone(&routes),
            Some(registry),
        ));
        let settings = Arc::new(super::super::settings(&cfg.signaling[0], &cfg).unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let ctx = ConnContext {
            settings,
            routes: Arc::clone(&routes),
            legs,
            stop: Arc::clone(&stop),
            media_timeout: 0,
        };
        let (client, accepted) = client_pair();
        let thread =
            std::thread::spawn(move || serve(accepted, 1, &ctx, Arc::new(ConnStatus::new())));
        Served {
            client,
            server_media: (rtp, rtcp),
            routes,
            stop,
            thread: Some(thread),
            played,
            go,
        }
    }

    fn send(&mut self, method: &str, cseq: u32, extra: &str) {
        let req = format!(
            "{method} rtsp://127.0.0.2:8554/cam1 RTSP/1.0\r\nCSeq: {cseq}\r\nSession: 77\r\n{extra}\r\n"
        );
        self.client.write_all(req.as_bytes()).unwrap();
    }

    /// The next bytes from vgate must be a whole RTSP reply head (no body in these): it is
    /// returned. A `$` frame first fails the test.
    fn reply(&mut self) -> String {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            self.client.read_exact(&mut byte).unwrap();
            assert!(
                !(head.is_empty() && byte[0] == b'$'),
                "an interleaved frame came before the reply"
            );
            head.push(byte[0]);
        }
        String::from_utf8(head).unwrap()
    }

    /// The next `n` `$` frames: (channel, payload).
    fn frames(&mut self, n: usize) -> Vec<(u8, Vec<u8>)> {
        let mut out = Vec::new();
        let mut head = [0u8; 4];
        while out.len() < n {
            self.client.read_exact(&mut head).unwrap();
            assert_eq!(head[0], b'$', "frames in step");
            let mut body = vec![0u8; usize::from(u16::from_be_bytes([head[2], head[3]]))];
            self.client.read_exact(&mut body).unwrap();
            out.push((head[1], body));
        }
        out
    }

    /// The bridged track's leg and the sink of its route toward the client (RTP).
    fn leg_and_sink(&self) -> (Arc<LegInfo>, Arc<EdgeSink>) {
        let legs = self.routes.legs.list();
        assert_eq!(legs.len(), 1, "one bridge leg");
        let sink = self
            .routes
            .routes()
            .into_iter()
            .find(|r| r.edge.is_some() && r.label.ends_with(":rtp"))
            .and_then(|r| r.edge.clone())
            .expect("the RTP route toward the client ends in the leg's sink");
        (Arc::clone(&legs[0]), sink)
    }

    /// SETUP (interleaved, bridged to the UDP-only server), then PLAY sent and seen by the
    /// server, its reply not yet given.
    fn setup_and_send_play(&mut self) {
        self.send(
            "SETUP",
            1,
            "Transport: RTP/AVP/TCP;unicast;interleaved=0-1\r\n",
        );
        let setup = self.reply();
        assert!(setup.starts_with("RTSP/1.0 200"), "{setup}");
        assert!(setup.contains("interleaved=0-1"), "bridged: {setup}");
        self.send("PLAY", 2, "Range: npt=0-\r\n");
        self.played
            .recv_timeout(Duration::from_secs(10))
            .expect("the PLAY reached the server");
    }

    /// Offers `n` RTP packets (sequence 0..n) to the sink, then waits until each is either
    /// written by the leg or queued in a held leg: the verdict never depends on how fast
    /// the leg's thread runs.
    fn offer_and_settle(&self, leg: &LegInfo, sink: &EdgeSink, n: u8) {
        for i in 0..n {
            assert!(sink.offer(&[0x80, 96, 0, i, 0, 0, 0, 0, 0, 0, 0, 1]));
        }
        let c = &leg.counters;
        let deadline = Instant::now() + Duration::from_secs(10);
        while !(c.frames_out.load(Relaxed) == u64::from(n)
            || (c.state() == LegState::Held && sink.len() == usize::from(n)))
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn end(mut self) -> EndReason {
        self.stop.store(true, Relaxed);
        let _ = self.client.shutdown(std::net::Shutdown::Both);
        let r = self.thread.take().unwrap().join().unwrap();
        assert!(self.routes.legs.is_empty(), "the leg closed");
        assert!(self.routes.routes().is_empty(), "the routes went back");
        r
    }
}

/// The defect of the split (media on a media link overtaking the PLAY reply on the
/// signaling link), made deterministic: the first packets reach the bridge leg while the
/// server has not answered the PLAY yet. The client must read the reply first, then those
/// packets as `$` frames, in order.
#[test]
fn media_offered_before_the_play_reply_reaches_the_client_after_it() {
    let mut s = Served::start();
    s.setup_and_send_play();
    let (leg, sink) = s.leg_and_sink();
    s.offer_and_settle(&leg, &sink, 5);
    assert_eq!(
        leg.counters.frames_out.load(Relaxed),
        0,
        "nothing may reach the client before the PLAY reply"
    );
    s.go.send("200 OK").unwrap();
    let play = s.reply();
    assert!(
        play.starts_with("RTSP/1.0 200") && play.contains("CSeq: 2\r\n"),
        "{play}"
    );
    let frames = s.frames(5);
    assert!(frames.iter().all(|f| f.0 == 0), "on the RTP channel");
    let seq: Vec<u8> = frames.iter().map(|f| f.1[3]).collect();
    assert_eq!(seq, [0, 1, 2, 3, 4], "every packet held, in order");
    assert_eq!(leg.counters.state(), LegState::Connected);
    // Media after the reply flows at once.
    assert!(sink.offer(&[0x80, 96, 0, 5, 0, 0, 0, 0, 0, 0, 0, 1]));
    assert_eq!(s.frames(1)[0].1[3], 5);
    s.end();
}

/// A PLAY the server refuses releases nothing: the leg stays held (its sink bounded) until
/// the connection ends and closes it, counting what it held.
#[test]
fn a_refused_play_leaves_the_leg_held_until_the_connection_ends() {
    let mut s = Served::start();
    s.setup_and_send_play();
    let (leg, sink) = s.leg_and_sink();
    s.offer_and_settle(&leg, &sink, 3);
    s.go.send("454 Session Not Found").unwrap();
    let play = s.reply();
    assert!(play.starts_with("RTSP/1.0 454"), "{play}");
    // A request after it: once its reply is read, the connection has finished acting on
    // the PLAY's (one exchange at a time).
    s.send("GET_PARAMETER", 3, "");
    let next = s.reply();
    assert!(next.contains("CSeq: 3\r\n"), "{next}");
    assert_eq!(leg.counters.state(), LegState::Held);
    assert_eq!(leg.counters.frames_out.load(Relaxed), 0);
    assert_eq!(sink.len(), 3, "still queued, bounded by the sink");
    let counters = Arc::clone(&leg.counters);
    drop(leg);
    s.end();
    assert_eq!(
        counters.stalls.load(Relaxed),
        3,
        "held, then dropped at the close"
    );
}

/// What the client sends on its channels enters the track's routes as datagrams would and
/// reaches the server's UDP ports in order: here 20 receiver reports written at once (one
/// read of vgate's, so one batch: one route lookup and one `sendmmsg`; see
/// `LegInjectors::inject_batch`), then one more.
#[test]
fn client_frames_of_one_read_reach_the_server_in_order() {
    let mut s = Served::start();
    s.setup_and_send_play();
    s.go.send("200 OK").unwrap();
    let play = s.reply();
    assert!(play.starts_with("RTSP/1.0 200"), "{play}");
    let (leg, _) = s.leg_and_sink();
    let rr = |i: u8| [b'$', 1, 0, 8, 0x80, 201, 0, 1, 0, 0, 0, i];
    let mut burst = Vec::new();
    for i in 0..20u8 {
        burst.extend_from_slice(&rr(i));
    }
    s.client.write_all(&burst).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 64];
    for _ in 0..20 {
        let (n, from) = s.server_media.1.recv_from(&mut buf).unwrap();
        assert_eq!(n, 8);
        assert_eq!(from.ip().to_string(), "127.0.0.1", "from vgate's A side");
        got.push(buf[7]);
    }
    assert_eq!(got, (0..20).collect::<Vec<u8>>(), "in order");
    s.client.write_all(&rr(20)).unwrap();
    let (_, _) = s.server_media.1.recv_from(&mut buf).unwrap();
    assert_eq!(buf[7], 20);
    // Once a later request is answered, the reader has counted the frames before it.
    s.send("GET_PARAMETER", 3, "");
    assert!(s.reply().contains("CSeq: 3\r\n"));
    let c = &leg.counters;
    assert_eq!(c.frames_in.load(Relaxed), 21);
    assert_eq!(c.bytes_in.load(Relaxed), 21 * 8);
    assert_eq!(c.inject_drops.load(Relaxed), 0);
    assert_eq!(
        c.batches_in.load(Relaxed),
        2,
        "the burst of one write (one read) went as one batch, then the single frame"
    );
    s.end();
}
