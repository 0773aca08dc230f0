"""A healthy 1,024-rank job on virtual time gets no verdict, at the default settings.

The job is benchmarks/stack_load's (nodes=128,gpus=8,tp=8,pp=16,dp=8: 3,072 plugin contexts, ~3 s training
steps, a 16-stage pipeline whose first stage waits for the others' forward and backward), run through the real
plugin, agent and processor on virtual time (evaluate/virtual.py) for ~10 training steps, with
``MYCROFT_STALL_MS`` at its default.

tests/e2e/test_load.py runs the same job in real time through the real stack and checks its plumbing. Its
verdicts are no accuracy measure: on 2 shared cores the simulator's 256 replay threads (a user and a proxy
thread per host) fall seconds behind each other, so the rings it leaves break causality (measured: ranks
completing AllReduce #33 of a DP ring 2 ms before a peer launched it, one host's proxy-thread rows 23 s late),
and the processor names what the rings show. On virtual time every callback lands at its simulated time
whatever the machine's load, so a verdict here is the detector's.
"""

from __future__ import annotations

import pytest

from mycroft_otel.evaluate import virtual
from mycroft_otel.evaluate.scenarios import Scenario
from mycroft_otel.processor.settings import Settings

pytestmark = pytest.mark.slow

SIM_S = 30.0


def test_healthy_1024_rank_job_gets_no_verdict_on_virtual_time(stack_load):
    sc = Scenario("healthy-1024", "healthy", topology=stack_load.TOPOLOGY, seed=5, duration_s=SIM_S)
    out = virtual.run_scenario(sc, int(Settings().stall_ms), model=stack_load.load_model(), ring_records=64)
    assert out.world == 1024 and out.events > 1_000_000, (out.world, out.events)
    assert out.agent_requests > 0
    seen = [(v.category, v.attrs.get("mycroft.rca.evidence")) for v in out.verdicts]
    assert out.verdicts == [], seen[:10]
