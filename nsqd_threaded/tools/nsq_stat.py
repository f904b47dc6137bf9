"""``nsq_stat``: a topic/channel's numbers summed over the cluster, one line per interval, as Go NSQ 1.3's.

The nsqd that have the topic are found through ``--lookupd-http-address``
(``/lookup``) or among the ``--nsqd-http-address`` nodes (``/stats``); their
channel stats are summed and printed in Go's columns: ingress and egress
(messages a second over the interval), depth (total, memory, disk), in-flight,
deferred, requeued, timed out, messages, clients.  The header comes first and
again every 25 reports; the first poll only sets the baseline.  With
``--count N`` the command exits 0 after N reports; a failed poll is one FATAL
line and exit 1, as in Go.
"""

import json
import sys
import threading
import time
import urllib.parse

from .. import command
from ..client.lookupd import lookup_addresses, parse_lookupd_address
from ..internal.gocompat import join_host_port, split_host_port
from ..internal.httpclient import NSQ_V1_ACCEPT, request
from ..settings.options import BOOL, DURATION, INT, META, STR, STR_LIST, OptionError, Setting
from . import common

TOOL = "nsq_stat"

HEADER = ("%s+%s+%s\n" % ("------rate------", "----------------depth----------------",
                          "--------------metadata---------------")
          + "%7s %7s | %7s %7s %7s %5s %5s | %7s %7s %12s %7s\n" % (
              "ingress", "egress", "total", "mem", "disk", "inflt", "def", "req", "t-o", "msgs", "clients"))
ROW = "%7d %7d | %7d %7d %7d %5d %5d | %7d %7d %12d %7d\n"

# The channel numbers summed over the nodes (nsqd's /stats names).
FIELDS = ("depth", "backend_depth", "in_flight_count", "deferred_count", "requeue_count",
          "timeout_count", "message_count", "client_count")


def _positive(flag, value):
    return None if value is None or value > 0 else "%s should be positive" % flag


SETTINGS = (
    Setting("channel", STR, "", "NSQ channel"),
    Setting("count", INT, None, "number of reports", check=_positive),
    Setting("http-client-connect-timeout", DURATION, 2.0, "timeout for HTTP connect", check=_positive),
    Setting("http-client-request-timeout", DURATION, 5.0, "timeout for HTTP request", check=_positive),
    Setting("interval", DURATION, 2.0, "duration of time between polling/printing output", check=_positive),
    common.lookupd_http(),
    Setting("nsqd-http-address", STR_LIST, (), "nsqd HTTP address (may be given multiple times)",
            field="nsqd_http_addresses"),
    Setting("topic", STR, "", "NSQ topic"),
    common.CONFIG_SETTING,
    Setting("version", BOOL, False, "print version", META),
)


def _validate(options):
    if not options.topic or not options.channel:
        raise OptionError("--topic and --channel are required")
    common.one_of_nsqd_or_lookupd(options.nsqd_http_addresses, options.lookupd_http_addresses,
                                  "--nsqd-http-address")
    common.no_scheme(options.nsqd_http_addresses, "--nsqd-http-address")
    common.no_scheme(options.lookupd_http_addresses, "--lookupd-http-address")


StatOptions = command.table_options("StatOptions", SETTINGS, _validate)


