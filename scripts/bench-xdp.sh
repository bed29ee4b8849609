#!/usr/bin/env bash
# The XDP program's own cost per packet in modes zc and xdp, from the kernel's BPF run-time
# statistics (kernel.bpf_stats_enabled: run_time_ns / run_cnt of each program), on the
# three-namespace bed with N iperf2 streams of 10 Mbit/s. A figure that a machine busy with
# other work does not distort much (it is the program's own time, not the machine's), unlike
# the whole-machine CPU of scripts/bench-channel.sh. See docs/bench-xdp.md.
#
#   scripts/bench-xdp.sh [--streams N] [--seconds S] [--modes "zc xdp"]     (as root)
#
# Needs root, iproute2, ethtool, iperf, bpftool, target/release/vgate (cargo build --release).
# kernel.bpf_stats_enabled is machine-wide: it is set for the measurement and put back.
set -euo pipefail
cd "$(dirname "$0")/.."

N=20
SECS=3
MODES="zc xdp"
while [ $# -gt 0 ]; do
    case "$1" in
        --streams) N="${2:?}"; shift 2 ;;
        --seconds) SECS="${2:?}"; shift 2 ;;
        --modes) MODES="${2:?}"; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "bench-xdp: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" -eq 0 ] || { echo "bench-xdp: needs root" >&2; exit 1; }
for t in ip ethtool iperf bpftool timeout; do
    command -v "$t" >/dev/null || { echo "bench-xdp: $t not found" >&2; exit 1; }
done
[ -x target/release/vgate ] || { echo "bench-xdp: run cargo build --release first" >&2; exit 1; }

WORK=$(mktemp -d /tmp/bench-xdp.XXXXXX)
cp target/release/vgate "$WORK/vgate"
BED="vgxb$$"
STATS_WAS=$(sysctl -n kernel.bpf_stats_enabled)
VG=""
cleanup() {
    [ -n "$VG" ] && kill -TERM "$VG" 2>/dev/null && wait "$VG" 2>/dev/null
    sysctl -qw kernel.bpf_stats_enabled="$STATS_WAS"
    scripts/testbed.sh --name "$BED" down >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

scripts/testbed.sh --name "$BED" --queues 2 up > "$WORK/bed.env"
# shellcheck disable=SC1091
. "$WORK/bed.env"
ip netns exec "$A_NS" ethtool -K "$A_IF" tx off >/dev/null
ip netns exec "$B_NS" ethtool -K "$B_IF" gro on >/dev/null

config() { # mode
    printf '[domains.a]\ninterface = "%s"\naddress = "%s"\nnetworks = ["10.201.1.0/24"]\nmedia_ports = "20000-29999"\n' "$GA_IF" "$GA_IP"
    printf '[domains.b]\ninterface = "%s"\naddress = "%s"\nnetworks = ["10.201.2.0/24"]\nmedia_ports = "30000-39999"\n' "$GB_IF" "$GB_IP"
    # "any": iperf's datagrams are not RTP, and a latch route latches only on RTP.
    printf '[engine]\nmode = "%s"\nqueues = 1\ncpus = [1]\n[security]\nsource_validation = "any"\n' "$1"
    printf '[control]\nlisten = "127.0.0.1:9949"\n'
    for ((i = 0; i < N; i++)); do
        printf '[[stream_route]]\nname = "s%d"\ndomain = "a"\nport = %d\ndestination = "%s:%d"\negress_port = %d\n' \
            "$i" $((20000 + i)) "$B_IP" $((40000 + i)) $((30000 + i))
    done
}

echo "| mode | N | packets through the program | ns per packet (program) | vgate's forward totals |"
echo "|---|---:|---:|---:|---|"
for mode in $MODES; do
    config "$mode" > "$WORK/vgate.toml"
    ip netns exec "$G_NS" "$WORK/vgate" run --config "$WORK/vgate.toml" --stats-interval 0 \
        > "$WORK/out" 2> "$WORK/log" &
    VG=$!
    for _ in $(seq 100); do grep -q "static stream routes installed" "$WORK/log" && break; sleep 0.1; done
    grep -q "static stream routes installed" "$WORK/log" || { echo "| $mode | $N | vgate did not start: $(grep -m1 -i error "$WORK/log" | sed 's/\x1b\[[0-9;]*m//g') |"; kill -TERM "$VG" 2>/dev/null; wait "$VG" 2>/dev/null; VG=""; continue; }
    ids=$(sed 's/\x1b\[[0-9;]*m//g' "$WORK/log" | grep -o 'vgate_xdp id [0-9]*' | awk '{print $3}')
    timeout $((SECS + 20)) ip netns exec "$B_NS" iperf -s -u -B "$B_IP" -p "40000-$((40000 + N - 1))" \
        > "$WORK/server" 2>&1 &
    srv=$!
    sleep 1
    sysctl -qw kernel.bpf_stats_enabled=1
    base_t=0 base_c=0
    for id in $ids; do
        read -r t c < <(bpftool prog show id "$id" | grep -o 'run_time_ns [0-9]* run_cnt [0-9]*' | awk '{print $2, $4}' || echo "0 0")
        base_t=$((base_t + ${t:-0})) base_c=$((base_c + ${c:-0}))
    done
    timeout $((SECS + 15)) ip netns exec "$A_NS" iperf -c "$GA_IP" -p "20000-$((20000 + N - 1))" -u \
        -b 10000000 -l 1316 -t "$SECS" > "$WORK/client" 2>&1 || true
    tot_t=0 tot_c=0
    for id in $ids; do
        read -r t c < <(bpftool prog show id "$id" | grep -o 'run_time_ns [0-9]* run_cnt [0-9]*' | awk '{print $2, $4}' || echo "0 0")
        tot_t=$((tot_t + ${t:-0})) tot_c=$((tot_c + ${c:-0}))
    done
    sysctl -qw kernel.bpf_stats_enabled="$STATS_WAS"
    sleep 1
    kill -INT "$srv" 2>/dev/null || true
    wait "$srv" 2>/dev/null || true
    kill -TERM "$VG"; wait "$VG" 2>/dev/null || true; VG=""
    runs=$((tot_c - base_c)) ns=$((tot_t - base_t))
    fwd=$(grep '^total channel=forward' "$WORK/out" | tr ' ' '\n' | grep -E '^(rx_packets|tx_packets|drop_[a-z_]*)=' | tr '\n' ' ')
    per=$([ "$runs" -gt 0 ] && awk -v a="$ns" -v b="$runs" 'BEGIN {printf "%.0f", a / b}' || echo "–")
    echo "| $mode | $N | $runs | $per | $fwd |"
done
