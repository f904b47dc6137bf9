"""Delivery policies (not in Go nsqd; docs/policies.md) over real sockets: max attempts reached by REQ
and by timeout, message TTL, the dead-letter topic getting the same body, dropping without one, the
broker-wide defaults and their pattern, a broker without a policy delivering as before, and how a
policy combines with pynsq's own max_tries."""

import pytest

from nsqd_threaded.broker.policy import MOVING_MAX

from support.http_api import HTTP
from support.pynsq import Loop
from support.wire import Conn, wait_for

pytestmark = pytest.mark.timeout(60)


def set_policy(nsqd, topic, channel, **fields):
    h = HTTP(nsqd)
    try:
        if nsqd.get_existing_topic(topic) is None:
            assert h.post("/topic/create?topic=%s" % topic).status == 200
        assert h.post("/channel/create?topic=%s&channel=%s" % (topic, channel)).status == 200
        query = "".join("&%s=%s" % kv for kv in fields.items())
        r = h.post("/channel/policy?topic=%s&channel=%s%s" % (topic, channel, query))
        assert r.status == 200, r
    finally:
        h.close()


def channel_stats(nsqd, topic, channel):
    h = HTTP(nsqd)
    try:
        [t] = h.stats(topic=topic)["topics"]
        [c] = [c for c in t["channels"] if c["channel_name"] == channel]
        return c
    finally:
        h.close()


def req(conn, msg, delay_ms=0):
    conn.cmd(b"REQ %s %d" % (msg[2], delay_ms))


def test_max_attempts_by_req_moves_the_message_to_the_dead_letter_topic(make_nsqd):
    nsqd = make_nsqd()
    set_policy(nsqd, "orders", "work", max_attempts=3, dead_letter_topic="orders.dead")
    set_policy(nsqd, "orders.dead", "inspect")
    with Conn(nsqd.tcp_address) as pub, Conn(nsqd.tcp_address) as sub, Conn(nsqd.tcp_address) as dead:
        dead.sub("orders.dead", "inspect", rdy=10)
        sub.sub("orders", "work", rdy=10)
        assert pub.pub("orders", b"poison \x00\xff body") == b"OK"
        assert pub.pub("orders", b"fine") == b"OK"
        seen = []
        while len(seen) < 4:
            msg = sub.read_message()
            seen.append((msg[1], msg[3]))
            if msg[3] == b"fine":
                sub.cmd(b"FIN " + msg[2])
            else:
                req(sub, msg)
        assert [a for a, body in seen if body != b"fine"] == [1, 2, 3]  # delivered max_attempts times
        ts, attempts, _, body = dead.read_message()
        assert (attempts, body) == (1, b"poison \x00\xff body")  # the same body, a new message
        sub.assert_silent(0.3)
        dead.assert_silent(0.1)
    doc = channel_stats(nsqd, "orders", "work")
    assert (doc["dead_letter_count"], doc["expired_count"], doc["depth"], doc["in_flight_count"]) == (1, 0, 0, 0)
    assert doc["requeue_count"] == 3


def test_max_attempts_by_timeout(make_nsqd):
    nsqd = make_nsqd(msg_timeout=0.1)
    set_policy(nsqd, "t", "c", max_attempts=2, dead_letter_topic="t.dead")
    set_policy(nsqd, "t.dead", "d")
    with Conn(nsqd.tcp_address) as pub, Conn(nsqd.tcp_address) as sub, Conn(nsqd.tcp_address) as dead:
        dead.sub("t.dead", "d", rdy=1)
        sub.sub("t", "c", rdy=1)
        assert pub.pub("t", b"slow") == b"OK"
        assert [sub.read_message()[1] for _ in range(2)] == [1, 2]  # never FINed: each times out
        assert dead.read_message()[3] == b"slow"
        sub.assert_silent(0.4)
    doc = channel_stats(nsqd, "t", "c")
    assert doc["dead_letter_count"] == 1 and doc["timeout_count"] >= 2 and doc["in_flight_count"] == 0


