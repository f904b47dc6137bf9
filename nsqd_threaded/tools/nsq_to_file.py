"""``nsq_to_file``: archive topics to files, one message body and a newline per message, as Go NSQ 1.3's.

Files are named by ``--filename-format`` (default ``<TOPIC>.<HOST><REV>.<DATETIME>.log``):
``<TOPIC>``, ``<HOST>`` (the short hostname, or ``--host-identifier`` with
``<SHORT_HOST>``/``<HOSTNAME>``), ``<PID>``, ``<DATETIME>`` (``--datetime-format``,
strftime's codes) and ``<REV>`` (``-000000``, ``-000001`` ... so that no file is
overwritten; required with ``--gzip``, rotation or a ``--work-dir``, removed
otherwise, and then a file is appended to).  ``--gzip`` adds ``.gz``.

A file rotates when its name changes (the hour, by default), after
``--rotate-interval``, or past ``--rotate-size`` bytes (of messages, before
compression).  Files are written in ``--work-dir`` and moved to
``--output-dir`` when closed, never over an existing file (the revision goes
up instead).

What is durable is what is FINed: messages are written, and FINed only after the
file is synced (fsync; with gzip, after the gzip member holding them is
finished, so a file is a series of complete members): every ``--sync-interval``,
when ``--max-in-flight`` messages wait, when most of them do (go-nsq's
"starved"), at rotation and at exit.  SIGHUP syncs and closes the files (the
next message opens new ones: for log rotation tools).  SIGTERM/SIGINT: CLS,
every message already received written and synced and FINed, every file
closed and moved; nothing is lost, and what was not received stays in the
channel.

Without ``--topic``, the topics are those nsqlookupd lists (``/topics``,
every ``--topic-refresh``) that ``--topic-pattern`` matches.
"""

import os
import queue
import re
import socket
import threading
import time
import zlib

from .. import command
from ..client import Consumer
from ..client.consumer import fin_all
from ..client.lookupd import parse_lookupd_address, query_lookupd
from ..settings.options import BOOL, DURATION, INT, LOG_LEVEL, STR, STR_LIST, OptionError, Setting, parse_log_level
from . import common

TOOL = "nsq_to_file"

SETTINGS = (
    Setting("channel", STR, "nsq_to_file", "nsq channel"),
    common.consumer_opt(),
    Setting("datetime-format", STR, "%Y-%m-%d_%H", "strftime compatible format for <DATETIME> in filename format"),
    Setting("filename-format", STR, "<TOPIC>.<HOST><REV>.<DATETIME>.log", "output filename format (<TOPIC>, "
            "<HOST>, <PID>, <DATETIME>, <REV> are replaced. <REV> is increased when file already exists)"),
    Setting("gzip", BOOL, False, "gzip output files."),
    Setting("gzip-level", INT, 6, "gzip compression level (1-9, 1=BestSpeed, 9=BestCompression)"),
    Setting("host-identifier", STR, "", "value to output in log filename in place of hostname. <SHORT_HOST> and "
            "<HOSTNAME> are valid replacement tokens"),
    Setting("http-client-connect-timeout", DURATION, 2.0, "timeout for HTTP connect"),
    Setting("http-client-request-timeout", DURATION, 5.0, "timeout for HTTP request"),
    Setting("log-level", LOG_LEVEL, "info", "set log verbosity: debug, info, warn, error, or fatal"),
    Setting("log-prefix", STR, "[nsq_to_file] ", "log message prefix"),
    common.lookupd_http(),
    Setting("max-in-flight", INT, 200, "max number of messages to allow in flight"),
    common.nsqd_tcp(),
    Setting("output-dir", STR, "/tmp", "directory to write output files to"),
    Setting("rotate-interval", DURATION, 0.0, "rotate the file every duration"),
    Setting("rotate-size", INT, 0, "rotate the file when it grows bigger than rotate-size bytes"),
    Setting("skip-empty-files", BOOL, False, "skip writing empty files"),
    Setting("sync-interval", DURATION, 30.0, "sync file to disk every duration"),
    Setting("topic", STR_LIST, (), "nsq topic (may be given multiple times)", field="topics"),
    Setting("topic-pattern", STR, "", "only log topics matching the following pattern"),
    Setting("topic-refresh", DURATION, 60.0, "how frequently the topic list should be refreshed",
            field="topic_refresh_interval"),
    common.CONFIG_SETTING,
    common.VERSION_SETTING,
    Setting("work-dir", STR, "", "directory for in-progress files before moving to output-dir"),
)


