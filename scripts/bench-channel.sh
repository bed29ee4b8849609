#!/usr/bin/env bash
# The channel experiment of the published model on the three-namespace bed: N iperf2 UDP
# streams of 10 Mbit/s from domain A, through the gateway, to N iperf2 servers in domain B,
# per capture mode and against the kernel's own forwarding; writes a Markdown report and plots.
#
#   scripts/bench-channel.sh [options]          (as root)
#
#   --runs N          runs per point (default 5, as in the published experiment)
#   --streams "..."   the sweep of stream counts (default "25 50 100 150": a 2-core machine's
#                     iperf2 tops out near 130 streams; the published sweep was 400-800 on 8 cores)
#   --seconds S       seconds of traffic per point (default 3: 5 runs of the default sweep then
#                     take about 13 minutes here; 5 s per point took 17.9 minutes)
#   --modes "..."     vgate capture modes (default "stack tnapi zc"; also "xdp", and MODE:ENGINE
#                     for one engine of a mode: tnapi:afpacket, tnapi:pfring, zc:afxdp,
#                     zc:pfring-zc, as scripts/pfring-guest.sh compares them; a mode that
#                     fails to start is reported as "not available: <its error>"). With xdp the
#                     bed changes for every configuration of the run: TX checksum offload off
#                     on A's veth, GRO on on B's (see docs/bench-xdp.md)
#   --baselines "..." default "kernel crelay socat": nftables DNAT with forwarding on (the
#                     bound), the plain C relay (scripts/bench/crelay.c: epoll + recvmmsg +
#                     sendmmsg, the bar every user-space mode must clear) and one socat per
#                     stream (the floor). Plain routing ("route") always runs: it is the
#                     reference for incremental CPU per packet and added latency.
#                     (scripts/bench-relay.sh measures the same relays with a generator that
#                     can outrun them, plus memory and route activation.)
#   --generator G     iperf (default), vgate (vgate demo's own RTP generator on loopback inside
#                     the gateway namespace, stack mode only, a separate table) or "iperf vgate"
#   --split           also run the split appliance ("split"): the same iperf streams from domain A
#                     through half A, the forward one-way link and half B to domain B, on the
#                     four-namespace bed of scripts/split-bed.sh, two `vgate run --half` processes
#                     (stack mode, both pinned to the relay core like the single-host modes); the
#                     report gives each half's CPU per packet and throughput/loss against the
#                     single-host stack mode of the same run
#   --split-fec F     the forward link's FEC in the split configuration (default "8+2"; "off")
#   --socat-max N     largest N the socat floor is run at (default 200: N processes)
#   --flows-per-process K   iperf flows per iperf process (default 50; 1 = one process per stream)
#   --quick           smoke run (~3 minutes): --runs 1 --seconds 4
#   --out FILE        report (default docs/bench-channel.md); figures go to figures/ beside it
#   --note TEXT       a sentence added to the report (e.g. "the machine was busy")
#   --keep DIR        keep the raw outputs (iperf reports, vgate totals, /proc snapshots) in DIR
#   --no-build        use target/release/vgate as it is
#
# Placement (2 cores): the gateway's work is on CPU 1 (vgate's one worker, engine.queues = 1,
# cpus = [1]; every socat; RPS steers the gateway interfaces' receive processing, so the
# kernel's forwarding, to CPU 1), the iperf clients and servers and their namespaces' receive
# processing on CPU 0. Needs root, iproute2, nftables, iperf, socat, python3-matplotlib.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

RUNS=5
STREAMS="25 50 100 150"
SECS=3
MODES="stack tnapi zc"
BASELINES="kernel crelay socat"
GENERATOR=iperf
SOCAT_MAX=200
SPLIT=0
SPLIT_FEC=8+2
PER_PROC=50
OUT=docs/bench-channel.md
NOTE=""
KEEP=""
BUILD=1
QUICK=0
ARGS=("$@")

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-0}"; }
die() { echo "bench-channel: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
    case "$1" in
        --runs) RUNS="${2:?}"; shift 2 ;;
        --streams) STREAMS="${2:?}"; shift 2 ;;
        --seconds) SECS="${2:?}"; shift 2 ;;
        --modes) MODES="${2-}"; shift 2 ;;
        --baselines) BASELINES="${2-}"; shift 2 ;;
        --generator) GENERATOR="${2:?}"; shift 2 ;;
        --socat-max) SOCAT_MAX="${2:?}"; shift 2 ;;
        --split) SPLIT=1; shift ;;
        --split-fec) SPLIT_FEC="${2:?}"; shift 2 ;;
        --flows-per-process) PER_PROC="${2:?}"; shift 2 ;;
        --quick) QUICK=1; shift ;;
        --out) OUT="${2:?}"; shift 2 ;;
        --note) NOTE="${2:?}"; shift 2 ;;
        --keep) KEEP="${2:?}"; shift 2 ;;
        --no-build) BUILD=0; shift ;;
        -h|--help) usage 0 ;;
        *) echo "bench-channel: unknown argument '$1'" >&2; usage 2 >&2 ;;
    esac
