"""Issue 42: `tensor_parallel_size`, the GPUs one engine spans, from every front end (API, CLI, KernelRollout) to the
engine's argv (the flag only when it is more than 1) and a Kubernetes pod's GPU request."""
import re
from pathlib import Path

import pytest
import yaml

from sits.control_plane.adapters.deploy import InvalidVariantError, VariantSpec
from sits.control_plane.adapters.deploy.kubernetes import manifests as m
from sits.control_plane.adapters.deploy.kubernetes.status import pod_replica
from sits.control_plane.adapters.deploy.spec import DeploySpec
from sits.control_plane.cli.main import main
from sits.control_plane.crd.status import RolloutRequest
from sits.control_plane.errors import ValidationError
from sits.control_plane.rollout import Phase
from sits.control_plane.store.db import Store
from sits.control_plane.validation import MAX_TENSOR_PARALLEL
from sits.control_plane.web import create_app
from sits.control_plane.web.users import Users, token_sha256

from tests.control_plane.web.conftest import drive
from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[3]


def test_the_engine_gets_the_flag_only_above_one():
    one = DeploySpec().variant("chat", "canary", "triton-v1")
    assert one.engine_args(port=9) == ["serve", "--model", "tiny", "--kernels", "triton-v1", "--env", "canary",
                                       "--service", "chat", "--port", "9"]   # as before issue 42
    two = DeploySpec(tensor_parallel_size=2, canary_args=("--seed", "7")).variant("chat", "canary", "triton-v1")
    assert two.tensor_parallel_size == 2
    assert two.engine_args(port=9) == ["serve", "--seed", "7", "--model", "tiny", "--kernels", "triton-v1",
                                       "--tensor-parallel-size", "2", "--env", "canary", "--service", "chat",
                                       "--port", "9"]
    for role in ("production", "baseline"):   # every variant of the rollout spans as many GPUs
        assert DeploySpec(tensor_parallel_size=8).variant("chat", role, "torch").tensor_parallel_size == 8


def test_the_field_round_trips_and_specs_stored_before_it_read_as_one():
    s = DeploySpec(tensor_parallel_size=4, gpus=4)
    assert DeploySpec.from_dict(s.to_dict()) == s and s.to_dict()["tensor_parallel_size"] == 4
    old = {k: v for k, v in DeploySpec().to_dict().items() if k != "tensor_parallel_size"}
    assert DeploySpec.from_stored(old).tensor_parallel_size == 1
    v = s.variant("chat", "canary", "torch")
    assert VariantSpec.from_dict(v.to_dict()) == v
    assert VariantSpec.from_dict({k: x for k, x in v.to_dict().items() if k != "tensor_parallel_size"}) \
        .tensor_parallel_size == 1


@pytest.mark.parametrize("bad,field", [(0, "tensor_parallel_size"), (9, "tensor_parallel_size"),
                                       (-2, "tensor_parallel_size"), (True, "tensor_parallel_size"),
                                       ("2", "tensor_parallel_size"), (2.0, "tensor_parallel_size")])
def test_the_field_is_an_integer_from_1_to_8(bad, field):
    with pytest.raises(ValidationError) as e:
        DeploySpec(tensor_parallel_size=bad)
    assert e.value.field == field and "GPUs per engine" in str(e.value) and "from 1 to 8" in str(e.value)
    with pytest.raises(InvalidVariantError):
        VariantSpec(service="chat", role="canary", kernels="torch", tensor_parallel_size=bad)


def test_gpus_per_replica_must_hold_an_engine():
    with pytest.raises(ValidationError) as e:
        DeploySpec(tensor_parallel_size=4, gpus=2)
    assert e.value.field == "gpus" and "tensor_parallel_size 4" in str(e.value)
    assert DeploySpec(tensor_parallel_size=4, gpus=0).variant("c", "canary", "torch").gpus_per_engine == 4
    assert DeploySpec(tensor_parallel_size=2, gpus=4).variant("c", "canary", "torch").gpus_per_engine == 4


@pytest.mark.parametrize("args", [["--tensor-parallel-size", "2"], ["--tensor-parallel-size=2"]])
def test_the_flag_in_args_is_refused_naming_the_field(args):
    with pytest.raises(ValidationError) as e:
        DeploySpec(canary_args=tuple(args))
    assert e.value.field == "args"
    assert str(e.value) == ("args: --tensor-parallel-size is set by the deployer and cannot be given (the rollout's "
                            "tensor_parallel_size sets it)")


# ---- Kubernetes: the pod's GPU request ---------------------------------------------------------------------------

