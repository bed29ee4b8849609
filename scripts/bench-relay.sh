#!/usr/bin/env bash
# What a relay costs the gateway's core, measured side by side in one run on the
# three-namespace bed, with a generator that can outrun the relay (issue 12).
#
#   scripts/bench-relay.sh [options]           (as root)
#
#   --streams "..."   stream counts (default "20 100 300"); 10 Mbit/s of 1316-byte datagrams each;
#                     "" for none (only the --extras)
#   --runs N          rounds; every configuration runs once per round, rounds outermost (default 3)
#   --seconds S       seconds of traffic per point (default 3)
#   --configs "..."   default "route kernel crelay stack tnapi zc xdp": plain IP routing (the
#                     reference), nftables DNAT (the kernel bound), the plain C relay
#                     (scripts/bench/crelay.c), and vgate's modes (any `--mode` vgate takes,
#                     and the A/B variants tnapi-sockets, zc-sockets, tnapi-v2, tnapi-v3;
#                     a mode that cannot start is reported as such; with xdp in the list the
#                     bed is prepared for it for every configuration, as bench-channel does).
#                     A/B variants: crelay-vgate (the C relay with stack mode's socket
#                     options: SO_RXQ_OVFL, egress sockets watched, SO_BINDTODEVICE),
#                     stack-nogso (VGATE_UDP_GSO=off), tnapi-sockets, zc-sockets,
#                     zc-spinN (zc's workers poll their rings N µs after work before
#                     sleeping: VGATE_AFXDP_SPIN_US=N), zc-swcsum (zc sums UDP in
#                     software: VGATE_AFXDP_TX_CSUM=software), zc-epoll (zc's workers sleep
#                     in epoll_wait and kick TX with sendto: VGATE_AFXDP_WAIT=epoll; the
#                     default sleeps in poll(2), which also kicks TX), zc-kickN
#                     (zc kicks TX after N frames while busy: VGATE_AFXDP_KICK_AT=N; 1 is
#                     the kick per RX batch of before), zc-before (all three as before
#                     the zcperf branch: software checksum, kick per RX batch, epoll_wait)
#   --extras "..."    after the sweep, for each vgate mode in --configs: "memory" (resident
#                     memory with 100 and 10 000 static routes, idle and after relaying) and
#                     "activation" (route added through the admin API while its stream is
#                     already arriving -> first datagram at the sink; 5 times, or
#                     $ACT_TRIES; a try where nothing arrives logs the route's counters). Default both;
#                     "" for none (the many-routes point is 10 000; for stack and the
#                     -sockets variants, which hold two sockets per route, what the open-file
#                     limit allows when it cannot be raised)
#   --out FILE        the Markdown table (default: printed only); raw JSON lines go beside it
#   --note TEXT       a sentence for the report (e.g. what else loaded the machine)
#   --feed local|nic  how the generator's frames reach the gateway (default local: straight
#                     from A's veth, as locally sent skbs: with an XDP program on the gateway's
#                     veth, veth copies each one into a page-pool page first, which a NIC does
#                     not). nic: through a bridge hop whose XDP_PASS program takes that copy
#                     before the gateway, for every configuration alike, so the gateway gets
#                     what a NIC driver hands up (scripts/bench/bed-lib.sh, nic_feed)
#   --paced           the generator sends every datagram at its own time (blast send -P: one
#                     datagram per sendmmsg while it keeps up, evenly spread), not in the
#                     batches its 50 µs naps collect: a relay socket rarely holds more than one
#                     or two datagrams per wake-up, so per-wake-up and per-system-call costs
#                     are paid per packet (issue 25's paced load)
#   --media CODEC     h264 or ps: the streams are real media instead of RTP-shaped filler: the
#                     golden corpus's recording (tests/golden/media/ffmpeg_h264_high.rtp, RFC 6184;
#                     ffmpeg_ps_h264.rtp, MPEG-PS packetised the GB/T 28181 way) replayed per
#                     stream with its own SSRC, sequence numbers and timestamps (blast send -f),
#                     at the same packet rate; vgate's routes get `media = { validate = "off" }`,
#                     and the configurations MODE+enforce / MODE+count (e.g. stack+enforce) the
#                     same mode with `media = { validate = "enforce" | "count", codec = CODEC,
#                     payload_types = [96] }` (ps: and the stream's `ssrc`, as a GB/T 28181 y=
#                     line gives it), so validation off and on run side by side on the same
#                     streams. Every violation counted is reported (none is expected: the
#                     recordings are real encoders' output)
#   --no-build        use target/release/vgate as it is
#   --baseline BIN    another vgate binary (e.g. a release build of an earlier commit) for
#                     the configurations suffixed @base: "stack stack@base" runs mode stack
#                     with both binaries in the same rounds, for a before/after in one run
#
# Placement (2 cores): the gateway's work on CPU 1 (vgate's one worker, crelay; RPS steers the
# gateway interfaces' receive processing there, so also the kernel's forwarding); the
# generator, the sink and their namespaces' receive processing on CPU 0.
#
# Per point: `blast send` (scripts/bench/blast.c) paces N streams on one schedule with
# sendmmsg and says how far behind it fell; `blast sink` counts arrivals and one-way latency.
# Measured: the relay core's busy time from /proc/stat (user+system+irq+softirq, counted
# once), per packet sent; the relay process's own CPU time; loss split into what the sinks'
# sockets dropped (B's UDP RcvbufErrors) and what the gateway lost. A point where the
# generator fell behind (> 1 %) or where the sinks dropped is flagged and never headlined.
set -euo pipefail
cd "$(dirname "$0")/.."

