#!/bin/bash
# PID 1 of the guest that scripts/pfring-guest.sh boots: mounts what the tests need, loads
# pf_ring.ko, runs the suites named in /opt/vgate-guest.env and powers off. Every line the
# host reads starts with VGATE-GUEST; the last is VGATE-GUEST-RESULT pass|fail.
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8 RUST_BACKTRACE=1 CI=true
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm /run /tmp /sys/fs/bpf
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
mount -t bpf bpf /sys/fs/bpf
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
mkdir -p /run/netns
hostname vgate-guest
ip link set lo up
# shellcheck disable=SC1091
. /opt/vgate-guest.env
export ACCEL
export LD_LIBRARY_PATH=/opt/pfring/lib
MODS="/opt/pfring/modules/$KVER"
failed=0
say() { echo "VGATE-GUEST $*"; }
finish() {
    if [ "$failed" = 0 ]; then say "RESULT pass"; echo "VGATE-GUEST-RESULT pass"
    else echo "VGATE-GUEST-RESULT fail"; fi
    sync
    echo o >/proc/sysrq-trigger
    sleep 10
}
trap finish EXIT

for m in veth nf_tables nft_chain_nat nf_conntrack tun virtio_net; do modprobe "$m" 2>/dev/null; done
say "kernel $(uname -r), $(nproc) CPUs, accelerator ${ACCEL:-tcg}"

