//! Message traces: with `trace = true` on a signaling route, every SIP or RTSP message that
//! crosses it is logged at debug level (target `vgate::trace`) as it arrived on one face and
//! as it left on the other, after rewriting, so an integrator sees both sides of an interop
//! problem. Secrets are redacted (digest responses, Basic credentials, passwords in URLs,
//! SRTP keys); at most [`PER_SECOND`] messages per route and second are written, and the
//! next line says how many were left out. Nothing is formatted unless the line will be
//! written: `vgate log-level info,vgate::trace=debug` turns them on without other debug lines.

use std::fmt::Write as _;

use std::sync::Mutex;

use crate::clock::now_ms;

/// Messages traced per route and second, at most.
pub const PER_SECOND: u64 = 50;
/// Longest message text written; the rest is counted, not shown.
const MAX_TEXT: usize = 8192;

/// Which way a message went through the proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// As received, before rewriting.
    In,
    /// As sent, after rewriting.
    Out,
}

impl Dir {
    fn name(self) -> &'static str {
        match self {
            Dir::In => "in",
            Dir::Out => "out",
        }
    }
}

/// The tracer of one signaling route.
#[derive(Debug)]
pub struct Tracer {
    route: String,
    kind: &'static str,
    budget: Mutex<Budget>,
}

/// [`PER_SECOND`] messages per one-second window; the rest are counted.
#[derive(Debug, Default)]
struct Budget {
    window: u64,
    used: u64,
    suppressed: u64,
}

impl Budget {
    /// `Some(suppressed since the last message written)` when one may be written now.
    fn take(&mut self, now_ms: u64) -> Option<u64> {
        let window = now_ms / 1000;
        if window != self.window {
            self.window = window;
            self.used = 0;
        }
        if self.used >= PER_SECOND {
            self.suppressed += 1;
            return None;
        }
        self.used += 1;
        Some(std::mem::take(&mut self.suppressed))
    }
}

impl Tracer {
    pub fn new(route: &str, kind: &'static str) -> Tracer {
        Tracer {
            route: route.to_string(),
            kind,
            budget: Mutex::new(Budget::default()),
        }
    }

    /// Traces one message: `face` names the side it crossed (e.g. `listen`, `upstream`,
    /// `client`, `server`), `peer` the address it came from or went to.
    pub fn message(&self, dir: Dir, face: &str, peer: &dyn std::fmt::Display, bytes: &[u8]) {
        if !tracing::enabled!(target: "vgate::trace", tracing::Level::DEBUG) {
            return;
        }
        let taken = self
            .budget
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take(now_ms());
        let Some(suppressed) = taken else {
            return;
        };
        let text = redact(&String::from_utf8_lossy(bytes));
        let mut shown: String = text.chars().take(MAX_TEXT).collect();
        if shown.len() < text.len() {
            let _ = write!(shown, "…({} more bytes)", text.len() - shown.len());
        }
        tracing::debug!(
            target: "vgate::trace",
            route = %self.route,
            kind = self.kind,
            dir = dir.name(),
            face,
            peer = %peer,
            suppressed,
            "{} message: {}",
            self.kind,
            shown.escape_debug()
        );
    }
}

/// The message with its secrets replaced by `<redacted>`: the `response` of Digest
/// credentials, Basic credentials, the password of `scheme://user:password@` URLs and the key
/// of SDP `a=crypto` / `a=key-mgmt` lines.
pub fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&redact_line(line));
    }
    out
}

fn redact_line(line: &str) -> String {
    let lower = line.to_ascii_lowercase();
    if let Some(rest) = ["authorization:", "proxy-authorization:"]
        .iter()
        .find_map(|h| lower.strip_prefix(h).map(|_| &line[h.len()..]))
    {
        let name = &line[..line.len() - rest.len()];
        let value = rest.trim_start();
        let scheme = value.split_whitespace().next().unwrap_or("");
        if scheme.eq_ignore_ascii_case("digest") {
            return format!("{name} {}", redact_param(value, "response"));
        }
        return format!("{name} {scheme} <redacted>");
    }
    if lower.starts_with("a=crypto:") {
        if let Some(p) = lower.find("inline:") {
            return format!("{}inline:<redacted>", &line[..p]);
        }
    }
    if lower.starts_with("a=key-mgmt:") {
        return "a=key-mgmt:<redacted>".to_string();
    }
    redact_url_passwords(line)
}

