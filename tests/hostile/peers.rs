//! Peers and probes shared by the hostile, churn and restart namespace tests
//! (`tests/hostile_netns.rs`, `tests/churn_netns.rs`, `tests/restart_netns.rs`), included
//! with `#[path]`: legitimate RTP streams A→B with exact accounting, the raw-socket flood
//! generator (`udpgen.py`), a minimal SIP user agent (UAS in A, UAC in B) and RTSP server
//! and client, `/proc` readings of the vgate process, and the admin interface.
//!
//! Every peer is bounded in count and time, and every child process is killed on drop.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::common::{enter_netns, relay, Bed, BedConfig};

#[allow(unused_imports)]
pub use crate::common::relay::{A_PORTS, B_PORTS, SINK_PORTS};
pub const SRC_PORTS: u16 = 41000;
pub const RTP_LEN: usize = 172;
pub const PY: &str = "/usr/bin/python3";

pub fn helper(name: &str) -> String {
    format!("{}/tests/hostile/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// Whether Debian's python3 has scapy (python3-scapy).
pub fn have_scapy() -> bool {
    Command::new(PY)
        .args(["-c", "import scapy.all"])
        .output()
        .is_ok_and(|o| o.status.success())
}

// The shared scaffolding these four tests reach through `use peers::*` (not every one uses
// every item).
#[allow(unused_imports)]
pub use crate::common::{
    admin::metric,
    proc::Proc,
    vgate::{channel_totals, kv, live_counts, num, Vgate},
};

/// `GET path` on the admin interface (127.0.0.1:9940 in namespace `ns`); the body.
pub fn admin_get(ns: &str, path: &str) -> String {
    crate::common::admin::get_in(ns, "127.0.0.1:9940", path)
}

/// The bed's two domains, media ranges of `ports` ports each, `extra` appended (routes,
/// security). Control on 127.0.0.1:9940 in the gateway namespace.
pub fn config(bed: &Bed, mode: &str, ports: u16, policy: &str, extra: &str) -> String {
    bed.config(BedConfig {
        mode,
        ports,
        policy,
        engine: "max_payload = 1400\n",
        ..Default::default()
    }) + extra
        + "\n"
}

/// Static routes A→B for `n` streams: gateway port `A_PORTS + 2i` → `B_IP:SINK_PORTS + i`,
/// expected source `A_IP:SRC_PORTS + i`.
pub fn stream_routes(bed: &Bed, n: u16) -> String {
    let a_ip = bed.get("A_IP");
    relay::stream_routes(bed, n, "s", |i| {
        format!("expect_source = \"{a_ip}:{}\"\n", SRC_PORTS + i)
    })
}

/// An RTP packet of stream `i`, sequence `seq`.
pub fn rtp_packet(i: u32, seq: u32) -> [u8; RTP_LEN] {
    let mut p = [0u8; RTP_LEN];
    p[0] = 0x80;
    p[1] = 96;
    p[2..4].copy_from_slice(&(seq as u16).to_be_bytes());
    p[8..12].copy_from_slice(&(0x5000 + i).to_be_bytes());
    p[12..16].copy_from_slice(&i.to_be_bytes());
    p[16..20].copy_from_slice(&seq.to_be_bytes());
    p
}

/// Legitimate streams A→B over the static routes of [`stream_routes`]: senders in A from
/// `A_IP:SRC_PORTS + i`, receivers in B that check source and contents.
pub struct Streams {
    stop: Arc<AtomicBool>,
    stop_tx: Arc<AtomicBool>,
    /// A fixed number of packets per stream: `finish` lets the sender complete.
    bounded: bool,
    done_sending: Arc<AtomicBool>,
    tx: Option<JoinHandle<(Vec<u64>, u64, Duration)>>,
    rx: Option<JoinHandle<Heard>>,
    /// Packets received so far, all streams.
    pub received: Arc<AtomicU64>,
    /// When the first packet arrived (since `Streams::start`), microseconds + 1.
    pub first_us: Arc<AtomicU64>,
    pub started: Instant,
}

/// What the receivers heard: sequence numbers per stream, and anything wrong.
type Heard = (Vec<Vec<u32>>, Vec<String>);

/// What the streams carried.
#[derive(Debug)]
pub struct StreamReport {
    pub sent: u64,
    pub received: u64,
    pub duplicates: u64,
    pub problems: Vec<String>,
    pub per_stream_lost: Vec<u64>,
    /// Times the sender was kept off the CPU for longer than [`MAX_LAG`] (its schedule then
    /// restarts instead of catching up with a burst), and the longest such stall.
    pub sender_stalls: u64,
    pub sender_max_lag: Duration,
}

/// The most the sender makes up with back-to-back datagrams after a stall (at 4 000 pps,
/// 80 datagrams).
pub const MAX_LAG: Duration = Duration::from_millis(20);

impl StreamReport {
    pub fn loss(&self) -> f64 {
        if self.sent == 0 {
            return 0.0;
        }
        (self.sent.saturating_sub(self.received)) as f64 / self.sent as f64
    }
}

impl Streams {
    /// `n` streams at `pps` packets per second each, for `packets` packets per stream (0:
    /// until `finish`); hard bound `limit`.
    pub fn start(bed: &Bed, n: u16, pps: u32, packets: u32, limit: Duration) -> Streams {
        let stop = Arc::new(AtomicBool::new(false));
        let stop_tx = Arc::new(AtomicBool::new(false));
        let done_sending = Arc::new(AtomicBool::new(false));
        let received = Arc::new(AtomicU64::new(0));
        let first_us = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let (ready_tx, ready_rx) = mpsc::channel();
        let rx = {
            let (b_ns, b_ip, gb_ip) = (bed.get("B_NS").to_owned(), bed.ip("B_IP"), bed.ip("GB_IP"));
            let (stop, done, received, first_us) = (
                Arc::clone(&stop),
                Arc::clone(&done_sending),
                Arc::clone(&received),
                Arc::clone(&first_us),
            );
            std::thread::spawn(move || {
                enter_netns(&b_ns).unwrap();
                let socks = relay::sink_sockets(b_ip, n);
                for s in &socks {
                    set_rcvbuf(s, 4 << 20);
                }
                let _ = ready_tx.send(());
                let mut seqs = vec![Vec::new(); n as usize];
                let mut problems = Vec::new();
                let mut buf = [0u8; 2048];
                let mut last = Instant::now();
                let deadline = Instant::now() + limit + Duration::from_secs(5);
                loop {
                    let mut any = false;
                    for (i, s) in socks.iter().enumerate() {
                        while let Ok((len, from)) = s.recv_from(&mut buf) {
                            any = true;
                            relay::note_wrong_source(&mut problems, i, from, gb_ip);
                            if len != RTP_LEN || buf[12..16] != (i as u32).to_be_bytes() {
                                if problems.len() < 20 {
                                    problems.push(format!(
                                        "stream {i}: foreign datagram of {len} bytes"
                                    ));
                                }
                                continue;
                            }
                            let seq = u32::from_be_bytes(buf[16..20].try_into().unwrap());
                            seqs[i].push(seq);
                            if received.fetch_add(1, Relaxed) == 0 {
                                first_us.store(started.elapsed().as_micros() as u64 + 1, Relaxed);
                            }
                        }
                    }
                    if any {
                        last = Instant::now();
                    } else {
                        std::thread::sleep(Duration::from_micros(500));
                    }
                    let quiet = last.elapsed() > Duration::from_millis(500);
                    if (done.load(Relaxed) && quiet)
                        || stop.load(Relaxed)
                        || Instant::now() > deadline
                    {
                        return (seqs, problems);
                    }
                }
            })
        };
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("sinks bound");
        let tx = {
            let (a_ns, a_ip, ga_ip) = (bed.get("A_NS").to_owned(), bed.ip("A_IP"), bed.ip("GA_IP"));
            let (stop, done) = (Arc::clone(&stop_tx), Arc::clone(&done_sending));
            std::thread::spawn(move || {
                enter_netns(&a_ns).unwrap();
                let socks: Vec<UdpSocket> = (0..n)
                    .map(|i| UdpSocket::bind((a_ip, SRC_PORTS + i)).expect("bind source"))
                    .collect();
                let mut sent = vec![0u64; n as usize];
                let period = Duration::from_secs_f64(1.0 / f64::from(pps.max(1)));
                let start = Instant::now();
                // The schedule's origin: moved forward when this thread was kept off the CPU
                // for longer than MAX_LAG, so it never makes up the time with a burst that no
                // camera sends (on a loaded machine a 0.6 s stall used to come out as 2 400
                // back-to-back datagrams, more than a 2 048-slot capture ring holds).
                let mut t0 = start;
                let (mut stalls, mut max_lag) = (0u64, Duration::ZERO);
                let mut seq = 0u32;
                let mut round = 0u32;
                while !stop.load(Relaxed)
                    && start.elapsed() < limit
                    && (packets == 0 || seq < packets)
                {
                    for (i, s) in socks.iter().enumerate() {
                        let to = SocketAddrV4::new(ga_ip, A_PORTS + 2 * i as u16);
                        if s.send_to(&rtp_packet(i as u32, seq), to).is_ok() {
                            sent[i] += 1;
                        }
                    }
                    seq += 1;
                    round += 1;
                    let next = period * round;
                    let now = t0.elapsed();
                    if next > now {
                        std::thread::sleep(next - now);
                    } else if now - next > MAX_LAG {
                        stalls += 1;
                        max_lag = max_lag.max(now - next);
                        t0 = Instant::now();
                        round = 0;
                    }
                }
                done.store(true, Relaxed);
                (sent, stalls, max_lag)
            })
        };
        Streams {
            stop,
            stop_tx,
            bounded: packets > 0,
            done_sending,
            tx: Some(tx),
            rx: Some(rx),
            received,
            first_us,
            started,
        }
    }

    /// Stops sending (if unbounded), waits for the receivers to drain, reports.
    pub fn finish(mut self) -> StreamReport {
        if !self.bounded {
            self.stop_sending();
        }
        let (sent, sender_stalls, sender_max_lag) = self.tx.take().unwrap().join().expect("sender");
        let (seqs, problems) = self.rx.take().unwrap().join().expect("receiver");
        let mut received = 0;
        let mut duplicates = 0;
        let mut per_stream_lost = Vec::new();
        for (i, s) in seqs.into_iter().enumerate() {
            let mut s = s;
            s.sort_unstable();
            let n = s.len() as u64;
            s.dedup();
            duplicates += n - s.len() as u64;
            received += s.len() as u64;
            per_stream_lost.push(sent[i].saturating_sub(s.len() as u64));
        }
        StreamReport {
            sent: sent.iter().sum(),
            received,
            duplicates,
            problems,
            per_stream_lost,
            sender_stalls,
            sender_max_lag,
        }
    }

    /// Ends the sender after its current round; the receivers drain until quiet.
    pub fn stop_sending(&self) {
        self.stop_tx.store(true, Relaxed);
    }
}

impl Drop for Streams {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        self.stop_tx.store(true, Relaxed);
    }
}

pub fn set_rcvbuf(s: &UdpSocket, bytes: usize) {
    let _ = nix::sys::socket::setsockopt(s, nix::sys::socket::sockopt::RcvBuf, &bytes);
}

/// `udpgen.py` in namespace `ns` with `args`; returns the running generator.
pub fn udpgen(ns: &str, args: &[&str]) -> Proc {
    Proc::spawn(
        Command::new("ip")
            .args(["netns", "exec", ns, "timeout", "300", PY])
            .arg(helper("udpgen.py"))
            .args(args)
            .stdout(Stdio::piped()),
    )
}

/// Runs `udpgen.py` to completion; its `sent=` figure.
pub fn udpgen_run(ns: &str, args: &[&str]) -> u64 {
    let mut p = udpgen(ns, args);
    let out = p.wait_output(Duration::from_secs(300));
    let kv = kv(out.trim());
    assert!(kv.contains_key("sent"), "udpgen.py failed: {out:?}");
    num(&kv, "sent")
}

// ---------------------------------------------------------------- SIP

/// A SIP user agent in domain A that answers every INVITE with 200 and an SDP naming
/// `A_IP:16000` (or, with `answer = false`, never answers), BYE/CANCEL/OPTIONS/MESSAGE with
/// 200, and absorbs ACK. Runs until dropped.
pub struct SipUas {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<u64>>,
}

fn header<'a>(msg: &'a str, name: &str) -> Vec<&'a str> {
    msg.split("\r\n")
        .take_while(|l| !l.is_empty())
        .filter(|l| {
            l.split_once(':')
                .is_some_and(|(n, _)| n.trim().eq_ignore_ascii_case(name))
        })
        .collect()
}

