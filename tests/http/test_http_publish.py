"""Publishing over HTTP: /pub and /mpub (text and binary mode)."""

import struct
import time

import pytest

from support.http_api import (  # noqa: F401 (fixtures among them)
    HTTP,
    assert_empty,
    assert_error,
    assert_text,
    channel_doc,
    h,
    mpub_body,
    read_bodies,
    topic_doc,
)
from support.wire import Conn, wait_for

# -- /pub --------------------------------------------------------------------------


@pytest.fixture
def small(make_nsqd):
    """A broker with max-msg-size 100, max-body-size 400 and max-req-timeout 10 s."""
    return make_nsqd(max_msg_size=100, max_body_size=400, max_req_timeout=10.0)


def test_pub_accepts_exactly_max_msg_size(small):
    h = HTTP(small)
    assert_text(h.post("/pub?topic=big", b"x" * 100), b"OK")
    assert_error(h.post("/pub?topic=big", b"x" * 101), 413, "MSG_TOO_BIG")
    assert topic_doc(h, "big")["message_count"] == 1
    assert topic_doc(h, "big")["message_bytes"] == 100


def test_pub_chunked_body_over_max_is_msg_too_big(small):
    h = HTTP(small)
    assert_text(h.post("/pub?topic=ch", iter([b"x" * 60, b"y" * 40]), chunked=True), b"OK")
    r = h.post("/pub?topic=ch", iter([b"x" * 60, b"y" * 41]), chunked=True)
    assert_error(r, 413, "MSG_TOO_BIG")
    assert topic_doc(h, "ch")["message_bytes"] == 100


def test_pub_checks_run_in_the_spec_order(small):
    h = HTTP(small)
    # 1. size before everything, 4. empty before the query is parsed
    assert_error(h.post("/pub?topic=a;b", b"x" * 101), 413, "MSG_TOO_BIG")
    assert_error(h.post("/pub?topic=a;b"), 400, "MSG_EMPTY")
    assert_error(h.post("/pub"), 400, "MSG_EMPTY")
    # 5. parse, 6. missing topic, 7. invalid topic
    assert_error(h.post("/pub?topic=a;b", b"m"), 400, "INVALID_REQUEST")
    assert_error(h.post("/pub?topics=a", b"m"), 400, "MISSING_ARG_TOPIC")
    assert_error(h.post("/pub?topic=bad!", b"m"), 400, "INVALID_TOPIC")
    assert_error(h.post("/pub?topic=", b"m"), 400, "INVALID_TOPIC")
    assert_error(h.post("/pub?topic=" + "x" * 65, b"m"), 400, "INVALID_TOPIC")
    # 8. the topic is created before the defer value is validated
    assert_error(h.post("/pub?topic=made&defer=soon", b"m"), 400, "INVALID_DEFER")
    assert small.get_existing_topic("made") is not None
    assert topic_doc(h, "made")["message_count"] == 0
    assert small.get_existing_topic("bad!") is None


@pytest.mark.parametrize(
    "value",
    ["", "abc", "1.5", "5ms", "-1", "10001", "%205", "5%20", "1_0", "0x10", "%D9%A3", "99999999999999999999"],
)
def test_pub_invalid_defer(small, value):
    h = HTTP(small)
    assert_error(h.post("/pub?topic=d&defer=" + value, b"m"), 400, "INVALID_DEFER")
    assert topic_doc(h, "d")["message_count"] == 0


@pytest.mark.parametrize("value", ["0", "%2B0", "-0", "1", "007", "10000"])
def test_pub_valid_defer(small, value):
    h = HTTP(small)
    assert_text(h.post("/pub?topic=d&defer=" + value, b"m"), b"OK")
    assert topic_doc(h, "d")["message_count"] == 1


def test_pub_body_is_raw_bytes(nsqd, h):
    body = bytes(range(256)) + b"\r\n\n\x00tail"
    with Conn(nsqd.tcp_address) as sub:
        sub.sub("raw", "c", rdy=1)
        assert_text(h.post("/pub?topic=raw", body, headers={"Content-Type": "text/plain"}), b"OK")
        assert sub.read_message()[3] == body


