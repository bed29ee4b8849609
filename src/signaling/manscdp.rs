//! MANSCDP (GB/T 28181's XML control bodies, `Application/MANSCDP+xml`) at the boundary:
//! which command a body carries (for the per-route command policy) and the rewrite of the
//! address fields that would tell one domain the other's addresses.
//!
//! Bodies are GB2312, GBK, GB 18030 (or UTF-8) text; vgate never decodes them. A multi-byte
//! character starts with a byte of 0x81 or above; its other bytes are 0x30-0x39 (the
//! second and fourth of a GB 18030 four-byte character), 0x40-0x7E or 0x80-0xFE, never `<`,
//! `>` or `/`. So the markup is found by scanning bytes, an address field (whose whole
//! text must be an IPv4 address, or digits) never matches text with a character in it, and
//! every byte vgate does not rewrite crosses unchanged: the encoding is kept, only the
//! fields named below change.
//! The scanner is a tolerant one for this flat, element-only XML: no entities, CDATA or
//! attributes matter to it, and a body it cannot follow is left as it is.
//!
//! - **Commands** ([`commands`]): what a `<Query>` or `<Control>` body asks of a device:
//!   the `<CmdType>` text, and for a `<Control>` body the
//!   names of the control commands it carries (`TeleBoot`, `PTZCmd`, `RecordCmd`,
//!   `GuardCmd`, `AlarmCmd`, …: the child elements of `<Control>` but `CmdType`, `SN`,
//!   `DeviceID`).
//! - **Addresses** ([`rewrite_addresses`]): a leaf element whose whole text is an IPv4
//!   address (`<IPAddress>` of DeviceInfo and Catalog items, an `<Address>` holding an IP,
//!   `<SIPServerIP>` of DeviceConfig, …) and a leaf element named `Port` or ending in
//!   `Port` whose text is a number (`<Port>`, `<SIPServerPort>`) become the gateway's
//!   address and SIP port on the receiving side, or are emptied.

#![deny(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::net::Ipv4Addr;

use crate::config::ManscdpAddresses;

/// Whether a Content-Type value names a MANSCDP body.
pub fn is_manscdp(content_type: &[u8]) -> bool {
    let t = content_type
        .split(|&b| b == b';')
        .next()
        .unwrap_or_default();
    String::from_utf8_lossy(t)
        .trim()
        .eq_ignore_ascii_case("application/manscdp+xml")
}

/// One element of the body: its name, and for a leaf, the range of its text.
#[derive(Debug)]
struct Element<'a> {
    name: &'a [u8],
    depth: usize,
    /// Byte range of the text of a leaf element (`<N>text</N>`).
    text: Option<(usize, usize)>,
}

/// The start tags of `body` in order, with their depth and leaf text.
fn elements(body: &[u8]) -> Vec<Element<'_>> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while let Some(lt) = body
        .get(i..)
        .and_then(|r| r.iter().position(|&b| b == b'<'))
    {
        let start = i + lt;
        let Some(gt) = body
            .get(start..)
            .and_then(|r| r.iter().position(|&b| b == b'>'))
        else {
            break;
        };
        let end = start + gt;
        let tag = body.get(start + 1..end).unwrap_or_default();
        i = end + 1;
        match tag.first() {
            Some(b'?') | Some(b'!') | None => continue,
            Some(b'/') => {
                depth = depth.saturating_sub(1);
                continue;
            }
            _ => {}
        }
        let self_closing = tag.last() == Some(&b'/');
        let name_len = tag
            .iter()
            .position(|b| b.is_ascii_whitespace() || *b == b'/')
            .unwrap_or(tag.len());
        let name = tag.get(..name_len).unwrap_or_default();
        let mut text = None;
        if !self_closing {
            // A leaf: text up to the next '<', which closes this very element.
            if let Some(next) = body
                .get(i..)
                .and_then(|r| r.iter().position(|&b| b == b'<'))
            {
                let close = body.get(i + next..).unwrap_or_default();
                let closes_me = close.get(1) == Some(&b'/')
                    && close.get(2..2 + name.len()) == Some(name)
                    && matches!(close.get(2 + name.len()), Some(b'>') | Some(b' '));
                if closes_me {
                    text = Some((i, i + next));
                }
            }
        }
        out.push(Element { name, depth, text });
        if !self_closing {
            depth += 1;
        }
    }
    out
}

