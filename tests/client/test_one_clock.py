"""One clock for the broker and a pynsq application: the broker's timers and pynsq's own (its 15 s
redial, its backoff, its RDY redistribution) run on the broker's clock, skipping while idle.

An order service's suite as its author would write it: no sleep, no pynsq internals touched.
"""

import asyncio
import time
import urllib.request

import pytest

nsq = pytest.importorskip("nsq")

from nsqd_threaded.testing import Broker, BrokerProcess, Cluster, FaultProxy, TornadoLoop  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def pub(nsqd, topic, body, defer_ms=None):
    url = "%s/pub?topic=%s" % (nsqd.http_url, topic)
    if defer_ms is not None:
        url += "&defer=%d" % defer_ms
    with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=10) as answer:
        assert answer.read() == b"OK"


class Orders:
    """The application: a Reader whose handler the test scripts (True: FIN, False: REQ, "async": hold)."""

    def __init__(self, answer=lambda m: True, **reader_args):
        self.seen = []  # (body, attempts)
        self.at = []  # when each was handled (the loop's clock)
        self.given_up = []
        self._answer = answer
        self.held = []
        # pynsq's defaults (a heartbeat every 30 s): pynsq closes a connection it has heard nothing on
        # for two intervals of the clock, and each skip past a heartbeat brings it (see test_a_1h_dpub).
        args = dict(topic="orders", channel="billing", max_in_flight=1)
        args.update(reader_args)
        self.reader = nsq.Reader(message_handler=self.handle, **args)
        self.reader.giving_up = lambda m: self.given_up.append(m.body)

    def handle(self, message):
        self.seen.append((message.body, message.attempts))
        self.at.append(asyncio.get_event_loop().time())  # the loop's clock (tornado's own time() is the wall's on 6.3+)
        answer = self._answer(message)
        if answer == "async":
            message.enable_async()
            self.held.append(message)
            return None
        if isinstance(answer, tuple):  # ("req", seconds)
            message.requeue(delay=answer[1], backoff=False)
            return None
        return answer

    def close(self, loop):
        self.reader.close()
        loop.run_until(lambda: not self.reader.conns)


def test_a_fin_and_the_loop_time_is_the_brokers(tmp_path):
    started = time.monotonic()
    with Broker(tmp_dir=str(tmp_path)) as nsqd, TornadoLoop(clock=nsqd, auto_skip=True) as loop:
        assert abs(loop.time() - nsqd.nsqd.clock.monotonic()) < 0.5
        app = Orders(nsqd_tcp_addresses=[nsqd.tcp_addr])
        pub(nsqd, "orders", b"order 1")
        loop.wait_until(nsqd, "orders", "billing", depth=0, in_flight_count=0, message_count=1)
        assert app.seen == [(b"order 1", 1)]
        before = loop.time()
        assert nsqd.advance(3600) == 3600
        assert loop.time() - before >= 3600  # one clock: the broker's skip is the loop's
        app.close(loop)
    assert time.monotonic() - started < 10


def test_a_30s_req_comes_back_after_30s_of_the_clock(tmp_path):
    with Broker(tmp_dir=str(tmp_path)) as nsqd, TornadoLoop(clock=nsqd, auto_skip=True) as loop:
        app = Orders(lambda m: ("req", 30) if m.attempts == 1 else True, nsqd_tcp_addresses=[nsqd.tcp_addr])
        pub(nsqd, "orders", b"order 2")
        loop.run_until(lambda: app.seen)
        loop.wait_until(nsqd, "orders", "billing", deferred_count=1)
        loop.run_until(lambda: len(app.seen) == 2, timeout=120)
        assert app.seen == [(b"order 2", 1), (b"order 2", 2)]
        assert 30 <= app.at[1] - app.at[0] < 31  # REQ'd as it was handled; back 30 s of the clock later
        loop.wait_until(nsqd, "orders", "billing", depth=0, in_flight_count=0, deferred_count=0)
        app.close(loop)


def test_give_up_after_n_attempts(tmp_path):
    with Broker(tmp_dir=str(tmp_path)) as nsqd, TornadoLoop(clock=nsqd, auto_skip=True) as loop:
        # False: pynsq REQs with its default delay (90 s times the attempts) and backs off
        app = Orders(lambda m: False, nsqd_tcp_addresses=[nsqd.tcp_addr], max_tries=3)
        pub(nsqd, "orders", b"order 3")
        loop.run_until(lambda: app.given_up, timeout=3600)
        assert [a for _, a in app.seen] == [1, 2, 3] and app.given_up == [b"order 3"]
        loop.wait_until(nsqd, "orders", "billing", depth=0, in_flight_count=0)  # given up: FINed
        app.close(loop)


