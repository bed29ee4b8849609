#!/usr/bin/python3
"""Reads the raw outputs of scripts/bench-channel.sh and writes its Markdown report and figures.

Raw layout (one directory per point): RAW/<config>/n<N>/r<run>/ with
  meta                      cfg=, n=, run=, seconds=, payload=, rate=
  client.<first>.txt        iperf2 client output (one process per chunk of flows)
  server.<first>.txt        iperf2 server output (enhanced reports, latency histograms)
  {time,stat,softnet,snmp-g,snmp-b,relay}.{0,1}   snapshots at the start and end of the sending window
  vgate-totals.txt          `vgate run` totals (vgate modes)
  failed                    why the configuration could not start
RAW/unavailable             "<mode> <error line>" per mode that did not start
RAW/demo/n<N>.r<run>.json   `vgate demo --json` reports (--generator vgate)

Also writes the parsed numbers as JSON beside the figures, so a reader can redraw them.
Uses only the standard library and matplotlib (Debian's python3-matplotlib).
"""

import argparse
import datetime
import glob
import json
import os
import platform
import re
import statistics

SINK_BASE = 40000
A_BASE = 20000
ZERO_LOSS = 0.01  # percent
GEN_SHORTFALL = 0.97  # offered below this share of N x rate: the generator was the limit

LABELS = {
    "route": "plain routing (reference)",
    "kernel": "kernel nftables DNAT (bound)",
    "socat": "socat per stream (floor)",
    "crelay": "plain C relay (scripts/bench/crelay.c)",
    "stack": "vgate stack",
    "tnapi": "vgate tnapi",
    "zc": "vgate zc",
    "xdp": "vgate xdp",
    "split": "vgate split (half A → one-way link → half B, stack)",
}
STYLE = {
    "route": dict(color="0.6", linestyle=":", marker="."),
    "kernel": dict(color="black", linestyle="--", marker="s"),
    "socat": dict(color="tab:brown", linestyle="-.", marker="x"),
    "crelay": dict(color="tab:purple", linestyle="--", marker="v"),
    "stack": dict(color="tab:blue", marker="o"),
    "tnapi": dict(color="tab:orange", marker="^"),
    "zc": dict(color="tab:green", marker="D"),
    "xdp": dict(color="tab:red", marker="v"),
    "split": dict(color="tab:cyan", linestyle="-.", marker="P"),
}

RE_CONN = re.compile(r"^\[\s*(\d+)\] local \S+ port (\d+) connected with \S+ port (\d+)")
RE_CLIENT = re.compile(
    r"^\[\s*(\d+)\]\s+([\d.]+)-([\d.]+) sec\s+[\d.]+ \w?Bytes\s+[\d.]+ \w?bits/sec\s+(\d+)/(\d+)\s+\d+ pps"
)
RE_SERVER = re.compile(
    r"^\[\s*(\d+)\]\s+([\d.]+)-([\d.]+) sec\s+[\d.]+ \w?Bytes\s+[\d.]+ \w?bits/sec\s+[-\d.]+ ms\s+(-?\d+)/(\d+)\s+\("
)
RE_HIST = re.compile(
    r"^\[\s*(\d+)\].*T8\(f\)-PDF: bin\(w=(\d+)us\):cnt\((\d+)\)=([\d:,]*) \(.*obl/obu=(\d+)/(\d+)\)"
)


def kv_file(path):
    out = {}
    try:
        for tok in open(path).read().split():
            if "=" in tok:
                k, v = tok.split("=", 1)
                out[k] = v
    except OSError:
        pass
    return out


def read(path, default=""):
    try:
        return open(path).read()
    except OSError:
        return default


def parse_client(text, base):
    """Per stream index: (writes, errors, seconds), from one client process's output."""
    port_of, out = {}, {}
    for line in text.splitlines():
        m = RE_CONN.match(line)
        if m:
            port_of[m.group(1)] = int(m.group(3))
            continue
        m = RE_CLIENT.match(line)
        if m and m.group(1) in port_of:
            dur = float(m.group(3)) - float(m.group(2))
            out[port_of[m.group(1)] - base] = (int(m.group(4)), int(m.group(5)), dur)
    return out


def parse_server(text):
    """Per stream index: dict(lost, total, seconds, hist={bin_us: count}, above=count)."""
    port_of, out = {}, {}
    for line in text.splitlines():
        m = RE_CONN.match(line)
        if m:
            port_of[m.group(1)] = int(m.group(2))
            continue
        m = RE_HIST.match(line)
        if m and m.group(1) in port_of:
            s = out.setdefault(port_of[m.group(1)] - SINK_BASE, {})
            w = int(m.group(2))
            hist = {}
            for pair in filter(None, m.group(4).split(",")):
                b, c = pair.split(":")
                hist[int(b) * w] = hist.get(int(b) * w, 0) + int(c)
            s["hist"] = hist
            s["width"] = w
            s["above"] = int(m.group(6))
            continue
        m = RE_SERVER.match(line)
        if m and m.group(1) in port_of:
            s = out.setdefault(port_of[m.group(1)] - SINK_BASE, {})
            s["lost"] = max(0, int(m.group(4)))
            s["total"] = int(m.group(5))
            s["seconds"] = float(m.group(3)) - float(m.group(2))
    return out


