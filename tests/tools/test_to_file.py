"""nsq_to_file against a real broker and lookupd: names, contents, rotation, gzip, signals (and Go's tool when present)."""

import gzip
import os
import signal
import socket

import pytest

from nsqd_threaded.client import Producer
from nsqd_threaded.testing import Broker

from support.tools import Tool, channel_counts, drain, go_tool, make_channels, run
from support.wire import wait_for

pytestmark = pytest.mark.timeout(120)


def read_all(directory):
    """``{file name: decompressed content}`` of every file under ``directory``."""
    found = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                data = f.read()
            found[os.path.relpath(path, directory)] = gzip.decompress(data) if name.endswith(".gz") else data
    return found


def lines(contents):
    return [line for data in contents.values() for line in data.splitlines()]


def test_every_message_exactly_once_across_rotated_gzipped_files_after_sigterm(broker, tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    bodies = [b"message %05d %s" % (i, b"x" * (i % 50)) for i in range(3000)]
    make_channels(broker, "t", "nsq_to_file")
    with Producer(broker.tcp_addr) as producer:
        for i in range(0, 1500, 100):
            producer.mpub("t", bodies[i:i + 100])
    archiver = Tool("to_file", "--topic=t", "--nsqd-tcp-address=" + broker.tcp_addr, "--output-dir=%s" % out,
                    "--work-dir=%s" % work, "--gzip", "--gzip-level=1", "--rotate-size=4000", "--sync-interval=50ms",
                    "--max-in-flight=50")
    try:
        wait_for(lambda: out.exists() and len(os.listdir(out)) >= 3, timeout=30, what="rotated files")
        with Producer(broker.tcp_addr) as producer:  # more while it runs: SIGTERM lands mid-stream
            for i in range(1500, 3000, 100):
                producer.mpub("t", bodies[i:i + 100])
        archiver.signal(signal.SIGTERM)
        assert archiver.wait() == 0, archiver.err[-2000:]
    finally:
        archiver.close()
    assert os.listdir(work) == []  # every file closed and moved
    contents = read_all(out)
    names = sorted(contents)
    host = socket.gethostname().split(".")[0]
    assert all(n.startswith("t.%s-0000" % host) and n.endswith(".log.gz") for n in names), names
    archived = lines(contents)
    assert len(archived) == len(set(archived))  # none twice
    wait_for(lambda: channel_counts(broker, "t", "nsq_to_file")[1] == 0, what="nothing in flight")
    left = drain(broker, "t", "nsq_to_file")
    assert sorted(archived + left) == sorted(bodies)  # none lost: archived, or still in the channel


def archive_with_ours_and_gos(broker, tmp_path, bodies, *extra):
    """Archive the same messages with our nsq_to_file and Go's (a channel each): ``{who: read_all(dir)}``."""
    go = go_tool("nsq_to_file")
    if go is None:
        pytest.skip("Go's nsq_to_file is not here")
    make_channels(broker, "t", "ours", "gos")
    with Producer(broker.tcp_addr) as producer:
        producer.mpub("t", bodies)
    results = {}
    for who, argv in (("ours", None), ("gos", [go])):
        directory = tmp_path / who
        args = ["--topic=t", "--channel=" + who, "--nsqd-tcp-address=" + broker.tcp_addr,
                "--output-dir=%s" % directory, "--sync-interval=100ms"]
        args += [arg.replace("WHO", who) for arg in extra]
        tool = Tool("nsq_to_file", *args) if argv is None else Tool(argv=argv + args)
        try:
            wait_for(lambda: channel_counts(broker, "t", who)[:2] == (0, 0), timeout=30, what="all FINed")
            tool.signal(signal.SIGTERM)
            assert tool.wait() == 0, tool.err[-2000:]
        finally:
            tool.close()
        results[who] = read_all(directory)
    return results


def test_plain_files_are_named_and_filled_as_gos(broker, tmp_path):
    bodies = [b"line %d" % i for i in range(300)] + [b"\xffbinary\x00", b"with | bar"]
    results = archive_with_ours_and_gos(broker, tmp_path, bodies)
    assert results["ours"] == results["gos"]
    assert list(results["ours"].values())[0] == b"".join(b + b"\n" for b in bodies)


def test_gzip_names_and_contents_as_gos(broker, tmp_path):
    bodies = [b"gz %d" % i for i in range(500)]
    results = archive_with_ours_and_gos(broker, tmp_path, bodies, "--gzip", "--work-dir=%s" % (tmp_path / "WHO-work"))
    assert results["ours"] == results["gos"]
    assert sorted(lines(results["ours"])) == sorted(bodies)


def test_sighup_closes_the_file_and_the_next_message_opens_the_next_revision(broker, tmp_path):
    make_channels(broker, "t", "nsq_to_file")
    archiver = Tool("to_file", "--topic=t", "--nsqd-tcp-address=" + broker.tcp_addr, "--output-dir=%s" % tmp_path,
                    "--rotate-interval=1h", "--sync-interval=50ms")
    try:
        with Producer(broker.tcp_addr) as producer:
            producer.pub("t", b"first")
            wait_for(lambda: channel_counts(broker, "t", "nsq_to_file")[:2] == (0, 0), what="first FINed")
            archiver.signal(signal.SIGHUP)
            archiver.wait_output(lambda out, err: b"SIGHUP: closing" in err, what="the file closed")
            producer.pub("t", b"second")
            wait_for(lambda: len(os.listdir(tmp_path)) == 2, what="a second file")
        archiver.signal(signal.SIGTERM)
        assert archiver.wait() == 0
    finally:
        archiver.close()
    contents = read_all(tmp_path)
    names = sorted(contents)
    assert [n.split(".")[1][-7:] for n in names] == ["-000000", "-000001"]
    assert [contents[n] for n in names] == [b"first\n", b"second\n"]


def test_topic_pattern_discovers_topics_through_lookupd(make_lookupd, tmp_path):
    lookupd = make_lookupd()
    with Broker("--lookupd-tcp-address=" + lookupd.tcp_addr, "--broadcast-address=127.0.0.1") as broker:
        with Producer(broker.tcp_addr) as producer:
            producer.pub("logs.a", b"a1")
            producer.pub("logs.b", b"b1")
            producer.pub("other", b"o1")
        wait_for(lambda: len(lookupd.db.find_registrations("topic", "*", "")) == 3, what="topics registered")
        archiver = Tool("to_file", "--topic-pattern=^logs\\.", "--lookupd-http-address=" + lookupd.http_addr,
                        "--output-dir=%s" % tmp_path, "--topic-refresh=100ms", "--sync-interval=50ms")
        try:
            wait_for(lambda: sorted(b"".join(read_all(tmp_path).values()).split()) == [b"a1", b"b1"], timeout=30,
                     what="both logs topics archived")
            archiver.signal(signal.SIGINT)
            assert archiver.wait() == 0
        finally:
            archiver.close()
        assert b"skipping topic other" in archiver.err
        assert sorted(n.split(".")[0] + "." + n.split(".")[1] for n in read_all(tmp_path)) == ["logs.a", "logs.b"]


def test_empty_files_and_the_checks_go_makes(broker, tmp_path):
    quiet = Tool("to_file", "--topic=t", "--nsqd-tcp-address=" + broker.tcp_addr, "--output-dir=%s" % (tmp_path / "e"),
                 "--sync-interval=50ms")
    try:
        wait_for(lambda: (tmp_path / "e").exists() and len(os.listdir(tmp_path / "e")) == 1,
                 what="the empty file Go makes at the first sync tick")
    finally:
        quiet.signal()
        quiet.wait()
        quiet.close()
    assert list(read_all(tmp_path / "e").values()) == [b""]
    assert run("to_file", "--nsqd-tcp-address=x:1")[2].count("--topic or --topic-pattern required") == 1
    assert "missing <REV>" in run("to_file", "--topic=t", "--nsqd-tcp-address=x:1", "--gzip",
                                  "--filename-format=<TOPIC>.log")[2]
    assert "--lookupd-http-address must be specified" in run("to_file", "--topic-pattern=x",
                                                             "--nsqd-tcp-address=x:1")[2]
    assert "invalid --gzip-level value (10)" in run("to_file", "--topic=t", "--nsqd-tcp-address=x:1",
                                                    "--gzip-level=10")[2]
