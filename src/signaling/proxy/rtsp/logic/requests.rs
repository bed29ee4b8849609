//! Requests and replies: a client request checked, answered locally or rewritten and sent
//! upstream; the upstream's reply paired back by `CSeq` and delivered in request order; the
//! SDP rewrites of DESCRIBE and ANNOUNCE; failing what is pending.

use std::convert::Infallible;

use super::{
    Exchange, InFlight, MediaPorts, Output, SetupKind, Slot, TcpSide, BAD_GATEWAY, MAX_PENDING,
    METHODS, METHOD_NOT_ALLOWED, SETTLED_REFUSED,
};
use crate::signaling::rtsp::transport::LowerTransport;
use crate::signaling::rtsp::{
    build_response, parse_transport, Editor, Limits, Message, RtspError, Status,
};
use crate::signaling::sdp;

impl<M: MediaPorts> Exchange<M> {
    /// A complete message from the client (`raw` is one `Frame::Message`).
    pub fn client_message(&mut self, raw: &[u8], now_secs: u64) -> Vec<Output> {
        if let Some(m) = raw
            .split(|b| *b == b' ')
            .next()
            .filter(|m| !m.is_empty() && !m.starts_with(b"RTSP/"))
        {
            self.settings.stats.request(m);
        }
        let mut out = Vec::new();
        if self.closed {
            return out;
        }
        let msg = match Message::parse(raw, &self.settings.limits) {
            Ok(m) => m,
            Err(_) => {
                // The stream may be out of step now: answer and close.
                self.local(&mut out, None, Status::BAD_REQUEST, &[]);
                out.push(Output::Close);
                self.closed = true;
                return out;
            }
        };
        let Some(method) = msg.method() else {
            self.client_reply(&msg, &mut out);
            return out;
        };
        let cseq = match msg.cseq() {
            Ok(_) => msg.cseq_raw().map(str::to_owned),
            Err(_) => {
                self.local(&mut out, None, Status::BAD_REQUEST, &[]);
                return out;
            }
        };
        let cseq = cseq.unwrap_or_default();
        if msg.version() != "RTSP/1.0" {
            self.local(&mut out, Some(&cseq), Status::VERSION_NOT_SUPPORTED, &[]);
            return out;
        }
        if self.slots.len() >= MAX_PENDING {
            self.local(&mut out, Some(&cseq), Status::SERVICE_UNAVAILABLE, &[]);
            return out;
        }
        match self.request(&msg, method, &cseq, now_secs, &mut out) {
            Ok(()) => {}
            Err(status) => self.local(&mut out, Some(&cseq), status, &[]),
        }
        out
    }
}

