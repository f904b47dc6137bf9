"""nsqd_threaded.storage.diskqueue against real files: go-diskqueue's format and behaviour.

Expected bytes come from ../shared/spec/diskqueue.md; Go-written directories
are built here byte by byte from the spec's layouts (not with our encoder).
"""

import io
import os
import struct
import subprocess
import sys
import textwrap
import time

import pytest

from nsqd_threaded.storage import diskqueue as dq_mod
from nsqd_threaded.storage.backend import BackendError
from nsqd_threaded.storage.diskqueue import DiskQueue, parse_meta
from nsqd_threaded.internal.logger import Logger
from nsqd_threaded.wire.message import Message

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TS = 0x18EA4C4C68FDBFED  # the timestamp of the spec's verified record


def go_record(msg_id, body, timestamp=TS, attempts=0):
    """A record assembled from the spec's table (§3), independently of our encoder."""
    payload = struct.pack(">q", timestamp) + struct.pack(">H", attempts) + msg_id + body
    return struct.pack(">i", len(payload)) + payload


def mid(i):
    return b"%016x" % i


def msg(i, body=b"x" * 14, attempts=0, deferred_ns=0):
    """Body of 14 bytes -> a 44-byte record (4 + 26 + 14), as in the spec's roll example."""
    return Message(mid(i), body, TS + i, attempts, deferred_ns)


class Env:
    def __init__(self, path):
        self.path = path
        self.log_stream = io.StringIO()
        self.logger = Logger(level="debug", stream=self.log_stream)

    def open(self, name="t", **kw):
        kw.setdefault("max_bytes_per_file", 100)
        kw.setdefault("min_msg_size", 26)
        kw.setdefault("max_msg_size", 1024 * 1024 + 26)
        kw.setdefault("sync_every", 2500)
        kw.setdefault("sync_timeout", 2.0)
        return DiskQueue(name, str(self.path), logger=self.logger, **kw)

    def data(self, n, name="t"):
        return os.path.join(str(self.path), "%s.diskqueue.%06d.dat" % (name, n))

    def meta(self, name="t"):
        return os.path.join(str(self.path), "%s.diskqueue.meta.dat" % name)

    def read(self, path):
        with open(path, "rb") as f:
            return f.read()

    def write(self, path, data):
        with open(path, "wb") as f:
            f.write(data)

    def files(self):
        return sorted(os.listdir(str(self.path)))

    @property
    def log(self):
        return self.log_stream.getvalue()


@pytest.fixture
def env(tmp_path):
    return Env(tmp_path)


def ids(msgs):
    return [m.id for m in msgs]


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
    monkeypatch.setattr(dq_mod, "READ_CHUNK", 1000)  # records straddle every refill
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


# -- restart and recovery ------------------------------------------------------


def test_restart_continues_where_it_left_off(env):
    q = env.open(max_bytes_per_file=100)
    q.put([msg(i) for i in range(7)])
    assert ids(q.get(3)) == [mid(0), mid(1), mid(2)]
    q.close()
    assert env.read(env.meta()) == b"4\n1,44\n3,44\n"
    q = env.open(max_bytes_per_file=100)
    assert q.depth() == 4
    q.put([msg(7)])
    assert ids(q.get(2)) == [mid(3), mid(4)]
    q.close()
    q = env.open(max_bytes_per_file=100)
    assert q.depth() == 3
    assert ids(q.get(10)) == [mid(5), mid(6), mid(7)]
    q.close()
    assert env.read(env.meta()) == b"0\n3,88\n3,88\n"
    assert not [f for f in env.files() if f.endswith(".bad")]


def test_recovery_write_file_larger_than_meta(env):
    q = env.open(max_bytes_per_file=1000)
    q.put([msg(i) for i in range(3)])
    q.sync()
    assert env.read(env.meta()) == b"3\n0,0\n0,132\n"
    q.put([msg(3), msg(4)])  # not synced
    q.delete()  # crash: no sync
    assert env.read(env.meta()) == b"3\n0,0\n0,132\n"
    assert os.path.getsize(env.data(0)) == 220

    q = env.open(max_bytes_per_file=1000)
    assert "metadata writePos 132 < file size of 220, skipping to new file" in env.log
    assert (q.write_file_num, q.write_pos) == (1, 0)
    assert q.depth() == 5  # the unsynced records are counted too
    q.put([msg(5)])
    assert os.path.getsize(env.data(1)) == 44
    assert ids(q.get(10)) == [mid(i) for i in range(6)]
    assert q.depth() == 0
    assert not [f for f in env.files() if f.endswith(".bad")]
    assert not os.path.exists(env.data(0))
    q.close()
    assert "depth at tail" not in env.log


def test_recovery_without_meta_file(env):
    q = env.open()
    q.put([msg(1), msg(2)])
    q.delete()  # crash before the first sync: no meta file at all
    assert env.files() == ["t.diskqueue.000000.dat"]
    q = env.open()
    assert q.depth() == 2
    assert ids(q.get(10)) == [mid(1), mid(2)]
    q.close()


