//! Where a message enters the core: framing and triage, the access checks, and the
//! answers the core gives itself (403, 503, errors on a stream).

use std::time::Instant;

use crate::clock::now_ms;
use crate::signaling::sip::{
    build_response, triage_datagram, triage_framed, Head, ParseFailure, SipError, SipMessage,
    Verdict,
};

use super::{Core, Face, Out, Peer, LOG_FORBIDDEN, LOG_UNFRAMEABLE};
use crate::signaling::sip::{Host, Uri};

/// What vgate's answer to a probe says it relays.
const PROBE_HEADERS: &[(&str, &str)] = &[(
    "Allow",
    "INVITE, ACK, BYE, CANCEL, OPTIONS, INFO, MESSAGE, SUBSCRIBE, NOTIFY, REGISTER, UPDATE, PRACK, REFER",
)];
use crate::signaling::proxy::sip::access::{parties_allowed, peer_allowed};

impl Core {
    /// Handles one received message (a datagram, or one framed TCP message).
    pub fn on_message(&mut self, face: Face, src: Peer, buf: &[u8], now: Instant) -> Vec<Out> {
        let mut out = Vec::new();
        let is_request =
            !buf.starts_with(b"SIP/") && !buf.iter().all(|b| matches!(b, b'\r' | b'\n'));
        let in_domain = self.routes.domain(self.dom(face)).contains(*src.addr.ip());
        let allowed = match face {
            Face::Listen => peer_allowed(&self.policy.allow_peers, in_domain, *src.addr.ip()),
            Face::Upstream => in_domain,
        };
        if is_request && !self.limiter.allow(*src.addr.ip(), now) {
            self.counters.rate_limited += 1;
            return out;
        }
        let verdict = if self.tcp {
            triage_framed(buf, &self.limits)
        } else {
            triage_datagram(buf, &self.limits)
        };
        match verdict {
            Verdict::Drop(crate::signaling::sip::Dropped::KeepAlive) => {
                self.counters.dropped_keepalive += 1;
            }
            Verdict::Drop(why) => {
                self.counters.dropped_malformed += 1;
                if let crate::signaling::sip::Dropped::Unparsable(SipError::TooLarge { .. }) = why {
                    self.counters.too_large += 1;
                }
            }
            Verdict::Answer { head, reject } => {
                if !allowed {
                    self.forbid(face, src, &head, "source address not allowed", &mut out);
                    return out;
                }
                self.counters.answered_errors += 1;
                let tag = self.next_id();
                if let Ok(bytes) = reject.response(&head, &tag) {
                    out.push(Out {
                        face,
                        to: src,
                        bytes,
                    });
                }
            }
            Verdict::Forward(msg) => {
                match (msg.head().method(), msg.head().status()) {
                    (Some(m), _) => self.stats.request(m),
                    (None, Some(code)) => self.stats.response(code),
                    _ => {}
                }
                if msg.head().is_request() {
                    self.counters.requests += 1;
                    if !allowed {
                        self.forbid(
                            face,
                            src,
                            msg.head(),
                            "source address not allowed",
                            &mut out,
                        );
                    } else if self.is_probe(face, msg.head()) {
                        // A dispatcher's (Kamailio's) or a peer's keep-alive addressed to
                        // vgate itself: answered here, nothing crosses.
                        self.counters.options_answered += 1;
                        self.answer((face, src), msg.head(), 200, "OK", PROBE_HEADERS, &mut out);
                    } else if !parties_allowed(&self.policy.allow_ids, msg.head()) {
                        self.forbid(face, src, msg.head(), "GB/T 28181 ID not allowed", &mut out);
                    } else {
                        self.request(face, src, &msg, now, &mut out);
                    }
                } else {
                    self.counters.responses += 1;
                    if allowed {
                        self.response(face, src, &msg, now, &mut out);
                    } else {
                        self.counters.forbidden += 1;
                    }
                }
            }
        }
        out
    }

