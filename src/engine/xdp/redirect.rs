//! Redirect failures: tracing programs on the kernel's `xdp_redirect_err` and devmap
//! transmit points count what the fast path redirected but the device did not send
//! ([`RedirectWatch`]), so those routes fall back to the AF_XDP path.

use super::*;

// ---- redirect failures ---------------------------------------------------------------------

/// Byte offsets the `xdp_devmap_xmit` program reads, from the running kernel's BTF.
#[derive(Clone, Copy, Debug)]
pub(super) struct DevOffsets {
    /// `net_device.ifindex`
    pub(super) ifindex: u32,
    /// `net_device.nd_net` (a `possible_net_t`, whose only member is the `struct net *`)
    pub(super) nd_net: u32,
    /// `net.ns` + `ns_common.inum`: the network namespace's inode number
    pub(super) inum: u32,
}

impl DevOffsets {
    pub(super) fn from_btf(btf: &Btf) -> Option<DevOffsets> {
        Some(DevOffsets {
            ifindex: btf.member_offset("net_device", "ifindex")?,
            nd_net: btf.member_offset("net_device", "nd_net")?,
            inum: btf.member_offset("net", "ns")? + btf.member_offset("ns_common", "inum")?,
        })
    }
}

/// The `xdp:xdp_redirect_err` program: a redirect through our devmap (`devmap_id`) that the
/// kernel refused before queueing it (egress down, frame over its MTU, no such slot) adds 1 to
/// `vgate_xerr[slot]`. Arguments: dev, prog, tgt, err, map_type, map_id @40, index @48.
pub(super) fn redirect_err_program(xerr_fd: i32, devmap_id: u32) -> Vec<bpf::Insn> {
    let mut a = Asm::new();
    a.op(LDX_DW, R2, R1, 40, 0);
    a.jmp(JNE32_IMM, R2, 0, devmap_id as i32, "out");
    a.op(LDX_DW, R2, R1, 48, 0);
    a.jmp(JGT_IMM, R2, 0, 1, "out");
    a.op(STX_W, R10, R2, -4, 0);
    a.op(MOV64_IMM, R3, 0, 0, 1);
    a.op(STX_DW, R10, R3, -16, 0);
    emit_add(&mut a, xerr_fd);
    a.finish()
}

