"""BrokerCore: the topics, channels and clients of one broker, and its queue scanner.

This is the broker without its edges: no sockets and no threads of its own.
:class:`~nsqd_threaded.server.nsqd.NSQD` (the daemon) extends it with the
listeners, the connection threads, the lookupd and statsd loops, and runs
:meth:`BrokerCore.queue_scan_loop` on its ``nsqd-queue-scan`` thread and
:meth:`BrokerCore.metadata_loop` (the nsqd.dat writer) on its
``nsqd-metadata`` thread.  Many brokers can run in one process: nothing here
is module-global.
"""

import collections
import errno
import fcntl
import os
import threading
import time

from ..internal.clock import Clock, TimeSkippingDisabled, parse_skip_ns
from ..internal.logger import Logger
from ..settings.options import Options
from ..storage import metadata, redrive_journal
from ..storage.backend import DiscardBackend
from ..storage.diskqueue import DiskQueue
from ..storage.durable import DurableDiskQueue
from ..wire.protocol_v2 import MSG_HEADER_LENGTH, is_valid_name
from ..wire.protocol_v1 import encode_register, encode_unregister
from .channel import ChannelError
from .policy import NO_POLICY, DeadLetterNames, Policy, is_dead_letter_topic
from .provenance import DeadLetterProvenance
from .redrive import EXIT_IN_REDRIVE_ENV, REDRIVE_BATCH, RedriveError, redrive_destinations
from .scan import ScanSet
from .watch import StateWatch
from .topic import Topic, TopicError

METADATA_REST = 16  # the nsqd.dat writer rests this many times its last rewrite's duration

# advance(): how long it waits for the scanner's pass, then for the pumps to take what fell due.
ADVANCE_SCAN_TIMEOUT = 30.0
ADVANCE_DELIVERY_TIMEOUT = 10.0


