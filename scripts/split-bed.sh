#!/usr/bin/env bash
# vgate split bed: the split appliance's real topology in four network namespaces.
#
#  ${N}da (domain A)        ${N}ha (half A)                    ${N}hb (half B)        ${N}db (domain B)
#   va 10.211.1.2 ──── ga 10.211.1.1                          gb 10.211.2.1 ──── vb 10.211.2.2
#                         sa 10.211.0.1 ══ signaling (both ways) ══ sb 10.211.0.2
#                         fa 10.211.3.1 ── forward link A→B ──► fb 10.211.3.2
#                         ra 10.211.4.1 ◄── reverse link B→A ── rb 10.211.4.2
#
# The two link pairs are used one way each: an nftables netdev ingress rule at the end that
# must never receive (fa on the forward link, rb on the reverse link) drops and counts every
# packet that travelled the wrong way — ARP, IPv6, ICMP, anything. `counters` prints them;
# a test fails if they are not 0. Loss is injected at the receiving end with
# `numgen random mod 1000 < N` (there is no tc netem here).
#
# The halves' link interfaces are set up as an operator would (see harden_link): IPv6 off
# (so no ND, no MLD), ARP never answered (arp_ignore=8), no ICMP echo answers, and on each
# half's receive-only interface (fb in half B, ra in half A) an nftables netdev egress rule
# that drops and counts everything the host would send there — ARP, ICMP errors (a half
# that is down draws port unreachables for the media still arriving), LLDP, anything. No
# LLDP agent runs in the bed. vgate installs the permanent neighbour of its outgoing link
# itself (split.out_link.peer_mac). The halves have ip_forward=0; nothing routes between
# domains but vgate. Every address lives inside these namespaces, with no default route: no
# traffic can leave them.
#
# Usage: split-bed.sh [--name PREFIX] [--queues N] up|down|env|counters|loss forward|reverse PERMILLE|burst forward|reverse LEN PERIOD|guard on|off
#   up        create the bed (a partial bed is removed on failure), print KEY=value lines;
#             --queues N (1-4, default 1): RX/TX queues of the domain and link veths (what
#             a half with engine.queues = N workers needs in modes tnapi and zc)
#   down      remove everything; safe twice or after a failed up
#   env       print the KEY=value lines
#   counters  print FWD_WRONG, REV_WRONG (wrong-direction drops at the far end), A_LEAK,
#             B_LEAK (what half A / half B tried to send on its receive-only interface,
#             dropped there), FWD_LOSS, REV_LOSS (injected losses) as KEY=value
#   loss      drop PERMILLE/1000 of the packets arriving on a link (0 removes the loss)
#   burst     drop LEN consecutive packets of every PERIOD arriving on a link (numgen inc; loss 0 removes)
#   guard     on (the default after up): the receive-only interfaces' egress drop; off
#             removes it (a test that proves the wrong-direction counter counts)
# The prefix (1-12 characters) comes from --name, else $VGATE_SPLIT_BED, else vsb$$.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }

N="${VGATE_SPLIT_BED:-vsb$$}"
QUEUES=1
CMD=""
ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --name) N="${2:?--name needs a value}"; shift 2 ;;
        --name=*) N="${1#*=}"; shift ;;
        --queues) QUEUES="${2:?--queues needs a value}"; shift 2 ;;
        -h|--help) usage ;;
        up|down|env|counters|loss|burst|guard) CMD="$1"; shift; ARGS=("$@"); break ;;
        *) echo "split-bed.sh: unknown argument '$1'" >&2; usage ;;
    esac
done
[ -n "$CMD" ] || usage
if ! [[ "$QUEUES" =~ ^[1-4]$ ]]; then
    echo "split-bed.sh: --queues must be 1 to 4" >&2; exit 2
fi
if ! [[ "$N" =~ ^[A-Za-z0-9_-]{1,12}$ ]]; then
    echo "split-bed.sh: bed name '$N' must be 1-12 letters, digits, '_' or '-'" >&2; exit 2
fi

NS_DA="${N}da" NS_HA="${N}ha" NS_HB="${N}hb" NS_DB="${N}db"
DA_IP=10.211.1.2 GA_IP=10.211.1.1 GB_IP=10.211.2.1 DB_IP=10.211.2.2
SA_IP=10.211.0.1 SB_IP=10.211.0.2
FA_IP=10.211.3.1 FB_IP=10.211.3.2 RA_IP=10.211.4.1 RB_IP=10.211.4.2
VA_MAC=02:d3:01:00:00:02 GA_MAC=02:d3:01:00:00:01 GB_MAC=02:d3:02:00:00:01 VB_MAC=02:d3:02:00:00:02
SA_MAC=02:d3:00:00:00:01 SB_MAC=02:d3:00:00:00:02
FA_MAC=02:d3:03:00:00:01 FB_MAC=02:d3:03:00:00:02 RA_MAC=02:d3:04:00:00:01 RB_MAC=02:d3:04:00:00:02

