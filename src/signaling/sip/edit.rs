//! Turning a parsed message plus a few edits back into bytes.
//!
//! The proxy changes little in a message that crosses the gateway: the Request-URI, a
//! Via pushed or popped, Record-Route/Contact/Route values, the body (rewritten SDP).
//! Everything else must leave exactly as it came, because a header vgate does not
//! understand is not vgate's to normalise: the [`Editor`] copies every untouched
//! field byte for byte (name case, compact form, spacing, folding, order) from the
//! received message, and writes only the edited ones.
//!
//! Values given to the editor are checked for CR, LF and NUL: a value carrying a line
//! break would let whoever controls it inject header lines into the other domain.

use super::headers::{is_list_header, same_name};
use super::lex::{is_safe_value, is_token, split_at, top_level_comma, trim_lws_start};
use super::message::{Head, SipMessage};
use super::SipError;

#[derive(Debug, Clone)]
enum Entry {
    /// Header `index` of the parsed message, with its value replaced when `Some`.
    Kept {
        index: usize,
        value: Option<Vec<u8>>,
    },
    Inserted {
        name: Vec<u8>,
        value: Vec<u8>,
    },
}

/// Edits to one parsed message, applied when it is written out.
///
/// Operations see the result of earlier ones: after `insert_top("Via", ..)`,
/// `remove_first_value("Via")` removes the Via just inserted.
#[derive(Debug, Clone)]
pub struct Editor<'m, 'a> {
    msg: &'m SipMessage<'a>,
    request_uri: Option<Vec<u8>>,
    entries: Vec<Entry>,
    body: Option<Vec<u8>>,
    force_content_length: bool,
}

impl<'m, 'a> Editor<'m, 'a> {
    pub fn new(msg: &'m SipMessage<'a>) -> Self {
        let entries = (0..msg.head().headers().len())
            .map(|index| Entry::Kept { index, value: None })
            .collect();
        Editor {
            msg,
            request_uri: None,
            entries,
            body: None,
            force_content_length: false,
        }
    }

    fn head(&self) -> &'m Head<'a> {
        self.msg.head()
    }

    fn position(&self, name: &str) -> Option<usize> {
        self.entries
            .iter()
            .position(|e| same_name(self.name_of(e), name.as_bytes()))
    }

    fn name_of<'e>(&'e self, e: &'e Entry) -> &'e [u8] {
        match e {
            Entry::Kept { index, .. } => self
                .head()
                .headers()
                .get(*index)
                .map(|h| h.name())
                .unwrap_or_default(),
            Entry::Inserted { name, .. } => name,
        }
    }

    fn current_value<'e>(&'e self, e: &'e Entry) -> &'e [u8] {
        match e {
            Entry::Kept { value: Some(v), .. } | Entry::Inserted { value: v, .. } => v,
            Entry::Kept { index, value: None } => self
                .head()
                .headers()
                .get(*index)
                .map(|h| h.value())
                .unwrap_or_default(),
        }
    }

    /// Replaces the Request-URI (requests only). The URI must not contain whitespace
    /// or control bytes, or the request line would no longer parse.
    pub fn set_request_uri(&mut self, uri: &[u8]) -> Result<(), SipError> {
        if !self.head().is_request() {
            return Err(SipError::NotARequest);
        }
        if uri.is_empty() || uri.iter().any(|&b| b <= b' ' || b == 0x7f) {
            return Err(SipError::UnsafeValue(
                "a Request-URI with whitespace or control bytes",
            ));
        }
        self.request_uri = Some(uri.to_vec());
        Ok(())
    }

    fn new_entry(name: &str, value: &[u8]) -> Result<Entry, SipError> {
        if !is_token(name.as_bytes()) {
            return Err(SipError::UnsafeValue("a header name that is not a token"));
        }
        if !is_safe_value(value) {
            return Err(SipError::UnsafeValue("a header value with CR, LF or NUL"));
        }
        Ok(Entry::Inserted {
            name: name.as_bytes().to_vec(),
            value: value.to_vec(),
        })
    }

    /// Inserts `name: value` above every other header (a new Via goes here).
    pub fn insert_top(&mut self, name: &str, value: &[u8]) -> Result<(), SipError> {
        let e = Self::new_entry(name, value)?;
        self.entries.insert(0, e);
        Ok(())
    }

