//! Hot standby: the registrations and dialogs this core holds, as records for the state
//! store ([`crate::routes::board`]), and the records of the active's core installed here,
//! so that after a takeover a token handed out by the old active still routes (a platform's
//! MESSAGE or INVITE to a device registered through it) and a confirmed call's in-dialog
//! requests (BYE, INFO, MESSAGE) still cross, in both directions.
//!
//! What is copied: every routable (non-pending, unexpired) binding by its token, with its
//! contact, peer, user and expiry (wall clock, so the remaining lifetime carries over);
//! every confirmed, live call with its Call-IDs on both faces, the contact tokens and
//! the (From, To) each face sees, the CSeqs delivered, and the state-store key of its media
//! session (the session itself is copied by [`crate::ha::record`]). Transactions are not:
//! one in flight at the takeover is retransmitted by its sender and crosses as a new one.
//!
//! A core publishes its records at most every [`EVERY`] (or ten times as long as the last
//! export took, so it takes at most a tenth of the SIP thread: about 5 ms for 4 000
//! bindings, release build), only when a message was handled or a second went by; it reads the store's records when the HA thread put new ones on the
//! board. On a standby the copies mirror the store (a copy gone from it goes here); on the
//! active (just promoted) they are only added.

use std::collections::{BTreeMap, HashSet};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::clock::wall_ms;
use crate::config::DomainId;
use crate::routes::{Channel, RouteSpec, SessionId};

use super::super::media::{CallMedia, SlotRecord};
use super::{Binding, Call, Core, Face, Peer, DIALOG_IDLE};

/// How often a core publishes its records at most.
const EVERY: Duration = Duration::from_millis(100);
/// The record version this build writes and reads.
const VERSION: u32 = 1;

/// One binding (`b/TOKEN`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindingRecord {
    pub v: u32,
    /// `listen` / `upstream`: the face the contact was seen on.
    pub face: String,
    pub uri: String,
    pub peer: SocketAddrV4,
    pub source: Ipv4Addr,
    /// Wall clock (ms, rounded down to the second) when it expires.
    pub expires_wall_ms: u64,
    /// A registered contact's user (the GB device ID).
    pub user: Option<String>,
}

/// One confirmed call (`c/HEX of its Call-ID on the listen face`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallRecord {
    pub v: u32,
    /// Call-ID on the listen face, and on the upstream face.
    pub call_id: [String; 2],
    pub contact: [Option<String>; 2],
    pub view: [Option<(String, String)>; 2],
    pub cseq_to: [u32; 2],
    pub label: String,
    /// The state-store key of its media session (`a:20000`), if it has one.
    pub media: Option<String>,
    /// Its `m=` slots (gateway ports, each side's media peer and formats), so a re-INVITE
    /// after a takeover reuses the ports. Absent in a record of an earlier release (a copy
    /// of it then gets new ports at a re-INVITE), left out when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slots: Vec<SlotRecord>,
}

/// What the core keeps about its copies.
#[derive(Default)]
pub(super) struct ReplicaState {
    last_export: Option<Instant>,
    /// Requests + responses handled at the last export.
    handled: u64,
    /// Ten times the last export's duration: the least time to the next (with [`EVERY`]).
    gap: Duration,
    /// The board's generation last read.
    seen: u64,
    bindings: HashSet<String>,
    calls: HashSet<Vec<u8>>,
    /// Copied calls whose media session is not linked yet, with its key.
    unlinked: BTreeMap<Vec<u8>, String>,
    /// Whether the routes were the standby's at the last look (a demotion is seen here).
    was_standby: bool,
}

fn face_name(f: Face) -> &'static str {
    match f {
        Face::Listen => "listen",
        Face::Upstream => "upstream",
    }
}

fn face_of(s: &str) -> Option<Face> {
    match s {
        "listen" => Some(Face::Listen),
        "upstream" => Some(Face::Upstream),
        _ => None,
    }
}

fn text(b: &[u8]) -> Option<String> {
    String::from_utf8(b.to_vec()).ok()
}

fn hex(b: &[u8]) -> String {
    b.iter()
        .fold(String::with_capacity(2 * b.len()), |mut s, x| {
            let _ = std::fmt::Write::write_fmt(&mut s, format_args!("{x:02x}"));
            s
        })
}

