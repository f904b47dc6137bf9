"""scripts/bounded.py and the suite's thread watch: a hang is a failure with a name, never a silent wait."""

import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTS = os.path.join(REPO, "tests")
BOUNDED = os.path.join(REPO, "scripts", "bounded.py")

# The bug that kept a PyPy pytest alive after its summary: a non-daemon thread reading a socket whose
# peer is gone, which takes recv's b"" for "nothing yet" and spins.
LEAKY = '''
import socket
import threading


def test_leaks_a_spinning_thread():
    ours, theirs = socket.socketpair()
    theirs.close()

    def spin():
        while True:
            ours.recv(65536)

    threading.Thread(target=spin, name="leaked-spinner").start()


def test_after_it():
    pass
'''


def run_bounded(tmp_path, *args, timeout=120):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, REPO]), NSQD_TEST_THREAD_GRACE="0.5")
    env.pop("NSQD_TEST_SHARD", None)
    env.pop("COVERAGE_PROCESS_START", None)
    proc = subprocess.run([sys.executable, BOUNDED] + list(args), cwd=str(tmp_path), env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    return proc.returncode, proc.stdout.decode(errors="replace")


def test_a_leaked_spinning_thread_fails_its_test_and_the_hang_is_killed_with_stacks(tmp_path):
    (tmp_path / "test_leaky.py").write_text(LEAKY)
    rc, out = run_bounded(tmp_path, "--name", "leaky", "--budget", "100", "--after-summary", "2", "--",
                          sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q",
                          "test_leaky.py")
    assert rc == 125, out
    # the test that left it fails itself, naming the thread and where it is; the next test does not
    assert "ERROR at teardown of test_leaks_a_spinning_thread" in out, out
    assert "test_after_it" not in out.split("short test summary info")[-1], out
    assert "'leaked-spinner' (not daemon: it keeps the process alive)" in out, out
    assert "1 thread(s) at the end of the session are still running" in out, out
    # then the hang after the summary: every thread's stack, the kill, and the verdict
    assert "=== every thread's stack, as the job was stopped ===" in out, out
    assert re.search(r'test_leaky\.py", line [0-9]+ in spin', out), out  # (PyPy's line numbers are approximate)
    assert out.rstrip().endswith("leaky: HUNG: pytest printed its summary and had not exited 2 s later "
                                 "(a thread still running: see the stacks above); killed"), out


def test_a_job_over_its_budget_is_killed_with_stacks(tmp_path):
    rc, out = run_bounded(tmp_path, "--name", "slow", "--budget", "2", "--",
                          sys.executable, "-c", "import time; time.sleep(60)")
    assert rc == 124, out
    assert "slow: OVER BUDGET: still running after 2 s, its budget; killed" in out, out


def test_a_job_that_ends_keeps_its_own_status(tmp_path):
    rc, out = run_bounded(tmp_path, "--name", "quick", "--budget", "60", "--",
                          sys.executable, "-c", "print('done'); raise SystemExit(3)")
    assert (rc, out) == (3, "done\n")
