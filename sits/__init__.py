"""SITS: a canary control plane for LLM inference with an embedded engine.

One import namespace over the repository's top-level folders: `sits.control_plane`, `sits.engine`, `sits.kernels`,
`sits.dashboards`. An install maps the folders here (setup.py, package-dir). In a checkout put on PYTHONPATH (the
device runs in bench/), this file sits beside them instead, so the package's search path is the repository root: only
the four folders are meant to be imported through it.
"""
import os as _os

_here = _os.path.dirname(_os.path.abspath(__file__))
if not _os.path.isdir(_os.path.join(_here, "engine")):   # a checkout, not an install: the folders are one level up
    __path__.append(_os.path.dirname(_here))
