"""Sampler math (greedy, temperature, top-k, top-p, seeds, logprobs) and the engine's stop handling."""

import math

import pytest
import torch

from sits.engine import EngineConfig, LLMEngine, SamplingParams
from sits.engine.model.layers.sampler import Sampler
from sits.engine.model.loader import write_tiny
from tests.engine.helpers import run_to_completion

LOGITS = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))


def draws(params: SamplingParams, n: int = 400, logits=LOGITS) -> list[int]:
    sampler = Sampler(torch.device("cpu"), seed=0)
    return sampler(logits.repeat(n, 1), [params] * n, [None] * n)[0]


def test_greedy_and_top_k_1_take_the_argmax():
    assert set(draws(SamplingParams(temperature=0.0))) == {0}
    assert set(draws(SamplingParams(temperature=5.0, top_k=1))) == {0}


def test_temperature_sampling_follows_the_distribution():
    toks = draws(SamplingParams(temperature=1.0), n=4000)
    freq = [toks.count(i) / len(toks) for i in range(4)]
    assert all(abs(f - p) < 0.03 for f, p in zip(freq, [0.5, 0.3, 0.15, 0.05])), freq
    hot = draws(SamplingParams(temperature=3.0), n=4000)  # flatter: the rare token shows up far more often
    assert hot.count(3) / 4000 > 0.12


def test_top_k_and_top_p_restrict_the_candidates():
    assert set(draws(SamplingParams(top_k=2))) == {0, 1}
    # nucleus 0.7: token 0 (0.5) is kept, token 1 completes the mass (0.8), tokens 2 and 3 are dropped
    assert set(draws(SamplingParams(top_p=0.7))) == {0, 1}
    assert set(draws(SamplingParams(top_p=0.4))) == {0}
    assert set(draws(SamplingParams(top_k=3, top_p=0.9))) == {0, 1, 2}


def test_a_seeded_row_does_not_depend_on_the_rest_of_the_batch():
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    seeded = SamplingParams(temperature=1.0, seed=1234)
    alone, mixed = Sampler(torch.device("cpu"), 0), Sampler(torch.device("cpu"), 99)
    g_alone, g_mixed = alone.new_generator(1234), mixed.new_generator(1234)
    others = [SamplingParams(temperature=0.7), SamplingParams(temperature=0.0), SamplingParams(top_k=5, seed=7)]
    a, b = [], []
    for _ in range(20):
        a += alone(logits[2:3], [seeded], [g_alone])[0]
        out = mixed(logits[[0, 1, 2, 3]], others[:2] + [seeded, others[2]], [None, None, g_mixed, None])[0]
        b.append(out[2])
    assert a == b and len(set(a)) > 1


def test_logprobs_are_the_model_distribution():
    logits = torch.randn(2, 30, generator=torch.Generator().manual_seed(1))
    params = [SamplingParams(temperature=0.0, logprobs=3), SamplingParams(temperature=0.0)]
    tokens, lps = Sampler(torch.device("cpu"), 0)(logits, params, [None, None])
    ref = logits.log_softmax(-1)
    assert lps[1] is None
    assert lps[0]["token_id"] == tokens[0] == int(ref[0].argmax())
    assert math.isclose(lps[0]["logprob"], float(ref[0, tokens[0]]), abs_tol=1e-6)
    top = ref[0].topk(3)
    assert [i for i, _ in lps[0]["top_logprobs"]] == top.indices.tolist()
    assert all(math.isclose(v, w, abs_tol=1e-6) for (_, v), w in zip(lps[0]["top_logprobs"], top.values.tolist()))


# ---- through the engine ---------------------------------------------------------------------------------------
def make_engine(model="tiny", **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(model), device="cpu", dtype="float32", num_kv_blocks=32, **kw))


def generate(engine, requests: dict[str, tuple[str, SamplingParams]]) -> dict:
    for rid, (text, params) in requests.items():
        engine.add_request(rid, text, params)
    return run_to_completion(engine)


