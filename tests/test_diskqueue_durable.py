"""DurableDiskQueue (--durable) against real files: unacked records, committed position, group commit.

No mocks of our code.  Where an fsync must fail or be held open, ``os.fsync``
itself is wrapped (the stdlib function the queue calls).
"""

import errno
import io
import os
import random
import signal
import stat
import subprocess
import sys
import textwrap
import threading

import pytest

from nsqd_threaded.storage.backend import BackendError
from nsqd_threaded.storage.diskqueue import DiskQueue, parse_meta
from nsqd_threaded.storage.durable import DurableDiskQueue
from nsqd_threaded.internal.logger import Logger
from nsqd_threaded.wire.message import Message

pytestmark = pytest.mark.timeout(60)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TS = 0x18EA4C4C68FDBFED
REC = 44  # bytes of one record with a 14-byte body: 4 + 26 + 14
JOIN = 20  # seconds any test thread may take


def mid(i):
    return b"%016x" % i


def msg(i, body=b"x" * 14, deferred_ns=0):
    return Message(mid(i), body, TS + i, 0, deferred_ns)


def ids(msgs):
    return [m.id for m in msgs]


class Env:
    def __init__(self, path):
        self.path = str(path)
        self.log_stream = io.StringIO()
        self.logger = Logger(level="debug", stream=self.log_stream)

    def open(self, name="t", durable=True, **kw):
        kw.setdefault("max_bytes_per_file", 100)  # two 44-byte records per file
        cls = DurableDiskQueue if durable else DiskQueue
        return cls(name, self.path, logger=self.logger, **kw)

    def data(self, n, name="t"):
        return os.path.join(self.path, "%s.diskqueue.%06d.dat" % (name, n))

    def meta(self, name="t"):
        return os.path.join(self.path, "%s.diskqueue.meta.dat" % name)

    def read_meta(self, name="t"):
        with open(self.meta(name), "rb") as f:
            return f.read()

    def files(self):
        return sorted(os.listdir(self.path))

    def data_files(self):
        return [f for f in self.files() if f.startswith("t.diskqueue.0")]


@pytest.fixture
def env(tmp_path):
    return Env(tmp_path)


def drain(q, n=1000):
    out = []
    while True:
        got = q.get(n)
        if not got:
            return out
        out.extend(got)


class FsyncWrapper:
    """Replaces os.fsync: records what was fsynced ("dir"/"file"), can fail, can hold one call."""

    def __init__(self, monkeypatch):
        self.real = os.fsync
        self.calls = []
        self.fail = None  # errno to raise for regular files
        self._hold = False
        self._lock = threading.Lock()
        self.entered = threading.Event()
        self.release = threading.Event()
        monkeypatch.setattr(os, "fsync", self)

    def hold_next(self):
        """The next fsync of a regular file blocks until ``release`` is set."""
        with self._lock:
            self._hold = True

    def __call__(self, fd):
        kind = "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        with self._lock:
            self.calls.append(kind)
            hold = self._hold and kind == "file"
            if hold:
                self._hold = False
        if kind == "file" and self.fail is not None:
            raise OSError(self.fail, os.strerror(self.fail))
        if hold:
            self.entered.set()
            assert self.release.wait(JOIN)
        return self.real(fd)


def run_threads(targets):
    """Start threads, join them (bounded); re-raise the first exception of any."""
    errors = []

    def wrap(fn):
        def run():
            try:
                fn()
            except BaseException as e:  # noqa: B902 - reported to the test
                errors.append(e)

        return run

    threads = [threading.Thread(target=wrap(fn), daemon=True) for fn in targets]
    for t in threads:
        t.start()
    return threads, errors


def join_all(threads, errors):
    for t in threads:
        t.join(JOIN)
        assert not t.is_alive(), "thread did not finish"
    if errors:
        raise errors[0]


# -- non-durable mode is untouched ----------------------------------------------------------------


def test_non_durable_api_is_inert(env):
    q = env.open(durable=False)
    q.put([msg(0), msg(1), msg(2)])
    assert q.sync_point() is None
    q.wait_synced(None)
    assert ids(q.get(2)) == [mid(0), mid(1)]
    assert q.ack([mid(0)]) == 0
    assert not q.acks_deliveries and q.memory_capacity(5) == 5
    q.close()
    assert env.read_meta() == b"1\n1,0\n1,44\n"  # read-ahead position, as Go (file 0 consumed)
    assert env.data_files() == ["t.diskqueue.000001.dat"]


