"""scripts/gpu_drill.sh --dry-run: the real-GPU fault drill's faults and scoring, on the simulator.

The same command the GPU run uses (one job per fault, real plugin, agent and processor, verdicts scored against
the injected truth); here the jobs are simulated. Runs about 2 minutes on 2 cores. Hang faults and the healthy
run must score right; slowdown rows are checked for consistent scoring only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXPECTED = {"healthy": ("", None), "sigstop": ("rank_absent", 2), "sigkill": ("process_exited", 1),
            "late_rank": ("late_rank", 3), "size_mismatch": ("coll_mismatch", 2), "slow_gpu": ("slow_gpu", 1)}
HANGS = ("sigstop", "sigkill", "size_mismatch")


def test_drill_dry_run_scores_every_fault(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=str(REPO))
    p = subprocess.run(["bash", str(REPO / "scripts" / "gpu_drill.sh"), "--dry-run", "--out", str(tmp_path)],
                       env=env, capture_output=True, text=True, timeout=400)
    doc = json.loads((tmp_path / "drill.json").read_text())
    table = (tmp_path / "drill.txt").read_text()
    assert doc["dry_run"] and [r["fault"] for r in doc["rows"]] == list(EXPECTED), p.stderr[-2000:]
    for r in doc["rows"]:
        category, culprit = EXPECTED[r["fault"]]
        assert r["components"] == {"processor": "ok", "agent": "ok"}, r
        assert not r["sim_error"], r
        assert r["expected"] == category and r["culprit_truth"] == culprit
        assert r["fault"] in table
        if not category:
            assert r["verdicts"] == 0 and r["right"], r
            continue
        assert r["truth"]["category"] == category and r["truth"]["culprit_global_ranks"] == [culprit]
        if r["fault"] in HANGS:
            # scored against the injected truth: detected, the right rank and category, within seconds
            assert r["detected"] and r["culprit_ok"] and r["category_ok"] and r["right"], (r["fault"], r["top"])
            assert 0 <= r["latency_s"] < 10
        else:
            # Slowdowns on a 4-rank ring are scored but not required: the slowdown detector (being rewritten)
            # names them in some runs only (docs/gpu-check.md). The score must still agree with the verdicts.
            assert r["right"] == bool(r["detected"] and r["culprit_ok"] and r["category_ok"])
            assert r["right"] or r["top"] in table or "no verdict" in table
    assert p.returncode == (0 if doc["all_right"] else 1), p.stdout[-2000:]
    assert "overhead: needs a GPU" in p.stdout
