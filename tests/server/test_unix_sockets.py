"""nsqd and nsqlookupd listening on unix sockets, and the package's clients dialing them.

Real broker processes (ours, and Go's nsqd 1.3.0 when the reference binary is
present) on socket files in a per-test directory: protocol V2 and the HTTP API
over the sockets, a stale socket file left by a SIGKILLed broker, a live one
that another broker must not take, the files' permissions and their removal at
a graceful stop, and nsqlookupd on sockets with an nsqd registering through one.
"""

import contextlib
import json
import os
import shutil
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

from nsqd_threaded.client import Consumer, Producer
from nsqd_threaded.internal.httpclient import request
from nsqd_threaded.settings.options import Options
from nsqd_threaded.testing import Broker, BrokerProcess, Lookupd

from support.wire import wait_for

pytestmark = pytest.mark.timeout(90)

GO_BIN = os.environ.get("NSQ_GO_BIN", os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared",
                                                    "reference", "go-nsq-1.3.0"))
GO_NSQD = os.path.join(GO_BIN, "nsqd")
needs_go = pytest.mark.skipif(not os.access(GO_NSQD, os.X_OK), reason="Go nsqd 1.3.0 reference binary not present")

REPO_ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SUN_PATH_MAX = 100  # sockaddr_un holds 108 bytes: keep well below it


@pytest.fixture
def sock_dir(tmp_path):
    """A directory for socket files: tmp_path when its paths fit in a sockaddr_un, else a short one under /tmp."""
    if len(str(tmp_path)) + 12 < SUN_PATH_MAX:
        yield str(tmp_path)
        return
    path = tempfile.mkdtemp(prefix="nsqu-", dir="/tmp")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def paths(sock_dir, prefix="nsqd"):
    return os.path.join(sock_dir, prefix + "-tcp.sock"), os.path.join(sock_dir, prefix + "-http.sock")


def http(path, method, url, body=None):
    status, _, data = request(method, path, None, url, body, connect_timeout=10, deadline=time.monotonic() + 10)
    return status, data


def umask():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


def wait_until(predicate, timeout, what):
    return wait_for(predicate, timeout, interval=0.02, what=what)


def publish(address, topic, body):
    """One PUB through our Producer to ``address`` (a socket path, an @name or host:port)."""
    producer = Producer(address)
    try:
        producer.pub(topic, body)
    finally:
        producer.close()


@contextlib.contextmanager
def one_message_back(address, topic, body, what):
    """PUBs ``body`` to ``topic`` at ``address`` and asserts our Consumer (channel c) gets it, and only it.

    Yields the consumer, still subscribed; closes it on the way out.
    """
    publish(address, topic, body)
    got = []
    consumer = Consumer(address, topic, "c", lambda m: got.append(m.body) or True)
    consumer.start()
    try:
        wait_until(lambda: got, 20, what)
        assert got == [body]
        yield consumer
    finally:
        consumer.close()


# -- a raw protocol V2 peer --------------------------------------------------------


class RawV2:
    """A protocol V2 client on a unix socket written by hand (pynsq dials TCP only)."""

    def __init__(self, path, identify):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(path)
        self.buf = b""
        body = json.dumps(identify).encode()
        self.sock.sendall(b"  V2" + b"IDENTIFY\n" + struct.pack(">I", len(body)) + body)
        frame_type, data = self.frame()
        assert frame_type == 0, data
        self.settings = json.loads(data)

    def frame(self):
        while len(self.buf) < 4 or len(self.buf) < 4 + struct.unpack(">I", self.buf[:4])[0]:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk
        size = struct.unpack(">I", self.buf[:4])[0]
        frame_type = struct.unpack(">I", self.buf[4:8])[0]
        data, self.buf = self.buf[8:4 + size], self.buf[4 + size:]
        return frame_type, data

    def send(self, line):
        self.sock.sendall(line)

    def close(self):
        self.sock.close()


# -- our broker on sockets ----------------------------------------------------------