STREAMS="20 100 300"
RUNS=3
SECS=3
CONFIGS="route kernel crelay stack tnapi zc xdp"
OUT=""
EXTRAS="memory activation"
NOTE=""
FEED=local
BUILD=1
BASELINE=""
PACED=0
MEDIA=""
while [ $# -gt 0 ]; do
    case "$1" in
        --streams) STREAMS="${2?}"; shift 2 ;;
        --runs) RUNS="${2:?}"; shift 2 ;;
        --seconds) SECS="${2:?}"; shift 2 ;;
        --configs) CONFIGS="${2:?}"; shift 2 ;;
        --out) OUT="${2:?}"; shift 2 ;;
        --extras) EXTRAS="${2-}"; shift 2 ;;
        --note) NOTE="${2:?}"; shift 2 ;;
        --feed) FEED="${2:?}"; shift 2 ;;
        --no-build) BUILD=0; shift ;;
        --paced) PACED=1; shift ;;
        --media) MEDIA="${2:?}"; shift 2 ;;
        --baseline) BASELINE="${2:?}"; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "bench-relay: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
die() { echo "bench-relay: $*" >&2; exit 1; }
log() { echo "bench-relay: $*" >&2; }
isnum() { [[ "$1" =~ ^[0-9]+$ ]] && [ "$1" -ge "$2" ] && [ "$1" -le "$3" ]; }
isnum "$RUNS" 1 20 || die "--runs must be 1..20"
isnum "$SECS" 1 60 || die "--seconds must be 1..60"
case "$FEED" in local|nic) ;; *) die "--feed must be local or nic" ;; esac
RECORDING=""
case "$MEDIA" in
    "") [[ " $CONFIGS " != *"+enforce "* && " $CONFIGS " != *"+count "* ]] || die "MODE+enforce / MODE+count need --media" ;;
    h264) RECORDING=tests/golden/media/ffmpeg_h264_high.rtp ;;
    ps) RECORDING=tests/golden/media/ffmpeg_ps_h264.rtp ;;
    *) die "--media must be h264 or ps" ;;
esac
[ -z "$RECORDING" ] || [ -s "$RECORDING" ] || die "$RECORDING missing (scripts/media-golden.sh makes the corpus)"
for n in $STREAMS; do isnum "$n" 1 5000 || die "--streams: '$n' is not 1..5000"; done
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces, nftables)"
for t in ip nft cc taskset timeout python3; do command -v "$t" >/dev/null || die "$t not found"; done

# stack mode (and the ring modes' -sockets variants) hold two sockets per route: 10 000
# routes need more than the usual 1024 files (the systemd unit sets its own LimitNOFILE). The
# ring modes hold no socket per port: 10 000 routes whatever the limit.
{ ulimit -Hn 65536 && ulimit -Sn 65536; } 2>/dev/null || true
MANY_SOCKETS=$(( ($(ulimit -n) - 200) / 2 ))
[ "$MANY_SOCKETS" -le 10000 ] || MANY_SOCKETS=10000
[ "$MANY_SOCKETS" -eq 10000 ] || log "open-file limit $(ulimit -n) cannot be raised here: the memory phase gives stack mode $MANY_SOCKETS routes, not 10 000"
many_for() { case "$1" in stack*|*-sockets) echo "$MANY_SOCKETS" ;; *) echo 10000 ;; esac; }
NCPU=$(nproc)
RELAY_CPU=$((NCPU > 1 ? 1 : 0))
GEN_CPU=0
PAYLOAD=1316 RATE=10000000
A_BASE=20000 EG_BASE=30000 SINK_BASE=40000

