"""deploy/k8s: every manifest against the Kubernetes API schemas, the ConfigMaps against the shipped configs,
and the settings that must agree across files (processors, ports, ConfigMap names, selectors).

Schemas: kubernetes-validate (the JSON schemas of each Kubernetes release, offline), strict mode (an unknown
field is an error, as `kubectl apply --validate=strict` makes it), pinned to K8S_VERSION.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import kubernetes_validate  # test extra (pyproject.toml; scripts/install_deps.py test)
import yaml


ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
#: the oldest Kubernetes release the manifests target (kubernetes-validate ships its schemas)
K8S_VERSION = "1.31.0"
NAMESPACE = "mycroft"


def _load_generator():
    spec = importlib.util.spec_from_file_location("k8s_configmaps", K8S / "configmaps.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


configmaps = _load_generator()


def manifest_files() -> list[Path]:
    """Every Kubernetes manifest under deploy/k8s (the kustomization itself is kustomize's, not the API's)."""
    return sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml")


def documents(path: Path) -> Iterator[dict[str, Any]]:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc is not None:
            yield doc


def resources() -> list[dict[str, Any]]:
    """The resources `kubectl apply -k deploy/k8s` creates (those kustomization.yaml lists)."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    return [d for rel in kustomization["resources"] for d in documents(K8S / rel)]


def named(kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in resources() if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: str(p.relative_to(K8S)))
def test_manifest_is_valid_against_the_kubernetes_schema_strict(path):
    docs = list(documents(path))
    assert docs, f"{path} holds no resource"
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{path.relative_to(ROOT)}: {doc['kind']}/{doc['metadata'].get('name')}: {exc}")


def test_kustomization_lists_every_manifest_and_everything_is_in_one_namespace():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = {K8S / rel for rel in kustomization["resources"]}
    assert all(p.is_file() for p in listed), sorted(map(str, listed))
    # examples/ are fields for the training job's pods, applied with the job, not with the pipeline
    assert listed == {p for p in manifest_files() if p.parent == K8S}
    assert kustomization["namespace"] == NAMESPACE
    for doc in resources():
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == NAMESPACE, doc["metadata"]
    (ns,) = [d for d in resources() if d["kind"] == "Namespace"]
    assert ns["metadata"]["name"] == NAMESPACE