def test_v2_and_heartbeats_over_a_unix_socket(sock_dir):
    tcp, http_path = paths(sock_dir)
    with BrokerProcess(tcp_address=tcp, http_address=http_path) as nsqd:
        assert nsqd.tcp_address == tcp and nsqd.http_address == http_path
        peer = RawV2(tcp, {"client_id": "raw", "hostname": "h", "feature_negotiation": True,
                           "heartbeat_interval": 1000})
        try:
            peer.send(b"SUB raw c\n")
            assert peer.frame() == (0, b"OK")
            peer.send(b"RDY 1\n")
            assert http(http_path, "POST", "/pub?topic=raw", b"over the socket") == (200, b"OK")
            kinds = []
            while True:  # the message, and a heartbeat within the 1 s interval
                frame_type, data = peer.frame()
                if frame_type == 0 and data == b"_heartbeat_":
                    peer.send(b"NOP\n")
                    kinds.append("heartbeat")
                elif frame_type == 2:
                    msg_id = data[10:26]
                    assert data[26:] == b"over the socket"
                    peer.send(b"FIN " + msg_id + b"\n")
                    kinds.append("message")
                if "heartbeat" in kinds and "message" in kinds:
                    break
            stats = nsqd.stats(topic="raw")
            client = stats["topics"][0]["channels"][0]["clients"][0]
            assert client["client_id"] == "raw"
            # An unnamed unix peer: "@" as Go says, and a number that keeps two peers apart.
            assert client["remote_address"].startswith("@:")
            assert wait_until(lambda: nsqd.stats(topic="raw")["topics"][0]["channels"][0]["clients"][0]
                              ["finish_count"] == 1, 10, "the FIN")
        finally:
            peer.close()


def test_our_client_publishes_and_consumes_over_unix_sockets(sock_dir):
    tcp, http_path = paths(sock_dir)
    with BrokerProcess(tcp_address=tcp, http_address=http_path):
        producer = Producer(tcp)
        try:
            producer.pub("t", b"one")
            producer.mpub("t", [b"two", b"three"])
        finally:
            producer.close()
        got = []
        consumer = Consumer(tcp, "t", "c", lambda m: got.append(m.body) or True, max_in_flight=10)
        consumer.start()
        try:
            wait_until(lambda: len(got) == 3, 20, "three messages")
            assert sorted(got) == [b"one", b"three", b"two"]
            assert consumer.subscribed == [tcp]
        finally:
            consumer.close()


def test_http_api_over_a_unix_socket(sock_dir):
    tcp, http_path = paths(sock_dir)
    with BrokerProcess(tcp_address=tcp, http_address=http_path, broadcast_address="sidecar") as nsqd:
        assert http(http_path, "GET", "/ping") == (200, b"OK")
        assert http(http_path, "POST", "/pub?topic=h", b"a") == (200, b"OK")
        assert http(http_path, "POST", "/mpub?topic=h", b"b\nc") == (200, b"OK")
        info = json.loads(http(http_path, "GET", "/info")[1])
        # Go says -1 for a listener on a unix socket
        assert (info["tcp_port"], info["http_port"], info["broadcast_address"]) == (-1, -1, "sidecar")
        stats = nsqd.stats(topic="h")  # the fixture's own HTTP helper dials the path
        assert stats["topics"][0]["message_count"] == 3
        status, body = http(http_path, "GET", "/config/broadcast_tcp_port")
        assert (status, body) == (200, b"0")  # what the lookupds are told (Go: 0)


def test_socket_files_get_the_umask_permissions_and_go_at_a_graceful_stop(sock_dir):
    tcp, http_path = paths(sock_dir)
    nsqd = BrokerProcess(tcp_address=tcp, http_address=http_path).start()
    try:
        for path in (tcp, http_path):
            st = os.lstat(path)
            assert stat.S_ISSOCK(st.st_mode)
            assert stat.S_IMODE(st.st_mode) == 0o777 & ~umask()
    finally:
        nsqd.stop()  # SIGTERM
    assert nsqd.returncode == 0
    assert not os.path.exists(tcp) and not os.path.exists(http_path)


