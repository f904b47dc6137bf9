"""The tools say what happens to their connections, in go-nsq's words, next to Go's tools when present.

A broker killed under nsq_tail, a topic that does not exist yet when a
consumer asks lookupd, an nsqd that is down under to_nsq: each event is a log
line with the tool's prefix and time and go-nsq's text (``(127.0.0.1:4150) IO
error - EOF``).  The lookupd poll interval is shortened with go-nsq's option
(``--consumer-opt=lookupd_poll_interval,1s``), as an operator would.
"""

import re
import signal

import pytest

from nsqd_threaded.client import Producer
from nsqd_threaded.testing import Broker, BrokerProcess

from support.tools import Tool, go_tool, run
from support.wire import wait_for

pytestmark = pytest.mark.timeout(120)

FAST_POLL = "--consumer-opt=lookupd_poll_interval,1s"


def tails(*args):
    """Our nsq_tail, and Go's when it is here."""
    go = go_tool("nsq_tail")
    return [Tool("nsq_tail", *args)] + ([Tool(argv=[go] + list(args))] if go else [])


def err_text(tool):
    return tool.err.decode("utf-8", "replace")


def wait_line(tool, pattern, count=1, what=None):
    """Wait until ``count`` stderr lines match ``pattern``."""
    regex = re.compile(pattern, re.M)
    tool.wait_output(lambda out, err: len(regex.findall(err.decode("utf-8", "replace"))) >= count, timeout=40,
                     what=what or pattern)


def stop(tools):
    for tool in tools:
        if tool.proc.poll() is None:
            tool.signal(signal.SIGTERM)
    codes = [tool.wait() for tool in tools]
    for tool in tools:
        tool.close()
    return codes


def channels(broker, topic):
    return [c for t in broker.stats(topic=topic)["topics"] or () for c in t["channels"] or ()]


def test_a_killed_broker_is_logged_with_its_address_and_the_tail_reconnects_to_its_restart():
    with BrokerProcess() as broker:
        addr = broker.tcp_addr
        running = tails("--topic=v", "--nsqd-tcp-address=" + addr, FAST_POLL)
        try:
            for tool in running:
                wait_line(tool, r"\[v/tail\d{6}#ephemeral\] \(%s\) connecting to nsqd$" % re.escape(addr))
            wait_for(lambda: len(channels(broker, "v")) == len(running), timeout=30, what="every tail subscribed")
            with Producer(addr) as producer:
                producer.pub("v", b"first")
            for tool in running:
                tool.wait_output(lambda out, err: out == b"first\n", what="the first message")
            broker.kill()
            for tool in running:
                # go-nsq's: the IO error naming the address, the connections left, then the redials
                # EOF, or a reset when the killed broker had not read everything sent to it
                wait_line(tool, r"ERR.* \[v/tail\d{6}#ephemeral\] \(%s\) IO error - (EOF|.*connection reset by peer)$"
                          % re.escape(addr))
                wait_line(tool, r"WRN.* there are 0 connections left alive$|WARNING: .* there are 0 connections")
                wait_line(tool, r"\(%s\) re-connecting in \S+$" % re.escape(addr))
                wait_line(tool, r"\(%s\) error connecting to nsqd - dial tcp %s: connect: connection refused$"
                          % (re.escape(addr), re.escape(addr)))
            ours_log = err_text(running[0])
            for line in ours_log.splitlines():  # every line is the tool's own format
                assert re.match(r"\[nsq_tail\] \d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{6} (INFO|WARNING|ERROR): ", line), line
            assert "Connection reset" not in ours_log and "<Consumer" not in ours_log
            broker.restart()
            wait_for(lambda: len(channels(broker, "v")) == len(running), timeout=40,
                     what="every tail subscribed again (their ephemeral channels went with the crash)")
            with Producer(addr) as producer:
                producer.pub("v", b"second")
            for tool in running:
                tool.wait_output(lambda out, err: out.endswith(b"second\n"), what="the message after the restart")
            assert stop(running) == [0] * len(running)
        finally:
            stop(running)


def test_a_topic_made_after_the_tail_started_is_found_at_the_next_lookupd_poll(make_lookupd):
    lookupd = make_lookupd()
    running = tails("--topic=late", "--lookupd-http-address=" + lookupd.http_addr, FAST_POLL)
    try:
        url = re.escape("http://%s/lookup?topic=late" % lookupd.http_addr)
        for tool in running:
            wait_line(tool, r"querying nsqlookupd %s$" % url, count=2)
            wait_line(tool, r'error querying nsqlookupd \(%s\) - got response 404 Not Found '
                      r'"\{\\"message\\":\\"TOPIC_NOT_FOUND\\"\}"$' % url, count=2)
        with Broker("--lookupd-tcp-address=" + lookupd.tcp_addr, "--broadcast-address=127.0.0.1") as broker:
            broker.nsqd.get_topic("late")  # registered with lookupd; the tails find it at their next poll
            for tool in running:
                wait_line(tool, r"\(%s\) connecting to nsqd$" % re.escape(broker.tcp_addr))
            # within a poll or two, not after lookupd's default minute
            wait_for(lambda: len(channels(broker, "late")) == len(running), timeout=20, what="every tail subscribed")
            with Producer(broker.tcp_addr) as producer:
                producer.pub("late", b"found")
            for tool in running:
                tool.wait_output(lambda out, err: out == b"found\n", what="the message of the new topic")
            assert stop(running) == [0] * len(running)
    finally:
        stop(running)


def test_to_nsq_logs_its_connections_in_go_nsqs_words(broker):
    data = b"one\n"
    ours_run = run("to_nsq", "--topic=t", "--nsqd-tcp-address=" + broker.tcp_addr, "--nsqd-tcp-address=127.0.0.1:1",
                   input=data)
    runs = [ours_run]
    go = go_tool("to_nsq")
    if go is not None:
        runs.append(run(argv=[go, "--topic=t", "--nsqd-tcp-address=" + broker.tcp_addr,
                              "--nsqd-tcp-address=127.0.0.1:1"], input=data))
    for (code, _, err), ours in zip(runs, (True, False)):
        assert code == 1, err
        if ours:  # Go's to_nsq visits its producers in map order and exits at the first failure,
            # so it may never dial the broker that is up; ours dials each
            assert re.search(r"\d \(%s\) connecting to nsqd$" % re.escape(broker.tcp_addr), err, re.M), err
        assert re.search(r"\d \(127\.0\.0\.1:1\) error connecting to nsqd - dial tcp 127\.0\.0\.1:1: connect: "
                         r"connection refused$", err, re.M), err
