"""DurableDiskQueue's group commit, fsync failures, and kill -9 at random points."""

import errno
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from nsqd_threaded.storage.backend import BackendError
from nsqd_threaded.storage.durable import DurableDiskQueue

from support.durable import (  # noqa: F401 (fixtures among them)
    JOIN,
    REPO,
    FsyncWrapper,
    drain,
    env,
    ids,
    join_all,
    mid,
    msg,
    run_threads,
)

pytestmark = pytest.mark.timeout(60)


# -- group commit ----------------------------------------------------------------------------------------


def test_group_commit_one_fsync_serves_all_waiters(env, monkeypatch):
    q = env.open(max_bytes_per_file=1 << 20)
    q.put([msg(0)])
    q.wait_synced(q.sync_point())  # creates the file
    base = q.fsync_count
    fs = FsyncWrapper(monkeypatch)
    n = 16
    lock = threading.Lock()
    barrier = threading.Barrier(n, timeout=JOIN)
    returned = []

    def publisher(i):
        with lock:
            q.put([msg(i)])
            token = q.sync_point()
        barrier.wait()  # everybody has written before anybody waits
        q.wait_synced(token)
        returned.append(i)

    threads, errors = run_threads([lambda i=i: publisher(i) for i in range(1, n + 1)])
    join_all(threads, errors)
    assert sorted(returned) == list(range(1, n + 1))
    assert q.fsync_count - base == 1 < n
    assert fs.calls == ["file"]  # and it really was one fsync
    q.close()


def test_waiters_arriving_during_an_fsync_share_the_next_one(env, monkeypatch):
    q = env.open(max_bytes_per_file=1 << 20)
    q.put([msg(0)])
    q.wait_synced(q.sync_point())
    base = q.fsync_count
    fs = FsyncWrapper(monkeypatch)
    fs.hold_next()
    lock = threading.Lock()
    n = 8
    written = threading.Barrier(n + 1, timeout=JOIN)

    def first():
        with lock:
            q.put([msg(1)])
            token = q.sync_point()
        q.wait_synced(token)  # leads, and is held inside its fsync

    def later(i):
        with lock:
            q.put([msg(i)])
            token = q.sync_point()
        written.wait()
        q.wait_synced(token)

    threads, errors = run_threads([first])
    assert fs.entered.wait(JOIN)
    more, more_errors = run_threads([lambda i=i: later(i) for i in range(2, n + 2)])
    written.wait()  # all of them have written while the first fsync is in progress
    fs.release.set()
    join_all(threads + more, errors + more_errors)
    assert q.fsync_count - base == 2  # the held one, then one for all the later waiters
    q.close()


def test_tokens_in_a_rolled_file_need_no_fsync(env):
    q = env.open()
    q.put([msg(0)])
    token0 = q.sync_point()
    q.put([msg(1), msg(2)])  # msg 2 rolls to file 1: file 0 is fsynced by the roll
    q.wait_synced(token0)
    assert q.fsync_count == 0
    q.put([msg(3)])
    q.wait_synced(q.sync_point())
    assert q.fsync_count == 1
    q.close()


def test_leader_fsync_is_safe_against_roll_delete_empty_and_close(env, monkeypatch):
    q = env.open()
    q.put([msg(0)])
    fs = FsyncWrapper(monkeypatch)
    fs.hold_next()
    lock = threading.Lock()
    with lock:
        token0 = q.sync_point()
    threads, errors = run_threads([lambda: q.wait_synced(token0)])
    assert fs.entered.wait(JOIN)  # fsyncing (a dup of) file 0's fd
    with lock:
        q.put([msg(1), msg(2), msg(3)])  # rolls: file 0 closed
        q.get(4)
        q.ack([mid(0), mid(1), mid(2), mid(3)])  # file 0 deleted
        token3 = q.sync_point()
    assert env.data_files() == ["t.diskqueue.000001.dat"]
    fs.release.set()
    join_all(threads, errors)
    q.wait_synced(token3)

    with lock:
        q.put([msg(4)])  # rolls to file 2 (and syncs)
        q.put([msg(5)])
        token5 = q.sync_point()
    fs.entered.clear()
    fs.release.clear()
    fs.hold_next()
    threads, errors = run_threads([lambda: q.wait_synced(token5)])
    assert fs.entered.wait(JOIN)  # fsyncing file 2
    with lock:
        q.empty()  # file 2 deleted
        q.close()
    assert env.data_files() == []
    fs.release.set()
    join_all(threads, errors)
    q.wait_synced(token5)


def test_wait_synced_with_concurrent_rolls_and_consumption(env):
    q = env.open(max_bytes_per_file=200)
    lock = threading.Condition()
    publishers_done = threading.Event()
    acked = []
    published = []
    rounds = 60

    def publisher(k):
        rnd = random.Random(k)
        for r in range(rounds):
            batch = [msg(k * 10000 + r * 10 + j) for j in range(rnd.randint(1, 3))]
            with lock:
                q.put(batch)
                token = q.sync_point()
                lock.notify_all()
            q.wait_synced(token)
            published.extend(ids(batch))

    def consumer():
        while True:
            with lock:
                got = q.get(5)
                if not got:
                    if publishers_done.is_set():
                        return
                    lock.wait(0.1)
                    continue
            with lock:
                q.ack(list(reversed(ids(got))))
            acked.extend(ids(got))

    pubs, pub_errors = run_threads([lambda k=k: publisher(k) for k in range(1, 5)])
    cons, cons_errors = run_threads([consumer])
    join_all(pubs, pub_errors)
    publishers_done.set()
    with lock:
        lock.notify_all()
    join_all(cons, cons_errors)
    with lock:
        left = drain(q)
        q.ack(ids(left))
    assert sorted(acked + ids(left)) == sorted(published)  # every message, exactly once
    assert env.data_files() in ([], ["t.diskqueue.%06d.dat" % q.write_file_num])
    q.close()