def test_a_stale_socket_file_from_a_killed_broker_is_replaced(sock_dir, tmp_path):
    tcp, http_path = paths(sock_dir)
    data = str(tmp_path / "data")
    os.mkdir(data)
    first = BrokerProcess(tcp_address=tcp, http_address=http_path, data_path=data).start()
    publish(tcp, "kept", b"before the crash")
    first.kill()  # SIGKILL: the files stay, nobody listens on them
    assert stat.S_ISSOCK(os.lstat(tcp).st_mode) and stat.S_ISSOCK(os.lstat(http_path).st_mode)
    second = BrokerProcess(tcp_address=tcp, http_address=http_path, data_path=data).start()
    try:
        assert "removed the stale socket file %s" % tcp in second.log
        assert "removed the stale socket file %s" % http_path in second.log
        assert http(http_path, "GET", "/ping") == (200, b"OK")
        # the same broker, back with its nsqd.dat (the message was in memory: a SIGKILL loses it)
        assert [t["topic_name"] for t in second.stats()["topics"]] == ["kept"]
    finally:
        second.stop()


def test_a_live_socket_is_not_taken(sock_dir, tmp_path):
    tcp, http_path = paths(sock_dir)
    with BrokerProcess(tcp_address=tcp, http_address=http_path) as live:
        intruder = BrokerProcess(tcp_address=tcp, http_address="127.0.0.1:0", start_timeout=20)
        with pytest.raises(RuntimeError) as failed:
            intruder.start()
        assert "another process is listening on %s" % tcp in str(failed.value)
        assert intruder.returncode not in (None, 0)
        # the live broker keeps its socket and serves on
        publish(tcp, "still", b"here")
        assert live.stats(topic="still")["topics"][0]["depth"] == 1


def test_a_file_that_is_not_a_socket_is_left_alone(sock_dir):
    tcp = os.path.join(sock_dir, "not-a-socket")
    with open(tcp, "w") as f:
        f.write("operator's file")
    broker = BrokerProcess(tcp_address=tcp, http_address="127.0.0.1:0")
    with pytest.raises(RuntimeError) as failed:
        broker.start()
    assert "exists and is not a socket" in str(failed.value)
    with open(tcp) as f:
        assert f.read() == "operator's file"


def test_in_process_broker_restarts_on_its_socket_paths(sock_dir):
    tcp, http_path = paths(sock_dir)
    with Broker(tcp_address=tcp, http_address=http_path) as broker:
        assert broker.tcp_addr == tcp and broker.http_url is None
        broker.http("POST", "/pub?topic=r", b"x")
        broker.restart()
        assert broker.tcp_address == tcp
        assert broker.stats(topic="r")["topics"][0]["depth"] == 1
    assert not os.path.exists(tcp) and not os.path.exists(http_path)


def test_addresses_a_socket_path_must_look_like_one():
    # Go takes any non host:port as a path: a forgotten port makes a socket file
    # "localhost" in the working directory.  Here it is an error naming the flag.
    with pytest.raises(ValueError, match="--tcp-address=localhost: invalid address"):
        Options(tcp_address="localhost").validate()
    Options(tcp_address="./nsqd.sock", http_address="/run/nsqd/http.sock").validate()
    # HTTPS is TLS over TCP only, as in Go
    with pytest.raises(ValueError, match="--https-address=/run/nsqd/https.sock: invalid address"):
        Options(https_address="/run/nsqd/https.sock").validate()


# -- abstract sockets (Linux): "@name", as Go's net package takes it ----------------------

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract sockets are Linux's")


def abstract_names(prefix="nsqd"):
    """Two names in the abstract namespace no other test (or test run) uses."""
    tag = "%s-%d-%s" % (prefix, os.getpid(), uuid.uuid4().hex[:8])
    return "@%s-tcp" % tag, "@%s-http" % tag


