"""The Spark source's driver side without Spark: the broker's CPU per row it drains.

    scripts/bench intake --gc-threshold 10000 --gc-threshold 500000 --rounds 3

``NsqStreamReader`` is driven as Spark drives it: ``latestOffset``, ``partitions``, a pause
standing for the batch's work in Spark (``--batch-ms``), ``commit``; until ``--messages``
messages of 200 bytes, queued beforehand on a channel of a broker child process, are
drained.  Each round starts a fresh broker for each setting named (the gc thresholds
alternate, so that a drift of the machine shows in both); printed per run: rows/s, the
broker's CPU per row, and this process's (the reader's intake: reads, FINs).  Needs
``pyspark`` importable (the source's module imports its data source API), not a JVM.
"""

import argparse
import resource
import sys
import time
import urllib.request

from nsqd_threaded.client import Producer
from nsqd_threaded.testing import BrokerProcess

from .common import cpu_seconds, load_average


def own_cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def broker_command(threshold):
    """``python -m nsqd_threaded`` with the command's gc threshold replaced (None: as shipped)."""
    if threshold is None:
        return None
    code = ("import runpy, sys; import nsqd_threaded.internal.process as p; p.GC_GEN0_THRESHOLD = %d; "
            "sys.argv[0] = 'nsqd-threaded'; runpy.run_module('nsqd_threaded', run_name='__main__')" % threshold)
    return [sys.executable, "-c", code]


def drain_once(broker, args, topic):
    from nsqd_threaded.spark.options import source_options
    from nsqd_threaded.spark.source import NsqStreamReader

    http = "http://%s:%d" % tuple(broker.http_address)
    for path in ("/topic/create?topic=%s" % topic, "/channel/create?topic=%s&channel=spark" % topic):
        urllib.request.urlopen(urllib.request.Request(http + path, method="POST"), timeout=10).close()
    body = b"x" * args.size
    with Producer(broker.tcp_address) as producer:
        for start in range(0, args.messages, 5000):
            producer.mpub(topic, [body] * min(5000, args.messages - start))
    options = {"nsqd": "%s:%d" % tuple(broker.tcp_address), "topic": topic, "channel": "spark"}
    if args.connections:
        options["connectionsPerNode"] = str(args.connections)
    reader = NsqStreamReader(source_options(options))
    broker_before, own_before, started = cpu_seconds(broker.proc.pid), own_cpu(), time.perf_counter()
    start, rows = reader.initialOffset(), 0
    try:
        while rows < args.messages:
            end = reader.latestOffset()
            rows += sum(count for partition in reader.partitions(start, end) for _, count in partition.nodes)
            time.sleep(args.batch_ms / 1000.0)  # the batch's work in Spark
            reader.commit(end)
            start = end
    finally:
        reader.stop()  # (every committed message FINed before it returns)
    elapsed = time.perf_counter() - started
    return (rows / elapsed, (cpu_seconds(broker.proc.pid) - broker_before) / rows * 1e6,
            (own_cpu() - own_before) / rows * 1e6)


def main():
    parser = argparse.ArgumentParser(prog="scripts/bench intake", description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=1000000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-ms", type=float, default=190.0,
                        help="pause between a batch's planning and its commit (Spark's work; default 190)")
    parser.add_argument("--connections", type=int, help="the source's connectionsPerNode (default: the source's)")
    parser.add_argument("--gc-threshold", type=int, action="append", default=[], metavar="N",
                        help="the broker command's youngest-generation gc threshold (again to alternate; "
                             "default: as shipped)")
    parser.add_argument("--broker-flag", action="append", default=[], metavar="--FLAG=VALUE")
    args = parser.parse_args()
    settings = args.gc_threshold or [None]
    print("load average at the start: %.2f" % load_average(), flush=True)
    results = {}
    for round_no in range(args.rounds):
        for threshold in settings:
            command = broker_command(threshold)
            with BrokerProcess("--mem-queue-size=%d" % args.messages, *args.broker_flag,
                               **({"command": command} if command else {})) as broker:
                rate, broker_us, own_us = drain_once(broker, args, "intake%d" % round_no)
            label = "as shipped" if threshold is None else "gc threshold %d" % threshold
            results.setdefault(label, []).append(broker_us)
            print("round %d, %s: %.0f rows/s; CPU per row: broker %.2f µs, the reader %.2f µs"
                  % (round_no + 1, label, rate, broker_us, own_us), flush=True)
    for label, values in results.items():
        values.sort()
        print("RESULT intake %s: broker CPU per row median %.2f µs (%.2f-%.2f)"
              % (label, values[len(values) // 2], values[0], values[-1]))


if __name__ == "__main__":
    main()
