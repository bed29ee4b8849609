#!/usr/bin/env bash
# What media validation costs vgate per packet, counted in instructions (callgrind), so the
# figure holds on a loaded or noisy machine where CPU-time ratios do not (issue 22's "cost").
#
# The real `vgate run` (release build, mode stack, loopback, no privileges) runs under
# `valgrind --tool=callgrind` with a real recording of tests/golden/media/ replayed through
# it by scripts/bench/blast.c (N streams, looped, sequence numbers and timestamps running on),
# once per setting of `[media] validate` (off, count, enforce, strip), and once idle for the
# same time. Per packet = (instructions with the load - instructions idle) / datagrams vgate
# received (its own `total channel=forward rx=`; the sink must then have all of them). Only
# the worker thread is counted (one queue: its receive, lookup, validation and send); the
# control threads' timers would add a share that depends on how long each run took.
#
# What it says and what not: instructions in user space only — the kernel's share of each
# packet (the socket path, most of a stack relay's cost) is not counted, so "validation as a
# share of vgate's user-space instructions" overstates its share of the packet's whole cost.
# Instructions are not time (the validator's loops are cheap, branchy code).
# The load is light (valgrind runs vgate some 50x slower), so the worker wakes for about one
# datagram at a time: per-wake-up costs are in every packet, as under a paced load.
#
#   scripts/bench-validate-cost.sh [--recording NAME] [--streams N] [--seconds S] [--rate BPS]
#                                  [--settings "off enforce ..."] [--no-build]
#   (needs valgrind and cc; NAME from tests/golden/media/manifest.txt, default ffmpeg_h264_main)
set -euo pipefail
cd "$(dirname "$0")/.."

REC=ffmpeg_h264_main
STREAMS=4
SECS=8
RATE=1000000
SETTINGS="off count enforce strip"
BUILD=1
while [ $# -gt 0 ]; do
    case "$1" in
        --recording) REC="${2:?}"; shift 2 ;;
        --streams) STREAMS="${2:?}"; shift 2 ;;
        --seconds) SECS="${2:?}"; shift 2 ;;
        --rate) RATE="${2:?}"; shift 2 ;;
        --settings) SETTINGS="${2:?}"; shift 2 ;;
        --no-build) BUILD=0; shift ;;
        -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
        *) echo "bench-validate-cost: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
read -r _ CODEC PT CLOCK < <(grep "^$REC " tests/golden/media/manifest.txt) ||
    { echo "bench-validate-cost: $REC is not in tests/golden/media/manifest.txt" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "bench-validate-cost: needs valgrind (apt-get install valgrind)" >&2; exit 1; }

WORK=$(mktemp -d)
cleanup() {
    pkill -f "$WORK/" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
[ "$BUILD" = 0 ] || cargo build --release --bin vgate >/dev/null 2>&1 || cargo build --release --bin vgate
cc -O2 -o "$WORK/blast" scripts/bench/blast.c
BIN=target/release/vgate
NET=127.0.77
CONTROL=9977

config() { # validate setting
    cat <<EOF
[domains.a]
interface = "lo"
address = "$NET.1"
networks = ["$NET.1/32"]
media_ports = "20000-20999"
[domains.b]
interface = "lo"
address = "$NET.2"
networks = ["$NET.2/32"]
media_ports = "30000-30999"
[control]
listen = "$NET.1:$CONTROL"
[engine]
mode = "stack"
queues = 1
[media]
validate = "$1"
EOF
    for ((i = 0; i < STREAMS; i++)); do
        cat <<EOF
[[stream_route]]
name = "s$i"
domain = "a"
port = $((20000 + 2 * i))
destination = "$NET.2:$((40000 + i))"
egress_port = $((30000 + 2 * i))
expect_source = "$NET.1:0"
media = { codec = "$CODEC", payload_types = [$PT], clock_rate = $CLOCK }
EOF
    done
}

# Runs vgate under callgrind for SECS of load (or idle) and prints "instructions received".
run() { # setting load(0|1)
    local cfg="$WORK/vgate-$1.toml" out="$WORK/cg-$1-$2"
    config "$1" >"$cfg"
    "$BIN" check-config "$cfg" >/dev/null
    valgrind --tool=callgrind --callgrind-out-file="$out.%p" --dump-instr=no --separate-threads=yes \
        "$BIN" run --config "$cfg" >"$WORK/vgate-$1-$2.log" 2>&1 &
    local vg=$!
    local t=0
    until curl -sf "http://$NET.1:$CONTROL/api/v1/health" >/dev/null 2>&1; do
        sleep 0.5; t=$((t + 1))
        [ $t -lt 240 ] || { echo "vgate did not start under valgrind:" >&2; cat "$WORK/vgate-$1-$2.log" >&2; exit 1; }
    done
    local received=0
    if [ "$2" = 1 ]; then
        rm -f "$WORK/stamps"
        timeout -s INT $((SECS + 30)) "$WORK/blast" sink -a "$NET.2" -p 40000 -n "$STREAMS" \
            -t $((SECS + 20)) -m "$WORK/stamps" >"$WORK/sink.json" &
        local sink=$!
        sleep 0.5
        "$WORK/blast" send -d "$NET.1" -p 20000 -n "$STREAMS" -r "$RATE" -l 1316 -t "$SECS" \
            -b "$NET.1" -f "tests/golden/media/$REC.rtp" -m "$WORK/stamps" >"$WORK/send.json"
        sleep 3
        kill -INT "$sink" 2>/dev/null || true
        wait "$sink" || true
        received=$(grep -o '"received": *[0-9]*' "$WORK/sink.json" | grep -o '[0-9]*$' || true)
    else
        sleep "$SECS"
        sleep 3
    fi
    kill -TERM "$vg"
    wait "$vg" || true
    local ir rx
    # The thread that did the most is the worker (one queue): the control threads' timers
    # would otherwise add their own, time-dependent share to every run.
    ir=$(for f in "$out".*; do awk '/^summary:/ {print $2}' "$f"; done | sort -n | tail -1)
    rm -f "$out".*
    rx=$(grep -m1 '^total channel=forward' "$WORK/vgate-$1-$2.log" | grep -o ' rx_packets=[0-9]*' | grep -o '[0-9]*' || true)
    echo "$ir ${rx:-0} $received"
}

echo "# bench-validate-cost: $REC ($CODEC/$CLOCK, PT $PT), $STREAMS streams x $RATE bit/s for $SECS s, vgate $(git describe --always --dirty), load average $(cut -d' ' -f1-3 /proc/loadavg)"
printf '| validate | received by vgate | arrived at the sink | instructions/packet | over off |\n|---|---:|---:|---:|---:|\n'
base=""
for s in $SETTINGS; do
    read -r idle _ _ < <(run "$s" 0)
    read -r busy rx got < <(run "$s" 1)
    [ "${rx:-0}" -gt 0 ] || { echo "bench-validate-cost: validate=$s: vgate received nothing" >&2; exit 1; }
    [ "$got" = "$rx" ] || echo "bench-validate-cost: validate=$s: vgate received $rx, the sink got $got" >&2
    per=$(( (busy - idle) / rx ))
    if [ -z "$base" ]; then base=$per; over="(reference)"; else over=$(awk -v a="$per" -v b="$base" 'BEGIN {printf "%+.1f %%", 100 * (a - b) / b}'); fi
    printf '| %s | %s | %s | %s | %s |\n' "$s" "$rx" "$got" "$per" "$over"
done
