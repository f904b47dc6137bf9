"""The ``nsq`` data source's options: parsed and checked before Spark runs anything.

Pure functions (no pyspark, no sockets except :func:`probe`), so that a bad option
fails at ``load()``/``save()`` with one line naming it, not on a worker.
Spark hands options over case-insensitively and lower-cased (``maxBatchSize`` ->
``maxbatchsize``): every lookup here is by the lower-cased name.
"""

import socket

from ..client.connection import format_address, parse_address
from ..client.lookupd import lookup_addresses, parse_lookupd_address
from ..wire.protocol_v2 import is_valid_name


class NsqOptionError(ValueError):
    """A bad or missing option of the ``nsq`` data source: the message names the option."""


# (user-facing name, default, minimum) of the integer options.  A default of None is
# worked out from the others (maxBatchSize) or from nsqd (connectionsPerNode): see
# source_options and NsqStreamReader.
SOURCE_INTEGERS = (
    ("maxBatchSize", None, 1),
    ("maxInFlight", 200000, 1),
    ("connectionsPerNode", None, 1),
    ("msgTimeoutMs", 60000, 1000),
    ("numPartitions", 2, 1),
    ("lookupdPollIntervalMs", 15000, 100),
)
SINK_INTEGERS = (("deferMs", 0, 0),)


def _valid(name):
    try:
        return is_valid_name(name.encode("utf-8"))
    except (AttributeError, UnicodeError):
        return False


def _get(options, name):
    value = options.get(name.lower())
    if value is None:
        value = options.get(name)
    return value


def _integer(options, name, default, minimum):
    raw = _get(options, name)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise NsqOptionError("nsq: option %s=%r is not an integer" % (name, raw)) from None
    if value < minimum:
        raise NsqOptionError("nsq: option %s=%d must be >= %d" % (name, value, minimum))
    return value


def _addresses(options, name, parse):
    raw = _get(options, name)
    if raw is None or not str(raw).strip():
        return []
    result = []
    for part in str(raw).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            host, port = parse(part)
        except (ValueError, TypeError):
            raise NsqOptionError("nsq: option %s has a bad address %r (want host:port)" % (name, part)) from None
        if not 0 < port < 65536:
            raise NsqOptionError("nsq: option %s has a bad address %r (want host:port)" % (name, part))
        result.append((host, port))
    return result


def _nodes(options):
    nsqd = _addresses(options, "nsqd", parse_address)
    lookupd = _addresses(options, "lookupd", parse_lookupd_address)
    if not nsqd and not lookupd:
        raise NsqOptionError("nsq: set option nsqd (host:port,...) or lookupd (host:httpport,...)")
    if nsqd and lookupd:
        raise NsqOptionError("nsq: set option nsqd or lookupd, not both")
    return nsqd, lookupd


def _name_option(options, name, valid, required=True):
    """The topic or channel option ``name``, checked to be a valid NSQ name (None if absent and not required)."""
    value = _get(options, name)
    if value is None or value == "":
        if required:
            raise NsqOptionError("nsq: option %s is required" % name)
        return None
    if not valid(value):
        raise NsqOptionError("nsq: option %s=%r is not a valid NSQ %s name" % (name, value, name))
    return value


def source_options(options):
    """The streaming source's settings as a dict (user-facing names); NsqOptionError if bad."""
    nsqd, lookupd = _nodes(options)
    result = {"nsqd": nsqd, "lookupd": lookupd}
    result["topic"] = _name_option(options, "topic", _valid)
    result["channel"] = _name_option(options, "channel", _valid)
    for name, default, minimum in SOURCE_INTEGERS:
        result[name] = _integer(options, name, default, minimum)
    if result["maxBatchSize"] is None:
        # Half the budget: the batch being planned and the one before it (un-FINed until
        # Spark commits it) both fit, so no trigger finds the budget spent.
        result["maxBatchSize"] = max(1, result["maxInFlight"] // 2)
    return result


def sink_options(options):
    """The sink's settings as a dict; NsqOptionError if bad."""
    nsqd, lookupd = _nodes(options)
    result = {"nsqd": nsqd, "lookupd": lookupd}
    topic = _get(options, "topic") or None
    column = _get(options, "topicColumn") or None
    if topic and column:
        raise NsqOptionError("nsq: set option topic or topicColumn, not both")
    if not topic and not column:
        raise NsqOptionError("nsq: option topic (or topicColumn) is required")
    result["topic"] = _name_option(options, "topic", _valid, required=False)
    result["topicColumn"] = column
    result["bodyColumn"] = _get(options, "bodyColumn") or None
    for name, default, minimum in SINK_INTEGERS:
        result[name] = _integer(options, name, default, minimum)
    return result


def check_columns(settings, column_names):
    """topicColumn/bodyColumn must name columns of the DataFrame written."""
    for option in ("topicColumn", "bodyColumn"):
        column = settings.get(option)
        if column is not None and column not in column_names:
            raise NsqOptionError("nsq: option %s=%r is not a column (columns: %s)"
                                 % (option, column, ", ".join(column_names)))


def probe(settings, timeout=5.0):
    """Check that the nodes answer: a TCP connect to each nsqd, a ``/ping``-like GET on a lookupd.

    NsqOptionError naming the option when one cannot be reached.
    """
    for address in settings["nsqd"]:
        try:
            socket.create_connection(address, timeout).close()
        except OSError as e:
            raise NsqOptionError("nsq: option nsqd: cannot reach %s (%s)" % (format_address(address), _why(e))) from None
    if settings["lookupd"]:
        _, errors = lookup_addresses(settings["lookupd"], "/nodes", timeout)
        if len(errors) == len(settings["lookupd"]):
            raise NsqOptionError("nsq: option lookupd: cannot reach %s (%s)"
                                 % (",".join(format_address(a) for a in settings["lookupd"]), _why(errors[0])))


def _why(error):
    return getattr(error, "strerror", None) or str(error) or type(error).__name__
