//! Time: retransmission and INVITE timeouts, the sweep of expired entries, shutdown.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::signaling::sip::NameAddr;

use super::{Core, Face, Out, DIALOG_IDLE, TXN_LINGER};

impl Core {
    /// Timers: INVITE timeouts, media timeouts, expiry of every table. Call about every
    /// 100 ms; the sweep runs once a second.
    pub fn tick(&mut self, now: Instant, now_ms: u64) -> Vec<Out> {
        let mut out = Vec::new();
        self.replicate(now);
        if self
            .last_sweep
            .is_some_and(|t| now.saturating_duration_since(t) < Duration::from_secs(1))
        {
            return out;
        }
        self.last_sweep = Some(now);
        self.stats.set_events(self.counters.list());
        self.stats.set_registrations(self.registrations(now));
        self.stats.set_dialogs(self.dialogs());
        // Unanswered INVITEs.
        let timed_out: Vec<String> = self
            .txns
            .iter()
            .filter(|(_, t)| {
                t.initial_invite
                    && t.final_code.is_none()
                    && now.saturating_duration_since(t.created) >= self.policy.invite_timeout
            })
            .map(|(b, _)| b.clone())
            .collect();
        for branch in timed_out {
            self.invite_timeout(&branch, now, &mut out);
        }
        // Calls an operator ended through the admin interface, or whose TCP media leg
        // closed: BYE to both sides.
        let killed: Vec<Vec<u8>> = self
            .calls
            .iter()
            .filter(|(_, c)| {
                c.ended.is_none()
                    && c.media
                        .session
                        .is_some_and(|s| self.routes.end_requested(s))
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in killed {
            let why = match self.calls.get(&id) {
                Some(c) if c.media.leg_closed() => "its TCP media leg closed",
                _ => "ended by the operator",
            };
            tracing::info!(route = %self.name, call = %String::from_utf8_lossy(&id), "{why}: BYE to both sides");
            let reason = format!("vgate: {why}");
            for f in Face::BOTH {
                self.send_in_dialog(&id, f, "BYE", &reason, now, &mut out);
            }
            if let Some(c) = self.calls.get_mut(&id) {
                c.media.close(&self.routes);
                c.ended = Some(now);
                self.counters.calls_ended += 1;
            }
        }
        // Calls without media.
        if !self.policy.media_timeout.is_zero() {
            let limit = self.policy.media_timeout.as_millis() as u64;
            let idle: Vec<Vec<u8>> = self
                .calls
                .iter()
                .filter(|(_, c)| c.ended.is_none() && c.media.session.is_some())
                .filter_map(|(id, c)| {
                    let since = c.media.last_media_ms(&self.routes).or(c.confirmed_ms)?;
                    (now_ms.saturating_sub(since) >= limit).then(|| id.clone())
                })
                .collect();
            for id in idle {
                self.counters.media_timeouts += 1;
                tracing::info!(route = %self.name, call = %String::from_utf8_lossy(&id), "no media for {:?}: ending the call (BYE to both sides)", self.policy.media_timeout);
                for f in Face::BOTH {
                    self.send_in_dialog(&id, f, "BYE", "vgate: no media", now, &mut out);
                }
                if let Some(c) = self.calls.get_mut(&id) {
                    c.media.close(&self.routes);
                    c.ended = Some(now);
                    self.counters.calls_ended += 1;
                }
            }
        }
        self.sweep(now);
        out
    }

    pub(super) fn invite_timeout(&mut self, branch: &str, now: Instant, out: &mut Vec<Out>) {
        if self.txns.contains_key(branch) {
            self.counters.invite_timeouts += 1;
        }
        self.end_invite(branch, (408, "Request Timeout"), None, now, out);
    }

    /// Ends the INVITE transaction `branch` from vgate's side: CANCEL downstream, the final
    /// `status` (with a `Warning` when given) to the caller, the call's media closed.
    pub(super) fn end_invite(
        &mut self,
        branch: &str,
        status: (u16, &str),
        warning: Option<&str>,
        now: Instant,
        out: &mut Vec<Out>,
    ) {
        let tag = self.next_id();
        let Some(t) = self.txns.get(branch) else {
            return;
        };
        let (dest, to_face, call_id) = (t.dest, t.from_face.other(), t.call_id.clone());
        if let Some(c) = self.build_cancel(&t.forwarded) {
            out.push(Out {
                face: to_face,
                to: dest,
                bytes: c,
            });
        }
        // The final answer to the caller, built from what the transaction kept of the request.
        let mut r = format!("SIP/2.0 {} {}\r\n", status.0, status.1).into_bytes();
        for (n, v) in &t.vias {
            r.extend_from_slice(n);
            r.extend_from_slice(b": ");
            r.extend_from_slice(v);
            r.extend_from_slice(b"\r\n");
        }
        let to_has_tag = NameAddr::parse(&t.to_value)
            .ok()
            .and_then(|n| n.tag())
            .is_some();
        r.extend_from_slice(b"From: ");
        r.extend_from_slice(&t.from_value);
        r.extend_from_slice(b"\r\nTo: ");
        r.extend_from_slice(&t.to_value);
        if !to_has_tag {
            r.extend_from_slice(format!(";tag={tag}").as_bytes());
        }
        r.extend_from_slice(b"\r\nCall-ID: ");
        r.extend_from_slice(&self.call_id_on(&t.call_id, t.from_face));
        r.extend_from_slice(format!("\r\nCSeq: {} INVITE\r\n", t.cseq).as_bytes());
        if let Some(w) = warning {
            r.extend_from_slice(format!("Warning: {w}\r\n").as_bytes());
        }
        r.extend_from_slice(b"Content-Length: 0\r\n\r\n");
        out.push(Out {
            face: t.from_face,
            to: t.src,
            bytes: r.clone(),
        });
        if let Some(t) = self.txns.get_mut(branch) {
            t.last_response = Some(r);
            t.final_code = Some(status.0);
            t.expires = now + TXN_LINGER;
        }
        if let Some(c) = self.calls.get_mut(&call_id) {
            if c.ended.is_none() {
                c.media.close(&self.routes);
                c.ended = Some(now);
                self.counters.calls_ended += 1;
            }
        }
    }

    /// Drops expired transactions, bindings and calls.
    pub(super) fn sweep(&mut self, now: Instant) {
        let mut gone = Vec::new();
        self.txns.retain(|_, t| {
            let keep = t.expires > now;
            if !keep {
                if let Some(k) = t.in_key.take() {
                    gone.push(k);
                }
            }
            keep
        });
        for k in gone {
            self.by_in.remove(&k);
        }
        let per_source = &mut self.per_source;
        self.bindings.retain(|_, b| {
            let keep = b.expires > now;
            if !keep {
                if let Some(n) = per_source.get_mut(&b.source) {
                    *n = n.saturating_sub(1);
                }
            }
            keep
        });
        self.per_source.retain(|_, n| *n > 0);
        let bindings = &self.bindings;
        self.binding_index
            .retain(|_, tok| bindings.contains_key(tok));
        self.by_user.retain(|_, tok| bindings.contains_key(tok));
        let calls = &self.calls;
        let [listen_ids, up_ids] = &mut self.cids;
        listen_ids.retain(|id, e| e.1 > now || calls.contains_key(id));
        up_ids.retain(|_, e| e.1 > now || calls.contains_key(&e.0));
        let routes = Arc::clone(&self.routes);
        let invite_window = self.policy.invite_timeout + TXN_LINGER;
        let mut ended = 0;
        self.calls.retain(|_, c| {
            let done = match (c.ended, c.confirmed_ms) {
                (Some(e), _) => now.saturating_duration_since(e) >= TXN_LINGER,
                (None, None) => now.saturating_duration_since(c.created) >= invite_window,
                (None, Some(_)) => {
                    c.media.session.is_none()
                        && now.saturating_duration_since(c.last_activity) >= DIALOG_IDLE
                }
            };
            if done {
                if c.ended.is_none() {
                    ended += 1;
                }
                c.media.close(&routes);
            }
            !done
        });
        self.counters.calls_ended += ended;
    }

    /// Ends every call (ports and routes freed); called when the proxy stops (a reload that
    /// changes the route, or the gateway stopping). An established call is not dropped
    /// silently: the returned BYEs go to both sides, and the calls are counted as ended.
    pub fn shutdown(&mut self, now: Instant) -> Vec<Out> {
        let mut out = Vec::new();
        self.withdraw_replica();
        let live: Vec<Vec<u8>> = self
            .calls
            .iter()
            .filter(|(_, c)| c.ended.is_none() && c.confirmed_ms.is_some())
            .map(|(id, _)| id.clone())
            .collect();
        for id in &live {
            for f in Face::BOTH {
                self.send_in_dialog(id, f, "BYE", "vgate: route stopped", now, &mut out);
            }
        }
        self.counters.calls_ended += live.len() as u64;
        self.stats.set_events(self.counters.list());
        for (_, mut c) in self.calls.drain() {
            c.media.close(&self.routes);
        }
        self.txns.clear();
        self.by_in.clear();
        self.bindings.clear();
        self.binding_index.clear();
        self.by_user.clear();
        self.per_source.clear();
        self.cids = [HashMap::new(), HashMap::new()];
        out
    }
}
