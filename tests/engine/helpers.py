"""Shared helpers for the engine tests."""


def run_to_completion(engine, max_steps: int = 10_000) -> dict:
    """Step until idle; returns {request_id: {"tokens", "text", "finish_reason", "outputs"}}."""
    results: dict = {}
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            return results
        for out in engine.step():
            r = results.setdefault(out.request_id, {"tokens": [], "text": "", "finish_reason": None, "outputs": []})
            r["tokens"] += out.new_token_ids
            r["text"] += out.new_text
            r["outputs"].append(out)
            if out.finished:
                r["finish_reason"] = out.finish_reason
    raise AssertionError("engine did not finish")


LOGIT_TOL = 2e-2   # fp32 logits of a correct set stay this close to torch's, step by step


def greedy_logits(kernels: str, prompts: dict[str, list[int]], device: str, steps: int = 12) -> dict:
    """{rid: ([logits per step], tokens)} for greedy decoding of the tiny model in fp32."""
    from sits.engine import EngineConfig, LLMEngine, SamplingParams

    engine = LLMEngine(EngineConfig(model="tiny", kernels=kernels, device=device, dtype="float32",
                                    num_kv_blocks=32, max_num_batched_tokens=96))  # 96: chunked prefill too
    engine.model_runner.capture_logits = True
    for rid, ids in prompts.items():
        engine.add_request(rid, ids, SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=True))
    out = {rid: ([], []) for rid in prompts}
    while engine.has_unfinished_requests():
        for o in engine.step():
            out[o.request_id][1].extend(o.new_token_ids)
        for row, rid in enumerate(engine.model_runner.last_logits_seqs):
            out[rid][0].append(engine.model_runner.last_logits[row].cpu())
        engine.model_runner.last_logits_seqs = []
    return out


def assert_set_is_what_it_claims(name: str, device: str) -> None:
    """Greedy fp32 decoding of the tiny model with set `name` against torch. A release (regression None) and a
    "slow" example must match torch within LOGIT_TOL at every step up to a near-tie flip (at least 4 steps per
    prompt); a "wrong" example must be caught: beyond LOGIT_TOL somewhere, and different greedy tokens."""
    from sits import kernels
    import torch

    regression = kernels.get_kernel_set(name).regression
    g = torch.Generator().manual_seed(0)
    prompts = {f"p{n}": torch.randint(0, 256, (n,), generator=g).tolist() for n in (1, 63, 64, 65, 200)}
    ref, got = greedy_logits("torch", prompts, device), greedy_logits(name, prompts, device)
    worst = 0.0
    for rid in prompts:
        compared = 0
        for step, (a, b) in enumerate(zip(ref[rid][0], got[rid][0])):
            err = float((a - b).abs().max())
            worst = max(worst, err)
            if regression != "wrong":
                assert err < LOGIT_TOL, (name, rid, step, err)
            compared += 1
            if ref[rid][1][step] != got[rid][1][step]:
                break  # a near-tie flipped a token: later steps see different inputs
        if regression != "wrong":
            assert compared >= 4, (name, rid, compared)
    if regression == "wrong":
        assert worst > LOGIT_TOL, f"{name} claims to be wrong, yet its logits stay within {worst:.4f} of torch's"
        assert any(ref[rid][1] != got[rid][1] for rid in prompts), f"{name} claims to be wrong: same tokens as torch"
