"""Where each dead letter came from (not in Go nsqd): its source, the reason, its attempts, when.

A channel's policy moves a message to its dead-letter topic as a new message
there (a new ID, its body unchanged, its own original timestamp kept:
``Topic.publish_dead_letters``).  What the body cannot say without changing
is kept beside it, keyed by the new ID: ``{"topic", "channel", "reason"
("max_attempts" or "msg_ttl"), "attempts", "id" (the original 16
characters), "timestamp" (the original, Unix ns), "at" (when it was moved,
Unix ns of the broker's clock)}``.  Peek (``/channel/peek``,
``Broker.messages()``, nsqadmin) shows it as the message's ``dead_letter``
and ``/channel/redrive`` sends a dead letter back to its ``topic``.

Every channel of the dead-letter topic holds the same message (the same
ID), so the provenance is the topic's: one :class:`TopicProvenance` per
dead-letter topic, kept in the data directory by
:mod:`nsqd_threaded.storage.provenance` (a file Go nsqd never reads), read
back after a restart.  An entry is forgotten with its topic (deleted), not
when the last channel lets its message go: a message ID is never made twice,
so a stale entry is never shown for another message, only kept.
"""

import threading

from ..storage import provenance as store

MAX_ATTEMPTS = "max_attempts"  # taken out for having been delivered max_attempts times
MSG_TTL = "msg_ttl"  # taken out for being older than the message TTL
REASONS = (MAX_ATTEMPTS, MSG_TTL)


def dead_letter_doc(source_topic, source_channel, reason, msg, at_ns):
    """The provenance of ``msg`` (a Message of ``source_topic:source_channel``) moved at ``at_ns``."""
    return {"topic": source_topic, "channel": source_channel, "reason": reason, "attempts": msg.attempts,
            "id": bytes(msg.id).decode("ascii", "replace"), "timestamp": msg.timestamp, "at": at_ns}


class TopicProvenance:
    """The provenance of one dead-letter topic's messages.

    ``_lock`` guards ``_entries`` (ID text -> (body CRC-32, dead_letter dict)),
    ``_moved`` ((source topic, source channel, original ID text) -> the dead
    letter's ID text, for the lines a killed broker wrote in this boot),
    ``_loaded`` and ``_torn`` (the file's last line has no newline), and the
    appends to the file (one writer at a time); a leaf: it takes no other lock
    (the topic's may be held: see :meth:`add`).  ``path`` None (an ephemeral
    topic): kept in memory only.  ``boot`` (``--durable``): the boot ID the
    lines are written with and ``_moved`` is read for (None: neither).
    """

    def __init__(self, path, sync, boot=None):
        self.path = path
        self._sync = sync  # fsync the appends (--durable: as the dead letters themselves are)
        self._boot = boot
        self._lock = threading.Lock()
        self._entries = {}
        self._moved = {}
        self._loaded = path is None
        self._torn = False

    def _load_locked(self):
        if not self._loaded:
            entries, whole, same_boot = store.read_entries(self.path, self._boot)
            # (read before this broker appends its first line: every line of this boot is an earlier run's)
            for msg_id in same_boot:
                doc = entries[msg_id][1]
                self._moved[(doc.get("topic"), doc.get("channel"), doc.get("id"))] = msg_id
            entries.update(self._entries)
            self._entries = entries
            self._torn = not whole
            self._loaded = True

    def encode(self, entries):
        """The lines :meth:`add` appends for these entries (made beforehand, outside any lock)."""
        return store.encode_entries(entries, self._boot)

    def add(self, entries, sync=True, data=None):
        """Keep ``[(ID text, body CRC-32, dead_letter dict)]``; OSError if the file refused them (the
        memory keeps them all the same: shown until a restart).  ``sync`` False: the fsync (if any)
        is left to :meth:`sync` (called with the dead-letter topic's lock held: no fsync under it).
        ``data``: their lines, from :meth:`encode`."""
        with self._lock:
            self._load_locked()
            for msg_id, crc, doc in entries:
                self._entries[msg_id] = (crc, doc)
            if self.path is not None:
                try:
                    store.append_entries(self.path, self.encode(entries) if data is None else data, self._torn,
                                         self._sync and sync)
                except OSError:
                    self._torn = True  # (a part may have been written: the next append starts a line of its own)
                    raise
                self._torn = False

    def sync(self):
        """fsync what :meth:`add` appended without (OSError if it fails)."""
        if self.path is not None and self._sync:
            store.sync_file(self.path)  # (without the lock: an add under a topic's lock never waits for it)

    def moved_before(self, source_topic, source_channel, msgs):
        """Of these Messages of ``source_topic:source_channel``, the IDs (bytes) of those a broker killed
        in this boot had written to this topic (their lines say so, with their bodies' CRC-32)."""
        with self._lock:
            self._load_locked()
            if not self._moved:
                return set()
            out = set()
            for msg in msgs:
                dead_id = self._moved.get((source_topic, source_channel, bytes(msg.id).decode("ascii", "replace")))
                if dead_id is not None and self._entries[dead_id][0] == store.body_crc(msg.body):
                    out.add(bytes(msg.id))
            return out

    def get(self, msg_id, body):
        """The dead_letter dict of the message with this ID text and body, or None."""
        with self._lock:
            self._load_locked()
            entry = self._entries.get(msg_id)
        if entry is None or entry[0] != store.body_crc(body):
            return None
        return entry[1]

    def delete(self):
        with self._lock:
            self._entries = {}
            self._moved = {}
            self._loaded = True
            if self.path is not None:
                store.delete_file(self.path)