WORK=$(mktemp -d /tmp/bench-relay.XXXXXX)
BED="vgrl$$"
PIDS=()
BED_UP=0
cleanup() {
    local rc=$? p
    trap - EXIT INT TERM
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    sleep 0.3
    for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    [ "$BED_UP" = 1 ] && { scripts/testbed.sh --name "$BED" down || true; ! declare -F nic_feed_down >/dev/null || nic_feed_down; }
    [ -n "${BPF_STATS_WAS:-}" ] && echo "$BPF_STATS_WAS" > /proc/sys/kernel/bpf_stats_enabled
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[ "$BUILD" = 1 ] && { log "cargo build --release"; cargo build --release --quiet; }
cp target/release/vgate "$WORK/vgate"
cc -O2 -o "$WORK/crelay" scripts/bench/crelay.c
cc -O2 -o "$WORK/blast" scripts/bench/blast.c
XDPPASS=$WORK/xdppass
[ "$FEED" = local ] || cc -O2 -o "$XDPPASS" scripts/bench/xdppass.c
VGATE=$WORK/vgate
GEN_OPTS=()
[ "$PACED" = 0 ] || GEN_OPTS+=(-P)
[ -z "$RECORDING" ] || GEN_OPTS+=(-f "$RECORDING")
if [ -n "$BASELINE" ]; then
    cp "$BASELINE" "$WORK/vgate-base"
elif [[ " $CONFIGS " == *"@base "* ]]; then
    die "configurations with @base need --baseline BIN"
fi

BED_UP=1
scripts/testbed.sh --name "$BED" --queues 2 up > "$WORK/bed.env"
# shellcheck disable=SC1091
. "$WORK/bed.env"
ADMIN=127.0.0.1:9941
# shellcheck disable=SC1091  # sourced from the repository (see scripts/bench/bed-lib.sh)
. scripts/bench/bed-lib.sh
if [ "$FEED" = nic ]; then
    nic_feed || die "could not build the nic feed (bridge hop with an XDP_PASS program)"
    NOTE="${NOTE:+$NOTE }Feed nic: the generator's frames cross a bridge hop with an XDP_PASS program (namespace ${BED}h) before the gateway, in every configuration, so the gateway's veth receives page-backed frames with 256 bytes of headroom as from a NIC (no copy before its XDP program); the hop's copy runs on the generator's core."
fi
if [[ " $CONFIGS " == *" xdp "* ]]; then
    xdp_bed || die "could not prepare the bed for mode xdp (ethtool: apt-get install -y ethtool)"
fi
steer
BPF_STATS_WAS=""
if [[ " $CONFIGS " == *" xdp "* ]] && [ -w /proc/sys/kernel/bpf_stats_enabled ]; then
    # The XDP program's own run time (bpftool's run_time_ns): on veth it runs in the
    # sender's NAPI context, not on the relay core. Restored at exit.
    BPF_STATS_WAS=$(cat /proc/sys/kernel/bpf_stats_enabled)
    echo 1 > /proc/sys/kernel/bpf_stats_enabled
fi

RELAY=""     # pid of the relay process (vgate, crelay), empty for the kernel's
WRAP=""
start_config() { # cfg n why -> sets TARGET TPORT
    local cfg=$1 n=$2 why=$3 t=0
    RELAY="" WRAP=""
    rm -f "$WORK/relay.out" "$WORK/relay.log"   # a previous configuration's must not count
    case "$cfg" in
        route)
            inns "$G_NS" sysctl -qw net.ipv4.ip_forward=1
            ip -n "$A_NS" route replace 10.201.2.0/24 via "$GA_IP" dev "$A_IF"
            ip -n "$B_NS" route replace 10.201.1.0/24 via "$GB_IP" dev "$B_IF"
            TARGET=$B_IP TPORT=$SINK_BASE ;;
        kernel)
            nat_rules "$n" "$WORK/nat.nft"
            inns "$G_NS" nft -f "$WORK/nat.nft" 2> "$why" || return 1
            inns "$G_NS" sysctl -qw net.ipv4.ip_forward=1
            TARGET=$GA_IP TPORT=$A_BASE ;;
        crelay|crelay-vgate)
            # crelay-vgate: the C relay with what vgate's stack mode does to its sockets
            # (SO_RXQ_OVFL, egress sockets watched, SO_BINDTODEVICE): their kernel cost, A/B.
            local copts=()
            [ "$cfg" = crelay-vgate ] && copts=(-o -w -i "$GA_IF" -I "$GB_IF")
            timeout -s TERM $((SECS + 60)) ip netns exec "$G_NS" taskset -c "$RELAY_CPU" "$WORK/crelay" \
                -a "$GA_IP" -p "$A_BASE" -n "$n" -b "$GB_IP" -e "$EG_BASE" -d "$B_IP" -s "$SINK_BASE" "${copts[@]}" \
                > "$WORK/relay.out" 2> "$WORK/relay.log" &
            WRAP=$!; PIDS+=("$WRAP")
            while [ $t -lt 100 ] && ! grep -q ready "$WORK/relay.log" 2>/dev/null; do sleep 0.1; t=$((t + 1)); done
            RELAY=$(pgrep -P "$WRAP" | head -1 || true)   # ip and taskset exec it
            grep -q ready "$WORK/relay.log" || { cat "$WORK/relay.log" > "$why"; return 1; }
            TARGET=$GA_IP TPORT=$A_BASE ;;
        *)
            # A mode with a variant of its send path (A/B): MODE-sockets sends through the
            # gateway's UDP sockets instead of frames built by vgate.
            # tnapi-v2 / tnapi-v3: mode tnapi with that AF_PACKET ring version
            # ([engine.tnapi] ring; plain tnapi takes the default).
            local mode=$cfg envs=() extra="" bin=$VGATE validate=off
            if [[ $cfg == *@base ]]; then bin=$WORK/vgate-base cfg=${cfg%@base} mode=${cfg%@base}; fi
            # MODE+enforce / MODE+count: the same mode validating the streams' media (--media).
            case "$cfg" in
                *+enforce) validate=enforce cfg=${cfg%+enforce} mode=${cfg%+enforce} ;;
                *+count) validate=count cfg=${cfg%+count} mode=${cfg%+count} ;;
            esac
            case "$cfg" in
                tnapi-sockets) mode=tnapi envs=(VGATE_TNAPI_TX=sockets) ;;
                stack-nogso) mode=stack envs=(VGATE_UDP_GSO=off) ;;
                zc-sockets) mode=zc envs=(VGATE_AFXDP_TX=sockets) ;;
                zc-spin*) mode=zc envs=(VGATE_AFXDP_SPIN_US="${cfg#zc-spin}") ;;
                zc-swcsum) mode=zc envs=(VGATE_AFXDP_TX_CSUM=software) ;;
                zc-epoll) mode=zc envs=(VGATE_AFXDP_WAIT=epoll) ;;
                zc-kick*) mode=zc envs=(VGATE_AFXDP_KICK_AT="${cfg#zc-kick}") ;;
                zc-before) mode=zc envs=(VGATE_AFXDP_TX_CSUM=software VGATE_AFXDP_KICK_AT=1 VGATE_AFXDP_WAIT=epoll) ;;
                tnapi-v2|tnapi-v3) mode=tnapi extra=$(printf '[engine.tnapi]\nring = "%s"' "${cfg#tnapi-}") ;;
            esac
            vgate_config "$mode" "$n" "$WORK/vgate.toml" "$MEDIA" "$validate"
            [ -z "$extra" ] || printf '%s\n' "$extra" >> "$WORK/vgate.toml"
            timeout -s TERM $((SECS + 60 + 6 * ${ACT_TRIES:-5})) ip netns exec "$G_NS" env "${envs[@]}" "$bin" run --config "$WORK/vgate.toml" \
                --stats-interval 0 > "$WORK/relay.out" 2> "$WORK/relay.log" &
            WRAP=$!; PIDS+=("$WRAP")
            while [ $t -lt 150 ]; do
                grep -q "static stream routes installed" "$WORK/relay.log" 2>/dev/null && break
                kill -0 "$WRAP" 2>/dev/null || break
                sleep 0.1; t=$((t + 1))
            done
            if ! grep -q "static stream routes installed" "$WORK/relay.log" 2>/dev/null; then
                kill -TERM "$WRAP" 2>/dev/null || true; wait "$WRAP" 2>/dev/null || true
                sed 's/\x1b\[[0-9;]*m//g' "$WORK/relay.log" | grep -m1 "ERROR" > "$why" || tail -1 "$WORK/relay.log" > "$why" || true
                return 1
            fi
            RELAY=$(pgrep -P "$WRAP" | head -1 || true)
            TARGET=$GA_IP TPORT=$A_BASE ;;
    esac
}

