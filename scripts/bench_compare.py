#!/usr/bin/env python3
"""Go nsqd and ours side by side: ``scripts/bench --compare PATH_TO_GO_NSQD``.

Each phase runs on both brokers alternately (fresh data directory and
ephemeral 127.0.0.1 ports each time, the same flags for both, the first
broker alternating from round to round), for several rounds; the table shows
the median of each and the ratio ours / Go (Go / ours for latency and memory,
so that above 1 always means "ours is better").

The load comes from Go's own tools when they sit next to the Go nsqd
(bench_writer, bench_reader, pub_probe, rtt_probe: both brokers are driven by
the same client), from our scripts otherwise (``--our-tools`` forces them).

Phases (``--phases``, comma-separated):

========  ==================================================================
mpub      bench_writer: MPUB of 200 x 200 B, one connection per core, into a
          topic without channels (default flags: past 10,000 it is on disk)
consume   bench_reader, RDY 2500, FIN each: drains what mpub wrote, for 60 %
          of --runfor (so that neither broker runs dry)
pub-mem   single PUB, 2 connections, ``--mem-queue-size=100000000``
pub-disk  single PUB, 2 connections, default flags, a topic without channels
          (past 10,000 messages every PUB is a disk write)
rtt       publish one, wait for its delivery, FIN, repeat: p99
fanout    one topic, 10 channels, one consumer on each, a bench_writer
          publishing meanwhile: messages delivered per second, all channels
memory    RSS growth per queued 200 B message (``--mem-queue-size`` above it)
========  ==================================================================
"""

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timedelta, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import bench_memory  # noqa: E402
import bench_reader  # noqa: E402
import bench_roundtrip  # noqa: E402
import bench_writer  # noqa: E402

PHASES = ("mpub", "consume", "pub-mem", "pub-disk", "rtt", "fanout", "memory")
FANOUT_CHANNELS = 10


class BrokerProc:
    """One broker child process (Go's or ours) on an ephemeral port, in a fresh data dir."""

    def __init__(self, kind, argv0, flags, root=ROOT):
        self.kind = kind
        self.data = tempfile.mkdtemp(prefix="nsqd-compare-%s-" % kind)
        if kind == "go":
            cmd = [argv0]
            env = dict(os.environ)
        else:
            cmd = [argv0, "-m", "nsqd_threaded"]
            env = dict(os.environ, PYTHONPATH=root)
        cmd += ["--tcp-address=127.0.0.1:0", "--http-address=", "--data-path=" + self.data, "--log-level=warn"]
        # cwd: ``-m`` puts the working directory first on sys.path, ahead of PYTHONPATH,
        # so a baseline tree's broker must start there to import that tree's package.
        self.proc = subprocess.Popen(cmd + list(flags), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                                     cwd=root if kind != "go" else None)
        self._stderr = threading.Thread(target=self.proc.stderr.read, name="bench-stderr", daemon=True)
        self._stderr.start()
        deadline = time.monotonic() + 30
        self.address = None
        while self.address is None:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError("%s broker did not start" % kind)
            self.address = listening_address(self.proc.pid)
            if self.address is None:
                time.sleep(0.02)  # polling /proc for the listener, bounded by the deadline
        self.pid = self.proc.pid

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._stderr.join(10)
        shutil.rmtree(self.data, ignore_errors=True)


