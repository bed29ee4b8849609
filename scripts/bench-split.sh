#!/usr/bin/env bash
# Loss and FEC on a one-way link of the split appliance: the forward link of the split bed
# (scripts/split-bed.sh) with random loss injected by nftables (`numgen random mod 1000 < N`
# at half B's end of the link), FEC off and on. Per point: delivered loss, repair rate,
# overhead, the one-way latency p50/p99 from domain A to domain B through both halves, and the
# datagrams that arrived behind a later one — per reorder window of half B's incoming link.
# The measurement itself is tests/split_bench.rs (ignored in the ordinary test run).
#
# With --tx: the sending half's cost of the outgoing link by TX family instead — half A in
# mode tnapi and zc with its link sent by the mode's family (AF_PACKET / AF_XDP) and by the
# UDP socket (VGATE_LINK_TX=udp), and mode stack, side by side in alternating rounds; per
# configuration: delivered loss and half A's datapath CPU per datagram (median of rounds).
# It writes the section of the output file from the line "## Link TX" on (the loss
# table above it is kept); without --tx the loss table is written and that section kept.
#
#   scripts/bench-split.sh [--loss "1 10 50 b1000"] [--fec "off 8+2 block"] [--reorder "0 25"] [--count N] [--pps R] [--streams S]
#                          [--out docs/bench-split.md] [--debug] [--no-build]   (as root)
#   scripts/bench-split.sh --tx [--pps "10000 30000"] [--count N] [--rounds 3] [--fec 8+2] ...
#
#   --loss    permille of link frames dropped at random (default "10 50 b1000": 1 %, 5 %, and
#             bN = bursts of 10 consecutive frames every N frames, `numgen inc`)
#   --fec     FEC settings of the forward link (default "off 8+2 block block/15/111/2"):
#             off, K+M (today's GF(2^8) code), block (the block code at its defaults) or
#             block/OVERHEAD/FRAMES/MS (fec_overhead, fec_block_frames, fec_block_ms)
#   --streams routes the datagrams are spread over, in turn (default 100: one lane's blocks
#             span all of them)
#   --reorder half B's split.in_link.reorder_ms values (default "0 25": on arrival, and the default)
#   --count   datagrams per point (default 100000, 1328-byte RTP-sized payloads)
#   --pps     send rate, all streams together (default 20000 per second, ~212 Mbit/s)
#   --tx      the link TX comparison (defaults then: --pps "10000 30000", --count 30000,
#             --fec 8+2, --rounds 3)
#   --rounds  rounds of the TX comparison (each runs every configuration once)
#   --from LOG  tabulate the point lines of an earlier run's output (saved with tee) instead
#             of running; the other options then only label the table
#   SPLIT_BENCH_SINGLE=0 (environment) leaves out the single-host baseline: the same stream
#             through one gateway of scripts/testbed.sh's bed, before and after the split points
#   --debug   use the debug build (faster to build; latency figures are then not vgate's)
#   --no-build  run the benchmark binary already built (target/release/deps/split_bench-*)
set -euo pipefail
cd "$(dirname "$0")/.."
LOSS="10 50 b1000"
FEC=""
STREAMS=100
REORDER="0 25"
COUNT=""
PPS=""
TX=0
ROUNDS=3
FROM=""
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
        --streams) STREAMS=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --debug) PROFILE=""; KIND=debug; shift ;;
        --no-build) BUILD=0; shift ;;
        --tx) TX=1; shift ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --from) FROM=$2; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "bench-split.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -n "$FROM" ] || [ "$(id -u)" -eq 0 ] || { echo "bench-split.sh: needs root (network namespaces)" >&2; exit 1; }
if [ "$TX" = 1 ]; then
    TEST=split_link_tx_families
    FEC=${FEC:-8+2} COUNT=${COUNT:-30000} PPS=${PPS:-"10000 30000"}
else
    TEST=split_loss_and_fec
    FEC=${FEC:-"off 8+2 block block/15/111/2"} COUNT=${COUNT:-100000} PPS=${PPS:-20000}
fi
raw=$(mktemp)
trap 'rm -f "$raw" "$raw.keep"' EXIT
export SPLIT_BENCH_LOSS="$LOSS" SPLIT_BENCH_FEC="$FEC" SPLIT_BENCH_REORDER="$REORDER" SPLIT_BENCH_COUNT="$COUNT" \
    SPLIT_BENCH_PPS="$PPS" SPLIT_BENCH_ROUNDS="$ROUNDS" SPLIT_BENCH_STREAMS="$STREAMS"
if [ -n "$FROM" ]; then
    cp "$FROM" "$raw"
elif [ "$BUILD" = 1 ]; then
    # shellcheck disable=SC2086 # PROFILE is one flag or nothing
    cargo test $PROFILE --test split_bench -- --ignored --nocapture --test-threads 1 --exact "$TEST" 2>/dev/null > "$raw" || true
