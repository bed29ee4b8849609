//! HTTP-style authentication for RTSP: Basic (RFC 7617) and Digest
//! (RFC 2617, RFC 7616), in both directions.
//!
//! Owns: parsing `WWW-Authenticate` challenges from an upstream server
//! ([`parse_www_authenticate`]) and answering them with vgate's configured
//! credentials ([`authorization`]); and the other side, where vgate itself
//! asks clients for credentials per route ([`DigestVerifier`]: issue a
//! challenge, verify the `Authorization` that comes back).
//!
//! Does not own: randomness or the clock (the caller passes both, so this
//! stays pure and testable), where credentials are stored, or rate limiting.
//!
//! Nonces issued by [`DigestVerifier`] are stateless: timestamp, caller
//! randomness and an HMAC-SHA-256 tag under a per-process secret. They expire
//! but are not single-use: a captured `Authorization` can be replayed for the
//! same method and URI until the nonce expires (tracking `nc` would need
//! state, which belongs to the session table).
//!
//! Anything holding a password or secret prints `***` in `Debug`.

use std::borrow::Cow;
use std::fmt;

use base64::Engine as _;
use md5::Md5;
use sha2::{Digest, Sha256, Sha512_256};

use crate::signaling::rtsp::error::RtspError;

/// Most challenges taken from one header value / parameters in one challenge.
const MAX_CHALLENGES: usize = 8;
const MAX_AUTH_PARAMS: usize = 32;

/// A username and password. `Debug` never shows the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    username: String,
    password: String,
}

impl Credentials {
    pub fn new(username: impl Into<String>, password: impl Into<String>) -> Self {
        Credentials {
            username: username.into(),
            password: password.into(),
        }
    }

    pub fn username(&self) -> &str {
        &self.username
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"***")
            .finish()
    }
}

/// Digest hash algorithms of RFC 7616 §3.2 (`-sess` variants included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    Md5,
    Md5Sess,
    Sha256,
    Sha256Sess,
    Sha512_256,
    Sha512_256Sess,
}

impl Algorithm {
    pub fn parse(name: &str) -> Result<Self, RtspError> {
        const NAMES: [(&str, Algorithm); 6] = [
            ("MD5", Algorithm::Md5),
            ("MD5-sess", Algorithm::Md5Sess),
            ("SHA-256", Algorithm::Sha256),
            ("SHA-256-sess", Algorithm::Sha256Sess),
            ("SHA-512-256", Algorithm::Sha512_256),
            ("SHA-512-256-sess", Algorithm::Sha512_256Sess),
        ];
        NAMES
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, a)| *a)
            .ok_or(RtspError::UnsupportedAlgorithm)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::Md5 => "MD5",
            Algorithm::Md5Sess => "MD5-sess",
            Algorithm::Sha256 => "SHA-256",
            Algorithm::Sha256Sess => "SHA-256-sess",
            Algorithm::Sha512_256 => "SHA-512-256",
            Algorithm::Sha512_256Sess => "SHA-512-256-sess",
        }
    }

    fn is_session(self) -> bool {
        matches!(
            self,
            Algorithm::Md5Sess | Algorithm::Sha256Sess | Algorithm::Sha512_256Sess
        )
    }

    /// Preference when a server offers several (stronger first).
    fn strength(self) -> u8 {
        match self {
            Algorithm::Md5 | Algorithm::Md5Sess => 1,
            Algorithm::Sha256 | Algorithm::Sha256Sess => 2,
            Algorithm::Sha512_256 | Algorithm::Sha512_256Sess => 3,
        }
    }

    /// Lower-case hex of H(parts joined by ':').
    fn hash_hex(self, parts: &[&str]) -> String {
        match self {
            Algorithm::Md5 | Algorithm::Md5Sess => hash_parts::<Md5>(parts),
            Algorithm::Sha256 | Algorithm::Sha256Sess => hash_parts::<Sha256>(parts),
            Algorithm::Sha512_256 | Algorithm::Sha512_256Sess => hash_parts::<Sha512_256>(parts),
        }
    }
}

