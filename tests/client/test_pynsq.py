"""End to end through pynsq, the real Python client (Writer and Reader)."""

import time

import pytest

from support.pynsq import Loop


@pytest.fixture
def loop():
    lp = Loop()
    yield lp
    lp.close()


def addr(nsqd):
    return "%s:%d" % nsqd.tcp_address


def test_ten_thousand_messages_each_consumed_once(nsqd, loop):
    n = 10000
    bodies = [b"msg-%05d" % i for i in range(n)]
    seen = []
    loop.reader(addr(nsqd), "big", "c", lambda m: seen.append(m.body) or True, max_in_flight=250)
    w = loop.writer(addr(nsqd))
    loop.wait_writers_connected()
    # Half by MPUB, half by single PUBs.
    state = loop.publish(w, "big", bodies[: n // 2], batch=200)
    state2 = loop.publish(w, "big", bodies[n // 2 :], batch=1)
    loop.run_until(lambda: len(seen) >= n, 60, "10,000 messages")
    loop.run_for(0.3)
    assert not state["errors"] and not state2["errors"]
    assert sorted(seen) == bodies  # each exactly once
    channel = nsqd.get_existing_topic("big").get_existing_channel("c")
    assert channel.in_flight_count() == 0 and channel.depth() == 0


def test_requeue_redelivers_with_attempts_2(nsqd, loop):
    deliveries = []

    def handler(msg):
        msg.enable_async()
        deliveries.append((msg.id, msg.attempts, msg.body))
        if msg.attempts == 1:
            msg.requeue(delay=0, backoff=False)
        else:
            msg.finish()

    loop.reader(addr(nsqd), "rq", "c", handler)
    w = loop.writer(addr(nsqd))
    loop.wait_writers_connected()
    loop.publish(w, "rq", [b"again"])
    loop.run_until(lambda: len(deliveries) >= 2, 15, "redelivery")
    assert deliveries[0][1] == 1 and deliveries[1][1] == 2
    assert deliveries[0][0] == deliveries[1][0] and deliveries[1][2] == b"again"
    channel = nsqd.get_existing_topic("rq").get_existing_channel("c")
    assert channel.requeue_count == 1


def test_unfinished_message_comes_back_after_msg_timeout(nsqd, loop):
    deliveries = []

    def handler(msg):
        msg.enable_async()
        deliveries.append((time.monotonic(), msg.attempts))
        if msg.attempts >= 2:
            msg.finish()
        # first delivery: never answered

    loop.reader(addr(nsqd), "to", "c", handler, msg_timeout=1)  # pynsq takes seconds
    w = loop.writer(addr(nsqd))
    loop.wait_writers_connected()
    published = time.monotonic()
    loop.publish(w, "to", [b"slow"])
    loop.run_until(lambda: len(deliveries) >= 2, 15, "timeout redelivery")
    (t1, a1), (t2, a2) = deliveries[:2]
    assert (a1, a2) == (1, 2)
    # The timeout runs from the broker's delivery, which comes after the publish; the handler's own
    # time of the first delivery may lag it on a loaded machine (the loop runs it late), so the
    # bound is taken from the publish.
    assert t2 - published >= 0.9
    channel = nsqd.get_existing_topic("to").get_existing_channel("c")
    assert channel.timeout_count == 1


def test_dpub_arrives_no_earlier_than_its_delay(nsqd, loop):
    arrivals = []
    loop.reader(addr(nsqd), "dp", "c", lambda m: arrivals.append((time.monotonic(), m.body)) or True)
    w = loop.writer(addr(nsqd))
    loop.wait_writers_connected()
    # Make sure the channel exists before the deferred publish fans out.
    loop.run_until(lambda: nsqd.get_existing_topic("dp") is not None, 10, "topic")
    sent = time.monotonic()
    errors = []
    w.dpub("dp", 700, b"later", callback=lambda c, d: errors.append(d) if hasattr(d, "args") else None)
    loop.publish(w, "dp", [b"now"])
    loop.run_until(lambda: len(arrivals) >= 2, 15, "deferred message")
    bodies = [b for _, b in arrivals]
    assert bodies == [b"now", b"later"]
    assert arrivals[1][0] - sent >= 0.7
    assert not errors


def test_two_channels_each_get_every_message(nsqd, loop):
    a, b = [], []
    loop.reader(addr(nsqd), "fan", "a", lambda m: a.append(m.body) or True)
    loop.reader(addr(nsqd), "fan", "b", lambda m: b.append(m.body) or True)
    w = loop.writer(addr(nsqd))
    loop.wait_writers_connected()
    topic_ready = lambda: (  # noqa: E731
        nsqd.get_existing_topic("fan") is not None and len(nsqd.get_existing_topic("fan").channels()) == 2
    )
    loop.run_until(topic_ready, 10, "both channels")
    bodies = [b"f%d" % i for i in range(500)]
    loop.publish(w, "fan", bodies, batch=50)
    loop.run_until(lambda: len(a) >= 500 and len(b) >= 500, 30, "fan-out")
    assert sorted(a) == sorted(bodies) and sorted(b) == sorted(bodies)


def test_two_consumers_split_one_channel_without_duplicates(nsqd, loop):
    got1, got2 = [], []

    def slow(bucket):
        def handler(m):
            bucket.append(m.body)
            return True

        return handler

    loop.reader(addr(nsqd), "split", "c", slow(got1), max_in_flight=5)
    loop.reader(addr(nsqd), "split", "c", slow(got2), max_in_flight=5)
    w = loop.writer(addr(nsqd))
    loop.wait_writers_connected()

    def both_subscribed():
        t = nsqd.get_existing_topic("split")
        c = t and t.get_existing_channel("c")
        return c is not None and len(c.clients()) == 2 and all(cl.ready_count > 0 for cl in c.clients())

    loop.run_until(both_subscribed, 10, "two subscribed consumers")
    bodies = [b"s%d" % i for i in range(2000)]
    loop.publish(w, "split", bodies, batch=20)
    loop.run_until(lambda: len(got1) + len(got2) >= 2000, 30, "all messages")
    loop.run_for(0.3)
    assert sorted(got1 + got2) == sorted(bodies)
    assert got1 and got2, "both consumers should get a share"


# -- TLS and compression through pynsq -----------------------------------------

from support.transport import certs, tls_options  # noqa: E402,F401 (fixture)


@pytest.mark.parametrize(
    "features",
    [
        {"tls_v1": True},
        {"snappy": True},
        {"deflate": True, "deflate_level": 3},
        {"tls_v1": True, "snappy": True},
        {"tls_v1": True, "deflate": True},
    ],
    ids=["tls", "snappy", "deflate", "tls+snappy", "tls+deflate"],
)
def test_tls_and_compression(make_nsqd, certs, loop, features):
    import ssl

    pytest.importorskip("snappy")  # pynsq's snappy needs the snappy module (test extra python-snappy)
    nsqd = make_nsqd(**tls_options(certs))
    kwargs = dict(features)
    if features.get("tls_v1"):
        kwargs["tls_options"] = {"cert_reqs": ssl.CERT_REQUIRED, "ca_certs": certs.ca}
    n = 3000
    bodies = [(b"body-%05d-" % i) * (i % 40 + 1) for i in range(n)]
    seen = []
    loop.reader(addr(nsqd), "feat", "c", lambda m: seen.append(m.body) or True, max_in_flight=2500, **kwargs)
    import nsq

    w = nsq.Writer([addr(nsqd)], **kwargs)
    loop.writers.append(w)
    loop.wait_writers_connected()
    state = loop.publish(w, "feat", bodies[: n // 2], batch=500)
    state2 = loop.publish(w, "feat", bodies[n // 2 :], batch=1)
    loop.run_until(lambda: len(seen) >= n, 60, "messages")
    assert not state["errors"] and not state2["errors"]
    assert sorted(seen) == sorted(bodies)
    clients = nsqd.get_existing_topic("feat").get_existing_channel("c").clients()
    (client,) = clients
    assert client.tls == bool(features.get("tls_v1"))
    assert client.snappy == bool(features.get("snappy"))
    assert client.deflate == bool(features.get("deflate"))