done
if [ "$QUICK" = 1 ]; then
    # Explicit --runs/--seconds given after --quick still win.
    RUNS=1; SECS=4
    for ((i = 0; i < ${#ARGS[@]}; i++)); do
        case "${ARGS[$i]}" in
            --runs) RUNS="${ARGS[$((i + 1))]}" ;;
            --seconds) SECS="${ARGS[$((i + 1))]}" ;;
        esac
    done
fi

isnum() { [[ "$1" =~ ^[0-9]+$ ]] && [ "$1" -ge "$2" ] && [ "$1" -le "$3" ]; }
isnum "$RUNS" 1 20 || die "--runs must be 1..20"
isnum "$SECS" 2 60 || die "--seconds must be 2..60"
isnum "$SOCAT_MAX" 0 1000 || die "--socat-max must be 0..1000"
isnum "$PER_PROC" 1 500 || die "--flows-per-process must be 1..500"
for n in $STREAMS; do isnum "$n" 1 2000 || die "--streams: '$n' is not 1..2000"; done
for m in $MODES; do case "$m" in stack|tnapi|zc|xdp|tnapi:afpacket|tnapi:pfring|zc:afxdp|zc:pfring-zc) ;; *) die "--modes: unknown mode '$m'" ;; esac; done
for b in $BASELINES; do case "$b" in kernel|crelay|socat|route) ;; *) die "--baselines: unknown '$b'" ;; esac; done
for g in $GENERATOR; do case "$g" in iperf|vgate) ;; *) die "--generator: iperf or vgate" ;; esac; done
[[ "$SPLIT_FEC" =~ ^(off|[0-9]+\+[0-9]+)$ ]] || die "--split-fec: off or K+M"


[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces, nftables)"
PY=/usr/bin/python3   # Debian's python3, where python3-matplotlib lives
for t in ip:iproute2 nft:nftables iperf:iperf socat:socat taskset:util-linux timeout:coreutils "$PY:python3"; do
    command -v "${t%%:*}" >/dev/null || die "${t%%:*} not found: apt-get install -y ${t#*:}"
done
"$PY" -c 'import matplotlib' 2>/dev/null || die "matplotlib not found: apt-get install -y python3-matplotlib"

NCPU=$(nproc)
# The relay's core and the generator's core; on one core they share it (the report says so).
RELAY_CPU=$((NCPU > 1 ? 1 : 0))
GEN_CPU=0
PAYLOAD=1316          # iperf -l: UDP payload of an RTP packet with 7 MPEG-TS packets, less 12
RATE=10000000         # bit/s of UDP payload per stream (iperf2's "10M" would be 10 x 2^20)
A_BASE=20000          # gateway ports in A (vgate's stream routes, DNAT's match)
EG_BASE=30000         # vgate's egress ports in B
SINK_BASE=40000       # iperf servers in B

# ---- work area, the bed, and cleanup on any exit ----------------------------------------
WORK=$(mktemp -d /tmp/bench-channel.XXXXXX)
RAW=$WORK/raw
mkdir -p "$RAW"
BED="vgch$$"
SPLIT_BED="vgsp$$"
SPLIT_UP=0
PIDS=()          # every background process this script started (timeout wrappers, socat, vgate)
BED_UP=0
G_NS="" A_NS="" B_NS=""

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    local p
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    sleep 0.3
    for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    if [ "$BED_UP" = 1 ]; then
        # Namespace deletion takes the veths, routes and nft tables inside with it.
        scripts/testbed.sh --name "$BED" down || true
    fi
    if [ "$SPLIT_UP" = 1 ]; then
        scripts/split-bed.sh --name "$SPLIT_BED" down || true
    fi
    if [ -n "$KEEP" ]; then
        mkdir -p "$KEEP" && cp -a "$RAW/." "$KEEP/" && echo "bench-channel: raw outputs in $KEEP" >&2
    fi
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { echo "bench-channel: $*" >&2; }