def test_stale_depth_is_corrected_at_the_tail(env):
    env.write(env.data(0), go_record(mid(1), b"a") + go_record(mid(2), b"b"))
    env.write(env.meta(), b"7\n0,0\n0,62\n")
    q = env.open()
    assert q.depth() == 7
    assert ids(q.get(100)) == [mid(1), mid(2)]
    assert q.depth() == 0
    assert "positive depth at tail (5), data loss, resetting 0..." in env.log
    q.close()
    # too low (Go can persist a negative depth): the data is still offered
    env.write(env.data(1), go_record(mid(3), b"a") + go_record(mid(4), b"b"))
    env.write(env.meta(), b"-1\n1,0\n1,62\n")
    q = env.open()
    assert q.depth() >= 1
    assert ids(q.get(100)) == [mid(3), mid(4)]
    assert q.depth() == 0
    assert "negative depth at tail" in env.log
    q.close()


# -- corruption ------------------------------------------------------------------


def _three_files(env):
    """Go-written: files 0 and 1 complete (88 bytes each), file 2 current."""
    for f in range(3):
        recs = [go_record(mid(10 * f + k), b"x" * 14) for k in range(2 if f < 2 else 1)]
        env.write(env.data(f), b"".join(recs))
    env.write(env.meta(), b"5\n0,0\n2,44\n")


def test_truncated_record_goes_to_bad_and_later_files_deliver(env):
    _three_files(env)
    with open(env.data(0), "r+b") as f:
        f.truncate(70)  # second record cut short
    q = env.open()
    got = q.get(100)
    assert ids(got) == [mid(0), mid(10), mid(11), mid(20)]
    assert os.path.exists(env.data(0) + ".bad")
    assert "reading at 44 of %s - unexpected EOF" % env.data(0) in env.log
    assert "jump to next file and saving bad file as %s.bad" % env.data(0) in env.log
    assert q.depth() == 0
    q.put([msg(99)])
    assert ids(q.get(5)) == [mid(99)]
    q.close()


def test_bad_length_goes_to_bad(env):
    _three_files(env)
    with open(env.data(1), "r+b") as f:
        f.seek(44)
        f.write(struct.pack(">i", 5))  # below minMsgSize
    q = env.open()
    assert ids(q.get(100)) == [mid(0), mid(1), mid(10), mid(20)]
    assert "reading at 44 of %s - invalid message read size (5)" % env.data(1) in env.log
    assert os.path.exists(env.data(1) + ".bad")
    assert q.depth() == 0
    q.close()


def test_too_large_length_goes_to_bad(env):
    _three_files(env)
    with open(env.data(1), "r+b") as f:
        f.write(struct.pack(">i", 1 << 30))
    q = env.open()
    assert ids(q.get(100)) == [mid(0), mid(1), mid(20)]
    assert "invalid message read size (1073741824)" in env.log
    q.close()


def test_garbage_file_goes_to_bad(env):
    _three_files(env)
    env.write(env.data(0), os.urandom(5) + b"\xff" * 83)
    q = env.open()
    assert ids(q.get(100)) == [mid(10), mid(11), mid(20)]
    assert env.files() == ["t.diskqueue.000000.dat.bad", "t.diskqueue.000002.dat", "t.diskqueue.meta.dat"]
    q.close()
    assert env.read(env.meta()) == b"0\n2,44\n2,44\n"


def test_missing_data_file_is_skipped(env):
    _three_files(env)
    os.remove(env.data(1))
    q = env.open()
    assert ids(q.get(100)) == [mid(0), mid(1), mid(20)]
    assert "failed to rename bad diskqueue file" in env.log
    q.close()


def test_corrupt_current_write_file_rolls_the_writer(env):
    env.write(env.data(0), go_record(mid(1), b"x" * 14) + b"\x00\x00")
    env.write(env.meta(), b"2\n0,0\n0,46\n")
    q = env.open()
    assert ids(q.get(10)) == [mid(1)]
    assert os.path.exists(env.data(0) + ".bad")
    assert (q.write_file_num, q.write_pos, q.read_file_num, q.read_pos) == (1, 0, 1, 0)
    q.put([msg(2)])
    assert ids(q.get(10)) == [mid(2)]
    assert q.depth() == 0
    q.close()


def test_read_position_past_the_write_position_is_reset(env):
    env.write(env.data(0), go_record(mid(1), b"x" * 14))
    env.write(env.meta(), b"0\n0,90\n0,44\n")
    q = env.open()
    assert q.get(10) == []
    assert "readPos > writePos (90 > 44)" in env.log
    assert (q.read_file_num, q.write_file_num, q.read_pos, q.write_pos) == (1, 1, 0, 0)
    q.put([msg(2)])
    assert ids(q.get(10)) == [mid(2)]
    q.close()


