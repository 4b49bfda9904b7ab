"""Issue 26 row 4: operator engine flags pass an allow-list where DeploySpec is built (the API, the CLI and the
service share it); the flags the deployer owns (listen address, labels, tracing, fault injection) are refused naming
the flag."""
import pytest

from sits.control_plane.adapters.deploy.engine_args import check_args, flag_changes, flag_map, flag_value, with_flags
from sits.control_plane.adapters.deploy import VariantSpec
from sits.control_plane.adapters.deploy.spec import DeploySpec
from sits.control_plane.errors import ValidationError
from sits.control_plane.service.rollouts import start_rollout
from sits.control_plane.store.db import Store
from sits.control_plane.web import create_app
from sits.control_plane.web.users import Users, token_sha256

OWNED = [["--host", "0.0.0.0"], ["--port", "18799"], ["--env", "production"], ["--service", "other"],
         ["--otel-exporter", "otlp"], ["--otlp-endpoint", "http://attacker.example:4318"],
         ["--fault-error-rate", "0.5"], ["--fault-latency-ms", "50"], ["--fault-token-latency-ms", "5"],
         ["--model", "/etc"], ["--kernels", "torch"], ["--host=0.0.0.0"], ["--port=1"]]


@pytest.mark.parametrize("field,key", [("args", "canary_args"), ("production_args", "production_args")])
@pytest.mark.parametrize("args", OWNED, ids=lambda a: a[0])
def test_deployer_owned_flags_are_refused_naming_the_flag(field, key, args):
    with pytest.raises(ValidationError) as e:
        DeploySpec(**{key: ("--seed", "7", *args)})
    assert e.value.field == field
    assert args[0].partition("=")[0] in str(e.value) and "deployer" in str(e.value)


@pytest.mark.parametrize("args,why", [
    (["--ho", "0.0.0.0"], "'--ho' is not an engine flag"),       # argparse would take it for --host
    (["--po", "1"], "'--po' is not an engine flag"),
    (["-h"], "'-h' is not an engine flag"),
    (["0.0.0.0"], "'0.0.0.0' is not an engine flag"),           # a stray value
    (["--seed"], "--seed needs a value"),
    (["--seed", "--host", "0.0.0.0"], "--seed needs a value"),  # the next flag is no value
    (["--enforce-eager=1"], "--enforce-eager takes no value"),
    (["--seed", "7\x00"], "printable"),
    (["--served-model-name", "\ud800"], "printable"),
    (["--seed", "1"] * 33, "at most 64 arguments"),
])
def test_malformed_args_are_refused(args, why):
    with pytest.raises(ValidationError, match=why.replace("(", r"\(")) as e:
        DeploySpec(canary_args=tuple(args))
    assert e.value.field == "args"


def test_allowed_flags_pass_and_the_deployer_flags_come_last():
    args = ("--seed", "7", "--max-num-seqs=8", "--enforce-eager", "--dtype", "float32", "--fault-latency-ms", "1")
    with pytest.raises(ValidationError, match="--fault-latency-ms is set by the deployer"):
        DeploySpec(canary_args=args)
    s = DeploySpec(canary_args=args[:-2], production_args=("--no-warmup",), canary_faults=("--fault-latency-ms", "1"))
    v = s.variant("chat", "canary", "torch")
    assert v.args == ("--seed", "7", "--max-num-seqs=8", "--enforce-eager", "--dtype", "float32",
                      "--fault-latency-ms", "1")
    assert s.variant("chat", "baseline", "torch").args == ("--no-warmup",)   # faults are the canary's only
    assert DeploySpec.from_dict(s.to_dict()) == s
    # an unvalidated VariantSpec cannot rebind either: argparse keeps the last value, the deployer's
    argv = VariantSpec("chat", "canary", "torch", args=("--port", "1", "--host", "0.0.0.0")).engine_args(
        port=9, host="127.0.0.1")
    assert argv[-4:] == ["--port", "9", "--host", "127.0.0.1"]


def test_canary_faults_take_fault_flags_only():
    with pytest.raises(ValidationError, match="--host is set by the deployer") as e:
        DeploySpec(canary_faults=("--host", "0.0.0.0"))
    assert e.value.field == "canary_faults"


@pytest.mark.parametrize("name", ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_EXPORTER", "SITS_OTEL_EXPORTER",
                                  "SITS_ENV", "LD_PRELOAD", "PYTHONPATH", "PATH", "otel_traces_exporter"])
