"""Read models of stored checks, for every renderer (the web UI and API, the CLI, the demo, a KernelRollout's
status): `decode_check(stored dict) -> CheckView` once, `headline_of(view)` the one headline rule, `names` metric
names in words (numbers are written by control_plane/numbers.py). Pure: no I/O; imports only the analysis'
vocabulary and control_plane/numbers.py."""
from sits.control_plane.view.check import (CheckView, DeltaView, ReplicaView, ResultView, VariantView, decode_check,
                                           decode_result)
from sits.control_plane.view.correctness import CaseView, ConformanceView, CorrectnessView, PromptView
from sits.control_plane.view.headline import Headline, headline_of, lead

__all__ = ["CheckView", "ResultView", "ReplicaView", "DeltaView", "VariantView", "decode_check", "decode_result",
           "CorrectnessView", "ConformanceView", "CaseView", "PromptView", "Headline", "headline_of", "lead"]
