"""``nsq_to_nsq``: relay topics to other nsqd, as Go NSQ 1.3's nsq_to_nsq does.

Each message of every ``--topic`` (on ``--channel``, ``nsq_to_nsq``) is
published to one ``--destination-nsqd-tcp-address`` chosen by ``--mode``
(:mod:`.upstream`: ``hostpool``, the default, ``round-robin``,
``epsilon-greedy``; any other value is round robin, as in Go), under the same
topic or ``--destination-topic``.  The message is FINed only once the
destination answered ``OK``; a failed publish requeues it with go-nsq's delay
and backs the consumer off.  Publishes are pipelined: the handler does not
wait for the answer.

JSON filters, for messages that are JSON objects: ``--require-json-field``
passes only messages with that field (others are FINed and dropped), and with
``--require-json-value`` only those where it has that value (a string equal to
it, or a number equal to it when it parses as a number); a message missing
the field is then requeued with backoff, as Go does.  ``--whitelist-json-field``
(repeated) republishes only those fields, re-encoded as Go's encoding/json
does (keys sorted, ``<``, ``>`` and ``&`` escaped).  With a filter, a message
that is not a JSON object is dropped with an error line.

SIGTERM/SIGINT: CLS on every consumer, wait for the destinations' answers to
what was sent (FIN or REQ each), requeue the rest, exit 0.
"""

import json
import math
import re
import threading
import time

from .. import command
from ..client import Consumer, Producer
from ..client.connection import ConnectionClosed, NSQError
from ..settings.options import INT, STR, STR_LIST, OptionError, Setting
from ..wire.protocol_v2 import is_valid_name
from . import common, upstream

TOOL = "nsq_to_nsq"

SETTINGS = (
    Setting("channel", STR, "nsq_to_nsq", "nsq channel"),
    Setting("consumer-opt", STR_LIST, (), "option to passthrough to nsq.Consumer (may be given multiple times, "
            "see http://godoc.org/github.com/nsqio/go-nsq#Config)", field="consumer_opts"),
    Setting("destination-nsqd-tcp-address", STR_LIST, (), "destination nsqd TCP address (may be given multiple "
            "times)", field="destination_nsqd_tcp_addresses"),
    Setting("destination-topic", STR, "", "use this destination topic for all consumed topics (default is "
            "consumed topic name)"),
    common.lookupd_http(),
    Setting("max-in-flight", INT, 200, "max number of messages to allow in flight"),
    Setting("mode", STR, "hostpool", "the upstream request mode options: round-robin, hostpool (default), "
            "epsilon-greedy"),
    common.nsqd_tcp(),
    Setting("producer-opt", STR_LIST, (), "option to passthrough to nsq.Producer (may be given multiple times, "
            "see http://godoc.org/github.com/nsqio/go-nsq#Config)", field="producer_opts"),
    Setting("require-json-field", STR, "", "for JSON messages: only pass messages that contain this field"),
    Setting("require-json-value", STR, "", "for JSON messages: only pass messages in which the required field "
            "has this value"),
    Setting("status-every", INT, 250, "the # of requests between logging status (per destination), 0 disables"),
    Setting("topic", STR_LIST, (), "nsq topic (may be given multiple times)", field="topics"),
    common.CONFIG_SETTING,
    common.VERSION_SETTING,
    Setting("whitelist-json-field", STR_LIST, (), "for JSON messages: pass this field (may be given multiple "
            "times)", field="whitelist_json_fields"),
)


def _validate(o):
    """Go's checks, in Go's order."""
    if not o.topics or not o.channel:
        raise OptionError("--topic and --channel are required")
    for topic in o.topics:
        if not is_valid_name(topic):
            raise OptionError("--topic is invalid")
    if o.destination_topic and not is_valid_name(o.destination_topic):
        raise OptionError("--destination-topic is invalid")
    if not is_valid_name(o.channel):
        raise OptionError("--channel is invalid")
    if not o.nsqd_tcp_addresses and not o.lookupd_http_addresses:
        raise OptionError("--nsqd-tcp-address or --lookupd-http-address required")
    if o.nsqd_tcp_addresses and o.lookupd_http_addresses:
        raise OptionError("use --nsqd-tcp-address or --lookupd-http-address not both")
    if not o.destination_nsqd_tcp_addresses:
        raise OptionError("--destination-nsqd-tcp-address required")
    common.client_config(o.consumer_opts, "consumer-opt")
    common.client_config(o.producer_opts, "producer-opt")


