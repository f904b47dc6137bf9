"""``nsq_tail``: print the messages of one or more topics, as Go NSQ 1.3's nsq_tail does.

Each message is written to stdout as its body and a newline (``--print-topic``:
``topic | body``), byte for byte what Go's tool writes.  The channel is
``tail<6 digits>#ephemeral`` unless ``--channel`` says otherwise, so tailing
leaves nothing behind.  With ``-n N`` the command exits 0 after N messages of a
topic (and asks for no more than N at once); otherwise it runs until SIGTERM or
SIGINT.  A topic's consumer is go-nsq's: ``--consumer-opt`` takes go-nsq's
option names (:class:`~nsqd_threaded.client.ClientConfig`).
"""

import random
import sys
import threading

from .. import command
from ..client import Consumer
from ..settings.options import BOOL, INT, STR, STR_LIST, OptionError, Setting
from . import common

TOOL = "nsq_tail"

SETTINGS = (
    Setting("channel", STR, "", "NSQ channel"),
    common.consumer_opt(),
    common.lookupd_http(),
    Setting("max-in-flight", INT, 200, "max number of messages to allow in flight"),
    Setting("n", INT, 0, "total messages to show (will wait if starved)"),
    common.nsqd_tcp(),
    Setting("print-topic", BOOL, False, "print topic name where message was received"),
    Setting("topic", STR_LIST, (), "NSQ topic (may be given multiple times)", field="topics"),
    common.CONFIG_SETTING,
    common.VERSION_SETTING,
)


def _validate(options):
    common.one_of_nsqd_or_lookupd(options.nsqd_tcp_addresses, options.lookupd_http_addresses)
    if not options.topics:
        raise OptionError("--topic required")
    common.client_config(options.consumer_opts, "consumer-opt")
    common.valid_names(options.topics, options.channel)


TailOptions = command.table_options("TailOptions", SETTINGS, _validate)


class Tail:
    """The nsq_tail app: one Consumer per topic, each message written to ``out`` (stdout's bytes).

    ``_out_lock`` guards ``out`` and ``shown`` (the messages written per topic)
    so that lines of different topics never interleave.  ``done`` is set once
    ``-n`` messages of a topic were written, or writing failed (``exit_code`` 1).
    """

    def __init__(self, options, out=None):
        self.options = options
        self.log = common.tool_logger(options, TOOL)
        self.out = out if out is not None else sys.stdout.buffer
        self.channel = options.channel or "tail%06d#ephemeral" % (random.randrange(1 << 62) % 999999)
        config = common.client_config(options.consumer_opts, "consumer-opt")
        max_in_flight = options.max_in_flight
        if 0 < options.n < max_in_flight:
            max_in_flight = options.n  # don't ask for more messages than we want
        config.set("max_in_flight", max_in_flight)
        config.set("user_agent", common.user_agent(TOOL))
        self.config = config
        self.done = threading.Event()
        self.exit_code = 0
        self._out_lock = threading.Lock()
        self.shown = {}
        self.consumers = []

    def start(self):
        kwargs = self.config.consumer_kwargs()
        lookupds = self.options.lookupd_http_addresses
        for topic in self.options.topics:
            self.log.info("Adding consumer for topic: %s", topic)
            consumer = Consumer(self.options.nsqd_tcp_addresses or None, topic, self.channel, self._handler(topic),
                                lookupd_http_addresses=lookupds or None, logger=self.log,
                                log_id=len(self.consumers) + 1, **kwargs)
            self.consumers.append(consumer)
            consumer.start(wait=not lookupds)  # over lookupd a failed query is logged and polled again
        return self

    def _handler(self, topic):
        prefix = topic.encode("utf-8") + b" | " if self.options.print_topic else b""
        limit = self.options.n

        def handle(msg):
            with self._out_lock:
                if self.done.is_set():
                    msg.req(0)  # past -n or a failed write: back to the channel at once, no backoff
                    return None
                try:
                    self.out.write(prefix + msg.body + b"\n")
                    self.out.flush()
                except (OSError, ValueError) as e:
                    self.log.error("failed to write to os.Stdout - %s", e)
                    self.exit_code = 1
                    self.done.set()
                    msg.req(0)
                    return None
                shown = self.shown[topic] = self.shown.get(topic, 0) + 1
                if limit > 0 and shown >= limit:
                    self.done.set()
            return True

        return handle

    def stop(self):
        """Close every consumer (CLS; what was not shown goes back to the channel).  Idempotent."""
        for consumer in self.consumers:
            consumer.close()


main = command.AppCommand(
    "nsq_tail-threaded",
    SETTINGS,
    TailOptions,
    Tail,
    log_prefix="[%s] " % TOOL,
    help="NSQ 1.3's nsq_tail in pure Python: print a topic's messages.  Flags are nsq_tail's.",
)
