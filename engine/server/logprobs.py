"""OpenAI `logprobs` objects from the engine's per-token logprob entries.

An entry (one per generated token, see engine/layers/sampler.py) is {"token_id", "logprob", "top_logprobs":
[(token_id, logprob), ...]}, taken from the model's raw distribution. Token strings are the tokenizer's decoding of
the single token, so a byte-level token that is not valid UTF-8 on its own shows as U+FFFD (its `bytes` are exact).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence


def _finite(x: float) -> float:
    return x if math.isfinite(x) else -9999.0   # JSON has no -Infinity; OpenAI's convention for "impossible"


def completion_logprobs(decode: Callable[[list[int]], str], entries: Sequence[dict], text_offset: int) -> dict:
    """Legacy /v1/completions shape: parallel lists plus one {token: logprob} dict per position."""
    tokens, token_logprobs, top, offsets = [], [], [], []
    for e in entries:
        s = decode([e["token_id"]])
        tokens.append(s)
        token_logprobs.append(_finite(e["logprob"]))
        top.append({decode([t]): _finite(lp) for t, lp in e["top_logprobs"]})
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
