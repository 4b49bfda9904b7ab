"""The weighted router, a data-plane component: one per service of the local deployer (adapters/deploy/local/ starts it,
on a thread of its own), in front of the service's production / baseline / canary engines. Of the control plane it
imports only the rollout's vocabulary (`ROLES`, `traffic_split`); the layer order is tests/control_plane/test_layers.py.

    proxy.py       `WeightedRouter`: the reverse proxy (uvicorn, streaming) and its /_sits/ admin paths
    table.py       `RouteTable`: weights, backends and requests in flight; which backend gets the next request
    forwarding.py  what the router accepts from a client and passes on: targets, headers, who may pin a variant
    config.py      `RouterConfig`, validated when made
    ports.py       `RouterPorts`: each service's router port, remembered across restarts
"""


class RouterError(Exception):
    """A router setting, weight split or backend is invalid, or the router could not start; the message says which.
    The local deployer reports one from starting a router as a DeployError; what it hands a running router (weights it
    has checked, its own engines' URLs) is valid."""
