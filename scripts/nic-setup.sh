#!/usr/bin/env bash
# Prepare the NICs of a vgate appliance: one RSS queue per vgate worker, UDP hashed by
# 4-tuple, rings sized, each queue's IRQ on its worker's CPU, irqbalance kept off them, and
# (for PF_RING builds) the pf_ring module and hugepages.
#
# Usage: nic-setup.sh [--dry-run] --queues N --cpus "C1 C2 ..." [--ring SLOTS]
#                     [--pfring] [--hugepages N] IFACE [IFACE ...]
#
#   --queues N     RSS queues per interface (= engine.queues of vgate.toml)
#   --cpus LIST    the CPU of each queue, as engine.cpus (keep CPU 0 free on big machines)
#   --ring SLOTS   RX/TX ring size (default 4096; the 82599 allows up to 4096)
#   --pfring       load pf_ring.ko with parameters for per-queue rings
#   --hugepages N  reserve N 2 MiB hugepages (PF_RING ZC)
#   --dry-run      print every command, change nothing
#
# Why: Intel NICs hash UDP by address pair only by default (all streams between two hosts on
# one queue); `rx-flow-hash udp4 sdfn` spreads them by ports too. irqbalance would move the
# queue IRQs off the CPUs vgate pins its workers to. Features a NIC lacks (veth has no
# flow-hash or ring settings) are reported as warnings, not errors.
set -euo pipefail

DRY=0
QUEUES=""
CPUS=""
RING=4096
PFRING=0
HUGEPAGES=0
IFACES=()
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY=1; shift ;;
        --queues) QUEUES="${2:?}"; shift 2 ;;
        --cpus) CPUS="${2:?}"; shift 2 ;;
        --ring) RING="${2:?}"; shift 2 ;;
        --pfring) PFRING=1; shift ;;
        --hugepages) HUGEPAGES="${2:?}"; shift 2 ;;
        -h|--help) usage ;;
        -*) echo "nic-setup.sh: unknown option $1" >&2; usage ;;
        *) IFACES+=("$1"); shift ;;
    esac
done
[ ${#IFACES[@]} -gt 0 ] || { echo "nic-setup.sh: name at least one interface" >&2; usage; }
[[ "$QUEUES" =~ ^[1-9][0-9]*$ ]] || { echo "nic-setup.sh: --queues N is required (engine.queues)" >&2; exit 2; }
read -r -a CPU_LIST <<< "$CPUS"
[ ${#CPU_LIST[@]} -eq "$QUEUES" ] || { echo "nic-setup.sh: --cpus must list one CPU per queue ($QUEUES)" >&2; exit 2; }
NCPU=$(nproc --all)
for c in "${CPU_LIST[@]}"; do
    if ! [[ "$c" =~ ^[0-9]+$ ]] || [ "$c" -ge "$NCPU" ]; then
        echo "nic-setup.sh: CPU $c does not exist (0-$((NCPU-1)))" >&2; exit 2
    fi
    if [ "$c" -eq 0 ] && [ "$NCPU" -gt 2 ]; then
        echo "nic-setup.sh: warning: CPU 0 is in --cpus; keep it for the kernel and the rest of the system" >&2
    fi
done

# run CMD...: print it; unless --dry-run, run it and return its status.
run() {
    echo "+ $*"
    [ "$DRY" = 1 ] && return 0
    "$@"
}

# optional WHAT CMD...: like run, but a NIC that does not support it is a warning.
optional() {
    local what="$1"; shift
    echo "+ $*"
    [ "$DRY" = 1 ] && return 0
    local out
    if ! out=$("$@" 2>&1) || grep -qi "not supported" <<< "$out"; then
        echo "nic-setup.sh: warning: $what: ${out:-failed} (needed on a real NIC, expected on veth)" >&2
    fi
}

command -v ethtool >/dev/null || { echo "nic-setup.sh: ethtool not found: apt-get install ethtool" >&2; exit 1; }

BANNED=""
for ifc in "${IFACES[@]}"; do
    [ -e "/sys/class/net/$ifc" ] || { echo "nic-setup.sh: no interface named $ifc" >&2; exit 1; }
    echo "# $ifc: $QUEUES queues on CPUs ${CPU_LIST[*]}"
    # Queue count: combined channels on Intel NICs, separate rx/tx on others (veth). Reading
    # the channel settings changes nothing, so the dry run asks too.
    if ! ethtool -l "$ifc" 2>/dev/null | grep -A4 "Current" | grep -q "^Combined:[[:space:]]*n/a"; then
        optional "$ifc queue count" ethtool -L "$ifc" combined "$QUEUES"
    else
        run ethtool -L "$ifc" rx "$QUEUES" tx "$QUEUES"
    fi
    optional "$ifc UDP 4-tuple hashing" ethtool -N "$ifc" rx-flow-hash udp4 sdfn
    optional "$ifc ring size" ethtool -G "$ifc" rx "$RING" tx "$RING"
    # IRQ of queue q → CPU of worker q. Names: ixgbe "eth1-TxRx-3", others "eth1-3", "eth1-rx-3".
    q=0
    while read -r irq name; do
        cpu=${CPU_LIST[$((q % QUEUES))]}
        run sh -c "echo $cpu > /proc/irq/$irq/smp_affinity_list"
        BANNED="$BANNED $irq"
        echo "#   $name (IRQ $irq) -> CPU $cpu"
        q=$((q + 1))
    done < <(awk -v ifc="$ifc" '$NF ~ "^"ifc"[-:]" { sub(":", "", $1); print $1, $NF }' /proc/interrupts)
    [ "$q" -gt 0 ] || echo "# $ifc has no queue IRQs of its own (virtual interface): nothing to pin"
done

if [ -n "$BANNED" ]; then
    if command -v irqbalance >/dev/null || [ -e /etc/default/irqbalance ]; then
        args=""
        for irq in $BANNED; do args="$args --banirq=$irq"; done
        run sh -c "echo 'IRQBALANCE_ARGS=\"$args\"' > /etc/default/irqbalance"
        run systemctl try-restart irqbalance.service
    fi
fi
if [ "$PFRING" = 1 ]; then
    # One slot per packet of a 10 GbE burst; TX capture off (vgate never needs its own TX).
    run modprobe pf_ring min_num_slots=65536 enable_tx_capture=0 quick_mode=0
fi
if [ "$HUGEPAGES" -gt 0 ]; then
    run sh -c "echo $HUGEPAGES > /proc/sys/vm/nr_hugepages"
fi
if [ "$DRY" = 1 ]; then
    echo "# nic-setup done (dry run: nothing changed)"
else
    echo "# nic-setup done"
fi