stop_config() { # cfg
    case "$1" in
        route)
            ip -n "$A_NS" route del 10.201.2.0/24 2>/dev/null || true
            ip -n "$B_NS" route del 10.201.1.0/24 2>/dev/null || true
            inns "$G_NS" sysctl -qw net.ipv4.ip_forward=0 ;;
        kernel)
            inns "$G_NS" nft delete table ip vgbench || true
            inns "$G_NS" sysctl -qw net.ipv4.ip_forward=0 ;;
        *)
            kill -TERM "$WRAP" 2>/dev/null || true
            wait "$WRAP" 2>/dev/null || true ;;
    esac
}

# cpu<N> busy and total jiffies ("" for all CPUs); a process's utime+stime; UDP counters of a namespace.
core() { awk -v c="cpu$1" '$1 == c { b = $2 + $3 + $4 + $7 + $8 + $9; print b, b + $5 + $6 }' /proc/stat; }
# System calls and context switches of a process (all its threads) over S seconds, counted
# in the kernel by perf (no strace-style stop per call): "syscalls switches", or nothing.
PERF=$(command -v perf || true)
count_calls() { # pid seconds out
    [ -n "$PERF" ] && [ -n "$1" ] || return 0
    "$PERF" stat -x, -e raw_syscalls:sys_enter,context-switches -p "$1" -o "$3" -- sleep "$2" 2>/dev/null || true
}
calls_of() { # perf stat -x, output -> "syscalls switches" (null when missing)
    awk -F, '$3 == "raw_syscalls:sys_enter" { s = $1 } $3 == "context-switches" { c = $1 }
             END { printf "%s %s\n", (s ~ /^[0-9]+$/ ? s : "null"), (c ~ /^[0-9]+$/ ? c : "null") }' "$1" 2>/dev/null || echo "null null"
}
# XDP programs named vgate* (run in whatever context the kernel runs them, e.g. the sender's
# NAPI on veth): total run_time_ns and run_cnt, with kernel.bpf_stats_enabled on.
# Only the programs attached to this bed's gateway interfaces count (other runs on the
# machine may load programs of the same name).
bpf_ns() {
    command -v bpftool >/dev/null || { echo "null null"; return; }
    local ids
    ids=$(ip -n "$G_NS" -d -j link show 2>/dev/null | python3 -c '
import json, sys
for l in json.load(sys.stdin):
    for k in ("xdp",):
        x = l.get(k) or {}
        for p in [x.get("prog")] + [a.get("prog") for a in x.get("attached", [])]:
            if p and p.get("id"):
                print(p["id"])' 2>/dev/null | sort -u)
    [ -n "$ids" ] || { echo "0 0"; return; }
    local id t=0 c=0 pt pc
    for id in $ids; do
        read -r pt pc < <(bpftool -j prog show id "$id" 2>/dev/null | python3 -c '
import json, sys
p = json.load(sys.stdin)
print(p.get("run_time_ns", 0) if p.get("name", "").startswith("vgate") else 0,
      p.get("run_cnt", 0) if p.get("name", "").startswith("vgate") else 0)' 2>/dev/null || echo "0 0")
        t=$((t + pt)) c=$((c + pc))
    done
    echo "$t $c"
}
proc_ticks() { # fields after "comm)": utime is the 12th, stime the 13th
    local f
    if [ -n "$1" ] && f=$(cat "/proc/$1/stat" 2>/dev/null); then
        f=${f##*) }
        # shellcheck disable=SC2086
        set -- $f
        echo $((${12} + ${13}))
    else
        echo 0
    fi
}
# InErrors (includes RcvbufErrors) + NoPorts of a namespace: datagrams its sockets dropped.
# shellcheck disable=SC2016
udp_err() { inns "$1" awk '/^Udp:/ { if (h) { print $3 + $4 } h = 1 }' /proc/net/snmp; }

RAW=$WORK/points.jsonl
: > "$RAW"
point() { # cfg n run
    local cfg=$1 n=$2 r=$3 c0 c1 p0 p1 s0 s1 g0 g1 sink rx tx
    if ! start_config "$cfg" "$n" "$WORK/why"; then
        log "  $cfg n=$n: cannot start: $(head -c 300 "$WORK/why")"
        printf '{"cfg": "%s", "n": %d, "run": %d, "failed": %s}\n' "$cfg" "$n" "$r" \
            "$(python3 -c 'import json,sys; print(json.dumps(sys.stdin.read().strip()))' < "$WORK/why")" >> "$RAW"
        stop_config "$cfg"; return 0
    fi
    # Replay: the send times go through a file both sides map (fresh per point).
    local stamps=() gen_opts=("${GEN_OPTS[@]}")
    if [ -n "$RECORDING" ]; then
        rm -f "$WORK/stamps"; stamps=(-m "$WORK/stamps"); gen_opts+=(-m "$WORK/stamps")
    fi
    timeout -s INT $((SECS + 20)) ip netns exec "$B_NS" taskset -c "$GEN_CPU" "$WORK/blast" sink \
        -a "$B_IP" -p "$SINK_BASE" -n "$n" -t $((SECS + 15)) "${stamps[@]}" > "$WORK/sink.out" 2> "$WORK/sink.log" &
    sink=$!; PIDS+=("$sink")
    local t=0; while [ $t -lt 100 ] && ! grep -q ready "$WORK/sink.log" 2>/dev/null; do sleep 0.05; t=$((t + 1)); done
    s0=$(udp_err "$B_NS"); g0=$(udp_err "$G_NS"); read -r c0 _ < <(core "$RELAY_CPU"); p0=$(proc_ticks "$RELAY")
    local a0 a1 b0 b1 bn0 bn1 calls=""
    read -r a0 _ < <(core ""); read -r b0 bn0 < <(bpf_ns)
    rm -f "$WORK/calls.txt"
    count_calls "$RELAY" "$SECS" "$WORK/calls.txt" & calls=$!
    timeout -s INT $((SECS + 15)) ip netns exec "$A_NS" taskset -c "$GEN_CPU" "$WORK/blast" send \
        -d "$TARGET" -p "$TPORT" -n "$n" -r "$RATE" -l "$PAYLOAD" -t "$SECS" -b "$A_IP" "${gen_opts[@]}" > "$WORK/gen.out" 2> "$WORK/gen.log" || true
    read -r c1 _ < <(core "$RELAY_CPU"); p1=$(proc_ticks "$RELAY")
    read -r a1 _ < <(core ""); read -r b1 bn1 < <(bpf_ns)
    wait "$calls" 2>/dev/null || true
    local sc cs; read -r sc cs < <(calls_of "$WORK/calls.txt")
    local bpf_t=null bpf_c=null
    if [ "$b0" != null ] && [ "$b1" != null ]; then bpf_t=$((b1 - b0)) bpf_c=$((bn1 - bn0)); fi
    sleep 0.5   # what the relay still holds reaches the sinks
    kill -INT "$sink" 2>/dev/null || true; wait "$sink" 2>/dev/null || true
    s1=$(udp_err "$B_NS"); g1=$(udp_err "$G_NS")
    stop_config "$cfg"
    rx=null tx=null
    local drops="{}" media="{}"
    if [ -s "$WORK/relay.out" ]; then
        # Media violations by reason, summed over the routes (`media_REASON=N` on route lines):
        # counted under count and enforce alike; none is expected from a real encoder's stream.
        media=$({ grep '^route name=.* channel=forward ' "$WORK/relay.out" || true; } | python3 -c '
import json, sys
t = {}
for line in sys.stdin:
    for w in line.split():
        k, _, v = w.partition("=")
        if k.startswith("media_") and v.isdigit():
            t[k[6:]] = t.get(k[6:], 0) + int(v)
print(json.dumps(t))' 2>/dev/null || echo "{}")
        # vgate's forward-channel drop counters by reason, so a gap between rx and tx says why.
        drops=$(sed -n 's/^total channel=forward //p' "$WORK/relay.out" | head -1 | python3 -c '
import json, sys
kv = dict(w.split("=", 1) for w in sys.stdin.read().split() if "=" in w)
print(json.dumps({k[5:]: int(v) for k, v in kv.items() if k.startswith("drop_") and v.isdigit() and int(v)}))' 2>/dev/null || echo "{}")
        case "$cfg" in
            crelay*) rx=$(sed -n 's/.*rx=\([0-9]*\).*/\1/p' "$WORK/relay.out"); tx=$(sed -n 's/.*tx=\([0-9]*\).*/\1/p' "$WORK/relay.out") ;;
            *) rx=$(sed -n 's/^total channel=forward .*rx_packets=\([0-9]*\).*/\1/p' "$WORK/relay.out" | head -1)
               tx=$(sed -n 's/^total channel=forward .*tx_packets=\([0-9]*\).*/\1/p' "$WORK/relay.out" | head -1) ;;
        esac
    fi
    printf '{"cfg": "%s", "n": %d, "run": %d, "gen": %s, "sink": %s, "core_ticks": %d, "all_ticks": %d, "relay_ticks": %d, "sink_udp_errors": %d, "gw_udp_errors": %d, "relay_rx": %s, "relay_tx": %s, "relay_syscalls": %s, "relay_switches": %s, "bpf_ns": %s, "bpf_runs": %s, "relay_drops": %s, "media_violations": %s}\n' \
        "$cfg" "$n" "$r" "$(cat "$WORK/gen.out")" "$(cat "$WORK/sink.out")" $((c1 - c0)) $((a1 - a0)) $((p1 - p0)) \
        $((s1 - s0)) $((g1 - g0)) "${rx:-null}" "${tx:-null}" "$sc" "$cs" "$bpf_t" "$bpf_c" "$drops" "$media" >> "$RAW"
    tail -1 "$RAW" >&2
    sleep 0.3
}

idle_point() { # run: the relay core's busy time with nothing relayed (the machine's background)
    local c0 c1
    read -r c0 _ < <(core "$RELAY_CPU"); sleep "$SECS"; read -r c1 _ < <(core "$RELAY_CPU")
    printf '{"cfg": "idle", "n": 0, "run": %d, "core_ticks": %d, "seconds": %d}\n' "$1" $((c1 - c0)) "$SECS" >> "$RAW"
}

START=$(date +%s)
for ((r = 1; r <= RUNS; r++)); do
    idle_point "$r"
    for n in $STREAMS; do
        for cfg in $CONFIGS; do
            log "round $r/$RUNS  N=$n  $cfg  ($(( $(date +%s) - START )) s)"
            point "$cfg" "$n" "$r"
        done
    done
done
is_vgate() { case "$1" in route|kernel|crelay*|*-sockets|*-nogso|*-spin*|*+enforce|*+count) return 1 ;; *) return 0 ;; esac; }
rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }
fd_count() { find "/proc/$1/fd" -mindepth 1 2>/dev/null | wc -l; }
socket_count() { find "/proc/$1/fd" -mindepth 1 -lname 'socket:*' 2>/dev/null | wc -l; }

