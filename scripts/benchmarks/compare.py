"""Go nsqd and ours side by side: ``scripts/bench --compare PATH_TO_GO_NSQD``.

Each phase runs on both brokers alternately (fresh data directory and
ephemeral 127.0.0.1 ports each time, the same flags for both, the first
broker alternating from round to round), for several rounds; the table shows
the median of each and the ratio ours / Go (Go / ours for latency, memory and
CPU, so that above 1 always means "ours is better").

The load comes from Go's own tools when they sit next to the Go nsqd
(bench_writer, bench_reader, pub_probe, rtt_probe: both brokers are driven by
the same client), from our scripts otherwise (``--our-tools`` forces them).

Before each phase the machine is checked (:class:`common.Quiet`); a row with a
sample taken on a busy machine is flagged LOADED.  Before each timed load, each
broker gets ``--warmup`` seconds of the same load, unmeasured (a JIT's compile
pauses belong to start-up, not to the figure).  ``--floor`` adds the floor probe
(``floor.py``) as a column for the phases it serves.

Phases (``--phases``, comma-separated):

========  ==================================================================
mpub      bench_writer: MPUB of 200 x 200 B, one connection per core, into a
          topic without channels (default flags: past 10,000 it is on disk)
consume   bench_reader, RDY 2500, FIN each: drains what mpub wrote, for 60 %
          of --runfor (so that neither broker runs dry)
mpub-chan the mpub load into a topic with one channel (created first), with
          ``--mem-queue-size=1000000``: every message stays in the channel's
          memory queue (the load comes in segments, the channel emptied between
          them, unmeasured: see :func:`mpub_into_channel`)
pub-mem   single PUB, 2 connections, ``--mem-queue-size=100000000``
pub-disk  single PUB, 2 connections, default flags, a topic without channels
          (past 10,000 messages every PUB is a disk write)
rtt       publish one, wait for its delivery, FIN, repeat: p99
fanout    one topic, 10 channels, one consumer on each, a bench_writer
          publishing meanwhile: messages delivered per second, all channels
memory    RSS growth per queued 200 B message (``--mem-queue-size`` above it),
          in a topic with no channel, then in a channel with a consumer at RDY 0
========  ==================================================================
"""

import math
import os
import statistics
import sys
import time

from . import ROOT, memory
from . import tools as load_tools
from .common import BrokerProc, Quiet, interpreter

PHASES = ("mpub", "consume", "mpub-chan", "pub-mem", "pub-disk", "rtt", "fanout", "memory")
FLOOR_PHASES = ("pub-mem", "rtt")  # what the floor server can stand in for

# mpub-chan: the memory queue of both brokers, and the share of it one segment of load may fill
# at the rate the previous segment measured (the first segment assumes FIRST_RATE).
MPUB_CHAN_MEM_QUEUE = 1000000
MPUB_CHAN_FILL = 0.6
MPUB_CHAN_FIRST_RATE = 1000000.0
MPUB_CHAN_MIN_SEGMENT = 0.5  # seconds: shorter, and the tool's start-up weighs on the rate


def mpub_into_channel(b, tools, topic, seconds, rate=None):
    """MPUB into ``topic`` (created with one channel, ``ch``) for ``seconds``, all in memory.

    A run of 5 s at 400,000 msg/s would be 2,000,000 messages: twice the memory queue,
    and past it each message is a disk write, which is another phase.  So the load
    comes in segments, each sized to fill at most ``MPUB_CHAN_FILL`` of the memory
    queue at the last measured rate, and between them the channel is emptied
    (``/channel/empty``), unmeasured; memory stays below 1,000,000 messages.  A
    segment's CPU is read once the topic has handed everything to the channel (Go's
    topic pump may lag behind the publisher).

    Returns ``(messages, broker CPU seconds, messages spilled to disk, last rate)``.
    """
    b.http("POST", "/topic/create?topic=" + topic)
    b.http("POST", "/channel/create?topic=%s&channel=ch" % topic)
    done = sent = cpu = 0.0
    spilled = 0
    while seconds - done > 1e-6:
        longest = max(MPUB_CHAN_MIN_SEGMENT, MPUB_CHAN_FILL * MPUB_CHAN_MEM_QUEUE / (rate or MPUB_CHAN_FIRST_RATE))
        t = (seconds - done) / math.ceil((seconds - done) / longest - 1e-9)  # equal segments
        cpu0 = b.cpu_seconds()
        rate = tools.mpub(b.address, topic, t)
        stats = _wait_topic_drained(b, topic)
        cpu += b.cpu_seconds() - cpu0
        sent += rate * t
        done += t
        spilled += stats["backend_depth"] + sum(c["backend_depth"] for c in stats["channels"])
        b.http("POST", "/channel/empty?topic=%s&channel=ch" % topic)
    return sent, cpu, spilled, rate


def _wait_topic_drained(b, topic, timeout=60.0):
    """The topic's /stats once its own queue is empty (everything is in the channel)."""
    deadline = time.monotonic() + timeout
    while True:
        stats = b.stats(topic)
        if stats["depth"] == 0 or time.monotonic() > deadline:
            return stats
        time.sleep(0.01)  # polling /stats, bounded by the deadline


