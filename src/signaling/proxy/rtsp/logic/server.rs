//! The server's requests to the client (forwarded rewritten) and the client's replies to
//! them, mapped back by `CSeq`.

use std::sync::atomic::Ordering::Relaxed;

use super::requests::is_sdp;
use super::{Exchange, MediaPorts, Output, MAX_PENDING, NOT_IMPLEMENTED};
use crate::signaling::rtsp::{Editor, Message, Status};

impl<M: MediaPorts> Exchange<M> {
    /// The server asks the client something (an `OPTIONS`/`GET_PARAMETER` keep-alive, an
    /// `ANNOUNCE` of a changed stream, a `REDIRECT`, RTSP 2.0's `PLAY_NOTIFY`...): it goes to
    /// the client with its URLs and SDP rewritten like a reply's, its `CSeq` untouched (the
    /// server's numbering of its own requests; vgate sends the client no requests of its
    /// own, so nothing collides), and the client's reply goes back the same way. A request
    /// whose Request-URI or `Location` names something outside the route cannot be shown
    /// to the client: vgate answers it itself, `200` for the keep-alives, `501` otherwise.
    pub(super) fn server_request(
        &mut self,
        msg: &Message<'_>,
        method: &str,
        out: &mut Vec<Output>,
    ) {
        let Some(cseq) = msg.cseq_raw().map(str::to_owned) else {
            if let Ok(reply) = msg.respond(Status::BAD_REQUEST, &[]) {
                out.push(Output::Upstream(reply));
            }
            return;
        };
        match self.server_request_to_client(msg) {
            Ok(bytes) => {
                if self.server_requests.len() >= MAX_PENDING {
                    // The client never answered the oldest: the server has given up on it.
                    self.server_requests.pop_front();
                }
                self.server_requests.push_back(cseq);
                self.settings
                    .events
                    .server_requests_forwarded
                    .fetch_add(1, Relaxed);
                out.push(Output::Client(bytes));
            }
            Err(()) => {
                let status = match method {
                    "OPTIONS" | "GET_PARAMETER" | "SET_PARAMETER" => Status::OK,
                    _ => NOT_IMPLEMENTED,
                };
                self.settings
                    .events
                    .server_requests_answered
                    .fetch_add(1, Relaxed);
                if let Ok(reply) = msg.respond(status, &[]) {
                    out.push(Output::Upstream(reply));
                }
            }
        }
    }

    /// A server request rewritten for the client; `Err` when it cannot be.
    pub(super) fn server_request_to_client(&self, msg: &Message<'_>) -> Result<Vec<u8>, ()> {
        let route = self.route.ok_or(())?;
        let map = &self.settings.map;
        let mut editor = Editor::new(msg);
        match msg.uri() {
            Some("*") => {}
            Some(uri) => {
                let u = map.to_client(route, uri).map_err(|_| ())?;
                editor.set_uri(&u).map_err(|_| ())?;
            }
            None => return Err(()),
        }
        if let Some(url) = msg.header("Location") {
            let u = map.redirect_to_client(route, url).map_err(|_| ())?;
            editor.set_header("Location", &u).map_err(|_| ())?;
        }
        for name in ["Content-Base", "Content-Location"] {
            if let Some(url) = msg.header(name) {
                match map.to_client(route, url) {
                    Ok(u) => editor.set_header(name, &u).map_err(|_| ())?,
                    Err(_) => editor.remove_header(name).map_err(|_| ())?,
                };
            }
        }
        if let Some(info) = msg.rtp_info() {
            match map.rtp_info_to_client(route, info) {
                Ok(v) => editor.set_header("RTP-Info", &v).map_err(|_| ())?,
                Err(_) => editor.remove_header("RTP-Info").map_err(|_| ())?,
            };
        }
        if !msg.body().is_empty() && is_sdp(msg) {
            let body = self.sdp_to_client(route, msg.body()).map_err(|_| ())?;
            editor.set_body(body);
        }
        self.rewrite_transport_source(msg, &mut editor)
            .map_err(|_| ())?;
        Ok(editor.to_bytes())
    }

    /// The client's reply to a server request: back to the server with its URLs pointed
    /// upstream. A reply to nothing vgate forwarded is dropped.
    pub(super) fn client_reply(&mut self, msg: &Message<'_>, out: &mut Vec<Output>) {
        let Some(cseq) = msg.cseq_raw() else { return };
        let Some(i) = self.server_requests.iter().position(|c| c == cseq) else {
            return;
        };
        self.server_requests.remove(i);
        let Some(route) = self.route else { return };
        let mut editor = Editor::new(msg);
        for name in ["Content-Base", "Content-Location", "Location"] {
            if let Some(url) = msg.header(name) {
                let done = match self.settings.map.to_upstream_on(route, url) {
                    Ok(u) => editor.set_header(name, &u).is_ok(),
                    Err(_) => editor.remove_header(name).is_ok(),
                };
                if !done {
                    return;
                }
            }
        }
        self.settings
            .events
            .client_replies_forwarded
            .fetch_add(1, Relaxed);
        out.push(Output::Upstream(editor.to_bytes()));
    }
}
