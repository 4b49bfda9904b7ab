"""Scoring a given text over HTTP (OpenAI `echo` + `logprobs`, token-id prompts, vLLM's token-id extensions) and
correctness probes (X-SITS-Probe: 1) kept out of every latency histogram."""
import json

import openai
import pytest

from tests.engine.server.harness import http, sample

PROMPT = "Teacher forcing feeds the model a given continuation"
ENG = {"env": "test", "service": "engine-under-test"}


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="sk-test", max_retries=0)


def _post(server, body, headers=None):
    status, _, payload = http("POST", server.url + "/v1/completions", {"model": "tiny", **body}, headers)
    assert status == 200, payload
    return json.loads(payload)


def _id(token: str) -> int:
    assert token.startswith("token_id:")
    return int(token.removeprefix("token_id:"))


def test_echo_scores_a_continuation_as_its_generation_did(server, client):
    gen = _post(server, {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "logprobs": 3, "ignore_eos": True,
                         "return_tokens_as_token_ids": True, "return_token_ids": True})["choices"][0]
    prompt_ids, out_ids = gen["prompt_token_ids"], gen["token_ids"]
    assert len(out_ids) == 8 and [_id(t) for t in gen["logprobs"]["tokens"]] == out_ids
    # the openai client, a token-id prompt, echo and max_tokens 0: the prompt scored, nothing generated
    r = client.completions.create(model="tiny", prompt=prompt_ids + out_ids, max_tokens=0, echo=True, logprobs=3,
                                  temperature=0, extra_body={"return_tokens_as_token_ids": True})
    lp = r.choices[0].logprobs
    assert r.usage.completion_tokens == 0 and r.usage.prompt_tokens == len(prompt_ids) + 8
    assert [_id(t) for t in lp.tokens] == prompt_ids + out_ids
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None   # nothing precedes the first token
    assert r.choices[0].text == server.state.runner.engine.tokenizer.decode(prompt_ids + out_ids)
    scored = lp.token_logprobs[len(prompt_ids):]
    for s, g in zip(scored, gen["logprobs"]["token_logprobs"], strict=True):
        assert abs(s - g) < 1e-5
    for top_s, top_g in zip(lp.top_logprobs[len(prompt_ids):], gen["logprobs"]["top_logprobs"], strict=True):
        assert list(top_s) == list(top_g) and len(top_s) == 3


def test_echo_with_generation_prefixes_the_prompt(server):
    c = _post(server, {"prompt": "Hi there", "max_tokens": 3, "temperature": 0, "echo": True, "logprobs": 0,
                       "ignore_eos": True})["choices"][0]
    plain = _post(server, {"prompt": "Hi there", "max_tokens": 3, "temperature": 0, "ignore_eos": True})
    assert c["text"] == "Hi there" + plain["choices"][0]["text"]
    n_prompt = len(server.state.runner.engine.tokenizer.encode("Hi there"))
    assert len(c["logprobs"]["tokens"]) == n_prompt + 3 and c["logprobs"]["token_logprobs"][0] is None


def test_version_reports_the_compute_dtype(server):
    v = json.loads(http("GET", server.url + "/version")[2])
    assert v["dtype"] == "float32" and v["quantization"] is None and v["kv_cache_dtype"] == "auto"


def test_probe_requests_stay_out_of_every_latency_histogram(server):
    kv = server.state.runner.engine.kernel_set.version
    before = server.metrics()
    for _ in range(3):
        _post(server, {"prompt": "probe", "max_tokens": 4, "temperature": 0, "logprobs": 2},
              headers={"X-SITS-Probe": "1"})
    _post(server, {"prompt": [256, 65, 66], "max_tokens": 0, "echo": True, "logprobs": 1},
          headers={"X-SITS-Probe": "1"})
    assert http("POST", server.url + "/v1/completions", {"model": "nope", "prompt": "x"},
                {"X-SITS-Probe": "1"})[0] == 404
    _post(server, {"prompt": "real traffic", "max_tokens": 2, "temperature": 0})   # one ordinary request
    after = server.metrics()

    def delta(family, name, **lbl):
        return sample(after, family, name, **lbl) - sample(before, family, name, **lbl)

    assert delta("http_request_duration_seconds", "http_request_duration_seconds_count", route="/v1/completions",
                 **ENG) == 1
    for family in ("sits_time_to_first_token_seconds", "sits_e2e_request_latency_seconds",
                   "sits_queue_time_seconds"):
        assert delta(family, family + "_count", kernel_version=kv, **ENG) == 1, family
    assert delta("sits_inter_token_latency_seconds", "sits_inter_token_latency_seconds_count", kernel_version=kv,
                 **ENG) == 1
    assert delta("sits_request_errors", "sits_request_errors_total", **ENG) == 0   # the probe's 404 is not counted
    assert delta("sits_probe_requests", "sits_probe_requests_total", status="200", **ENG) == 4
    assert delta("sits_probe_requests", "sits_probe_requests_total", status="404", **ENG) == 1
