#!/usr/bin/env python3
"""Writes an RTP pcap for sipp's play_pcap_audio: N PCMU packets, 20 ms apart.

sipp rewrites the destination to the media address of the call's SDP, so the addresses
written here do not matter. Usage: make_rtp_pcap.py OUT.pcap [PACKETS]"""
import struct
import sys

out = sys.argv[1]
count = int(sys.argv[2]) if len(sys.argv) > 2 else 150


def csum(b):
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    s = (s >> 16) + (s & 0xFFFF)
    s += s >> 16
    return ~s & 0xFFFF


with open(out, "wb") as f:
    f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
    for i in range(count):
        rtp = struct.pack("!BBHII", 0x80, 0, i & 0xFFFF, i * 160, 0x1234) + b"\xff" * 160
        udp = struct.pack("!HHHH", 16000, 6000, 8 + len(rtp), 0) + rtp
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), i & 0xFFFF, 0, 64, 17, 0,
                         bytes([10, 201, 1, 2]), bytes([10, 201, 1, 1]))
        ip = ip[:10] + struct.pack("!H", csum(ip)) + ip[12:]
        eth = b"\x02\0\0\0\0\x01" + b"\x02\0\0\0\0\x02" + b"\x08\x00"
        frame = eth + ip + udp
        ts = i * 20000
        f.write(struct.pack("<IIII", ts // 1000000, ts % 1000000, len(frame), len(frame)))
        f.write(frame)
