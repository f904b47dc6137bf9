"""nsq_to_nsq between real brokers: exactly once, modes, JSON filters (and Go's tool when present)."""

import json
import signal

import pytest

from nsqd_threaded.client import Producer
from nsqd_threaded.testing import Broker
from nsqd_threaded.tools.nsq_to_nsq import decode_object, encode_go_json

from support.tools import Tool, channel_counts, drain, go_tool, run
from support.wire import wait_for

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def source():
    with Broker() as b:
        yield b


@pytest.fixture
def dest():
    with Broker() as b:
        yield b


def message_count(broker, topic):
    topic = broker.nsqd.get_existing_topic(topic)
    return 0 if topic is None else topic.message_count


def prepare(broker, topic, channel, bodies):
    broker.nsqd.get_topic(topic).get_channel(channel)
    with Producer(broker.tcp_addr) as producer:
        for i in range(0, len(bodies), 200):
            producer.mpub(topic, bodies[i:i + 200])


def stop(tool):
    tool.signal(signal.SIGTERM)
    code = tool.wait()
    tool.close()
    return code


def test_relays_every_message_exactly_once_and_fins_after_the_destination_took_it(source, dest):
    bodies = [b"relay %04d" % i for i in range(2000)]
    prepare(source, "t", "nsq_to_nsq", bodies)
    dest.nsqd.get_topic("t").get_channel("check")
    tool = Tool("relay", "--topic=t", "--nsqd-tcp-address=" + source.tcp_addr,
                "--destination-nsqd-tcp-address=" + dest.tcp_addr)
    try:
        wait_for(lambda: message_count(dest, "t") >= len(bodies), timeout=60, what="every message relayed")
        wait_for(lambda: channel_counts(source, "t", "nsq_to_nsq") == (0, 0, 0), what="every message FINed")
    finally:
        assert stop(tool) == 0
    assert message_count(dest, "t") == len(bodies)
    assert sorted(drain(dest, "t", "check", len(bodies))) == bodies


def test_sigterm_mid_stream_loses_nothing_and_repeats_nothing(source, dest):
    bodies = [b"m%05d" % i for i in range(6000)]
    prepare(source, "t", "nsq_to_nsq", bodies)
    dest.nsqd.get_topic("t").get_channel("check")
    tool = Tool("relay", "--topic=t", "--nsqd-tcp-address=" + source.tcp_addr,
                "--destination-nsqd-tcp-address=" + dest.tcp_addr, "--max-in-flight=50")
    try:
        wait_for(lambda: message_count(dest, "t") >= 500, timeout=60, what="some messages relayed")
    finally:
        assert stop(tool) == 0
    relayed = message_count(dest, "t")
    assert relayed < len(bodies), "stopped too late to test anything"
    wait_for(lambda: channel_counts(source, "t", "nsq_to_nsq")[1:] == (0, 0), what="nothing in flight")
    left = channel_counts(source, "t", "nsq_to_nsq")[0]
    got = drain(dest, "t", "check", relayed) + drain(source, "t", "nsq_to_nsq", left)
    assert sorted(got) == bodies


def test_round_robin_over_two_destinations_under_another_topic(source, dest):
    bodies = [b"rr%03d" % i for i in range(100)]
    prepare(source, "a", "nsq_to_nsq", bodies[:50])
    prepare(source, "b", "nsq_to_nsq", bodies[50:])
    with Broker() as dest2:
        tool = Tool("relay", "--topic=a", "--topic=b", "--nsqd-tcp-address=" + source.tcp_addr,
                    "--destination-nsqd-tcp-address=" + dest.tcp_addr,
                    "--destination-nsqd-tcp-address=" + dest2.tcp_addr, "--destination-topic=all",
                    "--mode=round-robin", "--status-every=20")
        try:
            wait_for(lambda: message_count(dest, "all") + message_count(dest2, "all") == len(bodies), timeout=30,
                     what="every message relayed")
        finally:
            assert stop(tool) == 0
        assert message_count(dest, "all") == message_count(dest2, "all") == 50
    assert b"[aggregate]: finished 20 - 99th: " in tool.err


JSON_BODIES = [
    b'{"kind":"order","id":1,"price":12.5,"note":"<b>&amp;</b>"}',
    b'{"kind":"refund","id":2}',
    b'{"kind":"order","id":3,"nested":{"z":1,"a":[1,2.0,"x"]},"big":1e21,"small":0.0000001}',
    b'{"id":4}',
    b'not json',
    b'[1,2,3]',
    b'{"kind":5,"id":5}',
    '{"kind":"order","id":6,"ü":"\\u2028","tab":"\\t\\b"}'.encode(),
]


