"""Request validation: table tests over literal bodies (no server)."""

import pytest

from sits.engine.server.errors import APIError
from sits.engine.server.protocol import parse_chat, parse_completion, parse_json_body, parse_tenant


def test_completion_defaults_and_fields():
    r = parse_completion({"model": "tiny", "prompt": "hi", "stop": "\n", "seed": 7, "temperature": 0,
                          "top_p": 0.5, "stream": True, "stream_options": {"include_usage": True}, "n": 1})
    assert (r.kind, r.prompt, r.max_tokens, r.stop, r.seed) == ("completion", "hi", 16, ["\n"], 7)
    assert (r.temperature, r.top_p, r.stream, r.include_usage) == (0.0, 0.5, True, True)
    assert parse_completion({"model": "m", "prompt": [[1, 2, 3]]}).prompt == [1, 2, 3]
    assert parse_completion({"model": "m", "prompt": ["x"]}).prompt == "x"
    assert parse_completion({"model": "m", "prompt": "x", "top_k": -1}).top_k == 0


def test_chat_messages_and_max_tokens():
    r = parse_chat({"model": "m", "messages": [{"role": "developer", "content": "be brief"},
                                               {"role": "user", "content": [{"type": "text", "text": "a"},
                                                                            {"type": "text", "text": "b"}]}],
                    "max_completion_tokens": 5})
    assert r.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "ab"}]
    assert r.max_tokens == 5
    assert parse_chat({"model": "m", "messages": [{"role": "user", "content": "x"}]}).max_tokens is None
    # include_usage only means something when streaming
    assert not parse_chat({"model": "m", "messages": [{"role": "user", "content": "x"}],
                           "stream_options": {"include_usage": True}}).include_usage


BAD_COMPLETIONS = [
    ({"prompt": "x"}, "model"),
    ({"model": 3, "prompt": "x"}, "model"),
    ({"model": "m"}, "prompt"),
    ({"model": "m", "prompt": ""}, "prompt"),
    ({"model": "m", "prompt": 5}, "prompt"),
    ({"model": "m", "prompt": ["a", "b"]}, "prompt"),
    ({"model": "m", "prompt": [1, -2]}, "prompt"),
    ({"model": "m", "prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"model": "m", "prompt": "x", "max_tokens": -3}, "max_tokens"),
    ({"model": "m", "prompt": "x", "max_tokens": "10"}, "max_tokens"),
    ({"model": "m", "prompt": "x", "max_tokens": 1.5}, "max_tokens"),
    ({"model": "m", "prompt": "x", "max_tokens": True}, "max_tokens"),
    ({"model": "m", "prompt": "x", "temperature": -0.1}, "temperature"),
    ({"model": "m", "prompt": "x", "temperature": "hot"}, "temperature"),
    ({"model": "m", "prompt": "x", "top_p": 0}, "top_p"),
    ({"model": "m", "prompt": "x", "top_p": 1.5}, "top_p"),
    ({"model": "m", "prompt": "x", "seed": "1"}, "seed"),
    ({"model": "m", "prompt": "x", "stop": [""]}, "stop"),
    ({"model": "m", "prompt": "x", "stop": 3}, "stop"),
    ({"model": "m", "prompt": "x", "stream": "yes"}, "stream"),
    ({"model": "m", "prompt": "x", "n": 2}, "n"),
    ({"model": "m", "prompt": "x", "n": True}, "n"),
    ({"model": "m", "prompt": "x", "best_of": 3}, "best_of"),
    ({"model": "m", "prompt": "x", "echo": True, "stream": True}, "echo"),   # echo is supported, not streamed
    ({"model": "m", "prompt": "x", "echo": "yes"}, "echo"),
    ({"model": "m", "prompt": "x", "echo": False, "max_tokens": 0}, "max_tokens"),
    ({"model": "m", "prompt": "x", "echo": True, "max_tokens": -1}, "max_tokens"),
    ({"model": "m", "prompt": "x", "return_tokens_as_token_ids": 1}, "return_tokens_as_token_ids"),
    ({"model": "m", "prompt": "x", "logit_bias": {"1": 5}}, "logit_bias"),
    ({"model": "m", "prompt": "x", "presence_penalty": 0.5}, "presence_penalty"),
    ({"model": "m", "prompt": "x", "logprobs": 21}, "logprobs"),
    ({"model": "m", "prompt": "x", "logprobs": -1}, "logprobs"),
    ({"model": "m", "prompt": "x", "logprobs": True}, "logprobs"),
    ({"model": "m", "prompt": "x", "stream_options": "usage"}, "stream_options"),
    ({"model": "m", "prompt": "x", "stop_token_ids": [1, "2"]}, "stop_token_ids"),
]


@pytest.mark.parametrize("body,param", BAD_COMPLETIONS)
def test_bad_completion_bodies_name_the_field(body, param):
    with pytest.raises(APIError) as e:
        parse_completion(body)
    assert e.value.status == 400 and e.value.param == param, e.value.message


BAD_CHATS = [
    ({"model": "m"}, "messages"),
    ({"model": "m", "messages": []}, "messages"),
    ({"model": "m", "messages": "hi"}, "messages"),
    ({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}, "messages"),
    ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "messages"),
    ({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": 3}, "logprobs"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}, "top_logprobs"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21},
     "top_logprobs"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0},
     "max_completion_tokens"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}},
     "response_format"),
]


@pytest.mark.parametrize("body,param", BAD_CHATS)
def test_bad_chat_bodies_name_the_field(body, param):
    with pytest.raises(APIError) as e:
        parse_chat(body)
    assert e.value.status == 400 and e.value.param == param, e.value.message


@pytest.mark.parametrize("raw", [b"", b"{", b"[1, 2]", b"\xff\xfe", b'"text"'])
def test_malformed_json(raw):
    with pytest.raises(APIError) as e:
        parse_json_body(raw)
    assert e.value.status == 400


def test_tenant_headers():
    assert parse_tenant({}) == ("default", 0)
    assert parse_tenant({"x-sits-tenant": "team-a", "x-sits-priority": "3"}) == ("team-a", 3)
    for headers in ({"x-sits-priority": "4"}, {"x-sits-priority": "-1"}, {"x-sits-priority": "high"},
                    {"x-sits-tenant": "a b"}, {"x-sits-tenant": "x" * 65}):
        with pytest.raises(APIError):
            parse_tenant(headers)


def test_logprobs_fields_parse():
    assert parse_completion({"model": "m", "prompt": "x"}).logprobs is None
    assert parse_completion({"model": "m", "prompt": "x", "logprobs": 0}).logprobs == 0
    assert parse_completion({"model": "m", "prompt": "x", "logprobs": 5}).logprobs == 5
    msgs = [{"role": "user", "content": "x"}]
    assert parse_chat({"model": "m", "messages": msgs}).logprobs is None
    assert parse_chat({"model": "m", "messages": msgs, "logprobs": False}).logprobs is None
    assert parse_chat({"model": "m", "messages": msgs, "logprobs": True}).logprobs == 0
    assert parse_chat({"model": "m", "messages": msgs, "logprobs": True, "top_logprobs": 4}).logprobs == 4
