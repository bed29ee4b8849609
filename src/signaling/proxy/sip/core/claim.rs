//! Which route a message on a shared socket belongs to (see [`super::super::net::pick`]):
//! each core says how strongly it claims a message from what it already holds; the
//! strongest claim wins. Pure: no table is changed.
//!
//! The access rule on a shared socket: what a route already holds (a transaction, a
//! binding token, a mapped Call-ID) is claimed by that route whoever sends it, and the
//! route's core still applies its own checks. A *new* request is claimed only by a face
//! that admits its source: a listen face by its `allow_peers`, an upstream face when the
//! source may start requests there (the route's upstream, or a peer of a route listening
//! on that socket). A request no face admits goes to the socket's first listening route,
//! whose core answers `403` (counted `forbidden`; an upstream face alone answers it too,
//! counted `upstream_forbidden`).

use std::time::Instant;

use crate::signaling::sip::{Head, Host, Limits, SipMessage, Uri};

use super::rewrite::token_of;
use super::{Core, Face, Peer};
use crate::signaling::proxy::sip::access::peer_allowed;

/// How strongly a route claims a message arriving on one of its faces, weakest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Claim {
    /// Nothing of this route: it would answer 404 (an upstream face) or drop it.
    None,
    /// A new request on the upstream face from the route's own upstream address (it gets
    /// 404 there too; this only chooses among upstream faces that all would answer so).
    FromUpstream,
    /// A new request on the listen face from a peer it accepts.
    Listens,
    /// A new request on the upstream face addressed (Request-URI or To user) to a device
    /// registered through this route, from a source that may start requests there
    /// ([`Core::may_start_upstream`]).
    Registered,
    /// A transaction or dialog of this route: a response carrying its Via branch, a
    /// retransmission, a Request-URI carrying its binding token, a Call-ID it mapped.
    Owns,
}

impl Core {
    /// How strongly this route claims `buf` (one datagram or framed message) arriving on
    /// `face` from `src`.
    pub fn claim(&self, face: Face, src: Peer, buf: &[u8], now: Instant) -> Claim {
        let limits = Limits {
            max_message: usize::MAX,
            ..self.limits
        };
        let Ok(msg) = SipMessage::parse_datagram(buf, &limits) else {
            return self.fallback(face, src);
        };
        self.claim_head(face, src, msg.head(), now)
    }

    fn claim_head(&self, face: Face, src: Peer, head: &Head<'_>, now: Instant) -> Claim {
        if !head.is_request() {
            let branch = head.top_via().ok().and_then(|v| v.branch());
            let ours = branch
                .and_then(|b| std::str::from_utf8(b).ok())
                .and_then(|b| self.txns.get(b))
                .is_some_and(|t| t.from_face.other() == face);
            return if ours { Claim::Owns } else { Claim::None };
        }
        let method = head.method().unwrap_or_default();
        let ruri = head.request_uri().and_then(|r| Uri::parse(r).ok());
        let token = ruri.as_ref().and_then(token_of);
        if token
            .and_then(|t| self.bindings.get(&t))
            .is_some_and(|b| b.face == face.other())
        {
            return Claim::Owns;
        }
        // A retransmission, or a CANCEL/ACK of an INVITE transaction this route holds.
        for m in [method, b"INVITE".as_slice()] {
            if self.by_in.contains_key(&Self::in_key(face, src, head, m)) {
                return Claim::Owns;
            }
        }
        if head
            .call_id()
            .is_some_and(|c| self.cids[face.index()].contains_key(c))
        {
            return Claim::Owns;
        }
        // A device registered through this route, addressed by a source that may start
        // requests here: anyone else's request is not this route's to take (a shared
        // socket gives it to the route listening there, which applies its allow_peers).
        if face == Face::Upstream && self.may_start_upstream(*src.addr.ip()) {
            let ours = |u: &Uri<'_>| match u.host {
                Host::V4(ip) => ip == self.gw_ip(face),
                Host::Name(_) => true,
                _ => false,
            };
            let to = head.to().ok();
            let to_uri = to.as_ref().and_then(|t| t.sip_uri().ok());
            let registered = [ruri.as_ref(), to_uri.as_ref()]
                .into_iter()
                .flatten()
                .filter(|u| ours(u))
                .filter_map(|u| u.user)
                .any(|user| {
                    self.by_user
                        .get(&(face.other(), user.to_vec()))
                        .and_then(|tok| self.bindings.get(tok))
                        .is_some_and(|b| !b.pending && b.expires > now)
                });
            if registered {
                return Claim::Registered;
            }
        }
        self.fallback(face, src)
    }

    fn fallback(&self, face: Face, src: Peer) -> Claim {
        match face {
            Face::Listen => {
                let ip = *src.addr.ip();
                let in_domain = self.routes.domain(self.dom(face)).contains(ip);
                if peer_allowed(&self.policy.allow_peers, in_domain, ip) {
                    Claim::Listens
                } else {
                    Claim::None
                }
            }
            Face::Upstream if src.addr.ip() == self.upstream.ip() => Claim::FromUpstream,
            Face::Upstream => Claim::None,
        }
    }
}
