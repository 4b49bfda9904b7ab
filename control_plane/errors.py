"""The control plane's user-facing errors. Pure: every layer raises these, the API maps them to 4xx JSON bodies and
the CLI to one line with exit code 2."""
from __future__ import annotations


class SitsError(Exception):
    """Base of every user-facing error."""


class ValidationError(SitsError, ValueError):
    """Bad input (422 in the API, exit 2 in the CLI). `field`: the input field at fault, where there is one."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field

    def __reduce__(self):   # picklable with its field (exceptions cross process boundaries in tests and servers)
        return type(self), (str(self), self.field)


class NotFoundError(SitsError, KeyError):
    """No such object (404)."""

    def __str__(self) -> str:   # KeyError's str() quotes its argument; these carry a sentence
        return str(self.args[0]) if self.args else ""


class ConflictError(SitsError):
    """Not possible in the current state (409): the service already has an active rollout, a command the rollout's
    phase does not allow, a concurrent write."""
