"""How a channel hands messages to its consumers: the subscriber a Channel needs, and direct delivery.

Go nsqd's client pumps block in a ``select`` on the channel's Go channel.
Here a pump calls :meth:`Channel.take`; when nothing is there the pump is
recorded in ``_waiting``.  The next put hands its messages to a waiting pump
in one of two ways:

* **Direct delivery.**  A publisher's put of at most
  :data:`DIRECT_DELIVERY_MAX` messages is delivered by the publisher's own
  thread to a waiting consumer whose output it can reserve at once
  (:meth:`Subscriber.hold_output`): the messages are taken for that
  consumer under the channel lock and written, after the locks are
  released, with one send that never blocks; what the socket does not take
  then is left to the consumer's pump.  The consumer's pump stays asleep and
  its consumer stays in ``_waiting``: a published message reaches its
  consumer without a hand-off between threads, as Go's goroutines pass it
  without one either.
* **Waking the pump** (a larger put, the topic pump's fan-out, a requeue, a
  timeout, or a consumer whose output is busy): the pump takes the messages
  itself.  That hand-off happens once per batch.

A FIN that frees RDY slots of a blocked consumer while messages wait is
served the first way too, by the consumer's own connection thread
(:meth:`Channel.finish_many`): the freed slots are refilled without waking
the pump.

Order is kept either way: a consumer's output is reserved before its
messages are taken and released only once they are written, so whoever
takes the next ones writes them after.  :class:`DirectDeliveries` states
that protocol: where the reservation is taken, and where it ends.
"""

from typing import Protocol


# The largest put delivered by the publisher's thread, and the most it takes
# for one consumer: an MPUB batch of the usual sizes (bench_writer's 200)
# goes directly too.  Waking each consumer's pump for every MPUB of a fan-out
# cost a thread hand-off per consumer and batch (a GIL switch each under
# CPython: the largest single cost of a fan-out to ten channels).  Larger
# puts, and what a socket does not take at once, go to the pumps.
DIRECT_DELIVERY_MAX = 512

# The most a FIN's refill writes from the consumer's own connection thread.
REFILL_MAX = 64

# A put whose bodies total more (unless it is one message) goes to the pumps,
# which write in chunks of output_buffer_size: a direct delivery is encoded
# whole, once per consumer, on the publisher's thread.
DIRECT_DELIVERY_BYTES = 1 << 20


class DirectDeliveries(list):
    """The consumers' outputs one publisher's put reserved, each with the messages taken for it.

    The direct-delivery protocol (see the module's docstring):

    * The publisher makes one (before it takes any lock) and passes it down
      the fan-out to :meth:`Channel.put_messages`.
    * Acquire: under the channel's lock, :meth:`Channel._deliver_to_waiting_locked`
      (or, for a lone message, :meth:`Channel._deliver_one_locked`) calls a
      waiting consumer's :meth:`Subscriber.hold_output` (never blocks); only
      if that reserved the output does it take messages for the consumer,
      and it appends ``(consumer, messages)`` here at once.
    * Release: the publisher calls :meth:`release` once it holds no lock,
      in a ``finally``: each output is written and released, whatever
      happened in between (a failed put included).

    Lock order: the reservation is taken under Topic._lock and Channel._lock
    and outlives both; nothing waits for it (``hold_output`` only tries), so
    it closes no cycle.  A list, so the publisher's ``if deliveries:`` costs
    nothing when there were none.
    """

    __slots__ = ()

    def release(self):
        """Write every reserved output's messages, which releases it (no lock held)."""
        for client, msgs in self:
            client.deliver_held(msgs)


class Subscriber(Protocol):
    """What a Channel needs from a subscriber (nsqd's ``Consumer`` interface).

    Set by the consumer, read by the channel: ``id`` (unique per broker, never
    reused: in-flight messages record it as their owner), ``ready_count`` (RDY),
    ``msg_timeout_ns`` and ``sample_rate`` (IDENTIFY).

    Changed only by the channel, under its lock: ``in_flight_count``,
    ``blocked`` (the pump found no free RDY slot and waits for a release),
    and the delivery counters ``message_count``, ``finish_count``,
    ``requeue_count``.

    Called by the channel with its lock held: :meth:`hold_output` (may the
    publisher's thread write to this consumer now?) and :meth:`pump_idle`
    (does its pump sleep with nothing in hand?).  Called without it:
    :meth:`wake` (look at the channel again), :meth:`deliver_held` (write
    what was taken under :meth:`hold_output`) and :meth:`close_connection`
    (the channel is closing).
    """

    id: int
    ready_count: int
    msg_timeout_ns: int
    sample_rate: int
    in_flight_count: int
    blocked: bool
    message_count: int
    finish_count: int
    requeue_count: int

    def wake(self):
        """Make the consumer's pump call :meth:`Channel.take` again soon."""

    def close_connection(self):
        """End the consumer's connection; its cleanup then calls :meth:`Channel.remove_client`."""

    def pump_idle(self):
        """True while the consumer's pump sleeps with nothing in hand and no wake-up pending."""

    def hold_output(self, own=False):
        """Reserve the consumer's output for :meth:`deliver_held` if it is free now (never blocks); True if reserved.

        ``own``: the caller is the consumer's own connection thread (its FINs), which may write to it
        too: no answer of its own must go first."""

    def deliver_held(self, msgs):
        """Write ``msgs`` (taken while the output was held) without blocking, then release the output."""
