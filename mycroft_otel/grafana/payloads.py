"""What ``mycroft-otel grafana provision`` sends, built offline from the repository's files.

* datasources: collector_config/grafana-datasources.yaml (Grafana's provisioning format), URLs
  optionally replaced (the file's are docker-compose service names);
* dashboards: dashboards/*.json, wrapped for ``POST /api/dashboards/db`` (overwrite, in a folder);
* alert rules: dashboards/grafana-alert-rules.yaml (Grafana's alerting provisioning format),
  converted to the HTTP provisioning API's shape (``/api/v1/provisioning/alert-rules``,
  ``.../folder/{uid}/rule-groups/{group}``).

Everything here is plain data and validation; :mod:`mycroft_otel.grafana.push` talks to Grafana.
Every problem raises :class:`PayloadError` naming the file (and line, for JSON).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DATASOURCES = REPO / "collector_config" / "grafana-datasources.yaml"
DEFAULT_DASHBOARDS = REPO / "dashboards"
DEFAULT_ALERT_RULES = REPO / "dashboards" / "grafana-alert-rules.yaml"
DEFAULT_FOLDER_UID = "mycroft-otel"
EXPR_UID = "__expr__"   # Grafana's server-side expressions pseudo-datasource

_DURATION = re.compile(r"^(\d+(ms|s|m|h|d))+$")


class PayloadError(ValueError):
    """An input file is missing, unreadable or has the wrong shape."""


@dataclass
class Payloads:
    datasources: list[dict] = field(default_factory=list)
    folder: dict = field(default_factory=dict)         # {"uid", "title"}
    dashboards: list[dict] = field(default_factory=list)   # POST /api/dashboards/db bodies
    rule_groups: list[dict] = field(default_factory=list)  # AlertRuleGroup bodies (rules in API shape)

    @property
    def rules(self) -> list[dict]:
        return [r for g in self.rule_groups for r in g["rules"]]


def _yaml(path: Path) -> dict:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise PayloadError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PayloadError(f"{path}: invalid YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise PayloadError(f"{path}: expected a mapping at the top, found {type(doc).__name__}")
    return doc


def datasources(path: Path = DEFAULT_DATASOURCES, urls: dict[str, str] | None = None) -> list[dict]:
    """Datasource bodies for the HTTP API; ``urls`` maps a type (or uid) to a replacement URL."""
    doc = _yaml(path)
    items = doc.get("datasources")
    if not isinstance(items, list) or not items:
        raise PayloadError(f"{path}: no 'datasources' list")
    out = []
    for i, ds in enumerate(items):
        if not isinstance(ds, dict):
            raise PayloadError(f"{path}: datasources[{i}] is not a mapping")
        missing = [k for k in ("name", "uid", "type", "url") if not ds.get(k)]
        if missing:
            raise PayloadError(f"{path}: datasources[{i}] lacks {', '.join(missing)}")
        body = {k: v for k, v in ds.items() if k not in ("orgId", "version", "editable")}
        body.setdefault("access", "proxy")
        for key in (ds["uid"], ds["type"]):
            if urls and urls.get(key):
                body["url"] = urls[key]
        out.append(body)
    return out


def load_dashboard(path: Path) -> dict:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise PayloadError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PayloadError(f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    if not isinstance(d, dict):
        raise PayloadError(f"{path}: a dashboard is a JSON object, found {type(d).__name__}")
    if "dashboard" in d and isinstance(d["dashboard"], dict):   # an export wrapped for the API
        d = d["dashboard"]
    for k in ("uid", "title", "panels"):
        if k not in d:
            raise PayloadError(f"{path}: not a Grafana dashboard: no {k!r}")
    return d


def dashboards(folder: Path = DEFAULT_DASHBOARDS, folder_uid: str = DEFAULT_FOLDER_UID) -> list[dict]:
    files = sorted(Path(folder).glob("*.json"))
    if not files:
        raise PayloadError(f"{folder}: no dashboard (*.json) files")
    out, seen = [], {}
    for f in files:
        d = dict(load_dashboard(f))
        if d["uid"] in seen:
            raise PayloadError(f"{f}: dashboard uid {d['uid']!r} is also used by {seen[d['uid']]}")
        seen[d["uid"]] = f.name
        d["id"] = None     # match by uid, whatever id the target Grafana gave it
        out.append({"dashboard": d, "folderUid": folder_uid, "overwrite": True,
                    "message": "mycroft-otel grafana provision"})
    return out


def _seconds(duration: str, where: str) -> int:
    if not isinstance(duration, str) or not _DURATION.match(duration):
        raise PayloadError(f"{where}: bad duration {duration!r} (e.g. 30s, 1m)")
    mult = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    return int(sum(int(n) * mult[u] for n, u in re.findall(r"(\d+)(ms|s|m|h|d)", duration)))


def rule_groups(path: Path = DEFAULT_ALERT_RULES, folder_uid: str = DEFAULT_FOLDER_UID) -> tuple[list[dict], str]:
    """(AlertRuleGroup bodies, folder title) from a Grafana alerting provisioning file."""
    doc = _yaml(path)
    groups = doc.get("groups")
    if not isinstance(groups, list) or not groups:
        raise PayloadError(f"{path}: no 'groups' list")
    out, titles, uids = [], set(), set()
    for gi, g in enumerate(groups):
        where = f"{path}: groups[{gi}]"
        if not isinstance(g, dict) or not g.get("name") or not isinstance(g.get("rules"), list):
            raise PayloadError(f"{where}: needs 'name' and a 'rules' list")
        titles.add(str(g.get("folder") or "mycroft-otel"))
        interval = _seconds(str(g.get("interval", "1m")), f"{where} interval")
        rules = []
        for ri, r in enumerate(g["rules"]):
            rw = f"{where}.rules[{ri}]"
            if not isinstance(r, dict):
                raise PayloadError(f"{rw}: not a mapping")
            missing = [k for k in ("uid", "title", "condition", "data") if not r.get(k)]
            if missing:
                raise PayloadError(f"{rw}: lacks {', '.join(missing)}")
            if r["uid"] in uids:
                raise PayloadError(f"{rw}: duplicate uid {r['uid']!r}")
            uids.add(r["uid"])
            refs = []
            data = []
            for qi, q in enumerate(r["data"]):
                if not isinstance(q, dict) or not q.get("refId") or not q.get("datasourceUid") or \
                        not isinstance(q.get("model"), dict):
                    raise PayloadError(f"{rw}.data[{qi}]: needs refId, datasourceUid and a model")
                refs.append(q["refId"])
                rel = q.get("relativeTimeRange") or {"from": 0, "to": 0}
                data.append({"refId": q["refId"], "datasourceUid": q["datasourceUid"],
                             "relativeTimeRange": {"from": int(rel.get("from", 0)), "to": int(rel.get("to", 0))},
                             "queryType": q.get("queryType", ""), "model": dict(q["model"], refId=q["refId"])})
            if r["condition"] not in refs:
                raise PayloadError(f"{rw}: condition {r['condition']!r} is none of the refIds {refs}")
            for_ = str(r.get("for", "0s"))
            _seconds(for_, f"{rw} for")
            rules.append({
                "uid": r["uid"], "orgID": int(g.get("orgId", 1)), "folderUID": folder_uid, "ruleGroup": g["name"],
                "title": r["title"], "condition": r["condition"], "data": data,
                "noDataState": r.get("noDataState", "NoData"), "execErrState": r.get("execErrState", "Error"),
                "for": for_, "isPaused": bool(r.get("isPaused", False)),
                "labels": {str(k): str(v) for k, v in (r.get("labels") or {}).items()},
                "annotations": {str(k): str(v) for k, v in (r.get("annotations") or {}).items()},
            })
        out.append({"title": g["name"], "folderUid": folder_uid, "interval": interval, "rules": rules})
    if len(titles) > 1:
        raise PayloadError(f"{path}: groups name several folders {sorted(titles)}; use one")
    return out, titles.pop()


def build(datasources_file: Path | None = DEFAULT_DATASOURCES, dashboards_dir: Path | None = DEFAULT_DASHBOARDS,
          alert_rules_file: Path | None = DEFAULT_ALERT_RULES, folder_uid: str = DEFAULT_FOLDER_UID,
          urls: dict[str, str] | None = None) -> Payloads:
    """Everything to push; a None source is skipped."""
    p = Payloads()
    title = "mycroft-otel"
    if alert_rules_file is not None:
        p.rule_groups, title = rule_groups(Path(alert_rules_file), folder_uid)
    p.folder = {"uid": folder_uid, "title": title}
    if datasources_file is not None:
        p.datasources = datasources(Path(datasources_file), urls)
    if dashboards_dir is not None:
        p.dashboards = dashboards(Path(dashboards_dir), folder_uid)
    return p


def write(p: Payloads, out_dir: Path) -> list[Path]:
    """--dry-run: the request bodies as JSON files."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []

    def put(name, body):
        path = out_dir / name
        path.write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
        written.append(path)
    for ds in p.datasources:
        put(f"datasource-{ds['uid']}.json", ds)
    put("folder.json", p.folder)
    for d in p.dashboards:
        put(f"dashboard-{d['dashboard']['uid']}.json", d)
    for g in p.rule_groups:
        put(f"rule-group-{g['title']}.json", g)
    return written
