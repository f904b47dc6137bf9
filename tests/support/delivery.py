"""Delivery compared between brokers: the same client sessions, what each client observes.

A session is a list of steps (publish, FIN, REQ, TOUCH, RDY changes, a
consumer leaving, holding messages past their timeout) played by raw
consumers on one channel.  After each step the session waits a bounded
window and records an :class:`Observation`: whether every message that could
be delivered was (a consumer with a free RDY slot never waits while the
channel has a message for it), whether a consumer ever got a message beyond
its RDY, which errors came back, and whether held messages were redelivered
after their timeout.  Run against Go nsqd and ours, the two lists of
observations must be equal; against ours alone they must equal the ideal (a
broker that keeps nsqd's contract), which the runs against Go confirm.

The counts a consumer holds differ between two brokers (nsqd hands a
message to whichever ready client its select picks), so what is compared is
the contract at each step, not who got what: the shortfall (messages that
could be delivered but are not), over-RDY deliveries, error codes, and
redelivery after a timeout.
"""

import json
import os
import random
import socket
import struct
import subprocess
import tempfile
import threading
import time
import urllib.request

from nsqd_threaded.wire import protocol_v2

from support.wire import wait_for

GO_BIN = os.environ.get("NSQ_GO_BIN", os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared",
                                                    "reference", "go-nsq-1.3.0"))
GO_NSQD = os.path.join(GO_BIN, "nsqd")

