//! Just enough of the kernel's BTF (`/sys/kernel/btf/vmlinux`) to find where a member of a
//! kernel struct lies: the redirect-failure watch of mode xdp reads `net_device` fields from
//! a tracepoint's arguments, and their offsets differ from one kernel build to the next.
//!
//! Owns: parsing the BTF type section (read only, safe code). Must not touch: BPF programs
//! (that is [`super::xdp`]).

use std::collections::HashMap;

const MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_TYPE_TAG: u32 = 18;

/// One type of the type section: its kind, name, `size`/`type` word and where its members
/// (for a struct or union) start in the section.
#[derive(Clone, Copy)]
struct Type {
    kind: u32,
    name: u32,
    kind_flag: bool,
    vlen: u32,
    size_or_type: u32,
    /// Byte offset of the data following the 12-byte header, within the type section.
    extra: usize,
}

/// The parsed type table of one BTF blob.
pub struct Btf {
    types: Vec<Type>,
    type_sec: Vec<u8>,
    strings: Vec<u8>,
    /// Struct and union ids by name (the first of a name; vmlinux has few duplicates).
    by_name: HashMap<String, Vec<u32>>,
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

impl Btf {
    /// The running kernel's BTF, when it was built with `CONFIG_DEBUG_INFO_BTF`.
    pub fn vmlinux() -> std::io::Result<Btf> {
        let data = std::fs::read("/sys/kernel/btf/vmlinux")?;
        Btf::parse(&data).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "/sys/kernel/btf/vmlinux is not BTF this parser understands",
            )
        })
    }

    /// Parses a BTF blob (header, type section, string section).
    pub fn parse(data: &[u8]) -> Option<Btf> {
        if u16_at(data, 0)? != MAGIC {
            return None;
        }
        let hdr_len = u32_at(data, 4)? as usize;
        let (type_off, type_len) = (u32_at(data, 8)? as usize, u32_at(data, 12)? as usize);
        let (str_off, str_len) = (u32_at(data, 16)? as usize, u32_at(data, 20)? as usize);
        let type_sec = data
            .get(hdr_len + type_off..hdr_len + type_off + type_len)?
            .to_vec();
        let strings = data
            .get(hdr_len + str_off..hdr_len + str_off + str_len)?
            .to_vec();
        // Type id 0 is void: a placeholder keeps ids and indices equal.
        let mut types = vec![Type {
            kind: 0,
            name: 0,
            kind_flag: false,
            vlen: 0,
            size_or_type: 0,
            extra: 0,
        }];
        let mut at = 0;
        while at + 12 <= type_sec.len() {
            let info = u32_at(&type_sec, at + 4)?;
            let t = Type {
                kind: (info >> 24) & 0x1f,
                name: u32_at(&type_sec, at)?,
                kind_flag: info >> 31 == 1,
                vlen: info & 0xffff,
                size_or_type: u32_at(&type_sec, at + 8)?,
                extra: at + 12,
            };
            let vlen = t.vlen as usize;
            let extra = match t.kind {
                1 | 14 | 17 => 4,             // INT, VAR, DECL_TAG
                3 => 12,                      // ARRAY
                4 | 5 | 15 | 19 => 12 * vlen, // STRUCT, UNION, DATASEC, ENUM64
                6 | 13 => 8 * vlen,           // ENUM, FUNC_PROTO
                2 | 7..=12 | 16 | 18 => 0,
                _ => return None, // a kind newer than this parser: sizes unknown
            };
            types.push(t);
            at += 12 + extra;
        }
        let mut btf = Btf {
            types,
            type_sec,
            strings,
            by_name: HashMap::new(),
        };
        for (id, t) in btf.types.iter().enumerate() {
            if (t.kind == KIND_STRUCT || t.kind == KIND_UNION) && t.name != 0 {
                let name = btf.string(t.name).to_owned();
                btf.by_name.entry(name).or_default().push(id as u32);
            }
        }
        Some(btf)
    }

    fn string(&self, off: u32) -> &str {
        let s = self.strings.get(off as usize..).unwrap_or_default();
        let end = s.iter().position(|&b| b == 0).unwrap_or(s.len());
        std::str::from_utf8(&s[..end]).unwrap_or("")
    }

    /// Follows typedefs and qualifiers to the type they name.
    fn resolve(&self, mut id: u32) -> Option<&Type> {
        for _ in 0..32 {
            let t = self.types.get(id as usize)?;
            match t.kind {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = t.size_or_type
                }
                _ => return Some(t),
            }
        }
        None
    }

    /// Byte offset of `member` in struct/union `t`, looking into anonymous members.
    fn member_in(&self, t: &Type, member: &str, depth: u32) -> Option<u32> {
        if depth > 8 || (t.kind != KIND_STRUCT && t.kind != KIND_UNION) {
            return None;
        }
        for i in 0..t.vlen as usize {
            let at = t.extra + 12 * i;
            let name = u32_at(&self.type_sec, at)?;
            let ty = u32_at(&self.type_sec, at + 4)?;
            let raw = u32_at(&self.type_sec, at + 8)?;
            let bits = if t.kind_flag { raw & 0xff_ffff } else { raw };
            if name != 0 {
                if self.string(name) == member && bits % 8 == 0 {
                    return Some(bits / 8);
                }
            } else if let Some(inner) = self.resolve(ty) {
                if let Some(off) = self.member_in(inner, member, depth + 1) {
                    return Some(bits / 8 + off);
                }
            }
        }
        None
    }

    /// Byte offset of `member` in `struct name` (anonymous structs and unions inside it are
    /// searched too); `None` if there is no such struct or member, or it is a bit field.
    pub fn member_offset(&self, name: &str, member: &str) -> Option<u32> {
        self.by_name.get(name)?.iter().find_map(|&id| {
            let t = self.types.get(id as usize)?;
            self.member_in(t, member, 0)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-built blob: `struct s { int a; union { int b; int c; }; }` with `c` at 4.
    fn blob() -> Vec<u8> {
        let strings = b"\0s\0a\0b\0c\0int\0".to_vec();
        let (s, a, b, c, int) = (1u32, 3, 5, 7, 9);
        let mut types = Vec::new();
        let mut ty = |name: u32, info: u32, st: u32, extra: &[u32]| {
            for w in [name, info, st].iter().chain(extra) {
                types.extend_from_slice(&w.to_ne_bytes());
            }
        };
        ty(int, 1 << 24, 4, &[32]); // 1: int
        ty(0, (5 << 24) | 2, 4, &[b, 1, 0, c, 1, 0]); // 2: union { b; c }
        ty(s, (4 << 24) | 2, 8, &[a, 1, 0, 0, 2, 32]); // 3: struct s
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC.to_ne_bytes());
        out.extend_from_slice(&[1, 0]);
        for w in [
            24u32,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            out.extend_from_slice(&w.to_ne_bytes());
        }
        out.extend_from_slice(&types);
        out.extend_from_slice(&strings);
        out
    }

    #[test]
    fn finds_members_and_anonymous_ones() {
        let btf = Btf::parse(&blob()).expect("parses");
        assert_eq!(btf.member_offset("s", "a"), Some(0));
        assert_eq!(btf.member_offset("s", "c"), Some(4));
        assert_eq!(btf.member_offset("s", "d"), None);
        assert_eq!(btf.member_offset("t", "a"), None);
        assert!(Btf::parse(&[0; 8]).is_none());
    }

    #[test]
    fn finds_what_the_redirect_watch_reads_in_this_kernel() {
        let Ok(btf) = Btf::vmlinux() else {
            crate::test_did_not_run(
                "finds_what_the_redirect_watch_reads_in_this_kernel",
                "no /sys/kernel/btf/vmlinux here (a kernel built with CONFIG_DEBUG_INFO_BTF)",
            );
            return;
        };
        for (s, m) in [
            ("net_device", "ifindex"),
            ("net_device", "nd_net"),
            ("net", "ns"),
            ("ns_common", "inum"),
        ] {
            let off = btf.member_offset(s, m);
            eprintln!("{s}.{m}: {off:?}");
            assert!(off.is_some(), "{s}.{m}");
        }
    }
}
