"""Issue 26 row 5: a policy names a prompt set (prompts-<name>.json in the worker's --prompt-set-dir, the chart's
ConfigMap mount) or gives the prompts inline, bounded; never a path. The read is bounded and stays in the folder."""
import json
import os

import pytest

from sits.control_plane.adapters.inference.correctness import (MAX_PROMPT_FILE_BYTES, CorrectnessProbe, PromptSetError,
                                                               load_prompt_set)
from sits.control_plane.analysis import Policy, PolicyError
from sits.control_plane.analysis.prompts import DEFAULT_PROMPTS, MAX_INLINE_CHARS, MAX_INLINE_PROMPTS
from sits.control_plane.errors import ValidationError
from sits.control_plane.service.rollouts import start_rollout
from sits.control_plane.store.db import Store


@pytest.mark.parametrize("bad", ["/dev/zero", "/etc/shadow", "../../etc/passwd", "sets/smoke", "..", ".hidden",
                                 "smoke.json", "", "x" * 65, "C:\\prompts", "smoke\x00"])
def test_paths_are_refused_when_the_rollout_is_created(tmp_path, bad):
    with pytest.raises(PolicyError, match="correctness.prompt_set"):
        Policy(correctness={"prompt_set": bad})
    with Store(str(tmp_path / "s.db")) as s:
        with pytest.raises(ValidationError, match="no paths|prompt_set") as e:
            start_rollout(s, "chat", "torch", "torch", {"correctness": {"prompt_set": bad}})
        assert e.value.field == "policy.correctness.prompt_set" and s.list() == []


@pytest.mark.parametrize("bad,why", [([], "non-empty list"), (["a", ""], "non-empty strings"), ([1], "strings"),
                                     (["a"] * (MAX_INLINE_PROMPTS + 1), f"at most {MAX_INLINE_PROMPTS}"),
                                     (["a" * (MAX_INLINE_CHARS + 1)], "characters in all"),
                                     (["a\x00b"], "control characters")])
def test_inline_sets_are_bounded(bad, why):
    with pytest.raises(PolicyError, match=why):
        Policy(correctness={"prompt_set": bad})


def test_inline_sets_round_trip_through_the_store_and_replay_as_given(tmp_path):
    prompts = ["The capital of France is", "def f(x):\n\treturn"]
    with Store(str(tmp_path / "s.db")) as s:
        r = start_rollout(s, "chat", "torch", "torch", {"correctness": {"prompt_set": prompts}}, rollout_id="r1")
        got = s.get("r1").policy.correctness.prompt_set
    assert got == tuple(prompts) == r.policy.correctness.prompt_set
    assert Policy.from_dict(json.loads(json.dumps(r.policy.to_dict()))) == r.policy
    assert load_prompt_set(got, None) == tuple(prompts)
    assert load_prompt_set("default", None) == DEFAULT_PROMPTS


def test_named_sets_come_from_the_configured_folder_only(tmp_path):
    d = tmp_path / "sets"
    d.mkdir()
    (d / "prompts-smoke.json").write_text(json.dumps(["a", "b"]))
    assert load_prompt_set("smoke", d) == ("a", "b")
    assert CorrectnessProbe(prompt_dir=d).prompt_dir == d
    with pytest.raises(PromptSetError, match="no prompt-set directory.*--prompt-set-dir"):
        load_prompt_set("smoke", None)
    missing = pytest.raises(PromptSetError, match="no readable prompts-")
    with missing:
        load_prompt_set("nope", d)
    # links out of the folder are refused, as are devices, FIFOs and folders (nothing is read from them)
    (d / "prompts-passwd.json").symlink_to("/etc/passwd")
    (d / "prompts-zero.json").symlink_to("/dev/zero")
    os.mkfifo(d / "prompts-fifo.json")
    (d / "prompts-dir.json").mkdir()
    for name in ("passwd", "zero", "fifo", "dir"):
        with pytest.raises(PromptSetError, match="no readable prompts-") as e:
            load_prompt_set(name, d)
        assert "/etc" not in str(e.value) and "errno" not in str(e.value).lower()


def test_a_configmap_volume_layout_is_followed_inside_the_folder(tmp_path):
    """ConfigMap volumes hold links: prompts-x.json -> ..data/prompts-x.json, ..data -> ..2026_12_01_00_00/."""
    d = tmp_path / "config"
    (d / "..2026_12_01").mkdir(parents=True)
    (d / "..2026_12_01" / "prompts-smoke.json").write_text(json.dumps(["x"]))
    (d / "..data").symlink_to("..2026_12_01")
    (d / "prompts-smoke.json").symlink_to("..data/prompts-smoke.json")
    assert load_prompt_set("smoke", d) == ("x",)


def test_the_read_is_bounded(tmp_path):
    big = tmp_path / "prompts-big.json"
    with open(big, "wb") as f:
        f.truncate(MAX_PROMPT_FILE_BYTES + 1)   # sparse: costs no disk
    with pytest.raises(PromptSetError, match=f"larger than {MAX_PROMPT_FILE_BYTES} bytes"):
        load_prompt_set("big", tmp_path)
    (tmp_path / "prompts-bad.json").write_bytes(b"\xff\xfe")
    with pytest.raises(PromptSetError, match="not UTF-8"):
        load_prompt_set("bad", tmp_path)
    (tmp_path / "prompts-obj.json").write_text("{}")
    with pytest.raises(PromptSetError, match="non-empty JSON list"):
        load_prompt_set("obj", tmp_path)
