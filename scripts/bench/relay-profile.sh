#!/usr/bin/env bash
# Where a relay's CPU goes, counted rather than timed (issue 12, docs/bench-relay.md): for each
# configuration, on the bench-relay bed and placement (relay on CPU 1, generator and sinks on
# CPU 0), N streams for S seconds, then per configuration
#   - every thread of the relay process: CPU time (schedstat, ns) per packet,
#     voluntary/involuntary context switches
#     (/proc/PID/task/*: which threads wake up, and how often);
#   - system calls by kind per packet, and epoll_wait returns with no event (timer wake-ups)
#     and recvmmsg calls that found nothing (perf, counted in the kernel);
#   - with --perf, a cpu-clock profile of the relay core (perf record -C 1 -g), kept in
#     --keep DIR for `perf report -i DIR/CONFIG.data --comm vgate-w0`;
#   - with --callgrind, the relay under valgrind (user-space instructions; use a low --rate:
#     the relay runs ~50x slower), user-space instructions per packet and thread (start-up
#     included; the batching differs under valgrind, so compare per call with
#     callgrind_annotate --inclusive=yes on the files kept in --keep DIR).
#
#   scripts/bench/relay-profile.sh [--vgate BIN] [--streams N] [--seconds S] [--rate BIT_PER_S]
#                                  [--perf] [--callgrind] [--keep DIR] CONFIG...
#
# CONFIG: crelay, crelay-vgate (the C relay with stack mode's socket options, see crelay.c),
# or a vgate mode (stack, tnapi, zc, ...), optionally MODE:VAR=VALUE for an environment A/B
# (e.g. stack:VGATE_UDP_GSO=off). Needs root; the bed is removed at exit.
set -euo pipefail
cd "$(dirname "$0")/../.."

VGATE=target/release/vgate N=20 SECS=4 RATE=10000000 PERF=0 CG=0 KEEP=""
CONFIGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --vgate) VGATE="${2:?}"; shift 2 ;;
        --streams) N="${2:?}"; shift 2 ;;
        --seconds) SECS="${2:?}"; shift 2 ;;
        --rate) RATE="${2:?}"; shift 2 ;;
        --perf) PERF=1; shift ;;
        --callgrind) CG=1; shift ;;
        --keep) KEEP="${2:?}"; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        -*) echo "relay-profile: unknown option '$1'" >&2; exit 2 ;;
        *) CONFIGS+=("$1"); shift ;;
    esac
done
[ "${#CONFIGS[@]}" -gt 0 ] || { echo "relay-profile: name at least one configuration" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "relay-profile: needs root" >&2; exit 1; }
[ "$CG" = 0 ] || command -v valgrind >/dev/null || { echo "relay-profile: apt-get install valgrind" >&2; exit 1; }
VGATE=$(readlink -f "$VGATE")

W=$(mktemp -d /tmp/relay-profile.XXXXXX)
[ -z "$KEEP" ] || mkdir -p "$KEEP"
cc -O2 -g -o "$W/crelay" scripts/bench/crelay.c
cc -O2 -o "$W/blast" scripts/bench/blast.c
BED="vgrp$$"
NCPU=$(nproc) RELAY_CPU=1 GEN_CPU=0 A_BASE=20000 EG_BASE=30000 SINK_BASE=40000
export ADMIN=127.0.0.1:9943   # read by vgate_config (bed-lib.sh)
[ "$NCPU" -gt 1 ] || RELAY_CPU=0
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    sleep 0.5
    scripts/testbed.sh --name "$BED" down >/dev/null 2>&1 || true
    rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
scripts/testbed.sh --name "$BED" --queues 2 up > "$W/bed.env"
# shellcheck disable=SC1091
. "$W/bed.env"
# shellcheck disable=SC1091
. scripts/bench/bed-lib.sh
steer

