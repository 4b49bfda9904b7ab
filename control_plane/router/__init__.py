"""The weighted router: a data-plane process part, one per service of the local deployer, in front of its production /
baseline / canary engines (adapters/deploy/local/ starts it). It imports nothing of the control plane above the
rollout's vocabulary (`ROLES`, `traffic_split`), so it can run apart from it.

    proxy.py       `WeightedRouter`: the reverse proxy (uvicorn, streaming) and its /_sits/ admin paths
    table.py       `RouteTable`: weights, backends and requests in flight; which backend gets the next request
    forwarding.py  what the router accepts from a client and passes on: targets, headers, who may pin a variant
    config.py      `RouterConfig`, validated when made
    ports.py       `RouterPorts`: each service's router port, remembered across restarts
"""


class RouterError(Exception):
    """A router setting, weight split or backend is invalid, or the router could not start; the message says which.
    The local deployer reports it as a DeployError."""
