//! Requests: choosing where each one goes, rewriting and forwarding it, CANCEL and the
//! requests the core builds from an INVITE.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::clock::now_ms;
use crate::config::DomainId;
use crate::signaling::manscdp;
use crate::signaling::sip::{build_response, Editor, Head, Host, Limits, SipMessage, Uri};

use super::calls::call_label;
use super::rewrite::{
    credentials_cover_request_uri, hides_sdp, is_sdp, replace_hostport, token_of, unfold,
};
use super::{
    BindRefused, Call, Core, Face, InKey, Out, Peer, Target, Txn, BRANCH_PREFIX, DIALOG_IDLE,
    LOG_FORBIDDEN, LOG_REFUSED_MEDIA, MAX_CALLS, MAX_TXNS, TXN_LINGER,
};
use crate::signaling::proxy::sip::media::{CallMedia, MediaError};

impl Core {
    /// Finds where a request goes: a binding token, the dialog, or the upstream.
    /// `call_id`: the request's Call-ID on the listen face (the key of the call table).
    pub(super) fn target(
        &mut self,
        face: Face,
        head: &Head<'_>,
        call_id: &[u8],
        now: Instant,
    ) -> Result<Target, (u16, &'static str)> {
        let ruri = head.request_uri().unwrap_or_default();
        let uri = Uri::parse(ruri).map_err(|_| (400u16, "Bad Request - Malformed Request-URI"))?;
        if let Some(tok) = token_of(&uri) {
            let b = self
                .bindings
                .get_mut(&tok)
                .filter(|b| b.face == face.other() && !b.pending)
                .ok_or((404u16, "Not Found"))?;
            b.expires = b.expires.max(now + DIALOG_IDLE);
            return Ok((b.peer, Some(b.uri.clone())));
        }
        let in_dialog = head.to().ok().and_then(|t| t.tag()).is_some();
        if in_dialog {
            if let Some(tok) = self
                .calls
                .get(call_id)
                .and_then(|c| c.contact[face.other().index()].clone())
            {
                if let Some(b) = self.bindings.get(&tok) {
                    return Ok((b.peer, Some(b.uri.clone())));
                }
            }
        }
        match face {
            Face::Listen => {
                let new_uri = match uri.host {
                    Host::V4(ip) if self.routes.domain(self.dom(face)).contains(ip) => {
                        replace_hostport(ruri, &uri, &self.upstream.to_string())
                    }
                    _ => None,
                };
                Ok((Peer::udp(self.upstream), new_uri))
            }
            Face::Upstream => {
                // A platform addressing a device at the address it registered from (our
                // upstream face) or by its domain: the device's registration.
                let ours = match uri.host {
                    Host::V4(ip) => ip == self.gw_ip(face),
                    Host::Name(_) => true,
                    _ => false,
                };
                let user = uri.user.filter(|_| ours).ok_or((404u16, "Not Found"))?;
                let b = self
                    .by_user
                    .get(&(face.other(), user.to_vec()))
                    .and_then(|tok| self.bindings.get(tok))
                    .filter(|b| !b.pending && b.expires > now)
                    .ok_or((404u16, "Not Found"))?;
                self.counters.routed_by_user += 1;
                Ok((b.peer, Some(b.uri.clone())))
            }
        }
    }
}

impl Core {
    /// Whether a request arriving on the upstream face continues something this route
    /// holds, so that [`Core::target`] routes it without the registration table: its
    /// Request-URI carries a binding token of the listen face, or it is in a dialog (To
    /// tag) of a call whose listen-side party this route knows.
    pub(super) fn continues(&self, head: &Head<'_>) -> bool {
        let face = Face::Upstream;
        let uri = head.request_uri().and_then(|r| Uri::parse(r).ok());
        if let Some(tok) = uri.as_ref().and_then(token_of) {
            return self
                .bindings
                .get(&tok)
                .is_some_and(|b| b.face == face.other() && !b.pending);
        }
        if head.to().ok().and_then(|t| t.tag()).is_none() {
            return false;
        }
        let Some((canonical, _)) = head.call_id().and_then(|c| self.cids[face.index()].get(c))
        else {
            return false;
        };
        self.calls
            .get(canonical)
            .and_then(|c| c.contact[face.other().index()].as_ref())
            .is_some_and(|tok| self.bindings.contains_key(tok))
    }