ToNSQOptions = command.table_options("ToNSQRelayOptions", SETTINGS, _validate)


# -- JSON as Go's encoding/json reads and writes it ------------------------------------------------


def _go_number(text):
    value = float(text)
    if math.isinf(value):
        raise ValueError("number %s out of range" % text)
    return value


def _no_constant(name):
    raise ValueError("invalid character %r looking for beginning of value" % name)


def decode_object(body):
    """A message body as Go's ``json.Unmarshal`` into a map: a dict (numbers as floats); ValueError otherwise."""
    value = json.loads(body.decode("utf-8", "replace"), parse_int=_go_number, parse_float=_go_number,
                       parse_constant=_no_constant)
    if value is None:
        return {}  # Go leaves the map empty for null
    if not isinstance(value, dict):
        raise ValueError("json: cannot unmarshal %s into a map" % type(value).__name__)
    return value


_ESCAPES = {c: "\\u%04x" % c for c in range(0x20)}
_ESCAPES.update({ord('"'): '\\"', ord("\\"): "\\\\", ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t",
                 ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026",
                 0x2028: "\\u2028", 0x2029: "\\u2029"})
_SURROGATE = re.compile("[\ud800-\udfff]")


def _go_string(text):
    return '"' + _SURROGATE.sub("\ufffd", text).translate(_ESCAPES) + '"'


def _go_float(value):
    """Go's float64 encoding: shortest round-trip digits, exponent only below 1e-6 or from 1e21."""
    magnitude = abs(value)
    text = repr(value)
    if magnitude != 0 and (magnitude < 1e-6 or magnitude >= 1e21):
        return re.sub(r"e-0(\d)$", r"e-\1", text)
    if "e" in text:
        mantissa, _, exponent = text.partition("e")
        sign = "-" if mantissa.startswith("-") else ""
        digits = mantissa.lstrip("-").replace(".", "")
        point = len(mantissa.lstrip("-").partition(".")[0]) + int(exponent)
        if point <= 0:
            text = sign + "0." + "0" * -point + digits
        else:
            text = sign + digits[:point] + "0" * max(0, point - len(digits)) + (
                "." + digits[point:] if point < len(digits) else "")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def encode_go_json(value):
    """``value`` (from :func:`decode_object`) as Go's ``json.Marshal`` writes it: compact, keys sorted."""
    if isinstance(value, dict):
        return "{" + ",".join(_go_string(k) + ":" + encode_go_json(value[k]) for k in sorted(value)) + "}"
    if isinstance(value, list):
        return "[" + ",".join(encode_go_json(v) for v in value) + "]"
    if isinstance(value, str):
        return _go_string(value)
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    return _go_float(float(value))


class JSONFilter:
    """``--require-json-field``/``--require-json-value``/``--whitelist-json-field``, as Go applies them."""

    def __init__(self, field, value, whitelist):
        self.field = field
        self.value = value
        self.whitelist = list(whitelist)
        self.number = None
        if value:
            try:
                self.number = float(value) if "_" not in value else None
            except ValueError:
                try:
                    self.number = float.fromhex(value)
                except ValueError:
                    self.number = None

    @property
    def active(self):
        return bool(self.field or self.whitelist)

    def check(self, doc):
        """``(pass, backoff)`` for a decoded message."""
        if not self.field:
            return True, False
        if self.field not in doc:
            return False, bool(self.value)
        if not self.value:
            return True, False
        found = doc[self.field]
        if isinstance(found, str):
            return found == self.value, False
        if self.number is not None:
            return isinstance(found, float) and found == self.number, False
        return False, False

    def rewrite(self, doc, body):
        """The body to publish: as it came, or only the whitelisted fields."""
        if not self.whitelist:
            return body
        return encode_go_json({k: doc[k] for k in self.whitelist if k in doc}).encode("utf-8")


