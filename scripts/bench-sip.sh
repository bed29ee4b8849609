#!/usr/bin/env bash
# SIP signaling benchmark: call setups per second through vgate's SIP proxy, with sipp's
# built-in UAC/UAS at rising rates, against sipp calling sipp directly on the same bed.
#
#   through vgate: UAC in ${BED}b ──► vgate (${BED}g, b→a SIP route) ──► UAS in ${BED}a
#   reference:     UAC in ${BED}b ──► UAS in ${BED}b (same namespace, no gateway)
#
# Each step offers RATE calls/s for SECONDS seconds (INVITE/100/180/200/ACK/BYE/200 with an
# SDP offer/answer, so vgate allocates ports and installs routes for every call); the table
# shows calls attempted, failed, and the setup rate achieved. Needs root, iproute2, sipp
# (apt-get install sip-tester) and a built vgate (cargo build --release).
#
# Usage: scripts/bench-sip.sh [--rates "50 100 200 400"] [--seconds 5] [--vgate PATH]
set -euo pipefail
cd "$(dirname "$0")/.."

RATES="50 100 200 400"
SECONDS_PER_STEP=5
VGATE="${VGATE:-target/release/vgate}"
while [ $# -gt 0 ]; do
    case "$1" in
        --rates) RATES="$2"; shift 2 ;;
        --seconds) SECONDS_PER_STEP="$2"; shift 2 ;;
        --vgate) VGATE="$2"; shift 2 ;;
        *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
    esac
done
command -v sipp >/dev/null || { echo "bench-sip.sh: sipp not found: apt-get install sip-tester" >&2; exit 1; }
[ -x "$VGATE" ] || { echo "bench-sip.sh: $VGATE not built: cargo build --release" >&2; exit 1; }

BED="vgsb$$"
WORK="$(mktemp -d)"
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    sleep 0.3
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    bash scripts/testbed.sh --name "$BED" down >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
eval "$(bash scripts/testbed.sh --name "$BED" --queues 1 up)"

cat > "$WORK/vgate.toml" <<EOT
[domains.a]
interface = "$GA_IF"
address = "$GA_IP"
networks = ["10.201.1.0/24"]
media_ports = "20000-29999"

[domains.b]
interface = "$GB_IF"
address = "$GB_IP"
networks = ["10.201.2.0/24"]
media_ports = "30000-39999"

[engine]
mode = "stack"
queues = 1

[security]
source_validation = "latch"

[[signaling_route]]
name = "bench"
type = "sip"
transport = "udp"
listen_domain = "b"
listen_port = 5060
upstream = "$A_IP:5060"
rate_limit = 0
EOT
ip netns exec "$G_NS" "$VGATE" run --config "$WORK/vgate.toml" > "$WORK/vgate.out" 2> "$WORK/vgate.err" &
VG_PID=$!
PIDS+=("$VG_PID")
sleep 1

# run_step NAME UAS_NS UAS_IP UAS_PORT TARGET RATE
run_step() {
    local name=$1 uas_ns=$2 uas_ip=$3 uas_port=$4 target=$5 rate=$6
    local calls=$((rate * SECONDS_PER_STEP))
    # `ip netns exec` execs sipp, so $! is sipp's PID.
    ip netns exec "$uas_ns" sipp -sn uas -i "$uas_ip" -p "$uas_port" -mp 18000 -nostdin \
        > /dev/null 2>&1 &
    local uas_pid=$!
    PIDS+=("$uas_pid")
    sleep 0.3
    local t0 t1
    t0=$(date +%s.%N)
    ip netns exec "$B_NS" timeout 120 sipp -sn uac -i "$B_IP" -p 5061 -mp 16000 "$target" \
        -m "$calls" -r "$rate" -l $((rate * 2)) -nostdin -timeout 100 \
        -trace_stat -stf "$WORK/stat.csv" > "$WORK/uac.out" 2>&1 || true
    t1=$(date +%s.%N)
    kill "$uas_pid" 2>/dev/null || true
    wait "$uas_pid" 2>/dev/null || true
    sleep 0.3
    local ok failed
    ok=$(grep -a "Successful call" "$WORK/uac.out" | tail -1 | awk -F'|' '{gsub(/ /,"",$3); print $3}')
    failed=$(grep -a "Failed call" "$WORK/uac.out" | tail -1 | awk -F'|' '{gsub(/ /,"",$3); print $3}')
    printf "%-10s rate=%4s/s calls=%5s ok=%5s failed=%4s elapsed=%6.2fs achieved=%7.1f calls/s\n" \
        "$name" "$rate" "$calls" "${ok:-?}" "${failed:-?}" "$(echo "$t1 - $t0" | bc)" \
        "$(echo "${ok:-0} / ($t1 - $t0)" | bc -l)"
}

echo "# SIP call setups: sipp uac → uas, ${SECONDS_PER_STEP}s per step; $(nproc) CPUs"
for r in $RATES; do
    run_step direct "$B_NS" "$B_IP" 5080 "$B_IP:5080" "$r"
    run_step vgate "$A_NS" "$A_IP" 5060 "$GB_IP:5060" "$r"
done
kill -TERM "$VG_PID"
wait "$VG_PID" 2>/dev/null || true
grep -a "^sessions" "$WORK/vgate.out" || true
