"""Broker.sync(): a barrier for crash tests.  With --durable, everything acknowledged is on disk when it
returns, so a SIGKILL right after loses and duplicates nothing."""

import pytest

from nsqd_threaded.client import Producer
from nsqd_threaded.testing import Broker, BrokerProcess

pytestmark = pytest.mark.timeout(120)


def bodies(nsqd, topic, channel):
    return sorted(m.body for m in nsqd.messages(topic, channel))


@pytest.mark.parametrize("flags", [("--durable",), ("--mem-queue-size=0",)])
def test_a_kill_after_sync_loses_and_duplicates_nothing(tmp_path, flags):
    for trial in range(3):  # (each a fresh broker: the kill comes at once after the barrier)
        with BrokerProcess(*flags, tmp_dir=str(tmp_path)) as nsqd:
            nsqd.create("orders", "billing")
            nsqd.create("orders", "audit")
            sent = [b"order %d-%d" % (trial, i) for i in range(200)]
            with Producer(nsqd.tcp_address) as producer:
                for body in sent[:100]:
                    producer.pub("orders", body)
                producer.mpub("orders", sent[100:])
            nsqd.sync()
            nsqd.restart(kill=True)  # SIGKILL, then the same data directory
            for channel in ("billing", "audit"):
                assert bodies(nsqd, "orders", channel) == sorted(sent), (trial, channel)


def test_in_process_and_over_http(tmp_path):
    with Broker("--durable", tmp_dir=str(tmp_path)) as nsqd:
        nsqd.create("orders", "billing")
        with Producer(nsqd.tcp_address) as producer:
            producer.pub("orders", b"one")
        nsqd.sync()
        assert nsqd.http("POST", "/debug/sync") == (200, b'{"synced":true}')
        assert bodies(nsqd, "orders", "billing") == [b"one"]
    with Broker(time_skipping=False, tmp_dir=str(tmp_path)) as go_like:
        assert go_like.http("POST", "/debug/sync")[0] == 404  # a test route only, as Go nsqd has none