def cpu_seconds(pid):
    """User + system CPU time of a process so far, from /proc (clock-tick resolution)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def listening_address(pid):
    """The TCP port a process listens on, from /proc (no log parsing, any log level)."""
    try:
        inodes = set()
        for fd in os.listdir("/proc/%d/fd" % pid):
            try:
                link = os.readlink("/proc/%d/fd/%s" % (pid, fd))
            except OSError:
                continue
            m = re.match(r"socket:\[(\d+)\]", link)
            if m:
                inodes.add(m.group(1))
        with open("/proc/net/tcp") as f:
            for line in f.readlines()[1:]:
                parts = line.split()
                if parts[3] == "0A" and parts[9] in inodes:
                    return "127.0.0.1:%d" % int(parts[1].split(":")[1], 16)
    except OSError:
        return None
    return None


# -- load: Go's tools ---------------------------------------------------------

_OPS = re.compile(r"([0-9.]+)ops/s")
_UNITS = {"ns": 1e-3, "µs": 1.0, "us": 1.0, "ms": 1e3, "s": 1e6, "m": 60e6, "h": 3600e6}


def go_duration_us(text):
    """A Go time.Duration string (``2.776206ms``, ``1m2.5s``) in microseconds."""
    total = 0.0
    for value, unit in re.findall(r"([0-9.]+)(ns|µs|us|ms|s|m|h)", text):
        total += float(value) * _UNITS[unit]
    return total


def _run_tool(argv, env=None, timeout=300):
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    text = out.stdout + out.stderr
    if out.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (os.path.basename(argv[0]), out.returncode, text[-500:]))
    return text


def _ops(text):
    m = _OPS.findall(text)
    if not m:
        raise RuntimeError("no ops/s in: %s" % text[-300:])
    return float(m[-1])


def _go_deadline(seconds_ahead):
    """The bench tools' --deadline: a UTC wall-clock second far enough ahead for every process."""
    at = datetime.now(timezone.utc) + timedelta(seconds=seconds_ahead)
    return at.strftime("%Y-%m-%d %H:%M:%S")


