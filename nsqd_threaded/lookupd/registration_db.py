"""nsqlookupd's registration DB: (category, key, subkey) -> the producers registered under it.

Categories are ``client`` (``("client", "", "")``: every identified peer),
``topic`` (``("topic", topic, "")``) and ``channel`` (``("channel", topic,
channel)``).  A registration key can exist with no producers: HTTP
``/topic/create`` makes one, and a peer leaving removes itself as producer but
leaves the keys.  ``"*"`` as key or subkey in a query matches any value (as in
nsqlookupd, even where the ``"*"`` comes from an unvalidated HTTP parameter).

Lock contract: one ``threading.Lock`` per DB guards the registration map and
every Producer's tombstone fields; each public method takes it once, so each
is atomic, but a sequence of calls is not (exactly as nsqlookupd's RWMutex).
A PeerInfo's ``last_update`` pair is written by its peer's connection thread
alone and read without the lock (attribute stores are atomic; a reader may see
the previous ping, which nsqlookupd allows as well).

Every time here is read from the lookupd's
:class:`~nsqd_threaded.internal.clock.Clock` (``RegistrationDB.clock``), which
a test may move forward: producers go inactive and tombstones expire when
they are next looked at, so a skip needs no other work.
"""

import threading
from typing import NamedTuple

from ..internal.clock import Clock

# time.Time{}.UnixNano() in Go: what /debug shows as tombstoned_at when never tombstoned.
GO_ZERO_TIME_NS = -6795364578871345152


class Registration(NamedTuple):
    category: str
    key: str
    subkey: str


CLIENT = Registration("client", "", "")


class PeerInfo:
    """One identified nsqd connection; shared by all of its Producer entries.

    ``id`` is the connection's remote ``ip:port``.  ``last_update_ns`` (Unix
    ns, shown by /debug) and ``last_update_mono`` (for the inactivity filter)
    are refreshed by IDENTIFY and PING, from ``clock`` (the lookupd's).
    """

    __slots__ = (
        "id",
        "remote_address",
        "hostname",
        "broadcast_address",
        "tcp_port",
        "http_port",
        "version",
        "topology_zone",
        "topology_region",
        "last_update_ns",
        "last_update_mono",
        "_clock",
    )

    def __init__(self, peer_id, fields, clock):
        self.id = peer_id
        self._clock = clock
        self.hostname = fields.get("hostname", "")
        self.broadcast_address = fields.get("broadcast_address", "")
        self.tcp_port = fields.get("tcp_port", 0)
        self.http_port = fields.get("http_port", 0)
        self.version = fields.get("version", "")
        self.topology_zone = fields.get("topology_zone", "")
        self.topology_region = fields.get("topology_region", "")
        self.remote_address = peer_id  # what the peer claims is overwritten, as nsqlookupd does
        self.touch()

    def touch(self):
        self.last_update_ns = self._clock.time_ns()
        self.last_update_mono = self._clock.monotonic()

    def to_json(self):
        """The peer object of /lookup, in nsqlookupd's field order."""
        return {
            "remote_address": self.remote_address,
            "hostname": self.hostname,
            "broadcast_address": self.broadcast_address,
            "tcp_port": self.tcp_port,
            "http_port": self.http_port,
            "version": self.version,
            "topology_zone": self.topology_zone,
            "topology_region": self.topology_region,
        }

    @property
    def node(self):
        """``broadcast_address:http_port``, the name /topic/tombstone takes."""
        return "%s:%d" % (self.broadcast_address, self.http_port)


class Producer:
    """A peer as registered under one key; the tombstone is per key (per topic)."""

    __slots__ = ("peer", "tombstoned", "tombstoned_at_ns", "tombstoned_at_mono")

    def __init__(self, peer):
        self.peer = peer
        self.tombstoned = False
        self.tombstoned_at_ns = GO_ZERO_TIME_NS
        self.tombstoned_at_mono = None

    def is_tombstoned(self, lifetime, now):
        """Tombstoned less than ``lifetime`` seconds before ``now`` (monotonic)."""
        return self.tombstoned and now - self.tombstoned_at_mono < lifetime


def filter_active(producers, inactivity_timeout, tombstone_lifetime, now):
    """The producers whose peer was heard from within ``inactivity_timeout`` and that are not tombstoned
    (``now``: the lookupd's clock's monotonic time)."""
    return [
        p
        for p in producers
        if now - p.peer.last_update_mono <= inactivity_timeout and not p.is_tombstoned(tombstone_lifetime, now)
    ]


def _matches(reg, category, key, subkey):
    return reg.category == category and key in ("*", reg.key) and subkey in ("*", reg.subkey)