else
    dir=${CARGO_TARGET_DIR:-target}/$KIND/deps
    bin=$(find "$dir" -maxdepth 1 -name 'split_bench-*' -type f -executable -printf '%T@ %p\n' | sort -n | tail -1 | cut -d' ' -f2)
    [ -n "$bin" ] || { echo "bench-split.sh: no split_bench binary in $dir: run without --no-build" >&2; exit 1; }
    "$bin" --ignored --nocapture --test-threads 1 --exact "$TEST" 2>/dev/null > "$raw" || true
fi
if [ "$TX" = 1 ]; then
    grep -o 'txpoint .*' "$raw" > "$raw.points" || true
    mv "$raw.points" "$raw"
    grep -q '^txpoint' "$raw" || { echo "bench-split.sh: no results" >&2; exit 1; }
    cat "$raw"
    : > "$raw.keep"
    if [ -f "$OUT" ]; then sed '/^## Link TX/,$d' "$OUT" > "$raw.keep"; fi
    {
        if [ -s "$raw.keep" ]; then
            # The kept part without its trailing blank lines, then one.
            sed -e :a -e '/^\n*$/{$d;N;ba' -e '}' "$raw.keep"
            echo
        fi
        echo "## Link TX by engine family"
        echo
        echo "Produced by \`scripts/bench-split.sh --tx --pps \"$PPS\" --count $COUNT --rounds $ROUNDS --fec $FEC\` on $(date -u +%Y-%m-%d) ($(nproc) CPUs, $(uname -r), $KIND build)."
        echo "Half A (the sending half) in each mode, its outgoing link sent by the mode's family or by the"
        echo "UDP socket (\`VGATE_LINK_TX=udp\`); half B in mode stack; $COUNT datagrams of 1328 bytes per run,"
        echo "FEC $FEC on the forward link. The configurations alternate within each of $ROUNDS rounds; figures are"
        echo "the median over rounds. CPU = half A's engine worker (captures domain a and sends the link),"
        echo "thread CPU time (user + kernel, so the send syscalls and what the kernel does in them are in)"
        echo "per datagram forwarded; \"all\" adds the incoming link's (idle) worker. The machine is shared and"
        echo "noisy: compare within a row group (same rate), as ratios."
        echo
        echo "Loss is split where it happened: *before the link* = datagrams half A never forwarded (its"
        echo "domain-side capture: RX ring or socket overflow), *link and after* = forwarded by half A, not"
        echo "received in domain B (the link, half B, the receiver); both summed over the rounds; *half B"
        echo "counted* = the part half B's counters explain (datagrams its FEC could not rebuild, its sends"
        echo "refused); *half B overflow* = link frames its incoming link's socket dropped (its receiving"
        echo "worker starved of CPU long enough to fill 8 MiB)."
        echo
        echo "| rate (pps) | mode | link TX | runs | lost before the link | lost on the link and after | of which half B counted | half B overflow (frames) | link send errors | CPU µs/datagram (median) | all workers µs/datagram | CPU vs UDP socket, same mode |"
        echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
        awk '
            { delete v; for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
              k = v["pps"] SUBSEP v["mode"] SUBSEP v["tx"]
              if (!(k in seen)) { seen[k] = 1; order[++n] = k }
              c[k] = c[k] " " v["worker_cpu_us_per_pkt"]; a[k] = a[k] " " v["all_cpu_us_per_pkt"]
              sent[k] += v["sent"]; fwd[k] += v["forwarded"]; got[k] += v["delivered"]
              bc[k] += v["b_lost"] + v["b_queue_full"]; ovf[k] += v["b_rx_overflow"]
              runs[k]++; err[k] += v["send_errors"] }
            function median(s,   x, m, i, j, t) {
                m = split(s, x, " ")
                for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (x[j] + 0 < x[i] + 0) { t = x[i]; x[i] = x[j]; x[j] = t }
                return (m % 2) ? x[(m + 1) / 2] : (x[m / 2] + x[m / 2 + 1]) / 2
            }
            END {
                for (i = 1; i <= n; i++) { k = order[i]; med[k] = median(c[k]) }
                for (i = 1; i <= n; i++) {
                    k = order[i]; split(k, p, SUBSEP)
                    u = p[1] SUBSEP p[2] SUBSEP "udp"
                    ratio = (p[3] != "udp" && (u in med) && med[u] > 0) ? sprintf("%.2f", med[k] / med[u]) : "—"
                    printf "| %s | %s | %s | %d | %.3f %% | %.3f %% | %.3f %% | %d | %d | %.2f | %.2f | %s |\n", p[1], p[2], p[3], runs[k], \
                        100 * (sent[k] - fwd[k]) / sent[k], 100 * (fwd[k] - got[k]) / sent[k], 100 * bc[k] / sent[k], ovf[k], err[k], \
                        med[k], median(a[k]), ratio
                }
            }' "$raw"
    } > "$OUT"
    echo "bench-split.sh: wrote $OUT"
    exit 0
