"""Time skipping: a test moves a broker's clock forward (Broker.advance, BrokerProcess.advance and
POST /debug/time/skip) and what fell due happens at once, at nsqd's default durations."""

import json
import os
import threading
import time

import pytest

from nsqd_threaded.internal.clock import Clock, TimeSkippingDisabled, parse_skip_ns
from nsqd_threaded.testing import Broker, BrokerProcess
from nsqd_threaded.wire import protocol_v2

from support.wire import Conn, wait_for

pytestmark = pytest.mark.timeout(120)

# Each read waits at most this long: far less than the durations skipped (60 s, 30 s, 1 h),
# so a test fails if advance() did not make the message due.
READ_TIMEOUT = 10.0


def consumer(broker, topic, channel="c", rdy=10, **identify):
    conn = Conn(broker.tcp_address, timeout=READ_TIMEOUT)
    conn.identify(**identify)
    conn.sub(topic, channel, rdy)
    return conn


def dpub(conn, topic, delay_ms, body):
    conn.cmd(b"DPUB %s %d" % (topic.encode(), delay_ms), body)
    return conn.read_response()


def channel_stats(broker, topic, channel="c"):
    for t in broker.stats()["topics"]:
        if t["topic_name"] == topic:
            for c in t["channels"]:
                if c["channel_name"] == channel:
                    return c
    raise AssertionError("no channel %s:%s in /stats" % (topic, channel))


# -- the clock ----------------------------------------------------------------------------


def test_clock_without_skipping_is_the_time_module():
    clock = Clock()
    assert clock.time_ns is time.time_ns and clock.monotonic is time.monotonic and clock.time is time.time
    with pytest.raises(TimeSkippingDisabled):
        clock.skip(1)


def test_clock_skips_forward_only():
    clock = Clock(skipping=True)
    before = time.time_ns()
    assert clock.skip(3600) == 1
    assert clock.time_ns() - before >= 3600 * 10**9
    assert clock.monotonic() - time.monotonic() >= 3599.9
    assert clock.skipped == 3600.0
    with pytest.raises(ValueError):
        clock.skip(-1)
    assert parse_skip_ns("1m1s") == 61 * 10**9
    with pytest.raises(ValueError):
        parse_skip_ns("-1s")


# -- in-process Broker, at nsqd's default flags -------------------------------------------


def test_msg_timeout_redelivery_at_the_default_60s():
    with Broker() as nsqd:
        with consumer(nsqd, "t") as sub, Conn(nsqd.tcp_address) as pub:
            assert pub.pub("t", b"work") == b"OK"
            ts, attempts, msg_id, body = sub.read_message()
            assert (attempts, body) == (1, b"work")
            skipped = nsqd.advance()  # to the timeout: 60 s of the clock
            assert 59.0 < skipped <= 60.0
            ts2, attempts, msg_id2, body = sub.read_message()
            assert (msg_id2, attempts, body, ts2) == (msg_id, 2, b"work", ts)
            assert channel_stats(nsqd, "t")["timeout_count"] == 1
            sub.cmd(b"FIN " + msg_id)
            wait_for(lambda: channel_stats(nsqd, "t")["in_flight_count"] == 0, what="the FIN")
            assert nsqd.advance() == 0.0


def test_advance_by_seconds_redelivers_a_timed_out_message():
    with Broker() as nsqd:
        with consumer(nsqd, "t") as sub, Conn(nsqd.tcp_address) as pub:
            assert pub.pub("t", b"work") == b"OK"
            assert sub.read_message()[1] == 1
            assert nsqd.advance(61) == 61
            assert sub.read_message()[1] == 2


def test_req_with_the_default_maximum_30s_delay():
    with Broker() as nsqd:
        with consumer(nsqd, "t") as sub, Conn(nsqd.tcp_address) as pub:
            assert pub.pub("t", b"again") == b"OK"
            _, _, msg_id, _ = sub.read_message()
            sub.cmd(b"REQ %s 30000" % msg_id)
            sub.cmd(b"NOP")  # (REQ answers nothing; NOP neither: this just orders the commands)
            wait_for(lambda: channel_stats(nsqd, "t")["deferred_count"] == 1, what="the REQ")
            skipped = nsqd.advance()
            assert 29.0 < skipped <= 30.0
            _, attempts, msg_id2, body = sub.read_message()
            assert (msg_id2, attempts, body) == (msg_id, 2, b"again")


def test_dpub_of_an_hour():
    with Broker() as nsqd:
        with consumer(nsqd, "t") as sub, Conn(nsqd.tcp_address) as pub:
            assert dpub(pub, "t", 3600000, b"later") == b"OK"
            assert channel_stats(nsqd, "t")["deferred_count"] == 1
            skipped = nsqd.advance()
            assert 3599.0 < skipped <= 3600.0
            _, attempts, msg_id, body = sub.read_message()
            assert (attempts, body) == (1, b"later")
            sub.cmd(b"FIN " + msg_id)
            assert pub.pub("t", b"x") == b"OK"  # (orders: the FIN is read before this answer)
            sub.read_message()


