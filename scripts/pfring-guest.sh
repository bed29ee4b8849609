#!/usr/bin/env bash
# Runs vgate's PF_RING engines for real, in a QEMU guest that can load pf_ring.ko.
#
# The host here cannot load kernel modules; a guest can. This script boots Debian's
# linux-image-cloud-amd64 under QEMU (KVM when /dev/kvm boots a guest, else software
# emulation, TCG) on a Debian 12 root file
# system made with debootstrap (cached under target/pfring-guest/), with an operator-supplied
# PF_RING installation (--pfring DIR), copies the test binaries built on the host into the
# guest at the same path, loads pf_ring.ko there and runs the PF_RING suites. The guest's
# serial console goes to target/pfring-guest/console.log; the exit code is the guest's
# test result. It never downloads or builds PF_RING itself: see docs/pfring.md.
#
# --pfring DIR must hold:
#   DIR/lib/libpfring.so*          PF_RING's userland library (with its ZC object)
#   DIR/include/pfring.h, DIR/include/linux/pf_ring.h   the headers bindgen reads
#   DIR/modules/KVER/pf_ring.ko    the module built for the guest kernel KVER
#   DIR/modules/KVER/e1000e.ko     optional: PF_RING's e1000e ZC driver (for --suite zc)
set -euo pipefail

usage() {
    cat <<'EOF'
usage: scripts/pfring-guest.sh --pfring DIR [--suite LIST] [--accel auto|kvm|tcg] [--timeout SECS]
                               [--no-build]

  --pfring DIR    PF_RING installation: lib/libpfring.so*, include/{pfring.h,linux/pf_ring.h},
                  modules/KVER/pf_ring.ko (KVER = the guest kernel, see below), optionally
                  modules/KVER/e1000e.ko (PF_RING's e1000e ZC driver)
  --suite LIST    comma-separated, default "unit,pfring,zc,media,sip,tnapi,bench":
                    unit    vgate's and pfring-sys's unit tests built with --features pfring
                    pfring  tests/pfring.rs (the PF_RING engines from the outside)
                    tnapi   namespace suites with mode tnapi (engine pfring) on veth pairs:
                            portless, restart, engine, channel
                    sip     the GB/T 28181 SIP flow with RTP (sip_netns): mode tnapi on pfring,
                            then afpacket, then mode stack (no ring)
                    media   media_strip_netns and media_validate_netns in mode tnapi (engine
                            pfring): validate = "strip" / "enforce" on the ring's packets
                    zc      mode zc, engine pfring-zc, on two emulated e1000e NICs
                    channel channel_netns alone in mode tnapi: refused at pf_ring.ko's default
                            (force_ring_lock=0), then with force_ring_lock=1 channel_netns and
                            engine_netns (not in the default list)
                    bench   the relay bench in miniature: every mode side by side
  --accel A       auto (default): KVM when /dev/kvm boots the guest kernel (a probe boot of
                  a few seconds), else TCG with a message; kvm: KVM or fail; tcg: TCG
  --timeout SECS  kill the guest after this long (default 2400)
  --no-build      use the test binaries already built (cargo test --features pfring --no-run)
  -h, --help      this text

Needs root on the host and Debian packages qemu-system-x86, debootstrap, e2fsprogs and
linux-image-cloud-amd64 (the guest kernel, taken from /boot). Output: the guest console in
target/pfring-guest/console.log; exit status 0 only when every guest suite passed.
EOF
}

PFRING=""
SUITES="unit,pfring,zc,media,sip,tnapi,bench"
TIMEOUT=2400
BUILD=1
ACCEL=auto
while [ $# -gt 0 ]; do
    case "$1" in
        --pfring) PFRING="${2:?--pfring needs a directory}"; shift 2 ;;
        --suite) SUITES="${2:?--suite needs a list}"; shift 2 ;;
        --timeout) TIMEOUT="${2:?--timeout needs seconds}"; shift 2 ;;
        --accel) ACCEL="${2:?--accel needs auto, kvm or tcg}"; shift 2 ;;
        --no-build) BUILD=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "pfring-guest.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done

die() { echo "pfring-guest.sh: $*" >&2; exit 2; }
case "$ACCEL" in auto|kvm|tcg) ;; *) die "--accel $ACCEL: auto, kvm or tcg" ;; esac

