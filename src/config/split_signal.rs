//! `[split.signal]`: the signaling link as written ([`SignalLinkConfig`]) and checked
//! ([`SignalLink`]).
//!
//! ```toml
//! [split.signal]
//! interface = "sig0"            # the signaling link's interface (signaling sockets are tied to it)
//! local = "10.99.0.1:7070"      # half b listens here; half a connects from this address (any port)
//! peer = "10.99.0.2:7070"       # half a connects here; half b accepts only this address
//! key = "…64 or more hex digits…"   # or key_file = "/etc/vgate/split.key" (same format)
//! heartbeat_ms = 500            # default 500
//! dead_after_ms = 3000          # default 3000; at least 3 heartbeats
//! ```

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::check::Invalid;

/// The shared key's smallest length in bytes.
pub const MIN_KEY_BYTES: usize = 32;

/// `[split.signal]` as written. Addresses stay strings so that a bad one is reported with its
/// place in the file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignalLinkConfig {
    pub interface: Spanned<String>,
    pub local: Spanned<String>,
    pub peer: Spanned<String>,
    /// The shared key in hex (at least 32 bytes = 64 hex digits); or `key_file`.
    pub key: Option<Spanned<SecretHex>>,
    /// A file holding the key in hex (absolute path; whitespace around it ignored).
    pub key_file: Option<Spanned<String>>,
    #[serde(default = "default_heartbeat")]
    pub heartbeat_ms: Spanned<i64>,
    #[serde(default = "default_dead_after")]
    pub dead_after_ms: Spanned<i64>,
}

fn default_heartbeat() -> Spanned<i64> {
    Spanned::new(0..0, 500)
}
fn default_dead_after() -> Spanned<i64> {
    Spanned::new(0..0, 3000)
}

/// A key as written; `Debug` never shows it.
#[derive(Deserialize, Clone, PartialEq, Eq)]
#[serde(transparent)]
pub struct SecretHex(pub String);

impl std::fmt::Debug for SecretHex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("\"***\"")
    }
}

/// The shared key, decoded. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct SignalKey(Vec<u8>);

impl SignalKey {
    pub fn new(bytes: Vec<u8>) -> SignalKey {
        SignalKey(bytes)
    }

    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for SignalKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<{} key bytes>", self.0.len())
    }
}

/// The checked signaling link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignalLink {
    pub interface: String,
    pub local: SocketAddrV4,
    pub peer: SocketAddrV4,
    pub key: SignalKey,
    pub heartbeat: Duration,
    pub dead_after: Duration,
}

fn invalid<T>(at: &Spanned<T>, key: &str, message: impl Into<String>) -> Invalid {
    super::check::invalid(at, format!("split.signal.{key}"), message)
}

/// Decodes a hex key; the error says what is wrong with it.
pub fn decode_key(hex: &str) -> Result<Vec<u8>, String> {
    let hex = hex.trim();
    if !hex.len().is_multiple_of(2) || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err("the key must be hex digits only (an even number of them); make one with `openssl rand -hex 32`".into());
    }
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .filter_map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok())
        .collect();
    if bytes.len() < MIN_KEY_BYTES {
        return Err(format!(
            "the key is {} bytes; use at least {MIN_KEY_BYTES} random bytes (64 hex digits), e.g. `openssl rand -hex 32`, the same on both halves",
            bytes.len()
        ));
    }
    if bytes.iter().all(|b| *b == bytes[0]) {
        return Err(
            "the key is one byte repeated; use random bytes, e.g. `openssl rand -hex 32`".into(),
        );
    }
    Ok(bytes)
}

fn addr(at: &Spanned<String>, key: &str) -> Result<SocketAddrV4, Invalid> {
    let a: SocketAddrV4 = at.get_ref().parse().map_err(|_| {
        invalid(
            at,
            key,
            "expected an IPv4 address and port on the signaling link, such as \"10.99.0.1:7070\"",
        )
    })?;
    if a.port() == 0 || a.ip().is_unspecified() || a.ip().is_multicast() || a.ip().is_broadcast() {
        return Err(invalid(
            at,
            key,
            "use a unicast address and a port other than 0",
        ));
    }
    Ok(a)
}

