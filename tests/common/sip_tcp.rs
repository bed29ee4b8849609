//! A tiny SIP-over-TCP peer for messages sipp cannot carry (sipp's TCP transport reads and
//! writes at most 64 KiB per message): framing by Content-Length on a blocking stream, a
//! request writer, and a one-connection platform that answers each request `200 OK`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

/// One framed SIP message: the header section (up to and with CRLFCRLF) and its body.
pub struct Framed {
    pub head: String,
    pub body: Vec<u8>,
}

impl Framed {
    /// The first line (status or request line).
    pub fn first_line(&self) -> &str {
        self.head.lines().next().unwrap_or("")
    }

    /// The value of header `name` (case-insensitive, first occurrence).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.split("\r\n").find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    /// All header lines named `name`, as written.
    pub fn headers(&self, name: &str) -> Vec<&str> {
        self.head
            .split("\r\n")
            .filter(|l| {
                l.split_once(':')
                    .is_some_and(|(k, _)| k.trim().eq_ignore_ascii_case(name))
            })
            .collect()
    }
}

/// Reads one whole message from `s` (CRLF keep-alives before it skipped); `None` when the
/// peer closed first. `buf` carries bytes read past the message to the next call.
pub fn read_message(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Framed> {
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        while buf.starts_with(b"\r\n") {
            buf.drain(..2);
        }
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end + 4]).into_owned();
            let len: usize = head
                .split("\r\n")
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    let k = k.trim();
                    (k.eq_ignore_ascii_case("Content-Length") || k.eq_ignore_ascii_case("l"))
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                let body = buf[end + 4..end + 4 + len].to_vec();
                buf.drain(..end + 4 + len);
                return Some(Framed { head, body });
            }
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A request of `method` to `uri` from `via` (host:port of the sending socket), with the
/// GB/T 28181 MANSCDP content type when `body` is not empty.
pub fn request(method: &str, uri: &str, via: &str, call: &str, cseq: u32, body: &[u8]) -> Vec<u8> {
    let mut m = format!(
        "{method} {uri} SIP/2.0\r\n\
Via: SIP/2.0/TCP {via};rport;branch=z9hG4bK{call}{cseq}\r\n\
From: <sip:34020000002000000001@3402000000>;tag=f{call}\r\n\
To: <sip:34020000002000000002@3402000000>\r\n\
Call-ID: {call}@3402000000\r\n\
CSeq: {cseq} {method}\r\n\
Max-Forwards: 70\r\n\
Content-Type: Application/MANSCDP+xml\r\n\
Content-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    m.extend_from_slice(body);
    m
}

/// `200 OK` to `req`: its Via lines, From, To (tagged), Call-ID and CSeq copied.
pub fn ok_for(req: &Framed) -> Vec<u8> {
    let mut r = String::from("SIP/2.0 200 OK\r\n");
    for v in req.headers("Via") {
        r.push_str(v);
        r.push_str("\r\n");
    }
    for h in ["From", "Call-ID", "CSeq"] {
        if let Some(v) = req.header(h) {
            r.push_str(&format!("{h}: {v}\r\n"));
        }
    }
    let to = req.header("To").unwrap_or("");
    r.push_str(&format!("To: {to};tag=plat\r\nContent-Length: 0\r\n\r\n"));
    r.into_bytes()
}

/// A platform on `listener`: takes one connection, answers every request `200 OK` and
/// hands each request received to `seen`, until the peer closes or `idle` passes.
pub fn answer_all(listener: TcpListener, idle: Duration, seen: std::sync::mpsc::Sender<Framed>) {
    let Ok((mut s, _)) = listener.accept() else {
        return;
    };
    s.set_read_timeout(Some(idle)).unwrap();
    let mut buf = Vec::new();
    while let Some(req) = read_message(&mut s, &mut buf) {
        if !req.first_line().starts_with("SIP/2.0") && s.write_all(&ok_for(&req)).is_err() {
            return;
        }
        if seen.send(req).is_err() {
            return;
        }
    }
}

/// A TCP connection from `from_ip` (port chosen by the kernel) to `to`.
pub fn connect_from(from_ip: &str, to: &str) -> TcpStream {
    use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, SockaddrIn};
    use std::os::fd::AsRawFd;
    let sock = socket::socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    let from: std::net::SocketAddrV4 = format!("{from_ip}:0").parse().unwrap();
    let to: std::net::SocketAddrV4 = to.parse().unwrap();
    socket::bind(sock.as_raw_fd(), &SockaddrIn::from(from)).unwrap();
    socket::connect(sock.as_raw_fd(), &SockaddrIn::from(to)).unwrap();
    TcpStream::from(sock)
}
