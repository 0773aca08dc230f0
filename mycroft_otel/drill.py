"""``mycroft-otel drill``: a simulated hang beside a node's real agent, to check that a page arrives.

The drill writes shared-memory rings for a small synthetic job (the simulator, ``mycroft-otel sim``,
driving the real plugin through NCCL's ABI) into the ring directory the node's agent watches. That
agent exports the job's spans to its ``OTEL_EXPORTER_OTLP_ENDPOINT`` like any other job's, so the
whole operator pipeline -- gateway, processors, trace store, Prometheus, Alertmanager -- sees a real
hang and should page. Nothing in the pipeline is told it is a drill: the job id starts with
``mycroft-drill-`` and the culprit host is a simulated ``sim-nodeNNN``, which is how the page shows it.

Run it where the agent runs, as the agent's user (the plugin refuses a ring directory another user
owns): on a node, ``mycroft-otel drill``; on Kubernetes, ``kubectl exec`` into the agent's pod.
With ``--alertmanager URL`` it then waits for Alertmanager to hold the ``MycroftRootCause`` alert of
the drill's job (the alert is one per job: dashboards/alerts/mycroft-rules.yaml) and exits 0 only if it
does::

    mycroft-otel drill                                              # rings into MYCROFT_RING_DIR
    mycroft-otel drill --alertmanager http://alertmanager:9093      # ... and wait for the page
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from datetime import datetime, timedelta, timezone
from typing import Any

from mycroft_otel import config
from mycroft_otel.cli import command

DEFAULT_FAULT = "nic_down"
# 8 ranks on 2 simulated hosts: small enough for any node's agent, and the DP communicator crosses
# hosts, so the hang is a network one (net_send_stalled) and the page names a host and a rank.
DEFAULT_TOPOLOGY = "nodes=2,gpus=4,tp=4,dp=2"
ALERT_NAME = "MycroftRootCause"
# Alertmanager stamps startsAt with Prometheus' clock, this host's may differ a little
CLOCK_SLACK = timedelta(seconds=30)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ring-dir", default=None,
                   help="the ring directory the node's agent watches (default MYCROFT_RING_DIR)")
    p.add_argument("--fault", default=DEFAULT_FAULT,
                   help="fault to inject, NAME[:k=v,...] as for `mycroft-otel sim` (default %(default)s: a hang, "
                        "which pages as critical)")
    p.add_argument("--at", type=float, default=2.0, help="seconds into the job the fault strikes (default 2)")
    p.add_argument("--duration", type=float, default=30.0,
                   help="seconds the synthetic job stays alive, hung; keep it above the processors' "
                        "MYCROFT_STALL_MS (default %(default)s)")
    p.add_argument("--topology", default=DEFAULT_TOPOLOGY, help="simulated job (default %(default)s)")
    p.add_argument("--seed", type=int, default=None,
                   help="picks the communicators' hashes and the victim rank (default: from the clock, so every "
                        "drill pages for a communicator of its own)")
    p.add_argument("--job-id", default=None,
                   help="job id of the synthetic job (default mycroft-drill-<host>-<UTC time>)")
    p.add_argument("--alertmanager", metavar="URL", default=None,
                   help="Alertmanager to ask for the drill's MycroftRootCause alert once the job ends")
    p.add_argument("--wait", type=float, default=120.0, metavar="S",
                   help="with --alertmanager: seconds to wait for the alert after the job ends (default 120: "
                        "the processor's stall threshold, Prometheus' scrape and rule intervals, Alertmanager's "
                        "group_wait)")


def run(args: argparse.Namespace) -> int:
    from mycroft_otel.sim.faults import FaultError, with_onset

    try:
        fault = with_onset(args.fault, args.at, healthy=False)
    except FaultError as exc:
        print(f"mycroft-otel drill: {exc}", file=sys.stderr)
        return 2
    ring_dir = args.ring_dir or config.get_str("MYCROFT_RING_DIR")
    # A job id and communicators of its own per drill (a seed from the clock): an earlier drill's page, still
    # open while its incident is, is another job's; with a repeated --job-id only an alert that started
    # after this drill began counts.
    seed = args.seed if args.seed is not None else int(time.time()) % 1_000_000
    started = datetime.now(timezone.utc)
    job_id = args.job_id or f"mycroft-drill-{socket.gethostname()}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    if not os.path.isdir(ring_dir):
        # the agent creates nothing; the plugin (here: the simulated ranks) creates the directory 0700
        print(f"mycroft-otel drill: {ring_dir} does not exist yet; an agent watching it will find the drill's "
              f"rings once they are created", file=sys.stderr)
    print(f"mycroft-otel drill: job {job_id} ({args.topology}), fault {fault}, {args.duration:g} s, "
          f"rings in {ring_dir}", file=sys.stderr)
    argv = command("sim", "--topology", args.topology, "--seed", str(seed), "--realtime",
                   "--duration", f"{args.duration:g}", "--ring-dir", ring_dir, "--job-id", job_id,
                   "--slow-steps", "--no-progress", "--fault", fault)
    sim = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, MYCROFT_RING_DIR=ring_dir))
    if sim.returncode != 0:
        print(f"mycroft-otel drill: the synthetic job failed (exit {sim.returncode}): {sim.stderr.strip()[-800:]}",
              file=sys.stderr)
        return 1
    try:
        truth = json.loads(sim.stdout)["faults"][0]
    except (ValueError, KeyError, IndexError) as exc:
        print(f"mycroft-otel drill: unreadable ground truth from the synthetic job: {exc}", file=sys.stderr)
        return 1
    severity = "critical" if truth["kind"] == "hang" else "warning"
    print(f"injected  {truth['fault']} ({truth['category']}) at global rank "
          f"{', '.join(map(str, truth['culprit_global_ranks']))} on {', '.join(truth['culprit_hosts'])}, "
          f"communicator {truth['comm_hash']}")
    print(f"expect    {ALERT_NAME} {{job_id=\"{job_id}\", kind=\"{truth['kind']}\", "
          f"category=\"{truth['category']}\", culprit_ranks=\"{','.join(map(str, truth['culprit_global_ranks']))}\", "
          f"severity=\"{severity}\"}}")
    if not args.alertmanager:
        return 0
    alert = wait_for_alert(args.alertmanager, job_id, args.wait, since=started)
    if alert is None:
        print(f"NOT PAGED  Alertmanager at {args.alertmanager} holds no {ALERT_NAME} for job {job_id} after "
              f"{args.wait:g} s: check the agent's export counters, the gateway, "
              f"the processors' mycroft_root_causes_total and Prometheus' alerts (docs/operating.md)")
        return 1
    labels = alert.get("labels", {})
    print(f"paged     {labels.get('alertname')} {labels.get('category')} severity={labels.get('severity')} "
          f"receivers={','.join(r.get('name', '') for r in alert.get('receivers', []))}: "
          f"{alert.get('annotations', {}).get('summary', '')}")
    return 0 if labels.get("category") == truth["category"] else 1


def alerts_of(alertmanager: str, job_id: str, timeout_s: float = 5.0) -> list[dict[str, Any]]:
    """Active ``MycroftRootCause`` alerts of one job, from Alertmanager's v2 API."""
    query = urllib.parse.urlencode([("filter", f'alertname="{ALERT_NAME}"'), ("filter", f'job_id="{job_id}"'),
                                    ("active", "true"), ("silenced", "false"), ("inhibited", "false")])
    url = alertmanager.rstrip("/") + "/api/v2/alerts?" + query
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 (an operator-given http(s) URL)
        return json.loads(resp.read())


def _started_at(alert: dict[str, Any]) -> datetime | None:
    try:  # RFC 3339 with a Z and up to nanoseconds: keep the microseconds fromisoformat reads
        stamp = re.sub(r"(\.\d{6})\d+", r"\1", alert["startsAt"]).replace("Z", "+00:00")
        return datetime.fromisoformat(stamp)
    except (KeyError, TypeError, ValueError):
        return None


def wait_for_alert(alertmanager: str, job_id: str, wait_s: float, since: datetime | None = None,
                   poll_s: float = 2.0) -> dict[str, Any] | None:
    """The first active, unsilenced alert of the job that started at or after ``since``, within ``wait_s``;
    None if none arrived."""
    deadline = time.monotonic() + wait_s
    last_error = ""
    while True:
        try:
            found = [a for a in alerts_of(alertmanager, job_id)
                     if since is None or (_started_at(a) or since) >= since - CLOCK_SLACK]
            if found:
                return found[0]
        except (OSError, ValueError) as exc:
            if str(exc) != last_error:
                print(f"mycroft-otel drill: asking {alertmanager}: {exc}", file=sys.stderr)
                last_error = str(exc)
        if time.monotonic() >= deadline:
            return None
        time.sleep(poll_s)
