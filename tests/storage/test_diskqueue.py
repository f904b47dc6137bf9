"""DiskQueue: go-diskqueue's byte layouts, file names and rolling, reading, and the sync policy."""

import os
import struct
import time

import pytest

from nsqd_threaded.storage import records as records_mod
from nsqd_threaded.storage.backend import BackendError
from nsqd_threaded.storage.diskqueue import DiskQueue
from nsqd_threaded.storage.meta_file import parse_meta
from nsqd_threaded.wire.message import Message

from support.diskqueue import TS, env, go_record, ids, mid, msg  # noqa: F401 (fixtures among them)

# -- byte layouts ---------------------------------------------------------------


def test_verified_record_bytes(env):
    expected = bytes.fromhex(
        "0000001c" "18ea4c4c68fdbfed" "0000" "31386134306466313066653639303030" "6464"
    )
    assert go_record(b"18a40df10fe69000", b"dd") == expected
    q = env.open()
    q.put([Message(b"18a40df10fe69000", b"dd", TS, 0)])
    assert (q.write_file_num, q.write_pos, q.depth()) == (0, 32, 1)
    q.close()
    assert env.read(env.data(0)) == expected
    assert env.read(env.meta()) == b"1\n0,0\n0,32\n"


def test_meta_of_untouched_queue_written_on_close_only(env):
    q = env.open()
    assert env.files() == []
    q.close()
    assert env.files() == ["t.diskqueue.meta.dat"]
    assert env.read(env.meta()) == b"0\n0,0\n0,0\n"
    assert len(env.read(env.meta())) == 10
    assert os.stat(env.meta()).st_mode & 0o777 == 0o600


def test_five_records_meta_and_bytes_identical_to_go(env):
    bodies = [b"dd", b"a", b"bb", b"ccc", b"d"]
    go_bytes = b"".join(go_record(mid(i), b) for i, b in enumerate(bodies))
    assert len(go_bytes) == 159
    q = env.open(max_bytes_per_file=104857600)
    q.put([Message(mid(i), b, TS) for i, b in enumerate(bodies)])
    q.close()
    assert env.read(env.meta()) == b"5\n0,0\n0,159\n"
    assert env.read(env.data(0)) == go_bytes
    assert os.stat(env.data(0)).st_mode & 0o777 == 0o600


def test_go_written_directory_is_read_and_rewritten_identically(env, tmp_path):
    # A Go nsqd left 5 unread records (one in flight at shutdown: attempts 2).
    bodies = [b"dd", b"a", b"bb", b"ccc", b"d"]
    recs = [go_record(mid(i), b, TS + i, 2 if i == 3 else 0) for i, b in enumerate(bodies)]
    env.write(env.meta("t1:c1"), b"5\n0,0\n0,159\n")
    env.write(env.data(0, "t1:c1"), b"".join(recs))
    q = env.open("t1:c1", max_bytes_per_file=104857600)
    assert q.depth() == 5
    got = q.get(100)
    assert [(m.id, m.body, m.timestamp, m.attempts, m.deferred_ns) for m in got] == [
        (mid(i), b, TS + i, 2 if i == 3 else 0, 0) for i, b in enumerate(bodies)
    ]
    assert q.depth() == 0
    q.close()
    assert env.read(env.meta("t1:c1")) == b"0\n0,159\n0,159\n"

    # Writing the same messages gives the same bytes.
    other = tmp_path / "ours"
    other.mkdir()
    q2 = DiskQueue("t1:c1", str(other), 104857600, 26, 1048602, 2500, 2.0, env.logger)
    q2.put(got)
    q2.close()
    assert (other / "t1:c1.diskqueue.000000.dat").read_bytes() == b"".join(recs)
    assert (other / "t1:c1.diskqueue.meta.dat").read_bytes() == b"5\n0,0\n0,159\n"


def test_go_written_queue_spanning_files_mid_read(env):
    # file 1: two 44-byte records, the first already consumed; file 2: one record.
    env.write(env.data(1), go_record(mid(1), b"x" * 14) + go_record(mid(2), b"y" * 14))
    env.write(env.data(2), go_record(mid(3), b"z" * 14))
    env.write(env.meta(), b"2\n1,44\n2,44\n")
    q = env.open()
    got = q.get(10)
    assert [(m.id, m.body) for m in got] == [(mid(2), b"y" * 14), (mid(3), b"z" * 14)]
    assert not os.path.exists(env.data(1))
    q.close()
    assert env.read(env.meta()) == b"0\n2,44\n2,44\n"
    assert env.files() == ["t.diskqueue.000002.dat", "t.diskqueue.meta.dat"]


def test_parse_meta_like_fscanf():
    assert parse_meta(b"5\n0,0\n0,159\n") == ([5, 0, 0, 0, 159], None)
    assert parse_meta(b"-3\n4,88\n4,88") == ([-3, 4, 88, 4, 88], None)
    fields, err = parse_meta(b"7\n2,10\nx")
    assert fields == [7, 2, 10] and err


