"""nsqd joining a cluster: its lookupd peers against a raw fake lookupd and against our NSQLookupd."""

import json
import os
import socket
import struct
import subprocess
import threading
import time
import urllib.request

import pytest

from nsqd_threaded.lookupd.nsqlookupd import NSQLookupd
from nsqd_threaded.wire import protocol_v1

from support.core import wait_until
from support.hostile import HostileNode

pytestmark = pytest.mark.timeout(60)


# -- a fake lookupd recording every byte ------------------------------------------------


class FakeLookupd:
    """A tiny V1 server: records each connection's commands, answers IDENTIFY with ``info`` and the rest ``OK``.

    ``_lock`` guards ``connections`` and ``_socks``.  ``black_hole`` accepts and never answers.
    """

    def __init__(self, port=0, info=None, black_hole=False, identify_reply=None):
        self.info = info if info is not None else {"broadcast_address": "", "http_port": 0, "tcp_port": 0,
                                                   "version": "1.3.0", "hostname": "fake"}
        self.black_hole = black_hole
        self.identify_reply = identify_reply  # raw bytes instead of the JSON of ``info``
        self._lock = threading.Lock()
        self.connections = []  # per connection: {"raw": bytearray, "cmds": [(line, body)], "closed": bool}
        self._socks = []
        self._threads = []
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", port))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.addr = "127.0.0.1:%d" % self.port
        self._accepter = threading.Thread(target=self._accept_loop, name="fake-lookupd-accept", daemon=True)
        self._accepter.start()

    def _accept_loop(self):
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            conn = {"raw": bytearray(), "cmds": [], "closed": False}
            with self._lock:
                self.connections.append(conn)
                self._socks.append(sock)
            t = threading.Thread(target=self._serve, args=(sock, conn), name="fake-lookupd-conn", daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self, sock, conn):
        buf = bytearray()

        def fill():
            chunk = sock.recv(65536)
            if not chunk:
                raise EOFError
            with self._lock:
                conn["raw"] += chunk
            buf.extend(chunk)

        def need(n):
            while len(buf) < n:
                fill()
            out = bytes(buf[:n])
            del buf[:n]
            return out

        try:
            if need(4) != b"  V1":
                return
            while True:
                while b"\n" not in buf:
                    fill()
                line = self._take_line(buf)
                body = None
                if line == b"IDENTIFY":
                    (size,) = struct.unpack(">i", need(4))
                    body = need(size)
                with self._lock:
                    conn["cmds"].append((line.decode(), body))
                if self.black_hole:
                    continue
                if line == b"IDENTIFY":
                    reply = self.identify_reply or json.dumps(self.info).encode()
                else:
                    reply = b"OK"
                sock.sendall(struct.pack(">i", len(reply)) + reply)
        except (EOFError, OSError):
            pass
        finally:
            with self._lock:
                conn["closed"] = True
            sock.close()

    @staticmethod
    def _take_line(buf):
        i = buf.index(b"\n")
        line = bytes(buf[:i])
        del buf[: i + 1]
        return line

    def commands(self, i=None):
        """The command lines (without bodies) of connection ``i`` (default: all, flattened)."""
        with self._lock:
            conns = self.connections if i is None else self.connections[i : i + 1]
            return [c for conn in conns for c, _ in conn["cmds"]]

    def count(self):
        with self._lock:
            return len(self.connections)

    def closed(self, i):
        with self._lock:
            return self.connections[i]["closed"]

    def drop_connections(self):
        """Close every accepted connection (the lookupd 'went away' for its peers)."""
        with self._lock:
            socks = list(self._socks)
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() (Linux)
        except OSError:
            pass
        self.listener.close()
        self._accepter.join(10)
        self.drop_connections()
        deadline = time.monotonic() + 10
        for t in list(self._threads):
            t.join(max(0.0, deadline - time.monotonic()))


@pytest.fixture
def fakes():
    made = []

    def make(**kw):
        f = FakeLookupd(**kw)
        made.append(f)
        return f

    yield make
    for f in made:
        f.close()


def wait_connected(fake):
    """Wait until the broker's peer finished its connect: IDENTIFY, then a REGISTER for everything
    that existed at that moment. Its first PING comes after that pass, so a topic made once a PING
    was seen is registered by its own notification only (made earlier, it could be in both)."""
    wait_until(lambda: "PING" in fake.commands(), what="the first PING after the connect")


