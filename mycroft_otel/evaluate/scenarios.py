"""Eval scenarios: the built-in catalogue, or a YAML/JSON file with the same fields.

A scenario is a short real-time simulated job: ``topology``, ``fault`` (a ``--fault`` spec, or
``healthy``), ``seed``, ``duration_s`` and optional extra ``env`` for the agent and processor.
Hangs strike after a few seconds and run until the stall threshold plus ~5 s; slowdowns leave a
baseline of several steps and then keep the job slow for many more.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

TOPOLOGY = "nodes=4,gpus=2,tp=2,dp=4"


@dataclass
class Scenario:
    name: str
    fault: str = "healthy"
    topology: str = TOPOLOGY
    seed: int = 1
    duration_s: float = 12.0
    env: dict = field(default_factory=dict)

    @property
    def fault_name(self) -> str:
        return self.fault.split(":", 1)[0]


def builtin(stall_ms: int = 3000) -> list[Scenario]:
    hang = 3.0 + stall_ms / 1000 + 5.0          # onset ~3 s, then threshold + 5 s
    slow = 12.0                                  # ~10 baseline steps, then >= 20 slow ones
    return [
        Scenario("healthy-a", "healthy", seed=11, duration_s=12.0),
        Scenario("healthy-b", "healthy", seed=12, duration_s=12.0),
        Scenario("rank_absent", "rank_absent:rank=3,at=3", duration_s=hang),
        Scenario("process_exited", "process_exited:rank=5,at=3", duration_s=hang),
        Scenario("sigstop", "sigstop:rank=2,at=3", duration_s=hang),
        Scenario("gpu_stalled", "gpu_stalled:rank=6,at=3", duration_s=hang),
        Scenario("nic_down", "nic_down:rank=3,at=3", duration_s=hang),
        Scenario("flow_stall", "flow_stall:rank=4,at=3,channel=1", duration_s=hang),
        Scenario("coll_mismatch", "coll_mismatch:rank=7,at=3", duration_s=hang),
        Scenario("late_rank", "late_rank:rank=3,at=4,delay_ms=400", duration_s=slow),
        Scenario("slow_gpu", "slow_gpu:rank=5,at=4,factor=8", duration_s=slow),
        Scenario("slow_flow", "slow_flow:rank=2,at=4,channel=0,factor=8", duration_s=slow),
        Scenario("slow_nic", "slow_nic:rank=6,at=4,factor=8", duration_s=slow),
        Scenario("congestion", "congestion:rank=1,at=4,factor=8", duration_s=slow),
        Scenario("slow_proxy", "slow_proxy:rank=4,at=4,p=0.5", duration_s=slow),
    ]


def load(spec: str, stall_ms: int = 3000) -> list[Scenario]:
    """``builtin`` or a path to a .yaml/.yml/.json file: a list of scenarios or {"scenarios": [...]}."""
    if spec == "builtin":
        return builtin(stall_ms)
    path = Path(spec)
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(text)
    else:
        data = json.loads(text)
    if isinstance(data, dict):
        data = data.get("scenarios", [])
    out = []
    for i, d in enumerate(data):
        if not isinstance(d, dict) or "name" not in d:
            raise ValueError(f"{spec}: scenario #{i} needs at least a name")
        unknown = set(d) - {"name", "fault", "topology", "seed", "duration_s", "env"}
        if unknown:
            raise ValueError(f"{spec}: scenario {d['name']!r} has unknown keys {sorted(unknown)}")
        out.append(Scenario(**d))
    return out
