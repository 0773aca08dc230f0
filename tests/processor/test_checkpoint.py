"""A processor killed -9 and started again on its ``--state-dir`` (processor/checkpoint.py): recorded traffic
(tests/processor/testdata) replayed on virtual time, the processor killed at a chosen moment (nothing saved
since its last checkpoint, its traces lost) and a new one started on the same directory.

A slowdown whose evidence was gathering is still named, and sooner than by a processor that starts from nothing;
a verdict made before the kill is not made again (no second root-cause span, the page still open); a checkpoint
that is torn, of another version or other design constants, or holds anything but the history's own types is
ignored with a warning that says why, and the processor starts from nothing."""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
from pathlib import Path

import pytest

from mycroft_otel.processor import Processor
from mycroft_otel.processor import checkpoint as ck
from mycroft_otel.processor.published import PublishedVerdicts
from mycroft_otel.processor.receiver import read_records
from mycroft_otel.processor.replay import replay
from mycroft_otel.processor.settings import Settings
from synth import Ring

DATA = Path(__file__).parent / "testdata"


def _verdicts(name: str, state_dir: Path | None = None, kills: tuple[float, ...] = ()) -> tuple[Processor, list]:
    """(the last processor, [(category, culprit global ranks, seconds after the first payload)])"""
    path = str(DATA / f"{name}.otlp.gz")
    first = next(iter(read_records(path)))[0]
    logging.disable(logging.WARNING)
    try:
        proc, verdicts = replay(path, stall_ms=3000, state_dir=str(state_dir) if state_dir else None,
                                killed_at_s=kills)
    finally:
        logging.disable(logging.NOTSET)
    return proc, [(v.category, v.finding.global_ranks, (v.detected_ns - first) / 1e9) for v in verdicts]


@pytest.mark.parametrize("name", ["slow_gpu", "conf_tpdp_slow_nic"])
def test_a_slowdown_gathering_evidence_when_the_processor_is_killed_is_still_named(tmp_path, name):
    _, whole = _verdicts(name)
    (category, culprit, named_at), = whole
    killed_at = named_at - 0.5  # the evidence is past its half-way mark, the verdict not made yet
    _, restored = _verdicts(name, tmp_path, (killed_at,))
    _, relearned = _verdicts(name, None, (killed_at,))  # no state directory: started from nothing
    assert [(c, g) for c, g, _ in restored] == [(category, culprit)], restored
    # what the checkpoint is for: a processor that relearns the nulls names it later, or not at all
    assert not relearned or relearned[0][2] > restored[0][2], (restored, relearned)


@pytest.mark.parametrize("name", ["slow_gpu", "conf_tpdp_slow_nic", "nic_down"])
def test_a_verdict_made_before_the_kill_is_not_made_again_and_its_page_stays_open(tmp_path, name):
    _, whole = _verdicts(name)
    named_at = whole[0][2]
    proc, restored = _verdicts(name, tmp_path, (named_at + 0.3, named_at + 1.1))
    assert restored == whole[:1], restored
    assert list(proc.open_incidents.by_job), "the job's incident is open at the restarted processor"
    # this test's control: without the checkpoint the incident is named again, or its page is lost
    forgot, relearned = _verdicts(name, None, (named_at + 0.3, named_at + 1.1))
    assert len(relearned) > 1 or not forgot.open_incidents.by_job, relearned


def _saved(tmp_path: Path) -> bytes:
    """A processor's checkpoint after a short healthy replay."""
    d = tmp_path / "saved"
    proc, _ = _verdicts("healthy", d)
    proc.checkpoint.save(proc)
    return (d / ck.FILE).read_bytes()


def _framed(payload: bytes, version: int = ck.VERSION) -> bytes:
    return ck._HEADER.pack(ck.MAGIC, version, len(payload), hashlib.sha256(payload).digest()) + payload


