//! Responses: matching them to their transaction, rewriting and relaying them, media on
//! the answer, and in-dialog requests the core sends itself.

use std::sync::Arc;
use std::time::Instant;

use crate::clock::now_ms;
use crate::signaling::manscdp;
use crate::signaling::sip::{CSeq, Editor, NameAddr, SipMessage};

use super::rewrite::{header_secs, hides_sdp, is_sdp, subscription_life, unfold};
use super::{
    Core, Face, Out, Peer, Txn, BRANCH_PREFIX, DIALOG_IDLE, LOG_BAD_RESPONSE_SDP, MAX_REGISTRATION,
    TXN_LINGER,
};
use crate::signaling::proxy::sip::media::MediaError;

impl Core {
    pub(super) fn response(
        &mut self,
        face: Face,
        src: Peer,
        msg: &SipMessage<'_>,
        now: Instant,
        out: &mut Vec<Out>,
    ) {
        let head = msg.head();
        let code = head.status().unwrap_or(0);
        let branch = head
            .top_via()
            .ok()
            .and_then(|v| v.branch())
            .and_then(|b| std::str::from_utf8(b).ok())
            .unwrap_or_default()
            .to_owned();
        let cseq_method = head
            .cseq()
            .map(|c: CSeq<'_>| c.method.to_vec())
            .unwrap_or_default();
        let Some(t) = self.txns.get(&branch) else {
            self.counters.dropped_stray_responses += 1;
            return;
        };
        if t.from_face.other() != face || t.internal || cseq_method != t.method || code == 100 {
            // Answers to our own CANCEL/BYE/ACK, and downstream's 100 Trying, end here.
            if t.from_face.other() != face {
                self.counters.dropped_stray_responses += 1;
            }
            if let Some(t) = self.txns.get_mut(&branch) {
                if t.internal && code >= 200 {
                    t.final_code = Some(code);
                }
            }
            return;
        }
        let (from_face, src_peer, initial_invite, call_id) =
            (t.from_face, t.src, t.initial_invite, t.call_id.clone());
        let is_invite = t.method == b"INVITE";
        let orig_from = t.from_value.clone();
        let orig_to = t.to_value.clone();
        let vias = t.vias.clone();
        let forwarded = (is_invite && code >= 300).then(|| t.forwarded.clone());
        let dest = t.dest;

        // Non-2xx final answer to an INVITE: this transaction acknowledges it downstream.
        if let Some(forwarded) = forwarded {
            let resp_to = head.header("To").map(|h| h.value());
            if let Some(ack) = self.build_from_invite(&forwarded, b"ACK", resp_to) {
                out.push(Out {
                    face,
                    to: dest,
                    bytes: ack,
                });
            }
        }
        let body = msg.body();
        let new_body = if !body.is_empty() && is_sdp(head) {
            let (routes, sp, ro) = (Arc::clone(&self.routes), self.source_policy, self.rtp_only);
            let from_dom = self.dom(face);
            let res = self
                .calls
                .get_mut(&call_id)
                .filter(|c| c.ended.is_none())
                .map(|c| c.media.cross(&routes, sp, ro, from_dom, body));
            match res {
                Some(Ok(b)) => Some(b),
                other => {
                    // Never let an SDP through unrewritten: drop the answer. The call then
                    // ends by the INVITE timeout (CANCEL downstream, 408 upstream) — or at
                    // once when media validation refused the answer to an initial INVITE:
                    // the caller gets the 488 with the reason.
                    self.counters.dropped_bad_sdp_responses += 1;
                    let refused = matches!(&other, Some(Err(e)) if e.is_media_validation());
                    self.counters.media_refused += u64::from(refused);
                    let why = match other {
                        Some(Err(MediaError::Refuse { warning, .. })) => warning,
                        _ => "no live call for this SDP".into(),
                    };
                    if let Some(suppressed) = LOG_BAD_RESPONSE_SDP.check(now_ms()) {
                        tracing::warn!(route = %self.name, code, suppressed, "SIP response dropped: its SDP cannot cross: {why}");
                    }
                    if refused && is_invite && initial_invite {
                        self.end_invite(
                            &branch,
                            (488, "Not Acceptable Here"),
                            Some(&why),
                            now,
                            out,
                        );
                    }
                    return;
                }
            }
        } else if !body.is_empty() && hides_sdp(head, body) {
            self.counters.dropped_bad_sdp_responses += 1;
            return;
        } else if !body.is_empty()
            && head
                .header("Content-Type")
                .is_some_and(|h| manscdp::is_manscdp(h.value()))
        {
            self.manscdp_body(body, from_face)
        } else {
            None
        };
        let (contact, token) = match self.contacts(head, face, src, DIALOG_IDLE, now) {
            Ok((c, t)) => (c, t.into_iter().next()),
            Err(_) => {
                self.counters.dropped_malformed += 1;
                return;
            }
        };
        if (200..300).contains(&code) {
            let registers = std::mem::take(
                &mut self
                    .txns
                    .get_mut(&branch)
                    .map(|t| &mut t.registers)
                    .cloned()
                    .unwrap_or_default(),
            );
            self.confirm_registration(&registers, now);
        }
        if (200..300).contains(&code) {
            // A dialog or registration the answer established: its Call-IDs stay mapped
            // (a registration's for as long as it may last, so refreshes keep one Call-ID).
            let received_cid = head.call_id().unwrap_or_default();
            if cseq_method == b"SUBSCRIBE" || cseq_method == b"NOTIFY" {
                // A subscription's Call-IDs live as long as the notifier granted it (an
                // unsubscribe: a linger); a NOTIFY's answer changes nothing.
                if cseq_method == b"SUBSCRIBE" {
                    let life = subscription_life(header_secs(head, "Expires"));
                    self.call_ids_until(face, received_cid, now + life);
                }
            } else {
                let life = if cseq_method == b"REGISTER" {
                    MAX_REGISTRATION + TXN_LINGER
                } else {
                    DIALOG_IDLE
                };
                let _ = self.call_ids(face, received_cid, life, now);
            }
        }
        let cid_back = self.call_id_on(&call_id, from_face);
        let mut ed = Editor::new(msg);
        let _ = ed.replace_value("Call-ID", &cid_back);
        ed.remove_all("Via");
        for (name, value) in vias.iter().rev() {
            let name = std::str::from_utf8(name).unwrap_or("Via");
            let _ = ed.insert_top(name, value);
        }
        for name in ["Record-Route", "Service-Route", "Path"] {
            ed.remove_all(name);
        }
        if let Some(c) = &contact {
            let _ = ed.replace_all("Contact", c);
        }
        let resp_to = head
            .header("To")
            .map(|h| unfold(h.value()))
            .unwrap_or_default();
        let tag = head.to().ok().and_then(|t| t.tag()).map(<[u8]>::to_vec);
        let orig_has_tag = NameAddr::parse(&orig_to)
            .ok()
            .and_then(|n| n.tag())
            .is_some();
        let mut to_back = orig_to.clone();
        if let (Some(tag), false) = (&tag, orig_has_tag) {
            to_back.extend_from_slice(b";tag=");
            to_back.extend_from_slice(tag);
        }
        let _ = ed.replace_value("From", &orig_from);
        let _ = ed.replace_value("To", &to_back);
        self.rewrite_paths(head, &mut ed, face);
        if let Some(b) = new_body {
            ed.set_body(b);
        }
        if self.tcp {
            ed.ensure_content_length();
        }
        let bytes = ed.to_bytes();
        if let Some(call) = self.calls.get_mut(&call_id) {
            call.last_activity = now;
            if initial_invite && (200..300).contains(&code) {
                if let Some(tok) = token {
                    call.contact[face.index()] = Some(tok);
                }
                if call.confirmed_ms.is_none() {
                    call.confirmed_ms = Some(now_ms());
                    self.stats
                        .call_setup
                        .observe(now.saturating_duration_since(call.created));
                }
                if let Some(v) = &mut call.view[face.index()] {
                    v.1 = resp_to.clone();
                }
                call.view[from_face.index()] = Some((to_back.clone(), orig_from.clone()));
            }
            if initial_invite && code >= 300 && call.ended.is_none() {
                call.media.close(&self.routes);
                call.ended = Some(now);
                self.counters.calls_ended += 1;
            }
        }
        if let Some(t) = self.txns.get_mut(&branch) {
            t.last_response = Some(bytes.clone());
            if code >= 200 && t.final_code.is_none() {
                t.final_code = Some(code);
                t.expires = now + TXN_LINGER;
                if t.method != b"INVITE" {
                    // Only an INVITE's bytes are needed after its final answer (CANCEL,
                    // ACK); retransmissions now get the answer. A cascade's Catalog is
                    // not kept for the transaction's linger.
                    t.forwarded = Vec::new();
                }
            }
        }
        out.push(Out {
            face: from_face,
            to: src_peer,
            bytes,
        });
        self.counters.forwarded_responses += 1;
    }

    /// Sends a request of our own into a dialog (BYE on media timeout).
    pub(super) fn send_in_dialog(
        &mut self,
        call_id: &[u8],
        face: Face,
        method: &str,
        reason: &str,
        now: Instant,
        out: &mut Vec<Out>,
    ) {
        let Some(call) = self.calls.get_mut(call_id) else {
            return;
        };
        let (Some(tok), Some((from, to))) = (
            call.contact[face.index()].clone(),
            call.view[face.index()].clone(),
        ) else {
            return;
        };
        call.cseq_to[face.index()] += 1;
        let cseq = call.cseq_to[face.index()];
        let Some(b) = self.bindings.get(&tok) else {
            return;
        };
        let (uri, peer) = (b.uri.clone(), b.peer);
        let branch = format!("{BRANCH_PREFIX}{}", self.next_id());
        let mut m = Vec::with_capacity(512);
        m.extend_from_slice(method.as_bytes());
        m.push(b' ');
        m.extend_from_slice(&uri);
        m.extend_from_slice(b" SIP/2.0\r\nVia: ");
        m.extend_from_slice(&self.our_via(face, &branch));
        m.extend_from_slice(b"\r\nMax-Forwards: 70\r\nFrom: ");
        m.extend_from_slice(&from);
        m.extend_from_slice(b"\r\nTo: ");
        m.extend_from_slice(&to);
        m.extend_from_slice(b"\r\nCall-ID: ");
        m.extend_from_slice(&self.call_id_on(call_id, face));
        m.extend_from_slice(format!("\r\nCSeq: {cseq} {method}\r\nReason: SIP;cause=200;text=\"{reason}\"\r\nContent-Length: 0\r\n\r\n").as_bytes());
        out.push(Out {
            face,
            to: peer,
            bytes: m.clone(),
        });
        self.txns.insert(
            branch,
            Txn {
                in_key: None,
                from_face: face.other(),
                src: peer,
                vias: Vec::new(),
                from_value: Vec::new(),
                to_value: Vec::new(),
                call_id: call_id.to_vec(),
                method: method.as_bytes().to_vec(),
                cseq,
                dest: peer,
                forwarded: m,
                last_response: None,
                final_code: None,
                created: now,
                expires: now + TXN_LINGER,
                internal: true,
                initial_invite: false,
                registers: Vec::new(),
            },
        );
    }
}
