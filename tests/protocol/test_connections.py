"""Many connections: mass subscribe and close, idle parking, the receive buffer, the Client/Channel contract."""

import gc
import http.client
import json
import platform
import socket
import struct
import threading
import urllib.request
import weakref

import pytest

from nsqd_threaded.broker.delivery import Subscriber
from nsqd_threaded.broker.client import STATE_CLOSING, STATE_SUBSCRIBED
from nsqd_threaded.internal.process import FUTEX_HASH_SLOTS, widen_futex_hash
from nsqd_threaded.internal.dial import timeval
from nsqd_threaded.server.connection import ClientConnection
from nsqd_threaded.server import idle
from nsqd_threaded.server.idle import IDLE_AFTER, TIMED_OUT, WOKEN, WOKEN_UNCOUNTED, IdleWatcher
from nsqd_threaded.server.reader import MAX_CHUNK, MIN_CHUNK, ConnectionEnded, Reader
from nsqd_threaded.wire import protocol_v2

from support.wire import Conn, wait_for


def channel_of(nsqd, topic, channel):
    t = nsqd.get_existing_topic(topic)
    return t and t.get_existing_channel(channel)


def ping(nsqd):
    conn = http.client.HTTPConnection(*nsqd.http_address, timeout=30)
    try:
        conn.request("GET", "/ping")
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@pytest.mark.timeout(120)
def test_mass_close_of_subscribers_requeues_every_in_flight_message(nsqd):
    n = 300
    subs = [socket.create_connection(nsqd.tcp_address) for _ in range(n)]
    for s in subs:
        s.sendall(b"  V2SUB mass c\nRDY 1\n")
    wait_for(lambda: channel_of(nsqd, "mass", "c") is not None
             and len(channel_of(nsqd, "mass", "c").clients()) == n, what="all subscribed")
    channel = channel_of(nsqd, "mass", "c")
    with Conn(nsqd.tcp_address) as pub:
        pub.mpub("mass", [b"%d" % i for i in range(n)])
    # Every subscriber has its one message in flight (RDY 1): none is read.
    wait_for(lambda: channel.in_flight_count() == n, what="all in flight")

    barrier = threading.Barrier(4)

    def close_all(part):
        barrier.wait()
        for s in part:
            s.close()

    closers = [threading.Thread(target=close_all, args=(subs[i::4],), name="test-closer-%d" % i, daemon=True)
               for i in range(4)]
    for t in closers:
        t.start()
    for t in closers:
        t.join(30)
    assert ping(nsqd) == (200, b"OK")
    wait_for(lambda: not channel.clients(), what="all clients removed")
    assert ping(nsqd) == (200, b"OK")
    wait_for(lambda: channel.in_flight_count() == 0, what="in-flight messages requeued")

    # Nothing was lost: a new consumer gets all of them.
    with Conn(nsqd.tcp_address) as sub:
        sub.sub("mass", "c", rdy=n)
        got = set()
        for _ in range(n):
            _, attempts, mid, body = sub.read_message()
            assert attempts == 2
            got.add(body)
            sub.send(b"FIN " + mid + b"\n")
        assert got == {b"%d" % i for i in range(n)}
    assert ping(nsqd) == (200, b"OK")


@pytest.mark.timeout(60)
def test_idle_connection_is_parked_and_still_served(make_nsqd):
    nsqd = make_nsqd(connection_threads=True)  # (the poller has no connection threads to park)
    watcher = nsqd.idle_watcher
    if watcher is None:
        pytest.skip("no epoll here: connections are not parked")
    with Conn(nsqd.tcp_address) as sub, Conn(nsqd.tcp_address) as pub:
        sub.sub("park", "c", rdy=1)
        wait_for(lambda: len(watcher._parked) >= 2, timeout=IDLE_AFTER * 20, what="parked")
        pub.pub("park", b"after idling")  # the publisher was parked too
        _, _, mid, body = sub.read_message()
        assert body == b"after idling"
        sub.send(b"FIN " + mid + b"\n")
        wait_for(lambda: channel_of(nsqd, "park", "c").in_flight_count() == 0, what="FIN from a parked connection")


