"""Run a broker with every Python and C-level call counted: the profile that ``scripts/bench work --calls`` reads.

    python scripts/benchmarks/calls.py OUT -m nsqd_threaded [FLAGS]     # our broker
    python scripts/benchmarks/calls.py OUT PATH/floor.py serve           # the floor probe

Every thread's calls are counted (``threading.setprofile``) by callee and calling
line: ``(file, function, caller:line)`` for a Python function, ``("C", name,
caller:line)`` for a builtin.  Commands come through the FIFO OUT + ``.ctl``, one line
each, read by a thread of its own (not counted; a daemon's main thread waits in
``sigwait``, so no signal handler could run): ``zero`` sets the counts to zero (a
load is about to start), ``dump`` writes them to OUT (one
``count<TAB>file<TAB>function<TAB>caller`` line each, most first) and then creates
OUT + ``.done``, so that the counts cover exactly a load's span.  The counting slows
the broker tenfold or more: counts, not times, are what it gives.
"""

import collections
import os
import runpy
import sys
import threading


def main():
    out = sys.argv[1]
    counts = collections.Counter()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep

    def where(frame):
        return "%s:%d" % (frame.f_code.co_name, frame.f_lineno) if frame is not None else "-"

    def profile(frame, event, arg):
        if event == "call":
            code = frame.f_code
            counts[(code.co_filename.replace(root, ""), code.co_name, where(frame.f_back))] += 1
        elif event == "c_call":
            counts[("C", getattr(arg, "__qualname__", repr(arg)), where(frame))] += 1

    def control():
        while True:
            with open(out + ".ctl") as commands:  # (blocks until the bench opens it to write)
                for command in commands:
                    if command.strip() == "zero":
                        counts.clear()
                    elif command.strip() == "dump":
                        snapshot = list(counts.items())  # (the other threads go on counting meanwhile)
                        with open(out, "w") as f:
                            for (path, name, caller), n in sorted(snapshot, key=lambda kv: -kv[1]):
                                f.write("%d\t%s\t%s\t%s\n" % (n, path, name, caller))
                        open(out + ".done", "w").close()

    os.mkfifo(out + ".ctl")
    # A daemon thread started before the profile is set (so not counted); it ends with the process.
    threading.Thread(target=control, name="calls-control", daemon=True).start()
    threading.setprofile(profile)
    sys.setprofile(profile)
    if sys.argv[2] == "-m":
        sys.argv = [sys.argv[3]] + sys.argv[4:]
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    else:
        sys.argv = sys.argv[2:]
        runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
