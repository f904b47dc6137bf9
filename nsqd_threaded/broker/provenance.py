"""Where each dead letter came from (not in Go nsqd): its source, the reason, its attempts, when.

A channel's policy moves a message to its dead-letter topic as a new message
there (a new ID, its body unchanged, its own original timestamp kept:
``Topic.publish_announced``).  What the body cannot say without changing
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
back after a restart.  An entry is forgotten with its topic (deleted), or
once no channel holds its message any more, by a compaction
(:meth:`DeadLetterProvenance.compact`, the queue scanner's): a message ID is
never made twice, so a stale entry is never shown for another message, only
kept until then.
"""

import os
import threading

from ..storage import provenance as store

MAX_ATTEMPTS = "max_attempts"  # taken out for having been delivered max_attempts times
MSG_TTL = "msg_ttl"  # taken out for being older than the message TTL
REASONS = (MAX_ATTEMPTS, MSG_TTL)

# A provenance file is compacted only from this many lines on (some 250 KB): below, rewriting it saves
# too little to be worth a pass over its topic's messages.
COMPACT_MIN_LINES = 1000


def dead_letter_doc(source_topic, source_channel, reason, msg, at_ns):
    """The provenance of ``msg`` (a Message of ``source_topic:source_channel``) moved at ``at_ns``."""
    return {"topic": source_topic, "channel": source_channel, "reason": reason, "attempts": msg.attempts,
            "id": bytes(msg.id).decode("ascii", "replace"), "timestamp": msg.timestamp, "at": at_ns}


