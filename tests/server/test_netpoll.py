"""The poller model (server/netpoll.py): a connection holds a thread only while it has work.

Real brokers, real sockets.  What a thread per connection gave for free must still hold: a slow
client never holds up the others, a stalled consumer holds no thread, and a broker with many
connections runs a few threads.
"""

import json
import socket
import struct
import threading
import time
import urllib.request

import pytest

from nsqd_threaded.wire import protocol_v2
from support.wire import Conn, wait_for


def http_get(nsqd, path):
    with urllib.request.urlopen("http://%s:%d%s" % (nsqd.http_address + (path,)), timeout=10) as resp:
        return resp.status, resp.headers, resp.read()

pytestmark = pytest.mark.timeout(120)


def broker_threads():
    return [t for t in threading.enumerate() if t.name.startswith(("nsqd-netpoll", "nsqd-worker", "nsqd-conn",
                                                                    "nsqd-client-pump"))]


@pytest.fixture
def polled(make_nsqd):
    nsqd = make_nsqd(connection_threads=False)
    if nsqd._tcp_server.poller is None:
        pytest.skip("no epoll here: a thread per connection")
    return nsqd


def channel_of(nsqd, topic, channel):
    return nsqd.get_topic(topic).get_channel(channel)


def test_many_consumers_at_rdy_1_are_served_by_a_few_threads(polled):
    n = 300
    consumers = [Conn(polled.tcp_address) for _ in range(n)]
    try:
        for c in consumers:
            c.sub("many", "c", rdy=1)
        channel = channel_of(polled, "many", "c")
        wait_for(lambda: len(channel.clients()) == n, what="every consumer subscribed")
        assert len(broker_threads()) <= 1 + 8  # the poller and its workers, not a thread per connection
        with Conn(polled.tcp_address) as pub:
            pub.mpub("many", [b"%d" % i for i in range(2 * n)])
        got = []
        for c in consumers:  # each has one in flight (RDY 1): FIN it, the next comes
            _, _, mid, body = c.read_message()
            got.append(body)
            c.send(b"FIN " + mid + b"\n")
        second = []
        for c in consumers:  # (not FINed before every consumer has its second: a FIN would take a third)
            _, _, mid, body = c.read_message()
            got.append(body)
            second.append(mid)
        for c, mid in zip(consumers, second):
            c.send(b"FIN " + mid + b"\n")
        assert sorted(got) == sorted(b"%d" % i for i in range(2 * n))
        wait_for(lambda: channel.in_flight_count() == 0, what="every FIN processed")
    finally:
        for c in consumers:
            c.close()
    wait_for(lambda: not channel.clients(), what="every consumer gone")


def test_a_body_that_arrives_late_keeps_no_one_waiting(polled):
    """A PUB whose body trickles in is given back whole to a worker; other clients are served meanwhile."""
    with Conn(polled.tcp_address) as slow, Conn(polled.tcp_address) as quick:
        body = b"x" * 1000
        slow.send(b"PUB late\n" + struct.pack(">i", len(body)) + body[:10])
        for i in range(20):  # round trips while the slow body is incomplete
            assert quick.pub("quick", b"%d" % i) == b"OK"
        slow.send(body[10:])
        assert slow.read_response() == b"OK"
    assert message_count(polled, "late") == 1


def test_a_stalled_consumer_holds_no_thread(polled):
    """A consumer that never reads: its deliveries wait in its output backlog, not in a blocked thread;
    publishers, other consumers and /ping go on."""
    stalled = socket.create_connection(polled.tcp_address)
    try:
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.sendall(b"  V2SUB stall c\nRDY 2500\n")
        channel = channel_of(polled, "stall", "c")
        wait_for(lambda: len(channel.clients()) == 1, what="subscribed")
        body = b"y" * 60000
        with Conn(polled.tcp_address) as pub:
            for _ in range(40):  # 2.4 MB: far more than the socket buffers hold
                assert pub.pub("stall", body) == b"OK"
            wait_for(lambda: channel.in_flight_count() >= 40, what="every message in flight to the stalled one")
            before = len(broker_threads())
            for i in range(20):
                assert pub.pub("other", b"%d" % i) == b"OK"
            with Conn(polled.tcp_address) as sub:
                sub.sub("other", "c", rdy=100)
                assert sub.read_message()[3] == b"0"
            assert http_get(polled, "/ping")[0] == 200
            assert len(broker_threads()) <= max(before, 1 + 8)
    finally:
        stalled.close()
    wait_for(lambda: not channel.clients(), what="the stalled consumer gone")
    wait_for(lambda: channel.in_flight_count() == 0 and channel.depth() == 40,
             what="its messages back in the queue (the next scan requeues a departed client's)")


