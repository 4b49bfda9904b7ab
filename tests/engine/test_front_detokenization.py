"""Text decoded outside the engine (the API server does it for the engine-core process: engine/model/tokenizer.py
IncrementalDetokenizer) is the text the engine itself produces, byte for byte, held-back partial UTF-8 included."""

from sits.engine import EngineConfig, LLMEngine, SamplingParams
from sits.engine.model.tokenizer import IncrementalDetokenizer
from tests.engine.helpers import run_to_completion


def test_decoding_outside_the_engine_gives_the_engines_text():
    engine = LLMEngine(EngineConfig(model="tiny", max_num_seqs=16))
    prompts = {f"r{i}": f"naïve café {i} — ünïcödé ☃ " * (1 + i % 3) for i in range(6)}
    params = [SamplingParams(max_tokens=24 + i, temperature=1.0, seed=i, ignore_eos=i % 2 == 0) for i in range(6)]
    for (rid, prompt), p in zip(prompts.items(), params):
        engine.add_request(rid, prompt, p)
    inside = run_to_completion(engine)
    prompt_ids = {rid: engine.tokenizer.encode(p) for rid, p in prompts.items()}
    for (rid, prompt), p in zip(prompts.items(), params):
        engine.add_request(rid + "-front", prompt, p, detokenize=False)
    outside = run_to_completion(engine)
    assert any("\ufffd" in r["text"] or any(ord(c) > 127 for c in r["text"]) for r in inside.values())
    for rid in prompts:
        got = outside[rid + "-front"]
        assert got["tokens"] == inside[rid]["tokens"]
        assert got["text"] == ""   # the engine left the text to the caller
        d = IncrementalDetokenizer(engine.tokenizer, prompt_ids[rid])
        text = "".join(d.add(o.new_token_ids, final=o.finished) for o in got["outputs"])
        assert text == inside[rid]["text"], rid


def test_stop_strings_are_still_decoded_in_the_engine():
    engine = LLMEngine(EngineConfig(model="tiny"))
    p = SamplingParams(max_tokens=30, temperature=1.0, seed=3, ignore_eos=True)
    engine.add_request("free", "stop here", p)
    free = run_to_completion(engine)["free"]["text"]
    stop = free[5:7]
    engine.add_request("stopped", "stop here", SamplingParams(max_tokens=30, temperature=1.0, seed=3,
                                                               ignore_eos=True, stop=[stop]), detokenize=False)
    r = run_to_completion(engine)["stopped"]
    assert r["finish_reason"] == "stop" and r["text"] == free[:free.index(stop)]
