"""nsqd_threaded.testing.tornado_loop: running pynsq (tornado) in a test until something holds.

Every warning tornado or asyncio gives of a deprecated call is an error here.
The same checks run on the newest tornado when ``NSQD_THREADED_TORNADO_PYTHON``
names a Python that has it (and pynsq 0.9.1, sortedcontainers and click).
"""

import os
import subprocess
import sys
import textwrap

import pytest

nsq = pytest.importorskip("nsq")

from nsqd_threaded.testing import Broker  # noqa: E402
from nsqd_threaded.testing.tornado_loop import TornadoLoop  # noqa: E402

pytestmark = [pytest.mark.timeout(60), pytest.mark.filterwarnings("error::DeprecationWarning")]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# What a test suite of a pynsq application does: a Reader and a Writer on a broker, and
# predicates that raise until the broker has what they look for.
SCENARIO = textwrap.dedent('''
    import nsq
    from nsqd_threaded.testing import Broker
    from nsqd_threaded.testing.tornado_loop import TornadoLoop

    def channel(nsqd):
        return nsqd.stats(topic="orders")["topics"][0]["channels"][0]  # raises until it exists

    def scenario(tmp_dir):
        with Broker(tmp_dir=tmp_dir) as nsqd, TornadoLoop() as loop:
            billed = []
            reader = nsq.Reader(topic="orders", channel="billing", nsqd_tcp_addresses=[nsqd.tcp_addr],
                                message_handler=lambda m: billed.append(m.body) or True, max_in_flight=5)
            writer = nsq.Writer([nsqd.tcp_addr])
            loop.run_until(lambda: writer.conns)
            answers = []
            writer.pub("orders", b"order 1", callback=lambda conn, data: answers.append(data))
            loop.run_until(lambda: billed and answers)
            assert (billed, answers) == ([b"order 1"], [b"OK"])
            loop.run_until(lambda: channel(nsqd)["in_flight_count"] == 0 and channel(nsqd)["depth"] == 0)
            reader.close()
            loop.run_until(lambda: not reader.conns)
        return "ok"
''')


def scenario(tmp_dir):
    namespace = {}
    exec(SCENARIO, namespace)
    return namespace["scenario"](tmp_dir)


def test_pynsq_reader_and_writer_run_until_done(tmp_path):
    assert scenario(str(tmp_path)) == "ok"


def test_a_predicate_that_raises_is_not_yet(tmp_path):
    calls = []

    def appears():
        calls.append(1)
        if len(calls) < 3:
            raise KeyError("not there yet")
        return "there"

    with TornadoLoop() as loop:
        assert loop.run_until(appears) == "there"
    assert len(calls) == 3


def test_the_timeout_raises_and_chains_the_predicate_s_last_error(tmp_path):
    with TornadoLoop() as loop:
        with pytest.raises(TimeoutError) as info:
            loop.run_until(lambda: {}["missing"], timeout=0.05)
        assert isinstance(info.value.__cause__, KeyError)
        with pytest.raises(TimeoutError) as info:
            loop.run_until(lambda: False, timeout=0.05)
        assert info.value.__cause__ is None


def test_each_loop_is_new_and_closed_after(tmp_path):
    with Broker(tmp_dir=str(tmp_path)) as nsqd:
        with TornadoLoop() as first:
            writer = nsq.Writer([nsqd.tcp_addr])
            first.run_until(lambda: writer.conns)
            assert writer.io_loop is first.io_loop
        assert first.asyncio_loop.is_closed()
        with TornadoLoop() as second:
            assert second.io_loop is not first.io_loop
            writer = nsq.Writer([nsqd.tcp_addr])
            second.run_until(lambda: writer.conns)


@pytest.mark.skipif(not os.environ.get("NSQD_THREADED_TORNADO_PYTHON"),
                    reason="NSQD_THREADED_TORNADO_PYTHON does not name a Python with the newest tornado")
def test_on_the_newest_tornado(tmp_path):
    python = os.environ["NSQD_THREADED_TORNADO_PYTHON"]
    code = SCENARIO + "\nimport sys, tornado\nprint(tornado.version, scenario(sys.argv[1]))\n"
    env = dict(os.environ, PYTHONPATH=REPO)
    done = subprocess.run([python, "-W", "error::DeprecationWarning", "-c", code, str(tmp_path)],
                          capture_output=True, text=True, timeout=50, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[1] == "ok"
    assert sys.executable != python
