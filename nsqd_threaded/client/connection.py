"""One connection to nsqd: the handshake, framing, heartbeats; errors and address parsing."""

import collections
import json
import socket
import ssl
import struct
import threading
import time

from ..wire import protocol_v2
from ..wire import transport
from ..internal.dial import dial, kernel_timeouts, nodelay
from ..internal.gocompat import is_socket_path, join_host_port, split_host_port
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
        self.fatal = self.code not in protocol_v2.NON_FATAL_CODES
        self.address = address


def os_error_words(exc):
    """An OSError as Go says one: the OS's words, lower case (``connection reset by peer``), with no
    ``[Errno 104]``; anything else as its text."""
    if isinstance(exc, OSError) and exc.strerror and exc.filename is None:
        text = str(exc.strerror)
        return text[:1].lower() + text[1:] if text[:1].isupper() and text[1:2].islower() else text
    return " ".join(str(exc).split()) or type(exc).__name__


class ConnectionClosed(ConnectionError):
    """The connection is closed or ended before the answer came."""


class EndOfStream(ConnectionClosed):
    """nsqd closed the connection (Go's ``io.EOF``): the read found no more bytes."""


def parse_address(address):
    """``"host:port"``, ``"[v6]:port"`` or ``(host, port)`` -> ``(host, port)``; a unix socket
    path (a str starting with ``/``, ``./`` or ``../``) is returned as it is."""
    if is_socket_path(address):
        return address
    if isinstance(address, str):
        try:
            host, port = split_host_port(address)
        except ValueError:
            raise ValueError("invalid nsqd address %r (want host:port)" % address) from None
        return host or "127.0.0.1", port
    host, port = address[:2]
    return host, int(port)


def parse_addresses(addresses):
    """One address or a list of them -> a list of ``(host, port)`` (or socket paths)."""
    if is_one_address(addresses):
        return [parse_address(addresses)]
    result = [parse_address(a) for a in addresses]
    if not result:
        raise ValueError("no nsqd address given")
    return result


def is_one_address(addresses):
    """True for one address (``"host:port"``, ``(host, port)`` or ``[host, port]``), not a list of them."""
    return isinstance(addresses, str) or (
        isinstance(addresses, (tuple, list)) and len(addresses) == 2 and isinstance(addresses[1], int)
    )


def address_list(addresses):
    """None, one address, or a list of them -> a list."""
    if not addresses:
        return []
    return [addresses] if is_one_address(addresses) else list(addresses)


def encode_name(name, what):
    """A topic or channel name as the bytes of a command line; ValueError when it would break the line."""
    raw = name.encode("utf-8") if isinstance(name, str) else bytes(name)
    if b" " in raw or b"\n" in raw or b"\r" in raw:
        raise ValueError("%s name %r cannot contain a space or a line break" % (what, name))
    return raw


def encode_body(body):
    """A message body as bytes: bytes-like objects as they are, ``str`` as UTF-8.

    Anything else is a TypeError: ``bytes(5)`` would publish five NUL bytes.
    """
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    if isinstance(body, str):
        return body.encode("utf-8")
    raise TypeError("a message body must be bytes (or str, sent as UTF-8), not %s" % type(body).__name__)


def encode_bodies(bodies):
    """MPUB's bodies: a list (any iterable) of bodies, not one body."""
    if isinstance(bodies, (bytes, bytearray, memoryview, str)):
        raise TypeError("mpub takes a list of message bodies, not one %s" % type(bodies).__name__)
    return [encode_body(b) for b in bodies]


