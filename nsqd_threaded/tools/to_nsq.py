"""``to_nsq``: publish stdin to a topic, one message per line (or per ``--delimiter``), as Go NSQ 1.3's to_nsq.

Every message goes to every ``--nsqd-tcp-address`` (Go's tool publishes each
line to each of its producers).  The delimiter is one byte and is not part of
the message; empty messages are skipped.  ``--rate N`` publishes at most N
messages a second (Go's token bucket, at most one second of credit).  The
command exits 0 at the end of its input once every message is acknowledged,
and on SIGTERM/SIGINT stops reading, waits for what was sent, and exits 0.
An nsqd that cannot be reached, or whose publish fails, is named in an error
line and left out; the others keep getting every message, and the command
exits 1 at the end (at once when none is left).
"""

import concurrent.futures
import os
import selectors
import sys
import threading
import time

from .. import command
from ..client import NSQError, Producer
from ..client.connection import format_address
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

    ``done`` is set at the end of the input (after every acknowledgement) or
    once no nsqd is left.  ``live`` holds the producers still published to (the
    reader thread's): one whose connection or publish failed is logged and
    dropped, and ``exit_code`` becomes 1.  :meth:`stop` wakes the reader through
    a pipe (a read of stdin cannot be interrupted otherwise), joins it and
    closes the producers.  ``published`` counts messages acknowledged by every
    nsqd still live.
    """

    def __init__(self, options, stdin_fd=None):
        self.options = options
        self.log = common.tool_logger(options, TOOL)
        self.stdin_fd = sys.stdin.fileno() if stdin_fd is None else stdin_fd
        config = common.client_config(options.producer_opts, "producer-opt")
        config.set("user_agent", common.user_agent(TOOL))
        self.producers = [Producer(address, logger=self.log, log_id=i + 1, **config.producer_kwargs())
                          for i, address in enumerate(options.nsqd_tcp_addresses)]
        self.live = list(self.producers)
        self.delimiter = options.delimiter.encode("utf-8")
        self.done = threading.Event()
        self.exit_code = 0
        self.published = 0
        self._stopping = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        self._reader = None

    def start(self):
        for producer in self.producers:
            try:
                producer.connect()
            except (OSError, NSQError) as e:  # logged by the producer, naming the address
                self._drop(producer, e)
        if not self.live:
            raise OSError("no nsqd could be reached (%s)" % ", ".join(format_address(p.address) for p in self.producers))
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
        bodies = 0  # messages in `pending` (each once per live nsqd)
        try:
            for body in self._messages():
                if interval:
                    now = time.monotonic()
                    balance = min(float(rate), balance + (now - refilled) / interval)
                    refilled = now
                    if balance < 1.0 and self._stopping.wait((1.0 - balance) * interval):
                        break
                    balance -= 1.0
                for producer in list(self.live):
                    try:
                        pending.append((producer, producer.pub_async(self.options.topic, body)))
                    except (OSError, NSQError) as e:
                        self._drop(producer, e)
                bodies += 1
                if len(pending) >= MAX_PENDING or not self.live:
                    self._settle(pending, bodies)
                    bodies = 0
                if not self.live:
                    self.log.error("no nsqd left to publish to")
                    return
            self._settle(pending, bodies)
        except Exception as e:  # not an nsqd's failure (those drop it): end with a line, exit 1
            self.log.error("%s", command.error_text(e))
            self.exit_code = 1
        finally:
            self.done.set()

    def _settle(self, pending, bodies):
        """Wait for every answer; a failed one drops its nsqd.  The ``bodies`` count once the live nsqd took them."""
        for producer, future in pending:
            try:
                future.result(timeout=60)
            except (OSError, NSQError, concurrent.futures.TimeoutError) as e:
                self._drop(producer, e)
        if self.live:
            self.published += bodies
        del pending[:]

    def _drop(self, producer, error):
        """Stop publishing to ``producer`` (its nsqd failed): say which and why; the command will exit 1."""
        if producer in self.live:
            self.live.remove(producer)
            self.log.error("%s: %s; not publishing to it any more", format_address(producer.address),
                           command.error_text(error))
        self.exit_code = 1

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