/// The state-store key of a session: its lowest port (as [`crate::ha::record`] keys it).
fn session_key(ports: &[(DomainId, u16)]) -> Option<String> {
    ports.iter().min().map(|(d, p)| format!("{d}:{p}"))
}

impl Core {
    fn producer(&self) -> String {
        format!("sip/{}", self.name)
    }

    /// This core stops: its records leave the state store with the next batch.
    pub(super) fn withdraw_replica(&self) {
        self.routes.board.withdraw(&self.producer());
    }

    /// Publishes this core's records and installs the active's, when due (from [`Core::tick`]).
    pub(super) fn replicate(&mut self, now: Instant) {
        if !self.routes.board.enabled()
            || self
                .replica
                .last_export
                .is_some_and(|t| now.saturating_duration_since(t) < self.replica.gap.max(EVERY))
        {
            return;
        }
        self.follow_role();
        let mut seen = self.replica.seen;
        if let Some(recs) = self.routes.board.imported(&self.producer(), &mut seen) {
            self.replica.seen = seen;
            let mirror = self.routes.is_standby();
            self.import(&recs, now, mirror);
        }
        self.link_media(self.routes.is_standby());
        let handled = self.counters.requests + self.counters.responses;
        let stale = self
            .replica
            .last_export
            .is_none_or(|t| now.saturating_duration_since(t) >= Duration::from_secs(1));
        if handled != self.replica.handled || stale {
            self.replica.handled = handled;
            self.replica.last_export = Some(now);
            let t0 = Instant::now();
            let recs = self.export(now);
            self.routes.board.publish(&self.producer(), Arc::new(recs));
            // Bounded share of the SIP thread: large tables are published less often.
            self.replica.gap = t0.elapsed() * 10;
        }
    }

    /// Active → standby without a restart (keepalived stopped, a link flap, fenced): this
    /// core's own bindings and calls become copies, so the next records from the store (the
    /// new active's, read after the demotion) keep the ones it still holds and drop the
    /// ones it ended; a call dropped so has its media session ended with the store's copy.
    fn follow_role(&mut self) {
        let standby = self.routes.is_standby();
        if standby && !self.replica.was_standby {
            self.replica.bindings.extend(self.bindings.keys().cloned());
            self.replica.calls.extend(self.calls.keys().cloned());
        }
        self.replica.was_standby = standby;
    }

    /// This core's registrations and confirmed calls as records (key → JSON).
    pub fn export(&self, now: Instant) -> BTreeMap<String, String> {
        let wall = wall_ms();
        let mut out = BTreeMap::new();
        for (tok, b) in &self.bindings {
            if b.pending || b.expires <= now {
                continue;
            }
            let left = b.expires.saturating_duration_since(now).as_millis() as u64;
            let Some(uri) = text(&b.uri) else { continue };
            let rec = BindingRecord {
                v: VERSION,
                face: face_name(b.face).into(),
                uri,
                peer: b.peer.addr,
                source: b.source,
                expires_wall_ms: (wall + left) / 1000 * 1000,
                user: b.user.as_deref().and_then(text),
            };
            if let Ok(j) = serde_json::to_string(&rec) {
                out.insert(format!("b/{tok}"), j);
            }
        }
        for (cid, c) in &self.calls {
            if c.confirmed_ms.is_none() || c.ended.is_some() {
                continue;
            }
            let up = self.call_id_on(cid, Face::Upstream);
            let view = |i: usize| -> Option<Option<(String, String)>> {
                match &c.view[i] {
                    None => Some(None),
                    Some((f, t)) => Some(Some((text(f)?, text(t)?))),
                }
            };
            let (Some(l), Some(u), Some(v0), Some(v1)) = (text(cid), text(&up), view(0), view(1))
            else {
                continue;
            };
            let media = c
                .media
                .session
                .and_then(|s| self.routes.session(s))
                .and_then(|s| session_key(&s.ports))
                .or_else(|| self.replica.unlinked.get(cid).cloned());
            let rec = CallRecord {
                v: VERSION,
                call_id: [l, u],
                contact: c.contact.clone(),
                view: [v0, v1],
                cseq_to: c.cseq_to,
                label: c.media.label.clone(),
                media,
                slots: c.media.slot_records(),
            };
            if let Ok(j) = serde_json::to_string(&rec) {
                out.insert(format!("c/{}", hex(cid)), j);
            }
        }
        out
    }