class Stat:
    """The nsq_stat app: the ``nsq_stat-poll`` thread polls and prints to ``out`` (stdout's text).

    ``done`` is set after ``--count`` reports or a failed poll (``exit_code`` 1).
    """

    def __init__(self, options, out=None):
        self.options = options
        self.log = common.tool_logger(options, TOOL)
        self.out = out if out is not None else sys.stdout
        self.done = threading.Event()
        self.exit_code = 0
        self._stopping = threading.Event()
        self._thread = None

    def start(self):
        self._thread = threading.Thread(target=self._loop, name="nsq_stat-poll")
        self._thread.start()
        return self

    def stop(self):
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()

    def _get(self, address, path):
        host, port = split_host_port(address)
        o = self.options
        status, _, body = request("GET", host or "127.0.0.1", port, path, headers={"Accept": NSQ_V1_ACCEPT},
                                  connect_timeout=o.http_client_connect_timeout,
                                  deadline=time.monotonic() + o.http_client_request_timeout)
        if status != 200:
            raise OSError("GET %s on %s: %d" % (path, address, status))
        return json.loads(body.decode("utf-8"))

    def producers(self):
        """The HTTP addresses of the nsqd that have the topic."""
        o = self.options
        topic = urllib.parse.quote(o.topic, safe="")
        if o.lookupd_http_addresses:
            lookupds = [parse_lookupd_address(a) for a in o.lookupd_http_addresses]
            found, errors = lookup_addresses(lookupds, "/lookup?topic=" + topic, o.http_client_request_timeout,
                                             port_field="http_port")
            if errors and not found:
                raise errors[0]
            return [join_host_port(*a) for a in found]
        result = []
        for address in o.nsqd_http_addresses:
            doc = self._get(address, "/stats?format=json&topic=%s&include_clients=false" % topic)
            if any(t.get("topic_name") == o.topic for t in doc.get("topics") or ()):
                result.append(address)
        return result

    def channel_stats(self, producers):
        """The channel's numbers summed over ``producers``, or None if no node has the channel."""
        o = self.options
        path = "/stats?format=json&topic=%s&channel=%s" % (urllib.parse.quote(o.topic, safe=""),
                                                          urllib.parse.quote(o.channel, safe=""))
        total = None
        for address in producers:
            for t in self._get(address, path).get("topics") or ():
                if t.get("topic_name") != o.topic:
                    continue
                for c in t.get("channels") or ():
                    if c.get("channel_name") != o.channel:
                        continue
                    if total is None:
                        total = dict.fromkeys(FIELDS, 0)
                    for name in FIELDS:
                        value = c.get(name)
                        if name == "client_count" and value is None:
                            value = len(c.get("clients") or ())
                        total[name] += int(value or 0)
        if total is not None:
            total["memory_depth"] = total["depth"] - total["backend_depth"]  # as Go's clusterinfo derives it
        return total

    def _loop(self):
        o = self.options
        interval = o.interval
        previous = None
        i = 0
        try:
            while o.count is None or o.count >= i:
                try:
                    producers = self.producers()
                except (OSError, ValueError) as e:
                    return self._fail("failed to get topic producers - %s" % command.error_text(e))
                try:
                    current = self.channel_stats(producers)
                except (OSError, ValueError) as e:
                    return self._fail("failed to get nsqd stats - %s" % command.error_text(e))
                if current is None:
                    return self._fail("failed to find channel(%s) in stats metadata for topic(%s)"
                                      % (o.channel, o.topic))
                if i % 25 == 0:
                    self.out.write(HEADER)
                if previous is not None:
                    messages = current["message_count"] - previous["message_count"]
                    depth_change = current["depth"] - previous["depth"]
                    self.out.write(ROW % (
                        int(messages / interval), int((messages - depth_change) / interval),
                        current["depth"], current["memory_depth"], current["backend_depth"],
                        current["in_flight_count"], current["deferred_count"], current["requeue_count"],
                        current["timeout_count"], current["message_count"], current["client_count"]))
                self.out.flush()
                previous = current
                i += 1
                if self._stopping.wait(interval):
                    return
        finally:
            self.done.set()

    def _fail(self, message):
        self.log.error("%s", message)
        self.exit_code = 1


main = command.AppCommand(
    "nsq_stat-threaded",
    SETTINGS,
    StatOptions,
    Stat,
    log_prefix="[%s] " % TOOL,
    help="NSQ 1.3's nsq_stat in pure Python: a topic/channel's stats across the cluster, every interval.  "
    "Flags are nsq_stat's.",
)