# ---- the vgate binary: built once, copied so a rebuild by someone else cannot swap it ----
if [ "$BUILD" = 1 ]; then
    log "cargo build --release"
    cargo build --release --quiet
fi
[ -x target/release/vgate ] || die "target/release/vgate missing: run cargo build --release"
cp target/release/vgate "$WORK/vgate"
VGATE=$WORK/vgate
if [[ " $BASELINES " == *" crelay "* ]]; then
    command -v cc >/dev/null || die "cc not found (for the C relay baseline): apt-get install -y gcc"
    cc -O2 -o "$WORK/crelay" scripts/bench/crelay.c
fi
REV="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
# Outside a git checkout (the guest of pfring-guest.sh has a copied tree and no git) both say
# "unknown": under pipefail a failing git in a pipeline would end the bench without a word.
DIRTY="$(st="$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null)" && { [ -z "$st" ] && echo 0 || echo "$st" | wc -l; } || echo unknown)"

log "bringing up bed $BED (2 queues per veth)"
BED_UP=1
scripts/testbed.sh --name "$BED" --queues 2 up > "$WORK/bed.env"
# shellcheck disable=SC1091
. "$WORK/bed.env"

# shellcheck disable=SC2034  # used by bed-lib.sh
ADMIN=127.0.0.1:9940
# shellcheck disable=SC1091  # sourced from the repository (see scripts/bench/bed-lib.sh)
. scripts/bench/bed-lib.sh
if [[ " $MODES " == *" xdp "* ]]; then
    xdp_bed || die "could not prepare the bed for mode xdp (ethtool: apt-get install -y ethtool)"
fi
steer

# ---- the split bed (--split): its KEY=value lines as SP_KEY -------------------------------
if [ "$SPLIT" = 1 ]; then
    log "bringing up split bed $SPLIT_BED"
    SPLIT_UP=1
    scripts/split-bed.sh --name "$SPLIT_BED" up | sed 's/^/SP_/' > "$WORK/split.env"
    # shellcheck disable=SC1091
    . "$WORK/split.env"
    # The same placement: the halves' receive processing on the relay core, the domains' on
    # the generator's (one queue per veth on this bed).
    if [ "$NCPU" -gt 1 ]; then
        for ifc in ga fa ra; do inns "$SP_HA_NS" sh -c "echo $(printf '%x' $((1 << RELAY_CPU))) > /sys/class/net/$ifc/queues/rx-0/rps_cpus"; done
        for ifc in gb fb rb; do inns "$SP_HB_NS" sh -c "echo $(printf '%x' $((1 << RELAY_CPU))) > /sys/class/net/$ifc/queues/rx-0/rps_cpus"; done
        inns "$SP_DA_NS" sh -c "echo $(printf '%x' $((1 << GEN_CPU))) > /sys/class/net/va/queues/rx-0/rps_cpus"
        inns "$SP_DB_NS" sh -c "echo $(printf '%x' $((1 << GEN_CPU))) > /sys/class/net/vb/queues/rx-0/rps_cpus"
    fi
fi
SPLIT_KEY=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
FACE_A=127.77.0.1 FACE_B=127.77.0.2
FACE_PORT_BASE=25000  # half B's gateway ports on its link face (half A's routes' destination)

