"""Producer: pipelined PUB/MPUB/DPUB over one or several nsqd, with failover."""

import collections
import concurrent.futures
import threading
import time

from ..wire import protocol_v2
from .clock import ClientClock
from .connection import (
    ConnectionClosed,
    ConnectOptions,
    HEARTBEAT,
    NSQError,
    address_list,
    encode_bodies,
    encode_body,
    encode_name,
    format_address,
    parse_addresses,
)
from .log import ClientLog, dial_words, error_words
from .lookupd import lookup_addresses, parse_lookupd_address

# -- Producer --------------------------------------------------------------------

# The node could not take the message (it is exiting, or its backend failed): safe to try another.
_RETRY_CODES = frozenset({"E_PUB_FAILED", "E_MPUB_FAILED", "E_DPUB_FAILED"})


class _Node:
    """One nsqd of a Producer: one pipelined connection, its reader thread, its back-off.

    ``lock`` guards ``conn``, ``threads``, ``down_until``, ``backoff`` and ``producer``
    (None once closed), and is held while a request is written so that the
    connection's ``pending`` queue is in write order.

    Nothing a closed node leaves is cyclic garbage (the producer and its nodes
    refer to each other until :meth:`close`), so that a process with a high gc
    threshold can make and close producers freely.
    """

    def __init__(self, producer, address):
        self.producer = producer
        self.address = address
        self.lock = threading.Lock()
        self.conn = None
        self.threads = []
        self.down_until = 0.0  # monotonic time before which a reconnect is not tried first
        self.backoff = producer.reconnect_backoff[0]

    def connection(self):
        """The open connection, made now if there is none (call with ``lock`` held)."""
        producer = self.producer
        if producer is None or producer._closed:
            raise ConnectionClosed("producer is closed")
        conn = self.conn
        if conn is None:
            producer.log.conn("info", self.address, "connecting to nsqd")
            try:
                try:
                    conn = producer._connect.open(self.address)
                except OSError as e:
                    producer.log.conn("error", self.address, "error connecting to nsqd - %s", dial_words(e, self.address))
                    raise
                try:
                    producer._connect.handshake(conn)
                except BaseException as e:
                    producer.log.conn("error", self.address, "error connecting to nsqd - %s", error_words(e))
                    conn.close()
                    raise
            except (OSError, NSQError):
                high = producer.reconnect_backoff[1]
                self.down_until = producer._clock.monotonic() + self.backoff
                self.backoff = min(self.backoff * 2, high)
                raise
            self.backoff = producer.reconnect_backoff[0]
            self.down_until = 0.0
            conn.handshake_done()
            conn.pending = collections.deque()
            thread = threading.Thread(
                target=self._read_loop, args=(conn,), name="nsq-producer[%s]" % format_address(self.address), daemon=True
            )
            self.threads = [t for t in self.threads if t.is_alive()]
            self.threads.append(thread)
            self.conn = conn
            thread.start()
        return conn

    def request(self, data, future=None):
        """Send ``data``; the Future of its answer (``future`` if given).  Raises if it could not be sent."""
        if future is None:
            future = concurrent.futures.Future()
        with self.lock:
            conn = self.connection()
            conn.pending.append(future)
            try:
                conn.send(data)
            except ConnectionClosed:
                # The reader drains `pending` only under lock, so ours is still there.
                conn.pending.remove(future)
                if self.conn is conn:
                    self.conn = None
                raise
        return future

    def _read_loop(self, conn):
        """The reader thread of one connection: match answers to requests, answer heartbeats."""
        cause = None
        try:
            while True:
                frame_type, data = conn.read_frame()
                if frame_type == protocol_v2.FRAME_TYPE_RESPONSE and data == HEARTBEAT:
                    self.producer.heartbeats += 1
                    conn.send(b"NOP\n")
                    continue
                try:
                    future = conn.pending.popleft()
                except IndexError:
                    future = None
                if frame_type == protocol_v2.FRAME_TYPE_ERROR:
                    error = NSQError(data, conn.address)
                    if error.fatal:
                        # nsqd closes after a fatal error: later requests get a new connection.
                        cause = error
                        with self.lock:
                            if self.conn is conn:
                                self.conn = None
                    if future is None:
                        self.producer.log.conn("error", conn.address, "protocol error - %s", error)
                    elif error.code in _RETRY_CODES and self.producer._single is None:
                        self.producer._retry(future, self, error)
                    else:
                        future.set_exception(error)
                elif frame_type == protocol_v2.FRAME_TYPE_RESPONSE and future is not None:
                    future.set_result(data)
                else:
                    cause = "unexpected frame type %d %r" % (frame_type, data[:64])
                    if future is not None:
                        future.set_exception(ConnectionClosed(cause))
                    self.producer.log.conn("error", conn.address, "IO error - %s", cause)
                    return
        except (OSError, ValueError) as e:  # EOF (ConnectionClosed), reset, timeout, closed
            if cause is None:
                cause = str(e)  # (not the exception: its traceback holds this frame, a cycle)
            if self.conn is conn and not self.producer._closed:  # not our own close (close() unsets conn first)
                self.producer.log.conn("error", conn.address, "IO error - %s", error_words(e))
        finally:
            with self.lock:
                if self.conn is conn:
                    self.conn = None
                pending = list(conn.pending)
                conn.pending.clear()
            conn.close()
            retry = self.producer._single is None
            for future in pending:
                error = ConnectionClosed("connection to %s ended before the answer (%s)" % (format_address(conn.address), cause))
                if retry:
                    self.producer._retry(future, self, error)
                else:
                    future.set_exception(error)

    def pending(self):
        with self.lock:
            return list(self.conn.pending) if self.conn is not None else []

    def close(self):
        """Disconnect and join the reader threads (after the answers were waited for)."""
        with self.lock:
            conn, self.conn = self.conn, None
            threads, self.threads = self.threads, []
        if conn is not None:
            conn.shutdown()
        for thread in threads:
            thread.join()
        with self.lock:
            self.producer = None  # the reader threads that used it have ended