def test_a_mass_close_leaves_the_channel_at_once(polled):
    n = 300
    consumers = [Conn(polled.tcp_address) for _ in range(n)]
    for c in consumers:
        c.sub("mass", "c", rdy=1)
    channel = channel_of(polled, "mass", "c")
    wait_for(lambda: len(channel.clients()) == n, what="every consumer subscribed")
    started = time.monotonic()
    for c in consumers:
        c.close()
    wait_for(lambda: not channel.clients(), what="every consumer gone")
    assert time.monotonic() - started < 30  # (a bound that fails only a broken teardown)
    assert http_get(polled, "/ping")[0] == 200


def test_the_poller_says_when_it_serves_for_the_walks_that_yield_to_it(polled):
    # /stats's walk waits at each hand-off while NetPoller.serving() is true: a resting poller must
    # say false, or every long /stats would wait YIELD_LIMIT at each hand-off for nothing.
    poller = polled._tcp_server.poller
    with Conn(polled.tcp_address) as consumer:
        consumer.sub("walk", "c", rdy=1)
        consumer.send(b"NOP\n")
        wait_for(lambda: not poller.serving(), what="the poller resting after the NOP")
        polled.get_topic("walk").get_channel("a")
        status, _, body = http_get(polled, "/stats?format=json")
        counts = {c["channel_name"]: c["client_count"] for c in json.loads(body)["topics"][0]["channels"]}
        assert status == 200 and counts == {"a": 0, "c": 1}


def test_commands_split_anywhere_are_served_whole(polled):
    """Every command of a stream cut at each byte boundary in turn: the poller never runs half a command."""
    identify = b'{"heartbeat_interval": 5000}'
    stream = (b"IDENTIFY\n" + struct.pack(">i", len(identify)) + identify
              + b"PUB split\n" + struct.pack(">i", 3) + b"abc"
              + b"MPUB split\n" + struct.pack(">i", 4 + 2 * 5) + struct.pack(">i", 2)
              + struct.pack(">i", 1) + b"d" + struct.pack(">i", 1) + b"e"
              + b"DPUB split 0\n" + struct.pack(">i", 1) + b"f"
              + b"NOP\n")
    for cut in range(1, len(stream), 7):
        with Conn(polled.tcp_address) as c:
            c.sock.sendall(stream[:cut])
            c.sock.sendall(stream[cut:])
            answers = [c.read_frame()[1] for _ in range(4)]
            assert answers[0].startswith(b"{") or answers[0] == b"OK"
            assert answers[1:] == [b"OK", b"OK", b"OK"]
    assert message_count(polled, "split") == 4 * len(range(1, len(stream), 7))


def _read_until_closed(sock):
    """Everything the broker writes until it closes the connection (bounded by the socket's timeout)."""
    data = b""
    while True:
        chunk = sock.recv(4096)
        if not chunk:
            return data
        data += chunk


