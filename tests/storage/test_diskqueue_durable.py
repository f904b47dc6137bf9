"""DurableDiskQueue (--durable): redelivery of unacked records, the committed position, empty/close/delete."""

import os

import pytest

from nsqd_threaded.storage.backend import BackendError
from nsqd_threaded.storage.meta_file import parse_meta

from support.durable import REC, TS, drain, env, ids, mid, msg  # noqa: F401 (fixtures among them)

pytestmark = pytest.mark.timeout(60)


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
    # Committed past record 0 only; 1 (unacked), 3, 4 come back; 2 (done, after an unacked one) is in
    # the done log, and skipped.
    assert env.read_meta() == b"4\n0,%d\n0,%d\n" % (REC, 5 * REC)

    q = env.open(max_bytes_per_file=1000)
    assert q.depth() == 4  # (the metadata's: the skipped record counts until it is read)
    assert ids(q.get(10)) == [mid(1), mid(3), mid(4)]
    assert q.depth() == 0
    q.close()
    q = env.open(max_bytes_per_file=1000)  # nothing acked: the same again (the done entry is kept)
    assert ids(q.get(10)) == [mid(1), mid(3), mid(4)]
    q.close()
    # Go (non-durable) never reads the done log: it sees them all as plain unread records.
    q = env.open(durable=False, max_bytes_per_file=1000)
    assert ids(q.get(10)) == [mid(1), mid(2), mid(3), mid(4)]
    q.close()


def test_a_commit_writes_the_metadata_when_its_write_file_is_new_and_go_finds_every_record(env):
    """A commit writes the metadata only in a write file the metadata file does not hold yet: within
    one, a reader after a kill reads past the stale write position (go-diskqueue does), while past a
    roll go-diskqueue would write over the newer file from its start."""
    q = env.open()  # two records per file
    assert env.read_meta() == b"0\n0,0\n0,0\n"  # written at the open
    q.put([msg(0)])
    q.wait_synced(q.sync_point())
    assert env.read_meta() == b"0\n0,0\n0,0\n"  # the same write file: nothing written
    q.put([msg(1), msg(2)])  # msg 2 rolls to file 1
    q.wait_synced(q.sync_point())
    assert env.read_meta() == b"3\n0,0\n1,%d\n" % REC  # a new write file: the commit wrote it
    q.put([msg(3)])
    q.wait_synced(q.sync_point())
    assert env.read_meta() == b"3\n0,0\n1,%d\n" % REC
    # "Crash": q is never closed.  The queue Go's diskqueue is (non-durable) finds all four.
    go = env.open(durable=False)
    assert ids(drain(go)) == [mid(i) for i in range(4)]
    go.close()
    q.delete()


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
    assert ids(drain(q2)) == [mid(2)] + [mid(i) for i in range(4, 10)]  # 3 was acked: in the done log
    q2.close()
    q1.delete()


def test_crash_without_any_sync_skips_what_was_acked(env):
    q1 = env.open(max_bytes_per_file=10000)
    assert env.read_meta() == b"0\n0,0\n0,0\n"  # written at the start: Go reads nothing without one
    q1.put([msg(i) for i in range(4)])
    q1.wait_synced(q1.sync_point())
    assert env.read_meta() == b"0\n0,0\n0,0\n"  # (the commit in the same write file writes nothing)
    assert ids(q1.get(4)) == [mid(i) for i in range(4)]
    q1.ack([mid(0), mid(1), mid(2), mid(3)])
    assert env.read_meta() == b"0\n0,0\n0,0\n"  # the acks (FINs) wait for the next sync
    q2 = env.open(max_bytes_per_file=10000)
    assert ids(drain(q2)) == []  # the done log has them (appended by the acks, no sync needed)
    assert q2.depth() == 0
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
    assert env.read_meta() == b"2\n%d,0\n%d,%d\n" % (q.write_file_num, q.write_file_num, q.write_pos)  # the commit's
    os.remove(env.meta())  # as if the kill came between the empty() and that commit
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


