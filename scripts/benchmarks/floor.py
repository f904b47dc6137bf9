#!/usr/bin/env python3
"""The floor probe: the least a threaded Python broker must do per message.

    python scripts/benchmarks/floor.py serve      # a floor server on 127.0.0.1:<ephemeral>
    python scripts/benchmarks/floor.py serve-consumers   # the many-consumers floor (below)
    scripts/bench floor [--go-tools DIR] [--python pypy3]   # measure it alone
    scripts/bench consumers --floor                      # the many-consumers floor as a column

The server speaks just enough of the TCP protocol for the single-PUB and round-trip
loads (Go's ``pub_probe``/``rtt_probe`` or this project's ``writer``/``roundtrip``):
the magic, ``PUB`` (answered ``OK``; the body copied out and kept, as a broker keeps
a message in memory), ``SUB`` (``OK``), ``RDY``/``FIN``/``NOP`` (read, nothing else).
Each PUB is also delivered as a ``MESSAGE`` frame to the connection that subscribed
last, if any.  One thread per connection, ``recv_into`` one reused buffer per
connection, ``sendall`` for every answer: the same socket work a broker does, and
nothing else (no topics, channels, in-flight bookkeeping, timeouts or IDs worth the
name).  Reading a broker's CPU per message against this one's tells how much of it
is the broker's own work rather than the interpreter's socket and thread floor.

``serve-consumers`` is the floor of another deployment shape, many consumers on one
channel, each at a small RDY, FIN on receipt (``scripts/bench consumers``): one thread,
``select.epoll`` (level-triggered), non-blocking sockets (:class:`ConsumersFloor`).  It
speaks the magic, ``IDENTIFY`` (``OK``: the load sends no feature negotiation), ``SUB``
(``OK``; the connection joins the one channel), ``RDY``, ``FIN`` (one fewer in flight),
``NOP``, ``PUB``/``MPUB`` (``OK``; each message a ``MESSAGE`` frame on one deque) and
``CLS``; and ``COUNT``, not NSQ's, answered with the number of subscribed connections
still open (it has no HTTP /stats).  Messages are dealt one at a time in turn to the
subscribers with credit; whatever each connection is due after one epoll batch goes in
one ``send``.  No in-flight index, timeouts, heartbeats, requeues or stats: only the
socket and interpreter work any single-process Python broker does in that shape.

``serve`` and ``serve-consumers`` need nothing but the standard library (they run under
any interpreter without the project on the path); ``scripts/bench --compare GO_NSQD
--floor`` adds ``serve`` as a column for the phases it can serve (``pub-mem``, ``rtt``).
"""

import argparse
import collections
import resource
import select
import signal
import socket
import struct
import sys
import threading
import time

_OK = struct.pack(">ii", 6, 0) + b"OK"
_MESSAGE_HEADER = struct.Struct(">iiqH16s")  # size, frame type 2, timestamp, attempts, id
_INVALID = b"E_INVALID floor: unknown command"