impl<M: MediaPorts> Exchange<M> {
    pub(super) fn request(
        &mut self,
        msg: &Message<'_>,
        method: &str,
        cseq: &str,
        now_secs: u64,
        out: &mut Vec<Output>,
    ) -> Result<(), Status> {
        const KNOWN: [&str; 10] = [
            "OPTIONS",
            "DESCRIBE",
            "SETUP",
            "PLAY",
            "PAUSE",
            "GET_PARAMETER",
            "SET_PARAMETER",
            "TEARDOWN",
            "ANNOUNCE",
            "RECORD",
        ];
        if !KNOWN.contains(&method) {
            self.local(out, Some(cseq), METHOD_NOT_ALLOWED, &[("Allow", METHODS)]);
            return Ok(());
        }
        let client_uri = msg.uri().unwrap_or_default();
        let settings = std::sync::Arc::clone(&self.settings);
        if let Some(verifier) = &settings.verifier {
            let ok = msg
                .authorization()
                .is_some_and(|a| verifier.verify(a, method, client_uri, now_secs).is_ok());
            if !ok {
                let stale = matches!(
                    msg.authorization()
                        .map(|a| verifier.verify(a, method, client_uri, now_secs)),
                    Some(Err(RtspError::BadNonce { stale: true }))
                );
                let mut random = [0u8; 16];
                for chunk in random.chunks_mut(8) {
                    let r = u64::from_str_radix(&self.random_hex(), 16).unwrap_or(self.rng);
                    chunk.copy_from_slice(&r.to_le_bytes());
                }
                let challenges = verifier.challenges(now_secs, random, stale);
                let headers: Vec<(&str, &str)> = challenges
                    .iter()
                    .map(|c| ("WWW-Authenticate", c.as_str()))
                    .collect();
                self.local(out, Some(cseq), Status::UNAUTHORIZED, &headers);
                return Ok(());
            }
        }
        // Which upstream, and the Request-URI it sees.
        let upstream_uri = if client_uri == "*" {
            if self.route.is_none() {
                // OPTIONS * before any URL: vgate answers; no upstream is chosen yet.
                self.local(out, Some(cseq), Status::OK, &[("Public", METHODS)]);
                return Ok(());
            }
            "*".to_owned()
        } else {
            let mapped = self
                .settings
                .map
                .to_upstream(client_uri)
                .map_err(|e| match e {
                    RtspError::NoRoute => Status::NOT_FOUND,
                    _ => Status::BAD_REQUEST,
                })?;
            match self.route {
                None => {
                    let up = *self
                        .settings
                        .upstreams
                        .get(mapped.route)
                        .ok_or(Status::INTERNAL_SERVER_ERROR)?;
                    self.route = Some(mapped.route);
                    out.push(Output::Connect(up));
                }
                // One upstream connection per client connection: another upstream's
                // path cannot be served on this one.
                Some(r)
                    if self.settings.upstreams.get(r)
                        != self.settings.upstreams.get(mapped.route) =>
                {
                    return Err(Status::NOT_FOUND)
                }
                Some(_) => {}
            }
            mapped.url
        };
        let route = self.route.unwrap_or_default();
        let mut editor = Editor::new(msg);
        editor
            .set_uri(&upstream_uri)
            .map_err(|_| Status::BAD_REQUEST)?;
        let manages_auth = self.settings.verifier.is_some() || self.credentials(route).is_some();
        if manages_auth {
            // The client's credentials are for vgate (or meaningless upstream: digest
            // covers the rewritten URI); they never cross.
            let _ = editor.remove_header("Authorization");
        }
        if matches!(method, "SETUP" | "PLAY" | "RECORD") {
            self.upstream_url = Some(upstream_uri.clone());
        }
        let mut setup = None;
        let mut profile = String::new();
        let mut retried = false;
        match method {
            "SETUP" => {
                if let Some(why) = self.media_refusal(&upstream_uri) {
                    self.refuse_media(out, cseq, &why);
                    return Ok(());
                }
                let (kind, p, settled) = self.setup_request(msg, &mut editor)?;
                setup = Some(kind);
                profile = p;
                retried = settled;
            }
            "ANNOUNCE" => {
                if !msg.body().is_empty() {
                    let body = self.sdp_to_upstream(route, msg.body())?;
                    // What the client will send: the tracks it announced (upstream URLs).
                    self.describe(&body);
                    let enforce = self.settings.media_validate.enforces();
                    if let Some(why) = enforce
                        .then(|| crate::signaling::media_spec::all_refused(&self.refused))
                        .flatten()
                    {
                        self.refuse_media(out, cseq, &why);
                        return Ok(());
                    }
                    editor.set_body(body);
                }
                self.announced = true;
            }
            _ => {}
        }
        // Numbered only once nothing can refuse it: vgate's numbers have no gaps.
        let upstream_cseq = self.next_cseq;
        self.next_cseq = self.next_cseq.wrapping_add(1).max(1);
        editor
            .set_header("CSeq", &upstream_cseq.to_string())
            .map_err(|_| Status::INTERNAL_SERVER_ERROR)?;
        let mut sent = editor.to_bytes();
        if let Some(auth) = self.authorization_for(route, method, &upstream_uri) {
            sent = with_header(&sent, &self.settings.limits, "Authorization", &auth)
                .map_err(|_| Status::INTERNAL_SERVER_ERROR)?;
        }
        out.push(Output::Upstream(sent.clone()));
        if method == "TEARDOWN" {
            // Whatever the server answers, the client is done with the session (or the
            // track); clients often close the connection right after sending it.
            if self.end_track(&upstream_uri) {
                out.push(Output::TrackEnded);
            } else {
                self.end_session();
                out.push(Output::SessionEnded);
            }
        }
        self.slots.push_back(Slot::Waiting(InFlight {
            cseq: upstream_cseq,
            client_cseq: cseq.to_owned(),
            method: method.to_owned(),
            upstream_uri,
            sent,
            setup,
            profile,
            retried,
            answered_challenge: false,
        }));
        Ok(())
    }
}

