"""Dead letters an operator can work with (not in Go nsqd): where each came from (its provenance, shown
by ``/channel/peek`` and ``Broker.messages()``, kept across restarts) and ``POST /channel/redrive``,
which sends them back, counted, under the same auth as a publish there, bad input changing nothing."""

import json
import os

import pytest

from nsqd_threaded.broker import provenance
from nsqd_threaded.storage import provenance as provenance_file
from nsqd_threaded.testing import Broker

from support.auth import AuthServer, grant
from support.http_api import HTTP, assert_error
from support.wire import Conn, wait_for

pytestmark = pytest.mark.timeout(60)

DEAD = "orders.dead"


@pytest.fixture
def client():
    clients = []

    def connect(nsqd):
        c = HTTP(nsqd)
        clients.append(c)
        return c

    yield connect
    for c in clients:
        c.close()


def peek(h, topic=DEAD, channel="inspect", headers=None):
    r = h.get("/channel/peek?topic=%s&channel=%s&n=100" % (topic, channel), headers=headers)
    assert r.status == 200, r
    return json.loads(r.body)["messages"]


def channel_doc(h, topic, channel):
    [t] = h.stats(topic=topic)["topics"]
    [c] = [c for c in t["channels"] if c["channel_name"] == channel]
    return c


def dead_letter_setup(nsqd, h):
    """orders/billing dead-letters to orders.dead after one attempt; orders/audit after a 50ms TTL."""
    for path in ("/topic/create?topic=orders", "/channel/create?topic=orders&channel=billing",
                 "/channel/create?topic=orders&channel=audit", "/topic/create?topic=" + DEAD,
                 "/channel/create?topic=%s&channel=inspect" % DEAD,
                 "/channel/policy?topic=orders&channel=billing&max_attempts=1&dead_letter_topic=" + DEAD,
                 "/channel/policy?topic=orders&channel=audit&msg_ttl=50ms&dead_letter_topic=" + DEAD):
        assert h.post(path).status == 200, path


def moved(docs, held):
    """The peek of orders.dead/inspect shows ``held`` messages, a, b and c with their provenance (a move
    publishes its dead letters, then records where they came from: a peek in between sees them without)."""
    return len(docs) == held and all("dead_letter" in m for m in docs if m["body"] in ("a", "b", "c"))


def fail_three(nsqd, h, held=3):
    """Publish a, b, c one by one (three timestamps) and REQ each once on orders/billing: three dead
    letters, in order.  Returns ``{body: (timestamp, id)}`` as the consumer saw them."""
    seen = {}
    with Conn(nsqd.tcp_address) as pub, Conn(nsqd.tcp_address) as sub:
        for body in (b"a", b"b", b"c"):
            assert pub.pub("orders", body) == b"OK"
        sub.sub("orders", "billing", rdy=3)
        for _ in range(3):
            timestamp, attempts, msg_id, body = sub.read_message()
            seen[body] = (timestamp, msg_id.decode())
            sub.cmd(b"REQ %s 0" % msg_id)
        wait_for(lambda: moved(peek(h), held), what="three dead letters with their provenance (%d messages held)" % held)
    # Gone before anything is redriven: a consumer still registered could be handed a redriven message.
    billing = nsqd.get_existing_topic("orders").get_existing_channel("billing")
    wait_for(lambda: not billing.has_clients(), what="the consumer gone")
    return seen


