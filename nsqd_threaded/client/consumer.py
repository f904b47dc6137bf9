"""Consumer: SUB and RDY over one or several nsqd, messages to a handler or an iterator."""

import queue
import random
import threading
import time
import urllib.parse

from ..internal.gocompat import format_duration
from ..wire import protocol_v2
from .clock import ClientClock
from .connection import (
    ConnectionClosed,
    ConnectOptions,
    HEARTBEAT,
    NSQError,
    address_list,
    encode_name,
    format_address,
    parse_addresses,
)
from .log import ClientLog, dial_words, error_words
from .lookupd import lookup_addresses, parse_lookupd_address

# -- Consumer --------------------------------------------------------------------


class ReceivedMessage:
    """A message a Consumer received: ``id`` (16 bytes), ``body``, ``timestamp`` (ns), ``attempts``.

    :meth:`fin`, :meth:`req` and :meth:`touch` write to the connection it came by.
    ``responded`` is set by fin/req; a handler's return value is applied only when
    the handler did not respond itself (nor called :meth:`enable_async`).
    """

    __slots__ = ("id", "body", "timestamp", "attempts", "responded", "connection", "_async", "_consumer")

    def __init__(self, data, connection, consumer=None):
        self.timestamp, self.attempts, self.id, self.body = protocol_v2.decode_message(data)
        self.connection = connection
        self.responded = False
        self._async = False
        self._consumer = consumer  # told of each FIN/REQ when it backs off on failures

    def __repr__(self):
        return "<ReceivedMessage %s attempts=%d %r>" % (self.id.decode("ascii", "replace"), self.attempts, self.body[:40])

    def fin(self):
        """``FIN``: done with it.  Raises ConnectionClosed if its connection ended.

        A consumer that backs off takes it as a success (go-nsq's resume signal)."""
        self.responded = True
        self.connection.post(b"FIN %s\n" % self.id)
        consumer = self._consumer
        if consumer is not None and consumer.backs_off:
            consumer._backoff_signal(_RESUME)

    def req(self, delay_ms=0, backoff=False):
        """``REQ``: deliver it again after ``delay_ms`` milliseconds (nsqd caps at --max-req-timeout).

        ``delay_ms=-1`` is go-nsq's automatic delay (``default_requeue_delay``
        times the attempts, at most ``max_requeue_delay``).  With ``backoff``
        the consumer backs off (go-nsq's ``Requeue``; without it,
        ``RequeueWithoutBackoff``)."""
        self.responded = True
        consumer = self._consumer
        if delay_ms < 0:
            delay_ms = consumer.requeue_delay_for(self) if consumer is not None else 0
        self.connection.post(b"REQ %s %d\n" % (self.id, delay_ms))
        if consumer is not None and consumer.backs_off:
            consumer._backoff_signal(_BACKOFF if backoff else _CONTINUE)

    def touch(self):
        """``TOUCH``: restart its msg_timeout."""
        self.connection.post(b"TOUCH %s\n" % self.id)

    def enable_async(self):
        """The handler will answer later (from another thread): no automatic FIN/REQ."""
        self._async = True


def fin_all(messages):
    """FIN ``messages`` (handled by none of fin/req yet), one write per connection rather than one each.

    For a consumer that answers a batch at once (an archiver after its fsync).
    A message whose connection has ended is skipped: nsqd delivers it again.
    """
    by_connection = {}
    for msg in messages:
        msg.responded = True
        lines = by_connection.get(msg.connection)
        if lines is None:
            lines = by_connection[msg.connection] = []
        lines.append(msg.id)
    for connection, ids in by_connection.items():
        try:
            connection.post(b"FIN " + b"\nFIN ".join(ids) + b"\n")
        except ConnectionClosed:
            continue
    for msg in messages:
        consumer = msg._consumer
        if consumer is not None and consumer.backs_off:
            consumer._backoff_signal(_RESUME)


_STOP = object()

# go-nsq's backoff signals: a failure, a success, a requeue that says nothing about health
_BACKOFF, _RESUME, _CONTINUE = "backoff", "resume", "continue"


