"""Offline batch API: LLM(model=..., kernels=...).generate(prompts, SamplingParams(...))."""

from __future__ import annotations

from dataclasses import dataclass

from sits.engine.config import EngineConfig
from sits.engine.errors import InvalidRequestError
from sits.engine.llm_engine import LLMEngine
from sits.engine.sampling_params import SamplingParams

TQDM_MIN_PROMPTS = 8  # show a progress bar from this many prompts on


@dataclass(slots=True)
class GenerationResult:
    prompt: str | list[int]
    text: str
    token_ids: list[int]
    finish_reason: str
    num_prompt_tokens: int
    num_cached_tokens: int
    logprobs: list[dict] | None = None
    prompt_logprobs: list[dict] | None = None  # SamplingParams.prompt_logprobs: entries for prompt tokens 1..


class LLM:
    """engine_kwargs: any EngineConfig field, e.g. tensor_parallel_size=2 (close() the LLM, or use it as a context
    manager, to stop the other ranks' processes; they also stop when this process ends)."""

    def __init__(self, model: str = "tiny", kernels: str = "torch", **engine_kwargs):
        self.engine = LLMEngine(EngineConfig(model=model, kernels=kernels, **engine_kwargs))
        self.tokenizer = self.engine.tokenizer
        self._next_id = 0

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def generate(self, prompts: str | list[str] | list[list[int]],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None, *,
                 use_tqdm: bool = True) -> list[GenerationResult]:
        """One result per prompt, in order. A single SamplingParams applies to every prompt."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise InvalidRequestError(f"got {len(sampling_params)} SamplingParams for {len(prompts)} prompts",
                                      "sampling_params")
        ids = []
        for prompt, params in zip(prompts, sampling_params):
            rid = f"gen-{self._next_id}"
            self._next_id += 1
            self.engine.add_request(rid, prompt, params)
            ids.append(rid)
        index = {rid: i for i, rid in enumerate(ids)}
        texts = [""] * len(prompts)
        tokens: list[list[int]] = [[] for _ in prompts]
        logprobs: list[list | None] = [[] if p.logprobs is not None else None for p in sampling_params]
        prompt_logprobs: list[list | None] = [None] * len(prompts)
        results: list[GenerationResult | None] = [None] * len(prompts)
        bar = None
        if use_tqdm and len(prompts) >= TQDM_MIN_PROMPTS:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(prompts), desc="generate", unit="req")
        try:
            while any(r is None for r in results):
                for out in self.engine.step():
                    i = index.get(out.request_id)
                    if i is None:
                        continue
                    texts[i] += out.new_text
                    tokens[i] += out.new_token_ids
                    if out.logprobs and logprobs[i] is not None:
                        logprobs[i] += out.logprobs
                    if out.prompt_logprobs is not None:
                        prompt_logprobs[i] = out.prompt_logprobs
                    if out.finished:
                        results[i] = GenerationResult(prompts[i], texts[i], tokens[i], out.finish_reason,
                                                      out.num_prompt_tokens, out.num_cached_tokens, logprobs[i],
                                                      prompt_logprobs[i])
                        if bar is not None:
                            bar.update(1)
        except BaseException:
            for rid, r in zip(ids, results):
                if r is None:
                    self.engine.abort_request(rid)
            self.engine.step()
            raise
        finally:
            if bar is not None:
                bar.close()
        return results