class RegistrationDB:
    """The registration map of one nsqlookupd (see the module docstring for the lock contract)."""

    def __init__(self, clock=None):
        self.clock = clock if clock is not None else Clock()  # the lookupd's (time skipping moves it)
        self._lock = threading.Lock()  # guards _registrations and every Producer's tombstone fields
        self._registrations = {}  # Registration -> {peer id: Producer}, in insertion order

    def add_registration(self, reg):
        with self._lock:
            self._registrations.setdefault(reg, {})

    def add_producer(self, reg, peer):
        """Register ``peer`` under ``reg``; False if it already was (its Producer, tombstone included, is kept)."""
        with self._lock:
            producers = self._registrations.setdefault(reg, {})
            if peer.id in producers:
                return False
            producers[peer.id] = Producer(peer)
            return True

    def remove_producer(self, reg, peer_id):
        """``(removed, producers left)``; the key itself stays."""
        with self._lock:
            producers = self._registrations.get(reg)
            if producers is None:
                return False, 0
            removed = producers.pop(peer_id, None) is not None
            return removed, len(producers)

    def remove_registration(self, reg):
        with self._lock:
            self._registrations.pop(reg, None)

    def find_registrations(self, category, key, subkey):
        with self._lock:
            if key != "*" and subkey != "*":
                reg = Registration(category, key, subkey)
                return [reg] if reg in self._registrations else []
            return [r for r in self._registrations if _matches(r, category, key, subkey)]

    def find_producers(self, category, key, subkey):
        """The producers under matching keys, one per peer."""
        with self._lock:
            if key != "*" and subkey != "*":
                return list(self._registrations.get(Registration(category, key, subkey), {}).values())
            seen = {}
            for reg, producers in self._registrations.items():
                if _matches(reg, category, key, subkey):
                    for peer_id, producer in producers.items():
                        seen.setdefault(peer_id, producer)
            return list(seen.values())

    def lookup_registrations(self, peer_id):
        """Every key ``peer_id`` is registered under."""
        with self._lock:
            return [reg for reg, producers in self._registrations.items() if peer_id in producers]

    def tombstone(self, topic, node):
        """Tombstone, in ``topic``'s registrations, the producers whose node is ``node``."""
        now_ns, now = self.clock.time_ns(), self.clock.monotonic()
        with self._lock:
            for reg, producers in self._registrations.items():
                if _matches(reg, "topic", topic, ""):
                    for producer in producers.values():
                        if producer.peer.node == node:
                            producer.tombstoned = True
                            producer.tombstoned_at_ns = now_ns
                            producer.tombstoned_at_mono = now

    def nodes(self, inactivity_timeout, tombstone_lifetime):
        """/nodes: every active identified peer with its topics and, per topic, whether it is tombstoned there."""
        now = self.clock.monotonic()
        with self._lock:
            peers = [p.peer for p in filter_active(self._registrations.get(CLIENT, {}).values(), inactivity_timeout, 0, now)]
            out = []
            for peer in peers:
                topics, tombstones = [], []
                for reg, producers in self._registrations.items():
                    if reg.category == "topic" and reg.subkey == "" and peer.id in producers:
                        producer = producers[peer.id]
                        topics.append(reg.key)
                        tombstones.append(producer.peer is peer and producer.is_tombstoned(tombstone_lifetime, now))
                out.append((peer, topics, tombstones))
            return out

    def next_deadline_in(self, inactivity_timeout, tombstone_lifetime):
        """Seconds of the clock until a producer now active goes inactive or a tombstone
        expires, whichever is first; None when neither is pending.  ``inactivity_timeout``
        None: tombstones only (producers that ping are never due)."""
        now = self.clock.monotonic()
        dues = []
        with self._lock:
            for producers in self._registrations.values():
                for p in producers.values():
                    if inactivity_timeout is not None:
                        dues.append(p.peer.last_update_mono + inactivity_timeout)
                    if p.tombstoned:
                        dues.append(p.tombstoned_at_mono + tombstone_lifetime)
        pending = [due - now for due in dues if due >= now]
        return min(pending) if pending else None

    def debug(self):
        """/debug: ``{"category:key:subkey": [producer...]}``, a snapshot taken under the lock."""
        with self._lock:
            data = {}
            for reg, producers in self._registrations.items():
                if not producers:
                    continue
                data["%s:%s:%s" % reg] = [
                    {
                        "broadcast_address": p.peer.broadcast_address,
                        "hostname": p.peer.hostname,
                        "http_port": p.peer.http_port,
                        "id": p.peer.id,
                        "last_update": p.peer.last_update_ns,
                        "tcp_port": p.peer.tcp_port,
                        "tombstoned": p.tombstoned,
                        "tombstoned_at": p.tombstoned_at_ns,
                        "topology_region": p.peer.topology_region,
                        "topology_zone": p.peer.topology_zone,
                        "version": p.peer.version,
                    }
                    for p in producers.values()
                ]
            return dict(sorted(data.items()))
