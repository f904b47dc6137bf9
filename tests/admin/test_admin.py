"""nsqadmin-threaded over real clusters: the JSON API, the pages, the actions, ACL, notifications,
nodes that do not answer, and the broker's ``/debug/state`` behind the inside view."""

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

import pytest

from nsqd_threaded.testing import Broker, Cluster

from support.admin import NotificationSink, call
from support.wire import Conn, wait_for

pytestmark = pytest.mark.timeout(90)


def seg(name):
    return urllib.parse.quote(name, safe="")


@pytest.fixture
def cluster():
    with Cluster(3) as c:
        yield c



@pytest.fixture
def admin(cluster, admin_factory):
    return admin_factory(lookupd_http_addresses=[cluster.lookupd.http_addr])


def populate(cluster, topic="orders", channel="billing"):
    """One message per broker (two on the first), the channel on every broker."""
    for i, broker in enumerate(cluster):
        assert broker.http("POST", "/topic/create?topic=" + topic)[0] == 200
        assert broker.http("POST", "/channel/create?topic=%s&channel=%s" % (topic, channel))[0] == 200
        for n in range(2 if i == 0 else 1):
            assert broker.http("POST", "/pub?topic=" + topic, b"msg %d-%d" % (i, n))[0] == 200
    wait_for(lambda: cluster.lookupd.lookup(topic) == sorted(cluster.tcp_addrs), what="registrations")


def node_of(broker):
    return broker.http_addr


# -- reads ---------------------------------------------------------------------------------


def test_api_aggregates_a_three_broker_cluster(cluster, admin):
    populate(cluster)
    with Conn(cluster[0].tcp_address) as consumer:
        consumer.identify(user_agent="test-consumer/1.0", hostname="learner")
        consumer.sub("orders", "billing", rdy=5)
        consumer.read_message()
        consumer.read_message()
        wait_for(lambda: cluster[0].stats(topic="orders")["topics"][0]["channels"][0]["in_flight_count"] == 2)

        status, doc = call(admin.http_url + "/api/topics")
        assert status == 200 and doc == {"topics": ["orders"], "message": ""}

        status, t = call(admin.http_url + "/api/topics/orders")
        assert status == 200, t
        assert (t["node"], t["topic_name"], t["message_count"], t["message"]) == ("*", "orders", 4, "")
        assert sorted(n["node"] for n in t["nodes"]) == sorted(node_of(b) for b in cluster)
        [billing] = t["channels"]
        assert (billing["node"], billing["channel_name"], billing["depth"], billing["in_flight_count"]) == (
            "*", "billing", 2, 2)
        assert billing["client_count"] == 1 and billing["message_count"] == 4

        status, c = call(admin.http_url + "/api/topics/orders/billing")
        assert status == 200
        assert (c["depth"], c["memory_depth"], c["backend_depth"], c["in_flight_count"]) == (2, 2, 0, 2)
        assert len(c["nodes"]) == 3
        [client] = c["clients"]
        assert client["node"] == node_of(cluster[0])
        assert (client["user_agent"], client["hostname"], client["ready_count"], client["in_flight_count"]) == (
            "test-consumer/1.0", "learner", 5, 2)
        assert client["tls"] is False and client["snappy"] is False and client["deflate"] is False

    status, nodes = call(admin.http_url + "/api/nodes")
    assert status == 200 and nodes["message"] == ""
    assert sorted(n["tcp_port"] for n in nodes["nodes"]) == sorted(b.tcp_address[1] for b in cluster)
    assert all(n["topics"] == [{"topic": "orders", "tombstoned": False}] for n in nodes["nodes"])
    assert all(n["remote_addresses"][0].startswith(cluster.lookupd.http_addr + "/") for n in nodes["nodes"])

    status, node = call(admin.http_url + "/api/nodes/" + node_of(cluster[0]))
    assert status == 200
    assert (node["node"], node["total_messages"], [t["topic_name"] for t in node["topics"]]) == (
        node_of(cluster[0]), 2, ["orders"])
    assert call(admin.http_url + "/api/nodes/127.0.0.1:1")[1] == {"message": "NODE_NOT_FOUND"}

    status, counter = call(admin.http_url + "/api/counter")
    assert status == 200
    assert counter["stats"]["orders:billing:" + node_of(cluster[0])]["message_count"] == 2
    assert sum(s["message_count"] for s in counter["stats"].values()) == 4


