"""A small synchronous NSQ client: :class:`Producer` and :class:`Consumer`.

Blocking sockets and threads, standard library only (no tornado, no asyncio), and
exact about the TCP protocol V2 (see ``tcp-protocol.md``):

* every connection sends the magic, then ``IDENTIFY`` (with feature negotiation, no
  TLS or compression), and answers each ``_heartbeat_`` with ``NOP``;
* the Producer pipelines ``PUB``/``MPUB``/``DPUB`` from any number of threads on one
  connection and matches each ``OK`` or error frame to its request in order (nsqd
  answers the commands of a connection in the order it reads them);
* the Consumer sends ``SUB`` then ``RDY <max_in_flight>`` (split over its
  connections), hands messages to a handler or an iterator, and ``FIN``/``REQ``/
  ``TOUCH`` them; it reconnects with exponential backoff and closes with ``CLS``.

Across a cluster, the Producer spreads requests over several nsqd (given, or listed
by nsqlookupd's ``/nodes``) and sends a request again to the next one when its node
fails; the Consumer finds the nsqd of its topic with nsqlookupd's ``/lookup`` and
re-splits ``max_in_flight`` so that idle connections keep ``RDY 1`` and busy ones
share the rest.

Errors from nsqd are :class:`NSQError` (``code``, ``description``, ``fatal``).  Only
``E_FIN_FAILED``, ``E_REQ_FAILED`` and ``E_TOUCH_FAILED`` are non-fatal; after any
other error nsqd closes the connection.  FIN, REQ and TOUCH have no answer on
success, so their failures arrive later and go to the Consumer's ``on_error``.

Durations on the wire (``delay_ms``, IDENTIFY fields) are in milliseconds as in the
protocol; client-side waits (``timeout``, ``reconnect_backoff``) are in seconds.
"""

import collections
import concurrent.futures
import http.client
import json
import logging
import queue
import socket
import threading
import time
import urllib.parse

from . import protocol
from .settings.options import VERSION

__all__ = ["Producer", "Consumer", "ReceivedMessage", "NSQError", "ConnectionClosed"]

log = logging.getLogger(__name__)

USER_AGENT = "nsqd_threaded.client/%s" % VERSION
HEARTBEAT = b"_heartbeat_"
DEFAULT_HEARTBEAT_MS = 30000  # nsqd's client_timeout / 2


class NSQError(Exception):
    """An error frame from nsqd: ``code`` (``E_BAD_TOPIC`` ...), ``description``, ``fatal``."""

    def __init__(self, data, address=None):
        text = data.decode("utf-8", "replace") if isinstance(data, (bytes, bytearray)) else str(data)
        super().__init__(text)
        self.code, _, self.description = text.partition(" ")
        self.fatal = self.code not in protocol.NON_FATAL_CODES
        self.address = address


class ConnectionClosed(ConnectionError):
    """The connection is closed or ended before the answer came."""


def parse_address(address):
    """``"host:port"``, ``"[v6]:port"`` or ``(host, port)`` -> ``(host, port)``."""
    if isinstance(address, str):
        host, sep, port = address.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError("invalid nsqd address %r (want host:port)" % address)
        return host.strip("[]") or "127.0.0.1", int(port)
    host, port = address[:2]
    return host, int(port)


def parse_addresses(addresses):
    """One address or a list of them -> a list of ``(host, port)``."""
    if _one_address(addresses):
        return [parse_address(addresses)]
    result = [parse_address(a) for a in addresses]
    if not result:
        raise ValueError("no nsqd address given")
    return result


def _one_address(addresses):
    """True for one address (``"host:port"``, ``(host, port)`` or ``[host, port]``), not a list of them."""
    return isinstance(addresses, str) or (
        isinstance(addresses, (tuple, list)) and len(addresses) == 2 and isinstance(addresses[1], int)
    )


def _as_list(addresses):
    """None, one address, or a list of them -> a list."""
    if not addresses:
        return []
    return [addresses] if _one_address(addresses) else list(addresses)


def _name(name, what):
    raw = name.encode("utf-8") if isinstance(name, str) else bytes(name)
    if b" " in raw or b"\n" in raw or b"\r" in raw:
        raise ValueError("%s name %r cannot contain a space or a line break" % (what, name))
    return raw


def _body(body):
    """A message body as bytes: bytes-like objects as they are, ``str`` as UTF-8.

    Anything else is a TypeError: ``bytes(5)`` would publish five NUL bytes.
    """
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    if isinstance(body, str):
        return body.encode("utf-8")
    raise TypeError("a message body must be bytes (or str, sent as UTF-8), not %s" % type(body).__name__)


def _bodies(bodies):
    """MPUB's bodies: a list (any iterable) of bodies, not one body."""
    if isinstance(bodies, (bytes, bytearray, memoryview, str)):
        raise TypeError("mpub takes a list of message bodies, not one %s" % type(bodies).__name__)
    return [_body(b) for b in bodies]


