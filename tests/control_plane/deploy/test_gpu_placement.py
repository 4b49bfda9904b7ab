"""Issue 42: each variant on GPUs of its own. The GpuPool's rules as table tests over a fake device list, then the
real LocalDeployer with engines that stand in for `sits-engine serve` (they answer /readyz and say what
CUDA_VISIBLE_DEVICES and argv they were started with): disjoint GPUs per variant, sharing when too few are free
(said so), release on delete and rollback, a promotion keeping the canary's GPUs, the CPU left alone."""
import json
import sys
import threading

import httpx
import pytest

from sits.control_plane.adapters.deploy import DeployError, VariantSpec
from sits.control_plane.adapters.deploy.local.config import LocalConfig
from sits.control_plane.adapters.deploy.local.deployer import LocalDeployer
from sits.control_plane.adapters.deploy.local.gpus import OWN, SHARED, GpuPool, Placement, visible_gpus

EIGHT = tuple(str(i) for i in range(8))


def _place(pool: GpuPool, service: str, role: str, per_engine: int, engines: int = 1, prefer=()) -> Placement:
    p = pool.reserve(service, role, per_engine, engines, prefer)
    pool.commit(service, role)
    return p


# ---- the pool: a fake device list ------------------------------------------------------------------------------

@pytest.mark.parametrize("order", [("production", "baseline", "canary"), ("production", "canary", "baseline"),
                                   ("canary", "baseline", "production")])
def test_eight_gpus_two_per_engine_give_each_variant_its_own_pair_whatever_the_order(order):
    pool = GpuPool(EIGHT)
    got = {role: _place(pool, "chat", role, 2).sets for role in order}
    assert got == {"production": (("0", "1"),), "baseline": (("2", "3"),), "canary": (("4", "5"),)}
    assert all(pool.held("chat", r) == got[r] for r in got)


def test_replicas_get_disjoint_sets_and_a_second_service_takes_what_is_left():
    pool = GpuPool(EIGHT)
    prod = _place(pool, "chat", "production", 1, engines=2)
    canary = _place(pool, "chat", "canary", 1, engines=2)
    other = _place(pool, "embed", "production", 2, engines=1)
    assert prod.sets == (("0",), ("1",)) and canary.sets == (("4",), ("5",))
    assert other.sets == (("2", "3"),)   # the first free aligned pair
    seen = [g for p in (prod, canary, other) for s in p.sets for g in s]
    assert len(seen) == len(set(seen))   # never one GPU to two variants while enough are free
    assert prod.env(1) == {"CUDA_VISIBLE_DEVICES": "1"} and other.env(0) == {"CUDA_VISIBLE_DEVICES": "2,3"}


def test_too_few_free_gpus_share_and_say_so():
    pool = GpuPool(("0", "1", "2"))
    assert _place(pool, "chat", "production", 2).sets == (("0", "1"),)
    canary = _place(pool, "chat", "canary", 2)
    assert canary.mode == SHARED and canary.sets == () and canary.env(0) == {}   # sees what the control plane sees
    assert canary.gpus(0) == ("0", "1", "2")
    assert canary.describe(0) == "shares GPUs 0-2 with the other engines: 1 engine × 2 GPUs needed, 1 of 3 free"
    assert pool.held("chat", "canary") == ()
    # one GPU left: a one-GPU engine still gets it of its own
    assert _place(pool, "chat", "baseline", 1).sets == (("2",),)


def test_unaligned_free_gpus_are_used_before_sharing():
    pool = GpuPool(("0", "1", "2", "3"))
    assert _place(pool, "a", "production", 1).sets == (("0",),)
    assert _place(pool, "b", "production", 1).sets == (("1",),)   # block 0 is taken: the next one
    assert _place(pool, "a", "canary", 1).sets == (("2",),)       # the canary's blocks start at its role's
    pool.release("b", "production")                                # free: 1 and 3, no aligned pair
    got = _place(pool, "c", "production", 2)
    assert got.mode == OWN and got.sets == (("1", "3"),)
    assert _place(pool, "d", "production", 1).mode == SHARED      # all four held


