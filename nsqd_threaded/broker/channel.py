"""Channel: one consumer group of a topic.

Every message the topic fans out lands in each of its channels; within a
channel, each message goes to exactly one subscribed client (competing
consumers).  A channel holds:

* a memory queue (a deque bounded by --mem-queue-size) and a backend for the
  overflow,
* the in-flight index (delivered, awaiting FIN/REQ/TOUCH or timeout),
* the deferred index (DPUB and REQ with a delay, waiting to become due),
* the subscribed clients, and the list of client pumps waiting for messages.

How its messages reach the consumers (a waiting pump, or direct delivery by
the publisher's thread) is described in :mod:`~nsqd_threaded.broker.delivery`,
with the subscriber interface a Channel needs (:class:`~.delivery.Subscriber`).
"""

import collections
import itertools
import random

from ..storage.backend import BackendError
from .backed_queue import BackedQueue
from .delivery import DIRECT_DELIVERY_MAX, REFILL_MAX
from .e2e import E2ELatency
from .policy import NO_POLICY, ChannelPolicyMethods, channel_policy
from .pqueue import TimedIndex
from .redrive import ChannelRedriveMethods
from ..wire.message import RECORD_HEADER, RECORD_HEADER_SIZE, Message, from_records, held_fields
from ..internal.gocompat import ns


class ChannelError(Exception):
    """A failure whose text nsqd sends to the client (``exiting``, ``ID not in flight``, ...).

    Every Channel method that refuses raises it; none returns a reason.
    """


class FinishError(ChannelError):
    """:meth:`Channel.finish_many` could not finish some IDs (the others it did).

    ``failures``: ``[(id, reason)]`` in the order asked, as nsqd answers each FIN.
    """

    def __init__(self, failures):
        super().__init__("%d IDs not finished" % len(failures))
        self.failures = failures


# A channel's /stats figures (:meth:`Channel.snapshot`): a named tuple, as /stats
# takes one for each of thousands of channels.  ``depth`` is the memory queue's
# and the backend's together; ``policy`` the delivery policy's figures or None; ``redrive_count`` the
# messages redriven out of the channel (:mod:`.redrive`).
ChannelFigures = collections.namedtuple("ChannelFigures", (
    "memory_depth", "backend_depth", "in_flight_count", "deferred_count", "message_count", "global_msg_count",
    "requeue_count", "timeout_count", "clients", "paused", "policy", "redrive_count"))
_new_tuple = tuple.__new__


