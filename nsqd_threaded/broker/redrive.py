"""Redrive (not in Go nsqd): dead letters sent back from a dead-letter channel to where they came from.

``POST /channel/redrive`` (``BrokerCore.redrive``) takes up to ``n`` messages from
the head of a channel (of a dead-letter topic, usually), publishes each to
its source topic (its provenance's ``topic``, :mod:`.provenance`) or to the
one the operator names, as a new message there (attempts start anew), and
only then lets them leave the channel.  While the publishes run, the messages
are in flight to the redrive (:data:`REDRIVE_OWNER`).  A publish that fails,
and a message with nowhere to go, puts the messages not yet published back at
the head of the channel, in their order.

A crash: under ``--durable`` a kill at any instant moves each message once.
Right before a destination's records are written, the channel's redrive
journal (:mod:`nsqd_threaded.storage.redrive_journal`) says where each goes;
a restarted broker reads it before any delivery (:meth:`ChannelRedriveMethods.recover_redrive`)
and lets go unread the messages found written in their destination
(:meth:`ChannelRedriveMethods._let_go_redriven_locked`); one never written there
stays in the channel.  Otherwise it is at least once, as a delivery to a
consumer is: a crash before the messages leave finds them still in the
channel (what its disk queue had synced), and may find them in their
destination too.
"""

from ..storage import redrive_journal
from ..wire.message import from_records, held_fields

REDRIVE_OWNER = -1  # the in-flight owner of messages a redrive holds (no client has a negative ID)


class RedriveError(Exception):
    """A redrive that stopped: ``code`` is the HTTP error nsqd answers, ``moved`` what it moved before."""

    def __init__(self, code, moved, text=""):
        super().__init__(text or code)
        self.code = code
        self.moved = moved


