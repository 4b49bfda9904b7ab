"""Issue 39: a rollout's `model` is refused at creation (422, field "model") unless it is a preset or a checkpoint
path the engine could load: absolute, no '..', no leading '-', at most 4096 characters, no URL (the engine loads
none), and, where the engines run on this machine (the local deployer), an existing directory. The same check on
every way in: the API, `sits-control rollout start`, the KernelRollout watcher."""
import pytest

from sits.control_plane.errors import ValidationError
from sits.control_plane.service.rollouts import start_rollout
from sits.control_plane.store.db import Store
from sits.control_plane.web import create_app
from sits.control_plane.crd.watch import CrdWatcher
from sits.wire.models import PRESET_NAMES
from .conftest import auth

BAD = [
    ("/etc/../root", "'..' components"),
    ("../../", "absolute checkpoint path"),
    ("models/llama", "absolute checkpoint path"),
    ("https://huggingface.co/meta-llama/Meta-Llama-3-8B", "URLs are not supported"),
    ("hf://meta-llama/Meta-Llama-3-8B", "URLs are not supported"),
    ("file:///models/llama", "URLs are not supported"),
    ("-h", "must not start with '-'"),
    ("--model=/x", "must not start with '-'"),
    ("/" + "a" * 5000, "at most 4096"),
    ("/models/a\nb", "control characters"),
    ("llama3-70b", "neither a preset (tiny, llama3-8b) nor an absolute checkpoint path"),
]


def _client(store, users, local: bool):
    return create_app({"TESTING": True, "STORE": store, "SITS_USERS": users, "SECRET_KEY": "t",
                       "LOCAL_MODELS": local}).test_client()


@pytest.mark.parametrize("model,why", BAD, ids=[b[1][:20] + str(i) for i, b in enumerate(BAD)])
def test_the_api_refuses_a_bad_model_with_422_naming_the_field(store, users, model, why):
    for local in (True, False):
        r = _client(store, users, local).post("/api/v1/rollouts", json={"service": "chat", "kernels": "torch",
                                                                        "model": model}, headers=auth("operator"))
        assert r.status_code == 422, r.get_json()
        err = r.get_json()["error"]
        assert err["field"] == "model" and why in err["message"], err
        assert len(err["message"]) < 400
    assert store.list() == []


def test_presets_and_checkpoint_directories_are_accepted_where_the_deployer_can_load_them(store, users, tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    missing = str(tmp_path / "not-here")
    local, remote = _client(store, users, True), _client(store, users, False)

    def create(client, service, model):
        return client.post("/api/v1/rollouts", json={"service": service, "kernels": "torch", "model": model},
                           headers=auth("operator"))
    for i, name in enumerate(PRESET_NAMES):
        assert create(local, f"p{i}", name).status_code == 201
    assert create(local, "dir", str(ckpt)).status_code == 201
    r = create(local, "gone", missing)                           # the local deployer's engines would not find it
    assert r.status_code == 422 and r.get_json()["error"]["field"] == "model"
    assert "no checkpoint directory at that path on this machine" in r.get_json()["error"]["message"]
    assert create(remote, "pod", missing).status_code == 201     # Kubernetes: the pod's filesystem, unseen here
    assert sorted(r.service for r in store.list()) == ["dir", "p0", "p1", "pod"]


def test_the_service_layer_checks_the_directory_only_for_local_engines(store, tmp_path):
    with pytest.raises(ValidationError) as ei:
        start_rollout(store, "chat", "torch", "torch", spec={"model": str(tmp_path / "x")}, local_models=True)
    assert ei.value.field == "model"
    assert start_rollout(store, "chat", "torch", "torch", spec={"model": str(tmp_path / "x")}).service == "chat"


def test_rollout_start_refuses_a_bad_model_in_one_line(tmp_path, capsys):
    from sits.control_plane.cli.main import main
    db = str(tmp_path / "c.db")
    for argv, why in ((["--model", "https://example.com/model"], "URLs are not supported"),
                      (["--model", str(tmp_path / "nope")], "no checkpoint directory"),
                      (["--model", "../llama"], "absolute checkpoint path")):
        rc = main(["rollout", "start", "--service", "chat", "--kernels", "torch", "--store", db,
                   "--kernel-catalog", "", *argv])
        err = capsys.readouterr().err
        assert rc == 2 and why in err and "model" in err and len(err.strip().splitlines()) == 1, err
    # the Kubernetes deployer's engines have their own filesystem: a well-formed path is accepted
    assert main(["rollout", "start", "--service", "chat", "--kernels", "torch", "--store", db, "--kernel-catalog", "",
                 "--deployer", "kubernetes", "--model", str(tmp_path / "nope")]) == 0
    with Store(db) as s:
        assert [s.spec(r.id).model for r in s.list()] == [str(tmp_path / "nope")]


class _Api:
    """The watcher's view of the Kubernetes API, recording what it writes."""
    namespace = "ns"

    def __init__(self):
        self.statuses, self.events = [], []

    def patch_status(self, name, status):
        self.statuses.append(status)
        return {"metadata": {"name": name, "uid": "u1", "generation": 1}, "status": status}

    def record_event(self, obj, type_, reason, message):
        self.events.append((type_, reason, message))


def test_a_kernel_rollout_with_a_bad_model_is_refused_as_an_invalid_spec(store):
    api = _Api()
    w = CrdWatcher(store, api)
    obj = {"metadata": {"name": "r", "uid": "u1", "generation": 1},
           "spec": {"service": "chat", "kernels": "torch", "model": "s3://bucket/llama"}}
    w.cache["r"] = obj
    w.reconcile(obj)
    assert store.list() == []
    [(kind, reason, message)] = api.events
    assert (kind, reason) == ("Warning", "InvalidSpec") and "URLs are not supported" in message
