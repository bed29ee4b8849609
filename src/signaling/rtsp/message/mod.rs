//! RTSP/1.0 stream framing, zero-copy message views, and a byte-preserving editor.
//!
//! Owns: cutting a TCP byte stream into messages and interleaved `$` frames
//! ([`next_frame`]), parsing a message into borrowed slices ([`Message`]),
//! typed access to the headers the proxy needs, rewriting a message so that
//! every header it did not touch comes out byte-for-byte ([`Editor`]), and
//! building the small error responses the proxy sends itself
//! ([`build_response`]).
//!
//! Does not own: what a URL means (`url.rs`), what a Transport header means
//! (`transport.rs`), credentials (`auth.rs`), or any I/O.
//!
//! Framing rules (RFC 2326 §4, RFC 7826 §8): a message is a start line and
//! headers ending with an empty line (CRLF, bare LF tolerated), then exactly
//! `Content-Length` bytes of body (no Content-Length means no body — RTSP,
//! unlike HTTP/1.0, never reads to connection close). Everything is bounded by
//! [`Limits`] *before* the whole message has arrived, so a peer can never make
//! the proxy buffer more than the limits allow.

use crate::signaling::rtsp::error::RtspError;

mod edit;
mod parse;
pub use edit::{build_response, Editor, Status};
pub(crate) use parse::is_token;
use parse::Head;
pub use parse::{Header, Message, Session, StartLine};

/// Size limits applied while framing; a peer exceeding them is cut off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Start line + headers + the empty line (leading empty lines included).
    pub max_header_bytes: usize,
    /// Header lines, start line not counted.
    pub max_headers: usize,
    /// Body bytes as announced by `Content-Length`.
    pub max_body_bytes: usize,
    /// Any single line, terminator not counted.
    pub max_line_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_header_bytes: 16 * 1024,
            max_headers: 128,
            max_body_bytes: 64 * 1024,
            max_line_bytes: 8 * 1024,
        }
    }
}

/// What the front of a receive buffer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame {
    /// A complete RTSP message of this many bytes (feed exactly them to
    /// [`Message::parse`]).
    Message(usize),
    /// A complete interleaved binary frame: `$`, `channel`, a 16-bit length,
    /// then `len` payload bytes. The frame occupies `4 + len` bytes; see
    /// [`Frame::wire_len`] and [`interleaved_payload`].
    Interleaved { channel: u8, len: usize },
    /// Empty-line bytes (CR/LF) between frames: discard this many. RFC 2326
    /// allows empty lines before a message; reporting them separately keeps
    /// a `$` frame that follows them from being mistaken for a message.
    Skip(usize),
    /// Not enough bytes yet; read more and call again with the grown buffer.
    Incomplete,
}

impl Frame {
    /// How many bytes to consume from the buffer for this frame, if complete.
    pub fn wire_len(&self) -> Option<usize> {
        match *self {
            Frame::Message(len) | Frame::Skip(len) => Some(len),
            Frame::Interleaved { len, .. } => Some(INTERLEAVED_HEADER + len),
            Frame::Incomplete => None,
        }
    }
}

const INTERLEAVED_HEADER: usize = 4;

/// Decides what the front of `buf` is, without copying it.
///
/// Never panics and never asks for more than `limits` allow: a header block
/// that is already too large, or a line too long, is an error even while the
/// message is still incomplete.
pub fn next_frame(buf: &[u8], limits: &Limits) -> Result<Frame, RtspError> {
    match buf.first() {
        None => Ok(Frame::Incomplete),
        Some(b'$') => Ok(interleaved_frame(buf)),
        Some(b'\r' | b'\n') => Ok(Frame::Skip(
            buf.iter()
                .take_while(|&&b| b == b'\r' || b == b'\n')
                .count(),
        )),
        Some(_) => message_frame(buf, limits),
    }
}

/// The payload of a complete interleaved frame at the front of `buf`.
pub fn interleaved_payload(buf: &[u8]) -> Option<&[u8]> {
    match interleaved_frame(buf) {
        Frame::Interleaved { len, .. } => buf.get(INTERLEAVED_HEADER..INTERLEAVED_HEADER + len),
        _ => None,
    }
}

fn interleaved_frame(buf: &[u8]) -> Frame {
    let Some(&[b'$', channel, hi, lo]) = buf.get(..INTERLEAVED_HEADER) else {
        return Frame::Incomplete;
    };
    let len = usize::from(u16::from_be_bytes([hi, lo]));
    if buf.len() < INTERLEAVED_HEADER + len {
        return Frame::Incomplete;
    }
    Frame::Interleaved { channel, len }
}

fn message_frame(buf: &[u8], limits: &Limits) -> Result<Frame, RtspError> {
    let Some(head_len) = scan_head(buf, limits)? else {
        return Ok(Frame::Incomplete);
    };
    let head = Head::parse(buf.get(..head_len).unwrap_or_default(), limits)?;
    let total = head_len
        .checked_add(head.content_length)
        .ok_or(RtspError::BadContentLength)?;
    if buf.len() < total {
        return Ok(Frame::Incomplete);
    }
    Ok(Frame::Message(total))
}

/// Finds the end of the header block (just past the empty line), enforcing
/// the limits on what has arrived so far. `Ok(None)` means "need more bytes".
fn scan_head(buf: &[u8], limits: &Limits) -> Result<Option<usize>, RtspError> {
    let mut pos = 0usize;
    let mut header_lines = 0usize;
    let mut seen_start_line = false;
    loop {
        let rest = buf.get(pos..).unwrap_or_default();
        let Some(newline) = rest.iter().position(|&b| b == b'\n') else {
            if rest.len() > limits.max_line_bytes {
                return Err(RtspError::LineTooLong {
                    limit: limits.max_line_bytes,
                });
            }
            if buf.len() > limits.max_header_bytes {
                return Err(RtspError::HeaderTooLarge {
                    limit: limits.max_header_bytes,
                });
            }
            return Ok(None);
        };
        let content_len = match newline.checked_sub(1).and_then(|i| rest.get(i)) {
            Some(b'\r') => newline - 1,
            _ => newline,
        };
        if content_len > limits.max_line_bytes {
            return Err(RtspError::LineTooLong {
                limit: limits.max_line_bytes,
            });
        }
        pos += newline + 1;
        if pos > limits.max_header_bytes {
            return Err(RtspError::HeaderTooLarge {
                limit: limits.max_header_bytes,
            });
        }
        if content_len == 0 {
            if seen_start_line {
                return Ok(Some(pos));
            }
            // Only reachable from `Message::parse` (next_frame reports them as
            // `Skip`); tolerated and counted against max_header_bytes.
            continue;
        }
        if seen_start_line {
            header_lines += 1;
            if header_lines > limits.max_headers {
                return Err(RtspError::TooManyHeaders {
                    limit: limits.max_headers,
                });
            }
        }
        seen_start_line = true;
    }
}

#[cfg(test)]
mod tests;
