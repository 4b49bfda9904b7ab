# The README's two commands: `make demo` (main job, CPU, no cluster) and `make test` (set up + run the tests).
.PHONY: setup demo test test-gpu
PY := .venv/bin/python

setup:
	bash .ci/setup.sh test

# the demo's setup installs only what the demo needs (the project on CPU torch): no test extra, no Kubernetes build
demo:
	bash .ci/setup.sh demo
	$(PY) -m control_plane.cli demo

# pytest exits 5 when it collects nothing: that fails here like any other error.
test:
	bash .ci/setup.sh test
	$(PY) -m pytest -q --durations=25 tests

# on a CUDA machine (python3 with torch and triton): the whole GPU suite in one call (about 4 minutes on an H200)
test-gpu:
	bash bench/gpu_session.sh tests