class Relay:
    """The nsq_to_nsq app: a Consumer per topic, a Producer per destination, answers matched to messages.

    ``_lock`` (and the ``_settled`` condition on it) guards ``_stopping`` and
    ``_pending``, the publishes sent and not yet answered, so that a stop waits
    for every answer before the consumers' connections close.
    """

    def __init__(self, options):
        self.options = o = options
        self.log = common.tool_logger(options, TOOL)
        agent = common.user_agent(TOOL)
        cconfig = common.client_config(o.consumer_opts, "consumer-opt")
        cconfig.set("user_agent", agent)
        cconfig.set("max_in_flight", o.max_in_flight)
        pconfig = common.client_config(o.producer_opts, "producer-opt")
        pconfig.set("user_agent", agent)
        self.cconfig = cconfig
        self.addresses = list(dict.fromkeys(o.destination_nsqd_tcp_addresses))
        self.producers = {a: Producer(a, logger=self.log, log_id=i + 1, **pconfig.producer_kwargs())
                          for i, a in enumerate(self.addresses)}
        self.pool = upstream.pool_for(o.mode, self.addresses) or upstream.RoundRobin(self.addresses)
        single = len(self.addresses) == 1
        self.per_address = {a: upstream.TimerMetrics(0 if single else o.status_every, "[%s]:" % a, self.log)
                            for a in self.addresses}
        self.aggregate = upstream.TimerMetrics(o.status_every, "[aggregate]:", self.log)
        self.filter = JSONFilter(o.require_json_field, o.require_json_value, o.whitelist_json_fields)
        self.consumers = []
        self.relayed = 0  # messages FINed after their destination's OK
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)
        self._pending = 0
        self._stopping = False

    def start(self):
        o = self.options
        kwargs = self.cconfig.consumer_kwargs()
        for topic in o.topics:
            destination = o.destination_topic or topic
            consumer = Consumer(o.nsqd_tcp_addresses or None, topic, o.channel, self._handler(destination),
                                lookupd_http_addresses=o.lookupd_http_addresses or None,
                                concurrency=len(self.addresses), logger=self.log,
                                log_id=len(self.addresses) + len(self.consumers) + 1, **kwargs)
            self.consumers.append(consumer)
            consumer.start(wait=not o.lookupd_http_addresses)  # lookupd failures: logged, polled again
        return self

    def _handler(self, destination):
        def handle(msg):
            return self.relay(msg, destination)

        return handle

    def relay(self, msg, destination):
        """Filter ``msg`` and publish it; it is answered when the destination answers."""
        body = msg.body
        if self.filter.active:
            try:
                doc = decode_object(body)
            except ValueError:
                self.log.error("Unable to decode json: %s", body.decode("utf-8", "replace"))
                return True
            passed, backoff = self.filter.check(doc)
            if not passed:
                if backoff:
                    self.log.error("missing field to check required value")
                    return False
                return True
            body = self.filter.rewrite(doc, body)
        with self._lock:
            if self._stopping:
                msg.req(0)  # stopping: straight back to the channel, no backoff
                return None
            self._pending += 1
        started = time.monotonic()
        choice = self.pool.get()
        try:
            future = self.producers[choice.host].pub_async(destination, body)
        except (OSError, NSQError) as e:
            choice.mark(e)
            self._settle()
            self.log.warn("Handler returned error (%s) for msg %s", command.error_text(e),
                          msg.id.decode("ascii", "replace"))
            return False
        msg.enable_async()
        future.add_done_callback(lambda f: self._answered(msg, choice, started, f))
        return None

    def _answered(self, msg, choice, started, future):
        """On the producer's reader thread: FIN after OK, REQ (with backoff) after a failure."""
        error = future.exception()
        choice.mark(error)
        try:
            if error is None:
                msg.fin()
                with self._lock:
                    self.relayed += 1
            else:
                self.log.warn("publish to %s failed (%s): requeueing %s", choice.host, command.error_text(error),
                              msg.id.decode("ascii", "replace"))
                msg.req(-1, backoff=True)
        except ConnectionClosed:
            pass  # its connection ended: nsqd delivers it again
        finally:
            self._settle()
        self.per_address[choice.host].status(started)
        self.aggregate.status(started)

    def _settle(self):
        with self._settled:
            self._pending -= 1
            if self._pending == 0:
                self._settled.notify_all()

    def stop(self):
        """CLS, wait for the answers to what was published, then close everything.  Idempotent."""
        for consumer in self.consumers:
            consumer.stop_receiving()
        with self._settled:
            self._stopping = True
            self._settled.wait_for(lambda: self._pending == 0, timeout=30.0)
        for consumer in self.consumers:
            consumer.close()
        for producer in self.producers.values():
            producer.close()


main = command.AppCommand(
    "nsq_to_nsq-threaded",
    SETTINGS,
    ToNSQOptions,
    Relay,
    log_prefix="[%s] " % TOOL,
    help="NSQ 1.3's nsq_to_nsq in pure Python: relay topics to other nsqd.  Flags are nsq_to_nsq's.",
)