def test_deferred_http_pub_is_delivered_no_earlier_than_its_delay(nsqd, h):
    with Conn(nsqd.tcp_address) as sub:
        sub.sub("later", "c", rdy=1)
        start = time.monotonic()
        assert_text(h.post("/pub?topic=later&defer=700", b"deferred"), b"OK")
        ch = channel_doc(h, "later", "c")
        assert (ch["deferred_count"], ch["depth"], ch["message_count"]) == (1, 0, 1)
        ts, attempts, mid, body = sub.read_message()
        assert time.monotonic() - start >= 0.7
        assert (attempts, body) == (1, b"deferred")
        sub.cmd(b"FIN " + mid)
        wait_for(lambda: channel_doc(h, "later", "c")["in_flight_count"] == 0, what="FIN")
        assert channel_doc(h, "later", "c")["deferred_count"] == 0


def test_pub_and_mpub_answer_503_when_the_put_fails(make_nsqd):
    """A disk that refuses the write (the topic's disk queue file is /dev/full: ENOSPC on every
    write) fails the publish as nsqd fails it: 503 EXITING, nothing counted, the broker serving on."""
    import os

    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    nsqd = make_nsqd(mem_queue_size=0)
    os.symlink("/dev/full", os.path.join(nsqd.options.data_path, "x503.diskqueue.000000.dat"))
    h = HTTP(nsqd)
    assert_empty(h.post("/topic/create?topic=x503"))
    assert_error(h.post("/pub?topic=x503", b"m"), 503, "EXITING")
    assert_error(h.post("/mpub?topic=x503", b"a\nb"), 503, "EXITING")
    assert_error(h.post("/mpub?topic=x503&binary=true", mpub_body([b"a"])), 503, "EXITING")
    assert topic_doc(h, "x503")["message_count"] == 0
    assert_text(h.post("/pub?topic=elsewhere", b"m"), b"OK")


# -- /mpub text mode ---------------------------------------------------------------


def test_mpub_text_splits_lines_keeps_cr_and_skips_empty_lines(nsqd, h):
    with Conn(nsqd.tcp_address) as sub:
        sub.sub("lines", "c", rdy=10)
        assert_text(h.post("/mpub?topic=lines", b"a\nb\r\n\n\nc\r\r\n\nlast"), b"OK")
        assert read_bodies(sub, 4) == [b"a", b"b\r", b"c\r\r", b"last"]
        sub.assert_silent(0.2)
    assert topic_doc(h, "lines")["message_count"] == 4


@pytest.mark.parametrize("body", [b"", b"\n", b"\n\n\n"])
def test_mpub_text_with_no_message_is_ok_and_publishes_nothing(nsqd, h, body):
    assert_text(h.post("/mpub?topic=nothing", body), b"OK")
    t = topic_doc(h, "nothing")
    assert (t["message_count"], t["depth"]) == (0, 0)


@pytest.mark.parametrize("binary", ["false", "0"])
def test_mpub_binary_false_is_text_mode(nsqd, h, binary):
    assert_text(h.post("/mpub?topic=txt&binary=" + binary, b"x\ny"), b"OK")
    assert topic_doc(h, "txt")["message_count"] == 2


def test_mpub_text_line_limits(small):
    h = HTTP(small)
    assert_text(h.post("/mpub?topic=tl", b"x" * 100 + b"\n" + b"y" * 100 + b"\n"), b"OK")
    assert topic_doc(h, "tl")["message_count"] == 2
    # A line over max-msg-size fails the whole request: nothing is published.
    assert_error(h.post("/mpub?topic=tl", b"ok\n" + b"x" * 101 + b"\nok"), 413, "MSG_TOO_BIG")
    assert topic_doc(h, "tl")["message_count"] == 2
    # The "\n" does not count towards the line: 100 bytes + "\r" is 101.
    assert_error(h.post("/mpub?topic=tl", b"x" * 100 + b"\r\n"), 413, "MSG_TOO_BIG")