split_config() { # half n file
    local h=$1 n=$2 f=$3 i
    {
        echo "# Written by $(basename "$0"): half $h of the split appliance, $n static stream routes A -> B."
        if [ "$h" = a ]; then
            printf '[domains.a]\ninterface = "ga"\naddress = "%s"\nnetworks = ["10.211.1.0/24"]\nmedia_ports = "20000-29999"\n' "$SP_GA_IP"
            printf '[domains.b]\ninterface = "lo"\naddress = "%s"\nnetworks = ["%s/32"]\nmedia_ports = "30000-39999"\n' "$FACE_A" "$FACE_B"
        else
            printf '[domains.a]\ninterface = "lo"\naddress = "%s"\nnetworks = ["%s/32"]\nmedia_ports = "20000-29999"\n' "$FACE_B" "$FACE_A"
            printf '[domains.b]\ninterface = "gb"\naddress = "%s"\nnetworks = ["10.211.2.0/24"]\nmedia_ports = "30000-39999"\n' "$SP_GB_IP"
        fi
        printf '[engine]\nmode = "stack"\nqueues = 1\ncpus = [%s]\n[security]\nsource_validation = "strict"\n[control]\nlisten = "%s"\n' "$RELAY_CPU" "$ADMIN"
        if [ "$h" = a ]; then
            printf '[split]\nhalf = "a"\npeer_face = "%s"\n' "$FACE_B"
            printf '[split.out_link]\ninterface = "fa"\nlocal = "%s:7001"\npeer = "%s:7001"\npeer_mac = "%s"\nfec = "%s"\n' "$SP_FA_IP" "$SP_FB_IP" "$SP_FB_MAC" "$SPLIT_FEC"
            printf '[split.in_link]\ninterface = "ra"\nlocal = "%s:7002"\npeer = "%s:7002"\nfec = "off"\n' "$SP_RA_IP" "$SP_RB_IP"
            printf '[split.signal]\ninterface = "sa"\nlocal = "%s:7400"\npeer = "%s:7400"\nkey = "%s"\n' "$SP_SA_IP" "$SP_SB_IP" "$SPLIT_KEY"
            for ((i = 0; i < n; i++)); do
                printf '[[stream_route]]\nname = "s%d"\ndomain = "a"\nport = %d\ndestination = "%s:%d"\negress_port = %d\nexpect_source = "%s:0"\n' \
                    "$i" $((A_BASE + i)) "$FACE_B" $((FACE_PORT_BASE + i)) $((EG_BASE + i)) "$SP_DA_IP"
            done
        else
            printf '[split]\nhalf = "b"\npeer_face = "%s"\n' "$FACE_A"
            printf '[split.out_link]\ninterface = "rb"\nlocal = "%s:7002"\npeer = "%s:7002"\npeer_mac = "%s"\nfec = "off"\n' "$SP_RB_IP" "$SP_RA_IP" "$SP_RA_MAC"
            printf '[split.in_link]\ninterface = "fb"\nlocal = "%s:7001"\npeer = "%s:7001"\nfec = "%s"\n' "$SP_FB_IP" "$SP_FA_IP" "$SPLIT_FEC"
            printf '[split.signal]\ninterface = "sb"\nlocal = "%s:7400"\npeer = "%s:7400"\nkey = "%s"\n' "$SP_SB_IP" "$SP_SA_IP" "$SPLIT_KEY"
            for ((i = 0; i < n; i++)); do
                printf '[[stream_route]]\nname = "s%d"\ndomain = "a"\nport = %d\ndestination = "%s:%d"\negress_port = %d\nexpect_source = "%s:%d"\n' \
                    "$i" $((FACE_PORT_BASE + i)) "$SP_DB_IP" $((SINK_BASE + i)) $((EG_BASE + i)) "$FACE_A" $((EG_BASE + i))
            done
        fi
    } > "$f"
}

# The split configuration runs its peers on the split bed: the namespace variables point
# there while it runs (restored by stop_config).
SAVED_NS=()
SPLIT_WRAP_A="" SPLIT_WRAP_B="" SPLIT_PID_A="" SPLIT_PID_B=""

# ---- configurations ---------------------------------------------------------------------
RELAY_PIDS=()   # the processes whose CPU time is the relay's (vgate, socats)
VGATE_WRAP=""   # timeout wrapper of the running vgate