def test_a_greeting_in_pieces_or_cut_short_by_the_peer_is_served_as_it_came(polled):
    """The first recv takes the magic and what follows it; the edge-triggered registration never
    leaves a newcomer waiting for an edge that does not come."""
    poller = polled._tcp_server.poller
    body = b"abc"
    pub = b"PUB greet\n" + struct.pack(">i", len(body)) + body
    # The magic in three pieces, the last glued to a PUB.
    with socket.create_connection(polled.tcp_address, timeout=10) as sock:
        for piece in (b" ", b" V", b"2" + pub):
            sock.sendall(piece)
            if piece != b"2" + pub:
                wait_for(lambda: poller.connection_count() == 1, what="the newcomer registered")
        assert sock.recv(10) == struct.pack(">ii", 6, protocol_v2.FRAME_TYPE_RESPONSE) + b"OK"
    # The magic, a PUB and the peer's end in one segment train: answered, then closed.
    with socket.create_connection(polled.tcp_address, timeout=10) as sock:
        sock.sendall(protocol_v2.MAGIC_V2 + pub)
        sock.shutdown(socket.SHUT_WR)
        assert _read_until_closed(sock) == struct.pack(">ii", 6, protocol_v2.FRAME_TYPE_RESPONSE) + b"OK"
    # Half a magic and the peer's end: closed at once, not left for an edge.
    with socket.create_connection(polled.tcp_address, timeout=10) as sock:
        sock.sendall(b"  ")
        sock.shutdown(socket.SHUT_WR)
        assert _read_until_closed(sock) == b""
    wait_for(lambda: poller.connection_count() == 0, what="every newcomer gone")
    assert message_count(polled, "greet") == 2


def message_count(nsqd, topic):
    _, _, doc = http_get(nsqd, "/stats?format=json&topic=" + topic)
    (t,) = json.loads(doc)["topics"]
    return t["message_count"]


def test_heartbeats_reach_a_parked_consumer_and_a_silent_one_is_closed(polled):
    with Conn(polled.tcp_address) as c:
        assert c.identify(heartbeat_interval=1000) == b"OK"
        c.sub("hb", "c", rdy=1)
        assert c.read_raw_frame() == protocol_v2.HEARTBEAT_FRAME  # from the poller's timer
        # No NOP: the read deadline (twice the interval) passes and the broker closes the connection.
        c.sock.settimeout(10)
        while True:
            data = c.sock.recv(4096)
            if not data:
                break
    wait_for(lambda: not channel_of(polled, "hb", "c").clients(), what="the silent consumer removed")


@pytest.mark.parametrize("connection_threads", [False, True])
def test_a_connection_keeps_its_state_in_slots(make_nsqd, connection_threads):
    """A connection's client, protocol and reader hold every attribute a consumer's and a
    publisher's life sets in slots (``Client.__slots__``): none spills into an instance dict,
    which with thousands of connections is memory and time on every command."""
    nsqd = make_nsqd(connection_threads=connection_threads)
    with Conn(nsqd.tcp_address) as sub, Conn(nsqd.tcp_address) as pub:
        sub.identify(feature_negotiation=True, heartbeat_interval=1000, msg_timeout=60000, sample_rate=0,
                     output_buffer_timeout=250, client_id="slots", hostname="slots", user_agent="t")
        sub.sub("slots", "c", rdy=2)
        pub.mpub("slots", [b"1", b"2", b"3"])
        _, _, first, _ = sub.read_message()
        _, _, second, _ = sub.read_message()
        sub.send(b"TOUCH " + second + b"\nREQ " + second + b" 0\nFIN " + first + b"\n")
        sub.read_message()
        sub.send(b"CLS\n")
        while sub.read_frame() != (protocol_v2.FRAME_TYPE_RESPONSE, b"CLOSE_WAIT"):
            pass  # (a message sent before the CLS)
        clients = nsqd.clients()
        assert len(clients) == 2
        for client in clients:
            assert client.__dict__ == {}, type(client).__name__
            proto = getattr(client, "proto", None)  # (the poller's connection keeps its protocol)
            if proto is not None:
                assert not hasattr(proto, "__dict__") and not hasattr(proto.reader, "__dict__")


def test_every_accepted_connection_has_nagle_off(polled):
    """The poller's connections get TCP_NODELAY from their listener (Linux copies it to each
    accepted socket), as the thread-per-connection model sets it on each: no answer waits for
    the client's delayed ACK."""
    conns = [Conn(polled.tcp_address) for _ in range(3)]
    try:
        for c in conns:
            c.sub("nodelay", "c")
        clients = wait_for(lambda: len(polled.clients()) == 3 and polled.clients(), what="three clients")
        for client in clients:
            assert client._sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        for c in conns:
            c.close()