class FloorServer:
    """Accepts connections; one thread each.

    ``_lock`` guards ``_subscriber`` (the connection PUBs are delivered to) and
    ``_next_id``; each connection's writes to the subscriber happen under that
    subscriber's own ``write_lock`` (its own answers and the deliveries of every
    publisher meet there).
    """

    def __init__(self, host="127.0.0.1", port=0):
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((host, port))
        self.listener.listen(128)
        self._lock = threading.Lock()
        self._subscriber = None  # (socket, write lock)
        self._next_id = 0
        self.kept = []  # bodies PUBlished while nobody subscribed (list.append is atomic)

    def serve_forever(self):
        n = 0
        while True:
            sock, _ = self.listener.accept()
            n += 1
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # Connection threads end with their connection; the process ends with SIGTERM, which
            # only this thread may take: blocked around the start, the new thread inherits the mask
            # from its first instruction (a SIGTERM meanwhile waits, and comes here once unblocked).
            # Taken by a connection thread, it would only set Python's flag while this thread stays
            # blocked in accept() (under valgrind, which picks the thread, the probe never ended).
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            try:
                threading.Thread(target=self._serve, args=(sock,), name="floor-conn-%d" % n, daemon=True).start()
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    def _serve(self, sock):
        try:
            self._commands(sock)
        except (OSError, ValueError):
            pass
        finally:
            with self._lock:
                if self._subscriber is not None and self._subscriber[0] is sock:
                    self._subscriber = None
            sock.close()

    def _commands(self, sock):
        buf = bytearray(65536)
        view = memoryview(buf)
        start = end = 0
        write_lock = threading.Lock()  # this connection's writes: its answers, deliveries to it

        def fill(need):
            """Read until buf[start:end] holds ``need`` bytes; returns the new (start, end)."""
            nonlocal buf, view, start, end
            while end - start < need:
                if start == end:
                    start = end = 0
                elif len(buf) - start < need:  # move the partial command to the front
                    if need > len(buf):
                        view.release()
                        buf = buf[start:end] + bytearray(max(need, 2 * len(buf)) - (end - start))
                        view = memoryview(buf)
                    else:
                        buf[:end - start] = buf[start:end]
                    end -= start
                    start = 0
                n = sock.recv_into(view[end:])
                if not n:
                    raise OSError("closed")
                end += n

        fill(4)
        if buf[start:start + 4] != b"  V2":
            return
        start += 4
        while True:
            nl = buf.find(b"\n", start, end)
            while nl < 0:
                fill(end - start + 1)
                nl = buf.find(b"\n", start, end)
            line = bytes(view[start:nl])
            start = nl + 1
            if line.startswith(b"PUB "):
                fill(4)
                size = int.from_bytes(buf[start:start + 4], "big")
                start += 4
                fill(size)
                body = bytes(view[start:start + size])
                start += size
                with write_lock:
                    sock.sendall(_OK)
                self._deliver(body)
            elif line.startswith(b"SUB "):
                with self._lock:
                    self._subscriber = (sock, write_lock)
                with write_lock:
                    sock.sendall(_OK)
            elif line.startswith((b"FIN ", b"RDY ", b"NOP", b"TOUCH ")):
                pass
            elif line.startswith(b"CLS"):
                with write_lock:
                    sock.sendall(struct.pack(">ii", 14, 0) + b"CLOSE_WAIT")
            else:
                with write_lock:
                    sock.sendall(struct.pack(">ii", 4 + len(_INVALID), 1) + _INVALID)
                return

    def _deliver(self, body):
        with self._lock:
            subscriber = self._subscriber
            self._next_id += 1
            msg_id = b"%016x" % self._next_id
        if subscriber is None:
            self.kept.append(body)
            return
        sock, write_lock = subscriber
        frame = _MESSAGE_HEADER.pack(4 + 8 + 2 + 16 + len(body), 2, time.time_ns(), 1, msg_id) + body
        try:
            with write_lock:
                sock.sendall(frame)
        except OSError:
            pass  # the subscriber went away: its own thread cleans up


# -- serve-consumers: many consumers on one channel, one thread, epoll ----------------------------

_RECV_SIZE = 65536  # a consumer sends a FIN at a time; the publisher an MPUB of ~21 kB


def _response(text):
    """A response frame (type 0) holding ``text``."""
    return struct.pack(">ii", 4 + len(text), 0) + text


def _body_end(data, nl):
    """Where the size-prefixed body that follows a command line ending at ``nl`` ends;
    -1 while it has not all come."""
    if len(data) < nl + 5:
        return -1
    end = nl + 5 + int.from_bytes(data[nl + 1:nl + 5], "big")
    return end if end <= len(data) else -1


class _Connection:
    """One connection of :class:`ConsumersFloor`.

    ``pending``: the bytes received after the last whole command; ``out``: the frames it is
    due in this epoll batch (sent together at its end); ``backlog``: what the socket did not
    take, sent on EPOLLOUT.  Once it SUBscribed: ``rdy``, ``in_flight`` (a count, not an
    index), ``queued`` (in the ready deque).
    """

    __slots__ = ("sock", "fd", "pending", "out", "backlog", "greeted", "subscribed", "rdy", "in_flight",
                 "queued", "closed")

    def __init__(self, sock):
        self.sock = sock
        self.fd = sock.fileno()
        self.pending = b""
        self.out = []
        self.backlog = b""
        self.greeted = False
        self.subscribed = False
        self.rdy = 0
        self.in_flight = 0
        self.queued = False
        self.closed = False


