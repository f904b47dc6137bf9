"""Threads that only serve work start with their first: a broker that never has any never starts them."""

import threading
import urllib.request

import pytest

from nsqd_threaded import NSQD, Options
from nsqd_threaded.server.idle import IDLE_AFTER

from support.logs import LogCapture
from support.wire import Conn, wait_for


@pytest.mark.timeout(60)
def test_metadata_writer_and_idle_watcher_start_with_their_first_work_and_are_joined(tmp_path):
    nsqd = NSQD(Options(data_path=str(tmp_path), tcp_address="127.0.0.1:0", http_address="127.0.0.1:0",
                        connection_threads=True),  # (the idle watcher parks connection threads)
                log_stream=LogCapture()).start()
    try:
        assert nsqd._metadata_writer is None  # nothing changed yet
        nsqd.get_topic("first")  # waits until nsqd.dat lists it: the writer wrote it
        writer = nsqd._metadata_writer
        assert writer is not None and writer.name == "nsqd-metadata" and writer.is_alive()
        assert b'"name":"first"' in (tmp_path / "nsqd.dat").read_bytes()
        nsqd.get_topic("second")
        assert nsqd._metadata_writer is writer  # one writer for every change
        watcher = nsqd.idle_watcher
        if watcher is not None:  # (epoll: Linux)
            assert watcher._thread is None  # no connection has been idle
            with Conn(nsqd.tcp_address) as conn:
                wait_for(lambda: watcher._thread is not None, timeout=IDLE_AFTER * 40, what="idle watcher")
                assert watcher._thread.name == "nsqd-idle-watch"
                conn.pub("first", b"from a parked connection")  # still served
            thread = watcher._thread
    finally:
        nsqd.stop()
    assert not writer.is_alive()
    if watcher is not None:
        assert not thread.is_alive()
    assert b'"name":"second"' in (tmp_path / "nsqd.dat").read_bytes()


def test_a_broker_without_work_starts_and_stops_without_them(tmp_path):
    nsqd = NSQD(Options(data_path=str(tmp_path), tcp_address="127.0.0.1:0", http_address="127.0.0.1:0"),
                log_stream=LogCapture()).start()
    try:
        assert nsqd._metadata_writer is None
        assert nsqd.idle_watcher is None or nsqd.idle_watcher._thread is None
    finally:
        nsqd.stop()
    assert (tmp_path / "nsqd.dat").read_bytes() == b'{"topics":null,"version":"1.3.0"}'


def starters():
    return [t for t in threading.enumerate() if t.name in ("nsqd-conn-starter", "nsqd-http-starter")]


@pytest.mark.timeout(60)
def test_each_listener_starts_its_connection_threads_from_a_starter_made_with_its_first_connection(tmp_path):
    """The accept thread only accepts: a listener's first connection makes its starter thread, which
    starts every connection thread after it, and the broker's stop joins it."""
    before = starters()
    nsqd = NSQD(Options(data_path=str(tmp_path), tcp_address="127.0.0.1:0", http_address="127.0.0.1:0",
                        connection_threads=True),  # (TCP connections with threads of their own)
                log_stream=LogCapture()).start()
    try:
        assert starters() == before  # no connection yet
        conns = [Conn(nsqd.tcp_address) for _ in range(20)]  # their threads, started in accept order
        try:
            for i, conn in enumerate(conns):
                conn.pub("t", b"%d" % i)
        finally:
            for conn in conns:
                conn.close()
        (tcp_starter,) = [t for t in starters() if t not in before]
        assert tcp_starter.name == "nsqd-conn-starter"
        with urllib.request.urlopen("http://%s:%d/ping" % nsqd.http_address, timeout=10) as resp:
            assert resp.read() == b"OK"
        (http_starter,) = [t for t in starters() if t not in before and t is not tcp_starter]
        assert http_starter.name == "nsqd-http-starter"
        assert nsqd.get_topic("t").depth() == 20
    finally:
        nsqd.stop()
    assert not tcp_starter.is_alive() and not http_starter.is_alive()
