"""``nsq_to_http``: send each message of a topic to HTTP endpoints, as Go NSQ 1.3's nsq_to_http does.

``--post URL`` (repeated) POSTs the body with ``--content-type``; ``--get URL``
(repeated) GETs the URL with its one ``%s`` replaced by the body, query-escaped
as Go's ``url.QueryEscape`` does (a space is ``+``).  Each message goes to one
endpoint chosen by ``--mode`` (:mod:`.upstream`: ``hostpool``, the default,
``round-robin`` or ``epsilon-greedy``; any other value sends it to every
endpoint, as Go's tool does).  A POST succeeds on a 2xx status, a GET on 200.

A message is FINed once its request succeeded.  A failure (no connection, a
timeout, another status) requeues it with go-nsq's delay
(``default_requeue_delay`` times its attempts) and backs the consumer off, as
a go-nsq handler's error does; past ``max_attempts`` (5) it is given up.
``-n`` handler threads (100) make the requests, each over its own kept-alive
connections; ``--max-in-flight`` bounds the messages held.  ``--sample`` sends
only that fraction (the rest are FINed unsent); ``--status-every`` logs
timer_metrics' line every so many requests.
"""

import http.client
import random
import threading
import time
import urllib.parse

from .. import command
from ..client import Consumer
from ..settings.options import DURATION, FLOAT, INT, STR, STR_LIST, VERSION, OptionError, Setting
from . import common, upstream

TOOL = "nsq_to_http"
DEFAULT_CONTENT_TYPE = "application/octet-stream"

SETTINGS = (
    Setting("channel", STR, "nsq_to_http", "nsq channel"),
    common.consumer_opt(),
    Setting("content-type", STR, DEFAULT_CONTENT_TYPE, "the Content-Type used for POST requests"),
    Setting("get", STR_LIST, (), "HTTP address to make a GET request to. '%s' will be printf replaced with data "
            "(may be given multiple times)", field="get_addresses"),
    Setting("header", STR_LIST, (), "Custom header for HTTP requests (may be given multiple times)",
            field="headers"),
    Setting("http-client-connect-timeout", DURATION, 2.0, "timeout for HTTP connect"),
    Setting("http-client-request-timeout", DURATION, 20.0, "timeout for HTTP request"),
    common.lookupd_http(),
    Setting("max-in-flight", INT, 200, "max number of messages to allow in flight"),
    Setting("mode", STR, "hostpool", "the upstream request mode options: round-robin, hostpool (default), "
            "epsilon-greedy"),
    Setting("n", INT, 100, "number of concurrent publishers"),
    common.nsqd_tcp(),
    Setting("post", STR_LIST, (), "HTTP address to make a POST request to.  data will be in the body (may be "
            "given multiple times)", field="post_addresses"),
    Setting("sample", FLOAT, 1.0, "% of messages to publish (float b/w 0 -> 1)"),
    Setting("status-every", INT, 250, "the # of requests between logging status (per handler), 0 disables"),
    Setting("topic", STR, "", "nsq topic"),
    common.CONFIG_SETTING,
    common.VERSION_SETTING,
)


def parse_headers(values):
    """``--header`` values (``Key: value``) -> ``{Canonical-Key: value}``; ValueError for a bad one."""
    headers = {}
    for text in values:
        key, colon, value = text.partition(":")
        key, value = key.strip(), value.strip()
        if not colon or not key or not value:
            raise ValueError("invalid header: %r" % text)
        headers[canonical_header(key)] = value
    return headers


def canonical_header(key):
    """Go's CanonicalMIMEHeaderKey: ``content-type`` -> ``Content-Type`` (left as is if not a plain token)."""
    if not all(c.isalnum() or c in "-!#$%&'*+.^_`|~" for c in key) or not key.isascii():
        return key
    return "-".join(part[:1].upper() + part[1:].lower() for part in key.split("-"))


def query_escape(body):
    """Go's url.QueryEscape of the body's bytes."""
    return urllib.parse.quote_plus(body, safe="")


def _validate(o):
    """Go's checks, in Go's order."""
    if o.headers:
        try:
            parse_headers(o.headers)
        except ValueError:
            raise OptionError("--header value format should be 'key=value'") from None
    if not o.topic or not o.channel:
        raise OptionError("--topic and --channel are required")
    if o.content_type != DEFAULT_CONTENT_TYPE:
        if not o.post_addresses:
            raise OptionError("--content-type only used with --post")
        if not o.content_type:
            raise OptionError("--content-type requires a value when used")
    if not o.nsqd_tcp_addresses and not o.lookupd_http_addresses:
        raise OptionError("--nsqd-tcp-address or --lookupd-http-address required")
    if o.nsqd_tcp_addresses and o.lookupd_http_addresses:
        raise OptionError("use --nsqd-tcp-address or --lookupd-http-address not both")
    if not o.get_addresses and not o.post_addresses:
        raise OptionError("--get or --post required")
    if o.get_addresses and o.post_addresses:
        raise OptionError("use --get or --post not both")
    for address in o.get_addresses:
        if address.count("%s") != 1:
            raise OptionError("invalid GET address - must be a printf string")
    if not 0.0 <= o.sample <= 1.0:
        raise OptionError("ERROR: --sample must be between 0.0 and 1.0")
    if o.n < 1:
        raise OptionError("--n must be at least 1")
    for address in o.get_addresses or o.post_addresses:
        Endpoint(address)  # a URL we can request
    common.client_config(o.consumer_opts, "consumer-opt")


ToHTTPOptions = command.table_options("ToHTTPOptions", SETTINGS, _validate)


class RequestFailed(Exception):
    """A request that did not succeed: no connection, a timeout, or a status other than the one wanted."""