def test_each_dead_letter_says_where_it_came_from_in_order_with_its_own_timestamp(make_nsqd, client):
    nsqd = make_nsqd(channel_peek=True)
    h = client(nsqd)
    dead_letter_setup(nsqd, h)
    before = nsqd.clock.time_ns()
    seen = fail_three(nsqd, h)
    docs = peek(h)
    assert [m["body"] for m in docs] == ["a", "b", "c"]  # the channel's order
    for m in docs:
        d = m["dead_letter"]
        timestamp, original_id = seen[m["body"].encode()]
        assert d == {"topic": "orders", "channel": "billing", "reason": "max_attempts", "attempts": 1,
                     "id": original_id, "timestamp": timestamp, "at": d["at"]}
        assert m["timestamp"] == timestamp  # the dead letter keeps its own original timestamp
        assert m["id"] != original_id and m["attempts"] == 0
        assert before <= timestamp <= d["at"] <= nsqd.clock.time_ns()
    assert len({m["timestamp"] for m in docs}) == 3
    # A message that was never a dead letter has no such key (orders/audit holds a, b, c too).
    assert [m["body"] for m in peek(h, "orders", "audit") if "dead_letter" not in m] == ["a", "b", "c"]
    # The TTL's reason: orders/audit's copies expire once a consumer takes from it, and only if they are
    # older than the 50ms TTL by then.  fail_three's time hangs on the queue scanner's phase (its move of
    # billing's dead letters): it can take less than 50ms, and a copy taken younger is delivered, in
    # flight for a minute.  So wait, on the broker's clock, until the youngest is past the TTL.
    youngest = max(timestamp for timestamp, _ in seen.values())
    wait_for(lambda: nsqd.clock.time_ns() > youngest + 50 * 10 ** 6, what="orders/audit's copies past the TTL")
    with Conn(nsqd.tcp_address) as sub:
        sub.sub("orders", "audit", rdy=3)
        wait_for(lambda: [m for m in peek(h) if "dead_letter" in m][5:], what="three expired ones")
        sub.assert_silent(0.1)
    expired = peek(h)[3:]
    assert [(m["body"], m["dead_letter"]["reason"], m["dead_letter"]["channel"], m["dead_letter"]["attempts"])
            for m in expired] == [("a", "msg_ttl", "audit", 0), ("b", "msg_ttl", "audit", 0),
                                  ("c", "msg_ttl", "audit", 0)]


def test_provenance_survives_a_restart_and_is_in_broker_messages(tmp_path):
    broker = Broker(data_path=str(tmp_path), channel_peek=True).start()
    try:
        h = HTTP(broker.nsqd)
        try:
            dead_letter_setup(broker.nsqd, h)
            fail_three(broker.nsqd, h)
        finally:
            h.close()
        first = broker.messages(DEAD, "inspect")
        assert [(m.body, m.dead_letter["reason"]) for m in first] == [(b"a", "max_attempts"), (b"b", "max_attempts"),
                                                                      (b"c", "max_attempts")]
        assert os.path.exists(provenance_file.file_path(str(tmp_path), DEAD))
        broker.restart()
        assert broker.messages(DEAD, "inspect") == first  # ids, bodies, timestamps, provenance
    finally:
        broker.stop()


def test_a_torn_or_foreign_entry_never_attaches_to_another_message(make_nsqd, client):
    """After a crash a dead letter may lack its provenance, never carry a wrong one: an entry counts only
    for its ID with its body's CRC, and a torn last line is skipped (the next append starts anew)."""
    nsqd = make_nsqd(channel_peek=True)
    data = nsqd.options.data_path
    h = client(nsqd)
    dead_letter_setup(nsqd, h)
    with Conn(nsqd.tcp_address) as pub:
        assert pub.pub(DEAD, b"plain") == b"OK"  # published there directly: no provenance
    [plain] = peek(h)
    nsqd.stop()
    path = provenance_file.file_path(data, DEAD)
    wrong = {"topic": "elsewhere", "channel": "x", "reason": "msg_ttl", "attempts": 9, "id": "0" * 16,
             "timestamp": 1, "at": 2}
    with open(path, "wb") as f:
        f.write(provenance_file.encode_entries([(plain["id"], 12345, wrong)]))  # its ID, another body
        f.write(b'{"id":"%s","crc":' % plain["id"].encode())  # a torn line
    nsqd = make_nsqd(channel_peek=True, data_path=data)
    h = client(nsqd)
    assert "dead_letter" not in peek(h)[0]
    seen = fail_three(nsqd, h, held=4)  # appended after the torn line
    assert {m["body"]: m.get("dead_letter", {}).get("id") for m in peek(h)} == {
        "plain": None, "a": seen[b"a"][1], "b": seen[b"b"][1], "c": seen[b"c"][1]}
    assert len(provenance_file.read_entries(path)[0]) == 4