    /// A TCP stream that cannot be framed any more (`err` from [`frame`], `bytes` what was
    /// buffered, the offending message first): counted, logged (rate-limited), and
    /// answered when its head is a readable request from an allowed peer — `513 Message
    /// Too Large` for a message over `max_message`, `400` for a missing or double
    /// Content-Length — with a Warning naming the problem. The caller then closes the
    /// connection: nothing after this point of the stream can be trusted.
    ///
    /// [`frame`]: crate::signaling::sip::frame
    pub fn on_stream_error(
        &mut self,
        face: Face,
        src: Peer,
        bytes: &[u8],
        err: &SipError,
        _now: Instant,
    ) -> Vec<Out> {
        let mut out = Vec::new();
        self.counters.tcp_unframeable += 1;
        if matches!(
            err,
            SipError::TooLarge { .. }
                | SipError::TooManyHeaders { .. }
                | SipError::LineTooLong { .. }
                | SipError::HeadTooLarge { .. }
        ) {
            self.counters.too_large += 1;
        }
        if let Some(suppressed) = LOG_UNFRAMEABLE.check(now_ms()) {
            tracing::warn!(route = %self.name, peer = %src.addr, suppressed, "SIP/TCP stream refused and closed: {err}");
        }
        let in_domain = self.routes.domain(self.dom(face)).contains(*src.addr.ip());
        let allowed = match face {
            Face::Listen => peer_allowed(&self.policy.allow_peers, in_domain, *src.addr.ip()),
            Face::Upstream => in_domain,
        };
        // The header section alone, when it ends within the limit: enough to answer.
        let skip = bytes
            .iter()
            .take_while(|b| matches!(b, b'\r' | b'\n'))
            .count();
        let rest = bytes.get(skip..).unwrap_or_default();
        let window = rest.get(..self.limits.max_message).unwrap_or(rest);
        let Some(end) = window.windows(4).position(|w| w == b"\r\n\r\n") else {
            return out;
        };
        let head_bytes = rest.get(..end + 4).unwrap_or_default();
        let head = match SipMessage::parse_datagram(head_bytes, &self.limits) {
            Ok(m) => m.head().clone(),
            Err(ParseFailure { head: Some(h), .. }) => *h,
            Err(_) => return out,
        };
        if !allowed || !head.is_request() || head.method() == Some(b"ACK") {
            return out;
        }
        self.counters.answered_errors += 1;
        let tag = self.next_id();
        let warning = format!("399 vgate \"{err}\"");
        if let Ok(bytes) = build_response(
            &head,
            err.status(),
            err.phrase(),
            &tag,
            &[("Warning", &warning)],
        ) {
            out.push(Out {
                face,
                to: src,
                bytes,
            });
        }
        out
    }

    /// An `OPTIONS` whose Request-URI names this face's own gateway address without a user
    /// part (RFC 3261 §11: a request for the server itself, as a load balancer's probe
    /// is): vgate answers it, so a probe says whether this gateway's proxy is alive.
    fn is_probe(&self, face: Face, head: &Head<'_>) -> bool {
        if head.method() != Some(b"OPTIONS") {
            return false;
        }
        let Some(uri) = head.request_uri().and_then(|u| Uri::parse(u).ok()) else {
            return false;
        };
        let local = self.local[face.index()];
        uri.user.is_none()
            && uri.host == Host::V4(*local.ip())
            && uri.port.is_none_or(|p| p == local.port())
    }

    pub(super) fn forbid(
        &mut self,
        face: Face,
        src: Peer,
        head: &Head<'_>,
        why: &str,
        out: &mut Vec<Out>,
    ) {
        self.counters.forbidden += 1;
        self.refuse(face, src, head, why, out);
    }

    /// `403 Forbidden` with a Warning naming `why` (an ACK gets nothing), logged
    /// rate-limited; the caller counts it.
    pub(super) fn refuse(
        &mut self,
        face: Face,
        src: Peer,
        head: &Head<'_>,
        why: &str,
        out: &mut Vec<Out>,
    ) {
        if let Some(suppressed) = LOG_FORBIDDEN.check(now_ms()) {
            tracing::warn!(route = %self.name, peer = %src.addr, suppressed, "SIP request refused with 403: {why}");
        }
        if head.method() == Some(b"ACK") {
            return;
        }
        let tag = self.next_id();
        let warning = format!("399 vgate \"{why}\"");
        if let Ok(bytes) = build_response(head, 403, "Forbidden", &tag, &[("Warning", &warning)]) {
            out.push(Out {
                face,
                to: src,
                bytes,
            });
        }
    }

    pub(super) fn answer(
        &mut self,
        (face, src): (Face, Peer),
        head: &Head<'_>,
        code: u16,
        reason: &str,
        extra: &[(&str, &str)],
        out: &mut Vec<Out>,
    ) -> Option<Vec<u8>> {
        if head.method() == Some(b"ACK") {
            return None;
        }
        if code >= 300 {
            self.counters.answered_errors += 1;
        }
        let tag = self.next_id();
        let bytes = build_response(head, code, reason, &tag, extra).ok()?;
        out.push(Out {
            face,
            to: src,
            bytes: bytes.clone(),
        });
        Some(bytes)
    }

    /// `503` with `Retry-After`: a table is full.
    pub(super) fn busy(&mut self, to: (Face, Peer), head: &Head<'_>, out: &mut Vec<Out>) {
        self.answer(
            to,
            head,
            503,
            "Service Unavailable",
            &[("Retry-After", "5")],
            out,
        );
    }
}
