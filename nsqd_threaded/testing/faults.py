"""FaultProxy: a TCP proxy in front of a broker that stalls, delays and cuts its clients' connections.

::

    from nsqd_threaded.testing import Broker, FaultProxy

    with Broker() as nsqd, FaultProxy(nsqd.tcp_addr) as proxy:
        consumer = Consumer(proxy.addr, "topic", "channel", handler)   # the application uses proxy.addr
        proxy.stall()        # bytes held both ways, connections open
        proxy.heal()         # everything held is delivered, in order
        proxy.delay(0.2)     # each chunk, each way, 200 ms late
        proxy.cut()          # every connection reset (RST), new ones refused
        proxy.heal()

The target is any broker, ours or Go's (``"host:port"`` or ``(host, port)``).  The
fault harness (``scripts/faults.py _proxy``) runs the same class in a host of its
emulated network, with the toxics in the spirit of toxiproxy's that this kernel's
missing ``sch_netem`` would otherwise give: latency with jitter, loss modelled by its
effect on a TCP flow (a lost segment costs a retransmission timeout: a byte stream
cannot lose bytes without breaking the protocol), a bandwidth limit.
"""

import random
import select
import socket
import struct
import threading
import time

from ..server.auto_skip import listen_backlog
from .served import LOCALHOST, address_text

__all__ = ["FaultProxy"]

_CHUNK = 65536
ACCEPT_POLL_MS = 100  # the accept thread looks at its listener at least this often (closed: it ends)
_PACE_CHUNK = 4096


