"""Helpers for the simulator tests: run a small simulation through the real plugin and read its rings."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from mycroft_otel.sim.faults import parse_fault
from mycroft_otel.sim.model import TimingModel
from mycroft_otel.sim.simulation import Simulation
from mycroft_otel.sim.topology import parse_topology


def _plugin_or_skip() -> str:
    try:
        from mycroft_otel import _native

        del _native
        from mycroft_otel.sim.runner import find_plugin
        return find_plugin()
    except (ImportError, FileNotFoundError) as exc:
        pytest.skip(f"native build missing: {exc}")


@dataclass
class Ctx:
    header: object
    records: np.ndarray     # completed ops (ring), oldest first
    live: np.ndarray        # in-flight ops
    path: str = ""

    def flows(self, op) -> np.ndarray:
        return op["flows"][: int(op["op"]["n_flows"])]


@dataclass
class Rings:
    by_key: dict = field(default_factory=dict)   # (comm_name, comm rank) -> Ctx

    def get(self, comm_name: str, rank: int) -> Ctx:
        return self.by_key[(comm_name, rank)]

    def comm(self, comm_name: str) -> list[Ctx]:
        return [v for (c, _), v in sorted(self.by_key.items()) if c == comm_name]


def read_rings(ring_dir) -> Rings:
    from mycroft_otel import native

    out = Rings()
    for f in native.ring_files(ring_dir):
        r = native.open_ring(f)
        h = native.read_header(r)
        recs = [x[0] for x in native.drain(r)]
        records = np.concatenate(recs) if recs else np.zeros(0, dtype=native.RING_RECORD_DTYPE)
        out.by_key[(h.comm_name, h.rank)] = Ctx(h, records, r.live(), str(f))
        r.close()
    return out


def make_sim(topology: str, fault: str | None = None, steps: int = 2, seed: int = 1,
             model: TimingModel | None = None, **kw) -> Simulation:
    faults = [parse_fault(fault)] if fault else []
    return Simulation(parse_topology(topology), model, faults, seed=seed, steps=steps, **kw)
