"""The stream layers of a V2 connection: TLS, deflate and snappy, used by nsqd and the client.

nsqd swaps a connection's reader and writer when IDENTIFY negotiates a
feature: TLS goes directly on the socket, a compressor on top of it.  Here
each layer is an object that turns bytes into bytes, and a
:class:`Transport` chains them in Go's order:

* inbound (connection thread): socket bytes -> TLS -> decompressor -> the
  command reader (:class:`~nsqd_threaded.server.protocol_v2.Reader`);
* outbound (under the client's write lock): a flush of the output buffer ->
  compressor -> TLS -> one ``sendall``.

The layers do no I/O; :func:`handshake` (the one function here that touches
a socket) drives a TLS handshake over a socket.  The package's own client
(:mod:`nsqd_threaded.client.connection`) uses the same layers client-side.

Every inbound layer decodes eagerly: all it can decode from what it was fed
comes out at once, except that inflate stops at DEFLATE_OUTPUT_LIMIT per
call and then says so (:meth:`Transport.pending`).  So the bytes waiting
above the socket are in the reader's own buffer or, after a large inflate,
in the decompressor that the reader drains before it would ``recv`` (and
maybe park with the idle watcher).

TLS uses :class:`ssl.SSLObject` over memory BIOs rather than an
:class:`ssl.SSLSocket`: the socket stays a plain blocking socket with kernel
timeouts (which the reader's deadlines and the idle watcher rely on), and the
two threads of a connection never call OpenSSL on the same object at once
(``Transport.tls_lock``).
"""

import select
import socket
import ssl
import time
import warnings
import zlib

from .codec.snappy import FrameDecoder, FrameEncoder, SnappyError


HANDSHAKE_TIMEOUT = 5.0  # seconds, as nsqd's UpgradeTLS deadline


class TransportError(Exception):
    """Undecodable input (corrupt compressed stream, TLS failure): the connection ends."""


class DeflateEncoder:
    """Raw deflate (no zlib header), sync-flushed at each flush as nsqd's flate writer."""

    def __init__(self, level):
        self._compressor = zlib.compressobj(level, zlib.DEFLATED, -15)

    def encode(self, data):
        c = self._compressor
        return c.compress(data) + c.flush(zlib.Z_SYNC_FLUSH)


# Output of one inflate call: a deflate stream expands up to ~1000 times, so
# one 256 KiB recv could otherwise become hundreds of MB at once.
DEFLATE_OUTPUT_LIMIT = 1 << 20


class DeflateDecoder:
    """Raw inflate, at most DEFLATE_OUTPUT_LIMIT bytes per call (:meth:`pending` says if more is due)."""

    def __init__(self):
        self._decompressor = zlib.decompressobj(-15)
        self._full = False  # the last call stopped at the limit

    def decode(self, data):
        d = self._decompressor
        tail = d.unconsumed_tail
        if tail:
            data = tail + bytes(data)
        try:
            out = d.decompress(data, DEFLATE_OUTPUT_LIMIT)
        except zlib.error as e:
            raise TransportError("flate: %s" % e) from None
        self._full = len(out) == DEFLATE_OUTPUT_LIMIT
        return out

    def pending(self):
        """True if input already received may decode to more (call decode(b"") before reading more)."""
        return self._full or bool(self._decompressor.unconsumed_tail)


class SnappyEncoder:
    """The snappy framing format; the stream identifier precedes the first chunk."""

    def __init__(self):
        self._encoder = FrameEncoder()

    def encode(self, data):
        return self._encoder.encode(bytes(data))


class SnappyDecoder:
    def __init__(self):
        self._decoder = FrameDecoder()

    def decode(self, data):
        try:
            return self._decoder.decode(bytes(data))
        except SnappyError as e:
            raise TransportError("snappy: %s" % e) from None