def format_address(address):
    """``(host, port)`` -> ``"host:port"`` (``"[v6]:port"``), for messages and thread names; a path stays itself."""
    if isinstance(address, str):
        return address
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
        # TLS/compression layers once IDENTIFY negotiated them (see nsqd_threaded.wire.transport)
        self._transport = None
        self._encode = None  # guarded by _write_lock
        # bytes post() left for the thread holding _write_lock (a deque: its appends and pops are atomic)
        self._posted = collections.deque()
        self._decode = None  # the reading thread's
        try:
            self._sock = dial(address, timeout)
        except socket.timeout:
            raise TimeoutError("connect to nsqd at %s timed out after %gs" % (format_address(address), timeout)) from None
        nodelay(self._sock)

    def __repr__(self):
        return "<Connection %s%s>" % (format_address(self.address), " closed" if self.closed else "")

    def send(self, data):
        """Write ``data`` (after whatever :meth:`post` left queued); ConnectionClosed if it cannot."""
        with self._write_lock:
            self._write_locked(data)
        if self._posted:
            self._flush_posted()

    def post(self, data):
        """Write ``data`` now, or leave it to the thread writing at this moment; ConnectionClosed if closed.

        For the answers to messages (FIN, REQ, TOUCH), which many handler threads
        send at once: rather than each waiting its turn for the write lock (and
        for the GIL on every hand-over), a thread that finds the lock taken queues
        its bytes, and the writer sends them with its own before it lets go.  The
        bytes of one thread keep their order.  A write that fails is raised to
        the thread that was writing; nsqd gives the messages of a lost
        connection to another consumer anyway.
        """
        if self.closed:
            raise ConnectionClosed("connection to %s is closed" % format_address(self.address))
        self._posted.append(data)
        self._flush_posted()

    def _flush_posted(self):
        # A poster appends before it tries the lock, and a writer looks at the queue
        # after it lets go of the lock: so one of them always sends what was queued.
        posted = self._posted
        while posted:
            if not self._write_lock.acquire(blocking=False):
                return  # the writer sends it
            try:
                self._write_locked(b"")
            finally:
                self._write_lock.release()

    def _write_locked(self, data):
        """With ``_write_lock`` held: write what was posted, then ``data``."""
        try:
            if self.closed:
                raise ConnectionClosed("connection to %s is closed" % format_address(self.address))
            posted = self._posted
            if posted:
                chunks = []
                try:
                    while True:
                        chunks.append(posted.popleft())
                except IndexError:
                    pass
                chunks.append(data)
                data = b"".join(chunks)
            if not data:
                return
            if self._encode is not None:
                data = self._encode(data)
            self._sock.sendall(data)
        except OSError as e:
            if isinstance(e, ConnectionClosed):
                raise
            words = "timed out" if isinstance(e, BlockingIOError) else os_error_words(e)  # (SO_SNDTIMEO ran out)
            self.shutdown()
            raise ConnectionClosed("connection to %s failed: %s" % (format_address(self.address), words)) from None

    def read_frame(self):
        """The next ``(frame_type, data)``; raises ConnectionClosed at EOF, OSError on errors."""
        frames = self._frames
        while not frames:
            self._recv()
            try:
                parsed, used = protocol_v2.split_frames(self._buf)
            except ValueError:  # a frame size below 4
                raise ConnectionClosed("malformed frame from %s" % format_address(self.address)) from None
            if used:
                del self._buf[:used]
                frames.extend(parsed)
        return frames.popleft()

    def _recv(self):
        """One recv into the buffer, decoded by the negotiated layers."""
        layers = self._transport
        if layers is not None and layers.pending():
            self._buf += layers.drain()  # a large inflate stopped at its limit
            return
        try:
            chunk = self._sock.recv(262144)
        except BlockingIOError:  # SO_RCVTIMEO ran out (kernel_timeouts)
            raise socket.timeout("timed out") from None
        if not chunk:
            raise EndOfStream("nsqd at %s closed the connection" % format_address(self.address))
        if self._decode is not None:
            try:
                chunk = self._decode(chunk)
            except transport.TransportError as e:
                raise ConnectionClosed("corrupt stream from %s: %s" % (format_address(self.address), e)) from None
        self._buf += chunk

    def _read_one_frame(self):
        """The next frame, leaving the bytes after it undecoded in the buffer (before an upgrade)."""
        while True:
            buf = self._buf
            if len(buf) >= 4:
                size = struct.unpack(">l", bytes(buf[:4]))[0]
                if size < 4:
                    raise ConnectionClosed("malformed frame from %s" % format_address(self.address))
                if len(buf) >= 4 + size:
                    frame_type = struct.unpack(">l", bytes(buf[4:8]))[0]
                    data = bytes(buf[8 : 4 + size])
                    del buf[: 4 + size]
                    return frame_type, data
            self._recv()

    def _read_upgrade_answer(self):
        """The answer to IDENTIFY or to an upgrade, read one frame at a time: what follows may need the next layer."""
        try:
            frame_type, data = self._read_one_frame()
        except socket.timeout:
            raise TimeoutError("no answer from nsqd at %s within %gs" % (format_address(self.address), self.timeout)) from None
        if frame_type == protocol_v2.FRAME_TYPE_ERROR:
            raise NSQError(data, self.address)
        if frame_type != protocol_v2.FRAME_TYPE_RESPONSE:
            raise ConnectionClosed("unexpected frame type %d from %s" % (frame_type, format_address(self.address)))
        return data

    def read_answer(self):
        """The next response or error frame during the handshake, answering heartbeats; errors raise."""
        try:
            while True:
                frame_type, data = self.read_frame()
                if frame_type == protocol_v2.FRAME_TYPE_RESPONSE and data == HEARTBEAT:
                    self.send(b"NOP\n")
                    continue
                if frame_type == protocol_v2.FRAME_TYPE_ERROR:
                    raise NSQError(data, self.address)
                if frame_type != protocol_v2.FRAME_TYPE_RESPONSE:
                    raise ConnectionClosed("unexpected frame type %d from %s" % (frame_type, format_address(self.address)))
                return data
        except socket.timeout:
            raise TimeoutError("no answer from nsqd at %s within %gs" % (format_address(self.address), self.timeout)) from None

    def identify(self, fields, tls_context=None):
        """Send the magic and IDENTIFY; keep the negotiated settings (the JSON answer).

        Then the upgrades nsqd agreed to, in its order: TLS (with
        ``tls_context``), then snappy or deflate, each confirmed by an OK.
        """
        body = json.dumps(fields).encode()
        self.send(protocol_v2.MAGIC_V2 + b"IDENTIFY\n" + protocol_v2.encode_size(len(body)) + body)
        data = self._read_upgrade_answer()
        if fields.get("feature_negotiation") and data != b"OK":
            self.settings = json.loads(data.decode("utf-8"))
            self._upgrade(self.settings, tls_context)
        hb = fields.get("heartbeat_interval") or DEFAULT_HEARTBEAT_MS
        self._idle_timeout = 2 * hb / 1000.0 if hb > 0 else None

    def handshake(self, fields, tls_context=None, auth_secret=None):
        """What a Producer's or Consumer's connection does first: IDENTIFY (with the
        upgrades nsqd agrees to), then AUTH when nsqd requires it."""
        self.identify(fields, tls_context)
        self.auth(auth_secret)

    def auth(self, secret):
        """AUTH with ``secret`` after IDENTIFY, if nsqd's IDENTIFY answer says ``auth_required``.

        Keeps nsqd's answer (identity, identity_url, permission_count) in ``auth_info``.
        """
        if secret is None or not self.settings.get("auth_required"):
            return
        body = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
        self.send(b"AUTH\n" + protocol_v2.encode_size(len(body)) + body)
        self.auth_info = json.loads(self.read_answer().decode("utf-8"))

    def _upgrade(self, settings, tls_context):
        layers = transport.Transport()
        if settings.get("tls_v1"):
            context = tls_context or ssl.create_default_context()
            host = self.address[0] if context.check_hostname and not isinstance(self.address, str) else None
            layer = transport.TLSLayer(context, server_side=False, server_hostname=host)
            early = bytes(self._buf)
            del self._buf[:]
            try:
                transport.handshake(self._sock, layer, early, time.monotonic() + self.timeout)
            except (ssl.SSLError, TimeoutError) as e:
                raise ConnectionClosed("TLS with nsqd at %s failed: %s" % (format_address(self.address), e)) from None
            layers.add_tls(layer, threading.Lock())
            self._install(layers, layers.decrypt_layer())
            self._expect_ok()
        if settings.get("snappy") or settings.get("deflate"):
            if settings.get("snappy"):
                decoder, encoder = transport.SnappyDecoder(), transport.SnappyEncoder()
                layers.add_compression("snappy", decoder, encoder)
            else:
                decoder = transport.DeflateDecoder()
                encoder = transport.DeflateEncoder(settings.get("deflate_level") or 6)
                layers.add_compression("deflate", decoder, encoder)
            self._install(layers, decoder.decode)
            self._expect_ok()

    def _install(self, layers, new_decode):
        """Read and write through ``layers``; the bytes already buffered go through the new layer."""
        with self._write_lock:
            self._transport = layers
            self._encode = layers.encoder()
        self._decode = layers.decoder()
        try:
            rest = new_decode(bytes(self._buf))
        except transport.TransportError as e:
            raise ConnectionClosed("corrupt stream from %s: %s" % (format_address(self.address), e)) from None
        self._buf = bytearray(rest)

    def _expect_ok(self):
        data = self._read_upgrade_answer()
        if data != b"OK":
            raise ConnectionClosed("unexpected answer to an upgrade from %s: %r" % (format_address(self.address), data[:64]))

    @property
    def tls(self):
        return self._transport is not None and self._transport.tls is not None

    @property
    def compression(self):
        """"snappy", "deflate" or None."""
        return self._transport.compression if self._transport is not None else None

    def handshake_done(self):
        """From now on a read may wait 2 heartbeat intervals: nsqd sends one every interval,
        so a longer silence means the connection is dead.  The kernel bounds each recv and
        send (no poll() before each, as a Python socket timeout would make)."""
        kernel_timeouts(self._sock, self._idle_timeout)

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