impl SignalLinkConfig {
    /// Checks the section by itself; `domains` are the half's two domains' gateway addresses and
    /// networks, which the signaling link must not share.
    pub fn check(
        &self,
        domains: &[(Ipv4Addr, Vec<ipnet::Ipv4Net>)],
    ) -> Result<SignalLink, Invalid> {
        let interface = self.interface.get_ref().clone();
        if interface.is_empty() || interface.len() > 15 {
            return Err(invalid(
                &self.interface,
                "interface",
                "name the signaling link's network interface (at most 15 characters), e.g. \"sig0\"",
            ));
        }
        let local = addr(&self.local, "local")?;
        let peer = addr(&self.peer, "peer")?;
        if local.ip() == peer.ip() {
            return Err(invalid(
                &self.peer,
                "peer",
                "the peer is the other half: give it its own address on the signaling link",
            ));
        }
        for (at, key, ip) in [
            (&self.local, "local", local.ip()),
            (&self.peer, "peer", peer.ip()),
        ] {
            for (gw, nets) in domains {
                if ip == gw || nets.iter().any(|n| n.contains(ip)) {
                    return Err(invalid(
                        at,
                        key,
                        format!("{ip} is in one of the domains; the signaling link must be a network of its own, reachable from no domain"),
                    ));
                }
            }
        }
        let key = match (&self.key, &self.key_file) {
            (Some(k), None) => decode_key(&k.get_ref().0).map_err(|m| invalid(k, "key", m))?,
            (None, Some(f)) => {
                let path = std::path::Path::new(f.get_ref());
                if !path.is_absolute() {
                    return Err(invalid(f, "key_file", "give an absolute path"));
                }
                let text = std::fs::read_to_string(path).map_err(|e| {
                    invalid(f, "key_file", format!("cannot read {}: {e}", path.display()))
                })?;
                decode_key(&text).map_err(|m| invalid(f, "key_file", m))?
            }
            (Some(k), Some(_)) => {
                return Err(invalid(k, "key", "give either key or key_file, not both"))
            }
            (None, None) => {
                return Err(invalid(
                    &self.interface,
                    "key",
                    "the halves authenticate each other with a shared key: add key = \"<64 hex digits>\" (or key_file), the same on both halves",
                ))
            }
        };
        let hb = *self.heartbeat_ms.get_ref();
        if !(50..=60_000).contains(&hb) {
            return Err(invalid(
                &self.heartbeat_ms,
                "heartbeat_ms",
                "use 50 to 60000 milliseconds",
            ));
        }
        let dead = *self.dead_after_ms.get_ref();
        if dead < 3 * hb || dead > 600_000 {
            return Err(invalid(
                &self.dead_after_ms,
                "dead_after_ms",
                format!(
                    "use at least three heartbeats ({} ms) and at most 600000",
                    3 * hb
                ),
            ));
        }
        Ok(SignalLink {
            interface,
            local,
            peer,
            key: SignalKey(key),
            heartbeat: Duration::from_millis(hb as u64),
            dead_after: Duration::from_millis(dead as u64),
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::config::parse_for;

    const HALF_A: &str = include_str!("../../systemd/vgate-half-a.toml");
    const KEY: &str = "key = \"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\"";

    fn check(text: &str) -> Result<crate::config::Config, String> {
        parse_for(text, "h.toml", 2).map_err(|e| e.to_string())
    }

    #[test]
    fn the_key_is_decoded_and_bad_keys_are_refused_with_their_place() {
        let cfg = check(HALF_A).unwrap();
        let link = &cfg.split.unwrap().signal;
        assert_eq!(link.key.expose().len(), 32);
        assert_eq!(
            format!("{:?}", link.key),
            "<32 key bytes>",
            "Debug hides the key"
        );
        assert!(HALF_A.contains(KEY));
        for (to, want) in [
            ("key = \"0011\"", "the key is 2 bytes"),
            (&format!("key = \"{}\"", "zz".repeat(32)), "hex digits only"),
            (
                &format!("key = \"{}\"", "ab".repeat(32)),
                "one byte repeated",
            ),
            ("key_file = \"relative.key\"", "absolute path"),
            (
                "key_file = \"/nonexistent/vgate.key\"",
                "cannot read /nonexistent/vgate.key",
            ),
            ("", "shared key"),
            (
                &format!("{KEY}\nkey_file = \"/x\""),
                "either key or key_file",
            ),
            (&format!("{KEY}\nsecret = 1"), "unknown field"),
        ] {
            let e = check(&HALF_A.replace(KEY, to)).unwrap_err();
            assert!(e.contains(want), "{to:?}: {e}");
            assert!(e.starts_with("h.toml:"), "{to:?}: {e}");
        }
        let e = check(&HALF_A.replace("heartbeat_ms = 500", "heartbeat_ms = 5")).unwrap_err();
        assert!(e.contains("split.signal.heartbeat_ms"), "{e}");
        let e = check(&HALF_A.replace("dead_after_ms = 3000", "dead_after_ms = 1000")).unwrap_err();
        assert!(
            e.contains("split.signal.dead_after_ms: use at least three heartbeats"),
            "{e}"
        );
    }

    #[test]
    fn a_key_file_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("split.key");
        std::fs::write(&path, format!("  {}\n", "0123456789abcdef".repeat(4))).unwrap();
        let text = HALF_A.replace(KEY, &format!("key_file = \"{}\"", path.display()));
        let cfg = check(&text).unwrap();
        assert_eq!(cfg.split.unwrap().signal.key.expose()[..2], [0x01, 0x23]);
    }
}
