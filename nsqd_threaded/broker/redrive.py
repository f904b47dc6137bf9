"""Redrive (not in Go nsqd): dead letters sent back from a dead-letter channel to where they came from.

``POST /channel/redrive`` (``BrokerCore.redrive``) takes up to ``n`` messages from
the head of a channel (of a dead-letter topic, usually), publishes each to
its source topic (its provenance's ``topic``, :mod:`.provenance`) or to the
one the operator names, as a new message there (attempts start anew), and
only then lets them leave the channel.  It is at least once, as a delivery
to a consumer is: while the publishes run, the messages are in flight to the
redrive (:data:`REDRIVE_OWNER`); a crash before they leave finds them still
in the channel (under ``--durable``, and what its disk queue had synced
otherwise), so a message may reach its destination twice, never zero times.
A publish that fails, and a message with nowhere to go, puts the messages
not yet published back at the head of the channel, in their order.
"""

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

    def take_for_redrive(self, n):
        """Up to ``n`` Messages from the head of the queue, now in flight to the redrive (attempts
        unchanged); None when the channel is closing."""
        with self._lock:
            if self.exiting:
                return None
            msgs = from_records(self._take_locked(n))
            if not msgs:
                return []
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
