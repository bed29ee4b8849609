//! The XDP program of mode zc/xdp, assembled at start: redirect the media ports' packets
//! to the AF_XDP sockets, and (mode xdp) the fast path for settled streams.

use super::*;

// ---- the XDP program ----------------------------------------------------------------------

/// The XDP program for an interface facing the domains whose gateway addresses and port-map
/// bits are `dsts`. `ports_fd` is the `vgate_ports` ARRAY, `xsks_fd` the interface's XSKMAP,
/// `noroute_fd` the `vgate_noroute` per-CPU ARRAY ([`NoRouteCount`]); with `fast` (mode
/// xdp), routed media may be forwarded in the kernel first (see [`super::xdp`]).
pub(super) fn xdp_program(
    ports_fd: i32,
    xsks_fd: i32,
    noroute_fd: i32,
    dsts: &[(Ipv4Addr, u32, u16, u16)],
    fast: Option<&FastFds>,
) -> Vec<Insn> {
    let mut a = Asm::new();
    a.op(MOV64_REG, R6, R1, 0, 0); // r6 = ctx
    a.op(LDX_W, R2, R6, 0, 0); // r2 = data
    a.op(LDX_W, R3, R6, 4, 0); // r3 = data_end
    a.op(MOV64_REG, R7, R2, 0, 0); // r7 = data (the fast path's frame)
    a.op(MOV64_IMM, R9, 0, 0, 1); // r9: the fast path may take it (untagged, IHL 5)
    a.op(MOV64_REG, R4, R2, 0, 0);
    a.op(ADD64_IMM, R4, 0, 0, 14);
    a.jmp(JGT_REG, R4, R3, 0, "pass"); // Ethernet header present
    a.op(LDX_H, R5, R2, 12, 0); // ethertype, network order
    a.jmp(JNE32_IMM, R5, 0, 0x0081, "untagged"); // not 802.1Q
    a.op(MOV64_REG, R4, R2, 0, 0);
    a.op(ADD64_IMM, R4, 0, 0, 18);
    a.jmp(JGT_REG, R4, R3, 0, "pass");
    a.op(LDX_H, R5, R2, 16, 0); // inner ethertype
    a.op(MOV64_IMM, R9, 0, 0, 0); // tagged: not for the fast path
    a.op(ADD64_IMM, R2, 0, 0, 4); // from here r2 + 14 is the IP header
    a.label("untagged");
    a.jmp(JNE32_IMM, R5, 0, 0x0008, "pass"); // IPv4
    a.op(MOV64_REG, R4, R2, 0, 0);
    a.op(ADD64_IMM, R4, 0, 0, 34);
    a.jmp(JGT_REG, R4, R3, 0, "pass"); // 20-byte IPv4 header present
    a.op(LDX_B, R5, R2, 14, 0); // version | IHL
    a.op(MOV64_REG, R4, R5, 0, 0);
    a.op(AND64_IMM, R4, 0, 0, 0xf0);
    a.jmp(JNE32_IMM, R4, 0, 0x40, "pass"); // version 4
    a.op(AND64_IMM, R5, 0, 0, 0x0f);
    a.jmp(JLT_IMM, R5, 0, 5, "pass"); // IHL >= 5; now r5 in [5, 15]
    if fast.is_some() {
        a.jmp(JEQ_IMM, R5, 0, 5, "no_options");
        a.op(MOV64_IMM, R9, 0, 0, 0); // IPv4 options: not for the fast path
        a.label("no_options");
    }
    a.op(LDX_B, R4, R2, 23, 0);
    a.jmp(JNE32_IMM, R4, 0, 17, "pass"); // UDP
    a.op(LDX_H, R4, R2, 20, 0);
    a.jmp(JSET32_IMM, R4, 0, 0xff3f, "pass"); // MF or a fragment offset: the kernel's
    a.op(LDX_W, R4, R2, 30, 0); // destination address
    a.op(MOV64_IMM, R8, 0, 0, 0);
    for (i, (addr, bit, _, _)) in dsts.iter().enumerate() {
        let next: &'static str = ["dst1", "dst2", "dst3"][i.min(2)];
        a.jmp(
            JNE32_IMM,
            R4,
            0,
            u32::from_le_bytes(addr.octets()) as i32,
            next,
        );
        a.op(MOV64_IMM, R8, 0, 0, *bit as i32);
        a.jmp(JA, 0, 0, 0, "have_dst");
        a.label(next);
    }
    a.jmp(JA, 0, 0, 0, "pass");
    a.label("have_dst");
    a.op(LSH64_IMM, R5, 0, 0, 2); // IHL in bytes: [20, 60]
    a.op(ADD64_REG, R2, R5, 0, 0); // r2 + 14 is the UDP header
    a.op(MOV64_REG, R4, R2, 0, 0);
    a.op(ADD64_IMM, R4, 0, 0, 22);
    a.jmp(JGT_REG, R4, R3, 0, "pass"); // UDP header present
    a.op(LDX_H, R4, R2, 16, 0); // destination port, network order
    a.op(BE, R4, 0, 0, 16); // to host order
                            // The whole media range of the domain is ours, routed or not: no datagram for it may
                            // reach the kernel's UDP layer (port unreachable, another socket); a port without a
                            // route is dropped here and counted in `vgate_noroute`.
    for (i, (_, bit, lo, hi)) in dsts.iter().enumerate() {
        let next: &'static str = ["rng1", "rng2", "rng3"][i.min(2)];
        a.jmp(JNE32_IMM, R8, 0, *bit as i32, next);
        a.jmp(JLT_IMM, R4, 0, i32::from(*lo), "pass");
        a.jmp(JGT_IMM, R4, 0, i32::from(*hi), "pass");
        a.jmp(JA, 0, 0, 0, "in_range");
        a.label(next);
    }
    a.jmp(JA, 0, 0, 0, "pass");
    a.label("in_range");
    // no_route's byte count: the payload the UDP length claims, but no more than the frame
    // holds (the length field is the sender's word).
    a.op(LDX_H, R5, R2, 18, 0); // UDP length, network order
    a.op(BE, R5, 0, 0, 16);
    a.jmp(JGT_IMM, R5, 0, 7, "ulen_ok");
    a.op(MOV64_IMM, R5, 0, 0, 8); // below its header: no payload
    a.label("ulen_ok");
    a.op(ADD64_IMM, R5, 0, 0, -8);
    a.op(MOV64_REG, R1, R3, 0, 0);
    a.op(SUB64_REG, R1, R2, 0, 0);
    a.op(ADD64_IMM, R1, 0, 0, -22); // payload in the frame: >= 0, the UDP header is there
    a.jmp(JGT_REG, R1, R5, 0, "ulen_min"); // more in the frame (Ethernet padding)
    a.op(MOV64_REG, R5, R1, 0, 0);
    a.label("ulen_min");
    a.op(STX_W, R10, R5, -8, 0);
    a.op(STX_W, R10, R4, -4, 0); // key on the stack
    a.op(MOV64_REG, R2, R10, 0, 0);
    a.op(ADD64_IMM, R2, 0, 0, -4);
    a.ld_map_fd(R1, ports_fd);
    a.op(CALL, 0, 0, 0, HELPER_MAP_LOOKUP_ELEM);
    a.jmp(JEQ_IMM, R0, 0, 0, "no_route");
    a.op(LDX_W, R0, R0, 0, 0); // the port's domain bits
    a.op(0x5f, R0, R8, 0, 0); // r0 &= r8 (AND64_REG)
    a.jmp(JEQ_IMM, R0, 0, 0, "no_route"); // no route for this domain
    if let Some(f) = fast {
        a.jmp(JEQ_IMM, R9, 0, 0, "xsk");
        emit_fast(&mut a, f);
    }
    a.label("xsk");
    a.op(LDX_W, R2, R6, 16, 0); // ctx->rx_queue_index
    a.ld_map_fd(R1, xsks_fd);
    a.op(MOV64_IMM, R3, 0, 0, XDP_PASS); // no socket on this queue: to the kernel
    a.op(CALL, 0, 0, 0, HELPER_REDIRECT_MAP);
    a.op(EXIT, 0, 0, 0, 0);
    // A port of the range without a route: dropped, counted per ingress domain
    // (`vgate_noroute[bit >> 1]`: packets, payload bytes), so a flood to unrouted ports
    // does not share the workers' rings with routed media.
    a.label("no_route");
    a.op(MOV64_REG, R1, R8, 0, 0);
    a.op(RSH64_IMM, R1, 0, 0, 1); // bit 1 -> 0 (A), bit 2 -> 1 (B)
    a.op(STX_W, R10, R1, -4, 0);
    a.op(MOV64_REG, R2, R10, 0, 0);
    a.op(ADD64_IMM, R2, 0, 0, -4);
    a.ld_map_fd(R1, noroute_fd);
    a.op(CALL, 0, 0, 0, HELPER_MAP_LOOKUP_ELEM);
    a.jmp(JEQ_IMM, R0, 0, 0, "drop");
    a.op(LDX_DW, R1, R0, 0, 0);
    a.op(ADD64_IMM, R1, 0, 0, 1);
    a.op(STX_DW, R0, R1, 0, 0);
    a.op(LDX_W, R1, R10, -8, 0); // payload bytes
    a.op(LDX_DW, R2, R0, 8, 0);
    a.op(ADD64_REG, R2, R1, 0, 0);
    a.op(STX_DW, R0, R2, 8, 0);
    a.label("drop");
    a.op(MOV64_IMM, R0, 0, 0, XDP_DROP);
    a.op(EXIT, 0, 0, 0, 0);
    a.label("pass");
    a.op(MOV64_IMM, R0, 0, 0, XDP_PASS);
    a.op(EXIT, 0, 0, 0, 0);
    // Unused labels of the address and range chains must exist for the assembler.
    for l in ["dst1", "dst2", "dst3", "rng1", "rng2", "rng3"] {
        if !a.labels.contains_key(l) {
            a.labels.insert(l, a.labels["pass"]);
        }
    }
    a.finish()
}

/// Who fills the UDP checksum of an interface's AF_XDP TX frames, for the log and
/// [`Engine::describe`].
pub(super) fn csum_summary(modes: &[TxCsum]) -> String {
    let off = modes.iter().filter(|m| **m == TxCsum::Offload).count();
    match (off, modes.len() - off) {
        (0, _) => "UDP checksum computed in vgate".into(),
        (_, 0) => "UDP checksum left to the kernel/device (TX metadata)".into(),
        (o, s) => format!(
            "UDP checksum left to the kernel/device on {o} socket(s) (TX metadata), computed in vgate on {s}"
        ),
    }
}

/// The port-map bit of `domain`.
pub(super) fn bit(domain: DomainId) -> u32 {
    1 << domain.index()
}
