"""``mycroft-otel grafana provision``: push datasources, dashboards and alert rules to a Grafana.

    mycroft-otel grafana provision --url http://grafana:3000 --token $GRAFANA_TOKEN
    mycroft-otel grafana provision --url http://localhost:3000 --user admin --password admin \\
        --prometheus-url http://prometheus:9090 --tempo-url http://tempo:3200
    mycroft-otel grafana provision --dry-run OUT_DIR       # write the request bodies, send nothing

Sources (payloads.py): collector_config/grafana-datasources.yaml, dashboards/*.json and
dashboards/grafana-alert-rules.yaml of this checkout, or the files given. Pushing (push.py) goes
through the ``grafana-client`` package (``pip install 'mycroft-otel[grafana]'``); it is
idempotent (looked up by uid: updated if present, created otherwise).

Exit status: 0 everything pushed; 1 some objects rejected (each named); 2 nothing pushed
(bad input files, Grafana unreachable, credentials refused, grafana-client missing).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from mycroft_otel.grafana import payloads


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    q = sub.add_parser("provision", help="push datasources, dashboards and alert rules (idempotent)",
                       description=__doc__.split("\n\n")[0])
    q.add_argument("--url", default=os.environ.get("GRAFANA_URL"),
                   help="Grafana base URL, e.g. http://grafana:3000 (default: $GRAFANA_URL)")
    auth = q.add_mutually_exclusive_group()
    auth.add_argument("--token", default=None, help="service account token (default: $GRAFANA_TOKEN)")
    auth.add_argument("--user", default=None, help="basic auth user (with --password)")
    q.add_argument("--password", default=None, help="basic auth password (default: $GRAFANA_PASSWORD)")
    q.add_argument("--datasources", type=Path, default=payloads.DEFAULT_DATASOURCES,
                   help="Grafana datasource provisioning YAML (default: collector_config/grafana-datasources.yaml)")
    q.add_argument("--dashboards", type=Path, default=payloads.DEFAULT_DASHBOARDS,
                   help="folder of dashboard JSON files (default: dashboards/)")
    q.add_argument("--alert-rules", type=Path, default=payloads.DEFAULT_ALERT_RULES,
                   help="Grafana alerting provisioning YAML (default: dashboards/grafana-alert-rules.yaml)")
    q.add_argument("--folder-uid", default=payloads.DEFAULT_FOLDER_UID,
                   help="folder for the dashboards and alert rules (default %(default)s)")
    q.add_argument("--prometheus-url", default=None, help="URL Grafana uses for Prometheus (replaces the file's)")
    q.add_argument("--tempo-url", default=None, help="URL Grafana uses for Tempo (replaces the file's)")
    q.add_argument("--jaeger-url", default=None, help="URL Grafana uses for Jaeger's query API (replaces the file's)")
    q.add_argument("--skip", nargs="+", default=[], choices=["datasources", "dashboards", "alerts"],
                   help="leave these out")
    q.add_argument("--timeout", type=float, default=10.0, help="seconds per HTTP request (default %(default)s)")
    q.add_argument("--dry-run", metavar="DIR", type=Path, default=None,
                   help="write the request bodies to DIR as JSON and send nothing")


def _err(msg: str) -> int:
    print(f"mycroft-otel grafana: {msg}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    if getattr(args, "action", None) != "provision":
        return _err("say what to do: mycroft-otel grafana provision --url URL [--token T | --user U --password P]")
    urls = {"prometheus": args.prometheus_url, "tempo": args.tempo_url, "jaeger": args.jaeger_url}
    try:
        p = payloads.build(
            datasources_file=None if "datasources" in args.skip else args.datasources,
            dashboards_dir=None if "dashboards" in args.skip else args.dashboards,
            alert_rules_file=None if "alerts" in args.skip else args.alert_rules,
            folder_uid=args.folder_uid, urls={k: v for k, v in urls.items() if v})
    except payloads.PayloadError as exc:
        return _err(str(exc))
    summary = (f"{len(p.datasources)} datasource(s), {len(p.dashboards)} dashboard(s), {len(p.rules)} alert "
               f"rule(s) in {len(p.rule_groups)} group(s)")
    if args.dry_run is not None:
        files = payloads.write(p, args.dry_run)
        print(f"mycroft-otel grafana: dry run: {summary} written to {args.dry_run} ({len(files)} files)",
              file=sys.stderr)
        return 0
    if not args.url:
        return _err("--url is required (or set GRAFANA_URL), e.g. --url http://localhost:3000")
    if args.password and not args.user:
        return _err("--password needs --user")
    from mycroft_otel.grafana.push import GrafanaError, connect, push

    token = args.token or (None if args.user else os.environ.get("GRAFANA_TOKEN"))
    password = args.password or os.environ.get("GRAFANA_PASSWORD")
    try:
        api = connect(args.url, token=token, user=args.user, password=password, timeout=args.timeout)
        print(f"mycroft-otel grafana: provisioning {args.url}: {summary}", file=sys.stderr)
        failures = push(api, p, args.url, log=lambda m: print(m, file=sys.stderr))
    except GrafanaError as exc:
        return _err(str(exc))
    if failures:
        print(f"mycroft-otel grafana: {len(failures)} object(s) not provisioned (see above)", file=sys.stderr)
        return 1
    print("mycroft-otel grafana: done", file=sys.stderr)
    return 0
