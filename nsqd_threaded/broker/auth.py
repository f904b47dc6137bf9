"""AUTH: asking an auth server what a connection may do, and checking it.

An nsqd started with ``--auth-http-address`` requires each TCP connection to
send ``AUTH <secret>`` before it may SUB or publish.  The secret goes to an
auth server over HTTP; its JSON answer says who the client is and which
topics and channels it may subscribe to or publish on, for ``ttl`` seconds.
When that time has passed, the next SUB/PUB/MPUB/DPUB asks again with the same
secret.

The pure part (request encoding, response parsing and validation, the
permission check) is free of I/O; :func:`query_any` is the HTTP edge, run on
the connection's own thread and bounded by the HTTP client timeouts.
"""

import http.client
import io
import random
import re
import socket
import ssl
import time
import urllib.parse

from ..gocompat import JSONObject, go_json, go_json_fold_key, go_json_loads, go_json_text, go_quote

PERMISSIONS = ("subscribe", "publish")
ACCEPT = "application/vnd.nsq; version=1.0"

# An answer larger than this is a failure (Go reads any size; a bound keeps a
# runaway server from filling memory before the request timeout).
MAX_RESPONSE_SIZE = 16 * 1024 * 1024

# Permission decisions remembered per answer (a producer uses a few topics).
_MEMO_LIMIT = 256


class AuthError(Exception):
    """The auth server could not be asked, or its answer is unusable (logged, never shown to the client)."""


# -- the answer ----------------------------------------------------------------------


class Authorization:
    """One entry of ``authorizations``: a topic regex, channel regexes, permissions.

    The regexes are unanchored (a search, as Go's ``MatchString``): ``^``/``$``
    are the auth server's to write.
    """

    __slots__ = ("topic", "channels", "permissions", "_topic_re", "_channel_res")

    def __init__(self, topic, channels, permissions):
        for p in permissions:
            if p not in PERMISSIONS:
                raise AuthError("unknown permission %s" % p)
        self.topic = topic
        self.channels = tuple(channels)
        self.permissions = frozenset(permissions)
        self._topic_re = _compile(topic, "topic")
        self._channel_res = tuple(_compile(c, "channel") for c in channels)

    def allows(self, topic, channel):
        """``subscribe`` is needed when ``channel`` is set (SUB), else ``publish``."""
        if ("subscribe" if channel else "publish") not in self.permissions:
            return False
        if self._topic_re.search(topic) is None:
            return False
        # An empty channels list allows nothing, not even publishing.
        return any(r.search(channel) is not None for r in self._channel_res)


def _compile(pattern, what):
    try:
        return re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as e:
        raise AuthError("unable to compile %s %s %s" % (what, go_quote(pattern), e)) from None


class AuthState:
    """One auth server answer; immutable once made, so any thread may read it.

    ``expires`` is on the ``time.monotonic`` clock.
    """

    __slots__ = ("identity", "identity_url", "ttl", "authorizations", "expires", "_memo")

    def __init__(self, identity, identity_url, ttl, authorizations, expires):
        self.identity = identity
        self.identity_url = identity_url
        self.ttl = ttl
        self.authorizations = tuple(authorizations)
        self.expires = expires
        self._memo = {}  # (topic, channel) -> bool; a cache of a pure function (one writer: the connection thread)

    def __repr__(self):
        return "AuthState(%r, %d authorizations, ttl %d)" % (self.identity, len(self.authorizations), self.ttl)

    def expired(self, now=None):
        return (time.monotonic() if now is None else now) > self.expires

    def is_allowed(self, topic, channel=""):
        """True if any authorization grants (topic, channel)."""
        key = (topic, channel)
        allowed = self._memo.get(key)
        if allowed is None:
            allowed = any(a.allows(topic, channel) for a in self.authorizations)
            if len(self._memo) < _MEMO_LIMIT:
                self._memo[key] = allowed
        return allowed

    def response(self):
        """AUTH's answer to the client (Go's json.Marshal, in its key order)."""
        doc = {
            "identity": self.identity,
            "identity_url": self.identity_url,
            "permission_count": len(self.authorizations),
        }
        return go_json(doc).encode("utf-8")