def run_phase(phase, kind, argv0, root, tools, a):
    """One phase on a fresh broker; returns {row name: value}.

    Every rate comes with ``NAME-cpu``: the broker's CPU time (user + system) per
    message, in microseconds; the round trip with the CPU per round trip.
    """
    runfor = a.runfor
    warmup = getattr(a, "warmup", 0.0)
    flags = []
    if phase == "pub-mem":
        flags = ["--mem-queue-size=100000000"]
    elif phase == "memory":
        flags = ["--mem-queue-size=%d" % (a.count + 10000)]
    elif phase == "mpub-chan":
        flags = ["--mem-queue-size=%d" % MPUB_CHAN_MEM_QUEUE]
    b = BrokerProc(kind, argv0, flags, root, http=phase == "mpub-chan")
    out = {}

    def timed(name, seconds, load, *args):
        """Run a throughput load; record its rate and the broker's CPU per message (us)."""
        cpu = b.cpu_seconds()
        rate = load(*args)
        cpu = b.cpu_seconds() - cpu
        out[name] = rate
        if rate:
            out[name + "-cpu"] = cpu / (rate * seconds) * 1e6
        return out

    try:
        if phase == "mpub":  # also consume, on the backlog mpub left
            if warmup:  # a backlog on another topic, drained by a channel made afterwards
                tools.mpub(b.address, "warm", warmup)
                tools.consume(b.address, "warm", "ch", warmup)
            timed("mpub", runfor, tools.mpub, b.address, "sub_bench", runfor)
            if "consume" in a.phases:
                timed("consume", runfor * 0.6, tools.consume, b.address, "sub_bench", "ch", runfor * 0.6)
            return out
        if phase == "mpub-chan":
            rate = None
            if warmup:  # on another topic, deleted afterwards: its messages do not add up
                rate = mpub_into_channel(b, tools, "warm", warmup)[3]
                b.http("POST", "/topic/delete?topic=warm")
            sent, cpu, spilled, _ = mpub_into_channel(b, tools, "mpub_chan", runfor, rate)
            out["mpub-chan"] = sent / runfor
            if sent:
                out["mpub-chan-cpu"] = cpu / sent * 1e6
            out["mpub-chan-spilled"] = spilled
            return out
        if phase in ("pub-mem", "pub-disk"):
            if warmup:
                tools.pub(b.address, "warm", warmup)
            return timed(phase, runfor, tools.pub, b.address, "pub_bench", runfor)
        if phase == "fanout":
            if warmup:
                tools.fanout(b.address, warmup, "warm")
            return timed("fanout", runfor, tools.fanout, b.address, runfor)
        if phase == "rtt":
            if warmup:  # round trips for about as long as the other phases' warm-up
                tools.rtt_p99(b.address, max(100, int(warmup * 4000)), "warm")
            cpu = b.cpu_seconds()
            out["rtt"] = tools.rtt_p99(b.address, a.rtt_count)
            out["rtt-cpu"] = (b.cpu_seconds() - cpu) / a.rtt_count * 1e6
            return out
        if phase == "memory":
            out["memory"] = memory.run(b.address, b.pid, a.count)[0]
            out["memory-consumer"] = memory.run(b.address, b.pid, a.count, topic="mem_consumed", consumer=True)[0]
            return out
    finally:
        b.stop()
    raise ValueError(phase)


ROWS = [  # name, label, unit, higher is better; each rate is followed by the broker's CPU per message
    ("mpub", "MPUB, batches of 200", "msg/s", True),
    ("mpub-cpu", "  CPU per message", "us", False),
    ("consume", "consume, RDY 2500, FIN each", "msg/s", True),
    ("consume-cpu", "  CPU per message", "us", False),
    ("mpub-chan", "MPUB, batches of 200, one channel, in memory", "msg/s", True),
    ("mpub-chan-cpu", "  CPU per message", "us", False),
    ("pub-mem", "single PUB, 2 conns, into memory", "msg/s", True),
    ("pub-mem-cpu", "  CPU per message", "us", False),
    ("pub-disk", "single PUB, 2 conns, spilling to disk", "msg/s", True),
    ("pub-disk-cpu", "  CPU per message", "us", False),
    ("rtt", "publish-to-delivery p99", "us", False),
    ("rtt-cpu", "  CPU per round trip", "us", False),
    ("fanout", "fan-out, 10 channels, delivered", "msg/s", True),
    ("fanout-cpu", "  CPU per delivered message", "us", False),
    ("memory", "RSS per queued 200 B message", "B", False),
    ("memory-consumer", "  in a channel with a consumer at RDY 0", "B", False),
]