def test_env_the_deployer_owns_is_refused(name):
    with pytest.raises(ValidationError, match=f"{name} is set by the deployer") as e:
        DeploySpec(env={name: "x"})
    assert e.value.field == "env"
    assert DeploySpec(env={"HF_HOME": "/cache"}).env == {"HF_HOME": "/cache"}


def test_the_service_refuses_them_from_a_dict(tmp_path):
    store = Store(str(tmp_path / "s.db"))
    with pytest.raises(ValidationError) as e:
        start_rollout(store, "chat", "torch", "torch", None, {"production_args": ["--fault-error-rate", "0.5"]})
    assert e.value.field == "production_args" and store.list() == []
    store.close()


def test_the_api_answers_422_naming_the_field_and_flag(tmp_path):
    store = Store(str(tmp_path / "s.db"))
    token = "operator-token-0123456789"
    users = Users.from_dict({"users": [{"name": "otto", "role": "operator", "token_sha256": token_sha256(token)}]})
    app = create_app({"TESTING": True, "STORE": store, "SITS_USERS": users, "SECRET_KEY": "test-secret"})
    body = {"service": "chat", "kernels": "torch", "production_kernels": "torch",
            "args": ["--host", "0.0.0.0", "--port", "18799", "--otel-exporter", "otlp", "--otlp-endpoint", "http://x"],
            "production_args": ["--fault-error-rate", "0.5"]}
    for sent, field, flag in ((body, "production_args", "--fault-error-rate"),
                              ({**body, "production_args": ["--seed", "1"]}, "args", "--host")):
        r = app.test_client().post("/api/v1/rollouts", json=sent, headers={"Authorization": f"Bearer {token}"})
        err = r.get_json()["error"]
        assert r.status_code == 422 and err["field"] == field and flag in err["message"], err
    assert store.list() == []
    store.close()


def test_the_device_field_reaches_the_engine_after_any_args_and_is_validated():
    s = DeploySpec(device="cuda", canary_args=("--device", "cpu", "--gpu-memory-utilization", "0.2"),
                   ready_timeout_s=900)
    v = s.variant("chat", "canary", "triton-v1", ready_timeout_s=30.0)
    argv = v.engine_args(port=9)
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.2"
    # argparse keeps the last --device: the field's
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--device"] == ["cpu", "cuda"]
    assert v.device == "cuda" and v.ready_timeout_s == 900.0   # the spec's deadline beats the one passed
    assert DeploySpec().variant("chat", "canary", "torch", ready_timeout_s=30.0).ready_timeout_s == 30.0
    assert "--device" not in DeploySpec().variant("chat", "canary", "torch").engine_args(port=9)
    assert DeploySpec.from_dict(s.to_dict()) == s
    assert VariantSpec.from_dict(v.to_dict()) == v
    for bad, field in (({"device": "tpu"}, "device"), ({"device": "CUDA"}, "device"), ({"device": 1}, "device"),
                       ({"ready_timeout_s": 0}, "ready_timeout_s"), ({"ready_timeout_s": "60"}, "ready_timeout_s")):
        with pytest.raises(ValidationError) as e:
            DeploySpec(**bad)
        assert e.value.field == field, bad


@pytest.mark.parametrize("extra,field", [({"device": "gpu"}, "device"), ({"device": 0}, "device"),
                                         ({"ready_timeout_s": -5}, "ready_timeout_s"),
                                         ({"ready_timeout_s": True}, "ready_timeout_s")])
def test_the_api_takes_device_and_ready_timeout_and_answers_422_naming_them(tmp_path, extra, field):
    store = Store(str(tmp_path / "s.db"))
    token = "operator-token-0123456789"
    users = Users.from_dict({"users": [{"name": "otto", "role": "operator", "token_sha256": token_sha256(token)}]})
    app = create_app({"TESTING": True, "STORE": store, "SITS_USERS": users, "SECRET_KEY": "test-secret"})
    body = {"service": "chat", "kernels": "torch", "production_kernels": "torch"}
    auth = {"Authorization": f"Bearer {token}"}
    r = app.test_client().post("/api/v1/rollouts", json={**body, **extra}, headers=auth)
    assert r.status_code == 422 and r.get_json()["error"]["field"] == field, r.get_json()
    assert store.list() == []
    r = app.test_client().post("/api/v1/rollouts", json={**body, "device": "cuda", "ready_timeout_s": 900},
                               headers=auth)
    assert r.status_code == 201, r.get_json()
    spec = store.spec(r.get_json()["id"])
    assert spec.device == "cuda" and spec.ready_timeout_s == 900.0
    assert r.get_json()["spec"]["device"] == "cuda"
    store.close()


