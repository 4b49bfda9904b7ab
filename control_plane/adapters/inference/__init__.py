"""The control plane's own requests to the engines' OpenAI API, marked so the engines keep them apart from live
traffic: the correctness gate's prompt replays (`correctness.py`, `X-SITS-Probe: 1`) and low-traffic replay
(`replay.py`, `X-SITS-Replay: 1`)."""