def test_mpub_body_too_big(small):
    h = HTTP(small)
    body = (b"x" * 99 + b"\n") * 4  # exactly max-body-size
    assert_text(h.post("/mpub?topic=bb", body), b"OK")
    assert_error(HTTP(small).post("/mpub?topic=bb", body + b"x"), 413, "BODY_TOO_BIG")
    # The size check comes before the query checks.
    assert_error(HTTP(small).post("/mpub", body + b"x"), 413, "BODY_TOO_BIG")
    assert topic_doc(HTTP(small), "bb")["message_count"] == 4


def test_mpub_query_checks(nsqd, h):
    assert_error(h.post("/mpub?topic=a;", b"m"), 400, "INVALID_REQUEST")
    assert_error(h.post("/mpub", b"m"), 400, "MISSING_ARG_TOPIC")
    assert_error(h.post("/mpub?topic=no/slash", b"m"), 400, "INVALID_TOPIC")


def test_mpub_ignores_defer(nsqd, h):
    with Conn(nsqd.tcp_address) as sub:
        sub.sub("nodefer", "c", rdy=2)
        assert_text(h.post("/mpub?topic=nodefer&defer=60000", b"a\nb"), b"OK")
        assert read_bodies(sub, 2) == [b"a", b"b"]
        assert channel_doc(h, "nodefer", "c")["deferred_count"] == 0


# -- /mpub binary mode --------------------------------------------------------------


@pytest.mark.parametrize("binary", ["true", "1", "yes", "TRUE", "", "2"])
def test_mpub_binary_mode_spellings(nsqd, h, binary):
    bodies = [b"line\none", b"\x00\x01", b"x" * 1000]
    with Conn(nsqd.tcp_address) as sub:
        sub.sub("bin", "c", rdy=10)
        assert_text(h.post("/mpub?topic=bin&binary=" + binary, mpub_body(bodies)), b"OK")
        assert read_bodies(sub, 3) == bodies


def test_mpub_binary_ignores_trailing_bytes(nsqd, h):
    assert_text(h.post("/mpub?topic=trail&binary=true", mpub_body([b"a", b"bc"]) + b"junk"), b"OK")
    assert topic_doc(h, "trail")["message_count"] == 2


@pytest.mark.parametrize(
    "body,message",
    [
        (b"", "BAD_BODY"),  # count cannot be read
        (b"\x00\x00\x01", "BAD_BODY"),
        (struct.pack(">i", 0), "BAD_BODY"),
        (struct.pack(">i", -1), "BAD_BODY"),
        (struct.pack(">i", 80) + b"\x00" * 100, "BAD_BODY"),  # > (400 - 4) / 5 = 79
        (struct.pack(">i", 1), "BAD_MESSAGE"),  # size cannot be read
        (struct.pack(">ii", 1, 0), "BAD_MESSAGE"),
        (struct.pack(">ii", 1, -5), "BAD_MESSAGE"),
        (struct.pack(">ii", 1, 101) + b"x" * 101, "BAD_MESSAGE"),
        (struct.pack(">ii", 2, 1) + b"a" + struct.pack(">i", 5) + b"bc", "BAD_MESSAGE"),  # truncated
        (struct.pack(">ii", 2, 1) + b"a" + b"\x00\x00", "BAD_MESSAGE"),
    ],
)
def test_mpub_binary_errors_are_413_and_publish_nothing(small, body, message):
    h = HTTP(small)
    assert_error(h.post("/mpub?topic=binerr&binary=true", body), 413, message)
    t = topic_doc(h, "binerr")  # the topic was created before the body was read
    assert t["message_count"] == 0


def test_mpub_binary_count_limit_is_inclusive(small):
    h = HTTP(small)
    body = mpub_body([b"x"] * 79)  # (400 - 4) / 5 = 79 one-byte messages: 399 bytes
    assert len(body) == 399
    assert_text(h.post("/mpub?topic=many&binary=1", body), b"OK")
    assert topic_doc(h, "many")["message_count"] == 79