def test_a_skip_wakes_the_queue_scanner():
    # A scan interval of an hour: only the skip's notify on Clock.moved can make the scanner look now
    # (advance waits ADVANCE_SCAN_TIMEOUT, longer than the read, for the scanner's pass).
    with Broker(queue_scan_interval=3600) as nsqd:
        with consumer(nsqd, "t") as sub, Conn(nsqd.tcp_address) as pub:
            assert dpub(pub, "t", 60000, b"soon") == b"OK"
            skipped = []
            advancing = threading.Thread(target=lambda: skipped.append(nsqd.advance()), name="test-advance",
                                         daemon=True)
            advancing.start()
            try:
                assert sub.read_message()[3] == b"soon"  # (READ_TIMEOUT < ADVANCE_SCAN_TIMEOUT)
            finally:
                advancing.join(60)  # (advance waits ADVANCE_SCAN_TIMEOUT at most)
            assert 59.0 < skipped[0] <= 60.0


def test_advance_returns_0_when_nothing_is_pending():
    with Broker() as nsqd:
        assert nsqd.advance() == 0.0
        assert nsqd.next_deadline_in() is None
        with Conn(nsqd.tcp_address) as pub:
            assert pub.pub("t", b"queued, nobody consuming") == b"OK"
        assert nsqd.advance() == 0.0


def test_a_short_advance_leaves_a_later_deadline_pending():
    with Broker() as nsqd:
        with consumer(nsqd, "t") as sub, Conn(nsqd.tcp_address) as pub:
            assert dpub(pub, "t", 3600000, b"later") == b"OK"
            assert nsqd.advance(1800) == 1800
            assert 1799.0 < nsqd.next_deadline_in() <= 1800.0
            assert sub.read_raw_frame() == protocol_v2.HEARTBEAT_FRAME  # what the skipped half hour brought
            sub.cmd(b"NOP")
            sub.assert_silent(0.2)  # and no message
            assert 1799.0 < nsqd.advance() <= 1800.0
            assert sub.read_message()[3] == b"later"


def test_a_skip_does_not_disconnect_a_client_with_heartbeats():
    with Broker() as nsqd:
        with consumer(nsqd, "t", heartbeat_interval=1000) as sub, Conn(nsqd.tcp_address) as pub:
            pub.identify(heartbeat_interval=1000)
            for _ in range(3):
                nsqd.advance(3600)  # heartbeats and read deadlines stay on real time
            assert pub.pub("t", b"still here") == b"OK"
            assert sub.read_message()[3] == b"still here"
            assert len(nsqd.nsqd.clients()) == 2


@pytest.mark.parametrize("args", [(), ("--connection-threads",)], ids=["poller", "threads"])
def test_a_skip_brings_each_client_a_heartbeat_at_once(args):
    """A client whose own timers run on the skipped clock (pynsq closes a connection silent for two of
    its intervals) hears from the broker right after each skip, as the skipped time would have brought:
    a heartbeat, before advance() returns (the intervals are a minute: none comes on its own)."""
    with Broker(*args) as nsqd:
        with consumer(nsqd, "t", heartbeat_interval=60 * 1000) as sub, Conn(nsqd.tcp_address) as pub:
            pub.identify(heartbeat_interval=60 * 1000)
            for conn in (sub, pub):
                conn.sock.settimeout(0.5)
                with pytest.raises(OSError):  # (socket.timeout): nothing before the skip
                    conn.read_raw_frame()
            for _ in range(2):
                nsqd.advance(60)
                for conn in (sub, pub):
                    conn.sock.setblocking(False)  # already there: written before advance() returned
                    assert conn.read_raw_frame() == protocol_v2.HEARTBEAT_FRAME
                    conn.sock.settimeout(READ_TIMEOUT)
                    conn.cmd(b"NOP")
            assert pub.pub("t", b"still here") == b"OK"
            assert sub.read_message()[3] == b"still here"


def test_timestamps_and_e2e_latency_follow_the_skipped_clock():
    with Broker(e2e_processing_latency_percentiles=[1.0]) as nsqd:
        with consumer(nsqd, "t") as sub, Conn(nsqd.tcp_address) as pub:
            nsqd.advance(3600)
            assert pub.pub("t", b"stamped") == b"OK"
            ts, _, msg_id, _ = sub.read_message()
            assert ts - time.time_ns() > 3599 * 10**9  # the wire's timestamp is the broker's clock
            nsqd.advance(100)
            sub.cmd(b"FIN " + msg_id)
            assert pub.pub("t", b"x") == b"OK"
            sub.read_message()
            e2e = wait_for(lambda: channel_stats(nsqd, "t")["e2e_processing_latency"]["count"]
                           and channel_stats(nsqd, "t")["e2e_processing_latency"], what="an e2e sample")
            assert e2e["percentiles"][0]["value"] >= 100 * 10**9