fn trimmed(body: &[u8], (a, b): (usize, usize)) -> &[u8] {
    let t = body.get(a..b).unwrap_or_default();
    let s = t
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(t.len());
    let e = t
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(s, |e| e + 1);
    t.get(s..e).unwrap_or_default()
}

/// The commands a MANSCDP body sends to a device: for a `<Query>` its `CmdType`, for a
/// `<Control>` its `CmdType` then the control commands in it. Empty for what devices send
/// back (`<Notify>`, `<Response>`) and for a body without `CmdType`.
pub fn commands(body: &[u8]) -> Vec<&[u8]> {
    let els = elements(body);
    let Some(root) = els
        .first()
        .filter(|r| matches!(r.name, b"Control" | b"Query"))
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if let Some(t) = els
        .iter()
        .find(|e| e.depth == 1 && e.name == b"CmdType")
        .and_then(|e| e.text)
    {
        out.push(trimmed(body, t));
    }
    if out.is_empty() {
        return out;
    }
    if root.name == b"Control" {
        for e in els.iter().filter(|e| e.depth == 1) {
            if !matches!(e.name, b"CmdType" | b"SN" | b"DeviceID") {
                out.push(e.name);
            }
        }
    }
    out
}

/// Whether a body's commands pass a route's policy: the `CmdType` must be in `allow` (when
/// it is not empty), and no command may be in `deny`. Returns the refused command.
pub fn refused<'a>(cmds: &[&'a [u8]], allow: &[String], deny: &[String]) -> Option<&'a [u8]> {
    if let Some(c) = denied(cmds, deny) {
        return Some(c);
    }
    let listed = |list: &[String], c: &[u8]| list.iter().any(|n| n.as_bytes() == c);
    match cmds.first() {
        Some(c) if !allow.is_empty() && !listed(allow, c) => Some(c),
        _ => None,
    }
}

/// The first of `cmds` named in `deny`.
pub fn denied<'a>(cmds: &[&'a [u8]], deny: &[String]) -> Option<&'a [u8]> {
    cmds.iter()
        .find(|c| deny.iter().any(|n| n.as_bytes() == **c))
        .copied()
}

fn is_ipv4(t: &[u8]) -> bool {
    std::str::from_utf8(t)
        .ok()
        .is_some_and(|s| s.parse::<Ipv4Addr>().is_ok())
}

