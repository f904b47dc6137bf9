"""Delivery policies of a channel (not in Go nsqd): max attempts, message TTL, a dead-letter topic.

Go nsqd delivers a message until a consumer finishes it; giving up is each
client library's decision, and a message a client gives up on is gone.  A
policy lets the broker decide (see docs/policies.md):

* ``max_attempts``: a message is not delivered more than this many times
  (REQs and timeouts both count, as the message's ``attempts`` does);
* ``msg_ttl_ns``: a message older than this (since it was published) is
  not delivered;
* ``dead_letter_topic``: where such a message is published, with the same
  body; without one it is dropped.

A channel's own :class:`Policy` is set over HTTP (``/channel/policy``) and
kept in nsqd.dat; the broker-wide defaults are flags (``--max-attempts``,
``--msg-ttl``, ``--dead-letter-topic``, a pattern).  Each field of the own
policy is None (inherit: the default applies) or the channel's own choice,
which may be "nothing" (0: unlimited, "": drop, 0: no TTL) and then wins
over a default just as any other value does.  The defaults
do not apply to a topic that is itself a dead-letter topic, by the pattern or
named by a channel's own policy (:class:`DeadLetterNames`): its messages would
otherwise move on to a dead-letter topic of their own.

A channel to which no policy applies has ``Channel.policy`` None and checks
nothing else on delivery.  Otherwise a :class:`ChannelPolicy` screens each
batch the channel takes for a consumer (:meth:`ChannelPolicy.screen_locked`):
what it takes out waits in its ``moving`` map until the queue scanner's
visit publishes it to the dead-letter topic and only then lets it leave the
channel (``Channel.move_dead_letters``): a crash in between finds it still
in the channel (at least once; it may appear twice, never zero times).
Under ``--durable`` it appears once: the provenance line of a dead letter is
written with the dead-letter topic's lock held, right before the dead letter
(``Topic.publish_announced``' ``announce``), and a move the channel
repeats after a kill of the broker finds it there and only lets the message
go (:meth:`DeadLetterProvenance.moved_before`).  The line goes first, with
where the dead letter is written: a kill between the two leaves a line whose
dead letter is not at its position, and the move is made again, once.
"""

import collections
import os
import threading

from ..settings.options import DEAD_LETTER_TOPIC_PLACEHOLDER, MAX_ATTEMPTS_LIMIT, expand_dead_letter_topic
from ..wire.protocol_v2 import is_valid_name
from .provenance import MAX_ATTEMPTS, MSG_TTL, dead_letter_doc

# Tests only: set in a child broker's environment, it makes the broker exit at once (as a SIGKILL would
# leave it) after a dead-letter move's publish and before the source channel lets the messages go.
EXIT_IN_MOVE_ENV = "NSQD_THREADED_TEST_EXIT_IN_DEAD_LETTER_MOVE"

# The most messages a channel's policy holds taken out at once.  A take that finds this many waiting to
# be moved returns what it has (possibly nothing, the consumer then waits): a backlog of expired
# messages is screened and moved a bounded batch per scanner visit, never all of it under one hold of
# the channel's lock nor all of it in memory; the visit that moves a batch wakes the waiting consumers.
MOVING_MAX = 4096