@pytest.mark.timeout(60)
def test_parked_connection_still_times_out(make_nsqd):
    nsqd = make_nsqd(client_timeout=2.0)  # heartbeats every 1 s, read deadline 2 s
    with Conn(nsqd.tcp_address) as conn:
        conn.sub("deadline", "c")
        # Heartbeats come and are never answered: past its read deadline
        # (parked since IDLE_AFTER), the broker closes the connection.
        conn.assert_closed(timeout=15)


def test_idle_watcher_park_times_out_and_wakes():
    watcher = IdleWatcher()
    watcher.start()
    a, b = socket.socketpair()
    try:
        assert watcher.park(a.fileno(), 0.05) == TIMED_OUT
        threading.Timer(0.05, b.sendall, args=(b"x",)).start()
        assert watcher.park(a.fileno(), 30) == WOKEN
        assert a.recv(1) == b"x"
        watcher.resumed()
    finally:
        watcher.stop()
        a.close()
        b.close()


# -- the receive buffer -------------------------------------------------------


class _Feeder:
    """The far end of a socket pair, writing from its own thread."""

    def __init__(self):
        self.ours, self.theirs = socket.socketpair()

    def send(self, data):
        t = threading.Thread(target=self.theirs.sendall, args=(data,), name="test-feeder", daemon=True)
        t.start()
        return t

    def close(self):
        self.ours.close()
        self.theirs.close()


def test_reader_grows_for_a_large_body_and_shrinks_back():
    feeder = _Feeder()
    try:
        reader = Reader(feeder.ours)
        idle_memory = reader.memory()
        assert idle_memory < 2 * MIN_CHUNK
        body = bytes(range(256)) * 8192  # 2 MiB
        t = feeder.send(b"PUB t\n" + struct.pack(">i", len(body)) + body)
        assert reader.readline() == b"PUB t"
        size = protocol_v2.decode_size(reader.read(4))
        assert reader.read(size) == body
        t.join()
        assert reader.memory() > MAX_CHUNK // 2  # it grew for the body
        feeder.send(b"NOP\n").join()
        assert reader.readline() == b"NOP"
        feeder.send(b"NOP\n").join()
        assert reader.readline() == b"NOP"
        assert reader.memory() < 2 * MIN_CHUNK + 1024  # and gave it back
    finally:
        feeder.close()


def test_wait_for_command_reads_what_comes_in_time_and_leaves_no_short_timeout_behind():
    """The polled model's wait for a connection's next command (a worker, between a client's round
    trips) is one recv bounded by SO_RCVTIMEO: False when nothing comes, True and the bytes read when
    they do.  Its short timeout is not left for a body read that may wait: with no command deadline
    (heartbeats off) the waiting recv has no limit again."""
    feeder = _Feeder()
    try:
        reader = Reader(feeder.ours)
        reader.set_command_timeout(None)
        assert reader.wait_for_command(0.01) is False
        feeder.send(b"PUB t\n").join()
        assert reader.wait_for_command(5) is True
        assert reader.poll_command() == [b"PUB", b"t"]
        short = feeder.ours.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16)
        assert short != bytes(16)  # (the wait's bound is on the socket now)
        body = b"late body"
        t = threading.Timer(0.05, feeder.theirs.sendall, args=(struct.pack(">i", len(body)) + body,))
        t.start()
        assert protocol_v2.decode_size(reader.read(4)) == len(body)  # waits past the wait's 10 ms
        assert reader.read(len(body)) == body
        t.join()
        assert feeder.ours.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16) == bytes(16)  # no limit
        feeder.theirs.shutdown(socket.SHUT_WR)
        assert reader.wait_for_command(5) is True  # (the end: the serve that follows finds it)
    finally:
        feeder.close()