fn hash_parts<D: Digest>(parts: &[&str]) -> String {
    let mut hasher = D::new();
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            hasher.update(b":");
        }
        hasher.update(part.as_bytes());
    }
    to_hex(&hasher.finalize())
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A Digest challenge (the parameters vgate uses; others are ignored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DigestChallenge<'a> {
    pub realm: Cow<'a, str>,
    pub nonce: Cow<'a, str>,
    pub opaque: Option<Cow<'a, str>>,
    pub algorithm: Algorithm,
    /// Whether the server named the algorithm (then we echo it; old RTSP
    /// servers that did not may not expect it back).
    pub algorithm_explicit: bool,
    /// The server offered `qop=auth` (vgate then always uses it).
    pub qop_auth: bool,
    pub stale: bool,
}

/// One challenge from a `WWW-Authenticate` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge<'a> {
    Basic {
        realm: Cow<'a, str>,
    },
    Digest(DigestChallenge<'a>),
    /// A scheme, algorithm or qop vgate cannot answer, with the reason.
    Unsupported {
        scheme: &'a str,
        reason: RtspError,
    },
}

/// Parses every challenge in one `WWW-Authenticate` value (RFC 7235 allows
/// several per value, comma-separated).
pub fn parse_www_authenticate(value: &str) -> Result<Vec<Challenge<'_>>, RtspError> {
    let what = "WWW-Authenticate";
    let mut lexer = Lexer::new(value);
    let mut challenges = Vec::new();
    loop {
        lexer.skip_ws_and_commas();
        if lexer.at_end() {
            break;
        }
        if challenges.len() >= MAX_CHALLENGES {
            return Err(RtspError::BadAuthHeader { what });
        }
        let scheme = lexer.token().ok_or(RtspError::BadAuthHeader { what })?;
        lexer.skip_token68();
        let params = lexer.auth_params(what)?;
        challenges.push(challenge_from(scheme, &params));
    }
    if challenges.is_empty() {
        return Err(RtspError::BadAuthHeader { what });
    }
    Ok(challenges)
}

fn challenge_from<'a>(scheme: &'a str, params: &AuthParams<'a>) -> Challenge<'a> {
    if scheme.eq_ignore_ascii_case("Basic") {
        let realm = params.get("realm").cloned().unwrap_or_default();
        return Challenge::Basic { realm };
    }
    if !scheme.eq_ignore_ascii_case("Digest") {
        return Challenge::Unsupported {
            scheme,
            reason: RtspError::UnsupportedScheme,
        };
    }
    match digest_challenge(params) {
        Ok(d) => Challenge::Digest(d),
        Err(reason) => Challenge::Unsupported { scheme, reason },
    }
}

fn digest_challenge<'a>(params: &AuthParams<'a>) -> Result<DigestChallenge<'a>, RtspError> {
    let what = "Digest challenge";
    let realm = params.required("realm", what)?;
    let nonce = params.required("nonce", what)?;
    let algorithm_text = params.get("algorithm");
    let algorithm = match algorithm_text {
        Some(a) => Algorithm::parse(a)?,
        None => Algorithm::Md5,
    };
    let qop_auth = match params.get("qop") {
        None => false,
        Some(q) if q.split(',').any(|o| o.trim().eq_ignore_ascii_case("auth")) => true,
        Some(_) => return Err(RtspError::UnsupportedQop),
    };
    Ok(DigestChallenge {
        realm,
        nonce,
        opaque: params.get("opaque").cloned(),
        algorithm,
        algorithm_explicit: algorithm_text.is_some(),
        qop_auth,
        stale: params
            .get("stale")
            .is_some_and(|s| s.eq_ignore_ascii_case("true")),
    })
}

/// The challenge vgate should answer: the strongest Digest, else Basic.
pub fn choose_challenge<'c, 'a>(challenges: &'c [Challenge<'a>]) -> Option<&'c Challenge<'a>> {
    let digest = challenges
        .iter()
        .filter_map(|c| match c {
            Challenge::Digest(d) => Some((c, d.algorithm.strength())),
            _ => None,
        })
        .max_by_key(|(_, strength)| *strength)
        .map(|(c, _)| c);
    digest.or_else(|| {
        challenges
            .iter()
            .find(|c| matches!(c, Challenge::Basic { .. }))
    })
}

/// The client nonce and nonce count for one Digest answer (the caller
/// supplies randomness and counts requests per server nonce).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientNonce<'c> {
    pub cnonce: &'c str,
    pub nc: u32,
}

