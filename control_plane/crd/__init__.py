"""KernelRollout custom resources (`kernelrollouts.sits.dev`, the chart's crds/) drive rollouts, and their status
shows them: `sits-control serve --watch-crds`. A front end like web/, at its layer: it starts rollouts and sends
commands through service/, next to the UI and the API.

    api.py     the resource on the API server: list, watch, status writes, Events (the chart's Role is these calls)
    status.py  KernelRollout <-> rollout as data: the request a spec makes, the status a rollout shows (no I/O)
    watch.py   `CrdWatcher`: the watch and sync threads that apply resources to the store
"""
