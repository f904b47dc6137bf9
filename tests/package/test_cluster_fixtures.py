"""Cluster fixtures (testing.Lookupd, testing.Cluster, the nsqlookupd and nsq_cluster pytest fixtures)
and nsqd joining our nsqlookupd: registration, deletion, a killed broker, a restarted lookupd."""

import json
import os
import socket
import struct
import threading

import pytest

from nsqd_threaded.client import Consumer
from nsqd_threaded.testing import Broker, BrokerProcess, Cluster, Lookupd

from support.wire import wait_for

pytestmark = pytest.mark.timeout(60)

pytest_plugins = ["pytester"]


def wait_until(predicate, timeout=30.0, what="condition"):
    return wait_for(predicate, timeout, interval=0.005, what=what)


def cluster_threads():
    return [t.name for t in threading.enumerate() if t.name.startswith(("nsqlookupd", "nsqd", "nsq-"))]


# -- the fixtures -------------------------------------------------------------------------


def test_cluster_starts_registered_and_stops_clean():
    before = cluster_threads()
    with Cluster(3) as cluster:
        assert len(cluster) == 3 and all(isinstance(b, Broker) and b.running for b in cluster)
        assert cluster.lookupd.nodes() == sorted(cluster.tcp_addrs)
        assert cluster.lookupd_http_addrs == [cluster.lookupd.http_addr]
        assert all(b.nsqd.options.broadcast_address == "127.0.0.1" for b in cluster)
        data_paths = [b.data_path for b in cluster]
    assert not cluster.lookupd.running and not any(b.running for b in cluster)
    assert not any(os.path.exists(p) for p in data_paths)
    assert cluster_threads() == before


def test_cluster_of_processes():
    with Cluster(2, processes=True, lookupd={"log_level": "debug"}) as cluster:
        assert all(isinstance(b, BrokerProcess) and b.running for b in cluster)
        assert cluster.lookupd.nodes() == sorted(cluster.tcp_addrs)
    assert not any(b.running for b in cluster)


def test_lookupd_restart_keeps_its_ports():
    with Lookupd() as lookupd:
        tcp, http = lookupd.tcp_address, lookupd.http_address
        lookupd.restart()
        assert (lookupd.tcp_address, lookupd.http_address) == (tcp, http)
        assert lookupd.http("GET", "/ping") == (200, b"OK")
        assert "TCP: listening on" in lookupd.log