threads() { # pid -> "tid comm cpu_ns voluntary involuntary" per thread
    local t
    for t in /proc/"$1"/task/*; do
        # schedstat: nanoseconds on the CPU (user and system; finer than the stat ticks)
        echo "$(basename "$t") $(tr ' ' '_' < "$t/comm") $(cut -d' ' -f1 "$t/schedstat") $(awk '/^voluntary_ctxt/ { v = $2 } /^nonvoluntary_ctxt/ { n = $2 } END { print v, n }' "$t/status")"
    done 2>/dev/null | sort
}

for cfg in "${CONFIGS[@]}"; do
    mode=${cfg%%:*} envs=()
    [[ "$cfg" == *:* ]] && read -r -a envs <<< "${cfg#*:}"
    vg=()
    [ "$CG" = 1 ] && vg=(valgrind --tool=callgrind --separate-threads=yes "--callgrind-out-file=$W/cg.out")
    rm -f "$W"/cg.out* "$W/relay.log"
    case "$mode" in
        crelay|crelay-vgate)
            copts=()
            [ "$mode" = crelay-vgate ] && copts=(-o -w -i "$GA_IF" -I "$GB_IF")
            ip netns exec "$G_NS" taskset -c "$RELAY_CPU" "${vg[@]}" "$W/crelay" -a "$GA_IP" -p "$A_BASE" -n "$N" \
                -b "$GB_IP" -e "$EG_BASE" -d "$B_IP" -s "$SINK_BASE" "${copts[@]}" > "$W/relay.out" 2> "$W/relay.log" &
            ready="ready" ;;
        *)
            vgate_config "$mode" "$N" "$W/vgate.toml"
            ip netns exec "$G_NS" env "${envs[@]}" "${vg[@]}" "$VGATE" run --config "$W/vgate.toml" --stats-interval 0 \
                > "$W/relay.out" 2> "$W/relay.log" &
            ready="routes installed" ;;
    esac
    relay=$!; PIDS+=("$relay")
    for _ in $(seq 600); do grep -q "$ready" "$W/relay.log" 2>/dev/null && break; sleep 0.1; done
    grep -q "$ready" "$W/relay.log" || { echo "== $cfg: did not start: $(tail -1 "$W/relay.log")"; kill "$relay" 2>/dev/null; continue; }
    ip netns exec "$B_NS" taskset -c "$GEN_CPU" "$W/blast" sink -a "$B_IP" -p "$SINK_BASE" -n "$N" -t $((SECS + 30)) \
        > "$W/sink.out" 2> "$W/sink.log" &
    sink=$!; PIDS+=("$sink")
    sleep 0.5
    threads "$relay" > "$W/t0"
    # epoll_wait and epoll_pwait: vgate's workers make the second (the same call without
    # glibc's cancellation wrapper), the C relay the first.
    perf stat -x, -e raw_syscalls:sys_enter,context-switches,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_epoll_pwait,syscalls:sys_enter_recvmmsg,syscalls:sys_enter_sendmmsg \
        -e syscalls:sys_exit_epoll_wait --filter 'ret == 0' -e syscalls:sys_exit_epoll_pwait --filter 'ret == 0' -e syscalls:sys_exit_recvmmsg --filter 'ret < 0' \
        -p "$relay" -o "$W/stat.txt" -- sleep "$SECS" 2>/dev/null &
    pstat=$!
    prec=""
    if [ "$PERF" = 1 ]; then
        perf record -q -e cpu-clock -C "$RELAY_CPU" -g -o "$W/$mode.data" -- sleep "$SECS" 2>/dev/null &
        prec=$!
    fi
    ip netns exec "$A_NS" taskset -c "$GEN_CPU" "$W/blast" send -d "$GA_IP" -p "$A_BASE" -n "$N" -r "$RATE" -l 1316 \
        -t "$SECS" -b "$A_IP" > "$W/gen.out" 2> /dev/null || true
    threads "$relay" > "$W/t1"
    wait "$pstat" || true
    [ -z "$prec" ] || wait "$prec" || true
    sleep 0.5
    kill -INT "$sink" 2>/dev/null || true; wait "$sink" 2>/dev/null || true
    kill -TERM "$relay" 2>/dev/null || true; wait "$relay" 2>/dev/null || true
    sent=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["sent"])' "$W/gen.out")
    echo "== $cfg: $N streams, $sent packets sent in $SECS s, received $(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["received"])' "$W/sink.out"); load $(cut -d' ' -f1-3 /proc/loadavg)"
    join "$W/t0" "$W/t1" | awk -v s="$sent" '{ printf "  thread %-7s %-16s CPU %8.1f ms  %6.2f us/packet  voluntary switches %6d  involuntary %5d\n", $1, $2, ($7 - $3) / 1e6, ($7 - $3) / 1e3 / s, $8 - $4, $9 - $5 }'
    grep -v '^#' "$W/stat.txt" | awk -F, -v s="$sent" 'NF > 2 && $1 ~ /^[0-9]+$/ {
        name = $3; if (name ~ /sys_exit_epoll_p?wait/) name = "epoll_" (name ~ /pwait/ ? "pwait" : "wait") " returning 0 events"; if (name ~ /sys_exit_recvmmsg/) name = "recvmmsg finding nothing (error)"
        printf "  %-36s %8d  %.3f per packet\n", name, $1, $1 / s }'
    if [ "$PERF" = 1 ] && [ -n "$KEEP" ]; then cp "$W/$mode.data" "$KEEP/$cfg.data"; fi
    if [ "$CG" = 1 ]; then
        for f in "$W"/cg.out*; do
            [ -s "$f" ] || continue
            ir=$(awk '/^(summary|totals):/ { print $2; exit }' "$f")
            echo "  callgrind $(basename "$f") ($(awk '/^cmd:/ { c = 1 } /^thread:/ { print "thread " $2; exit }' "$f")): $ir instructions, $(python3 -c "print(round($ir / $sent))") per packet"
            [ -z "$KEEP" ] || cp "$f" "$KEEP/$cfg.$(basename "$f")"
        done
    fi
done