@pytest.mark.parametrize("kw,limit,flag", [
    ({}, None, None),                                            # a CPU (or engine's-choice) pod: as before
    ({"device": "cpu"}, None, None),
    ({"device": "cpu", "tensor_parallel_size": 2}, None, "2"),   # CPU stays CPU: no GPU asked for
    ({"gpus": 1}, "1", None),
    ({"device": "cuda"}, "1", None),
    ({"tensor_parallel_size": 2}, "2", "2"),
    ({"device": "cuda", "tensor_parallel_size": 4}, "4", "4"),
    ({"gpus": 8, "tensor_parallel_size": 4}, "8", "4"),
    ({"args": ("--device", "cuda:0"), "tensor_parallel_size": 2}, "2", "2"),
    ({"args": ("--device=cpu",), "gpus": 0}, None, None),
])
def test_engine_pods_on_cuda_ask_for_their_gpus(kw, limit, flag):
    spec = VariantSpec(service="chat", role="canary", kernels="torch", **kw)
    d = m.deployment(spec, image="i:1", port=8000, replicas=1, gpu_resource="nvidia.com/gpu")
    c = d["spec"]["template"]["spec"]["containers"][0]
    assert c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu") == limit
    got = c["args"][c["args"].index("--tensor-parallel-size") + 1] if "--tensor-parallel-size" in c["args"] else None
    assert got == flag
    if limit is None and flag is None:   # the template (and so its hash) is what it was before issue 42
        assert "resources" not in c


def test_a_pod_says_what_gpus_it_asked_for():
    spec = VariantSpec(service="chat", role="canary", kernels="torch", tensor_parallel_size=2)
    tpl = m.deployment(spec, image="i:1", port=8000, replicas=1, gpu_resource="example.com/gpu")["spec"]["template"]
    pod = {"metadata": {"name": "chat-canary-x"}, "spec": tpl["spec"], "status": {"phase": "Running"}}
    rs = pod_replica(pod, "canary", "example.com/gpu")
    assert (rs.gpu_placement, rs.gpu_note) == ("own", "2 example.com/gpu of its own")
    cpu = m.deployment(VariantSpec(service="chat", role="canary", kernels="torch"), image="i:1", port=8000,
                       replicas=1, gpu_resource="nvidia.com/gpu")["spec"]["template"]
    rs = pod_replica({"metadata": {"name": "p"}, "spec": cpu["spec"], "status": {}}, "canary")
    assert (rs.gpu_placement, rs.gpu_note) == ("", "")


# ---- front ends: API, CLI, KernelRollout ---------------------------------------------------------------------------

@pytest.fixture
def api(tmp_path):
    store = Store(str(tmp_path / "s.db"))
    token = "operator-token-0123456789"
    users = Users.from_dict({"users": [{"name": "otto", "role": "operator", "token_sha256": token_sha256(token)}]})
    app = create_app({"TESTING": True, "STORE": store, "SITS_USERS": users, "SECRET_KEY": "test-secret"})
    client, auth = app.test_client(), {"Authorization": f"Bearer {token}"}
    yield store, lambda body: client.post("/api/v1/rollouts", json=body, headers=auth), client, auth
    store.close()


@pytest.mark.parametrize("bad", [0, 9, -1, "2", True, 1.5, None])
def test_the_api_answers_422_naming_the_field(api, bad):
    store, post, _, _ = api
    r = post({"service": "chat", "kernels": "torch", "production_kernels": "torch", "tensor_parallel_size": bad})
    if bad is None:   # null: the default
        assert r.status_code == 201 and store.spec(r.get_json()["id"]).tensor_parallel_size == 1
        return
    err = r.get_json()["error"]
    assert r.status_code == 422 and err["field"] == "tensor_parallel_size", err
    assert "tensor_parallel_size" in err["message"] and store.list() == []


def test_the_api_takes_it_shows_it_and_a_retry_keeps_it(api):
    store, post, client, auth = api
    r = post({"service": "chat", "kernels": "torch", "production_kernels": "torch", "tensor_parallel_size": 2})
    assert r.status_code == 201, r.get_json()
    rid = r.get_json()["id"]
    assert store.spec(rid).tensor_parallel_size == 2 and r.get_json()["spec"]["tensor_parallel_size"] == 2
    assert client.post(f"/api/v1/rollouts/{rid}/abort", headers=auth).status_code == 202
    drive(store, rid, 3)   # worker passes over an in-memory deployer: the abort applies
    assert store.get(rid).phase is Phase.ROLLED_BACK
    retry = post({"retry_of": rid})
    assert retry.status_code == 201, retry.get_json()
    assert store.spec(retry.get_json()["id"]).tensor_parallel_size == 2
    schema = client.get("/api/v1/openapi.json", headers=auth).get_json()["components"]["schemas"]["NewRollout"]
    assert schema["properties"]["tensor_parallel_size"]["maximum"] == MAX_TENSOR_PARALLEL


