"""Round-trip latency: publish one message, receive it, FIN it, repeat; prints p50/p99/max."""

import argparse
import socket
import struct
import time


def _recv_frame(sock, buf):
    while True:
        if len(buf) >= 4:
            size = struct.unpack_from(">i", buf, 0)[0]
            if len(buf) >= 4 + size:
                frame = bytes(buf[4 : 4 + size])
                del buf[: 4 + size]
                return struct.unpack_from(">i", frame, 0)[0], frame[4:]
        chunk = sock.recv(65536)
        if not chunk:
            raise EOFError
        buf += chunk


class Session:
    """A publishing and a subscribed connection (RDY 1) to one topic, for round trips one at a time."""

    def __init__(self, address, topic="rtt", size=200):
        host, port = address.rsplit(":", 1)
        self.pub = socket.create_connection((host, int(port)))
        self.sub = socket.create_connection((host, int(port)))
        for s in (self.pub, self.sub):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.sendall(b"  V2")
        self.pbuf, self.sbuf = bytearray(), bytearray()
        self.sub.sendall(b"SUB %s c\nRDY 1\n" % topic.encode())
        assert _recv_frame(self.sub, self.sbuf) == (0, b"OK")
        self.cmd = b"PUB " + topic.encode() + b"\n" + struct.pack(">i", size) + b"r" * size

    def round_trips(self, count):
        """``count`` round trips: PUB, its MESSAGE, FIN, the PUB's OK; the publish-to-delivery seconds of each."""
        pub, sub, sbuf, pbuf, cmd = self.pub, self.sub, self.sbuf, self.pbuf, self.cmd
        samples = []
        for _ in range(count):
            t0 = time.perf_counter()
            pub.sendall(cmd)
            while True:
                ft, data = _recv_frame(sub, sbuf)
                if ft == 2:
                    break
                if data == b"_heartbeat_":
                    sub.sendall(b"NOP\n")
            t1 = time.perf_counter()
            sub.sendall(b"FIN " + data[10:26] + b"\n")
            _recv_frame(pub, pbuf)
            samples.append(t1 - t0)
        return samples

    def close(self):
        self.pub.close()
        self.sub.close()


def run(address, topic="rtt", count=5000, size=200):
    session = Session(address, topic, size)
    try:
        session.round_trips(100)  # warm-up
        samples = session.round_trips(count)
    finally:
        session.close()
    samples.sort()
    n = len(samples)
    return {
        "p50_us": samples[n // 2] * 1e6,
        "p99_us": samples[min(n - 1, int(n * 0.99))] * 1e6,
        "max_us": samples[-1] * 1e6,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nsqd-tcp-address", default="127.0.0.1:4150")
    ap.add_argument("--topic", default="rtt")
    ap.add_argument("--count", type=int, default=5000)
    a = ap.parse_args()
    r = run(a.nsqd_tcp_address, a.topic, a.count)
    print("round trip: p50 %.0fus  p99 %.0fus  max %.0fus" % (r["p50_us"], r["p99_us"], r["max_us"]))


if __name__ == "__main__":
    main()
