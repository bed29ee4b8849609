#!/usr/bin/env bash
# Instructions per packet, counted by callgrind over each golden stream of
# tests/golden/media/ (examples/media_cost.rs). Deterministic, unlike timings on a shared
# machine; the time per packet is `cargo bench --bench media` / `--bench path`.
#
# 1. The media validator alone (only inside Stream::check, so reading the file is not
#    counted). Each toggle pattern matches one function of the example only: callgrind
#    toggles counting at every entry to a matching function, so a pattern that also matched
#    a function called inside it (as '*Stream*check*' did) would count only part.
# 2. The per-packet decision every engine makes (channel::inspect_mut: size, source, media
#    validation, RTP accounting) for a route with validate = off / count / enforce / strip,
#    each packet copied into a receive buffer first (the copy is not counted), and what each
#    mode adds to off.
#
#   scripts/bench-media.sh          (needs valgrind)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --example media_cost >/dev/null 2>&1
bin=target/release/examples/media_cost
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# instr NAME CODEC PT CLOCK TOGGLE [MODE]: "packets passed bytes instructions-per-packet"
instr() {
    local name=$1 codec=$2 pt=$3 clock=$4 toggle=$5 mode=${6:-}
    local n pass bytes ir
    # To a file, not read from a pipe: read would return while valgrind still writes its
    # profile, and callgrind_annotate would read half of it.
    valgrind --tool=callgrind --callgrind-out-file="$tmp/cg" --toggle-collect="$toggle" \
        "$bin" "$name" "$codec" "$pt" "$clock" ${mode:+"$mode"} >"$tmp/out" 2>/dev/null </dev/null
    read -r _ n pass bytes <"$tmp/out"
    # awk reads all of it (grep -m1 would close the pipe early: SIGPIPE under pipefail).
    ir=$(callgrind_annotate "$tmp/cg" 2>/dev/null |
        awk '/PROGRAM TOTALS/ && !d { gsub(",", "", $1); print $1; d = 1 }')
    echo "$n $pass $bytes $((ir / n))"
}

streams() { grep -v '^#' tests/golden/media/manifest.txt; }

echo "validator alone (Stream::check)"
printf '%-22s %7s %7s %9s %12s\n' stream packets passed bytes instr/packet
streams | while read -r name codec pt clock; do
    read -r n pass bytes ir < <(instr "$name" "$codec" "$pt" "$clock" '*media_cost*check_one*')
    printf '%-22s %7s %7s %9s %12s\n' "$name" "$n" "$pass" "$bytes" "$ir"
done

echo
echo "per-packet decision (channel::inspect_mut), instructions per packet; forwarded packets and bytes under strip"
printf '%-22s %7s %6s %6s %8s %6s %8s %8s\n' stream packets off count enforce strip fwd strip-bytes
streams | while read -r name codec pt clock; do
    declare -A c=()
    for mode in off count enforce strip; do
        read -r n pass bytes ir < <(instr "$name" "$codec" "$pt" "$clock" '*media_cost*per_packet*' "$mode")
        c[$mode]=$ir
        if [ "$mode" = enforce ] && [ "$pass" != "$n" ]; then
            echo "$name: enforce passed $pass of $n" >&2
        fi
    done
    printf '%-22s %7s %6s %6s %8s %6s %8s %8s\n' "$name" "$n" "${c[off]}" "${c[count]}" \
        "${c[enforce]}" "${c[strip]}" "$pass" "$bytes"
    unset c
done