/// Builds the `Authorization` value answering `challenge` for one request.
/// `uri` is the Request-URI exactly as sent upstream.
pub fn authorization(
    challenge: &Challenge<'_>,
    credentials: &Credentials,
    method: &str,
    uri: &str,
    client_nonce: ClientNonce<'_>,
) -> Result<String, RtspError> {
    match challenge {
        Challenge::Basic { .. } => Ok(basic_authorization(credentials)),
        Challenge::Digest(d) => Ok(digest_authorization(
            d,
            credentials,
            method,
            uri,
            client_nonce,
        )),
        Challenge::Unsupported { reason, .. } => Err(reason.clone()),
    }
}

fn basic_authorization(credentials: &Credentials) -> String {
    let pair = format!("{}:{}", credentials.username, credentials.password);
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    )
}

fn digest_authorization(
    d: &DigestChallenge<'_>,
    credentials: &Credentials,
    method: &str,
    uri: &str,
    client_nonce: ClientNonce<'_>,
) -> String {
    let nc = format!("{:08x}", client_nonce.nc);
    let qop = d.qop_auth.then_some(QopAnswer {
        nc: &nc,
        cnonce: client_nonce.cnonce,
    });
    let response = digest_response(&DigestInput {
        algorithm: d.algorithm,
        username: &credentials.username,
        password: &credentials.password,
        realm: &d.realm,
        nonce: &d.nonce,
        cnonce: client_nonce.cnonce,
        method,
        uri,
        qop,
    });
    let mut out = format!(
        "Digest username=\"{}\", realm=\"{}\", nonce=\"{}\", uri=\"{}\"",
        escape_quoted(&credentials.username),
        escape_quoted(&d.realm),
        escape_quoted(&d.nonce),
        escape_quoted(uri)
    );
    if d.algorithm_explicit {
        out.push_str(&format!(", algorithm={}", d.algorithm.as_str()));
    }
    out.push_str(&format!(", response=\"{response}\""));
    if let Some(opaque) = &d.opaque {
        out.push_str(&format!(", opaque=\"{}\"", escape_quoted(opaque)));
    }
    if d.qop_auth {
        out.push_str(&format!(
            ", qop=auth, nc={nc}, cnonce=\"{}\"",
            escape_quoted(client_nonce.cnonce)
        ));
    } else if d.algorithm.is_session() {
        out.push_str(&format!(
            ", cnonce=\"{}\"",
            escape_quoted(client_nonce.cnonce)
        ));
    }
    out
}

/// `nc` and `cnonce` when `qop=auth` is in use.
#[derive(Clone, Copy)]
struct QopAnswer<'s> {
    nc: &'s str,
    cnonce: &'s str,
}

/// Everything the Digest `response` depends on (unescaped values).
struct DigestInput<'s> {
    algorithm: Algorithm,
    username: &'s str,
    password: &'s str,
    realm: &'s str,
    nonce: &'s str,
    cnonce: &'s str,
    method: &'s str,
    uri: &'s str,
    qop: Option<QopAnswer<'s>>,
}

/// RFC 7616 §3.4.1 (and RFC 2617 §3.2.2 without qop).
fn digest_response(i: &DigestInput<'_>) -> String {
    let alg = i.algorithm;
    let mut ha1 = alg.hash_hex(&[i.username, i.realm, i.password]);
    if alg.is_session() {
        ha1 = alg.hash_hex(&[&ha1, i.nonce, i.cnonce]);
    }
    let ha2 = alg.hash_hex(&[i.method, i.uri]);
    match i.qop {
        Some(q) => alg.hash_hex(&[&ha1, i.nonce, q.nc, q.cnonce, "auth", &ha2]),
        None => alg.hash_hex(&[&ha1, i.nonce, &ha2]),
    }
}

fn escape_quoted(s: &str) -> Cow<'_, str> {
    if s.contains(['"', '\\']) {
        Cow::Owned(s.replace('\\', "\\\\").replace('"', "\\\""))
    } else {
        Cow::Borrowed(s)
    }
}

/// vgate's side: challenges clients on one route and checks their answers.
#[derive(Clone)]
pub struct DigestVerifier {
    realm: String,
    secret: [u8; 32],
    users: Vec<Credentials>,
    algorithms: Vec<Algorithm>,
    nonce_lifetime_secs: u64,
}

impl fmt::Debug for DigestVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DigestVerifier")
            .field("realm", &self.realm)
            .field("secret", &"***")
            .field("users", &self.users)
            .field("algorithms", &self.algorithms)
            .field("nonce_lifetime_secs", &self.nonce_lifetime_secs)
            .finish()
    }
}

