"""`mycroft-otel drill` on its own (no stack; tests/e2e/test_drill.py runs it beside a real agent until paged):
it writes a hung synthetic job's rings where it is told, says what it injected and what alert to expect, and
exits 1 naming the miss when Alertmanager holds no such alert."""

from __future__ import annotations

import re
import socket
import subprocess

from mycroft_otel.cli import command
from mycroft_otel.drill import _started_at, wait_for_alert


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


def test_drill_writes_rings_and_reports_a_missing_page(tmp_path):
    rings = tmp_path / "rings"
    res = subprocess.run(command("drill", "--ring-dir", str(rings), "--duration", "3", "--seed", "7",
                                 "--alertmanager", f"http://127.0.0.1:{_closed_port()}", "--wait", "1"),
                         capture_output=True, text=True, timeout=180)  # fmt: skip
    assert res.returncode == 1, res.stderr[-2000:]
    lines = res.stdout.splitlines()
    assert lines[0].startswith("injected  nic_down (net_send_stalled) at global rank ") and " on sim-node" in lines[0]
    job = re.search(r"job (mycroft-drill-\S+) ", res.stderr).group(1)
    culprit = lines[0].split(" at global rank ", 1)[1].split(" on ", 1)[0]
    assert lines[1] == (f'expect    MycroftRootCause {{job_id="{job}", kind="hang", category="net_send_stalled", '
                        f'culprit_ranks="{culprit.replace(", ", ",")}", severity="critical"}}')
    assert lines[2].startswith("NOT PAGED") and job in lines[2]
    # one ring per (process, communicator, rank) of the 8 simulated ranks, left for the agent to export
    files = sorted(p.name for p in rings.iterdir())
    assert len({f.split("-r")[-1] for f in files}) >= 4 and all(f.startswith("sim-node") for f in files), files
    assert "mycroft-drill-" in res.stderr


def test_drill_refuses_an_unknown_fault(tmp_path):
    res = subprocess.run(command("drill", "--ring-dir", str(tmp_path), "--fault", "gremlins"), capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2 and "unknown fault 'gremlins'" in res.stderr


def test_an_alert_older_than_the_drill_does_not_count(monkeypatch):
    """A drill repeating an earlier one's --job-id finds that one's page while its incident is open: only one
    that started after this drill counts."""
    from datetime import datetime, timedelta, timezone

    import mycroft_otel.drill as drill

    now = datetime.now(timezone.utc)
    old = {"labels": {"alertname": "MycroftRootCause"}, "startsAt": (now - timedelta(minutes=5)).isoformat()}
    new = {"labels": {"alertname": "MycroftRootCause"}, "startsAt": now.isoformat().replace("+00:00", "Z")}
    monkeypatch.setattr(drill, "alerts_of", lambda url, job: [old])
    assert wait_for_alert("http://am", "job-1", wait_s=0.0, since=now) is None
    monkeypatch.setattr(drill, "alerts_of", lambda url, job: [old, new])
    assert wait_for_alert("http://am", "job-1", wait_s=0.0, since=now) is new
    assert _started_at({"startsAt": "2026-12-03T22:25:57.187123456Z"}) == datetime(2026, 12, 3, 22, 25, 57, 187123,
                                                                                  tzinfo=timezone.utc)