class ConnectOptions:
    """How a Producer or a Consumer connects to nsqd, decided in one place for both.

    ``ConnectOptions(timeout=10.0, identify=None, auth_secret=None, tls_v1=False,
    tls_options=None, snappy=False, deflate=False, deflate_level=None)`` takes their
    common keywords: ``identify`` adds to this client's IDENTIFY fields
    (:func:`identify_fields`), the transport keywords are those of
    :func:`transport_options` (a bad combination raises ValueError here, before any
    connection), ``auth_secret`` is sent with AUTH when nsqd requires it.  Immutable
    after construction, so the connection threads share it without a lock.
    """

    __slots__ = ("timeout", "identify", "tls_context", "auth_secret")

    def __init__(self, timeout=10.0, identify=None, auth_secret=None, tls_v1=False, tls_options=None,
                 snappy=False, deflate=False, deflate_level=None):
        features, self.tls_context = transport_options(tls_v1, tls_options, snappy, deflate, deflate_level)
        self.identify = identify_fields(identify, features)
        self.timeout = timeout
        self.auth_secret = auth_secret

    def open(self, address):
        """A new :class:`Connection` to ``address``: connected, nothing sent yet."""
        return Connection(address, self.timeout)

    def handshake(self, conn):
        """IDENTIFY on ``conn`` with the upgrades nsqd agrees to, then AUTH if nsqd requires it."""
        conn.handshake(self.identify, self.tls_context, self.auth_secret)


