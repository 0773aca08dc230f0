"""A sharded job's world-size hang through the real gateway: named once, by the processor of the culprit's block.

benchmarks/stack_load/run.py (``hang``) does the work at 4,096 ranks in 4 blocks of 1,024 global ranks over 2
processors: the ranks' in-flight snapshots, each resource carrying its block (``mycroft.job.shard``) as agents with
``MYCROFT_SHARD_RANKS`` set it, sent once through otelcol-mycroft's load_balancing exporter, which routes on
(job id, shard). Checked: every span reaches a processor, one verdict names the stalled GPU, and the processor
without the culprit's block says why it is silent (``other_shard``). Its timings are the benchmark's to report.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.stack, pytest.mark.slow]


def test_a_world_size_hang_of_a_sharded_job_is_named_once(e2e_bin_dir, tmp_path, stack_load):
    res = stack_load.run_hang(tmp_path, ranks=4096, shard_ranks=1024, processors=2, bin_dir=e2e_bin_dir, log=print)
    assert res["errors"] == 0 and res["spans_received"] == res["spans"] == 4096, res
    assert res["verdicts"] == 1 and res["culprit_named"], res
    # the four blocks over two processors: at least one holds no block of the culprit's and stays silent, once
    # per processor that walked the hang to its blocks' edge
    assert res["other_shard"] >= 1, res