class ConsumersFloor:
    """The many-consumers floor: one thread, level-triggered epoll, non-blocking sockets.

    Each loop handles every event one ``epoll.poll`` returned (reading one ``recv`` per
    readable connection and acting on its whole commands), then deals the queued messages to
    the subscribers with credit, then sends each connection what it is due, in one ``send``.
    """

    def __init__(self, host="127.0.0.1", port=0):
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((host, port))
        self.listener.listen(socket.SOMAXCONN)
        self.listener.setblocking(False)
        self.epoll = select.epoll()
        self.epoll.register(self.listener.fileno(), select.EPOLLIN)
        self.connections = {}  # fd -> _Connection
        self.messages = collections.deque()  # MESSAGE frames not yet delivered
        self.ready = collections.deque()  # subscribers with credit, each once (a closed one skipped)
        self.due = []  # the connections whose ``out`` is not empty
        self.subscribers = 0  # open connections that SUBscribed (what COUNT answers)
        self._next_id = 0

    def serve_forever(self):
        listener = self.listener.fileno()
        connections = self.connections
        readable = select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR
        while True:
            for fd, events in self.epoll.poll():
                if fd == listener:
                    self._accept()
                    continue
                conn = connections.get(fd)
                if conn is None:
                    continue  # closed earlier in this batch
                if events & select.EPOLLOUT:
                    self._send_backlog(conn)
                if events & readable and not conn.closed:
                    self._read(conn)
            self._deal()
            self._send_due()

    def _accept(self):
        while True:
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Connection(sock)
            self.connections[conn.fd] = conn
            self.epoll.register(conn.fd, select.EPOLLIN)

    def _read(self, conn):
        """One ``recv`` (level-triggered: epoll reports the rest), then its whole commands."""
        try:
            data = conn.sock.recv(_RECV_SIZE)
        except BlockingIOError:
            return  # (a descriptor closed and reused within one batch)
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        if conn.pending:
            data = conn.pending + data
        used = self._commands(conn, data)
        conn.pending = data[used:] if used < len(data) else b""

    def _commands(self, conn, data):
        """Act on the whole commands in ``data``; returns where the first partial one starts."""
        pos = 0
        if not conn.greeted:
            if len(data) < 4:
                return 0
            if data[:4] != b"  V2":
                self._close(conn)
                return len(data)
            conn.greeted = True
            pos = 4
        while True:
            nl = data.find(b"\n", pos)
            if nl < 0:
                return pos
            if data.startswith(b"FIN ", pos):  # first: nearly every command is one
                conn.in_flight -= 1
                self._offer(conn)
                pos = nl + 1
            elif data.startswith(b"MPUB ", pos) or data.startswith(b"PUB ", pos):
                end = _body_end(data, nl)
                if end < 0:
                    return pos
                self._publish(data, nl + 5, end, data[pos] == 77)  # 77: "M"
                self._answer(conn, _OK)
                pos = end
            elif data.startswith(b"RDY ", pos):
                conn.rdy = int(data[pos + 4:nl])
                self._offer(conn)
                pos = nl + 1
            elif data.startswith(b"SUB ", pos):
                if not conn.subscribed:
                    conn.subscribed = True
                    self.subscribers += 1
                self._answer(conn, _OK)
                self._offer(conn)
                pos = nl + 1
            elif data.startswith(b"IDENTIFY", pos):
                end = _body_end(data, nl)
                if end < 0:
                    return pos
                self._answer(conn, _OK)  # the load asks no feature negotiation: nothing to read in it
                pos = end
            elif data.startswith(b"NOP", pos):
                pos = nl + 1
            elif data.startswith(b"COUNT", pos):
                self._answer(conn, _response(b"%d" % self.subscribers))
                pos = nl + 1
            elif data.startswith(b"CLS", pos):
                self._answer(conn, _response(b"CLOSE_WAIT"))
                pos = nl + 1
            else:
                try:
                    conn.sock.send(struct.pack(">ii", 4 + len(_INVALID), 1) + _INVALID)
                except OSError:
                    pass
                self._close(conn)
                return len(data)

    def _publish(self, data, start, end, multiple):
        """The body ``data[start:end]`` of a PUB or (``multiple``) MPUB: a MESSAGE frame per
        message on the deque, with one timestamp per command."""
        now = time.time_ns()
        next_id = self._next_id
        append = self.messages.append
        if multiple:
            pos = start + 4  # after the message count: the sizes say where each ends
            while pos < end:
                size = int.from_bytes(data[pos:pos + 4], "big")
                pos += 4
                next_id += 1
                append(_MESSAGE_HEADER.pack(30 + size, 2, now, 1, b"%016x" % next_id) + data[pos:pos + size])
                pos += size
        else:
            next_id += 1
            append(_MESSAGE_HEADER.pack(30 + end - start, 2, now, 1, b"%016x" % next_id) + data[start:end])
        self._next_id = next_id

    def _offer(self, conn):
        """Put a subscriber with credit in the ready deque, unless it is there already."""
        if conn.subscribed and not conn.queued and conn.in_flight < conn.rdy:
            conn.queued = True
            self.ready.append(conn)

    def _answer(self, conn, frame):
        if not conn.out:
            self.due.append(conn)
        conn.out.append(frame)

    def _deal(self):
        """Queued messages to the ready subscribers, one at a time in turn."""
        messages, ready, due = self.messages, self.ready, self.due
        while messages and ready:
            conn = ready.popleft()
            if conn.closed:
                continue
            if not conn.out:
                due.append(conn)
            conn.out.append(messages.popleft())
            conn.in_flight += 1
            if conn.in_flight < conn.rdy:
                ready.append(conn)
            else:
                conn.queued = False

    def _send_due(self):
        """Each connection's frames of this batch in one send (after any backlog: in order)."""
        due, self.due = self.due, []
        for conn in due:
            data = conn.out[0] if len(conn.out) == 1 else b"".join(conn.out)
            conn.out.clear()
            if conn.closed:
                continue
            if conn.backlog:
                conn.backlog += data  # EPOLLOUT is awaited already
            elif self._send(conn, data):
                self.epoll.modify(conn.fd, select.EPOLLIN | select.EPOLLOUT)

    def _send_backlog(self, conn):
        data, conn.backlog = conn.backlog, b""
        if data and not self._send(conn, data) and not conn.closed:
            self.epoll.modify(conn.fd, select.EPOLLIN)

    def _send(self, conn, data):
        """Send without blocking; what the socket does not take goes to the backlog.
        Returns True if some went there."""
        try:
            sent = conn.sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._close(conn)
            return False
        if sent < len(data):
            conn.backlog = data[sent:]
            return True
        return False

    def _close(self, conn):
        """Forget a connection; its messages in flight are lost (the floor keeps no index of them)."""
        conn.closed = True
        del self.connections[conn.fd]
        self.epoll.unregister(conn.fd)
        conn.sock.close()
        if conn.subscribed:
            self.subscribers -= 1


