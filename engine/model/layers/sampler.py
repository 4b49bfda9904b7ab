"""Batched sampling: greedy, temperature, top-k, top-p; per-request seeded RNG; optional logprobs.

Sampling uses the exponential-race trick: argmax(p / E) with E ~ Exp(1) draws from p. A seeded request draws its E
row from its own generator, so its tokens depend only on its seed and its logits, never on the rest of the batch.
"""

from __future__ import annotations

import time

import torch

from sits.engine.sampling_params import SamplingParams


class Sampler:
    def __init__(self, device: torch.device, seed: int):
        self.device = device
        self.generator = torch.Generator(device=device).manual_seed(seed)  # for unseeded requests
        self.wait_s = 0.0  # host time spent in the step's device-to-host copy of the tokens (waiting for the GPU)

    def new_generator(self, seed: int) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(seed)

    @torch.inference_mode()
    def __call__(self, logits: torch.Tensor, params: list[SamplingParams],
                 generators: list[torch.Generator | None]) -> tuple[list[int], list[dict] | None]:
        """logits: [B, V] fp32 -> (token ids, per-row logprob dicts or None)."""
        tokens = self.sample_tokens(logits, params, generators)
        t0 = time.perf_counter()
        token_list = tokens.tolist()  # the step's one device-to-host copy (greedy and sampled rows alike)
        self.wait_s += time.perf_counter() - t0
        logprobs = None
        if any(p.logprobs is not None for p in params):
            logprobs = self._logprobs(logits, params, token_list)
        return token_list, logprobs

    @torch.inference_mode()
    def sample_tokens(self, logits: torch.Tensor, params: list[SamplingParams],
                      generators: list[torch.Generator | None]) -> torch.Tensor:
        """The sampled token of each row, on the logits' device (nothing waits for the GPU unless top-p is used)."""
        greedy = [p.greedy for p in params]
        tokens = logits.argmax(dim=-1)
        if not all(greedy):
            tokens = torch.where(torch.tensor(greedy, device=logits.device), tokens, self._sample(logits, params,
                                                                                              generators))
        return tokens

    def _sample(self, logits, params, generators) -> torch.Tensor:
        dev = logits.device
        temps = torch.tensor([p.temperature if p.temperature > 0 else 1.0 for p in params], device=dev)
        x = logits / temps[:, None]
        v = x.shape[1]
        top_ks = [min(p.top_k, v) for p in params]
        if any(top_ks):
            kmax = max(top_ks)
            kth = x.topk(kmax, dim=-1).values  # [B, kmax], descending
            idx = torch.tensor([max(k, 1) - 1 for k in top_ks], device=dev)
            thresh = kth.gather(1, idx[:, None])
            thresh = torch.where(torch.tensor(top_ks, device=dev)[:, None] > 0, thresh, float("-inf"))
            x = x.masked_fill(x < thresh, float("-inf"))
        top_ps = torch.tensor([p.top_p for p in params], device=dev)
        if bool((top_ps < 1.0).any()):
            sorted_x, order = x.sort(dim=-1, descending=True)
            probs = sorted_x.softmax(dim=-1)
            # drop a token when the mass of the tokens before it already reaches top_p (keeps >= 1 token)
            drop = probs.cumsum(dim=-1) - probs >= top_ps[:, None]
            sorted_x = sorted_x.masked_fill(drop, float("-inf"))
            x = torch.full_like(x, float("-inf")).scatter(1, order, sorted_x)
        probs = x.softmax(dim=-1)
        race = torch.empty_like(probs)
        unseeded = [i for i, g in enumerate(generators) if g is None]
        if unseeded:
            race[unseeded] = torch.empty(len(unseeded), v, device=dev).exponential_(generator=self.generator)
        for i, g in enumerate(generators):
            if g is not None:
                race[i].exponential_(generator=g)
        return (probs / race).argmax(dim=-1)

    @staticmethod
    def _logprobs(logits, params, tokens) -> list[dict | None]:
        """Per row: {"token_id", "logprob", "top_logprobs": [(id, logprob), ...]} from the model's distribution."""
        lp = logits.log_softmax(dim=-1)
        k = max(p.logprobs or 0 for p in params)
        top = lp.topk(k, dim=-1) if k else None
        chosen = lp.gather(1, torch.tensor(tokens, device=lp.device)[:, None]).squeeze(1).tolist()
        top_vals = top.values.tolist() if top is not None else None
        top_ids = top.indices.tolist() if top is not None else None
        out: list[dict | None] = []
        for i, p in enumerate(params):
            if p.logprobs is None:
                out.append(None)
                continue
            n = p.logprobs
            out.append({"token_id": tokens[i], "logprob": chosen[i],
                        "top_logprobs": list(zip(top_ids[i][:n], top_vals[i][:n])) if n else []})
        return out
