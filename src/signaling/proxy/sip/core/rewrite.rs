//! Rewriting what crosses the boundary: header values, parties, Call-IDs, MANSCDP bodies
//! and the gateway's own Via.

use std::time::{Duration, Instant};

use crate::signaling::manscdp;
use crate::signaling::sip::{Editor, Head, Host, NameAddr, Uri};

use super::{Core, Face, MAX_CALL_IDS, TOKEN_PARAM};

/// A header value on one line: each CRLF and the whitespace after it become one space.
pub(super) fn unfold(v: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len());
    let mut folding = false;
    for &b in v {
        match b {
            b'\r' | b'\n' => folding = true,
            b' ' | b'\t' if folding => {}
            _ => {
                if folding {
                    out.push(b' ');
                    folding = false;
                }
                out.push(b);
            }
        }
    }
    out
}

/// Where `inner` (a subslice) starts in `outer`.
pub(super) fn offset_in(outer: &[u8], inner: &[u8]) -> Option<usize> {
    let o = outer.as_ptr() as usize;
    let i = inner.as_ptr() as usize;
    (i >= o && i + inner.len() <= o + outer.len()).then(|| i - o)
}

/// Replaces `host[:port]` of the SIP URI `uri` (a subslice of `value`) with `hostport`.
pub(super) fn replace_hostport(value: &[u8], uri: &Uri<'_>, hostport: &str) -> Option<Vec<u8>> {
    let start = offset_in(value, uri.host_text)?;
    let mut end = start + uri.host_text.len();
    if uri.port.is_some() {
        let digits = value
            .get(end + 1..)?
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        end += 1 + digits;
    }
    let mut out = Vec::with_capacity(value.len() + 16);
    out.extend_from_slice(value.get(..start)?);
    out.extend_from_slice(hostport.as_bytes());
    out.extend_from_slice(value.get(end..)?);
    Some(out)
}

pub(super) fn token_of(uri: &Uri<'_>) -> Option<String> {
    uri.param(TOKEN_PARAM)
        .flatten()
        .and_then(|t| std::str::from_utf8(t).ok())
        .map(str::to_owned)
}

pub(super) fn is_sdp(head: &Head<'_>) -> bool {
    head.header("Content-Type").is_some_and(|h| {
        let v = h.value();
        let t = v.split(|&b| b == b';').next().unwrap_or_default();
        String::from_utf8_lossy(t)
            .trim()
            .eq_ignore_ascii_case("application/sdp")
    })
}

/// A multipart body that contains SDP: vgate cannot rewrite inside it.
pub(super) fn hides_sdp(head: &Head<'_>, body: &[u8]) -> bool {
    head.header("Content-Type").is_some_and(|h| {
        String::from_utf8_lossy(h.value())
            .trim_start()
            .to_ascii_lowercase()
            .starts_with("multipart/")
    }) && String::from_utf8_lossy(body)
        .to_ascii_lowercase()
        .contains("application/sdp")
}

impl Core {
    /// From/To: a host that is an IP address of the sending domain becomes the gateway's
    /// address on the receiving face.
    pub(super) fn rewrite_party(&self, value: &[u8], from: Face) -> Option<Vec<u8>> {
        let na = NameAddr::parse(value).ok()?;
        let uri = na.sip_uri().ok()?;
        match uri.host {
            Host::V4(ip) if self.routes.domain(self.dom(from)).contains(ip) => {
                replace_hostport(value, &uri, &self.gw_ip(from.other()).to_string())
            }
            _ => None,
        }
    }
}

impl Core {
    /// Call-ID hiding: the Call-ID `received` on `face` and the one the other face sees,
    /// made up (random, `@` the gateway's address there) the first time a Call-ID crosses.
    /// A device's `...@192.168.1.64` never reaches the other domain, and the answer gets
    /// its own Call-ID back. A mapping lives `life` from now (at least: a transaction's
    /// `TXN_LINGER`; a dialog's `DIALOG_IDLE`; a registration's lifetime), and as long as
    /// its call.
    /// Returns (the Call-ID on the listen face, which keys the tables; the Call-ID the
    /// other face sees, for the message crossing), or None when the table is full.
    pub(super) fn call_ids(
        &mut self,
        face: Face,
        received: &[u8],
        life: Duration,
        now: Instant,
    ) -> Option<(Vec<u8>, Vec<u8>)> {
        let until = now + life;
        let (f, o) = (face.index(), face.other().index());
        let other = match self.cids[f].get_mut(received) {
            Some(e) => {
                e.1 = e.1.max(until);
                e.0.clone()
            }
            None => {
                if self.cids[f].len() >= MAX_CALL_IDS {
                    self.sweep(now);
                    if self.cids[f].len() >= MAX_CALL_IDS {
                        self.counters.table_full += 1;
                        return None;
                    }
                }
                let made = format!("{}@{}", self.next_id(), self.gw_ip(face.other())).into_bytes();
                self.cids[f].insert(received.to_vec(), (made.clone(), until));
                self.cids[o].insert(made.clone(), (received.to_vec(), until));
                made
            }
        };
        if let Some(e) = self.cids[o].get_mut(&other) {
            e.1 = e.1.max(until);
        }
        let canonical = match face {
            Face::Listen => received.to_vec(),
            Face::Upstream => other.clone(),
        };
        Some((canonical, other))
    }

