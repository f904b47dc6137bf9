"""Go's nsq_to_file draining a queued channel: from Go nsqd and from ours, alternately.

    scripts/bench to_file --go DIR [--messages 200000] [--rounds 3] [--baseline TREE]

Each round, for each broker (Go nsqd from DIR, ours, and ours from another
tree with --baseline; fresh data directory, default flags, ephemeral
127.0.0.1 ports): ``--messages`` 200-byte messages are queued in the channel
``nsq_to_file`` of topic ``archive`` (memory queue, then disk, as a user's
backlog would be), then Go's ``nsq_to_file`` (DIR) starts with its default
flags and the time until the channel is empty is measured, with the
broker's CPU per message.  Go's nsq_to_file holds what it wrote un-FINed
until its batch of --max-in-flight is full or its --sync-interval (30 s)
fires, so a broker that waits for FINs before delivering more stalls here.
Afterwards nsq_to_file gets SIGTERM and the lines in its files are counted
(every message once).  Medians per broker and the ratio ours / Go.
"""

import argparse
import glob
import os
import signal
import subprocess
import sys
import tempfile
import time

from nsqd_threaded.client import Producer

from . import ROOT
from .common import BrokerProc, drain_rounds

TOPIC = "archive"
CHANNEL = "nsq_to_file"  # nsq_to_file's default channel


def channel_stats(broker):
    topic = broker.stats(TOPIC)
    for ch in (topic or {}).get("channels") or ():
        if ch["channel_name"] == CHANNEL:
            return ch
    return None


def one_run(kind, argv0, root, go_dir, messages):
    """Queue, drain with Go's nsq_to_file; returns (seconds, broker CPU us per message, lines written)."""
    broker = BrokerProc(kind, argv0, (), root, http=True)
    out_dir = tempfile.mkdtemp(prefix="to-file-")
    tool = None
    try:
        broker.http("POST", "/topic/create?topic=" + TOPIC)
        broker.http("POST", "/channel/create?topic=%s&channel=%s" % (TOPIC, CHANNEL))
        body = b"x" * 200
        with Producer(broker.address) as producer:
            for start in range(0, messages, 200):
                producer.mpub(TOPIC, [body] * min(200, messages - start))
        deadline = time.monotonic() + 120
        while (channel_stats(broker) or {}).get("depth", 0) < messages:
            if time.monotonic() > deadline:
                raise RuntimeError("%s: the channel never held the %d messages" % (kind, messages))
            time.sleep(0.05)
        cpu = broker.cpu_seconds()
        start = time.monotonic()
        tool = subprocess.Popen([os.path.join(go_dir, "nsq_to_file"), "--topic=" + TOPIC,
                                 "--nsqd-tcp-address=" + broker.address, "--output-dir=" + out_dir],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = start + 600
        while True:
            ch = channel_stats(broker)
            if ch is not None and ch["depth"] == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("%s: not drained after 600 s" % kind)
            time.sleep(0.02)
        seconds = time.monotonic() - start
        cpu = broker.cpu_seconds() - cpu
        tool.send_signal(signal.SIGTERM)
        tool.wait(60)
        lines = 0
        for path in glob.glob(os.path.join(out_dir, "*")):
            with open(path, "rb") as f:
                lines += f.read().count(b"\n")
        return seconds, cpu / messages * 1e6, "%d lines written" % lines
    finally:
        if tool is not None and tool.poll() is None:
            tool.kill()
            tool.wait()
        broker.stop()
        for path in glob.glob(os.path.join(out_dir, "*")):
            os.unlink(path)
        os.rmdir(out_dir)


def main():
    ap = argparse.ArgumentParser(prog="scripts/bench to_file", description=__doc__.split("\n\n")[0])
    ap.add_argument("--go", required=True, help="directory of the Go reference binaries (nsqd, nsq_to_file)")
    ap.add_argument("--messages", type=int, default=200000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--python", default=sys.executable, help="interpreter that runs our broker")
    ap.add_argument("--baseline", metavar="TREE", help="also run this project from another tree")
    a = ap.parse_args()
    brokers = [("go", os.path.join(a.go, "nsqd"), None), ("ours", a.python, ROOT)]
    if a.baseline:
        brokers.append(("base", a.python, os.path.abspath(a.baseline)))
    drain_rounds(brokers, a.rounds, a.messages,
                 lambda kind, argv0, root: one_run(kind, argv0, root, a.go, a.messages))


if __name__ == "__main__":
    main()