def abstract_listeners():
    """The abstract names bound on this host (network namespace), from /proc/net/unix."""
    with open("/proc/net/unix") as f:
        return {line.split()[-1] for line in f.read().splitlines()[1:] if line.split()[-1].startswith("@")}


@linux_only
def test_nsqd_on_abstract_sockets_with_our_client(tmp_path):
    tcp, http_path = abstract_names()
    with BrokerProcess(tcp_address=tcp, http_address=http_path, tmp_dir=str(tmp_path)) as nsqd:
        assert (nsqd.tcp_address, nsqd.http_address) == (tcp, http_path)
        assert {tcp, http_path} <= abstract_listeners()
        assert "TCP: listening on %s" % tcp in nsqd.log
        assert http(http_path, "GET", "/ping") == (200, b"OK")
        with one_message_back(tcp, "abs", b"no file", "the message"):
            pass
        # a name in use is refused (there is no stale file to probe or remove)
        intruder = BrokerProcess(tcp_address=tcp, http_address="127.0.0.1:0", start_timeout=20)
        with pytest.raises(RuntimeError) as failed:
            intruder.start()
        assert "address already in use" in str(failed.value).lower()
        assert http(http_path, "GET", "/ping") == (200, b"OK")
    assert not os.path.exists(tcp) and not os.path.exists(http_path)  # no file, not even a relative one
    assert not {tcp, http_path} & abstract_listeners()  # gone with the broker: the names are free again
    with BrokerProcess(tcp_address=tcp, http_address=http_path):
        assert http(http_path, "GET", "/ping") == (200, b"OK")


@linux_only
def test_in_process_broker_and_lookupd_on_abstract_sockets():
    ltcp, lhttp = abstract_names("lookupd")
    tcp, _ = abstract_names()
    with Lookupd(tcp_address=ltcp, http_address=lhttp) as lookupd:
        assert http(lhttp, "GET", "/ping") == (200, b"OK")
        with Broker(tcp_address=tcp, nsqlookupd_tcp_addresses=[ltcp], broadcast_address="127.0.0.1",
                    broadcast_tcp_port=4150, broadcast_http_port=4151) as nsqd:
            nsqd.http("POST", "/pub?topic=abs", b"x")
            wait_until(lambda: lookupd.lookup("abs"), 20, "the registration over the abstract socket")
            Options(tcp_address="@x", http_address="@y").validate()


@needs_go
@linux_only
def test_go_nsqd_on_abstract_sockets_with_our_client():
    tcp, http_path = abstract_names("go")
    with BrokerProcess(command=[GO_NSQD], tcp_address=tcp, http_address=http_path):
        assert {tcp, http_path} <= abstract_listeners()
        publish(tcp, "g", b"to go, abstractly")
        status, body = http(http_path, "GET", "/stats?format=json&topic=g")
        assert status == 200 and json.loads(body)["topics"][0]["depth"] == 1


def test_nsqadmin_listens_on_tcp_only_as_gos(sock_dir):
    path = os.path.join(sock_dir, "admin.sock")
    for command in ([sys.executable, "-m", "nsqd_threaded", "nsqadmin"],
                    [os.path.join(GO_BIN, "nsqadmin")] if os.access(os.path.join(GO_BIN, "nsqadmin"), os.X_OK)
                    else None):
        if command is None:
            continue
        for address in (path, "@nsqadmin-%d" % os.getpid()):
            done = subprocess.run(command + ["--http-address=" + address, "--nsqd-http-address=127.0.0.1:4151"],
                                  capture_output=True, timeout=60, env=dict(os.environ, PYTHONPATH=REPO_ROOT))
            assert done.returncode != 0 and address in done.stderr.decode(), (command, done.stderr)
            assert not os.path.exists(path)


# -- nsqlookupd on sockets ----------------------------------------------------------