print_env() {
    cat <<EOV
BED=$N
DA_NS=$NS_DA
HA_NS=$NS_HA
HB_NS=$NS_HB
DB_NS=$NS_DB
DA_IP=$DA_IP
GA_IP=$GA_IP
GB_IP=$GB_IP
DB_IP=$DB_IP
SA_IP=$SA_IP
SB_IP=$SB_IP
FA_IP=$FA_IP
FB_IP=$FB_IP
RA_IP=$RA_IP
RB_IP=$RB_IP
FA_MAC=$FA_MAC
FB_MAC=$FB_MAC
RA_MAC=$RA_MAC
RB_MAC=$RB_MAC
SA_MAC=$SA_MAC
SB_MAC=$SB_MAC
EOV
}

need() {
    command -v "$1" >/dev/null 2>&1 || { echo "split-bed.sh: $1 not found: apt-get install $2" >&2; exit 1; }
}

ns_exists() { ip netns list 2>/dev/null | awk '{print $1}' | grep -x -- "$1" >/dev/null; }

down() {
    local ns
    for ns in "$NS_DA" "$NS_HA" "$NS_HB" "$NS_DB"; do
        if ns_exists "$ns"; then ip netns del "$ns" || true; fi
    done
}

undo_partial_up() {
    local rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "split-bed.sh: up failed, removing the partial bed" >&2
        down
    fi
}

# veth NS1 IF1 MAC1 IP1 NS2 IF2 MAC2 IP2 [QUEUES]
veth() {
    local q=${9:-1}
    ip -n "$1" link add "$2" address "$3" numtxqueues "$q" numrxqueues "$q" type veth \
        peer name "$6" netns "$5" address "$7" numtxqueues "$q" numrxqueues "$q"
    ip -n "$1" addr add "$4/24" dev "$2"
    ip -n "$5" addr add "$8/24" dev "$6"
    ip -n "$1" link set "$2" up
    ip -n "$5" link set "$6" up
}

# What an operator does to a one-way link interface of a half: the host never answers on it.
harden_link() {
    local ns=$1 ifc=$2
    ip netns exec "$ns" sysctl -qw "net.ipv4.conf.$ifc.arp_ignore=8" "net.ipv4.conf.$ifc.arp_announce=2" \
        "net.ipv6.conf.$ifc.disable_ipv6=1"
}

# link_rules NS WRONG_IF RX_IF: in NS, drop and count everything arriving on WRONG_IF (the
# end of a one-way link that must never receive), prepare the loss chain on RX_IF (the
# receive-only end) and drop and count everything the host would send out of RX_IF.
link_rules() {
    ip netns exec "$1" nft -f - <<NFT
table netdev splitbed {
    counter wrong { }
    counter loss { }
    counter leak { }
    chain wrong_in { type filter hook ingress device "$2" priority 0; counter name wrong drop; }
    chain loss_in { type filter hook ingress device "$3" priority 0; }
    chain leak_out { type filter hook egress device "$3" priority 0; counter name leak drop; }
}
NFT
}

guard() {
    local ns
    case "${1:-}" in
        on|off) ;;
        *) echo "split-bed.sh: guard on|off" >&2; exit 2 ;;
    esac
    for ns in "$NS_HA" "$NS_HB"; do
        ip netns exec "$ns" nft flush chain netdev splitbed leak_out
        if [ "$1" = on ]; then
            ip netns exec "$ns" nft add rule netdev splitbed leak_out counter name leak drop
        fi
    done
}

