"""CPU cost per message of a channel's delivery path (Channel.take, then finish_many), with and without a
delivery policy: what the policy check costs on the hot path (docs/policies.md).

    PYTHONPATH=TREE python scripts/benchmarks/channel_take.py [--policy] [--rounds 7]

TREE is the checkout whose nsqd_threaded is measured (``.``, or another branch's, to compare).  It measures the calling thread's
CPU time, best of the rounds: on a loaded machine wall time says more about the neighbours.
"""

import argparse
import tempfile
import time

from nsqd_threaded import NSQD, Options
from nsqd_threaded.wire.message import Message


class Subscriber:
    """The least a Channel needs of a consumer (its Subscriber protocol): one that is always ready."""

    def __init__(self, ready):
        self.id = 1
        self.ready_count = ready
        self.msg_timeout_ns = 60 * 10**9
        self.sample_rate = 0
        self.in_flight_count = 0
        self.blocked = False
        self.message_count = self.finish_count = self.requeue_count = 0

    def wake(self):
        pass

    def close_connection(self):
        pass

    def pump_idle(self):
        return False

    def hold_output(self, own=False):
        return False

    def deliver_held(self, msgs):
        pass


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=200000)
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--policy", action="store_true", help="a policy every message passes (max attempts 100, TTL 1h)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as data:
        nsqd = NSQD(Options(data_path=data, tcp_address="", http_address="", node_id=1, mem_queue_size=10**8,
                            log_level="error"))
        channel = nsqd.get_topic("t").get_channel("c")
        if a.policy:
            from nsqd_threaded.broker.policy import Policy

            channel.set_policy(Policy(100, "", 3600 * 10**9))
        consumer = Subscriber(a.batch)
        channel.add_client(consumer)
        best = None
        for _ in range(a.rounds):
            channel.put_messages([Message(b"%016d" % i, b"x" * 100, 0) for i in range(a.messages)], deferred=False)
            started = time.thread_time()
            for _ in range(a.messages // a.batch):
                channel.finish_many(consumer, [m.id for m in channel.take(consumer, a.batch)])
            took = time.thread_time() - started
            best = took if best is None else min(best, took)
    print("%s: %.3f µs/message (CPU, best of %d rounds of %d messages, batches of %d)"
          % ("with a policy" if a.policy else "no policy", best / a.messages * 1e6, a.rounds, a.messages, a.batch))


if __name__ == "__main__":
    main()
