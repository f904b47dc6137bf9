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
Up to ``-n`` (100) requests are under way at once, each over a kept-alive
connection, all driven by one thread (:mod:`.http_publishers`);
``--max-in-flight`` bounds the messages held.  ``--sample`` sends
only that fraction (the rest are FINed unsent); ``--status-every`` logs
timer_metrics' line every so many requests.
"""

import base64
import random
import re
import ssl
import urllib.parse

from .. import command
from ..client import Consumer
from ..settings.options import DURATION, FLOAT, INT, STR, STR_LIST, VERSION, OptionError, Setting
from . import common, upstream
from .http_publishers import HTTPPublishers, RequestFailed

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
    common.valid_names([o.topic], o.channel)


ToHTTPOptions = command.table_options("ToHTTPOptions", SETTINGS, _validate)


class Endpoint:
    """One ``--get``/``--post`` URL: where to connect and what to ask for.

    A ``user:password@`` in the URL becomes HTTP basic auth, as Go's net/http
    client makes it (``authorization``: the ``Authorization`` value, None
    without one); ``redacted`` is the URL with the password as ``***``, the
    only form of it that logs and status lines show.
    """

    def __init__(self, url):
        parts = urllib.parse.urlsplit(url)
        userinfo, at, host = parts.netloc.rpartition("@")
        self.redacted = redact(url, userinfo) if at else url
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise OptionError("invalid address %r: an http:// or https:// URL is required" % self.redacted)
        try:
            port = parts.port
        except ValueError:
            raise OptionError("invalid address %r: bad port" % self.redacted) from None
        self.url = url
        self.key = (parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80))
        self.host_header = host
        self.authorization = basic_auth(userinfo) if at else None
        if at and self.authorization is None:
            raise OptionError("invalid address %r: invalid userinfo" % self.redacted)
        # the request target of a POST; a GET's comes from the template after substitution
        self.target = request_target(parts)
        # a GET template whose %s is in the target: the target is the parts around it and the escaped body
        self.around = self.target.split("%s", 1) if self.target.count("%s") == 1 else None

    def get_target(self, escaped):
        """The request target of a GET whose ``%s`` is ``escaped``."""
        if self.around is not None:
            return self.around[0] + escaped + self.around[1]
        return request_target(urllib.parse.urlsplit(self.url.replace("%s", escaped, 1)))


def redact(url, userinfo):
    """``url`` with the password of its ``userinfo`` as ``***`` (as Go's client errors show a URL)."""
    user, colon, _ = userinfo.partition(":")
    return url.replace(userinfo + "@", user + ":***@", 1) if colon else url


_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def basic_auth(userinfo):
    """The ``Authorization`` value for a URL's ``user[:password]`` (%-escapes decoded), or None if malformed.

    As Go's client: ``Basic`` and the base64 of ``user:password`` (an absent
    password is empty).  A ``%`` that starts no escape is malformed (Go's
    url.Parse refuses the URL).
    """
    if _ESCAPE.search(userinfo):
        return None
    user, _, password = userinfo.partition(":")
    credentials = urllib.parse.unquote_to_bytes(user) + b":" + urllib.parse.unquote_to_bytes(password)
    return "Basic " + base64.b64encode(credentials).decode("ascii")


# what may stand in a request target as it is: printable ASCII but the space
_TARGET_SAFE = "".join(chr(c) for c in range(33, 127))


def request_target(parts):
    """The request target of a split URL: its path (``/`` if none) and query, the rest of it %-escaped."""
    target = (parts.path or "/") + ("?" + parts.query if parts.query else "")
    return target if target.isascii() and " " not in target else urllib.parse.quote(target, safe=_TARGET_SAFE)


# Go's http.Request.Write writes these itself: a --header of that name is not sent.
_TRANSPORT_HEADERS = ("Host", "Content-Length", "Transfer-Encoding", "Trailer")
_TOKEN_CHARS = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def request_headers(method, user_agent, content_type, custom):
    """The header lines after Host, as Go's client writes them: bytes, each ending in CRLF.

    Go's order of setting (User-Agent, Content-Type, then each ``--header``, which
    may replace them), then ``Accept-Encoding: gzip`` as Go's transport adds it
    when the request has none.  A value's line breaks become spaces, as Go's do.
    Raises ValueError for a header name that is not an HTTP token (Go's client
    refuses such a request).
    """
    headers = {"User-Agent": user_agent}
    if method == "POST":
        headers["Content-Type"] = content_type
    headers.update(custom)
    if "Accept-Encoding" not in headers and "Range" not in headers:
        headers["Accept-Encoding"] = "gzip"
    lines = []
    for name, value in headers.items():
        if name in _TRANSPORT_HEADERS:
            continue
        if not name or not set(name) <= _TOKEN_CHARS:
            raise ValueError("invalid header field name %r" % name)
        value = value.replace("\r\n", " ").replace("\r", " ").replace("\n", " ")
        lines.append(b"%s: %s\r\n" % (name.encode("ascii"), value.encode("utf-8")))
    return b"".join(lines)


class ToHTTP:
    """The nsq_to_http app: one Consumer whose messages :class:`~.http_publishers.HTTPPublishers` sends.

    The consumer's reader threads hand each message to the publishers' driver
    thread, which makes up to ``-n`` requests at once and alone touches the
    pool, the timer metrics and the connections (no lock).
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
        try:
            lines = request_headers(self.method, self.user_agent, o.content_type, self.headers)
            self.header_error = None
        except ValueError as e:
            lines, self.header_error = b"", str(e)  # every request fails, as Go's do
        # per endpoint: the request's bytes up to the body's length (POST) or up to the target (GET)
        self._heads = {a: self._head(e, lines) for a, e in self.endpoints.items()}
        self.ssl_context = ssl.create_default_context() if any(
            e.key[0] == "https" for e in self.endpoints.values()) else None
        # None: every endpoint gets every message; so does the only one (no pool to consult per message)
        self.pool = upstream.pool_for(o.mode, self.addresses) if len(self.addresses) > 1 else None
        single = len(self.addresses) == 1
        self.per_address = {a: upstream.TimerMetrics(0 if single else o.status_every,
                                                     "[%s]:" % self.endpoints[a].redacted, self.log)
                            for a in self.addresses}
        self.aggregate = upstream.TimerMetrics(o.status_every, "[aggregate]:", self.log)
        self._random = random.Random()
        self.consumer = None
        self.publishers = None

    def _head(self, endpoint, lines):
        host = b"Host: %s\r\n" % endpoint.host_header.encode("idna" if not endpoint.host_header.isascii() else "ascii")
        if endpoint.authorization is not None and "Authorization" not in self.headers:
            # Go's client adds it last, and only when no --header set one
            lines += b"Authorization: %s\r\n" % endpoint.authorization.encode("ascii")
        if self.method == "POST":
            return b"POST %s HTTP/1.1\r\n%s%sContent-Length: " % (endpoint.target.encode("ascii"), host, lines)
        return b" HTTP/1.1\r\n%s%s\r\n" % (host, lines)

    def start(self):
        o = self.options
        kwargs = self.config.consumer_kwargs()
        self.publishers = HTTPPublishers(self, o.n, o.http_client_connect_timeout, o.http_client_request_timeout,
                                         kwargs.get("requeue_delay_ms", -1)).start()
        self.consumer = Consumer(o.nsqd_tcp_addresses or None, o.topic, o.channel,
                                 lookupd_http_addresses=o.lookupd_http_addresses or None,
                                 on_message=self.publishers.submit, logger=self.log, **kwargs)
        try:
            self.consumer.start(wait=not o.lookupd_http_addresses)  # lookupd failures: logged, polled again
        except BaseException:
            self.publishers.stop(0.0)
            raise
        return self

    def stop(self):
        """CLS, finish the requests under way, requeue what was not sent, stop.  Idempotent."""
        if self.consumer is not None:
            timeout = max(self.consumer.timeout, self.options.http_client_request_timeout + 1.0)
            self.consumer.stop_receiving(timeout)
            self.publishers.stop(timeout)
            self.consumer.close(timeout)

    # -- for the publishers' driver thread ---------------------------------------------------

    def sampled_out(self):
        """True for a message ``--sample`` leaves unsent (it is FINed)."""
        sample = self.options.sample
        return sample < 1.0 and self._random.random() > sample

    def request_for(self, address, body):
        """The bytes of the request that sends ``body`` to ``address``; RequestFailed if none can be made."""
        if self.header_error is not None:
            raise RequestFailed("%s %s: %s" % (self.method, self.endpoints[address].redacted, self.header_error))
        if self.method == "POST":
            return b"%s%d\r\n\r\n%s" % (self._heads[address], len(body), body)
        target = self.endpoints[address].get_target(query_escape(body)).encode("ascii")
        return b"GET %s%s" % (target, self._heads[address])

    def check_status(self, status):
        """RequestFailed unless ``status`` is a success: 2xx for a POST, 200 for a GET (as Go's tool)."""
        if self.method == "POST":
            if not 200 <= status < 300:
                raise RequestFailed("got status code %d" % status)
        elif status != 200:
            raise RequestFailed("got status code %d" % status)


main = command.AppCommand(
    "nsq_to_http-threaded",
    SETTINGS,
    ToHTTPOptions,
    ToHTTP,
    log_prefix="[%s] " % TOOL,
    help="NSQ 1.3's nsq_to_http in pure Python: send a topic's messages to HTTP endpoints.  Flags are "
         "nsq_to_http's.",
)
