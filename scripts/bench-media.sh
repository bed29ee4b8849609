#!/usr/bin/env bash
# Instructions per packet of the media validator (src/media), counted by callgrind over each
# golden stream of tests/golden/media/ (only inside Stream::check, so reading the file is
# not counted). Deterministic, unlike timings on a shared machine; the time per packet is
# `cargo bench --bench media`.
#
#   scripts/bench-media.sh          (needs valgrind)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --example media_cost >/dev/null 2>&1
bin=target/release/examples/media_cost
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '%-22s %7s %7s %9s %12s\n' stream packets passed bytes instr/packet
grep -v '^#' tests/golden/media/manifest.txt | while read -r name codec pt clock; do
    read -r _ n pass bytes < <(valgrind --tool=callgrind --callgrind-out-file="$tmp/cg" \
        --toggle-collect='*Stream*check*' "$bin" "$name" "$codec" "$pt" "$clock" 2>/dev/null)
    ir=$(callgrind_annotate "$tmp/cg" 2>/dev/null | grep -m1 'PROGRAM TOTALS' | awk '{gsub(",","",$1); print $1}')
    printf '%-22s %7s %7s %9s %12s\n' "$name" "$n" "$pass" "$bytes" "$((ir / n))"
done
