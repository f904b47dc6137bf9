"""TornadoLoop: run a tornado-based client (pynsq) in a test until something holds, bounded in time.

::

    from nsqd_threaded.testing.tornado_loop import TornadoLoop

    with TornadoLoop() as loop:             # a new event loop, current in this thread
        reader = nsq.Reader(...)            # pynsq objects made now run on it
        loop.run_until(lambda: received, timeout=10)

tornado is not a dependency of this package: it is imported when a
:class:`TornadoLoop` is made.  No deprecated tornado API is used (no
``IOLoop.make_current()``, no ``IOLoop()`` constructor outside a running loop):
the loop is a new asyncio event loop set as this thread's current one, which
``IOLoop.current()`` (what pynsq asks when it is made) wraps, on tornado 6.0
as on the newest.
"""

import time

POLL_INTERVAL = 0.005  # seconds between two looks at the predicate while the loop runs


class TornadoLoop:
    """A private event loop for tornado clients in this thread; :meth:`close` (or ``with``) ends it.

    :attr:`io_loop` is its tornado ``IOLoop`` and :attr:`asyncio_loop` the
    asyncio loop under it.  Make the client objects after this (pynsq binds
    to ``IOLoop.current()`` when one is made); run the loop with
    :meth:`run_until`.
    """

    def __init__(self):
        import asyncio

        import tornado.ioloop

        self._asyncio = asyncio
        self.asyncio_loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.asyncio_loop)
        self.io_loop = tornado.ioloop.IOLoop.current()

    def run_until(self, predicate, timeout=10.0):
        """Run the loop until ``predicate()`` is true; return its value.

        A predicate that raises is "not yet" (a stats dict without the channel
        yet, a client not connected yet).  After ``timeout`` seconds raises
        :class:`TimeoutError`, chained to the predicate's last exception if it raised.
        """
        asyncio = self._asyncio
        deadline = time.monotonic() + timeout
        last_error = [None]

        def holds():
            try:
                value = predicate()
            except Exception as e:  # "not yet"; reported if it never holds
                last_error[0] = e
                return None
            last_error[0] = None
            return value

        async def wait():
            while True:
                value = holds()
                if value:
                    return value
                if time.monotonic() >= deadline:
                    return value
                await asyncio.sleep(POLL_INTERVAL)

        value = self.asyncio_loop.run_until_complete(wait())
        if not value:
            error = TimeoutError("not true after %gs: %r" % (timeout, predicate))
            if last_error[0] is not None:
                raise error from last_error[0]
            raise error
        return value

    def close(self):
        """Close the loop and every file descriptor registered with it; no loop is current afterwards."""
        self.io_loop.close(all_fds=True)
        if not self.asyncio_loop.is_closed():
            self.asyncio_loop.close()
        self._asyncio.set_event_loop(None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

