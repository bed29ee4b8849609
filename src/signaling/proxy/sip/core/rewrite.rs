//! Rewriting what crosses the boundary: header values, parties, Call-IDs, MANSCDP bodies
//! and the gateway's own Via.

use std::time::{Duration, Instant};

use crate::signaling::manscdp;
use crate::signaling::sip::{Head, Host, NameAddr, Uri};

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
