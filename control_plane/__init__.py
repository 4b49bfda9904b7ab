"""SITS control plane: the pure analysis core (`analysis/`, `rollout.py`), its SQLite `store` (the only module that
opens the file), the application layer shared by the CLI, the web API and the demo (`service.py`, `spec.py`,
`format.py`, `errors.py`), adapters (deployers, metrics sources, notifiers), the `worker` loop and the `sits-control`
CLI (`cli.py`, `demo.py`).

Importing the package imports nothing heavy; pick the module you need (e.g. `from control_plane.worker import Worker`).
"""
