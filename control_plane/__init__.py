"""SITS control plane: the pure analysis core (`analysis/`, `rollout.py`), its SQLite `store`, adapters (deployers,
metrics sources, notifiers), the `worker` loop and the `sits-control` CLI (`cli.py`, `demo.py`).

Importing the package imports nothing heavy; pick the module you need (e.g. `from control_plane.worker import Worker`).
"""
