"""Tensor parallelism: rank 0 (the engine) and ranks 1..N-1 (worker processes) each hold a shard of the model and run
the same forward passes, joined by all-reduces (docs/engine.md, "Tensor parallelism")."""
