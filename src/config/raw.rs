//! The config file as written: serde types that reject unknown keys and keep the byte span of
//! every value that validation may complain about. Addresses and ranges stay strings here so
//! that a bad one is reported by `validate` with its place and a sentence, not by serde.

use serde::Deserialize;
use toml::Spanned;

use super::{Mode, SignalingKind, SourcePolicy, Transport};

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
}

impl Default for RawEngine {
    fn default() -> Self {
        RawEngine {
            mode: default_mode(),
            queues: default_queues(),
            cpus: None,
            batch: default_batch(),
            max_payload: default_max_payload(),
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
}

impl Default for RawSecurity {
    fn default() -> Self {
        RawSecurity {
            source_validation: default_policy(),
            rtp_only: false,
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
}

impl Default for RawControl {
    fn default() -> Self {
        RawControl {
            listen: default_control_listen(),
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
}
