"""NSQ for Apache Spark: the ``nsq`` data source (streaming source, batch and streaming sink).

Needs the ``spark`` extra (pyspark >= 4.0 and pyarrow)::

    from nsqd_threaded.spark import NsqDataSource
    spark.dataSource.register(NsqDataSource)

Importing :mod:`nsqd_threaded` never imports this package (nor pyspark).
"""

try:
    import pyspark.sql.datasource  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError("nsqd_threaded.spark needs the spark extra: pip install 'nsqd-threaded[spark]' (%s)" % e) from e

from .datasource import SCHEMA, NsqDataSource
from .options import NsqOptionError

__all__ = ["NsqDataSource", "NsqOptionError", "SCHEMA"]