def test_recv_fin_nowait_takes_a_lone_fin_in_place_and_leaves_anything_else_buffered():
    """A consumer at RDY 1 sends one FIN per message: the poller's read of it answers the ID and
    consumes it; whatever else arrives stays buffered for the command loop, as it came."""
    feeder = _Feeder()
    try:
        reader = Reader(feeder.ours)
        assert reader.recv_fin_nowait() is False  # (nothing there)
        assert reader.drained
        msg_id = b"0123456789abcdef"
        feeder.send(b"FIN " + msg_id + b"\n").join()
        assert reader.recv_fin_nowait() == msg_id
        assert reader.drained and not reader.has_partial()
        # A FIN and the start of the next line; a 21-byte line that is not a plain FIN (its ID
        # ends in a CR, which parse_line drops); a FIN and another command: all left as they came.
        for data in (b"FIN " + msg_id + b"\nFI", b"FIN 0123456789abcde\r\n", b"FIN " + msg_id + b"\nNOP\n"):
            feeder.send(data).join()
            assert reader.recv_fin_nowait() is True
            buf, pos, end = reader.buffered()
            assert bytes(buf[pos:end]) == data
            reader.advance(end)
        feeder.theirs.shutdown(socket.SHUT_WR)
        with pytest.raises(ConnectionEnded):
            reader.recv_fin_nowait()
    finally:
        feeder.close()


def test_reader_reports_eof():
    feeder = _Feeder()
    try:
        reader = Reader(feeder.ours)
        feeder.send(b"NO").join()
        feeder.theirs.shutdown(socket.SHUT_WR)
        with pytest.raises(ConnectionEnded):
            reader.readline()
    finally:
        feeder.close()


@pytest.mark.timeout(60)
def test_a_long_parked_reader_woken_by_a_nop_parks_again_without_waiting(monkeypatch):
    """After a park of REPARK_AFTER seconds or more, what woke the connection (a heartbeat's NOP)
    does not keep its thread blocked in recv for IDLE_AFTER: the next recv parks at once."""
    if not hasattr(socket, "MSG_DONTWAIT") or not hasattr(idle.select, "epoll"):
        pytest.skip("no epoll or MSG_DONTWAIT here: connections are not parked")
    from nsqd_threaded.server import reader as reader_module
    monkeypatch.setattr(reader_module, "REPARK_AFTER", 0.0)
    watcher = IdleWatcher()
    watcher.start()
    ours, theirs = socket.socketpair()
    lines = []
    try:
        reader = Reader(ours, idle_watcher=watcher)

        def read():
            try:
                while True:
                    lines.append(reader.readline())
            except ConnectionEnded:
                pass

        thread = threading.Thread(target=read, name="test-reader", daemon=True)
        thread.start()
        wait_for(lambda: ours.fileno() in watcher._parked, timeout=IDLE_AFTER * 20, what="parked")
        first = watcher._parked[ours.fileno()]
        # From now on a recv that waits waits a minute: only a recv that does not wait parks again.
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval(60))
        theirs.sendall(b"NOP\n")
        wait_for(lambda: lines == [b"NOP"], what="the NOP read")
        wait_for(lambda: watcher._parked.get(ours.fileno()) not in (None, first), what="parked again")
        theirs.close()
        thread.join(10)
        assert not thread.is_alive()
    finally:
        ours.close()
        theirs.close()
        watcher.stop()


@pytest.mark.timeout(60)
def test_large_pub_and_mpub_bodies(make_nsqd):
    nsqd = make_nsqd(max_msg_size=4 * 1024 * 1024, max_body_size=8 * 1024 * 1024)
    big = b"b" * (3 * 1024 * 1024)
    with Conn(nsqd.tcp_address) as sub, Conn(nsqd.tcp_address) as pub:
        sub.sub("big", "c", rdy=10)
        pub.pub("big", big)
        pub.mpub("big", [big[: 2 * 1024 * 1024], b"small", big[:1000000]])
        pub.pub("big", b"after")
        bodies = []
        for _ in range(5):
            _, _, mid, body = sub.read_message()
            bodies.append(body)
            sub.send(b"FIN " + mid + b"\n")
        assert [len(b) for b in bodies] == [len(big), 2 * 1024 * 1024, 5, 1000000, 5]
        assert bodies[0] == big and bodies[-1] == b"after"


# -- the Client/Channel contract ----------------------------------------------


