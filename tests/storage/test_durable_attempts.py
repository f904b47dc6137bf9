"""Durable mode across a SIGKILL: a REQ'd, timed-out or deferred message comes back with the attempts it
had (the next delivery is one more), from our broker and from Go nsqd started on the same directory (the
record header's attempts field is go-diskqueue's own); a message moved to a dead-letter topic is moved
once, even when an older message was still in flight (the channel's done log), and even when the broker
dies inside the move (the dead-letter topic has it, the channel has not let it go: the provenance line
written with it tells the repeated move); after a power loss (another boot) it is moved again, never lost."""

import json
import os
import socket
import time

import pytest

from nsqd_threaded.broker.policy import EXIT_IN_MOVE_ENV
from nsqd_threaded.storage import provenance as provenance_file
from nsqd_threaded.testing import BrokerProcess

from support.wire import Conn, wait_for

pytestmark = pytest.mark.timeout(120)

GO_NSQD = os.path.join(os.environ.get("NSQ_GO_BIN", os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared", "reference", "go-nsq-1.3.0")), "nsqd")
RESTARTS = [
    pytest.param(None, id="ours"),
    pytest.param([os.path.abspath(GO_NSQD)], id="go",
                 marks=pytest.mark.skipif(not os.access(GO_NSQD, os.X_OK), reason="Go nsqd binary not present")),
]


def _channel_stats(broker, topic="jobs", channel="work"):
    status, body = broker.http("GET", "/stats?format=json&topic=%s&channel=%s" % (topic, channel))
    assert status == 200, body
    doc = json.loads(body)
    doc = doc.get("data", doc)
    return doc["topics"][0]["channels"][0]


@pytest.mark.parametrize("restart", RESTARTS)
def test_requeued_timed_out_and_deferred_messages_keep_their_attempts_across_a_kill(tmp_path, restart):
    ours = BrokerProcess("--durable", data_path=str(tmp_path)).start()
    try:
        publisher = Conn(ours.tcp_address)
        for body in (b"a", b"b", b"c"):
            assert publisher.pub("jobs", body) == b"OK"
        with publisher, Conn(ours.tcp_address) as consumer:
            # (b times out; a, REQ'd within it, must not, even on a loaded host: with 6 s, a CI machine at a
            # load average of 11 once took longer between a's delivery and its REQ)
            consumer.identify(msg_timeout=15000)
            consumer.sub("jobs", "work", rdy=3)
            first = {body: (msg_id, attempts) for _, attempts, msg_id, body in
                     (consumer.read_message() for _ in range(3))}
            assert {body: a for body, (_, a) in first.items()} == {b"a": 1, b"b": 1, b"c": 1}
            consumer.cmd(b"REQ %s 20000" % first[b"c"][0])  # deferred, due after the kill
            consumer.cmd(b"REQ %s 0" % first[b"a"][0])
            _, attempts, msg_id, body = consumer.read_message()
            assert (body, attempts) == (b"a", 2)
            consumer.cmd(b"RDY 0")
            consumer.cmd(b"REQ %s 0" % msg_id)  # queued again with 2 attempts
            # RDY and REQ have no answer: d waits until this REQ (and the RDY 0 before it on the same
            # connection) has been applied, or a loaded host may serve the PUB first (each
            # connection's commands on a thread of their own) and deliver d into a free slot,
            # where it would time out too
            wait_for(lambda: _channel_stats(ours)["requeue_count"] == 3, timeout=60,
                     what=lambda: "a's second REQ: %r" % _channel_stats(ours))
            assert publisher.pub("jobs", b"d") == b"OK"  # never delivered
            # b is left to time out (15 s): queued again with 1 attempt
            stats = wait_for(lambda: (lambda s: s if s["timeout_count"] >= 1 and s["in_flight_count"] == 0
                                      else None)(_channel_stats(ours)),
                             timeout=60, what=lambda: "b's timeout: %r" % _channel_stats(ours))
            assert (stats["requeue_count"], stats["timeout_count"]) == (3, 1), stats
            ours.kill()
    finally:
        ours.stop()
    kwargs = {} if restart is None else {"command": restart}
    after = BrokerProcess(*(("--durable",) if restart is None else ()), data_path=str(tmp_path), **kwargs).start()
    try:
        with Conn(after.tcp_address) as consumer:
            consumer.sub("jobs", "work", rdy=10)
            got = {}
            while len(got) < 4:
                _, attempts, msg_id, body = consumer.read_message()
                got[body] = attempts
                consumer.cmd(b"FIN %s" % msg_id)
    finally:
        after.stop()
    assert got == {b"a": 3, b"b": 2, b"c": 2, b"d": 1}


def test_a_dead_letter_move_behind_a_message_in_flight_is_not_repeated_after_a_kill(tmp_path):
    ours = BrokerProcess("--durable", data_path=str(tmp_path)).start()
    try:
        for path in ("/topic/create?topic=jobs", "/channel/create?topic=jobs&channel=work",
                     "/topic/create?topic=jobs-dead", "/channel/create?topic=jobs-dead&channel=dead",
                     "/channel/policy?topic=jobs&channel=work&max_attempts=1&dead_letter_topic=jobs-dead"):
            assert ours.http("POST", path)[0] == 200, path
        with Conn(ours.tcp_address) as publisher, Conn(ours.tcp_address) as consumer:
            assert publisher.pub("jobs", b"a") == b"OK"
            assert publisher.pub("jobs", b"b") == b"OK"
            consumer.sub("jobs", "work", rdy=2)
            got = {body: msg_id for _, _, msg_id, body in (consumer.read_message() for _ in range(2))}
            consumer.cmd(b"REQ %s 0" % got[b"b"])  # its next delivery would be its 2nd: moved instead
            # a stays in flight: the channel's committed position cannot pass b
            # The move: published to jobs-dead, then acknowledged in work (its done log's entry).
            done_log = tmp_path / "jobs:work.diskqueue.done.dat"
            wait_for(lambda: done_log.exists() and done_log.stat().st_size > 0, timeout=10, what="b's move")
            # (the topic hands it to its channel on its own thread: a moment later on a loaded machine)
            wait_for(lambda: _channel_stats(ours, "jobs-dead", "dead")["depth"] == 1, timeout=10,
                     what="b in jobs-dead's channel")
            ours.kill()
    finally:
        ours.stop()
    after = BrokerProcess("--durable", data_path=str(tmp_path)).start()
    try:
        work = crashloop_drain(after, "jobs", "work")
        dead = crashloop_drain(after, "jobs-dead", "dead")
    finally:
        after.stop()
    # b moved once; a, in flight at the kill, comes back with the attempt of that delivery (written into
    # its record as it was delivered): its next would be its 2nd, past max_attempts=1, so it is moved too
    assert (work, dead) == ([], [b"b", b"a"])


@pytest.mark.parametrize("restart", RESTARTS)
def test_a_message_in_flight_at_a_kill_comes_back_with_its_delivery_counted(tmp_path, restart):
    ours = BrokerProcess("--durable", data_path=str(tmp_path)).start()
    try:
        with Conn(ours.tcp_address) as publisher, Conn(ours.tcp_address) as consumer:
            for body in (b"a", b"b"):
                assert publisher.pub("jobs", body) == b"OK"
            consumer.sub("jobs", "work", rdy=1)
            _, attempts, msg_id, body = consumer.read_message()
            assert (body, attempts) == (b"a", 1)
            consumer.cmd(b"FIN %s" % msg_id)
            _, attempts, msg_id, body = consumer.read_message()
            assert (body, attempts) == (b"b", 1)  # in flight at the kill
            ours.kill()
    finally:
        ours.stop()
    kwargs = {} if restart is None else {"command": restart}
    after = BrokerProcess(*(("--durable",) if restart is None else ()), data_path=str(tmp_path), **kwargs).start()
    try:
        got = []
        with Conn(after.tcp_address) as consumer:
            consumer.sub("jobs", "work", rdy=10)
            while b"b" not in [body for body, _ in got]:
                _, attempts, msg_id, body = consumer.read_message()
                got.append((body, attempts))
                consumer.cmd(b"FIN %s" % msg_id)
    finally:
        after.stop()
    # Ours: b alone, its delivery before the kill counted.  Go reads the same record (attempts 1, so it
    # gives 2), unless it copies the topic's last batch to the channel again (it has no replay check:
    # fresh copies of a and b, attempts 0), and may give the FINed a (it never reads the done log)
    if restart is None:
        assert got == [(b"b", 2)], got
    else:
        assert got[-1][0] == b"b" and (got[-1][1] == 2 or (b"a", 1) in got), got


def test_a_delayed_req_keeps_its_delay_through_a_kill(tmp_path):
    ours = BrokerProcess("--durable", data_path=str(tmp_path)).start()
    try:
        with Conn(ours.tcp_address) as publisher, Conn(ours.tcp_address) as consumer:
            assert publisher.pub("jobs", b"later") == b"OK"
            consumer.sub("jobs", "work", rdy=1)
            _, attempts, msg_id, _ = consumer.read_message()
            assert attempts == 1
            consumer.cmd(b"REQ %s 60000" % msg_id)  # a minute: its dependency is down
            wait_for(lambda: _channel_stats(ours)["deferred_count"] == 1, timeout=10, what="the REQ")
            ours.kill()
    finally:
        ours.stop()
    after = BrokerProcess("--durable", data_path=str(tmp_path)).start()
    try:
        with Conn(after.tcp_address) as consumer:
            consumer.sub("jobs", "work", rdy=1)
            consumer.assert_silent(0.3)  # not before its minute: read back from disk, and deferred
            wait_for(lambda: _channel_stats(after)["deferred_count"] == 1, timeout=10, what="deferred again")
            after.advance(61)
            _, attempts, _, body = consumer.read_message()
            assert (body, attempts) == (b"later", 2)
    finally:
        after.stop()


def _move_b_and_exit(tmp_path, exit_in_move, what):
    """A broker with work's dead-letter policy that exits (as at a SIGKILL) at the test hook
    ``exit_in_move`` while it moves b to jobs-dead; returns b's ID."""
    ours = _start_with_a_dead_letter_policy(tmp_path, exit_in_move)
    try:
        with Conn(ours.tcp_address) as publisher, Conn(ours.tcp_address) as consumer:
            assert publisher.pub("jobs", b"b") == b"OK"
            consumer.sub("jobs", "work", rdy=1)
            _, _, msg_id, _ = consumer.read_message()
            consumer.cmd(b"REQ %s 0" % msg_id)  # its next delivery would be its 2nd: moved instead
            wait_for(lambda: not ours.running, timeout=10, what=what)
        assert ours.returncode == 137
    finally:
        ours.stop()
    return msg_id


def _die_inside_a_move(tmp_path):
    """A broker that exits (as at a SIGKILL) after jobs-dead accepted b's move and before work let b go."""
    msg_id = _move_b_and_exit(tmp_path, "1", "the exit inside the move")
    done_log = tmp_path / "jobs:work.diskqueue.done.dat"
    assert not done_log.exists() or done_log.stat().st_size == 0  # (inside the window: work still has b)
    path = str(tmp_path / ("jobs-dead" + provenance_file.FILE_SUFFIX))
    entries, _, _ = provenance_file.read_entries(path)
    assert [doc["id"] for _, doc in entries.values()] == [bytes(msg_id).decode()]
    return path


def test_a_kill_inside_a_dead_letter_move_does_not_repeat_it(tmp_path):
    _die_inside_a_move(tmp_path)
    after = BrokerProcess("--durable", data_path=str(tmp_path)).start()
    try:
        work = crashloop_drain(after, "jobs", "work")
        dead = crashloop_drain(after, "jobs-dead", "dead")
        assert _channel_stats(after, "jobs", "work")["depth"] == 0
    finally:
        after.stop()
    assert (work, dead) == ([], [b"b"])


def test_after_a_power_loss_inside_a_dead_letter_move_the_dead_letter_found_is_kept(tmp_path):
    """Another boot: the line's boot proves nothing, but the dead letter at the line's position does,
    so the move is not repeated."""
    path = _die_inside_a_move(tmp_path)
    with open(path, "rb") as f:
        lines = [json.loads(line) for line in f.read().splitlines()]
    assert lines[0]["boot"] == provenance_file.current_boot() and lines[0]["at"] == [0, 0]
    with open(path, "wb") as f:
        f.write(b"".join(json.dumps(dict(line, boot="another-boot")).encode() + b"\n" for line in lines))
    assert _drain_after(tmp_path) == ([], [b"b"])


def test_after_a_power_loss_that_lost_the_dead_letter_it_is_moved_again(tmp_path):
    """The power loss took the dead letter (its write never reached the disk: here, the dead-letter
    topic's files are cut back to nothing), not the line: the record is not at the line's position,
    so the move is made again, and the message is in the dead-letter topic once."""
    _die_inside_a_move(tmp_path)
    for name in os.listdir(tmp_path):
        if name.startswith("jobs-dead") and ".diskqueue." in name:
            os.truncate(tmp_path / name, 0)  # (its data files, its channel's, their meta files: as never written)
    assert _drain_after(tmp_path) == ([], [b"b"])


def test_a_kill_between_the_provenance_line_and_the_dead_letter_moves_it_once(tmp_path):
    """The line goes first, with the dead letter's position: a kill right after it leaves a line whose
    dead letter was never written, and the restarted broker moves the message again, once."""
    msg_id = _move_b_and_exit(tmp_path, "line", "the exit between the line and the dead letter")
    entries, _, moved = provenance_file.read_entries(str(tmp_path / ("jobs-dead" + provenance_file.FILE_SUFFIX)))
    assert [doc["id"] for _, doc in entries.values()] == [bytes(msg_id).decode()] and list(moved.values()) == [(0, 0)]
    assert _drain_after(tmp_path) == ([], [b"b"])


def _start_with_a_dead_letter_policy(tmp_path, exit_in_move):
    ours = BrokerProcess("--durable", data_path=str(tmp_path), env=dict(os.environ, **{EXIT_IN_MOVE_ENV: exit_in_move})).start()
    for path in ("/topic/create?topic=jobs", "/channel/create?topic=jobs&channel=work",
                 "/topic/create?topic=jobs-dead", "/channel/create?topic=jobs-dead&channel=dead",
                 "/channel/policy?topic=jobs&channel=work&max_attempts=1&dead_letter_topic=jobs-dead"):
        assert ours.http("POST", path)[0] == 200, path
    return ours


def _drain_after(tmp_path):
    after = BrokerProcess("--durable", data_path=str(tmp_path)).start()
    try:
        return crashloop_drain(after, "jobs", "work"), crashloop_drain(after, "jobs-dead", "dead")
    finally:
        after.stop()


def crashloop_drain(broker, topic, channel):
    """What ``channel`` holds, FINed: [(body, attempts)] for jobs/work, [body] for the dead letters."""
    out = []
    with Conn(broker.tcp_address) as consumer:
        consumer.sub(topic, channel, rdy=10)
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            consumer.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                _, attempts, msg_id, body = consumer.read_message()
            except (socket.timeout, TimeoutError):
                break
            out.append((body, attempts) if topic == "jobs" else body)
            consumer.cmd(b"FIN %s" % msg_id)
    return out
