"""Delivery policies across restarts (not in Go nsqd; docs/policies.md): kept in nsqd.dat, a
dead-letter move under --durable that a kill -9 never loses, and Go nsqd 1.3 on a data directory
that carries policies (it keeps every topic and channel; the policies are gone once it rewrote the file)."""

import json
import os
import socket
import subprocess
import urllib.error
import urllib.request

import pytest

from nsqd_threaded.broker.redrive import EXIT_IN_REDRIVE_ENV
from nsqd_threaded.storage import redrive_journal
from nsqd_threaded.testing import Broker, BrokerProcess
from nsqd_threaded.wire import protocol_v2

from support.delivery import free_port
from support.http_api import HTTP
from support.tools import go_tool
from support.wire import Conn, wait_for

pytestmark = pytest.mark.timeout(180)

GO_NSQD = go_tool("nsqd")


def post(address, path):
    url = "http://%s:%d%s" % (address[0], address[1], path)
    with urllib.request.urlopen(urllib.request.Request(url, data=b""), timeout=20) as r:
        return r.read()


def get(address, path):
    url = "http://%s:%d%s" % (address[0], address[1], path)
    with urllib.request.urlopen(url, timeout=20) as r:
        return r.read()


def policy(address, topic, channel):
    return json.loads(get(address, "/channel/policy?topic=%s&channel=%s" % (topic, channel)))


def test_policies_survive_a_restart_and_still_apply(tmp_path):
    broker = Broker(data_path=str(tmp_path)).start()
    try:
        http = broker.http_address
        post(http, "/topic/create?topic=t")
        post(http, "/channel/create?topic=t&channel=c")
        post(http, "/channel/create?topic=t&channel=plain")
        post(http, "/channel/policy?topic=t&channel=c&max_attempts=1&dead_letter_topic=t.dead&msg_ttl=1h")
        broker.restart()
        assert policy(http, "t", "c") == {"max_attempts": 1, "dead_letter_topic": "t.dead", "msg_ttl": 3600000}
        assert policy(http, "t", "plain") == {"max_attempts": None, "dead_letter_topic": None, "msg_ttl": None}
        with Conn(broker.tcp_address) as pub, Conn(broker.tcp_address) as sub, Conn(broker.tcp_address) as dead:
            dead.sub("t.dead", "d", rdy=1)
            sub.sub("t", "c", rdy=1)
            assert pub.pub("t", b"once") == b"OK"
            sub.cmd(b"REQ %s 0" % sub.read_message()[2])
            assert dead.read_message()[3] == b"once"
            sub.assert_silent(0.3)
    finally:
        broker.stop()


def test_a_channels_own_nothing_survives_a_restart_under_defaults(tmp_path):
    """A channel's own "unlimited", "drop" and "no TTL" stay its own across a restart: they never turn
    into the broker's defaults (an empty dead-letter topic once did)."""
    defaults = dict(max_attempts=2, dead_letter_topic="{topic}.dead", msg_ttl=3600.0)
    broker = Broker(data_path=str(tmp_path), **defaults).start()
    try:
        http = broker.http_address
        post(http, "/topic/create?topic=t")
        for channel in ("drop", "unlimited", "inherits"):
            post(http, "/channel/create?topic=t&channel=" + channel)
        post(http, "/channel/policy?topic=t&channel=drop&dead_letter_topic=")
        post(http, "/channel/policy?topic=t&channel=unlimited&max_attempts=0&msg_ttl=0")
        for _ in range(2):
            assert policy(http, "t", "drop") == {"max_attempts": None, "dead_letter_topic": "", "msg_ttl": None}
            assert policy(http, "t", "unlimited") == {"max_attempts": 0, "dead_letter_topic": None, "msg_ttl": 0}
            assert policy(http, "t", "inherits") == {"max_attempts": None, "dead_letter_topic": None, "msg_ttl": None}
            stats = json.loads(get(http, "/stats?format=json&topic=t"))
            effective = {c["channel_name"]: (c["max_attempts"], c["dead_letter_topic"], c["msg_ttl"])
                         for c in stats["topics"][0]["channels"]}
            assert effective == {"drop": (2, "", 3600000), "unlimited": (0, "t.dead", 0),
                                 "inherits": (2, "t.dead", 3600000)}
            broker.restart()
        # It still drops: a message over the limit goes nowhere (no t.dead is made for it).
        with Conn(broker.tcp_address) as pub, Conn(broker.tcp_address) as sub:
            sub.sub("t", "drop", rdy=1)
            assert pub.pub("t", b"m") == b"OK"
            for _ in range(2):
                sub.cmd(b"REQ %s 0" % sub.read_message()[2])
            channel = broker.nsqd.get_existing_topic("t").get_existing_channel("drop")
            wait_for(lambda: channel.snapshot().policy["dead_letter_count"] == 1, timeout=20, what="the drop")
            sub.assert_silent(0.3)
        assert broker.nsqd.get_existing_topic("t.dead") is None
    finally:
        broker.stop()


