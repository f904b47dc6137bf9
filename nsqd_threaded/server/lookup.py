"""nsqd's side of nsqlookupd: one peer thread per ``--lookupd-tcp-address``.

Go nsqd runs one lookup loop that talks to every nsqlookupd in turn, so a
dead or slow one delays the others.  Here each configured lookupd gets its
own thread (``nsqd-lookup[host:port]``) and its own ``queue.Queue`` of V1
commands: creating or deleting a topic or channel only puts one encoded
command on each peer's queue (never blocks), and each peer sends them in
order and pings every 15 s.  A lookupd that refuses the connection or goes
away is dialled again after a short back-off (0.25 s, doubling, at most
1 s, jittered), and each connect IDENTIFYs and REGISTERs everything; Go
waits for the next PING instead.

The V1 commands are encoded by :mod:`~nsqd_threaded.wire.protocol_v1`.
"""

import json
import queue
import random
import socket
import threading
import time
import urllib.parse

from ..internal.dial import dial
from ..internal.gocompat import is_socket_path, join_host_port, split_host_port
from ..internal.httpclient import NSQ_V1_ACCEPT, request
from ..wire.protocol_v1 import (
    MAGIC_V1,
    PING,
    command_text,
    decode_response_size,
    encode_identify,
    parse_peer_info,
    registrations,
)

DIAL_TIMEOUT = 1.0  # seconds to connect to a lookupd
IO_TIMEOUT = 1.0  # read / write deadline of each call on a lookupd connection
PING_INTERVAL = 15.0  # Go's ticker; Options.lookupd_ping_interval (internal) overrides it for tests
RECONNECT_DELAY = 0.25  # the first wait before dialling a lookupd again; doubles up to RECONNECT_MAX
# The longest wait between dials. Kept short so that a lookupd back from a restart or a healed
# partition has this broker in /nodes within about DIAL_TIMEOUT + RECONNECT_MAX; a refused or
# timed-out dial costs one SYN, so a dial a second while a lookupd is away is cheap.
RECONNECT_MAX = 1.0
WATCH_INTERVAL = 1.0  # how often an idle connection is checked for a lookupd that closed it

_STOP = object()  # queue sentinel: the peer thread exits


# -- one lookupd ----------------------------------------------------------------------


