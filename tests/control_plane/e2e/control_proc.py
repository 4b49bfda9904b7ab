"""A whole local control plane in one process, to be SIGKILLed by tests: the real worker, store, LocalDeployer (engine
processes behind the weighted router), direct scrape and a load generator through the router.

    python -m tests.control_plane.e2e.control_proc --store S --workdir W [--die-at STEP:N]

`--die-at saved:3` SIGKILLs this process the 3rd time a pass reaches the step `saved` (Worker.step_hook names:
loaded, observed, reconciled, saved, consumed, recover, executed:<action kind>). The router's URL is written to
W/router-<pid> once production runs (its /_sits/ admin paths take X-SITS-Pin-Token: PIN_TOKEN); SIGTERM stops
everything cleanly.
"""
import argparse
import os
import signal
import threading
from collections import Counter
from pathlib import Path

from sits.control_plane.adapters.deploy.local.config import LocalConfig
from sits.control_plane.adapters.deploy.local.deployer import LocalDeployer
from sits.control_plane.adapters.metrics.scrape import ScrapeSource
from sits.control_plane.worker.lifecycle import shutdown
from sits.control_plane.demo.loadgen import LoadGenerator
from sits.control_plane.demo.traffic import LengthDist, TrafficMix
from sits.control_plane.store.db import Store
from sits.control_plane.worker.loop import Worker
from sits.control_plane.worker.config import WorkerConfig

PIN_TOKEN = "e2e-control-proc-pin-token"   # the router's admin paths (/_sits/weights) need it (or a pin source)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--store", required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--service", required=True)
    p.add_argument("--die-at", default=None)
    p.add_argument("--rate", type=float, default=25.0)
    a = p.parse_args()
    deployer = LocalDeployer(LocalConfig(workdir=a.workdir, cpu_threads=1, ready_timeout_s=120, pin_token=PIN_TOKEN,
                                         router_state=f"{a.store}.routers.json"))   # as sits-control does
    store = Store(a.store)
    # a restarted control plane takes the rollouts over once the dead one's leases expire: 8 s here, not the default
    # 30 s (one control plane runs at a time in these tests; the loop renews every 1 s round, long actions included)
    worker = Worker(store, deployer, ScrapeSource(),
                    config=WorkerConfig(interval_s=1.0, action_backoff_s=0.2, lease_ttl_s=8.0))
    if a.die_at:
        step, n = a.die_at.rsplit(":", 1)
        seen = Counter()

        def hook(name: str) -> None:
            seen[name] += 1
            if name == step and seen[name] == int(n):
                os.kill(os.getpid(), signal.SIGKILL)
        worker.step_hook = hook
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    worker.start()
    load = None
    while not stop.wait(0.2):
        if load is None:
            try:
                url = deployer.router_url(a.service)
            except Exception:
                continue
            mix = TrafficMix(LengthDist(32, 0.6, 4, 120), LengthDist(2, 0.4, 1, 6), 0.3, 0.3)
            load = LoadGenerator(url, rate=a.rate, threads=10, mix=mix, seed=os.getpid(),
                                 pin_token=PIN_TOKEN).start()
            out = Path(a.workdir) / f"router-{os.getpid()}"
            out.with_suffix(".tmp").write_text(url)
            out.with_suffix(".tmp").replace(out)
    if load is not None:
        load.stop(10)
    shutdown(deployer, worker=worker, source=worker.source)
    store.close()


if __name__ == "__main__":
    main()
