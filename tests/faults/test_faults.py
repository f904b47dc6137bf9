"""Faults across a real network, short: scripts/faults.py's scenarios (scripts/faultlib) against our broker.

Each test builds hosts as network namespaces (a bridge in a namespace of its own, 10.200.0.0/24 only
inside them), runs nsqlookupd, nsqd (``--durable``) and the package's Producer and Consumer each in
its host, injects the fault, and checks the clients' histories: no acked message lost.  They need
root, ``ip``, ``unshare`` and ``nsenter`` and are skipped without them.  Every test removes what it
made, namespaces and processes, also when it fails (checked after each one).
"""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

import nsqd_threaded

from faultlib.checker import check
from faultlib.cluster import Cluster
from faultlib.history import History, read_history
from faultlib.network import can_make_namespaces, run_cmd
from faultlib.runner import Runner
from faultlib.topology import PROXY_TCP
from support.core import wait_until
from support.tools import go_tool
from support.wire import wait_for

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(nsqd_threaded.__file__)))
_can, _why = can_make_namespaces()
pytestmark = [
    pytest.mark.faults,
    pytest.mark.timeout(100),
    pytest.mark.skipif(not _can, reason="cannot make network namespaces: %s" % _why),
]


def _namespaces():
    out = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


@pytest.fixture
def runner():
    """A Runner whose namespaces, processes and files are all gone after the test (asserted)."""
    r = Runner(log=lambda line: None)
    try:
        yield r
    finally:
        live = [p for c in r.live for p in c.procs.values()]
        r.close()
        left = {n for n in _namespaces() if n.startswith(r.prefix)}
        assert not left, left
        assert not any(p.alive() for p in live)
        assert not os.path.exists(r.root)


def test_producer_cut_from_its_broker_fails_over_and_loses_nothing(runner):
    """(1) p1 is cut from b1 mid-stream (blackhole routes both ways): the Producer fails over to b2
    within two heartbeats; every acked message is delivered."""
    result = runner.run("producer_cut", "ours")
    assert result["acked"] > 1000, result
    assert result["lost"] == 0, result
    # the publish stuck on the cut link was answered by b2 within the producer's heartbeat detection
    assert result["producer_failover_s"] < 5.0, result


def test_consumer_cut_mid_delivery_its_messages_go_to_the_other_consumer(runner):
    """(3) c1 is cut from the broker with messages in flight: after --msg-timeout (4 s) or the lost
    heartbeats they go to c2; nothing is lost and every duplicate is one that timed out."""
    result = runner.run("consumer_cut", "ours")
    assert result["lost"] == 0, result
    assert result["duplicates"] > 0, result  # c1 held messages whose FIN never arrived
    assert set(result["dup_reasons"]) <= {"timeout (its FIN was lost)", "timeout (FIN failed: connection gone)",
                                          "redelivered unanswered (timeout, or requeued by a closing consumer)"}, result
    assert result["dup_first"] == {"c1": result["duplicates"]}, result  # only the cut consumer's
    assert result["first_redelivery_s"] is not None and result["first_redelivery_s"] < 8.0, result


def test_broker_killed_and_restarted_durable_loses_no_acked_message(runner):
    """(4) b1 (``--durable``) is killed with SIGKILL with a backlog and messages in flight, and
    restarted on the same data path: every acked message is delivered."""
    result = runner.run("broker_kill", "ours")
    assert result["acked"] > 1000, result
    assert result["lost"] == 0, result


def test_stall_and_reset_with_a_third_party_consumer_lose_nothing(runner):
    """(5b) every client link to b1 through the fault proxy: a 0.8 s stall (within Go's heartbeat
    rules: no connection may drop), a 5 s stall (past two heartbeats: dropped and redialled), then an
    RST of every connection, both sides. c1 is our Consumer, c2 pynsq's Reader: both histories are
    checked together; nothing acked is lost and the third-party client got its share."""
    result = runner.run("stall_reset", "ours")
    assert result["acked"] > 2000, result
    assert result["lost"] == 0, result
    assert result["short_stall_reconnects"] == 0, result
    assert result["long_stall_redials"] >= 3, result  # past two heartbeats: every client dropped and redialled
    assert result["pynsq_deliveries"] > 0, result
    # every client came back after the reset (which did not, and when each did, first: a long repr is cut)
    assert len(result["reset_back_s"]) == 1, (result["reset_back_by_client_s"], result)
    assert result["c1_back_after_reset_s"][0] is not None and result["c1_back_after_reset_s"][0] < 3.0, result


