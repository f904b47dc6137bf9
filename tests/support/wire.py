"""A raw-socket NSQ test client: exact bytes in, exact frames out."""

import json
import socket
import struct
import threading
import time

from nsqd_threaded.wire import protocol_v2


class Conn:
    """One V2 connection.  Every read is bounded by ``timeout`` seconds."""

    def __init__(self, address, magic=protocol_v2.MAGIC_V2, timeout=10.0):
        self.sock = socket.create_connection(address, timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        if magic:
            self.sock.sendall(magic)

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send(self, data):
        self.sock.sendall(data)

    def cmd(self, line, body=None):
        """Send a command line, and a size-prefixed body if given."""
        data = line + b"\n"
        if body is not None:
            data += struct.pack(">i", len(body)) + body
        self.sock.sendall(data)

    def _recv_exact(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("connection closed with %d of %d bytes" % (len(self.buf), n))
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def read_raw_frame(self):
        size = struct.unpack(">i", self._recv_exact(4))[0]
        return struct.pack(">i", size) + self._recv_exact(size)

    def read_frame(self, skip_heartbeats=True):
        """``(frame_type, data)`` of the next frame."""
        while True:
            ft, data = protocol_v2.decode_frame(self.read_raw_frame())
            if skip_heartbeats and ft == 0 and data == b"_heartbeat_":
                continue
            return ft, data

    def read_response(self):
        ft, data = self.read_frame()
        assert ft == protocol_v2.FRAME_TYPE_RESPONSE, (ft, data)
        return data

    def read_error(self):
        ft, data = self.read_frame()
        assert ft == protocol_v2.FRAME_TYPE_ERROR, (ft, data)
        return data.decode()

    def read_message(self):
        """``(timestamp, attempts, id, body)`` of the next message frame."""
        ft, data = self.read_frame()
        assert ft == protocol_v2.FRAME_TYPE_MESSAGE, (ft, data)
        return protocol_v2.decode_message(data)

    def identify(self, **fields):
        self.cmd(b"IDENTIFY", json.dumps(fields).encode())
        return self.read_response()

    def sub(self, topic, channel, rdy=None):
        self.cmd(b"SUB %s %s" % (topic.encode(), channel.encode()))
        assert self.read_response() == b"OK"
        if rdy is not None:
            self.cmd(b"RDY %d" % rdy)

    def pub(self, topic, body):
        self.cmd(b"PUB " + topic.encode(), body)
        return self.read_response()

    def mpub(self, topic, bodies):
        self.cmd(b"MPUB " + topic.encode(), protocol_v2.encode_mpub_body(bodies))
        return self.read_response()

    def assert_closed(self, timeout=5.0):
        """The server closed the connection (EOF, or a reset) within ``timeout``."""
        self.sock.settimeout(timeout)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return
                self.buf += chunk
        except ConnectionResetError:
            return
        raise AssertionError("connection still open")

    def assert_silent(self, seconds=0.3):
        """No frame arrives within ``seconds`` (used after commands that answer nothing)."""
        self.sock.settimeout(seconds)
        try:
            chunk = self.sock.recv(65536)
        except socket.timeout:
            return
        finally:
            self.sock.settimeout(10.0)
        raise AssertionError("unexpected data %r" % chunk)


def wait_for(predicate, timeout=10.0, interval=0.01, what="condition"):
    """Poll ``predicate`` until true (returns its value) or fail after ``timeout`` seconds.

    The tests' one poller: every other wait in tests/ is an event or goes
    through here.  ``what`` names the awaited condition in the failure (a
    callable is called then, to describe the state at the deadline).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %ss waiting for %s" % (timeout, what() if callable(what) else what))
        time.sleep(interval)  # the pause between polls, bounded by the deadline above


class SilentNSQD:
    """A fake nsqd that completes the handshake, reads one PUB and never answers it.

    It then closes the connection at once, or with ``hold`` keeps it open until :meth:`close`.
    """

    def __init__(self, hold=False):
        self.hold = hold
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1)
        self.address = self.listener.getsockname()
        self.got_pub = threading.Event()
        self.conn = None  # the producer's connection, once accepted
        self.thread = threading.Thread(target=self._serve, name="vanishing-nsqd", daemon=True)
        self.thread.start()

    def _serve(self):
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        self.conn = conn
        with conn:
            conn.settimeout(30)
            buf = bytearray()

            def more():
                chunk = conn.recv(4096)
                buf.extend(chunk)
                return bool(chunk)

            while b"IDENTIFY\n" not in buf or len(buf) < buf.index(b"IDENTIFY\n") + 13:
                if not more():
                    return
            start = buf.index(b"IDENTIFY\n") + 9
            size = struct.unpack(">i", bytes(buf[start:start + 4]))[0]
            while len(buf) < start + 4 + size:
                if not more():
                    return
            conn.sendall(struct.pack(">ii", 6, 0) + b"OK")
            del buf[:start + 4 + size]
            while b"PUB " not in buf:
                if not more():
                    return
            self.got_pub.set()
            while self.hold and more():
                pass  # read on, answer nothing, until close()
        # closed without an answer

    def close(self):
        conn = self.conn
        if conn is not None:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        else:  # never connected: wake the accept
            socket.create_connection(self.address, timeout=10).close()
        self.listener.close()
        self.thread.join(10)