def test_advance_without_time_skipping_raises():
    with Broker(time_skipping=False) as nsqd:
        with pytest.raises(TimeSkippingDisabled):
            nsqd.advance(1)
        with pytest.raises(TimeSkippingDisabled):
            nsqd.advance()


# -- the HTTP route ---------------------------------------------------------------------------


def test_http_skip_route():
    with Broker() as nsqd:
        with consumer(nsqd, "t") as sub:
            status, _ = nsqd.http("POST", "/pub?topic=t&defer=61000", b"deferred")
            assert status == 200
            status, body = nsqd.http("GET", "/debug/time")
            assert status == 200 and 60.0 < json.loads(body)["next_deadline_in"] <= 61.0
            status, body = nsqd.http("POST", "/debug/time/skip?by=1m1s")
            assert status == 200
            doc = json.loads(body)
            assert doc["skipped"] == 61 and doc["total_skipped"] == 61
            assert doc["now_ns"] - time.time_ns() > 60 * 10**9
            _, _, msg_id, body = sub.read_message()
            assert body == b"deferred"
            status, body = nsqd.http("POST", "/debug/time/skip")  # to the in-flight message's timeout
            assert status == 200 and 59.0 < json.loads(body)["skipped"] <= 60.0
            _, attempts, msg_id, _ = sub.read_message()
            assert attempts == 2
            sub.cmd(b"FIN " + msg_id)
            wait_for(lambda: channel_stats(nsqd, "t")["in_flight_count"] == 0, what="the FIN")
            status, body = nsqd.http("POST", "/debug/time/skip")  # nothing pending
            assert status == 200 and json.loads(body)["skipped"] == 0
            assert nsqd.http("POST", "/debug/time/skip?by=-1s") == (400, b'{"message":"INVALID_BY"}')
            assert nsqd.http("POST", "/debug/time/skip?by=soon") == (400, b'{"message":"INVALID_BY"}')
            assert nsqd.http("GET", "/debug/time/skip")[0] == 405


def test_http_skip_route_is_404_without_the_flag():
    with Broker(time_skipping=False) as nsqd:
        assert nsqd.http("POST", "/debug/time/skip?by=61s")[0] == 404
        assert nsqd.http("GET", "/debug/time")[0] == 404


# -- BrokerProcess ------------------------------------------------------------------------------


def test_broker_process_advance_over_http():
    with BrokerProcess() as nsqd:
        with consumer(nsqd, "t") as sub, Conn(nsqd.tcp_address) as pub:
            assert dpub(pub, "t", 3600000, b"later") == b"OK"
            assert 3599.0 < nsqd.next_deadline_in() <= 3600.0
            assert 3599.0 < nsqd.advance() <= 3600.0
            assert sub.read_message()[3] == b"later"
            assert nsqd.advance(61) == 61


def test_broker_process_without_time_skipping_cannot_advance():
    with BrokerProcess(time_skipping=False) as nsqd:
        with pytest.raises(RuntimeError, match="cannot skip time"):
            nsqd.advance(1)


def test_broker_process_of_go_nsqd_cannot_advance():
    from support.delivery import GO_NSQD

    if not GO_NSQD or not os.path.exists(GO_NSQD):
        pytest.skip("Go's nsqd binary is not available")
    with BrokerProcess(command=[GO_NSQD]) as nsqd:
        with pytest.raises(RuntimeError, match="cannot skip time"):
            nsqd.advance(1)



# -- pynsq ----------------------------------------------------------------------------------------


def test_pynsq_requeue_of_30s_and_redelivery_after_60s():
    from support.pynsq import Loop

    deliveries = []

    def handler(message):
        deliveries.append(message.attempts)
        if message.attempts == 1:
            message.enable_async()
            message.requeue(backoff=False, delay=30)  # REQ <id> 30000
        elif message.attempts == 2:
            message.enable_async()  # neither FIN nor REQ: the broker times it out (60 s)
        else:
            return True

    with Broker() as nsqd:
        loop = Loop()
        try:
            loop.reader(nsqd.tcp_addr, "t", "c", handler, max_in_flight=1)
            writer = loop.writer(nsqd.tcp_addr)
            loop.wait_writers_connected()
            loop.publish(writer, "t", [b"job"])
            loop.run_until(lambda: deliveries == [1], 10, "the first delivery")
            loop.run_until(lambda: channel_stats(nsqd, "t")["deferred_count"] == 1, 10, "the REQ")
            assert 29.0 < nsqd.advance() <= 30.0
            loop.run_until(lambda: deliveries == [1, 2], 10, "the redelivery after the REQ")
            assert 59.0 < nsqd.advance() <= 60.0
            loop.run_until(lambda: deliveries == [1, 2, 3], 10, "the redelivery after the timeout")
            loop.run_until(lambda: channel_stats(nsqd, "t")["in_flight_count"] == 0, 10, "the FIN")
            assert nsqd.advance() == 0.0
        finally:
            loop.close()
