//! The config file as written: serde types that reject unknown keys and keep the byte span of
//! every value that validation may complain about. Addresses and ranges stay strings here so
//! that a bad one is reported by `validate` with its place and a sentence, not by serde.

use serde::Deserialize;
use toml::Spanned;

use super::{MediaMode, Mode, SignalingKind, SourcePolicy, TnapiRing, Transport};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    pub domains: RawDomains,
    #[serde(default)]
    pub engine: RawEngine,
    #[serde(default)]
    pub security: RawSecurity,
    #[serde(default)]
    pub control: RawControl,
    #[serde(default)]
    pub signaling_route: Vec<RawSignalingRoute>,
    #[serde(default)]
    pub stream_route: Vec<RawStreamRoute>,
    /// Media validation defaults (absent: `validate = "count"`, the default policy).
    #[serde(default)]
    pub media: RawMedia,
    /// This process is one half of a split appliance (absent: the single-host gateway).
    pub split: Option<RawSplit>,
    /// This gateway is one node of a hot-standby pair (absent: always active).
    pub ha: Option<crate::config::ha::RawHa>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSplit {
    pub half: Spanned<String>,
    pub peer_face: Spanned<String>,
    pub out_link: RawLink,
    pub in_link: RawLink,
    pub signal: crate::config::split_signal::SignalLinkConfig,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLink {
    pub interface: Spanned<String>,
    pub local: Spanned<String>,
    pub peer: Spanned<String>,
    /// Outgoing link only.
    pub peer_mac: Option<Spanned<String>>,
    #[serde(default = "default_fec")]
    pub fec: Spanned<String>,
    /// `fec = "block"` only: repair frames per 100 data frames, data frames per block, the
    /// longest a block stays open (ms).
    pub fec_overhead: Option<Spanned<i64>>,
    pub fec_block_frames: Option<Spanned<i64>>,
    pub fec_block_ms: Option<Spanned<i64>>,
    /// Incoming link only: the CPU of its receive worker.
    pub cpu: Option<Spanned<i64>>,
    /// Incoming link only: the reorder window's longest wait, milliseconds (0: off).
    pub reorder_ms: Option<Spanned<i64>>,
    /// Outgoing link only: the longest datagram sent down the link (cut into frames).
    pub max_datagram: Option<Spanned<i64>>,
    /// The link's frame key in hex, or a file holding it (as `split.signal`'s); absent:
    /// frames are not authenticated (a warning).
    pub key: Option<Spanned<super::split_signal::SecretHex>>,
    pub key_file: Option<Spanned<String>>,
}

fn default_fec() -> Spanned<String> {
    Spanned::new(0..0, "off".to_string())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDomains {
    pub a: RawDomain,
    pub b: RawDomain,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDomain {
    pub interface: Spanned<String>,
    pub address: Spanned<String>,
    #[serde(default)]
    pub networks: Vec<Spanned<String>>,
    pub media_ports: Spanned<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEngine {
    #[serde(default = "default_mode")]
    pub mode: Spanned<Mode>,
    #[serde(default = "default_queues")]
    pub queues: Spanned<i64>,
    pub cpus: Option<Spanned<Vec<i64>>>,
    #[serde(default = "default_batch")]
    pub batch: Spanned<i64>,
    #[serde(default = "default_max_payload")]
    pub max_payload: Spanned<i64>,
    #[serde(default)]
    pub tnapi: RawTnapi,
    /// Ring modes: add the media ranges to `net.ipv4.ip_local_reserved_ports` at start.
    #[serde(default)]
    pub reserve_ports: bool,
}

/// `[engine.tnapi]`: settings of mode tnapi.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTnapi {
    pub ring: Option<Spanned<TnapiRing>>,
}

impl Default for RawEngine {
    fn default() -> Self {
        RawEngine {
            mode: default_mode(),
            queues: default_queues(),
            cpus: None,
            batch: default_batch(),
            max_payload: default_max_payload(),
            tnapi: RawTnapi::default(),
            reserve_ports: false,
        }
    }
}

fn default_mode() -> Spanned<Mode> {
    Spanned::new(0..0, Mode::Stack)
}
fn default_queues() -> Spanned<i64> {
    Spanned::new(0..0, 1)
}
fn default_batch() -> Spanned<i64> {
    Spanned::new(0..0, 32)
}
fn default_max_payload() -> Spanned<i64> {
    // 1500-byte MTU minus IPv4 and UDP headers.
    Spanned::new(0..0, 1472)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSecurity {
    #[serde(default = "default_policy")]
    pub source_validation: SourcePolicy,
    #[serde(default)]
    pub rtp_only: bool,
    /// Under `latch`: milliseconds the latched source must be silent before another may
    /// take the route (0: never).
    pub relatch_after_ms: Option<Spanned<i64>>,
}

impl Default for RawSecurity {
    fn default() -> Self {
        RawSecurity {
            source_validation: default_policy(),
            rtp_only: false,
            relatch_after_ms: None,
        }
    }
}

fn default_policy() -> SourcePolicy {
    SourcePolicy::Strict
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawControl {
    #[serde(default = "default_control_listen")]
    pub listen: Spanned<String>,
    /// Bearer token the admin interface requires (mandatory off loopback).
    pub token: Option<Spanned<String>>,
    /// Export per-route metrics (one series per stream: many streams, many series).
    #[serde(default)]
    pub per_stream_metrics: bool,
}

impl Default for RawControl {
    fn default() -> Self {
        RawControl {
            listen: default_control_listen(),
            token: None,
            per_stream_metrics: false,
        }
    }
}

fn default_control_listen() -> Spanned<String> {
    Spanned::new(0..0, "127.0.0.1:9940".to_string())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSignalingRoute {
    pub name: Spanned<String>,
    #[serde(rename = "type")]
    pub kind: SignalingKind,
    pub transport: Transport,
    pub listen_domain: Spanned<String>,
    pub listen_port: Spanned<i64>,
    pub upstream: Spanned<String>,
    // ---- SIP routes (see `SignalingPolicy`); `media_timeout` below is shared ----
    /// Peers allowed on the listen side (CIDR); empty: anyone in the listen domain.
    #[serde(default)]
    pub allow_peers: Vec<Spanned<String>>,
    /// GB/T 28181 ID prefixes allowed in From and To; empty: any.
    #[serde(default)]
    pub allow_ids: Vec<Spanned<String>>,
    /// Largest SIP message in bytes (UDP datagram; TCP too unless `max_tcp_message` is set).
    pub max_message: Option<Spanned<i64>>,
    /// Largest SIP message over TCP in bytes (SIP `transport = "tcp"` routes).
    pub max_tcp_message: Option<Spanned<i64>>,
    /// Seconds an INVITE may wait for its final response.
    pub invite_timeout: Option<Spanned<i64>>,
    /// Seconds a call keeps a passive TCP media leg whose peer closed, for its reconnect.
    pub tcp_media_reconnect: Option<Spanned<i64>>,
    /// Requests per second per source address; 0: no limit.
    pub rate_limit: Option<Spanned<i64>>,
    pub max_connections_per_source: Option<Spanned<i64>>,
    /// Port of the gateway's socket on the upstream side (SIP); default: `listen_port`.
    pub upstream_port: Option<Spanned<i64>>,
    /// Contacts (bindings) one source address may hold at a time (SIP).
    pub max_bindings_per_source: Option<Spanned<i64>>,
    /// What MANSCDP bodies' address fields become as they cross: "gateway", "blank", "keep".
    pub manscdp_addresses: Option<Spanned<String>>,
    /// MANSCDP commands (CmdType or control command) allowed in requests from the listen
    /// side; empty: all but `manscdp_deny`.
    #[serde(default)]
    pub manscdp_allow: Vec<Spanned<String>>,
    /// MANSCDP commands refused (403) in requests from the listen side.
    #[serde(default)]
    pub manscdp_deny: Vec<Spanned<String>>,
    /// MANSCDP commands refused (403) in requests arriving from domain B (the user
    /// network); absent: the destructive ones (`DeviceUpgrade`, `FormatSDCard`).
    pub manscdp_deny_from_b: Option<Spanned<Vec<Spanned<String>>>>,
    /// Seconds without media before a call or session is ended; 0 turns it off.
    /// Shared by SIP and RTSP routes.
    pub media_timeout: Option<Spanned<i64>>,
    /// Log every message crossing, both faces, at debug level (target `vgate::trace`).
    #[serde(default)]
    pub trace: bool,
    /// Media validation of this route's sessions; default `media.validate`.
    pub media_validate: Option<Spanned<MediaMode>>,
    // ---- RTSP routes only (refused on other kinds) ----
    /// Path-prefix upstreams; without any, every path goes to `upstream`.
    #[serde(default)]
    pub paths: Vec<RawRtspPath>,
    /// Credentials vgate answers the upstream's 401 with.
    pub upstream_username: Option<Spanned<String>>,
    pub upstream_password: Option<Spanned<RawSecret>>,
    /// Clients must authenticate to vgate (Digest) with one of these.
    #[serde(default)]
    pub client_users: Vec<RawUser>,
    pub client_realm: Option<Spanned<String>>,
    /// Seconds without a request before an RTSP session is ended (when the server names none).
    pub session_timeout: Option<Spanned<i64>>,
    /// Seconds a client may take to send one whole request (slow-loris guard).
    pub request_timeout: Option<Spanned<i64>>,
    /// Connections holding a media session one source may have at a time (RTSP).
    pub max_sessions_per_source: Option<Spanned<i64>>,
    // (An RTSP route's media timeout is the shared `media_timeout` key.)
}

/// A password as written in the file; `Debug` never shows it.
#[derive(Deserialize, Clone, PartialEq, Eq)]
#[serde(transparent)]
pub struct RawSecret(pub String);

impl std::fmt::Debug for RawSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("\"***\"")
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRtspPath {
    pub prefix: Spanned<String>,
    /// Default: the route's `upstream`.
    pub upstream: Option<Spanned<String>>,
    /// Default: `/` (the prefix is stripped).
    pub upstream_path: Option<Spanned<String>>,
    pub upstream_username: Option<Spanned<String>>,
    pub upstream_password: Option<Spanned<RawSecret>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUser {
    pub username: Spanned<String>,
    pub password: Spanned<RawSecret>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStreamRoute {
    pub name: Spanned<String>,
    pub domain: Spanned<String>,
    pub port: Spanned<i64>,
    pub destination: Spanned<String>,
    pub egress_port: Option<Spanned<i64>>,
    pub expect_source: Option<Spanned<String>>,
    pub source_validation: Option<Spanned<SourcePolicy>>,
    pub rtp_only: Option<bool>,
    /// What the route carries, for media validation (absent: not validated).
    pub media: Option<Spanned<RawStreamMedia>>,
}

/// `[media]`. The policy keys (`allow_*`, `sei_*`) are a static route's `media` keys too.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMedia {
    pub validate: Option<Spanned<MediaMode>>,
    pub allow_extension: Option<bool>,
    pub allow_padding: Option<bool>,
    pub allow_unknown_codec: Option<bool>,
    pub allow_filler: Option<bool>,
    pub sei_user_data_max: Option<Spanned<i64>>,
    pub sei_user_data_per_s: Option<Spanned<i64>>,
}

/// A static route's `media = { ... }`: what it carries, and its own policy keys (absent:
/// `[media]`'s).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStreamMedia {
    /// Default: `media.validate`.
    pub validate: Option<Spanned<MediaMode>>,
    pub codec: Option<Spanned<String>>,
    #[serde(default)]
    pub payload_types: Vec<Spanned<i64>>,
    pub clock_rate: Option<Spanned<i64>>,
    /// The SSRC every packet must carry (GB/T 28181 `y=`); absent: learnt.
    pub ssrc: Option<Spanned<i64>>,
    pub allow_extension: Option<bool>,
    pub allow_padding: Option<bool>,
    pub allow_unknown_codec: Option<bool>,
    pub allow_filler: Option<bool>,
    pub sei_user_data_max: Option<Spanned<i64>>,
    pub sei_user_data_per_s: Option<Spanned<i64>>,
}
