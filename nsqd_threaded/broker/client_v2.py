"""Client: one TCP connection's state, its output, and its message pump.

Each connection has two threads, as each nsqd connection has two goroutines:

* the connection thread (owned by the TCP server) reads and executes
  commands (:mod:`nsqd_threaded.server.protocol_v2`), and
* the pump thread (owned by the connection thread, which joins it) sends
  heartbeats and, once subscribed, takes batches of messages from the channel
  and writes them out.

Frames from both threads go through :meth:`Client.send`, serialized by
``_write_lock``.  A pump batch is written with one ``sendall``.
"""

import socket
import threading
import time

from .. import gocompat, protocol

STATE_INIT = 0
STATE_SUBSCRIBED = 3
STATE_CLOSING = 4

DELIVERY_BATCH = 512  # messages a pump takes from its channel per lock acquisition


class Client:
    """A connected client; as a subscriber, the :class:`~nsqd_threaded.broker.channel.Consumer` of its channel.

    Its state changes through verbs (:meth:`identify`, :meth:`subscribe`,
    :meth:`set_ready`, :meth:`start_close`, :meth:`count_published`) called by
    the connection thread; the delivery counters are the channel's to change.

    Locks:
    * ``_lock`` guards ``_woken`` and ``_closing``; ``_wakeup`` (a Condition on
      it) signals the pump that something changed: RDY, in-flight count,
      messages available, heartbeat settings, or shutdown.
    * ``_write_lock`` serializes writes to the socket.
    * ``in_flight_count``, ``blocked`` and the delivery counters are guarded by
      the subscribed channel's lock (every change happens in a Channel method).
    """

    def __init__(self, client_id, sock, address, nsqd):
        self.id = client_id
        self._sock = sock
        self._nsqd = nsqd
        opts = nsqd.options
        self.remote_address = "%s:%s" % address[:2] if isinstance(address, tuple) else str(address)
        self.client_id = address[0] if isinstance(address, tuple) else ""
        self.hostname = self.client_id
        self.user_agent = ""
        self.topology_region = ""
        self.topology_zone = ""
        self.state = STATE_INIT
        self.connect_time = time.time()
        self.channel = None
        self.topic_name = None

        # settings (IDENTIFY may change them)
        self.heartbeat_interval = opts.client_timeout / 2
        self.msg_timeout_ns = gocompat.ns(opts.msg_timeout)
        self.output_buffer_size = 16384
        self.output_buffer_timeout = opts.output_buffer_timeout
        self.sample_rate = 0
        self.feature_negotiation = False

        # flow control
        self.ready_count = 0
        self.wake_at = 1  # pump is woken when this many RDY slots are free again
        self.in_flight_count = 0
        self.blocked = False

        # counters
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.pub_counts = {}

        # AUTH: the secret and the auth server's answer (an immutable
        # AuthState, replaced whole by the connection thread; /stats reads it).
        self.auth_secret = None
        self.auth_state = None

        self._lock = threading.Lock()  # guards _woken and _closing
        self._wakeup = threading.Condition(self._lock)  # signals: the pump should look again
        self._woken = False
        self._closing = False
        self._write_lock = threading.Lock()  # serializes writes to the socket, and guards _encode
        self._pump = None
        self.disconnected = False  # close_connection was called: the reader stops at its next fill

        # transport (IDENTIFY may upgrade it; see nsqd_threaded.server.transport)
        self._encode = None  # output bytes -> socket bytes, None on a plain connection
        self.transport = None
        self.tls = False
        self.tls_common_name = ""  # the client certificate's CN, for the auth server
        self.deflate = False
        self.snappy = False

    def __repr__(self):
        return "Client(%d, %s)" % (self.id, self.remote_address)

    # -- settings ----------------------------------------------------------

    def set_identity(self, fields):
        """IDENTIFY's names, kept (as nsqd keeps them) even if its settings are then refused."""
        self.client_id = fields.get("client_id", "")
        self.hostname = fields.get("hostname", "")
        self.user_agent = fields.get("user_agent", "")

    def identify(self, fields, settings):
        """IDENTIFY accepted: the client's metadata and its negotiated settings."""
        self.set_identity(fields)
        self.topology_region = fields.get("topology_region", "")
        self.topology_zone = fields.get("topology_zone", "")
        self.heartbeat_interval = settings["heartbeat_interval_ms"] / 1000.0
        self.output_buffer_timeout = settings["output_buffer_timeout_ms"] / 1000.0
        self.output_buffer_size = settings["output_buffer_size"]
        self.sample_rate = settings["sample_rate"]
        self.msg_timeout_ns = settings["msg_timeout_ms"] * 1000000
        self.feature_negotiation = bool(fields.get("feature_negotiation"))
        self.wake()

    def set_ready(self, count):
        """RDY: how many messages may be in flight to this client."""
        self.ready_count = count
        self.wake_at = max(1, count // 4)
        self.wake()

    def subscribe(self, topic_name, channel):
        """SUB done (the channel has added this client): the pump starts taking from it."""
        self.topic_name = topic_name
        self.channel = channel
        self.state = STATE_SUBSCRIBED
        self.wake()

    def start_close(self):
        """CLS: no more deliveries; FIN/REQ/TOUCH still work until the client disconnects."""
        self.set_ready(0)
        self.state = STATE_CLOSING

    def count_published(self, topic_name, n):
        """PUB/MPUB/DPUB succeeded: the producer figures of /stats."""
        counts = self.pub_counts
        counts[topic_name] = counts.get(topic_name, 0) + n

    def has_authorizations(self):
        """True once AUTH got an answer granting something (nsqd's HasAuthorizations)."""
        state = self.auth_state
        return state is not None and len(state.authorizations) > 0

    def upgrade(self, negotiate):
        """IDENTIFY's upgrades: ``negotiate(sock, send, install)`` runs holding the write lock.

        As nsqd's Upgrade* do, nothing else is written meanwhile (no
        heartbeat in the middle of a TLS handshake, or between an upgrade
        and its OK).  ``send(data)`` writes through the current layers;
        ``install(transport)`` makes them ``transport``'s.  Errors propagate
        with the layers as they were last installed.
        """
        with self._write_lock:
            negotiate(self._sock, self._send_locked, self._install)

    def _send_locked(self, data):
        encode = self._encode
        self._sock.sendall(encode(data) if encode is not None else data)

    def _install(self, transport):
        self._encode = transport.encoder()
        self.transport = transport
        self.tls = transport.tls is not None
        self.tls_common_name = transport.tls_common_name() if self.tls else ""
        self.deflate = transport.compression == "deflate"
        self.snappy = transport.compression == "snappy"

    # -- output ------------------------------------------------------------

    def send(self, data):
        """Write bytes (one or more complete frames) now; False if the connection failed.

        With compression or TLS the bytes are encoded here, once per send:
        the encoders sit under the output batching, as nsqd's sit under its
        buffered writer.
        """
        try:
            with self._write_lock:
                encode = self._encode
                if encode is not None:
                    data = encode(data)
                self._sock.sendall(data)
            return True
        except OSError:
            self.close_connection()
            return False

    def _send_messages(self, msgs):
        """Encode and write a batch, in sendalls of at least output_buffer_size bytes."""
        parts = []
        pending = 0
        limit = self.output_buffer_size
        encode = protocol.message_frame_parts
        for msg in msgs:
            header, msg_id, body = encode(msg.timestamp, msg.attempts, msg.id, msg.body)
            parts += (header, msg_id, body)
            pending += 30 + len(body)
            if pending >= limit:
                if not self.send(b"".join(parts)):
                    return False
                parts = []
                pending = 0
        if parts:
            return self.send(b"".join(parts))
        return True

    # -- pump --------------------------------------------------------------

    def start_pump(self):
        """Start the pump thread (RuntimeError when the host allows no more threads)."""
        pump = threading.Thread(
            target=self._pump_loop, name="nsqd-client-pump[%d %s]" % (self.id, self.remote_address), daemon=True
        )
        pump.start()
        self._pump = pump  # only a started pump is joined

    def wake(self):
        with self._lock:
            self._woken = True
            self._wakeup.notify()

    def _pump_loop(self):
        next_heartbeat = time.monotonic() + self.heartbeat_interval
        hb_interval = self.heartbeat_interval
        while True:
            with self._lock:
                if not self._woken and not self._closing:
                    timeout = next_heartbeat - time.monotonic() if hb_interval > 0 else None
                    if timeout is None or timeout > 0:
                        self._wakeup.wait(timeout)
                self._woken = False
                if self._closing:
                    return
            if self.heartbeat_interval != hb_interval:
                # IDENTIFY changed the interval: restart the ticker.
                hb_interval = self.heartbeat_interval
                next_heartbeat = time.monotonic() + hb_interval
            next_heartbeat = self._heartbeat_if_due(hb_interval, next_heartbeat)
            if next_heartbeat is None:
                return
            channel = self.channel
            if channel is not None and self.state == STATE_SUBSCRIBED:
                while True:
                    msgs = channel.take(self, DELIVERY_BATCH)
                    if not msgs:
                        break
                    if not self._send_messages(msgs):
                        return
                    # A steady stream never lets the pump wait: keep the ticker going.
                    next_heartbeat = self._heartbeat_if_due(hb_interval, next_heartbeat)
                    if next_heartbeat is None:
                        return

    def _heartbeat_if_due(self, interval, next_heartbeat):
        """Send a heartbeat if the ticker fired; returns the next tick, None if the write failed."""
        if interval <= 0:
            return next_heartbeat
        now = time.monotonic()
        if now < next_heartbeat:
            return next_heartbeat
        if not self.send(protocol.HEARTBEAT_FRAME):
            return None
        # A fixed ticker: missed ticks are skipped, not sent in a burst.
        return next_heartbeat + interval * (1 + int((now - next_heartbeat) // interval))

    # -- shutdown ----------------------------------------------------------

    def close_connection(self):
        """Make the connection thread's next read fail so it cleans up (any thread)."""
        self.disconnected = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def stop_pump(self):
        """Tell the pump to stop (it ends at its next wake-up); see :meth:`join_pump`."""
        with self._lock:
            self._closing = True
            self._wakeup.notify()

    def join_pump(self):
        """Wait for the stopped pump to end (connection thread only)."""
        if self._pump is not None and self._pump is not threading.current_thread():
            self._pump.join()
