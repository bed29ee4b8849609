#!/usr/bin/env bash
# The channel experiment in miniature, inside the guest of scripts/pfring-guest.sh: every
# capture mode and engine side by side on the three-namespace bed (veth), iperf2 streams of
# 10 Mbit/s. In a guest (software emulation, or KVM on a shared host) absolute figures mean
# nothing; what holds is whether each configuration forwards every packet once (loss 0,
# totals equal to what was sent).
# pfring-zc cannot run on veth (no ZC driver): the bench reports it "not available" with its
# error; it runs on the emulated e1000e in tests/pfring.rs instead.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/bench-channel-guest.md}
bash scripts/bench-channel.sh --no-build --runs 1 --streams "2" --seconds 3 --baselines "" \
    --modes "stack tnapi:afpacket tnapi:pfring zc:afxdp zc:pfring-zc" \
    --note "QEMU guest, ${ACCEL:-tcg} (scripts/pfring-guest.sh): figures mean nothing, only loss does" \
    --keep /tmp/bench-raw --out "$OUT"
cat "$OUT"
for f in /tmp/bench-raw/*/*/vgate-totals.txt; do
    [ -f "$f" ] || continue
    echo "== $f"; grep '^total channel=forward' "$f" || true
done
