//! Writing messages: vgate's own responses ([`build_response`]) and the byte-preserving
//! [`Editor`].

use std::fmt;

use super::parse::{is_forbidden_in_uri, is_forbidden_in_value};
use super::{is_token, Message, StartLine};
use crate::signaling::rtsp::error::RtspError;

/// A status code with its reason phrase, for responses vgate writes itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    pub code: u16,
    pub reason: &'static str,
}

impl Status {
    pub const OK: Status = Status::new(200, "OK");
    pub const BAD_REQUEST: Status = Status::new(400, "Bad Request");
    pub const UNAUTHORIZED: Status = Status::new(401, "Unauthorized");
    pub const FORBIDDEN: Status = Status::new(403, "Forbidden");
    pub const NOT_FOUND: Status = Status::new(404, "Not Found");
    pub const UNSUPPORTED_MEDIA_TYPE: Status = Status::new(415, "Unsupported Media Type");
    pub const NOT_ENOUGH_BANDWIDTH: Status = Status::new(453, "Not Enough Bandwidth");
    pub const SESSION_NOT_FOUND: Status = Status::new(454, "Session Not Found");
    pub const UNSUPPORTED_TRANSPORT: Status = Status::new(461, "Unsupported Transport");
    pub const INTERNAL_SERVER_ERROR: Status = Status::new(500, "Internal Server Error");
    pub const SERVICE_UNAVAILABLE: Status = Status::new(503, "Service Unavailable");
    pub const VERSION_NOT_SUPPORTED: Status = Status::new(505, "RTSP Version Not Supported");

    pub const fn new(code: u16, reason: &'static str) -> Self {
        Status { code, reason }
    }
}

/// Builds `RTSP/1.0 <code> <reason>` with `CSeq` (when known) and `extra`
/// headers, no body. `cseq` is `None` when the request was too broken to
/// carry one (then the 400 goes out without it, as RFC 2326 allows).
pub fn build_response(
    cseq: Option<&str>,
    status: Status,
    extra: &[(&str, &str)],
) -> Result<Vec<u8>, RtspError> {
    let mut out = Vec::with_capacity(128);
    if status.reason.chars().any(is_forbidden_in_value) || !(100..=599).contains(&status.code) {
        return Err(RtspError::HeaderInjection);
    }
    out.extend_from_slice(format!("RTSP/1.0 {} {}\r\n", status.code, status.reason).as_bytes());
    if let Some(cseq) = cseq {
        push_header(&mut out, "CSeq", cseq)?;
    }
    for (name, value) in extra {
        push_header(&mut out, name, value)?;
    }
    out.extend_from_slice(b"\r\n");
    Ok(out)
}

pub(super) fn push_header(out: &mut Vec<u8>, name: &str, value: &str) -> Result<(), RtspError> {
    check_header(name, value)?;
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value.as_bytes());
    out.extend_from_slice(b"\r\n");
    Ok(())
}

