"""nsq_tail, to_nsq and nsq_stat as commands against a real broker and lookupd (and Go's tools when present)."""

import re
import signal
import time

import pytest

from nsqd_threaded.client import Consumer, Producer
from nsqd_threaded.testing import Broker

from support.tools import Tool, go_tool, make_channels, run
from support.wire import wait_for

pytestmark = pytest.mark.timeout(90)

BODIES = [b"hello", b"with spaces and | bars", b"\x00\x01binary\xff", b"tab\there", b"x" * 5000, "ünïcode".encode()]


def channel(broker, topic, name):
    for t in broker.stats(topic=topic)["topics"] or ():
        for c in t["channels"] or ():
            if c["channel_name"] == name:
                return c
    return None


def expected_tail(bodies, topic=None):
    prefix = topic.encode() + b" | " if topic else b""
    return b"".join(prefix + b + b"\n" for b in bodies)


# -- nsq_tail ------------------------------------------------------------------------------


def test_nsq_tail_prints_each_body_and_exits_after_n(broker):
    make_channels(broker, "t", "ours")
    with Producer(broker.tcp_addr) as producer:
        producer.mpub("t", BODIES)
    code, out, err = run("tail", "--topic=t", "--channel=ours", "--nsqd-tcp-address", broker.tcp_addr,
                         "-n", str(len(BODIES)))
    assert code == 0, err
    assert out == expected_tail(BODIES)
    assert "Adding consumer for topic: t" in err
    wait_for(lambda: channel(broker, "t", "ours")["depth"] == 0 and channel(broker, "t", "ours")["in_flight_count"] == 0,
             what="every shown message FINed")


def test_nsq_tail_output_is_byte_identical_to_gos(broker):
    go = go_tool("nsq_tail")
    if go is None:
        pytest.skip("Go's nsq_tail is not here")
    make_channels(broker, "t", "ours", "gos")
    with Producer(broker.tcp_addr) as producer:
        producer.mpub("t", BODIES)
    ours = run("nsq_tail", "--topic=t", "--channel=ours", "--nsqd-tcp-address=" + broker.tcp_addr,
               "--n=%d" % len(BODIES), "--print-topic")
    gos = run(argv=[go, "--topic=t", "--channel=gos", "--nsqd-tcp-address=" + broker.tcp_addr,
                    "--n=%d" % len(BODIES), "--print-topic"])
    assert ours[0] == gos[0] == 0, (ours[2], gos[2])
    assert ours[1] == gos[1] == expected_tail(BODIES, "t")


def test_nsq_tail_ephemeral_channel_by_default_and_sigterm(broker):
    tail = Tool("tail", "--topic=t", "--nsqd-tcp-address=" + broker.tcp_addr)
    try:
        name = wait_for(lambda: [c["channel_name"] for t in broker.stats(topic="t")["topics"] or () for c in t["channels"] or ()],
                        what="the tail's channel")[0]
        assert re.fullmatch(r"tail\d{6}#ephemeral", name), name
        with Producer(broker.tcp_addr) as producer:
            producer.pub("t", b"one")
        tail.wait_output(lambda out, err: out == b"one\n", what="the message")
        tail.signal(signal.SIGTERM)
        assert tail.wait() == 0
        assert b"SIGTERM: shutting down" in tail.err
        wait_for(lambda: channel(broker, "t", name) is None, what="the ephemeral channel gone")
    finally:
        tail.close()


def test_nsq_tail_several_topics_through_lookupd(make_lookupd):
    lookupd = make_lookupd()
    with Broker("--lookupd-tcp-address=" + lookupd.tcp_addr, "--broadcast-address=127.0.0.1") as broker:
        with Producer(broker.tcp_addr) as producer:
            producer.pub("a", b"from a")
            producer.pub("b", b"from b")
        wait_for(lambda: len(lookupd.db.find_registrations("topic", "*", "")) == 2, what="both topics registered")
        tail = Tool("tail", "--topic=a", "--topic=b", "--lookupd-http-address=" + lookupd.http_addr, "--print-topic")
        try:
            tail.wait_output(lambda out, err: out.count(b"\n") == 2, what="both messages")
            assert sorted(tail.out.splitlines()) == [b"a | from a", b"b | from b"]
            tail.signal(signal.SIGINT)
            assert tail.wait() == 0
        finally:
            tail.close()


