"""The client leaves no cyclic garbage behind a closed connection (what a process with a
high gc threshold, such as the broker's, needs from the producers it makes)."""

import platform
import socket
import threading

import pytest

from nsqd_threaded.client import NSQError, Producer
from nsqd_threaded.testing import Broker

from support.core import unreachable_after

CPYTHON = platform.python_implementation() == "CPython"


def _producer_threads():
    return [t.name for t in threading.enumerate() if t.name.startswith("nsq-producer[")]


def _refused_address():
    """An address nobody listens on (a port just released)."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    address = "127.0.0.1:%d" % probe.getsockname()[1]
    probe.close()
    return address


@pytest.mark.skipif(not CPYTHON, reason="counts what CPython's cyclic collector finds")
def test_the_producer_leaves_no_reference_cycles_behind_its_connections():
    """Publishing (PUB, MPUB, DPUB, async), a connection nsqd closes after a fatal error and
    the reconnect after it, a node that refuses the connection (the request goes to the next
    one), and closing: nothing is left that only the cyclic collector would free."""
    rounds = 20
    with Broker() as broker:
        address = "%s:%d" % tuple(broker.tcp_address)

        def one_round():
            with Producer(address) as producer:
                producer.pub("orders", b"x1")
                producer.mpub("orders", [b"x2", b"x3"])
                producer.dpub("orders", 10, b"x4")
                assert producer.pub_async("orders", b"x5").result(10) == b"OK"
                with pytest.raises(NSQError):
                    producer.pub("bad!topic", b"x")  # E_BAD_TOPIC: nsqd closes the connection
                producer.pub("orders", b"x6")  # on a new connection
            with Producer([_refused_address(), address]) as producer:
                for _ in range(2):  # round robin: one of them is first tried on the refusing node
                    producer.pub("orders", b"x7")

        unreachable = unreachable_after(rounds, one_round, lambda: not _producer_threads(), "reader threads to end")
    # A cycle per connection would be dozens of objects each round: allow what a stray
    # object of the test process itself may leave, far below one per round.
    assert unreachable < rounds, unreachable
