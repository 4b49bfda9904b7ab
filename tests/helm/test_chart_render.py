"""The chart rendered by the real helm: lint and template for every ci scenario, every object valid for Kubernetes
1.30 (strict), the Role exactly what the deployer's code calls, the rules accepted by promtool, the values schema
closed and strict, the container's flags ones `sits-control` really takes."""
from __future__ import annotations

import json
import re
import subprocess
from dataclasses import fields
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from sits.control_plane.analysis import Policy
from tests.fixtures.prometheus import PROMTOOL_BIN
from tests.helm.support import (CHART, CRD_API, DEPLOYER_API, MONITORING_KINDS, ROOT, SCENARIOS, by_kind,
                                crd_watch_permissions, deployer_permissions, helm, render, role_permissions)

K8S_VERSION = "1.30.0"


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("helm-home")


def test_scenarios_exist():
    assert SCENARIOS == ["default-values.yaml", "existing-secret-values.yaml", "kubernetes-prometheus-values.yaml",
                         "monitoring-values.yaml"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_lint(home, scenario):
    r = helm("lint", "--strict", str(CHART), "-f", str(CHART / "ci" / scenario), home=home)
    assert "0 chart(s) failed" in r.stdout


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_template_is_valid_kubernetes(home, scenario):
    docs = render(home, scenario)
    kinds = sorted(d["kind"] for d in docs)
    for d in docs:
        if d["kind"] in MONITORING_KINDS:   # CRDs: no bundled schema; checked below and by promtool
            assert d["apiVersion"] == "monitoring.coreos.com/v1" and d["spec"]
            continue
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)
    assert {"Deployment", "Service", "ServiceAccount", "ConfigMap"} <= set(kinds)
    assert kinds.count("ConfigMap") == 4   # settings + 3 dashboards
    expected_monitoring = set(MONITORING_KINDS) if scenario == "monitoring-values.yaml" else set()
    assert set(kinds) & set(MONITORING_KINDS) == expected_monitoring
    assert ("Ingress" in kinds) == (scenario == "monitoring-values.yaml")
    assert ("PersistentVolumeClaim" in kinds) == (scenario == "kubernetes-prometheus-values.yaml")
    secrets = {d["metadata"]["name"] for d in by_kind(docs, "Secret")}
    assert ("rel-sits-control-auth" in secrets) == (scenario != "existing-secret-values.yaml")
    assert ("rel-sits-control-prometheus" in secrets) == (scenario == "kubernetes-prometheus-values.yaml")
    assert "rel-sits-control-session" in secrets
    assert [d["metadata"]["name"] for d in by_kind(docs, "NetworkPolicy")] == ["rel-sits-control"]   # on by default