def registry(fake):
    """The fake's commands without the PINGs."""
    return [c for c in fake.commands() if c != "PING"]


def lookup_threads():
    return [t for t in threading.enumerate() if t.name.startswith("nsqd-lookup")]


def http(method, url, body=None):
    req = urllib.request.Request(url, data=body, method=method)
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status, resp.read()


def nsqd_url(nsqd):
    return "http://%s:%d" % nsqd.http_address


# -- pure V1 encoders -------------------------------------------------------------------------


def test_v1_command_encoding():
    assert protocol_v1.encode_register("t") == b"REGISTER t\n"
    assert protocol_v1.encode_register("t", "c") == b"REGISTER t c\n"
    assert protocol_v1.encode_unregister("t") == b"UNREGISTER t\n"
    assert protocol_v1.encode_unregister("t", "c#ephemeral") == b"UNREGISTER t c#ephemeral\n"
    body = (b'{"broadcast_address":"127.0.0.1","hostname":"vm","http_port":14251,"tcp_port":14250,'
            b'"topology_region":"","topology_zone":"","version":"1.3.0"}')
    doc = {"version": "1.3.0", "tcp_port": 14250, "http_port": 14251, "hostname": "vm",
           "broadcast_address": "127.0.0.1", "topology_region": "", "topology_zone": ""}
    assert protocol_v1.encode_identify(doc) == b"IDENTIFY\n" + struct.pack(">i", len(body)) + body
    assert protocol_v1.registrations([("a", ["c1", "c2"]), ("b", [])]) == [
        b"REGISTER a c1\n", b"REGISTER a c2\n", b"REGISTER b\n"]
    assert protocol_v1.decode_response_size(b"\x00\x00\x00\x02", 10) == 2
    with pytest.raises(ValueError, match="greater than limit"):
        protocol_v1.decode_response_size(b"\x00\x00\x00\x0b", 10)
    assert protocol_v1.parse_peer_info(b'{"tcp_port":4160,"http_port":4161,"version":"1.3.0",'
                                  b'"broadcast_address":"h","hostname":"x"}') == {
        "tcp_port": 4160, "http_port": 4161, "version": "1.3.0", "broadcast_address": "h", "http_socket": ""}
    with pytest.raises(ValueError):
        protocol_v1.parse_peer_info(b"E_BAD_BODY IDENTIFY missing fields")


def test_lookupd_flags_and_config_key(tmp_path):
    from nsqd_threaded.testing import resolve_options

    values = resolve_options(["--lookupd-tcp-address=127.0.0.1:4160", "--lookupd-tcp-address", "h:1",
                              "--http-client-connect-timeout=250ms", "--http-client-request-timeout=1s"])
    assert values["nsqlookupd_tcp_addresses"] == ["127.0.0.1:4160", "h:1"]
    assert (values["http_client_connect_timeout"], values["http_client_request_timeout"]) == (0.25, 1.0)
    cfg = tmp_path / "nsqd.cfg"
    cfg.write_text('nsqlookupd_tcp_addresses = ["127.0.0.1:4160", "h:2"]\n')
    assert resolve_options(["--config", str(cfg)])["nsqlookupd_tcp_addresses"] == ["127.0.0.1:4160", "h:2"]


# -- against a raw fake lookupd -------------------------------------------------------------


