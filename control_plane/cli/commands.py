"""What each `sits-control` command does with its parsed flags (control_plane/cli/main.py parses them): rollout
start/list/show and the commands, worker, serve, demo. Each returns the process's exit status."""
from __future__ import annotations

import dataclasses
import json
import shlex
import signal
import sys
import time

import yaml
from prometheus_client import start_http_server

from sits.control_plane.adapters.deploy import DeployError
from sits.control_plane.adapters.kernel_catalog import KernelCatalog
from sits.control_plane.adapters.deploy.spec import DeploySpec
from sits.control_plane.analysis import Policy, PolicyError
from sits.control_plane.analysis.calibration import calibrate
from sits.control_plane import numbers
from sits.control_plane.cli import client
from sits.control_plane.cli.build import CLIError, build_worker, open_store, prometheus_config, start_crd_watcher
from sits.control_plane.demo.profiles import PROFILES
from sits.control_plane.demo.runner import DemoConfig, run_demo
from sits.control_plane.redact import redact
from sits.control_plane.service import format as fmt
from sits.control_plane.service import rollouts as service
from sits.control_plane.small_files import FileTooLargeError, read_small_file
from sits.control_plane.store.backup import backup
from sits.control_plane.store.codec import nonfinite_to_strings, rollout_to_dict
from sits.control_plane.store.db import Store
from sits.control_plane.view import decode_check, headline_of
from sits.control_plane.view.names import series_label
from sits.control_plane.web import present
from sits.control_plane.web.serve import ServeError, serve
from sits.control_plane.worker.lifecycle import shutdown
from sits.control_plane.worker.loop import Worker

SIGNAL_POLL_S = 0.2   # how soon `sits-control worker` sees a SIGTERM that another of its threads took


def cmd_backup(a) -> int:
    open_store(a.store, readonly=True).close()   # the same checks (and one-line errors) as every store command
    rollouts = backup(a.store, a.out)
    print(f"backed up {a.store} to {a.out} ({rollouts} rollouts, checked)")
    return 0


MAX_POLICY_BYTES = 1 << 20   # a policy is a few hundred bytes; a 35 MB one is a mistake or an attack


def _load_policy(path: str | None) -> Policy:
    if path is None:
        return Policy()
    try:
        raw = read_small_file(path, MAX_POLICY_BYTES)
    except OSError as e:
        raise CLIError(f"cannot read policy file {path}: {e.strerror}") from None
    except FileTooLargeError:
        raise CLIError(f"policy file {path} is larger than {MAX_POLICY_BYTES} bytes") from None
    try:
        text = raw.decode("utf-8")
        data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
        return Policy.from_dict(data)
    except PolicyError as e:
        raise CLIError(f"policy {path}: {e}") from None
    except RecursionError:
        raise CLIError(f"policy {path} is nested too deeply to be a policy") from None
    except (ValueError, yaml.YAMLError) as e:   # JSONDecodeError, UnicodeDecodeError, YAML tags and syntax
        raise CLIError(f"policy {path} is not valid JSON/YAML: {_first_line(e)}") from None


def _first_line(e: Exception) -> str:
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    return (" ".join(lines[:3]) or type(e).__name__)[:300]


def engine_args(a) -> tuple[list[str] | None, list[str] | None]:
    """(production's, the canary's) engine args from `rollout start`'s flags: every --production-arg / --arg
    (each shell-quoted, split with shlex), then the older rest-of-the-line forms --production-args / --args, each
    ending where the other begins (argparse gives the first of them the rest of the line, the other included).
    None where neither form of a flag was given (an empty one, `--arg ''`, is an explicit none)."""
    rest = {"--production-args": a.production_args, "--args": a.args}
    for flag, other in (("--production-args", "--args"), ("--args", "--production-args")):
        if rest[flag] is not None and other in rest[flag]:   # `--production-args A --args B`: B went to the first
            i = rest[flag].index(other)
            rest[flag], rest[other] = rest[flag][:i], (rest[other] or []) + rest[flag][i + 1:]

    def split(values: list[str], older: list[str] | None, flag: str) -> list[str] | None:
        if not values and older is None:
            return None
        out = []
        for v in values:
            try:
                out += shlex.split(v)
            except ValueError as e:   # an unclosed quote
                raise CLIError(f"{flag} {v[:80]!r}: {e}") from None
        return out + list(older or ())
    return (split(a.production_arg, rest["--production-args"], "--production-arg"),
            split(a.arg, rest["--args"], "--arg"))


