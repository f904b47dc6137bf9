"""Helpers of the HTTP edge's hardening tests: raw requests over a socket and what to expect back."""

import select
import socket
import time

import pytest

from support.wire import wait_for

JSON_TYPE = "application/json; charset=utf-8"


class Reply:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers
        self.body = body

    def __repr__(self):
        return "Reply(%r, %r, %r)" % (self.status, self.headers, self.body)


class RawHTTP:
    """One client socket to a broker's HTTP port: exact bytes out, parsed replies in."""

    def __init__(self, nsqd, timeout=10.0):
        self.sock = socket.create_connection(nsqd.http_address, timeout=timeout)
        self.buf = b""

    def close(self):
        self.sock.close()

    def send(self, data):
        self.sock.sendall(data)

    def _fill(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            raise EOFError("connection closed; unread %r" % self.buf)
        self.buf += chunk

    def read_reply(self):
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        n = int(headers.get("content-length", "0"))
        while len(self.buf) < n:
            self._fill()
        body, self.buf = self.buf[:n], self.buf[n:]
        return Reply(status, headers, body)

    def assert_closed(self, timeout=10.0):
        """The server closes the connection with nothing more to say (EOF or reset) within ``timeout``."""
        self.sock.settimeout(timeout)
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    break
                self.buf += chunk
        except ConnectionResetError:
            pass
        assert self.buf == b"", "data after the reply: %r" % self.buf

    def closed_within(self, timeout):
        """True when the server closes the connection (EOF or reset) within ``timeout`` seconds.

        Whatever it sends before is kept in ``buf``.
        """
        deadline = time.monotonic() + timeout
        while True:
            r, _, _ = select.select([self.sock], [], [], max(0.0, deadline - time.monotonic()))
            if not r:
                return False
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                return True
            if not chunk:
                return True
            self.buf += chunk


@pytest.fixture
def raw(nsqd):
    clients = []

    def connect(broker=nsqd, **kw):
        c = RawHTTP(broker, **kw)
        clients.append(c)
        return c

    yield connect
    for c in clients:
        c.close()


def log_text(nsqd):
    return nsqd.log.stream.getvalue()


def assert_error(reply, status, message, close=False):
    assert (reply.status, reply.body) == (status, b'{"message":"%s"}' % message.encode()), reply
    assert reply.headers["content-type"] == JSON_TYPE
    assert reply.headers["x-nsq-content-type"] == "nsq; version=1.0"
    if close:
        assert reply.headers.get("connection") == "close", reply


def assert_no_traceback(nsqd, capfd=None):
    text = log_text(nsqd)
    assert "Traceback" not in text and "ERROR" not in text, text
    if capfd is not None:
        err = capfd.readouterr().err
        assert "Traceback" not in err, err


def pub_head(topic, extra, method="POST"):
    return ("%s /pub?topic=%s HTTP/1.1\r\nHost: x\r\n%s\r\n" % (method, topic, extra)).encode()


def connections_drained(nsqd):
    wait_for(lambda: nsqd._http_server.connection_count() == 0, what="HTTP connections to close")
