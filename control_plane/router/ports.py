"""Which port each service's router listens on, remembered in a small JSON file ({service: port}), so a control
plane that is killed (SIGKILL included) and started again serves every service on the same address: clients of the
router's URL only see it refuse connections until the restarted control plane has its router back (at its first
deploy of the service), never a new URL. LocalConfig.router_state names the file; None: nothing is remembered."""
from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

log = logging.getLogger(__name__)
MAX_BYTES = 1 << 20


class RouterPorts:
    def __init__(self, path: str | os.PathLike | None) -> None:
        self.path = Path(path) if path is not None else None
        self._lock = threading.Lock()
        self._ports = self._load()

    def get(self, service: str) -> int:
        """The port this service's router had (0: none remembered, take a free one)."""
        with self._lock:
            return self._ports.get(service, 0)

    def remember(self, service: str, port: int) -> None:
        with self._lock:
            if self.path is None or self._ports.get(service) == port:
                return
            self._ports[service] = port
            tmp = self.path.with_name(self.path.name + ".tmp")
            try:   # atomic: a kill mid-write leaves the old file
                tmp.write_text(json.dumps(self._ports, sort_keys=True))
                tmp.replace(self.path)
            except OSError as e:
                log.warning("router ports not remembered in %s (a restart picks new ports): %s", self.path, e)

    def _load(self) -> dict[str, int]:
        if self.path is None:
            return {}
        try:
            with open(self.path, "rb") as f:
                data = json.loads(f.read(MAX_BYTES))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            log.warning("router ports file %s unreadable (%s): new ports are picked", self.path, e)
            return {}
        if not isinstance(data, dict):
            return {}
        return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, int)
                and not isinstance(v, bool) and 0 < v < 65536}
