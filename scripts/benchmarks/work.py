"""The message path's own work, in units that travel between hosts: ``scripts/bench work``.

    scripts/bench work [--go GO_DIR] [--python PY] [--pubs 5000] [--round-trips 2000] [--rounds 3]
                       [--no-instructions] [--baseline TREE]

For our broker, the floor probe (``floor.py``) and, with ``--go``, Go's nsqd, each in a
fresh process: a fixed number of single PUBs over two connections (each waits for its
``OK``: Go's pub_probe's shape), then, in another fresh process, a fixed number of
publish-to-delivery round trips (PUB, MESSAGE, FIN, one at a time).  Each load first
opens its connections and sends a warm-up; the broker's work is counted from then until
its last answer, before the connections close: the process's start and stop (ours and
Go's write their in-memory messages to disk at exit) and the connections' are not in it.

* **CPU** (``/proc/PID/task/*/schedstat``) and **voluntary context switches**
  (``/proc/PID/task/*/status``), summed over the broker's threads, per message: the median of
  ``--rounds`` runs in alternating order;
* **instructions** per message: the same loads once more with the broker under
  ``valgrind --tool=callgrind``, counters zeroed and dumped with ``callgrind_control``
  around the load (an instruction count is the same for the same binary and inputs,
  whatever else the machine is doing); ours and the floor only (Go's runtime crashes
  under valgrind 3.19).

CPU time depends on the host's clock and caches; instructions and context switches do
not, so a change is judged by those first.  The table shows each figure and ours / floor.
"""

import argparse
import os
import re
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

from . import ROOT, roundtrip
from .common import Quiet, interpreter, listening_address

TOPIC_FLAGS = ["--mem-queue-size=100000000"]  # every PUB stays in memory (as the pub-mem phase)


class Counters:
    """A broker process's counters at one instant, summed over its threads (none starts or ends
    while a load runs: the connections are open before and closed after): CPU seconds
    (``/proc/PID/task/TID/schedstat``, in nanoseconds) and voluntary context switches."""

    def __init__(self, pid):
        self.cpu = 0.0
        self.switches = 0
        for tid in os.listdir("/proc/%d/task" % pid):
            try:
                with open("/proc/%d/task/%s/schedstat" % (pid, tid)) as f:
                    cpu_ns = int(f.read().split()[0])
                with open("/proc/%d/task/%s/status" % (pid, tid)) as f:
                    switches = next(int(line.split()[1]) for line in f
                                    if line.startswith("voluntary_ctxt_switches:"))
            except OSError:  # the thread ended meanwhile
                continue
            self.cpu += cpu_ns / 1e9
            self.switches += switches


def broker_command(kind, argv0, root, data):
    """The argv, environment and working directory that start ``kind`` (``ours``, ``floor`` or ``go``)."""
    env = dict(os.environ)
    if kind == "floor":
        return [argv0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "floor.py"), "serve"], env, None
    if kind == "go":
        cmd, cwd = [os.path.join(argv0, "nsqd")], None
    else:
        # -m puts the working directory first on sys.path: the tree's own package
        cmd, cwd = [argv0, "-m", "nsqd_threaded"], root
        env["PYTHONPATH"] = root
    cmd += ["--tcp-address=127.0.0.1:0", "--http-address=", "--data-path=" + data, "--log-level=warn"]
    return cmd + TOPIC_FLAGS, env, cwd


def run_broker(kind, argv0, root, load, count, callgrind=None, calls=None):
    """Start a broker, run ``load`` (``count`` messages) against it, stop it.

    Returns per-message ``(cpu_us, switches)``, or ``instructions`` under callgrind (``callgrind``:
    where to keep its profile of the load, for ``callgrind_annotate``), or with ``calls`` (where to
    write them) the Python and C-level calls counted by ``calls.py``, as ``{(file, function,
    caller): calls per message}``;
    counted from after ``load.open`` (connections made, a warm-up sent) to before
    ``load.close``, so neither the process's start and stop nor the connections' are in it.
    """
    data = tempfile.mkdtemp(prefix="nsqd-work-%s-" % kind)
    out = os.path.join(data, "callgrind.out")
    cmd, env, cwd = broker_command(kind, argv0, root, data)
    if calls:
        cmd = cmd[:1] + [os.path.join(os.path.dirname(os.path.abspath(__file__)), "calls.py"), calls] + cmd[1:]
    if callgrind:
        # the interpreter itself, not a shim that execs it (valgrind would follow the shim only)
        # (names uncompressed: the dumped part must be readable by callgrind_annotate on its own)
        cmd = ["valgrind", "--tool=callgrind", "--compress-strings=no", "--callgrind-out-file=" + out,
               os.path.realpath(cmd[0])] + cmd[1:]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=cwd)
    try:
        deadline = time.monotonic() + (300 if callgrind else 30)
        address = None
        while address is None:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("%s broker did not start" % kind)
            address = listening_address(proc.pid)
            if address is None:
                time.sleep(0.05)  # polling /proc for the listener, bounded by the deadline
        # What starts and ends the count around the load: the call counter's, callgrind's, or
        # two readings of the process's counters.
        if calls:
            start, end = (lambda: count_calls(calls, "zero")), (lambda: count_calls(calls, "dump"))
        elif callgrind:
            start, end = (lambda: control(proc.pid, "--zero")), (lambda: control(proc.pid, "--dump"))
        else:
            start = end = lambda: Counters(proc.pid)
        session = load(address)
        try:
            before = start()
            session.run(count)
            after = end()
        finally:
            session.close()
        proc.terminate()
        try:
            proc.wait(300)
        except subprocess.TimeoutExpired:
            # the counts were dumped above: a broker slow to stop costs its exit, not the figure
            print("%s broker did not stop within 300 s of SIGTERM; killed" % kind, file=sys.stderr)
            proc.kill()
        if calls:
            per = {}
            with open(calls) as f:
                for line in f:
                    n, path, name, caller = line.rstrip("\n").split("\t")
                    per[(path, name, caller)] = int(n) / count
            return per
        if callgrind:
            shutil.copy(out + ".1", callgrind)
            with open(out + ".1") as f:
                return int(re.search(r"^summary: (\d+)", f.read(), re.M).group(1)) / count
        return (after.cpu - before.cpu) / count * 1e6, (after.switches - before.switches) / count
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(data, ignore_errors=True)


