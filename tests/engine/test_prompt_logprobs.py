"""SamplingParams.prompt_logprobs: the engine scores a given text (teacher forcing), chunk by chunk, never from the
prefix cache, with the same numbers the sampler reports when it generates that text."""
import pytest

from sits.engine import LLM, SamplingParams
from sits.engine.errors import InvalidRequestError

PROMPT = "Scoring goes past one KV block of sixty-four tokens, so chunked prefill splits it over steps."


@pytest.fixture(scope="module")
def llm():
    return LLM(model="tiny", kernels="torch", max_num_batched_tokens=48)   # 48: chunks split the prompt


def test_scoring_a_continuation_reproduces_its_generation(llm):
    gen = llm.generate([PROMPT], SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, logprobs=3),
                       use_tqdm=False)[0]
    ids = llm.tokenizer.encode(PROMPT)
    full = ids + gen.token_ids
    for attempt in range(2):   # the second time every block is in the prefix cache: still scored in full
        r = llm.generate([full], SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=3),
                         use_tqdm=False)[0]
        assert r.num_cached_tokens == 0
        assert [e["token_id"] for e in r.prompt_logprobs] == full[1:]
        tail = r.prompt_logprobs[len(ids) - 1:]
        for scored, generated in zip(tail, gen.logprobs, strict=True):
            assert abs(scored["logprob"] - generated["logprob"]) < 1e-5
            assert [t for t, _ in scored["top_logprobs"]] == [t for t, _ in generated["top_logprobs"]]
            assert scored["top_logprobs"][0][0] == generated["token_id"]   # greedy: the generated token is top-1
        assert all(len(e["top_logprobs"]) == 3 and e["logprob"] <= e["top_logprobs"][0][1] + 1e-6
                   for e in r.prompt_logprobs)


def test_prompt_logprobs_stay_off_unless_asked(llm):
    r = llm.generate([PROMPT], SamplingParams(max_tokens=2, temperature=0.0), use_tqdm=False)[0]
    assert r.prompt_logprobs is None
    r = llm.generate([[256, 65]], SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0),
                     use_tqdm=False)[0]
    assert len(r.prompt_logprobs) == 1 and r.prompt_logprobs[0]["token_id"] == 65
    assert r.prompt_logprobs[0]["top_logprobs"] == []


@pytest.mark.parametrize("bad", [-1, 21, True, 1.5])
def test_prompt_logprobs_is_validated(bad):
    with pytest.raises(InvalidRequestError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=bad)