class LookupPeer:
    """The connection to one nsqlookupd and the thread that owns it.

    Only the peer thread uses the socket.  ``_sock_lock`` guards the
    ``_sock`` reference so :meth:`stop` can shut a blocked read down from
    another thread.  ``info`` (the IDENTIFY reply's fields, or None) is
    replaced whole by the peer thread and read by topic creators.
    """

    def __init__(self, address, nsqd):
        self.address = address
        self._nsqd = nsqd
        self._log = nsqd.log
        self._queue = queue.Queue()  # encoded commands, then _STOP
        self._stopping = threading.Event()
        self._sock_lock = threading.Lock()  # guards _sock (the reference, not its I/O)
        self._sock = None
        self.info = None
        self._ping_interval = nsqd.options.lookupd_ping_interval
        self._max_body_size = nsqd.options.max_body_size
        self._thread = threading.Thread(target=self._run, name="nsqd-lookup[%s]" % address, daemon=True)

    def __repr__(self):
        return "LookupPeer(%s)" % self.address

    def start(self):
        self._thread.start()

    def send(self, cmd):
        """Queue an encoded command (never blocks)."""
        self._queue.put(cmd)

    def stop(self):
        """Ask the thread to exit, interrupting a blocked read; :meth:`join` waits for it."""
        self._stopping.set()
        self._queue.put(_STOP)
        with self._sock_lock:
            sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def join(self):
        self._thread.join()

    @property
    def http_address(self):
        """Where to query the lookupd's HTTP API, from the last IDENTIFY reply: ``broadcast_address:http_port``,
        or the unix socket it named (``http_socket``, which our lookupd sends a peer on its own unix socket
        when its HTTP API is on one too: it answers ``http_port`` -1); None when there is nowhere to ask."""
        info = self.info
        if info is None:
            return None
        socket_path = info["http_socket"]
        # Only from a lookupd reached over a unix socket (it is on this host) and only an absolute or
        # abstract name: a peer elsewhere cannot point this broker at a local socket.
        if socket_path and is_socket_path(self.address) and socket_path.startswith(("/", "@")) \
                and is_socket_path(socket_path):
            return socket_path
        if not info["broadcast_address"] or info["http_port"] < 0:
            return None
        return join_host_port(info["broadcast_address"], info["http_port"])

    # -- the peer thread ---------------------------------------------------------------

    def _run(self):
        """Connect, then send queued commands and a PING every interval, until stopped.

        While disconnected (refused, or the lookupd went away), the thread dials
        again after a short back-off (RECONNECT_DELAY, doubling, capped at
        RECONNECT_MAX or the ping interval if shorter, each wait drawn from its
        upper half so brokers restarted together do not dial in lockstep)
        instead of waiting for the next PING as Go does; queued
        commands are dropped meanwhile (the connect registers the state of that
        moment).  A connected but idle socket is checked every WATCH_INTERVAL for
        a lookupd that closed it, so a restarted lookupd is re-registered within
        seconds.
        """
        self._log.info("LOOKUP(%s): adding peer", self.address)
        next_ping = time.monotonic() + self._ping_interval
        first_delay = min(RECONNECT_DELAY, self._ping_interval)
        max_delay = min(RECONNECT_MAX, self._ping_interval)
        delay = first_delay
        next_dial = time.monotonic()
        while not self._stopping.is_set():
            now = time.monotonic()
            if self._sock is None and now >= next_dial:
                if self._connect():
                    delay = first_delay
                    next_ping = time.monotonic() + self._ping_interval
                    self._nsqd.lookupd_connected()
                else:
                    self._drop_pending()
                    next_dial = time.monotonic() + random.uniform(delay / 2, delay)
                    delay = min(delay * 2, max_delay)
                continue
            if self._sock is None:
                wake = next_dial
            else:
                wake = min(next_ping, now + WATCH_INTERVAL)
            try:
                cmd = self._queue.get(timeout=max(0.0, wake - now))
            except queue.Empty:
                if self._sock is None:
                    continue  # time to dial again
                now = time.monotonic()
                if now < next_ping:
                    if self._peer_closed():
                        self._log.error("LOOKUPD(%s): connection closed by the lookupd", self.address)
                        self._close()
                        next_dial = now  # at once, then with the back-off
                    continue
                while next_ping <= now:  # a ticker: missed ticks are dropped, never bunched
                    next_ping += self._ping_interval
                self._log.debug("LOOKUPD(%s): sending heartbeat", self.address)
                cmd = PING
            if cmd is _STOP:
                break
            if self._sock is None:
                continue  # moot: the next connect registers everything
            if cmd is not PING:  # a notification, logged as Go does: "topic REGISTER t", "channel ..."
                branch = "channel" if cmd.count(b" ") == 2 else "topic"
                self._log.info("LOOKUPD(%s): %s %s", self.address, branch, command_text(cmd))
            self._command(cmd)
            if self._sock is None:
                next_dial = time.monotonic()
        self._close()

    def _command(self, cmd):
        """Send ``cmd`` on the connection and read its response.

        As Go's lookupPeer.Command: a failure closes the connection and is
        logged; the command is not retried (the reconnect re-registers everything).
        """
        try:
            return self._roundtrip(cmd)
        except (OSError, ValueError) as e:
            self._log.error("LOOKUPD(%s): %s - %s", self.address, command_text(cmd), _error_text(e))
            self._close()
            return None

    def _peer_closed(self):
        """Whether the idle connection was closed by the lookupd (a V1 lookupd never
        speaks unasked: anything readable means the connection is over)."""
        sock = self._sock
        try:
            sock.settimeout(0.0)
            try:
                sock.recv(1, socket.MSG_PEEK)  # b"" (closed) or bytes nobody asked for
                return True
            finally:
                sock.settimeout(IO_TIMEOUT)
        except BlockingIOError:
            return False
        except OSError:
            return True

    def _connect(self):
        """Dial, send the magic, IDENTIFY, then REGISTER every topic and channel; False on failure."""
        if self._stopping.is_set():
            return False
        self._log.info("LOOKUP connecting to %s", self.address)
        try:
            if is_socket_path(self.address):  # a lookupd on a unix socket (beyond Go, whose nsqd dials TCP only)
                sock = dial(self.address, DIAL_TIMEOUT)
            else:
                sock = dial(split_host_port(self.address), DIAL_TIMEOUT)
        except (OSError, ValueError) as e:
            self._log.error("LOOKUPD(%s): %s", self.address, _error_text(e))
            return False
        sock.settimeout(IO_TIMEOUT)
        with self._sock_lock:
            self._sock = sock
        if self._stopping.is_set():  # stop() ran before _sock was visible to it
            self._close()
            return False
        identify = encode_identify(self._nsqd.lookupd_identity())
        try:
            sock.sendall(MAGIC_V1)
            resp = self._roundtrip(identify)
        except (OSError, ValueError) as e:
            self._log.error("LOOKUPD(%s): IDENTIFY - %s", self.address, _error_text(e))
            self._close()
            return False
        if resp == b"E_INVALID":
            self._log.info("LOOKUPD(%s): lookupd returned %s", self.address, resp.decode("utf-8", "replace"))
            self._close()
            return False
        try:
            info = parse_peer_info(resp)
        except ValueError:
            self._log.error("LOOKUPD(%s): parsing response - %s", self.address, resp.decode("utf-8", "replace"))
            self._close()
            return False
        self.info = info
        self._log.info(
            "LOOKUPD(%s): peer info {TCPPort:%d HTTPPort:%d Version:%s BroadcastAddress:%s}",
            self.address, info["tcp_port"], info["http_port"], info["version"], info["broadcast_address"],
        )
        if not info["broadcast_address"]:
            self._log.error("LOOKUPD(%s): no broadcast address", self.address)
        for cmd in registrations(self._nsqd.lookupd_registrations()):
            if self._stopping.is_set():
                self._close()
                return False
            self._log.info("LOOKUPD(%s): %s", self.address, command_text(cmd))
            try:
                self._roundtrip(cmd)
            except (OSError, ValueError) as e:
                self._log.error("LOOKUPD(%s): %s - %s", self.address, command_text(cmd), _error_text(e))
                self._close()
                return False
        return True

    def _roundtrip(self, cmd):
        sock = self._sock
        sock.sendall(cmd)
        size = decode_response_size(_recv_exactly(sock, 4), self._max_body_size)
        return _recv_exactly(sock, size)

    def _drop_pending(self):
        """After a failed connect, queued (UN)REGISTERs are moot: the next connect registers
        the state of that moment."""
        while True:
            try:
                cmd = self._queue.get_nowait()
            except queue.Empty:
                return
            if cmd is _STOP:
                self._queue.put(_STOP)
                return

    def _close(self):
        with self._sock_lock:
            sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()


