"""Low-traffic mode's sender (Policy.low_traffic): when a check is inconclusive and says how many more requests per
variant it needs, replay that many workload-matched requests (control_plane/worker/workload.py) to canary AND
baseline, straight to their engines (never production, never through the router), within the policy's rate and its
per-step and per-rollout budgets.

Three pieces, each with its own state:
  `ReplayPlan`      what is owed, what the budgets leave, when the next request may go (rate and concurrency); pure,
                    the time is passed in
  `RolloutReplay`   one rollout's bounded background sender: a thread that sends pairs (one request to canary and
                    one to baseline at once, each drawn from the workload on its own) as the plan allows, and stops at once when told or when `halted()` says a
                    pause or abort is queued (no new request after that; at most `concurrency` pairs in flight finish)
  `Replayer`        the worker's part: one RolloutReplay per rollout, started and fed after each pass, stopped when the
                    rollout leaves PROGRESSING; counts `sits_replayed_requests_total{service,variant}`
The clock and the wait are injected (tests drive them); the HTTP goes through an adapters.inference.replay sender.
"""
from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Sequence

from sits.control_plane.adapters.inference.replay import ReplaySender
from sits.control_plane.analysis import LowTrafficPolicy, Outcome, Verdict
from sits.control_plane.rollout import Phase, Rollout
from sits.control_plane.worker.workload import Workload, prompt

log = logging.getLogger(__name__)
VARIANTS = ("canary", "baseline")


class ReplayPlan:
    """Owed requests per variant within the budgets, paced at max_rps with at most `concurrency` in flight.
    `sent_step` / `sent_total` count requests issued (one per variant of a pair), whatever their answer."""

    def __init__(self, policy: LowTrafficPolicy, *, sent_total: int = 0, step: int = -1, sent_step: int = 0) -> None:
        self.policy = policy
        self.sent_total, self.step, self.sent_step = sent_total, step, sent_step
        self.owed = 0
        self.in_flight = 0
        self.next_at = float("-inf")
        self._done: deque[float] = deque()   # when each recent pair finished

    def left(self) -> int:
        p = self.policy
        return max(0, min(p.max_requests_per_step - self.sent_step, p.max_requests_per_rollout - self.sent_total))

    def demand(self, n: int, step: int, as_of: float | None) -> int:
        """A check whose data ends at `as_of` needs `n` more requests per variant: owe what pairs in flight or finished
        since then do not already bring, capped by the budgets. A new `step` starts its own budget. Returns the owed."""
        if step != self.step:
            self.step, self.sent_step, self.owed = step, 0, 0
        unseen = self.in_flight + (sum(1 for t in self._done if as_of is None or t > as_of))
        self.owed = min(max(0, int(n) - unseen), self.left())
        return self.owed

    def cancel(self) -> None:
        self.owed = 0

    def take(self, now: float) -> float | None:
        """0.0 and one pair counted as sent when a pair may go now; else seconds to wait (the rate, or None: nothing
        owed, or every slot busy, until something changes)."""
        if self.owed <= 0 or self.left() <= 0:
            self.owed = 0
            return None
        if self.in_flight >= self.policy.concurrency:
            return None
        if now < self.next_at:
            return self.next_at - now
        self.next_at = max(self.next_at, now) + 1.0 / self.policy.max_rps
        self.owed -= 1
        self.in_flight += 1
        self.sent_step += 1
        self.sent_total += 1
        return 0.0

    def revoke(self) -> None:
        """Undo the last take(): the pair was not sent after all."""
        self.in_flight -= 1
        self.sent_step -= 1
        self.sent_total -= 1

    def finished(self, now: float) -> None:
        self.in_flight -= 1
        self._done.append(now)
        while len(self._done) > 10_000:
            self._done.popleft()


@dataclass(slots=True)
class ReplayStats:
    sent: int = 0          # pairs issued by this sender (each is one request to canary and one to baseline)
    failed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(VARIANTS, 0))   # no good answer
    stopped: str = ""      # why the sender stopped ("" while it runs)