class Policy(collections.namedtuple("Policy", "max_attempts dead_letter_topic msg_ttl_ns")):
    """One channel's own policy, or an effective one (the broker's defaults, what applies to a channel).

    An own policy's field is None when the channel inherits it (the broker's default applies), else the
    channel's own choice, 0 and "" included (unlimited, drop, no TTL).  An effective policy has no None:
    0 and "" there mean nothing applies (unlimited, drop, none)."""

    __slots__ = ()

    def as_json(self):
        """The JSON of ``/channel/policy`` and ``/stats``: ``msg_ttl`` in integer milliseconds, null: inherited."""
        return {"max_attempts": self.max_attempts, "dead_letter_topic": self.dead_letter_topic,
                "msg_ttl": None if self.msg_ttl_ns is None else self.msg_ttl_ns // 1000000}

    def stored_json(self):
        """The JSON nsqd.dat keeps: :meth:`as_json` marked with ``"format": 2``, which tells its nulls
        (inherited) from the 0 and "" that files written before own settings could be "nothing" meant
        "inherit" in (see :meth:`from_json`)."""
        doc = self.as_json()
        doc["format"] = STORED_FORMAT
        return doc

    @classmethod
    def from_json(cls, doc):
        """Inverse of :meth:`stored_json` (nsqd.dat); missing keys are inherited, bad values raise ValueError.

        A policy without ``"format"`` was written before a channel's own setting could be "nothing":
        there 0 and "" meant inherit, and still do."""
        stored_format = doc.get("format")
        if stored_format not in (None, STORED_FORMAT) or isinstance(stored_format, bool):
            raise ValueError("invalid channel policy %r" % (doc,))
        max_attempts = doc.get("max_attempts")
        dead_letter_topic = doc.get("dead_letter_topic")
        msg_ttl = doc.get("msg_ttl")
        for value, ok in ((max_attempts, isinstance(max_attempts, int) and 0 <= max_attempts <= MAX_ATTEMPTS_LIMIT),
                          (msg_ttl, isinstance(msg_ttl, int) and msg_ttl >= 0),
                          (dead_letter_topic, dead_letter_topic == "" or (isinstance(dead_letter_topic, str)
                                                                          and is_valid_name(dead_letter_topic)))):
            if value is not None and (not ok or isinstance(value, bool)):
                raise ValueError("invalid channel policy %r" % (doc,))
        if stored_format is None:  # (the format before: 0 and "" were unset)
            max_attempts, dead_letter_topic, msg_ttl = max_attempts or None, dead_letter_topic or None, msg_ttl or None
        return cls(max_attempts, dead_letter_topic, None if msg_ttl is None else msg_ttl * 1000000)


# Marks a stored own policy whose 0 and "" are the channel's own choice (see Policy.from_json).
STORED_FORMAT = 2

# An own policy that inherits every field: the channel has no policy of its own.
NO_POLICY = Policy(None, None, None)

# An effective policy under which nothing applies: no limit, no TTL, nowhere to move to.
NOTHING = Policy(0, "", 0)


def broker_defaults(options):
    """The defaults the flags set (``dead_letter_topic`` is the pattern)."""
    return Policy(options.max_attempts, options.dead_letter_topic, int(round(options.msg_ttl * 1e9)))


def is_dead_letter_topic(pattern, topic_name):
    """Whether ``topic_name`` is the dead-letter topic the pattern names for some topic."""
    if not pattern:
        return False
    head, sep, tail = pattern.partition(DEAD_LETTER_TOPIC_PLACEHOLDER)
    if not sep:
        return topic_name == pattern
    rest = tail.split(DEAD_LETTER_TOPIC_PLACEHOLDER)
    # Every placeholder stands for the same name: try each length that fits.
    fixed = len(head) + sum(map(len, rest))
    count = len(rest)
    room = len(topic_name) - fixed
    if room <= 0 or room % count:
        return False
    name = topic_name[len(head):len(head) + room // count]
    return expand_dead_letter_topic(pattern, name) == topic_name


def effective_policy(own, defaults, topic_name, named=False):
    """The policy that applies to a channel of ``topic_name``: its own fields over the defaults.

    A field the channel inherits (None) takes the default's; one it sets, 0 and "" included, is its own.
    The defaults do not apply to a dead-letter topic, whether the defaults' pattern or (``named``) a
    channel's own policy names it: dead letters never move on to a dead-letter topic of their own."""
    if named or not any(defaults) or is_dead_letter_topic(defaults.dead_letter_topic, topic_name):
        defaults = NOTHING
    dead_letter_topic = own.dead_letter_topic
    if dead_letter_topic is None:
        dead_letter_topic = ""
        if defaults.dead_letter_topic:
            dead_letter_topic = expand_dead_letter_topic(defaults.dead_letter_topic, topic_name)
            if not is_valid_name(dead_letter_topic) or dead_letter_topic == topic_name:
                dead_letter_topic = ""  # (a name too long for this topic: its messages are dropped)
    return Policy(defaults.max_attempts if own.max_attempts is None else own.max_attempts, dead_letter_topic,
                  defaults.msg_ttl_ns if own.msg_ttl_ns is None else own.msg_ttl_ns)


def channel_policy(topic_name, own, options, previous=None, named=False):
    """The :class:`ChannelPolicy` of a channel with this own policy, or None when it has none and
    no default applies.

    ``previous`` (the channel's current one) hands over its counters and the
    messages it is moving; ``named``: a channel's own policy names ``topic_name`` as its dead-letter topic.
    A channel whose own policy sets a field keeps a ChannelPolicy even when nothing applies (its own
    "unlimited", "drop" or "no TTL" is kept, shown and stored).
    """
    defaults = broker_defaults(options)
    effective = effective_policy(own, defaults, topic_name, named)
    if effective == NOTHING and own == NO_POLICY:
        return None
    return ChannelPolicy(own, effective, previous, effective_policy(NO_POLICY, defaults, topic_name, named))


class ChannelPolicy:
    """The policy in force on one channel, and what it took out.

    Every attribute is guarded by the channel's ``_lock``: ``moving`` (message
    ID -> Message, taken out and not yet published to the dead-letter topic
    and let go), and the counters ``dead_letter_count`` (taken out for max
    attempts) and ``expired_count`` (for the TTL), which count a message
    whether it was moved or dropped.
    """

    __slots__ = ("own", "effective", "max_attempts", "ttl_ns", "dead_letter_topic", "moving",
                 "dead_letter_count", "expired_count", "failing", "reasons", "inherited")

    def __init__(self, own, effective, previous=None, inherited=None):
        self.own = own
        self.effective = effective
        self.inherited = effective if inherited is None else inherited  # what the defaults alone would give
        self.max_attempts = effective.max_attempts
        self.ttl_ns = effective.msg_ttl_ns
        self.dead_letter_topic = effective.dead_letter_topic
        if previous is None:
            self.moving = {}
            self.dead_letter_count = self.expired_count = 0
            self.failing = False  # the last move failed (logged once until one succeeds)
            self.reasons = {}  # message ID -> why it is in ``moving`` (provenance.MAX_ATTEMPTS or MSG_TTL)
        else:
            self.reasons = previous.reasons
            self.moving = previous.moving
            self.dead_letter_count = previous.dead_letter_count
            self.expired_count = previous.expired_count
            self.failing = previous.failing

    def screen_locked(self, msgs, now_ns):
        """The messages of a batch about to be delivered that may be; the others go to ``moving``.

        ``attempts`` counts the deliveries so far: the next one would be
        ``attempts + 1``.  A message over both limits counts as a dead letter.
        """
        max_attempts = self.max_attempts
        oldest = now_ns - self.ttl_ns if self.ttl_ns else None
        kept = []
        moving = self.moving
        for msg in msgs:
            if max_attempts and msg.attempts >= max_attempts:
                moving[msg.id] = msg
                self.reasons[msg.id] = MAX_ATTEMPTS
                self.dead_letter_count += 1
            elif oldest is not None and msg.timestamp < oldest:
                moving[msg.id] = msg
                self.reasons[msg.id] = MSG_TTL
                self.expired_count += 1
            else:
                kept.append(msg)
        return kept

    def full_locked(self):
        """Whether the next take should stop screening (see :data:`MOVING_MAX`)."""
        return len(self.moving) >= MOVING_MAX

    def moved_locked(self, msgs):
        """These messages reached the dead-letter topic (or were dropped): no longer moving."""
        moving = self.moving
        for msg in msgs:
            if moving.get(msg.id) is msg:
                del moving[msg.id]
                self.reasons.pop(msg.id, None)

    def clear_locked(self):
        """Nothing is being moved any more (the channel emptied, or its messages went back to its queue)."""
        self.moving.clear()
        self.reasons.clear()

    def stats_locked(self):
        """The /stats fields: the effective policy (``msg_ttl`` in ms), the counters, then the channel's
        own policy (null: inherited) and what the broker's defaults give it (``default_policy``)."""
        doc = self.effective.as_json()
        doc["dead_letter_count"] = self.dead_letter_count
        doc["expired_count"] = self.expired_count
        doc["own_policy"] = self.own.as_json()
        doc["default_policy"] = self.inherited.as_json()
        return doc


class DeadLetterNames:
    """The topics that channels' own policies name as their dead-letter topic, counted: one per broker.

    ``_lock`` guards ``_counts`` (topic name -> channels naming it); taken alone, never with another lock.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._counts = {}

    def __contains__(self, topic_name):
        with self._lock:
            return topic_name in self._counts

    def change(self, old, new):
        """A channel's own dead-letter topic went from ``old`` to ``new`` ("": none); returns the names
        that became named or stopped being named (their channels' defaults change)."""
        if old == new:
            return ()
        changed = []
        with self._lock:
            if old:
                left = self._counts.get(old, 0) - 1
                if left > 0:
                    self._counts[old] = left
                else:
                    self._counts.pop(old, None)
                    changed.append(old)
            if new:
                count = self._counts.get(new, 0)
                self._counts[new] = count + 1
                if not count:
                    changed.append(new)
        return changed


class ChannelPolicyMethods:
    """What a Channel does with its policy: a base of :class:`~.channel.Channel`, kept here with the rest of it.

    Its methods are the channel's own: they use its lock (``_lock``, taken as
    every public Channel method takes it), its queue and backend, and set its
    ``policy`` attribute (guarded by that lock).
    """

    def set_policy(self, own):
        """Make ``own`` (a :class:`Policy`) this channel's own policy, over the broker's defaults.

        Messages being moved when no policy applies any more go back to the
        queue: they never left the channel.
        """
        waiters = ()
        nsqd = self._nsqd
        named = self.topic_name in nsqd.dead_letter_names
        with self._lock:
            previous = self.policy
            before = NO_POLICY if previous is None else previous.own
            self.policy = channel_policy(self.topic_name, own, nsqd.options, previous, named)
            # (an own policy of "nothing" takes nothing out either: what the last one took goes back too)
            if (self.policy is None or self.policy.effective == NOTHING) and previous is not None and previous.moving:
                back = list(previous.moving.values())
                previous.clear_locked()
                waiters = self._requeue_locked(back)
        for client in waiters:
            client.wake()
        self._named_dead_letters(before.dead_letter_topic, own.dead_letter_topic)

    def refresh_policy(self):
        """Work out the effective policy again (whether this topic is a named dead-letter topic changed)."""
        self.set_policy(self.own_policy())

    def forget_policy(self):
        """The channel is deleted: its own policy no longer names a dead-letter topic."""
        self._named_dead_letters(self.own_policy().dead_letter_topic, "")

    def _named_dead_letters(self, old, new):
        """Count the change of this channel's own dead-letter topic; a topic that became (or stopped
        being) named gets its channels' policies worked out again (with broker defaults only)."""
        nsqd = self._nsqd
        for name in nsqd.dead_letter_names.change(old, new):
            topic = nsqd.get_existing_topic(name)
            if topic is not None and any(broker_defaults(nsqd.options)):
                for channel in topic.channels():
                    channel.refresh_policy()

    def own_policy(self):
        """The policy set on this channel itself (NO_POLICY when none: the defaults alone apply)."""
        policy = self.policy  # (one read: set_policy replaces it whole)
        return NO_POLICY if policy is None else policy.own

    def move_dead_letters(self):
        """The queue scanner's part of a policy: publish what it took out to the dead-letter topic,
        and only then let it leave the channel (a durable backend forgets it only now).  A refused
        publish keeps them for the next visit."""
        with self._lock:
            policy = self.policy
            if policy is None or not policy.moving:
                return
            msgs = list(policy.moving.values())  # (in the order they were taken out: the channel's)
            reasons = [policy.reasons.get(msg.id, MSG_TTL) for msg in msgs]
            topic_name = policy.dead_letter_topic
            failing = policy.failing
        # (No lock held: the publish takes the dead-letter topic's, and may wait for its fsync.)
        moved = not topic_name or publish_dead_letters(self._nsqd, self, topic_name, msgs, reasons, failing)
        if moved and topic_name and os.environ.get(EXIT_IN_MOVE_ENV) == "1":
            os._exit(137)  # (the test hook: inside the window a repeated move must be told by)
        with self._lock:
            policy.failing = not moved
            if not moved:
                return
            policy.moved_locked(msgs)
            if self.exiting:
                return  # (a closing channel flushed them: seen again after a restart)
            self._backend.ack([msg.id for msg in msgs])
            # A take may have stopped at MOVING_MAX with more queued: its consumer waits for this.
            waiters = self._take_waiters_locked() if self._memory or self._backend.depth() else ()
        for client in waiters:
            client.wake()


def publish_dead_letters(nsqd, channel, topic_name, msgs, reasons, failing):
    """Publish the messages to the dead-letter topic (created if need be) in their order, bodies and
    original timestamps unchanged, keeping where each came from (``reasons``: why each was taken
    out; :mod:`.provenance`); False if the topic refused (logged unless ``failing``: it refused last
    time too).

    The provenance lines are appended right before the dead letters are written (the topic's lock
    held, fsynced after the publish), each with where its dead letter goes under ``--durable``; then
    the messages an earlier run of the broker had already written there (a line for each, and the
    dead letter at its position) are not published again, only let go."""
    provenance = nsqd.dead_letter_provenance
    try:
        dead_letters = nsqd.get_topic(topic_name)
    except Exception as e:  # (as a refused publish below: retried at the scanner's next visit)
        if not failing:
            nsqd.log.error("%r: failed to move %d messages to dead-letter topic %s (retrying) - %s",
                           channel, len(msgs), topic_name, e)
        return False
    before = provenance.moved_before(topic_name, channel.topic_name, channel.name, msgs,
                                     dead_letters.holds_announced)
    if before:
        nsqd.log.info("%r: %d dead letters were in %s before the restart: not moved again",
                      channel, len(before), topic_name)
        kept = [(msg, reason) for msg, reason in zip(msgs, reasons) if bytes(msg.id) not in before]
        msgs, reasons = [m for m, _ in kept], [r for _, r in kept]
        if not msgs:
            return True
    at_ns = nsqd.clock.time_ns()
    docs = [dead_letter_doc(channel.topic_name, channel.name, reason, msg, at_ns) for msg, reason in zip(msgs, reasons)]

    def announce(ids):  # (appended with the dead-letter topic's lock held, right before the records)
        append = provenance.prepare(topic_name, ids, msgs, docs)
        if os.environ.get(EXIT_IN_MOVE_ENV) == "line":
            def append_and_exit(positions):
                append(positions)
                os._exit(137)  # (the test hook: a kill between the line and the dead letter)
            return append_and_exit
        return append

    try:
        dead_letters.publish_announced([msg.timestamp for msg in msgs], [msg.body for msg in msgs], announce)
    except Exception as e:  # (TopicError, a backend's: the scanner thread retries, it must not die)
        if not failing:
            nsqd.log.error("%r: failed to move %d messages to dead-letter topic %s (retrying) - %s",
                           channel, len(msgs), topic_name, e)
        return False
    provenance.sync(topic_name)
    return True
