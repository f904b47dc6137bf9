"""The HTTP edge against slow and departing clients: early disconnects, the read and idle deadlines, the
listeners' connections."""

import socket
import struct
import threading

import pytest

from support.http_raw import RawHTTP, assert_no_traceback, connections_drained, pub_head  # noqa: F401 (fixtures among them)
from support.wire import Conn, wait_for

# -- clients that leave early -----------------------------------------------------------------


def _reset(sock):
    """Close with an RST, as a client killed mid-request does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


@pytest.mark.timeout(60)
def test_client_leaving_before_the_reply_is_not_a_traceback(nsqd, capfd):
    for _ in range(5):
        c = RawHTTP(nsqd)
        c.send(b"GET /stats HTTP/1.1\r\n\r\n" * 500)  # the replies outgrow the socket buffers
        c.read_reply()
        _reset(c.sock)
        c = RawHTTP(nsqd)
        c.send(pub_head("gone", "Content-Length: 100\r\n") + b"half")
        _reset(c.sock)
    connections_drained(nsqd)
    assert_no_traceback(nsqd, capfd)


# -- deadlines ----------------------------------------------------------------------------------


@pytest.fixture
def strict(make_nsqd):
    """A broker with tiny HTTP deadlines."""
    return make_nsqd(http_read_timeout=0.3, http_idle_timeout=0.3)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "partial",
    [
        b"",  # connected, silent
        b"POST /pub?topic=stall HTTP/1.1\r\nContent-Le",  # half a head
        b"POST /pub?topic=stall HTTP/1.1\r\nContent-Length: 10\r\n\r\nhalf",  # half a body
        b"POST /pub?topic=stall HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",  # half a chunk
    ],
)
def test_stalled_client_is_dropped(strict, partial):
    c = RawHTTP(strict)
    try:
        c.send(partial)
        assert c.closed_within(10.0)
        if partial.endswith(b"\r\n\r\n") or b"\r\n\r\n" in partial:  # a stalled body gets nsqd's read error
            assert c.read_reply().status == 500
        assert c.buf == b""
    finally:
        c.close()
    connections_drained(strict)
    assert strict.get_existing_topic("stall") is None
    assert_no_traceback(strict)


@pytest.mark.timeout(30)
def test_trickling_head_is_dropped_by_the_request_deadline(strict):
    """One byte at a time, each well within any per-read timeout, still ends at the deadline."""
    head = b"GET /ping HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 10000 + b"\r\n\r\n"
    c = RawHTTP(strict)
    sent = 0
    try:
        for byte in head:
            try:
                c.send(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += 1
            if c.closed_within(0.02):
                break
        else:
            pytest.fail("the whole trickled head was accepted")
    finally:
        c.close()
    assert sent < len(head)


@pytest.mark.timeout(30)
def test_idle_keep_alive_connection_is_dropped(strict):
    c = RawHTTP(strict)
    try:
        c.send(b"GET /ping HTTP/1.1\r\n\r\n")
        assert c.read_reply().body == b"OK"
        assert c.closed_within(10.0)
    finally:
        c.close()


@pytest.mark.timeout(30)
def test_silent_new_connection_is_bound_by_the_read_timeout_not_the_idle_one(make_nsqd):
    """A connection that never starts a request is stalled, not idle: the long idle timeout is for keep-alives."""
    nsqd = make_nsqd(http_read_timeout=0.3, http_idle_timeout=600.0)
    silent = RawHTTP(nsqd)
    kept = RawHTTP(nsqd)
    try:
        kept.send(b"GET /ping HTTP/1.1\r\n\r\n")
        assert kept.read_reply().body == b"OK"
        assert silent.closed_within(10.0)
        assert not kept.closed_within(0.5)  # well past the read timeout: a kept-alive connection stays
        kept.send(b"GET /ping HTTP/1.1\r\n\r\n")
        assert kept.read_reply().body == b"OK"
    finally:
        silent.close()
        kept.close()


@pytest.mark.timeout(60)
def test_fifty_stalled_clients_are_dropped_while_others_are_served(strict):
    clients = [RawHTTP(strict) for _ in range(50)]
    try:
        for i, c in enumerate(clients):
            c.send(b"POST /pub?topic=t HTTP/1.1\r\nContent-Length: 10\r\n"[: i % 40])
        ok = RawHTTP(strict)
        ok.send(b"GET /ping HTTP/1.1\r\n\r\n")
        assert ok.read_reply().body == b"OK"
        ok.close()
        connections_drained(strict)
    finally:
        for c in clients:
            c.close()


@pytest.mark.timeout(60)
def test_ordinary_keep_alive_client_is_never_dropped(make_nsqd):
    """Pauses between requests and inside a body, all within the deadlines, on one connection."""
    nsqd = make_nsqd(http_read_timeout=5.0, http_idle_timeout=5.0)
    c = RawHTTP(nsqd)
    pause = threading.Event()
    try:
        for i in range(5):
            c.send(pub_head("steady", "Content-Length: 5\r\n") + b"he")
            pause.wait(0.1)
            c.send(b"llo")
            r = c.read_reply()
            assert (r.status, r.body) == (200, b"OK")
            assert "connection" not in r.headers
            pause.wait(0.2)
    finally:
        c.close()
    assert nsqd.get_existing_topic("steady").depth() == 5


def test_deadline_options_are_durations():
    from nsqd_threaded.settings.options import DURATION, DURATION_OPTIONS, SETTINGS, OptionError, Options

    opts = Options()
    assert (opts.http_read_timeout, opts.http_idle_timeout) == (30.0, 60.0)
    kinds = {s.flag: s.kind for s in SETTINGS}
    assert kinds["http-read-timeout"] is kinds["http-idle-timeout"] is DURATION
    assert {"http_read_timeout", "http_idle_timeout"} <= DURATION_OPTIONS
    for field in ("http_read_timeout", "http_idle_timeout"):
        with pytest.raises(OptionError):
            Options(**{field: 0}).validate()


@pytest.mark.timeout(30)
def test_deadlines_from_the_command_line_and_config(tmp_path):
    from nsqd_threaded import cli

    def options_for(*args):
        return cli.resolve(cli.main.make_context("nsqd-threaded", list(args)).params)[0]

    opts = options_for("--http-read-timeout=300ms", "--http-idle-timeout=2m")
    assert (opts.http_read_timeout, opts.http_idle_timeout) == (0.3, 120.0)
    cfg = tmp_path / "nsqd.cfg"
    cfg.write_text('http_read_timeout = "1.5s"\nhttp_idle_timeout = 2500\n')
    opts = options_for("--config", str(cfg))
    assert (opts.http_read_timeout, opts.http_idle_timeout) == (1.5, 2.5)


@pytest.mark.timeout(30)
def test_config_shows_the_deadlines_in_ns(make_nsqd):
    nsqd = make_nsqd(http_read_timeout=1.5)
    c = RawHTTP(nsqd)
    try:
        c.send(b"GET /config/http_read_timeout HTTP/1.1\r\n\r\nGET /config/http_idle_timeout HTTP/1.1\r\n\r\n")
        assert c.read_reply().body == b"1500000000"
        assert c.read_reply().body == b"60000000000"
    finally:
        c.close()


# -- the listeners' connections ---------------------------------------------------------------


@pytest.mark.timeout(30)
def test_stop_closes_every_connection_and_joins_its_threads(make_nsqd):
    nsqd = make_nsqd()
    http_idle = RawHTTP(nsqd)
    http_mid = RawHTTP(nsqd)
    http_mid.send(pub_head("mid", "Content-Length: 10\r\n") + b"half")
    tcp = Conn(nsqd.tcp_address)
    tcp.identify()
    http_idle.send(b"GET /ping HTTP/1.1\r\n\r\n")
    assert http_idle.read_reply().body == b"OK"
    ports = {s.getsockname()[1] for s in (http_idle.sock, http_mid.sock, tcp.sock)}
    wait_for(lambda: nsqd._tcp_server.connection_count() == 1 and nsqd._http_server.connection_count() == 2)
    nsqd.stop()
    try:
        assert http_idle.closed_within(10.0)
        assert http_mid.closed_within(10.0)
        tcp.assert_closed()
        for t in threading.enumerate():
            assert not any(str(p) in t.name for p in ports), t.name
        assert nsqd._tcp_server.connection_count() == 0
        assert nsqd._http_server.connection_count() == 0
    finally:
        http_idle.close()
        http_mid.close()
        tcp.close()
