//! Contacts and registrations: the binding table, its caps, and what a REGISTER's 2xx
//! confirms.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use crate::clock::now_ms;
use crate::signaling::proxy::stats::{Dialog, Registration};
use crate::signaling::sip::{Head, Host, NameAddr, Uri};

use super::rewrite::token_of;
use super::{
    BindRefused, Binding, Core, Face, Peer, LOG_BINDINGS, MAX_BINDINGS, MAX_REGISTRATION,
    TOKEN_PARAM, TXN_LINGER,
};

impl Core {
    /// The devices registered through this route, read from the binding table (whose
    /// lifecycle this does not touch), soonest expiry last.
    pub fn registrations(&self, now: Instant) -> Vec<Registration> {
        let mut v: Vec<Registration> = self
            .bindings
            .iter()
            // A registered contact: a REGISTER's (it has its user) that the registrar's 2xx
            // confirmed (no longer pending), not yet expired.
            .filter(|(_, b)| b.user.is_some() && !b.pending && b.expires > now)
            .map(|(tok, b)| {
                let contact = String::from_utf8_lossy(&b.uri).into_owned();
                let id = b
                    .user
                    .as_deref()
                    .map(|u| String::from_utf8_lossy(u).into_owned())
                    .unwrap_or_default();
                Registration {
                    id,
                    domain: self.dom(b.face),
                    contact,
                    peer: b.peer.addr,
                    token: tok.clone(),
                    expires_in: b.expires.saturating_duration_since(now),
                }
            })
            .collect();
        v.sort_by(|a, b| b.expires_in.cmp(&a.expires_in).then(a.id.cmp(&b.id)));
        v
    }

    /// The confirmed, live calls through this route (`GET /api/v1/dialogs`), sorted by
    /// Call-ID.
    pub fn dialogs(&self) -> Vec<Dialog> {
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let mut v: Vec<Dialog> = self
            .calls
            .iter()
            .filter(|(_, c)| c.confirmed_ms.is_some() && c.ended.is_none())
            .map(|(cid, c)| {
                let mut media_ports: Vec<String> = c
                    .media
                    .session
                    .and_then(|s| self.routes.session(s))
                    .map(|s| s.ports.iter().map(|(d, p)| format!("{d}:{p}")).collect())
                    .unwrap_or_default();
                media_ports.sort();
                Dialog {
                    call_id: text(cid),
                    upstream_call_id: text(&self.call_id_on(cid, Face::Upstream)),
                    contacts: c.contact.clone(),
                    media_ports,
                }
            })
            .collect();
        v.sort_by(|a, b| a.call_id.cmp(&b.call_id));
        v
    }

    /// A binding for `uri` seen on `face` from `peer`; reused when the same contact is seen
    /// again (retransmissions and refreshes get the same token).
    /// `register`: the contact of a REGISTER, which only becomes usable when the
    /// registrar answers 2xx ([`Core::confirm_registration`]). Each source address holds
    /// at most `max_bindings_per_source` bindings.
    pub(super) fn bind(
        &mut self,
        face: Face,
        uri: &[u8],
        (peer, src): (Peer, Ipv4Addr),
        lifetime: Duration,
        register: bool,
        now: Instant,
    ) -> Result<String, BindRefused> {
        let key = (face, uri.to_vec(), peer.addr);
        if let Some(tok) = self.binding_index.get(&key).cloned() {
            if let Some(b) = self.bindings.get_mut(&tok) {
                if register {
                    // A refresh waits for its 2xx too; a live registration stays live.
                    b.asked = lifetime;
                    b.expires = b.expires.max(now + TXN_LINGER);
                } else {
                    b.expires = b.expires.max(now + lifetime);
                }
                b.peer = peer;
                return Ok(tok);
            }
        }
        if self.bindings.len() >= MAX_BINDINGS {
            self.sweep(now);
            if self.bindings.len() >= MAX_BINDINGS {
                self.counters.table_full += 1;
                return Err(BindRefused::TableFull);
            }
        }
        let held = self.per_source.get(&src).copied().unwrap_or(0);
        if held >= self.policy.max_bindings_per_source {
            self.sweep(now);
            if self.per_source.get(&src).copied().unwrap_or(0)
                >= self.policy.max_bindings_per_source
            {
                self.counters.bindings_refused += 1;
                if let Some(suppressed) = LOG_BINDINGS.check(now_ms()) {
                    tracing::warn!(route = %self.name, peer = %src, suppressed, limit = self.policy.max_bindings_per_source, "contact refused: this source holds the most bindings allowed (max_bindings_per_source)");
                }
                return Err(BindRefused::SourceCap);
            }
        }
        let tok = self.next_id();
        let user = Uri::parse(uri)
            .ok()
            .and_then(|u| u.user.map(<[u8]>::to_vec));
        self.bindings.insert(
            tok.clone(),
            Binding {
                face,
                uri: uri.to_vec(),
                peer,
                expires: now + if register { TXN_LINGER } else { lifetime },
                pending: register,
                asked: lifetime,
                user: user.filter(|_| register),
                source: src,
            },
        );
        *self.per_source.entry(src).or_insert(0) += 1;
        self.binding_index.insert(key, tok.clone());
        Ok(tok)
    }