def test_identify_registrations_and_notification_trace(make_nsqd, fakes):
    fake = fakes()
    nsqd = make_nsqd(broadcast_address="127.0.0.1")
    a = nsqd.get_topic("a")
    a.get_channel("c1")
    a.get_channel("c2")
    nsqd.get_topic("b")
    nsqd.set_lookupd_addresses([fake.addr])  # the connect registers what exists
    wait_until(lambda: len(fake.commands()) >= 4, what="IDENTIFY and registrations")
    with fake._lock:
        line, body = fake.connections[0]["cmds"][0]
    assert line == "IDENTIFY"
    assert body == (
        '{"broadcast_address":"127.0.0.1","hostname":%s,"http_port":%d,"tcp_port":%d,'
        '"topology_region":"","topology_zone":"","version":"1.3.0"}'
        % (json.dumps(socket.gethostname()), nsqd.http_address[1], nsqd.tcp_address[1])
    ).encode()
    raw = bytes(fake.connections[0]["raw"])
    assert raw.startswith(b"  V1IDENTIFY\n" + struct.pack(">i", len(body)) + body + b"REGISTER ")
    assert fake.commands(0)[1:] == ["REGISTER a c1", "REGISTER a c2", "REGISTER b"]

    # The spec's trace, in order on this peer.
    url = nsqd_url(nsqd)
    http("POST", url + "/topic/create?topic=lt")
    http("POST", url + "/channel/create?topic=lt&channel=lc")
    http("POST", url + "/channel/delete?topic=lt&channel=lc")
    nsqd.get_topic("eph#ephemeral").get_channel("pre1")
    http("POST", url + "/channel/create?topic=lt&channel=pre1")
    http("POST", url + "/topic/delete?topic=lt")
    expected = [
        "REGISTER lt",
        "REGISTER lt lc",
        "UNREGISTER lt lc",
        "REGISTER eph#ephemeral",
        "REGISTER eph#ephemeral pre1",
        "REGISTER lt pre1",
        "UNREGISTER lt",
        "UNREGISTER lt pre1",
    ]
    wait_until(lambda: len(fake.commands(0)) >= 4 + len(expected), what="the trace")
    assert fake.commands(0)[4:] == expected
    assert fake.count() == 1
    assert "LOOKUPD(%s): peer info {TCPPort:0 HTTPPort:0 Version:1.3.0 BroadcastAddress:}" % fake.addr in \
        nsqd.log.stream.getvalue()
    assert "LOOKUPD(%s): no broadcast address" % fake.addr in nsqd.log.stream.getvalue()
    log = nsqd.log.stream.getvalue()
    assert "LOOKUPD(%s): topic REGISTER lt\n" % fake.addr in log
    assert "LOOKUPD(%s): channel UNREGISTER lt lc\n" % fake.addr in log


@pytest.mark.parametrize("reply", [b"E_INVALID", b"E_BAD_BODY IDENTIFY missing fields"])
def test_identify_refused_closes_and_retries_at_the_next_ping(make_nsqd, fakes, reply):
    fake = fakes(identify_reply=reply)
    nsqd = make_nsqd(lookupd_ping_interval=0.05)
    nsqd.get_topic("t")
    nsqd.set_lookupd_addresses([fake.addr])
    wait_until(lambda: fake.count() >= 2, what="a second attempt")
    assert fake.closed(0) and fake.commands(0) == ["IDENTIFY"]  # nothing registered on a refused IDENTIFY
    assert nsqd.lookupd_http_addresses() == []
    log = nsqd.log.stream.getvalue()
    if reply == b"E_INVALID":
        assert "LOOKUPD(%s): lookupd returned E_INVALID" % fake.addr in log
    else:
        assert "LOOKUPD(%s): parsing response - %s" % (fake.addr, reply.decode()) in log


@pytest.fixture
def channels_answer():
    """A lookupd's HTTP side answering ``/channels`` with ``channels`` (a HostileNode: ``gated``, the
    test releases each answer); its ``info`` is the IDENTIFY answer that points the broker at it."""
    made = []

    def make(channels, gated=False):
        node = HostileNode({"/channels": {"channels": channels}}, gated=gated)
        made.append(node)
        node.info = {"broadcast_address": "127.0.0.1", "http_port": node.http_port, "tcp_port": 1,
                     "version": "1.3.0"}
        return node

    yield make
    for node in made:
        node.close()


def channel_names(topic):
    return sorted(c.name for c in topic.channels())


def test_channel_query_request(make_nsqd, fakes, channels_answer):
    """The pre-creation query as nsqd sends it: path, escaping, V1 Accept header; a V1 answer."""
    answer = channels_answer(["z", "a", "a", "skip#ephemeral"])
    fake = fakes(info=answer.info)
    nsqd = make_nsqd(nsqlookupd_tcp_addresses=[fake.addr], lookupd_ping_interval=0.05)
    wait_connected(fake)
    assert nsqd.lookupd_http_addresses() == [answer.node]
    topic = nsqd.get_topic("q#ephemeral")
    assert answer.requests == ["/channels?topic=q%23ephemeral"]
    assert answer.accepts == ["application/vnd.nsq; version=1.0"]
    assert channel_names(topic) == ["a", "z"]
    wait_until(lambda: registry(fake)[-1:] == ["REGISTER q#ephemeral z"], what="REGISTERs")
    assert registry(fake)[1:] == ["REGISTER q#ephemeral", "REGISTER q#ephemeral a", "REGISTER q#ephemeral z"]


