"""Virtual time: accelerated runs leave their exact simulated times in the rings; a VirtualJob delivers a job
up to the instant asked, the same bytes for a seed; the agent runs on the job's clock."""

from __future__ import annotations

import json
import subprocess
import sys


from mycroft_otel import semconv as sc
from mycroft_otel.agent.agent import Agent
from mycroft_otel.agent.settings import AgentSettings
from mycroft_otel.evaluate.virtual import MemoryTransport
from mycroft_otel.sim import runner
from mycroft_otel.sim.abi import COLL, OP_START
from mycroft_otel.sim.rows import cat_rows, sort_rows
from mycroft_otel.sim.virtual import VirtualJob

from _simtools import make_sim, read_rings

TOPO = "nodes=4,gpus=2,tp=2,dp=4"
REAL = 1_767_225_600_000_000_000
MS = 1_000_000


def test_accelerated_rings_hold_the_exact_simulated_times(tmp_path, plugin):
    # the rows of the same job (a seed gives the same job), as the runner hands them to the driver
    starts: dict[int, list[int]] = {}

    def sink(inst, res):
        if not res.blocks:
            return
        rows = sort_rows(cat_rows([b.rows for b in res.blocks]))
        sel = (rows["op"] == OP_START) & (rows["type"] == COLL)
        for c, t in zip(rows["ctx"][sel].tolist(), rows["t_ns"][sel].tolist()):
            starts.setdefault(c, []).append(t)

    make_sim(TOPO, None, steps=2).run(sink)
    sim = make_sim(TOPO, None, steps=2)
    res = runner.run(sim, runner.RunConfig(ring_dir=str(tmp_path), plugin=plugin, realtime_epoch_ns=REAL))
    epoch = res["epoch_mono_ns"]
    assert epoch == runner.VIRTUAL_MONO_EPOCH_NS and res["epoch_realtime_ns"] == REAL
    assert res["stats"]["max_late_ns"] == 0 and res["stats"]["errors"] == 0
    rings = read_rings(tmp_path)
    checked = 0
    for i, c in enumerate(sim.contexts):
        ctx = rings.get(sim.comms[c.kind][c.comm_index].name, c.comm_rank)
        assert ctx.header.start_mono_ns == epoch and ctx.header.start_realtime_ns == REAL
        ops = ctx.records[ctx.records["op"]["kind"] == 1]["op"]
        assert ops["start_ns"].tolist() == [epoch + t for t in starts.get(i, [])]
        assert (ops["end_ns"] > ops["launch_ns"]).all() and (ops["launch_ns"] >= ops["start_ns"]).all()
        assert ctx.header.heartbeat_ns > epoch
        checked += len(ops)
    assert checked > 50


def test_sim_command_reports_the_epochs_its_rings_use(tmp_path, plugin):
    r = subprocess.run([sys.executable, "-m", "mycroft_otel", "sim", "--no-progress", "--topology", TOPO,
                        "--fault", "late_rank:rank=3,delay_ms=50", "--steps", "3", "--ring-dir", str(tmp_path),
                        "--plugin", plugin], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    t = out["faults"][0]
    assert out["mode"] == "accelerated"
    assert t["onset_ns"] == out["epoch_realtime_ns"] + t["onset_sim_ns"]
    h = read_rings(tmp_path).get(t["comm_name"], t["culprit_ranks"][0]).header
    assert h.start_realtime_ns == out["epoch_realtime_ns"] and h.start_mono_ns == runner.VIRTUAL_MONO_EPOCH_NS


def _snapshot(ring_dir) -> dict:
    rings = read_rings(ring_dir)
    return {k: (v.records.tobytes(), v.live.tobytes(), v.header.heartbeat_ns) for k, v in rings.by_key.items()}


def _job(ring_dir, plugin, fault="rank_absent:rank=3,at=0.2", duration_s=3.0) -> VirtualJob:
    sim = make_sim(TOPO, fault, steps=None, duration_s=duration_s)
    return VirtualJob(sim, runner.RunConfig(ring_dir=str(ring_dir), plugin=plugin, realtime_epoch_ns=REAL))


def test_virtual_job_delivers_up_to_the_instant_and_the_same_bytes_for_a_seed(tmp_path, plugin):
    snaps = []
    for name in ("a", "b"):
        with _job(tmp_path / name, plugin) as job:
            job.advance_to(450 * MS)
            assert job.driver.time_ns == job.mono_ns() == runner.VIRTUAL_MONO_EPOCH_NS + 450 * MS
            assert job.realtime_ns() == REAL + 450 * MS
            rings = read_rings(tmp_path / name)
            limit = runner.VIRTUAL_MONO_EPOCH_NS + 450 * MS
            n_done = 0
            for ctx in rings.by_key.values():
                assert ctx.header.heartbeat_ns <= limit
                for arr in (ctx.records, ctx.live):
                    if len(arr):
                        assert (arr["op"]["start_ns"] <= limit).all()
                n_done += len(ctx.records)
                if len(ctx.records):
                    assert (ctx.records["op"]["end_ns"] <= limit).all()
            assert n_done > 0
            snaps.append(_snapshot(tmp_path / name))
            job.advance_to(100 * MS)  # time never goes back
            assert job.now_ns == 450 * MS
    assert snaps[0] == snaps[1]


def test_agent_runs_on_the_injected_clock(tmp_path, plugin):
    """In-flight snapshots come at the virtual instant the op's age passes MYCROFT_INFLIGHT_AFTER_MS, stamped
    with the job's virtual realtime (a real clock would read neither)."""
    job = _job(tmp_path / "rings", plugin, duration_s=4.0)
    transport = MemoryTransport()
    env = {"MYCROFT_INFLIGHT_AFTER_MS": "1000", "MYCROFT_POLL_MS": "100"}
    settings = AgentSettings.from_env(env, ring_dir=str(tmp_path / "rings"), state_dir=str(tmp_path / "state"))
    agent = Agent(settings, transport=transport, resource_extra=[], clock=job.mono_ns)
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    spans = []  # (poll realtime, span)
    try:
        for k in range(1, 36):
            job.advance_to(k * 100 * MS)
            with agent.queue.held():
                agent.poll_once()
            assert agent.queue.flush(10)
            for p in transport.take():
                req = ExportTraceServiceRequest.FromString(p)
                spans += [(job.realtime_ns(), s) for rs in req.resource_spans for ss in rs.scope_spans
                          for s in ss.spans]
    finally:
        agent.close(1.0)
        job.close()
    assert spans
    for _, s in spans:  # every timestamp is virtual: the job's realtime epoch plus at most 3.5 s
        assert REAL <= s.start_time_unix_nano <= s.end_time_unix_nano <= REAL + 3_500 * MS
    inflight = [(t, s) for t, s in spans if s.name == sc.INFLIGHT_SPAN]
    assert inflight, sorted({s.name for _, s in spans})
    for t, s in inflight:
        assert s.end_time_unix_nano == t  # snapshot taken at the poll's virtual instant
    t, first = min(inflight, key=lambda x: x[0])
    age = first.end_time_unix_nano - first.start_time_unix_nano
    assert 1000 * MS <= age < 1100 * MS  # the first poll after the threshold, on the job's clock