def percentile(hist, above, q):
    """q-quantile (0..1) of a merged histogram {upper edge us: count}; None if empty."""
    n = sum(hist.values()) + above
    if n == 0:
        return None
    want = q * n
    seen = 0
    for edge in sorted(hist):
        seen += hist[edge]
        if seen >= want:
            return float(edge)
    return float("inf")  # beyond the histogram's range


def proc_stat(text):
    cpus = {}
    for line in text.splitlines():
        if line.startswith("cpu"):
            f = line.split()
            v = [int(x) for x in f[1:9]]  # user nice system idle iowait irq softirq steal
            cpus[f[0]] = dict(busy=sum(v) - v[3] - v[4], total=sum(v), softirq=v[6])
    return cpus


def snmp_udp(text):
    lines = [l.split() for l in text.splitlines() if l.startswith("Udp:")]
    if len(lines) < 2:
        return {}
    return {k: int(v) for k, v in zip(lines[0][1:], lines[1][1:])}


def softnet_dropped(text):
    return sum(int(l.split()[1], 16) for l in text.splitlines() if l.strip())


def parse_point(d, relay_cpu, gen_cpu, tck):
    meta = kv_file(os.path.join(d, "meta"))
    cfg, n = meta["cfg"], int(meta["n"])
    payload = int(meta["payload"])
    rate = float(meta["rate"])
    p = dict(cfg=cfg, n=n, run=int(meta["run"]))
    if os.path.exists(os.path.join(d, "failed")):
        p["failed"] = read(os.path.join(d, "failed")).strip().splitlines()[0:1]
        return p
    base = SINK_BASE if cfg == "route" else A_BASE
    cli, srv = {}, {}
    for f in glob.glob(os.path.join(d, "client.*.txt")):
        cli.update(parse_client(read(f), base))
    for f in glob.glob(os.path.join(d, "server.*.txt")):
        srv.update(parse_server(read(f)))
    writes = sum(c[0] for c in cli.values())
    errs = sum(c[1] for c in cli.values())
    offered = sum(c[0] * payload * 8 / c[2] for c in cli.values() if c[2] > 0) / 1e6
    lost = total = received = 0
    thr = pps = 0.0
    hist, above, missing = {}, 0, 0
    iperf_lost = iperf_total = 0
    for i in range(n):
        s = srv.get(i)
        # The server counts one datagram more than the client's "Write" count (the first
        # datagram's sequence number is 0); a stream's loss is what the client wrote and the
        # server did not get, so losses at the end of a stream (which iperf's own lost/total
        # cannot see) count too.
        sent = cli.get(i, (0, 0, 0))[0] + 1 if i in cli else None
        if s is None or "total" not in s:
            missing += 1
            lost += sent or 0
            total += sent or 0
            continue
        got = s["total"] - s["lost"]
        iperf_lost += s["lost"]
        iperf_total += s["total"]
        if sent is None:
            sent = s["total"]
        lost += max(0, sent - got)
        total += sent
        received += got
        if s["seconds"] > 0:
            thr += got * payload * 8 / s["seconds"] / 1e6
            pps += got / s["seconds"]
        for k, v in s.get("hist", {}).items():
            hist[k] = hist.get(k, 0) + v
        above += s.get("above", 0)
    p.update(
        offered_mbps=offered,
        target_mbps=n * rate / 1e6,
        client_flows=len(cli),
        client_errors=errs,
        writes=writes,
        received=received,
        missing_streams=missing,
        loss_pct=100.0 * lost / total if total else 100.0,
        iperf_loss_pct=100.0 * iperf_lost / iperf_total if iperf_total else None,
        delivered_ratio=received / writes if writes else 0.0,
        throughput_mbps=thr,
        pps=pps,
        p50_us=percentile(hist, above, 0.50),
        p99_us=percentile(hist, above, 0.99),
    )
    p["generator_limited"] = bool(
        offered < GEN_SHORTFALL * p["target_mbps"] or errs > 0 or len(cli) < n
    )
    # CPU over the sending window.
    t0 = float(read(os.path.join(d, "time.0"), "0") or 0)
    t1 = float(read(os.path.join(d, "time.1"), "0") or 0)
    win = t1 - t0
    s0 = proc_stat(read(os.path.join(d, "stat.0")))
    s1 = proc_stat(read(os.path.join(d, "stat.1")))
    if win > 0 and s0 and s1:
        def busy(c, key="busy"):
            return (s1[c][key] - s0[c][key]) / tck / win

        p["machine_cpu_pct"] = 100 * busy("cpu")
        rc, gc = f"cpu{relay_cpu}", f"cpu{gen_cpu}"
        p["relay_core_pct"] = 100 * busy(rc)
        p["relay_core_softirq_pct"] = 100 * busy(rc, "softirq")
        p["gen_core_pct"] = 100 * busy(gc)
        try:
            r0 = int(read(os.path.join(d, "relay.0"), "0").strip() or 0)
            r1 = int(read(os.path.join(d, "relay.1"), "0").strip() or 0)
            if cfg not in ("route", "kernel"):
                p["relay_proc_pct"] = 100 * (r1 - r0) / tck / win
        except ValueError:
            pass
        # The gateway's CPU: the relay core's busy time, counted once. (Adding the relay
        # process's utime + stime to the core's softirq time, as earlier reports did, counts
        # twice the softirq work that ran while the process was on the CPU: without
        # CONFIG_IRQ_TIME_ACCOUNTING, as here, the kernel charges it to both.) Anything else
        # running on the relay core is in it too: the report gives the core's background.
        p["gateway_cpu_pct"] = p["relay_core_pct"]
        # The split appliance: each half's process CPU (utime + stime) on its own.
        for h in ("a", "b"):
            try:
                h0 = int(read(os.path.join(d, f"relay_{h}.0"), "").strip())
                h1 = int(read(os.path.join(d, f"relay_{h}.1"), "").strip())
            except ValueError:
                continue
            p[f"half_{h}_pct"] = 100 * (h1 - h0) / tck / win
            if pps > 0:
                p[f"half_{h}_us_pkt"] = p[f"half_{h}_pct"] / 100 / pps * 1e6
        if pps > 0:
            p["gateway_us_pkt"] = p["gateway_cpu_pct"] / 100 / pps * 1e6
            p["machine_us_pkt"] = p["machine_cpu_pct"] / 100 / pps * 1e6
            p["relay_core_us_pkt"] = p["relay_core_pct"] / 100 / pps * 1e6
            if "relay_proc_pct" in p:
                p["relay_proc_us_pkt"] = p["relay_proc_pct"] / 100 / pps * 1e6
    g0, g1 = snmp_udp(read(os.path.join(d, "snmp-g.0"))), snmp_udp(read(os.path.join(d, "snmp-g.1")))
    b0, b1 = snmp_udp(read(os.path.join(d, "snmp-b.0"))), snmp_udp(read(os.path.join(d, "snmp-b.1")))
    p["gw_rcvbuf_errors"] = g1.get("RcvbufErrors", 0) - g0.get("RcvbufErrors", 0)
    p["gw_noports"] = g1.get("NoPorts", 0) - g0.get("NoPorts", 0)
    p["sink_rcvbuf_errors"] = b1.get("RcvbufErrors", 0) - b0.get("RcvbufErrors", 0)
    p["softnet_drops"] = softnet_dropped(read(os.path.join(d, "softnet.1"))) - softnet_dropped(
        read(os.path.join(d, "softnet.0"))
    )
    tot = read(os.path.join(d, "vgate-totals.txt"))
    if tot:
        for line in tot.splitlines():
            if line.startswith("total channel=forward"):
                kv = dict(t.split("=", 1) for t in line.split()[1:] if "=" in t)
                p["vgate_rx"] = int(kv.get("rx_packets", 0))
                p["vgate_tx"] = int(kv.get("tx_packets", 0))
                p["vgate_drops"] = {k[5:]: int(v) for k, v in kv.items() if k.startswith("drop_")}
            elif line.startswith("worker "):
                kv = dict(t.split("=", 1) for t in line.split()[1:] if "=" in t)
                p["vgate_worker_s"] = p.get("vgate_worker_s", 0.0) + float(kv.get("cpu_seconds", 0))
                p["vgate_ring_drops"] = p.get("vgate_ring_drops", 0) + int(kv.get("ring_drops", 0))
        if p.get("vgate_tx"):
            p["vgate_worker_us_pkt"] = p["vgate_worker_s"] / p["vgate_tx"] * 1e6
    return p


