"""One clock for the broker and an asyncio application (ansq): asyncio.sleep, call_later and ansq's
own waits run on the broker's clock, skipping while idle."""

import asyncio
import time
import urllib.request

import pytest

ansq = pytest.importorskip("ansq")

from nsqd_threaded.testing import AsyncioLoop, Broker  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def pub(nsqd, topic, body, defer_ms=None):
    url = "%s/pub?topic=%s" % (nsqd.http_url, topic) + ("" if defer_ms is None else "&defer=%d" % defer_ms)
    with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=10) as answer:
        assert answer.read() == b"OK"


async def consume(nsqd, n, seen, req_ms=None):
    """The application: read n messages; REQ each first delivery for ``req_ms`` when given, FIN the rest."""
    reader = await ansq.create_reader(topic="orders", channel="billing", nsqd_tcp_addresses=[nsqd.tcp_addr])
    try:
        done = 0
        async for message in reader.messages():
            seen.append((asyncio.get_running_loop().time(), message.body, message.attempts))
            if req_ms is not None and message.attempts == 1:
                await message.req(req_ms)
                continue
            await message.fin()
            done += 1
            if done == n:
                return
    finally:
        await reader.close()


def test_asyncio_sleep_runs_on_the_brokers_clock(tmp_path):
    started = time.monotonic()
    with Broker(tmp_dir=str(tmp_path)) as nsqd, AsyncioLoop(clock=nsqd, auto_skip=True) as loop:
        async def nap():
            before = asyncio.get_running_loop().time()
            await asyncio.sleep(3600)
            return asyncio.get_running_loop().time() - before

        assert 3600 <= loop.run(nap(), timeout=7200) < 3601
        assert nsqd.nsqd.clock.skipped > 3599  # the broker's clock moved with it (less the grace of real time)
    assert time.monotonic() - started < 10


def test_an_ansq_consumer_through_a_30s_req_and_a_1h_dpub(tmp_path):
    with Broker(tmp_dir=str(tmp_path)) as nsqd, AsyncioLoop(clock=nsqd, auto_skip=True) as loop:
        pub(nsqd, "orders", b"now")
        pub(nsqd, "orders", b"later", defer_ms=3600 * 1000)
        seen = []
        start = loop.time()
        loop.run(consume(nsqd, 2, seen, req_ms=30 * 1000), timeout=7200)
        bodies = [(body, attempts) for _, body, attempts in seen]
        assert bodies == [(b"now", 1), (b"now", 2), (b"later", 1), (b"later", 2)]
        assert 30 <= seen[1][0] - seen[0][0] < 31  # the REQ's delay, on the clock
        assert 3600 <= seen[2][0] - start < 3601  # the DPUB's
        loop.wait_until(nsqd, "orders", "billing", depth=0, in_flight_count=0, deferred_count=0)


def test_without_a_clock_it_is_a_plain_loop(tmp_path):
    with AsyncioLoop() as loop:
        assert asyncio.get_event_loop() is loop.asyncio_loop
        assert loop.run(asyncio.sleep(0.01, result="slept")) == "slept"
        with pytest.raises(TimeoutError):
            loop.run(asyncio.sleep(60), timeout=0.05)
    with pytest.raises(ValueError, match="auto_skip=True needs clock="):
        AsyncioLoop(auto_skip=True)