# ---- commands ---------------------------------------------------------------------------------------------------
def cmd_rollout_start(a) -> int:
    policy = _load_policy(a.policy)
    production_args, canary_args = engine_args(a)
    if a.url:   # what is left out the service decides: its production's kernel set and flags
        body = {"service": a.service, "kernels": a.kernels, "model": a.model, "replicas": a.replicas, "gpus": a.gpus,
                "policy": policy.to_dict() if a.policy else None, "args": canary_args,
                "production_args": production_args, "production_kernels": a.production_kernels,
                "device": a.device, "ready_timeout_s": a.ready_timeout,
                "tensor_parallel_size": a.tensor_parallel_size if a.tensor_parallel_size != 1 else None}
        return client.remote_start(a, {k: v for k, v in body.items() if v is not None})
    with open_store(a.store, must_exist=False) as store:
        # as over the API: what is left out is what the service's production runs now, so a canary changes only
        # what it names (production's set and flags, the last promoted canary's; the canary's flags: production's)
        production = a.production_kernels   # "" is refused by start_rollout
        if production is None or production_args is None:
            current = service.current_production(store, a.service)
            production = current[0] if production is None else production
            production_args = current[1] if production_args is None else production_args
        canary_args = production_args if canary_args is None else canary_args
        spec = DeploySpec(model=a.model, replicas=a.replicas, production_args=tuple(production_args),
                          canary_args=tuple(canary_args), production_image=a.production_image, canary_image=a.image,
                          gpus=a.gpus, device=a.device, ready_timeout_s=a.ready_timeout,
                          tensor_parallel_size=a.tensor_parallel_size)
        r = service.start_rollout(store, a.service, a.kernels, production, policy, spec, actor=a.by,
                                  kernel_sets=KernelCatalog.discover(a.kernel_catalog, need=(a.kernels, production)),
                                  local_models=a.deployer == "local")
        shown = f" {' '.join(production_args)}" if production_args else ""
        print(f"rollout {r.id} created for service {r.service}: canary {r.canary_kernels} vs production "
              f"{r.production_kernels}{shown}; a running `sits-control worker --store {a.store}` (or `serve`) takes "
              "it from here", flush=True)
        if a.wait:
            return client.wait(lambda: _summary(store, r.id))
    return 0


def cmd_rollout_retry(a) -> int:
    """A new rollout linked to an ended one that did not succeed, with its spec and policy (over the API: the
    server takes them; production is what the service runs now there, the old rollout's production here)."""
    if a.url:
        body = {"retry_of": a.id, "kernels": a.kernels, "production_kernels": a.production_kernels}
        return client.remote_start(a, {k: v for k, v in body.items() if v is not None})
    with open_store(a.store) as store:
        old = service.retry_target(store, a.id)
        kernels, production = a.kernels or old.canary_kernels, a.production_kernels or old.production_kernels
        r = service.start_rollout(store, old.service, kernels, production, old.policy, store.spec(old.id),
                                  actor=a.by, retry_of=old.id,
                                  kernel_sets=KernelCatalog.discover(a.kernel_catalog, need=(kernels, production)))
        print(f"rollout {r.id} created as a retry of {old.id} ({old.phase.value}) for service {r.service}: canary "
              f"{r.canary_kernels} vs production {r.production_kernels}; a running `sits-control worker --store "
              f"{a.store}` (or `serve`) takes it from here", flush=True)
        if a.wait:
            return client.wait(lambda: _summary(store, r.id))
    return 0


def _summary(store: Store, rollout_id: str) -> dict:
    """What `--wait` follows, read from the store: the API's rollout summary."""
    r = store.get(rollout_id)
    last = headline_of(decode_check(store.check(r.id, r.checks))) if r.checks else None
    return present.rollout_summary(r, last, service.allowed_commands(r))


def cmd_rollout_list(a) -> int:
    if a.url:
        return client.remote_list(a)
    with open_store(a.store, readonly=True) as store:
        print("\n".join(fmt.rollout_table(store.list(active=True if a.active else None))))
    return 0


def cmd_rollout_calibrate(a) -> int:
    """`sits-control rollout calibrate ID`: the replica offset per check series and the ship boundary that clears it."""
    with open_store(a.store, readonly=True) as store:
        r = store.get(a.id)
    rows = calibrate(r.sequence, r.policy, aa=r.canary_kernels == r.production_kernels)
    if a.json:
        print(json.dumps([nonfinite_to_strings(dataclasses.asdict(c)) for c in rows], indent=1))
        return 0
    if not rows:
        print(f"rollout {r.id}: no windows of identical engines (canary {r.canary_kernels} against production "
              f"{r.production_kernels}, and no production traffic beside the baseline): run an A/A rollout, e.g. "
              f"`sits-control rollout start --service {r.service} --kernels {r.production_kernels}`")
        return 1
    print(f"rollout {r.id} ({r.service}): replica offset, {r.policy.alpha:g} alpha over "
          f"{len(r.policy.checks)} checks")
    for c in rows:
        kind = numbers.ABS if c.check == "error_rate" else numbers.REL
        ship = "more windows needed" if c.suggested_ship is None else (
            f"ship_{'abs' if c.check == 'error_rate' else 'rel'}_delta {c.suggested_ship:g}"
            + ("" if c.suggested_ship < c.limit else f" (NOT below the limit {c.limit:g}: more windows narrow the "
                                                      "bounds; else raise the limit or reduce the noise)"))
        bounds = "" if c.suggested_ship is None else " " + numbers.interval(kind, c.ci_low, c.ci_high)
        print(f"  {series_label(c.check, c.series)} [{c.source}]: {numbers.delta(kind, c.delta)}{bounds} over "
              f"{c.windows} windows -> {ship}")
    return 0


