//! The signaling link's wire format: a plaintext hello each way, then length-prefixed frames
//! authenticated with HMAC-SHA256 under per-connection keys, with explicit sequence numbers.
//! Pure: bytes in, frames or a [`FrameError`] out; no I/O, no clock.
//!
//! ```text
//! hello (54 bytes, once each way, first thing on the connection):
//!   "VGSL" | version u8 = 1 | role u8 (1 dialer, 2 listener) | instance [16] | nonce [32]
//! frame:
//!   len u32 BE (bytes after this field) | type u8 | seq u64 BE | payload | tag [32]
//!   tag = HMAC-SHA256(direction key, len | type | seq | payload)
//! ```
//!
//! The direction keys are derived from the shared key and both hellos
//! ([`Keys::derive`]): fresh nonces make every connection's keys new, so a frame recorded on
//! an earlier connection fails its tag here, and the two directions have different keys, so a
//! frame reflected back to its sender fails too. Within a connection, sequence numbers start
//! at 0 and go up by one per frame; a frame with a good tag and another number was replayed
//! or reordered. Any error ends the connection: the caller counts it by
//! [`FrameError::counter`] and resets.

use hmac::{KeyInit, Mac};
use sha2::Sha256;

type HmacSha256 = hmac::Hmac<Sha256>;

pub const MAGIC: &[u8; 4] = b"VGSL";
pub const VERSION: u8 = 1;
pub const HELLO_LEN: usize = 54;
pub const TAG_LEN: usize = 32;
/// type + seq + tag: the smallest value of `len`.
pub const MIN_BODY: usize = 1 + 8 + TAG_LEN;
/// Largest payload of one frame (a UDP datagram of 64 KiB plus its ports fits).
pub const MAX_PAYLOAD: usize = 65_536 + 16;
/// Largest value of `len`.
pub const MAX_BODY: usize = MIN_BODY + MAX_PAYLOAD;
/// Largest chunk of a TCP stream put in one frame.
pub const TCP_CHUNK: usize = 16 * 1024;

/// Which end of the connection a half is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Half A: connects to the peer.
    Dialer = 1,
    /// Half B: accepts the peer's connection.
    Listener = 2,
}

/// One side's hello.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    pub role: Role,
    /// Random per process start, or a hot-standby pair's (its active presents the id that
    /// travels with the pair's state): a new one after a reconnection means the peer
    /// restarted.
    pub instance: [u8; 16],
    /// Random per connection.
    pub nonce: [u8; 32],
}

impl Hello {
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[0..4].copy_from_slice(MAGIC);
        b[4] = VERSION;
        b[5] = self.role as u8;
        b[6..22].copy_from_slice(&self.instance);
        b[22..54].copy_from_slice(&self.nonce);
        b
    }

    pub fn parse(b: &[u8; HELLO_LEN]) -> Result<Hello, FrameError> {
        if &b[0..4] != MAGIC {
            return Err(FrameError::NotVgate);
        }
        if b[4] != VERSION {
            return Err(FrameError::Version(b[4]));
        }
        let role = match b[5] {
            1 => Role::Dialer,
            2 => Role::Listener,
            _ => return Err(FrameError::Malformed),
        };
        let mut instance = [0u8; 16];
        instance.copy_from_slice(&b[6..22]);
        let mut nonce = [0u8; 32];
        nonce.copy_from_slice(&b[22..54]);
        Ok(Hello {
            role,
            instance,
            nonce,
        })
    }
}

/// Why a connection is reset. Every variant has a counter of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("the peer's first bytes are not a vgate signaling hello; is something else connecting to the signaling link?")]
    NotVgate,
    #[error("the peer speaks signaling protocol version {0}, this vgate speaks 1; run the same vgate version on both halves")]
    Version(u8),
    #[error("both ends have the same role; one half must be `a` and the other `b`")]
    SameRole,
    #[error("a frame failed authentication (wrong key on one half, or a forged or altered frame); check that both halves have the same split.signal key")]
    BadTag,
    #[error("an authenticated frame arrived out of sequence (replayed or reordered)")]
    Replay,
    #[error("a frame is malformed (bad length, unknown type or bad payload)")]
    Malformed,
    #[error("the connection ended in the middle of a frame")]
    Truncated,
    #[error("the first authenticated frame is not an announcement")]
    NoAnnounce,
}

impl FrameError {
    /// The counter this error increments.
    pub fn counter(self) -> &'static str {
        match self {
            FrameError::NotVgate | FrameError::Version(_) | FrameError::SameRole => "refused",
            FrameError::BadTag => "auth_failures",
            FrameError::Replay => "replays",
            FrameError::Malformed | FrameError::NoAnnounce => "malformed",
            FrameError::Truncated => "truncated",
        }
    }
}

/// The two direction keys of one connection.
#[derive(Clone)]
pub struct Keys {
    pub send: HmacSha256,
    pub recv: HmacSha256,
}

