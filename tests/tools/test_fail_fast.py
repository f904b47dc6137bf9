"""Where Go's tools give up at once and where they keep going; ours do the same (Go's side by side when present).

* a topic or channel name nsqd would refuse: exit 1 at once, before connecting
  (over lookupd the tool would otherwise wait forever for a topic that cannot exist);
* nsqlookupd down under a consumer: each poll is logged as failed and the tool keeps going;
* to_nsq with one of its nsqd down: the address is named, the others get every line, exit 1.
"""

import re
import signal
import subprocess

import pytest

from nsqd_threaded.client import Consumer
from nsqd_threaded.testing import BrokerProcess

from support.tools import Tool, go_tool, make_channels, run
from support.wire import wait_for

pytestmark = pytest.mark.timeout(120)

DOWN = "127.0.0.1:1"  # nothing listens on port 1

# (our command, Go's binary, the arguments but the names, what is refused with which words)
BAD_NAMES = [
    ("tail", "nsq_tail", ["--nsqd-tcp-address=" + DOWN], "--topic=bad/topic", [], "invalid topic name"),
    ("tail", "nsq_tail", ["--lookupd-http-address=" + DOWN], "--topic=bad/topic", [], "invalid topic name"),
    ("tail", "nsq_tail", ["--nsqd-tcp-address=" + DOWN], "--topic=t", ["--channel=bad/c"], "invalid channel name"),
    ("to-http", "nsq_to_http", ["--lookupd-http-address=" + DOWN, "--post=http://127.0.0.1:1/"],
     "--topic=bad/topic", ["--channel=c"], "invalid topic name"),
    ("to-http", "nsq_to_http", ["--nsqd-tcp-address=" + DOWN, "--post=http://127.0.0.1:1/"],
     "--topic=t", ["--channel=bad#c"], "invalid channel name"),
    ("relay", "nsq_to_nsq", ["--lookupd-http-address=" + DOWN, "--destination-nsqd-tcp-address=" + DOWN],
     "--topic=bad/topic", ["--channel=c"], "--topic is invalid"),
    ("relay", "nsq_to_nsq", ["--nsqd-tcp-address=" + DOWN, "--destination-nsqd-tcp-address=" + DOWN],
     "--topic=t", ["--channel=bad/c"], "--channel is invalid"),
    # Go's nsq_to_file logs the refusal and then waits forever (see docs/divergences.md): ours only
    ("to-file", None, ["--lookupd-http-address=" + DOWN], "--topic=bad/topic", [], "invalid topic name"),
    ("to-file", None, ["--nsqd-tcp-address=" + DOWN], "--topic=t", ["--channel=bad/c"], "invalid channel name"),
]


@pytest.mark.parametrize("command, go_name, args, topic, more, words", BAD_NAMES)
def test_a_bad_topic_or_channel_name_exits_1_at_once(command, go_name, args, topic, more, words, tmp_path):
    if command == "to-file":
        args = args + ["--output-dir=%s" % tmp_path]
    code, _, err = run(command, topic, *(args + more), timeout=60)
    assert code == 1, err
    assert re.search(r"FATAL: %s$" % re.escape(words), err, re.M), err
    assert "connecting" not in err  # refused before anything is dialled
    go = go_tool(go_name) if go_name else None
    if go is not None:
        code, _, err = run(argv=[go, topic] + args + more, timeout=60)
        assert code == 1 and err.rstrip().endswith(words), err


def tail_over_a_dead_lookupd(argv):
    tool = Tool(*argv) if argv[0] == "tail" else Tool(argv=argv)
    try:
        url = re.escape("http://%s/lookup?topic=t" % DOWN)
        failures = re.compile(r"error querying nsqlookupd \(%s\) - .*(refused|Refused)" % url)
        # one failure per poll (Go's retries each poll up to three times): a second poll is the proof
        polls = re.compile(r"querying nsqlookupd %s$" % url, re.M)
        tool.wait_output(lambda out, err: len(polls.findall(err.decode())) >= 4 and failures.search(err.decode()),
                         timeout=40, what="the failed polls logged")
        assert tool.proc.poll() is None  # still running
        tool.signal(signal.SIGTERM)
        assert tool.wait() == 0
    finally:
        tool.close()