def test_partial_meta_keeps_positions_but_not_depth(env):
    env.write(env.data(3), go_record(mid(1), b"x" * 14))
    env.write(env.meta(), b"9\n3,0\n3,44")  # truncated: last newline missing is fine...
    q = env.open()
    assert (q.read_file_num, q.read_pos, q.write_file_num, q.write_pos, q.depth()) == (3, 0, 3, 44, 9)
    q.delete()
    env.write(env.meta(), b"9\n3,0\n3,")  # ...a missing field is not
    q = env.open()
    assert "failed to retrieveMetaData" in env.log
    # depth not taken from a partial file; positions are (writePos 0 of file 3);
    # recovery (beyond Go, which skips it after a parse error and would
    # overwrite file 3) sees the record past writePos and rolls the writer
    assert (q.read_file_num, q.read_pos, q.write_file_num, q.write_pos) == (3, 0, 4, 0)
    assert q.depth() == 1
    assert ids(q.get(5)) == [mid(1)]


# -- file names and rolling -------------------------------------------------------


def test_file_names(env):
    q = env.open("t1:c1")
    assert q.file_name(0).endswith("/t1:c1.diskqueue.000000.dat")
    assert q.file_name(42).endswith("/t1:c1.diskqueue.000042.dat")
    assert q.file_name(999999).endswith("/t1:c1.diskqueue.999999.dat")
    assert q.file_name(1234567).endswith("/t1:c1.diskqueue.1234567.dat")
    assert q.meta_file_name.endswith("/t1:c1.diskqueue.meta.dat")
    q.close()


def test_seven_digit_file_numbers(env):
    env.write(env.meta(), b"0\n999999,88\n999999,88\n")
    env.write(env.data(999999), go_record(mid(1), b"x" * 14) * 2)
    q = env.open()
    q.put([msg(1), msg(2)])
    assert (q.write_file_num, q.write_pos) == (1000000, 88)
    assert ids(q.get(5)) == [mid(1), mid(2)]
    q.put([msg(3)])
    q.close()
    assert env.files() == ["t.diskqueue.1000001.dat", "t.diskqueue.meta.dat"]
    assert env.read(env.meta()) == b"1\n1000001,0\n1000001,44\n"


def test_data_path_empty_means_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    q = DiskQueue("t", "", 100)
    q.put([msg(1)])
    q.close()
    assert sorted(os.listdir(str(tmp_path))) == ["t.diskqueue.000000.dat", "t.diskqueue.meta.dat"]


@pytest.mark.parametrize("batched", [True, False])
def test_roll_rule_88_byte_files(env, batched):
    q = env.open(max_bytes_per_file=100)
    msgs = [msg(i) for i in range(5)]
    if batched:
        q.put(msgs)
    else:
        for m in msgs:
            q.put([m])
    q.close()
    assert [os.path.getsize(env.data(i)) for i in range(3)] == [88, 88, 44]
    assert env.read(env.data(0)) == go_record(mid(0), b"x" * 14, TS) + go_record(mid(1), b"x" * 14, TS + 1)
    assert env.read(env.meta()) == b"5\n0,0\n2,44\n"


def test_first_record_of_a_file_is_always_written(env):
    q = env.open(max_bytes_per_file=100)
    q.put([msg(1, b"b" * 150)])  # 180 bytes > 100, into the empty file 0
    q.put([msg(2)])  # rolls
    q.put([msg(3, b"c" * 150), msg(4, b"d" * 150), msg(5)])
    q.close()
    sizes = [os.path.getsize(env.data(i)) for i in range(5)]
    assert sizes == [180, 44, 180, 180, 44]
    assert env.read(env.meta()) == b"5\n0,0\n4,44\n"
    q = env.open()
    assert [m.body for m in q.get(10)] == [b"b" * 150, b"x" * 14, b"c" * 150, b"d" * 150, b"x" * 14]
    q.close()


def test_record_exactly_filling_a_file(env):
    q = env.open(max_bytes_per_file=88)
    q.put([msg(1), msg(2), msg(3)])
    assert [os.path.getsize(env.data(i)) for i in range(2)] == [88, 44]
    q.close()


def test_invalid_write_size(env):
    q = env.open(max_msg_size=26 + 10)
    with pytest.raises(BackendError) as e:
        q.put([msg(1, b"ok"), msg(2, b"y" * 11)])
    assert str(e.value) == "invalid message write size (37) minMsgSize=26 maxMsgSize=36"
    assert q.depth() == 0 and q.write_pos == 0  # nothing of the batch was written
    q.put([msg(3, b"y" * 10)])
    assert q.depth() == 1
    q.close()


# -- reading -------------------------------------------------------------------


