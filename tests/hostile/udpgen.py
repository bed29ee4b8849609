#!/usr/bin/python3
"""Hostile UDP generator for vgate's namespace tests and scripts/hostile.sh.

Builds IPv4/UDP datagrams with scapy (forged sources allowed) and sends them through one raw
socket (IP_HDRINCL) at a bounded rate, for a bounded count and time. Run inside the sending
namespace (`ip netns exec NS /usr/bin/python3 udpgen.py ...`). Prints `sent=N seconds=S
rate=R` on stdout at the end.

  --dst IP            destination (the gateway's address)
  --ports A-B         destination ports, cycled (default: one port, --port)
  --src-net CIDR      forged sources drawn from this network (default: --src)
  --src IP[:PORT]     fixed source (with port: a fixed source port)
  --kind K            payload: rtp (valid RTP v2, 172 bytes), garbage (random bytes,
                      random length 1..1400), empty, oversize (1472..1480 bytes: over the
                      MTU, fragmented), truncated (UDP length field larger than the datagram),
                      mixed (all of the above in turn)
  --rate PPS          packets per second (0: as fast as the sender goes)
  --count N           stop after N packets (default: unbounded, --seconds bounds)
  --seconds S         stop after S seconds (default 10; hard bound)
"""
import argparse
import ipaddress
import os
import random
import socket
import struct
import sys
import time

from scapy.all import IP, UDP, Raw  # noqa: E402  (python3-scapy)


def parse_ports(s):
    if "-" in s:
        a, b = s.split("-", 1)
        return list(range(int(a), int(b) + 1))
    return [int(s)]


def rtp(seq):
    return struct.pack("!BBHII", 0x80, 96, seq & 0xFFFF, seq * 160, 0xBADC0DE) + b"\x55" * 160


def build(kind, src, sport, dst, dport, i):
    if kind == "mixed":
        kind = ["rtp", "garbage", "empty", "oversize", "truncated"][i % 5]
    if kind == "rtp":
        payload = rtp(i)
    elif kind == "garbage":
        payload = os.urandom(random.randint(1, 1400))
    elif kind == "empty":
        payload = b""
    elif kind == "oversize":
        payload = os.urandom(random.randint(1473, 1480))
    elif kind == "truncated":
        # UDP length claims 200 more bytes than the datagram holds.
        p = bytes(IP(src=src, dst=dst, id=i & 0xFFFF) / UDP(sport=sport, dport=dport, len=8 + 40 + 200, chksum=0) / Raw(os.urandom(40)))
        return p
    else:
        raise SystemExit(f"unknown kind {kind}")
    pkt = IP(src=src, dst=dst, id=i & 0xFFFF) / UDP(sport=sport, dport=dport) / Raw(payload)
    return bytes(pkt)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dst", required=True)
    ap.add_argument("--port", type=int, default=20000)
    ap.add_argument("--ports", default=None)
    ap.add_argument("--src", default=None)
    ap.add_argument("--src-net", default=None)
    ap.add_argument("--kind", default="rtp")
    ap.add_argument("--rate", type=float, default=1000)
    ap.add_argument("--count", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=10)
    a = ap.parse_args()
    ports = parse_ports(a.ports) if a.ports else [a.port]
    if a.src_net:
        net = ipaddress.ip_network(a.src_net)
        hosts = [str(h) for h in net.hosts()]
        fixed_port = None
    else:
        host, _, port = (a.src or "10.201.1.2").partition(":")
        hosts = [host]
        fixed_port = int(port) if port else None
    # A pool of prebuilt packets (scapy is slow per packet; the raw send is not).
    pool = []
    n_pool = min(max(len(ports), 1) * 4, 4096)
    for i in range(n_pool):
        src = random.choice(hosts)
        sport = fixed_port or random.randint(1024, 65535)
        pool.append((build(a.kind, src, sport, a.dst, ports[i % len(ports)], i), a.dst))
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    start = time.monotonic()
    sent = 0
    errors = 0
    interval = 1.0 / a.rate if a.rate > 0 else 0.0
    # Paced in bursts of up to 1 ms worth of packets.
    burst = max(1, int(a.rate / 1000)) if a.rate > 0 else 64
    next_t = start
    while True:
        now = time.monotonic()
        if now - start >= a.seconds or (a.count and sent >= a.count):
            break
        if interval and now < next_t:
            time.sleep(min(next_t - now, 0.002))
            continue
        for _ in range(burst):
            if a.count and sent >= a.count:
                break
            pkt, dst = pool[sent % len(pool)]
            try:
                s.sendto(pkt, (dst, 0))
            except OSError:
                errors += 1
            sent += 1
        if interval:
            next_t += interval * burst
    el = time.monotonic() - start
    print(f"sent={sent} errors={errors} seconds={el:.3f} rate={sent / el if el else 0:.0f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
