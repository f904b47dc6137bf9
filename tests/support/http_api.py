"""Helpers of the HTTP API tests: a small client (HTTP) and assertions on nsqd's answers."""

import collections
import http.client
import json
import struct
import urllib.parse

import pytest

JSON_TYPE = "application/json; charset=utf-8"


TEXT_TYPE = "text/plain; charset=utf-8"


X_NSQ = "nsq; version=1.0"


Resp = collections.namedtuple("Resp", "status headers body")


class HTTP:
    """One HTTP/1.1 keep-alive connection to a broker (http.client reconnects if the server closed it)."""

    def __init__(self, nsqd, timeout=10.0):
        host, port = nsqd.http_address
        self.conn = http.client.HTTPConnection(host, port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, chunked=False):
        self.conn.request(method, path, body=body, headers=headers or {}, encode_chunked=chunked)
        resp = self.conn.getresponse()
        return Resp(resp.status, resp.headers, resp.read())

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, body=None, **kw):
        return self.request("POST", path, body=body, **kw)

    def put(self, path, body=None, **kw):
        return self.request("PUT", path, body=body, **kw)

    def stats(self, **params):
        """/stats?format=json with the given parameters, decoded (key order kept)."""
        r = self.get("/stats?" + urllib.parse.urlencode(dict(format="json", **params)))
        assert r.status == 200, r
        return json.loads(r.body)

    def close(self):
        self.conn.close()


@pytest.fixture
def h(nsqd):
    client = HTTP(nsqd)
    yield client
    client.close()


def error_body(message):
    return b'{"message":"%s"}' % message.encode()


def assert_error(r, status, message):
    """A V1 error (§2): ``{"message":"TEXT"}``, JSON content type, X-NSQ-Content-Type."""
    assert (r.status, r.body) == (status, error_body(message))
    assert r.headers["Content-Type"] == JSON_TYPE
    assert r.headers["X-NSQ-Content-Type"] == X_NSQ


def assert_text(r, body):
    """A V1 string result: 200, raw text, sniffed text/plain, X-NSQ-Content-Type."""
    assert (r.status, r.body) == (200, body)
    assert r.headers["Content-Type"] == TEXT_TYPE
    assert r.headers["X-NSQ-Content-Type"] == X_NSQ


def assert_empty(r):
    """A V1 nil result: 200, empty body, Content-Length 0, no Content-Type."""
    assert (r.status, r.body) == (200, b"")
    assert r.headers["Content-Length"] == "0"
    assert "Content-Type" not in r.headers
    assert r.headers["X-NSQ-Content-Type"] == X_NSQ


def assert_json(r, body):
    """A V1 object/array/number result: compact JSON."""
    assert (r.status, r.body) == (200, body)
    assert r.headers["Content-Type"] == JSON_TYPE
    assert r.headers["X-NSQ-Content-Type"] == X_NSQ


def topic_doc(h, name):
    docs = h.stats(topic=name, include_mem="false")["topics"]
    assert docs is not None and len(docs) == 1, docs
    return docs[0]


def channel_doc(h, topic, channel):
    chans = topic_doc(h, topic)["channels"]
    matching = [c for c in chans if c["channel_name"] == channel]
    assert len(matching) == 1, chans
    return matching[0]


def mpub_body(bodies, count=None):
    out = struct.pack(">i", len(bodies) if count is None else count)
    for b in bodies:
        out += struct.pack(">i", len(b)) + b
    return out


def read_bodies(conn, n):
    return [conn.read_message()[3] for _ in range(n)]