pub(super) fn check_header(name: &str, value: &str) -> Result<(), RtspError> {
    if !is_token(name) || value.chars().any(is_forbidden_in_value) {
        return Err(RtspError::HeaderInjection);
    }
    Ok(())
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Edit {
    Keep,
    Replace(String),
    Remove,
}

/// Rewrites a parsed message; everything not edited is copied byte-for-byte.
///
/// Content-Length is managed here (it follows [`Editor::set_body`]); editing
/// it by hand is refused because a wrong length desynchronises the stream.
#[derive(Clone)]
pub struct Editor<'m, 'a> {
    msg: &'m Message<'a>,
    uri: Option<String>,
    edits: Vec<Edit>,
    appended: Vec<(String, String)>,
    body: Option<Vec<u8>>,
}

impl<'m, 'a> Editor<'m, 'a> {
    pub fn new(msg: &'m Message<'a>) -> Self {
        Editor {
            msg,
            uri: None,
            edits: vec![Edit::Keep; msg.headers.len()],
            appended: Vec::new(),
            body: None,
        }
    }

    /// Replaces the Request-URI (requests only).
    pub fn set_uri(&mut self, uri: &str) -> Result<&mut Self, RtspError> {
        if self.msg.uri().is_none() {
            return Err(RtspError::BadStartLine { what: "request" });
        }
        if uri.is_empty() || uri.chars().any(is_forbidden_in_uri) {
            return Err(RtspError::HeaderInjection);
        }
        self.uri = Some(uri.to_owned());
        Ok(self)
    }

    /// Sets a header: the first occurrence gets `value`, later occurrences go,
    /// and if there was none it is appended.
    pub fn set_header(&mut self, name: &str, value: &str) -> Result<&mut Self, RtspError> {
        check_editable(name, value)?;
        let mut found = false;
        for (header, edit) in self.msg.headers.iter().zip(self.edits.iter_mut()) {
            if header.name.eq_ignore_ascii_case(name) {
                *edit = if found {
                    Edit::Remove
                } else {
                    Edit::Replace(value.to_owned())
                };
                found = true;
            }
        }
        if !found {
            self.appended.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
            self.appended.push((name.to_owned(), value.to_owned()));
        }
        Ok(self)
    }

    /// Replaces the value of the `index`-th header of [`Message::headers`]
    /// (for headers that legitimately repeat, such as WWW-Authenticate).
    pub fn replace_header_at(&mut self, index: usize, value: &str) -> Result<&mut Self, RtspError> {
        self.edit_at(index, value, Edit::Replace(value.to_owned()))
    }

    /// Removes every occurrence of a header.
    pub fn remove_header(&mut self, name: &str) -> Result<&mut Self, RtspError> {
        check_editable(name, "")?;
        for (header, edit) in self.msg.headers.iter().zip(self.edits.iter_mut()) {
            if header.name.eq_ignore_ascii_case(name) {
                *edit = Edit::Remove;
            }
        }
        self.appended.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        Ok(self)
    }

    /// Removes the `index`-th header of [`Message::headers`].
    pub fn remove_header_at(&mut self, index: usize) -> Result<&mut Self, RtspError> {
        self.edit_at(index, "", Edit::Remove)
    }

    fn edit_at(&mut self, index: usize, value: &str, new: Edit) -> Result<&mut Self, RtspError> {
        let header = self.msg.headers.get(index).ok_or(RtspError::HeaderIndex)?;
        check_editable(header.name, value)?;
        let edit = self.edits.get_mut(index).ok_or(RtspError::HeaderIndex)?;
        *edit = new;
        Ok(self)
    }

    /// Adds a header after the existing ones, even if one of that name exists.
    pub fn insert_header(&mut self, name: &str, value: &str) -> Result<&mut Self, RtspError> {
        check_editable(name, value)?;
        self.appended.push((name.to_owned(), value.to_owned()));
        Ok(self)
    }

    /// Replaces the body; Content-Length follows (added if it was absent and
    /// the body is not empty, rewritten in place otherwise).
    pub fn set_body(&mut self, body: Vec<u8>) -> &mut Self {
        self.body = Some(body);
        self
    }

    /// The rewritten message.
    pub fn to_bytes(&self) -> Vec<u8> {
        let body = self.body.as_deref().unwrap_or(self.msg.body);
        let mut out =
            Vec::with_capacity(self.msg.start_line.len() + 64 * self.edits.len() + body.len());
        self.write_start_line(&mut out);
        let new_length = self.body.as_ref().map(|b| b.len().to_string());
        let mut wrote_length = false;
        for (header, edit) in self.msg.headers.iter().zip(&self.edits) {
            let is_length = header.name.eq_ignore_ascii_case("content-length");
            match (edit, &new_length) {
                (_, Some(len)) if is_length => {
                    write_line(&mut out, header.name, len);
                    wrote_length = true;
                }
                (Edit::Keep, _) => out.extend_from_slice(header.line.as_bytes()),
                (Edit::Replace(value), _) => write_line(&mut out, header.name, value),
                (Edit::Remove, _) => {}
            }
        }
        for (name, value) in &self.appended {
            write_line(&mut out, name, value);
        }
        if let (Some(len), false) = (&new_length, wrote_length) {
            if !body.is_empty() {
                write_line(&mut out, "Content-Length", len);
            }
        }
        out.extend_from_slice(self.msg.blank_line.as_bytes());
        out.extend_from_slice(body);
        out
    }

    fn write_start_line(&self, out: &mut Vec<u8>) {
        match (&self.uri, self.msg.start) {
            (
                Some(uri),
                StartLine::Request {
                    method, version, ..
                },
            ) => {
                out.extend_from_slice(format!("{method} {uri} {version}\r\n").as_bytes());
            }
            _ => out.extend_from_slice(self.msg.start_line.as_bytes()),
        }
    }
}

/// Debug shows what is being changed, not new values (they may be credentials).
impl fmt::Debug for Editor<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let changed = self.edits.iter().filter(|e| **e != Edit::Keep).count();
        let appended: Vec<&str> = self.appended.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("Editor")
            .field("msg", self.msg)
            .field("uri", &self.uri)
            .field("changed_headers", &changed)
            .field("appended", &appended)
            .field("body_replaced", &self.body.is_some())
            .finish()
    }
}

pub(super) fn check_editable(name: &str, value: &str) -> Result<(), RtspError> {
    check_header(name, value)?;
    if name.eq_ignore_ascii_case("content-length") {
        // The editor owns Content-Length; see `Editor::set_body`.
        return Err(RtspError::HeaderInjection);
    }
    Ok(())
}

pub(super) fn write_line(out: &mut Vec<u8>, name: &str, value: &str) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value.as_bytes());
    out.extend_from_slice(b"\r\n");
}
