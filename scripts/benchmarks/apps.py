"""The operator tools side by side: each of ours and Go's against the same broker (ours), alternately.

    scripts/bench apps --go DIR [--messages 200000] [--http-messages 20000] [--rounds 3] [--jobs tail,...]
                       [--warmup N] [--http-warmup N] [--python PYTHON]

Jobs (each run on a fresh broker of ours, default flags, ephemeral 127.0.0.1 ports):

* ``tail``: ``--messages`` 200-byte messages queued in a channel, nsq_tail (stdout to /dev/null) drains it;
* ``to_nsq``: to_nsq publishes a file of ``--messages`` 200-byte lines, until it exits;
* ``to_file``, ``to_file_gzip``: nsq_to_file (plain, then ``--gzip``) drains the queued channel
  (timed until the channel's depth is 0: the last batch waits for a sync, as in
  ``scripts/bench to_file``); then SIGTERM and every line is counted;
* ``to_nsq_relay``: nsq_to_nsq relays the queued channel to another topic of the same broker;
* ``to_http``: nsq_to_http POSTs ``--http-messages`` queued messages to a local sink (a raw
  HTTP/1.1 keep-alive server in its own process, which answers 200 at once).

The time runs from the tool's start until its job is done; the tool's CPU
(user + system, from /proc) is read before it is stopped.  Medians per tool,
messages per second, CPU microseconds per message, and the ratio ours / Go.

Steady state (``--warmup N``, ``--http-warmup N`` for nsq_to_http): the job
gets N more messages, queued with the others, and the measure starts once
the tool has taken N of them (the channel's depth, or to_nsq's published
count, says so): its start-up, connections and, on PyPy, the JIT's warm-up
are left out, and the time and CPU are those of the last ``--messages``.
"""

import argparse
import gzip
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from nsqd_threaded.client import Producer

from . import ROOT
from .common import BrokerProc, Quiet, cpu_seconds

TOPIC = "apps"
CHANNEL = "bench"
BODY = b"x" * 200
JOBS = ("tail", "to_nsq", "to_file", "to_file_gzip", "to_nsq_relay", "to_http")
GO_NAMES = {"tail": "nsq_tail", "to_nsq": "to_nsq", "to_file": "nsq_to_file", "to_file_gzip": "nsq_to_file",
            "to_nsq_relay": "nsq_to_nsq", "to_http": "nsq_to_http"}

# A raw HTTP/1.1 sink: every request (headers, then Content-Length bytes) is answered 200 at once.
SINK = r"""
import socket, sys, threading
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 0)); srv.listen(512)
print(srv.getsockname()[1], flush=True)
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
def serve(conn):
    buf = b""
    with conn:
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                data = conn.recv(65536)
                if not data:
                    return
                buf += data
                continue
            length = 0
            for line in buf[:end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            while len(buf) < end + 4 + length:
                data = conn.recv(65536)
                if not data:
                    return
                buf += data
            buf = buf[end + 4 + length:]
            conn.sendall(OK)
while True:
    conn, _ = srv.accept()
    threading.Thread(target=serve, args=(conn,), name="bench-sink-conn", daemon=True).start()
"""


def channel(broker, topic=TOPIC, name=CHANNEL):
    for ch in (broker.stats(topic) or {}).get("channels") or ():
        if ch["channel_name"] == name:
            return ch
    return None


