"""Typed engine errors. Bad user input raises InvalidRequestError (a ValueError) naming the bad field."""

from __future__ import annotations


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""


class InvalidRequestError(EngineError, ValueError):
    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class ContextLengthError(InvalidRequestError):
    """The prompt, or the prompt plus max_tokens, does not fit the model's context. `param` is the prompt's field
    (`prompt_param`: "prompt" for the engine and completions, "messages" for chat) or "max_tokens"."""

    def __init__(self, prompt_tokens: int, max_tokens: int, context: int, prompt_param: str = "prompt"):
        self.prompt_tokens, self.max_tokens, self.context = prompt_tokens, max_tokens, context
        if prompt_tokens >= context:
            super().__init__(f"the prompt has {prompt_tokens} tokens but the model's context is {context} tokens "
                             "(the prompt plus at least one output token must fit)", prompt_param)
        else:
            super().__init__(f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) = "
                             f"{prompt_tokens + max_tokens} exceeds the model's context of {context} tokens: at "
                             f"most {context - prompt_tokens} tokens can be generated", "max_tokens")


def check_context_length(prompt_tokens: int, max_tokens: int, context: int, prompt_param: str = "prompt") -> None:
    """Raise ContextLengthError unless the prompt and max_tokens output tokens fit in `context` tokens."""
    if prompt_tokens >= context or prompt_tokens + max_tokens > context:
        raise ContextLengthError(prompt_tokens, max_tokens, context, prompt_param)


class QueueFullError(EngineError):
    """The waiting queue holds max_waiting requests; the caller should retry later (HTTP 429/503)."""


class UnknownModelError(EngineError):
    """The model name is neither a preset nor a checkpoint directory."""


class StepError(EngineError):
    """The model failed during LLMEngine.step(). The sequences of that step were aborted (their blocks freed) and
    `.outputs` holds their final RequestOutputs (finish_reason "abort"); the engine stays usable."""

    def __init__(self, message: str, outputs: list):
        super().__init__(message)
        self.outputs = outputs


class TensorParallelError(EngineError):
    """A tensor-parallel rank failed to start or to load its shard, or died (engine/parallel/): the engine cannot
    run; the message names the rank and what it reported."""
