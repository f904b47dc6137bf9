"""The loads of the comparison, behind one interface: Go's tools or this project's scripts.

``GoTools`` drives a broker with Go's bench_writer, bench_reader, pub_probe and
rtt_probe (when they sit next to the Go nsqd), ``OurTools`` with ``writer``,
``reader`` and ``roundtrip``; both brokers of a comparison get the same one.
"""

import os
import re
import subprocess
import threading
from datetime import datetime, timedelta, timezone

from . import reader, roundtrip, writer

FANOUT_CHANNELS = 10

_OPS = re.compile(r"([0-9.]+)ops/s")
_UNITS = {"ns": 1e-3, "µs": 1.0, "us": 1.0, "ms": 1e3, "s": 1e6, "m": 60e6, "h": 3600e6}


def go_duration_us(text):
    """A Go time.Duration string (``2.776206ms``, ``1m2.5s``) in microseconds."""
    total = 0.0
    for value, unit in re.findall(r"([0-9.]+)(ns|µs|us|ms|s|m|h)", text):
        total += float(value) * _UNITS[unit]
    return total


def _run_tool(argv, env=None, timeout=300):
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    text = out.stdout + out.stderr
    if out.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (os.path.basename(argv[0]), out.returncode, text[-500:]))
    return text


def _ops(text):
    m = _OPS.findall(text)
    if not m:
        raise RuntimeError("no ops/s in: %s" % text[-300:])
    return float(m[-1])


def _go_deadline(seconds_ahead):
    """The bench tools' --deadline: a UTC wall-clock second far enough ahead for every process."""
    at = datetime.now(timezone.utc) + timedelta(seconds=seconds_ahead)
    return at.strftime("%Y-%m-%d %H:%M:%S")


class GoTools:
    name = "Go's bench_writer/bench_reader/pub_probe/rtt_probe"

    def __init__(self, directory):
        self.dir = directory

    @staticmethod
    def available(directory):
        return all(os.access(os.path.join(directory, t), os.X_OK)
                   for t in ("bench_writer", "bench_reader", "pub_probe", "rtt_probe"))

    def _tool(self, name):
        return os.path.join(self.dir, name)

    def mpub(self, address, topic, runfor):
        return _ops(_run_tool([self._tool("bench_writer"), "--nsqd-tcp-address=" + address, "--topic=" + topic,
                               "--size=200", "--batch-size=200", "--runfor=%gs" % runfor]))

    def consume(self, address, topic, channel, runfor, connections=None):
        env = dict(os.environ, GOMAXPROCS=str(connections)) if connections else None
        return _ops(_run_tool([self._tool("bench_reader"), "--nsqd-tcp-address=" + address, "--topic=" + topic,
                               "--channel=" + channel, "--size=200", "--rdy=2500", "--runfor=%gs" % runfor], env))

    def pub(self, address, topic, runfor):
        return _ops(_run_tool([self._tool("pub_probe"), "--nsqd-tcp-address=" + address, "--topic=" + topic,
                               "--size=200", "--workers=2", "--runfor=%gs" % runfor]))

    def rtt_p99(self, address, count, topic="rtt"):
        text = _run_tool([self._tool("rtt_probe"), "--nsqd-tcp-address=" + address, "--topic=" + topic,
                          "--channel=rtt", "--n=%d" % count, "--size=200"])
        m = re.search(r"p99=(\S+)", text)
        if not m:
            raise RuntimeError("no p99 in: %s" % text[-300:])
        return go_duration_us(m.group(1))

    def fanout(self, address, runfor, topic="fan"):
        """A writer and one single-connection reader per channel, all started at one deadline."""
        deadline = _go_deadline(3)
        env1 = dict(os.environ, GOMAXPROCS="1")
        readers = [
            subprocess.Popen([self._tool("bench_reader"), "--nsqd-tcp-address=" + address, "--topic=" + topic,
                              "--channel=ch%d" % i, "--size=200", "--rdy=2500", "--runfor=%gs" % runfor,
                              "--deadline=" + deadline],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env1)
            for i in range(FANOUT_CHANNELS)
        ]
        publisher = subprocess.Popen([self._tool("bench_writer"), "--nsqd-tcp-address=" + address,
                                      "--topic=" + topic, "--size=200", "--batch-size=200",
                                      "--runfor=%gs" % runfor, "--deadline=" + deadline],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        total = sum(_ops(r.communicate(timeout=runfor + 120)[0]) for r in readers)
        publisher.communicate(timeout=runfor + 120)
        return total


class OurTools:
    name = "this project's scripts (benchmarks.writer, .reader, .roundtrip)"

    def mpub(self, address, topic, runfor):
        return writer.run(address, topic, 200, 200, runfor)[0]

    def consume(self, address, topic, channel, runfor, connections=None):
        return reader.run(address, topic, channel, 2500, runfor, connections)[0]

    def pub(self, address, topic, runfor):
        return writer.run(address, topic, 200, 1, runfor, 2)[0]

    def rtt_p99(self, address, count, topic="rtt"):
        return roundtrip.run(address, topic, count)["p99_us"]

    def fanout(self, address, runfor, topic="fan"):
        rates = [0.0] * FANOUT_CHANNELS

        def consume_channel(i):
            rates[i] = reader.run(address, topic, "ch%d" % i, 2500, runfor, 1)[0]

        threads = [threading.Thread(target=consume_channel, args=(i,), name="fanout-reader-%d" % i)
                   for i in range(FANOUT_CHANNELS)]
        for t in threads:
            t.start()
        writer.run(address, topic, 200, 200, runfor)
        for t in threads:
            t.join()
        return sum(rates)




def choose(directory, ours=False):
    """Go's tools from ``directory`` when they are all there (and not ``ours``), else ours."""
    if not ours and directory and GoTools.available(directory):
        return GoTools(directory)
    return OurTools()
