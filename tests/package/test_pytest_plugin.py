"""The pytest plugin, exercised by running pytest (pytester) on sample test files."""

import os
import re
import threading

import pytest

import nsqd_threaded

pytest_plugins = ["pytester"]

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(nsqd_threaded.__file__)))
PLUGIN = "nsqd_threaded.pytest_plugin"

try:
    # Imported here, before pytester snapshots sys.modules: its teardown unloads what a test
    # imported, and a later import of pynsq would make second copies of tornado's classes.
    import nsq
except ImportError:
    nsq = None


# Works with and without the pytest11 entry point: the entry point is named after the module,
# so pytest sees "-p nsqd_threaded.pytest_plugin" as the plugin it already has.
PLUGIN_ARGS = ("-p", PLUGIN)


def run(pytester, *args):
    # -p no:cacheprovider: the inner runs write nothing into the project.
    return pytester.runpytest(*PLUGIN_ARGS, "-p", "no:cacheprovider", *args)


@pytest.fixture(autouse=True)
def no_broker_left_behind():
    before = set(threading.enumerate())
    yield
    left = [t for t in threading.enumerate() if t not in before]
    assert not left, "threads left by the inner run: %r" % left


def test_fixtures_markers_and_flags(pytester):
    pytester.makeini(
        """
        [pytest]
        nsqd_flags = --max-rdy-count=42 --mem-queue-size=11
        """
    )
    pytester.makepyfile(
        """
        import os
        import socket

        import pytest

        from nsqd_threaded.client import Consumer, Producer
        from nsqd_threaded.testing import Broker, BrokerProcess

        seen = []  # the first test's broker and data directory
        ports = []  # the session broker's address

        def test_nsqd_fixture(nsqd):
            assert isinstance(nsqd, Broker) and nsqd.running
            assert nsqd.tcp_address[0] == "127.0.0.1" and nsqd.tcp_address[1] != 0
            assert os.path.isdir(nsqd.data_path)
            opts = nsqd.nsqd.options
            assert (opts.max_rdy_count, opts.mem_queue_size, opts.max_msg_size) == (42, 11, 777)
            with Producer(nsqd.tcp_address) as p:
                p.pub("t", b"x")
            assert nsqd.http("GET", "/ping") == (200, b"OK")
            seen.append((nsqd, nsqd.data_path))

        def test_nsqd_fixture_is_fresh(nsqd):
            (first, first_path), = seen  # (its port may be handed out again: ports are reused)
            assert nsqd is not first and not first.running and nsqd.data_path != first_path
            assert nsqd.stats()["topics"] == []

        @pytest.mark.nsqd("--msg-timeout=2s", "--mem-queue-size=5", max_rdy_count=7)
        def test_marker(nsqd):
            opts = nsqd.nsqd.options
            assert (opts.msg_timeout, opts.mem_queue_size, opts.max_rdy_count) == (2.0, 5, 7)

        @pytest.mark.nsqd(max_msg_timeout="20m")
        class TestClass:
            @pytest.mark.nsqd(max_msg_timeout="30m")
            def test_closest_marker_wins(self, nsqd):
                assert nsqd.nsqd.options.max_msg_timeout == 1800.0

            def test_class_marker(self, nsqd):
                assert nsqd.nsqd.options.max_msg_timeout == 1200.0

        def test_session_broker_is_shared_1(nsqd_session):
            ports.append(nsqd_session.tcp_address)
            assert nsqd_session.nsqd.options.max_rdy_count == 42

        def test_session_broker_is_shared_2(nsqd_session):
            assert nsqd_session.tcp_address == ports[-1]

        @pytest.mark.nsqd(mem_queue_size=3)
        def test_factory(nsqd_factory, nsqd):
            other = nsqd_factory("--max-rdy-count=9")
            third = nsqd_factory(mem_queue_size=4)
            assert len({nsqd.tcp_address, other.tcp_address, third.tcp_address}) == 3
            assert other.nsqd.options.max_rdy_count == 9 and other.nsqd.options.mem_queue_size == 3
            assert third.nsqd.options.mem_queue_size == 4
            with Producer(other.tcp_address) as p:
                p.pub("only-here", b"x")
            assert [t["topic_name"] for t in other.stats()["topics"]] == ["only-here"]
            assert nsqd.stats()["topics"] == [] and third.stats()["topics"] == []

        @pytest.mark.nsqd(msg_timeout="3s")
        def test_process(nsqd_process):
            assert isinstance(nsqd_process, BrokerProcess) and nsqd_process.running
            assert nsqd_process.http("GET", "/config/msg_timeout") == (200, b"3000000000")
            assert nsqd_process.http("GET", "/config/max_rdy_count") == (200, b"42")
            with Producer(nsqd_process.tcp_address) as p:
                p.pub("t", b"before")
            nsqd_process.kill()
            assert nsqd_process.returncode == -9
            nsqd_process.restart()
            with Consumer(nsqd_process.tcp_address, "t", "c") as c:
                pass
            assert nsqd_process.stats()["topics"][0]["topic_name"] == "t"
        """
    )
    result = run(pytester, "--nsqd-flag=--max-msg-size=777", "--strict-markers", "-v")
    result.assert_outcomes(passed=9)
    assert "Captured nsqd log" not in result.stdout.str()


