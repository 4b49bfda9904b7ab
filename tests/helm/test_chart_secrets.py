"""Issue 26 row 13 and 7 in the chart: Prometheus credentials and webhook URLs reach the container only from Secrets
(env), never its command line or the ConfigMap; `--trusted-proxy` is wired for the Ingress; the NetworkPolicy."""
from __future__ import annotations

import json
import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from sits.control_plane.cli.build import prometheus_config, webhooks
from sits.control_plane.cli.main import build_parser
from tests.helm.support import CHART, by_kind, helm, render

K8S_VERSION = "1.30.0"
PROM_URL = "http://sits:hunter-pw@prometheus.monitoring.svc:9090/?access_token=hunter-tok"
HOOKS = ["https://hooks.example/a?token=hunter-hook", "https://hooks.example/b"]
SLACK = ["https://hooks.slack.com/services/T0/B0/hunter-slack"]
SECRETS = ("hunter-pw", "hunter-tok", "hunter-hook", "hunter-slack")


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("helm-home")


def _values(tmp_path: Path, **values) -> str:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def _container_env(docs: list[dict]) -> tuple[dict, list[str], dict[str, str]]:
    """(container, args after the kubelet's $(VAR) expansion, env as the kubelet builds it from ConfigMap + Secrets)."""
    c = by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    maps = {d["metadata"]["name"]: d["data"] for d in by_kind(docs, "ConfigMap")}
    secrets = {d["metadata"]["name"]: d.get("stringData", {}) for d in by_kind(docs, "Secret")}
    env = {}
    for src in c["envFrom"]:
        env.update(maps[src["configMapRef"]["name"]])
    for e in c["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
        elif "secretKeyRef" in e["valueFrom"]:
            ref = e["valueFrom"]["secretKeyRef"]
            if ref["key"] in secrets.get(ref["name"], {}):
                env[e["name"]] = secrets[ref["name"]][ref["key"]]
            else:
                assert ref.get("optional") or ref["name"].endswith("-session"), ref
    args = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in c["args"]]
    return c, args, env


def test_prometheus_and_webhook_secrets_only_in_secrets(home, tmp_path, monkeypatch):
    docs = render(home, None, "-f", _values(tmp_path, metrics={"source": "prometheus", "prometheus": {"url": PROM_URL}},
                                            notifications={"webhooks": HOOKS, "slackWebhooks": SLACK}))
    c, args, env = _container_env(docs)
    public = json.dumps(by_kind(docs, "Deployment") + by_kind(docs, "ConfigMap"))
    for s in SECRETS:
        assert s not in public and not any(s in a for a in args)
    secret = {d["metadata"]["name"]: d["stringData"] for d in by_kind(docs, "Secret") if "stringData" in d}
    assert secret["rel-sits-control-prometheus"]["url"] == PROM_URL
    assert secret["rel-sits-control-notifications"] == {"webhooks": "\n".join(HOOKS), "slack-webhooks": SLACK[0]}
    # what the control plane builds from exactly that command line and environment
    for k in ("SITS_PROMETHEUS_URL", "SITS_WEBHOOK_URLS", "SITS_SLACK_WEBHOOK_URLS", "SITS_PROMETHEUS_TOKEN",
              "SITS_PROMETHEUS_PASSWORD"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        if k.startswith("SITS_"):
            monkeypatch.setenv(k, v)
    a = build_parser().parse_args(args)
    assert a.cmd == "serve" and a.prometheus_url is None
    cfg = prometheus_config(a)
    assert cfg.basic_auth == ("sits", "hunter-pw") and "hunter-pw" not in cfg.url
    assert webhooks(a) == (HOOKS, SLACK)
    for d in docs:
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)


def test_a_prometheus_url_without_credentials_stays_in_the_configmap(home):
    docs = render(home, None, "--set", "metrics.source=prometheus,metrics.prometheus.url=http://prom:9090")
    _, args, env = _container_env(docs)
    assert env["SITS_PROMETHEUS_URL"] == "http://prom:9090"
    assert not any(d["metadata"]["name"].endswith(("-prometheus", "-notifications")) for d in by_kind(docs, "Secret"))
    assert not any(a.startswith("--prometheus-url") for a in args)


def test_credentials_in_the_url_with_an_existing_secret_are_refused(home):
    r = helm("template", "rel", str(CHART), "--set", "metrics.source=prometheus,metrics.prometheus.existingSecret=p,"
             "metrics.prometheus.url=http://u:pw@prom:9090", home=home, check=False)
    assert r.returncode != 0 and "carries credentials" in r.stderr and "pw@" not in r.stderr


@pytest.mark.parametrize("extra, proxy", [((), None), (("--set", "ingress.enabled=true"), "*"),
                                           (("--set", "ingress.enabled=true,controlPlane.trustedProxy=10.0.0.7"),
                                            "10.0.0.7"),
                                           (("--set", "ingress.enabled=true,controlPlane.trustedProxy=-"), None)])
def test_trusted_proxy_is_wired_for_the_ingress(home, extra, proxy):
    """Issue 26 row 7: behind the chart's Ingress every client had the controller's address (one lock-out for all)."""
    _, args, _ = _container_env(render(home, None, *extra))
    assert build_parser().parse_args(args).trusted_proxy == proxy


def test_network_policy_admits_the_namespace_ingress_and_prometheus(home):
    docs = render(home)
    (np,) = by_kind(docs, "NetworkPolicy")
    kubernetes_validate.validate(np, K8S_VERSION, strict=True)
    pod = by_kind(docs, "Deployment")[0]["spec"]["template"]
    assert np["spec"]["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert np["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = np["spec"]["ingress"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert "http" in {p["name"] for p in pod["spec"]["containers"][0]["ports"]}
    assert rule["from"] == [{"podSelector": {}}]   # without an Ingress: this namespace only (helm test)
    (np,) = by_kind(render(home, None, "--set", "ingress.enabled=true,serviceMonitor.enabled=true,"
                           "networkPolicy.ingressNamespaces={traefik},"
                           "networkPolicy.extraFrom[0].ipBlock.cidr=10.0.0.0/8"), "NetworkPolicy")
    assert np["spec"]["ingress"][0]["from"] == [
        {"podSelector": {}}, {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "traefik"}}},
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},
        {"ipBlock": {"cidr": "10.0.0.0/8"}}]
    assert not by_kind(render(home, None, "--set", "networkPolicy.enabled=false"), "NetworkPolicy")


@pytest.mark.parametrize("bad, message", [
    ("networkPolicy.ingressNamespaces={Bad_NS}", "ingressNamespaces"),
    ("notifications.webhooks={ftp://x}", "webhooks"),
    ("networkPolicy.enabled=maybe", "networkPolicy"),
])
def test_schema_rejects_bad_network_and_notification_values(home, bad, message):
    r = helm("template", "rel", str(CHART), "--set", bad, home=home, check=False)
    assert r.returncode != 0 and message in r.stderr, r.stderr