# -- unacked records: redelivery ------------------------------------------------------------------


def test_close_without_ack_redelivers_unacked(env):
    q = env.open(max_bytes_per_file=1000)
    q.put([msg(i) for i in range(5)])
    assert q.depth() == 5
    assert ids(q.get(5)) == [mid(i) for i in range(5)]
    assert q.depth() == 0  # depth() counts unread records, as before
    assert q.ack([mid(0), mid(2)]) == 2
    q.close()
    # Committed past record 0 only; 1 (unacked), 2 (done, after an unacked one), 3, 4 come back.
    assert env.read_meta() == b"4\n0,%d\n0,%d\n" % (REC, 5 * REC)

    q = env.open(max_bytes_per_file=1000)
    assert q.depth() == 4
    assert ids(q.get(10)) == [mid(1), mid(2), mid(3), mid(4)]
    q.close()
    # Nothing acked: the same again, and Go (non-durable) sees them as plain unread records.
    q = env.open(durable=False, max_bytes_per_file=1000)
    assert ids(q.get(10)) == [mid(1), mid(2), mid(3), mid(4)]
    q.close()


def test_crash_after_sync_redelivers_unacked_and_unread(env):
    q1 = env.open()
    q1.put([msg(i) for i in range(10)])  # files 0..4, two records each
    assert ids(q1.get(7)) == [mid(i) for i in range(7)]
    q1.ack([mid(0), mid(1), mid(3)])
    assert env.data_files() == ["t.diskqueue.%06d.dat" % n for n in range(1, 5)]  # file 0 passed
    q1.sync()
    # "Crash": q1 is never closed; a second queue opens the same files.
    q2 = env.open()
    assert q2.depth() == 8
    assert ids(drain(q2)) == [mid(i) for i in range(2, 10)]
    q2.close()
    q1.delete()


def test_crash_without_any_sync_redelivers_everything(env):
    q1 = env.open(max_bytes_per_file=10000)
    q1.put([msg(i) for i in range(4)])
    q1.wait_synced(q1.sync_point())
    assert ids(q1.get(4)) == [mid(i) for i in range(4)]
    q1.ack([mid(0), mid(1), mid(2), mid(3)])
    assert not os.path.exists(env.meta())  # never synced the metadata
    q2 = env.open(max_bytes_per_file=10000)  # recovers from the data file alone
    assert ids(drain(q2)) == [mid(i) for i in range(4)]  # acked but not persisted: duplicates
    q2.close()
    q1.delete()


def test_files_are_deleted_only_after_the_metadata_passed_them(env):
    q1 = env.open()
    q1.put([msg(i) for i in range(6)])  # files 0, 1, 2
    q1.get(6)
    q1.ack([mid(0), mid(1), mid(2), mid(3)])
    assert env.data_files() == ["t.diskqueue.000002.dat"]
    # The metadata on disk already says so: a crash now resumes at file 2.
    assert env.read_meta() == b"2\n2,0\n2,88\n"
    q2 = env.open()
    assert ids(drain(q2)) == [mid(4), mid(5)]
    q2.close()
    q1.delete()



def test_consumed_files_left_by_a_crash_before_their_deletion_are_removed_at_startup(env):
    q = env.open()
    q.put([msg(i) for i in range(6)])  # files 0, 1, 2
    q.get(6)
    q.ack([mid(i) for i in range(4)])
    q.close()
    assert env.read_meta() == b"2\n2,0\n2,88\n"
    # As if killed after the metadata moved past files 0 and 1 but before they were deleted:
    with open(env.data(2), "rb") as f:
        data = f.read()
    for n in (0, 1):
        with open(env.data(n), "wb") as f:
            f.write(data)
    q = env.open()
    assert env.data_files() == ["t.diskqueue.000002.dat"]
    assert ids(drain(q)) == [mid(4), mid(5)]
    q.close()

# -- ack: committed position ------------------------------------------------------------------------


