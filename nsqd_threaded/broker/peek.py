"""The messages a channel holds, in delivery order, changing nothing.

One reading serves ``GET /channel/peek`` (the HTTP surface, not in Go nsqd)
and the testing brokers' ``messages()``: :func:`channel_messages`.

Delivery order is the order the channel would hand the messages out if
nobody FINed, REQueued or TOUCHed anything from now on:

1. the queued ones: the memory queue, then the disk queue (read from its
   files without moving its read position);
2. then, by their due time, the ones that rejoin the queue later: those in
   flight (due at their deadline, when they time out) and the deferred ones
   (due when their delay ends), a deferred record still on disk included.

Each is a :class:`HeldMessage`; a dead letter (a message a channel's policy
moved to this topic) carries where it came from (:mod:`.provenance`).  The channel's lock is held while it copies
them (:meth:`~nsqd_threaded.broker.channel.Channel.held`), disk reads
included: this is for tests and inspection, not for a hot path.
"""

import base64
import collections

from .debug_state import body_preview

QUEUED = "queued"
IN_FLIGHT = "in_flight"
DEFERRED = "deferred"

PEEK_DEFAULT = 1  # messages a peek answers when it does not say how many
PEEK_MAX = 10000  # the most one peek answers

BODY_ENCODINGS = ("preview", "base64")  # how a peek's document carries bodies


class HeldMessage(collections.namedtuple("HeldMessage", "id body attempts timestamp state due_ns dead_letter",
                                         defaults=(None,))):
    """One message a channel holds.

    ``id``: the 16 characters the wire carries (a str); ``body``: bytes;
    ``timestamp``: when it was published (Unix ns); ``state``: ``"queued"``,
    ``"in_flight"`` or ``"deferred"``; ``due_ns``: when it rejoins the queue
    (Unix ns of the broker's clock; the deadline of one in flight), None for a
    queued one; ``dead_letter``: a dead letter's provenance (a dict: ``topic``,
    ``channel``, ``reason``, ``attempts``, ``id``, ``timestamp``, ``at``; see
    :mod:`.provenance`), None for any other message.  :attr:`due_in` is not a field: two readings of the same
    message compare equal.
    """

    _read_ns = None  # the broker's clock when the message was read (set per instance by held())

    @property
    def due_in(self):
        """Seconds of the broker's clock from the reading to ``due_ns`` (0.0 when it was due already);
        None for a queued message, or one read without the clock's time."""
        if self.due_ns is None or self._read_ns is None:
            return None
        return max(0, self.due_ns - self._read_ns) / 1e9


def held(fields, read_ns):
    """A :class:`HeldMessage` of ``fields`` read at ``read_ns`` of the broker's clock (None: unknown)."""
    message = HeldMessage(*fields)
    if read_ns is not None:
        message._read_ns = read_ns
    return message


def channel_messages(channel, limit=None, now_ns=None):
    """The messages ``channel`` holds, in delivery order (the module's docstring), at most ``limit``;
    ``now_ns`` (the broker's clock) gives each timed one its ``due_in``."""
    queued, timed = channel.held(limit)
    provenance = channel.dead_letter_of
    out = []
    for msg_id, body, timestamp, attempts in queued:
        msg_id, body = _text_id(msg_id), bytes(body)
        out.append(HeldMessage(msg_id, body, attempts, timestamp, QUEUED, None, provenance(msg_id, body)))
    if limit is None or len(out) < limit:
        timed.sort(key=lambda t: (t[5], t[0]))
        for msg_id, body, timestamp, attempts, state, due_ns in timed:
            msg_id, body = _text_id(msg_id), bytes(body)
            out.append(held((msg_id, body, attempts, timestamp, state, due_ns, provenance(msg_id, body)), now_ns))
    return out if limit is None else out[:limit]


def message_doc(held, body_encoding="preview"):
    """A :class:`HeldMessage` as peek's JSON object.

    ``body_encoding`` ``"preview"``: the body as ``/debug/state`` shows it
    (its first bytes as text); ``"base64"``: the whole body, base64.
    """
    if body_encoding == "base64":
        body = base64.b64encode(held.body).decode("ascii")
    else:
        body = body_preview(held.body)
    doc = {
        "id": held.id,
        "attempts": held.attempts,
        "timestamp": held.timestamp,
        "body": body,
        "state": held.state,
        "due_ns": held.due_ns,
    }
    if held.dead_letter is not None:
        doc["dead_letter"] = dict(held.dead_letter)
    return doc


def held_from_doc(doc, now_ns=None):
    """Peek's JSON object (bodies in base64) back to a :class:`HeldMessage` (``now_ns``: the answer's)."""
    return held((doc["id"], base64.b64decode(doc["body"]), doc["attempts"], doc["timestamp"], doc["state"],
                 doc["due_ns"], doc.get("dead_letter")), now_ns)


def _text_id(msg_id):
    return bytes(msg_id).decode("ascii", "replace")