def test_the_cli_takes_it_and_refuses_a_bad_one_in_one_line(tmp_path, capsys):
    db = str(tmp_path / "c.db")
    base = ["rollout", "start", "--service", "chat", "--kernels", "torch", "--store", db, "--kernel-catalog", ""]
    for bad in ("0", "9", "two"):
        with pytest.raises(SystemExit) as e:   # argparse's usage error: usage line + one error line
            main([*base, "--tensor-parallel-size", bad])
        err = capsys.readouterr().err
        assert e.value.code == 2 and "--tensor-parallel-size" in err and "Traceback" not in err, err
        assert ("from 1 to 8" in err) == bad.isdigit()
    assert main([*base, "--tensor-parallel-size", "2", "--gpus", "1"]) == 2   # one line: gpus cannot hold it
    err = capsys.readouterr().err
    assert "gpus: 1 per replica cannot hold an engine of tensor_parallel_size 2" in err, err
    assert main([*base, "--tensor-parallel-size", "4"]) == 0
    with Store(db) as s:
        (r,) = s.list()
        assert s.spec(r.id).tensor_parallel_size == 4


def test_a_kernelrollout_carries_it_and_the_crd_bounds_it_as_the_api_does():
    req = RolloutRequest.from_object({"spec": {"service": "chat", "kernels": "k", "tensorParallelSize": 2}})
    assert req.spec == {"model": "tiny", "canary_args": [], "tensor_parallel_size": 2}
    assert "tensor_parallel_size" not in RolloutRequest.from_object({"spec": {"service": "c", "kernels": "k"}}).spec
    crd = yaml.safe_load((REPO / "helm/sits-control/crds/kernelrollouts.sits.dev.yaml").read_text())
    prop = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "tensorParallelSize"]
    assert (prop["type"], prop["minimum"], prop["maximum"]) == ("integer", 1, MAX_TENSOR_PARALLEL)


def test_the_local_deployer_serves_a_two_rank_engine_on_cpu(tmp_path):
    """End to end on CPU: a variant with tensor_parallel_size 2 is a real `sits-engine serve --tensor-parallel-size 2`
    (rank 0 and one gloo worker), ready behind the router, answering the same greedy tokens as one rank; delete stops
    both ranks."""
    import httpx

    from sits.control_plane.adapters.deploy.local.config import LocalConfig
    from sits.control_plane.adapters.deploy.local.deployer import LocalDeployer

    d = LocalDeployer(LocalConfig(workdir=str(tmp_path), cpu_threads=1, ready_timeout_s=240))
    body = {"model": "tiny", "prompt": "the canary sings", "max_tokens": 8, "temperature": 0}
    try:
        d.deploy(VariantSpec(service="tp", role="production", kernels="torch"))
        d.deploy(VariantSpec(service="tp", role="canary", kernels="torch", tensor_parallel_size=2))
        st = d.status("tp")
        assert st["canary"].ready and st["production"].ready, st["canary"].message
        one = httpx.post(st["production"].endpoint + "/v1/completions", json=body, timeout=60).json()
        two = httpx.post(st["canary"].endpoint + "/v1/completions", json=body, timeout=60).json()
        assert two["choices"][0]["text"] == one["choices"][0]["text"] and two["usage"]["completion_tokens"] == 8
        log = next(tmp_path.rglob("tp-canary-*.log")).read_text()
        assert "--tensor-parallel-size 2" in log
        port = st["canary"].endpoint.rsplit(":", 1)[1]
        ranks = [pid for pid, cmd in _processes() if "sits.engine.cli" in cmd and f"--port {port}" in cmd]
        # the server, its engine-core process (rank 0: forked by the deployer's engine zygote, on this CPU machine)
        # and what that started
        core = int(re.search(r"engine core \(pid (\d+)\) forked by the engine zygote", log).group(1))
        tree = _descendants([*ranks, core])
        workers = [pid for pid, cmd in _processes() if pid in tree and "sits.engine.parallel.worker" in cmd]
        assert len(ranks) == 1 and len(workers) == 1, tree   # one rank besides rank 0
        d.delete("tp", "canary")
        wait_for("every process of the engine to exit", lambda: not {p for p, _ in _processes()} & tree, timeout=30)
    finally:
        d.close()


def _processes():
    import os
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                yield int(pid), f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            pass


def _descendants(roots: list[int]) -> set[int]:
    tree, grown = set(roots), True
    while grown:
        more = {pid for pid, _ in _processes() if _parent(pid) in tree} - tree
        tree |= more
        grown = bool(more)
    return tree


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None