def test_unknown_topic_is_an_upstream_error_and_unknown_channel_is_empty(cluster, admin):
    populate(cluster)
    status, doc = call(admin.http_url + "/api/topics/nope")
    assert status == 502 and doc["message"].startswith("UPSTREAM_ERROR: ")  # Go's API answer
    assert call(admin.http_url + "/api/topics/orders/nope") == (200, {"message": ""})


def test_a_mistyped_topic_is_not_found_in_the_ui(cluster, admin, admin_factory):
    populate(cluster)
    for path in ("/topics/ordres", "/topics/ordres/billing"):
        status, text = call(admin.http_url + path)
        assert status == 404 and "<h1>Not found</h1>" in text and "ordres" in text, path
        assert "UPSTREAM_ERROR" not in text
    without_lookupd = admin_factory(nsqd_http_addresses=[b.http_addr for b in cluster])
    status, text = call(without_lookupd.http_url + "/topics/ordres")
    assert status == 404 and "Not found" in text
    assert call(without_lookupd.http_url + "/topics/orders")[0] == 200


def test_inactive_topics_are_those_without_producers(cluster, admin):
    populate(cluster)
    assert call(admin.http_url + "/api/topics?inactive=true")[1] == {"topics": {}, "message": ""}


def test_nsqd_http_addresses_without_lookupd(cluster, admin_factory):
    populate(cluster)
    admin = admin_factory(nsqd_http_addresses=[b.http_addr for b in cluster])
    assert call(admin.http_url + "/api/topics")[1] == {"topics": ["orders"], "message": ""}
    t = call(admin.http_url + "/api/topics/orders")[1]
    assert t["message_count"] == 4 and len(t["nodes"]) == 3
    assert call(admin.http_url + "/api/topics", "POST", {"topic": "fresh"})[0] == 200
    assert all("fresh" in [t["topic_name"] for t in b.stats()["topics"]] for b in cluster)


# -- pages ---------------------------------------------------------------------------------


def test_every_page_renders(cluster, admin):
    populate(cluster)
    node = node_of(cluster[1])
    for path, expected in (
        ("/", "orders"), ("/topics", "orders"), ("/topics/orders", "billing"),
        ("/topics/orders/billing", "Clients"), ("/nodes", str(cluster[2].tcp_address[1])),
        ("/nodes/" + node, "orders"), ("/nodes/%s/inside" % node, 'data-kind="inside"'),
        ("/counter", "Messages Processed"), ("/lookup", cluster.lookupd.http_addr),
        ("/static/admin.css", "table.stats"), ("/static/admin.js", "renderInside"), ("/ping", "OK"),
    ):
        status, text = call(admin.http_url + path)
        assert status == 200, (path, text)
        assert expected in text, path
    status, text = call(admin.http_url + "/topics/orders/nope")
    assert status == 404 and "CHANNEL_NOT_FOUND" in text
    assert call(admin.http_url + "/static/nope.js")[0] == 404


def test_pages_escape_names(cluster, admin):
    # '<' is not a valid name, so the lookupd refuses it; escaping is checked on an error page
    status, text = call(admin.http_url + "/nodes/%3Cb%3Ex/inside")
    assert status == 404 and "<b>x" not in text


def test_base_path(cluster, admin_factory):
    populate(cluster)
    admin = admin_factory(lookupd_http_addresses=[cluster.lookupd.http_addr], base_path="/nsq/")
    status, text = call(admin.http_url + "/nsq/topics/orders")
    assert status == 200 and 'href="/nsq/static/admin.css"' in text and 'href="/nsq/topics/orders/billing"' in text
    assert call(admin.http_url + "/nsq/api/topics")[1]["topics"] == ["orders"]
    assert call(admin.http_url + "/api/topics")[0] == 404


# -- actions -------------------------------------------------------------------------------


def channel_stats(broker, topic, channel):
    for t in broker.stats(topic=topic)["topics"]:
        for c in t["channels"]:
            if c["channel_name"] == channel:
                return c
    return None