def test_a_redeploy_keeps_its_gpus_and_a_failed_one_keeps_the_old():
    pool = GpuPool(EIGHT)
    first = _place(pool, "chat", "canary", 2)
    again = pool.reserve("chat", "canary", 2, 1)     # a new spec for the canary: its engines restart where they ran
    assert again.sets == first.sets
    pool.abort("chat", "canary")                     # the new engines never got ready: the old ones keep their GPUs
    assert pool.held("chat", "canary") == first.sets
    # tensor parallel 4: the canary's block (2 of 2, wrapping round: 0-3), its old pair released
    bigger = _place(pool, "chat", "canary", 4)
    assert bigger.sets == (("0", "1", "2", "3"),) and pool.held("chat", "canary") == bigger.sets
    assert _place(pool, "chat", "baseline", 2).sets == (("4", "5"),)     # its own block (2,3) is the canary's
    assert _place(pool, "chat", "production", 2).sets == (("6", "7"),)
    assert _place(pool, "chat", "baseline", 4).mode == SHARED           # 4-7 is not free: production holds 6,7


def test_a_reservation_is_not_handed_out_twice_while_its_engines_start():
    pool = GpuPool(("0", "1"))
    a = pool.reserve("chat", "baseline", 1, 1)
    b = pool.reserve("chat", "canary", 1, 1)      # the baseline's engines are still starting: not its GPU
    assert a.sets == (("1",),) and b.sets == (("0",),)   # each role from its own block on, wrapping round
    c = pool.reserve("chat", "production", 1, 1)
    assert c.mode == SHARED


def test_release_and_promotion():
    pool = GpuPool(EIGHT)
    for role in ("production", "baseline", "canary"):
        _place(pool, "chat", role, 2)
    canary = pool.held("chat", "canary")
    # promote: production starts on the canary's GPUs (while the canary still runs there), then the canary goes
    promoted = _place(pool, "chat", "production", 2, prefer=canary)
    assert promoted.sets == canary == (("4", "5"),)
    pool.release("chat", "canary")
    pool.release("chat", "baseline")
    assert pool.held("chat", "production") == (("4", "5"),)   # released by the canary, still production's
    # the old production's and the baseline's GPUs are free again; the promoted ones are not
    nxt = {role: _place(pool, "chat", role, 2).sets for role in ("baseline", "canary")}
    assert nxt == {"baseline": (("2", "3"),), "canary": (("6", "7"),)}


@pytest.mark.parametrize("environ,smi,want", [
    ({"CUDA_VISIBLE_DEVICES": "2,3,5"}, "0\n1\n", ("2", "3", "5")),          # honoured, nvidia-smi not asked
    ({"CUDA_VISIBLE_DEVICES": "GPU-aa, GPU-bb"}, None, ("GPU-aa", "GPU-bb")),
    ({"CUDA_VISIBLE_DEVICES": "0,-1,1"}, None, ("0",)),                     # CUDA stops at the first invalid one
    ({"CUDA_VISIBLE_DEVICES": ""}, "0\n", ()),
    ({}, "0\n1\n2\n3\n", ("0", "1", "2", "3")),
    ({}, "No devices were found\n", ()),
    ({}, None, ()),                                                          # no nvidia-smi
])
def test_visible_gpus(environ, smi, want):
    def fake_smi():
        assert "CUDA_VISIBLE_DEVICES" not in environ, "nvidia-smi asked although CUDA_VISIBLE_DEVICES is set"
        return smi
    assert visible_gpus(environ, fake_smi) == want


def test_gpu_devices_config_is_checked():
    for bad in (("0", "0"), ("0,1",), ("",), ("-1",)):
        with pytest.raises(DeployError, match="gpu_devices"):
            LocalConfig(gpu_devices=bad)


# ---- the real LocalDeployer: engines that say what they were started with --------------------------------------