def med(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def aggregate(points):
    """Per (cfg, n): medians over runs, plus flags and counts."""
    groups = {}
    for p in points:
        groups.setdefault((p["cfg"], p["n"]), []).append(p)
    agg = {}
    for key, ps in groups.items():
        ok = [p for p in ps if "failed" not in p]
        a = dict(cfg=key[0], n=key[1], runs=len(ok), failed=[p["failed"] for p in ps if "failed" in p])
        if ok:
            numeric = set()
            for p in ok:
                numeric |= {k for k, v in p.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            for k in numeric - {"n", "run"}:
                a[k] = med([p.get(k) for p in ok])
            a["loss_max_pct"] = max(p["loss_pct"] for p in ok)
            a["gen_limited_runs"] = sum(p["generator_limited"] for p in ok)
            drops = {}
            for p in ok:
                for k, v in p.get("vgate_drops", {}).items():
                    drops[k] = drops.get(k, 0) + v
            a["vgate_drops"] = drops
        agg[key] = a
    # Relative to plain routing (same N, same run) and to the kernel bound (same N, medians).
    byrun = {(p["cfg"], p["n"], p["run"]): p for p in points if "failed" not in p}
    for (cfg, n), a in agg.items():
        inc_m, inc_g = [], []
        for p in points:
            if p["cfg"] != cfg or p["n"] != n or "failed" in p:
                continue
            r = byrun.get(("route", n, p["run"]))
            if r and "machine_us_pkt" in p and "machine_us_pkt" in r:
                inc_m.append(p["machine_us_pkt"] - r["machine_us_pkt"])
                inc_g.append(p["gateway_us_pkt"] - r["gateway_us_pkt"])
        a["inc_machine_us_pkt"] = med(inc_m)
        a["inc_gw_us_pkt"] = med(inc_g)
    return agg


def fmt(v, spec=".1f", none="–"):
    if v is None:
        return none
    if v == float("inf"):
        return "> 100000"
    return format(v, spec)


def ratio(v, k):
    # No ratio against a kernel figure that is nil or noise (e.g. an increment of ~0 µs).
    if v is None or k is None or k < 0.05 or v == float("inf") or k == float("inf"):
        return ""
    return f" ({v / k:.2f}×)"


def zero_loss_point(agg, cfg, streams):
    """Highest N up to which every N of the sweep had median loss < ZERO_LOSS, and whether the
    generator was the limit there."""
    best = None
    for n in streams:
        a = agg.get((cfg, n))
        if not a or not a.get("runs"):
            break
        if a["loss_pct"] >= ZERO_LOSS:
            break
        best = a
    return best


def figures(agg, configs, streams, outdir, fixed_n):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []

    def series(cfg, key):
        xs, ys = [], []
        for n in streams:
            a = agg.get((cfg, n))
            if a and a.get("runs") and a.get(key) is not None and a[key] != float("inf"):
                xs.append(n)
                ys.append(a[key])
        return xs, ys

    def plot(name, key, ylabel, title, logy=False, symlog=False, ideal=False):
        fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
        if ideal:
            ax.plot(streams, [n * 10 for n in streams], color="0.85", linewidth=6, label="offered (N × 10 Mbit/s)", zorder=0)
        for cfg in configs:
            xs, ys = series(cfg, key)
            if xs:
                ax.plot(xs, ys, label=LABELS.get(cfg, cfg), **STYLE.get(cfg, {}))
        for n in streams:
            lim = [c for c in configs if (agg.get((c, n)) or {}).get("gen_limited_runs")]
            if lim and "route" in lim:
                ax.axvspan(n - 0.5 * min(streams), n + 0.5 * min(streams), color="tab:red", alpha=0.06, lw=0)
        if logy:
            ax.set_yscale("log")
        if symlog:
            ax.set_yscale("symlog", linthresh=0.01)
            ax.axhline(ZERO_LOSS, color="tab:red", linewidth=0.8, linestyle=":")
        ax.set_xlabel("streams N (10 Mbit/s each)")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = os.path.join(outdir, name)
        fig.savefig(path)
        plt.close(fig)
        made.append(path)

    plot("bench-channel-throughput.png", "throughput_mbps", "effective throughput (Mbit/s received in B)",
         "Throughput vs N (shaded: the generator fell short even for plain routing)", ideal=True)
    plot("bench-channel-cpu.png", "gateway_cpu_pct", "gateway CPU % (relay core busy, counted once)",
         "CPU vs N: the gateway's work (100 % = one core)")
    plot("bench-channel-loss.png", "loss_pct", "loss % (iperf servers)", "Loss vs N (dotted: 0.01 %)", symlog=True)
    plot("bench-channel-latency.png", "p50_us", "one-way latency p50 (µs, A to B)", "Latency p50 vs N", logy=True)

    # CPU per packet at a fixed load, incremental over plain routing.
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    names, vals, cols = [], [], []
    for cfg in configs:
        a = agg.get((cfg, fixed_n))
        if cfg == "route" or not a or a.get("inc_gw_us_pkt") is None:
            continue
        names.append(LABELS.get(cfg, cfg).replace(" (", "\n("))
        vals.append(a["inc_gw_us_pkt"])
        cols.append(STYLE.get(cfg, {}).get("color", "tab:gray"))
    if names:
        ax.bar(range(len(names)), vals, color=cols)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, fontsize=7)
        for i, v in enumerate(vals):
            ax.text(i, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
        ax.set_ylabel("extra gateway CPU per packet vs plain routing (µs)")
        ax.set_title(f"CPU per packet at N = {fixed_n} ({fixed_n * 10} Mbit/s offered)", fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
        fig.tight_layout()
        path = os.path.join(outdir, "bench-channel-cpu-per-packet.png")
        fig.savefig(path)
        made.append(path)
    plt.close(fig)
    return made


def machine():
    cpu = "unknown"
    for line in read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem = 0
    for line in read("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            mem = int(line.split()[1]) // 1024 // 1024
    osname = "unknown"
    for line in read("/etc/os-release").splitlines():
        if line.startswith("PRETTY_NAME="):
            osname = line.split("=", 1)[1].strip('"')
    return f"{os.cpu_count()} CPUs ({cpu}), {mem} GiB, {osname}, kernel {platform.release()}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--raw", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--figures", required=True)
    ap.add_argument("--command", default="")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=0)
    ap.add_argument("--streams", default="")
    ap.add_argument("--configs", default="")
    ap.add_argument("--generator", default="iperf")
    ap.add_argument("--socat-max", type=int, default=0)
    ap.add_argument("--per-process", type=int, default=50)
    ap.add_argument("--relay-cpu", type=int, default=1)
    ap.add_argument("--gen-cpu", type=int, default=0)
    ap.add_argument("--rev", default="unknown")
    ap.add_argument("--dirty", default="0")
    ap.add_argument("--elapsed", default="?")
    ap.add_argument("--note", default="")
    ap.add_argument("--split-fec", default="off")
    o = ap.parse_args()
    tck = os.sysconf("SC_CLK_TCK")
    streams = [int(x) for x in o.streams.split()]
    configs = o.configs.split()
    unavailable = {}
    for line in read(os.path.join(o.raw, "unavailable")).splitlines():
        if line.strip():
            m, _, why = line.partition(" ")
            unavailable[m] = why
    points = []
    for meta in sorted(glob.glob(os.path.join(o.raw, "*", "n*", "r*", "meta"))):
        points.append(parse_point(os.path.dirname(meta), o.relay_cpu, o.gen_cpu, tck))
    agg = aggregate(points)
    running = [c for c in configs if c not in unavailable]

    # The fixed load for CPU per packet: the largest N where plain routing was not
    # generator-limited and every running configuration was measured.
    fixed_n = None
    for n in streams:
        r = agg.get(("route", n))
        if r and r.get("runs") and not r.get("gen_limited_runs"):
            if all((agg.get((c, n)) or {}).get("runs") for c in running if c != "socat") :
                fixed_n = n
    if fixed_n is None and streams:
        fixed_n = streams[0]

    os.makedirs(o.figures, exist_ok=True)
    figs = figures(agg, running, streams, o.figures, fixed_n) if points else []

    demo = []
    for f in sorted(glob.glob(os.path.join(o.raw, "demo", "n*.r*.json"))):
        try:
            demo.append(json.load(open(f)))
        except (OSError, ValueError):
            pass

    L = []
    w = L.append
    now = datetime.datetime.now(datetime.timezone.utc)
    w("# vgate channel experiment: N iperf streams of 10 Mbit/s through the gateway\n")
    w("Generated by `scripts/bench-channel.sh` (the published model's experiment, scaled to this machine). "
      "Rerun it after engine changes and commit the new report and figures. iperf2 tops out before the "
      "relays do on this bed: the relays' own limits, their cost against the plain C relay with a generator "
      "that outruns them, memory with many routes and route activation time are in "
      "[bench-relay.md](bench-relay.md) (`scripts/bench-relay.sh`).\n")
    w(f"- **command**: `{o.command}` (as root)")
    w(f"- **date**: {now:%Y-%m-%d %H:%M} UTC; the sweep took {o.elapsed} s")
    w(f"- **machine**: {machine()}")
    dirty = ("" if o.dirty in ("", "0") else " (not a git checkout)" if o.dirty == "unknown"
             else f" with {o.dirty} uncommitted tracked file(s) in the tree")
    w(f"- **vgate**: revision {o.rev}" + dirty +
      ", release build")
    if o.note:
        w(f"- **note**: {o.note}")
    w(f"- **runs per point**: {o.runs} (each figure is the median over runs); {o.seconds:g} s of traffic per point")
    w("")
    w("## Method\n")
    w("- **Bed**: `scripts/testbed.sh --queues 2 up` — namespaces A (iperf clients), G (the gateway: one veth end "
      "facing each domain, IP forwarding off unless a kernel baseline turns it on) and B (iperf servers), 2-queue veth "
      "pairs, static neighbours. Nothing leaves the namespaces.")
    w(f"- **Load**: N iperf2 (`iperf` 2.1.8) UDP flows from A, `-u -b 10000000 -l 1316 -t {o.seconds:g} -e --trip-times`: "
      "10 Mbit/s of UDP payload per stream in 1316-byte datagrams (7 × 188-byte MPEG-TS packets, the payload of an "
      "RTP/MPEG-TS packet without its 12-byte RTP header), ≈ 950 packets/s per stream, each flow to its own gateway "
      f"port; N iperf2 servers in B (`-s -u -e --histograms=1u,100000`). Flows are grouped {o.per_process} per iperf "
      "process with iperf2's port ranges (`-p P1-P2`: one flow, socket and thread per port).")
    w(f"- **Placement** (2 cores): the gateway's work on CPU {o.relay_cpu} — vgate's single worker (`engine.queues = 1`, "
      f"`cpus = [{o.relay_cpu}]`), every socat (`taskset`), and, through RPS on the gateway's veth ends, the kernel's "
      f"receive processing and forwarding; the iperf clients and servers and A's and B's receive processing on CPU "
      f"{o.gen_cpu}. One queue, because a second worker would have to share the generator's core; the published "
      "model likewise gave the sniffer its own core.")
    w("- **Configurations**, measured one after the other for each N, runs outermost (so every figure has its "
      "kernel bound a few minutes away):")
    w("  - *plain routing* (reference): forwarding on, A and B route to each other, clients send straight to B. "
      "The extra CPU of every other configuration is measured against it.")
    w("  - *kernel* (the bound): forwarding on, nftables `dnat` from each gateway port to its server (one map) and "
      "`snat` to the gateway's B address; no user-space relay.")
    w("  - *crelay* (the bar for user space): `scripts/bench/crelay.c`, a plain C relay — one socket per port, "
      "epoll, `recvmmsg`/`sendmmsg` batches of 32, nothing else — pinned like vgate.")
    w(f"  - *socat* (the floor): one `socat -u UDP4-RECV:port UDP4-SENDTO:dest` per stream (N processes; "
      f"run up to N = {o.socat_max}).")
    w("  - *vgate* `stack`, `tnapi`, `zc`, `xdp`: `vgate run --config … --mode M` in G with N static `[[stream_route]]`s "
      "(A port → B server, `source_validation = \"latch\"`).")
    w("- **Measured**: effective throughput = what the servers received (Σ (total − lost) × 1316 × 8 / interval); "
      "loss = the servers' lost / total (a stream whose server saw nothing counts as all lost), cross-checked "
      "against vgate's totals (`rx_packets`, `tx_packets`, `drop_*`) and the kernel's UDP `RcvbufErrors` in G "
      "(relay too slow) and B (sink too slow); CPU from `/proc/stat` over the sending window: the relay core's "
      "busy time, the whole machine's, and the relay process's utime + stime (`/proc/<pid>/stat`); "
      "**incremental CPU per packet** = machine CPU-seconds per delivered packet minus the same for plain routing "
      "in the same run and N (design.md's method: the generator's and sink's cost cancel); one-way latency A → B "
      "from iperf's `--trip-times` histograms (1 µs bins, one clock: the namespaces share the host's), p50/p99 over "
      "all packets of all streams.")
    w(f"- **Generator limit**: a point is *generator-limited* when the clients' own reports offered less than "
      f"{GEN_SHORTFALL:.0%} of N × 10 Mbit/s (or reported send errors); then what the row measures is the generator, "
      "not the relay. Loss is *zero* below 0.01 %.")
    w("")

    w("## Capture modes in this build\n")
    for m in ("stack", "tnapi", "zc", "xdp"):
        if m in unavailable:
            w(f"- `{m}`: **not available**: `{unavailable[m]}`")
        elif m in configs:
            w(f"- `{m}`: measured")
        else:
            w(f"- `{m}`: not requested")
    w("")

    if points:
        w("## Where each mode stands against the kernel bound\n")
        k_zero = zero_loss_point(agg, "kernel", streams) if "kernel" in running else None
        gen_from = next((n for n in streams if (agg.get(("route", n)) or {}).get("gen_limited_runs")), None)
        if gen_from is not None:
            w(f"- **The generator** (iperf2 on one core) fell short of N × 10 Mbit/s from **N = {gen_from}** even "
              "for plain routing: above that the sweep measures iperf, not the relays.")
        else:
            w(f"- **The generator** kept up with plain routing at every N of the sweep (up to {max(streams)}).")
        k = lambda n: agg.get(("kernel", n)) or {}
        for cfg in running:
            if cfg == "route":
                continue
            z = zero_loss_point(agg, cfg, streams)
            a = agg.get((cfg, fixed_n)) or {}
            kk = k(fixed_n)
            if z:
                zs = f"zero loss up to **N = {z['n']}** ({z['throughput_mbps']:.0f} Mbit/s, {z['pps'] / 1e3:.0f} kpps)"
                if z.get("gen_limited_runs"):
                    zs += " — the generator was the limit there, so the relay's own limit is higher"
                nxt = next((n for n in streams if n > z["n"] and (agg.get((cfg, n)) or {}).get("runs")), None)
                if nxt:
                    zs += f"; {agg[(cfg, nxt)]['loss_pct']:.3f} % loss at N = {nxt}"
            else:
                first = agg.get((cfg, streams[0])) or {}
                zs = f"**no zero-loss point** ({fmt(first.get('loss_pct'), '.3f')} % loss already at N = {streams[0]})"
            parts = [zs]
            if cfg != "kernel" and a.get("inc_gw_us_pkt") is not None:
                parts.append(f"at N = {fixed_n}: **{a['inc_gw_us_pkt']:+.2f} µs** gateway CPU per packet over plain "
                             f"routing (kernel: {fmt(kk.get('inc_gw_us_pkt'), '+.2f')} µs; "
                             f"{ratio(a['inc_gw_us_pkt'], kk.get('inc_gw_us_pkt')).strip(' ()') or 'no ratio'} the kernel's), "
                             f"latency p50/p99 {fmt(a.get('p50_us'), '.0f')}/{fmt(a.get('p99_us'), '.0f')} µs (kernel "
                             f"{fmt(kk.get('p50_us'), '.0f')}/{fmt(kk.get('p99_us'), '.0f')} µs)")
            elif cfg == "kernel" and a:
                parts.append(f"at N = {fixed_n}: {fmt(a.get('inc_gw_us_pkt'), '+.2f')} µs gateway CPU per packet over "
                             f"plain routing, latency p50/p99 {fmt(a.get('p50_us'), '.0f')}/{fmt(a.get('p99_us'), '.0f')} µs")
            w(f"- **{LABELS.get(cfg, cfg)}**: " + "; ".join(parts) + ".")
        w("")
        if k_zero is None and "kernel" in running:
            w("The kernel bound itself lost packets at the smallest N: the bed or the machine was the limit.\n")

        w("## Results per configuration\n")
        w("Medians over runs. In brackets: the ratio to the kernel bound at the same N. *gateway CPU*: the busy "
          f"time of CPU {o.relay_cpu} (user + system + irq + softirq, counted once), where the relay runs and RPS "
          "puts the gateway interfaces' receive processing and so the kernel's forwarding (100 % = one core); "
          "*+µs/pkt vs routing*: gateway CPU per delivered packet minus plain routing's in the same run; "
          "*machine +µs/pkt*: the same from the whole machine's busy time (design.md's method; polluted by "
          "anything else running); *limit*: `gen` when the generator fell short (runs flagged / runs).\n")
        for cfg in configs:
            w(f"### {LABELS.get(cfg, cfg)}\n")
            if cfg in unavailable:
                w(f"Not available: `{unavailable[cfg]}`\n")
                continue
            w("| N | offered Mbit/s | throughput Mbit/s | loss % | gateway CPU % | gateway µs/pkt "
              "| +µs/pkt vs routing | machine +µs/pkt | p50 µs | p99 µs | limit |")
            w("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
            for n in streams:
                a = agg.get((cfg, n))
                if not a:
                    if cfg == "socat" and n > o.socat_max:
                        w(f"| {n} | not run (N > --socat-max {o.socat_max}) |||||||||| ")
                    continue
                if not a.get("runs"):
                    w(f"| {n} | could not start: {a['failed'][0][0] if a['failed'] and a['failed'][0] else '?'} |||||||||| ")
                    continue
                kk = agg.get(("kernel", n)) or {}
                rk = (lambda key: ratio(a.get(key), kk.get(key))) if cfg not in ("kernel", "route") else (lambda key: "")
                lim = f"gen ({a['gen_limited_runs']}/{a['runs']})" if a.get("gen_limited_runs") else ""
                ref = cfg == "route"
                w(f"| {n} | {fmt(a.get('offered_mbps'), '.0f')} | {fmt(a.get('throughput_mbps'), '.0f')}{rk('throughput_mbps')} "
                  f"| {fmt(a.get('loss_pct'), '.3f')} | {fmt(a.get('gateway_cpu_pct'), '.0f')}{rk('gateway_cpu_pct')} "
                  f"| {fmt(a.get('gateway_us_pkt'), '.2f')}{rk('gateway_us_pkt')} "
                  f"| {'reference' if ref else fmt(a.get('inc_gw_us_pkt'), '+.2f') + rk('inc_gw_us_pkt')} "
                  f"| {'reference' if ref else fmt(a.get('inc_machine_us_pkt'), '+.2f')} "
                  f"| {fmt(a.get('p50_us'), '.0f')}{rk('p50_us')} | {fmt(a.get('p99_us'), '.0f')}{rk('p99_us')} | {lim} |")
            w("")

        if "split" in configs:
            w("## The split appliance against the single host\n")
            w(f"*split*: the same iperf streams from domain A through half A, the forward one-way link (FEC "
              f"`{o.split_fec}`, link header and repair frames included in what it carries) and half B to "
              "domain B, on the four-namespace bed of `scripts/split-bed.sh` (its links hardened: nothing may "
              "leave a receive-only interface), two `vgate run` processes in stack mode with their workers "
              f"pinned to CPU {o.relay_cpu} like the single-host modes. *half A / half B µs/pkt*: that "
              "process's CPU time (utime + stime from /proc, its kernel work in system calls included; softirq "
              "work run on its behalf is not) per datagram delivered to domain B; *relay core µs/pkt*: CPU "
              f"{o.relay_cpu}'s busy time per delivered datagram (both halves and their receive processing; the "
              "single-host figure is one process's). Ratios are split / single-host stack in the same run "
              "(medians over runs). The bed differs (four namespaces and two more veth crossings per packet "
              "for the split), so the comparison is of the whole path, not of vgate's code alone.\n")
            w("| N | throughput split (× stack) | loss % split | loss % stack | half A µs/pkt | half B µs/pkt "
              "| halves µs/pkt (× stack proc) | relay core µs/pkt split (× stack) | p50 µs split (× stack) | p99 µs split (× stack) |")
            w("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            for n in streams:
                a = agg.get(("split", n))
                st = agg.get(("stack", n)) or {}
                if not a or not a.get("runs"):
                    continue
                both = None
                if a.get("half_a_us_pkt") is not None and a.get("half_b_us_pkt") is not None:
                    both = a["half_a_us_pkt"] + a["half_b_us_pkt"]
                rs = lambda key, v=None: ratio(a.get(key) if v is None else v, st.get(key))
                w(f"| {n} | {fmt(a.get('throughput_mbps'), '.0f')}{rs('throughput_mbps')} "
                  f"| {fmt(a.get('loss_pct'), '.3f')} | {fmt(st.get('loss_pct'), '.3f')} "
                  f"| {fmt(a.get('half_a_us_pkt'), '.2f')} | {fmt(a.get('half_b_us_pkt'), '.2f')} "
                  f"| {fmt(both, '.2f')}{ratio(both, st.get('relay_proc_us_pkt'))} "
                  f"| {fmt(a.get('relay_core_us_pkt'), '.2f')}{rs('relay_core_us_pkt')} "
                  f"| {fmt(a.get('p50_us'), '.0f')}{rs('p50_us')} | {fmt(a.get('p99_us'), '.0f')}{rs('p99_us')} |")
            w("")

        w("## Where the packets were lost\n")
        w("Medians over runs. *G rcvbuf*: datagrams the kernel dropped because a gateway socket's receive buffer was "
          "full (vgate stack or socat behind); *B rcvbuf*: the iperf servers were behind (the generator's core); "
          "*softnet*: backlog drops (machine-wide); *vgate rx/tx*: the forward channel's totals (they include the "
          "clients' end-of-test datagrams, sent up to 10 times each); *vgate drops*: by reason, summed over runs.\n")
        w("| config | N | loss % (worst run) | iperf's lost/total % | delivered / sent | G rcvbuf | B rcvbuf | softnet | vgate rx | vgate tx | vgate drops | relay core busy % | relay proc % | machine busy % |")
        w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|")
        for cfg in configs:
            for n in streams:
                a = agg.get((cfg, n))
                if not a or not a.get("runs"):
                    continue
                drops = ", ".join(f"{k}={v}" for k, v in sorted(a.get("vgate_drops", {}).items())) or ("none" if "vgate_rx" in a else "")
                if a.get("vgate_ring_drops"):
                    drops += f", ring_drops={a['vgate_ring_drops']:.0f}"
                w(f"| {cfg} | {n} | {fmt(a.get('loss_pct'), '.3f')} ({fmt(a.get('loss_max_pct'), '.3f')}) | {fmt(a.get('iperf_loss_pct'), '.3f')} "
                  f"| {fmt(a.get('delivered_ratio'), '.4f')} | {fmt(a.get('gw_rcvbuf_errors'), '.0f')} "
                  f"| {fmt(a.get('sink_rcvbuf_errors'), '.0f')} | {fmt(a.get('softnet_drops'), '.0f')} "
                  f"| {fmt(a.get('vgate_rx'), '.0f', '')} | {fmt(a.get('vgate_tx'), '.0f', '')} | {drops} "
                  f"| {fmt(a.get('relay_core_pct'), '.0f')} | {fmt(a.get('relay_proc_pct'), '.0f')} | {fmt(a.get('machine_cpu_pct'), '.0f')} |")
        w("")
        if any("vgate_worker_us_pkt" in a for a in agg.values()):
            w("vgate's own account (worker thread CPU time from its totals, per forwarded packet): " + "; ".join(
                f"{c} N={n}: {a['vgate_worker_us_pkt']:.2f} µs" for (c, n), a in sorted(agg.items())
                if a.get("vgate_worker_us_pkt") is not None) + ".\n")

        w("## Figures\n")
        for f in figs:
            w(f"![{os.path.basename(f)}](figures/{os.path.basename(f)})\n")

    if demo:
        w("## vgate's own generator (`vgate demo`, loopback, stack mode)\n")
        w("`vgate demo --streams N --rate 10 --payload 1316 --json` inside the gateway namespace: the gateway and "
          "its own RTP generator and receivers in one process on loopback (no veth, no namespace crossing), so it "
          "is not comparable with the tables above; it shows how far vgate's stack path goes when the generator is "
          "cheaper than iperf. Medians over runs.\n")
        w("| N | offered kpps | delivered kpps | loss % | p50 µs | p99 µs | gateway CPU µs/pkt | limit |")
        w("|---:|---:|---:|---:|---:|---:|---:|---|")
        by = {}
        for d in demo:
            by.setdefault(d["streams"], []).append(d)
        for n in sorted(by):
            ds = by[n]
            lag = sum(d["generator_lag"] > d["offered_pps"] * 0.01 for d in ds)
            w(f"| {n} | {med([d['offered_pps'] for d in ds]) / 1e3:.1f} | {med([d['delivered_pps'] for d in ds]) / 1e3:.1f} "
              f"| {med([d['loss_ratio'] * 100 for d in ds]):.4f} | {med([d['latency_p50_us'] for d in ds]):.0f} "
              f"| {med([d['latency_p99_us'] for d in ds]):.0f} | {med([d['cpu_us_per_packet'] for d in ds]):.2f} "
              f"| {'generator fell behind (' + str(lag) + '/' + str(len(ds)) + ')' if lag else ''} |")
        w("")

    w("## Raw numbers\n")
    w("Every point (each run) parsed, in `figures/bench-channel.json`.")
    text = "\n".join(L) + "\n"
    with open(o.out, "w") as f:
        f.write(text)
    with open(os.path.join(o.figures, "bench-channel.json"), "w") as f:
        json.dump(dict(points=points, demo=demo, unavailable=unavailable), f, indent=1, default=str)
    print(text)


if __name__ == "__main__":
    main()