    /// The registrar accepted a REGISTER: its contacts become routable for the lifetime
    /// asked (0: the contact is removed), and findable by user.
    pub(super) fn confirm_registration(&mut self, tokens: &[String], now: Instant) {
        for tok in tokens {
            let Some(b) = self.bindings.get_mut(tok) else {
                continue;
            };
            if b.asked <= TXN_LINGER {
                // Expires: 0 (plus the linger we add): unregistered.
                b.expires = now;
                continue;
            }
            b.pending = false;
            b.expires = now + b.asked;
            if let Some(u) = b.user.clone() {
                self.by_user.insert((b.face, u), tok.clone());
            }
        }
    }

    /// Rewrites every Contact of a message going from `from` to the other face. Returns the
    /// new header value (None: nothing to change) and the token of the first contact.
    pub(super) fn contacts(
        &mut self,
        head: &Head<'_>,
        from: Face,
        src: Peer,
        default_lifetime: Duration,
        now: Instant,
    ) -> Result<(Option<Vec<u8>>, Vec<String>), BindRefused> {
        let values: Vec<&[u8]> = head.values("Contact").collect();
        if values.is_empty() {
            return Ok((None, Vec::new()));
        }
        let register = head.method() == Some(b"REGISTER");
        let redirect = head.status().is_some_and(|c| (300..400).contains(&c));
        let header_expires = head
            .header("Expires")
            .and_then(|h| std::str::from_utf8(h.value()).ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let to = from.other();
        let mut new = Vec::new();
        let mut tokens = Vec::new();
        for v in values {
            if v == b"*" {
                new.push(b"*".to_vec());
                continue;
            }
            let na = NameAddr::parse(v).map_err(|_| BindRefused::Malformed)?;
            let uri = match na.sip_uri() {
                Ok(u) => u,
                Err(_) => {
                    // Not a SIP URI (tel:, mailto:...): no address of ours to hide or map.
                    new.push(v.to_vec());
                    continue;
                }
            };
            let mut item = Vec::new();
            if let Some(d) = na.display_name {
                item.extend_from_slice(d);
                item.push(b' ');
            }
            if let Some(tok) =
                token_of(&uri).filter(|t| self.bindings.get(t).is_some_and(|b| b.face == to))
            {
                // One of ours going home: the original contact again.
                let orig = self
                    .bindings
                    .get(&tok)
                    .map(|b| b.uri.clone())
                    .unwrap_or_default();
                item.push(b'<');
                item.extend_from_slice(&orig);
                item.push(b'>');
            } else {
                let secs = na
                    .expires()
                    .map(u64::from)
                    .or(header_expires)
                    .map(|s| Duration::from_secs(s).min(MAX_REGISTRATION) + TXN_LINGER)
                    .unwrap_or(default_lifetime);
                let reach = match (src.conn, uri.host, uri.port) {
                    (Some(_), Host::V4(ip), port) => Peer {
                        addr: SocketAddrV4::new(ip, port.unwrap_or(5060)),
                        conn: src.conn,
                    },
                    // A redirect (a 3xx answering REGISTER: "register there") names another
                    // server of the sender's domain: the request to its token goes there.
                    (None, Host::V4(ip), port)
                        if redirect && self.routes.domain(self.dom(from)).contains(ip) =>
                    {
                        Peer::udp(SocketAddrV4::new(ip, port.unwrap_or(5060)))
                    }
                    _ => src,
                };
                let tok = self.bind(from, na.uri, (reach, *src.addr.ip()), secs, register, now)?;
                tokens.push(tok.clone());
                item.extend_from_slice(b"<sip:");
                if let Some(user) = uri.user {
                    item.extend_from_slice(user);
                    item.push(b'@');
                }
                item.extend_from_slice(self.local[to.index()].to_string().as_bytes());
                if self.tcp {
                    item.extend_from_slice(b";transport=tcp");
                }
                item.extend_from_slice(format!(";{TOKEN_PARAM}={tok}>").as_bytes());
            }
            item.extend_from_slice(na.params.raw());
            new.push(item);
        }
        Ok((Some(new.join(&b", "[..])), tokens))
    }
}
