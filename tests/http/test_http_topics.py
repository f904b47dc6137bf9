"""The /topic/* and /channel/* endpoints."""

import pytest

from support.http_api import (  # noqa: F401 (fixtures among them)
    HTTP,
    assert_empty,
    assert_error,
    assert_text,
    channel_doc,
    h,
    read_bodies,
    topic_doc,
)
from support.wire import Conn, wait_for

# -- /topic/* ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "route,query,status,message",
    [
        ("create", "", 400, "MISSING_ARG_TOPIC"),
        ("create", "?channel=c", 400, "MISSING_ARG_TOPIC"),
        ("create", "?topic=bad!", 400, "INVALID_TOPIC"),
        ("create", "?topic=", 400, "INVALID_TOPIC"),
        ("create", "?topic", 400, "INVALID_TOPIC"),
        ("empty", "", 400, "MISSING_ARG_TOPIC"),
        ("empty", "?topic=bad!", 400, "INVALID_TOPIC"),
        ("empty", "?topic=nosuch", 404, "TOPIC_NOT_FOUND"),
        ("delete", "", 400, "MISSING_ARG_TOPIC"),
        ("delete", "?topic=bad!", 404, "TOPIC_NOT_FOUND"),  # no name validation
        ("delete", "?topic=", 404, "TOPIC_NOT_FOUND"),
        ("delete", "?topic=nosuch", 404, "TOPIC_NOT_FOUND"),
        ("pause", "", 400, "MISSING_ARG_TOPIC"),
        ("pause", "?topic=bad!", 404, "TOPIC_NOT_FOUND"),
        ("pause", "?topic=nosuch", 404, "TOPIC_NOT_FOUND"),
        ("unpause", "", 400, "MISSING_ARG_TOPIC"),
        ("unpause", "?topic=bad!", 404, "TOPIC_NOT_FOUND"),
        ("unpause", "?topic=nosuch", 404, "TOPIC_NOT_FOUND"),
    ],
)
def test_topic_route_errors(nsqd, h, route, query, status, message):
    assert_error(h.post("/topic/%s%s" % (route, query)), status, message)
    assert h.stats()["topics"] == []  # nothing was created


def test_topic_create_is_idempotent_and_creates_no_channel(nsqd, h):
    assert_empty(h.post("/topic/create?topic=tc"))
    assert_empty(h.post("/topic/create?topic=tc"))
    assert_empty(h.post("/topic/create?topic=eph%23ephemeral"))
    assert [(t["topic_name"], t["channels"]) for t in h.stats()["topics"]] == [
        ("eph#ephemeral", []),
        ("tc", []),
    ]


def test_paused_topic_keeps_accepting_and_stops_passing_to_channels(nsqd, h):
    with Conn(nsqd.tcp_address) as sub:
        sub.sub("tp", "c", rdy=10)
        assert_empty(h.post("/topic/pause?topic=tp"))
        assert_empty(h.post("/topic/pause?topic=tp"))  # idempotent
        assert_text(h.post("/pub?topic=tp", b"m1"), b"OK")
        assert_text(h.post("/mpub?topic=tp", b"m2\nm3"), b"OK")
        t = topic_doc(h, "tp")
        assert (t["paused"], t["depth"], t["message_count"]) == (True, 3, 3)
        c = t["channels"][0]
        assert (c["paused"], c["depth"], c["message_count"], c["in_flight_count"]) == (False, 0, 0, 0)
        sub.assert_silent(0.3)
        assert_empty(h.post("/topic/unpause?topic=tp"))
        assert read_bodies(sub, 3) == [b"m1", b"m2", b"m3"]
        assert_empty(h.post("/topic/unpause?topic=tp"))  # idempotent
        t = topic_doc(h, "tp")
        assert (t["paused"], t["depth"], t["channels"][0]["message_count"]) == (False, 0, 3)


