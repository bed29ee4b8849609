# shellcheck shell=bash
# QEMU's accelerator for scripts/pfring-guest.sh (sourced): `qemu_accel auto|kvm|tcg KERNEL`
# sets QEMU_ACCEL (QEMU's arguments) and ACCEL_USED (kvm or tcg), or says why not and
# returns 1 (kvm asked for and not working).
#
# KVM wants `-cpu host` without arch-capabilities: with it QEMU 7.2 dies setting MSR 0x10a
# on this host's KVM. Whether KVM runs a guest at all is found by booting KERNEL without a
# root file system: it must reach its "Kernel panic" (then -no-reboot ends QEMU) within the
# probe's 30 s; a KVM that hangs or fails means TCG, with a message (auto). KVM_DEV (default
# /dev/kvm) is the device the probe needs read and write access to.
KVM_ARGS=(-accel kvm -cpu "host,-arch-capabilities")
TCG_ARGS=(-accel tcg -cpu max)

# Boots KERNEL under KVM; on failure prints why.
kvm_boots() {
    local dev="${KVM_DEV:-/dev/kvm}" out rc
    if ! [ -r "$dev" ] || ! [ -w "$dev" ]; then echo "no usable $dev"; return 1; fi
    out="$(timeout 30 nice -n 10 qemu-system-x86_64 "${KVM_ARGS[@]}" -smp 1 -m 256 -nodefaults \
        -display none -no-reboot -serial stdio -monitor none -kernel "$1" \
        -append "console=ttyS0 panic=-1 root=/dev/vgate-no-root" 2>&1)"
    rc=$?
    if grep -q "Kernel panic" <<<"$out"; then return 0; fi
    [ "$rc" = 124 ] && { echo "no kernel panic within 30 s (hung)"; return 1; }
    echo "qemu exit $rc: $(tail -3 <<<"$out" | tr -d '\r' | tr '\n' ' ')"
    return 1
}

# shellcheck disable=SC2034 # QEMU_ACCEL is the caller's
qemu_accel() {
    local want="$1" kernel="$2" why
    case "$want" in
        tcg) QEMU_ACCEL=("${TCG_ARGS[@]}"); ACCEL_USED=tcg ;;
        auto | kvm)
            if why="$(kvm_boots "$kernel")"; then
                QEMU_ACCEL=("${KVM_ARGS[@]}"); ACCEL_USED=kvm
            elif [ "$want" = kvm ]; then
                echo "pfring-guest.sh: --accel kvm: KVM did not boot the guest kernel ($why)" >&2
                return 1
            else
                echo "pfring-guest.sh: KVM did not boot the guest kernel ($why): using TCG (software emulation, about 10 times slower)" >&2
                QEMU_ACCEL=("${TCG_ARGS[@]}"); ACCEL_USED=tcg
            fi ;;
        *) echo "pfring-guest.sh: --accel $want: auto, kvm or tcg" >&2; return 1 ;;
    esac
    export ACCEL_USED
}