/// The `xdp:xdp_devmap_xmit` program: after a devmap flush, frames the egress driver did not
/// take (`drops` @24) on one of our egress interfaces (`to_dev` @8), redirected by the XDP
/// program of one of the interfaces carrying vgate's (`from_dev` @0), are added to
/// `vgate_xerr[slot]`. Each device is matched by its ifindex and its network namespace's
/// inode (read with `bpf_probe_read_kernel` at offsets from BTF), so another XDP program
/// redirecting to the same egress does not count as ours. `egress` is (slot, ifindex) per
/// egress interface; `ingress` the ifindexes carrying vgate's XDP program (at most 4 used).
pub(super) fn devmap_xmit_program(
    xerr_fd: i32,
    off: DevOffsets,
    egress: &[(u32, u32)],
    ingress: &[u32],
    netns: u32,
) -> Vec<bpf::Insn> {
    let mut a = Asm::new();
    a.op(MOV64_REG, R6, R1, 0, 0);
    a.op(LDX_DW, R7, R6, 24, 0); // drops
    a.op(LSH64_IMM, R7, 0, 0, 32);
    a.op(RSH64_IMM, R7, 0, 0, 32);
    a.jmp(JEQ_IMM, R7, 0, 0, "out");
    a.jmp(JGT_IMM, R7, 0, 0xffff, "out");
    a.op(STX_DW, R10, R7, -16, 0);
    // from_dev: the interface whose XDP program redirected; one carrying ours.
    a.op(LDX_DW, R7, R6, 0, 0);
    emit_read_ifindex(&mut a, R7, off);
    a.op(LDX_W, R1, R10, -8, 0);
    for ifindex in ingress.iter().take(4) {
        a.jmp(JEQ32_IMM, R1, 0, *ifindex as i32, "from_ours");
    }
    a.jmp(JA, 0, 0, 0, "out");
    a.label("from_ours");
    emit_check_netns(&mut a, R7, off, netns);
    a.op(LDX_DW, R8, R6, 8, 0); // to_dev
    emit_read_ifindex(&mut a, R8, off);
    a.op(LDX_W, R9, R10, -8, 0);
    let labels: [&'static str; 2] = ["eg0", "eg1"];
    for (i, (slot, ifindex)) in egress.iter().take(2).enumerate() {
        a.jmp(JNE32_IMM, R9, 0, *ifindex as i32, labels[i]);
        a.op(MOV64_IMM, R9, 0, 0, *slot as i32);
        a.jmp(JA, 0, 0, 0, "ours");
        a.label(labels[i]);
    }
    a.jmp(JA, 0, 0, 0, "out");
    a.label("ours");
    // The same ifindex in another namespace is not ours.
    emit_check_netns(&mut a, R8, off, netns);
    a.op(STX_W, R10, R9, -4, 0);
    emit_add(&mut a, xerr_fd);
    for l in labels {
        if !a.has_label(l) {
            a.label(l);
        }
    }
    a.finish()
}

/// `bpf_probe_read_kernel(r10-8, size, src + offset)`; `out` when unreadable. Clobbers r0-r5.
pub(super) fn emit_probe_read(a: &mut Asm, size: i32, src: u8, offset: i32) {
    a.op(MOV64_REG, R1, R10, 0, 0);
    a.op(ADD64_IMM, R1, 0, 0, -8);
    a.op(MOV64_IMM, R2, 0, 0, size);
    if src != R3 {
        a.op(MOV64_REG, R3, src, 0, 0);
    }
    a.op(ADD64_IMM, R3, 0, 0, offset);
    a.op(CALL, 0, 0, 0, HELPER_PROBE_READ_KERNEL);
    a.jmp(JNE_IMM, R0, 0, 0, "out");
}

/// `dev->ifindex` (the `net_device *` in `dev`) into the u32 at r10-8; `out` when unreadable.
/// Clobbers r0-r5.
pub(super) fn emit_read_ifindex(a: &mut Asm, dev: u8, off: DevOffsets) {
    emit_probe_read(a, 4, dev, off.ifindex as i32);
}

/// Goes to `out` unless `dev->nd_net->ns.inum` is `netns`. Clobbers r0-r5 and r10-8.
pub(super) fn emit_check_netns(a: &mut Asm, dev: u8, off: DevOffsets, netns: u32) {
    emit_probe_read(a, 8, dev, off.nd_net as i32);
    a.op(LDX_DW, R3, R10, -8, 0);
    a.jmp(JEQ_IMM, R3, 0, 0, "out");
    emit_probe_read(a, 4, R3, off.inum as i32);
    a.op(LDX_W, R1, R10, -8, 0);
    a.jmp(JNE32_IMM, R1, 0, netns as i32, "out");
}

/// Adds the u64 at r10-16 to `vgate_xerr[u32 at r10-4]` (this CPU's value); then `out`:
/// returns 0.
pub(super) fn emit_add(a: &mut Asm, xerr_fd: i32) {
    a.op(MOV64_REG, R2, R10, 0, 0);
    a.op(ADD64_IMM, R2, 0, 0, -4);
    a.ld_map_fd(R1, xerr_fd);
    a.op(CALL, 0, 0, 0, HELPER_MAP_LOOKUP_ELEM);
    a.jmp(JEQ_IMM, R0, 0, 0, "out");
    a.op(LDX_DW, R1, R0, 0, 0);
    a.op(LDX_DW, R2, R10, -16, 0);
    a.op(ADD64_REG, R1, R2, 0, 0);
    a.op(STX_DW, R0, R1, 0, 0);
    a.label("out");
    a.op(MOV64_IMM, R0, 0, 0, 0);
    a.op(EXIT, 0, 0, 0, 0);
}

/// Counts the frames the kernel dropped after the fast path redirected them, per egress
/// interface (`vgate_xerr`, a per-CPU array indexed by the egress domain): two programs on
/// the kernel's XDP tracepoints, attached through fds (detached when vgate exits or dies).
pub(super) struct RedirectWatch {
    pub(super) xerr: Map,
    pub(super) _links: Vec<TpLink>,
    pub(super) _progs: Vec<Prog>,
    /// (tracepoint, program id) of what is attached.
    pub(super) attached: Vec<(&'static str, u32)>,
}

impl RedirectWatch {
    /// Attaches what it can; the second value says what could not be (said once in the log
    /// and in the engine's description).
    pub(super) fn open(
        devmap: &Map,
        egress: &[(u32, u32)],
        ingress: &[u32],
    ) -> (Option<RedirectWatch>, Vec<String>) {
        let mut missing = Vec::new();
        let xerr = match Map::create(bpf::BPF_MAP_TYPE_PERCPU_ARRAY, 4, 8, 2, "vgate_xerr") {
            Ok(m) => m,
            Err(e) => {
                missing.push(format!("map vgate_xerr: {e}"));
                return (None, missing);
            }
        };
        let mut w = RedirectWatch {
            xerr,
            _links: Vec::new(),
            _progs: Vec::new(),
            attached: Vec::new(),
        };
        let mut attach = |tp: &'static str, name: &'static str, insns: Vec<bpf::Insn>| {
            let prog = Prog::load_raw_tracepoint(&insns, name).map_err(|e| {
                if e.log.is_empty() {
                    e.source.to_string()
                } else {
                    format!("{}; verifier log:\n{}", e.source, e.log)
                }
            })?;
            let c = std::ffi::CString::new(tp).map_err(|e| e.to_string())?;
            let link = bpf::raw_tracepoint(&prog, &c).map_err(|e| e.to_string())?;
            let id = prog.id().unwrap_or(0);
            w._links.push(link);
            w._progs.push(prog);
            w.attached.push((tp, id));
            Ok::<(), String>(())
        };
        let fd = w.xerr.raw_fd();
        match devmap.id() {
            Ok(id) => {
                if let Err(e) = attach(
                    "xdp_redirect_err",
                    "vgate_xdperr",
                    redirect_err_program(fd, id),
                ) {
                    missing.push(format!("tracepoint xdp_redirect_err: {e}"));
                }
            }
            Err(e) => missing.push(format!("tracepoint xdp_redirect_err (devmap id): {e}")),
        }
        let offsets = Btf::vmlinux().map_err(|e| e.to_string()).and_then(|b| {
            DevOffsets::from_btf(&b).ok_or_else(|| {
                "net_device, net or ns_common members not in the kernel's BTF".to_string()
            })
        });
        let netns = netns_inode();
        match (offsets, netns) {
            (Ok(off), Ok(ns)) => {
                if let Err(e) = attach(
                    "xdp_devmap_xmit",
                    "vgate_xmiterr",
                    devmap_xmit_program(fd, off, egress, ingress, ns),
                ) {
                    missing.push(format!("tracepoint xdp_devmap_xmit: {e}"));
                }
            }
            (Err(e), _) => missing.push(format!("tracepoint xdp_devmap_xmit (kernel BTF): {e}")),
            (_, Err(e)) => missing.push(format!(
                "tracepoint xdp_devmap_xmit (network namespace): {e}"
            )),
        }
        if w.attached.is_empty() {
            return (None, missing);
        }
        (Some(w), missing)
    }

    /// Failures so far per egress domain, summed over CPUs.
    pub(super) fn read(&self, buf: &mut Vec<u8>) -> [u64; 2] {
        buf.resize(self.xerr.lookup_len(), 0);
        let mut out = [0u64; 2];
        for (d, o) in out.iter_mut().enumerate() {
            if self.xerr.lookup(&(d as u32).to_ne_bytes(), buf).is_ok() {
                *o = buf
                    .chunks_exact(8)
                    .map(|c| u64::from_ne_bytes(c.try_into().unwrap_or_default()))
                    .sum();
            }
        }
        out
    }
}

/// The inode of this thread's network namespace (what `ns_common.inum` holds).
pub(super) fn netns_inode() -> io::Result<u32> {
    use std::os::unix::fs::MetadataExt;
    Ok(std::fs::metadata("/proc/thread-self/ns/net")?.ino() as u32)
}