    pub(super) fn forward_request(
        &mut self,
        face: Face,
        src: Peer,
        msg: &SipMessage<'_>,
        key: InKey,
        now: Instant,
        out: &mut Vec<Out>,
    ) {
        let head = msg.head();
        let method = head.method().unwrap_or_default().to_vec();
        let to = face.other();
        if face == Face::Upstream
            && !self.may_start_upstream(*src.addr.ip())
            && !self.continues(head)
        {
            self.counters.upstream_forbidden += 1;
            self.refuse(
                face,
                src,
                head,
                "this source may not start requests on the upstream face",
                out,
            );
            return;
        }
        if self.txns.len() >= MAX_TXNS {
            self.sweep(now);
            if self.txns.len() >= MAX_TXNS {
                self.counters.table_full += 1;
                self.busy((face, src), head, out);
                return;
            }
        }
        let body = msg.body();
        let manscdp = !body.is_empty()
            && head
                .header("Content-Type")
                .is_some_and(|h| manscdp::is_manscdp(h.value()));
        if manscdp {
            let cmds = manscdp::commands(body);
            let (allow, deny) = (&self.policy.manscdp_allow, &self.policy.manscdp_deny);
            let from_b = self.dom(face) == DomainId::B;
            let refusal = manscdp::refused(&cmds, allow, deny)
                .map(|c| (c, "on this route"))
                .or_else(|| {
                    manscdp::denied(&cmds, &self.policy.manscdp_deny_from_b)
                        .filter(|_| from_b)
                        .map(|c| (c, "from domain B (manscdp_deny_from_b)"))
                });
            if let Some((cmd, where_)) = refusal {
                let cmd = String::from_utf8_lossy(cmd).into_owned();
                self.counters.manscdp_refused += 1;
                if let Some(suppressed) = LOG_FORBIDDEN.check(now_ms()) {
                    tracing::warn!(route = %self.name, peer = %src.addr, command = %cmd, suppressed, "MANSCDP command refused with 403 (manscdp_allow / manscdp_deny / manscdp_deny_from_b)");
                }
                let warning =
                    format!("399 vgate \"MANSCDP command {cmd} is not allowed {where_}\"");
                self.answer(
                    (face, src),
                    head,
                    403,
                    "Forbidden",
                    &[("Warning", &warning)],
                    out,
                );
                return;
            }
        }
        let to_tagged = head.to().ok().and_then(|t| t.tag()).is_some();
        let received_cid = head.call_id().unwrap_or_default();
        let life = if to_tagged && method != b"SUBSCRIBE" && method != b"NOTIFY" {
            DIALOG_IDLE
        } else {
            TXN_LINGER
        };
        let Some((call_id, cid_out)) = self.call_ids(face, received_cid, life, now) else {
            self.busy((face, src), head, out);
            return;
        };
        if method == b"NOTIFY" {
            // The notifier says how long the subscription lasts (`terminated`: it is over;
            // its Call-IDs stay a linger for this NOTIFY's answer).
            if let Some(life) = head
                .header("Subscription-State")
                .and_then(|h| std::str::from_utf8(h.value()).ok())
                .and_then(super::rewrite::notified_life)
            {
                self.call_ids_until(face, received_cid, now + life);
            }
        }
        let (dest, new_uri) = match self.target(face, head, &call_id, now) {
            Ok(t) => t,
            Err((code, reason)) => {
                self.answer((face, src), head, code, reason, &[], out);
                return;
            }
        };
        // Credentials computed over the Request-URI as the sender wrote it keep it: the
        // gateway cannot recompute them (docs/gbt28181.md, "Digest authentication").
        let new_uri = new_uri.filter(|_| !credentials_cover_request_uri(head));
        let cseq = head.cseq().map(|c| c.seq).unwrap_or(0);
        let initial_invite = method == b"INVITE" && !to_tagged;
        if !body.is_empty() && hides_sdp(head, body) {
            self.answer(
                (face, src),
                head,
                415,
                "Unsupported Media Type",
                &[("Accept", "application/sdp")],
                out,
            );
            return;
        }
        if initial_invite && !self.calls.contains_key(&call_id) {
            if self.calls.len() >= MAX_CALLS {
                self.sweep(now);
            }
            if self.calls.len() >= MAX_CALLS {
                self.counters.table_full += 1;
                self.busy((face, src), head, out);
                return;
            }
            let label = call_label(&self.name, head.request_uri(), body, &call_id);
            self.calls.insert(
                call_id.clone(),
                Call {
                    media: CallMedia::new(label, self.max_payload)
                        .with_link_face(self.link_face)
                        .with_legs(self.legs.clone())
                        .with_reconnect_window(self.policy.tcp_media_reconnect)
                        .with_media_validation(self.media_validate, self.media_policy),
                    contact: [None, None],
                    view: [None, None],
                    cseq_to: [0, 0],
                    confirmed_ms: None,
                    ended: None,
                    created: now,
                    last_activity: now,
                },
            );
            self.counters.calls_started += 1;
        }
        // SDP first: it may refuse the request.
        let new_body = if !body.is_empty() && is_sdp(head) {
            let from_dom = self.dom(face);
            let (routes, sp, ro) = (Arc::clone(&self.routes), self.source_policy, self.rtp_only);
            let Some(call) = self.calls.get_mut(&call_id) else {
                self.answer(
                    (face, src),
                    head,
                    488,
                    "Not Acceptable Here",
                    &[("Warning", "399 vgate \"SDP outside an INVITE dialog\"")],
                    out,
                );
                return;
            };
            match call.media.cross(&routes, sp, ro, from_dom, body) {
                Ok(b) => Some(b),
                Err(e) => {
                    let media_validation = e.is_media_validation();
                    let MediaError::Refuse {
                        code,
                        reason,
                        warning,
                    } = e;
                    self.counters.media_refused += u64::from(media_validation);
                    if code == 503 {
                        self.counters.no_ports += 1;
                    } else {
                        self.counters.tcp_media_refused += u64::from(warning.contains("over TCP"));
                        if let Some(suppressed) = LOG_REFUSED_MEDIA.check(now_ms()) {
                            tracing::warn!(route = %self.name, call = %String::from_utf8_lossy(&call_id), suppressed, "SDP refused with {code}: {warning}");
                        }
                    }
                    let retry = [("Retry-After", "5"), ("Warning", warning.as_str())];
                    let warn = [("Warning", warning.as_str())];
                    let extra: &[(&str, &str)] = if code == 503 { &retry } else { &warn };
                    let resp = self.answer((face, src), head, code, reason, extra, out);
                    if initial_invite {
                        if let Some(mut c) = self.calls.remove(&call_id) {
                            c.media.close(&self.routes);
                            self.counters.calls_ended += 1;
                        }
                        // Remember the answer so a retransmitted INVITE gets it again.
                        let branch = format!("{BRANCH_PREFIX}{}", self.next_id());
                        self.by_in.insert(key.clone(), branch.clone());
                        self.txns.insert(
                            branch,
                            Txn {
                                in_key: Some(key),
                                from_face: face,
                                src,
                                vias: Vec::new(),
                                from_value: Vec::new(),
                                to_value: Vec::new(),
                                call_id,
                                method,
                                cseq,
                                dest,
                                forwarded: Vec::new(),
                                last_response: resp,
                                final_code: Some(code),
                                created: now,
                                expires: now + TXN_LINGER,
                                internal: false,
                                initial_invite: false,
                                registers: Vec::new(),
                            },
                        );
                    }
                    return;
                }
            }
        } else if manscdp {
            self.manscdp_body(body, to)
        } else {
            None
        };

        let lifetime = if method == b"REGISTER" {
            Duration::from_secs(3600)
        } else {
            DIALOG_IDLE
        };
        let (contact, tokens) = match self.contacts(head, face, src, lifetime, now) {
            Ok(c) => c,
            Err(why) => {
                let (code, reason, extra): (u16, &str, &[(&str, &str)]) = match why {
                    BindRefused::Malformed => (400, "Bad Request - Malformed Contact", &[]),
                    BindRefused::TableFull => (503, "Service Unavailable", &[("Retry-After", "5")]),
                    BindRefused::SourceCap => (
                        403,
                        "Forbidden",
                        &[(
                            "Warning",
                            "399 vgate \"too many contacts from this source\"",
                        )],
                    ),
                };
                self.answer((face, src), head, code, reason, extra, out);
                return;
            }
        };
        let token = tokens.first().cloned();
        let registers = if method == b"REGISTER" {
            tokens
        } else {
            Vec::new()
        };
        let branch = format!("{BRANCH_PREFIX}{}", self.next_id());
        let mut ed = Editor::new(msg);
        if let Some(u) = &new_uri {
            if ed.set_request_uri(u).is_err() {
                self.answer(
                    (face, src),
                    head,
                    400,
                    "Bad Request - Malformed Request-URI",
                    &[],
                    out,
                );
                return;
            }
        }
        let vias: Vec<(Vec<u8>, Vec<u8>)> = head
            .headers_named("Via")
            .map(|h| (h.name().to_vec(), unfold(h.value())))
            .collect();
        ed.remove_all("Via");
        let _ = ed.insert_top("Via", &self.our_via(to, &branch));
        for name in ["Route", "Record-Route", "Path"] {
            ed.remove_all(name);
        }
        let _ = ed.replace_value("Call-ID", &cid_out);
        if let Some(mf) = head
            .header("Max-Forwards")
            .and_then(|h| crate::signaling::sip::parse_max_forwards(h.value()).ok())
        {
            let _ = ed.replace_value("Max-Forwards", mf.saturating_sub(1).to_string().as_bytes());
        }
        if let Some(c) = &contact {
            let _ = ed.replace_all("Contact", c);
        }
        let from_value = head
            .header("From")
            .map(|h| unfold(h.value()))
            .unwrap_or_default();
        let to_value = head
            .header("To")
            .map(|h| unfold(h.value()))
            .unwrap_or_default();
        let from_out = self.rewrite_party(&from_value, face);
        let to_out = self.rewrite_party(&to_value, face);
        if let Some(v) = &from_out {
            let _ = ed.replace_value("From", v);
        }
        if let Some(v) = &to_out {
            let _ = ed.replace_value("To", v);
        }
        self.rewrite_paths(head, &mut ed, face);
        if let Some(b) = new_body {
            ed.set_body(b);
        }
        if self.tcp {
            ed.ensure_content_length();
        }
        let bytes = ed.to_bytes();
        // Dialog bookkeeping.
        let closes = method == b"BYE";
        if let Some(call) = self.calls.get_mut(&call_id) {
            call.last_activity = now;
            call.cseq_to[to.index()] = call.cseq_to[to.index()].max(cseq);
            if initial_invite {
                if let Some(t) = &token {
                    call.contact[face.index()] = Some(t.clone());
                }
                call.view[to.index()] = Some((
                    from_out.clone().unwrap_or_else(|| from_value.clone()),
                    to_out.clone().unwrap_or_else(|| to_value.clone()),
                ));
            } else if let Some(t) = &token {
                call.contact[face.index()] = Some(t.clone());
            }
            if closes && call.ended.is_none() {
                call.media.close(&self.routes);
                call.ended = Some(now);
                self.counters.calls_ended += 1;
            }
        }
        if initial_invite {
            // Our own 100 Trying: the caller stops retransmitting; downstream's is absorbed.
            let tag = self.next_id();
            if let Ok(r) = build_response(head, 100, "Trying", &tag, &[]) {
                out.push(Out {
                    face,
                    to: src,
                    bytes: r,
                });
            }
        }
        let trying = out
            .last()
            .filter(|_| initial_invite)
            .map(|o| o.bytes.clone());
        out.push(Out {
            face: to,
            to: dest,
            bytes: bytes.clone(),
        });
        self.counters.forwarded_requests += 1;
        let expires = if method == b"INVITE" {
            now + self.policy.invite_timeout + TXN_LINGER
        } else {
            now + TXN_LINGER
        };
        self.by_in.insert(key.clone(), branch.clone());
        self.txns.insert(
            branch,
            Txn {
                in_key: Some(key),
                from_face: face,
                src,
                vias,
                from_value,
                to_value,
                call_id,
                method: method.clone(),
                cseq,
                dest,
                forwarded: bytes,
                last_response: trying,
                final_code: (method == b"ACK").then_some(200),
                created: now,
                expires,
                internal: false,
                initial_invite,
                registers,
            },
        );
    }

