"""NSQD: the daemon, the broker core (:class:`~nsqd_threaded.broker.core.BrokerCore`) with its edges.

It adds to the core what touches sockets: the TCP, HTTP and HTTPS listeners,
the idle watcher, the TLS context, the lookupd peers and the statsd loop.
Many NSQD instances can run in one process: nothing here is module-global.

Threads owned by an NSQD (all named, all joined by :meth:`NSQD.stop`):

* ``nsqd-tcp-accept``      the TCP server's accept loop,
* ``nsqd-conn[...]``       one per connection (joined by ``TCPServer.server_close``),
  each owning its ``nsqd-client-pump[...]``,
* ``nsqd-http-accept``     the HTTP server's accept loop,
* ``nsqd-http[...]``       one per HTTP connection while it has a request to serve
  (joined by ``HTTPServer.server_close``),
* ``nsqd-http-idle``       holds idle keep-alive HTTP connections without a thread
  (Linux; started by the first; joined by ``HTTPServer.server_close``),
* ``nsqd-https-accept`` and ``nsqd-https[...]``: the same for HTTPS (with --tls-cert/--tls-key),
* ``nsqd-topic-pump[...]`` one per topic (joined by ``Topic.close``); started by
  ``Topic.start`` once the listeners are bound (topics from nsqd.dat) or at
  creation (later topics),
* ``nsqd-queue-scan``      timeouts of in-flight messages and due deferred messages,
* ``nsqd-metadata``        rewrites nsqd.dat after topics or channels come or go
  (started by the first change; joined by :meth:`NSQD.stop`),
* ``nsqd-idle-watch``      wakes parked idle connection threads (Linux; started by the first).
* ``nsqd-statsd``          pushes stats to ``--statsd-address`` (only when set; joined by
  ``StatsdLoop.close``).
* ``nsqd-lookup[host:port]`` one per ``--lookupd-tcp-address`` (joined by
  ``LookupPeers.close`` or when ``PUT /config/nsqlookupd_tcp_addresses`` drops it),
* ``nsqd-lookup-query[...]`` short-lived, one per lookupd asked for a new
  topic's channels (joined by the creating thread).
"""

import gc
import math
import os
import socket
import threading
import time

from ..broker.core import BrokerCore
from ..broker.stats import runtime_name
from ..broker.topic import TopicError
from ..internal.process import widen_futex_hash
from ..settings.options import TIME_SKIPPING_AUTO
from ..wire.protocol_v1 import PING
from ..wire.protocol_v2 import is_valid_name
from ..wire.transport import server_context
from .auto_skip import AutoSkipper, settled
from .connection import ClientConnection
from .http_api import NSQDHTTPServer
from .identify_memo import IdentifyMemo
from .idle import new_idle_watcher
from .lookup import LookupPeers, query_topic_channels
from .statsd import StatsdLoop, expand_prefix
from .tcp import TCPServer


