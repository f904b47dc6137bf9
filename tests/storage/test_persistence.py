"""Restart and durability through the broker: nsqd.dat, disk queues, graceful shutdown."""

import json
import os
import time

from nsqd_threaded import NSQD, Options

from support.logs import LogCapture
from support.wire import Conn, wait_for


def start(data, **kw):
    kw.setdefault("tcp_address", "127.0.0.1:0")
    kw.setdefault("http_address", "")
    kw.setdefault("node_id", 1)
    return NSQD(Options(data_path=str(data), **kw), log_stream=LogCapture()).start()


def test_graceful_restart_keeps_queued_in_flight_and_deferred_messages(tmp_path):
    nsqd = start(tmp_path, mem_queue_size=5)
    try:
        with Conn(nsqd.tcp_address) as pub:
            with Conn(nsqd.tcp_address) as sub:
                sub.sub("keep", "c", rdy=2)
                pub.mpub("keep", [b"m%d" % i for i in range(20)])
                inflight = [sub.read_message() for _ in range(2)]
                sub.cmd(b"REQ " + inflight[0][2] + b" 600000")  # deferred for 10 minutes
                wait_for(lambda: nsqd.get_existing_topic("keep").get_existing_channel("c").deferred_count() == 1)
                pub.cmd(b"DPUB keep 3600000", b"later")
                assert pub.read_response() == b"OK"
                # Stop while the second message is still in flight.
                nsqd.stop()
    finally:
        nsqd.stop()
    meta = json.loads((tmp_path / "nsqd.dat").read_bytes())
    assert meta == {"topics": [{"name": "keep", "paused": False, "channels": [{"name": "c", "paused": False}]}],
                    "version": "1.3.0"}
    nsqd = start(tmp_path)
    try:
        channel = nsqd.get_existing_topic("keep").get_existing_channel("c")
        # 18 never delivered + 1 in flight are immediate; the REQ'd one and the DPUB stay deferred.
        # Deferred records sit in the disk queue until read; they then wait out their delay.
        wait_for(lambda: channel.depth() + channel.deferred_count() == 21, what="messages restored")
        with Conn(nsqd.tcp_address) as sub:
            sub.sub("keep", "c", rdy=50)
            got = [sub.read_message() for _ in range(19)]
            sub.assert_silent(0.3)
            assert channel.deferred_count() == 2
        bodies = sorted(m[3] for m in got)
        expected = sorted([b"m%d" % i for i in range(20)])
        expected.remove(inflight[0][3])
        assert bodies == expected
        attempts = {m[3]: m[1] for m in got}
        assert attempts[inflight[1][3]] == 2  # it was delivered once before the restart
    finally:
        nsqd.stop()


def test_pause_survives_restart(tmp_path):
    nsqd = start(tmp_path)
    topic = nsqd.get_topic("pt")
    topic.get_channel("pc").pause()
    topic.pause()
    nsqd.persist_metadata()
    nsqd.stop()
    nsqd = start(tmp_path)
    try:
        topic = nsqd.get_existing_topic("pt")
        assert topic.paused and topic.get_existing_channel("pc").paused
    finally:
        nsqd.stop()


def test_nsqd_dat_exact_bytes_and_ephemeral_excluded(tmp_path):
    nsqd = start(tmp_path)
    try:
        assert (tmp_path / "nsqd.dat").read_bytes() == b'{"topics":null,"version":"1.3.0"}'
        nsqd.get_topic("h1")
        nsqd.get_topic("t2").get_channel("c")
        nsqd.get_topic("t2").get_channel("x#ephemeral")
        nsqd.get_topic("e#ephemeral").get_channel("c")
        assert nsqd.wait_metadata(10)  # creations are persisted by the broker's writer thread
        data = json.loads((tmp_path / "nsqd.dat").read_bytes())
        by_name = {t["name"]: t for t in data["topics"]}
        assert set(by_name) == {"h1", "t2"}
        assert by_name["h1"]["channels"] is None
        assert by_name["t2"]["channels"] == [{"name": "c", "paused": False}]
        assert list(by_name["t2"]) == ["name", "paused", "channels"]
    finally:
        nsqd.stop()


def test_topic_delete_removes_files_and_metadata(tmp_path):
    nsqd = start(tmp_path, mem_queue_size=0)
    try:
        with Conn(nsqd.tcp_address) as pub:
            pub.pub("gone", b"x")
        nsqd.get_topic("gone").get_channel("c")
        assert any(n.startswith("gone.diskqueue") for n in os.listdir(tmp_path))
        nsqd.delete_topic("gone")
        assert nsqd.wait_metadata(10)
        assert not any(n.startswith("gone") for n in os.listdir(tmp_path))
        assert json.loads((tmp_path / "nsqd.dat").read_bytes())["topics"] is None
    finally:
        nsqd.stop()


def test_data_path_is_locked(tmp_path):
    nsqd = start(tmp_path)
    try:
        try:
            start(tmp_path)
        except RuntimeError as e:
            assert "failed to lock data-path" in str(e)
        else:
            raise AssertionError("second broker started on a locked data path")
    finally:
        nsqd.stop()
    start(tmp_path).stop()  # released


