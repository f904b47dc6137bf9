"""Client: one TCP client's state, as the broker core sees it (Go's clientV2 without its socket).

Its identity and IDENTIFY settings, RDY and in-flight counts, delivery and
publish counters, the AUTH answer, and the flag that wakes its message pump.
The connection itself (reads, writes, upgrades and the pump thread) is the
server's: :class:`~nsqd_threaded.server.connection.ClientConnection` extends
this class.
"""

import threading
import time

from ..internal import gocompat

STATE_INIT = 0
STATE_SUBSCRIBED = 3
STATE_CLOSING = 4


class Client:
    """A connected client; as a subscriber, the :class:`~nsqd_threaded.broker.delivery.Subscriber` of its channel.

    Its state changes through verbs (:meth:`identify`, :meth:`subscribe`,
    :meth:`set_ready`, :meth:`start_close`, :meth:`count_published`) called by
    the connection thread; the delivery counters are the channel's to change.

    Locks:
    * ``_lock`` guards ``_woken``, ``_closing`` and ``_pump_asleep``; ``_wakeup`` (a Condition on
      it) signals the pump that something changed: RDY, in-flight count,
      messages available, heartbeat settings, or shutdown.
    * ``in_flight_count``, ``blocked`` and the delivery counters are guarded by
      the subscribed channel's lock (every change happens in a Channel method).
    """

    # Slots: a broker holds thousands of clients, and a consumer's FIN reads a dozen of these
    # (a slot is a fixed place in the object; sixty names overflow a shared-key instance dict into
    # one of its own per client, larger and slower to read).  ``__dict__`` stays for what a subclass
    # or a test adds beside them, ``__weakref__`` for whoever watches a client go.
    __slots__ = (
        "id", "remote_address", "client_id", "hostname", "user_agent", "topology_region", "topology_zone",
        "state", "connect_time", "channel", "topic_name", "heartbeat_interval", "msg_timeout_ns",
        "output_buffer_size", "output_buffer_timeout", "sample_rate", "feature_negotiation", "ready_count",
        "in_flight_count", "blocked", "message_count", "finish_count", "requeue_count", "pub_counts",
        "auth_secret", "auth_state", "_lock", "_woken", "_closing", "_pump_asleep", "transport", "tls",
        "tls_common_name", "deflate", "snappy", "_wakeup",
        "__dict__", "__weakref__",
    )

    def __init__(self, id, address, options):
        """``id``: the broker's number for this connection (Go's ID, never reused);
        ``client_id`` is the IDENTIFY string (Go's ClientID), the remote IP until then."""
        self.id = id
        self.remote_address = "%s:%s" % address[:2] if isinstance(address, tuple) else str(address)
        self.client_id = address[0] if isinstance(address, tuple) else ""
        self.hostname = self.client_id
        self.user_agent = ""
        self.topology_region = ""
        self.topology_zone = ""
        self.state = STATE_INIT
        self.connect_time = time.time()  # real time: a connection's age, not a message's
        self.channel = None
        self.topic_name = None

        # settings (IDENTIFY may change them)
        self.heartbeat_interval = options.client_timeout / 2
        self.msg_timeout_ns = gocompat.ns(options.msg_timeout)
        self.output_buffer_size = 16384
        self.output_buffer_timeout = options.output_buffer_timeout
        self.sample_rate = 0
        self.feature_negotiation = False

        # flow control
        self.ready_count = 0
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

        self._lock = threading.Lock()  # guards _woken, _closing and _pump_asleep
        if self.pump_thread:  # (a pump that is a task, not a thread, never waits on it)
            self._wakeup = threading.Condition(self._lock)  # signals: the pump should look again
        self._woken = False
        self._closing = False
        self._pump_asleep = False  # the pump waits on _wakeup (set by the server's pump, around its wait)

        # transport (IDENTIFY may upgrade it; see nsqd_threaded.wire.transport)
        self.transport = None
        self.tls = False
        self.tls_common_name = ""  # the client certificate's CN, for the auth server
        self.deflate = False
        self.snappy = False

    #: Whether the pump is a thread that sleeps on ``_wakeup`` (a subclass whose pump is a task says not).
    pump_thread = True

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

    def pump_idle(self):
        """True while the pump sleeps with nothing in hand and no wake-up pending
        (the channel's lock may be held: lock order Channel -> Client)."""
        with self._lock:
            return self._pump_asleep and not self._woken

    def wake(self):
        with self._lock:
            self._woken = True
            self._wakeup.notify()

    def set_transport(self, transport):
        """IDENTIFY upgraded the connection: TLS, deflate or snappy, as /stats shows them."""
        self.transport = transport
        self.tls = transport.tls is not None
        self.tls_common_name = transport.tls_common_name() if self.tls else ""
        self.deflate = transport.compression == "deflate"
        self.snappy = transport.compression == "snappy"

    def hold_output(self, own=False):
        """Direct delivery (see :mod:`nsqd_threaded.broker.channel`): a client without a socket never takes it."""
        return False

    def deliver_held(self, msgs):
        """Never called: :meth:`hold_output` never reserves (the server's connection writes)."""
        raise NotImplementedError

    def close_connection(self):
        """Ask the connection to end (the channel is closing); the server's connection does it."""
