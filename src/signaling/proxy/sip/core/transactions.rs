//! Server transactions: how a received request is keyed, recorded, and how its
//! retransmissions are answered from the transaction table.

use std::time::Instant;

use crate::signaling::sip::{Head, SipMessage};

use super::{Core, Face, InKey, Out, Peer};

impl Core {
    pub(super) fn in_key(face: Face, src: Peer, head: &Head<'_>, method: &[u8]) -> InKey {
        let branch = match head.top_via().ok().and_then(|v| v.branch()) {
            Some(b) if b.starts_with(b"z9hG4bK") => b.to_vec(),
            // RFC 2543 peers: no usable branch; Call-ID, CSeq and From tag identify it.
            _ => {
                let mut k = head.call_id().unwrap_or_default().to_vec();
                k.push(b' ');
                k.extend_from_slice(&head.cseq().map(|c| c.seq).unwrap_or(0).to_be_bytes());
                if let Some(t) = head.from().ok().and_then(|f| f.tag()) {
                    k.extend_from_slice(t);
                }
                k
            }
        };
        InKey {
            face,
            src: src.addr,
            branch,
            method: method.to_vec(),
        }
    }

    pub(super) fn request(
        &mut self,
        face: Face,
        src: Peer,
        msg: &SipMessage<'_>,
        now: Instant,
        out: &mut Vec<Out>,
    ) {
        let head = msg.head();
        let method = head.method().unwrap_or_default().to_vec();
        let key = Self::in_key(face, src, head, &method);
        if let Some(branch) = self.by_in.get(&key).cloned() {
            self.retransmission(&branch, out);
            return;
        }
        match method.as_slice() {
            b"CANCEL" => self.cancel(face, src, head, now, out),
            b"ACK" => {
                // The ACK of a non-2xx final response shares the INVITE's branch: that
                // transaction already acknowledged the response downstream; absorb it.
                let mut inv = key.clone();
                inv.method = b"INVITE".to_vec();
                let absorbed = self
                    .by_in
                    .get(&inv)
                    .and_then(|b| self.txns.get(b))
                    .is_some_and(|t| t.final_code.is_some_and(|c| c >= 300));
                if absorbed {
                    self.counters.retransmissions += 1;
                    return;
                }
                self.forward_request(face, src, msg, key, now, out);
            }
            _ => self.forward_request(face, src, msg, key, now, out),
        }
    }

    pub(super) fn retransmission(&mut self, branch: &str, out: &mut Vec<Out>) {
        self.counters.retransmissions += 1;
        let Some(t) = self.txns.get(branch) else {
            return;
        };
        if let Some(r) = &t.last_response {
            out.push(Out {
                face: t.from_face,
                to: t.src,
                bytes: r.clone(),
            });
        }
        // No final answer yet: the retransmission is also ours to make downstream
        // (UDP only; TCP is reliable). Same bytes, same branch, same SDP.
        if t.final_code.is_none() && !self.tcp {
            out.push(Out {
                face: t.from_face.other(),
                to: t.dest,
                bytes: t.forwarded.clone(),
            });
        }
    }
}