    /// Inserts `name: value` just before the first `anchor` header, or at the top
    /// when there is none (where a new Record-Route or Route belongs either way).
    pub fn insert_before(
        &mut self,
        anchor: &str,
        name: &str,
        value: &[u8],
    ) -> Result<(), SipError> {
        let e = Self::new_entry(name, value)?;
        let at = self.position(anchor).unwrap_or(0);
        self.entries.insert(at, e);
        Ok(())
    }

    /// Removes the first value of the first `name` header: the topmost Via of a
    /// response, the first Route. A field left with no value is removed entirely;
    /// headers that are not lists lose the whole field. Returns whether anything went.
    pub fn remove_first_value(&mut self, name: &str) -> bool {
        let Some(at) = self.position(name) else {
            return false;
        };
        let list = is_list_header(name.as_bytes());
        let remainder = self.entries.get(at).and_then(|e| {
            let value = self.current_value(e);
            let comma = top_level_comma(value).filter(|_| list)?;
            Some(trim_lws_start(split_at(value, comma + 1).1).to_vec())
        });
        match remainder {
            Some(r) if !r.is_empty() => self.set_value_at(at, r),
            _ => {
                self.entries.remove(at);
            }
        }
        true
    }

    fn set_value_at(&mut self, at: usize, new: Vec<u8>) {
        if let Some(e) = self.entries.get_mut(at) {
            match e {
                Entry::Kept { value, .. } => *value = Some(new),
                Entry::Inserted { value, .. } => *value = new,
            }
        }
    }

    /// Removes every `name` header; returns how many fields went.
    pub fn remove_all(&mut self, name: &str) -> usize {
        let before = self.entries.len();
        let head = self.head();
        self.entries.retain(|e| {
            let n = match e {
                Entry::Kept { index, .. } => head
                    .headers()
                    .get(*index)
                    .map(|h| h.name())
                    .unwrap_or_default(),
                Entry::Inserted { name, .. } => name,
            };
            !same_name(n, name.as_bytes())
        });
        before - self.entries.len()
    }