class ChannelRedriveMethods:
    """What a Channel does for a redrive: a base of :class:`~.channel.Channel`, kept here with the rest of it.

    Its methods take the channel's ``_lock`` as every public Channel method
    does; ``redrive_count`` (messages redriven out of the channel since the
    broker started) is guarded by it.
    """

    redrive_count = 0
    # IDs (bytes) of messages a redrive cut short by a kill had written to their destination: let go
    # unread when next taken (recover_redrive; guarded by the channel's lock).  Empty nearly always.
    _redriven = frozenset()

    def redrive_journal_path(self):
        """This channel's redrive journal (``--durable``, a channel with a disk queue), else None."""
        if self.ephemeral or not self._nsqd.options.durable:
            return None
        return redrive_journal.file_path(self._nsqd.data_path, "%s:%s" % (self.topic_name, self.name))

    def recover_redrive(self, get_existing_topic):
        """Startup (``--durable``), before any delivery: read the journal a killed redrive left; the
        messages it names whose new record is in their destination (``get_existing_topic(name)``)
        leave the channel unread the next time it takes them.  Returns how many."""
        path = self.redrive_journal_path()
        if path is None:
            return 0
        try:
            lines = redrive_journal.read(path)
        except OSError as e:
            self._nsqd.log.error("%r: failed to read the redrive journal %s - %s", self, path, e)
            return 0
        moved = []  # (written in their destination: taken without this channel's lock, as the topics are)
        for msg_id, source, topic_name, new_id, at in lines:
            topic = get_existing_topic(topic_name)
            if topic is not None and topic.holds_announced(new_id, at):
                moved.append((msg_id, source))  # (the others were never written there: they stay)
        with self._lock:
            held = {msg_id for msg_id, source in moved  # (not: it had left the channel before the kill)
                    if source is None or self._backend.holds_undone(source[0], source[1], msg_id)}
            self._redriven = held
            if not held:
                redrive_journal.remove(path)
        return len(held)

    def queue_positions(self, msgs):
        """Where the records of these Messages (in flight here) are in the channel's disk queue (each a
        ``(file num, pos)``, or None when the backend cannot tell)."""
        with self._lock:
            return [self._backend.position_of(m.id) for m in msgs]

    def _let_go_redriven_locked(self, msgs):
        """Of ``msgs`` (just taken from the queue), those a killed redrive had already written to their
        destination leave the channel unread (acknowledged); returns the others."""
        redriven = self._redriven
        kept = [m for m in msgs if bytes(m.id) not in redriven]
        if len(kept) < len(msgs):
            gone = [bytes(m.id) for m in msgs if bytes(m.id) in redriven]
            self._backend.ack(gone)
            redriven.difference_update(gone)
            if not redriven:  # (their done-log entries are written: the journal has said all it had to)
                self._nsqd.remove_redrive_journal(self.redrive_journal_path())
        return kept

    def _forget_redrive_journal_locked(self):
        """The channel is emptied or deleted: what its journal names is gone, and so is the journal."""
        path = self.redrive_journal_path()
        if path is not None:
            self._redriven = frozenset()
            redrive_journal.remove(path)

    def redrive_ended(self):
        """A redrive of this channel ended, its done-log entries written: its journal goes, unless it
        still names messages a killed redrive moved and this run has not let go yet."""
        path = self.redrive_journal_path()
        if path is not None:
            with self._lock:
                if not self._redriven:
                    redrive_journal.remove(path)

    def take_for_redrive(self, n):
        """Up to ``n`` Messages from the head of the queue, now in flight to the redrive (attempts
        unchanged); None when the channel is closing."""
        with self._lock:
            if self.exiting:
                return None
            while True:
                msgs = from_records(self._take_locked(n))
                if not msgs:
                    return []
                if self._redriven:
                    msgs = self._let_go_redriven_locked(msgs)
                    if not msgs:
                        continue
                break
            now = self._now_ns()
            for msg in msgs:
                msg.client_id = REDRIVE_OWNER
                msg.delivery_ns = now
            added = self._in_flight.add_many(msgs, now + self._max_msg_timeout_ns)
            self.mark_scan_locked()
            if len(added) < len(msgs):  # an ID a consumer has in flight already: that copy is the one kept
                msgs = [m for m in msgs if m in added]
        if self._watch.watchers:
            self._watch.notify()
        return msgs

    def dead_letter_of(self, msg_id, body):
        """Where this channel's message (ID text, body bytes) came from, if it is a dead letter: its
        provenance (:mod:`.provenance`), None otherwise.  Takes no channel lock."""
        return self._nsqd.dead_letter_provenance.lookup(self.topic_name, msg_id, body)

    def finish_redrive(self, msgs):
        """These were published to their destination: they leave the channel (a durable backend forgets them)."""
        with self._lock:
            done, _ = self._in_flight.remove_owned([m.id for m in msgs], REDRIVE_OWNER)
            if done and self._backend.acks_deliveries:
                self._backend.ack([m.id for m in done])
            self.redrive_count += len(done)
        if self._watch.watchers:
            self._watch.notify()

    def return_redrive(self, msgs):
        """These were not published: back at the head of the queue, in their order."""
        with self._lock:
            done, _ = self._in_flight.remove_owned([m.id for m in msgs], REDRIVE_OWNER)
            if done and not self.exiting:
                self._memory.extendleft(reversed(done))
                waiters = self._take_waiters_locked()
            else:
                waiters = ()  # (a closing channel flushed them with its in-flight ones)
        for client in waiters:
            client.wake()
        if self._watch.watchers:
            self._watch.notify()


def redrive_destinations(channel, msgs, to):
    """Each message's destination topic: ``to``, else its provenance's source topic (None: unknown)."""
    if to:
        return [to] * len(msgs)
    out = []
    for msg in msgs:
        msg_id, body, _, _ = held_fields(msg)
        doc = channel.dead_letter_of(bytes(msg_id).decode("ascii", "replace"), bytes(body))
        out.append(doc["topic"] if doc is not None else None)
    return out


REDRIVE_BATCH = 1024  # messages a redrive takes out of the channel at a time


# The test hook: a broker that exits inside a redrive, to show what a kill there does.  "line": right after
# the journal's lines, before the destination's records; "published": once they are written and synced,
# before the messages leave the channel; "left": once they left it, before the journal is removed.
EXIT_IN_REDRIVE_ENV = "NSQD_THREADED_TEST_EXIT_IN_REDRIVE"

