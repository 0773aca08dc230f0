"""Score recorded eval scenarios offline (development tool): replay each recording, compare with its truth.

    python benchmarks/processor/replay_eval.py DIR [NAME ...]

DIR holds <scenario>.otlp recordings and <scenario>.json rows written by record_eval.py. Scoring
follows mycroft_otel.evaluate.harness: the first verdict after the onset counts, earlier ones are
false positives.
"""

from __future__ import annotations

import glob
import json
import os
import logging
import sys

from mycroft_otel.processor.replay import replay


def culprit_ok(v, t) -> bool:
    f = v.finding
    if f.global_ranks:
        return f.global_ranks[0] in set(t.get("culprit_global_ranks", []))
    if f.ranks and v.comm == t.get("comm_hash"):
        return f.ranks[0] in set(t.get("culprit_ranks", []))
    return bool(f.hosts) and f.hosts[0] in set(t.get("culprit_hosts", []))


def main() -> int:
    logging.disable(logging.WARNING)
    d = sys.argv[1]
    only = set(sys.argv[2:])
    ok = total = 0
    for path in sorted(glob.glob(os.path.join(d, "*.otlp"))):
        name = os.path.basename(path)[:-5]
        if only and name not in only:
            continue
        if not os.path.exists(os.path.join(d, name + ".json")):
            continue
        row = json.load(open(os.path.join(d, name + ".json")))
        t = row.get("truth") or {}
        _, vs = replay(path)
        onset = t.get("onset_ns") or 0
        healthy = t.get("fault", "healthy") == "healthy"
        early = [v for v in vs if v.detected_ns < onset] if not healthy else vs
        after = [v for v in vs if v.detected_ns >= onset] if not healthy else []
        if healthy:
            res = "OK" if not vs else f"FP x{len(vs)}"
            good = not vs
        else:
            first = after[0] if after else None
            good = bool(first and culprit_ok(first, t) and first.category == t.get("category"))
            res = (f"{'OK ' if good else 'BAD'} {first.category}@{first.finding.global_ranks or first.finding.ranks}"
                   f" +{(first.detected_ns - onset) / 1e9:.2f}s" if first else "BAD no verdict")
            res += f"  (want {t.get('category')}@g{t.get('culprit_global_ranks')}; early FPs {len(early)})"
        total += 1
        ok += good
        print(f"{name:16s} {res}")
        for v in (early + after)[:6]:
            print(f"      {(v.detected_ns - onset) / 1e9:+.2f}s {v.summary()[:200]}")
    print(f"{ok}/{total} right")
    return 0


if __name__ == "__main__":
    sys.exit(main())