def test_nsqlookupd_on_unix_sockets_with_an_nsqd_registering(sock_dir):
    ltcp, lhttp = paths(sock_dir, "lookupd")
    tcp, http_path = paths(sock_dir)
    with Lookupd(tcp_address=ltcp, http_address=lhttp) as lookupd:
        assert lookupd.tcp_addr == ltcp
        assert http(lhttp, "GET", "/ping") == (200, b"OK")
        # On sockets nsqd has no ports to announce (0, as Go's), and a lookupd refuses an
        # IDENTIFY without them, as Go's does: the broker says why at startup.
        with BrokerProcess(tcp_address=tcp, http_address=http_path, broadcast_address="sidecar",
                           nsqlookupd_tcp_addresses=[ltcp]) as nsqd:
            assert nsqd._log.wait_for(lambda text: "--broadcast-tcp-port and --broadcast-http-port" in text, 20)
            assert lookupd._log.wait_for(lambda text: "IDENTIFY missing fields" in text, 20)
        # With the ports a proxy forwards given, it registers.
        with BrokerProcess(tcp_address=tcp, http_address=http_path, broadcast_address="sidecar",
                           broadcast_tcp_port=4150, broadcast_http_port=4151,
                           nsqlookupd_tcp_addresses=[ltcp]) as nsqd:
            nsqd.http("POST", "/pub?topic=reg", b"x")

            def registered():
                doc = json.loads(http(lhttp, "GET", "/lookup?topic=reg")[1])
                return doc.get("producers")
            producers = wait_until(registered, 20, "the registration")
            assert [(p["broadcast_address"], p["tcp_port"], p["http_port"]) for p in producers] == [
                ("sidecar", 4150, 4151)]
            assert producers[0]["remote_address"].startswith("@:")
    assert not os.path.exists(ltcp) and not os.path.exists(lhttp)


def test_a_consumer_asks_a_lookupd_on_a_unix_socket(sock_dir):
    ltcp, lhttp = paths(sock_dir, "lookupd")
    with Lookupd(tcp_address=ltcp, http_address=lhttp) as lookupd:
        with Broker(nsqlookupd_tcp_addresses=[ltcp], broadcast_address="127.0.0.1") as nsqd:
            nsqd.http("POST", "/pub?topic=found", b"via lookupd")
            wait_until(lambda: lookupd.lookup("found"), 20, "the registration")
            got = []
            consumer = Consumer(None, "found", "c", lambda m: got.append(m.body) or True,
                                lookupd_http_addresses=[lhttp])
            consumer.start()
            try:
                wait_until(lambda: got, 20, "the message")
                assert got == [b"via lookupd"]
            finally:
                consumer.close()


def channel_depths(broker, topic):
    stats = broker.stats(topic=topic)
    return {c["channel_name"]: c["depth"] for t in stats["topics"] or () for c in t["channels"] or ()}


@pytest.mark.parametrize("abstract", [False, True], ids=["paths", "abstract"])
def test_a_new_topic_gets_the_clusters_channels_from_a_lookupd_on_unix_sockets(sock_dir, abstract):
    """nsqd asks a lookupd whose HTTP API is on a socket for a new topic's channels, as one on TCP.

    The lookupd's IDENTIFY reply names its HTTP socket; without it (port -1) the
    new topic was held for the hold time (here a minute) and got no channel.
    """
    if abstract and not sys.platform.startswith("linux"):
        pytest.skip("abstract sockets are Linux's")
    ltcp, lhttp = abstract_names("lookupd") if abstract else paths(sock_dir, "lookupd")
    with Lookupd(tcp_address=ltcp, http_address=lhttp):
        cluster = dict(nsqlookupd_tcp_addresses=[ltcp], broadcast_address="127.0.0.1",
                       lookupd_channel_query_hold=60.0)
        with Broker(**cluster) as first, Broker(**cluster) as second:
            assert first.http("POST", "/topic/create?topic=orders")[0] == 200
            assert first.http("POST", "/channel/create?topic=orders&channel=billing")[0] == 200
            wait_until(lambda: json.loads(http(lhttp, "GET", "/channels?topic=orders")[1]).get("channels"),
                       20, "the channel's registration")
            started = time.monotonic()
            second.http("POST", "/pub?topic=orders", b"to every channel of the cluster")
            # the publish was answered once the lookupd answered: the channel is there with the message
            assert channel_depths(second, "orders") == {"billing": 1}
            assert time.monotonic() - started < 30  # not held for the minute
            assert "no available nsqlookupd" not in second.log and "failed to query" not in second.log


