#!/usr/bin/env bash
# What an idle mode-xdp gateway costs with many routes: worker 0 reads the fast path's
# counters every 100 ms. For each route count, vgate runs on the three-namespace bed with that
# many static routes (all on the fast path, nothing sent) and this prints its system calls and
# context switches per second (perf stat, all threads) and its CPU time per second, plus the
# size of the XDP program it loaded (bpftool, when installed).
#
#   scripts/bench/xdp-poll-cost.sh [--no-build] [ROUTES ...]      (as root; default 100 10000)
#
# Routes need two open files each: the count is capped by the open-file limit.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=1
[ "${1:-}" = --no-build ] && { BUILD=0; shift; }
COUNTS=("$@"); [ ${#COUNTS[@]} -gt 0 ] || COUNTS=(100 10000)
[ "$(id -u)" -eq 0 ] || { echo "xdp-poll-cost: needs root" >&2; exit 1; }
command -v perf >/dev/null || { echo "xdp-poll-cost: perf not found" >&2; exit 1; }
[ "$BUILD" = 1 ] && cargo build --release --quiet
{ ulimit -Hn 65536 && ulimit -Sn 65536; } 2>/dev/null || true
MAX=$(( ($(ulimit -n) - 200) / 2 ))
WORK=$(mktemp -d /tmp/xdp-poll-cost.XXXXXX)
BED="vgxpc$$"
W=""
cleanup() {
    [ -n "$W" ] && { kill -TERM "$W" 2>/dev/null || true; wait "$W" 2>/dev/null || true; }
    scripts/testbed.sh --name "$BED" down || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
scripts/testbed.sh --name "$BED" --queues 2 up > "$WORK/bed.env"
# shellcheck disable=SC1091
. "$WORK/bed.env"
NCPU=$(nproc) RELAY_CPU=$(( $(nproc) > 1 ? 1 : 0 )) GEN_CPU=0 A_BASE=20000 EG_BASE=30000 SINK_BASE=40000
ADMIN=127.0.0.1:9953
# shellcheck disable=SC1091
. scripts/bench/bed-lib.sh
xdp_bed
echo "uptime: $(uptime)"
for n in "${COUNTS[@]}"; do
    if [ "$n" -gt "$MAX" ]; then echo "routes=$n: over the open-file limit, using $MAX"; n=$MAX; fi
    vgate_config xdp "$n" "$WORK/vgate.toml"
    ip netns exec "$G_NS" target/release/vgate run --config "$WORK/vgate.toml" --stats-interval 0 \
        > /dev/null 2> "$WORK/vgate.log" &
    W=$!
    for _ in $(seq 300); do grep -q "static stream routes installed" "$WORK/vgate.log" && break; sleep 0.1; done
    sleep 1
    pid=$(pgrep -P "$W" | head -1 || true); [ -n "$pid" ] || pid=$W
    t0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    perf stat -x, -e raw_syscalls:sys_enter,context-switches -p "$pid" -o "$WORK/stat.txt" -- sleep 5 2>/dev/null
    t1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    active=$(grep -o '[0-9]* route(s) active' "$WORK/vgate.log" | head -1 || true)
    prog=""
    if command -v bpftool >/dev/null; then
        id=$(grep -o 'vgate_xdp id [0-9]*' "$WORK/vgate.log" | head -1 | awk '{print $3}')
        [ -n "$id" ] && prog=$(bpftool prog show id "$id" | grep -o 'xlated [0-9]*B  jited [0-9]*B' || true)
    fi
    awk -F, -v n="$n" -v a="$active" -v cpu=$(( (t1 - t0) * 1000 / $(getconf CLK_TCK) / 5 )) -v p="$prog" '
        $3 == "raw_syscalls:sys_enter" { s = $1 } $3 == "context-switches" { c = $1 }
        END { printf "routes=%d (%s): %.0f system calls/s, %.0f context switches/s, %d ms CPU/s; program %s\n", n, a, s / 5, c / 5, cpu, p }' "$WORK/stat.txt"
    kill -TERM "$W"; wait "$W" 2>/dev/null || true; W=""
done