class Channel(BackedQueue, ChannelPolicyMethods, ChannelRedriveMethods):
    """A topic's channel.

    ``_lock`` (BackedQueue's) guards every mutable attribute below, including
    the per-client ``in_flight_count`` of subscribed clients and the clients'
    in-flight messages.

    Lock order: Topic._lock -> Channel._lock -> Client._lock (``_pump_asleep``,
    read by :meth:`Subscriber.pump_idle`).  A consumer's output (the server's
    ``ClientConnection._write_lock``, which guards ``_encode`` and
    ``output_backlog``) is taken after them only by a try (:class:`DirectDeliveries`)
    and is held past their release; whoever waits for it holds none of them.

    A backend that acknowledges deliveries (``--durable``) gets every message
    the topic fans out, deferred ones included (it keeps their delay), and
    is told (``ack``) when one is finished, dropped by sampling, a duplicate
    in flight, or rewritten by the flush on close; its requeues stay in
    memory, their records being still stored.
    """

    def __init__(self, topic_name, name, nsqd):
        self.topic_name = topic_name
        self.name = name
        self.ephemeral = name.endswith("#ephemeral")
        options = nsqd.options
        backend = nsqd.new_backend("%s:%s" % (topic_name, name), self.ephemeral)
        super().__init__(nsqd, backend, options.mem_queue_size)
        self._now_ns = nsqd.clock.time_ns  # the broker's clock (time skipping moves it)
        self._in_flight = TimedIndex()
        self._deferred = TimedIndex()
        self._clients = {}  # client id -> Subscriber
        # Consumers whose pump is ready and found nothing to take, in arrival
        # order (a dict: O(1) membership and removal with thousands of them).
        self._waiting = {}
        self._departed = set()  # ids of removed consumers that left messages in flight
        self._max_consumers = options.max_channel_consumers
        self._max_msg_timeout_ns = ns(options.max_msg_timeout)
        self.paused = False
        self.exiting = False
        self._delete_scheduled = False
        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.global_msg_count = 0  # deliveries taken from the memory queue
        self.e2e = E2ELatency(options.e2e_processing_latency_percentiles,
                              options.e2e_processing_latency_window_time, nsqd.clock.monotonic)
        # The delivery policy in force (broker.policy.ChannelPolicy); None: none, nothing checked on delivery.
        self.policy = channel_policy(topic_name, NO_POLICY, options, named=topic_name in nsqd.dead_letter_names)

    def __repr__(self):
        return "Channel(%s:%s)" % (self.topic_name, self.name)

    # -- putting messages in --------------------------------------------

    def put_messages(self, msgs, strict=False, deferred=True, deliveries=None):
        """Topic fan-out: queue immediate messages, index deferred ones.

        If the backend cannot take the overflow, ``strict`` (a publisher still
        waiting for its answer) raises BackendError; otherwise (messages already
        acknowledged) they stay in memory beyond --mem-queue-size rather than be
        lost.  In durable mode every message is written to the disk queue and
        the returned token is what the caller waits on before acknowledging.
        ``deferred=False``: the caller knows none is deferred (no scan for them).

        ``deliveries`` (a :class:`DirectDeliveries`; the publisher's thread):
        at most :data:`DIRECT_DELIVERY_MAX` messages are delivered through it
        to waiting consumers; the caller must :meth:`~DirectDeliveries.release`
        it once it holds no lock, whatever happens.
        """
        token = None
        with self._lock:
            if self.exiting:
                raise ChannelError("exiting")
            if self._backend.acks_deliveries:
                # Deferral is kept by the disk queue and restored when read back.
                self._write_backend_locked(msgs)
                token = self._backend.sync_point()
                self.message_count += len(msgs)
                waiters = self._take_waiters_locked()
            elif (deliveries is not None and len(msgs) == 1 and self._waiting and not self._memory
                  and type(msgs[0]) is not bytes and not msgs[0].deferred_ns
                  and self._deliver_one_locked(msgs[0], deliveries)):
                self.message_count += 1
                waiters = ()
            else:
                immediate = self._index_deferred_locked(msgs, self._now_ns()) if deferred else msgs
                if immediate:
                    self._put_immediate_locked(immediate, strict)
                self.message_count += len(msgs)
                if not immediate or not self._waiting:
                    waiters = ()
                elif deliveries is not None and len(immediate) <= DIRECT_DELIVERY_MAX:
                    waiters = self._deliver_to_waiting_locked(deliveries)
                else:
                    waiters = self._take_waiters_locked()
        for client in waiters:
            client.wake()
        if self._watch.watchers:
            self._watch.notify()
        return token

    def _index_deferred_locked(self, msgs, now):
        """Put the messages with a delay in the deferred index; returns the others.

        The delay runs from ``now``; a record (bytes) has none.
        """
        immediate = []
        for msg in msgs:
            if type(msg) is not bytes and msg.deferred_ns:  # (see wire.message: inline, once per message)
                # An ID already deferred is dropped, as nsqd drops it.
                self._deferred.add(msg, now + msg.deferred_ns)
                msg.deferred_ns = 0  # the index holds the due time from now on
                self.mark_scan_locked()
            else:
                immediate.append(msg)
        return immediate

    def _put_immediate_locked(self, msgs, strict):
        try:
            self._put_locked(msgs)
        except BackendError as e:
            if strict:
                raise
            self._nsqd.log.error("%r: backend write failed, keeping %d messages in memory - %s",
                                 self, len(msgs), e)
            self._memory.extend(msgs)

    def wait_synced(self, token):
        """Durable mode: block (without the channel lock) until the token's writes are fsynced."""
        self._backend.wait_synced(token)

    def _room_locked(self):
        if self.ephemeral and self._mem_capacity == 0:
            # nsqd's unbuffered hand-off: accepted only while a pump waits.
            return len(self._waiting) - len(self._memory)
        return self._mem_capacity - len(self._memory)

    def _take_waiters_locked(self):
        """The pumps to wake, to be iterated after the lock is released.

        Never the live dict: an empty one is still ``self._waiting``, and a
        take under the lock may add to it while the caller iterates.
        """
        waiters = self._waiting
        if not waiters:
            return ()
        self._waiting = {}
        return waiters

    def _deliver_to_waiting_locked(self, deliveries):
        """Direct delivery (see the module's docstring): take messages for each waiting
        consumer whose output is free, in waiting order, while there are any.

        Returns the consumers to wake instead.  A consumer served here stays
        waiting if its pump has nothing more to do; one left unserved because
        nothing remains stays waiting too.
        """
        if self.paused:
            return self._take_waiters_locked()  # (they find the channel paused, as before)
        waiting = self._waiting
        to_wake = []
        memory = self._memory
        backend = self._backend
        while waiting and (memory or backend.depth()):
            # The longest waiting first, as many as there are messages (at least a few) at a time:
            # never a copy of them all, which would touch each of thousands of waiting consumers
            # for a put that serves a few.  (Each one met leaves the dict, or stays at its end
            # only once nothing is left to deliver: none is met twice.)
            for client in list(itertools.islice(waiting, max(len(memory), 16))):
                if not (memory or backend.depth()):
                    break
                del waiting[client]
                if not client.hold_output():  # acquire (a try): released by deliveries.release()
                    to_wake.append(client)
                    continue
                # (An empty list, all sampled out, still goes: its delivery releases the output.)
                try:
                    msgs = self._take_for_locked(client, DIRECT_DELIVERY_MAX) or []
                except BaseException:
                    deliveries.append((client, []))  # (a failed disk read: the output is still released)
                    raise
                deliveries.append((client, msgs))
                if client.blocked:
                    continue  # its FINs wake the pump
                if memory or backend.depth():
                    to_wake.append(client)  # more than one direct delivery's worth: the pump takes the rest
                else:
                    waiting[client] = None  # the pump has nothing to do: still waiting
        return to_wake

    def _deliver_one_locked(self, msg, deliveries):
        """A single PUB's message, with consumers waiting and nothing queued: straight to the
        first waiting consumer, never through the memory queue; False (nothing done) when
        anything is out of the ordinary, which :meth:`_deliver_to_waiting_locked` then handles.

        The same outcome as queueing it and taking it with :meth:`_take_for_locked`
        (its in-flight entry, counters and the consumer's place among the waiting),
        with none of the batch machinery: this is a publish-to-delivery round trip's path.
        """
        if self.paused or self.policy is not None or self._backend.depth() or not (
                self._mem_capacity > 0 or self.ephemeral):  # (no memory queue: to the backend, as nsqd)
            return False
        waiting = self._waiting
        client = next(iter(waiting))
        if client.sample_rate or client.ready_count <= client.in_flight_count or not client.hold_output():
            return False
        del waiting[client]
        self._mark_one_in_flight_locked(client, msg)  # (as if through the memory queue, which it stands for)
        if client.in_flight_count >= client.ready_count:
            client.blocked = True  # its FINs wake the pump
        else:
            client.blocked = False
            waiting[client] = None  # nothing more to do: still waiting, now last in line
        deliveries.append((client, [msg]))
        return True

    def _refill_held_locked(self, client):
        """Take what a consumer whose output is held may have now; ``(messages, wake the pump?)``.

        Its pump sleeps with nothing in hand.  It is woken as well when more
        is queued than one direct delivery takes and the consumer is still
        ready for it.  A consumer left with a free slot and nothing queued is
        a waiting one, as its pump would make it: otherwise no put would ever
        deliver to it or wake it.
        """
        try:
            msgs = self._take_for_locked(client, REFILL_MAX) or []
        except BaseException:
            client.deliver_held([])  # (a failed disk read: the output is released all the same)
            raise
        if client.blocked:
            return msgs, False  # its FINs wake the pump
        if self._memory or self._backend.depth():
            return msgs, True
        self._waiting[client] = None
        return msgs, False

    def _requeue_locked(self, msgs):
        """Back to the tail of the queue (REQ 0, timeout, deferred due); never loses one.

        If the backend acknowledges deliveries their records are still stored
        there, so the memory queue is enough.  Otherwise a backend failure keeps
        them in memory beyond --mem-queue-size (and health shows the failure).
        """
        if self._backend.acks_deliveries:
            self._backend.keep_attempts(msgs)  # a restart reads them from the records
            self._memory.extend(msgs)
        else:
            try:
                self._put_locked(msgs)
            except BackendError as e:
                self._nsqd.log.error("%r: backend write failed, keeping %d messages in memory - %s",
                                     self, len(msgs), e)
                self._memory.extend(msgs)
        return self._take_waiters_locked()

    # -- delivery ----------------------------------------------------------

    def take(self, client, limit):
        """Hand a ready client up to ``limit`` messages and mark them in flight.

        Returns the list (possibly empty).  An empty result because the queue
        is empty registers the client's pump to be woken by the next put; an
        empty result because the client is not ready does not (its FINs,
        timeouts and RDY changes wake it).
        """
        with self._lock:
            if self.paused or self.exiting or client.id not in self._clients:
                return []  # (a pump can still run a moment after its client left: give it nothing)
            msgs = self._take_for_locked(client, limit)
            if msgs is None:
                if self._waiting:
                    # Not ready (RDY lowered): not waiting either; its FINs or RDY wake it.
                    self._waiting.pop(client, None)
                return []
            if msgs:
                if self._waiting:
                    # Taking for itself: not waiting, so no publisher delivers to it meanwhile.
                    self._waiting.pop(client, None)
            else:
                self._waiting[client] = None
        if msgs and self._watch.watchers:
            self._watch.notify()
        return msgs

    def await_messages(self, client):
        """A consumer without a pump became ready: False if it could take a message now (its pump
        should start and take it); otherwise True, and it is a waiting one if a free RDY slot and an
        empty queue are the reason, as an empty :meth:`take` would make it (the next put delivers
        to it directly, or wakes it).  Paused, it waits for the unpause's wake-up; with no free
        slot, for a release's."""
        with self._lock:
            if self.paused or self.exiting or client.id not in self._clients:
                return True
            if client.in_flight_count >= client.ready_count:
                client.blocked = True
                return True
            client.blocked = False
            if self._memory or self._backend.depth():
                return False
            self._waiting[client] = None
            return True

    def _take_for_locked(self, client, limit):
        """Up to ``limit`` messages marked in flight to ``client``: [] when there are
        none, None when the client has no free RDY slot (it is then ``blocked``)."""
        budget = min(client.ready_count - client.in_flight_count, limit)
        if budget <= 0:
            client.blocked = True
            return None
        client.blocked = False  # (RDY may have been raised since it was set)
        memory = self._memory
        if budget == 1 and memory and not (self._redriven or client.sample_rate or self.policy is not None
                                           or self._backend.acks_deliveries):
            # One message (a consumer at RDY 1) from memory, with nothing to screen and no attempt
            # to keep: the loop's steps below, without lists.
            msg = memory.popleft()
            if type(msg) is bytes:
                timestamp, attempts, msg_id = RECORD_HEADER.unpack_from(msg)
                msg = Message(msg_id, msg[RECORD_HEADER_SIZE:], timestamp, attempts)
            self._mark_one_in_flight_locked(client, msg)
            if client.in_flight_count >= client.ready_count:
                client.blocked = True
            return [msg]
        while True:
            queued = len(memory)
            msgs = from_records(self._take_locked(budget))
            self.global_msg_count += queued - len(memory)  # deliveries from the memory queue
            if not msgs:
                return msgs
            if self._redriven:  # (after a kill inside a redrive: see _let_go_redriven_locked)
                msgs = self._let_go_redriven_locked(msgs)
                if not msgs:
                    continue
            if client.sample_rate:
                # nsqd drops a message for this channel when rand[0,100) > rate.
                rate = client.sample_rate
                kept = []
                dropped = []
                for m in msgs:
                    (kept if random.randrange(100) <= rate else dropped).append(m)
                if dropped:
                    self._backend.ack([m.id for m in dropped])
                    self.mark_scan_locked()
                msgs = kept
                if not msgs:
                    continue
            if self.policy is not None:
                msgs = self.policy.screen_locked(msgs, self._now_ns())  # (moved by the scanner: move_dead_letters)
                if self.policy.moving:
                    self.mark_scan_locked()
                if not msgs and not self.policy.full_locked():
                    continue
            break
        now = self._now_ns()
        cid = client.id
        for msg in msgs:
            msg.attempts = (msg.attempts + 1) & 0xFFFF
            msg.client_id = cid
            msg.delivery_ns = now
        if self._backend.acks_deliveries:
            # (durable: this delivery's attempt is in the record, so a message in flight at a crash
            # comes back with it: one pwrite per message, into a file kept open)
            self._backend.keep_attempts(msgs)
        # A duplicate ID already in flight is still sent (as nsqd does) but
        # counted once.
        added = self._in_flight.add_many(msgs, now + client.msg_timeout_ns)
        if not self._scan_listed:
            self.mark_scan_locked()  # timeouts to watch
        if len(added) < len(msgs):
            self._backend.ack([m.id for m in msgs if m not in added])  # the duplicates
        client.in_flight_count += len(added)
        client.message_count += len(msgs)
        if client.in_flight_count >= client.ready_count:
            client.blocked = True
        return msgs

    def _mark_one_in_flight_locked(self, client, msg):
        """One message from the memory queue goes to ``client``: its attempt, its in-flight entry
        and the counters, as :meth:`_take_for_locked` marks a batch (a duplicate ID already in
        flight is sent all the same and counted once, as nsqd does)."""
        now = self._now_ns()
        msg.attempts = (msg.attempts + 1) & 0xFFFF
        msg.client_id = client.id
        msg.delivery_ns = now
        if self._in_flight.add(msg, now + client.msg_timeout_ns):
            client.in_flight_count += 1
        else:
            self._backend.ack([msg.id])
        if not self._scan_listed:
            self.mark_scan_locked()  # timeouts to watch
        client.message_count += 1
        self.global_msg_count += 1

    def _from_backend_locked(self, n):
        """Up to ``n`` messages from the backend; those still deferred go to the deferred index."""
        ready = []
        backend = self._backend
        while len(ready) < n and backend.depth():
            msgs = backend.get(n - len(ready))
            if not msgs:
                break
            ready += self._index_deferred_locked(msgs, self._now_ns())
        return ready

    def _release_locked(self, client, n=1):
        """A client's in-flight count drops; True if its pump should be woken.

        A blocked client is ready again as soon as one RDY slot is free
        (nsqd's ``IsReadyForMessages``: in flight < RDY), and its pump is
        woken at once if a message is queued: no threshold of free slots
        holds a deliverable message back from a consumer that holds the
        others (a batching writer FINs only when it has enough).  The
        batching comes for free: FINs read together are released together,
        and the pump takes every free slot's worth in one batch.

        A pump asleep with nothing in hand, of a consumer now ready again,
        is not woken while the queue is empty: the consumer becomes a waiting
        one as its pump would make it (the next put delivers to it directly,
        or wakes it).  A FIN then costs no hand-off to the pump.
        """
        client.in_flight_count -= n
        if client.blocked and client.in_flight_count < client.ready_count:
            client.blocked = False
            if not (self._memory or self.paused or self._backend.depth()) and client.pump_idle():
                self._waiting[client] = None
                return False
            return True
        return False

    def _owned_locked(self, client, msg_id):
        """The in-flight message if this client owns it; raises ChannelError (nsqd's reason)."""
        msg = self._in_flight.get(msg_id)
        if msg is None:
            raise ChannelError("ID not in flight")
        if msg.client_id != client.id:
            raise ChannelError("client does not own message")
        return msg

    def finish_many(self, client, msg_ids):
        """FIN a run of IDs under one lock acquisition.

        Raises FinishError, once the others are finished, if some could not be.

        A FIN that makes a blocked consumer ready again while messages wait
        delivers the next ones from the FINing thread itself (the consumer's
        connection thread, whose output is free while its pump sleeps), as a
        publisher's thread delivers a PUB: the slot is refilled without a
        hand-off to the pump, message by message if the consumer FINs one at
        a time.
        """
        with self._lock:
            done, refused = self._in_flight.remove_owned(msg_ids, client.id)
            held, wake = self._finished_locked(client, done) if done else (None, False)
        if held is not None:
            client.deliver_held(held)  # (releases the output; the rest, if any, goes to the pump)
        if wake:
            client.wake()
        if self._watch.watchers:
            self._watch.notify()
        if refused:
            raise FinishError([(msg_id, "ID not in flight" if msg is None else "client does not own message")
                               for msg_id, msg in refused])

    def finish_one(self, client, msg_id):
        """:meth:`finish_many` of one ID, as a consumer at RDY 1 sends them (no list of one)."""
        with self._lock:
            msg = self._in_flight.pop_owned(msg_id, client.id)
            if msg is not None:
                held, wake = self._finished_locked(client, (msg,))
        if msg is None:
            return self.finish_many(client, (msg_id,))  # (refused: it raises, saying why)
        if held is not None:
            client.deliver_held(held)
        if wake:
            client.wake()
        if self._watch.watchers:
            self._watch.notify()

    def _finished_locked(self, client, done):
        """The messages ``done`` left the in-flight index as finished: count them, free their
        slots, and refill one from the queue if the consumer's output is free; ``(messages to
        deliver held, or None; wake the pump?)``."""
        if self.e2e.enabled:
            sample = self.e2e.add
            now = self._now_ns()
            for msg in done:
                sample(now - msg.timestamp)
        client.finish_count += len(done)
        if self._backend.acks_deliveries:  # (no list of IDs for a backend that has nothing to do)
            self._backend.ack([msg.id for msg in done])  # (the channel is listed: it had these in flight)
        wake = self._release_locked(client, len(done))
        if wake and not self.paused and client.pump_idle() and client.hold_output(own=True):
            return self._refill_held_locked(client)
        return None, wake

    def requeue(self, client, msg_id, delay_ns):
        """REQ (``delay_ns`` 0: at once); raises ChannelError."""
        waiters = ()
        with self._lock:
            msg = self._owned_locked(client, msg_id)
            if delay_ns == 0 and self.exiting:
                raise ChannelError("exiting")
            if delay_ns > 0 and msg_id in self._deferred:
                raise ChannelError("ID already deferred")
            self._in_flight.remove(msg_id)
            self.requeue_count += 1
            client.requeue_count += 1
            wake = self._release_locked(client)
            if delay_ns > 0:
                due = self._now_ns() + delay_ns
                self._backend.keep_attempts([msg], due)  # (durable: a crash keeps the delay too)
                self._deferred.add(msg, due)
                self.mark_scan_locked()
            else:
                waiters = self._requeue_locked([msg])
        if wake:
            client.wake()
        for c in waiters:
            c.wake()
        if self._watch.watchers:
            self._watch.notify()

    def touch(self, client, msg_id):
        """TOUCH: push the deadline out, capped at delivery + --max-msg-timeout; raises ChannelError."""
        with self._lock:
            msg = self._owned_locked(client, msg_id)
            new_expiry = self._now_ns() + client.msg_timeout_ns
            if new_expiry - msg.delivery_ns >= self._max_msg_timeout_ns:
                new_expiry = msg.delivery_ns + self._max_msg_timeout_ns
            self._in_flight.reschedule(msg, new_expiry)

    # -- clients -----------------------------------------------------------

    def add_client(self, client):
        with self._lock:
            if self.exiting:
                raise ChannelError("exiting")
            if client.id in self._clients:
                return
            if self._max_consumers and len(self._clients) >= self._max_consumers:
                raise ChannelError(
                    "consumers for %s:%s exceeds limit of %d"
                    % (self.topic_name, self.name, self._max_consumers)
                )
            self._clients[client.id] = client
        if self._watch.watchers:
            self._watch.notify()

    def remove_client(self, client):
        """Unsubscribe.  Returns True when this was the last client of an
        ephemeral channel, which the caller deletes.

        What the client still had in flight is requeued by the next queue scan
        (:meth:`process_in_flight`), not here: finding a client's messages
        means a pass over the whole in-flight index, and one pass per scan
        serves every client that left since, where one per client would make
        a mass disconnect quadratic under this lock.  (Go nsqd leaves them
        until msg_timeout; redelivering within a scan interval loses nothing
        and is what a consumer that crashed wants.)
        """
        with self._lock:
            if self._clients.pop(client.id, None) is None:
                return False
            self._waiting.pop(client, None)
            if client.in_flight_count:
                self._departed.add(client.id)
                self.mark_scan_locked()
            client.in_flight_count = 0
            delete = (
                self.ephemeral and not self._clients and not self.exiting and not self._delete_scheduled
            )
            if delete:
                self._delete_scheduled = True
        if self._watch.watchers:
            self._watch.notify()
        return delete

    def _requeue_departed_locked(self):
        """Requeue the in-flight messages of every client removed since the last scan."""
        departed = self._departed
        self._departed = set()
        orphans = [m for m in self._in_flight.values() if m.client_id in departed]
        if not orphans:
            return ()
        remove = self._in_flight.remove
        for msg in orphans:
            remove(msg.id)
        orphans.sort(key=lambda m: m.delivery_ns)
        return self._requeue_locked(orphans)

    def has_clients(self):
        """Whether a consumer is subscribed (a hint: read without the lock)."""
        return bool(self._clients)

    def clients(self):
        with self._lock:
            return list(self._clients.values())

    # -- queue scanner -----------------------------------------------------

    def scan(self, now_ns, now):
        """The queue scanner's visit: timeouts, due deferred messages, the backend's sync."""
        self.process_in_flight(now_ns)
        self.process_deferred(now_ns)
        if self.policy is not None:
            self.move_dead_letters()
        self.sync_backend(now)

    def _scan_idle_locked(self):
        return self.exiting or (
            not self._in_flight and not self._deferred and not self._departed and super()._scan_idle_locked()
            and not (self.policy is not None and self.policy.moving)
        )

    def process_in_flight(self, now_ns):
        """Time out expired in-flight messages; True if any did (a "dirty" channel).

        Also requeues what clients removed since the last scan left in flight.
        """
        with self._lock:
            if self.exiting:
                return False
            changed = bool(self._departed)
            to_wake = set(self._requeue_departed_locked()) if changed else set()
            expired = self._in_flight.pop_due(now_ns)
            if expired:
                self.timeout_count += len(expired)
                for msg in expired:
                    owner = self._clients.get(msg.client_id)
                    if owner is not None and self._release_locked(owner):
                        to_wake.add(owner)
                to_wake.update(self._requeue_locked(expired))
        for c in to_wake:
            c.wake()
        if (changed or expired) and self._watch.watchers:
            self._watch.notify()
        return bool(expired)

    def process_deferred(self, now_ns):
        """Move due deferred messages to the queue; True if any were due."""
        with self._lock:
            if self.exiting:
                return False
            due = self._deferred.pop_due(now_ns)
            if not due:
                return False
            waiters = self._requeue_locked(due)
        for c in waiters:
            c.wake()
        if self._watch.watchers:
            self._watch.notify()
        return True

    # -- time skipping (BrokerCore.advance) ----------------------------------

    def next_deadline_ns(self):
        """The earliest in-flight timeout or deferred due time (clock ns), None if neither is pending."""
        with self._lock:
            firsts = self._in_flight.earliest(1) + self._deferred.earliest(1)
            return min(m.expiry_ns for m in firsts) if firsts else None

    def owes_delivery(self):
        """True while a message waits here that a subscribed consumer with a free RDY slot could take."""
        with self._lock:
            if self.paused or self.exiting or not (self._memory or self._backend.depth()):
                return False
            return any(c.in_flight_count < c.ready_count for c in self._clients.values())

    # -- administration ----------------------------------------------------

    def snapshot(self):
        """Figures for /stats, taken together under the lock (a :class:`ChannelFigures`)."""
        with self._lock:
            policy = self.policy
            # (tuple.__new__: the namedtuple's own constructor is a Python call, and /stats makes
            # one of these per channel)
            return _new_tuple(ChannelFigures, (
                len(self._memory), self._backend.depth(), len(self._in_flight), len(self._deferred),
                self.message_count, self.global_msg_count, self.requeue_count, self.timeout_count,
                list(self._clients.values()), self.paused,
                None if policy is None else policy.stats_locked(), self.redrive_count))

    def inside(self, limit):
        """For /debug/state (:mod:`.state`): figures and bounded copies, taken together under the lock.

        In-flight and deferred messages are copied as tuples (their fields are
        guarded by this lock): ``(id, attempts, body, client_id, expiry_ns)``
        in deadline order, ``(id, attempts, body, due_ns)`` by due time.
        """
        with self._lock:
            in_flight = self._in_flight.earliest(limit)
            deferred = self._deferred.earliest(limit)
            return {
                "memory": list(itertools.islice(self._memory, limit)),
                "memory_depth": len(self._memory),
                "backend": self._backend.describe(),
                "in_flight": [(m.id, m.attempts, m.body, m.client_id, m.expiry_ns) for m in in_flight],
                "in_flight_count": len(self._in_flight),
                "deferred": [(m.id, m.attempts, m.body, m.expiry_ns) for m in deferred],
                "deferred_count": len(self._deferred),
                "clients": list(self._clients.values()),
                "paused": self.paused,
                "message_count": self.message_count,
                "requeue_count": self.requeue_count,
                "timeout_count": self.timeout_count,
            }

    def held(self, limit=None):
        """For the reading of a channel's messages (:mod:`.peek`): copies taken together under the lock.

        ``queued``: up to ``limit`` (None: all) messages in the order they go
        out, as ``(id, body, timestamp, attempts)`` (:func:`~nsqd_threaded.wire.message.held_fields`):
        the memory queue's, then the backend's (read from its files, nothing taken); ``timed``:
        ``(id, body, timestamp, attempts, state, due_ns)`` of the messages in
        flight (due: their deadline) and deferred (due: when they rejoin the
        queue), the earliest ``limit`` of each kind.
        """
        with self._lock:
            queued = [held_fields(m) for m in itertools.islice(self._memory, limit)]
            rest = None if limit is None else limit - len(queued)
            stored, stored_deferred = self._backend.peek(rest)
            queued.extend(map(held_fields, stored))
            timed = []
            for index, state in ((self._in_flight, "in_flight"), (self._deferred, "deferred")):
                msgs = index.values() if limit is None else index.earliest(limit)
                timed.extend((m.id, m.body, m.timestamp, m.attempts, state, m.expiry_ns) for m in msgs)
            timed.extend((m.id, m.body, m.timestamp, m.attempts, "deferred", due) for m, due in stored_deferred)
            return queued, timed

    def held_count(self):
        """How many messages the channel holds: queued (memory and backend), in flight, deferred, and
        being moved by its policy (a durable backend's are counted twice: an upper bound)."""
        with self._lock:
            moving = 0 if self.policy is None else len(self.policy.moving)
            return len(self._memory) + self._backend.depth() + len(self._in_flight) + len(self._deferred) + moving

    def held_ids(self):
        """The IDs (bytes) of every message :meth:`held_count` counts, read under the lock (the backend's
        from its files, nothing taken)."""
        with self._lock:
            ids = {bytes(held_fields(m)[0]) for m in self._memory}
            stored, stored_deferred = self._backend.peek()
            ids.update(bytes(m.id) for m in stored)
            ids.update(bytes(m.id) for m, _ in stored_deferred)
            ids.update(bytes(m.id) for m in self._in_flight.values())
            ids.update(bytes(m.id) for m in self._deferred.values())
            if self.policy is not None:
                ids.update(bytes(msg_id) for msg_id in self.policy.moving)
            return ids

    def in_flight_count(self):
        with self._lock:
            return len(self._in_flight)

    def deferred_count(self):
        with self._lock:
            return len(self._deferred)

    def pause(self):
        with self._lock:
            self.paused = True
        self._wake_all()

    def unpause(self):
        with self._lock:
            self.paused = False
        self._wake_all()

    def _wake_all(self):
        """After a pause, unpause or empty: every pump looks again, and so does every waiter."""
        for client in self.clients():
            client.wake()
        if self._watch.watchers:
            self._watch.notify()

    def empty(self):
        """Drop queued, in-flight and deferred messages; clients' in-flight counts go to 0."""
        with self._lock:
            self._in_flight.drain()
            self._deferred.drain()
            if self.policy is not None:
                self.policy.clear_locked()
            for client in self._clients.values():
                client.in_flight_count = 0
                client.blocked = False
            self._memory.clear()
            self._backend.empty()
            self._forget_redrive_journal_locked()
            self.mark_scan_locked()
        self._wake_all()

    def last_record_id(self):
        """The message ID of the last record the channel's disk queue holds (None: none); a durable
        topic's restart compares it with what it replays (``Topic._plan_replay_locked``)."""
        with self._lock:
            return self._backend.last_record_id()

    def close(self, delete=False):
        """Stop the channel: mark exiting and close every subscriber's connection.

        On delete the data is emptied and dropped; on a graceful close every
        queued, in-flight and deferred message is written to the backend
        (attempts kept), then the backend is closed.
        """
        with self._lock:
            self.exiting = True
            clients = list(self._clients.values())
        for client in clients:
            client.close_connection()
        if delete:
            self.forget_policy()
        with self._lock:
            if delete:
                self._in_flight.drain()
                self._deferred.drain()
                self._drop_locked()
                self._forget_redrive_journal_locked()
                return
            flush = self._in_flight.drain()
            deferred = self._deferred.drain()
            now = self._now_ns()
            for msg in deferred:
                # Beyond nsqd: the remaining delay is kept on disk (diskqueue sidecar).
                msg.deferred_ns = max(1, msg.expiry_ns - now)
            flush.extend(deferred)
            if self.policy is not None:
                flush.extend(self.policy.moving.values())  # (attempts kept: taken out again after a restart)
            self._flush_locked(flush)