const NONCE_TS: usize = 8;
const NONCE_RANDOM: usize = 16;
const NONCE_TAG: usize = 16;
/// Clock skew tolerated for a nonce "from the future" (a reload, NTP step).
const NONCE_FUTURE_SLACK_SECS: u64 = 60;

impl DigestVerifier {
    /// `secret` must come from a CSPRNG at start-up; it only has to live as
    /// long as the nonces it signs. Offers SHA-256 then MD5 (most RTSP
    /// clients — ffmpeg, GStreamer, VLC — only do MD5), nonces live 5 min.
    pub fn new(realm: impl Into<String>, secret: [u8; 32], users: Vec<Credentials>) -> Self {
        DigestVerifier {
            realm: realm.into(),
            secret,
            users,
            algorithms: vec![Algorithm::Sha256, Algorithm::Md5],
            nonce_lifetime_secs: 300,
        }
    }

    /// Algorithms to offer, one challenge each, in preference order.
    pub fn with_algorithms(mut self, algorithms: Vec<Algorithm>) -> Self {
        self.algorithms = algorithms;
        self
    }

    pub fn with_nonce_lifetime(mut self, secs: u64) -> Self {
        self.nonce_lifetime_secs = secs;
        self
    }

    /// `WWW-Authenticate` values for a 401 (send each as its own header).
    /// `stale` after [`RtspError::BadNonce`]` { stale: true }` so clients
    /// retry silently instead of prompting the user.
    pub fn challenges(
        &self,
        now_secs: u64,
        random: [u8; NONCE_RANDOM],
        stale: bool,
    ) -> Vec<String> {
        let nonce = self.make_nonce(now_secs, random);
        self.algorithms
            .iter()
            .map(|alg| {
                let mut c = format!(
                    "Digest realm=\"{}\", nonce=\"{nonce}\", algorithm={}, qop=\"auth\"",
                    escape_quoted(&self.realm),
                    alg.as_str()
                );
                if stale {
                    c.push_str(", stale=true");
                }
                c
            })
            .collect()
    }

    /// Checks a client's `Authorization` for this request; returns the
    /// authenticated username.
    pub fn verify(
        &self,
        authorization: &str,
        method: &str,
        request_uri: &str,
        now_secs: u64,
    ) -> Result<&str, RtspError> {
        let what = "Authorization";
        let mut lexer = Lexer::new(authorization);
        lexer.skip_ws_and_commas();
        let scheme = lexer.token().ok_or(RtspError::BadAuthHeader { what })?;
        if !scheme.eq_ignore_ascii_case("Digest") {
            return Err(RtspError::UnsupportedScheme);
        }
        let params = lexer.auth_params(what)?;
        lexer.skip_ws_and_commas();
        if !lexer.at_end() {
            return Err(RtspError::BadAuthHeader { what });
        }
        self.verify_params(&params, method, request_uri, now_secs)
    }

    fn verify_params(
        &self,
        params: &AuthParams<'_>,
        method: &str,
        request_uri: &str,
        now_secs: u64,
    ) -> Result<&str, RtspError> {
        let what = "Digest credentials";
        let username = params.required("username", what)?;
        let realm = params.required("realm", what)?;
        let nonce = params.required("nonce", what)?;
        let uri = params.required("uri", what)?;
        let response = params.required("response", what)?;
        let algorithm = match params.get("algorithm") {
            Some(a) => Algorithm::parse(a)?,
            None => Algorithm::Md5,
        };
        if !self.algorithms.contains(&algorithm) {
            return Err(RtspError::UnsupportedAlgorithm);
        }
        let issued = self.check_nonce(&nonce)?;
        // A response computed for another URI or realm must not be usable
        // here, even with a valid nonce.
        if realm != self.realm.as_str() || uri != request_uri {
            return Err(RtspError::AuthRejected);
        }
        let cnonce = params.get("cnonce").map(|c| c.as_ref()).unwrap_or_default();
        let qop = self.client_qop(params, cnonce)?;
        let user = self
            .users
            .iter()
            .find(|u| u.username == username.as_ref())
            .ok_or(RtspError::AuthRejected)?;
        let expected = digest_response(&DigestInput {
            algorithm,
            username: &user.username,
            password: &user.password,
            realm: &self.realm,
            nonce: &nonce,
            cnonce,
            method,
            uri: &uri,
            qop,
        });
        if !constant_time_eq(
            expected.as_bytes(),
            response.to_ascii_lowercase().as_bytes(),
        ) {
            return Err(RtspError::AuthRejected);
        }
        // Stale only once the digest itself is right (RFC 7616 §3.3), so
        // a client with a wrong password is not told to retry silently.
        if now_secs > issued.saturating_add(self.nonce_lifetime_secs) {
            return Err(RtspError::BadNonce { stale: true });
        }
        if issued > now_secs.saturating_add(NONCE_FUTURE_SLACK_SECS) {
            return Err(RtspError::BadNonce { stale: false });
        }
        Ok(&user.username)
    }

