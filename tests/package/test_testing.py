"""nsqd_threaded.testing: in-process and child-process brokers for test suites."""

import gc
import os
import socket
import tempfile
import threading

import pytest

from nsqd_threaded.client import Consumer, Producer
from nsqd_threaded.settings.options import OptionError
from nsqd_threaded.testing import Broker, BrokerProcess, ForkServer, resolve_options


def fds():
    """This process's open file descriptors: {fd: what it points to}."""
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[fd] = os.readlink("/proc/self/fd/" + fd)
        except OSError:  # the directory listing's own fd, closed by now
            pass
    return out


def snapshot():
    return set(threading.enumerate()), fds(), len(getattr(gc, "callbacks", ()))  # CPython only


def assert_nothing_left(before, tmp_root=None):
    threads, open_fds, callbacks = before
    left_threads = [t for t in threading.enumerate() if t not in threads]
    assert not left_threads, "threads left behind: %r" % left_threads
    now = fds()
    left_fds = {fd: target for fd, target in now.items() if open_fds.get(fd) != target}
    assert not left_fds, "file descriptors left behind: %r" % left_fds
    assert len(getattr(gc, "callbacks", ())) == callbacks, "gc callbacks left behind"
    if tmp_root is not None:
        assert os.listdir(str(tmp_root)) == [], "temporary files left behind"


@pytest.fixture
def tmp_root(tmp_path):
    root = tmp_path / "brokers"
    root.mkdir()
    return root


# -- options ---------------------------------------------------------------------


def test_flags_and_keyword_options_are_resolved_like_the_command_line(tmp_path):
    cfg = tmp_path / "nsqd.cfg"
    cfg.write_text('mem_queue_size = 77\nmsg_timeout = "7s"\n')
    values = resolve_options(
        ["--msg-timeout=1s", "-max-rdy-count", "10", "--e2e-processing-latency-percentile=0.5,0.99"],
        {"mem_queue_size": 5, "max_req_timeout": "2m", "sync_timeout": 0.5},
    )
    assert values == {
        "msg_timeout": 1.0,
        "max_rdy_count": 10,
        "e2e_processing_latency_percentiles": [0.5, 0.99],
        "mem_queue_size": 5,
        "max_req_timeout": 120.0,
        "sync_timeout": 0.5,
    }
    # flags win over the config file, keywords over flags
    assert resolve_options(["--config=%s" % cfg, "--msg-timeout=3s"], {"mem_queue_size": 1}) == {
        "mem_queue_size": 1,
        "msg_timeout": 3.0,
    }


@pytest.mark.parametrize(
    "flags, options, message",
    [
        (["--no-such-flag"], {}, "No such option"),
        (["--msg-timeout=soon"], {}, 'invalid duration "soon"'),
        (["--topology-zone=z1"], {}, "--topology-zone is not supported yet"),
        (["--config=/nonexistent/nsqd.cfg"], {}, "failed to load config file"),
        (["--version"], {}, "--version does not start a broker"),
        ([], {"no_such_option": 1}, "unknown nsqd option 'no_such_option'"),
        ([], {"msg_timeout": "soon"}, 'invalid duration "soon"'),
    ],
)
def test_bad_flags_and_options_raise_value_error(flags, options, message):
    with pytest.raises(ValueError, match=None) as info:
        Broker(*flags, **options)
    assert message in str(info.value)


# -- in-process broker -------------------------------------------------------------


def test_broker_listens_on_ephemeral_ports_with_a_temporary_directory(tmp_root):
    before = snapshot()
    with Broker(tmp_dir=str(tmp_root)) as nsqd:
        host, port = nsqd.tcp_address
        assert host == "127.0.0.1" and port != 0
        assert nsqd.http_address[0] == "127.0.0.1" and nsqd.http_address[1] not in (0, port)
        assert nsqd.tcp_addr == "127.0.0.1:%d" % port
        assert nsqd.http_url == "http://127.0.0.1:%d" % nsqd.http_address[1]
        assert os.path.dirname(nsqd.data_path) == str(tmp_root)
        assert os.path.exists(os.path.join(nsqd.data_path, "nsqd.dat"))
        assert nsqd.http("GET", "/ping") == (200, b"OK")
        assert nsqd.stats()["topics"] == []
        socket.create_connection(nsqd.tcp_address, timeout=5).close()
        assert "TCP: listening on 127.0.0.1:%d" % port in nsqd.log
        assert repr(nsqd) == "<Broker tcp=%s http=%s running>" % (nsqd.tcp_addr, nsqd.http_addr)
    assert not nsqd.running and nsqd.data_path is None
    assert "NSQ: stopped" in nsqd.log
    assert_nothing_left(before, tmp_root)