# Starts configuration $1 for $2 streams; prints the address the clients send to.
# Returns non-zero (with the reason in $3) when it cannot start.
start_config() {
    local cfg=$1 n=$2 why=$3 i
    RELAY_PIDS=() VGATE_WRAP=""
    case "$cfg" in
        route)
            inns "$G_NS" sysctl -qw net.ipv4.ip_forward=1
            ip -n "$A_NS" route replace 10.201.2.0/24 via "$GA_IP" dev "$A_IF"
            # shellcheck disable=SC2153 # GB_IP and B_IF come from the bed's env (sourced)
            ip -n "$B_NS" route replace 10.201.1.0/24 via "$GB_IP" dev "$B_IF"
            TARGET=$B_IP TPORT=$SINK_BASE ;;
        kernel)
            nat_rules "$n" "$WORK/nat.nft"
            inns "$G_NS" nft -f "$WORK/nat.nft"
            inns "$G_NS" sysctl -qw net.ipv4.ip_forward=1
            TARGET=$GA_IP TPORT=$A_BASE ;;
        socat)
            for ((i = 0; i < n; i++)); do
                # -T: exits by itself after this long without traffic (bounded even if we die).
                # Not through inns: $! must be socat itself (ip and taskset exec it).
                ip netns exec "$G_NS" taskset -c "$RELAY_CPU" socat -T $((SECS + 30)) -u \
                    "UDP4-RECV:$((A_BASE + i)),bind=$GA_IP" \
                    "UDP4-SENDTO:$B_IP:$((SINK_BASE + i)),bind=$GB_IP" 2>>"$why.socat" &
                PIDS+=($!) RELAY_PIDS+=($!)
            done
            wait_ports "$G_NS" "$n" 1 || { echo "socat: only $(count_ports "$G_NS" 1) of $n listening" > "$why"; return 1; }
            TARGET=$GA_IP TPORT=$A_BASE ;;
        crelay)
            rm -f "$WORK/crelay.log"
            timeout -s TERM $((SECS + 60)) ip netns exec "$G_NS" taskset -c "$RELAY_CPU" "$WORK/crelay" \
                -a "$GA_IP" -p "$A_BASE" -n "$n" -b "$GB_IP" -e "$EG_BASE" -d "$B_IP" -s "$SINK_BASE" \
                > "$WORK/crelay.out" 2> "$WORK/crelay.log" &
            VGATE_WRAP=$!   # the timeout wrapper (stop_config signals it; it passes the signal on)
            PIDS+=("$VGATE_WRAP")
            local t=0
            while [ $t -lt 100 ] && ! grep -q ready "$WORK/crelay.log" 2>/dev/null; do sleep 0.1; t=$((t + 1)); done
            grep -q ready "$WORK/crelay.log" 2>/dev/null || { head -1 "$WORK/crelay.log" > "$why"; return 1; }
            # ip and taskset exec it: the wrapper's child is the relay, whose CPU time counts.
            RELAY_PIDS=("$(pgrep -P "$VGATE_WRAP" | head -1 || true)")
            TARGET=$GA_IP TPORT=$A_BASE ;;
        split)
            local h ns wrap vp
            for h in a b; do
                split_config "$h" "$n" "$WORK/half-$h.toml"
                rm -f "$WORK/half-$h.log" "$WORK/half-$h.out"
                if [ "$h" = a ]; then ns=$SP_HA_NS; else ns=$SP_HB_NS; fi
                timeout -s TERM $((SECS + 60)) ip netns exec "$ns" "$VGATE" run --config "$WORK/half-$h.toml" \
                    --stats-interval 0 > "$WORK/half-$h.out" 2> "$WORK/half-$h.log" &
                wrap=$!
                PIDS+=("$wrap")
                if [ "$h" = a ]; then SPLIT_WRAP_A=$wrap; else SPLIT_WRAP_B=$wrap; fi
            done
            for h in a b; do
                if [ "$h" = a ]; then wrap=$SPLIT_WRAP_A; else wrap=$SPLIT_WRAP_B; fi
                local t=0
                vp=""
                while [ $t -lt 100 ]; do
                    vp=$(pgrep -P "$wrap" | head -1 || true)
                    if [ -n "$vp" ] && grep -q "static stream routes installed" "$WORK/half-$h.log" 2>/dev/null; then break; fi
                    if ! kill -0 "$wrap" 2>/dev/null; then break; fi
                    sleep 0.1; t=$((t + 1))
                done
                if [ -z "$vp" ] || ! grep -q "static stream routes installed" "$WORK/half-$h.log" 2>/dev/null; then
                    kill -TERM "$SPLIT_WRAP_A" "$SPLIT_WRAP_B" 2>/dev/null || true
                    wait "$SPLIT_WRAP_A" "$SPLIT_WRAP_B" 2>/dev/null || true
                    touch "$WORK/half-$h.log"
                    { echo -n "half $h: "; sed 's/\x1b\[[0-9;]*m//g' "$WORK/half-$h.log" | grep -m1 " ERROR " || tail -1 "$WORK/half-$h.log"; } > "$why"
                    SPLIT_WRAP_A="" SPLIT_WRAP_B=""
                    return 1
                fi
                if [ "$h" = a ]; then SPLIT_PID_A=$vp; else SPLIT_PID_B=$vp; fi
            done
            RELAY_PIDS=("$SPLIT_PID_A" "$SPLIT_PID_B")
            SAVED_NS=("$A_NS" "$B_NS" "$B_IP" "$G_NS")
            A_NS=$SP_DA_NS B_NS=$SP_DB_NS B_IP=$SP_DB_IP G_NS=$SP_HB_NS
            TARGET=$SP_GA_IP TPORT=$A_BASE ;;
        stack|tnapi|zc|xdp|*:*)
            local engine=()
            [[ "$cfg" != *:* ]] || engine=(--engine "${cfg#*:}")
            vgate_config "${cfg%%:*}" "$n" "$WORK/vgate.toml"
            # The previous run's log must not be mistaken for this one's (the redirection
            # happens in the background child, after this shell has moved on).
            rm -f "$WORK/vgate.log" "$WORK/vgate.out"
            timeout -s TERM $((SECS + 60)) ip netns exec "$G_NS" "$VGATE" run --config "$WORK/vgate.toml" \
                "${engine[@]}" --stats-interval 0 > "$WORK/vgate.out" 2> "$WORK/vgate.log" &
            VGATE_WRAP=$!
            PIDS+=("$VGATE_WRAP")
            local t=0 vp=""
            while [ $t -lt 100 ]; do
                vp=$(pgrep -P "$VGATE_WRAP" | head -1 || true)
                if [ -n "$vp" ] && grep -q "static stream routes installed" "$WORK/vgate.log" 2>/dev/null; then break; fi
                if ! kill -0 "$VGATE_WRAP" 2>/dev/null; then break; fi
                sleep 0.1; t=$((t + 1))
            done
            if [ -z "$vp" ] || ! grep -q "static stream routes installed" "$WORK/vgate.log" 2>/dev/null; then
                kill -TERM "$VGATE_WRAP" 2>/dev/null || true
                wait "$VGATE_WRAP" 2>/dev/null || true
                touch "$WORK/vgate.log"
                sed 's/\x1b\[[0-9;]*m//g' "$WORK/vgate.log" > "$why.log"
                sed 's/\x1b\[[0-9;]*m//g' "$WORK/vgate.log" | grep -m1 " ERROR " > "$why" \
                    || { tail -1 "$WORK/vgate.log" | sed 's/\x1b\[[0-9;]*m//g' > "$why"; }
                [ -s "$why" ] || echo "vgate exited without a message" > "$why"
                return 1
            fi
            RELAY_PIDS=("$vp")
            TARGET=$GA_IP TPORT=$A_BASE ;;
    esac
    return 0
}