# -- go-diskqueue#42: no spurious .bad files ----------------------------------------


def test_no_spurious_bad_when_writer_rolls_after_reader_caught_up(env):
    """Go renames file 0 to .bad here (EOF at 88 of a now-complete file)."""
    q = env.open(max_bytes_per_file=100)
    q.put([msg(1), msg(2)])  # file 0 full: 88 bytes
    assert ids(q.get(10)) == [mid(1), mid(2)]  # reader caught up at (0, 88)
    q.put([msg(3)])  # writer rolls to file 1
    q.put([msg(4)])
    assert ids(q.get(10)) == [mid(3), mid(4)]
    q.put([msg(5), msg(6), msg(7)])  # and again, with the reader caught up in file 1
    assert ids(q.get(10)) == [mid(5), mid(6), mid(7)]
    q.close()
    assert not [f for f in env.files() if f.endswith(".bad")]
    assert "reading at" not in env.log
    assert env.files() == ["t.diskqueue.000003.dat", "t.diskqueue.meta.dat"]
    assert env.read(env.meta()) == b"0\n3,44\n3,44\n"


def test_no_spurious_bad_from_go_state_reader_at_end_of_complete_file(env):
    """The state Go leaves behind for its bug: reader at the end of a complete file."""
    env.write(env.data(0), go_record(mid(1), b"x" * 14) + go_record(mid(2), b"x" * 14))
    env.write(env.data(1), go_record(mid(3), b"x" * 14))
    env.write(env.meta(), b"1\n0,88\n1,44\n")
    q = env.open()
    assert ids(q.get(10)) == [mid(3)]
    assert not [f for f in env.files() if f.endswith(".bad")]
    assert not os.path.exists(env.data(0))
    q.close()


def test_reader_caught_up_at_roll_leaves_go_safe_meta(env):
    q = env.open(max_bytes_per_file=100)
    q.put([msg(1), msg(2)])
    q.get(10)
    q.put([msg(3)])
    # The meta persisted at the roll already points past the consumed file,
    # so Go nsqd taking over this directory does not hit its own bug.
    assert env.read(env.meta()) == b"1\n1,0\n1,44\n"
    assert not os.path.exists(env.data(0))
    q.delete()


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


# -- more recovery and corruption edges ----------------------------------------------


def test_read_position_past_end_of_complete_file_is_corrupt(env):
    env.write(env.data(0), go_record(mid(1), b"x" * 14) * 2)
    env.write(env.data(1), go_record(mid(2), b"x" * 14))
    env.write(env.meta(), b"1\n0,100\n1,44\n")
    q = env.open()
    assert ids(q.get(10)) == [mid(2)]
    assert "reading at 100 of %s - EOF" % env.data(0) in env.log
    assert os.path.exists(env.data(0) + ".bad")
    q.close()


def test_read_file_past_write_file_is_reset(env):
    env.write(env.meta(), b"0\n5,0\n3,0\n")
    q = env.open()
    assert q.get(10) == []
    assert "readFileNum > writeFileNum (5 > 3)" in env.log
    assert (q.read_file_num, q.read_pos, q.write_file_num, q.write_pos) == (4, 0, 4, 0)
    q.put([msg(1)])
    assert ids(q.get(10)) == [mid(1)]
    q.close()


def test_recovery_follows_a_chain_of_unsynced_files(env, monkeypatch):
    monkeypatch.setattr(dq_mod, "READ_CHUNK", 50)  # the record count scan straddles reads
    q = env.open(max_bytes_per_file=100)
    q.put([msg(0)])
    q.sync()
    assert env.read(env.meta()) == b"1\n0,0\n0,44\n"
    q.put([msg(i) for i in range(1, 6)])  # (0: 0,1) (1: 2,3) (2: 4,5); the rolls synced...
    q.delete()
    env.write(env.meta(), b"1\n0,0\n0,44\n")  # ...but pretend they had not
    env.write(env.data(2), env.read(env.data(2)) + b"\x00\x00\x00")  # torn last write
    q = env.open(max_bytes_per_file=100)
    assert (q.write_file_num, q.write_pos) == (3, 0)
    assert q.depth() == 6
    assert ids(q.get(100)) == [mid(i) for i in range(6)]
    assert os.path.exists(env.data(2) + ".bad")  # the torn tail is still corrupt
    assert q.depth() == 0
    q.close()


def test_maybe_sync_persists_recovered_state(env):
    env.write(env.data(0), go_record(mid(1), b"x" * 14))
    q = env.open()
    assert not os.path.exists(env.meta())
    assert q.maybe_sync(time.monotonic() + 10) is True
    assert env.read(env.meta()) == b"1\n0,0\n1,0\n"
    q.close()


def test_meta_temp_files_do_not_remain(env):
    q = env.open(sync_every=1)
    for i in range(20):
        q.put([msg(i)])
        q.get(1)
    q.close()
    assert not [f for f in env.files() if f.endswith(".tmp")]
