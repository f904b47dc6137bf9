"""DiskQueue's empty, close and delete, its write failures, and deferred messages (beyond Go)."""

import os
import subprocess
import sys
import textwrap
import time

import pytest

from nsqd_threaded.storage import diskqueue as dq_mod
from nsqd_threaded.storage.backend import BackendError
from nsqd_threaded.wire.message import Message

from support.diskqueue import REPO, TS, env, go_record, ids, mid, msg  # noqa: F401 (fixtures among them)

# -- empty / close / delete --------------------------------------------------------


def test_empty(env):
    q = env.open(max_bytes_per_file=100)
    q.put([msg(i) for i in range(5)])
    q.get(1)
    q.sync()
    assert os.path.exists(env.meta())
    q.empty()
    assert q.depth() == 0
    assert env.files() == []  # data files and the meta file are gone
    assert (q.read_file_num, q.read_pos, q.write_file_num, q.write_pos) == (3, 0, 3, 0)
    assert q.get(10) == []
    q.put([msg(9)])
    assert env.files() == ["t.diskqueue.000003.dat"]
    assert ids(q.get(10)) == [mid(9)]
    q.close()
    assert env.read(env.meta()) == b"0\n3,44\n3,44\n"


def test_close_keeps_unread_data_and_stops(env):
    q = env.open()
    q.put([msg(1), msg(2)])
    q.close()
    assert q.depth() == 2  # last value after close
    assert q.get(10) == []
    with pytest.raises(BackendError, match="^exiting$"):
        q.put([msg(3)])
    with pytest.raises(BackendError, match="^exiting$"):
        q.empty()
    q.close()  # idempotent
    q.delete()
    assert env.read(env.meta()) == b"2\n0,0\n0,88\n"
    assert sorted(env.files()) == ["t.diskqueue.000000.dat", "t.diskqueue.meta.dat"]


def test_delete_does_not_sync_or_remove(env):
    q = env.open()
    q.put([msg(1)])
    q.delete()
    assert env.files() == ["t.diskqueue.000000.dat"]  # no meta written
    with pytest.raises(BackendError, match="^exiting$"):
        q.put([msg(2)])


def test_empty_then_delete_removes_everything(env):
    q = env.open(max_bytes_per_file=100)
    q.put([msg(i) for i in range(5)])
    q.sync()
    q.empty()
    q.delete()
    assert env.files() == []


# -- write failures --------------------------------------------------------------

_FSIZE_SCRIPT = textwrap.dedent(
    """
    import json, os, resource, signal, sys
    sys.path.insert(0, sys.argv[1])
    from nsqd_threaded.storage.backend import BackendError
    from nsqd_threaded.storage.diskqueue import DiskQueue
    from nsqd_threaded.wire.message import Message

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    data = sys.argv[2]
    out = {}

    def m(i, n=14):
        return Message(b"%016x" % i, b"x" * n, 1, 0)

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (500, hard))

    q = DiskQueue("t", data, 10000)
    q.put([m(i) for i in range(5)])                     # 220 bytes
    try:
        q.put([m(i) for i in range(5, 15)])             # would reach 660 > 500
    except BackendError as e:
        out["err"] = str(e)
    out["after_fail"] = [q.depth(), q.write_file_num, q.write_pos, os.path.getsize(q.file_name(0))]
    q.put([m(15)])                                      # overwrites from 220
    out["after_retry"] = [q.depth(), q.write_pos]
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
    q.put([m(i) for i in range(16, 26)])
    out["ids"] = [msg.id.decode() for msg in q.get(100)]
    q.close()

    # A batch failing in a new file after a roll: nothing of it counts.
    resource.setrlimit(resource.RLIMIT_FSIZE, (150, hard))
    q = DiskQueue("u", data, 100)
    try:
        q.put([m(100), m(101, 170)])                    # 44 bytes in file 0, then 200 bytes in file 1
    except BackendError as e:
        out["err2"] = str(e)
    out["after_fail2"] = [q.depth(), q.write_file_num, q.write_pos,
                          os.path.getsize(q.file_name(0)), os.path.exists(q.file_name(1))]
    q.put([m(102)])
    out["ids2"] = [msg.id.decode() for msg in q.get(100)]
    q.close()
    print(json.dumps(out))
    """
)


