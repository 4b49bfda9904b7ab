"""The demo's optional local Prometheus (`sits-control demo --metrics prometheus`): the Debian package's binary scraping
every variant of every service (one per lane) every 500 ms, finding them through a file_sd file that follows the
deployer's status (what Kubernetes service discovery does in a cluster)."""
from __future__ import annotations

import json
import shutil
import threading
import time
import urllib.request
from pathlib import Path
from typing import Sequence

from sits.control_plane.adapters.deploy.local import process
from sits.control_plane.adapters.deploy import Deployer


class LocalPrometheus:
    """A real Prometheus (the Debian package's binary) scraping the variants of `services` every 500 ms. It finds them
    through a file_sd file that follows the deployer's status (what Kubernetes service discovery does in a cluster)."""

    def __init__(self, workdir: Path, deployer: Deployer, services: Sequence[str]) -> None:
        binary = shutil.which("prometheus") or "/usr/bin/prometheus"
        if not Path(binary).exists():
            raise ValueError("--metrics prometheus needs the prometheus binary (Debian: apt-get install prometheus)")
        self.deployer, self.services, self.sd = deployer, tuple(services), workdir / "prometheus-targets.json"
        self._write_targets()
        cfg = workdir / "prometheus.yml"
        cfg.write_text(json.dumps({"global": {"scrape_interval": "500ms", "scrape_timeout": "500ms"},
                                   "scrape_configs": [{"job_name": "sits", "file_sd_configs": [
                                       {"files": [str(self.sd)], "refresh_interval": "1s"}]}]}))
        port = process.free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.proc = process.spawn([binary, f"--config.file={cfg}", f"--storage.tsdb.path={workdir / 'prom-data'}",
                                   f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                                  log_path=workdir / "prometheus.log")
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise ValueError(f"prometheus did not start; see {workdir / 'prometheus.log'}")
            time.sleep(0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="sits-demo-sd", daemon=True)
        self._thread.start()

    def _write_targets(self) -> None:
        try:
            targets = scrape_targets(self.deployer, self.services)
        except Exception:
            return
        text = json.dumps([{"targets": targets, "labels": {}}])
        if not self.sd.exists() or self.sd.read_text() != text:
            tmp = self.sd.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(self.sd)

    def _follow(self) -> None:
        while not self._stop.wait(0.5):
            self._write_targets()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        process.stop(self.proc, 10)


def scrape_targets(deployer: Deployer, services: Sequence[str]) -> list[str]:
    """host:port of every endpoint of every variant of each service, sorted (what the file_sd file lists)."""
    return sorted(u.removeprefix("http://") for s in services for v in deployer.status(s).values()
                  for u in v.endpoints)