class TopicProvenance:
    """The provenance of one dead-letter topic's messages.

    ``_lock`` guards ``_entries`` (ID text -> (body CRC-32, dead_letter dict)),
    ``_moved`` ((source topic, source channel, original ID text) -> the dead
    letter's ID text, for the lines a killed broker wrote in this boot),
    ``_loaded``, ``_torn`` (the file's last line has no newline), ``_lines``
    (the entries the file holds: read, appended, or kept by the last
    compaction), ``_min_lines`` (no compaction below), ``_deleted``, and the
    appends to and rewrites of the file (one writer at a time); a leaf: it
    takes no other lock (the topic's may be held: see :meth:`add`).  ``path``
    None (an ephemeral topic): kept in memory only.  ``boot``
    (``--durable``): the boot ID the lines are written with and ``_moved`` is
    read for (None: neither).
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
        self._lines = 0
        self._min_lines = COMPACT_MIN_LINES
        self._deleted = False  # its topic was deleted: a compaction under way must not write the file again

    def _load_locked(self):
        if not self._loaded:
            entries, whole, moved = store.read_entries(self.path, self._boot)
            self._lines = len(entries) + len(self._entries)
            # (read before this broker appends its first line: every line is an earlier run's)
            for msg_id, position in moved.items():
                doc = entries[msg_id][1]
                self._moved[(doc.get("topic"), doc.get("channel"), doc.get("id"))] = (msg_id, position)
            entries.update(self._entries)
            self._entries = entries
            self._torn = not whole
            self._loaded = True

    def encode(self, entries, positions=None):
        """The lines :meth:`add` appends for these entries (``positions``: their dead letters')."""
        return store.encode_entries(entries, self._boot, positions)

    def add(self, entries, sync=True, data=None):
        """Keep ``[(ID text, body CRC-32, dead_letter dict)]``; OSError if the file refused them (the
        memory keeps them all the same: shown until a restart).  ``sync`` False: the fsync (if any)
        is left to :meth:`sync` (called with the dead-letter topic's lock held: no fsync under it).
        ``data``: their lines, from :meth:`encode`."""
        with self._lock:
            self._load_locked()
            for msg_id, crc, doc in entries:
                self._entries[msg_id] = (crc, doc)
            self._lines += len(entries)
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

    def moved_before(self, source_topic, source_channel, msgs, holds):
        """Of these Messages of ``source_topic:source_channel``, the IDs (bytes) of those an earlier run
        of the broker had written to this topic: a line for it (with its body's CRC-32), and its dead
        letter found at the line's position (``holds(dead letter ID bytes, position)``), or, for a
        line without one, written in this boot."""
        with self._lock:
            self._load_locked()
            if not self._moved:
                return set()
            found = []
            for msg in msgs:
                moved = self._moved.get((source_topic, source_channel, bytes(msg.id).decode("ascii", "replace")))
                if moved is not None and self._entries[moved[0]][0] == store.body_crc(msg.body):
                    found.append((msg, moved))
        # (the records are read without this lock: it is a leaf, and a read may wait for the disk)
        out = {bytes(msg.id) for msg, (dead_id, position) in found
               if position is None or holds(dead_id.encode("ascii", "replace"), position)}
        if found:
            with self._lock:  # (told once: the move made again now, or let go, is this run's)
                for msg, _ in found:
                    self._moved.pop((source_topic, source_channel, bytes(msg.id).decode("ascii", "replace")), None)
        return out

    def get(self, msg_id, body):
        """The dead_letter dict of the message with this ID text and body, or None."""
        with self._lock:
            self._load_locked()
            entry = self._entries.get(msg_id)
        if entry is None or entry[0] != store.body_crc(body):
            return None
        return entry[1]

    # -- compaction (DeadLetterProvenance.compact) ----------------------------------------------

    def big_enough(self):
        """Whether the file has lines enough to be worth compacting (it is read if it was not yet)."""
        if self.path is None:
            return False
        with self._lock:
            self._load_locked()
            return not self._deleted and self._lines >= self._min_lines

    def compaction_due(self, held_bound):
        """Whether a compaction would at least halve the file: it has :data:`COMPACT_MIN_LINES` lines or
        more, and more than twice ``held_bound`` (at least as many messages as the topic holds).
        Reads the file if it was not read yet."""
        if self.path is None:
            return False
        with self._lock:
            self._load_locked()
            return not self._deleted and self._lines >= self._min_lines and self._lines > 2 * held_bound

    def begin_compaction(self):
        """The IDs the entries have now: the only ones :meth:`finish_compaction` may drop.  Taken before
        the topic's messages are read: an entry added after this (its message published to the topic
        before it) is kept whatever that reading saw."""
        with self._lock:
            self._load_locked()
            return set(self._entries)

    def finish_compaction(self, known, held):
        """Rewrite the file (:func:`~nsqd_threaded.storage.provenance.replace_entries`) with every entry
        but those in ``known`` whose message is not in ``held`` (ID texts), and forget those.  Returns
        how many were dropped; OSError if the file could not be rewritten (then nothing changed, and no
        compaction is tried before the file has doubled)."""
        with self._lock:  # (an append waits: it goes to the new file, after the rename)
            if self._deleted:
                return 0
            kept = {msg_id: entry for msg_id, entry in self._entries.items()
                    if msg_id in held or msg_id not in known}
            dropped = len(self._entries) - len(kept)
            try:
                # (with this boot's ID: a kept line's dead letter is held, so it did reach the disk)
                store.replace_entries(self.path, store.encode_entries(
                    [(msg_id, crc, doc) for msg_id, (crc, doc) in kept.items()], self._boot))
            except OSError:
                self._min_lines = 2 * self._lines
                raise
            self._entries = kept
            self._lines = len(kept)
            self._torn = False
            self._min_lines = COMPACT_MIN_LINES
            return dropped

    def delete(self):
        with self._lock:
            self._entries = {}
            self._moved = {}
            self._loaded = True
            self._deleted = True
            if self.path is not None:
                store.delete_file(self.path)


class DeadLetterProvenance:
    """Every dead-letter topic's provenance: one per broker.

    ``_lock`` guards ``_topics`` (topic name -> :class:`TopicProvenance`, made
    on first use, or for each file the data directory had at the first
    :meth:`compact`) and ``_listed`` (that listing was done); taken alone,
    never with another lock.
    """

    def __init__(self, data_path, durable, log):
        self._data_path = data_path
        self._durable = durable
        self._boot = store.current_boot() if durable else None  # (see TopicProvenance)
        self._log = log
        self._lock = threading.Lock()
        self._topics = {}
        self._listed = False

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
        """:meth:`record` as a callable ``append(positions)`` that appends the lines, with where the
        dead letters are written (None: not said), taking only the topic provenance's lock, a leaf:
        for the dead-letter topic's lock held, right before the write of the dead letters."""
        entries = [(bytes(i).decode("ascii", "replace"), store.body_crc(m.body), d) for i, m, d in zip(ids, msgs, docs)]
        book = self._of(topic_name)

        def append(positions=None):
            try:
                book.add(entries, sync, book.encode(entries, positions))
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

    def moved_before(self, topic_name, source_topic, source_channel, msgs, holds):
        """The IDs (bytes) of those Messages of ``source_topic:source_channel`` that an earlier run of
        the broker (``--durable``) had already written to the dead-letter topic ``topic_name``
        (``holds``: see :meth:`TopicProvenance.moved_before`)."""
        if not self._durable:
            return set()
        return self._of(topic_name).moved_before(source_topic, source_channel, msgs, holds)

    def lookup(self, topic_name, msg_id, body):
        """The dead_letter dict of a message of ``topic_name`` (ID text, body bytes), or None."""
        return self._of(topic_name).get(msg_id, body)

    def compact(self, get_existing_topic):
        """Drop the entries whose message no channel of their topic holds any more (finished,
        redriven, its channel deleted or emptied), from each file that would at least halve
        (:meth:`TopicProvenance.compaction_due`): the queue scanner's, once per pass.

        The check costs a lock per channel of each dead-letter topic; a compaction reads the topic's
        messages (disk queues included) and rewrites the file, a cost the lines it drops (more than
        half) paid for.  A topic that does not exist (or not yet, or no more) is left alone.  A file
        that could not be rewritten is logged and left as it was."""
        for topic_name, book in self._books():
            topic = get_existing_topic(topic_name)
            if topic is None:
                continue
            if not book.big_enough():
                continue
            bound = topic.held_count()  # (a lock per channel, taken only for a file worth compacting)
            if bound is None or not book.compaction_due(bound):
                continue
            known = book.begin_compaction()  # (before the reading: see begin_compaction)
            try:
                held = topic.held_ids()
            except Exception as e:  # (a disk queue's read failed: the scanner thread must not die)
                self._log.error("TOPIC(%s): could not read its messages to compact the provenance of its "
                                "dead letters - %s", topic_name, e)
                continue
            if held is None:
                continue  # (the durable pump has a batch in hand: the next pass tries again)
            try:
                dropped = book.finish_compaction(known, {msg_id.decode("ascii", "replace") for msg_id in held})
            except OSError as e:
                self._log.error("TOPIC(%s): failed to compact the provenance of its dead letters - %s",
                                topic_name, e)
                continue
            self._log.info("TOPIC(%s): compacted the provenance of its dead letters: %d stale lines dropped",
                           topic_name, dropped)

    def _books(self):
        """``[(topic name, TopicProvenance)]`` of the files to watch: each dead-letter topic used since
        the start, and (listed once) each provenance file the data directory holds."""
        with self._lock:
            if not self._listed:
                self._listed = True
                try:
                    names = os.listdir(self._data_path or ".")
                except OSError:
                    names = []
                for name in names:
                    if name.endswith(store.FILE_SUFFIX) and name != store.FILE_SUFFIX:
                        topic_name = name[:-len(store.FILE_SUFFIX)]
                        if topic_name not in self._topics:
                            self._topics[topic_name] = TopicProvenance(
                                store.file_path(self._data_path, topic_name), self._durable, self._boot)
            return list(self._topics.items())

    def forget(self, topic_name):
        """The topic is deleted: its provenance (file included) goes with it."""
        with self._lock:
            book = self._topics.pop(topic_name, None)
        if book is None:
            book = TopicProvenance(None if topic_name.endswith("#ephemeral")
                                   else store.file_path(self._data_path, topic_name), False)
        book.delete()
