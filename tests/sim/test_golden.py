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


@pytest.mark.skipif(not FIXTURE.exists(), reason="no real NCCL capture yet (run scripts/gpu_check.sh on a GPU)")
def test_real_nccl_capture_matches_the_model():
    cap = json.loads(FIXTURE.read_text())
    assert not cap.get("dry_run"), "the fixture must come from a real GPU run"
    assert golden.compare(cap) == []