def test_actions_reach_every_broker(cluster, admin):
    populate(cluster)
    url = admin.http_url + "/api/topics/orders/billing"
    assert call(url, "POST", {"action": "pause"}) == (200, {"message": ""})
    assert all(channel_stats(b, "orders", "billing")["paused"] for b in cluster)
    assert call(url)[1]["paused"] is True
    assert call(url, "POST", {"action": "unpause"})[0] == 200
    assert not any(channel_stats(b, "orders", "billing")["paused"] for b in cluster)

    assert call(url, "POST", {"action": "empty"})[0] == 200
    assert all(channel_stats(b, "orders", "billing")["depth"] == 0 for b in cluster)

    assert call(admin.http_url + "/api/topics/orders", "POST", {"action": "pause"})[0] == 200
    assert all(b.stats(topic="orders")["topics"][0]["paused"] for b in cluster)

    assert call(url, "POST", {"action": "bogus"}) == (400, {"message": "INVALID_ACTION"})
    assert call(url, "POST", b"not json", {"Content-Type": "application/json"})[0] == 400
    assert call(url, "POST", b'{"action": "pause"}')[0] == 415  # not declared as JSON: a form could send it

    assert call(admin.http_url + "/api/topics", "POST", {"topic": "made", "channel": "here"})[0] == 200
    assert "made" in cluster.lookupd.get("/topics")["topics"]
    assert cluster.lookupd.get("/channels?topic=made")["channels"] == ["here"]
    assert call(admin.http_url + "/api/topics", "POST", {"topic": "bad name!"}) == (400, {"message": "INVALID_TOPIC"})
    assert call(admin.http_url + "/api/topics", "POST", {"topic": "ok", "channel": "bad!"}) == (
        400, {"message": "INVALID_CHANNEL"})

    assert call(url, "DELETE")[0] == 200
    assert all(channel_stats(b, "orders", "billing") is None for b in cluster)

    node = node_of(cluster[2])
    assert call(admin.http_url + "/api/nodes/" + node, "DELETE", {"topic": "orders"})[0] == 200
    producers = cluster.lookupd.get("/nodes")["producers"]
    mine = [p for p in producers if p["http_port"] == cluster[2].http_address[1]][0]
    assert "orders" not in [t["topic_name"] for t in cluster[2].stats()["topics"]]
    assert mine["tombstones"][mine["topics"].index("orders")] if "orders" in mine["topics"] else True
    assert call(admin.http_url + "/api/nodes/" + node, "DELETE", b"{", {"Content-Type": "application/json"}) == (
        400, {"message": "INVALID_BODY"})

    assert call(admin.http_url + "/api/topics/orders", "DELETE")[0] == 200
    assert all("orders" not in [t["topic_name"] for t in b.stats()["topics"]] for b in cluster)
    assert "orders" not in cluster.lookupd.get("/topics")["topics"]


def test_only_admins_may_act(cluster, admin_factory):
    populate(cluster)
    admin = admin_factory(lookupd_http_addresses=[cluster.lookupd.http_addr], admin_users=["alice"])
    url = admin.http_url + "/api/topics/orders/billing"
    assert call(url, "POST", {"action": "pause"}) == (403, {"message": "FORBIDDEN"})
    assert call(url, "POST", {"action": "pause"}, {"X-Forwarded-User": "bob"}) == (403, {"message": "FORBIDDEN"})
    assert call(url, "DELETE", headers={"X-Forwarded-User": "bob"})[0] == 403
    assert call(admin.http_url + "/api/topics", "POST", {"topic": "x"})[0] == 403
    assert call(admin.http_url + "/api/nodes/" + node_of(cluster[0]), "DELETE", {"topic": "orders"})[0] == 403
    assert not any(channel_stats(b, "orders", "billing")["paused"] for b in cluster)
    assert call(url)[0] == 200  # reading needs no rights
    assert call(url, "POST", {"action": "pause"}, {"X-Forwarded-User": "alice"}) == (200, {"message": ""})
    assert all(channel_stats(b, "orders", "billing")["paused"] for b in cluster)

    other = admin_factory(lookupd_http_addresses=[cluster.lookupd.http_addr], admin_users=["alice"],
                          acl_http_header="X-Remote-User")
    url = other.http_url + "/api/topics/orders/billing"
    assert call(url, "POST", {"action": "unpause"}, {"X-Forwarded-User": "alice"})[0] == 403
    assert call(url, "POST", {"action": "unpause"}, {"X-Remote-User": "alice"})[0] == 200


