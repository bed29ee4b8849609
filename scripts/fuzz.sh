#!/usr/bin/env bash
# Fuzz vgate's parsers with libFuzzer (cargo-fuzz) on the stable toolchain.
#
#   scripts/fuzz.sh                    every target for 10 million executions (the bar)
#   scripts/fuzz.sh --seconds 60       every target for a minute (the smoke CI can run)
#   scripts/fuzz.sh --runs N sip sdp   some targets, N executions each
#   scripts/fuzz.sh --minimize ...     afterwards shrink each corpus (cargo fuzz cmin)
#   scripts/fuzz.sh --asan ...         with AddressSanitizer (slower; the parsers are safe Rust,
#                                      so bounds are checked either way)
#
# Targets (fuzz/fuzz_targets/, bodies in src/fuzzing.rs): sip sdp rtsp transport packet media
# config. Each starts from fuzz/corpus/<target>/ (new interesting inputs are added there) and
# stops at the first crash, which libFuzzer writes to fuzz/artifacts/<target>/: copy it into
# fuzz/regressions/<target>/ so `cargo test` (tests/fuzz_replay.rs) replays it forever.
# A table of executions per target is appended to docs/fuzzing.md (not for a timed smoke,
# which also keeps what it finds out of the corpus).
# Installs cargo-fuzz (cargo install) when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=10000000
SECONDS_LIMIT=0
MINIMIZE=0
SANITIZER=none
TARGETS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) RUNS="$2"; shift 2 ;;
        --seconds) SECONDS_LIMIT="$2"; shift 2 ;;
        --minimize) MINIMIZE=1; shift ;;
        --asan) SANITIZER=address; shift ;;
        -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
        *) TARGETS+=("$1"); shift ;;
    esac
done
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(sip sdp rtsp transport packet config signal deframe link media)
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
export RUSTC_BOOTSTRAP=1

cd fuzz
cargo fuzz build -O -s "$SANITIZER"
report=()
for t in "${TARGETS[@]}"; do
    mkdir -p "corpus/$t" "artifacts/$t"
    if [ "$SECONDS_LIMIT" -gt 0 ]; then
        limit=(-max_total_time="$SECONDS_LIMIT")
    else
        limit=(-runs="$RUNS")
    fi
    echo "fuzz.sh: $t ${limit[*]}" >&2
    log=$(mktemp)
    # -rss_limit_mb: unbounded allocation is a failure too. -timeout: a hang is a failure.
    # A timed smoke adds what it finds to a scratch directory, not to the corpus in git.
    dirs=("corpus/$t")
    if [ "$SECONDS_LIMIT" -gt 0 ]; then
        scratch=$(mktemp -d)
        dirs=("$scratch" "corpus/$t")
    fi
    if ! cargo fuzz run -O -s "$SANITIZER" "$t" "${dirs[@]}" -- "${limit[@]}" -rss_limit_mb=1024 -timeout=10 \
        -print_final_stats=1 >"$log" 2>&1; then
        tail -40 "$log" >&2
        echo "fuzz.sh: $t FAILED: see fuzz/artifacts/$t/; copy the input into fuzz/regressions/$t/ once fixed" >&2
        rm -f "$log"
        exit 1
    fi
    execs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' | tail -1)
    secs=$(grep -Eo 'Done [0-9]+ runs in [0-9]+ second' "$log" | grep -Eo '[0-9]+ second' | grep -Eo '[0-9]+' | tail -1)
    cov=$(grep -Eo 'cov: [0-9]+' "$log" | tail -1 | grep -Eo '[0-9]+')
    corpus=$(find "corpus/$t" -type f | wc -l)
    echo "fuzz.sh: $t: ${execs:-?} executions in ${secs:-?} s, coverage ${cov:-?}, corpus $corpus, no crash" >&2
    report+=("| $t | ${execs:-?} | ${secs:-?} | ${cov:-?} | $corpus | none |")
    rm -f "$log"
    [ "$SECONDS_LIMIT" -gt 0 ] && rm -rf "$scratch"
    if [ "$MINIMIZE" = 1 ]; then
        cargo fuzz cmin -O -s "$SANITIZER" "$t" "corpus/$t" >/dev/null 2>&1
    fi
done
cd ..
if [ "$SECONDS_LIMIT" -gt 0 ]; then
    echo "fuzz.sh: all targets clean (smoke; figures not recorded)" >&2
    exit 0
fi
{
    echo
    echo "## $(date -u '+%Y-%m-%d %H:%M') UTC — \`scripts/fuzz.sh $([ "$SECONDS_LIMIT" -gt 0 ] && echo "--seconds $SECONDS_LIMIT" || echo "--runs $RUNS") ${TARGETS[*]}\`"
    echo
    echo "Machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), kernel $(uname -r)."
    echo
    echo "| target | executions | seconds | coverage | corpus files | crashes |"
    echo "|---|---:|---:|---:|---:|---|"
    printf '%s\n' "${report[@]}"
} >> docs/fuzzing.md
echo "fuzz.sh: all targets clean; figures appended to docs/fuzzing.md" >&2
