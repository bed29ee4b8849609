//! The fast path's part of the XDP program ([`emit_fast`]): look the packet up in
//! `vgate_fwd`, check its source, rewrite its headers (checksums updated incrementally) and
//! redirect it through the devmap, counting per route and CPU.

use super::*;

/// The fast path's map fds and limits, for the program builder.
pub(in crate::engine) struct FastFds {
    pub fwd: i32,
    pub stats: i32,
    pub devmap: i32,
    pub max_payload: u32,
}

/// Adds `r` (a register holding up to 32 bits) to the one's-complement accumulator `acc`.
pub(super) fn add(a: &mut Asm, acc: u8, r: u8) {
    a.op(ADD64_REG, acc, r, 0, 0);
}

/// Folds `acc` to 16 bits (end-around carry, `rounds` times) and complements it: a checksum
/// field. Each round takes a sum below 2^(16 + k) to below 2^16 + 2^k, so two rounds fold any
/// sum below 2^32 and three any below 2^48 (the callers' bounds are stated where they call).
pub(super) fn fold_complement(a: &mut Asm, acc: u8, tmp: u8, rounds: usize) {
    for _ in 0..rounds {
        a.op(MOV64_REG, tmp, acc, 0, 0);
        a.op(RSH64_IMM, tmp, 0, 0, 16);
        a.op(AND64_IMM, acc, 0, 0, 0xffff);
        a.op(ADD64_REG, acc, tmp, 0, 0);
    }
    a.op(XOR64_IMM, acc, 0, 0, 0xffff);
}

/// `acc += ~(32-bit word at r7+off) + (32-bit word at r8+new)`: one replaced 32-bit field.
pub(super) fn replace32(a: &mut Asm, acc: u8, off: i16, new: i16) {
    a.op(LDX_W, R2, R7, off, 0);
    a.op(XOR32_IMM, R2, 0, 0, -1);
    add(a, acc, R2);
    a.op(LDX_W, R2, R8, new, 0);
    add(a, acc, R2);
}

