"""Direct delivery: a publisher's thread writes small puts to a waiting consumer itself.

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
    """Four PUB publishers (delivered directly) and one MPUB publisher (taken by the pump)
    race into one channel with one consumer: every publisher's sequence arrives in order."""
    per_publisher, batches, batch = 300, 6, 100
    total = 4 * per_publisher + batches * batch
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

        threads = [threading.Thread(target=publish_one_at_a_time, args=(b"P%d" % n,)) for n in range(4)]
        threads.append(threading.Thread(target=publish_batches))
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
    assert sorted(by_tag) == [b"M", b"P0", b"P1", b"P2", b"P3"]
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
