"""Topic: where messages are published, and the fan-out to its channels.

Go nsqd puts every message into the topic's Go channel and a pump goroutine
copies it to every channel.  Here the publisher's own thread fans out while
it holds the topic lock, whenever nothing is waiting ahead of it (the topic
has channels, is not paused, and its backlog is empty): no thread hand-off on
the publish path, and order is kept.  Otherwise the messages wait in the
topic's backlog (memory queue up to --mem-queue-size, then the backend), and
the topic's pump thread drains the backlog once fan-out is possible again.
Records and Messages (see :mod:`nsqd_threaded.wire.message`): a publish
builds records, or Messages while a channel has a consumer or for a delay;
the backlog keeps records (and Messages with a delay); a channel queues what
the fan-out gives it and makes a Message of a record when it delivers it.

A backend that acknowledges deliveries (``--durable``) changes the policy:
every publish is written there first and acknowledged once fsynced, and the
pump fans out from it, acknowledging a batch there once every channel's copy
is fsynced.

As Go's topic waits on its ``startChan``, the pump runs only from
:meth:`Topic.start` on, which NSQD calls once its listeners are bound.
"""

import itertools
import threading
import time

from ..storage.backend import BackendError
from ..wire.message import (DEFERRED, MESSAGES, RECORD_HEADER, RECORDS, Message, as_records, batch_form, copy_batches,
                            timestamped_records, held_fields, new_records)
from ..wire.protocol_v1 import encode_register, encode_unregister
from .backed_queue import BackedQueue
from .channel import Channel, ChannelError
from .delivery import DIRECT_DELIVERY_BYTES, DirectDeliveries
from .guid import GUIDFactory

PUMP_BATCH = 1024  # backlog entries the pump fans out per hold of the topic lock


class TopicError(Exception):
    """A publish failure whose text nsqd sends (``exiting`` or a backend error)."""