def test_nsq_tail_keeps_polling_a_lookupd_that_is_down():
    tail_over_a_dead_lookupd(["tail", "--topic=t", "--lookupd-http-address=" + DOWN,
                              "--consumer-opt=lookupd_poll_interval,1s"])
    go = go_tool("nsq_tail")
    if go is not None:
        tail_over_a_dead_lookupd([go, "--topic=t", "--lookupd-http-address=" + DOWN,
                                  "--consumer-opt=lookupd_poll_interval,1s"])


def test_nsq_to_file_keeps_polling_a_lookupd_that_is_down(tmp_path):
    tool = Tool("to-file", "--topic=t", "--lookupd-http-address=" + DOWN, "--output-dir=%s" % tmp_path,
                "--consumer-opt=lookupd_poll_interval,1s")
    try:
        failures = re.compile(r"ERROR: .*error querying nsqlookupd \(http://%s/lookup\?topic=t\) - " % re.escape(DOWN))
        tool.wait_output(lambda out, err: len(failures.findall(err.decode())) >= 2, timeout=40,
                         what="two failed polls logged")
        assert b"couldn't create logger" not in tool.err
        tool.signal(signal.SIGTERM)
        assert tool.wait() == 0
    finally:
        tool.close()


def drain(broker, topic, channel, count):
    got = []
    with Consumer(broker.tcp_addr, topic, channel, max_in_flight=100) as consumer:
        while len(got) < count:
            msg = consumer.get(timeout=20)
            got.append(msg.body)
            msg.fin()
    return got


def test_to_nsq_names_the_nsqd_that_is_down_and_publishes_every_line_to_the_other(broker):
    make_channels(broker, "ours", "check")
    make_channels(broker, "gos", "check")
    lines = b"a\nb\nc\n"
    code, _, err = run("to_nsq", "--topic=ours", "--nsqd-tcp-address=" + broker.tcp_addr,
                       "--nsqd-tcp-address=" + DOWN, input=lines)
    assert code == 1, err
    assert "dial tcp %s: connect: connection refused" % DOWN in err
    assert re.search(r"ERROR: %s: .*not publishing to it any more" % re.escape(DOWN), err), err
    assert drain(broker, "ours", "check", 3) == [b"a", b"b", b"c"]
    go = go_tool("to_nsq")
    if go is not None:
        # Go's names the address too (its first publish to the dead one ends it)
        code, _, err = run(argv=[go, "--topic=gos", "--nsqd-tcp-address=" + broker.tcp_addr,
                                 "--nsqd-tcp-address=" + DOWN], input=lines)
        assert code == 1 and "dial tcp %s: connect: connection refused" % DOWN in err


def test_to_nsq_with_every_nsqd_down_exits_1_naming_them():
    code, _, err = run("to_nsq", "--topic=t", "--nsqd-tcp-address=" + DOWN, "--nsqd-tcp-address=127.0.0.1:2",
                       input=b"x\n")
    assert code == 1
    assert re.search(r"FATAL: .*127\.0\.0\.1:1.*127\.0\.0\.1:2", err), err



def test_to_nsq_keeps_publishing_to_the_nsqd_left_when_one_dies_midway(broker):
    make_channels(broker, "t", "check")
    with BrokerProcess() as dying:
        pub = Tool("to_nsq", "--topic=t", "--nsqd-tcp-address=" + broker.tcp_addr,
                   "--nsqd-tcp-address=" + dying.tcp_addr, stdin=subprocess.PIPE)
        try:
            pub.proc.stdin.write(b"before\n")
            pub.proc.stdin.flush()
            wait_for(lambda: [t["message_count"] for t in dying.stats(topic="t")["topics"] or ()] == [1], timeout=30,
                     what="the first line on the nsqd that will die")
            dying.kill()
            pub.proc.stdin.write(b"after\nand more\n")
            pub.proc.stdin.close()
            assert pub.wait(timeout=60) == 1
            err = pub.err.decode()
            assert re.search(r"ERROR: %s: .*not publishing to it any more" % re.escape(dying.tcp_addr), err), err
        finally:
            pub.close()
    assert drain(broker, "t", "check", 3) == [b"before", b"after", b"and more"]