def cmd_rollout_show(a) -> int:
    if a.url:
        return client.remote_show(a)
    with open_store(a.store, readonly=True) as store:   # what was stored before redaction existed is masked here
        if a.json:
            r = store.get(a.id)
            print(redact(json.dumps({"rollout": rollout_to_dict(r), "checks": store.checks(a.id),
                                     "events": store.events(a.id), "actions": store.actions(a.id),
                                     "notifications": store.deliveries.of_rollout(a.id)}, indent=1)))
        else:
            print("\n".join(redact(line) for line in fmt.rollout_report(store, a.id)))
    return 0


def cmd_rollout_command(a) -> int:
    if a.url:
        return client.remote_command(a)
    with open_store(a.store) as store:
        service.send_command(store, a.id, a.command, a.by)
        r = store.get(a.id)
    print(f"{a.command} queued for rollout {a.id} (phase {r.phase.value}); the worker applies it at its next pass")
    return 0


def cmd_worker(a) -> int:
    try:
        worker = build_worker(a)
    except ValueError as e:
        raise CLIError(str(e)) from None
    if a.metrics_port:
        start_http_server(a.metrics_port, a.metrics_host, registry=worker.metrics.registry)
    # The handler only records, and the main thread naps instead of blocking in one Event.wait(): the kernel may hand
    # a SIGTERM to any of the worker's threads, and CPython then runs the handler only when the main thread next runs
    # bytecode, which a blocking wait never does (a worker once deployed on for a minute after its SIGTERM); an
    # Event.set() in the handler could also deadlock on the lock of the very wait it interrupts.
    signals: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: signals.append(signum))
    print(redact(f"worker: store {worker.store.path}, every {worker.config.interval_s:g} s, metrics from "
                 f"{worker.source.name}; Ctrl-C to stop"), flush=True)
    worker.start()
    while not signals:
        time.sleep(SIGNAL_POLL_S)
    shutdown(worker.deployer, worker=worker, notifier=worker.notifier, source=worker.source)
    worker.tracing.shutdown()
    worker.store.close()
    return 0


def cmd_serve(a) -> int:
    def stop_worker(worker: Worker) -> None:
        shutdown(worker.deployer, worker=worker, notifier=worker.notifier, source=worker.source)
        worker.tracing.shutdown()
        worker.store.close()
    defaults = _load_policy(a.policy_defaults) if a.policy_defaults else None
    # without a worker, POST /api/v1/judge still queries the Prometheus the flags name
    judge_prometheus = prometheus_config(a) if a.no_worker and a.metrics == "prometheus" else None
    watcher = start_crd_watcher(a, defaults) if a.watch_crds else None
    try:
        return serve(a, build_worker, stop_worker, defaults, judge_prometheus)
    except ServeError as e:
        raise CLIError(str(e)) from None
    finally:
        if watcher is not None:
            watcher.close()


def cmd_demo(a) -> int:
    keep = a.keep_running if a.keep_running is not None else (not a.exit_when_done and sys.stdin.isatty())
    names = [n.strip() for n in a.scenario.split(",") if n.strip()]
    known = PROFILES[a.device].scenarios
    scenarios = tuple(n for x in names for n in (("slow", "wrong", "good") if x == "all" else (x,)))
    if any(n not in known for n in scenarios):
        raise CLIError(f"--scenario {a.scenario!r}: choose from {', '.join(known)} or all (comma-separated, "
                       f"repeats allowed: slow,wrong,good,aa,aa)")
    extra = []
    for v in a.engine_arg:
        try:
            extra += shlex.split(v)
        except ValueError as e:   # an unclosed quote
            raise CLIError(f"--engine-arg {v[:80]!r}: {e}") from None
    try:
        cfg = DemoConfig(workdir=a.workdir, scenarios=scenarios, rate=a.rate, metrics=a.metrics, port=a.port,
                         keep_running=keep, device=a.device, model=a.model, production_kernels=a.production_kernels,
                         gpu_memory_share=a.gpu_memory_share, service=a.service, parallel=a.parallel,
                         engine_extra=tuple(extra))
    except ValueError as e:
        raise CLIError(str(e)) from None
    try:
        return 0 if run_demo(cfg).ok else 1
    except DeployError as e:   # an engine did not start: its log tail is in the message
        print(f"sits-control demo: a variant could not be deployed: {e}", file=sys.stderr)
        if "--gpu-memory-utilization" in str(e) and "--gpu-memory-utilization" in cfg.engine_args:
            share = cfg.engine_args[cfg.engine_args.index("--gpu-memory-utilization") + 1]
            print(f"sits-control demo: each engine has {share} of the GPU's memory (up to four run at once during a "
                  f"promotion); give them more with --gpu-memory-share (at most 0.24 with four), or need less: "
                  f"--engine-arg '--max-model-len 2048' (on an 80 GB card llama3-8b int8 ran with "
                  f"--gpu-memory-share 0.23)", file=sys.stderr)
        return 1
    except ValueError as e:   # e.g. no prometheus binary
        print(f"sits-control demo: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("sits-control demo: interrupted (every variant was stopped)", file=sys.stderr)
        return 130
