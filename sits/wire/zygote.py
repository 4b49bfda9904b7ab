"""The engine zygote's contract (engine/core/zygote.py, started by control_plane/adapters/deploy/local/zygote.py):
the variable that names its socket in an engine's environment, and the line it prints once it listens. Pure data."""
from __future__ import annotations

ZYGOTE_ENV = "SITS_ENGINE_ZYGOTE"             # an API server with this set asks that socket for its engine core
ZYGOTE_READY_LINE = "sits engine zygote ready"   # the zygote's first line on stdout, once it accepts