def test_a_policy_stored_before_own_nothing_existed_still_inherits(tmp_path):
    """nsqd.dat written before a channel's own setting could be "nothing" (no ``format`` key): its 0 and ""
    were "inherit the default", and still are."""
    (tmp_path / "nsqd.dat").write_text(json.dumps({"topics": [{"name": "t", "paused": False, "channels": [
        {"name": "c", "paused": False, "policy": {"max_attempts": 9, "dead_letter_topic": "", "msg_ttl": 0}}]}],
        "version": "1.3.0"}))
    broker = Broker(data_path=str(tmp_path), max_attempts=2, dead_letter_topic="{topic}.dead").start()
    try:
        assert policy(broker.http_address, "t", "c") == {"max_attempts": 9, "dead_letter_topic": None,
                                                         "msg_ttl": None}
        [c] = json.loads(get(broker.http_address, "/stats?format=json&topic=t"))["topics"][0]["channels"]
        assert (c["max_attempts"], c["dead_letter_topic"], c["msg_ttl"]) == (9, "t.dead", 0)
    finally:
        broker.stop()
    [c] = json.loads((tmp_path / "nsqd.dat").read_bytes())["topics"][0]["channels"]
    assert c["policy"] == {"max_attempts": 9, "dead_letter_topic": None, "msg_ttl": None, "format": 2}


def test_durable_dead_letter_moves_leave_the_channel_for_good(tmp_path):
    """Under --durable a message leaves the channel's disk queue only once the dead-letter topic has it."""
    broker = Broker(data_path=str(tmp_path), durable=True).start()
    try:
        http = broker.http_address
        post(http, "/topic/create?topic=t")
        post(http, "/channel/create?topic=t&channel=c")
        post(http, "/topic/create?topic=t.dead")
        post(http, "/channel/create?topic=t.dead&channel=d")
        post(http, "/channel/policy?topic=t&channel=c&max_attempts=1&dead_letter_topic=t.dead")
        with Conn(broker.tcp_address) as pub, Conn(broker.tcp_address) as sub:
            sub.sub("t", "c", rdy=10)
            assert pub.mpub("t", [b"a", b"b", b"c"]) == b"OK"
            for _ in range(3):
                sub.cmd(b"REQ %s 0" % sub.read_message()[2])
            h = HTTP(broker.nsqd)
            try:
                wait_for(lambda: _channel(h, "t.dead", "d")["depth"] == 3, what="three dead letters")
            finally:
                h.close()
        broker.restart()
        with Conn(broker.tcp_address) as sub, Conn(broker.tcp_address) as dead:
            sub.sub("t", "c", rdy=10)
            dead.sub("t.dead", "d", rdy=10)
            assert sorted(dead.read_message()[3] for _ in range(3)) == [b"a", b"b", b"c"]
            sub.assert_silent(0.5)  # nothing left in the channel
            dead.assert_silent(0.1)
    finally:
        broker.stop()


def _channel(h, topic, channel):
    [t] = h.stats(topic=topic)["topics"]
    [c] = [c for c in t["channels"] if c["channel_name"] == channel]
    return c