def test_actions_are_notified_as_go_admin_actions(cluster, admin_factory):
    populate(cluster)
    sink = NotificationSink()
    try:
        admin = admin_factory(lookupd_http_addresses=[cluster.lookupd.http_addr],
                              notification_http_endpoint=sink.url)
        auth = "Basic " + base64.b64encode(b"carol:secret").decode()
        headers = {"Authorization": auth, "User-Agent": "ops-script/2"}
        before = int(time.time())
        assert call(admin.http_url + "/api/topics", "POST", {"topic": "made", "channel": "here"}, headers)[0] == 200
        assert call(admin.http_url + "/api/topics/orders/billing", "POST", {"action": "pause"})[0] == 200
        node = node_of(cluster[1])
        assert call(admin.http_url + "/api/nodes/" + node, "DELETE", {"topic": "orders"})[0] == 200
        docs = sink.wait_for(4)
    finally:
        sink.close()
    create_topic, create_channel, pause, tombstone = docs
    assert sink.paths[0] == "/notify"
    assert list(create_topic) == ["action", "topic", "timestamp", "user", "remote_ip", "user_agent", "url", "via"]
    assert (create_topic["action"], create_topic["topic"], create_topic["user"], create_topic["user_agent"]) == (
        "create_topic", "made", "carol", "ops-script/2")
    assert create_topic["url"] == admin.http_url + "/api/topics"
    assert create_topic["remote_ip"].startswith("127.0.0.1:")
    assert create_topic["timestamp"] >= before and create_topic["via"] == socket.gethostname()
    assert (create_channel["action"], create_channel["channel"]) == ("create_channel", "here")
    assert (pause["action"], pause["topic"], pause["channel"]) == ("pause_channel", "orders", "billing")
    assert "user" not in pause and "node" not in pause
    assert (tombstone["action"], tombstone["node"]) == ("tombstone_topic_producer", node)


# -- nodes that do not answer ---------------------------------------------------------------


def test_a_stopped_broker_is_listed_not_fatal(cluster, admin_factory):
    populate(cluster)
    admin = admin_factory(nsqd_http_addresses=[b.http_addr for b in cluster])
    down = node_of(cluster[2])
    cluster[2].stop()
    status, doc = call(admin.http_url + "/api/topics")
    assert status == 200 and doc["topics"] == ["orders"]
    assert doc["message"].startswith("WARNING: ") and down in doc["message"]
    status, text = call(admin.http_url + "/topics")
    assert status == 200 and 'id="failed-nodes"' in text and down in text


def test_a_frozen_broker_is_listed_within_the_timeouts(admin_factory):
    """A broker stopped with SIGSTOP: still registered, its HTTP port accepts and never answers."""
    with Cluster(3, processes=True) as cluster:
        populate(cluster)
        admin = admin_factory(lookupd_http_addresses=[cluster.lookupd.http_addr],
                              http_client_connect_timeout=1.0, http_client_request_timeout=1.0)
        down = node_of(cluster[2])
        os.kill(cluster[2].pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            status, t = call(admin.http_url + "/api/topics/orders")
            elapsed = time.monotonic() - started
            assert status == 200
            assert t["message"].startswith("WARNING: ") and down in t["message"] and "timed out" in t["message"]
            assert len(t["nodes"]) == 2 and t["message_count"] == 3
            assert elapsed < 20, elapsed  # one request timeout, not one per node (generous: a loaded machine)
            for path in ("/topics", "/topics/orders", "/topics/orders/billing", "/counter", "/nodes"):
                status, text = call(admin.http_url + path)
                assert status == 200, path
                if path != "/nodes":  # the lookupd answers /nodes by itself
                    assert 'id="failed-nodes"' in text and down in text, path
            # the node's own page still answers, naming it; its API route is Go's 502
            status, text = call(admin.http_url + "/nodes/" + down)
            assert status == 200 and 'id="failed-nodes"' in text and down in text
            status, doc = call(admin.http_url + "/api/nodes/" + down)
            assert status == 502 and doc["message"].startswith("UPSTREAM_ERROR")
        finally:
            os.kill(cluster[2].pid, signal.SIGCONT)


def test_a_silent_node_costs_one_request_timeout(cluster, admin_factory):
    """A node that accepts and never answers: the answer comes once the request timeout passes."""
    populate(cluster)
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(16)  # connections complete in the kernel; nothing is ever read or written
    try:
        silent = "127.0.0.1:%d" % hole.getsockname()[1]
        admin = admin_factory(nsqd_http_addresses=[b.http_addr for b in cluster] + [silent],
                              http_client_connect_timeout=0.5, http_client_request_timeout=0.5)
        started = time.monotonic()
        status, doc = call(admin.http_url + "/api/topics")
        elapsed = time.monotonic() - started
        assert status == 200 and doc["topics"] == ["orders"]
        assert silent in doc["message"] and "timed out" in doc["message"]
        assert elapsed < 15, elapsed  # bounded by the timeout (generous margin: a loaded machine)
        status, text = call(admin.http_url + "/topics")
        assert status == 200 and silent in text
    finally:
        hole.close()


def test_a_trickling_node_is_cut_off_at_the_request_timeout(cluster, admin_factory):
    """A node that answers one byte at a time, forever: the request timeout bounds the whole answer."""
    populate(cluster)
    done = threading.Event()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.1)

    def trickle():
        conns = []
        while not done.is_set():
            try:
                conn, _ = listener.accept()
                conns.append(conn)
            except socket.timeout:
                pass
            for conn in conns:
                try:
                    conn.send(b"H")  # never a whole status line
                except OSError:
                    pass
        for conn in conns:
            conn.close()

    thread = threading.Thread(target=trickle, name="test-trickler", daemon=True)
    thread.start()
    try:
        slow = "127.0.0.1:%d" % listener.getsockname()[1]
        admin = admin_factory(nsqd_http_addresses=[b.http_addr for b in cluster] + [slow],
                              http_client_connect_timeout=0.5, http_client_request_timeout=0.5)
        status, doc = call(admin.http_url + "/api/topics")
        assert status == 200 and doc["topics"] == ["orders"]
        assert slow in doc["message"] and "timed out" in doc["message"]
    finally:
        done.set()
        thread.join(10)
        listener.close()


