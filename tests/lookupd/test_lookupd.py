"""NSQLookupd over real sockets: the V1 protocol byte for byte, the HTTP API, expiry, tombstones, lifecycle."""

import http.client
import json
import socket
import struct
import threading
import time

import pytest

from nsqd_threaded.internal.logger import Logger
from nsqd_threaded.lookupd import LookupdOptions, NSQLookupd

from support.logs import LogCapture
from support.lookupd import get_json, request  # noqa: F401 (fixtures among them)
from support.wire import wait_for

pytestmark = pytest.mark.timeout(60)

HOSTNAME = socket.gethostname()
X_NSQ = ("x-nsq-content-type", "nsq; version=1.0")
JSON = ("content-type", "application/json; charset=utf-8")


def identify_body(**fields):
    doc = {"broadcast_address": "127.0.0.1", "hostname": "nsqd-host", "http_port": 4151, "tcp_port": 4150,
           "topology_region": "", "topology_zone": "", "version": "1.3.0"}
    doc.update(fields)
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


class Peer:
    """A raw V1 connection, as nsqd's lookup peer makes one."""

    def __init__(self, lookupd, magic=b"  V1"):
        self.sock = socket.create_connection(lookupd.tcp_address, timeout=10)
        if magic:
            self.sock.sendall(magic)

    @property
    def id(self):
        return "%s:%d" % self.sock.getsockname()[:2]

    def send(self, data):
        self.sock.sendall(data)

    def read_exactly(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise AssertionError("connection closed after %r" % buf)
            buf += chunk
        return buf

    def response(self):
        """One response: (raw bytes incl. size, data)."""
        head = self.read_exactly(4)
        data = self.read_exactly(struct.unpack(">i", head)[0])
        return head + data

    def command(self, line):
        self.send(line + b"\n")
        return self.response()[4:]

    def identify(self, body=None, **fields):
        body = identify_body(**fields) if body is None else body
        self.send(b"IDENTIFY\n" + struct.pack(">i", len(body)) + body)
        return json.loads(self.response()[4:])

    def expect_error(self, data, raw):
        """Send ``data``; the reply must be exactly ``raw``, and then the connection closed."""
        self.send(data)
        assert self.response() == raw
        self.expect_closed()

    def expect_closed(self):
        self.sock.settimeout(10)
        try:
            assert self.sock.recv(1) == b""
        except ConnectionResetError:
            pass

    def close(self):
        self.sock.close()


def sized(data):
    return struct.pack(">i", len(data)) + data


# -- TCP V1 -----------------------------------------------------------------------------


def test_identify_response_and_registration(lookupd):
    peer = Peer(lookupd)
    peer.send(b"IDENTIFY\n" + sized(identify_body()))
    expected = ('{"broadcast_address":"127.0.0.1","hostname":%s,"http_port":%d,"tcp_port":%d,"version":"1.3.0"}' % (
        json.dumps(HOSTNAME), lookupd.http_address[1], lookupd.tcp_address[1])).encode()
    assert peer.response() == sized(expected)
    assert peer.command(b"REGISTER t c") == b"OK"
    assert peer.command(b"REGISTER t2") == b"OK"
    assert peer.command(b"  PING  \r") == b"OK"
    doc = get_json(lookupd, "/lookup?topic=t")
    assert doc == {"channels": ["c"], "producers": [{
        "remote_address": peer.id, "hostname": "nsqd-host", "broadcast_address": "127.0.0.1", "tcp_port": 4150,
        "http_port": 4151, "version": "1.3.0", "topology_zone": "", "topology_region": ""}]}
    status, _, body = request(lookupd, "GET", "/lookup?topic=t")
    assert body.startswith(b'{"channels":["c"],"producers":[{"remote_address":')  # Go's key order
    peer.close()


def test_ping_before_identify(lookupd):
    peer = Peer(lookupd)
    peer.send(b"PING\nPING\n")
    assert peer.response() == b"\x00\x00\x00\x02OK"
    assert peer.response() == b"\x00\x00\x00\x02OK"
    peer.close()


def test_bad_magic(lookupd):
    peer = Peer(lookupd, magic=b"  V2")
    assert peer.response() == b"\x00\x00\x00\x0eE_BAD_PROTOCOL"
    peer.expect_closed()


@pytest.mark.parametrize(
    "data, reply",
    [
        (b"FOO bar\n", b"E_INVALID invalid command FOO"),
        (b"\n", b"E_INVALID invalid command "),
        (b"ping\n", b"E_INVALID invalid command ping"),
        (b"PING\tx\n", b"E_INVALID invalid command PING\tx"),
        (b"REGISTER t\n", b"E_INVALID client must IDENTIFY"),
        (b"UNREGISTER t c\n", b"E_INVALID client must IDENTIFY"),
        (b"IDENTIFY\n" + sized(b"{x"), b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (b"IDENTIFY\n" + sized(b""), b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (b"IDENTIFY\n" + sized(b'{"broadcast_address":"a"}'), b"E_BAD_BODY IDENTIFY missing fields"),
        (b"IDENTIFY\n" + sized(b"null"), b"E_BAD_BODY IDENTIFY missing fields"),
        (b"IDENTIFY\n" + sized(identify_body(tcp_port="1")), b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (b"IDENTIFY\n" + struct.pack(">i", -1), b"E_BAD_BODY IDENTIFY failed to read body"),
    ],
)
def test_errors_before_identify_are_fatal(lookupd, data, reply):
    Peer(lookupd).expect_error(data, sized(reply))


@pytest.mark.parametrize(
    "data, reply",
    [
        (b"REGISTER\n", b"E_INVALID REGISTER insufficient number of params"),
        (b"UNREGISTER\n", b"E_INVALID UNREGISTER insufficient number of params"),
        (b"REGISTER a!b\n", b"E_BAD_TOPIC REGISTER topic name 'a!b' is not valid"),
        (b"REGISTER  t\n", b"E_BAD_TOPIC REGISTER topic name '' is not valid"),
        (b"UNREGISTER t c!\n", b"E_BAD_CHANNEL UNREGISTER channel name 'c!' is not valid"),
        (b"IDENTIFY\n" + sized(identify_body()), b"E_INVALID cannot IDENTIFY again"),
    ],
)
def test_errors_after_identify_are_fatal(lookupd, data, reply):
    peer = Peer(lookupd)
    peer.identify()
    peer.expect_error(data, sized(reply))


@pytest.mark.parametrize(
    "data, reply",
    [
        (b"IDENTIFY\n\x00\x00", b"E_BAD_BODY IDENTIFY failed to read body size"),
        (b"IDENTIFY\n\x00\x00\x00\x10{}", b"E_BAD_BODY IDENTIFY failed to read body"),
    ],
)
def test_truncated_identify(lookupd, data, reply):
    peer = Peer(lookupd)
    peer.send(data)
    peer.sock.shutdown(socket.SHUT_WR)
    assert peer.response() == sized(reply)
    peer.expect_closed()


def test_extra_params_and_identify_keys_case(lookupd):
    peer = Peer(lookupd)
    body = b'{"BROADCAST_ADDRESS":"10.0.0.1","Tcp_Port":1,"http_port":2,"version":"v","remote_address":"spoof"}'
    assert peer.identify(body)["tcp_port"] == lookupd.tcp_address[1]
    assert peer.command(b"REGISTER t c extra") == b"OK"
    producer = get_json(lookupd, "/lookup?topic=t")["producers"][0]
    assert producer["broadcast_address"] == "10.0.0.1" and producer["tcp_port"] == 1
    assert producer["remote_address"] == peer.id  # what the peer claims is ignored
    peer.close()


def test_overlong_line_closes_the_connection(lookupd):
    peer = Peer(lookupd)
    peer.send(b"P" * (64 * 1024 + 1))
    peer.expect_closed()


def test_unregister(lookupd):
    peer = Peer(lookupd)
    peer.identify()
    for line in (b"REGISTER t c1", b"REGISTER t c2", b"REGISTER t c#ephemeral", b"REGISTER e#ephemeral x"):
        assert peer.command(line) == b"OK"
    assert peer.command(b"UNREGISTER t c1") == b"OK"
    assert peer.command(b"UNREGISTER t c#ephemeral") == b"OK"  # ephemeral: the key goes with its last producer
    assert sorted(get_json(lookupd, "/channels?topic=t")["channels"]) == ["c1", "c2"]
    debug = get_json(lookupd, "/debug")
    assert "channel:t:c1" not in debug and "channel:t:c2" in debug
    assert peer.command(b"UNREGISTER t") == b"OK"  # also drops the peer from the topic's channels
    debug = get_json(lookupd, "/debug")
    assert "channel:t:c2" not in debug and "topic:t:" not in debug
    assert get_json(lookupd, "/lookup?topic=t")["producers"] == []  # the topic key stays
    assert peer.command(b"UNREGISTER e#ephemeral") == b"OK"  # ephemeral topic: the key goes
    assert "e#ephemeral" not in get_json(lookupd, "/topics")["topics"]
    assert get_json(lookupd, "/channels?topic=e%23ephemeral")["channels"] == ["x"]
    assert peer.command(b"UNREGISTER nope c") == b"OK"  # nothing registered: still OK
    assert "unexpected UNREGISTER category:channel key:t subkey:c2" in lookupd.log.stream.getvalue()
    peer.close()


def test_disconnect_removes_the_peer_everywhere(lookupd):
    a, b = Peer(lookupd), Peer(lookupd)
    a.identify(http_port=1)
    b.identify(http_port=2)
    a.command(b"REGISTER t c")
    b.command(b"REGISTER t c")
    assert len(get_json(lookupd, "/lookup?topic=t")["producers"]) == 2
    a.close()
    wait_for(lambda: [p["http_port"] for p in get_json(lookupd, "/lookup?topic=t")["producers"]] == [2],
             what="the closed peer to be removed")
    assert [n["http_port"] for n in get_json(lookupd, "/nodes")["producers"]] == [2]
    assert [p["http_port"] for p in get_json(lookupd, "/debug")["channel:t:c"]] == [2]
    b.close()
    wait_for(lambda: get_json(lookupd, "/debug") == {}, what="every producer to be removed")
    # the registration keys themselves stay
    assert get_json(lookupd, "/topics") == {"topics": ["t"]}
    assert get_json(lookupd, "/lookup?topic=t") == {"channels": ["c"], "producers": []}


def test_debug_shows_producers(lookupd):
    peer = Peer(lookupd)
    before = time.time_ns()
    peer.identify(topology_zone="z")
    peer.command(b"REGISTER t")
    status, headers, body = request(lookupd, "GET", "/debug")
    doc = json.loads(body)
    assert list(doc) == ["client::", "topic:t:"]
    entry = doc["topic:t:"][0]
    assert body.count(b'"broadcast_address"') == 2 and list(entry) == sorted(entry)
    assert entry["id"] == peer.id and entry["tombstoned"] is False
    assert entry["tombstoned_at"] == -6795364578871345152 and entry["last_update"] >= before
    assert entry["topology_zone"] == "z" and entry["hostname"] == "nsqd-host"
    peer.close()


# -- HTTP -----------------------------------------------------------------------------------


def test_ping_and_info(lookupd):
    status, headers, body = request(lookupd, "GET", "/ping")
    assert (status, body, headers["content-type"]) == (200, b"OK", "text/plain; charset=utf-8")
    assert "x-nsq-content-type" not in headers
    status, headers, body = request(lookupd, "GET", "/info")
    assert (status, body) == (200, b'{"version":"1.3.0"}')
    assert JSON in headers.items() and X_NSQ in headers.items()


def test_empty_db(lookupd):
    for path, body in [("/topics", b'{"topics":[]}'), ("/nodes", b'{"producers":[]}'), ("/debug", b"{}"),
                       ("/channels?topic=x", b'{"channels":[]}')]:
        assert request(lookupd, "GET", path)[::2] == (200, body), path


@pytest.mark.parametrize(
    "method, path, status, message",
    [
        ("GET", "/lookup", 400, "MISSING_ARG_TOPIC"),
        ("GET", "/lookup?topic=x", 404, "TOPIC_NOT_FOUND"),
        ("GET", "/lookup?topic=a%zz", 400, "INVALID_REQUEST"),
        ("GET", "/lookup?topic=a;b", 400, "INVALID_REQUEST"),
        ("GET", "/channels", 400, "MISSING_ARG_TOPIC"),
        ("GET", "/channels?x=%", 400, "INVALID_REQUEST"),
        ("POST", "/topic/create", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/topic/create?topic=", 400, "INVALID_ARG_TOPIC"),
        ("POST", "/topic/create?topic=a!", 400, "INVALID_ARG_TOPIC"),
        ("POST", "/topic/create?topic=a;b", 400, "INVALID_REQUEST"),
        ("POST", "/topic/delete", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/topic/tombstone", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/topic/tombstone?topic=t", 400, "MISSING_ARG_NODE"),
        ("POST", "/channel/create", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/channel/create?topic=t!&channel=c", 400, "INVALID_ARG_TOPIC"),
        ("POST", "/channel/create?topic=t", 400, "MISSING_ARG_CHANNEL"),
        ("POST", "/channel/create?topic=t&channel=c!", 400, "INVALID_ARG_CHANNEL"),
        ("POST", "/channel/delete", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/channel/delete?topic=t&channel=c!", 400, "INVALID_ARG_CHANNEL"),
        ("POST", "/channel/delete?topic=t&channel=c", 404, "CHANNEL_NOT_FOUND"),
        ("GET", "/nope", 404, "NOT_FOUND"),
        ("GET", "/", 404, "NOT_FOUND"),
        ("GET", "/debug/pprof", 404, "NOT_FOUND"),
        ("DELETE", "/x", 404, "NOT_FOUND"),
    ],
)
def test_http_errors(lookupd, method, path, status, message):
    got_status, headers, body = request(lookupd, method, path)
    assert (got_status, body) == (status, ('{"message":"%s"}' % message).encode())
    assert JSON in headers.items() and X_NSQ in headers.items()


@pytest.mark.parametrize(
    "method, path, allow",
    [("POST", "/ping", "GET, OPTIONS"), ("HEAD", "/info", "GET, OPTIONS"), ("PUT", "/nodes", "GET, OPTIONS"),
     ("GET", "/topic/create", "OPTIONS, POST"), ("GET", "/topic/tombstone", "OPTIONS, POST")],
)
def test_method_not_allowed(lookupd, method, path, allow):
    status, headers, body = request(lookupd, method, path)
    assert status == 405 and headers["allow"] == allow
    assert body == (b"" if method == "HEAD" else b'{"message":"METHOD_NOT_ALLOWED"}')


def test_router_extras(lookupd):
    status, headers, body = request(lookupd, "OPTIONS", "/topic/create")
    assert (status, headers["allow"], body) == (200, "OPTIONS, POST", b"")
    assert "x-nsq-content-type" not in headers
    status, headers, body = request(lookupd, "GET", "/lookup/?topic=t")
    assert (status, headers["location"]) == (301, "/lookup?topic=t")
    assert body == b'<a href="/lookup?topic=t">Moved Permanently</a>.\n\n'
    status, headers, _ = request(lookupd, "GET", "/PING")
    assert (status, headers["location"]) == (301, "/ping")
    assert request(lookupd, "GET", "//topics")[1]["location"] == "/topics"
    status, headers, body = request(lookupd, "POST", "/topic/create/?topic=x")
    assert (status, headers["location"], body) == (307, "/topic/create?topic=x", b"")


def test_topic_and_channel_routes(lookupd):
    def post(path):
        status, headers, body = request(lookupd, "POST", path)
        assert (status, body) == (200, b""), (path, body)
        assert headers.get("content-type") is None and X_NSQ in headers.items()
        assert headers["content-length"] == "0"

    post("/topic/create?topic=t1")
    post("/topic/create?topic=t1")  # idempotent
    post("/channel/create?topic=t2&channel=c1")  # makes the topic too
    post("/channel/create?topic=t2&channel=c2")
    assert get_json(lookupd, "/topics") == {"topics": ["t1", "t2"]}
    assert get_json(lookupd, "/channels?topic=t2") == {"channels": ["c1", "c2"]}
    assert get_json(lookupd, "/lookup?topic=t2") == {"channels": ["c1", "c2"], "producers": []}
    assert get_json(lookupd, "/lookup?topic=t1") == {"channels": [], "producers": []}
    post("/channel/delete?topic=t2&channel=c1")
    assert get_json(lookupd, "/channels?topic=t2") == {"channels": ["c2"]}
    post("/topic/delete?topic=t2")  # its channels go too
    post("/topic/delete?topic=never")  # absent: still 200
    assert get_json(lookupd, "/topics") == {"topics": ["t1"]}
    assert get_json(lookupd, "/channels?topic=t2") == {"channels": []}
    # nsqlookupd's "*" wildcard reaches the unvalidated parameters
    post("/channel/create?topic=t3&channel=c")
    assert get_json(lookupd, "/channels?topic=*") == {"channels": ["c"]}
    post("/topic/delete?topic=*")
    assert get_json(lookupd, "/topics") == {"topics": []}
    # query rules: first value wins, + and %XX decoded, a form body is ignored
    post("/topic/create?topic=a&topic=b")
    post("/topic/create?topic=x%2Ey")
    assert get_json(lookupd, "/topics") == {"topics": ["a", "x.y"]}
    status, _, body = request(lookupd, "POST", "/topic/create", body=b"topic=z",
                              headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert (status, body) == (400, b'{"message":"MISSING_ARG_TOPIC"}')


def test_keep_alive_with_bodies(lookupd):
    conn = http.client.HTTPConnection(*lookupd.http_address, timeout=10)
    try:
        for i in range(3):
            conn.request("POST", "/topic/create?topic=t%d" % i, body=b"ignored" * i)
            resp = conn.getresponse()
            assert (resp.status, resp.read()) == (200, b"")
        conn.request("GET", "/topics")
        assert json.loads(conn.getresponse().read()) == {"topics": ["t0", "t1", "t2"]}
    finally:
        conn.close()


def test_nodes(lookupd):
    a, b = Peer(lookupd), Peer(lookupd)
    a.identify(http_port=1, hostname="a<&>")
    b.identify(http_port=2)
    a.command(b"REGISTER t1 c")
    a.command(b"REGISTER t2")
    status, _, body = request(lookupd, "GET", "/nodes")
    assert b'"hostname":"a\\u003c\\u0026\\u003e"' in body
    nodes = json.loads(body)["producers"]
    assert [list(n) for n in nodes][0] == [
        "remote_address", "hostname", "broadcast_address", "tcp_port", "http_port", "version", "topology_zone",
        "topology_region", "tombstones", "topics"]
    assert [(n["http_port"], n["topics"], n["tombstones"]) for n in nodes] == [
        (1, ["t1", "t2"], [False, False]), (2, [], [])]
    a.close()
    b.close()


# -- inactivity and tombstones ----------------------------------------------------------------


def test_inactive_producers_are_filtered(make_lookupd):
    lookupd = make_lookupd(inactive_producer_timeout=0.2)
    peer = Peer(lookupd)
    peer.identify()
    peer.command(b"REGISTER t")
    wait_for(lambda: get_json(lookupd, "/lookup?topic=t")["producers"] == [], what="the producer to go inactive")
    assert get_json(lookupd, "/nodes") == {"producers": []}
    assert len(get_json(lookupd, "/debug")["topic:t:"]) == 1  # still registered
    # a PING makes it active again (retried: on a slow machine it may lapse again before the GET)
    wait_for(lambda: peer.command(b"PING") == b"OK" and get_json(lookupd, "/lookup?topic=t")["producers"],
             what="the pinged producer to be listed")
    peer.close()


def test_active_producers_are_listed(make_lookupd):
    lookupd = make_lookupd(inactive_producer_timeout=300)
    peer = Peer(lookupd)
    peer.identify()
    peer.command(b"REGISTER t")
    assert len(get_json(lookupd, "/lookup?topic=t")["producers"]) == 1
    assert len(get_json(lookupd, "/nodes")["producers"]) == 1
    peer.close()


def tombstone_setup(lookupd):
    a, b = Peer(lookupd), Peer(lookupd)
    a.identify(broadcast_address="10.0.0.1", http_port=4151)
    b.identify(broadcast_address="10.0.0.2", http_port=4151)
    for peer in (a, b):
        peer.command(b"REGISTER t1")
        peer.command(b"REGISTER t2")
    status, _, body = request(lookupd, "POST", "/topic/tombstone?topic=t1&node=10.0.0.1:4151")
    assert (status, body) == (200, b"")
    assert request(lookupd, "POST", "/topic/tombstone?topic=t1&node=nobody:1")[::2] == (200, b"")
    return a, b


def test_tombstone_hides_a_producer_of_one_topic(make_lookupd):
    lookupd = make_lookupd(tombstone_lifetime=300)
    a, b = tombstone_setup(lookupd)
    assert [p["broadcast_address"] for p in get_json(lookupd, "/lookup?topic=t1")["producers"]] == ["10.0.0.2"]
    assert len(get_json(lookupd, "/lookup?topic=t2")["producers"]) == 2  # only that topic
    assert a.command(b"REGISTER t1") == b"OK"  # re-registering does not clear it
    assert [p["broadcast_address"] for p in get_json(lookupd, "/lookup?topic=t1")["producers"]] == ["10.0.0.2"]
    nodes = {n["broadcast_address"]: n["tombstones"] for n in get_json(lookupd, "/nodes")["producers"]}
    assert nodes == {"10.0.0.1": [True, False], "10.0.0.2": [False, False]}  # /nodes lists it, marked
    a.close()
    b.close()


def test_tombstone_ends_with_its_lifetime(make_lookupd):
    lookupd = make_lookupd(tombstone_lifetime=0.2)
    a, b = tombstone_setup(lookupd)
    wait_for(lambda: len(get_json(lookupd, "/lookup?topic=t1")["producers"]) == 2, what="the tombstone to expire")
    nodes = {n["broadcast_address"]: n["tombstones"] for n in get_json(lookupd, "/nodes")["producers"]}
    assert nodes == {"10.0.0.1": [False, False], "10.0.0.2": [False, False]}
    entry = [p for p in get_json(lookupd, "/debug")["topic:t1:"] if p["broadcast_address"] == "10.0.0.1"][0]
    assert entry["tombstoned"] is True and entry["tombstoned_at"] > 0  # the flag itself stays
    a.close()
    b.close()


# -- lifecycle ----------------------------------------------------------------------------


def test_many_instances_and_a_prompt_stop():
    lookupds = [NSQLookupd.local(logger=Logger(stream=LogCapture())).start() for _ in range(3)]
    assert len({lk.tcp_address for lk in lookupds}) == 3
    peers = []
    for lk in lookupds:
        peer = Peer(lk)
        peer.identify()
        peers.append(peer)
        conn = http.client.HTTPConnection(*lk.http_address, timeout=10)  # an idle keep-alive connection
        conn.request("GET", "/ping")
        assert conn.getresponse().read() == b"OK"
        peers.append(conn)
    names = {t.name for t in threading.enumerate()}
    assert {"nsqlookupd-tcp", "nsqlookupd-http"} <= names
    assert any(n.startswith("nsqlookupd-peer[") for n in names)
    assert any(n.startswith("nsqlookupd-http[") for n in names)
    for lk in lookupds:
        lk.stop()
        lk.stop()  # idempotent
    assert not [t.name for t in threading.enumerate() if t.name.startswith("nsqlookupd")]
    for peer in peers[::2]:
        peer.expect_closed()
    for item in peers:
        item.close()


def test_context_manager_and_options():
    opts = LookupdOptions(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0", broadcast_address="b.example")
    with NSQLookupd(opts, logger=Logger(stream=LogCapture())) as lookupd:
        assert lookupd.tcp_addr == "127.0.0.1:%d" % lookupd.tcp_address[1]
        assert lookupd.http_url == "http://127.0.0.1:%d" % lookupd.http_address[1]
        peer = Peer(lookupd)
        assert peer.identify()["broadcast_address"] == "b.example"
        peer.close()
        with pytest.raises(RuntimeError):
            lookupd.start()
    assert LookupdOptions().tcp_address == "0.0.0.0:4160" and LookupdOptions().http_address == "0.0.0.0:4161"
    assert LookupdOptions().broadcast_address == HOSTNAME
    assert (LookupdOptions().inactive_producer_timeout, LookupdOptions().tombstone_lifetime) == (300.0, 45.0)
    with pytest.raises(ValueError):
        NSQLookupd(log_level="loud")


def test_listen_failure_names_the_flag(lookupd):
    taken = "127.0.0.1:%d" % lookupd.http_address[1]
    other = NSQLookupd.local(logger=Logger(stream=LogCapture()), http_address=taken)
    with pytest.raises(OSError) as info:
        other.start()
    assert str(info.value).startswith("[Errno") and "--http-address: listen (%s) failed - " % taken in str(info.value)
    other.stop()
    bad = NSQLookupd.local(logger=Logger(stream=LogCapture()), tcp_address="nonsense")
    with pytest.raises(ValueError, match="--tcp-address"):
        bad.start()
    bad.stop()