def test_without_a_dead_letter_topic_the_message_is_dropped(make_nsqd):
    nsqd = make_nsqd()
    set_policy(nsqd, "t", "c", max_attempts=1)
    set_policy(nsqd, "t", "other")  # (a channel without a policy)
    with Conn(nsqd.tcp_address) as pub, Conn(nsqd.tcp_address) as sub:
        sub.sub("t", "c", rdy=5)
        assert pub.mpub("t", [b"a", b"b"]) == b"OK"
        for _ in range(2):
            req(sub, sub.read_message())
        wait_for(lambda: channel_stats(nsqd, "t", "c")["dead_letter_count"] == 2, what="both dropped")
        sub.assert_silent(0.3)
        doc = channel_stats(nsqd, "t", "c")
        assert (doc["depth"], doc["in_flight_count"], doc["deferred_count"]) == (0, 0, 0)
        assert [t.name for t in nsqd.topics()] == ["t"]  # no dead-letter topic was made
        # Another channel of the topic, without a policy, still has both.
        assert channel_stats(nsqd, "t", "other")["depth"] == 2


def test_msg_ttl_expires_a_deferred_message_and_a_slow_requeue(make_nsqd):
    nsqd = make_nsqd()
    set_policy(nsqd, "t", "c", msg_ttl="150ms", dead_letter_topic="t.expired")
    set_policy(nsqd, "t.expired", "d")
    with Conn(nsqd.tcp_address) as pub, Conn(nsqd.tcp_address) as sub, Conn(nsqd.tcp_address) as dead:
        dead.sub("t.expired", "d", rdy=10)
        sub.sub("t", "c", rdy=10)
        pub.cmd(b"DPUB t 400", b"late")  # due after its TTL: never delivered
        assert pub.read_response() == b"OK"
        assert pub.pub("t", b"fresh") == b"OK"
        msg = sub.read_message()
        assert msg[3] == b"fresh"
        req(sub, msg, 400)  # back after its TTL: not delivered again
        got = sorted(dead.read_message()[3] for _ in range(2))
        assert got == [b"fresh", b"late"]
        sub.assert_silent(0.3)
    doc = channel_stats(nsqd, "t", "c")
    assert (doc["expired_count"], doc["dead_letter_count"], doc["msg_ttl"]) == (2, 0, 150)


def test_the_broker_defaults_and_the_dead_letter_pattern(make_nsqd):
    nsqd = make_nsqd(max_attempts=1, dead_letter_topic="{topic}-dlq")
    with Conn(nsqd.tcp_address) as pub, Conn(nsqd.tcp_address) as sub, Conn(nsqd.tcp_address) as dead:
        dead.sub("orders-dlq", "d", rdy=10)
        sub.sub("orders", "c", rdy=10)
        assert pub.pub("orders", b"once") == b"OK"
        req(sub, sub.read_message())
        # The dead-letter topic is no subject of the defaults: its messages are delivered again and again.
        msg = dead.read_message()
        assert msg[3] == b"once"
        for attempt in (2, 3):
            req(dead, msg)
            msg = dead.read_message()
            assert (msg[1], msg[3]) == (attempt, b"once")
        sub.assert_silent(0.2)
    assert channel_stats(nsqd, "orders", "c")["dead_letter_topic"] == "orders-dlq"
    assert "max_attempts" not in channel_stats(nsqd, "orders-dlq", "d")


def test_a_channel_policy_overrides_the_defaults(make_nsqd):
    nsqd = make_nsqd(max_attempts=1)
    set_policy(nsqd, "t", "patient", max_attempts=3)
    with Conn(nsqd.tcp_address) as pub, Conn(nsqd.tcp_address) as patient, Conn(nsqd.tcp_address) as hasty:
        patient.sub("t", "patient", rdy=1)
        hasty.sub("t", "hasty", rdy=1)
        assert pub.pub("t", b"m") == b"OK"
        attempts = []
        for _ in range(3):
            msg = patient.read_message()
            attempts.append(msg[1])
            req(patient, msg)
        req(hasty, hasty.read_message())
        patient.assert_silent(0.3)
        hasty.assert_silent(0.1)
    assert attempts == [1, 2, 3]
    assert channel_stats(nsqd, "t", "hasty")["dead_letter_count"] == 1
    assert channel_stats(nsqd, "t", "patient")["dead_letter_count"] == 1


def test_without_a_policy_nothing_changes(make_nsqd):
    nsqd = make_nsqd()
    with Conn(nsqd.tcp_address) as pub, Conn(nsqd.tcp_address) as sub:
        sub.sub("t", "c", rdy=1)
        assert pub.pub("t", b"m") == b"OK"
        for attempt in range(1, 8):
            msg = sub.read_message()
            assert msg[1] == attempt
            req(sub, msg)
        assert sub.read_message()[1] == 8
    assert nsqd.get_existing_topic("t").get_existing_channel("c").policy is None
    assert "dead_letter_count" not in channel_stats(nsqd, "t", "c")