def test_failing_test_shows_the_broker_log(pytester):
    pytester.makepyfile(
        """
        from nsqd_threaded.client import Producer

        def test_passes(nsqd_session):
            with Producer(nsqd_session.tcp_address) as p:
                p.pub("earlier-topic", b"x")

        def test_fails(nsqd):
            with Producer(nsqd.tcp_address) as p:
                p.pub("topic-of-the-failing-test", b"x")
            assert False, "boom"

        def test_fails_on_the_session_broker(nsqd_session):
            with Producer(nsqd_session.tcp_address) as p:
                p.pub("later-topic", b"x")
            assert False, "bang"

        def test_fails_with_two_brokers(nsqd, nsqd_factory):
            other = nsqd_factory()
            assert False, "pow"
        """
    )
    result = run(pytester)
    result.assert_outcomes(passed=1, failed=3)
    out = result.stdout.str()
    sections = re.findall(r"-+ Captured nsqd log (\w+) \((127\.0\.0\.1:\d+)\) -+", out)
    assert [when for when, _ in sections] == ["call"] * 4, out
    result.stdout.fnmatch_lines(
        [
            "*_ test_fails _*",
            "*AssertionError: boom*",
            "*- Captured nsqd log call (127.0.0.1:*) -*",
            "*INFO: TCP: listening on 127.0.0.1:*",
            "*INFO: TOPIC(topic-of-the-failing-test): created*",
        ]
    )
    # The session broker's section holds only what the failing test caused.
    session_part = out[out.index("_ test_fails_on_the_session_broker _") :]
    session_part = session_part[: session_part.index("_ test_fails_with_two_brokers _")]
    assert "TOPIC(later-topic): created" in session_part
    assert "earlier-topic" not in session_part
    assert "TCP: listening" not in session_part
    # Two brokers: two sections, with different addresses.
    two = [addr for _, addr in sections[2:]]
    assert len(set(two)) == 2


def test_failure_in_setup_shows_the_log_and_bad_flags_fail_setup(pytester):
    pytester.makepyfile(
        """
        import pytest

        @pytest.fixture
        def broken(nsqd):
            raise RuntimeError("fixture failed")

        def test_setup_error(broken):
            pass

        @pytest.mark.nsqd("--no-such-flag=1")
        def test_bad_flag(nsqd):
            pass

        @pytest.mark.nsqd(node_id=5000)
        def test_bad_value(nsqd):
            pass
        """
    )
    result = run(pytester)
    result.assert_outcomes(errors=3)
    result.stdout.fnmatch_lines(
        [
            "*- Captured nsqd log setup (127.0.0.1:*) -*",
            "*TCP: listening on*",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*ERROR at setup of test_bad_flag*",
            "nsqd did not start (flags: --no-such-flag=1): ValueError: bad nsqd flags*No such option*--no-such-flag*",
            "*ERROR at setup of test_bad_value*",
            "nsqd did not start: OptionError: --node-id must be [0,1024)",
        ]
    )
    assert "Captured nsqd log setup (not started)" not in result.stdout.str()


def test_show_capture_no_hides_the_log(pytester):
    pytester.makepyfile(
        """
        def test_fails(nsqd):
            assert False
        """
    )
    result = run(pytester, "--show-capture=no")
    result.assert_outcomes(failed=1)
    assert "Captured nsqd log" not in result.stdout.str()


def test_plugin_can_be_disabled(pytester):
    pytester.makepyfile(
        """
        def test_uses_nsqd(nsqd):
            pass
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:" + PLUGIN)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'nsqd' not found*"])


def test_help_lists_the_option(pytester):
    result = run(pytester, "--help")
    result.stdout.fnmatch_lines(["*--nsqd-flag=FLAG*", "*nsqd_flags*"])


def _doc_files():
    """The files of the example in docs/testing.md (``<!-- file: name -->`` then a python block)."""
    with open(os.path.join(REPO_ROOT, "docs", "testing.md")) as f:
        text = f.read()
    files = dict(re.findall(r"<!-- file: (\S+) -->\s*```python\n(.*?)```", text, re.S))
    assert set(files) == {"orders.py", "conftest.py", "test_orders.py"}
    return files


def test_the_documented_pynsq_example_passes(pytester):
    if nsq is None:
        pytest.skip("pynsq is not installed")
    for name, source in _doc_files().items():
        pytester.makefile(os.path.splitext(name)[1], **{os.path.splitext(name)[0]: source})
    pytester.syspathinsert()
    result = run(pytester, "-v")
    result.assert_outcomes(passed=4)