def test_write_failure_raises_backend_error_and_keeps_write_pos(tmp_path):
    import json

    env_vars = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run(
        [sys.executable, "-c", _FSIZE_SCRIPT, REPO, str(tmp_path)],
        capture_output=True,
        timeout=60,
        env=env_vars,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    out = json.loads(proc.stdout)
    path0 = os.path.join(str(tmp_path), "t.diskqueue.000000.dat")
    assert out["err"] == "write %s: file too large" % path0
    assert out["after_fail"] == [5, 0, 220, 220]  # partial write undone, nothing counted
    assert out["after_retry"] == [6, 264]
    assert out["ids"] == ["%016x" % i for i in list(range(5)) + list(range(15, 26))]
    assert out["err2"] == "write %s: file too large" % os.path.join(str(tmp_path), "u.diskqueue.000001.dat")
    assert out["after_fail2"] == [0, 0, 0, 0, False]
    assert out["ids2"] == ["%016x" % 102]


def test_open_failure_raises_backend_error(env):
    # A directory where the next data file should be: open() fails even for root.
    q = env.open(max_bytes_per_file=100)
    q.put([msg(1), msg(2)])
    os.mkdir(env.data(1))
    with pytest.raises(BackendError, match="^open .*/t.diskqueue.000001.dat: is a directory$"):
        q.put([msg(3)])
    assert (q.depth(), q.write_file_num, q.write_pos) == (2, 0, 88)
    os.rmdir(env.data(1))
    q.put([msg(3)])
    assert ids(q.get(10)) == [mid(1), mid(2), mid(3)]
    q.close()


# -- deferred messages (beyond Go) -------------------------------------------------


def test_deferred_message_keeps_remaining_delay_across_restart(env):
    q = env.open(max_bytes_per_file=100)
    before = time.time_ns()
    q.put([msg(1), msg(2, deferred_ns=60 * 10**9), msg(3)])
    q.close()
    sidecar = os.path.join(str(env.path), "t.diskqueue.deferred.dat")
    assert os.path.exists(sidecar)
    # The records themselves are plain Go records: Go nsqd reads them (immediately).
    assert env.read(env.data(0)) == go_record(mid(1), b"x" * 14, TS + 1) + go_record(mid(2), b"x" * 14, TS + 2)
    line = env.read(sidecar)
    fnum, pos, hexid, due = line.split()
    assert (int(fnum), int(pos), bytes.fromhex(hexid.decode())) == (0, 44, mid(2))
    assert before + 60 * 10**9 <= int(due) <= time.time_ns() + 60 * 10**9

    q = env.open(max_bytes_per_file=100)
    got = q.get(10)
    after = time.time_ns()
    assert ids(got) == [mid(1), mid(2), mid(3)]
    assert got[0].deferred_ns == 0 and got[2].deferred_ns == 0
    assert int(due) - after <= got[1].deferred_ns <= 60 * 10**9
    q.close()
    assert not os.path.exists(sidecar)  # removed once nothing deferred remains


def test_deferred_due_in_the_past_comes_back_immediate_and_stale_entries_dropped(env):
    recs = [go_record(mid(i), b"x" * 14) for i in range(3)]
    env.write(env.data(5), b"".join(recs))
    env.write(env.meta(), b"2\n5,44\n5,132\n")
    far = time.time_ns() + 3600 * 10**9
    sidecar = os.path.join(str(env.path), "t.diskqueue.deferred.dat")
    env.write(
        sidecar,
        (
            b"5 0 %s %d\n" % (mid(0).hex().encode(), far)  # already consumed: stale
            + b"5 44 %s %d\n" % (mid(1).hex().encode(), 1)  # due long ago
            + b"5 88 %s %d\n" % (mid(9).hex().encode(), far)  # another message's ID: ignored
            + b"5 132 %s %d\n" % (mid(3).hex().encode(), far)  # past the write position: stale
            + b"garbage line\n"
        ),
    )
    q = env.open()
    got = q.get(10)
    assert ids(got) == [mid(1), mid(2)]
    assert [m.deferred_ns for m in got] == [0, 0]
    q.put([msg(3)])  # lands at (5, 132): must not pick up the stale entry
    assert q.get(10)[0].deferred_ns == 0
    q.close()
    assert not os.path.exists(sidecar)


def test_deferred_entries_of_consumed_and_bad_files_are_forgotten(env):
    q = env.open(max_bytes_per_file=100)
    q.put([msg(1, deferred_ns=10**12), msg(2), msg(3, deferred_ns=10**12)])  # files 0 (2) and 1 (1)
    sidecar = os.path.join(str(env.path), "t.diskqueue.deferred.dat")
    assert len(env.read(sidecar).splitlines()) == 2
    got = q.get(1)
    assert got[0].deferred_ns > 0
    q.close()
    with open(env.data(0), "r+b") as f:
        f.truncate(60)  # the second record of file 0 is lost
    q = env.open(max_bytes_per_file=100)
    got = q.get(10)
    assert ids(got) == [mid(3)] and got[0].deferred_ns > 0
    assert os.path.exists(env.data(0) + ".bad")
    q.close()
    assert not os.path.exists(sidecar)


def test_deferred_survives_empty_as_nothing(env):
    q = env.open()
    q.put([msg(1, deferred_ns=10**12)])
    q.empty()
    assert not os.path.exists(os.path.join(str(env.path), "t.diskqueue.deferred.dat"))
    q.put([msg(2)])
    assert q.get(10)[0].deferred_ns == 0
    q.close()


def test_deferred_sidecar_compaction(env, monkeypatch):
    monkeypatch.setattr(dq_mod, "SIDECAR_COMPACT_MIN", 4)
    q = env.open(max_bytes_per_file=100)
    sidecar = os.path.join(str(env.path), "t.diskqueue.deferred.dat")
    for i in range(20):
        q.put([msg(i, deferred_ns=10**12)])
    assert len(env.read(sidecar).splitlines()) == 20
    assert len(q.get(16)) == 16  # 8 files consumed: most lines are stale now
    lines = env.read(sidecar).splitlines()
    assert len(lines) < 20
    q.close()
    q = env.open(max_bytes_per_file=100)
    got = q.get(10)
    assert ids(got) == [mid(i) for i in range(16, 20)]
    assert all(m.deferred_ns > 0 for m in got)
    q.close()


def test_records_in_and_out_byte_for_byte_and_a_delay_still_comes_back_as_a_message(env):
    """put() takes records (bytes) as they are; get(records=True) hands records back
    (slices of the file), except a message still deferred, which stays a Message."""
    q = env.open(max_bytes_per_file=1024)
    q.put([msg(1).encode(), msg(2, deferred_ns=60 * 10**9), msg(3).encode()])
    q.close()
    assert env.read(env.data(0)) == (
        go_record(mid(1), b"x" * 14, TS + 1) + go_record(mid(2), b"x" * 14, TS + 2) + go_record(mid(3), b"x" * 14, TS + 3)
    )
    q = env.open(max_bytes_per_file=1024)
    got = q.get(10, records=True)
    assert [type(g) for g in got] == [bytes, Message, bytes]
    assert got[0] == msg(1).encode() and got[2] == msg(3).encode()
    assert got[1].id == mid(2) and got[1].deferred_ns > 59 * 10**9
    q.close()