# Resident memory with few and many routes, idle and after traffic over up to 1000 of them.
if [[ " $EXTRAS " == *" memory "* ]]; then
    for cfg in $CONFIGS; do
        is_vgate "$cfg" || continue
        for routes in 100 "$(many_for "$cfg")"; do
            log "memory: $cfg with $routes routes"
            start_config "$cfg" "$routes" "$WORK/why" || { log "  cannot start: $(head -c 200 "$WORK/why")"; continue; }
            sleep 1
            idle_kb=$(rss_kb "$RELAY")
            fds=$(fd_count "$RELAY") socks=$(socket_count "$RELAY")
            n=$((routes < 1000 ? routes : 1000))
            ip netns exec "$A_NS" taskset -c "$GEN_CPU" "$WORK/blast" send -d "$TARGET" -p "$TPORT" -n "$n" \
                -r 1000000 -l "$PAYLOAD" -t 2 -b "$A_IP" > /dev/null 2>&1 || true
            sleep 0.5
            busy_kb=$(rss_kb "$RELAY")
            stop_config "$cfg"
            printf '{"cfg": "memory", "mode": "%s", "routes": %d, "rss_idle_kb": %d, "rss_after_kb": %d, "streams_relayed": %d, "fds": %d, "sockets": %d}\n' \
                "$cfg" "$routes" "$idle_kb" "$busy_kb" "$n" "$fds" "$socks" | tee -a "$RAW" >&2
        done
    done