def test_a_channel_deleted_while_the_lookupds_answer_is_not_created_again(make_nsqd, fakes, channels_answer):
    """The answer to the pre-creation query can predate a deletion made here meanwhile (an
    operator's, or the last consumer of a channel leaving): that channel stays deleted, and
    the answer's other channels are created."""
    answer = channels_answer(["c", "d"], gated=True)
    fake = fakes(info=answer.info)
    nsqd = make_nsqd(nsqlookupd_tcp_addresses=[fake.addr], lookupd_ping_interval=0.05)
    wait_connected(fake)
    creator = threading.Thread(target=nsqd.get_topic, args=("t",), name="test-topic-creator", daemon=True)
    creator.start()
    assert answer.arrived.wait(30)
    topic = nsqd.get_existing_topic("t")
    topic.get_channel("c")
    topic.delete_channel("c")
    answer.answer.set()
    creator.join(30)
    assert channel_names(topic) == ["d"]
    # A deletion before the cluster is asked again does not count against its answer.
    mark = topic.begin_precreation()
    topic.precreate_channels(["c"], mark)
    topic.end_precreation()
    assert channel_names(topic) == ["c", "d"]
    assert channel_names(nsqd.get_topic("u")) == ["c", "d"]


def test_a_held_topic_keeps_a_channel_deleted_before_a_lookupd_answered_deleted(make_nsqd, fakes, channels_answer):
    """A topic made while no lookupd answers is queried when one does: a channel created and
    deleted here meanwhile is not brought back by that answer."""
    answer = channels_answer(["c", "d"])
    fake = fakes(info=answer.info, identify_reply=b"E_INVALID")  # connected, but no answer yet
    nsqd = make_nsqd(nsqlookupd_tcp_addresses=[fake.addr], lookupd_ping_interval=0.05)
    wait_until(lambda: fake.count() >= 1, what="a first attempt")
    topic = nsqd.get_topic("t")  # held: no lookupd to ask
    topic.get_channel("c")
    topic.delete_channel("c")
    assert channel_names(topic) == []
    fake.identify_reply = None  # the next attempt is answered, then the held topic is queried
    wait_until(lambda: channel_names(topic) == ["d"], what="the answer's channels")
    assert answer.arrived.is_set()
    assert channel_names(topic) == ["d"]


def test_ephemeral_auto_delete_unregisters(make_nsqd, fakes):
    fake = fakes()
    nsqd = make_nsqd(nsqlookupd_tcp_addresses=[fake.addr], lookupd_ping_interval=0.05)
    wait_connected(fake)
    sub = socket.create_connection(nsqd.tcp_address, timeout=10)
    sub.sendall(b"  V2SUB e#ephemeral c#ephemeral\n")
    reply = b""
    while len(reply) < 10:
        chunk = sub.recv(10 - len(reply))
        assert chunk, "closed after %r" % reply
        reply += chunk
    assert reply == struct.pack(">ii", 6, 0) + b"OK"
    wait_until(lambda: len(registry(fake)) >= 3, what="REGISTERs")
    sub.close()  # the last consumer leaves: the channel, then the topic, are deleted
    wait_until(lambda: len(registry(fake)) >= 5, what="UNREGISTERs")
    assert registry(fake)[1:] == [
        "REGISTER e#ephemeral", "REGISTER e#ephemeral c#ephemeral",
        "UNREGISTER e#ephemeral c#ephemeral", "UNREGISTER e#ephemeral",
    ]