    pub(super) fn cancel(
        &mut self,
        face: Face,
        src: Peer,
        head: &Head<'_>,
        now: Instant,
        out: &mut Vec<Out>,
    ) {
        let mut key = Self::in_key(face, src, head, b"INVITE");
        key.method = b"INVITE".to_vec();
        let Some(branch) = self.by_in.get(&key).cloned() else {
            self.answer(
                (face, src),
                head,
                481,
                "Call/Transaction Does Not Exist",
                &[],
                out,
            );
            return;
        };
        self.answer((face, src), head, 200, "OK", &[], out);
        let Some(t) = self.txns.get(&branch) else {
            return;
        };
        if t.final_code.is_some() {
            return;
        }
        let (dest, to_face, call_id) = (t.dest, t.from_face.other(), t.call_id.clone());
        if let Some(c) = self.build_cancel(&t.forwarded) {
            out.push(Out {
                face: to_face,
                to: dest,
                bytes: c,
            });
        }
        if let Some(call) = self.calls.get_mut(&call_id) {
            call.media.close(&self.routes);
        }
        let _ = now;
    }

    /// CANCEL for a forwarded INVITE (RFC 3261 §9.1): same Request-URI, Via, From, To,
    /// Call-ID and CSeq number.
    pub(super) fn build_cancel(&self, forwarded: &[u8]) -> Option<Vec<u8>> {
        self.build_from_invite(forwarded, b"CANCEL", None)
    }

