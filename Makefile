# The README's two commands: `make demo` (main job, CPU, no cluster) and `make test` (set up + run the tests).
.PHONY: setup demo test
PY := .venv/bin/python

setup:
	bash .ci/setup.sh

demo: setup
	$(PY) -m control_plane.cli demo

# pytest exits 5 when it collects nothing: that fails here like any other error.
test: setup
	$(PY) -m pytest -q tests