class TLSLayer:
    """One TLS session over memory BIOs (the caller moves the bytes).

    Not thread-safe: :class:`Transport` serializes its use with ``tls_lock``.
    """

    def __init__(self, context, server_side=True, server_hostname=None):
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.context = context
        self.ssl = context.wrap_bio(self.incoming, self.outgoing, server_side=server_side,
                                    server_hostname=server_hostname)

    def handshake_step(self, data):
        """Feed peer bytes; returns (done, bytes to send).  Raises ssl.SSLError on failure."""
        if data:
            self.incoming.write(data)
        try:
            self.ssl.do_handshake()
            done = True
        except ssl.SSLWantReadError:
            done = False
        return done, self.outgoing.read()

    def decrypt(self, data):
        """All the plaintext that ``data`` (and earlier partial records) complete."""
        if data:
            self.incoming.write(data)
        parts = []
        read = self.ssl.read
        try:
            while True:
                part = read(262144)
                if not part:  # close_notify: nothing more will come
                    break
                parts.append(part)
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLError as e:
            raise TransportError("tls: %s" % e) from None
        return b"".join(parts)

    def encrypt(self, data):
        """TLS records for ``data``, after any bytes the session has queued (in order)."""
        view = memoryview(data)
        write = self.ssl.write
        while view:
            n = write(view)
            view = view[n:]
        return self.outgoing.read()

    def pending_output(self):
        return self.outgoing.pending


class Transport:
    """A connection's layers: what the reader decodes with and the writer encodes with.

    ``tls_lock`` guards the TLS session (both BIOs and the SSLObject): the
    connection thread decrypts while the pump encrypts.  Outbound bytes are
    encoded under the client's write lock and then sent before it is
    released, so the encoders' stream state and the order on the wire agree.
    The decoders are the connection thread's alone.
    """

    def __init__(self):
        self.tls = None
        self.tls_lock = None
        self.compression = None  # "deflate" or "snappy"
        self._decompressor = None
        self._decoders = []
        self._encoders = []

    @property
    def active(self):
        return bool(self._decoders)

    def add_tls(self, layer, lock):
        self.tls = layer
        self.tls_lock = lock  # guards ``layer``
        self._decoders.append(self._decrypt)
        self._encoders.insert(0, self._encrypt)

    def add_compression(self, name, decoder, encoder):
        self.compression = name
        self._decompressor = decoder
        self._decoders.append(decoder.decode)
        self._encoders.insert(0, encoder.encode)

    def pending(self):
        """True if the decompressor holds input that decodes to more (see :meth:`drain`)."""
        d = self._decompressor
        return d is not None and hasattr(d, "pending") and d.pending()

    def drain(self):
        """More output from the input the decompressor holds (instead of reading the socket)."""
        return self._decompressor.decode(b"")

    def tls_state(self):
        """The /stats TLS fields (any thread)."""
        with self.tls_lock:
            return connection_state(self.tls.ssl, self.tls.context)

    def tls_common_name(self):
        """The client certificate's subject CN ("" without one): what the auth server gets."""
        with self.tls_lock:
            cert = self.tls.ssl.getpeercert() or {}
        for rdn in cert.get("subject", ()):
            for key, value in rdn:
                if key == "commonName":
                    return value
        return ""

    def decrypt_layer(self):
        """The TLS layer's decoder alone (for the bytes buffered when it was added)."""
        return self._decrypt

    def _decrypt(self, data):
        with self.tls_lock:
            return self.tls.decrypt(data)

    def _encrypt(self, data):
        with self.tls_lock:
            return self.tls.encrypt(data)

    def decoder(self):
        """One function: socket bytes -> command bytes (raises TransportError)."""
        decoders = list(self._decoders)
        if len(decoders) == 1:
            return decoders[0]

        def decode(data):
            for d in decoders:
                data = d(data)
                if not data:
                    break
            return data

        return decode

    def encoder(self):
        """One function: output bytes -> socket bytes (called under the write lock)."""
        encoders = list(self._encoders)
        if len(encoders) == 1:
            return encoders[0]

        def encode(data):
            for e in encoders:
                data = e(data)
            return data

        return encode


def handshake(sock, layer, data, deadline):
    """Drive ``layer``'s TLS handshake over ``sock`` until done or ``deadline`` (monotonic).

    ``data``: bytes of the peer's already received.  Raises ssl.SSLError,
    OSError, or TimeoutError at the deadline.
    """
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    while True:
        done, out = layer.handshake_step(data)
        if out:
            sock.sendall(out)
        if done:
            return
        data = b""
        while not data:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not poller.poll(remaining * 1000):
                raise TimeoutError("i/o timeout")
            try:
                data = sock.recv(65536)
            except (BlockingIOError, socket.timeout):
                continue
            if not data:
                raise ConnectionResetError("EOF")


