"""nsqd_threaded.client: what a message body may be (bytes, or str as UTF-8; nothing else)."""

import pytest

from nsqd_threaded.client import Consumer, Producer
from nsqd_threaded.testing import Broker


@pytest.fixture(scope="module")
def broker():
    with Broker() as b:
        yield b


@pytest.mark.parametrize("body", [5, None, 1.5, ["a"], object()], ids=lambda b: type(b).__name__)
def test_non_bytes_bodies_are_a_type_error(broker, body):
    topic = "bodies-" + type(body).__name__
    with Producer(broker.tcp_address) as p:
        with pytest.raises(TypeError, match="message body must be bytes"):
            p.pub(topic, body)
        with pytest.raises(TypeError, match="message body must be bytes"):
            p.dpub(topic, 10, body)
        with pytest.raises(TypeError, match="message body must be bytes"):
            p.mpub(topic, [b"ok", body])
        p.pub(topic, b"still connected")
    assert broker.stats(topic=topic)["topics"][0]["message_count"] == 1


@pytest.mark.parametrize("bodies", [b"abc", "abc", bytearray(b"abc")], ids=lambda b: type(b).__name__)
def test_mpub_of_one_body_is_a_type_error(broker, bodies):
    with Producer(broker.tcp_address) as p:
        with pytest.raises(TypeError, match="mpub takes a list of message bodies"):
            p.mpub("one", bodies)


def test_bytes_like_and_str_bodies_are_published(broker):
    with Producer(broker.tcp_address) as p:
        p.pub("kinds", b"bytes")
        p.pub("kinds", bytearray(b"bytearray"))
        p.pub("kinds", memoryview(b"memoryview"))
        p.pub("kinds", "str \u00e9")
        p.mpub("kinds", ["a", b"b"])
    with Consumer(broker.tcp_address, "kinds", "c") as consumer:
        received = []
        for _ in range(6):
            message = consumer.get(timeout=10)
            message.fin()
            received.append(message.body)
    assert received == [b"bytes", b"bytearray", b"memoryview", "str \u00e9".encode("utf-8"), b"a", b"b"]
