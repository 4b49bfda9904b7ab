"""The wire contract between the engine and the control plane, imported by both and importing neither.

`metrics` (metric and label names), `buckets` (histogram bucket layouts), `headers` (the request marks the control
plane sends and the engine reads), `models` (the engine's preset names, the bound on a checkpoint path),
`http_limits` (the deadlines and body limit every SITS HTTP server applies), `zygote` (how an engine finds the local
deployer's engine zygote) and `tracing` (the OpenTelemetry set-up). `metrics`, `buckets`, `headers`, `models` and
`zygote` are pure data: the decision core may import them. tests/test_wire.py holds the boundary.
"""