def test_kept_attempts_are_read_back_after_a_crash_and_nothing_else_changes(env):
    q1 = env.open()
    q1.put([msg(i) for i in range(4)])  # files 0, 1
    taken = q1.get(4)
    taken[1].attempts = 3
    taken[2].attempts = 1
    before = [open(os.path.join(env.path, name), "rb").read() for name in env.data_files()]
    q1.keep_attempts([taken[1], taken[2], taken[3]])  # (taken[3]: 0, as written: nothing to do)
    q1.ack([mid(0)])
    # "Crash": a second queue reads the same files.
    q2 = env.open()
    back = drain(q2)
    assert [(m.id, m.attempts, m.body, m.timestamp) for m in back] == [
        (mid(i), a, b"x" * 14, TS + i) for i, a in ((1, 3), (2, 1), (3, 0))]  # (0: acked)
    after = [open(os.path.join(env.path, name), "rb").read() for name in env.data_files()]
    changed = [i for i, (x, y) in enumerate(zip(before, after)) for j in range(len(x)) if x[j] != y[j]]
    assert len(changed) == 2  # one byte of the attempts field in each of the two records
    q2.close()
    q1.delete()


def test_done_log_keeps_only_what_the_metadata_has_not_passed(env):
    q = env.open(max_bytes_per_file=10000)
    done = os.path.join(env.path, "t.diskqueue.done.dat")
    q.put([msg(i) for i in range(6)])
    q.get(6)
    q.ack([mid(1), mid(2)])  # behind 0, still in flight
    assert os.path.getsize(done) == 2 * 32
    q.sync()
    assert os.path.getsize(done) == 2 * 32  # still ahead of the committed position
    q.ack([mid(0)])
    assert os.path.getsize(done) == 3 * 32  # (appended: the metadata is not written by an ack)
    q.sync()
    assert not os.path.exists(done)  # the metadata passed them all
    q.ack([mid(4)])
    assert os.path.getsize(done) == 32
    crashed = env.open(max_bytes_per_file=10000)  # a crash now: 3 and 5 come back, 4 does not
    assert ids(drain(crashed)) == [mid(3), mid(5)]
    crashed.delete()
    q.empty()
    assert not os.path.exists(done)
    q.close()


def test_commit_writes_the_metadata_in_place_and_bytes_left_after_it_are_ignored(env):
    q1 = env.open(max_bytes_per_file=10000)
    inode = os.stat(env.meta()).st_ino
    q1.put([msg(i) for i in range(12)])
    q1.wait_synced(q1.sync_point())
    q1.get(12)
    q1.ack([mid(0)], persist=True)  # the text grows
    assert env.read_meta() == b"11\n0,%d\n0,%d\n" % (REC, 12 * REC)
    for i in range(1, 12):  # depth 10..0: the text shrinks by a digit, truncated
        q1.ack([mid(i)], persist=True)
    assert env.read_meta() == b"0\n0,%d\n0,%d\n" % (12 * REC, 12 * REC)
    assert os.stat(env.meta()).st_ino == inode  # written in place: no rename per write
    # A kill between the pwrite and the truncate leaves the old text's tail: ignored (as by Go's Fscanf).
    with open(env.meta(), "ab") as f:
        f.write(b"2\n0,0\n0,")
    q2 = env.open(max_bytes_per_file=10000)
    assert q2.depth() == 0 and drain(q2) == []
    q2.close()
    q1.delete()


def test_peek_and_stored_ids_leave_out_what_the_done_log_skips(env):
    q1 = env.open(max_bytes_per_file=10000)
    q1.put([msg(i) for i in range(4)])
    q1.get(4)
    q1.ack([mid(1), mid(2)])  # behind 0, in flight
    q2 = env.open(max_bytes_per_file=10000)  # a crash
    assert ids(q2.peek()[0]) == [mid(0), mid(3)]
    assert list(q2.stored_ids()) == [mid(0), mid(3)]
    assert ids(drain(q2)) == [mid(0), mid(3)]
    q2.close()
    q1.delete()


def test_a_persisted_ack_behind_the_head_goes_to_the_done_log(env):
    q1 = env.open(max_bytes_per_file=10000)
    q1.put([msg(i) for i in range(4)])
    q1.get(4)
    q1.ack([mid(0), mid(3)], persist=True)  # 0 passed by the metadata; 3 behind 1 and 2
    assert env.read_meta() == b"3\n0,%d\n0,%d\n" % (REC, 4 * REC)
    crashed = env.open(max_bytes_per_file=10000)
    assert ids(drain(crashed)) == [mid(1), mid(2)]
    crashed.delete()
    q1.close()