def test_nsq_tail_refuses_what_go_refuses(broker):
    assert run("tail", "--topic=t")[0] == 1
    code, _, err = run("tail", "--nsqd-tcp-address=" + broker.tcp_addr)
    assert code == 1 and "--topic required" in err
    code, _, err = run("tail", "--topic=t", "--nsqd-tcp-address=" + broker.tcp_addr, "--lookupd-http-address=x:1")
    assert code == 1 and "not both" in err
    code, _, err = run("tail", "--topic=t", "--nsqd-tcp-address=" + broker.tcp_addr, "--consumer-opt=nope,1")
    assert code == 1 and "invalid option nope" in err


def test_nsq_tail_consumer_opt_is_negotiated(broker):
    tail = Tool("tail", "--topic=t", "--channel=c", "--nsqd-tcp-address=" + broker.tcp_addr,
                "--consumer-opt=deflate", "--consumer-opt=sample_rate,50", "--max-in-flight=9")
    try:
        client = wait_for(lambda: [c for c in broker.nsqd.clients() if c.channel is not None and c.ready_count == 9],
                          what="the tail subscribed with RDY 9")[0]
        assert client.deflate and client.sample_rate == 50
        assert client.user_agent.startswith("nsq_tail/")
    finally:
        tail.signal()
        tail.wait()
        tail.close()


# -- to_nsq --------------------------------------------------------------------------------


def drain(broker, topic, count):
    got = []
    with Consumer(broker.tcp_addr, topic, "check", max_in_flight=100) as consumer:
        while len(got) < count:
            msg = consumer.get(timeout=20)
            got.append(msg.body)
            msg.fin()
    return got


def test_to_nsq_publishes_each_line_to_every_nsqd(make_lookupd):
    with Broker() as one, Broker() as two:
        make_channels(one, "t", "check")
        make_channels(two, "t", "check")
        code, _, err = run("to_nsq", "--topic=t", "--nsqd-tcp-address=" + one.tcp_addr,
                           "--nsqd-tcp-address=" + two.tcp_addr, input=b"a\nb b\n\n\xffc\n")
        assert code == 0, err
        for broker in (one, two):
            assert drain(broker, "t", 3) == [b"a", b"b b", b"\xffc"]
            assert channel(broker, "t", "check")["message_count"] == 3


def test_to_nsq_delimiter_rate_and_a_last_line_without_delimiter(broker):
    make_channels(broker, "t", "check")
    started = time.monotonic()
    code, _, err = run("to-nsq", "--topic=t", "--nsqd-tcp-address=" + broker.tcp_addr, "--delimiter=,",
                       "--rate=20", input=b"1,2,3,4,5,6,7,8,9,10,11")
    elapsed = time.monotonic() - started
    assert code == 0, err
    assert "Throttling messages rate to max:20/second" in err
    assert elapsed >= 0.4  # 11 messages at 20/s with one message of credit: half a second at least
    assert drain(broker, "t", 11) == [str(i).encode() for i in range(1, 12)]


def test_to_nsq_matches_gos_for_the_same_input(broker):
    go = go_tool("to_nsq")
    if go is None:
        pytest.skip("Go's to_nsq is not here")
    make_channels(broker, "ours", "check")
    make_channels(broker, "gos", "check")
    data = b"one\ntwo\n\n three \n" + bytes(range(1, 10)) + b"\n"
    assert run("to_nsq", "--topic=ours", "--nsqd-tcp-address=" + broker.tcp_addr, input=data)[0] == 0
    assert run(argv=[go, "--topic=gos", "--nsqd-tcp-address=" + broker.tcp_addr], input=data)[0] == 0
    assert drain(broker, "ours", 4) == drain(broker, "gos", 4)


