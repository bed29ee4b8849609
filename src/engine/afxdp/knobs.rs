//! The engine's knobs: how forwarded packets leave ([`TxPath`]), the checksum offload and
//! the environment overrides, each refused value said once.

use super::*;

/// How forwarded packets leave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxPath {
    /// Gateway-port UDP sockets, `sendmmsg`.
    Sockets,
    /// AF_XDP TX on the egress interface, headers built by vgate.
    Xdp,
}

impl TxPath {
    /// `VGATE_AFXDP_TX=xdp|sockets`; the default, `xdp`, was the faster on the bed (see
    /// the module doc).
    pub fn from_env() -> TxPath {
        match std::env::var("VGATE_AFXDP_TX").as_deref() {
            Ok("sockets") => TxPath::Sockets,
            Ok("xdp") | Err(_) => TxPath::Xdp,
            Ok(v) => {
                knob_ignored("VGATE_AFXDP_TX", v, "xdp|sockets; xdp used");
                TxPath::Xdp
            }
        }
    }
}

/// `VGATE_AFXDP_TX_CSUM=software|offload`: who fills the UDP checksum of AF_XDP TX frames.
/// `offload` (default) asks the kernel for TX metadata where it is known to be honoured
/// ([`csum_offload_verdict`]) and, where it is granted (copy-mode sockets), leaves the
/// checksum to the egress device; `software` always sums in vgate (for A/B runs).
pub fn csum_offload_from_env() -> bool {
    match std::env::var("VGATE_AFXDP_TX_CSUM").as_deref() {
        Ok("software") => false,
        Ok("offload") | Err(_) => true,
        Ok(v) => {
            knob_ignored("VGATE_AFXDP_TX_CSUM", v, "software|offload; offload used");
            true
        }
    }
}

/// Warns, once per knob per process, that an environment knob's value was not understood
/// and what is used instead (startup only).
pub(super) fn knob_ignored(name: &'static str, value: &str, instead: &str) {
    static WARNED: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut w = WARNED.lock().unwrap_or_else(|e| e.into_inner());
    if !w.contains(&name) {
        w.push(name);
        tracing::warn!("{name}={value:?} not understood (expected {instead})");
    }
}

/// A numeric knob: its value clamped to `lo..=hi`, or `default` when unset; a value that is
/// not a number, or out of range, is warned about once.
pub(super) fn numeric_knob(name: &'static str, default: u32, lo: u32, hi: u32) -> u32 {
    let Ok(v) = std::env::var(name) else {
        return default;
    };
    match v.trim().parse::<u32>() {
        Ok(n) if (lo..=hi).contains(&n) => n,
        Ok(n) => {
            let c = n.clamp(lo, hi);
            knob_ignored(name, &v, &format!("{lo}–{hi}; {c} used"));
            c
        }
        Err(_) => {
            knob_ignored(name, &v, &format!("a number {lo}–{hi}; {default} used"));
            default
        }
    }
}

/// Whether the kernel's copy-mode transmit can be trusted to fill the UDP checksum from TX
/// metadata on an interface with `driver`, under kernel `release` (`uname -r`); `Err` says
/// why not (the socket then sums in software).
///
/// Copy mode honours TX metadata from Linux 6.11, but before 6.18 only for drivers without
/// `IFF_TX_SKB_NO_LINEAR`: for those (virtio_net) the skb is built by
/// `xsk_build_skb_zerocopy`, which ignored the metadata (fixed by upstream 30c3055f, "xsk: wrap
/// generic metadata handling onto separate function") while the kernel still granted
/// `XDP_UMEM_TX_METADATA_LEN` — every datagram would leave with only the pseudo-header sum.
/// The flag is not visible from user space, so on 6.11–6.17 only veth (known not to set it)
/// is trusted.
pub(crate) fn csum_offload_verdict(
    release: Option<&str>,
    driver: Option<&str>,
) -> Result<(), String> {
    let Some((major, minor)) = release.and_then(kernel_version) else {
        return Err("the kernel version is unknown".into());
    };
    let v = (major, minor);
    if v >= (6, 18) {
        return Ok(());
    }
    if v < (6, 11) {
        return Err(format!(
            "Linux {major}.{minor}: copy-mode AF_XDP honours TX metadata from 6.11"
        ));
    }
    match driver {
        Some("veth") => Ok(()),
        d => Err(format!(
            "Linux {major}.{minor} with driver {}: before 6.18 copy mode ignores TX metadata on drivers with IFF_TX_SKB_NO_LINEAR (virtio_net); only veth is trusted",
            d.unwrap_or("unknown")
        )),
    }
}

/// `6.18.4-arch1` → (6, 18).
pub(super) fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}