[ -n "$PFRING" ] || die "--pfring DIR is required (see --help and docs/pfring.md)"
PFRING="$(cd "$PFRING" && pwd)"
REPO="$(cd "$(dirname "$0")/.." && pwd)"
WORK="$REPO/target/pfring-guest"
mkdir -p "$WORK"

for c in qemu-system-x86_64 debootstrap mkfs.ext4 cargo; do
    command -v "$c" >/dev/null || die "$c not found (apt-get install qemu-system-x86 debootstrap e2fsprogs)"
done
KVER="$(find /boot -maxdepth 1 -name 'vmlinuz-*-cloud-amd64' -printf '%f\n' | sed 's/^vmlinuz-//' | sort -V | tail -1)"
[ -n "$KVER" ] || die "no /boot/vmlinuz-*-cloud-amd64: apt-get install linux-image-cloud-amd64"
[ -f "/boot/initrd.img-$KVER" ] || die "/boot/initrd.img-$KVER missing (update-initramfs -c -k $KVER)"
[ -d "/lib/modules/$KVER" ] || die "/lib/modules/$KVER missing"
[ -f "$PFRING/modules/$KVER/pf_ring.ko" ] ||
    die "$PFRING/modules/$KVER/pf_ring.ko missing: build PF_RING's kernel/ against linux-headers-$KVER"
ls "$PFRING"/lib/libpfring.so* >/dev/null 2>&1 || die "$PFRING/lib/libpfring.so* missing"

# QEMU's accelerator: KVM when it boots the guest kernel, else TCG (scripts/qemu-accel.sh).
# shellcheck source=scripts/qemu-accel.sh
. "$REPO/scripts/qemu-accel.sh"
qemu_accel "$ACCEL" "/boot/vmlinuz-$KVER" || exit 2

# 1. The root file system, made once.
#    Remade when its package list changes (the list is its marker's content). ffmpeg: the
#    media suites' encoder and ffprobe.
ROOT="$WORK/rootfs"
PKGS=iproute2,nftables,ethtool,kmod,procps,iperf,iperf3,sip-tester,python3,libpcap0.8,libelf1,zlib1g,libbpf1,libxdp1,busybox,ca-certificates,tcpdump,udev,socat,python3-matplotlib,ffmpeg
if [ "$(cat "$ROOT/.vgate-rootfs-done" 2>/dev/null)" != "$PKGS" ]; then
    rm -rf "$ROOT.tmp"
    nice -n 10 debootstrap --variant=minbase --include="$PKGS" \
        bookworm "$ROOT.tmp" http://deb.debian.org/debian
    echo "$PKGS" >"$ROOT.tmp/.vgate-rootfs-done"
    rm -rf "$ROOT"
    mv "$ROOT.tmp" "$ROOT"
fi

# 2. The test binaries, built on the host (compiling under TCG would take hours).
LIST="$WORK/binaries"
if [ "$BUILD" = 1 ]; then
    # Only the targets the guest runs (scripts/pfring-guest-init.sh).
    # target/debug/vgate is copied as soon as the PF_RING build made it: another cargo run in
    # the same tree (without the feature) rebuilds it, and the guest then ran a vgate "built
    # without PF_RING" (2026-12-03).
    (cd "$REPO" && export PFRING_DIR="$PFRING" &&
        nice -n 10 cargo test -p vgate --features pfring --no-run --message-format=json --lib \
            --test pfring --test engine_netns --test portless_netns --test restart_netns \
            --test channel_netns --test sip_netns --test media_strip_netns \
            --test media_validate_netns &&
        cp target/debug/vgate "$WORK/vgate" &&
        nice -n 10 cargo test -p pfring-sys --features pfring --no-run --message-format=json --lib) |
        python3 -c 'import json,sys
for l in sys.stdin:
    try: m=json.loads(l)
    except ValueError: continue
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        k = m["target"]["kind"][0]
        print(m["target"]["name"] + ("" if k in ("lib", "test") else "-" + k), m["executable"])' >"$LIST"
fi
[ -s "$LIST" ] || die "no test binaries listed in $LIST (run without --no-build)"
# A PF_RING build resolves libpfring's functions by name at run time.
grep -qa pfring_set_poll_watermark "$WORK/vgate" 2>/dev/null ||
    die "$WORK/vgate is not a PF_RING build of vgate (run without --no-build)"

