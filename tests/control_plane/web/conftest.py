"""Fixtures of the web tests: an app on a real SQLite store with three users (viewer, operator, admin), and rollouts
driven by the real worker and state machine (in-memory deployer, canned metrics, frozen clock) so checks hold real
evidence."""
from __future__ import annotations

import pytest

from sits.control_plane.analysis import Policy
from sits.control_plane.web import create_app
from sits.control_plane.service.rollouts import start_rollout
from sits.control_plane.store.db import Store
from sits.control_plane.web.users import Users, token_sha256
from sits.control_plane.worker.loop import Worker

from tests.control_plane.worker.support import CannedSource, InMemoryDeployer
from tests.control_plane.helpers import latency_policy

TOKENS = {"viewer": "viewer-token-0123456789", "operator": "operator-token-0123456789",
          "admin": "admin-token-0123456789"}
NAMES = {"viewer": "vera", "operator": "otto", "admin": "ada"}
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
    return Users.from_dict({"users": [{"name": NAMES[r], "role": r, "token_sha256": token_sha256(t)}
                                      for r, t in TOKENS.items()]})


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
