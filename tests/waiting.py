"""The one way a test waits for something: poll a condition, never sleep a guessed time."""
from __future__ import annotations

import time
from typing import Callable, TypeVar

import httpx

T = TypeVar("T")


def wait_for(what: str | Callable[[], str], fn: Callable[[], T], timeout: float = 45.0, interval: float = 0.05, *,
             proc=None, error: type[Exception] = AssertionError,
             retry_on: tuple[type[Exception], ...] = (Exception,)) -> T:
    """Poll fn() until it returns something truthy, and return that.

    fn may raise one of `retry_on` while the condition does not hold yet (e.g. 404 until an object exists); an
    AssertionError it raises fails the test at once, as does any exception outside `retry_on`. After `timeout`
    seconds, or as soon as `proc` (a Popen the condition depends on) has exited, raises `error` naming `what` (a
    callable gives the text at that moment: a log tail, the events so far) and the last result or error."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            last = fn()
        except AssertionError:   # the condition found something wrong: that is the test's failure, not a wait
            raise
        except retry_on as e:   # reported below if the wait times out
            last = e
        else:
            if last:
                return last
        if proc is not None and proc.poll() is not None:
            raise error(f"{_text(what)}: the process exited with {proc.returncode} (last: {last!r})")
        if time.monotonic() >= deadline:
            raise error(f"{_text(what)}: not after {timeout:g} s (last: {last!r})")
        time.sleep(interval)


def wait_at_most(fn: Callable[[], T], timeout: float, interval: float = 0.05) -> T | None:
    """A best-effort wait, for a caller that goes on either way (a clean-up with a fallback after it): fn()'s first
    truthy result, or None after `timeout` seconds."""
    try:
        return wait_for("", fn, timeout, interval)
    except AssertionError:
        return None


def wait_http_ok(url: str, timeout: float = 240.0, proc=None) -> None:
    """Until GET url answers 200 (an engine's /readyz, a server's /healthz)."""
    wait_for(f"{url} to answer 200", lambda: httpx.get(url, timeout=1).status_code == 200, timeout, proc=proc)


def _text(what: str | Callable[[], str]) -> str:
    return what() if callable(what) else what