# 3. What goes into the guest: the kernel's modules, PF_RING, the tree's scripts and tests,
#    the binaries, at the host's paths (the tests know their paths from compile time).
STAGE="$WORK/stage"
rm -rf "$STAGE"
mkdir -p "$STAGE/opt/pfring" "$STAGE/usr/lib/modules" "$STAGE$REPO/target/debug"
cp -a "/lib/modules/$KVER" "$STAGE/usr/lib/modules/"
cp -a "$PFRING/lib" "$PFRING/modules" "$STAGE/opt/pfring/"
cp -a "$REPO/scripts" "$REPO/tests" "$REPO/Cargo.toml" "$STAGE$REPO/"
cp -a "$WORK/vgate" "$STAGE$REPO/target/debug/"
# The bench (bench-channel.sh --no-build) runs target/release/vgate: in the guest that is this
# PF_RING build (debug: under emulation the figures mean nothing anyway).
mkdir -p "$STAGE$REPO/target/release"
cp -a "$WORK/vgate" "$STAGE$REPO/target/release/vgate"
while read -r name exe; do
    mkdir -p "$STAGE$(dirname "$exe")"
    cp -a "$exe" "$STAGE$exe"
    echo "$name $exe"
done <"$LIST" >"$STAGE/opt/vgate-tests"
cp "$REPO/scripts/pfring-guest-init.sh" "$STAGE/vgate-guest-init"
chmod +x "$STAGE/vgate-guest-init"
printf 'SUITES=%s\nREPO=%s\nKVER=%s\nACCEL=%s\n' "$SUITES" "$REPO" "$KVER" "$ACCEL_USED" \
    >"$STAGE/opt/vgate-guest.env"

# 4. One ext4 image of root fs + stage (mkfs.ext4 -d: no loop device needed).
IMG="$WORK/guest.img"
rm -f "$IMG"
MERGED="$WORK/merged"
rm -rf "$MERGED"
cp -a --reflink=auto "$ROOT" "$MERGED"
cp -a "$STAGE/." "$MERGED/"
SIZE_MB=$(( $(du -sm "$MERGED" | cut -f1) * 13 / 10 + 512 ))
mkfs.ext4 -q -F -L vgate -d "$MERGED" "$IMG" "${SIZE_MB}M"
rm -rf "$MERGED"

# 5. Boot. Two e1000e NICs for vgate (ZC), each joined by a QEMU hub to a virtio peer NIC.
LOG="$WORK/console.log"
: >"$LOG"
echo "pfring-guest.sh: booting $KVER under $ACCEL_USED (console: $LOG)"
start=$(date +%s)
set +e
timeout "$TIMEOUT" nice -n 10 qemu-system-x86_64 "${QEMU_ACCEL[@]}" -smp 2 -m 3072 \
    -nographic -no-reboot -serial "file:$LOG" -monitor none \
    -kernel "/boot/vmlinuz-$KVER" -initrd "/boot/initrd.img-$KVER" \
    -append "root=/dev/vda rw console=ttyS0 init=/vgate-guest-init panic=-1 net.ifnames=0" \
    -drive "file=$IMG,format=raw,if=virtio" \
    -netdev hubport,id=za,hubid=1 -device e1000e,netdev=za,mac=52:54:00:00:0a:01 \
    -netdev hubport,id=pa,hubid=1 -device virtio-net-pci,netdev=pa,mac=52:54:00:00:0a:02 \
    -netdev hubport,id=zb,hubid=2 -device e1000e,netdev=zb,mac=52:54:00:00:0b:01 \
    -netdev hubport,id=pb,hubid=2 -device virtio-net-pci,netdev=pb,mac=52:54:00:00:0b:02
qrc=$?
set -e
echo "pfring-guest.sh: guest ran $(( $(date +%s) - start )) s (qemu exit $qrc)"
grep -a '^VGATE-GUEST' "$LOG" || true
# The serial console's lines end in CR LF.
result="$(grep -a '^VGATE-GUEST-RESULT ' "$LOG" | tail -1 | tr -d '\r' | awk '{print $2}')"
case "$result" in
    pass) exit 0 ;;
    fail) exit 1 ;;
    *) echo "pfring-guest.sh: the guest printed no result (crash or timeout); see $LOG" >&2; exit 1 ;;
esac