def test_a_60s_timeout_redelivers(tmp_path):
    with Broker("--msg-timeout=60s", tmp_dir=str(tmp_path)) as nsqd, \
            TornadoLoop(clock=nsqd, auto_skip=True) as loop:
        app = Orders(lambda m: "async" if m.attempts == 1 else True, nsqd_tcp_addresses=[nsqd.tcp_addr])
        pub(nsqd, "orders", b"order 4")
        loop.run_until(lambda: len(app.seen) == 2, timeout=120)
        assert 59.9 <= app.at[1] - app.at[0] < 61  # (the first was handled a moment after the broker sent it)
        assert app.seen == [(b"order 4", 1), (b"order 4", 2)]
        loop.wait_until(nsqd, "orders", "billing", timeout_count=1, depth=0, in_flight_count=0)
        app.close(loop)


def test_a_1h_dpub_and_run_for_stops_at_its_end(tmp_path):
    with Broker(tmp_dir=str(tmp_path)) as nsqd, TornadoLoop(clock=nsqd, auto_skip=True) as loop:
        app = Orders(nsqd_tcp_addresses=[nsqd.tcp_addr])
        loop.run_until(lambda: app.reader.conns)
        conns = list(app.reader.conns.values())
        before = loop.time()
        pub(nsqd, "orders", b"order 5", defer_ms=3600 * 1000)
        assert 1799 <= loop.run_for(1800) < 1801  # nothing yet after half an hour
        assert app.seen == []
        loop.run_until(lambda: app.seen, timeout=3600)
        assert 3600 <= app.at[0] - before < 3601
        # An hour with nothing to deliver, and pynsq never found its connection silent for a minute:
        # each skip past a heartbeat brought it, read before pynsq's own timers ran
        assert list(app.reader.conns.values()) == conns
        app.close(loop)


def test_pynsq_redials_after_a_cut_on_its_own_15s_timer(tmp_path):
    with Broker(tmp_dir=str(tmp_path)) as nsqd, FaultProxy(nsqd.tcp_address) as proxy, \
            TornadoLoop(clock=nsqd, auto_skip=True, proxies=[proxy]) as loop:
        app = Orders(nsqd_tcp_addresses=[proxy.addr])
        loop.run_until(lambda: app.reader.conns)
        proxy.cut()  # the connection reset; new ones refused
        loop.run_until(lambda: not app.reader.conns)
        cut_at = loop.time()
        proxy.heal()
        loop.run_until(lambda: app.reader.conns, timeout=60)
        assert 14.5 <= loop.time() - cut_at < 16  # pynsq's 15 s redial, on the clock (cut_at is read a moment after the close)
        pub(nsqd, "orders", b"order 6")
        loop.run_until(lambda: app.seen)
        app.close(loop)


def test_backoff_then_recovery(tmp_path):
    with Broker(tmp_dir=str(tmp_path)) as nsqd, TornadoLoop(clock=nsqd, auto_skip=True) as loop:
        outcomes = iter([False, False, True, True, True])
        finished = []

        def answer(message):
            ok = next(outcomes)
            if ok:
                finished.append(message.body)
            return ok

        app = Orders(answer, nsqd_tcp_addresses=[nsqd.tcp_addr], max_tries=10)
        for n in range(3):
            pub(nsqd, "orders", b"order %d" % n)
        loop.run_until(lambda: len(finished) == 3, timeout=3600)  # through pynsq's backoff, on the clock
        assert len(app.seen) == 5
        loop.run_until(lambda: not app.reader.backoff_block, timeout=3600)  # recovered
        loop.wait_until(nsqd, "orders", "billing", depth=0, in_flight_count=0, deferred_count=0)
        app.close(loop)


def test_two_brokers_read_through_lookupd(tmp_path):
    with Cluster(2, tmp_dir=str(tmp_path)) as cluster, TornadoLoop(clock=cluster, auto_skip=True) as loop:
        for i, broker in enumerate(cluster):
            pub(broker, "orders", b"order from %d" % i)
        app = Orders(lookupd_http_addresses=[cluster.lookupd.http_url], lookupd_poll_interval=60)
        loop.run_until(lambda: len(app.seen) == 2, timeout=120)
        assert sorted(b for b, _ in app.seen) == [b"order from 0", b"order from 1"]
        app.close(loop)