def _validate(o):
    """Go's checks, in Go's order."""
    parse_log_level(o.log_level)
    if not o.channel:
        raise OptionError("--channel is required")
    if o.http_client_connect_timeout <= 0:
        raise OptionError("--http-client-connect-timeout should be positive")
    if o.http_client_request_timeout <= 0:
        raise OptionError("--http-client-request-timeout should be positive")
    if not o.nsqd_tcp_addresses and not o.lookupd_http_addresses:
        raise OptionError("--nsqd-tcp-address or --lookupd-http-address required.")
    if o.nsqd_tcp_addresses and o.lookupd_http_addresses:
        raise OptionError("use --nsqd-tcp-address or --lookupd-http-address not both")
    if not 1 <= o.gzip_level <= 9:
        raise OptionError("invalid --gzip-level value (%d), should be 1-9" % o.gzip_level)
    if not o.topics and not o.topic_pattern:
        raise OptionError("--topic or --topic-pattern required")
    if not o.topics and not o.lookupd_http_addresses:
        raise OptionError("--lookupd-http-address must be specified when no --topic specified")
    if o.topic_pattern:
        try:
            re.compile(o.topic_pattern)
        except re.error as e:
            raise OptionError("invalid --topic-pattern: %s" % e) from None
    if (o.gzip or o.rotate_size > 0 or o.rotate_interval > 0 or (o.work_dir and o.work_dir != o.output_dir)) \
            and "<REV>" not in o.filename_format:
        raise OptionError("missing <REV> in --filename-format when gzip, rotation, or work dir enabled")
    common.client_config(o.consumer_opts, "consumer-opt")
    common.valid_names(o.topics, o.channel)


ToFileOptions = command.table_options("ToFileOptions", SETTINGS, _validate)

# The strftime codes Go's nsq_to_file knows (others are copied as they are).
_STRFTIME_CODES = set("BbmAadHIMSYypZz%")


def strftime(fmt, when):
    """``--datetime-format`` of a ``time.struct_time``, with the codes Go's nsq_to_file converts."""
    out = []
    i = 0
    while i < len(fmt):
        if fmt[i] == "%" and i + 1 < len(fmt) and fmt[i + 1] in _STRFTIME_CODES:
            out.append(time.strftime(fmt[i:i + 2], when))
            i += 2
        else:
            out.append(fmt[i])
            i += 1
    return "".join(out)


def filename_format(options, topic, hostname=None, pid=None):
    """Go's computeFilenameFormat: every token but ``<DATETIME>`` (and ``<REV>`` when used) replaced."""
    hostname = hostname or socket.gethostname()
    short = hostname.split(".")[0]
    identifier = short
    if options.host_identifier:
        identifier = options.host_identifier.replace("<SHORT_HOST>", short).replace("<HOSTNAME>", hostname)
    fmt = options.filename_format
    if not (options.gzip or options.rotate_size > 0 or options.rotate_interval > 0
            or options.work_dir != options.output_dir):
        fmt = fmt.replace("<REV>", "")
    fmt = fmt.replace("<TOPIC>", topic).replace("<HOST>", identifier)
    fmt = fmt.replace("<PID>", str(os.getpid() if pid is None else pid))
    if options.gzip and not fmt.endswith(".gz"):
        fmt += ".gz"
    return fmt


_TERM, _HUP = object(), object()