class NSQD(BrokerCore):
    """A broker.  Use :meth:`start` / :meth:`stop`, or ``with NSQD(options) as nsqd:``.

    The core's ``_lock`` also guards ``_exiting`` here.  Each listener tracks
    its own connections.
    """

    def __init__(self, options=None, log_stream=None):
        super().__init__(options, log_stream)
        # Serializes connection teardowns (pump stop, unsubscribe).  A thread
        # waiting on a lock sleeps in the kernel, while a thread waiting for
        # the GIL wakes every switch interval (5 ms) to ask for it: with
        # thousands of connections closed at once, letting every thread run
        # its teardown concurrently makes thousands of GIL waiters whose
        # wake-ups starve the broker.  Serialized, the waiters are few and a
        # mass close costs its work and no more.
        self.teardown_lock = threading.Lock()
        # IDENTIFY bodies decoded and negotiated already: a program's consumers send the same one.
        self.identify_memo = IdentifyMemo()
        self.idle_watcher = None  # parks idle connection threads (see nsqd_threaded.server.idle)
        self._started = False
        self._tcp_server = None
        self._http_server = None
        self._https_server = None
        # TLS for the IDENTIFY upgrade and HTTPS (None without --tls-cert/--tls-key)
        self.tls_context = server_context(self.options)
        self._threads = []  # the accept loops and the queue scanner, joined by stop()
        self._stopped = threading.Event()
        self._lookup = LookupPeers(self)  # the lookupd peer threads (started by start())
        # Topics created while lookupds are configured but none has answered the channel query
        # yet: name -> (Topic, monotonic deadline of its hold, math.inf once released, the mark of
        # its Topic.begin_precreation).  Guarded by the core's _lock.  Each is held (delivers
        # nothing, its backlog keeps every message) until a lookupd answers or the deadline
        # passes, and is queried again on each lookupd connect until one answers.
        self._unqueried_topics = {}
        self._statsd = None  # the StatsdLoop when --statsd-address is set (started by start())
        self._metadata_writer = None  # the nsqd-metadata thread (runs BrokerCore.metadata_loop)
        self.auto_skipper = None  # --time-skipping=auto: the AutoSkipper (started by start())

    # -- lifecycle ---------------------------------------------------------

    def start(self):
        """Lock the data path, load nsqd.dat, bind the listeners, then start the
        topics and serve.

        On failure (e.g. an address in use) everything created is closed again:
        the topics from nsqd.dat (never started), the listeners, the data-path lock.
        """
        self.log.info("nsqd v%s (built w/%s)", self.options.version, runtime_name())  # Go's first two lines
        self.log.info("ID: %d", self.options.node_id)
        self._lock_data_path()
        try:
            self.load_metadata()
            self._log_persisting()
            self.persist_metadata()
            self._listen()
        except BaseException:
            self._abort_start()
            raise
        # Before the first thread this broker starts: widening the futex hash of a process
        # with few threads costs well under a millisecond, after them some 30 ms.
        if self._tcp_server.poller is None:  # (a thread per connection: idle ones park with the watcher)
            self.idle_watcher = new_idle_watcher(hangup_lock=self.teardown_lock)  # (see leave_on_hangup)
        with self._lock:
            self._topics_started = True
            topics = list(self._topics.values())
        for topic in topics:
            topic.start()  # as Go's topics wait on startChan until the broker is up
        if self._http_server is not None:
            self._spawn("nsqd-http-accept", self._http_server.serve_forever)
        if self._https_server is not None:
            self._spawn("nsqd-https-accept", self._https_server.serve_forever)
        if self.idle_watcher is not None:
            self.idle_watcher.start()
        self._spawn("nsqd-tcp-accept", self._tcp_server.serve_forever)
        self._spawn("nsqd-queue-scan", self.queue_scan_loop)
        self.open_metadata_writer(self._start_metadata_writer_thread)
        self._lookup.set_addresses(self.options.nsqlookupd_tcp_addresses)
        if self.options.statsd_address:
            self._statsd = StatsdLoop(self, self.statsd_prefix())
            self._statsd.start()
        if self.options.time_skipping == TIME_SKIPPING_AUTO:
            self.auto_skipper = AutoSkipper(self, self.options.time_skipping_grace)
            self.auto_skipper.start()
        if hasattr(gc, "callbacks"):  # CPython only (PyPy has none)
            gc.callbacks.append(self._on_gc)
        self._started = True
        return self

    def _log_persisting(self):
        """Go's line before it writes nsqd.dat at start and at exit (not repeated for each change here)."""
        self.log.info("NSQ: persisting topic/channel metadata to %s", os.path.join(self.options.data_path, "nsqd.dat"))

    def _listen(self):
        options = self.options
        # Before this broker's first thread (the listeners' servers start the first ones): the kernel
        # widens the futex hash of a process with few threads in under a millisecond, with more in ~30 ms.
        widen_futex_hash()
        try:
            self._tcp_server = TCPServer(options.tcp_address, self)
        except OSError as e:
            raise OSError(e.errno, "listen (%s) failed - %s" % (options.tcp_address, e)) from None
        self.log.info("TCP: listening on %s", self._tcp_server.describe())
        if options.http_address:
            try:
                self._http_server = NSQDHTTPServer(options.http_address, self)
            except OSError as e:
                raise OSError(e.errno, "listen (%s) failed - %s" % (options.http_address, e)) from None
            self.log.info("HTTP: listening on %s", self._http_server.describe())
        if self.tls_context is not None and options.https_address:
            try:
                self._https_server = NSQDHTTPServer(options.https_address, self, self.tls_context)
            except OSError as e:
                raise OSError(e.errno, "listen (%s) failed - %s" % (options.https_address, e)) from None
            self.log.info("HTTPS: listening on %s", self._https_server.describe())
        self._warn_unannounced_ports()

    def _warn_unannounced_ports(self):
        """On a unix socket nsqd announces port 0, which every nsqlookupd refuses (as Go's): say so."""
        options = self.options
        if not options.nsqlookupd_tcp_addresses:
            return
        missing = []
        if self.tcp_port is None and not options.broadcast_tcp_port:
            missing.append("--broadcast-tcp-port")
        if self.http_address is not None and self.http_port is None and not options.broadcast_http_port:
            missing.append("--broadcast-http-port")
        if missing:
            self.log.warn("listening on a unix socket: nsqlookupd refuses a registration without ports "
                          "(set %s to the ports clients reach this broker on)", " and ".join(missing))

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
            if self.auto_skipper is not None:
                self.auto_skipper.stop()  # no skip while the broker winds down
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
            self._log_persisting()
            self.persist_metadata()
            with self._lock:
                topics = list(self._topics.values())
            for topic in topics:
                topic.close()
            self._lookup.close()  # no UNREGISTER: lookupd drops this producer when the socket closes
            self.stop_queue_scan()
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

    def _start_metadata_writer_thread(self):
        """(BrokerCore calls it with the first change, under its metadata lock; stop() joins it.)"""
        self._metadata_writer = threading.Thread(target=self.metadata_loop, name="nsqd-metadata", daemon=True)
        self._metadata_writer.start()

    def _stop_metadata_writer(self):
        """Let the writer finish the changes made so far, then join it (stop() writes the final state)."""
        self.close_metadata_writer()
        writer, self._metadata_writer = self._metadata_writer, None
        if writer is not None:
            writer.join()

    def __enter__(self):
        if not self._started:
            self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    @property
    def http_address(self):
        """The bound HTTP ``(host, port)``, its socket path (a str) on a unix socket, or None when HTTP is disabled."""
        return self._http_server.bound_address if self._http_server else None

    @property
    def http_port(self):
        """The bound HTTP port; None on a unix socket or when HTTP is disabled."""
        return self._http_server.port if self._http_server else None

    @property
    def https_address(self):
        """The bound HTTPS ``(host, port)``, or None without TLS or with HTTPS disabled."""
        return self._https_server.server_address[:2] if self._https_server else None

    @property
    def tcp_address(self):
        """The bound ``(host, port)`` (the real port when 0 was asked for), or the socket path (a str)."""
        return self._tcp_server.bound_address

    @property
    def tcp_port(self):
        """The bound TCP port; None on a unix socket."""
        return self._tcp_server.port

    def statsd_prefix(self):
        """``--statsd-prefix`` expanded with this broker's host key (broadcast address and HTTP port)."""
        options = self.options
        http_port = options.broadcast_http_port or self.http_port or 0  # 0 on a unix socket, as Go
        return expand_prefix(options.statsd_prefix, options.broadcast_address, http_port)

    # -- connections --------------------------------------------------------

    def listeners(self):
        """The listeners serving now (TCP, HTTP, HTTPS): what time skipping looks at for work under way."""
        return [s for s in (self._tcp_server, self._http_server, self._https_server) if s is not None]

    def tcp_listener(self):
        """The TCP listener (None before start and after exit)."""
        return self._tcp_server

    def net_poller(self):
        """The TCP listener's :class:`~nsqd_threaded.server.netpoll.NetPoller`, or None (a thread per connection)."""
        return self._tcp_server.poller if self._tcp_server is not None else None

    def connect(self, sock, address):
        """A new TCP connection: its :class:`ClientConnection`, registered with the next client ID."""
        return self.add_client(lambda id: ClientConnection(id, sock, address, self))


    # -- runtime configuration (/config) ---------------------------------------

    def set_lookupd_addresses(self, addresses):
        """``PUT /config/nsqlookupd_tcp_addresses``: dropped peers are stopped and joined, new ones started."""
        self.options.nsqlookupd_tcp_addresses = list(addresses)
        if self._started:
            self._lookup.set_addresses(self.options.nsqlookupd_tcp_addresses)
        if not addresses:  # no lookupd will ever answer: deliver now
            with self._lock:
                held, self._unqueried_topics = self._unqueried_topics, {}
            for topic, _, _ in held.values():
                topic.end_precreation()
                topic.start()

    # -- cluster (nsqlookupd) ------------------------------------------------------

    def lookupd_notify(self, cmd):
        """Queue an encoded REGISTER/UNREGISTER for every lookupd peer (never blocks)."""
        self._lookup.notify(cmd)

    def _clock_skipped(self, seconds):
        """Time skipping: PING every lookupd at once, as the broker would have during the skipped
        time, so a lookupd skipped as far (``Cluster.advance``) keeps it active; and each TCP client
        the skips carried past its next heartbeat gets it now, so that one whose own timers run on
        the skipped clock (a test's pynsq checks for silence on it) has heard from the broker."""
        self._lookup.notify(PING)
        for client in self.clients():
            clock_skipped = getattr(client, "clock_skipped", None)  # (a TCP connection's)
            if clock_skipped is not None:
                clock_skipped(seconds)

    def settled(self, asker=None):
        """Time skipping's precise look (:func:`~nsqd_threaded.server.auto_skip.settled`)."""
        return settled(self, asker)

    def skip_brings_heartbeats(self, seconds):
        """Whether a skip of ``seconds`` now would bring a TCP client a heartbeat (:meth:`_clock_skipped`)."""
        for client in self.clients():
            brings = getattr(client, "skip_brings_heartbeat", None)  # (a TCP connection's)
            if brings is not None and brings(seconds):
                return True
        return False

    def lookupd_identity(self):
        """The IDENTIFY body sent to each lookupd."""
        options = self.options
        return {
            "broadcast_address": options.broadcast_address,
            "hostname": socket.gethostname(),
            # 0 for a unix socket unless --broadcast-*-port says otherwise, as Go
            "http_port": options.broadcast_http_port or self.http_port or 0,
            "tcp_port": options.broadcast_tcp_port or self.tcp_port or 0,
            "topology_region": options.topology_region,
            "topology_zone": options.topology_zone,
            "version": options.version,
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

    def lookupd_connected(self):
        """A lookupd peer (re)connected: pre-create the channels of the topics no lookupd
        answered for yet, and let those still held deliver (called by the peer's thread)."""
        with self._lock:
            topics = [(t, mark) for t, _, mark in self._unqueried_topics.values()]
        for topic, mark in topics:
            if self._precreate_channels(topic, mark):
                self._topic_answered(topic)

    def _start_topic(self, topic):
        """Start a new topic once the cluster's channels for it exist.

        Without lookupds it starts at once.  With lookupds, it is queried (as Go
        nsqd, blocking the creating request); when no lookupd answers, the topic
        stays held (its backlog keeps every message) until one does
        (:meth:`lookupd_connected`) or the hold deadline passes (the queue scan
        releases it), so the cluster's channels get the messages published
        meanwhile even when the broker started before its lookupd.
        """
        if not self.options.nsqlookupd_tcp_addresses:
            topic.start()
            return
        deadline = time.monotonic() + self.options.lookupd_channel_query_hold
        # From here until a lookupd answers, a channel deleted on this broker is not created
        # again from an answer (which may predate the deletion).
        mark = topic.begin_precreation()
        with self._lock:
            self._unqueried_topics[topic.name] = (topic, deadline, mark)
        if self._precreate_channels(topic, mark):
            self._topic_answered(topic)

    def _topic_answered(self, topic):
        with self._lock:
            entry = self._unqueried_topics.get(topic.name)
            if entry is not None and entry[0] is topic:
                del self._unqueried_topics[topic.name]
            else:
                entry = None
        if entry is not None:  # (another thread's answer may have come first)
            topic.end_precreation()
        topic.start()

    def _release_held_topics(self, now):
        """Let topics whose hold deadline passed deliver (they stay queried on each lookupd connect)."""
        if not self._unqueried_topics:  # (a racy peek: the common case costs no lock)
            return
        due = []
        with self._lock:
            for name, (topic, deadline, mark) in list(self._unqueried_topics.items()):
                if topic.exiting:
                    del self._unqueried_topics[name]
                elif deadline <= now:
                    self._unqueried_topics[name] = (topic, math.inf, mark)
                    due.append(topic)
        for topic in due:
            self.log.warn(
                "TOPIC(%s): no nsqlookupd answered within %gs: delivering to its %d channel(s); "
                "the cluster's channels are created when one answers",
                topic.name, self.options.lookupd_channel_query_hold, len(topic.channels()),
            )
            topic.start()

    def _precreate_channels(self, topic, mark):
        """Create the channels the cluster knows for a new topic; True when a lookupd answered.

        As Go nsqd: blocks the caller for the lookupd queries.  A channel deleted
        here since ``mark`` (the topic's :meth:`~nsqd_threaded.broker.topic.Topic.begin_precreation`)
        is not created again: the answer may predate its deletion.
        """
        addresses = self._lookup.http_addresses()
        if not addresses:
            if self.options.nsqlookupd_tcp_addresses:
                self.log.error("no available nsqlookupd to query for channels to pre-create for topic %s "
                               "(holding its messages until one answers)", topic.name)
            return False
        options = self.options
        channels, errors = query_topic_channels(
            addresses, topic.name, options.http_client_connect_timeout, options.http_client_request_timeout
        )
        if errors:
            what = "failed to query any nsqlookupd" if len(errors) == len(addresses) else "partial failure"
            self.log.warn(
                "failed to query nsqlookupd for channels to pre-create for topic %s - %s: %s",
                topic.name, what, "; ".join(errors),
            )
            if len(errors) == len(addresses):
                return False
        names = []
        for name in channels:
            if name.endswith("#ephemeral"):
                continue  # an ephemeral channel exists only with its consumers
            if not is_valid_name(name):
                self.log.warn("skipping pre-creation of invalid channel %s for topic %s", name, topic.name)
                continue
            names.append(name)
        try:
            topic.precreate_channels(names, mark)
        except TopicError:
            pass  # deleted meanwhile
        return True
