"""LLMEngine: the thread-safe request API over scheduler + model runner (the server and LLM build on it).

Threading: add_request / abort_request / stats may be called from any thread; step() from one thread only.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref

import torch

from sits.engine.execution.async_decode import DecodePipeline
from sits.engine.scheduling.block_manager import BlockManager
from sits.engine.config import EngineConfig
from sits.engine.execution.conformance import measure_runner as measure_conformance
from sits.engine.errors import InvalidRequestError, QueueFullError, StepError, check_context_length
from sits.engine.model.loader import resolve_model
from sits.engine.execution.device import limit_cpu_threads, load_kernel_set, resolve_device, resolve_dtype
from sits.engine.execution.model_runner import ModelRunner
from sits.engine.model.presets import GPU_ONLY
from sits.engine.parallel.group import check_sizes
from sits.engine.parallel.launch import TensorParallel
from sits.engine.outputs import EngineStats, RequestOutput
from sits.engine.sampling_params import SamplingParams
from sits.engine.scheduling.scheduler import Scheduler
from sits.engine.scheduling.sequence import Sequence
from sits.engine.model.tokenizer import detokenize_incrementally, load_tokenizer
from sits.engine.execution.warmup import warmup_plan

log = logging.getLogger("sits.engine")

DEFAULT_MAX_MODEL_LEN = 8192
MAX_PRIORITY = 3
DEVICE_MEMORY_REFRESH_S = 2.0


class LLMEngine:
    def __init__(self, config: EngineConfig | None = None, *, clock=time.monotonic):
        self.config = config = config or EngineConfig()
        self._clock = clock
        source = resolve_model(config.model, config.seed)
        self.model_name = source.name
        self.model_config = mc = source.config
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        if config.model in GPU_ONLY and self.device.type != "cuda":
            raise InvalidRequestError(f"the {config.model} preset needs a CUDA GPU (device is {self.device.type}); "
                                      f"use model='tiny' on CPU", "device")
        limit_cpu_threads(self.device, mc)
        self.kernel_set = load_kernel_set(config.kernels, self.device, config.kv_cache_dtype)
        self.tokenizer = load_tokenizer(source.path, mc.vocab_size, mc.eos_token_id, mc.bos_token_id)
        max_len = min(config.max_model_len or min(mc.max_position_embeddings, DEFAULT_MAX_MODEL_LEN),
                      mc.max_position_embeddings)
        # tensor parallelism: ranks 1..N-1 start now and load their shards while this one loads its own
        self.parallel: TensorParallel | None = None
        if config.tensor_parallel_size > 1:
            check_sizes(config.tensor_parallel_size, mc, self.device)
            self.parallel = TensorParallel(config, self.device, self.dtype, max_len)
            self.device = self.parallel.device
            weakref.finalize(self, self.parallel.close)   # an engine dropped unclosed stops its workers too
        try:
            self.model_runner = ModelRunner(config, source, self.kernel_set, self.device, self.dtype, max_len,
                                            self.parallel)
            if self.parallel is not None:
                self.parallel.wait_ready()
        except BaseException:
            self.close()
            raise
        # warmup()'s op-level conformance report (engine/execution/conformance.py)
        self.conformance: dict | None = None
        num_blocks = self.model_runner.num_blocks
        self.max_model_len = min(max_len, num_blocks * config.block_size)
        self.block_manager = BlockManager(num_blocks, config.block_size,
                                          enable_prefix_caching=config.enable_prefix_caching,
                                          max_blocks_per_tenant=config.max_blocks_per_tenant, clock=clock)
        layout = self.model_runner.kv_layout
        log.info("KV cache: %d blocks of %d tokens = %d tokens (%s, %d bytes a token, %.2f GiB)", num_blocks,
                 config.block_size, num_blocks * config.block_size, layout.describe(), layout.bytes_per_token(),
                 num_blocks * layout.block_bytes() / 2**30)
        self.scheduler = Scheduler(self.block_manager, max_num_seqs=config.max_num_seqs,
                                   max_num_batched_tokens=config.max_num_batched_tokens,
                                   max_prefill_tokens_while_decoding=config.max_prefill_tokens_while_decoding)
        self.eos_token_ids = set(mc.eos_token_id)
        if self.tokenizer.eos_token_id is not None:
            self.eos_token_ids.add(self.tokenizer.eos_token_id)
        self._pipeline = DecodePipeline(self)  # decode steps launched one ahead when nothing else is going on
        self._lock = threading.Lock()
        self._inbox: list[Sequence] = []
        self._aborts: list[str] = []
        self._live: dict[str, Sequence] = {}  # accepted and not yet reported finished
        self._num_waiting = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.num_computed_tokens_total = 0  # tokens run through the model (prefill chunks + decodes)
        self._device_memory = (-DEVICE_MEMORY_REFRESH_S, 0)  # (when read, bytes): stats() runs every step

    # ---- requests (any thread) ------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams | None = None, *,
                    tenant: str = "default", priority: int = 0, detokenize: bool = True) -> None:
        """detokenize=False: outputs carry no text unless the request has stop strings (which need the text here);
        the caller decodes the tokens itself (engine/core/client.py does, in the API server's process)."""
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError("params must be a SamplingParams", "params")
        if not isinstance(request_id, str) or not request_id:
            raise InvalidRequestError("request_id must be a non-empty string", "request_id")
        if not isinstance(tenant, str) or not tenant:
            raise InvalidRequestError("tenant must be a non-empty string", "tenant")
        if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= MAX_PRIORITY:
            raise InvalidRequestError(f"priority must be an integer in [0, {MAX_PRIORITY}], got {priority!r}",
                                      "priority")
        self._check_stop_ids(params)
        token_ids = self._prompt_ids(prompt)
        check_context_length(len(token_ids), params.max_tokens, self.max_model_len)
        total = len(token_ids) + params.max_tokens
        limit = self.config.max_blocks_per_tenant
        if limit is not None and self.block_manager.blocks_needed(total) > limit:
            raise InvalidRequestError(f"prompt + max_tokens = {total} tokens exceeds the per-tenant KV limit of "
                                      f"{limit * self.config.block_size} tokens", "max_tokens")
        seq = Sequence(request_id, token_ids, params, tenant=tenant, priority=priority,
                       arrival_time=self._clock())
        seq.prefix_offset, seq.read_offset = max(0, len(token_ids) - 5), len(token_ids)
        seq.detokenize = detokenize or bool(params.stop)
        with self._lock:
            if request_id in self._live:
                raise InvalidRequestError(f"request id {request_id!r} is already in use", "request_id")
            if self._num_waiting + len(self._inbox) >= self.config.max_waiting:
                raise QueueFullError(f"the waiting queue is full ({self.config.max_waiting} requests)")
            self._live[request_id] = seq
            self._inbox.append(seq)

    def _check_stop_ids(self, params: SamplingParams) -> None:
        vocab = self.model_config.vocab_size
        outside = [t for t in params.stop_token_ids if t >= vocab]
        if outside:
            raise InvalidRequestError(f"stop_token_ids {outside[:5]} are outside the model's vocabulary of {vocab}",
                                      "stop_token_ids")

    def _prompt_ids(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequestError("prompt must not be empty", "prompt")
            ids = self.tokenizer.encode(prompt)
            if not ids:
                raise InvalidRequestError("prompt encodes to no tokens", "prompt")
            if max(ids) >= self.model_config.vocab_size:
                raise InvalidRequestError(f"the tokenizer produced token id {max(ids)}, outside the model's "
                                          f"vocabulary of {self.model_config.vocab_size}", "prompt")
            return ids
        if not isinstance(prompt, (list, tuple)) or not prompt:
            raise InvalidRequestError("prompt must be a non-empty string or a non-empty list of token ids", "prompt")
        vocab = self.model_config.vocab_size
        for t in prompt:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
                raise InvalidRequestError(f"prompt token ids must be integers in [0, {vocab}), got {t!r}", "prompt")
        return list(prompt)

    def abort_request(self, request_id: str) -> None:
        with self._lock:
            self._aborts.append(request_id)

    def has_unfinished_requests(self) -> bool:
        with self._lock:
            return bool(self._live)

    def stats(self) -> EngineStats:
        bm = self.block_manager
        free, total = bm.num_free_blocks, bm.num_total_blocks
        with self._lock:
            waiting = self._num_waiting + len(self._inbox)
        return EngineStats(
            num_running=len(self.scheduler.running), num_waiting=waiting, num_free_blocks=free,
            num_total_blocks=total, kv_cache_usage=1.0 - free / total,
            prefix_cache_queries=bm.prefix_cache_queries, prefix_cache_hits=bm.prefix_cache_hits,
            num_preemptions=self.scheduler.num_preemptions, prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total, device_memory_bytes=self._device_memory_bytes())

    def _device_memory_bytes(self) -> int:
        """What the CUDA caching allocator holds for this engine, read at most every DEVICE_MEMORY_REFRESH_S (the
        read builds the allocator's stats); the CUDA context (~0.5 GB) is not in it."""
        if self.device.type != "cuda":
            return 0
        when, value = self._device_memory
        now = self._clock()
        if now - when >= DEVICE_MEMORY_REFRESH_S:
            value = int(torch.cuda.memory_reserved(self.device))
            self._device_memory = (now, value)
        return value

    # ---- the loop (one thread) ------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        outputs: list[RequestOutput] = []
        with self._lock:
            inbox, self._inbox = self._inbox, []
            aborts, self._aborts = self._aborts, []
            # they wait in the scheduler now: admission (add_request) keeps counting them until the step's end sets
            # the exact number (an overcount meanwhile, never an undercount)
            self._num_waiting += len(inbox)
        pipe = self._pipeline
        if pipe.inflight is not None and (inbox or aborts or self.scheduler.waiting):
            outputs += pipe.drain()  # the scheduler takes the next step: the one in flight is collected first
        for seq in inbox:
            self.scheduler.add(seq)
        for rid in aborts:
            seq = self._live.get(rid)
            if seq is not None and not seq.is_finished:
                self.scheduler.finish(seq, "abort")
                outputs.append(self._output(seq, [], "", None))
                self._forget(seq)
        if pipe.inflight is None:
            batch = self.scheduler.schedule()
            if batch.seqs and pipe.can_start(batch):
                try:
                    pipe.start(batch)
                except Exception as e:
                    self._abort_step(batch.seqs, e, outputs)
            elif batch.seqs:
                try:
                    results = self.model_runner.execute(batch)
                except Exception as e:
                    self._abort_step(batch.seqs, e, outputs)
                self.num_computed_tokens_total += batch.num_tokens
                self.scheduler.update_computed(batch)
                for seq, token, logprob in results:
                    outputs.append(self._append_token(seq, token, logprob))
        if pipe.inflight is not None:  # decode steps one ahead (engine/execution/async_decode.py)
            outputs += pipe.advance()
        with self._lock:
            self._num_waiting = len(self.scheduler.waiting)
        return outputs

    def _abort_step(self, seqs: list[Sequence], e: Exception, outputs: list[RequestOutput] | None = None):
        outputs = [] if outputs is None else outputs
        if self.parallel is not None:   # the other ranks may have run part of the step: they are out of step now
            self.parallel.fail(f"a failed step ({type(e).__name__}: {e})")
        for seq in seqs:
            self.scheduler.finish(seq, "abort")
            outputs.append(self._output(seq, [], "", None))
            self._forget(seq)
        raise StepError(f"model step failed ({type(e).__name__}: {e}); its {len(seqs)} "
                        f"request(s) were aborted", outputs) from e

    def _append_token(self, seq: Sequence, token: int, logprob: dict | None) -> RequestOutput:
        p = seq.params
        seq.token_ids.append(token)
        self.generation_tokens_total += 1
        if seq.num_output_tokens == 1:
            self.prompt_tokens_total += seq.num_prompt_tokens
        reason = None
        if token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_token_ids):
            reason = "stop"
        elif seq.num_output_tokens >= p.max_tokens or len(seq) >= self.max_model_len:
            reason = "length"
        if not seq.detokenize:
            if reason is not None:
                self.scheduler.finish(seq, reason)
                self._forget(seq)
            return self._output(seq, [token], "", [logprob] if logprob is not None else None,
                                prompt_logprobs=seq.num_output_tokens == 1)
        text, seq.prefix_offset, seq.read_offset = detokenize_incrementally(
            self.tokenizer, seq.token_ids, seq.prefix_offset, seq.read_offset, final=reason is not None)
        old_len = len(seq.output_text)
        seq.output_text += text
        if p.stop:
            longest = max(len(s) for s in p.stop)
            window_start = max(0, old_len - longest + 1)
            hits = [i for i in (seq.output_text.find(s, window_start) for s in p.stop) if i >= 0]
            if hits:
                seq.output_text = seq.output_text[:min(hits)]
                reason = "stop"
        emit_to = len(seq.output_text)
        if reason is None and p.stop:  # hold back a tail that may still become a stop string
            emit_to = max(seq.emitted_text_len, emit_to - max(len(s) for s in p.stop) + 1)
        new_text = seq.output_text[seq.emitted_text_len:emit_to]
        seq.emitted_text_len = emit_to
        if reason is not None:
            self.scheduler.finish(seq, reason)
            self._forget(seq)
        return self._output(seq, [token], new_text, [logprob] if logprob is not None else None,
                            prompt_logprobs=seq.num_output_tokens == 1)

    def _output(self, seq: Sequence, new_ids: list[int], new_text: str, logprobs, *,
                prompt_logprobs: bool = False) -> RequestOutput:
        """prompt_logprobs: attach the prompt's scores (on a request's first output, when it asked for them)."""
        out = RequestOutput(request_id=seq.request_id, new_token_ids=new_ids, new_text=new_text,
                            finished=seq.is_finished, finish_reason=seq.finish_reason,
                            num_prompt_tokens=seq.num_prompt_tokens, num_output_tokens=seq.num_output_tokens,
                            num_cached_tokens=seq.num_cached_tokens, logprobs=logprobs, tenant=seq.tenant)
        if prompt_logprobs and seq.params.prompt_logprobs is not None:
            out.prompt_logprobs = list(seq.prompt_logprobs)
        return out

    def _forget(self, seq: Sequence) -> None:
        with self._lock:
            self._live.pop(seq.request_id, None)

    def close(self) -> None:
        """Stop the other tensor-parallel ranks and leave the process group (nothing to do with one rank); the engine
        cannot step after it. Idempotent."""
        if self.parallel is not None:
            self.parallel.close()

    def warmup(self, max_tokens: int = 4) -> None:
        """Run one short request to completion (first kernel launches/compiles), then on a GPU one dummy step of
        every shape family a request can produce (engine/execution/warmup.py), and capture the decode CUDA graphs of
        every batch size (when the engine uses them); call before serving."""
        rid = f"__warmup__{id(self)}"
        self.add_request(rid, [self.model_config.bos_token_id or 0] * 3,
                         SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
        while self.has_unfinished_requests():
            self.step()
        t0 = time.perf_counter()  # on the loop's thread, like step(): add_request is not blocked meanwhile
        runner = self.model_runner
        if self.device.type == "cuda":  # every shape family a step can have, so nothing compiles while serving
            plan = warmup_plan(self.config.max_num_batched_tokens, self.config.max_num_seqs, runner.decode_sizes,
                               runner.decode_graphs is not None)
            runner.warmup(plan)
            log.info("warm-up ran %d step shapes in %.1f s (Triton's cache: %s)", len(plan), time.perf_counter() - t0,
                     runner.triton_cache_dir)
            t0 = time.perf_counter()
        if self.config.conformance:
            self.conformance = measure_conformance(runner)
            log.info("conformance of %s against %s: %d ops, %d cases in %.1f s (seed %d)", self.kernel_set.name,
                     self.conformance["reference"], len(self.conformance["measured_ops"]),
                     len(self.conformance["cases"]), self.conformance["seconds"], self.conformance["seed"])
            t0 = time.perf_counter()
        graphs = runner.capture_decode_graphs()
        if graphs:
            log.info("captured %d decode CUDA graphs in %.1f s", graphs, time.perf_counter() - t0)
        self.prompt_tokens_total = self.generation_tokens_total = 0
        self.block_manager.prefix_cache_queries = self.block_manager.prefix_cache_hits = 0
