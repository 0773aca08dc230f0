"""The report's heat map tells the verdict's story: every fault of the simulator's catalogue, run on virtual
time through the real plugin, agent and processor, rendered, and the verdict's heat map read back."""

from __future__ import annotations

import re
from collections import defaultdict

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from mycroft_otel.evaluate import scenarios, virtual
from mycroft_otel.report import render_report
from mycroft_otel.report.otlp_json import OtlpJsonWriter
from mycroft_otel.report.waits import NETWORK, PEER_GONE, ROOT_STATES
from mycroft_otel.sim.faults import CATALOGUE

STALL_MS = 3000
BUILTIN = {s.name: s for s in scenarios.builtin(STALL_MS)}
#: every catalogue fault the virtual clock can run (process faults need real processes to kill and stop)
FAULTS = [f for f, (_cat, _kind, _comm, needs_process) in CATALOGUE.items() if f != "healthy" and not needs_process]
#: the demo's shape (64 ranks, 8-rank DP rings), where a NIC fault leaves the culprit's ring neighbours with
#: RecvGpuWait flows beside the waits the walk follows
DEMO_SHAPE = scenarios.Scenario("nic_down@demo", "nic_down:rank=33,at=3", topology="nodes=8,gpus=8,tp=8,dp=8",
                                duration_s=11.0)
CELL = re.compile(r'<rect class="heat" data-rank="(\d+)" data-state="([^"]+)"[^>]*><title>([^<]*)</title>')


def scenario(fault: str) -> scenarios.Scenario:
    if fault == DEMO_SHAPE.name:
        return DEMO_SHAPE
    if fault in BUILTIN:
        return BUILTIN[fault]
    return scenarios.Scenario(fault, f"{fault}:rank=3,at=4", duration_s=12.0)


def rendered(fault: str, plugin: str, tmp_path) -> tuple[str, list]:
    """(report html, verdicts) of the fault's virtual run, drawn from the OTLP traffic the processor saw."""
    record: list[bytes] = []
    virtual.run_scenario(scenario(fault), STALL_MS, plugin=plugin, record=record)
    path = str(tmp_path / "run.jsonl")
    w = OtlpJsonWriter(path)
    for payload in record:
        req = ExportTraceServiceRequest()
        req.ParseFromString(payload)
        w.write_request(req)
    w.close()
    html, run, problems = render_report(path)
    assert problems == []
    return html, run.verdicts


def heat_cells(html: str, trace_id: str) -> dict[int, list[tuple[str, str]]]:
    sec = html[html.index(f'id="t-{trace_id}"'):]
    sec = sec[:sec.index("</section>")]
    out: dict[int, list[tuple[str, str]]] = defaultdict(list)
    for r, state, title in CELL.findall(sec):
        out[int(r)].append((state, title))
    return out


def contradicts(state: str, title: str, culprits: list[int]) -> bool:
    """A non-culprit cell that names a root elsewhere than the verdict: its own GPU, its own not entering,
    a network flow or a gone peer that does not touch the culprit."""
    names_culprit = any(re.search(rf"\brank {c}\b", title) for c in culprits)
    if state in (NETWORK, PEER_GONE):
        return not names_culprit
    return state in ROOT_STATES or state == "culprit"


@pytest.mark.parametrize("fault", FAULTS + [DEMO_SHAPE.name])
def test_heat_map_agrees_with_the_verdict(fault, plugin, tmp_path):
    html, verdicts = rendered(fault, plugin, tmp_path)
    kind = CATALOGUE[fault.split("@")[0]][1]
    named = [v for v in verdicts if v.kind == kind]
    assert named, f"{fault}: no {kind} verdict ({[v.category for v in verdicts]})"
    v = named[0]
    cells = heat_cells(html, v.span.trace_id)
    if kind == "hang":
        assert cells, f"{fault}: the hang's trace has no heat map"
    if not cells:
        return
    for r in v.ranks:
        if r in cells:   # a silent culprit has no row
            culprit = [title for state, title in cells[r] if state == "culprit"]
            assert culprit, f"{fault}: culprit rank {r} never painted as the culprit: {cells[r]}"
            assert all(f"{v.kind} {v.category}" in t for t in culprit), culprit
    wrong = {r: [(s, t) for s, t in row if contradicts(s, t, v.ranks)]
             for r, row in cells.items() if r not in v.ranks}
    assert not any(wrong.values()), f"{fault} ({v.category} at {v.ranks}): {wrong}"
    if fault.startswith("nic_down"):   # the finding of issue 33: no receiver blamed on its own GPU for a NIC fault
        assert not any(s == "own GPU" for row in cells.values() for s, _t in row)