class RolloutReplay:
    """One rollout's sender. `start()` runs its thread; `demand(...)` feeds it; `stop(why)` ends it."""

    def __init__(self, rollout_id: str, service: str, policy: LowTrafficPolicy, urls: dict[str, str], model: str,
                 prompts: Sequence[str], sender: ReplaySender, *, clock: Callable[[], float],
                 halted: Callable[[], bool] = lambda: False, counted: Callable[[str], None] = lambda variant: None,
                 sent_total: int = 0, step: int = -1, sent_step: int = 0, seed: int | None = None) -> None:
        self.rollout_id, self.service, self.policy, self.urls, self.model = rollout_id, service, policy, urls, model
        self.prompts, self.sender, self.clock = tuple(prompts), sender, clock
        self.halted, self.counted = halted, counted
        self.plan = ReplayPlan(policy, sent_total=sent_total, step=step, sent_step=sent_step)
        self.stats = ReplayStats(sent=0)
        self.workload = Workload(None, None, 0.0, (("/v1/completions", 1.0),), 0.0)
        self._rng = random.Random(seed)
        self._chars_per_token = 1.0   # learnt from the engines' usage.prompt_tokens
        self._cv = threading.Condition()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(2 * policy.concurrency, thread_name_prefix=f"sits-replay-{service}")
        self._thread: threading.Thread | None = None

    # ---- control ----
    def start(self) -> "RolloutReplay":
        self._thread = threading.Thread(target=self._run, name=f"sits-replay-{self.service}", daemon=True)
        self._thread.start()
        return self

    def demand(self, n: int, step: int, as_of: float | None, workload: Workload | None = None) -> int:
        with self._cv:
            if workload is not None and workload.known:
                self.workload = workload
            owed = self.plan.demand(n, step, as_of)
            self._cv.notify_all()
            return owed

    def cancel(self) -> None:
        """Nothing more owed (the check decided); the sender stays up for the next demand."""
        with self._cv:
            self.plan.cancel()

    def stop(self, why: str) -> None:
        with self._cv:
            if not self._stop.is_set():
                self.stats.stopped = why
            self._stop.set()
            self.plan.cancel()
            self._cv.notify_all()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return not self._stop.is_set()

    # ---- the sender thread ----
    def _run(self) -> None:
        while not self._stop.is_set():
            with self._cv:
                wait = self.plan.take(self.clock())
                if wait is None or wait > 0:
                    self._cv.wait(0.5 if wait is None else min(wait, 0.5))
                    continue
                # one independent draw per variant, from the same workload: identical requests sent at the same
                # moment would, on engines sharing CPUs, make each variant's slowest requests coincide with the other's
                pair = {}
                for v in VARIANTS:
                    req = self.workload.sample(self._rng)
                    pair[v] = (req, prompt(self.prompts, req.prompt_tokens, self._chars_per_token, self._rng))
            if self.halted():   # a pause or abort is queued: not one request more
                with self._cv:
                    self.plan.revoke()
                self.stop("a pause or abort is queued")
                break
            with self._cv:
                self.stats.sent += 1
            self._send_pair(pair)

    def _send_pair(self, pair: dict) -> None:
        remaining = {"n": len(VARIANTS)}
        lock = threading.Lock()

        def one(variant: str) -> None:
            req, text = pair[variant]
            ans = self.sender.send(self.urls[variant], req.route, self.model, text, req.max_tokens, req.stream,
                                   self.policy.request_timeout_s)
            self.counted(variant)
            with self._cv:
                if not ans.ok:
                    self.stats.failed[variant] += 1
                elif ans.prompt_tokens > 0 and req.prompt_tokens > 0:
                    ratio = ans.prompt_chars / ans.prompt_tokens
                    self._chars_per_token = 0.8 * self._chars_per_token + 0.2 * ratio
            with lock:
                remaining["n"] -= 1
                last = remaining["n"] == 0
            if last:
                with self._cv:
                    self.plan.finished(self.clock())
                    self._cv.notify_all()

        try:   # which variant's request goes first: at random, so that neither is systematically ahead
            for v in self._rng.sample(VARIANTS, len(VARIANTS)):
                self._pool.submit(one, v)
        except RuntimeError:   # stopped meanwhile: the pool takes nothing more
            with self._cv:
                self.plan.finished(self.clock())