class BrokerCore:
    """Topics, channels, clients, nsqd.dat and the queue scanner (Go's NSQD without its listeners).

    ``_lock`` guards the topic map, the client registry, the client ID counter
    and ``_exiting``.  Lock order: BrokerCore._lock -> Topic._lock ->
    Channel._lock -> Client._lock (never the reverse).
    """

    def __init__(self, options=None, log_stream=None):
        self.options = (options or Options()).validate()
        self.log = Logger(self.options.log_prefix, self.options.log_level, log_stream)
        # The broker's time (message timestamps, timeouts, due times, e2e): real time, which
        # --time-skipping lets advance() move forward.  Topics, channels, their disk queues,
        # the GUID factories and the queue scanner read it; nothing reads time.time_ns() for them.
        self.clock = Clock(self.options.time_skipping)
        self._lock = threading.Lock()  # guards topics, clients, client IDs, _exiting
        # Held through a whole redrive: one at a time, so that a channel's redrive journal is removed
        # only when no redrive writes to it (redrives are an operator's, and rare).
        self._redrive_lock = threading.Lock()
        self.dead_letter_names = DeadLetterNames()  # the topics channels' own policies name as dead-letter topics
        # Where each dead letter came from, beside the dead-letter topics' queues (broker.provenance).
        self.dead_letter_provenance = DeadLetterProvenance(self.data_path, self.options.durable, self.log)
        self._topics = {}
        self._clients = {}
        self._next_client_id = 0
        self._exiting = False
        self._topics_started = False  # new topics start their pump at once (guarded by _lock)
        self.start_time = time.time()  # real time: /stats' start_time and uptime are the process's
        self.health_error = None  # None when healthy, else the last backend write error
        self._scan_stop = threading.Event()  # set by the daemon's stop: the scan loop returns
        self._dir_fd = None
        self._metadata_lock = threading.Lock()  # serializes nsqd.dat writes
        # The nsqd.dat writer: a topic or channel created or deleted bumps
        # _metadata_requested, and one thread rewrites the file once for all
        # the changes made while its previous rewrite ran.  _metadata_cond's
        # lock guards the three counters, _metadata_resting and _metadata_writing (False while no
        # writer runs: a change then rewrites the file itself).
        self._metadata_cond = threading.Condition(threading.Lock())
        self._metadata_requested = 0  # changes made so far
        self._metadata_written = 0  # changes covered by a finished rewrite
        self._metadata_waiters = 0  # requests waiting for a rewrite (the writer does not rest then)
        self._metadata_writing = False  # a metadata_loop runs (see open_metadata_writer)
        self._metadata_resting = False  # the writer rests between two rewrites: a change need not wake it
        self._start_metadata_writer = None  # starts that loop's thread, on the first change
        self._loading = False  # while nsqd.dat is being loaded: no persisting
        self._gc_pauses = collections.deque(maxlen=256)
        self._gc_started = None
        self.scan_set = ScanSet()  # the topics and channels the queue scanner has work in
        self.watch = StateWatch()  # wakes waiters (a test's wait_until) when a topic or channel changes
        # advance() waits here for the queue scanner's pass after its skip.  _scan_passed's
        # lock guards _skips_scanned (the clock's skip count a finished pass began after)
        # and _scanner_running.
        self._scan_passed = threading.Condition(threading.Lock())  # signals: a scan pass after a skip ended
        self._skips_scanned = 0
        self._scanner_running = False
        # Names of the disk queues that may have files in the data directory: those with a file
        # there when it was first listed, and every one opened since (None until that listing).
        self._queue_names_lock = threading.Lock()  # guards _queue_names
        self._queue_names = None

    # -- factories used by topics and channels ------------------------------

    def new_backend(self, name, ephemeral=False):
        """The backend of a topic (``name``) or channel (``topic:channel``).

        The one place that picks it: a discard queue for an ephemeral one, else
        the disk queue (its durable subclass with --durable).
        """
        if ephemeral:
            return DiscardBackend()
        options = self.options
        cls = DurableDiskQueue if options.durable else DiskQueue
        return cls(
            name,
            self.data_path,
            options.max_bytes_per_file,
            MSG_HEADER_LENGTH,
            options.max_msg_size + MSG_HEADER_LENGTH,
            options.sync_every,
            options.sync_timeout,
            self.log,
            clock=self.clock.time_ns,  # deferred records' due times
            fresh=not self._queue_may_have_files(name),
        )

    def _queue_may_have_files(self, name):
        """False when the disk queue ``name`` certainly has no file in the data directory.

        The directory is listed once, with the first queue opened; from then on
        only this broker writes there (as in Go nsqd, one broker per data
        directory), and a queue can have files only if it had some then or has
        been opened since.  A burst of SUBs to new channels then opens each
        channel's queue without looking for its metadata, write and deferred
        files (three failed system calls, each a GIL hand-off under load).
        """
        with self._queue_names_lock:
            names = self._queue_names
            if names is None:
                names = self._queue_names = _queue_names_in(self.data_path)
            if name in names:
                return True
            names.add(name)
            return False

    def backend_put(self, backend, msgs):
        """Write to a backend and record health, as nsqd's SetHealth does after each write.

        Topics and channels write to their backends only through this
        (``BackedQueue._write_backend_locked``), flushes on close included.
        """
        try:
            backend.put(msgs)
        except Exception as e:
            self.health_error = str(e)
            raise
        self.health_error = None

    def health(self):
        """``OK`` or ``NOK - <last backend write error>``, as /ping and /stats show it."""
        err = self.health_error
        return "OK" if err is None else "NOK - %s" % err

    def gc_pauses(self):
        """Microsecond durations of the last <= 256 garbage collections seen by this broker."""
        return list(self._gc_pauses)

    def _on_gc(self, phase, info):
        # gc.callbacks hook: a broker observes collections only while it runs.
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started is not None:
            self._gc_pauses.append((time.perf_counter() - self._gc_started) * 1e6)
            self._gc_started = None

    # -- metadata (nsqd.dat) ---------------------------------------------------

    @property
    def data_path(self):
        return self.options.data_path or os.getcwd()

    def load_metadata(self):
        """Recreate the topics and channels (and pause states) listed in nsqd.dat."""
        path = os.path.join(self.data_path, metadata.FILE_NAME)
        data = metadata.read(path)
        if data is None:
            return
        try:
            entries = metadata.decode(data)
        except ValueError as e:
            raise RuntimeError("failed to parse metadata in %s - %s" % (path, e)) from None
        self._loading = True
        try:
            for name, paused, channels in entries:
                if not is_valid_name(name):
                    self.log.warn("skipping creation of invalid topic %s", name)
                    continue
                topic = self.get_topic(name)
                if paused:
                    topic.pause()
                for cname, cpaused, cpolicy in channels:
                    if not is_valid_name(cname):
                        self.log.warn("skipping creation of invalid channel %s", cname)
                        continue
                    channel = topic.get_channel(cname)
                    if cpaused:
                        channel.pause()
                    if cpolicy is not None:
                        channel.set_policy(self._stored_policy(path, name, cname, cpolicy))
            if self.options.durable:
                self._recover_redrives()
        finally:
            self._loading = False

    def _recover_redrives(self):
        """Startup (``--durable``), every topic and channel made: the redrives a kill cut short (see
        :meth:`~nsqd_threaded.broker.redrive.ChannelRedriveMethods.recover_redrive`)."""
        with self._lock:
            topics = list(self._topics.values())
        for topic in topics:
            for channel in topic.channels():
                found = channel.recover_redrive(self.get_existing_topic)
                if found:
                    self.log.info("%r: %d messages a redrive had moved before the restart: they leave unread", channel, found)

    def _stored_policy(self, path, topic_name, channel_name, doc):
        """A channel's policy as nsqd.dat keeps it (see :mod:`.policy`)."""
        try:
            return Policy.from_json(doc)
        except ValueError as e:
            raise RuntimeError("failed to parse metadata in %s - %s:%s %s" % (path, topic_name, channel_name, e)) from None

    def persist_metadata(self):
        """Rewrite nsqd.dat atomically from the current topics and channels."""
        if self._loading:
            return
        with self._metadata_lock:
            entries = []
            for topic in self.topics():
                if topic.exiting and not self._exiting:
                    continue  # being deleted
                channels = [(c.name, c.paused, _stored_json(c.own_policy()))
                            for c in topic.channels() if not c.exiting or self._exiting]
                entries.append((topic.name, topic.paused, channels))
            data = metadata.encode(entries, self.options.version)
            metadata.write_atomic(os.path.join(self.data_path, metadata.FILE_NAME), data)

    def metadata_changed(self, wait=False):
        """A topic or channel was created or deleted: nsqd.dat is rewritten soon
        (with ``wait``, before this returns).

        As in Go nsqd, which rewrites the file from a goroutine once the
        lookup loop has taken the change, a new channel's SUB is answered
        without waiting for the rewrite.  A new topic and the HTTP API's
        creations and deletions wait for it (they are rare, and then the
        file lists what the answer says).  Here one writer thread
        (:meth:`metadata_loop`) rewrites the file once for every change made
        while its previous rewrite ran, so a burst of N creations costs a few
        rewrites (each O(topics + channels) and two fsyncs), not N.  Between
        two rewrites the writer rests :data:`METADATA_REST` times as long as
        the last one took (unless a request waits), so a change reaches the
        file within about seventeen rewrite times (some 0.3 s in a burst of
        SUBs to 5,000 new channels), and the writer takes about 3 % of the
        broker's CPU during such a burst (10 % when it rested four times as
        long: 0.45-0.54 s of the burst's 4.5 s).  Pauses are persisted before
        their request is answered, as in Go; the daemon's stop() writes the
        file last; while no writer runs (before start(), after stop(), a bare
        core) the caller rewrites it itself.  :meth:`wait_metadata` waits for
        the rewrite of the changes made so far.
        """
        cond = self._metadata_cond
        with cond:
            if self._metadata_writing:
                self._metadata_requested += 1
                mine = self._metadata_requested
                if wait or not self._metadata_resting:
                    # (a resting writer writes this change when its rest ends: waking it for
                    # each change of a burst would cost a thread switch per new channel)
                    self._wake_metadata_writer_locked()
                if wait:
                    self._metadata_waiters += 1
                    try:
                        cond.wait_for(lambda: self._metadata_written >= mine or not self._metadata_writing)
                    finally:
                        self._metadata_waiters -= 1
                return
        self.persist_metadata()

    def wait_metadata(self, timeout=None):
        """Block until nsqd.dat covers every change made so far; False on timeout."""
        cond = self._metadata_cond
        with cond:
            mine = self._metadata_requested
            self._metadata_waiters += 1
            cond.notify_all()  # a resting writer writes now (none has started while nothing changed)
            try:
                return cond.wait_for(lambda: self._metadata_written >= mine or not self._metadata_writing, timeout)
            finally:
                self._metadata_waiters -= 1

    def open_metadata_writer(self, start_writer):
        """From now on changes go to :meth:`metadata_loop`, which ``start_writer()`` starts on the
        caller's thread (called once, with the first change, under ``_metadata_cond``'s lock, which
        the loop takes first: a broker that changes nothing never starts it)."""
        with self._metadata_cond:
            self._metadata_writing = True
            self._start_metadata_writer = start_writer

    def _wake_metadata_writer_locked(self):
        start, self._start_metadata_writer = self._start_metadata_writer, None
        if start is not None:
            start()
        self._metadata_cond.notify_all()

    def close_metadata_writer(self):
        """Let :meth:`metadata_loop` finish the changes made so far and return (the caller joins
        its thread, then writes the final state itself)."""
        with self._metadata_cond:
            self._metadata_writing = False
            self._start_metadata_writer = None
            self._metadata_cond.notify_all()

    def metadata_loop(self):
        """The nsqd.dat writer (see :meth:`metadata_changed`), until :meth:`close_metadata_writer`."""
        cond = self._metadata_cond
        while True:
            with cond:
                while self._metadata_written == self._metadata_requested and self._metadata_writing:
                    cond.wait()
                if self._metadata_written == self._metadata_requested:
                    return  # stopping, nothing left to write
                target = self._metadata_requested
            started = time.monotonic()  # real time: paces disk writes, nothing a message waits for
            try:
                self.persist_metadata()
            except OSError as e:
                self.log.error("failed to persist metadata - %s", e)
            took = time.monotonic() - started
            with cond:
                self._metadata_written = target
                cond.notify_all()
                # During a burst of changes, rest METADATA_REST times as long
                # as the rewrite took: the writer's share of the broker stays
                # small however many channels a rewrite lists.
                rest_until = time.monotonic() + METADATA_REST * took
                self._metadata_resting = True
                while self._metadata_writing and not self._metadata_waiters:
                    remaining = rest_until - time.monotonic()
                    if remaining <= 0:
                        break
                    cond.wait(remaining)  # (woken by a waiter or the close, not by a change)
                self._metadata_resting = False

    def _lock_data_path(self):
        path = self.options.data_path or os.getcwd()
        fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise RuntimeError(
                    "failed to lock data-path: cannot flock directory %s - %s "
                    "(possibly in use by another instance of nsqd)" % (path, e.strerror)
                ) from None
            raise
        self._dir_fd = fd

    def _unlock_data_path(self):
        if self._dir_fd is not None:
            os.close(self._dir_fd)  # closing releases the flock
            self._dir_fd = None

    # -- connections and clients -------------------------------------------

    def add_client(self, new_client):
        """Register the client ``new_client(id)`` makes, ``id`` being the next client ID (never reused)."""
        with self._lock:
            self._next_client_id += 1
            client = new_client(self._next_client_id)
            self._clients[client.id] = client
        return client

    def remove_client(self, client):
        """Forget a disconnected client; unsubscribe it, deleting an emptied ephemeral channel."""
        with self._lock:
            self._clients.pop(client.id, None)
        channel = client.channel
        if channel is None:
            return
        if channel.remove_client(client):
            topic = self.get_existing_topic(channel.topic_name)
            if topic is not None and topic.delete_channel(channel.name):
                self.delete_topic(topic.name)

    def clients(self):
        with self._lock:
            return list(self._clients.values())

    def subscribe(self, client, topic_name, channel_name):
        """SUB's get-or-create + add, with nsqd's single retry on an exiting ephemeral target."""
        for attempt in (1, 2):
            topic = self.get_topic(topic_name)
            channel = topic.get_channel(channel_name)
            channel.add_client(client)
            if not ((channel.ephemeral and channel.exiting) or (topic.ephemeral and topic.exiting)):
                return channel
            channel.remove_client(client)
            if attempt == 1:
                time.sleep(0.1)  # real time: waits for another thread's deletion to finish
        raise ChannelError("to deleted topic/channel")

    # -- topics ------------------------------------------------------------

    def get_topic(self, name):
        """Get or create a topic (an exiting topic is returned while its deletion runs)."""
        with self._lock:
            topic = self._topics.get(name)
            if topic is None:
                if self._exiting:
                    raise TopicError("exiting")
                start = self._topics_started
                topic = Topic(name, self, held=start)  # held until its channels are pre-created
                self._topics[name] = topic
                self.log.info("TOPIC(%s): created", name)
                self.lookupd_notify(encode_register(name))  # queued under the lock: before its channels
                created = True
            else:
                created = start = False
        if start:
            self._start_topic(topic)
        if created and self.watch.watchers:
            self.watch.notify()
        if created and not topic.ephemeral:
            self.metadata_changed(wait=True)
        return topic

    def get_existing_topic(self, name):
        with self._lock:
            return self._topics.get(name)

    def topics(self):
        with self._lock:
            return list(self._topics.values())

    def is_dead_letter_topic(self, name):
        """Whether ``name`` is a dead-letter topic here: named by a channel's own policy, or by the
        ``--dead-letter-topic`` pattern (the topics the defaults never apply to, whose channels an
        operator redrives from)."""
        return name in self.dead_letter_names or is_dead_letter_topic(self.options.dead_letter_topic, name)

    def delete_topic(self, name):
        topic = self.get_existing_topic(name)
        if topic is None:
            return False
        self.lookupd_notify(encode_unregister(name))  # before its channels' UNREGISTERs, as Go
        topic.close(delete=True)
        with self._lock:
            if self._topics.get(name) is topic:
                del self._topics[name]
        self.dead_letter_provenance.forget(name)
        self.log.info("TOPIC(%s): deleted", name)
        if self.watch.watchers:
            self.watch.notify()
        if not topic.ephemeral:
            self.metadata_changed(wait=True)
        return True

    def redrive(self, channel, n=None, to="", allowed=None):
        """``POST /channel/redrive`` (:mod:`.redrive`): move up to ``n`` (None: all) messages from the head
        of ``channel`` to their destinations (``to``, else each one's source topic); returns how many
        moved.  ``allowed(topic)``: whether the caller may publish there (None: anyone).

        Raises RedriveError (``moved``: what went before) at the first message that cannot go, that
        message and the rest back at the head of the channel in their order: ``MISSING_ARG_TO`` for
        one without provenance when no ``to`` was given, ``UNAUTHORIZED`` when ``allowed`` refuses its
        destination, ``EXITING`` when the channel or a destination is closing.
        """
        with self._redrive_lock:
            return self._redrive_locked(channel, n, to, allowed)

    def remove_redrive_journal(self, path):
        """A channel let go every message its redrive journal named: remove it, unless a redrive runs
        (it may be writing there; its end removes the file)."""
        if self._redrive_lock.acquire(False):
            try:
                redrive_journal.remove(path)
            finally:
                self._redrive_lock.release()

    def _redrive_locked(self, channel, n, to, allowed):
        journal = channel.redrive_journal_path()  # (--durable: a kill inside the redrive moves each message once)
        try:
            return self._redrive_batches(channel, n, to, allowed, journal)
        finally:
            if journal is not None:
                if os.environ.get(EXIT_IN_REDRIVE_ENV) == "left":
                    os._exit(137)  # (the test hook: a kill once the messages left, before the journal went)
                channel.redrive_ended()

    def _redrive_batches(self, channel, n, to, allowed, journal):
        moved = 0
        while n is None or moved < n:
            msgs = channel.take_for_redrive(REDRIVE_BATCH if n is None else min(REDRIVE_BATCH, n - moved))
            if msgs is None:
                raise RedriveError("EXITING", moved)
            if not msgs:
                break
            topics = redrive_destinations(channel, msgs, to)
            # The messages before the first that cannot go (no source known, or a destination not granted).
            refusal = None
            granted = {}
            for i, topic_name in enumerate(topics):
                if topic_name is None:
                    refusal = "MISSING_ARG_TO"
                elif allowed is not None:
                    if topic_name not in granted:
                        granted[topic_name] = allowed(topic_name)
                    if not granted[topic_name]:
                        refusal = "UNAUTHORIZED"
                if refusal is not None:
                    channel.return_redrive(msgs[i:])
                    msgs, topics = msgs[:i], topics[:i]
                    break
            # Runs of one destination, in the channel's order: each one publish, then let go.
            start = 0
            while start < len(msgs):
                end = start
                while end < len(msgs) and topics[end] == topics[start]:
                    end += 1
                run = msgs[start:end]
                try:
                    self._publish_redriven(channel, self.get_topic(topics[start]), run, journal)
                except TopicError as e:
                    channel.return_redrive(msgs[start:])
                    raise RedriveError("EXITING", moved, str(e)) from None
                channel.finish_redrive(run)
                moved += len(run)
                start = end
            if refusal is not None:
                raise RedriveError(refusal, moved)
        if moved:
            self.log.info("CHANNEL(%s:%s): redrove %d messages%s", channel.topic_name, channel.name, moved,
                          " to " + to if to else "")
        return moved

    def _publish_redriven(self, channel, topic, msgs, journal):
        """Publish ``msgs`` (a redrive's, of ``channel``) to ``topic`` as new messages; with a ``journal`` (its path:
        ``--durable``), its lines are appended right before the records are written, the topic's lock
        held (see :mod:`~nsqd_threaded.storage.redrive_journal`).  Raises TopicError."""
        bodies = [m.body for m in msgs]
        if journal is None:
            topic.publish(bodies)
            return
        ids = [bytes(m.id) for m in msgs]
        sources = channel.queue_positions(msgs)

        def announce(new_ids):
            def before(positions):
                if positions is None:  # (a destination without a disk queue: a kill loses it there anyway)
                    return
                try:
                    redrive_journal.append(journal, redrive_journal.encode_lines(ids, sources, topic.name, new_ids,
                                                                                 positions))
                except OSError as e:
                    raise TopicError("failed to write the redrive journal - %s" % e) from None
                if os.environ.get(EXIT_IN_REDRIVE_ENV) == "line":
                    os._exit(137)  # (the test hook: a kill between the journal and the records)
            return before

        topic.publish_announced([self.clock.time_ns()] * len(bodies), bodies, announce)
        if os.environ.get(EXIT_IN_REDRIVE_ENV) == "published":
            os._exit(137)  # (the test hook: a kill between the records and the channel's done log)

    # -- runtime configuration (/config) ---------------------------------------

    def set_log_level(self, level):
        self.options.log_level = level
        self.log.set_level(level)

    # -- the cluster: the daemon's lookupd loops override these ----------------

    def lookupd_notify(self, cmd):
        """An encoded REGISTER/UNREGISTER for the cluster; a broker without lookupd peers drops it."""

    def _start_topic(self, topic):
        """Let a new topic deliver; the daemon first creates the channels the cluster has for it."""
        topic.start()

    def _clock_skipped(self, seconds):
        """After a skip of the clock by ``seconds`` (:meth:`advance`): the daemon pings its lookupds
        and heartbeats its clients."""

    def _release_held_topics(self, now):
        """Each queue scan: the daemon lets topics whose wait for the cluster's channels ended deliver."""

    # -- queue scanner -----------------------------------------------------

    def queue_scan_loop(self):
        """Every interval, time out in-flight messages, release due deferred
        ones and fsync disk queues past --sync-timeout.

        nsqd samples 20 random channels per tick and repeats at once while more
        than a quarter of them were dirty.  Here the scanner visits every
        channel (and topic) that has something in flight, deferred or unsynced
        (the ScanSet), and only those: a due message waits at most one
        interval whatever the channel count, and idle channels cost nothing.

        The interval is real time (it paces the scanner); a skip of the
        clock (:meth:`advance`) wakes it at once, and :meth:`advance` waits
        for that pass.
        """
        interval = self.options.queue_scan_interval
        clock = self.clock
        moved = clock.moved
        with self._scan_passed:
            self._scanner_running = True
        try:
            seen = 0
            while True:
                with moved:
                    if clock.skips == seen and not self._scan_stop.is_set():
                        moved.wait(interval)
                    if self._scan_stop.is_set():
                        return
                    seen = clock.skips
                self.scan_queues()
                if seen:
                    with self._scan_passed:
                        self._skips_scanned = seen
                        self._scan_passed.notify_all()
        finally:
            with self._scan_passed:
                self._scanner_running = False
                self._scan_passed.notify_all()

    def stop_queue_scan(self):
        """Make :meth:`queue_scan_loop` return (its owner then joins its thread)."""
        self._scan_stop.set()
        self.clock.wake()

    def scan_queues(self):
        """One pass of the queue scanner over the queues with work (see :meth:`queue_scan_loop`)."""
        mono = time.monotonic()  # real time: topic holds and --sync-timeout fsyncs, not message deadlines
        self._release_held_topics(mono)
        # Dead-letter provenance files whose lines are mostly stale are rewritten (broker.provenance).
        self.dead_letter_provenance.compact(self.get_existing_topic)
        queues = self.scan_set.snapshot()
        if not queues:
            return
        now = self.clock.time_ns()
        for queue in queues:
            queue.scan(now, mono)

    # -- a barrier for crash tests ------------------------------------------

    def sync(self, timeout=10.0):
        """Return once what is stored is on disk: every topic's pump has copied its backlog to its
        channels (and, durable, acknowledged it), then every disk queue is fsynced with its
        metadata, and nsqd.dat lists every topic and channel.  With ``--durable`` (or
        ``--mem-queue-size=0``) that is everything acknowledged, so a kill right after loses and
        duplicates nothing; otherwise what memory queues hold is not on disk (a kill loses it, as
        Go nsqd's).  TimeoutError when the pumps have not caught up within ``timeout`` (real
        seconds: a paused topic or one without channels keeps its backlog, which is fine).
        False when an fsync failed."""
        def caught_up():  # (woken by the watch: a pump's acknowledgement notifies it)
            return None if any(t.owes_fan_out() for t in self.topics()) else True

        if self.watch.wait_for(caught_up, timeout) is None:
            behind = [t.name for t in self.topics() if t.owes_fan_out()]
            raise TimeoutError("topics %s still copying to their channels after %gs" % (behind, timeout))
        ok = True
        for topic in self.topics():
            ok = topic.sync_backends() and ok
        self.persist_metadata()
        return ok

    # -- time skipping -----------------------------------------------------

    def next_deadline_ns(self):
        """The clock time (ns) at which the next in-flight message times out or deferred
        message falls due, over every channel, or a client waiting on this clock wakes
        (:meth:`Clock.hold_deadline`); None when none is pending."""
        earliest = self.clock.next_waiter_ns()  # a test's client waiting on this clock (Clock.hold_deadline)
        for topic in self.topics():
            for channel in topic.channels():
                due = channel.next_deadline_ns()
                if due is not None and (earliest is None or due < earliest):
                    earliest = due
        return earliest

    def next_deadline_in(self):
        """Seconds of the clock to :meth:`next_deadline_ns` (0.0 if already due); None when nothing is pending."""
        due = self.next_deadline_ns()
        return None if due is None else max(0, due - self.clock.time_ns()) / 1e9

    def advance(self, seconds=None):
        """Time skipping: move the clock forward by ``seconds`` (a number, or a Go duration
        such as ``"61s"``), or (None) to the next deadline.

        Returns once what fell due is done: the queue scanner's pass after the
        skip has requeued the timed-out in-flight messages and readied the due
        deferred ones, and the consumers with a free RDY slot have taken them
        (a bounded wait: :data:`ADVANCE_DELIVERY_TIMEOUT`).  Returns the
        seconds skipped: with no argument, those to the next deadline (0.0
        when nothing is pending, and the clock does not move).  Raises
        :class:`~nsqd_threaded.internal.clock.TimeSkippingDisabled` on a
        broker started without ``--time-skipping``.
        """
        clock = self.clock
        if not clock.skipping:
            raise TimeSkippingDisabled("time skipping is off (start the broker with --time-skipping)")
        if seconds is None:
            due = self.next_deadline_ns()
            if due is None:
                return 0.0
            skip_ns = max(0, due - clock.time_ns())
        elif isinstance(seconds, str):
            skip_ns = parse_skip_ns(seconds)  # a Go duration, as the HTTP route takes it
        else:
            skip_ns = int(round(seconds * 1e9))
        mine = clock.skip_ns(skip_ns)
        self._clock_skipped(skip_ns / 1e9)
        self._wait_scan_pass(mine)
        self._wait_deliveries()
        return skip_ns / 1e9

    def _wait_scan_pass(self, skip):
        """Until the scanner has finished a pass that began after skip number ``skip``
        (without a running scanner, e.g. a broker not started: the pass runs here)."""
        deadline = time.monotonic() + ADVANCE_SCAN_TIMEOUT  # real time: a bound on waiting for a thread
        with self._scan_passed:
            while self._scanner_running and self._skips_scanned < skip:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._scan_passed.wait(remaining)
            ran = self._skips_scanned >= skip
        if not ran:
            self.scan_queues()

    def _wait_deliveries(self):
        """Until no channel holds a message that a subscribed consumer with a free RDY slot
        could take (its pump was woken by the requeue): woken by each delivery through the
        broker's :class:`~nsqd_threaded.broker.watch.StateWatch`, bounded."""

        def delivered():
            return None if any(c.owes_delivery() for t in self.topics() for c in t.channels()) else True

        self.watch.wait_for(delivered, ADVANCE_DELIVERY_TIMEOUT)


def _queue_names_in(data_path):
    """The disk queue names that files in ``data_path`` may belong to (``NAME.diskqueue.*``).

    A topic or channel name may itself hold ``.diskqueue.``: every prefix that
    ends before one counts, which can only name too many queues, never too few.
    An unreadable directory names every queue (an object that contains all).
    """
    marker = ".diskqueue."
    names = set()
    try:
        with os.scandir(data_path or ".") as entries:
            for entry in entries:
                at = entry.name.find(marker)
                while at > 0:
                    names.add(entry.name[:at])
                    at = entry.name.find(marker, at + 1)
    except OSError:
        return _Everything()
    return names


class _Everything:
    """Contains every name (see :func:`_queue_names_in`)."""

    def __contains__(self, name):
        return True

    def add(self, name):
        pass


def _stored_json(own):
    """A channel's own policy as nsqd.dat keeps it: None (no key) when it has none."""
    return None if own == NO_POLICY else own.stored_json()
