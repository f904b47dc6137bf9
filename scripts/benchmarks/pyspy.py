"""Where a broker's CPU goes under the single-PUB load, against the floor probe's: ``scripts/bench pyspy``.

    scripts/bench pyspy --go-tools GO_DIR [--seconds 8] [--out DIR]

Starts our broker (``--mem-queue-size=100000000``, as the pub-mem phase; default flags,
as the pub-disk phase, with ``--spilling``) and then the
floor probe, drives each with the single-PUB load (Go's ``pub_probe --workers 2``,
else this project's writer), and samples it with ``py-spy record -r 500 -f raw``
(``pip install py-spy``) for ``--seconds`` after a second of load.  Prints each
one's CPU per PUB and the functions with the largest shares of the samples: self
(the function's own code) and inclusive (with what it calls).  The raw profiles
(collapsed stacks, one line per distinct stack) stay in ``--out``.
"""

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from . import ROOT
from . import tools as load_tools
from .common import BrokerProc


def profile(kind, argv0, flags, tools, seconds, out_path, pyspy, extra=()):
    """Run the PUB load on a fresh broker while py-spy samples it; its CPU per PUB (us)."""
    with BrokerProc(kind, argv0, flags, ROOT if kind == "ours" else None) as b:
        result = {}

        def load():
            result["rate"] = tools.pub(b.address, "pub_bench", seconds + 2)

        loader = threading.Thread(target=load, name="pyspy-load")
        loader.start()
        time.sleep(1.0)  # let the load start (and the connections settle) before sampling
        cpu = b.cpu_seconds()
        switches = context_switches(b.pid)
        t0 = time.monotonic()
        subprocess.run([pyspy, "record", "-r", "500", "-f", "raw", "-o", out_path, "-d", "%d" % seconds,
                        "--pid", str(b.pid), *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       check=True, timeout=seconds + 60)
        cpu = b.cpu_seconds() - cpu
        switches = context_switches(b.pid) - switches
        elapsed = time.monotonic() - t0
        loader.join()
    rate = result.get("rate") or 0.0
    if not rate:
        return rate, float("nan"), float("nan")
    return rate, cpu / (rate * elapsed) * 1e6, switches / (rate * elapsed)


def context_switches(pid):
    """Voluntary + involuntary context switches of every thread of a process so far."""
    total = 0
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/status" % (pid, tid)) as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        total += int(line.split()[1])
        except OSError:
            continue  # the thread ended
    return total


def shares(path):
    """``(self, inclusive, total)`` sample counts per function from a collapsed-stack file."""
    own, inclusive = collections.Counter(), collections.Counter()
    total = 0
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            n = int(count)
            total += n
            frames = [_name(fr) for fr in stack.split(";")]
            if frames:
                own[frames[-1]] += n
            for fr in set(frames[1:]):  # the thread's own frame (the first) is everything
                inclusive[fr] += n
    return own, inclusive, total


def _name(frame):
    """``function (path/to/module.py:line)`` -> ``function (module.py)``."""
    name, _, where = frame.partition(" (")
    return "%s (%s)" % (name, os.path.basename(where.split(":")[0])) if where else name


def main():
    ap = argparse.ArgumentParser(prog="scripts/bench pyspy", description=__doc__.split("\n")[0])
    ap.add_argument("--python", default=sys.executable, help="interpreter that runs the broker and the floor")
    ap.add_argument("--go-tools", metavar="DIR", help="Go's pub_probe from DIR (else this project's writer)")
    ap.add_argument("--seconds", type=int, default=8)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--gil", action="store_true",
                    help="only samples of the thread holding the GIL (the Python work; without it, a thread "
                         "waiting to take the GIL back after a recv or send counts in that call)")
    ap.add_argument("--nonblocking", action="store_true",
                    help="sample without pausing the broker (faster, but some stacks come out torn)")
    ap.add_argument("--out", help="directory for the raw profiles (default: a temporary one, removed)")
    ap.add_argument("--spilling", action="store_true",
                    help="our broker with default flags, as the pub-disk phase (the topic spills to its disk queue)")
    a = ap.parse_args()
    pyspy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.access(pyspy, os.X_OK):
        raise SystemExit("py-spy not found: pip install py-spy")
    tools = load_tools.choose(a.go_tools)
    out = a.out or tempfile.mkdtemp(prefix="bench-pyspy-")
    os.makedirs(out, exist_ok=True)
    try:
        ours_flags = [] if a.spilling else ["--mem-queue-size=100000000"]
        for kind, flags in (("ours", ours_flags), ("floor", [])):
            path = os.path.join(out, "%s.txt" % kind)
            extra = (["--gil"] if a.gil else []) + (["--nonblocking"] if a.nonblocking else [])
            rate, cpu, switches = profile(kind, a.python, flags, tools, a.seconds, path, pyspy, extra)
            own, inclusive, total = shares(path)
            print("\n%s: %.0f PUB/s, %.1f us CPU per PUB, %.2f context switches per PUB, %d samples (%.1f us of"
                  " samples per PUB at 500 Hz) (%s)" % (kind, rate, cpu, switches, total,
                                                        total / 500.0 / a.seconds / rate * 1e6, path))
            print("%-70s %7s %7s" % ("function", "self", "incl."))
            for name, _ in inclusive.most_common(a.top):
                print("%-70s %6.1f%% %6.1f%%" % (name[:70], 100.0 * own[name] / total, 100.0 * inclusive[name] / total))
    finally:
        if not a.out:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
