"""NSQD: the broker object that owns topics, clients, listeners and background threads.

Many NSQD instances can run in one process: nothing here is module-global.

Threads owned by an NSQD (all named, all joined by :meth:`NSQD.stop`):

* ``nsqd-tcp-accept``      the TCP server's accept loop,
* ``nsqd-conn[...]``       one per connection (joined by ``TCPServer.server_close``),
  each owning its ``nsqd-client-pump[...]``,
* ``nsqd-http-accept``     the HTTP server's accept loop,
* ``nsqd-http[...]``       one per HTTP connection while it has a request to serve
  (joined by ``HTTPServer.server_close``),
* ``nsqd-http-idle``       holds idle keep-alive HTTP connections without a thread
  (Linux; joined by ``HTTPServer.server_close``),
* ``nsqd-https-accept`` and ``nsqd-https[...]``: the same for HTTPS (with --tls-cert/--tls-key),
* ``nsqd-topic-pump[...]`` one per topic (joined by ``Topic.close``); started by
  ``Topic.start`` once the listeners are bound (topics from nsqd.dat) or at
  creation (later topics),
* ``nsqd-queue-scan``      timeouts of in-flight messages and due deferred messages,
* ``nsqd-metadata``        rewrites nsqd.dat after topics or channels come or go
  (joined by :meth:`NSQD.stop`),
* ``nsqd-idle-watch``      wakes parked idle connection threads (Linux).
* ``nsqd-statsd``          pushes stats to ``--statsd-address`` (only when set; joined by
  ``StatsdLoop.close``).
* ``nsqd-lookup[host:port]`` one per ``--lookupd-tcp-address`` (joined by
  ``LookupPeers.close`` or when ``PUT /config/nsqlookupd_tcp_addresses`` drops it),
* ``nsqd-lookup-query[...]`` short-lived, one per lookupd asked for a new
  topic's channels (joined by the creating thread).
"""

import collections
import errno
import gc
import fcntl
import os
import socket
import threading
import time

from ..storage.backend import DiscardBackend
from ..storage.diskqueue import DiskQueue
from ..storage.durable import DurableDiskQueue
from ..server.idle import new_idle_watcher
from .channel import ChannelError
from .client_v2 import Client
from .lookup import LookupPeers, encode_register, encode_unregister, query_topic_channels
from .scan import ScanSet
from .statsd import StatsdLoop, expand_prefix
from ..storage import metadata
from ..logger import Logger
from ..settings.options import Options
from ..protocol import MSG_HEADER_LENGTH, is_valid_name
from ..server.http_api import HTTPServer
from ..transport import server_context
from ..server.tcp import TCPServer
from .topic import Topic, TopicError


METADATA_REST = 4  # the nsqd.dat writer rests this many times its last rewrite's duration