def committed(env, q):
    q.sync()
    fields, err = parse_meta(env.read_meta())
    assert err is None
    return fields[0], (fields[1], fields[2])


def test_out_of_order_acks_advance_only_over_a_done_prefix(env):
    q = env.open(max_bytes_per_file=10000)
    q.put([msg(i) for i in range(6)])
    q.get(6)
    assert committed(env, q) == (6, (0, 0))
    assert q.ack([mid(3), mid(4)]) == 2
    assert committed(env, q) == (6, (0, 0))
    q.ack([mid(0)])
    assert committed(env, q) == (5, (0, REC))
    q.ack([mid(2), mid(1)])
    assert committed(env, q) == (1, (0, 5 * REC))
    q.ack([mid(5)])
    assert committed(env, q) == (0, (0, 6 * REC))
    assert q.unacked_count == 0
    q.close()
    assert env.read_meta() == b"0\n0,264\n0,264\n"


def test_committed_position_counts_unread_records_too(env):
    q = env.open(max_bytes_per_file=10000)
    q.put([msg(i) for i in range(5)])
    q.get(2)
    q.ack([mid(1)])
    assert committed(env, q) == (5, (0, 0))  # 3 unread + 2 unacked (one of them done)
    q.ack([mid(0)])
    assert committed(env, q) == (3, (0, 2 * REC))
    q.close()


def test_files_deleted_only_when_the_committed_position_passes_them(env):
    q = env.open()
    q.put([msg(i) for i in range(6)])  # files 0, 1, 2
    all_files = ["t.diskqueue.%06d.dat" % n for n in range(3)]
    q.get(6)  # the reader is in file 2 now
    assert env.data_files() == all_files
    q.ack([mid(2), mid(3)])  # all of file 1, but file 0 is still unacked
    assert env.data_files() == all_files
    q.ack([mid(1)])
    assert env.data_files() == all_files
    q.ack([mid(0)])  # committed position (2, 0): files 0 and 1 go
    assert env.data_files() == ["t.diskqueue.000002.dat"]
    q.ack([mid(4), mid(5)])
    assert env.data_files() == ["t.diskqueue.000002.dat"]  # the current write file stays
    q.close()
    assert env.read_meta() == b"0\n2,88\n2,88\n"


def test_file_consumed_and_acked_goes_when_the_reader_leaves_it(env):
    q = env.open()
    q.put([msg(i) for i in range(4)])  # files 0, 1
    q.get(2)  # reads all of file 0, moves to file 1
    assert env.data_files() == ["t.diskqueue.000000.dat", "t.diskqueue.000001.dat"]
    q.ack([mid(1), mid(0)])
    assert env.data_files() == ["t.diskqueue.000001.dat"]
    q.close()


def test_duplicate_ids_ack_the_oldest_record(env):
    q = env.open(max_bytes_per_file=10000)
    q.put([msg(1)])
    q.get(1)
    q.put([msg(1), msg(2)])  # e.g. a channel flushing its in-flight message at close
    q.sync()
    # Crash before the old record was acked: after the restart the ID is unacked twice.
    q2 = env.open(max_bytes_per_file=10000)
    assert ids(q2.get(10)) == [mid(1), mid(1), mid(2)]
    assert committed(env, q2) == (3, (0, 0))
    assert q2.ack([mid(1)]) == 1  # the oldest: the committed position moves past it
    assert committed(env, q2) == (2, (0, REC))
    assert q2.ack([mid(1)]) == 1
    assert committed(env, q2) == (1, (0, 2 * REC))
    assert q2.ack([mid(1)]) == 0  # none left
    q2.close()
    q.delete()


def test_unknown_ids_are_ignored(env):
    q = env.open(max_bytes_per_file=10000)
    q.put([msg(0), msg(1)])
    q.get(1)
    assert q.ack([b"ffffffffffffffff", mid(1)]) == 0  # mid(1) was not handed out
    assert committed(env, q) == (2, (0, 0))
    assert q.ack([mid(9), mid(0)]) == 1
    assert committed(env, q) == (1, (0, REC))
    q.close()