def test_topic_empty_drops_the_topic_queue_and_leaves_channels(make_nsqd):
    nsqd = make_nsqd(mem_queue_size=2)
    h = HTTP(nsqd)
    assert_empty(h.post("/topic/create?topic=te"))
    assert_empty(h.post("/channel/create?topic=te&channel=c"))
    assert_text(h.post("/mpub?topic=te", b"1\n2\n3"), b"OK")  # reaches the channel
    assert_empty(h.post("/topic/pause?topic=te"))
    assert_text(h.post("/mpub?topic=te", b"4\n5\n6\n7"), b"OK")  # stays in the topic
    t = topic_doc(h, "te")
    assert (t["depth"], t["backend_depth"]) == (4, 2)
    assert (t["channels"][0]["depth"], t["channels"][0]["backend_depth"]) == (3, 1)
    assert_empty(h.post("/topic/empty?topic=te"))
    t = topic_doc(h, "te")
    assert (t["depth"], t["backend_depth"], t["message_count"]) == (0, 0, 7)
    assert (t["channels"][0]["depth"], t["channels"][0]["backend_depth"]) == (3, 1)
    assert_empty(h.post("/topic/unpause?topic=te"))
    assert channel_doc(h, "te", "c")["message_count"] == 3


def test_topic_delete_closes_consumers_and_removes_it_from_stats(nsqd, h):
    with Conn(nsqd.tcp_address) as sub, Conn(nsqd.tcp_address) as other:
        sub.sub("gone", "c1", rdy=1)
        other.sub("stays", "c", rdy=1)
        assert_empty(h.post("/channel/create?topic=gone&channel=c2"))
        assert_text(h.post("/pub?topic=gone", b"m"), b"OK")
        assert sub.read_message()[3] == b"m"
        assert_empty(h.post("/topic/delete?topic=gone"))
        sub.assert_closed()
        assert [t["topic_name"] for t in h.stats()["topics"]] == ["stays"]
        assert h.stats(topic="gone")["topics"] is None
        assert_error(h.post("/topic/delete?topic=gone"), 404, "TOPIC_NOT_FOUND")
        assert_error(h.post("/channel/empty?topic=gone&channel=c2"), 404, "TOPIC_NOT_FOUND")
        assert_text(h.post("/pub?topic=stays", b"alive"), b"OK")
        assert other.read_message()[3] == b"alive"


# -- /channel/* ---------------------------------------------------------------------

CHANNEL_ROUTES = ["create", "delete", "empty", "pause", "unpause"]


@pytest.mark.parametrize("route", CHANNEL_ROUTES)
@pytest.mark.parametrize(
    "query,status,message",
    [
        ("", 400, "MISSING_ARG_TOPIC"),
        ("?channel=c", 400, "MISSING_ARG_TOPIC"),
        ("?topic=bad!&channel=c", 400, "INVALID_ARG_TOPIC"),
        ("?topic=&channel=c", 400, "INVALID_ARG_TOPIC"),
        ("?topic=t", 400, "MISSING_ARG_CHANNEL"),
        ("?topic=nosuch", 400, "MISSING_ARG_CHANNEL"),  # argument checks before existence
        ("?topic=t&channel=bad!", 400, "INVALID_ARG_CHANNEL"),
        ("?topic=t&channel=", 400, "INVALID_ARG_CHANNEL"),
        ("?topic=t&channel=" + "c" * 65, 400, "INVALID_ARG_CHANNEL"),
        ("?topic=nosuch&channel=c", 404, "TOPIC_NOT_FOUND"),
        ("?topic=t;&channel=c", 400, "INVALID_REQUEST"),
    ],
)
def test_channel_route_errors(nsqd, h, route, query, status, message):
    assert_empty(h.post("/topic/create?topic=t"))
    assert_error(h.post("/channel/%s%s" % (route, query)), status, message)
    assert [(t["topic_name"], t["channels"]) for t in h.stats()["topics"]] == [("t", [])]


@pytest.mark.parametrize("route", ["delete", "empty", "pause", "unpause"])
def test_channel_not_found(nsqd, h, route):
    assert_empty(h.post("/topic/create?topic=t"))
    assert_error(h.post("/channel/%s?topic=t&channel=nosuch" % route), 404, "CHANNEL_NOT_FOUND")


def test_channel_create_needs_an_existing_topic_and_is_idempotent(nsqd, h):
    assert_error(h.post("/channel/create?topic=later&channel=c"), 404, "TOPIC_NOT_FOUND")
    assert h.stats()["topics"] == []
    assert_empty(h.post("/topic/create?topic=later"))
    assert_empty(h.post("/channel/create?topic=later&channel=c"))
    assert_empty(h.post("/channel/create?topic=later&channel=c"))
    assert_empty(h.post("/channel/create?topic=later&channel=e%23ephemeral"))
    names = [c["channel_name"] for c in topic_doc(h, "later")["channels"]]
    assert names == ["c", "e#ephemeral"]