    /// Replaces the whole value of the first `name` header, keeping its name and the
    /// spacing before the value as received. Returns `Ok(false)` if there is none.
    pub fn replace_value(&mut self, name: &str, value: &[u8]) -> Result<bool, SipError> {
        if !is_safe_value(value) {
            return Err(SipError::UnsafeValue("a header value with CR, LF or NUL"));
        }
        match self.position(name) {
            Some(at) => {
                self.set_value_at(at, value.to_vec());
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Replaces every `name` field by one: the first keeps its place, name and spacing
    /// and gets `value`; the others are removed. Returns `Ok(false)` if there is none.
    /// (A list header such as Contact rewritten value by value is written back this way.)
    pub fn replace_all(&mut self, name: &str, value: &[u8]) -> Result<bool, SipError> {
        if !self.replace_value(name, value)? {
            return Ok(false);
        }
        let Some(first) = self.position(name) else {
            return Ok(true);
        };
        let head = self.head();
        let mut index = 0;
        self.entries.retain(|e| {
            let i = index;
            index += 1;
            if i <= first {
                return true;
            }
            let n = match e {
                Entry::Kept { index, .. } => head
                    .headers()
                    .get(*index)
                    .map(|h| h.name())
                    .unwrap_or_default(),
                Entry::Inserted { name, .. } => name,
            };
            !same_name(n, name.as_bytes())
        });
        Ok(true)
    }

    /// Replaces the body; Content-Length is rewritten (or added) to match.
    pub fn set_body(&mut self, body: Vec<u8>) {
        self.body = Some(body);
    }

    /// Writes a Content-Length even when the body is unchanged: a UDP message without
    /// one must get it before it goes out on TCP (RFC 3261 §18.3).
    pub fn ensure_content_length(&mut self) {
        self.force_content_length = true;
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.msg.as_bytes().len() + 256);
        self.write_to(&mut out);
        out
    }

    /// Appends the edited message to `out` (a buffer the caller reuses).
    pub fn write_to(&self, out: &mut Vec<u8>) {
        let head = self.head();
        let raw = head.raw();
        self.write_start_line(raw, out);
        let body = self.body.as_deref().unwrap_or(self.msg.body());
        let fix_length = self.body.is_some() || self.force_content_length;
        let mut length_written = false;
        for e in &self.entries {
            if fix_length && same_name(self.name_of(e), b"Content-Length") {
                if !length_written {
                    self.write_field(e, Some(body.len().to_string().as_bytes()), out);
                    length_written = true;
                }
                continue;
            }
            self.write_field(e, None, out);
        }
        if fix_length && !length_written {
            out.extend_from_slice(format!("Content-Length: {}\r\n", body.len()).as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(body);
    }

    fn write_start_line(&self, raw: &[u8], out: &mut Vec<u8>) {
        let end = self.head().start_end();
        match (&self.request_uri, self.head().uri_range()) {
            (Some(uri), Some(r)) => {
                out.extend_from_slice(raw.get(..r.start).unwrap_or_default());
                out.extend_from_slice(uri);
                out.extend_from_slice(raw.get(r.end..end).unwrap_or_default());
            }
            _ => out.extend_from_slice(raw.get(..end).unwrap_or_default()),
        }
    }

    fn write_field(&self, e: &Entry, override_value: Option<&[u8]>, out: &mut Vec<u8>) {
        let raw = self.head().raw();
        match e {
            Entry::Inserted { name, value } => {
                out.extend_from_slice(name);
                out.extend_from_slice(b": ");
                out.extend_from_slice(override_value.unwrap_or(value));
                out.extend_from_slice(b"\r\n");
            }
            Entry::Kept { index, value } => {
                let Some(h) = self.head().headers().get(*index) else {
                    return;
                };
                let field = h.field_range();
                match override_value.or(value.as_deref()) {
                    None => out.extend_from_slice(raw.get(field).unwrap_or_default()),
                    Some(v) => {
                        // Name, colon and the spacing after it stay as received.
                        out.extend_from_slice(
                            raw.get(field.start..h.value_start()).unwrap_or_default(),
                        );
                        out.extend_from_slice(v);
                        out.extend_from_slice(b"\r\n");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
mod tests {
    use super::*;
    use crate::signaling::sip::Limits;

    const INVITE: &[u8] = b"INVITE sip:bob@b.example SIP/2.0\r\n\
v: SIP/2.0/UDP p1;branch=z9hG4bK1 , SIP/2.0/UDP ua;branch=z9hG4bK0\r\n\
X-Odd  :  keep   me \r\n\
Route: <sip:p2;lr>\r\n\
Content-Length: 4\r\n\
\r\n\
abcd";

    fn parse(b: &[u8]) -> SipMessage<'_> {
        SipMessage::parse_datagram(b, &Limits::default()).unwrap()
    }

    #[test]
    fn untouched_is_identical() {
        let m = parse(INVITE);
        assert_eq!(Editor::new(&m).to_bytes(), INVITE);
    }

    #[test]
    fn edits_touch_only_their_fields() {
        let m = parse(INVITE);
        let mut e = Editor::new(&m);
        e.set_request_uri(b"sip:bob@10.9.9.9").unwrap();
        assert!(e.remove_first_value("Via"));
        e.insert_top("Via", b"SIP/2.0/UDP gw;branch=z9hG4bK2")
            .unwrap();
        assert!(e.remove_first_value("Route"));
        e.insert_before("Content-Length", "Record-Route", b"<sip:gw;lr>")
            .unwrap();
        e.set_body(b"xy".to_vec());
        let out = e.to_bytes();
        let expected = b"INVITE sip:bob@10.9.9.9 SIP/2.0\r\n\
Via: SIP/2.0/UDP gw;branch=z9hG4bK2\r\n\
v: SIP/2.0/UDP ua;branch=z9hG4bK0\r\n\
X-Odd  :  keep   me \r\n\
Record-Route: <sip:gw;lr>\r\n\
Content-Length: 2\r\n\
\r\n\
xy";
        assert_eq!(
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(expected)
        );
    }

    #[test]
    fn replace_all_keeps_the_first_place() {
        let msg = b"SIP/2.0 200 OK\r\nm: <sip:a@h>\r\nX: 1\r\nContact: <sip:b@h>\r\nl: 0\r\n\r\n";
        let m = parse(msg);
        let mut e = Editor::new(&m);
        assert!(e.replace_all("Contact", b"<sip:c@g>, <sip:d@g>").unwrap());
        assert_eq!(
            String::from_utf8_lossy(&e.to_bytes()),
            "SIP/2.0 200 OK\r\nm: <sip:c@g>, <sip:d@g>\r\nX: 1\r\nl: 0\r\n\r\n"
        );
        assert!(!e.replace_all("Route", b"x").unwrap());
    }

    #[test]
    fn refuses_injection() {
        let m = parse(INVITE);
        let mut e = Editor::new(&m);
        assert!(e.insert_top("Via", b"x\r\nEvil: 1").is_err());
        assert!(e.insert_top("Bad Name", b"x").is_err());
        assert!(e.replace_value("Route", b"a\nb").is_err());
        assert!(e.set_request_uri(b"sip:a b").is_err());
    }
}
