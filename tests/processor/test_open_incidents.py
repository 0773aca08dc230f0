"""The open-incident gauges: one page per job, open while its evidence persists, closed on recovery.

A real Processor with a real Metrics registry is fed synthetic spans (synth.py); the incidents' clock is
virtual, so a 15-minute hang takes no time.
"""

from __future__ import annotations

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mycroft_otel.config import ConfigError
from mycroft_otel.processor.metrics import Metrics
from mycroft_otel.processor.open_incidents import runbook_link, trace_link
from mycroft_otel.processor.pipeline import Processor
from mycroft_otel.processor.settings import Settings
from synth import JOB, Ring


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _series(m: Metrics, name: str) -> list[dict]:
    return [dict(s.labels) for fam in text_string_to_metric_families(m.text()) for s in fam.samples
            if s.name == name and s.value == 1]


def _processor(quiet_s: float = 300.0):
    clock, metrics = Clock(), Metrics()
    proc = Processor(metrics=metrics, settle_s=0.2, incident_clock=clock,
                     settings=Settings(incident_quiet_s=quiet_s, trace_ui_url="http://jaeger:16686",
                                       runbook_url="http://p0:9464/runbook"))
    return proc, metrics, clock


def _hang(proc: Processor, ring: Ring) -> None:
    proc.ingest_request(ring.request())
    vs = proc.tick(time.time_ns())
    if not vs:  # the processor waits for late evidence once
        time.sleep(0.25)
        vs = proc.tick(time.time_ns())
    assert [v.kind for v in vs] == ["hang"], [v.summary() for v in vs]


def _still_hung(proc: Processor, ring: Ring, clock: Clock, minutes: float, every_s: float = 10.0) -> None:
    """The hung ranks keep sending snapshots (the agent's MYCROFT_SNAPSHOT_MS) while virtual time passes."""
    for _ in range(int(minutes * 60 / every_s)):
        clock.t += every_s
        for rv in ring.ranks.values():
            if rv.kind == "inflight":
                rv.snapshot += 1
        proc.ingest_request(ring.request())
        proc.tick(time.time_ns())


def test_a_hang_pages_in_global_ranks_and_hosts_with_a_trace_link():
    proc, m, _ = _processor()
    ring = Ring(8, global_base=16)
    ring.gpu_stall(3)
    _hang(proc, ring)
    assert _series(m, "mycroft_incidents_open") == [
        {"job_id": JOB, "kind": "hang", "category": "gpu_stalled", "culprit_ranks": "19", "culprit_hosts": "node-3"}]
    info, = _series(m, "mycroft_incident_info")
    tid = ring.tid.to_bytes(16, "big").hex()
    assert info["trace_id"] == tid and info["trace_url"] == f"http://jaeger:16686/trace/{tid}"
    assert info["runbook_url"] == "http://p0:9464/runbook#gpu_stalled"
    assert info["evidence"] and info["comm"]


def test_a_hang_stays_open_for_15_minutes_while_the_job_is_hung_and_closes_when_it_completes():
    proc, m, clock = _processor(quiet_s=300)
    ring = Ring(8, global_base=16)
    ring.gpu_stall(3)
    _hang(proc, ring)
    _still_hung(proc, ring, clock, minutes=15)
    assert len(_series(m, "mycroft_incidents_open")) == 1  # 15 minutes, quiet window 5: still the page
    # the fault clears: every rank completes the hung collective
    end = time.time_ns()
    for rv in ring.ranks.values():
        rv.kind, rv.end, rv.last_progress = "op", end, end
        for f in rv.flows:
            f.ready = f.transmitted = f.done = f.steps
            f.end = f.last = end
    proc.ingest_request(ring.request())
    assert _series(m, "mycroft_incidents_open") == [] and _series(m, "mycroft_incident_info") == []
    assert proc.open_incidents.closed == 1


def test_a_restarted_job_closes_the_hang_when_the_culprit_runs_in_a_new_communicator():
    proc, m, clock = _processor()
    ring = Ring(8, global_base=16)
    ring.gpu_stall(3)
    _hang(proc, ring)
    clock.t += 60
    # torchrun restarts the job under the same job id: same hosts and global ranks, new communicators
    old_tid = ring.tid
    fresh = Ring(8, comm=0x1234, seq=1, global_base=16, t0=time.time_ns())
    proc.ingest_request(fresh.request(ranks=[5]))  # another rank first: not the culprit
    assert len(_series(m, "mycroft_incidents_open")) == 1
    proc.ingest_request(fresh.request(ranks=[3]))
    assert _series(m, "mycroft_incidents_open") == [], old_tid


def test_a_job_that_went_silent_closes_after_the_quiet_window_and_not_before():
    proc, m, clock = _processor(quiet_s=300)
    ring = Ring(8, global_base=16)
    ring.gpu_stall(3)
    _hang(proc, ring)
    clock.t += 299
    proc.tick(time.time_ns())
    assert len(_series(m, "mycroft_incidents_open")) == 1
    clock.t += 2
    proc.tick(time.time_ns())
    assert _series(m, "mycroft_incidents_open") == []


