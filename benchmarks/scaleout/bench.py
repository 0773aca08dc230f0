"""Scale-out: do N processors behind the gateway give the verdicts of one? (issue 29, item 2)

    python benchmarks/scaleout/bench.py [--corpus SPEC] [--jobs 2] [--processors 2 4 8]

Every case of the corpus runs on virtual time (evaluate/virtual.py) once with one processor -- the
baseline, measured in the same run -- and then behind N processors, the agents' requests split among them
exactly as the gateway's load_balancing exporter splits them (evaluate/routing.py, checked against the
exporter's own Go code), for each routing key:

- ``job``: ``routing_key: attributes`` on ``mycroft.job.id``, what collector_config/gateway.yaml ships;
- ``shard``: the same gateway behind agents that shard jobs (``MYCROFT_SHARD_RANKS``, ``--shard-ranks``,
  default 8: two 4-GPU nodes, one 8-GPU node): each block of a job's global ranks reaches one processor, so a
  communicator that crosses blocks (DP, PP) is judged in parts -- what a shard boundary costs;
- ``trace``: ``routing_key: traceID``, the exporter's default and what the gateway shipped before.

Printed per configuration: cases whose verdicts are identical to the baseline's (the same categories,
culprits and trace ids at the same simulated times), cases named right, and the median latency in
collectives of the faulty communicator against the baseline's. Deterministic: virtual time, fixed seeds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace

from mycroft_otel.evaluate import corpus
from mycroft_otel.evaluate.routing import BY_JOB, BY_TRACE, by_shard

#: the default corpus: the LLM shapes, each slowdown at 2x in TP and DP, every hang, one seed
DEFAULT = replace(corpus.SIZES["llm"], name="scaleout", magnitudes=(2.0,), late_once_ms=(1500.0,),
                  topologies=("tp4dp4", "tp8dp2", "tp4pp2dp2"), healthy_seeds=())

#: the fields of a corpus row that are the verdicts (the rest is timing of the run itself)
VERDICT_FIELDS = ("top", "verdicts", "named_right", "false_verdicts", "latency_s", "right_latency_collectives")


def _median(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _per_shape(rows: list[dict], base: list[dict]) -> str:
    """Named right per shape, against the baseline's: where a routing loses what."""
    out = []
    for shape in dict.fromkeys(b["topology"] for b in base):
        got = sum(bool(r.get("named_right")) for r, b in zip(rows, base) if b["topology"] == shape)
        had = sum(bool(b["named_right"]) for b in base if b["topology"] == shape)
        out.append(f"{shape} {got}/{had}")
    return ", ".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=None, help="a corpus spec (named size or JSON file; default: see DEFAULT)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--processors", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--shard-ranks", type=int, default=8, help="the sharded agents' MYCROFT_SHARD_RANKS")
    args = ap.parse_args()
    spec = corpus.load_spec(args.corpus) if args.corpus else DEFAULT
    todo = corpus.cases(spec)
    print(f"corpus {spec.name}: {len(todo)} cases; {args.jobs} worker processes", flush=True)

    def run(n: int, routing) -> tuple[list[dict], float]:
        t0 = time.monotonic()
        rows = corpus.run_corpus(todo, 3000, jobs=args.jobs, processors=n, routing=routing)
        return rows, time.monotonic() - t0

    base, base_s = run(1, BY_JOB)
    failed = [r for r in base if "error" in r]
    if failed:
        print(f"baseline: {len(failed)} cases failed, e.g. {failed[0]['scenario']}: {failed[0]['error']}")
        return 1
    base_lat = _median([r["right_latency_collectives"] for r in base])
    print(f"\n{'routing':8} {'N':>2} {'identical':>10} {'named right':>12} {'median latency (coll.)':>23} "
          f"{'wall s':>7}   named right per shape / the baseline's")
    print(f"{'-':8} {1:>2} {'baseline':>10} {sum(r['named_right'] for r in base):>7}/{len(base):<4} "
          f"{base_lat!s:>23} {base_s:>7.0f}")
    job_identical = True
    for routing, name in ((BY_JOB, "job"), (by_shard(args.shard_ranks), f"shard {args.shard_ranks}"),
                          (BY_TRACE, "trace")):
        for n in args.processors:
            rows, wall = run(n, routing)
            same = sum(all(r.get(f) == b.get(f) for f in VERDICT_FIELDS) for r, b in zip(rows, base))
            lat = _median([r.get("right_latency_collectives") for r in rows])
            ratio = f" ({lat / base_lat:.2f}x)" if lat is not None and base_lat else ""
            print(f"{name:8} {n:>2} {same:>5}/{len(base):<4} {sum(r.get('named_right', False) for r in rows):>7}/"
                  f"{len(rows):<4} {str(lat) + ratio:>23} {wall:>7.0f}   {_per_shape(rows, base)}", flush=True)
            if routing is BY_JOB:
                job_identical &= same == len(base)
            if routing is not BY_TRACE:  # what the shipped routing changes, whole jobs or sharded
                for r, b in zip(rows, base):
                    if any(r.get(f) != b.get(f) for f in VERDICT_FIELDS):
                        print(f"   differs: {b['scenario']}: {b['top']} -> {r.get('top') or r.get('error')}")
    print(f"\nrouting by job id: verdicts of N processors {'identical to' if job_identical else 'DIFFER from'} "
          "one processor's")
    return 0 if job_identical else 1


if __name__ == "__main__":
    sys.exit(main())
