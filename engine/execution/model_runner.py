"""Where tensors enter: loads the model, owns the paged KV cache, turns a ScheduledBatch into one forward + sampling.

With tensor parallelism (engine/parallel/) rank 0's runner mirrors each piece of device work to the other ranks'
runners (engine/execution/rank_ops.py), which run it through `apply`; sampling and logits stay on rank 0."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from sits.engine.config import EngineConfig, ModelConfig
from sits.engine.execution.cuda_graphs import DecodeGraphs, DecodeStep, graph_batch_sizes, padded_batch_size
from sits.engine.execution.kv_cache import KVCacheLayout, allocate_kv_cache
from sits.engine.errors import InvalidRequestError
from sits.engine.model.layers.sampler import Sampler
from sits.engine.model.loader import ModelSource
from sits.engine.model.llama import LlamaForCausalLM
from sits.engine.execution.piecewise_graphs import PiecewiseGraphs
from sits.engine.sampling_params import SamplingParams
from sits.engine.scheduling.scheduler import ScheduledBatch
from sits.engine.scheduling.sequence import Sequence
from sits.engine.execution.rank_ops import CaptureOp, DecodeOp, EagerOp, RankOp, StaticBuffersOp, TensorParallelRank
from sits.engine.execution.step_inputs import PackedStep, pack_step
from sits.engine.execution.warmup import WarmupStep
from sits.kernels.triton_env import use_device_cache_dir

CPU_KV_CACHE_BYTES = 256 * 2**20  # default KV budget on CPU
GPU_MEMORY_UTILIZATION = 0.90


@dataclass(slots=True)
class InflightDecode:
    """A decode step launched without waiting for its tokens."""
    seqs: list[Sequence]  # its rows, in order
    tokens: torch.Tensor  # [len(seqs)] sampled tokens on the device
    host: torch.Tensor  # [len(seqs)] their (pinned) host copy, valid once `event` has passed
    event: object | None  # torch.cuda.Event, None on CPU (the copy was synchronous)


class ModelRunner:
    def __init__(self, config: EngineConfig, source: ModelSource, kernel_set, device: torch.device,
                 dtype: torch.dtype, max_model_len: int, parallel: TensorParallelRank | None = None):
        self.config = config
        self.model_config: ModelConfig = source.config
        self.device, self.dtype = device, dtype
        self.block_size = config.block_size
        self.kernel_set = kernel_set
        self.parallel = parallel   # None: the whole model here, one process (no torch.distributed)
        mc = source.config
        self.num_kv_heads = mc.num_key_value_heads // (parallel.size if parallel is not None else 1)   # this rank's
        # compiled kernels and autotuning winners persist per GPU model and driver (kernels/triton_env.py)
        self.triton_cache_dir = use_device_cache_dir(device)
        with torch.inference_mode():
            self.model = LlamaForCausalLM(source.config, kernel_set, device, dtype, max_model_len, tp=parallel)
            self.model.load_weights(source.weights(device, dtype))
            if config.quantization:
                self.model.quantize(config.quantization)
            # the model's dtype ("auto") or FP8 pages with scales ("fp8"): engine/execution/kv_cache.py
            self.kv_layout = KVCacheLayout(mc.num_hidden_layers, self.block_size, self.num_kv_heads, mc.head_dim,
                                           dtype, config.kv_cache_dtype)
            num_blocks = config.num_kv_blocks or self._auto_num_blocks(max_model_len)
            # block ids are rank 0's (its block manager): every rank's cache holds the same number of blocks
            self.num_blocks = parallel.agree_num_blocks(num_blocks) if parallel is not None else num_blocks
            cache = allocate_kv_cache(self.kv_layout, self.num_blocks, device)
        # one allocation for every layer's K and V: [layers, 2, blocks, block_size, kv_heads, head_dim] (and their
        # scales [layers, 2, blocks, block_size, kv_heads] with fp8); kv_caches: each layer's (k_cache, v_cache)
        self.kv_cache, self.kv_scales, self.kv_caches = cache.pages, cache.scales, cache.layers
        self.max_model_len = max_model_len   # the longest context served (RoPE tables and block tables cover it)
        self.max_blocks = -(-max_model_len // self.block_size)  # block-table width of every step
        self.decode_sizes = graph_batch_sizes(config.max_num_seqs)  # decode rows are padded to one of these
        # decode-only steps replay CUDA graphs (engine/execution/cuda_graphs.py) when the kernel set allows it
        self.decode_graphs: DecodeGraphs | None = None
        if device.type == "cuda" and not config.enforce_eager and kernel_set.graph_safe:
            self.decode_graphs = DecodeGraphs(self.model, self.kv_caches, max_num_seqs=config.max_num_seqs,
                                              max_blocks_per_seq=self.max_blocks, block_size=self.block_size,
                                              device=device, num_blocks=self.num_blocks)
        # steps with prefill tokens replay piecewise graphs when asked for (engine/execution/piecewise_graphs.py)
        self.piecewise: PiecewiseGraphs | None = None
        if self.decode_graphs is not None and config.piecewise_graphs:
            self.piecewise = PiecewiseGraphs(self.model, self.kv_caches, max_tokens=config.max_num_batched_tokens,
                                             device=device)
        self.sampler = Sampler(device, config.seed)
        self._host_tokens: list[torch.Tensor] | None = None  # launch_decode's pinned token buffers
        self._host_flip = 0
        self.capture_logits = False  # tests: keep the last step's logits
        self.last_logits: torch.Tensor | None = None  # [num sampled seqs, vocab] fp32
        self.last_logits_seqs: list[str] = []  # their request ids
        self.step_log: list[tuple] | None = None   # tests: when a list, every forward pass appends what it ran

    @property
    def gpu_wait_s(self) -> float:
        """Host seconds spent waiting for the GPU in the steps so far (the sampled tokens' copy to the host)."""
        return self.sampler.wait_s

    def block_bytes(self) -> int:
        return self.kv_layout.block_bytes()

    def _auto_num_blocks(self, max_model_len: int) -> int:
        min_blocks = -(-max_model_len // self.block_size)
        if self.device.type != "cuda":
            return max(min(CPU_KV_CACHE_BYTES // self.block_bytes(), self.config.max_num_seqs * min_blocks),
                       min_blocks)
        torch.cuda.empty_cache()  # what loading and quantizing freed is cached by the allocator, not "free" yet
        free, total = torch.cuda.mem_get_info(self.device)
        mc, c = self.model_config, self.config
        elt = torch.empty(0, dtype=self.dtype).element_size()
        t = c.max_num_batched_tokens
        layer = self.model.layers[0]   # this rank's heads and intermediate size
        # activations of one step, the reference attention's score matrix, and the sampler's [seqs, vocab] tensors
        act = t * (4 * mc.hidden_size + 3 * layer.intermediate + (layer.hq + 2 * layer.hkv) * mc.head_dim) * elt * 2
        act += layer.hq * t * max_model_len * 4 * 2
        act += c.max_num_seqs * mc.vocab_size * 4 * 6 + 512 * 2**20
        act += self.model.largest_quantized_weight() * elt  # one weight dequantized at a time (linear_dequant.py)
        share = c.gpu_memory_utilization
        if share is None:
            budget = total * GPU_MEMORY_UTILIZATION - (total - free) - act
        else:   # as vLLM: this engine's own share of the GPU, whatever other processes hold
            budget = total * share - torch.cuda.memory_reserved(self.device) - act
            if budget > free - act:
                raise InvalidRequestError(
                    f"--gpu-memory-utilization {share} asks for {total * share / 2**30:.1f} GiB of the GPU's "
                    f"{total / 2**30:.1f} GiB, but only {free / 2**30:.1f} GiB are free (other processes hold the "
                    f"rest): lower it", "gpu_memory_utilization")
            if budget < min_blocks * self.block_bytes():
                raise InvalidRequestError(
                    f"--gpu-memory-utilization {share} leaves {max(budget, 0) / 2**30:.2f} GiB for the KV cache after "
                    f"the weights ({torch.cuda.memory_reserved(self.device) / 2**30:.1f} GiB) and activations; one "
                    f"sequence of max_model_len needs {min_blocks * self.block_bytes() / 2**30:.2f} GiB",
                    "gpu_memory_utilization")
        # never more than every sequence slot at full length needs (a tiny model would otherwise take the GPU)
        cap = c.max_num_seqs * min_blocks
        return max(min(int(budget // self.block_bytes()), cap), min_blocks)

    @torch.inference_mode()
    def capture_decode_graphs(self) -> int:
        """Capture the decode CUDA graph of every batch size now (no-op without graphs); returns how many exist."""
        if self.decode_graphs is None:
            return 0
        self._mirror(CaptureOp())
        self._log(("capture",))
        self.decode_graphs.capture_all()
        if self.parallel is None:   # (tensor-parallel ranks would have to verify in lockstep: not done)
            self.decode_graphs.verify()
        if self.piecewise is not None:
            self.piecewise.capture_all()
            if self.parallel is None:
                self.piecewise.verify()
        return len(self.decode_graphs.graphs) if self.decode_graphs.failed is None else 0

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> list[tuple[Sequence, int, dict | None]]:
        """Run the scheduled tokens; returns (seq, sampled token, logprobs) for each seq whose chunk reached its end."""
        pairs = list(zip(batch.seqs, batch.num_new_tokens))
        prefill = [(s, n) for s, n in pairs if n > 1]
        decode = [s for s, n in pairs if n == 1]  # a 1-token chunk is a decode: same math
        graphs = self.decode_graphs
        scoring = any(s.needs_prompt_logprobs for s, _ in pairs)   # teacher forcing reads every prompt row
        if not prefill and not scoring and graphs is not None and graphs.usable(decode):
            return self._sample(self._decode(decode), decode)
        return self._run_eager(prefill, decode)

    @torch.inference_mode()
    def warmup(self, steps: list[WarmupStep]) -> None:
        """Run each step's shape once on dummy tokens (no KV written, nothing returned): Triton compiles and
        autotunes here instead of inside a request (engine/execution/warmup.py)."""
        greedy = SamplingParams(max_tokens=1, temperature=0.0)
        for step in steps:
            prefill = [(Sequence("__warmup__", [0] * n, greedy), n) for n in step.prefill_lens]
            decode = [Sequence("__warmup__", [0, 0], greedy) for _ in range(step.num_decodes)]
            for s, n in prefill:
                s.block_table = [0] * -(-n // self.block_size)
            for s in decode:
                s.num_computed_tokens, s.block_table = 1, [0]
            self._run_eager(prefill, decode, write_kv=False)

    def _run_eager(self, prefill: list[tuple[Sequence, int]], decode: list[Sequence], write_kv: bool = True):
        # decode rows padded to a graph batch size: decode attention sees only the shapes warm-up compiled
        pad = (padded_batch_size(len(decode), self.decode_sizes) or len(decode)) - len(decode) if decode else 0
        packed, sample_seqs = pack_step(prefill, decode, pad, block_size=self.block_size, max_blocks=self.max_blocks,
                                        device=self.device, write_kv=write_kv)
        if self.parallel is not None:
            self._mirror(EagerOp(packed.layout, packed.h64.numpy(), packed.h32.numpy()))
        hidden, x = self.forward_packed(packed, sample_seqs)
        chunks = prefill + [(s, 1) for s in decode]
        if any(s.needs_prompt_logprobs for s, _ in chunks):
            self._prompt_logprobs(hidden, chunks)
        if not x.sample_seqs:
            return []
        return self._sample(hidden[x.sample_rows], x.sample_seqs)

    def forward_packed(self, packed: PackedStep, sample_seqs: list[Sequence] | None = None):
        """An eager step's forward pass (piecewise graphs when a size fits) -> (final hidden states [T, H], inputs)."""
        x = packed.to_device(self.device, sample_seqs)
        pw = self.piecewise
        size = pw.size_for(packed.layout.num_tokens) if pw is not None else None
        self._log(("eager", packed.layout.num_tokens, packed.layout.num_prefill_tokens, size))
        if size is not None:
            return pw.forward(x.input_ids, x.positions, x.meta), x
        return self.model.forward(x.input_ids, x.positions, self.kv_caches, x.meta), x

    def _decode(self, seqs: list[Sequence], ids_from=None) -> torch.Tensor:
        """A decode step through the decode graphs (mirrored to the other ranks) -> final hidden states [n, H]."""
        step = self.decode_graphs.plan(seqs, ids_from)
        ids = ids_from[0] if ids_from else None
        if self.parallel is not None:
            self._mirror(DecodeOp(step.b, step.n, step.u, step.num_prev, step.host.numpy()))
            if ids is not None:
                self.parallel.broadcast(ids)
        return self.replay_decode(step, ids)

    def replay_decode(self, step: DecodeStep, ids: torch.Tensor | None) -> torch.Tensor:
        self._log(("decode", step.b, step.n, step.num_prev))
        return self.decode_graphs.replay(step, ids)

    @torch.inference_mode()
    def apply(self, op: RankOp) -> None:
        """Run what rank 0's runner mirrored (ranks 1..N-1 of a tensor-parallel group; engine/parallel/worker.py)."""
        if isinstance(op, EagerOp):
            self.forward_packed(PackedStep.from_arrays(op.layout, op.i64, op.i32, self.device))
        elif isinstance(op, DecodeOp):
            host = self.decode_graphs.next_host()[:len(op.host)]
            host.numpy()[:] = op.host
            ids = None
            if op.num_prev:   # rank 0's previous sampled tokens, broadcast right after the op
                ids = torch.empty(op.num_prev, dtype=torch.int64, device=self.device)
                self.parallel.broadcast(ids)
            self.replay_decode(DecodeStep(op.b, op.n, op.u, op.num_prev, host), ids)
        elif isinstance(op, CaptureOp):
            self.capture_decode_graphs()
        elif isinstance(op, StaticBuffersOp):
            self.use_static_buffers()
        else:
            raise TypeError(f"not a rank op: {op!r}")

    def use_static_buffers(self) -> None:
        """Decode steps through DecodeGraphs and prefill steps through PiecewiseGraphs, both eagerly (capture=False):
        the graphs' code paths on CPU, for tests (on every rank of a tensor-parallel group)."""
        self._mirror(StaticBuffersOp())
        c = self.config
        self.decode_graphs = DecodeGraphs(self.model, self.kv_caches, max_num_seqs=c.max_num_seqs,
                                          max_blocks_per_seq=self.max_blocks, block_size=self.block_size,
                                          device=self.device, capture=False, num_blocks=self.num_blocks)
        self.piecewise = PiecewiseGraphs(self.model, self.kv_caches, max_tokens=c.max_num_batched_tokens,
                                         device=self.device, capture=False)

    def _mirror(self, op: RankOp) -> None:
        if self.parallel is not None:
            self.parallel.mirror(op)

    def _log(self, entry: tuple) -> None:
        if self.step_log is not None:
            self.step_log.append(entry)

    def _prompt_logprobs(self, hidden: torch.Tensor, chunks: list[tuple[Sequence, int]]) -> None:
        """Append to each scoring sequence the logprob of every prompt token its chunk predicts (row p predicts token
        p + 1), with the top N alternatives; rows already scored (a recompute after preemption) are skipped."""
        row, rows, targets, owners = 0, [], [], []
        for s, n in chunks:
            start = s.num_computed_tokens
            if s.needs_prompt_logprobs:
                for p in range(max(start, len(s.prompt_logprobs)), min(start + n, s.num_prompt_tokens - 1)):
                    rows.append(row + p - start)
                    targets.append(s.token_ids[p + 1])
                    owners.append(s)
            row += n
        lp = self.model.compute_logits(hidden[torch.tensor(rows, device=self.device)]).log_softmax(dim=-1)
        chosen = lp.gather(1, torch.tensor(targets, device=self.device)[:, None]).squeeze(1).tolist()
        k = max(s.params.prompt_logprobs for s in owners)
        top = lp.topk(k, dim=-1) if k else None
        top_ids = top.indices.tolist() if top is not None else None
        top_vals = top.values.tolist() if top is not None else None
        for i, (s, t) in enumerate(zip(owners, targets)):
            n = s.params.prompt_logprobs
            s.prompt_logprobs.append({"token_id": t, "logprob": chosen[i],
                                      "top_logprobs": list(zip(top_ids[i][:n], top_vals[i][:n])) if n else []})

    @torch.inference_mode()
    def launch_decode(self, seqs: list[Sequence], ids_from=None) -> InflightDecode:
        """Launch a decode step through the graphs and sample on the GPU, copying the tokens to the host
        asynchronously; `collect` waits for them (engine/execution/async_decode.py). `ids_from`: see
        DecodeGraphs.run."""
        logits = self.model.compute_logits(self._decode(seqs, ids_from))
        tokens = self.sampler.sample_tokens(logits, [s.params for s in seqs], self._generators(seqs))
        if self._host_tokens is None:  # two pinned buffers: a step's copy lands while the previous one is read
            n = self.decode_graphs.sizes[-1]
            self._host_tokens = [torch.empty(n, dtype=torch.int64, pin_memory=self.device.type == "cuda")
                                 for _ in range(2)]
        host = self._host_tokens[self._host_flip][:len(seqs)]
        self._host_flip ^= 1
        host.copy_(tokens, non_blocking=True)
        event = None
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        return InflightDecode(seqs, tokens, host, event)

    def collect(self, inflight: InflightDecode) -> list[int]:
        """The launched step's tokens, once the GPU has them (the wait counts in gpu_wait_s)."""
        t0 = time.perf_counter()
        if inflight.event is not None:
            inflight.event.synchronize()
        tokens = inflight.host.tolist()
        self.sampler.wait_s += time.perf_counter() - t0
        return tokens

    def _generators(self, seqs: list[Sequence]) -> list:
        gens = []
        for s in seqs:
            if s.params.seed is not None and s.sampler_state is None:
                s.sampler_state = self.sampler.new_generator(s.params.seed)
            gens.append(s.sampler_state)
        return gens

    def _sample(self, hidden: torch.Tensor, sample_seqs: list[Sequence]) -> list[tuple[Sequence, int, dict | None]]:
        logits = self.model.compute_logits(hidden)
        if self.capture_logits:
            self.last_logits = logits.detach().clone()
            self.last_logits_seqs = [s.request_id for s in sample_seqs]
        tokens, logprobs = self.sampler(logits, [s.params for s in sample_seqs], self._generators(sample_seqs))
        return [(s, t, logprobs[i] if logprobs else None) for i, (s, t) in enumerate(zip(sample_seqs, tokens))]