def _fmt(address):
    host, port = address
    return "[%s]:%d" % (host, port) if ":" in host else "%s:%d" % (host, port)


class Connection:
    """One protocol V2 connection: the handshake, framed reads, serialized writes.

    Reads happen on one thread at a time (the handshake, then the reader thread);
    writes from any thread, serialized by ``_write_lock``.
    """

    def __init__(self, address, timeout):
        self.address = address
        self.timeout = timeout
        self.settings = {}  # the IDENTIFY response
        self.closed = False
        self.close_wait = threading.Event()  # CLOSE_WAIT received (or the connection ended)
        self._write_lock = threading.Lock()
        self._idle_timeout = 2 * DEFAULT_HEARTBEAT_MS / 1000.0
        self._buf = bytearray()
        self._frames = collections.deque()
        try:
            self._sock = socket.create_connection(address, timeout)
        except socket.timeout:
            raise TimeoutError("connect to nsqd at %s timed out after %gs" % (_fmt(address), timeout)) from None
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def __repr__(self):
        return "<Connection %s%s>" % (_fmt(self.address), " closed" if self.closed else "")

    def send(self, data):
        try:
            with self._write_lock:
                if self.closed:
                    raise ConnectionClosed("connection to %s is closed" % _fmt(self.address))
                self._sock.sendall(data)
        except OSError as e:
            if isinstance(e, ConnectionClosed):
                raise
            self.shutdown()
            raise ConnectionClosed("connection to %s failed: %s" % (_fmt(self.address), e)) from None

    def read_frame(self):
        """The next ``(frame_type, data)``; raises ConnectionClosed at EOF, OSError on errors."""
        frames = self._frames
        while not frames:
            chunk = self._sock.recv(262144)
            if not chunk:
                raise ConnectionClosed("nsqd at %s closed the connection" % _fmt(self.address))
            self._buf += chunk
            try:
                parsed, used = protocol.split_frames(self._buf)
            except ValueError:  # a frame size below 4
                raise ConnectionClosed("malformed frame from %s" % _fmt(self.address)) from None
            if used:
                del self._buf[:used]
                frames.extend(parsed)
        return frames.popleft()

    def read_answer(self):
        """The next response or error frame during the handshake, answering heartbeats; errors raise."""
        try:
            while True:
                frame_type, data = self.read_frame()
                if frame_type == protocol.FRAME_TYPE_RESPONSE and data == HEARTBEAT:
                    self.send(b"NOP\n")
                    continue
                if frame_type == protocol.FRAME_TYPE_ERROR:
                    raise NSQError(data, self.address)
                if frame_type != protocol.FRAME_TYPE_RESPONSE:
                    raise ConnectionClosed("unexpected frame type %d from %s" % (frame_type, _fmt(self.address)))
                return data
        except socket.timeout:
            raise TimeoutError("no answer from nsqd at %s within %gs" % (_fmt(self.address), self.timeout)) from None

    def identify(self, fields):
        """Send the magic and IDENTIFY; keep the negotiated settings (the JSON answer)."""
        body = json.dumps(fields).encode()
        self.send(protocol.MAGIC_V2 + b"IDENTIFY\n" + protocol.encode_size(len(body)) + body)
        data = self.read_answer()
        if fields.get("feature_negotiation") and data != b"OK":
            self.settings = json.loads(data.decode("utf-8"))
        hb = fields.get("heartbeat_interval") or DEFAULT_HEARTBEAT_MS
        self._idle_timeout = 2 * hb / 1000.0 if hb > 0 else None

    def handshake_done(self):
        """From now on a read may wait 2 heartbeat intervals: nsqd sends one every interval,
        so a longer silence means the connection is dead."""
        self._sock.settimeout(self._idle_timeout)

    def shutdown(self):
        """Make the pending and future reads end (any thread)."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self):
        with self._write_lock:
            self.closed = True
        self.close_wait.set()
        self.shutdown()
        self._sock.close()


def _identify_fields(extra):
    fields = {
        "client_id": socket.gethostname().split(".")[0],
        "hostname": socket.gethostname(),
        "user_agent": USER_AGENT,
        "feature_negotiation": True,
    }
    fields.update(extra or {})
    return fields


# -- lookupd ---------------------------------------------------------------------

LOOKUPD_ACCEPT = "application/vnd.nsq; version=1.0"


def parse_lookupd_address(address):
    """``"host:port"``, ``"http://host:port"`` or ``(host, port)`` -> ``(host, port)``."""
    if isinstance(address, str):
        address = address.split("://", 1)[-1].rstrip("/")
    return parse_address(address)


def query_lookupd(address, path, timeout):
    """``GET path`` on one nsqlookupd (the v1 API, unwrapped JSON): ``(status, doc)``; OSError if unreachable."""
    host, port = address
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Accept": LOOKUPD_ACCEPT})
        resp = conn.getresponse()
        body = resp.read()
    except (OSError, http.client.HTTPException) as e:
        raise ConnectionError("nsqlookupd at %s: %s" % (_fmt(address), e)) from None
    finally:
        conn.close()
    try:
        return resp.status, json.loads(body.decode("utf-8"))
    except ValueError:
        raise ConnectionError("nsqlookupd at %s answered %d with no JSON" % (_fmt(address), resp.status)) from None


def producer_addresses(doc):
    """The ``broadcast_address:tcp_port`` of each producer of a ``/lookup`` or ``/nodes`` answer."""
    result = []
    for p in doc.get("producers") or ():
        try:
            result.append((str(p["broadcast_address"]).strip("[]"), int(p["tcp_port"])))
        except (KeyError, TypeError, ValueError):
            continue
    return result


def lookup_addresses(lookupds, path, timeout):
    """The union of the producers ``path`` lists on every lookupd, in a stable order.

    A 404 (``TOPIC_NOT_FOUND``) counts as an empty answer.  Returns ``(addresses,
    errors)``: the lookupds that could not be asked are in ``errors``.
    """
    found, errors = {}, []
    for lookupd in lookupds:
        try:
            status, doc = query_lookupd(lookupd, path, timeout)
        except OSError as e:
            errors.append(e)
            continue
        if status == 200:
            for address in producer_addresses(doc):
                found.setdefault(address, None)
        elif status != 404:
            errors.append(ConnectionError("nsqlookupd at %s answered %d %s" % (_fmt(lookupd), status, doc)))
    return sorted(found), errors


# -- Producer --------------------------------------------------------------------

# The node could not take the message (it is exiting, or its backend failed): safe to try another.
_RETRY_CODES = frozenset({"E_PUB_FAILED", "E_MPUB_FAILED", "E_DPUB_FAILED"})


class _Node:
    """One nsqd of a Producer: one pipelined connection, its reader thread, its back-off.

    ``lock`` guards ``conn``, ``threads``, ``down_until`` and ``backoff``, and is held
    while a request is written so that the connection's ``pending`` queue is in
    write order.
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
        if producer._closed:
            raise ConnectionClosed("producer is closed")
        conn = self.conn
        if conn is None:
            try:
                conn = Connection(self.address, producer.timeout)
                try:
                    conn.identify(producer._identify)
                except BaseException:
                    conn.close()
                    raise
            except (OSError, NSQError):
                high = producer.reconnect_backoff[1]
                self.down_until = time.monotonic() + self.backoff
                self.backoff = min(self.backoff * 2, high)
                raise
            self.backoff = producer.reconnect_backoff[0]
            self.down_until = 0.0
            conn.handshake_done()
            conn.pending = collections.deque()
            thread = threading.Thread(
                target=self._read_loop, args=(conn,), name="nsq-producer[%s]" % _fmt(self.address), daemon=True
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
                if frame_type == protocol.FRAME_TYPE_RESPONSE and data == HEARTBEAT:
                    self.producer.heartbeats += 1
                    conn.send(b"NOP\n")
                    continue
                try:
                    future = conn.pending.popleft()
                except IndexError:
                    future = None
                if frame_type == protocol.FRAME_TYPE_ERROR:
                    error = NSQError(data, conn.address)
                    if error.fatal:
                        # nsqd closes after a fatal error: later requests get a new connection.
                        cause = error
                        with self.lock:
                            if self.conn is conn:
                                self.conn = None
                    if future is None:
                        log.warning("%s: error without a request: %s", _fmt(conn.address), error)
                    elif error.code in _RETRY_CODES and self.producer._single is None:
                        self.producer._retry(future, self, error)
                    else:
                        future.set_exception(error)
                elif frame_type == protocol.FRAME_TYPE_RESPONSE and future is not None:
                    future.set_result(data)
                else:
                    cause = "unexpected frame type %d %r" % (frame_type, data[:64])
                    if future is not None:
                        future.set_exception(ConnectionClosed(cause))
                    log.error("%s: %s; closing", _fmt(conn.address), cause)
                    return
        except (OSError, ValueError) as e:  # EOF (ConnectionClosed), reset, timeout, closed
            if cause is None:
                cause = e
        finally:
            with self.lock:
                if self.conn is conn:
                    self.conn = None
                pending = list(conn.pending)
                conn.pending.clear()
            conn.close()
            retry = self.producer._single is None
            for future in pending:
                error = ConnectionClosed("connection to %s ended before the answer (%s)" % (_fmt(conn.address), cause))
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


class Producer:
    """Publishes to one or several nsqd over pipelined connections; safe to share between threads.

    ``Producer(addresses=None, *, lookupd_http_addresses=None, timeout=10.0,
    identify=None, reconnect_backoff=(0.1, 5.0), lookupd_poll_interval=60.0)``:

    * ``addresses``: one nsqd (``"host:port"`` or ``(host, port)``) or a list of them;
    * ``lookupd_http_addresses``: nsqlookupd HTTP addresses whose ``/nodes`` add every
      registered nsqd (asked on first use, then again on the first use after
      ``lookupd_poll_interval`` seconds);
    * ``timeout`` bounds connecting and waiting for each answer; ``identify`` adds or
      overrides IDENTIFY fields (wire names and units).

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
        lookupd_poll_interval=60.0
    ):
        direct = parse_addresses(addresses) if addresses else []
        self.lookupd_http_addresses = [parse_lookupd_address(a) for a in _as_list(lookupd_http_addresses)]
        if not direct and not self.lookupd_http_addresses:
            raise ValueError("no nsqd address given (nor any lookupd_http_addresses)")
        self.addresses = direct
        self.address = direct[0] if direct else None
        self.timeout = timeout
        self.reconnect_backoff = reconnect_backoff
        self.lookupd_poll_interval = lookupd_poll_interval
        self._identify = _identify_fields(identify)
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
        where = [_fmt(a) for a in self.addresses] + ["lookupd " + _fmt(a) for a in self.lookupd_http_addresses]
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
        errors = []
        nodes, _ = self._nodes_now(advance=False)
        for node in nodes:
            try:
                with node.lock:
                    node.connection()
            except (OSError, NSQError) as e:
                errors.append(e)
        if errors and not self.connected:
            raise errors[0]
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
        found, errors = lookup_addresses(self.lookupd_http_addresses, "/nodes", self.timeout)
        for error in errors:
            log.warning("%s: %s", self, error)
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
        if node.down_until and node.down_until > time.monotonic():
            self._dispatch(future)
            return future
        try:
            node.request(data, future)
        except (OSError, NSQError) as e:  # could not connect, or the connection just ended
            self._retry(future, node, e)
        return future

    def _retry(self, future, node, error):
        """``node`` failed ``future``'s request (it was not published there): try the next node."""
        if future.tried is None:
            future.tried, future.errors = set(), []
        future.tried.add(node)
        future.errors.append(error)
        log.info("%s: %s; trying another nsqd", _fmt(node.address), error)
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
                if future.tried is None:
                    future.tried, future.errors = set(), []
                future.tried.add(node)
                future.errors.append(e)
                tried = future.tried
        why = "; ".join(str(e) for e in getattr(future, "errors", ())) or "no nsqd known"
        future.set_exception(ConnectionClosed("no nsqd could take the request (%s)" % why))

    def _wait(self, future, timeout):
        timeout = self.timeout if timeout is None else timeout
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            where = " at " + _fmt(self._single.address) if self._single is not None else ""
            raise TimeoutError("no answer from nsqd%s within %gs" % (where, timeout)) from None

    # -- commands --------------------------------------------------------------

    def pub_async(self, topic, body):
        """Send ``PUB``; a Future of the answer (``b"OK"``, or NSQError / ConnectionClosed).

        ``body`` is bytes (any bytes-like object) or a str, sent as UTF-8; anything else is a TypeError.
        """
        body = _body(body)
        return self._request(b"PUB %s\n%s%s" % (_name(topic, "topic"), protocol.encode_size(len(body)), body))

    def mpub_async(self, topic, bodies):
        """Send ``MPUB`` of a list of bodies (each as :meth:`pub_async` takes it); a Future of the answer."""
        payload = protocol.encode_mpub_body(_bodies(bodies))
        return self._request(b"MPUB %s\n%s%s" % (_name(topic, "topic"), protocol.encode_size(len(payload)), payload))

    def dpub_async(self, topic, delay_ms, body):
        """Send ``DPUB`` (deliver after ``delay_ms`` milliseconds); a Future of the answer."""
        body = _body(body)
        line = b"DPUB %s %d\n" % (_name(topic, "topic"), delay_ms)
        return self._request(line + protocol.encode_size(len(body)) + body)

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


# -- Consumer --------------------------------------------------------------------


class ReceivedMessage:
    """A message a Consumer received: ``id`` (16 bytes), ``body``, ``timestamp`` (ns), ``attempts``.

    :meth:`fin`, :meth:`req` and :meth:`touch` write to the connection it came by.
    ``responded`` is set by fin/req; a handler's return value is applied only when
    the handler did not respond itself (nor called :meth:`enable_async`).
    """

    __slots__ = ("id", "body", "timestamp", "attempts", "responded", "connection", "_async")

    def __init__(self, data, connection):
        self.timestamp, self.attempts, self.id, self.body = protocol.decode_message(data)
        self.connection = connection
        self.responded = False
        self._async = False

    def __repr__(self):
        return "<ReceivedMessage %s attempts=%d %r>" % (self.id.decode("ascii", "replace"), self.attempts, self.body[:40])

    def fin(self):
        """``FIN``: done with it.  Raises ConnectionClosed if its connection ended."""
        self.responded = True
        self.connection.send(b"FIN %s\n" % self.id)

    def req(self, delay_ms=0):
        """``REQ``: deliver it again after ``delay_ms`` milliseconds (nsqd caps at --max-req-timeout)."""
        self.responded = True
        self.connection.send(b"REQ %s %d\n" % (self.id, delay_ms))

    def touch(self):
        """``TOUCH``: restart its msg_timeout."""
        self.connection.send(b"TOUCH %s\n" % self.id)

    def enable_async(self):
        """The handler will answer later (from another thread): no automatic FIN/REQ."""
        self._async = True


_STOP = object()


class Consumer:
    """Consumes ``topic``/``channel`` from one or more nsqd, with up to ``max_in_flight`` messages at once.

    ``Consumer(addresses, topic, channel, handler=None, *, max_in_flight=1, concurrency=1,
    identify=None, requeue_delay_ms=0, reconnect_backoff=(0.1, 5.0), timeout=10.0,
    on_error=None, lookupd_http_addresses=None, lookupd_poll_interval=60.0,
    rdy_redistribute_interval=5.0, low_rdy_idle_timeout=10.0)``

    * ``addresses``: nsqd TCP addresses (one or a list; may be None with lookupd).
    * ``lookupd_http_addresses``: nsqlookupd HTTP addresses, asked ``/lookup?topic=``
      at start and every ``lookupd_poll_interval`` seconds; the consumer connects to
      every producer they list (``broadcast_address:tcp_port``).  Such a connection is
      not re-made when it is lost: the next poll finds the node again if it is still
      registered.
    * With a ``handler``, ``concurrency`` threads call ``handler(message)``: a return of
      ``False`` or an exception sends ``REQ <id> <requeue_delay_ms>``, anything else ``FIN``
      (unless the handler answered itself or called ``message.enable_async()``).
    * Without, iterate (``for message in consumer``) or call :meth:`get`; answer each
      message with ``fin()``/``req()``.
    * ``max_in_flight`` is split over the connections (each gets at least 1) and capped
      at the ``max_rdy_count`` nsqd announces; it is sent as ``RDY`` right after ``SUB``.
      With several connections it is re-split every ``rdy_redistribute_interval``
      seconds: a connection that received nothing for ``low_rdy_idle_timeout`` seconds
      drops to ``RDY 1`` and the busy connections share the rest.  An idle connection
      that receives a message again is busy at the next re-split.
    * ``identify`` adds or overrides IDENTIFY fields (e.g. ``{"heartbeat_interval": 1000,
      "msg_timeout": 5000}``, in ms).
    * A lost connection to a given address is made again at once, then after
      ``reconnect_backoff`` seconds (min, max), doubling, until it works or the consumer
      is closed.
    * ``on_error(error)`` receives every NSQError that arrives on an established
      connection (e.g. the non-fatal E_FIN_FAILED), every failed reconnection and every
      failed lookupd query; by default they are logged.

    :meth:`start` (or ``with``) connects and subscribes; :meth:`close` sends ``CLS``,
    waits for ``CLOSE_WAIT``, requeues the messages nobody took, stops the handler
    threads and joins every thread.

    ``_lock`` (and the ``_changed`` condition on it) guards ``_conns``, ``_subscribed``,
    ``_known``, ``_readers``, ``_closing`` and each connection's ``rdy``.
    """

    def __init__(
        self,
        addresses,
        topic,
        channel,
        handler=None,
        *,
        max_in_flight=1,
        concurrency=1,
        identify=None,
        requeue_delay_ms=0,
        reconnect_backoff=(0.1, 5.0),
        timeout=10.0,
        on_error=None,
        lookupd_http_addresses=None,
        lookupd_poll_interval=60.0,
        rdy_redistribute_interval=5.0,
        low_rdy_idle_timeout=10.0
    ):
        self.lookupd_http_addresses = [parse_lookupd_address(a) for a in _as_list(lookupd_http_addresses)]
        if addresses or not self.lookupd_http_addresses:
            self.addresses = parse_addresses(addresses)
        else:
            self.addresses = []
        self.topic = topic
        self.channel = channel
        self._sub = b"SUB %s %s\n" % (_name(topic, "topic"), _name(channel, "channel"))
        if max_in_flight < 0:
            raise ValueError("max_in_flight must be >= 0")
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.handler = handler
        self.max_in_flight = max_in_flight
        self.concurrency = concurrency
        self.requeue_delay_ms = requeue_delay_ms
        self.reconnect_backoff = reconnect_backoff
        self.timeout = timeout
        self.on_error = on_error
        self.lookupd_poll_interval = lookupd_poll_interval
        self.rdy_redistribute_interval = rdy_redistribute_interval
        self.low_rdy_idle_timeout = low_rdy_idle_timeout
        self._identify = _identify_fields(identify)
        self._queue = queue.Queue()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._conns = set()
        self._subscribed = set()
        self._known = set()  # addresses with a connection thread
        self._closing = False
        self._started = False
        self._readers = []
        self._workers = []
        self._cluster = None  # the thread that polls lookupd and re-splits RDY
        self.heartbeats = 0  # heartbeats answered (for tests and curiosity)

    def __repr__(self):
        where = [_fmt(a) for a in self.addresses] + ["lookupd " + _fmt(a) for a in self.lookupd_http_addresses]
        return "<Consumer %s/%s %s>" % (self.topic, self.channel, ",".join(where))

    # -- lifecycle -------------------------------------------------------------

    def start(self, wait=True):
        """Connect to every address (and every node lookupd lists).  With ``wait``, return
        once each one is subscribed, or close and raise the first failure of a given
        address (NSQError, OSError, TimeoutError) or, when every lookupd failed, the
        first lookupd error."""
        with self._lock:
            if self._started:
                raise RuntimeError("consumer already started")
            self._started = True
        found = []
        if self.lookupd_http_addresses:
            found, errors = self._lookup()
            if errors and len(errors) == len(self.lookupd_http_addresses) and not self.addresses and wait:
                self.close()
                raise errors[0]
        firsts = []  # (outcome, must succeed)
        n = len(self.addresses) + len([a for a in found if a not in self.addresses])
        for i, address in enumerate(self.addresses):
            first = _Outcome() if wait else None
            firsts.append((first, True))
            self._spawn(address, self._share(i, n), first, True)
        for address in found:
            first = _Outcome() if wait else None
            if self._spawn(address, self._share(len(firsts), n), first, False):
                firsts.append((first, False))
        if self.handler is not None:
            for i in range(self.concurrency):
                worker = threading.Thread(
                    target=self._work, name="nsq-handler[%s/%s %d]" % (self.topic, self.channel, i), daemon=True
                )
                self._workers.append(worker)
                worker.start()
        if self.lookupd_http_addresses or len(self.addresses) > 1:
            self._cluster = threading.Thread(
                target=self._cluster_loop, name="nsq-consumer-rdy[%s/%s]" % (self.topic, self.channel), daemon=True
            )
            self._cluster.start()
        if wait:
            deadline = time.monotonic() + self.timeout
            for first, _ in firsts:
                first.wait(max(0.0, deadline - time.monotonic()))
            failure = next((f.error for f, required in firsts if required and f.error is not None), None)
            if failure is None and not all(f.is_set() for f, _ in firsts):
                failure = TimeoutError("not subscribed within %gs" % self.timeout)
            if failure is not None:
                self.close()
                raise failure
        return self

    def _share(self, i, n):
        """The ``i``-th of ``n`` connections' part of max_in_flight (at least 1, unless it is 0)."""
        if self.max_in_flight == 0:
            return 0
        n = max(n, 1)
        return max(1, self.max_in_flight // n + (1 if i < self.max_in_flight % n else 0))

    def _spawn(self, address, rdy, first, persistent):
        """Start the connection thread of ``address`` unless it has one; False if it had (or closing)."""
        with self._lock:
            if self._closing or address in self._known:
                return False
            self._known.add(address)
            thread = threading.Thread(
                target=self._run,
                args=(address, rdy, first, persistent),
                name="nsq-consumer[%s %s/%s]" % (_fmt(address), self.topic, self.channel),
                daemon=True,
            )
            self._readers = [t for t in self._readers if t.is_alive()]
            self._readers.append(thread)
            thread.start()
        return True

    def __enter__(self):
        if not self._started:
            self.start()
        return self

    def __exit__(self, *exc):
        self.close()

    def wait_subscribed(self, count=None, timeout=None):
        """Wait until ``count`` (default: all known addresses) connections are subscribed; False on timeout."""
        with self._changed:
            return self._changed.wait_for(
                lambda: len(self._subscribed) >= (len(self._known) if count is None else count),
                self.timeout if timeout is None else timeout,
            )

    @property
    def subscribed(self):
        """The addresses currently subscribed."""
        with self._lock:
            return sorted(c.address for c in self._subscribed)

    @property
    def rdy(self):
        """``{address: RDY count}`` of the subscribed connections (what was last sent)."""
        with self._lock:
            return {c.address: c.rdy for c in self._subscribed}

    def close(self, timeout=None):
        """``CLS`` every connection, wait for ``CLOSE_WAIT``, requeue what nobody took, stop everything.

        Waits at most ``timeout`` seconds (default: the consumer's) for each stage.
        """
        timeout = self.timeout if timeout is None else timeout
        with self._lock:
            already = self._closing
            self._closing = True
            conns = list(self._subscribed)
        self._stop.set()
        if not already:
            for conn in conns:
                try:
                    conn.send(b"CLS\n")
                except ConnectionClosed:
                    pass
            deadline = time.monotonic() + timeout
            for conn in conns:
                conn.close_wait.wait(max(0.0, deadline - time.monotonic()))
            self._requeue_queued()
            self._queue.put(_STOP)
        deadline = time.monotonic() + timeout
        me = threading.current_thread()
        for worker in self._workers:
            if worker is not me:
                worker.join(max(0.0, deadline - time.monotonic()))
        cluster = self._cluster
        if cluster is not None and cluster is not me:
            cluster.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            conns = list(self._conns)
            readers = list(self._readers)
        for conn in conns:
            conn.shutdown()
        for reader in readers:
            if reader is not me:
                reader.join(max(0.0, deadline - time.monotonic()))

    def _requeue_queued(self):
        while True:
            try:
                msg = self._queue.get_nowait()
            except queue.Empty:
                return
            if msg is _STOP or msg.connection.closed:
                continue
            try:
                msg.req(0)
            except ConnectionClosed:
                pass

    # -- messages --------------------------------------------------------------

    def _next(self, timeout):
        """The next message whose connection is still open; None once closed; queue.Empty on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            item = self._queue.get(timeout=remaining)
            if item is _STOP:
                self._queue.put(_STOP)  # for the other getters
                return None
            if item.connection.closed:
                continue  # nsqd took it back when that connection ended
            return item

    def get(self, timeout=None):
        """The next message (iterator mode).  TimeoutError after ``timeout`` seconds;
        ConnectionClosed once the consumer is closed."""
        if self.handler is not None:
            raise RuntimeError("this consumer has a handler")
        try:
            msg = self._next(timeout)
        except queue.Empty:
            raise TimeoutError("no message within %gs" % timeout) from None
        if msg is None:
            raise ConnectionClosed("consumer is closed")
        return msg

    def __iter__(self):
        if self.handler is not None:
            raise RuntimeError("this consumer has a handler")
        while True:
            msg = self._next(None)
            if msg is None:
                return
            yield msg

    def _work(self):
        """A handler thread."""
        while True:
            msg = self._next(None)
            if msg is None:
                return
            try:
                result = self.handler(msg)
            except Exception:
                log.exception("handler failed for %r; requeueing", msg)
                result = False
            if msg.responded or msg._async:
                continue
            try:
                if result is False:
                    msg.req(self.requeue_delay_ms)
                else:
                    msg.fin()
            except ConnectionClosed as e:
                log.info("cannot answer %r: %s", msg, e)

    # -- connections -----------------------------------------------------------

    def _report(self, error):
        if self.on_error is None:
            log.warning("%s: %s", self, error)
            return
        try:
            self.on_error(error)
        except Exception:
            log.exception("on_error failed")

    def _run(self, address, rdy, first, persistent):
        """The thread of one address: connect, subscribe, read; again after a loss, with backoff.

        A node found through lookupd (not ``persistent``) is given up after one failed
        attempt or one lost connection: the next lookupd poll brings it back if listed.
        """
        low, high = self.reconnect_backoff
        delay = low
        try:
            while not self._stop.is_set():
                try:
                    conn = self._subscribe(address, rdy)
                except (OSError, NSQError, ValueError) as e:  # ConnectionClosed and TimeoutError are OSErrors
                    if first is not None:
                        first.fail(e)
                        first = None
                    elif not self._stop.is_set():
                        self._report(e)
                    if not persistent or self._stop.wait(delay):
                        return
                    delay = min(delay * 2, high)
                    continue
                if first is not None:
                    first.set()
                    first = None
                fatal = self._read_loop(conn)
                if not persistent:
                    return
                if fatal:
                    # Ended by a fatal error: retrying at once could spin.
                    if self._stop.wait(delay):
                        return
                    delay = min(delay * 2, high)
                else:
                    delay = low
                rdy = conn.rdy  # what it had last
        finally:
            with self._changed:
                self._known.discard(address)
                self._changed.notify_all()

    def _subscribe(self, address, rdy):
        conn = Connection(address, self.timeout)
        with self._lock:
            if self._closing:
                conn.close()
                raise ConnectionClosed("consumer is closing")
            self._conns.add(conn)
        try:
            conn.identify(self._identify)
            conn.send(self._sub)
            answer = conn.read_answer()
            if answer != b"OK":
                raise ConnectionClosed("unexpected answer to SUB: %r" % answer[:64])
            max_rdy = conn.settings.get("max_rdy_count")
            conn.max_rdy = max_rdy if isinstance(max_rdy, int) else None
            if conn.max_rdy is not None and rdy > conn.max_rdy:
                rdy = conn.max_rdy
            conn.rdy = rdy
            conn.received = 0  # messages so far: the RDY re-split tells busy from idle by it
            conn.seen = (0, time.monotonic())  # (received, when it last changed), the re-split's
            conn.send(b"RDY %d\n" % rdy)
            conn.handshake_done()
        except BaseException:
            with self._lock:
                self._conns.discard(conn)
            conn.close()
            raise
        with self._changed:
            if self._closing:
                self._conns.discard(conn)
                conn.close()
                raise ConnectionClosed("consumer is closing")
            self._subscribed.add(conn)
            self._changed.notify_all()
        return conn

    def _read_loop(self, conn):
        """Read until the connection ends; True if it ended with a fatal error from nsqd."""
        put = self._queue.put
        try:
            while True:
                frame_type, data = conn.read_frame()
                if frame_type == protocol.FRAME_TYPE_MESSAGE:
                    conn.received += 1
                    put(ReceivedMessage(data, conn))
                elif frame_type == protocol.FRAME_TYPE_RESPONSE:
                    if data == HEARTBEAT:
                        self.heartbeats += 1
                        conn.send(b"NOP\n")
                    elif data == b"CLOSE_WAIT":
                        conn.close_wait.set()
                    else:
                        log.warning("%s: unexpected response %r", _fmt(conn.address), data[:64])
                elif frame_type == protocol.FRAME_TYPE_ERROR:
                    error = NSQError(data, conn.address)
                    self._report(error)
                    if error.fatal:
                        return True  # nsqd closes the connection
                else:
                    log.error("%s: unknown frame type %d; closing", _fmt(conn.address), frame_type)
                    return True
        except (OSError, ValueError) as e:
            if not self._stop.is_set():
                log.info("%s: connection lost (%s); reconnecting", _fmt(conn.address), e)
            return False
        finally:
            with self._changed:
                self._conns.discard(conn)
                self._subscribed.discard(conn)
                self._changed.notify_all()
            conn.close()

    # -- the cluster: lookupd polls and RDY re-splits -------------------------------

    def _lookup(self):
        """``(addresses, errors)`` of the topic's producers on every lookupd."""
        path = "/lookup?topic=" + urllib.parse.quote(self.topic, safe="")
        return lookup_addresses(self.lookupd_http_addresses, path, self.timeout)

    def _cluster_loop(self):
        """The ``nsq-consumer-rdy`` thread: re-split RDY every interval, poll lookupd every poll interval."""
        next_poll = time.monotonic() + self.lookupd_poll_interval
        while not self._stop.wait(self.rdy_redistribute_interval):
            now = time.monotonic()
            if self.lookupd_http_addresses and now >= next_poll:
                next_poll = now + self.lookupd_poll_interval
                found, errors = self._lookup()
                for error in errors:
                    self._report(error)
                with self._lock:
                    new = [a for a in found if a not in self._known]
                    n = len(self._known) + len(new)
                for address in new:
                    self._spawn(address, self._share(n - 1, n), None, False)
            try:
                self._redistribute(time.monotonic())
            except ConnectionClosed:
                pass  # that connection's reader notices and cleans up

    def _redistribute(self, now):
        """Send each subscribed connection its new RDY: idle ones 1, busy ones the rest, evenly.

        Like go-nsq's RDY redistribution, a connection is idle when it received no message for
        ``low_rdy_idle_timeout``; unlike it, an idle connection keeps RDY 1 rather than 0 so that
        it notices new work by itself.  Without any busy (or any idle) connection the budget is
        split evenly.
        """
        with self._lock:
            conns = sorted(self._subscribed, key=lambda c: c.address)
        if not conns:
            return
        idle, busy = [], []
        for conn in conns:
            received, since = conn.seen
            if conn.received != received:
                conn.seen = (conn.received, now)
                busy.append(conn)
            elif now - since >= self.low_rdy_idle_timeout:
                idle.append(conn)
            else:
                busy.append(conn)
        if self.max_in_flight == 0:
            targets = [(c, 0) for c in conns]
        elif not idle or not busy:
            targets = [(c, self._share(i, len(conns))) for i, c in enumerate(conns)]
        else:
            budget = max(self.max_in_flight - len(idle), len(busy))
            n = len(busy)
            targets = [(c, 1) for c in idle]
            targets += [(c, budget // n + (1 if i < budget % n else 0)) for i, c in enumerate(busy)]
        for conn, rdy in targets:
            if conn.max_rdy is not None and rdy > conn.max_rdy:
                rdy = conn.max_rdy
            with self._lock:
                if conn.rdy == rdy or conn not in self._subscribed:
                    continue
                conn.rdy = rdy
            log.debug("%s: RDY %d (%s)", _fmt(conn.address), rdy, "idle" if conn in idle else "busy")
            conn.send(b"RDY %d\n" % rdy)


class _Outcome(threading.Event):
    """The first connection attempt of one address: set when it ended; ``error`` if it failed."""

    error = None

    def fail(self, error):
        self.error = error
        self.set()
