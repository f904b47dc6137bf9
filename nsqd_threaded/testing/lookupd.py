"""Lookupd: an nsqlookupd in this process, for a test."""

import json

from ..internal.gocompat import join_host_port
from .logs import LogBuffer
from .served import Served, address_text, http_request

__all__ = ["Lookupd"]


class Lookupd(Served):
    """An nsqlookupd (:class:`~nsqd_threaded.lookupd.NSQLookupd`) in this process, for a test.

    ``Lookupd(log_stream=None, log_level="info", **overrides)``: ``overrides`` are
    :class:`~nsqd_threaded.lookupd.LookupdOptions` fields (durations in seconds, e.g.
    ``inactive_producer_timeout=1``).  It listens on ``127.0.0.1`` port 0 (TCP and HTTP)
    and gives peers the broadcast address ``127.0.0.1``; its log is kept in memory
    (:attr:`log`) and also written to ``log_stream`` if given.  The object is single-use
    as NSQLookupd is: :meth:`restart` makes a new one on the same ports.
    """

    log_name = "nsqlookupd"  # the pytest plugin's "Captured nsqlookupd log" sections

    def __init__(self, log_stream=None, log_level="info", **overrides):
        self._log = LogBuffer(log_stream)
        self._log_level = log_level
        self._overrides = overrides
        self.lookupd = None  # the NSQLookupd (kept after stop() for inspection)
        self.running = False
        self._tcp_address = self._http_address = None

    def start(self):
        from ..internal.logger import Logger
        from ..lookupd import NSQLookupd

        overrides = dict(self._overrides)
        overrides.setdefault("time_skipping", True)  # for advance(): real time until a test moves it
        if self._tcp_address is not None:  # a restart: the same ports
            overrides.setdefault("tcp_address", address_text(self._tcp_address))
            overrides.setdefault("http_address", address_text(self._http_address))
        lookupd = NSQLookupd.local(logger=Logger("[nsqlookupd] ", self._log_level, self._log), **overrides)
        lookupd.start()
        self.lookupd = lookupd
        self._tcp_address, self._http_address = lookupd.tcp_address, lookupd.http_address
        self.running = True
        return self

    def stop(self):
        if self.running:
            self.running = False
            self.lookupd.stop()

    def restart(self):
        """Stop, then start a new NSQLookupd on the same ports (its registrations start empty)."""
        self.stop()
        return self.start()

    def __enter__(self):
        return self.start() if not self.running else self

    def __exit__(self, *exc):
        self.stop()

    def __repr__(self):
        return "<Lookupd tcp=%s http=%s %s>" % (self.tcp_addr, self.http_addr, "running" if self.running else "stopped")

    def advance(self, seconds=None):
        """Move the lookupd's clock forward by ``seconds`` (None: to its next deadline): producers
        not heard from within ``inactive_producer_timeout`` and tombstones older than
        ``tombstone_lifetime`` are gone from its answers.  Returns the seconds skipped (0.0 when
        nothing is pending).  See ``NSQLookupd.advance``."""
        if not self.running:
            raise RuntimeError("lookupd is not running")
        return self.lookupd.advance(seconds)

    @property
    def clock(self):
        """The lookupd's :class:`~nsqd_threaded.internal.clock.Clock`."""
        if self.lookupd is None:
            raise RuntimeError("lookupd was never started")
        return self.lookupd.clock

    def next_deadline_in(self, tombstones_only=False):
        """Seconds of the lookupd's clock until a producer goes inactive or a tombstone expires; None if none
        (``tombstones_only``: leave out the producers, which ping)."""
        return self.lookupd.next_deadline_in(tombstones_only)

    @property
    def db(self):
        """The registration DB, for assertions."""
        return self.lookupd.db


    def get(self, path):
        """``GET path`` as a dict (the v1 API); RuntimeError unless 200."""
        status, body = http_request(self._http_address, "GET", path, None, 10.0)
        if status != 200:
            raise RuntimeError("%s answered %d: %r" % (path, status, body))
        return json.loads(body)

    def lookup(self, topic):
        """The ``"host:port"`` of each producer ``/lookup?topic=`` lists (sorted; [] if the topic is unknown)."""
        from urllib.parse import quote

        status, body = http_request(self._http_address, "GET", "/lookup?topic=" + quote(topic, safe=""), None, 10.0)
        if status == 404:
            return []
        if status != 200:
            raise RuntimeError("/lookup answered %d: %r" % (status, body))
        return sorted(_producer_addr(p) for p in json.loads(body)["producers"])

    def nodes(self):
        """The ``"host:port"`` (TCP) of each nsqd ``/nodes`` lists, sorted."""
        return sorted(_producer_addr(p) for p in self.get("/nodes")["producers"])


def _producer_addr(producer):
    return join_host_port(producer["broadcast_address"], producer["tcp_port"])