def test_a_kill_during_dead_letter_moves_loses_nothing(tmp_path):
    """kill -9 while expired messages move to the dead-letter topic: after the restart every one is
    there (some may be twice), none is lost.  The instant of the kill is whatever it is, in the middle
    of the moves (due one after another over a second); the test cannot pick the instant between a
    publish and its acknowledgement, and (the disk queue syncing an acknowledgement only with its next
    fsync) it would not catch the two swapped either: the order is the code's (Channel.move_dead_letters)."""
    n = 200
    broker = BrokerProcess("--durable", data_path=str(tmp_path), start_timeout=30, stop_timeout=30).start()
    try:
        http = broker.http_address
        post(http, "/topic/create?topic=src")
        post(http, "/channel/create?topic=src&channel=c")
        post(http, "/topic/create?topic=src.dead")
        post(http, "/channel/create?topic=src.dead&channel=d")
        post(http, "/channel/policy?topic=src&channel=c&msg_ttl=50ms&dead_letter_topic=src.dead")
        bodies = {b"m%03d" % i for i in range(n)}
        with Conn(broker.tcp_address) as pub, Conn(broker.tcp_address) as sub, Conn(broker.tcp_address) as dead:
            sub.sub("src", "c", rdy=n)
            dead.sub("src.dead", "d", rdy=n)
            # Due after their TTL (every one expires), spread over a second: a move every scan.
            for i, body in enumerate(sorted(bodies)):
                pub.cmd(b"DPUB src %d" % (100 + 5 * i), body)
            for _ in bodies:
                assert pub.read_response() == b"OK"
            for _ in range(n // 2):
                dead.read_message()  # moves under way
            broker.kill()
        broker.restart()
        got = set()
        with Conn(broker.tcp_address) as sub, Conn(broker.tcp_address) as dead:
            sub.sub("src", "c", rdy=n)  # what was left in the channel expires now
            dead.sub("src.dead", "d", rdy=n)
            while got != bodies:
                frame_type, data = dead.read_frame()
                if frame_type == protocol_v2.FRAME_TYPE_ERROR:
                    # A duplicate of the same ID (--durable's at least once) was FINed with the first.
                    assert data.startswith(b"E_FIN_FAILED") and data.endswith(b"ID not in flight"), data
                    continue
                msg = protocol_v2.decode_message(data)
                assert msg[3] in bodies
                got.add(msg[3])
                dead.cmd(b"FIN " + msg[2])
            sub.assert_silent(0.3)  # none was delivered to the channel's consumer
    finally:
        broker.stop()


@pytest.mark.skipif(GO_NSQD is None, reason="Go nsqd binary not present")
def test_go_nsqd_on_a_data_directory_with_policies(tmp_path):
    ours = Broker(data_path=str(tmp_path)).start()
    try:
        http = ours.http_address
        post(http, "/topic/create?topic=t")
        post(http, "/channel/create?topic=t&channel=c")
        post(http, "/channel/create?topic=t&channel=held")
        post(http, "/channel/pause?topic=t&channel=held")
        post(http, "/topic/create?topic=other")
        post(http, "/channel/policy?topic=t&channel=c&max_attempts=5&dead_letter_topic=t.dead&msg_ttl=10s")
        post(http, "/channel/policy?topic=t&channel=held&dead_letter_topic=")  # (nulls: inherited)
        with Conn(ours.tcp_address) as pub:
            assert pub.pub("t", b"kept across brokers") == b"OK"
    finally:
        ours.stop()  # (the data directory is the test's: kept)
    dat = json.loads((tmp_path / "nsqd.dat").read_bytes())
    [t] = [t for t in dat["topics"] if t["name"] == "t"]
    policies = {c["name"]: c.get("policy") for c in t["channels"]}
    assert policies == {"c": {"max_attempts": 5, "dead_letter_topic": "t.dead", "msg_ttl": 10000, "format": 2},
                        "held": {"max_attempts": None, "dead_letter_topic": "", "msg_ttl": None, "format": 2}}

    # Go nsqd starts on it and keeps every topic and channel (its decoder ignores the policy key).
    tcp, http = free_port(), free_port()
    go = subprocess.Popen([GO_NSQD, "--tcp-address=127.0.0.1:%d" % tcp, "--http-address=127.0.0.1:%d" % http,
                           "--data-path=%s" % tmp_path], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE)
    try:
        def go_stats():
            if go.poll() is not None:
                raise AssertionError("Go nsqd exited: %s" % go.stderr.read().decode(errors="replace"))
            try:
                return json.loads(get(("127.0.0.1", http), "/stats?format=json"))
            except OSError:
                return None

        stats = wait_for(go_stats, timeout=30, what="Go nsqd's /stats")
        topics = {t["topic_name"]: t for t in stats["topics"]}
        assert set(topics) == {"t", "other"}
        channels = {c["channel_name"]: c for c in topics["t"]["channels"]}
        assert set(channels) == {"c", "held"} and channels["held"]["paused"] and not channels["c"]["paused"]
        assert channels["c"]["depth"] == 1  # its disk queue too
    finally:
        go.terminate()
        go.wait(timeout=30)
        go.stderr.close()
    assert go.returncode == 0
    assert b"policy" not in (tmp_path / "nsqd.dat").read_bytes()  # Go rewrote it without

    # Ours reads the file Go rewrote: every topic and channel, the pause; the policy is gone.
    ours = Broker(data_path=str(tmp_path)).start()
    try:
        http = ours.http_address
        assert policy(http, "t", "c") == {"max_attempts": None, "dead_letter_topic": None, "msg_ttl": None}
        topic = ours.nsqd.get_existing_topic("t")
        assert topic.get_existing_channel("held").paused and topic.get_existing_channel("c").depth() == 1
        assert ours.nsqd.get_existing_topic("other") is not None
    finally:
        ours.stop()


@pytest.mark.skipif(GO_NSQD is None, reason="Go nsqd binary not present")
def test_go_nsqd_delivers_dead_letters_kept_with_their_provenance(tmp_path):
    """Dead letters with provenance: Go nsqd 1.3 starts on the data directory and delivers them with their
    bodies, IDs and original timestamps unchanged (the provenance file is beside their disk queue, never
    read by Go); back on ours, each still says where it came from."""
    ours = Broker(data_path=str(tmp_path), channel_peek=True, mem_queue_size=1).start()  # (most on disk)
    try:
        http = ours.http_address
        post(http, "/topic/create?topic=t")
        post(http, "/channel/create?topic=t&channel=c")
        post(http, "/topic/create?topic=t.dead")
        post(http, "/channel/create?topic=t.dead&channel=d")
        post(http, "/channel/policy?topic=t&channel=c&max_attempts=1&dead_letter_topic=t.dead")
        bodies = [b"first", b"\x00binary\xff", b"third"]
        with Conn(ours.tcp_address) as pub, Conn(ours.tcp_address) as sub:
            for body in bodies:
                assert pub.pub("t", body) == b"OK"
            sub.sub("t", "c", rdy=3)
            for _ in bodies:
                sub.cmd(b"REQ %s 0" % sub.read_message()[2])
            wait_for(lambda: len(ours.messages("t.dead", "d")) == 3, what="three dead letters")
        held = ours.messages("t.dead", "d")
        assert [m.body for m in held] == bodies and all(m.dead_letter["topic"] == "t" for m in held)
    finally:
        ours.stop()
    assert (tmp_path / "t.dead.dead-letters.jsonl").exists()

    tcp, http = free_port(), free_port()
    go = subprocess.Popen([GO_NSQD, "--tcp-address=127.0.0.1:%d" % tcp, "--http-address=127.0.0.1:%d" % http,
                           "--data-path=%s" % tmp_path], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE)
    try:
        def go_conn():
            if go.poll() is not None:
                raise AssertionError("Go nsqd exited: %s" % go.stderr.read().decode(errors="replace"))
            try:
                return Conn(("127.0.0.1", tcp))
            except OSError:
                return None

        with wait_for(go_conn, timeout=30, what="Go nsqd's TCP port") as sub:
            sub.sub("t.dead", "d", rdy=3)
            got = [sub.read_message() for _ in bodies]  # (not FINed: Go writes them back on exit)
        # (In the order a close left them: as Go's, the memory queue is flushed after the disk queue's.)
        assert sorted((ts, msg_id.decode(), body) for ts, _, msg_id, body in got) == sorted(
            (m.timestamp, m.id, m.body) for m in held)
    finally:
        go.terminate()
        go.wait(timeout=30)
        go.stderr.close()
    assert go.returncode == 0

    ours = Broker(data_path=str(tmp_path), channel_peek=True).start()
    try:
        again = ours.messages("t.dead", "d")
        assert sorted((m.id, m.body) for m in again) == sorted((m.id, m.body) for m in held)
        assert {m.id: m.dead_letter for m in again} == {m.id: m.dead_letter for m in held}
    finally:
        ours.stop()


def test_a_kill_during_a_redrive_loses_nothing(tmp_path):
    """kill -9 right after a redrive answered: under --durable every dead letter is then in its source
    channel or still in the dead-letter channel, never in both, none lost, and the redrive left no
    journal (a kill inside it: below); a later redrive moves what stayed."""
    n = 300
    broker = BrokerProcess("--durable", "--channel-peek", data_path=str(tmp_path), start_timeout=30,
                           stop_timeout=30).start()
    try:
        http = broker.http_address
        bodies = [b"m%03d" % i for i in range(n)]
        _dead_letters_in(broker, bodies)
        assert json.loads(post(http, "/channel/redrive?topic=src.dead&channel=d&n=%d" % (n // 2))) == {"moved": n // 2}
        assert not (tmp_path / ("src.dead:d" + redrive_journal.FILE_SUFFIX)).exists()
        broker.kill()
        broker.restart()
        back = {m.body for m in broker.messages("src", "c")}
        still = {m.body for m in broker.messages("src.dead", "d")}
        assert back | still == set(bodies) and not back & still
        assert len(back) == n // 2  # what the answer said moved is there
        assert json.loads(post(broker.http_address, "/channel/redrive?topic=src.dead&channel=d")) == {"moved": n // 2}
        assert sorted(_consume_all(broker, "src", "c")) == bodies
        assert _consume_all(broker, "src.dead", "d") == []
    finally:
        broker.stop()

def _dead_letters_in(broker, bodies):
    """src:c's messages all moved to src.dead (its channel d holds them, never consumed), src:c's policy off."""
    http = broker.http_address
    post(http, "/topic/create?topic=src")
    post(http, "/channel/create?topic=src&channel=c")
    post(http, "/topic/create?topic=src.dead")
    post(http, "/channel/create?topic=src.dead&channel=d")
    post(http, "/channel/policy?topic=src&channel=c&msg_ttl=1ms&dead_letter_topic=src.dead")
    with Conn(broker.tcp_address) as pub, Conn(broker.tcp_address) as sub:
        assert pub.mpub("src", bodies) == b"OK"
        sub.sub("src", "c", rdy=1)  # every one has expired: all moved, none delivered
        wait_for(lambda: len(broker.messages("src.dead", "d")) == len(bodies), timeout=30, what="every one moved")
    post(http, "/channel/policy?topic=src&channel=c&msg_ttl=0")  # (what comes back stays)


def _consume_all(broker, topic, channel):
    """The bodies a consumer of ``topic/channel`` gets (each FINed), until none comes for a second."""
    out = []
    with Conn(broker.tcp_address) as consumer:
        consumer.sub(topic, channel, rdy=100)
        while True:
            consumer.sock.settimeout(1.0)  # (the end: a second with nothing more)
            try:
                _, _, msg_id, body = consumer.read_message()
            except (socket.timeout, TimeoutError):
                return out
            out.append(body)
            consumer.cmd(b"FIN %s" % msg_id)


@pytest.mark.parametrize("exit_at", ["published", "line", "left"])
def test_a_kill_inside_a_durable_redrive_moves_each_message_once(tmp_path, exit_at):
    """--durable: the broker exits (as at a kill) inside a redrive: "published" once the source topic
    has the new messages and before the dead-letter channel let them go, "line" once the redrive
    journal has its lines and before the source's records, "left" once the messages left the channel
    and before the journal was removed.  After the restart each message is in one place only, and a
    consumer of each channel gets it once: in the source for "published" (the dead-letter channel lets
    them go unread) and "left", still a dead letter for "line" (never written there)."""
    n = 50
    bodies = [b"m%03d" % i for i in range(n)]
    broker = BrokerProcess("--durable", "--channel-peek", data_path=str(tmp_path), start_timeout=30,
                           stop_timeout=30, env=dict(os.environ, **{EXIT_IN_REDRIVE_ENV: exit_at})).start()
    try:
        _dead_letters_in(broker, bodies)
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            post(broker.http_address, "/channel/redrive?topic=src.dead&channel=d")
        wait_for(lambda: not broker.running, timeout=20, what="the exit inside the redrive")
        assert broker.returncode == 137
    finally:
        broker.stop()
    journal = tmp_path / ("src.dead:d" + redrive_journal.FILE_SUFFIX)
    assert len(redrive_journal.read(str(journal))) == n  # (the window: every line written)
    after = BrokerProcess("--durable", "--channel-peek", data_path=str(tmp_path), start_timeout=30,
                          stop_timeout=30).start()
    try:
        # Only "published" leaves messages to let go: the others' journal goes at the start.
        assert journal.exists() == (exit_at == "published")
        still = _consume_all(after, "src.dead", "d")
        back = _consume_all(after, "src", "c")
        assert sorted(back + still) == bodies  # each once: none lost, none twice
        assert (len(back), len(still)) == ((0, n) if exit_at == "line" else (n, 0))
        assert json.loads(post(after.http_address, "/channel/redrive?topic=src.dead&channel=d")) == {"moved": 0}
        assert not journal.exists()  # (said all it had to: gone)
    finally:
        after.stop()