def wait(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError("timed out: %s" % what)
        time.sleep(0.01)


def queue_messages(broker, n):
    broker.http("POST", "/topic/create?topic=" + TOPIC)
    broker.http("POST", "/channel/create?topic=%s&channel=%s" % (TOPIC, CHANNEL))
    with Producer(broker.address) as producer:
        for start in range(0, n, 200):
            producer.mpub(TOPIC, [BODY] * min(200, n - start))
    wait(lambda: (channel(broker) or {}).get("depth", 0) >= n, 120, "the channel holding %d messages" % n)


def tool_argv(who, job, a):
    if who == "go":
        return [os.path.join(a.go, GO_NAMES[job])]
    return [a.python, "-m", "nsqd_threaded", GO_NAMES[job]]


def one_run(who, job, a, workdir):
    """One tool doing one job: ``(seconds, tool CPU us per message, messages)``, the warm-up left out."""
    n = a.http_messages if job == "to_http" else a.messages
    warmup = a.http_warmup if job == "to_http" else a.warmup
    measured = n
    n += warmup  # what the tool gets: the warm-up, then the measured messages
    broker = BrokerProc("ours", a.python, ["--mem-queue-size=%d" % (n + 1000)], http=True)
    sink = tool = None
    stdin = subprocess.DEVNULL
    out_dir = tempfile.mkdtemp(prefix="apps-", dir=workdir)
    try:
        common = ["--topic=" + TOPIC, "--nsqd-tcp-address=" + broker.address]
        if job == "to_nsq":
            path = os.path.join(out_dir, "input")
            with open(path, "wb") as f:
                f.write((BODY + b"\n") * n)
            stdin = open(path, "rb")
            args = common
        else:
            queue_messages(broker, n)
            args = common + ["--channel=" + CHANNEL]
            if job == "to_file":
                args += ["--output-dir=" + out_dir]
            elif job == "to_file_gzip":
                args += ["--output-dir=" + out_dir, "--gzip"]
            elif job == "to_nsq_relay":
                args += ["--destination-nsqd-tcp-address=" + broker.address, "--destination-topic=relayed"]
            elif job == "to_http":
                sink = subprocess.Popen([a.python, "-c", SINK], stdout=subprocess.PIPE)
                args += ["--post=http://127.0.0.1:%d/" % int(sink.stdout.readline())]
        env = dict(os.environ, PYTHONPATH=ROOT)
        start = time.monotonic()
        tool = subprocess.Popen(tool_argv(who, job, a) + args, stdin=stdin, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=env, cwd=ROOT)
        cpu_start = 0.0
        if job == "to_nsq":
            if warmup and _after_warmup(lambda: (broker.stats(TOPIC) or {}).get("message_count", 0) >= warmup,
                                        tool, who, job):
                try:
                    start, cpu_start = time.monotonic(), cpu_seconds(tool.pid)
                    measured = n - (broker.stats(TOPIC) or {}).get("message_count", 0)
                except OSError:  # it ended just now: the whole run is measured
                    start, cpu_start, measured = start, 0.0, n
            tool.wait(600)
            seconds = time.monotonic() - start
            cpu = None
            wait(lambda: (broker.stats(TOPIC) or {}).get("message_count", 0) >= n, 60, "every line published")
        else:
            to_file = job.startswith("to_file")

            def left(ch):
                """What the tool has still to do: to_file's job ends when the depth is 0, the others' at their FINs."""
                if ch is None:
                    return n
                return ch["depth"] if to_file else ch["depth"] + ch["in_flight_count"]

            if warmup:
                _after_warmup(lambda: (channel(broker) or {"depth": n})["depth"] <= n - warmup, tool, who, job)
                start, cpu_start = time.monotonic(), cpu_seconds(tool.pid)
                measured = left(channel(broker))
            wait(lambda: left(channel(broker)) == 0, 600, "%s %s drained the channel" % (who, job))
            seconds = time.monotonic() - start
            cpu = cpu_seconds(tool.pid)
            tool.send_signal(signal.SIGTERM)
            tool.wait(60)
        if cpu is None:  # to_nsq has exited: its CPU is what the kernel accounted to the child
            cpu = _child_cpu()
        cpu -= cpu_start
        if job.startswith("to_file"):
            lines = 0
            for name in os.listdir(out_dir):
                with open(os.path.join(out_dir, name), "rb") as f:
                    data = f.read()
                if name.endswith(".gz"):
                    data = gzip.decompress(data)
                lines += data.count(b"\n")
            if lines != n:
                print("WARNING: %s %s wrote %d lines of %d" % (who, job, lines, n), file=sys.stderr)
        if job == "to_nsq_relay":
            relayed = (broker.stats("relayed") or {}).get("message_count", 0)
            if relayed != n:
                print("WARNING: %s relayed %d of %d" % (who, relayed, n), file=sys.stderr)
        return seconds, cpu / measured * 1e6, measured
    finally:
        for proc in (tool, sink):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        if stdin is not subprocess.DEVNULL:
            stdin.close()
        broker.stop()
        for root, dirs, files in os.walk(out_dir, topdown=False):
            for name in files:
                os.unlink(os.path.join(root, name))
            for name in dirs:
                os.rmdir(os.path.join(root, name))
        os.rmdir(out_dir)


def _after_warmup(predicate, tool, who, job):
    """Wait until the tool has taken its warm-up messages; False if it had already exited (then the
    whole run is measured, start-up included)."""
    deadline = time.monotonic() + 600
    while not predicate():
        if tool.poll() is not None:
            print("WARNING: %s %s ended before its warm-up was over: measured from its start" % (who, job),
                  file=sys.stderr)
            return False
        if time.monotonic() > deadline:
            raise RuntimeError("timed out: %s %s warming up" % (who, job))
        time.sleep(0.005)
    return True


_CHILD_CPU = [0.0]


def _child_cpu():
    """CPU seconds of the children waited for since the last call (for a tool that exited by itself)."""
    usage = os.times()
    total = usage.children_user + usage.children_system
    spent, _CHILD_CPU[0] = total - _CHILD_CPU[0], total
    return spent


def main():
    ap = argparse.ArgumentParser(prog="scripts/bench apps", description=__doc__.split("\n\n")[0])
    ap.add_argument("--go", required=True, help="directory of Go's tools (nsq_tail, to_nsq, nsq_to_file ...)")
    ap.add_argument("--messages", type=int, default=200000)
    ap.add_argument("--http-messages", type=int, default=20000, help="messages for nsq_to_http (20,000)")
    ap.add_argument("--warmup", type=int, default=0, help="messages each tool processes before the measure "
                    "starts (steady state; 0: measured from the tool's start)")
    ap.add_argument("--http-warmup", type=int, default=0, help="the same for nsq_to_http")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jobs", default=",".join(JOBS), help="comma-separated subset of " + ",".join(JOBS))
    ap.add_argument("--python", default=sys.executable, help="interpreter that runs our broker and our tools")
    a = ap.parse_args()
    jobs = [j for j in a.jobs.split(",") if j]
    unknown = set(jobs) - set(JOBS)
    if unknown:
        ap.error("unknown jobs: %s" % ", ".join(sorted(unknown)))
    quiet = Quiet()
    print("load average at start: %.2f" % quiet.start_load, flush=True)
    workdir = tempfile.mkdtemp(prefix="bench-apps-")
    _child_cpu()
    results = {(job, who): [] for job in jobs for who in ("go", "ours")}
    try:
        for rnd in range(a.rounds):
            for job in jobs:
                for who in (("go", "ours") if rnd % 2 == 0 else ("ours", "go")):
                    _child_cpu()  # what earlier children used is not this tool's
                    seconds, cpu, n = one_run(who, job, a, workdir)
                    results[(job, who)].append((seconds, cpu, n))
                    print("round %d %-13s %-4s %.2f s (%.0f msg/s), %.1f us CPU/msg"
                          % (rnd + 1, job, who, seconds, n / seconds, cpu), file=sys.stderr, flush=True)
    finally:
        os.rmdir(workdir)
    if a.warmup or a.http_warmup:
        print("steady state: after a warm-up of %d messages (nsq_to_http: %d)" % (a.warmup, a.http_warmup))
    print("%-13s %12s %12s %10s %10s %8s" % ("job", "Go msg/s", "ours msg/s", "Go us/msg", "ours us/msg", "ours/Go"))
    for job in jobs:
        rate = {}
        cpu = {}
        for who in ("go", "ours"):
            rows = results[(job, who)]
            rate[who] = statistics.median(m / s for s, _, m in rows)
            cpu[who] = statistics.median(c for _, c, _ in rows)
        print("%-13s %12.0f %12.0f %10.1f %10.1f %8.2f" % (job, rate["go"], rate["ours"], cpu["go"], cpu["ours"],
                                                           rate["ours"] / rate["go"]))
    if not quiet.start_is_quiet():
        print("LOADED: the run started with the load average at %.2f: not a result" % quiet.start_load)


if __name__ == "__main__":
    main()
