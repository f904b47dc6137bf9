"""``scripts/bench``: every benchmark against brokers started here, in one table; or one benchmark.

    scripts/bench                      # CPython from .venv, 10 s per throughput phase
    scripts/bench --python pypy3       # the broker under another interpreter
    scripts/bench --runfor 3 --quick   # a shorter run
    scripts/bench --compare ../shared/reference/go-nsq-1.3.0/nsqd [--python pypy3] [--floor]
                                       # Go nsqd and ours alternately, medians, ratios
                                       # (see benchmarks/compare.py)
    scripts/bench NAME [ARGS]          # one of the benchmarks below; scripts/bench NAME --help

The load generators always run under the interpreter running this script, in
several processes, so that they cost less than the broker they measure.
Targets are relative to Go nsqd 1.3 on the same 2-core machine class.  The last table is the
consume rate with snappy, deflate and TLS as ratios to the plain run (benchmarks/features.py).
"""

import argparse
import importlib
import os
import sys
import threading
import time

from . import compare, features, memory, reader, roundtrip, writer
from .common import BrokerProc, Quiet, interpreter

# scripts/bench NAME: the benchmarks with a command line of their own (module: what it measures).
COMMANDS = {
    "apps": "each operator tool of ours and Go's against the same broker: msg/s and CPU per message",
    "consumer": "the package's Consumer draining a queued channel, from Go nsqd, ours and a baseline tree",
    "connections": "many idle connections: memory per connection, mass close, /stats and PUB latency",
    "consumers": "many consumers on one channel at RDY 1, FIN on receipt: rate, CPU per message, subscribe all",
    "drain": "the worst PUB round trip while a topic pump drains a backlog into a new channel",
    "features": "consume with snappy, deflate, TLS: ratios to plain",
    "fixture": "starting and stopping the test fixture's brokers",
    "floor": "the floor probe alone (single PUB and round trip)",
    "intake": "the Spark source's reader driven as Spark drives it, without Spark: the broker's CPU per row",
    "memory": "RSS per queued message",
    "policies": "publish throughput per storage policy",
    "pyspy": "py-spy profiles of our broker and the floor probe under the single-PUB load",
    "reader": "consume load (bench_reader)",
    "roundtrip": "publish-to-delivery round trips",
    "snappy": "the snappy codec's speed",
    "spark": "the Spark source and sink against a broker, with Go's bench_reader for reference",
    "to_file": "Go's nsq_to_file draining a queued channel, from Go nsqd and from ours",
    "warmup": "how the round-trip p99 falls with a broker's warm-up (a JIT's)",
    "work": "CPU, voluntary context switches and instructions per PUB and per round trip: ours, the floor, Go",
    "writer": "publish load (bench_writer)",
}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in COMMANDS:
        module = importlib.import_module("." + argv[0], __package__)
        sys.argv = ["scripts/bench " + argv[0]] + argv[1:]
        module.main()
        return
    epilog = "benchmarks:\n" + "\n".join("  %-12s %s" % kv for kv in sorted(COMMANDS.items()))
    ap = argparse.ArgumentParser(prog="scripts/bench", description=__doc__, epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default=sys.executable, help="interpreter that runs the broker")
    ap.add_argument("--runfor", type=float, default=None, help="seconds per throughput phase (10; 5 with --compare)")
    ap.add_argument("--count", type=int, default=None,
                    help="messages for the memory probe (1,000,000; 200,000 with --quick or --compare)")
    ap.add_argument("--quick", action="store_true", help="fewer round trips and a smaller memory probe")
    ap.add_argument("--compare", metavar="GO_NSQD", help="run Go nsqd (this binary) and ours alternately")
    ap.add_argument("--rounds", type=int, default=3, help="--compare: rounds (medians are reported)")
    ap.add_argument("--phases", default=",".join(compare.PHASES),
                    help="--compare: comma-separated subset of " + ",".join(compare.PHASES))
    ap.add_argument("--baseline", metavar="TREE",
                    help="--compare: also run this project from another tree (before/after a change)")
    ap.add_argument("--our-tools", action="store_true", help="--compare: our load scripts even if Go's are there")
    ap.add_argument("--rtt-count", type=int, default=5000, help="--compare: round trips per rtt phase")
    ap.add_argument("--warmup", type=float, default=2.0,
                    help="--compare: seconds of each phase's load before the timed one, unmeasured (2)")
    ap.add_argument("--floor", action="store_true",
                    help="--compare: the floor probe (benchmarks/floor.py) as a column where it applies")
    ap.add_argument("--max-load", type=float, default=1.0,
                    help="refuse to start above this 1-minute load average (1.0)")
    ap.add_argument("--allow-load", action="store_true",
                    help="run on a busy machine anyway (rows measured busy are flagged LOADED)")
    ap.add_argument("--no-features", action="store_true",
                    help="skip the consume runs with snappy, deflate and TLS (ratios to plain)")
    a = ap.parse_args(argv)
    if a.compare:
        a.runfor = a.runfor or 5.0
        a.count = a.count or 200000
        a.phases = [p for p in a.phases.split(",") if p]
        unknown = set(a.phases) - set(compare.PHASES)
        if unknown:
            ap.error("unknown phases: %s" % ", ".join(sorted(unknown)))
        compare.compare(a)
        return
    a.runfor = a.runfor or 10.0
    a.count = a.count or 1000000
    rtt_count = 2000 if a.quick else 10000
    mem_count = 200000 if a.quick else a.count
    rows = []
    quiet = Quiet(max_load=a.max_load)
    if not quiet.start_is_quiet() and not a.allow_load:
        raise SystemExit("the machine is busy (1-minute load average %.2f > %.2f): figures would be noise; "
                         "--allow-load to run anyway" % (quiet.start_load, a.max_load))

    def row(name, value, unit, target, higher_better=True, cpu=None):
        ok = value >= target if higher_better else value <= target
        rows.append((name, value, unit, target, "yes" if ok else "NO", "" if cpu is None else "%.2f" % cpu))

    def rate_row(name, target, load, *args):
        """A throughput load, with the broker's CPU per message (us) next to its rate."""
        cpu = b.cpu_seconds()
        rate = load(*args)[0]
        cpu = b.cpu_seconds() - cpu
        row(name, rate, "msg/s", target, cpu=cpu / (rate * a.runfor) * 1e6 if rate else None)

    b = BrokerProc("ours", a.python)
    try:
        rate_row("MPUB 200x200B msg/s", 150000, writer.run, b.address, "sub_bench", 200, 200, a.runfor)
        rate_row("consume RDY 2500 msg/s", 75000, reader.run, b.address, "sub_bench", "ch", 2500, a.runfor)
        rate_row("PUB x2 conns msg/s", 20000, writer.run, b.address, "pub_bench", 200, 1, a.runfor, 2)
        r = roundtrip.run(b.address, "rtt_idle", rtt_count)
        row("round trip p50 (idle)", r["p50_us"], "us", 1000, False)
        row("round trip p99 (idle)", r["p99_us"], "us", 1000, False)
        load = threading.Thread(target=writer.run, args=(b.address, "bg", 200, 200, a.runfor, 1), name="bench-background-writer")
        load.start()
        time.sleep(0.7)
        r = roundtrip.run(b.address, "rtt_load", rtt_count)
        load.join(a.runfor + 60)  # (bounded: the writer stops at runfor)
        row("round trip p99 (writer running)", r["p99_us"], "us", 10000, False)
    finally:
        b.stop()

    b = BrokerProc("ours", a.python, ["--mem-queue-size=%d" % (mem_count + 10000)])
    try:
        per, _, _ = memory.run(b.address, b.pid, mem_count)
        row("RSS per queued 200B msg (%dk)" % (mem_count // 1000), per, "bytes", 450, False)
    finally:
        b.stop()

    print("broker: %s; %d cores; %s; load average %.2f" % (interpreter(a.python), os.cpu_count(),
                                                          os.uname()[2], os.getloadavg()[0]))
    print("(ratios against Go nsqd measured in the same run: scripts/bench --compare PATH_TO_GO_NSQD)")
    print("%-34s %12s %-6s %10s %4s %14s" % ("benchmark", "value", "unit", "target", "met", "CPU us/msg"))
    for name, value, unit, target, ok, cpu in rows:
        print("%-34s %12.0f %-6s %10d %4s %14s" % (name, value, unit, target, ok, cpu))
    if not quiet.start_is_quiet():
        print("LOADED: the run started with the load average at %.2f (above %.2f): not a result"
              % (quiet.start_load, a.max_load))
    if not a.no_features:
        medians = features.run(rounds=1 if a.quick else 3, python=a.python)
        print("\n%-34s %12s %14s" % ("consume, RDY 2500, with", "msg/s", "ratio to plain"))
        for mode, med in medians.items():
            print("%-34s %12.0f %14.2f" % (mode, med, med / medians["plain"]))


if __name__ == "__main__":
    main()