    /// `qop=auth` with `nc` (8 hex digits) and `cnonce`, or no qop at all
    /// (RFC 2069 clients).
    fn client_qop<'p>(
        &self,
        params: &'p AuthParams<'_>,
        cnonce: &'p str,
    ) -> Result<Option<QopAnswer<'p>>, RtspError> {
        let Some(qop) = params.get("qop") else {
            return Ok(None);
        };
        if !qop.eq_ignore_ascii_case("auth") {
            return Err(RtspError::UnsupportedQop);
        }
        let nc = params
            .get("nc")
            .map(|c| c.as_ref())
            .filter(|n| n.len() == 8 && n.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or(RtspError::MissingAuthParam {
                what: "Digest credentials",
                param: "nc",
            })?;
        if cnonce.is_empty() {
            return Err(RtspError::MissingAuthParam {
                what: "Digest credentials",
                param: "cnonce",
            });
        }
        Ok(Some(QopAnswer { nc, cnonce }))
    }

    fn make_nonce(&self, now_secs: u64, random: [u8; NONCE_RANDOM]) -> String {
        let mut raw = Vec::with_capacity(NONCE_TS + NONCE_RANDOM + NONCE_TAG);
        raw.extend_from_slice(&now_secs.to_be_bytes());
        raw.extend_from_slice(&random);
        let tag = hmac_sha256(&self.secret, &raw);
        raw.extend_from_slice(tag.get(..NONCE_TAG).unwrap_or_default());
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
    }

    /// The issue time of a nonce we signed, or `BadNonce`.
    fn check_nonce(&self, nonce: &str) -> Result<u64, RtspError> {
        let bad = RtspError::BadNonce { stale: false };
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(nonce)
            .map_err(|_| bad.clone())?;
        if raw.len() != NONCE_TS + NONCE_RANDOM + NONCE_TAG {
            return Err(bad);
        }
        let (signed, tag) = raw.split_at(NONCE_TS + NONCE_RANDOM);
        let expected = hmac_sha256(&self.secret, signed);
        if !constant_time_eq(expected.get(..NONCE_TAG).unwrap_or_default(), tag) {
            return Err(bad);
        }
        let ts: [u8; NONCE_TS] = signed
            .get(..NONCE_TS)
            .and_then(|b| b.try_into().ok())
            .ok_or(bad)?;
        Ok(u64::from_be_bytes(ts))
    }
}

/// HMAC-SHA-256 (RFC 2104); the key is shorter than the block.
fn hmac_sha256(key: &[u8; 32], message: &[u8]) -> Vec<u8> {
    const BLOCK: usize = 64;
    let mut padded = [0u8; BLOCK];
    for (p, k) in padded.iter_mut().zip(key) {
        *p = *k;
    }
    let pad = |byte: u8| padded.map(|k| k ^ byte);
    let mut inner = Sha256::new();
    inner.update(pad(0x36));
    inner.update(message);
    let mut outer = Sha256::new();
    outer.update(pad(0x5c));
    outer.update(inner.finalize());
    outer.finalize().to_vec()
}

/// Compares without an early exit, so timing does not reveal the prefix.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `name=value` pairs of one challenge or credentials, names lower-cased.
struct AuthParams<'a> {
    pairs: Vec<(String, Cow<'a, str>)>,
}

impl<'a> AuthParams<'a> {
    fn get(&self, name: &str) -> Option<&Cow<'a, str>> {
        self.pairs.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    fn required(&self, param: &'static str, what: &'static str) -> Result<Cow<'a, str>, RtspError> {
        self.get(param)
            .cloned()
            .ok_or(RtspError::MissingAuthParam { what, param })
    }
}

/// A cursor over an auth header value (RFC 7235 §2.1 grammar).
struct Lexer<'a> {
    s: &'a str,
    pos: usize,
}

