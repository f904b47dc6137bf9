"""BrokerCore: the topics, channels and clients of one broker, and its queue scanner.

This is the broker without its edges: no sockets and no threads of its own.
:class:`~nsqd_threaded.server.nsqd.NSQD` (the daemon) extends it with the
listeners, the connection threads, the lookupd and statsd loops, and runs
:meth:`BrokerCore.queue_scan_loop` on its ``nsqd-queue-scan`` thread.  Many
brokers can run in one process: nothing here is module-global.
"""

import collections
import errno
import fcntl
import os
import random
import threading
import time

from ..internal.logger import Logger
from ..settings.options import Options
from ..storage import metadata
from ..storage.backend import DiscardBackend
from ..storage.diskqueue import DiskQueue
from ..storage.durable import DurableDiskQueue
from ..wire.protocol import MSG_HEADER_LENGTH, is_valid_name
from ..wire.protocol_v1 import encode_register, encode_unregister
from .channel import ChannelError
from .topic import Topic, TopicError


class BrokerCore:
    """Topics, channels, clients, nsqd.dat and the queue scanner (Go's NSQD without its listeners).

    ``_lock`` guards the topic map, the client registry, the client ID counter
    and ``_exiting``.  Lock order: BrokerCore._lock -> Topic._lock ->
    Channel._lock -> Client._lock (never the reverse).
    """

    def __init__(self, options=None, log_stream=None):
        self.options = (options or Options()).validate()
        self.log = Logger(self.options.log_prefix, self.options.log_level, log_stream)
        self._lock = threading.Lock()  # guards topics, clients, client IDs, _exiting
        self._topics = {}
        self._clients = {}
        self._next_client_id = 0
        self._exiting = False
        self._topics_started = False  # new topics start their pump at once (guarded by _lock)
        self.start_time = time.time()
        self.health_error = None  # None when healthy, else the last backend write error
        self._scan_stop = threading.Event()  # set by the daemon's stop: the scan loop returns
        self._dir_fd = None
        self._metadata_lock = threading.Lock()  # serializes nsqd.dat writes
        self._loading = False  # while nsqd.dat is being loaded: no persisting
        self._gc_pauses = collections.deque(maxlen=256)
        self._gc_started = None

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
        )

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
                for cname, cpaused in channels:
                    if not is_valid_name(cname):
                        self.log.warn("skipping creation of invalid channel %s", cname)
                        continue
                    channel = topic.get_channel(cname)
                    if cpaused:
                        channel.pause()
        finally:
            self._loading = False

    def persist_metadata(self):
        """Rewrite nsqd.dat atomically from the current topics and channels."""
        if self._loading:
            return
        with self._metadata_lock:
            entries = []
            for topic in self.topics():
                if topic.exiting and not self._exiting:
                    continue  # being deleted
                channels = [(c.name, c.paused) for c in topic.channels() if not c.exiting or self._exiting]
                entries.append((topic.name, topic.paused, channels))
            data = metadata.encode(entries, self.options.version)
            metadata.write_atomic(os.path.join(self.data_path, metadata.FILE_NAME), data)

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
                time.sleep(0.1)
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
            self._precreate_channels(topic)
            topic.start()
        if created and not topic.ephemeral:
            self.persist_metadata()
        return topic

    def get_existing_topic(self, name):
        with self._lock:
            return self._topics.get(name)

    def topics(self):
        with self._lock:
            return list(self._topics.values())

    def delete_topic(self, name):
        topic = self.get_existing_topic(name)
        if topic is None:
            return False
        self.lookupd_notify(encode_unregister(name))  # before its channels' UNREGISTERs, as Go
        topic.close(delete=True)
        with self._lock:
            if self._topics.get(name) is topic:
                del self._topics[name]
        self.log.info("TOPIC(%s): deleted", name)
        if not topic.ephemeral:
            self.persist_metadata()
        return True

    # -- runtime configuration (/config) ---------------------------------------

    def set_log_level(self, level):
        self.options.log_level = level
        self.log.set_level(level)

    # -- the cluster: the daemon's lookupd loops override these ----------------

    def lookupd_notify(self, cmd):
        """An encoded REGISTER/UNREGISTER for the cluster; a broker without lookupd peers drops it."""

    def _precreate_channels(self, topic):
        """Create the channels the cluster knows for a new topic (none without lookupd peers)."""

    # -- queue scanner -----------------------------------------------------

    def queue_scan_loop(self):
        """Every interval, time out in-flight messages and release due deferred ones.

        nsqd samples 20 random channels per tick and repeats at once while more
        than a quarter of them were dirty.  One thread here scans every channel
        each tick (cheap: a lock and a look at each index's head), so a due
        message waits at most one interval whatever the channel count.
        """
        interval = self.options.queue_scan_interval
        while not self._scan_stop.wait(interval):
            channels = [c for t in self.topics() for c in t.channels()]
            random.shuffle(channels)
            now = time.time_ns()
            for channel in channels:
                channel.process_in_flight(now)
                channel.process_deferred(now)
            # The disk queues' --sync-timeout: fsync whatever changed since the last sync.
            mono = time.monotonic()
            for topic in self.topics():
                topic.sync_backend(mono)
            for channel in channels:
                channel.sync_backend(mono)