def test_no_lookupd_answering_is_502(admin_factory):
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    address = "127.0.0.1:%d" % hole.getsockname()[1]
    hole.close()  # nothing listens there now
    admin = admin_factory(lookupd_http_addresses=[address])
    status, doc = call(admin.http_url + "/api/topics")
    assert status == 502 and doc["message"].startswith("UPSTREAM_ERROR: failed to query any nsqlookupd")
    status, text = call(admin.http_url + "/topics")
    assert status == 502 and address in text


# -- the inside view: /debug/state -----------------------------------------------------------


def test_debug_state_follows_a_message(tmp_path):
    with Broker(msg_timeout=1.0, debug_state_bodies=True) as nsqd:
        def state():
            status, body = nsqd.http("GET", "/debug/state?bodies=true")
            assert status == 200
            return json.loads(body)

        def channel():
            [topic] = state()["topics"]
            [c] = topic["channels"]
            return c

        assert nsqd.http("POST", "/pub?topic=tour", b"before any channel")[0] == 200
        [topic] = state()["topics"]
        assert (topic["name"], topic["memory_depth"], topic["channels"]) == ("tour", 1, [])
        assert topic["memory"][0]["body"] == "before any channel"
        assert topic["backend"]["kind"] == "DiskQueue" and topic["backend"]["write_file_num"] == 0

        with Conn(nsqd.tcp_address) as consumer:
            consumer.identify(user_agent="learner")
            consumer.sub("tour", "watch", rdy=0)
            wait_for(lambda: state()["topics"][0]["channels"] and channel()["memory_depth"] == 1,
                     what="the message to reach the channel")
            c = channel()
            assert c["memory"][0]["body"] == "before any channel"
            assert c["clients"][0]["ready_count"] == 0 and c["clients"][0]["user_agent"] == "learner"

            consumer.cmd(b"RDY 1")
            _, attempts, msg_id, body = consumer.read_message()
            c = channel()
            assert c["in_flight_count"] == 1 and c["memory_depth"] == 0
            [flying] = c["in_flight"]
            assert flying["id"] == msg_id.decode() and flying["attempts"] == 1
            assert 0 < flying["deadline_in_ms"] <= 1000 and flying["client_id"] == c["clients"][0]["id"]
            assert c["clients"][0]["in_flight_count"] == 1

            # let it time out: back to the queue, counted, redelivered
            _, attempts, again, _ = consumer.read_message()
            assert again == msg_id and attempts == 2
            c = channel()
            assert c["timeout_count"] == 1 and c["in_flight"][0]["attempts"] == 2

            consumer.cmd(b"REQ " + msg_id + b" 60000")
            wait_for(lambda: channel()["deferred_count"] == 1, what="the deferred requeue")
            [later] = channel()["deferred"]
            assert later["id"] == msg_id.decode() and 55000 < later["due_in_ms"] <= 60000
            assert channel()["requeue_count"] == 1

        threads = [t["name"] for t in state()["threads"]]
        assert "nsqd-topic-pump[tour]" in threads
        by_name = {t["name"]: t for t in state()["threads"]}
        if hasattr(sys, "_current_frames"):
            assert by_name["nsqd-topic-pump[tour]"]["waiting_in"].startswith("_")


