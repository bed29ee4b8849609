//! `[ha]`: this gateway is one node of a hot-standby pair (keepalived moves the domain
//! addresses, Redis holds the state; see docs/ha.md and [`crate::config::Config::ha`]).
//! Absent, the gateway is always active, as it always was.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;
use toml::Spanned;

use super::check::{invalid, Invalid};
use super::Mode;

/// `[ha]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHa {
    /// This node's name in the state store and the listings.
    pub node: Option<Spanned<String>>,
    /// A file whose content (`MASTER`, `BACKUP`, `FAULT`) is this node's role, written by
    /// keepalived's notify script; watched. Without it the role comes only from
    /// `vgate ha-notify` (the admin interface).
    pub role_file: Option<Spanned<String>>,
    /// The Redis server holding the pair's state, `host:port`.
    pub redis: Option<Spanned<String>>,
    /// Prefix of every key vgate writes (one per pair when pairs share a Redis).
    pub key_prefix: Option<Spanned<String>>,
    /// How long a standby may go without reading the state store before it calls itself
    /// stale (and `vgate health` fails on it), milliseconds.
    pub stale_after_ms: Option<Spanned<i64>>,
    /// After a takeover, a copied SIP/RTSP session (no dialog here) whose routes carried
    /// nothing for this long is ended, milliseconds.
    pub replica_idle_ms: Option<Spanned<i64>>,
    /// Whether a standby whose copy of the state is stale may take over all the same (its
    /// stale state then only warns in `vgate health`). Default false: it refuses, says why
    /// and waits for the state store (or `vgate ha-notify --force`).
    pub takeover_when_stale: Option<bool>,
    /// The fencing lease in Redis: how long it lasts without renewal, milliseconds (the
    /// active renews it every 100 ms; a MASTER that cannot hold it forwards nothing).
    pub lease_ms: Option<Spanned<i64>>,
    /// What the active does when it cannot reach Redis to renew its lease:
    /// `"keep-forwarding"` (default) or `"stop-after-lease"`.
    pub store_loss: Option<Spanned<String>>,
}

/// The checked `[ha]`.
#[derive(Clone, Debug, PartialEq)]
pub struct HaConfig {
    pub node: String,
    pub role_file: Option<PathBuf>,
    pub redis: Option<SocketAddr>,
    pub key_prefix: String,
    pub stale_after_ms: u64,
    pub replica_idle_ms: u64,
    pub takeover_when_stale: bool,
    pub lease_ms: u64,
    pub store_loss: StoreLoss,
}

/// `ha.store_loss`: the lease holder that cannot reach the state store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreLoss {
    /// Forwards on for as long as keepalived keeps it MASTER (a Redis outage alone never
    /// stops a stream; a peer that reaches Redis and takes over meanwhile makes two
    /// forwarders until this node reaches Redis again).
    KeepForwarding,
    /// Stops forwarding once `ha.lease_ms` went by (its own clock) since its last renewal:
    /// never two forwarders for longer than that, but a Redis outage stops every stream.
    StopAfterLease,
}

impl StoreLoss {
    pub fn name(self) -> &'static str {
        match self {
            StoreLoss::KeepForwarding => "keep-forwarding",
            StoreLoss::StopAfterLease => "stop-after-lease",
        }
    }
}

pub const DEFAULT_STALE_AFTER_MS: u64 = 3000;
pub const DEFAULT_REPLICA_IDLE_MS: u64 = 60_000;
pub const DEFAULT_LEASE_MS: u64 = 1000;

fn ms(
    v: &Option<Spanned<i64>>,
    key: &str,
    default: u64,
    range: (i64, i64),
) -> Result<u64, Invalid> {
    match v {
        None => Ok(default),
        Some(v) if (range.0..=range.1).contains(v.get_ref()) => Ok(*v.get_ref() as u64),
        Some(v) => Err(invalid(
            v,
            key,
            format!(
                "expected {} to {} milliseconds; the default is {default}",
                range.0, range.1
            ),
        )),
    }
}

fn name_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Checks `[ha]` against the engine mode.
pub fn ha(raw: &RawHa, mode: Mode, mode_at: &Spanned<Mode>) -> Result<HaConfig, Invalid> {
    if mode == Mode::Xdp {
        return Err(invalid(
            mode_at,
            "engine.mode",
            "a hot-standby node ([ha]) cannot use mode xdp yet: its in-kernel fast path does not know the standby role; use mode zc, tnapi or stack",
        ));
    }
    let node = match &raw.node {
        None => "vgate".to_string(),
        Some(n) if name_ok(n.get_ref()) => n.get_ref().clone(),
        Some(n) => {
            return Err(invalid(
                n,
                "ha.node",
                "use 1-64 letters, digits, '-', '_' or '.' (each node of a pair its own name)",
            ))
        }
    };
    let key_prefix = match &raw.key_prefix {
        None => "vgate".to_string(),
        Some(n) if name_ok(n.get_ref()) => n.get_ref().clone(),
        Some(n) => {
            return Err(invalid(
                n,
                "ha.key_prefix",
                "use 1-64 letters, digits, '-', '_' or '.' (both nodes of a pair the same one)",
            ))
        }
    };
    let role_file = match &raw.role_file {
        None => None,
        Some(f) if f.get_ref().starts_with('/') => Some(PathBuf::from(f.get_ref())),
        Some(f) => {
            return Err(invalid(
                f,
                "ha.role_file",
                "use an absolute path such as \"/run/vgate/ha-role\" (the file keepalived's notify script writes)",
            ))
        }
    };
    let redis = match &raw.redis {
        None => None,
        Some(r) => Some(r.get_ref().parse::<SocketAddr>().map_err(|_| {
            invalid(
                r,
                "ha.redis",
                "expected the Redis server's address and port such as \"10.9.0.100:6379\"",
            )
        })?),
    };
    let store_loss = match raw.store_loss.as_ref().map(|s| (s, s.get_ref().as_str())) {
        None | Some((_, "keep-forwarding")) => StoreLoss::KeepForwarding,
        Some((_, "stop-after-lease")) => StoreLoss::StopAfterLease,
        Some((s, _)) => {
            return Err(invalid(
                s,
                "ha.store_loss",
                "expected \"keep-forwarding\" (the default: the active forwards on while Redis is unreachable) or \"stop-after-lease\" (it stops once ha.lease_ms went by without renewing its lease)",
            ))
        }
    };
    Ok(HaConfig {
        node,
        role_file,
        redis,
        key_prefix,
        stale_after_ms: ms(
            &raw.stale_after_ms,
            "ha.stale_after_ms",
            DEFAULT_STALE_AFTER_MS,
            (500, 600_000),
        )?,
        replica_idle_ms: ms(
            &raw.replica_idle_ms,
            "ha.replica_idle_ms",
            DEFAULT_REPLICA_IDLE_MS,
            (1000, 86_400_000),
        )?,
        takeover_when_stale: raw.takeover_when_stale.unwrap_or(false),
        // At least three renewals (every 100 ms) and a slow round trip per lease.
        lease_ms: ms(
            &raw.lease_ms,
            "ha.lease_ms",
            DEFAULT_LEASE_MS,
            (300, 60_000),
        )?,
        store_loss,
    })
}