def relay_json(source, dest, channel, argv0, *flags):
    """Relay JSON_BODIES through ``argv0`` (ours: None) with ``flags``; the bodies that reached ``dest``."""
    prepare(source, "j", channel, JSON_BODIES)
    dest.nsqd.get_topic(channel).get_channel("check")
    args = ["--topic=j", "--channel=" + channel, "--nsqd-tcp-address=" + source.tcp_addr,
            "--destination-nsqd-tcp-address=" + dest.tcp_addr, "--destination-topic=" + channel,
            "--consumer-opt=max_attempts,1"] + list(flags)
    tool = Tool("relay", *args) if argv0 is None else Tool(argv=[argv0] + args)
    try:
        # every message answered: relayed, dropped (FIN) or requeued with backoff (then deferred for 90s)
        wait_for(lambda: channel_counts(source, "j", channel)[:2] == (0, 0), timeout=30, what="every message handled")
    finally:
        assert stop(tool) == 0
    return sorted(drain(dest, channel, "check", message_count(dest, channel))), tool.err


def test_json_filters_require_and_whitelist(source, dest):
    got, err = relay_json(source, dest, "ours", None, "--require-json-field=kind", "--require-json-value=order",
                          "--whitelist-json-field=id", "--whitelist-json-field=note",
                          "--whitelist-json-field=nested", "--whitelist-json-field=big",
                          "--whitelist-json-field=small", "--whitelist-json-field=ü", "--whitelist-json-field=tab")
    assert got == sorted([
        b'{"id":1,"note":"\\u003cb\\u003e\\u0026amp;\\u003c/b\\u003e"}',
        b'{"big":1e+21,"id":3,"nested":{"a":[1,2,"x"],"z":1},"small":1e-7}',
        '{"id":6,"tab":"\\t\\u0008","ü":"\\u2028"}'.encode(),
    ])
    assert b"Unable to decode json: not json" in err and b"Unable to decode json: [1,2,3]" in err
    assert b"missing field to check required value" in err  # {"id":4}: requeued with backoff
    assert channel_counts(source, "j", "ours")[2] == 1  # ... and deferred


def test_json_value_compares_numbers_as_numbers(source, dest):
    got, _ = relay_json(source, dest, "ours", None, "--require-json-field=id", "--require-json-value=3.0")
    assert got == [JSON_BODIES[2]]


def test_go_json_encoding_of_numbers_and_strings():
    assert encode_go_json(decode_object(b'{"a":1.0,"b":-0.0,"c":1e20,"d":123456789012345678,"e":0.00001}')) == \
        '{"a":1,"b":-0,"c":100000000000000000000,"d":123456789012345680,"e":0.00001}'
    assert encode_go_json(decode_object(b"null")) == "{}"
    assert json.loads(encode_go_json({"k": "\x01\u2029"})) == {"k": "\x01\u2029"}


def test_same_relayed_messages_as_gos_nsq_to_nsq(source, dest):
    go = go_tool("nsq_to_nsq")
    if go is None:
        pytest.skip("Go's nsq_to_nsq is not here")
    flags = ["--require-json-field=kind", "--require-json-value=order", "--whitelist-json-field=id",
             "--whitelist-json-field=note", "--whitelist-json-field=nested", "--whitelist-json-field=big",
             "--whitelist-json-field=small", "--whitelist-json-field=ü", "--whitelist-json-field=tab"]
    ours, _ = relay_json(source, dest, "ours", None, *flags)
    gos, _ = relay_json(source, dest, "gos", go, *flags)
    assert ours == gos and len(ours) == 3
    plain_ours, _ = relay_json(source, dest, "plain_ours", None)
    plain_gos, _ = relay_json(source, dest, "plain_gos", go)
    assert plain_ours == plain_gos == sorted(JSON_BODIES)


def test_nsq_to_nsq_refuses_what_go_refuses():
    base = ["relay", "--nsqd-tcp-address=127.0.0.1:1"]
    cases = [
        (base + ["--destination-nsqd-tcp-address=127.0.0.1:2"], "--topic and --channel are required"),
        (base + ["--topic=bad topic", "--destination-nsqd-tcp-address=127.0.0.1:2"], "--topic is invalid"),
        (base + ["--topic=t", "--destination-topic=b/d", "--destination-nsqd-tcp-address=127.0.0.1:2"],
         "--destination-topic is invalid"),
        (base + ["--topic=t"], "--destination-nsqd-tcp-address required"),
        (["relay", "--topic=t", "--destination-nsqd-tcp-address=127.0.0.1:2"],
         "--nsqd-tcp-address or --lookupd-http-address required"),
        (base + ["--topic=t", "--destination-nsqd-tcp-address=127.0.0.1:2", "--producer-opt=nope"],
         "invalid option nope"),
    ]
    for argv, message in cases:
        code, _, err = run(*argv)
        assert code == 1 and message in err, (argv, err)
