#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine with Rust to a green run.
#
#   scripts/test.sh            install what the tests need (when root), then run everything
#   scripts/test.sh --no-install   run without touching the system's packages
#
# As root it installs the Debian packages the tests use (real peers: iproute2 and nftables
# for the namespace bed, sipp, GStreamer's RTSP server, ffmpeg, iperf ...). Tests that need
# root or a package print "DID NOT RUN" when it is missing; under CI=true they fail instead.
# Steps: rustfmt check, clippy with warnings as errors, then every test of the workspace
# (unit, loopback, namespace, golden; benches run once each in test mode).
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the tests need; keep in step with tests/ and scripts/.
PACKAGES=(
    iproute2 nftables procps ethtool    # namespaces, veth, media drop rules, sysctl, NIC setup
    sip-tester                          # sipp: SIP peers
    ffmpeg                              # ffprobe/ffmpeg: RTSP clients
    python3 python3-gi gir1.2-gst-rtsp-server-1.0
    gstreamer1.0-plugins-base gstreamer1.0-plugins-good   # the RTSP server's pipeline
    iperf socat                         # channel experiment and its floor baseline
    systemd                             # systemd-analyze verify of the unit
    prometheus                          # promtool: the metrics, alert rules of the repo
    tmux                                # driving `vgate stats` like a person
    nmap hping3 python3-scapy           # hostile suites: scans, SYN flood, forged datagrams
    shellcheck                          # the scripts are checked too
    bpftool                             # afxdp_netns reads the XDP program's no-route drop map
    keepalived redis-server             # ha_netns: VRRP moves the addresses, Redis holds the state
    redis-tools                         # ha_store_loopback, ha_split_netns: redis-cli (FLUSHALL, REPLICAOF)
    kamailio                            # scaleout_netns: the dispatcher in front of two gateways
    # scripts/media-golden.sh: the media validator's corpus from real encoders (the test
    # reads the committed files; these regenerate them)
    gstreamer1.0-tools gstreamer1.0-plugins-bad gstreamer1.0-plugins-ugly gstreamer1.0-libav
)

install=1
[ "${1:-}" = "--no-install" ] && install=0

if [ "$install" = 1 ] && [ "$(id -u)" = 0 ]; then
    missing=()
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "test.sh: installing ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
elif [ "$install" = 1 ]; then
    echo "test.sh: not root: not installing packages; namespace tests will say they did not run"
fi

command -v cargo >/dev/null || { echo "test.sh: cargo not found: install Rust (rustup) first" >&2; exit 1; }

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo test"
test_log=$(mktemp)
trap 'rm -f "$test_log"' EXIT
# --no-fail-fast: one run shows every failing test binary, not just the first.
cargo test --workspace --all-targets --no-fail-fast 2>&1 | tee "$test_log"
echo "== doc tests"
cargo test --workspace --doc
echo "== fuzz smoke (15 s per target; scripts/fuzz.sh for the full 10 million runs)"
scripts/fuzz.sh --seconds 15
if command -v shellcheck >/dev/null; then
    echo "== shellcheck"
    shellcheck scripts/*.sh
elif [ "${CI:-}" = true ]; then
    echo "test.sh: shellcheck not found (apt-get install shellcheck); under CI that is a failure" >&2
    exit 1
else
    echo "test.sh: shellcheck not found: the scripts were NOT checked" >&2
fi
# A test that did not run (no root, a package missing; CI=true turns these into failures)
# is not a pass: say which, and do not call the run green.
if not_run=$(grep -a 'DID NOT RUN' "$test_log"); then
    echo "test.sh: every test that ran passed, but these did NOT run:" >&2
    echo "$not_run" >&2
    exit 1
fi
echo "test.sh: all green"