def test_auto_skip_never_jumps_past_the_waiting_methods_end(tmp_path):
    with Broker("--msg-timeout=60s", tmp_dir=str(tmp_path)) as nsqd, \
            TornadoLoop(clock=nsqd, auto_skip=True) as loop:
        app = Orders(lambda m: "async", nsqd_tcp_addresses=[nsqd.tcp_addr])
        pub(nsqd, "orders", b"held")
        loop.run_until(lambda: app.seen)
        start = loop.time()
        assert 29 <= loop.run_for(29) < 29.5
        assert len(app.seen) == 1  # the timeout at 60 s has not come
        with pytest.raises(TimeoutError, match="auto-skips"):
            loop.run_until(lambda: len(app.seen) == 3, timeout=10)  # one more at 60 s, never a third by 39 s
        assert 39 <= loop.time() - start < 40
        app.close(loop)


def test_without_auto_skip_the_clock_moves_only_when_told(tmp_path):
    with Broker(tmp_dir=str(tmp_path)) as nsqd, TornadoLoop(clock=nsqd) as loop:
        app = Orders(lambda m: ("req", 30) if m.attempts == 1 else True, nsqd_tcp_addresses=[nsqd.tcp_addr])
        pub(nsqd, "orders", b"order 7")
        loop.run_until(lambda: app.seen)
        loop.run_until(lambda: nsqd.stats(topic="orders")["topics"][0]["channels"][0]["requeue_count"] == 1)
        assert 0 < loop.advance() <= 30  # to the next deadline: pynsq's RDY check (5 s) comes first
        assert len(app.seen) == 1
        assert loop.advance(30) == 30  # past the REQ's due time: it comes back on the loop's next run
        loop.run_until(lambda: len(app.seen) == 2)
        app.close(loop)


def test_broker_wait_until_says_it_starves_the_loop(tmp_path):
    with Broker(tmp_dir=str(tmp_path)) as nsqd, TornadoLoop(clock=nsqd) as loop:
        Orders(nsqd_tcp_addresses=[nsqd.tcp_addr])
        with pytest.raises(TimeoutError, match="loop.wait_until"):
            nsqd.wait_until("orders", "billing", timeout=0.2)  # the Reader never ran: it never subscribed
        loop.run_until(lambda: True)


def test_run_until_idle_stops_where_a_jump_would_be(tmp_path):
    with Broker(tmp_dir=str(tmp_path)) as nsqd, TornadoLoop(clock=nsqd, auto_skip=True) as loop:
        app = Orders(nsqd_tcp_addresses=[nsqd.tcp_addr])
        pub(nsqd, "orders", b"order 8")
        before = loop.time()
        assert loop.run_until_idle() is True  # connected, subscribed, handled and FINed: then idle
        assert app.seen == [(b"order 8", 1)]
        assert loop.time() - before < 5  # and the clock was not moved
        app.close(loop)


def test_a_broker_process_as_the_clock(tmp_path):
    with BrokerProcess(tmp_dir=str(tmp_path)) as nsqd, TornadoLoop(clock=nsqd, auto_skip=True) as loop:
        app = Orders(nsqd_tcp_addresses=[nsqd.tcp_addr])
        loop.run_until(lambda: app.reader.conns)
        before = loop.time()
        pub(nsqd, "orders", b"in an hour", defer_ms=3600 * 1000)
        loop.run_until(lambda: app.seen, timeout=7200)  # the child's clock skipped over HTTP, the loop's with it
        assert 3600 <= app.at[0] - before < 3610
        # skipped, not waited: the hour's 720 stops at pynsq's 5 s RDY timer each ask the child over
        # HTTP whether it is at rest, which takes real seconds on a loaded host
        assert nsqd.now() - time.time() > 3000
        app.close(loop)


def test_a_periodic_callback_runs_once_a_period_of_the_clock(tmp_path):
    from tornado.ioloop import PeriodicCallback

    with Broker(tmp_dir=str(tmp_path)) as nsqd, TornadoLoop(clock=nsqd, auto_skip=True) as loop:
        runs = []
        ticker = PeriodicCallback(lambda: runs.append(loop.time()), 5000)  # pynsq's RDY redistribution's period
        ticker.start()
        start = loop.time()
        loop.run_for(3602)  # (not 3600: whether a run due at the very end comes first is tornado's to say)
        ticker.stop()
        assert len(runs) == 720  # once every 5 s of the clock through a skipped hour (not at 5, 15, 30... s)
        gaps = [b - a for a, b in zip([start] + runs, runs)]
        # (real time passes on the clock too: a run that a loaded machine delays makes its gap longer
        # and the next one shorter, by that delay; a run twice or none in a period is a gap near 0 or 10)
        assert all(4.0 < gap < 6.0 for gap in gaps), [g for g in gaps if not 4.9 < g < 5.1][:10]
        assert 4.99 < sorted(gaps)[len(gaps) // 2] < 5.01, gaps[:10]

