//! A tiny eBPF assembler ([`Asm`]: instructions plus forward jumps to named labels), its
//! registers and opcodes: what the XDP programs of `afxdp` (redirect) and [`super::xdp`]
//! (the fast path) are written with. No I/O; loading is `sys::bpf`.

use std::collections::HashMap;

use super::sys::bpf::Insn;

/// A tiny eBPF assembler: instructions plus forward jumps to named labels.
pub(super) struct Asm {
    pub(super) insns: Vec<Insn>,
    /// (instruction index, label)
    pub(super) fixups: Vec<(usize, &'static str)>,
    pub(super) labels: HashMap<&'static str, usize>,
}

pub(super) const R0: u8 = 0;
pub(super) const R1: u8 = 1;
pub(super) const R2: u8 = 2;
pub(super) const R3: u8 = 3;
pub(super) const R4: u8 = 4;
pub(super) const R5: u8 = 5;
pub(super) const R6: u8 = 6;
pub(super) const R7: u8 = 7;
pub(super) const R8: u8 = 8;
pub(super) const R9: u8 = 9;
pub(super) const R10: u8 = 10;

// Opcodes (class | size/op | source).
pub(super) const LDX_W: u8 = 0x61;
pub(super) const LDX_H: u8 = 0x69;
pub(super) const LDX_B: u8 = 0x71;
pub(super) const STX_W: u8 = 0x63;
pub(super) const MOV64_IMM: u8 = 0xb7;
pub(super) const MOV64_REG: u8 = 0xbf;
pub(super) const ADD64_IMM: u8 = 0x07;
pub(super) const ADD64_REG: u8 = 0x0f;
pub(super) const AND64_IMM: u8 = 0x57;
pub(super) const LSH64_IMM: u8 = 0x67;
pub(super) const BE: u8 = 0xdc;
pub(super) const JA: u8 = 0x05;
pub(super) const JGT_REG: u8 = 0x2d;
pub(super) const JEQ_IMM: u8 = 0x15;
pub(super) const JLT_IMM: u8 = 0xa5;
pub(super) const JGT_IMM: u8 = 0x25;
pub(super) const JNE32_IMM: u8 = 0x56;
pub(super) const JSET32_IMM: u8 = 0x46;
pub(super) const CALL: u8 = 0x85;
pub(super) const EXIT: u8 = 0x95;
pub(super) const LD_IMM64: u8 = 0x18;
pub(super) const PSEUDO_MAP_FD: u8 = 1;
pub(super) const HELPER_MAP_LOOKUP_ELEM: i32 = 1;
pub(super) const HELPER_REDIRECT_MAP: i32 = 51;
pub(super) const XDP_PASS: i32 = 2;
pub(super) const XDP_DROP: i32 = 1;
pub(super) const LDX_DW: u8 = 0x79;
pub(super) const SUB64_REG: u8 = 0x1f;
pub(super) const STX_DW: u8 = 0x7b;
pub(super) const RSH64_IMM: u8 = 0x77;
pub(super) const STX_H: u8 = 0x6b;
pub(super) const ST_B: u8 = 0x72;
pub(super) const SUB64_IMM: u8 = 0x17;
pub(super) const OR64_REG: u8 = 0x4f;
pub(super) const XOR64_IMM: u8 = 0xa7;
pub(super) const XOR32_IMM: u8 = 0xa4;
pub(super) const JNE_REG: u8 = 0x5d;
pub(super) const JNE_IMM: u8 = 0x55;
pub(super) const JEQ32_IMM: u8 = 0x16;
pub(super) const JLE_IMM: u8 = 0xb5;
pub(super) const JSET_IMM: u8 = 0x45;

impl Asm {
    pub(super) fn new() -> Asm {
        Asm {
            insns: Vec::new(),
            fixups: Vec::new(),
            labels: HashMap::new(),
        }
    }

    pub(super) fn op(&mut self, code: u8, dst: u8, src: u8, off: i16, imm: i32) {
        self.insns.push(Insn {
            code,
            regs: (src << 4) | dst,
            off,
            imm,
        });
    }

    /// A conditional (or, with `JA`, unconditional) jump to `label`, placed later.
    pub(super) fn jmp(&mut self, code: u8, dst: u8, src: u8, imm: i32, label: &'static str) {
        self.fixups.push((self.insns.len(), label));
        self.op(code, dst, src, 0, imm);
    }

    pub(super) fn label(&mut self, name: &'static str) {
        self.labels.insert(name, self.insns.len());
    }

    pub(super) fn has_label(&self, name: &'static str) -> bool {
        self.labels.contains_key(name)
    }

    pub(super) fn ld_map_fd(&mut self, dst: u8, fd: i32) {
        self.op(LD_IMM64, dst, PSEUDO_MAP_FD, 0, fd);
        self.op(0, 0, 0, 0, 0);
    }

    pub(super) fn finish(mut self) -> Vec<Insn> {
        for (at, label) in self.fixups {
            let target = self.labels[label];
            self.insns[at].off = (target as isize - at as isize - 1) as i16;
        }
        self.insns
    }
}