impl<M: MediaPorts> Exchange<M> {
    pub(super) fn sdp_to_upstream(&self, route: usize, body: &[u8]) -> Result<Vec<u8>, Status> {
        let urls = self
            .settings
            .map
            .sdp_to_upstream(route, body)
            .map_err(|_| Status::BAD_REQUEST)?;
        let addr = self.settings.gateway[self.settings.client_domain.other().index()];
        sdp::rewrite(&urls, addr, |_, _| Ok::<_, Infallible>(None)).map_err(|_| Status::BAD_REQUEST)
    }

    // ---- upstream → client -------------------------------------------------------------
}

impl<M: MediaPorts> Exchange<M> {
    /// A complete message from the upstream.
    pub fn upstream_message(&mut self, raw: &[u8]) -> Vec<Output> {
        if raw.starts_with(b"RTSP/") {
            if let Some(code) = raw
                .get(9..12)
                .and_then(|c| std::str::from_utf8(c).ok())
                .and_then(|c| c.parse().ok())
            {
                self.settings.stats.response(code);
            }
        }
        let mut out = Vec::new();
        if self.closed {
            return out;
        }
        let Ok(msg) = Message::parse(raw, &self.settings.limits) else {
            self.fail_pending(&mut out, BAD_GATEWAY);
            return out;
        };
        if let Some(method) = msg.method() {
            self.server_request(&msg, method, &mut out);
            return out;
        }
        let Ok(cseq) = msg.cseq() else {
            return out;
        };
        let Some(index) = self
            .slots
            .iter()
            .position(|s| matches!(s, Slot::Waiting(f) if f.cseq == cseq))
        else {
            return out;
        };
        let Some(Slot::Waiting(mut flight)) = self.slots.remove(index) else {
            return out;
        };
        let status = msg.status().unwrap_or(0);
        let route = self.route.unwrap_or_default();
        if status == 401 && !flight.answered_challenge && self.credentials(route).is_some() {
            self.challenge = msg.www_authenticate().map(str::to_owned).collect();
            self.nonce_count = 0;
            if let Some(auth) = self.authorization_for(route, &flight.method, &flight.upstream_uri)
            {
                let new_cseq = self.next_cseq;
                self.next_cseq = self.next_cseq.wrapping_add(1).max(1);
                let resent =
                    with_header(&flight.sent, &self.settings.limits, "Authorization", &auth)
                        .and_then(|b| {
                            with_header(&b, &self.settings.limits, "CSeq", &new_cseq.to_string())
                        });
                if let Ok(bytes) = resent {
                    flight.cseq = new_cseq;
                    flight.sent = bytes.clone();
                    flight.answered_challenge = true;
                    out.push(Output::Upstream(bytes));
                    self.slots.insert(index, Slot::Waiting(flight));
                    return out;
                }
            }
        }
        if flight.method == "SETUP" && !flight.retried && self.settings.bridge.is_some() {
            if let Some(kind) = flight.setup {
                // An interleaved answer to UDP is bridged as it is (setup_reply).
                let other = (200..300).contains(&status)
                    && answered_lower(&msg).is_some_and(|l| {
                        l != kind.upstream_lower()
                            && !matches!((kind, l), (SetupKind::Udp(_), LowerTransport::Tcp))
                    });
                if status == 461 || other {
                    // The upstream refused the client's lower transport (or answered the
                    // other one): ask it for the other one, and bridge.
                    match self.retry_setup(&msg, &mut flight, kind, route) {
                        Ok(bytes) => {
                            out.push(Output::Upstream(bytes));
                            self.slots.insert(index, Slot::Waiting(flight));
                            return out;
                        }
                        Err(status) => {
                            self.give_back(&flight);
                            let reply = build_response(Some(&flight.client_cseq), status, &[])
                                .unwrap_or_default();
                            self.slots.insert(index, Slot::Ready(reply, Vec::new()));
                            self.flush(&mut out);
                            return out;
                        }
                    }
                }
            }
        }
        if flight.method == "SETUP" && flight.retried && status == 461 {
            // The other transport refused too: nothing to bridge. Or the track was asked
            // with the session's settled transport: it is not asked again.
            self.give_back(&flight);
            let refusal = if self.settled.is_some() {
                SETTLED_REFUSED
            } else {
                self.unbridgeable()
            };
            let reply = build_response(Some(&flight.client_cseq), refusal, &[]).unwrap_or_default();
            self.slots.insert(index, Slot::Ready(reply, Vec::new()));
            self.flush(&mut out);
            return out;
        }
        let (reply, release) = match self.reply(&msg, &flight, route) {
            Ok(bytes) => (bytes, self.releases_client_legs(status, &flight.method)),
            Err(status) => {
                self.give_back(&flight);
                let bytes =
                    build_response(Some(&flight.client_cseq), status, &[]).unwrap_or_default();
                (bytes, Vec::new())
            }
        };
        self.slots.insert(index, Slot::Ready(reply, release));
        self.flush(&mut out);
        out
    }
}