class _Hostile:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _bad_files(tmp_path: Path) -> dict[str, tuple[bytes, str]]:
    good = _saved(tmp_path)
    payload = good[ck._HEADER.size:]
    state = pickle.loads(payload)
    other = dict(state, design=repr(Settings(null_size=256).design()))
    marker = tmp_path / "ran"
    return {
        "torn": (good[:len(good) // 2], "header says"),
        "flipped": (good[:-10] + bytes([good[-10] ^ 0xFF]) + good[-9:], "SHA-256"),
        "version": (_framed(payload, ck.VERSION + 1), f"format version {ck.VERSION + 1}"),
        "magic": (b"x" * len(good), "bad magic"),
        "design": (_framed(pickle.dumps(other)), "design constants"),
        "code": (_framed(pickle.dumps({"memory": _Hostile(str(marker))})), "system"),
        "shape": (_framed(pickle.dumps(dict(state, memory={"nulls": {"k": 1.0}}))), "memory table"),
    }


def test_a_bad_checkpoint_is_ignored_with_its_reason_and_the_processor_starts_from_nothing(tmp_path, caplog):
    for why, (data, said) in _bad_files(tmp_path).items():
        d = tmp_path / why
        d.mkdir(mode=0o700)
        (d / ck.FILE).write_bytes(data)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="mycroft_otel.processor"):
            proc = Processor(env={}, checkpoint=ck.Checkpoint(str(d)))
        warned = [r.getMessage() for r in caplog.records if "detector history ignored" in r.getMessage()]
        assert len(warned) == 1 and said in warned[0], (why, warned)
        assert not proc.detector.mem.nulls and not proc.open_incidents.by_job, why
    assert not (tmp_path / "ran").exists(), "the hostile pickle ran code"


def test_a_restored_processor_goes_on_from_the_same_history(tmp_path):
    data = _saved(tmp_path)
    d = tmp_path / "again"
    d.mkdir(mode=0o700)
    (d / ck.FILE).write_bytes(data)
    proc = Processor(env={}, checkpoint=ck.Checkpoint(str(d)))
    state = pickle.loads(data[ck._HEADER.size:])
    mem = proc.detector.mem
    assert mem.nulls and mem.nulls.keys() == state["memory"]["nulls"].keys()
    key = next(iter(mem.nulls))
    assert mem.nulls[key].location_scale() == state["memory"]["nulls"][key].location_scale()
    assert proc.baselines.samples.keys() == state["baselines"].keys()


def test_a_hang_named_before_the_restart_still_explains_the_waits_on_it(tmp_path):
    """A GPU stalled in a DP ring, its TP peers waiting for it: after a restart the agents re-send both
    collectives' snapshots. The DP collective is the hang named before (its verdict stands again, not sent
    twice); the TP one waits on it, as it did before the restart, instead of naming a rank absent."""
    dp = Ring(8, comm=0xD0, seq=40)
    dp.gpu_stall(3)
    tp = Ring(4, nch=1, comm=0x70, seq=90)
    tp.absent(3, "not_entered")  # TP rank 3 is the same process as DP rank 3 (global rank 3)
    for r, rv in tp.ranks.items():
        rv.global_rank, rv.host = r, dp.ranks[r].host

    def started() -> Processor:
        return Processor(env={}, published=PublishedVerdicts(str(tmp_path)),
                         checkpoint=ck.Checkpoint(str(tmp_path)))

    first = started()
    first.ingest_request(dp.request())
    assert [v.category for v in first.tick()] == ["gpu_stalled"]
    second = started()  # killed -9 after the verdict: its checkpoint was written with it
    second.ingest_request(tp.request())
    second.ingest_request(dp.request())
    assert second.tick() + second.tick() + second.tick() == []
    assert second.counts["already_published"] == 1 and second.counts["propagated"] == 1, second.counts


def test_a_collective_queued_behind_the_hang_named_before_the_restart_is_the_same_incident(tmp_path):
    """A NIC stops sending in a DP ring (collective 15); the ranks' CPUs have already enqueued collective 16, whose
    kernels wait on the stream behind 15. After a restart the agents' snapshots come back in any order: 16's,
    which alone look like a GPU that does nothing, before 15's. 16 is the hang named before, not a second one."""
    hung = Ring(4, comm=0xD1, seq=15)
    hung.net_send_stall(1, None)
    queued = Ring(4, comm=0xD1, seq=16)
    queued.gpu_stall(3)

    def started(state: Path) -> Processor:
        return Processor(env={}, published=PublishedVerdicts(str(state)), checkpoint=ck.Checkpoint(str(state)))

    alone = Processor(env={})  # what 16's evidence names on its own: a verdict the rule has to explain
    alone.ingest_request(queued.request())
    assert [v.category for v in alone.tick() + alone.tick()] == ["gpu_stalled"]
    first = started(tmp_path)
    first.ingest_request(hung.request())
    assert [v.category for v in first.tick()] == ["net_send_stalled"]
    second = started(tmp_path)  # killed -9 after the verdict: its checkpoint was written with it
    second.ingest_request(queued.request())
    assert second.tick() + second.tick() == []
    assert second.store.get(queued.tid.to_bytes(16, "big")).explained_by == hung.tid.to_bytes(16, "big")
    second.ingest_request(hung.request())
    assert second.tick() == [] and second.counts["already_published"] == 1, second.counts