def test_a_second_verdict_of_the_job_joins_its_page():
    proc, m, _ = _processor()
    first = Ring(8, global_base=16)
    first.gpu_stall(3)
    _hang(proc, first)
    other = Ring(8, comm=0xBEEF, global_base=32)  # another communicator of the job, another culprit
    other.gpu_stall(5)
    _hang(proc, other)
    assert len(proc.verdicts) == 2
    page, = _series(m, "mycroft_incidents_open")
    assert page["culprit_ranks"] == "19"  # the first hang stays the face
    assert len(proc.open_incidents.by_job[JOB].members) == 2


def test_jobs_page_separately():
    proc, m, _ = _processor()
    a = Ring(8, global_base=0, job="job-a")
    a.gpu_stall(1)
    _hang(proc, a)
    b = Ring(8, global_base=0, job="job-b")
    b.gpu_stall(2)
    _hang(proc, b)
    assert sorted(s["job_id"] for s in _series(m, "mycroft_incidents_open")) == ["job-a", "job-b"]


@pytest.mark.parametrize("template, want", [
    ("", ""),
    ("http://jaeger:16686", "http://jaeger:16686/trace/ab12"),
    ("http://jaeger:16686/", "http://jaeger:16686/trace/ab12"),
    ('https://g/explore?left={"queries":[{"query":"{trace_id}"}]}', 'https://g/explore?left={"queries":[{"query":"ab12"}]}'),
])
def test_trace_link(template, want):
    assert trace_link(template, "ab12") == want


def test_a_trace_ui_url_that_is_not_http_is_named():
    with pytest.raises(ConfigError, match="MYCROFT_TRACE_UI_URL"):
        Settings.from_env({"MYCROFT_TRACE_UI_URL": "jaeger:16686"})


@pytest.mark.parametrize("base, want", [
    ("", ""),
    ("https://wiki.example/mycroft/runbook", "https://wiki.example/mycroft/runbook#slow_nic"),
    ("http://p0:9464/runbook#top", "http://p0:9464/runbook#slow_nic"),  # the category's section, not another
])
def test_runbook_link(base, want):
    assert runbook_link(base, "slow_nic") == want


def test_a_runbook_url_that_is_not_http_is_named():
    assert Settings.from_env({"MYCROFT_RUNBOOK_URL": "https://wiki.example/rb"}).runbook_url == "https://wiki.example/rb"
    with pytest.raises(ConfigError, match="MYCROFT_RUNBOOK_URL"):
        Settings.from_env({"MYCROFT_RUNBOOK_URL": "wiki.example/rb"})


# -- the incident table alone (no analysis): slowdowns, faces -------------------------------------------

class _Sink:
    def __init__(self) -> None:
        self.shown: dict[str, tuple] = {}

    def incident_shown(self, inc, face, links) -> None:
        self.shown[inc.job] = (face.kind, face.category, face.culprit_label(), links.trace_url)

    def incident_closed(self, job: str) -> None:
        del self.shown[job]


def _verdict(kind: str, category: str, tid: int, global_ranks=(5,), job: str = "j"):
    from types import SimpleNamespace
    f = SimpleNamespace(kind=kind, category=category, job=job, global_ranks=list(global_ranks), ranks=[1],
                        hosts=["h1"], evidence="e", confidence=0.9)
    return SimpleNamespace(finding=f, trace_id=tid.to_bytes(16, "big"), comm="c", seq=3, detected_ns=10)


def _table(quiet_s: float = 300.0):
    from mycroft_otel.processor.open_incidents import OpenIncidents
    from mycroft_otel.processor.state import TraceStore
    clock, sink = Clock(), _Sink()
    return OpenIncidents(TraceStore(), quiet_s, trace_ui_url="http://ui", sink=sink, clock=clock), sink, clock


def test_a_slowdown_closes_when_nothing_of_it_is_seen_for_the_quiet_window():
    table, sink, clock = _table(quiet_s=300)
    table.verdict(_verdict("slowdown", "slow_nic", 1))
    for _ in range(5):  # findings attributed to it keep it open past the window
        clock.t += 200
        table.by_job["j"].heard = clock.t  # the job's spans keep coming
        table.touch((1).to_bytes(16, "big"))
        table.expire()
    assert sink.shown["j"][:3] == ("slowdown", "slow_nic", "5")
    clock.t += 301
    table.by_job["j"].heard = clock.t  # the job still sends: it is the slowdown's quiet that ends it
    table.expire()
    assert sink.shown == {} and table.closed == 1


def test_a_hang_takes_the_page_over_from_a_slowdown_and_hands_it_back_when_it_ends():
    table, sink, clock = _table()
    table.verdict(_verdict("slowdown", "slow_gpu", 1, (5,)))
    clock.t += 1
    table.verdict(_verdict("hang", "gpu_stalled", 2, (7,)))
    assert sink.shown["j"] == ("hang", "gpu_stalled", "7", "http://ui/trace/" + (2).to_bytes(16, "big").hex())
    hang = next(m for m in table.by_job["j"].members if m.kind == "hang")
    hang.closed = True
    table._settle(table.by_job["j"])
    assert sink.shown["j"][:3] == ("slowdown", "slow_gpu", "5")


def test_no_more_than_max_open_incidents():
    from mycroft_otel.processor import open_incidents
    table, sink, _ = _table()
    for i in range(open_incidents.MAX_OPEN + 3):
        table.verdict(_verdict("hang", "rank_absent", i + 1, job=f"job-{i}"))
    assert len(sink.shown) == open_incidents.MAX_OPEN and table.refused == 3
