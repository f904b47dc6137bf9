"""DiskQueue across restarts: recovery, corruption, and no spurious .bad files."""

import os
import struct
import time

from nsqd_threaded.storage import records as records_mod

from support.diskqueue import env, go_record, ids, mid, msg  # noqa: F401 (fixtures among them)

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
    monkeypatch.setattr(records_mod, "READ_CHUNK", 50)  # the record count scan straddles reads
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
