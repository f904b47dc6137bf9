#!/usr/bin/env python3
"""Run every benchmark against brokers this script starts itself, and print one table.

    scripts/bench                      # CPython from .venv, 10 s per throughput phase
    scripts/bench --python pypy3       # the broker under another interpreter
    scripts/bench --runfor 3 --quick   # a shorter run
    scripts/bench --compare ../shared/reference/go-nsq-1.3.0/nsqd [--python pypy3]
                                       # Go nsqd and ours alternately, medians, ratios
                                       # (see scripts/bench_compare.py)

The load generators always run under the interpreter running this script, in
several processes, so that they cost less than the broker they measure.
Targets are relative to Go nsqd 1.3 on the same 2-core machine class.  The last table is the
consume rate with snappy, deflate and TLS as ratios to the plain run (scripts/bench_features.py).
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

import bench_compare  # noqa: E402
import bench_features  # noqa: E402
import bench_memory  # noqa: E402
import bench_reader  # noqa: E402
import bench_roundtrip  # noqa: E402
import bench_writer  # noqa: E402



class Broker:
    def __init__(self, python, *flags):
        self.data = tempfile.mkdtemp(prefix="nsqd-bench-")
        env = dict(os.environ, PYTHONPATH=ROOT)
        self.proc = subprocess.Popen(
            [python, "-m", "nsqd_threaded", "--tcp-address=127.0.0.1:0", "--http-address=",
             "--data-path=" + self.data, "--log-level=warn", *flags],
            stderr=subprocess.PIPE, env=env,
        )
        # --log-level=warn hides the listening line; ask /proc for the port instead.
        deadline = time.monotonic() + 30
        self.address = None
        while self.address is None:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("broker did not start: %s" % self.proc.stderr.read().decode())
            self.address = _listening_address(self.proc.pid)
            time.sleep(0.02)
        self._drain = threading.Thread(target=self.proc.stderr.read, daemon=True)
        self._drain.start()

    def stop(self):
        self.proc.terminate()
        self.proc.wait(60)
        shutil.rmtree(self.data, ignore_errors=True)


def _listening_address(pid):
    """The TCP port a process listens on, from /proc (no log parsing needed)."""
    try:
        inodes = set()
        for fd in os.listdir("/proc/%d/fd" % pid):
            link = os.readlink("/proc/%d/fd/%s" % (pid, fd))
            m = re.match(r"socket:\[(\d+)\]", link)
            if m:
                inodes.add(m.group(1))
        with open("/proc/net/tcp") as f:
            for line in f.readlines()[1:]:
                parts = line.split()
                local, state, inode = parts[1], parts[3], parts[9]
                if state == "0A" and inode in inodes:
                    port = int(local.split(":")[1], 16)
                    return "127.0.0.1:%d" % port
    except OSError:
        return None
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default=sys.executable, help="interpreter that runs the broker")
    ap.add_argument("--runfor", type=float, default=None, help="seconds per throughput phase (10; 5 with --compare)")
    ap.add_argument("--count", type=int, default=None,
                    help="messages for the memory probe (1,000,000; 200,000 with --quick or --compare)")
    ap.add_argument("--quick", action="store_true", help="fewer round trips and a smaller memory probe")
    ap.add_argument("--compare", metavar="GO_NSQD", help="run Go nsqd (this binary) and ours alternately")
    ap.add_argument("--rounds", type=int, default=3, help="--compare: rounds (medians are reported)")
    ap.add_argument("--phases", default=",".join(bench_compare.PHASES),
                    help="--compare: comma-separated subset of " + ",".join(bench_compare.PHASES))
    ap.add_argument("--baseline", metavar="TREE",
                    help="--compare: also run this project from another tree (before/after a change)")
    ap.add_argument("--our-tools", action="store_true", help="--compare: our load scripts even if Go's are there")
    ap.add_argument("--rtt-count", type=int, default=5000, help="--compare: round trips per rtt phase")
    ap.add_argument("--no-features", action="store_true",
                    help="skip the consume runs with snappy, deflate and TLS (ratios to plain)")
    a = ap.parse_args()
    if a.compare:
        a.runfor = a.runfor or 5.0
        a.count = a.count or 200000
        a.phases = [p for p in a.phases.split(",") if p]
        unknown = set(a.phases) - set(bench_compare.PHASES)
        if unknown:
            ap.error("unknown phases: %s" % ", ".join(sorted(unknown)))
        bench_compare.compare(a)
        return
    a.runfor = a.runfor or 10.0
    a.count = a.count or 1000000
    rtt_count = 2000 if a.quick else 10000
    mem_count = 200000 if a.quick else a.count
    rows = []

    def row(name, value, unit, target, higher_better=True):
        ok = value >= target if higher_better else value <= target
        rows.append((name, value, unit, target, "yes" if ok else "NO"))

    b = Broker(a.python)
    try:
        rate, mbps, _ = bench_writer.run(b.address, "sub_bench", 200, 200, a.runfor)
        row("MPUB 200x200B msg/s", rate, "msg/s", 150000)
        rate, mbps, _ = bench_reader.run(b.address, "sub_bench", "ch", 2500, a.runfor)
        row("consume RDY 2500 msg/s", rate, "msg/s", 75000)
        rate, mbps, _ = bench_writer.run(b.address, "pub_bench", 200, 1, a.runfor, 2)
        row("PUB x2 conns msg/s", rate, "msg/s", 20000)
        r = bench_roundtrip.run(b.address, "rtt_idle", rtt_count)
        row("round trip p50 (idle)", r["p50_us"], "us", 1000, False)
        row("round trip p99 (idle)", r["p99_us"], "us", 1000, False)
        load = threading.Thread(target=bench_writer.run, args=(b.address, "bg", 200, 200, a.runfor, 1))
        load.start()
        time.sleep(0.7)
        r = bench_roundtrip.run(b.address, "rtt_load", rtt_count)
        load.join()
        row("round trip p99 (writer running)", r["p99_us"], "us", 10000, False)
    finally:
        b.stop()

    b = Broker(a.python, "--mem-queue-size=%d" % (mem_count + 10000))
    try:
        per, _, _ = bench_memory.run(b.address, b.proc.pid, mem_count)
        row("RSS per queued 200B msg (%dk)" % (mem_count // 1000), per, "bytes", 450, False)
    finally:
        b.stop()

    impl = subprocess.run([a.python, "-c", "import sys,platform;print(platform.python_implementation(), "
                           "platform.python_version())"], capture_output=True, text=True).stdout.strip()
    print("broker: %s; %d cores; %s" % (impl, os.cpu_count(), " ".join(os.uname()[2:4][:1])))
    print("(ratios against Go nsqd measured in the same run: scripts/bench --compare PATH_TO_GO_NSQD)")
    print("%-34s %12s %-6s %10s %4s" % ("benchmark", "value", "unit", "target", "met"))
    for name, value, unit, target, ok in rows:
        print("%-34s %12.0f %-6s %10d %4s" % (name, value, unit, target, ok))
    if not a.no_features:
        medians = bench_features.run(rounds=1 if a.quick else 3, python=a.python)
        print("\n%-34s %12s %14s" % ("consume, RDY 2500, with", "msg/s", "ratio to plain"))
        for mode, med in medians.items():
            print("%-34s %12.0f %14.2f" % (mode, med, med / medians["plain"]))


if __name__ == "__main__":
    main()
