"""LLMEngine's thread-safety contract: add_request/abort_request/stats from many threads, step() from one."""

import threading

from sits.engine import EngineConfig, LLMEngine, SamplingParams


def test_concurrent_submitters_and_one_stepping_thread():
    engine = LLMEngine(EngineConfig(model="tiny", device="cpu", num_kv_blocks=32, max_num_batched_tokens=64))
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    n_threads, per_thread = 4, 12
    finished: dict[str, str] = {}
    tokens: dict[str, list[int]] = {}
    done_submitting = threading.Event()
    errors = []

    def submitter(t):
        try:
            for i in range(per_thread):
                rid = f"t{t}-{i}"
                engine.add_request(rid, f"thread {t} request {i}", params, tenant=f"tenant{t % 2}",
                                   priority=i % 4)
                if i % 5 == 4:
                    engine.abort_request(rid)
                engine.stats()
        except Exception as e:  # surfaced below
            errors.append(e)

    def stepper():
        while not (done_submitting.is_set() and not engine.has_unfinished_requests()):
            for out in engine.step():
                tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
                if out.finished:
                    assert out.request_id not in finished
                    finished[out.request_id] = out.finish_reason

    loop = threading.Thread(target=stepper)
    loop.start()
    threads = [threading.Thread(target=submitter, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    done_submitting.set()
    loop.join(timeout=120)
    assert not loop.is_alive() and not errors
    assert len(finished) == n_threads * per_thread  # every request reported finished exactly once
    aborted = {rid for rid, r in finished.items() if r == "abort"}
    assert all(rid.endswith(("-4", "-9")) for rid in aborted)
    assert all(len(tokens.get(rid, [])) == 6 for rid, r in finished.items() if r == "length")
    stats = engine.stats()
    assert stats.num_free_blocks == stats.num_total_blocks and stats.num_running == stats.num_waiting == 0
    assert stats.generation_tokens_total == sum(len(t) for t in tokens.values())


def test_a_failing_kernel_aborts_only_that_step_and_the_engine_recovers():
    import dataclasses

    import pytest

    from sits.engine import StepError

    engine = LLMEngine(EngineConfig(model="tiny", device="cpu", num_kv_blocks=8))
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    engine.add_request("ok-before", "fine", params)
    while engine.has_unfinished_requests():
        engine.step()
    healthy = engine.kernel_set

    def broken_linear(x, weight, bias=None):
        raise RuntimeError("illegal memory access")

    broken = dataclasses.replace(healthy, linear=broken_linear)
    for layer in engine.model_runner.model.layers:  # swap the kernel in, as a faulty kernel release would
        layer.ks = layer.qkv_proj.ks = broken
    engine.add_request("doomed", "this step fails", params)
    with pytest.raises(StepError, match="illegal memory access") as e:
        engine.step()
    assert [(o.request_id, o.finish_reason) for o in e.value.outputs] == [("doomed", "abort")]
    assert engine.stats().num_free_blocks == engine.stats().num_total_blocks
    for layer in engine.model_runner.model.layers:
        layer.ks = layer.qkv_proj.ks = healthy
    engine.add_request("ok-after", "fine", params)
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    assert outs[-1].request_id == "ok-after" and outs[-1].finish_reason == "length"
