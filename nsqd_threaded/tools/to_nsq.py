"""``to_nsq``: publish stdin to a topic, one message per line (or per ``--delimiter``), as Go NSQ 1.3's to_nsq.

Every message goes to every ``--nsqd-tcp-address`` (Go's tool publishes each
line to each of its producers).  The delimiter is one byte and is not part of
the message; empty messages are skipped.  ``--rate N`` publishes at most N
messages a second (Go's token bucket, at most one second of credit).  The
command exits 0 at the end of its input once every message is acknowledged, 1
when a publish fails, and on SIGTERM/SIGINT stops reading, waits for what was
sent, and exits 0.
"""

import os
import selectors
import sys
import threading
import time

from .. import command
from ..client import Producer
from ..settings.options import INT, STR, OptionError, Setting
from . import common

TOOL = "to_nsq"

# Messages sent and not yet acknowledged, at most: the pipeline's depth.
MAX_PENDING = 256

SETTINGS = (
    Setting("delimiter", STR, "\n", "character to split input from stdin"),
    common.nsqd_tcp("destination nsqd TCP address (may be given multiple times)"),
    common.producer_opt(),
    Setting("rate", INT, 0, "Throttle messages to n/second. 0 to disable"),
    Setting("topic", STR, "", "NSQ topic to publish to"),
    common.CONFIG_SETTING,
)


def _validate(options):
    if not options.topic:
        raise OptionError("--topic required")
    if len(options.delimiter.encode("utf-8")) != 1:
        raise OptionError("--delimiter must be a single byte")
    common.client_config(options.producer_opts, "producer-opt")
    if not options.nsqd_tcp_addresses:
        raise OptionError("--nsqd-tcp-address required")


ToNSQOptions = command.table_options("ToNSQOptions", SETTINGS, _validate)


class ToNSQ:
    """The to_nsq app: the ``to_nsq-stdin`` thread reads ``stdin_fd`` and publishes.

    ``done`` is set at the end of the input (after every acknowledgement) or on a
    failed publish (``exit_code`` 1).  :meth:`stop` wakes the reader through a
    pipe (a read of stdin cannot be interrupted otherwise), joins it and closes
    the producers.  ``published`` counts messages acknowledged by every nsqd.
    """

    def __init__(self, options, stdin_fd=None):
        self.options = options
        self.log = common.tool_logger(options, TOOL)
        self.stdin_fd = sys.stdin.fileno() if stdin_fd is None else stdin_fd
        config = common.client_config(options.producer_opts, "producer-opt")
        config.set("user_agent", common.user_agent(TOOL))
        self.producers = [Producer(address, **config.producer_kwargs()) for address in options.nsqd_tcp_addresses]
        self.delimiter = options.delimiter.encode("utf-8")
        self.done = threading.Event()
        self.exit_code = 0
        self.published = 0
        self._stopping = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        self._reader = None

    def start(self):
        for producer in self.producers:
            producer.connect()
        if self.options.rate >= 1:
            self.log.info("Throttling messages rate to max:%d/second", self.options.rate)
        self._reader = threading.Thread(target=self._run, name="to_nsq-stdin")
        self._reader.start()
        return self

    def _chunks(self):
        """stdin's bytes as they come, until EOF or stop()."""
        with selectors.PollSelector() as selector:  # poll, unlike epoll, takes a regular file too
            selector.register(self.stdin_fd, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while not self._stopping.is_set():
                ready = {key.fd for key, _ in selector.select()}
                if self._wake_r in ready:
                    return
                chunk = os.read(self.stdin_fd, 65536)
                if not chunk:
                    return
                yield chunk

    def _messages(self):
        rest = b""
        for chunk in self._chunks():
            parts = (rest + chunk).split(self.delimiter)
            rest = parts.pop()
            for part in parts:
                if part:
                    yield part
        if rest and not self._stopping.is_set():
            yield rest  # the last line without a delimiter (Go drops its last byte; see docs/divergences.md)

    def _run(self):
        pending = []
        rate = self.options.rate
        interval = 1.0 / rate if rate >= 1 else 0.0
        balance, refilled = 1.0, time.monotonic()
        try:
            for body in self._messages():
                if interval:
                    now = time.monotonic()
                    balance = min(float(rate), balance + (now - refilled) / interval)
                    refilled = now
                    if balance < 1.0 and self._stopping.wait((1.0 - balance) * interval):
                        break
                    balance -= 1.0
                for producer in self.producers:
                    pending.append(producer.pub_async(self.options.topic, body))
                if len(pending) >= MAX_PENDING:
                    self._settle(pending)
            self._settle(pending)
        except Exception as e:  # a failed publish ends the command, as Go's log.Fatal does
            self.log.error("%s", command.error_text(e))
            self.exit_code = 1
        finally:
            self.done.set()

    def _settle(self, pending):
        """Wait for every answer (raising the first failure); each message counts once all nsqd took it."""
        for future in pending:
            future.result(timeout=60)
        self.published += len(pending) // len(self.producers)
        del pending[:]

    def stop(self):
        """Stop reading, wait for what was sent, close the producers.  Idempotent."""
        self._stopping.set()
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        if self._reader is not None:
            self._reader.join()
        for producer in self.producers:
            producer.close()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._wake_r = self._wake_w = -1


main = command.AppCommand(
    "to_nsq-threaded",
    SETTINGS,
    ToNSQOptions,
    ToNSQ,
    log_prefix="[%s] " % TOOL,
    help="NSQ 1.3's to_nsq in pure Python: publish stdin to a topic, one message per line.  Flags are to_nsq's.",
)