def test_redrive_sends_them_back_attempts_anew_counted(make_nsqd, client):
    nsqd = make_nsqd(channel_peek=True)
    h = client(nsqd)
    dead_letter_setup(nsqd, h)
    fail_three(nsqd, h)
    r = h.post("/channel/redrive?topic=%s&channel=inspect&n=2" % DEAD)
    assert r.status == 200 and json.loads(r.body) == {"moved": 2}
    assert [m["body"] for m in peek(h)] == ["c"]
    with Conn(nsqd.tcp_address) as sub:
        sub.sub("orders", "billing", rdy=5)
        got = [sub.read_message() for _ in range(2)]
        assert [(m[1], m[3]) for m in got] == [(1, b"a"), (1, b"b")]  # delivered once so far: attempts anew
        for m in got:
            sub.cmd(b"FIN " + m[2])
        sub.assert_silent(0.1)
    doc = channel_doc(h, DEAD, "inspect")
    assert doc["redrive_count"] == 2 and doc["depth"] == 1
    assert "redrive_count" not in channel_doc(h, "orders", "billing")  # (only once a channel was redriven from)
    metrics = h.get("/metrics").body.decode()
    assert 'nsq_channel_redriven_total{topic="orders.dead",channel="inspect"} 2\n' in metrics
    # The rest (n absent: all), to another topic.
    r = h.post("/channel/redrive?topic=%s&channel=inspect&to=orders.retry" % DEAD)
    assert json.loads(r.body) == {"moved": 1}
    assert peek(h) == []
    assert nsqd.get_existing_topic("orders.retry").depth() == 1
    assert json.loads(h.post("/channel/redrive?topic=%s&channel=inspect" % DEAD).body) == {"moved": 0}
    assert channel_doc(h, DEAD, "inspect")["redrive_count"] == 3


def test_stats_marks_dead_letter_topics_by_a_channels_policy_or_the_pattern(make_nsqd, client):
    """``is_dead_letter_topic`` (not in Go nsqd, only on such a topic) is what nsqadmin offers a redrive on."""
    nsqd = make_nsqd(dead_letter_topic="{topic}-dlq")
    h = client(nsqd)
    for path in ("/topic/create?topic=orders", "/channel/create?topic=orders&channel=billing",
                 "/topic/create?topic=orders-dlq", "/topic/create?topic=" + DEAD, "/topic/create?topic=plain"):
        assert h.post(path).status == 200, path

    def marked():
        return {t["topic_name"]: t.get("is_dead_letter_topic") for t in h.stats()["topics"]}

    assert marked() == {"orders": None, "orders-dlq": True, DEAD: None, "plain": None}
    assert h.post("/channel/policy?topic=orders&channel=billing&dead_letter_topic=" + DEAD).status == 200
    assert marked() == {"orders": None, "orders-dlq": True, DEAD: True, "plain": None}
    # Named by no channel any more: an ordinary topic again.
    assert h.post("/channel/policy?topic=orders&channel=billing&inherit=dead_letter_topic").status == 200
    assert marked()[DEAD] is None
    [t] = h.stats(topic="orders-dlq")["topics"]
    assert list(t)[-1] == "is_dead_letter_topic"  # (after Go's keys)


@pytest.mark.parametrize("query, status, message", [
    ("", 400, "MISSING_ARG_TOPIC"),
    ("?topic=orders.dead", 400, "MISSING_ARG_CHANNEL"),
    ("?topic=nope&channel=inspect", 404, "TOPIC_NOT_FOUND"),
    ("?topic=orders.dead&channel=nope", 404, "CHANNEL_NOT_FOUND"),
    ("?topic=orders.dead&channel=inspect&n=0", 400, "INVALID_N"),
    ("?topic=orders.dead&channel=inspect&n=-1", 400, "INVALID_N"),
    ("?topic=orders.dead&channel=inspect&n=two", 400, "INVALID_N"),
    ("?topic=orders.dead&channel=inspect&to=bad!name", 400, "INVALID_TO"),
    ("?topic=orders.dead&channel=inspect&to=orders.dead", 400, "INVALID_TO"),  # a loop
    ("?topic=orders.dead&channel=inspect&to=x%23ephemeral", 400, "INVALID_TO"),
    ("?topic=orders.dead&channel=inspect&to=", 400, "INVALID_TO"),
    ("?topic=orders.dead&channel=inspect&count=1", 400, "INVALID_ARG"),  # misspelt: never 200
])
def test_bad_input_is_refused_and_changes_nothing(make_nsqd, client, query, status, message):
    nsqd = make_nsqd(channel_peek=True)
    h = client(nsqd)
    dead_letter_setup(nsqd, h)
    fail_three(nsqd, h)
    before = peek(h)
    assert_error(h.post("/channel/redrive" + query), status, message)
    assert peek(h) == before
    assert "redrive_count" not in channel_doc(h, DEAD, "inspect")


