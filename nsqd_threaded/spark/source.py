"""The streaming source: consume on the driver, FIN only after Spark's durable commit.

NSQ has no offsets and no partitions: a channel is a competing-consumer queue and a
message is gone once FINed.  So the offsets are batch boundaries this reader invents
(``{"seq": n}``, a counter over drained messages), the messages travel to executors
inside the InputPartitions, and FIN waits for :meth:`NsqStreamReader.commit`, which
Spark calls once the batch's sink finished and its commit log entry is written.

Spark keeps ONE reader object for the whole query in one driver-side Python process;
another copy is pickled to executors, where only :meth:`read` runs.  So nothing
connects in ``__init__`` and pickling drops sockets, threads and locks.
"""

import datetime
import logging
import threading

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from ..client import ConnectionClosed, Consumer
from ..client.connection import format_address

log = logging.getLogger("nsqd_threaded.spark")

# Answers to a FIN/TOUCH of a message nsqd no longer holds for that connection (it
# timed out, or the connection was replaced): expected now and then, not failures.
_QUIET_ERRORS = frozenset({"E_FIN_FAILED", "E_TOUCH_FAILED", "E_REQ_FAILED"})

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


class NsqPartition(InputPartition):
    """A data-carrying partition: ``rows`` are (body, id, attempts, timestamp_ns) tuples."""

    def __init__(self, rows, node_names, topic, channel):
        super().__init__(None)
        self.rows = rows
        self.node_names = node_names  # parallel to rows: the nsqd each came from
        self.topic = topic
        self.channel = channel


