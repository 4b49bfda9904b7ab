"""SITS control plane, one package per layer (imports run one way, top to bottom):

    cli/       `sits-control` (main.py), what its flags build (build.py), the API client (client.py)
    demo/      the one-command demo, its local Prometheus and load generator
    web/       the Flask app factory (`create_app` in web/__init__.py), API, UI, auth; worker/: the control loop;
               crd/: KernelRollout resources drive rollouts (`serve --watch-crds`)
    service/   what the CLI, the demo, the web and crd/ share: start rollouts, send commands, the judge, text views
    store/     the SQLite store (the only code that opens the file)
    adapters/  one package per role: deploy/ (local, kubernetes; DeploySpec), metrics/ (scrape, prometheus),
               inference/ (the correctness replay, low-traffic replay), notify.py, the kernel catalogue
    router/    the weighted reverse proxy the local deployer puts in front of each service's engines (data plane)
    rollout/   the pure state machine `reconcile(rollout, observation, now)` and its types
    view/      the pure read model of a stored check (`decode_check` -> CheckView) and its one headline rule
    analysis/  the pure analysis core: quantiles, confidence bounds, verdicts, policies

errors.py, validation.py and numbers.py (how every layer writes a number) are vocabularies every layer shares;
redact.py and small_files.py helpers every layer may use (tests/control_plane/test_layers.py holds the order).

It never imports `engine` or `kernels`: kernel sets reach it as a catalogue (adapters/kernel_catalog.py), engines as
processes or pods, so `pip install .` runs it without torch. Importing the package imports nothing heavy; pick the
module you need (e.g. `from sits.control_plane.worker.loop import Worker`).
"""
