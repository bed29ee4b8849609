#!/usr/bin/env bash
# Loss and FEC on a one-way link of the split appliance: the forward link of the split bed
# (scripts/split-bed.sh) with random loss injected by nftables (`numgen random mod 1000 < N`
# at half B's end of the link), FEC off and on. Per point: delivered loss, repair rate,
# overhead, the one-way latency p50/p99 from domain A to domain B through both halves, and the
# datagrams that arrived behind a later one — per reorder window of half B's incoming link.
# The measurement itself is tests/split_bench.rs (ignored in the ordinary test run).
#
#   scripts/bench-split.sh [--loss "1 10 50"] [--fec "off 8+2 16+4"] [--reorder "0 25"] [--count N] [--pps R]
#                          [--out docs/bench-split.md] [--debug] [--no-build]   (as root)
#
#   --loss    permille of link frames dropped (default "1 10 50": 0.1 %, 1 %, 5 %)
#   --fec     FEC settings of the forward link (default "off 8+2 16+4")
#   --reorder half B's split.in_link.reorder_ms values (default "0 25": on arrival, and the default)
#   --count   datagrams per point (default 20000, 1328-byte RTP-sized payloads)
#   --pps     send rate (default 4000 per second, ~42 Mbit/s)
#   --debug   use the debug build (faster to build; latency figures are then not vgate's)
#   --no-build  run the benchmark binary already built (target/release/deps/split_bench-*)
set -euo pipefail
cd "$(dirname "$0")/.."
LOSS="1 10 50"
FEC="off 8+2 16+4"
REORDER="0 25"
COUNT=20000
PPS=4000
OUT=docs/bench-split.md
PROFILE=--release
KIND=release
BUILD=1
while [ $# -gt 0 ]; do
    case "$1" in
        --loss) LOSS=$2; shift 2 ;;
        --fec) FEC=$2; shift 2 ;;
        --reorder) REORDER=$2; shift 2 ;;
        --count) COUNT=$2; shift 2 ;;
        --pps) PPS=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --debug) PROFILE=""; KIND=debug; shift ;;
        --no-build) BUILD=0; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "bench-split.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" -eq 0 ] || { echo "bench-split.sh: needs root (network namespaces)" >&2; exit 1; }
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
export SPLIT_BENCH_LOSS="$LOSS" SPLIT_BENCH_FEC="$FEC" SPLIT_BENCH_REORDER="$REORDER" SPLIT_BENCH_COUNT="$COUNT" SPLIT_BENCH_PPS="$PPS"
if [ "$BUILD" = 1 ]; then
    # shellcheck disable=SC2086 # PROFILE is one flag or nothing
    cargo test $PROFILE --test split_bench -- --ignored --nocapture --test-threads 1 2>/dev/null > "$raw" || true
else
    dir=target/$KIND/deps
    bin=$(find "$dir" -maxdepth 1 -name 'split_bench-*' -type f -executable -printf '%T@ %p\n' | sort -n | tail -1 | cut -d' ' -f2)
    [ -n "$bin" ] || { echo "bench-split.sh: no split_bench binary in $dir: run without --no-build" >&2; exit 1; }
    "$bin" --ignored --nocapture --test-threads 1 2>/dev/null > "$raw" || true
fi
# libtest may print its "test … " prefix on the first line of output: take each point from
# where it starts.
grep -o 'point .*' "$raw" > "$raw.points" || true
mv "$raw.points" "$raw"
grep -q '^point' "$raw" || { echo "bench-split.sh: no results" >&2; exit 1; }
cat "$raw"
{
    echo "# Split appliance: loss and FEC on a one-way link"
    echo
    echo "Produced by \`scripts/bench-split.sh\` on $(date -u +%Y-%m-%d) ($(nproc) CPUs, $(uname -r), $KIND build); method in the script and in tests/split_bench.rs."
    echo "$COUNT datagrams of 1328 bytes per point at $PPS per second from domain A to domain B"
    echo "through both halves and the forward link of the split bed; loss injected at half B's end"
    echo "of the link (nftables \`numgen random\`). Repair rate = datagrams rebuilt / data frames"
    echo "the link lost; overhead = repair frames / data frames; latency one-way, sender to receiver;"
    echo "reorder = half B's \`split.in_link.reorder_ms\` (0: datagrams handed on as they arrive);"
    echo "out of order = datagrams the receiver got after a later one."
    echo
    echo "| link loss | FEC | reorder | delivered loss | link frames dropped | repaired | repair rate | overhead | latency p50 | latency p99 | out of order |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|"
    grep '^point' "$raw" | while read -r _ rest; do
        declare -A v=()
        for kv in $rest; do v[${kv%%=*}]=${kv#*=}; done
        printf '| %s %% | %s | %s ms | %s %% | %s | %s | %s %% | %s %% | %s µs | %s µs | %s |\n' \
            "$(awk "BEGIN{print ${v[loss_permille]}/10}")" "${v[fec]}" "${v[reorder_ms]}" "${v[delivered_loss_pct]}" \
            "${v[link_dropped]}" "${v[repaired]}" "${v[repair_rate_pct]}" "${v[overhead_pct]}" \
            "${v[lat_p50_us]}" "${v[lat_p99_us]}" "${v[out_of_order]}"
        unset v
    done
} > "$OUT"
echo "bench-split.sh: wrote $OUT"