def _failed(future, node, error):
    """Record that ``node`` could not take ``future``'s request; returns the nodes tried so far.

    The error is kept as text: a raised one's traceback holds the frames that hold ``future``."""
    if future.tried is None:
        future.tried, future.errors = set(), []
    future.tried.add(node)
    future.errors.append(str(error))
    return future.tried


class Producer:
    """Publishes to one or several nsqd over pipelined connections; safe to share between threads.

    ``Producer(addresses=None, *, lookupd_http_addresses=None, timeout=10.0,
    identify=None, reconnect_backoff=(0.1, 5.0), lookupd_poll_interval=60.0, auth_secret=None)``:

    * ``addresses``: one nsqd (``"host:port"`` or ``(host, port)``) or a list of them;
    * ``lookupd_http_addresses``: nsqlookupd HTTP addresses whose ``/nodes`` add every
      registered nsqd (asked on first use, then again on the first use after
      ``lookupd_poll_interval`` seconds);
    * ``timeout`` bounds connecting and waiting for each answer; ``identify`` adds or
      overrides IDENTIFY fields (wire names and units); ``auth_secret`` is sent with
      ``AUTH`` after IDENTIFY when nsqd requires it;
    * ``tls_v1``, ``tls_options``, ``snappy``, ``deflate``, ``deflate_level``: TLS and
      compression (see :func:`~nsqd_threaded.client.connection.transport_options`);
    * ``logger`` and ``log_id``: where connection events go, in go-nsq's words, as for
      the :class:`~nsqd_threaded.client.Consumer` (connecting, a failed dial naming the
      address, an IO error, a request handed to another nsqd, each lookupd failure).

    Connections are made on first use (or by :meth:`connect`) and again on the next
    request after one ends.  **One nsqd**: a request in flight when its connection ends
    fails with ConnectionClosed (it may or may not have been published): nothing is
    retried behind your back.  **Several nsqd**: requests go round robin over the
    nodes; a request whose node fails (cannot connect, connection lost before the
    answer, or ``E_*PUB_FAILED``) is sent again to the next node, so it is published
    at least once, or the call raises ConnectionClosed when no node could take it.
    A node that failed is skipped for ``reconnect_backoff`` seconds (min, max,
    doubling; tried last meanwhile) and rejoins on the first use after that.
    A TimeoutError (no answer in time) is never retried: the node may have taken it.
    ``clock`` (a test's Broker, Lookupd or Cluster, or its ``clock``): that skip is counted on its clock.

    ``_lock`` guards ``_nodes``, ``_retired``, ``_next``, ``_next_poll`` and ``_closed``.
    """

    def __init__(
        self,
        addresses=None,
        *,
        lookupd_http_addresses=None,
        timeout=10.0,
        identify=None,
        reconnect_backoff=(0.1, 5.0),
        lookupd_poll_interval=60.0,
        auth_secret=None,
        tls_v1=False, tls_options=None, snappy=False, deflate=False, deflate_level=None,  # the transport: ConnectOptions
        logger=None,
        log_id=1,
        clock=None
    ):
        self.log = ClientLog(logger, log_id)
        self._clock = ClientClock(clock)  # how long a failed node is skipped: real time, or a test broker's clock
        direct = parse_addresses(addresses) if addresses else []
        self.lookupd_http_addresses = [parse_lookupd_address(a) for a in address_list(lookupd_http_addresses)]
        if not direct and not self.lookupd_http_addresses:
            raise ValueError("no nsqd address given (nor any lookupd_http_addresses)")
        self.addresses = direct
        self.address = direct[0] if direct else None
        self.timeout = timeout
        self.reconnect_backoff = reconnect_backoff
        self.lookupd_poll_interval = lookupd_poll_interval
        self._connect = ConnectOptions(timeout, identify, auth_secret, tls_v1, tls_options, snappy, deflate, deflate_level)
        self.auth_secret = auth_secret
        self._lock = threading.Lock()
        self._nodes = [_Node(self, a) for a in direct]
        self._retired = []  # nodes lookupd no longer lists: closed with the producer
        self._next = 0
        self._next_poll = 0.0
        self._closed = False
        # One nsqd given directly: requests go straight to it (no retry, no extra object per request).
        self._single = self._nodes[0] if len(direct) == 1 and not self.lookupd_http_addresses else None
        self.heartbeats = 0  # heartbeats answered (for tests and curiosity)

    def __repr__(self):
        where = [format_address(a) for a in self.addresses] + ["lookupd " + format_address(a) for a in self.lookupd_http_addresses]
        return "<Producer %s>" % ",".join(where)

    @property
    def nodes(self):
        """The nsqd addresses publishes are spread over."""
        with self._lock:
            return [n.address for n in self._nodes]

    @property
    def connected(self):
        """True while a connection is open (it may still turn out dead on the next request)."""
        with self._lock:
            nodes = list(self._nodes)
        return any(n.conn is not None for n in nodes)

    def connect(self):
        """Connect now to every node (otherwise the first request does); returns self.

        Raises the first failure when no node could be connected."""
        first = None
        nodes, _ = self._nodes_now(advance=False)
        for node in nodes:
            try:
                with node.lock:
                    node.connection()
            except (OSError, NSQError) as e:
                if first is None:
                    first = e
        try:
            if first is not None and not self.connected:
                raise first
        finally:
            first = None  # the raised error's traceback holds this frame: no cycle through it
        return self

    def __enter__(self):
        return self.connect()

    def __exit__(self, *exc):
        self.close()

    def _nodes_now(self, advance=True):
        """The node list (lookupd asked first when a poll is due) and the next round robin index
        (taken, unless not ``advance``)."""
        with self._lock:
            if self._closed:
                raise ConnectionClosed("producer is closed")
            poll = self.lookupd_http_addresses and time.monotonic() >= self._next_poll
            if poll:
                self._next_poll = time.monotonic() + self.lookupd_poll_interval
        if poll:
            self._poll_lookupd()
        with self._lock:
            nodes = self._nodes
            start = self._next % len(nodes) if nodes else 0
            if advance:
                self._next = start + 1
        return nodes, start

    def _candidates(self):
        """Every node, round robin from the next one: those not backing off first."""
        nodes, start = self._nodes_now()
        ordered = nodes[start:] + nodes[:start]
        now = time.monotonic()
        return [n for n in ordered if n.down_until <= now] + [n for n in ordered if n.down_until > now]

    def _poll_lookupd(self):
        found, errors = lookup_addresses(self.lookupd_http_addresses, "/nodes", self.timeout, log=self.log)
        if errors and not found:
            return  # keep what we know
        wanted = set(self.addresses) | set(found)
        with self._lock:
            known = {n.address: n for n in self._nodes}
            kept = [n for n in self._nodes if n.address in wanted]
            kept += [_Node(self, a) for a in self.addresses + found if a not in known and a in wanted]
            # dict: an address listed both directly and by lookupd is one node
            self._nodes = list({n.address: n for n in kept}.values())
            self._retired += [n for n in known.values() if n.address not in wanted]

    def _request(self, data):
        single = self._single
        if single is not None:
            return single.request(data)
        # Several nodes: the Future keeps the request so that a failed node hands it on.
        future = concurrent.futures.Future()
        future.data = data
        future.tried = None  # the nodes that failed it (a set, made on the first failure)
        future.errors = ()  # and why (a list, likewise)
        try:
            nodes, start = self._nodes_now()
        except ConnectionClosed as e:
            future.set_exception(e)
            return future
        if not nodes:
            self._dispatch(future)
            return future
        # The common case, kept cheap: the next node in turn is up and takes it.
        node = nodes[start]
        if node.down_until and node.down_until > self._clock.monotonic():
            self._dispatch(future)
            return future
        try:
            node.request(data, future)
        except (OSError, NSQError) as e:  # could not connect, or the connection just ended
            self._retry(future, node, e)
        return future

    def _retry(self, future, node, error):
        """``node`` failed ``future``'s request (it was not published there): try the next node."""
        _failed(future, node, error)
        self.log.conn("info", node.address, "%s; trying another nsqd", error_words(error))
        self._dispatch(future)

    def _dispatch(self, future):
        """Send ``future``'s request to the first node that has not failed it; ConnectionClosed if none is left."""
        try:
            nodes = self._candidates()
        except ConnectionClosed as e:
            future.set_exception(e)
            return
        tried = future.tried or ()
        for node in nodes:
            if node in tried:
                continue
            try:
                node.request(future.data, future)
                return
            except (OSError, NSQError) as e:
                tried = _failed(future, node, e)
        why = "; ".join(future.errors) or "no nsqd known"
        future.set_exception(ConnectionClosed("no nsqd could take the request (%s)" % why))

    def _wait(self, future, timeout):
        timeout = self.timeout if timeout is None else timeout
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            where = " at " + format_address(self._single.address) if self._single is not None else ""
            raise TimeoutError("no answer from nsqd%s within %gs" % (where, timeout)) from None
        finally:
            future = None  # the future's error, raised here, has this frame in its traceback: no cycle

    # -- commands --------------------------------------------------------------

    def pub_async(self, topic, body):
        """Send ``PUB``; a Future of the answer (``b"OK"``, or NSQError / ConnectionClosed).

        ``body`` is bytes (any bytes-like object) or a str, sent as UTF-8; anything else is a TypeError.
        """
        body = encode_body(body)
        return self._request(b"PUB %s\n%s%s" % (encode_name(topic, "topic"), protocol_v2.encode_size(len(body)), body))

    def mpub_async(self, topic, bodies):
        """Send ``MPUB`` of a list of bodies (each as :meth:`pub_async` takes it); a Future of the answer."""
        payload = protocol_v2.encode_mpub_body(encode_bodies(bodies))
        return self._request(b"MPUB %s\n%s%s" % (encode_name(topic, "topic"), protocol_v2.encode_size(len(payload)), payload))

    def dpub_async(self, topic, delay_ms, body):
        """Send ``DPUB`` (deliver after ``delay_ms`` milliseconds); a Future of the answer."""
        body = encode_body(body)
        line = b"DPUB %s %d\n" % (encode_name(topic, "topic"), delay_ms)
        return self._request(line + protocol_v2.encode_size(len(body)) + body)

    def pub(self, topic, body, timeout=None):
        """Publish one message; returns when nsqd said OK, raises NSQError if it refused."""
        self._wait(self.pub_async(topic, body), timeout)

    def mpub(self, topic, bodies, timeout=None):
        """Publish several messages atomically (one MPUB)."""
        self._wait(self.mpub_async(topic, bodies), timeout)

    def dpub(self, topic, delay_ms, body, timeout=None):
        """Publish one message, delivered after ``delay_ms`` milliseconds."""
        self._wait(self.dpub_async(topic, delay_ms, body), timeout)

    def close(self, timeout=None):
        """Wait (up to ``timeout``, default the producer's) for the answers in flight, then disconnect."""
        with self._lock:
            self._closed = True
            nodes = self._nodes + self._retired
        pending = [f for n in nodes for f in n.pending()]
        if pending:
            concurrent.futures.wait(pending, self.timeout if timeout is None else timeout)
        for node in nodes:
            node.close()
