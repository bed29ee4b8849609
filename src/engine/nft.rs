//! nftables rules that keep the kernel's hands off the media the AF_PACKET rings capture.
//!
//! Owns: one table, `inet vgate_<instance>`, created and deleted through the `nft` command.
//! Must not touch: any other table — the host's own firewall stays as it is.
//!
//! A packet socket gets a *copy* of each frame; the kernel still routes the original. For
//! media addressed to the gateway that means a UDP lookup, no socket on that port, and an
//! ICMP port unreachable back to the camera (or delivery to an unrelated local socket). The
//! table drops `udp dport <lo>-<hi>` to the gateway's address arriving on the capture
//! interfaces, one rule per domain, and counts it.
//!
//! # Why the `prerouting` hook at priority −300
//!
//! The drop must not starve the rings, so it cannot be a `netdev ingress` chain: the rings
//! are bound with `ETH_P_IP`, and such sockets are served after the ingress hook. Any hook of
//! the IP layer is safe: the kernel hands an `ETH_P_IP` packet socket its own reference to
//! the frame (`ip_rcv` works on a clone when the frame is shared), so what the IP layer drops
//! the ring still gets. `prerouting` at −300 (the "raw" priority) comes before connection
//! tracking (−200), every other table's prerouting chain, the route lookup and the input
//! hook: captured media costs the kernel no conntrack entry, no
//! route lookup and no UDP lookup (which would answer with ICMP port unreachable), and no
//! other rule logs, counts, NATs or accepts it first. (Until 2026-12 the chain was on
//! `input`, which paid the route lookup and, where conntrack runs, a conntrack entry per
//! media flow.)
//!
//! # Only first fragments and whole datagrams
//!
//! Nothing reassembles IPv4 fragments before this hook when conntrack is not loaded
//! (defragmentation at −400 is conntrack's), so a non-first fragment reaches the rule as is:
//! its first payload bytes are the middle of someone's datagram, and `udp dport` would read
//! them as a port. A fragmented SIP MESSAGE (a 9 KB Catalog over UDP) lost six of seven
//! fragments that way. Each rule matches only packets with fragment offset 0, where the UDP
//! header really is there; the later fragments go on to the kernel's reassembly.
//!
//! A rule without an address (the engines always give one: an IPv4 address, so their rules
//! are IPv4 only) covers IPv6 as well, where the UDP header is present: a datagram without a
//! fragment header (`exthdr frag missing`) or a first fragment (`frag frag-off 0`); later
//! IPv6 fragments, like IPv4 ones, go on to reassembly.
//!
//! A stale table left by a crash is replaced atomically: the script declares the table,
//! deletes it and creates it again in one transaction (`nft -f` is all-or-nothing).

use std::io::Write;
use std::net::Ipv4Addr;
use std::ops::RangeInclusive;
use std::process::{Command, Stdio};

/// Errors of the nftables helper; each message says what the operator can do.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("nft not found: apt-get install nftables (or install the nftables package of your distribution)")]
    NotFound,
    #[error("nft needs CAP_NET_ADMIN to change the ruleset: run as root or grant the capability ({stderr})")]
    NeedsCapNetAdmin { stderr: String },
    #[error("running nft failed: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("nft refused the media drop table {table}: {stderr}")]
    Rejected { table: String, stderr: String },
    #[error("instance name {0:?} is not valid: use 1 to 32 ASCII letters, digits or '_'")]
    BadInstance(String),
    #[error("interface name {0:?} is not valid (1 to 15 bytes, no quotes, '/' or whitespace)")]
    BadInterface(String),
    #[error("no capture interfaces given: the media drop table needs at least one")]
    NoInterfaces,
    #[error("invalid port range {lo}-{hi}: the low port must not exceed the high port")]
    BadPortRange { lo: u16, hi: u16 },
}

/// The installed table. Deleted on drop (best effort) or by [`MediaDropTable::remove`].
#[derive(Debug)]
pub struct MediaDropTable {
    table: String,
    removed: bool,
}

fn valid_instance(s: &str) -> bool {
    (1..=32).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn valid_ifname(s: &str) -> bool {
    (1..16).contains(&s.len())
        && s.bytes().all(|b| {
            b.is_ascii_graphic()
                && !matches!(b, b'"' | b'\'' | b'/' | b'\\' | b'{' | b'}' | b';' | b'#')
        })
}

/// One drop rule: UDP to `ports` (and to `addr`, when given) arriving on `iface`. The chain
/// is on `prerouting`: without `addr` it also drops such datagrams that the host would route
/// elsewhere, so the engines always give the gateway's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DropRule {
    pub iface: String,
    pub addr: Option<Ipv4Addr>,
    pub ports: RangeInclusive<u16>,
}