def _fields(doc, what):
    """A decoded JSON object as {folded key: value}: Go's case-insensitive match, the later key winning."""
    if doc is None:
        return {}
    if not isinstance(doc, JSONObject):
        raise AuthError("%s: want a JSON object" % what)
    out = {}
    for key, value in doc:
        if value is not None:  # null leaves Go's field as it was
            out[go_json_fold_key(key)] = value
    return out


def _is_array(value):
    return isinstance(value, list) and not isinstance(value, JSONObject)  # a JSONObject is a list of pairs


def _string(value, what):
    if value is None:
        return ""
    if not isinstance(value, str):
        raise AuthError("%s: want a string" % what)
    return go_json_text(value)


def _strings(value, what):
    if value is None:
        return []
    if not _is_array(value):
        raise AuthError("%s: want an array of strings" % what)
    return [_string(v, what) for v in value]


def parse_auth_response(body, now=None):
    """An auth server's 200 answer -> :class:`AuthState`; AuthError when nsqd would refuse it.

    Decoding follows Go's encoding/json into nsqd's struct (case-insensitive
    keys, ``null`` as absent, a wrong type anywhere fails); then each
    permission must be ``subscribe`` or ``publish``, each regex must compile,
    and ``ttl`` must be > 0.
    """
    try:
        doc = go_json_loads(body)
    except ValueError as e:
        raise AuthError("invalid JSON: %s" % e) from None
    fields = _fields(doc, "response")
    ttl = fields.get("ttl", 0)
    if isinstance(ttl, bool) or not isinstance(ttl, int) or not -(1 << 63) <= ttl < (1 << 63):
        raise AuthError("ttl: want an integer, got %r" % (ttl,))
    identity = _string(fields.get("identity"), "identity")
    identity_url = _string(fields.get("identity_url"), "identity_url")
    entries = fields.get("authorizations")
    if entries is not None and not _is_array(entries):
        raise AuthError("authorizations: want an array")
    authorizations = []
    for entry in entries or ():
        f = _fields(entry, "authorization")
        authorizations.append(
            Authorization(
                _string(f.get("topic"), "topic"),
                _strings(f.get("channels"), "channels"),
                _strings(f.get("permissions"), "permissions"),
            )
        )
    if ttl <= 0:
        raise AuthError("invalid TTL %d (must be >0)" % ttl)
    now = time.monotonic() if now is None else now
    return AuthState(identity, identity_url, ttl, authorizations, now + ttl)


# -- the request ---------------------------------------------------------------------


def auth_endpoint(address):
    """``host:port`` -> ``http://host:port/auth``; anything containing ``://`` is used verbatim."""
    return address if "://" in address else "http://%s/auth" % address


def auth_params(remote_ip, tls, secret, common_name):
    """The four request parameters, keys sorted (Go's url.Values encodes them so)."""
    if isinstance(secret, (bytes, bytearray)):
        secret = bytes(secret).decode("utf-8", "surrogateescape")
    return {
        "common_name": common_name or "",
        "remote_ip": remote_ip or "",
        "secret": secret,
        "tls": "true" if tls else "false",
    }


def get_url(endpoint, params):
    """The GET request's URL: the endpoint, ``?``, the URL-encoded parameters."""
    query = "&".join(
        "%s=%s" % (k, urllib.parse.quote_plus(v.encode("utf-8", "surrogateescape"), safe="~"))
        for k, v in sorted(params.items())
    )
    return "%s?%s" % (endpoint, query)


def post_body(params):
    """The POST request's JSON body: each value a one-element array (Go marshals url.Values so)."""
    return go_json({k: [params[k]] for k in sorted(params)}).encode("utf-8")


def https_endpoint(endpoint, body):
    """A 403 answer's ``https_port`` -> the same endpoint over https on that port (Go's retry)."""
    try:
        doc = _fields(go_json_loads(body), "403 response")
    except ValueError as e:
        raise AuthError("403 response: %s" % e) from None
    port = doc.get("https_port", 0)
    if isinstance(port, bool) or not isinstance(port, int):
        raise AuthError("403 response: https_port want an integer")
    parts = urllib.parse.urlsplit(endpoint)
    host = parts.hostname or ""
    if ":" in host:
        host = "[%s]" % host
    return urllib.parse.urlunsplit(("https", "%s:%d" % (host, port)) + tuple(parts[2:]))


# -- the HTTP edge -------------------------------------------------------------------