# The test binary whose target is $1 (kind test or lib); $2... are its arguments.
bin() { awk -v n="$1" '$1 == n { print $2; exit }' /opt/vgate-tests; }
run() {
    local label="$1" name="$2"; shift 2
    local exe; exe="$(bin "$name")"
    if [ -z "$exe" ]; then say "FAIL $label: no test binary $name"; failed=1; return; fi
    local t0=$SECONDS d0; d0="$(softnet_drops)"
    say "RUN $label: $name $*"
    # A bounded run: a kernel lockup in one suite must not stall the others.
    if (cd "$REPO" && timeout -k 10 900 "$exe" --test-threads=1 --nocapture "$@" 2>&1); then
        say "PASS $label ($((SECONDS - t0)) s)"
    else
        say "FAIL $label ($((SECONDS - t0)) s)"; failed=1
    fi
    # Packets the kernel dropped before any ring saw them (a CPU's input backlog full).
    say "softnet drops during $label: $(( $(softnet_drops) - d0 ))"
}
# The sum of /proc/net/softnet_stat's second column (per-CPU backlog drops, hex).
softnet_drops() {
    local sum=0 d
    while read -r _ d _; do sum=$((sum + 16#$d)); done </proc/net/softnet_stat
    echo "$sum"
}
has() { case ",$SUITES," in *",$1,"*) return 0 ;; esac; return 1; }

# Before the module: the engines must fail with the errno-97 sentence.
has pfring && run "pfring, no module" pfring

# force_ring_lock=1: the beds' veths are software interfaces, whose one RX queue several CPUs
# feed at once; without it pf_ring.ko writes a one-channel ring unlocked and vgate refuses it.
insmod "$MODS/pf_ring.ko" force_ring_lock=1 || { say "FAIL insmod pf_ring.ko"; failed=1; exit; }
say "pf_ring.ko loaded: $(head -3 /proc/net/pf_ring/info | tr -s ' ' | tr '\n' ';')"

# The unit tests of the engines (the whole lib suite under TCG would take most of the run).
has unit && { run "unit, pfring-sys" pfring_sys; run "unit, vgate engine::" vgate engine::; }
has pfring && run "pfring, module loaded" pfring --skip zc_
if has zc; then
    if [ -f "$MODS/e1000e.ko" ]; then
        modprobe ptp 2>/dev/null
        # ZC takes its buffers from huge pages.
        mkdir -p /dev/hugepages
        mount -t hugetlbfs nodev /dev/hugepages
        echo 128 >/proc/sys/vm/nr_hugepages
        if insmod "$MODS/e1000e.ko"; then
            sleep 2
            ifof() { for d in /sys/class/net/*; do [ "$(cat "$d/address")" = "$1" ] && basename "$d"; done; }
            VGATE_ZC_A="$(ifof 52:54:00:00:0a:01)" VGATE_ZC_PA="$(ifof 52:54:00:00:0a:02)" \
                VGATE_ZC_B="$(ifof 52:54:00:00:0b:01)" VGATE_ZC_PB="$(ifof 52:54:00:00:0b:02)"
            export VGATE_ZC_A VGATE_ZC_PA VGATE_ZC_B VGATE_ZC_PB
            say "zc NICs: A $VGATE_ZC_A (peer $VGATE_ZC_PA), B $VGATE_ZC_B (peer $VGATE_ZC_PB); $(ethtool -i "$VGATE_ZC_A" 2>/dev/null | head -2 | tr '\n' ' ')"
            run "zc e1000e" pfring zc_
        else
            say "FAIL insmod e1000e.ko (PF_RING ZC driver)"; failed=1
        fi
    else
        say "FAIL zc: $MODS/e1000e.ko (PF_RING's e1000e ZC driver) not supplied"; failed=1
    fi
fi
# The media validation actions on the pfring engine's packets (mode tnapi in a PF_RING build):
# strip rewrites the ring's copy in place before it is sent, enforce drops what is not media.
if has media; then
    run "tnapi media_strip_netns" media_strip_netns --exact \
        strip_cuts_covert_data_and_the_streams_still_decode_tnapi
    run "tnapi media_validate_netns" media_validate_netns --exact \
        real_encoder_crosses_and_random_payload_is_dropped_tnapi
fi
if has sip; then
    # Under TCG sipp and the gateway run far slower than on the host (load-dependent): the same
    # 50 calls, started 2 a second instead of 10, within 300 s instead of 90. Under KVM the
    # test's own pace.
    if [ "${ACCEL:-tcg}" = tcg ]; then export VGATE_TEST_SIP_RATE=2 VGATE_TEST_SIP_TIMEOUT=300; fi
    VGATE_TEST_SIP_MODE=tnapi run "tnapi sip_netns" sip_netns sip_gb_calls
    # The same flow on AF_PACKET in the same guest: what pfring must match; and in mode stack
    # (no ring at all): whether a failure is the capture engines' or the guest's pace.
    VGATE_TEST_SIP_MODE=tnapi VGATE_TEST_SIP_ENGINE=afpacket \
        run "tnapi/afpacket sip_netns" sip_netns sip_gb_calls
    VGATE_TEST_SIP_MODE=stack run "stack sip_netns" sip_netns sip_gb_calls
fi
if has tnapi; then
    run "tnapi portless_netns" portless_netns tnapi
    run "tnapi restart_netns" restart_netns tnapi
    run "tnapi engine_netns" engine_netns tnapi
    run "tnapi channel_netns" channel_netns tnapi
fi
# channel_netns alone in mode tnapi: with pf_ring.ko's default (force_ring_lock=0) vgate must
# refuse the bed's one-channel veth ring (two CPUs wrote its slots at once: route counts off,
# iperf "losses"), then with force_ring_lock=1 channel_netns and engine_netns must pass.
reload_pf_ring() {
    if ! { rmmod pf_ring && insmod "$MODS/pf_ring.ko" "force_ring_lock=$1"; }; then
        say "FAIL reloading pf_ring.ko with force_ring_lock=$1"
        failed=1
        return 1
    fi
}
if has channel; then
    if reload_pf_ring 0; then
        say "RUN tnapi channel_netns (force_ring_lock=0): vgate must refuse"
        out="$(cd "$REPO" && timeout -k 10 900 "$(bin channel_netns)" --test-threads=1 --nocapture tnapi 2>&1)"
        if grep -q "pf_ring.ko locks a ring of one channel only with force_ring_lock=1" <<<"$out"; then
            say "PASS tnapi channel_netns (force_ring_lock=0): refused: $(grep -o 'ring [^ ]* would be written[^;]*' <<<"$out" | head -1)"
        else
            echo "$out" | tail -40; say "FAIL tnapi channel_netns (force_ring_lock=0): not refused"; failed=1
        fi
    fi
    if reload_pf_ring 1; then
        run "tnapi channel_netns (force_ring_lock=1)" channel_netns tnapi
        run "tnapi engine_netns (force_ring_lock=1)" engine_netns tnapi
    fi
fi
if has bench; then
    say "RUN bench"
    if (cd "$REPO" && VGATE_BIN="$REPO/target/debug/vgate" bash scripts/pfring-guest-bench.sh 2>&1); then
        say "PASS bench"
    else
        say "FAIL bench"; failed=1
    fi
fi