fi

# Route install -> first forwarded datagram: the stream arrives before its route exists.
if [[ " $EXTRAS " == *" activation "* ]]; then
    for cfg in $CONFIGS; do
        is_vgate "$cfg" || continue
        start_config "$cfg" 1 "$WORK/why" || { log "activation: $cfg cannot start"; continue; }
        for k in $(seq 1 "${ACT_TRIES:-5}"); do
            port=$((A_BASE + 100 + k)) sport=$((SINK_BASE + 100 + k))
            timeout -s INT 20 ip netns exec "$B_NS" "$WORK/blast" sink -a "$B_IP" -p "$sport" -n 1 -t 8 \
                > "$WORK/act-sink.out" 2> "$WORK/act-sink.log" &
            asink=$!; PIDS+=("$asink")
            sleep 0.3
            ip netns exec "$A_NS" "$WORK/blast" send -d "$GA_IP" -p "$port" -n 1 -r "$RATE" -l "$PAYLOAD" \
                -t 3 -b "$A_IP" > /dev/null 2>&1 &
            agen=$!; PIDS+=("$agen")
            sleep 1
            # Timed inside the gateway's namespace, from just before the request is sent.
            ip netns exec "$G_NS" python3 -c '
import json, sys, time, urllib.request
body = json.dumps({"name": "act", "domain": "a", "port": int(sys.argv[1]),
                   "destination": sys.argv[2], "egress_port": int(sys.argv[3]),
                   "expect_source": sys.argv[5] + ":0"}).encode()
