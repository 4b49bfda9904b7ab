"""OpenAI `logprobs` objects from the engine's per-token logprob entries.

An entry (one per generated token, see engine/model/layers/sampler.py) is {"token_id", "logprob", "top_logprobs":
[(token_id, logprob), ...]}, taken from the model's raw distribution. Token strings are the tokenizer's decoding of
the single token, so a byte-level token that is not valid UTF-8 on its own shows as U+FFFD (its `bytes` are exact).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence


def _finite(x: float) -> float:
    return x if math.isfinite(x) else -9999.0   # JSON has no -Infinity; OpenAI's convention for "impossible"


def completion_logprobs(decode: Callable[[list[int]], str], entries: Sequence[dict | int], text_offset: int, *,
                        as_ids: bool = False) -> dict:
    """Legacy /v1/completions shape: parallel lists plus one {token: logprob} dict per position. An entry that is a
    bare token id (the first prompt token under `echo`: nothing precedes it) has null logprobs, as in OpenAI's API.
    as_ids: tokens and top-logprob keys are "token_id:N" (vLLM's return_tokens_as_token_ids), exact for any token."""
    tokens, token_logprobs, top, offsets = [], [], [], []
    for e in entries:
        tid = e if isinstance(e, int) else e["token_id"]
        s = decode([tid])
        tokens.append(f"token_id:{tid}" if as_ids else s)
        if isinstance(e, int):
            token_logprobs.append(None)
            top.append(None)
        else:
            token_logprobs.append(_finite(e["logprob"]))
            top.append({(f"token_id:{t}" if as_ids else decode([t])): _finite(lp) for t, lp in e["top_logprobs"]})
        offsets.append(text_offset)
        text_offset += len(s)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}


def _chat_token(decode: Callable[[list[int]], str], token_id: int, logprob: float) -> dict[str, Any]:
    s = decode([token_id])
    return {"token": s, "logprob": _finite(logprob), "bytes": list(s.encode("utf-8"))}


def chat_logprobs(decode: Callable[[list[int]], str], entries: Sequence[dict]) -> dict:
    """/v1/chat/completions shape: {"content": [{token, logprob, bytes, top_logprobs: [...]}, ...]}."""
    return {"content": [{**_chat_token(decode, e["token_id"], e["logprob"]),
                         "top_logprobs": [_chat_token(decode, t, lp) for t, lp in e["top_logprobs"]]}
                        for e in entries]}
