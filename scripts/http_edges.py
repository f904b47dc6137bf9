#!/usr/bin/env python3
"""Figures for the HTTP edge: memory while an oversized body is refused, and how
long stalled clients hold the broker.  Starts a broker process from a checkout.

    scripts/http_edges.py rss [--mb 200] [--chunk-mb 1]   peak broker RSS while a chunked /mpub of MB is sent
    scripts/http_edges.py stalled [--clients 50]    seconds until stalled clients are dropped
    ... [--root PATH] [broker flags, e.g. --http-read-timeout=1s]             run another checkout (e.g. an older commit)
"""

import argparse
import os
import re
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Broker:
    def __init__(self, root, flags):
        self.tmp = tempfile.TemporaryDirectory()
        env = dict(os.environ, PYTHONPATH=root)
        cmd = [sys.executable, "-m", "nsqd_threaded", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
               "--data-path=" + self.tmp.name] + flags
        self.proc = subprocess.Popen(cmd, env=env, cwd=self.tmp.name, stderr=subprocess.PIPE, text=True)
        for line in self.proc.stderr:
            m = re.search(r"HTTP: listening on (\S+):(\d+)", line)
            if m:
                self.http = (m.group(1), int(m.group(2)))
                break
        threading.Thread(target=self.proc.stderr.read, name="stderr-drain", daemon=True).start()  # keep the pipe drained

    def status(self, key):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        raise KeyError(key)

    def close(self):
        self.proc.terminate()
        self.proc.wait(30)
        self.tmp.cleanup()


def rss(broker, mb, chunk_mb):
    before = broker.status("VmRSS")
    sock = socket.create_connection(broker.http, timeout=60)
    sock.sendall(b"POST /mpub?topic=big HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    line = b"x" * ((1 << 20) - 1) + b"\n"
    sent = 0
    t0 = time.monotonic()
    try:
        while sent < mb:
            n = min(chunk_mb, mb - sent)
            sock.sendall(b"%x\r\n" % (n << 20))
            for _ in range(n):
                sock.sendall(line)
                sent += 1
            sock.sendall(b"\r\n")
        sock.sendall(b"0\r\n\r\n")
    except OSError:
        pass
    try:
        reply = sock.recv(4096).split(b"\r\n\r\n")[-1] or b"(reset)"
    except OSError as e:
        reply = repr(e).encode()
    elapsed = time.monotonic() - t0
    sock.close()
    peak = broker.status("VmHWM")
    print("sent %d of %d MiB in %.2fs; reply %s" % (sent, mb, elapsed, reply.decode(errors="replace")))
    print("broker RSS before %.1f MB, peak %.1f MB (+%.1f MB)" % (before / 1e6, peak / 1e6, (peak - before) / 1e6))


def stalled(broker, n):
    kinds = {"silent": b"", "half head": b"POST /pub?topic=t HTTP/1.1\r\nContent-Le",
             "half body": b"POST /pub?topic=t HTTP/1.1\r\nContent-Length: 10\r\n\r\nhalf"}
    socks = []
    t0 = time.monotonic()
    for i in range(n):
        kind = list(kinds)[i % len(kinds)]
        s = socket.create_connection(broker.http, timeout=600)
        s.sendall(kinds[kind])
        socks.append((kind, s))
    ping = socket.create_connection(broker.http, timeout=10)
    p0 = time.monotonic()
    ping.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
    ping.recv(4096)
    print("GET /ping with %d stalled clients connected: %.1f ms" % (n, (time.monotonic() - p0) * 1e3))
    ping.close()
    dropped = {}
    sel = selectors.DefaultSelector()
    for kind, s in socks:
        sel.register(s, selectors.EVENT_READ, kind)
    while sel.get_map():
        for key, _ in sel.select():
            try:
                if key.fileobj.recv(4096):
                    continue  # a reply (500 for a stalled body) before the close
            except OSError:
                pass
            dropped.setdefault(key.data, []).append(time.monotonic() - t0)
            sel.unregister(key.fileobj)
            key.fileobj.close()
    for kind, times in dropped.items():
        print("%-9s x%-3d dropped after %.1f-%.1f s" % (kind, len(times), min(times), max(times)))
    print("all %d dropped within %.1f s" % (n, max(max(t) for t in dropped.values())))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["rss", "stalled"])
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--chunk-mb", type=int, default=1, help="MiB per chunk (= --mb: one chunk)")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--root", default=ROOT)
    args, flags = ap.parse_known_args()
    broker = Broker(os.path.abspath(args.root), [f for f in flags if f != "--"])
    try:
        if args.what == "rss":
            rss(broker, args.mb, args.chunk_mb)
        else:
            stalled(broker, args.clients)
    finally:
        broker.close()


if __name__ == "__main__":
    main()