def _recv_exactly(sock, n):
    chunks = []
    while n:
        chunk = sock.recv(min(n, 65536))
        if not chunk:
            raise LookupdClosed()
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


class LookupdClosed(OSError):
    """The lookupd closed the connection (Go reports ``EOF``)."""

    def __str__(self):
        return "EOF"


def _error_text(e):
    if isinstance(e, socket.timeout):
        return "i/o timeout"
    return str(e) or e.__class__.__name__


# -- all lookupds -----------------------------------------------------------------------


class LookupPeers:
    """The set of lookupd peers of one NSQD (Go's lookupLoop and its optsNotificationChan).

    ``_lock`` guards ``_peers`` changes and ``_closed``; new peers start under
    it, so :meth:`close` only ever sees started ones.  ``_peers`` is replaced
    whole (copy on write), so :meth:`notify` and the channel query read it
    without the lock.
    """

    def __init__(self, nsqd):
        self._nsqd = nsqd
        self._lock = threading.Lock()  # guards changes of _peers and _closed
        self._peers = ()  # LookupPeer, in address order of the configuration
        self._closed = False

    def set_addresses(self, addresses):
        """Keep peers still listed, stop and join the others, start new ones."""
        with self._lock:
            if self._closed:
                return
            wanted = list(dict.fromkeys(addresses))
            kept = {p.address: p for p in self._peers if p.address in wanted}
            removed = [p for p in self._peers if p.address not in kept]
            new = []
            peers = []
            for address in wanted:
                peer = kept.get(address)
                if peer is None:
                    peer = LookupPeer(address, self._nsqd)
                    new.append(peer)
                peers.append(peer)
            self._peers = tuple(peers)
            for peer in new:
                peer.start()
        for peer in removed:
            self._nsqd.log.info("LOOKUP(%s): removing peer", peer.address)
            peer.stop()
        for peer in removed:
            peer.join()

    def notify(self, cmd):
        """Queue an encoded (UN)REGISTER for every peer."""
        for peer in self._peers:
            peer.send(cmd)

    def http_addresses(self):
        """``broadcast_address:http_port`` of every peer that completed an IDENTIFY."""
        return [a for a in (p.http_address for p in self._peers) if a]

    def close(self):
        """Stop and join every peer thread (no UNREGISTER: lookupd drops us when the socket closes)."""
        with self._lock:
            self._closed = True
            peers, self._peers = self._peers, ()
        for peer in peers:
            peer.stop()
        for peer in peers:
            peer.join()
        if peers:
            self._nsqd.log.info("LOOKUP: closing")


