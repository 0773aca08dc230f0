"""Golden comparison with a real NCCL capture (scripts/gpu_check.sh), and the comparator on the simulator's own rings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mycroft_otel.sim import golden, runner

from _simtools import make_sim

FIXTURE = Path(__file__).parent / "fixtures" / "gpu_check.json"


def _capture_of(ring_dir) -> dict:
    """The same JSON shape gpu_check.py writes, from a ring directory."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", Path(__file__).parents[2] / "scripts" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return {"rings": mod.summarize_rings(Path(ring_dir), 64)}


def test_comparator_agrees_with_the_simulators_own_rings(tmp_path, plugin):
    sim = make_sim("nodes=4,gpus=1,tp=1,dp=4", steps=2)
    runner.run(sim, runner.RunConfig(ring_dir=str(tmp_path), plugin=plugin))
    try:
        cap = _capture_of(tmp_path)
    except (StopIteration, FileNotFoundError, AttributeError) as exc:
        pytest.skip(f"gpu_check.py's ring reader not available: {exc}")
    assert cap["rings"]
    assert golden.compare(cap) == []
    # and it does catch a wrong step count
    op = next(o for r in cap["rings"] for o in r["captured"] if o["func"] == "AllReduce")
    op["flows"][0]["n_steps"] += 1
    assert any("nSteps" in d for d in golden.compare(cap))


def _real_capture() -> tuple[dict, list[str]]:
    cap = json.loads(FIXTURE.read_text())
    assert not cap.get("dry_run"), "the fixture must come from a real GPU run"
    return cap, golden.compare(cap)


# tests/sim/fixtures/gpu_check.json: scripts/gpu_check.sh on an H200, torch 2.11, NCCL 2.28.9 (docs/gpu-check.md)
def test_real_nccl_capture_is_complete_and_consistent():
    cap, diffs = _real_capture()
    assert cap["nccl"].startswith("2.28") and {r["abi_version"] for r in cap["rings"]} == {5}
    for r in cap["rings"]:
        assert r["in_flight"] == 0 and r["overwritten"] == 0 and r["records"] == r["ops_completed"] > 0, r["file"]
        assert r["dropped"]["dropped_bad_descr"] == 0 and r["dropped"]["dropped_flows"] == 0, r["file"]
    # every completed flow's counters agree, every send has its receive on the same channel
    assert [d for d in diffs if "nSteps" not in d and "kernel channels" not in d] == []


def test_real_nccl_both_ends_of_a_connection_announce_the_same_steps():
    """The processor's step-mismatch rule (rca.step_mismatch) relies on it."""
    cap, _ = _real_capture()
    steps = {(ring["comm_hash"], op["kind"], op["seq"], ring["rank"], f["channel"], f["dir"], f["peer"]): f["n_steps"]
             for ring in cap["rings"] for op in ring["captured"] for f in op["flows"]}
    pairs = [(n, steps.get((c, k, s, p, ch, "recv", r)))
             for (c, k, s, r, ch, d, p), n in steps.items() if d == "send"]
    pairs = [(a, b) for a, b in pairs if b is not None]
    assert len(pairs) >= 500 and all(a == b for a, b in pairs)


def test_real_nccl_step_counts_match_the_model():
    """NCCL 2.28's SIMPLE ring proxies move each chunk as chunkSteps/sliceSteps = 2 slices: 12 steps per flow
    for a 4-rank AllReduce of 1 MiB on 2 channels, 6 for AllGather and ReduceScatter (engine.step_sizes)."""
    cap, diffs = _real_capture()
    assert [d for d in diffs if "nSteps" in d] == []
    steps = {(op["func"], f["n_steps"]) for r in cap["rings"] for op in r["captured"] for f in op["flows"]}
    assert steps == {("AllReduce", 12), ("AllGather", 6), ("ReduceScatter", 6)}


@pytest.mark.xfail(strict=True, reason="in 4 of the 256 captured real collectives one KernelCh stop never reached the "
                   "op, and each rank counted 2-4 bad handles: NCCL 2.28 (v5) stops KernelCh events from its proxy "
                   "thread; presumably a stop that comes after the op's proxy work completed it (docs/gpu-check.md)")
def test_real_nccl_every_kernel_channel_stops():
    cap, diffs = _real_capture()
    assert [d for d in diffs if "kernel channels" in d] == []
    assert all(r["dropped"]["dropped_bad_handle"] == 0 for r in cap["rings"])
