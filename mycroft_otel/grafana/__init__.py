"""``mycroft-otel grafana provision``: push datasources, dashboards and alert rules to a Grafana.

    GRAFANA_TOKEN=... mycroft-otel grafana provision --url http://grafana:3000
    mycroft-otel grafana provision --url http://grafana:3000 --token-file /run/secrets/grafana-token
    GRAFANA_PASSWORD=... mycroft-otel grafana provision --url http://localhost:3000 --user admin \\
        --prometheus-url http://prometheus:9090 --tempo-url http://tempo:3200

Credentials come from the environment or from files, never from the command line (where ``ps``
shows them to every user of the machine): ``--token`` and ``--password`` still work but warn.
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
    auth.add_argument("--token-file", type=Path, default=None,
                      help="file holding a service account token (default: $GRAFANA_TOKEN)")
    auth.add_argument("--token", default=None, help=argparse.SUPPRESS)  # visible in ps: warns
    auth.add_argument("--user", default=None, help="basic auth user (password: $GRAFANA_PASSWORD or --password-file)")
    q.add_argument("--password-file", type=Path, default=None, help="file holding the basic auth password")
    q.add_argument("--password", default=None, help=argparse.SUPPRESS)  # visible in ps: warns
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


def _read_secret(path: Path | None) -> str | None:
    """The secret in a file (one line; surrounding whitespace dropped)."""
    return path.read_text().strip() or None if path is not None else None


def _err(msg: str) -> int:
    print(f"mycroft-otel grafana: {msg}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    if getattr(args, "action", None) != "provision":
        return _err("say what to do: mycroft-otel grafana provision --url URL (credentials: GRAFANA_TOKEN, "
                    "--token-file F, or --user U with GRAFANA_PASSWORD / --password-file F)")
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
    if (args.password or args.password_file) and not args.user:
        return _err("--password-file needs --user")
    for flag, given in (("--token", args.token), ("--password", args.password)):
        if given:
            print(f"mycroft-otel grafana: warning: {flag} on the command line is visible to every user of this "
                  f"machine (ps); use {'GRAFANA_TOKEN or --token-file' if flag == '--token' else 'GRAFANA_PASSWORD or --password-file'}",
                  file=sys.stderr)
    from mycroft_otel.grafana.push import GrafanaError, connect, push
    from mycroft_otel.redact import safe_url

    try:
        token = args.token or _read_secret(args.token_file) or (None if args.user else os.environ.get("GRAFANA_TOKEN"))
        password = args.password or _read_secret(args.password_file) or os.environ.get("GRAFANA_PASSWORD")
    except OSError as exc:
        return _err(f"cannot read {exc.filename}: {exc.strerror}")
    try:
        api = connect(args.url, token=token, user=args.user, password=password, timeout=args.timeout)
        print(f"mycroft-otel grafana: provisioning {safe_url(args.url)}: {summary}", file=sys.stderr)
        failures = push(api, p, args.url, log=lambda m: print(m, file=sys.stderr))
    except GrafanaError as exc:
        return _err(str(exc))
    if failures:
        print(f"mycroft-otel grafana: {len(failures)} object(s) not provisioned (see above)", file=sys.stderr)
        return 1
    print("mycroft-otel grafana: done", file=sys.stderr)
    return 0