def test_ping_reconnect_and_reregister(make_nsqd, fakes):
    fake = fakes()
    nsqd = make_nsqd(lookupd_ping_interval=0.05)
    nsqd.get_topic("t").get_channel("c")
    nsqd.get_topic("u")
    nsqd.set_lookupd_addresses([fake.addr])
    wait_until(lambda: fake.commands(0).count("PING") >= 2, what="PINGs")
    assert fake.commands(0)[:4] == ["IDENTIFY", "REGISTER t c", "REGISTER u", "PING"]

    # The lookupd goes away: the peer notices (a PING fails, or the idle check sees the close) and
    # dials again, registering everything.
    fake.drop_connections()
    wait_until(lambda: fake.count() >= 2 and len(fake.commands(1)) >= 4, what="reconnect")
    assert fake.commands(1)[:4] == ["IDENTIFY", "REGISTER t c", "REGISTER u", "PING"]

    # The lookupd restarts on the same port.
    port = fake.port
    fake.close()
    fake2 = fakes(port=port)
    wait_until(lambda: len(fake2.commands()) >= 4, what="reconnect to the restarted lookupd")
    assert fake2.commands(0)[:4] == ["IDENTIFY", "REGISTER t c", "REGISTER u", "PING"]
    assert "LOOKUP connecting to %s" % fake.addr in nsqd.log.stream.getvalue()


def test_shutdown_sends_no_unregister_and_joins_peers(make_nsqd, fakes):
    fake = fakes()
    nsqd = make_nsqd(nsqlookupd_tcp_addresses=[fake.addr])
    nsqd.get_topic("t").get_channel("c")
    wait_until(lambda: len(fake.commands()) >= 3, what="registrations")
    assert [t.name for t in lookup_threads()] == ["nsqd-lookup[%s]" % fake.addr]
    nsqd.stop()
    wait_until(lambda: fake.closed(0), what="the peer connection to close")
    assert not [c for c in fake.commands() if c.startswith("UNREGISTER")]
    assert lookup_threads() == []


def test_put_config_changes_peers(make_nsqd, fakes):
    a, b = fakes(), fakes()
    nsqd = make_nsqd(nsqlookupd_tcp_addresses=[a.addr])
    nsqd.get_topic("t")
    wait_until(lambda: "REGISTER t" in a.commands(), what="a registered")
    url = nsqd_url(nsqd) + "/config/nsqlookupd_tcp_addresses"
    status, body = http("PUT", url, json.dumps([b.addr]).encode())
    assert (status, json.loads(body)) == (200, [b.addr])
    wait_until(lambda: a.closed(0), what="a dropped")
    wait_until(lambda: "REGISTER t" in b.commands(), what="b registered")
    assert [t.name for t in lookup_threads()] == ["nsqd-lookup[%s]" % b.addr]

    status, body = http("PUT", url, json.dumps([a.addr, b.addr]).encode())
    assert json.loads(http("GET", url)[1]) == [a.addr, b.addr]
    wait_until(lambda: a.count() == 2 and "REGISTER t" in a.commands(1), what="a back")
    nsqd.get_topic("v")
    wait_until(lambda: "REGISTER v" in a.commands(1) and "REGISTER v" in b.commands(0), what="both notified")
    assert b.count() == 1  # kept, not reconnected
    assert sorted(t.name for t in lookup_threads()) == sorted(
        ["nsqd-lookup[%s]" % a.addr, "nsqd-lookup[%s]" % b.addr])

    http("PUT", url, b"[]")
    wait_until(lambda: not lookup_threads(), what="every peer joined")


# -- down, black-holed and slow lookupds never block the broker ------------------------------------


def test_down_and_black_holed_lookupds_block_nothing(make_nsqd, fakes):
    # A port with nothing listening, a lookupd that accepts and never answers, and a healthy one.
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    down = "127.0.0.1:%d" % s.getsockname()[1]
    s.close()
    hole = fakes(black_hole=True)
    good = fakes()
    nsqd = make_nsqd(nsqlookupd_tcp_addresses=[down, hole.addr, good.addr], lookupd_ping_interval=0.2)
    wait_until(lambda: hole.commands() == ["IDENTIFY"], what="IDENTIFY sent into the black hole")
    url = nsqd_url(nsqd)
    for i in range(20):  # new topics and channels while the black hole holds its peer in a read
        assert http("POST", url + "/pub?topic=t%d" % i, b"x")[0] == 200
        http("POST", url + "/channel/create?topic=t%d&channel=c" % i)
    wait_until(lambda: "REGISTER t19 c" in good.commands(), what="the healthy lookupd is told")
    first, second = [c for c in good.commands() if c != "PING"][:2]
    # t0 first: told as it was made, or (connected after t0 got its channel, on a loaded machine) in the
    # registrations sent at connect
    assert (first, second) in (("IDENTIFY", "REGISTER t0"), ("IDENTIFY", "REGISTER t0 c"))
    log = nsqd.log.stream.getvalue()
    assert "no available nsqlookupd to query for channels to pre-create for topic t0" in log
    wait_until(lambda: "LOOKUPD(%s): IDENTIFY - i/o timeout" % hole.addr in nsqd.log.stream.getvalue(),
               what="the black hole's read deadline")
    nsqd.stop()  # bounded by the 1 s deadlines (and this test's timeout)
    assert lookup_threads() == []