    /// A subscription's Call-IDs (`received` on `face`): mapped until `until`, sooner or
    /// later than before (a subscription's lifetime is what its last SUBSCRIBE answer or
    /// NOTIFY said, not the longest anyone said). A call's mapping is never cut short.
    pub(super) fn call_ids_until(&mut self, face: Face, received: &[u8], until: Instant) {
        let (f, o) = (face.index(), face.other().index());
        let Some(e) = self.cids[f].get_mut(received) else {
            return;
        };
        let other = e.0.clone();
        let canonical = match face {
            Face::Listen => received,
            Face::Upstream => other.as_slice(),
        };
        if self.calls.contains_key(canonical) {
            return;
        }
        e.1 = until;
        if let Some(e) = self.cids[o].get_mut(&other) {
            e.1 = until;
        }
    }

    /// The Call-ID face `face` knows a call by (`canonical`: its Call-ID on the listen face).
    pub(super) fn call_id_on(&self, canonical: &[u8], face: Face) -> Vec<u8> {
        match face {
            Face::Listen => canonical.to_vec(),
            Face::Upstream => self.cids[Face::Listen.index()]
                .get(canonical)
                .map_or_else(|| canonical.to_vec(), |e| e.0.clone()),
        }
    }

    /// A MANSCDP body going to face `to`: its address fields rewritten per the route's
    /// `manscdp_addresses` (None: unchanged).
    pub(super) fn manscdp_body(&mut self, body: &[u8], to: Face) -> Option<Vec<u8>> {
        let local = self.local[to.index()];
        let new = manscdp::rewrite_addresses(
            body,
            self.policy.manscdp_addresses,
            *local.ip(),
            local.port(),
        )?;
        self.counters.manscdp_rewritten += 1;
        Some(new)
    }

    pub(super) fn our_via(&self, to: Face, branch: &str) -> Vec<u8> {
        format!(
            "SIP/2.0/{} {};branch={branch};rport",
            self.transport_name(),
            self.local[to.index()]
        )
        .into_bytes()
    }
}

/// The value of header `name` as whole seconds (`Expires: 3600`).
pub(super) fn header_secs(head: &Head<'_>, name: &str) -> Option<u64> {
    head.header(name)
        .and_then(|h| std::str::from_utf8(h.value()).ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
}

/// How long a subscription's Call-IDs stay mapped after the notifier granted `expires`
/// seconds (`None`: it named none, an idle dialog's life; 0: unsubscribed, a linger).
pub(super) fn subscription_life(expires: Option<u64>) -> Duration {
    match expires {
        None => super::DIALOG_IDLE,
        Some(s) => Duration::from_secs(s).min(super::MAX_REGISTRATION) + super::TXN_LINGER,
    }
}

/// What a NOTIFY's `Subscription-State` says of the subscription's life (RFC 6665
/// §8.2.3): `terminated` a linger, `active`/`pending` with `expires=N` N seconds (and a
/// linger); `None` when it names no time.
pub(super) fn notified_life(state: &str) -> Option<Duration> {
    let mut parts = state.split(';').map(str::trim);
    let value = parts.next()?;
    if value.eq_ignore_ascii_case("terminated") {
        return Some(super::TXN_LINGER);
    }
    parts
        .filter_map(|p| p.split_once('='))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("expires"))
        .and_then(|(_, v)| v.trim().parse::<u64>().ok())
        .map(|s| subscription_life(Some(s)))
}

/// The GB/T 28181-2022 Annex H path headers: the SIP URIs of the hops a request took or
/// should take.
pub(super) const PATH_HEADERS: [&str; 2] = ["X-RoutePath", "X-PreferredPath"];