up() {
    need ip iproute2
    need nft nftables
    [ "$(id -u)" -eq 0 ] || { echo "split-bed.sh: up needs root (network namespaces)" >&2; exit 1; }
    local ns
    for ns in "$NS_DA" "$NS_HA" "$NS_HB" "$NS_DB"; do
        if ns_exists "$ns"; then
            echo "split-bed.sh: namespace $ns already exists: run 'split-bed.sh --name $N down' first" >&2
            exit 1
        fi
    done
    trap 'exit 130' INT TERM
    trap undo_partial_up EXIT
    for ns in "$NS_DA" "$NS_HA" "$NS_HB" "$NS_DB"; do
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 \
            net.ipv4.ip_forward=0 net.ipv4.icmp_echo_ignore_all=1
    done
    veth "$NS_DA" va "$VA_MAC" "$DA_IP" "$NS_HA" ga "$GA_MAC" "$GA_IP" "$QUEUES"
    veth "$NS_HB" gb "$GB_MAC" "$GB_IP" "$NS_DB" vb "$VB_MAC" "$DB_IP" "$QUEUES"
    veth "$NS_HA" sa "$SA_MAC" "$SA_IP" "$NS_HB" sb "$SB_MAC" "$SB_IP"
    # One-way links with --queues queues too: a half in mode zc sends its link from an
    # AF_XDP socket per worker, each on its own TX queue.
    veth "$NS_HA" fa "$FA_MAC" "$FA_IP" "$NS_HB" fb "$FB_MAC" "$FB_IP" "$QUEUES"
    veth "$NS_HB" rb "$RB_MAC" "$RB_IP" "$NS_HA" ra "$RA_MAC" "$RA_IP" "$QUEUES"
    # Domains: static neighbours both ways (the domain side is not what is tested here).
    ip -n "$NS_DA" neigh replace "$GA_IP" lladdr "$GA_MAC" dev va nud permanent
    ip -n "$NS_HA" neigh replace "$DA_IP" lladdr "$VA_MAC" dev ga nud permanent
    ip -n "$NS_HB" neigh replace "$DB_IP" lladdr "$VB_MAC" dev gb nud permanent
    ip -n "$NS_DB" neigh replace "$GB_IP" lladdr "$GB_MAC" dev vb nud permanent
    # Signaling link: bidirectional, static neighbours.
    ip -n "$NS_HA" neigh replace "$SB_IP" lladdr "$SB_MAC" dev sa nud permanent
    ip -n "$NS_HB" neigh replace "$SA_IP" lladdr "$SA_MAC" dev sb nud permanent
    harden_link "$NS_HA" fa
    harden_link "$NS_HB" fb
    harden_link "$NS_HB" rb
    harden_link "$NS_HA" ra
    # The wrong direction of each one-way link: whatever arrives there is dropped and counted.
    link_rules "$NS_HA" fa ra
    link_rules "$NS_HB" rb fb
    trap - EXIT INT TERM
    print_env
}

counter() { # NS NAME
    ip netns exec "$1" nft list counter netdev splitbed "$2" | awk '/packets/ {for (i=1;i<=NF;i++) if ($i=="packets") print $(i+1)}'
}

counters() {
    echo "FWD_WRONG=$(counter "$NS_HA" wrong)"
    echo "REV_WRONG=$(counter "$NS_HB" wrong)"
    echo "A_LEAK=$(counter "$NS_HA" leak)"
    echo "B_LEAK=$(counter "$NS_HB" leak)"
    echo "FWD_LOSS=$(counter "$NS_HB" loss)"
    echo "REV_LOSS=$(counter "$NS_HA" loss)"
}

loss() {
    local link=${1:-} permille=${2:-}
    if ! [[ "$permille" =~ ^[0-9]+$ ]] || [ "$permille" -gt 1000 ]; then
        echo "split-bed.sh: loss forward|reverse PERMILLE (0-1000)" >&2; exit 2
    fi
    local ns
    case "$link" in
        forward) ns=$NS_HB ;;
        reverse) ns=$NS_HA ;;
        *) echo "split-bed.sh: loss forward|reverse PERMILLE" >&2; exit 2 ;;
    esac
    ip netns exec "$ns" nft flush chain netdev splitbed loss_in
    if [ "$permille" -gt 0 ]; then
        ip netns exec "$ns" nft add rule netdev splitbed loss_in numgen random mod 1000 "<" "$permille" counter name loss drop
    fi
}

# burst forward|reverse LEN PERIOD: drops LEN consecutive frames of every PERIOD (from its
# middle; `numgen inc`), counted like loss.
burst() {
    local link=${1:-} len=${2:-} period=${3:-}
    if ! [[ "$len" =~ ^[0-9]+$ && "$period" =~ ^[0-9]+$ ]] || [ "$len" -ge "$period" ]; then
        echo "split-bed.sh: burst forward|reverse LEN PERIOD (LEN < PERIOD)" >&2; exit 2
    fi
    local ns
    case "$link" in
        forward) ns=$NS_HB ;;
        reverse) ns=$NS_HA ;;
        *) echo "split-bed.sh: burst forward|reverse LEN PERIOD" >&2; exit 2 ;;
    esac
    ip netns exec "$ns" nft flush chain netdev splitbed loss_in
    # The middle of each period, so a stream's first frames are not in its first burst.
    local from=$((period / 2))
    ip netns exec "$ns" nft add rule netdev splitbed loss_in numgen inc mod "$period" "$from-$((from + len - 1))" counter name loss drop
}

case "$CMD" in
    up) up ;;
    down) need ip iproute2; down ;;
    env) print_env ;;
    counters) counters ;;
    loss) loss "${ARGS[@]}" ;;
    burst) burst "${ARGS[@]}" ;;
    guard) guard "${ARGS[@]}" ;;
esac