class FileLogger:
    """One topic's consumer and its file; the ``nsq_to_file[topic]`` thread does all the file work.

    Messages arrive on the consumer's reader threads and are queued to the
    router thread, which alone touches the file and the messages it holds
    (``_held``): no lock is needed.  :meth:`hup` and :meth:`terminate` queue
    their events behind the messages already received.
    """

    def __init__(self, app, topic):
        self.app = app
        self.options = o = app.options
        self.topic = topic
        self.log = app.log
        self.format = filename_format(o, topic)
        self._queue = queue.Queue()
        kwargs = app.config.consumer_kwargs()
        self.consumer = Consumer(o.nsqd_tcp_addresses or None, topic, o.channel,
                                 lookupd_http_addresses=o.lookupd_http_addresses or None,
                                 on_message=self._queue.put, logger=self.log, log_id=app.next_log_id(), **kwargs)
        self.max_in_flight = kwargs["max_in_flight"]
        self._held = []  # written, not yet synced (nor FINed)
        self._pending = []  # the bodies of _held's last messages, not yet written to the file
        self._name_second = None  # the second _name was made for
        self._name = None
        self._out = None  # the open file
        self._compress = None  # the gzip member being written
        self.filename = None  # the name the format gave, before <REV>
        self.path = None  # the open file's path
        self.rev = 0
        self.opened = 0.0
        self.size = 0
        self.files = []  # the paths of every file closed, where they ended up
        self._thread = threading.Thread(target=self._router, name="nsq_to_file[%s]" % topic)

    def start(self):
        self.consumer.start(wait=not self.options.lookupd_http_addresses)  # lookupd failures: logged, polled again
        self._thread.start()

    def hup(self):
        self._queue.put(_HUP)

    def terminate(self):
        self._queue.put(_TERM)

    def join(self):
        self._thread.join()

    def _where(self):
        return "[%s/%s]" % (self.topic, self.options.channel)

    # -- the router thread ------------------------------------------------------------------

    def _router(self):
        o = self.options
        interval = o.sync_interval
        next_tick = time.monotonic() + interval
        starved = max(1, int(self.max_in_flight * 0.85))
        try:
            while True:
                sync = close = False
                try:
                    item = self._queue.get(timeout=max(0.0, next_tick - time.monotonic()))
                except queue.Empty:
                    item = None
                if item is _TERM:
                    self.consumer.stop_receiving()  # after CLOSE_WAIT nothing more comes
                    while True:
                        try:
                            item = self._queue.get_nowait()
                        except queue.Empty:
                            break
                        if item not in (_TERM, _HUP):
                            self._write(item)
                    self._sync()
                    self._close()
                    return
                if item is _HUP:
                    self.log.info("%s SIGHUP: closing %s", self._where(), self.path if self._out else "no file")
                    sync = close = True
                elif item is None:  # the sync tick
                    next_tick = time.monotonic() + interval
                    if self._needs_rotation():
                        if o.skip_empty_files:
                            close = True
                        else:
                            self._update_file()
                    sync = True
                else:
                    if self._needs_rotation():
                        self._update_file()
                        sync = True
                    self._write(item)
                    if len(self._held) >= self.max_in_flight:
                        sync = True
                if sync or len(self._held) >= starved:
                    self._sync()
                if close:
                    self._close()
        except OSError as e:
            self.log.error("%s %s", self._where(), command.error_text(e))
            self.app.failed()
        finally:
            self.consumer.close()  # what was not FINed goes back to the channel

    def _write(self, msg):
        """Take ``msg`` into the open file: its line is written with the others at the next sync
        (one write, and one compress call, per batch rather than per message)."""
        if self._out is None:
            self._update_file()
        body = msg.body
        self.size += len(body) + 1
        self._pending.append(body)
        self._held.append(msg)

    def _flush_pending(self):
        """Write the lines taken since the last sync (compressed in one call with --gzip)."""
        pending = self._pending
        if not pending:
            return
        self._pending = []
        pending.append(b"")  # each line ends with its newline
        data = b"\n".join(pending)
        if self._compress is not None:
            data = self._compress.compress(data)
        if data:
            self._out.write(data)

    def _sync(self):
        """Make what was written durable (finishing the gzip member), then FIN it."""
        if not self._held:
            return
        self.log.info("%s syncing %d records to disk", self._where(), len(self._held))
        if self._out is not None:
            self._flush_pending()
            if self._compress is not None:
                self._out.write(self._compress.flush(zlib.Z_FINISH))
                self._compress = self._new_member()
            self._out.flush()
            os.fsync(self._out.fileno())
        held, self._held = self._held, []
        fin_all(held)  # one write per connection; a message whose connection is gone nsqd delivers again

    def _new_member(self):
        return zlib.compressobj(self.options.gzip_level, zlib.DEFLATED, 31)  # 31: a gzip member

    def _current_filename(self):
        # --datetime-format resolves to the second at most: the name is made once a second, not per message
        now = int(time.time())
        if now != self._name_second:
            self._name_second = now
            self._name = self.format.replace("<DATETIME>", strftime(self.options.datetime_format, time.localtime(now)))
        return self._name

    def _needs_rotation(self):
        o = self.options
        if self._out is None:
            return True
        filename = self._current_filename()
        if filename != self.filename:
            self.log.info("%s new filename %s, rotating...", self._where(), filename)
            return True
        if o.rotate_interval > 0 and time.monotonic() - self.opened > o.rotate_interval:
            self.log.info("%s %.3fs since last open, rotating...", self._where(), time.monotonic() - self.opened)
            return True
        if o.rotate_size > 0 and self.size > o.rotate_size:
            self.log.info("%s %s currently %d bytes (> %d), rotating...", self._where(), self.path, self.size,
                          o.rotate_size)
            return True
        return False

    def _output_path(self, path):
        o = self.options
        return os.path.join(o.output_dir, os.path.relpath(path, o.work_dir))

    def _update_file(self):
        """Close the file (its messages synced first) and open the next: Go's revision and collision rules."""
        o = self.options
        self._sync()  # a message is FINed once it is durable: before its file is left behind
        self._close()
        filename = self._current_filename()
        self.rev = 0 if filename != self.filename else self.rev + 1
        self.filename = filename
        self.opened = time.monotonic()
        template = os.path.join(o.work_dir, filename)
        os.makedirs(os.path.dirname(template) or ".", 0o770, exist_ok=True)
        while True:
            path = template.replace("<REV>", "-%06d" % self.rev)
            if o.work_dir != o.output_dir:
                out_path = self._output_path(path)
                os.makedirs(os.path.dirname(out_path) or ".", 0o770, exist_ok=True)
                if os.path.exists(out_path):
                    self.log.warn("%s output file already exists: %s", self._where(), out_path)
                    self.rev += 1
                    continue
            flags = os.O_WRONLY | os.O_CREAT
            flags |= os.O_EXCL if (o.gzip or o.rotate_interval > 0) else os.O_APPEND
            try:
                fd = os.open(path, flags, 0o666)
            except FileExistsError:
                self.log.warn("%s working file already exists: %s", self._where(), path)
                self.rev += 1
                continue
            out = os.fdopen(fd, "ab" if not (flags & os.O_EXCL) else "wb")
            self.log.info("%s opening %s", self._where(), path)
            self.size = os.fstat(fd).st_size
            if o.rotate_size > 0 and self.size > o.rotate_size:
                self.log.info("%s %s currently %d bytes (> %d), rotating...", self._where(), path, self.size,
                              o.rotate_size)
                out.close()
                self.rev += 1
                continue
            break
        self._out, self.path = out, path
        self._compress = self._new_member() if o.gzip else None

    def _close(self):
        """Finish, fsync and close the file, then move it to the output dir without overwriting anything."""
        out = self._out
        if out is None:
            return
        self._sync()
        if self._compress is not None:
            out.write(self._compress.flush(zlib.Z_FINISH))
            self._compress = None
        out.flush()
        os.fsync(out.fileno())
        out.close()
        self._out = None
        src = self.path
        o = self.options
        if o.work_dir == o.output_dir:
            self.files.append(src)
            return
        dst = self._output_path(src)
        self.log.info("%s moving finished file %s to %s", self._where(), src, dst)
        rev = self.rev
        while True:
            try:
                os.link(src, dst)  # never over an existing file (a rename would replace it)
            except FileExistsError:
                self.log.warn("%s destination file already exists: %s", self._where(), dst)
                rev += 1
                dst = os.path.join(os.path.dirname(dst), self.filename.replace("<REV>", "-%06d" % rev))
                continue
            os.remove(src)
            break
        self.files.append(dst)