def count_calls(out, command):
    """``zero`` or ``dump`` to a broker under ``calls.py`` (writing OUT), waiting for a dump."""
    with open(out + ".ctl", "w") as f:
        f.write(command + "\n")
    if command == "dump":
        deadline = time.monotonic() + 120
        while not os.path.exists(out + ".done"):
            if time.monotonic() > deadline:
                raise RuntimeError("the broker wrote no call counts")
            time.sleep(0.05)  # polling for the file the dump ends with, bounded by the deadline


def control(pid, command):
    """``callgrind_control --zero`` (counters to 0) or ``--dump`` (write them out) for a process."""
    subprocess.run(["callgrind_control", command, str(pid)], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=120)


class Publishers:
    """Single PUBs over two connections, each waiting for its OK (Go's pub_probe's shape)."""

    WARM_UP = 100
    OK = b"\x00\x00\x00\x06\x00\x00\x00\x00OK"

    def __init__(self, address, connections=2, size=200):
        host, port = address.rsplit(":", 1)
        self.cmd = b"PUB work_pub\n" + struct.pack(">i", size) + b"p" * size
        self.socks = []
        for _ in range(connections):
            sock = socket.create_connection((host, int(port)))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(b"  V2")
            self.socks.append(sock)
        self.run(self.WARM_UP * connections)

    def _publish(self, sock, n, errors):
        try:
            for _ in range(n):
                sock.sendall(self.cmd)
                got = b""
                while len(got) < 10:
                    chunk = sock.recv(10 - len(got))
                    if not chunk:
                        raise EOFError("the broker closed the connection")
                    got += chunk
                if got != self.OK:
                    raise RuntimeError("PUB answered %r" % got)
        except Exception as e:  # raised again by run()
            errors.append(e)

    def run(self, count):
        errors = []
        k = len(self.socks)
        threads = [threading.Thread(target=self._publish, args=(sock, count // k + (i < count % k), errors),
                                    name="work-pub-%d" % i) for i, sock in enumerate(self.socks)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    def close(self):
        for sock in self.socks:
            sock.close()


class RoundTrips:
    """Publish one, receive it, FIN it, one at a time (roundtrip.Session)."""

    def __init__(self, address):
        self.session = roundtrip.Session(address, "work_rtt")
        self.session.round_trips(100)  # warm-up

    def run(self, count):
        self.session.round_trips(count)

    def close(self):
        self.session.close()


def measure(brokers, pubs, rtts, rounds, instructions, keep):
    """{kind: {figure: per-message value}} for each ``(kind, argv0, root)`` broker."""
    loads = {"pub": (Publishers, pubs), "rtt": (RoundTrips, rtts)}
    runs = {kind: {"pub": [], "rtt": []} for kind, _, _ in brokers}
    for rnd in range(rounds):
        for kind, argv0, root in (brokers if rnd % 2 == 0 else brokers[::-1]):
            for name, (load, n) in loads.items():
                runs[kind][name].append(run_broker(kind, argv0, root, load, n))
            print("round %d %-5s done" % (rnd + 1, kind), file=sys.stderr, flush=True)
    figures = {}
    for kind, argv0, root in brokers:
        f = figures[kind] = {}
        for name, (load, n) in loads.items():
            if runs[kind][name]:
                f[name + " cpu_us"] = statistics.median(r[0] for r in runs[kind][name])
                f[name + " switches"] = statistics.median(r[1] for r in runs[kind][name])
            if instructions and kind != "go":  # Go's runtime does not run under valgrind 3.19
                profile = os.path.join(keep, "callgrind.%s.%s" % (kind, name))
                f[name + " instructions"] = run_broker(kind, argv0, root, load, n, callgrind=profile)
        if instructions and kind != "go":
            print("%-5s counted under callgrind" % kind, file=sys.stderr, flush=True)
    return figures


def call_profiles(brokers, pubs, rtts, top):
    """Print, per load, the Python and C-level calls per message of ours and the floor, and
    ours' ``top`` callees (``calls.py``: counts, which do not depend on the host either)."""
    loads = {"PUB": (Publishers, pubs), "round trip": (RoundTrips, rtts)}
    for name, (load, n) in loads.items():
        profiles = {}
        for kind, argv0, root in brokers:
            if kind == "go":
                continue
            data = tempfile.mkdtemp(prefix="nsqd-work-calls-")
            try:
                profiles[kind] = run_broker(kind, argv0, root, load, n, calls=os.path.join(data, "calls"))
            finally:
                shutil.rmtree(data, ignore_errors=True)
        print("\ncalls per %s (Python functions / C-level builtins):" % name)
        for kind, per in profiles.items():
            py = sum(v for k, v in per.items() if k[0] != "C")
            c = sum(v for k, v in per.items() if k[0] == "C")
            print("  %-6s %6.1f / %6.1f" % (kind, py, c))
        for kind in ("ours", "base"):
            if kind not in profiles:
                continue
            print("  %s, the callees called at least 0.05 times per %s (most first, top %d):" % (kind, name, top))
            ranked = sorted(profiles[kind].items(), key=lambda kv: -kv[1])
            for (path, fn, caller), v in [kv for kv in ranked if kv[1] >= 0.05][:top]:
                print("  %6.2f  %s %s  <- %s" % (v, "" if path == "C" else path + ":", fn, caller))


ROWS = (
    ("pub cpu_us", "CPU per single PUB (us)", "%.1f"),
    ("pub switches", "voluntary context switches per PUB", "%.2f"),
    ("pub instructions", "instructions per PUB", "%.0f"),
    ("rtt cpu_us", "CPU per round trip (us)", "%.1f"),
    ("rtt switches", "voluntary context switches per round trip", "%.2f"),
    ("rtt instructions", "instructions per round trip", "%.0f"),
)


def main():
    ap = argparse.ArgumentParser(prog="scripts/bench work", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default=sys.executable, help="interpreter for our broker and the floor probe")
    ap.add_argument("--go", metavar="DIR", help="also Go's nsqd from DIR (e.g. ../shared/reference/go-nsq-1.3.0)")
    ap.add_argument("--baseline", metavar="TREE", help="also this project's broker from another tree")
    ap.add_argument("--pubs", type=int, default=5000)
    ap.add_argument("--round-trips", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3, help="native rounds (0: instructions only)")
    ap.add_argument("--no-instructions", action="store_true", help="skip the callgrind runs")
    ap.add_argument("--calls", type=int, metavar="TOP", default=0,
                    help="also count the calls per message (benchmarks/calls.py) and list ours' TOP callees")
    ap.add_argument("--profiles", metavar="DIR", default=".",
                    help="where the callgrind profiles of the loads go (callgrind.KIND.LOAD; callgrind_annotate "
                         "reads them): the current directory by default")
    a = ap.parse_args()
    if not a.no_instructions and shutil.which("valgrind") is None:
        ap.error("valgrind is not installed (apt-get install -y valgrind), or pass --no-instructions")
    quiet = Quiet()
    brokers = []
    if a.go:
        brokers.append(("go", os.path.abspath(a.go), None))
    brokers.append(("floor", a.python, None))
    brokers.append(("ours", a.python, ROOT))
    if a.baseline:
        brokers.append(("base", a.python, os.path.abspath(a.baseline)))
    os.makedirs(a.profiles, exist_ok=True)
    figures = measure(brokers, a.pubs, a.round_trips, a.rounds, not a.no_instructions, a.profiles)
    print("ours and the floor under %s; %d PUBs over 2 connections, %d round trips; median of %d rounds;"
          % (interpreter(a.python), a.pubs, a.round_trips, a.rounds))
    print("load average %.2f at the start, %.2f at the end (CPU and switches; instructions do not depend on it)"
          % (quiet.start_load, os.getloadavg()[0]))
    kinds = [k for k, _, _ in brokers]
    names = {"go": "Go nsqd", "floor": "floor", "ours": "ours", "base": "baseline"}
    print("| per message | " + " | ".join(names[k] for k in kinds) + " | ours / floor |")
    print("|---|" + "---:|" * (len(kinds) + 1))
    for key, label, fmt in ROWS:
        if key not in figures["ours"]:
            continue
        cells = [fmt % figures[k][key] if key in figures[k] else "-" for k in kinds]
        floor = figures["floor"][key]
        ratio = "%.2f" % (figures["ours"][key] / floor) if floor > 0 else "-"
        print("| %s | %s | %s |" % (label, " | ".join(cells), ratio))
    if a.calls:
        call_profiles(brokers, min(a.pubs, 5000), min(a.round_trips, 2000), a.calls)


if __name__ == "__main__":
    main()
