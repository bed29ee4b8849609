# Shared by scripts/bench-channel.sh and scripts/bench-relay.sh (sourced, not run): the
# placement on the bed and the configurations both put on it. Expects the bed's variables
# (scripts/testbed.sh env: *_NS, *_IF, *_IP), NCPU, RELAY_CPU, GEN_CPU, A_BASE, EG_BASE,
# SINK_BASE and ADMIN (the admin listen address vgate gets).
# shellcheck shell=bash

inns() { local ns=$1; shift; ip netns exec "$ns" "$@"; }

# Mode xdp: the senders' UDP checksums complete (the fast path updates them incrementally)
# and NAPI on the sinks' veth (it takes XDP redirects only then); for every configuration
# of a run that has xdp in it. Fails when ethtool is missing or a step fails.
xdp_bed() {
    command -v ethtool >/dev/null || return 1
    inns "$A_NS" ethtool -K "$A_IF" tx off >/dev/null || return 1
    inns "$B_NS" ethtool -K "$B_IF" gro on >/dev/null || return 1
}

# Receive processing of the gateway's interfaces on the relay core, of A's and B's on the
# generator core (veth hands frames to the backlog of the sending CPU unless RPS says other).
steer() {
    [ "$NCPU" -gt 1 ] || return 0
    local rmask gmask q
    rmask=$(printf '%x' $((1 << RELAY_CPU)))
    gmask=$(printf '%x' $((1 << GEN_CPU)))
    for q in 0 1; do
        inns "$G_NS" sh -c "echo $rmask > /sys/class/net/$GA_IF/queues/rx-$q/rps_cpus; echo $rmask > /sys/class/net/$GB_IF/queues/rx-$q/rps_cpus"
        inns "$A_NS" sh -c "echo $gmask > /sys/class/net/$A_IF/queues/rx-$q/rps_cpus"
        inns "$B_NS" sh -c "echo $gmask > /sys/class/net/$B_IF/queues/rx-$q/rps_cpus"
    done
}

# codec (optional, scripts/bench-relay.sh --media): each route says what it carries; validate
# off | count | enforce. ps routes also take the stream's SSRC (blast's 0x56470000 + i), as a
# GB/T 28181 y= line would give it; h264 learns it from the first packet.
vgate_config() { # mode n file [codec validate]
    local mode=$1 n=$2 f=$3 codec=${4:-} validate=${5:-off} i media=""
    {
        cat <<EOF
# Written by $(basename "$0"): $n static stream routes A -> B.
[domains.a]
interface = "$GA_IF"
address = "$GA_IP"
networks = ["10.201.1.0/24"]
media_ports = "20000-29999"
[domains.b]
interface = "$GB_IF"
address = "$GB_IP"
networks = ["10.201.2.0/24"]
media_ports = "30000-39999"
[engine]
mode = "$mode"
queues = 1
cpus = [$RELAY_CPU]
[security]
# strict on the senders' address: iperf's datagrams are not RTP, and latch latches a source
# only with RTP (a probe must not capture a route), so latch would drop them all as not_rtp.
source_validation = "strict"
[control]
listen = "$ADMIN"
EOF
        for ((i = 0; i < n; i++)); do
            printf '[[stream_route]]\nname = "s%d"\ndomain = "a"\nport = %d\ndestination = "%s:%d"\negress_port = %d\nexpect_source = "%s:0"\n' \
                "$i" $((A_BASE + i)) "$B_IP" $((SINK_BASE + i)) $((EG_BASE + i)) "$A_IP"
            if [ -n "$codec" ]; then
                if [ "$validate" = off ]; then
                    media='{ validate = "off" }'
                elif [ "$codec" = ps ]; then
                    media="{ validate = \"$validate\", codec = \"ps\", payload_types = [96], ssrc = $((0x56470000 + i)) }"
                else
                    media="{ validate = \"$validate\", codec = \"$codec\", payload_types = [96] }"
                fi
                printf 'media = %s\n' "$media"
            fi
        done
    } > "$f"
}