    pub(super) fn build_from_invite(
        &self,
        forwarded: &[u8],
        method: &[u8],
        to: Option<&[u8]>,
    ) -> Option<Vec<u8>> {
        let m = SipMessage::parse_datagram(forwarded, &Limits::default()).ok()?;
        let h = m.head();
        let uri = h.request_uri()?;
        let via = h.header("Via")?.value();
        let mut b = Vec::with_capacity(512);
        b.extend_from_slice(method);
        b.push(b' ');
        b.extend_from_slice(uri);
        b.extend_from_slice(b" SIP/2.0\r\nVia: ");
        b.extend_from_slice(via);
        b.extend_from_slice(b"\r\nMax-Forwards: 70\r\nFrom: ");
        b.extend_from_slice(&unfold(h.header("From")?.value()));
        b.extend_from_slice(b"\r\nTo: ");
        b.extend_from_slice(
            &to.map(unfold)
                .unwrap_or_else(|| unfold(h.header("To").map(|x| x.value()).unwrap_or_default())),
        );
        b.extend_from_slice(b"\r\nCall-ID: ");
        b.extend_from_slice(h.call_id()?);
        b.extend_from_slice(format!("\r\nCSeq: {} ", h.cseq().ok()?.seq).as_bytes());
        b.extend_from_slice(method);
        b.extend_from_slice(b"\r\nContent-Length: 0\r\n\r\n");
        Some(b)
    }
}