def test_client_provides_what_a_channel_needs(nsqd):
    a, b = socket.socketpair()
    try:
        client = ClientConnection(1, a, ("127.0.0.1", 4150), nsqd)
        for name in Subscriber.__annotations__:
            assert hasattr(client, name), name
        assert callable(client.wake) and callable(client.close_connection)
        topic = nsqd.get_topic("t")
        channel = topic.get_channel("c")
        channel.add_client(client)
        client.subscribe("t", channel)
        assert client.state == STATE_SUBSCRIBED and client.topic_name == "t"
        assert not [t for t in threading.enumerate() if t.name.startswith("nsqd-client-pump[1 ")]
        client.set_ready(8)  # ready on an empty channel: a waiting consumer, no pump yet
        assert client.ready_count == 8
        assert not [t for t in threading.enumerate() if t.name.startswith("nsqd-client-pump[1 ")]
        # Published from the connection's own thread (no direct delivery from there): the wake-up
        # marks the pump as due, and the connection thread starts it between two commands.
        topic.publish([b"x"])
        assert client.pump_deferred
        assert not [t for t in threading.enumerate() if t.name.startswith("nsqd-client-pump[1 ")]
        client.start_deferred_pump()
        assert not client.pump_deferred
        assert [t for t in threading.enumerate() if t.name == "nsqd-client-pump[1 127.0.0.1:4150]"]
        b.settimeout(10)
        header = b""
        while len(header) < 8:
            chunk = b.recv(8 - len(header))
            assert chunk, "closed after %r" % header
            header += chunk
        assert struct.unpack(">ii", header)[1] == 2  # a MESSAGE frame, written by the pump
        client.start_close()
        assert client.state == STATE_CLOSING and client.ready_count == 0
        client.count_published("t", 3)
        client.count_published("t", 2)
        assert client.pub_counts == {"t": 5}
    finally:
        client.stop_pump()
        client.join_pump()
        a.close()
        b.close()


def test_idle_watcher_releases_without_a_permit_rather_than_never():
    watcher = IdleWatcher(max_running=1)
    watcher.start()
    pairs = [socket.socketpair() for _ in range(2)]
    try:
        pairs[0][1].sendall(b"x")
        assert watcher.park(pairs[0][0].fileno(), 30) == WOKEN  # and never returns its permit
        pairs[1][1].sendall(b"y")
        assert watcher.park(pairs[1][0].fileno(), 30) == WOKEN_UNCOUNTED
    finally:
        watcher.stop()
        for a, b in pairs:
            a.close()
            b.close()


def test_idle_watcher_runs_hangup_before_releasing_the_thread():
    # The peer closed and nothing is left to read: the watcher itself calls the hangup,
    # before the parked thread is released (so a mass close updates the broker's state
    # in one pass of the watcher, not as each thread gets its turn).
    watcher = IdleWatcher()
    watcher.start()
    a, b = socket.socketpair()
    returned = threading.Event()
    calls = []

    def hangup():
        calls.append((threading.current_thread().name, returned.is_set()))

    try:
        threading.Timer(0.05, b.close).start()
        woken = watcher.park(a.fileno(), 30, hangup)
        returned.set()
        assert woken == WOKEN
        assert calls == [("nsqd-idle-watch", False)]
        assert a.recv(1) == b""
        watcher.resumed()
    finally:
        watcher.stop()
        a.close()
        b.close()


def test_idle_watcher_leaves_a_close_with_unread_bytes_to_its_thread():
    # A FIN sent just before the close must be read and processed by the thread first.
    watcher = IdleWatcher()
    watcher.start()
    a, b = socket.socketpair()
    calls = []
    try:
        def fin_and_close():
            b.sendall(b"FIN 0123456789abcdef\n")
            b.close()

        threading.Timer(0.05, fin_and_close).start()
        assert watcher.park(a.fileno(), 30, lambda: calls.append(1)) == WOKEN
        assert calls == []
        assert a.recv(64) == b"FIN 0123456789abcdef\n"
        watcher.resumed()
    finally:
        watcher.stop()
        a.close()
        b.close()