def test_the_kernelrollout_crd_is_shipped_valid_and_watched(home):
    docs = render(home, None, "--include-crds")
    crd = by_kind(docs, "CustomResourceDefinition")
    assert [c["metadata"]["name"] for c in crd] == ["kernelrollouts.sits.dev"]
    kubernetes_validate.validate(crd[0], K8S_VERSION, strict=True)
    version = crd[0]["spec"]["versions"][0]
    assert crd[0]["spec"]["names"]["shortNames"] == ["kr"] and crd[0]["spec"]["scope"] == "Namespaced"
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == ["Service", "Kernels", "Phase", "Weight",
                                                                         "Verdict", "Age"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert {"service", "kernels", "productionKernels", "model", "replicas", "gpus", "tensorParallelSize", "image",
            "args", "policy", "paused"} == set(spec)
    # every Policy field has a place in the schema (the rest of the policy is open, checked by the control plane)
    assert {f.name for f in fields(Policy)} == set(spec["policy"]["properties"])
    # the control plane watches them with the Kubernetes deployer, not with the local one
    args = by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--watch-crds" in args
    local = by_kind(render(home, None, "--set", "deployer.type=local"), "Deployment")[0]
    assert "--watch-crds" not in local["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not by_kind(render(home), "CustomResourceDefinition")   # plain `helm template` leaves crds/ out


def test_monitoring_needs_the_crds(home):
    """Without monitoring.coreos.com/v1 served, the monitors and rules are left out (an install must not fail)."""
    kinds = {d["kind"] for d in render(home, "monitoring-values.yaml", monitoring=False)}
    assert not kinds & set(MONITORING_KINDS) and "Ingress" in kinds


def test_deployment_security_probes_and_store(home):
    dep = by_kind(render(home), "Deployment")[0]
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz" and c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # a slow start is waited for by the startup probe, not killed by liveness (3 min by default)
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 180
    assert c["resources"]["requests"] and c["resources"]["limits"]
    assert c["args"][1:6] == ["serve", "--host=0.0.0.0", "--port=8080", "--store=/data/sits.db",
                              "--auth-file=/etc/sits/auth/auth.yaml"]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert {"/data", "/etc/sits/auth", "/etc/sits/config", "/tmp"} <= set(mounts)   # the rest is read-only
    vols = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in vols["data"] and vols["auth"]["secret"]["items"] == [{"key": "auth.yaml",
                                                                               "path": "auth.yaml"}]


SERVE_ONLY = ("--host", "--port", "--auth-file", "--secure-cookies")


def _expand(args: list[str], env: dict[str, str]) -> list[str]:
    """The kubelet's $(VAR) expansion of container args."""
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in args]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_container_flags_are_the_clis(home, scenario):
    """After the kubelet's $(VAR) expansion from the ConfigMap, every deployer/metrics flag parses with today's
    `sits-control worker` (serve's own --host/--port/--auth-file aside) and no secret value is on the command line."""
    from sits.control_plane.cli.main import build_parser
    docs = render(home, scenario)
    cm = next(d for d in by_kind(docs, "ConfigMap") if "SITS_DEPLOYER" in d["data"])
    c = by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    assert c["envFrom"] == [{"configMapRef": {"name": cm["metadata"]["name"]}}]
    args = _expand(c["args"], cm["data"])
    assert args[1] == "serve"
    parser = build_parser()
    commands = next(x for x in parser._actions if x.dest == "cmd").choices
    cli = args
    if "serve" not in commands:   # before the service lands: its deployer/metrics flags are the worker's
        cli = [args[0], "worker"] + [a for a in args[2:] if a.split("=")[0] not in SERVE_ONLY]
    a = parser.parse_args(cli)
    values = yaml.safe_load((CHART / "ci" / scenario).read_text()) or {}
    m = values.get("metrics", {})
    assert a.deployer == values.get("deployer", {}).get("type", "kubernetes")
    assert a.metrics == m.get("source", "scrape")
    assert a.namespace == (values.get("deployer", {}).get("namespace") or "sits")
    if a.metrics == "prometheus":   # the URL is read from the environment, never put on the command line
        assert a.prometheus_url is None and cm["data"]["SITS_PROMETHEUS_URL"] == m["prometheus"]["url"]
        assert a.prometheus_token_file is None and a.prometheus_password_file is None   # from env (Secret) only
        secret_env = {e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in c["env"] if "valueFrom" in e}
        assert set(secret_env) == {"SITS_PROMETHEUS_TOKEN", "SITS_PROMETHEUS_PASSWORD", "SITS_SECRET_KEY"}
    text = json.dumps(by_kind(docs, "Deployment") + [cm])
    assert "not-a-real-token" not in text
    assert ("--secure-cookies" in args) == (scenario == "monitoring-values.yaml")   # TLS at the Ingress
    session = next(e for e in c["env"] if e["name"] == "SITS_SECRET_KEY")
    assert session["valueFrom"]["secretKeyRef"] == {"name": "rel-sits-control-session", "key": "secret-key"}


def test_role_is_exactly_what_the_deployer_calls(home):
    crd = crd_watch_permissions()
    assert crd == {("sits.dev", "kernelrollouts", "list"), ("sits.dev", "kernelrollouts", "watch"),
                   ("sits.dev", "kernelrollouts/status", "patch"), ("", "events", "create")}
    code = deployer_permissions() | crd   # deployer.watchCrds is on by default
    httproutes = {p for p in code if p[1] == "httproutes"}
    assert httproutes and ("apps", "deployments", "update") in code
    default = by_kind(render(home), "Role")[0]
    assert role_permissions(default) == code - httproutes   # replica-ratio traffic: no Gateway API access
    with_routes = by_kind(render(home, None, "--set", "rbac.httpRoutes=true"), "Role")[0]
    assert role_permissions(with_routes) == code
    no_watch = by_kind(render(home, None, "--set", "deployer.watchCrds=false"), "Role")[0]
    assert role_permissions(no_watch) == code - httproutes - crd
    # no other control-plane module talks to the API server directly
    modules = sorted((ROOT / "control_plane").rglob("*.py"))
    assert DEPLOYER_API in modules and CRD_API in modules
    for path in modules:
        if path not in (DEPLOYER_API, CRD_API):
            assert "_namespaced_" not in path.read_text(), path
    # the RoleBinding gives the Role to the chart's ServiceAccount, in the deployer's namespace
    docs = render(home, "kubernetes-prometheus-values.yaml")
    rb, role = by_kind(docs, "RoleBinding")[0], by_kind(docs, "Role")[0]
    sa = by_kind(docs, "ServiceAccount")[0]
    assert role["metadata"]["namespace"] == rb["metadata"]["namespace"] == "sits-variants"
    assert rb["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": "sits"}]
    assert not by_kind(render(home, None, "--set", "deployer.type=local"), "Role")