class Topic(BackedQueue):
    """A topic.

    ``_lock`` (BackedQueue's) guards the channel map, the backlog (memory and
    backend), ``paused``/``exiting``/``_started``/``_held``/``_batch_in_hand``/``_replay_skips``, the counters, and
    the pre-creation bookkeeping (``_channel_deletions``, ``_deleted_channels``,
    ``_precreations``).
    ``_backlog_ready`` (a Condition on ``_lock``) signals the pump that the
    backlog may now be drained or that it must exit.
    """

    def __init__(self, name, nsqd, held=False):
        self.name = name
        self.ephemeral = name.endswith("#ephemeral")
        options = nsqd.options
        super().__init__(nsqd, nsqd.new_backend(name, self.ephemeral), options.mem_queue_size)
        self._backlog_ready = threading.Condition(self._lock)  # signals: the pump can drain, or must exit
        # Publishers fan out themselves unless the backend must see every message first.
        self._inline_fan_out = not self._backend.acks_deliveries
        self._channels = {}
        self._now_ns = nsqd.clock.time_ns  # the broker's clock: message timestamps (time skipping moves it)
        self._guid = GUIDFactory(options.node_id, self._now_ns)
        self.paused = False
        self._batch_in_hand = False  # the durable pump took a batch and has not acknowledged it yet
        self._replay_skips = {}  # durable, after a restart: channel -> replayed messages it holds already
        self.exiting = False
        self._started = False
        # ``held``: publishers do not fan out before start() (its channels may still be
        # pre-created from nsqlookupd; the backlog keeps the messages for all of them).
        self._held = held
        self._delete_scheduled = False
        # Until the cluster has answered for this topic's channels (from begin_precreation to
        # end_precreation), a deleted channel's name is kept with its deletion's number, so
        # that an answer sent before the deletion does not create the channel again.
        self._channel_deletions = 0
        self._deleted_channels = {}  # name -> number of its last deletion, while _precreations
        self._precreations = 0
        self.message_count = 0
        self.message_bytes = 0
        self._pump = threading.Thread(target=self._pump_loop, name="nsqd-topic-pump[%s]" % name, daemon=True)

    def start(self):
        """Start the pump (once; not after close()).  Publishing works before it,
        the backlog just waits."""
        with self._lock:
            if self._started or self.exiting:
                return
            self._started = True
            self._held = False
            if self._backend.acks_deliveries and self._channels:
                self._replay_skips = self._plan_replay_locked()
            self._pump.start()

    def __repr__(self):
        return "Topic(%s)" % self.name

    # -- publishing --------------------------------------------------------

    def new_ids(self, n):
        return self._guid.new_ids(n)

    def publish_one(self, body):
        """``publish([body])``, a PUB's (and :meth:`publish`'s for one body); ``body`` is bytes-like (a bytearray slice is
        kept only as part of a record, otherwise as bytes).

        Its form is :meth:`publish`'s, made without the batch's lists.  Into a
        topic without channels (how a backlog fills) with room in the memory
        queue, the record is appended here: the same checks and counters as
        :meth:`_put`, none of its other machinery.  Anything else (channels,
        a full memory queue, the backend) is :meth:`_put`'s.
        """
        now = self._now_ns()
        if self._channels and self._consumed():
            body = bytes(body)
            self._put([Message(self._guid.new_id(now), body, now)], len(body), MESSAGES)
            return
        record = RECORD_HEADER.pack(now, 0, self._guid.new_id(now)) + body
        with self._lock:
            if self.exiting:
                raise TopicError("exiting")
            memory = self._memory
            if not self._channels and len(memory) < self._mem_capacity:
                memory.append(record)  # (no pump to notify: it drains only into channels)
                self.message_count += 1
                self.message_bytes += len(body)
                if self._watch.watchers:
                    self._watch.notify()  # (its lock is a leaf: fine under ours)
                return
        self._put([record], len(body), RECORDS)

    def publish(self, bodies, defer_ns=0):
        """New messages for these bodies (IDs, one shared timestamp); raises TopicError.

        Their form (see :mod:`nsqd_threaded.wire.message`) depends on where
        they are likely to go.  While a channel has a consumer they are taken
        soon after: they are built as Messages (copied per channel by the
        fan-out), which is cheaper than a record that a consumer's pump turns
        into a Message.  Otherwise they are built as records, which wait in
        the queues for less.  A DPUB's are Messages (a record has no field
        for the delay).
        """
        if len(bodies) == 1 and not defer_ns:
            self.publish_one(bodies[0])
            return
        now = self._now_ns()  # one timestamp object for the batch: less memory per queued message
        size = len(bodies[0]) if len(bodies) == 1 else sum(map(len, bodies))
        if defer_ns:
            msgs = list(map(Message, self._guid.new_ids(len(bodies)), bodies, itertools.repeat(now),
                            itertools.repeat(0), itertools.repeat(defer_ns)))
            self._put(msgs, size, DEFERRED)
        elif self._consumed():
            self._put(list(map(Message, self._guid.new_ids(len(bodies)), bodies, itertools.repeat(now))),
                      size, MESSAGES)
        else:
            self._put(new_records(now, self._guid.new_id_blocks(len(bodies)), bodies), size, RECORDS)

    def publish_announced(self, timestamps, bodies, announce=None):
        """New messages for these bodies in this order, each with its own timestamp (attempts 0),
        written to the disk queue with where they go told first; returns their IDs; raises TopicError.
        A dead-letter move (:mod:`.provenance`) and, under ``--durable``, a redrive (:mod:`.redrive`)
        publish this way.

        ``announce(ids)`` is called before they are written and returns what is called with the
        topic's lock held, right before they are written: ``(positions)``, where the backend will
        write each (``[(file num, pos)]``; None when it cannot say, outside durable mode).  What it
        writes (their provenance, or a redrive's journal lines, with those positions) is in the data
        directory whenever they are, at a kill of the process; a move repeated after a restart finds
        each message at its position, or not (a kill between the two: it was never written)."""
        ids = self._guid.new_ids(len(bodies))
        self._put(timestamped_records(ids, timestamps, bodies), sum(map(len, bodies)), RECORDS,
                  before=None if announce is None else announce(ids))
        return ids

    def holds_announced(self, msg_id, position):
        """Whether the message ``msg_id`` (bytes) that :meth:`publish_announced` announced at
        ``position`` was written (is stored, or was consumed); False outside durable mode."""
        return self._backend.holds_record(position[0], position[1], msg_id)

    def _consumed(self):
        """A hint, read without the lock: does a channel have a consumer?"""
        if not self._channels:
            return False
        for channel in list(self._channels.values()):  # (a copy: channels come and go meanwhile)
            if channel.has_clients():
                return True
        return False

    def _put(self, entries, size, form, before=None):
        """Fan out the entries, or queue them in the backlog (see the module's docstring);
        counted once accepted.  ``form``: what they are (``wire.message``'s RECORDS,
        MESSAGES or DEFERRED).  ``before(positions)`` (RECORDS): called with the lock held
        (it may take only a leaf lock) before they are stored, with where a durable backend
        will write them (:meth:`DiskQueue.positions_of`; None elsewhere).

        The fan-out may deliver some directly to waiting consumers: their
        outputs, reserved under the locks, are written and released in the
        ``finally``, once no lock is held (:class:`~.delivery.DirectDeliveries`).

        Durable mode: written to the topic's disk queue and acknowledged only
        after an fsync that concurrent publishers share (group commit).
        """
        token = None
        # (None: every waiting consumer's pump is woken instead; see delivery.DIRECT_DELIVERY_BYTES)
        deliveries = DirectDeliveries() if size <= DIRECT_DELIVERY_BYTES or len(entries) == 1 else None
        try:
            with self._lock:
                if self.exiting:
                    raise TopicError("exiting")
                if before is not None:  # (durable: every entry goes to the disk queue, in this order)
                    before(self._backend.positions_of(entries) if self._backend.acks_deliveries else None)
                try:
                    if (
                        self._inline_fan_out
                        and not self._held
                        and self._channels
                        and not self.paused
                        and not self._memory
                        and not self._backend.depth()
                    ):
                        self._fan_out_locked(entries, form, strict=True, deliveries=deliveries)
                    else:
                        if form is RECORDS and len(self._memory) + len(entries) <= self._mem_capacity:
                            self._memory.extend(entries)  # (the usual backlog: room in memory)
                        else:
                            self._put_locked(entries if form is RECORDS else as_records(entries))
                            token = self._backend.sync_point()
                        if self._channels and not self.paused:
                            self._backlog_ready.notify()  # only when the pump can make progress
                except BackendError as e:
                    raise TopicError(str(e)) from None
                self.message_count += len(entries)
                self.message_bytes += size
        finally:
            if deliveries:
                deliveries.release()
            if self._watch.watchers:
                self._watch.notify()
        if token is not None:
            try:
                self._backend.wait_synced(token)
            except BackendError as e:
                raise TopicError(str(e)) from None

    def _fan_out_locked(self, entries, form, strict=False, deliveries=None):
        """Every channel gets every message.

        Records are immutable: every channel queues the same ones (``form``
        RECORDS).  Otherwise a batch goes as it is to the first channel, and
        as a copy to each of the others, every copy made before the first put
        (a channel's put clears the deferral of the Messages it indexes).

        ``strict`` (the publisher is waiting): a channel whose backend fails
        makes the publish fail after every channel was tried, so the client
        retries (channels that took it may then see it twice; none loses it).
        ``deliveries``: the publisher's, for direct deliveries (see
        :meth:`Channel.put_messages`).
        Returns the durable-mode sync tokens as ``[(channel, token)]``.
        """
        channels = list(self._channels.values())
        tokens = []
        error = None
        if form is RECORDS or len(channels) < 2:
            batches = itertools.repeat(entries)
        else:
            batches = [entries] + copy_batches(entries, form, len(channels) - 1)
        deferred = form is DEFERRED
        replaying = self._replay_skips
        for channel, batch in zip(channels, batches):
            if replaying:
                batch = self._skip_replayed_locked(channel, batch)
                if not batch:
                    continue
            try:
                token = channel.put_messages(batch, strict, deferred, deliveries)
            except ChannelError as e:
                self._nsqd.log.error("%r: failed to put %d messages to %r - %s", self, len(entries), channel, e)
            except BackendError as e:
                self._nsqd.log.error("%r: failed to put %d messages to %r - %s", self, len(entries), channel, e)
                error = error or e
            else:
                if token is not None:
                    tokens.append((channel, token))
        if error is not None:
            raise error
        return tokens

    # -- the backlog: entries are records, or Messages with a delay ---------

    def _take_locked(self, n):
        """BackedQueue's, asking the backend for records where it can give them."""
        memory = self._memory
        if len(memory) > n:
            return [memory.popleft() for _ in range(n)]
        entries = list(memory)
        memory.clear()
        if len(entries) < n and self._backend.depth():
            self.mark_scan_locked()  # a read moves the disk queue's metadata
            entries.extend(self._backend.get(n - len(entries), records=True))
        return entries

    def _pump_loop(self):
        if self._backend.acks_deliveries:
            self._acking_pump_loop()
            return
        while True:
            # One batch per lock hold: publishers queue behind the backlog meanwhile
            # (order is kept: nothing fans out inline while a backlog exists) instead
            # of waiting for the whole of it to drain.
            with self._lock:
                if not self._wait_for_backlog_locked():
                    return
                batch = self._take_locked(PUMP_BATCH)
                self._fan_out_locked(batch, batch_form(batch))
            time.sleep(0)  # (a yield, not a wait) let a publisher woken by the release take the lock first

    def owes_fan_out(self):
        """True while messages wait here that the pump will copy to channels (it has some, is not
        paused), or a batch it took is not acknowledged yet (durable): work under way without time
        passing, as time skipping and :meth:`sync_backends` see it."""
        with self._lock:
            return bool(self._batch_in_hand or
                        (self._channels and not self.paused and (self._memory or self._backend.depth())))

    def sync_backends(self):
        """fsync this topic's and its channels' disk queues and persist their metadata (read and
        write positions, durable mode's committed positions): what :meth:`BrokerCore.sync` does per topic."""
        with self._lock:
            channels = list(self._channels.values())
        ok = True
        for queue in [self] + channels:
            ok = queue.sync_backend_now() and ok
        return ok

    def _wait_for_backlog_locked(self):
        """Wait until the backlog can be drained; False when the topic is exiting."""
        while not self.exiting and not (
            self._channels and not self.paused and (self._memory or self._backend.depth())
        ):
            self._backlog_ready.wait()
        return not self.exiting

    def _plan_replay_locked(self):
        """Durable mode after a restart: what each channel already holds of the batches the topic
        copied before the crash but had not yet acknowledged on disk, so that they are not copied
        again (a message never delivered is delivered once).

        The pump copies in the topic's order, so a channel holds a prefix of what the topic replays:
        up to the last record the channel's disk queue holds.  Returns ``{channel: n}``, the
        replayed messages to skip for each channel that holds any (stored with the topic's lock held,
        read by the pump under it)."""
        tails = {}  # message ID -> the channels whose disk queue ends with it
        for channel in self._channels.values():
            last = channel.last_record_id()
            if last is not None:
                tails.setdefault(bytes(last), []).append(channel)
        skips = {}
        if not tails:
            return skips
        for count, msg_id in enumerate(self._backend.stored_ids(), 1):
            for channel in tails.pop(bytes(msg_id), ()):
                skips[channel] = count
            if not tails:
                break
        if skips:
            self._nsqd.log.info("%r: %s already held what the topic replays after the restart (%s messages): "
                                "not copied again", self, ", ".join(c.name for c in skips),
                                ", ".join(str(n) for n in skips.values()))
        return skips

    def _skip_replayed_locked(self, channel, batch):
        """``batch`` less what ``channel`` already holds of the replay (see :meth:`_plan_replay_locked`)."""
        skip = self._replay_skips.get(channel)
        if not skip:
            return batch
        taken = min(skip, len(batch))
        if skip > taken:
            self._replay_skips[channel] = skip - taken
        else:
            del self._replay_skips[channel]
        return batch[taken:]

    def _acking_pump_loop(self):
        """Fan out from the topic's disk queue; acknowledge a batch there only once
        every channel's copy is fsynced, so a crash in between duplicates, never loses.
        A failed batch is retried every second until the disk takes it."""
        batch = None
        while True:
            with self._lock:
                if batch is None:
                    # The replay comes first, even when the topic is paused or exiting: until it is
                    # acknowledged here, the topic's disk queue still holds records its channels hold
                    # too.  A graceful stop before the pump got to it (a stop right after the restart,
                    # or a paused topic) left them there, and Go nsqd, which has no replay check, then
                    # copied them to the channels again (every message of the batch twice).  So
                    # close() (which joins the pump) waits for it: at most what was in fan-out at the
                    # kill, copied only to the channels that lack it.
                    replay = max(self._replay_skips.values(), default=0)
                    if not replay and not self._wait_for_backlog_locked():
                        return
                    batch = self._take_locked(min(replay, PUMP_BATCH) if replay else PUMP_BATCH)
                    if not batch:
                        self._replay_skips.clear()  # (a replay's read error: the records are gone)
                        batch = None
                        continue
                    self._batch_in_hand = True
                elif self.exiting:
                    return  # unacknowledged: read again after the restart
                try:
                    tokens = self._fan_out_locked(batch, DEFERRED, strict=True)
                except BackendError:
                    self._backlog_ready.wait(1.0)
                    continue
            try:
                for channel, token in tokens:
                    channel.wait_synced(token)
            except BackendError as e:
                self._nsqd.log.error("%r: fsync of a channel failed - %s", self, e)
                continue
            with self._lock:
                # (persist: Go nsqd started after a kill must not copy these to the channels again)
                self._backend.ack([m.id for m in batch], persist=True)
                self._batch_in_hand = False
            if self._watch.watchers:
                self._watch.notify()  # (BrokerCore.sync waits for the pumps to catch up)
            batch = None

    # -- channels ----------------------------------------------------------

    def get_channel(self, name):
        """Get or create a channel."""
        return self._get_channel(name)

    def begin_precreation(self):
        """The cluster is to be asked for this topic's channels, until it answers
        (:meth:`end_precreation`): returns the mark to give :meth:`precreate_channels`.

        Meanwhile the names of the (durable) channels deleted here are kept.
        """
        with self._lock:
            self._precreations += 1
            return self._channel_deletions

    def precreate_channels(self, names, mark):
        """Create the channels of the cluster's answer, except those deleted here since
        ``mark``: the answer may predate their deletion.  TopicError once the topic exits."""
        for name in names:
            self._get_channel(name, unless_deleted_since=mark)

    def end_precreation(self):
        """The cluster has answered (or will not be asked again): forget the deletions."""
        with self._lock:
            self._precreations -= 1
            if not self._precreations:
                self._deleted_channels.clear()

    def _get_channel(self, name, unless_deleted_since=None):
        with self._lock:
            channel = self._channels.get(name)
            if channel is not None:
                return channel
            if self.exiting:
                raise TopicError("exiting")
            if unless_deleted_since is not None and self._deleted_channels.get(name, -1) >= unless_deleted_since:
                return None
            channel = Channel(self.name, name, self._nsqd)
            self._channels[name] = channel
            if self._memory or self._backend.depth():
                # (only a backlog gives the pump work for the new channel: waking it for every
                # new channel of a burst of SUBs cost a thread switch each)
                self._backlog_ready.notify()
            self._nsqd.log.info("TOPIC(%s): new channel(%s)", self.name, name)
            self._nsqd.lookupd_notify(encode_register(self.name, name))  # queued under the lock: in order
        if self._watch.watchers:
            self._watch.notify()
        if not (self.ephemeral or channel.ephemeral):
            self._nsqd.metadata_changed()
        return channel

    def get_existing_channel(self, name):
        with self._lock:
            return self._channels.get(name)

    def channels(self):
        with self._lock:
            return list(self._channels.values())

    # -- what the topic holds (a dead-letter topic's provenance compaction: broker.provenance) ----------

    def held_count(self):
        """At least how many messages the topic and its channels hold (each channel's copy counted: an
        upper bound of the distinct ones); None when it cannot tell (the durable pump has a batch in
        hand, in neither the backlog nor every channel)."""
        with self._lock:
            if self._batch_in_hand:
                return None
            count = len(self._memory) + self._backend.depth()
            channels = list(self._channels.values())
        return count + sum(channel.held_count() for channel in channels)

    def held_ids(self):
        """The IDs (bytes) of every message the topic's backlog or any of its channels holds; None when
        it cannot tell (see :meth:`held_count`).  The backlog is read first, then each channel: a
        message the pump fans out meanwhile moves under this topic's lock, from the backlog (already
        read) to the channels (read after), so none is missed.  Reads the disk queues: not for a hot path."""
        with self._lock:
            if self._batch_in_hand:
                return None
            ids = {bytes(held_fields(entry)[0]) for entry in self._memory}
            stored, stored_deferred = self._backend.peek()
            ids.update(bytes(m.id) for m in stored)
            ids.update(bytes(m.id) for m, _ in stored_deferred)
            channels = list(self._channels.values())
        for channel in channels:
            ids.update(channel.held_ids())
        return ids

    def delete_channel(self, name):
        """Delete a channel (HTTP or the last client of an ephemeral one leaving).

        Returns True when this leaves an ephemeral topic without channels, which
        the caller then deletes.
        """
        with self._lock:
            channel = self._channels.get(name)
        if channel is None:
            return False
        channel.close(delete=True)
        with self._lock:
            if self._channels.get(name) is channel:
                del self._channels[name]
                self._replay_skips.pop(channel, None)  # (the pump would wait for its replay: see _acking_pump_loop)
                if self._precreations and not channel.ephemeral:  # (an ephemeral one is never pre-created)
                    self._deleted_channels[name] = self._channel_deletions
                self._channel_deletions += 1
            self._nsqd.log.info("TOPIC(%s): deleted channel(%s)", self.name, name)
            self._nsqd.lookupd_notify(encode_unregister(self.name, name))
            delete_topic = (
                self.ephemeral and not self._channels and not self.exiting and not self._delete_scheduled
            )
            if delete_topic:
                self._delete_scheduled = True
        if self._watch.watchers:
            self._watch.notify()
        if not (self.ephemeral or channel.ephemeral):
            self._nsqd.metadata_changed(wait=True)  # (HTTP only: an ephemeral channel is not listed)
        return delete_topic

    # -- administration ----------------------------------------------------

    def snapshot(self):
        """``(depth, backend_depth, message_count, message_bytes, paused)`` for /stats."""
        with self._lock:
            backend_depth = self._backend.depth()
            return (
                len(self._memory) + backend_depth,
                backend_depth,
                self.message_count,
                self.message_bytes,
                self.paused,
            )

    def inside(self, limit):
        """For /debug/state (:mod:`.state`): figures and bounded copies, taken together under the lock.

        ``memory`` holds the first ``limit`` memory-queue entries as they are
        kept (records or Messages); the channels are returned, not described.
        """
        with self._lock:
            return {
                "memory": list(itertools.islice(self._memory, limit)),
                "memory_depth": len(self._memory),
                "backend": self._backend.describe(),
                "channels": list(self._channels.values()),
                "paused": self.paused,
                "message_count": self.message_count,
                "message_bytes": self.message_bytes,
            }

    def pause(self):
        with self._lock:
            self.paused = True
        if self._watch.watchers:
            self._watch.notify()

    def unpause(self):
        with self._lock:
            self.paused = False
            self._backlog_ready.notify()
        if self._watch.watchers:
            self._watch.notify()

    def empty(self):
        with self._lock:
            self._memory.clear()
            self._backend.empty()
            self.mark_scan_locked()
        if self._watch.watchers:
            self._watch.notify()

    def close(self, delete=False):
        """Stop the pump, then close (or delete) every channel and the backlog.

        A graceful close writes the memory backlog to the backend first.
        """
        with self._lock:
            self.exiting = True
            started = self._started
            self._backlog_ready.notify_all()
        if started:
            self._pump.join()
        for channel in self.channels():
            channel.close(delete=delete)
            if delete:
                self._nsqd.lookupd_notify(encode_unregister(self.name, channel.name))
        with self._lock:
            if delete:
                self._channels.clear()
                self._drop_locked()
            else:
                self._flush_locked()