impl Keys {
    /// Derives the keys of a connection from the shared key and the two hellos.
    pub fn derive(shared: &[u8], ours: &Hello, theirs: &Hello) -> Result<Keys, FrameError> {
        if ours.role == theirs.role {
            return Err(FrameError::SameRole);
        }
        let (d, l) = match ours.role {
            Role::Dialer => (ours, theirs),
            Role::Listener => (theirs, ours),
        };
        let mut m =
            <HmacSha256 as KeyInit>::new_from_slice(shared).map_err(|_| FrameError::BadTag)?;
        m.update(b"vgate signal v1 connection key");
        m.update(&d.instance);
        m.update(&d.nonce);
        m.update(&l.instance);
        m.update(&l.nonce);
        let conn = m.finalize().into_bytes();
        let dir = |label: &[u8]| -> Result<HmacSha256, FrameError> {
            let mut m =
                <HmacSha256 as KeyInit>::new_from_slice(&conn).map_err(|_| FrameError::BadTag)?;
            m.update(label);
            let k = m.finalize().into_bytes();
            <HmacSha256 as KeyInit>::new_from_slice(&k).map_err(|_| FrameError::BadTag)
        };
        let d2l = dir(b"dialer to listener")?;
        let l2d = dir(b"listener to dialer")?;
        Ok(match ours.role {
            Role::Dialer => Keys {
                send: d2l,
                recv: l2d,
            },
            Role::Listener => Keys {
                send: l2d,
                recv: d2l,
            },
        })
    }
}

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The ports our proxies listen on in the link face; first frame each way, and again
    /// whenever they change.
    Announce = 1,
    Heartbeat = 2,
    /// A UDP datagram between two face ports.
    Udp = 3,
    /// A TCP connection opened to one of the peer's announced ports.
    TcpOpen = 4,
    TcpData = 5,
    TcpClose = 6,
    /// The sender is stopping: its proxies are gone.
    Goodbye = 7,
}

impl Kind {
    /// Every kind, in wire order.
    pub const ALL: [Kind; 7] = [
        Kind::Announce,
        Kind::Heartbeat,
        Kind::Udp,
        Kind::TcpOpen,
        Kind::TcpData,
        Kind::TcpClose,
        Kind::Goodbye,
    ];

    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Announce,
            2 => Kind::Heartbeat,
            3 => Kind::Udp,
            4 => Kind::TcpOpen,
            5 => Kind::TcpData,
            6 => Kind::TcpClose,
            7 => Kind::Goodbye,
            _ => return None,
        })
    }
}

