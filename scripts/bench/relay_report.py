#!/usr/bin/env python3
"""The table of scripts/bench-relay.sh from its raw JSON lines (one per point).

Per configuration and stream count, the median over rounds of: the rate the generator
offered and how far behind its schedule it fell, the loss the gateway caused (sent - received
- what the sinks' sockets dropped) and the loss at the sinks, the relay core's busy time per
packet sent (from /proc/stat, softirq counted once), the extra over plain routing in the same
round, that extra as a ratio to the kernel DNAT's and to the C relay's, the relay process's own
CPU time per packet, and the sinks' p50/p99 one-way latency. A point where the generator fell
behind by more than 1 % or where the sinks dropped is flagged and not used for the zero-loss
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
        gw_loss = max(sent - recv - sink_drop, 0) / sent
        per[(p["cfg"], p["n"], p["run"])] = dict(
            offered=sent / a.seconds,
            behind=p["gen"]["behind"],
            gw_loss=gw_loss,
            sink_loss=sink_drop / sent,
            core=core,
            proc=(p["relay_ticks"] * tick_us / sent) if p["relay_ticks"] else None,
            p50=p["sink"]["p50_us"],
            p99=p["sink"]["p99_us"],
            rx=p.get("relay_rx"),
            tx=p.get("relay_tx"),
        )
    for (cfg, n, r), v in per.items():
        ref = per.get(("route", n, r))
        v["extra"] = v["core"] - ref["core"] if ref else None
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
            rows[cfg][n] = {k: med([v[k] for v in vs]) for k in vs[0]}
            rows[cfg][n]["runs"] = len(vs)
    out = []
    out.append("| config | streams | runs | offered kpps | generator behind % | gateway loss % | sink loss % "
               "| core µs/pkt | extra µs/pkt over route | × kernel's extra | × C relay's extra "
               "| relay process µs/pkt | p50 / p99 µs | flag |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
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
                flags.append("sinks dropped")
            if v["rx"] is not None and v["tx"] is not None and v["rx"] != v["tx"]:
                flags.append(f"relay rx {v['rx']:.0f} ≠ tx {v['tx']:.0f}")
            out.append(
                f"| {cfg} | {n} | {v['runs']} | {v['offered'] / 1e3:.1f} | {v['behind'] * 100:.2f} "
                f"| {v['gw_loss'] * 100:.3f} | {v['sink_loss'] * 100:.3f} | {v['core']:.2f} "
                f"| {fmt(e, '+.2f') if cfg != 'route' else '(reference)'} | {fmt(xk)} | {fmt(xc)} "
                f"| {fmt(v['proc'])} | {v['p50']:.0f} / {v['p99']:.0f} | {', '.join(flags)} |")
    out.append("")
    out.append("Zero-loss stream count (gateway loss < 0.01 %, generator on schedule, sinks dropped "
               "nothing) per configuration, within this sweep:")
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
        out.append("| mode | routes | RSS idle MiB | RSS after traffic MiB |")
        out.append("|---|---:|---:|---:|")
        for m in mem:
            out.append(f"| {m['mode']} | {m['routes']} | {m['rss_idle_kb'] / 1024:.1f} | {m['rss_after_kb'] / 1024:.1f} |")
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
