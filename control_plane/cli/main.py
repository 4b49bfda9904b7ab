"""`sits-control`: demo, the worker loop, and rollouts (start, list, show with evidence, promote/abort/pause/resume).

    sits-control demo                                   # the README's main command (CPU, no cluster)
    sits-control demo --device cuda --scenario aa,aa,aa --parallel 3   # three A/A lanes side by side on one GPU
    sits-control worker --store sits.db                 # run the control loop (local deployer + direct scrape)
    sits-control rollout start --service chat --kernels triton-v2 [--policy policy.json] [--arg '--seed 7']
                               [--production-arg '--max-num-seqs 64'] [--device cuda] [--ready-timeout 900]
    sits-control rollout list | show ID | promote ID | abort ID | pause ID | resume ID
    sits-control serve --port 8080 --auth-file users.yaml   # the web UI + JSON API, with the worker beside it
    sits-control backup --store sits.db sits-backup.db  # a consistent copy of the live store (online backup)
    SITS_URL=http://host:8080 SITS_TOKEN=... sits-control rollout start ... --wait   # the same over the API
"""
from __future__ import annotations

import argparse
import logging
import os
import sqlite3
import sys
from typing import Sequence

from sits.control_plane.adapters.deploy import DeployError
from sits.control_plane.adapters.kernel_catalog import CatalogError
from sits.control_plane.cli.build import CLIError
from sits.control_plane.cli.commands import (cmd_backup, cmd_demo, cmd_rollout_calibrate, cmd_rollout_command,
                                             cmd_rollout_list, cmd_rollout_retry, cmd_rollout_show, cmd_rollout_start, cmd_serve,
                                             cmd_worker)
from sits.control_plane.errors import SitsError
from sits.control_plane.redact import redact
from sits.control_plane.rollout import Command
from sits.control_plane.store.schema import StoreError
from sits.control_plane.validation import DEVICES, MAX_TENSOR_PARALLEL
from sits.wire.tracing import EXPORTERS

DEFAULT_STORE = os.environ.get("SITS_STORE", "sits.db")
log = logging.getLogger(__name__)


def _count(text: str) -> int:
    """argparse type of a count or port: digits only, at most 9 (so no 5,000-digit int() and no echo of it)."""
    t = text.strip()
    if not (t.isascii() and t.lstrip("-").isdigit() and len(t) <= 10):
        raise argparse.ArgumentTypeError(f"expected a small integer, got {t[:20]!r}{'...' if len(t) > 20 else ''}")
    return int(t)


def _tensor_parallel(text: str) -> int:
    """argparse type of --tensor-parallel-size: GPUs per engine, 1 to MAX_TENSOR_PARALLEL."""
    n = _count(text)
    if not 1 <= n <= MAX_TENSOR_PARALLEL:
        raise argparse.ArgumentTypeError(f"GPUs per engine must be from 1 to {MAX_TENSOR_PARALLEL}, got {n}")
    return n


