"""The streaming source: consume on the driver, FIN only after Spark's durable commit.

NSQ has no offsets and no partitions: a channel is a competing-consumer queue and a
message is gone once FINed.  So the offsets are batch boundaries this reader invents
(``{"seq": n}``, a counter over drained messages), the messages travel to executors
inside the InputPartitions, and FIN waits for :meth:`NsqStreamReader.commit`, which
Spark calls once the batch's sink finished and its commit log entry is written.

Spark keeps ONE reader object for the whole query in one driver-side Python process;
another copy is pickled to executors, where only :meth:`read` runs.  So nothing
connects in ``__init__`` and pickling drops sockets, threads and locks.

The driver's work per message is kept to the least, since every message passes
through that one Python process: each connection's reader thread ``recv_into``s a
large buffer and keeps the message frames of one read as they came, in one ``bytes``
object with an array of where each frame starts (a *run*); batches are lists of runs;
a partition carries its runs' ``bytes`` objects as they are (a few hundred per
partition, however many messages: Spark pickles partitions with cloudpickle, whose
cost grows with the number of objects); a committed batch's FINs (a TOUCH round's, the
REQs at stop) are one write per connection, which nsqd applies as one run.  The
frames are decoded into columns on the executors, in :meth:`read`.
"""

import array
import collections
import datetime
import json
import logging
import socket
import struct
import threading
import time
import urllib.parse

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from ..client.connection import NSQError, format_address
from ..wire import protocol_v2
from ..client.lookupd import lookup_addresses

log = logging.getLogger("nsqd_threaded.spark")

# Answers to a FIN/TOUCH of a message nsqd no longer holds for that connection (it
# timed out, or the connection was replaced): expected now and then, not failures.
_QUIET_ERRORS = frozenset({"E_FIN_FAILED", "E_TOUCH_FAILED", "E_REQ_FAILED"})

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)

# nsqd's --max-rdy-count unless it says otherwise (Go's default and ours).
DEFAULT_MAX_RDY_COUNT = 2500
_HEARTBEAT_MS = 30000  # asked for in IDENTIFY; two missed ones mean the connection is dead
_CONNECT_TIMEOUT = 5.0
_RETRY_SECONDS = 1.0  # before reconnecting a connection that ended
_MAX_RETRY_SECONDS = 15.0  # the longest wait between attempts while a node stays down
# Asked for in IDENTIFY: nsqd's pump then writes its messages to a connection in chunks of
# 64 KiB rather than its default 16 KiB: fewer writes on nsqd's side and fewer, larger reads
# here.  64 KiB is nsqd's default --max-output-buffer-size (Go's and ours); a node whose
# maximum is lower refuses it, and the connection is made again without it.
OUTPUT_BUFFER_SIZE = 65536
_READ_SIZE = 1 << 20  # each connection's receive buffer (grows for a larger frame)
_FRAME_HEADER = struct.Struct(">ii")
# A message frame: size, frame type, timestamp (ns), attempts; then the 16-byte ID and the body.
_MESSAGE_FRAME = struct.Struct(">iiqH")
_ID_START, _BODY_START = 18, 34  # offsets in a message frame
_INT32_MAX = (1 << 31) - 1  # "to the end" for pyarrow's binary_slice


class NsqPartition(InputPartition):
    """A data-carrying partition: ``frames`` is a list of ``bytes``, each nsqd's message
    frames back to back (as they came off the wire, headers included; one per read of a
    connection), ``nodes`` is ``[(node, count)]``: the first ``count`` frames came from the
    nsqd ``node`` (``host:port``), the next ones from the next node.  A few large objects
    rather than one per message: Spark pickles partitions with cloudpickle, which costs a
    Python call per object, and joining them would cost the driver a copy."""

    def __init__(self, frames, nodes, topic, channel):
        super().__init__(None)
        self.frames = frames
        self.nodes = nodes
        self.topic = topic
        self.channel = channel


