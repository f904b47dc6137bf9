"""AUTH: asking an auth server what a connection may do, and checking it.

An nsqd started with ``--auth-http-address`` requires each TCP connection to
send ``AUTH <secret>`` before it may SUB or publish.  The secret goes to an
auth server over HTTP; its JSON answer says who the client is and which
topics and channels it may subscribe to or publish on, for ``ttl`` seconds.
When that time has passed, the next SUB/PUB/MPUB/DPUB asks again with the same
secret.

This module is the pure part (request encoding, response parsing and
validation, the permission check), free of I/O; the HTTP exchange is
:func:`nsqd_threaded.server.auth_query.query_any`, run on the connection's own
thread and bounded by the HTTP client timeouts.
"""

import re
import time
import urllib.parse

from ..internal.gocompat import JSONObject, go_json, go_json_fold_key, go_json_loads, go_json_text, go_quote

PERMISSIONS = ("subscribe", "publish")

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
        return (time.monotonic() if now is None else now) > self.expires  # real time: AUTH is connection liveness

    def is_allowed(self, topic, channel=""):
        """True if any authorization grants (topic, channel)."""
        key = (topic, channel)
        allowed = self._memo.get(key)
        if allowed is None:
            allowed = any(a.allows(topic, channel) for a in self.authorizations)
            if len(self._memo) < _MEMO_LIMIT:
                self._memo[key] = allowed
        return allowed

    def may_subscribe(self, topic):
        """True if some authorization grants ``subscribe`` on ``topic`` for some channel.

        Such a client can read whatever waits in the topic's own queue (a new
        channel is handed it), so that is what this permission guards.
        """
        return any("subscribe" in a.permissions and a.channels and a._topic_re.search(topic) is not None
                   for a in self.authorizations)

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
    now = time.monotonic() if now is None else now  # real time: AUTH is connection liveness
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
