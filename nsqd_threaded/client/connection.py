"""One connection to nsqd: the handshake, framing, heartbeats; errors and address parsing."""

import collections
import json
import socket
import threading

from .. import protocol
from ..gocompat import join_host_port, split_host_port
from ..settings.options import VERSION


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
        try:
            host, port = split_host_port(address)
        except ValueError:
            raise ValueError("invalid nsqd address %r (want host:port)" % address) from None
        return host or "127.0.0.1", port
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
    return join_host_port(*address)


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

    def auth(self, secret):
        """AUTH with ``secret`` after IDENTIFY, if nsqd's IDENTIFY answer says ``auth_required``.

        Keeps nsqd's answer (identity, identity_url, permission_count) in ``auth_info``.
        """
        if secret is None or not self.settings.get("auth_required"):
            return
        body = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
        self.send(b"AUTH\n" + protocol.encode_size(len(body)) + body)
        self.auth_info = json.loads(self.read_answer().decode("utf-8"))

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