class NSQD:
    """A broker.  Use :meth:`start` / :meth:`stop`, or ``with NSQD(opts) as nsqd:``.

    ``_lock`` guards the topic map, the client registry, the client ID counter
    and ``_exiting``.  Each listener tracks its own connections.  Lock order: NSQD._lock -> Topic._lock
    -> Channel._lock -> Client._lock (never the reverse).
    """

    def __init__(self, options=None, log_stream=None):
        self.options = (options or Options()).validate()
        self.log = Logger(self.options.log_prefix, self.options.log_level, log_stream)
        self._lock = threading.Lock()  # guards topics, clients, client IDs, _exiting
        self._topics = {}
        self._clients = {}
        self._next_client_id = 0
        # Serializes connection teardowns (pump stop, unsubscribe).  A thread
        # waiting on a lock sleeps in the kernel, while a thread waiting for
        # the GIL wakes every switch interval (5 ms) to ask for it: with
        # thousands of connections closed at once, letting every thread run
        # its teardown concurrently makes thousands of GIL waiters whose
        # wake-ups starve the broker (/ping took seconds).  Serialized, the
        # waiters are few and a mass close costs its work and no more.
        self.teardown_lock = threading.Lock()
        self.idle_watcher = None  # parks idle connection threads (see nsqd_threaded.server.idle)
        self._exiting = False
        self._started = False
        self._topics_started = False  # new topics start their pump at once (guarded by _lock)
        self.start_time = time.time()
        self.health_error = None  # None when healthy, else the last backend write error
        self._tcp_server = None
        self._http_server = None
        self._https_server = None
        # TLS for the IDENTIFY upgrade and HTTPS (None without --tls-cert/--tls-key)
        self.tls_context = server_context(self.options)
        self._threads = []
        self._scan_stop = threading.Event()
        self._dir_fd = None
        self._stopped = threading.Event()
        self._metadata_lock = threading.Lock()  # serializes nsqd.dat writes
        # The nsqd.dat writer: a topic or channel created or deleted bumps
        # _metadata_requested, and one thread rewrites the file once for all
        # the changes made while its previous rewrite ran.  _metadata_cond's
        # lock guards the two counters and _metadata_writer (None while no
        # writer runs: a change then rewrites the file itself).
        self._metadata_cond = threading.Condition(threading.Lock())
        self._metadata_requested = 0  # changes made so far
        self._metadata_written = 0  # changes covered by a finished rewrite
        self._metadata_waiters = 0  # requests waiting for a rewrite (the writer does not rest then)
        self._metadata_writer = None
        self._loading = False  # while nsqd.dat is being loaded: no persisting
        self._gc_pauses = collections.deque(maxlen=256)
        self._gc_started = None
        self._lookup = LookupPeers(self)  # the lookupd peer threads (started by start())
        self.scan_set = ScanSet()  # the topics and channels the queue scanner has work in
        self._statsd = None  # the StatsdLoop when --statsd-address is set (started by start())

    # -- factories used by topics and channels ------------------------------

    def new_backend(self, name, ephemeral=False):
        """The backend of a topic (``name``) or channel (``topic:channel``).

        The one place that picks it: a discard queue for an ephemeral one, else
        the disk queue (its durable subclass with --durable).
        """
        if ephemeral:
            return DiscardBackend()
        o = self.options
        cls = DurableDiskQueue if o.durable else DiskQueue
        return cls(
            name,
            self.data_path,
            o.max_bytes_per_file,
            MSG_HEADER_LENGTH,
            o.max_msg_size + MSG_HEADER_LENGTH,
            o.sync_every,
            o.sync_timeout,
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

    # -- lifecycle ---------------------------------------------------------

    def start(self):
        """Lock the data path, load nsqd.dat, bind the listeners, then start the
        topics and serve.

        On failure (e.g. an address in use) everything created is closed again:
        the topics from nsqd.dat (never started), the listeners, the data-path lock.
        """
        self._lock_data_path()
        try:
            self.load_metadata()
            self.persist_metadata()
            self._listen()
        except BaseException:
            self._abort_start()
            raise
        with self._lock:
            self._topics_started = True
            topics = list(self._topics.values())
        for topic in topics:
            topic.start()  # as Go's topics wait on startChan until the broker is up
        if self._http_server is not None:
            self._spawn("nsqd-http-accept", self._http_server.serve_forever)
        if self._https_server is not None:
            self._spawn("nsqd-https-accept", self._https_server.serve_forever)
        self.idle_watcher = new_idle_watcher()
        if self.idle_watcher is not None:
            self.idle_watcher.start()
        self._spawn("nsqd-tcp-accept", self._tcp_server.serve_forever)
        self._spawn("nsqd-queue-scan", self._queue_scan_loop)
        with self._metadata_cond:
            self._metadata_writer = threading.Thread(
                target=self._metadata_loop, name="nsqd-metadata", daemon=True
            )
            self._metadata_writer.start()
        self._lookup.set_addresses(self.options.nsqlookupd_tcp_addresses)
        if self.options.statsd_address:
            self._statsd = StatsdLoop(self, self.statsd_prefix())
            self._statsd.start()
        if hasattr(gc, "callbacks"):  # CPython only (PyPy has none)
            gc.callbacks.append(self._on_gc)
        self._started = True
        return self

    def _listen(self):
        opts = self.options
        try:
            self._tcp_server = TCPServer(opts.tcp_address, self)
        except OSError as e:
            raise OSError(e.errno, "listen (%s) failed - %s" % (opts.tcp_address, e)) from None
        self.log.info("TCP: listening on %s:%d", *self.tcp_address)
        if opts.http_address:
            try:
                self._http_server = HTTPServer(opts.http_address, self)
            except OSError as e:
                raise OSError(e.errno, "listen (%s) failed - %s" % (opts.http_address, e)) from None
            self.log.info("HTTP: listening on %s:%d", *self.http_address)
        if self.tls_context is not None and opts.https_address:
            try:
                self._https_server = HTTPServer(opts.https_address, self, self.tls_context)
            except OSError as e:
                raise OSError(e.errno, "listen (%s) failed - %s" % (opts.https_address, e)) from None
            self.log.info("HTTPS: listening on %s:%d", *self.https_address)

    def _abort_start(self):
        """Undo a failed start(): close listeners and topics (joining their threads), unlock."""
        for server in (self._http_server, self._https_server, self._tcp_server):
            if server is not None:
                server.server_close()
        self._http_server = self._https_server = self._tcp_server = None
        with self._lock:
            topics = list(self._topics.values())
            self._topics.clear()
        for topic in topics:
            try:
                topic.close()
            except Exception as e:  # keep closing the others; the start error is what is raised
                self.log.error("%r: close after a failed start - %s", topic, e)
        self._unlock_data_path()
        with self._lock:
            self._exiting = True  # a later stop() returns at once (and leaves nsqd.dat alone)
        self._stopped.set()

    def _spawn(self, name, target, *args):
        t = threading.Thread(target=target, args=args, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self):
        """Graceful shutdown in nsqd's order; joins every thread it started.

        Stop accepting, close every client connection, then close each topic
        (its channels flush queued, in-flight and deferred messages to their
        backends), then stop the background loops.
        """
        with self._lock:
            if self._exiting:
                already = True
            else:
                already = False
                self._exiting = True
        if already:
            self._stopped.wait()
            return
        try:
            if self._tcp_server is not None:
                self._tcp_server.shutdown()  # stops its accept loop
                self._tcp_server.close_connections()
                for client in self.clients():
                    client.close_connection()  # also stops a reader still decoding what it has
                self._tcp_server.server_close()  # joins its connection threads
            if self.idle_watcher is not None:
                self.idle_watcher.stop()  # no connection thread is left to park
            for server in (self._http_server, self._https_server):
                if server is not None:
                    server.shutdown()
                    server.close_connections()
                    server.server_close()
            self._stop_metadata_writer()
            self.persist_metadata()
            with self._lock:
                topics = list(self._topics.values())
            for topic in topics:
                topic.close()
            self._lookup.close()  # no UNREGISTER: lookupd drops this producer when the socket closes
            self._scan_stop.set()
            if self._statsd is not None:
                self._statsd.close()
            for t in self._threads:
                t.join()
            self._threads = []
            if self._on_gc in getattr(gc, "callbacks", ()):
                gc.callbacks.remove(self._on_gc)
            self._unlock_data_path()
            self.log.info("NSQ: stopped")
        finally:
            self._stopped.set()

    def __enter__(self):
        if not self._started:
            self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    @property
    def http_address(self):
        """The bound HTTP ``(host, port)``, or None when HTTP is disabled."""
        return self._http_server.server_address[:2] if self._http_server else None

    @property
    def https_address(self):
        """The bound HTTPS ``(host, port)``, or None without TLS or with HTTPS disabled."""
        return self._https_server.server_address[:2] if self._https_server else None

    @property
    def tcp_address(self):
        """The bound ``(host, port)`` (the real port when 0 was asked for)."""
        return self._tcp_server.server_address[:2]

    def statsd_prefix(self):
        """``--statsd-prefix`` expanded with this broker's host key (broadcast address and HTTP port)."""
        o = self.options
        http = self.http_address
        http_port = o.broadcast_http_port or (http[1] if http else 0)
        return expand_prefix(o.statsd_prefix, o.broadcast_address, http_port)

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

    def metadata_changed(self, wait=False):
        """A topic or channel was created or deleted: nsqd.dat is rewritten soon
        (with ``wait``, before this returns).

        As in Go nsqd, which rewrites the file from a goroutine once the
        lookup loop has taken the change, a new channel's SUB is answered
        without waiting for the rewrite.  A new topic and the HTTP API's
        creations and deletions wait for it (they are rare, and then the
        file lists what the answer says).  Here one writer thread
        rewrites the file once for every change made while its previous
        rewrite ran, so a burst of N creations costs a few rewrites (each
        O(topics + channels) and two fsyncs), not N.  Between two rewrites
        the writer rests :data:`METADATA_REST` times as long as the last one
        took (unless a request waits), so a change reaches the file within
        about five rewrite times.  Pauses are persisted
        before their request is answered, as in Go; stop() writes the file
        last; before start() and after stop() the caller rewrites it itself.
        :meth:`wait_metadata` waits for the rewrite of the changes made so far.
        """
        cond = self._metadata_cond
        with cond:
            if self._metadata_writer is not None:
                self._metadata_requested += 1
                mine = self._metadata_requested
                cond.notify_all()
                if wait:
                    self._metadata_waiters += 1
                    try:
                        cond.wait_for(lambda: self._metadata_written >= mine or self._metadata_writer is None)
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
            cond.notify_all()  # a resting writer writes now
            try:
                return cond.wait_for(
                    lambda: self._metadata_written >= mine or self._metadata_writer is None, timeout
                )
            finally:
                self._metadata_waiters -= 1

    def _metadata_loop(self):
        cond = self._metadata_cond
        while True:
            with cond:
                while self._metadata_written == self._metadata_requested and self._metadata_writer is not None:
                    cond.wait()
                if self._metadata_written == self._metadata_requested:
                    return  # stopping, nothing left to write
                target = self._metadata_requested
            started = time.monotonic()
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
                while self._metadata_writer is not None and not self._metadata_waiters:
                    remaining = rest_until - time.monotonic()
                    if remaining <= 0:
                        break
                    cond.wait(remaining)  # (woken by every change: rest on)

    def _stop_metadata_writer(self):
        """Let the writer finish the changes made so far, then join it (stop() writes the final state)."""
        with self._metadata_cond:
            writer = self._metadata_writer
            self._metadata_writer = None
            self._metadata_cond.notify_all()
        if writer is not None:
            writer.join()

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

    def add_client(self, sock, address):
        with self._lock:
            self._next_client_id += 1
            client = Client(self._next_client_id, sock, address, self)
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
            self.metadata_changed(wait=True)
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
            self.metadata_changed(wait=True)
        return True

    # -- runtime configuration (/config) ---------------------------------------

    def set_log_level(self, level):
        self.options.log_level = level
        self.log.set_level(level)

    def set_lookupd_addresses(self, addresses):
        """``PUT /config/nsqlookupd_tcp_addresses``: dropped peers are stopped and joined, new ones started."""
        self.options.nsqlookupd_tcp_addresses = list(addresses)
        if self._started:
            self._lookup.set_addresses(self.options.nsqlookupd_tcp_addresses)

    # -- cluster (nsqlookupd) ------------------------------------------------------

    def lookupd_notify(self, cmd):
        """Queue an encoded REGISTER/UNREGISTER for every lookupd peer (never blocks)."""
        self._lookup.notify(cmd)

    def lookupd_identity(self):
        """The IDENTIFY body sent to each lookupd."""
        o = self.options
        http = self.http_address
        return {
            "broadcast_address": o.broadcast_address,
            "hostname": socket.gethostname(),
            "http_port": o.broadcast_http_port or (http[1] if http else 0),
            "tcp_port": o.broadcast_tcp_port or self.tcp_address[1],
            "topology_region": o.topology_region,
            "topology_zone": o.topology_zone,
            "version": o.version,
        }

    def lookupd_registrations(self):
        """``[(topic, [channel, ...])]`` of every live topic and channel, registered on each (re)connect."""
        result = []
        for topic in self.topics():
            if topic.exiting:
                continue
            result.append((topic.name, [c.name for c in topic.channels() if not c.exiting]))
        return result

    def lookupd_http_addresses(self):
        """``host:port`` of the lookupds that completed an IDENTIFY (their HTTP APIs)."""
        return self._lookup.http_addresses()

    def _precreate_channels(self, topic):
        """Create the channels the cluster knows for a new topic before it starts delivering.

        As Go nsqd: blocks the creating request for the lookupd queries.
        """
        addresses = self._lookup.http_addresses()
        if not addresses:
            if self.options.nsqlookupd_tcp_addresses:
                self.log.error("no available nsqlookupd to query for channels to pre-create for topic %s", topic.name)
            return
        o = self.options
        channels, errors = query_topic_channels(
            addresses, topic.name, o.http_client_connect_timeout, o.http_client_request_timeout
        )
        if errors:
            what = "failed to query any nsqlookupd" if len(errors) == len(addresses) else "partial failure"
            self.log.warn(
                "failed to query nsqlookupd for channels to pre-create for topic %s - %s: %s",
                topic.name, what, "; ".join(errors),
            )
        for name in channels:
            if name.endswith("#ephemeral"):
                continue  # an ephemeral channel exists only with its consumers
            if not is_valid_name(name):
                self.log.warn("skipping pre-creation of invalid channel %s for topic %s", name, topic.name)
                continue
            try:
                topic.get_channel(name)
            except TopicError:
                return  # deleted meanwhile

    # -- queue scanner -----------------------------------------------------

    def _queue_scan_loop(self):
        """Every interval, time out in-flight messages, release due deferred
        ones and fsync disk queues past --sync-timeout.

        nsqd samples 20 random channels per tick and repeats at once while more
        than a quarter of them were dirty.  Here the scanner visits every
        channel (and topic) that has something in flight, deferred or unsynced
        (the ScanSet), and only those: a due message waits at most one
        interval whatever the channel count, and idle channels cost nothing.
        """
        interval = self.options.queue_scan_interval
        scan_set = self.scan_set
        while not self._scan_stop.wait(interval):
            queues = scan_set.snapshot()
            if not queues:
                continue
            now = time.time_ns()
            mono = time.monotonic()
            for queue in queues:
                queue.scan(now, mono)