# -- against our NSQLookupd --------------------------------------------------------------------


@pytest.fixture
def lookupd():
    with NSQLookupd.local() as lk:
        yield lk


def lookupd_get(lk, path):
    return json.loads(http("GET", lk.http_url + path)[1])


def test_lookup_shows_node_and_channels(make_nsqd, lookupd):
    nsqd = make_nsqd(nsqlookupd_tcp_addresses=[lookupd.tcp_addr], broadcast_address="127.0.0.1")
    nsqd.get_topic("t").get_channel("c")

    def found():
        try:
            return lookupd_get(lookupd, "/lookup?topic=t")
        except urllib.error.HTTPError:
            return None

    wait_until(lambda: found() and found()["channels"] == ["c"], what="/lookup")
    (producer,) = found()["producers"]
    assert producer["broadcast_address"] == "127.0.0.1"
    assert (producer["tcp_port"], producer["http_port"]) == (nsqd.tcp_address[1], nsqd.http_address[1])
    assert producer["version"] == "1.3.0"
    http("POST", nsqd_url(nsqd) + "/channel/delete?topic=t&channel=c")
    # UNREGISTER removes this producer from the channel (the registration itself stays).
    wait_until(lambda: not lookupd_get(lookupd, "/debug").get("channel:t:c"), what="producer left the channel")
    nsqd.stop()
    wait_until(lambda: lookupd_get(lookupd, "/lookup?topic=t")["producers"] == [], what="producer gone")


def test_channels_are_precreated_from_lookupd(make_nsqd, lookupd):
    nsqd = make_nsqd(nsqlookupd_tcp_addresses=[lookupd.tcp_addr], broadcast_address="127.0.0.1")
    wait_until(lambda: nsqd.lookupd_http_addresses() == [lookupd.http_addr], what="IDENTIFY")
    for ch in ("pre1", "pre2", "eph%23ephemeral"):
        http("POST", lookupd.http_url + "/channel/create?topic=lt&channel=" + ch)
    assert http("POST", nsqd_url(nsqd) + "/pub?topic=lt", b"hello")[0] == 200
    topic = nsqd.get_existing_topic("lt")
    assert sorted(c.name for c in topic.channels()) == ["pre1", "pre2"]
    # The first message reached every pre-created channel.
    wait_until(lambda: all(c.depth() == 1 for c in topic.channels()), what="message in each channel")


def test_precreation_tolerates_a_failing_lookupd(make_nsqd, fakes, lookupd):
    # A lookupd whose IDENTIFY reply points at an HTTP port where nothing listens.
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead_http = s.getsockname()[1]
    s.close()
    fake = fakes(info={"broadcast_address": "127.0.0.1", "http_port": dead_http, "tcp_port": 1, "version": "1.3.0"})
    nsqd = make_nsqd(nsqlookupd_tcp_addresses=[fake.addr, lookupd.tcp_addr], broadcast_address="127.0.0.1")
    wait_until(lambda: len(nsqd.lookupd_http_addresses()) == 2, what="both IDENTIFYs")
    http("POST", lookupd.http_url + "/channel/create?topic=x&channel=c")
    assert http("POST", nsqd_url(nsqd) + "/pub?topic=x", b"m")[0] == 200
    assert [c.name for c in nsqd.get_existing_topic("x").channels()] == ["c"]
    assert "failed to query nsqlookupd for channels to pre-create for topic x" in nsqd.log.stream.getvalue()