def test_paused_channel_stops_delivering_and_resumes_on_unpause(nsqd, h):
    with Conn(nsqd.tcp_address) as sub:
        sub.sub("cp", "c", rdy=10)
        assert_text(h.post("/pub?topic=cp", b"before"), b"OK")
        _, _, first, _ = sub.read_message()
        assert_empty(h.post("/channel/pause?topic=cp&channel=c"))
        assert_empty(h.post("/channel/pause?topic=cp&channel=c"))  # idempotent
        assert_text(h.post("/mpub?topic=cp", b"p1\np2"), b"OK")
        c = channel_doc(h, "cp", "c")
        assert (c["paused"], c["depth"], c["message_count"], c["in_flight_count"]) == (True, 2, 3, 1)
        sub.assert_silent(0.3)
        # In-flight messages can still be finished while paused.
        sub.cmd(b"FIN " + first)
        wait_for(lambda: channel_doc(h, "cp", "c")["in_flight_count"] == 0, what="FIN while paused")
        sub.assert_silent(0.2)
        assert topic_doc(h, "cp")["paused"] is False
        assert_empty(h.post("/channel/unpause?topic=cp&channel=c"))
        assert read_bodies(sub, 2) == [b"p1", b"p2"]
        assert_empty(h.post("/channel/unpause?topic=cp&channel=c"))  # idempotent
        assert channel_doc(h, "cp", "c")["paused"] is False


def test_channel_empty_discards_queued_in_flight_and_deferred(make_nsqd):
    nsqd = make_nsqd(mem_queue_size=2)
    h = HTTP(nsqd)
    with Conn(nsqd.tcp_address) as sub:
        sub.sub("ce", "c", rdy=2)
        assert_text(h.post("/mpub?topic=ce", b"a\nb\nc\nd\ne"), b"OK")
        (_, _, id_a, _), (_, _, id_b, _) = sub.read_message(), sub.read_message()
        sub.cmd(b"RDY 0")
        sub.cmd(b"REQ " + id_b + b" 60000")
        wait_for(lambda: channel_doc(h, "ce", "c")["deferred_count"] == 1, what="deferred")
        c = channel_doc(h, "ce", "c")
        assert (c["depth"], c["in_flight_count"], c["deferred_count"]) == (3, 1, 1)
        assert c["clients"][0]["in_flight_count"] == 1
        assert_empty(h.post("/channel/empty?topic=ce&channel=c"))
        c = channel_doc(h, "ce", "c")
        assert (c["depth"], c["backend_depth"], c["in_flight_count"], c["deferred_count"]) == (0, 0, 0, 0)
        assert c["clients"][0]["in_flight_count"] == 0
        assert c["message_count"] == 5
        sub.cmd(b"FIN " + id_a)
        assert sub.read_error().startswith("E_FIN_FAILED FIN %s failed" % id_a.decode())
        # The consumer's in-flight counter was reset: RDY 1 gets the next message.
        sub.cmd(b"RDY 1")
        assert_text(h.post("/pub?topic=ce", b"fresh"), b"OK")
        assert sub.read_message()[3] == b"fresh"


def test_channel_delete_closes_its_consumers_only(nsqd, h):
    with Conn(nsqd.tcp_address) as s1, Conn(nsqd.tcp_address) as s2:
        s1.sub("cd", "c1", rdy=1)
        s2.sub("cd", "c2", rdy=1)
        assert_empty(h.post("/channel/delete?topic=cd&channel=c1"))
        s1.assert_closed()
        assert [c["channel_name"] for c in topic_doc(h, "cd")["channels"]] == ["c2"]
        assert_text(h.post("/pub?topic=cd", b"m"), b"OK")
        assert s2.read_message()[3] == b"m"
        assert_error(h.post("/channel/delete?topic=cd&channel=c1"), 404, "CHANNEL_NOT_FOUND")
    assert [t["topic_name"] for t in h.stats()["topics"]] == ["cd"]