def identify_fields(extra, features=None):
    """The IDENTIFY body: this client's defaults, then the transport ``features``, then the caller's ``extra``."""
    fields = {
        "client_id": socket.gethostname().split(".")[0],
        "hostname": socket.gethostname(),
        "user_agent": USER_AGENT,
        "feature_negotiation": True,
    }
    fields.update(features or {})
    fields.update(extra or {})
    return fields


def transport_options(tls_v1=False, tls_options=None, snappy=False, deflate=False, deflate_level=None):
    """Producer/Consumer transport keywords -> (IDENTIFY fields, SSLContext or None).

    ``tls_v1``: True, or an :class:`ssl.SSLContext` to use.  ``tls_options``
    (with ``tls_v1=True``): ``ca_certs`` (CA file to verify nsqd with),
    ``certfile``/``keyfile`` (a client certificate), ``check_hostname``
    (default True).  ``snappy`` or ``deflate`` (with ``deflate_level`` 1-9)
    asks for compression; nsqd decides (its answer is the connection's
    ``settings``).
    """
    fields = {}
    context = None
    if tls_v1:
        fields["tls_v1"] = True
        if isinstance(tls_v1, ssl.SSLContext):
            context = tls_v1
        else:
            opts = dict(tls_options or {})
            context = ssl.create_default_context(cafile=opts.pop("ca_certs", None))
            certfile = opts.pop("certfile", None)
            if certfile:
                context.load_cert_chain(certfile, opts.pop("keyfile", None))
            opts.pop("keyfile", None)
            context.check_hostname = opts.pop("check_hostname", True)
            if opts:
                raise ValueError("unknown tls_options: %s" % ", ".join(sorted(opts)))
    if snappy and deflate:
        raise ValueError("snappy and deflate cannot both be asked for")
    if snappy:
        fields["snappy"] = True
    if deflate:
        fields["deflate"] = True
        if deflate_level is not None:
            fields["deflate_level"] = deflate_level
    return fields, context