impl<M: MediaPorts> Exchange<M> {
    /// Rewrites one reply for the client; acts on what it means for the session.
    pub(super) fn reply(
        &mut self,
        msg: &Message<'_>,
        flight: &InFlight,
        route: usize,
    ) -> Result<Vec<u8>, Status> {
        let status = msg.status().unwrap_or(0);
        let ok = (200..300).contains(&status);
        let mut editor = Editor::new(msg);
        editor
            .set_header("CSeq", &flight.client_cseq)
            .map_err(|_| BAD_GATEWAY)?;
        for name in ["Content-Base", "Content-Location", "Location"] {
            if let Some(url) = msg.header(name) {
                match self.settings.map.to_client(route, url) {
                    Ok(u) => editor.set_header(name, &u).map_err(|_| BAD_GATEWAY)?,
                    Err(_) => editor.remove_header(name).map_err(|_| BAD_GATEWAY)?,
                };
            }
        }
        if let Some(info) = msg.rtp_info() {
            match self.settings.map.rtp_info_to_client(route, info) {
                Ok(v) => editor.set_header("RTP-Info", &v).map_err(|_| BAD_GATEWAY)?,
                Err(_) => editor.remove_header("RTP-Info").map_err(|_| BAD_GATEWAY)?,
            };
        }
        if status == 401 && self.credentials(route).is_some() {
            // vgate's own credentials were refused: the client cannot do better.
            return Err(BAD_GATEWAY);
        }
        if !msg.body().is_empty() && is_sdp(msg) {
            if flight.method == "DESCRIBE" {
                // What the server will send, by its own control URLs.
                self.describe(msg.body());
            }
            let body = self.sdp_to_client(route, msg.body())?;
            editor.set_body(body);
        }
        if let Ok(Some(session)) = msg.session() {
            self.upstream_session = Some(session.id.to_string());
            // vgate ends idle sessions after the shorter of the server's timeout and its own,
            // so it tells the client the shorter one: keep-alives then come in time.
            let own = self.settings.session_timeout;
            let effective = session.timeout.map_or(own, |t| t.min(own));
            self.state.session_timeout = Some(effective);
            if session.timeout != Some(effective) {
                editor
                    .set_header("Session", &format!("{};timeout={effective}", session.id))
                    .map_err(|_| BAD_GATEWAY)?;
            }
        }
        match flight.method.as_str() {
            "SETUP" => match flight.setup {
                Some(kind) if ok => self.setup_reply(msg, kind, flight, &mut editor)?,
                _ => {
                    self.give_back(flight);
                    self.rewrite_transport_source(msg, &mut editor)?;
                }
            },
            "PLAY" | "RECORD" if ok => {
                self.state.playing = true;
                self.state.recording = flight.method == "RECORD";
            }
            "PAUSE" if ok => self.state.playing = false,
            // The session ended when the TEARDOWN went out.
            "TEARDOWN" => {}
            _ => self.rewrite_transport_source(msg, &mut editor)?,
        }
        Ok(editor.to_bytes())
    }

    /// Whether the client's bridge legs may write once the reply (`status` to `method`,
    /// already acted on) is written: it starts the media (PLAY, RECORD) or sets up a track
    /// of a session already playing, and the client's connection has a leg. A failed PLAY
    /// releases nothing: the legs hold (their sinks bounded, overflow counted as stalls)
    /// until a PLAY succeeds or the track or session ends and closes them. The legs: their
    /// channel pairs, as they are now (none: empty).
    pub(super) fn releases_client_legs(&self, status: u16, method: &str) -> Vec<(u8, u8)> {
        if !((200..300).contains(&status)
            && self.state.playing
            && matches!(method, "PLAY" | "RECORD" | "SETUP"))
        {
            return Vec::new();
        }
        self.tracks
            .iter()
            .filter_map(|t| match t.leg {
                Some((TcpSide::Client, channels)) => Some(channels),
                _ => None,
            })
            .collect()
    }
}

