"""Time skipping for the testing daemons: what :meth:`Broker.advance` and its kin share.

An in-process daemon's clock is moved directly; a child process's over its
HTTP API (``POST /debug/time/skip``, served with ``--time-skipping``), as a
test suite in any language would (docs/testing.md).
"""

import json
from urllib.parse import quote

from ..internal.clock import parse_skip_ns
from ..internal.gocompat import format_duration_ns
from .served import http_request

__all__ = ["http_advance", "http_next_deadline_in", "http_time"]

# An advance waits for the daemon's scan and deliveries (bounded there): the request may take that long.
ADVANCE_HTTP_TIMEOUT = 60.0


def _not_skipping(who, status, body):
    return RuntimeError(
        "%s cannot skip time: /debug/time answered %d %r (only nsqd-threaded and nsqlookupd-threaded "
        "started with --time-skipping have it; a Go nsqd has no such route)" % (who, status, body))


def http_advance(address, seconds, who):
    """``POST /debug/time/skip`` (``by`` the Go spelling of ``seconds``; None: to the next deadline);
    returns the seconds skipped.  RuntimeError naming ``who`` when the daemon cannot skip time."""
    path = "/debug/time/skip"
    if isinstance(seconds, str):
        seconds = parse_skip_ns(seconds) / 1e9  # (a bad one raises here, not as a 400)
    if seconds is not None:
        if seconds < 0:
            raise ValueError("a clock only moves forward (asked to skip %gs)" % seconds)
        path += "?by=" + quote(format_duration_ns(int(round(seconds * 1e9))))
    status, body = http_request(address, "POST", path, None, ADVANCE_HTTP_TIMEOUT)
    if status == 404:
        raise _not_skipping(who, status, body)
    if status != 200:
        raise RuntimeError("%s answered %d: %r" % (path, status, body))
    return json.loads(body)["skipped"]


def http_time(address, who):
    """``GET /debug/time``: ``{"now_ns", "total_skipped", "next_deadline_in"}``."""
    status, body = http_request(address, "GET", "/debug/time", None, 10.0)
    if status == 404:
        raise _not_skipping(who, status, body)
    if status != 200:
        raise RuntimeError("/debug/time answered %d: %r" % (status, body))
    return json.loads(body)


def http_next_deadline_in(address, who):
    """``GET /debug/time``'s ``next_deadline_in``: seconds to the daemon's next deadline, or None."""
    return http_time(address, who)["next_deadline_in"]
