#!/usr/bin/env bash
# Failover of a hot-standby pair (docs/ha.md), on the bed of tests/ha_netns.rs: two vgate
# nodes in namespaces with keepalived and a Redis, 20 RTP streams on static routes added at
# run time (A -> B), 2 talkback streams (B -> A) and 5 live GB/T 28181 calls (a device
# registered through the pair, invited by the platform; their media A -> B), each stream
# 100 packets/s. ROUNDS failovers of each kind, the active node failing each time:
#   vgate       kill -9 of the active vgate (started again to come back)
#   keepalived  kill -9 of the active node's keepalived, parent and VRRP child (started again)
#   links       the active namespace's three links down (up again)
# Per failover: the largest gap over all streams at the receivers (from the RTP sequence
# numbers and arrival times) and the packets lost; then the failed node brought back must be
# the standby with the state copied and no stream interrupted again. At the end: both nodes'
# tables equal, every call ended by a BYE (3 by the platform, 2 by the device) through the last
# active, the routes removed, nothing left on either node. Bounded: 25 s per failover at most.
# The measurement is the ignored test `bench_failover` in tests/ha_netns.rs; this script runs
# it and prints its BENCH lines (p50/max per kind) with the load average.
#
#   scripts/bench-ha.sh [--rounds 10] [--kinds vgate,keepalived,links] [--advert-int 0.05]
#                       [--rt-priority 40] [--release]   (as root)
#
#   --advert-int   keepalived's advert_int (seconds, VRRPv3; default 0.05 as in
#                  systemd/keepalived-vgate.conf): the links-down failover waits for 3 of them
#   --rt-priority  keepalived's vrrp_rt_priority (SCHED_RR; default 40 as in the example
#                  config; 0: left out, the VRRP process as an ordinary one, to compare)
# Per failover it also prints where the takeover's time went on the new active (GET
# /api/v1/ha last_takeover: keepalived's MASTER, the notify hook's request, vgate's steps).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=10
KINDS="vgate,keepalived,links"
PROFILE=""
ADVERT=0.05
RT=40
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) ROUNDS="$2"; shift 2 ;;
        --kinds) KINDS="$2"; shift 2 ;;
        --advert-int) ADVERT="$2"; shift 2 ;;
        --rt-priority) RT="$2"; shift 2 ;;
        --release) PROFILE="--release"; shift ;;
        *) echo "bench-ha.sh: unknown option $1 (--rounds N, --kinds LIST, --advert-int S, --rt-priority P, --release)" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" -eq 0 ] || { echo "bench-ha.sh: needs root (network namespaces)" >&2; exit 1; }
for p in keepalived redis-server ip; do
    command -v "$p" >/dev/null || { echo "bench-ha.sh: $p missing (apt-get install keepalived redis-server iproute2)" >&2; exit 1; }
done
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
log=$(mktemp /tmp/bench-ha.XXXXXX)
status=0
echo "advert_int $ADVERT s, vrrp_rt_priority $RT, rounds $ROUNDS, kinds $KINDS"
CI=true VGATE_HA_ADVERT_INT="$ADVERT" VGATE_HA_RT_PRIORITY="$RT" VGATE_HA_BENCH_ROUNDS="$ROUNDS" VGATE_HA_BENCH_KINDS="$KINDS" \
    timeout $((ROUNDS * 3 * 30 + 300)) \
    cargo test $PROFILE --test ha_netns -- --ignored --nocapture --exact bench_failover >"$log" 2>&1 || status=$?
grep -E '^(BENCH|STEPS) ' "$log" || true
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "$status" -ne 0 ]; then
    echo "bench-ha.sh: the bench failed (exit $status); its output: $log" >&2
    grep -E 'panicked|assert' -A5 "$log" | head -40 >&2
    exit "$status"
fi
rm -f "$log"