impl<'a> Lexer<'a> {
    fn new(s: &'a str) -> Self {
        Lexer { s, pos: 0 }
    }

    fn rest(&self) -> &'a str {
        self.s.get(self.pos..).unwrap_or_default()
    }

    fn at_end(&self) -> bool {
        self.rest().is_empty()
    }

    fn skip_ws(&mut self) {
        let rest = self.rest();
        self.pos += rest.len() - rest.trim_start_matches([' ', '\t']).len();
    }

    fn skip_ws_and_commas(&mut self) {
        let rest = self.rest();
        self.pos += rest.len() - rest.trim_start_matches([' ', '\t', ',']).len();
    }

    fn eat(&mut self, c: char) -> bool {
        if self.rest().starts_with(c) {
            self.pos += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn token(&mut self) -> Option<&'a str> {
        let rest = self.rest();
        let len = rest
            .bytes()
            .take_while(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(b))
            .count();
        let token = rest.get(..len).filter(|t| !t.is_empty())?;
        self.pos += len;
        Some(token)
    }

    /// Skips a `token68` credential (e.g. `Negotiate abc==`) so the next
    /// challenge still parses; vgate never answers those schemes.
    fn skip_token68(&mut self) {
        let save = self.pos;
        self.skip_ws();
        let rest = self.rest();
        let len = rest
            .bytes()
            .take_while(|b| b.is_ascii_alphanumeric() || b"-._~+/".contains(b))
            .count();
        let after = rest.get(len..).unwrap_or_default();
        let eq = after.len() - after.trim_start_matches('=').len();
        let tail = after.get(eq..).unwrap_or_default().trim_start();
        if len > 0 && eq > 0 && (tail.is_empty() || tail.starts_with(',')) {
            self.pos += len + eq;
        } else {
            self.pos = save;
        }
    }

    fn quoted(&mut self) -> Result<Cow<'a, str>, RtspError> {
        let rest = self.rest();
        let body = rest.strip_prefix('"').ok_or(RtspError::UnterminatedQuote)?;
        let mut escaped = false;
        let mut has_escape = false;
        for (i, c) in body.char_indices() {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => {
                    escaped = true;
                    has_escape = true;
                }
                (false, '"') => {
                    self.pos += 1 + i + 1;
                    let inner = body.get(..i).unwrap_or_default();
                    return Ok(if has_escape {
                        Cow::Owned(unescape(inner))
                    } else {
                        Cow::Borrowed(inner)
                    });
                }
                _ => {}
            }
        }
        Err(RtspError::UnterminatedQuote)
    }

    fn value(&mut self, what: &'static str) -> Result<Cow<'a, str>, RtspError> {
        if self.rest().starts_with('"') {
            return self.quoted().map_err(|_| RtspError::BadAuthHeader { what });
        }
        let rest = self.rest();
        let len = rest
            .bytes()
            .take_while(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~/=:".contains(b))
            .count();
        self.pos += len;
        Ok(Cow::Borrowed(rest.get(..len).unwrap_or_default()))
    }

    /// `name=value` pairs until something that is not one (the next
    /// challenge's scheme, or the end).
    fn auth_params(&mut self, what: &'static str) -> Result<AuthParams<'a>, RtspError> {
        let mut pairs: Vec<(String, Cow<'a, str>)> = Vec::new();
        loop {
            self.skip_ws_and_commas();
            let start = self.pos;
            let Some(name) = self.token() else { break };
            self.skip_ws();
            if !self.eat('=') {
                self.pos = start;
                break;
            }
            self.skip_ws();
            let value = self.value(what)?;
            let name = name.to_ascii_lowercase();
            if pairs.len() >= MAX_AUTH_PARAMS || pairs.iter().any(|(n, _)| *n == name) {
                return Err(RtspError::BadAuthHeader { what });
            }
            pairs.push((name, value));
            self.skip_ws();
            if !self.rest().starts_with(',') {
                break;
            }
        }
        let rest = self.rest().trim_start_matches([' ', '\t', ',']);
        if !rest.is_empty() && !rest.starts_with(|c: char| c.is_ascii_alphabetic()) {
            return Err(RtspError::BadAuthHeader { what });
        }
        Ok(AuthParams { pairs })
    }
}

fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut escaped = false;
    for c in s.chars() {
        if escaped || c != '\\' {
            out.push(c);
            escaped = false;
        } else {
            escaped = true;
        }
    }
    out
}

#[cfg(test)]
mod tests;