class Replayer:
    """The worker's component. `after_pass(rollout, endpoints)` after every saved pass: (re)starts or feeds the
    rollout's sender from its newest check, or stops it when the rollout is no longer PROGRESSING or the mode is off;
    `stop(rollout_id, why)` at once (a pause or abort in the pass); `close()` stops every sender."""

    def __init__(self, sender: ReplaySender, *, clock: Callable[[], float] = time.time,
                 load_prompts: Callable[[object], Sequence[str]], halted: Callable[[str], bool],
                 counted: Callable[[str, str], None] = lambda service, variant: None) -> None:
        self.sender, self.clock, self.load_prompts = sender, clock, load_prompts
        self.halted, self.counted = halted, counted
        self._lock = threading.Lock()
        self._replays: dict[str, RolloutReplay] = {}

    def get(self, rollout_id: str) -> RolloutReplay | None:
        with self._lock:
            return self._replays.get(rollout_id)

    def stop(self, rollout_id: str, why: str) -> None:
        with self._lock:
            rep = self._replays.pop(rollout_id, None)
        if rep is not None:
            rep.stop(why)
            log.info("rollout %s (%s): replay stopped (%s) after %d pairs", rollout_id, rep.service, why,
                     rep.stats.sent)

    def close(self) -> None:
        for rid in list(self._replays):
            self.stop(rid, "worker stopping")

    def after_pass(self, rollout: Rollout, endpoints: Callable[[], dict[str, str]]) -> RolloutReplay | None:
        """`rollout`: as the pass left it, with its new checks; `endpoints()`: canary's and baseline's engine URLs
        (asked only when a sender starts)."""
        lt = rollout.policy.low_traffic
        if not lt.enabled or rollout.phase is not Phase.PROGRESSING:
            self.stop(rollout.id, f"rollout {rollout.phase.value}" if lt.enabled else "low_traffic off")
            return None
        checks = [c for c in rollout.new_checks if c.source != "correctness"]
        if not checks:
            return self.get(rollout.id)
        check = checks[-1]
        need = requests_wanted(check.verdict)
        rep = self.get(rollout.id)
        if not need:
            if rep is not None:
                rep.cancel()
            return rep
        if rep is None or not rep.running:
            urls = endpoints()
            if not all(urls.get(k) for k in VARIANTS):
                return None
            prompts = self.load_prompts(lt.prompt_set if lt.prompt_set is not None
                                        else rollout.policy.correctness.prompt_set)
            model = self.sender.model(urls["canary"], lt.request_timeout_s)
            sent = int(rollout.replayed_requests)
            step_sent = int(rollout.data.get("canary").replayed) if "canary" in rollout.data else 0
            rep = RolloutReplay(rollout.id, rollout.service, lt, {k: urls[k] for k in VARIANTS}, model, prompts,
                                self.sender, clock=self.clock, halted=lambda: self.halted(rollout.id),
                                counted=lambda variant: self.counted(rollout.service, variant),
                                sent_total=sent, step=rollout.step, sent_step=step_sent)
            with self._lock:
                self._replays[rollout.id] = rep.start()
        owed = rep.demand(need, rollout.step, check.window_end, Workload.from_data(check.data))
        log.info("rollout %s (%s): check %d needs %d more requests per variant: %d owed (budget left %d)",
                 rollout.id, rollout.service, check.seq, need, owed, rep.plan.left())
        return rep


def requests_wanted(v: Verdict) -> int | None:
    """How many more requests per variant a check asks replay for: an inconclusive verdict's need_more; for a
    failed one that is not a guard (it is confirmed by the next checks), what its still inconclusive metrics need, so
    that the confirming checks judge every metric; None otherwise (a pass, a guard, or more data cannot help)."""
    if v.outcome is Outcome.INCONCLUSIVE:
        return v.need_more
    if v.outcome is Outcome.FAIL and v.guard is None:
        more = [r.need_more for r in v.results if r.outcome is Outcome.INCONCLUSIVE and r.need_more]
        return max(more) if more else None
    return None
