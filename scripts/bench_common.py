"""What the load generators share: one worker process per connection, started together."""

import multiprocessing
import os
import time


def run_workers(target, args, runfor, connections=None):
    """Run ``target(*args, deadline, start_at, result_queue)`` in N processes; returns their results.

    Every worker starts its load at the same instant (``start_at``) and stops at ``deadline``.
    """
    connections = connections or os.cpu_count() or 1
    result = multiprocessing.Queue()
    start_at = time.time() + 0.5
    deadline = start_at + runfor
    procs = [
        multiprocessing.Process(target=target, args=tuple(args) + (deadline, start_at, result))
        for _ in range(connections)
    ]
    for p in procs:
        p.start()
    results = [result.get(timeout=runfor + 60) for _ in procs]
    for p in procs:
        p.join()
    return results
