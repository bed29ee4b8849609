#!/usr/bin/env bash
# vgate test bed: three network namespaces joined by multi-queue veth pairs.
#
#   ${N}a (domain A, sources)  va ── ga  ${N}g (gateway)  gb ── vb  ${N}b (domain B, sinks)
#        10.201.1.2/24             10.201.1.1/24   10.201.2.1/24      10.201.2.2/24
#
# The gateway has net.ipv4.ip_forward=0: only a user-space relay moves packets between A
# and B. Every address lives inside these namespaces; there is no default route, so no
# traffic can leave them. Nothing is created in the caller's namespace.
#
# Usage: testbed.sh [--name PREFIX] [--queues N] up|down|env
#   up    create the bed (fails cleanly: a partial bed is removed), print KEY=value lines
#   down  remove everything the bed made; safe to run twice or after a failed up
#   env   print the KEY=value lines (for `eval "$(testbed.sh --name X env)"`)
# The prefix comes from --name, else $VGATE_BED, else vgbed$$ (unique per run: pass the
# same --name to `down`).
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }

N="${VGATE_BED:-vgbed$$}"
Q=4
CMD=""
while [ $# -gt 0 ]; do
    case "$1" in
        --name) N="${2:?--name needs a value}"; shift 2 ;;
        --name=*) N="${1#*=}"; shift ;;
        --queues) Q="${2:?--queues needs a value}"; shift 2 ;;
        --queues=*) Q="${1#*=}"; shift ;;
        -h|--help) usage ;;
        up|down|env) CMD="$1"; shift ;;
        *) echo "testbed.sh: unknown argument '$1'" >&2; usage ;;
    esac
done
[ -n "$CMD" ] || usage
if ! [[ "$N" =~ ^[A-Za-z0-9_-]{1,24}$ ]]; then
    echo "testbed.sh: bed name '$N' must be 1-24 letters, digits, '_' or '-'" >&2; exit 2
fi
if ! [[ "$Q" =~ ^[0-9]+$ ]] || [ "$Q" -lt 1 ] || [ "$Q" -gt 64 ]; then
    echo "testbed.sh: --queues must be 1..64" >&2; exit 2
fi

NS_A="${N}a" NS_G="${N}g" NS_B="${N}b"
A_IF=va GA_IF=ga GB_IF=gb B_IF=vb
A_IP=10.201.1.2 GA_IP=10.201.1.1 GB_IP=10.201.2.1 B_IP=10.201.2.2
A_MAC=02:c9:01:00:00:02 GA_MAC=02:c9:01:00:00:01 GB_MAC=02:c9:02:00:00:01 B_MAC=02:c9:02:00:00:02

print_env() {
    cat <<EOV
BED=$N
QUEUES=$Q
A_NS=$NS_A
G_NS=$NS_G
B_NS=$NS_B
A_IF=$A_IF
GA_IF=$GA_IF
GB_IF=$GB_IF
B_IF=$B_IF
A_IP=$A_IP
GA_IP=$GA_IP
GB_IP=$GB_IP
B_IP=$B_IP
A_MAC=$A_MAC
GA_MAC=$GA_MAC
GB_MAC=$GB_MAC
B_MAC=$B_MAC
PREFIX_LEN=24
EOV
}

need() {
    command -v "$1" >/dev/null 2>&1 || { echo "testbed.sh: $1 not found: apt-get install $2" >&2; exit 1; }
}

ns_exists() { ip netns list 2>/dev/null | awk '{print $1}' | grep -x -- "$1" >/dev/null; }

down() {
    local ns
    for ns in "$NS_A" "$NS_G" "$NS_B"; do
        # Deleting a namespace destroys the veth ends inside it (and so their peers).
        if ns_exists "$ns"; then ip netns del "$ns" || true; fi
    done
}

undo_partial_up() {
    local rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "testbed.sh: up failed, removing the partial bed" >&2
        down
    fi
}

up() {
    need ip iproute2
    [ "$(id -u)" -eq 0 ] || { echo "testbed.sh: up needs root (network namespaces)" >&2; exit 1; }
    local ns
    for ns in "$NS_A" "$NS_G" "$NS_B"; do
        if ns_exists "$ns"; then
            echo "testbed.sh: namespace $ns already exists: run 'testbed.sh --name $N down' first" >&2
            exit 1
        fi
    done
    # From here on, any failure (or Ctrl-C) removes what was made.
    trap 'exit 130' INT TERM
    trap undo_partial_up EXIT

    for ns in "$NS_A" "$NS_G" "$NS_B"; do
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
    done
    ip netns exec "$NS_G" sysctl -qw net.ipv4.ip_forward=0

    # Each pair is created inside its namespaces directly: names are local to them.
    ip -n "$NS_A" link add "$A_IF" numtxqueues "$Q" numrxqueues "$Q" address "$A_MAC" type veth \
        peer name "$GA_IF" netns "$NS_G" numtxqueues "$Q" numrxqueues "$Q" address "$GA_MAC"
    ip -n "$NS_B" link add "$B_IF" numtxqueues "$Q" numrxqueues "$Q" address "$B_MAC" type veth \
        peer name "$GB_IF" netns "$NS_G" numtxqueues "$Q" numrxqueues "$Q" address "$GB_MAC"

    ip -n "$NS_A" addr add "$A_IP/24" dev "$A_IF"
    ip -n "$NS_G" addr add "$GA_IP/24" dev "$GA_IF"
    ip -n "$NS_G" addr add "$GB_IP/24" dev "$GB_IF"
    ip -n "$NS_B" addr add "$B_IP/24" dev "$B_IF"

    # Static neighbours both ways on each link: no ARP on the test path.
    ip -n "$NS_A" neigh replace "$GA_IP" lladdr "$GA_MAC" dev "$A_IF" nud permanent
    ip -n "$NS_G" neigh replace "$A_IP" lladdr "$A_MAC" dev "$GA_IF" nud permanent
    ip -n "$NS_G" neigh replace "$B_IP" lladdr "$B_MAC" dev "$GB_IF" nud permanent
    ip -n "$NS_B" neigh replace "$GB_IP" lladdr "$GB_MAC" dev "$B_IF" nud permanent

    ip -n "$NS_A" link set "$A_IF" up
    ip -n "$NS_G" link set "$GA_IF" up
    ip -n "$NS_G" link set "$GB_IF" up
    ip -n "$NS_B" link set "$B_IF" up
    trap - EXIT INT TERM
    print_env
}

case "$CMD" in
    up) up ;;
    down) need ip iproute2; down ;;
    env) print_env ;;
esac