def compare(a):
    go_nsqd = os.path.abspath(a.compare)
    if not os.access(go_nsqd, os.X_OK):
        raise SystemExit("not an executable: %s" % go_nsqd)
    tools = load_tools.choose(os.path.dirname(go_nsqd), a.our_tools)
    quiet = Quiet(max_load=a.max_load)
    if not quiet.start_is_quiet() and not a.allow_load:
        raise SystemExit("the machine is busy (1-minute load average %.2f > %.2f): figures would be noise.\n"
                         "Wait for a quiet machine, or pass --allow-load (rows measured busy are flagged LOADED)."
                         % (quiet.start_load, a.max_load))
    phases = [p for p in PHASES if p in a.phases and p != "consume"]
    if "consume" in a.phases and "mpub" not in phases:
        phases.insert(0, "mpub")  # consume drains what mpub wrote
    brokers = [("go", go_nsqd, None), ("ours", a.python, ROOT)]
    if a.baseline:  # another tree of this project (e.g. a checkout before a change): before/after
        brokers.insert(1, ("base", a.python, os.path.abspath(a.baseline)))
    if a.floor:
        brokers.append(("floor", a.python, None))
    samples = {kind: {} for kind, _, _ in brokers}
    loaded = set()  # row names with a sample measured on a busy machine
    for rnd in range(a.rounds):
        for phase in phases:
            order = brokers if rnd % 2 == 0 else brokers[::-1]
            for kind, argv0, root in order:
                if kind == "floor" and phase not in FLOOR_PHASES:
                    continue
                is_quiet = quiet.check()
                values = run_phase(phase, kind, argv0, root, tools, a)
                for name, v in values.items():
                    samples[kind].setdefault(name, []).append(v)
                    if not is_quiet:
                        loaded.add(name)
                load, others = quiet.readings[-1]
                print("round %d %-8s %-5s %s  (load %.2f, others %.2f cores%s)"
                      % (rnd + 1, phase, kind, " ".join("%s=%.4g" % kv for kv in values.items()), load, others,
                         "" if is_quiet else ", LOADED"), file=sys.stderr, flush=True)
    print_table(a, go_nsqd, tools, quiet, samples, loaded)


def print_table(a, go_nsqd, tools, quiet, samples, loaded):
    print("ours: %s (%s); Go: %s; load: %s; %d rounds of %g s after %g s of warm-up; %d cores"
          % (interpreter(a.python), a.python, go_nsqd, tools.name, a.rounds, a.runfor, a.warmup, os.cpu_count()))
    print("machine: %s" % quiet.summary())
    base, floor = bool(a.baseline), bool(a.floor)
    if base:
        print("baseline: %s" % os.path.abspath(a.baseline))
    head = ["", "unit", "Go nsqd (median)"]
    if base:
        head += ["baseline", "ratio"]
    head += ["ours (median)", "ratio"]
    if base:
        head.append("ours/baseline")
    if floor:
        head += ["floor", "ours/floor"]
    head += ["Go (all)"] + (["baseline (all)"] if base else []) + ["ours (all)"] + (["floor (all)"] if floor else [])
    head.append("")
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---:" if "median" in h or "ratio" in h or "/" in h or h in ("baseline", "floor")
                         else "---" for h in head) + "|")
    for name, label, unit, higher in ROWS:
        go, ours = samples["go"].get(name), samples["ours"].get(name)
        if not go or not ours:
            continue
        g, o = statistics.median(go), statistics.median(ours)
        cells = [label, unit, _fmt(g)]
        bs = samples.get("base", {}).get(name)
        fl = samples.get("floor", {}).get(name)
        if base:
            b = statistics.median(bs) if bs else None
            cells += [_fmt(b), _fmt_ratio(b, g, higher)] if bs else ["", ""]
        cells += [_fmt(o), _fmt_ratio(o, g, higher)]
        if base:
            cells.append(_fmt_ratio(o, b, higher) if bs else "")
        if floor:
            f = statistics.median(fl) if fl else None
            cells += [_fmt(f), _fmt_ratio(o, f, higher)] if fl else ["", ""]
        cells.append(", ".join(_fmt(x) for x in go))
        if base:
            cells.append(", ".join(_fmt(x) for x in bs or ()))
        cells.append(", ".join(_fmt(x) for x in ours))
        if floor:
            cells.append(", ".join(_fmt(x) for x in fl or ()))
        cells.append("LOADED" if name in loaded else "")
        print("| " + " | ".join(cells) + " |")
    print("(ratio: ours/Go for rates, Go/ours for latency, memory and CPU: above 1 means ours is better;"
          " ours/floor the same against the floor probe)")
    spills = [x for kind in samples.values() for x in kind.get("mpub-chan-spilled", ())]
    if any(spills):
        print("mpub-chan: messages spilled to disk past the memory queue (%s): those rows are not of memory alone"
              % ", ".join("%d" % x for x in spills))
    if loaded:
        print("LOADED: measured while other processes kept more than %.2f cores busy (or the run started with the"
              " load average above %.2f): not a result; re-measure on a quiet machine."
              % (quiet.max_others, quiet.max_load))


def _ratio(value, reference, higher):
    if not value or not reference:
        return float("nan")
    return value / reference if higher else reference / value


def _fmt_ratio(value, reference, higher):
    return "%.2f" % _ratio(value, reference, higher)


def _fmt(x):
    return "{:,.0f}".format(x) if abs(x) >= 100 else "%.2f" % x