def test_a_broker_behind_a_proxy_takes_a_clients_first_dial(runner):
    """start_broker(proxy=...) returns once the proxy listens: a client started next (the scenarios
    start theirs at once) is not refused, which would cost pynsq's Reader 10 s before it tried that
    address again (its connect_to_nsqd tries each address at most once per 10 s)."""
    cluster = Cluster("ours", None, os.path.join(runner.root, "proxy-start"), runner.prefix + "p-",
                      log=lambda line: None)
    os.makedirs(cluster.dir)
    runner.live.append(cluster)  # closed by the fixture, whatever happens here
    cluster.start_lookupd()
    cluster.start_broker("b1", proxy=dict(bandwidth_kbps=512))
    cluster.net.add_host("c1")
    dial = "import socket; socket.create_connection((%r, %d), timeout=5).close()" % (cluster.net.address("b1"), PROXY_TCP)
    r = run_cmd(["ip", "netns", "exec", cluster.net.ns("c1"), sys.executable, "-c", dial], check=False)
    assert r.returncode == 0, r.stderr.strip().splitlines()[-1:]


@pytest.mark.skipif(go_tool("nsq_to_file") is None, reason="Go's nsq_to_file is not here")
def test_go_nsq_to_file_beside_our_consumer_through_a_reset_loses_nothing(runner):
    """(5c) Go's nsq_to_file (go-nsq) on a channel of its own and our Consumer, every link to b1
    through the proxy, every connection reset mid-stream: both come back (go-nsq asks lookupd at
    once on a closed connection) and the archiver's files hold every acked message."""
    result = runner.run("archive_reset", "ours", go_dir=os.path.dirname(go_tool("nsq_to_file")))
    assert "skipped" not in result, result
    assert result["acked"] > 500, result  # a publish in flight at the reset fails (one broker: no failover)
    assert result["lost"] == 0, result
    assert result["archive"]["lost"] == 0, result
    assert result["archive"]["lines"] >= result["acked"], result
    assert len(result["reset_back_s"]) == 1, result  # p1, c1 and a1 back on b1
    # our Consumer asks lookupd at once and redials (its lookupd poll is 1 s, its RDY re-split 5 s)
    assert result["c1_back_after_reset_s"][0] is not None and result["c1_back_after_reset_s"][0] < 3.0, result


def _proxy(args):
    argv = [sys.executable, os.path.join(REPO_ROOT, "scripts", "faults.py"), "_proxy"] + args
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_proxy_stall_holds_bytes_and_reset_sends_rst_both_ways(tmp_path):
    """The proxy's toxics on loopback: while stalled nothing is forwarded but the connection stays
    open, and everything held arrives once it flows; a reset is an RST to both ends."""
    upstream = socket.socket()
    upstream.bind(("127.0.0.1", 0))
    upstream.listen(4)
    history = str(tmp_path / "proxy.jsonl")
    # The proxy binds an ephemeral port itself and says which: a port probed here and closed could
    # be taken by another listener before the proxy binds it.
    proc = _proxy(["--listen", "127.0.0.1:0", "--target", "127.0.0.1:%d" % upstream.getsockname()[1],
                   "--history", history, "--bandwidth-kbps", "64"])
    client = server = None
    try:
        line = proc.stdout.readline().decode()
        assert line.startswith("listening "), line
        port = int(line.split(":")[-1])
        client = socket.create_connection(("127.0.0.1", port), timeout=10)
        upstream.settimeout(10)
        server, _ = upstream.accept()
        server.settimeout(10)
        client.sendall(b"before")
        assert server.recv(64) == b"before"
        # 48 KiB at 64 KiB/s: paced (a lower bound only: a loaded machine is only ever slower)
        started = time.monotonic()
        client.sendall(b"x" * 49152)
        got = 0
        while got < 49152:
            chunk = server.recv(65536)
            assert chunk, "closed after %d of 49152 bytes" % got
            got += len(chunk)
        assert time.monotonic() - started >= 0.5

        proc.send_signal(signal.SIGUSR2)  # stall
        wait_for(lambda: any(e["ev"] == "stall" for e in read_history(history)), 10, interval=0.02,
                 what="the stall in the proxy's history")
        client.sendall(b"held")
        server.settimeout(0.5)
        with pytest.raises(socket.timeout):
            server.recv(64)  # held by the proxy, the connection open
        server.settimeout(10)
        proc.send_signal(signal.SIGUSR2)  # flow
        assert server.recv(64) == b"held"

        proc.send_signal(signal.SIGUSR1)  # reset
        with pytest.raises(ConnectionResetError):
            client.recv(64)
        with pytest.raises(ConnectionResetError):
            server.recv(64)
        # The RST reaches both ends before the proxy writes its history line: wait for the line.
        wait_for(lambda: any(e["ev"] == "reset" for e in read_history(history)), 10, interval=0.02,
                 what="the reset in the proxy's history")
        events = [e["ev"] for e in read_history(history)]
        assert events == ["accept", "stall", "flow", "reset"], events
    finally:
        for s in (client, server, upstream):
            if s is not None:
                s.close()
        proc.terminate()
        proc.wait(10)


