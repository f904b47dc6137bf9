"""Memory probe: RSS growth of a broker process per queued 200-byte message.

Publishes N messages (MPUB, batches of 200) to a topic with no channel, with
--mem-queue-size above N so every message stays in memory, and reads the
broker's RSS from /proc before and after.  ``--consumer``: the topic has a
channel with a subscribed consumer at RDY 0 (a consumer that takes nothing),
so the messages wait in the channel's memory queue in the form a broker
keeps them in while a channel has consumers (ours: Message objects, not
records).  Works against Go nsqd too (its RSS).
"""

import argparse
import socket
import struct
import time

from nsqd_threaded.wire.protocol_v2 import encode_mpub_body


def rss(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def _recv_exact(sock, n):
    got = b""
    while len(got) < n:
        chunk = sock.recv(n - len(got))
        if not chunk:
            raise ConnectionError("closed by the broker after %d of %d bytes" % (len(got), n))
        got += chunk
    return got


def run(address, pid, count=1000000, size=200, topic="mem", consumer=False):
    host, port = address.rsplit(":", 1)
    sub = None
    if consumer:  # subscribed with RDY 0 (the default): the channel exists and has a consumer
        sub = socket.create_connection((host, int(port)))
        sub.sendall(b"  V2SUB " + topic.encode() + b" ch\n")
        _recv_exact(sub, 10)  # the SUB's OK
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"  V2")
    before = rss(pid)
    payload = encode_mpub_body([b"m" * size] * 200)
    cmd = b"MPUB " + topic.encode() + b"\n" + struct.pack(">i", len(payload)) + payload
    for _ in range(count // 200):
        sock.sendall(cmd)
        _recv_exact(sock, 10)  # the MPUB's OK
    time.sleep(0.5)  # let the allocator settle before reading RSS (a measurement, not a test)
    after = rss(pid)
    sock.close()
    if sub is not None:
        sub.close()
    return (after - before) / count, before, after


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nsqd-tcp-address", required=True)
    ap.add_argument("--pid", type=int, required=True, help="the broker's process id")
    ap.add_argument("--count", type=int, default=1000000)
    ap.add_argument("--consumer", action="store_true",
                    help="queue in a channel that has a consumer at RDY 0 (else: a topic with no channel)")
    a = ap.parse_args()
    per, before, after = run(a.nsqd_tcp_address, a.pid, a.count, consumer=a.consumer)
    print("RSS %.1f MB -> %.1f MB: %.0f bytes per queued message" % (before / 1e6, after / 1e6, per))


if __name__ == "__main__":
    main()