def test_a_message_without_provenance_needs_to_and_nothing_moves_without_it(make_nsqd, client):
    nsqd = make_nsqd(channel_peek=True)
    h = client(nsqd)
    dead_letter_setup(nsqd, h)
    with Conn(nsqd.tcp_address) as pub:
        assert pub.pub(DEAD, b"stray") == b"OK"
    fail_three(nsqd, h, held=4)
    before = peek(h)
    assert_error(h.post("/channel/redrive?topic=%s&channel=inspect" % DEAD), 400, "MISSING_ARG_TO")
    # The batch taken is back at the head, in order, nothing moved, nothing in flight.
    assert peek(h) == before and channel_doc(h, DEAD, "inspect")["in_flight_count"] == 0
    assert nsqd.get_existing_topic("orders").get_existing_channel("billing").depth() == 0
    assert json.loads(h.post("/channel/redrive?topic=%s&channel=inspect&to=orders" % DEAD).body) == {"moved": 4}
    assert nsqd.get_existing_topic("orders").get_existing_channel("billing").depth() == 4


def test_redrive_of_a_paused_channel_with_a_consumer_keeps_the_rest_in_order(make_nsqd, client):
    nsqd = make_nsqd(channel_peek=True)
    h = client(nsqd)
    dead_letter_setup(nsqd, h)
    fail_three(nsqd, h)
    assert h.post("/channel/pause?topic=%s&channel=inspect" % DEAD).status == 200
    assert json.loads(h.post("/channel/redrive?topic=%s&channel=inspect&n=1" % DEAD).body) == {"moved": 1}
    assert [m["body"] for m in peek(h)] == ["b", "c"]


@pytest.fixture
def auth_server():
    server = AuthServer()
    operator = grant("^orders\\.dead$", ["^inspect$"], ["subscribe"], identity="operator")
    operator["authorizations"].append({"topic": "^orders$", "channels": [".*"], "permissions": ["publish"]})
    server.answers.update({
        "operator": operator,
        "reader": grant("^orders\\.dead$", ["^inspect$"], ["subscribe"], identity="reader"),
        "publisher": grant(".*", [".*"], ["publish"], identity="producer"),
        "consumer": grant(".*", [".*"], ["subscribe", "publish"], identity="consumer"),
    })
    yield server
    server.close()


def test_under_auth_redrive_needs_subscribe_on_the_channel_and_publish_on_each_destination(make_nsqd, client,
                                                                                          auth_server):
    nsqd = make_nsqd(channel_peek=True, auth_http_addresses=[auth_server.address])
    h = client(nsqd)
    dead_letter_setup(nsqd, h)
    nsqd.get_topic("orders").publish([b"a", b"b"])
    with Conn(nsqd.tcp_address) as sub:
        sub.identify()
        sub.cmd(b"AUTH", b"consumer")
        sub.read_response()
        sub.sub("orders", "billing", rdy=2)
        for _ in range(2):
            sub.cmd(b"REQ %s 0" % sub.read_message()[2])
        wait_for(lambda: len(peek(h, headers={"X-NSQ-Auth-Secret": "consumer"})) == 2 or None,
                 what="two dead letters")
    before = peek(h, headers={"X-NSQ-Auth-Secret": "consumer"})
    query = "/channel/redrive?topic=%s&channel=inspect" % DEAD
    assert_error(h.post(query), 401, "AUTH_REQUIRED")
    assert_error(h.post(query, headers={"X-NSQ-Auth-Secret": "wrong"}), 403, "AUTH_FAILED")
    assert_error(h.post(query, headers={"X-NSQ-Auth-Secret": "publisher"}), 403, "UNAUTHORIZED")  # no subscribe
    assert_error(h.post(query, headers={"X-NSQ-Auth-Secret": "reader"}), 403, "UNAUTHORIZED")  # no publish to orders
    assert_error(h.post(query + "&to=orders.retry", headers={"X-NSQ-Auth-Secret": "operator"}), 403, "UNAUTHORIZED")
    assert peek(h, headers={"X-NSQ-Auth-Secret": "consumer"}) == before
    r = h.post(query, headers={"X-NSQ-Auth-Secret": "operator"})
    assert r.status == 200 and json.loads(r.body) == {"moved": 2}


