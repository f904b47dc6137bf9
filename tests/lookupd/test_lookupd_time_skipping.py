"""Time skipping on nsqlookupd (Lookupd.advance, POST /debug/time/skip) and across a Cluster."""

import json
import socket
import struct

import pytest

from nsqd_threaded.testing import Cluster, Lookupd
from nsqd_threaded.internal.clock import TimeSkippingDisabled

from support.wire import Conn

pytestmark = pytest.mark.timeout(120)


class Peer:
    """A raw V1 peer that registers once and never pings (an nsqd that hung)."""

    def __init__(self, lookupd, http_port=4151):
        self.sock = socket.create_connection(lookupd.tcp_address, timeout=10)
        self.sock.sendall(b"  V1")
        body = json.dumps({"broadcast_address": "127.0.0.1", "hostname": "h", "http_port": http_port,
                           "tcp_port": 4150, "version": "1.3.0"}).encode()
        self.sock.sendall(b"IDENTIFY\n" + struct.pack(">i", len(body)) + body)
        self._response()

    def _response(self):
        buf = b""
        while len(buf) < 4 or len(buf) < 4 + struct.unpack(">i", buf[:4])[0]:
            chunk = self.sock.recv(4096)
            assert chunk, "lookupd closed the connection"
            buf += chunk
        return buf[4:]

    def register(self, topic):
        self.sock.sendall(b"REGISTER %s\n" % topic.encode())
        assert self._response() == b"OK"

    def close(self):
        self.sock.close()


def test_lookupd_advance_expires_an_inactive_producer():
    with Lookupd() as lookupd:
        peer = Peer(lookupd)
        try:
            peer.register("t")
            assert lookupd.lookup("t") == ["127.0.0.1:4150"]
            assert lookupd.advance(299) == 299
            assert lookupd.lookup("t") == ["127.0.0.1:4150"]  # heard from 299 s ago: still active
            skipped = lookupd.advance()  # to the default --inactive-producer-timeout (300 s)
            assert 0.0 < skipped <= 1.0
            assert lookupd.lookup("t") == []
            assert lookupd.nodes() == []
            assert lookupd.advance() == 0.0  # nothing left to expire
        finally:
            peer.close()


def test_lookupd_advance_expires_a_tombstone():
    with Lookupd() as lookupd:
        peer = Peer(lookupd, http_port=4151)
        try:
            peer.register("t")
            status, _ = lookupd.http("POST", "/topic/tombstone?topic=t&node=127.0.0.1:4151")
            assert status == 200
            assert lookupd.lookup("t") == []
            skipped = lookupd.advance()  # the default --tombstone-lifetime (45 s) ends first
            assert 44.0 < skipped <= 45.0
            assert lookupd.lookup("t") == ["127.0.0.1:4150"]
        finally:
            peer.close()


def test_lookupd_http_skip_route():
    with Lookupd() as lookupd:
        status, body = lookupd.http("POST", "/debug/time/skip?by=10s")
        assert status == 200 and json.loads(body)["skipped"] == 10
        status, body = lookupd.http("GET", "/debug/time")
        assert status == 200 and json.loads(body)["next_deadline_in"] is None
    with Lookupd(time_skipping=False) as lookupd:
        assert lookupd.http("POST", "/debug/time/skip?by=10s")[0] == 404
        with pytest.raises(TimeSkippingDisabled):
            lookupd.advance(10)


def test_cluster_advance_moves_every_member():
    with Cluster(2) as cluster:
        subs = []
        try:
            for broker in cluster:
                sub = Conn(broker.tcp_address)
                sub.identify()
                sub.sub("t", "c", 1)
                subs.append(sub)
            with Conn(cluster[0].tcp_address) as pub:
                pub.cmd(b"DPUB t 3600000", b"a")
                assert pub.read_response() == b"OK"
            with Conn(cluster[1].tcp_address) as pub:
                pub.cmd(b"DPUB t 1800000", b"b")
                assert pub.read_response() == b"OK"
            assert 1799.0 < cluster.advance() <= 1800.0  # the earliest deadline of any member
            assert subs[1].read_message()[3] == b"b"
            assert cluster.advance(1800) == 1800
            assert subs[0].read_message()[3] == b"a"
            assert cluster.lookupd.lookupd.clock.skipped == cluster[0].nsqd.clock.skipped
            # the brokers pinged the lookupd after each skip: still registered and active
            assert cluster.lookupd.lookup("t") == sorted(cluster.tcp_addrs)
        finally:
            for sub in subs:
                sub.close()
