"""Replay a recording (``mycroft-otel processor --record FILE``) through a processor on virtual time.

``python -m mycroft_otel.processor.replay FILE [--stall-ms N] [--tail-s S]``: the payloads are
ingested in order at their recorded times and the detection timer ticks every 200 ms of recorded
time, so a replay gives the verdicts (and detection times) the live processor would have given,
in a fraction of the time. Used to develop and test the analysis on real pipeline traffic.
"""

from __future__ import annotations

import argparse
import sys

from mycroft_otel.processor.checkpoint import Checkpoint
from mycroft_otel.processor.pipeline import Processor
from mycroft_otel.processor.published import PublishedVerdicts
from mycroft_otel.processor.receiver import decode_export_request, read_records


class VirtualClock:
    def __init__(self, t_ns: int = 0):
        self.t_ns = t_ns

    def ns(self) -> int:
        return self.t_ns

    def mono(self) -> float:
        return self.t_ns / 1e9


def replay(path: str, env: dict | None = None, tick_s: float = 0.2, tail_s: float = 6.0,
           stall_ms: float | None = None, keep=None, metrics=None, state_dir: str | None = None,
           killed_at_s: tuple[float, ...] = ()) -> tuple[Processor, list]:
    """(processor, verdicts) after replaying ``path``; ``keep(trace_id) -> bool`` filters spans by trace;
    ``metrics``: a processor Metrics to count into. ``state_dir``: the processor's ``--state-dir``;
    ``killed_at_s``: recorded seconds (after the first payload) at which the processor is killed -9 (nothing
    saved, its traces lost) and a new one started on ``state_dir``."""
    clock = VirtualClock()

    def start() -> Processor:
        return Processor(env=env if env is not None else {}, clock_ns=clock.ns, mono_clock=clock.mono,
                         stall_ms=stall_ms, metrics=metrics,
                         published=PublishedVerdicts(state_dir) if state_dir else None,
                         checkpoint=Checkpoint(state_dir) if state_dir else None)

    proc = start()
    step = int(tick_s * 1e9)
    next_tick = None
    kills = sorted(killed_at_s)
    verdicts = []
    for t, ctype, data in read_records(path):
        if next_tick is None:
            next_tick = t
            kills = [t + int(k * 1e9) for k in kills]
        while next_tick <= t:
            if kills and kills[0] <= next_tick:  # (at the tick boundary the kill falls in)
                clock.t_ns = kills.pop(0)
                proc = start()
                continue
            clock.t_ns = next_tick
            verdicts += proc.tick()
            next_tick += step
        clock.t_ns = t
        try:
            req = decode_export_request(data, ctype)
        except Exception:  # noqa: BLE001 - a recording may hold the fuzz too
            continue
        if keep is not None:
            for rs in req.resource_spans:
                for ss in rs.scope_spans:
                    kept = [s for s in ss.spans if keep(bytes(s.trace_id))]
                    del ss.spans[:]
                    ss.spans.extend(kept)
        proc.ingest_request(req)
    if next_tick is not None:
        end = next_tick + int(tail_s * 1e9)
        while next_tick <= end:
            clock.t_ns = next_tick
            verdicts += proc.tick()
            next_tick += step
    return proc, verdicts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mycroft_otel.processor.replay", description=__doc__.split("\n")[0])
    p.add_argument("file")
    p.add_argument("--stall-ms", type=float, default=None)
    p.add_argument("--tail-s", type=float, default=6.0)
    args = p.parse_args(argv)
    _, verdicts = replay(args.file, tail_s=args.tail_s, stall_ms=args.stall_ms)
    for v in verdicts:
        lat = (v.detected_ns - v.finding.onset_ns) / 1e9 if v.finding.onset_ns else float("nan")
        print(f"[{v.detected_ns}] (+{lat:.2f}s after onset) {v.summary()}")
    if not verdicts:
        print("no verdict", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