@pytest.mark.timeout(60)
def test_idle_watcher_runs_a_hangup_and_its_teardown_while_chosen_threads_wait_for_a_permit(monkeypatch):
    # A mass close: the threads woken first take every permit, and the hang-ups that arrive
    # after them must not wait behind their releases (/stats would show those clients for as
    # long). The only permit is held; a thread chosen meanwhile waits in the watcher's queue;
    # a hang-up arriving next runs at once, and its thread (only a teardown left) is released
    # with a teardown permit of its own. The permit returned then releases the queued thread,
    # counted (PERMIT_WAIT made long: not a release for want of a permit).
    monkeypatch.setattr(idle, "PERMIT_WAIT", 600.0)
    watcher = IdleWatcher(max_running=1, max_teardowns=1)
    watcher.start()
    pairs = [socket.socketpair() for _ in range(3)]
    results = {}
    queued_released = threading.Event()
    hangups = []

    def park_queued():
        results["queued"] = watcher.park(pairs[1][0].fileno(), 30)
        queued_released.set()

    def park_hung_up():
        results["hung up"] = watcher.park(pairs[2][0].fileno(), 30,
                                          lambda: hangups.append(queued_released.is_set()))
        results["hung up read"] = pairs[2][0].recv(1)
        results["queued then"] = queued_released.is_set()
        watcher.resumed()  # (its teardown done)

    threads = [threading.Thread(target=park_queued, name="test-park-queued", daemon=True),
               threading.Thread(target=park_hung_up, name="test-park-hung-up", daemon=True)]
    try:
        pairs[0][1].sendall(b"x")
        assert watcher.park(pairs[0][0].fileno(), 30) == WOKEN  # holds the only permit
        for t in threads:
            t.start()
        wait_for(lambda: len(watcher._parked) == 2, what="two threads parked")
        pairs[1][1].sendall(b"x")  # chosen: waits for the permit
        wait_for(lambda: len(watcher._parked) == 1, what="the first chosen")
        pairs[2][1].close()
        threads[1].join(30)
        assert hangups == [False]  # run while the chosen thread still waited for its permit
        assert results == {"hung up": WOKEN, "hung up read": b"", "queued then": False}
        assert not queued_released.is_set()
        watcher.resumed()  # the permit comes back: the queued thread goes
        threads[0].join(30)
        assert results["queued"] == WOKEN
        assert pairs[1][0].recv(1) == b"x"
        watcher.resumed()
    finally:
        watcher.stop()
        for a, b in pairs:
            a.close()
            b.close()


@pytest.mark.timeout(60)
def test_idle_watcher_stop_still_releases_a_thread_chosen_in_the_same_batch():
    # One permit, held: the watcher spends PERMIT_WAIT on the next wake-up, meanwhile a second
    # socket becomes readable and stop() is called, so one epoll batch holds both. The parked
    # thread chosen from it must still be released (it waits on its gate with no timeout).
    watcher = IdleWatcher(max_running=1)
    watcher.start()
    pairs = [socket.socketpair() for _ in range(3)]
    results = {}

    def park(i):
        results[i] = watcher.park(pairs[i][0].fileno(), 30)

    threads = [threading.Thread(target=park, args=(i,), name="test-park-%d" % i, daemon=True) for i in (1, 2)]
    stopper = threading.Thread(target=watcher.stop, name="test-stopper", daemon=True)
    try:
        pairs[0][1].sendall(b"x")
        assert watcher.park(pairs[0][0].fileno(), 30) == WOKEN  # the only permit, never returned
        for t in threads:
            t.start()
        wait_for(lambda: len(watcher._parked) == 2, what="two threads parked")
        pairs[1][1].sendall(b"x")  # the watcher waits for a permit for this one...
        wait_for(lambda: len(watcher._parked) == 1, what="the first chosen")
        pairs[2][1].sendall(b"x")  # ...while this one and the stop arrive
        stopper.start()
        for t in threads:
            t.join(20)
        assert not any(t.is_alive() for t in threads), results
        assert results == {1: WOKEN_UNCOUNTED, 2: WOKEN_UNCOUNTED}
    finally:
        stopper.join(20)
        for a, b in pairs:
            a.close()
            b.close()