@pytest.mark.parametrize("args,message", [
    (["--header-timeout-s", "1e9"], "--header-timeout-s must be more than 0 and at most 3600 seconds, got '1e9'"),
    (["--body-timeout-s=-1"], "--body-timeout-s must be more than 0 and at most 3600 seconds, got '-1'"),
    (["--gpu-memory-utilization", "nan"], "--gpu-memory-utilization must be a fraction in (0, 1], got 'nan'"),
    (["--num-kv-blocks", "1e8"], "--num-kv-blocks must be an integer from 1 to 4194304, got '1e8'"),
    (["--max-num-seqs", "0"], "--max-num-seqs must be an integer from 1 to 4096, got '0'"),
    (["--dtype", "bf16"], "--dtype must be one of auto, float32, bfloat16, float16, got 'bf16'"),
    (["--device", "tpu"], "--device must be auto, cpu, cuda or cuda:N, got 'tpu'"),
    (["--kv-cache-dtype", "int4"], "--kv-cache-dtype must be one of auto, fp8, got 'int4'"),
])
def test_flag_values_are_checked_when_the_rollout_is_created(args, message):
    # the probe: all four were accepted (201) and failed, or silently disabled a guard, only in the engine
    with pytest.raises(ValidationError) as e:
        check_args(args, "args")
    assert str(e.value) == f"args: {message}" and e.value.field == "args"


def test_flag_values_in_range_pass():
    args = ["--max-num-seqs", "64", "--gpu-memory-utilization", "0.2", "--quantization", "int8", "--device",
            "cuda:1", "--header-timeout-s=30", "--seed", "7", "--dtype", "bfloat16", "--kv-cache-dtype", "fp8"]
    assert check_args(args, "args") == tuple(args)
    # what the engine will take (the last of a repeated flag, as argparse does), in either spelling
    assert flag_value(args, "--kv-cache-dtype") == "fp8" and flag_value(args, "--header-timeout-s") == "30"
    assert flag_value(args, "--max-model-len") is None
    assert flag_value([*args, "--kv-cache-dtype=auto"], "--kv-cache-dtype") == "auto"



def test_flag_changes_name_what_the_canary_adds_changes_and_drops():
    prod = ["--quantization", "int8", "--enforce-eager", "--seed", "7", "--max-num-seqs=64"]
    canary = ["--quantization=fp8", "--seed", "7", "--max-num-seqs", "64", "--kv-cache-dtype", "fp8"]
    assert flag_changes(prod, canary) == ["--enforce-eager (production only)", "--kv-cache-dtype fp8",
                                          "--quantization fp8 (production: int8)"]
    assert flag_changes(prod, prod) == [] and flag_changes([], []) == []
    assert flag_map(["--no-warmup", "--seed", "1", "--seed", "2"]) == {"--no-warmup": None, "--seed": "2"}


def test_with_flags_sets_each_given_flag_once_keeping_the_rest_in_order():
    prod = ["--max-num-seqs", "64", "--kv-cache-dtype=auto", "--enforce-eager", "--seed", "7"]
    assert with_flags(prod, ["--kv-cache-dtype", "fp8"]) == ("--max-num-seqs", "64", "--enforce-eager", "--seed", "7",
                                                             "--kv-cache-dtype", "fp8")
    assert with_flags(prod, ["--enforce-eager", "--seed=8"]) == ("--max-num-seqs", "64", "--kv-cache-dtype=auto",
                                                                 "--enforce-eager", "--seed=8")
    assert with_flags(prod, []) == tuple(prod) and with_flags([], ["--no-warmup"]) == ("--no-warmup",)
    assert flag_map(with_flags(prod, ["--kv-cache-dtype", "fp8"]))["--kv-cache-dtype"] == "fp8"


@pytest.mark.parametrize("name", ["TRITON_CACHE_DIR", "TRITON_INTERPRET", "GLIBC_TUNABLES", "HTTP_PROXY", "https_proxy",
                                  "SSL_CERT_FILE", "BASH_ENV", "CUDA_VISIBLE_DEVICES", "SITS_KERNEL_PLUGINS"])
def test_env_that_changes_what_runs_or_where_it_connects_is_refused(name):
    with pytest.raises(ValidationError, match=f"{name} is set by the deployer"):
        DeploySpec(env={name: "x"})


def test_env_names_are_bounded():
    with pytest.raises(ValidationError, match="at most 128 characters"):
        DeploySpec(env={"A" * 129: "x"})
    assert DeploySpec(env={"MY_FLAG": "1"}).env == {"MY_FLAG": "1"}
