"""HTTP client of the control plane's API, and `sits-control rollout ... --url URL` (token from $SITS_TOKEN).

    ApiClient("http://127.0.0.1:8080", token).start({"service": "chat", "kernels": "triton-v1.1"})
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Callable

import httpx

from sits.control_plane.service import format as fmt
from sits.control_plane import numbers
from sits.control_plane.view import Headline, decode_check
from sits.control_plane.errors import ConflictError, NotFoundError, SitsError, ValidationError


class ApiError(SitsError):
    """The API answered with an error (status, code, message, field) or could not be reached."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message + (f" (field {field})" if field else "") + (f" [HTTP {status}]" if status else ""))
        self.status, self.code, self.message, self.field = status, code, message, field


class ApiClient:
    def __init__(self, url: str, token: str | None = None, timeout: float = 30.0) -> None:
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url + "/api/v1", headers=headers, timeout=timeout, trust_env=False)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "ApiClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method: str, path: str, **kw) -> Any:
        try:
            r = self._http.request(method, path, **kw)
        except httpx.HTTPError as e:
            raise ApiError(0, "unreachable", f"cannot reach {self.url}: {type(e).__name__}: {e}") from None
        try:
            body = r.json()
        except ValueError:
            body = None
        if r.status_code >= 400:
            err = (body or {}).get("error") if isinstance(body, dict) else None
            err = err or {"code": "http", "message": r.text[:200] or r.reason_phrase, "field": None}
            cls = {404: NotFoundError, 409: ConflictError, 422: ValidationError}.get(r.status_code)
            if cls is ValidationError:
                raise ValidationError(err["message"], err.get("field"))
            if cls is not None:
                raise cls(err["message"])
            raise ApiError(r.status_code, err["code"], err["message"], err.get("field"))
        return body

    def list(self, **filters) -> dict:
        return self._call("GET", "/rollouts", params={k: v for k, v in filters.items() if v is not None})

    def start(self, body: dict) -> dict:
        return self._call("POST", "/rollouts", json=body)

    def get(self, rollout_id: str) -> dict:
        return self._call("GET", f"/rollouts/{rollout_id}")

    def checks(self, rollout_id: str, since_seq: int = 0) -> list[dict]:
        return self._call("GET", f"/rollouts/{rollout_id}/checks", params={"since_seq": since_seq})["checks"]

    def events(self, rollout_id: str) -> list[dict]:
        return self._call("GET", f"/rollouts/{rollout_id}/events")["events"]

    def command(self, rollout_id: str, command: str) -> dict:
        return self._call("POST", f"/rollouts/{rollout_id}/{command}", json={})


# ---- progress of a rollout until it ends (store or API) -------------------------------------------------------------
def progress_line(r: dict) -> str:
    """'progressing · step 2/5 at 10 % · check 4: pass -> advance · p99 request latency +3.1 % [-2.0 %, +8.0 %] <=
    +10.0 %'"""
    steps = r.get("steps") or []
    step = (f"step {r['step'] + 1}/{len(steps)} at {r['weight']} %" if r.get("step", -1) >= 0
            else "before the first step")
    line = f"{r['phase']} · {step}"
    if not r.get("last_check"):
        return line
    c = Headline.from_dict(r["last_check"])
    line += f" · check {c.seq}: {c.outcome} -> {c.decision}"
    if c.delta is not None:
        line += f" · {c.label} {numbers.delta(c.kind, c.delta)} {numbers.interval(c.kind, c.ci_low, c.ci_high)}"
        if c.sequential:   # the confidence sequence between its two boundaries
            line += (f" ship {numbers.delta(c.kind, c.ship)} / limit {numbers.delta(c.kind, c.threshold)} · "
                     f"{numbers.plural(c.windows or 0, 'window')}")
            if c.outcome == "inconclusive" and c.eta_s is not None:
                line += f" · decides in {numbers.eta(c.eta_s)}"
        elif c.threshold is not None:
            line += f" <= {numbers.delta(c.kind, c.threshold)}"
    if c.need_more and c.outcome == "inconclusive" and not c.sequential:
        line += f" (needs about {c.need_more} more request{'' if c.need_more == 1 else 's'})"
    return line


def wait(fetch: Callable[[], dict], out: Callable[[str], None] = print, interval: float = 1.0,
         sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> int:
    """Print a line whenever the rollout's phase, step or last check changes, until it ends. 0 if it succeeded, 1
    if it was rolled back or failed."""
    t0, last = clock(), None
    while True:
        r = fetch()
        key = (r["phase"], r.get("step"), r.get("weight"), (r.get("last_check") or {}).get("seq"))
        if key != last:
            last = key
            out(f"[{clock() - t0:6.1f}s] {progress_line(r)}")
        if not r.get("active", True):
            out(f"rollout {r['id']} {r['phase'].replace('_', ' ')}: {r.get('reason') or '-'}")
            return 0 if r["phase"] == "succeeded" else 1
        sleep(interval)


# ---- `sits-control rollout ... --url URL`: the same commands over the API -------------------------------------------
def client_from(a) -> ApiClient:
    return ApiClient(a.url, os.environ.get("SITS_TOKEN"))


def remote_start(a, body: dict) -> int:
    with client_from(a) as c:
        r = c.start(body)
        retry = f" as a retry of {r['retry_of']}" if r.get("retry_of") else ""
        print(f"rollout {r['id']} created{retry} for service {r['service']}: canary {r['kernels']} vs production "
              f"{r['production_kernels']} (via {a.url})", flush=True)
        return wait(lambda: c.get(r["id"])) if a.wait else 0


def remote_list(a) -> int:
    with client_from(a) as c:
        rs = c.list(active="true" if a.active else None, limit=500)["rollouts"]
    if not rs:
        print("no rollouts")
        return 0
    print(f"{'ID':40} {'SERVICE':12} {'PHASE':13} {'STEP':6} {'WEIGHT':6} {'CHECKS':6} CREATED")
    for r in rs:
        step = f"{r['step'] + 1}/{len(r['steps'])}" if r["step"] >= 0 else "-"
        print(f"{r['id']:40} {r['service']:12} {r['phase']:13} {step:6} {r['weight']:>5}% {r['checks']:>6} "
              f"{fmt.when(r['created_at'])}")
    return 0


def remote_show(a) -> int:
    with client_from(a) as c:
        r, checks, events = c.get(a.id), c.checks(a.id), c.events(a.id)
    if a.json:
        print(json.dumps({"rollout": r, "checks": checks, "events": events}, indent=1))
        return 0
    print(f"rollout {r['id']}  service {r['service']}  canary {r['kernels']}  production {r['production_kernels']}")
    print(f"{progress_line(r)}; {r['checks']} checks; {r['reason'] or '-'}")
    print("events:")
    for e in events:
        if e["kind"] != "check":
            print(f"  {fmt.when(e['at'])}  [{e['phase']}] {e['message']}" + (f"  ({e['actor']})" if e["actor"] else ""))
    print("checks:")
    for ev in checks:
        for line in fmt.format_check(decode_check(ev), r["steps"]):
            print("  " + line)
    return 0


def remote_command(a) -> int:
    with client_from(a) as c:
        out = c.command(a.id, a.command)
    print(f"{a.command} queued for rollout {a.id} by {out['actor']} (phase {out['rollout']['phase']}); the worker "
          "applies it at its next pass")
    return 0