class Endpoint:
    """One ``--get``/``--post`` URL: where to connect and what to ask for."""

    def __init__(self, url):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise OptionError("invalid address %r: an http:// or https:// URL is required" % url)
        try:
            port = parts.port
        except ValueError:
            raise OptionError("invalid address %r: bad port" % url) from None
        self.url = url
        self.key = (parts.scheme, parts.hostname, port)
        self.host_header = parts.netloc.rpartition("@")[2]
        # the request target of a POST; a GET's comes from the template after substitution
        self.target = (parts.path or "/") + ("?" + parts.query if parts.query else "")

    def connection(self, connect_timeout):
        scheme, host, port = self.key
        cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
        return cls(host, port, timeout=connect_timeout)


class ToHTTP:
    """The nsq_to_http app: one Consumer whose ``-n`` handler threads make the requests.

    Each handler thread keeps its own connections (``_local.conns``, by
    scheme, host and port), so no lock is needed around them; the pool and
    the timer metrics lock themselves.
    """

    def __init__(self, options):
        self.options = o = options
        self.log = common.tool_logger(options, TOOL)
        config = common.client_config(o.consumer_opts, "consumer-opt")
        config.set("user_agent", common.user_agent(TOOL))
        config.set("max_in_flight", o.max_in_flight)
        self.config = config
        self.method = "POST" if o.post_addresses else "GET"
        self.addresses = list(o.post_addresses or o.get_addresses)
        self.endpoints = {address: Endpoint(address) for address in self.addresses}
        self.headers = parse_headers(o.headers)
        self.user_agent = "nsq_to_http v%s" % VERSION
        self.pool = upstream.pool_for(o.mode, self.addresses)  # None: every endpoint gets every message
        single = len(self.addresses) == 1
        self.per_address = {a: upstream.TimerMetrics(0 if single else o.status_every, "[%s]:" % a, self.log)
                            for a in self.addresses}
        self.aggregate = upstream.TimerMetrics(o.status_every, "[aggregate]:", self.log)
        self._local = threading.local()
        self._random = random.Random()
        self.consumer = None

    def start(self):
        o = self.options
        kwargs = self.config.consumer_kwargs()
        self.consumer = Consumer(o.nsqd_tcp_addresses or None, o.topic, o.channel, self._handle,
                                 lookupd_http_addresses=o.lookupd_http_addresses or None, concurrency=o.n, **kwargs)
        self.consumer.start()
        return self

    def stop(self):
        """CLS, wait for the requests under way, requeue what was not sent.  Idempotent."""
        if self.consumer is not None:
            self.consumer.close(max(self.consumer.timeout, self.options.http_client_request_timeout + 1.0))

    # -- a handler thread -------------------------------------------------------------

    def _handle(self, msg):
        o = self.options
        if o.sample < 1.0 and self._random.random() > o.sample:
            return True
        started = time.monotonic()
        try:
            if self.pool is None:
                for address in self.addresses:
                    st = time.monotonic()
                    self.publish(address, msg.body)
                    self.per_address[address].status(st)
            else:
                choice = self.pool.get()
                try:
                    self.publish(choice.host, msg.body)
                except RequestFailed as e:
                    choice.mark(e)
                    raise
                choice.mark(None)
                self.per_address[choice.host].status(started)
        except RequestFailed as e:
            self.log.warn("Handler returned error (%s) for msg %s", e, msg.id.decode("ascii", "replace"))
            return False  # REQ with go-nsq's delay, and back off
        self.aggregate.status(started)
        return True

    def publish(self, address, body):
        """One request for ``body`` to ``address``; RequestFailed unless it succeeded."""
        endpoint = self.endpoints[address]
        headers = {"User-Agent": self.user_agent}
        if self.method == "POST":
            target, payload, wanted = endpoint.target, body, range(200, 300)
            headers["Content-Type"] = self.options.content_type
        else:
            url = address.replace("%s", query_escape(body), 1)
            parts = urllib.parse.urlsplit(url)
            target = (parts.path or "/") + ("?" + parts.query if parts.query else "")
            payload, wanted = None, (200,)
        headers.update(self.headers)
        status = self._request(endpoint, target, payload, headers)
        if status not in wanted:
            raise RequestFailed("got status code %d" % status)

    def _request(self, endpoint, target, payload, headers):
        conns = getattr(self._local, "conns", None)
        if conns is None:
            conns = self._local.conns = {}
        for attempt in (0, 1):
            conn = conns.pop(endpoint.key, None)
            reused = conn is not None
            if conn is None:
                conn = endpoint.connection(self.options.http_client_connect_timeout)
            try:
                if conn.sock is None:
                    conn.connect()
                conn.sock.settimeout(self.options.http_client_request_timeout)
                conn.request(self.method, target, body=payload, headers=headers)
                response = conn.getresponse()
                response.read()
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                # a kept-alive connection the server had closed: once more on a new one, as Go's transport does
                if reused and attempt == 0 and isinstance(e, (http.client.RemoteDisconnected, ConnectionResetError,
                                                              BrokenPipeError)):
                    continue
                raise RequestFailed("%s %s: %s" % (self.method, endpoint.url, command.error_text(e)
                                                   if isinstance(e, OSError) else e or type(e).__name__)) from None
            if response.will_close:
                conn.close()
            else:
                conns[endpoint.key] = conn
            return response.status
        raise AssertionError("unreachable")


main = command.AppCommand(
    "nsq_to_http-threaded",
    SETTINGS,
    ToHTTPOptions,
    ToHTTP,
    log_prefix="[%s] " % TOOL,
    help="NSQ 1.3's nsq_to_http in pure Python: send a topic's messages to HTTP endpoints.  Flags are "
         "nsq_to_http's.",
)