SEEDED = SamplingParams(max_tokens=40, temperature=1.0, seed=2024, ignore_eos=True)


@pytest.fixture(scope="module")
def engine():
    return make_engine()


@pytest.fixture(scope="module")
def seeded_alone(engine):
    return generate(engine, {"s": ("Tell me a story", SEEDED)})["s"]


def test_same_seed_same_text_regardless_of_batch(engine, seeded_alone):
    busy = {f"o{i}": (f"other prompt {i}" * (i + 1), SamplingParams(max_tokens=30, temperature=0.9))
            for i in range(5)}
    busy["s"] = ("Tell me a story", SEEDED)
    busy["d"] = ("Tell me a story", SamplingParams(max_tokens=40, temperature=1.0, seed=2025, ignore_eos=True))
    res = generate(engine, busy)
    assert res["s"]["tokens"] == seeded_alone["tokens"] and res["s"]["text"] == seeded_alone["text"]
    assert res["d"]["tokens"] != seeded_alone["tokens"]  # another seed, another sample


def test_stop_string_cuts_the_text_and_is_never_streamed(engine, seeded_alone):
    text = seeded_alone["text"]
    start = next(i for i in range(8, len(text) - 3) if "\ufffd" not in text[i:i + 3])
    stop = text[start:start + 3]
    expected = text[:text.find(stop)]
    res = generate(engine, {"x": ("Tell me a story", SamplingParams(max_tokens=40, temperature=1.0, seed=2024,
                                                                      stop=["never-there", stop]))})["x"]
    assert res["finish_reason"] == "stop"
    assert res["text"] == expected
    assert all(stop not in o.new_text for o in res["outputs"])


def test_stop_token_ids_and_max_tokens(engine, seeded_alone):
    toks = seeded_alone["tokens"]
    stop_tok = toks[5]
    res = generate(engine, {"x": ("Tell me a story", SamplingParams(max_tokens=40, temperature=1.0, seed=2024,
                                                                      stop_token_ids=[stop_tok]))})["x"]
    assert res["finish_reason"] == "stop"
    assert res["tokens"] == toks[:toks.index(stop_tok) + 1]
    res = generate(engine, {"y": ("Tell me a story", SamplingParams(max_tokens=7, temperature=1.0, seed=2024))})["y"]
    assert res["finish_reason"] == "length" and res["tokens"] == toks[:7]
    assert res["outputs"][-1].num_output_tokens == 7


def test_eos_stops_unless_ignored(tmp_path, seeded_alone):
    eos = seeded_alone["tokens"][3]
    ckpt = write_tiny(tmp_path / "eos", eos_token_id=[eos])
    eng = make_engine(ckpt)
    params = dict(max_tokens=40, temperature=1.0, seed=2024)
    res = generate(eng, {"a": ("Tell me a story", SamplingParams(**params)),
                         "b": ("Tell me a story", SamplingParams(**params, ignore_eos=True))})
    assert res["a"]["finish_reason"] == "stop" and res["a"]["tokens"][-1] == eos
    assert len(res["a"]["tokens"]) <= 4
    assert res["b"]["finish_reason"] == "length" and res["b"]["tokens"] == seeded_alone["tokens"]


def test_engine_logprobs_match_the_logits(engine):
    engine.model_runner.capture_logits = True
    try:
        engine.add_request("lp", "logprobs please", SamplingParams(max_tokens=1, temperature=0.0, logprobs=2))
        outs = engine.step()
        logits = engine.model_runner.last_logits[0]
    finally:
        engine.model_runner.capture_logits = False
    (out,) = outs
    assert out.finished and out.logprobs and len(out.logprobs) == 1
    lp = out.logprobs[0]
    ref = logits.log_softmax(-1)
    assert lp["token_id"] == out.new_token_ids[0] == int(ref.argmax())
    assert math.isclose(lp["logprob"], float(ref.max()), abs_tol=1e-5)
    assert [i for i, _ in lp["top_logprobs"]] == ref.topk(2).indices.tolist()