# -- fsync failures and directory fsync -------------------------------------------------------------


def test_fsync_failure_raises_and_is_sticky(env, monkeypatch):
    q = env.open(max_bytes_per_file=10000)
    q.put([msg(0)])
    token0 = q.sync_point()
    q.wait_synced(token0)
    fs = FsyncWrapper(monkeypatch)
    fs.fail = errno.EIO
    q.put([msg(1)])
    token1 = q.sync_point()
    with pytest.raises(BackendError, match=r"^fsync .*t\.diskqueue\.000000\.dat: input/output error$"):
        q.wait_synced(token1)
    fs.fail = None
    q.put([msg(2)])
    token2 = q.sync_point()
    with pytest.raises(BackendError, match="input/output error"):
        q.wait_synced(token2)  # nothing written since the failure can be trusted
    q.wait_synced(token0)  # synced before the failure
    q.close()
    q = env.open(max_bytes_per_file=10000)
    assert ids(q.get(10)) == [mid(0), mid(1), mid(2)]
    q.close()


def test_roll_fsync_failure_fails_the_put(env, monkeypatch):
    q = env.open()
    q.put([msg(0), msg(1)])  # file 0 full
    token = q.sync_point()
    fs = FsyncWrapper(monkeypatch)
    fs.fail = errno.EIO
    with pytest.raises(BackendError, match=r"^sync .*t\.diskqueue\.000000\.dat: input/output error$"):
        q.put([msg(2)])
    assert (q.depth(), q.write_file_num, q.write_pos) == (2, 0, 88)
    assert not os.path.exists(env.data(1))
    with pytest.raises(BackendError, match="input/output error"):
        q.wait_synced(token)
    fs.fail = None
    q.close()


def test_new_data_file_fsyncs_the_directory(env, monkeypatch):
    fs = FsyncWrapper(monkeypatch)
    q = env.open()
    q.put([msg(0)])
    assert fs.calls == ["dir"]  # file 0 created: its name is made durable at once
    q.put([msg(1)])
    assert fs.calls == ["dir"]
    del fs.calls[:]
    q.put([msg(2)])  # roll: fsync file 0, create file 1 (+ dir fsync), then the metadata
    assert fs.calls[:2] == ["file", "dir"]
    q.close()
    del fs.calls[:]
    q = env.open(durable=False)
    q.put([msg(3)])
    assert fs.calls == []
    q.close()


# -- kill -9 at random points ------------------------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import os, random, sys, threading
    sys.path.insert(0, sys.argv[1])
    from nsqd_threaded.storage.durable import DurableDiskQueue
    from nsqd_threaded.wire.message import Message

    data, base, seed = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    q = DurableDiskQueue("k", data, 300, sync_every=40)
    lock = threading.Condition()
    out = threading.Lock()

    def emit(tag, nums):
        line = ("%s %s\\n" % (tag, " ".join("%d" % n for n in nums))).encode()
        with out:
            os.write(1, line)

    def publisher(k):
        rnd = random.Random(seed * 31 + k)
        n = base + k * 1000000
        while True:
            batch = list(range(n, n + rnd.randint(1, 4)))
            n += len(batch)
            with lock:
                q.put([Message(b"%016x" % i, b"body-%d" % i, 1) for i in batch])
                token = q.sync_point()
                lock.notify_all()
            q.wait_synced(token)
            emit("W", batch)  # acknowledged to the publisher

    def consumer():
        rnd = random.Random(seed)
        held = []
        while True:
            with lock:
                got = q.get(rnd.randint(1, 8))
                if not got and not held:
                    lock.wait(0.05)
                    continue
            held.extend(int(m.id, 16) for m in got)
            if held and (rnd.random() < 0.4 or len(held) > 30):
                rnd.shuffle(held)
                k = rnd.randint(1, len(held))
                done, held = held[:k], held[k:]
                emit("A", done)  # about to FIN: a kill right after the ack must not look like a loss
                with lock:
                    q.ack([b"%016x" % i for i in done])

    threads = [threading.Thread(target=publisher, args=(k,), daemon=True) for k in range(3)]
    threads.append(threading.Thread(target=consumer, daemon=True))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    """
)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sigkill_at_random_points_loses_nothing_acknowledged(tmp_path, seed):
    rnd = random.Random(seed)
    written, acked = set(), set()
    for rnd_i in range(4):
        proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, REPO, str(tmp_path), str(rnd_i * 10**8), str(seed * 10 + rnd_i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        lines = []
        try:
            target = rnd.randint(5, 400)
            while len(lines) < target:
                line = proc.stdout.readline()
                if not line:
                    break
                lines.append(line)
        finally:
            proc.kill()
        rest = proc.stdout.read()
        err = proc.stderr.read()
        assert proc.wait(JOIN) == -signal.SIGKILL, err.decode()
        data = b"".join(lines) + rest
        for line in data[: data.rfind(b"\n") + 1].split(b"\n"):  # complete lines only
            parts = line.split()
            if parts:
                (written if parts[0] == b"W" else acked).update(int(x) for x in parts[1:])
    assert written

    q = DurableDiskQueue("k", str(tmp_path), 300)
    present = set()
    for m in drain(q):
        n = int(m.id, 16)
        assert m.body == b"body-%d" % n
        present.add(n)
    q.close()
    lost = written - acked - present
    assert not lost, sorted(lost)[:20]
