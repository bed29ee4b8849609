#!/usr/bin/env bash
# Soak: vgate carries static-route streams for N minutes in each mode at 80 % of a zero-loss
# rate, with zero loss, RSS growth < 1 % after warm-up (the first fifth), flat fd and route
# counts. Needs root (network namespaces). Writes a summary (default soak-summary.txt).
#
#   scripts/soak.sh [--minutes N] [--rate PPS] [--modes "stack tnapi zc"] [--streams N] [--out FILE] [--debug]
#
# The gateway soaked is the release build (what an appliance runs); --debug soaks the debug
# build instead (the test harness that generates and counts is the debug test binary either way).
#
# --rate is the zero-loss rate (packets/s, all streams) to take 80 % of; without it the
# figure recorded in docs/reliability.md ("soak base rate: N pps") is used, else 5000.
# The test and vgate are built once and copied aside, so every mode runs the same binaries
# even if the tree is rebuilt meanwhile. A mode whose test did not run is NOT-RUN (and the
# script fails); under CI=true (exported to the test) a missing prerequisite fails the test.
set -euo pipefail
cd "$(dirname "$0")/.."

minutes=15 rate="" modes="stack tnapi zc" streams=20 out=soak-summary.txt profile=release
while [ $# -gt 0 ]; do
    case "$1" in
        --minutes) minutes="$2"; shift 2 ;;
        --rate) rate="$2"; shift 2 ;;
        --modes) modes="$2"; shift 2 ;;
        --streams) streams="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --debug) profile=debug; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "soak.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
if [ "$(id -u)" != 0 ]; then
    echo "soak.sh: needs root (network namespaces): the soak DID NOT RUN" >&2
    exit 1
fi
if [ -z "$rate" ]; then
    rate=$(sed -n 's/.*soak base rate: \([0-9]*\) pps.*/\1/p' docs/reliability.md 2>/dev/null | head -1)
    rate=${rate:-5000}
fi
pps=$(( rate * 80 / 100 ))
test_bin=$(cargo test --test churn_netns --no-run --message-format=json 2>/dev/null \
    | sed -n 's/.*"executable":"\([^"]*churn_netns[^"]*\)".*/\1/p' | tail -1)
[ -x "$test_bin" ] || { echo "soak.sh: could not build the churn_netns test" >&2; exit 1; }
if [ "$profile" = release ]; then
    cargo build --release --bin vgate >/dev/null 2>&1 \
        || { echo "soak.sh: could not build the release vgate" >&2; exit 1; }
fi
snap=$(mktemp -d /tmp/vgate-soak.XXXXXX)
trap 'rm -rf "$snap"' EXIT
cp "$test_bin" "$snap/churn_netns"
cp "target/$profile/vgate" "$snap/vgate"
{
    echo "vgate soak $(date -u +%FT%TZ) at $(git rev-parse --short HEAD 2>/dev/null || echo '?'): $minutes min per mode, $streams streams, $pps pps (80 % of $rate), $profile vgate"
} > "$out"
status=0
for mode in $modes; do
    echo "== soak $mode: $minutes min at $pps pps"
    res=PASS
    if ! log=$(VGATE_BIN="$snap/vgate" VGATE_SOAK_MODE=$mode VGATE_SOAK_MINUTES=$minutes \
        VGATE_SOAK_PPS=$pps VGATE_SOAK_STREAMS=$streams CI="${CI:-}" \
        "$snap/churn_netns" --ignored --exact soak --nocapture 2>&1); then
        res=FAIL
        status=1
    fi
    line=$(grep -o 'SOAK .*' <<<"$log" | head -1 || true)
    if [ "$res" = PASS ] && { [ -z "$line" ] || grep -q 'DID NOT RUN' <<<"$log"; }; then
        res=NOT-RUN
        status=1
        line=$(grep -o '[^ ]*DID NOT RUN.*' <<<"$log" | head -1 || echo "no SOAK line: the test did not run")
    fi
    echo "$res $line" | tee -a "$out"
    [ "$res" = FAIL ] && grep -E 'panicked|assert' -A3 <<<"$log" | head -10 | tee -a "$out"
done
echo "soak.sh: summary in $out"
exit $status
