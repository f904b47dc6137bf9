"""The command line: ``faults.py --scenario ...`` runs scenarios; ``faults.py _<mode> ...`` (what the
harness itself starts inside a host) runs one client mode."""

import argparse
import json
import os
import signal
import sys

from . import __doc__ as DESCRIPTION
from .clients import client_consumer, client_http, client_producer, client_pynsq_consumer, client_watch
from .network import can_make_namespaces, clean_stale
from .proxy import client_proxy
from .report import fmt_cell, report
from .runner import Runner
from .scenarios import ORDER, SCENARIOS


def main_cli(argv=None):
    parser = argparse.ArgumentParser(description=DESCRIPTION.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", action="append", default=[],
                        help="one of %s, or all (repeatable)" % ", ".join(ORDER))
    parser.add_argument("--short", action="store_true", help="the short variants (seconds, not minutes)")
    parser.add_argument("--go", metavar="DIR", help="also run Go's nsqd and nsqlookupd from DIR")
    parser.add_argument("--no-ours", action="store_true", help="only Go's")
    parser.add_argument("--minutes", type=float, help="the soak's length")
    parser.add_argument("--report", action="store_true", help="print a markdown table at the end")
    parser.add_argument("--json", metavar="FILE", help="write every result to FILE")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, histories)")
    parser.add_argument("--clean-stale", action="store_true",
                        help="remove the namespaces of earlier runs whose process is gone (a SIGKILLed run), then exit")
    args = parser.parse_args(argv)
    if args.clean_stale:
        for name in clean_stale():
            print("removed", name)
        return 0
    scenarios = ORDER if "all" in args.scenario else args.scenario
    for s in scenarios:
        if s not in SCENARIOS:
            parser.error("no scenario %r" % s)
    if not scenarios:
        parser.error("give --scenario")
    ok, why = can_make_namespaces()
    if not ok:
        print("cannot make network namespaces: %s" % why, file=sys.stderr)
        return 2
    runner = Runner(keep=args.keep)

    def on_signal(signum, frame):
        raise KeyboardInterrupt("signal %d" % signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    impls = ([] if args.no_ours else ["ours"]) + (["go"] if args.go else [])
    results = {}
    try:
        for scenario in scenarios:
            for impl in impls:
                try:
                    r = runner.run(scenario, impl, os.path.abspath(args.go) if args.go else None, args.short,
                                   args.minutes)
                except KeyboardInterrupt:
                    raise
                except Exception as e:  # noqa: BLE001 - one scenario's failure is reported, the rest run
                    r = {"error": repr(e)}
                results.setdefault(scenario, {})[impl] = r
                print("  %s %s: %s" % (scenario, impl, fmt_cell(r)), flush=True)
    finally:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
        if args.keep:
            print("work directory:", runner.root)
        runner.close()
    if args.report:
        print()
        print(report(results))
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    modes = {"_producer": client_producer, "_consumer": client_consumer, "_watch": client_watch,
             "_http": client_http, "_proxy": client_proxy, "_pynsq_consumer": client_pynsq_consumer}
    if argv and argv[0] in modes:
        p = argparse.ArgumentParser(prog="faults.py " + argv[0])
        p.add_argument("--history")
        p.add_argument("--nsqd", default="")
        p.add_argument("--lookupd", default="")
        p.add_argument("--count", type=int, default=1000)
        p.add_argument("--rate", type=float, default=100)
        p.add_argument("--window", type=int, default=4)
        p.add_argument("--timeout", type=float, default=5.0)
        p.add_argument("--heartbeat-ms", type=int, default=1000)
        p.add_argument("--dpub-every", type=int, default=0)
        p.add_argument("--name", default="c")
        p.add_argument("--poll", type=float, default=1.0)
        p.add_argument("--max-in-flight", type=int, default=10)
        p.add_argument("--work-ms", type=float, default=0)
        p.add_argument("--concurrency", type=int, default=4)
        p.add_argument("--req-every", type=int, default=0)
        p.add_argument("--url")
        p.add_argument("--interval", type=float, default=0.1)
        p.add_argument("--method", default="GET")
        p.add_argument("--data")
        p.add_argument("--wait", type=float, default=10)
        p.add_argument("--retry-http-errors", action="store_true")
        p.add_argument("--repeat", type=int, default=0)
        p.add_argument("--listen")
        p.add_argument("--target")
        p.add_argument("--delay-ms", type=float, default=0)
        p.add_argument("--jitter-ms", type=float, default=0)
        p.add_argument("--loss", type=float, default=0)
        p.add_argument("--rto-ms", type=float, default=200)
        p.add_argument("--seed", type=int, default=None)
        p.add_argument("--bandwidth-kbps", type=float, default=0)
        return modes[argv[0]](p.parse_args(argv[1:]))
    return main_cli(argv)
