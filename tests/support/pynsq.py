"""Running pynsq (tornado) clients against a broker inside a test, bounded in time."""

import time

import nsq
import tornado.ioloop


class Loop:
    """A private tornado IOLoop: ``run_until(predicate, timeout)`` never hangs a test."""

    def __init__(self):
        self.io_loop = tornado.ioloop.IOLoop()
        self.io_loop.make_current()
        self.readers = []
        self.writers = []

    def writer(self, address):
        w = nsq.Writer([address])
        self.writers.append(w)
        return w

    def reader(self, address, topic, channel, handler, **kwargs):
        kwargs.setdefault("max_in_flight", 100)
        kwargs.setdefault("lookupd_poll_interval", 3600)
        r = nsq.Reader(
            topic=topic, channel=channel, message_handler=handler, nsqd_tcp_addresses=[address], **kwargs
        )
        self.readers.append(r)
        return r

    def run_until(self, predicate, timeout=30.0, what="condition"):
        """Run the loop until ``predicate()`` is true; fail after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        result = {}

        def check():
            if predicate():
                result["ok"] = True
                self.io_loop.stop()
            elif time.monotonic() > deadline:
                self.io_loop.stop()
            else:
                self.io_loop.call_later(0.005, check)

        self.io_loop.add_callback(check)
        self.io_loop.start()
        assert result.get("ok"), "timed out waiting for %s" % what

    def run_for(self, seconds):
        """Let the clients work for a while (used only to show that nothing more arrives)."""
        self.io_loop.call_later(seconds, self.io_loop.stop)
        self.io_loop.start()

    def wait_writers_connected(self, timeout=10.0):
        self.run_until(lambda: all(w.conns for w in self.writers), timeout, "writer connections")

    def publish(self, writer, topic, bodies, batch=100):
        """MPUB bodies in batches; returns a dict of results filled by the callbacks."""
        state = {"ok": 0, "errors": []}

        def cb(conn, data):
            if isinstance(data, nsq.Error):
                state["errors"].append(data)
            else:
                state["ok"] += 1

        for i in range(0, len(bodies), batch):
            chunk = bodies[i : i + batch]
            if len(chunk) == 1:
                writer.pub(topic, chunk[0], callback=cb)
            else:
                writer.mpub(topic, chunk, callback=cb)
        return state

    def close(self):
        for r in self.readers:
            r.close()
        for w in self.writers:
            for conn in list(w.conns.values()):
                conn.close()
        # Let the closes run, then drop the loop.
        self.io_loop.call_later(0.05, self.io_loop.stop)
        self.io_loop.start()
        self.io_loop.close(all_fds=True)