fi
# libtest may print its "test … " prefix on the first line of output: take each point from
# where it starts.
grep -o 'point .*' "$raw" > "$raw.points" || true
mv "$raw.points" "$raw"
grep -q '^point' "$raw" || { echo "bench-split.sh: no results" >&2; exit 1; }
cat "$raw"
: > "$raw.keep"
if [ -f "$OUT" ]; then sed -n '/^## Link TX/,$p' "$OUT" > "$raw.keep"; fi
{
    echo "# Split appliance: loss and FEC on a one-way link"
    echo
    echo "Produced by \`scripts/bench-split.sh --loss \"$LOSS\" --fec \"$FEC\" --reorder \"$REORDER\" --count $COUNT --pps $PPS --streams $STREAMS\` on $(date -u +%Y-%m-%d) ($(nproc) CPUs, $(uname -r), $KIND build, load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)); method in the script and in tests/split_bench.rs."
    echo "$COUNT datagrams of 1328 bytes per point at $PPS per second in all, spread in turn over $STREAMS"
    echo "routes, from domain A to domain B through both halves and the forward link of the split bed; loss"
    echo "injected at half B's end of the link (nftables: \`numgen random\` for N ‰, \`numgen inc\` for"
    echo "*10 every N*: 10 consecutive frames of every N). Repair rate = datagrams rebuilt / data frames"
    echo "the link lost; overhead = repair frames / data frames; latency one-way, sender to receiver;"
    echo "reorder = half B's \`split.in_link.reorder_ms\` (0: datagrams handed on as they arrive);"
    echo "out of order = datagrams the receiver got after a later one; *stream lost* = the routes' exact"
    echo "link loss on half B (\`link_lost\`); CPU = each half's datapath threads (user + kernel) per"
    echo "datagram, everything they do (capture, link, FEC, MAC, send), so compare rows, not absolutes."
    echo "*single host* rows (unless SPLIT_BENCH_SINGLE=0): the same stream through one gateway (mode"
    echo "stack, one worker) of scripts/testbed.sh's bed, before and after the split points, no link."
    echo "*per stream* = datagrams that arrived behind a later one of their own stream (*out of order*"
    echo "counts across all streams: a half reading many sockets in turn reorders across them). Half B's"
    echo "reorder window: *waits* = gaps opened, *released by* = held datagrams by what handed them on"
    echo "(the missing one arrived / was rebuilt / was a partial block's unused position / the wait ran"
    echo "out / the gap was known lost / the window slid), *waited* = held datagrams by how long (≤ 2 ms,"
    echo "≤ 10 ms, longer); *B overflow* = link frames half B's socket dropped, *A send err* = link frames"
    echo "half A could not send (both lost without the loss rule); *load* = 1-minute load average at the"
    echo "end of the point."
    echo
    echo "| link loss | FEC | reorder | delivered loss | link frames dropped | repaired | repair rate | overhead | latency p50 | latency p99 | latency p99.9 | out of order | per stream | stream lost | waits | released by arr/reb/skip/time/lost/slide | waited ≤2/≤10/>10 ms | B overflow | A send err | CPU A µs/dgram | CPU B µs/dgram | load |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    grep '^point' "$raw" | while read -r _ rest; do
        declare -A v=()
        for kv in $rest; do v[${kv%%=*}]=${kv#*=}; done
        loss=${v[loss]:-${v[loss_permille]:-?}}
        case "$loss" in
            b*) label="10 every ${loss#b}" ;;
            *) label="$(awk "BEGIN{print $loss/10}") %" ;;
        esac
        fec=${v[fec]}
        case "$fec" in single-host-*) fec="single host (${fec#single-host-})"; label="—" ;; esac
        released="—" waited="—"
        if [ -n "${v[b_reorder_waits]:-}" ]; then
            released="${v[b_reorder_released_arrived]}/${v[b_reorder_released_rebuilt]}/${v[b_reorder_released_skipped]}/${v[b_reorder_released_timeout]}/${v[b_reorder_released_lost]}/${v[b_reorder_released_slide]}"
            waited="$(( v[b_reorder_wait_le1ms] + v[b_reorder_wait_le2ms] ))/$(( v[b_reorder_wait_le5ms] + v[b_reorder_wait_le10ms] ))/$(( v[b_reorder_wait_le25ms] + v[b_reorder_wait_over25ms] ))"
        fi
        printf '| %s | %s | %s ms | %s %% | %s | %s | %s %% | %s %% | %s µs | %s µs | %s µs | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' \
            "$label" "$fec" "${v[reorder_ms]}" "${v[delivered_loss_pct]}" \
            "${v[link_dropped]:-—}" "${v[repaired]:-—}" "${v[repair_rate_pct]:-—}" "${v[overhead_pct]:-—}" \
            "${v[lat_p50_us]}" "${v[lat_p99_us]}" "${v[lat_p999_us]:-?}" "${v[out_of_order]}" \
            "${v[stream_out_of_order]:-?}" "${v[stream_lost]:-—}" "${v[b_reorder_waits]:-—}" "$released" "$waited" \
            "${v[b_rx_overflow]:-—}" "${v[a_send_errors]:-—}" \
            "${v[a_cpu_us_per_pkt]:-?}" "${v[b_cpu_us_per_pkt]:-—}" "${v[load]:-?}"
        unset v
    done
    if [ -s "$raw.keep" ]; then echo; cat "$raw.keep"; fi
} > "$OUT"
echo "bench-split.sh: wrote $OUT"
