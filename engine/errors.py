"""Typed engine errors. Bad user input raises InvalidRequestError (a ValueError) naming the bad field."""

from __future__ import annotations


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""


class InvalidRequestError(EngineError, ValueError):
    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class QueueFullError(EngineError):
    """The waiting queue holds max_waiting requests; the caller should retry later (HTTP 429/503)."""


class UnknownModelError(EngineError):
    """The model name is neither a preset nor a checkpoint directory."""