class HistoryDir:
    """A cluster's work directory as the checker reads it (histories written there, no processes)."""

    def __init__(self, path):
        self.dir = str(path)
        self.timeline = []

    def events(self, prefix):
        return Cluster.events(self, prefix)

    def path(self, name):
        return os.path.join(self.dir, name)


def test_checker_counts_lost_and_classifies_duplicates(tmp_path):
    """The checker over written histories: an acked message never delivered is lost; a redelivery
    with more attempts after a FIN is a timeout; a second id for one body is a producer retry."""
    p = History(str(tmp_path / "producer-p1.jsonl"))
    for seq in (1, 2, 3):
        p.write("pub", seq=seq, ts=0.0, ok=True, err=None)
    p.write("pub", seq=4, ts=0.0, ok=False, err="E_PUB_FAILED")
    p.close()
    c = History(str(tmp_path / "consumer-c1.jsonl"))
    c.write("msg", seq="1", mid="a", att=1, who="c1", conn="x", t=1.0)
    c.write("fin", seq="1", mid="a", who="c1", ok=True, t=1.1)
    c.write("msg", seq="1", mid="a", att=2, who="c2", conn="x", t=5.0)
    c.write("msg", seq="2", mid="b", att=1, who="c1", conn="x", t=1.0)
    c.write("msg", seq="2", mid="c", att=1, who="c1", conn="y", t=2.0)
    c.close()
    result = check(HistoryDir(tmp_path))
    assert result["acked"] == 3 and result["pub_failed"] == 1
    assert result["lost"] == 1 and result["lost_sample"] == ["3"]
    assert result["dup_reasons"] == {"timeout (its FIN was lost)": 1, "published twice (a retry after a lost answer)": 1}


def test_checker_reads_the_archivers_files_back(tmp_path):
    """Go's nsq_to_file's files, read back: an acked body missing from them is lost (a line not yet
    ended does not count); a body written twice is counted, not classified."""
    p = History(str(tmp_path / "producer-p1.jsonl"))
    for seq in (1, 2, 3):
        p.write("pub", seq=seq, ts=0.0, ok=True, err=None)
    p.close()
    (tmp_path / "archive-a1").mkdir()
    (tmp_path / "archive-a1" / "faults.a1.2026-01-01_00.log").write_text("1\n2\n2\n3")
    result = check(HistoryDir(tmp_path))
    assert result["archive"] == {"lines": 3, "lost": 1, "lost_sample": ["3"], "repeated": 1}, result
    without = tmp_path / "no-archiver"
    without.mkdir()
    assert "archive" not in check(HistoryDir(without))  # no archive-<host>/ directory: no archiver ran


def _cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "(gone)"


def _processes_mentioning(text):
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    if text.encode() in f.read():
                        found.append(int(pid))
            except OSError:
                pass
    return found


def test_ctrl_c_mid_scenario_removes_every_namespace_and_process():
    """SIGINT while a scenario runs: the script stops its brokers and clients, removes its namespaces
    and its work directory, and exits."""
    proc = subprocess.Popen([sys.executable, os.path.join(REPO_ROOT, "scripts", "faults.py"), "--scenario",
                             "consumer_cut", "--short"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    prefix = "nsqf-%d-" % proc.pid
    try:
        try:  # lookupd, nsqd, consumers... (their paths carry the prefix)
            wait_for(lambda: len(_processes_mentioning(prefix)) >= 4, 40, interval=0.2, what="the scenario's processes")
        except AssertionError:
            pass  # fewer started: interrupted anyway, the checks below still hold
        assert {n for n in _namespaces() if n.startswith(prefix)}, "no namespace made"
        proc.send_signal(signal.SIGINT)
        proc.wait(40)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not {n for n in _namespaces() if n.startswith(prefix)}, proc.stdout.read()
    # A process the script killed may take a moment to be gone from /proc (under PyPy
    # especially); one still there after the deadline is a leak.
    try:
        wait_until(lambda: not _processes_mentioning(prefix), timeout=10, what="the killed processes to leave /proc")
    except AssertionError:
        raise AssertionError([_cmdline(pid) for pid in _processes_mentioning(prefix)]) from None
    assert not [d for d in os.listdir(tempfile.gettempdir()) if d.startswith(prefix)]