MSG_TIMEOUT_MS = 1000  # the smallest IDENTIFY accepts: timeouts fit in a short session
WINDOW = 1.5  # seconds a step may take to settle (nsqd needs at most its 250 ms output buffer timeout)
QUIET = 0.15  # then this long with nothing more arriving (an over-RDY delivery would)
RDY_GRACE = 0.2  # messages already sent when a lower RDY arrives are not over RDY
# A held message's timeout starts when the broker sends it, this client's clock when its reader gets
# to it (later, on a loaded machine): in its last TIMEOUT_SLACK seconds here, it may be gone there.
TIMEOUT_SLACK = 0.3


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GoBroker:
    """Go nsqd 1.3 (the reference binary) on ephemeral 127.0.0.1 ports, in a temporary data dir."""

    name = "go"

    def __init__(self):
        self._dir = tempfile.TemporaryDirectory(prefix="delivery-go-")
        tcp, http = free_port(), free_port()
        self.tcp_address = ("127.0.0.1", tcp)
        self._http = "http://127.0.0.1:%d" % http
        self._started = time.monotonic()
        self._proc = subprocess.Popen(
            [GO_NSQD, "--tcp-address=127.0.0.1:%d" % tcp, "--http-address=127.0.0.1:%d" % http,
             "--data-path=" + self._dir.name],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        def listening():
            if self._proc.poll() is not None:
                raise RuntimeError("Go nsqd exited with %s" % self._proc.returncode)
            try:
                socket.create_connection(self.tcp_address, timeout=1).close()
                return True
            except OSError:
                return False

        try:
            wait_for(listening, timeout=20, interval=0.02, what="Go nsqd to listen")
        except BaseException:
            self.close()
            raise

    def prepare(self, topics, channel="c"):
        """Create the sessions' channels, then wait for the queue scanner's first refresh.

        Go nsqd's scanner learns of new channels only when it refreshes its
        list (every 5 s): until then a new channel's timeouts and deferred
        messages wait.  (This broker scans a channel at once: see
        docs/divergences.md.)  The sessions compare delivery, not that.
        """
        for topic in topics:
            for path in ("/topic/create?topic=%s" % topic, "/channel/create?topic=%s&channel=%s" % (topic, channel)):
                urllib.request.urlopen(urllib.request.Request(self._http + path, data=b""), timeout=10).read()
        refreshed = self._started + 5.5
        wait_for(lambda: time.monotonic() >= refreshed, 10, interval=0.1, what="Go nsqd's first scanner refresh")

    def close(self):
        self._proc.terminate()
        try:
            self._proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._dir.cleanup()


class OurBroker:
    """This package's broker, in process (``nsqd_threaded.testing.Broker``)."""

    name = "ours"

    def __init__(self):
        from nsqd_threaded.testing import Broker

        self._broker = Broker().start()
        self.tcp_address = self._broker.tcp_address

    def prepare(self, topics, channel="c"):
        """Nothing to wait for: a new channel is scanned at once."""

    def close(self):
        self._broker.stop()


class Consumer:
    """A raw V2 consumer: its reader thread records every frame; the session thread sends.

    ``_lock`` guards ``held``, ``rdy``, ``rdy_lowered_at`` and the counters,
    shared by the reader thread and the session thread.
    """

    def __init__(self, address, topic, channel, index):
        self.index = index
        self.sock = socket.create_connection(address, timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._send_lock = threading.Lock()  # guards sends: the reader answers heartbeats meanwhile
        self._lock = threading.Lock()
        self.held = {}  # message id -> [body, attempts, monotonic time received or last TOUCHed]
        self.rdy = 0
        self.rdy_lowered_at = 0.0
        self.received = 0
        self.redelivered = 0
        self.over_rdy = 0
        self.errors = []
        self.responses = 0
        self.last_frame_at = 0.0
        self.alive = True
        self.sock.sendall(protocol_v2.MAGIC_V2)
        fields = json.dumps({"msg_timeout": MSG_TIMEOUT_MS, "heartbeat_interval": 5000}).encode()
        self.sock.sendall(b"IDENTIFY\n" + struct.pack(">i", len(fields)) + fields)
        self.sock.sendall(b"SUB %s %s\n" % (topic.encode(), channel.encode()))
        self._buf = b""
        for _ in range(2):
            ft, data = self._read_frame()
            assert ft == protocol_v2.FRAME_TYPE_RESPONSE and data == b"OK", (ft, data)
        self.sock.settimeout(None)
        self._reader = threading.Thread(target=self._read_loop, name="delivery-consumer-%d" % index, daemon=True)
        self._reader.start()

    def _read_frame(self):
        while True:
            if len(self._buf) >= 4:
                size = struct.unpack(">i", self._buf[:4])[0]
                if len(self._buf) >= 4 + size:
                    frame, self._buf = self._buf[: 4 + size], self._buf[4 + size:]
                    return protocol_v2.decode_frame(frame)
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError
            self._buf += chunk

    def _read_loop(self):
        try:
            while True:
                ft, data = self._read_frame()
                now = time.monotonic()
                if ft == protocol_v2.FRAME_TYPE_RESPONSE:
                    if data == b"_heartbeat_":
                        self.send(b"NOP\n")
                    continue
                with self._lock:
                    self.last_frame_at = now
                    if ft == protocol_v2.FRAME_TYPE_ERROR:
                        self.errors.append(data.split(b" ", 1)[0].decode())
                        continue
                    _, attempts, msg_id, body = protocol_v2.decode_message(data)
                    if self._live_count(now, msg_id) >= self.rdy and now - self.rdy_lowered_at > RDY_GRACE:
                        self.over_rdy += 1
                    self.held[msg_id] = [body, attempts, now]
                    self.received += 1
                    if attempts > 1:
                        self.redelivered += 1
        except (OSError, EOFError, ValueError):
            pass

    def _live_count(self, now, arriving):
        """Held messages whose timeout has surely not passed at the broker (it TOUCHed them no earlier
        than we), but for ``arriving``: the broker redelivers a message only once its timeout passed."""
        limit = now - MSG_TIMEOUT_MS / 1000.0 + TIMEOUT_SLACK
        return sum(1 for msg_id, entry in self.held.items() if entry[2] > limit and msg_id != arriving)

    def send(self, data):
        with self._send_lock:
            try:
                self.sock.sendall(data)
            except OSError:
                pass

    def set_rdy(self, n):
        with self._lock:
            if n < self.rdy:
                self.rdy_lowered_at = time.monotonic()
            self.rdy = n
        self.send(b"RDY %d\n" % n)

    def _send_for(self, n, line, keep=False):
        """Send ``line % id`` for up to ``n`` held messages (lowest bodies first); returns how many.

        Under the lock, so that the keep-alive never TOUCHes a message this has just FINed.
        """
        with self._lock:
            chosen = sorted(self.held, key=lambda i: self.held[i][0])[:n]
            if keep:
                now = time.monotonic()
                for msg_id in chosen:
                    self.held[msg_id][2] = now
            else:
                for msg_id in chosen:
                    del self.held[msg_id]
            if chosen:
                self.send(b"".join(line % i for i in chosen))
            return len(chosen)

    def fin(self, n):
        return self._send_for(n, b"FIN %s\n")

    def req(self, n, delay_ms):
        return self._send_for(n, b"REQ %s " + b"%d\n" % delay_ms)

    def touch(self, n):
        return self._send_for(n, b"TOUCH %s\n", keep=True)

    def touch_all(self):
        """Keep every held message alive (a session holds messages across many steps)."""
        return self._send_for(len(self.held), b"TOUCH %s\n", keep=True)

    def expire_before(self, when):
        """Forget messages received before ``when``: their timeout has passed at the broker."""
        with self._lock:
            for msg_id in [i for i, entry in self.held.items() if entry[2] < when]:
                del self.held[msg_id]

    def close(self):
        self.alive = False
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self._reader.join(10)


class Observation(tuple):
    """What one step left behind: ``(step, shortfall, over_rdy, errors, redelivered)``."""

    def __new__(cls, step, shortfall, over_rdy, errors, redelivered):
        return super().__new__(cls, (step, shortfall, over_rdy, tuple(errors), redelivered))


class Session:
    """One session against one broker: a publisher and consumers on one channel.

    ``outstanding`` counts the messages published and not yet FINed, minus
    those deferred by a REQ with a delay and not yet due: what the channel
    must hand out (or has in flight) once a step settles.
    """

    def __init__(self, broker, topic="delivery", channel="c"):
        self.broker = broker
        self.topic = topic
        self.channel = channel
        self.consumers = []
        self.published = 0
        self.finished = 0
        self.deferred_until = []  # monotonic due times of REQs with a delay
        self.latencies = []  # seconds each step took to settle
        self._pub = socket.create_connection(broker.tcp_address, timeout=10)
        self._pub.sendall(protocol_v2.MAGIC_V2)
        self._body = 0
        self._stop = threading.Event()
        self._keep_alive = threading.Event()  # set: the keep-alive thread TOUCHes held messages
        self._keep_alive.set()
        self._keep_alive_done = threading.Lock()  # held by the keep-alive thread during a TOUCH round
        self._keeper = threading.Thread(target=self._keep_alive_loop, name="delivery-keep-alive", daemon=True)
        self._keeper.start()

    def close(self):
        self._stop.set()
        self._keeper.join(10)
        for c in self.consumers:
            c.close()
        self._pub.close()

    def _publish(self, bodies):
        body = protocol_v2.encode_mpub_body(bodies)
        self._pub.sendall(b"MPUB %s\n" % self.topic.encode() + struct.pack(">i", len(body)) + body)
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
            chunk = self._pub.recv(4096)
            assert chunk, "publisher disconnected"
            data += chunk
        assert protocol_v2.decode_frame(data)[1] == b"OK", data

    def live(self):
        return [c for c in self.consumers if c.alive]

    def outstanding(self):
        now = time.monotonic()
        waiting = sum(1 for due in self.deferred_until if due > now)
        return self.published - self.finished - waiting

    def shortfall(self):
        """Messages that could be in flight to a ready consumer and are not (0 when delivery keeps up)."""
        live = self.live()
        held = sum(len(c.held) for c in live)
        capacity = sum(max(c.rdy - len(c.held), 0) for c in live)  # free slots
        undelivered = max(self.outstanding() - held, 0)
        return min(capacity, undelivered)

    # -- steps ---------------------------------------------------------------

    def connect(self, rdy):
        c = Consumer(self.broker.tcp_address, self.topic, self.channel, len(self.consumers))
        self.consumers.append(c)
        c.set_rdy(rdy)

    def publish(self, n):
        bodies = [b"%08d" % (self._body + i) for i in range(n)]
        self._body += n
        self._publish(bodies)
        self.published += n

    def fin(self, consumer, n):
        self.finished += self.consumers[consumer].fin(n)

    def req(self, consumer, n, delay_ms=0):
        count = self.consumers[consumer].req(n, delay_ms)
        if delay_ms:
            due = time.monotonic() + delay_ms / 1000.0
            self.deferred_until.extend([due] * count)

    def touch(self, consumer, n):
        self.consumers[consumer].touch(n)

    def rdy(self, consumer, n):
        self.consumers[consumer].set_rdy(n)

    def leave(self, consumer):
        """The consumer disconnects: what it held is redelivered to the others
        (Go nsqd after the messages' timeout, this broker at once)."""
        self.consumers[consumer].close()

    def hold_past_timeout(self):
        """Nobody FINs for longer than the message timeout: the slots it held are refilled
        (True), or there was nothing to time out or no RDY to refill."""
        self._keep_alive.clear()
        with self._keep_alive_done:  # (a TOUCH round under way finishes first)
            start = time.monotonic()
        before = sum(c.received for c in self.live())
        held = sum(len(c.held) for c in self.live())
        capacity = sum(c.rdy for c in self.live())
        self._stop.wait(MSG_TIMEOUT_MS / 1000.0 + 0.6)  # (the timeout passes at the broker meanwhile)
        for c in self.live():
            c.expire_before(start)
        after = sum(c.received for c in self.live())
        self._keep_alive.set()
        # Expired messages are requeued at the tail: what refills the freed slots may be other messages.
        return held == 0 or capacity == 0 or after > before

    def _keep_alive_loop(self):
        """TOUCH what every consumer holds, every quarter second, while ``_keep_alive`` is set."""
        while not self._stop.wait(0.25):
            if self._keep_alive.wait(0.25):
                with self._keep_alive_done:
                    if self._keep_alive.is_set():
                        for c in self.live():
                            c.touch_all()

    def settle(self, extra=0.0):
        """Wait for the step to settle; returns (shortfall, over_rdy, errors)."""
        start = time.monotonic()
        deadline = start + WINDOW + extra
        while time.monotonic() < deadline:
            if self.shortfall() == 0 and time.monotonic() >= start + extra:
                break
            self._stop.wait(0.005)
        self.latencies.append(max(0.0, time.monotonic() - start - extra))  # (the wait for Go's timeout aside)
        # Then quiet: an over-RDY delivery, or one more message than can be held, would show now.
        self._stop.wait(QUIET)
        return (
            self.shortfall(),
            sum(c.over_rdy for c in self.consumers),
            sorted(set(e for c in self.consumers for e in c.errors)),
        )


def scripted_sessions():
    """Named fixed scripts: each a list of (step name, arguments)."""
    return {
        # The reported stall: a consumer holds most of its RDY and FINs a few.
        "held-batch": [("connect", 200), ("publish", 400), ("fin", 0, 48), ("fin", 0, 1), ("fin", 0, 100)],
        # Several consumers, one holds everything while the others work.
        "holders-and-workers": [
            ("connect", 10), ("connect", 3), ("connect", 1), ("publish", 50),
            ("fin", 1, 2), ("fin", 2, 1), ("fin", 0, 1), ("req", 1, 1, 0), ("fin", 0, 9),
        ],
        # RDY raised after blocking, lowered below what is held, raised again.
        "rdy-changes": [
            ("connect", 1), ("publish", 20), ("rdy", 0, 5), ("rdy", 0, 2), ("fin", 0, 2),
            ("fin", 0, 2), ("rdy", 0, 0), ("fin", 0, 2), ("rdy", 0, 4),
        ],
        # REQ with and without a delay, TOUCH, timeouts, a consumer leaving.
        "requeue-timeout-leave": [
            ("connect", 4), ("connect", 4), ("publish", 6), ("req", 0, 2, 0), ("req", 1, 1, 300),
            ("touch", 0, 2), ("timeout",), ("leave", 1), ("publish", 3), ("fin", 0, 4),
        ],
        # A consumer joins a backlog; a publish arrives while everyone is full.
        "join-backlog": [("publish", 30), ("connect", 5), ("connect", 7), ("publish", 1), ("fin", 0, 5), ("fin", 1, 3)],
        # FINs read together free more slots than messages wait: the consumer is then waiting for the next publish.
        "refill-empties": [("connect", 3), ("publish", 4), ("fin", 0, 2), ("publish", 1), ("fin", 0, 1), ("publish", 2)],
    }


def random_session(seed, steps=25):
    """A randomized script: several consumers, random RDY and RDY changes, FIN/REQ/TOUCH, holds, leaves."""
    rng = random.Random(seed)
    script = [("connect", rng.randint(1, 8)) for _ in range(rng.randint(1, 3))]
    consumers = len(script)
    gone = set()
    for _ in range(steps):
        kind = rng.choices(["publish", "fin", "req", "touch", "rdy", "connect", "leave", "timeout"],
                           weights=[6, 8, 3, 2, 3, 1, 1, 1])[0]
        live = [i for i in range(consumers) if i not in gone]
        if kind == "publish":
            script.append(("publish", rng.randint(1, 30)))
        elif kind == "connect" and consumers < 5:
            script.append(("connect", rng.randint(0, 8)))
            consumers += 1
        elif kind == "leave" and len(live) > 1:
            i = rng.choice(live)
            gone.add(i)
            script.append(("leave", i))
        elif kind == "timeout":
            script.append(("timeout",))
        elif live:
            i = rng.choice(live)
            if kind == "fin":
                script.append(("fin", i, rng.randint(1, 6)))
            elif kind == "req":
                script.append(("req", i, rng.randint(1, 3), rng.choice([0, 0, 200])))
            elif kind == "touch":
                script.append(("touch", i, rng.randint(1, 3)))
            elif kind == "rdy":
                script.append(("rdy", i, rng.randint(0, 8)))
    script.append(("rdy_all", 10))
    script.append(("fin_all",))
    return script


def play(broker, script, topic="delivery"):
    """Play a script against a broker; returns (observations, settle latencies in seconds)."""
    session = Session(broker, topic)
    observations = []
    try:
        for n, step in enumerate(script):
            kind, args = step[0], step[1:]
            redelivered = None
            extra = 0.0
            if kind == "timeout":
                redelivered = session.hold_past_timeout()
            elif kind == "leave":
                session.leave(*args)
                extra = MSG_TIMEOUT_MS / 1000.0 + 0.3  # Go redelivers at the timeout
            elif kind == "req" and len(args) > 2 and args[2]:
                session.req(*args)
                observations.append(Observation(n, *session.settle(), None))  # the deferred ones stay away
                extra = args[2] / 1000.0 + 0.3
            elif kind == "rdy_all":
                for i, c in enumerate(session.consumers):
                    if c.alive:
                        session.rdy(i, args[0])
            elif kind == "fin_all":
                # Until everything published was FINed once: no message lost.
                deadline = time.monotonic() + 20
                while session.finished < session.published and time.monotonic() < deadline:
                    for i, c in enumerate(session.consumers):
                        if c.alive:
                            session.fin(i, 1000)
                    session._stop.wait(0.02)
                observations.append(Observation(n, session.published - session.finished, 0, (), None))
                continue
            else:
                getattr(session, kind)(*args)
            observations.append(Observation(n, *session.settle(extra), redelivered))
    finally:
        session.close()
    return observations, session.latencies


def ideal(script):
    """The observations of a broker that keeps nsqd's delivery contract."""
    return [Observation(n, 0, 0, (), True if step[0] == "timeout" else None)
            for n, step in _expanded(script)]


def _expanded(script):
    for n, step in enumerate(script):
        if step[0] == "req" and len(step) > 3 and step[3]:
            yield n, ("req-deferred",)
        yield n, step
