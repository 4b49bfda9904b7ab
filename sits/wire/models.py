"""The models an engine can load by name, and the bounds of a checkpoint path: the engine's presets
(engine/model/presets.py, a test keeps the two equal) and what the control plane accepts as a rollout's `model`
(control_plane/validation.py), and the line an engine that cannot load ends with. Pure data."""
from __future__ import annotations

PRESET_NAMES = ("tiny", "llama3-8b")   # random-weight presets (engine/model/presets.py PRESETS)
MAX_MODEL_PATH = 4096                  # characters of a checkpoint path (Linux PATH_MAX)
# how `sits-engine serve` begins the last line it writes before it exits (code 1) because its engine failed to load;
# the rest of the line is the load error, which a deployer shows as the reason
LOAD_FAILED = "sits-engine serve: engine failed to load: "