def test_pytest_fixtures(pytester):
    pytester.makepyfile(
        """
        import pytest

        from nsqd_threaded.client import Consumer, Producer
        from nsqd_threaded.testing import Broker, BrokerProcess, Cluster, Lookupd

        def test_nsqlookupd(nsqlookupd):
            assert isinstance(nsqlookupd, Lookupd) and nsqlookupd.running
            assert nsqlookupd.nodes() == []

        @pytest.mark.nsqlookupd(tombstone_lifetime=2)
        def test_nsqlookupd_marker(nsqlookupd):
            assert nsqlookupd.lookupd.options.tombstone_lifetime == 2

        def test_default_cluster(nsq_cluster):
            assert isinstance(nsq_cluster, Cluster) and len(nsq_cluster) == 3
            assert nsq_cluster.lookupd.nodes() == sorted(nsq_cluster.tcp_addrs)

        @pytest.mark.nsq_cluster(n=2, processes=True)
        @pytest.mark.nsqd("--max-rdy-count=42")
        @pytest.mark.nsqlookupd(inactive_producer_timeout=30)
        def test_cluster_markers(nsq_cluster):
            assert len(nsq_cluster) == 2 and all(isinstance(b, BrokerProcess) for b in nsq_cluster)
            assert nsq_cluster.lookupd.lookupd.options.inactive_producer_timeout == 30
            with Producer(nsq_cluster.tcp_addrs) as p:
                p.pub("t", b"one")
                p.pub("t", b"two")
            # (each broker registers t with lookupd on its own thread: a first query may find one, so
            # the consumer asks again soon rather than after its default minute)
            with Consumer(None, "t", "c", lookupd_http_addresses=nsq_cluster.lookupd_http_addrs,
                          max_in_flight=1000, lookupd_poll_interval=0.2) as c:
                assert c.wait_subscribed(2)
                assert sorted(c.rdy.values()) == [42, 42]  # capped at nsqd's max_rdy_count

        @pytest.mark.nsq_cluster(n=1)
        def test_failure_attaches_logs(nsq_cluster):
            assert False, "boom"
        """
    )
    result = pytester.runpytest("-p", "nsqd_threaded.pytest_plugin", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines(["*Captured nsqlookupd log call*", "*nsqlookupd v* (built w/*",
                                 "*Captured nsqd log call*"])


# -- nsqd registering with our nsqlookupd ---------------------------------------------------


@pytest.mark.nsq_cluster(n=2)
def test_topic_on_two_brokers_then_deleted_on_one(nsq_cluster):
    lookupd = nsq_cluster.lookupd
    a, b = nsq_cluster[0], nsq_cluster[1]
    for broker in (a, b):
        assert broker.http("POST", "/topic/create?topic=both")[0] == 200
        assert broker.http("POST", "/channel/create?topic=both&channel=c")[0] == 200
    wait_until(lambda: lookupd.lookup("both") == sorted([a.tcp_addr, b.tcp_addr]), what="both producers")
    doc = lookupd.get("/lookup?topic=both")
    assert doc["channels"] == ["c"]
    assert {(p["broadcast_address"], p["tcp_port"], p["http_port"]) for p in doc["producers"]} == {
        ("127.0.0.1", a.tcp_address[1], a.http_address[1]), ("127.0.0.1", b.tcp_address[1], b.http_address[1])}
    assert a.http("POST", "/topic/delete?topic=both")[0] == 200
    wait_until(lambda: lookupd.lookup("both") == [b.tcp_addr], what="the deleting broker to leave /lookup")
    assert lookupd.nodes() == sorted([a.tcp_addr, b.tcp_addr])  # a is still a node


@pytest.mark.nsq_cluster(n=2, processes=True)
def test_sigkilled_broker_drops_out(nsq_cluster):
    lookupd = nsq_cluster.lookupd
    victim, survivor = nsq_cluster[0], nsq_cluster[1]
    for broker in nsq_cluster:
        assert broker.http("POST", "/topic/create?topic=k")[0] == 200
    wait_until(lambda: len(lookupd.lookup("k")) == 2, what="both producers")
    victim.kill()
    wait_until(lambda: lookupd.lookup("k") == [survivor.tcp_addr], what="the killed broker to drop out")
    victim.restart()
    wait_until(lambda: len(lookupd.lookup("k")) == 2, what="the restarted broker to register again")


class SilentPeer:
    """A raw protocol V1 peer that IDENTIFYs and REGISTERs, then never PINGs (a hung nsqd)."""

    def __init__(self, lookupd, tcp_port, topic):
        self.sock = socket.create_connection(lookupd.tcp_address, timeout=10)
        body = json.dumps({"broadcast_address": "127.0.0.1", "hostname": "hung", "tcp_port": tcp_port,
                           "http_port": tcp_port + 1, "version": "1.3.0"}).encode()
        self.sock.sendall(b"  V1IDENTIFY\n" + struct.pack(">i", len(body)) + body)
        self._response()
        self.sock.sendall(b"REGISTER %s\n" % topic.encode())
        assert self._response() == b"OK"

    def _response(self):
        size = struct.unpack(">i", self._read(4))[0]
        return self._read(size)

    def _read(self, n):
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            assert chunk, "lookupd closed the connection"
            data += chunk
        return data

    def close(self):
        self.sock.close()


@pytest.mark.nsqlookupd(inactive_producer_timeout=1)
def test_inactive_producer_timeout(nsqlookupd):
    # Our broker PINGs every 0.1 s and stays; a peer that went silent is left out after 1 s.
    with Broker(nsqlookupd_tcp_addresses=[nsqlookupd.tcp_addr], broadcast_address="127.0.0.1",
                lookupd_ping_interval=0.1) as broker:
        assert broker.http("POST", "/topic/create?topic=idle")[0] == 200
        silent = SilentPeer(nsqlookupd, 1, "idle")
        try:
            wait_until(lambda: nsqlookupd.lookup("idle") == sorted([broker.tcp_addr, "127.0.0.1:1"]),
                       what="both producers")
            wait_until(lambda: nsqlookupd.lookup("idle") == [broker.tcp_addr], what="the silent peer to expire")
            assert "127.0.0.1:1" not in nsqlookupd.nodes()
        finally:
            silent.close()


def test_restarted_lookupd_is_repopulated():
    with Cluster(2, lookupd_ping_interval=0.05) as cluster:
        for broker in cluster:
            assert broker.http("POST", "/topic/create?topic=again")[0] == 200
            assert broker.http("POST", "/channel/create?topic=again&channel=c")[0] == 200
        wait_until(lambda: len(cluster.lookupd.lookup("again")) == 2, what="both producers")
        cluster.lookupd.restart()  # same ports, empty registrations
        wait_until(lambda: cluster.lookupd.lookup("again") == sorted(cluster.tcp_addrs),
                   what="the brokers to reconnect and register again")
        assert cluster.lookupd.get("/channels?topic=again")["channels"] == ["c"]
        # and a consumer finds both through it
        with Consumer(None, "again", "c", lookupd_http_addresses=cluster.lookupd_http_addrs) as consumer:
            assert consumer.wait_subscribed(2)