class DeadLetterProvenance:
    """Every dead-letter topic's provenance: one per broker.

    ``_lock`` guards ``_topics`` (topic name -> :class:`TopicProvenance`, made
    on first use); taken alone, never with another lock.
    """

    def __init__(self, data_path, durable, log):
        self._data_path = data_path
        self._durable = durable
        self._boot = store.current_boot() if durable else None  # (see TopicProvenance)
        self._log = log
        self._lock = threading.Lock()
        self._topics = {}

    def _of(self, topic_name):
        with self._lock:
            book = self._topics.get(topic_name)
            if book is None:
                path = None if topic_name.endswith("#ephemeral") else store.file_path(self._data_path, topic_name)
                book = self._topics[topic_name] = TopicProvenance(path, self._durable, self._boot)
            return book

    def record(self, topic_name, ids, msgs, docs, sync=True):
        """The dead letters ``ids`` of ``topic_name`` are the Messages ``msgs`` (same order) with these
        dead_letter dicts.  A failed write is logged, not raised: the moves go on, their messages
        without provenance after a restart (never with a wrong one; such a move may be repeated
        after a kill).  ``sync`` False: :meth:`sync` follows (see :meth:`TopicProvenance.add`)."""
        self.prepare(topic_name, ids, msgs, docs, sync)()

    def prepare(self, topic_name, ids, msgs, docs, sync=False):
        """:meth:`record`, its lines encoded now, as a callable that appends them (taking only the
        topic provenance's lock, a leaf: for the dead-letter topic's lock held, right after the
        write of the dead letters)."""
        entries = [(bytes(i).decode("ascii", "replace"), store.body_crc(m.body), d) for i, m, d in zip(ids, msgs, docs)]
        book = self._of(topic_name)
        data = book.encode(entries)

        def append():
            try:
                book.add(entries, sync, data)
            except OSError as e:
                self._log.error("TOPIC(%s): failed to keep the provenance of %d dead letters - %s",
                                topic_name, len(entries), e)
        return append

    def sync(self, topic_name):
        """fsync what :meth:`record` appended with ``sync`` False (a failure is logged)."""
        try:
            self._of(topic_name).sync()
        except OSError as e:
            self._log.error("TOPIC(%s): failed to sync the provenance of its dead letters - %s", topic_name, e)

    def moved_before(self, topic_name, source_topic, source_channel, msgs):
        """The IDs (bytes) of those Messages of ``source_topic:source_channel`` that a broker killed in
        this boot (``--durable``) had already written to the dead-letter topic ``topic_name``."""
        if self._boot is None:
            return set()
        return self._of(topic_name).moved_before(source_topic, source_channel, msgs)

    def lookup(self, topic_name, msg_id, body):
        """The dead_letter dict of a message of ``topic_name`` (ID text, body bytes), or None."""
        return self._of(topic_name).get(msg_id, body)

    def forget(self, topic_name):
        """The topic is deleted: its provenance (file included) goes with it."""
        with self._lock:
            book = self._topics.pop(topic_name, None)
        if book is None:
            book = TopicProvenance(None if topic_name.endswith("#ephemeral")
                                   else store.file_path(self._data_path, topic_name), False)
        book.delete()
