#!/usr/bin/env python3
"""The floor probe: the least a threaded Python broker must do per message.

    python scripts/benchmarks/floor.py serve      # a floor server on 127.0.0.1:<ephemeral>
    scripts/bench floor [--go-tools DIR] [--python pypy3]   # measure it alone

The server speaks just enough of the TCP protocol for the single-PUB and round-trip
loads (Go's ``pub_probe``/``rtt_probe`` or this project's ``writer``/``roundtrip``):
the magic, ``PUB`` (answered ``OK``; the body copied out and kept, as a broker keeps
a message in memory), ``SUB`` (``OK``), ``RDY``/``FIN``/``NOP`` (read, nothing else).
Each PUB is also delivered as a ``MESSAGE`` frame to the connection that subscribed
last, if any.  One thread per connection, ``recv_into`` one reused buffer per
connection, ``sendall`` for every answer: the same socket work a broker does, and
nothing else (no topics, channels, in-flight bookkeeping, timeouts or IDs worth the
name).  Reading a broker's CPU per message against this one's tells how much of it
is the broker's own work rather than the interpreter's socket and thread floor.

``serve`` needs nothing but the standard library (it runs under any interpreter
without the project on the path); ``scripts/bench --compare GO_NSQD --floor`` adds
it as a column for the phases it can serve (``pub-mem``, ``rtt``).
"""

import argparse
import signal
import socket
import struct
import sys
import threading
import time

_OK = struct.pack(">ii", 6, 0) + b"OK"
_MESSAGE_HEADER = struct.Struct(">iiqH16s")  # size, frame type 2, timestamp, attempts, id
_INVALID = b"E_INVALID floor: unknown command"


class FloorServer:
    """Accepts connections; one thread each.

    ``_lock`` guards ``_subscriber`` (the connection PUBs are delivered to) and
    ``_next_id``; each connection's writes to the subscriber happen under that
    subscriber's own ``write_lock`` (its own answers and the deliveries of every
    publisher meet there).
    """

    def __init__(self, host="127.0.0.1", port=0):
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((host, port))
        self.listener.listen(128)
        self._lock = threading.Lock()
        self._subscriber = None  # (socket, write lock)
        self._next_id = 0
        self.kept = []  # bodies PUBlished while nobody subscribed (list.append is atomic)

    def serve_forever(self):
        n = 0
        while True:
            sock, _ = self.listener.accept()
            n += 1
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # Connection threads end with their connection; the process ends with SIGTERM, which
            # only this thread may take: blocked around the start, the new thread inherits the mask
            # from its first instruction (a SIGTERM meanwhile waits, and comes here once unblocked).
            # Taken by a connection thread, it would only set Python's flag while this thread stays
            # blocked in accept() (under valgrind, which picks the thread, the probe never ended).
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            try:
                threading.Thread(target=self._serve, args=(sock,), name="floor-conn-%d" % n, daemon=True).start()
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    def _serve(self, sock):
        try:
            self._commands(sock)
        except (OSError, ValueError):
            pass
        finally:
            with self._lock:
                if self._subscriber is not None and self._subscriber[0] is sock:
                    self._subscriber = None
            sock.close()

    def _commands(self, sock):
        buf = bytearray(65536)
        view = memoryview(buf)
        start = end = 0
        write_lock = threading.Lock()  # this connection's writes: its answers, deliveries to it

        def fill(need):
            """Read until buf[start:end] holds ``need`` bytes; returns the new (start, end)."""
            nonlocal buf, view, start, end
            while end - start < need:
                if start == end:
                    start = end = 0
                elif len(buf) - start < need:  # move the partial command to the front
                    if need > len(buf):
                        view.release()
                        buf = buf[start:end] + bytearray(max(need, 2 * len(buf)) - (end - start))
                        view = memoryview(buf)
                    else:
                        buf[:end - start] = buf[start:end]
                    end -= start
                    start = 0
                n = sock.recv_into(view[end:])
                if not n:
                    raise OSError("closed")
                end += n

        fill(4)
        if buf[start:start + 4] != b"  V2":
            return
        start += 4
        while True:
            nl = buf.find(b"\n", start, end)
            while nl < 0:
                fill(end - start + 1)
                nl = buf.find(b"\n", start, end)
            line = bytes(view[start:nl])
            start = nl + 1
            if line.startswith(b"PUB "):
                fill(4)
                size = int.from_bytes(buf[start:start + 4], "big")
                start += 4
                fill(size)
                body = bytes(view[start:start + size])
                start += size
                with write_lock:
                    sock.sendall(_OK)
                self._deliver(body)
            elif line.startswith(b"SUB "):
                with self._lock:
                    self._subscriber = (sock, write_lock)
                with write_lock:
                    sock.sendall(_OK)
            elif line.startswith((b"FIN ", b"RDY ", b"NOP", b"TOUCH ")):
                pass
            elif line.startswith(b"CLS"):
                with write_lock:
                    sock.sendall(struct.pack(">ii", 14, 0) + b"CLOSE_WAIT")
            else:
                with write_lock:
                    sock.sendall(struct.pack(">ii", 4 + len(_INVALID), 1) + _INVALID)
                return

    def _deliver(self, body):
        with self._lock:
            subscriber = self._subscriber
            self._next_id += 1
            msg_id = b"%016x" % self._next_id
        if subscriber is None:
            self.kept.append(body)
            return
        sock, write_lock = subscriber
        frame = _MESSAGE_HEADER.pack(4 + 8 + 2 + 16 + len(body), 2, time.time_ns(), 1, msg_id) + body
        try:
            with write_lock:
                sock.sendall(frame)
        except OSError:
            pass  # the subscriber went away: its own thread cleans up


def measure(argv):
    """``scripts/bench floor``: the floor alone, under the single-PUB and round-trip loads."""
    from . import tools as load_tools
    from .common import BrokerProc, interpreter

    ap = argparse.ArgumentParser(prog="scripts/bench floor", description=__doc__.split("\n")[0])
    ap.add_argument("--python", default=sys.executable, help="interpreter that runs the floor server")
    ap.add_argument("--go-tools", metavar="DIR", help="drive it with Go's pub_probe/rtt_probe from DIR")
    ap.add_argument("--runfor", type=float, default=5.0, help="seconds of single PUB")
    ap.add_argument("--rtt-count", type=int, default=5000)
    a = ap.parse_args(argv)
    tools = load_tools.choose(a.go_tools)
    with BrokerProc("floor", a.python) as floor:
        cpu = floor.cpu_seconds()
        rate = tools.pub(floor.address, "floor", a.runfor)
        cpu = floor.cpu_seconds() - cpu
    with BrokerProc("floor", a.python) as floor:
        cpu_rtt = floor.cpu_seconds()
        p99 = tools.rtt_p99(floor.address, a.rtt_count)
        cpu_rtt = floor.cpu_seconds() - cpu_rtt
    print("floor under %s, load from %s" % (interpreter(a.python), tools.name))
    print("single PUB, 2 conns: %.0f msg/s, %.2f us CPU per PUB" % (rate, cpu / (rate * a.runfor) * 1e6))
    print("publish-to-delivery p99: %.1f us, %.2f us CPU per round trip" % (p99, cpu_rtt / a.rtt_count * 1e6))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        # SIGTERM ends the process through SystemExit, as a broker's clean stop (and a profiler
        # watching it, such as callgrind, writes its counts at exit).
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
        FloorServer().serve_forever()
    else:
        measure(argv)


if __name__ == "__main__":
    main()
