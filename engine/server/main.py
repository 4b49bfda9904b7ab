"""`sits-engine serve`: argument parsing, wiring, and uvicorn (an ASGI production server, not a dev server)."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
import os
import pickle
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from sits.kernels.registry import KV_CACHE_DTYPES
from sits.wire.http_limits import BODY_TIMEOUT_S, HEADER_TIMEOUT_S
from sits.wire.models import LOAD_FAILED, PRESET_NAMES

log = logging.getLogger("sits.engine.server")

ENGINE_PROCESS_MODES = ("on", "off")
# after the engine core dies, the server answers 503 (readyz included) this long, then exits non-zero
FATAL_EXIT_GRACE_S = 5.0


@dataclass(slots=True)
class ServerConfig:
    model: str = "tiny"
    kernels: str = "torch"
    host: str = "127.0.0.1"
    port: int = 8000
    listen_fd: int | None = None   # an inherited listening socket to serve on (then host/port only describe it)
    env: str = "dev"
    service: str = "sits-engine"
    device: str = "auto"
    dtype: str = "auto"
    max_num_seqs: int = 256
    max_waiting: int = 1024
    max_num_batched_tokens: int = 2048
    max_prefill_tokens_while_decoding: int | None = None
    max_model_len: int | None = None
    num_kv_blocks: int | None = None
    gpu_memory_utilization: float | None = None
    max_blocks_per_tenant: int | None = None
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    seed: int = 0
    enforce_eager: bool = False
    piecewise_graphs: bool = True
    conformance: bool = True
    tensor_parallel_size: int = 1
    served_model_name: str | None = None
    otel_exporter: str | None = None   # None: from SITS_OTEL_EXPORTER / OTEL_TRACES_EXPORTER, else "none"
    otlp_endpoint: str | None = None
    fault_latency_ms: float = 0.0
    fault_token_latency_ms: float = 0.0
    fault_error_rate: float = 0.0
    warmup: bool = True
    log_level: str = "info"
    access_log: bool = True
    header_timeout_s: float = HEADER_TIMEOUT_S
    body_timeout_s: float = BODY_TIMEOUT_S
    engine_process: str = "on"   # "on": the engine core in its own process (engine/core/); "off": a thread here

    def __post_init__(self) -> None:
        if self.engine_process not in ENGINE_PROCESS_MODES:
            raise ValueError(f"--engine-process must be one of {', '.join(ENGINE_PROCESS_MODES)}, "
                             f"got {self.engine_process!r}")
        if not (0 <= self.port <= 65535):
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        for name in ("env", "service"):
            if not getattr(self, name):
                raise ValueError(f"--{name} must not be empty")
        for name in ("fault_latency_ms", "fault_token_latency_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0")
        if not 0.0 <= self.fault_error_rate <= 1.0:
            raise ValueError(f"--fault-error-rate must be in [0, 1], got {self.fault_error_rate}")
        if not (self.header_timeout_s > 0 and self.body_timeout_s > 0):
            raise ValueError("--header-timeout-s and --body-timeout-s must be > 0")
        if self.log_level not in ("critical", "error", "warning", "info", "debug"):
            raise ValueError(f"unknown log level {self.log_level!r}")

    @property
    def model_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        return self.model if self.model in PRESET_NAMES else Path(self.model).name

    def engine_config(self) -> Any:
        from sits.engine.config import EngineConfig

        return EngineConfig(model=self.model, kernels=self.kernels, device=self.device, dtype=self.dtype,
                            max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
                            max_prefill_tokens_while_decoding=self.max_prefill_tokens_while_decoding,
                            max_model_len=self.max_model_len, num_kv_blocks=self.num_kv_blocks,
                            gpu_memory_utilization=self.gpu_memory_utilization,
                            max_waiting=self.max_waiting, quantization=self.quantization,
                            kv_cache_dtype=self.kv_cache_dtype,
                            max_blocks_per_tenant=self.max_blocks_per_tenant, seed=self.seed,
                            enforce_eager=self.enforce_eager, piecewise_graphs=self.piecewise_graphs,
                            conformance=self.conformance, tensor_parallel_size=self.tensor_parallel_size)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sits-engine serve", description="Serve a model over an OpenAI-compatible API.")
    a = p.add_argument
    a("--model", default="tiny", help="preset (tiny, llama3-8b) or checkpoint directory")
    a("--kernels", default="torch", help="kernel set name (see `sits-engine kernels`)")
    a("--host", default="127.0.0.1")
    a("--port", type=int, default=8000)
    a("--listen-fd", type=int, default=None, metavar="FD",
      help="serve on this inherited, already listening TCP socket (the local deployer binds it and passes it on, "
           "so no other process can take the port in between); --host/--port then only name it")
    a("--env", default=os.environ.get("SITS_ENV", "dev"), help="`env` label on every metric")
    a("--service", default=os.environ.get("SITS_SERVICE", "sits-engine"), help="`service` label on every metric")
    a("--device", default="auto")
    a("--dtype", default="auto")
    a("--max-num-seqs", type=int, default=256)
    a("--max-waiting", type=int, default=1024, help="waiting-queue size; beyond it requests get 429")
    a("--max-num-batched-tokens", type=int, default=2048, help="tokens per engine step (prefill is chunked to fit)")
    a("--max-prefill-tokens-while-decoding", type=int, default=None, metavar="N",
      help="at most N prefill tokens in a step that also decodes (default: the whole step budget): bounds the "
           "inter-token gaps that long prompts open for streams already decoding, at some cost in time to first "
           "token when many prompts arrive at once")
    a("--max-model-len", type=int, default=None)
    a("--num-kv-blocks", type=int, default=None, help="KV-cache blocks of 64 tokens (default: from "
      "--gpu-memory-utilization on a GPU, a fixed budget on CPU)")
    a("--gpu-memory-utilization", type=float, default=None,
      help="fraction (0, 1] of the GPU's memory this engine may take for weights, activations and KV cache, as in "
           "vLLM, so several engines share one GPU predictably (default: 0.9 of what is free at start)")
    a("--engine-process", choices=ENGINE_PROCESS_MODES, default="on",
      help="on: the engine core (scheduler + model) runs in its own process, the HTTP server here (default); "
           "off: the engine loop runs in a thread of this process")
    a("--max-blocks-per-tenant", type=int, default=None)
    a("--quantization", choices=["int8", "fp8"], default=None)
    a("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
      help="KV-cache pages: auto = the model's dtype; fp8 = e4m3 with a scale per token and kv head, ~2x the tokens "
           "in the same memory (needs a kernel set that takes it: torch, triton-v1.3..v1.5; `sits-engine kernels --json` "
           "lists each set's kv_cache_dtypes)")
    a("--seed", type=int, default=0)
    a("--enforce-eager", action="store_true",
      help="no CUDA graphs: launch every kernel of a decode step from Python (graphs are used on CUDA with kernel "
           "sets that allow them, see `sits-engine kernels`)")
    a("--piecewise-graphs", action=argparse.BooleanOptionalAction, default=True,
      help="replay steps with prefill tokens (up to 512 tokens) piecewise from CUDA graphs, attention eager between "
           "the pieces: fewer kernel launches from Python when prompts arrive among decoding streams (default: on "
           "wherever decode steps use graphs; --no-piecewise-graphs runs those steps eagerly, docs/engine.md)")
    a("--conformance", action=argparse.BooleanOptionalAction, default=True,
      help="at warm-up, run every op of the kernel set that differs from the reference set `torch` on random inputs at "
           "this model's shapes and report its errors at GET /conformance, for the correctness gate (default: on; "
           "seconds on a GPU, docs/kernels.md)")
    a("--tensor-parallel-size", type=int, default=1, metavar="N",
      help="split the model over N ranks (Megatron-style tensor parallelism): the engine plus N - 1 worker processes, "
           "rank r on cuda:r of the visible GPUs (NCCL), or all on the CPU (gloo); N must divide the model's attention "
           "heads, KV heads and intermediate size (default: 1, one process)")
    a("--served-model-name", default=None, help="model id clients send (default: the preset or directory name)")
    a("--otel-exporter", choices=["none", "console", "otlp"], default=None,
      help="trace exporter (default: $SITS_OTEL_EXPORTER or $OTEL_TRACES_EXPORTER or none)")
    a("--otlp-endpoint", default=None, help="OTLP/HTTP endpoint (default: $OTEL_EXPORTER_OTLP_ENDPOINT)")
    g = p.add_argument_group("fault injection (for canary testing; all off by default)")
    g.add_argument("--fault-latency-ms", type=float, default=0.0, help="added once per request, before its first token")
    g.add_argument("--fault-token-latency-ms", type=float, default=0.0,
                   help="added to every engine step that generates tokens, i.e. per generated token")
    g.add_argument("--fault-error-rate", type=float, default=0.0, help="fraction of requests answered 500")
    a("--no-warmup", dest="warmup", action="store_false", help="skip the warm-up generation before /readyz is 200")
    a("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    a("--no-access-log", dest="access_log", action="store_false")
    a("--header-timeout-s", type=float, default=HEADER_TIMEOUT_S,
      help="a request head must arrive within this many seconds, else 408 and the connection is closed")
    a("--body-timeout-s", type=float, default=BODY_TIMEOUT_S,
      help="a request body must arrive within this many seconds of its head, else 408 and close")
    return p


def _build_id() -> str:
    if os.environ.get("SITS_BUILD"):
        return os.environ["SITS_BUILD"]
    try:
        from importlib.metadata import version

        return f"sits {version('sits')}"
    except Exception:
        return "sits dev"


def build_app(config: ServerConfig, *, span_exporter: Any = None, engine_factory: Any = None) -> Any:
    """The ASGI app for `config` (the engine loads in the background when the app starts).

    span_exporter: send spans there instead of the configured exporter; engine_factory(EngineConfig) -> LLMEngine."""
    from sits.kernels.catalog import identity, kv_cache_dtype_error
    from sits.engine.server.metrics import EngineMetrics, MetricLabels
    from sits.engine.server.app import create_app
    from sits.engine.server.state import Faults, ServerState
    from sits.engine.core.runner import EngineRunner
    from sits.engine.server.tracing import RequestTracer
    from sits.wire.tracing import TracingConfig, build_tracer_provider

    engine_config = config.engine_config()   # validated now: bad flags fail before the port opens
    # the name and version label every metric and span; with the engine in its own process, this process never needs
    # the kernels themselves, nor torch (1.8 -> 0.5 s of CPU to start, 310 -> 39 MB resident on 2 CPU cores)
    kernel_name, kernel_version = identity(config.kernels)
    why = kv_cache_dtype_error(config.kernels, config.kv_cache_dtype)
    if why is not None:
        raise ValueError(why)
    build = _build_id()
    metrics = EngineMetrics(MetricLabels(config.env, config.service, kernel_version), model=config.model_name,
                            kernel_set=kernel_name, build=build)
    tracing = TracingConfig.from_env(config.otel_exporter, config.otlp_endpoint, service_name=config.service)
    provider = build_tracer_provider(tracing, exporter=span_exporter, resource_attrs={
        "deployment.environment": config.env, "sits.kernel_version": kernel_version})
    tracer = RequestTracer(provider, kernel_version=kernel_version, kernel_set=kernel_name,
                           model=config.model_name)
    faults = Faults(latency_s=config.fault_latency_ms / 1000, token_latency_s=config.fault_token_latency_ms / 1000,
                    error_rate=config.fault_error_rate, seed=config.seed)

    if config.engine_process == "on":
        from sits.engine.core.client import EngineCoreClient

        if engine_factory is not None:
            try:
                pickle.dumps(engine_factory)
            except (pickle.PicklingError, AttributeError, TypeError) as e:
                raise ValueError(f"engine_factory must be picklable (a module-level callable) to reach the engine-core "
                                 f"process, or run with engine_process='off': {e}") from None

        runner: Any = EngineCoreClient(engine_config, metrics=metrics, warmup=config.warmup,
                                       fault_token_latency_s=faults.token_latency_s, engine_factory=engine_factory,
                                       log_level=config.log_level)
    else:
        def make_engine() -> Any:
            from sits.engine.llm_engine import LLMEngine

            return (engine_factory or LLMEngine)(engine_config)

        runner = EngineRunner(make_engine, metrics=metrics, warmup=config.warmup,
                              fault_token_latency_s=faults.token_latency_s)
    # what the answers' precision depends on beside the compute dtype: the correctness gate compares a canary that
    # quantizes what its baseline does not with the tolerances for quantized serving
    version = {"model": config.model_name, "kernel_set": kernel_name, "kernel_version": kernel_version,
               "build": build, "quantization": config.quantization, "kv_cache_dtype": config.kv_cache_dtype}
    state = ServerState(runner=runner, metrics=metrics, tracer=tracer, faults=faults,
                        model_names={config.model_name}, version=version,
                        system_fingerprint=system_fingerprint(config.service))
    return create_app(state)


def system_fingerprint(service: str) -> str:
    """The same for every variant of a service: a client must not learn which kernel set answered it (it could aim
    slow or bad requests at one and steer the canary's verdict). The kernel set is at /version, for operators."""
    return "fp_" + hashlib.sha256(service.encode()).hexdigest()[:12]


def uvicorn_config(app: Any, config: ServerConfig) -> Any:
    import uvicorn

    from sits.wire.http_limits import timeout_protocol

    return uvicorn.Config(app, host=config.host, port=config.port, log_level=config.log_level,
                          access_log=config.access_log, backlog=4096, timeout_keep_alive=30,
                          timeout_graceful_shutdown=10, lifespan="on",
                          http=timeout_protocol(config.header_timeout_s, config.body_timeout_s))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = ServerConfig(**vars(args))
        app = build_app(config)
    except (ValueError, KeyError) as e:   # InvalidRequestError is a ValueError, UnknownKernelSetError a KeyError
        print(f"sits-engine serve: error: {e}", file=sys.stderr)
        return 2
    try:
        sockets = None if config.listen_fd is None else [inherited_socket(config.listen_fd)]
    except OSError as e:
        print(f"sits-engine serve: error: --listen-fd {config.listen_fd}: {e}", file=sys.stderr)
        return 2
    import uvicorn

    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = uvicorn.Server(uvicorn_config(app, config))
    runner = app.state.sits.runner

    never_loaded = False

    def on_fatal(loading: bool) -> None:
        """On the event loop: the engine cannot serve. One that never loaded exits at once (nothing waits on it;
        an orchestrator learns the cause from the exit and the last line); one that served says so with 503s for
        a while first, then exits non-zero."""
        nonlocal never_loaded
        never_loaded = loading
        asyncio.get_running_loop().call_later(0.0 if loading else FATAL_EXIT_GRACE_S, setattr, server,
                                              "should_exit", True)

    runner.on_fatal = on_fatal
    # uvicorn drains connections on SIGINT/SIGTERM, then re-raises the signal to these handlers: exit 0, no traceback
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _exit_cleanly)
    try:
        server.run(sockets=sockets)
    except _Shutdown:
        pass
    if runner.failed:
        # the last line of the log: what a deployer shows as the reason (sits.wire.models.LOAD_FAILED)
        said = LOAD_FAILED if never_loaded else "sits-engine serve: error: "
        print(said + " ".join(str(runner.load_error).split()), file=sys.stderr, flush=True)
        return 1
    return 0 if server.started else 1


def inherited_socket(fd: int) -> socket.socket:
    """The listening TCP socket behind an inherited fd (OSError if it is none)."""
    sock = socket.socket(fileno=fd)
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM or \
            not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        sock.detach()
        raise OSError("not a listening TCP socket")
    return sock


class _Shutdown(Exception):
    pass


def _exit_cleanly(signum: int, frame: Any) -> None:
    raise _Shutdown()


if __name__ == "__main__":
    sys.exit(main())