/// The nft script [`MediaDropTable::install`] feeds to `nft -f -`.
pub fn ruleset(instance: &str, rules: &[DropRule]) -> Result<String, NftError> {
    if !valid_instance(instance) {
        return Err(NftError::BadInstance(instance.to_owned()));
    }
    if rules.is_empty() {
        return Err(NftError::NoInterfaces);
    }
    let table = format!("inet vgate_{instance}");
    let mut lines = String::new();
    for r in rules {
        if !valid_ifname(&r.iface) {
            return Err(NftError::BadInterface(r.iface.clone()));
        }
        let (lo, hi) = (*r.ports.start(), *r.ports.end());
        if lo > hi {
            return Err(NftError::BadPortRange { lo, hi });
        }
        let dport = if lo == hi {
            lo.to_string()
        } else {
            format!("{lo}-{hi}")
        };
        let iif = &r.iface;
        let daddr = r.addr.map(|a| format!("ip daddr {a} ")).unwrap_or_default();
        lines.push_str(&format!(
            "\t\tiifname \"{iif}\" {daddr}ip frag-off & 0x1fff == 0 udp dport {dport} counter drop\n"
        ));
        if r.addr.is_none() {
            // IPv6 too (an address is IPv4, so a rule with one matches IPv4 only): whole
            // datagrams (no fragment header) and first fragments (offset 0).
            lines.push_str(&format!(
                "\t\tiifname \"{iif}\" meta nfproto ipv6 exthdr frag missing udp dport {dport} counter drop\n\
                 \t\tiifname \"{iif}\" meta nfproto ipv6 frag frag-off 0 udp dport {dport} counter drop\n"
            ));
        }
    }
    Ok(format!(
        "table {table}\n\
         delete table {table}\n\
         table {table} {{\n\
         \tchain media_in {{\n\
         \t\ttype filter hook prerouting priority -300; policy accept;\n\
         {lines}\
         \t}}\n\
         }}\n"
    ))
}

/// Whether a table `inet vgate_<instance>` exists in this network namespace.
pub fn table_exists(instance: &str) -> Result<bool, NftError> {
    let out = run_nft(&["list", "tables", "inet"], None, instance)?;
    let want = format!("vgate_{instance}");
    Ok(out
        .lines()
        .any(|l| l.split_whitespace().last() == Some(want.as_str())))
}

fn run_nft(args: &[&str], stdin: Option<&str>, table: &str) -> Result<String, NftError> {
    let mut cmd = Command::new("nft");
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => NftError::NotFound,
        _ => NftError::Spawn(e),
    })?;
    if let (Some(script), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(script.as_bytes()).map_err(NftError::Spawn)?;
    }
    let out = child.wait_with_output().map_err(NftError::Spawn)?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    if stderr.contains("Operation not permitted") {
        Err(NftError::NeedsCapNetAdmin { stderr })
    } else {
        Err(NftError::Rejected {
            table: table.to_owned(),
            stderr,
        })
    }
}

impl MediaDropTable {
    /// Install (or atomically replace a stale) `inet vgate_<instance>` with `rules`, in the
    /// calling thread's network namespace. The table is deleted by whoever drops it, in
    /// *that* thread's namespace: drop it where it was installed.
    pub fn install(instance: &str, rules: &[DropRule]) -> Result<Self, NftError> {
        let script = ruleset(instance, rules)?;
        let table = format!("vgate_{instance}");
        run_nft(&["-f", "-"], Some(&script), &table)?;
        Ok(MediaDropTable {
            table,
            removed: false,
        })
    }

    /// The table name (without the `inet` family).
    pub fn table_name(&self) -> &str {
        &self.table
    }

    /// Packets and bytes dropped so far (the rules' counters added up).
    pub fn dropped(&self) -> Result<(u64, u64), NftError> {
        let out = run_nft(&["list", "table", "inet", &self.table], None, &self.table)?;
        Ok(parse_counter(&out).unwrap_or((0, 0)))
    }

    /// Delete the table now and report failure (drop only tries).
    pub fn remove(mut self) -> Result<(), NftError> {
        self.removed = true;
        run_nft(&["delete", "table", "inet", &self.table], None, &self.table).map(|_| ())
    }
}

