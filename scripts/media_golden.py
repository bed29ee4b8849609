#!/usr/bin/env python3
"""Helpers for scripts/media-golden.sh (standard library only).

  media_golden.py capture OUT PORT      record the RTP datagrams sent to 127.0.0.1:PORT
                                        until 2 s of silence after the first one
  media_golden.py packetize-ps IN OUT   cut a program stream into RTP packets the way
                                        GB/T 28181 devices do (PS/90000, PT 96)

OUT holds one record per RTP packet: a 2-byte big-endian length, then the packet
(RFC 4571 framing). The packetizer starts each frame (one PS pack) in a new RTP packet,
gives every packet of the pack the same timestamp (the pack's SCR in 90 kHz units) and sets
the marker bit on its last packet, at most 1400 bytes of payload per packet.
"""
import socket
import struct
import sys


def capture(out, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.bind(("127.0.0.1", int(port)))
    s.settimeout(60)
    n = 0
    with open(out, "wb") as f:
        while True:
            try:
                pkt = s.recv(65535)
            except socket.timeout:
                break
            f.write(struct.pack(">H", len(pkt)) + pkt)
            n += 1
            s.settimeout(2)
    print(f"{out}: {n} packets", file=sys.stderr)


def packs(ps):
    """Split a program stream at its pack start codes."""
    starts = []
    i = ps.find(b"\x00\x00\x01\xba")
    while i >= 0:
        starts.append(i)
        i = ps.find(b"\x00\x00\x01\xba", i + 4)
    for k, a in enumerate(starts):
        b = starts[k + 1] if k + 1 < len(starts) else len(ps)
        yield ps[a:b]


def scr90k(pack):
    b = pack[4:10]
    base = ((b[0] >> 3) & 0x07) << 30 | (b[0] & 0x03) << 28 | b[1] << 20 \
        | (b[2] >> 3) << 15 | (b[2] & 0x03) << 13 | b[3] << 5 | b[4] >> 3
    return base & 0xFFFFFFFF


def packetize_ps(src, out, mtu=1400):
    ps = open(src, "rb").read()
    seq, ssrc, n = 1000, 0x0C0FFEE0, 0
    with open(out, "wb") as f:
        for pack in packs(ps):
            ts = scr90k(pack)
            chunks = [pack[i:i + mtu] for i in range(0, len(pack), mtu)]
            for k, c in enumerate(chunks):
                m = 0x80 if k == len(chunks) - 1 else 0
                hdr = struct.pack(">BBHII", 0x80, m | 96, seq & 0xFFFF, ts, ssrc)
                f.write(struct.pack(">H", len(hdr) + len(c)) + hdr + c)
                seq += 1
                n += 1
    print(f"{out}: {n} packets", file=sys.stderr)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "capture":
        capture(sys.argv[2], sys.argv[3])
    elif cmd == "packetize-ps":
        packetize_ps(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
