"""scripts/gpu_check.py without a GPU: the dry run exercises everything but the torch workers."""

from __future__ import annotations

import importlib.util
import json

import pytest

from native_support import ROOT, run_isolated


def test_gpu_check_dry_run(plugin_so, tmp_path):
    out = tmp_path / "out"
    p = run_isolated([str(ROOT / "scripts" / "gpu_check.py"), "--dry-run", "--out", str(out), "--plugin", plugin_so],
                     timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "profiler ABI NCCL picked: ncclProfiler_v7" in p.stdout
    cap = json.loads((out / "gpu_check.json").read_text())
    assert cap["dry_run"] and cap["problems"] == []
    rings = cap["rings"]
    assert sorted(r["global_rank"] for r in rings) == [0, 1, 2, 3]
    for r in rings:
        assert r["abi_version"] == 7 and r["records"] == 10 and r["by_func"] == {"AllReduce": 8, "send": 1, "recv": 1}
        first = r["captured"][0]
        assert first["func"] == "AllReduce" and len(first["flows"]) == 4
        assert all(f["done"] == f["n_steps"] == 6 for f in first["flows"])


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch present: that is the real check")
def test_gpu_check_without_torch_says_so(tmp_path):
    p = run_isolated([str(ROOT / "scripts" / "gpu_check.py"), "--out", str(tmp_path)], timeout=120)
    assert p.returncode == 2 and "PyTorch is not installed" in p.stderr