def test_read_back_across_files_and_deletion(env):
    q = env.open(max_bytes_per_file=100)
    q.put([msg(i) for i in range(5)])  # files 0, 1 (88 bytes) and 2 (44)
    assert q.depth() == 5
    assert ids(q.get(3)) == [mid(0), mid(1), mid(2)]
    assert not os.path.exists(env.data(0))
    assert os.path.exists(env.data(1))
    assert (q.read_file_num, q.read_pos, q.depth()) == (1, 44, 2)
    # file 0 done -> the read-side file change synced the metadata
    assert env.read(env.meta()) == b"2\n1,44\n2,44\n"
    assert ids(q.get(10)) == [mid(3), mid(4)]
    assert q.depth() == 0
    assert q.get(10) == []
    q.close()
    assert env.files() == ["t.diskqueue.000002.dat", "t.diskqueue.meta.dat"]
    assert env.read(env.meta()) == b"0\n2,44\n2,44\n"


def test_consumed_through_file_4_meta_example(env):
    q = env.open(max_bytes_per_file=100)
    q.put([msg(i) for i in range(10)])
    assert len(q.get(10)) == 10
    q.close()
    assert env.read(env.meta()) == b"0\n4,88\n4,88\n"
    assert env.files() == ["t.diskqueue.000004.dat", "t.diskqueue.meta.dat"]


def test_reads_see_unsynced_writes_interleaved(env):
    q = env.open(max_bytes_per_file=1000)
    seen = []
    n = 0
    for round_ in range(30):
        q.put([msg(n + k) for k in range(round_ % 4 + 1)])
        n += round_ % 4 + 1
        seen.extend(q.get(round_ % 3 + 1))
    seen.extend(q.get(1000))
    assert ids(seen) == [mid(i) for i in range(n)]
    assert q.depth() == 0
    assert not [f for f in env.files() if f.endswith(".bad")]
    q.close()


def test_buffered_reads_large_and_many_records(env, monkeypatch):
    monkeypatch.setattr(records_mod, "READ_CHUNK", 1000)  # records straddle every refill
    q = env.open(max_bytes_per_file=50000)
    bodies = [bytes([65 + i % 26]) * (i * 37 % 400) for i in range(300)]
    bodies[100] = b"L" * 5000  # bigger than a refill
    q.put([Message(mid(i), b, TS) for i, b in enumerate(bodies)])
    got = []
    while True:
        part = q.get(7)
        if not part:
            break
        got.extend(part)
    assert [m.body for m in got] == bodies
    assert ids(got) == [mid(i) for i in range(300)]
    q.close()


def test_get_zero_and_depth_o1(env):
    q = env.open()
    q.put([msg(1)])
    assert q.get(0) == []
    assert q.depth() == 1
    q.close()


def test_records_shorter_than_header_are_skipped(env):
    # A queue configured with min_msg_size below 26 may hold undecodable records.
    env.write(env.data(0), struct.pack(">i", 3) + b"abc" + go_record(mid(7), b"ok"))
    env.write(env.meta(), b"2\n0,0\n0,%d\n" % (7 + 32))
    q = env.open(min_msg_size=1)
    got = q.get(10)
    assert [(m.id, m.body) for m in got] == [(mid(7), b"ok")]
    assert q.depth() == 0
    assert "undecodable" in env.log
    q.close()


# -- sync policy ----------------------------------------------------------------


def test_sync_every_1_writes_meta_after_each_write_and_read(env):
    q = env.open(sync_every=1, max_bytes_per_file=1000)
    q.put([msg(1)])
    assert env.read(env.meta()) == b"1\n0,0\n0,44\n"
    q.put([msg(2)])
    assert env.read(env.meta()) == b"2\n0,0\n0,88\n"
    q.get(1)
    assert env.read(env.meta()) == b"1\n0,44\n0,88\n"
    q.delete()
    assert not [f for f in env.files() if f.endswith(".tmp")]


def test_sync_every_counts_writes_and_reads(env):
    q = env.open(sync_every=3, max_bytes_per_file=1000)
    q.put([msg(1)])
    q.put([msg(2)])
    assert not os.path.exists(env.meta())
    q.get(1)  # third op
    assert env.read(env.meta()) == b"1\n0,44\n0,88\n"
    q.delete()


def test_maybe_sync_after_sync_timeout_only_when_dirty(env):
    q = env.open(sync_timeout=2.0, max_bytes_per_file=1000)
    now = time.monotonic()
    assert q.maybe_sync(now + 10) is False  # idle queue: never syncs
    assert not os.path.exists(env.meta())
    q.put([msg(1)])
    assert q.maybe_sync(time.monotonic()) is False  # timeout not elapsed
    assert not os.path.exists(env.meta())
    assert q.sync_if_idle_due(time.monotonic() + 2.5) is True
    assert env.read(env.meta()) == b"1\n0,0\n0,44\n"
    assert q.maybe_sync(time.monotonic() + 100) is False  # nothing since
    q.delete()


def test_write_roll_syncs_meta(env):
    q = env.open(max_bytes_per_file=100)
    q.put([msg(1), msg(2)])
    assert not os.path.exists(env.meta())
    q.put([msg(3)])
    assert env.read(env.meta()) == b"3\n0,0\n1,44\n"
    q.delete()
