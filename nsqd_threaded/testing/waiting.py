"""Waiting until a topic's or channel's /stats figures reach given values, and reading a channel's messages.

:meth:`Broker.wait_until <nsqd_threaded.testing.Broker.wait_until>` is woken by
the broker itself (its :class:`~nsqd_threaded.broker.watch.StateWatch`) each
time a topic or channel changes, and reads the figures in this process.
:meth:`BrokerProcess.wait_until <nsqd_threaded.testing.BrokerProcess.wait_until>`
cannot be woken across the process boundary: it asks ``/stats`` over HTTP,
at once and then every few milliseconds (the interval grows from
:data:`POLL_FIRST` to :data:`POLL_MAX`) until the deadline.

Either way a topic or channel that does not exist yet is "not yet", and a
timeout raises :class:`TimeoutError` naming each expected field's last value.
"""

import json
import time
from urllib.parse import urlencode

from ..broker import stats
from ..broker.peek import PEEK_MAX, channel_messages, held_from_doc

POLL_FIRST = 0.005  # seconds before BrokerProcess.wait_until asks /stats again
POLL_MAX = 0.1  # the longest interval between two of its questions


def find_stats(doc, topic, channel=None):
    """The topic's (or its channel's) dict in a /stats document, or None when it is not there."""
    for t in doc.get("topics") or ():
        if t["topic_name"] != topic:
            continue
        if channel is None:
            return t
        for c in t["channels"] or ():
            if c["channel_name"] == channel:
                return c
    return None


class Expectation:
    """What a ``wait_until`` waits for, and what it saw last (for the timeout's message)."""

    def __init__(self, topic, channel, expected):
        self.topic = topic
        self.channel = channel
        self.expected = expected
        self.last = None  # the last dict seen; None while the topic or channel did not exist
        self.unreachable = None  # the last failure to ask (BrokerProcess: the broker restarting)

    def check(self, doc):
        """The topic's or channel's dict if every expected field has its value in ``doc``, else None."""
        found = find_stats(doc, self.topic, self.channel)
        self.last = found
        self.unreachable = None
        if found is None:
            return None
        for key, value in self.expected.items():
            if found.get(key, _MISSING) != value:
                return None
        return found

    def timeout_error(self, timeout):
        where = "topic %r" % self.topic + (" channel %r" % self.channel if self.channel is not None else "")
        if self.unreachable is not None:
            seen = "the broker did not answer (%s)" % self.unreachable
        elif self.last is None:
            seen = "it does not exist"
        else:
            seen = ", ".join("%s=%r (expected %r)" % (key, self.last.get(key, _MISSING), value)
                             for key, value in self.expected.items()) or "it exists"
        return TimeoutError("%s: not as expected after %gs: %s" % (where, timeout, seen))


class _Missing:
    def __repr__(self):
        return "<no such field>"


_MISSING = _Missing()


def wait_in_process(nsqd, topic, channel, timeout, expected):
    """``Broker.wait_until``: woken by ``nsqd``'s StateWatch, reading its figures directly."""
    expectation = Expectation(topic, channel, expected)

    def check():
        return expectation.check(stats.collect(nsqd, topic_name=topic, channel_name=channel, include_mem=False))

    found = nsqd.watch.wait_for(check, timeout)
    if found is None:
        raise expectation.timeout_error(timeout)
    return found


def wait_over_http(served, topic, channel, timeout, expected):
    """``BrokerProcess.wait_until``: ``/stats`` over HTTP until it matches or the deadline passes."""
    expectation = Expectation(topic, channel, expected)
    deadline = time.monotonic() + timeout
    interval = POLL_FIRST
    params = {"topic": topic}
    if channel is not None:
        params["channel"] = channel
    while True:
        try:
            found = expectation.check(served.stats(**params))
        except (OSError, RuntimeError) as e:  # refused while it restarts; a /stats error
            expectation.unreachable = str(e) or type(e).__name__
            found = None
        if found is not None:
            return found
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise expectation.timeout_error(timeout)
        time.sleep(min(interval, remaining))
        interval = min(interval * 2, POLL_MAX)


def _not_there(topic, channel, what):
    if what == "topic":
        return LookupError("topic %r does not exist (so neither does its channel %r)" % (topic, channel))
    return LookupError("channel %r of topic %r does not exist" % (channel, topic))


def messages_in_process(nsqd, topic, channel):
    """``Broker.messages``: the channel's messages read in this process; LookupError naming the topic or
    channel that does not exist ([] is an empty channel)."""
    t = nsqd.get_existing_topic(topic)
    if t is None:
        raise _not_there(topic, channel, "topic")
    c = t.get_existing_channel(channel)
    if c is None:
        raise _not_there(topic, channel, "channel")
    return channel_messages(c, now_ns=nsqd.clock.time_ns())


def messages_over_http(served, topic, channel):
    """``BrokerProcess.messages``: ``GET /channel/peek`` with whole bodies (LookupError naming the topic or
    channel that does not exist).

    Raises RuntimeError when the broker does not serve the route (it was started
    without ``--channel-peek``) and when the channel holds more than one peek answers.
    """
    query = urlencode({"topic": topic, "channel": channel, "n": PEEK_MAX, "body": "base64"})
    status, body = served.http("GET", "/channel/peek?" + query)
    if status == 404:
        missing = json.loads(body).get("message")
        if missing in ("TOPIC_NOT_FOUND", "CHANNEL_NOT_FOUND"):
            raise _not_there(topic, channel, "topic" if missing == "TOPIC_NOT_FOUND" else "channel")
    if status != 200:
        raise RuntimeError("/channel/peek answered %d: %r (is the broker run with --channel-peek?)" % (status, body))
    answer = json.loads(body)
    docs = answer["messages"]
    if len(docs) >= PEEK_MAX:
        raise RuntimeError("the channel holds %d messages or more: more than one peek answers" % PEEK_MAX)
    return [held_from_doc(d, answer.get("now_ns")) for d in docs]
