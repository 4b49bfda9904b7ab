"""The correctness gate's I/O: replay the prompt set against canary and baseline through their OpenAI API.

Per prompt, four requests, all marked `X-SITS-Probe: 1` (the engine keeps them out of the latency histograms):
  1. baseline: greedy completion with top-N logprobs (token ids via vLLM's return_tokens_as_token_ids and
     return_token_ids extensions, so a token is never confused with another that prints the same);
  2. canary: the same, with the baseline's prompt token ids as its prompt (exactly the same input);
  3. canary: prompt + the baseline's continuation with `echo` and `max_tokens: 0` -- the canary scores the baseline's
     tokens (teacher forcing);
  4. baseline: the same scoring request, so the teacher-forced comparisons compare like with like (one prefill on
     each side: an engine's prefill can round differently from its decode steps, e.g. fp8 weights' e4m3 activations).
The pure core (analysis/correctness.py) decides; this module only fetches. A failed request marks that prompt's
replay as failed (the verdict is inconclusive past policy.max_error_fraction), never as a pass.
"""
from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import requests

from sits.control_plane.analysis import (Continuation, CorrectnessPolicy, CorrectnessVerdict, PromptReplay, TokenLogprob,
                                    compare_replays)
from sits.control_plane.analysis.conformance import judge as judge_conformance
from sits.control_plane.analysis.correctness import with_conformance
from sits.control_plane.analysis.gate_policy import quantized_by, tolerances_key
from sits.control_plane.analysis.prompts import DEFAULT_PROMPTS
from sits.control_plane.small_files import FileTooLargeError, read_small_file
from sits.wire.headers import MARK, PROBE_HEADER
from sits.wire.tracing import inject

MAX_PROMPTS = 1000
MAX_PROMPT_CHARS = 100_000


class PromptSetError(ValueError):
    """The policy's prompt set cannot be read or is malformed."""


MAX_PROMPT_FILE_BYTES = 8 * 1024 * 1024


def load_prompt_set(prompt_set: str | tuple[str, ...], directory: str | os.PathLike | None) -> tuple[str, ...]:
    """The policy's prompts: "default" (the shipped set), inline prompts (validated with the policy), or a set by
    name (Policy has checked it: no paths): `<directory>/prompts-<name>.json`, a JSON list of non-empty strings, read
    only when it is a regular file inside `directory` and at most MAX_PROMPT_FILE_BYTES long. PromptSetError
    otherwise."""
    if not isinstance(prompt_set, str):
        return tuple(prompt_set)
    if prompt_set == "default":
        return DEFAULT_PROMPTS
    if directory is None:
        raise PromptSetError(f"prompt set {prompt_set!r}: this worker has no prompt-set directory "
                             "(sits-control worker|serve --prompt-set-dir DIR)")
    try:
        data = json.loads(_read_bounded(prompt_set, Path(directory)))
    except json.JSONDecodeError as e:
        raise PromptSetError(f"prompt set {prompt_set!r} is not a JSON list of strings: {e}") from None
    if not isinstance(data, list) or not data or not all(isinstance(p, str) and p for p in data):
        raise PromptSetError(f"prompt set {prompt_set!r} must be a non-empty JSON list of non-empty strings")
    if len(data) > MAX_PROMPTS or any(len(p) > MAX_PROMPT_CHARS for p in data):
        raise PromptSetError(f"prompt set {prompt_set!r}: at most {MAX_PROMPTS} prompts of {MAX_PROMPT_CHARS} "
                             "characters")
    return tuple(data)


def _read_bounded(name: str, directory: Path) -> str:
    """The text of prompts-<name>.json in `directory` (symlinks that stay inside it are followed: a ConfigMap
    volume's files are links into its ..data folder)."""
    unreadable = PromptSetError(f"prompt set {name!r}: no readable prompts-{name}.json in the prompt-set directory")
    try:
        root = directory.resolve(strict=True)
        path = (root / f"prompts-{name}.json").resolve(strict=True)
        if not path.is_relative_to(root):
            raise unreadable
        raw = read_small_file(path, MAX_PROMPT_FILE_BYTES)   # a device, FIFO or folder is no prompt set
    except OSError:
        raise unreadable from None
    except FileTooLargeError:
        raise PromptSetError(f"prompt set {name!r}: larger than {MAX_PROMPT_FILE_BYTES} bytes") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise PromptSetError(f"prompt set {name!r} is not a JSON list of strings (not UTF-8)") from None


