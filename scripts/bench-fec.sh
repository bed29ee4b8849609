#!/usr/bin/env bash
# Instructions per media datagram of the link FEC, encoder + decoder (src/link/fec), counted
# by callgrind: deterministic, unlike timings on a shared machine (the time per datagram is
# `cargo bench --bench fec`). Each point runs COUNT 1322-byte link datagrams over 100 streams
# through one Encoder, a fixed random frame loss (0, 1, 5 %) or a burst of 10 consecutive frames
# in every 1000 (b10), and one Decoder (examples/fec_cost.rs; only
# its `run` is counted, so making the lanes is not). Then the decode of one rebuilt block:
# the crate's decoder, the link's full decoder (the erasure locator evaluated directly) and
# the link's direct solve (src/link/fec/direct.rs, what a block of up to 32 lost takes).
#
#   scripts/bench-fec.sh [--no-build] [COUNT]   (needs valgrind; COUNT 20000 by default)
set -euo pipefail
cd "$(dirname "$0")/.."
build=1
if [ "${1:-}" = --no-build ]; then
    build=0
    shift
fi
count=${1:-20000}
if [ "$build" = 1 ]; then
    cargo build --release --example fec_cost >/dev/null 2>&1
fi
bin=target/release/examples/fec_cost
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Ir of the functions matching $1 in a run of the example with the remaining arguments.
ir() {
    local pat=$1
    shift
    valgrind --tool=callgrind --callgrind-out-file="$tmp/cg" --toggle-collect="$pat" \
        "$bin" "$@" >"$tmp/out" 2>/dev/null
    # awk reads it all (grep -m1 would end the pipe early: SIGPIPE, and pipefail ends the script).
    callgrind_annotate "$tmp/cg" 2>/dev/null | awk '/PROGRAM TOTALS/ && !n {gsub(",","",$1); print $1; n=1}'
}
printf '%-16s %7s %8s %8s %9s %6s %13s\n' fec loss frames dropped repaired left instr/datagram
for fec in off 8+2 block block/15/111; do
    for loss in 0 10 50 b10; do
        [ "$fec" = off ] && [ "$loss" != 0 ] && continue
        n=$(ir 'fec_cost::run' "$fec" "$loss" "$count" 100)
        read -r _ _ _ _ frames _ lost _ delivered _ repaired <"$tmp/out"
        case $loss in
        b*) shown="${loss#b}/1000" ;;
        *) shown="$(awk "BEGIN{print $loss/10}")%" ;;
        esac
        printf '%-16s %7s %8s %8s %9s %6s %13s\n' "$fec" "$shown" \
            "$frames" "$lost" "$repaired" "$((count - delivered))" "$((n / count))"
    done
done
echo
printf '%-12s %5s %14s %14s %14s\n' block lost crate_instr link_instr direct_instr
for km in "116 12" "111 17"; do
    for lost in 1 2 3 4 12 17; do
        read -r k m <<<"$km"
        [ "$lost" -gt "$m" ] && continue
        a=$(ir 'fec_cost::decode_crate' decode "$k" "$m" "$lost" 10)
        b=$(ir 'fec_cost::decode_link' decode "$k" "$m" "$lost" 10)
        c=$(ir 'fec_cost::decode_direct' decode "$k" "$m" "$lost" 10)
        printf '%-12s %5s %14s %14s %14s\n' "$k+$m" "$lost" "$((a / 10))" "$((b / 10))" "$((c / 10))"
    done
done
