# Shared by scripts/bench-channel.sh and scripts/bench-relay.sh (sourced, not run): the
# placement on the bed and the configurations both put on it. Expects the bed's variables
# (scripts/testbed.sh env: *_NS, *_IF, *_IP), NCPU, RELAY_CPU, GEN_CPU, A_BASE, EG_BASE,
# SINK_BASE and ADMIN (the admin listen address vgate gets).
# shellcheck shell=bash

inns() { local ns=$1; shift; ip netns exec "$ns" "$@"; }

# Mode xdp: the senders' UDP checksums complete (the fast path updates them incrementally)
# and NAPI on the sinks' veth (it takes XDP redirects only then); for every configuration
# of a run that has xdp in it. Fails when ethtool is missing.
xdp_bed() {
    command -v ethtool >/dev/null || return 1
    inns "$A_NS" ethtool -K "$A_IF" tx off >/dev/null
    inns "$B_NS" ethtool -K "$B_IF" gro on >/dev/null
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

vgate_config() { # mode n file
    local mode=$1 n=$2 f=$3 i
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
