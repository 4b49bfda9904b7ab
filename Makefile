# The README's two commands: `make demo` (main job, CPU, no cluster) and `make test` (set up + run the tests).
.PHONY: setup demo demo-gpu test test-gpu catalog
PY := .venv/bin/python
# -P (PYTHONSAFEPATH): the repository root never goes on sys.path, so its folders are importable only as sits.* (the
# install maps them) and never shadow packages of the same name (Hugging Face's `kernels`, which transformers needs)
export PYTHONSAFEPATH := 1

setup:
	bash .ci/setup.sh test

# the demo's setup installs only what the demo needs (the project on CPU torch): no test extra, no Kubernetes build
demo:
	bash .ci/setup.sh demo
	$(PY) -m sits.control_plane.cli demo

# on a CUDA machine (python3 with torch and triton, the project's dependencies installed): the demo on its GPU, Triton
# sets, from this checkout (on PYTHONPATH: sits/__init__.py maps the folders); bench/gpu_demo.sh does it in one call
# with carried wheels and prints a table (BENCHMARKS.md "GPU demo")
demo-gpu:
	PYTHONPATH=$(CURDIR) python3 -m sits.control_plane.cli demo --device cuda --exit-when-done

# Four workers on two cores (pytest-xdist; the end-to-end files wait on their servers much of the time; docs/testing.md;
# tests/conftest.py hands out whole files, all the Kubernetes ones to one worker), then the `solo` tests alone. pytest
# exits 5 when it collects nothing: that fails here like any other error.
test:
	bash .ci/setup.sh test
	$(PY) -m pytest -q -n 4 -m "not solo" --durations=25 tests
	$(PY) -m pytest -q -m solo --durations=5 tests

# on a CUDA machine (python3 with torch and triton): the whole GPU suite in one call (about 4 minutes on an H200)
test-gpu:
	bash bench/gpu_session.sh tests

# after a kernel set changes: the built-in sets' catalogue, from the registry, into the engine's, the control plane's
# and the chart's copies (the kernels package writes nothing itself; tests/kernels/test_catalog.py checks the copies)
catalog:
	PYTHONPATH=$(CURDIR) $(PY) .ci/kernel_catalog.py
