"""The Message object shared by topics, channels and client pumps."""

import time

from ..protocol import decode_message, encode_message


class Message:
    """One message.  ``__slots__`` keeps a queued 200-byte message small.

    ``deferred_ns`` is the requested publish delay (DPUB).  The in-flight
    fields (``client_id``, ``delivery_ns``, ``expiry_ns``) are only meaningful
    while the message sits in a channel's in-flight index, and are guarded by
    that channel's lock.
    """

    __slots__ = ("id", "body", "timestamp", "attempts", "deferred_ns", "client_id", "delivery_ns", "expiry_ns")

    def __init__(self, msg_id, body, timestamp=None, attempts=0, deferred_ns=0):
        self.id = msg_id
        self.body = body
        self.timestamp = time.time_ns() if timestamp is None else timestamp
        self.attempts = attempts
        self.deferred_ns = deferred_ns
        self.client_id = 0
        self.delivery_ns = 0
        self.expiry_ns = 0

    def copy(self):
        """A copy for another channel: same ID, body, timestamp and deferral; attempts 0."""
        return Message(self.id, self.body, self.timestamp, 0, self.deferred_ns)

    def encode(self):
        """The 26-byte header + body: wire payload and diskqueue record."""
        return encode_message(self.timestamp, self.attempts, self.id, self.body)

    @classmethod
    def decode(cls, data):
        timestamp, attempts, msg_id, body = decode_message(data)
        return cls(msg_id, body, timestamp, attempts)

    def __repr__(self):
        return "Message(id=%r, attempts=%d, body=%d bytes)" % (self.id, self.attempts, len(self.body))