def test_broker_takes_flags_and_any_option():
    with Broker("--msg-timeout=2s", "-mem-queue-size", "3", mem_queue_size=5, max_req_timeout="90s") as nsqd:
        opts = nsqd.nsqd.options
        assert (opts.msg_timeout, opts.mem_queue_size, opts.max_req_timeout) == (2.0, 5, 90.0)
        assert nsqd.http("GET", "/config/msg_timeout") == (200, b"2000000000")
        # Internal options (no flag) are accepted in-process.
    with Broker(queue_scan_interval=0.02, log_level="debug") as nsqd:
        assert nsqd.nsqd.options.queue_scan_interval == 0.02


def test_invalid_value_and_bind_failure_leave_nothing_behind(tmp_root):
    before = snapshot()
    with pytest.raises(OptionError, match=r"--node-id must be \[0,1024\)"):
        Broker(node_id=5000, tmp_dir=str(tmp_root)).start()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        broker = Broker(tcp_address="127.0.0.1:%d" % taken.getsockname()[1], tmp_dir=str(tmp_root))
        with pytest.raises(OSError, match="listen .* failed"):
            broker.start()
        assert not broker.running
        broker.stop()  # harmless
    assert_nothing_left(before, tmp_root)


def test_http_can_be_disabled():
    with Broker(http_address="") as nsqd:
        assert nsqd.http_address is None and nsqd.http_url is None
        with pytest.raises(RuntimeError, match="HTTP is disabled"):
            nsqd.http("GET", "/ping")
        with Producer(nsqd.tcp_address) as p:
            p.pub("t", b"x")


def test_a_given_data_path_is_used_and_kept(tmp_path):
    with Broker(data_path=str(tmp_path)) as nsqd:
        with Producer(nsqd.tcp_address) as p:
            p.pub("kept", b"x")
    assert nsqd.data_path == str(tmp_path)
    with open(tmp_path / "nsqd.dat") as f:
        assert '"name":"kept"' in f.read()


def test_start_twice_is_refused_and_stop_is_idempotent():
    nsqd = Broker().start()
    try:
        with pytest.raises(RuntimeError, match="already running"):
            nsqd.start()
    finally:
        nsqd.stop()
    nsqd.stop()
    with pytest.raises(RuntimeError, match="not running"):
        nsqd.restart()


def test_restart_keeps_ports_and_metadata():
    with Broker() as nsqd:
        tcp, http = nsqd.tcp_address, nsqd.http_address
        data_path = nsqd.data_path
        with Producer(nsqd.tcp_address) as p:
            p.pub("survives", b"x")
        assert nsqd.http("POST", "/channel/create?topic=survives&channel=c")[0] == 200
        first = nsqd.nsqd
        nsqd.restart()
        assert nsqd.nsqd is not first and nsqd.running
        assert (nsqd.tcp_address, nsqd.http_address, nsqd.data_path) == (tcp, http, data_path)
        topics = nsqd.stats()["topics"]
        assert [(t["topic_name"], [c["channel_name"] for c in t["channels"]]) for t in topics] == [
            ("survives", ["c"])
        ]


def test_log_stream_receives_the_log_too():
    class Sink:
        def __init__(self):
            self.lines = []

        def write(self, s):
            self.lines.append(s)

        def flush(self):
            pass

    sink = Sink()
    with Broker(log_stream=sink) as nsqd:
        position = nsqd.log_position()
        with Producer(nsqd.tcp_address) as p:
            p.pub("logged", b"x")
    assert "".join(sink.lines) == nsqd.log
    assert nsqd.log_since(position).startswith("[nsqd] ")
    assert "TOPIC(logged): created" in nsqd.log_since(position)
    assert "TCP: listening" not in nsqd.log_since(position)


def test_many_brokers_at_once_are_isolated(tmp_root):
    before = snapshot()
    count = 12
    brokers = [Broker(tmp_dir=str(tmp_root)) for _ in range(count)]
    starters = [threading.Thread(target=b.start, name="test-starter-%d" % i, daemon=True)
                for i, b in enumerate(brokers)]
    for t in starters:
        t.start()
    for t in starters:
        t.join(30)
    try:
        assert all(b.running for b in brokers)
        assert len({b.tcp_address for b in brokers} | {b.http_address for b in brokers}) == 2 * count
        assert len({b.data_path for b in brokers}) == count

        def use(i, broker):
            with Producer(broker.tcp_address) as p:
                p.pub("topic-%d" % i, b"body-%d" % i)
            with Consumer(broker.tcp_address, "topic-%d" % i, "c") as c:
                msg = c.get(timeout=10)
                msg.fin()
                results[i] = msg.body

        results = {}
        users = [threading.Thread(target=use, args=(i, b), name="test-user-%d" % i, daemon=True)
                 for i, b in enumerate(brokers)]
        for t in users:
            t.start()
        for t in users:
            t.join(30)
        assert results == {i: b"body-%d" % i for i in range(count)}
        for i, broker in enumerate(brokers):
            assert [t.name for t in broker.nsqd.topics()] == ["topic-%d" % i]
            assert broker.stats()["topics"][0]["message_count"] == 1
    finally:
        stoppers = [threading.Thread(target=b.stop, name="test-stopper-%d" % i, daemon=True)
                    for i, b in enumerate(brokers)]
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join(30)
    assert_nothing_left(before, tmp_root)


