"""What a client says about its connections, in go-nsq's words: ``1 [orders/billing] (127.0.0.1:4150) IO error - EOF``.

A Consumer or Producer logs each connection event (connecting, a failed
dial, an IO error naming the address, re-connecting, each nsqlookupd query
and its failure) through a :class:`ClientLog`.  Its ``logger`` is any object
with ``debug``/``info``/``warn``/``error(fmt, *args)`` (the tools pass their
own :class:`~nsqd_threaded.internal.logger.Logger`, so the lines carry the
tool's prefix, time and level); without one the lines go to the ``logging``
module's ``nsqd_threaded.client`` logger, for an application to route.
"""

import http.client
import logging

from ..internal.gocompat import go_quote
from .connection import EndOfStream, format_address, os_error_words

_LOGGING = logging.getLogger("nsqd_threaded.client")


class _ToLogging:
    """The ``logging`` module under the Logger's method names."""

    @staticmethod
    def debug(fmt, *args):
        _LOGGING.debug(fmt, *args)

    @staticmethod
    def info(fmt, *args):
        _LOGGING.info(fmt, *args)

    @staticmethod
    def warn(fmt, *args):
        _LOGGING.warning(fmt, *args)

    @staticmethod
    def error(fmt, *args):
        _LOGGING.error(fmt, *args)


class ClientLog:
    """One client's log: go-nsq's ``%3d [topic/channel] `` head (a producer has no topic), then the event.

    ``instance`` is go-nsq's instance number (a tool numbers its clients from 1);
    :meth:`conn` adds ``(address) `` as go-nsq does for a connection's events.
    """

    def __init__(self, logger=None, instance=1, topic=None, channel=None):
        self.logger = logger if logger is not None else _ToLogging
        self.head = "%3d [%s/%s] " % (instance, topic, channel) if topic is not None else "%3d " % instance

    def _log(self, method, fmt, args):
        try:
            method(self.head + fmt, *args)
        except Exception:  # a failing log must never take a connection thread down
            pass

    def debug(self, fmt, *args):
        self._log(self.logger.debug, fmt, args)

    def info(self, fmt, *args):
        self._log(self.logger.info, fmt, args)

    def warn(self, fmt, *args):
        self._log(self.logger.warn, fmt, args)

    def error(self, fmt, *args):
        self._log(self.logger.error, fmt, args)

    def exception(self, fmt, *args):
        """An error with the traceback of the exception being handled (``logging``'s), else one line."""
        if self.logger is _ToLogging:
            _LOGGING.exception(self.head + fmt, *args)
        else:
            self.error(fmt, *args)

    def conn(self, level, address, fmt, *args):
        """``(address) `` then the event, at ``level`` (``"info"``, ``"warn"``, ``"error"``, ``"debug"``)."""
        self._log(getattr(self.logger, level), "(%s) " + fmt, (format_address(address),) + args)


def error_words(exc):
    """An exception in go-nsq's words: ``EOF`` when nsqd closed the connection, else the OS's (lower case)."""
    if isinstance(exc, EndOfStream):
        return "EOF"
    return os_error_words(exc)


def dial_words(exc, address):
    """A failed dial as Go says it: ``dial tcp 127.0.0.1:4150: connect: connection refused``."""
    if not isinstance(exc, OSError) or not exc.strerror or isinstance(exc, TimeoutError):
        return error_words(exc)
    network = "unix" if isinstance(address, str) else "tcp"
    return "dial %s %s: connect: %s" % (network, format_address(address), error_words(exc))


def lookupd_status_words(status, body):
    """go-nsq's words for a lookupd answer other than 200: ``got response 404 Not Found "{...}"``."""
    return "got response %d %s %s" % (status, http.client.responses.get(status, ""), go_quote(body))