class _Link:
    """One subscribed connection to one nsqd: the messages it delivered are FINed,
    TOUCHed or REQueued on it, nowhere else.

    ``_write_lock`` guards writes to the socket (the reader thread's NOPs, Spark's
    FINs, the touch thread's TOUCHes).
    """

    def __init__(self, sock, node):
        self.sock = sock
        self.node = node  # "host:port"
        self.closed = False
        self._write_lock = threading.Lock()

    def send(self, data):
        """Write ``data``; False if the connection ended (nsqd requeues what it held)."""
        with self._write_lock:
            if self.closed:
                return False
            try:
                self.sock.sendall(data)
                return True
            except OSError:
                self.closed = True
        self.shutdown()
        return False

    def send_each(self, runs, verb, suffix=b""):
        """``verb ID suffix`` for each message of ``runs`` (``(frames, starts)`` pairs, see
        :func:`_take`), in one write: nsqd then handles them as one run of commands (one
        lock acquisition and one wake-up of its pump for a run of FINs), rather than one
        per read that delivered them."""
        ids = [frames[i + _ID_START:i + _BODY_START] for frames, starts in runs for i in starts[:-1]]
        if not ids:
            return True
        return self.send(verb + (suffix + b"\n" + verb).join(ids) + suffix + b"\n")

    def shutdown(self):
        """End the connection (any thread): its reader wakes up and closes the socket."""
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class NsqStreamReader(DataSourceStreamReader):
    """One query's consumer of ``topic``/``channel``.

    Driver side, lazily on first use: ``connectionsPerNode`` connections to each nsqd
    (by default as many as it takes for nsqd's ``max_rdy_count`` per connection to add
    up to ``maxInFlight``), each with its reader thread, which appends the message frames
    of each read to ``_queued`` as one run ``(link, frames, starts, touched)`` (see :func:`_take`);
    :meth:`latestOffset` moves
    up to ``maxBatchSize`` of them into ``_batches`` under the next seq; :meth:`commit`
    hands every batch up to the committed seq to the ``nsq-spark-fin`` thread, which FINs
    them on the connections that delivered them.
    The ``nsq-spark-touch`` thread TOUCHes what was received and not FINed (queued or
    planned) every ``msgTimeoutMs``/3, so a slow batch does not let nsqd redeliver it.
    With lookupd, the ``nsq-spark-lookup`` thread asks it for the topic's nodes every
    ``lookupdPollIntervalMs`` and connects to new ones.

    ``_lock`` guards ``_queued``, ``_queued_count``, ``_batches``, ``_fins``, ``_links`` and
    ``_nodes`` (the reader threads, the touch and lookup threads and Spark's calls meet
    there); the offsets (``_seq``, ``_tick``, ``_last_end``) belong to Spark's calling
    thread alone.
    """

    def __init__(self, settings):
        self.settings = settings
        self._seq = 0  # the last seq handed out (or seen in an offset Spark gave us)
        self._tick = 0  # idle ticks so far (see latestOffset)
        self._last_end = None  # the offset latestOffset returned last
        self._init_runtime()

    def _init_runtime(self):
        self._lock = threading.Lock()
        self._queued = collections.deque()  # runs received, not yet in a batch
        self._queued_count = 0
        self._batches = {}  # end seq -> (start seq, [(link, frames, starts, touched)])
        self._links = set()  # the live connections
        self._nodes = {}  # address -> connections per node started for it
        self._threads = []  # every thread this reader started (joined by stop)
        self._started = False
        self._per_node = None  # connections per node, once known
        self._stopping = threading.Event()
        self._fins = []  # runs Spark committed, for the fin thread to FIN
        self._fin_ready = threading.Condition(self._lock)  # commit() -> the fin thread: FINs queued
        self._fin_thread = None

    def __getstate__(self):
        state = dict(self.__dict__)
        for name in ("_lock", "_queued", "_queued_count", "_batches", "_links", "_nodes", "_threads", "_started",
                     "_per_node", "_stopping", "_fins", "_fin_ready", "_fin_thread"):
            state.pop(name, None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._init_runtime()

    # -- the connections (driver side) ---------------------------------------------

    def _ensure_started(self):
        if self._started:
            return
        self._started = True
        s = self.settings
        addresses = list(s["nsqd"])
        if s["lookupd"]:
            addresses = self._lookup()
        self._per_node = s["connectionsPerNode"] or _connections_needed(s["maxInFlight"], _max_rdy_count(addresses))
        for address in addresses:
            self._add_node(address, persistent=not s["lookupd"])
        self._start_thread(self._touch_loop, "nsq-spark-touch")
        self._fin_thread = self._start_thread(self._fin_loop, "nsq-spark-fin")
        if s["lookupd"]:
            self._start_thread(self._lookup_loop, "nsq-spark-lookup")

    def _start_thread(self, target, name, *args):
        s = self.settings
        thread = threading.Thread(target=target, args=args, daemon=True,
                                  name="%s[%s/%s]" % (name, s["topic"], s["channel"]))
        self._threads.append(thread)
        thread.start()
        return thread

    def _lookup(self):
        s = self.settings
        path = "/lookup?topic=" + urllib.parse.quote(s["topic"], safe="")
        found, errors = lookup_addresses(s["lookupd"], path, _CONNECT_TIMEOUT)
        for error in errors:
            log.warning("nsq source: lookupd: %s", error)
        return found

    def _lookup_loop(self):
        """Connect to nodes lookupd starts listing; a node that left is dropped by its readers."""
        while not self._stopping.wait(self.settings["lookupdPollIntervalMs"] / 1000.0):
            for address in self._lookup():
                self._add_node(address, persistent=False)

    def _add_node(self, address, persistent):
        with self._lock:
            if address in self._nodes or self._stopping.is_set():
                return
            self._nodes[address] = self._per_node
        for i in range(self._per_node):
            self._start_thread(self._feed, "nsq-spark-feed %s #%d" % (format_address(address), i), address, persistent)

    def _rdy(self):
        """Each connection's RDY: its share of maxInFlight over every node's connections."""
        with self._lock:
            connections = sum(self._nodes.values()) or 1
        return max(1, self.settings["maxInFlight"] // connections)

    def _feed(self, address, persistent):
        """One connection slot: subscribe, read until it ends, reconnect (nodes given as
        ``nsqd``) or leave it to the next lookup (nodes lookupd found)."""
        delay = _RETRY_SECONDS
        try:
            while not self._stopping.is_set():
                try:
                    link = self._subscribe(address)
                except (OSError, ValueError, NSQError) as e:
                    wait = delay
                    delay = min(delay * 2, _MAX_RETRY_SECONDS)  # a node that is down: back off
                    if persistent:
                        log.warning("nsq source: %s: %s (retrying in %gs)", format_address(address), e, wait)
                    else:
                        log.warning("nsq source: %s: %s", format_address(address), e)
                else:
                    wait = delay = _RETRY_SECONDS
                    try:
                        self._read(link)
                    except (OSError, ValueError) as e:
                        if not self._stopping.is_set():
                            log.info("nsq source: %s: connection lost (%s); reconnecting", format_address(address), e)
                if not persistent or self._stopping.wait(wait):
                    break
        finally:
            if not persistent:
                with self._lock:
                    remaining = self._nodes.get(address, 0) - 1
                    if remaining > 0:
                        self._nodes[address] = remaining
                    else:
                        self._nodes.pop(address, None)

    def _subscribe(self, address, output_buffer_size=None):
        """Magic, IDENTIFY, SUB, RDY (this connection's share, at most nsqd's max_rdy_count): a live link.

        IDENTIFY asks for ``output_buffer_size`` (:data:`OUTPUT_BUFFER_SIZE` unless given; 0: none);
        a node that refuses it (its ``--max-output-buffer-size`` is lower) is connected to again
        with nsqd's default."""
        s = self.settings
        if output_buffer_size is None:
            output_buffer_size = OUTPUT_BUFFER_SIZE
        sock = socket.create_connection(address, _CONNECT_TIMEOUT)
        link = _Link(sock, format_address(address))
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            identify = {"feature_negotiation": True, "msg_timeout": s["msgTimeoutMs"],
                        "heartbeat_interval": _HEARTBEAT_MS, "user_agent": "nsqd_threaded.spark"}
            if output_buffer_size:
                identify["output_buffer_size"] = output_buffer_size
            identify = json.dumps(identify).encode()
            sock.sendall(protocol_v2.MAGIC_V2 + b"IDENTIFY\n" + protocol_v2.encode_size(len(identify)) + identify)
            pending = bytearray()
            try:
                answer = _handshake_answer(sock, pending, link)
            except NSQError as e:
                if not (output_buffer_size and e.code == "E_BAD_BODY" and "output buffer size" in e.description):
                    raise
                link.shutdown()
                sock.close()
                return self._subscribe(address, output_buffer_size=0)
            settings = json.loads(answer.decode("utf-8")) if answer != b"OK" else {}
            if settings.get("auth_required"):
                raise ValueError("nsqd requires AUTH, which the nsq source does not do")
            sock.sendall(b"SUB %s %s\n" % (s["topic"].encode(), s["channel"].encode()))
            answer = _handshake_answer(sock, pending, link)
            if answer != b"OK":
                raise ValueError("unexpected answer to SUB: %r" % answer[:64])
            max_rdy = settings.get("max_rdy_count")
            max_rdy = max_rdy if isinstance(max_rdy, int) and max_rdy > 0 else DEFAULT_MAX_RDY_COUNT
            with self._lock:
                if self._stopping.is_set():
                    raise OSError("the query is stopping")
                self._links.add(link)
            sock.sendall(b"RDY %d\n" % min(self._rdy(), max_rdy))
            sock.settimeout(2 * _HEARTBEAT_MS / 1000.0 + 5)
        except BaseException:
            with self._lock:
                self._links.discard(link)
            link.shutdown()
            sock.close()
            raise
        return link

    def _read(self, link):
        """The reader loop: every read's message frames go to ``_queued`` as one run (two
        when a control frame, such as a heartbeat, came between them)."""
        sock = link.sock
        buf = bytearray(_READ_SIZE)
        view = memoryview(buf)
        start = end = 0
        unpack = _FRAME_HEADER.unpack_from
        try:
            while True:
                if end == len(buf):
                    if start:  # move the partial frame to the front
                        buf[:end - start] = buf[start:end]
                        end -= start
                        start = 0
                    else:  # one frame larger than the buffer
                        view.release()
                        buf.extend(bytes(len(buf)))
                        view = memoryview(buf)
                n = sock.recv_into(view[end:])
                if not n:
                    raise OSError("nsqd closed the connection")
                end += n
                runs = []
                pos = start
                first = -1  # where the current run of message frames began
                while end - pos >= 8:
                    size, frame_type = unpack(buf, pos)
                    stop = pos + 4 + size
                    if size < 4:
                        raise ValueError("malformed frame")
                    if stop > end:
                        break
                    if frame_type == protocol_v2.FRAME_TYPE_MESSAGE:
                        if size < _BODY_START - 4:
                            raise ValueError("malformed message frame")
                        if first < 0:
                            first = pos
                            starts = array.array("i")
                        starts.append(pos - first)
                    else:
                        if first >= 0:
                            starts.append(pos - first)
                            runs.append((link, bytes(view[first:pos]), starts, [time.monotonic()]))
                            first = -1
                        self._control_frame(link, frame_type, bytes(view[pos + 8:stop]))
                    pos = stop
                if first >= 0:
                    starts.append(pos - first)
                    runs.append((link, bytes(view[first:pos]), starts, [time.monotonic()]))
                start = pos
                if start == end:
                    start = end = 0
                if runs:
                    with self._lock:
                        for run in runs:
                            self._queued.append(run)
                            self._queued_count += len(run[2]) - 1
        finally:
            with self._lock:
                self._links.discard(link)
            link.shutdown()
            link.sock.close()

    def _control_frame(self, link, frame_type, data):
        if frame_type == protocol_v2.FRAME_TYPE_RESPONSE:
            if data == b"_heartbeat_":
                link.send(b"NOP\n")
            elif data == b"CLOSE_WAIT":
                raise OSError("nsqd closed the connection (CLOSE_WAIT)")
        elif frame_type == protocol_v2.FRAME_TYPE_ERROR:
            error = NSQError(data, link.node)
            if error.code in _QUIET_ERRORS:
                log.debug("nsq source: %s: %s", link.node, error)
            else:
                log.warning("nsq source: %s: %s", link.node, error)
            if error.fatal:
                raise OSError("nsqd sent %s" % error.code)
        else:
            raise ValueError("unknown frame type %d" % frame_type)

    def _touch_loop(self):
        """TOUCH what was received and not FINed each msgTimeout/3 (one write per connection).

        Only runs received or last TOUCHed at least half an interval ago: in a steady
        flow most messages are FINed within a second or two, long before their timeout,
        and TOUCHing them too would add a command per held message every interval.  A
        run is TOUCHed at the first tick when it is that old, at most 1.5 intervals (half
        its timeout) after it came, and then every tick.  The two parts of a split run
        share their stamp, so both are judged before any is stamped again.
        """
        interval = self.settings["msgTimeoutMs"] / 3000.0
        while not self._stopping.wait(interval):
            with self._lock:
                held = list(self._queued)
                for _, runs in self._batches.values():
                    held.extend(runs)
            now = time.monotonic()
            due = [run for run in held if now - run[3][0] >= interval / 2]
            _send_by_link(due, b"TOUCH ")
            for run in due:
                run[3][0] = now

    # -- the Spark API -----------------------------------------------------------------

    def initialOffset(self):
        return {"seq": 0}

    def latestOffset(self, start=None, limit=None):
        """Move up to ``maxBatchSize`` received messages into a new batch; its end offset.

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
            taken, count = _take(self._queued, cap)
            self._queued_count -= count
            if count:
                first = self._seq + 1
                self._seq += count
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
        s = self.settings
        with self._lock:
            runs = []
            for batch_end in sorted(k for k in self._batches if lo < k <= hi):
                runs.extend(self._batches[batch_end][1])
        total = sum(len(run[2]) - 1 for run in runs)
        if not total:
            return [NsqPartition([], [], s["topic"], s["channel"])]
        k = min(s["numPartitions"], total)
        size = -(-total // k)
        result = []
        pending = collections.deque(runs)
        while pending:
            part, _ = _take(pending, size, drop_closed=False)
            pieces, nodes = [], []
            for link, frames, starts, _ in part:
                first, last = starts[0], starts[-1]  # (a split run's part: a slice of its bytes)
                pieces.append(frames if first == 0 and last == len(frames) else frames[first:last])
                if nodes and nodes[-1][0] == link.node:
                    nodes[-1][1] += len(starts) - 1
                else:
                    nodes.append([link.node, len(starts) - 1])
            result.append(NsqPartition(pieces, [tuple(n) for n in nodes], s["topic"], s["channel"]))
        return result

    def read(self, partition):
        """Executor side: the partition's frames decoded into one Arrow record batch.

        The frames are joined into one buffer (here, not on the driver, which plans
        every partition); one pass in Python over their headers finds where each frame starts and
        reads its timestamp and attempts; Arrow then sees the frames as one binary
        column over the partition's buffer (no copy) and cuts the IDs and bodies out.
        """
        import pyarrow as pa
        import pyarrow.compute as pc

        if not partition.frames:
            return iter(())
        frames = b"".join(partition.frames)
        offsets = array.array("i")
        stamps, attempts = [], []
        pos, end = 0, len(frames)
        unpack = _MESSAGE_FRAME.unpack_from
        while pos < end:
            size, _, stamp, attempt = unpack(frames, pos)
            offsets.append(pos)
            stamps.append(stamp)
            attempts.append(attempt)
            pos += 4 + size
        offsets.append(pos)
        n = len(stamps)
        if hasattr(pc, "binary_slice"):
            whole = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(frames)])
            bodies = pc.binary_slice(whole, _BODY_START, _INT32_MAX)
            ids = pc.binary_slice(whole, _ID_START, _BODY_START)
        else:  # pyarrow before 13
            bodies = pa.array([frames[offsets[i] + _BODY_START:offsets[i + 1]] for i in range(n)], pa.binary())
            ids = pa.array([frames[offsets[i] + _ID_START:offsets[i] + _BODY_START] for i in range(n)], pa.binary())
        names, which = [], array.array("i")
        for node, count in partition.nodes:
            which.extend(array.array("i", [len(names)]) * count)
            names.append(node)
        batch = pa.RecordBatch.from_arrays(
            [
                bodies,
                ids.cast(pa.string()),
                pa.array(attempts, pa.int32()),
                pc.divide(pa.array(stamps, pa.int64()), 1000).cast(pa.timestamp("us", tz="UTC")),
                pc.take(pa.array(names, pa.string()), pa.array(which, pa.int32())),
                pa.repeat(pa.scalar(partition.topic, pa.string()), n),
                pa.repeat(pa.scalar(partition.channel, pa.string()), n),
            ],
            schema=_arrow_schema(),
        )
        return iter((batch,))

    def commit(self, end):
        """Spark committed every batch up to ``end``: FIN their messages on the delivering connections.

        The FINs are written by the ``nsq-spark-fin`` thread, so that Spark's next batch does
        not wait for tens of thousands of them: this runs on Spark's trigger thread, between a
        batch's commit log entry and the next batch's planning.
        """
        hi = int(end.get("seq", 0))
        with self._lock:
            for k in sorted(k for k in self._batches if k <= hi):
                self._fins.extend(self._batches.pop(k)[1])
            self._fin_ready.notify()

    def _fin_loop(self):
        """FIN what :meth:`commit` queued; once stopping, FIN what is left and end."""
        while True:
            with self._lock:
                while not self._fins and not self._stopping.is_set():
                    self._fin_ready.wait()
                runs, self._fins = self._fins, []
            if not runs:
                return
            _send_by_link(runs, b"FIN ")

    def stop(self):
        """The query ended: stop consuming.  REQ what was received and never planned."""
        with self._lock:
            self._stopping.set()
            self._fin_ready.notify()
        if self._fin_thread is not None:
            self._fin_thread.join()  # every committed message FINed before the connections close
        with self._lock:
            queued, self._queued = self._queued, collections.deque()
            self._queued_count = 0
            links = list(self._links)
        _send_by_link(queued, b"REQ ", b" 0")
        for link in links:
            link.shutdown()
        for thread in self._threads:
            thread.join()
        self._threads = []
        self._fin_thread = None
        self._started = False


def _take(runs, cap, drop_closed=True):
    """Pop up to ``cap`` messages off the front of a deque of runs, splitting the last
    run if need be; with ``drop_closed``, runs of connections that ended are dropped
    (nsqd took those messages back).  Returns ``(taken runs, count)``.

    A run is ``(link, frames, starts, touched)``: ``frames`` a ``bytes`` of message frames back to
    back, ``starts`` an ``array('i')`` of n+1 positions in it, message i's frame being
    ``frames[starts[i]:starts[i+1]]``; ``touched`` a one-item list, the ``time.monotonic()`` when the
    run came or was last TOUCHed.  The two parts of a split run share ``frames`` and ``touched``.
    """
    taken = []
    count = 0
    while runs and count < cap:
        link, frames, starts, touched = runs[0]
        if drop_closed and link.closed:
            runs.popleft()
            continue
        room = cap - count
        n = len(starts) - 1
        if n <= room:
            taken.append(runs.popleft())
            count += n
        else:
            taken.append((link, frames, starts[:room + 1], touched))
            runs[0] = (link, frames, starts[room:], touched)
            count += room
    return taken, count


def _send_by_link(runs, verb, suffix=b""):
    """``verb ID suffix`` for every message of ``runs`` (see :func:`_take`): one write per connection."""
    by_link = {}
    for link, frames, starts, _ in runs:
        by_link.setdefault(link, []).append((frames, starts))
    for link, pieces in by_link.items():
        link.send_each(pieces, verb, suffix)


def _handshake_answer(sock, pending, link):
    """The next response during the handshake (heartbeats answered); an error frame raises."""
    while True:
        while len(pending) < 8 or len(pending) < 4 + _FRAME_HEADER.unpack_from(pending)[0]:
            chunk = sock.recv(65536)
            if not chunk:
                raise OSError("nsqd closed the connection during the handshake")
            pending += chunk
        size, frame_type = _FRAME_HEADER.unpack_from(pending)
        data = bytes(pending[8:4 + size])
        del pending[:4 + size]
        if frame_type == protocol_v2.FRAME_TYPE_ERROR:
            raise NSQError(data, link.node)
        if frame_type == protocol_v2.FRAME_TYPE_RESPONSE and data == b"_heartbeat_":
            sock.sendall(b"NOP\n")
            continue
        return data


def _max_rdy_count(addresses):
    """The ``max_rdy_count`` the first reachable nsqd announces in its IDENTIFY answer;
    nsqd's default when none answers."""
    for address in addresses:
        try:
            with socket.create_connection(address, _CONNECT_TIMEOUT) as sock:
                body = json.dumps({"feature_negotiation": True, "user_agent": "nsqd_threaded.spark"}).encode()
                sock.sendall(protocol_v2.MAGIC_V2 + b"IDENTIFY\n" + protocol_v2.encode_size(len(body)) + body)
                answer = _handshake_answer(sock, bytearray(), _Link(sock, format_address(address)))
            value = json.loads(answer.decode("utf-8")).get("max_rdy_count") if answer != b"OK" else None
        except (OSError, ValueError, NSQError):
            continue
        if isinstance(value, int) and value > 0:
            return value
    return DEFAULT_MAX_RDY_COUNT


def _connections_needed(max_in_flight, max_rdy_count):
    """Connections per node so that together they may hold ``max_in_flight`` messages
    (each connection's RDY is capped at nsqd's ``max_rdy_count``)."""
    return max(1, -(-max_in_flight // max_rdy_count))


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