    /// Installs the active's records. `mirror` (a standby): copies the store no longer holds
    /// are dropped here too; else (the active) records are only added. Unreadable records
    /// are skipped and counted ([`crate::routes::board::Board::reject`]).
    pub fn import(&mut self, recs: &BTreeMap<String, String>, now: Instant, mirror: bool) {
        let wall = wall_ms();
        let mut bad = 0u64;
        let mut toks = HashSet::new();
        let mut cids = HashSet::new();
        for (k, j) in recs.iter() {
            if let Some(tok) = k.strip_prefix("b/") {
                match serde_json::from_str::<BindingRecord>(j) {
                    Ok(r) if r.v == VERSION && face_of(&r.face).is_some() => {
                        if self.install_binding(tok, &r, now, wall) {
                            toks.insert(tok.to_string());
                        }
                    }
                    _ => bad += 1,
                }
            } else if k.starts_with("c/") {
                match serde_json::from_str::<CallRecord>(j) {
                    Ok(r) if r.v == VERSION => {
                        cids.insert(self.install_call(&r, now));
                    }
                    _ => bad += 1,
                }
            } else {
                bad += 1;
            }
        }
        if bad > 0 {
            self.routes.board.reject(bad);
        }
        if mirror {
            for tok in self.replica.bindings.difference(&toks) {
                if let Some(b) = self.bindings.remove(tok) {
                    if let Some(n) = self.per_source.get_mut(&b.source) {
                        *n = n.saturating_sub(1);
                    }
                }
            }
            let bindings = &self.bindings;
            self.binding_index.retain(|_, t| bindings.contains_key(t));
            self.by_user.retain(|_, t| bindings.contains_key(t));
            self.per_source.retain(|_, n| *n > 0);
            let gone: Vec<Vec<u8>> = self.replica.calls.difference(&cids).cloned().collect();
            for cid in gone {
                // Its media session is the HA thread's copy: it goes with the store's record.
                if let Some(mut c) = self.calls.remove(&cid) {
                    c.media.session = None;
                    c.media.installed.clear();
                }
                let up = self.cids[Face::Listen.index()].remove(&cid);
                if let Some((up, _)) = up {
                    self.cids[Face::Upstream.index()].remove(&up);
                }
                self.replica.unlinked.remove(&cid);
            }
            self.replica.bindings = toks;
            self.replica.calls = cids;
        } else {
            self.replica.bindings.extend(toks);
            self.replica.calls.extend(cids);
        }
    }

    fn install_binding(&mut self, tok: &str, r: &BindingRecord, now: Instant, wall: u64) -> bool {
        let Some(face) = face_of(&r.face) else {
            return false;
        };
        if r.expires_wall_ms <= wall {
            return false;
        }
        let expires = now + Duration::from_millis(r.expires_wall_ms - wall);
        let user = r.user.as_ref().map(|u| u.as_bytes().to_vec());
        let uri = r.uri.as_bytes().to_vec();
        // A TCP peer's connection does not move: it is reached again by its address.
        let peer = Peer::udp(r.peer);
        match self.bindings.get_mut(tok) {
            Some(b) => {
                b.expires = b.expires.max(expires);
                b.pending = false;
            }
            None => {
                if self.bindings.len() >= super::MAX_BINDINGS {
                    return false;
                }
                self.bindings.insert(
                    tok.to_string(),
                    Binding {
                        face,
                        uri: uri.clone(),
                        peer,
                        expires,
                        pending: false,
                        source: r.source,
                        asked: expires.saturating_duration_since(now),
                        user: user.clone(),
                    },
                );
                *self.per_source.entry(r.source).or_insert(0) += 1;
            }
        }
        self.binding_index
            .insert((face, uri, r.peer), tok.to_string());
        if let Some(u) = user {
            self.by_user.insert((face, u), tok.to_string());
        }
        true
    }