class NsqStreamReader(DataSourceStreamReader):
    """One query's consumer of ``topic``/``channel``.

    Driver side, lazily on first use: ``connectionsPerNode`` Consumers (each one
    connection per node, with its share of ``maxInFlight``) put every message they
    receive in ``_queued``; :meth:`latestOffset` drains up to ``maxBatchSize`` of them
    into ``_batches`` under the next seq; :meth:`commit` FINs every batch up to the
    committed seq on the connection that delivered it.  The ``nsq-spark-touch``
    thread TOUCHes everything received and not FINed (queued or planned) every
    ``msgTimeoutMs``/3, so a slow batch does not let nsqd redeliver it.

    ``_lock`` guards ``_queued`` and ``_batches`` (the reader threads, the touch thread and
    Spark's calls meet there); the offsets (``_seq``, ``_tick``, ``_last_end``) belong to
    Spark's calling thread alone.
    """

    def __init__(self, settings):
        self.settings = settings
        self._seq = 0  # the last seq handed out (or seen in an offset Spark gave us)
        self._tick = 0  # idle ticks so far (see latestOffset)
        self._last_end = None  # the offset latestOffset returned last
        self._init_runtime()

    def _init_runtime(self):
        self._lock = threading.Lock()
        self._queued = []  # received, not yet in a batch
        self._batches = {}  # end seq -> (start seq, [ReceivedMessage])
        self._consumers = None
        self._touch_thread = None
        self._stopping = threading.Event()

    def __getstate__(self):
        state = dict(self.__dict__)
        for name in ("_lock", "_queued", "_batches", "_consumers", "_touch_thread", "_stopping"):
            state.pop(name, None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._init_runtime()

    # -- the consumers (driver side) -----------------------------------------------

    def _receive(self, msg):
        """A Consumer's reader thread hands over each message (in place of its own queue)."""
        with self._lock:
            self._queued.append(msg)

    def _on_error(self, error):
        if getattr(error, "code", None) in _QUIET_ERRORS:
            log.debug("nsq source: %s", error)
        else:
            log.warning("nsq source: %s", error)

    def _ensure_started(self):
        if self._consumers is not None:
            return
        s = self.settings
        n = s["connectionsPerNode"]
        share = max(1, s["maxInFlight"] // n)
        consumers = []
        try:
            for i in range(n):
                consumer = Consumer(
                    s["nsqd"] or None,
                    s["topic"],
                    s["channel"],
                    max_in_flight=share,
                    identify={"msg_timeout": s["msgTimeoutMs"], "user_agent": "nsqd_threaded.spark"},
                    on_error=self._on_error,
                    lookupd_http_addresses=s["lookupd"] or None,
                    lookupd_poll_interval=s["lookupdPollIntervalMs"] / 1000.0,
                    rdy_redistribute_interval=min(5.0, s["lookupdPollIntervalMs"] / 1000.0),
                    on_message=self._receive,
                )
                consumers.append(consumer)
                consumer.start()
        except BaseException:
            for consumer in consumers:
                consumer.close()
            raise
        self._consumers = consumers
        self._touch_thread = threading.Thread(target=self._touch_loop, name="nsq-spark-touch[%s/%s]"
                                              % (s["topic"], s["channel"]), daemon=True)
        self._touch_thread.start()

    def _touch_loop(self):
        """TOUCH every received, not FINed message each msgTimeout/3 (one write per connection)."""
        interval = self.settings["msgTimeoutMs"] / 3000.0
        while not self._stopping.wait(interval):
            with self._lock:
                held = list(self._queued)
                for _, msgs in self._batches.values():
                    held.extend(msgs)
            _send_all(held, b"TOUCH %s\n")

    # -- the Spark API -----------------------------------------------------------------

    def initialOffset(self):
        return {"seq": 0}

    def latestOffset(self, start=None, limit=None):
        """Drain up to ``maxBatchSize`` received messages into a new batch; its end offset.

        Spark 4.2+ passes ``start`` (after a restart: the checkpointed end), older ones
        nothing.  With nothing new but a planned batch still un-FINed, return an idle
        tick (the same seq, the next ``tick``) so that Spark plans one empty batch and
        so calls :meth:`commit` for the last real one.
        """
        if start:
            self._see(start)
        self._ensure_started()
        cap = self.settings["maxBatchSize"]
        max_rows = getattr(limit, "maxRows", None)
        if isinstance(max_rows, int) and max_rows > 0:
            cap = min(cap, max_rows)
        with self._lock:
            queued = self._queued
            if len(queued) <= cap:
                taken, self._queued = queued, []
            else:
                taken, self._queued = queued[:cap], queued[cap:]
            taken = [m for m in taken if not m.connection.closed]  # nsqd took those back
            if taken:
                first = self._seq + 1
                self._seq += len(taken)
                self._batches[self._seq] = (first, taken)
                self._tick = 0
                end = {"seq": self._seq}
            elif self._batches and self._last_end is not None and "tick" not in self._last_end:
                self._tick += 1
                end = {"seq": self._seq, "tick": self._tick}
            else:
                end = self._last_end or {"seq": self._seq}
        self._last_end = end
        return end

    def _see(self, offset):
        """An offset from Spark (a restart's checkpoint): never hand out its seqs again."""
        seq = int(offset.get("seq", 0))
        if seq >= self._seq:
            self._seq = seq
            self._tick = int(offset.get("tick", 0))
            self._last_end = dict(offset)

    def partitions(self, start, end):
        """The messages of (start, end] in up to ``numPartitions`` data-carrying partitions.

        A range this reader does not hold (a batch replayed after a restart) is empty:
        those messages were never FINed, and nsqd delivers them again after their timeout.
        """
        self._see(end)
        lo, hi = int(start.get("seq", 0)), int(end.get("seq", 0))
        with self._lock:
            msgs = []
            for batch_end in sorted(k for k in self._batches if lo < k <= hi):
                msgs.extend(self._batches[batch_end][1])
        if not msgs:
            return [NsqPartition([], [], self.settings["topic"], self.settings["channel"])]
        k = min(self.settings["numPartitions"], len(msgs))
        size = -(-len(msgs) // k)
        s = self.settings
        names = {}  # connection -> its node's "host:port", formatted once per batch
        result = []
        for i in range(0, len(msgs), size):
            chunk = msgs[i:i + size]
            rows = [(m.body, m.id, m.attempts, m.timestamp) for m in chunk]
            nodes = []
            for m in chunk:
                name = names.get(m.connection)
                if name is None:
                    name = names[m.connection] = format_address(m.connection.address)
                nodes.append(name)
            result.append(NsqPartition(rows, nodes, s["topic"], s["channel"]))
        return result

    def read(self, partition):
        """Executor side: the partition's rows as one Arrow record batch."""
        import pyarrow as pa

        rows = partition.rows
        if not rows:
            return iter(())
        n = len(rows)
        bodies, ids, attempts, stamps = zip(*rows)
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array(bodies, pa.binary()),
                pa.array([i.decode("ascii", "replace") for i in ids], pa.string()),
                pa.array(attempts, pa.int32()),
                pa.array([t // 1000 for t in stamps], pa.timestamp("us", tz="UTC")),
                pa.array(partition.node_names, pa.string()),
                pa.array([partition.topic] * n, pa.string()),
                pa.array([partition.channel] * n, pa.string()),
            ],
            schema=_arrow_schema(),
        )
        return iter((batch,))

    def commit(self, end):
        """Spark committed every batch up to ``end``: FIN their messages on the delivering connections."""
        hi = int(end.get("seq", 0))
        with self._lock:
            done = [k for k in self._batches if k <= hi]
            msgs = []
            for k in sorted(done):
                msgs.extend(self._batches.pop(k)[1])
        _send_all(msgs, b"FIN %s\n")

    def stop(self):
        """The query ended: stop consuming.  REQ what was received and never planned."""
        self._stopping.set()
        with self._lock:
            queued, self._queued = self._queued, []
        _send_all(queued, b"REQ %s 0\n")
        for consumer in self._consumers or ():
            consumer.close()
        if self._touch_thread is not None:
            self._touch_thread.join()
        self._consumers = None


def _arrow_schema():
    import pyarrow as pa

    return pa.schema([
        pa.field("body", pa.binary(), nullable=False),
        pa.field("message_id", pa.string(), nullable=False),
        pa.field("attempts", pa.int32(), nullable=False),
        pa.field("timestamp", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("nsqd", pa.string(), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("channel", pa.string(), nullable=False),
    ])


def _send_all(msgs, command):
    """Write ``command % id`` for each message, one write per connection; closed ones skipped."""
    by_conn = {}
    for m in msgs:
        by_conn.setdefault(m.connection, []).append(command % m.id)
    for conn, lines in by_conn.items():
        if conn.closed:
            continue
        try:
            conn.send(b"".join(lines))
        except ConnectionClosed:
            pass  # nsqd requeues what that connection held