/// A checked frame, borrowing the receive buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    Announce { udp: Vec<u16>, tcp: Vec<u16> },
    Heartbeat,
    Udp { src: u16, dst: u16, data: &'a [u8] },
    TcpOpen { id: u32, src: u16, dst: u16 },
    TcpData { id: u32, data: &'a [u8] },
    TcpClose { id: u32 },
    Goodbye,
}

fn u16_at(p: &[u8], at: usize) -> Option<u16> {
    p.get(at..at + 2).map(|b| u16::from_be_bytes([b[0], b[1]]))
}

fn u32_at(p: &[u8], at: usize) -> Option<u32> {
    p.get(at..at + 4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

fn ports_at(p: &[u8], at: usize) -> Option<(Vec<u16>, usize)> {
    let n = usize::from(u16_at(p, at)?);
    let list = p.get(at + 2..at + 2 + 2 * n)?;
    Some((
        list.chunks_exact(2)
            .map(|c| u16::from_be_bytes([c[0], c[1]]))
            .collect(),
        at + 2 + 2 * n,
    ))
}

impl<'a> Frame<'a> {
    fn parse(kind: Kind, p: &'a [u8]) -> Option<Frame<'a>> {
        Some(match kind {
            Kind::Announce => {
                let (udp, at) = ports_at(p, 0)?;
                let (tcp, at) = ports_at(p, at)?;
                if at != p.len() {
                    return None;
                }
                Frame::Announce { udp, tcp }
            }
            Kind::Heartbeat if p.is_empty() => Frame::Heartbeat,
            Kind::Goodbye if p.is_empty() => Frame::Goodbye,
            Kind::Udp => Frame::Udp {
                src: u16_at(p, 0)?,
                dst: u16_at(p, 2)?,
                data: p.get(4..)?,
            },
            Kind::TcpOpen if p.len() == 8 => Frame::TcpOpen {
                id: u32_at(p, 0)?,
                src: u16_at(p, 4)?,
                dst: u16_at(p, 6)?,
            },
            Kind::TcpData if p.len() > 4 => Frame::TcpData {
                id: u32_at(p, 0)?,
                data: p.get(4..)?,
            },
            Kind::TcpClose if p.len() == 4 => Frame::TcpClose { id: u32_at(p, 0)? },
            _ => return None,
        })
    }
}

/// Seals outgoing frames into a caller-owned output buffer.
pub struct Sealer {
    key: HmacSha256,
    seq: u64,
}

impl Sealer {
    pub fn new(key: HmacSha256) -> Sealer {
        Sealer { key, seq: 0 }
    }

    /// Appends one frame of `kind` whose payload is the concatenation of `parts`. Returns the
    /// bytes appended. The payload must not exceed [`MAX_PAYLOAD`] (callers chunk).
    pub fn seal(&mut self, out: &mut Vec<u8>, kind: Kind, parts: &[&[u8]]) -> usize {
        let payload: usize = parts.iter().map(|p| p.len()).sum();
        debug_assert!(payload <= MAX_PAYLOAD);
        let start = out.len();
        let len = (MIN_BODY + payload) as u32;
        out.extend_from_slice(&len.to_be_bytes());
        out.push(kind as u8);
        out.extend_from_slice(&self.seq.to_be_bytes());
        for p in parts {
            out.extend_from_slice(p);
        }
        let mut m = self.key.clone();
        m.update(&out[start..]);
        out.extend_from_slice(&m.finalize().into_bytes());
        self.seq += 1;
        out.len() - start
    }

    pub fn announce(&mut self, out: &mut Vec<u8>, udp: &[u16], tcp: &[u16]) -> usize {
        let mut p = Vec::with_capacity(4 + 2 * (udp.len() + tcp.len()));
        for list in [udp, tcp] {
            let list = &list[..list.len().min(usize::from(u16::MAX))];
            p.extend_from_slice(&(list.len() as u16).to_be_bytes());
            for port in list {
                p.extend_from_slice(&port.to_be_bytes());
            }
        }
        self.seal(out, Kind::Announce, &[&p])
    }

    pub fn udp(&mut self, out: &mut Vec<u8>, src: u16, dst: u16, data: &[u8]) -> usize {
        let mut h = [0u8; 4];
        h[0..2].copy_from_slice(&src.to_be_bytes());
        h[2..4].copy_from_slice(&dst.to_be_bytes());
        self.seal(out, Kind::Udp, &[&h, data])
    }

    pub fn tcp_open(&mut self, out: &mut Vec<u8>, id: u32, src: u16, dst: u16) -> usize {
        let mut h = [0u8; 8];
        h[0..4].copy_from_slice(&id.to_be_bytes());
        h[4..6].copy_from_slice(&src.to_be_bytes());
        h[6..8].copy_from_slice(&dst.to_be_bytes());
        self.seal(out, Kind::TcpOpen, &[&h])
    }

    pub fn tcp_data(&mut self, out: &mut Vec<u8>, id: u32, data: &[u8]) -> usize {
        self.seal(out, Kind::TcpData, &[&id.to_be_bytes(), data])
    }

    pub fn tcp_close(&mut self, out: &mut Vec<u8>, id: u32) -> usize {
        self.seal(out, Kind::TcpClose, &[&id.to_be_bytes()])
    }
}

/// Checks incoming frames from a receive buffer the caller fills.
pub struct Opener {
    key: HmacSha256,
    seq: u64,
}

impl Opener {
    pub fn new(key: HmacSha256) -> Opener {
        Opener { key, seq: 0 }
    }

    /// Number of frames accepted so far.
    pub fn accepted(&self) -> u64 {
        self.seq
    }

    /// The first complete frame at the start of `buf`, with its length in bytes; `Ok(None)`
    /// when `buf` holds only part of one. An error means the connection must be reset.
    pub fn open<'a>(&mut self, buf: &'a [u8]) -> Result<Option<(Frame<'a>, usize)>, FrameError> {
        let Some(len) = u32_at(buf, 0) else {
            return Ok(None);
        };
        let len = len as usize;
        if !(MIN_BODY..=MAX_BODY).contains(&len) {
            return Err(FrameError::Malformed);
        }
        let Some(whole) = buf.get(..4 + len) else {
            return Ok(None);
        };
        let (signed, tag) = whole.split_at(4 + len - TAG_LEN);
        let mut m = self.key.clone();
        m.update(signed);
        m.verify_slice(tag).map_err(|_| FrameError::BadTag)?;
        let seq = u64::from_be_bytes(
            signed[5..13]
                .try_into()
                .map_err(|_| FrameError::Malformed)?,
        );
        if seq != self.seq {
            return Err(FrameError::Replay);
        }
        let kind = Kind::from_u8(signed[4]).ok_or(FrameError::Malformed)?;
        if self.seq == 0 && kind != Kind::Announce {
            return Err(FrameError::NoAnnounce);
        }
        let frame = Frame::parse(kind, &signed[13..]).ok_or(FrameError::Malformed)?;
        self.seq += 1;
        Ok(Some((frame, 4 + len)))
    }
}

#[cfg(test)]
mod tests;
