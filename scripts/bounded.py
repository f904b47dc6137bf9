"""Run one test job with bounds, so that a hang is a failure with a name and never a silent wait.

    python3 scripts/bounded.py --name NAME --budget SECONDS [--after-summary SECONDS] -- COMMAND...

COMMAND (a pytest, or a coverage run of one) runs in a session of its own, its output passed through
line by line.  It is stopped when either bound is passed:

* ``--after-summary`` (default 60 s): pytest printed its summary line (``=== 3 passed in 2.1s ===``)
  and has not exited since.  What keeps a finished pytest alive is a thread that was never joined
  (the interpreter's shutdown waits for every non-daemon thread).
* ``--budget``: the job ran longer than its runtime is given in all.

Stopping it: every thread's stack is asked for (the environment variable NSQD_TEST_STACKS names a
file; the suite's conftest registers faulthandler to write there on SIGUSR1), shown, then the job's
whole process group is killed.  The last line says which bound was passed, and the exit status is
124 (over budget) or 125 (hung after its summary); otherwise the command's own status.

Standard library only: it runs under whatever interpreter is at hand before any virtualenv exists.
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

# pytest's last line: "==== 2505 passed, 10 skipped, 31 deselected in 1631.81s (0:27:11) =====", or
# with -q "2 passed, 1 error in 15.14s"
SUMMARY = re.compile(rb"^(=+ )?[0-9]+ (passed|failed|errors?|skipped|deselected|xfailed|xpassed|warnings?)\b.* in [0-9.]+s\b")
OVER_BUDGET = 124
HUNG_AFTER_SUMMARY = 125
DUMP_WAIT = 5.0  # seconds for faulthandler to write every thread's stack before the kill


class Job:
    """The command's process and what its output has shown so far.

    ``lock`` guards ``summary_at`` (monotonic time pytest's summary line was seen, None before),
    which the output thread sets and the main thread reads.
    """

    def __init__(self, argv, stacks):
        env = dict(os.environ, NSQD_TEST_STACKS=stacks, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)
        self.lock = threading.Lock()
        self.summary_at = None
        self.output_done = threading.Event()
        self.reader = threading.Thread(target=self._pass_output, name="bounded-output", daemon=True)
        self.reader.start()

    def _pass_output(self):
        out = sys.stdout.buffer
        try:
            for line in iter(self.proc.stdout.readline, b""):  # b"": the job's end of output
                out.write(line)
                out.flush()
                if SUMMARY.match(line):
                    with self.lock:
                        self.summary_at = time.monotonic()
        finally:
            self.output_done.set()

    def seen_summary_at(self):
        with self.lock:
            return self.summary_at

    def stop(self, stacks):
        """Ask for every thread's stack, show it, then kill the whole process group."""
        try:
            os.kill(self.proc.pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + DUMP_WAIT
        size = -1
        while time.monotonic() < deadline:  # until the dump stops growing
            time.sleep(0.5)
            now = os.path.getsize(stacks) if os.path.exists(stacks) else 0
            if now and now == size:
                break
            size = now
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.output_done.wait(5)
        with open(stacks, "rb") as f:
            dump = f.read()
        out = sys.stdout.buffer
        out.write(b"\n=== every thread's stack, as the job was stopped ===\n")
        out.write(dump or b"(none written: the process did not answer SIGUSR1)\n")
        out.flush()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", required=True, help="the job's name in the verdict line")
    parser.add_argument("--budget", type=float, required=True, help="seconds the job may run in all")
    parser.add_argument("--after-summary", type=float, default=60.0,
                        help="seconds a pytest may live after printing its summary (default 60)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    argv = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not argv:
        parser.error("no command")
    fd, stacks = tempfile.mkstemp(prefix="nsqd-test-stacks.")
    os.close(fd)
    try:
        job = Job(argv, stacks)
        start = time.monotonic()
        verdict = None
        while True:
            try:
                rc = job.proc.wait(timeout=1.0)
                job.output_done.wait(10)
                return rc
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            summary_at = job.seen_summary_at()
            if summary_at is not None and now - summary_at >= args.after_summary:
                verdict = (HUNG_AFTER_SUMMARY, "%s: HUNG: pytest printed its summary and had not exited %d s later "
                           "(a thread still running: see the stacks above); killed"
                           % (args.name, args.after_summary))
            elif now - start >= args.budget:
                verdict = (OVER_BUDGET, "%s: OVER BUDGET: still running after %d s, its budget; killed "
                           "(every thread's stack above)" % (args.name, args.budget))
            if verdict is not None:
                job.stop(stacks)
                print("scripts/bounded.py: " + verdict[1], flush=True)
                return verdict[0]
    finally:
        os.unlink(stacks)


if __name__ == "__main__":
    sys.exit(main())
