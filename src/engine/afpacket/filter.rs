//! Classic BPF socket filters built in safe code: the UDP destination filter and the
//! drop-everything program attached while a ring is set up.

use super::{AfPacketError, DstMatch};

/// One classic BPF instruction (`struct sock_filter`), built in safe code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BpfInsn {
    pub code: u16,
    pub jt: u8,
    pub jf: u8,
    pub k: u32,
}

/// Classic BPF opcode parts (`linux/filter.h`, `linux/bpf_common.h`).
pub mod bpf {
    pub const LD: u16 = 0x00;
    pub const LDX: u16 = 0x01;
    pub const JMP: u16 = 0x05;
    pub const RET: u16 = 0x06;
    pub const W: u16 = 0x00;
    pub const H: u16 = 0x08;
    pub const B: u16 = 0x10;
    pub const ABS: u16 = 0x20;
    pub const IND: u16 = 0x40;
    pub const MSH: u16 = 0xa0;
    pub const JEQ: u16 = 0x10;
    pub const JGT: u16 = 0x20;
    pub const JGE: u16 = 0x30;
    pub const JSET: u16 = 0x40;
    pub const K: u16 = 0x00;
}

const fn insn(code: u16, jt: u8, jf: u8, k: u32) -> BpfInsn {
    BpfInsn { code, jt, jf, k }
}

/// "Return 0": keep nothing. Attached while a ring is being set up.
pub(super) const DROP_ALL: [BpfInsn; 1] = [insn(bpf::RET | bpf::K, 0, 0, 0)];

/// Classic BPF program accepting only unfragmented-or-first-fragment IPv4/UDP frames whose
/// destination port is in `lo..=hi` (see [`udp_dst_filter`]).
pub fn udp_dport_filter(lo: u16, hi: u16) -> Result<Vec<BpfInsn>, AfPacketError> {
    udp_dst_filter(&[DstMatch {
        addr: None,
        ports: lo..=hi,
    }])
}

/// Classic BPF program accepting only unfragmented-or-first-fragment IPv4/UDP frames that
/// match one of `matches` (destination port in range, and destination address when given),
/// evaluated on the frame from its Ethernet header (as an `AF_PACKET`/`SOCK_RAW` socket sees
/// it; a stripped VLAN tag is not in the bytes).
///
/// Non-first fragments have no UDP header and are refused; first fragments pass so that
/// user space counts them under its drop reason.
pub fn udp_dst_filter(matches: &[DstMatch]) -> Result<Vec<BpfInsn>, AfPacketError> {
    use bpf::*;
    for m in matches {
        if m.ports.start() > m.ports.end() {
            return Err(AfPacketError::BadPortRange {
                lo: *m.ports.start(),
                hi: *m.ports.end(),
            });
        }
    }
    const PREFIX: usize = 7;
    let block_len = |m: &DstMatch| if m.addr.is_some() { 5 } else { 3 };
    let drop_at = PREFIX + matches.iter().map(block_len).sum::<usize>();
    let accept_at = drop_at + 1;
    if accept_at > 255 {
        return Err(AfPacketError::BadParams(
            "too many destinations for one ring filter",
        ));
    }
    // Jump offsets are relative to the next instruction.
    let to = |from: usize, target: usize| (target - from - 1) as u8;
    let mut p = vec![
        // 0: A = ethertype (half-word at byte 12)
        insn(LD | H | ABS, 0, 0, 12),
        // 1: IPv4? continue : DROP
        insn(JMP | JEQ | K, 0, to(1, drop_at), 0x0800),
        // 2: A = IP protocol (byte 14 + 9)
        insn(LD | B | ABS, 0, 0, 23),
        // 3: UDP? continue : DROP
        insn(JMP | JEQ | K, 0, to(3, drop_at), 17),
        // 4: A = flags + fragment offset (half-word at 14 + 6)
        insn(LD | H | ABS, 0, 0, 20),
        // 5: fragment offset != 0 (not the first fragment)? DROP : continue
        insn(JMP | JSET | K, to(5, drop_at), 0, 0x1fff),
        // 6: X = IP header length = 4 * (byte 14 & 0x0f)
        insn(LDX | B | MSH, 0, 0, 14),
    ];
    for m in matches {
        let at = p.len();
        let next = at + block_len(m);
        let (lo, hi) = (u32::from(*m.ports.start()), u32::from(*m.ports.end()));
        // A = UDP destination port: half-word at X + 14 (Ethernet) + 2
        p.push(insn(LD | H | IND, 0, 0, 16));
        // port >= lo? continue : next match
        p.push(insn(JMP | JGE | K, 0, to(at + 1, next), lo));
        match m.addr {
            None => {
                // port > hi? next match : ACCEPT
                p.push(insn(
                    JMP | JGT | K,
                    to(at + 2, next),
                    to(at + 2, accept_at),
                    hi,
                ));
            }
            Some(addr) => {
                p.push(insn(JMP | JGT | K, to(at + 2, next), 0, hi));
                // A = destination address (word at 14 + 16)
                p.push(insn(LD | W | ABS, 0, 0, 30));
                p.push(insn(
                    JMP | JEQ | K,
                    to(at + 4, accept_at),
                    to(at + 4, next),
                    u32::from(addr),
                ));
            }
        }
    }
    // DROP
    p.push(insn(RET | K, 0, 0, 0));
    // ACCEPT: keep the whole frame (the ring's block size still bounds it)
    p.push(insn(RET | K, 0, 0, u32::MAX));
    debug_assert_eq!(p.len(), accept_at + 1);
    Ok(p)
}

pub(super) fn to_sock_filter(prog: &[BpfInsn]) -> Vec<libc::sock_filter> {
    prog.iter()
        .map(|i| libc::sock_filter {
            code: i.code,
            jt: i.jt,
            jf: i.jf,
            k: i.k,
        })
        .collect()
}