def test_a_redrive_stops_at_the_first_message_without_provenance_having_moved_those_before(make_nsqd, client):
    nsqd = make_nsqd(channel_peek=True)
    h = client(nsqd)
    dead_letter_setup(nsqd, h)
    fail_three(nsqd, h)
    with Conn(nsqd.tcp_address) as pub:
        assert pub.pub(DEAD, b"stray") == b"OK"
        assert pub.pub(DEAD, b"after") == b"OK"
    assert_error(h.post("/channel/redrive?topic=%s&channel=inspect" % DEAD), 400, "MISSING_ARG_TO")
    assert [m["body"] for m in peek(h)] == ["stray", "after"]
    assert channel_doc(h, DEAD, "inspect")["redrive_count"] == 3
    assert nsqd.get_existing_topic("orders").get_existing_channel("billing").depth() == 3


def finish_all_but(broker, channel, held, count, unfinished):
    """Take ``count`` messages of orders.dead/``channel`` (which holds ``held``) and FIN each but the
    ``unfinished`` first ones; returns once the FINs are done and the consumer left (what it was handed
    and did not finish is back in the queue once the scanner saw it go)."""
    with Conn(broker.nsqd.tcp_address) as sub:
        sub.sub(DEAD, channel, rdy=unfinished + 100)  # (the unfinished ones keep their slots)
        for i in range(count):
            msg_id = sub.read_message()[2]
            if i >= unfinished:
                sub.cmd(b"FIN " + msg_id)
        sub.cmd(b"RDY 0")
        left = broker.nsqd.get_existing_topic(DEAD).get_existing_channel(channel).held_count
        wait_for(lambda: left() == held - count + unfinished, what="its FINs done")  # (before it leaves)