def query_any(opts, remote_ip, tls, secret, common_name="", log=None):
    """Ask the auth servers, starting at a random one and wrapping around; the first answer wins.

    Raises AuthError (the last failure) when none answers usably.
    """
    addresses = list(opts.auth_http_addresses)
    if not addresses:
        raise AuthError("no auth server")
    params = auth_params(remote_ip, tls, secret, common_name)
    start = random.randrange(len(addresses))
    error = None
    for i in range(len(addresses)):
        address = addresses[(start + i) % len(addresses)]
        try:
            return query_one(opts, address, params)
        except AuthError as e:
            error = e
        except Exception as e:  # any failure is the client's E_AUTH_FAILED, never the connection thread's end
            error = AuthError(_error_text(e))
        if log is not None:
            log.warn("failed auth against %s %s", address, error)
    raise error


def query_one(opts, address, params):
    """One auth server's answer as an AuthState (AuthError, or the OSError/HTTPException/ValueError of the exchange)."""
    endpoint = auth_endpoint(address)
    post = opts.auth_http_request_method == "post"
    url = endpoint if post else get_url(endpoint, params)
    body = post_body(params) if post else None
    # Go's http.Client: the request timeout bounds the whole exchange (0 = none).
    deadline = time.monotonic() + opts.http_client_request_timeout if opts.http_client_request_timeout else None
    status, data = _request(opts, "POST" if post else "GET", url, body, deadline)
    if status == 403 and not url.startswith("https"):
        url = https_endpoint(url, data)
        status, data = _request(opts, "POST" if post else "GET", url, body, deadline)
    if status != 200:
        raise AuthError("got response %d %s" % (status, go_quote(data[:256])))
    return parse_auth_response(data)


def _request(opts, method, url, body, deadline):
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise AuthError("unsupported protocol scheme %s" % go_quote(parts.scheme))
    if not parts.hostname:
        raise AuthError("no host in the address")  # (not the URL: its query holds the secret)
    connect_timeout = opts.http_client_connect_timeout or None
    if deadline is not None:
        remaining = _remaining(deadline)
        connect_timeout = remaining if connect_timeout is None else min(connect_timeout, remaining)
    if parts.scheme == "https":
        context = ssl.create_default_context(cafile=opts.tls_root_ca_file or None)
        conn = http.client.HTTPSConnection(parts.hostname, parts.port, timeout=connect_timeout, context=context)
    else:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=connect_timeout)
    sock = None
    try:
        conn.connect()
        sock = conn.sock
        conn.sock = _DeadlineSocket(sock, deadline)
        path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
        headers = {"Accept": ACCEPT}
        if body is not None:
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        chunks = []
        size = 0
        while True:
            chunk = resp.read(65536)
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_RESPONSE_SIZE:
                raise AuthError("response larger than %d bytes" % MAX_RESPONSE_SIZE)
            chunks.append(chunk)
        return resp.status, b"".join(chunks)
    finally:
        conn.close()
        if sock is not None:
            sock.close()


def _remaining(deadline):
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise socket.timeout("timed out")
    return remaining


class _DeadlineSocket:
    """A connected socket whose every send and recv ends by one deadline (None: no deadline).

    A per-operation socket timeout alone would let a server that trickles its
    answer hold the connection thread far longer than the request timeout.
    """

    def __init__(self, sock, deadline):
        self._sock = sock
        self._deadline = deadline

    def _arm(self):
        if self._deadline is not None:
            self._sock.settimeout(_remaining(self._deadline))
        else:
            self._sock.settimeout(None)

    def sendall(self, data):
        self._arm()
        return self._sock.sendall(data)

    def recv_into(self, buf):
        self._arm()
        return self._sock.recv_into(buf)

    def makefile(self, mode="rb", buffering=None):
        return io.BufferedReader(_DeadlineReader(self))

    def close(self):
        """http.client closes its connection while the response may still be read: _request closes the socket."""


class _DeadlineReader(io.RawIOBase):
    def __init__(self, sock):
        self._sock = sock

    def readable(self):
        return True

    def readinto(self, buf):
        return self._sock.recv_into(buf)


def _error_text(e):
    if isinstance(e, socket.timeout):
        return "i/o timeout"
    return str(e) or type(e).__name__
