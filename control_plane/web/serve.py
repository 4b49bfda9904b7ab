"""`sits-control serve`: the Flask app under waitress, with the worker (built exactly as `sits-control worker`
builds it) running beside it in the same process; `--no-worker` serves the API and UI alone."""
from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading

import waitress

from sits.control_plane.adapters.kernel_catalog import CatalogError, KernelCatalog
from sits.control_plane.web import create_app
from sits.control_plane.web.common import is_loopback
from sits.control_plane.web.users import AuthFileError, Users
from sits.wire.tracing import Tracing

log = logging.getLogger(__name__)


class ServeError(ValueError):
    """The service cannot start with these flags (one line for the CLI)."""


def check_flags(host: str, auth_file: str | None) -> Users | None:
    """Users from the auth file; without one, only a loopback host is allowed."""
    if auth_file is None:
        if not is_loopback(host):
            raise ServeError(f"refusing to serve on {host} without --auth-file: anyone who can reach it could start "
                             "and abort rollouts (use a loopback address such as 127.0.0.1, or give --auth-file)")
        return None
    try:
        return Users.load(auth_file)
    except AuthFileError as e:
        raise ServeError(str(e)) from None


def serve(a, build_worker, stop_worker, policy_defaults=None, judge_prometheus=None) -> int:
    """`a`: the parsed flags (serve's own plus the worker's); build_worker(a) / stop_worker(worker) come from the CLI
    so the worker is assembled in one place; `policy_defaults`: a Policy new rollouts start from;
    `judge_prometheus`: the PrometheusConfig `POST /api/v1/judge` queries (default: the worker's source)."""
    users = check_flags(a.host, a.auth_file)
    if users is None:
        log.warning("auth is OFF (no --auth-file): serving on loopback %s only; every request acts as an admin",
                    a.host)
    worker = None if a.no_worker else build_worker(a)
    store = worker.store if worker is not None else a.store
    try:   # the worker's tracer, or (--no-worker) one for the API's spans alone
        tracing = worker.tracing if worker is not None else Tracing.from_flags(a.otel_exporter, a.otlp_endpoint)
    except ValueError as e:
        raise ServeError(str(e)) from None
    try:
        catalog = KernelCatalog.discover(a.kernel_catalog)
    except CatalogError as e:
        raise ServeError(str(e)) from None
    limit = dataclasses.asdict(worker.deployer.replica_limit()) if worker is not None else None
    app = create_app({"STORE": store, "SITS_USERS": users, "WORKER": worker, "KERNEL_CATALOG": catalog,
                      "REPLICA_LIMIT": limit, "LOCAL_MODELS": a.deployer == "local",
                      "SECRET_KEY": os.environ.get("SITS_SECRET_KEY") or os.urandom(32).hex(),
                      "SESSION_COOKIE_SECURE": bool(a.secure_cookies), "TRACING": tracing,
                      "JUDGE_PROMETHEUS": judge_prometheus, "GRAFANA_URL": a.grafana_url,
                      "POLICY_DEFAULTS": policy_defaults.to_dict() if policy_defaults is not None else None})
    kw = {}
    if a.trusted_proxy:   # X-Forwarded-Proto from this proxy makes the request (and so the cookie) https
        kw = dict(trusted_proxy=a.trusted_proxy, trusted_proxy_headers={"x-forwarded-proto", "x-forwarded-for"},
                  clear_untrusted_proxy_headers=True)
    server = waitress.create_server(app, host=a.host, port=a.port, threads=a.threads, ident="sits", **kw)
    stopping = threading.Event()

    def stop(*_):
        if not stopping.is_set():
            stopping.set()
            raise KeyboardInterrupt
    url = f"http://{a.host if ':' not in a.host else '[' + a.host + ']'}:{server.effective_port}"
    try:   # from the first signal handler on, a SIGTERM or Ctrl-C at any moment ends in the same clean shutdown
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, stop)
        if worker is not None:
            worker.start()
        print(f"sits-control serve: {url}/ (API {url}/api/v1/, metrics {url}/metrics); store "
              f"{app.config['STORE'].path}; auth {'file ' + a.auth_file if users else 'OFF (loopback only)'}; "
              f"worker {'on' if worker is not None else 'off (--no-worker)'}; Ctrl-C to stop", flush=True)
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
        if worker is not None:
            stop_worker(worker)
        else:
            tracing.shutdown()
            app.config["STORE"].close()
    return 0
