"""The one HTTP session per thread that the adapters' clients (metrics scrapes, correctness replays) share the way
of: requests.Session is not thread-safe, and the environment's proxies must never carry an engine's traffic."""
from __future__ import annotations

import threading

import requests


def thread_session(local: threading.local) -> requests.Session:
    """This thread's session in `local`, made on first use (trust_env off)."""
    s = getattr(local, "session", None)
    if s is None:
        s = local.session = requests.Session()
        s.trust_env = False
    return s