def test_configmaps_embed_the_shipped_configs_without_drift():
    res = subprocess.run([sys.executable, str(K8S / "configmaps.py"), "--check"], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    for name, files in configmaps.VERBATIM.items():
        data = named("ConfigMap", name)["data"]
        assert set(data) == set(files)
        for key, rel in files.items():
            assert data[key] == (ROOT / rel).read_text(), f"ConfigMap {name} key {key} differs from {rel}"
    # prometheus.yml: the shipped jobs, rules, intervals and alerting; only where the targets are differs
    shipped = yaml.safe_load((ROOT / "collector_config" / "prometheus.yml").read_text())
    ours = yaml.safe_load(named("ConfigMap", configmaps.PROMETHEUS_CONFIGMAP)["data"]["prometheus.yml"])
    for key in ("global", "rule_files", "alerting"):
        assert ours[key] == shipped[key], key
    assert [j["job_name"] for j in shipped["scrape_configs"]] == [j["job_name"] for j in ours["scrape_configs"]][
        :len(shipped["scrape_configs"])]


def _pod_specs() -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for doc in resources():
        if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet"):
            yield doc, doc["spec"]["template"]


def test_volumes_services_and_ports_refer_to_what_exists():
    maps = {d["metadata"]["name"]: d for d in resources() if d["kind"] == "ConfigMap"}
    for workload, template in _pod_specs():
        spec = template["spec"]
        for vol in spec.get("volumes", []):
            if "configMap" in vol:
                assert vol["configMap"]["name"] in maps, (workload["metadata"]["name"], vol)
        # a config file named on a command line is a key of the ConfigMap mounted at its directory
        mounts = {m["name"]: m["mountPath"] for c in spec["containers"] for m in c.get("volumeMounts", [])}
        for c in spec["containers"]:
            for arg in c.get("args", []):
                m = re.match(r"^--?config(?:\.file)?[= ]?(/\S+)$", arg)
                path = m.group(1) if m else (arg if arg.startswith("/etc/mycroft/") else None)
                if path is None:
                    continue
                vol = next(v for v in spec["volumes"] if mounts.get(v["name"]) == os.path.dirname(path))
                assert os.path.basename(path) in maps[vol["configMap"]["name"]]["data"], (c["name"], path)
        assert workload["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    ports = {}
    for workload, template in _pod_specs():
        for c in template["spec"]["containers"]:
            ports.setdefault(template["metadata"]["labels"]["app.kubernetes.io/name"], set()).update(
                p["name"] for p in c.get("ports", []))
    for svc in (d for d in resources() if d["kind"] == "Service"):
        sel = svc["spec"]["selector"]
        app = sel.get("app.kubernetes.io/name") or "mycroft-processor"  # per-pod Services select by pod name
        assert app in ports, svc["metadata"]["name"]
        for p in svc["spec"]["ports"]:
            assert p["targetPort"] in ports[app], (svc["metadata"]["name"], p)


def test_processors_gateway_routing_and_prometheus_agree():
    sts = named("StatefulSet", "mycroft-processor")
    replicas = sts["spec"]["replicas"]
    per_pod = sorted(d["metadata"]["name"] for d in resources() if d["kind"] == "Service"
                     and "statefulset.kubernetes.io/pod-name" in d["spec"]["selector"])  # fmt: skip
    assert per_pod == [f"mycroft-processor-{i}" for i in range(replicas)]
    gateway = named("Deployment", "otelcol-gateway")["spec"]["template"]["spec"]["containers"][0]
    processors = yaml.safe_load(env_of(gateway)["MYCROFT_PROCESSORS"])
    assert processors == [f"{name}:4317" for name in per_pod]
    assert env_of(gateway)["MYCROFT_TRACES_BACKEND"] == "jaeger:4317"
    prom = yaml.safe_load(named("ConfigMap", configmaps.PROMETHEUS_CONFIGMAP)["data"]["prometheus.yml"])
    (job,) = [j for j in prom["scrape_configs"] if j["job_name"] == "mycroft-processor"]
    assert job["static_configs"][0]["targets"] == configmaps.processor_targets(replicas)
    assert prom["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["alertmanager:9093"]
    # processors send verdicts to the root-cause port (stored, never analysed again); agents to the ingest port
    proc = env_of(sts["spec"]["template"]["spec"]["containers"][0])
    assert proc["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otelcol-gateway.mycroft.svc:4327"
    agent = named("DaemonSet", "mycroft-agent")["spec"]["template"]["spec"]
    assert env_of(agent["containers"][0])["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otelcol-gateway.mycroft.svc:4317"
    gw_ports = {p["port"] for p in named("Service", "otelcol-gateway")["spec"]["ports"]}
    assert {4317, 4327} <= gw_ports


def test_agent_shares_the_nodes_shm_and_pids_with_least_privilege():
    spec = named("DaemonSet", "mycroft-agent")["spec"]["template"]["spec"]
    assert spec["hostPID"] is True  # a ring's writer pid is the node's (docs/operating.md)
    (shm,) = [v for v in spec["volumes"] if v["name"] == "shm"]
    assert shm["hostPath"]["path"] == "/dev/shm"
    c = spec["containers"][0]
    assert {"name": "shm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    sc = c["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["DAC_OVERRIDE"]} and sc["allowPrivilegeEscalation"] is False
    assert c["args"][:1] == ["agent"]
    # the training pod example shares the same two things
    (pod,) = documents(K8S / "examples" / "training-pod.yaml")
    assert pod["spec"]["hostPID"] is True
    assert any(v.get("hostPath", {}).get("path") == "/dev/shm" for v in pod["spec"]["volumes"])


def test_kubernetes_prometheus_config_passes_promtool(tmp_path):
    """promtool on the ConfigMap's prometheus.yml with its rules; pod discovery checked against the manifests.

    Debian's Prometheus (scripts/install_prometheus.sh) is built without Kubernetes service discovery, so its
    promtool refuses kubernetes_sd_configs: promtool checks the config with each discovered job given a static
    target, and the discovery itself is checked here: its keep rules match pods and container ports that the
    workloads of deploy/k8s have."""
    from mycroft_otel.stack.runner import find_binary

    promtool = find_binary("promtool")
    if promtool is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("promtool not found (scripts/install_prometheus.sh)")
        pytest.skip("promtool not found (scripts/install_prometheus.sh)")
    prom = yaml.safe_load(named("ConfigMap", configmaps.PROMETHEUS_CONFIGMAP)["data"]["prometheus.yml"])
    ports: dict[str, set[str]] = {}
    for _, template in _pod_specs():
        ports.setdefault(template["metadata"]["labels"]["app.kubernetes.io/name"], set()).update(
            p["name"] for c in template["spec"]["containers"] for p in c.get("ports", []))
    discovered = 0
    for job in prom["scrape_configs"]:
        sd = job.pop("kubernetes_sd_configs", None)
        if sd is None:
            continue
        discovered += 1
        assert sd == [{"role": "pod", "namespaces": {"names": [NAMESPACE]}}], job["job_name"]
        keep = {tuple(r["source_labels"]): r["regex"] for r in job["relabel_configs"] if r.get("action") == "keep"}
        app = keep[("__meta_kubernetes_pod_label_app_kubernetes_io_name",)]
        assert keep[("__meta_kubernetes_pod_container_port_name",)] in ports[app], job["job_name"]
        job["static_configs"] = [{"targets": ["127.0.0.1:9"]}]
    assert discovered == 3  # the agents and the gateway replicas' two endpoints
    # the pod's layout: the config beside ../dashboards/alerts/ (prometheus.yaml's two mounts)
    conf = tmp_path / "collector_config" / "prometheus.yml"
    conf.parent.mkdir()
    conf.write_text(yaml.safe_dump(prom, sort_keys=False))
    rules = tmp_path / "dashboards" / "alerts"
    rules.mkdir(parents=True)
    for key, text in named("ConfigMap", "mycroft-alert-rules")["data"].items():
        (rules / key).write_text(text)
    res = subprocess.run([str(promtool), "check", "config", str(conf)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert re.search(r"SUCCESS: [1-9]\d* rules found", res.stdout + res.stderr), res.stdout + res.stderr


def test_only_processors_reach_the_root_cause_port_and_only_the_gateway_the_processors():
    """The root-cause receiver writes verdicts and pages: a NetworkPolicy admits only the processors there."""
    policy = named("NetworkPolicy", "otelcol-gateway")["spec"]
    assert policy["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "otelcol-gateway"}
    for rule in policy["ingress"]:
        ports = {p["port"] for p in rule["ports"]}
        if ports & {4327, 4328}:
            assert rule["from"] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "mycroft-processor"}}}]
    open_ports = {p["port"] for rule in policy["ingress"] if "from" not in rule for p in rule["ports"]}
    assert open_ports == {4317, 4318, 13133}
    served = {p["containerPort"] for p in named("Deployment", "otelcol-gateway")["spec"]["template"]["spec"][
        "containers"][0]["ports"]}
    assert {p["port"] for rule in policy["ingress"] for p in rule["ports"]} == served  # none forgotten
    processors = named("NetworkPolicy", "mycroft-processor")["spec"]
    (otlp,) = [r for r in processors["ingress"] if {p["port"] for p in r["ports"]} == {4317, 4318}]
    assert otlp["from"] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "otelcol-gateway"}}}]