def test_to_nsq_refuses_what_go_refuses_and_fails_on_a_dead_nsqd():
    assert "--topic required" in run("to_nsq", "--nsqd-tcp-address=127.0.0.1:1", input=b"")[2]
    assert "single byte" in run("to_nsq", "--topic=t", "--delimiter=ab", "--nsqd-tcp-address=127.0.0.1:1",
                                input=b"")[2]
    code, _, err = run("to_nsq", "--topic=t", input=b"")
    assert code == 1 and "--nsqd-tcp-address required" in err
    code, _, err = run("to_nsq", "--topic=t", "--nsqd-tcp-address=127.0.0.1:1", input=b"x\n")
    assert code == 1 and "FATAL" in err


def test_to_nsq_stops_reading_on_sigterm(broker):
    make_channels(broker, "t", "check")
    import subprocess

    pub = Tool("to_nsq", "--topic=t", "--nsqd-tcp-address=" + broker.tcp_addr, stdin=subprocess.PIPE)
    try:
        pub.proc.stdin.write(b"before\n")
        pub.proc.stdin.flush()
        wait_for(lambda: channel(broker, "t", "check")["message_count"] == 1, what="the first line published")
        pub.signal(signal.SIGTERM)  # stdin stays open: the reader must be woken
        assert pub.wait() == 0
    finally:
        pub.close()


# -- nsq_stat ------------------------------------------------------------------------------


def test_nsq_stat_header_and_rows(broker):
    make_channels(broker, "t", "c")
    with Producer(broker.tcp_addr) as producer:
        producer.mpub("t", [b"m"] * 7)
    code, out, err = run("stat", "--topic=t", "--channel=c", "--nsqd-http-address=" + broker.http_addr,
                         "--count=2", "--interval=100ms")
    assert code == 0, err
    lines = out.decode().splitlines()
    assert lines[0] == "------rate------+----------------depth----------------+--------------metadata---------------"
    assert lines[1] == "ingress  egress |   total     mem    disk inflt   def |     req     t-o         msgs clients"
    assert len(lines) == 4
    assert lines[2].split() == ["0", "0", "|", "7", "7", "0", "0", "0", "|", "0", "0", "7", "0"]


def test_nsq_stat_prints_what_gos_prints(broker):
    go = go_tool("nsq_stat")
    if go is None:
        pytest.skip("Go's nsq_stat is not here")
    make_channels(broker, "t", "c")
    with Producer(broker.tcp_addr) as producer:
        producer.mpub("t", [b"m"] * 12)
    args = ["--topic=t", "--channel=c", "--nsqd-http-address=" + broker.http_addr, "--count=1", "--interval=100ms"]
    ours = run("nsq_stat", *args)
    gos = run(argv=[go] + args)
    assert ours[0] == gos[0] == 0, (ours[2], gos[2])
    assert ours[1] == gos[1]


def test_nsq_stat_through_lookupd_and_its_failures(make_lookupd):
    lookupd = make_lookupd()
    with Broker("--lookupd-tcp-address=" + lookupd.tcp_addr, "--broadcast-address=127.0.0.1") as broker:
        make_channels(broker, "t", "c")
        wait_for(lambda: lookupd.db.find_registrations("channel", "t", "c"), what="the channel registered")
        code, out, err = run("stat", "--topic=t", "--channel=c", "--lookupd-http-address=" + lookupd.http_addr,
                             "--count=1", "--interval=50ms")
        assert code == 0, err
        assert len(out.splitlines()) == 3
        code, out, err = run("stat", "--topic=t", "--channel=nope", "--nsqd-http-address=" + broker.http_addr,
                             "--count=1")
        assert code == 1 and "failed to find channel(nope) in stats metadata for topic(t)" in err
    assert "--topic and --channel are required" in run("stat", "--topic=t", "--nsqd-http-address=x:1")[2]
    assert "should not contain scheme" in run("stat", "--topic=t", "--channel=c",
                                              "--nsqd-http-address=http://x:1")[2]
    assert "--count should be positive" in run("stat", "--topic=t", "--channel=c", "--nsqd-http-address=x:1",
                                               "--count=0")[2]
