"""TornadoLoop's first home: it lives in :mod:`nsqd_threaded.testing.loops` (also importable as
``nsqd_threaded.testing.TornadoLoop``), beside :class:`~nsqd_threaded.testing.loops.AsyncioLoop`."""

from .loops import POLL_INTERVAL, TornadoLoop

__all__ = ["POLL_INTERVAL", "TornadoLoop"]
