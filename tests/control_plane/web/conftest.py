"""Fixtures of the web tests: an app on a real SQLite store with three users (viewer, operator, admin), and rollouts
driven by the real worker and state machine (in-memory deployer, canned metrics, frozen clock) so checks hold real
evidence.

Browser tests (test_browser_*.py): a module names its rollouts, `SCENARIO = <ui_scenarios*.build>` (built once into
`sc`), and optionally `APP_CONFIG` for the app; `server` serves them, `browser` is one Chromium signed in per role
(browser_support.py)."""
from __future__ import annotations

import pytest

from sits.control_plane.analysis import Policy
from sits.control_plane.web import create_app
from sits.control_plane.service.rollouts import start_rollout
from sits.control_plane.store.db import Store
from sits.control_plane.web.users import Users
from sits.control_plane.worker.loop import Worker

from tests.control_plane.worker.support import CannedSource, InMemoryDeployer
from tests.control_plane.helpers import latency_policy

from .accounts import TOKENS, app_users
from .browser_support import Browser, Server
POLICY = latency_policy(steps=(10, 50, 100), check_interval_s=10, warmup_s=5)   # canned windows: no engines for the gate
GATED_POLICY = Policy(steps=(10, 50, 100), check_interval_s=10, warmup_s=5)     # the correctness gate on (default)


def auth(role: str) -> dict:
    return {"Authorization": f"Bearer {TOKENS[role]}"}


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def users() -> Users:
    return app_users()


# ---- browser tests: the module's rollouts, an app server over them, one Chromium -------------------------------------
@pytest.fixture(scope="module")
def sc(request, tmp_path_factory):
    """The module's SCENARIO built once into a fresh store (the real worker, state machine and analysis)."""
    s = request.module.SCENARIO(str(tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1]) / "sits.db"))
    yield s
    s.store.close()


@pytest.fixture(scope="module")
def server(request, sc):
    """The app (waitress, in a thread) over the scenario's store, with the module's APP_CONFIG."""
    srv = Server(sc.store, **getattr(request.module, "APP_CONFIG", {}))
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def browser(server):
    b = Browser(pytest.importorskip("playwright.sync_api"), server.url)
    yield b
    b.close()


@pytest.fixture
def store(tmp_path):
    s = Store(str(tmp_path / "sits.db"))
    yield s
    s.close()


@pytest.fixture
def login_clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def app(store, users, login_clock):
    return create_app({"TESTING": True, "STORE": store, "SITS_USERS": users, "LOGIN_CLOCK": login_clock,
                       "SECRET_KEY": "test-secret"})


@pytest.fixture
def client(app):
    return app.test_client()


def drive(store: Store, rollout_id: str, passes: int, scale: float = 1.0, t0: float = 0.0, dt: float = 5.0,
          deployer: InMemoryDeployer | None = None) -> float:
    """`passes` worker passes over the store, every `dt` s of a frozen clock from t0; returns the last time."""
    service = store.get(rollout_id).service
    deployer = deployer or InMemoryDeployer()
    source = CannedSource(scale={service: scale})
    t = [t0]
    w = Worker(store, deployer, source, clock=lambda: t[0], owner="test-worker")
    for _ in range(passes):
        t[0] += dt
        w.run_once()
    return t[0]


def new_rollout(store: Store, service: str = "chat", now: float = 0.0, **kw):
    return start_rollout(store, service, kw.pop("canary", "triton-v1.1"), kw.pop("production", "triton-v1"),
                         kw.pop("policy", POLICY), now=now, actor=kw.pop("actor", "tester"), **kw)


def snapshot(store: Store) -> dict:
    """Everything a rejected request must leave unchanged."""
    rs = store.list(limit=100000)
    return {"rollouts": [(r.id, r.phase, r.version) for r in rs], "count": store.count(),
            "events": {r.id: store.events(r.id) for r in rs},
            "commands": {r.id: store.commands.pending(r.id) for r in rs},
            "checks": {r.id: store.check_summaries(r.id) for r in rs}}
