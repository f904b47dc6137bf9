"""What every daemon a test runs shows it: bound addresses, log, HTTP API (the shared base classes)."""

import json
import threading
import time

from ..internal.gocompat import is_socket_path, join_host_port, split_host_port
from ..internal.httpclient import request
from .logs import LogBuffer

TEMP_PREFIX = "nsqd-threaded-"
LOCALHOST = "127.0.0.1"


class Served:
    """What every running daemon here shows a test: its bound addresses, its log, its HTTP API.

    The owner sets ``_tcp_address``, ``_http_address`` (``(host, port)``, a unix socket
    path, or None) and ``_log`` (a :class:`LogBuffer`).
    """

    # -- addresses -------------------------------------------------------------

    @property
    def tcp_address(self):
        """The bound TCP ``(host, port)`` or socket path (the last one, once stopped)."""
        return self._tcp_address

    @property
    def http_address(self):
        """The bound HTTP ``(host, port)`` or socket path, or None when HTTP is disabled."""
        return self._http_address

    @property
    def tcp_addr(self):
        """``"host:port"`` of the TCP listener (what pynsq and go-nsq take), or its socket path."""
        return address_text(self._tcp_address)

    @property
    def http_addr(self):
        return address_text(self._http_address)

    @property
    def http_url(self):
        """``http://host:port``; None when HTTP is disabled or on a unix socket (no URL names one)."""
        if not self._http_address or isinstance(self._http_address, str):
            return None
        return "http://" + self.http_addr

    # -- logs and HTTP ---------------------------------------------------------

    @property
    def log(self):
        """Everything the daemon has logged so far."""
        return self._log.getvalue()

    def log_position(self):
        return self._log.tell()

    def log_since(self, position):
        return self._log.getvalue(position)

    def http(self, method, path, body=None, timeout=10.0):
        """One request to the HTTP API: ``(status, body bytes)``."""
        return http_request(self._http_address, method, path, body, timeout)


class ServedBroker(Served):
    """A served nsqd: its settings, log, data directory and addresses; also its /stats."""

    def _init_broker(self, values, log_stream, tmp_dir):
        """``__init__``'s common part: resolved ``values``, the log, where the data directory goes."""
        self._values = values
        self._log = LogBuffer(log_stream)
        self._tmp_dir = tmp_dir
        self._lock = threading.Lock()
        self._own_data_path = "data_path" not in values  # a temporary one, made at start
        self.data_path = values.get("data_path")
        self._tcp_address = None
        self._http_address = None

    def __enter__(self):
        if not self.running:
            self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def stats(self, **params):
        """``/stats?format=json`` (plus ``topic=``, ``channel=`` ... params) as a dict."""
        return stats_request(self._http_address, params)

    def create(self, topic, channel=None):
        """Create ``topic`` (and its ``channel``), as ``POST /topic/create`` and ``/channel/create`` do:
        returns once nsqd.dat lists them.  A channel made so keeps the messages published from now on
        until a consumer comes (a topic alone holds them for its first channel)."""
        from urllib.parse import urlencode

        paths = ["/topic/create?" + urlencode({"topic": topic})]
        if channel is not None:
            paths.append("/channel/create?" + urlencode({"topic": topic, "channel": channel}))
        for path in paths:
            status, body = self.http("POST", path)
            if status != 200:
                raise RuntimeError("%s answered %d: %r" % (path, status, body))


def address_text(address):
    """``(host, port)`` -> ``"host:port"``; a socket path stays itself; None stays None."""
    if not address:
        return None
    return address if isinstance(address, str) else join_host_port(*address)


def logged_address(text):
    """A ``listening on`` log line's address -> ``(host, port)``, or the socket path."""
    if is_socket_path(text):
        return text
    host, port = split_host_port(text)
    return host, port


def http_request(address, method, path, body, timeout):
    if address is None:
        raise RuntimeError("HTTP is disabled on this broker")
    if isinstance(body, str):
        body = body.encode()
    host, port = (address, None) if isinstance(address, str) else address  # a str: a unix socket path
    status, _, data = request(method, host, port, path, body,
                              connect_timeout=timeout, deadline=time.monotonic() + timeout)
    return status, data


def stats_request(address, params):
    from urllib.parse import urlencode

    query = dict(params, format="json")
    status, body = http_request(address, "GET", "/stats?" + urlencode(query), None, 10.0)
    if status != 200:
        raise RuntimeError("/stats answered %d: %r" % (status, body))
    return json.loads(body)
