"""The sink: every task publishes its rows with pipelined MPUBs and waits for every OK.

NSQ has no transactions, so ``commit()`` only reports: a retried task publishes
again (at-least-once).  Chunks stay well below nsqd's default ``--max-body-size``
(5 MiB); a single message above the broker's ``--max-msg-size`` fails the task with
nsqd's own error.
"""

import json

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

from ..client import Producer

CHUNK_BYTES = 1 << 20  # bytes of bodies per MPUB (under --max-body-size with room to spare)
CHUNK_MESSAGES = 10000
WINDOW = 8  # MPUBs in flight per task before waiting for the oldest OK


class NsqCommitMessage(WriterCommitMessage):
    """What one task published: ``count`` messages (``per_topic`` by topic)."""

    def __init__(self, count, per_topic):
        self.count = count
        self.per_topic = per_topic


def _json_default(value):
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def _encode(value):
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if value is None:
        return b""
    return str(value).encode("utf-8")


class _Publisher:
    """Per-task state: one Producer (round robin over the nodes), chunks per topic, a window of MPUBs.

    Used as ``with _Publisher(...) as p: p.add(...)`` then ``p.finish()``: a failure
    inside the ``with`` closes the producer; :meth:`finish` closes it in any case.
    ``topic``, ``topic_column`` and ``body_column`` say where a row's topic and body are.
    """

    def __init__(self, settings, task_id):
        self.settings = settings
        self.topic = settings["topic"]
        self.topic_column = settings["topicColumn"]
        self.body_column = settings["bodyColumn"]
        self.producer = Producer(
            settings["nsqd"] or None,
            lookupd_http_addresses=settings["lookupd"] or None,
        )
        self.chunks = {}  # topic -> [bodies, bytes]
        self.futures = []
        self.per_topic = {}

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.producer.close()

    def add(self, topic, body):
        chunk = self.chunks.get(topic)
        if chunk is None:
            chunk = self.chunks[topic] = [[], 0]
        chunk[0].append(body)
        chunk[1] += len(body) + 4
        if chunk[1] >= CHUNK_BYTES or len(chunk[0]) >= CHUNK_MESSAGES:
            self._send(topic, chunk[0])
            del self.chunks[topic]

    def _send(self, topic, bodies):
        defer = self.settings["deferMs"]
        if defer:
            for body in bodies:
                self.futures.append(self.producer.dpub_async(topic, defer, body))
        else:
            self.futures.append(self.producer.mpub_async(topic, bodies))
        self.per_topic[topic] = self.per_topic.get(topic, 0) + len(bodies)
        while len(self.futures) > WINDOW * (len(bodies) if defer else 1):
            self.futures.pop(0).result(self.producer.timeout * 3)

    def finish(self):
        try:
            for topic, (bodies, _) in list(self.chunks.items()):
                self._send(topic, bodies)
            self.chunks = {}
            for future in self.futures:
                future.result(self.producer.timeout * 3)
        finally:
            self.producer.close()
        return NsqCommitMessage(sum(self.per_topic.values()), self.per_topic)


def _publish_rows(settings, rows):
    """Rows (pyspark Rows) to messages."""
    with _Publisher(settings, None) as publisher:
        body_column, topic_column = publisher.body_column, publisher.topic_column
        for row in rows:
            if body_column is not None:
                body = _encode(row[body_column])
            else:
                body = json.dumps(row.asDict(recursive=True), default=_json_default).encode("utf-8")
            publisher.add(row[topic_column] if topic_column else publisher.topic, body)
    return publisher.finish()


def _publish_batches(settings, batches):
    """Arrow record batches to messages (the fast path when Spark offers it)."""
    with _Publisher(settings, None) as publisher:
        body_column, topic_column = publisher.body_column, publisher.topic_column
        add = publisher.add
        for batch in batches:
            if body_column is not None:
                bodies = [_encode(v) for v in batch.column(body_column).to_pylist()]
            else:
                bodies = [json.dumps(d, default=_json_default).encode("utf-8") for d in batch.to_pylist()]
            if topic_column:
                for t, body in zip(batch.column(topic_column).to_pylist(), bodies):
                    add(t, body)
            else:
                for body in bodies:
                    add(publisher.topic, body)
    return publisher.finish()


class NsqWriter(DataSourceWriter):
    """``df.write.format("nsq").mode("append")``: batch sink."""

    def __init__(self, settings):
        self.settings = settings

    def write(self, iterator):
        return _publish_rows(self.settings, iterator)

    def commit(self, messages):
        pass  # nothing to make visible: every message was published with its OK

    def abort(self, messages):
        pass  # published messages cannot be taken back


class NsqStreamWriter(DataSourceStreamWriter):
    """``df.writeStream.format("nsq")``: streaming sink (append only)."""

    def __init__(self, settings):
        self.settings = settings

    def write(self, iterator):
        return _publish_rows(self.settings, iterator)

    def commit(self, messages, batchId):
        pass

    def abort(self, messages, batchId):
        pass


try:
    from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter
except ImportError:  # pyspark < 4.1: the row writers above
    NsqArrowWriter = NsqStreamArrowWriter = None
else:

    class NsqArrowWriter(DataSourceArrowWriter, NsqWriter):
        """The batch sink fed Arrow record batches (no Row per message)."""

        def write(self, iterator):
            return _publish_batches(self.settings, iterator)

    class NsqStreamArrowWriter(DataSourceStreamArrowWriter, NsqStreamWriter):
        """The streaming sink fed Arrow record batches."""

        def write(self, iterator):
            return _publish_batches(self.settings, iterator)
