"""PUB latency while a topic pump drains a backlog into a new channel.

    scripts/bench drain --backlog 200000

A topic gets ``--backlog`` messages with no channel (memory queue, then disk),
then a channel is created and the pump drains the backlog while one producer
publishes one message at a time; prints the drain time and the worst PUB
round trip meanwhile.  An in-process broker on 127.0.0.1 ephemeral ports.
"""

import argparse
import threading
import time

from nsqd_threaded.client import Producer
from nsqd_threaded.testing import Broker


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backlog", type=int, default=200000)
    parser.add_argument("--mem-queue-size", type=int, default=10000)
    args = parser.parse_args()
    with Broker("--mem-queue-size=%d" % args.mem_queue_size) as broker, Producer(broker.tcp_address) as producer:
        for start in range(0, args.backlog, 1000):
            producer.mpub("drain", [b"x" * 100] * min(1000, args.backlog - start))
        topic = broker.nsqd.get_existing_topic("drain")
        latencies = []
        done = threading.Event()

        def publish():
            while not done.is_set():
                t0 = time.perf_counter()
                producer.pub("drain", b"y")
                latencies.append(time.perf_counter() - t0)

        publisher = threading.Thread(target=publish, name="bench-publisher")
        publisher.start()
        done.wait(0.2)  # the publisher's steady state before the drain starts
        t0 = time.perf_counter()
        topic.get_channel("c")
        while topic.depth() > 0 and time.perf_counter() - t0 < 120:
            done.wait(0.01)
        drain = time.perf_counter() - t0
        done.set()
        publisher.join()
    print("backlog %d drained in %.2f s; %d PUBs meanwhile, worst PUB round trip %.1f ms"
          % (args.backlog, drain, len(latencies), max(latencies) * 1000))


if __name__ == "__main__":
    main()