impl<M: MediaPorts> Exchange<M> {
    pub(super) fn sdp_to_client(&self, route: usize, body: &[u8]) -> Result<Vec<u8>, Status> {
        let urls = self
            .settings
            .map
            .sdp_to_client(route, body)
            .map_err(|_| BAD_GATEWAY)?;
        let addr = self.settings.gateway[self.settings.client_domain.index()];
        sdp::rewrite(&urls, addr, |_, _| Ok::<_, Infallible>(None)).map_err(|_| BAD_GATEWAY)
    }

    // ---- ordering ------------------------------------------------------------------------

    /// vgate answers a request itself, in its turn.
    pub(super) fn local(
        &mut self,
        out: &mut Vec<Output>,
        cseq: Option<&str>,
        status: Status,
        extra: &[(&str, &str)],
    ) {
        let bytes = build_response(cseq, status, extra)
            .or_else(|_| build_response(None, status, &[]))
            .unwrap_or_default();
        self.slots.push_back(Slot::Ready(bytes, Vec::new()));
        self.flush(out);
    }

    pub(super) fn flush(&mut self, out: &mut Vec<Output>) {
        while let Some(Slot::Ready(..)) = self.slots.front() {
            if let Some(Slot::Ready(bytes, release)) = self.slots.pop_front() {
                out.push(Output::Client(bytes));
                if !release.is_empty() {
                    out.push(Output::ReleaseClientLegs(release));
                }
            }
        }
    }

    /// The upstream is gone or broken: every waiting request gets `status`, then close.
    pub fn fail_pending(&mut self, out: &mut Vec<Output>, status: Status) {
        for slot in self.slots.iter_mut() {
            if let Slot::Waiting(f) = slot {
                let bytes = build_response(Some(&f.client_cseq), status, &[]).unwrap_or_default();
                *slot = Slot::Ready(bytes, Vec::new());
            }
        }
        self.flush(out);
        out.push(Output::Close);
        self.closed = true;
    }

    /// The client's byte stream cannot be framed: 400 in its turn, then close.
    pub fn framing_error(&mut self) -> Vec<Output> {
        let mut out = Vec::new();
        if !self.closed {
            self.local(&mut out, None, Status::BAD_REQUEST, &[]);
            out.push(Output::Close);
            self.closed = true;
        }
        out
    }

    /// The upstream could not be reached.
    pub fn connect_failed(&mut self) -> Vec<Output> {
        let mut out = Vec::new();
        self.fail_pending(&mut out, Status::SERVICE_UNAVAILABLE);
        out
    }
}

pub(super) fn is_sdp(msg: &Message<'_>) -> bool {
    match msg.header("Content-Type") {
        Some(t) => t
            .split(';')
            .next()
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/sdp")),
        None => msg.body().starts_with(b"v=0"),
    }
}

/// The lower transport of the first alternative of a reply's Transport.
pub(super) fn answered_lower(msg: &Message<'_>) -> Option<LowerTransport> {
    let value = msg.transport()?;
    parse_transport(value).ok()?.first().map(|s| s.lower)
}

pub(super) static LOG_LEG: crate::logging::RateLimit = crate::logging::RateLimit::new(10_000);

/// A Transport refusal as the status the client gets.
pub(super) fn transport_status(e: RtspError) -> Status {
    match e {
        RtspError::ForeignDestination => Status::FORBIDDEN,
        RtspError::UnterminatedQuote => Status::BAD_REQUEST,
        _ => Status::UNSUPPORTED_TRANSPORT,
    }
}

/// `raw` (one whole message) with header `name` set to `value`.
pub(super) fn with_header(
    raw: &[u8],
    limits: &Limits,
    name: &str,
    value: &str,
) -> Result<Vec<u8>, RtspError> {
    let msg = Message::parse(raw, limits)?;
    let mut e = Editor::new(&msg);
    e.set_header(name, value)?;
    Ok(e.to_bytes())
}