class ToFile:
    """The nsq_to_file app: a FileLogger per topic, given or discovered (the ``nsq_to_file-topics`` thread).

    ``_lock`` guards ``loggers`` and ``_log_ids`` (the discoverer adds to them while a signal may
    reload or stop them).  ``done`` is set when a logger failed (``exit_code``
    1: a file could not be written).
    """

    def __init__(self, options):
        if not options.work_dir:
            options.work_dir = options.output_dir
        self.options = options
        self.log = common.tool_logger(options, TOOL)
        config = common.client_config(options.consumer_opts, "consumer-opt")
        config.set("user_agent", common.user_agent(TOOL))
        config.set("max_in_flight", options.max_in_flight)
        self.config = config
        self.pattern = re.compile(options.topic_pattern) if options.topic_pattern else None
        self.done = threading.Event()
        self.exit_code = 0
        self._lock = threading.Lock()
        self.loggers = {}
        self._log_ids = 0  # the consumers made so far (go-nsq's instance numbers in their log lines)
        self._stopping = threading.Event()
        self._discoverer = None

    def next_log_id(self):
        with self._lock:
            self._log_ids += 1
            return self._log_ids

    def failed(self):
        self.exit_code = 1
        self.done.set()

    def start(self):
        self.update_topics(self.options.topics)
        if not self.options.topics:
            self._discoverer = threading.Thread(target=self._discover, name="nsq_to_file-topics")
            self._discoverer.start()
        return self

    def update_topics(self, topics):
        for topic in topics:
            with self._lock:
                if topic in self.loggers or self._stopping.is_set():
                    continue
            if self.pattern is not None and not self.pattern.search(topic):
                self.log.warn("skipping topic %s (doesn't match pattern %s)", topic, self.options.topic_pattern)
                continue
            logger = FileLogger(self, topic)
            try:
                logger.start()
            except (OSError, ValueError) as e:
                self.log.error("couldn't create logger for new topic %s: %s", topic, command.error_text(e))
                logger.consumer.close()
                continue
            with self._lock:
                self.loggers[topic] = logger

    def lookupd_topics(self):
        topics, errors = set(), []
        timeout = self.options.http_client_request_timeout
        for address in self.options.lookupd_http_addresses:
            try:
                status, doc = query_lookupd(parse_lookupd_address(address), "/topics", timeout)
            except OSError as e:
                errors.append(e)
                continue
            if status == 200:
                topics.update(t for t in doc.get("topics") or () if isinstance(t, str))
        if errors and not topics:
            raise errors[0]
        return sorted(topics)

    def _discover(self):
        while not self._stopping.wait(self.options.topic_refresh_interval):
            try:
                topics = self.lookupd_topics()
            except OSError as e:
                self.log.error("could not retrieve topic list: %s", command.error_text(e))
                continue
            self.update_topics(topics)

    def reload(self):
        """SIGHUP: every logger syncs and closes its file."""
        with self._lock:
            loggers = list(self.loggers.values())
        for logger in loggers:
            logger.hup()

    def stop(self):
        """Every logger: CLS, write and FIN what it received, close and move its file; then join them."""
        self._stopping.set()
        if self._discoverer is not None:
            self._discoverer.join()
        with self._lock:
            loggers = list(self.loggers.values())
        for logger in loggers:
            logger.terminate()
        for logger in loggers:
            logger.join()


main = command.AppCommand(
    "nsq_to_file-threaded",
    SETTINGS,
    ToFileOptions,
    ToFile,
    log_prefix="[%s] " % TOOL,
    help="NSQ 1.3's nsq_to_file in pure Python: archive topics to rotating files.  Flags are nsq_to_file's.",
)
