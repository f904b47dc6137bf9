"""Publish load in the manner of NSQ's bench_writer: MPUB batches over N connections.

Each connection runs in its own process and sends pre-encoded MPUB commands,
waiting for each OK, so the generator costs far less than the broker.
Prints msg/s and MB/s.
"""

import argparse
import os
import socket
import struct
import time

from nsqd_threaded.wire.protocol_v2 import encode_mpub_body

from .common import run_workers


def _recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def _publisher(address, topic, size, batch, runfor, gate, result):
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(b"  V2")
    body = b"a" * size
    if batch == 1:
        cmd = b"PUB " + topic.encode() + b"\n" + struct.pack(">i", size) + body
    else:
        payload = encode_mpub_body([body] * batch)
        cmd = b"MPUB " + topic.encode() + b"\n" + struct.pack(">i", len(payload)) + payload
    deadline = gate.wait() + runfor
    sent = 0
    ok = b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    recv = sock.recv
    send = sock.sendall
    while time.time() < deadline:
        send(cmd)
        resp = recv(64)  # the 10-byte OK frame arrives in one segment
        if resp != ok:
            resp += _recv_exact(sock, 10 - len(resp)) if len(resp) < 10 else b""
            if resp != ok:
                raise RuntimeError(resp)
        sent += batch
    sock.close()
    result.put(sent)


def run(address, topic="bench", size=200, batch=200, runfor=10.0, connections=None):
    total = sum(run_workers(_publisher, (address, topic, size, batch), runfor, connections))
    elapsed = runfor
    return total / elapsed, total * size / elapsed / 1e6, total


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nsqd-tcp-address", default="127.0.0.1:4150")
    ap.add_argument("--topic", default="bench")
    ap.add_argument("--size", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=200)
    ap.add_argument("--runfor", type=float, default=10.0)
    ap.add_argument("--connections", type=int, default=os.cpu_count())
    a = ap.parse_args()
    rate, mbps, total = run(a.nsqd_tcp_address, a.topic, a.size, a.batch_size, a.runfor, a.connections)
    print("duration: %.1fs - %.3fmb/s - %.1fops/s - %d msgs" % (a.runfor, mbps, rate, total))


if __name__ == "__main__":
    main()
