#!/usr/bin/env python3
"""How long a graceful stop (SIGTERM) takes with a large in-memory backlog: sizes systemd's TimeoutStopSec.

    python3 scripts/measure_stop.py [--messages N] [--channels C] [--size BYTES] [--pyz nsqd-threaded.pyz]

Starts a broker (the .pyz if given, else ``python -m nsqd_threaded``) with a
memory queue large enough for everything, creates one topic with C channels,
publishes N messages with /mpub, waits until every channel holds all N in
memory, then sends SIGTERM and times the exit: all of it (N x C messages) is
written to the disk queues on the way out.
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def post(port, path, body=b""):
    request = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), data=body, method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.read()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200000)
    parser.add_argument("--channels", type=int, default=5)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--pyz")
    args = parser.parse_args()
    command = [sys.executable, args.pyz] if args.pyz else [sys.executable, "-m", "nsqd_threaded"]
    with tempfile.TemporaryDirectory() as data:
        proc = subprocess.Popen(command + ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                                           "--mem-queue-size=%d" % (args.messages + 1), "--data-path=" + data],
                                cwd=REPO, stderr=subprocess.PIPE, universal_newlines=True)
        try:
            for line in proc.stderr:
                match = re.search(r"HTTP: listening on 127\.0\.0\.1:(\d+)", line)
                if match:
                    port = int(match.group(1))
                    break
            post(port, "/topic/create?topic=backlog")
            for c in range(args.channels):
                post(port, "/channel/create?topic=backlog&channel=c%d" % c)
            body = b"x" * args.size
            batch = 5000
            for start in range(0, args.messages, batch):
                post(port, "/mpub?topic=backlog", b"\n".join([body] * min(batch, args.messages - start)))
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                with urllib.request.urlopen("http://127.0.0.1:%d/stats?format=json&topic=backlog" % port) as r:
                    stats = json.load(r)
                topics = stats.get("topics") or []
                depths = [ch["depth"] for t in topics for ch in t["channels"]]
                if len(depths) == args.channels and all(d == args.messages for d in depths):
                    break
                time.sleep(0.2)
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=3600)
            took = time.monotonic() - started
            size = sum(os.path.getsize(os.path.join(data, f)) for f in os.listdir(data))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stderr.close()
    total = args.messages * args.channels
    print("stop with %d messages (%d B bodies) in memory: exit %d in %.1f s (%.0f messages/s, %.0f MB on disk)"
          % (total, args.size, code, took, total / took, size / 1e6))


if __name__ == "__main__":
    main()