/// `param="value"` (or unquoted) in a credentials list → `param="<redacted>"`.
fn redact_param(value: &str, param: &str) -> String {
    let lower = value.to_ascii_lowercase();
    let mut out = String::new();
    let mut rest = 0;
    let mut search = 0;
    while let Some(p) = lower[search..].find(param).map(|p| p + search) {
        let before_ok = p == 0 || matches!(lower.as_bytes()[p - 1], b' ' | b',' | b'\t');
        let after = lower[p + param.len()..].trim_start();
        if !before_ok || !after.starts_with('=') {
            search = p + param.len();
            continue;
        }
        let eq = p + param.len() + (lower[p + param.len()..].len() - after.len());
        let v = eq + 1;
        let end = if value[v..].trim_start().starts_with('"') {
            let q = v + (value[v..].len() - value[v..].trim_start().len());
            value[q + 1..]
                .find('"')
                .map(|e| q + 1 + e + 1)
                .unwrap_or(value.len())
        } else {
            value[v..]
                .find([',', ' '])
                .map(|e| v + e)
                .unwrap_or(value.len())
        };
        out.push_str(&value[rest..v]);
        out.push_str("\"<redacted>\"");
        rest = end;
        search = end;
    }
    out.push_str(&value[rest..]);
    out
}

/// `scheme://user:password@host` → `scheme://user:<redacted>@host`, anywhere in the line.
fn redact_url_passwords(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(p) = rest.find("://") {
        let (head, tail) = rest.split_at(p + 3);
        out.push_str(head);
        let auth_end = tail.find(['/', ' ', '>', '"', ';']).unwrap_or(tail.len());
        match tail[..auth_end].rfind('@') {
            Some(at) => {
                let userinfo = &tail[..at];
                match userinfo.find(':') {
                    Some(c) => {
                        out.push_str(&userinfo[..c]);
                        out.push_str(":<redacted>");
                    }
                    None => out.push_str(userinfo),
                }
                out.push_str(&tail[at..auth_end]);
            }
            None => out.push_str(&tail[..auth_end]),
        }
        rest = &tail[auth_end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_per_second_window() {
        let mut b = Budget::default();
        for _ in 0..PER_SECOND {
            assert_eq!(b.take(5_000), Some(0));
        }
        assert_eq!(b.take(5_999), None);
        assert_eq!(b.take(5_999), None);
        assert_eq!(b.take(6_000), Some(2));
    }

    #[test]
    fn digest_response_is_redacted_the_rest_kept() {
        let m = "REGISTER sip:x SIP/2.0\r\nAuthorization: Digest username=\"34020000001320000001\", realm=\"3402000000\", nonce=\"abc\", uri=\"sip:x\", response=\"0123456789abcdef\", algorithm=MD5\r\nCall-ID: 1\r\n";
        let r = redact(m);
        assert!(r.contains("username=\"34020000001320000001\""), "{r}");
        assert!(r.contains("response=\"<redacted>\""), "{r}");
        assert!(!r.contains("0123456789abcdef"), "{r}");
        assert!(r.contains("nonce=\"abc\""), "{r}");
        assert!(r.ends_with("Call-ID: 1\r\n"), "{r}");
    }

    #[test]
    fn basic_urls_and_keys_are_redacted() {
        let m = "DESCRIBE rtsp://admin:s3cret@10.0.0.5/stream RTSP/1.0\r\nproxy-authorization: Basic YWRtaW46czNjcmV0\r\n\r\na=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:PS1uQCVeeCFCanVmcjkpPywjNWhcYD0mXXtxaVBR\r\na=key-mgmt:mikey AQAFgM0=\r\n";
        let r = redact(m);
        for secret in ["s3cret", "YWRtaW46czNjcmV0", "PS1uQCVe", "AQAFgM0"] {
            assert!(!r.contains(secret), "{secret} in {r}");
        }
        assert!(
            r.starts_with("DESCRIBE rtsp://admin:<redacted>@10.0.0.5/stream RTSP/1.0"),
            "{r}"
        );
        assert!(r.contains("proxy-authorization: Basic <redacted>"), "{r}");
        assert!(
            r.contains("a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:<redacted>"),
            "{r}"
        );
        // No password, nothing to hide.
        assert_eq!(
            redact("Contact: <sip:34020000001320000001@10.0.0.9:5060>"),
            "Contact: <sip:34020000001320000001@10.0.0.9:5060>"
        );
        assert_eq!(
            redact("Content-Base: rtsp://10.0.0.5/stream/"),
            "Content-Base: rtsp://10.0.0.5/stream/"
        );
    }
}
