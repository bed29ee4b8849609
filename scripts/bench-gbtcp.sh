#!/usr/bin/env bash
# CPU per packet of a GB/T 28181 TCP->UDP bridged stream (a stream leg) against a UDP->UDP
# stream (the stack engine's worker), side by side in one run, on loopback, no root.
# Method and figures: docs/bench-gbtcp.md. Arguments go to the benchmark:
#   --packets N (per round, default 200000)  --rounds R (default 3)  --payload BYTES (1328)
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo bench --bench edge -- "$@"