class Consumer:
    """Consumes ``topic``/``channel`` from one or more nsqd, with up to ``max_in_flight`` messages at once.

    ``Consumer(addresses, topic, channel, handler=None, *, max_in_flight=1, concurrency=1,
    identify=None, requeue_delay_ms=0, reconnect_backoff=(0.1, 5.0), timeout=10.0,
    on_error=None, lookupd_http_addresses=None, lookupd_poll_interval=60.0,
    rdy_redistribute_interval=5.0, low_rdy_idle_timeout=10.0, auth_secret=None, tls_v1=False,
    tls_options=None, snappy=False, deflate=False, deflate_level=None, on_message=None)``

    * ``addresses``: nsqd TCP addresses (one or a list; may be None with lookupd).
    * ``lookupd_http_addresses``: nsqlookupd HTTP addresses, asked ``/lookup?topic=``
      at start and every ``lookupd_poll_interval`` seconds; the consumer connects to
      every producer they list (``broadcast_address:tcp_port``).  When such a connection
      is lost (not closed by :meth:`close`), lookupd is asked at once and the node redialled
      while it is still listed, at once and then every ``reconnect_backoff`` seconds
      (doubling); a node no longer listed, or whose first connection failed, waits for a poll.
    * With a ``handler``, ``concurrency`` threads call ``handler(message)``: a return of
      ``False`` or an exception sends ``REQ <id> <requeue_delay_ms>``, anything else ``FIN``
      (unless the handler answered itself or called ``message.enable_async()``).
    * Without, iterate (``for message in consumer``) or call :meth:`get`; answer each
      message with ``fin()``/``req()``.
    * ``max_in_flight`` (at least 1) is split over the connections (each gets at least 1) and capped
      at the ``max_rdy_count`` nsqd announces; it is sent as ``RDY`` right after ``SUB``.
      With several connections it is re-split every ``rdy_redistribute_interval``
      seconds: a connection that received nothing for ``low_rdy_idle_timeout`` seconds
      drops to ``RDY 1`` and the busy connections share the rest.  An idle connection
      that receives a message again is busy at the next re-split.
    * ``identify`` adds or overrides IDENTIFY fields (e.g. ``{"heartbeat_interval": 1000,
      "msg_timeout": 5000}``, in ms).
    * ``auth_secret`` is sent with ``AUTH`` after IDENTIFY when nsqd requires it.
    * ``tls_v1``, ``tls_options``, ``snappy``, ``deflate``, ``deflate_level``: TLS and
      compression (see :func:`~nsqd_threaded.client.connection.transport_options`).
    * A lost connection to a given address is made again at once, then after
      ``reconnect_backoff`` seconds (min, max), doubling, until it works or the consumer
      is closed.
    * ``on_message(message)``, if given, is called on the connection's reader thread with
      each message instead of queueing it for a handler or an iterator: the caller keeps
      and answers it (the Spark source does, to TOUCH everything it holds).
    * ``max_attempts`` (go-nsq's option; 0, the default here, means no limit): a message
      delivered more often than that is not handed on: ``on_give_up(message)`` is called
      (go-nsq's ``LogFailedMessage``; on the reader thread) and the message is FINed.
    * Backoff (go-nsq's RDY throttling), on when ``max_backoff_duration`` > 0 (go-nsq's 2m
      with :class:`~nsqd_threaded.client.config.ClientConfig`; off by default here): a
      handler's failure (or ``req(..., backoff=True)``) raises the backoff level and sets
      every connection to ``RDY 0`` for ``backoff_multiplier * 2**level`` seconds (at most
      ``max_backoff_duration``; ``backoff_strategy="full_jitter"`` draws it at random up to
      that), then one connection gets ``RDY 1`` to test; each success lowers the level,
      and at level 0 every connection is back to its share of ``max_in_flight``.
    * ``clock`` (a test's :class:`~nsqd_threaded.testing.Broker`, ``Lookupd`` or ``Cluster``, or its
      ``clock``): the reconnect delays and the backoff periods run on that clock, so a broker that
      skips time (``advance``, ``auto_skip``) skips them too (:mod:`nsqd_threaded.client.clock`).
    * ``requeue_delay_ms=-1`` requeues a failed message after ``default_requeue_delay``
      seconds times its attempts, at most ``max_requeue_delay`` (go-nsq's automatic delay).
    * ``on_error(error)`` receives every NSQError that arrives on an established
      connection (e.g. the non-fatal E_FIN_FAILED), every failed reconnection and every
      failed lookupd query; by default they are logged.
    * ``logger`` (an object with ``debug``/``info``/``warn``/``error(fmt, *args)``, such as
      a tool's :class:`~nsqd_threaded.internal.logger.Logger`; default: the ``logging``
      module's ``nsqd_threaded.client``) gets every connection event in go-nsq's words
      (:class:`~nsqd_threaded.client.log.ClientLog`): connecting, a failed dial, an IO error
      naming the address, re-connecting, the connections left, each lookupd query and its
      failure (a 404 ``TOPIC_NOT_FOUND`` included); ``log_id`` is go-nsq's instance number
      at the head of each line.

    :meth:`start` (or ``with``) connects and subscribes; :meth:`close` sends ``CLS``,
    waits for ``CLOSE_WAIT``, requeues the messages nobody took, stops the handler
    threads and joins every thread.

    ``_backoff_lock`` is always taken before ``_lock``, never after.
    ``_lock`` (and the ``_changed`` condition on it) guards ``_conns``, ``_subscribed``,
    ``_known``, ``_readers``, ``_closing``, ``_cls_sent``, ``_finished`` and each connection's ``rdy``.
    """

    def __init__(
        self,
        addresses,
        topic,
        channel,
        handler=None,
        *,
        max_in_flight=1,
        concurrency=1,
        identify=None,
        requeue_delay_ms=0,
        reconnect_backoff=(0.1, 5.0),
        timeout=10.0,
        on_error=None,
        lookupd_http_addresses=None,
        lookupd_poll_interval=60.0,
        rdy_redistribute_interval=5.0,
        low_rdy_idle_timeout=10.0,
        auth_secret=None,
        tls_v1=False, tls_options=None, snappy=False, deflate=False, deflate_level=None,  # the transport: ConnectOptions
        on_message=None,
        max_attempts=0,
        on_give_up=None,
        backoff_multiplier=1.0,
        max_backoff_duration=0.0,
        backoff_strategy="exponential",
        default_requeue_delay=90.0,
        max_requeue_delay=900.0,
        logger=None,
        log_id=1,
        clock=None
    ):
        self.lookupd_http_addresses = [parse_lookupd_address(a) for a in address_list(lookupd_http_addresses)]
        if addresses or not self.lookupd_http_addresses:
            self.addresses = parse_addresses(addresses)
        else:
            self.addresses = []
        self.topic = topic
        self.channel = channel
        self.log = ClientLog(logger, log_id, topic, channel)
        self._sub = b"SUB %s %s\n" % (encode_name(topic, "topic"), encode_name(channel, "channel"))
        # Connecting: to each address (again after a loss) and to each node lookupd lists.
        self._connect = ConnectOptions(timeout, identify, auth_secret, tls_v1, tls_options, snappy, deflate, deflate_level)
        self.timeout = timeout
        self.auth_secret = auth_secret
        self.reconnect_backoff = reconnect_backoff
        self.lookupd_poll_interval = lookupd_poll_interval
        # Flow: max_in_flight split as RDY over the connections, re-split for the idle ones.
        if max_in_flight < 1:  # 0 would subscribe and never ask for a message
            raise ValueError("max_in_flight must be >= 1 (it is %r): with 0 no message would ever arrive"
                             % (max_in_flight,))
        self.max_in_flight = max_in_flight
        self.rdy_redistribute_interval = rdy_redistribute_interval
        self.low_rdy_idle_timeout = low_rdy_idle_timeout
        # Handing messages over: to handler threads, an iterator, or on_message; errors to on_error.
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.handler = handler
        self.concurrency = concurrency
        self.on_message = on_message
        self.on_error = on_error
        # Failures: go-nsq's backoff (RDY throttling), requeue delays, giving up after max_attempts.
        if backoff_strategy not in ("exponential", "full_jitter"):
            raise ValueError("backoff_strategy must be exponential or full_jitter")
        self.backoff_strategy = backoff_strategy
        self.backoff_multiplier = backoff_multiplier
        self.max_backoff_duration = max_backoff_duration
        self.backs_off = max_backoff_duration > 0
        self.requeue_delay_ms = requeue_delay_ms
        self.default_requeue_delay = default_requeue_delay
        self.max_requeue_delay = max_requeue_delay
        self.max_attempts = max_attempts
        self.on_give_up = on_give_up
        self.given_up = 0  # messages FINed for exceeding max_attempts
        # guards _backoff_level, _backoff_timer (a pending test RDY) and _random
        self._backoff_lock = threading.Lock()
        self._backoff_level = 0
        self._backoff_timer = None
        self._backoff_timers = []  # every timer started, joined by close()
        self._clock = ClientClock(clock)  # reconnect delays and backoff: real time, or a test broker's clock
        self._random = random.Random()
        self._queue = queue.Queue()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._conns = set()
        self._subscribed = set()
        self._known = set()  # addresses with a connection thread
        self._closing = False
        self._cls_sent = False  # stop_receiving() ran
        self._finished = False  # close() requeued the queue and stopped the handlers
        self._started = False
        self._readers = []
        self._workers = []
        self._cluster = None  # the thread that polls lookupd and re-splits RDY
        self.heartbeats = 0  # heartbeats answered (for tests and curiosity)

    def __repr__(self):
        where = [format_address(a) for a in self.addresses] + ["lookupd " + format_address(a) for a in self.lookupd_http_addresses]
        return "<Consumer %s/%s %s>" % (self.topic, self.channel, ",".join(where))

    # -- lifecycle -------------------------------------------------------------

    def start(self, wait=True):
        """Connect to every address (and every node lookupd lists).  With ``wait``, return
        once each one is subscribed, or close and raise the first failure of a given
        address (NSQError, OSError, TimeoutError) or, when every lookupd failed, the
        first lookupd error.  Without ``wait`` nothing is raised: a failed lookupd query
        is logged (and given to ``on_error``) and the polls go on, as go-nsq's do."""
        with self._lock:
            if self._started:
                raise RuntimeError("consumer already started")
            self._started = True
        found = []
        if self.lookupd_http_addresses:
            found, errors = self._lookup()
            if errors and len(errors) == len(self.lookupd_http_addresses) and not self.addresses and wait:
                self.close()
                raise errors[0]
            for error in errors:
                self._report(error, logged=True)
        firsts = []  # (outcome, must succeed)
        n = len(self.addresses) + len([a for a in found if a not in self.addresses])
        for i, address in enumerate(self.addresses):
            first = _Outcome() if wait else None
            firsts.append((first, True))
            self._spawn(address, self._share(i, n), first, True)
        for address in found:
            first = _Outcome() if wait else None
            if self._spawn(address, self._share(len(firsts), n), first, False):
                firsts.append((first, False))
        if self.handler is not None:
            for i in range(self.concurrency):
                worker = threading.Thread(
                    target=self._work, name="nsq-handler[%s/%s %d]" % (self.topic, self.channel, i), daemon=True
                )
                self._workers.append(worker)
                worker.start()
        if self.lookupd_http_addresses or len(self.addresses) > 1:
            self._cluster = threading.Thread(
                target=self._cluster_loop, name="nsq-consumer-rdy[%s/%s]" % (self.topic, self.channel), daemon=True
            )
            self._cluster.start()
        if wait:
            deadline = time.monotonic() + self.timeout
            for first, _ in firsts:
                first.wait(max(0.0, deadline - time.monotonic()))
            failure = next((f.error for f, required in firsts if required and f.error is not None), None)
            if failure is None and not all(f.is_set() for f, _ in firsts):
                failure = TimeoutError("not subscribed within %gs" % self.timeout)
            if failure is not None:
                self.close()
                raise failure
        return self

    def _share(self, i, n):
        """The ``i``-th of ``n`` connections' part of max_in_flight (at least 1)."""
        n = max(n, 1)
        return max(1, self.max_in_flight // n + (1 if i < self.max_in_flight % n else 0))

    def _spawn(self, address, rdy, first, persistent):
        """Start the connection thread of ``address`` unless it has one; False if it had (or closing)."""
        with self._lock:
            if self._closing or address in self._known:
                return False
            self._known.add(address)
            thread = threading.Thread(
                target=self._run,
                args=(address, rdy, first, persistent),
                name="nsq-consumer[%s %s/%s]" % (format_address(address), self.topic, self.channel),
                daemon=True,
            )
            self._readers = [t for t in self._readers if t.is_alive()]
            self._readers.append(thread)
            thread.start()
        return True

    def __enter__(self):
        return self if self._started else self.start()

    def __exit__(self, *exc):
        self.close()

    def wait_subscribed(self, count=None, timeout=None):
        """Wait until ``count`` (default: all known addresses) connections are subscribed; False on timeout."""
        with self._changed:
            return self._changed.wait_for(
                lambda: len(self._subscribed) >= (len(self._known) if count is None else count),
                self.timeout if timeout is None else timeout,
            )

    @property
    def subscribed(self):
        """The addresses currently subscribed."""
        with self._lock:
            return sorted((c.address for c in self._subscribed), key=format_address)  # (paths and tuples mix)

    @property
    def rdy(self):
        """``{address: RDY count}`` of the subscribed connections (what was last sent)."""
        with self._lock:
            return {c.address: c.rdy for c in self._subscribed}

    def stop_receiving(self, timeout=None):
        """``CLS`` every connection and wait (at most ``timeout``) for nsqd's ``CLOSE_WAIT``; True the first time.

        After it no message arrives, and nothing reconnects, but the connections
        stay open: the messages held can still be FINed or requeued (an archiver
        writes and FINs what it holds before :meth:`close`).
        """
        timeout = self.timeout if timeout is None else timeout
        with self._lock:
            first = not self._cls_sent
            self._cls_sent = True
            self._closing = True
            conns = list(self._subscribed)
        self._stop.set()
        if first:
            for conn in conns:
                try:
                    conn.send(b"CLS\n")
                except ConnectionClosed:
                    pass
            deadline = time.monotonic() + timeout
            for conn in conns:
                conn.close_wait.wait(max(0.0, deadline - time.monotonic()))
        return first

    def close(self, timeout=None):
        """``CLS`` every connection, wait for ``CLOSE_WAIT``, requeue what nobody took, stop everything.

        Waits at most ``timeout`` seconds (default: the consumer's) for each stage.
        """
        timeout = self.timeout if timeout is None else timeout
        self.stop_receiving(timeout)
        with self._lock:
            first = not self._finished
            self._finished = True
        if first:
            self._requeue_queued()
            self._queue.put(_STOP)
        deadline = time.monotonic() + timeout
        me = threading.current_thread()
        for worker in self._workers:
            if worker is not me:
                worker.join(max(0.0, deadline - time.monotonic()))
        with self._backoff_lock:
            timers, self._backoff_timers = self._backoff_timers, []
            self._backoff_timer = None
        for timer in timers:
            timer.cancel()
            if timer is not me:
                timer.join(max(0.0, deadline - time.monotonic()))
        cluster = self._cluster
        if cluster is not None and cluster is not me:
            cluster.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            conns = list(self._conns)
            readers = list(self._readers)
        for conn in conns:
            conn.shutdown()
        for reader in readers:
            if reader is not me:
                reader.join(max(0.0, deadline - time.monotonic()))

    def _requeue_queued(self):
        while True:
            try:
                msg = self._queue.get_nowait()
            except queue.Empty:
                return
            if msg is _STOP or msg.connection.closed:
                continue
            try:
                msg.req(0)
            except ConnectionClosed:
                pass

    # -- messages --------------------------------------------------------------

    def _next(self, timeout):
        """The next message whose connection is still open; None once closed; queue.Empty on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            item = self._queue.get(timeout=remaining)
            if item is _STOP:
                self._queue.put(_STOP)  # for the other getters
                return None
            if item.connection.closed:
                continue  # nsqd took it back when that connection ended
            return item

    def get(self, timeout=None):
        """The next message (iterator mode).  TimeoutError after ``timeout`` seconds;
        ConnectionClosed once the consumer is closed."""
        if self.handler is not None:
            raise RuntimeError("this consumer has a handler")
        try:
            msg = self._next(timeout)
        except queue.Empty:
            raise TimeoutError("no message within %gs" % timeout) from None
        if msg is None:
            raise ConnectionClosed("consumer is closed")
        return msg

    def __iter__(self):
        if self.handler is not None:
            raise RuntimeError("this consumer has a handler")
        while True:
            msg = self._next(None)
            if msg is None:
                return
            yield msg

    def _work(self):
        """A handler thread."""
        while True:
            msg = self._next(None)
            if msg is None:
                return
            try:
                result = self.handler(msg)
            except Exception as e:
                self.log.exception("Handler returned error (%s) for msg %s", e, msg.id.decode("ascii", "replace"))
                result = False
            if msg.responded or msg._async:
                continue
            try:
                if result is False:
                    msg.req(self.requeue_delay_ms, backoff=True)
                else:
                    msg.fin()
            except ConnectionClosed as e:
                self.log.conn("info", msg.connection.address, "cannot answer msg %s - %s",
                              msg.id.decode("ascii", "replace"), error_words(e))

    # -- connections -----------------------------------------------------------

    def _report(self, error, logged=False):
        """``on_error(error)`` when there is one, else the log (unless the event was ``logged`` already)."""
        if self.on_error is None:
            if not logged:
                self.log.error("%s", error)
            return
        try:
            self.on_error(error)
        except Exception as e:
            self.log.exception("on_error failed - %s", e)

    def _run(self, address, rdy, first, persistent):
        """The thread of one address: connect, subscribe, read; again after a loss, with backoff.

        A given address (``persistent``) is redialled at once after a loss, then every
        ``reconnect_backoff`` seconds (doubling) until it works.  A node found through lookupd
        is given up after a failed first attempt (the next poll brings it back if listed);
        once it was subscribed, a lost connection makes the thread ask lookupd at once
        (go-nsq's recheck on a closed connection) and redial while lookupd still lists it,
        at once and then every ``reconnect_backoff`` seconds, doubling.
        """
        low, high = self.reconnect_backoff
        delay = low
        subscribed_once = False
        try:
            while not self._stop.is_set():
                self.log.conn("info", address, "connecting to nsqd")
                try:
                    conn = self._subscribe(address, rdy)
                except (_DialFailed, OSError, NSQError, ValueError) as e:  # ConnectionClosed, TimeoutError: OSErrors
                    words = error_words(e)
                    if isinstance(e, _DialFailed):
                        e, words = e.error, dial_words(e.error, address)
                    if not self._stop.is_set():
                        self.log.conn("error", address, "error connecting to nsqd - %s", words)
                    starting = first is not None  # start() is waiting: it closes the consumer on this failure
                    if starting:
                        first.fail(e)
                        first = None
                    elif not self._stop.is_set():
                        self._report(e, logged=True)
                    if not persistent and not subscribed_once:
                        return  # the next lookupd poll that lists it brings it back
                    if not starting and not self._stop.is_set():
                        self.log.conn("info", address, "re-connecting in %s", format_duration(delay))
                    if self._clock.wait(self._stop, delay):
                        return
                    delay = min(delay * 2, high)
                    if not persistent and not self._recheck_lookupd(address):
                        return
                    continue
                if first is not None:
                    first.set()
                    first = None
                subscribed_once = True
                fatal = self._read_loop(conn)
                if self._stop.is_set():
                    return  # a deliberate close: nothing to redial
                if fatal:
                    # Ended by a fatal error: retrying at once could spin.
                    self.log.conn("info", address, "re-connecting in %s", format_duration(delay))
                    if self._clock.wait(self._stop, delay):
                        return
                    delay = min(delay * 2, high)
                else:
                    delay = low
                rdy = conn.rdy  # what it had last
                if not persistent and not self._recheck_lookupd(address):
                    return
        finally:
            with self._changed:
                self._known.discard(address)
                self._changed.notify_all()

    def _subscribe(self, address, rdy):
        try:
            conn = self._connect.open(address)
        except OSError as e:
            raise _DialFailed(e) from None
        with self._lock:
            if self._closing:
                conn.close()
                raise ConnectionClosed("consumer is closing")
            self._conns.add(conn)
        try:
            self._connect.handshake(conn)
            conn.send(self._sub)
            answer = conn.read_answer()
            if answer != b"OK":
                raise ConnectionClosed("unexpected answer to SUB: %r" % answer[:64])
            max_rdy = conn.settings.get("max_rdy_count")
            conn.max_rdy = max_rdy if isinstance(max_rdy, int) else None
            if conn.max_rdy is not None and rdy > conn.max_rdy:
                rdy = conn.max_rdy
            if self._backoff_level > 0:
                rdy = 0  # backing off: the next test RDY 1 may pick it
            conn.rdy = rdy
            conn.received = 0  # messages so far: the RDY re-split tells busy from idle by it
            conn.seen = (0, time.monotonic())  # (received, when it last changed), the re-split's
            conn.send(b"RDY %d\n" % rdy)
            conn.handshake_done()
        except BaseException:
            with self._lock:
                self._conns.discard(conn)
            conn.close()
            raise
        with self._changed:
            if self._closing:
                self._conns.discard(conn)
                conn.close()
                raise ConnectionClosed("consumer is closing")
            self._subscribed.add(conn)
            self._changed.notify_all()
        return conn

    def _read_loop(self, conn):
        """Read until the connection ends; True if it ended with a fatal error from nsqd."""
        put = self.on_message or self._queue.put
        try:
            while True:
                frame_type, data = conn.read_frame()
                if frame_type == protocol_v2.FRAME_TYPE_MESSAGE:
                    conn.received += 1
                    msg = ReceivedMessage(data, conn, self)
                    if self.max_attempts and msg.attempts > self.max_attempts:
                        self._give_up(msg)
                        continue
                    put(msg)
                elif frame_type == protocol_v2.FRAME_TYPE_RESPONSE:
                    if data == HEARTBEAT:
                        self.heartbeats += 1
                        conn.send(b"NOP\n")
                    elif data == b"CLOSE_WAIT":
                        conn.close_wait.set()
                    else:
                        self.log.conn("warn", conn.address, "unexpected response %r", data[:64])
                elif frame_type == protocol_v2.FRAME_TYPE_ERROR:
                    error = NSQError(data, conn.address)
                    self.log.conn("error", conn.address, "protocol error - %s", error)
                    self._report(error, logged=True)
                    if error.fatal:
                        return True  # nsqd closes the connection
                else:
                    self.log.conn("error", conn.address, "IO error - unknown frame type %d", frame_type)
                    return True
        except (OSError, ValueError) as e:
            if not self._stop.is_set():
                self.log.conn("error", conn.address, "IO error - %s", error_words(e))
            return False
        finally:
            with self._changed:
                self._conns.discard(conn)
                self._subscribed.discard(conn)
                left = len(self._subscribed)
                self._changed.notify_all()
            conn.close()
            if not self._stop.is_set():
                self.log.warn("there are %d connections left alive", left)

    # -- the cluster: lookupd polls and RDY re-splits -------------------------------

    def _lookup(self):
        """``(addresses, errors)`` of the topic's producers on every lookupd."""
        path = "/lookup?topic=" + urllib.parse.quote(self.topic, safe="")
        return lookup_addresses(self.lookupd_http_addresses, path, self.timeout, log=self.log)

    def _connect_found(self):
        """Ask every lookupd and connect to the nodes listed that have no connection thread yet;
        the addresses listed (each query and failure is logged, errors go to ``on_error``)."""
        found, errors = self._lookup()
        for error in errors:
            self._report(error, logged=True)
        with self._lock:
            new = [a for a in found if a not in self._known]
            n = len(self._known) + len(new)
        for address in new:
            self._spawn(address, self._share(n - 1, n), None, False)
        return found

    def _recheck_lookupd(self, address):
        """After losing the connection to ``address`` (found through lookupd): ask lookupd at once,
        as go-nsq does on a closed connection, connecting any node newly listed; True if lookupd
        still lists ``address`` (its thread redials it), False to give it up until a poll lists it."""
        if self._stop.is_set():
            return False
        listed = address in self._connect_found()
        if not listed:
            self.log.conn("info", address, "no longer listed by nsqlookupd; not re-connecting until a poll lists it")
        return listed and not self._stop.is_set()

    def _cluster_loop(self):
        """The ``nsq-consumer-rdy`` thread: re-split RDY every interval, poll lookupd every poll interval."""
        now = time.monotonic()
        # each on its own clock: a poll interval shorter than the re-split's is kept, not rounded up to it
        next_poll = now + self.lookupd_poll_interval if self.lookupd_http_addresses else float("inf")
        next_split = now + self.rdy_redistribute_interval
        while not self._stop.wait(max(0.0, min(next_poll, next_split) - time.monotonic())):
            now = time.monotonic()
            if now >= next_poll:
                next_poll = now + self.lookupd_poll_interval
                self._connect_found()
            if now >= next_split:
                next_split = now + self.rdy_redistribute_interval
                try:
                    self._redistribute(time.monotonic())
                except ConnectionClosed:
                    pass  # that connection's reader notices and cleans up

    def _redistribute(self, now):
        """Send each subscribed connection its new RDY: idle ones 1, busy ones the rest, evenly.

        Like go-nsq's RDY redistribution, a connection is idle when it received no message for
        ``low_rdy_idle_timeout``; unlike it, an idle connection keeps RDY 1 rather than 0 so that
        it notices new work by itself.  Without any busy (or any idle) connection the budget is
        split evenly.
        """
        if self._backoff_level > 0:
            return  # the backoff decides every RDY until it is over
        with self._lock:
            conns = sorted(self._subscribed, key=lambda c: c.address)
        if not conns:
            return
        idle, busy = [], []
        for conn in conns:
            received, since = conn.seen
            if conn.received != received:
                conn.seen = (conn.received, now)
                busy.append(conn)
            elif now - since >= self.low_rdy_idle_timeout:
                idle.append(conn)
            else:
                busy.append(conn)
        if not idle or not busy:
            targets = [(c, self._share(i, len(conns))) for i, c in enumerate(conns)]
        else:
            budget = max(self.max_in_flight - len(idle), len(busy))
            n = len(busy)
            targets = [(c, 1) for c in idle]
            targets += [(c, budget // n + (1 if i < budget % n else 0)) for i, c in enumerate(busy)]
        for conn, rdy in targets:
            sent = self._send_rdy(conn, rdy)
            if sent is not None:
                self.log.conn("debug", conn.address, "sending RDY %d (%s)", sent, "idle" if conn in idle else "busy")


    # -- max_attempts and backoff ------------------------------------------------------

    def requeue_delay_for(self, msg):
        """go-nsq's automatic requeue delay in ms: default_requeue_delay * attempts, capped."""
        return int(min(self.default_requeue_delay * msg.attempts, self.max_requeue_delay) * 1000)

    def _give_up(self, msg):
        """A message past max_attempts: tell on_give_up (or log it), then FIN it."""
        self.given_up += 1
        if self.on_give_up is None:
            self.log.warn("msg %s attempted %d times, giving up", msg.id.decode("ascii", "replace"), msg.attempts)
        else:
            try:
                self.on_give_up(msg)
            except Exception as e:
                self.log.exception("on_give_up failed for msg %s - %s", msg.id.decode("ascii", "replace"), e)
        try:
            msg.responded = True
            msg.connection.send(b"FIN %s\n" % msg.id)
        except ConnectionClosed:
            pass

    def _backoff_duration(self, level):
        duration = self.backoff_multiplier * (2 ** level)
        if self.backoff_strategy == "full_jitter":
            duration = self._random.uniform(0, duration)
        return duration

    @property
    def backoff_level(self):
        """The current backoff level (0: not backing off)."""
        return self._backoff_level

    def _backoff_signal(self, signal):
        """go-nsq's startStopContinueBackoff: a failure raises the level, a success lowers it.

        While a backoff period runs (a timer is pending) signals change nothing,
        so a burst of failures is one step, not many.
        """
        if signal == _RESUME and self._backoff_level == 0 and self._backoff_timer is None:
            # Nothing to lower (every FIN says so): no lock.  A failure racing this is simply ordered after it.
            return
        with self._backoff_lock:
            if self._backoff_timer is not None or self._closing:
                return
            level = self._backoff_level
            updated = False
            if signal == _RESUME and level > 0:
                level -= 1
                updated = True
            elif signal == _BACKOFF and self.backoff_multiplier * 2 ** (level + 1) <= self.max_backoff_duration:
                level += 1
                updated = True
            self._backoff_level = level
            if level == 0 and updated:
                self.log.warn("exiting backoff, returning all to RDY")
                self._set_all_rdy(None)
            elif level > 0:
                duration = min(self._backoff_duration(level), self.max_backoff_duration)
                self.log.warn("backing off for %s (backoff level %d), setting all to RDY 0",
                              format_duration(duration), level)
                self._set_all_rdy(0)
                self._start_backoff_timer(duration)

    def _start_backoff_timer(self, duration):
        """Call with _backoff_lock held: after ``duration``, one connection gets RDY 1."""
        timer = self._clock.timer(duration, self._backoff_expired,
                                  "nsq-consumer-backoff[%s/%s]" % (self.topic, self.channel))
        self._backoff_timer = timer
        self._backoff_timers = [t for t in self._backoff_timers if t.is_alive()] + [timer]

    def _backoff_expired(self):
        """The backoff period is over: test the waters with RDY 1 on one connection chosen at random."""
        with self._backoff_lock:
            if self._backoff_timer is None:
                return  # closed meanwhile
            self._backoff_timer = None
            with self._lock:
                conns = sorted(self._subscribed, key=lambda c: c.address)
            if not conns:
                self._start_backoff_timer(1.0)  # nobody to test with yet: go-nsq waits a second
                return
            choice = self._random.choice(conns)
        try:
            self._send_rdy(choice, 1)
        except ConnectionClosed:
            with self._backoff_lock:
                if not self._closing and self._backoff_timer is None:
                    self._start_backoff_timer(1.0)

    def _set_all_rdy(self, rdy):
        """Every subscribed connection to ``rdy`` (None: its share of max_in_flight)."""
        with self._lock:
            conns = sorted(self._subscribed, key=lambda c: c.address)
        for i, conn in enumerate(conns):
            try:
                self._send_rdy(conn, self._share(i, len(conns)) if rdy is None else rdy)
            except ConnectionClosed:
                pass  # its reader cleans up

    def _send_rdy(self, conn, rdy):
        """Send ``RDY rdy`` (capped at nsqd's max) unless the connection has it already; the count sent, or None."""
        if conn.max_rdy is not None and rdy > conn.max_rdy:
            rdy = conn.max_rdy
        with self._lock:
            if conn.rdy == rdy or conn not in self._subscribed:
                return None
            conn.rdy = rdy
        conn.send(b"RDY %d\n" % rdy)
        return rdy


class _DialFailed(Exception):
    """Connecting failed before a byte was sent (``error``, the OSError): Go says ``dial tcp ...``."""

    def __init__(self, error):
        super().__init__(error)
        self.error = error


class _Outcome(threading.Event):
    """The first connection attempt of one address: set when it ended; ``error`` if it failed."""

    error = None

    def fail(self, error):
        self.error = error
        self.set()