impl SipUas {
    pub fn start(ns: &str, addr: SocketAddrV4, answer: bool) -> SipUas {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread = {
            let (ns, stop) = (ns.to_owned(), Arc::clone(&stop));
            std::thread::spawn(move || {
                enter_netns(&ns).unwrap();
                let s = UdpSocket::bind(addr).expect("bind UAS");
                s.set_read_timeout(Some(Duration::from_millis(100)))
                    .unwrap();
                let _ = ready_tx.send(());
                let mut buf = vec![0u8; 65536];
                let mut handled = 0;
                while !stop.load(Relaxed) {
                    let Ok((n, from)) = s.recv_from(&mut buf) else {
                        continue;
                    };
                    let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
                    let method = msg.split(' ').next().unwrap_or("").to_owned();
                    if method.starts_with("SIP/") || method == "ACK" {
                        continue;
                    }
                    if method == "INVITE" && !answer {
                        continue;
                    }
                    handled += 1;
                    let mut r = String::from("SIP/2.0 200 OK\r\n");
                    for h in ["Via", "From", "Call-ID", "CSeq"] {
                        for v in header(&msg, h) {
                            r.push_str(v);
                            r.push_str("\r\n");
                        }
                    }
                    for v in header(&msg, "To") {
                        r.push_str(v);
                        if method == "INVITE" && !v.contains("tag=") {
                            r.push_str(";tag=uas1");
                        }
                        r.push_str("\r\n");
                    }
                    let body = if method == "INVITE" {
                        format!(
                            "v=0\r\no=34020000001320000001 0 0 IN IP4 {ip}\r\ns=Play\r\nc=IN IP4 {ip}\r\nt=0 0\r\nm=video 16000 RTP/AVP 96\r\na=sendonly\r\na=rtpmap:96 PS/90000\r\n",
                            ip = addr.ip()
                        )
                    } else {
                        String::new()
                    };
                    r.push_str(&format!("Contact: <sip:34020000001320000001@{addr}>\r\n"));
                    if !body.is_empty() {
                        r.push_str("Content-Type: application/sdp\r\n");
                    }
                    r.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
                    let _ = s.send_to(r.as_bytes(), from);
                }
                handled
            })
        };
        ready_rx
            .recv_timeout(Duration::from_secs(5))
            .expect("UAS bound");
        SipUas {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for SipUas {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One SIP client transaction-at-a-time UAC over UDP (in the calling thread's namespace).
pub struct SipUac {
    pub sock: UdpSocket,
    pub local: SocketAddrV4,
    pub proxy: SocketAddrV4,
}

/// An established call: what ACK and BYE need.
pub struct SipCall {
    pub call_id: String,
    pub from_tag: String,
    pub to: String,
    pub target: String,
    pub target_addr: SocketAddrV4,
}

impl SipUac {
    pub fn new(local: SocketAddrV4, proxy: SocketAddrV4) -> SipUac {
        let sock = UdpSocket::bind(local).expect("bind UAC");
        sock.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let local = match sock.local_addr().unwrap() {
            std::net::SocketAddr::V4(a) => a,
            _ => unreachable!(),
        };
        SipUac { sock, local, proxy }
    }

    #[allow(clippy::too_many_arguments)]
    fn request(
        &self,
        method: &str,
        uri: &str,
        call_id: &str,
        from_tag: &str,
        to: &str,
        cseq: u32,
        branch: &str,
        body: &str,
    ) -> String {
        let ct = if body.is_empty() {
            ""
        } else {
            "Content-Type: application/sdp\r\n"
        };
        format!(
            "{method} {uri} SIP/2.0\r\nVia: SIP/2.0/UDP {l};rport;branch=z9hG4bK{branch}\r\nFrom: <sip:34020000002000000001@3402000000>;tag={from_tag}\r\nTo: {to}\r\nCall-ID: {call_id}\r\nCSeq: {cseq} {method}\r\nContact: <sip:34020000002000000001@{l}>\r\nMax-Forwards: 70\r\n{ct}Content-Length: {}\r\n\r\n{body}",
            body.len(),
            l = self.local,
        )
    }

    /// The first request `method` of a dialog with the device (`tag`: its From tag and the
    /// start of its Call-ID; `branch`, made unique with the local port), through the proxy.
    fn to_device(&self, method: &str, tag: &str, branch: &str, body: &str) -> String {
        let port = self.local.port();
        self.request(
            method,
            "sip:34020000001320000001@3402000000",
            &format!("{tag}-{port}@3402000000"),
            tag,
            "<sip:34020000001320000001@3402000000>",
            1,
            &format!("{branch}x{port}"),
            body,
        )
    }

    /// Sends `msg` to `to`, retransmitting every 500 ms, until a final response for `cseq`
    /// arrives or `within` passes; the final response (empty on timeout).
    fn transact(&self, msg: &str, to: SocketAddrV4, within: Duration) -> String {
        let deadline = Instant::now() + within;
        let mut next_send = Instant::now();
        let mut buf = vec![0u8; 65536];
        while Instant::now() < deadline {
            if Instant::now() >= next_send {
                let _ = self.sock.send_to(msg.as_bytes(), to);
                next_send = Instant::now() + Duration::from_millis(500);
            }
            if let Ok((n, _)) = self.sock.recv_from(&mut buf) {
                let r = String::from_utf8_lossy(&buf[..n]).into_owned();
                let code: u16 = r
                    .strip_prefix("SIP/2.0 ")
                    .and_then(|x| x.get(..3)?.parse().ok())
                    .unwrap_or(0);
                if code >= 200 && header(&r, "CSeq").first() == header(msg, "CSeq").first() {
                    return r;
                }
            }
        }
        String::new()
    }

    /// INVITE for a live view with media offered at `media`; on 200 also the ACK. Returns
    /// the status code (0: no final answer) and the call.
    pub fn invite(&self, n: u32, media: SocketAddrV4) -> (u16, Option<SipCall>) {
        let call_id = format!("c{n}-{}@3402000000", self.local.port());
        let from_tag = format!("t{n}");
        let to = "<sip:34020000001320000001@3402000000>".to_owned();
        let sdp = format!(
            "v=0\r\no=34020000002000000001 0 0 IN IP4 {ip}\r\ns=Play\r\nc=IN IP4 {ip}\r\nt=0 0\r\nm=video {port} RTP/AVP 96\r\na=recvonly\r\na=rtpmap:96 PS/90000\r\ny=0{n:09}\r\n",
            ip = media.ip(),
            port = media.port()
        );
        let branch = format!("inv{n}x{}", self.local.port());
        let uri = "sip:34020000001320000001@3402000000";
        let inv = self.request("INVITE", uri, &call_id, &from_tag, &to, 1, &branch, &sdp);
        let r = self.transact(&inv, self.proxy, Duration::from_secs(10));
        let code = status(&r);
        let to_hdr = header(&r, "To")
            .first()
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_owned())
            .unwrap_or(to);
        if code == 0 {
            return (0, None);
        }
        if code != 200 {
            // ACK of a non-2xx final answer: same branch, to the proxy.
            let ack = self.request("ACK", uri, &call_id, &from_tag, &to_hdr, 1, &branch, "");
            let _ = self.sock.send_to(ack.as_bytes(), self.proxy);
            return (code, None);
        }
        let target = header(&r, "Contact")
            .first()
            .and_then(|l| Some(l.split_once('<')?.1.split_once('>')?.0.to_owned()))
            .expect("Contact in 200");
        let hostport = target
            .split_once('@')
            .map(|(_, h)| h.split(';').next().unwrap_or(h))
            .unwrap_or("");
        let target_addr: SocketAddrV4 = hostport.parse().unwrap_or(self.proxy);
        let call = SipCall {
            call_id,
            from_tag,
            to: to_hdr,
            target,
            target_addr,
        };
        let ack = self.request(
            "ACK",
            &call.target,
            &call.call_id,
            &call.from_tag,
            &call.to,
            1,
            &format!("ack{n}x{}", self.local.port()),
            "",
        );
        let _ = self.sock.send_to(ack.as_bytes(), call.target_addr);
        (200, Some(call))
    }

    /// An INVITE sent once and abandoned (nobody waits for its answer).
    pub fn invite_no_wait(&self, n: u32, media: SocketAddrV4) {
        let sdp = format!(
            "v=0\r\no=34020000002000000001 0 0 IN IP4 {ip}\r\ns=Play\r\nc=IN IP4 {ip}\r\nt=0 0\r\nm=video {port} RTP/AVP 96\r\na=recvonly\r\n",
            ip = media.ip(),
            port = media.port()
        );
        let inv = self.to_device("INVITE", &format!("u{n}"), &format!("unans{n}"), &sdp);
        let _ = self.sock.send_to(inv.as_bytes(), self.proxy);
    }

    /// BYE; the final status (0: none).
    pub fn bye(&self, n: u32, call: &SipCall) -> u16 {
        let bye = self.request(
            "BYE",
            &call.target,
            &call.call_id,
            &call.from_tag,
            &call.to,
            2,
            &format!("bye{n}x{}", self.local.port()),
            "",
        );
        status(&self.transact(&bye, call.target_addr, Duration::from_secs(10)))
    }

    /// An OPTIONS through the proxy; the final status (0: none).
    pub fn options(&self, n: u32) -> u16 {
        let m = self.to_device("OPTIONS", &format!("o{n}"), &format!("opt{n}"), "");
        status(&self.transact(&m, self.proxy, Duration::from_secs(5)))
    }
}

/// A `[[signaling_route]]` for SIP over `transport` listening in B on `port`, upstream
/// `A_IP:up_port`; `extra` lines appended.
pub fn sip_route(
    bed: &Bed,
    name: &str,
    transport: &str,
    port: u16,
    up_port: u16,
    extra: &str,
) -> String {
    format!(
        "[[signaling_route]]\nname = \"{name}\"\ntype = \"sip\"\ntransport = \"{transport}\"\nlisten_domain = \"b\"\nlisten_port = {port}\nupstream = \"{}:{up_port}\"\n{extra}\n",
        bed.get("A_IP")
    )
}

/// An RTSP route listening in B on `port`, upstream `A_IP:up_port`.
pub fn rtsp_route(bed: &Bed, name: &str, port: u16, up_port: u16, extra: &str) -> String {
    format!(
        "[[signaling_route]]\nname = \"{name}\"\ntype = \"rtsp\"\ntransport = \"tcp\"\nlisten_domain = \"b\"\nlisten_port = {port}\nupstream = \"{}:{up_port}\"\n{extra}\n",
        bed.get("A_IP")
    )
}

/// vgate (mode `stack`, `ports` ports per side, policy strict) in the gateway namespace with
/// the SIP route `sip_name` (UDP, port 5060 both sides) and the RTSP route `cam` (port 8554
/// both sides), both with `media_timeout` (SIP without a rate limit); and their upstreams in
/// A ([`upstreams_in_a`]).
pub fn sip_and_rtsp_gateway(
    bed: &Bed,
    sip_name: &str,
    media_timeout: u32,
    ports: u16,
) -> (Vgate, (SipUas, RtspServer)) {
    let timeout = format!("media_timeout = {media_timeout}");
    let routes = sip_route(
        bed,
        sip_name,
        "udp",
        5060,
        5060,
        &format!("{timeout}\nrate_limit = 0"),
    ) + &rtsp_route(bed, "cam", 8554, 8554, &timeout);
    let gw = Vgate::start_in(
        bed.get("G_NS"),
        &config(bed, "stack", ports, "strict", &routes),
        &[],
    );
    (gw, upstreams_in_a(bed))
}

/// The upstreams in A those routes go to: a SIP UAS answering with SDP at `A_IP:5060` and
/// an RTSP server at `A_IP:8554` that sends no media.
pub fn upstreams_in_a(bed: &Bed) -> (SipUas, RtspServer) {
    let (a_ns, a_ip) = (bed.get("A_NS"), bed.ip("A_IP"));
    (
        SipUas::start(a_ns, SocketAddrV4::new(a_ip, 5060), true),
        RtspServer::start(a_ns, SocketAddrV4::new(a_ip, 8554), 0),
    )
}

// ---------------------------------------------------------------- RTSP

/// A minimal RTSP server in domain A: OPTIONS, DESCRIBE (one video track), SETUP over UDP
/// (answers with `server_port=50000-50001`), PLAY (then `media` RTP packets to the client
/// port, 5 ms apart), TEARDOWN; one thread per connection. Runs until dropped.
pub struct RtspServer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    pub sessions: Arc<AtomicU64>,
}

impl RtspServer {
    pub fn start(ns: &str, addr: SocketAddrV4, media: u32) -> RtspServer {
        let stop = Arc::new(AtomicBool::new(false));
        let sessions = Arc::new(AtomicU64::new(0));
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread = {
            let (ns, stop, sessions) = (ns.to_owned(), Arc::clone(&stop), Arc::clone(&sessions));
            std::thread::spawn(move || {
                enter_netns(&ns).unwrap();
                let l = TcpListener::bind(addr).expect("bind RTSP server");
                l.set_nonblocking(true).unwrap();
                let _ = ready_tx.send(());
                while !stop.load(Relaxed) {
                    match l.accept() {
                        Ok((c, peer)) => {
                            let (stop, sessions, ns) =
                                (Arc::clone(&stop), Arc::clone(&sessions), ns.clone());
                            std::thread::spawn(move || {
                                enter_netns(&ns).unwrap();
                                rtsp_serve(c, peer.ip(), addr, media, &stop, &sessions)
                            });
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(2)),
                    }
                }
            })
        };
        ready_rx
            .recv_timeout(Duration::from_secs(5))
            .expect("RTSP server bound");
        RtspServer {
            stop,
            thread: Some(thread),
            sessions,
        }
    }
}

impl Drop for RtspServer {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads one RTSP message head (and body) from `r`; `None` at EOF or error.
pub fn read_rtsp<R: BufRead>(r: &mut R) -> Option<String> {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        let n = r.read_line(&mut line).ok()?;
        if n == 0 {
            return None;
        }
        if line == "\r\n" && head.is_empty() {
            continue;
        }
        head.push_str(&line);
        if line == "\r\n" {
            break;
        }
    }
    let len: usize = header(&head, "Content-Length")
        .first()
        .and_then(|l| l.split_once(':')?.1.trim().parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).ok()?;
    head.push_str(&String::from_utf8_lossy(&body));
    Some(head)
}

fn rtsp_serve(
    c: TcpStream,
    peer: std::net::IpAddr,
    me: SocketAddrV4,
    media: u32,
    stop: &AtomicBool,
    sessions: &AtomicU64,
) {
    let _ = c.set_read_timeout(Some(Duration::from_secs(120)));
    let mut w = c.try_clone().unwrap();
    let mut r = BufReader::new(c);
    let mut client_rtp: Option<u16> = None;
    let udp = UdpSocket::bind((*me.ip(), 0)).ok();
    while !stop.load(Relaxed) {
        let Some(req) = read_rtsp(&mut r) else { return };
        let method = req.split(' ').next().unwrap_or("").to_owned();
        let cseq = header(&req, "CSeq")
            .first()
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_owned())
            .unwrap_or_default();
        let mut extra = String::new();
        let mut body = String::new();
        match method.as_str() {
            "OPTIONS" => extra.push_str("Public: OPTIONS, DESCRIBE, SETUP, PLAY, TEARDOWN\r\n"),
            "DESCRIBE" => {
                body = format!(
                    "v=0\r\no=- 1 1 IN IP4 {ip}\r\ns=test\r\nc=IN IP4 0.0.0.0\r\nt=0 0\r\nm=video 0 RTP/AVP 26\r\na=control:stream=0\r\n",
                    ip = me.ip()
                );
                let url = req.split(' ').nth(1).unwrap_or("");
                extra.push_str(&format!(
                    "Content-Base: {url}/\r\nContent-Type: application/sdp\r\n"
                ));
            }
            "SETUP" => {
                let t = header(&req, "Transport")
                    .first()
                    .map(|l| l.split_once(':').map_or("", |x| x.1).trim().to_owned())
                    .unwrap_or_default();
                client_rtp = t
                    .split(';')
                    .find_map(|p| p.strip_prefix("client_port="))
                    .and_then(|p| p.split('-').next()?.parse().ok());
                sessions.fetch_add(1, Relaxed);
                extra.push_str(&format!(
                    "Transport: {t};server_port=50000-50001;ssrc=1234ABCD\r\nSession: 4242;timeout=60\r\n"
                ));
            }
            "PLAY" => extra.push_str("Session: 4242\r\nRTP-Info: url=stream=0;seq=0;rtptime=0\r\n"),
            "TEARDOWN" => extra.push_str("Session: 4242\r\n"),
            _ => {}
        }
        let resp = format!(
            "RTSP/1.0 200 OK\r\nCSeq: {cseq}\r\n{extra}Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if w.write_all(resp.as_bytes()).is_err() {
            return;
        }
        if method == "PLAY" {
            if let (Some(p), Some(u), std::net::IpAddr::V4(_)) = (client_rtp, udp.as_ref(), peer) {
                // Media goes to the address of the connection (the gateway's A side).
                for seq in 0..media {
                    let _ = u.send_to(&rtp_packet(0, seq), (peer, p));
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
        if method == "TEARDOWN" {
            return;
        }
    }
}

/// A minimal RTSP client (in the calling thread's namespace).
pub struct RtspClient {
    pub w: TcpStream,
    pub r: BufReader<TcpStream>,
    cseq: u32,
    pub session: Option<String>,
}

impl RtspClient {
    pub fn connect(addr: SocketAddrV4) -> std::io::Result<RtspClient> {
        let w = TcpStream::connect_timeout(&addr.into(), Duration::from_secs(5))?;
        w.set_read_timeout(Some(Duration::from_secs(10)))?;
        let r = BufReader::new(w.try_clone()?);
        Ok(RtspClient {
            w,
            r,
            cseq: 0,
            session: None,
        })
    }

    /// One request; the reply (status line first), or "" when the connection ended.
    pub fn request(&mut self, method: &str, url: &str, extra: &str) -> String {
        self.cseq += 1;
        let req =
            crate::common::rtsp::request(method, url, self.cseq, self.session.as_deref(), extra);
        if self.w.write_all(req.as_bytes()).is_err() {
            return String::new();
        }
        let Some(reply) = read_rtsp(&mut self.r) else {
            return String::new();
        };
        if let Some(s) = header(&reply, "Session").first() {
            let v = s.split_once(':').map_or("", |x| x.1).trim();
            self.session = Some(v.split(';').next().unwrap_or(v).to_owned());
        }
        reply
    }

    /// DESCRIBE and SETUP (UDP to `client_port`); the SETUP status code.
    pub fn setup(&mut self, url: &str, client_port: u16) -> u16 {
        let d = self.request("DESCRIBE", url, "Accept: application/sdp\r\n");
        if !d.starts_with("RTSP/1.0 200") {
            return status(&d);
        }
        let s = self.request(
            "SETUP",
            &format!("{url}/stream=0"),
            &format!(
                "Transport: RTP/AVP;unicast;client_port={}-{}\r\n",
                client_port,
                client_port + 1
            ),
        );
        status(&s)
    }
}

/// The status code of an RTSP or SIP reply ("" → 0).
pub fn status(reply: &str) -> u16 {
    reply
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}