nat_rules() { # n file
    local n=$1 f=$2 i sep=""
    {
        echo "table ip vgbench {"
        echo "  chain pre {"
        echo "    type nat hook prerouting priority dstnat; policy accept;"
        printf '    iifname "%s" ip daddr %s udp dport %d-%d dnat to %s : udp dport map {' \
            "$GA_IF" "$GA_IP" "$A_BASE" $((A_BASE + n - 1)) "$B_IP"
        for ((i = 0; i < n; i++)); do printf '%s %d : %d' "$sep" $((A_BASE + i)) $((SINK_BASE + i)); sep=","; done
        echo " }"
        echo "  }"
        echo "  chain post {"
        echo "    type nat hook postrouting priority srcnat; policy accept;"
        echo "    oifname \"$GB_IF\" snat to $GB_IP"
        echo "  }"
        echo "}"
    } > "$f"
}

# ---- feed "nic" (xdpcost branch): frames reach the gateway as a NIC would hand them up ----
# On veth, an interface with an XDP program copies every frame of a locally built skb (a
# kmalloc'ed head, or headroom < 256) into a page-pool page before the program runs
# (`veth_convert_skb_to_xdp_buff` → `skb_pp_cow_data`, kernel 6.18); a NIC driver does not. So
# on the plain bed the generator's frames cost mode xdp (and zc) a copy the kernel baselines,
# which take them without XDP, do not pay. `nic_feed` puts a bridge hop between A and the
# gateway: A's va ── h1 [namespace ${BED}h: bridge, XDP_PASS program on h1] h2 ── ga. The copy
# happens once at h1 (on the generator's core, in every configuration alike) and what h2
# sends on is the kind of skb a NIC driver builds (page-backed head, 256 bytes of headroom):
# the gateway's XDP program runs on it in place. Names, addresses and MACs of va and ga are
# the bed's, so nothing else changes. Expects XDPPASS (the built scripts/bench/xdppass.c);
# the caller deletes the namespace (`nic_feed_down`). Every step ends in `|| return 1`: a
# caller's `nic_feed || die` turns `set -e` off inside the function.
nic_feed() {
    local h="${BED}h" q=${QUEUES:-2}
    ip netns add "$h" || return 1
    ip -n "$h" link set lo up || return 1
    inns "$h" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 || return 1
    # Bridged frames skip netfilter here (br_netfilter is built in on these kernels; its
    # switches are per namespace).
    # shellcheck disable=SC2016  # expanded by the inner shell
    inns "$h" sh -c 'for f in /proc/sys/net/bridge/bridge-nf-call-*; do [ -w "$f" ] && echo 0 > "$f"; done; true' || return 1
    ip -n "$A_NS" link del "$A_IF" || return 1   # takes ga with it
    ip -n "$A_NS" link add "$A_IF" numtxqueues "$q" numrxqueues "$q" address "$A_MAC" type veth \
        peer name h1 netns "$h" numtxqueues "$q" numrxqueues "$q" || return 1
    ip -n "$h" link add h2 numtxqueues "$q" numrxqueues "$q" type veth \
        peer name "$GA_IF" netns "$G_NS" numtxqueues "$q" numrxqueues "$q" address "$GA_MAC" || return 1
    ip -n "$A_NS" addr add "$A_IP/24" dev "$A_IF" || return 1
    ip -n "$G_NS" addr add "$GA_IP/24" dev "$GA_IF" || return 1
    ip -n "$A_NS" neigh replace "$GA_IP" lladdr "$GA_MAC" dev "$A_IF" nud permanent || return 1
    ip -n "$G_NS" neigh replace "$A_IP" lladdr "$A_MAC" dev "$GA_IF" nud permanent || return 1
    ip -n "$h" link add br0 type bridge || return 1
    ip -n "$h" link set h1 master br0 || return 1
    ip -n "$h" link set h2 master br0 || return 1
    # Static forwarding entries: no flooding, no learning delay.
    bridge -n "$h" fdb replace "$GA_MAC" dev h2 master static || return 1
    bridge -n "$h" fdb replace "$A_MAC" dev h1 master static || return 1
    local l
    for l in h1 h2 br0; do ip -n "$h" link set "$l" up || return 1; done
    ip -n "$A_NS" link set "$A_IF" up || return 1
    ip -n "$G_NS" link set "$GA_IF" up || return 1
    inns "$h" "$XDPPASS" h1 >/dev/null || return 1
}

nic_feed_down() {
    ip netns list 2>/dev/null | awk '{print $1}' | grep -qx -- "${BED}h" && ip netns del "${BED}h"
    return 0
}
