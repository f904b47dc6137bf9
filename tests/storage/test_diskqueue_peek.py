"""DiskQueue.peek: what is stored and not yet taken, read from the files without moving the reader."""

import os
import time

from nsqd_threaded.storage.durable import DurableDiskQueue

from support.diskqueue import env, ids, mid, msg  # noqa: F401 (fixtures among them)


def positions(q):
    return q.read_file_num, q.read_pos, q.write_file_num, q.write_pos, q.depth()


def test_peek_reads_across_files_and_moves_nothing(env):
    q = env.open(max_bytes_per_file=100)
    q.put([msg(i) for i in range(7)])  # two records per file: files 0 to 3
    assert ids(q.get(1)) == [mid(0)]  # the reader is inside file 0, with a buffer
    before, files, meta = positions(q), env.files(), env.read(env.meta())
    queued, deferred = q.peek()
    assert ids(queued) == [mid(i) for i in range(1, 7)] and deferred == []
    assert [(m.body, m.timestamp, m.attempts) for m in queued] == [(b"x" * 14, msg(i).timestamp, 0)
                                                                   for i in range(1, 7)]
    assert ids(q.peek(2)[0]) == [mid(1), mid(2)]
    assert ids(q.peek(0)[0]) == []
    assert (positions(q), env.files(), env.read(env.meta())) == (before, files, meta)
    # the reader goes on where it was
    assert ids(q.get(10)) == [mid(i) for i in range(1, 7)]
    assert q.peek() == ([], [])
    q.close()


def test_peek_after_a_restart_reads_files_this_process_did_not_write(env):
    q = env.open(max_bytes_per_file=100)
    q.put([msg(i, attempts=i) for i in range(5)])
    q.close()
    q = env.open(max_bytes_per_file=100)
    queued, _ = q.peek()
    assert [(m.id, m.attempts) for m in queued] == [(mid(i), i) for i in range(5)]
    assert ids(q.get(5)) == [mid(i) for i in range(5)]
    q.close()


def test_a_record_still_deferred_is_listed_with_its_due_time(env):
    q = env.open(max_bytes_per_file=100)
    start = time.time_ns()
    q.put([msg(0), msg(1, deferred_ns=600 * 10**9), msg(2), msg(3), msg(4, deferred_ns=900 * 10**9)])
    queued, deferred = q.peek()
    assert ids(queued) == [mid(0), mid(2), mid(3)]
    end = time.time_ns()
    assert [m.id for m, _ in deferred] == [mid(1), mid(4)]
    for (_, due), delay in zip(deferred, (600 * 10**9, 900 * 10**9)):
        assert start + delay <= due <= end + delay
    # a peek that stops early still finds the deferred records further on
    queued, deferred = q.peek(1)
    assert ids(queued) == [mid(0)] and sorted(m.id for m, _ in deferred) == [mid(1), mid(4)]
    assert [m.id for m in q.get(10)] == [mid(i) for i in range(5)]  # (get hands them out with their delay)
    q.close()


def test_durable_peek_starts_after_the_records_handed_out(tmp_path):
    data = str(tmp_path)
    q = DurableDiskQueue("d", data, 100)
    q.put([msg(i) for i in range(4)])
    assert ids(q.get(2)) == [mid(0), mid(1)]  # handed out, not acked: still stored
    assert ids(q.peek()[0]) == [mid(2), mid(3)]
    q.ack([mid(0), mid(1)])
    assert ids(q.peek()[0]) == [mid(2), mid(3)]
    q.close()
    assert os.listdir(data)