def test_a_lookupd_on_tcp_cannot_point_nsqd_at_a_local_socket(sock_dir):
    """Hostile input: ``http_socket`` in the IDENTIFY reply of a lookupd reached over TCP is ignored."""
    trap_path = os.path.join(sock_dir, "trap.sock")
    trap = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    trap.bind(trap_path)
    trap.listen(8)
    trap.settimeout(0.0)
    fake = socket.socket()
    fake.bind(("127.0.0.1", 0))
    fake.listen(8)
    fake.settimeout(20)
    reply = json.dumps({"broadcast_address": "", "hostname": "h", "http_port": -1, "tcp_port": -1,
                        "version": "1.3.0", "http_socket": trap_path}).encode()
    try:
        with Broker(nsqlookupd_tcp_addresses=["127.0.0.1:%d" % fake.getsockname()[1]],
                    broadcast_address="127.0.0.1", lookupd_channel_query_hold=0.2) as nsqd:
            conn, _ = fake.accept()
            try:
                conn.settimeout(20)
                data = b""

                def more():
                    chunk = conn.recv(65536)
                    if not chunk:  # (else the loops below spin on the closed connection)
                        raise ConnectionError("nsqd closed the connection after %r" % data)
                    return chunk

                while b"IDENTIFY\n" not in data or len(data) < data.index(b"IDENTIFY\n") + 13:
                    data += more()
                start = data.index(b"IDENTIFY\n") + 9
                size = struct.unpack(">I", data[start:start + 4])[0]
                while len(data) < start + 4 + size:
                    data += more()
                conn.sendall(struct.pack(">II", 4 + len(reply), 0) + reply)
                nsqd.http("POST", "/pub?topic=t", b"x")
                wait_until(lambda: "no nsqlookupd answered" in nsqd.log, 20, "the hold to end")
                with pytest.raises(BlockingIOError):
                    trap.accept()  # nobody dialed the socket the fake lookupd named
            finally:
                conn.close()
    finally:
        fake.close()
        trap.close()


# -- Go's nsqd on a socket ----------------------------------------------------------


@needs_go
def test_go_nsqd_on_unix_sockets_with_our_client(sock_dir):
    tcp, http_path = paths(sock_dir, "go")
    with BrokerProcess(command=[GO_NSQD], tcp_address=tcp, http_address=http_path) as go:
        with one_message_back(tcp, "g", b"to go", "the message from Go's nsqd"):
            client = go.stats(topic="g")["topics"][0]["channels"][0]["clients"][0]
            assert client["remote_address"] == "@"  # Go's view of a unix peer
        info = json.loads(http(http_path, "GET", "/info")[1])
        assert (info["tcp_port"], info["http_port"]) == (-1, -1)


@needs_go
def test_go_nsqd_refuses_a_stale_socket_where_ours_replaces_it(sock_dir, tmp_path):
    """The divergence, shown: after a SIGKILL Go's nsqd cannot start on its own socket files."""
    tcp, http_path = paths(sock_dir, "go")
    data = str(tmp_path / "go-data")
    os.mkdir(data)
    first = BrokerProcess(command=[GO_NSQD], tcp_address=tcp, http_address=http_path, data_path=data).start()
    first.kill()
    again = BrokerProcess(command=[GO_NSQD], tcp_address=tcp, http_address=http_path, data_path=data)
    with pytest.raises(RuntimeError) as failed:
        again.start()
    assert "bind: address already in use" in str(failed.value)
    ours = BrokerProcess(tcp_address=tcp, http_address=http_path).start()
    try:
        assert http(http_path, "GET", "/ping") == (200, b"OK")
    finally:
        ours.stop()
