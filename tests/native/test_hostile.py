"""Bad callbacks must neither crash nor block the plugin: each case runs in its own process with a timeout."""

from __future__ import annotations

import json
import time

import pytest

from native_support import HERE, run_isolated

CASES = ["null_handles", "after_stop", "after_finalize", "foreign_pxn", "garbage_parents", "cross_context",
         "out_of_range", "null_comm_name"]


def run_case(plugin_so, tmp_path, case, version, seed=0, timeout=60):
    ring_dir = tmp_path / "rings"
    p = run_isolated([str(HERE / "hostile.py"), case, plugin_so, str(ring_dir), str(version), str(seed)],
                     timeout=timeout)
    assert p.returncode == 0, f"{case} v{version}: rc={p.returncode} (negative = killed by a signal)\n{p.stderr[-3000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("version", [4, 7])
def test_hostile_case(plugin_so, tmp_path, case, version):
    out = run_case(plugin_so, tmp_path, case, version)
    h = out["hostile"]
    if case in ("null_handles", "out_of_range", "after_stop"):
        # the plugin still works after the abuse: the last, well-formed collective completed
        assert h["records"] >= 1 and h["completed_seqs"][-1] >= 0
    if case in ("null_handles", "after_stop", "garbage_parents"):
        assert h["dropped_bad_handle"] > 0
    if case == "foreign_pxn":
        assert h["pxn_foreign_ops"] >= 1
    if case == "after_finalize":
        assert h["finalized_ns"] > 0
    if case == "null_comm_name":
        assert "-" in out and out["-"]["records"] == 1


@pytest.mark.parametrize("version,seed", [(4, 1), (5, 2), (6, 3), (7, 4), (7, 5)])
def test_fuzzed_descriptors(plugin_so, tmp_path, version, seed):
    t0 = time.monotonic()
    out = run_case(plugin_so, tmp_path, "fuzz", version, seed=seed, timeout=120)
    h = out["hostile"]
    assert h["ops_started"] > 0 and h["dropped_bad_descr"] > 0 and h["dropped_bad_handle"] > 0, h
    assert time.monotonic() - t0 < 120