stop_config() { # cfg dir
    local cfg=$1 d=$2 p
    case "$cfg" in
        route)
            ip -n "$A_NS" route del 10.201.2.0/24 2>/dev/null || true
            ip -n "$B_NS" route del 10.201.1.0/24 2>/dev/null || true
            inns "$G_NS" sysctl -qw net.ipv4.ip_forward=0 ;;
        kernel)
            inns "$G_NS" nft list table ip vgbench > "$d/nft.txt" 2>&1 || true
            inns "$G_NS" nft delete table ip vgbench || true
            inns "$G_NS" sysctl -qw net.ipv4.ip_forward=0 ;;
        socat)
            for p in "${RELAY_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
            for p in "${RELAY_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done ;;
        crelay)
            kill -TERM "$VGATE_WRAP" 2>/dev/null || true
            wait "$VGATE_WRAP" 2>/dev/null || true
            cp "$WORK/crelay.out" "$d/crelay-totals.txt" 2>/dev/null || true ;;
        split)
            kill -TERM "$SPLIT_WRAP_A" "$SPLIT_WRAP_B" 2>/dev/null || true
            wait "$SPLIT_WRAP_A" "$SPLIT_WRAP_B" 2>/dev/null || true
            cp "$WORK/half-b.out" "$d/vgate-totals.txt" 2>/dev/null || true
            cp "$WORK/half-a.out" "$d/vgate-totals-a.txt" 2>/dev/null || true
            for p in a b; do
                sed 's/\x1b\[[0-9;]*m//g' "$WORK/half-$p.log" 2>/dev/null | grep -v "route started" > "$d/half-$p.log" || true
            done
            if [ ${#SAVED_NS[@]} -eq 4 ]; then
                A_NS=${SAVED_NS[0]} B_NS=${SAVED_NS[1]} B_IP=${SAVED_NS[2]} G_NS=${SAVED_NS[3]}
            fi
            SAVED_NS=() SPLIT_WRAP_A="" SPLIT_WRAP_B="" SPLIT_PID_A="" SPLIT_PID_B="" ;;
        stack|tnapi|zc|xdp|*:*)
            kill -TERM "$VGATE_WRAP" 2>/dev/null || true
            wait "$VGATE_WRAP" 2>/dev/null || true
            cp "$WORK/vgate.out" "$d/vgate-totals.txt" 2>/dev/null || true
            sed 's/\x1b\[[0-9;]*m//g' "$WORK/vgate.log" 2>/dev/null | grep -v "route started" > "$d/vgate.log" || true ;;
    esac
    RELAY_PIDS=() VGATE_WRAP=""
}

