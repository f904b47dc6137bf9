"""Direct delivery: a publisher's thread writes a put of up to an MPUB batch to a waiting consumer itself.

What its users see must not change: each publisher's messages reach a
consumer in the order published, and a consumer that stops reading never
holds up a publisher (the publisher's write never blocks; the consumer's
pump writes the rest).
"""

import threading

import pytest

from support.wire import Conn

pytestmark = pytest.mark.timeout(90)


def test_each_publishers_messages_arrive_in_order_whichever_thread_writes_them(nsqd):
    """Four PUB publishers and an MPUB publisher of 100-message batches (delivered directly),
    and one of 600-message batches (taken by the pump), race into one channel with one
    consumer: every publisher's sequence arrives in order."""
    per_publisher, batches, batch = 300, 6, 100
    large_batches, large = 2, 600
    total = 4 * per_publisher + batches * batch + large_batches * large
    got = []
    with Conn(nsqd.tcp_address) as sub:
        sub.sub("order", "c", rdy=40)

        def publish_one_at_a_time(tag):
            with Conn(nsqd.tcp_address) as pub:
                for i in range(per_publisher):
                    assert pub.pub("order", b"%s %06d" % (tag, i)) == b"OK"

        def publish_batches():
            with Conn(nsqd.tcp_address) as pub:
                for b in range(batches):
                    assert pub.mpub("order", [b"M %06d" % (b * batch + i) for i in range(batch)]) == b"OK"

        def publish_large_batches():
            with Conn(nsqd.tcp_address) as pub:
                for b in range(large_batches):
                    assert pub.mpub("order", [b"L %06d" % (b * large + i) for i in range(large)]) == b"OK"

        threads = [threading.Thread(target=publish_one_at_a_time, args=(b"P%d" % n,), name="test-publisher-%d" % n,
                                    daemon=True) for n in range(4)]
        threads.append(threading.Thread(target=publish_batches, name="test-batch-publisher", daemon=True))
        threads.append(threading.Thread(target=publish_large_batches, name="test-large-batch-publisher", daemon=True))
        for t in threads:
            t.start()
        try:
            while len(got) < total:
                _, attempts, mid, body = sub.read_message()
                assert attempts == 1
                got.append(body)
                sub.cmd(b"FIN " + mid)
        finally:
            for t in threads:
                t.join(30)
        sub.assert_silent(0.3)
    by_tag = {}
    for body in got:
        tag, seq = body.split()
        by_tag.setdefault(tag, []).append(int(seq))
    assert sorted(by_tag) == [b"L", b"M", b"P0", b"P1", b"P2", b"P3"]
    for tag, seqs in by_tag.items():
        assert seqs == sorted(seqs) == list(range(len(seqs))), tag


def test_a_consumer_that_stops_reading_never_holds_up_a_publisher(nsqd):
    """20 MB for a consumer that reads nothing (far more than both socket buffers hold):
    every PUB is still answered; the consumer then gets every message, in order."""
    count, body = 2000, b"x" * 10000
    with Conn(nsqd.tcp_address) as sub:
        sub.identify(msg_timeout=120000)
        sub.sub("stalled", "c", rdy=2500)
        with Conn(nsqd.tcp_address) as pub:  # (each read of an answer is bounded: 10 s)
            for i in range(count):
                assert pub.pub("stalled", b"%06d" % i + body) == b"OK"
        for i in range(count):
            _, attempts, _, got = sub.read_message()
            assert (got[:6], attempts) == (b"%06d" % i, 1)


def test_mpub_batches_to_consumers_that_stop_reading_never_hold_up_the_publisher(nsqd):
    """MPUB batches (delivered directly) fanned out to three channels whose consumers read
    nothing, 20 MB each: every MPUB is answered; each consumer then gets every message, in order."""
    batches, per_batch, body = 10, 200, b"x" * 10000
    subs = [Conn(nsqd.tcp_address) for _ in range(3)]
    try:
        for n, sub in enumerate(subs):
            sub.identify(msg_timeout=120000)
            sub.sub("stalled-fan", "c%d" % n, rdy=2500)
        with Conn(nsqd.tcp_address) as pub:  # (each read of an answer is bounded: 10 s)
            for b in range(batches):
                batch = [b"%06d" % (b * per_batch + i) + body for i in range(per_batch)]
                assert pub.mpub("stalled-fan", batch) == b"OK"
        for sub in subs:
            for i in range(batches * per_batch):
                _, attempts, _, got = sub.read_message()
                assert (got[:6], attempts) == (b"%06d" % i, 1)
    finally:
        for sub in subs:
            sub.close()