def handshake_error(exc):
    """A handshake failure in a few words."""
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return "tls: %s" % exc.reason.lower().replace("_", " ")
    return str(exc) or type(exc).__name__


# -- TLS context and connection state ------------------------------------------

_TLS_VERSIONS = {
    0x0301: ssl.TLSVersion.TLSv1,
    0x0302: ssl.TLSVersion.TLSv1_1,
    0x0303: ssl.TLSVersion.TLSv1_2,
    0x0304: ssl.TLSVersion.TLSv1_3,
}


def server_context(opts):
    """nsqd's tls.Config as an SSLContext, or None without cert and key.

    Raises ValueError with nsqd's startup message when they cannot be loaded.
    """
    if not opts.tls_cert and not opts.tls_key:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(opts.tls_cert, opts.tls_key or None)
    except (OSError, ssl.SSLError) as e:
        raise ValueError("failed to build TLS config - %s" % e) from None
    minimum = _TLS_VERSIONS.get(opts.tls_min_version, ssl.TLSVersion.TLSv1)
    # TLS 1.0 and 1.1 stay subject to OpenSSL's own policy (its security
    # level usually refuses them): the floor is raised, never lowered.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # naming TLSv1/TLSv1_1 warns
        try:
            context.minimum_version = max(minimum, context.minimum_version)
        except (ValueError, ssl.SSLError):
            pass
    policy = opts.tls_client_auth_policy
    if policy in ("require", "require-verify"):
        # Go's "require" asks for any certificate without verifying it;
        # OpenSSL cannot ask without verifying, so both verify against
        # --tls-root-ca-file (or the system's roots without one).
        context.verify_mode = ssl.CERT_REQUIRED
        if opts.tls_root_ca_file:
            try:
                context.load_verify_locations(opts.tls_root_ca_file)
            except (OSError, ssl.SSLError) as e:
                raise ValueError("failed to build TLS config - %s" % e) from None
        else:
            context.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    return context


_VERSION_NAMES = {"TLSv1": "TLS1.0", "TLSv1.1": "TLS1.1", "TLSv1.2": "TLS1.2", "TLSv1.3": "TLS1.3"}

# Go's prettyConnectionState names, by IANA code; any other suite is "Unknown <n>".
_GO_CIPHER_NAMES = {
    0x0005: "TLS_RSA_WITH_RC4_128_SHA",
    0x000A: "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
    0x002F: "TLS_RSA_WITH_AES_128_CBC_SHA",
    0x0035: "TLS_RSA_WITH_AES_256_CBC_SHA",
    0xC007: "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA",
    0xC009: "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    0xC00A: "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    0xC011: "TLS_ECDHE_RSA_WITH_RC4_128_SHA",
    0xC012: "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
    0xC013: "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    0xC014: "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    0xC02F: "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    0xC02B: "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    0xC030: "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    0xC02C: "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
}


def _cipher_code(context, name):
    for c in context.get_ciphers():
        if c.get("name") == name:
            return c.get("id", 0) & 0xFFFF
    return _TLS13_CODES.get(name, 0)


_TLS13_CODES = {"TLS_AES_128_GCM_SHA256": 0x1301, "TLS_AES_256_GCM_SHA384": 0x1302,
                "TLS_CHACHA20_POLY1305_SHA256": 0x1303}


def connection_state(sslobj, context):
    """The /stats TLS fields of an established session, as nsqd names them."""
    cipher = sslobj.cipher()
    version = sslobj.version() or ""
    code = _cipher_code(context, cipher[0]) if cipher else 0
    suite = _GO_CIPHER_NAMES.get(code, "Unknown %d" % code)
    return {
        "tls_cipher_suite": suite,
        "tls_version": _VERSION_NAMES.get(version, "Unknown %s" % version),
        "tls_negotiated_protocol": sslobj.selected_alpn_protocol() or "",
        "tls_negotiated_protocol_is_mutual": True,
    }