# Sockets bound in namespace $1 on the ports of the experiment (UDP, listening).
count_ports() { # ns which(1: gateway ports, 2: sink ports)
    local lo hi
    if [ "$2" = 1 ]; then lo=$A_BASE hi=$((A_BASE + 9999)); else lo=$SINK_BASE hi=$((SINK_BASE + 9999)); fi
    inns "$1" ss -Hluan "( sport >= :$lo and sport <= :$hi )" 2>/dev/null | wc -l
}
wait_ports() { # ns n which
    local t=0
    while [ $t -lt 100 ]; do
        [ "$(count_ports "$1" "$3")" -ge "$2" ] && return 0
        sleep 0.1; t=$((t + 1))
    done
    return 1
}

cpu_ticks() { # sum of utime+stime of the given pids (clock ticks)
    local s=0 p f
    for p in "$@"; do
        if f=$(cat "/proc/$p/stat" 2>/dev/null); then
            f=${f##*) }
            # fields after "comm)": state is 3rd overall, utime the 14th, stime the 15th
            # shellcheck disable=SC2086
            set -- $f
            s=$((s + ${12} + ${13}))
        fi
    done
    echo "$s"
}

snapshot() { # dir tag
    local d=$1 t=$2
    date +%s.%N > "$d/time.$t"
    cat /proc/stat > "$d/stat.$t"
    cat /proc/net/softnet_stat > "$d/softnet.$t"
    inns "$G_NS" cat /proc/net/snmp > "$d/snmp-g.$t"
    inns "$B_NS" cat /proc/net/snmp > "$d/snmp-b.$t"
    cpu_ticks "${RELAY_PIDS[@]}" > "$d/relay.$t"
    if [ -n "$SPLIT_PID_A" ]; then
        cpu_ticks "$SPLIT_PID_A" > "$d/relay_a.$t"
        cpu_ticks "$SPLIT_PID_B" > "$d/relay_b.$t"
    fi
}

# One point: configuration, streams, run.
point() {
    local cfg=$1 n=$2 r=$3 d lo hi k srv=() cli=() p
    d=$RAW/$cfg/n$n/r$r
    mkdir -p "$d"
    echo "cfg=$cfg n=$n run=$r seconds=$SECS payload=$PAYLOAD rate=$RATE" > "$d/meta"
    if ! start_config "$cfg" "$n" "$d/failed"; then
        log "  $cfg n=$n: cannot start: $(head -1 "$d/failed")"
        stop_config "$cfg" "$d"
        return 1
    fi
    # Servers in B, then clients in A, both on the generator core, bounded in time.
    for ((lo = 0; lo < n; lo += PER_PROC)); do
        hi=$((lo + PER_PROC - 1)); [ "$hi" -lt "$n" ] || hi=$((n - 1))
        timeout -s INT $((SECS + 25)) ip netns exec "$B_NS" taskset -c "$GEN_CPU" \
            iperf -s -u -e -B "$B_IP" -p "$((SINK_BASE + lo))-$((SINK_BASE + hi))" -i 0 \
            --histograms=1u,100000 > "$d/server.$lo.txt" 2>&1 &
        srv+=($!); PIDS+=($!)
    done
    wait_ports "$B_NS" "$n" 2 || log "  warning: not all iperf servers listening"
    snapshot "$d" 0
    for ((lo = 0; lo < n; lo += PER_PROC)); do
        hi=$((lo + PER_PROC - 1)); [ "$hi" -lt "$n" ] || hi=$((n - 1))
        timeout -s INT $((SECS + 15)) ip netns exec "$A_NS" taskset -c "$GEN_CPU" \
            iperf -c "$TARGET" -p "$((TPORT + lo))-$((TPORT + hi))" -u -b "$RATE" -l "$PAYLOAD" \
            -t "$SECS" -e --trip-times > "$d/client.$lo.txt" 2>&1 &
        cli+=($!); PIDS+=($!)
    done
    sleep "$SECS"
    snapshot "$d" 1
    for p in "${cli[@]}"; do wait "$p" 2>/dev/null || true; done
    sleep 1   # what the relay still holds reaches the servers
    for p in "${srv[@]}"; do kill -INT "$p" 2>/dev/null || true; done
    for p in "${srv[@]}"; do wait "$p" 2>/dev/null || true; done
    stop_config "$cfg" "$d"
    sleep 0.5
    # Forget finished pids so the trap does not signal recycled ones.
    k=(); for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && k+=("$p"); done; PIDS=("${k[@]}")
    return 0
}

# ---- which configurations can run --------------------------------------------------------
CONFIGS=(route)
for b in $BASELINES; do [ "$b" = route ] || CONFIGS+=("$b"); done
for m in $MODES; do CONFIGS+=("$m"); done
[ "$SPLIT" = 0 ] || CONFIGS+=(split)
echo "" > "$RAW/unavailable"
for m in $MODES $([ "$SPLIT" = 0 ] || echo split); do
    mkdir -p "$RAW/$m"
    if ! start_config "$m" 1 "$RAW/$m/why"; then
        log "mode $m: not available: $(head -1 "$RAW/$m/why")"
        echo "$m $(head -1 "$RAW/$m/why")" >> "$RAW/unavailable"
        VGATE_WRAP=""
    else
        stop_config "$m" "$RAW/$m"
        log "mode $m: starts"
    fi
done

# ---- the sweep: runs outermost, so every configuration is measured minutes apart ----------
START=$(date +%s)
if [[ " $GENERATOR " == *" iperf "* ]]; then
    for ((r = 1; r <= RUNS; r++)); do
        for n in $STREAMS; do
            for cfg in "${CONFIGS[@]}"; do
                grep -q "^$cfg " "$RAW/unavailable" && continue
                if [ "$cfg" = socat ] && [ "$n" -gt "$SOCAT_MAX" ]; then continue; fi
                log "run $r/$RUNS  N=$n  $cfg  ($(( $(date +%s) - START )) s)"
                point "$cfg" "$n" "$r" || true
            done
        done
    done
fi

# ---- vgate's own generator (vgate demo, loopback inside the gateway namespace) ----------
if [[ " $GENERATOR " == *" vgate "* ]]; then
    mkdir -p "$RAW/demo"
    for ((r = 1; r <= RUNS; r++)); do
        for n in $STREAMS; do
            log "run $r/$RUNS  N=$n  vgate demo (loopback)"
            timeout -s INT $((SECS + 30)) ip netns exec "$G_NS" "$VGATE" demo --streams "$n" --rate 10 \
                --payload "$PAYLOAD" --duration "$SECS" --json --quiet \
                > "$RAW/demo/n$n.r$r.json" 2> "$RAW/demo/n$n.r$r.log" || log "  demo failed: $(tail -1 "$RAW/demo/n$n.r$r.log")"
        done
    done
fi
ELAPSED=$(( $(date +%s) - START ))

# ---- the report ---------------------------------------------------------------------------
CMDLINE="scripts/bench-channel.sh${ARGS[*]:+ }${ARGS[*]}"
FIGDIR="$(dirname "$OUT")/figures"
mkdir -p "$FIGDIR"
"$PY" scripts/bench/report.py --raw "$RAW" --out "$OUT" --figures "$FIGDIR" \
    --command "$CMDLINE" --runs "$RUNS" --seconds "$SECS" --streams "$STREAMS" \
    --configs "${CONFIGS[*]}" --generator "$GENERATOR" --socat-max "$SOCAT_MAX" \
    --per-process "$PER_PROC" --relay-cpu "$RELAY_CPU" --gen-cpu "$GEN_CPU" --split-fec "$SPLIT_FEC" \
    --rev "$REV" --dirty "$DIRTY" --elapsed "$ELAPSED" --note "$NOTE"
log "report: $OUT (sweep took ${ELAPSED} s)"