STAND_IN_ENGINE = r'''
import http.server, json, os, socket, sys
fd = int(sys.argv[sys.argv.index("--listen-fd") + 1])
class H(http.server.BaseHTTPRequestHandler):   # ready at once; /started says what this process got
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = json.dumps({"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                           "argv": sys.argv[1:]}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H, bind_and_activate=False)
server.daemon_threads = True
server.socket = socket.socket(fileno=fd)
server.serve_forever()
'''


@pytest.fixture
def deployer(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    made = []

    def make(gpu_devices=EIGHT, **kw):
        d = LocalDeployer(LocalConfig(workdir=str(tmp_path / f"d{len(made)}"), stop_timeout_s=5, drain_timeout_s=0,
                                      engine_command=(sys.executable, "-c", STAND_IN_ENGINE),
                                      gpu_devices=gpu_devices, max_replicas=16, **kw))
        made.append(d)
        return d
    yield make
    for d in made:
        d.close()


def started(d: LocalDeployer, service: str) -> dict[str, list[dict]]:
    """role -> what each of its engine processes reports it was started with (asked over HTTP), with the deployer's
    own account of its GPUs (replicas())."""
    out: dict[str, list[dict]] = {}
    for rs in d.replicas(service):
        seen = httpx.get(rs.address + "/started", timeout=5, trust_env=False).json()
        out.setdefault(rs.role, []).append({**seen, "placement": rs.gpu_placement, "gpus": rs.gpus,
                                            "note": rs.gpu_note})
    return out


def spec(role: str, kernels: str = "torch", **kw) -> VariantSpec:
    return VariantSpec(service="chat", role=role, kernels=kernels, **kw)


def test_each_variant_gets_its_own_gpus_and_the_engine_its_tensor_parallel_flag(deployer):
    d = deployer()
    d.deploy(spec("production", tensor_parallel_size=2))
    threads = [threading.Thread(target=d.deploy, args=(spec(r, "triton-v1" if r == "canary" else "torch",
                                                            tensor_parallel_size=2),)) for r in ("canary", "baseline")]
    for t in threads:   # together, as the worker deploys them
        t.start()
    for t in threads:
        t.join()
    got = started(d, "chat")
    assert {r: [e["cuda_visible_devices"] for e in got[r]] for r in got} == {
        "production": ["0,1"], "baseline": ["2,3"], "canary": ["4,5"]}
    for role, (e,) in got.items():
        assert e["placement"] == OWN and e["note"] == f"GPUs {e['cuda_visible_devices']} of its own"
        argv = e["argv"]
        assert argv[argv.index("--tensor-parallel-size") + 1] == "2" and argv.count("--tensor-parallel-size") == 1
    assert "GPUs 4,5 of its own" in d.status("chat")["canary"].message


def test_one_gpu_per_engine_argv_is_unchanged_and_replicas_get_a_gpu_each(deployer):
    d = deployer()
    d.deploy(spec("production", replicas=2))
    got = started(d, "chat")["production"]
    assert [e["cuda_visible_devices"] for e in got] == ["0", "1"]
    assert all("--tensor-parallel-size" not in e["argv"] for e in got)
    assert got[0]["argv"][:7] == ["serve", "--model", "tiny", "--kernels", "torch", "--env", "production"]


def test_too_few_gpus_share_and_every_view_says_so(deployer, monkeypatch, caplog):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")   # what the control plane was given: honoured, and inherited
    d = deployer(gpu_devices=None)
    d.deploy(spec("production"))
    d.deploy(spec("baseline"))
    with caplog.at_level("WARNING"):
        d.deploy(spec("canary", "triton-v1"))
    got = started(d, "chat")
    assert [got[r][0]["cuda_visible_devices"] for r in ("production", "baseline")] == ["0", "1"]
    canary = got["canary"][0]
    assert canary["cuda_visible_devices"] == "0,1"   # every GPU, as before issue 42
    assert canary["placement"] == SHARED and canary["gpus"] == ("0", "1")
    assert canary["note"] == "shares GPUs 0,1 with the other engines: 1 engine × 1 GPU needed, 0 of 2 free"
    assert "too few free GPUs" in caplog.text and "chat/canary" in caplog.text
    assert "shares GPUs 0,1" in d.status("chat")["canary"].message
    # production and the baseline hold a GPU no other variant is given, but the canary runs on both: shared, says so
    for role, gpu in (("production", "0"), ("baseline", "1")):
        e = got[role][0]
        assert e["placement"] == SHARED and e["gpus"] == (gpu,)
        assert e["note"] == f"GPU {gpu}, given to no other variant, but shared: 1 engine of other variants runs on " \
                            f"every GPU"
        assert e["note"] in d.status("chat")[role].message
    d.rollback("chat")   # the canary gone, production's GPU is its own again
    (prod,) = started(d, "chat")["production"]
    assert (prod["placement"], prod["note"]) == (OWN, "GPU 0 of its own")


def test_rollback_releases_and_promote_keeps_the_canarys_gpus(deployer):
    d = deployer(gpu_devices=("0", "1", "2", "3"))
    for role in ("production", "baseline", "canary"):
        d.deploy(spec(role, "triton-v1" if role == "canary" else "torch"))
    d.rollback("chat")
    d.deploy(spec("baseline"))
    d.deploy(spec("canary", "triton-v1.1"))
    got = started(d, "chat")   # the same GPUs again: released by the rollback
    assert {r: got[r][0]["cuda_visible_devices"] for r in got} == {"production": "0", "baseline": "1", "canary": "2"}
    d.promote("chat")
    got = started(d, "chat")
    assert list(got) == ["production"] and got["production"][0]["cuda_visible_devices"] == "2"
    assert "triton-v1.1" in got["production"][0]["argv"]
    # the old production's and the baseline's GPUs are free again, the promoted canary's are not
    d.deploy(spec("baseline", "triton-v1.1"))
    d.deploy(spec("canary", "triton-v1"))
    got = started(d, "chat")
    assert {r: got[r][0]["cuda_visible_devices"] for r in got} == {"production": "2", "baseline": "1", "canary": "3"}
    d.delete("chat")
    d.deploy(VariantSpec(service="other", role="production", kernels="torch", replicas=4))
    assert [e["cuda_visible_devices"] for e in started(d, "other")["production"]] == ["0", "1", "2", "3"]


def test_the_cpu_and_a_device_picked_by_hand_are_left_alone(deployer, monkeypatch):
    d = deployer()
    d.deploy(spec("production", device="cpu"))
    d.deploy(spec("canary", args=("--device", "cuda:3")))
    got = started(d, "chat")
    prod, canary = got["production"][0], got["canary"][0]
    assert prod["cuda_visible_devices"] is None and prod["placement"] == "" and prod["note"] == ""
    assert canary["cuda_visible_devices"] is None and canary["placement"] == SHARED
    assert canary["note"] == "shares GPUs 0-7 with the other engines: --device cuda:3 picks its GPU by hand"
    # neither holds a GPU: another service's production gets the first one
    d.deploy(VariantSpec(service="other", role="production", kernels="torch"))
    assert started(d, "other")["production"][0]["cuda_visible_devices"] == "0"
    # a variant moved from a GPU to the CPU gives its GPUs back
    d.deploy(spec("baseline"))
    assert started(d, "chat")["baseline"][0]["cuda_visible_devices"] == "1"   # the baseline's own block
    d.deploy(spec("baseline", device="cpu"))
    d.deploy(VariantSpec(service="other", role="baseline", kernels="torch"))
    assert started(d, "other")["baseline"][0]["cuda_visible_devices"] == "1"


def test_no_gpu_listed_changes_nothing(deployer):
    d = deployer(gpu_devices=())
    d.deploy(spec("production"))
    (e,) = started(d, "chat")["production"]
    assert e["cuda_visible_devices"] is None and e["placement"] == "" and e["note"] == ""
    assert json.loads(json.dumps(d.replicas("chat")[0].to_dict()))["gpus"] == []