@pytest.mark.parametrize("durable", [False, True], ids=["memory", "durable"])
def test_stale_provenance_lines_are_compacted_away_and_the_held_ones_keep_theirs(tmp_path, durable):
    """A line whose dead letter no channel holds any more (finished on each, or its channel deleted) is
    dropped once most of the file is stale: the file is rewritten smaller, with the lines of the dead
    letters some channel still holds (each channel's own, queued, in memory or on disk), whose
    provenance is unchanged; across a restart in between (the file is read back, then compacted)."""
    count = 2500  # (past COMPACT_MIN_LINES: a smaller file is never compacted)
    assert count >= provenance.COMPACT_MIN_LINES
    # A small memory queue: most of orders.dead's dead letters wait in its channels' disk queues.
    broker = Broker(data_path=str(tmp_path), channel_peek=True, mem_queue_size=100, durable=durable).start()
    path = provenance_file.file_path(str(tmp_path), DEAD)
    try:
        h = HTTP(broker.nsqd)
        try:
            for q in ("/topic/create?topic=orders", "/channel/create?topic=orders&channel=audit",
                      "/topic/create?topic=" + DEAD, "/channel/create?topic=%s&channel=inspect" % DEAD,
                      "/channel/create?topic=%s&channel=work" % DEAD,
                      "/channel/create?topic=%s&channel=archive" % DEAD,
                      "/channel/policy?topic=orders&channel=audit&msg_ttl=1ms&dead_letter_topic=" + DEAD):
                assert h.post(q).status == 200, q
        finally:
            h.close()
        with Conn(broker.nsqd.tcp_address) as pub:
            assert pub.mpub("orders", [b"m%04d" % i for i in range(count)]) == b"OK"
        published = broker.nsqd.clock.time_ns()
        wait_for(lambda: broker.nsqd.clock.time_ns() > published + 10 ** 6, what="the messages past the TTL")
        with Conn(broker.nsqd.tcp_address) as sub:
            sub.sub("orders", "audit", rdy=1)  # (a take screens them all out: each is a dead letter)
            for channel in ("inspect", "work", "archive"):
                broker.wait_until(DEAD, channel, depth=count)
            # (a move publishes its dead letters, then records their provenance: wait for the last one's)
            wait_for(lambda: broker.messages(DEAD, "inspect")[-1].dead_letter, what="the provenance recorded")
        before = {m.id: m.dead_letter for m in broker.messages(DEAD, "inspect")}
        assert len(before) == count and all(d["reason"] == "msg_ttl" for d in before.values())
        size = os.path.getsize(path)
        assert len(provenance_file.read_entries(path)[0]) == count
        broker.restart()
        # inspect keeps its last 200 (the first ones finished), work its first 100 (the others finished).
        finish_all_but(broker, "inspect", count, count - 200, 0)
        finish_all_but(broker, "work", count, count, 100)
        broker.wait_until(DEAD, "inspect", depth=200, in_flight_count=0)
        broker.wait_until(DEAD, "work", depth=100, in_flight_count=0)
        # archive still holds every one: nothing is stale, a compaction (the scanner's, or this one) leaves
        # the file alone.
        broker.nsqd.dead_letter_provenance.compact(broker.nsqd.get_existing_topic)
        assert len(provenance_file.read_entries(path)[0]) == count
        h = HTTP(broker.nsqd)
        try:
            assert h.post("/channel/delete?topic=%s&channel=archive" % DEAD).status == 200
        finally:
            h.close()
        wait_for(lambda: os.path.getsize(path) < size / 2, what="the provenance file compacted")
        held = broker.messages(DEAD, "inspect") + broker.messages(DEAD, "work")
        assert len({m.id for m in held}) == 300
        assert set(provenance_file.read_entries(path)[0]) == {m.id for m in held}
        assert all(m.dead_letter == before[m.id] for m in held)  # each still says where it came from
        assert os.path.getsize(path) < size * 300 / count * 1.1
    finally:
        broker.stop()


def test_a_line_appended_during_a_compaction_is_kept_and_the_rewrite_leaves_no_temp_file(tmp_path):
    """A compaction drops only entries it knew before reading the topic's messages: a dead letter moved
    while it read them (published there, then its line appended) keeps its line in the new file."""
    path = provenance_file.file_path(str(tmp_path), DEAD)
    book = provenance.TopicProvenance(path, sync=False)
    crc = provenance_file.body_crc(b"body")
    old = ["%016d" % i for i in range(provenance.COMPACT_MIN_LINES)]
    book.add([(msg_id, crc, {"n": i}) for i, msg_id in enumerate(old)])
    assert book.big_enough() and book.compaction_due(1) and not book.compaction_due(len(old))
    known = book.begin_compaction()
    book.add([("late", crc, {"n": "late"})])  # (moved while the topic's messages were read: not among them)
    assert book.finish_compaction(known, {old[7]}) == len(old) - 1
    book.add([("after", crc, {"n": "after"})])  # appended to the new file
    assert list(provenance_file.read_entries(path)[0]) == [old[7], "late", "after"]
    assert os.listdir(str(tmp_path)) == [os.path.basename(path)]  # (renamed over it: no temp file left)
    again = provenance.TopicProvenance(path, sync=False)  # (read back, as after a restart)
    assert [again.get(msg_id, b"body") for msg_id in (old[7], "late", "after", old[0])] == [
        {"n": 7}, {"n": "late"}, {"n": "after"}, None]
    assert not again.big_enough()  # (three lines: nothing to compact)