# -- channel pre-creation query -----------------------------------------------------------


def query_topic_channels(addresses, topic, connect_timeout, request_timeout, thread_prefix="nsqd-lookup-query"):
    """Union of ``GET /channels?topic=`` over the lookupd HTTP ``addresses``, sorted.

    Returns ``(channels, errors)``; the queries run in parallel (one short
    thread each, joined here).
    """
    results = [None] * len(addresses)

    def one(i, address):
        try:
            results[i] = _get_channels(address, topic, connect_timeout, request_timeout)
        except Exception as e:  # any failure of one lookupd is reported, never raised
            results[i] = e

    threads = []
    for i, address in enumerate(addresses):
        if len(addresses) == 1:
            one(i, address)
            break
        t = threading.Thread(target=one, args=(i, address), name="%s[%s]" % (thread_prefix, address), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    channels, errors = set(), []
    for address, r in zip(addresses, results):
        if isinstance(r, Exception):
            errors.append("%s: %s" % (address, _error_text(r)))
        else:
            channels.update(r)
    return sorted(channels), errors


def _get_channels(address, topic, connect_timeout, request_timeout):
    # a unix socket path is dialed as one (request() ignores the port)
    host, port = (address, None) if is_socket_path(address) else split_host_port(address)
    # A zero timeout means none, as for Go's http.Client.
    deadline = time.monotonic() + request_timeout if request_timeout else None
    url = "/channels?topic=" + urllib.parse.quote_plus(topic)
    status, reason, body = request("GET", host, port, url, headers={"Accept": NSQ_V1_ACCEPT},
                                   connect_timeout=connect_timeout or None, deadline=deadline)
    if status != 200:
        raise ValueError("got response %d %s querying http://%s%s" % (status, reason, address, url))
    doc = json.loads(body.decode("utf-8"))
    channels = doc.get("channels") if isinstance(doc, dict) else None
    if channels is None:  # a lookupd answering without the V1 Accept header: {"data": {...}}
        channels = ((doc.get("data") or {}) if isinstance(doc, dict) else {}).get("channels")
    if not isinstance(channels, list):
        raise ValueError("bad /channels response from %s" % address)
    return [c for c in channels if isinstance(c, str)]