def _worker_args(w: argparse.ArgumentParser) -> None:
    """The worker's flags: `sits-control worker` and `serve` build it the same way (build_worker)."""
    w.add_argument("--store", default=DEFAULT_STORE)
    w.add_argument("--interval", type=float, default=5.0, help="seconds between passes over the rollouts")
    w.add_argument("--deployer", choices=["local", "kubernetes"], default="local")
    w.add_argument("--workdir", default=None, help="local deployer: variant logs")
    w.add_argument("--cpu-threads", type=_count, default=None, help="local deployer: threads per engine process")
    w.add_argument("--namespace", default="default")
    w.add_argument("--engine-image", default=os.environ.get("SITS_ENGINE_IMAGE") or None,
                   help="Kubernetes: the engines' image when a rollout names none (default: sits-engine:latest)")
    w.add_argument("--kubeconfig", default=None)
    w.add_argument("--metrics", choices=["scrape", "prometheus"], default="scrape")
    w.add_argument("--prometheus-url", default=None,
                   help="default: $SITS_PROMETHEUS_URL (where user:password@ becomes basic auth); on the command "
                        "line a URL with credentials is refused (ps shows it): --prometheus-user + a password file")
    w.add_argument("--prometheus-token-file", default=None,
                   help="file holding the bearer token (default: $SITS_PROMETHEUS_TOKEN); secrets never go in flags")
    w.add_argument("--prometheus-user", default=None, help="basic auth user")
    w.add_argument("--prometheus-password-file", default=None,
                   help="file holding the basic auth password (default: $SITS_PROMETHEUS_PASSWORD)")
    w.add_argument("--pin-token-file", default=None,
                   help="local deployer: file holding the X-SITS-Pin-Token that may pin a variant (default: "
                        "$SITS_PIN_TOKEN, else a random one per worker)")
    w.add_argument("--prompt-set-dir", default=os.environ.get("SITS_PROMPT_SET_DIR") or None,
                   help="folder of the correctness gate's named prompt sets, prompts-<name>.json "
                        "($SITS_PROMPT_SET_DIR)")
    w.add_argument("--max-replicas", type=_count, default=None,
                   help="local deployer: engines on this machine at once (default: 2 per core, 1 per GiB free)")
    w.add_argument("--otel-exporter", choices=EXPORTERS, default=None,
                   help="OpenTelemetry traces: none (default), console or otlp (or $SITS_OTEL_EXPORTER / "
                        "$OTEL_TRACES_EXPORTER); docs/observability.md")
    w.add_argument("--otlp-endpoint", default=None,
                   help="OTLP/HTTP collector base URL, e.g. http://collector:4318 (or $OTEL_EXPORTER_OTLP_ENDPOINT)")
    w.add_argument("--webhook", action="append", help="generic JSON webhook URL without credentials (repeatable)")
    w.add_argument("--webhook-file", action="append",
                   help="file of generic JSON webhook URLs, one a line (repeatable; or $SITS_WEBHOOK_URLS)")
    w.add_argument("--slack-webhook", action="append", help=argparse.SUPPRESS)   # refused: its URL is a secret
    w.add_argument("--slack-webhook-file", action="append",
                   help="file of Slack incoming-webhook URLs, one a line (repeatable; or $SITS_SLACK_WEBHOOK_URLS)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sits-control", allow_abbrev=False, description="SITS control plane: gray releases of kernel sets.")
    p.add_argument("--log-level", default=None, choices=["debug", "info", "warning", "error"],
                   help="default: info for `worker`, warning otherwise")
    sub = p.add_subparsers(dest="cmd", required=True)

    d = sub.add_parser("demo", help="the UI on live canaries of real kernel sets (CPU, tiny model): a slower set and "
                                    "a wrong set rolled back, a good one promoted")
    d.add_argument("--scenario", default="all",
                   help="which canaries to run, comma-separated, in turn: slow, wrong, good, all (= slow,wrong,good), "
                        "kvfp8 (an engine-flag release: production's kernels with --kv-cache-dtype fp8 on the canary); "
                        "with --device cuda also aa (triton-v1 against itself; repeatable: all,aa,aa), the fp8 "
                        "releases w8a8, f16, fused, staged (triton-v1.4, v1.5, v1.7, v1.8; with --production-kernels "
                        "and --engine-arg '--quantization fp8 --kv-cache-dtype fp8') and prologue (triton-v1.6, slower "
                        "on --model llama3-8b with int8 weights): docs/getting-started.md")
    d.add_argument("--device", choices=DEVICES, default="cpu",
                   help="cpu (the default: tiny model, torch example sets) or cuda: every engine on this machine's "
                        "GPU, Triton sets (triton-v1 production; triton-v1-unsplit, triton-v1-floor-pages, "
                        "triton-v1.1 canaries), a tiny model trained there first")
    d.add_argument("--model", default=None,
                   help="what every engine serves (default: tiny on CPU, tiny-trained on the GPU; or llama3-8b, "
                        "tiny or a checkpoint path -- random bf16 weights often leave the correctness gate "
                        "inconclusive)")
    d.add_argument("--production-kernels", default=None,
                   help="production's kernel set (default: torch on CPU, triton-v1 on the GPU)")
    d.add_argument("--exit-when-done", action="store_true",
                   help="stop after the summary; exit 0 only if every scenario ended as expected")
    d.add_argument("--keep-running", action="store_true", default=None,
                   help="leave the UI up after the summary until Ctrl-C (the default on a terminal)")
    d.add_argument("--port", type=int, default=0, help="UI/API port on 127.0.0.1 (default: a free one)")
    d.add_argument("--workdir", default=None, help="store, auth file and variant logs (default: a new temp dir)")
    d.add_argument("--rate", type=float, default=None,
                   help="Poisson load through the router, requests/s (default: 25 on CPU, 40 on the GPU)")
    d.add_argument("--metrics", choices=["scrape", "prometheus"], default="scrape",
                   help="metrics source: direct scrape (default) or a local Prometheus (needs the binary)")
    d.add_argument("--gpu-memory-share", type=float, default=None,
                   help="with --device cuda: each engine's fraction of the GPU's memory (default 0.2: four engines at "
                        "once; lower it to run several demos on one GPU)")
    d.add_argument("--service", default="demo", help="the service's name (several demos on one machine: one each; "
                                                     "with --parallel K the lanes' are SERVICE-1 ... SERVICE-K)")
    d.add_argument("--parallel", type=int, default=1, metavar="K",
                   help="deal the scenarios round-robin to K lanes that run side by side (1 to the number of "
                        "scenarios; default 1: one after another), each its own service with its own production "
                        "engine, router and load at --rate; store, worker, UI and Prometheus shared. For campaigns "
                        "of many runs (A/A on the GPU: --scenario aa,aa,aa,aa,aa,aa --parallel 3): more decisions "
                        "per GPU-minute, and the lanes' engines contend for the machine (harsher sharing; each "
                        "engine's --gpu-memory-share defaults to 0.2/K)")
    d.add_argument("--engine-arg", action="append", default=[], metavar="ARGS",
                   help="extra `sits-engine serve` args of every engine (production, baseline, canary): one, or "
                        "several in one shell-quoted string (repeatable; the flags a rollout may set). The fp8 "
                        "releases on the GPU: --production-kernels triton-v1.3 --engine-arg '--quantization fp8 "
                        "--kv-cache-dtype fp8' --scenario w8a8,f16")
    d.set_defaults(fn=cmd_demo)

    # no abbreviations: `--prometheus-password SECRET` must not be taken for `--prometheus-password-file SECRET`
    w = sub.add_parser("worker", help="run the control loop", allow_abbrev=False)
    _worker_args(w)
    w.add_argument("--metrics-port", type=_count, default=None, help="serve the worker's own /metrics on this port")
    w.add_argument("--metrics-host", default="127.0.0.1")
    w.set_defaults(fn=cmd_worker)

    v = sub.add_parser("serve", help="the web UI and JSON API (waitress), with the worker beside it",
                       allow_abbrev=False)
    v.add_argument("--host", default="127.0.0.1", help="a non-loopback address needs --auth-file")
    v.add_argument("--port", type=int, default=8080)
    v.add_argument("--auth-file", default=os.environ.get("SITS_AUTH_FILE"),
                   help="users and roles with token hashes (JSON or YAML; docs/web.md); without it auth is off "
                        "and only loopback is served")
    v.add_argument("--no-worker", action="store_true", help="serve the API and UI alone (a worker runs elsewhere)")
    v.add_argument("--threads", type=int, default=8, help="waitress request threads")
    v.add_argument("--trusted-proxy", default=None,
                   help="address of a TLS-terminating proxy whose X-Forwarded-Proto is believed")
    v.add_argument("--secure-cookies", action="store_true", help="mark the session cookie Secure (served over TLS)")
    v.add_argument("--policy-defaults", default=os.environ.get("SITS_POLICY_DEFAULTS") or None,
                   help="policy file (JSON/YAML, fields of Policy) new rollouts start from (or $SITS_POLICY_DEFAULTS)")
    v.add_argument("--kernel-catalog", default=os.environ.get("SITS_KERNEL_CATALOG") or None,
                   help="the kernel sets the engines have (JSON, `sits-engine kernels --json`); default: ask the "
                        "installed engine, else the built-in sets")
    v.add_argument("--grafana-url", default=os.environ.get("SITS_GRAFANA_URL") or None,
                   help="Grafana with the generated dashboards: the UI links them per rollout (or $SITS_GRAFANA_URL)")
    v.add_argument("--watch-crds", action="store_true",
                   help="drive rollouts from the KernelRollout resources of --namespace and write their status "
                        "(docs/kubernetes.md#declarative-rollouts-kernelrollout)")
    _worker_args(v)
    v.set_defaults(fn=cmd_serve)

    b = sub.add_parser("backup", help="copy the store to a new file while the service runs (SQLite's online backup, "
                                      "checked); restore: docs/security.md#backup-and-restore")
    b.add_argument("out", help="the backup file to write (must not exist)")
    b.add_argument("--store", default=DEFAULT_STORE)
    b.set_defaults(fn=cmd_backup)

    r = sub.add_parser("rollout", help="start, list, show and steer rollouts").add_subparsers(dest="rcmd",
                                                                                              required=True)
    s = r.add_parser("start", help="create a rollout of a kernel set (the worker deploys and analyses it)",
                     usage="sits-control rollout start --service NAME --kernels SET [options] (see --help)")
    s.add_argument("--service", required=True)
    s.add_argument("--kernels", required=True, help="the canary's kernel set")
    s.add_argument("--production-kernels", default=None,
                   help="the kernel set production runs now (default: what the service runs, its last promoted "
                        "canary's; torch for a new service)")
    s.add_argument("--policy", default=None, help="policy file (JSON or YAML; fields of Policy)")
    s.add_argument("--model", default="tiny", help="a preset (tiny, llama3-8b) or a checkpoint directory's absolute "
                                                  "path (no URLs)")
    s.add_argument("--deployer", choices=["local", "kubernetes"], default="local", metavar="KIND",
                   help="the worker's deployer, local or kubernetes (without --url): local checks that a --model path "
                        "is a directory on this machine; kubernetes only that it is a well-formed absolute path")
    s.add_argument("--replicas", type=_count, default=1)
    s.add_argument("--image", default=None, help="Kubernetes: the canary's image (default: the deployer's)")
    s.add_argument("--production-image", default=None, help="Kubernetes: production's and the baseline's image")
    s.add_argument("--gpus", type=_count, default=0, help="GPUs per replica (Kubernetes; default: as many as "
                                                          "--tensor-parallel-size on CUDA)")
    s.add_argument("--tensor-parallel-size", type=_tensor_parallel, default=1, metavar="N",
                   help=f"GPUs each engine spans (1 to {MAX_TENSOR_PARALLEL}; default 1): `sits-engine serve "
                        "--tensor-parallel-size N`; the local deployer gives each variant's engines N GPUs of "
                        "their own where the machine has enough free, Kubernetes asks for nvidia.com/gpu N")
    s.add_argument("--arg", action="append", default=[], metavar="ARGS",
                   help="extra `sits-engine serve` args of the canary: one, or several in one shell-quoted string "
                        "(repeatable; a lone flag as --arg=--enforce-eager): --arg '--seed 7' --arg '--dtype bfloat16'; "
                        "none given: production's args; --arg '': none")
    s.add_argument("--production-arg", action="append", default=[], metavar="ARGS",
                   help="the same for production and the baseline (repeatable; none given: what the service's "
                        "production runs, the flags of its last promoted canary; --production-arg '': none)")
    s.add_argument("--device", choices=DEVICES, default=None,
                   help="`sits-engine serve --device` of every variant (default: the engine's choice, a GPU where "
                        "one is visible)")
    s.add_argument("--ready-timeout", type=float, default=None, metavar="SECONDS",
                   help="how long each deploy may take to get ready before the rollout rolls back (default: the "
                        "policy's ready_timeout_s; GPU warm-ups of large models take minutes)")
    # the older form: the rest of the line; either one stops at the other (so both can be given)
    s.add_argument("--production-args", nargs=argparse.REMAINDER, default=None,
                   help="(older form) the rest of the line, up to --args, as production's and the baseline's args")
    s.add_argument("--args", nargs=argparse.REMAINDER, default=None,
                   help="(older form) the rest of the line, up to --production-args, as the canary's args")
    s.add_argument("--by", default=os.environ.get("USER", ""), help="who (kept in the events)")
    s.add_argument("--store", default=DEFAULT_STORE)
    s.add_argument("--wait", action="store_true", help="follow the rollout until it ends (exit 0 succeeded, 1 not)")
    s.add_argument("--kernel-catalog", default=os.environ.get("SITS_KERNEL_CATALOG") or None,
                   help="the kernel sets the engines have (JSON, `sits-engine kernels --json`); default: ask the "
                        "installed engine, else the built-in sets")
    s.set_defaults(fn=cmd_rollout_start)
    rt = r.add_parser("retry", help="start an ended rollout that did not succeed (rolled back, aborted, failed) "
                                    "again: a new rollout linked to it, with its spec and policy")
    rt.add_argument("id", help="the rollout to retry")
    rt.add_argument("--kernels", default=None, help="another canary kernel set (default: the old rollout's)")
    rt.add_argument("--production-kernels", default=None,
                    help="default: the old rollout's production (over the API: what the service runs now)")
    rt.add_argument("--by", default=os.environ.get("USER", ""), help="who (kept in the events)")
    rt.add_argument("--store", default=DEFAULT_STORE)
    rt.add_argument("--wait", action="store_true", help="follow the rollout until it ends (exit 0 succeeded, 1 not)")
    rt.add_argument("--kernel-catalog", default=os.environ.get("SITS_KERNEL_CATALOG") or None,
                    help="the kernel sets the engines have (as for `rollout start`)")
    rt.set_defaults(fn=cmd_rollout_retry)
    ls = r.add_parser("list", help="list rollouts")
    ls.add_argument("--active", action="store_true")
    ls.add_argument("--store", default=DEFAULT_STORE)
    ls.set_defaults(fn=cmd_rollout_list)
    cal = r.add_parser("calibrate", help="replica noise: how far engines with the same kernels differed in a "
                                         "rollout (an A/A run, or production vs baseline), and the ship boundary "
                                         "per check that clears it")
    cal.add_argument("id", help="the rollout (an A/A: canary kernels = production kernels, or any rollout with "
                                "production traffic)")
    cal.add_argument("--store", default=DEFAULT_STORE)
    cal.add_argument("--json", action="store_true")
    cal.set_defaults(fn=cmd_rollout_calibrate)
    sh = r.add_parser("show", help="a rollout with its events and every check's evidence")
    sh.add_argument("id")
    sh.add_argument("--json", action="store_true", help="everything stored, as JSON")
    sh.add_argument("--store", default=DEFAULT_STORE)
    sh.set_defaults(fn=cmd_rollout_show)
    for c in Command:
        x = r.add_parser(c.value, help=f"{c.value} a rollout (applied by the worker at its next pass)")
        x.add_argument("id")
        x.add_argument("--by", default=os.environ.get("USER", ""), help="who (kept in the events)")
        x.add_argument("--store", default=DEFAULT_STORE)
        x.set_defaults(fn=cmd_rollout_command, command=c.value)
    for sp in r.choices.values():   # every rollout command also works over the API
        sp.add_argument("--url", default=os.environ.get("SITS_URL"),
                        help="the control plane's URL (or $SITS_URL; token from $SITS_TOKEN): use the API, not --store")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    level = a.log_level or ("info" if a.cmd in ("worker", "serve") else "warning")
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpcore", "urllib3"):   # one line per readiness probe otherwise
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
    try:
        return a.fn(a)
    except (CLIError, SitsError, StoreError, DeployError, CatalogError) as e:
        print(f"sits-control: error: {redact(str(e))}", file=sys.stderr)
        return 2
    except sqlite3.Error as e:   # the store file changed under us (damaged, locked past the timeout)
        print(f"sits-control: error: store {a.store}: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:   # `sits-control rollout show ID | head`: the reader left; no traceback for that
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