class GoTools:
    name = "Go's bench_writer/bench_reader/pub_probe/rtt_probe"

    def __init__(self, directory):
        self.dir = directory

    @staticmethod
    def available(directory):
        return all(os.access(os.path.join(directory, t), os.X_OK)
                   for t in ("bench_writer", "bench_reader", "pub_probe", "rtt_probe"))

    def _tool(self, name):
        return os.path.join(self.dir, name)

    def mpub(self, address, topic, runfor):
        return _ops(_run_tool([self._tool("bench_writer"), "--nsqd-tcp-address=" + address, "--topic=" + topic,
                               "--size=200", "--batch-size=200", "--runfor=%gs" % runfor]))

    def consume(self, address, topic, channel, runfor, connections=None):
        env = dict(os.environ, GOMAXPROCS=str(connections)) if connections else None
        return _ops(_run_tool([self._tool("bench_reader"), "--nsqd-tcp-address=" + address, "--topic=" + topic,
                               "--channel=" + channel, "--size=200", "--rdy=2500", "--runfor=%gs" % runfor], env))

    def pub(self, address, topic, runfor):
        return _ops(_run_tool([self._tool("pub_probe"), "--nsqd-tcp-address=" + address, "--topic=" + topic,
                               "--size=200", "--workers=2", "--runfor=%gs" % runfor]))

    def rtt_p99(self, address, count):
        text = _run_tool([self._tool("rtt_probe"), "--nsqd-tcp-address=" + address, "--topic=rtt",
                          "--channel=rtt", "--n=%d" % count, "--size=200"])
        m = re.search(r"p99=(\S+)", text)
        if not m:
            raise RuntimeError("no p99 in: %s" % text[-300:])
        return go_duration_us(m.group(1))

    def fanout(self, address, runfor):
        """A writer and one single-connection reader per channel, all started at one deadline."""
        deadline = _go_deadline(3)
        env1 = dict(os.environ, GOMAXPROCS="1")
        readers = [
            subprocess.Popen([self._tool("bench_reader"), "--nsqd-tcp-address=" + address, "--topic=fan",
                              "--channel=ch%d" % i, "--size=200", "--rdy=2500", "--runfor=%gs" % runfor,
                              "--deadline=" + deadline],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env1)
            for i in range(FANOUT_CHANNELS)
        ]
        writer = subprocess.Popen([self._tool("bench_writer"), "--nsqd-tcp-address=" + address, "--topic=fan",
                                   "--size=200", "--batch-size=200", "--runfor=%gs" % runfor,
                                   "--deadline=" + deadline],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        total = sum(_ops(r.communicate(timeout=runfor + 120)[0]) for r in readers)
        writer.communicate(timeout=runfor + 120)
        return total


class OurTools:
    name = "this project's scripts (bench_writer.py, bench_reader.py, bench_roundtrip.py)"

    def mpub(self, address, topic, runfor):
        return bench_writer.run(address, topic, 200, 200, runfor)[0]

    def consume(self, address, topic, channel, runfor, connections=None):
        return bench_reader.run(address, topic, channel, 2500, runfor, connections)[0]

    def pub(self, address, topic, runfor):
        return bench_writer.run(address, topic, 200, 1, runfor, 2)[0]

    def rtt_p99(self, address, count):
        return bench_roundtrip.run(address, "rtt", count)["p99_us"]

    def fanout(self, address, runfor):
        rates = [0.0] * FANOUT_CHANNELS

        def reader(i):
            rates[i] = bench_reader.run(address, "fan", "ch%d" % i, 2500, runfor, 1)[0]

        threads = [threading.Thread(target=reader, args=(i,), name="fanout-reader-%d" % i)
                   for i in range(FANOUT_CHANNELS)]
        for t in threads:
            t.start()
        bench_writer.run(address, "fan", 200, 200, runfor)
        for t in threads:
            t.join()
        return sum(rates)


# -- the comparison -----------------------------------------------------------

def run_phase(phase, kind, argv0, root, tools, a):
    """One phase on a fresh broker; returns {row name: value}."""
    runfor = a.runfor
    flags = []
    if phase == "pub-mem":
        flags = ["--mem-queue-size=100000000"]
    elif phase == "memory":
        flags = ["--mem-queue-size=%d" % (a.count + 10000)]
    b = BrokerProc(kind, argv0, flags, root)
    out = {}

    def timed(name, seconds, load, *args):
        """Run a throughput load; record its rate and the broker's CPU per message (us)."""
        cpu = cpu_seconds(b.pid)
        rate = load(*args)
        cpu = cpu_seconds(b.pid) - cpu
        out[name] = rate
        if rate:
            out[name + "-cpu"] = cpu / (rate * seconds) * 1e6
        return out

    try:
        if phase == "mpub":  # also consume, on the backlog mpub left
            timed("mpub", runfor, tools.mpub, b.address, "sub_bench", runfor)
            if "consume" in a.phases:
                timed("consume", runfor * 0.6, tools.consume, b.address, "sub_bench", "ch", runfor * 0.6)
            return out
        if phase in ("pub-mem", "pub-disk"):
            return timed(phase, runfor, tools.pub, b.address, "pub_bench", runfor)
        if phase == "fanout":
            return timed("fanout", runfor, tools.fanout, b.address, runfor)
        if phase == "rtt":
            return {"rtt": tools.rtt_p99(b.address, a.rtt_count)}
        if phase == "memory":
            return {"memory": bench_memory.run(b.address, b.pid, a.count)[0]}
    finally:
        b.stop()
    raise ValueError(phase)


ROWS = [  # name, label, unit, higher is better
    ("mpub", "MPUB, batches of 200", "msg/s", True),
    ("consume", "consume, RDY 2500, FIN each", "msg/s", True),
    ("pub-mem", "single PUB, 2 conns, into memory", "msg/s", True),
    ("pub-disk", "single PUB, 2 conns, spilling to disk", "msg/s", True),
    ("rtt", "publish-to-delivery p99", "us", False),
    ("fanout", "fan-out, 10 channels, delivered", "msg/s", True),
    ("memory", "RSS per queued 200 B message", "B", False),
    # The broker's CPU time (user + system) per message: steadier than rates on a busy machine.
    ("mpub-cpu", "CPU per message: MPUB", "us", False),
    ("consume-cpu", "CPU per message: consume", "us", False),
    ("pub-mem-cpu", "CPU per message: PUB into memory", "us", False),
    ("pub-disk-cpu", "CPU per message: PUB spilling", "us", False),
    ("fanout-cpu", "CPU per delivered message: fan-out", "us", False),
]


def compare(a):
    go_nsqd = os.path.abspath(a.compare)
    if not os.access(go_nsqd, os.X_OK):
        raise SystemExit("not an executable: %s" % go_nsqd)
    go_dir = os.path.dirname(go_nsqd)
    tools = OurTools() if a.our_tools or not GoTools.available(go_dir) else GoTools(go_dir)
    phases = [p for p in PHASES if p in a.phases and p != "consume"]
    if "consume" in a.phases and "mpub" not in phases:
        phases.insert(0, "mpub")  # consume drains what mpub wrote
    samples = {"go": {}, "ours": {}, "base": {}}
    brokers = [("go", go_nsqd, None), ("ours", a.python, ROOT)]
    if a.baseline:  # another tree of this project (e.g. a checkout before a change): before/after
        brokers.insert(1, ("base", a.python, os.path.abspath(a.baseline)))
    for rnd in range(a.rounds):
        for phase in phases:
            order = brokers if rnd % 2 == 0 else brokers[::-1]
            for kind, argv0, root in order:
                values = run_phase(phase, kind, argv0, root, tools, a)
                for name, v in values.items():
                    samples[kind].setdefault(name, []).append(v)
                print("round %d %-8s %-4s %s" % (rnd + 1, phase, kind,
                      " ".join("%s=%.4g" % kv for kv in values.items())), file=sys.stderr, flush=True)
    impl = subprocess.run([a.python, "-c", "import sys,platform;print(platform.python_implementation(), "
                           "platform.python_version())"], capture_output=True, text=True).stdout.strip()
    print("ours: %s (%s); Go: %s; load: %s; %d rounds of %g s; %d cores; load average %.2f"
          % (impl, a.python, go_nsqd, tools.name, a.rounds, a.runfor, os.cpu_count(), os.getloadavg()[0]))
    base = bool(a.baseline)
    if base:
        print("baseline: %s" % os.path.abspath(a.baseline))
    print("| | unit | Go nsqd (median) |%s ours (median) | ratio |%s Go (all) |%s ours (all) |"
          % ((" baseline | ratio |", " ours/baseline |", " baseline (all) |") if base else ("", "", "")))
    print("|---|---|---:|%s---:|---:|%s---|%s---|" % (("---:|---:|", "---:|", "---|") if base else ("", "", "")))
    for name, label, unit, higher in ROWS:
        go, ours = samples["go"].get(name), samples["ours"].get(name)
        if not go or not ours:
            continue
        g, o = statistics.median(go), statistics.median(ours)
        ratio = _ratio(o, g, higher)
        cells = [label, unit, _fmt(g)]
        bs = samples["base"].get(name)
        if base and bs:
            b = statistics.median(bs)
            cells += [_fmt(b), "%.2f" % _ratio(b, g, higher)]
        cells += [_fmt(o), "%.2f" % ratio]
        if base and bs:
            cells.append("%.2f" % _ratio(o, b, higher))
        cells.append(", ".join(_fmt(x) for x in go))
        if base and bs:
            cells.append(", ".join(_fmt(x) for x in bs))
        cells.append(", ".join(_fmt(x) for x in ours))
        print("| " + " | ".join(cells) + " |")
    print("(ratio: ours/Go for rates, Go/ours for latency and memory: above 1 means ours is better)")


def _ratio(value, reference, higher):
    if not value or not reference:
        return float("nan")
    return value / reference if higher else reference / value


def _fmt(x):
    return "{:,.0f}".format(x) if abs(x) >= 100 else "%.2f" % x


if __name__ == "__main__":  # the same as scripts/bench --compare GO_NSQD ...
    import bench

    sys.argv[1:1] = ["--compare"]
    bench.main()
