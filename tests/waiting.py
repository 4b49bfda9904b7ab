"""The one way a test waits for something: poll a condition, never sleep a guessed time."""
from __future__ import annotations

import time
from typing import Callable, TypeVar

import httpx

T = TypeVar("T")


def wait_for(what: str, fn: Callable[[], T], timeout: float = 45.0, interval: float = 0.05, *, proc=None) -> T:
    """Poll fn() until it returns something truthy, and return that. fn may raise while the condition does not hold
    yet (e.g. 404 until an object exists); an AssertionError it raises fails the test at once. AssertionError naming `what` and the last result or error after
    `timeout` seconds, or as soon as `proc` (a Popen the condition depends on) has exited."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            last = fn()
        except AssertionError:   # the condition found something wrong: that is the test's failure, not a wait
            raise
        except Exception as e:   # noqa: BLE001  (reported below if the wait times out)
            last = e
        else:
            if last:
                return last
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: the process exited with {proc.returncode} (last: {last!r})")
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not after {timeout:g} s (last: {last!r})")
        time.sleep(interval)


def wait_http_ok(url: str, timeout: float = 240.0, proc=None) -> None:
    """Until GET url answers 200 (an engine's /readyz, a server's /healthz)."""
    wait_for(f"{url} to answer 200", lambda: httpx.get(url, timeout=1).status_code == 200, timeout, proc=proc)