def test_debug_state_lists_are_bounded():
    with Broker(debug_state_bodies=True) as nsqd:
        with Conn(nsqd.tcp_address) as consumer:
            consumer.sub("many", "c", rdy=0)
            consumer.mpub("many", [b"m%d" % i for i in range(250)])
            status, body = nsqd.http("GET", "/debug/state?bodies=true")
            c = json.loads(body)["topics"][0]["channels"][0]
            assert c["memory_depth"] == 250 and len(c["memory"]) == 100
            assert c["memory"][0]["body"] == "m0"


def test_inside_view_through_admin(cluster, admin):
    populate(cluster)
    node = node_of(cluster[0])
    status, doc = call(admin.http_url + "/api/nodes/%s/state" % node)
    assert status == 200
    assert [t["name"] for t in doc["topics"]] == ["orders"]
    assert doc["topics"][0]["channels"][0]["memory_depth"] == 2


def test_inside_view_narrowed_to_one_topic(cluster, admin):
    populate(cluster)
    populate(cluster, topic="payments")
    node = node_of(cluster[0])
    status, doc = call(admin.http_url + "/api/nodes/%s/state" % node)
    assert sorted(t["name"] for t in doc["topics"]) == ["orders", "payments"]
    status, doc = call(admin.http_url + "/api/nodes/%s/state?topic=payments" % node)
    assert status == 200 and [t["name"] for t in doc["topics"]] == ["payments"]
    status, text = call(admin.http_url + "/nodes/%s/inside?topic=payments" % node)
    assert status == 200 and 'data-api="/api/nodes/%s/state?topic=payments"' % seg(node) in text
    assert 'href="/nodes/%s/inside" class="all-topics"' % seg(node) in text
    # the topic page and the node page link each node's inside view of that topic
    status, text = call(admin.http_url + "/topics/payments")
    assert 'href="/nodes/%s/inside?topic=payments"' % seg(node) in text
    status, text = call(admin.http_url + "/nodes/" + node)
    assert 'href="/nodes/%s/inside?topic=payments"' % seg(node) in text


# -- the command -----------------------------------------------------------------------------


def run_command(*args, timeout=30):
    return subprocess.run([sys.executable, "-m", "nsqd_threaded.admin"] + list(args), capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def test_command_refuses_what_it_does_not_build():
    result = run_command("--lookupd-http-address=127.0.0.1:4161", "--graphite-url=http://graphite")
    assert result.returncode == 2 and "--graphite-url is not supported" in result.stderr
    result = run_command("--http-address=127.0.0.1:0")
    assert result.returncode == 1
    assert "FATAL: failed to instantiate nsqadmin - --nsqd-http-address or --lookupd-http-address required" in (
        result.stderr + result.stdout)
    result = run_command("--lookupd-http-address=a:1", "--nsqd-http-address=b:2")
    assert result.returncode == 1 and "not both" in result.stderr + result.stdout
    result = run_command("--help")
    assert result.returncode == 0 and "--graphite-url" in result.stdout and "not supported" in result.stdout


def test_command_serves_until_signalled(cluster):
    populate(cluster)
    proc = subprocess.Popen(
        [sys.executable, "-m", "nsqd_threaded", "nsqadmin", "-http-address=127.0.0.1:0",
         "-lookupd-http-address", cluster.lookupd.http_addr],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        address = None
        lines = []
        deadline = time.monotonic() + 30
        while address is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break  # exited: the assert below shows what it said
            lines.append(line)
            if "HTTP: listening on " in line:
                address = line.rsplit(" ", 1)[1].strip()
        assert address, lines
        assert call("http://%s/api/topics" % address)[1] == {"topics": ["orders"], "message": ""}
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