@dataclass(slots=True, frozen=True)
class GateRun:
    """One replay: the verdict plus what it cost."""
    verdict: CorrectnessVerdict
    requests: int
    tokens: int          # prompt + generated tokens sent through the engines, every request counted
    seconds: float


class ReplayError(Exception):
    pass


class ReplayInterrupted(Exception):
    """The replay stopped between prompts because `interrupted()` said so (an abort is pending)."""


def _positions(lp: dict, start: int, count: int | None = None) -> tuple[TokenLogprob, ...]:
    """OpenAI completion logprobs (tokens as "token_id:N") -> TokenLogprob per position from `start`."""
    toks, lps, tops = lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]
    end = len(toks) if count is None else start + count
    out = []
    for i in range(start, end):
        top = tuple(sorted(((_tid(k), v) for k, v in (tops[i] or {}).items()), key=lambda kv: -kv[1]))
        out.append(TokenLogprob(_tid(toks[i]), lps[i], top))
    return tuple(out)


def _tid(token: str) -> int:
    if not token.startswith("token_id:"):
        raise ReplayError(f"the engine returned token {token!r}, not 'token_id:N' (return_tokens_as_token_ids)")
    return int(token[len("token_id:"):])


class CorrectnessProbe:
    """`CorrectnessProbe(prompt_dir=DIR).run(canary_url, baseline_url, policy)` -> GateRun. Thread-safe.
    `prompt_dir`: where named prompt sets are (prompts-<name>.json); None: only "default" and inline sets."""

    def __init__(self, *, session_factory=requests.Session, prompt_dir: str | os.PathLike | None = None) -> None:
        self._local = threading.local()
        self._factory = session_factory
        self.prompt_dir = prompt_dir

    def _session(self) -> requests.Session:
        s = getattr(self._local, "session", None)
        if s is None:
            s = self._local.session = self._factory()
        return s

    def _post(self, url: str, body: dict, timeout: float, headers: Mapping[str, str]) -> dict:
        try:
            r = self._session().post(url.rstrip("/") + "/v1/completions", json=body, headers=headers,
                                     timeout=timeout)
        except requests.RequestException as e:
            raise ReplayError(f"{type(e).__name__}: {e}") from None
        if r.status_code != 200:
            try:
                msg = r.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                msg = r.text[:200]
            raise ReplayError(f"HTTP {r.status_code}: {msg}")
        return r.json()["choices"][0]

    def _get(self, url: str, path: str, timeout: float) -> dict:
        try:
            r = self._session().get(url.rstrip("/") + path, timeout=timeout)
            return r.json() if r.status_code == 200 else {}
        except (requests.RequestException, ValueError):
            return {}

    def describe(self, url: str, timeout: float) -> tuple[str, str, frozenset[str]]:
        """(model id, compute dtype, what it quantizes) a variant serves; "" / empty where it does not say. What it
        quantizes: "int8 weights", "fp8 weights", "fp8 KV pages" (the engine's /version)."""
        models = self._get(url, "/v1/models", timeout).get("data") or [{}]
        version = self._get(url, "/version", timeout)
        quantized = quantized_by(version.get("quantization"), version.get("kv_cache_dtype"))
        return str(models[0].get("id", "")), str(version.get("dtype", "")), quantized

    def _one(self, canary: str, baseline: str, model: str, prompt: str, p: CorrectnessPolicy,
             headers: Mapping[str, str]) -> tuple[PromptReplay, int, int]:
        """(replay, tokens, requests) of one prompt."""
        t = p.request_timeout_s
        greedy = {"model": model, "max_tokens": p.max_tokens, "temperature": 0, "logprobs": p.top_logprobs,
                  "return_tokens_as_token_ids": True, "return_token_ids": True}
        tokens = 0
        try:
            b = self._post(baseline, {**greedy, "prompt": prompt}, t, headers)
        except ReplayError as e:
            return PromptReplay(prompt, Continuation(error=str(e)), Continuation()), tokens, 1
        ids = b["prompt_token_ids"]
        base = Continuation(tuple(b["token_ids"]), b["text"], _positions(b["logprobs"], 0))
        tokens += len(ids) + len(base.token_ids)
        sent = 1
        try:
            sent += 1
            c = self._post(canary, {**greedy, "prompt": ids}, t, headers)
            can = Continuation(tuple(c["token_ids"]), c["text"], _positions(c["logprobs"], 0))
            tokens += len(ids) + len(can.token_ids)
            sent += 1
            score = {"model": model, "prompt": ids + list(base.token_ids), "max_tokens": 0, "echo": True,
                     "logprobs": p.top_logprobs, "return_tokens_as_token_ids": True}
            f = self._post(canary, score, t, headers)
            tokens += len(ids) + len(base.token_ids)
            forced = Continuation(base.token_ids, base.text, _positions(f["logprobs"], len(ids)))
        except (ReplayError, KeyError, TypeError, ValueError) as e:
            return PromptReplay(prompt, base, Continuation(error=str(e))), tokens, sent
        try:   # the baseline's own scoring: without it the comparison falls back to its decode steps' logprobs
            sent += 1
            fb = self._post(baseline, score, t, headers)
            tokens += len(ids) + len(base.token_ids)
            forced_base = Continuation(base.token_ids, base.text, _positions(fb["logprobs"], len(ids)))
        except (ReplayError, KeyError, TypeError, ValueError) as e:
            return PromptReplay(prompt, Continuation(error=f"scoring its own continuation: {e}"), can, forced), \
                tokens, sent
        return PromptReplay(prompt, base, can, forced, forced_base), tokens, sent

    def replay(self, canary_url: str, baseline_url: str, policy: CorrectnessPolicy, model: str,
               prompts: tuple[str, ...], interrupted: Callable[[], bool] | None = None
               ) -> tuple[list[PromptReplay], int, int]:
        """Every prompt, `policy.concurrency` at a time (so batches differ from a one-by-one run, as in serving);
        returns (replays, tokens, requests). Every request carries the caller's traceparent (read here: the pool's
        threads do not inherit the caller's context). `interrupted()` is asked before each prompt: once it says
        True no further prompt starts, and ReplayInterrupted is raised when those in flight are done."""
        headers = inject({PROBE_HEADER: MARK})
        stop = threading.Event()

        def one(prompt: str):
            if stop.is_set() or (interrupted is not None and interrupted()):
                stop.set()
                return None
            return self._one(canary_url, baseline_url, model, prompt, policy, headers)
        with ThreadPoolExecutor(max_workers=policy.concurrency, thread_name_prefix="sits-correctness") as pool:
            results = list(pool.map(one, prompts))
        if stop.is_set():
            done = sum(r is not None for r in results)
            raise ReplayInterrupted(f"correctness replay stopped after {done} of {len(prompts)} prompts: an abort "
                                    "is pending")
        return [r for r, _, _ in results], sum(n for _, n, _ in results), sum(k for _, _, k in results)

    def run(self, canary_url: str, baseline_url: str, policy: CorrectnessPolicy,
            interrupted: Callable[[], bool] | None = None) -> GateRun:
        """One gate replay (PromptSetError if the prompt set cannot be read; ReplayInterrupted once
        `interrupted()` is True, asked before every prompt)."""
        t0 = time.perf_counter()
        prompts = load_prompt_set(policy.prompt_set, self.prompt_dir)
        model, dtype, quantized = self.describe(baseline_url, policy.request_timeout_s)
        canary_model, canary_dtype, canary_quantized = self.describe(canary_url, policy.request_timeout_s)
        replays, tokens, sent = self.replay(canary_url, baseline_url, policy, model or canary_model, prompts,
                                            interrupted)
        # the canary's dtype decides (it is what is being released); unknown -> the loosest tolerances; a canary
        # that quantizes other than its baseline (an engine-flag release) -> the quantized tolerances
        verdict = compare_replays(replays, policy, tolerances_key(canary_dtype or dtype or "unknown",
                                                                  canary_quantized, quantized))
        if policy.conformance.enabled:
            # what each engine measured at warm-up (engine/execution/conformance.py); the baseline runs production's
            # set, so its report says which ops the canary changes
            canary_report = self._get(canary_url, "/conformance", policy.request_timeout_s) or None
            baseline_report = self._get(baseline_url, "/conformance", policy.request_timeout_s) or None
            verdict = with_conformance(verdict, judge_conformance(canary_report, baseline_report,
                                                                  policy.conformance))
        return GateRun(verdict, requests=sent, tokens=tokens, seconds=time.perf_counter() - t0)
