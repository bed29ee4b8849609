//! Credentials: the route's, and the `Authorization` answering an upstream's 401.

use super::{Exchange, MediaPorts};
use crate::signaling::rtsp::auth::{
    authorization, choose_challenge, parse_www_authenticate, Challenge, ClientNonce, Credentials,
};

impl<M: MediaPorts> Exchange<M> {
    pub(super) fn credentials(&self, route: usize) -> Option<&Credentials> {
        self.settings
            .credentials
            .get(route)
            .and_then(Option::as_ref)
    }

    /// `Authorization` for a request upstream, once the upstream has challenged.
    pub(super) fn authorization_for(
        &mut self,
        route: usize,
        method: &str,
        uri: &str,
    ) -> Option<String> {
        if self.challenge.is_empty() {
            return None;
        }
        let creds = self.credentials(route)?.clone();
        let values = std::mem::take(&mut self.challenge);
        let mut challenges: Vec<Challenge<'_>> = Vec::new();
        for v in &values {
            if let Ok(c) = parse_www_authenticate(v) {
                challenges.extend(c);
            }
        }
        let chosen = choose_challenge(&challenges).cloned();
        self.nonce_count = self.nonce_count.wrapping_add(1);
        let nc = self.nonce_count;
        let cnonce = self.random_hex();
        let answer = chosen.and_then(|c| {
            authorization(
                &c,
                &creds,
                method,
                uri,
                ClientNonce {
                    cnonce: &cnonce,
                    nc,
                },
            )
            .ok()
        });
        drop(challenges);
        self.challenge = values;
        answer
    }
}
