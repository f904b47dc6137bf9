"""BrokerProcess brokers forked by the fork server: separate processes, killed, restarted, independent."""

import os
import subprocess
import sys
import textwrap

import pytest

from nsqd_threaded.client import Consumer, Producer
from nsqd_threaded.testing import Broker, BrokerProcess, ForkServer
from support.core import wait_until

pytestmark = pytest.mark.skipif(not ForkServer.available(), reason="no fork server on this platform")


def parent_pid(pid):
    with open("/proc/%d/status" % pid) as f:
        return int(next(line for line in f if line.startswith("PPid:")).split()[1])


def gone(pid):
    """The process has exited (a zombie nobody reaps counts: it runs no more)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def consume(tcp_address, topic, n, timeout=30):
    got = []
    with Consumer(tcp_address, topic, "c", lambda m: got.append(m.body), max_in_flight=n):
        wait_until(lambda: len(got) >= n, timeout)
    return got


def test_kill_and_restart_keep_the_ports_and_the_data(tmp_path):
    with BrokerProcess(mem_queue_size=0, tmp_dir=str(tmp_path)) as nsqd:
        tcp, http, data = nsqd.tcp_address, nsqd.http_address, nsqd.data_path
        assert parent_pid(nsqd.pid) == ForkServer.shared().pid != os.getpid()
        with Producer(tcp) as p:
            for i in range(3):
                p.pub("t", b"m%d" % i)
        nsqd.restart()  # SIGTERM: the disk queue is flushed
        assert (nsqd.tcp_address, nsqd.http_address, nsqd.data_path) == (tcp, http, data)
        first = nsqd.pid
        nsqd.kill()
        assert nsqd.returncode == -9 and gone(first)
        nsqd.restart()
        assert nsqd.pid != first and (nsqd.tcp_address, nsqd.http_address) == (tcp, http)
        assert sorted(consume(tcp, "t", 3)) == [b"m0", b"m1", b"m2"]


def test_two_process_brokers_run_at_once_independently(tmp_path):
    with BrokerProcess(tmp_dir=str(tmp_path)) as one, BrokerProcess(tmp_dir=str(tmp_path)) as two:
        assert one.pid != two.pid and one.tcp_address != two.tcp_address and one.data_path != two.data_path
        with Producer(one.tcp_address) as p:
            p.pub("only-one", b"x")
        assert [t["topic_name"] for t in one.stats()["topics"]] == ["only-one"]
        assert two.stats()["topics"] == []
        one.kill()
        assert two.http("GET", "/ping") == (200, b"OK")
        one.restart()
        two.stop()
        assert one.http("GET", "/ping") == (200, b"OK")
        assert [t["topic_name"] for t in one.stats()["topics"]] == ["only-one"]


def test_a_process_broker_shares_no_state_with_the_test_process(tmp_path):
    with Broker(tmp_dir=str(tmp_path)) as here, BrokerProcess(tmp_dir=str(tmp_path)) as there:
        with Producer(here.tcp_address) as p:
            p.pub("in-process", b"x")
        with Producer(there.tcp_address) as p:
            p.pub("in-child", b"x")
        assert [t["topic_name"] for t in here.stats()["topics"]] == ["in-process"]
        assert [t["topic_name"] for t in there.stats()["topics"]] == ["in-child"]
        assert parent_pid(there.pid) != os.getpid()
        assert os.readlink("/proc/%d/fd/2" % there.pid) != os.readlink("/proc/self/fd/2")


def test_a_custom_command_is_still_executed(tmp_path):
    with BrokerProcess(command=[sys.executable, "-m", "nsqd_threaded"], tmp_dir=str(tmp_path)) as nsqd:
        assert parent_pid(nsqd.pid) == os.getpid()
        assert nsqd.http("GET", "/ping") == (200, b"OK")


def test_the_fork_server_and_its_brokers_exit_with_the_test_process(tmp_path):
    script = textwrap.dedent(
        """
        import os, sys
        from nsqd_threaded.testing import BrokerProcess, ForkServer
        nsqd = BrokerProcess(tmp_dir=sys.argv[1]).start()
        print(ForkServer.shared().pid, nsqd.pid, flush=True)
        sys.stdin.read()  # until killed
        """
    )
    test_process = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        server, broker = map(int, test_process.stdout.readline().split())
        assert not gone(server) and not gone(broker)
        test_process.kill()  # no atexit, no finalizer: only the fork server's EOF is left
        test_process.wait()
        wait_until(lambda: gone(server) and gone(broker), 30)
    finally:
        test_process.kill()
        test_process.wait()
        test_process.stdin.close()
        test_process.stdout.close()


def read_until_listening(child):
    """The broker's log lines up to its TCP listener's (the version and ID lines come first); the
    readline blocks until each line comes or the log ends (b"": the broker is gone)."""
    lines = []
    for line in iter(child.stderr.readline, b""):
        lines.append(line)
        if b"TCP: listening on" in line:
            return lines
    raise AssertionError("the broker's log ended before it listened: %r" % lines)


def test_a_fork_server_of_ones_own_ends_with_its_brokers(tmp_path):
    server = ForkServer().start()
    child = server.spawn(["--tcp-address=127.0.0.1:0", "--http-address=", "--data-path=%s" % tmp_path])
    try:
        assert read_until_listening(child)
        assert child.poll() is None
        server.close()
        assert child.wait(30) == -9 and not server.running
    finally:
        child.close()
        server.close()


def test_coverage_counts_the_lines_a_forked_broker_ran(tmp_path):
    """Under ``coverage run`` with ``patch = subprocess`` (as scripts/test runs the suite), the fork
    server is measured as a subprocess, and each broker process it forks saves its own data."""
    coverage = pytest.importorskip("coverage")
    import nsqd_threaded.cli

    rc = tmp_path / "coveragerc"
    rc.write_text("[run]\nbranch = false\nparallel = true\npatch = subprocess\ndata_file = %s\n"
                  "include = %s\n" % (tmp_path / ".coverage", nsqd_threaded.cli.__file__))
    script = tmp_path / "one_broker.py"
    script.write_text(textwrap.dedent(
        """
        from nsqd_threaded.testing import BrokerProcess
        with BrokerProcess(tmp_dir=%r) as nsqd:
            assert nsqd.http("GET", "/ping") == (200, b"OK")
        """ % str(tmp_path)))
    # Not the suite's own measurement (scripts/test runs it under coverage): its COVERAGE_FILE would
    # take this run's data, and its subprocess patch would start a second measurement.
    env = {k: v for k, v in os.environ.items() if not k.startswith("COVERAGE_")}
    subprocess.run([sys.executable, "-m", "coverage", "run", "--rcfile=%s" % rc, str(script)],
                   check=True, timeout=120, cwd=str(tmp_path), env=env)
    data = coverage.CoverageData(str(tmp_path / ".coverage"), suffix=None)
    combiner = coverage.Coverage(data_file=str(tmp_path / ".coverage"), config_file=str(rc))  # (not COVERAGE_FILE's)
    combiner.combine([str(tmp_path)])
    combiner.save()
    data.read()
    lines = data.lines(nsqd_threaded.cli.__file__) or []
    with open(nsqd_threaded.cli.__file__) as f:
        source = f.read().splitlines()
    # Only the command runs _prepare (the broker process: neither the script nor the fork server does).
    prepare = next(i for i, line in enumerate(source, 1) if line.strip() == "tune_gc()")
    assert prepare in lines


@pytest.mark.parametrize("args", [
    ["--no-such-flag"],
    ["--mem-queue-size=many"],
    ["--version"],
    ["--tcp-address=127.0.0.1:0", "--http-address=", "--data-path=/nonexistent/nsqd"],
])
def test_a_forked_broker_says_and_exits_as_the_command_does(args, tmp_path):
    """The fork server parses the command line ahead of the fork; what the broker process then says
    on stderr, and its exit status, are the exec'd command's."""
    import re

    def normal(text):
        return re.sub(rb"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d+", b"TIME", text)

    server = ForkServer().start()
    try:
        forked = server.spawn(args, cwd=str(tmp_path))
        said = forked.stderr.read()
        code = forked.wait(30)
        forked.close()
    finally:
        server.close()
    executed = subprocess.run([sys.executable, "-m", "nsqd_threaded"] + args, cwd=str(tmp_path),
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60)
    assert (code, normal(said)) == (executed.returncode, normal(executed.stderr))


def test_a_broker_outlived_by_its_killed_fork_server_is_killed_too(tmp_path):
    server = ForkServer().start()
    child = server.spawn(["--tcp-address=127.0.0.1:0", "--http-address=", "--data-path=%s" % tmp_path])
    try:
        assert read_until_listening(child)
        os.kill(server.pid, 9)  # no chance to end its brokers
        assert child.wait(30) == -9
        wait_until(lambda: gone(child.pid), 30, "the broker process to end")
    finally:
        child.close()
        server.close()