/// Rewrites the address fields of a MANSCDP body (see the module doc). `None`: nothing
/// to change (or `Keep`).
pub fn rewrite_addresses(
    body: &[u8],
    how: ManscdpAddresses,
    gateway: Ipv4Addr,
    port: u16,
) -> Option<Vec<u8>> {
    if how == ManscdpAddresses::Keep {
        return None;
    }
    let mut edits: Vec<((usize, usize), String)> = Vec::new();
    for e in elements(body) {
        let Some(range) = e.text else { continue };
        let t = trimmed(body, range);
        let new = if is_ipv4(t) {
            gateway.to_string()
        } else if e.name.ends_with(b"Port") && !t.is_empty() && t.iter().all(u8::is_ascii_digit) {
            port.to_string()
        } else {
            continue;
        };
        let value = match how {
            ManscdpAddresses::Blank => String::new(),
            _ => new,
        };
        edits.push((range, value));
    }
    if edits.is_empty() {
        return None;
    }
    let mut out = Vec::with_capacity(body.len() + 16 * edits.len());
    let mut at = 0;
    for ((a, b), v) in edits {
        out.extend_from_slice(body.get(at..a)?);
        out.extend_from_slice(v.as_bytes());
        at = b;
    }
    out.extend_from_slice(body.get(at..)?);
    Some(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn control_commands_are_named() {
        let b = b"<?xml version=\"1.0\"?>\r\n<Control>\r\n<CmdType>DeviceControl</CmdType>\r\n<SN>11</SN>\r\n<DeviceID>34020000001320000001</DeviceID>\r\n<TeleBoot>Boot</TeleBoot>\r\n</Control>\r\n";
        let c = commands(b);
        assert_eq!(c, vec![&b"DeviceControl"[..], b"TeleBoot"]);
        let deny = vec!["TeleBoot".to_string()];
        assert_eq!(refused(&c, &[], &deny), Some(&b"TeleBoot"[..]));
        let allow = vec!["Catalog".to_string()];
        assert_eq!(refused(&c, &allow, &[]), Some(&b"DeviceControl"[..]));
        let allow = vec!["DeviceControl".to_string()];
        assert_eq!(refused(&c, &allow, &[]), None);
        // A query names its CmdType only.
        let q = b"<Query><CmdType>Catalog</CmdType><SN>1</SN><DeviceID>1</DeviceID></Query>";
        assert_eq!(commands(q), vec![&b"Catalog"[..]]);
        // Reports from devices and bodies without CmdType: nothing to police.
        assert!(commands(b"<Notify><CmdType>Keepalive</CmdType></Notify>").is_empty());
        assert!(commands(b"<Response><CmdType>Catalog</CmdType></Response>").is_empty());
        assert!(commands(b"<Query><SN>1</SN></Query>").is_empty());
        assert!(commands(b"not xml <<<>").is_empty());
    }

    #[test]
    fn gb2022_commands_are_named() {
        let b = b"<?xml version=\"1.0\" encoding=\"GB2312\"?>\r\n<Control>\r\n<CmdType>DeviceControl</CmdType>\r\n<SN>3</SN>\r\n<DeviceID>34020000001320000001</DeviceID>\r\n<FormatSDCard>1</FormatSDCard>\r\n</Control>\r\n";
        let c = commands(b);
        assert_eq!(c, vec![&b"DeviceControl"[..], b"FormatSDCard"]);
        let from_b: Vec<String> = crate::config::MANSCDP_DENY_FROM_B
            .map(String::from)
            .to_vec();
        assert_eq!(denied(&c, &from_b), Some(&b"FormatSDCard"[..]));
        let q = b"<Query><CmdType>PTZPosition</CmdType><SN>4</SN><DeviceID>1</DeviceID></Query>";
        assert_eq!(commands(q), vec![&b"PTZPosition"[..]]);
        assert_eq!(denied(&commands(q), &from_b), None);
    }

    #[test]
    fn gb18030_text_is_never_an_address() {
        // A four-byte GB 18030 character carries ASCII digits; with dots around it, it is
        // still no IPv4 address and no port.
        let b = b"<Item><Address>\x81\x30\x81\x30.1.2</Address><Port>\x95\x32\x82\x36</Port><IPAddress>10.1.0.5</IPAddress><Name>\x81\x40\x81\x5d</Name></Item>";
        let g = rewrite_addresses(
            b,
            ManscdpAddresses::Gateway,
            Ipv4Addr::new(10, 2, 0, 1),
            5061,
        )
        .unwrap();
        assert_eq!(
            g,
            b"<Item><Address>\x81\x30\x81\x30.1.2</Address><Port>\x95\x32\x82\x36</Port><IPAddress>10.2.0.1</IPAddress><Name>\x81\x40\x81\x5d</Name></Item>"
        );
    }

    #[test]
    fn nested_items_do_not_count_as_control_commands() {
        let b = b"<Control><CmdType>DeviceConfig</CmdType><SN>2</SN><BasicParam><Name>x</Name></BasicParam></Control>";
        assert_eq!(commands(b), vec![&b"DeviceConfig"[..], b"BasicParam"]);
    }

    #[test]
    fn addresses_only_ip_text_and_ports() {
        let b = b"<Item><Address>10.1.0.5</Address><Address>Gate 1</Address><IPAddress> 10.1.0.6 </IPAddress><Port>5060</Port><Name>Port</Name></Item>";
        let g = rewrite_addresses(
            b,
            ManscdpAddresses::Gateway,
            Ipv4Addr::new(10, 2, 0, 1),
            5061,
        )
        .unwrap();
        assert_eq!(
            String::from_utf8(g).unwrap(),
            "<Item><Address>10.2.0.1</Address><Address>Gate 1</Address><IPAddress>10.2.0.1</IPAddress><Port>5061</Port><Name>Port</Name></Item>"
        );
        let z = rewrite_addresses(b, ManscdpAddresses::Blank, Ipv4Addr::new(10, 2, 0, 1), 5061)
            .unwrap();
        assert_eq!(
            String::from_utf8(z).unwrap(),
            "<Item><Address></Address><Address>Gate 1</Address><IPAddress></IPAddress><Port></Port><Name>Port</Name></Item>"
        );
        assert!(rewrite_addresses(b, ManscdpAddresses::Keep, Ipv4Addr::LOCALHOST, 1).is_none());
        assert!(rewrite_addresses(
            b"<a><b>x</b></a>",
            ManscdpAddresses::Blank,
            Ipv4Addr::LOCALHOST,
            1
        )
        .is_none());
    }
}