impl Drop for MediaDropTable {
    fn drop(&mut self) {
        if !self.removed {
            let _ = run_nft(&["delete", "table", "inet", &self.table], None, &self.table);
        }
    }
}

/// The sum of every `counter packets N bytes M` in `nft list` output (`None` if there is
/// none, or one is malformed).
fn parse_counter(listing: &str) -> Option<(u64, u64)> {
    let mut w = listing.split_whitespace();
    let mut sum = None;
    while let Some(t) = w.next() {
        if t == "counter" && w.next()? == "packets" {
            let p: u64 = w.next()?.parse().ok()?;
            if w.next()? != "bytes" {
                return None;
            }
            let b: u64 = w.next()?.parse().ok()?;
            let (sp, sb) = sum.unwrap_or((0, 0));
            sum = Some((sp + p, sb + b));
        }
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(iface: &str, addr: Option<&str>, ports: RangeInclusive<u16>) -> DropRule {
        DropRule {
            iface: iface.into(),
            addr: addr.map(|a| a.parse().unwrap()),
            ports,
        }
    }

    #[test]
    fn script_shape() {
        let s = ruleset(
            "t1",
            &[
                rule("ga", Some("10.0.0.1"), 20000..=20099),
                rule("gb", None, 30000..=30099),
            ],
        )
        .unwrap();
        assert!(s.starts_with("table inet vgate_t1\ndelete table inet vgate_t1\n"));
        assert!(s.contains("type filter hook prerouting priority -300; policy accept;"));
        assert!(s.contains(
            "iifname \"ga\" ip daddr 10.0.0.1 ip frag-off & 0x1fff == 0 udp dport 20000-20099 counter drop\n"
        ));
        assert!(s.contains(
            "iifname \"gb\" ip frag-off & 0x1fff == 0 udp dport 30000-30099 counter drop\n"
        ));
        let one = ruleset("t1", &[rule("ga", None, 5004..=5004)]).unwrap();
        assert!(one.contains("udp dport 5004 counter drop"));
    }

    /// A rule without an address covers IPv6 too, where the UDP header is there: no
    /// fragment header, or one with offset 0. A rule with an (IPv4) address stays IPv4.
    #[test]
    fn ipv6_whole_datagrams_and_first_fragments() {
        let s = ruleset("t1", &[rule("gb", None, 30000..=30099)]).unwrap();
        assert!(s.contains(
            "\t\tiifname \"gb\" meta nfproto ipv6 exthdr frag missing udp dport 30000-30099 counter drop\n"
        ));
        assert!(s.contains(
            "\t\tiifname \"gb\" meta nfproto ipv6 frag frag-off 0 udp dport 30000-30099 counter drop\n"
        ));
        assert_eq!(s.matches("counter drop").count(), 3, "{s}");
        let v4 = ruleset("t1", &[rule("ga", Some("10.0.0.1"), 20000..=20099)]).unwrap();
        assert!(!v4.contains("ipv6"), "{v4}");
        assert_eq!(v4.matches("counter drop").count(), 1, "{v4}");
    }

    #[test]
    fn names_and_ranges_are_checked() {
        let ok = [rule("x", None, 1..=2)];
        assert!(matches!(ruleset("a-b", &ok), Err(NftError::BadInstance(_))));
        assert!(matches!(ruleset("", &ok), Err(NftError::BadInstance(_))));
        assert!(matches!(ruleset("ok", &[]), Err(NftError::NoInterfaces)));
        assert!(matches!(
            ruleset("ok", &[rule("x\" }", None, 1..=2)]),
            Err(NftError::BadInterface(_))
        ));
        assert!(matches!(
            ruleset("ok", &[rule("sixteen-chars-xx", None, 1..=2)]),
            Err(NftError::BadInterface(_))
        ));
        #[allow(clippy::reversed_empty_ranges)]
        let r = ruleset("ok", &[rule("x", None, 3..=2)]);
        assert!(matches!(r, Err(NftError::BadPortRange { lo: 3, hi: 2 })));
    }

    #[test]
    fn counter_parsing() {
        let l = "table inet vgate_x {\n\tchain media_in {\n\t\tiifname \"ga\" udp dport 1-2 counter packets 17 bytes 1234 drop\n\t}\n}\n";
        assert_eq!(parse_counter(l), Some((17, 1234)));
        let two = format!("{l}\t\tiifname \"gb\" udp dport 3-4 counter packets 3 bytes 6 drop\n");
        assert_eq!(parse_counter(&two), Some((20, 1240)));
        assert_eq!(parse_counter("nothing"), None);
    }
}