def test_read_error_file_set_aside_only_after_the_committed_position_passes(env):
    q = env.open()
    q.put([msg(i) for i in range(6)])  # files 0, 1, 2
    q.close()
    os.truncate(env.data(1), REC + 10)  # file 1's second record is cut short
    q1 = env.open()
    assert ids(drain(q1)) == [mid(0), mid(1), mid(2), mid(4), mid(5)]
    assert not os.path.exists(env.data(1) + ".bad")  # records of file 1 are still unacked
    q1.sync()
    q2 = env.open()  # crash: the same records (and the same error) again
    assert ids(drain(q2)) == [mid(0), mid(1), mid(2), mid(4), mid(5)]
    q2.ack([mid(0), mid(1), mid(2)])
    assert env.data_files() == ["t.diskqueue.000001.dat.bad", "t.diskqueue.000002.dat"]
    q2.close()
    q1.delete()


def test_deferred_delay_survives_a_crash_while_unacked(env):
    q = env.open(max_bytes_per_file=10000)
    q.put([msg(0, deferred_ns=3600 * 10**9), msg(1)])
    got = q.get(2)
    assert got[0].deferred_ns > 3500 * 10**9 and got[1].deferred_ns == 0
    q.sync()
    q2 = env.open(max_bytes_per_file=10000)
    got = q2.get(2)
    assert ids(got) == [mid(0), mid(1)]
    assert got[0].deferred_ns > 3500 * 10**9
    q2.close()
    q.delete()


# -- empty / close / delete ---------------------------------------------------------------------------


def test_empty_drops_unacked_records_and_releases_waiters(env):
    q = env.open()
    q.put([msg(i) for i in range(4)])  # files 0, 1
    token = q.sync_point()
    assert ids(q.get(3)) == [mid(0), mid(1), mid(2)]
    q.empty()
    assert q.depth() == 0 and q.unacked_count == 0
    assert env.files() == []
    assert q.ack([mid(0), mid(1)]) == 0
    q.wait_synced(token)  # emptied away: nothing to wait for
    q.put([msg(7)])
    q.wait_synced(q.sync_point())
    assert ids(q.get(10)) == [mid(7)]
    q.close()
    q = env.open()
    assert ids(q.get(10)) == [mid(7)]  # not acked: delivered again
    q.ack([mid(7)])
    q.close()
    q = env.open()
    assert q.get(10) == []
    q.close()


def test_crash_after_empty_keeps_later_acknowledged_writes(env):
    q = env.open()
    q.put([msg(i) for i in range(3)])
    q.sync()
    q.get(2)
    q.empty()  # removes the metadata file, as Go does
    q.put([msg(8), msg(9)])
    q.wait_synced(q.sync_point())
    assert not os.path.exists(env.meta())
    # Crash: the metadata is missing and the data is in file 3, not file 0.
    q2 = env.open()
    assert ids(drain(q2)) == [mid(8), mid(9)]
    q2.put([msg(10)])
    assert ids(drain(q2)) == [mid(10)]
    q2.close()
    q.delete()


def test_close_syncs_so_waiters_return(env):
    q = env.open(max_bytes_per_file=10000)
    q.put([msg(0)])
    token = q.sync_point()
    q.close()  # fsyncs
    assert q.fsync_count == 1
    q.wait_synced(token)
    assert q.fsync_count == 1
    assert q.ack([mid(0)]) == 0 and q.get(1) == []


def test_delete_without_sync_makes_waiters_fail_exiting(env):
    q = env.open(max_bytes_per_file=10000)
    q.put([msg(0)])
    token = q.sync_point()
    q.delete()
    with pytest.raises(BackendError, match="^exiting$"):
        q.wait_synced(token)


def test_empty_then_delete_lets_waiters_return(env):
    q = env.open(max_bytes_per_file=10000)
    q.put([msg(0)])
    token = q.sync_point()
    q.empty()
    q.delete()
    q.wait_synced(token)


def test_close_persists_committed_position(env):
    q = env.open()
    q.put([msg(i) for i in range(5)])  # files 0, 1, 2
    q.get(3)
    q.ack([mid(0), mid(1)])
    q.close()
    assert env.read_meta() == b"3\n1,0\n2,44\n"
    assert env.data_files() == ["t.diskqueue.000001.dat", "t.diskqueue.000002.dat"]


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
