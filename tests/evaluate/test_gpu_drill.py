"""scripts/gpu_drill.sh --dry-run: the real-GPU fault drill's faults and scoring, on the simulator.

The same command the GPU run uses (one job per fault, real plugin, agent and processor, verdicts scored against
the injected truth); here the jobs are simulated. Runs about 2 minutes on 2 cores.
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
        # scored against the injected truth: detected, the right rank and category, and when
        assert r["detected"] and r["culprit_ok"] and r["category_ok"] and r["right"], (r["fault"], r["top"])
        assert 0 <= r["latency_s"] < 30
    assert doc["all_right"] and p.returncode == 0, p.stdout[-2000:]
    assert "overhead: needs a GPU" in p.stdout