req = urllib.request.Request("http://%s/api/v1/routes" % sys.argv[4], data=body,
                             headers={"Content-Type": "application/json"}, method="POST")
t0 = time.monotonic_ns()
urllib.request.urlopen(req, timeout=5).read()
print(t0, time.monotonic_ns())' "$port" "$B_IP:$sport" $((EG_BASE + 100 + k)) "$ADMIN" "$A_IP" > "$WORK/act-call.out" 2>&1 || true
            wait "$agen" 2>/dev/null || true
            sleep 0.3
            kill -INT "$asink" 2>/dev/null || true; wait "$asink" 2>/dev/null || true
            if ! grep -q '"first_ns": [1-9]' "$WORK/act-sink.out" 2>/dev/null; then
                # Nothing reached the sink: keep what each side saw, to tell the relay's
                # fault from the bed's (the route's counters say whether vgate received,
                # dropped — and why — or sent).
                log "activation try $k ($cfg): no datagram at the sink; sink: $(tr -d '\n' < "$WORK/act-sink.out" 2>/dev/null) $(tail -1 "$WORK/act-sink.log" 2>/dev/null)"
                log "  route: $(ip netns exec "$G_NS" python3 -c 'import json, sys, urllib.request
for r in json.load(urllib.request.urlopen("http://%s/api/v1/routes" % sys.argv[1], timeout=5))["routes"]:
    if r.get("port") == int(sys.argv[2]): print(json.dumps(r))' "$ADMIN" "$port" 2>&1 | tail -1)"
            fi
            read -r t0 t1 < "$WORK/act-call.out" || true
            [[ "${t0:-}" =~ ^[0-9]+$ && "${t1:-}" =~ ^[0-9]+$ ]] || { log "activation: the API call failed: $(tail -1 "$WORK/act-call.out")"; t0=0; t1=0; }
            first=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["first_ns"])' "$WORK/act-sink.out" 2>/dev/null || echo 0)
            printf '{"cfg": "activation", "mode": "%s", "try": %d, "call_ms": %s, "first_ms": %s}\n' "$cfg" "$k" \
                "$(python3 -c "print(round(($t1 - $t0) / 1e6, 2) if $t0 else 'null')")" \
                "$(python3 -c "print(round(($first - $t0) / 1e6, 2) if $t0 and $first else 'null')")" | tee -a "$RAW" >&2
        done
        stop_config "$cfg"
    done
fi

LOAD=$(cut -d' ' -f1-3 /proc/loadavg)
[ -z "$OUT" ] || cp "$RAW" "${OUT%.md}.jsonl"   # the raw points survive a failing report
python3 scripts/bench/relay_report.py "$RAW" --hz "$(getconf CLK_TCK)" --seconds "$SECS" \
    --command "scripts/bench-relay.sh --streams \"$STREAMS\" --runs $RUNS --seconds $SECS --configs \"$CONFIGS\" --feed $FEED$([ "$PACED" = 0 ] || echo " --paced")${MEDIA:+ --media $MEDIA}" \
    --load "$LOAD" --rev "$(git rev-parse --short HEAD)" --note "$NOTE" > "$WORK/report.md"
cat "$WORK/report.md"
if [ -n "$OUT" ]; then
    cp "$WORK/report.md" "$OUT"
    cp "$RAW" "${OUT%.md}.jsonl"
    log "wrote $OUT and ${OUT%.md}.jsonl"
fi