    /// Returns the call's Call-ID on the listen face (its key).
    fn install_call(&mut self, r: &CallRecord, now: Instant) -> Vec<u8> {
        let cid = r.call_id[0].as_bytes().to_vec();
        let up = r.call_id[1].as_bytes().to_vec();
        let until = now + DIALOG_IDLE;
        self.cids[Face::Listen.index()].insert(cid.clone(), (up.clone(), until));
        self.cids[Face::Upstream.index()].insert(up, (cid.clone(), until));
        let view = |i: usize| {
            r.view[i]
                .as_ref()
                .map(|(f, t)| (f.as_bytes().to_vec(), t.as_bytes().to_vec()))
        };
        match self.calls.get_mut(&cid) {
            Some(c) => {
                c.contact = r.contact.clone();
                c.view = [view(0), view(1)];
                c.cseq_to = [
                    c.cseq_to[0].max(r.cseq_to[0]),
                    c.cseq_to[1].max(r.cseq_to[1]),
                ];
                c.last_activity = now;
            }
            None => {
                let media = CallMedia::new(r.label.clone(), self.max_payload)
                    .with_legs(self.legs.clone())
                    .with_link_face(self.link_face)
                    .with_media_validation(self.media_validate, self.media_policy);
                self.calls.insert(
                    cid.clone(),
                    Call {
                        media,
                        contact: r.contact.clone(),
                        view: [view(0), view(1)],
                        cseq_to: r.cseq_to,
                        confirmed_ms: Some(crate::clock::now_ms()),
                        ended: None,
                        created: now,
                        last_activity: now,
                    },
                );
            }
        }
        if let Some(c) = self.calls.get_mut(&cid) {
            // A copy's slots follow the record; a call whose SDP crossed here keeps its own.
            if c.media.slot_records() != r.slots && c.media.restore_slots(&r.slots).is_err() {
                // Not readable by this build: a re-INVITE of the call gets new ports, as
                // before the slots were copied.
                self.routes.board.reject(1);
            }
        }
        if let Some(k) = &r.media {
            self.replica.unlinked.insert(cid.clone(), k.clone());
        }
        cid
    }

    /// Gives each copied call its media session (the HA thread's copy, found by its key),
    /// so that the call's end frees it. A standby links again at every look (the HA thread
    /// may have made the copy anew); the active links what is still unlinked.
    fn link_media(&mut self, again: bool) {
        if again {
            for cid in &self.replica.calls {
                if let Some(c) = self.calls.get(cid) {
                    if let Some(k) = c
                        .media
                        .session
                        .and_then(|s| self.routes.session(s))
                        .and_then(|s| session_key(&s.ports))
                    {
                        self.replica.unlinked.insert(cid.clone(), k);
                    }
                }
            }
        }
        if self.replica.unlinked.is_empty() {
            return;
        }
        let sessions: BTreeMap<String, (SessionId, Vec<(Channel, u16)>)> = self
            .routes
            .sessions()
            .into_iter()
            .filter_map(|s| Some((session_key(&s.ports)?, (s.id, s.routes))))
            .collect();
        let unlinked = std::mem::take(&mut self.replica.unlinked);
        for (cid, key) in unlinked {
            let Some(c) = self.calls.get_mut(&cid) else {
                continue;
            };
            let Some((id, routes)) = sessions.get(&key) else {
                self.replica.unlinked.insert(cid, key);
                continue;
            };
            c.media.session = Some(*id);
            c.media.installed = routes
                .iter()
                .filter_map(|(ch, p)| self.routes.lookup(*ch, *p))
                .map(|r| {
                    (
                        RouteSpec {
                            ingress: r.channel.ingress(),
                            port: r.port,
                            dest: r.dest,
                            egress_port: r.egress_port,
                            policy: r.policy,
                            expected: r.expected,
                            rtp_only: r.rtp_only,
                            label: r.label.to_string(),
                            media: r.media,
                        },
                        None,
                    )
                })
                .collect();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Upgrade rule: a call record of the previous release (no `slots`) is still read, and
    /// one without slots is written as that release wrote it.
    #[test]
    fn a_call_record_without_slots_is_read_and_written_as_before() {
        let old = r#"{"v":1,"call_id":["a@x","b@y"],"contact":[null,"tok"],"view":[null,null],"cseq_to":[1,2],"label":"sip:reg:1","media":"a:20000"}"#;
        let r: CallRecord = serde_json::from_str(old).unwrap();
        assert!(r.slots.is_empty());
        assert_eq!(serde_json::to_string(&r).unwrap(), old);
    }
}
