#!/usr/bin/env python3
"""The table of scripts/bench-relay.sh from its raw JSON lines (one per point).

Per configuration and stream count, the median over rounds of: the rate the generator
offered and how far behind its schedule it fell, the loss the gateway caused (sent - what the relay
sent, by its own count; for the kernel's configurations sent - received - what the sinks'
sockets dropped) and the loss after it (the relay's sent - received, or the sinks' socket drops), the relay core's busy time per
packet sent (from /proc/stat, softirq counted once), the extra over plain routing in the same
round, that extra as a ratio to the kernel DNAT's and to the C relay's, the relay process's own
CPU time per packet, and the sinks' p50/p99 one-way latency. A point where the generator fell
behind by more than 1 % or where packets were lost after the gateway is flagged and not used for the zero-loss
stream count.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import sys
from collections import defaultdict

BEHIND = 0.01       # generator behind its schedule by more than this: not the relay's point
ZERO_LOSS = 1e-4    # loss below 0.01 % counts as zero


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, spec=".2f", none="-"):
    return none if x is None else format(x, spec)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("raw")
    ap.add_argument("--hz", type=float, required=True)
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--command", default="")
    ap.add_argument("--load", default="")
    ap.add_argument("--rev", default="")
    ap.add_argument("--note", default="")
    a = ap.parse_args()
    allpts = [json.loads(l) for l in open(a.raw) if l.strip()]
    mem = [p for p in allpts if p["cfg"] == "memory"]
    act = [p for p in allpts if p["cfg"] == "activation"]
    pts = [p for p in allpts if p["cfg"] not in ("memory", "activation")]
    tick_us = 1e6 / a.hz
    idle = [p["core_ticks"] * tick_us / 1e6 / p["seconds"] for p in pts if p["cfg"] == "idle"]
    # Per round and N: the route's core us/packet, the reference for "extra".
    per = {}
    for p in pts:
        if p["cfg"] == "idle" or "failed" in p:
            continue
        sent = p["gen"]["sent"]
        if sent <= 0:
            continue
        core = p["core_ticks"] * tick_us / sent
        recv = p["sink"]["received"]
        sink_drop = p["sink_udp_errors"]
        tx = None if p["cfg"] in ("route", "kernel") else p.get("relay_tx")
        if tx is not None:
            # The relay says what it sent: what it did not is the gateway's loss, what it sent
            # and the sinks did not get was lost after it.
            gw_loss = max(sent - tx, 0) / sent
            after = max(tx - recv, sink_drop, 0) / sent
        else:
            gw_loss = max(sent - recv - sink_drop, 0) / sent
            after = sink_drop / sent
        per[(p["cfg"], p["n"], p["run"])] = dict(
            offered=sent / a.seconds,
            behind=p["gen"]["behind"],
            gw_loss=gw_loss,
            sink_loss=after,
            core=core,
            proc=(p["relay_ticks"] * tick_us / sent) if p["relay_ticks"] else None,
            allcore=(p["all_ticks"] * tick_us / sent) if "all_ticks" in p else None,
            sys=(p["relay_syscalls"] / sent) if p.get("relay_syscalls") is not None else None,
            sw=(p["relay_switches"] / sent) if p.get("relay_switches") is not None else None,
            bpf=(p["bpf_ns"] / 1e3 / sent) if p.get("bpf_ns") else None,
            p50=p["sink"]["p50_us"],
            p99=p["sink"]["p99_us"],
            # The kernel's configurations have no relay process to report its own counts.
            rx=None if p["cfg"] in ("route", "kernel") else p.get("relay_rx"),
            tx=None if p["cfg"] in ("route", "kernel") else p.get("relay_tx"),
            drops=p.get("relay_drops") or {},
            media=p.get("media_violations") or {},
            # Datagrams per sendmmsg call of the generator (paced: about 1).
            per_call=(sent / p["gen"]["calls"]) if p["gen"].get("calls") else None,
        )
    for (cfg, n, r), v in per.items():
        ref = per.get(("route", n, r))
        v["extra"] = v["core"] - ref["core"] if ref else None
        v["extra_all"] = (v["allcore"] - ref["allcore"]
                          if ref and v["allcore"] is not None and ref["allcore"] is not None else None)
    failed = {}
    for p in pts:
        if "failed" in p:
            failed[p["cfg"]] = p["failed"]
    cfgs = []
    for p in pts:
        if p["cfg"] != "idle" and p["cfg"] not in cfgs:
            cfgs.append(p["cfg"])
    ns = sorted({p["n"] for p in pts if p["cfg"] != "idle"})
    rows = defaultdict(dict)
    for cfg in cfgs:
        for n in ns:
            vs = [v for (c, m, _), v in per.items() if c == cfg and m == n]
            if not vs:
                continue
            rows[cfg][n] = {k: (med([v[k] for v in vs]) if all(v[k] is not None for v in vs) else None)
                            for k in vs[0] if k not in ("drops", "media")}
            # Drop counters by reason, summed over the rounds.
            rows[cfg][n]["drops"] = {r: sum(v["drops"].get(r, 0) for v in vs)
                                     for v0 in vs for r in v0["drops"]}
            rows[cfg][n]["runs"] = len(vs)
            rows[cfg][n]["media"] = {r: sum(v["media"].get(r, 0) for v in vs)
                                     for v0 in vs for r in v0["media"]}
    out = []
    out.append("# What a relay costs the gateway: vgate's modes against the kernel and a plain C relay\n")
    out.append("Generated by `scripts/bench-relay.sh` (issue 12). The channel experiment with iperf2 "
               "([bench-channel.md](bench-channel.md)) reproduces the published model but its generator tops "
               "out first on this bed; this run uses a generator that can outrun the relays, so the limits and "
               "costs below are the relays'.\n")
    if a.note:
        out.append(f"**Note on this run**: {a.note}\n")
    out.append("## Method\n")
    out.append("- **Bed**: `scripts/testbed.sh --queues 2 up`: namespaces A (generator), G (the gateway) and B "
               "(sinks) joined by 2-queue veth pairs; nothing leaves them.")
    out.append("- **Placement** (2 cores): the relay on CPU 1 (vgate's one worker, `engine.queues = 1`, "
               "`cpus = [1]`; the C relay under `taskset`), and RPS puts the gateway interfaces' receive "
               "processing — so also the kernel's forwarding — on CPU 1; generator, sinks and A's and B's "
               "receive processing on CPU 0.")
    out.append("- **Load**: `scripts/bench/blast.c send`: N streams of 10 Mbit/s in 1316-byte RTP-shaped "
               "datagrams (≈ 950 packets/s each), paced on one schedule with `sendmmsg` from one socket, round "
               "robin over the streams; it never sends ahead of its schedule and reports how far behind it "
               "fell. `blast sink`: one socket per port, `recvmmsg`, one-way latency from the send time "
               "embedded in each datagram (same host, `CLOCK_MONOTONIC`).")
    out.append("- **Configurations**, one after the other for each N, rounds outermost: *route* (forwarding on, "
               "A and B route to each other: the reference), *kernel* (nftables DNAT + SNAT: the bound), "
               "*crelay* (`scripts/bench/crelay.c`: one socket per port, epoll, `recvmmsg`/`sendmmsg` batches "
               "of 32: the bar for user space), and vgate's modes with N static routes "
               "(`source_validation = \"latch\"`).")
    out.append("- **CPU**: the relay core's busy time from `/proc/stat` (user + system + irq + softirq), "
               "counted once, per packet sent. Earlier reports added the relay process's time to the core's "
               "softirq time; without `CONFIG_IRQ_TIME_ACCOUNTING` (as here) softirq work that ran while the "
               "process was on the CPU is in both, so that sum counted it twice. *Extra over route* subtracts "
               "plain routing's figure from the same round and N; it also cancels, on average, whatever else "
               "ran on the core. The relay process's own utime + stime is given too (it includes the softirq "
               "work that happened to interrupt it).")
    out.append("- **Counts and whole-machine CPU**: the relay process's system calls and context switches "
               "per packet (`perf stat -e raw_syscalls:sys_enter,context-switches -p PID`, all threads, "
               "counted in the kernel); *all CPUs: extra* = the whole machine's busy time per packet minus "
               "routing's (it includes the generator and sinks, which do the same work in every "
               "configuration); *XDP program* = `run_time_ns / packets` of the `vgate*` XDP programs "
               "attached to the gateway's interfaces (`kernel.bpf_stats_enabled=1` for the run): on veth "
               "XDP runs in the sender's NAPI context, not on the relay core.")
    out.append("- **Loss**: the gateway's = sent − what the relay says it sent (vgate's `tx_packets`, "
               "crelay's `tx`), for the kernel's configurations sent − received − the sinks' UDP errors; "
               "*after the gateway* = what the relay sent that the sinks did not get. A point where the "
               "generator fell more than 1 % behind, or where packets were lost after the gateway, is "
               "flagged and never counted as the relay's.\n")
    out.append("## Figures\n")
    out.append("| config | streams | runs | offered kpps | generator behind % | gateway loss % | loss after the gateway % "
               "| core µs/pkt | extra µs/pkt over route | × kernel's extra | × C relay's extra "
               "| relay process µs/pkt | system calls / context switches per pkt | all CPUs: extra µs/pkt over route "
               "| XDP program µs/pkt | p50 / p99 µs | flag |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for n in ns:
        for cfg in cfgs:
            v = rows[cfg].get(n)
            if not v:
                continue
            k = rows.get("kernel", {}).get(n, {}).get("extra")
            c = rows.get("crelay", {}).get(n, {}).get("extra")
            e = v["extra"]
            xk = e / k if (e is not None and k and cfg not in ("route", "kernel")) else None
            xc = e / c if (e is not None and c and cfg not in ("route", "crelay")) else None
            flags = []
            if v["behind"] > BEHIND:
                flags.append("generator behind")
            if v["sink_loss"] > 0:
                flags.append("lost after the gateway")
            if v["rx"] is not None and v["tx"] is not None and v["rx"] != v["tx"]:
                why = ", ".join(f"{r} {c}" for r, c in sorted(v["drops"].items()))
                flags.append(f"relay rx {v['rx']:.0f} ≠ tx {v['tx']:.0f}" + (f" (dropped: {why})" if why else ""))
            out.append(
                f"| {cfg} | {n} | {v['runs']} | {v['offered'] / 1e3:.1f} | {v['behind'] * 100:.2f} "
                f"| {v['gw_loss'] * 100:.3f} | {v['sink_loss'] * 100:.3f} | {v['core']:.2f} "
                f"| {fmt(e, '+.2f') if cfg != 'route' else '(reference)'} | {fmt(xk)} | {fmt(xc)} "
                f"| {fmt(v['proc'])} | {fmt(v['sys'])} / {fmt(v['sw'])} "
                f"| {fmt(v['extra_all'], '+.2f') if cfg != 'route' else '(reference)'} | {fmt(v['bpf'], '.3f')} "
                f"| {v['p50']:.0f} / {v['p99']:.0f} | {', '.join(flags)} |")
    out.append("")
    gen_calls = [(cfg, n, rows[cfg][n]["per_call"]) for n in ns for cfg in cfgs
                 if n in rows[cfg] and rows[cfg][n].get("per_call") is not None]
    if gen_calls:
        lo = min(c for _, _, c in gen_calls)
        hi = max(c for _, _, c in gen_calls)
        out.append(f"Generator: {lo:.2f}–{hi:.2f} datagrams per `sendmmsg` call (medians per "
                   f"configuration and stream count).")
        out.append("")
    # Validation off / on (--media): MODE+enforce or MODE+count against MODE, per round.
    val = [c for c in cfgs if "+" in c and c.split("+", 1)[0] in cfgs]
    if val:
        out.append("### Media validation: off against on, same streams, same rounds\n")
        out.append("*Added* = the on configuration's relay-core µs/pkt minus the off one's, per round "
                   "(median over rounds); *mode's cost* = the off configuration's extra µs/pkt over "
                   "plain routing; the goal is added ≤ 10 % of it. Violations: every "
                   "`media_REASON` counted on the routes, summed over the rounds (0 expected).\n")
        out.append("| config | streams | off: extra µs/pkt | on: extra µs/pkt | added µs/pkt "
                   "| added per million packets (CPU ms) | added / mode's cost | off / on process µs/pkt "
                   "| off / on p50 µs | off / on p99 µs | off / on gateway loss % | violations |")
        out.append("|---|---:|---:|---:|---:|---:|---:|---|---|---|---|---|")
        for n in ns:
            for cfg in val:
                base = cfg.split("+", 1)[0]
                on, off = rows[cfg].get(n), rows[base].get(n)
                if not on or not off:
                    continue
                adds = [per[(cfg, n, r)]["core"] - per[(base, n, r)]["core"]
                        for (c, m, r) in per if c == cfg and m == n and (base, n, r) in per]
                add = med(adds)
                ratio = add / off["extra"] if (add is not None and off["extra"]) else None
                viol = ", ".join(f"{r} {c}" for r, c in sorted(on["media"].items())) or "0"
                out.append(
                    f"| {cfg} | {n} | {fmt(off['extra'], '+.2f')} | {fmt(on['extra'], '+.2f')} "
                    f"| {fmt(add, '+.3f')} | {fmt(add * 1e3 if add is not None else None, '+.0f')} "
                    f"| {fmt(ratio * 100 if ratio is not None else None, '+.1f')} % "
                    f"| {fmt(off['proc'])} / {fmt(on['proc'])} | {off['p50']:.0f} / {on['p50']:.0f} "
                    f"| {off['p99']:.0f} / {on['p99']:.0f} "
                    f"| {off['gw_loss'] * 100:.3f} / {on['gw_loss'] * 100:.3f} | {viol} |")
        out.append("")
    out.append("Zero-loss stream count (gateway loss < 0.01 %, generator on schedule, nothing lost "
               "after the gateway) per configuration, within this sweep:")
    out.append("")
    for cfg in cfgs:
        ok = [n for n in ns if n in rows[cfg] and rows[cfg][n]["gw_loss"] < ZERO_LOSS
              and rows[cfg][n]["behind"] <= BEHIND and rows[cfg][n]["sink_loss"] == 0]
        bad = [n for n in ns if n in rows[cfg] and n not in ok]
        first_bad = min(bad) if bad else None
        best = max([n for n in ok if first_bad is None or n < first_bad], default=None)
        out.append(f"- {cfg}: {best if best is not None else 'none'}"
                   + (f" (first point not clean: {first_bad})" if first_bad else " (every point clean)"))
    for cfg, why in failed.items():
        out.append(f"- {cfg}: could not start: {why}")
    out.append("")
    if idle:
        out.append(f"Background on the relay core with nothing relayed (other work on the machine): "
                   f"median {statistics.median(idle) * 100:.1f} % busy "
                   f"(min {min(idle) * 100:.1f} %, max {max(idle) * 100:.1f} %) — it is in every "
                   f"'core µs/pkt' figure and cancels, on average, in 'extra over route'.")
    if mem:
        out.append("")
        out.append("Resident memory of the vgate process (VmRSS), idle after start-up and after relaying "
                   "2 s of traffic over up to 1000 of the routes:")
        out.append("")
        out.append("| mode | routes | RSS idle MiB | RSS after traffic MiB | open files | of which sockets |")
        out.append("|---|---:|---:|---:|---:|---:|")
        for m in mem:
            fds = m.get("fds", "-")
            socks = m.get("sockets", "-")
            out.append(f"| {m['mode']} | {m['routes']} | {m['rss_idle_kb'] / 1024:.1f} | "
                       f"{m['rss_after_kb'] / 1024:.1f} | {fds} | {socks} |")
        short = sorted({(m["mode"], m["routes"]) for m in mem
                        if m["routes"] != 100 and m["routes"] < 10000})
        if short:
            out.append("")
            out.append(", ".join(f"{mode}: {r} routes" for mode, r in short)
                       + ", not 10 000: these hold two sockets per route and the open-file limit of the "
                       "shell that ran this could not be raised (the systemd unit sets "
                       "`LimitNOFILE=1048576`). The ring modes hold no socket per port.")
    if act:
        out.append("")
        out.append("Route install → first forwarded datagram: a 10 Mbit/s stream (one datagram about every "
                   "1.05 ms) already arrives at a gateway port without a route; the route is added with "
                   "`POST /api/v1/routes`; timed from just before the request is sent (same monotonic clock "
                   "as the sink):")
        out.append("")
        out.append("| mode | API call returned after ms | first datagram at the sink after ms (each try) | median ms |")
        out.append("|---|---|---|---:|")
        modes = []
        for m in act:
            if m["mode"] not in modes:
                modes.append(m["mode"])
        for mode in modes:
            tries = [m for m in act if m["mode"] == mode]
            calls = [m["call_ms"] for m in tries if m["call_ms"] is not None]
            firsts = [m["first_ms"] for m in tries]
            ok = [f for f in firsts if f is not None]
            out.append(f"| {mode} | {', '.join(f'{c:.1f}' for c in calls)} | "
                       f"{', '.join('none' if f is None else f'{f:.1f}' for f in firsts)} | "
                       f"{fmt(med(ok), '.1f')} |")
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    out.append("")
    out.append(f"Ran {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC at {a.rev}; "
               f"{os.cpu_count()} CPUs ({cpu}), kernel {platform.release()}; load average at the end "
               f"{a.load}. Command: `{a.command}`.")
    print("\n".join(out))


if __name__ == "__main__":
    sys.exit(main())
