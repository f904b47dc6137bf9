"""nsqadmin-threaded next to Go nsqadmin 1.3 (when its binary is present; skipped otherwise).

Both run against one cluster (our lookupd and three of our brokers, with a
consumer holding messages in flight); every API route of both is asked the
same question, and the answers must have the same JSON shape (key sets,
recursively) and the same deterministic values.  Then our nsqadmin runs
against Go nsqlookupd and Go nsqd.
"""

import os
import socket
import subprocess

import pytest

from nsqd_threaded.testing import Cluster

from support.admin import call, start_admin
from support.wire import Conn, wait_for

pytestmark = pytest.mark.timeout(120)

GO_BIN = os.environ.get("NSQ_GO_BIN", "/work/shared/reference/go-nsq-1.3.0")
GO_NSQADMIN = os.path.join(GO_BIN, "nsqadmin")
GO_NSQD = os.path.join(GO_BIN, "nsqd")
GO_NSQLOOKUPD = os.path.join(GO_BIN, "nsqlookupd")

needs_go_admin = pytest.mark.skipif(not os.access(GO_NSQADMIN, os.X_OK), reason="Go nsqadmin binary absent")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GoProcess:
    """A Go reference binary on 127.0.0.1, stopped (and reaped) at exit."""

    def __init__(self, path, *args, ping_port):
        self.proc = subprocess.Popen([path] + list(args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     stdin=subprocess.DEVNULL)
        self.url = "http://127.0.0.1:%d" % ping_port

        def up():
            assert self.proc.poll() is None, "%s exited %s" % (path, self.proc.returncode)
            try:
                return call(self.url + "/ping", timeout=2)[0] == 200
            except OSError:
                return False

        wait_for(up, timeout=30, what="%s to answer /ping" % os.path.basename(path))

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def shape(doc):
    """A document's JSON shape: dict keys recursively, a list by its first element, scalars by kind."""
    if isinstance(doc, dict):
        return {k: shape(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [shape(doc[0])] if doc else []
    if isinstance(doc, bool):
        return "bool"
    if isinstance(doc, (int, float)):
        return "number"
    if doc is None:
        return None
    return type(doc).__name__


def shape_differences(ours, go, path="$"):
    """Where two shapes differ; null and an empty list match either (Go's nil slices)."""
    if ours is None or go is None or ours == [] or go == []:
        return [] if (ours in (None, []) or go in (None, [])) else ["%s: %r vs %r" % (path, ours, go)]
    if isinstance(ours, dict) and isinstance(go, dict):
        out = []
        if set(ours) != set(go):
            out.append("%s: keys only ours %s, only Go's %s" % (path, sorted(set(ours) - set(go)),
                                                                  sorted(set(go) - set(ours))))
        for k in set(ours) & set(go):
            out.extend(shape_differences(ours[k], go[k], "%s.%s" % (path, k)))
        return out
    if isinstance(ours, list) and isinstance(go, list):
        return shape_differences(ours[0], go[0], path + "[0]")
    return [] if ours == go else ["%s: %r vs %r" % (path, ours, go)]


# Go nsqadmin's topic view totals each channel into the first node's own document (pointer
# aliasing), so that total keeps the per-node "value" of each percentile; ours is a fresh total.
GO_ALIASING = {
    "/api/topics/orders $.channels[0].e2e_processing_latency.percentiles[0]: keys only ours [], only Go's "
    "['value']",
}


def node_totals(doc):
    return sorted((n["node"], n["depth"], n["message_count"]) for n in doc["nodes"])


@needs_go_admin
def test_api_matches_go_nsqadmin_on_one_cluster():
    with Cluster(3, "--e2e-processing-latency-percentile=1.0,0.5") as cluster:
        for i, broker in enumerate(cluster):
            broker.http("POST", "/topic/create?topic=orders")
            broker.http("POST", "/channel/create?topic=orders&channel=billing")
            broker.http("POST", "/channel/create?topic=orders&channel=audit")
            for n in range(3 + i):
                broker.http("POST", "/pub?topic=orders", b"order %d" % n)
        broker.http("POST", "/pub?topic=quiet", b"x")
        wait_for(lambda: len(cluster.lookupd.lookup("orders")) == 3 and cluster.lookupd.lookup("quiet"))
        port = free_port()
        go = GoProcess(GO_NSQADMIN, "--http-address=127.0.0.1:%d" % port,
                       "--lookupd-http-address=" + cluster.lookupd.http_addr, ping_port=port)
        ours = start_admin(lookupd_http_addresses=[cluster.lookupd.http_addr])
        try:
            with Conn(cluster[0].tcp_address) as consumer:
                consumer.identify(user_agent="compare/1.0", hostname="comparer")
                consumer.sub("orders", "billing", rdy=2)
                _, _, first, _ = consumer.read_message()
                consumer.read_message()
                consumer.cmd(b"FIN " + first)  # one FIN: the e2e latency has a sample
                wait_for(lambda: cluster[0].stats(topic="orders")["topics"][0]["channels"][1]["in_flight_count"]
                         == 2, what="two in flight")
                node = cluster[0].http_addr
                routes = ["/api/topics", "/api/topics?inactive=true", "/api/topics/orders",
                          "/api/topics/orders/billing", "/api/topics/orders/audit", "/api/topics/orders/nope",
                          "/api/nodes", "/api/nodes/" + node, "/api/counter", "/api/topics/nope",
                          "/api/nodes/127.0.0.1:1"]
                answers = {}
                for route in routes:
                    answers[route] = (call(ours.http_url + route), call(go.url + route))
            differences = []
            for route, ((our_status, our_doc), (go_status, go_doc)) in answers.items():
                if our_status != go_status:
                    differences.append("%s: status %d vs Go's %d" % (route, our_status, go_status))
                    continue
                differences.extend(route + " " + d for d in shape_differences(shape(our_doc), shape(go_doc))
                                   if route + " " + d not in GO_ALIASING)
            assert not differences, "\n".join(differences)

            def both(route):
                return answers[route][0][1], answers[route][1][1]

            for route in ("/api/topics", "/api/topics?inactive=true", "/api/counter", "/api/topics/orders/nope",
                          "/api/nodes/127.0.0.1:1"):
                assert both(route)[0] == both(route)[1], route
            ours_doc, go_doc = both("/api/topics/nope")
            assert ours_doc["message"].startswith("UPSTREAM_ERROR: failed to query any nsqlookupd")
            assert go_doc["message"].startswith("UPSTREAM_ERROR: failed to query any nsqlookupd")

            for route in ("/api/topics/orders", "/api/topics/orders/billing", "/api/topics/orders/audit"):
                o, g = both(route)
                for key in ("node", "topic_name", "channel_name", "depth", "memory_depth", "backend_depth",
                            "in_flight_count", "deferred_count", "requeue_count", "timeout_count",
                            "message_count", "paused", "message"):
                    assert o.get(key) == g.get(key), (route, key, o.get(key), g.get(key))
                assert node_totals(o) == node_totals(g), route
            o, g = both("/api/topics/orders")
            assert [c["channel_name"] for c in o["channels"]] == [c["channel_name"] for c in g["channels"]]
            assert [(c["depth"], c["message_count"]) for c in o["channels"]] == [
                (c["depth"], c["message_count"]) for c in g["channels"]]
            assert o["e2e_processing_latency"]["count"] == g["e2e_processing_latency"]["count"]
            o, g = both("/api/topics/orders/billing")
            keep = ("node", "remote_address", "hostname", "user_agent", "ready_count", "in_flight_count",
                    "finish_count", "message_count", "tls", "snappy", "deflate", "client_id", "connect_ts")
            assert [{k: c[k] for k in keep} for c in o["clients"]] == [{k: c[k] for k in keep} for c in g["clients"]]

            o, g = both("/api/nodes")

            def nodes(doc):
                return sorted((n["broadcast_address"], n["tcp_port"], n["http_port"], n["version"], n["hostname"],
                               n["remote_address"], tuple(n["remote_addresses"]), n["out_of_date"],
                               tuple((t["topic"], t["tombstoned"]) for t in n["topics"])) for n in doc["nodes"])

            assert nodes(o) == nodes(g)
            o, g = both("/api/nodes/" + node)
            assert (o["node"], o["total_messages"], o["total_clients"], o["message"]) == (
                g["node"], g["total_messages"], g["total_clients"], g["message"])
            assert [t["topic_name"] for t in o["topics"]] == [t["topic_name"] for t in g["topics"]]

            # the actions answer alike, and act alike
            for url in (ours.http_url, go.url):
                assert call(url + "/api/topics/orders/audit", "POST", {"action": "bogus"}) == (
                    400, {"message": "INVALID_ACTION"})
                assert call(url + "/api/topics", "POST", {"topic": "bad!"}) == (400, {"message": "INVALID_TOPIC"})
                assert call(url + "/api/nodes/" + node, "DELETE", b"{", {"Content-Type": "application/json"}) == (400, {"message": "INVALID_BODY"})
            assert call(go.url + "/api/topics/orders/audit", "POST", {"action": "pause"}) == (200, {"message": ""})
            assert call(ours.http_url + "/api/topics/orders/audit")[1]["paused"] is True
            assert call(ours.http_url + "/api/topics/orders/audit", "POST", {"action": "unpause"}) == (
                200, {"message": ""})
            assert call(go.url + "/api/topics/orders/audit")[1]["paused"] is False
        finally:
            ours.stop()
            go.stop()


@pytest.mark.skipif(not (os.access(GO_NSQD, os.X_OK) and os.access(GO_NSQLOOKUPD, os.X_OK)),
                    reason="Go nsqd/nsqlookupd binaries absent")
def test_our_admin_over_go_nsqd_and_go_nsqlookupd(tmp_path):
    lookupd_tcp, lookupd_http = free_port(), free_port()
    procs = [GoProcess(GO_NSQLOOKUPD, "--tcp-address=127.0.0.1:%d" % lookupd_tcp,
                       "--http-address=127.0.0.1:%d" % lookupd_http, "--broadcast-address=127.0.0.1",
                       ping_port=lookupd_http)]
    ours = None
    try:
        brokers = []
        for i in range(2):
            tcp, http_port = free_port(), free_port()
            data = tmp_path / ("nsqd%d" % i)
            data.mkdir()
            procs.append(GoProcess(GO_NSQD, "--tcp-address=127.0.0.1:%d" % tcp,
                                   "--http-address=127.0.0.1:%d" % http_port, "--broadcast-address=127.0.0.1",
                                   "--data-path=%s" % data, "--lookupd-tcp-address=127.0.0.1:%d" % lookupd_tcp,
                                   ping_port=http_port))
            brokers.append((tcp, http_port))
            call("http://127.0.0.1:%d/topic/create?topic=go_orders" % http_port, "POST")
            call("http://127.0.0.1:%d/channel/create?topic=go_orders&channel=c" % http_port, "POST")
            call("http://127.0.0.1:%d/pub?topic=go_orders" % http_port, "POST", b"hello")

        def registered():
            status, doc = call("http://127.0.0.1:%d/lookup?topic=go_orders" % lookupd_http)
            return status == 200 and len(doc["producers"]) == 2

        wait_for(registered, timeout=30, what="Go nsqd registering")
        ours = start_admin(lookupd_http_addresses=["127.0.0.1:%d" % lookupd_http])
        assert call(ours.http_url + "/api/topics")[1] == {"topics": ["go_orders"], "message": ""}
        t = call(ours.http_url + "/api/topics/go_orders")[1]
        assert (t["message_count"], len(t["nodes"]), t["channels"][0]["depth"], t["message"]) == (2, 2, 2, "")
        with Conn(("127.0.0.1", brokers[0][0])) as consumer:
            consumer.identify(user_agent="ours-on-go")
            consumer.sub("go_orders", "c", rdy=1)
            consumer.read_message()
            c = call(ours.http_url + "/api/topics/go_orders/c")[1]
            assert c["in_flight_count"] == 1 and c["clients"][0]["user_agent"] == "ours-on-go"
        assert len(call(ours.http_url + "/api/nodes")[1]["nodes"]) == 2
        assert call(ours.http_url + "/api/topics/go_orders/c", "POST", {"action": "pause"})[0] == 200
        for _, http_port in brokers:
            stats = call("http://127.0.0.1:%d/stats?format=json" % http_port)[1]
            assert stats["topics"][0]["channels"][0]["paused"] is True
        for path in ("/topics", "/topics/go_orders", "/topics/go_orders/c", "/nodes", "/counter", "/lookup",
                     "/nodes/127.0.0.1:%d" % brokers[1][1]):
            assert call(ours.http_url + path)[0] == 200, path
        # Go nsqd has no /debug/state: the inside view says so (502), the page itself renders
        assert call(ours.http_url + "/api/nodes/127.0.0.1:%d/state" % brokers[0][1])[0] == 502
        assert call(ours.http_url + "/api/topics/go_orders", "DELETE")[0] == 200
        assert call("http://127.0.0.1:%d/stats?format=json" % brokers[0][1])[1]["topics"] == []
    finally:
        if ours is not None:
            ours.stop()
        for p in reversed(procs):
            p.stop()
