"""Detection of mild sustained faults by the sequential slowdown test on synthetic collectives (tests/processor
/synth.py): an 8-rank, 2-channel ring, healthy spread like the H200 capture (sigma 0.15) or a loaded host
(0.6), the fault at rank 3 from collective 40. Prints, per fault, factor and spread: named right / runs,
wrong or early verdicts, and the median collectives from onset to verdict.

    PYTHONPATH=.:tests/processor python3 benchmarks/detector/sweep.py [seeds]
"""

from __future__ import annotations

import statistics
import sys

from test_detector import _run  # the same driver the tests use

SEEDS = int(sys.argv[1]) if len(sys.argv) > 1 else 10
print(f"{'fault':10} {'factor':>6} {'sigma':>5} {'named':>7} {'wrong':>5} {'median':>6}")
for sigma in (0.15, 0.6):
    healthy = sum(len(_run(None, 1.0, sigma, 1000 + s, total=300)) for s in range(SEEDS))
    print(f"{'healthy':10} {'-':>6} {sigma:5} {'-':>7} {healthy:5} {'-':>6}   ({SEEDS} x 300 collectives)")
    for fault in ("slow_gpu", "slow_flow", "slow_nic", "late_rank"):
        for factor in (1.25, 1.5, 2.0, 3.0):
            ok, wrong, lat = 0, 0, []
            for s in range(SEEDS):
                vs = _run(fault, factor, sigma, s, total=140)
                good = [v for v in vs if v[0] == fault and v[1] == [3] and v[3] >= 0]
                wrong += len(vs) - len(good)
                if good:
                    ok += 1
                    lat.append(good[0][3])
            med = statistics.median(lat) if lat else float("nan")
            print(f"{fault:10} {factor:6} {sigma:5} {ok:3}/{SEEDS:<3} {wrong:5} {med:6}", flush=True)