def test_removing_the_policy_delivers_again(make_nsqd):
    nsqd = make_nsqd()
    set_policy(nsqd, "t", "c", max_attempts=1)
    with Conn(nsqd.tcp_address) as pub, Conn(nsqd.tcp_address) as sub:
        sub.sub("t", "c", rdy=5)
        assert pub.pub("t", b"first") == b"OK"
        req(sub, sub.read_message())
        channel = nsqd.get_existing_topic("t").get_existing_channel("c")
        # (Taken out, then dropped by the scanner's next visit: a policy removed before that returns it.)
        wait_for(lambda: channel.policy.dead_letter_count == 1 and not channel.policy.moving, what="dropped")
        set_policy(nsqd, "t", "c", max_attempts=0)
        assert pub.pub("t", b"second") == b"OK"
        msg = sub.read_message()
        req(sub, msg)
        assert sub.read_message()[1:] == (2, msg[2], b"second")


@pytest.mark.parametrize("max_tries, dead_lettered", [(5, True), (2, False)])
def test_with_pynsq_max_tries(make_nsqd, max_tries, dead_lettered):
    """The broker's max attempts (3) below the client's max_tries: the broker moves the message
    after the third delivery and the client never gives up.  Above it: the client gives up first
    (pynsq FINs the third delivery unhandled) and the broker has nothing to move."""
    nsqd = make_nsqd()
    set_policy(nsqd, "jobs", "work", max_attempts=3, dead_letter_topic="jobs.dead")
    set_policy(nsqd, "jobs.dead", "d")
    address = "%s:%d" % nsqd.tcp_address
    handled, dead = [], []

    def handler(msg):
        msg.enable_async()
        handled.append(msg.attempts)
        msg.requeue(delay=0, backoff=False)

    loop = Loop()
    try:
        reader = loop.reader(address, "jobs", "work", handler, max_tries=max_tries)
        given_up = []
        reader.giving_up = lambda msg: given_up.append(msg.attempts)
        loop.reader(address, "jobs.dead", "d", lambda msg: dead.append(msg.body) or True)
        w = loop.writer(address)
        loop.wait_writers_connected()
        loop.publish(w, "jobs", [b"job"])
        if dead_lettered:
            loop.run_until(lambda: dead, 30, "the dead letter")
            assert handled == [1, 2, 3] and not given_up and dead == [b"job"]
        else:
            loop.run_until(lambda: given_up, 30, "pynsq giving up")
            assert handled == [1, 2] and given_up == [3]
        loop.run_for(0.3)
        assert len(dead) == int(dead_lettered)
    finally:
        loop.close()
    assert channel_stats(nsqd, "jobs", "work")["dead_letter_count"] == int(dead_lettered)


def test_a_large_expired_backlog_moves_in_batches_and_delivery_resumes(make_nsqd):
    """More expired messages than one move takes (MOVING_MAX): the consumer waits between the
    scanner's moves, is woken by each, and gets the fresh message published after them."""
    n = MOVING_MAX * 2 + 500
    nsqd = make_nsqd()
    set_policy(nsqd, "t", "c", msg_ttl="50ms", dead_letter_topic="t-dlq")
    set_policy(nsqd, "t-dlq", "d")
    with Conn(nsqd.tcp_address) as pub, Conn(nsqd.tcp_address) as clock:
        clock.sub("clock", "c", rdy=1)
        assert pub.mpub("t", [b"old-%05d" % i for i in range(n)]) == b"OK"
        pub.cmd(b"DPUB clock 100", b"tick")
        assert pub.read_response() == b"OK"
        clock.read_message()  # 100 ms later: every message of the backlog is past its TTL
    with Conn(nsqd.tcp_address) as pub, Conn(nsqd.tcp_address) as sub, Conn(nsqd.tcp_address) as dead:
        dead.sub("t-dlq", "d", rdy=2500)
        sub.sub("t", "c", rdy=2500)
        seen = 0
        while seen < n:
            msg = dead.read_message()
            dead.cmd(b"FIN " + msg[2])
            seen += 1
        assert pub.pub("t", b"fresh") == b"OK"
        assert sub.read_message()[3] == b"fresh"
    assert channel_stats(nsqd, "t", "c")["expired_count"] == n