@pytest.mark.timeout(60)
def test_fin_then_close_from_a_parked_consumer_is_processed(make_nsqd):
    nsqd = make_nsqd(connection_threads=True)  # (the poller has no connection threads to park)
    watcher = nsqd.idle_watcher
    if watcher is None:
        pytest.skip("no epoll here: connections are not parked")
    sub = Conn(nsqd.tcp_address)
    try:
        sub.sub("finclose", "c", rdy=1)
        channel = channel_of(nsqd, "finclose", "c")
        wait_for(lambda: len(watcher._parked) >= 1, timeout=IDLE_AFTER * 20, what="parked")
        with Conn(nsqd.tcp_address) as pub:
            pub.pub("finclose", b"m")  # delivered by the pump while the connection thread stays parked
        _, _, mid, _ = sub.read_message()
        sub.send(b"FIN " + mid + b"\n")
        sub.sock.shutdown(socket.SHUT_WR)
    finally:
        sub.close()
    wait_for(lambda: not channel.clients(), what="the consumer gone")
    wait_for(lambda: channel.in_flight_count() == 0 and channel.depth() == 0, what="nothing in flight")
    assert channel.requeue_count == 0  # its FIN was processed, not its message requeued


@pytest.mark.timeout(120)
def test_mass_close_of_parked_subscribers_empties_stats_and_ends_their_threads(nsqd):
    # At a small scale, the row of scripts/reliability.py (sub_new_channels): subscribers to
    # their own channels (ephemeral here, so leaving deletes them), idle long enough to park,
    # all close at once. They leave /stats, their channels go, and every thread ends.
    watcher = nsqd.idle_watcher
    n = 200

    def connection_threads():
        return [t for t in threading.enumerate() if t.name.startswith("nsqd-conn[")]

    subs = [socket.create_connection(nsqd.tcp_address) for _ in range(n)]
    for i, s in enumerate(subs):
        s.sendall(b"  V2SUB massidle c%d#ephemeral\n" % i)
    topic = None

    def subscribed():
        t = nsqd.get_existing_topic("massidle")
        return t is not None and sum(len(c.clients()) for c in t.channels()) == n

    wait_for(subscribed, timeout=60, what="all subscribed")
    topic = nsqd.get_existing_topic("massidle")
    if watcher is not None:
        wait_for(lambda: len(watcher._parked) >= n, timeout=60, what="all parked")
    for s in subs:
        s.close()

    def stats_clients():
        doc = json.loads(urllib.request.urlopen("http://%s:%d/stats?format=json" % nsqd.http_address,
                                                timeout=30).read())
        return sum(len(c["clients"]) for t in doc["topics"] for c in t["channels"])

    wait_for(lambda: stats_clients() == 0, timeout=60, what="/stats without clients")
    wait_for(lambda: not topic.channels(), timeout=60, what="the ephemeral channels deleted")
    wait_for(lambda: not connection_threads(), timeout=60, what="every connection thread ended")
    assert ping(nsqd) == (200, b"OK")


# -- after a mass close ---------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.skipif(
    platform.python_implementation() != "CPython", reason="only CPython frees by reference counting"
)
def test_closed_connection_is_freed_without_a_garbage_collection(nsqd):
    """No reference cycle keeps an ended connection (client, buffers, pump) for a full GC."""
    gc.disable()
    try:
        with Conn(nsqd.tcp_address) as sub:
            sub.identify(heartbeat_interval=1000)
            sub.sub("freed", "c", rdy=1)
            with Conn(nsqd.tcp_address) as pub:
                pub.pub("freed", b"m")
            sub.read_message()  # left in flight
            (client,) = [c for c in nsqd.clients() if c.channel is not None]
            ref = weakref.ref(client)
            del client
        wait_for(lambda: ref() is None, what="the client freed by reference counting alone")
    finally:
        gc.enable()


def test_idle_watcher_trims_memory_once_many_connections_have_closed():
    trims = []
    trimmed = threading.Event()

    def trim(pad):
        trims.append(pad)
        trimmed.set()

    watcher = IdleWatcher(trim=trim, trim_after_closed=3, trim_quiet=0.05)
    watcher.start()
    try:
        for _ in range(2):
            for _ in range(3):
                watcher.connection_closed()
            assert trimmed.wait(30)
            trimmed.clear()
        assert trims == [0, 0]
    finally:
        watcher.stop()


def test_futex_hash_is_widened_and_never_narrowed(nsqd):
    slots = widen_futex_hash(16)  # the broker already asked for more
    if slots is None:
        pytest.skip("no per-process futex hash (Linux before 6.16, or not Linux)")
    assert slots >= FUTEX_HASH_SLOTS
    assert widen_futex_hash() >= FUTEX_HASH_SLOTS
