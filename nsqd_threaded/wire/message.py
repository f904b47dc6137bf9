"""One message in its two forms: the record and the Message object.

* A record is a message as bytes: the 26-byte header (timestamp, attempts,
  ID) then the body, exactly the payload of a message frame and a diskqueue
  record.  A message that will wait is built as a record: in the topic's
  backlog, shared by every channel of the fan-out (bytes are immutable: no
  copy per channel), in a channel's memory queue, and written to and read
  from the disk queues as it is.  A bytes object costs less memory than a
  Message, takes no time to copy, and is not tracked by the cyclic garbage
  collector, which never has to traverse a million of them queued.
* A :class:`Message` is what a channel hands to a client and indexes while
  in flight: its fields change (attempts, the in-flight ones).  A channel
  makes one from a record when it delivers it (:func:`from_records`).  A
  message published while its topic has consumers is a Message from the
  start (it is taken soon, and building it at once is cheaper than the
  conversion), and so is one with a delay (DPUB, or REQ with a timeout),
  because the record has no field for the delay: queues hold both forms.

This module is the one place that tells the forms apart (a record is an
object of type ``bytes``; anything else is a Message) and converts between
them: :func:`new_records`, :func:`timestamped_records`, :func:`from_records`,
:func:`as_records`, :func:`copy_batches`, :func:`batch_form`.  Whoever only
reads a held message, whatever its form (a channel's inspection, dead-letter
provenance, redrive), reads it with :func:`held_fields`.  A batch of queue
entries is described by its form:

* :data:`RECORDS`: records only.  Immutable, so every channel of a fan-out
  queues the same objects, and none has a delay.
* :data:`MESSAGES`: Messages without a delay (published while the topic has
  consumers).  Each channel but one gets copies; no channel looks for delays.
* :data:`DEFERRED`: anything, and a Message may have a delay to serve (DPUB,
  a backlog or a disk queue read back).  Copied like MESSAGES, and each
  channel puts the delayed ones in its deferred index.

The disk queue's write loop (``DiskQueue.put``) and a channel's put path
(``Channel.put_messages``, ``Channel._index_deferred_locked``) repeat the test
inline, once per message, where a call would cost more than the work.
"""

import struct
import time
from itertools import repeat

from .protocol_v2 import MESSAGE_HEADER, encode_message

# A record's header: timestamp, attempts, ID (the protocol's message header).
RECORD_HEADER = MESSAGE_HEADER
RECORD_HEADER_SIZE = RECORD_HEADER.size
_TIMESTAMP_ATTEMPTS = struct.Struct(">qH")  # the header up to the ID


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
        # (A broker always passes its clock's time: the default serves tools and tests.)
        self.timestamp = time.time_ns() if timestamp is None else timestamp
        self.attempts = attempts
        self.deferred_ns = deferred_ns
        self.client_id = 0
        self.delivery_ns = 0
        self.expiry_ns = 0

    def encode(self):
        """The 26-byte header + body: wire payload and diskqueue record."""
        return encode_message(self.timestamp, self.attempts, self.id, self.body)

    def __repr__(self):
        return "Message(id=%r, attempts=%d, body=%d bytes)" % (self.id, self.attempts, len(self.body))


def held_fields(entry):
    """``(id, body, timestamp, attempts)`` of a queue entry in either form, changing nothing
    (a record's ID and body are bytes; a Message's as it holds them)."""
    if type(entry) is bytes:
        timestamp, attempts, msg_id = RECORD_HEADER.unpack_from(entry)
        return msg_id, entry[RECORD_HEADER_SIZE:], timestamp, attempts
    return entry.id, entry.body, entry.timestamp, entry.attempts


def timestamped_records(ids, timestamps, bodies):
    """Records of new messages: ``ids``, each with its own ``timestamps`` (a dead letter keeps its original), attempts 0."""
    pack = RECORD_HEADER.pack
    return [pack(timestamp, 0, msg_id) + body for msg_id, timestamp, body in zip(ids, timestamps, bodies)]


RECORDS = "records"
MESSAGES = "messages"
DEFERRED = "deferred"


def batch_form(entries):
    """The form of a batch taken from a backlog: RECORDS if all are records, else DEFERRED."""
    return RECORDS if all([type(e) is bytes for e in entries]) else DEFERRED


def as_records(entries):
    """The entries as a backlog keeps them: each Message without a delay as its record."""
    pack = RECORD_HEADER.pack
    return [m if type(m) is bytes or m.deferred_ns else pack(m.timestamp, m.attempts, m.id) + m.body
            for m in entries]


def copy_batches(entries, form, count):
    """``count`` batches for the other channels of a fan-out: records as they are, each
    Message a new one (attempts 0; ``form`` DEFERRED: the delay kept).  Not for RECORDS:
    share those."""
    if form is MESSAGES:
        # A publish's Messages share one timestamp: the copies are made by map over
        # the batch's IDs and bodies, gathered once for every channel (no attribute
        # reads per copy, and the fewest arguments).
        timestamp = entries[0].timestamp if entries else 0
        if all([m.timestamp == timestamp for m in entries]):
            ids = [m.id for m in entries]
            bodies = [m.body for m in entries]
            return [list(map(Message, ids, bodies, repeat(timestamp))) for _ in range(count)]
        return [[Message(m.id, m.body, m.timestamp) for m in entries] for _ in range(count)]
    return [[m if type(m) is bytes else Message(m.id, m.body, m.timestamp, 0, m.deferred_ns) for m in entries]
            for _ in range(count)]


def new_records(timestamp, id_blocks, bodies):
    """The records of new messages (attempts 0, one timestamp): ``bodies`` with the IDs
    of ``id_blocks``, ``[(prefix, suffixes)]`` as ``GUIDFactory.new_id_blocks`` makes them
    (the IDs are ``prefix + suffix``, 16 bytes).

    The 10 bytes before the ID are the batch's, and one tick's IDs share a
    prefix: a record is two concatenations, no struct packing per message.
    """
    start = _TIMESTAMP_ATTEMPTS.pack(timestamp, 0)
    if len(id_blocks) == 1:
        prefix, suffixes = id_blocks[0]
        head = start + prefix
        return [head + s + b for s, b in zip(suffixes, bodies)]
    records = []
    rest = iter(bodies)
    for prefix, suffixes in id_blocks:
        head = start + prefix
        records += [head + s + b for s, b in zip(suffixes, rest)]  # (zip takes no body past the suffixes)
    return records


def from_records(items):
    """Messages from records (a Message among them is passed through as it is), as a new
    list; but a ``list`` holding no record (what a channel of a consumed topic queues) is
    returned itself: one C-level scan, no copy.
    """
    if type(items) is list and bytes not in map(type, items):
        return items
    unpack = RECORD_HEADER.unpack_from
    out = []
    for item in items:
        if type(item) is bytes:
            timestamp, attempts, msg_id = unpack(item)
            item = Message(msg_id, item[RECORD_HEADER_SIZE:], timestamp, attempts)
        out.append(item)
    return out
