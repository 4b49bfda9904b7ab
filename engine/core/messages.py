"""What the API server and the engine-core process send each other over ZMQ, encoded with msgpack (msgspec).

front -> core: `AddRequest`, `Abort`, `Shutdown`.
core -> front: `Ready` (once, after load and warm-up), `Admitted` (after each batch of adds: which were accepted,
which refused and why), `StepOutputs` (one per engine step: the step's RequestOutputs, its timing, the engine's
stats after it, the core loop's CPU seconds), `Idle` (stats while nothing runs), `Failed` (load or loop error, just
before the core exits non-zero).

Tagged structs, arrays rather than maps (no field names on the wire); RequestOutput, EngineStats and SamplingParams are
the engine's own dataclasses, which msgspec encodes and decodes directly. Times are `time.perf_counter()` values:
CLOCK_MONOTONIC on Linux, one clock for every process of the host, so the front can subtract them from its own.
"""

from __future__ import annotations

import msgspec

from sits.engine.errors import ContextLengthError, EngineError, InvalidRequestError, QueueFullError
from sits.engine.outputs import EngineStats, RequestOutput
from sits.engine.sampling_params import SamplingParams


class _Msg(msgspec.Struct, tag=True, array_like=True, omit_defaults=True):
    pass


class AddRequest(_Msg):
    request_id: str
    prompt: list[int]
    params: SamplingParams
    tenant: str
    priority: int
    detokenize: bool = True   # False: the front decodes the text (requests without stop strings)


class Abort(_Msg):
    request_ids: list[str]


class Shutdown(_Msg):
    pass


class CoreInfo(msgspec.Struct, array_like=True):
    model_name: str
    kernel_set: str
    kernel_version: str
    max_model_len: int
    dtype: str          # "bfloat16", "float32", ...
    pid: int
    conformance: str = ""   # JSON of warm-up's op-level conformance report ("" when not measured)


class Ready(_Msg):
    info: CoreInfo


class Refusal(msgspec.Struct, array_like=True):
    """An admission error of LLMEngine.add_request, rebuilt as the same exception type on the front."""

    request_id: str
    kind: str           # "queue_full" | "context_length" | "invalid" | "engine"
    message: str
    param: str | None = None
    lengths: tuple[int, int, int] | None = None   # ContextLengthError: prompt tokens, max_tokens, context

    @classmethod
    def of(cls, request_id: str, e: EngineError) -> "Refusal":
        if isinstance(e, ContextLengthError):
            return cls(request_id, "context_length", str(e), e.param, (e.prompt_tokens, e.max_tokens, e.context))
        if isinstance(e, QueueFullError):
            return cls(request_id, "queue_full", str(e))
        if isinstance(e, InvalidRequestError):
            return cls(request_id, "invalid", str(e), e.param)
        return cls(request_id, "engine", str(e))

    def error(self) -> EngineError:
        if self.kind == "context_length" and self.lengths is not None:
            prompt_param = self.param if self.param != "max_tokens" else "prompt"
            return ContextLengthError(*self.lengths, prompt_param)
        if self.kind == "queue_full":
            return QueueFullError(self.message)
        if self.kind == "invalid":
            return InvalidRequestError(self.message, self.param)
        return EngineError(self.message)


class Admitted(_Msg):
    accepted: list[str]
    refused: list[Refusal]


class StepOutputs(_Msg):
    outputs: list[RequestOutput]
    step_start: float   # perf_counter() when the step began
    step_s: float       # its wall time
    stats: EngineStats  # after the step
    cpu_s: float        # CPU seconds of the core's loop thread so far


class Idle(_Msg):
    stats: EngineStats
    cpu_s: float


class Failed(_Msg):
    error: str
    loading: bool       # True: the engine never became ready


ToCore = AddRequest | Abort | Shutdown
FromCore = Ready | Admitted | StepOutputs | Idle | Failed

encoder = msgspec.msgpack.Encoder()
to_core_decoder = msgspec.msgpack.Decoder(ToCore)
from_core_decoder = msgspec.msgpack.Decoder(FromCore)
