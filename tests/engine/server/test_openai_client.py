"""The real `openai` client against a running server: completions and chat, streaming and not."""

import asyncio
import math

import openai
import pytest

from sits.engine.server.main import system_fingerprint
from tests.engine.server.harness import http

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="sk-test", max_retries=0)


def _greedy(client, prompt, n):
    return client.completions.create(model="tiny", prompt=prompt, max_tokens=n, temperature=0,
                                     extra_body={"ignore_eos": True})


def test_completion_non_streaming_usage_and_length(client, server):
    r = _greedy(client, PROMPT, 12)
    n_prompt = len(server.state.runner.engine.tokenizer.encode(PROMPT))
    assert r.object == "text_completion" and r.model == "tiny" and r.id.startswith("cmpl-")
    assert r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (n_prompt, 12, n_prompt + 12)
    assert r.system_fingerprint == system_fingerprint(server.config.service)   # the service's, not the kernels'
    assert "torch" not in r.system_fingerprint
    assert r.usage.prompt_tokens_details.cached_tokens == 0  # shorter than one 64-token block: nothing to cache
    # greedy decoding is deterministic: the same request gives the same text
    assert _greedy(client, PROMPT, 12).choices[0].text == r.choices[0].text


def test_completion_streaming_matches_non_streaming(client):
    want = _greedy(client, PROMPT, 10).choices[0].text
    chunks = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=10, temperature=0, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == want
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10


def test_chat_non_streaming_and_streaming(client):
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi"}]
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.choices[0].message.role == "assistant" and r.usage.completion_tokens == 8
    stream = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0,
                                                 stream=True, stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True}))
    assert stream[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == r.choices[0].message.content
    assert stream[-1].usage.completion_tokens == 8 and stream[-1].usage.prompt_tokens == r.usage.prompt_tokens


def test_chat_template_is_applied(client, server):
    """The prompt the engine sees is the tokenizer's chat template over the messages."""
    messages = [{"role": "user", "content": "abc"}]
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=1)
    tok = server.state.runner.engine.tokenizer
    assert r.usage.prompt_tokens == len(tok.encode(tok.apply_chat_template(messages)))
    assert r.usage.prompt_tokens > len(tok.encode("abc"))


def test_seed_and_stop(client):
    kw = dict(model="tiny", prompt=PROMPT, max_tokens=24, temperature=1.0, extra_body={"ignore_eos": True})
    a = client.completions.create(seed=1234, **kw).choices[0].text
    b = client.completions.create(seed=1234, **kw).choices[0].text
    assert a == b
    # stop at the first occurrence of a character the unstopped output contains
    base = _greedy(client, PROMPT, 24).choices[0].text
    stop = next(ch for ch in base[3:] if ch.isprintable() and ch != "\ufffd")
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop],
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == base[:base.index(stop)]


def test_models_version_health(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    status, _, body = http("GET", server.url + "/version")
    import json

    v = json.loads(body)
    assert status == 200 and v["model"] == "tiny" and v["kernel_set"] == "torch"
    assert v["kernel_version"] == server.state.runner.engine.kernel_set.version and v["build"]
    assert http("GET", server.url + "/healthz")[0] == 200
    assert http("GET", server.url + "/readyz")[0] == 200


def test_32_simultaneous_streams_get_every_token(server):
    async def one(aclient, i):
        n = 8 + i  # every stream asks for a different count
        text, usage = [], None
        stream = await aclient.completions.create(model="tiny", prompt=f"stream {i}:", max_tokens=n, temperature=0,
                                                  stream=True, stream_options={"include_usage": True},
                                                  extra_body={"ignore_eos": True})
        async for chunk in stream:
            if chunk.choices:
                text.append(chunk.choices[0].text)
            if chunk.usage:
                usage = chunk.usage
        return n, "".join(text), usage

    async def run():
        aclient = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="sk-test", max_retries=0)
        try:
            return await asyncio.gather(*(one(aclient, i) for i in range(32)))
        finally:
            await aclient.close()

    results = asyncio.run(run())
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="sk-test", max_retries=0)
    for i, (n, text, usage) in enumerate(results):
        assert usage is not None and usage.completion_tokens == n
        if i % 8 == 0:  # spot-check content against the same request served alone
            assert text == _greedy(client, f"stream {i}:", n).choices[0].text


def test_completion_logprobs_are_the_model_distribution(client):
    """The sampled token is the argmax under greedy decoding, its logprob heads the top list, the top list is sorted
    and holds probabilities that sum to at most 1, and streaming carries the same numbers."""
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3,
                                  extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert lp.text_offset[0] == 0 and all(b >= a for a, b in zip(lp.text_offset, lp.text_offset[1:]))
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        vals = sorted(top.values(), reverse=True)
        assert 0 < len(top) <= 3 and chosen <= 0.0
        assert abs(vals[0] - chosen) < 1e-5   # greedy: the chosen token is the most likely one
        assert sum(math.exp(v) for v in vals) <= 1.0 + 1e-5
    chunks = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3,
                                            stream=True, extra_body={"ignore_eos": True}))
    streamed = [x for c in chunks if c.choices and c.choices[0].logprobs for x in c.choices[0].logprobs.token_logprobs]
    assert streamed == pytest.approx(lp.token_logprobs, abs=1e-6)


def test_chat_logprobs_and_top_logprobs(client):
    messages = [{"role": "user", "content": "Say hi"}]
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=5, temperature=0, logprobs=True,
                                       top_logprobs=2, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == 5
    for t in content:
        assert len(t.top_logprobs) == 2 and t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob
        assert abs(t.top_logprobs[0].logprob - t.logprob) < 1e-5 and bytes(t.bytes).decode("utf-8") == t.token
    plain = client.chat.completions.create(model="tiny", messages=messages, max_tokens=5, temperature=0,
                                           extra_body={"ignore_eos": True})
    assert plain.choices[0].logprobs is None
    assert plain.choices[0].message.content == r.choices[0].message.content   # asking for logprobs changes nothing
