"""``NsqDataSource``: the ``nsq`` format for Spark's Python Data Source API (pyspark >= 4.0)."""

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import BinaryType, IntegerType, StringType, StructField, StructType, TimestampType

from . import options as opts
from .sink import NsqArrowWriter, NsqStreamArrowWriter, NsqStreamWriter, NsqWriter
from .source import NsqStreamReader

SCHEMA = StructType([
    StructField("body", BinaryType(), False),
    StructField("message_id", StringType(), False),
    StructField("attempts", IntegerType(), False),
    StructField("timestamp", TimestampType(), False),
    StructField("nsqd", StringType(), False),
    StructField("topic", StringType(), False),
    StructField("channel", StringType(), False),
])


class NsqDataSource(DataSource):
    """Read a topic/channel as a stream; write rows as messages (batch or stream, append only).

    ``spark.dataSource.register(NsqDataSource)`` once per session, then ``format("nsq")``.
    Options are checked (and the nodes probed) when Spark asks for the schema at
    ``load()`` and for a writer at ``save()``/``start()``.
    """

    @classmethod
    def name(cls):
        return "nsq"

    def schema(self):
        settings = opts.source_options(self.options)
        opts.probe(settings)
        return SCHEMA

    def reader(self, schema):
        raise opts.NsqOptionError("nsq: the source is streaming only: use spark.readStream.format(\"nsq\")")

    def streamReader(self, schema):
        return NsqStreamReader(opts.source_options(self.options))

    def _sink_settings(self, schema, overwrite):
        if overwrite:
            raise opts.NsqOptionError("nsq: the sink only appends: use mode(\"append\")")
        settings = opts.sink_options(self.options)
        opts.check_columns(settings, schema.fieldNames())
        opts.probe(settings)
        return settings

    def writer(self, schema, overwrite):
        settings = self._sink_settings(schema, overwrite)
        return (NsqArrowWriter or NsqWriter)(settings)

    def streamWriter(self, schema, overwrite):
        settings = self._sink_settings(schema, overwrite)
        return (NsqStreamArrowWriter or NsqStreamWriter)(settings)
