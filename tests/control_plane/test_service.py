"""sits.control_plane.service: starting a rollout (validation naming the field, one transaction, the creation event) and
sending commands (phase checks, idempotency), with allowed_commands checked against what reconcile really does."""
from dataclasses import replace

import pytest

from sits.control_plane.errors import ConflictError, NotFoundError, ValidationError
from sits.control_plane.rollout import Command, EventKind, Observation, Phase, Rollout, reconcile
from sits.control_plane.rollout import allowed_commands
from sits.control_plane.service.rollouts import send_command, start_rollout
from sits.control_plane.adapters.deploy.spec import DeploySpec
from sits.control_plane.store.db import Store


@pytest.fixture
def store():
    with Store(":memory:") as s:
        yield s


@pytest.mark.parametrize("kwargs,field,message", [
    (dict(service="Chat!"), "service", "DNS label"),
    (dict(service=""), "service", "DNS label"),
    (dict(canary_kernels="triton-v9"), "kernels", "unknown kernel set 'triton-v9'"),
    (dict(production_kernels=None), "production_kernels", "unknown kernel set None"),
    (dict(policy={"steps": [10, 5]}), "policy.steps", "strictly increasing"),
    (dict(policy={"stepz": [10]}), "policy.stepz", "is not a policy field"),
    (dict(policy="fast"), "policy", "object"),
    (dict(spec={"replicas": 0}), "replicas", "replicas must be an integer >= 1"),
    (dict(spec={"canary_args": "--seed 7"}), "args", "list of strings"),
    (dict(spec={"env": {"A": 1}}), "env", "map strings"),
    (dict(spec={"gpus": -1}), "gpus", "gpus"),
    (dict(spec={"modle": "tiny"}), "modle", "unknown spec field"),
    # a KV page format the set cannot read: refused here, not when its engine fails to start after a deploy
    (dict(spec={"canary_args": ["--kv-cache-dtype", "fp8"]}), "args",
     "args: --kv-cache-dtype fp8 needs a kernel set that reads such KV pages; triton-v1 reads auto only "
     r"\(kernel sets that read fp8: torch, triton-v1.3, "),
    (dict(canary_kernels="triton-v1.8", production_kernels="triton-v1.2",
          spec={"production_args": ["--kv-cache-dtype=fp8"], "canary_args": ["--kv-cache-dtype=fp8"]}),
     "production_args", "production_args: --kv-cache-dtype fp8 needs .*; triton-v1.2 reads auto only"),
])
def test_start_rollout_rejects_bad_input_naming_the_field(store, kwargs, field, message):
    args = dict(service="chat", canary_kernels="triton-v1", production_kernels="torch") | kwargs
    with pytest.raises(ValidationError, match=message) as e:
        start_rollout(store, **args)
    assert e.value.field == field
    assert store.count() == 0                                  # nothing written


def test_start_rollout_writes_the_rollout_its_spec_and_who_created_it(store):
    r = start_rollout(store, "chat", "triton-v1", "torch", {"steps": [10, 100]}, {"replicas": 2, "canary_args":
                      ["--seed", "7"]}, now=1000.0, actor="alice")
    assert r.phase is Phase.PENDING and r.version == 1 and r.policy.steps == (10, 100) and r.created_at == 1000.0
    assert r.id.startswith("chat-19700101-001640-") and store.get(r.id) == r
    assert store.spec(r.id) == DeploySpec(replicas=2, canary_args=("--seed", "7"))
    assert [(e["kind"], e["message"], e["actor"]) for e in store.events(r.id)] == [
        ("created", "created by alice", "alice")]
    with pytest.raises(ConflictError, match="active rollout"):
        start_rollout(store, "chat", "triton-v1.1", "torch")
    other = start_rollout(store, "search", "torch", "torch", rollout_id="s1", kernel_sets={"torch"})
    assert other.id == "s1" and store.events("s1")[0]["message"] == "created"
    with pytest.raises(ValidationError, match="known: torch"):
        start_rollout(store, "x", "triton-v1", "torch", kernel_sets={"torch"})
    # an engine-flag release: production's own set with an FP8 KV cache on the canary alone
    flag = start_rollout(store, "kv", "triton-v1.8", "triton-v1.8", spec={"canary_args": ["--kv-cache-dtype", "fp8"]})
    assert store.spec(flag.id).canary_args == ("--kv-cache-dtype", "fp8") and store.spec(flag.id).production_args == ()


def at_phase(store, phase, **fields) -> Rollout:
    r = store.create(Rollout(f"r-{phase.value}", f"s-{phase.value.replace('_', '-')}", "v2", "v1"))
    return store.save(replace(r, phase=phase, **fields))


def test_send_command_checks_the_phase_and_is_idempotent(store):
    with pytest.raises(NotFoundError, match="no rollout 'nope'"):
        send_command(store, "nope", "abort", "alice")
    r = at_phase(store, Phase.PROGRESSING)
    with pytest.raises(ValidationError) as e:
        send_command(store, r.id, "explode", "alice")
    assert e.value.field == "command"
    with pytest.raises(ConflictError, match="resume is not allowed while rollout r-progressing is progressing; "
                                            "allowed: abort, pause, promote"):
        send_command(store, r.id, Command.RESUME, "alice")
    first = send_command(store, r.id, "pause", "alice")
    assert send_command(store, r.id, Command.PAUSE, "bob") == first           # queued already: the same one
    assert [c["actor"] for c in store.commands.pending(r.id)] == ["alice"]
    other = send_command(store, r.id, "abort", "bob")
    assert other != first and store.commands.next(r.id) == (first, Command.PAUSE, "alice")
    done = at_phase(store, Phase.SUCCEEDED)
    with pytest.raises(ConflictError, match="already succeeded"):
        send_command(store, done.id, "abort", "alice")
    gated = at_phase(store, Phase.PAUSED, awaiting_promotion=True, paused_from=Phase.PROGRESSING)
    with pytest.raises(ConflictError, match=r"awaiting promotion"):
        send_command(store, gated.id, "resume", "alice")
    assert send_command(store, gated.id, "promote", "alice") > 0


PHASES = [(p, {}) for p in Phase if p is not Phase.PAUSED] + [
    (Phase.PAUSED, {"paused_from": Phase.PROGRESSING}),
    (Phase.PAUSED, {"paused_from": Phase.PROGRESSING, "awaiting_promotion": True})]


@pytest.mark.parametrize("phase,fields", PHASES)
def test_allowed_commands_are_those_reconcile_applies(phase, fields):
    r = Rollout("r1", "chat", "v2", "v1", phase=phase, step=0, weight=5, **fields)
    applied = set()
    for cmd in Command:   # reconcile records an ignored command as a "command" event; an applied one moves the phase
        new, _ = reconcile(r, Observation(command=cmd, command_by="alice"), 10.0)
        ignored = [e for e in new.new_events if e.kind is EventKind.COMMAND]
        if not ignored:
            assert new.phase is not phase and all(e.actor == "alice" for e in new.new_events), cmd
            applied.add(cmd)
        else:
            assert [e.actor for e in ignored] == ["alice"] and "ignored" in ignored[0].message
    assert allowed_commands(r) == applied