/// The fast-path section of the XDP program. On entry: r6 = ctx, r7 = start of the frame
/// (untagged Ethernet), r8 = the port-map bit of the matched domain (1 << domain index),
/// the destination port (host order) at r10-4, and the frame known to hold 34 bytes with a
/// 20-byte IPv4 header, UDP, no fragment. Anything it cannot forward jumps to `xsk`; what it
/// forwards leaves through `bpf_redirect_map` and `exit`.
pub(in crate::engine) fn emit_fast(a: &mut Asm, f: &FastFds) {
    // Key: domain index << 16 | port.
    a.op(LDX_W, R2, R10, -4, 0);
    a.op(MOV64_REG, R3, R8, 0, 0);
    a.op(SUB64_IMM, R3, 0, 0, 1);
    a.op(LSH64_IMM, R3, 0, 0, 16);
    a.op(OR64_REG, R2, R3, 0, 0);
    a.op(STX_W, R10, R2, -8, 0);
    a.op(MOV64_REG, R2, R10, 0, 0);
    a.op(ADD64_IMM, R2, 0, 0, -8);
    a.ld_map_fd(R1, f.fwd);
    a.op(CALL, 0, 0, 0, HELPER_MAP_LOOKUP_ELEM);
    a.jmp(JEQ_IMM, R0, 0, 0, "xsk");
    a.op(MOV64_REG, R8, R0, 0, 0); // r8 = the entry
    a.op(LDX_W, R1, R8, 0, 0); // flags
    a.op(MOV64_REG, R2, R1, 0, 0);
    a.op(AND64_IMM, R2, 0, 0, ACTIVE as i32);
    a.jmp(JEQ_IMM, R2, 0, 0, "xsk");
    // Ethernet + IPv4 (20) + UDP header present.
    a.op(LDX_W, R3, R6, 4, 0);
    a.op(MOV64_REG, R2, R7, 0, 0);
    a.op(ADD64_IMM, R2, 0, 0, 42);
    a.jmp(JGT_REG, R2, R3, 0, "xsk");
    // Source.
    a.jmp(JSET_IMM, R1, 0, CHECK_ADDR as i32, "check_addr");
    a.jmp(JA, 0, 0, 0, "check_port");
    a.label("check_addr");
    a.op(LDX_W, R2, R7, 26, 0);
    a.op(LDX_W, R3, R8, 4, 0);
    a.jmp(JNE_REG, R2, R3, 0, "xsk");
    a.label("check_port");
    a.jmp(JSET_IMM, R1, 0, CHECK_PORT as i32, "check_sport");
    a.jmp(JA, 0, 0, 0, "ip_csum");
    a.label("check_sport");
    a.op(LDX_H, R2, R7, 34, 0);
    a.op(LDX_H, R3, R8, 8, 0);
    a.jmp(JNE_REG, R2, R3, 0, "xsk");
    // The IPv4 header checksum must hold (the slow path drops a bad one as malformed): the
    // one's-complement sum of its five 32-bit words (< 5 * 2^32: three rounds) folds to 0xffff.
    // Every route passes here, whatever its source checks.
    a.label("ip_csum");
    a.op(MOV64_IMM, R1, 0, 0, 0);
    for off in (14..34).step_by(4) {
        a.op(LDX_W, R2, R7, off, 0);
        add(a, R1, R2);
    }
    fold_complement(a, R1, R2, 3);
    a.jmp(JNE_IMM, R1, 0, 0, "xsk");
    // Lengths: IPv4 total = UDP length + 20, payload in [1, max_payload], total <= MTU, the
    // whole datagram in the frame.
    a.label("lengths");
    a.op(LDX_H, R2, R7, 16, 0);
    a.op(BE, R2, 0, 0, 16);
    a.op(AND64_IMM, R2, 0, 0, 0xffff); // r2 = IPv4 total length
    a.op(LDX_H, R3, R7, 38, 0);
    a.op(BE, R3, 0, 0, 16);
    a.op(AND64_IMM, R3, 0, 0, 0xffff); // r3 = UDP length
    a.op(MOV64_REG, R4, R3, 0, 0);
    a.op(ADD64_IMM, R4, 0, 0, 20);
    a.jmp(JNE_REG, R4, R2, 0, "xsk");
    a.jmp(JLE_IMM, R3, 0, 8, "xsk");
    a.op(MOV64_REG, R4, R3, 0, 0);
    a.op(SUB64_IMM, R4, 0, 0, 8);
    a.jmp(JGT_IMM, R4, 0, f.max_payload as i32, "xsk");
    a.op(STX_DW, R10, R4, -24, 0); // payload bytes, for the counters
    a.op(LDX_H, R5, R8, 10, 0); // egress MTU
    a.jmp(JGT_REG, R2, R5, 0, "xsk");
    a.op(MOV64_REG, R4, R7, 0, 0);
    a.op(ADD64_IMM, R4, 0, 0, 14);
    a.op(ADD64_REG, R4, R2, 0, 0);
    a.op(LDX_W, R3, R6, 4, 0);
    a.jmp(JGT_REG, R4, R3, 0, "xsk");
    // The addresses' change, once for both checksums (IPv4 header and UDP pseudo-header):
    // r9 = sum of ~old + new over the two 32-bit addresses, < 4 * 2^32.
    a.op(MOV64_IMM, R9, 0, 0, 0);
    replace32(a, R9, 26, 12);
    replace32(a, R9, 30, 16);
    // IPv4 checksum: addresses and TTL/protocol replaced (sum < 2^34 + 3 * 2^16: three rounds).
    a.op(LDX_H, R1, R7, 24, 0);
    a.op(XOR64_IMM, R1, 0, 0, 0xffff);
    add(a, R1, R9);
    a.op(LDX_H, R2, R7, 22, 0);
    a.op(XOR64_IMM, R2, 0, 0, 0xffff);
    add(a, R1, R2);
    a.op(ADD64_IMM, R1, 0, 0, 0x1140); // TTL 64, protocol 17, as loaded (little-endian)
    fold_complement(a, R1, R2, 3);
    a.op(STX_H, R7, R1, 24, 0);
    // UDP checksum (zero: none, stays so): addresses and ports replaced (sum < 6 * 2^32 +
    // 2^16: three rounds).
    a.op(LDX_H, R1, R7, 40, 0);
    a.jmp(JEQ_IMM, R1, 0, 0, "udp_done");
    a.op(XOR64_IMM, R1, 0, 0, 0xffff);
    add(a, R1, R9);
    replace32(a, R1, 34, 20);
    fold_complement(a, R1, R2, 3);
    a.jmp(JNE_IMM, R1, 0, 0, "udp_store");
    a.op(MOV64_IMM, R1, 0, 0, 0xffff);
    a.label("udp_store");
    a.op(STX_H, R7, R1, 40, 0);
    a.label("udp_done");
    // Headers.
    for (pkt, val) in [(26, 12), (30, 16), (34, 20), (0, 32), (8, 40)] {
        a.op(LDX_W, R2, R8, val, 0);
        a.op(STX_W, R7, R2, pkt, 0);
    }
    for (pkt, val) in [(4, 36), (6, 38)] {
        a.op(LDX_H, R2, R8, val, 0);
        a.op(STX_H, R7, R2, pkt, 0);
    }
    a.op(ST_B, R7, 0, 22, 64); // TTL
                               // Counters: (packets, payload bytes) in the route's per-CPU slot.
    a.op(LDX_W, R2, R8, 28, 0);
    a.op(STX_W, R10, R2, -12, 0);
    a.op(MOV64_REG, R2, R10, 0, 0);
    a.op(ADD64_IMM, R2, 0, 0, -12);
    a.ld_map_fd(R1, f.stats);
    a.op(CALL, 0, 0, 0, HELPER_MAP_LOOKUP_ELEM);
    a.jmp(JEQ_IMM, R0, 0, 0, "counted");
    a.op(LDX_DW, R1, R0, 0, 0);
    a.op(ADD64_IMM, R1, 0, 0, 1);
    a.op(STX_DW, R0, R1, 0, 0);
    a.op(LDX_DW, R1, R0, 8, 0);
    a.op(LDX_DW, R2, R10, -24, 0);
    a.op(ADD64_REG, R1, R2, 0, 0);
    a.op(STX_DW, R0, R1, 8, 0);
    a.label("counted");
    // Out of the egress interface (its devmap slot was filled before any entry existed).
    a.op(LDX_W, R2, R8, 24, 0);
    a.ld_map_fd(R1, f.devmap);
    a.op(MOV64_IMM, R3, 0, 0, 0);
    a.op(CALL, 0, 0, 0, HELPER_REDIRECT_MAP);
    a.op(EXIT, 0, 0, 0, 0);
}