class FaultProxy:
    """A TCP proxy from ``.addr`` to ``target`` with faults to inject (a context manager).

    ``FaultProxy(target, listen=("127.0.0.1", 0), delay=0.0, jitter=0.0, loss=0.0, rto=0.2,
    bandwidth=None, seed=None, on_event=None)``: ``delay`` +- ``jitter`` seconds hold each
    chunk in each direction (order kept); with probability ``loss`` a chunk is held ``rto``
    seconds more; ``bandwidth`` (bytes per second, each direction of each connection) paces
    the writes.  ``on_event(name, **fields)`` hears of each ``accept`` (with ``peer``),
    ``stall``, ``flow``, ``delay``, ``reset`` (with ``conns``), ``cut`` and ``heal``.

    Each connection has a reader and a writer thread per direction; the proxy owns them
    and its accept thread, and :meth:`close` joins them all.  ``_cond`` guards the fault
    state (``_stalled``, ``_delay``, ``_cut``, ``_conns``, ``_listener``, ``_accepter``)
    and signals a change of it to the writers (a stall ended, a reset).
    """

    def __init__(self, target, listen=(LOCALHOST, 0), delay=0.0, jitter=0.0, loss=0.0, rto=0.2,
                 bandwidth=None, seed=None, on_event=None):
        self.target = _address(target)
        self._listen_address = _address(listen)
        self._base_delay = float(delay)
        self._delay = float(delay)
        self.jitter = float(jitter)
        self.loss = float(loss)
        self.rto = float(rto)
        self.bandwidth = float(bandwidth) if bandwidth else None
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()  # guards _rng (every reader draws from it)
        self._on_event = on_event
        self._cond = threading.Condition()
        self._stalled = False
        self._cut = False
        self._closed = False
        self._conns = []
        self._finished = []  # connections whose threads are done: joined on the next accept or close
        self._listener = None
        self._accepting = False  # the accept thread took a connection and is setting it up (see busy)
        self._accepter = None
        self._address = None

    # -- lifecycle -------------------------------------------------------------

    def start(self):
        """Bind and accept (on an ephemeral port unless ``listen`` named one); returns the proxy."""
        with self._cond:
            self._closed = False
            self._open_listener()
        return self

    def close(self):
        """Stop accepting, close every connection, join every thread."""
        with self._cond:
            self._closed = True
            accepter = self._close_listener()
            conns, self._conns = self._conns, []
        if accepter is not None:
            accepter.join()
        for conn in conns:
            conn.close(reset=False)
        with self._cond:
            finished, self._finished = self._finished, []
        for conn in conns + finished:
            conn.join()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    @property
    def address(self):
        """The bound ``(host, port)`` the application connects to (kept across :meth:`cut`)."""
        return self._address

    @property
    def addr(self):
        """``"host:port"`` to give the application instead of the broker's (as ``Broker.tcp_addr``)."""
        return address_text(self._address)

    def holding(self):
        """True while a delay (or the bandwidth limit) holds bytes on their way, which only time
        passing releases: what a loop skipping time waits for (a stall's bytes do not count, as
        only :meth:`flow` releases them)."""
        with self._cond:
            if self._stalled:
                return False
            conns = list(self._conns)
        return any(conn.holding() for conn in conns)

    def busy(self):
        """True while the proxy has work under way that no socket of the application or the broker
        shows yet: a connection waiting to be accepted or being set up (its upstream dialled), bytes
        read from one side and not yet written to the other, or bytes (or an end) on a proxied socket
        it has not read.  What a loop skipping time waits out (see :meth:`holding`; a stall's bytes
        do not count)."""
        with self._cond:
            if self._stalled:
                return False
            conns = list(self._conns)
            listener = self._listener
        if self._accepting or (listener is not None and listen_backlog(listener)):
            return True
        return any(conn.busy() for conn in conns)

    @property
    def connections(self):
        """How many proxied connections are open."""
        with self._cond:
            return len(self._conns)

    # -- faults ----------------------------------------------------------------

    def stall(self):
        """Hold every byte, both ways, on every connection (new ones too); the connections stay open."""
        with self._cond:
            self._stalled = True
        self._event("stall")

    def flow(self):
        """End a :meth:`stall`: what was held is delivered, in order."""
        with self._cond:
            self._stalled = False
            self._cond.notify_all()
        self._event("flow")

    def delay(self, seconds):
        """Hold each chunk ``seconds`` (plus the jitter) in each direction from now on."""
        with self._cond:
            self._delay = float(seconds)
        self._event("delay", seconds=seconds)

    def reset(self):
        """Reset every connection, both sides (RST, as a middlebox dropping its state); keep accepting."""
        with self._cond:
            conns, self._conns = self._conns, []
            self._finished.extend(conns)
        self._event("reset", conns=len(conns))  # first: whoever sees an RST finds it already recorded
        for conn in conns:
            conn.close(reset=True)
        return len(conns)

    def cut(self):
        """Reset every connection and refuse new ones until :meth:`heal`."""
        with self._cond:
            self._cut = True
            accepter = self._close_listener()
        if accepter is not None:
            accepter.join()
        self.reset()
        self._event("cut")

    def heal(self):
        """Undo every fault: bytes flow, the delay is the one given at construction, connections are accepted."""
        with self._cond:
            self._stalled = False
            self._delay = self._base_delay
            if self._cut and not self._closed:
                self._open_listener()
            self._cut = False
            self._cond.notify_all()
        self._event("heal")

    # -- inside ----------------------------------------------------------------

    def _event(self, name, **fields):
        if self._on_event is not None:
            self._on_event(name, **fields)

    def _open_listener(self):
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(self._address or self._listen_address)  # the same port again after a cut
        listener.listen(512)
        self._address = listener.getsockname()[:2]
        self._listener = listener
        self._accepter = threading.Thread(target=self._accept_loop, args=(listener,),
                                          name="fault-proxy-accept[%d]" % self._address[1])
        self._accepter.start()

    def _close_listener(self):
        """Wake the accept loop (shutdown) and close the listener; the caller joins what is returned."""
        listener, accepter = self._listener, self._accepter
        self._listener = self._accepter = None
        if listener is not None:
            try:
                listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            listener.close()
        return accepter

    def _accept_loop(self, listener):
        ready = select.poll()
        ready.register(listener, select.POLLIN)
        while True:
            # Waits for a connection before accepting it: until _accepting is set, a caller of
            # busy() sees it in the listen queue.  (A closed listener answers the poll at once.)
            ready.poll(ACCEPT_POLL_MS)
            self._accepting = True
            try:
                client, peer = listener.accept() if _readable(listener) else (None, None)
            except OSError:
                self._accepting = False
                return  # closed: cut() or close()
            if client is None:
                self._accepting = False
                if listener.fileno() < 0:
                    return
                continue
            try:
                self._set_up(client, peer)
            finally:
                self._accepting = False

    def _set_up(self, client, peer):
        """A connection accepted: dial the target, start relaying (the accept thread)."""
        try:
            upstream = socket.create_connection(self.target, timeout=5.0)
            upstream.settimeout(None)
        except OSError:
            client.close()
            return
        client.settimeout(None)
        for sock in (client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._join_finished()
        conn = _Connection(self, client, upstream)
        with self._cond:
            if self._closed or self._cut:
                conn.close(reset=True)
                return
            self._conns.append(conn)
        self._event("accept", peer="%s:%d" % peer[:2])
        conn.start()

    def _ended(self, conn):
        """Both directions of ``conn`` ended by themselves: its threads are joined later."""
        with self._cond:
            if conn in self._conns:
                self._conns.remove(conn)
                self._finished.append(conn)

    def _join_finished(self):
        with self._cond:
            finished = [c for c in self._finished if c.done()]
            self._finished = [c for c in self._finished if c not in finished]
        for conn in finished:
            conn.join()

    def _hold(self):
        """How long the chunk read now waits: the delay, its jitter, and a modelled loss."""
        with self._cond:
            delay = self._delay
        if not (self.jitter or self.loss):
            return delay
        with self._rng_lock:
            delay += self._rng.uniform(-self.jitter, self.jitter)
            if self._rng.random() < self.loss:
                delay += self.rto
        return max(0.0, delay)

    def _wait_flowing(self, conn):
        """Block while stalled; False once ``conn`` is reset or the proxy closed."""
        with self._cond:
            while self._stalled and not conn.closed and not self._closed:
                self._cond.wait()
            return not conn.closed


class _Connection:
    """One proxied connection: per direction a reader that stamps each chunk with its release
    time and a writer that releases them in order.  ``_cond`` guards each direction's chunks."""

    def __init__(self, proxy, client, upstream):
        self.proxy = proxy
        self.socks = (client, upstream)
        self.closed = False  # set by close() or by the last writer: both sockets are (being) closed
        self._cond = threading.Condition()
        self._chunks = ([], [])  # client->upstream, upstream->client: (release at, bytes or None)
        self._in_hand = [False, False]  # a writer took a chunk and has not sent it yet (per direction)
        # Per direction, each written by that direction's reader only (set True without _cond, as a
        # flag read by busy(); cleared under _cond with the chunk it queued, so busy() never sees
        # neither): a reader saw bytes (or the end) and has not queued them yet; it queued the end.
        self._reading = [False, False]
        self._read_ended = [False, False]
        self._threads = []
        self._writers = 2  # writers still running; the last one closes the sockets
        port = proxy.address[1]
        for index, (src, dst) in enumerate(((client, upstream), (upstream, client))):
            way = "up" if index == 0 else "down"
            self._threads.append(threading.Thread(target=self._read, args=(src, index),
                                                  name="fault-proxy-read[%d %s]" % (port, way)))
            self._threads.append(threading.Thread(target=self._write, args=(dst, index),
                                                  name="fault-proxy-write[%d %s]" % (port, way)))

    def start(self):
        for thread in self._threads:
            thread.start()

    def join(self):
        for thread in self._threads:
            if thread.ident is not None:
                thread.join()

    def done(self):
        return not any(t.is_alive() for t in self._threads)

    def close(self, reset):
        """Close both sockets; with ``reset`` an RST to each side (SO_LINGER 0), else as they are."""
        with self._cond:
            if self.closed:
                return
            self.closed = True
            self._cond.notify_all()
        with self.proxy._cond:
            self.proxy._cond.notify_all()  # a writer held by a stall
        for sock in self.socks:
            try:
                if reset:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.shutdown(socket.SHUT_RD)  # wakes its reader; the close sends the RST
            except OSError:
                pass
        for sock in self.socks:
            sock.close()

    def _read(self, src, index):
        chunks = self._chunks[index]
        last = 0.0
        ready = select.poll()
        ready.register(src, select.POLLIN)
        while True:
            # Waits for bytes before reading them: until _reading is set, busy() sees them in the
            # socket.  (close() shuts the socket down, which answers the poll.)
            try:
                ready.poll()
            except OSError:
                pass
            self._reading[index] = True
            try:
                data = src.recv(_CHUNK)
            except OSError:
                data = b""
            last = max(last, time.monotonic() + self.proxy._hold())
            with self._cond:
                chunks.append((last, data or None))
                self._reading[index] = False
                if not data:
                    self._read_ended[index] = True
                self._cond.notify_all()
            if not data:
                return

    def _write(self, dst, index):
        chunks = self._chunks[index]
        rate = self.proxy.bandwidth
        free_at = time.monotonic()  # the bandwidth limit: when the next byte may go
        try:
            while True:
                with self._cond:
                    while not chunks and not self.closed:
                        self._cond.wait()
                    if self.closed:
                        return
                    at, data = chunks.pop(0)
                    self._in_hand[index] = data is not None
                    wait = at - time.monotonic()
                    while wait > 0 and not self.closed:
                        self._cond.wait(wait)
                        wait = at - time.monotonic()
                if data is None:
                    try:
                        dst.shutdown(socket.SHUT_WR)  # the other side's FIN, passed on
                    except OSError:
                        pass
                    return
                if not self.proxy._wait_flowing(self):
                    return
                try:
                    if rate is None:
                        dst.sendall(data)
                        continue  # (through the finally below)
                    for i in range(0, len(data), _PACE_CHUNK):
                        piece = data[i:i + _PACE_CHUNK]
                        wait = free_at - time.monotonic()
                        if wait > 0:
                            time.sleep(wait)
                        dst.sendall(piece)
                        free_at = max(free_at, time.monotonic()) + len(piece) / rate
                except OSError:
                    return
                finally:
                    with self._cond:
                        self._in_hand[index] = False
        finally:
            self._writer_ended()

    def holding(self):
        """True while bytes read from one side wait to be written to the other."""
        with self._cond:
            return not self.closed and (any(self._chunks) or any(self._in_hand))

    def busy(self):
        """:meth:`holding`, or a reader has bytes (or the end) to read or is reading them."""
        with self._cond:
            if self.closed:
                return False
            if any(self._chunks) or any(self._in_hand) or any(self._reading):
                return True
            open_socks = [sock for sock, ended in zip(self.socks, self._read_ended) if not ended]
        return any(_readable(sock) for sock in open_socks)

    def _writer_ended(self):
        with self._cond:
            self._writers -= 1
            ended = self._writers == 0
            closed = self.closed
            if ended:
                self.closed = True  # a later close() has nothing to do
        if ended:
            if not closed:
                for sock in self.socks:
                    try:
                        sock.shutdown(socket.SHUT_RDWR)  # wakes a reader still waiting
                    except OSError:
                        pass
                    sock.close()
            self.proxy._ended(self)


def _address(address):
    """``"host:port"`` or ``(host, port)`` -> ``(host, port)``."""
    if isinstance(address, str):
        host, _, port = address.rpartition(":")
        return host.strip("[]") or LOCALHOST, int(port)
    host, port = address
    return host, int(port)


def _readable(sock):
    """Whether ``sock`` has bytes, an end or an error to read now (never waits)."""
    ready = select.poll()
    try:
        ready.register(sock, select.POLLIN)
    except (OSError, ValueError):
        return False
    return bool(ready.poll(0))
