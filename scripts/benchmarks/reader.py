"""Consume load in the manner of NSQ's bench_reader: SUB, RDY n, FIN every message.

Each connection runs in its own process, parses frames in bulk and sends the
FINs for everything one recv() brought in a single sendall.  Prints msg/s and MB/s.
"""

import argparse
import os
import socket
import struct
import time

from .common import run_workers


def _consumer(address, topic, channel, rdy, runfor, gate, result):
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(b"  V2SUB %s %s\n" % (topic.encode(), channel.encode()))
    deadline = gate.wait() + runfor
    sock.sendall(b"RDY %d\n" % rdy)
    sock.settimeout(0.5)
    buf = bytearray()
    count = 0
    nbytes = 0
    unpack = struct.unpack_from
    while time.time() < deadline:
        try:
            chunk = sock.recv(1 << 20)
        except socket.timeout:
            continue
        if not chunk:
            break
        buf += chunk
        pos = 0
        n = len(buf)
        fins = []
        while n - pos >= 8:
            size, ftype = unpack(">ii", buf, pos)
            end = pos + 4 + size
            if end > n:
                break
            if ftype == 2:
                fins.append(b"FIN " + bytes(buf[pos + 18 : pos + 34]) + b"\n")
                nbytes += size - 30
            elif ftype == 0 and buf[pos + 8 : end] == b"_heartbeat_":
                fins.append(b"NOP\n")
            pos = end
        del buf[:pos]
        if fins:
            count += len(fins)
            sock.sendall(b"".join(fins))
    sock.close()
    result.put((count, nbytes))


def run(address, topic="bench", channel="ch", rdy=2500, runfor=10.0, connections=None):
    totals = run_workers(_consumer, (address, topic, channel, rdy), runfor, connections)
    count = sum(t[0] for t in totals)
    nbytes = sum(t[1] for t in totals)
    return count / runfor, nbytes / runfor / 1e6, count


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nsqd-tcp-address", default="127.0.0.1:4150")
    ap.add_argument("--topic", default="bench")
    ap.add_argument("--channel", default="ch")
    ap.add_argument("--rdy", type=int, default=2500)
    ap.add_argument("--runfor", type=float, default=10.0)
    ap.add_argument("--connections", type=int, default=os.cpu_count())
    a = ap.parse_args()
    rate, mbps, total = run(a.nsqd_tcp_address, a.topic, a.channel, a.rdy, a.runfor, a.connections)
    print("duration: %.1fs - %.3fmb/s - %.1fops/s - %d msgs" % (a.runfor, mbps, rate, total))


if __name__ == "__main__":
    main()