def test_mem_queue_size_zero_goes_through_disk(tmp_path):
    nsqd = start(tmp_path, mem_queue_size=0)
    try:
        with Conn(nsqd.tcp_address) as sub:
            sub.sub("disk", "c")
            with Conn(nsqd.tcp_address) as pub:
                pub.mpub("disk", [b"a", b"b", b"c"])
            channel = nsqd.get_existing_topic("disk").get_existing_channel("c")
            assert channel.snapshot().backend_depth == 3
            sub.cmd(b"RDY 3")
            assert [sub.read_message()[3] for _ in range(3)] == [b"a", b"b", b"c"]
        started = time.monotonic()
        wait_for(lambda: channel.depth() == 0, what="depth 0")
        assert time.monotonic() - started < 5
    finally:
        nsqd.stop()


def test_nsqd_dat_with_unchanged_bytes_is_fsynced_not_rewritten(tmp_path):
    """A restart that changes nothing keeps the file (same inode, no temp file); a change replaces it."""
    nsqd = start(tmp_path)
    try:
        nsqd.get_topic("kept").get_channel("c")
        nsqd.persist_metadata()
    finally:
        nsqd.stop()
    path = tmp_path / "nsqd.dat"
    written = path.read_bytes()
    inode = path.stat().st_ino
    nsqd = start(tmp_path)
    try:
        assert path.stat().st_ino == inode  # the start's write found the same bytes
    finally:
        nsqd.stop()
    assert path.stat().st_ino == inode and path.read_bytes() == written
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    nsqd = start(tmp_path)
    try:
        nsqd.get_topic("kept").pause()
    finally:
        nsqd.stop()
    assert path.stat().st_ino != inode
    assert json.loads(path.read_bytes())["topics"][0]["paused"] is True


def test_a_burst_of_new_channels_reaches_nsqd_dat_and_survives_a_restart(tmp_path):
    # The nsqd.dat writer coalesces a burst of creations (it is not woken by each while it
    # rests between two rewrites): every channel still reaches the file without anyone
    # waiting for it, and a restart brings every one back.
    nsqd = start(tmp_path)
    names = ["c%d" % i for i in range(300)]
    try:
        subs = [Conn(nsqd.tcp_address) for _ in range(20)]
        try:
            for sub, name in zip(subs, names):
                sub.sub("burst", name)
            topic = nsqd.get_existing_topic("burst")
            for name in names[len(subs):]:
                topic.get_channel(name)

            def listed():
                data = json.loads((tmp_path / "nsqd.dat").read_bytes())
                return {c["name"] for t in data["topics"] or [] if t["name"] == "burst" for c in t["channels"] or []}

            wait_for(lambda: listed() == set(names), timeout=30, what="every channel in nsqd.dat")
        finally:
            for sub in subs:
                sub.close()
    finally:
        nsqd.stop()
    nsqd = start(tmp_path)
    try:
        topic = nsqd.get_existing_topic("burst")
        assert sorted(c.name for c in topic.channels()) == sorted(names)
    finally:
        nsqd.stop()


def test_a_queue_with_files_but_not_in_nsqd_dat_reads_them_when_created_and_a_new_one_looks_for_none(tmp_path):
    """The data directory is listed once: a channel whose queue left files (nsqd.dat lost, or
    files brought from another node) gets its backlog when it is created; a queue with no file
    opens without looking for any, and one deleted then created again starts empty."""
    nsqd = start(tmp_path, mem_queue_size=0)
    try:
        nsqd.get_topic("restored").get_channel("c")
        with Conn(nsqd.tcp_address) as pub:
            pub.mpub("restored", [b"a", b"b", b"c"])
        wait_for(lambda: nsqd.get_existing_topic("restored").get_existing_channel("c").depth() == 3)
    finally:
        nsqd.stop()
    os.remove(str(tmp_path / "nsqd.dat"))
    assert any(name.startswith("restored:c.diskqueue.") for name in os.listdir(str(tmp_path)))
    nsqd = start(tmp_path)
    try:
        assert nsqd.get_existing_topic("restored") is None
        with Conn(nsqd.tcp_address) as sub:
            sub.sub("restored", "c", rdy=5)
            assert sorted(sub.read_message()[3] for _ in range(3)) == [b"a", b"b", b"c"]
        # A channel never seen: opened fresh, no file looked for (none read back either).
        fresh = nsqd.get_topic("restored").get_channel("new")
        assert fresh._backend._fresh and fresh.depth() == 0
        # Filled to disk, deleted (its files go), created again: empty, and looked for its files.
        with Conn(nsqd.tcp_address) as pub:
            pub.mpub("restored", [b"x"] * 4)
        nsqd.get_topic("restored").delete_channel("new")
        again = nsqd.get_topic("restored").get_channel("new")
        assert not again._backend._fresh and again.depth() == 0
    finally:
        nsqd.stop()


def test_queue_names_in_a_data_directory_name_every_queue_a_file_may_belong_to(tmp_path):
    from nsqd_threaded.broker.core import _queue_names_in

    for name in ("t.diskqueue.000000.dat", "t:c.diskqueue.meta.dat", "x.diskqueue.y.diskqueue.meta.dat",
                 "nsqd.dat", "u:d.diskqueue.deferred.dat"):
        (tmp_path / name).write_bytes(b"")
    names = _queue_names_in(str(tmp_path))
    assert names == {"t", "t:c", "x", "x.diskqueue.y", "u:d"}
    assert "anything" in _queue_names_in(str(tmp_path / "missing"))  # unreadable: every queue may have files
