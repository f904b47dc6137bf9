"""The time-skipping routes of nsqd and nsqlookupd (not in Go), served only with ``--time-skipping``.

* ``POST /debug/time/skip?by=61s`` moves the daemon's clock forward by a Go
  duration (no ``by``: to its next deadline) and answers once what fell due
  is done: ``{"now_ns": ..., "skipped": 61.0, "total_skipped": ...}``.
* ``GET /debug/time``: ``{"now_ns": ..., "total_skipped": ..., "next_deadline_in": 59.9, "settled": true}``
  (seconds of the daemon's clock to its next deadline, null when none is pending; ``settled``:
  nothing under way and no message in flight, as nsqd can vouch: true, false, or null when it
  cannot tell, see ``auto_skip.settled``).

Without the flag the routes do not exist: 404, as on Go's daemons.  A test
suite in any language moves time with them (docs/testing.md).
"""

from ..internal.clock import parse_skip_ns
from .http_server import HTTPError, QueryError, ok_json, parse_query


class TimeSkipRoutes:
    """The two routes over one daemon: ``daemon.clock`` (a :class:`~nsqd_threaded.internal.clock.Clock`),
    ``daemon.advance(seconds=None)`` and ``daemon.next_deadline_in()`` (seconds, None when nothing is pending)."""

    def __init__(self, daemon):
        self.daemon = daemon

    def routes(self):
        """``{path: {method: handler}}`` for a Router's table."""
        return {
            "/debug/time": {"GET": self.time},
            "/debug/time/skip": {"POST": self.skip},
        }

    def time(self, request):
        daemon = self.daemon
        clock = daemon.clock
        return ok_json({
            "now_ns": clock.time_ns(),
            "total_skipped": clock.skipped,
            "next_deadline_in": daemon.next_deadline_in(),
            # at rest, as the daemon can vouch (true / false: under way / null: it cannot tell)
            "settled": daemon.settled(request.client_address) if hasattr(daemon, "settled") else None,
        })

    def skip(self, request):
        try:
            by = parse_query(request.query).get("by")
        except QueryError:
            raise HTTPError(400, "INVALID_REQUEST") from None
        if by is None:
            seconds = None
        else:
            try:
                seconds = parse_skip_ns(by) / 1e9
            except ValueError:
                raise HTTPError(400, "INVALID_BY") from None
        skipped = self.daemon.advance(seconds)
        clock = self.daemon.clock
        return ok_json({"now_ns": clock.time_ns(), "skipped": skipped, "total_skipped": clock.skipped})