def test_prometheus_rule_passes_promtool(home, tmp_path):
    rule = by_kind(render(home, "monitoring-values.yaml"), "PrometheusRule")[0]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"]))
    r = subprocess.run([PROMTOOL_BIN, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 11 rules found" in r.stdout   # 8 recording rules + 3 alerts
    exprs = {x.get("alert") or x["record"]: x for g in rule["spec"]["groups"] for x in g["rules"]}
    assert 'namespace="sits"' in exprs["SITSRollback"]["expr"] and "[15m]" in exprs["SITSRollback"]["expr"]
    assert 'job="rel-sits-control"' in exprs["SITSControlPlaneDown"]["expr"]
    assert exprs["SITSChecksInconclusive"]["for"] == "20m" and "__" not in json.dumps(exprs)
    broken = yaml.safe_load(path.read_text())
    broken["groups"][0]["rules"][0]["expr"] += " +"
    path.write_text(yaml.safe_dump(broken))
    assert subprocess.run([PROMTOOL_BIN, "check", "rules", str(path)], capture_output=True).returncode != 0


def test_dashboards_are_sidecar_configmaps(home):
    docs = render(home, "monitoring-values.yaml")
    boards = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert len(boards) == 3
    for cm in boards:
        (key, text), = cm["data"].items()
        assert text + "\n" == (CHART / "dashboards" / key.removeprefix("sits-")).read_text()
        assert cm["metadata"]["annotations"] == {"grafana_folder": "SITS"}
    assert not [d for d in by_kind(render(home, None, "--set", "dashboards.enabled=false"), "ConfigMap")
                if "grafana_dashboard" in d["metadata"]["labels"]]


def test_policy_and_auth_render_as_the_control_plane_reads_them(home):
    docs = render(home, "kubernetes-prometheus-values.yaml")
    cm = next(d for d in by_kind(docs, "ConfigMap") if "policy.yaml" in d["data"])
    policy = Policy.from_dict(yaml.safe_load(cm["data"]["policy.yaml"]))
    assert policy.steps == (10, 25, 50, 100) and policy.checks[0].max_rel_delta == 0.08
    assert Policy.from_dict(yaml.safe_load(next(d for d in by_kind(render(home), "ConfigMap")
                                                if "policy.yaml" in d["data"])["data"]["policy.yaml"])) == Policy()
    auth = next(d for d in by_kind(docs, "Secret") if d["metadata"]["name"].endswith("-auth"))
    users = yaml.safe_load(auth["stringData"]["auth.yaml"])["users"]
    assert users == [{"name": "alice", "role": "admin", "token_sha256": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0"
                                                                        "b822cd15d6c15b0f00a08"}]


def _walk_objects(schema: dict, where: str = "$"):
    if schema.get("type") == "object" or "properties" in schema:
        yield where, schema
    for key in ("properties", "definitions"):
        for k, sub in schema.get(key, {}).items():
            yield from _walk_objects(sub, f"{where}.{k}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from _walk_objects(schema[key], f"{where}[{key}]")


def test_values_schema_is_closed_draft07():
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    open_objects = [w for w, s in _walk_objects(schema)
                    if s.get("additionalProperties") is not False and not isinstance(s.get("additionalProperties"),
                                                                                     dict)
                    and w not in ("$.kubernetesObject", "$.global")]   # passed through / Helm's own
    assert not open_objects, f"objects without additionalProperties: false: {open_objects}"
    assert set(schema["properties"]["policy"]["properties"]) == {f.name for f in fields(Policy)}
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values) == set(schema["properties"]) - {"global"}


@pytest.mark.parametrize("bad, message", [
    ("unknownKey=1", "additional properties 'unknownKey' not allowed"),
    ("policy.stepz[0]=5", "additional properties 'stepz' not allowed"),
    ("auth.users[0].name=a,auth.users[0].role=root,auth.users[0].token_sha256=" + "a" * 64, "role"),
    ("auth.users[0].name=a,auth.users[0].role=admin,auth.users[0].token_sha256=plaintext", "token_sha256"),
    ("metrics.source=prometheus", "url"),
    ("deployer.type=docker", "deployer/type"),
])
def test_schema_rejects_bad_values(home, bad, message):
    r = helm("template", "rel", str(CHART), "--set", bad, home=home, check=False)
    assert r.returncode != 0 and message in r.stderr, r.stderr


def test_test_hook_calls_readyz(home):
    r = helm("template", "rel", str(CHART), "--namespace", "sits", "--show-only", "templates/tests/test-readyz.yaml",
             home=home)
    pod = yaml.safe_load(r.stdout)
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    script = pod["spec"]["containers"][0]["args"][0]
    assert "http://rel-sits-control.sits.svc:8080/readyz" in script
    compile(script, "readyz-hook", "exec")   # the hook's Python is valid



def test_prompt_sets_are_files_the_gate_can_name(home, tmp_path):
    values = tmp_path / "prompts.yaml"
    values.write_text(yaml.safe_dump({"promptSets": {"smoke": ["The capital of France is", 'a "quoted"\nline']},
                                      "policy": {"correctness": {"prompt_set": "smoke"}}}))
    docs = render(home, None, "-f", str(values))
    cm = next(d for d in by_kind(docs, "ConfigMap") if "policy.yaml" in d["data"])
    assert json.loads(cm["data"]["prompts-smoke.json"]) == ["The capital of France is", 'a "quoted"\nline']
    dep = by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]
    config = next(v for v in dep["volumes"] if v["name"] == "config")
    assert {"key": "prompts-smoke.json", "path": "prompts-smoke.json"} in config["configMap"]["items"]
    assert Policy.from_dict(yaml.safe_load(cm["data"]["policy.yaml"])).correctness.prompt_set == "smoke"
    assert cm["data"]["SITS_PROMPT_SET_DIR"] == "/etc/sits/config"   # where the worker finds prompts-smoke.json
    for bad, message in (("promptSets.Bad_Name[0]=x", "'Bad_Name' does not match pattern"),
                         ("promptSets.ok=notalist", "promptSets/ok")):
        r = helm("template", "rel", str(CHART), "--set", bad, home=home, check=False)
        assert r.returncode != 0 and message in r.stderr, (bad, r.stderr)


def test_the_control_plane_runs_the_slim_image_and_the_engines_theirs(home, tmp_path):
    from sits.control_plane.adapters.kernel_catalog import SHIPPED, KernelCatalog

    docs = render(home, "kubernetes-prometheus-values.yaml")
    (dep,) = [d for d in by_kind(docs, "Deployment")]
    c = dep["spec"]["template"]["spec"]["containers"][0]
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert c["image"] == f"ghcr.io/sits/sits-control:{version}" and "--engine-image=$(SITS_ENGINE_IMAGE)" in c["args"]
    cm = next(d for d in by_kind(docs, "ConfigMap") if "kernel-catalog.json" in d["data"])
    assert cm["data"]["SITS_ENGINE_IMAGE"] == f"ghcr.io/sits/sits:{version}"
    assert cm["data"]["SITS_KERNEL_CATALOG"] == "/etc/sits/config/kernel-catalog.json"
    config = next(v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "config")
    assert {"key": "kernel-catalog.json", "path": "kernel-catalog.json"} in config["configMap"]["items"]   # mounted
    # the chart's copy is the control plane's (`make catalog` writes both; tests/kernels/test_catalog.py)
    assert cm["data"]["kernel-catalog.json"] == SHIPPED.read_text()
    (tmp_path / "c.json").write_text(cm["data"]["kernel-catalog.json"])
    assert "triton-v1.1" in KernelCatalog.from_file(tmp_path / "c.json")
    # a catalogue of the operator's own engine image, and the local deployer (engines inside the pod) on the engines'
    (tmp_path / "own.json").write_text('{"kernel_sets": [{"name": "mine", "version": "1.0.0", "devices": ["cuda"]}]}')
    docs = render(home, None, "--set", "deployer.type=local", "--set-file", f"engines.kernelCatalog={tmp_path}/own.json",
                  "--set-string", "engines.image.tag=7")
    (dep,) = by_kind(docs, "Deployment")
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "ghcr.io/sits/sits:7"
    cm = next(d for d in by_kind(docs, "ConfigMap") if "kernel-catalog.json" in d["data"])
    assert json.loads(cm["data"]["kernel-catalog.json"])["kernel_sets"][0]["name"] == "mine"
