"""Validation of OpenAI /v1/completions and /v1/chat/completions bodies into one `GenerationRequest`.

Every problem raises `APIError(400, ..., param=field)`; nothing here touches the engine. Length checks against the
context need the tokenizer and live in the handler.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from sits.engine.sampling_params import MAX_STOP_TOKEN_IDS
from sits.engine.server.errors import APIError

MAX_STOP_STRINGS = 16
MAX_LOGPROBS = 20
PRIORITIES = range(0, 4)
_PRIORITY_TEXT = {str(p) for p in PRIORITIES}
_TENANT_RE = re.compile(r"^[A-Za-z0-9_.:@-]{1,64}$")
CHAT_ROLES = ("system", "developer", "user", "assistant")
MAX_JSON_DEPTH = 16           # the deepest valid body (messages[i].content[j].text) is 4 levels
INT_MIN, INT_MAX = -(2 ** 63), 2 ** 64 - 1
_SURROGATE = re.compile("[\ud800-\udfff]")

# fields the engine cannot honour: the request is refused unless the value is the neutral default
_UNSUPPORTED_NEUTRAL = {
    "n": (None, 1), "best_of": (None, 1), "suffix": (None, ""),
    "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0), "logit_bias": (None, {}),
    "tools": (None, []), "functions": (None, []),
    "tool_choice": (None, "none"), "function_call": (None, "none"), "audio": (None,), "modalities": (None, ["text"]),
}


def _bad(message: str, param: str | None) -> APIError:
    return APIError(400, message, param=param)


@dataclass(slots=True)
class GenerationRequest:
    kind: str                      # "completion" | "chat"
    model: str
    prompt: str | list[int]        # chat: the rendered chat template is filled in by the handler
    messages: list[dict[str, str]] = field(default_factory=list)
    max_tokens: int | None = None  # None: fill the rest of the context
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    stream: bool = False
    include_usage: bool = False
    logprobs: int | None = None    # None: off; N: the sampled token's logprob plus the N most likely alternatives
    echo: bool = False             # completions: the prompt is part of the answer (and of logprobs: it is scored)
    tokens_as_ids: bool = False    # return_tokens_as_token_ids (vLLM's extension): logprob tokens as "token_id:N"
    return_token_ids: bool = False  # vLLM's extension: the choice carries prompt_token_ids and token_ids

    def __post_init__(self) -> None:
        if self.kind not in ("completion", "chat"):
            raise ValueError(f"kind must be 'completion' or 'chat', got {self.kind!r}")


def parse_json_body(raw: bytes) -> dict[str, Any]:
    if not raw:
        raise _bad("request body is empty; expected a JSON object", None)
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as e:   # JSONDecodeError, bad UTF-8, a 4300+ digit integer, deep nesting
        raise _bad(f"request body is not valid JSON: {_short(e)}", None) from None
    if not isinstance(body, dict):
        raise _bad(f"request body must be a JSON object, got {type(body).__name__}", None)
    _check_values(body)
    return body


def _short(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return text if len(text) <= 200 else text[:200] + "..."


def _check_values(body: Any) -> None:
    """Reject what json.loads accepts but nothing downstream can use: nesting deeper than MAX_JSON_DEPTH, strings
    with lone surrogates (not encodable as UTF-8), integers outside 64 bits. A list is checked per kind of item (one
    pass over the types, then min/max or one regex over its strings): a 16 MB list of numbers takes a fraction of a
    second, not seconds of per-item Python."""
    stack = [(body, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, str):
            _check_strings((v,))
        elif isinstance(v, bool) or v is None or isinstance(v, float):
            continue
        elif isinstance(v, int):
            _check_ints((v,))
        else:
            if depth > MAX_JSON_DEPTH:
                raise _bad(f"request body is nested deeper than {MAX_JSON_DEPTH} levels", None)
            if isinstance(v, dict):
                _check_strings(v.keys())
                stack.append((list(v.values()), depth))   # the values are checked as a list one level down
                continue
            kinds = set(map(type, v))   # json.loads makes exactly dict, list, str, int, float, bool and None
            if int in kinds:
                _check_ints(v if kinds <= {int, bool} else [x for x in v if type(x) is int])
            if str in kinds:
                _check_strings([x for x in v if type(x) is str])
            if dict in kinds or list in kinds:
                stack.extend((x, depth + 1) for x in v if type(x) in (dict, list))


def _check_strings(strings: Any) -> None:
    # lone surrogates only come from escapes; a separator keeps two strings from pairing up
    if _SURROGATE.search("\0".join(strings)):
        raise _bad("request body has a string with a lone UTF-16 surrogate (not valid Unicode text)", None)


def _check_ints(ints: Any) -> None:
    if ints and (min(ints) < INT_MIN or max(ints) > INT_MAX):
        bad = next(x for x in ints if not INT_MIN <= x <= INT_MAX)
        raise _bad(f"request body has an integer outside the 64-bit range: {_short(ValueError(bad))}", None)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(body: dict, name: str, default: float, lo: float, hi: float, *, lo_open: bool = False) -> float:
    v = body.get(name)
    if v is None:
        return default
    if not (isinstance(v, (int, float)) and not isinstance(v, bool)) or not math.isfinite(v):
        raise _bad(f"'{name}' must be a number, got {json.dumps(v)}", name)
    if v < lo or v > hi or (lo_open and v == lo):
        raise _bad(f"'{name}' must be in {'(' if lo_open else '['}{lo}, {hi}], got {v}", name)
    return float(v)


def _optional_int(body: dict, name: str, lo: int | None = None) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if not _is_int(v):
        raise _bad(f"'{name}' must be an integer, got {json.dumps(v)}", name)
    if lo is not None and v < lo:
        raise _bad(f"'{name}' must be >= {lo}, got {v}", name)
    return v


def _bool(body: dict, name: str, default: bool = False) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise _bad(f"'{name}' must be a boolean, got {json.dumps(v)}", name)
    return v


def _stop(body: dict) -> list[str]:
    v = body.get("stop")
    if v is None:
        return []
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) and s for s in v):
        raise _bad("'stop' must be a non-empty string or a list of non-empty strings", "stop")
    if len(v) > MAX_STOP_STRINGS:
        raise _bad(f"'stop' has {len(v)} strings; at most {MAX_STOP_STRINGS} are allowed", "stop")
    return list(v)


def _token_ids(v: Any, name: str, limit: int | None = None) -> list[int]:
    if not isinstance(v, list):
        raise _bad(f"'{name}' must be a list of non-negative integer token ids", name)
    if limit is not None and len(v) > limit:   # before looking at the items: a huge list is refused in O(1)
        raise _bad(f"'{name}' has {len(v)} ids; at most {limit} are allowed", name)
    if not all(_is_int(t) and t >= 0 for t in v):
        raise _bad(f"'{name}' must be a list of non-negative integer token ids", name)
    return list(v)


def _check_unsupported(body: dict) -> None:
    for name, neutral in _UNSUPPORTED_NEUTRAL.items():
        v = body.get(name)
        if v is None:
            continue
        if not any(v == n and type(v) is type(n) for n in neutral if n is not None):
            raise _bad(f"'{name}' = {json.dumps(v)} is not supported by this server", name)
    rf = body.get("response_format")
    if rf is not None and rf != {"type": "text"}:
        raise _bad("only response_format {\"type\": \"text\"} is supported", "response_format")


def _logprobs(body: dict, kind: str) -> int | None:
    """completions: `logprobs` = N (0..20); chat: `logprobs` true plus optional `top_logprobs` = N (0..20)."""
    if kind == "completion":
        return _optional_int_in(body, "logprobs", 0, MAX_LOGPROBS)
    on = _bool(body, "logprobs")
    top = _optional_int_in(body, "top_logprobs", 0, MAX_LOGPROBS)
    if top is not None and not on:
        raise _bad("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    return (top or 0) if on else None


def _optional_int_in(body: dict, name: str, lo: int, hi: int) -> int | None:
    v = _optional_int(body, name, lo=lo)
    if v is not None and v > hi:
        raise _bad(f"'{name}' must be at most {hi}, got {v}", name)
    return v


def _common(body: dict, kind: str, prompt: str | list[int], messages: list[dict[str, str]]) -> GenerationRequest:
    model = body.get("model")
    if model is None:
        raise _bad("'model' is required", "model")
    if not isinstance(model, str) or not model:
        raise _bad(f"'model' must be a non-empty string, got {json.dumps(model)}", "model")
    _check_unsupported(body)
    max_tokens = _optional_int(body, "max_tokens")
    if kind == "chat" and body.get("max_completion_tokens") is not None:
        max_tokens = _optional_int(body, "max_completion_tokens")
        param = "max_completion_tokens"
    else:
        param = "max_tokens"
    echo = kind == "completion" and _bool(body, "echo")
    if kind == "chat" and body.get("echo") not in (None, False):
        raise _bad(f"'echo' = {json.dumps(body['echo'])} is not supported by this server", "echo")
    if max_tokens is not None and (max_tokens < 0 or (max_tokens == 0 and not echo)):
        raise _bad(f"'{param}' must be a positive integer (0 only with 'echo': true), got {max_tokens}", param)
    if max_tokens is None and kind == "completion":
        max_tokens = 16  # OpenAI's default for legacy completions
    top_k = _optional_int(body, "top_k", lo=-1)
    stop_token_ids = body.get("stop_token_ids")
    stream = _bool(body, "stream")
    if stream and kind == "completion" and body.get("echo") is True:
        raise _bad("'echo' is not supported with 'stream': true; score a text without streaming", "echo")
    opts = body.get("stream_options")
    if opts is not None and (not isinstance(opts, dict) or not isinstance(opts.get("include_usage", False), bool)):
        raise _bad("'stream_options' must be an object like {\"include_usage\": true}", "stream_options")
    return GenerationRequest(
        kind=kind, model=model, prompt=prompt, messages=messages, max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
        top_k=0 if top_k in (None, -1) else top_k,
        seed=_optional_int(body, "seed"),
        stop=_stop(body),
        stop_token_ids=[] if stop_token_ids is None else _token_ids(stop_token_ids, "stop_token_ids",
                                                                    MAX_STOP_TOKEN_IDS),
        ignore_eos=_bool(body, "ignore_eos"),
        stream=stream,
        include_usage=bool(stream and opts and opts.get("include_usage")),
        logprobs=_logprobs(body, kind),
        echo=echo,
        tokens_as_ids=_bool(body, "return_tokens_as_token_ids"),
        return_token_ids=_bool(body, "return_token_ids"),
    )


def parse_completion(body: dict[str, Any]) -> GenerationRequest:
    if "prompt" not in body or body["prompt"] is None:
        raise _bad("'prompt' is required", "prompt")
    p = body["prompt"]
    # one prompt only (n=1, no batches): a string, a token-id list, or a one-element list of either
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]
    if isinstance(p, list) and p and all(isinstance(x, (str, list)) for x in p):
        raise _bad("batched prompts are not supported; send one prompt per request", "prompt")
    if isinstance(p, str):
        prompt: str | list[int] = p
    elif isinstance(p, list):
        prompt = _token_ids(p, "prompt")
    else:
        raise _bad(f"'prompt' must be a string or a list of token ids, got {type(p).__name__}", "prompt")
    if len(prompt) == 0:
        raise _bad("'prompt' must not be empty", "prompt")
    return _common(body, "completion", prompt, [])


def _message_text(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise _bad(f"messages[{i}].content: only text parts ({{\"type\": \"text\", \"text\": ...}}) are "
                           "supported", "messages")
            parts.append(part["text"])
        return "".join(parts)
    raise _bad(f"messages[{i}].content must be a string or a list of text parts", "messages")


def parse_chat(body: dict[str, Any]) -> GenerationRequest:
    msgs = body.get("messages")
    if msgs is None:
        raise _bad("'messages' is required", "messages")
    if not isinstance(msgs, list) or not msgs:
        raise _bad("'messages' must be a non-empty list of {role, content} objects", "messages")
    messages = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise _bad(f"messages[{i}] must be an object with 'role' and 'content'", "messages")
        role = m.get("role")
        if role not in CHAT_ROLES:
            raise _bad(f"messages[{i}].role must be one of {', '.join(CHAT_ROLES)}, got {json.dumps(role)}",
                       "messages")
        messages.append({"role": "system" if role == "developer" else role,
                         "content": _message_text(m.get("content"), i)})
    return _common(body, "chat", "", messages)


def parse_tenant(headers: Any, default_tenant: str = "default") -> tuple[str, int]:
    """(tenant, priority) from X-SITS-Tenant / X-SITS-Priority."""
    tenant = headers.get("x-sits-tenant", default_tenant).strip()
    if not _TENANT_RE.match(tenant):
        raise _bad("X-SITS-Tenant must be 1-64 characters of letters, digits and _.:@-", "X-SITS-Tenant")
    raw = headers.get("x-sits-priority", "0").strip()
    if raw not in _PRIORITY_TEXT:   # exact text: no int() of a 5,000-digit or non-ASCII-digit header
        raise _bad(f"X-SITS-Priority must be an integer {PRIORITIES.start}..{PRIORITIES.stop - 1}, got "
                   f"{_short(ValueError(repr(raw)))}", "X-SITS-Priority")
    return tenant, int(raw)