/// The elements of a list header value: split at the commas outside `<...>` and quotes.
fn list_items(v: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let (mut angle, mut quoted, mut escaped) = (false, false, false);
    let mut start = 0;
    for (i, &b) in v.iter().enumerate() {
        if quoted {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => quoted = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => quoted = true,
            b'<' => angle = true,
            b'>' => angle = false,
            b',' if !angle => {
                out.push(v.get(start..i).unwrap_or_default());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(v.get(start..).unwrap_or_default());
    out
}

fn trim(v: &[u8]) -> &[u8] {
    let s = v
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(v.len());
    let e = v
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(s, |e| e + 1);
    v.get(s..e).unwrap_or_default()
}

/// The `uri=` of Digest credentials (an `Authorization` or `Proxy-Authorization` value),
/// its quotes removed.
pub(super) fn digest_uri(v: &[u8]) -> Option<&[u8]> {
    let v = trim(v);
    let (scheme, params) = v.split_at(v.iter().position(|b| b.is_ascii_whitespace())?);
    if !scheme.eq_ignore_ascii_case(b"Digest") {
        return None;
    }
    list_items(params).into_iter().find_map(|p| {
        let eq = p.iter().position(|&b| b == b'=')?;
        let (name, value) = (trim(p.get(..eq)?), trim(p.get(eq + 1..)?));
        name.eq_ignore_ascii_case(b"uri").then(|| {
            value
                .strip_prefix(b"\"")
                .and_then(|v| v.strip_suffix(b"\""))
                .unwrap_or(value)
        })
    })
}

/// Whether the request carries Digest credentials computed over its Request-URI as
/// received (`uri=` equal to it): rewriting that Request-URI would make them fail at a
/// registrar that checks `uri=` against the Request-URI (RFC 2617 §3.2.2.5, RFC 7616
/// §3.4.6), whatever the `algorithm` (MD5, SHA-256, GB/T 28181-2022's SM3).
pub(super) fn credentials_cover_request_uri(head: &Head<'_>) -> bool {
    let Some(ruri) = head.request_uri() else {
        return false;
    };
    ["Authorization", "Proxy-Authorization"].iter().any(|name| {
        head.headers_named(name)
            .any(|h| digest_uri(&unfold(h.value())).is_some_and(|u| u == ruri))
    })
}

impl Core {
    /// An Annex H path header value going from face `from` to the other: each SIP URI
    /// whose host is an address of `from`'s domain names the gateway's hop on the
    /// receiving face instead (its user, the hop's GB/T 28181 ID, kept). `Ok(None)`:
    /// nothing to change; `Err(())`: an element that is not a SIP URI vgate can read,
    /// so the header is removed rather than let an address through.
    pub(super) fn rewrite_path(&self, value: &[u8], from: Face) -> Result<Option<Vec<u8>>, ()> {
        let hop = self.local[from.other().index()].to_string();
        let mut changed = false;
        let mut items = Vec::new();
        for item in list_items(value) {
            let item = trim(item);
            let na = NameAddr::parse(item).map_err(|_| ())?;
            let uri = na.sip_uri().map_err(|_| ())?;
            match uri.host {
                Host::V4(ip) if self.routes.domain(self.dom(from)).contains(ip) => {
                    items.push(replace_hostport(item, &uri, &hop).ok_or(())?);
                    changed = true;
                }
                Host::V4(_) | Host::Name(_) => items.push(item.to_vec()),
                _ => return Err(()),
            }
        }
        Ok(changed.then(|| items.join(&b", "[..])))
    }

    /// Rewrites (or removes) the Annex H path headers of a message crossing from `from`.
    pub(super) fn rewrite_paths(&self, head: &Head<'_>, ed: &mut Editor<'_, '_>, from: Face) {
        for name in PATH_HEADERS {
            let values: Vec<Vec<u8>> = head
                .headers_named(name)
                .map(|h| unfold(h.value()))
                .collect();
            if values.is_empty() {
                continue;
            }
            let joined = values.join(&b", "[..]);
            match self.rewrite_path(&joined, from) {
                Ok(None) => {}
                Ok(Some(v)) => {
                    let _ = ed.replace_all(name, &v);
                }
                Err(()) => {
                    ed.remove_all(name);
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn digest_uri_of_credentials() {
        let v = br#"Digest username="34020000001320000001", realm="3402000000", nonce="a,b", uri="sip:34020000002000000001@10.1.0.1:5060", response="00", algorithm=SM3"#;
        assert_eq!(
            digest_uri(v),
            Some(&b"sip:34020000002000000001@10.1.0.1:5060"[..])
        );
        assert_eq!(
            digest_uri(b"  digest URI = sip:x@y , nc=1"),
            Some(&b"sip:x@y"[..])
        );
        assert_eq!(digest_uri(b"Basic dXNlcjpwYXNz"), None);
        assert_eq!(digest_uri(b"Digest realm=\"x\""), None);
        assert_eq!(digest_uri(b""), None);
    }

    #[test]
    fn list_items_split_outside_brackets_and_quotes() {
        let v = br#"<sip:a@1.2.3.4;x=1,2>, "Gate, 1" <sip:b@d>,sip:c@e"#;
        let items: Vec<&[u8]> = list_items(v).into_iter().map(trim).collect();
        assert_eq!(
            items,
            [
                &b"<sip:a@1.2.3.4;x=1,2>"[..],
                b"\"Gate, 1\" <sip:b@d>",
                b"sip:c@e"
            ]
        );
    }
}