def test_pynsq_reader_finds_nsqd_through_lookupd(make_nsqd, lookupd):
    from support.pynsq import Loop

    nsqd = make_nsqd(nsqlookupd_tcp_addresses=[lookupd.tcp_addr], broadcast_address="127.0.0.1")
    nsqd.get_topic("e2e")
    wait_until(lambda: lookupd_get(lookupd, "/topics")["topics"] == ["e2e"], what="topic registered")
    loop = Loop()
    try:
        import nsq

        seen = []
        reader = nsq.Reader(topic="e2e", channel="c", message_handler=lambda m: seen.append(m.body) or True,
                            lookupd_http_addresses=[lookupd.http_url], lookupd_poll_interval=1,
                            max_in_flight=10)
        loop.readers.append(reader)
        loop.run_until(lambda: reader.conns, 20, "the reader to connect via lookupd")
        bodies = [b"m%d" % i for i in range(10)]
        for b in bodies:
            http("POST", nsqd_url(nsqd) + "/pub?topic=e2e", b)
        loop.run_until(lambda: len(seen) >= 10, 20, "messages")
        assert sorted(seen) == sorted(bodies)
    finally:
        loop.close()


# -- side by side with Go's nsqlookupd (optional) ----------------------------------------------

GO_LOOKUPD = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "reference", "go-nsq-1.3.0", "nsqlookupd")


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.skipif(not os.access(GO_LOOKUPD, os.X_OK), reason="Go nsqlookupd binary not present")
def test_against_go_nsqlookupd(make_nsqd, tmp_path):
    tcp, http_port = _free_port(), _free_port()
    proc = subprocess.Popen(
        [GO_LOOKUPD, "--tcp-address=127.0.0.1:%d" % tcp, "--http-address=127.0.0.1:%d" % http_port,
         "--broadcast-address=127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = "http://127.0.0.1:%d" % http_port

        def up():
            try:
                return http("GET", base + "/ping")[0] == 200
            except OSError:
                return False

        wait_until(up, what="Go nsqlookupd")
        http("POST", base + "/channel/create?topic=g&channel=pre")
        nsqd = make_nsqd(nsqlookupd_tcp_addresses=["127.0.0.1:%d" % tcp], broadcast_address="127.0.0.1")
        wait_until(lambda: nsqd.lookupd_http_addresses() == ["127.0.0.1:%d" % http_port], what="IDENTIFY")
        nsqd.get_topic("g").get_channel("c2")
        assert sorted(c.name for c in nsqd.get_existing_topic("g").channels()) == ["c2", "pre"]

        def lookup():
            doc = json.loads(http("GET", base + "/lookup?topic=g")[1])
            return doc

        wait_until(lambda: sorted(lookup()["channels"]) == ["c2", "pre"] and lookup()["producers"],
                   what="Go /lookup")
        (producer,) = lookup()["producers"]
        assert producer["tcp_port"] == nsqd.tcp_address[1]
    finally:
        proc.terminate()
        proc.wait(10)


def test_reregisters_within_a_second_or_two_after_a_long_outage(make_nsqd, make_lookupd):
    # A lookupd that refuses connections for a while (stopped), then accepts again on the same port
    # (a restart, or a partition healing): the broker must not have backed off into Go's 15 s ping
    # cadence, so it is in /nodes again promptly (docs/divergences.md).
    lk = make_lookupd()
    tcp, http_addr = lk.tcp_address, lk.http_address
    addr = "127.0.0.1:%d" % tcp[1]
    nsqd = make_nsqd(nsqlookupd_tcp_addresses=[addr], broadcast_address="127.0.0.1")
    nsqd.get_topic("t")

    def nodes(lookupd):
        return json.loads(http("GET", lookupd.http_url + "/nodes")[1])["producers"]

    wait_until(lambda: len(nodes(lk)) == 1, what="registered")
    lk.stop()
    log = nsqd.log.stream
    start = len(log.getvalue())
    connecting = "LOOKUP connecting to %s" % addr
    # Five refused dials: with an uncapped doubling back-off (1, 2, 4, 8 s) the next would be 16 s away.
    wait_until(lambda: log.getvalue()[start:].count(connecting) >= 5, timeout=40, what="refused dials")
    back = make_lookupd(tcp_address="127.0.0.1:%d" % tcp[1], http_address="127.0.0.1:%d" % http_addr[1])
    wait_until(lambda: len(nodes(back)) == 1, timeout=4.0, what="re-registration after the outage")
