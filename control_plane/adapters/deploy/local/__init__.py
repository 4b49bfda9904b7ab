"""The local deployer (the embedded default): every variant is `sits-engine serve` processes on this machine behind a
weighted router per service (control_plane/router/).

    deployer.py  `LocalDeployer`, the `Deployer` protocol over processes and routers
    replicas.py  a variant's engine processes: start, wait for /readyz, probe, stop
    config.py    `LocalConfig` and the machine's bounds (how many engines fit, their environment)
    process.py   child processes that never outlive their parent (the demo's Prometheus uses it too)
"""
