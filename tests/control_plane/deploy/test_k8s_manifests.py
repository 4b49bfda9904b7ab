"""Pure manifest builders (no cluster): table tests."""
import re

import pytest

from sits.control_plane.adapters.deploy.kubernetes import manifests as m
from sits.control_plane.adapters.deploy import DeployError, VariantSpec, normalize_weights


@pytest.mark.parametrize("weights,total,want", [
    ({"production": 100}, 4, {"production": 4}),
    ({"production": 80, "baseline": 10, "canary": 10}, 8, {"production": 6, "baseline": 1, "canary": 1}),
    ({"production": 80, "baseline": 10, "canary": 10}, 1, {"production": 1, "baseline": 1, "canary": 1}),
    ({"production": 50, "baseline": 25, "canary": 25}, 4, {"production": 2, "baseline": 1, "canary": 1}),
    ({"production": 0, "baseline": 50, "canary": 50}, 4, {"production": 0, "baseline": 2, "canary": 2}),
    ({"production": 100, "baseline": 0, "canary": 0}, 3, {"production": 3, "baseline": 0, "canary": 0}),
    ({"production": 99, "canary": 1}, 10, {"production": 9, "canary": 1}),
])
def test_replicas_for_weights(weights, total, want):
    assert m.replicas_for_weights(weights, total) == want


def test_label_value_is_always_valid():
    assert m.label_value("triton-v1") == "triton-v1"
    assert m.label_value("my kernels/v2+fast") == "my-kernels-v2-fast"
    long = m.label_value("-x" * 50)
    assert len(long) <= 63 and re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", long)
    assert m.label_value("///") == "unknown"


def test_deployment_hash_ignores_replicas_but_not_the_template():
    s = VariantSpec(service="chat", role="canary", kernels="torch")
    a = m.deployment(s, image="i:1", port=8000, replicas=1, gpu_resource="nvidia.com/gpu")
    b = m.deployment(s, image="i:1", port=8000, replicas=5, gpu_resource="nvidia.com/gpu")
    c = m.deployment(s, image="i:2", port=8000, replicas=1, gpu_resource="nvidia.com/gpu")
    h = lambda d: d["metadata"]["annotations"][m.HASH_ANNOTATION]  # noqa: E731
    assert h(a) == h(b) != h(c)
    assert VariantSpec.from_dict(__import__("json").loads(a["metadata"]["annotations"][m.SPEC_ANNOTATION])) == s


def test_httproute_roundtrip_and_pins():
    r = m.httproute("chat", {"production": 90, "canary": 10}, 8000, gateway="gw", gateway_namespace=None,
                    hostnames=(), version="v1")
    assert r["apiVersion"] == "gateway.networking.k8s.io/v1" and "hostnames" not in r["spec"]
    assert m.route_weights(r) == {"production": 90, "canary": 10}
    pins = [rule["matches"][0]["headers"][0] for rule in r["spec"]["rules"][1:]]
    assert pins == [{"type": "Exact", "name": "X-SITS-Variant", "value": v} for v in ("production", "canary")]


@pytest.mark.parametrize("weights,error", [
    ({}, "non-empty"), ({"production": 90}, "sum to 100"), ({"gray": 100}, "unknown role"),
    ({"production": 101, "canary": -1}, "0..100"), ({"production": True}, "integer percent"),
])
def test_normalize_weights_rejects(weights, error):
    with pytest.raises(DeployError, match=error):
        normalize_weights(weights)


def test_variant_spec_validation():
    with pytest.raises(DeployError, match="replicas"):
        VariantSpec(service="chat", role="canary", kernels="torch", replicas=-1)
    with pytest.raises(DeployError, match="args"):
        VariantSpec(service="chat", role="canary", kernels="torch", args="--seed 1")
    s = VariantSpec(service="chat", role="canary", kernels="torch", args=["--seed", "1"], env={"A": "b"})
    assert s.args == ("--seed", "1") and s.engine_args(port=9) == [
        "serve", "--seed", "1", "--model", "tiny", "--kernels", "torch", "--env", "canary", "--service", "chat",
        "--port", "9"]   # the deployer's flags last: they win over anything in args