def measure(argv):
    """``scripts/bench floor``: the floor alone, under the single-PUB and round-trip loads."""
    from . import tools as load_tools
    from .common import BrokerProc, interpreter

    ap = argparse.ArgumentParser(prog="scripts/bench floor", description=__doc__.split("\n")[0])
    ap.add_argument("--python", default=sys.executable, help="interpreter that runs the floor server")
    ap.add_argument("--go-tools", metavar="DIR", help="drive it with Go's pub_probe/rtt_probe from DIR")
    ap.add_argument("--runfor", type=float, default=5.0, help="seconds of single PUB")
    ap.add_argument("--rtt-count", type=int, default=5000)
    a = ap.parse_args(argv)
    tools = load_tools.choose(a.go_tools)
    with BrokerProc("floor", a.python) as floor:
        cpu = floor.cpu_seconds()
        rate = tools.pub(floor.address, "floor", a.runfor)
        cpu = floor.cpu_seconds() - cpu
    with BrokerProc("floor", a.python) as floor:
        cpu_rtt = floor.cpu_seconds()
        p99 = tools.rtt_p99(floor.address, a.rtt_count)
        cpu_rtt = floor.cpu_seconds() - cpu_rtt
    print("floor under %s, load from %s" % (interpreter(a.python), tools.name))
    print("single PUB, 2 conns: %.0f msg/s, %.2f us CPU per PUB" % (rate, cpu / (rate * a.runfor) * 1e6))
    print("publish-to-delivery p99: %.1f us, %.2f us CPU per round trip" % (p99, cpu_rtt / a.rtt_count * 1e6))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["serve"], ["serve-consumers"]):
        # SIGTERM ends the process through SystemExit, as a broker's clean stop (and a profiler
        # watching it, such as callgrind, writes its counts at exit).
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
        if argv[0] == "serve":
            FloorServer().serve_forever()
        else:
            # A descriptor per consumer: thousands of them (BrokerProc's parent raised its own limit
            # already; run alone, the floor raises its soft limit to the hard one itself).
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            ConsumersFloor().serve_forever()
    else:
        measure(argv)


if __name__ == "__main__":
    main()