def test_200_start_stop_cycles_leave_nothing_behind(tmp_root):
    Broker(tmp_dir=str(tmp_root)).start().stop()  # warm up lazy imports and caches
    before = snapshot()
    for _ in range(200):
        broker = Broker(tmp_dir=str(tmp_root)).start()
        broker.stop()
    assert_nothing_left(before, tmp_root)


def test_cycles_with_traffic_leave_nothing_behind(tmp_root):
    def cycle():
        with Broker(tmp_dir=str(tmp_root)) as nsqd:
            with Producer(nsqd.tcp_address) as p:
                p.mpub("t", [b"a", b"b"])
            got = []
            both = threading.Event()

            def handler(msg):
                got.append(msg.body)
                if len(got) == 2:
                    both.set()

            with Consumer(nsqd.tcp_address, "t", "c", handler, max_in_flight=2):
                assert both.wait(10)
            assert sorted(got) == [b"a", b"b"]
            assert nsqd.http("GET", "/stats?format=json")[0] == 200
            # a client still connected when the broker stops
            idle = socket.create_connection(nsqd.tcp_address, timeout=5)
            idle.sendall(b"  V2")
        idle.close()

    cycle()
    before = snapshot()
    for _ in range(20):
        cycle()
    assert_nothing_left(before, tmp_root)


def test_the_default_temporary_directory_is_removed():
    with Broker() as nsqd:
        path = nsqd.data_path
        assert os.path.dirname(path) == tempfile.gettempdir()
        assert os.path.basename(path).startswith("nsqd-threaded-")
    assert not os.path.exists(path)


# -- child-process broker ----------------------------------------------------------


def test_process_broker_starts_when_ready_and_stops(tmp_root):
    ForkServer.shared().start()  # the test process's one fork server stays: its socket is no leak
    before = snapshot()
    with BrokerProcess("--mem-queue-size=5", msg_timeout=2.5, tmp_dir=str(tmp_root)) as nsqd:
        assert nsqd.running and nsqd.pid != os.getpid()
        assert nsqd.tcp_address[1] != 0 and nsqd.http_address[1] != 0
        # Ready means listening: no sleep, no retry.
        assert nsqd.http("GET", "/ping") == (200, b"OK")
        assert nsqd.http("GET", "/config/msg_timeout") == (200, b"2500000000")
        assert nsqd.http("GET", "/config/mem_queue_size") == (200, b"5")
        with Producer(nsqd.tcp_address) as p:
            p.pub("t", b"x")
        assert os.path.isdir(nsqd.data_path)
        pid = nsqd.pid
    assert nsqd.returncode == 0 and not nsqd.running
    assert "SIGTERM: shutting down" in nsqd.log and "--- exited with status 0" in nsqd.log
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert_nothing_left(before, tmp_root)


def test_process_broker_crash_and_restart_on_the_same_ports(tmp_root):
    with BrokerProcess(tmp_dir=str(tmp_root)) as nsqd:
        tcp, http = nsqd.tcp_address, nsqd.http_address
        with Producer(nsqd.tcp_address) as p:
            p.pub("t", b"x")  # creating the topic writes nsqd.dat
        first = nsqd.pid
        nsqd.kill()
        assert nsqd.returncode == -9 and not nsqd.running
        assert "--- exited with status -9" in nsqd.log
        nsqd.restart()
        assert nsqd.pid != first and (nsqd.tcp_address, nsqd.http_address) == (tcp, http)
        assert [t["topic_name"] for t in nsqd.stats()["topics"]] == ["t"]
        nsqd.restart(kill=True)
        assert nsqd.http("GET", "/ping") == (200, b"OK")
        nsqd.terminate()
        assert nsqd.returncode == 0
        nsqd.restart()
        assert nsqd.running
    assert os.listdir(str(tmp_root)) == []


def test_process_broker_that_cannot_start_raises_with_its_log(tmp_root):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        broker = BrokerProcess(tcp_address="127.0.0.1:%d" % taken.getsockname()[1], tmp_dir=str(tmp_root))
        with pytest.raises(RuntimeError, match="(?s)exited with status 1.*FATAL: failed to instantiate nsqd"):
            broker.start()
    assert not broker.running
    assert os.listdir(str(tmp_root)) == []


def test_process_broker_checks_flags_before_spawning():
    with pytest.raises(ValueError, match="No such option"):
        BrokerProcess("--no-such-flag")
    with pytest.raises(ValueError, match="has no nsqd flag"):
        BrokerProcess(queue_scan_interval=0.01)


def test_process_broker_ready_without_http(tmp_root):
    with BrokerProcess(http_address="", tmp_dir=str(tmp_root)) as nsqd:
        assert nsqd.http_address is None
        with Producer(nsqd.tcp_address) as p:
            p.pub("t", b"x")
