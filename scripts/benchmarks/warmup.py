"""How a broker's publish-to-delivery p99 falls with warm-up: ``scripts/bench warmup``.

    scripts/bench warmup --python PYPY_VENV/bin/python --go-tools GO_DIR [--seconds 0,2,5,10,20,40]

For each warm-up length, a fresh broker gets that many seconds of the round-trip load
(unmeasured; about 4,000 round trips per second), then ``--rtt-count`` timed round
trips: their p99, and the broker's CPU per round trip.  With a JIT (PyPy) the p99
falls as the hot paths get compiled; the length after which it stops falling is the
``--warmup`` to give ``scripts/bench --compare``.  Each length is measured ``--rounds``
times (medians), lengths interleaved.
"""

import argparse
import statistics
import sys

from . import ROOT, compare
from . import tools as load_tools
from .common import Quiet, interpreter


def main():
    ap = argparse.ArgumentParser(prog="scripts/bench warmup", description=__doc__.split("\n")[0])
    ap.add_argument("--python", default=sys.executable, help="interpreter that runs the broker")
    ap.add_argument("--go-tools", metavar="DIR", help="Go's rtt_probe from DIR (else this project's roundtrip)")
    ap.add_argument("--seconds", default="0,2,5,10,20,40", help="warm-up lengths, comma-separated")
    ap.add_argument("--rtt-count", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    tools = load_tools.choose(a.go_tools)
    lengths = [float(x) for x in a.seconds.split(",") if x]
    quiet = Quiet()
    samples = {w: [] for w in lengths}
    loaded = False
    for rnd in range(a.rounds):
        for w in lengths:
            loaded |= not quiet.check()
            args = argparse.Namespace(runfor=0, warmup=w, rtt_count=a.rtt_count, phases=["rtt"])
            out = compare.run_phase("rtt", "ours", a.python, ROOT, tools, args)
            samples[w].append((out["rtt"], out["rtt-cpu"]))
            print("round %d warm-up %gs: p99 %.0f us, %.1f us CPU per round trip"
                  % (rnd + 1, w, out["rtt"], out["rtt-cpu"]), file=sys.stderr, flush=True)
    print("broker: %s; load: %s; %d round trips after each warm-up; machine: %s"
          % (interpreter(a.python), tools.name, a.rtt_count, quiet.summary()))
    print("| warm-up | p99 (median) | p99 (all) | CPU per round trip (median) |")
    print("|---:|---:|---|---:|")
    for w in lengths:
        p99s = [p for p, _ in samples[w]]
        cpus = [c for _, c in samples[w]]
        print("| %g s | %.0f µs | %s | %.1f µs |" % (w, statistics.median(p99s), ", ".join("%.0f" % p for p in p99s),
                                                   statistics.median(cpus)))
    if loaded:
        print("LOADED: measured while other processes kept the machine busy: indicative only.")


if __name__ == "__main__":
    main()
