"""RingReader against a Python-written file: validation, cursor, wrap-around, torn data, header."""

from __future__ import annotations

import numpy as np
import pytest

from mycroft_otel import native
from mycroft_otel.native import RingReader, ShmHeader
from shmfake import FakeRing


def test_header_and_names(tmp_path):
    f = FakeRing(tmp_path / "a.mycroft")
    with RingReader(str(f.path)) as r:
        h = r.header()
        assert h["comm_name"] == "tp\u00e9" and h["job_id"] == "job-1" and h["rank"] == 3
        hdr = ShmHeader.from_dict(h)
        assert hdr.comm_hash_hex == "feedfacecafebeef"
        assert hdr.to_realtime(0) == 0 and hdr.to_realtime(2_000) == 1_700_000_000_000_001_000
        arr = hdr.to_realtime(np.array([0, 1_001], dtype=np.uint64))
        assert arr.tolist() == [0, 1_700_000_000_000_000_001]
        assert r.header_raw()["host"][0] == b"hostA"
    with pytest.raises(ValueError, match="closed"):
        r.header()
    assert native.func_name(4) == "AllReduce" and native.func_name(255) == "unknown"
    assert native.wait_state_name(3) == "SendWait" and native.datatype_size(7) == 4


@pytest.mark.parametrize("damage, message", [
    (lambda f: f.header.__setitem__("magic", 0), "not initialised yet"),
    (lambda f: f.header.__setitem__("magic", 12345), "foreign file"),
    (lambda f: f.header.__setitem__("layout_version", 99), "layout version 99"),
    (lambda f: f.header.__setitem__("ring_offset", 64), "offsets"),
    (lambda f: f.header.__setitem__("file_size", 1), "file_size"),
])
def test_bad_files_are_named(tmp_path, damage, message):
    f = FakeRing(tmp_path / "a.mycroft")
    damage(f)
    f.flush()
    with pytest.raises(ValueError, match=message):
        RingReader(str(f.path))


def test_truncated_and_missing(tmp_path):
    f = FakeRing(tmp_path / "a.mycroft")
    f.flush()
    data = f.path.read_bytes()
    (tmp_path / "t.mycroft").write_bytes(data[: len(data) - 100])
    with pytest.raises(ValueError, match="truncated"):
        RingReader(str(tmp_path / "t.mycroft"))
    (tmp_path / "s.mycroft").write_bytes(b"x" * 10)
    with pytest.raises(ValueError, match="truncated"):
        RingReader(str(tmp_path / "s.mycroft"))
    with pytest.raises(ValueError, match="cannot open"):
        RingReader(str(tmp_path / "nope"))


def test_cursor_resume_wrap_and_overwritten(tmp_path):
    f = FakeRing(tmp_path / "a.mycroft", ring_capacity=8)
    f.path.chmod(0o400)  # the reader never needs write access
    r = RingReader(str(f.path))
    recs, cur, lost = r.read(0, 100)
    assert len(recs) == 0 and cur == 0 and lost == 0
    for i in range(5):
        f.publish(op_id=i + 1)
    recs, cur, lost = r.read(0, 3)
    assert recs["op"]["op_id"].tolist() == [1, 2, 3] and cur == 3 and lost == 0
    recs, cur, lost = r.read(cur, 100)
    assert recs["op"]["op_id"].tolist() == [4, 5] and cur == 5
    for i in range(5, 20):  # wrap past the reader
        f.publish(op_id=i + 1)
    recs, cur, lost = r.read(cur, 100)
    assert lost == 20 - 8 - 5 and recs["op"]["op_id"].tolist() == list(range(13, 21)) and cur == 20
    assert r.ring_head == 20
    # a cursor from the future resumes at the head
    recs, cur2, lost = r.read(10**9, 10)
    assert len(recs) == 0 and cur2 == 20


def test_unpublished_record_stops_or_is_skipped(tmp_path):
    f = FakeRing(tmp_path / "a.mycroft", ring_capacity=8)
    r = RingReader(str(f.path))
    f.publish(1)
    f.claim()  # a writer inside the fill (or dead there)
    f.publish(3)
    recs, cur, lost = r.read(0, 10)
    assert recs["op"]["op_id"].tolist() == [1] and cur == 1 and lost == 0
    recs, cur, lost = r.read(cur, 10, skip_unpublished=True)
    assert recs["op"]["op_id"].tolist() == [3] and cur == 3 and lost == 1
    batches = list(native.drain(r, 0))
    assert batches[0][1] == 1


def test_live_snapshot_skips_free_slots_and_marks_torn_ones(tmp_path):
    f = FakeRing(tmp_path / "a.mycroft", live_slots=4)
    r = RingReader(str(f.path))
    assert len(r.live()) == 0
    f.activate(0, op_id=10)
    f.activate(1, op_id=11, generation=3)  # odd: being initialised
    f.activate(3, op_id=13, n_flows=3)
    f.live[3]["flows"][1]["version"] = 5  # a writer frozen inside a flow update
    live = r.live()
    # slot 1 never leaves initialisation (a frozen writer): returned last, marked by an odd generation
    assert live["op"]["op_id"].tolist() == [10, 11, 13]
    assert (live["generation"] & 1).tolist() == [0, 1, 0]
    flows = native.valid_flows(live)
    assert [len(x) for x in flows] == [2, 2, 3]
    assert native.torn_flows(flows[2]).tolist() == [False, True, False]
    assert flows[2]["done"].tolist() == [1, 2, 3]


def test_close_while_another_thread_reads(tmp_path):
    # reads copy without the GIL: a close from another thread (the agent dropping an exited writer) must wait
    # for them, never unmap under them (this crashed the demo once: SIGSEGV in Reader::Live)
    import threading

    f = FakeRing(tmp_path / "c.mycroft")
    for _ in range(50):
        r = RingReader(str(f.path))
        stop = threading.Event()
        errors: list[str] = []

        def reads() -> None:
            while not stop.is_set():
                try:
                    r.live()
                    r.read(0, 64)
                    r.ring_head
                except Exception as e:  # noqa: BLE001 -- anything but "closed" fails the test below
                    errors.append(f"{type(e).__name__}: {e}")
                    return

        t = threading.Thread(target=reads)
        t.start()
        r.close()
        stop.set()
        t.join()
        assert all(e.startswith("ValueError") and "reader is closed" in e for e in errors), errors
        with pytest.raises(ValueError, match="reader is closed"):
            r.live()
